//! Qwen3.5 (dense and MoE): Gated DeltaNet (GDN) linear-attention layers beside gated
//! full-attention layers, as the reference's `Qwen35Model` (family `QWEN35`) times them.
//!
//! ```text
//! gdn_perf.parquet   (kernel_source, phase, d_model, d_conv, num_k_heads, head_k_dim,
//!                     num_v_heads, head_v_dim) → context [batch][seq_len] | generation [batch]
//! ```
//!
//! A GDN layer runs a causal depthwise convolution over the packed q/k/v channels and the
//! delta-rule scan (prefill: the chunked scan; decode: the single-step recurrence), timed from
//! the table at the layer's tensor-parallel head counts. A geometry the table lacks, or a
//! state-dependent kernel asked with a recurrent state other than the float32 the rows were
//! collected with, is timed by the kernel's memory roofline instead, as the reference does.
//! Only the full-attention layers keep a KV cache; every request also holds a constant
//! recurrent state (SSM state plus the convolution window) per GDN layer, which the KV budget
//! sets aside once.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde_json::Value;

use crate::db::{gemm_sol, Database, Dtype};
use crate::error::{ErrorKind, PerfError, Result};
use crate::interp::{Grid, GridSpec, Node};
use crate::model::{attention_op, logits_gemm, AttentionHeads, Layout, ModelSpec, Op};
use crate::moe_ops::{DispatchOp, MoeOp, DISTRIBUTION};
use crate::parquet_table::Table;
use crate::systems::sources;

/// The architectures of the family (the text model under `text_config`).
pub const ARCHS: [&str; 2] = ["Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"];
/// The GDN kernel table.
pub const FILE: &str = "gdn_perf.parquet";

/// What Qwen3.5's hybrid layout adds to a model's facts.
#[derive(Clone, Debug, PartialEq)]
pub struct Qwen35Spec {
    /// Layers of each kind (`layer_types`).
    pub linear_layers: u32,
    pub full_layers: u32,
    /// GDN widths (model-wide; split over tensor parallelism by the op builder).
    pub k_heads: u32,
    pub k_head_dim: u32,
    pub v_heads: u32,
    pub v_head_dim: u32,
    pub conv_kernel: u32,
    /// The recurrent state's dtype (`mamba_ssm_dtype`, text model first; float32 by default and
    /// for values the reference does not know).
    pub ssm_dtype: &'static str,
    /// Shared expert width beside the routed experts (0: none).
    pub shared_inter: u32,
    /// The checkpoint keeps these GEMM groups in bf16 (its exclusion list):
    /// `[projections, dense FFN, shared expert]`.
    pub keep_bf16: [bool; 3],
}

fn uint(cfg: &Value, key: &str) -> Option<u32> {
    cfg.get(key).and_then(Value::as_u64).map(|v| v as u32)
}

