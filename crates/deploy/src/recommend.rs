//! `servesim recommend -c FILE`: a search over deployments of one model under a GPU budget
//! (spec: `shared/reference/aisimulate.md` §5-§6). Every candidate is a concrete predict
//! configuration — the input tree with each searched knob replaced by one value — read by the
//! same strict schema and replayed like `predict -c`, so each `recommendations/NNNN.yaml` is
//! replayable as it stands.
//!
//! Knobs per worker role: `parallelism.{replicas, tensor, attention_data}` and
//! `scheduler.{max_batched_tokens, max_sequences}`, each a scalar, `{choices: [...]}` or
//! `{range: {min, max, step, scale}}`. Without explicit parallelism the preset pool applies
//! (GPUs per worker 1, 2, 4, 8, 16 as plain TP, replicas up to the budget; dense models), and
//! the scheduler knobs default to the reference's lists.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde_json::{json, Map, Value};

use crate::reader::Obj;
use crate::{schema, DeployError};

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

#[derive(Clone, Debug)]
pub struct Optimization {
    pub target: &'static str,
    /// Target `pareto`: the scalar objectives whose non-dominated front is sought (default
    /// throughput per GPU, then per-user throughput, the last one being the front's x-axis).
    pub pareto_objectives: Vec<&'static str>,
    pub strict_sla: bool,
    pub min_gpus: u32,
    pub budget: u32,
    pub min_goodput_rps: Option<f64>,
}

#[derive(Clone, Debug)]
pub struct Optimizer {
    pub algorithm: &'static str,
    pub max_trials: u32,
    /// Trials per round (bayesian: the batch the model proposes before it sees their results).
    pub parallelism: u32,
    pub seed: u64,
}

/// One searched knob: where it lives in the tree and the values it takes.
#[derive(Clone, Debug)]
struct Knob {
    path: Vec<String>,
    values: Vec<Value>,
}

/// The search space: every candidate is a mixed-radix index over the parallel-shape sets, the
/// knobs (the last one fastest), the router settings and the planner settings (innermost), and
/// its concrete predict tree is made when it is needed, so a large space costs no memory until
/// it is evaluated.
#[derive(Clone, Debug)]
pub struct Space {
    base: Value,
    roles: Vec<&'static str>,
    shape_sets: Vec<Vec<(u64, u64, u64)>>,
    knobs: Vec<Knob>,
    /// Concrete `router:` sections; empty when the configuration has none.
    routers: Vec<Value>,
    /// Concrete `planner:` sections; empty when the configuration has none.
    planners: Vec<crate::planner_search::Setting>,
}

impl Space {
    fn per_shape(&self) -> usize {
        self.knobs.iter().map(|k| k.values.len()).product::<usize>()
            * self.routers.len().max(1)
            * self.planners.len().max(1)
    }

    /// The number of candidates.
    pub fn len(&self) -> usize {
        self.shape_sets.len() * self.per_shape()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Candidate `i` as (shape set, knob value indexes, router index, planner index).
    fn split(&self, i: usize) -> (usize, Vec<usize>, usize, usize) {
        let nr = self.routers.len().max(1);
        let np = self.planners.len().max(1);
        let mut rest = i;
        let p = rest % np;
        rest /= np;
        let r = rest % nr;
        rest /= nr;
        let mut ks = vec![0; self.knobs.len()];
        for (j, k) in self.knobs.iter().enumerate().rev() {
            ks[j] = rest % k.values.len();
            rest /= k.values.len();
        }
        (rest, ks, r, p)
    }

    /// Candidate `i`'s concrete predict tree.
    pub fn tree(&self, i: usize) -> Value {
        let (s, ks, r, pl) = self.split(i);
        let mut t = self.base.clone();
        for (role, (rep, tp, dp)) in self.roles.iter().zip(&self.shape_sets[s]) {
            let mut p = get(&t, &["engine", "workers", role, "parallelism"]).cloned().unwrap_or(json!({}));
            let o = p.as_object_mut().expect("checked when the space was read");
            o.insert("replicas".into(), json!(rep));
            o.insert("tensor".into(), json!(tp));
            o.insert("attention_data".into(), json!(dp));
            set(&mut t, &["engine".into(), "workers".into(), role.to_string(), "parallelism".into()], p);
        }
        for (k, &v) in self.knobs.iter().zip(&ks) {
            set(&mut t, &k.path, k.values[v].clone());
        }
        if let Some(router) = self.routers.get(r) {
            set(&mut t, &["router".into()], router.clone());
        }
        if let Some(planner) = self.planners.get(pl) {
            set(&mut t, &["planner".into()], planner.section.clone());
        }
        t
    }

    /// The concrete planner settings the space searches (empty without a `planner:` section).
    pub fn planner_settings(&self) -> &[crate::planner_search::Setting] {
        &self.planners
    }

    /// Why the Planner refuses candidate `i`'s settings, if it does.
    fn planner_refusal(&self, i: usize) -> Option<String> {
        self.planners.get(self.split(i).3).and_then(|p| p.infeasible.clone())
    }

    /// Candidate `i`'s point for the surrogate model, before scaling: log2 of every integer knob
    /// (parallel sizes, scheduler limits), the router's policy and load model as 0/1 and its
    /// numeric knobs (the load scale as log2(1 + x)).
    fn raw_features(&self, i: usize) -> Vec<f64> {
        let (s, ks, r, pl) = self.split(i);
        let mut f = Vec::new();
        for &(rep, tp, dp) in &self.shape_sets[s] {
            f.extend([(rep as f64).log2(), (tp as f64).log2(), (dp as f64).log2()]);
        }
        for (k, &v) in self.knobs.iter().zip(&ks) {
            f.push(k.values[v].as_f64().unwrap_or(1.0).max(1.0).log2());
        }
        if let Some(router) = self.routers.get(r) {
            let num = |k: &str| router.get(k).and_then(Value::as_f64).unwrap_or(0.0);
            f.push(if router["policy"] == "kv_router" { 1.0 } else { 0.0 });
            f.push(if router.pointer("/prefill_load_model/type").and_then(Value::as_str) == Some("ais") {
                1.0
            } else {
                0.0
            });
            f.extend([num("overlap_score_credit"), (1.0 + num("prefill_load_scale")).log2(), num("temperature")]);
        }
        // The planner: on or off, its loops, their intervals (log2), FPM sampling, load
        // sensitivity and worker minimum; a disabled planner is all zeros.
        if let Some(p) = self.planners.get(pl) {
            let s = &p.section;
            let on = |k: &str| if s.get(k) == Some(&json!(true)) { 1.0 } else { 0.0 };
            let lg = |k: &str| s.get(k).and_then(Value::as_f64).map_or(0.0, |x| (1.0 + x.max(0.0)).log2());
            f.push(if s["policy"] == "enabled" { 1.0 } else { 0.0 });
            f.extend([on("enable_throughput_scaling"), on("enable_load_scaling")]);
            for k in [
                "throughput_adjustment_interval_seconds",
                "load_adjustment_interval_seconds",
                "max_num_fpm_samples",
                "fpm_sample_bucket_size",
                "load_min_observations",
                "min_workers",
            ] {
                f.push(lg(k));
            }
            f.push(s.get("load_scaling_down_sensitivity").and_then(Value::as_f64).unwrap_or(0.0) / 100.0);
        }
        f
    }

    fn gpus(&self, i: usize) -> u64 {
        self.shape_sets[self.split(i).0].iter().map(|(r, t, d)| r * t * d).sum()
    }
}

/// A search: the options, the space and the candidates chosen for evaluation.
pub struct Search {
    pub base: Value,
    pub optimization: Optimization,
    pub optimizer: Optimizer,
    pub sla: schema::Sla,
    pub space: Space,
    /// Grid and random: the candidates to evaluate (indexes into the space), in order; bayesian:
    /// the pool it chooses from (within the budget and KV-feasible).
    pub selected: Vec<usize>,
    /// Candidates of explicit parallelism domains over the GPU budget, dropped before they
    /// were built (the preset pool never holds any).
    pub over_budget: u64,
    /// Per shape set: why its KV cache cannot hold one longest sequence (the reference's
    /// KV-feasibility filter), if it cannot.
    kv_short: Vec<Option<String>>,
    /// Candidates the KV filter marked infeasible (grid) or left out of the pool sampled
    /// (random, bayesian).
    pub kv_excluded: usize,
    /// What the planner's load-predictor backtest found (`planner:` searches only).
    pub planner_backtest: Option<Value>,
}

/// The most candidates a grid replays.
pub const MAX_GRID_CANDIDATES: u128 = 1_000_000;
/// The most candidates random and bayesian searches choose from.
pub const MAX_POOL_CANDIDATES: u128 = 20_000_000;

impl Search {
    /// The number of candidates chosen for evaluation (grid and random; bayesian's pool).
    pub fn candidate_count(&self) -> usize {
        self.selected.len()
    }

