//! The Planner's configuration: Dynamo 1.6.1's `PlannerConfig` keys, aliases, defaults and
//! validation messages (`dynamo/planner/config/planner_config.py`, `config/defaults.py`).

use serde_json::Value;
pub use servesim_config::ConfigError;
use servesim_config::Reader;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Disagg,
    Agg,
    Prefill,
    Decode,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Throughput,
    Latency,
    Load,
    Sla,
}

impl Target {
    pub fn name(self) -> &'static str {
        match self {
            Target::Throughput => "throughput",
            Target::Latency => "latency",
            Target::Load => "load",
            Target::Sla => "sla",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PredictorKind {
    Constant,
    Arima,
    Prophet,
    Kalman,
}

impl PredictorKind {
    pub fn name(self) -> &'static str {
        match self {
            PredictorKind::Constant => "constant",
            PredictorKind::Arima => "arima",
            PredictorKind::Prophet => "prophet",
            PredictorKind::Kalman => "kalman",
        }
    }
}

/// The validated configuration. Budgets use −1 for "off", as the reference does.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannerConfig {
    pub mode: Mode,
    pub optimization_target: Target,
    pub enable_throughput_scaling: bool,
    pub enable_load_scaling: bool,
    pub throughput_adjustment_interval_seconds: i64,
    pub load_adjustment_interval_seconds: i64,
    pub scale_interval_seconds: f64,
    pub max_throughput_scaling_replicas: i64,
    pub max_gpu_budget: i64,
    pub min_gpu_budget: i64,
    pub min_endpoint: i64,
    pub prefill_min_endpoint: Option<i64>,
    pub decode_min_endpoint: Option<i64>,
    pub prefill_engine_num_gpu: Option<i64>,
    pub decode_engine_num_gpu: Option<i64>,
    pub ttft_ms: f64,
    pub itl_ms: f64,
    pub isl: f64,
    pub osl: f64,
    pub load_predictor: PredictorKind,
    pub load_predictor_log1p: bool,
    pub prophet_window_size: i64,
    pub kalman_q_level: f64,
    pub kalman_q_trend: f64,
    pub kalman_r: f64,
    pub kalman_min_points: i64,
    pub max_num_fpm_samples: i64,
    pub fpm_sample_bucket_size: i64,
    pub load_min_observations: i64,
    pub load_scaling_down_sensitivity: i64,
    pub prefill_scale_up_queue_tokens: Option<i64>,
    pub prefill_scale_down_queue_tokens: Option<i64>,
    pub decode_scale_up_kv_rate: Option<f64>,
    pub decode_scale_down_kv_rate: Option<f64>,
    pub speculative_nextn: i64,
}

/// Keys read without effect on replay (kept so that a reference config loads unchanged).
const INERT_KEYS: &[&str] = &[
    "advisory",
    "environment",
    "backend",
    "throughput_metrics_source",
    "pre_deployment_sweeping_mode",
    "load_predictor_warmup_trace",
    "report_interval_hours",
    "report_output_dir",
    "report_filename",
    "report_write_gzip_log",
    "live_dashboard_port",
    "control_api_port",
    "log_dir",
    "model_name",
    "profile_results_dir",
    "metric_reporting_prometheus_port",
    "ais_perf_model",
];

/// The keys of the deployment file's `planner:` section (aisimulate's Dynamo Planner adapter)
/// that are this configuration's fields under the same names, in the adapter's order. The
/// deploy crate passes them through from a `planner:` section and from a searched candidate.
pub const PASSTHROUGH_KEYS: [&str; 16] = [
    "enable_throughput_scaling",
    "enable_load_scaling",
    "throughput_adjustment_interval_seconds",
    "load_adjustment_interval_seconds",
    "max_throughput_scaling_replicas",
    "max_num_fpm_samples",
    "fpm_sample_bucket_size",
    "load_scaling_down_sensitivity",
    "load_min_observations",
    "load_predictor",
    "load_predictor_log1p",
    "prophet_window_size",
    "kalman_q_level",
    "kalman_q_trend",
    "kalman_r",
    "kalman_min_points",
];

