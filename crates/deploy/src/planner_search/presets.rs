//! The Planner adapter's preset tables (`dynamo/planner/simulation/presets.py`): scaling
//! policies, FPM sampling, load sensitivity and load predictors, the keys of each composite
//! group and of the section, and how a preset name or custom mapping completes into its fields.

use serde_json::{json, Map, Value};
use servesim_planner::config::PlannerConfig;

/// `(name, throughput scaling, load scaling, throughput interval, load interval)`.
type ScalingPreset = (&'static str, bool, bool, Option<i64>, Option<i64>);
pub(super) const SCALING_POLICIES: [ScalingPreset; 7] = [
    ("disabled", false, false, None, None),
    ("throughput_180_5", true, false, Some(180), Some(5)),
    ("throughput_600_5", true, false, Some(600), Some(5)),
    ("load_180_5", false, true, Some(180), Some(5)),
    ("load_180_10", false, true, Some(180), Some(10)),
    ("hybrid_180_5", true, true, Some(180), Some(5)),
    ("hybrid_600_5", true, true, Some(600), Some(5)),
];

/// `(name, max_num_fpm_samples, fpm_sample_bucket_size)`.
pub(super) const FPM_SAMPLING: [(&str, i64, i64); 4] =
    [("small", 32, 4), ("default", 64, 16), ("large", 128, 16), ("fine", 128, 64)];

/// `(name, load_scaling_down_sensitivity, load_min_observations)`.
pub(super) const LOAD_SENSITIVITY: [(&str, i64, i64); 3] =
    [("aggressive", 70, 3), ("default", 80, 5), ("conservative", 90, 8)];

/// `(name, family, log1p, prophet window, kalman (q_level, q_trend, r, min_points))`.
type PredictorPreset = (&'static str, &'static str, bool, Option<i64>, Option<(f64, f64, f64, i64)>);
pub(super) const LOAD_PREDICTOR_PRESETS: [PredictorPreset; 11] = [
    ("constant_last", "constant", false, None, None),
    ("arima_raw", "arima", false, None, None),
    ("arima_log1p", "arima", true, None, None),
    ("prophet_w20_raw", "prophet", false, Some(20), None),
    ("prophet_w20_log1p", "prophet", true, Some(20), None),
    ("prophet_w50_raw", "prophet", false, Some(50), None),
    ("prophet_w50_log1p", "prophet", true, Some(50), None),
    ("kalman_default_raw", "kalman", false, None, Some((1.0, 0.1, 10.0, 5))),
    ("kalman_default_log1p", "kalman", true, None, Some((1.0, 0.1, 10.0, 5))),
    ("kalman_reactive_raw", "kalman", false, None, Some((10.0, 1.0, 5.0, 3))),
    ("kalman_reactive_log1p", "kalman", true, None, Some((10.0, 1.0, 5.0, 3))),
];

pub(super) const SCALING_KEYS: [&str; 4] = [
    "enable_throughput_scaling",
    "enable_load_scaling",
    "throughput_adjustment_interval_seconds",
    "load_adjustment_interval_seconds",
];
pub(super) const FPM_KEYS: [&str; 2] = ["max_num_fpm_samples", "fpm_sample_bucket_size"];
pub(super) const LOAD_KEYS: [&str; 2] = ["load_scaling_down_sensitivity", "load_min_observations"];
/// The predictor group's knobs in the adapter's order (its `type` is `load_predictor`).
pub(super) const PREDICTOR_KEYS: [&str; 7] = [
    "load_predictor",
    "load_predictor_log1p",
    "prophet_window_size",
    "kalman_q_level",
    "kalman_q_trend",
    "kalman_r",
    "kalman_min_points",
];

/// The section's keys (`PlannerRecommendationConfig`).
pub(super) const TOP_KEYS: [&str; 24] = [
    "scaling_policy",
    "fpm_sampling",
    "load_sensitivity",
    "load_predictor",
    "policy",
    "enable_throughput_scaling",
    "enable_load_scaling",
    "throughput_adjustment_interval_seconds",
    "load_adjustment_interval_seconds",
    "max_throughput_scaling_replicas",
    "max_num_fpm_samples",
    "fpm_sample_bucket_size",
    "load_scaling_down_sensitivity",
    "load_min_observations",
    "load_predictor_log1p",
    "prophet_window_size",
    "kalman_q_level",
    "kalman_q_trend",
    "kalman_r",
    "kalman_min_points",
    "max_num_gpus",
    "min_workers",
    "prefill_min_workers",
    "decode_min_workers",
];

/// A scaling-policy entry's four fields (`scaling_fields`).
pub(super) fn scaling_fields(entry: &Value) -> (bool, bool, Option<i64>, Option<i64>) {
    if let Some(name) = entry.as_str() {
        let p = SCALING_POLICIES.iter().find(|p| p.0 == name).expect("names are checked");
        return (p.1, p.2, p.3, p.4);
    }
    let int = |k: &str| entry.get(k).and_then(Value::as_i64);
    (
        entry.get("enable_throughput_scaling").and_then(Value::as_bool).unwrap_or(false),
        entry.get("enable_load_scaling").and_then(Value::as_bool).unwrap_or(false),
        int("throughput_adjustment_interval_seconds"),
        int("load_adjustment_interval_seconds"),
    )
}

pub(super) fn pair_fields(table: &[(&str, i64, i64)], keys: [&str; 2], entry: &Value) -> Map<String, Value> {
    let mut m = Map::new();
    match entry.as_str() {
        Some(name) => {
            let p = table.iter().find(|p| p.0 == name).expect("names are checked");
            m.insert(keys[0].into(), json!(p.1));
            m.insert(keys[1].into(), json!(p.2));
        }
        None => {
            for k in keys {
                m.insert(k.into(), entry[k].clone());
            }
        }
    }
    m
}

/// Every public predictor knob of a preset or custom entry (`complete_predictor_preset`).
#[derive(Clone, Debug)]
pub(super) struct Predictor {
    pub(super) family: String,
    pub(super) log1p: bool,
    pub(super) prophet_window_size: i64,
    pub(super) q_level: f64,
    pub(super) q_trend: f64,
    pub(super) r: f64,
    pub(super) min_points: i64,
}

impl Predictor {
    pub(super) fn of(entry: &Value) -> Predictor {
        if let Some(name) = entry.as_str() {
            let p = LOAD_PREDICTOR_PRESETS.iter().find(|p| p.0 == name).expect("names are checked");
            let (q_level, q_trend, r, min_points) = p.4.unwrap_or((1.0, 0.1, 10.0, 5));
            return Predictor {
                family: p.1.into(),
                log1p: p.2,
                prophet_window_size: p.3.unwrap_or(50),
                q_level,
                q_trend,
                r,
                min_points,
            };
        }
        let f = |k: &str, d: f64| entry.get(k).and_then(Value::as_f64).unwrap_or(d);
        let i = |k: &str, d: i64| entry.get(k).and_then(Value::as_i64).unwrap_or(d);
        Predictor {
            family: entry["load_predictor"].as_str().unwrap_or("constant").into(),
            log1p: entry.get("load_predictor_log1p").and_then(Value::as_bool).unwrap_or(false),
            prophet_window_size: i("prophet_window_size", 50),
            q_level: f("kalman_q_level", 1.0),
            q_trend: f("kalman_q_trend", 0.1),
            r: f("kalman_r", 10.0),
            min_points: i("kalman_min_points", 5),
        }
    }

    pub(super) fn supported(&self) -> bool {
        matches!(self.family.as_str(), "constant" | "kalman")
    }

    /// ARIMA and Prophet: the reference's own predictors, run through Python.
    pub(super) fn in_python(&self) -> bool {
        matches!(self.family.as_str(), "arima" | "prophet")
    }

    /// `minimum_data_points` of the family's predictor (the backtest's common warmup).
    pub(super) fn min_points(&self) -> i64 {
        match self.family.as_str() {
            "constant" => 1,
            "kalman" => self.min_points,
            _ => 5,
        }
    }

    /// The Planner fields a winner sets (`predictor_fields`).
    pub(super) fn fields(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("load_predictor".into(), json!(self.family));
        m.insert("load_predictor_log1p".into(), json!(self.log1p));
        match self.family.as_str() {
            "prophet" => {
                m.insert("prophet_window_size".into(), json!(self.prophet_window_size));
            }
            "kalman" => {
                m.insert("kalman_q_level".into(), json!(self.q_level));
                m.insert("kalman_q_trend".into(), json!(self.q_trend));
                m.insert("kalman_r".into(), json!(self.r));
                m.insert("kalman_min_points".into(), json!(self.min_points));
            }
            _ => {}
        }
        m
    }

    /// servesim's predictor for one series (constant and kalman only).
    /// One series of this predictor for windows of `interval_s` seconds: servesim's own
    /// (constant, Kalman), or the reference's through Python (ARIMA, Prophet).
    pub(super) fn series(&self, interval_s: i64) -> Result<servesim_planner::predict::Predictor, String> {
        let mut cfg = PlannerConfig::from_json(&json!({
            "load_predictor": self.family,
            "load_predictor_log1p": self.log1p,
            "prophet_window_size": self.prophet_window_size,
            "kalman_q_level": self.q_level,
            "kalman_q_trend": self.q_trend,
            "kalman_r": self.r,
            "kalman_min_points": self.min_points,
        }))
        .map_err(|e| e.to_string())?;
        // Prophet's timestamps step by the window (`_make_config`); set here, past the checks
        // of a whole Planner configuration.
        cfg.throughput_adjustment_interval_seconds = interval_s;
        let external: Option<Box<dyn servesim_planner::ExternalSeries>> = if self.in_python() {
            Some(Box::new(servesim_replay::planner_python::Series::for_backtest(&cfg)?))
        } else {
            None
        };
        servesim_planner::predict::Predictor::with_external(&cfg, external).map_err(|e| e.to_string())
    }
}
