//! Fitting servesim's timing to a deployment's own measurements (`servesim calibrate`).
//!
//! A user measures their deployment at a few load stages and gives servesim the measurements
//! ([`measured`]: inference-perf, AIPerf, vLLM Prometheus scrapes, or servesim's summary keys)
//! with the deployment they were taken on. [`fit`] searches the few parameters the data can
//! identify ([`Params`]: how much faster or slower prefill and decode run than the data-driven
//! model says, a fixed cost per pass, the frontend's cost per request) for the ones whose
//! simulation reproduces the measurements, and cross-validates them across stages and
//! experiments. [`file`] is the calibration file `predict`, `recommend` and `serve` read.
//!
//! This crate does not simulate: the caller gives [`fit::Simulator`], which runs the deployment
//! with a parameter vector and returns each stage's metrics ([`stage`] computes them from
//! per-request samples, defined as the measurements define them).

pub mod file;
pub mod fit;
pub mod measured;
pub mod stage;

use std::collections::BTreeMap;

/// A latency statistic a stage is measured and predicted by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Metric {
    TtftMean,
    TtftP99,
    TpotMean,
    E2eMean,
    E2eP99,
}

impl Metric {
    pub const ALL: [Metric; 5] = [Metric::TtftMean, Metric::TtftP99, Metric::TpotMean, Metric::E2eMean, Metric::E2eP99];

    /// The name in calibration files and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Metric::TtftMean => "ttft_mean",
            Metric::TtftP99 => "ttft_p99",
            Metric::TpotMean => "tpot_mean",
            Metric::E2eMean => "e2e_mean",
            Metric::E2eP99 => "e2e_p99",
        }
    }

    /// servesim's summary key for the same statistic.
    pub fn summary_key(self) -> &'static str {
        match self {
            Metric::TtftMean => "mean_ttft_ms",
            Metric::TtftP99 => "p99_ttft_ms",
            Metric::TpotMean => "mean_tpot_ms",
            Metric::E2eMean => "mean_e2e_latency_ms",
            Metric::E2eP99 => "p99_e2e_latency_ms",
        }
    }

    pub fn parse(name: &str) -> Option<Metric> {
        Metric::ALL.into_iter().find(|m| m.name() == name)
    }

    /// The metric whose model error widens an interval of summary key `key`: a latency
    /// statistic of servesim's summary (`<stat>_<latency>_ms`, stat one of mean, median, p75,
    /// p90, p95, p99; latency one of ttft, tpot, itl, e2e_latency). A tail (p90 and above) takes
    /// the p99's error, falling back to the mean's when the tail was not measured. Counts,
    /// spreads, extremes and TTFT parts are not widened.
    pub fn for_summary_key(key: &str) -> Option<[Metric; 2]> {
        let (stat, rest) = key.split_once('_')?;
        let tail = match stat {
            "mean" | "median" | "p75" => false,
            "p90" | "p95" | "p99" => true,
            _ => return None,
        };
        Some(match (rest, tail) {
            ("ttft_ms", false) => [Metric::TtftMean; 2],
            ("ttft_ms", true) => [Metric::TtftP99, Metric::TtftMean],
            ("tpot_ms" | "itl_ms", _) => [Metric::TpotMean; 2],
            ("e2e_latency_ms", false) => [Metric::E2eMean; 2],
            ("e2e_latency_ms", true) => [Metric::E2eP99, Metric::E2eMean],
            _ => return None,
        })
    }
}

/// A stage's statistics, in ms.
pub type Metrics = BTreeMap<Metric, f64>;

/// A parameter the fit may free.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Param {
    PrefillScale,
    DecodeScale,
    PassOverheadMs,
    FrontendMs,
}

impl Param {
    pub const ALL: [Param; 4] = [Param::PrefillScale, Param::DecodeScale, Param::PassOverheadMs, Param::FrontendMs];

    pub fn name(self) -> &'static str {
        match self {
            Param::PrefillScale => "prefill_scale",
            Param::DecodeScale => "decode_scale",
            Param::PassOverheadMs => "pass_overhead_ms",
            Param::FrontendMs => "frontend_ms",
        }
    }

    pub fn parse(name: &str) -> Option<Param> {
        Param::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The range a value must lie in (the AIS timing's `calibration` bounds; a frontend of up
    /// to a second).
    pub fn bounds(self) -> (f64, f64) {
        match self {
            Param::PrefillScale | Param::DecodeScale => (0.05, 20.0),
            Param::PassOverheadMs | Param::FrontendMs => (0.0, 1000.0),
        }
    }

    /// Multiplicative parameters are searched on a log scale.
    fn is_scale(self) -> bool {
        matches!(self, Param::PrefillScale | Param::DecodeScale)
    }
}

/// A full parameter vector; [`Params::default`] is the uncalibrated model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Params {
    pub prefill_scale: f64,
    pub decode_scale: f64,
    pub pass_overhead_ms: f64,
    pub frontend_ms: f64,
}

impl Default for Params {
    fn default() -> Self {
        Params { prefill_scale: 1.0, decode_scale: 1.0, pass_overhead_ms: 0.0, frontend_ms: 0.0 }
    }
}

impl Params {
    pub fn get(&self, p: Param) -> f64 {
        match p {
            Param::PrefillScale => self.prefill_scale,
            Param::DecodeScale => self.decode_scale,
            Param::PassOverheadMs => self.pass_overhead_ms,
            Param::FrontendMs => self.frontend_ms,
        }
    }

    pub fn set(&mut self, p: Param, v: f64) {
        let (lo, hi) = p.bounds();
        let v = v.clamp(lo, hi);
        match p {
            Param::PrefillScale => self.prefill_scale = v,
            Param::DecodeScale => self.decode_scale = v,
            Param::PassOverheadMs => self.pass_overhead_ms = v,
            Param::FrontendMs => self.frontend_ms = v,
        }
    }
}
