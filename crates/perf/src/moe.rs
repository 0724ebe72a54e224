//! Mixture-of-experts ops: the fused expert FFN (`moe_perf` table), the router GEMM, and the
//! dispatch / combine communication around it, as the reference's `MOEModel` lays them out for
//! the fused (small-EP) path:
//!
//! ```text
//! router_gemm (bf16, n = experts, k = hidden)
//! moe_pre_dispatch   (custom all-reduce / NCCL, by backend and attention DP)
//! moe                (moe_perf: tokens × attention_dp along one measured token curve)
//! moe_post_dispatch
//! ```
//!
//! The `moe_perf` table is keyed by `(moe_dtype, distribution, topk, num_experts, hidden_size,
//! inter_size, moe_tp_size, moe_ep_size)`, each key owning a `num_tokens → latency` curve. A
//! query needs that exact key (a missing distribution falls back to `uniform`, as the reference
//! does); along the curve it is exact, linear inside, and past either end holds the boundary
//! point's utilisation against the MoE roofline (`k_tail = 1`). A curve with one point cannot
//! answer below it. The large-EP block (all-to-all dispatch / combine) is `moe_a2a.rs`'s.

use std::collections::BTreeMap;

use crate::db::{keep_row, no_rows, ByQuant, Database, Dtype, MoeTable};
use crate::error::{PerfError, Result};
pub use crate::moe_ops::{DispatchOp, MoeOp, DISTRIBUTION};
use crate::parquet_table::{key_u32, Table};

/// Kernel lanes the reference files under their own quant name (one `moe_dtype` logged for two
/// different kernels).
fn quant_rewrite(quant: &str, kernel_source: &str) -> String {
    match (quant, kernel_source) {
        ("w4a8_mxfp4_mxfp8", "sglang_mxfp4_flashinfer_trtllm_moe") => "w4a8_mxfp4_mxfp8_trtllm".into(),
        ("w4a16_mxfp4", "sglang_flashinfer_cutlass_moe") => "w4a16_mxfp4_cutlass".into(),
        ("w4a16_mxfp4", "sglang_mxfp4_humming_moe") => "w4a16_mxfp4_humming".into(),
        _ => quant.to_string(),
    }
}

/// The TRT-LLM low-latency NVFP4 kernel, kept in its own table by the reference.
const LOW_LATENCY_LANE: &str = "moe_torch_flow_min_latency";

/// The largest token count the low-latency NVFP4 kernel serves.
const LOW_LATENCY_MAX_TOKENS: u32 = 128;

/// Token-keyed points as sorted curves.
fn sorted_curves(points: ByQuant<BTreeMap<u32, f64>>) -> ByQuant<Vec<(u32, f64)>> {
    points
        .into_iter()
        .map(|(q, by_dist)| {
            let by_dist = by_dist
                .into_iter()
                .map(|(d, by_shape)| (d, by_shape.into_iter().map(|(s, c)| (s, c.into_iter().collect())).collect()))
                .collect();
            (q, by_dist)
        })
        .collect()
}

