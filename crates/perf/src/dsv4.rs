//! DeepSeek-V4 (`DeepseekV4ForCausalLM`: DeepSeek-V4-Flash / -Pro and their FP8 / NVFP4
//! checkpoints, the reference's `DEEPSEEKV4` family): the config facts its compressed attention
//! rests on and the KV cache a sequence holds.
//!
//! Attention is one 512-wide latent KV head per layer. Every layer keeps the last
//! `sliding_window` tokens uncompressed; a layer's `compress_ratios` entry adds what it keeps of
//! the rest:
//!
//! ```text
//! ratio 0    SWA  nothing more
//! ratio 4    CSA  one compressed entry per 4 tokens + an fp4 indexer entry (index_head_dim / 2
//!                 bytes) per compressed entry; two compressors (KV and indexer), each with
//!                 fp32 KV and score state of 2 × 2·ratio × width
//! ratio 128  HCA  one compressed entry per 128 tokens; one compressor, fp32 state 2 × ratio × 512
//! ```
//!
//! So a sequence's KV is not linear in its length (a constant decode state, a window-capped part
//! and a compressed part): capacity is the longest single sequence whose KV fits the budget, by
//! the same doubling-then-bisection search the window-capped families use
//! ([`crate::memory::longest_fitting`]). The whole cache stays on every tensor-parallel rank (one
//! KV head is not split).
//!
//! Timing: one op per compressed-attention kind times a layer's whole attention block (the
//! projections, the compressors, the CSA indexer and the sparse / windowed attention), read from
//! the measured module tables; the mHC mixing before and after every block is its own op.
//!
//! ```text
//! dsv4_{csa,hca}_context_module_perf     (mla_dtype, kv_cache_dtype, gemm_type)
//!                                        → native heads → heads per GPU → [prefix][isl][batch]
//! dsv4_{csa,hca}_generation_module_perf  (kv_cache_dtype, gemm_type)
//!                                        → native heads → heads per GPU → [batch][isl + step]
//! mhc_module_perf                        (op_name, hc_mult, hidden_size) → [num_tokens]
//! ```
//!
//! A row's `num_heads` is the heads one GPU ran, its model's heads `num_heads × tp_size`; a query
//! takes its model's head count and then its per-GPU share, each exact, else the only one, else
//! the nearest below, else the smallest. The first row of a coordinate wins. Past the measured
//! range a query holds the nearest points' utilisation against the block's roofline
//! ([`module_sol`]) or the mHC roofline ([`mhc_sol`]). SWA layers (ratio 0) are timed as HCA
//! layers, as the reference does (no SWA table exists). Where a `dsv4_csa_topk_calib_perf` table
//! exists (SGLang data) a measured top-k correction comes off CSA layers ([`crate::dsv4_topk`]).
//!
//! Prefill context parallelism (SGLang's all-gather CP, `cp_size`): the token-major ops run on
//! the busiest rank's ⌈tokens / cp⌉, the experts and their dispatch on every rank's tokens (the
//! dispatch gathers them), and each compressed-attention layer is composed in
//! [`cp_context_ms`] from the module table at the rank's share, the CSA indexer's logits kernel
//! (`dsv4_paged_mqa_logits_module_perf`) and top-k selector over the whole prompt, and the KV
//! all-gathers. Decode attention is not split (its expert dispatch still gathers and scatters
//! as a prefill's does: the reference's builder leaves it so).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

use serde_json::Value;

use crate::db::{gen_attn_dtype, keep_row, Database, Dtype};
use crate::error::{PerfError, Result};
use crate::interp::{Grid, GridSpec, Node};
use crate::model::{logits_gemm, push_moe_ops, push_shared_beside_routed, Layout, ModelSpec, Op};
use crate::moe_ops::MLA_DISTRIBUTION;
use crate::parquet_table::{key_u32, Table};
use crate::systems::{sources, SystemSpec};

/// The architecture string of the family.
pub const ARCH: &str = "DeepseekV4ForCausalLM";

/// The compress ratios the reference's model takes (SWA, CSA, HCA).
const RATIOS: [u32; 3] = [0, 4, 128];

/// Width in bytes of one fp32 compressor state element.
const STATE_BYTES: f64 = 4.0;

/// What DeepSeek-V4's compressed attention and mHC read from `config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct Dsv4Spec {
    /// One ratio per decoder layer (the config's list cut to `num_hidden_layers`: the entries past
    /// it belong to the MTP layers).
    pub compress_ratios: Vec<u32>,
    pub sliding_window: u32,
    /// Width of the latent KV entry (and of each query head).
    pub head_dim: u32,
    pub qk_rope_head_dim: u32,
    pub q_lora_rank: u32,
    pub o_lora_rank: u32,
    pub o_groups: u32,
    pub index_n_heads: u32,
    pub index_head_dim: u32,
    pub index_topk: u32,
    /// mHC: residual streams per token and Sinkhorn iterations of its mixing matrix.
    pub hc_mult: u32,
    pub hc_sinkhorn_iters: u32,
}

