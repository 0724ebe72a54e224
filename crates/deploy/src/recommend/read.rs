//! Reading a recommend configuration: the `optimization` and `optimizer` sections, each
//! worker role's searched knobs and parallel shapes, the router domains (Dynamo's router
//! adapter), the planner's (through [`crate::planner_search`]), and the reference's
//! KV-feasibility filter over the shapes.

use std::path::Path;

use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde_json::{json, Value};

use super::limits::{too_many_values, MAX_DOMAIN_VALUES, MAX_GRID_CANDIDATES, MAX_POOL_CANDIDATES};
use super::space::{get, Knob, Optimization, Optimizer, Search, Space};
use crate::error::DeployError;
use crate::reader::ErrAt;
use crate::schema;
use servesim_config::Reader;

pub const TARGETS: [&str; 9] = [
    "throughput",
    "throughput_per_gpu",
    "throughput_per_user",
    "goodput",
    "goodput_per_gpu",
    "min_gpus",
    "ttft",
    "e2e_latency",
    "pareto",
];

/// The router's recommend domains (Dynamo's router adapter): `policy` (default both),
/// `prefill_load_model.type` (default none and ais; none only for round_robin), and the kv_router
/// knobs `overlap_score_credit` (0, 0.5, 1), `prefill_load_scale` (0 ... 32) and `temperature`
/// (0, 0.2, 0.5, 1), each a number, `{choices}` or a stepped linear `{range}`. Returns the
/// concrete `router:` sections, round_robin first when searched, the kv_router knobs applying
/// only under kv_router.
fn router_settings(v: &Value) -> Result<Vec<Value>, DeployError> {
    let mut r = Reader::mapping("router", v)?;
    let strings = |path: String, v: Option<&Value>, allowed: &[&str], default: &[&str]| {
        let Some(v) = v else { return Ok(default.iter().map(|s| s.to_string()).collect::<Vec<_>>()) };
        let one = |p: &str, x: &Value| match x.as_str() {
            Some(s) if allowed.contains(&s) => Ok(s.to_string()),
            _ => Err(DeployError::new(p, format!("must be one of {}, got {x}", allowed.join(", ")))),
        };
        match v {
            Value::Object(m) if m.keys().eq(["choices"]) => {
                let items = m["choices"]
                    .as_array()
                    .ok_or_else(|| DeployError::new(format!("{path}.choices"), "must be a list"))?;
                if items.is_empty() {
                    return Err(DeployError::new(format!("{path}.choices"), "Router choices must be a nonempty list"));
                }
                let vals: Vec<String> = items
                    .iter()
                    .enumerate()
                    .map(|(i, x)| one(&format!("{path}.choices[{i}]"), x))
                    .collect::<Result<_, _>>()?;
                if (1..vals.len()).any(|i| vals[..i].contains(&vals[i])) {
                    return Err(DeployError::new(
                        format!("{path}.choices"),
                        "Router choices must contain unique values",
                    ));
                }
                Ok(vals)
            }
            Value::Object(_) => Err(DeployError::new(path, "a router domain is a value or {choices: [...]}")),
            x => Ok(vec![one(&path, x)?]),
        }
    };
    let policies = strings(
        "router.policy".into(),
        r.value("policy"),
        &["round_robin", "kv_router"],
        &["round_robin", "kv_router"],
    )?;
    let rr_only = policies == ["round_robin"];
    let load_models = match r.obj("prefill_load_model")? {
        Some(mut m) => {
            let here = m.path("type");
            let v =
                strings(here, m.value("type"), &["none", "ais"], if rr_only { &["none"] } else { &["none", "ais"] })?;
            m.finish()?;
            v
        }
        None if rr_only => vec!["none".to_string()],
        None => vec!["none".to_string(), "ais".to_string()],
    };
    let mut numeric = Vec::new();
    let mut given = Vec::new();
    for (key, default) in [
        ("overlap_score_credit", &[0.0, 0.5, 1.0][..]),
        ("prefill_load_scale", &[0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0][..]),
        ("temperature", &[0.0, 0.2, 0.5, 1.0][..]),
    ] {
        let path = format!("router.{key}");
        let value = r.value(key);
        if value.is_some() {
            given.push(key);
        }
        numeric.push(router_numbers(&path, key, value, default)?);
    }
    r.finish()?;
    if rr_only {
        if load_models != ["none"] {
            return Err(DeployError::new(
                "router.prefill_load_model.type",
                format!(
                    "router.policy=round_robin rejects prefill_load_model.type {load_models:?}; only 'none' is allowed"
                ),
            ));
        }
        if !given.is_empty() {
            return Err(DeployError::new(
                "router",
                format!("router.policy=round_robin rejects KV-router fields {given:?}").replace('"', "'"),
            ));
        }
    } else if policies.iter().any(|p| p == "round_robin") && !load_models.iter().any(|m| m == "none") {
        return Err(DeployError::new(
            "router.prefill_load_model.type",
            "router policy domain containing round_robin requires prefill_load_model.type to include none",
        ));
    }
    let mut out = Vec::new();
    for policy in &policies {
        if policy == "round_robin" {
            out.push(json!({"policy": "round_robin"}));
            continue;
        }
        for lm in &load_models {
            for &c in &numeric[0] {
                for &s in &numeric[1] {
                    for &t in &numeric[2] {
                        out.push(json!({
                            "policy": "kv_router",
                            "prefill_load_model": {"type": lm},
                            "overlap_score_credit": c,
                            "prefill_load_scale": s,
                            "temperature": t,
                        }));
                    }
                }
            }
        }
    }
    Ok(out)
}