impl MoeTable {
    fn load(db: &Database) -> Result<MoeTable> {
        let srcs = db.moe_sources();
        let mut points: ByQuant<BTreeMap<u32, f64>> = BTreeMap::new();
        let mut low_points: ByQuant<BTreeMap<u32, f64>> = BTreeMap::new();
        let mut looked = Vec::new();
        let mut quant_order: Vec<String> = Vec::new();
        for src in srcs {
            looked.push(src.path.display().to_string());
            if !src.path.exists() {
                continue;
            }
            let t = Table::read(
                &src.path,
                &[
                    "moe_dtype",
                    "num_tokens",
                    "hidden_size",
                    "inter_size",
                    "topk",
                    "num_experts",
                    "moe_tp_size",
                    "moe_ep_size",
                    "distribution",
                    "latency",
                    "kernel_source",
                    "default_eligible",
                ],
            )?;
            let (dt, tok, hid, inter, topk, ne, mtp, mep, dist, lat) = (
                t.text("moe_dtype")?,
                t.int("num_tokens")?,
                t.int("hidden_size")?,
                t.int("inter_size")?,
                t.int("topk")?,
                t.int("num_experts")?,
                t.int("moe_tp_size")?,
                t.int("moe_ep_size")?,
                t.text("distribution")?,
                t.float("latency")?,
            );
            let ks = t.text_or_none("kernel_source")?;
            let eligible = t.bool_if_present("default_eligible")?;
            for i in 0..t.rows {
                if !keep_row(src, &ks[i]) {
                    continue;
                }
                let lane = ks[i].as_deref().unwrap_or("");
                if let Some(e) = &eligible {
                    if !e[i] && lane.trim().is_empty() {
                        return Err(PerfError::data(format!(
                            "{}: default_eligible=false in row {i} needs a kernel_source",
                            t.path
                        )));
                    }
                    if !e[i] {
                        continue;
                    }
                }
                let (Some(q), Some(d)) = (dt[i].as_deref(), dist[i].as_deref()) else {
                    return Err(PerfError::data(format!("{}: null moe_dtype or distribution in row {i}", t.path)));
                };
                let p = &t.path;
                let shape = (
                    key_u32(p, "topk", i, topk[i])?,
                    key_u32(p, "num_experts", i, ne[i])?,
                    key_u32(p, "hidden_size", i, hid[i])?,
                    key_u32(p, "inter_size", i, inter[i])?,
                    key_u32(p, "moe_tp_size", i, mtp[i])?,
                    key_u32(p, "moe_ep_size", i, mep[i])?,
                );
                let quant = quant_rewrite(q, lane);
                if lane != LOW_LATENCY_LANE && !quant_order.contains(&quant) {
                    quant_order.push(quant.clone());
                }
                let target = if lane == LOW_LATENCY_LANE { &mut low_points } else { &mut points };
                target
                    .entry(quant)
                    .or_default()
                    .entry(d.to_string())
                    .or_default()
                    .entry(shape)
                    .or_default()
                    .entry(key_u32(p, "num_tokens", i, tok[i])?)
                    .or_insert(lat[i]);
            }
        }
        if points.is_empty() && low_points.is_empty() {
            return Err(no_rows("MoE", srcs, &db.spec, &db.backend, &db.version));
        }
        Ok(MoeTable { grids: sorted_curves(points), low_latency: sorted_curves(low_points), looked, quant_order })
    }

    /// The low-latency kernel's token curve of one MoE shape (after the `uniform` distribution
    /// fallback), when TRT-LLM collected this shape with it.
    pub(crate) fn low_latency_curve(&self, op: &MoeOp) -> Option<&[(u32, f64)]> {
        let by_dist = self.low_latency.get(op.dtype.name())?;
        let by_shape = by_dist.get(&op.distribution).or_else(|| by_dist.get("uniform"))?;
        let shape = (op.topk, op.experts, op.hidden, op.inter, op.moe_tp, op.moe_ep);
        by_shape.get(&shape).map(Vec::as_slice).filter(|c| !c.is_empty())
    }

    /// The measured token curve of one MoE shape (after the `uniform` distribution fallback).
    fn curve(&self, db: &Database, op: &MoeOp) -> Result<&[(u32, f64)]> {
        let q = op.dtype.name();
        let where_ =
            || format!("{} / {} {} (looked in {})", db.spec.name, db.backend, db.version, self.looked.join(", "));
        let by_dist = self.grids.get(q).ok_or_else(|| {
            PerfError::data(format!(
                "no {q} MoE data on {} (have: {})",
                where_(),
                self.grids.keys().cloned().collect::<Vec<_>>().join(", ")
            ))
        })?;
        let (dist, by_shape) = match by_dist.get(&op.distribution) {
            Some(s) => (op.distribution.as_str(), s),
            None => (
                "uniform",
                by_dist.get("uniform").ok_or_else(|| {
                    PerfError::data(format!(
                        "no {q} MoE data with distribution {} or uniform on {} (have: {})",
                        op.distribution,
                        where_(),
                        by_dist.keys().cloned().collect::<Vec<_>>().join(", ")
                    ))
                })?,
            ),
        };
        let shape = (op.topk, op.experts, op.hidden, op.inter, op.moe_tp, op.moe_ep);
        match by_shape.get(&shape) {
            Some(c) if !c.is_empty() => Ok(c),
            _ => {
                let layouts: Vec<String> = by_shape
                    .keys()
                    .filter(|k| (k.0, k.1, k.2, k.3) == (op.topk, op.experts, op.hidden, op.inter))
                    .map(|k| format!("{}×{}", k.4, k.5))
                    .collect();
                Err(PerfError::data(format!(
                    "no {q} MoE data for topk={} experts={} hidden={} inter={} at moe_tp={} × moe_ep={} ({dist}) on {}; {}",
                    op.topk,
                    op.experts,
                    op.hidden,
                    op.inter,
                    op.moe_tp,
                    op.moe_ep,
                    where_(),
                    if layouts.is_empty() {
                        "this expert shape is not collected at all".to_string()
                    } else {
                        format!("collected moe_tp × moe_ep for this shape: {}", layouts.join(", "))
                    }
                )))
            }
        }
    }
}

