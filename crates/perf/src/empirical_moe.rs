//! The EMPIRICAL / HYBRID estimate of the fused MoE expert FFN (`moe_perf`): the MoE roofline
//! at the query over a utilisation read off a measured token curve (`empirical.rs`'s grid).
//!
//! The curve is the op's own `(quant, distribution, shape, moe_tp, moe_ep)` slice when the table
//! has it. Without it the utilisation is borrowed, in this order:
//!
//! 1. another expert shape of the same format (same distribution fallback, `moe_tp`, `moe_ep`),
//!    the nearest in `(topk, experts, hidden, inter)`;
//! 2. failing any, the same shapes of the formats with the same weight bytes and tensor-core rate;
//! 3. failing those, the nearest format with another profile (weight bytes and rate), its curve's
//!    utilisation taken against its own roofline and rescaled by the two formats' typical MoE
//!    efficiency ratio.
//!
//! A borrowed curve's utilisation is always taken against the roofline of the reference slice's
//! own shape, so only the kernel's efficiency carries over.

use crate::db::{Database, DatabaseMode, MoeTable};
use crate::empirical::{self, UtilGrid};
use crate::error::{ErrorKind, PerfError, Result};
use crate::moe_ops::MoeOp;
use crate::systems::SystemSpec;

/// Weight bytes per element and tensor-core rate class (1 = bf16, 2 = fp8, 4 = fp4) of a
/// `moe_perf` quant name.
fn profile(quant: &str) -> Option<(f64, u32)> {
    Some(match quant {
        "bfloat16" => (2.0, 1),
        "fp8" | "fp8_block" => (1.0, 2),
        "int4_wo" | "w4a16_mxfp4" | "w4a16_mxfp4_cutlass" | "w4a16_mxfp4_humming" => (0.5, 1),
        "w4afp8" | "w4a8_mxfp4_mxfp8" | "w4a8_mxfp4_mxfp8_trtllm" => (0.5, 2),
        "nvfp4" => (9.0 / 16.0, 4),
        "nvfp4_wo" | "w4a16_nvfp4" => (9.0 / 16.0, 1),
        _ => return None,
    })
}

/// The typical fraction of its roofline a MoE kernel of a profile reaches; only ratios of two
/// of these are used (the cross-profile borrow).
fn util_level(p: (f64, u32)) -> f64 {
    const LEVELS: [(f64, u32, f64); 9] = [
        (2.0, 1, 0.53),
        (1.0, 1, 0.45),
        (0.5, 1, 0.07),
        (9.0 / 16.0, 1, 0.07),
        (1.0, 2, 0.40),
        (0.5, 2, 0.15),
        (1.0, 4, 0.30),
        (0.5, 4, 0.23),
        (9.0 / 16.0, 4, 0.23),
    ];
    LEVELS.iter().find(|l| (l.0, l.1) == p).map_or(0.30, |l| l.2)
}

/// Tensor-core FLOP/s of a rate class on `spec`.
fn rate_flops(spec: &SystemSpec, rate: u32, quant: &str) -> Result<f64> {
    let (v, key) = match rate {
        1 => (Some(spec.bf16_flops), "bfloat16_tc_flops"),
        2 => (spec.fp8_flops, "fp8_tc_flops"),
        _ => (spec.fp4_flops, "fp4_tc_flops"),
    };
    v.filter(|x| x.is_finite() && *x > 0.0).ok_or_else(|| {
        PerfError::unsupported(format!("{quant} MoE compute needs gpu.{key} in {}.yaml, which is missing", spec.name))
    })
}

/// An expert shape: `(topk, experts, hidden, inter)`.
type Shape = (u32, u32, u32, u32);

/// The MoE roofline of `tokens` (attention DP gathered) at `shape`, ms: the same formula as
/// `MoeOp::sol_ms` with the format's bytes and rate given.
#[allow(clippy::too_many_arguments)]
fn sol_ms(spec: &SystemSpec, bytes: f64, flops: f64, gemms: u64, tokens: f64, shape: Shape, tp: u32, ep: u32) -> f64 {
    let (topk, ne, h, inter) = (shape.0 as u64, shape.1 as u64, shape.2 as u64, shape.3 as u64);
    let total = tokens.round() as u64 * topk;
    let (ep, tp) = ((ep as u64).max(1), (tp as u64).max(1));
    let ops = total * h * inter * gemms * 2 / ep / tp;
    let mem = total / ep * h * 2 + total / ep * inter * gemms / tp + h * inter * gemms / tp * (ne / ep).min(total / ep);
    (ops as f64 / flops * 1000.0).max(mem as f64 * bytes / spec.mem_bw * 1000.0)
}

