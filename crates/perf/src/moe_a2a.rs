//! Large expert parallelism (the reference's large-EP MoE graph): all-to-all dispatch and
//! combine (`moe_a2a_perf`) around the expert compute, in place of the fused block's
//! all-reduce / NCCL dispatch. The reference builds it when its `ModelConfig.moe_comm_backend`
//! names a per-phase all-to-all backend; servesim takes the same map as the timing-config key
//! `moe_comm_backend` (see `AisConfig`).
//!
//! Modelled: the plain MoE family (`MOEModel`: Qwen3-MoE, Mixtral, gpt-oss, MiniMax-M2) on
//! vLLM with DeepEP high-throughput (`deepep_ht`) in the context phase:
//!
//! ```text
//! router_gemm        (as the fused block)
//! moe_dispatch       (moe_a2a: deepep_ht / dispatch, tokens ÷ attention tp)
//! moe                (expert compute: moe_perf at moe_tp 1, tokens × attention dp;
//!                     under EPLB ×0.8 and routing skew power_law_0.6)
//! moe_combine        (moe_a2a: deepep_ht / combine)
//! ```
//!
//! The all-to-all table is keyed by `(comm_backend, phase, comm_dtype, ep_size, node_num,
//! hidden_size, topk, num_experts, sms)`, each key a `num_tokens → latency` curve (µs in the
//! file, first row of a coordinate wins, sources in resolution order). A query reads the exact
//! key's curve like a message-size curve (exact, linear inside, utilisation held against a SOL
//! proportional to the tokens outside); an EP wider than a node reads the node-wide EP curve
//! (`num_gpus_per_node`, one node), as the reference substitutes it for vLLM.

use std::collections::BTreeMap;

use crate::db::Dtype;
use crate::db::{keep_row, no_rows, Database};
use crate::error::{PerfError, Result};
use crate::interp::Curve;
use crate::model::{Layout, ModelSpec, Op};
use crate::moe_ops::{MoeOp, DISTRIBUTION};
use crate::parquet_table::{key_u32, Table};

/// The DeepEP high-throughput SM budget the reference's `ModelConfig.sms` defaults to; its
/// curves are read one-dimensionally only at this budget.
pub const DEEPEP_HT_SMS: u32 = 20;

/// The reference's all-to-all backends (`MOE_A2A_BACKENDS`), for naming what is refused.
pub const BACKENDS: [&str; 8] = [
    "deepep_ht",
    "deepep_ll",
    "deepep_v2_context",
    "deepep_v2_generation",
    "trtllm_deepep_ht",
    "trtllm_deepep_ll",
    "nvlink_two_sided",
    "nvlink_one_sided",
];

/// The per-phase all-to-all backends of a large-EP graph and its expert-balancing knobs, as
/// read from the timing config (validated there).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MoeComm {
    /// The context phase's backend (only `deepep_ht` is modelled); `None`: the fused block.
    pub context: Option<String>,
    /// Expert-parallel load balancing (`enable_eplb`).
    pub eplb: bool,
    /// EPLB expert slots (`wideep_num_slots`); the vLLM expert compute reads `moe_perf`, which
    /// has no slot axis, so it changes no time there (as in the reference).
    pub num_slots: Option<u32>,
    /// Nodes the expert-parallel group spans (`⌈moe_ep × moe_tp / num_gpus_per_node⌉`).
    pub node_num: u32,
    /// SGLang's MoE runner (`moe_backend`; `None`: its default), validated by `eplb.rs`.
    pub backend: Option<crate::eplb::MoeBackend>,
}

impl MoeComm {
    pub fn is_large_ep(&self) -> bool {
        self.context.is_some()
    }
}

/// One all-to-all phase (dispatch or combine) of the large-EP block.
#[derive(Clone, Debug, PartialEq)]
pub struct A2aOp {
    pub name: String,
    pub scale: f64,
    /// `dispatch` or `combine`.
    pub phase: &'static str,
    pub backend: String,
    pub comm_dtype: String,
    pub hidden: u32,
    pub topk: u32,
    pub experts: u32,
    pub moe_ep: u32,
    pub node_num: u32,
    pub sms: u32,
    /// The attention tensor-parallel width that shards the token stream ahead of the
    /// all-to-all (context DeepEP: `tp × cp`; otherwise 1).
    pub attention_tp: u32,
}