impl Dsv4Spec {
    /// Read the facts from a DeepSeek-V4 `config.json` of `layers` decoder layers; `shown` names
    /// the file in errors.
    pub fn from_config(cfg: &Value, layers: u32, shown: &str) -> Result<Dsv4Spec> {
        let need = |k: &str| {
            cfg.get(k).and_then(Value::as_u64).map(|v| v as u32).ok_or_else(|| {
                PerfError::config(format!("{shown}: {ARCH} needs an integer {k} (DeepSeek-V4 attention / mHC)"))
            })
        };
        let listed = cfg.get("compress_ratios").and_then(Value::as_array).ok_or_else(|| {
            PerfError::config(format!("{shown}: {ARCH} needs compress_ratios, one integer per layer"))
        })?;
        let mut compress_ratios = Vec::with_capacity(listed.len());
        for v in listed {
            let r = v.as_u64().ok_or_else(|| {
                PerfError::config(format!("{shown}: compress_ratios holds {v}, not a non-negative integer"))
            })?;
            compress_ratios.push(r as u32);
        }
        if compress_ratios.len() < layers as usize {
            return Err(PerfError::config(format!(
                "{shown}: compress_ratios has {} entries, fewer than num_hidden_layers {layers}",
                compress_ratios.len()
            )));
        }
        compress_ratios.truncate(layers as usize);
        if let Some(r) = compress_ratios.iter().find(|r| !RATIOS.contains(r)) {
            return Err(PerfError::unsupported(format!(
                "{shown}: compress ratio {r} is not one DeepSeek-V4's attention has (0: SWA, 4: CSA, 128: HCA)"
            )));
        }
        Ok(Dsv4Spec {
            compress_ratios,
            sliding_window: need("sliding_window")?,
            head_dim: need("head_dim")?,
            qk_rope_head_dim: need("qk_rope_head_dim")?,
            q_lora_rank: need("q_lora_rank")?,
            o_lora_rank: need("o_lora_rank")?,
            o_groups: need("o_groups")?,
            index_n_heads: need("index_n_heads")?,
            index_head_dim: need("index_head_dim")?,
            index_topk: need("index_topk")?,
            hc_mult: need("hc_mult")?,
            hc_sinkhorn_iters: need("hc_sinkhorn_iters")?,
        })
    }

    /// Layers with compress ratio `ratio`.
    pub fn layers_with(&self, ratio: u32) -> usize {
        self.compress_ratios.iter().filter(|&&r| r == ratio).count()
    }

    /// KV bytes one sequence of `len` tokens holds with `kv`-typed cache entries, over all
    /// layers (see the module notes; the fp32 compressor state is there from the first token).
    pub fn kv_bytes_per_sequence(&self, kv: Dtype, len: u64) -> f64 {
        let entry = self.head_dim as f64 * kv.bytes();
        let width = self.head_dim as f64;
        let index_width = self.index_head_dim as f64;
        let windowed = len.min(self.sliding_window as u64) as f64;
        let mut total = 0.0;
        for &ratio in &self.compress_ratios {
            total += windowed * entry;
            if ratio == 0 {
                continue;
            }
            let r = ratio as u64;
            let compressed = (len / r) as f64;
            let compressors = if ratio == 4 { 2.0 } else { 1.0 };
            total += compressed * entry + 2.0 * ratio as f64 * compressors * width * STATE_BYTES;
            if ratio == 4 {
                // The fp4 indexer cache and its own compressor's state.
                total += compressed * index_width * 0.5 + 2.0 * ratio as f64 * 2.0 * index_width * STATE_BYTES;
            }
        }
        total
    }

    /// The longest single sequence whose KV fits `budget` bytes (`context_length` bounds a cache
    /// that stops growing; DeepSeek-V4's compressed part always grows).
    pub fn kv_tokens(&self, kv: Dtype, budget: f64, context_length: u64) -> u64 {
        crate::memory::longest_fitting(budget, context_length, |len| self.kv_bytes_per_sequence(kv, len))
    }
}

/// The module tables, in [`Dsv4Tables`] order: (CSA, HCA) × (context, generation).
pub const MODULE_FILES: [&str; 4] = [
    "dsv4_csa_context_module_perf.parquet",
    "dsv4_hca_context_module_perf.parquet",
    "dsv4_csa_generation_module_perf.parquet",
    "dsv4_hca_generation_module_perf.parquet",
];
/// The mHC table.
pub const MHC_FILE: &str = "mhc_module_perf.parquet";
/// The CSA top-k correction subtracted where it exists ([`crate::dsv4_topk`]).
pub const TOPK_CALIB_FILE: &str = crate::dsv4_topk::FILE;
/// The CSA indexer's logits kernel alone, read by prefill context parallelism.
pub const PAGED_MQA_FILE: &str = "dsv4_paged_mqa_logits_module_perf.parquet";

const CONTEXT_SPEC: GridSpec = GridSpec::raw(&["prefix", "seq_len", "batch"]);
const GENERATION_SPEC: GridSpec = GridSpec::raw(&["batch", "seq_len"]);
const MHC_SPEC: GridSpec = GridSpec::raw(&["num_tokens"]);
const PAGED_MQA_SPEC: GridSpec = GridSpec::raw(&["past_kv", "seq_len", "batch"]);

/// The new tokens of one paged_mqa_logits lookup: a longer prompt is timed as the chunks a
/// chunked prefill runs it in (the indexer's query-key pairs add up over them).
const MQA_CHUNK: u32 = 8192;

/// Widths of one compressed-attention block (from the model's config; `o_groups` per GPU).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockDims {
    pub hidden: u32,
    pub q_lora: u32,
    pub o_lora: u32,
    pub head_dim: u32,
    pub rope: u32,
    pub index_heads: u32,
    pub index_head_dim: u32,
    pub index_topk: u32,
    pub window: u32,
    pub o_groups: u32,
}

/// One compressed-attention block kind, `scale` × its layer latency.
#[derive(Clone, Debug, PartialEq)]
pub struct Dsv4AttnOp {
    pub name: String,
    pub scale: f64,
    /// The prefill module (else decode).
    pub context: bool,
    /// 4 (CSA) or 128 (HCA, which SWA layers borrow).
    pub ratio: u32,
    /// Heads per GPU and the model's heads (the tables' two head keys).
    pub heads: u32,
    pub native_heads: u32,
    pub kv: Dtype,
    /// Attention compute format of the context table (decode follows the KV format).
    pub fmha: Dtype,
    /// The projections' format: the table's `gemm_type`.
    pub gemm: Dtype,
    pub dims: BlockDims,
    /// Prefill context-parallel ranks the prompt is split over (1: none; decode always 1).
    pub cp: u32,
    /// Tensor-parallel width (the paged_mqa_logits table's `tp_size` key).
    pub tp: u32,
}