/// The measured curves of `quant` under `distribution` (or `uniform` when the table lacks that
/// distribution for the quant), by shape, at `tp × ep`.
fn slices<'t>(
    table: &'t MoeTable,
    quant: &str,
    distribution: &str,
    tp: u32,
    ep: u32,
) -> Vec<(Shape, &'t [(u32, f64)])> {
    let Some(by_dist) = table.grids.get(quant) else { return Vec::new() };
    let Some(by_shape) = by_dist.get(distribution).or_else(|| by_dist.get("uniform")) else { return Vec::new() };
    by_shape
        .iter()
        .filter(|(k, c)| k.4 == tp && k.5 == ep && !c.is_empty())
        .map(|(k, c)| ((k.0, k.1, k.2, k.3), c.as_slice()))
        .collect()
}

/// The index of the candidate shape nearest `q` in per-axis normalised log space (the query not
/// clamped); ties keep the first.
fn nearest(q: Shape, cands: &[Shape]) -> usize {
    let feats = |s: Shape| [s.0, s.1, s.2, s.3].map(|v| (v as f64).max(1e-9).ln());
    let rows: Vec<[f64; 4]> = cands.iter().map(|&s| feats(s)).collect();
    let mut lo = [f64::INFINITY; 4];
    let mut hi = [f64::NEG_INFINITY; 4];
    for r in &rows {
        for a in 0..4 {
            lo[a] = lo[a].min(r[a]);
            hi[a] = hi[a].max(r[a]);
        }
    }
    let span: Vec<f64> = (0..4).map(|a| if hi[a] - lo[a] > 0.0 { hi[a] - lo[a] } else { 1.0 }).collect();
    let qn = feats(q);
    let mut best = (f64::INFINITY, 0);
    for (i, r) in rows.iter().enumerate() {
        let d: f64 = (0..4).map(|a| ((r[a] - lo[a]) / span[a] - (qn[a] - lo[a]) / span[a]).powi(2)).sum();
        if d < best.0 {
            best = (d, i);
        }
    }
    best.1
}

/// The unscaled expert latency of `m` at `tokens` (attention DP gathered) under EMPIRICAL, or
/// under HYBRID after `table` (the measured lookup) missed its slice, ms.
pub(crate) fn moe_latency(db: &Database, m: &MoeOp, tokens: u32, table: impl FnOnce() -> Result<f64>) -> Result<f64> {
    match db.mode {
        DatabaseMode::Hybrid => match table() {
            Err(e) if e.kind == ErrorKind::Data => estimate(db, m, tokens),
            r => r,
        },
        DatabaseMode::Empirical => estimate(db, m, tokens),
        _ => table(),
    }
}

