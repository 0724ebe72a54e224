//! Reading a stage's measurements: inference-perf lifecycle reports, AIPerf profile exports,
//! vLLM Prometheus scrapes, and JSON files with servesim's summary key names. The format is
//! recognised from the content.

use std::path::Path;

use serde_json::Value;

use crate::{Metric, Metrics};

/// The largest measurement file read (a scrape of a busy server is a few hundred KiB).
pub const MAX_BYTES: u64 = 64 << 20;

/// One measured stage.
#[derive(Clone, Debug, PartialEq)]
pub struct Measured {
    pub metrics: Metrics,
    /// The format recognised: `inference-perf`, `aiperf`, `prometheus` or `servesim`.
    pub format: &'static str,
    /// What the reading left out or approximated, to show the user.
    pub notes: Vec<String>,
}

/// Reads one measurement file; a Prometheus scrape may come with a `baseline` scrape taken
/// before the stage, which is subtracted.
pub fn read(path: &Path, baseline: Option<&Path>) -> Result<Measured, String> {
    let text = read_bounded(path)?;
    let shown = path.display();
    let measured = if text.trim_start().starts_with('{') {
        if baseline.is_some() {
            return Err(format!("{shown}: a baseline applies to Prometheus scrapes only"));
        }
        let v: Value = serde_json::from_str(&text).map_err(|e| format!("{shown}: not valid JSON: {e}"))?;
        from_json(&v).map_err(|e| format!("{shown}: {e}"))?
    } else if text.lines().any(|l| l.starts_with("vllm:") || l.starts_with("# TYPE vllm:")) {
        let base = baseline.map(read_bounded).transpose()?;
        from_prometheus(&text, base.as_deref()).map_err(|e| format!("{shown}: {e}"))?
    } else {
        return Err(format!(
            "{shown}: not a measurement servesim reads (an inference-perf lifecycle report, an AIPerf profile \
             export, a vLLM Prometheus scrape, or JSON with servesim's summary keys such as mean_ttft_ms)"
        ));
    };
    if measured.metrics.is_empty() {
        return Err(format!("{shown}: no TTFT, TPOT or E2E latency found in this {} file", measured.format));
    }
    Ok(measured)
}

/// Reads a text file of at most [`MAX_BYTES`], whatever it is (a pipe or a device is read up to
/// the bound, then refused).
pub fn read_bounded(path: &Path) -> Result<String, String> {
    use std::io::Read;
    let shown = path.display();
    let file = std::fs::File::open(path).map_err(|e| format!("{shown}: cannot read: {e}"))?;
    let mut bytes = Vec::new();
    file.take(MAX_BYTES + 1).read_to_end(&mut bytes).map_err(|e| format!("{shown}: cannot read: {e}"))?;
    if bytes.len() as u64 > MAX_BYTES {
        return Err(format!("{shown}: larger than {MAX_BYTES} bytes, the most servesim reads of a calibration input"));
    }
    String::from_utf8(bytes).map_err(|_| format!("{shown}: not UTF-8 text"))
}

/// A JSON measurement: inference-perf, AIPerf or servesim's summary keys.
pub fn from_json(v: &Value) -> Result<Measured, String> {
    // servesim's own summary (prediction.json, `predict --format json`, or a file of its keys).
    let summary = v.get("summary").filter(|s| s.is_object()).unwrap_or(v);
    if Metric::ALL.iter().any(|m| summary.get(m.summary_key()).is_some()) {
        let mut metrics = Metrics::new();
        for m in Metric::ALL {
            if let Some(x) = summary.get(m.summary_key()) {
                metrics.insert(m, positive(x, m.summary_key())?);
            }
        }
        return Ok(Measured { metrics, format: "servesim", notes: Vec::new() });
    }
    if let Some(latency) = v.pointer("/successes/latency") {
        return inference_perf(latency);
    }
    let records = v.get("records").filter(|r| r.is_object()).unwrap_or(v);
    if records.get("time_to_first_token").is_some() || records.get("request_latency").is_some() {
        return aiperf(records);
    }
    Err("a JSON file without measurements servesim reads (inference-perf's successes.latency, AIPerf's \
         time_to_first_token / request_latency, or servesim's mean_ttft_ms, mean_tpot_ms, mean_e2e_latency_ms...)"
        .into())
}

fn positive(x: &Value, what: &str) -> Result<f64, String> {
    match x.as_f64() {
        Some(f) if f.is_finite() && f > 0.0 => Ok(f),
        _ => Err(format!("{what}: must be a positive number, got {x}")),
    }
}

