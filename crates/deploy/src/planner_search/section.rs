//! Reading the `planner:` section: what it is read against ([`Context`]), each knob's domain
//! (strict types, the adapter's messages), each composite group's `preset` or independent
//! knobs, and the Planner target an optimization target maps to.

use std::path::Path;

use serde_json::{json, Value};

use super::presets::{
    FPM_KEYS, FPM_SAMPLING, LOAD_KEYS, LOAD_PREDICTOR_PRESETS, LOAD_SENSITIVITY, PREDICTOR_KEYS, SCALING_KEYS,
    SCALING_POLICIES,
};
use crate::error::DeployError;
use crate::schema::Sla;

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

#[derive(Clone, Copy, PartialEq)]
pub(super) enum Kind {
    Bool,
    PosInt,
    NonNegInt,
    PosFloat,
    /// A positive integer, or null among choices.
    OptPosInt,
    /// One of the predictor families.
    Family,
}

pub(super) fn knob_kind(key: &str) -> Kind {
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
pub(super) fn py(v: &Value) -> String {
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

pub(super) fn py_names(names: &[&str]) -> String {
    py(&Value::Array(names.iter().map(|s| json!(s)).collect()))
}

/// One value of a knob, checked (strict types, as the reference's models are).
pub(super) fn one(path: &str, v: &Value, kind: Kind, in_choices: bool) -> Result<Value, DeployError> {
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
pub(super) fn domain(path: &str, v: &Value, kind: Kind) -> Result<Vec<Value>, DeployError> {
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
            if ints && max - min >= crate::recommend::limits::MAX_DOMAIN_VALUES as f64 {
                return Err(crate::recommend::limits::too_many_values(&rpath, max - min + 1.0));
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
        if (max - min) / step >= crate::recommend::limits::MAX_DOMAIN_VALUES as f64 {
            return Err(crate::recommend::limits::too_many_values(&rpath, ((max - min) / step).floor() + 1.0));
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

pub(super) fn is_square(n: i64) -> bool {
    n >= 0 && {
        let r = (n as f64).sqrt().round() as i64;
        (r - 1..=r + 1).any(|k| k >= 0 && k * k == n)
    }
}

/// A group's `preset`.
#[derive(Clone, Debug)]
pub(super) enum Preset {
    /// Every preset of the group (the group absent, or `preset: default`).
    Default {
        given: bool,
    },
    /// `preset: false` or `{}`: the independent knobs.
    Off,
    List(Vec<Value>),
}

pub(super) struct Group {
    pub(super) preset: Preset,
    /// `load_predictor.type`.
    pub(super) family: Option<Value>,
}

pub(super) fn read_group(name: &str, v: Option<&Value>) -> Result<Group, DeployError> {
    let path = format!("planner.{name}");
    let Some(v) = v else { return Ok(Group { preset: Preset::Default { given: false }, family: None }) };
    let m = v.as_object().ok_or_else(|| DeployError::new(&path, "Input should be a valid dictionary"))?;
    if let Some(k) = m.keys().find(|k| !matches!(k.as_str(), "preset" | "type")) {
        return Err(DeployError::new(format!("{path}.{k}"), "Extra inputs are not permitted"));
    }
    // Every group's control takes a predictor `type` (Dynamo's one `PresetControl` model); only
    // the load predictor's means something. The others' is dropped with a default or disabled
    // preset, and refused with a preset list (its search model forbids the extra key).
    let type_given = m.get("type").filter(|t| !t.is_null());
    if let Some(t) = type_given {
        domain(&format!("{path}.type"), t, Kind::Family)?;
    }
    let family = type_given.filter(|_| name == "load_predictor").cloned();
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
            if name != "load_predictor" && type_given.is_some() {
                return Err(DeployError::new(format!("{path}.type"), "Extra inputs are not permitted"));
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
pub(super) fn check_entries(group: &str, entries: &[Value]) -> Result<(), DeployError> {
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
pub(super) fn planner_target(target: &str, pareto_objectives: &[&str]) -> Result<&'static str, DeployError> {
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

/// The product of `dims` (the last fastest) as value vectors.
pub(super) fn product(dims: &[Vec<Value>]) -> Vec<Vec<Value>> {
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
pub(super) fn independent(
    keys: &[&str],
    given: &[Option<&Value>],
    defaults: &[Vec<Value>],
) -> Result<Vec<Value>, DeployError> {
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

pub(super) fn vals(v: &[Value]) -> Vec<Value> {
    v.to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Dynamo's four preset groups share one control model, `type` (a predictor family)
    /// included: the load predictor's chooses its family; the others' is validated and dropped,
    /// except beside a preset list, whose search model has no such key.
    #[test]
    fn every_group_takes_a_predictor_type() {
        let read = |name: &str, v: Value| read_group(name, Some(&v)).map_err(|e| e.to_string());
        for name in ["scaling_policy", "fpm_sampling", "load_sensitivity"] {
            let g = read(name, json!({"type": "arima"})).unwrap();
            assert!(g.family.is_none() && matches!(g.preset, Preset::Default { given: true }));
            let g = read(name, json!({"type": {"choices": ["kalman", "constant"]}, "preset": false})).unwrap();
            assert!(g.family.is_none() && matches!(g.preset, Preset::Off));
            let e = read(name, json!({"type": "arima", "preset": ["default"]})).err().unwrap();
            assert_eq!(e, format!("planner.{name}.type: Extra inputs are not permitted"));
            assert!(read(name, json!({"type": "lstm"})).is_err());
        }
        let g = read("load_predictor", json!({"type": "arima"})).unwrap();
        assert_eq!(g.family, Some(json!("arima")));
    }
}
