//! The recommend search over Planner settings: the `planner:` section of a recommend
//! configuration as Dynamo 1.6.1's Planner adapter reads it (`planner.md` §8;
//! `dynamo/planner/simulation/{config,provider,presets,load_predictor}.py`), expanded into the
//! list of concrete `planner:` sections the candidates take.
//!
//! Keys: `policy` (default both `disabled` and `enabled`), the four composite groups
//! `scaling_policy`, `fpm_sampling`, `load_sensitivity`, `load_predictor` (each `preset:
//! default` — every preset of the group, also when the group is absent —, a list of preset names
//! and custom mappings, or `preset: false` / `{}` with the group's independent knobs as domains),
//! `max_num_gpus` (8), `max_throughput_scaling_replicas` (8), `min_workers`,
//! `prefill_min_workers`, `decode_min_workers`. The Planner's target comes from
//! `optimization.target`. Scaling policies that use throughput scaling are kept only under an
//! `sla` target with both `ttft_ms` and `itl_ms`.
//!
//! Each point of the space is materialised as the adapter does (`materialize_replay`): policy
//! disabled, or a scaling policy that enables nothing, gives `{policy: disabled}`; otherwise the
//! policy's knobs, the FPM sampling (throughput scaling only), the load sensitivity (load
//! scaling only) and the load predictor the backtest chose for the policy's throughput interval
//! go through the Planner's own configuration (`servesim_planner::PlannerConfig`, its defaults
//! and checks), and the section written is every public field of the result — so
//! `predict -c` replays it as it stands. Points the configuration refuses are kept with their
//! reason (the reference marks them infeasible, `adapter_constraint`). Equal sections are
//! listed once, in the order first met (the space's dimensions in the adapter's order, the last
//! fastest).
//!
//! The load predictor is not a search dimension: for every throughput interval the candidates
//! use, a backtest over the trace's windows picks the preset with the lowest one-step-ahead
//! loss (`sweep_load_predictor`). servesim predicts with `constant` and `kalman` only, so the
//! ARIMA and Prophet presets of the default lists are skipped (still counted for the warmup, so
//! the losses of the others are the reference's), and naming one is an error.

use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};
use servesim_planner::config::{PlannerConfig, PredictorKind};

use crate::schema::Sla;
use crate::DeployError;

/// What the Planner's search depends on besides its own section.
pub struct Context<'a> {
    /// `optimization.target` and, for `pareto`, its objectives.
    pub target: &'a str,
    pub pareto_objectives: &'a [&'static str],
    pub sla: &'a Sla,
    pub disaggregated: bool,
    /// `traffic.source` as written (the backtest reads its trace).
    pub source: Option<&'a Value>,
    /// The directory relative trace paths start from.
    pub base_dir: &'a Path,
}

/// One concrete `planner:` section; `infeasible` says why the Planner refuses it.
#[derive(Clone, Debug, PartialEq)]
pub struct Setting {
    pub section: Value,
    pub infeasible: Option<String>,
}

/// The expanded search: the settings, and what the load-predictor backtest found (for the
/// recommendation's provenance; `None` when every candidate has the planner disabled).
#[derive(Clone, Debug)]
pub struct PlannerSearch {
    pub settings: Vec<Setting>,
    pub load_predictor: Option<Value>,
}

