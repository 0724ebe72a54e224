//! SGLang's wide expert-parallel (large-EP, DeepEP) graphs of the MLA and DSA families, and the
//! wide-EP MLA module tables their attention reads. The reference builds them when its
//! `ModelConfig.moe_comm_backend` names DeepEP for the context phase on SGLang (servesim: the
//! timing-config key `moe_comm_backend: {context: deepep_ht}`); each layer is
//!
//! ```text
//! MLA (DeepSeek-V3 / R1 / V3.1, Kimi-K2):
//!   qkv_a_proj_gemm (2112 × hidden, the rank's tokens ÷ tp), [tp > 1: tp_all_gather],
//!   embedding, add_norm_1, downscale_gemm (2112 × hidden),
//!   attention (wideep_context_mla_perf: 128 / tp heads), [cp > 1: cp_all_gather],
//!   [tp > 1: tp_reduce_scatter]
//! DSA (DeepSeek-V3.2, GLM-5):
//!   [tp > 1: tp_all_gather], attention (the DSA module), [tp > 1: tp_reduce_scatter]
//! then both:
//!   gate_ffn1_gemm, act_gate, ffn2_gemm (the whole shared expert, tokens ÷ tp),
//!   moe_dispatch, moe (wideep_context_moe_perf), moe_combine (DeepEP normal mode)
//! ```
//!
//! with no router GEMM, second add-norm, logits GEMM or pipeline hand-off (the reference's
//! legacy wide-EP graph has none). Prefill context parallelism splits the token-major ops'
//! tokens (⌈x / cp⌉) and the attention in 2·cp zigzag chunks; the all-to-all divides the
//! rank's tokens by tp × cp and the experts see every rank's. The generation phase, whose
//! DeepEP low-latency all-to-all is not modelled, keeps the same attention (MLA:
//! `wideep_generation_mla_perf`) before the fused MoE block (router, shared expert ÷ tp,
//! dispatch, experts, combine), as the reference builds it when only the context phase takes
//! DeepEP.
//!
//! The MLA tables (`mla/sglang/<version>/wideep_{context,generation}_mla_perf`) are keyed by
//! `(kernel_source, mla_dtype, kv_cache_dtype)` (generation: without `mla_dtype`) and read at
//! `[heads][isl][batch]` (context, √latency along the sequence) or `[heads][batch][isl + step]`
//! (generation); beyond the measured range a query holds the nearest points' utilisation
//! against the module's roofline. `attention_backend` `flashinfer` (the default) or `fa3` reads
//! its own rows, else Blackwell's `trtllm_mla` rows where those are all there is.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use crate::db::{gen_attn_dtype, keep_row, Database, Dtype};
use crate::error::{PerfError, Result};
use crate::interp::{Grid, GridSpec, Node};
use crate::model::{Layout, ModelSpec, Op};
use crate::parquet_table::{key_u32, Table};
use crate::systems::SystemSpec;

const CONTEXT_SPEC: GridSpec = GridSpec::sqrt_along(&["num_heads", "seq_len", "batch"], 1);
const GENERATION_SPEC: GridSpec = GridSpec::raw(&["num_heads", "batch", "seq_len"]);

/// The attention backends the wide-EP MLA module takes (`attention_backend`; unset or
/// `default`: flashinfer).
pub const BACKENDS: [&str; 2] = ["flashinfer", "fa3"];

/// Blackwell's MLA kernel rows, which stand in for a requested backend the tables lack.
const BLACKWELL_KERNEL: &str = "trtllm_mla";

/// The fused `q_a + kv_a + rope` width the reference's wide-EP graph uses (DeepSeek-V3's
/// 1536 + 512 + 64, a literal there).
const QKV_A_WIDTH: u32 = 2112;

/// One wide-EP MLA table: grids by dtype key (`kernel/mla_dtype/kv` or `kernel/kv`).
#[derive(Debug)]
pub struct WideMlaTable {
    grids: BTreeMap<String, Grid>,
    looked: Vec<String>,
}

/// The lazily loaded wide-EP MLA tables of one database.
#[derive(Debug, Default)]
pub struct WideMlaTables {
    context: OnceLock<Result<WideMlaTable>>,
    generation: OnceLock<Result<WideMlaTable>>,
}

