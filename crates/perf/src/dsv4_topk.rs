//! DeepSeek-V4's CSA top-k correction (SGLang data: `dsv4_csa_topk_calib_perf`).
//!
//! The CSA module tables were collected with near-constant indexer scores, which send the top-k
//! selector down its slow tie-breaking path and inflate every CSA latency. The calibration table
//! times the selector itself on both kinds of scores at each shape:
//!
//! ```text
//! score_mode   v1_flat / v1_top_last   context selector on tied / realistic scores
//!              v2_flat / v2_top_last   decode selector
//! keys         num_heads (the model's heads: 64 Flash, 128 Pro) → batch_size → isl → step
//! ```
//!
//! The excess `max(0, flat − top_last)` of a shape is subtracted from the CSA module's latency
//! and the result held at 0 (HCA and SWA layers are untouched). A context pass looks it up at
//! (prefix, new tokens, batch) in the v1 pairs, a decode step at (KV length − 1, 1, batch) in the
//! v2 pairs. Off the measured shapes the excess is interpolated linearly along the prefix, then
//! the ISL, then the batch axis, each held at its end points; a model whose head count has no
//! rows gets no correction (it never borrows another model's). Rows without `num_heads`, or
//! with only one of a pair, do not count; the first row of a coordinate wins.
//!
//! Prefill context parallelism ([`crate::dsv4`]) also reads the context selector's own time on
//! realistic scores (`v1_top_last`, absolute, not the excess): at the collected batch nearest the
//! query's (the smaller on a tie), the collected ISL nearest the query's (the smaller on a tie;
//! an ISL past the largest collected one is refused, since the selector's time grows faster
//! than linearly), linear along the cached prefix and held at its ends.

use std::collections::BTreeMap;

use crate::db::{keep_row, Database};
use crate::error::{PerfError, Result};
use crate::parquet_table::{key_u32, Table};
use crate::systems::sources;

/// The calibration table.
pub const FILE: &str = "dsv4_csa_topk_calib_perf.parquet";

/// `batch → isl → prefix → excess ms`.
type Excess = BTreeMap<u32, BTreeMap<u32, BTreeMap<u32, f64>>>;

/// `batch → (isl, prefix) → ms` of the context selector on realistic scores.
type TopLast = crate::dsa::SparseGrid;

/// The installed correction: per model head count, the context (v1) and decode (v2) excesses,
/// and the context selector's own times (for context parallelism).
#[derive(Debug, Default)]
pub struct TopkCalib {
    context: BTreeMap<u32, Excess>,
    decode: BTreeMap<u32, Excess>,
    top_last: BTreeMap<u32, TopLast>,
}

/// Linear in `at` between the nearest points either side that resolve (`value` may leave a
/// point out), the end point's value past either end; `None` when no point resolves.
fn along<T>(points: &BTreeMap<u32, T>, at: u32, value: impl Fn(&T) -> Option<f64>) -> Option<f64> {
    let below = points.range(..=at).rev().find_map(|(&k, v)| value(v).map(|y| (k, y)));
    if let Some((k, y)) = below {
        if k == at {
            return Some(y);
        }
    }
    let above = points.range(at..).find_map(|(&k, v)| value(v).map(|y| (k, y)));
    match (below, above) {
        (Some((x0, y0)), Some((x1, y1))) => {
            let w = (at as f64 - x0 as f64) / (x1 as f64 - x0 as f64);
            Some(y0 * (1.0 - w) + y1 * w)
        }
        (Some((_, y)), None) | (None, Some((_, y))) => Some(y),
        (None, None) => None,
    }
}

impl TopkCalib {
    /// The correction (ms, ≥ 0) of a CSA module for a model of `native_heads` heads: `decode`
    /// selects the v2 pairs; `prefix`, `isl`, `batch` as the module notes say.
    pub fn excess_ms(&self, decode: bool, native_heads: u32, prefix: u32, isl: u32, batch: u32) -> f64 {
        let Some(grid) = (if decode { &self.decode } else { &self.context }).get(&native_heads) else {
            return 0.0;
        };
        along(grid, batch, |by_isl| along(by_isl, isl, |by_prefix| along(by_prefix, prefix, |d| Some(*d))))
            .unwrap_or(0.0)
            .max(0.0)
    }

    /// `latency` less the correction, held at 0 (unchanged when no pairs cover the model).
    pub fn corrected(&self, latency: f64, decode: bool, native_heads: u32, prefix: u32, isl: u32, batch: u32) -> f64 {
        let table = if decode { &self.decode } else { &self.context };
        if !table.contains_key(&native_heads) {
            return latency;
        }
        (latency - self.excess_ms(decode, native_heads, prefix, isl, batch)).max(0.0)
    }

    /// The context selector's time (ms) on realistic scores for a model of `native_heads`
    /// heads at `isl` new tokens after `prefix` cached ones, `batch` sequences (see the module
    /// notes); `None` when the model has no such rows.
    pub fn top_last_ms(&self, native_heads: u32, isl: u32, prefix: u32, batch: u32) -> Result<Option<f64>> {
        let Some(grid) = self.top_last.get(&native_heads) else { return Ok(None) };
        crate::dsa::nearest_shape_ms(grid, batch, isl, prefix).map_err(|largest| {
            PerfError::data(format!(
                "{FILE}: isl {isl} is past the largest collected v1_top_last isl {largest} (model heads {native_heads}); \
                 the selector's time grows faster than linearly, so it is not held"
            ))
        })
    }
}