    /// Candidate `k`'s concrete predict tree, made when it is asked for (a large grid holds
    /// none of them at once).
    pub fn candidate(&self, k: usize) -> Option<Value> {
        self.selected.get(k).map(|&i| self.space.tree(i))
    }

    /// The first candidate's tree (the one checked strictly before a run starts), without its
    /// planner section when the Planner refuses that (the candidate is then infeasible, not the
    /// configuration wrong).
    pub fn first_tree(&self) -> Value {
        let i = self.selected[0];
        let mut t = self.space.tree(i);
        if self.space.planner_refusal(i).is_some() {
            t.as_object_mut().expect("a mapping").remove("planner");
        }
        t
    }

    /// Why candidate `i` of the space is infeasible before it runs (its KV cache, or planner
    /// settings the Planner refuses), if it is: (reason category, reason).
    fn blocked(&self, i: usize) -> Option<(&'static str, String)> {
        if let Some(why) = self.kv_short[self.space.split(i).0].clone() {
            return Some(("kv_capacity", why));
        }
        self.space
            .planner_refusal(i)
            .map(|why| ("adapter_constraint", format!("candidate adapter selection infeasible: {why}")))
    }
}

/// The router's recommend domains (Dynamo's router adapter): `policy` (default both),
/// `prefill_load_model.type` (default none and ais; none only for round_robin), and the kv_router
/// knobs `overlap_score_credit` (0, 0.5, 1), `prefill_load_scale` (0 ... 32) and `temperature`
/// (0, 0.2, 0.5, 1), each a number, `{choices}` or a stepped linear `{range}`. Returns the
/// concrete `router:` sections, round_robin first when searched, the kv_router knobs applying
/// only under kv_router.
fn router_settings(v: &Value) -> Result<Vec<Value>, DeployError> {
    let mut r = Obj::new("router", v)?;
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
    let policies =
        strings("router.policy".into(), r.raw("policy"), &["round_robin", "kv_router"], &["round_robin", "kv_router"])?;
    let rr_only = policies == ["round_robin"];
    let load_models = match r.obj("prefill_load_model")? {
        Some(mut m) => {
            let here = m.path("type");
            let v = strings(here, m.raw("type"), &["none", "ais"], if rr_only { &["none"] } else { &["none", "ais"] })?;
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
        let value = r.raw(key);
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
            let mut r = Obj::new(&format!("{path}.range"), &m["range"])?;
            let here = r.here().to_string();
            let min = r.f64("min")?.ok_or_else(|| r.err("min", "missing (required)"))?;
            let max = r.f64("max")?.ok_or_else(|| r.err("max", "missing (required)"))?;
            let step = r.f64("step")?;
            let scale = r.choice("scale", &["linear", "log"])?.unwrap_or("linear");
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

/// The most values one search domain may hold: a million candidates along one axis is already
/// more than a search can replay, and each value costs memory before the first trial.
pub const MAX_DOMAIN_VALUES: u64 = 1_000_000;

/// The refusal of a domain of `count` values.
pub fn too_many_values(path: &str, count: impl std::fmt::Display) -> DeployError {
    DeployError::new(
        path,
        format!(
            "holds {count} values; a search domain holds at most {MAX_DOMAIN_VALUES} (narrow it or raise its step)"
        ),
    )
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
            let mut o = Obj::new(path, v)?;
            let out = if let Some(c) = o.raw("choices") {
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
                let scale = r.choice("scale", &["linear", "log"])?.unwrap_or("linear");
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

fn get<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    let mut node = v;
    for p in path {
        node = node.get(p)?;
    }
    Some(node)
}

fn set(v: &mut Value, path: &[String], value: Value) {
    let mut node = v;
    for (i, p) in path.iter().enumerate() {
        let obj = node.as_object_mut().expect("knob parents are mappings");
        if i + 1 == path.len() {
            obj.insert(p.clone(), value);
            return;
        }
        node = obj.entry(p.clone()).or_insert_with(|| Value::Object(Map::new()));
    }
}

fn read_optimization(o: Option<Obj>) -> Result<Optimization, DeployError> {
    let mut out = Optimization {
        target: "throughput",
        pareto_objectives: DEFAULT_PARETO_OBJECTIVES.to_vec(),
        strict_sla: false,
        min_gpus: 1,
        budget: 32,
        min_goodput_rps: None,
    };
    let Some(mut o) = o else { return Ok(out) };
    out.target = o.choice("target", &TARGETS)?.unwrap_or("throughput");
    out.strict_sla = o.bool("strict_sla")?.unwrap_or(false);
    if let Some(h) = o.raw("hardware") {
        if h.as_str().is_none_or(|s| s.is_empty() || s == "auto") {
            return Err(o.err("hardware", "optimization.hardware must be a concrete nonempty identifier"));
        }
    }
    if let Some(list) = o.raw("pareto_objectives") {
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
fn read_pareto_objectives(o: &Obj, target: &str, list: &Value) -> Result<Vec<&'static str>, DeployError> {
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

fn read_optimizer(o: Option<Obj>) -> Result<Optimizer, DeployError> {
    let mut out = Optimizer { algorithm: "grid", max_trials: 320, parallelism: 16, seed: 42 };
    let Some(mut o) = o else { return Ok(out) };
    out.algorithm = o.choice("algorithm", &["grid", "random", "bayesian"])?.unwrap_or("grid");
    out.max_trials = o.positive("max_trials")?.unwrap_or(320);
    out.parallelism = o.positive("parallelism")?.unwrap_or(16);
    o.nonneg("candidate_timeout_seconds", true)?;
    out.seed = o.u64("seed")?.unwrap_or(42);
    o.finish()?;
    Ok(out)
}

/// Reads a recommend configuration and lists its candidates; `base_dir` is where relative trace
/// paths start (the planner's load-predictor backtest reads the trace).
pub fn read_search(root: &Value, base_dir: &Path) -> Result<Search, DeployError> {
    let mut top = Obj::new("", root)?;
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
        Some(v) => schema::read_sla(Obj::new("evaluation.sla", v)?)?,
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

/// One evaluated candidate.
#[derive(Clone, Debug)]
pub struct Trial {
    pub tree: Value,
    pub used_gpus: u64,
    pub status: &'static str,
    pub reason_category: Option<&'static str>,
    pub reason: Option<String>,
    pub summary: Map<String, Value>,
}

/// Progress of a search for a front end: trials done of the total and the best score so far
/// (the target's score among candidates that pass the feasibility gates).
pub struct Progress<'a> {
    done: AtomicUsize,
    total: usize,
    best: Mutex<Option<f64>>,
    report: &'a (dyn Fn(usize, usize, Option<f64>) + Sync),
}

impl<'a> Progress<'a> {
    pub fn new(total: usize, report: &'a (dyn Fn(usize, usize, Option<f64>) + Sync)) -> Self {
        Progress { done: AtomicUsize::new(0), total, best: Mutex::new(None), report }
    }

    /// Progress that reports nothing.
    pub fn silent() -> Progress<'static> {
        Progress::new(0, &|_, _, _| {})
    }

    fn record(&self, search: &Search, t: &Trial) {
        let best = {
            let mut best = self.best.lock().expect("best");
            if let Some(v) = gated_score(search, t) {
                if best.is_none_or(|b| v > b) {
                    *best = Some(v);
                }
            }
            *best
        };
        (self.report)(self.done.fetch_add(1, Ordering::Relaxed) + 1, self.total, best);
    }
}

/// The trials of a search and how many were served from the cache.
pub struct Evaluated {
    pub trials: Vec<Trial>,
    pub cache_hits: usize,
}

/// The number of trials a search runs.
pub fn trial_count(search: &Search) -> usize {
    match search.optimizer.algorithm {
        "bayesian" => (search.optimizer.max_trials as usize).min(search.selected.len()),
        _ => search.selected.len(),
    }
}

/// Runs the search on `threads` threads (0: every core): grid and random evaluate their
/// candidates, in candidate order whatever thread finished first; bayesian proposes rounds of
/// `optimizer.parallelism` candidates from what the earlier rounds found.
pub fn evaluate(
    search: &Search,
    base_dir: &Path,
    threads: usize,
    cache: Option<&Cache>,
    progress: &Progress,
) -> Evaluated {
    if search.optimizer.algorithm == "bayesian" {
        return bayesian(search, base_dir, threads, cache, progress);
    }
    let jobs: Vec<usize> = (0..search.selected.len()).collect();
    run_jobs(
        search,
        &jobs,
        &|k| (search.space.tree(search.selected[k]), search.selected[k]),
        base_dir,
        threads,
        cache,
        progress,
    )
}

/// Evaluates jobs `0..jobs.len()` (each named by `job(k)` as its tree and space index); results
/// in job order.
fn run_jobs(
    search: &Search,
    jobs: &[usize],
    job: &(dyn Fn(usize) -> (Value, usize) + Sync),
    base_dir: &Path,
    threads: usize,
    cache: Option<&Cache>,
    progress: &Progress,
) -> Evaluated {
    let n = jobs.len();
    let threads =
        if threads == 0 { std::thread::available_parallelism().map_or(1, |n| n.get()) } else { threads }.min(n).max(1);
    let next = AtomicUsize::new(0);
    let hits = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Trial>>> = Mutex::new(vec![None; n]);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let (tree, index) = job(jobs[i]);
                let (t, hit) = trial(tree, search.blocked(index), search, base_dir, cache);
                if hit {
                    hits.fetch_add(1, Ordering::Relaxed);
                }
                progress.record(search, &t);
                results.lock().expect("results")[i] = Some(t);
            });
        }
    });
    let trials =
        results.into_inner().expect("results").into_iter().map(|t| t.expect("every candidate evaluated")).collect();
    Evaluated { trials, cache_hits: hits.into_inner() }
}

fn used_gpus(tree: &Value) -> u64 {
    let mut g = 0;
    if let Some(w) = get(tree, &["engine", "workers"]).and_then(Value::as_object) {
        for p in w.values().filter_map(|r| r.get("parallelism")) {
            let f = |k: &str| p.get(k).and_then(Value::as_u64).unwrap_or(1);
            g += f("replicas") * f("tensor") * f("pipeline") * f("attention_data");
        }
    }
    g
}

/// Evaluates one candidate; `true` when its result came from the cache.
fn trial(
    tree: Value,
    blocked: Option<(&'static str, String)>,
    search: &Search,
    base_dir: &Path,
    cache: Option<&Cache>,
) -> (Trial, bool) {
    let used = used_gpus(&tree);
    let mut t =
        Trial { tree, used_gpus: used, status: "feasible", reason_category: None, reason: None, summary: Map::new() };
    if used > search.optimization.budget as u64 {
        t.status = "infeasible";
        t.reason_category = Some("gpu_budget");
        t.reason = Some(format!("used_gpus={used} > gpu_budget={}", search.optimization.budget));
        return (t, false);
    }
    if let Some((category, why)) = blocked {
        t.status = "infeasible";
        t.reason_category = Some(category);
        t.reason = Some(why);
        return (t, false);
    }
    let key = cache.map(|c| c.key(&t.tree));
    if let (Some(c), Some(k)) = (cache, &key) {
        if let Some(hit) = c.get(k, &t.tree) {
            return (hit, true);
        }
    }
    simulate(&mut t, base_dir);
    // Only replays are kept: a candidate refused before it ran may be refused for want of
    // something outside its inputs (the performance data), and costs nothing to refuse again.
    if let (Some(c), Some(k), false) = (cache, &key, t.summary.is_empty()) {
        c.put(k, &t);
    }
    (t, false)
}

/// A candidate's replay as the search runs it (one thread per candidate: the search spreads
/// candidates over the cores). A candidate's report page replays it the same way.
pub fn prepare_candidate(tree: &Value, base_dir: &Path) -> Result<crate::Prepared, DeployError> {
    let mut p = crate::prepare(schema::read_predict(tree)?, base_dir)?;
    p.sim.threads = 1;
    Ok(p)
}

fn simulate(t: &mut Trial, base_dir: &Path) {
    let p = match prepare_candidate(&t.tree, base_dir) {
        Ok(p) => p,
        Err(e) => {
            let kv = e.message.contains("KV") || e.key.contains("kv_cache");
            t.status = if kv { "infeasible" } else { "unsupported" };
            t.reason_category = Some(if kv { "kv_capacity" } else { "candidate_materialization" });
            t.reason = Some(e.to_string());
            return;
        }
    };
    // With a `planner:` section the Planner runs in the loop, as `predict -c` runs it.
    let mut planner = match crate::planner_run(&p) {
        Ok(r) => r,
        Err(e) => {
            t.status = "unsupported";
            t.reason_category = Some("candidate_materialization");
            t.reason = Some(e);
            return;
        }
    };
    match crate::run_planned(&p, planner.as_mut(), None, &mut ()) {
        Ok(report) => {
            t.summary = crate::planned_summary(&p, &report, planner.as_ref());
        }
        Err(e) => {
            t.status = "failed";
            t.reason_category = Some("replay_runtime");
            t.reason = Some(e);
        }
    }
}

/// A trial's score as the search compares it (higher is better), `None` when it is not
/// feasible: the target's score after the same gates as the ranking (budget, KV, strict SLA or
/// min_gpus SLA, goodput floor); a latency that was never measured is not a score.
fn gated_score(search: &Search, t: &Trial) -> Option<f64> {
    let o = &search.optimization;
    if t.status != "feasible" || t.summary.is_empty() {
        return None;
    }
    if (o.strict_sla || o.target == "min_gpus") && sla_failure(&search.sla, t).is_some() {
        return None;
    }
    if o.min_goodput_rps.is_some_and(|floor| metric(t, "goodput_request_throughput_rps") < floor) {
        return None;
    }
    let target = if o.target == "pareto" { o.pareto_objectives[0] } else { o.target };
    let (v, max) = objective(target, t);
    let v = if max { v } else { -v };
    v.is_finite().then_some(v)
}

/// The bayesian search: a Gaussian-process surrogate (Matérn 5/2 over the candidates' scaled knob
/// vectors, its length scale chosen by marginal likelihood) and expected improvement, in rounds
/// of `optimizer.parallelism` candidates (the first drawn at random with the seed; a round's
/// later picks shrink the model's variance around its earlier ones, so a round spreads out).
/// Rounds are evaluated like a grid, so the result depends on the seed only, never on timing or
/// threads; no candidate is proposed twice; at most `max_trials` trials. The `pareto` target
/// scalarises its objectives with random weights each round (ParEGO).
fn bayesian(search: &Search, base_dir: &Path, threads: usize, cache: Option<&Cache>, progress: &Progress) -> Evaluated {
    let pool = &search.selected;
    let budget = trial_count(search);
    let per_round = (search.optimizer.parallelism as usize).min(search.optimizer.max_trials as usize).max(1);
    // The pool's points, each dimension scaled to [0, 1] over the pool (constant ones dropped).
    let raw: Vec<Vec<f64>> = pool.iter().map(|&i| search.space.raw_features(i)).collect();
    let dims = raw.first().map_or(0, Vec::len);
    let mut lo = vec![f64::INFINITY; dims];
    let mut hi = vec![f64::NEG_INFINITY; dims];
    for p in &raw {
        for d in 0..dims {
            lo[d] = lo[d].min(p[d]);
            hi[d] = hi[d].max(p[d]);
        }
    }
    let keep: Vec<usize> = (0..dims).filter(|&d| hi[d] > lo[d]).collect();
    let points: Vec<Vec<f64>> =
        raw.iter().map(|p| keep.iter().map(|&d| (p[d] - lo[d]) / (hi[d] - lo[d])).collect()).collect();
    drop(raw);
    let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(search.optimizer.seed);
    let mut chosen = vec![false; pool.len()];
    let mut order: Vec<usize> = Vec::new(); // pool positions, in evaluation order
    let mut trials: Vec<Trial> = Vec::new();
    let mut hits = 0;
    while order.len() < budget {
        let want = per_round.min(budget - order.len());
        let open: Vec<usize> = (0..pool.len()).filter(|&p| !chosen[p]).collect();
        let batch: Vec<usize> = if order.is_empty() {
            rand::seq::index::sample(&mut rng, open.len(), want).into_iter().map(|k| open[k]).collect()
        } else {
            // At most 4096 proposals per round are scored (drawn with the seed from the rest).
            let proposals: Vec<usize> = if open.len() > 4096 {
                let mut s: Vec<usize> =
                    rand::seq::index::sample(&mut rng, open.len(), 4096).into_iter().map(|k| open[k]).collect();
                s.sort_unstable();
                s
            } else {
                open
            };
            let ys = observations(search, &trials, &mut rng);
            let xs: Vec<&[f64]> = order.iter().map(|&p| points[p].as_slice()).collect();
            let cands: Vec<&[f64]> = proposals.iter().map(|&p| points[p].as_slice()).collect();
            crate::bayes::propose(&xs, &ys, &cands, want).into_iter().map(|k| proposals[k]).collect()
        };
        for &p in &batch {
            chosen[p] = true;
        }
        let idx: Vec<usize> = batch.iter().map(|&p| pool[p]).collect();
        let jobs: Vec<usize> = (0..idx.len()).collect();
        let done =
            run_jobs(search, &jobs, &|k| (search.space.tree(idx[k]), idx[k]), base_dir, threads, cache, progress);
        hits += done.cache_hits;
        trials.extend(done.trials);
        order.extend(batch);
    }
    Evaluated { trials, cache_hits: hits }
}

/// What the surrogate model fits: each trial's gated score; `pareto` a ParEGO scalarisation of
/// its objectives (each scaled to [0, 1] over the trials, best = 1) with weights drawn this round.
/// Trials without a score get the worst observed value less a margin.
fn observations(search: &Search, trials: &[Trial], rng: &mut rand_chacha::ChaCha12Rng) -> Vec<f64> {
    let o = &search.optimization;
    let mut ys: Vec<Option<f64>> = trials.iter().map(|t| gated_score(search, t)).collect();
    if o.target == "pareto" {
        let k = o.pareto_objectives.len();
        let vals: Vec<Vec<f64>> = trials
            .iter()
            .map(|t| {
                o.pareto_objectives
                    .iter()
                    .map(|&ob| {
                        let (v, max) = objective(ob, t);
                        if max {
                            v
                        } else {
                            -v
                        }
                    })
                    .collect()
            })
            .collect();
        let weights: Vec<f64> = {
            let w: Vec<f64> = (0..k).map(|_| rand::Rng::random::<f64>(rng) + 1e-3).collect();
            let s: f64 = w.iter().sum();
            w.into_iter().map(|x| x / s).collect()
        };
        let live: Vec<usize> = (0..trials.len()).filter(|&i| ys[i].is_some()).collect();
        let bounds: Vec<(f64, f64)> = (0..k)
            .map(|j| {
                live.iter()
                    .map(|&m| vals[m][j])
                    .filter(|v| v.is_finite())
                    .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)))
            })
            .collect();
        let scaled = |i: usize, j: usize| {
            let (lo, hi) = bounds[j];
            if !vals[i][j].is_finite() || hi <= lo {
                0.5
            } else {
                (vals[i][j] - lo) / (hi - lo)
            }
        };
        for &i in &live {
            let f: Vec<f64> = (0..k).map(|j| weights[j] * scaled(i, j)).collect();
            let min = f.iter().copied().fold(f64::INFINITY, f64::min);
            ys[i] = Some(min + 0.05 * f.iter().sum::<f64>());
        }
    }
    let finite: Vec<f64> = ys.iter().flatten().copied().collect();
    let worst = finite.iter().copied().fold(f64::INFINITY, f64::min);
    let best = finite.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let fill = if finite.is_empty() { 0.0 } else { worst - 0.25 * (best - worst).max(worst.abs() * 0.1).max(1e-9) };
    ys.into_iter().map(|y| y.unwrap_or(fill)).collect()
}

