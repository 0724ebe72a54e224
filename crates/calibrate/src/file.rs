//! The calibration file `servesim calibrate` writes and `--calibration` reads: JSON with the
//! fitted parameters, the deployment they were fitted on, the model error the
//! cross-validation measured, and every stage's measured and predicted numbers.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Map, Value};

use crate::{Metric, Param, Params};

/// The value of the file's `format` key.
pub const FORMAT: &str = "servesim-calibration/1";

/// The z-score of a two-sided 90 % interval of a normal error.
pub const Z90: f64 = 1.6448536269514722;

/// Student's t for a two-sided 90 % interval with 1..=30 degrees of freedom.
const T90: [f64; 30] = [
    6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782, 1.771, 1.761, 1.753, 1.746,
    1.740, 1.734, 1.729, 1.725, 1.721, 1.717, 1.714, 1.711, 1.708, 1.706, 1.703, 1.701, 1.699, 1.697,
];

/// What a calibration's error is, before its own stages say: the RMS log error of calibrated
/// predictions of experiments the fit never saw, on the real-hardware development set (31
/// held-out stages of four model/GPU groups; `python3 scripts/real_hw_calibrate.py --servesim
/// target/release/servesim --members 5` prints them as "pooled held-out log RMS"). The TTFT
/// p99 one is large because one group (Mixtral-8x7B) misses its tail by up to 90 %.
pub fn prior_log_rms(metric: Metric) -> f64 {
    match metric {
        Metric::TtftMean => 0.075,
        Metric::TtftP99 => 0.837,
        Metric::TpotMean | Metric::E2eMean => 0.048,
        Metric::E2eP99 => 0.162,
    }
}

/// How many stages the prior counts as: a calibration measured on many stages outweighs it, one
/// measured on two (or one, in-sample) does not make its intervals narrow by luck.
pub const PRIOR_STAGES: usize = 4;

/// A metric's model error: the root mean square of its log errors over `stages` predictions.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ModelError {
    pub log_rms: f64,
    pub stages: usize,
}

impl ModelError {
    /// Half the width of a 90 % prediction interval of the log error. The error's variance is
    /// the measured one pooled with the prior's (`prior_log_rms`, weighted as [`PRIOR_STAGES`]
    /// stages: a scaled inverse-χ² prior), and the interval is Student's t for the stages of
    /// both, times the pooled RMS.
    pub fn half_width(&self, prior_log_rms: f64) -> f64 {
        let (n, n0) = (self.stages as f64, PRIOR_STAGES as f64);
        let dof = self.stages + PRIOR_STAGES;
        let pooled = ((n0 * prior_log_rms.powi(2) + n * self.log_rms.powi(2)) / (n0 + n)).sqrt();
        let t = if dof <= 30 { T90[dof - 1] } else { Z90 + (T90[29] - Z90) * 30.0 / dof as f64 };
        t * pooled
    }
}

/// What a prediction needs from a calibration file.
#[derive(Clone, Debug, PartialEq)]
pub struct Calibration {
    pub params: Params,
    pub fitted: Vec<Param>,
    /// The measured deployment: flat identity fields (model, hardware, backend, ...).
    pub deployment: BTreeMap<String, Value>,
    /// The model error per metric, and whether it was cross-validated.
    pub model_error: BTreeMap<Metric, ModelError>,
    pub cross_validated: bool,
}

impl Calibration {
    /// The file's top-level object; `report` adds the fit's account (stages, errors).
    pub fn to_json(&self, report: Map<String, Value>) -> Value {
        let params: Map<String, Value> =
            Param::ALL.iter().map(|p| (p.name().into(), json!(self.params.get(*p)))).collect();
        let mut doc = Map::new();
        doc.insert("format".into(), json!(FORMAT));
        doc.insert("deployment".into(), json!(self.deployment));
        doc.insert("parameters".into(), Value::Object(params));
        doc.insert("fitted".into(), json!(self.fitted.iter().map(|p| p.name()).collect::<Vec<_>>()));
        let rms: Map<String, Value> =
            self.model_error.iter().map(|(m, e)| (m.name().into(), json!(e.log_rms))).collect();
        let stages: Map<String, Value> =
            self.model_error.iter().map(|(m, e)| (m.name().into(), json!(e.stages))).collect();
        doc.insert(
            "model_error".into(),
            json!({"log_rms": rms, "stages": stages,
                   "source": if self.cross_validated { "cross-validated" } else { "in-sample" }}),
        );
        doc.extend(report);
        Value::Object(doc)
    }

