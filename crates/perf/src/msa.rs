//! MiniMax sparse attention (MSA: MiniMax-M3): the attention block op, its roofline and the
//! model's graph.
//!
//! ```text
//! msa_context_module_perf     (architecture, mla_dtype, kv_cache_dtype, gemm_type) → kernel bucket
//!                             → [num_heads][prefix][isl][batch]
//! msa_generation_module_perf  (architecture, kv_cache_dtype, gemm_type) → kernel bucket
//!                             → [num_heads][batch][isl + step]
//! ```
//!
//! MSA is grouped-query attention (64 query / 4 KV heads of 128) behind a block indexer: four
//! fp8 index heads score the KV cache in blocks of 128 tokens and the attention reads the top
//! 16 blocks (2048 tokens). One op times a layer's block; its tables share the DSA module row
//! schema and are read by `dsa.rs`'s loader and grids, past the data holding utilisation against
//! the roofline below. Without a table for the backend the reference borrows DSA's measured
//! utilisation instead (not modelled here: such a query is refused, naming the missing table).

use crate::db::{Database, Dtype};
use crate::dsa::{finish, select, Flops, CONTEXT_SPEC, GENERATION_SPEC, REQUESTED_BUCKET};
use crate::error::{PerfError, Result};
use crate::model::{logits_gemm, push_moe_ops, push_shared_beside_routed, Layout, ModelSpec, Op};
use crate::moe_ops::MLA_DISTRIBUTION;
use crate::systems::SystemSpec;

/// The architecture every MSA table row is measured on.
const ARCH: &str = "MiniMaxM3ForCausalLM";
/// The file names the MSA tables are read from (context, generation).
pub const FILES: [&str; 2] = ["msa_context_module_perf.parquet", "msa_generation_module_perf.parquet"];

/// The block's fixed geometry (MiniMax-M3's sparse attention config, as the reference fixes it).
const V_HEAD_DIM: i128 = 128;
const INDEX_HEADS: i128 = 4;
const INDEX_HEAD_DIM: i128 = 128;
const BLOCK: i128 = 128;
const TOP_BLOCKS: i128 = 16;

/// One MSA attention block, `scale` × its layer latency.
#[derive(Clone, Debug, PartialEq)]
pub struct MsaOp {
    pub name: String,
    pub scale: f64,
    /// The prefill module (else decode).
    pub context: bool,
    /// Query and KV heads per GPU (at least one each).
    pub heads: u32,
    pub kv_heads: u32,
    pub hidden: u32,
    pub head_dim: u32,
    pub kv: Dtype,
    pub fmha: Dtype,
    pub gemm: Dtype,
}

/// `eval` of an MSA op: `scale × max(0, latency)`; context for `b` sequences of `s` new tokens
/// after `prefix` cached ones, decode for `b` requests at KV length `s`.
pub fn eval_msa(db: &Database, op: &MsaOp, b: u32, s: u32, prefix: u32) -> Result<f64> {
    let spec = &db.spec;
    let flops = Flops { gemm: op.gemm.flops(spec)?, indexer: Dtype::Fp8.flops(spec)?, attn: op.fmha.flops(spec)? };
    let table = db.msa_table(op.context, FILES[usize::from(!op.context)])?;
    let key = if op.context {
        format!("{ARCH}/{}/{}/{}", op.fmha.name(), op.kv.name(), op.gemm.name())
    } else {
        format!("{ARCH}//{}/{}", op.kv.name(), op.gemm.name())
    };
    let what = if op.context { "context MSA module" } else { "generation MSA module" };
    let missing = || {
        let have = if table.grids.is_empty() {
            "none".to_string()
        } else {
            table.grids.keys().cloned().collect::<Vec<_>>().join(", ")
        };
        let looked = if table.looked.is_empty() {
            format!("no {} file is installed for this backend version", FILES[usize::from(!op.context)])
        } else {
            format!("looked in {}", table.looked.join(", "))
        };
        PerfError::data(format!(
            "no {what} data for {key} on {} / {} {} (the reference then transfers DSA's utilisation, \
             which servesim does not model; have: {have}; {looked})",
            spec.name, db.backend, db.version,
        ))
    };
    let (_, (grid, _)) = table.grids.get(&key).and_then(|by| select(by, REQUESTED_BUCKET)).ok_or_else(missing)?;
    let o = op.clone();
    let v = if op.context {
        let sol = move |c: &[f64]| sol_ms(spec, &o, flops, true, [c[3], c[2], c[1], c[0]].map(|x| x as i128));
        grid.query(&CONTEXT_SPEC, &sol, &[op.heads as f64, prefix as f64, s as f64, b as f64])
    } else {
        let sol = move |c: &[f64]| sol_ms(spec, &o, flops, false, [c[1], c[2], 0.0, c[0]].map(|x| x as i128));
        grid.query(&GENERATION_SPEC, &sol, &[op.heads as f64, b as f64, s as f64])
    };
    let v = v.map_err(|e| e.context(format!("{what} on {} / {} {}", spec.name, db.backend, db.version)))?;
    Ok(v.max(0.0) * op.scale)
}