/// The content-addressed trial cache: a trial's result is stored under a hash of what decides it
/// (the candidate's concrete tree, the contents of the trace files it reads, the performance
/// data, servesim's version), so a re-run, or a search that overlaps an earlier one, replays
/// only what is new. Entries are JSON files `<dir>/<2 hex>/<64 hex>.json`, floats kept as their
/// exact bits, each carrying a digest of its values: an entry edited or damaged since it was
/// written, or one whose GPU count does not match its candidate, is replayed again.
pub struct Cache {
    /// Directories looked in, in order.
    lookup: Vec<std::path::PathBuf>,
    /// Where entries are written (a hit found elsewhere is copied here too).
    write: std::path::PathBuf,
    inputs: String,
    /// The keys this run read or wrote.
    used: Mutex<std::collections::HashSet<String>>,
}

impl Cache {
    /// A cache over `lookup` writing into `write`, for the inputs of `search` (trace paths
    /// relative to `base_dir`). Fails, saying why, when an input cannot be digested (a pipe or
    /// a device, whose contents a digest would consume or never finish reading).
    pub fn new(
        search: &Search,
        base_dir: &Path,
        lookup: Vec<std::path::PathBuf>,
        write: std::path::PathBuf,
    ) -> Result<Cache, String> {
        Ok(Cache { lookup, write, inputs: inputs_digest(&search.base, base_dir)?, used: Default::default() })
    }

