//! DeepSeek-V4.1 (`DeepseekV41ForCausalLM`, deepseek-ai/DeepSeek-V4.1-Flash; the reference's
//! `DEEPSEEKV41` family): the text backbone's config facts, its cross-layer KV cache, its op
//! list and the measured module table it is timed from.
//!
//! Every one of the 40 decoder layers keeps a 128-token window of uncompressed KV. A few *owner*
//! layers (`kv_source_layer_ids`) also publish a compressed KV (one entry per `compress_ratios`
//! tokens, 1 or 2) with an fp4 indexer key; the later layers of the same ratio reuse the owner's
//! cache, re-scoring it with their own indexer (`index_source_layer_ids`) or not. So a layer's
//! attention is one of four roles:
//!
//! ```text
//! swa      ratio 0: the window only
//! full     an owner: compresses, indexes and attends
//! reindex  a later layer with its own indexer over the owner's cache
//! reuse    a later layer reading the owner's selection
//! ```
//!
//! Layers after `candidate_source_layer_id` pick their top-k among that layer's candidate
//! blocks (`candidate_topk_blocks × candidate_block_size` positions). Engram layers
//! (`engram_layer_ids`) add a hashed n-gram embedding lookup and its projection before the
//! attention; every layer mixes its `hc_mult` residual streams (mHC) first.
//!
//! Timing reads `dsv41_module_perf` (measured SGLang modules; the data comes as execution
//! profiles under `systems/profiles/dsv41/<profile>`, a systems root of its own that
//! `systems_paths` names): one curve per (component, geometry, batch, prefix), the work axis
//! interpolated linearly between measured points. Attention's work axis is the new tokens
//! (prefill) or the KV length (decode); the other components' is the step's tokens at batch 1.
//! Outside a curve's range every module keeps the boundary point's utilisation against its
//! roofline (attention's at the request's batch and cached prefix; mHC's on the scalar fp32
//! units, `gpu.fp32_flops`); a batch or cached prefix the profile did not measure is refused. The router
//! and logits GEMMs, the experts and the NCCL all-reduces read the profile's own tables.
//!
//! A forward pass fuses its requests' tokens through the token-major ops and times each
//! prefill's attention at its own (batch, new tokens, prefix) and the decode attention at the
//! decode batch ([`Dsv41Pass`]).

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde_json::{json, Value};

use crate::db::{Database, Dtype};
use crate::error::{PerfError, Result};
use crate::model::{logits_gemm, Layout, ModelSpec, Op};
use crate::moe_ops::{MoeOp, MLA_DISTRIBUTION};
use crate::parquet_table::{key_u32, Table};
use crate::systems::{sources, SystemSpec};

/// The architecture string of the family.
pub const ARCH: &str = "DeepseekV41ForCausalLM";

/// The measured module table.
pub const MODULE_FILE: &str = "dsv41_module_perf.parquet";

/// What DeepSeek-V4.1's backbone reads from `config.json` (`text_config`).
#[derive(Clone, Debug, PartialEq)]
pub struct Dsv41Spec {
    pub layers: u32,
    pub hidden: u32,
    pub heads: u32,
    pub head_dim: u32,
    pub qk_rope_head_dim: u32,
    pub q_lora_rank: u32,
    pub o_lora_rank: u32,
    pub o_groups: u32,
    pub moe_inter: u32,
    pub experts: u32,
    pub shared_experts: u32,
    pub sliding_window: u32,
    /// One ratio (0, 1 or 2) per backbone layer.
    pub compress_ratios: Vec<u32>,
    pub kv_sources: Vec<u32>,
    pub index_sources: Vec<u32>,
    pub index_n_heads: u32,
    pub index_head_dim: u32,
    pub index_topk: u32,
    pub candidate_source: u32,
    pub candidate_topk_blocks: u32,
    pub candidate_block_size: u32,
    pub hc_mult: u32,
    pub hc_sinkhorn_iters: u32,
    pub engram_layers: Vec<u32>,
    pub engram_rows: Vec<u64>,
    pub engram_max_ngram: u32,
    pub engram_heads: u32,
    pub engram_head_dim: u32,
}