impl Dsv4AttnOp {
    /// Resident weight bytes of the block on one GPU (all its layers): the projections in the
    /// GEMM format, the output absorption and the indexer's weights projection in bf16, the
    /// attention sinks and compressor position biases in fp32.
    pub fn weight_bytes(&self) -> f64 {
        let d = &self.dims;
        let (h, q, o, hd) = (d.hidden as f64, d.q_lora as f64, d.o_lora as f64, d.head_dim as f64);
        let (n, groups) = (self.heads as f64, d.o_groups as f64);
        let (ih, ihd, r) = (d.index_heads as f64, d.index_head_dim as f64, self.ratio as f64);
        let mut gemm = h * q + q * n * hd + h * hd + groups * o * h;
        let mut bf16 = n * hd * o;
        let mut fp32 = n;
        if self.ratio != 0 {
            let compressors = if self.ratio == 4 { 2.0 } else { 1.0 };
            gemm += 2.0 * h * compressors * hd;
            fp32 += r * compressors * hd;
        }
        if self.ratio == 4 {
            gemm += q * ih * ihd + 4.0 * h * ihd;
            bf16 += h * ih;
            fp32 += r * 2.0 * ihd;
        }
        (gemm * self.gemm.bytes() + bf16 * 2.0 + fp32 * 4.0) * self.scale
    }
}

/// One half of a layer's mHC (`pre`: the stream mixing and Sinkhorn normalisation before a
/// block; `post`: the write-back after it), `scale` × its layer latency.
#[derive(Clone, Debug, PartialEq)]
pub struct MhcOp {
    pub name: String,
    pub scale: f64,
    pub post: bool,
    pub hc_mult: u32,
    pub hidden: u32,
    pub sinkhorn_iters: u32,
}

impl MhcOp {
    fn op_name(&self) -> &'static str {
        if self.post {
            "post"
        } else {
            "pre"
        }
    }

    /// Resident weight bytes (bf16): the mixing projections of the attention and FFN sites.
    pub fn weight_bytes(&self) -> f64 {
        let hc = self.hc_mult as f64;
        let mix = (2.0 + hc) * hc;
        2.0 * (mix * hc * self.hidden as f64 + mix + 3.0) * 2.0 * self.scale
    }
}

/// mHC roofline (ms) of one half at `tokens` tokens: two sites per layer, bf16 mixing math
/// (the pre half adds the Sinkhorn iterations) against the parameters and the `hc_mult` residual
/// streams read and written (the pre half also writes its fp32 mixing coefficients).
pub fn mhc_sol(spec: &SystemSpec, op: &MhcOp, tokens: i128) -> Result<f64> {
    let flops = Dtype::Bfloat16.flops(spec)?;
    let (t, hc, h, it) = (tokens, op.hc_mult as i128, op.hidden as i128, op.sinkhorn_iters as i128);
    let (width, mix) = (hc * h, (2 + hc) * hc);
    let ops = if op.post {
        2 * (2 * t * hc * hc * h + 2 * t * hc * h)
    } else {
        2 * (2 * t * width * mix + 3 * t * width + t * (hc * hc + 2 * hc) * it + 2 * t * hc * h)
    };
    let params = (2 * (mix * width + mix + 3)) as f64 * 2.0;
    let mut acts = (2 * t * width) as f64 * 2.0 * 2.0;
    if !op.post {
        acts += (2 * t * (2 * hc + hc * hc)) as f64 * 4.0;
    }
    Ok((ops as f64 / flops * 1000.0).max((params + acts) / spec.mem_bw * 1000.0))
}

/// Query pairs each query token attends within the window: `min(position + 1, limit)` summed
/// over `len` tokens after `prefix`, times `batch`.
fn window_pairs(batch: i128, len: i128, prefix: i128, limit: i128) -> i128 {
    if limit <= 0 || len <= 0 {
        return 0;
    }
    let end = prefix + len;
    let tri = |n: i128| n * (n + 1) / 2;
    if prefix >= limit {
        batch * len * limit
    } else if end <= limit {
        batch * (tri(end) - tri(prefix))
    } else {
        batch * (tri(limit) - tri(prefix)) + batch * (end - limit) * limit
    }
}

/// `Σ_{i=0..=n} ⌊i / d⌋`.
fn floor_sum(n: i128, d: i128) -> i128 {
    if n < 0 {
        return 0;
    }
    let (q, r) = (n / d, n % d);
    d * q * (q - 1) / 2 + q * (r + 1)
}

/// Compressed entries the query tokens at positions `prefix + 1 ..= prefix + len` see
/// (`⌊position / ratio⌋`, at most `limit`), times `batch`.
fn compressed_pairs(batch: i128, len: i128, prefix: i128, ratio: i128, limit: i128) -> i128 {
    if ratio <= 0 || len <= 0 || limit <= 0 {
        return 0;
    }
    let (first, last, full) = (prefix + 1, prefix + len, limit * ratio);
    let seen = if last < full {
        floor_sum(last, ratio) - floor_sum(first - 1, ratio)
    } else if first >= full {
        len * limit
    } else {
        floor_sum(full - 1, ratio) - floor_sum(first - 1, ratio) + (last - full + 1) * limit
    };
    batch * seen
}

/// Tensor-core rates of the block's op groups.
#[derive(Clone, Copy)]
struct BlockFlops {
    gemm: f64,
    bf16: f64,
    fp8: f64,
    attn: f64,
}