    /// The digest of everything outside the candidate's tree that decides its result.
    pub fn inputs(&self) -> &str {
        &self.inputs
    }

    /// The keys of the entries this run read or wrote.
    pub fn used_keys(&self) -> std::collections::HashSet<String> {
        self.used.lock().expect("used keys").clone()
    }

    fn key(&self, tree: &Value) -> String {
        let doc = json!({
            "servesim": env!("CARGO_PKG_VERSION"),
            "candidate": crate::sorted(tree),
            "inputs": self.inputs,
        });
        blake3::hash(canonical(&doc).as_bytes()).to_hex().to_string()
    }

    fn file(dir: &Path, key: &str) -> std::path::PathBuf {
        dir.join(&key[..2]).join(format!("{key}.json"))
    }

    fn get(&self, key: &str, tree: &Value) -> Option<Trial> {
        for dir in &self.lookup {
            let path = Cache::file(dir, key);
            let Ok(bytes) = std::fs::read(&path) else { continue };
            let Ok(v) = serde_json::from_slice::<Value>(&bytes) else { continue };
            if v.get("key").and_then(Value::as_str) != Some(key) || !digest_holds(&v) {
                continue;
            }
            let Some(t) = trial_fields(&v, tree.clone()) else { continue };
            if *dir != self.write {
                self.store(key, &bytes);
            }
            self.used.lock().expect("used keys").insert(key.to_string());
            return Some(t);
        }
        None
    }