impl Database {
    /// The MoE table, read on first use.
    pub fn moe_table(&self) -> Result<&MoeTable> {
        self.moe.get_or_init(|| MoeTable::load(self)).as_ref().map_err(Clone::clone)
    }
}

/// Latency of one MoE layer (unscaled) for `x` tokens of one attention-DP rank, ms.
pub fn moe_latency(db: &Database, m: &MoeOp, x: u32) -> Result<f64> {
    moe_latency_at(db, m, x.saturating_mul(m.attention_dp.max(1)))
}

/// Unscaled expert latency at `tokens` already gathered over attention DP, ms.
pub fn moe_latency_at(db: &Database, m: &MoeOp, tokens: u32) -> Result<f64> {
    let flops = m.dtype.flops(&db.spec)?;
    if db.mode.is_sol() {
        return Ok(m.sol_ms(db, tokens, flops));
    }
    crate::empirical_moe::moe_latency(db, m, tokens, || moe_table_latency(db, m, tokens, flops))
}

/// The measured expert latency at `tokens` (the tables, whatever the mode), ms.
fn moe_table_latency(db: &Database, m: &MoeOp, tokens: u32, flops: f64) -> Result<f64> {
    let table = db.moe_table()?;
    // Small gated NVFP4 batches run TRT-LLM's low-latency kernel where it was measured.
    let low_latency = (tokens <= LOW_LATENCY_MAX_TOKENS && m.dtype == Dtype::Nvfp4 && m.gated)
        .then(|| table.low_latency_curve(m))
        .flatten();
    let curve = match low_latency {
        Some(c) => c,
        None => table.curve(db, m)?,
    };
    let sol = |t: u32| m.sol_ms(db, t, flops);
    let i = curve.partition_point(|(k, _)| *k < tokens);
    if i < curve.len() && curve[i].0 == tokens {
        return Ok(curve[i].1);
    }
    if curve.len() == 1 && tokens < curve[0].0 {
        return Err(PerfError::no_anchor(format!(
            "MoE {}: only one measured token count ({}) for this shape; cannot answer {tokens} tokens below it",
            m.name, curve[0].0
        )));
    }
    if i == 0 || i == curve.len() {
        let (k, lat) = if i == 0 { curve[0] } else { curve[curve.len() - 1] };
        let (anchor, q) = (sol(k), sol(tokens));
        if !(lat > 0.0 && anchor > 0.0) {
            return Err(PerfError::no_anchor(format!(
                "MoE {}: no positive-utilisation boundary point to hold at {tokens} tokens",
                m.name
            )));
        }
        let positive = q > 0.0; // false for NaN too
        if !positive {
            return Err(PerfError::no_anchor(format!(
                "MoE {}: non-positive speed of light at {tokens} tokens",
                m.name
            )));
        }
        return Ok(q / (anchor / lat));
    }
    let ((k0, a), (k1, b)) = (curve[i - 1], curve[i]);
    let w = (tokens as f64 - k0 as f64) / (k1 as f64 - k0 as f64);
    Ok(a + (b - a) * w)
}