fn load(db: &Database, context: bool) -> Result<WideMlaTable> {
    let file = if context { "wideep_context_mla_perf.parquet" } else { "wideep_generation_mla_perf.parquet" };
    let mut nodes: BTreeMap<String, Node> = BTreeMap::new();
    let mut looked = Vec::new();
    for src in crate::systems::sources(&db.spec, &db.backend, &db.version, file, db.shared_layer)? {
        looked.push(src.path.display().to_string());
        if !src.path.exists() {
            continue;
        }
        let t = Table::read(
            &src.path,
            &["kernel_source", "mla_dtype", "kv_cache_dtype", "num_heads", "batch_size", "isl", "step", "latency"],
        )?;
        let p = t.path.clone();
        let ks = t.text_or_none("kernel_source")?;
        let kv = t.text("kv_cache_dtype")?;
        let fmha = if context { t.text("mla_dtype")? } else { &[] };
        let (heads, batch, isl) = (t.int("num_heads")?, t.int("batch_size")?, t.int("isl")?);
        let step = if context { Vec::new() } else { t.int("step")? };
        let lat = t.float("latency")?;
        for i in 0..t.rows {
            if !keep_row(&src, &ks[i]) {
                continue;
            }
            let text = |c: &[Option<String>], name: &str| {
                c[i].clone().ok_or_else(|| PerfError::data(format!("{p}: null {name} in row {i}")))
            };
            let kernel = text(&ks, "kernel_source")?;
            let kv = text(kv, "kv_cache_dtype")?;
            let (n, b) = (key_u32(&p, "num_heads", i, heads[i])?, key_u32(&p, "batch_size", i, batch[i])?);
            let s = key_u32(&p, "isl", i, isl[i])?;
            let (key, path) = if context {
                (format!("{kernel}/{}/{kv}", text(fmha, "mla_dtype")?), vec![n, s, b])
            } else {
                (format!("{kernel}/{kv}"), vec![n, b, s.saturating_add(key_u32(&p, "step", i, step[i])?)])
            };
            nodes.entry(key).or_default().insert_first_wins(&path, lat[i]);
        }
    }
    if nodes.is_empty() {
        return Err(PerfError::data(format!(
            "no {} rows for {} (looked in {})",
            file.trim_end_matches(".parquet"),
            db.which(),
            if looked.is_empty() { "no source file found".to_string() } else { looked.join(", ") }
        )));
    }
    Ok(WideMlaTable { grids: nodes.into_iter().map(|(k, n)| (k, Grid::new(n))).collect(), looked })
}

impl WideMlaTables {
    fn table(&self, db: &Database, context: bool) -> Result<&WideMlaTable> {
        let cell = if context { &self.context } else { &self.generation };
        cell.get_or_init(|| load(db, context)).as_ref().map_err(Clone::clone)
    }
}

/// A wide-EP MLA attention module (the reference's `WideEPContextMLA` /
/// `WideEPGenerationMLA`): the q_b / kv_b projections, attention and output projection of
/// `heads` heads (128 / tp), timed as one measured module.
#[derive(Clone, Debug, PartialEq)]
pub struct WideEpMlaOp {
    pub name: String,
    pub scale: f64,
    pub context: bool,
    pub heads: u32,
    pub kv: Dtype,
    pub fmha: Dtype,
    /// The kernel rows read: `flashinfer` or `fa3`.
    pub backend: String,
    /// Prefill context parallelism (1: none).
    pub cp: u32,
}

/// The heads the roofline counts at a table coordinate of `n` heads: 128 ÷ ⌊128 / n⌋.
fn roofline_heads(n: f64) -> f64 {
    (128.0 / (128.0 / n).floor()).floor()
}