    /// Keeps a trial that replayed (merged shards keep theirs, as one run would).
    pub fn record(&self, t: &Trial) {
        if !t.summary.is_empty() {
            self.put(&self.key(&t.tree), t);
        }
    }

    fn put(&self, key: &str, t: &Trial) {
        let mut v = trial_json(0, t);
        let o = v.as_object_mut().expect("an object");
        o.remove("index");
        o.remove("digest");
        o.insert("key".into(), json!(key));
        let v = with_digest(v);
        self.store(key, &serde_json::to_vec(&v).expect("serialises"));
        self.used.lock().expect("used keys").insert(key.to_string());
    }

    /// Writes an entry under a temporary name and renames it into place; a cache that cannot
    /// be written only costs the re-use.
    fn store(&self, key: &str, bytes: &[u8]) {
        let path = Cache::file(&self.write, key);
        let Some(dir) = path.parent() else { return };
        if std::fs::create_dir_all(dir).is_err() {
            return;
        }
        let tmp = dir.join(format!(".{key}.{}.partial", std::process::id()));
        if std::fs::write(&tmp, bytes).is_ok() && std::fs::rename(&tmp, &path).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

/// `v` (an object) with a `digest` of its other values added.
pub fn with_digest(mut v: Value) -> Value {
    let d = content_digest(&v);
    v.as_object_mut().expect("an object").insert("digest".into(), json!(d));
    v
}

/// The digest of an object's values other than its own `digest`.
fn content_digest(v: &Value) -> String {
    let mut rest = v.clone();
    if let Some(o) = rest.as_object_mut() {
        o.remove("digest");
    }
    blake3::hash(canonical(&rest).as_bytes()).to_hex().to_string()
}

/// Whether an object's `digest` matches its values (it was not edited or damaged since).
pub fn digest_holds(v: &Value) -> bool {
    v.get("digest").and_then(Value::as_str).is_some_and(|d| d == content_digest(v))
}

/// How deep a digest walks into a trace directory.
const MAX_INPUT_DEPTH: usize = 64;

/// The digest of everything a configuration reads: its trace paths (relative to `base_dir`; a
/// directory by every file under it) and the performance data its timing reads from. The
/// cache key's inputs beside the tree itself, and what shards of one search must agree on.
/// Symbolic links inside a directory are digested by their target's name (never followed: a
/// link to an ancestor would make the walk endless), and a pipe or device makes it fail.
pub fn inputs_digest(base: &Value, base_dir: &Path) -> Result<String, String> {
    let mut h = blake3::Hasher::new();
    let paths = get(base, &["traffic", "source", "paths"]).and_then(Value::as_array).cloned().unwrap_or_default();
    // Named as the configuration spells them (the tree holds that already) and, inside a
    // directory, by their names there: where the files sit does not change the key.
    fn add(h: &mut blake3::Hasher, p: &Path, depth: usize, top: bool) -> Result<(), String> {
        let meta = if top { std::fs::metadata(p) } else { std::fs::symlink_metadata(p) };
        let Ok(meta) = meta else {
            h.update(b"\0unreadable");
            return Ok(());
        };
        if meta.file_type().is_symlink() {
            h.update(b"\0symlink");
            let target = std::fs::read_link(p).map(|t| t.to_string_lossy().into_owned()).unwrap_or_default();
            h.update(target.as_bytes());
        } else if meta.is_dir() {
            if depth >= MAX_INPUT_DEPTH {
                return Err(format!("{}: more than {MAX_INPUT_DEPTH} directories deep", p.display()));
            }
            let mut entries: Vec<_> =
                std::fs::read_dir(p).into_iter().flatten().filter_map(|e| e.ok().map(|e| e.path())).collect();
            entries.sort();
            for e in entries {
                h.update(e.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default().as_bytes());
                add(h, &e, depth + 1, false)?;
            }
        } else if meta.is_file() {
            match std::fs::File::open(p) {
                Ok(mut f) => {
                    let _ = std::io::copy(&mut f, h);
                }
                Err(_) => {
                    h.update(b"\0unreadable");
                }
            }
        } else {
            return Err(format!("{} is not a regular file (a pipe or a device cannot be digested)", p.display()));
        }
        Ok(())
    }
    for p in paths.iter().filter_map(Value::as_str) {
        let path = Path::new(p);
        let full = if path.is_absolute() { path.to_path_buf() } else { base_dir.join(path) };
        h.update(p.as_bytes());
        add(&mut h, &full, 0, true)?;
    }
    h.update(b"\0performance data");
    h.update(servesim_perf::systems::data_fingerprint(&systems_paths(base)).as_bytes());
    Ok(h.finalize().to_hex().to_string())
}

/// The configuration's `engine.systems_paths`, if it names any.
fn systems_paths(base: &Value) -> Vec<String> {
    get(base, &["engine", "systems_paths"])
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default()
}

/// Floats as `{"f64": "<16 hex digits>"}` so a cached summary reads back bit for bit.
fn exact_floats(v: &Value) -> Value {
    match v {
        Value::Number(n) if n.is_f64() => json!({"f64": format!("{:016x}", n.as_f64().unwrap().to_bits())}),
        Value::Array(a) => Value::Array(a.iter().map(exact_floats).collect()),
        Value::Object(m) => Value::Object(m.iter().map(|(k, v)| (k.clone(), exact_floats(v))).collect()),
        v => v.clone(),
    }
}

fn from_exact_floats(v: &Value) -> Option<Value> {
    Some(match v {
        Value::Object(m) if m.len() == 1 && m.contains_key("f64") => {
            let bits = u64::from_str_radix(m["f64"].as_str()?, 16).ok()?;
            Value::Number(serde_json::Number::from_f64(f64::from_bits(bits))?)
        }
        Value::Array(a) => Value::Array(a.iter().map(from_exact_floats).collect::<Option<_>>()?),
        Value::Object(m) => Value::Object(
            m.iter().map(|(k, v)| Some((k.clone(), from_exact_floats(v)?))).collect::<Option<Map<_, _>>>()?,
        ),
        v => v.clone(),
    })
}

const METRIC_KEYS: [&str; 20] = [
    "completed_requests",
    "num_ttft_samples",
    "num_tpot_samples",
    "num_e2e_latency_samples",
    "output_throughput_tok_s",
    "mean_ttft_ms",
    "mean_tpot_ms",
    "mean_e2e_latency_ms",
    "mean_output_token_throughput_per_user",
    "goodput_output_throughput_tok_s",
    "request_throughput_rps",
    "goodput_request_throughput_rps",
    "goodput_completed_requests",
    "gpu_hours",
    "duration_ms",
    "power_w",
    "power_coverage",
    "planner_total_ticks",
    "mean_handoff_to_first_token_ms",
    "total_gpus",
];

fn metric(t: &Trial, k: &str) -> f64 {
    t.summary.get(k).and_then(Value::as_f64).unwrap_or(0.0)
}

/// Time-averaged provisioned GPUs: `gpu_hours / (duration_ms / 3.6e6)`.
pub fn avg_gpu(t: &Trial) -> f64 {
    let (h, d) = (metric(t, "gpu_hours"), metric(t, "duration_ms"));
    if h <= 0.0 || d <= 0.0 {
        0.0
    } else {
        h / (d / 3.6e6)
    }
}

/// The objective's raw value and whether it is maximised.
pub fn objective(target: &str, t: &Trial) -> (f64, bool) {
    let per_gpu = |v: f64| {
        let g = avg_gpu(t);
        if g == 0.0 {
            0.0
        } else {
            v / g
        }
    };
    match target {
        "throughput" => (metric(t, "output_throughput_tok_s"), true),
        "goodput" => (metric(t, "goodput_output_throughput_tok_s"), true),
        "throughput_per_gpu" => (per_gpu(metric(t, "output_throughput_tok_s")), true),
        "goodput_per_gpu" => (per_gpu(metric(t, "goodput_output_throughput_tok_s")), true),
        "throughput_per_user" => (metric(t, "mean_output_token_throughput_per_user"), true),
        "ttft" => {
            let v = metric(t, "mean_ttft_ms");
            (if metric(t, "num_ttft_samples") > 0.0 && v.is_finite() { v } else { f64::INFINITY }, false)
        }
        "e2e_latency" => {
            let v = metric(t, "mean_e2e_latency_ms");
            (if metric(t, "num_e2e_latency_samples") > 0.0 && v.is_finite() { v } else { f64::INFINITY }, false)
        }
        _ => (t.used_gpus as f64, false),
    }
}

/// Strict-SLA feasibility (always applied for min_gpus): the aggregate means, inclusive.
fn sla_failure(sla: &schema::Sla, t: &Trial) -> Option<String> {
    if metric(t, "completed_requests") <= 0.0 {
        return Some("completed_requests <= 0".into());
    }
    for (bound, key, samples) in [
        (sla.ttft_ms, "mean_ttft_ms", "num_ttft_samples"),
        (sla.itl_ms, "mean_tpot_ms", "num_tpot_samples"),
        (sla.e2e_ms, "mean_e2e_latency_ms", "num_e2e_latency_samples"),
    ] {
        if let Some(b) = bound {
            let v = t.summary.get(key).and_then(Value::as_f64);
            match v {
                Some(v) if v.is_finite() && metric(t, samples) > 0.0 && v <= b => {}
                Some(v) => return Some(format!("{key}={v} > {b}")),
                None => return Some(format!("{key} missing")),
            }
        }
    }
    None
}

/// The ranked result: scores, feasibility, order, views.
pub struct Ranked {
    pub trials: Vec<Trial>,
    pub scores: Vec<f64>,
    pub top_n: Vec<usize>,
    pub pareto: Vec<usize>,
    /// Trials served from the cache (`counts.cache_hits`).
    pub cache_hits: usize,
}

fn canonical(v: &Value) -> String {
    serde_json::to_string(&crate::sorted(v)).expect("serialises")
}

pub fn rank(search: &Search, mut trials: Vec<Trial>) -> Ranked {
    let o = &search.optimization;
    for t in trials.iter_mut().filter(|t| t.status == "feasible") {
        if o.strict_sla || o.target == "min_gpus" {
            if let Some(why) = sla_failure(&search.sla, t) {
                t.status = "infeasible";
                t.reason_category = Some("sla_constraint");
                t.reason = Some(why);
                continue;
            }
        }
        if let Some(floor) = o.min_goodput_rps {
            let g = metric(t, "goodput_request_throughput_rps");
            if g < floor {
                t.status = "infeasible";
                t.reason_category = Some("load_constraint");
                t.reason = Some(format!("goodput_request_throughput_rps={g} < min_goodput_rps={floor}"));
            }
        }
    }
    // Higher is better; a Pareto candidate's score is its first objective's raw value, a
    // headline only (the front does not rank by it).
    let scores: Vec<f64> = trials
        .iter()
        .map(|t| {
            if o.target == "pareto" {
                return objective(o.pareto_objectives[0], t).0;
            }
            let (v, max) = objective(o.target, t);
            if max {
                v
            } else {
                -v
            }
        })
        .collect();
    let keys: Vec<String> = trials.iter().map(|t| canonical(&t.tree)).collect();
    let mut feasible: Vec<usize> = (0..trials.len()).filter(|&i| trials[i].status == "feasible").collect();
    let mut pareto = Vec::new();
    let mut top_n = Vec::new();
    if o.target == "pareto" {
        let objs = &o.pareto_objectives;
        let obj = |i: usize| -> Vec<(f64, bool)> { objs.iter().map(|t| objective(t, &trials[i])).collect() };
        // a dominates b: no worse on every objective (in its own direction), better on one.
        let dominates = |a: &[(f64, bool)], b: &[(f64, bool)]| {
            let mut better = false;
            for (&(av, max), &(bv, _)) in a.iter().zip(b) {
                let (wins, loses) = if max { (av > bv, av < bv) } else { (av < bv, av > bv) };
                if loses {
                    return false;
                }
                better |= wins;
            }
            better
        };
        for &i in &feasible {
            let a = obj(i);
            if !feasible.iter().any(|&j| j != i && dominates(&obj(j), &a)) {
                pareto.push(i);
            }
        }
        // By the last objective ascending (the front's x-axis), then the others best-first,
        // GPUs, config.
        pareto.sort_by(|&i, &j| {
            let (a, b) = (obj(i), obj(j));
            let n = a.len() - 1;
            let mut order = a[n].0.total_cmp(&b[n].0);
            for k in 0..n {
                let (x, y) = if a[k].1 { (b[k].0, a[k].0) } else { (a[k].0, b[k].0) };
                order = order.then(x.total_cmp(&y));
            }
            order.then(trials[i].used_gpus.cmp(&trials[j].used_gpus)).then(keys[i].cmp(&keys[j]))
        });
    } else if o.target == "min_gpus" {
        feasible.sort_by(|&i, &j| {
            let e = |k: usize| {
                let v = metric(&trials[k], "mean_e2e_latency_ms");
                if v.is_finite() {
                    v
                } else {
                    f64::INFINITY
                }
            };
            trials[i]
                .used_gpus
                .cmp(&trials[j].used_gpus)
                .then(
                    metric(&trials[j], "goodput_output_throughput_tok_s")
                        .total_cmp(&metric(&trials[i], "goodput_output_throughput_tok_s")),
                )
                .then(e(i).total_cmp(&e(j)))
                .then(keys[i].cmp(&keys[j]))
        });
        top_n = feasible;
    } else {
        feasible.sort_by(|&i, &j| {
            scores[j]
                .total_cmp(&scores[i])
                .then(trials[i].used_gpus.cmp(&trials[j].used_gpus))
                .then(keys[i].cmp(&keys[j]))
        });
        top_n = feasible;
    }
    Ranked { trials, scores, top_n, pareto, cache_hits: 0 }
}

fn candidate_id(i: usize) -> String {
    format!("candidate-{:06}", i + 1)
}

fn metrics_of(t: &Trial) -> Value {
    let mut m = Map::new();
    for k in METRIC_KEYS {
        if let Some(v) = t.summary.get(k) {
            m.insert(k.to_string(), v.clone());
        }
    }
    Value::Object(m)
}

/// The knobs a candidate sets (its point in the search space).
fn knobs_of(t: &Trial) -> Value {
    let mut m = Map::new();
    if let Some(w) = get(&t.tree, &["engine", "workers"]).and_then(Value::as_object) {
        for (role, cfg) in w {
            for (section, keys) in [
                ("parallelism", &["replicas", "tensor", "attention_data"][..]),
                ("scheduler", &["max_batched_tokens", "max_sequences"][..]),
            ] {
                for k in keys {
                    if let Some(v) = cfg.get(section).and_then(|s| s.get(*k)) {
                        m.insert(format!("{role}.{section}.{k}"), v.clone());
                    }
                }
            }
        }
    }
    for section in ["router", "planner"] {
        if let Some(r) = t.tree.get(section).and_then(Value::as_object) {
            for (k, v) in r {
                match v {
                    Value::Object(o) => {
                        for (k2, v2) in o {
                            m.insert(format!("{section}.{k}.{k2}"), v2.clone());
                        }
                    }
                    v => {
                        m.insert(format!("{section}.{k}"), v.clone());
                    }
                }
            }
        }
    }
    Value::Object(m)
}

/// `recommendation.json` (schema 1.1 keys), `recommendation.csv` and the replayable configs
/// of the ranked view, as (file name, bytes). Deterministic: no wall-clock fields.
pub fn outputs(search: &Search, r: &Ranked) -> Vec<(String, Vec<u8>)> {
    let o = &search.optimization;
    let mut counts = Map::new();
    for k in
        ["evaluated", "feasible", "infeasible", "unsupported", "timed_out", "failed", "resource_limited", "cache_hits"]
    {
        counts.insert(k.into(), json!(0));
    }
    counts.insert("cache_hits".into(), json!(r.cache_hits));
    let mut candidates = Vec::new();
    let mut csv = String::from(
        "schema_version,candidate_id,status,reason_category,reason,used_gpus,score,power_w,power_coverage,power_source,config_json,prediction_config_json,metrics_json,objectives_json,provenance_json,is_top_n,is_pareto\n",
    );
    let quote = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
    for (i, t) in r.trials.iter().enumerate() {
        *counts.get_mut("evaluated").unwrap() = json!(counts["evaluated"].as_u64().unwrap() + 1);
        *counts.get_mut(t.status).unwrap() = json!(counts[t.status].as_u64().unwrap() + 1);
        let score = if t.summary.is_empty() { Value::Null } else { json!(r.scores[i]) };
        // The objective vector Pareto dominance read (raw values); scalar targets have none.
        let objectives = if t.summary.is_empty() || o.target != "pareto" {
            Value::Null
        } else {
            Value::Object(o.pareto_objectives.iter().map(|&k| (k.to_string(), json!(objective(k, t).0))).collect())
        };
        let provenance = json!({
            "model": get(&t.tree, &["engine", "model"]),
            "hardware": get(&t.tree, &["engine", "hardware"]),
            "backend": get(&t.tree, &["engine", "backend"]).cloned().unwrap_or(json!("vllm")),
            "objective": o.target,
            "sla": {"ttft_ms": search.sla.ttft_ms, "itl_ms": search.sla.itl_ms, "e2e_ms": search.sla.e2e_ms},
            "timing": t.summary.get("prediction_provenance").cloned().unwrap_or(Value::Null),
            "runner_metadata": {"runner": "servesim"},
        });
        let c = json!({
            "candidate_id": candidate_id(i),
            "status": t.status,
            "config": knobs_of(t),
            "prediction_config": t.tree,
            "used_gpus": t.used_gpus,
            "score": score,
            "metrics": metrics_of(t),
            "objectives": objectives,
            "reason_category": t.reason_category,
            "reason": t.reason,
            "provenance": provenance,
        });
        let s = |k: &str| serde_json::to_string(&c[k]).expect("serialises");
        csv.push_str(&format!(
            "1.1,{},{},{},{},{},{},,,,{},{},{},{},{},{},{}\n",
            candidate_id(i),
            t.status,
            t.reason_category.unwrap_or(""),
            quote(t.reason.as_deref().unwrap_or("")),
            t.used_gpus,
            if score.is_null() { String::new() } else { score.to_string() },
            quote(&s("config")),
            quote(&s("prediction_config")),
            quote(&s("metrics")),
            quote(&s("objectives")),
            quote(&s("provenance")),
            r.top_n.contains(&i),
            r.pareto.contains(&i),
        ));
        candidates.push(c);
    }
    let mut doc = json!({
        "schema_version": "1.1",
        "candidate_retention": "all",
        "counts": counts,
        "candidates": candidates,
        "views": {
            "top_n": r.top_n.iter().map(|&i| candidate_id(i)).collect::<Vec<_>>(),
            "pareto_front": r.pareto.iter().map(|&i| candidate_id(i)).collect::<Vec<_>>(),
        },
        "provenance": {
            "tool": "servesim",
            "version": env!("CARGO_PKG_VERSION"),
            "algorithm": search.optimizer.algorithm,
            "seed": search.optimizer.seed,
            "gpu_budget": o.budget,
            "target": o.target,
            "kv_excluded": search.kv_excluded,
            "over_budget_excluded": search.over_budget,
        },
    });
    if let Some(b) = &search.planner_backtest {
        doc["provenance"]["planner_load_predictor"] = b.clone();
    }
    let mut files = vec![
        ("recommendation.json".to_string(), serde_json::to_vec_pretty(&doc).expect("serialises")),
        ("recommendation.csv".to_string(), csv.into_bytes()),
    ];
    let view = if o.target == "pareto" { &r.pareto } else { &r.top_n };
    for (rank, &i) in view.iter().enumerate() {
        let yaml = serde_yaml_ng::to_string(&r.trials[i].tree).expect("a tree serialises");
        files.push((format!("recommendations/{:04}.yaml", rank + 1), yaml.into_bytes()));
    }
    files
}

/// Evaluates chosen candidates of the space (indexes into it, in that order), without a cache.
pub fn evaluate_indices(search: &Search, indices: &[usize], base_dir: &Path, threads: usize) -> Vec<Trial> {
    let jobs: Vec<usize> = (0..indices.len()).collect();
    let job = |k: usize| (search.space.tree(indices[k]), indices[k]);
    run_jobs(search, &jobs, &job, base_dir, threads, None, &Progress::silent()).trials
}

/// A trial as a shard file keeps it (the candidate is named by its index; the tree is rebuilt
/// from the configuration when shards are merged). Floats are kept as their exact bits:
/// serde_json's default parser can read a printed float back one ulp off, and merged shards
/// must equal one run byte for byte.
pub fn trial_json(index: usize, t: &Trial) -> Value {
    with_digest(json!({
        "index": index,
        "status": t.status,
        "reason_category": t.reason_category,
        "reason": t.reason,
        "used_gpus": t.used_gpus,
        "summary": exact_floats(&Value::Object(t.summary.clone())),
    }))
}

const STATUSES: [&str; 6] = ["feasible", "infeasible", "unsupported", "timed_out", "failed", "resource_limited"];
const CATEGORIES: [&str; 15] = [
    "gpu_budget",
    "kv_capacity",
    "sla_constraint",
    "load_constraint",
    "backend_topology",
    "runtime_timeout",
    "resource_limit",
    "candidate_materialization",
    "replay_runtime",
    "runner_contract",
    "invalid_metrics",
    "no_samples",
    "parallel_projection",
    "adapter_constraint",
    "unknown",
];

/// Reads a trial back; `None` when the record is malformed, or was edited or damaged since it
/// was written (its digest does not match).
pub fn trial_from_json(search: &Search, v: &Value) -> Option<(usize, Trial)> {
    if !digest_holds(v) {
        return None;
    }
    let index = v.get("index")?.as_u64()? as usize;
    let tree = search.candidate(index)?;
    Some((index, trial_fields(v, tree)?))
}

/// A trial's fields from a shard record or a cache entry (floats kept as bits).
fn trial_fields(v: &Value, tree: Value) -> Option<Trial> {
    let status = STATUSES.iter().copied().find(|s| v.get("status").and_then(Value::as_str) == Some(*s))?;
    let reason_category = match v.get("reason_category")? {
        Value::Null => None,
        c => Some(CATEGORIES.iter().copied().find(|s| c.as_str() == Some(*s))?),
    };
    let reason = v.get("reason")?.as_str().map(str::to_string);
    let used_gpus = v.get("used_gpus")?.as_u64()?;
    // The GPU count is the candidate's own: a record that says otherwise is not its record.
    if used_gpus != self::used_gpus(&tree) {
        return None;
    }
    let summary = v.get("summary")?;
    let summary = from_exact_floats(summary)?;
    let summary = summary.as_object()?.clone();
    Some(Trial { tree, used_gpus, status, reason_category, reason, summary })
}

/// Evaluates the candidates of shard `k` of `n` (candidate i belongs to shard i mod n).
pub fn evaluate_shard(
    search: &Search,
    base_dir: &Path,
    threads: usize,
    k: usize,
    n: usize,
    cache: Option<&Cache>,
) -> Vec<(usize, Trial)> {
    let indices: Vec<usize> = (0..search.selected.len()).filter(|i| i % n == k).collect();
    if indices.is_empty() {
        return Vec::new();
    }
    let done = run_jobs(
        search,
        &indices,
        &|i| (search.space.tree(search.selected[i]), search.selected[i]),
        base_dir,
        threads,
        cache,
        &Progress::silent(),
    );
    indices.into_iter().zip(done.trials).collect()
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

    #[test]
    fn cached_floats_read_back_bit_for_bit() {
        let v = json!({"a": 0.1 + 0.2, "b": [1e-300, 5e-324, -0.0, 123456.789e10], "c": 7, "d": "x"});
        assert_eq!(from_exact_floats(&exact_floats(&v)).unwrap(), v);
        let text = serde_json::to_string(&exact_floats(&v)).unwrap();
        let back = from_exact_floats(&serde_json::from_str(&text).unwrap()).unwrap();
        assert_eq!(back["a"].as_f64().unwrap().to_bits(), (0.1f64 + 0.2).to_bits());
    }
}