/// The Qwen3.5 facts of a text config. `layer_types` is required (the reference does not derive
/// it from `full_attention_interval` either); so are the GDN widths.
pub fn spec_from_config(
    root: &Value,
    cfg: &Value,
    layers: u32,
    patterns: &[String],
    shown: &str,
) -> Result<Qwen35Spec> {
    let types = cfg.get("layer_types").and_then(Value::as_array).ok_or_else(|| {
        PerfError::config(format!("{shown}: Qwen3.5 needs text_config.layer_types (one entry per layer)"))
    })?;
    if types.len() != layers as usize {
        return Err(PerfError::config(format!(
            "{shown}: layer_types has {} entries, num_hidden_layers is {layers}",
            types.len()
        )));
    }
    let (mut linear, mut full) = (0, 0);
    for (i, t) in types.iter().enumerate() {
        match t.as_str() {
            Some("linear_attention") => linear += 1,
            Some("full_attention") => full += 1,
            _ => {
                return Err(PerfError::unsupported(format!(
                    "{shown}: layer_types[{i}] is {t}; Qwen3.5 layers are linear_attention or full_attention"
                )))
            }
        }
    }
    let need = |k: &str| {
        uint(cfg, k)
            .filter(|&v| v > 0)
            .ok_or_else(|| PerfError::config(format!("{shown}: Qwen3.5 needs a positive integer text_config.{k}")))
    };
    let ssm_dtype = [cfg, root]
        .iter()
        .find_map(|c| c.get("mamba_ssm_dtype"))
        .map(|d| match d.as_str() {
            Some("bfloat16") => "bfloat16",
            Some("float16") => "float16",
            _ => "float32",
        })
        .unwrap_or("float32");
    let lower: Vec<String> = patterns.iter().map(|p| p.to_lowercase()).collect();
    let keep_bf16 = [
        lower.iter().any(|p| p.contains("linear_attn") || p.contains("self_attn")),
        lower.iter().any(|p| p.contains(".mlp") && !p.contains("shared_expert")),
        lower.iter().any(|p| p.contains("shared_expert")),
    ];
    Ok(Qwen35Spec {
        linear_layers: linear,
        full_layers: full,
        k_heads: need("linear_num_key_heads")?,
        k_head_dim: need("linear_key_head_dim")?,
        v_heads: need("linear_num_value_heads")?,
        v_head_dim: need("linear_value_head_dim")?,
        conv_kernel: need("linear_conv_kernel_dim")?,
        ssm_dtype,
        shared_inter: uint(cfg, "shared_expert_intermediate_size").unwrap_or(0),
        keep_bf16,
    })
}

/// Per-layer ModelOpt `quantized_layers` naming a Qwen3.5 GEMM group: the reference gives them
/// precedence over the exclusion list; servesim does not read them, so it refuses them.
pub fn refuse_layer_formats(root: &Value, cfg: &Value, hf_quant: Option<&Value>, shown: &str) -> Result<()> {
    let maps =
        [hf_quant.and_then(|h| h.get("quantization")), root.get("quantization_config"), cfg.get("quantization_config")];
    for map in maps.into_iter().flatten().filter_map(|q| q.get("quantized_layers")).filter_map(Value::as_object) {
        if let Some(t) = map.keys().find(|t| {
            let t = t.to_lowercase();
            t.contains(".linear_attn.") || t.contains(".self_attn.") || t.contains(".mlp.")
        }) {
            return Err(PerfError::unsupported(format!(
                "{shown}: Qwen3.5 per-layer quantized_layers formats (e.g. {t}) are not modelled; \
                 set gemm_quant_mode explicitly"
            )));
        }
    }
    Ok(())
}

/// `(projection GEMMs, FFN GEMMs)`: the FFN side is the dense MLP of a dense model, the shared
/// expert of a MoE one. Unless the GEMM format was given explicitly, a group the checkpoint
/// excludes from quantisation runs in bf16.
pub fn formats(q: &Qwen35Spec, routed: bool, gemm: Dtype, explicit: bool) -> (Dtype, Dtype) {
    let pick = |keep: bool| if keep && !explicit { Dtype::Bfloat16 } else { gemm };
    (pick(q.keep_bf16[0]), pick(q.keep_bf16[if routed { 2 } else { 1 }]))
}

/// One GDN kernel of a layer, `scale` × its latency.
#[derive(Clone, Debug, PartialEq)]
pub struct GdnOp {
    pub name: String,
    pub scale: f64,
    /// `causal_conv1d_fn` / `chunk_gated_delta_rule` (prefill), `causal_conv1d_update` /
    /// `fused_sigmoid_gating_delta_rule_update` (decode).
    pub kernel: &'static str,
    pub context: bool,
    pub hidden: u32,
    pub conv_kernel: u32,
    /// Heads per GPU.
    pub k_heads: u32,
    pub k_head_dim: u32,
    pub v_heads: u32,
    pub v_head_dim: u32,
    pub ssm_dtype: &'static str,
}

