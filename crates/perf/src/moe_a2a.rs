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
//! and the MLA / DSA families' DeepEP block on SGLang (`wideep_mla.rs`, `deepep_block`): the
//! whole shared expert, dispatch, SGLang's wide-EP expert compute (`wideep_*_moe_perf`), combine.
//!
//! The all-to-all table is keyed by `(comm_backend, phase, comm_dtype, ep_size, node_num,
//! hidden_size, topk, num_experts, sms)`, each key a `num_tokens → latency` curve (µs in the
//! file, first row of a coordinate wins, sources in resolution order). A query reads the exact
//! key's curve like a message-size curve (exact, linear inside, utilisation held against a SOL
//! proportional to the tokens outside); an EP wider than a node reads the node-wide EP curve
//! (`num_gpus_per_node`, one node; SGLang: EP8), as the reference substitutes it. SGLang's rows
//! come from its legacy DeepEP normal-mode table; DeepEP high-throughput off one node / 20 SMs
//! reads the `(sms, tokens)` grid and apportions the interpolated round trip.

use std::collections::BTreeMap;

use crate::db::Dtype;
use crate::db::{keep_row, no_rows, Database};
use crate::error::{PerfError, Result};
use crate::interp::{Curve, Grid, GridSpec, Node};
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
    /// The wide-EP MLA module's kernel rows on SGLang (`flashinfer` or `fa3`).
    pub mla_backend: String,
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