/// One numeric router knob's values: a number ≥ 0, `{choices}` or `{range: {min, max, step}}`.
fn router_numbers(path: &str, key: &str, v: Option<&Value>, default: &[f64]) -> Result<Vec<f64>, DeployError> {
    let num = |p: &str, x: &Value| match x.as_f64() {
        Some(f) if f.is_finite() && f >= 0.0 && !x.is_boolean() => Ok(f),
        _ => Err(DeployError::new(p, format!("must be a finite number ≥ 0, got {x}"))),
    };
    let Some(v) = v else { return Ok(default.to_vec()) };
    match v {
        Value::Null => Err(DeployError::new(path, "Router numeric knobs do not accept null")),
        Value::Object(m) if m.keys().eq(["choices"]) => {
            let items =
                m["choices"].as_array().ok_or_else(|| DeployError::new(format!("{path}.choices"), "must be a list"))?;
            if items.is_empty() {
                return Err(DeployError::new(format!("{path}.choices"), "Router choices must be a nonempty list"));
            }
            let vals: Vec<f64> = items
                .iter()
                .enumerate()
                .map(|(i, x)| num(&format!("{path}.choices[{i}]"), x))
                .collect::<Result<_, _>>()?;
            if (1..vals.len()).any(|i| vals[..i].contains(&vals[i])) {
                return Err(DeployError::new(format!("{path}.choices"), "Router choices must contain unique values"));
            }
            Ok(vals)
        }
        Value::Object(m) if m.keys().eq(["range"]) => {
            let mut r = Reader::mapping(&format!("{path}.range"), &m["range"])?;
            let here = r.here().to_string();
            let min = r.number("min")?.ok_or_else(|| r.err("min", "missing (required)"))?;
            let max = r.number("max")?.ok_or_else(|| r.err("max", "missing (required)"))?;
            let step = r.number("step")?;
            let scale = r.one_of("scale", &["linear", "log"])?.unwrap_or("linear");
            r.finish()?;
            if !(min.is_finite() && max.is_finite() && min <= max) {
                return Err(DeployError::new(here, "Router range requires finite numeric min <= max"));
            }
            if min < 0.0 {
                return Err(DeployError::new(here, format!("router.{key} range requires min >= 0")));
            }
            if min == max {
                return Ok(vec![min]);
            }
            match step {
                Some(s) if s > 0.0 && s.is_finite() && scale == "linear" => {
                    // Decimal steps without drift: count the steps, then round each value.
                    let steps = ((max - min) / s + 1e-9).floor();
                    if steps >= MAX_DOMAIN_VALUES as f64 {
                        return Err(too_many_values(&here, steps + 1.0));
                    }
                    let n = steps as usize;
                    Ok((0..=n).map(|i| ((min + s * i as f64) * 1e12).round() / 1e12).collect())
                }
                _ => Err(DeployError::new(
                    here,
                    "Router numeric ranges require a stepped linear range (servesim searches a discrete set)",
                )),
            }
        }
        Value::Object(_) => Err(DeployError::new(path, "Router domains must contain exactly choices or range")),
        x => Ok(vec![num(path, x)?]),
    }
}