impl GdnOp {
    fn state_bytes(&self) -> f64 {
        if matches!(self.ssm_dtype, "bfloat16" | "float16") {
            2.0
        } else {
            4.0
        }
    }

    /// The kernel's memory roofline (ms) for `b` sequences of `s` tokens (decode: `b` tokens).
    fn sol_ms(&self, mem_bw: f64, b: f64, s: f64) -> f64 {
        let x = if self.context && s > 0.0 { b * s } else { b };
        let (nk, hk, nv, hv) =
            (self.k_heads as f64, self.k_head_dim as f64, self.v_heads as f64, self.v_head_dim as f64);
        let qkv = 2.0 * nk * hk + nv * hv;
        let state = nv * hk * hv;
        let state_rw = state * self.state_bytes() * b;
        let (read, write) = match self.kernel {
            "causal_conv1d_fn" | "causal_conv1d_update" => {
                (x * qkv * (self.conv_kernel as f64 + 1.0) * 2.0, x * qkv * 2.0)
            }
            "chunk_gated_delta_rule" => {
                // The per-chunk (64 tokens) intermediate states stay bf16.
                let chunks = if s > 0.0 { (s / 64.0).floor() } else { 0.0 };
                let h = chunks * state * 2.0 * b;
                (x * qkv * 2.0 + state_rw + h, x * nv * hv * 2.0 + state_rw + h)
            }
            "fused_sigmoid_gating_delta_rule_update" => (x * qkv * 2.0 + state_rw, x * nv * hv * 2.0 + state_rw),
            _ => (x * self.hidden as f64 * 2.0, x * self.hidden as f64 * 2.0),
        };
        (read + write) / mem_bw.max(1.0) * 1000.0
    }

    /// The table's key for this op.
    fn key(&self, kernel: &str) -> GdnKey {
        GdnKey {
            kernel: kernel.to_string(),
            context: self.context,
            shape: [self.hidden, self.conv_kernel, self.k_heads, self.k_head_dim, self.v_heads, self.v_head_dim],
        }
    }
}

/// `(kernel, phase, [d_model, d_conv, num_k_heads, head_k_dim, num_v_heads, head_v_dim])`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct GdnKey {
    kernel: String,
    context: bool,
    shape: [u32; 6],
}

/// The GDN rows of one database: per key a `[batch][seq_len]` (prefill) or `[batch]` (decode)
/// grid, first source wins per point.
#[derive(Debug, Default)]
pub struct GdnTable {
    grids: BTreeMap<GdnKey, Grid>,
    looked: Vec<String>,
}

/// The GDN table of a database, read on first use.
#[derive(Debug, Default)]
pub struct GdnTables {
    table: OnceLock<Result<GdnTable>>,
}

const CONTEXT_SPEC: GridSpec = GridSpec::raw(&["batch", "seq_len"]);
const GENERATION_SPEC: GridSpec = GridSpec::raw(&["batch"]);

/// The decode recurrence's executed names across releases, read as the one logical kernel.
fn logical_kernel(name: &str) -> &str {
    match name {
        "fused_recurrent_gated_delta_rule" | "fused_recurrent_gated_delta_rule_packed_decode" => {
            "fused_sigmoid_gating_delta_rule_update"
        }
        other => other,
    }
}

/// One kept row of a state-space kernel table (`gdn_perf` here, Kimi-K3's `kda_perf`: the same
/// columns): its kernel, phase, the eight integer columns `batch_size`, `seq_len`, `d_model`,
/// `d_conv`, `num_k_heads`, `head_k_dim`, `num_v_heads`, `head_v_dim` (negatives read as 0) and
/// its latency.
pub(crate) struct StateRow<'a> {
    pub kernel: &'a str,
    pub phase: &'a str,
    pub dims: [u32; 8],
    pub latency: f64,
}