/// The expert compute of the large-EP block: the fused expert FFN's table at `moe_tp = 1`
/// (vLLM), or SGLang's wide-EP expert-compute table, tokens gathered over attention DP, with
/// the reference's EPLB prefill correction.
#[derive(Clone, Debug, PartialEq)]
pub struct ExpertComputeOp {
    pub moe: MoeOp,
    /// EPLB on a DeepEP backend in the context phase: tokens × 0.8 (truncated) after gathering.
    pub eplb_context: bool,
    /// SGLang: the wide-EP table's phase (`context` / `generation`) and expert slots
    /// (`wideep_num_slots`, else the expert count); `None`: vLLM's `moe_perf` at `moe_tp = 1`.
    pub wide: Option<(&'static str, u32)>,
}

/// `(quant, distribution, phase, topk, experts, hidden, inter, moe_tp, moe_ep)`.
type WideKey = (String, String, &'static str, u32, u32, u32, u32, u32, u32);

/// SGLang's wide-EP expert-compute curves (`wideep_context_moe_perf`,
/// `wideep_generation_moe_perf`, latency in ms): one token curve per key, first row of a
/// coordinate wins. The tables have no slot axis: they hold `num_slots = experts` only.
#[derive(Debug)]
pub struct WideEpMoeTable {
    curves: BTreeMap<WideKey, Grid>,
    /// Per quant, its distributions in the order their first rows were read.
    dist_order: BTreeMap<String, Vec<String>>,
    looked: Vec<String>,
}

const WIDE_MOE_FILES: [(&str, &str); 2] =
    [("context", "wideep_context_moe_perf.parquet"), ("generation", "wideep_generation_moe_perf.parquet")];
const TOKEN_SPEC: GridSpec = GridSpec::raw(&["num_tokens"]);

impl WideEpMoeTable {
    pub(crate) fn load(db: &Database) -> Result<WideEpMoeTable> {
        let mut nodes: BTreeMap<WideKey, Node> = BTreeMap::new();
        let mut dist_order: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut looked = Vec::new();
        for (phase, file) in WIDE_MOE_FILES {
            for src in crate::systems::sources(&db.spec, &db.backend, &db.version, file, db.shared_layer)? {
                looked.push(src.path.display().to_string());
                if !src.path.exists() {
                    continue;
                }
                let cols = [
                    "moe_dtype",
                    "distribution",
                    "topk",
                    "num_experts",
                    "hidden_size",
                    "inter_size",
                    "moe_tp_size",
                    "moe_ep_size",
                    "num_tokens",
                    "latency",
                    "kernel_source",
                ];
                let t = Table::read(&src.path, &cols)?;
                let p = src.path.display().to_string();
                let (q, d) = (t.text("moe_dtype")?, t.text("distribution")?);
                let (k, e, h, ep, n) = (
                    t.int("topk")?,
                    t.int("num_experts")?,
                    t.int("hidden_size")?,
                    t.int("moe_ep_size")?,
                    t.int("num_tokens")?,
                );
                let inter = if t.has("inter_size") { t.int("inter_size")? } else { vec![0; t.rows] };
                let mtp = if t.has("moe_tp_size") { t.int("moe_tp_size")? } else { vec![1; t.rows] };
                let lat = t.float("latency")?;
                let ks = t.text_or_none("kernel_source")?;
                for i in 0..t.rows {
                    if !keep_row(&src, &ks[i]) {
                        continue;
                    }
                    let (quant, dist) = (q[i].clone().unwrap_or_default(), d[i].clone().unwrap_or_default());
                    let order = dist_order.entry(quant.clone()).or_default();
                    if !order.contains(&dist) {
                        order.push(dist.clone());
                    }
                    let key = (
                        quant,
                        dist,
                        phase,
                        key_u32(&p, "topk", i, k[i])?,
                        key_u32(&p, "num_experts", i, e[i])?,
                        key_u32(&p, "hidden_size", i, h[i])?,
                        key_u32(&p, "inter_size", i, inter[i])?,
                        key_u32(&p, "moe_tp_size", i, mtp[i])?,
                        key_u32(&p, "moe_ep_size", i, ep[i])?,
                    );
                    nodes.entry(key).or_default().insert_first_wins(&[key_u32(&p, "num_tokens", i, n[i])?], lat[i]);
                }
            }
        }
        if nodes.is_empty() {
            return Err(PerfError::data(format!(
                "no wide-EP expert-compute (wideep_*_moe_perf) data for {}: looked in {}",
                db.which(),
                if looked.is_empty() { "no source file found".to_string() } else { looked.join(", ") }
            )));
        }
        Ok(WideEpMoeTable { curves: nodes.into_iter().map(|(k, n)| (k, Grid::new(n))).collect(), dist_order, looked })
    }

    fn carries(&self, quant: &str, dist: &str, phase: &str) -> bool {
        self.curves.keys().any(|k| k.0 == quant && k.1 == dist && k.2 == phase)
    }
}

/// The wide-EP expert latency (unscaled) at `tokens` gathered over attention DP, ms: the
/// requested routing skew's curve when the phase has one, else `uniform`'s, else the first
/// distribution collected for the phase; the shape is exact. Between measured token counts
/// the latency is linear; beyond them the nearest point's utilisation is held against the
/// expert roofline (sized by the slots).
fn wide_expert_latency(
    db: &Database,
    e: &ExpertComputeOp,
    phase: &'static str,
    slots: u32,
    tokens: u32,
) -> Result<f64> {
    let t = db.wide_moe_table()?;
    let m = &e.moe;
    let quant = m.dtype.name();
    let at = || format!("{} (looked in {})", db.which(), t.looked.join(", "));
    let order = t.dist_order.get(quant).ok_or_else(|| {
        PerfError::data(format!("no wide-EP expert-compute data for kernel deepep_moe, quant {quant} on {}", at()))
    })?;
    let dist = if t.carries(quant, &m.distribution, phase) {
        m.distribution.as_str()
    } else if t.carries(quant, "uniform", phase) {
        "uniform"
    } else {
        order.iter().find(|d| t.carries(quant, d, phase)).map(String::as_str).ok_or_else(|| {
            PerfError::data(format!(
                "no wide-EP expert-compute distribution carries {phase} data for deepep_moe / {quant} on {}",
                at()
            ))
        })?
    };
    let key = (quant.to_string(), dist.to_string(), phase, m.topk, m.experts, m.hidden, m.inter, 1, m.moe_ep);
    let grid = (slots == m.experts).then(|| t.curves.get(&key)).flatten().ok_or_else(|| {
        PerfError::data(format!(
            "no wide-EP expert-compute data for deepep_moe / {quant} / {dist} / {phase} (topk {}, experts {}, \
             slots {slots}, hidden {}, inter {}, moe_tp 1, moe_ep {}) on {}",
            m.topk,
            m.experts,
            m.hidden,
            m.inter,
            m.moe_ep,
            at()
        ))
    })?;
    let leaves = grid.node.leaves();
    if let [(only, _)] = leaves.as_slice() {
        if tokens < only[0] {
            return Err(PerfError::data(format!(
                "wide-EP expert compute: one measured token count ({}) cannot anchor {tokens} tokens on {}",
                only[0],
                at()
            )));
        }
    }
    let bf16 = Dtype::Bfloat16.flops(&db.spec)?;
    let compute = match m.dtype {
        Dtype::Bfloat16 => 1.0,
        Dtype::Nvfp4 => 4.0,
        _ => 2.0,
    };
    let sol = |c: &[f64]| wide_expert_sol(db, m, slots, c[0].round() as u64, bf16 * compute);
    grid.query(&TOKEN_SPEC, &sol, &[tokens as f64])
}

/// The wide-EP expert roofline (the reference's integer arithmetic, weights sized by the
/// slots), ms.
fn wide_expert_sol(db: &Database, m: &MoeOp, slots: u32, tokens: u64, flops: f64) -> f64 {
    let total = tokens * m.topk as u64;
    let ep = (m.moe_ep as u64).max(1);
    let (h, inter, g) = (m.hidden as u64, m.inter as u64, if m.gated { 3 } else { 2 });
    let ops = total * h * inter * g * 2 / ep;
    let mem = total / ep * h * 2 + total / ep * inter * g + h * inter * g * (slots as u64 / ep).min(total / ep);
    let math_ms = ops as f64 / flops * 1000.0;
    let mem_ms = mem as f64 * m.dtype.bytes() / db.spec.mem_bw * 1000.0;
    math_ms.max(mem_ms)
}

type A2aKey = (String, String, String, u32, u32, u32, u32, u32, u32);

/// `moe_a2a_perf` curves by key.
#[derive(Debug, Default)]
pub struct A2aTable {
    curves: BTreeMap<A2aKey, Curve>,
    /// DeepEP high-throughput shapes (the key without its SM budget): the `(sms, tokens)` grid,
    /// and for dispatch the grid of dispatch + combine where both phases were measured.
    ht_grids: BTreeMap<ShapeKey, (Grid, Option<Grid>)>,
}

/// An all-to-all key without its SM budget.
type ShapeKey = (String, String, String, u32, u32, u32, u32, u32);

fn shape_of(k: &A2aKey) -> ShapeKey {
    (k.0.clone(), k.1.clone(), k.2.clone(), k.3, k.4, k.5, k.6, k.7)
}

/// The `(sms, tokens)` grid of the curves `by_sms`, or of the sums of two phases' curves at the
/// coordinates both hold.
fn sms_grid<'c>(by_sms: impl Iterator<Item = (u32, &'c BTreeMap<u64, f64>)>) -> Grid {
    let mut node = Node::new();
    for (sms, curve) in by_sms {
        for (&tokens, &lat) in curve {
            node.insert_first_wins(&[sms, tokens as u32], lat);
        }
    }
    Grid::new(node)
}

