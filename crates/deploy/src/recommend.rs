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
    pub seed: u64,
}

/// One searched knob: where it lives in the tree and the values it takes.
#[derive(Clone, Debug)]
struct Knob {
    path: Vec<String>,
    values: Vec<u64>,
}

/// A search: the base tree and the candidates' knob settings.
pub struct Search {
    pub base: Value,
    pub optimization: Optimization,
    pub optimizer: Optimizer,
    pub sla: schema::Sla,
    /// Each candidate: the concrete predict tree.
    pub candidates: Vec<Value>,
}

fn domain(path: &str, v: &Value) -> Result<Vec<u64>, DeployError> {
    match v {
        Value::Number(n) => n
            .as_u64()
            .filter(|&x| x > 0)
            .map(|x| vec![x])
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
                vals
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
                match (scale, step) {
                    ("linear", None) => {
                        return Err(DeployError::new(format!("{path}.range"), "integer linear range requires step"))
                    }
                    ("log", Some(_)) => {
                        return Err(DeployError::new(format!("{path}.range"), "log ranges reject step"))
                    }
                    ("linear", Some(s)) => {
                        let mut x = min;
                        while x <= max {
                            vals.push(x);
                            x += s as u64;
                        }
                    }
                    _ => {
                        // Integer log range: powers of two between the bounds.
                        let mut x = min;
                        while x <= max {
                            vals.push(x);
                            x *= 2;
                        }
                    }
                }
                vals
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
    let mut out = Optimizer { algorithm: "grid", max_trials: 320, seed: 42 };
    let Some(mut o) = o else { return Ok(out) };
    out.algorithm = o.choice("algorithm", &["grid", "random", "bayesian"])?.unwrap_or("grid");
    if out.algorithm == "bayesian" {
        return Err(o.err(
            "algorithm",
            "bayesian search is not supported by servesim yet; use grid (every candidate) or random",
        ));
    }
    out.max_trials = o.positive("max_trials")?.unwrap_or(320);
    o.positive("parallelism")?; // trials run on every core; accepted for compatibility
    o.nonneg("candidate_timeout_seconds", true)?;
    out.seed = o.u64("seed")?.unwrap_or(42);
    o.finish()?;
    Ok(out)
}

/// Reads a recommend configuration and lists its candidates.
pub fn read_search(root: &Value) -> Result<Search, DeployError> {
    let mut top = Obj::new("", root)?;
    let optimization = read_optimization(top.obj("optimization")?)?;
    let optimizer = read_optimizer(top.obj("optimizer")?)?;
    drop(top);
    let mut base = root.clone();
    let obj = base.as_object_mut().expect("checked");
    obj.remove("optimization");
    obj.remove("optimizer");
    if obj.contains_key("planner") {
        // Refused rather than ignored: every candidate would otherwise replay without it.
        return Err(DeployError::new(
            "planner",
            "the recommend search over planner settings is not supported yet (predict -c replays one planner \
             configuration)",
        ));
    }
    let mode = get(&base, &["engine", "mode"]).and_then(Value::as_str).unwrap_or("aggregated").to_string();
    let roles: &[&str] = if mode == "disaggregated" { &["prefill", "decode"] } else { &["aggregated"] };
    // Per role: the parallel shapes (replicas, tp, dp) and the scheduler knobs.
    let mut role_shapes: Vec<Vec<(u64, u64, u64)>> = Vec::new();
    let mut all_preset = true;
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
        all_preset &= preset;
        let shapes = if preset {
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
            let d = |k: &str| -> Result<Vec<u64>, DeployError> {
                match par.as_ref().and_then(|p| p.get(k)) {
                    Some(v) => domain(&format!("{ppath}.{k}"), v),
                    None => Ok(vec![1]),
                }
            };
            let (rs, ts, ds) = (d("replicas")?, d("tensor")?, d("attention_data")?);
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
        role_shapes.push(shapes);
        let (mbt, seqs): (&[u64], &[u64]) = match *role {
            "prefill" => (&[8192, 16384, 32768], &[1, 2, 4, 8, 16, 32, 64, 128, 256]),
            "decode" => (&[8192], &[256, 512, 1024]),
            _ => (&[8192, 16384, 32768], &[256, 512, 1024]),
        };
        for (key, default) in [("max_batched_tokens", mbt), ("max_sequences", seqs)] {
            let kpath = ["engine", "workers", role, "scheduler", key];
            let values = match get(&base, &kpath) {
                Some(v) => domain(&kpath.join("."), v)?,
                None => default.to_vec(),
            };
            knobs.push(Knob { path: kpath.iter().map(|s| s.to_string()).collect(), values });
        }
    }
    // Shapes across roles under the budget (disaggregated: every prefill/decode pair).
    let mut shape_sets: Vec<Vec<(u64, u64, u64)>> = vec![Vec::new()];
    for shapes in &role_shapes {
        let mut next = Vec::new();
        for prefix in &shape_sets {
            for s in shapes {
                let mut v = prefix.clone();
                v.push(*s);
                let gpus: u64 = v.iter().map(|(r, t, d)| r * t * d).sum();
                // Explicit domains keep over-budget shapes (reported infeasible); the preset pool
                // only holds shapes that fit.
                if gpus <= optimization.budget as u64 || !all_preset {
                    next.push(v);
                }
            }
        }
        shape_sets = next;
    }
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
    let mut candidates = Vec::new();
    for shapes in &shape_sets {
        let gpus: u64 = shapes.iter().map(|(r, t, d)| r * t * d).sum();
        if gpus < optimization.min_gpus as u64 {
            continue;
        }
        let mut combos: Vec<Vec<u64>> = vec![Vec::new()];
        for k in &knobs {
            combos =
                combos.into_iter().flat_map(|c| k.values.iter().map(move |v| [c.clone(), vec![*v]].concat())).collect();
        }
        for combo in combos {
            let mut t = base.clone();
            for (role, (r, tp, dp)) in roles.iter().zip(shapes) {
                let mut p = get(&t, &["engine", "workers", role, "parallelism"]).cloned().unwrap_or(json!({}));
                let o = p.as_object_mut().ok_or_else(|| {
                    DeployError::new(format!("engine.workers.{role}.parallelism"), "must be a mapping")
                })?;
                o.insert("replicas".into(), json!(r));
                o.insert("tensor".into(), json!(tp));
                o.insert("attention_data".into(), json!(dp));
                set(&mut t, &["engine".into(), "workers".into(), role.to_string(), "parallelism".into()], p);
            }
            for (k, v) in knobs.iter().zip(&combo) {
                set(&mut t, &k.path, json!(v));
            }
            candidates.push(t);
        }
    }
    if candidates.is_empty() {
        return Err(DeployError::new("optimization.constraints", "no candidate fits the GPU budget"));
    }
    if optimizer.algorithm == "random" && (optimizer.max_trials as usize) < candidates.len() {
        let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(optimizer.seed);
        candidates.shuffle(&mut rng);
        candidates.truncate(optimizer.max_trials as usize);
    }
    Ok(Search { base, optimization, optimizer, sla, candidates })
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

/// Evaluates every candidate on `threads` threads (0: every core); results in candidate order.
pub fn evaluate(
    search: &Search,
    base_dir: &Path,
    threads: usize,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Vec<Trial> {
    let n = search.candidates.len();
    let threads =
        if threads == 0 { std::thread::available_parallelism().map_or(1, |n| n.get()) } else { threads }.min(n).max(1);
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Trial>>> = Mutex::new(vec![None; n]);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let t = trial(&search.candidates[i], search, base_dir);
                results.lock().expect("results")[i] = Some(t);
                progress(done.fetch_add(1, Ordering::Relaxed) + 1, n);
            });
        }
    });
    results.into_inner().expect("results").into_iter().map(|t| t.expect("every candidate evaluated")).collect()
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