/// The expert compute of the large-EP block: the fused expert FFN's table at `moe_tp = 1`,
/// tokens gathered over attention DP, with the reference's EPLB prefill correction.
#[derive(Clone, Debug, PartialEq)]
pub struct ExpertComputeOp {
    pub moe: MoeOp,
    /// EPLB on a DeepEP backend in the context phase: tokens × 0.8 (truncated) after gathering.
    pub eplb_context: bool,
}

type A2aKey = (String, String, String, u32, u32, u32, u32, u32, u32);

/// `moe_a2a_perf` curves by key.
#[derive(Debug, Default)]
pub struct A2aTable {
    curves: BTreeMap<A2aKey, Curve>,
}

impl A2aTable {
    pub(crate) fn load(db: &Database) -> Result<A2aTable> {
        let srcs = db.a2a_sources()?;
        let srcs = srcs.as_slice();
        let mut points: BTreeMap<A2aKey, BTreeMap<u64, f64>> = BTreeMap::new();
        for src in srcs {
            if !src.path.exists() {
                continue;
            }
            let t = Table::read(
                &src.path,
                &[
                    "comm_backend",
                    "phase",
                    "comm_dtype",
                    "ep_size",
                    "node_num",
                    "hidden_size",
                    "topk",
                    "num_experts",
                    "num_tokens",
                    "latency",
                    "sms",
                    "kernel_source",
                ],
            )?;
            let p = src.path.display().to_string();
            let (be, ph, dt) = (t.text("comm_backend")?, t.text("phase")?, t.text("comm_dtype")?);
            let (ep, nn, h, k, e, n) = (
                t.int("ep_size")?,
                t.int("node_num")?,
                t.int("hidden_size")?,
                t.int("topk")?,
                t.int("num_experts")?,
                t.int("num_tokens")?,
            );
            let lat = t.float("latency")?;
            let sms = t.int_or_none("sms")?;
            let ks = t.text_or_none("kernel_source")?;
            for i in 0..t.rows {
                if !keep_row(src, &ks[i]) {
                    continue;
                }
                let backend = be[i].clone().unwrap_or_default();
                // DeepEP low-latency rows have no SM axis; others floor a non-negative budget.
                let sm =
                    if backend == "deepep_ll" { 0 } else { sms[i].map_or(0, |x| x.clamp(0, u32::MAX as i64) as u32) };
                let key = (
                    backend,
                    ph[i].clone().unwrap_or_default(),
                    dt[i].clone().unwrap_or_default(),
                    key_u32(&p, "ep_size", i, ep[i])?,
                    key_u32(&p, "node_num", i, nn[i])?,
                    key_u32(&p, "hidden_size", i, h[i])?,
                    key_u32(&p, "topk", i, k[i])?,
                    key_u32(&p, "num_experts", i, e[i])?,
                    sm,
                );
                let tokens = key_u32(&p, "num_tokens", i, n[i])? as u64;
                points.entry(key).or_default().entry(tokens).or_insert(lat[i] / 1000.0);
            }
        }
        if points.is_empty() {
            return Err(no_rows("MoE all-to-all (moe_a2a)", srcs, &db.spec, &db.backend, &db.version));
        }
        Ok(A2aTable {
            curves: points.into_iter().map(|(k, m)| (k, Curve { points: m.into_iter().collect() })).collect(),
        })
    }

    fn curve(&self, op: &A2aOp, ep: u32, node_num: u32) -> Option<&Curve> {
        let dtypes = self.dtypes(op);
        dtypes.into_iter().find_map(|dt| {
            self.curves.get(&(
                op.backend.clone(),
                op.phase.to_string(),
                dt,
                ep,
                node_num,
                op.hidden,
                op.topk,
                op.experts,
                op.sms,
            ))
        })
    }

    /// The comm dtypes a request may read, in the reference's order: the exact one, `fp8` for
    /// `fp8_block`, and `default` when it is the phase's only collected dtype.
    fn dtypes(&self, op: &A2aOp) -> Vec<String> {
        let collected: std::collections::BTreeSet<&str> =
            self.curves.keys().filter(|k| k.0 == op.backend && k.1 == op.phase).map(|k| k.2.as_str()).collect();
        let mut out: Vec<String> = Vec::new();
        let mut push = |d: &str| {
            if collected.contains(d) && !out.iter().any(|x| x == d) {
                out.push(d.to_string());
            }
        };
        push(&op.comm_dtype);
        if op.comm_dtype == "fp8_block" {
            push("fp8");
        }
        if collected.len() == 1 && collected.contains("default") {
            push("default");
        }
        out
    }
}