/// inference-perf's `stage_N_lifecycle_metrics.json`: seconds under `successes.latency`.
fn inference_perf(latency: &Value) -> Result<Measured, String> {
    let mut metrics = Metrics::new();
    for (field, stat, metric) in [
        ("time_to_first_token", "mean", Metric::TtftMean),
        ("time_to_first_token", "p99", Metric::TtftP99),
        ("request_latency", "mean", Metric::E2eMean),
        ("request_latency", "p99", Metric::E2eP99),
    ] {
        if let Some(x) = latency.get(field).and_then(|f| f.get(stat)).filter(|x| !x.is_null()) {
            metrics.insert(metric, positive(x, &format!("successes.latency.{field}.{stat}"))? * 1000.0);
        }
    }
    let notes = vec!["inference-perf's time_per_output_token counts streamed lines, not tokens, in the versions \
                      public campaigns ran; TPOT is not read (E2E and TTFT carry the decode time)"
        .to_string()];
    Ok(Measured { metrics, format: "inference-perf", notes })
}

/// AIPerf's `profile_export_aiperf.json`: one object per metric with its unit.
fn aiperf(records: &Value) -> Result<Measured, String> {
    let mut metrics = Metrics::new();
    for (field, stat, metric) in [
        ("time_to_first_token", "avg", Metric::TtftMean),
        ("time_to_first_token", "p99", Metric::TtftP99),
        ("inter_token_latency", "avg", Metric::TpotMean),
        ("request_latency", "avg", Metric::E2eMean),
        ("request_latency", "p99", Metric::E2eP99),
    ] {
        let Some(m) = records.get(field) else { continue };
        let Some(x) = m.get(stat).filter(|x| !x.is_null()) else { continue };
        let scale = match m.get("unit").and_then(Value::as_str).unwrap_or("ms") {
            "ms" => 1.0,
            "s" | "sec" => 1000.0,
            "us" => 1e-3,
            "ns" => 1e-6,
            other => return Err(format!("{field}.unit: {other:?}; expected ms, s, us or ns")),
        };
        metrics.insert(metric, positive(x, &format!("{field}.{stat}"))? * scale);
    }
    Ok(Measured { metrics, format: "aiperf", notes: Vec::new() })
}

/// Sums and counts of the histograms a vLLM server exports, over every label set.
#[derive(Default)]
struct Histograms(std::collections::BTreeMap<String, (f64, f64)>);

impl Histograms {
    fn parse(text: &str) -> Result<Histograms, String> {
        let mut h = Histograms::default();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let name_end = line.find(['{', ' ']).unwrap_or(line.len());
            let name = &line[..name_end];
            let (family, is_sum) = match (name.strip_suffix("_sum"), name.strip_suffix("_count")) {
                (Some(f), _) => (f, true),
                (_, Some(f)) => (f, false),
                _ => continue,
            };
            // After the labels: the value, then an optional timestamp.
            let rest = &line[name_end..];
            let rest = if rest.starts_with('{') { rest.rfind('}').map_or("", |i| &rest[i + 1..]) } else { rest };
            let value = rest.split_whitespace().next().and_then(|v| v.parse::<f64>().ok());
            let Some(value) = value.filter(|v: &f64| v.is_finite()) else {
                return Err(format!("line {}: no numeric value in {line:?}", n + 1));
            };
            let e = h.0.entry(family.to_string()).or_default();
            if is_sum {
                e.0 += value;
            } else {
                e.1 += value;
            }
        }
        Ok(h)
    }

    /// The mean of a histogram (seconds), less the baseline's observations.
    fn mean(&self, family: &str, baseline: Option<&Histograms>) -> Option<f64> {
        let (mut sum, mut count) = *self.0.get(family)?;
        if let Some((bs, bc)) = baseline.and_then(|b| b.0.get(family)) {
            sum -= bs;
            count -= bc;
        }
        (count > 0.0 && sum > 0.0).then(|| sum / count)
    }
}