/// Roofline (ms) of one compressed-attention block: context for `b` sequences of `s` new tokens
/// after `prefix` cached ones, decode for `b` requests at KV length `s`. Projections and
/// compressors at the GEMM rate, the output absorption and indexer weights in bf16, the indexer
/// scores in fp8, attention over the window and the compressed entries (CSA: the top-k) at the
/// attention rate; against the weights, activations, the KV and fp4 indexer entries read and the
/// rope traffic.
#[allow(clippy::too_many_arguments)]
fn module_sol(
    spec: &SystemSpec,
    op: &Dsv4AttnOp,
    attn: Dtype,
    flops: BlockFlops,
    b: i128,
    s: i128,
    prefix: i128,
) -> f64 {
    let d = &op.dims;
    let (h, q, o, hd) = (d.hidden as i128, d.q_lora as i128, d.o_lora as i128, d.head_dim as i128);
    let (ih, ihd, n) = (d.index_heads as i128, d.index_head_dim as i128, op.heads as i128);
    let (groups, r) = (d.o_groups.max(1) as i128, op.ratio as i128);
    let tokens = if op.context { b * s } else { b };
    let kv_len = if op.context { prefix + s } else { (s - 1).max(0) };
    let proj = 2 * tokens * (h * q + q * n * hd + h * hd + groups * o * h);
    let absorb = 2 * tokens * n * hd * o;
    let compressors = if r == 4 { 2 } else { 1 };
    let mut compress = 0;
    if r != 0 {
        compress = 4 * tokens * h * compressors * hd + 2 * tokens * compressors * hd;
        if r == 4 {
            compress += 8 * tokens * h * ihd + 4 * tokens * ihd;
        }
    }
    let limit = if r == 4 {
        d.index_topk as i128
    } else if r != 0 {
        (kv_len / r).max(0)
    } else {
        0
    };
    let pairs = if op.context {
        window_pairs(b, s, prefix, d.window as i128) + if r != 0 { compressed_pairs(b, s, prefix, r, limit) } else { 0 }
    } else {
        b * kv_len.min(d.window as i128) + if r != 0 { b * (kv_len / r).min(limit) } else { 0 }
    };
    let attention = 4 * n * hd * pairs;
    let (mut indexer, mut indexer_bf16, mut indexer_bytes) = (0, 0, 0.0);
    if r == 4 {
        let entries = kv_len / r;
        indexer = 2 * tokens * q * ih * ihd + 2 * tokens * entries * ih * ihd;
        indexer_bf16 = 2 * tokens * h * ih;
        indexer_bytes = (b * entries) as f64 * (d.index_head_dim as f64 * 0.5);
    }
    let gb = op.gemm.bytes();
    let mut gemm_weights = (h * q + q * n * hd + h * hd + groups * o * h) as f64 * gb;
    let mut bf16_weights = (n * hd * o) as f64 * 2.0;
    if r != 0 {
        gemm_weights += (2 * h * compressors * hd) as f64 * gb;
    }
    if r == 4 {
        gemm_weights += (q * ih * ihd) as f64 * gb;
        bf16_weights += (h * ih) as f64 * 2.0;
    }
    let acts = (tokens * (h + q + n * hd + hd + groups * o)) as f64 * gb;
    let kv_bytes = (pairs * hd) as f64 * op.kv.bytes();
    let rope = (tokens * n * d.rope as i128) as f64 * attn.bytes();
    let math = ((proj + compress) as f64 / flops.gemm
        + (absorb + indexer_bf16) as f64 / flops.bf16
        + indexer as f64 / flops.fp8
        + attention as f64 / flops.attn)
        * 1000.0;
    let mem = (gemm_weights + bf16_weights + acts + kv_bytes + indexer_bytes + rope) / spec.mem_bw * 1000.0;
    math.max(mem)
}

/// One module table: `fmha/kv/gemm` (decode: `/kv/gemm`) → model heads → heads per GPU → grid.
#[derive(Debug, Default)]
pub struct ModuleTable {
    grids: BTreeMap<String, BTreeMap<u32, BTreeMap<u32, Grid>>>,
    looked: Vec<String>,
}

/// The mHC table: `op/hc_mult/hidden` → token curve.
#[derive(Debug, Default)]
pub struct MhcTable {
    grids: BTreeMap<String, Grid>,
    looked: Vec<String>,
}

/// The paged_mqa_logits table: model heads → `tp_size` → `[past_kv][isl][batch]`.
#[derive(Debug, Default)]
pub struct PagedMqaTable {
    grids: BTreeMap<u32, BTreeMap<u32, Grid>>,
}

/// DeepSeek-V4's tables of one database, each read on first use.
#[derive(Debug, Default)]
pub struct Dsv4Tables {
    modules: [OnceLock<Result<ModuleTable>>; 4],
    mhc: OnceLock<Result<MhcTable>>,
    /// SGLang's CSA top-k correction, where installed.
    calib: OnceLock<Result<Option<crate::dsv4_topk::TopkCalib>>>,
    /// The CSA indexer's logits kernel (context parallelism), where installed.
    paged_mqa: OnceLock<Result<Option<PagedMqaTable>>>,
}

/// The tables spell fp8 attention / KV `fp8_e4m3` in places.
fn canonical(dtype: &str) -> &str {
    if dtype == "fp8_e4m3" {
        "fp8"
    } else {
        dtype
    }
}