/// Reads one source of a state-space kernel table, handing `each` every row the source's
/// kernel filter keeps and that names its kernel and phase.
pub(crate) fn for_each_state_row(src: &crate::systems::Source, mut each: impl FnMut(StateRow)) -> Result<()> {
    let cols = [
        "kernel_source",
        "phase",
        "batch_size",
        "seq_len",
        "d_model",
        "d_conv",
        "num_k_heads",
        "head_k_dim",
        "num_v_heads",
        "head_v_dim",
        "latency",
    ];
    let t = Table::read(&src.path, &cols)?;
    let kernels = t.text("kernel_source")?;
    let phases = t.text("phase")?;
    let ints: Vec<Vec<i64>> = cols[2..10].iter().map(|c| t.int(c)).collect::<std::result::Result<_, _>>()?;
    let latency = t.float("latency")?;
    for i in 0..t.rows {
        if !crate::db::keep_row(src, &kernels[i]) {
            continue;
        }
        let (Some(kernel), Some(phase)) = (&kernels[i], &phases[i]) else { continue };
        let dims = std::array::from_fn(|c| ints[c][i].max(0) as u32);
        each(StateRow { kernel, phase, dims, latency: latency[i] });
    }
    Ok(())
}

fn load(db: &Database) -> Result<GdnTable> {
    let srcs = sources(&db.spec, &db.backend, &db.version, FILE, db.shared_layer)?;
    let mut nodes: BTreeMap<GdnKey, Node> = BTreeMap::new();
    let mut looked = Vec::new();
    for src in &srcs {
        if !src.path.exists() {
            continue;
        }
        looked.push(src.path.display().to_string());
        for_each_state_row(src, |row| {
            let d = row.dims;
            let key = GdnKey {
                kernel: logical_kernel(row.kernel).to_string(),
                context: row.phase != "generation",
                shape: [d[2], d[3], d[4], d[5], d[6], d[7]],
            };
            let path: Vec<u32> = if key.context { vec![d[0], d[1]] } else { vec![d[0]] };
            nodes.entry(key).or_default().insert_first_wins(&path, row.latency);
        })?;
    }
    Ok(GdnTable { grids: nodes.into_iter().map(|(k, n)| (k, Grid::new(n))).collect(), looked })
}

/// The physical kernels vLLM 0.24.0 / 0.27.1 record a logical kernel under.
fn aliases(db: &Database, op: &GdnOp) -> &'static [&'static str] {
    if db.backend == "vllm"
        && matches!(db.version.as_str(), "0.24.0" | "0.27.1")
        && op.context
        && op.kernel == "chunk_gated_delta_rule"
    {
        return &[
            "chunk_gated_delta_rule_flashinfer",
            "chunk_gated_delta_rule_triton",
            "chunk_gated_delta_rule_cutedsl",
        ];
    }
    &[]
}

/// SGLang on a compute-capability-10 GPU (B200, B300, GB200, GB300; not sm 120) decodes a
/// bfloat16 recurrent state with FlashInfer's kernel, recorded under its own name: only those
/// rows time the recurrence there, and without them it takes the roofline.
const FLASHINFER_DECODE: &str = "flashinfer_gated_delta_rule_decode";

fn flashinfer_decode_lane(db: &Database, op: &GdnOp) -> bool {
    db.backend == "sglang"
        && matches!(db.spec.sm_version, Some(v) if (100..110).contains(&v))
        && op.ssm_dtype == "bfloat16"
        && !op.context
        && op.kernel == "fused_sigmoid_gating_delta_rule_update"
}