/// A vLLM `/metrics` scrape: the means of its request-phase histograms.
fn from_prometheus(text: &str, baseline: Option<&str>) -> Result<Measured, String> {
    let h = Histograms::parse(text)?;
    let base = baseline.map(Histograms::parse).transpose().map_err(|e| format!("baseline: {e}"))?;
    let mut metrics = Metrics::new();
    let mut notes = vec!["from a Prometheus scrape only means are read (its buckets are too coarse for p99)".into()];
    if let Some(x) = h.mean("vllm:time_to_first_token_seconds", base.as_ref()) {
        metrics.insert(Metric::TtftMean, x * 1000.0);
    }
    if let Some(x) = h.mean("vllm:e2e_request_latency_seconds", base.as_ref()) {
        metrics.insert(Metric::E2eMean, x * 1000.0);
    }
    if let Some(x) = h.mean("vllm:request_time_per_output_token_seconds", base.as_ref()) {
        metrics.insert(Metric::TpotMean, x * 1000.0);
    } else if let Some(x) = h
        .mean("vllm:inter_token_latency_seconds", base.as_ref())
        .or_else(|| h.mean("vllm:time_per_output_token_seconds", base.as_ref()))
    {
        metrics.insert(Metric::TpotMean, x * 1000.0);
        notes.push("TPOT from the per-token gap histogram: a mean over tokens, not over requests".into());
    }
    if baseline.is_none() {
        notes.push("no baseline scrape: the histograms count everything since the server started".into());
    }
    Ok(Measured { metrics, format: "prometheus", notes })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_format_gives_milliseconds() {
        let ip = json!({"successes": {"latency": {
            "time_to_first_token": {"mean": 0.0574, "p99": 0.1206},
            "request_latency": {"mean": 4.6784, "p99": 6.4503},
            "time_per_output_token": {"mean": 0.0093}}}});
        let m = from_json(&ip).unwrap();
        assert_eq!(m.format, "inference-perf");
        assert!((m.metrics[&Metric::TtftMean] - 57.4).abs() < 1e-9);
        assert!((m.metrics[&Metric::E2eP99] - 6450.3).abs() < 1e-9);
        assert!(!m.metrics.contains_key(&Metric::TpotMean));

        let ai = json!({"records": {
            "time_to_first_token": {"unit": "ms", "avg": 41.5, "p99": 80.0},
            "inter_token_latency": {"unit": "ms", "avg": 9.25},
            "request_latency": {"unit": "s", "avg": 2.5}}});
        let m = from_json(&ai).unwrap();
        assert_eq!(m.format, "aiperf");
        assert_eq!(m.metrics[&Metric::TpotMean], 9.25);
        assert_eq!(m.metrics[&Metric::E2eMean], 2500.0);

        let ours = json!({"mean_ttft_ms": 12.0, "mean_tpot_ms": 7.5, "p99_e2e_latency_ms": 900.0, "other": 1});
        let m = from_json(&ours).unwrap();
        assert_eq!(m.format, "servesim");
        assert_eq!(m.metrics.len(), 3);
        assert!(from_json(&json!({"mean_ttft_ms": -1})).unwrap_err().contains("mean_ttft_ms: must be a positive"));
        assert!(from_json(&json!({"x": 1})).unwrap_err().contains("without measurements"));
    }

    #[test]
    fn a_scrape_gives_means_less_its_baseline() {
        let after = "# TYPE vllm:time_to_first_token_seconds histogram\n\
            vllm:time_to_first_token_seconds_bucket{le=\"0.1\",model_name=\"m\"} 9\n\
            vllm:time_to_first_token_seconds_sum{model_name=\"m\"} 0.6\n\
            vllm:time_to_first_token_seconds_count{model_name=\"m\"} 10\n\
            vllm:e2e_request_latency_seconds_sum{model_name=\"m\",engine=\"0\"} 20 1700000000000\n\
            vllm:e2e_request_latency_seconds_count{model_name=\"m\",engine=\"0\"} 8 1700000000000\n\
            vllm:e2e_request_latency_seconds_sum{model_name=\"m\",engine=\"1\"} 4\n\
            vllm:e2e_request_latency_seconds_count{model_name=\"m\",engine=\"1\"} 2\n";
        let before = "vllm:time_to_first_token_seconds_sum{model_name=\"m\"} 0.2\n\
            vllm:time_to_first_token_seconds_count{model_name=\"m\"} 5\n";
        let m = from_prometheus(after, Some(before)).unwrap();
        assert_eq!(m.format, "prometheus");
        assert!((m.metrics[&Metric::TtftMean] - 80.0).abs() < 1e-9, "{:?}", m.metrics);
        // Both engines' observations: 24 s over 10 requests.
        assert!((m.metrics[&Metric::E2eMean] - 2400.0).abs() < 1e-9);
        assert!(from_prometheus("vllm:x_sum abc\n", None).unwrap_err().starts_with("line 1:"));
    }
}