/// `(name, throughput scaling, load scaling, throughput interval, load interval)`.
type ScalingPreset = (&'static str, bool, bool, Option<i64>, Option<i64>);
const SCALING_POLICIES: [ScalingPreset; 7] = [
    ("disabled", false, false, None, None),
    ("throughput_180_5", true, false, Some(180), Some(5)),
    ("throughput_600_5", true, false, Some(600), Some(5)),
    ("load_180_5", false, true, Some(180), Some(5)),
    ("load_180_10", false, true, Some(180), Some(10)),
    ("hybrid_180_5", true, true, Some(180), Some(5)),
    ("hybrid_600_5", true, true, Some(600), Some(5)),
];

/// `(name, max_num_fpm_samples, fpm_sample_bucket_size)`.
const FPM_SAMPLING: [(&str, i64, i64); 4] =
    [("small", 32, 4), ("default", 64, 16), ("large", 128, 16), ("fine", 128, 64)];

/// `(name, load_scaling_down_sensitivity, load_min_observations)`.
const LOAD_SENSITIVITY: [(&str, i64, i64); 3] = [("aggressive", 70, 3), ("default", 80, 5), ("conservative", 90, 8)];

/// `(name, family, log1p, prophet window, kalman (q_level, q_trend, r, min_points))`.
type PredictorPreset = (&'static str, &'static str, bool, Option<i64>, Option<(f64, f64, f64, i64)>);
const LOAD_PREDICTOR_PRESETS: [PredictorPreset; 11] = [
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

const SCALING_KEYS: [&str; 4] = [
    "enable_throughput_scaling",
    "enable_load_scaling",
    "throughput_adjustment_interval_seconds",
    "load_adjustment_interval_seconds",
];
const FPM_KEYS: [&str; 2] = ["max_num_fpm_samples", "fpm_sample_bucket_size"];
const LOAD_KEYS: [&str; 2] = ["load_scaling_down_sensitivity", "load_min_observations"];
/// The predictor group's knobs in the adapter's order (its `type` is `load_predictor`).
const PREDICTOR_KEYS: [&str; 7] = [
    "load_predictor",
    "load_predictor_log1p",
    "prophet_window_size",
    "kalman_q_level",
    "kalman_q_trend",
    "kalman_r",
    "kalman_min_points",
];

/// The section's keys (`PlannerRecommendationConfig`).
const TOP_KEYS: [&str; 24] = [
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

/// The Planner configuration keys a candidate passes through unchanged, in the adapter's order.
const PASSTHROUGH: [&str; 16] = [
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

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Bool,
    PosInt,
    NonNegInt,
    PosFloat,
    /// A positive integer, or null among choices.
    OptPosInt,
    /// One of the predictor families.
    Family,
}

fn knob_kind(key: &str) -> Kind {
    match key {
        "enable_throughput_scaling" | "enable_load_scaling" | "load_predictor_log1p" => Kind::Bool,
        "load_scaling_down_sensitivity" | "min_workers" => Kind::NonNegInt,
        "kalman_q_level" | "kalman_q_trend" | "kalman_r" => Kind::PosFloat,
        "prefill_min_workers" | "decode_min_workers" => Kind::OptPosInt,
        "load_predictor" | "type" => Kind::Family,
        _ => Kind::PosInt,
    }
}

/// A value as Python's `repr` writes it (the reference's messages list values so).
fn py(v: &Value) -> String {
    match v {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => format!("'{s}'"),
        Value::Array(a) => format!("[{}]", a.iter().map(py).collect::<Vec<_>>().join(", ")),
        Value::Object(m) => {
            format!("{{{}}}", m.iter().map(|(k, v)| format!("'{k}': {}", py(v))).collect::<Vec<_>>().join(", "))
        }
    }
}

fn py_names(names: &[&str]) -> String {
    py(&Value::Array(names.iter().map(|s| json!(s)).collect()))
}

/// One value of a knob, checked (strict types, as the reference's models are).
fn one(path: &str, v: &Value, kind: Kind, in_choices: bool) -> Result<Value, DeployError> {
    let err = |m: &str| Err(DeployError::new(path, m));
    match kind {
        Kind::Bool => match v {
            Value::Bool(_) => Ok(v.clone()),
            _ => err("Input should be a valid boolean"),
        },
        Kind::Family => match v.as_str() {
            Some(s @ ("constant" | "arima" | "prophet" | "kalman")) => Ok(json!(s)),
            _ => err("Input should be 'constant', 'arima', 'prophet' or 'kalman'"),
        },
        Kind::PosFloat => match v.as_f64() {
            Some(x) if v.is_number() && x.is_finite() && x > 0.0 => Ok(json!(x)),
            Some(_) if v.is_number() => err("Input should be greater than 0"),
            _ => err("Input should be a valid number"),
        },
        Kind::OptPosInt if v.is_null() && in_choices => Ok(Value::Null),
        Kind::PosInt | Kind::NonNegInt | Kind::OptPosInt => match v.as_i64() {
            Some(x) if kind == Kind::NonNegInt && x < 0 => err("Input should be greater than or equal to 0"),
            Some(x) if kind != Kind::NonNegInt && x <= 0 => err("Input should be greater than 0"),
            Some(x) => Ok(json!(x)),
            None => err("Input should be a valid integer"),
        },
    }
}

/// A knob's domain as the adapter lists its values (`_public_values`): a value, `{choices}`
/// (nonempty, unique) or `{range: {min, max, step, scale}}` (integers: a linear range needs a
/// step, a log range lists every integer between the bounds; numbers: a log range its two
/// bounds, a linear one needs a step).
fn domain(path: &str, v: &Value, kind: Kind) -> Result<Vec<Value>, DeployError> {
    let Value::Object(m) = v else { return Ok(vec![one(path, v, kind, false)?]) };
    if m.len() == 1 && m.contains_key("choices") {
        let cpath = format!("{path}.choices");
        let items = m["choices"].as_array().ok_or_else(|| DeployError::new(&cpath, "Input should be a valid list"))?;
        if items.is_empty() {
            return Err(DeployError::new(cpath, "choices must be a nonempty list"));
        }
        let vals: Vec<Value> = items
            .iter()
            .enumerate()
            .map(|(i, x)| one(&format!("{cpath}[{i}]"), x, kind, true))
            .collect::<Result<_, _>>()?;
        if (1..vals.len()).any(|i| vals[..i].contains(&vals[i])) {
            return Err(DeployError::new(cpath, "choices must contain unique values"));
        }
        return Ok(vals);
    }
    if m.len() == 1 && m.contains_key("range") && !matches!(kind, Kind::Bool | Kind::Family) {
        let rpath = format!("{path}.range");
        let r = m["range"].as_object().ok_or_else(|| DeployError::new(&rpath, "Input should be a valid dictionary"))?;
        if let Some(k) = r.keys().find(|k| !matches!(k.as_str(), "min" | "max" | "step" | "scale")) {
            return Err(DeployError::new(format!("{rpath}.{k}"), "Extra inputs are not permitted"));
        }
        let scale = match r.get("scale") {
            None => "linear",
            Some(Value::String(s)) if s == "linear" || s == "log" => s.as_str(),
            Some(_) => return Err(DeployError::new(format!("{rpath}.scale"), "Input should be 'linear' or 'log'")),
        };
        let integer = kind != Kind::PosFloat;
        let bound = |k: &str| -> Result<f64, DeployError> {
            let x = r.get(k).ok_or_else(|| DeployError::new(format!("{rpath}.{k}"), "Field required"))?;
            match (integer, x.as_i64(), x.as_f64()) {
                (true, Some(i), _) => Ok(i as f64),
                (false, _, Some(f)) if x.is_number() && f.is_finite() => Ok(f),
                (true, _, _) => Err(DeployError::new(format!("{rpath}.{k}"), "Input should be a valid integer")),
                _ => Err(DeployError::new(format!("{rpath}.{k}"), "Input should be a finite number")),
            }
        };
        let (min, max) = (bound("min")?, bound("max")?);
        let step = match r.get("step") {
            None | Some(Value::Null) => None,
            Some(s) => match (integer, s.as_i64(), s.as_f64()) {
                (true, Some(i), _) if i > 0 => Some(i as f64),
                (false, _, Some(f)) if s.is_number() && f.is_finite() && f > 0.0 => Some(f),
                _ => return Err(DeployError::new(format!("{rpath}.step"), "Input should be greater than 0")),
            },
        };
        let pre = if integer { "integer " } else { "" };
        if min > max {
            return Err(DeployError::new(&rpath, "range requires min <= max"));
        }
        if scale == "log" {
            if min <= 0.0 {
                return Err(DeployError::new(&rpath, format!("{pre}log range requires min > 0")));
            }
            if step.is_some() {
                return Err(DeployError::new(&rpath, format!("{pre}log range rejects step")));
            }
            let ints = integer || (r["min"].is_i64() && r["max"].is_i64());
            if ints && max - min >= crate::recommend::MAX_DOMAIN_VALUES as f64 {
                return Err(crate::recommend::too_many_values(&rpath, max - min + 1.0));
            }
            return Ok(if ints {
                (min as i64..=max as i64).map(|i| num(i as f64, integer)).collect()
            } else {
                vec![json!(min), json!(max)]
            });
        }
        let Some(step) = step else {
            let msg = if integer {
                "integer linear range requires step"
            } else {
                "Planner independent numeric ranges require step"
            };
            return Err(DeployError::new(rpath, msg));
        };
        if (max - min) / step >= crate::recommend::MAX_DOMAIN_VALUES as f64 {
            return Err(crate::recommend::too_many_values(&rpath, ((max - min) / step).floor() + 1.0));
        }
        let mut vals = Vec::new();
        let mut x = min;
        while x <= max {
            vals.push(num(x, integer));
            x += step;
        }
        return Ok(vals);
    }
    Err(DeployError::new(path, "Planner domains must contain exactly choices or range"))
}

fn num(x: f64, integer: bool) -> Value {
    if integer {
        json!(x as i64)
    } else {
        json!(x)
    }
}

fn is_square(n: i64) -> bool {
    n >= 0 && {
        let r = (n as f64).sqrt().round() as i64;
        (r - 1..=r + 1).any(|k| k >= 0 && k * k == n)
    }
}

/// A group's `preset`.
#[derive(Clone, Debug)]
enum Preset {
    /// Every preset of the group (the group absent, or `preset: default`).
    Default {
        given: bool,
    },
    /// `preset: false` or `{}`: the independent knobs.
    Off,
    List(Vec<Value>),
}

struct Group {
    preset: Preset,
    /// `load_predictor.type`.
    family: Option<Value>,
}

fn read_group(name: &str, v: Option<&Value>) -> Result<Group, DeployError> {
    let path = format!("planner.{name}");
    let Some(v) = v else { return Ok(Group { preset: Preset::Default { given: false }, family: None }) };
    let m = v.as_object().ok_or_else(|| DeployError::new(&path, "Input should be a valid dictionary"))?;
    if let Some(k) = m.keys().find(|k| !matches!(k.as_str(), "preset" | "type")) {
        return Err(DeployError::new(format!("{path}.{k}"), "Extra inputs are not permitted"));
    }
    let family = match m.get("type").filter(|t| !t.is_null()) {
        None => None,
        Some(_) if name != "load_predictor" => {
            return Err(DeployError::new(
                format!("{path}.type"),
                "only planner.load_predictor takes a type (the predictor family)",
            ))
        }
        Some(t) => {
            domain(&format!("{path}.type"), t, Kind::Family)?;
            Some(t.clone())
        }
    };
    let ppath = format!("{path}.preset");
    let preset = match m.get("preset") {
        None => Preset::Default { given: true },
        Some(Value::String(s)) if s == "default" => Preset::Default { given: true },
        Some(Value::Bool(false)) => Preset::Off,
        Some(Value::Object(o)) if o.is_empty() => Preset::Off,
        Some(Value::Object(_)) => return Err(DeployError::new(ppath, "preset mapping must be empty to disable it")),
        Some(Value::Array(a)) if a.is_empty() => return Err(DeployError::new(ppath, "preset list must be nonempty")),
        Some(Value::Array(a)) => {
            for (i, e) in a.iter().enumerate() {
                if !(e.is_string() || e.is_object()) {
                    return Err(DeployError::new(
                        format!("{ppath}[{i}]"),
                        "Input should be a preset name or a mapping",
                    ));
                }
            }
            Preset::List(a.clone())
        }
        Some(_) => {
            return Err(DeployError::new(
                ppath,
                "Input should be 'default', false, {} or a list of presets and custom mappings",
            ))
        }
    };
    Ok(Group { preset, family })
}

/// Checks a group's preset list: names among the group's presets, custom mappings with exactly
/// the group's keys and valid values (`_validate_preset_entries` and the mapping models).
fn check_entries(group: &str, entries: &[Value]) -> Result<(), DeployError> {
    let (names, keys): (Vec<&str>, &[&str]) = match group {
        "scaling_policy" => (SCALING_POLICIES.iter().map(|p| p.0).collect(), &SCALING_KEYS),
        "fpm_sampling" => (FPM_SAMPLING.iter().map(|p| p.0).collect(), &FPM_KEYS),
        "load_sensitivity" => (LOAD_SENSITIVITY.iter().map(|p| p.0).collect(), &LOAD_KEYS),
        _ => (LOAD_PREDICTOR_PRESETS.iter().map(|p| p.0).collect(), &PREDICTOR_KEYS),
    };
    for (i, e) in entries.iter().enumerate() {
        let path = format!("planner.{group}.preset[{i}]");
        if let Some(s) = e.as_str() {
            if !names.contains(&s) {
                let mut allowed = names.clone();
                allowed.sort_unstable();
                return Err(DeployError::new(
                    path,
                    format!("{group}.preset has invalid choice '{s}'; allowed: {}", py_names(&allowed)),
                ));
            }
            continue;
        }
        let m = e.as_object().expect("checked when read");
        let mut unknown: Vec<&str> = m.keys().map(String::as_str).filter(|k| !keys.contains(k)).collect();
        let mut missing: Vec<&str> = keys.iter().copied().filter(|k| !m.contains_key(*k)).collect();
        let mut allowed = keys.to_vec();
        allowed.sort_unstable();
        unknown.sort_unstable();
        missing.sort_unstable();
        if !unknown.is_empty() {
            return Err(DeployError::new(
                path,
                format!(
                    "{group}.preset mapping has unknown keys {}; allowed: {}",
                    py_names(&unknown),
                    py_names(&allowed)
                ),
            ));
        }
        if !missing.is_empty() {
            return Err(DeployError::new(
                path,
                format!("{group}.preset mapping is missing required keys {}", py_names(&missing)),
            ));
        }
        for k in keys {
            let v = &m[*k];
            let kind = knob_kind(k);
            if v.is_null() && group == "scaling_policy" && k.ends_with("_interval_seconds") {
                continue;
            }
            let max100 = *k == "load_scaling_down_sensitivity" && v.as_i64().is_some_and(|x| x > 100);
            if max100 {
                return Err(DeployError::new(format!("{path}.{k}"), "Input should be less than or equal to 100"));
            }
            one(&format!("{path}.{k}"), v, kind, false)?;
        }
        if group == "scaling_policy" {
            let on = m["enable_throughput_scaling"] == true || m["enable_load_scaling"] == true;
            let intervals = !m["throughput_adjustment_interval_seconds"].is_null()
                || !m["load_adjustment_interval_seconds"].is_null();
            if !on && intervals {
                return Err(DeployError::new(path, "disabled scaling policy requires null adjustment intervals"));
            }
        }
        if group == "fpm_sampling" && !is_square(m["fpm_sample_bucket_size"].as_i64().unwrap_or(0)) {
            return Err(DeployError::new(path, "fpm_sample_bucket_size must be a perfect square"));
        }
    }
    Ok(())
}

/// The Planner target for an optimization target (`_planner_optimization_target`).
fn planner_target(target: &str, pareto_objectives: &[&str]) -> Result<&'static str, DeployError> {
    Ok(match target {
        "throughput" | "throughput_per_gpu" | "throughput_per_user" => "throughput",
        "ttft" | "e2e_latency" => "latency",
        "goodput" | "goodput_per_gpu" => "sla",
        "pareto" if pareto_objectives.iter().any(|o| matches!(*o, "goodput" | "goodput_per_gpu")) => "sla",
        "pareto" => "throughput",
        other => {
            return Err(DeployError::new(
                "planner",
                format!(
                    "optimization.target '{other}' has no Planner target (the Planner adapter maps throughput, \
                     throughput_per_gpu, throughput_per_user, ttft, e2e_latency, goodput, goodput_per_gpu and pareto)"
                ),
            ))
        }
    })
}

/// A scaling-policy entry's four fields (`scaling_fields`).
fn scaling_fields(entry: &Value) -> (bool, bool, Option<i64>, Option<i64>) {
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

fn pair_fields(table: &[(&str, i64, i64)], keys: [&str; 2], entry: &Value) -> Map<String, Value> {
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
struct Predictor {
    family: String,
    log1p: bool,
    prophet_window_size: i64,
    q_level: f64,
    q_trend: f64,
    r: f64,
    min_points: i64,
}

impl Predictor {
    fn of(entry: &Value) -> Predictor {
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

    fn supported(&self) -> bool {
        matches!(self.family.as_str(), "constant" | "kalman")
    }

    /// `minimum_data_points` of the family's predictor (the backtest's common warmup).
    fn min_points(&self) -> i64 {
        match self.family.as_str() {
            "constant" => 1,
            "kalman" => self.min_points,
            _ => 5,
        }
    }

    /// The Planner fields a winner sets (`predictor_fields`).
    fn fields(&self) -> Map<String, Value> {
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
    fn series(&self) -> servesim_planner::predict::Predictor {
        let cfg = PlannerConfig::from_json(&json!({
            "load_predictor": self.family,
            "load_predictor_log1p": self.log1p,
            "kalman_q_level": self.q_level,
            "kalman_q_trend": self.q_trend,
            "kalman_r": self.r,
            "kalman_min_points": self.min_points,
        }))
        .expect("predictor knobs are checked when read");
        servesim_planner::predict::Predictor::new(&cfg).expect("only supported families are evaluated")
    }
}

/// The product of `dims` (the last fastest) as value vectors.
fn product(dims: &[Vec<Value>]) -> Vec<Vec<Value>> {
    let mut out = vec![Vec::new()];
    for d in dims {
        let mut next = Vec::with_capacity(out.len() * d.len());
        for prefix in &out {
            for v in d {
                let mut p = prefix.clone();
                p.push(v.clone());
                next.push(p);
            }
        }
        out = next;
    }
    out
}

/// A group's independent mappings (`_independent_preset_mappings`): the product of its knobs'
/// domains, each knob the user left out taking the adapter's default list.
fn independent(keys: &[&str], given: &[Option<&Value>], defaults: &[Vec<Value>]) -> Result<Vec<Value>, DeployError> {
    let mut dims = Vec::new();
    for (j, k) in keys.iter().enumerate() {
        dims.push(match given[j] {
            Some(v) => {
                let path = if *k == "load_predictor" {
                    "planner.load_predictor.type".to_string()
                } else {
                    format!("planner.{k}")
                };
                domain(&path, v, knob_kind(k))?
            }
            None => defaults[j].clone(),
        });
    }
    Ok(product(&dims)
        .into_iter()
        .map(|combo| Value::Object(keys.iter().map(|k| k.to_string()).zip(combo).collect()))
        .collect())
}

fn vals(v: &[Value]) -> Vec<Value> {
    v.to_vec()
}

/// Reads the section and expands it (see the module documentation).
pub fn expand(section: &Value, ctx: &Context) -> Result<PlannerSearch, DeployError> {
    let m = section
        .as_object()
        .ok_or_else(|| DeployError::new("planner", "adapter section 'planner' must be a mapping"))?;
    for k in m.keys() {
        if !TOP_KEYS.contains(&k.as_str()) {
            let hint = match k.as_str() {
                "target" => " (recommend takes the Planner's target from optimization.target)",
                "min_num_gpus" => " (recommend searches with the Planner's default min_num_gpus, -1)",
                _ => "",
            };
            return Err(DeployError::new(format!("planner.{k}"), format!("Extra inputs are not permitted{hint}")));
        }
    }
    let get = |k: &str| m.get(k).filter(|v| !v.is_null());
    let groups = [
        ("scaling_policy", read_group("scaling_policy", get("scaling_policy"))?, &SCALING_KEYS[..]),
        ("fpm_sampling", read_group("fpm_sampling", get("fpm_sampling"))?, &FPM_KEYS[..]),
        ("load_sensitivity", read_group("load_sensitivity", get("load_sensitivity"))?, &LOAD_KEYS[..]),
        ("load_predictor", read_group("load_predictor", get("load_predictor"))?, &PREDICTOR_KEYS[1..]),
    ];
    // A group's independent knobs only with `preset: false` (`_validate_preset_conflicts`).
    for (name, g, knobs) in &groups {
        let mut given: Vec<&str> = knobs.iter().copied().filter(|k| get(k).is_some()).collect();
        given.sort_unstable();
        match &g.preset {
            Preset::Off => {}
            Preset::Default { given: false } if !given.is_empty() => {
                return Err(DeployError::new(
                    format!("planner.{name}"),
                    format!(
                        "planner.{name} uses the default preset and cannot be combined with independent knobs {}",
                        py_names(&given)
                    ),
                ))
            }
            preset => {
                let mut conflicts: Vec<String> = given.iter().map(|s| format!("'{s}'")).collect();
                if g.family.is_some() {
                    conflicts.push("'load_predictor.type'".into());
                }
                if !conflicts.is_empty() {
                    return Err(DeployError::new(
                        format!("planner.{name}"),
                        format!(
                            "planner.{name}.preset cannot be combined with independent knobs [{}]",
                            conflicts.join(", ")
                        ),
                    ));
                }
                if let Preset::List(entries) = preset {
                    check_entries(name, entries)?;
                }
            }
        }
    }
    // Every independent knob's domain, read once (types, choices, ranges).
    for k in TOP_KEYS.iter().skip(5).filter(|k| !matches!(**k, "max_throughput_scaling_replicas" | "max_num_gpus")) {
        if let Some(v) = get(k) {
            domain(&format!("planner.{k}"), v, knob_kind(k))?;
        }
    }
    if let Some(v) = get("load_scaling_down_sensitivity") {
        let values: Vec<i64> = match v.pointer("/range/max") {
            Some(max) => max.as_i64().into_iter().collect(),
            None => domain("planner.load_scaling_down_sensitivity", v, Kind::NonNegInt)?
                .iter()
                .filter_map(Value::as_i64)
                .collect(),
        };
        if values.iter().any(|&x| x > 100) {
            return Err(DeployError::new(
                "planner.load_scaling_down_sensitivity",
                "load_scaling_down_sensitivity must be <= 100",
            ));
        }
    }
    if let Some(v) = get("fpm_sample_bucket_size") {
        if let Some(r) = v.get("range") {
            let (min, max) = (r["min"].as_i64().unwrap_or(0), r["max"].as_i64().unwrap_or(-1));
            let step = r.get("step").and_then(Value::as_i64).unwrap_or(1).max(1) as usize;
            if !(min..=max).step_by(step).any(is_square) {
                return Err(DeployError::new(
                    "planner.fpm_sample_bucket_size",
                    "fpm_sample_bucket_size range contains no perfect squares",
                ));
            }
        } else {
            let values = domain("planner.fpm_sample_bucket_size", v, Kind::PosInt)?;
            if values.iter().any(|x| !is_square(x.as_i64().unwrap_or(0))) {
                return Err(DeployError::new(
                    "planner.fpm_sample_bucket_size",
                    "fpm_sample_bucket_size values must be perfect squares",
                ));
            }
        }
    }
    let positive = |k: &str| -> Result<i64, DeployError> {
        match get(k) {
            None => Ok(8),
            Some(v) => Ok(one(&format!("planner.{k}"), v, Kind::PosInt, false)?.as_i64().expect("an integer")),
        }
    };
    let max_num_gpus = positive("max_num_gpus")?;
    let max_replicas = positive("max_throughput_scaling_replicas")?;
    let policies: Vec<Value> = match get("policy") {
        None => vec![json!("disabled"), json!("enabled")],
        Some(v) => {
            let items: Vec<Value> = match v {
                Value::Object(o) if o.len() == 1 && o.contains_key("choices") => {
                    let c = o["choices"].as_array().cloned().unwrap_or_default();
                    if c.is_empty() {
                        return Err(DeployError::new("planner.policy.choices", "choices must be a nonempty list"));
                    }
                    if (1..c.len()).any(|i| c[..i].contains(&c[i])) {
                        return Err(DeployError::new("planner.policy.choices", "choices must contain unique values"));
                    }
                    c
                }
                other => vec![other.clone()],
            };
            let mut bad: Vec<Value> = items.iter().filter(|x| *x != "disabled" && *x != "enabled").cloned().collect();
            if !bad.is_empty() {
                bad.sort_by_key(py);
                return Err(DeployError::new(
                    "planner.policy",
                    format!("planner.policy choices must be disabled or enabled; got {}", py(&Value::Array(bad))),
                ));
            }
            items
        }
    };
    // The worker minimums (`_validate_public_fields`): role-specific ones only where there are
    // roles.
    let mut workers: Vec<(&str, Vec<Value>)> = Vec::new();
    for (k, min) in [("min_workers", 0), ("prefill_min_workers", 1), ("decode_min_workers", 1)] {
        let Some(v) = get(k) else { continue };
        if k != "min_workers" && !ctx.disaggregated {
            return Err(DeployError::new(
                format!("planner.{k}"),
                "applies to disaggregated engines only (use min_workers for an aggregated engine)",
            ));
        }
        // Scalars and choices are typed as the reference's models type them; a range may reach
        // below the minimum, which the adapter's own check names.
        let values = domain(&format!("planner.{k}"), v, knob_kind(k))?;
        let low: Vec<Value> = values.iter().filter(|x| x.as_i64().is_some_and(|x| x < min)).cloned().collect();
        if !low.is_empty() {
            return Err(DeployError::new(
                format!("planner.{k}"),
                format!("planner.{k} choices must be >= {min}; got {}", py(&Value::Array(low))),
            ));
        }
        workers.push((k, values));
    }
    // Predictors named explicitly must be ones servesim runs.
    let predictor_group = &groups[3].1;
    let unsupported = |path: String, what: &str| {
        DeployError::new(
            path,
            format!(
                "{what} is not supported by servesim: ARIMA and Prophet forecasts come from pmdarima / prophet fits \
                 that cannot be reproduced exactly; name constant or kalman predictors (the default lists skip them)"
            ),
        )
    };
    match &predictor_group.preset {
        Preset::List(entries) => {
            for (i, e) in entries.iter().enumerate() {
                let p = Predictor::of(e);
                if !p.supported() {
                    let what = match e.as_str() {
                        Some(s) => format!("load predictor preset '{s}'"),
                        None => format!("load_predictor '{}'", p.family),
                    };
                    return Err(unsupported(format!("planner.load_predictor.preset[{i}]"), &what));
                }
            }
        }
        Preset::Off => {
            if let Some(t) = &predictor_group.family {
                let families = domain("planner.load_predictor.type", t, Kind::Family)?;
                if let Some(f) = families.iter().find(|f| *f == "arima" || *f == "prophet") {
                    return Err(unsupported(
                        "planner.load_predictor.type".into(),
                        &format!("load_predictor '{}'", f.as_str().unwrap_or_default()),
                    ));
                }
            }
        }
        Preset::Default { .. } => {}
    }
    if policies.iter().all(|p| p == "disabled") {
        return Ok(PlannerSearch {
            settings: vec![Setting { section: json!({"policy": "disabled"}), infeasible: None }],
            load_predictor: None,
        });
    }
    let target = planner_target(ctx.target, ctx.pareto_objectives)?;
    // Each group's entries: its list, every preset, or its independent mappings.
    let bools = vec![json!(false), json!(true)];
    let entries = |i: usize| -> Result<Vec<Value>, DeployError> {
        let (name, g, _) = &groups[i];
        Ok(match (&g.preset, *name) {
            (Preset::List(e), _) => e.clone(),
            (Preset::Default { .. }, "scaling_policy") => SCALING_POLICIES.iter().map(|p| json!(p.0)).collect(),
            (Preset::Default { .. }, "fpm_sampling") => FPM_SAMPLING.iter().map(|p| json!(p.0)).collect(),
            (Preset::Default { .. }, "load_sensitivity") => LOAD_SENSITIVITY.iter().map(|p| json!(p.0)).collect(),
            (Preset::Default { .. }, _) => LOAD_PREDICTOR_PRESETS.iter().map(|p| json!(p.0)).collect(),
            (Preset::Off, "scaling_policy") => independent(
                &SCALING_KEYS,
                &SCALING_KEYS.map(get),
                &[bools.clone(), bools.clone(), vals(&[json!(180), json!(600)]), vals(&[json!(5), json!(10)])],
            )?,
            (Preset::Off, "fpm_sampling") => independent(
                &FPM_KEYS,
                &FPM_KEYS.map(get),
                &[vals(&[json!(32), json!(64), json!(128)]), vals(&[json!(4), json!(16), json!(64)])],
            )?
            .into_iter()
            .filter(|e| is_square(e["fpm_sample_bucket_size"].as_i64().unwrap_or(0)))
            .collect(),
            (Preset::Off, "load_sensitivity") => independent(
                &LOAD_KEYS,
                &LOAD_KEYS.map(get),
                &[vals(&[json!(70), json!(80), json!(90)]), vals(&[json!(3), json!(5), json!(8)])],
            )?,
            (Preset::Off, _) => {
                let mut given: Vec<Option<&Value>> = vec![g.family.as_ref()];
                given.extend(PREDICTOR_KEYS[1..].iter().map(|k| get(k)));
                independent(
                    &PREDICTOR_KEYS,
                    &given,
                    &[
                        vals(&[json!("constant"), json!("arima"), json!("prophet"), json!("kalman")]),
                        bools.clone(),
                        vals(&[json!(20), json!(50)]),
                        vals(&[json!(1.0), json!(10.0)]),
                        vals(&[json!(0.1), json!(1.0)]),
                        vals(&[json!(5.0), json!(10.0)]),
                        vals(&[json!(3), json!(5)]),
                    ],
                )?
            }
        })
    };
    // Throughput scaling needs the sla target with both token bounds (`_policy_filter`).
    let sla_ok = target == "sla" && ctx.sla.ttft_ms.is_some() && ctx.sla.itl_ms.is_some();
    let (kept, dropped): (Vec<Value>, Vec<Value>) =
        entries(0)?.into_iter().partition(|e| !scaling_fields(e).0 || sla_ok);
    if !dropped.is_empty() && matches!(groups[0].1.preset, Preset::List(_)) {
        return Err(DeployError::new(
            "planner.scaling_policy",
            format!(
                "Planner scaling_policy contains choices that are incompatible with the selected optimization \
                 target/SLA: {}",
                py(&Value::Array(dropped))
            ),
        ));
    }
    if kept.is_empty() {
        return Err(DeployError::new(
            "planner.scaling_policy",
            if target != "sla" {
                "every Planner scaling_policy enables throughput scaling, which requires a goodput target"
            } else {
                "Planner throughput scaling requires evaluation.sla.ttft_ms and evaluation.sla.itl_ms"
            },
        ));
    }
    let backtest = sweep_load_predictor(&kept, &entries(3)?, ctx)?;
    // The dimensions in the adapter's order; a group given as independent knobs is listed as
    // those knobs, after the others.
    let throughput = kept.iter().any(|e| scaling_fields(e).0);
    let load = kept.iter().any(|e| scaling_fields(e).1);
    let mut dims: Vec<(String, Vec<Value>)> = Vec::new();
    let mut knob_dims: Vec<(String, Vec<Value>)> = Vec::new();
    let mut add = |name: &str, i: usize, list: Vec<Value>| {
        if matches!(groups[i].1.preset, Preset::Off) {
            let keys: Vec<String> =
                list.first().and_then(Value::as_object).map(|o| o.keys().cloned().collect()).unwrap_or_default();
            for k in keys {
                let mut values: Vec<Value> = Vec::new();
                for e in &list {
                    if !values.contains(&e[&k]) {
                        values.push(e[&k].clone());
                    }
                }
                knob_dims.push((format!("{name}.{k}"), values));
            }
        } else {
            dims.push((name.to_string(), list));
        }
    };
    add("scaling_policy", 0, kept.clone());
    let mut plain: Vec<(String, Vec<Value>)> = vec![("policy".into(), policies)];
    if throughput {
        add("fpm_sampling", 1, entries(1)?);
    }
    if load {
        add("load_sensitivity", 2, entries(2)?);
    }
    // `dims` holds the groups in order; the policy goes right after the scaling policy.
    let mut ordered: Vec<(String, Vec<Value>)> = Vec::new();
    let mut rest = dims.into_iter();
    if !matches!(groups[0].1.preset, Preset::Off) {
        ordered.push(rest.next().expect("the scaling policy"));
    }
    ordered.append(&mut plain);
    ordered.extend(rest);
    for (k, values) in workers {
        ordered.push((k.to_string(), values));
    }
    ordered.extend(knob_dims);
    let names: Vec<String> = ordered.iter().map(|d| d.0.clone()).collect();
    let values: Vec<Vec<Value>> = ordered.into_iter().map(|d| d.1).collect();
    let mut settings: Vec<Setting> = Vec::new();
    for combo in product(&values) {
        let pick = |group: &str| -> Option<Value> {
            if let Some(j) = names.iter().position(|n| n == group) {
                return Some(combo[j].clone());
            }
            let prefix = format!("{group}.");
            let parts: Map<String, Value> = names
                .iter()
                .zip(&combo)
                .filter_map(|(n, v)| n.strip_prefix(&prefix).map(|k| (k.to_string(), v.clone())))
                .collect();
            (!parts.is_empty()).then_some(Value::Object(parts))
        };
        let s = materialize(&pick, target, ctx, max_num_gpus, max_replicas, &backtest.winners);
        if !settings.contains(&s) {
            settings.push(s);
        }
    }
    Ok(PlannerSearch { settings, load_predictor: Some(backtest.state) })
}

/// One point of the space as the adapter materialises it (`materialize_replay`,
/// `_planner_config_payload`, `_public_planner_config`).
fn materialize(
    pick: &dyn Fn(&str) -> Option<Value>,
    target: &str,
    ctx: &Context,
    max_num_gpus: i64,
    max_replicas: i64,
    winners: &[(i64, Predictor)],
) -> Setting {
    let disabled = Setting { section: json!({"policy": "disabled"}), infeasible: None };
    let scaling = pick("scaling_policy").expect("always a dimension");
    let (ets, els, ti, li) = scaling_fields(&scaling);
    if pick("policy").as_ref().and_then(Value::as_str) != Some("enabled") || !(ets || els) {
        return disabled;
    }
    let mut candidate = Map::new();
    candidate.insert("enable_throughput_scaling".into(), json!(ets));
    candidate.insert("enable_load_scaling".into(), json!(els));
    candidate.insert("throughput_adjustment_interval_seconds".into(), json!(ti));
    candidate.insert("load_adjustment_interval_seconds".into(), json!(li));
    candidate.insert("max_throughput_scaling_replicas".into(), json!(max_replicas));
    if ets {
        candidate.extend(pair_fields(&FPM_SAMPLING, FPM_KEYS, &pick("fpm_sampling").expect("a dimension")));
    }
    if els {
        candidate.extend(pair_fields(&LOAD_SENSITIVITY, LOAD_KEYS, &pick("load_sensitivity").expect("a dimension")));
    }
    if ets {
        if let Some((_, p)) = winners.iter().find(|(i, _)| Some(*i) == ti) {
            candidate.extend(p.fields());
        }
    }
    let mut payload = Map::new();
    payload.insert("mode".into(), json!(if ctx.disaggregated { "disagg" } else { "agg" }));
    payload.insert("optimization_target".into(), json!(target));
    for k in PASSTHROUGH {
        if let Some(v) = candidate.get(k) {
            if !(k.ends_with("_interval_seconds") && v.is_null()) {
                payload.insert(k.into(), v.clone());
            }
        }
    }
    payload.insert("max_gpu_budget".into(), json!(max_num_gpus));
    for (public, field) in [
        ("min_workers", "min_endpoint"),
        ("prefill_min_workers", "prefill_min_endpoint"),
        ("decode_min_workers", "decode_min_endpoint"),
    ] {
        if let Some(v) = pick(public).filter(|v| !v.is_null()) {
            payload.insert(field.into(), v);
        }
    }
    if target == "sla" {
        if let Some(t) = ctx.sla.ttft_ms {
            payload.insert("ttft_ms".into(), json!(t));
        }
        if let Some(t) = ctx.sla.itl_ms {
            payload.insert("itl_ms".into(), json!(t));
        }
    }
    let refused = |why: String| {
        let mut section = Map::new();
        section.insert("policy".into(), json!("enabled"));
        for (k, v) in &payload {
            let public = match k.as_str() {
                "mode" | "ttft_ms" | "itl_ms" => continue,
                "optimization_target" => "target",
                "max_gpu_budget" => "max_num_gpus",
                "min_endpoint" => "min_workers",
                "prefill_min_endpoint" => "prefill_min_workers",
                "decode_min_endpoint" => "decode_min_workers",
                other => other,
            };
            section.insert(public.into(), v.clone());
        }
        Setting { section: Value::Object(section), infeasible: Some(format!("Planner candidate: {why}")) }
    };
    let cfg = match PlannerConfig::from_json(&Value::Object(payload.clone())) {
        Ok(c) => c,
        Err(e) => return refused(e.to_string()),
    };
    for (key, on, given) in [
        ("throughput_adjustment_interval_seconds", cfg.enable_throughput_scaling, ti),
        ("load_adjustment_interval_seconds", cfg.enable_load_scaling, li),
    ] {
        if on && given.is_none() {
            return refused(format!("{key} cannot be null while its scaling mode is enabled"));
        }
    }
    if cfg.enable_throughput_scaling && (ctx.sla.ttft_ms.is_none() || ctx.sla.itl_ms.is_none()) {
        return refused("Planner throughput scaling requires evaluation.sla.ttft_ms and evaluation.sla.itl_ms".into());
    }
    Setting { section: public_section(&cfg), infeasible: None }
}

/// Every public field of a resolved configuration, under the section's names.
pub fn public_section(cfg: &PlannerConfig) -> Value {
    let family = match cfg.load_predictor {
        PredictorKind::Constant => "constant",
        PredictorKind::Arima => "arima",
        PredictorKind::Prophet => "prophet",
        PredictorKind::Kalman => "kalman",
    };
    let mut m = Map::new();
    m.insert("policy".into(), json!("enabled"));
    m.insert("enable_throughput_scaling".into(), json!(cfg.enable_throughput_scaling));
    m.insert("enable_load_scaling".into(), json!(cfg.enable_load_scaling));
    m.insert("throughput_adjustment_interval_seconds".into(), json!(cfg.throughput_adjustment_interval_seconds));
    m.insert("load_adjustment_interval_seconds".into(), json!(cfg.load_adjustment_interval_seconds));
    m.insert("max_throughput_scaling_replicas".into(), json!(cfg.max_throughput_scaling_replicas));
    m.insert("max_num_fpm_samples".into(), json!(cfg.max_num_fpm_samples));
    m.insert("fpm_sample_bucket_size".into(), json!(cfg.fpm_sample_bucket_size));
    m.insert("load_scaling_down_sensitivity".into(), json!(cfg.load_scaling_down_sensitivity));
    m.insert("load_min_observations".into(), json!(cfg.load_min_observations));
    m.insert("load_predictor".into(), json!(family));
    m.insert("load_predictor_log1p".into(), json!(cfg.load_predictor_log1p));
    m.insert("prophet_window_size".into(), json!(cfg.prophet_window_size));
    m.insert("kalman_q_level".into(), json!(cfg.kalman_q_level));
    m.insert("kalman_q_trend".into(), json!(cfg.kalman_q_trend));
    m.insert("kalman_r".into(), json!(cfg.kalman_r));
    m.insert("kalman_min_points".into(), json!(cfg.kalman_min_points));
    m.insert("target".into(), json!(cfg.optimization_target.name()));
    m.insert("max_num_gpus".into(), json!(cfg.max_gpu_budget));
    m.insert("min_num_gpus".into(), json!(cfg.min_gpu_budget));
    m.insert("min_workers".into(), json!(cfg.min_endpoint));
    if let Some(v) = cfg.prefill_min_endpoint {
        m.insert("prefill_min_workers".into(), json!(v));
    }
    if let Some(v) = cfg.decode_min_endpoint {
        m.insert("decode_min_workers".into(), json!(v));
    }
    Value::Object(m)
}

/// What the backtest chose: the winner per throughput interval and the state for the record.
struct Backtest {
    winners: Vec<(i64, Predictor)>,
    state: Value,
}

/// One aggregated traffic window: requests, mean ISL, mean OSL.
type Window = (f64, f64, f64);

/// The load-predictor backtest (`sweep_load_predictor`): per distinct throughput interval of
/// the kept policies, every supported candidate's mean one-step-ahead loss over the trace's
/// windows after the common warmup; the lowest wins (the first on ties), the first candidate
/// when none has a loss (or the traffic is not a Mooncake / Dynamo trace).
fn sweep_load_predictor(policies: &[Value], candidates: &[Value], ctx: &Context) -> Result<Backtest, DeployError> {
    let mut intervals: Vec<i64> = policies.iter().map(scaling_fields).filter(|f| f.0).filter_map(|f| f.2).collect();
    intervals.sort_unstable();
    intervals.dedup();
    let label = |i: usize| candidates[i].as_str().map_or_else(|| format!("custom_{i}"), str::to_string);
    let preds: Vec<Predictor> = candidates.iter().map(Predictor::of).collect();
    let skipped: Vec<Value> = (0..preds.len()).filter(|&i| !preds[i].supported()).map(|i| json!(label(i))).collect();
    let entry_of = |i: usize| candidates[i].clone();
    let Some(first) = (0..preds.len()).find(|&i| preds[i].supported()) else {
        return Err(DeployError::new("planner.load_predictor", "no constant or kalman load predictor to choose from"));
    };
    if intervals.is_empty() {
        return Ok(Backtest {
            winners: Vec::new(),
            state: json!({"best_by_interval": {}, "losses": {}, "reason": "no_throughput_scaling_candidate"}),
        });
    }
    let (rows, origin) = match trace_rows(ctx)? {
        Some(rows) => rows,
        None => {
            let best: Map<String, Value> = intervals.iter().map(|i| (i.to_string(), entry_of(first))).collect();
            return Ok(Backtest {
                winners: intervals.iter().map(|&i| (i, preds[first].clone())).collect(),
                state: json!({"best_by_interval": best, "losses": {}, "reason": "static_workload_configured_fallback",
                              "skipped": skipped}),
            });
        }
    };
    let warmup = preds.iter().map(Predictor::min_points).max().unwrap_or(0).max(0) as usize;
    let mut winners = Vec::new();
    let mut best_map = Map::new();
    let mut losses_map = Map::new();
    let mut fallback = Vec::new();
    for &interval in &intervals {
        let windows = build_windows(&rows, origin, interval);
        let mut losses = Map::new();
        let mut best: Option<(usize, f64)> = None;
        for (i, p) in preds.iter().enumerate() {
            if !p.supported() {
                continue;
            }
            let loss = evaluate(&windows, p, warmup);
            losses.insert(label(i), if loss.is_finite() { json!(loss) } else { Value::Null });
            if best.is_none_or(|(_, b)| loss < b) && loss.is_finite() {
                best = Some((i, loss));
            }
        }
        let w = match best {
            Some((i, _)) => i,
            None => {
                fallback.push(interval);
                first
            }
        };
        winners.push((interval, preds[w].clone()));
        best_map.insert(interval.to_string(), entry_of(w));
        losses_map.insert(interval.to_string(), Value::Object(losses));
    }
    let reason = if fallback.is_empty() {
        "swept".to_string()
    } else {
        format!(
            "swept; no_winner_configured_fallback@[{}]",
            fallback.iter().map(i64::to_string).collect::<Vec<_>>().join(", ")
        )
    };
    Ok(Backtest {
        winners,
        state: json!({"best_by_interval": best_map, "losses": losses_map, "reason": reason, "skipped": skipped}),
    })
}

/// The weighted one-step-ahead loss of one window (`window_loss`).
fn window_loss(n_hat: f64, i_hat: f64, o_hat: f64, w: Window) -> f64 {
    let e = |p: f64, a: f64| (p.max(0.0).ln_1p() - a.max(0.0).ln_1p()).abs();
    let (n_hat, i_hat, o_hat) = (n_hat.max(0.0), i_hat.max(0.0), o_hat.max(0.0));
    let (n, isl, osl) = w;
    0.4 * e(n_hat * i_hat, n * isl) + 0.4 * e(n_hat * o_hat, n * osl) + 0.1 * e(i_hat, isl) + 0.1 * e(o_hat, osl)
}

/// The mean loss of one predictor over the windows, forecasting before each window is observed
/// (`evaluate_preset`); infinite when no window counts.
fn evaluate(windows: &[Window], p: &Predictor, warmup: usize) -> f64 {
    let (mut n, mut i, mut o) = (p.series(), p.series(), p.series());
    let mut losses = Vec::new();
    for (k, w) in windows.iter().enumerate() {
        let (nh, ih, oh) = (n.predict_next(), i.predict_next(), o.predict_next());
        if k >= warmup {
            losses.push(window_loss(nh, ih, oh, *w));
        }
        n.add(w.0);
        i.add(w.1);
        o.add(w.2);
    }
    if losses.is_empty() {
        f64::INFINITY
    } else {
        exact_sum(&losses) / losses.len() as f64
    }
}

/// A sum without intermediate rounding (Shewchuk's partials, as Python's `math.fsum`).
fn exact_sum(xs: &[f64]) -> f64 {
    let mut partials: Vec<f64> = Vec::new();
    for &x0 in xs {
        let mut x = x0;
        let mut keep = Vec::with_capacity(partials.len() + 1);
        for &p in &partials {
            let (hi, lo) = if x.abs() < p.abs() { (p, x) } else { (x, p) };
            let s = hi + lo;
            let err = lo - (s - hi);
            if err != 0.0 {
                keep.push(err);
            }
            x = s;
        }
        keep.push(x);
        partials = keep;
    }
    partials.iter().sum()
}

/// The trace's windows of `interval_s` seconds from its first to its last (`_extract_metrics`):
/// requests, mean ISL and mean OSL per window, empty windows as zeros.
fn build_windows(rows: &[(f64, u64, u64)], origin: f64, interval_s: i64) -> Vec<Window> {
    let interval_ms = interval_s as f64 * 1000.0;
    let mut groups: std::collections::BTreeMap<i64, (u64, u64, u64)> = Default::default();
    for &(t, isl, osl) in rows {
        let index = ((t - origin) / interval_ms).floor() as i64;
        let g = groups.entry(index).or_default();
        g.0 += 1;
        g.1 += isl;
        g.2 += osl;
    }
    let (Some((&lo, _)), Some((&hi, _))) = (groups.first_key_value(), groups.last_key_value()) else {
        return Vec::new();
    };
    (lo..=hi)
        .map(|k| match groups.get(&k) {
            Some(&(n, isl, osl)) => (n as f64, isl as f64 / n as f64, osl as f64 / n as f64),
            None => (0.0, 0.0, 0.0),
        })
        .collect()
}

/// The trace's `(timestamp ms, input length, output length)` rows as the Planner's trace
/// utility reads them (`trace_data.py`): Mooncake rows, or the `request_end` events of a Dynamo
/// request trace, and the origin of their timestamps (0 for Mooncake, whose timestamps are
/// relative; the earliest for Dynamo's absolute ones). `None` when the traffic is not such a
/// trace.
#[allow(clippy::type_complexity)]
fn trace_rows(ctx: &Context) -> Result<Option<(Vec<(f64, u64, u64)>, f64)>, DeployError> {
    let Some(source) = ctx.source else { return Ok(None) };
    if source.get("type").and_then(Value::as_str) != Some("trace") {
        return Ok(None);
    }
    let format = source.get("format").and_then(Value::as_str).unwrap_or("mooncake");
    if format != "mooncake" && format != "dynamo" {
        return Ok(None);
    }
    let paths: Vec<&str> = source
        .get("paths")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut rows = Vec::new();
    for (k, p) in paths.iter().enumerate() {
        let full = if Path::new(p).is_absolute() { PathBuf::from(p) } else { ctx.base_dir.join(p) };
        let here = format!("traffic.source.paths[{k}]");
        let files =
            if full.is_dir() { jsonl_under(&full).map_err(|e| DeployError::new(&here, e))? } else { vec![full] };
        for f in files {
            read_rows(&f, format, &mut rows)
                .map_err(|e| DeployError::new(&here, format!("{e} (read by the planner's load-predictor backtest)")))?;
        }
    }
    let origin = if format == "dynamo" { rows.iter().map(|r| r.0).fold(f64::INFINITY, f64::min) } else { 0.0 };
    Ok(Some((rows, if origin.is_finite() { origin } else { 0.0 })))
}

/// The trace files under `dir`, sorted. Symbolic links are refused, as the trace readers refuse
/// them in a corpus: followed, a link to an ancestor would make the walk endless.
fn jsonl_under(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(&d).map_err(|e| format!("{}: cannot read: {e}", d.display()))?;
        for e in entries {
            let e = e.map_err(|e| format!("{}: cannot read: {e}", d.display()))?;
            let p = e.path();
            let ty = e.file_type().map_err(|e| format!("{}: {e}", p.display()))?;
            if ty.is_symlink() {
                return Err(format!("{}: a trace directory may not contain symbolic links", p.display()));
            }
            if ty.is_dir() {
                stack.push(p);
            } else if p
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(".jsonl") || n.ends_with(".jsonl.gz"))
            {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

fn read_rows(path: &Path, format: &str, rows: &mut Vec<(f64, u64, u64)>) -> Result<(), String> {
    let input = servesim_replay::input::TraceInput::open(path).map_err(|e| e.to_string())?;
    let mut lines = servesim_replay::input::Lines::open(&input).map_err(|e| e.to_string())?;
    while let Some(line) = lines.next_line() {
        let (n, bytes) = line.map_err(|e| e.to_string())?;
        let text = std::str::from_utf8(bytes).map_err(|_| format!("{}:{n}: not UTF-8", path.display()))?;
        if text.trim().is_empty() {
            continue;
        }
        let at = format!("{}:{n}", path.display());
        let v: Value = serde_json::from_str(text).map_err(|e| format!("Invalid JSON at {at}: {e}"))?;
        let record = v.as_object().ok_or_else(|| format!("Trace row at {at} must be a JSON object"))?;
        let event = match record.get("event") {
            Some(Value::Object(e)) => e,
            _ => record,
        };
        let number = |m: &Map<String, Value>, k: &str| -> Result<f64, String> {
            match m.get(k) {
                Some(Value::Number(x)) if x.as_f64().is_some_and(f64::is_finite) => Ok(x.as_f64().unwrap_or(0.0)),
                _ => Err(format!("{k} must be numeric at {at}")),
            }
        };
        let length = |m: &Map<String, Value>, k: &str| -> Result<u64, String> {
            m.get(k).and_then(Value::as_u64).ok_or_else(|| format!("{k} must be a non-negative integer at {at}"))
        };
        let dynamo = event.get("schema").and_then(Value::as_str) == Some("dynamo.request.trace.v1");
        if format == "dynamo" {
            let kind = event.get("event_type").and_then(Value::as_str);
            if kind.is_some() && kind != Some("request_end") {
                continue;
            }
            if !dynamo {
                return Err(format!("Mixed or unsupported warmup trace format at {at}: expected dynamo"));
            }
            if kind != Some("request_end") {
                continue;
            }
            let request = event
                .get("request")
                .and_then(Value::as_object)
                .ok_or_else(|| format!("request_end is missing request payload at {at}"))?;
            let replay = request
                .get("replay")
                .and_then(Value::as_object)
                .ok_or_else(|| format!("request payload is missing replay metrics at {at}"))?;
            let t = if request.get("request_received_ms").is_some_and(|v| !v.is_null()) {
                number(request, "request_received_ms")?
            } else {
                number(event, "event_time_unix_ms")?
            };
            rows.push((t, length(replay, "input_length")?, length(request, "output_tokens")?));
        } else {
            if dynamo || !["timestamp", "input_length", "output_length"].iter().all(|k| record.contains_key(*k)) {
                return Err(format!("Mixed or unsupported warmup trace format at {at}: expected mooncake"));
            }
            rows.push((
                number(record, "timestamp")?,
                length(record, "input_length")?,
                length(record, "output_length")?,
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_follow_the_planners_trace_utility() {
        // Mooncake: buckets from 0 (timestamps are relative), from the first non-empty one to
        // the last, empty ones as zeros.
        let rows = [(100_000.0, 100, 10), (200_000.0, 300, 30), (700_000.0, 50, 5)];
        let w = build_windows(&rows, 0.0, 180);
        assert_eq!(w, vec![(1.0, 100.0, 10.0), (1.0, 300.0, 30.0), (0.0, 0.0, 0.0), (1.0, 50.0, 5.0)]);
        // Dynamo: from the earliest request.
        let w = build_windows(&rows, 100_000.0, 180);
        assert_eq!(w, vec![(2.0, 200.0, 20.0), (0.0, 0.0, 0.0), (0.0, 0.0, 0.0), (1.0, 50.0, 5.0)]);
        assert!(build_windows(&[], 0.0, 60).is_empty());
    }

    #[test]
    fn the_loss_and_its_mean_are_the_backtests() {
        // A perfect forecast costs nothing; negative forecasts count as 0.
        assert_eq!(window_loss(3.0, 100.0, 10.0, (3.0, 100.0, 10.0)), 0.0);
        let l = window_loss(-1.0, -5.0, 10.0, (2.0, 100.0, 10.0));
        let want = 0.4 * (200.0f64).ln_1p() + 0.4 * (20.0f64).ln_1p() + 0.1 * (100.0f64).ln_1p();
        assert!((l - want).abs() < 1e-12, "{l} vs {want}");
        // The mean is taken over an exact sum.
        assert_eq!(exact_sum(&[1e16, 1.0, -1e16]), 1.0);
        assert_eq!(exact_sum(&[0.1; 10]), 1.0);
    }

    #[test]
    fn trace_rows_name_the_file_and_line_of_a_bad_row() {
        let dir = std::env::temp_dir().join(format!("servesim-planner-search-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("bad.jsonl");
        std::fs::write(&f, "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 2}\n\n{\"timestamp\": 5}\n")
            .unwrap();
        let source = json!({"type": "trace", "paths": ["bad.jsonl"], "format": "mooncake"});
        let sla = Sla::default();
        let ctx = Context {
            target: "goodput",
            pareto_objectives: &[],
            sla: &sla,
            disaggregated: false,
            source: Some(&source),
            base_dir: &dir,
        };
        let e = trace_rows(&ctx).unwrap_err();
        assert_eq!(e.key, "traffic.source.paths[0]");
        assert!(e.message.contains("bad.jsonl:3: expected mooncake"), "{e}");
        // Traffic that is not a Mooncake or Dynamo trace has no windows.
        let synthetic = json!({"type": "synthetic"});
        assert!(trace_rows(&Context { source: Some(&synthetic), ..ctx }).unwrap().is_none());
    }

    #[test]
    fn a_section_expands_to_resolved_public_sections() {
        let sla = Sla { ttft_ms: Some(500.0), itl_ms: Some(20.0), e2e_ms: None };
        let ctx = Context {
            target: "goodput_per_gpu",
            pareto_objectives: &[],
            sla: &sla,
            disaggregated: true,
            source: None,
            base_dir: Path::new("."),
        };
        let p = expand(
            &json!({"policy": "enabled", "scaling_policy": {"preset": ["throughput_600_5"]},
                    "fpm_sampling": {"preset": ["fine"]}, "load_predictor": {"preset": ["kalman_reactive_log1p"]},
                    "decode_min_workers": 2}),
            &ctx,
        )
        .unwrap();
        assert_eq!(p.settings.len(), 1);
        let s = &p.settings[0].section;
        assert_eq!(s["target"], "sla");
        assert_eq!((s["max_num_fpm_samples"].as_i64(), s["fpm_sample_bucket_size"].as_i64()), (Some(128), Some(64)));
        // A static workload: the list's first predictor.
        assert_eq!((s["load_predictor"].as_str(), s["load_predictor_log1p"].as_bool()), (Some("kalman"), Some(true)));
        assert_eq!(s["kalman_q_level"], 10.0);
        assert_eq!(s["decode_min_workers"], 2);
        assert!(s.get("prefill_min_workers").is_none());
        assert_eq!(p.load_predictor.unwrap()["reason"], "static_workload_configured_fallback");
        // The section reads back as the same Planner configuration.
        let cfg = PlannerConfig::from_json(&json!({
            "mode": "disagg", "optimization_target": "sla", "ttft_ms": 500.0, "itl_ms": 20.0,
            "enable_throughput_scaling": true, "enable_load_scaling": false,
            "throughput_adjustment_interval_seconds": 600, "load_adjustment_interval_seconds": 5,
            "max_num_fpm_samples": 128, "fpm_sample_bucket_size": 64, "load_predictor": "kalman",
            "load_predictor_log1p": true, "kalman_q_level": 10.0, "kalman_q_trend": 1.0, "kalman_r": 5.0,
            "kalman_min_points": 3, "decode_min_endpoint": 2,
        }))
        .unwrap();
        assert_eq!(public_section(&cfg), *s);
    }
}