/// The other keys the configuration reads (besides [`PASSTHROUGH_KEYS`]).
const KNOWN_KEYS: &[&str] = &[
    "mode",
    "optimization_target",
    "throughput_adjustment_interval",
    "load_adjustment_interval",
    "scheduling",
    "max_gpu_budget",
    "min_gpu_budget",
    "min_endpoint",
    "prefill_min_endpoint",
    "decode_min_endpoint",
    "prefill_engine_num_gpu",
    "decode_engine_num_gpu",
    "ttft_ms",
    "ttft",
    "itl_ms",
    "itl",
    "isl",
    "osl",
    "prefill_scale_up_queue_tokens",
    "prefill_scale_down_queue_tokens",
    "decode_scale_up_kv_rate",
    "decode_scale_down_kv_rate",
    "speculative_nextn",
];

fn at_least(key: &str, v: Option<i64>, min: i64, strict: bool) -> Result<(), ConfigError> {
    match v {
        Some(x) if strict && x <= min => {
            Err(ConfigError::new(key, format!("Input should be greater than {min}, got {x}")))
        }
        Some(x) if !strict && x < min => {
            Err(ConfigError::new(key, format!("Input should be greater than or equal to {min}, got {x}")))
        }
        _ => Ok(()),
    }
}

fn gcd_seconds(values: &[f64]) -> f64 {
    // Intervals are whole or decimal seconds: the gcd over milliseconds.
    let mut g: u64 = 0;
    for v in values {
        let mut a = (v * 1000.0).round() as u64;
        let mut b = g;
        while b != 0 {
            (a, b) = (b, a % b);
        }
        g = a;
    }
    g as f64 / 1000.0
}

fn is_multiple(value: f64, step: f64) -> bool {
    if step <= 0.0 {
        return false;
    }
    let k = (value / step).round();
    k >= 1.0 && (k * step - value).abs() <= 1e-9 * value.abs().max(1.0)
}

