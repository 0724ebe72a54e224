//! The EMPIRICAL / HYBRID estimate of an op: its speed of light at the query divided by a
//! utilisation `SOL / measured` read off the op's own measured points.
//!
//! Every measured point of a slice becomes a utilisation sample. Coordinates live in log space,
//! each axis normalised to the span of the samples; a query is clamped into that box (so beyond
//! the data the boundary utilisation is held), then blended from its two nearest samples by
//! inverse distance (an exact hit returns its own utilisation). A slice with no sample to read is
//! a miss, never a made-up constant.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::error::{PerfError, Result};

fn ln_floor(v: f64) -> f64 {
    v.max(1e-9).ln()
}

/// Per-axis log-space minimum and span (1 for a flat axis) of `rows`.
fn log_box(rows: &[Vec<f64>]) -> (Vec<f64>, Vec<f64>) {
    let dims = rows.first().map_or(0, Vec::len);
    let mut lo = vec![f64::INFINITY; dims];
    let mut hi = vec![f64::NEG_INFINITY; dims];
    for row in rows {
        for (a, &v) in row.iter().enumerate() {
            lo[a] = lo[a].min(v);
            hi[a] = hi[a].max(v);
        }
    }
    let span = lo.iter().zip(&hi).map(|(&l, &h)| if h - l > 0.0 { h - l } else { 1.0 }).collect();
    (lo, span)
}

/// The utilisation samples of one table slice.
#[derive(Debug, Default)]
pub struct UtilGrid {
    norm: Vec<Vec<f64>>,
    utils: Vec<f64>,
    lo: Vec<f64>,
    span: Vec<f64>,
}

impl UtilGrid {
    /// Samples from measured `(coordinates, ms)` points, in the order given (it breaks distance
    /// ties); a point without a positive latency and a positive SOL carries no utilisation.
    pub fn new(points: impl IntoIterator<Item = (Vec<f64>, f64)>, sol: impl Fn(&[f64]) -> f64) -> UtilGrid {
        let mut logs = Vec::new();
        let mut utils = Vec::new();
        for (c, ms) in points {
            if ms > 0.0 {
                let s = sol(&c);
                if s > 0.0 {
                    logs.push(c.iter().map(|&v| ln_floor(v)).collect::<Vec<_>>());
                    utils.push(s / ms);
                }
            }
        }
        let (lo, span) = log_box(&logs);
        let norm =
            logs.into_iter().map(|row| row.iter().enumerate().map(|(a, &v)| (v - lo[a]) / span[a]).collect()).collect();
        UtilGrid { norm, utils, lo, span }
    }

    pub fn is_empty(&self) -> bool {
        self.utils.is_empty()
    }

    /// The utilisation at `q`, `None` without samples.
    pub fn util(&self, q: &[f64]) -> Option<f64> {
        if self.utils.is_empty() {
            return None;
        }
        let q: Vec<f64> =
            q.iter().enumerate().map(|(a, &v)| ((ln_floor(v) - self.lo[a]) / self.span[a]).clamp(0.0, 1.0)).collect();
        // The two nearest samples; an equal distance keeps the earlier sample.
        let mut best: [Option<(f64, usize)>; 2] = [None, None];
        for (i, row) in self.norm.iter().enumerate() {
            let d = row.iter().zip(&q).map(|(&x, &y)| (x - y) * (x - y)).sum::<f64>().sqrt();
            if best[0].is_none_or(|(b, _)| d.total_cmp(&b).is_lt()) {
                best[1] = best[0];
                best[0] = Some((d, i));
            } else if best[1].is_none_or(|(b, _)| d.total_cmp(&b).is_lt()) {
                best[1] = Some((d, i));
            }
        }
        let (d0, i0) = best[0]?;
        if d0 == 0.0 {
            return Some(self.utils[i0]);
        }
        let (mut num, mut den) = (0.0, 0.0);
        for (d, i) in best.into_iter().flatten() {
            let w = 1.0 / d;
            num += self.utils[i] * w;
            den += w;
        }
        Some(num / den)
    }
}

/// `sol_q / (util(q) · scale)`, or a miss naming `what` when there is no positive utilisation.
pub fn estimate(sol_q: f64, q: &[f64], grid: Option<&UtilGrid>, scale: f64, what: &str) -> Result<f64> {
    match grid.and_then(|g| g.util(q)) {
        Some(u) if u > 0.0 => Ok(sol_q / (u * scale)),
        _ => Err(PerfError::data(format!("{what}: no measured points to take an empirical utilisation from at {q:?}"))),
    }
}

/// The nearest measured point of a non-negative delta table (the static-FP8 scale-computation
/// saving), zeros kept: a zero stays zero, a positive delta is rescaled by the query's SOL over
/// the point's. The query is not clamped.
#[derive(Debug, Default)]
pub struct DeltaLookup {
    coords: Vec<Vec<f64>>,
    values: Vec<f64>,
    norm: Vec<Vec<f64>>,
    lo: Vec<f64>,
    span: Vec<f64>,
}