impl Dsv41Spec {
    /// Read and check the facts from the text model's config; `shown` names the file.
    pub fn from_config(cfg: &Value, shown: &str) -> Result<Dsv41Spec> {
        let bad = |what: String| PerfError::config(format!("{shown}: {ARCH}: {what}"));
        let int = |k: &str| {
            cfg.get(k).and_then(Value::as_u64).ok_or_else(|| bad(format!("needs a non-negative integer {k}")))
        };
        let u = |k: &str| int(k).and_then(|v| u32::try_from(v).map_err(|_| bad(format!("{k} = {v} is too large"))));
        let list = |k: &str| -> Result<Vec<u64>> {
            cfg.get(k)
                .and_then(Value::as_array)
                .ok_or_else(|| bad(format!("needs {k}, a list of non-negative integers")))?
                .iter()
                .map(|v| v.as_u64().ok_or_else(|| bad(format!("{k} holds {v}, not a non-negative integer"))))
                .collect()
        };
        let ids = |k: &str| -> Result<Vec<u32>> {
            Ok(list(k)?.into_iter().map(|v| v.min(u64::from(u32::MAX)) as u32).collect())
        };
        let layers = u("num_hidden_layers")?;
        let mut compress_ratios = ids("compress_ratios")?;
        // The entries past the backbone belong to the draft (DSpark) layers.
        compress_ratios.truncate(layers as usize);
        let s = Dsv41Spec {
            layers,
            hidden: u("hidden_size")?,
            heads: u("num_attention_heads")?,
            head_dim: u("head_dim")?,
            qk_rope_head_dim: u("qk_rope_head_dim")?,
            q_lora_rank: u("q_lora_rank")?,
            o_lora_rank: u("o_lora_rank")?,
            o_groups: u("o_groups")?,
            moe_inter: u("moe_intermediate_size")?,
            experts: u("n_routed_experts")?,
            shared_experts: u("n_shared_experts")?,
            sliding_window: u("sliding_window")?,
            compress_ratios,
            kv_sources: ids("kv_source_layer_ids")?,
            index_sources: ids("index_source_layer_ids")?,
            index_n_heads: u("index_n_heads")?,
            index_head_dim: u("index_head_dim")?,
            index_topk: u("index_topk")?,
            candidate_source: u("candidate_source_layer_id")?,
            candidate_topk_blocks: u("candidate_topk_blocks")?,
            candidate_block_size: u("candidate_block_size")?,
            hc_mult: u("hc_mult")?,
            hc_sinkhorn_iters: u("hc_sinkhorn_iters")?,
            engram_layers: ids("engram_layer_ids")?,
            engram_rows: list("engram_num_embeddings")?,
            engram_max_ngram: u("engram_max_ngram_size")?,
            engram_heads: u("engram_n_heads")?,
            engram_head_dim: u("engram_head_dim")?,
        };
        s.check().map_err(bad)?;
        Ok(s)
    }

    /// The cross-layer cache's invariants (what the reference's descriptor validates).
    fn check(&self) -> std::result::Result<(), String> {
        if self.sliding_window == 0 {
            return Err("sliding_window must be positive".into());
        }
        if self.compress_ratios.len() != self.layers as usize || self.compress_ratios.iter().any(|&r| r > 2) {
            return Err(format!(
                "compress_ratios needs one ratio (0, 1 or 2) per backbone layer ({} layers), got {:?}",
                self.layers, self.compress_ratios
            ));
        }
        for (k, ids) in [
            ("kv_source_layer_ids", &self.kv_sources),
            ("index_source_layer_ids", &self.index_sources),
            ("engram_layer_ids", &self.engram_layers),
        ] {
            if ids.windows(2).any(|w| w[0] >= w[1]) || ids.iter().any(|&i| i >= self.layers) {
                return Err(format!("{k} must be unique, ascending backbone layer indices, got {ids:?}"));
            }
        }
        if let Some(i) = self.kv_sources.iter().find(|i| !self.index_sources.contains(i)) {
            return Err(format!("KV owner layer {i} must also be an index source"));
        }
        if let Some(i) = self.index_sources.iter().find(|&&i| self.compress_ratios[i as usize] == 0) {
            return Err(format!("KV / index owner layer {i} needs a positive compression ratio"));
        }
        if !self.kv_sources.contains(&self.candidate_source) {
            return Err(format!("candidate_source_layer_id {} must own compressed KV", self.candidate_source));
        }
        if self.engram_layers.len() != self.engram_rows.len() {
            return Err("engram_layer_ids and engram_num_embeddings differ in length".into());
        }
        let mut owner: Option<u32> = None;
        for (layer, &ratio) in self.compress_ratios.iter().enumerate() {
            if self.kv_sources.contains(&(layer as u32)) {
                owner = Some(layer as u32);
            }
            if ratio > 0 && owner.is_none_or(|o| self.compress_ratios[o as usize] != ratio) {
                return Err(format!("layer {layer} (ratio {ratio}) has no preceding KV owner of its ratio"));
            }
        }
        if self.engram_max_ngram == 0 {
            return Err("engram_max_ngram_size must be positive".into());
        }
        Ok(())
    }