fn load_module(db: &Database, file: &str, context: bool) -> Result<ModuleTable> {
    let srcs = sources(&db.spec, &db.backend, &db.version, file, db.shared_layer)?;
    // key → model heads → heads per GPU → (step, isl, batch) → latency; first row wins.
    type Rows = BTreeMap<String, BTreeMap<u32, BTreeMap<u32, BTreeMap<(u32, u32, u32), f64>>>>;
    let mut rows: Rows = BTreeMap::new();
    let mut heads_seen: BTreeMap<(String, String), BTreeSet<(u32, u32)>> = BTreeMap::new();
    let mut looked = Vec::new();
    for src in &srcs {
        looked.push(src.path.display().to_string());
        if !src.path.exists() {
            continue;
        }
        let t = Table::read(
            &src.path,
            &[
                "kernel_source",
                "model",
                "version",
                "mla_dtype",
                "kv_cache_dtype",
                "gemm_type",
                "num_heads",
                "tp_size",
                "batch_size",
                "isl",
                "step",
                "latency",
            ],
        )?;
        let p = t.path.clone();
        let ks = t.text_or_none("kernel_source")?;
        let (model, version) = (t.text_or_none("model")?, t.text_or_none("version")?);
        let fmha = if context { t.text("mla_dtype")? } else { &[] };
        let (kv, gemm) = (t.text("kv_cache_dtype")?, t.text("gemm_type")?);
        let (heads, tp, batch, isl, step, lat) = (
            t.int("num_heads")?,
            t.int("tp_size")?,
            t.int("batch_size")?,
            t.int("isl")?,
            t.int("step")?,
            t.float("latency")?,
        );
        let text = |col: &[Option<String>], i: usize, name: &str| {
            col[i].clone().ok_or_else(|| PerfError::data(format!("{p}: null {name} in row {i}")))
        };
        for i in 0..t.rows {
            if !keep_row(src, &ks[i]) {
                continue;
            }
            let fmha_name = if context { canonical(&text(fmha, i, "mla_dtype")?).to_string() } else { String::new() };
            let key =
                format!("{fmha_name}/{}/{}", canonical(&text(kv, i, "kv_cache_dtype")?), text(gemm, i, "gemm_type")?);
            let local = key_u32(&p, "num_heads", i, heads[i])?;
            let gpus = key_u32(&p, "tp_size", i, tp[i])?.max(1);
            heads_seen
                .entry((model[i].clone().unwrap_or_default(), version[i].clone().unwrap_or_default()))
                .or_default()
                .insert((local, gpus));
            let coord = (
                key_u32(&p, "step", i, step[i])?,
                key_u32(&p, "isl", i, isl[i])?,
                key_u32(&p, "batch_size", i, batch[i])?,
            );
            rows.entry(key)
                .or_default()
                .entry(local.saturating_mul(gpus))
                .or_default()
                .entry(local)
                .or_default()
                .entry(coord)
                .or_insert(lat[i]);
        }
    }
    // Rows keeping one head count over several tp sizes carry the model's heads, not the GPU's:
    // an unmigrated table that would be read wrongly.
    for ((model, version), pairs) in &heads_seen {
        let tps: BTreeSet<u32> = pairs.iter().map(|p| p.1).collect();
        let locals: BTreeSet<u32> = pairs.iter().map(|p| p.0).collect();
        let natives: BTreeSet<u32> = pairs.iter().map(|p| p.0 * p.1).collect();
        if tps.len() > 1 && locals.len() == 1 && natives.len() > 1 {
            return Err(PerfError::data(format!(
                "{file}: rows of model {model:?} version {version:?} keep num_heads constant over tp_size {tps:?}                  (model heads, not heads per GPU); the table must be migrated (num_heads //= tp_size)"
            )));
        }
    }
    let mut grids: BTreeMap<String, BTreeMap<u32, BTreeMap<u32, Grid>>> = BTreeMap::new();
    for (key, by_native) in rows {
        for (native, by_local) in by_native {
            for (local, points) in by_local {
                let mut node = Node::new();
                if context {
                    for ((step, isl, b), v) in points {
                        node.insert_first_wins(&[step, isl, b], v);
                    }
                } else {
                    // Decode is keyed by KV length `isl + step`; a later (step, isl) overwrites.
                    let mut by_len: BTreeMap<(u32, u32), f64> = BTreeMap::new();
                    for ((step, isl, b), v) in points {
                        by_len.insert((b, isl.saturating_add(step)), v);
                    }
                    for ((b, len), v) in by_len {
                        node.insert_first_wins(&[b, len], v);
                    }
                }
                grids.entry(key.clone()).or_default().entry(native).or_default().insert(local, Grid::new(node));
            }
        }
    }
    Ok(ModuleTable { grids, looked })
}

fn load_mhc(db: &Database) -> Result<MhcTable> {
    let srcs = sources(&db.spec, &db.backend, &db.version, MHC_FILE, db.shared_layer)?;
    let mut rows: BTreeMap<String, BTreeMap<u32, f64>> = BTreeMap::new();
    let mut looked = Vec::new();
    for src in &srcs {
        looked.push(src.path.display().to_string());
        if !src.path.exists() {
            continue;
        }
        let t =
            Table::read(&src.path, &["kernel_source", "op_name", "hc_mult", "hidden_size", "num_tokens", "latency"])?;
        let p = t.path.clone();
        let (ks, op) = (t.text_or_none("kernel_source")?, t.text("op_name")?);
        let (hc, hidden, tokens, lat) =
            (t.int("hc_mult")?, t.int("hidden_size")?, t.int("num_tokens")?, t.float("latency")?);
        for i in 0..t.rows {
            if !keep_row(src, &ks[i]) {
                continue;
            }
            let name = op[i].clone().ok_or_else(|| PerfError::data(format!("{p}: null op_name in row {i}")))?;
            let key =
                format!("{name}/{}/{}", key_u32(&p, "hc_mult", i, hc[i])?, key_u32(&p, "hidden_size", i, hidden[i])?);
            rows.entry(key).or_default().entry(key_u32(&p, "num_tokens", i, tokens[i])?).or_insert(lat[i]);
        }
    }
    let grids = rows
        .into_iter()
        .map(|(k, curve)| {
            let mut node = Node::new();
            for (t, v) in curve {
                node.insert_first_wins(&[t], v);
            }
            (k, Grid::new(node))
        })
        .collect();
    Ok(MhcTable { grids, looked })
}

/// Reads the paged_mqa_logits table of `db` (its sources in order, first row of a coordinate
/// wins); `None` when no source file is installed.
fn load_paged_mqa(db: &Database) -> Result<Option<PagedMqaTable>> {
    let srcs = sources(&db.spec, &db.backend, &db.version, PAGED_MQA_FILE, db.shared_layer)?;
    let mut nodes: BTreeMap<u32, BTreeMap<u32, Node>> = BTreeMap::new();
    let mut any = false;
    for src in &srcs {
        if !src.path.exists() {
            continue;
        }
        any = true;
        let t =
            Table::read(&src.path, &["kernel_source", "num_heads", "tp_size", "step", "isl", "batch_size", "latency"])?;
        let p = t.path.clone();
        let ks = t.text_or_none("kernel_source")?;
        let (heads, tp, step) = (t.int("num_heads")?, t.int("tp_size")?, t.int("step")?);
        let (isl, batch, lat) = (t.int("isl")?, t.int("batch_size")?, t.float("latency")?);
        for i in 0..t.rows {
            if !keep_row(src, &ks[i]) {
                continue;
            }
            nodes
                .entry(key_u32(&p, "num_heads", i, heads[i])?)
                .or_default()
                .entry(key_u32(&p, "tp_size", i, tp[i])?)
                .or_default()
                .insert_first_wins(
                    &[
                        key_u32(&p, "step", i, step[i])?,
                        key_u32(&p, "isl", i, isl[i])?,
                        key_u32(&p, "batch_size", i, batch[i])?,
                    ],
                    lat[i],
                );
        }
    }
    let grids = nodes
        .into_iter()
        .map(|(h, by_tp)| (h, by_tp.into_iter().map(|(tp, node)| (tp, Grid::new(node))).collect()))
        .collect();
    Ok(any.then_some(PagedMqaTable { grids }))
}

