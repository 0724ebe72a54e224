//! The `planner:` adapter section mapped onto the Planner's configuration.

use serde_json::{json, Value};
use servesim_planner::PASSTHROUGH_KEYS;

use super::engine::{Engine, Mode};
use super::evaluation::Sla;
use super::worker::Worker;
use crate::error::DeployError;

/// The section's public names for the Planner's fields.
const PLANNER_RENAMES: &[(&str, &str)] = &[
    ("max_num_gpus", "max_gpu_budget"),
    ("min_num_gpus", "min_gpu_budget"),
    ("min_workers", "min_endpoint"),
    ("prefill_min_workers", "prefill_min_endpoint"),
    ("decode_min_workers", "decode_min_endpoint"),
];

/// The `planner:` section (aisimulate's Dynamo adapter, `planner.md` §8): `policy`, `target`,
/// the passthrough keys and the renames; `mode`, the SLA and the load thresholds are derived.
/// `None` when the policy is `disabled`.
pub(super) fn read_planner(
    v: &Value,
    engine: &Engine,
    sla: &Sla,
) -> Result<Option<servesim_planner::PlannerConfig>, DeployError> {
    let m = v.as_object().ok_or_else(|| DeployError::new("planner", "adapter section 'planner' must be a mapping"))?;
    let extra: Vec<String> = m
        .keys()
        .filter(|k| {
            !matches!(k.as_str(), "policy" | "target")
                && !PASSTHROUGH_KEYS.contains(&k.as_str())
                && !PLANNER_RENAMES.iter().any(|(public, _)| public == k)
        })
        .map(|k| format!("'{k}'"))
        .collect();
    if !extra.is_empty() {
        return Err(DeployError::new("planner", format!("Extra inputs are not permitted: [{}]", extra.join(", "))));
    }
    let policy = match m.get("policy") {
        None | Some(Value::Null) => "disabled",
        Some(Value::String(s)) if s == "disabled" || s == "enabled" => s.as_str(),
        Some(other) => {
            return Err(DeployError::new(
                "planner.policy",
                format!("Input should be 'disabled' or 'enabled', got {other}"),
            ))
        }
    };
    if policy == "disabled" {
        return Ok(None);
    }
    let target = match m.get("target") {
        None | Some(Value::Null) => "throughput",
        Some(Value::String(s)) if matches!(s.as_str(), "throughput" | "latency" | "sla" | "load") => s.as_str(),
        Some(_) => {
            return Err(DeployError::new("planner.target", "planner.target must be throughput, latency, sla, or load"))
        }
    };
    let mut out = serde_json::Map::new();
    let disagg = engine.mode == Mode::Disaggregated;
    out.insert("mode".into(), json!(if disagg { "disagg" } else { "agg" }));
    out.insert("optimization_target".into(), json!(target));
    for k in &PASSTHROUGH_KEYS {
        if let Some(v) = m.get(*k) {
            out.insert((*k).into(), v.clone());
        }
    }
    for (public, field) in PLANNER_RENAMES {
        if let Some(v) = m.get(*public) {
            out.insert((*field).into(), v.clone());
        }
    }
    let gpus =
        |w: &Option<Worker>| w.as_ref().map(|w| w.parallelism.tensor as u64 * w.parallelism.attention_data as u64);
    if disagg {
        out.insert("prefill_engine_num_gpu".into(), json!(gpus(&engine.prefill)));
        out.insert("decode_engine_num_gpu".into(), json!(gpus(&engine.decode)));
    } else {
        out.insert("decode_engine_num_gpu".into(), json!(gpus(&engine.aggregated)));
    }
    if target == "sla" {
        let throughput = m.get("enable_throughput_scaling").and_then(Value::as_bool).unwrap_or(true);
        match (sla.ttft_ms, sla.itl_ms) {
            (Some(ttft), Some(itl)) => {
                out.insert("ttft_ms".into(), json!(ttft));
                out.insert("itl_ms".into(), json!(itl));
            }
            _ if throughput => {
                return Err(DeployError::new(
                    "planner",
                    "Planner throughput scaling requires evaluation.sla.ttft_ms and evaluation.sla.itl_ms",
                ))
            }
            _ => {}
        }
    }
    if target == "load" {
        out.insert("decode_scale_up_kv_rate".into(), json!(90));
        out.insert("decode_scale_down_kv_rate".into(), json!(70));
        if disagg {
            out.insert("prefill_scale_up_queue_tokens".into(), json!(1));
            out.insert("prefill_scale_down_queue_tokens".into(), json!(0));
        }
    }
    let cfg = servesim_planner::PlannerConfig::from_json(&Value::Object(out)).map_err(|e| {
        // Report the user's key for a renamed field.
        let key = PLANNER_RENAMES.iter().find(|(_, f)| *f == e.path).map_or(e.path.as_str(), |(p, _)| *p);
        if key.is_empty() {
            DeployError::new("planner", e.message)
        } else {
            DeployError::new(format!("planner.{key}"), e.message)
        }
    })?;
    Ok(Some(cfg))
}