    /// A layer's attention role.
    pub fn role(&self, layer: u32) -> &'static str {
        if self.compress_ratios[layer as usize] == 0 {
            "swa"
        } else if self.kv_sources.contains(&layer) {
            "full"
        } else if self.index_sources.contains(&layer) {
            "reindex"
        } else {
            "reuse"
        }
    }

    /// Bytes of one window entry, one compressed entry and one indexer key in `backend`'s
    /// storage: SGLang's FlashMLA rows (448 fp8 values, 64 bf16 RoPE values and scales: 584
    /// bytes) with packed fp4 index keys (64 + 4); elsewhere the logical fp4 inventory.
    pub fn entry_bytes(&self, backend: &str) -> Result<(f64, f64, f64)> {
        if backend == "sglang" {
            if (self.head_dim, self.qk_rope_head_dim, self.index_head_dim) != (512, 64, 128) {
                return Err(PerfError::unsupported(format!(
                    "{ARCH}: SGLang's KV storage is only known for head_dim 512, qk_rope_head_dim 64 and \
                     index_head_dim 128 (got {}, {}, {})",
                    self.head_dim, self.qk_rope_head_dim, self.index_head_dim
                )));
            }
            return Ok((584.0, 584.0, 68.0));
        }
        let (d, i) = (self.head_dim, self.index_head_dim);
        Ok((f64::from(d), f64::from(d / 2 + d.div_ceil(16)), f64::from(i / 2 + i.div_ceil(32))))
    }

    /// Owner layers with their ratios.
    fn owners(&self) -> impl Iterator<Item = f64> + '_ {
        self.kv_sources.iter().map(|&o| f64::from(self.compress_ratios[o as usize]))
    }

    /// KV bytes one sequence of `len` tokens holds (every rank holds it whole).
    pub fn kv_bytes(&self, len: u64, backend: &str) -> Result<f64> {
        let (window, main, index) = self.entry_bytes(backend)?;
        if len == 0 {
            return Ok(0.0);
        }
        let n = len as f64;
        let mut bytes = f64::from(self.layers) * n.min(f64::from(self.sliding_window)) * window;
        for r in self.owners() {
            bytes += (n / r).floor() * (main + index);
            if r > 1.0 {
                bytes += self.state_bytes(r);
            }
        }
        Ok(bytes)
    }

    /// One owner's fp32 compressor state at ratio `r`.
    fn state_bytes(&self, r: f64) -> f64 {
        2.0 * r * f64::from(self.head_dim) * 4.0
    }

    /// Tokens a KV budget of `budget` bytes holds with `max_batch` requests' windows and
    /// compressor states reserved first, at the cache's asymptotic bytes per token.
    pub fn kv_tokens(&self, budget: f64, max_batch: u64, backend: &str) -> Result<u64> {
        let (window, main, index) = self.entry_bytes(backend)?;
        let mut fixed = f64::from(self.layers) * f64::from(self.sliding_window) * window;
        let mut slope = 0.0;
        for r in self.owners() {
            if r > 1.0 {
                fixed += self.state_bytes(r);
            }
            slope += (main + index) / r;
        }
        let left = budget - max_batch as f64 * fixed;
        Ok(if left <= 0.0 || slope <= 0.0 { 0 } else { (left / slope).floor() as u64 })
    }

    /// Activation bytes per token the model adds on top of the backend's estimate: two expanded
    /// residual buffers, the largest Engram workspace, the mHC statistics and the n-gram hashes.
    pub fn extra_activation_bytes(&self) -> f64 {
        let (hc, h) = (f64::from(self.hc_mult), f64::from(self.hidden));
        let columns = f64::from((self.engram_max_ngram - 1) * self.engram_heads);
        2.0 * hc * h * 2.0
            + 2.0 * (columns * f64::from(self.engram_head_dim) + (hc + 1.0) * h)
            + 2.0 * (hc + 2.0) * hc * 4.0
            + columns * self.engram_layers.len() as f64 * 8.0
    }
}

/// One DeepSeek-V4.1 module op.
#[derive(Clone, Debug, PartialEq)]
pub struct Dsv41Op {
    pub name: String,
    pub module: Module,
}

/// The measured modules.
#[derive(Clone, Debug, PartialEq)]
pub enum Module {
    Attention(Attention),
    Mhc {
        hidden: u32,
        hc_mult: u32,
        sinkhorn_iters: u32,
    },
    Engram {
        rows: u64,
        head_dim: u32,
        hash_columns: u32,
        hidden: u32,
        hc_mult: u32,
        tp: u32,
    },
    /// A dense projection in the checkpoint's 32 × 32-block fp8 (not the 128-block GEMM tables).
    Linear {
        n: u32,
        k: u32,
        dtype: Dtype,
    },
}

/// One layer's attention block at one GPU's share of the heads.
#[derive(Clone, Debug, PartialEq)]
pub struct Attention {
    pub context: bool,
    pub role: &'static str,
    pub ratio: u32,
    pub hidden: u32,
    pub heads: u32,
    pub head_dim: u32,
    pub q_lora: u32,
    pub o_lora: u32,
    pub o_groups: u32,
    pub index_heads: u32,
    pub index_head_dim: u32,
    pub index_topk: u32,
    pub window: u32,
    pub candidate_limit: u32,
    pub candidate_source: bool,
    pub gemm: Dtype,
    pub fmha: Dtype,
}

impl Dsv41Op {
    /// Whether this is a layer's attention block of the prefill (`context`) or decode phase.
    pub fn is_attention(&self, context: bool) -> bool {
        matches!(&self.module, Module::Attention(a) if a.context == context)
    }

    /// The table's component name and geometry key of this module.
    fn key(&self) -> (&'static str, String) {
        let (component, geometry) = match &self.module {
            Module::Attention(a) => (
                "attention",
                json!({
                    "bounded_prefill": false,
                    "candidate_limit": a.candidate_limit,
                    "compress_ratio": a.ratio,
                    "fmha_quant_mode": a.fmha.name(),
                    "gemm_quant_mode": a.gemm.name(),
                    "head_dim": a.head_dim,
                    "hidden_size": a.hidden,
                    "index_head_dim": a.index_head_dim,
                    "index_n_heads": a.index_heads,
                    "index_topk": a.index_topk,
                    "is_candidate_source": a.candidate_source,
                    "is_context": a.context,
                    "num_heads": a.heads,
                    "o_groups": a.o_groups,
                    "o_lora_rank": a.o_lora,
                    "q_lora_rank": a.q_lora,
                    "role": a.role,
                    "window_size": a.window,
                }),
            ),
            Module::Mhc { hidden, hc_mult, sinkhorn_iters } => {
                ("mhc", json!({"hc_mult": hc_mult, "hidden_size": hidden, "sinkhorn_iters": sinkhorn_iters}))
            }
            Module::Engram { rows, head_dim, hash_columns, hidden, hc_mult, tp } => (
                "engram",
                json!({
                    "hash_columns": hash_columns,
                    "hc_mult": hc_mult,
                    "head_dim": head_dim,
                    "hidden_size": hidden,
                    "num_embeddings": rows,
                    "tp_size": tp,
                }),
            ),
            Module::Linear { n, k, dtype } => ("linear", json!({"k": k, "n": n, "quant_mode": dtype.name()})),
        };
        (component, canonical(&geometry))
    }