impl PlannerConfig {
    /// Reads and validates a `PlannerConfig` object (the reference's field names).
    pub fn from_json(v: &Value) -> Result<PlannerConfig, ConfigError> {
        let m = v.as_object().ok_or_else(|| ConfigError::new("", "the planner configuration must be an object"))?;
        if m.contains_key("aic_perf_model") {
            return Err(ConfigError::new("", 
                "aic_perf_model is no longer supported; use ais_perf_model.roles with canonical AISimulate configurations",
            ));
        }
        for k in m.keys() {
            if !PASSTHROUGH_KEYS.contains(&k.as_str())
                && !KNOWN_KEYS.contains(&k.as_str())
                && !INERT_KEYS.contains(&k.as_str())
            {
                return Err(ConfigError::new(k.clone(), "Extra inputs are not permitted"));
            }
        }
        // A profiled model changes every SLA estimate; replaying without it would give other
        // decisions than the reference's, silently.
        if m.get("ais_perf_model").is_some_and(|v| !v.is_null()) {
            return Err(ConfigError::new(
                "ais_perf_model".to_string(),
                "a profiled AISimulate planner model is not supported by servesim (leave it null: the planner \
                 then fits its own forward-pass model online, as the reference does without one)",
            ));
        }
        let r = Reader::over("", m);
        let mode = match r.pydantic_literal("mode", &["disagg", "prefill", "decode", "agg"])?.unwrap_or("disagg") {
            "agg" => Mode::Agg,
            "prefill" => Mode::Prefill,
            "decode" => Mode::Decode,
            _ => Mode::Disagg,
        };
        let target = match r
            .pydantic_literal("optimization_target", &["throughput", "latency", "load", "sla"])?
            .unwrap_or("throughput")
        {
            "latency" => Target::Latency,
            "load" => Target::Load,
            "sla" => Target::Sla,
            _ => Target::Throughput,
        };
        let load_predictor =
            match r.pydantic_literal("load_predictor", &["constant", "arima", "prophet", "kalman"])?.unwrap_or("arima")
            {
                "constant" => PredictorKind::Constant,
                "prophet" => PredictorKind::Prophet,
                "kalman" => PredictorKind::Kalman,
                _ => PredictorKind::Arima,
            };
        let throughput_interval =
            r.pydantic_int(&["throughput_adjustment_interval_seconds", "throughput_adjustment_interval"])?;
        let load_interval = r.pydantic_int(&["load_adjustment_interval_seconds", "load_adjustment_interval"])?;
        at_least("load_adjustment_interval_seconds", load_interval, 0, true)?;
        let max_tp = r.pydantic_int(&["max_throughput_scaling_replicas"])?;
        at_least("max_throughput_scaling_replicas", max_tp, 0, true)?;
        let min_endpoint = r.pydantic_int(&["min_endpoint"])?;
        at_least("min_endpoint", min_endpoint, 0, false)?;
        let prefill_min_endpoint = r.pydantic_int(&["prefill_min_endpoint"])?;
        at_least("prefill_min_endpoint", prefill_min_endpoint, 1, false)?;
        let decode_min_endpoint = r.pydantic_int(&["decode_min_endpoint"])?;
        at_least("decode_min_endpoint", decode_min_endpoint, 1, false)?;
        let prophet_window_size = r.pydantic_int(&["prophet_window_size"])?;
        at_least("prophet_window_size", prophet_window_size, 0, true)?;
        let max_num_fpm_samples = r.pydantic_int(&["max_num_fpm_samples"])?;
        at_least("max_num_fpm_samples", max_num_fpm_samples, 0, true)?;
        let bucket = r.pydantic_int(&["fpm_sample_bucket_size"])?;
        at_least("fpm_sample_bucket_size", bucket, 0, true)?;
        let sensitivity = r.pydantic_int(&["load_scaling_down_sensitivity"])?;
        at_least("load_scaling_down_sensitivity", sensitivity, 0, false)?;
        if let Some(s) = sensitivity.filter(|s| *s > 100) {
            return Err(ConfigError::new(
                "load_scaling_down_sensitivity",
                format!("Input should be less than or equal to 100, got {s}"),
            ));
        }
        let p_up = r.pydantic_int(&["prefill_scale_up_queue_tokens"])?;
        at_least("prefill_scale_up_queue_tokens", p_up, 0, false)?;
        let p_down = r.pydantic_int(&["prefill_scale_down_queue_tokens"])?;
        at_least("prefill_scale_down_queue_tokens", p_down, 0, false)?;
        let d_up = r.pydantic_number(&["decode_scale_up_kv_rate"])?;
        let d_down = r.pydantic_number(&["decode_scale_down_kv_rate"])?;
        for (k, v) in [("decode_scale_up_kv_rate", d_up), ("decode_scale_down_kv_rate", d_down)] {
            if let Some(x) = v.filter(|x| !(0.0..=100.0).contains(x)) {
                return Err(ConfigError::new(k, format!("Input should be between 0 and 100, got {x}")));
            }
        }
        let nextn = r.pydantic_int(&["speculative_nextn"])?;
        at_least("speculative_nextn", nextn, 0, false)?;
        let mut cfg = PlannerConfig {
            mode,
            optimization_target: target,
            enable_throughput_scaling: r.pydantic_bool("enable_throughput_scaling")?.unwrap_or(true),
            enable_load_scaling: r.pydantic_bool("enable_load_scaling")?.unwrap_or(false),
            throughput_adjustment_interval_seconds: throughput_interval.unwrap_or(180),
            load_adjustment_interval_seconds: load_interval.unwrap_or(5),
            scale_interval_seconds: 5.0,
            max_throughput_scaling_replicas: max_tp.unwrap_or(8),
            max_gpu_budget: r.pydantic_int(&["max_gpu_budget"])?.unwrap_or(8),
            min_gpu_budget: r.pydantic_int(&["min_gpu_budget"])?.unwrap_or(-1),
            min_endpoint: min_endpoint.unwrap_or(1),
            prefill_min_endpoint,
            decode_min_endpoint,
            prefill_engine_num_gpu: r.pydantic_int(&["prefill_engine_num_gpu"])?,
            decode_engine_num_gpu: r.pydantic_int(&["decode_engine_num_gpu"])?,
            ttft_ms: r.pydantic_number(&["ttft_ms", "ttft"])?.unwrap_or(500.0),
            itl_ms: r.pydantic_number(&["itl_ms", "itl"])?.unwrap_or(50.0),
            isl: r.pydantic_number(&["isl"])?.unwrap_or(3000.0),
            osl: r.pydantic_number(&["osl"])?.unwrap_or(150.0),
            load_predictor,
            load_predictor_log1p: r.pydantic_bool("load_predictor_log1p")?.unwrap_or(false),
            prophet_window_size: prophet_window_size.unwrap_or(50),
            kalman_q_level: r.pydantic_number(&["kalman_q_level"])?.unwrap_or(1.0),
            kalman_q_trend: r.pydantic_number(&["kalman_q_trend"])?.unwrap_or(0.1),
            kalman_r: r.pydantic_number(&["kalman_r"])?.unwrap_or(10.0),
            kalman_min_points: r.pydantic_int(&["kalman_min_points"])?.unwrap_or(5),
            max_num_fpm_samples: max_num_fpm_samples.unwrap_or(64),
            fpm_sample_bucket_size: bucket.unwrap_or(16),
            load_min_observations: r.pydantic_int(&["load_min_observations"])?.unwrap_or(5),
            load_scaling_down_sensitivity: sensitivity.unwrap_or(80),
            prefill_scale_up_queue_tokens: p_up,
            prefill_scale_down_queue_tokens: p_down,
            decode_scale_up_kv_rate: d_up,
            decode_scale_down_kv_rate: d_down,
            speculative_nextn: nextn.unwrap_or(0),
        };
        // The scale interval: given under `scheduling`, else the gcd of the load interval and
        // (when throughput scaling is on under target `sla`) the throughput interval.
        let explicit_interval = match m.get("scheduling") {
            None | Some(Value::Null) => None,
            Some(Value::Object(s)) => {
                for k in s.keys() {
                    if k != "scale_interval_seconds" {
                        return Err(ConfigError::new(format!("scheduling.{k}"), "Extra inputs are not permitted"));
                    }
                }
                let sr = Reader::over("scheduling", s);
                let v = sr.pydantic_number(&["scale_interval_seconds"])?;
                if let Some(x) = v.filter(|x| *x <= 0.0) {
                    return Err(ConfigError::new(
                        "scheduling.scale_interval_seconds",
                        format!("Input should be greater than 0, got {x}"),
                    ));
                }
                v
            }
            Some(other) => {
                return Err(ConfigError::new("scheduling", format!("Input should be an object, got {other}")));
            }
        };
        cfg.scale_interval_seconds = explicit_interval.unwrap_or_else(|| {
            let mut intervals = vec![cfg.load_adjustment_interval_seconds as f64];
            if cfg.enable_throughput_scaling && target == Target::Sla {
                intervals.push(cfg.throughput_adjustment_interval_seconds as f64);
            }
            gcd_seconds(&intervals)
        });
        cfg.validate()?;
        Ok(cfg)
    }

