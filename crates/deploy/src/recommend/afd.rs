//! `recommend -c` with `engine.mode: afd`: the attention/FFN topology search. `engine.afd` holds
//! domains (`tp_a`, `a_batch_size`, `f_moe_ep_size`, `num_microbatches`, `pipeline_model`: a
//! value, `{choices: [...]}` or, for the integers, a linear `{range: {min, max, step}}`) and the
//! search's limits (`max_af_ratio`, `max_candidates`); the node split is enumerated from the GPU
//! budget in whole nodes of the hardware. The candidates follow the reference's order (attention
//! nodes, FFN nodes, then `tp_a`, batch, expert parallelism, microbatches, pipeline model) and its
//! filters (the GPU window, the A:F node ratio, expert divisibility, an optimistic pipeline only
//! from three microbatches); past `max_candidates` the search is refused, as the reference
//! refuses it. Each candidate is one concrete `engine.afd` topology, run by the AFD foreground
//! engine of `predict -c` (`crate::afd`). Random search draws as the reference's sampler does
//! (`pyrandom.rs`), the topologies its parallel configs. AFD beside a P/D companion pool
//! (`combined_with_pd: true`) and the bayesian optimizer are refused by name.

use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde_json::{json, Map, Value};

use super::record::Trial;
use super::space::{get, Branch, Identity, Knob, Optimization, Optimizer, Search, Space};
use crate::error::DeployError;
use crate::schema;

/// The keys `engine.afd` takes in a recommend configuration.
const KEYS: [&str; 11] = [
    "phase",
    "combined_with_pd",
    "a_batch_size",
    "tp_a",
    "f_moe_ep_size",
    "num_microbatches",
    "pipeline_model",
    "comm_overhead_factor",
    "boundary_on_attn",
    "max_af_ratio",
    "max_candidates",
];

const PIPELINES: [&str; 3] = ["optimistic", "conservative", "serial"];

/// Expert-parallel sizes named after the FFN pool (the reference's symbolic choices).
const EP_NAMES: [&str; 3] = ["n_f_nodes", "ffn_tp", "tp_f"];

/// An `f_moe_ep_size` choice: a size, or one derived from the FFN pool of each node split.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Ep {
    Size(u64),
    FfnNodes,
    FfnTp,
}

/// The domain `engine.afd` describes.
#[derive(Debug)]
struct Domain {
    tp_a: Option<Vec<u64>>,
    a_batch_size: Vec<u64>,
    f_moe_ep_size: Option<Vec<Ep>>,
    num_microbatches: Vec<u64>,
    pipeline_model: Vec<&'static str>,
    comm_overhead_factor: f64,
    boundary_on_attn: bool,
    max_af_ratio: f64,
    max_candidates: u64,
}

fn err(key: &str, message: impl std::fmt::Display) -> DeployError {
    DeployError::new(format!("engine.afd.{key}"), message)
}

/// The values of a domain: a value, `{choices: [...]}` (non-empty) or, `range` allowed, a linear
/// `{range: {min, max, step}}`.
fn values(key: &str, v: &Value, range: bool) -> Result<Vec<Value>, DeployError> {
    let Some(m) = v.as_object() else { return Ok(vec![v.clone()]) };
    if m.keys().eq(["choices"]) {
        let items = m["choices"].as_array().ok_or_else(|| err(&format!("{key}.choices"), "must be a list"))?;
        if items.is_empty() {
            return Err(err(&format!("{key}.choices"), "choices must be non-empty"));
        }
        return Ok(items.clone());
    }
    if range && m.keys().eq(["range"]) {
        let r = m["range"].as_object().ok_or_else(|| err(&format!("{key}.range"), "must be a mapping"))?;
        let here = format!("{key}.range");
        if let Some(k) = r.keys().find(|k| !["min", "max", "step", "scale"].contains(&k.as_str())) {
            return Err(err(&format!("{here}.{k}"), "unknown key (expected min, max, step, scale)"));
        }
        if r.get("scale").and_then(Value::as_str).is_some_and(|s| s == "log") {
            return Err(err(
                &here,
                "a log range of an AFD integer is not supported (the reference lowers AFD domains to lists: \
                 integer log ranges must be lowered as compact bounds); use choices or a linear range with step",
            ));
        }
        let int = |k: &str| {
            r.get(k)
                .and_then(Value::as_u64)
                .filter(|&n| n > 0)
                .ok_or_else(|| err(&format!("{here}.{k}"), "must be a positive integer"))
        };
        let (min, max) = (int("min")?, int("max")?);
        if r.get("step").is_none_or(Value::is_null) {
            return Err(err(&here, "integer linear engine ranges require step"));
        }
        let step = int("step")?;
        if min > max {
            return Err(err(&here, "min must not exceed max"));
        }
        if (max - min) / step >= super::MAX_DOMAIN_VALUES {
            return Err(super::too_many_values(&format!("engine.afd.{key}"), (max - min) / step + 1));
        }
        return Ok((min..=max).step_by(step as usize).map(|n| json!(n)).collect());
    }
    Err(err(
        key,
        if range {
            "a domain is a value, {choices: [...]} or {range: {min, max, step}}"
        } else {
            "a domain is a value or {choices: [...]}"
        },
    ))
}