    /// Resident weight bytes on one GPU.
    pub fn weight_bytes(&self) -> f64 {
        match &self.module {
            Module::Attention(a) => {
                let f = |v: u32| f64::from(v);
                let (h, q, o, n, d, g) =
                    (f(a.hidden), f(a.q_lora), f(a.o_lora), f(a.heads), f(a.head_dim), f(a.o_groups));
                let (ih, id) = (f(a.index_heads), f(a.index_head_dim));
                let w = projection_bytes(a.gemm);
                // Q down / up, KV, grouped output down / up (bf16), then the owner's compressor
                // (two for ratio > 1) and index projection, the indexer's query and gate weights.
                let mut bytes = (h * q + q * n * d + h * d + g * o * h) * w + n * d * o * 2.0;
                if a.role == "full" {
                    bytes += h * d * 2.0 * if a.ratio > 1 { 2.0 } else { 1.0 } + d * id * 2.0;
                }
                if matches!(a.role, "full" | "reindex") {
                    bytes += q * ih * id * w + h * ih * 2.0;
                }
                // Sinks, norm weights and the compressor's positional bias.
                bytes + n * 4.0 + (q + d) * 2.0
            }
            Module::Mhc { hidden, hc_mult, .. } => {
                let hc = f64::from(*hc_mult);
                2.0 * ((hc + 2.0) * hc * (hc * f64::from(*hidden) + 1.0) + 3.0) * 4.0
            }
            Module::Engram { rows, head_dim, hash_columns, hidden, hc_mult, tp } => {
                let d = f64::from(*head_dim);
                let table = rows.div_ceil(u64::from((*tp).max(1))) as f64 * (d + d / 32.0);
                let projection = f64::from(*hash_columns) * d * f64::from(*hidden) * f64::from(hc_mult + 1);
                table + projection * (1.0 + 1.0 / 1024.0) + 2.0 * f64::from(*hc_mult) * f64::from(*hidden) * 2.0
            }
            Module::Linear { n, k, dtype } => {
                let scales =
                    if *dtype == Dtype::Fp8Block { f64::from(n.div_ceil(32)) * f64::from(k.div_ceil(32)) } else { 0.0 };
                f64::from(*n) * f64::from(*k) * dtype.bytes() + scales
            }
        }
    }

    /// The module's roofline (ms): every kernel of it bounded by the slower of its math and its
    /// memory traffic, the kernels summed. `batch` and `prefix` matter to attention only, whose
    /// work `x` is the new tokens of each request (prefill) or the KV length (decode); the other
    /// modules' `x` is the step's tokens.
    fn sol_ms(&self, spec: &SystemSpec, batch: f64, x: f64, prefix: f64) -> Result<f64> {
        let part = |flops: f64, bytes: f64, rate: f64| (flops / rate * 1e3).max(bytes / spec.mem_bw * 1e3);
        match &self.module {
            Module::Linear { n, k, dtype } => {
                let rate = dtype.flops(spec)?;
                let (n, k) = (f64::from(*n), f64::from(*k));
                Ok(part(2.0 * x * n * k, self.weight_bytes() + x * (n + k) * 2.0, rate))
            }
            Module::Engram { head_dim, hash_columns, hidden, hc_mult, tp, .. } => {
                let rate = Dtype::Fp8.flops(spec)?;
                let input = f64::from(*hash_columns) * f64::from(*head_dim);
                let output = f64::from(*hidden) * f64::from(hc_mult + 1);
                let lookup = x * input * ((1.0 + 1.0 / 32.0) / f64::from((*tp).max(1)) + 2.0);
                let projection_bytes = input * output * (1.0 + 1.0 / 1024.0) + x * (input + output) * 2.0;
                let gate = x * f64::from(*hidden) * f64::from(*hc_mult) * 8.0;
                Ok(part(0.0, lookup, rate)
                    + part(2.0 * x * input * output, projection_bytes, rate)
                    + part(0.0, gate, rate))
            }
            Module::Mhc { hidden, hc_mult, sinkhorn_iters } => {
                // Scalar fp32 arithmetic on the CUDA cores, not the tensor cores.
                let rate = spec.fp32_flops.ok_or_else(|| {
                    PerfError::unsupported(format!(
                        "DeepSeek-V4.1 mHC outside its measured range is carried by its fp32 roofline, which needs \
                         gpu.fp32_flops in {}.yaml (missing)",
                        spec.name
                    ))
                })?;
                let (h, hc) = (f64::from(*hidden), f64::from(*hc_mult));
                let mixes = (hc + 2.0) * hc;
                let per_token = 2.0 * hc * h * mixes
                    + (hc * hc + 2.0 * hc) * f64::from(*sinkhorn_iters)
                    + 2.0 * hc * hc * h
                    + 2.0 * hc * h;
                // Residual streams in bf16 read and written at both sites, fp32 mixing coefficients.
                let bytes = self.weight_bytes() + 8.0 * x * hc * h + 8.0 * x * mixes;
                Ok(part(2.0 * x * per_token, bytes, rate))
            }
            Module::Attention(a) => attention_sol_ms(a, spec, batch, x, prefix),
        }
    }
}

/// SGLang's persistent KV row of DeepSeek-V4.1 (window and compressed entries alike), bytes.
const SGLANG_KV_ROW: f64 = 584.0;