impl Database {
    fn dsv4_module(&self, context: bool, ratio: u32) -> Result<&ModuleTable> {
        let i = usize::from(!context) * 2 + usize::from(ratio != 4);
        self.dsv4.modules[i].get_or_init(|| load_module(self, MODULE_FILES[i], context)).as_ref().map_err(Clone::clone)
    }

    fn dsv4_mhc(&self) -> Result<&MhcTable> {
        self.dsv4.mhc.get_or_init(|| load_mhc(self)).as_ref().map_err(Clone::clone)
    }

    fn dsv4_topk_calib(&self) -> Result<Option<&crate::dsv4_topk::TopkCalib>> {
        self.dsv4.calib.get_or_init(|| crate::dsv4_topk::load(self)).as_ref().map(Option::as_ref).map_err(Clone::clone)
    }

    fn dsv4_paged_mqa(&self) -> Result<Option<&PagedMqaTable>> {
        self.dsv4.paged_mqa.get_or_init(|| load_paged_mqa(self)).as_ref().map(Option::as_ref).map_err(Clone::clone)
    }
}

/// The paged_mqa_logits time (ms) of `b` sequences of `isl` new tokens after `past` cached ones
/// for a model of `native_heads` heads at `tp` (else the tp 1 rows: the kernel's work does not
/// depend on tp), held past the measured range along the query-key pair count
/// `b · (past · isl + isl² / 2)`; `None` where no rows cover it or no point anchors it.
fn paged_mqa_ms(db: &Database, b: u32, isl: u32, past: u32, tp: u32, native_heads: u32) -> Result<Option<f64>> {
    let Some(table) = db.dsv4_paged_mqa()? else { return Ok(None) };
    let Some(by_tp) = table.grids.get(&native_heads) else { return Ok(None) };
    let Some(grid) = by_tp.get(&tp).or_else(|| by_tp.get(&1)) else { return Ok(None) };
    let pairs = |c: &[f64]| c[2] * (c[0] * c[1] + c[1] * c[1] / 2.0);
    Ok(grid.query(&PAGED_MQA_SPEC, &pairs, &[past as f64, isl as f64, b as f64]).ok().filter(|v| v.is_finite()))
}

/// [`paged_mqa_ms`] of a prompt of `isl` new tokens after `past` cached ones, summed over its
/// [`MQA_CHUNK`]-token chunks; `None` when any chunk has none.
fn paged_mqa_chunked(db: &Database, op: &Dsv4AttnOp, b: u32, isl: u32, past: u32) -> Result<Option<f64>> {
    let mut total = 0.0;
    let mut done = 0;
    while done < isl {
        let chunk = MQA_CHUNK.min(isl - done);
        match paged_mqa_ms(db, b, chunk, past + done, op.tp, op.native_heads)? {
            Some(v) => total += v,
            None => return Ok(None),
        }
        done += MQA_CHUNK;
    }
    Ok(Some(total))
}

/// The attention format DeepSeek-V4's context modules are timed in when none is given: the
/// checkpoint's (`inferred`), except that an fp8 one falls back to bf16 where the context tables
/// hold bf16 rows and no fp8 ones for the `kv` cache format (the reference's data-driven
/// downgrade).
pub fn context_fmha(db: &Database, inferred: Dtype, kv: Dtype) -> Result<Dtype> {
    if inferred != Dtype::Fp8 {
        return Ok(inferred);
    }
    let mut formats = BTreeSet::new();
    for ratio in [4, 128] {
        for key in db.dsv4_module(true, ratio)?.grids.keys() {
            let mut parts = key.split('/');
            if let (Some(fmha), Some(k)) = (parts.next(), parts.next()) {
                if k == kv.name() {
                    formats.insert(fmha.to_string());
                }
            }
        }
    }
    Ok(if !formats.contains("fp8") && formats.contains("bfloat16") { Dtype::Bfloat16 } else { inferred })
}

/// A head count resolved against a table's keys: exact, else the only key, else the nearest
/// below, else the smallest.
fn resolve_heads<T>(by: &BTreeMap<u32, T>, want: u32) -> Option<u32> {
    if by.contains_key(&want) || by.is_empty() {
        return by.contains_key(&want).then_some(want);
    }
    if by.len() == 1 {
        return by.keys().next().copied();
    }
    by.range(..=want).next_back().map(|(k, _)| *k).or_else(|| by.keys().next().copied())
}