/// Reads the correction of `db` (its sources in order, first row of a coordinate wins); `None`
/// when no source file is installed or no row is usable.
pub fn load(db: &Database) -> Result<Option<TopkCalib>> {
    let srcs = sources(&db.spec, &db.backend, &db.version, FILE, db.shared_layer)?;
    // model heads → (prefix, isl, batch) → score mode → latency
    type Modes = BTreeMap<(u32, u32, u32), BTreeMap<String, f64>>;
    let mut rows: BTreeMap<u32, Modes> = BTreeMap::new();
    let mut calib = TopkCalib::default();
    let mut any = false;
    for src in &srcs {
        if !src.path.exists() {
            continue;
        }
        any = true;
        let t = Table::read(
            &src.path,
            &["kernel_source", "num_heads", "step", "isl", "batch_size", "score_mode", "latency"],
        )?;
        let p = t.path.clone();
        let ks = t.text_or_none("kernel_source")?;
        let heads = t.int_or_none("num_heads")?;
        let (step, isl, batch, lat) = (t.int("step")?, t.int("isl")?, t.int("batch_size")?, t.float("latency")?);
        let mode = t.text("score_mode")?;
        for i in 0..t.rows {
            if !keep_row(src, &ks[i]) {
                continue;
            }
            let shape = (
                key_u32(&p, "step", i, step[i])?,
                key_u32(&p, "isl", i, isl[i])?,
                key_u32(&p, "batch_size", i, batch[i])?,
            );
            let m = mode[i].clone().ok_or_else(|| PerfError::data(format!("{p}: null score_mode in row {i}")))?;
            let Some(h) = heads[i] else { continue };
            let h = key_u32(&p, "num_heads", i, h)?;
            if m == "v1_top_last" {
                let (step, isl, batch) = shape;
                calib.top_last.entry(h).or_default().entry(batch).or_default().entry((isl, step)).or_insert(lat[i]);
            }
            rows.entry(h).or_default().entry(shape).or_default().entry(m).or_insert(lat[i]);
        }
    }
    if !any {
        return Ok(None);
    }
    for (h, shapes) in rows {
        for ((prefix, isl, batch), modes) in shapes {
            for (table, flat, last) in
                [(&mut calib.context, "v1_flat", "v1_top_last"), (&mut calib.decode, "v2_flat", "v2_top_last")]
            {
                if let (Some(f), Some(l)) = (modes.get(flat), modes.get(last)) {
                    table
                        .entry(h)
                        .or_default()
                        .entry(batch)
                        .or_default()
                        .entry(isl)
                        .or_default()
                        .entry(prefix)
                        .or_insert((f - l).max(0.0));
                }
            }
        }
    }
    Ok((!calib.context.is_empty() || !calib.decode.is_empty() || !calib.top_last.is_empty()).then_some(calib))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interpolates_prefix_then_isl_then_batch_held_at_the_ends() {
        let mut c = TopkCalib::default();
        let g = c.context.entry(64).or_default();
        g.entry(1).or_default().entry(8).or_default().extend([(0, 1.0), (100, 3.0)]);
        g.entry(1).or_default().entry(16).or_default().insert(0, 5.0);
        g.entry(4).or_default().entry(8).or_default().insert(0, 9.0);
        assert_eq!(c.excess_ms(false, 64, 50, 8, 1), 2.0);
        assert_eq!(c.excess_ms(false, 64, 500, 8, 1), 3.0);
        // isl 12 between 8 (prefix 50 → 2) and 16 (held at 5): 3.5.
        assert_eq!(c.excess_ms(false, 64, 50, 12, 1), 3.5);
        // batch 2 between 1 (2.0) and 4 (9.0).
        assert_eq!(c.excess_ms(false, 64, 50, 8, 2), 2.0 + 7.0 / 3.0);
        assert_eq!(c.excess_ms(false, 64, 50, 8, 99), 9.0);
        // No decode pairs, another model's heads: no correction.
        assert_eq!(c.excess_ms(true, 64, 50, 8, 1), 0.0);
        assert_eq!(c.corrected(1.5, false, 128, 50, 8, 1), 1.5);
        assert_eq!(c.corrected(1.5, false, 64, 50, 8, 1), 0.0);
        assert_eq!(c.corrected(-1.0, false, 128, 50, 8, 1), -1.0);
    }

    #[test]
    fn top_last_takes_the_nearest_batch_and_isl_and_is_linear_in_the_prefix() {
        let mut c = TopkCalib::default();
        let g = c.top_last.entry(64).or_default();
        g.entry(1).or_default().extend([((1000, 0), 1.0), ((1000, 100), 3.0), ((3000, 0), 7.0)]);
        g.entry(4).or_default().insert((1000, 0), 9.0);
        // Batch 2 is nearer 1 than 4; isl 2000 ties 1000 and 3000: the smaller wins.
        assert_eq!(c.top_last_ms(64, 2000, 50, 2).unwrap(), Some(2.0));
        assert_eq!(c.top_last_ms(64, 2001, 50, 2).unwrap(), Some(7.0));
        // Held at the prefix ends; batch 3 is nearer 4.
        assert_eq!(c.top_last_ms(64, 1000, 500, 1).unwrap(), Some(3.0));
        assert_eq!(c.top_last_ms(64, 10, 0, 3).unwrap(), Some(9.0));
        assert_eq!(c.top_last_ms(128, 1000, 0, 1).unwrap(), None);
        let err = c.top_last_ms(64, 3001, 0, 1).unwrap_err().to_string();
        assert!(err.contains("isl 3001 is past the largest collected v1_top_last isl 3000"), "{err}");
    }
}