/// Query-key pairs of `query` new tokens after `prefix` cached ones when each attends to at
/// most the `limit` latest positions (itself included).
fn window_pairs(query: f64, prefix: f64, limit: f64) -> f64 {
    let upto = |n: f64| {
        let grown = n.clamp(0.0, limit);
        grown * (grown + 1.0) / 2.0 + (n - limit).max(0.0) * limit
    };
    upto(prefix + query) - upto(prefix)
}

/// `Σ_{t=1..n} ⌊t / ratio⌋`, continued linearly past the last whole `t`.
fn compressed_prefix_sum(n: f64, ratio: f64) -> f64 {
    let n = n.max(0.0);
    let whole = n.floor();
    let blocks = (whole / ratio).floor();
    let tail = whole - blocks * ratio;
    ratio * blocks * (blocks - 1.0) / 2.0 + blocks * (tail + 1.0) + (n - whole) * blocks
}

/// Compressed entries the `query` new tokens after `prefix` attend to: every compressed entry
/// visible to a token, capped at `topk` once `ratio · topk` tokens exist.
fn selected_pairs(query: f64, prefix: f64, ratio: f64, topk: f64) -> f64 {
    let full = ratio * topk;
    let upto = |n: f64| compressed_prefix_sum(n.min(full), ratio) + (n - full).max(0.0) * topk;
    upto(prefix + query) - upto(prefix)
}

/// The roofline (ms) of one layer's attention block at one GPU's heads with SGLang's KV storage:
/// the query / KV / grouped output projections and the row store, the owner's compressors and
/// index keys, the indexer's projections, scoring and top-k, and the sparse attention over the
/// window plus the selected compressed entries. `s` is the new tokens of each of `batch`
/// requests (prefill) or the KV length (decode).
fn attention_sol_ms(a: &Attention, spec: &SystemSpec, batch: f64, s: f64, prefix: f64) -> Result<f64> {
    if batch <= 0.0 || s <= 0.0 {
        return Ok(0.0);
    }
    let f = f64::from;
    let part = |flops: f64, bytes: f64, rate: f64| (flops / rate * 1e3).max(bytes / spec.mem_bw * 1e3);
    let (bf16, fp8) = (Dtype::Bfloat16.flops(spec)?, Dtype::Fp8.flops(spec)?);
    let (gemm, fmha) = (a.gemm.flops(spec)?, a.fmha.flops(spec)?);
    let w = projection_bytes(a.gemm);
    // A projection of `k` inputs to `n` outputs over `rows` rows with `weight` bytes per weight.
    let project = |k: f64, n: f64, rows: f64, weight: f64, rate: f64| {
        part(2.0 * rows * k * n, k * n * weight + rows * (k + n) * 2.0, rate)
    };
    let (h, q, o, n, d, g) = (f(a.hidden), f(a.q_lora), f(a.o_lora), f(a.heads), f(a.head_dim), f(a.o_groups));
    let rows = if a.context { batch * s } else { batch };
    let mut ms = project(h, q, rows, w, gemm)
        + project(q, n * d, rows, w, gemm)
        + project(h, d, rows, w, gemm)
        + part(2.0 * rows * n * d * o, n * d * o * 2.0 + rows * (n * d + g * o) * 2.0, bf16)
        + project(g * o, h, rows, w, gemm)
        + part(0.0, rows * (2.0 * d + SGLANG_KV_ROW), bf16);
    let end = if a.context { prefix + s } else { s };
    let ratio = f(a.ratio);
    let compressed = if a.ratio > 0 { (end / ratio).floor() } else { 0.0 };
    let (ih, id) = (f(a.index_heads), f(a.index_head_dim));
    if a.role == "full" {
        let compressors = if a.ratio > 1 { 2.0 } else { 1.0 };
        ms += compressors * project(h, d, rows, 2.0, bf16);
        let before = if a.context { prefix } else { (end - 1.0).max(0.0) };
        let published = batch * ((end / ratio).floor() - (before / ratio).floor());
        ms += project(d, id, published, 2.0, bf16);
        // Each new compressed entry: its bf16 source read, the KV row and the packed fp4 index key.
        ms += part(0.0, published * (2.0 * d + SGLANG_KV_ROW + id * 0.53125), bf16);
    }
    if matches!(a.role, "full" | "reindex") {
        ms += project(q, ih * id, rows, w, fp8) + project(h, ih, rows, 2.0, bf16);
        // Hopper scores in bf16 on a bf16 query; elsewhere fp4 on the packed query.
        let (rate, query_bytes) =
            if spec.sm_version == Some(90) { (bf16, 2.0) } else { (Dtype::Nvfp4.flops(spec)?, 0.53125) };
        ms += part(
            2.0 * rows * ih * id * compressed,
            batch * compressed * id * 0.53125 + rows * ih * id * query_bytes + rows * compressed * 4.0,
            rate,
        );
        let candidates = if a.candidate_source { rows * compressed / 8.0 * 4.0 } else { 0.0 };
        ms += part(0.0, rows * (compressed + f(a.index_topk)) * 4.0 + candidates, bf16);
    }
    let window = f(a.window);
    let (window_pairs, window_rows) = if a.context {
        (batch * window_pairs(s, prefix, window), batch * (s + prefix.min((window - 1.0).max(0.0))))
    } else {
        (batch * end.min(window), batch * end.min(window))
    };
    let selected = match (a.ratio, a.context) {
        (0, _) => 0.0,
        (_, true) => batch * selected_pairs(s, prefix, ratio, f(a.index_topk)),
        (_, false) => batch * compressed.min(f(a.index_topk)),
    };
    ms += part(
        4.0 * n * d * (window_pairs + selected),
        (window_rows + selected) * SGLANG_KV_ROW + rows * n * d * 4.0,
        fmha,
    );
    Ok(ms)
}