    /// The model validator of the reference, in its order.
    fn validate(&mut self) -> Result<(), ConfigError> {
        if self.ttft_ms <= 0.0 {
            return Err(ConfigError::new("", format!("ttft_ms must be > 0, got {}", py_float(self.ttft_ms))));
        }
        if self.mode == Mode::Prefill && self.decode_min_endpoint.is_some() {
            return Err(ConfigError::new("", "decode_min_endpoint is not supported when mode='prefill'"));
        }
        if self.mode == Mode::Decode && self.prefill_min_endpoint.is_some() {
            return Err(ConfigError::new("", "prefill_min_endpoint is not supported when mode='decode'"));
        }
        if self.mode == Mode::Agg && (self.prefill_min_endpoint.is_some() || self.decode_min_endpoint.is_some()) {
            return Err(ConfigError::new(
                "",
                "prefill_min_endpoint and decode_min_endpoint are not supported when mode='agg'; use min_endpoint",
            ));
        }
        let b = self.fpm_sample_bucket_size;
        let root = (b as f64).sqrt().floor() as i64;
        if root * root != b {
            return Err(ConfigError::new("", format!("fpm_sample_bucket_size must be a perfect square, got {b}")));
        }
        if self.optimization_target == Target::Load {
            if matches!(self.mode, Mode::Disagg | Mode::Prefill) {
                match (self.prefill_scale_up_queue_tokens, self.prefill_scale_down_queue_tokens) {
                    (Some(up), Some(down)) => {
                        if up <= down {
                            return Err(ConfigError::new(
                                "",
                                "prefill_scale_up_queue_tokens must be greater than prefill_scale_down_queue_tokens",
                            ));
                        }
                    }
                    _ => {
                        return Err(ConfigError::new(
                            "",
                            "optimization_target='load' requires prefill_scale_up_queue_tokens and \
                             prefill_scale_down_queue_tokens for prefill scaling",
                        ))
                    }
                }
            }
            if matches!(self.mode, Mode::Disagg | Mode::Decode | Mode::Agg) {
                match (self.decode_scale_up_kv_rate, self.decode_scale_down_kv_rate) {
                    (Some(up), Some(down)) => {
                        if up <= down {
                            return Err(ConfigError::new(
                                "",
                                "decode_scale_up_kv_rate must be greater than decode_scale_down_kv_rate",
                            ));
                        }
                    }
                    _ => {
                        return Err(ConfigError::new(
                            "",
                            "optimization_target='load' requires decode_scale_up_kv_rate and \
                             decode_scale_down_kv_rate for decode scaling",
                        ))
                    }
                }
            }
        }
        // The "easy" targets: static thresholds only.
        if self.optimization_target != Target::Sla {
            self.enable_load_scaling = true;
            self.enable_throughput_scaling = false;
        }
        if !self.enable_throughput_scaling && !self.enable_load_scaling {
            return Err(ConfigError::new(
                "",
                "At least one scaling mode must be enabled (enable_throughput_scaling or enable_load_scaling)",
            ));
        }
        let mut intervals = vec![self.load_adjustment_interval_seconds as f64];
        if self.enable_throughput_scaling {
            if self.throughput_adjustment_interval_seconds <= 0 {
                return Err(ConfigError::new(
                    "",
                    "throughput_adjustment_interval_seconds must be > 0 when throughput scaling is enabled",
                ));
            }
            intervals.push(self.throughput_adjustment_interval_seconds as f64);
        }
        if intervals.iter().any(|i| !is_multiple(*i, self.scale_interval_seconds)) {
            return Err(ConfigError::new(
                "",
                "scheduling.scale_interval_seconds must evenly divide load_adjustment_interval_seconds and, when \
                 throughput scaling is enabled, throughput_adjustment_interval_seconds",
            ));
        }
        if self.enable_load_scaling
            && self.enable_throughput_scaling
            && self.load_adjustment_interval_seconds >= self.throughput_adjustment_interval_seconds
        {
            return Err(ConfigError::new(
                "",
                format!(
                "load_adjustment_interval_seconds ({}s) must be shorter than throughput_adjustment_interval_seconds \
                 ({}s). Load-based scaling is the fast reactive loop; throughput-based is the slow predictive loop.",
                self.load_adjustment_interval_seconds, self.throughput_adjustment_interval_seconds
            ),
            ));
        }
        Ok(())
    }