/// A positive integer knob's values. Values above `limit` are left out as they are generated
/// (a parallel size above the GPU budget can never fit it), so a range up to a billion costs
/// nothing when only the first few values can be used.
/// Returns the values and how many the domain holds in all (those above `limit` included).
fn domain(path: &str, v: &Value, limit: u64) -> Result<(Vec<u64>, u64), DeployError> {
    match v {
        Value::Number(n) => n
            .as_u64()
            .filter(|&x| x > 0)
            .map(|x| (if x <= limit { vec![x] } else { Vec::new() }, 1))
            .ok_or_else(|| DeployError::new(path, "must be a positive integer")),
        Value::Object(_) => {
            let mut o = Reader::mapping(path, v)?;
            let out = if let Some(c) = o.value("choices") {
                let items =
                    c.as_array().ok_or_else(|| DeployError::new(format!("{path}.choices"), "must be a list"))?;
                let mut vals = Vec::new();
                for (i, x) in items.iter().enumerate() {
                    let n = x.as_u64().filter(|&n| n > 0).ok_or_else(|| {
                        DeployError::new(format!("{path}.choices[{i}]"), "must be a positive integer")
                    })?;
                    if vals.contains(&n) {
                        return Err(DeployError::new(format!("{path}.choices"), "choices must be unique"));
                    }
                    vals.push(n);
                }
                if vals.is_empty() {
                    return Err(DeployError::new(format!("{path}.choices"), "choices must be non-empty"));
                }
                let all = vals.len() as u64;
                vals.retain(|&x| x <= limit);
                (vals, all)
            } else if let Some(mut r) = o.obj("range")? {
                let min = r.positive("min")?.ok_or_else(|| r.err("min", "missing (required)"))? as u64;
                let max = r.positive("max")?.ok_or_else(|| r.err("max", "missing (required)"))? as u64;
                let step = r.positive("step")?;
                let scale = r.one_of("scale", &["linear", "log"])?.unwrap_or("linear");
                r.finish()?;
                if min > max {
                    return Err(DeployError::new(format!("{path}.range"), "min <= max required"));
                }
                let mut vals = Vec::new();
                let all;
                match (scale, step) {
                    ("linear", None) => {
                        return Err(DeployError::new(format!("{path}.range"), "integer linear range requires step"))
                    }
                    ("log", Some(_)) => {
                        return Err(DeployError::new(format!("{path}.range"), "log ranges reject step"))
                    }
                    ("linear", Some(s)) => {
                        let top = max.min(limit);
                        if top >= min && (top - min) / s as u64 >= MAX_DOMAIN_VALUES {
                            return Err(too_many_values(&format!("{path}.range"), (top - min) / s as u64 + 1));
                        }
                        let mut x = min;
                        while x <= top {
                            vals.push(x);
                            x += s as u64;
                        }
                        all = (max - min) / s as u64 + 1;
                    }
                    _ => {
                        // Integer log range: powers of two between the bounds.
                        let mut x = min;
                        let mut n = 0;
                        while x <= max {
                            if x <= limit {
                                vals.push(x);
                            }
                            n += 1;
                            x *= 2;
                        }
                        all = n;
                    }
                }
                (vals, all)
            } else {
                return Err(DeployError::new(path, "a search domain is {choices: [...]} or {range: {...}}"));
            };
            o.finish()?;
            Ok(out)
        }
        _ => Err(DeployError::new(path, "must be a positive integer or a search domain")),
    }
}