/// Bytes per weight of the attention block's quantised projections (fp8 blocks carry one scale
/// per 32 × 32).
fn projection_bytes(gemm: Dtype) -> f64 {
    gemm.bytes() + if gemm == Dtype::Fp8Block { 1.0 / 1024.0 } else { 0.0 }
}

/// A geometry as one string: the JSON object with its keys sorted.
fn canonical(v: &Value) -> String {
    fn sorted(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let ordered: BTreeMap<&String, Value> = m.iter().map(|(k, v)| (k, sorted(v))).collect();
                let mut out = serde_json::Map::new();
                for (k, v) in ordered {
                    out.insert(k.clone(), v);
                }
                Value::Object(out)
            }
            other => other.clone(),
        }
    }
    sorted(v).to_string()
}

/// `(context ops, generation ops)` of a DeepSeek-V4.1 model at layout `l`, as the reference's
/// `DeepSeekV41Model` lays a layer out: Engram and its all-reduce (Engram layers), mHC, the
/// attention norm, the attention block and its all-reduce, the FFN norm, the shared expert, the
/// router and routed experts, and the all-reduce after them. Every op of layer `i` is named
/// `{phase}_v41_layer_{i}`, the reference's name for the layer's stage.
pub fn build_dsv41_ops(m: &ModelSpec, l: &Layout) -> Result<(Vec<Op>, Vec<Op>)> {
    let d = m.dsv41.as_ref().ok_or_else(|| PerfError::config(format!("{}: not a DeepSeek-V4.1 model", m.name)))?;
    let refuse = |what: String| Err(PerfError::unsupported(format!("{}: DeepSeek-V4.1 {what}", m.name)));
    if l.nextn > 0 || l.ngram > 0 {
        return refuse(
            "text decoding requires nextn = 0 and no ngram draft (its DSpark draft is a separate contract)".into(),
        );
    }
    if l.attention_dp != 1 || l.pp != 1 || l.cp > 1 || l.dcp > 1 {
        return refuse(format!(
            "requires attention_dp_size 1, pp_size 1 and no context parallelism (got attention_dp {}, pp {}, cp {}, \
             dcp {}): its Engram collectives and cross-layer cache ownership have no contract for them",
            l.attention_dp, l.pp, l.cp, l.dcp
        ));
    }
    let tp = l.tp;
    if tp * l.attention_dp != l.moe_tp * l.moe_ep {
        return refuse(format!(
            "requires attention TP × DP = MoE TP × EP (got {tp} × {} against {} × {})",
            l.attention_dp, l.moe_tp, l.moe_ep
        ));
    }
    if d.experts % l.moe_ep.max(1) != 0 || d.index_n_heads % tp != 0 || d.o_groups % tp != 0 {
        return refuse(format!(
            "requires moe_ep to divide the {} experts and tp to divide the {} index heads and {} output groups \
             (moe_ep {}, tp {tp})",
            d.experts, d.index_n_heads, d.o_groups, l.moe_ep
        ));
    }
    if l.moe_ep > 1 {
        return refuse(format!(
            "expert parallelism (moe_ep {}) is not modelled: servesim times the pure tensor-parallel text baseline \
             the profiles were measured at (its experts' all-reduce), not the EP experts and their combine; no \
             installed profile measures the experts at moe_ep > 1 either (the reference fails there for the \
             missing moe_perf rows)",
            l.moe_ep
        ));
    }
    if l.backend != "sglang" {
        return refuse(format!(
            "on {} is not modelled: its measured modules and KV storage are SGLang's (systems/profiles/dsv41)",
            l.backend
        ));
    }
    let h = d.hidden;
    let local_inter = d.moe_inter * d.shared_experts / tp;
    let columns = (d.engram_max_ngram - 1) * d.engram_heads;
    let act = 2.0;
    let mut out = (Vec::new(), Vec::new());
    for (ctx, list) in [(true, &mut out.0), (false, &mut out.1)] {
        let phase = if ctx { "context" } else { "generation" };
        let nm = |x: &str| format!("{phase}_{x}");
        let all_reduce = |name: String, elements: u32| Op::Nccl {
            name,
            scale: 1.0,
            kind: "all_reduce",
            dtype: "half",
            elements: f64::from(elements),
            gpus: tp,
        };
        let module = |name: &str, module: Module| Op::Dsv41(Dsv41Op { name: name.to_string(), module });
        list.push(Op::Embedding { name: nm("embedding"), scale: 1.0, bytes_per_token: f64::from(h) * 2.0 });
        list.push(all_reduce(nm("embedding_allreduce"), h));
        for layer in 0..d.layers {
            let stage = format!("{phase}_v41_layer_{layer}");
            if let Some(i) = d.engram_layers.iter().position(|&e| e == layer) {
                list.push(module(
                    &stage,
                    Module::Engram {
                        rows: d.engram_rows[i],
                        head_dim: d.engram_head_dim,
                        hash_columns: columns,
                        hidden: h,
                        hc_mult: d.hc_mult,
                        tp,
                    },
                ));
                list.push(all_reduce(stage.clone(), columns * d.engram_head_dim));
            }
            list.push(module(
                &stage,
                Module::Mhc { hidden: h, hc_mult: d.hc_mult, sinkhorn_iters: d.hc_sinkhorn_iters },
            ));
            let norm = Op::Elementwise { name: stage.clone(), scale: 1.0, bytes_per_token: f64::from(2 * h) * act };
            list.push(norm.clone());
            list.push(module(
                &stage,
                Module::Attention(Attention {
                    context: ctx,
                    role: d.role(layer),
                    ratio: d.compress_ratios[layer as usize],
                    hidden: h,
                    heads: d.heads / tp,
                    head_dim: d.head_dim,
                    q_lora: d.q_lora_rank,
                    o_lora: d.o_lora_rank,
                    o_groups: (d.o_groups / tp).max(1),
                    index_heads: d.index_n_heads,
                    index_head_dim: d.index_head_dim,
                    index_topk: d.index_topk,
                    window: d.sliding_window,
                    candidate_limit: if layer > d.candidate_source {
                        d.candidate_topk_blocks * d.candidate_block_size
                    } else {
                        0
                    },
                    candidate_source: layer == d.candidate_source,
                    gemm: l.gemm,
                    fmha: l.fmha,
                }),
            ));
            list.push(all_reduce(stage.clone(), h));
            list.push(norm);
            list.push(module(&stage, Module::Linear { n: 2 * local_inter, k: h, dtype: l.gemm }));
            list.push(Op::Elementwise {
                name: stage.clone(),
                scale: 1.0,
                bytes_per_token: f64::from(3 * local_inter) * act,
            });
            list.push(module(&stage, Module::Linear { n: h, k: local_inter, dtype: l.gemm }));
            list.push(Op::gemm(stage.clone(), 1.0, d.experts, h, Dtype::Bfloat16, false));
            list.push(Op::Moe(MoeOp::routed(stage.clone(), 1.0, h, (m, l), MLA_DISTRIBUTION, true)));
            list.push(all_reduce(stage, h));
        }
        list.push(logits_gemm(nm("logits_gemm"), 1.0, m, tp));
        list.push(Op::pipeline_p2p(nm("p2p"), 1.0, h, l));
    }
    Ok(out)
}