/// The context module's roofline, ms (DeepSeek-V3's dimensions, as the reference's).
fn context_sol(spec: &SystemSpec, fmha: Dtype, main: f64, bf16: f64, n: f64, s: f64, b: f64) -> f64 {
    let (hidden, q_lora, kv_lora, rope, nope, v) = (7168.0, 1536.0, 512.0, 64.0, 128.0, 128.0);
    let q_b_flop = 2.0 * q_lora * n * (rope + nope) * b * s;
    let q_b_mem = b * q_lora * s + q_lora * n * (rope + nope) + 2.0 * b * n * (rope + nope) * s;
    let kv_b_flop = 2.0 * kv_lora * n * (nope + v) * b * s;
    let kv_b_mem = b * s * kv_lora + n * (nope + v) * kv_lora + 2.0 * b * n * (nope + v) * s;
    let attn_flop = (2.0 * n * (nope * 2.0 + rope) * b * (s * s) / 2.0).floor();
    let attn_mem = b * s * n * (nope + rope) + b * s * n * (nope + rope) + b * s * n * nope + b * s * n * nope;
    let out_flop = 2.0 * n * v * hidden * b * s;
    let out_mem = b * n * v * s + n * v * hidden + 2.0 * b * hidden * s;
    let math = (q_b_flop + kv_b_flop + out_flop) / main * 1000.0 + attn_flop / bf16 * 1000.0;
    let mem = (q_b_mem + kv_b_mem + attn_mem * 2.0 + out_mem) * fmha.bytes() / spec.mem_bw * 1000.0;
    math.max(mem)
}

/// The decode module's roofline, ms.
fn generation_sol(spec: &SystemSpec, fmha: Dtype, main: f64, bf16: f64, n: f64, b: f64, s: f64) -> f64 {
    let (hidden, q_lora, kv_lora, rope, nope, v) = (7168.0, 1536.0, 512.0, 64.0, 128.0, 128.0);
    let q_b_flop = 2.0 * q_lora * n * (rope + nope) * b;
    let q_b_mem = b * q_lora + q_lora * n * (rope + nope) + 2.0 * b * n * (rope + nope);
    let q_w_kc_flop = 2.0 * n * nope * kv_lora * b;
    let q_w_kc_mem = b * n * nope + n * kv_lora * nope + 2.0 * b * n * kv_lora;
    let attn_flop = 2.0 * b * s * n * (rope + kv_lora * 2.0);
    let attn_mem = b * n * (kv_lora + rope) + b * s * (rope + kv_lora) + b * n * kv_lora;
    let s_w_vc_flop = 2.0 * b * n * kv_lora * v;
    let s_w_vc_mem = b * n * kv_lora + n * v * kv_lora + 2.0 * b * n * v;
    let out_flop = 2.0 * n * v * hidden * b;
    let out_mem = b * n * v + n * v * hidden + 2.0 * b * hidden;
    let math = (q_b_flop + q_w_kc_flop + s_w_vc_flop + out_flop) / main * 1000.0 + attn_flop / bf16 * 1000.0;
    let mem = (q_b_mem + q_w_kc_mem + attn_mem * 2.0 + s_w_vc_mem + out_mem) * fmha.bytes() / spec.mem_bw * 1000.0;
    math.max(mem)
}

/// The grid of `op`'s dtype key: its backend's rows, else Blackwell's kernel rows.
fn slice<'t>(db: &Database, t: &'t WideMlaTable, op: &WideEpMlaOp) -> Result<&'t Grid> {
    let tail = if op.context { format!("{}/{}", op.fmha.name(), op.kv.name()) } else { op.kv.name().to_string() };
    let want = format!("{}/{tail}", op.backend);
    t.grids.get(&want).or_else(|| t.grids.get(&format!("{BLACKWELL_KERNEL}/{tail}"))).ok_or_else(|| {
        PerfError::data(format!(
            "no wide-EP {} MLA data for {want} on {} (have: {}; looked in {})",
            if op.context { "context" } else { "generation" },
            db.which(),
            t.grids.keys().cloned().collect::<Vec<_>>().join(", "),
            t.looked.join(", ")
        ))
    })
}