fn read_optimization(o: Option<Reader>) -> Result<Optimization, DeployError> {
    let mut out = Optimization {
        target: "throughput",
        pareto_objectives: DEFAULT_PARETO_OBJECTIVES.to_vec(),
        strict_sla: false,
        min_gpus: 1,
        budget: 32,
        min_goodput_rps: None,
    };
    let Some(mut o) = o else { return Ok(out) };
    out.target = o.one_of("target", &TARGETS)?.unwrap_or("throughput");
    out.strict_sla = o.flag("strict_sla")?.unwrap_or(false);
    if let Some(h) = o.value("hardware") {
        if h.as_str().is_none_or(|s| s.is_empty() || s == "auto") {
            return Err(o.err("hardware", "optimization.hardware must be a concrete nonempty identifier"));
        }
    }
    if let Some(list) = o.value("pareto_objectives") {
        out.pareto_objectives = read_pareto_objectives(&o, out.target, list)?;
    }
    if let Some(mut c) = o.obj("constraints")? {
        out.min_gpus = c.positive("min_candidate_gpus")?.unwrap_or(1);
        out.budget = c.positive("max_candidate_gpus")?.unwrap_or(32);
        out.min_goodput_rps = c.nonneg("min_goodput_rps", false)?;
        let here = c.here().to_string();
        c.finish()?;
        if out.min_gpus > out.budget {
            return Err(DeployError::new(here, "min_candidate_gpus cannot exceed max_candidate_gpus"));
        }
        if out.min_goodput_rps.is_some() && out.target != "min_gpus" {
            return Err(DeployError::new(here, "min_goodput_rps is only supported with min_gpus"));
        }
    }
    o.finish()?;
    Ok(out)
}

/// The default Pareto pair (aisimulate's): throughput per GPU against per-user throughput.
pub const DEFAULT_PARETO_OBJECTIVES: [&str; 2] = ["throughput_per_gpu", "throughput_per_user"];

/// `optimization.pareto_objectives`: two or more distinct scalar targets, only with the
/// `pareto` target (aisimulate's rules and messages).
fn read_pareto_objectives(o: &Reader, target: &str, list: &Value) -> Result<Vec<&'static str>, DeployError> {
    let err = |msg: String| o.err("pareto_objectives", msg);
    let Some(items) = list.as_array() else {
        return Err(err(format!("must be a list of optimization targets, got {list}")));
    };
    let mut objectives = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let name = item.as_str().unwrap_or_default();
        match TARGETS.iter().find(|t| **t == name) {
            Some(t) => objectives.push(*t),
            None => {
                return Err(DeployError::new(
                    format!("{}[{i}]", o.path("pareto_objectives")),
                    format!("unknown optimization target {item}; expected one of {}", TARGETS.join(", ")),
                ))
            }
        }
    }
    if target != "pareto" {
        return Err(err("pareto_objectives is only valid when target is 'pareto'".into()));
    }
    if objectives.len() < 2 {
        return Err(err("a pareto goal needs at least 2 objectives".into()));
    }
    if objectives.contains(&"pareto") {
        return Err(err("pareto_objectives cannot contain 'pareto' itself (objectives must be scalar)".into()));
    }
    if objectives.contains(&"min_gpus") {
        return Err(err("min_gpus is a constrained scalar target, not a Pareto objective".into()));
    }
    let mut seen = objectives.clone();
    seen.sort_unstable();
    seen.dedup();
    if seen.len() != objectives.len() {
        let listed: Vec<String> = objectives.iter().map(|t| format!("'{t}'")).collect();
        return Err(err(format!("pareto_objectives must be distinct, got [{}]", listed.join(", "))));
    }
    Ok(objectives)
}