/// The extra resident bytes of MXFP4 experts: one UE8M0 scale per 32 expert weights, which the
/// expert op's packed-weight bytes leave out.
pub fn mxfp4_scale_bytes(m: &ModelSpec, l: &Layout) -> f64 {
    if !matches!(
        l.moe,
        Dtype::W4a8Mxfp4Mxfp8 | Dtype::W4a8Mxfp4Mxfp8Trtllm | Dtype::W4a16Mxfp4 | Dtype::W4a16Mxfp4Cutlass
    ) {
        return 0.0;
    }
    let elements = f64::from(m.layers) * 3.0 * f64::from(m.hidden) * f64::from(m.moe_inter) * f64::from(m.experts)
        / f64::from(l.moe_tp.max(1) * l.moe_ep.max(1));
    elements / 32.0
}

/// One measured curve: latency (ms) by work coordinate.
type Curve = BTreeMap<u32, f64>;

/// The module table: curves by (component, geometry, batch, prefix).
#[derive(Debug, Default)]
pub struct ModuleTable {
    curves: BTreeMap<(String, String, u32, u32), Curve>,
    /// Where it was read from ("" when not installed).
    path: String,
}

/// The lazily read table of a database.
#[derive(Debug, Default)]
pub struct Dsv41Tables {
    module: OnceLock<Result<ModuleTable>>,
}

fn load(db: &Database) -> Result<ModuleTable> {
    // The requested version's own file only: no donor versions or backends.
    let Some(src) = sources(&db.spec, &db.backend, &db.version, MODULE_FILE, false)?.into_iter().next() else {
        return Ok(ModuleTable::default());
    };
    if !src.path.exists() {
        return Ok(ModuleTable::default());
    }
    let t = Table::read(&src.path, &["component", "geometry", "batch_size", "prefix", "x", "latency"])?;
    let p = t.path.clone();
    let (component, geometry) = (t.text("component")?, t.text("geometry")?);
    let (batch, prefix, x, lat) = (t.int("batch_size")?, t.int("prefix")?, t.int("x")?, t.float("latency")?);
    let mut curves: BTreeMap<(String, String, u32, u32), Curve> = BTreeMap::new();
    for i in 0..t.rows {
        let text = |c: &[Option<String>], col: &str| {
            c[i].clone().ok_or_else(|| PerfError::data(format!("{p}: null {col} in row {i}")))
        };
        let comp = text(component, "component")?;
        let geom: Value = serde_json::from_str(&text(geometry, "geometry")?)
            .map_err(|e| PerfError::data(format!("{p}: row {i}: geometry is not JSON: {e}")))?;
        let (b, pre, xi) =
            (key_u32(&p, "batch_size", i, batch[i])?, key_u32(&p, "prefix", i, prefix[i])?, key_u32(&p, "x", i, x[i])?);
        if b == 0 || xi == 0 || !(lat[i].is_finite() && lat[i] > 0.0) {
            return Err(PerfError::data(format!("{p}: row {i} needs positive batch_size, x and latency")));
        }
        let curve = curves.entry((comp, canonical(&geom), b, pre)).or_default();
        if curve.insert(xi, lat[i]).is_some() {
            return Err(PerfError::data(format!("{p}: row {i} repeats a measured point")));
        }
    }
    Ok(ModuleTable { curves, path: p })
}