    /// Reads and checks a calibration file.
    pub fn read(path: &Path) -> Result<Calibration, String> {
        let shown = path.display();
        let text = crate::measured::read_bounded(path)?;
        let v: Value = serde_json::from_str(&text).map_err(|e| format!("{shown}: not valid JSON: {e}"))?;
        Calibration::from_json(&v).map_err(|e| format!("{shown}: {e}"))
    }

    pub fn from_json(v: &Value) -> Result<Calibration, String> {
        match v.get("format").and_then(Value::as_str) {
            Some(FORMAT) => {}
            Some(other) => return Err(format!("format: {other:?} is not {FORMAT:?} (written by another servesim?)")),
            None => return Err("format: missing; not a calibration file written by `servesim calibrate`".into()),
        }
        let mut params = Params::default();
        let given = v.get("parameters").and_then(Value::as_object).ok_or("parameters: missing or not an object")?;
        for (k, x) in given {
            let p = Param::parse(k).ok_or_else(|| format!("parameters.{k}: unknown parameter"))?;
            let (lo, hi) = p.bounds();
            match x.as_f64() {
                Some(f) if (lo..=hi).contains(&f) => params.set(p, f),
                _ => return Err(format!("parameters.{k}: must be a number in [{lo}, {hi}], got {x}")),
            }
        }
        let fitted = match v.get("fitted").and_then(Value::as_array) {
            Some(a) => a
                .iter()
                .map(|x| x.as_str().and_then(Param::parse).ok_or_else(|| format!("fitted: unknown parameter {x}")))
                .collect::<Result<_, _>>()?,
            None => Vec::new(),
        };
        let deployment = match v.get("deployment") {
            Some(Value::Object(m)) => m.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            _ => return Err("deployment: missing or not an object".into()),
        };
        let mut model_error = BTreeMap::new();
        let errors = v.pointer("/model_error/log_rms").and_then(Value::as_object);
        for (k, x) in errors.into_iter().flatten() {
            let m = Metric::parse(k).ok_or_else(|| format!("model_error.log_rms.{k}: unknown metric"))?;
            let stages = v.pointer(&format!("/model_error/stages/{k}")).and_then(Value::as_u64).unwrap_or(0);
            match x.as_f64() {
                Some(f) if f.is_finite() && f >= 0.0 => {
                    model_error.insert(m, ModelError { log_rms: f, stages: stages as usize })
                }
                _ => return Err(format!("model_error.log_rms.{k}: must be a non-negative number, got {x}")),
            };
        }
        let cross_validated = v.pointer("/model_error/source").and_then(Value::as_str) == Some("cross-validated");
        Ok(Calibration { params, fitted, deployment, model_error, cross_validated })
    }

    /// How `other` (a deployment's identity fields) differs from the measured deployment, one
    /// line per field.
    pub fn differences(&self, other: &BTreeMap<String, Value>) -> Vec<String> {
        let mut out = Vec::new();
        for (k, measured) in &self.deployment {
            let here = other.get(k).unwrap_or(&Value::Null);
            if here != measured {
                out.push(format!("{k}: measured on {measured}, this deployment has {here}"));
            }
        }
        out
    }