fn read_optimizer(o: Option<Reader>) -> Result<Optimizer, DeployError> {
    let mut out = Optimizer { algorithm: "grid", max_trials: 320, parallelism: 16, seed: 42 };
    let Some(mut o) = o else { return Ok(out) };
    out.algorithm = o.one_of("algorithm", &["grid", "random", "bayesian"])?.unwrap_or("grid");
    out.max_trials = o.positive("max_trials")?.unwrap_or(320);
    out.parallelism = o.positive("parallelism")?.unwrap_or(16);
    o.nonneg("candidate_timeout_seconds", true)?;
    out.seed = o.integer("seed")?.unwrap_or(42);
    o.finish()?;
    Ok(out)
}

/// Reads a recommend configuration and lists its candidates; `base_dir` is where relative trace
/// paths start (the planner's load-predictor backtest reads the trace).
pub fn read_search(root: &Value, base_dir: &Path) -> Result<Search, DeployError> {
    let mut top = Reader::mapping("", root)?;
    let optimization = read_optimization(top.obj("optimization")?)?;
    let optimizer = read_optimizer(top.obj("optimizer")?)?;
    drop(top);
    let mut base = root.clone();
    let obj = base.as_object_mut().expect("checked");
    obj.remove("optimization");
    obj.remove("optimizer");
    let planner_section = obj.remove("planner");
    let mode = get(&base, &["engine", "mode"]).and_then(Value::as_str).unwrap_or("aggregated").to_string();
    let roles: &[&str] = if mode == "disaggregated" { &["prefill", "decode"] } else { &["aggregated"] };
    // Per role: the parallel shapes (replicas, tp, dp) and the scheduler knobs.
    let mut role_shapes: Vec<Vec<(u64, u64, u64)>> = Vec::new();
    // How many shape sets the domains hold in all, over the budget or not.
    let mut shapes_in_all: u128 = 1;
    let mut knobs: Vec<Knob> = Vec::new();
    for role in roles {
        let wpath = ["engine", "workers", role];
        let par = get(&base, &[wpath[0], wpath[1], wpath[2], "parallelism"]).cloned();
        let ppath = format!("engine.workers.{role}.parallelism");
        let preset = match par.as_ref().and_then(|p| p.get("preset")) {
            None => true,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(DeployError::new(format!("{ppath}.preset"), "must be true or false")),
        };
        let explicit: Vec<&str> = ["replicas", "tensor", "attention_data"]
            .into_iter()
            .filter(|k| par.as_ref().and_then(|p| p.get(*k)).is_some())
            .collect();
        let shapes: Vec<(u64, u64, u64)> = if preset {
            if !explicit.is_empty() {
                return Err(DeployError::new(
                    &ppath,
                    "independent parallelism knobs cannot be combined with the default preset pool (set preset: false)",
                ));
            }
            let mut s = Vec::new();
            for g in [1u64, 2, 4, 8, 16] {
                for r in 1..=(optimization.budget as u64 / g) {
                    s.push((r, g, 1));
                }
            }
            s
        } else {
            let d = |k: &str| -> Result<(Vec<u64>, u64), DeployError> {
                match par.as_ref().and_then(|p| p.get(k)) {
                    Some(v) => domain(&format!("{ppath}.{k}"), v, optimization.budget as u64),
                    None => Ok((vec![1], 1)),
                }
            };
            let ((rs, rn), (ts, tn), (ds, dn)) = (d("replicas")?, d("tensor")?, d("attention_data")?);
            // Shapes with a size above the budget were never made: counted here.
            shapes_in_all = shapes_in_all.saturating_mul(rn as u128 * tn as u128 * dn as u128);
            let mut s = Vec::new();
            for &t in &ts {
                for &dp in &ds {
                    for &r in &rs {
                        s.push((r, t, dp));
                    }
                }
            }
            s
        };
        if let Some(p) = base.pointer_mut(&format!("/engine/workers/{role}/parallelism")).and_then(Value::as_object_mut)
        {
            p.remove("preset");
        }
        if preset {
            shapes_in_all = shapes_in_all.saturating_mul(shapes.len() as u128);
        }
        role_shapes.push(shapes);
        let (mbt, seqs): (&[u64], &[u64]) = match *role {
            "prefill" => (&[8192, 16384, 32768], &[1, 2, 4, 8, 16, 32, 64, 128, 256]),
            "decode" => (&[8192], &[256, 512, 1024]),
            _ => (&[8192, 16384, 32768], &[256, 512, 1024]),
        };
        for (key, default) in [("max_batched_tokens", mbt), ("max_sequences", seqs)] {
            let kpath = ["engine", "workers", role, "scheduler", key];
            let values = match get(&base, &kpath) {
                Some(v) => domain(&kpath.join("."), v, u64::MAX)?.0,
                None => default.to_vec(),
            };
            let values = values.into_iter().map(|v| json!(v)).collect();
            knobs.push(Knob { path: kpath.iter().map(|s| s.to_string()).collect(), values });
        }
    }
    // Shapes across roles under the budget (disaggregated: every prefill/decode pair).
    // Shapes over the budget are dropped before any candidate is made of them (as the preset
    // pool never holds them): counted, never built, so a domain of a million replicas costs
    // no memory.
    let mut shape_sets: Vec<Vec<(u64, u64, u64)>> = vec![Vec::new()];
    for shapes in &role_shapes {
        let mut next = Vec::new();
        for prefix in &shape_sets {
            let used: u64 = prefix.iter().map(|(r, t, d)| r * t * d).sum();
            for s in shapes {
                let gpus = used.saturating_add(s.0.saturating_mul(s.1).saturating_mul(s.2));
                if gpus <= optimization.budget as u64 {
                    let mut v = prefix.clone();
                    v.push(*s);
                    next.push(v);
                }
            }
        }
        shape_sets = next;
    }
    let over_budget_shapes = shapes_in_all.saturating_sub(shape_sets.len() as u128);
    // Read on its own: the whole base does not read as a predict configuration while it still
    // holds search domains (every candidate is validated in full when it runs).
    let sla = match get(&base, &["evaluation", "sla"]) {
        Some(v) => schema::read_sla(Reader::mapping("evaluation.sla", v)?)?,
        None => schema::Sla::default(),
    };
    // Goodput counts only requests within the SLA: a goodput objective needs a bound.
    let effective: &[&str] =
        if optimization.target == "pareto" { &optimization.pareto_objectives } else { &[optimization.target] };
    let mut culprits: Vec<&str> =
        effective.iter().copied().filter(|t| matches!(*t, "goodput" | "goodput_per_gpu")).collect();
    culprits.sort_unstable();
    if !culprits.is_empty() && sla.ttft_ms.is_none() && sla.itl_ms.is_none() && sla.e2e_ms.is_none() {
        let listed: Vec<String> = culprits.iter().map(|t| format!("'{t}'")).collect();
        return Err(DeployError::new(
            "optimization",
            format!("[{}] require at least one SLA bound (set evaluation.sla)", listed.join(", ")),
        ));
    }
    // The router's domains, when the configuration has a `router:` section.
    let routers = match base.get("router") {
        Some(r) => router_settings(r)?,
        None => Vec::new(),
    };
    for role in roles {
        if let Some(p) = get(&base, &["engine", "workers", role, "parallelism"]) {
            if !p.is_object() {
                return Err(DeployError::new(format!("engine.workers.{role}.parallelism"), "must be a mapping"));
            }
        }
    }
    let shape_sets: Vec<Vec<(u64, u64, u64)>> = shape_sets
        .into_iter()
        .filter(|s| s.iter().map(|(r, t, d)| r * t * d).sum::<u64>() >= optimization.min_gpus as u64)
        .collect();
    // The planner's settings, when the configuration has a `planner:` section.
    let (planners, planner_backtest) = match planner_section {
        Some(section) => {
            let ctx = crate::planner_search::Context {
                target: optimization.target,
                pareto_objectives: &optimization.pareto_objectives,
                sla: &sla,
                disaggregated: mode == "disaggregated",
                source: get(&base, &["traffic", "source"]),
                base_dir,
            };
            let p = crate::planner_search::expand(&section, &ctx)?;
            (p.settings, p.load_predictor)
        }
        None => (Vec::new(), None),
    };
    let space = Space { base: base.clone(), roles: roles.to_vec(), shape_sets, knobs, routers, planners };
    let total = space.shape_sets.len() as u128
        * space.knobs.iter().map(|k| k.values.len() as u128).product::<u128>()
        * space.routers.len().max(1) as u128
        * space.planners.len().max(1) as u128;
    if total == 0 {
        return Err(DeployError::new(
            "optimization.constraints",
            format!(
                "no candidate fits the GPU budget of {} GPUs ({over_budget_shapes} parallel shapes over it)",
                optimization.budget
            ),
        ));
    }
    // A grid replays every candidate and the others choose from an index of the pool: past
    // these sizes the search could not finish, so it is refused before anything is built.
    let cap: u128 = if optimizer.algorithm == "grid" { MAX_GRID_CANDIDATES } else { MAX_POOL_CANDIDATES };
    if total > cap {
        return Err(DeployError::new(
            "optimizer",
            format!(
                "the search space holds {total} candidates within the GPU budget; {} searches at most {cap} \
                 (narrow the domains{})",
                if optimizer.algorithm == "grid" { "a grid" } else { "a search" },
                if optimizer.algorithm == "grid" {
                    ", or use algorithm random or bayesian with max_trials"
                } else {
                    ""
                }
            ),
        ));
    }
    let kv_short = kv_filter(&space);
    let budget = optimization.budget as u64;
    let per_shape = space.per_shape();
    let shapes_short = |s: usize| kv_short[s].is_some();
    let (selected, kv_excluded) = if optimizer.algorithm == "grid" {
        let marked =
            (0..space.shape_sets.len()).filter(|&s| shapes_short(s) && space.gpus(s * per_shape) <= budget).count()
                * per_shape;
        ((0..space.len()).collect::<Vec<_>>(), marked)
    } else {
        // Random and bayesian draw from the reference's pool: shapes within the budget whose KV
        // cache holds one longest sequence.
        let mut pool = Vec::new();
        let mut excluded = 0;
        for s in 0..space.shape_sets.len() {
            if space.gpus(s * per_shape) > budget {
                continue;
            }
            if shapes_short(s) {
                excluded += per_shape;
                continue;
            }
            pool.extend(s * per_shape..(s + 1) * per_shape);
        }
        if pool.is_empty() {
            let why = kv_short.iter().flatten().next().cloned().unwrap_or_default();
            return Err(DeployError::new(
                "optimization.constraints",
                if why.is_empty() {
                    format!("no candidate fits the GPU budget of {budget}")
                } else {
                    format!("no parallel config holds one longest sequence within {budget} GPUs ({why})")
                },
            ));
        }
        if optimizer.algorithm == "random" && (optimizer.max_trials as usize) < pool.len() {
            let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(optimizer.seed);
            pool.shuffle(&mut rng);
            pool.truncate(optimizer.max_trials as usize);
        }
        (pool, excluded)
    };
    let over_budget = u64::try_from(over_budget_shapes.saturating_mul(per_shape as u128)).unwrap_or(u64::MAX);
    Ok(Search {
        base,
        optimization,
        optimizer,
        sla,
        space,
        selected,
        kv_short,
        kv_excluded,
        over_budget,
        planner_backtest,
    })
}