impl DeltaLookup {
    pub fn new(points: impl IntoIterator<Item = (Vec<f64>, f64)>) -> DeltaLookup {
        let (coords, values): (Vec<_>, Vec<_>) = points.into_iter().filter(|(_, v)| *v >= 0.0).unzip();
        let logs: Vec<Vec<f64>> = coords.iter().map(|c: &Vec<f64>| c.iter().map(|&v| ln_floor(v)).collect()).collect();
        let (lo, span) = log_box(&logs);
        let norm =
            logs.into_iter().map(|row| row.iter().enumerate().map(|(a, &v)| (v - lo[a]) / span[a]).collect()).collect();
        DeltaLookup { coords, values, norm, lo, span }
    }

    pub fn estimate(&self, q: &[f64], sol: impl Fn(&[f64]) -> f64, what: &str) -> Result<f64> {
        if self.values.is_empty() {
            return Err(PerfError::data(format!("{what}: no measured deltas at {q:?}")));
        }
        let nq: Vec<f64> = q.iter().enumerate().map(|(a, &v)| (ln_floor(v) - self.lo[a]) / self.span[a]).collect();
        let mut best = (f64::INFINITY, 0);
        for (i, row) in self.norm.iter().enumerate() {
            let d2: f64 = row.iter().zip(&nq).map(|(&x, &y)| (x - y) * (x - y)).sum();
            if d2 < best.0 {
                best = (d2, i);
            }
        }
        let v = self.values[best.1];
        if v == 0.0 {
            return Ok(0.0);
        }
        let (at_ref, at_q) = (sol(&self.coords[best.1]), sol(q));
        if at_ref <= 0.0 || at_q <= 0.0 {
            return Err(PerfError::data(format!("{what}: no positive speed of light at {q:?}")));
        }
        Ok(at_q / (at_ref / v))
    }
}

/// Built grids by slice, each built once (`None`: the slice has no data).
#[derive(Debug, Default)]
pub struct Grids {
    grids: Mutex<HashMap<String, Option<Arc<UtilGrid>>>>,
    deltas: Mutex<HashMap<String, Arc<DeltaLookup>>>,
}

impl Grids {
    /// The grid of `key`, built by `build` on first use; `Ok(None)` from `build` is a miss that
    /// is remembered, an error is passed on and not.
    pub fn grid(&self, key: &str, build: impl FnOnce() -> Result<Option<UtilGrid>>) -> Result<Option<Arc<UtilGrid>>> {
        if let Some(g) = self.grids.lock().expect("util grids").get(key) {
            return Ok(g.clone());
        }
        let g = build()?.map(Arc::new);
        self.grids.lock().expect("util grids").insert(key.to_string(), g.clone());
        Ok(g)
    }

    pub fn delta(&self, key: &str, build: impl FnOnce() -> Result<DeltaLookup>) -> Result<Arc<DeltaLookup>> {
        if let Some(g) = self.deltas.lock().expect("delta lookups").get(key) {
            return Ok(Arc::clone(g));
        }
        let g = Arc::new(build()?);
        self.deltas.lock().expect("delta lookups").insert(key.to_string(), Arc::clone(&g));
        Ok(g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_nearest_inverse_distance_in_normalised_log_space() {
        let pts = vec![(vec![16.0], 1.25), (vec![8.0], 5.0), (vec![9.0], 2.5)];
        // SOL 1 everywhere: utilisations 0.8, 0.2, 0.4.
        let g = UtilGrid::new(pts, |_| 1.0);
        assert_eq!(g.util(&[9.0]), Some(0.4));
        let (d9, d8) = (11f64.ln() - 9f64.ln(), 11f64.ln() - 8f64.ln());
        let want = (0.4 / d9 + 0.2 / d8) / (1.0 / d9 + 1.0 / d8);
        assert!((g.util(&[11.0]).unwrap() - want).abs() < 1e-12);
        // Beyond the data the boundary utilisation is held.
        assert_eq!(g.util(&[1000.0]), Some(0.8));
        assert!(UtilGrid::new(Vec::new(), |_| 1.0).util(&[1.0]).is_none());
        let e = estimate(1.0, &[1.0], None, 1.0, "GEMM").unwrap_err();
        assert!(e.message.starts_with("GEMM: no measured points"), "{e}");
    }

    #[test]
    fn delta_lookup_keeps_zeros_and_scales_positive_deltas() {
        let d = DeltaLookup::new(vec![(vec![1.0, 1.0], 0.0), (vec![100.0, 100.0], 2.0)]);
        assert_eq!(d.estimate(&[2.0, 2.0], |c| c[0] * c[1], "x").unwrap(), 0.0);
        assert_eq!(d.estimate(&[200.0, 100.0], |c| c[0] * c[1], "x").unwrap(), 4.0);
    }
}