/// The measured grid for `op`, or why there is none (the caller then takes the roofline).
fn table_grid<'a>(db: &Database, table: &'a GdnTable, op: &GdnOp) -> std::result::Result<&'a Grid, String> {
    if flashinfer_decode_lane(db, op) {
        let key = op.key(FLASHINFER_DECODE);
        return table.grids.get(&key).ok_or_else(|| format!("no rows for {key:?}"));
    }
    let state_free = op.kernel.starts_with("causal_conv1d");
    if op.ssm_dtype != "float32" && !state_free {
        return Err(format!("the rows are float32-state only, the model's state is {}", op.ssm_dtype));
    }
    let own: Vec<&Grid> = aliases(db, op).iter().filter_map(|a| table.grids.get(&op.key(a))).collect();
    match own.len() {
        0 => table.grids.get(&op.key(op.kernel)).ok_or_else(|| format!("no rows for {:?}", op.key(op.kernel))),
        1 => Ok(own[0]),
        _ => Err(format!("several physical kernels measure {:?}", op.key(op.kernel))),
    }
}

/// `eval` of a GDN op for `b` sequences of `s` new tokens (decode: `b` requests): the table,
/// else (no rows for the geometry, or a state dtype the rows were not collected with) the
/// roofline, as the reference falls back; `scale × max(0, latency)`.
pub fn eval_gdn(db: &Database, op: &GdnOp, b: u32, s: u32) -> Result<f64> {
    let bw = db.spec.mem_bw;
    if db.mode.is_empirical() {
        return Err(PerfError::unsupported(format!(
            "database_mode {} is not modelled for Qwen3.5's GDN kernels (use SILICON or SOL)",
            db.mode.name()
        )));
    }
    let sol = |b: f64, s: f64| op.sol_ms(bw, b, s);
    if db.mode.is_sol() {
        return Ok(sol(b as f64, s as f64).max(0.0) * op.scale);
    }
    let table = db.gdn.table.get_or_init(|| load(db)).as_ref().map_err(Clone::clone)?;
    let v = match table_grid(db, table, op) {
        Err(_) => sol(b as f64, s as f64),
        Ok(grid) if op.context => {
            if s == 0 {
                sol(b as f64, 0.0)
            } else {
                let f = |c: &[f64]| sol(c[0], c[1]);
                match grid.query(&CONTEXT_SPEC, &f, &[b as f64, s as f64]) {
                    Err(e) if e.kind == ErrorKind::NoAnchor => sol(b as f64, s as f64),
                    r => r?,
                }
            }
        }
        Ok(grid) => {
            let f = |c: &[f64]| sol(c[0], s as f64);
            match grid.query(&GENERATION_SPEC, &f, &[b as f64]) {
                Err(e) if e.kind == ErrorKind::NoAnchor => sol(b as f64, s as f64),
                r => r?,
            }
        }
    };
    Ok(v.max(0.0) * op.scale)
}

/// A GEMM whose width can fall below the measured `n` grid (the GDN `b`/`a` projection at high
/// tensor parallelism, the scalar shared-expert gate): the table, else its roofline.
#[derive(Clone, Debug, PartialEq)]
pub struct SmallGemmOp {
    pub name: String,
    pub scale: f64,
    pub n: u32,
    pub k: u32,
    pub dtype: Dtype,
}

/// `eval` of a [`SmallGemmOp`] at `m` tokens.
pub fn eval_small_gemm(db: &Database, op: &SmallGemmOp, m: u32) -> Result<f64> {
    let v = match db.gemm_op(op.dtype, m, op.n, op.k, false) {
        Err(e) if e.kind == ErrorKind::NoAnchor && !db.mode.is_empirical() => {
            let flops = op.dtype.flops(&db.spec)?;
            gemm_sol(&db.spec, op.dtype, flops, m as f64, op.n as f64, op.k as f64)
        }
        r => r?,
    };
    Ok(v.max(0.0) * op.scale)
}

/// Bytes of recurrent state one request holds on one GPU: per GDN layer the SSM state
/// (`v_heads/tp × k_head_dim × v_head_dim` at the state dtype) and the convolution window
/// (`conv_kernel − 1` steps of the packed q/k/v channels, bf16).
pub fn state_bytes_per_request(q: &Qwen35Spec, tp: u32) -> f64 {
    let tp = tp.max(1) as u64;
    let ssm_bytes = if q.ssm_dtype == "float32" { 4 } else { 2 };
    let ssm = (q.v_heads as u64 / tp) * q.k_head_dim as u64 * q.v_head_dim as u64 * ssm_bytes;
    let channels = 2 * q.k_heads as u64 * q.k_head_dim as u64 + q.v_heads as u64 * q.v_head_dim as u64;
    let conv = channels / tp * (q.conv_kernel as u64).saturating_sub(1) * 2;
    q.linear_layers as f64 * (ssm + conv) as f64
}