/// Refuses `moe_backend: megamoe` on DeepSeek-V4.1 `model` (its experts are timed decomposed;
/// the MegaMoE module was never measured for it), as the reference does.
pub fn check_moe_backend(model: &str, backend: Option<crate::eplb::MoeBackend>) -> Result<()> {
    if backend == Some(crate::eplb::MoeBackend::MegaMoe) {
        return Err(PerfError::unsupported(format!(
            "{model}: moe_backend: megamoe: DeepSeek-V4.1 is timed with its experts decomposed (router, routed \
             experts, all-reduce); SGLang's MegaMoE module has no measurement for it"
        )));
    }
    Ok(())
}

/// Fails when `db` has no module table: DeepSeek-V4.1 is timed from a measured profile alone.
pub fn require_table(db: &Database) -> Result<()> {
    if db.dsv41_module()?.curves.is_empty() {
        return Err(PerfError::data(format!(
            "DeepSeek-V4.1 needs {MODULE_FILE} for {} / {} {}, which is not installed there: its modules are \
             measured only in the execution profiles under systems/profiles/dsv41 (name one with systems_paths, e.g. \
             profiles/dsv41/full with backend_version dev-c4ca651192e5 on b300_sxm or dev-800cc9adea5b on gb300)",
            db.spec.name, db.backend, db.version
        )));
    }
    Ok(())
}

impl Database {
    fn dsv41_module(&self) -> Result<&ModuleTable> {
        self.dsv41.module.get_or_init(|| load(self)).as_ref().map_err(Clone::clone)
    }
}

/// `op` at `batch` requests, `prefix` cached tokens and work coordinate `x` (attention: new
/// tokens per request in a prefill, KV length in a decode; the rest: the step's tokens), ms.
pub fn eval_dsv41(db: &Database, op: &Dsv41Op, batch: u32, prefix: u32, x: u32) -> Result<f64> {
    if batch == 0 || x == 0 {
        return Ok(0.0);
    }
    if db.mode.is_sol() || db.mode.is_empirical() {
        return Err(PerfError::unsupported(format!(
            "database_mode {} is not modelled for DeepSeek-V4.1's modules: servesim times them from the measured \
             {MODULE_FILE} alone (use database_mode SILICON)",
            db.mode.name()
        )));
    }
    let table = db.dsv41_module()?;
    let (component, geometry) = op.key();
    let (batch, prefix) = match &op.module {
        Module::Attention(a) => (batch, if a.context { prefix } else { 0 }),
        _ => (1, 0),
    };
    let missing = |why: String| {
        PerfError::data(format!(
            "DeepSeek-V4.1 {component} has no measured data for its geometry, batch={batch}, prefix={prefix}, x={x} \
             on {} / {} {} ({why}; {})",
            db.spec.name,
            db.backend,
            db.version,
            if table.path.is_empty() { format!("no {MODULE_FILE} is installed for it") } else { table.path.clone() }
        ))
    };
    let curve = table
        .curves
        .get(&(component.to_string(), geometry.clone(), batch, prefix))
        .ok_or_else(|| missing(format!("no curve for {geometry}")))?;
    let xf = f64::from(x);
    if let Some(v) = curve.get(&x) {
        return Ok(*v);
    }
    let above = curve.range(x..).next();
    let below = curve.range(..x).next_back();
    Ok(match (below, above) {
        (Some((&x0, &y0)), Some((&x1, &y1))) => y0 + (y1 - y0) * (xf - f64::from(x0)) / f64::from(x1 - x0),
        (anchor, None) | (None, anchor) => {
            // Outside the measured range the boundary point's utilisation of the module's
            // roofline is held.
            let (&ax, &ay) = anchor.ok_or_else(|| missing("an empty curve".into()))?;
            let sol = |x: f64| op.sol_ms(&db.spec, f64::from(batch), x, f64::from(prefix));
            let (anchor_sol, query_sol) = (sol(f64::from(ax))?, sol(xf)?);
            if !(anchor_sol > 0.0 && query_sol > 0.0) {
                return Err(missing("no positive roofline to anchor the boundary".into()));
            }
            query_sol / (anchor_sol / ay)
        }
    })
}

/// One forward pass of a DeepSeek-V4.1 worker: prefills as `(requests, new tokens each, cached
/// prefix each)` groups and `decode` requests reading `decode_kv` tokens of KV each.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Dsv41Pass {
    pub prefills: Vec<(u32, u32, u32)>,
    pub decode: u32,
    pub decode_kv: u32,
}

impl Dsv41Pass {
    /// The pass a rank's totals describe: `requests` prefills of `tokens` new tokens over
    /// `cached` prefix tokens in all, split into at most three groups so that the remainders of
    /// the per-request shares are kept (the first requests take one token more).
    pub fn from_totals(requests: u32, tokens: u32, cached: u32, decode: u32, decode_kv_sum: u32) -> Dsv41Pass {
        let mut prefills = Vec::new();
        if requests > 0 && tokens > 0 {
            let (q, qr, p, pr) = (tokens / requests, tokens % requests, cached / requests, cached % requests);
            let mut cuts = vec![0, qr, pr, requests];
            cuts.sort_unstable();
            cuts.dedup();
            for w in cuts.windows(2) {
                let new = q + u32::from(w[0] < qr);
                if new > 0 {
                    prefills.push((w[1] - w[0], new, p + u32::from(w[0] < pr)));
                }
            }
        }
        Dsv41Pass { prefills, decode, decode_kv: decode_kv_sum / decode.max(1) }
    }
}