/// `eval` of a MoE op: `scale × max(0, latency)`.
pub fn eval_moe(db: &Database, m: &MoeOp, x: u32) -> Result<f64> {
    Ok(moe_latency(db, m, x)?.max(0.0) * m.scale)
}

/// Dispatch / combine communication for `x` tokens of one attention-DP rank, scaled, ms.
pub fn eval_dispatch(db: &Database, d: &DispatchOp, x: u32) -> Result<f64> {
    let gpus = (d.moe_tp * d.moe_ep).max(1);
    let dp = d.attention_dp.max(1);
    let attn_tp = (gpus / dp).max(1);
    let h = d.hidden as f64;
    let gathered = x
        .checked_mul(dp)
        .ok_or_else(|| PerfError::config(format!("{}: {x} tokens × attention_dp {dp} exceeds 2^32", d.name)))?;
    let ar = |n: u32, tokens: u32| db.custom_allreduce(n, tokens as f64 * h);
    let nccl = |op: &str, n: u32, tokens: u32, per_token: f64| db.nccl("half", op, n, tokens as f64 * per_token);
    let gather_or_scatter = if d.pre { "all_gather" } else { "reduce_scatter" };
    let v = match d.backend.as_str() {
        "vllm" => {
            let mut total = 0.0;
            // The all-reduce stands for the attention's, unless the model prices that itself.
            if attn_tp > 1 && !(d.pre && d.attn_ar_modeled) {
                total += ar(gpus, x)?;
            }
            if dp > 1 {
                total += nccl(gather_or_scatter, gpus, gathered, h)?;
            }
            total
        }
        "sglang" => {
            if attn_tp > 1 && dp > 1 {
                if d.pre {
                    nccl("reduce_scatter", attn_tp, x, h)? + nccl("all_gather", gpus, gathered, h)?
                } else {
                    nccl("reduce_scatter", gpus, gathered, h)? + nccl("all_gather", attn_tp, x, h)?
                }
            } else if d.attn_cp > 1 {
                // Context parallelism: in prefill the experts see every rank's tokens, so the
                // dispatch gathers the CP-split prompt and the combine scatters it back; in
                // decode every rank holds all tokens, and only the combine all-reduces.
                match (d.cp_decode, d.pre) {
                    (false, _) => nccl(gather_or_scatter, gpus, x, h)?,
                    (true, true) => 0.0,
                    (true, false) => ar(gpus, x)?,
                }
            } else if attn_tp > 1 {
                ar(gpus, x)?
            } else if dp > 1 {
                nccl(gather_or_scatter, gpus, gathered, h)?
            } else {
                0.0
            }
        }
        "trtllm" => {
            if db.spec.sm_version == Some(100) {
                if dp > 1 && d.moe_tp == 1 && db.spec.gpus_per_node >= 72 {
                    return Err(PerfError::unsupported(format!(
                        "{}: TRT-LLM's NVLink all-to-all MoE dispatch on {} (attention DP with moe_tp=1) is not modelled",
                        d.name, db.spec.name
                    )));
                }
                if dp > 1 {
                    if d.pre {
                        // The dispatched activations travel quantised.
                        // NVFP4: a quarter of the bf16 bytes plus one fp8 scale per 16.
                        let f = match d.dtype {
                            Dtype::Nvfp4 => 0.25 + 0.25 / 8.0,
                            Dtype::Fp8 | Dtype::Fp8Block => 0.5,
                            _ => 1.0,
                        };
                        nccl("all_gather", gpus, gathered, h * f)?
                    } else {
                        nccl("reduce_scatter", gpus, gathered, h)?
                    }
                } else if attn_tp > 1 {
                    ar(gpus, x)?
                } else {
                    0.0
                }
            } else if attn_tp > 1 {
                ar(gpus, x)?
            } else if dp > 1 {
                nccl(gather_or_scatter, gpus, gathered, h)?
            } else {
                0.0
            }
        }
        other => {
            return Err(PerfError::unsupported(format!("{}: no MoE dispatch model for backend {other:?}", d.name)))
        }
    };
    Ok(v.max(0.0) * d.scale)
}