/// One layer of a compressed-attention block (ms, not held at 0): the module table's value,
/// less the CSA top-k correction where installed.
fn module_ms(db: &Database, op: &Dsv4AttnOp, b: u32, s: u32, prefix: u32) -> Result<f64> {
    let spec = &db.spec;
    let kind = if op.ratio == 4 { "CSA" } else { "HCA" };
    let what = format!("{} DeepSeek-V4 {kind} module", if op.context { "context" } else { "generation" });
    let attn = if op.context { op.fmha } else { gen_attn_dtype(spec, op.kv) };
    let flops = BlockFlops {
        gemm: op.gemm.flops(spec)?,
        bf16: Dtype::Bfloat16.flops(spec)?,
        fp8: Dtype::Fp8.flops(spec)?,
        attn: attn.flops(spec)?,
    };
    let table = db.dsv4_module(op.context, op.ratio)?;
    let key = if op.context {
        format!("{}/{}/{}", op.fmha.name(), op.kv.name(), op.gemm.name())
    } else {
        format!("/{}/{}", op.kv.name(), op.gemm.name())
    };
    let file = MODULE_FILES[usize::from(!op.context) * 2 + usize::from(op.ratio != 4)];
    let missing = |detail: String| {
        PerfError::data(format!(
            "no {what} data for {detail} on {} / {} {} (looked in {})",
            spec.name,
            db.backend,
            db.version,
            if table.looked.is_empty() { format!("no {file} is installed") } else { table.looked.join(", ") }
        ))
    };
    let have = |keys: Vec<String>| if keys.is_empty() { "none".to_string() } else { keys.join(", ") };
    let by_native = table
        .grids
        .get(&key)
        .ok_or_else(|| missing(format!("{key} (have: {})", have(table.grids.keys().cloned().collect()))))?;
    let native = resolve_heads(by_native, op.native_heads)
        .ok_or_else(|| missing(format!("{key} at {} model heads", op.native_heads)))?;
    let by_local = &by_native[&native];
    let local = resolve_heads(by_local, op.heads)
        .ok_or_else(|| missing(format!("{key} at {} heads per GPU of {native}", op.heads)))?;
    let grid = &by_local[&local];
    let v = if op.context {
        let sol = |c: &[f64]| module_sol(spec, op, attn, flops, c[2] as i128, c[1] as i128, c[0] as i128);
        grid.query(&CONTEXT_SPEC, &sol, &[prefix as f64, s as f64, b as f64])
    } else {
        let sol = |c: &[f64]| module_sol(spec, op, attn, flops, c[0] as i128, c[1] as i128, 0);
        grid.query(&GENERATION_SPEC, &sol, &[b as f64, s as f64])
    };
    let mut v = v.map_err(|e| e.context(format!("{what} on {} / {} {}", spec.name, db.backend, db.version)))?;
    if op.ratio == 4 {
        if let Some(calib) = db.dsv4_topk_calib()? {
            // A decode step is one new token after KV length − 1 cached ones.
            let (prefix, isl) = if op.context { (prefix, s) } else { (s.saturating_sub(1), 1) };
            v = calib.corrected(v, !op.context, op.native_heads, prefix, isl, b);
        }
    }
    Ok(v)
}

/// `eval` of a compressed-attention op: `scale × max(0, latency)`; context for `b` sequences of
/// `s` new tokens after `prefix` cached ones, decode for `b` requests at KV length `s`. A
/// context op split over `cp` > 1 ranks is [`cp_context_ms`] instead.
pub fn eval_dsv4_attention(db: &Database, op: &Dsv4AttnOp, b: u32, s: u32, prefix: u32) -> Result<f64> {
    if op.context && op.cp > 1 {
        return Ok(cp_context_ms(db, op, b, s, prefix)? * op.scale);
    }
    Ok(module_ms(db, op, b, s, prefix)?.max(0.0) * op.scale)
}

/// One layer of a context block whose `s` new tokens are split over `op.cp` ranks (SGLang's
/// all-gather context parallelism), ms: the block on the busiest rank's ⌈s / cp⌉ tokens, plus
/// what the split does not divide, plus the gathers of what every rank needs of the others:
///
/// ```text
/// CSA  module(⌈s/cp⌉) + [mqa(s)/cp − mqa(⌈s/cp⌉)] + [top_last(s)/cp − top_last(⌈s/cp⌉)]
///        + AG(b · s · index_head_dim) + AG(b · ⌊s/4⌋ · head_dim)
/// HCA  module(⌈s/cp⌉) + AG(b · min(s, window) · head_dim) + AG(b · ⌊s/128⌋ · head_dim)
/// ```
///
/// mqa is the indexer's logits kernel (paged_mqa_logits table, in [`MQA_CHUNK`]-token chunks)
/// and top_last the selector on realistic scores (the top-k calibration table), both at the
/// cached `prefix` and all `b` sequences: their work grows faster than linearly in the tokens,
/// so the rank pays its 1/cp share of the whole prompt's instead of its slice's. The module's
/// own value keeps the CSA top-k correction and is not held at 0; AG is a half-precision NCCL
/// all-gather over the cp ranks of that many elements.
fn cp_context_ms(db: &Database, op: &Dsv4AttnOp, b: u32, s: u32, prefix: u32) -> Result<f64> {
    let cp = op.cp;
    let per_card = s.div_ceil(cp).max(1);
    let mut v = module_ms(db, op, b, per_card, prefix)?;
    let gather = |per_seq: u64| -> Result<f64> {
        Ok(db.nccl("half", "all_gather", cp, (u64::from(b) * per_seq) as f64)?.max(0.0))
    };
    let (head, index_head) = (u64::from(op.dims.head_dim), u64::from(op.dims.index_head_dim));
    if op.ratio == 4 {
        let mqa_full = paged_mqa_chunked(db, op, b, s, prefix)?;
        let mqa_card = paged_mqa_chunked(db, op, b, per_card, prefix)?;
        let calib = db.dsv4_topk_calib()?;
        let top_last = |isl: u32| match calib {
            Some(c) => c.top_last_ms(op.native_heads, isl, prefix, b),
            None => Ok(None),
        };
        let (tl_full, tl_card) = (top_last(s)?, top_last(per_card)?);
        let (Some(mqa_full), Some(mqa_card), Some(tl_full), Some(tl_card)) = (mqa_full, mqa_card, tl_full, tl_card)
        else {
            return Err(PerfError::data(format!(
                "DeepSeek-V4 CSA prefill context parallelism (cp_size={cp}) needs the indexer's {PAGED_MQA_FILE} and \
                 the v1_top_last rows of {TOPK_CALIB_FILE} at {} model heads, batch {b} on {} / {} {}",
                op.native_heads, db.spec.name, db.backend, db.version
            )));
        };
        let cp = f64::from(cp);
        v += (mqa_full / cp - mqa_card) + (tl_full / cp - tl_card);
        v += gather(u64::from(s) * index_head)?;
    } else {
        let window = if op.dims.window > 0 { op.dims.window } else { s };
        v += gather(u64::from(s.min(window)) * head)?;
    }
    v += gather(u64::from(s / op.ratio) * head)?;
    Ok(v)
}