    /// `resolve_min_endpoint`: the role's own minimum, else `min_endpoint`.
    pub fn min_endpoint_for(&self, prefill: bool) -> i64 {
        let own = if prefill { self.prefill_min_endpoint } else { self.decode_min_endpoint };
        own.unwrap_or(self.min_endpoint)
    }
}

/// A float as Python prints it (`500.0`, `-1.0`, `0.5`).
fn py_float(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e16 {
        format!("{x:.1}")
    } else {
        format!("{x}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn err(v: Value) -> String {
        PlannerConfig::from_json(&v).unwrap_err().plain()
    }

    #[test]
    fn defaults_follow_the_reference() {
        let c = PlannerConfig::from_json(&json!({"optimization_target": "sla"})).unwrap();
        assert_eq!(c.mode, Mode::Disagg);
        assert_eq!((c.throughput_adjustment_interval_seconds, c.load_adjustment_interval_seconds), (180, 5));
        // gcd(5, 180) = 5.
        assert_eq!(c.scale_interval_seconds, 5.0);
        assert_eq!((c.max_gpu_budget, c.min_gpu_budget, c.min_endpoint), (8, -1, 1));
        assert_eq!(c.load_predictor, PredictorKind::Arima);
        assert_eq!((c.kalman_q_level, c.kalman_q_trend, c.kalman_r, c.kalman_min_points), (1.0, 0.1, 10.0, 5));
        assert!(c.enable_throughput_scaling && !c.enable_load_scaling);
        assert_eq!((c.ttft_ms, c.itl_ms), (500.0, 50.0));
    }

    #[test]
    fn easy_targets_force_load_scaling_and_aliases_are_read() {
        let c = PlannerConfig::from_json(&json!({
            "enable_load_scaling": false, "throughput_adjustment_interval": 60, "load_adjustment_interval": 10,
            "ttft": 800
        }))
        .unwrap();
        assert!(c.enable_load_scaling && !c.enable_throughput_scaling);
        assert_eq!((c.throughput_adjustment_interval_seconds, c.load_adjustment_interval_seconds), (60, 10));
        // Throughput scaling is off under an easy target: the load interval alone.
        assert_eq!(c.scale_interval_seconds, 10.0);
        assert_eq!(c.ttft_ms, 800.0);
        let sla = PlannerConfig::from_json(&json!({
            "optimization_target": "sla", "enable_load_scaling": true,
            "throughput_adjustment_interval_seconds": 60, "load_adjustment_interval_seconds": 25
        }))
        .unwrap();
        assert_eq!(sla.scale_interval_seconds, 5.0, "gcd(25, 60)");
    }

    #[test]
    fn validation_messages_are_the_references() {
        assert_eq!(
            err(json!({"aic_perf_model": {}})),
            "aic_perf_model is no longer supported; use ais_perf_model.roles with canonical AISimulate configurations"
        );
        assert_eq!(err(json!({"ttft_ms": 0})), "ttft_ms must be > 0, got 0.0");
        assert_eq!(
            err(json!({"fpm_sample_bucket_size": 12})),
            "fpm_sample_bucket_size must be a perfect square, got 12"
        );
        assert_eq!(
            err(json!({"mode": "agg", "decode_min_endpoint": 2})),
            "prefill_min_endpoint and decode_min_endpoint are not supported when mode='agg'; use min_endpoint"
        );
        assert_eq!(
            err(json!({"mode": "agg", "optimization_target": "load"})),
            "optimization_target='load' requires decode_scale_up_kv_rate and decode_scale_down_kv_rate for decode \
             scaling"
        );
        assert_eq!(
            err(json!({"optimization_target": "load", "prefill_scale_up_queue_tokens": 1,
                       "prefill_scale_down_queue_tokens": 1})),
            "prefill_scale_up_queue_tokens must be greater than prefill_scale_down_queue_tokens"
        );
        assert_eq!(
            err(json!({"optimization_target": "sla", "enable_throughput_scaling": false})),
            "At least one scaling mode must be enabled (enable_throughput_scaling or enable_load_scaling)"
        );
        assert_eq!(
            err(json!({"optimization_target": "sla", "enable_load_scaling": true,
                       "throughput_adjustment_interval_seconds": 5})),
            "load_adjustment_interval_seconds (5s) must be shorter than throughput_adjustment_interval_seconds (5s). \
             Load-based scaling is the fast reactive loop; throughput-based is the slow predictive loop."
        );
        assert_eq!(
            err(json!({"optimization_target": "sla", "scheduling": {"scale_interval_seconds": 7}})),
            "scheduling.scale_interval_seconds must evenly divide load_adjustment_interval_seconds and, when \
             throughput scaling is enabled, throughput_adjustment_interval_seconds"
        );
        assert_eq!(err(json!({"max_gpus": 4})), "max_gpus: Extra inputs are not permitted");
        assert_eq!(err(json!({"scheduling": {"x": 1}})), "scheduling.x: Extra inputs are not permitted");
        assert!(err(json!({"load_scaling_down_sensitivity": 101})).starts_with("load_scaling_down_sensitivity: "));
        assert!(err(json!({"ais_perf_model": {"roles": {}}}))
            .starts_with("ais_perf_model: a profiled AISimulate planner model is not supported by servesim"));
        assert!(PlannerConfig::from_json(&json!({"ais_perf_model": null})).is_ok());
    }
}