    /// Widens an ensemble summary's 90 % intervals (`<key>_p05` / `<key>_p95` around the
    /// median `<key>`) by the model error ([`ModelError::half_width`], with the development
    /// set's prior), added to the arrival
    /// noise in quadrature on a log scale. Returns the keys widened.
    pub fn widen(&self, summary: &mut Map<String, Value>) -> Vec<String> {
        let mut widened = Vec::new();
        let keys: Vec<String> =
            summary.keys().filter(|k| !k.ends_with("_p05") && !k.ends_with("_p95")).cloned().collect();
        for key in keys {
            let Some((metric, error)) = Metric::for_summary_key(&key)
                .and_then(|[m, fallback]| [m, fallback].into_iter().find_map(|x| Some((x, self.model_error.get(&x)?))))
            else {
                continue;
            };
            let (lo_key, hi_key) = (format!("{key}_p05"), format!("{key}_p95"));
            let (Some(mid), Some(lo), Some(hi)) = (
                summary.get(&key).and_then(Value::as_f64),
                summary.get(&lo_key).and_then(Value::as_f64),
                summary.get(&hi_key).and_then(Value::as_f64),
            ) else {
                continue;
            };
            if !(mid > 0.0 && lo > 0.0 && hi > 0.0) {
                continue;
            }
            let model = error.half_width(prior_log_rms(metric));
            let down = ((mid / lo).ln().powi(2) + model * model).sqrt();
            let up = ((hi / mid).ln().powi(2) + model * model).sqrt();
            summary.insert(lo_key, json!(mid * (-down).exp()));
            summary.insert(hi_key, json!(mid * up.exp()));
            widened.push(key);
        }
        widened
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn calibration() -> Calibration {
        Calibration {
            params: Params { decode_scale: 0.92, frontend_ms: 9.0, ..Params::default() },
            fitted: vec![Param::DecodeScale, Param::FrontendMs],
            deployment: BTreeMap::from([("model".into(), json!("m")), ("hardware".into(), json!("h100_sxm"))]),
            model_error: BTreeMap::from([
                (Metric::TtftMean, ModelError { log_rms: 0.1, stages: 40 }),
                (Metric::E2eMean, ModelError { log_rms: 0.05, stages: 2 }),
            ]),
            cross_validated: true,
        }
    }

    #[test]
    fn a_file_reads_back_as_written_and_names_what_differs() {
        let c = calibration();
        let back = Calibration::from_json(&c.to_json(Map::new())).unwrap();
        assert_eq!(back, c);
        let other = BTreeMap::from([("model".into(), json!("m")), ("hardware".into(), json!("a100_sxm"))]);
        assert_eq!(back.differences(&other), ["hardware: measured on \"h100_sxm\", this deployment has \"a100_sxm\""]);
        let mut bad = c.to_json(Map::new());
        bad["parameters"]["decode_scale"] = json!(50.0);
        assert_eq!(
            Calibration::from_json(&bad).unwrap_err(),
            "parameters.decode_scale: must be a number in [0.05, 20], got 50.0"
        );
        assert!(Calibration::from_json(&json!({"x": 1})).unwrap_err().starts_with("format: missing"));
    }

    #[test]
    fn intervals_widen_by_the_model_error_in_quadrature() {
        let mut s: Map<String, Value> = serde_json::from_value(json!({
            "mean_ttft_ms": 100.0, "mean_ttft_ms_p05": 90.0, "mean_ttft_ms_p95": 110.0,
            "p99_ttft_ms": 200.0, "p99_ttft_ms_p05": 150.0, "p99_ttft_ms_p95": 250.0,
            "mean_tpot_ms": 10.0, "mean_tpot_ms_p05": 9.0, "mean_tpot_ms_p95": 11.0,
            "num_ttft_samples": 300.0, "num_ttft_samples_p05": 300.0, "num_ttft_samples_p95": 300.0,
            "mean_ttft_frontend_ms": 5.0, "mean_ttft_frontend_ms_p05": 4.0, "mean_ttft_frontend_ms_p95": 6.0,
            "num_requests": 5}))
        .unwrap();
        let widened = calibration().widen(&mut s);
        assert_eq!(widened, ["mean_ttft_ms", "p99_ttft_ms"]);
        let lo = s["mean_ttft_ms_p05"].as_f64().unwrap();
        // 40 stages and the prior's 4: t at 44 degrees of freedom, between the normal's 1.645
        // and t30's 1.697, times the pooled RMS.
        let t44 = Z90 + (1.697 - Z90) * 30.0 / 44.0;
        let pooled = ((4.0 * 0.075f64.powi(2) + 40.0 * 0.1f64.powi(2)) / 44.0).sqrt();
        let expected = 100.0 * (-((100f64 / 90.0).ln().powi(2) + (t44 * pooled).powi(2)).sqrt()).exp();
        assert!((lo - expected).abs() < 1e-9 && lo < 90.0);
        // The p99 falls back to the mean's measured error, pooled with the mean's prior.
        let hi = s["p99_ttft_ms_p95"].as_f64().unwrap();
        let expected = 200.0 * (((250f64 / 200.0).ln().powi(2) + (t44 * pooled).powi(2)).sqrt()).exp();
        assert!((hi - expected).abs() < 1e-9, "{hi} vs {expected}");
        // An error measured on 2 stages, pooled with a prior of 4: t6 = 1.943.
        let two = ModelError { log_rms: 0.05, stages: 2 }.half_width(0.2);
        assert!((two - 1.943 * ((4.0 * 0.04 + 2.0 * 0.0025) / 6.0f64).sqrt()).abs() < 1e-12);
        // Measured on none (a file without cross-validation), the prior alone: t4 = 2.132.
        assert!((ModelError { log_rms: 0.0, stages: 0 }.half_width(0.2) - 2.132 * 0.2).abs() < 1e-12);
        // No TPOT error was measured: its interval stays the arrival noise's.
        assert_eq!(s["mean_tpot_ms_p05"], json!(9.0));
        // Counts and TTFT parts are not latencies the model error is about.
        assert_eq!(s["num_ttft_samples_p05"], json!(300.0));
        assert_eq!(s["mean_ttft_frontend_ms_p05"], json!(4.0));
    }
}