/// The module's layer latency (unscaled): context for `b` sequences of `s` new tokens after
/// `prefix` cached ones (the table at the whole length, the prefix's share of the causal work
/// taken out); decode for `b` requests at KV length `s`.
fn latency(db: &Database, op: &WideEpMlaOp, b: u32, s: u32, prefix: u32) -> Result<f64> {
    let spec = &db.spec;
    let t = db.wide_mla.table(db, op.context)?;
    let grid = slice(db, t, op)?;
    let bf16 = Dtype::Bfloat16.flops(spec)?;
    let what = || format!("wide-EP MLA on {}", db.which());
    if op.context {
        let (fmha, main) = (op.fmha, op.fmha.flops(spec)?);
        let full = s.checked_add(prefix).ok_or_else(|| PerfError::config("sequence length exceeds 2^32"))?;
        let sol = move |c: &[f64]| context_sol(spec, fmha, main, bf16, roofline_heads(c[0]), c[1], c[2]);
        let v = grid
            .query(&CONTEXT_SPEC, &sol, &[op.heads as f64, full as f64, b as f64])
            .map_err(|e| e.context(what()))?;
        if full == 0 {
            return Ok(0.0);
        }
        let (f, p) = (full as f64, prefix as f64);
        Ok(v * ((f * f - p * p) / (f * f)))
    } else {
        let fmha = gen_attn_dtype(spec, op.kv);
        let main = fmha.flops(spec)?;
        let sol = move |c: &[f64]| generation_sol(spec, fmha, main, bf16, roofline_heads(c[0]), c[1], c[2]);
        grid.query(&GENERATION_SPEC, &sol, &[op.heads as f64, b as f64, s as f64]).map_err(|e| e.context(what()))
    }
}

/// `eval` of a wide-EP MLA module, `scale × max(0, latency)`; under prefill context
/// parallelism the busiest rank's two zigzag chunks (the first and the last).
pub fn eval(db: &Database, op: &WideEpMlaOp, b: u32, s: u32, prefix: u32) -> Result<f64> {
    let v = if op.context && op.cp > 1 {
        let c = s.div_ceil(2 * op.cp).max(1);
        latency(db, op, b, c, prefix)? + latency(db, op, b, c, prefix + s - c)?
    } else {
        latency(db, op, b, s, prefix)?
    };
    Ok(v.max(0.0) * op.scale)
}

/// `op` on the attention tensor-parallel rank's share of the tokens (`x / tp`, floored), as
/// the reference's `scale_num_tokens`; `op` itself at tp 1.
fn tp_share(op: Op, tp: u32) -> Op {
    if tp > 1 {
        Op::TpShare { op: Box::new(op), tp }
    } else {
        op
    }
}

/// A tensor-parallel all-gather or reduce-scatter of `hidden` half-precision elements per
/// token around the attention (none at tp 1).
fn tp_collective(name: &str, kind: &'static str, scale: f64, hidden: u32, tp: u32) -> Option<Op> {
    (tp > 1).then(|| Op::Nccl {
        name: format!("context_{name}"),
        scale,
        kind,
        dtype: "half",
        elements: hidden as f64,
        gpus: tp,
    })
}

/// The large-EP context phase of an MLA model on SGLang (module docs), and its generation
/// phase before the fused MoE block.
pub(crate) fn mla_ops(m: &ModelSpec, l: &Layout, down: Dtype, backend: &str) -> (Vec<Op>, Vec<Op>) {
    let (tp, h) = (l.tp, m.hidden);
    let layers = m.layers as f64;
    let mtp = if l.nextn == 0 { 1.0 } else { (l.nextn as f64 + layers) / layers };
    let d = m.mla.expect("an MLA model");
    let mut out = (Vec::new(), Vec::new());
    for (ctx, list) in [(true, &mut out.0), (false, &mut out.1)] {
        let phase = if ctx { "context" } else { "generation" };
        let nm = |x: &str| format!("{phase}_{x}");
        let (s, ls) = if ctx { (1.0, layers) } else { (mtp, layers * mtp) };
        let qkv_a = Op::gemm(nm("qkv_a_proj_gemm"), ls, QKV_A_WIDTH, h, down, false);
        list.push(if ctx { tp_share(qkv_a, tp) } else { qkv_a });
        if ctx {
            list.extend(tp_collective("tp_all_gather", "all_gather", ls, h, tp));
        }
        list.push(Op::Embedding { name: nm("embedding"), scale: s, bytes_per_token: h as f64 * 2.0 });
        list.push(Op::Elementwise { name: nm("add_norm_1"), scale: ls, bytes_per_token: (4 * h) as f64 * 2.0 });
        list.push(Op::gemm(nm("downscale_gemm"), ls, QKV_A_WIDTH, h, down, false));
        list.push(Op::WideEpMla(WideEpMlaOp {
            name: nm("attention"),
            scale: ls,
            context: ctx,
            heads: 128 / tp,
            kv: l.kv,
            fmha: l.fmha,
            backend: backend.to_string(),
            cp: if ctx { l.cp.max(1) } else { 1 },
        }));
        if ctx && l.cp > 1 {
            list.push(crate::model::mla_cp_all_gather(nm("cp_all_gather"), layers, &d, l));
        }
        if ctx {
            list.extend(tp_collective("tp_reduce_scatter", "reduce_scatter", ls, h, tp));
        }
        moe_ops(list, m, l, ctx, ls, l.shared_gemm);
    }
    out
}