/// The reference's KV-feasibility filter (`model_hw.parallel_configs_for`): a shape set is kept
/// when every role's KV cache, sized at the largest token budget its scheduler knob takes, holds
/// more tokens than one longest sequence (the context length). Per shape set: the reason when it
/// does not. Shapes whose capacity cannot be estimated here are kept (their trial says why).
fn kv_filter(space: &Space) -> Vec<Option<String>> {
    let mbt_max = |role: &str| {
        space
            .knobs
            .iter()
            .find(|k| k.path[2] == role && k.path[4] == "max_batched_tokens")
            .and_then(|k| k.values.iter().filter_map(Value::as_u64).max())
            .unwrap_or(8192)
    };
    let mut memo: std::collections::HashMap<(usize, u64, u64), Option<String>> = Default::default();
    let per_shape = space.per_shape();
    let mut out = Vec::with_capacity(space.shape_sets.len());
    for (s, shapes) in space.shape_sets.iter().enumerate() {
        let missing = shapes.iter().enumerate().any(|(j, &(_, t, d))| !memo.contains_key(&(j, t, d)));
        if missing {
            // The capacity depends on the engine alone (not on the planner settings).
            let mut tree = space.tree(s * per_shape);
            tree.as_object_mut().expect("a mapping").remove("planner");
            let config = schema::read_predict(&tree).ok();
            for (j, &(_, t, d)) in shapes.iter().enumerate() {
                if memo.contains_key(&(j, t, d)) {
                    continue;
                }
                let role = space.roles[j];
                let reason = config.as_ref().and_then(|c| {
                    let w = match role {
                        "prefill" => c.engine.prefill.as_ref(),
                        "decode" => c.engine.decode.as_ref(),
                        _ => c.engine.aggregated.as_ref(),
                    }?;
                    let (tokens, context) = crate::lower::kv_tokens(&c.engine, w, mbt_max(role))?;
                    (tokens <= context).then(|| {
                        format!(
                            "{role} worker tensor={t} attention_data={d}: KV cache holds {tokens} tokens, \
                             cannot hold one {context}-token sequence (context length; backend={})",
                            c.engine.backend
                        )
                    })
                });
                memo.insert((j, t, d), reason);
            }
        }
        out.push(shapes.iter().enumerate().find_map(|(j, &(_, t, d))| memo[&(j, t, d)].clone()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn router_domains_default_to_the_adapters() {
        let all = router_settings(&json!({})).unwrap();
        assert_eq!(all.len(), 1 + 2 * 3 * 9 * 4, "round_robin once, kv_router over its knobs");
        assert_eq!(all[0], json!({"policy": "round_robin"}));
        assert_eq!(router_settings(&json!({"policy": "round_robin"})).unwrap(), [json!({"policy": "round_robin"})]);
        let kv = router_settings(&json!({"policy": "kv_router", "prefill_load_model": {"type": "none"}})).unwrap();
        assert_eq!(kv.len(), 3 * 9 * 4);
        let stepped = router_settings(&json!({
            "policy": "kv_router", "prefill_load_model": {"type": "none"}, "overlap_score_credit": 1,
            "prefill_load_scale": 1, "temperature": {"range": {"min": 0.1, "max": 0.3, "step": 0.1}},
        }))
        .unwrap();
        let temps: Vec<f64> = stepped.iter().map(|r| r["temperature"].as_f64().unwrap()).collect();
        assert_eq!(temps, [0.1, 0.2, 0.3], "decimal steps without drift");
    }

    #[test]
    fn the_space_enumerates_shapes_then_knobs_then_routers() {
        let root = json!({
            "engine": {"model": "m", "hardware": "h", "workers": {"aggregated": {
                "parallelism": {"preset": false, "tensor": {"choices": [1, 2]}},
                "scheduler": {"max_batched_tokens": 8192, "max_sequences": {"choices": [64, 128]}},
            }}},
            "router": {"policy": {"choices": ["round_robin", "kv_router"]}, "prefill_load_model": {"type": "none"},
                       "overlap_score_credit": 1, "prefill_load_scale": 1, "temperature": {"choices": [0, 1]}},
        });
        let s = read_search(&root, Path::new(".")).unwrap();
        assert_eq!(s.space.len(), 2 * 2 * 3);
        assert_eq!(s.candidate_count(), 12);
        let knob = |i: usize, p: &str| s.candidate(i).unwrap().pointer(p).cloned().unwrap();
        assert_eq!(knob(0, "/engine/workers/aggregated/parallelism/tensor"), 1);
        assert_eq!(knob(6, "/engine/workers/aggregated/parallelism/tensor"), 2);
        assert_eq!(knob(3, "/engine/workers/aggregated/scheduler/max_sequences"), 128);
        assert_eq!(knob(1, "/router/temperature"), 0.0);
        assert_eq!(knob(2, "/router/temperature"), 1.0);
        assert!(s.candidate(0).unwrap()["engine"]["workers"]["aggregated"]["parallelism"].get("preset").is_none());
    }
}