fn estimate(db: &Database, m: &MoeOp, tokens: u32) -> Result<f64> {
    let spec = &db.spec;
    let quant = m.dtype.name();
    let prof = profile(quant).ok_or_else(|| {
        PerfError::unsupported(format!(
            "database_mode {}: {quant} is not a MoE expert format the empirical estimate knows",
            db.mode.name()
        ))
    })?;
    let gemms: u64 = if m.gated { 3 } else { 2 };
    let flops = rate_flops(spec, prof.1, quant)?;
    let shape = (m.topk, m.experts, m.hidden, m.inter);
    let (tp, ep) = (m.moe_tp, m.moe_ep);
    let sol_q = sol_ms(spec, prof.0, flops, gemms, tokens as f64, shape, tp, ep);
    let table = db.moe_table()?;

    // Small gated NVFP4 batches read TRT-LLM's low-latency kernel's curve where it has the shape.
    let low =
        (tokens <= 128 && m.dtype == crate::db::Dtype::Nvfp4 && m.gated).then(|| table.low_latency_curve(m)).flatten();
    let grid_of = |key: String, curve: &[(u32, f64)], bytes: f64, flops: f64, shape: Shape| {
        db.util_grids().grid(&key, || {
            let pts = curve.iter().map(|&(t, v)| (vec![t as f64], v));
            Ok(Some(UtilGrid::new(pts, |c: &[f64]| sol_ms(spec, bytes, flops, gemms, c[0], shape, tp, ep))))
        })
    };
    let what = format!("MoE {} ({quant}) on {}", m.name, db.spec.name);
    let q = [tokens as f64];
    let own_key = |lane: &str, s: Shape| format!("moe:{lane}:{quant}:{}:{s:?}:{tp}x{ep}:{gemms}", m.distribution);
    if let Some(curve) = low {
        let grid = grid_of(own_key("low_latency", shape), curve, prof.0, flops, shape)?;
        return empirical::estimate(sol_q, &q, grid.as_deref(), 1.0, &what);
    }
    let own = slices(table, quant, &m.distribution, tp, ep);
    let usable = |g: &Option<std::sync::Arc<UtilGrid>>| g.as_deref().is_some_and(|g| !g.is_empty());
    if let Some((_, curve)) = own.iter().find(|(s, _)| *s == shape) {
        let grid = grid_of(own_key("std", shape), curve, prof.0, flops, shape)?;
        if usable(&grid) {
            return empirical::estimate(sol_q, &q, grid.as_deref(), 1.0, &what);
        }
    }

    // Same format at another shape, else the same-profile formats' shapes: the nearest shape,
    // its utilisation against the query format's roofline at that shape.
    let mut cands = own;
    if cands.is_empty() {
        for other in table.quant_order.iter().filter(|o| *o != quant && profile(o) == Some(prof)) {
            cands.extend(slices(table, other, &m.distribution, tp, ep));
        }
    }
    if !cands.is_empty() {
        let shapes: Vec<Shape> = cands.iter().map(|c| c.0).collect();
        let (s, curve) = cands[nearest(shape, &shapes)];
        let grid = grid_of(format!("{}:ref={s:?}", own_key("std", shape)), curve, prof.0, flops, s)?;
        if usable(&grid) {
            return empirical::estimate(sol_q, &q, grid.as_deref(), 1.0, &what);
        }
    }

    // Another profile: the nearest by |Δbytes| + |Δrate| (table order breaks ties), against its
    // own roofline, rescaled by the typical-efficiency ratio.
    let mut others: Vec<(&str, (f64, u32))> = table
        .quant_order
        .iter()
        .filter_map(|o| profile(o).map(|p| (o.as_str(), p)))
        .filter(|(o, p)| *o != quant && *p != prof)
        .collect();
    let dist = |p: (f64, u32)| (p.0 - prof.0).abs() + (p.1 as f64 - prof.1 as f64).abs();
    others.sort_by(|a, b| dist(a.1).total_cmp(&dist(b.1)));
    for (other, p) in others {
        let cands = slices(table, other, &m.distribution, tp, ep);
        if cands.is_empty() {
            continue;
        }
        let shapes: Vec<Shape> = cands.iter().map(|c| c.0).collect();
        let (s, curve) = cands[nearest(shape, &shapes)];
        let ref_flops = rate_flops(spec, p.1, other)?;
        let grid = grid_of(format!("{}:xprofile={other}:{s:?}", own_key("std", shape)), curve, p.0, ref_flops, s)?;
        if usable(&grid) {
            let scale = util_level(prof) / util_level(p);
            return empirical::estimate(sol_q, &q, grid.as_deref(), scale, &what);
        }
    }
    empirical::estimate(sol_q, &q, None, 1.0, &what)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_shape_in_normalised_log_space_first_wins_ties() {
        let c = [(8, 128, 4096, 1536), (8, 128, 2048, 768), (8, 128, 2048, 768)];
        assert_eq!(nearest((8, 128, 2048, 1024), &c), 1);
        assert_eq!(nearest((8, 128, 8192, 3072), &c), 0);
        assert_eq!(profile("w4a8_mxfp4_mxfp8_trtllm"), Some((0.5, 2)));
        assert_eq!(profile("int8"), None);
        assert_eq!(util_level((2.0, 1)) / util_level((0.5, 1)), 0.53 / 0.07);
    }
}