/// Roofline (ms) of one block at `[b, s, prefix, heads]`: the Q / KV / O / index-Q projections,
/// the fp8 block indexer (only when the sequence outgrows the top-k window), and attention over
/// the selected tokens — prefill `Σ_{i<s} min(prefix + i + 1, topk)` pairs, decode
/// `min(s − 1, topk)` per request.
fn sol_ms(spec: &SystemSpec, op: &MsaOp, flops: Flops, context: bool, [b, s, prefix, heads]: [i128; 4]) -> f64 {
    let (hidden, dim, kv_heads) = (op.hidden as i128, op.head_dim as i128, op.kv_heads as i128);
    let topk = TOP_BLOCKS * BLOCK;
    let tokens = if context { b * s } else { b };
    let full = if context { prefix + s } else { s };
    let kv_len = if context { full } else { (s - 1).max(0) };
    let gemm_ops = 2 * tokens * hidden * heads * dim
        + 2 * tokens * hidden * 2 * kv_heads * dim
        + 2 * tokens * heads * V_HEAD_DIM * hidden
        + 2 * tokens * hidden * INDEX_HEADS * INDEX_HEAD_DIM;
    let (pairs, scored) = if !context {
        (tokens * kv_len.min(topk), kv_len)
    } else if full <= topk {
        (b * (full * (full + 1) - prefix * (prefix + 1)) / 2, full)
    } else if prefix >= topk {
        (tokens * topk, full)
    } else {
        (b * (topk * (topk + 1) - prefix * (prefix + 1)) / 2 + b * (full - topk) * topk, full)
    };
    let selected = if context { full.min(topk) } else { kv_len.min(topk) };
    let attn_ops = 2 * heads * (dim + V_HEAD_DIM) * pairs;
    let blocks = if scored > topk { (scored + BLOCK - 1) / BLOCK } else { 0 };
    let indexer_ops = 2 * tokens * INDEX_HEADS * INDEX_HEAD_DIM * blocks;
    let weights = hidden * heads * dim
        + hidden * 2 * kv_heads * dim
        + heads * V_HEAD_DIM * hidden
        + hidden * INDEX_HEADS * INDEX_HEAD_DIM;
    let kv_bytes = (b * kv_heads * selected * (dim + V_HEAD_DIM)) as f64 * op.kv.bytes();
    // fp8 index keys, one per block.
    let index_bytes = (b * blocks * INDEX_HEADS * INDEX_HEAD_DIM) as f64;
    let q_bytes = (tokens * heads * dim) as f64 * op.fmha.bytes() * 2.0;
    let bytes = weights as f64 * op.gemm.bytes() + kv_bytes + index_bytes + q_bytes;
    finish(spec, flops, [gemm_ops, indexer_ops, attn_ops], bytes)
}

/// `(context ops, generation ops)` of MiniMax-M3, as the reference's `MiniMaxM3Model` lays them
/// out (DeepSeek-V3.2's graph with the MSA block):
///
/// ```text
/// embedding, add_norm_1, attention (MSA module), add_norm_2,
/// shared expert (gate/up GEMM, act, down GEMM), router GEMM, dispatch, experts, combine,
/// logits GEMM, p2p
/// ```
///
/// Every layer is timed as a MoE layer (the `first_k_dense_replace` dense layers too); the
/// shared expert is split over attention tensor parallelism in the checkpoint's GEMM format;
/// decode runs it beside the routed chain and MTP scales the generation ops by `(L + nextn) / L`.
pub fn build_msa_ops(m: &ModelSpec, l: &Layout) -> Result<(Vec<Op>, Vec<Op>)> {
    if l.ngram > 0 {
        return Err(PerfError::unsupported(format!("{}: ngram verification of MSA attention is not modelled", m.name)));
    }
    let (tp, h) = (l.tp, m.hidden);
    let layers = m.layers as f64;
    let mtp = if l.nextn == 0 { 1.0 } else { (l.nextn as f64 + layers) / layers };
    let act = 2.0;
    let inter = m.moe_inter / tp;
    let mut out = (Vec::new(), Vec::new());
    for (ctx, list) in [(true, &mut out.0), (false, &mut out.1)] {
        let phase = if ctx { "context" } else { "generation" };
        let nm = |x: &str| format!("{phase}_{x}");
        let s = if ctx { 1.0 } else { mtp };
        let ls = layers * s;
        let gemm = |name: String, n: u32, k: u32| Op::gemm(name, ls, n, k, l.gemm, false);
        let add_norm =
            |name: &str| Op::Elementwise { name: nm(name), scale: ls, bytes_per_token: (2 * h + 2 * h) as f64 * act };
        list.push(Op::Embedding { name: nm("embedding"), scale: s, bytes_per_token: h as f64 * 2.0 });
        list.push(add_norm("add_norm_1"));
        list.push(Op::Msa(MsaOp {
            name: nm("attention"),
            scale: ls,
            context: ctx,
            heads: (m.heads / tp).max(1),
            kv_heads: (m.kv_heads / tp).max(1),
            hidden: h,
            head_dim: m.head_dim,
            kv: l.kv,
            fmha: l.fmha,
            gemm: l.gemm,
        }));
        list.push(add_norm("add_norm_2"));
        let shared = vec![
            gemm(nm("shared_gate_up_gemm"), 2 * inter, h),
            Op::Elementwise { name: nm("shared_act_gate"), scale: ls, bytes_per_token: (3 * inter) as f64 * act },
            gemm(nm("shared_ffn2_gemm"), h, inter),
        ];
        let mut routed = Vec::new();
        push_moe_ops(&mut routed, m, l, ctx, ls, MLA_DISTRIBUTION);
        push_shared_beside_routed(list, ctx, phase, shared, routed);
        list.push(logits_gemm(nm("logits_gemm"), s, m, tp));
        list.push(Op::pipeline_p2p(nm("p2p"), s, h, l));
    }
    Ok(out)
}
