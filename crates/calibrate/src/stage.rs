//! A stage's metrics from a simulation's per-request samples, defined as load generators define
//! them: over the completed requests that arrived in the stage's window, TTFT and E2E from the
//! request's arrival, TPOT per request as (last token − first token) / (tokens − 1), means and
//! linearly interpolated percentiles (numpy's default, which inference-perf and AIPerf use).

use crate::{Metric, Metrics};

/// What one completed request contributes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    pub arrival_ms: f64,
    pub ttft_ms: f64,
    pub e2e_ms: f64,
    /// `None` for a request of fewer than two output tokens.
    pub tpot_ms: Option<f64>,
}

/// Requests arriving in `[start_ms, end_ms]` of the replay's clock make a stage.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Window {
    pub start_ms: f64,
    pub end_ms: f64,
}

impl Window {
    pub const ALL: Window = Window { start_ms: f64::NEG_INFINITY, end_ms: f64::INFINITY };

    fn holds(&self, t: f64) -> bool {
        // A microsecond of slack: a window's bounds are written in seconds.
        self.start_ms - 1e-3 <= t && t <= self.end_ms + 1e-3
    }
}

/// The `p`-th percentile (0–100) of sorted values, interpolating linearly between ranks.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    let k = (sorted.len() - 1) as f64 * p / 100.0;
    let (lo, hi) = (k.floor() as usize, k.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (k - lo as f64)
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

/// The stage's metrics, or `None` when no request of the window completed.
pub fn metrics(samples: &[Sample], window: Window) -> Option<Metrics> {
    let done: Vec<&Sample> = samples.iter().filter(|s| window.holds(s.arrival_ms)).collect();
    if done.is_empty() {
        return None;
    }
    let sorted = |f: fn(&Sample) -> f64| {
        let mut v: Vec<f64> = done.iter().map(|s| f(s)).collect();
        v.sort_by(f64::total_cmp);
        v
    };
    let ttft = sorted(|s| s.ttft_ms);
    let e2e = sorted(|s| s.e2e_ms);
    let mut m = Metrics::new();
    m.insert(Metric::TtftMean, mean(&ttft));
    m.insert(Metric::TtftP99, percentile(&ttft, 99.0));
    m.insert(Metric::E2eMean, mean(&e2e));
    m.insert(Metric::E2eP99, percentile(&e2e, 99.0));
    let tpot: Vec<f64> = done.iter().filter_map(|s| s.tpot_ms).collect();
    if !tpot.is_empty() {
        m.insert(Metric::TpotMean, mean(&tpot));
    }
    Some(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_selects_by_arrival_and_percentiles_interpolate() {
        let s = |arrival_ms: f64, ttft_ms: f64| Sample { arrival_ms, ttft_ms, e2e_ms: ttft_ms * 10.0, tpot_ms: None };
        let samples = [s(0.0, 10.0), s(500.0, 20.0), s(999.9995, 30.0), s(1500.0, 1000.0)];
        let m = metrics(&samples, Window { start_ms: 0.0, end_ms: 1000.0 }).unwrap();
        assert_eq!(m[&Metric::TtftMean], 20.0);
        // Ranks 0..2 at 99 %: 1.98 → 20 + 0.98 × 10.
        assert!((m[&Metric::TtftP99] - 29.8).abs() < 1e-12);
        assert_eq!(m[&Metric::E2eMean], 200.0);
        assert!(!m.contains_key(&Metric::TpotMean));
        assert_eq!(metrics(&samples, Window { start_ms: 2000.0, end_ms: 3000.0 }), None);
        assert_eq!(metrics(&samples, Window::ALL).unwrap()[&Metric::TtftMean], 265.0);
    }
}