/// A domain of unique positive integers.
fn integers(key: &str, v: &Value) -> Result<Vec<u64>, DeployError> {
    let mut out = Vec::new();
    for x in values(key, v, true)? {
        let n =
            x.as_u64().filter(|&n| n > 0).ok_or_else(|| err(key, format!("must be a positive integer, got {x}")))?;
        if out.contains(&n) {
            return Err(err(key, "must not contain duplicates"));
        }
        out.push(n);
    }
    Ok(out)
}

fn read_domain(afd: &Map<String, Value>) -> Result<Domain, DeployError> {
    if let Some(k) = afd.keys().find(|k| !KEYS.contains(&k.as_str())) {
        let why = if k == "n_a_nodes" || k == "n_f_nodes" {
            "not a recommend key: the search enumerates the attention and FFN node split within the GPU budget"
        } else {
            "unknown key"
        };
        return Err(err(k, why));
    }
    let scalar = |k: &str| afd.get(k).filter(|v| !v.is_null());
    let phase = scalar("phase").ok_or_else(|| err("phase", "missing (required)"))?;
    let phase = phase
        .as_str()
        .filter(|p| ["prefill", "decode", "both"].contains(p))
        .ok_or_else(|| err("phase", format!("unknown value {phase}; expected one of prefill, decode, both")))?;
    let combined = match scalar("combined_with_pd") {
        None => return Err(err("combined_with_pd", "missing (required)")),
        Some(v) => v.as_bool().ok_or_else(|| err("combined_with_pd", "must be a boolean"))?,
    };
    if combined {
        if phase == "both" {
            return Err(err("phase", "AFD+P/D requires phase='prefill' or phase='decode'"));
        }
        return Err(err(
            "combined_with_pd",
            "AFD+P/D recommendation (one AFD phase beside a searched prefill or decode companion pool) is not \
             supported by servesim yet; use phase: both with combined_with_pd: false",
        ));
    }
    if phase != "both" {
        return Err(err(
            "phase",
            "pure AFD recommendation requires phase='both'; use combined_with_pd=true for one phase",
        ));
    }
    let a_batch_size = integers(
        "a_batch_size",
        scalar("a_batch_size").ok_or_else(|| err("a_batch_size", "missing (required: a value or a domain)"))?,
    )?;
    let tp_a = scalar("tp_a").map(|v| integers("tp_a", v)).transpose()?;
    let num_microbatches = match scalar("num_microbatches") {
        Some(v) => integers("num_microbatches", v)?,
        None => vec![2, 3, 4],
    };
    let f_moe_ep_size = match scalar("f_moe_ep_size") {
        None => None,
        Some(v) => {
            let mut out = Vec::new();
            for x in values("f_moe_ep_size", v, false)? {
                let ep = match (x.as_u64(), x.as_str()) {
                    (Some(n), _) if n > 0 => Ep::Size(n),
                    (_, Some("n_f_nodes")) => Ep::FfnNodes,
                    (_, Some(s)) if EP_NAMES.contains(&s) => Ep::FfnTp,
                    _ => {
                        return Err(err(
                            "f_moe_ep_size",
                            format!("accepts positive integers, 'n_f_nodes', or 'ffn_tp'; got {x}"),
                        ))
                    }
                };
                if out.contains(&ep) {
                    return Err(err("f_moe_ep_size", "must not contain duplicates"));
                }
                out.push(ep);
            }
            Some(out)
        }
    };
    let pipeline_model = match scalar("pipeline_model") {
        None => vec!["optimistic", "conservative"],
        Some(v) => {
            let mut out = Vec::new();
            for x in values("pipeline_model", v, false)? {
                let p = x.as_str().and_then(|s| PIPELINES.iter().find(|p| **p == s)).ok_or_else(|| {
                    err("pipeline_model", format!("unknown value {x}; expected one of {}", PIPELINES.join(", ")))
                })?;
                if out.contains(p) {
                    return Err(err("pipeline_model", "must not contain duplicates"));
                }
                out.push(*p);
            }
            out
        }
    };
    let positive = |k: &str, default: f64| match scalar(k) {
        None => Ok(default),
        Some(v) => v
            .as_f64()
            .filter(|x| x.is_finite() && *x > 0.0)
            .ok_or_else(|| err(k, format!("must be a positive finite number, got {v}"))),
    };
    let comm_overhead_factor = positive("comm_overhead_factor", 1.0)?;
    let max_af_ratio = positive("max_af_ratio", 4.0)?;
    let max_candidates = match scalar("max_candidates") {
        None => 10_000,
        Some(v) => v.as_u64().filter(|&n| n > 0).ok_or_else(|| err("max_candidates", "must be a positive integer"))?,
    };
    let boundary_on_attn = match scalar("boundary_on_attn") {
        None => true,
        Some(v) => v.as_bool().ok_or_else(|| err("boundary_on_attn", "must be a boolean"))?,
    };
    Ok(Domain {
        tp_a,
        a_batch_size,
        f_moe_ep_size,
        num_microbatches,
        pipeline_model,
        comm_overhead_factor,
        boundary_on_attn,
        max_af_ratio,
        max_candidates,
    })
}

