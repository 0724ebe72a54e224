//! The multi-head latent attention (MLA) ops of a DeepSeek-V3-style op list and their
//! rooflines. Latencies come from the `mla/` tables in `mla.rs`; `model.rs` lays the ops out.
//!
//! The reference times MLA attention as one fused *module* per phase (projections, RoPE,
//! absorption BMMs and the attention kernel measured together) when the backend's module table
//! has the shape, and otherwise as the granular chain it falls back to: the fused `q_a + kv_a`
//! down-projection, the up-projections, the attention kernel (`context_mla_perf` /
//! `generation_mla_perf`, or plain attention on vLLM), the absorption BMMs around the decode
//! kernel and the output projection. Every kernel table assumes DeepSeek-V3's latent geometry
//! (`kv_lora_rank` 512 + `qk_rope_head_dim` 64 latent elements per token, 192 + 128 = 320 wide
//! context heads, a 1 088-element absorbed decode head).

use crate::db::Dtype;
use crate::systems::SystemSpec;

/// Latent KV elements per token and layer the MLA tables are measured with.
pub const LATENT_KV: f64 = 576.0;

/// Which measured MLA table an op reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MlaKind {
    /// `mla_context_module_perf`: the whole attention block of a prefill.
    ContextModule,
    /// `mla_generation_module_perf`: the whole attention block of a decode step.
    GenerationModule,
    /// `context_mla_perf`: the context attention kernel alone.
    Context,
    /// `generation_mla_perf`: the absorbed decode attention kernel alone.
    Generation,
}

/// One MLA attention op (module or kernel), `scale` × its layer latency.
#[derive(Clone, Debug, PartialEq)]
pub struct MlaOp {
    pub name: String,
    pub scale: f64,
    pub kind: MlaKind,
    /// Heads per GPU the table is asked at.
    pub heads: u32,
    pub kv: Dtype,
    /// Attention compute format (context tables only).
    pub fmha: Dtype,
    /// Projection GEMM format (module tables only).
    pub gemm: Dtype,
    /// The model's own head count: which module measurement family answers (module tables).
    pub native_heads: u32,
    /// Prefill context parallelism of a context kernel (`MlaKind::Context`; 1: none): the
    /// busiest rank's two zigzag chunks of the prompt, as for dense context attention. The
    /// fused module keeps the whole prompt and carries the split in its `scale` instead.
    pub cp: u32,
}

/// The absorption BMM before (`pre`) or after the decode attention kernel (`mla_bmm_perf`).
#[derive(Clone, Debug, PartialEq)]
pub struct MlaBmmOp {
    pub name: String,
    pub scale: f64,
    pub heads: u32,
    pub dtype: Dtype,
    pub pre: bool,
}

fn max_ms(math_ops: f64, flops: f64, mem_bytes: f64, spec: &SystemSpec) -> f64 {
    (math_ops / flops * 1000.0).max(mem_bytes / spec.mem_bw * 1000.0)
}

/// Context MLA roofline (no cached prefix) of `b` sequences of `s` tokens on `n` heads, ms.
pub fn context_sol(spec: &SystemSpec, kv: Dtype, flops: f64, n: f64, s: f64, b: f64) -> f64 {
    let width = 192.0 + 128.0;
    let ops = b * n * width * (s * s);
    let mem = b * n * (kv.bytes() * s * width + 2.0 * s * width);
    max_ms(ops, flops, mem, spec)
}

/// Context MLA roofline of `b` sequences of `s` new tokens after `prefix` cached ones on `n`
/// heads, ms: the causal work of the new rows only, the whole sequence's latent KV read.
pub fn context_sol_prefix(spec: &SystemSpec, kv: Dtype, flops: f64, n: f64, s: f64, prefix: f64, b: f64) -> f64 {
    let width = 192.0 + 128.0;
    let full = s + prefix;
    let ops = b * n * 2.0 / 2.0 * width * (full * full - prefix * prefix);
    let mem = b * n * (kv.bytes() * full * width + 2.0 * s * width);
    max_ms(ops, flops, mem, spec)
}

/// Absorbed decode attention: (compute ops, bytes) of `b` requests reading `s` tokens of KV.
fn generation_terms(kv: Dtype, n: f64, b: f64, s: f64) -> (f64, f64) {
    let ops = 2.0 * b * n * 1088.0 * s;
    let mem = b * (n * 1088.0 * 2.0 + (s - 1.0) * LATENT_KV * kv.bytes());
    (ops, mem)
}

/// Decode MLA kernel roofline, ms.
pub fn generation_sol(spec: &SystemSpec, kv: Dtype, flops: f64, n: f64, b: f64, s: f64) -> f64 {
    let (ops, mem) = generation_terms(kv, n, b, s);
    max_ms(ops, flops, mem, spec)
}

/// Decode MLA module roofline: the kernel plus both absorption BMMs, summed per term before the
/// max, ms.
#[allow(clippy::too_many_arguments)]
pub fn generation_module_sol(
    spec: &SystemSpec,
    kv: Dtype,
    gemm: Dtype,
    attn_flops: f64,
    bmm_flops: f64,
    n: f64,
    b: f64,
    s: f64,
) -> f64 {
    let (ops, mem) = generation_terms(kv, n, b, s);
    let bmm_ops = 2.0 * 2.0 * b * n * 128.0 * 512.0;
    let bmm_mem = 2.0 * n * (b * 640.0 + 128.0 * 512.0) * gemm.bytes();
    let math = ops / attn_flops * 1000.0 + bmm_ops / bmm_flops * 1000.0;
    let memory = mem / spec.mem_bw * 1000.0 + bmm_mem / spec.mem_bw * 1000.0;
    math.max(memory)
}

/// Absorption BMM roofline for `t` tokens on `n` heads, ms.
pub fn bmm_sol(spec: &SystemSpec, dtype: Dtype, flops: f64, n: f64, t: f64) -> f64 {
    let ops = 2.0 * t * n * 128.0 * 512.0;
    let mem = n * (t * 640.0 + 128.0 * 512.0) * dtype.bytes();
    max_ms(ops, flops, mem, spec)
}