/// `eval` of an mHC op over `tokens` tokens: `scale × max(0, latency)`.
pub fn eval_mhc(db: &Database, op: &MhcOp, tokens: u32) -> Result<f64> {
    let spec = &db.spec;
    mhc_sol(spec, op, 1)?; // the bf16 rate must exist before any lookup
    let table = db.dsv4_mhc()?;
    let key = format!("{}/{}/{}", op.op_name(), op.hc_mult, op.hidden);
    let grid = table.grids.get(&key).ok_or_else(|| {
        PerfError::data(format!(
            "no mHC module data for {key} (op/hc_mult/hidden_size) on {} / {} {} (have: {}; looked in {})",
            spec.name,
            db.backend,
            db.version,
            if table.grids.is_empty() {
                "none".to_string()
            } else {
                table.grids.keys().cloned().collect::<Vec<_>>().join(", ")
            },
            if table.looked.is_empty() { format!("no {MHC_FILE} is installed") } else { table.looked.join(", ") }
        ))
    })?;
    let sol = |c: &[f64]| mhc_sol(spec, op, c[0].round() as i128).unwrap_or(f64::NAN);
    let v = grid
        .query(&MHC_SPEC, &sol, &[tokens as f64])
        .map_err(|e| e.context(format!("mHC {} on {} / {} {}", op.op_name(), spec.name, db.backend, db.version)))?;
    Ok(v.max(0.0) * op.scale)
}

/// `(context ops, generation ops)` of a DeepSeek-V4 model, as the reference's `DeepSeekV4Model`
/// lays them out: mHC around each block, one attention op per compressed kind (SWA layers
/// counted as HCA), the shared expert (its width split over tensor parallelism) beside the routed
/// ones.
pub fn build_dsv4_ops(m: &ModelSpec, l: &Layout) -> Result<(Vec<Op>, Vec<Op>)> {
    let d = m.dsv4.as_ref().ok_or_else(|| PerfError::config(format!("{}: not a DeepSeek-V4 model", m.name)))?;
    if l.ngram > 0 {
        return Err(PerfError::unsupported(format!(
            "{}: ngram verification of DeepSeek-V4 attention is not modelled",
            m.name
        )));
    }
    let (tp, h) = (l.tp, m.hidden);
    let layers = m.layers as f64;
    let mtp = if l.nextn == 0 { 1.0 } else { (l.nextn as f64 + layers) / layers };
    let inter = m.moe_inter / tp;
    let dims = BlockDims {
        hidden: h,
        q_lora: d.q_lora_rank,
        o_lora: d.o_lora_rank,
        head_dim: d.head_dim,
        rope: d.qk_rope_head_dim,
        index_heads: d.index_n_heads,
        index_head_dim: d.index_head_dim,
        index_topk: d.index_topk,
        window: d.sliding_window,
        o_groups: (d.o_groups / tp).max(1),
    };
    // Layer counts per timed kind: the compressed kinds in the order the config first names
    // them, HCA last when only SWA layers stand for it.
    let mut kinds: Vec<(u32, usize)> = Vec::new();
    for &r in d.compress_ratios.iter().chain(&[128]) {
        let count = d.compress_ratios.iter().filter(|&&x| x == r || (r == 128 && x == 0)).count();
        if r != 0 && count > 0 && !kinds.iter().any(|k| k.0 == r) {
            kinds.push((r, count));
        }
    }
    let act = 2.0;
    let mut out = (Vec::new(), Vec::new());
    for (ctx, list) in [(true, &mut out.0), (false, &mut out.1)] {
        let phase = if ctx { "context" } else { "generation" };
        let nm = |x: &str| format!("{phase}_{x}");
        let s = if ctx { 1.0 } else { mtp };
        let ls = layers * s;
        let mhc = |post: bool| {
            Op::Mhc(MhcOp {
                name: nm(if post { "mhc_post" } else { "mhc_pre" }),
                scale: ls,
                post,
                hc_mult: d.hc_mult,
                hidden: h,
                sinkhorn_iters: d.hc_sinkhorn_iters,
            })
        };
        let norm = |x: &str| Op::Elementwise { name: nm(x), scale: ls, bytes_per_token: (2 * h) as f64 * act };
        list.push(Op::Embedding { name: nm("embedding"), scale: s, bytes_per_token: h as f64 * 2.0 });
        list.push(mhc(false));
        list.push(norm("attn_norm"));
        for &(ratio, count) in &kinds {
            list.push(Op::Dsv4Attn(Dsv4AttnOp {
                name: nm("attention"),
                scale: count as f64 * s,
                context: ctx,
                ratio,
                heads: m.heads / tp,
                native_heads: m.heads,
                kv: l.kv,
                fmha: l.fmha,
                gemm: l.gemm,
                dims,
                cp: if ctx { l.cp.max(1) } else { 1 },
                tp,
            }));
        }
        list.push(mhc(true));
        list.push(norm("ffn_norm"));
        let shared = vec![
            Op::gemm(nm("shared_gate_up_gemm"), ls, 2 * inter, h, l.gemm, false),
            Op::Elementwise { name: nm("shared_act_gate"), scale: ls, bytes_per_token: (3 * inter) as f64 * act },
            Op::gemm(nm("shared_ffn2_gemm"), ls, h, inter, l.gemm, false),
        ];
        let mut routed = Vec::new();
        push_moe_ops(&mut routed, m, l, ctx, ls, MLA_DISTRIBUTION);
        if !ctx && l.cp > 1 {
            // The reference's DeepSeek-V4 builder leaves its decode dispatch marked as a prefill's
            // (unlike the hybrid and Gemma 4 builders), so a decode step behind CP ranks gathers
            // and scatters its tokens as a prefill does; timed as it times it.
            for op in &mut routed {
                if let Op::MoeDispatch(d) = op {
                    *d = d.clone().behind_cp(l.cp);
                }
            }
        }
        push_shared_beside_routed(list, ctx, phase, shared, routed);
        list.push(logits_gemm(nm("logits_gemm"), s, m, tp));
        list.push(Op::pipeline_p2p(nm("p2p"), s, h, l));
    }
    Ok(out)
}