fn trial(tree: &Value, search: &Search, base_dir: &Path) -> Trial {
    let used = used_gpus(tree);
    let mut t = Trial {
        tree: tree.clone(),
        used_gpus: used,
        status: "feasible",
        reason_category: None,
        reason: None,
        summary: Map::new(),
    };
    if used > search.optimization.budget as u64 {
        t.status = "infeasible";
        t.reason_category = Some("gpu_budget");
        t.reason = Some(format!("used_gpus={used} > gpu_budget={}", search.optimization.budget));
        return t;
    }
    let prepared = schema::read_predict(tree).and_then(|c| crate::prepare(c, base_dir));
    let prepared = match prepared {
        Ok(p) => p,
        Err(e) => {
            let kv = e.message.contains("KV") || e.key.contains("kv_cache");
            t.status = if kv { "infeasible" } else { "unsupported" };
            t.reason_category = Some(if kv { "kv_capacity" } else { "candidate_materialization" });
            t.reason = Some(e.to_string());
            return t;
        }
    };
    let mut p = prepared;
    p.sim.threads = 1;
    match crate::run_prediction(&p, None, &mut ()) {
        Ok(report) => {
            t.summary = crate::prediction_summary(&p, &report);
        }
        Err(e) => {
            t.status = "failed";
            t.reason_category = Some("replay_runtime");
            t.reason = Some(e);
        }
    }
    t
}

const METRIC_KEYS: [&str; 19] = [
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
    Ranked { trials, scores, top_n, pareto }
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
    let doc = json!({
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
        },
    });
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

/// A trial as a shard file keeps it (the candidate is named by its index; the tree is rebuilt
/// from the configuration when shards are merged).
pub fn trial_json(index: usize, t: &Trial) -> Value {
    json!({
        "index": index,
        "status": t.status,
        "reason_category": t.reason_category,
        "reason": t.reason,
        "used_gpus": t.used_gpus,
        "summary": Value::Object(t.summary.clone()),
    })
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

/// Reads a trial back; `None` when the record is malformed.
pub fn trial_from_json(search: &Search, v: &Value) -> Option<(usize, Trial)> {
    let index = v.get("index")?.as_u64()? as usize;
    let tree = search.candidates.get(index)?.clone();
    let status = STATUSES.iter().copied().find(|s| v.get("status").and_then(Value::as_str) == Some(*s))?;
    let reason_category = match v.get("reason_category")? {
        Value::Null => None,
        c => Some(CATEGORIES.iter().copied().find(|s| c.as_str() == Some(*s))?),
    };
    let reason = v.get("reason")?.as_str().map(str::to_string);
    let used_gpus = v.get("used_gpus")?.as_u64()?;
    let summary = v.get("summary")?.as_object()?.clone();
    Some((index, Trial { tree, used_gpus, status, reason_category, reason, summary }))
}

/// Evaluates the candidates of shard `k` of `n` (candidate i belongs to shard i mod n).
pub fn evaluate_shard(search: &Search, base_dir: &Path, threads: usize, k: usize, n: usize) -> Vec<(usize, Trial)> {
    let indices: Vec<usize> = (0..search.candidates.len()).filter(|i| i % n == k).collect();
    let sub = Search {
        base: Value::Null,
        optimization: search.optimization.clone(),
        optimizer: search.optimizer.clone(),
        sla: search.sla.clone(),
        candidates: indices.iter().map(|&i| search.candidates[i].clone()).collect(),
    };
    if sub.candidates.is_empty() {
        return Vec::new();
    }
    let trials = evaluate(&sub, base_dir, threads, &|_, _| {});
    indices.into_iter().zip(trials).collect()
}