impl A2aTable {
    pub(crate) fn load(db: &Database) -> Result<A2aTable> {
        let srcs = db.a2a_sources()?;
        let mut points: BTreeMap<A2aKey, BTreeMap<u64, f64>> = BTreeMap::new();
        // SGLang's DeepEP rows live in its legacy normal-mode table, read first (the reference's
        // adapters load before the unified table within a version).
        let legacy = if db.backend == "sglang" {
            crate::systems::sources(&db.spec, &db.backend, &db.version, LEGACY_NORMAL, db.shared_layer)?
        } else {
            Vec::new()
        };
        load_legacy_normal(&legacy, &mut points)?;
        let mut srcs = srcs;
        srcs.extend(legacy);
        let srcs = srcs.as_slice();
        for src in srcs.iter().filter(|s| !s.path.ends_with(LEGACY_NORMAL)) {
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
        let mut shapes: BTreeMap<ShapeKey, BTreeMap<u32, &BTreeMap<u64, f64>>> = BTreeMap::new();
        for (k, curve) in points.iter().filter(|(k, _)| k.0 == "deepep_ht") {
            shapes.entry(shape_of(k)).or_default().insert(k.8, curve);
        }
        let ht_grids = shapes
            .iter()
            .map(|(shape, by_sms)| {
                let combined = (shape.1 == "dispatch").then(|| {
                    let combine = shapes.get(&(
                        shape.0.clone(),
                        "combine".into(),
                        shape.2.clone(),
                        shape.3,
                        shape.4,
                        shape.5,
                        shape.6,
                        shape.7,
                    ))?;
                    let sums: Vec<(u32, BTreeMap<u64, f64>)> = by_sms
                        .iter()
                        .filter_map(|(sms, d)| {
                            let c = combine.get(sms)?;
                            Some((*sms, d.iter().filter_map(|(t, v)| Some((*t, v + c.get(t)?))).collect()))
                        })
                        .collect();
                    let any = sums.iter().any(|(_, c)| !c.is_empty());
                    any.then(|| sms_grid(sums.iter().map(|(sms, c)| (*sms, c))))
                });
                (shape.clone(), (sms_grid(by_sms.iter().map(|(s, c)| (*s, *c))), combined.flatten()))
            })
            .collect();
        Ok(A2aTable {
            curves: points.into_iter().map(|(k, m)| (k, Curve { points: m.into_iter().collect() })).collect(),
            ht_grids,
        })
    }

    /// The dtype and SM-budget curves of `op`'s shape at `(ep, node_num)`: the first of its
    /// admissible dtypes that has the shape.
    fn shape(&self, op: &A2aOp, ep: u32, node_num: u32) -> Option<(String, Vec<(u32, &Curve)>)> {
        self.dtypes(op).into_iter().find_map(|dt| {
            let k = |sms| {
                (
                    op.backend.clone(),
                    op.phase.to_string(),
                    dt.clone(),
                    ep,
                    node_num,
                    op.hidden,
                    op.topk,
                    op.experts,
                    sms,
                )
            };
            let by_sms: Vec<(u32, &Curve)> = self.curves.range(k(0)..=k(u32::MAX)).map(|(k, c)| (k.8, c)).collect();
            (!by_sms.is_empty()).then_some((dt, by_sms))
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

/// SGLang's legacy DeepEP normal-mode (high-throughput) table.
const LEGACY_NORMAL: &str = "wideep_deepep_normal_perf.parquet";

/// The legacy DeepEP normal-mode rows as `deepep_ht` curves: each row a dispatch point
/// (transmit + notify) and a combine point (likewise), µs → ms, both at the row's dispatch SM
/// budget, dtype `default` and `ep = 8 × nodes` (the tables were collected on 8-GPU nodes and
/// carry no EP axis); first row of a coordinate wins.
fn load_legacy_normal(
    srcs: &[crate::systems::Source],
    points: &mut BTreeMap<A2aKey, BTreeMap<u64, f64>>,
) -> Result<()> {
    for src in srcs {
        if !src.path.exists() {
            continue;
        }
        let t = Table::read(
            &src.path,
            &[
                "node_num",
                "hidden_size",
                "num_token",
                "num_topk",
                "num_experts",
                "dispatch_sms",
                "dispatch_transmit_us",
                "dispatch_notify_us",
                "combine_transmit_us",
                "combine_notify_us",
                "kernel_source",
            ],
        )?;
        let p = src.path.display().to_string();
        let (nn, h, n, k, e, sms) = (
            t.int("node_num")?,
            t.int("hidden_size")?,
            t.int("num_token")?,
            t.int("num_topk")?,
            t.int("num_experts")?,
            t.int("dispatch_sms")?,
        );
        let us = |c: &str| -> Result<Vec<f64>> {
            if t.has(c) {
                t.float(c)
            } else {
                Ok(vec![0.0; t.rows])
            }
        };
        let (dt, dn, ct, cn) = (
            us("dispatch_transmit_us")?,
            us("dispatch_notify_us")?,
            us("combine_transmit_us")?,
            us("combine_notify_us")?,
        );
        let ks = t.text_or_none("kernel_source")?;
        for i in 0..t.rows {
            if !keep_row(src, &ks[i]) {
                continue;
            }
            let nodes = key_u32(&p, "node_num", i, nn[i])?;
            let tokens = key_u32(&p, "num_token", i, n[i])? as u64;
            for (phase, latency_us) in [("dispatch", dt[i] + dn[i]), ("combine", ct[i] + cn[i])] {
                let key = (
                    "deepep_ht".to_string(),
                    phase.to_string(),
                    "default".to_string(),
                    nodes.saturating_mul(8),
                    nodes,
                    key_u32(&p, "hidden_size", i, h[i])?,
                    key_u32(&p, "num_topk", i, k[i])?,
                    key_u32(&p, "num_experts", i, e[i])?,
                    key_u32(&p, "dispatch_sms", i, sms[i])?,
                );
                points.entry(key).or_default().entry(tokens).or_insert(latency_us / 1000.0);
            }
        }
    }
    Ok(())
}

/// One all-to-all phase for `x` tokens of one attention-DP rank, scaled, ms.
pub fn eval_a2a(db: &Database, op: &A2aOp, x: u32) -> Result<f64> {
    let table = db.a2a_table()?;
    let tokens = x / op.attention_tp.max(1);
    let exact = table.shape(op, op.moe_ep, op.node_num);
    // Beyond one node the reference reads the node-wide EP curves when the exact scale is missing.
    let (shape, ep, nodes) = match exact {
        Some(c) => (Some(c), op.moe_ep, op.node_num),
        None if op.node_num > 1 => {
            // SGLang's legacy rows stand at their normalised EP8 coordinate, the others at the
            // system's node width.
            let ep = if db.backend == "sglang" { 8 } else { db.spec.gpus_per_node };
            (table.shape(op, ep, 1), ep, 1)
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
    let (dtype, by_sms) = shape.ok_or_else(|| PerfError::data(format!("no {}", what())))?;
    let ht = op.backend == "deepep_ht";
    // An exact SM budget reads its token curve, except DeepEP high-throughput off one node / 20
    // SMs, which the reference always reads from the (sms, tokens) grid.
    if let Some((_, curve)) = by_sms.iter().find(|(sms, _)| *sms == op.sms) {
        if !ht || (nodes == 1 && op.sms == DEEPEP_HT_SMS) {
            return Ok(curve.query(tokens as f64, &what())?.max(0.0) * op.scale);
        }
    }
    if !ht {
        return Err(PerfError::unsupported(format!(
            "{}: an SM budget between the measured ones is modelled for DeepEP high-throughput only",
            what()
        )));
    }
    let key =
        |phase: &str| (op.backend.clone(), phase.to_string(), dtype.clone(), ep, nodes, op.hidden, op.topk, op.experts);
    let (grid, _) = &table.ht_grids[&key(op.phase)];
    let q = [op.sms as f64, tokens as f64];
    let sol = |c: &[f64]| c[1];
    let latency = grid.query(&SMS_SPEC, &sol, &q).map_err(|e| e.context(what()))?;
    // The dispatch + combine round trip is interpolated whole and apportioned between the two
    // phases by their own shares.
    let other = if op.phase == "dispatch" { "combine" } else { "dispatch" };
    let combined = table.ht_grids.get(&key("dispatch")).and_then(|(_, c)| c.as_ref());
    let (Some((other_grid, _)), Some(combined)) = (table.ht_grids.get(&key(other)), combined) else {
        return Ok(latency.max(0.0) * op.scale);
    };
    let other_latency = other_grid.query(&SMS_SPEC, &sol, &q).map_err(|e| e.context(what()))?;
    let round_trip = combined.query(&SMS_SPEC, &sol, &q).map_err(|e| e.context(what()))?;
    let sum = latency + other_latency;
    let v = if sum > 0.0 { latency * round_trip / sum } else { latency };
    Ok(v.max(0.0) * op.scale)
}

const SMS_SPEC: GridSpec = GridSpec::raw(&["sms", "num_tokens"]);

/// The expert compute for `x` tokens of one attention-DP rank, scaled, ms.
pub fn eval_expert_compute(db: &Database, e: &ExpertComputeOp, x: u32) -> Result<f64> {
    let mut tokens = x.saturating_mul(e.moe.attention_dp.max(1));
    if e.eplb_context {
        tokens = (tokens as f64 * 0.8) as u32;
    }
    let latency = match e.wide {
        Some((phase, slots)) => wide_expert_latency(db, e, phase, slots, tokens)?,
        None => crate::moe::moe_latency_at(db, &e.moe, tokens)?,
    };
    Ok(latency.max(0.0) * e.moe.scale)
}

/// The routing skew DeepEP prefill runs at under EPLB (`power_law` with α = 0.6).
pub const EPLB_CONTEXT_DISTRIBUTION: &str = "power_law_0.6";

/// One all-to-all phase (`dispatch` / `combine`) of a context large-EP block.
fn a2a_op(phase: &str, p: &'static str, m: &ModelSpec, l: &Layout, scale: f64) -> Op {
    let c = &l.moe_comm;
    let backend = c.context.clone().unwrap_or_default();
    let deepep = backend.starts_with("deepep");
    Op::MoeA2a(A2aOp {
        name: format!("{phase}_moe_{p}"),
        scale,
        phase: p,
        comm_dtype: if deepep { "default".into() } else { l.moe.name().into() },
        hidden: m.hidden,
        topk: m.topk,
        experts: m.experts,
        moe_ep: l.moe_ep,
        node_num: c.node_num,
        sms: if backend == "deepep_ht" { DEEPEP_HT_SMS } else { 0 },
        attention_tp: if deepep { l.tp * l.cp } else { 1 },
        backend,
    })
}

/// The context large-EP expert compute at routing skew `distribution` (`wide`: SGLang's table).
fn expert_op(phase: &str, m: &ModelSpec, l: &Layout, scale: f64, distribution: &str, wide: bool) -> Op {
    let c = &l.moe_comm;
    let deepep = c.context.as_deref().is_some_and(|b| b.starts_with("deepep"));
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
        wide: wide.then(|| ("context", c.num_slots.unwrap_or(m.experts))),
    })
}

/// The context phase's large-EP MoE block of the plain MoE family: router GEMM, all-to-all
/// dispatch, expert compute, all-to-all combine (`scale`: layers).
pub(crate) fn large_ep_block(phase: &str, m: &ModelSpec, l: &Layout, scale: f64) -> Vec<Op> {
    let c = &l.moe_comm;
    let deepep = c.context.as_deref().is_some_and(|b| b.starts_with("deepep"));
    let distribution = if c.eplb && deepep { EPLB_CONTEXT_DISTRIBUTION } else { DISTRIBUTION };
    vec![
        Op::gemm(format!("{phase}_router_gemm"), scale, m.experts, m.hidden, Dtype::Bfloat16, false),
        a2a_op(phase, "dispatch", m, l, scale),
        expert_op(phase, m, l, scale, distribution, false),
        a2a_op(phase, "combine", m, l, scale),
    ]
}

/// The context phase's DeepEP block of an MLA / DSA model on SGLang (`wideep_mla.rs`): the
/// whole shared expert in `shared` format, then dispatch, the wide-EP expert compute (routing
/// skew `power_law_1.01`, under EPLB `power_law_0.6`) and combine; no router GEMM.
pub(crate) fn deepep_block(m: &ModelSpec, l: &Layout, scale: f64, shared: Dtype) -> Vec<Op> {
    let distribution = if l.moe_comm.eplb { EPLB_CONTEXT_DISTRIBUTION } else { crate::moe_ops::MLA_DISTRIBUTION };
    let mut out = crate::wideep_mla::shared_expert(m, l, scale, shared);
    out.extend([
        a2a_op("context", "dispatch", m, l, scale),
        expert_op("context", m, l, scale, distribution, true),
        a2a_op("context", "combine", m, l, scale),
    ]);
    out
}