/// The large-EP graph of a DSA model on SGLang: `attention(ctx, scale)` is the model's DSA
/// module for the phase.
pub(crate) fn dsa_ops(m: &ModelSpec, l: &Layout, attention: impl Fn(bool, f64) -> Op) -> (Vec<Op>, Vec<Op>) {
    let layers = m.layers as f64;
    let mtp = if l.nextn == 0 { 1.0 } else { (l.nextn as f64 + layers) / layers };
    let mut out = (Vec::new(), Vec::new());
    for (ctx, list) in [(true, &mut out.0), (false, &mut out.1)] {
        let ls = if ctx { layers } else { layers * mtp };
        if ctx {
            list.extend(tp_collective("tp_all_gather", "all_gather", ls, m.hidden, l.tp));
        }
        list.push(attention(ctx, ls));
        if ctx {
            list.extend(tp_collective("tp_reduce_scatter", "reduce_scatter", ls, m.hidden, l.tp));
        }
        // The reference's SGLang DSA graph sizes its shared expert in the GEMM format.
        moe_ops(list, m, l, ctx, ls, l.gemm);
    }
    out
}

/// The MoE block of a wide-EP layer: DeepEP in the context phase, the fused block (router,
/// shared expert ÷ tp, dispatch, experts, combine, one after another) in the generation phase.
fn moe_ops(list: &mut Vec<Op>, m: &ModelSpec, l: &Layout, ctx: bool, scale: f64, shared: Dtype) {
    if ctx {
        list.extend(crate::moe_a2a::deepep_block(m, l, scale, shared));
        return;
    }
    let (h, i, tp) = (m.moe_inter, m.moe_inter / l.tp, l.tp);
    let mut routed = Vec::new();
    crate::model::push_moe_ops(&mut routed, m, l, false, scale, crate::moe_ops::MLA_DISTRIBUTION);
    // The router leads; the shared expert follows it, then dispatch, experts and combine.
    let mut it = routed.into_iter();
    list.extend(it.next());
    list.extend([
        Op::gemm("generation_shared_gate_up_gemm".into(), scale, 2 * h / tp, m.hidden, shared, false),
        Op::Elementwise {
            name: "generation_shared_act_gate".into(),
            scale,
            bytes_per_token: (2 * h / tp + i) as f64 * 2.0,
        },
        Op::gemm("generation_shared_ffn2_gemm".into(), scale, m.hidden, i, shared, false),
    ]);
    list.extend(it);
}

/// The shared expert of a DeepEP context layer: the whole expert (no tensor split), on the
/// attention tensor-parallel rank's share of the tokens.
pub(crate) fn shared_expert(m: &ModelSpec, l: &Layout, scale: f64, dtype: Dtype) -> Vec<Op> {
    let (h, i) = (m.hidden, m.moe_inter);
    [
        Op::gemm("context_gate_ffn1_gemm".into(), scale, 2 * i, h, dtype, false),
        Op::Elementwise { name: "context_act_gate".into(), scale, bytes_per_token: (3 * i) as f64 * 2.0 },
        Op::gemm("context_ffn2_gemm".into(), scale, h, i, dtype, false),
    ]
    .into_iter()
    .map(|op| tp_share(op, l.tp))
    .collect()
}