/// One all-to-all phase for `x` tokens of one attention-DP rank, scaled, ms.
pub fn eval_a2a(db: &Database, op: &A2aOp, x: u32) -> Result<f64> {
    let table = db.a2a_table()?;
    let tokens = x / op.attention_tp.max(1);
    let exact = table.curve(op, op.moe_ep, op.node_num);
    // Beyond one node the reference reads the node-wide EP curve when the exact scale is missing.
    let (curve, ep, nodes) = match exact {
        Some(c) => (Some(c), op.moe_ep, op.node_num),
        None if op.node_num > 1 => {
            let ep = db.spec.gpus_per_node;
            (table.curve(op, ep, 1), ep, 1)
        }
        None => (None, op.moe_ep, op.node_num),
    };
    let what = || {
        format!(
            "moe_a2a {}/{} (dtype {}, ep {ep}, nodes {nodes}, hidden {}, topk {}, experts {}, sms {}) on {}",
            op.backend,
            op.phase,
            op.comm_dtype,
            op.hidden,
            op.topk,
            op.experts,
            op.sms,
            db.which()
        )
    };
    let curve = curve.ok_or_else(|| PerfError::data(format!("no {}", what())))?;
    if op.backend == "deepep_ht" && !(nodes == 1 && op.sms == DEEPEP_HT_SMS) {
        // The reference then interpolates an (sms, tokens) grid and apportions the dispatch +
        // combine round trip between the phases; not modelled.
        return Err(PerfError::unsupported(format!(
            "{}: DeepEP high-throughput curves are modelled at one node and {DEEPEP_HT_SMS} SMs only",
            what()
        )));
    }
    Ok(curve.query(tokens as f64, &what())?.max(0.0) * op.scale)
}

/// The expert compute for `x` tokens of one attention-DP rank, scaled, ms.
pub fn eval_expert_compute(db: &Database, e: &ExpertComputeOp, x: u32) -> Result<f64> {
    let mut tokens = x.saturating_mul(e.moe.attention_dp.max(1));
    if e.eplb_context {
        tokens = (tokens as f64 * 0.8) as u32;
    }
    Ok(crate::moe::moe_latency_at(db, &e.moe, tokens)?.max(0.0) * e.moe.scale)
}

/// The routing skew DeepEP prefill runs at under EPLB (`power_law` with α = 0.6).
pub const EPLB_CONTEXT_DISTRIBUTION: &str = "power_law_0.6";

/// The context phase's large-EP MoE block of the plain MoE family: router GEMM, all-to-all
/// dispatch, expert compute, all-to-all combine (`scale`: layers).
pub(crate) fn large_ep_block(phase: &str, m: &ModelSpec, l: &Layout, scale: f64) -> Vec<Op> {
    let c = &l.moe_comm;
    let backend = c.context.clone().unwrap_or_default();
    let deepep = backend.starts_with("deepep");
    let distribution = if c.eplb && deepep { EPLB_CONTEXT_DISTRIBUTION } else { DISTRIBUTION };
    let a2a = |p: &'static str| {
        Op::MoeA2a(A2aOp {
            name: format!("{phase}_moe_{p}"),
            scale,
            phase: p,
            backend: backend.clone(),
            comm_dtype: if deepep { "default".into() } else { l.moe.name().into() },
            hidden: m.hidden,
            topk: m.topk,
            experts: m.experts,
            moe_ep: l.moe_ep,
            node_num: c.node_num,
            sms: if backend == "deepep_ht" { DEEPEP_HT_SMS } else { 0 },
            attention_tp: if deepep { l.tp * l.cp } else { 1 },
        })
    };
    vec![
        Op::gemm(format!("{phase}_router_gemm"), scale, m.experts, m.hidden, Dtype::Bfloat16, false),
        a2a("dispatch"),
        Op::ExpertCompute(ExpertComputeOp {
            moe: MoeOp {
                name: format!("{phase}_moe"),
                scale,
                hidden: m.hidden,
                inter: m.moe_inter,
                topk: m.topk,
                experts: m.experts,
                moe_tp: 1,
                moe_ep: l.moe_ep,
                attention_dp: l.attention_dp,
                dtype: l.moe,
                distribution: distribution.to_string(),
                gated: true,
            },
            eplb_context: c.eplb && deepep,
        }),
        a2a("combine"),
    ]
}
