//! Reading a recommend configuration: the `optimization` and `optimizer` sections, each
//! worker role's searched knobs and parallel shapes, the router domains (Dynamo's router
//! adapter), the planner's (through [`crate::planner_search`]), and the reference's
//! KV-feasibility filter over the shapes.

use std::path::Path;

use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde_json::{json, Map, Value};

use super::limits::{
    decimal_steps, doublings, too_many_values, MAX_DOMAIN_VALUES, MAX_GRID_CANDIDATES, MAX_POOL_CANDIDATES,
};
use super::space::{get, Branch, Identity, Knob, Optimization, Optimizer, Sampled, Search, Shape, Space};
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
                Some(s) if s > 0.0 && s.is_finite() && scale == "linear" => decimal_steps(&here, min, max, s),
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

/// What the reference checks of the SLA-bound targets before it searches: `strict_sla` and
/// `min_gpus` need an SLA bound, and `min_gpus` a fixed synthetic load (a concurrency, or a rate
/// with a goodput floor it can reach), since its score is the fewest GPUs that carry that load.
fn check_sla_targets(base: &Value, optimization: &Optimization, sla: &schema::Sla) -> Result<(), DeployError> {
    let bounded = sla.ttft_ms.is_some() || sla.itl_ms.is_some() || sla.e2e_ms.is_some();
    if optimization.strict_sla && !bounded {
        return Err(DeployError::new(
            "optimization.strict_sla",
            "optimization.strict_sla requires at least one evaluation.sla bound",
        ));
    }
    if optimization.target != "min_gpus" {
        return Ok(());
    }
    if !bounded {
        return Err(DeployError::new(
            "optimization.target",
            "optimization target 'min_gpus' requires an evaluation.sla bound",
        ));
    }
    let fixed = || DeployError::new("traffic", "min_gpus requires fixed synthetic request-rate or concurrency traffic");
    if get(base, &["traffic", "source", "type"]).and_then(Value::as_str) != Some("synthetic") {
        return Err(fixed());
    }
    let load = get(base, &["traffic", "load"]);
    let kind = load.and_then(|l| l.get("type")).and_then(Value::as_str).unwrap_or_default();
    let field = if kind == "concurrency" { "concurrency" } else { "requests_per_second" };
    let value = load.and_then(|l| l.get(field)).and_then(Value::as_f64);
    let Some(value) = value.filter(|_| matches!(kind, "concurrency" | "constant_rate" | "poisson")) else {
        return Err(fixed());
    };
    if kind != "concurrency" {
        match optimization.min_goodput_rps {
            None => {
                return Err(DeployError::new(
                    "optimization.constraints.min_goodput_rps",
                    "min_gpus with request-rate traffic requires constraints.min_goodput_rps",
                ))
            }
            Some(floor) if floor > value => {
                return Err(DeployError::new(
                    "optimization.constraints.min_goodput_rps",
                    "min_goodput_rps cannot exceed the offered request rate",
                ))
            }
            Some(_) => {}
        }
    }
    Ok(())
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
                        vals.extend(doublings(min, max.min(limit)));
                        all = doublings(min, max).count() as u64;
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
    // Candidates are made by writing into these mappings.
    let present = |path: &[&str]| get(&base, path).filter(|v| !v.is_null());
    if present(&["engine"]).is_none() {
        return Err(DeployError::new("engine", "missing (required: model, hardware and workers)"));
    }
    for (path, v) in [("engine", present(&["engine"])), ("engine.workers", present(&["engine", "workers"]))] {
        if v.is_some_and(|v| !v.is_object()) {
            return Err(DeployError::new(path, "must be a mapping"));
        }
    }
    // `engine.hardware: auto` is the one SKU `optimization.hardware` names (validated above).
    if let Some(h) = base.pointer_mut("/engine/hardware").filter(|h| h.as_str() == Some("auto")) {
        match root.pointer("/optimization/hardware").filter(|v| !v.is_null()) {
            Some(sku) => *h = sku.clone(),
            None => {
                return Err(DeployError::new(
                    "engine.hardware",
                    "engine.hardware='auto' requires one optimization.hardware",
                ))
            }
        }
    }
    // Read on its own: the whole base does not read as a predict configuration while it still
    // holds search domains (every candidate is validated in full when it runs).
    let sla = match get(&base, &["evaluation", "sla"]) {
        Some(v) => schema::read_sla(Reader::mapping("evaluation.sla", v)?)?,
        None => schema::Sla::default(),
    };
    check_sla_targets(&base, &optimization, &sla)?;
    // The traffic load's domains, searched after each mode's worker knobs; a KV-relative load
    // is sized per candidate when it runs.
    let load_knobs = super::load::load_knobs(&base, optimizer.algorithm == "random")?;
    let speculation = match get(&base, &["engine"]) {
        Some(engine) => crate::schema::speculation::check_in_recommend(engine)?,
        None => None,
    };
    // The engine's identity domains: the reference searches both modes and both of vLLM and
    // SGLang when they are omitted.
    let (modes, mode_searched) =
        identity_domain(&base, "mode", &["aggregated", "disaggregated", "afd"], &["aggregated", "disaggregated"])?;
    if modes.contains(&"afd") && modes.len() > 1 {
        return Err(DeployError::new(
            "engine.mode",
            "AFD recommendation mode cannot be mixed with aggregated/disaggregated modes",
        ));
    }
    let (backends, backend_searched) =
        identity_domain(&base, "backend", &["vllm", "sglang", "trtllm"], &["vllm", "sglang"])?;
    let backend_versions = backend_versions(&base, &backends)?;
    if modes == ["afd"] {
        // An image workload needs an encoder pool or a host worker; AFD has neither.
        if super::vl::native_images(&base) {
            super::vl::check(&base, &modes, &backends)?;
        }
        // The AFD topology search (recommend/afd.rs).
        let identity = Identity { write_mode: mode_searched, write_backend: backend_searched, prune_roles: false };
        let planner = planner_section.is_some();
        // AFD draws grid indexes only (afd.rs says why a range sampled by value is not).
        let load_knobs = super::load::load_knobs(&base, false)?;
        return super::afd::read_search(
            base,
            optimization,
            optimizer,
            &backends,
            backend_versions,
            identity,
            load_knobs,
            planner,
        );
    }
    // Host offload is vLLM's: the reference wants the backend (and the mode) pinned, not searched.
    let offloading = ["aggregated", "prefill", "decode"]
        .iter()
        .any(|role| get(&base, &["engine", "workers", role, "kv_cache", "host_offload"]).is_some_and(|v| !v.is_null()));
    // The recurrent-state cache is a prediction feature in the reference (its recommendation
    // kv_cache schema refuses the key before anything else is read).
    for role in ["aggregated", "prefill", "decode"] {
        if get(&base, &["engine", "workers", role, "kv_cache", "state_cache"]).is_some_and(|v| !v.is_null()) {
            return Err(DeployError::new(
                format!("engine.workers.{role}.kv_cache.state_cache"),
                "state_cache currently supports prediction only; recommendation is not supported",
            ));
        }
    }
    if offloading && modes.len() > 1 {
        return Err(DeployError::new(
            "engine.mode",
            "host_offload recommendation requires concrete mode=aggregated or mode=disaggregated",
        ));
    }
    if speculation.is_some() && backends != ["vllm"] {
        // Each candidate's predict schema checks the rest (host offload, nextn).
        return Err(DeployError::new(
            "engine.speculation",
            "ngram speculation requires vllm aggregated/disaggregated language workers",
        ));
    }
    if offloading && backends != ["vllm"] {
        return Err(DeployError::new("engine.backend", "host_offload recommendation requires concrete backend=vllm"));
    }
    if modes.len() > 1 {
        // A single mode's roles are checked by the predict schema on the first candidate.
        let has = |role: &str| get(&base, &["engine", "workers", role]).is_some();
        if !has("aggregated") {
            return Err(DeployError::new("engine.workers", "aggregated mode requires workers.aggregated"));
        }
        if !has("prefill") || !has("decode") {
            return Err(DeployError::new("engine.workers", "disaggregated mode requires prefill and decode workers"));
        }
    }
    // Host-aware workers and native VL (recommend/vl.rs): the reference's gates, the Dynamo
    // stack's refusal, and the tower's settings pinned on every candidate.
    super::vl::check(&base, &modes, &backends)?;
    super::vl::check_stack(&base, planner_section.is_some())?;
    super::vl::pin_vision(&mut base);
    let moe_known = model_moe(&base);
    let moe = moe_known.unwrap_or(false);
    // Per mode: its roles, shape sets and knobs, and the shape sets over the budget.
    let mut per_mode: Vec<(&'static str, &'static [&'static str], ModeSpace)> = Vec::new();
    let mut over_budget_sets: u128 = 0;
    for &mode in &modes {
        let roles: &'static [&'static str] =
            if mode == "disaggregated" { &["prefill", "decode"] } else { &["aggregated"] };
        let space = read_mode(&base, roles, &optimization, moe, optimizer.algorithm == "random")?;
        over_budget_sets = over_budget_sets.saturating_add(space.over);
        per_mode.push((mode, roles, space));
    }
    if let Some(role) = per_mode.iter().find_map(|(.., s)| s.filtered_empty) {
        if per_mode.iter().all(|(.., s)| s.shape_sets.is_empty()) {
            let skipped: Vec<String> = per_mode
                .iter()
                .map(|(mode, ..)| format!("'{}'", if *mode == "disaggregated" { "disagg" } else { "agg" }))
                .collect();
            let pool = if moe {
                "an MoE model's legal shapes are TEP, DEP, MoE-TP and DTP"
            } else {
                "a dense model's legal shapes are plain tensor parallelism, without attention data parallelism"
            };
            return Err(DeployError::new(
                format!("engine.workers.{role}.parallelism"),
                format!(
                    "no deployment_mode has a viable parallel config (skipped [{}]); check backends / model / \
                     hardware / gpu_budget={} (the independent knobs admit no legal shape; {pool}, \
                     with 1 to 16 GPUs per worker and pipeline 1)",
                    skipped.join(", "),
                    optimization.budget
                ),
            ));
        }
    }
    for &(_, roles, ..) in &per_mode {
        for role in roles {
            if let Some(p) =
                base.pointer_mut(&format!("/engine/workers/{role}/parallelism")).and_then(Value::as_object_mut)
            {
                p.remove("preset");
            }
        }
    }
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
    // An encoder pool's catalog, one more knob of each branch (recommend/epd.rs).
    let encoders = super::epd::read(&base, root, &optimization, &sla, &backends)?;
    // The router's domains, when the configuration has a `router:` section.
    let routers = match base.get("router") {
        Some(r) => router_settings(r)?,
        None => Vec::new(),
    };
    for &(_, roles, ..) in &per_mode {
        for role in roles {
            if let Some(p) = get(&base, &["engine", "workers", role, "parallelism"]) {
                if !p.is_object() {
                    return Err(DeployError::new(format!("engine.workers.{role}.parallelism"), "must be a mapping"));
                }
            }
        }
    }
    // The branches: mode-major, then backend; the planner's settings (a `planner:` section)
    // per mode, since the disaggregated ones take per-role worker minimums.
    let mut branches = Vec::new();
    let mut planner_backtest = None;
    let mut start = 0usize;
    let nr = routers.len().max(1);
    let mut over_budget: u128 = 0;
    for (m, (mode, roles, ModeSpace { shape_sets, over, knobs: mut mode_knobs, .. })) in
        per_mode.into_iter().enumerate()
    {
        mode_knobs.extend(load_knobs.iter().cloned());
        let (planners, planner_grid) = match &planner_section {
            Some(section) => {
                let ctx = crate::planner_search::Context {
                    target: optimization.target,
                    pareto_objectives: &optimization.pareto_objectives,
                    sla: &sla,
                    disaggregated: mode == "disaggregated",
                    source: get(&base, &["traffic", "source"]),
                    base_dir,
                };
                let p = crate::planner_search::expand(section, &ctx)?;
                if m == 0 {
                    planner_backtest = p.load_predictor;
                }
                let at = |key: &str| root.as_object().and_then(|o| o.keys().position(|k| k == key));
                let mut grid = p.grid;
                grid.before_router = at("planner") < at("router");
                (p.settings, grid)
            }
            None => Default::default(),
        };
        for &backend in &backends {
            let mut knobs = mode_knobs.clone();
            knobs.extend(encoders.as_ref().map(|c| c.knob(backend)));
            // A backend without an encoder pool under the budget has no branch (the reference
            // drops it from the mode's backends; another backend has one, checked when read).
            if encoders.as_ref().is_some_and(|c| c.knob(backend).values.is_empty()) {
                continue;
            }
            let per_shape: u128 = knobs.iter().map(|k| k.values.len() as u128).product::<u128>()
                * nr as u128
                * planners.len().max(1) as u128;
            // A language shape over the budget is pruned before any pool is laid beside it (as
            // the reference prunes its parallel configs before it adds the encoder choices):
            // one exclusion per shape and language knob setting, not one per pool.
            let pools = encoders.as_ref().map_or(1, |c| c.knob(backend).values.len().max(1) as u128);
            over_budget = over_budget.saturating_add(over.saturating_mul(per_shape / pools));
            branches.push(Branch {
                mode,
                backend,
                roles: roles.to_vec(),
                shape_sets: shape_sets.clone(),
                knobs: knobs.clone(),
                planners: planners.clone(),
                planner_grid: planner_grid.clone(),
                start,
            });
            // Sizes past usize are refused below before anything indexes them.
            start = start.saturating_add(usize::try_from(shape_sets.len() as u128 * per_shape).unwrap_or(usize::MAX));
        }
    }
    let identity =
        Identity { write_mode: mode_searched, write_backend: backend_searched, prune_roles: modes.len() > 1 };
    let space = Space { base: base.clone(), identity, backend_versions, branches, routers };
    let total: u128 = (0..space.branches.len())
        .map(|b| {
            let br = &space.branches[b];
            br.shape_sets.len() as u128
                * br.knobs.iter().map(|k| k.values.len() as u128).product::<u128>()
                * nr as u128
                * br.planners.len().max(1) as u128
        })
        .sum();
    if total == 0 {
        return Err(DeployError::new(
            "optimization.constraints",
            format!(
                "no candidate fits the GPU budget of {} GPUs ({over_budget_sets} parallel shapes over it)",
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
    let set_gpus = |b: usize, s: usize| space.branches[b].shape_sets[s].iter().map(Shape::gpus).sum::<u64>();
    let mut random_draw = None;
    let mut random_plan = None;
    let (selected, kv_excluded) = if optimizer.algorithm == "grid" {
        let mut marked = 0;
        for (b, short) in kv_short.iter().enumerate() {
            marked += (0..short.len()).filter(|&s| short[s].is_some() && set_gpus(b, s) <= budget).count()
                * space.per_shape(b);
        }
        ((0..space.len()).collect::<Vec<_>>(), marked)
    } else {
        // Random and bayesian draw from the reference's pool: shapes within the budget whose KV
        // cache holds one longest sequence. Random splits its trials over the modes that have
        // one as the reference's branches do (the first ones one more when they do not divide).
        let mut pools: Vec<Vec<usize>> = vec![Vec::new(); modes.len()];
        let mut excluded = 0;
        for (b, br) in space.branches.iter().enumerate() {
            let m = modes.iter().position(|x| *x == br.mode).expect("a searched mode");
            let per_shape = space.per_shape(b);
            for (s, short) in kv_short[b].iter().enumerate() {
                if set_gpus(b, s) > budget {
                    continue;
                }
                if short.is_some() {
                    excluded += per_shape;
                    continue;
                }
                let first = br.start + s * per_shape;
                pools[m].extend(first..first + per_shape);
            }
        }
        if pools.iter().all(Vec::is_empty) {
            let why = kv_short.iter().flatten().flatten().next().cloned().unwrap_or_default();
            return Err(DeployError::new(
                "optimization.constraints",
                if why.is_empty() {
                    format!("no candidate fits the GPU budget of {budget}")
                } else {
                    format!("no parallel config holds one longest sequence within {budget} GPUs ({why})")
                },
            ));
        }
        // The modes with a candidate left (the reference skips a mode no backend can run).
        pools.retain(|p| !p.is_empty());
        let active = pools.len();
        if (optimizer.max_trials as usize) < active {
            return Err(DeployError::new(
                "optimizer.max_trials",
                format!("optimizer.max_trials must be at least the number of active deployment branches ({active})"),
            ));
        }
        let mut pool = Vec::new();
        if optimizer.algorithm != "random" {
            pool = pools.concat();
        } else {
            // The reference's own draw where the space maps onto it one-to-one (pyrandom.rs);
            // elsewhere a ChaCha12 shuffle per mode, and the provenance says why.
            match super::pyrandom::plan(&space, &pools, &optimizer, &optimization) {
                Ok(plan) => {
                    pool = plan.picks(&space).into_iter().map(|p| p.index).collect();
                    random_plan = Some(plan);
                    random_draw = Some(super::pyrandom::REFERENCE_DRAW.to_string());
                }
                Err(why) => {
                    if let Some(k) = space
                        .branches
                        .iter()
                        .flat_map(|b| &b.knobs)
                        .find(|k| matches!(k.sampled, Some(super::space::Sampled::Continuous { .. })))
                    {
                        return Err(DeployError::new(
                            format!("{}.range", k.path.join(".")),
                            format!(
                                "a continuous range is sampled by value in the reference's random draw, which this \
                                 search cannot take ({why}); give step, or choices"
                            ),
                        ));
                    }
                    random_draw = Some(format!("chacha12 (not the reference's draw: {why})"));
                    let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(optimizer.seed);
                    let (each, extra) =
                        (optimizer.max_trials as usize / active, optimizer.max_trials as usize % active);
                    for (m, mut p) in pools.into_iter().enumerate() {
                        let take = each + usize::from(m < extra);
                        if take < p.len() {
                            p.shuffle(&mut rng);
                            p.truncate(take);
                        }
                        pool.extend(p);
                    }
                }
            }
        }
        (pool, excluded)
    };
    let over_budget = u64::try_from(over_budget).unwrap_or(u64::MAX);
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
        random_draw,
        random_plan,
    })
}

/// `engine.mode` or `engine.backend` of a recommend configuration: a value, `{choices: [...]}`,
/// or omitted (the reference's default domain). Returns the values and whether candidates must
/// state them (a domain, or omitted).
fn identity_domain(
    base: &Value,
    key: &'static str,
    allowed: &[&'static str],
    default: &[&'static str],
) -> Result<(Vec<&'static str>, bool), DeployError> {
    let path = format!("engine.{key}");
    let pick = |p: &str, x: &Value| {
        x.as_str()
            .and_then(|s| allowed.iter().find(|a| **a == s).copied())
            .ok_or_else(|| DeployError::new(p, format!("unknown value {x}; expected one of {}", allowed.join(", "))))
    };
    match get(base, &["engine", key]) {
        None => Ok((default.to_vec(), true)),
        Some(Value::Object(m)) if m.keys().eq(["choices"]) => {
            let items =
                m["choices"].as_array().ok_or_else(|| DeployError::new(format!("{path}.choices"), "must be a list"))?;
            if items.is_empty() {
                return Err(DeployError::new(format!("{path}.choices"), "choices must be non-empty"));
            }
            let mut vals = Vec::new();
            for (i, x) in items.iter().enumerate() {
                let v = pick(&format!("{path}.choices[{i}]"), x)?;
                if vals.contains(&v) {
                    return Err(DeployError::new(format!("{path}.choices"), "choices must be unique"));
                }
                vals.push(v);
            }
            Ok((vals, true))
        }
        Some(Value::Object(_)) => {
            Err(DeployError::new(path, format!("a {key} domain is a value or {{choices: [...]}}")))
        }
        Some(x) => Ok((vec![pick(&path, x)?], false)),
    }
}

/// `engine.backend_version` as a mapping from backend to version (recommend only): its keys must
/// be searched backends; a backend it does not name resolves the latest version.
fn backend_versions(base: &Value, backends: &[&str]) -> Result<Option<Map<String, Value>>, DeployError> {
    let Some(Value::Object(m)) = get(base, &["engine", "backend_version"]) else { return Ok(None) };
    let mut unknown: Vec<&str> = m.keys().map(String::as_str).filter(|k| !backends.contains(k)).collect();
    unknown.sort_unstable();
    if !unknown.is_empty() {
        return Err(DeployError::new(
            "engine.backend_version",
            format!("backend_version contains unconfigured backend(s): {unknown:?}").replace('"', "'"),
        ));
    }
    for (k, v) in m {
        if v.as_str().is_none_or(str::is_empty) {
            return Err(DeployError::new(format!("engine.backend_version.{k}"), "must be a nonempty string"));
        }
    }
    Ok(Some(m.clone()))
}

/// Whether the engine's model is a mixture of experts, MLA models included (its config in the
/// AIS data package); `None` when it cannot be read (the dense pool then applies, without the
/// dense-only rules, and the trials say what is missing).
fn model_moe(base: &Value) -> Option<bool> {
    let model = get(base, &["engine", "model"]).and_then(Value::as_str)?;
    let paths: Vec<String> = get(base, &["engine", "systems_paths"])
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default();
    let roots = servesim_perf::systems::systems_roots(&paths).ok()?;
    let roots: Vec<std::path::PathBuf> = roots.into_iter().map(|(p, _)| p).collect();
    let spec = servesim_perf::model::ModelSpec::load(model, &roots).ok()?;
    Some(spec.family != servesim_perf::model::Family::Dense)
}

/// GPUs per worker in the default pool (aisimulate's `parallel_enum`).
const POOL_GPUS_PER_WORKER: [u64; 5] = [1, 2, 4, 8, 16];

/// One worker's shapes at `g` GPUs in the default pool (pipeline 1): a dense model's plain TP;
/// an MoE model's pure patterns with tp × dp = moe_tp × moe_ep = g — TEP (tensor attention,
/// expert-parallel MoE), DEP (data-parallel attention, expert-parallel MoE), MoE-TP and DTP
/// (tensor-parallel MoE under tensor or data-parallel attention), and at one GPU the identity.
/// The reference's per-backend filters (no tp and dp both above 1 on TensorRT-LLM, no MoE-TP
/// with SGLang's EP-only MoE kernels, no mixed MoE widths on vLLM) remove none of these.
fn pool_worker_shapes(moe: bool, g: u64) -> Vec<Shape> {
    if !moe {
        return vec![Shape::tp(1, g, 1)];
    }
    let ladder: Vec<u64> = (0..8).map(|k| 1u64 << k).filter(|&v| v <= g).collect();
    let mut out = Vec::new();
    for &tp in &ladder {
        for &dp in &ladder {
            if tp * dp != g {
                continue;
            }
            for &mt in &ladder {
                for &me in &ladder {
                    if mt * me != g {
                        continue;
                    }
                    let identity = g == 1;
                    let expert = mt == 1 && me > 1 && ((tp > 1 && dp == 1) || (tp == 1 && dp > 1));
                    let moe_tp = mt > 1 && me == 1 && ((tp > 1 && dp == 1) || (tp == 1 && dp > 1));
                    if identity || expert || moe_tp {
                        out.push(Shape {
                            replicas: 1,
                            tensor: tp,
                            attention_data: dp,
                            pipeline: None,
                            moe: Some((mt, me)),
                        });
                    }
                }
            }
        }
    }
    out
}

/// The reference's legal parallel pool (`enumerate_worker_shapes` over 1 to 16 GPUs per worker,
/// with every replica count that fits the budget): what the default preset searches and what
/// independent knobs choose among.
fn legal_pool(moe: bool, budget: u64) -> Vec<Shape> {
    let mut s = Vec::new();
    for g in POOL_GPUS_PER_WORKER {
        for w in pool_worker_shapes(moe, g) {
            for r in 1..=(budget / g) {
                s.push(Shape { replicas: r, ..w });
            }
        }
    }
    s
}

/// One independent parallel knob's domain as the reference applies it to the legal pool: a log
/// range by its bounds (so `replicas: {range: {min: 1, max: 4, scale: log}}` admits 3), a choice
/// list or a stepped range by its values.
enum ParallelFilter {
    Values(Vec<u64>),
    Bounds(f64, f64),
}

impl ParallelFilter {
    /// The filter, and how many of the domain's values it names in all and how many of them
    /// are within the GPU budget (the rest no shape can take).
    fn read(path: &str, v: &Value, budget: u64) -> Result<(ParallelFilter, u64, u64), DeployError> {
        // Validated (and a stepped range materialised) as every integer domain is.
        let (values, all) = domain(path, v, budget)?;
        let within = values.len() as u64;
        let range = v.get("range");
        if range.and_then(|r| r.get("scale")).and_then(Value::as_str) == Some("log") {
            let bound = |k: &str| range.and_then(|r| r.get(k)).and_then(Value::as_f64).unwrap_or(1.0);
            return Ok((ParallelFilter::Bounds(bound("min"), bound("max")), all, within));
        }
        Ok((ParallelFilter::Values(values), all, within))
    }

    fn admits(&self, x: u64) -> bool {
        match self {
            ParallelFilter::Values(v) => v.contains(&x),
            ParallelFilter::Bounds(min, max) => (*min..=*max).contains(&(x as f64)),
        }
    }
}

/// Every role's shapes given as preset lists: each combination is a configuration the user
/// pinned, so one over the GPU budget is an error rather than a candidate left out (as the
/// reference refuses it).
fn pinned_within_budget(roles: &[&str], role_shapes: &[Vec<Shape>], budget: u64) -> Result<(), DeployError> {
    let describe = |s: &Shape| {
        let (mt, me) = s.moe.unwrap_or((1, 1));
        format!(
            "replicas={} tensor={} pipeline={} attention_data={} moe_tensor={mt} moe_expert={me}",
            s.replicas,
            s.tensor,
            s.pipeline.unwrap_or(1),
            s.attention_data
        )
    };
    let mut picks: Vec<Vec<(usize, Shape)>> = vec![Vec::new()];
    for shapes in role_shapes {
        picks = picks
            .into_iter()
            .flat_map(|p| {
                shapes.iter().enumerate().map(move |(i, s)| {
                    let mut v = p.clone();
                    v.push((i, *s));
                    v
                })
            })
            .collect();
    }
    for p in picks {
        let used: u64 = p.iter().map(|(_, s)| s.gpus()).sum();
        if used > budget {
            let (path, what) = if let [(i, s)] = p[..] {
                (format!("engine.workers.{}.parallelism.preset[{i}]", roles[0]), describe(&s))
            } else {
                let parts: Vec<String> =
                    roles.iter().zip(&p).map(|(r, (i, s))| format!("{r} preset[{i}] ({})", describe(s))).collect();
                ("engine.workers".to_string(), parts.join(" + "))
            };
            return Err(DeployError::new(
                path,
                format!(
                    "pinned parallel config {what}: used_gpus={used} exceeds gpu_budget={budget} \
                     (optimization.constraints.max_candidate_gpus in recommend); remove this preset or increase \
                     the GPU budget"
                ),
            ));
        }
    }
    Ok(())
}

/// The parallelism knobs a preset list entry covers (the reference's `_PARALLEL_KEYS`).
const PRESET_KEYS: [&str; 6] = ["replicas", "tensor", "pipeline", "attention_data", "moe_tensor", "moe_expert"];

/// A `parallelism.preset` list: concrete shapes, each entry covering exactly the six knobs
/// (the context-parallel keys may be present unset or at 1, as the reference's own dumps carry
/// them).
fn preset_list(ppath: &str, items: &[Value]) -> Result<Vec<Shape>, DeployError> {
    if items.is_empty() {
        return Err(DeployError::new(format!("{ppath}.preset"), "parallelism preset list must be nonempty"));
    }
    let mut out = Vec::new();
    for (i, entry) in items.iter().enumerate() {
        let here = format!("{ppath}.preset[{i}]");
        let Some(m) = entry.as_object() else {
            return Err(DeployError::new(here, format!("parallelism preset entry {i} must be a mapping")));
        };
        let optional = ["prefill_context", "decode_context"];
        let mut missing: Vec<&str> = PRESET_KEYS.iter().copied().filter(|k| !m.contains_key(*k)).collect();
        let mut unknown: Vec<&str> =
            m.keys().map(String::as_str).filter(|k| !PRESET_KEYS.contains(k) && !optional.contains(k)).collect();
        missing.sort_unstable();
        unknown.sort_unstable();
        if !missing.is_empty() || !unknown.is_empty() {
            return Err(DeployError::new(
                here,
                format!(
                    "parallelism preset entries must cover exactly all knobs; missing={missing:?}, unknown={unknown:?}"
                )
                .replace('"', "'"),
            ));
        }
        for k in optional {
            match m.get(k) {
                None | Some(Value::Null) => {}
                Some(v) if v.as_u64() == Some(1) => {}
                Some(v) => {
                    return Err(DeployError::new(
                        format!("{here}.{k}"),
                        format!(
                            "{k}={v} is not supported by recommend; context parallelism is a predict-only knob \
                             (use predict with a fixed parallelism)"
                        ),
                    ))
                }
            }
        }
        let n = |k: &str| {
            m[k].as_u64()
                .filter(|&x| x > 0)
                .ok_or_else(|| DeployError::new(format!("{here}.{k}"), "must be a positive integer"))
        };
        out.push(Shape {
            replicas: n("replicas")?,
            tensor: n("tensor")?,
            attention_data: n("attention_data")?,
            pipeline: Some(n("pipeline")?),
            moe: Some((n("moe_tensor")?, n("moe_expert")?)),
        });
    }
    Ok(out)
}

/// One mode's part of the space.
struct ModeSpace {
    /// Within the budget (disaggregated: every prefill/decode pair) and at least
    /// `min_candidate_gpus`.
    shape_sets: Vec<Vec<Shape>>,
    /// A role whose independent parallel knobs admit no shape of the legal pool.
    filtered_empty: Option<&'static str>,
    /// How many shape sets the domains hold over the budget.
    over: u128,
    knobs: Vec<Knob>,
}

/// One mode's roles read into their parallel shapes and scheduler knobs.
fn read_mode(
    base: &Value,
    roles: &[&'static str],
    optimization: &Optimization,
    moe: bool,
    random: bool,
) -> Result<ModeSpace, DeployError> {
    let mut filtered_empty = None;
    let budget = optimization.budget as u64;
    // Per role: the parallel shapes and the scheduler knobs.
    let mut role_shapes: Vec<Vec<Shape>> = Vec::new();
    // How many shape sets the domains hold in all, over the budget or not.
    let mut shapes_in_all: u128 = 1;
    let mut knobs: Vec<Knob> = Vec::new();
    // Roles whose shapes are a preset list: when every role's are, each combination is a
    // pinned configuration, and one over the budget is refused (the reference's rule).
    let mut listed_roles = 0;
    for role in roles {
        let par = get(base, &["engine", "workers", role, "parallelism"]).cloned();
        let ppath = format!("engine.workers.{role}.parallelism");
        let explicit: Vec<&str> =
            PRESET_KEYS.into_iter().filter(|k| par.as_ref().and_then(|p| p.get(*k)).is_some()).collect();
        let combined = || {
            DeployError::new(
                &ppath,
                "independent parallelism knobs cannot be combined with the default preset pool (set preset: false)",
            )
        };
        let listed = match par.as_ref().and_then(|p| p.get("preset")) {
            None | Some(Value::Bool(true)) => None,
            Some(Value::String(s)) if s == "default" => None,
            Some(Value::Bool(false)) => Some(None),
            Some(Value::Object(m)) if m.is_empty() => Some(None),
            Some(Value::Object(_)) => {
                return Err(DeployError::new(
                    format!("{ppath}.preset"),
                    "parallelism preset mapping must be empty to disable it",
                ))
            }
            Some(Value::Array(items)) => {
                if !explicit.is_empty() {
                    return Err(combined());
                }
                Some(Some(preset_list(&ppath, items)?))
            }
            Some(_) => {
                return Err(DeployError::new(
                    format!("{ppath}.preset"),
                    "must be default, false, {} or a list of parallel shapes",
                ))
            }
        };
        let shapes: Vec<Shape> = match listed {
            None => {
                if !explicit.is_empty() {
                    return Err(combined());
                }
                let s = legal_pool(moe, budget);
                shapes_in_all = shapes_in_all.saturating_mul(s.len() as u128);
                s
            }
            Some(Some(list)) => {
                listed_roles += 1;
                shapes_in_all = shapes_in_all.saturating_mul(list.len() as u128);
                list
            }
            Some(None) => {
                // The reference's independent knobs choose among the legal pool: a knob left out
                // takes any value, a value the pool lacks (tensor 3, attention data on a dense
                // model, a width past 16) names nothing.
                let mut filters = Vec::new();
                // Combinations of the knobs' values, and those with every value within the
                // budget: the others name shapes over it (counted, never built).
                let (mut named, mut within) = (1u128, 1u128);
                for key in PRESET_KEYS {
                    if let Some(v) = par.as_ref().and_then(|p| p.get(key)) {
                        let (f, all, fit) = ParallelFilter::read(&format!("{ppath}.{key}"), v, budget)?;
                        named = named.saturating_mul(all as u128);
                        within = within.saturating_mul(fit as u128);
                        filters.push((key, f));
                    }
                }
                let s: Vec<Shape> = legal_pool(moe, budget)
                    .into_iter()
                    .filter(|shape| filters.iter().all(|(key, f)| f.admits(shape.knob(key))))
                    .collect();
                if s.is_empty() {
                    filtered_empty = Some(*role);
                }
                let over_named = named.saturating_sub(within);
                shapes_in_all = shapes_in_all.saturating_mul((s.len() as u128).saturating_add(over_named));
                s
            }
        };
        role_shapes.push(shapes);
        let (mbt, seqs): (&[u64], &[u64]) = match *role {
            "prefill" => (&[8192, 16384, 32768], &[1, 2, 4, 8, 16, 32, 64, 128, 256]),
            "decode" => (&[8192], &[256, 512, 1024]),
            _ => (&[8192, 16384, 32768], &[256, 512, 1024]),
        };
        for (key, default) in [("max_batched_tokens", mbt), ("max_sequences", seqs)] {
            let kpath = ["engine", "workers", role, "scheduler", key];
            let values = match get(base, &kpath) {
                Some(v) => domain(&kpath.join("."), v, u64::MAX)?.0,
                None => default.to_vec(),
            };
            let values = values.into_iter().map(|v| json!(v)).collect();
            let mut knob = Knob::new(kpath.iter().map(|s| s.to_string()).collect(), values);
            knob.sampled = get(base, &kpath).and_then(integer_log_range).filter(|_| random);
            knobs.push(knob);
        }
    }
    // The KV cache's searched keys, per role after every role's scheduler knobs (the reference's
    // optional engine knobs); the KV filter judges a shape by their smallest values.
    for role in roles {
        for (kpath, integer) in [
            (&["engine", "workers", role, "kv_cache", "block_size"][..], true),
            (&["engine", "workers", role, "kv_cache", "capacity", "memory_fraction"][..], false),
        ] {
            let Some(v) = get(base, kpath).filter(|v| v.is_object()) else { continue };
            let path = kpath.join(".");
            let kpath: Vec<String> = kpath.iter().map(|s| s.to_string()).collect();
            let knob = if integer {
                let values = domain(&path, v, u64::MAX)?.0.into_iter().map(|v| json!(v)).collect();
                Knob { sampled: integer_log_range(v).filter(|_| random), ..Knob::new(kpath, values) }
            } else {
                match continuous_range(v).filter(|_| random) {
                    // Random search samples a continuous fraction by value (the reference's
                    // float range); its lower bound stands in for the KV filter.
                    Some(sampled @ Sampled::Continuous { min, .. }) => {
                        super::load::positive_numbers(&path, &json!({"choices": [min]}), false)?;
                        Knob { sampled: Some(sampled), ..Knob::new(kpath, vec![json!(min)]) }
                    }
                    _ => Knob::new(kpath, super::load::positive_numbers(&path, v, false)?),
                }
            };
            knobs.push(knob);
        }
    }
    // Shapes across roles under the budget (disaggregated: every prefill/decode pair).
    // Shapes over the budget are dropped before any candidate is made of them (as the preset
    // pool never holds them): counted, never built, so a domain of a million replicas costs
    // no memory.
    if listed_roles == roles.len() {
        pinned_within_budget(roles, &role_shapes, budget)?;
    }
    let mut shape_sets: Vec<Vec<Shape>> = vec![Vec::new()];
    for shapes in &role_shapes {
        let mut next = Vec::new();
        for prefix in &shape_sets {
            let used: u64 = prefix.iter().map(Shape::gpus).sum();
            for s in shapes {
                if used.saturating_add(s.gpus()) <= budget {
                    let mut v = prefix.clone();
                    v.push(*s);
                    next.push(v);
                }
            }
        }
        shape_sets = next;
    }
    let over = shapes_in_all.saturating_sub(shape_sets.len() as u128);
    let shape_sets = shape_sets
        .into_iter()
        .filter(|s| s.iter().map(Shape::gpus).sum::<u64>() >= optimization.min_gpus as u64)
        .collect();
    Ok(ModeSpace { shape_sets, over, knobs, filtered_empty })
}

/// An integer `{range: {min, max, scale: log}}` with distinct bounds (read and checked by
/// `domain`): random search samples every integer between them.
fn integer_log_range(v: &Value) -> Option<Sampled> {
    let r = v.get("range")?;
    let (min, max) = (r.get("min")?.as_u64()?, r.get("max")?.as_u64()?);
    (r.get("scale").and_then(Value::as_str) == Some("log") && min < max).then_some(Sampled::Integers { min, max })
}

/// A `{range: {min, max[, scale]}}` the reference samples as a float (no step, or log) with
/// distinct finite bounds; its values are checked where the grid reads them.
fn continuous_range(v: &Value) -> Option<Sampled> {
    let r = v.get("range")?;
    let (min, max) = (r.get("min")?.as_f64()?, r.get("max")?.as_f64()?);
    let log = r.get("scale").and_then(Value::as_str) == Some("log");
    let continuous = log || r.get("step").is_none();
    (continuous && min.is_finite() && max.is_finite() && min > 0.0 && min < max).then_some(Sampled::Continuous {
        min,
        max,
        log,
        integer: false,
    })
}

/// The reference's KV-feasibility filter (`model_hw.parallel_configs_for`): a shape set is kept
/// when every role's KV cache, sized at the largest token budget its scheduler knob takes, holds
/// more tokens than one longest sequence (the context length). A fixed block count is taken as
/// fixed only with an explicit `kv_cache.block_size` (the reference's `_role_runtime` multiplies
/// the blocks by the configured block size and has none to use otherwise): without one the role
/// is judged by the memory-sized estimate, as a default capacity is. Per branch (the capacity
/// depends on the backend) and shape set: the reason when it does not. Shapes whose capacity
/// cannot be estimated here are kept (their trial says why).
fn kv_filter(space: &Space) -> Vec<Vec<Option<String>>> {
    let mut all = Vec::with_capacity(space.branches.len());
    for (b, br) in space.branches.iter().enumerate() {
        let mbt_max = |role: &str| {
            br.knobs
                .iter()
                .find(|k| k.path.len() == 5 && k.path[2] == role && k.path[4] == "max_batched_tokens")
                .and_then(|k| match k.sampled {
                    // Random search may draw any budget up to the range's top.
                    Some(Sampled::Integers { max, .. }) => Some(max),
                    _ => k.values.iter().filter_map(Value::as_u64).max(),
                })
                .unwrap_or(8192)
        };
        let mut memo: std::collections::HashMap<(usize, Shape), Option<String>> = Default::default();
        let per_shape = space.per_shape(b);
        let mut out = Vec::with_capacity(br.shape_sets.len());
        for (s, shapes) in br.shape_sets.iter().enumerate() {
            let missing = shapes.iter().enumerate().any(|(j, sh)| !memo.contains_key(&(j, sh.worker())));
            if missing {
                // The capacity depends on the engine alone (not on the planner settings).
                let mut tree = space.tree(br.start + s * per_shape);
                tree.as_object_mut().expect("a mapping").remove("planner");
                super::load::for_the_check(&mut tree);
                // A searched block size or memory fraction is judged at its smallest (the
                // reference's `_role_runtime`).
                for k in br
                    .knobs
                    .iter()
                    .filter(|k| k.path.last().is_some_and(|l| l == "block_size" || l == "memory_fraction"))
                {
                    let least = k.values.iter().filter_map(Value::as_f64).fold(f64::INFINITY, f64::min);
                    let mut node = &mut tree;
                    for p in &k.path[..k.path.len() - 1] {
                        node = &mut node[p.as_str()];
                    }
                    node[k.path.last().expect("a path").as_str()] = if k.path.last().is_some_and(|l| l == "block_size")
                    {
                        json!(least as u64)
                    } else {
                        json!(least)
                    };
                }
                let config = schema::read_predict(&tree).ok();
                for (j, sh) in shapes.iter().enumerate() {
                    if memo.contains_key(&(j, sh.worker())) {
                        continue;
                    }
                    let role = br.roles[j];
                    let reason = config.as_ref().and_then(|c| {
                        let w = match role {
                            "prefill" => c.engine.prefill.as_ref(),
                            "decode" => c.engine.decode.as_ref(),
                            _ => c.engine.aggregated.as_ref(),
                        }?;
                        let memory_sized;
                        let w = match w.capacity {
                            schema::Capacity::Blocks(_) if w.block_size.is_none() => {
                                memory_sized = schema::Worker {
                                    capacity: schema::Capacity::Default {
                                        memory_fraction: None,
                                        cuda_graph_reserved_bytes: 0,
                                    },
                                    ..w.clone()
                                };
                                &memory_sized
                            }
                            _ => w,
                        };
                        let (tokens, context) = crate::lower::kv_tokens(&c.engine, w, mbt_max(role))?;
                        (tokens <= context).then(|| {
                            format!(
                                "{role} worker tensor={} attention_data={}: KV cache holds {tokens} tokens, \
                                 cannot hold one {context}-token sequence (context length; backend={})",
                                sh.tensor, sh.attention_data, c.engine.backend
                            )
                        })
                    });
                    memo.insert((j, sh.worker()), reason);
                }
            }
            out.push(shapes.iter().enumerate().find_map(|(j, sh)| memo[&(j, sh.worker())].clone()));
        }
        all.push(out);
    }
    all
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
            "engine": {"mode": "aggregated", "backend": "vllm", "model": "m", "hardware": "h", "workers": {"aggregated": {
                "parallelism": {"preset": false, "replicas": 1, "tensor": {"choices": [1, 2]}},
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

    /// A candidate as (mode, backend, per role (replicas, tensor, attention_data)).
    type Identified = (String, String, Vec<(u64, u64, u64)>);

    fn identities(s: &Search) -> Vec<Identified> {
        (0..s.candidate_count())
            .map(|k| {
                let t = s.candidate(k).unwrap();
                let e = &t["engine"];
                let roles = ["aggregated", "prefill", "decode"]
                    .iter()
                    .filter_map(|r| e["workers"].get(*r))
                    .map(|w| {
                        let p = &w["parallelism"];
                        let n = |k: &str| p[k].as_u64().unwrap();
                        (n("replicas"), n("tensor"), n("attention_data"))
                    })
                    .collect();
                (e["mode"].as_str().unwrap().to_string(), e["backend"].as_str().unwrap().to_string(), roles)
            })
            .collect()
    }

    fn three_roles(engine_extra: Value) -> Value {
        let worker = json!({"scheduler": {"max_batched_tokens": 8192, "max_sequences": 256},
                            "kv_cache": {"capacity": {"type": "fixed", "blocks": 1000}},
                            "timing": {"type": "fixed", "prefill_ms": 1, "decode_ms": 1}});
        let mut engine = json!({"model": "m", "hardware": "h", "context_length": 1024,
                                "workers": {"aggregated": worker, "prefill": worker, "decode": worker},
                                "kv_transfer": {"bandwidth_gb_per_second": 50}});
        for (k, v) in engine_extra.as_object().unwrap() {
            engine[k] = v.clone();
        }
        json!({"engine": engine, "optimization": {"constraints": {"max_candidate_gpus": 2}}})
    }

    #[test]
    fn mode_and_backend_default_to_the_references_domains() {
        let s = read_search(&three_roles(json!({})), Path::new(".")).unwrap();
        let got = identities(&s);
        let agg = |b: &str, r, t| ("aggregated".to_string(), b.to_string(), vec![(r, t, 1)]);
        let disagg = |b: &str| ("disaggregated".to_string(), b.to_string(), vec![(1, 1, 1), (1, 1, 1)]);
        assert_eq!(
            got,
            [
                agg("vllm", 1, 1),
                agg("vllm", 2, 1),
                agg("vllm", 1, 2),
                agg("sglang", 1, 1),
                agg("sglang", 2, 1),
                agg("sglang", 1, 2),
                disagg("vllm"),
                disagg("sglang"),
            ]
        );
        // Each candidate holds its own mode's roles only; the KV transfer stays with disaggregated.
        let first = s.candidate(0).unwrap();
        assert!(first["engine"]["workers"].get("prefill").is_none());
        assert!(first["engine"].get("kv_transfer").is_none());
        let last = s.candidate(7).unwrap();
        assert!(last["engine"]["workers"].get("aggregated").is_none());
        assert!(last["engine"].get("kv_transfer").is_some());
        for k in 0..8 {
            schema::read_predict(&s.candidate(k).unwrap()).unwrap();
        }
        let mut root =
            three_roles(json!({"mode": {"choices": ["disaggregated"]}, "backend": {"choices": ["sglang", "vllm"]}}));
        root["engine"]["workers"].as_object_mut().unwrap().remove("aggregated");
        let one = read_search(&root, Path::new(".")).unwrap();
        assert_eq!(identities(&one), [disagg("sglang"), disagg("vllm")]);
    }

    #[test]
    fn identity_domains_are_checked() {
        let err = |extra: Value| read_search(&three_roles(extra), Path::new(".")).err().unwrap().to_string();
        assert!(err(json!({"backend": {"choices": []}})).contains("engine.backend.choices: choices must be non-empty"));
        assert!(err(json!({"backend": {"choices": ["vllm", "vllm"]}})).contains("choices must be unique"));
        assert!(err(json!({"backend": {"choices": ["tgi"]}})).contains("engine.backend.choices[0]: unknown value"));
        let e = err(json!({"mode": {"choices": ["afd"]}}));
        assert!(e.contains("engine.kv_transfer: AFD mode rejects kv_transfer"), "{e}");
        let e = err(json!({"mode": {"choices": ["afd", "aggregated"]}}));
        assert!(e.contains("engine.mode: AFD recommendation mode cannot be mixed"), "{e}");
        let mut agg_only = three_roles(json!({}));
        agg_only["engine"]["workers"].as_object_mut().unwrap().retain(|k, _| k == "aggregated");
        let e = read_search(&agg_only, Path::new(".")).err().unwrap().to_string();
        assert!(e.contains("disaggregated mode requires prefill and decode workers"), "{e}");
        let mut few = three_roles(json!({}));
        few["optimizer"] = json!({"algorithm": "random", "max_trials": 1});
        let e = read_search(&few, Path::new(".")).err().unwrap().to_string();
        assert!(e.contains("at least the number of active deployment branches (2)"), "{e}");
    }

    #[test]
    fn random_search_splits_its_trials_over_the_modes() {
        let mut root = three_roles(json!({}));
        root["optimizer"] = json!({"algorithm": "random", "max_trials": 3});
        let s = read_search(&root, Path::new(".")).unwrap();
        let modes: Vec<String> = identities(&s).into_iter().map(|(m, ..)| m).collect();
        assert_eq!(modes, ["aggregated", "aggregated", "disaggregated"]);
        // A mode no candidate of which fits its KV cache is not active: the others take its trials.
        // (A fixed block count is fixed only with an explicit block size.)
        root["engine"]["workers"]["prefill"]["kv_cache"] =
            json!({"block_size": 16, "capacity": {"type": "fixed", "blocks": 1}});
        let s = read_search(&root, Path::new(".")).unwrap();
        let modes: Vec<String> = identities(&s).into_iter().map(|(m, ..)| m).collect();
        assert_eq!(modes, ["aggregated"; 3]);
        assert_eq!(s.kv_excluded, 2);
        // One-token blocks hold 1000 tokens of the 1024 the context needs: the aggregated shapes
        // are out too.
        root["engine"]["workers"]["aggregated"]["kv_cache"]["block_size"] = json!(1);
        root["engine"]["workers"]["aggregated"]["kv_cache"]["capacity"]["blocks"] = json!(1000);
        let e = read_search(&root, Path::new(".")).err().unwrap().to_string();
        assert!(e.contains("KV"), "{e}");
        root["engine"]["workers"]["aggregated"]["kv_cache"]["capacity"]["blocks"] = json!(1025);
        root["engine"]["backend"] = json!({"choices": ["vllm", "sglang"]});
        assert_eq!(read_search(&root, Path::new(".")).unwrap().kv_excluded, 2);
        root["optimizer"]["max_trials"] = json!(1);
        assert_eq!(read_search(&root, Path::new(".")).unwrap().candidate_count(), 1);
    }

    /// `engine.hardware: auto` is `optimization.hardware`; a KV-fraction load needs a fraction and
    /// a synthetic source (the reference's rules).
    #[test]
    fn auto_hardware_and_kv_fraction_loads() {
        let mut root = three_roles(json!({"mode": "aggregated", "hardware": "auto"}));
        let e = read_search(&root, Path::new(".")).err().unwrap().to_string();
        assert_eq!(e, "engine.hardware: engine.hardware='auto' requires one optimization.hardware");
        root["optimization"]["hardware"] = json!("h200_sxm");
        let s = read_search(&root, Path::new(".")).unwrap();
        assert_eq!(s.candidate(0).unwrap()["engine"]["hardware"], "h200_sxm");
        root["traffic"] = json!({"source": {"type": "trace", "paths": ["t.jsonl"]},
                                 "load": {"type": "kv_capacity_fraction", "fraction": 0.5}});
        let e = read_search(&root, Path::new(".")).err().unwrap().to_string();
        assert_eq!(e, "traffic: trace traffic requires trace_timestamps or concurrency load");
        root["traffic"] = json!({"load": {"type": "kv_capacity_fraction"}});
        let e = read_search(&root, Path::new(".")).err().unwrap().to_string();
        assert_eq!(e, "traffic.load: traffic.load.type='kv_capacity_fraction' requires fraction");
    }

    /// The reference's search on Qwen3-8B (dense) on h200_sxm, fixed 4,000 blocks and no block
    /// size: both backends are kept (its KV filter sizes the cache from memory); with an explicit
    /// block size the blocks count. Attention data parallelism names no dense shape: the mode is
    /// skipped, and with none left the search is refused with the reference's message. Skipped
    /// without the AIS data package.
    #[test]
    fn the_references_kv_and_dense_rules_on_a_real_model() {
        let mut root = json!({
            "engine": {"mode": "aggregated", "model": "Qwen/Qwen3-8B", "hardware": "h200_sxm",
                       "backend": {"choices": ["vllm", "sglang"]},
                       "workers": {"aggregated": {
                           "kv_cache": {"capacity": {"type": "fixed", "blocks": 4000}},
                           "timing": {"type": "fixed", "prefill_ms": 20, "decode_ms": 5},
                           "parallelism": {"preset": false, "replicas": 1, "tensor": 1},
                           "scheduler": {"max_batched_tokens": 8192, "max_sequences": 256}}}},
            "optimizer": {"algorithm": "random", "max_trials": 4, "parallelism": 1},
        });
        if model_moe(&root) != Some(false) {
            eprintln!("skipped: no AIS data for Qwen/Qwen3-8B");
            return;
        }
        let s = read_search(&root, Path::new(".")).unwrap();
        assert_eq!(s.kv_excluded, 0);
        let backends: Vec<String> = identities(&s).into_iter().map(|(_, b, _)| b).collect();
        // Both kept, in the reference's draw order (Python's `random.Random(42).shuffle` of the
        // arms [vllm, sglang] gives [sglang, vllm]).
        assert_eq!(backends, ["sglang", "vllm"]);
        // 8 × 4,000 tokens cannot hold Qwen3-8B's 40,960-token context; 16 × 4,000 can.
        root["optimizer"]["algorithm"] = json!("grid");
        root["engine"]["workers"]["aggregated"]["kv_cache"]["block_size"] = json!(8);
        assert_eq!(read_search(&root, Path::new(".")).unwrap().kv_excluded, 2);
        root["engine"]["workers"]["aggregated"]["kv_cache"]["block_size"] = json!(16);
        assert_eq!(read_search(&root, Path::new(".")).unwrap().kv_excluded, 0);
        let par = "/engine/workers/aggregated/parallelism/attention_data";
        *root.pointer_mut("/engine/workers/aggregated/parallelism").unwrap() =
            json!({"preset": false, "replicas": 1, "tensor": 1, "attention_data": {"choices": [2, 4]}});
        let e = read_search(&root, Path::new(".")).err().unwrap().to_string();
        assert_eq!(
            e,
            "engine.workers.aggregated.parallelism: no deployment_mode has a viable parallel config \
             (skipped ['agg']); check backends / model / hardware / gpu_budget=32 (the independent knobs admit \
             no legal shape; a dense model's legal shapes are plain tensor parallelism, without attention data \
             parallelism, with 1 to 16 GPUs per worker and pipeline 1)"
        );
        *root.pointer_mut(par).unwrap() = json!({"choices": [1, 2]});
        let s = read_search(&root, Path::new(".")).unwrap();
        assert_eq!(s.candidate_count(), 2, "attention_data 1 on each backend");
    }

    #[test]
    fn the_moe_pool_holds_the_references_pure_patterns() {
        // aisimulate's parallel_enum at 4 GPUs: 1 shape at one GPU, TEP, MoE-TP, DEP and DTP at 2
        // and at 4: with the replicas that fit, 16 per backend.
        let per_width: Vec<usize> = [1, 2, 4, 8].iter().map(|&g| pool_worker_shapes(true, g).len()).collect();
        assert_eq!(per_width, [1, 4, 4, 4]);
        let at4: usize = [1u64, 2, 4].iter().map(|&g| pool_worker_shapes(true, g).len() * (4 / g) as usize).sum();
        assert_eq!(at4, 16);
        let two = pool_worker_shapes(true, 2);
        let as_tuple: Vec<_> = two.iter().map(|s| (s.tensor, s.attention_data, s.moe.unwrap())).collect();
        assert_eq!(as_tuple, [(1, 2, (1, 2)), (1, 2, (2, 1)), (2, 1, (1, 2)), (2, 1, (2, 1))]);
        assert_eq!(pool_worker_shapes(false, 4), [Shape::tp(1, 4, 1)]);
    }

    #[test]
    fn preset_forms_are_the_references() {
        let with = |preset: Value| {
            let mut root = three_roles(json!({"mode": "aggregated", "backend": "vllm"}));
            root["engine"]["workers"].as_object_mut().unwrap().retain(|k, _| k == "aggregated");
            root["engine"].as_object_mut().unwrap().remove("kv_transfer");
            root["engine"]["workers"]["aggregated"]["parallelism"] = preset;
            read_search(&root, Path::new("."))
        };
        let pool = with(json!({"preset": "default"})).unwrap();
        assert_eq!(pool.candidate_count(), 3);
        assert_eq!(with(json!({})).unwrap().candidate_count(), 3);
        let off = with(json!({"preset": {}, "tensor": {"choices": [1, 2]}})).unwrap();
        assert_eq!(off.candidate_count(), 3, "replicas left free: 1 or 2 of TP1, 1 of TP2");
        let one = with(json!({"preset": false, "replicas": 1, "tensor": {"choices": [1, 2]}})).unwrap();
        assert_eq!(one.candidate_count(), 2);
        let entry = |r: u64, t: u64| {
            json!({"replicas": r, "tensor": t, "pipeline": 1, "attention_data": 1, "moe_tensor": 1, "moe_expert": 1,
                   "prefill_context": null, "decode_context": 1})
        };
        let listed = with(json!({"preset": [entry(1, 2), entry(2, 1)]})).unwrap();
        assert_eq!(listed.candidate_count(), 2);
        let over = with(json!({"preset": [entry(1, 2), entry(4, 1)]})).err().unwrap().to_string();
        assert!(
            over.contains(
                "engine.workers.aggregated.parallelism.preset[1]: pinned parallel config replicas=4 tensor=1"
            ) && over.contains("used_gpus=4 exceeds gpu_budget=2"),
            "{over}"
        );
        let p = &listed.candidate(0).unwrap()["engine"]["workers"]["aggregated"]["parallelism"];
        assert_eq!(
            p,
            &json!({"replicas": 1, "tensor": 2, "pipeline": 1, "attention_data": 1, "moe_tensor": 1,
                              "moe_expert": 1})
        );
        let e = |v: Value| with(v).err().unwrap().to_string();
        assert!(e(json!({"preset": []})).contains("parallelism preset list must be nonempty"));
        assert!(e(json!({"preset": {"tensor": 1}})).contains("preset mapping must be empty to disable it"));
        assert!(e(json!({"preset": [{"tensor": 1}]})).contains("missing=['attention_data', 'moe_expert'"));
        assert!(e(json!({"preset": "default", "tensor": 2})).contains("cannot be combined"));
        assert!(e(json!({"preset": [entry(1, 1)], "tensor": 2})).contains("cannot be combined"));
        let mut cp = entry(1, 1);
        cp["decode_context"] = json!(2);
        assert!(e(json!({"preset": [cp]})).contains("context parallelism is a predict-only knob"));
    }

    #[test]
    fn backend_version_may_be_given_per_backend() {
        let s = read_search(&three_roles(json!({"backend_version": {"sglang": "0.5.14"}})), Path::new(".")).unwrap();
        let versions: Vec<Option<String>> = (0..s.candidate_count())
            .map(|k| s.candidate(k).unwrap()["engine"].get("backend_version").map(|v| v.as_str().unwrap().into()))
            .collect();
        assert_eq!(versions[..4], [None, None, None, Some("0.5.14".to_string())], "vLLM resolves its latest");
        let e = read_search(
            &three_roles(json!({"backend": "vllm", "backend_version": {"sglang": "0.5.14"}})),
            Path::new("."),
        )
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("backend_version contains unconfigured backend(s): ['sglang']"), "{e}");
    }

    #[test]
    fn an_engine_that_is_not_a_mapping_is_refused() {
        for (root, want) in [
            (json!({"optimizer": {"algorithm": "grid"}}), "engine: missing (required: model, hardware and workers)"),
            (json!({"engine": 5}), "engine: must be a mapping"),
            (json!({"engine": {"model": "m", "workers": [1]}}), "engine.workers: must be a mapping"),
        ] {
            let e = read_search(&root, Path::new(".")).err().unwrap().to_string();
            assert!(e.contains(want), "{e}");
        }
    }

    #[test]
    fn host_offload_needs_a_pinned_mode_and_vllm() {
        let mut root = three_roles(json!({}));
        root["engine"]["workers"]["aggregated"]["kv_cache"]["host_offload"] = json!({"num_host_blocks": 100});
        let err = |root: &Value| read_search(root, Path::new(".")).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            err(&root).contains("engine.mode: host_offload recommendation requires concrete mode"),
            "{}",
            err(&root)
        );
        root["engine"]["mode"] = json!("aggregated");
        assert!(err(&root).contains("engine.backend: host_offload recommendation requires concrete backend=vllm"));
        root["engine"]["backend"] = json!("vllm");
        assert!(!err(&root).contains("host_offload"), "{}", err(&root));
    }
}