/// KV-cache bytes per token on one GPU: K and V of the full-attention layers only.
pub fn kv_bytes_per_token(m: &ModelSpec, q: &Qwen35Spec, tp: u32, kv: Dtype) -> f64 {
    q.full_layers as f64 * 2.0 * m.kv_heads.div_ceil(tp) as f64 * m.head_dim as f64 * kv.bytes()
}

/// `(context ops, generation ops)` of a Qwen3.5 model on vLLM, SGLang or TRT-LLM:
///
/// ```text
/// embedding, embedding all-reduce,
/// per GDN layer (× linear layers): norm, in_proj GEMM (q, k, v, z), in_proj_ba GEMM, conv1d,
///   scan (decode: recurrence), out_proj GEMM, all-reduce, FFN
/// per full-attention layer (× full layers): norm, qkv GEMM (query doubled by the output
///   gate), attention (qk-norm), proj GEMM, all-reduce, FFN
/// FFN: norm, then dense (gate_up GEMM, act, down GEMM, all-reduce) or MoE (router GEMM when
///   ≥ 128 experts, experts, combine, the shared expert with its scalar gate and the merge;
///   decode runs the shared expert beside the routed chain)
/// logits GEMM, pipeline hand-off
/// ```
///
/// MTP scales the generation ops by `(L + nextn) / L`. The backends differ in the MoE block:
///
/// - vLLM: the pre-dispatch prices nothing without attention DP (the model prices the attention
///   all-reduce itself), so it is left out; with attention DP it gathers the ranks' tokens.
/// - SGLang: no pre-dispatch either (its standard dispatcher has no collective without attention
///   DP); with attention DP the MoE layers fold the attention all-reduce into the pre-MLP gather
///   the pre-dispatch prices, ahead of the shared expert's stream. The scalar shared-expert gate is fused with the merge into one kernel after the
///   streams join (reading hidden, shared and routed outputs), so the shared branch is gate_up,
///   act and down only. Decode overlaps the branches as vLLM does.
/// - TRT-LLM: the reference prices a pre-dispatch all-reduce beside the attention all-reduce,
///   counting that reduction twice (a known error it documents); reproduced here. Decode runs the
///   shared expert after the routed chain, not beside it.
///
/// Other backends and context parallelism are refused by name.
pub fn build_qwen35_ops(m: &ModelSpec, q: &Qwen35Spec, l: &Layout) -> Result<(Vec<Op>, Vec<Op>)> {
    let (tp, h) = (l.tp, m.hidden);
    let backend = l.backend.as_str();
    if !matches!(backend, "vllm" | "sglang" | "trtllm") {
        return Err(PerfError::unsupported(format!(
            "{}: Qwen3.5 (GDN + full attention) is timed for backends vllm, sglang and trtllm; not {backend}",
            m.name
        )));
    }
    // SGLang folds the shared expert's scalar gate into the merge kernel.
    let fused_gate = backend == "sglang";
    // (Prefill CP never gets here: the reference's Qwen3.5 class claims none, and the estimator
    // refuses it in those words first, `dcp::prefill_cp_refusal`.)
    if l.ngram > 0 || l.moe_comm.is_large_ep() {
        return Err(PerfError::unsupported(format!(
            "{}: Qwen3.5 is modelled without ngram drafts and the large-EP MoE path",
            m.name
        )));
    }
    if !q.k_heads.is_multiple_of(tp) || !q.v_heads.is_multiple_of(tp) {
        return Err(PerfError::config(format!(
            "{}: Qwen3.5 GDN head counts (linear_num_key_heads {}, linear_num_value_heads {}) must both divide by tp={tp}",
            m.name, q.k_heads, q.v_heads
        )));
    }
    let routed = m.routed();
    let dp = l.attention_dp > 1;
    // With attention DP, SGLang's MoE layers fold the attention all-reduce into the pre-MLP
    // gather, which the pre-dispatch prices.
    let folded = backend == "sglang" && routed && dp;
    let layers = m.layers as f64;
    let mtp = if l.nextn == 0 { 1.0 } else { (l.nextn as f64 + layers) / layers };
    let act = 2.0;
    let (nk, hk, nv, hv) = (q.k_heads, q.k_head_dim, q.v_heads, q.v_head_dim);
    let in_proj = (2 * nk * hk + 2 * nv * hv) / tp;
    let (n_q, n_kv) = (m.heads / tp, m.kv_heads.div_ceil(tp));
    let ffn_gemm = l.shared_gemm;
    let mut out = (Vec::new(), Vec::new());
    for (ctx, list) in [(true, &mut out.0), (false, &mut out.1)] {
        let phase = if ctx { "context" } else { "generation" };
        let s = if ctx { 1.0 } else { mtp };
        let elementwise =
            |name: String, c: f64, bytes: u32| Op::Elementwise { name, scale: c, bytes_per_token: bytes as f64 * act };
        list.push(Op::Embedding { name: format!("{phase}_embedding"), scale: s, bytes_per_token: h as f64 * 2.0 });
        list.push(Op::AllReduce { name: format!("{phase}_embedding_ar"), scale: s, hidden: h, tp });
        for (kind, count) in [("gdn", q.linear_layers), ("full", q.full_layers)] {
            if count == 0 {
                continue;
            }
            let c = count as f64 * s;
            let p = format!("{phase}_{kind}");
            let gemm =
                |name: String, n: u32, k: u32, dtype: Dtype, fp8_input: bool| Op::gemm(name, c, n, k, dtype, fp8_input);
            if kind == "gdn" {
                let kernel = |name: &str, kernel: &'static str| {
                    Op::Gdn(GdnOp {
                        name: format!("{p}_{name}"),
                        scale: c,
                        kernel,
                        context: ctx,
                        hidden: h,
                        conv_kernel: q.conv_kernel,
                        k_heads: nk / tp,
                        k_head_dim: hk,
                        v_heads: nv / tp,
                        v_head_dim: hv,
                        ssm_dtype: q.ssm_dtype,
                    })
                };
                list.push(elementwise(format!("{p}_norm"), c, 4 * h));
                list.push(gemm(format!("{p}_in_proj_gemm"), in_proj, h, l.gemm, false));
                list.push(Op::SmallGemm(SmallGemmOp {
                    name: format!("{p}_in_proj_ba_gemm"),
                    scale: c,
                    n: 2 * nv / tp,
                    k: h,
                    dtype: l.gemm,
                }));
                if ctx {
                    list.push(kernel("conv1d", "causal_conv1d_fn"));
                    list.push(kernel("scan", "chunk_gated_delta_rule"));
                } else {
                    list.push(kernel("conv1d", "causal_conv1d_update"));
                    list.push(kernel("recurrence", "fused_sigmoid_gating_delta_rule_update"));
                }
                list.push(gemm(format!("{p}_out_proj_gemm"), h, nv * hv / tp, l.gemm, true));
            } else {
                list.push(elementwise(format!("{p}_attn_norm"), c, 4 * h));
                // The output gate doubles the query slice.
                list.push(gemm(
                    format!("{phase}_qkv_gemm"),
                    2 * n_q * m.head_dim + 2 * n_kv * m.head_dim,
                    h,
                    l.gemm,
                    false,
                ));
                let heads = AttentionHeads { n: n_q, n_kv, head: m.head_dim, window: 0, qk_norm: true };
                list.push(attention_op(ctx, format!("{phase}_attention"), c, heads, l));
                list.push(gemm(format!("{phase}_proj_gemm"), h, n_q * m.head_dim, l.gemm, true));
            }
            if !folded {
                list.push(Op::AllReduce { name: format!("{p}_ar"), scale: c, hidden: h, tp });
            }
            list.push(elementwise(format!("{p}_ffn_norm"), c, 4 * h));
            if !routed {
                let inter = m.inter / tp;
                list.push(gemm(format!("{p}_gate_ffn1_gemm"), 2 * inter, h, ffn_gemm, false));
                list.push(elementwise(format!("{p}_act_gate"), c, 3 * inter));
                list.push(gemm(format!("{p}_ffn2_gemm"), h, inter, ffn_gemm, true));
                list.push(Op::AllReduce { name: format!("{p}_ffn_ar"), scale: c, hidden: h, tp });
                continue;
            }
            let mut routed_ops = Vec::new();
            if m.experts >= 128 {
                routed_ops.push(gemm(format!("{p}_router_gemm"), m.experts, h, Dtype::Bfloat16, false));
            }
            let dispatch = |pre: bool| {
                let name = format!("{p}_moe_{}_dispatch", if pre { "pre" } else { "post" });
                Op::MoeDispatch(DispatchOp::at(name, c, h, l, pre).attn_ar_modeled())
            };
            if backend == "trtllm" || (backend == "vllm" && dp) {
                // The reference's TRT-LLM dispatch ignores that the model already priced the
                // attention all-reduce, so this all-reduces the same activations again; vLLM's
                // gathers the attention-DP ranks' tokens.
                routed_ops.push(dispatch(true));
            } else if folded {
                // SGLang's gather completes before the shared expert's stream forks.
                list.push(dispatch(true));
            }
            routed_ops.push(Op::Moe(MoeOp::routed(format!("{p}_moe"), c, h, (m, l), DISTRIBUTION, true)));
            let mut shared = Vec::new();
            if q.shared_inter > 0 {
                let si = q.shared_inter / tp;
                if !fused_gate {
                    shared.push(Op::SmallGemm(SmallGemmOp {
                        name: format!("{p}_shared_expert_gate_gemm"),
                        scale: c,
                        n: 1,
                        k: h,
                        dtype: Dtype::Bfloat16,
                    }));
                }
                shared.push(gemm(format!("{p}_shared_gate_up_gemm"), 2 * si, h, ffn_gemm, false));
                shared.push(elementwise(format!("{p}_shared_act_gate"), c, 3 * si));
                shared.push(gemm(format!("{p}_shared_down_gemm"), h, si, ffn_gemm, true));
                if !fused_gate {
                    shared.push(elementwise(format!("{p}_shared_expert_gate_mul"), c, 2 * h));
                }
            }
            if ctx || shared.is_empty() || backend == "trtllm" {
                list.extend(routed_ops);
                list.extend(shared);
            } else {
                list.push(Op::Overlap { name: format!("{p}_moe_overlap"), a: routed_ops, b: shared });
            }
            if q.shared_inter > 0 {
                // The add of routed and gated shared outputs; SGLang's fused kernel also reads the
                // hidden state for the gate.
                let read = if fused_gate { 3 * h } else { 2 * h };
                list.push(elementwise(format!("{p}_shared_merge"), c, read + h));
            }
            list.push(dispatch(false));
        }
        list.push(logits_gemm(format!("{phase}_logits_gemm"), s, m, tp));
        list.push(Op::pipeline_p2p(format!("{phase}_p2p"), s, h, l));
    }
    Ok(out)
}

impl Database {
    /// Whether the GDN table holds rows (for reports).
    pub fn gdn_sources(&self) -> Vec<String> {
        match self.gdn.table.get_or_init(|| load(self)) {
            Ok(t) => t.looked.clone(),
            Err(_) => Vec::new(),
        }
    }
}