/// The hardware's GPUs per node (the AFD pools come in whole nodes).
fn gpus_per_node(hardware: &str) -> Result<u64, String> {
    let roots = servesim_perf::systems::systems_roots(&[]).map_err(|e| e.message)?;
    Ok(servesim_perf::systems::find_system(&roots, hardware).map_err(|e| e.message)?.gpus_per_node as u64)
}

/// The model's routed experts (0: dense).
fn experts(model: &str) -> Result<u64, String> {
    let roots = servesim_perf::systems::systems_roots(&[]).map_err(|e| e.message)?;
    let roots: Vec<std::path::PathBuf> = roots.into_iter().map(|(p, _)| p).collect();
    let spec = servesim_perf::model::ModelSpec::load(model, &roots).map_err(|e| e.message)?;
    Ok(if spec.family == servesim_perf::model::Family::Dense { 0 } else { spec.experts as u64 })
}

/// The concrete `engine.afd` topologies of the domain within `[min_gpus, budget]` GPUs, in the
/// reference's order and with its filters.
fn enumerate(d: &Domain, gpn: u64, experts: u64, min_gpus: u64, budget: u64) -> Result<Vec<Value>, DeployError> {
    let nodes = budget / gpn;
    if nodes < 2 {
        return Err(DeployError::new(
            "optimization.constraints.max_candidate_gpus",
            format!(
                "gpu_budget: node-granular AFD needs one full A node and one full F node; need at least {} GPUs, \
                 got {budget}",
                2 * gpn
            ),
        ));
    }
    let tps: Vec<u64> = match &d.tp_a {
        Some(t) => {
            let bad: Vec<u64> = t.iter().copied().filter(|v| !gpn.is_multiple_of(*v)).collect();
            if !bad.is_empty() {
                return Err(err("tp_a", format!("tp_a candidates {bad:?} must divide gpus_per_node={gpn}")));
            }
            let mut t = t.clone();
            t.sort_unstable();
            t
        }
        None => {
            let mut t: Vec<u64> = [1, 2, 4, gpn].into_iter().filter(|v| gpn.is_multiple_of(*v)).collect();
            t.sort_unstable();
            t.dedup();
            t
        }
    };
    if experts == 0 && d.f_moe_ep_size.as_ref().is_some_and(|e| e.iter().any(|x| *x != Ep::Size(1))) {
        return Err(err("f_moe_ep_size", "dense AFD searches require f_moe_ep_size to be empty or (1,)"));
    }
    let mut out = Vec::new();
    let mut no_ep = 0;
    for n_a in 1..nodes {
        for n_f in 1..=nodes - n_a {
            if (n_a + n_f) * gpn < min_gpus || n_a as f64 / n_f as f64 > d.max_af_ratio {
                continue;
            }
            let ffn_tp = n_f * gpn;
            let eps: Vec<u64> = if experts == 0 {
                vec![1]
            } else {
                let raw =
                    d.f_moe_ep_size.clone().unwrap_or_else(|| vec![Ep::Size(1), Ep::Size(2), Ep::FfnNodes, Ep::FfnTp]);
                let mut e: Vec<u64> = raw
                    .iter()
                    .map(|x| match x {
                        Ep::Size(n) => *n,
                        Ep::FfnNodes => n_f,
                        Ep::FfnTp => ffn_tp,
                    })
                    .filter(|&ep| {
                        ep <= ffn_tp && ffn_tp.is_multiple_of(ep) && ep <= experts && experts.is_multiple_of(ep)
                    })
                    .collect();
                e.sort_unstable();
                e.dedup();
                e
            };
            if eps.is_empty() {
                no_ep += 1;
                continue;
            }
            for &tp_a in &tps {
                for &batch in &d.a_batch_size {
                    for &ep in &eps {
                        for &mb in &d.num_microbatches {
                            for &pipeline in &d.pipeline_model {
                                // The optimistic model is the conservative one below three microbatches.
                                if pipeline == "optimistic" && mb < 3 {
                                    continue;
                                }
                                out.push(json!({
                                    "phase": "both",
                                    "combined_with_pd": false,
                                    "n_a_nodes": n_a,
                                    "n_f_nodes": n_f,
                                    "tp_a": tp_a,
                                    "a_batch_size": batch,
                                    "f_moe_ep_size": ep,
                                    "num_microbatches": mb,
                                    "pipeline_model": pipeline,
                                    "comm_overhead_factor": d.comm_overhead_factor,
                                    "boundary_on_attn": d.boundary_on_attn,
                                }));
                                if out.len() as u64 > d.max_candidates {
                                    return Err(err(
                                        "max_candidates",
                                        format!(
                                            "candidate_limit: AFD search produced at least {} candidates, exceeding \
                                             max_candidates={}; narrow the domain or increase the limit so the \
                                             complete domain can be evaluated",
                                            out.len(),
                                            d.max_candidates
                                        ),
                                    ));
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    if out.is_empty() {
        return Err(DeployError::new(
            "engine.afd",
            format!(
                "no_feasible_topology: AFD search produced no valid topology; check GPU budget, TP/EP divisibility, \
                 A:F ratio, microbatch, and pipeline filters ({no_ep} node splits without a legal expert size)"
            ),
        ));
    }
    Ok(out)
}

/// The recommend search of an `engine.mode: afd` configuration (`base` without its optimization
/// sections; `backends` and the identity flags as `read_search` found them).
#[allow(clippy::too_many_arguments)]
pub(super) fn read_search(
    mut base: Value,
    optimization: Optimization,
    optimizer: Optimizer,
    backends: &[&'static str],
    backend_versions: Option<Map<String, Value>>,
    identity: Identity,
    load_knobs: Vec<Knob>,
    planner: bool,
) -> Result<Search, DeployError> {
    if planner {
        return Err(DeployError::new("planner", "the planner scales regular worker pools; AFD has none"));
    }
    if base.get("router").is_some_and(|r| !r.is_null()) {
        return Err(DeployError::new(
            "router",
            "AFD has no regular worker pools to route between (the router is not searched with engine.mode: afd)",
        ));
    }
    if optimizer.algorithm == "bayesian" {
        return Err(DeployError::new(
            "optimizer.algorithm",
            "bayesian with engine.mode: afd is not supported by servesim yet (its surrogate has no AFD topology \
             features); use random (max_trials at least the candidate count evaluates every topology) or grid",
        ));
    }
    let engine = get(&base, &["engine"]).and_then(Value::as_object).expect("checked by read_search");
    if engine.get("kv_transfer").is_some_and(|v| !v.is_null()) {
        return Err(DeployError::new(
            "engine.kv_transfer",
            "AFD mode rejects kv_transfer; A/F transfers are modeled by engine.afd",
        ));
    }
    if let Some(w) = engine.get("workers").and_then(Value::as_object) {
        if let Some(role) = w.iter().find(|(_, v)| !v.is_null()).map(|(k, _)| k) {
            let why = if role == "encoder" {
                "AFD does not support encoder pools"
            } else {
                "pure AFD recommendation rejects regular aggregated/prefill/decode workers"
            };
            return Err(DeployError::new(format!("engine.workers.{role}"), why));
        }
    }
    let afd = engine
        .get("afd")
        .and_then(Value::as_object)
        .ok_or_else(|| DeployError::new("engine.afd", "engine.mode='afd' requires engine.afd"))?;
    let domain = read_domain(afd)?;
    if load_knobs.iter().any(|k| k.path.last().is_some_and(|l| l != "concurrency"))
        || get(&base, &["traffic", "load", "type"]).and_then(Value::as_str).is_some_and(|t| t != "concurrency")
    {
        return Err(DeployError::new(
            "traffic.load",
            "AFD recommendation takes a concurrency load (servesim's AFD schedule; a KV-relative load needs \
             scheduler-visible KV capacity AFD does not expose)",
        ));
    }
    let text = |k: &str| engine.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
    let (model, hardware) = (text("model"), text("hardware"));
    let gpn = gpus_per_node(&hardware).map_err(|e| DeployError::new("engine.hardware", e))?;
    let experts = experts(&model).map_err(|e| DeployError::new("engine.model", e))?;
    let topologies = enumerate(&domain, gpn, experts, optimization.min_gpus as u64, optimization.budget as u64)?;
    if let Some(o) = base.pointer_mut("/engine").and_then(Value::as_object_mut) {
        o.remove("afd");
    }
    let topology_gpus: Vec<u64> = topologies
        .iter()
        .map(|t| (t["n_a_nodes"].as_u64().unwrap_or(0) + t["n_f_nodes"].as_u64().unwrap_or(0)) * gpn)
        .collect();
    let value_sampled = value_sampled(&base, &load_knobs);
    let mut knobs = vec![Knob::new(vec!["engine".into(), "afd".into()], topologies)];
    knobs.extend(load_knobs);
    let per_branch: usize = knobs.iter().map(|k| k.values.len()).product();
    let branches: Vec<Branch> = backends
        .iter()
        .enumerate()
        .map(|(b, &backend)| Branch {
            mode: "afd",
            backend,
            roles: Vec::new(),
            shape_sets: vec![Vec::new()],
            knobs: knobs.clone(),
            planners: Vec::new(),
            planner_grid: Default::default(),
            start: b * per_branch,
        })
        .collect();
    let total = branches.len() * per_branch;
    let cap = if optimizer.algorithm == "grid" { super::MAX_GRID_CANDIDATES } else { super::MAX_POOL_CANDIDATES };
    if total as u128 > cap {
        return Err(DeployError::new(
            "optimizer",
            format!("the search space holds {total} candidates within the GPU budget; a search takes at most {cap}"),
        ));
    }
    let kv_short = vec![vec![None]; branches.len()];
    let space = Space { base: base.clone(), identity, backend_versions, branches, routers: Vec::new() };
    let mut selected: Vec<usize> = (0..total).collect();
    let mut random_draw = None;
    let mut random_plan = None;
    if optimizer.algorithm == "random" {
        if let Some(why) = value_sampled {
            random_draw = Some(format!("chacha12 (not the reference's draw: {why})"));
            if (optimizer.max_trials as usize) < total {
                let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(optimizer.seed);
                selected.shuffle(&mut rng);
                selected.truncate(optimizer.max_trials as usize);
            }
        } else {
            // The reference's sampler over the AFD branch: its arms are the (backend, topology)
            // pairs, topology-major, each drawing from the grid of the load's values; the branch's
            // seed is the search's plus 2 (the reference's offset of `afd`). The search replays it
            // round by round: a topology the op model cannot measure fails the reference's
            // candidate build and a strict-SLA miss does not complete either, so each is re-asked
            // within its round.
            let arms: Vec<(usize, usize)> =
                (0..topology_gpus.len()).flat_map(|t| (0..backends.len()).map(move |b| (b, t))).collect();
            let gpus = arms.iter().map(|&(_, t)| topology_gpus[t]).collect();
            let plan = super::pyrandom::afd_plan(&space, 0, arms, gpus, &optimizer, &optimization)
                .map_err(|why| DeployError::new("optimizer", why))?;
            selected = plan.picks(&space).into_iter().map(|p| p.index).collect();
            random_plan = Some(plan);
            random_draw = Some(super::pyrandom::REFERENCE_DRAW.to_string());
        }
    }
    let sla = match get(&base, &["evaluation", "sla"]) {
        Some(v) => schema::read_sla(servesim_config::Reader::mapping("evaluation.sla", v)?)?,
        None => schema::Sla::default(),
    };
    Ok(Search {
        base,
        optimization,
        optimizer,
        sla,
        space,
        selected,
        over_budget: 0,
        kv_short,
        kv_excluded: 0,
        planner_backtest: None,
        random_draw,
        random_plan,
    })
}

/// Why the reference samples a load knob by value rather than by index (a log range, or a
/// range without a step), if one is: [`super::pyrandom::afd_plan`] draws grid indexes only.
fn value_sampled(base: &Value, load_knobs: &[Knob]) -> Option<String> {
    load_knobs.iter().find_map(|k| {
        let path: Vec<&str> = k.path.iter().map(String::as_str).collect();
        let range = get(base, &path)?.get("range")?;
        let log = range.get("scale").and_then(Value::as_str) == Some("log");
        let same = range.get("min").is_some() && range.get("min") == range.get("max");
        (!same && (log || range.get("step").is_none()))
            .then(|| format!("{} is a {} range", path.join("."), if log { "log" } else { "continuous" }))
    })
}

/// An AFD candidate's GPUs (its attention and FFN nodes), `None` for any other candidate.
pub(super) fn used_gpus(tree: &Value) -> Option<u64> {
    let afd = get(tree, &["engine", "afd"])
        .filter(|_| get(tree, &["engine", "mode"]).and_then(Value::as_str) == Some("afd"))?;
    let nodes = afd.get("n_a_nodes")?.as_u64()? + afd.get("n_f_nodes")?.as_u64()?;
    let gpn = gpus_per_node(get(tree, &["engine", "hardware"])?.as_str()?).ok()?;
    Some(nodes * gpn)
}

/// Runs an AFD candidate through the AFD foreground engine of `predict -c`; a topology the op
/// model cannot measure, or whose pools do not fit the GPUs, fails as the reference's candidate
/// build does.
pub(super) fn simulate(t: &mut Trial) {
    let doc = schema::read_predict(&t.tree).and_then(|c| crate::afd::predict(&c));
    match doc {
        Ok(doc) => {
            t.summary = doc["summary"].as_object().cloned().unwrap_or_default();
        }
        Err(e) => {
            t.status = "failed";
            t.reason_category = Some("candidate_materialization");
            t.reason = Some(crate::afd::build_failure(&e));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn domain(afd: Value) -> Domain {
        read_domain(afd.as_object().unwrap()).unwrap()
    }

    fn shapes(v: &[Value]) -> Vec<String> {
        v.iter()
            .map(|t| {
                format!(
                    "{}:{} tp{} b{} ep{} mb{} {}",
                    t["n_a_nodes"],
                    t["n_f_nodes"],
                    t["tp_a"],
                    t["a_batch_size"],
                    t["f_moe_ep_size"],
                    t["num_microbatches"],
                    t["pipeline_model"].as_str().unwrap()
                )
            })
            .collect()
    }

    /// tests/deploy/recommend_afd_domains.yaml's domain (an MoE model with 128 experts, 8 GPUs per
    /// node, 16 GPUs): one node split, 2 × 2 × 2 × 2 × 2 topologies in the reference's order.
    #[test]
    fn domains_on_several_keys_enumerate_in_the_reference_order() {
        let d = domain(json!({"phase": "both", "combined_with_pd": false, "tp_a": {"choices": [4, 2]},
            "a_batch_size": {"choices": [8, 16]}, "f_moe_ep_size": {"choices": [1, 8]},
            "num_microbatches": {"choices": [3, 4]}, "pipeline_model": {"choices": ["optimistic", "conservative"]}}));
        let t = enumerate(&d, 8, 128, 1, 16).unwrap();
        assert_eq!(t.len(), 32);
        let s = shapes(&t);
        assert_eq!(s[0], "1:1 tp2 b8 ep1 mb3 optimistic");
        assert_eq!(s[1], "1:1 tp2 b8 ep1 mb3 conservative");
        assert_eq!(s[31], "1:1 tp4 b16 ep8 mb4 conservative");
        // The default expert sizes: 1, 2, the FFN nodes (1) and the FFN width (8).
        let d = domain(json!({"phase": "both", "combined_with_pd": false, "a_batch_size": 8, "tp_a": 8,
            "num_microbatches": 3, "pipeline_model": "serial"}));
        assert_eq!(shapes(&enumerate(&d, 8, 128, 1, 16).unwrap()).len(), 3);
    }

    /// tests/deploy/recommend_afd_ratio.yaml's domain (a dense model, 32 GPUs: four nodes):
    /// max_af_ratio 1.5 drops the 2:1 and 3:1 splits, two microbatches drop the optimistic model.
    #[test]
    fn the_af_ratio_the_microbatches_and_the_candidate_limit_filter() {
        let afd = json!({"phase": "both", "combined_with_pd": false, "tp_a": 4, "a_batch_size": 8,
            "num_microbatches": {"choices": [2, 3]}, "max_af_ratio": 1.5});
        let t = enumerate(&domain(afd.clone()), 8, 0, 1, 32).unwrap();
        let s = shapes(&t);
        assert_eq!(s.len(), 12);
        let splits: std::collections::BTreeSet<String> = s.iter().map(|x| x[..3].to_string()).collect();
        assert_eq!(splits.into_iter().collect::<Vec<_>>(), ["1:1", "1:2", "1:3", "2:2"]);
        assert_eq!(
            s[..3],
            ["1:1 tp4 b8 ep1 mb2 conservative", "1:1 tp4 b8 ep1 mb3 optimistic", "1:1 tp4 b8 ep1 mb3 conservative"]
        );
        // min_candidate_gpus 32 keeps the four-node splits.
        assert_eq!(enumerate(&domain(afd.clone()), 8, 0, 32, 32).unwrap().len(), 6);
        let mut limited = afd.clone();
        limited["max_candidates"] = json!(5);
        let e = enumerate(&domain(limited), 8, 0, 1, 32).unwrap_err().to_string();
        assert!(e.contains("engine.afd.max_candidates: candidate_limit: AFD search produced at least 6 candidates, exceeding max_candidates=5"), "{e}");
        let e = enumerate(&domain(afd.clone()), 8, 0, 1, 15).unwrap_err().to_string();
        assert!(e.contains("need at least 16 GPUs, got 15"), "{e}");
        let mut dense_ep = afd;
        dense_ep["f_moe_ep_size"] = json!(2);
        let e = enumerate(&domain(dense_ep), 8, 0, 1, 32).unwrap_err().to_string();
        assert!(e.contains("engine.afd.f_moe_ep_size: dense AFD searches require"), "{e}");
    }

    #[test]
    fn what_the_search_does_not_model_is_refused_by_name() {
        let e = |afd: Value| read_domain(afd.as_object().unwrap()).unwrap_err().to_string();
        assert!(e(json!({"phase": "decode", "combined_with_pd": true, "a_batch_size": 8}))
            .contains("engine.afd.combined_with_pd: AFD+P/D recommendation"));
        assert!(e(json!({"phase": "both", "combined_with_pd": false})).contains("engine.afd.a_batch_size: missing"));
        assert!(e(json!({"phase": "both", "combined_with_pd": false, "a_batch_size": 8, "n_a_nodes": 1}))
            .contains("engine.afd.n_a_nodes: not a recommend key"));
        assert!(e(json!({"phase": "both", "combined_with_pd": false, "a_batch_size": {"choices": [8, 8]}}))
            .contains("must not contain duplicates"));
        assert!(e(json!({"phase": "both", "combined_with_pd": false, "a_batch_size": {"range": {"min": 8, "max": 64, "scale": "log"}}}))
            .contains("engine.afd.a_batch_size.range: a log range"));
        let d = domain(
            json!({"phase": "both", "combined_with_pd": false, "a_batch_size": {"range": {"min": 8, "max": 24, "step": 8}}}),
        );
        assert_eq!(d.a_batch_size, [8, 16, 24]);
    }
}
