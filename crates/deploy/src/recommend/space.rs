//! The search space and the search: every candidate an index into one of the space's branches
//! (a deployment mode and a backend), within it a mixed-radix index over the parallel-shape
//! sets, the scheduler knobs, the router settings and the planner settings, its concrete
//! predict tree made when it is asked for; a [`Search`] is the options, the space and the
//! candidates chosen for evaluation.

use serde_json::{json, Map, Value};

use crate::schema;

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

/// One searched knob: where it lives in the tree and the values it takes (the grid's values;
/// for a knob the reference's random search samples by value, the grid's stand-in, see
/// [`Sampled`]).
#[derive(Clone, Debug)]
pub(super) struct Knob {
    pub(super) path: Vec<String>,
    pub(super) values: Vec<Value>,
    /// How random search samples the knob by value, when it does (`None`: by `values`).
    pub(super) sampled: Option<Sampled>,
}

impl Knob {
    pub(super) fn new(path: Vec<String>, values: Vec<Value>) -> Knob {
        Knob { path, values, sampled: None }
    }
}

/// A knob domain random search samples by value, as the reference does: an integer log range
/// holds every integer between its bounds (a grid searches its powers of two), a continuous
/// range every number (a grid refuses it; its `values` hold only the lower bound, the value
/// the KV filter judges a shape by).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Sampled {
    Integers {
        min: u64,
        max: u64,
    },
    /// `integer`: the value drawn is rounded (ties to even, at least 1), as a concurrency is.
    Continuous {
        min: f64,
        max: f64,
        log: bool,
        integer: bool,
    },
}

/// A candidate chosen by random search: an index into the space, and the values drawn for its
/// knobs sampled by value ([`Sampled`]; knob position in its branch, value), which replace the
/// index's stand-in values.
#[derive(Clone, Debug, PartialEq)]
pub struct Pick {
    pub index: usize,
    pub(super) drawn: Vec<(usize, Value)>,
}

/// One worker role's parallel shape: replicas of a worker of `tensor` × `attention_data` GPUs
/// (× `pipeline` when given). `pipeline` and the MoE widths are written into the candidate
/// only when the shape carries them (a preset list entry, the MoE pool).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Shape {
    pub(super) replicas: u64,
    pub(super) tensor: u64,
    pub(super) attention_data: u64,
    pub(super) pipeline: Option<u64>,
    /// (moe_tensor, moe_expert)
    pub(super) moe: Option<(u64, u64)>,
}

impl Shape {
    pub(super) fn tp(replicas: u64, tensor: u64, attention_data: u64) -> Shape {
        Shape { replicas, tensor, attention_data, pipeline: None, moe: None }
    }

    /// The value of one of the six parallel knobs (`PRESET_KEYS`); a dense shape's MoE knobs are
    /// 1, as the reference's are.
    pub(super) fn knob(&self, key: &str) -> u64 {
        let (moe_tensor, moe_expert) = self.moe.unwrap_or((1, 1));
        match key {
            "replicas" => self.replicas,
            "tensor" => self.tensor,
            "pipeline" => self.pipeline.unwrap_or(1),
            "attention_data" => self.attention_data,
            "moe_tensor" => moe_tensor,
            "moe_expert" => moe_expert,
            _ => unreachable!("not a parallel knob: {key}"),
        }
    }

    /// GPUs of one worker.
    pub(super) fn width(&self) -> u64 {
        self.tensor.saturating_mul(self.attention_data).saturating_mul(self.pipeline.unwrap_or(1))
    }

    pub(super) fn gpus(&self) -> u64 {
        self.replicas.saturating_mul(self.width())
    }

    /// The shape of one worker (its KV capacity does not depend on the replicas).
    pub(super) fn worker(&self) -> Shape {
        Shape { replicas: 1, ..*self }
    }
}

/// One branch of the space: a deployment mode and a backend, with the mode's roles, parallel
/// shape sets (one shape per role; disaggregated: every prefill/decode pair within the
/// budget), scheduler knobs and planner settings.
#[derive(Clone, Debug)]
pub(super) struct Branch {
    pub(super) mode: &'static str,
    pub(super) backend: &'static str,
    pub(super) roles: Vec<&'static str>,
    pub(super) shape_sets: Vec<Vec<Shape>>,
    pub(super) knobs: Vec<Knob>,
    /// Concrete `planner:` sections; empty when the configuration has none.
    pub(super) planners: Vec<crate::planner_search::Setting>,
    /// The planner adapter's knob grid over `planners` (the reference's random draw).
    pub(super) planner_grid: crate::planner_search::Grid,
    /// The index of the branch's first candidate in the space.
    pub(super) start: usize,
}

/// The engine identity a space searches: whether its candidates state `engine.mode` and
/// `engine.backend` (the configuration searched them or left them to the default domains), and
/// whether each drops the roles (and KV transfer) of the modes it is not (more than one mode).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Identity {
    pub(super) write_mode: bool,
    pub(super) write_backend: bool,
    pub(super) prune_roles: bool,
}

/// The search space: its branches (mode-major, then backend, in the domains' order), each a
/// mixed-radix index over its parallel-shape sets, its knobs (the last one fastest), the
/// router settings and its planner settings (innermost). A candidate's concrete predict tree
/// is made when it is needed, so a large space costs no memory until it is evaluated.
#[derive(Clone, Debug)]
pub struct Space {
    pub(super) base: Value,
    pub(super) identity: Identity,
    /// `engine.backend_version` given per backend (`{vllm: ..., sglang: ...}`): each candidate
    /// takes its backend's (or none: the latest).
    pub(super) backend_versions: Option<Map<String, Value>>,
    pub(super) branches: Vec<Branch>,
    /// Concrete `router:` sections; empty when the configuration has none.
    pub(super) routers: Vec<Value>,
}

/// Where a searched encoder pool lives in a candidate's tree.
const ENCODER: [&str; 3] = ["engine", "workers", "encoder"];

/// The roles whose slots a candidate's feature vector holds, in this order.
const FEATURE_ROLES: [&str; 3] = ["aggregated", "prefill", "decode"];

impl Space {
    /// Candidates per shape set of branch `b`.
    pub(super) fn per_shape(&self, b: usize) -> usize {
        let br = &self.branches[b];
        br.knobs.iter().map(|k| k.values.len()).product::<usize>()
            * self.routers.len().max(1)
            * br.planners.len().max(1)
    }

    fn branch_len(&self, b: usize) -> usize {
        self.branches[b].shape_sets.len() * self.per_shape(b)
    }

    /// The number of candidates.
    pub fn len(&self) -> usize {
        self.branches.last().map_or(0, |b| b.start + self.branch_len(self.branches.len() - 1))
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Candidate `i` as (branch, index within it).
    pub(super) fn locate(&self, i: usize) -> (usize, usize) {
        let b = self.branches.partition_point(|br| br.start <= i) - 1;
        (b, i - self.branches[b].start)
    }

    /// Candidate `i` as (branch, shape set, knob value indexes, router index, planner index).
    fn split(&self, i: usize) -> (usize, usize, Vec<usize>, usize, usize) {
        let (b, local) = self.locate(i);
        let br = &self.branches[b];
        let nr = self.routers.len().max(1);
        let np = br.planners.len().max(1);
        let mut rest = local;
        let p = rest % np;
        rest /= np;
        let r = rest % nr;
        rest /= nr;
        let mut ks = vec![0; br.knobs.len()];
        for (j, k) in br.knobs.iter().enumerate().rev() {
            ks[j] = rest % k.values.len();
            rest /= k.values.len();
        }
        (b, rest, ks, r, p)
    }

    /// The branch and shape set of candidate `i`.
    pub(super) fn shape_set_of(&self, i: usize) -> (usize, usize) {
        let (b, s, ..) = self.split(i);
        (b, s)
    }

    /// A random search's pick's concrete predict tree: candidate `index`'s with the drawn values.
    pub fn pick_tree(&self, pick: &Pick) -> Value {
        let mut t = self.tree(pick.index);
        let (b, _) = self.locate(pick.index);
        for (k, v) in &pick.drawn {
            set(&mut t, &self.branches[b].knobs[*k].path, v.clone());
        }
        t
    }

    /// Candidate `i`'s concrete predict tree.
    pub fn tree(&self, i: usize) -> Value {
        let (b, s, ks, r, pl) = self.split(i);
        let br = &self.branches[b];
        let mut t = self.base.clone();
        if self.identity.write_mode {
            set(&mut t, &["engine".into(), "mode".into()], json!(br.mode));
        }
        if self.identity.write_backend {
            set(&mut t, &["engine".into(), "backend".into()], json!(br.backend));
        }
        if let Some(versions) = &self.backend_versions {
            let e = t.get_mut("engine").and_then(Value::as_object_mut).expect("engine is a mapping");
            match versions.get(br.backend) {
                Some(v) => {
                    e.insert("backend_version".into(), v.clone());
                }
                None => {
                    e.remove("backend_version");
                }
            }
        }
        if self.identity.prune_roles {
            if let Some(e) = t.get_mut("engine").and_then(Value::as_object_mut) {
                if br.mode == "aggregated" {
                    e.remove("kv_transfer");
                }
                if let Some(w) = e.get_mut("workers").and_then(Value::as_object_mut) {
                    w.retain(|role, _| br.roles.contains(&role.as_str()) || !FEATURE_ROLES.contains(&role.as_str()));
                }
            }
        }
        for (role, shape) in br.roles.iter().zip(&br.shape_sets[s]) {
            let mut p = get(&t, &["engine", "workers", role, "parallelism"]).cloned().unwrap_or(json!({}));
            let o = p.as_object_mut().expect("checked when the space was read");
            o.insert("replicas".into(), json!(shape.replicas));
            o.insert("tensor".into(), json!(shape.tensor));
            if let Some(pp) = shape.pipeline {
                o.insert("pipeline".into(), json!(pp));
            }
            o.insert("attention_data".into(), json!(shape.attention_data));
            if let Some((mt, me)) = shape.moe {
                o.insert("moe_tensor".into(), json!(mt));
                o.insert("moe_expert".into(), json!(me));
            }
            set(&mut t, &["engine".into(), "workers".into(), role.to_string(), "parallelism".into()], p);
        }
        for (k, &v) in br.knobs.iter().zip(&ks) {
            set(&mut t, &k.path, k.values[v].clone());
        }
        if let Some(router) = self.routers.get(r) {
            set(&mut t, &["router".into()], router.clone());
        }
        if let Some(planner) = br.planners.get(pl) {
            set(&mut t, &["planner".into()], planner.section.clone());
        }
        t
    }

    /// The concrete planner settings the space searches (empty without a `planner:` section;
    /// those of the first branch when there are several).
    pub fn planner_settings(&self) -> &[crate::planner_search::Setting] {
        self.branches.first().map_or(&[], |b| &b.planners)
    }

    /// Whether the candidates' records list `engine.mode` and `engine.backend` (searched).
    pub fn searches_identity(&self) -> (bool, bool) {
        (self.identity.write_mode, self.identity.write_backend)
    }

    /// Why the Planner refuses candidate `i`'s settings, if it does.
    fn planner_refusal(&self, i: usize) -> Option<String> {
        let (b, _, _, _, p) = self.split(i);
        self.branches[b].planners.get(p).and_then(|p| p.infeasible.clone())
    }

    /// Candidate `i`'s point for the surrogate model, before scaling: the mode and backend as
    /// 0/1, then per role slot (aggregated, prefill, decode; zeros for a role the candidate's
    /// mode has not) log2 of its parallel sizes, then per role slot log2 of its scheduler limits,
    /// then (when the search has one) per role slot log2 of a searched block size and a searched
    /// memory fraction, the router's policy and load model as 0/1 and its numeric knobs (the load
    /// scale as log2(1 + x)), then the planner's, then a searched encoder pool one-hot over the
    /// catalog, then log2 of the searched traffic load.
    pub(super) fn raw_features(&self, i: usize) -> Vec<f64> {
        let (b, s, ks, r, pl) = self.split(i);
        let br = &self.branches[b];
        let flag = |on: bool| if on { 1.0 } else { 0.0 };
        let mut f = vec![flag(br.mode == "disaggregated"), flag(br.backend == "sglang"), flag(br.backend == "trtllm")];
        let lg = |x: u64| (x as f64).log2();
        for slot in FEATURE_ROLES {
            match br.roles.iter().position(|r| *r == slot) {
                Some(j) => {
                    let sh = &br.shape_sets[s][j];
                    let (mt, me) = sh.moe.unwrap_or((1, 1));
                    f.extend([
                        lg(sh.replicas),
                        lg(sh.tensor),
                        lg(sh.attention_data),
                        lg(sh.pipeline.unwrap_or(1)),
                        lg(mt),
                        lg(me),
                    ]);
                }
                None => f.extend([0.0; 6]),
            }
        }
        let role_knob =
            |k: &Knob, slot: &str, section: &str| k.path.len() > 3 && k.path[2] == slot && k.path[3] == section;
        for slot in FEATURE_ROLES {
            let mut n = 0;
            for (k, &v) in br.knobs.iter().zip(&ks).filter(|(k, _)| role_knob(k, slot, "scheduler")) {
                f.push(k.values[v].as_f64().unwrap_or(1.0).max(1.0).log2());
                n += 1;
            }
            f.extend(std::iter::repeat_n(0.0, 2usize.saturating_sub(n)));
        }
        // A searched KV cache (when any branch searches one): per role slot log2 of the block size
        // and the memory fraction, zeros where not searched.
        let kv_searched =
            self.branches.iter().flat_map(|b| &b.knobs).any(|k| k.path.len() > 3 && k.path[3] == "kv_cache");
        if kv_searched {
            for slot in FEATURE_ROLES {
                for key in ["block_size", "memory_fraction"] {
                    let value = br
                        .knobs
                        .iter()
                        .zip(&ks)
                        .find(|(k, _)| role_knob(k, slot, "kv_cache") && k.path.last().is_some_and(|l| l == key))
                        .and_then(|(k, &v)| k.values[v].as_f64());
                    f.push(match (key, value) {
                        ("block_size", Some(b)) => b.max(1.0).log2(),
                        (_, Some(m)) => m,
                        _ => 0.0,
                    });
                }
            }
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
        if let Some(p) = br.planners.get(pl) {
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
        // A searched encoder pool (EPD): one 0/1 slot per pool of the catalogs (each backend's in
        // turn), as the reference's surrogate one-hot encodes its categorical encoder_candidate.
        let encoder = |b: &Branch| b.knobs.iter().position(|k| k.path.iter().map(String::as_str).eq(ENCODER));
        let mut slots = 0;
        let mut here = None;
        let mut backends: Vec<&str> = Vec::new();
        for other in &self.branches {
            let Some(j) = encoder(other).filter(|_| !backends.contains(&other.backend)) else { continue };
            backends.push(other.backend);
            if other.backend == br.backend {
                here = encoder(br).map(|mine| slots + ks[mine]);
            }
            slots += other.knobs[j].values.len();
        }
        let mut one_hot = vec![0.0; slots];
        if let Some(h) = here {
            one_hot[h] = 1.0;
        }
        f.extend(one_hot);
        // The traffic load's searched keys (log2; a KV fraction may be below one).
        for (k, &v) in br.knobs.iter().zip(&ks).filter(|(k, _)| k.path[0] == "traffic") {
            f.push(k.values[v].as_f64().map_or(0.0, f64::log2));
        }
        f
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
    /// Per branch and shape set: why its KV cache cannot hold one longest sequence (the
    /// reference's KV-feasibility filter), if it cannot.
    pub(super) kv_short: Vec<Vec<Option<String>>>,
    /// Candidates the KV filter marked infeasible (grid) or left out of the pool sampled
    /// (random, bayesian).
    pub kv_excluded: usize,
    /// What the planner's load-predictor backtest found (`planner:` searches only).
    pub planner_backtest: Option<Value>,
    /// Random search: how the candidates were drawn (the reference's sampler, or ChaCha12 and
    /// why the space does not map onto the reference's).
    pub random_draw: Option<String>,
    /// Random search in the reference's draw: the samplers the run replays round by round (a
    /// trial that does not complete is re-asked), `selected` then holding the candidates drawn
    /// when every trial completes.
    pub(super) random_plan: Option<super::pyrandom::Plan>,
}

impl Search {
    /// Whether the search draws its candidates round by round from the results (bayesian, and
    /// random in the reference's draw, which re-asks after a trial that does not complete), so
    /// that it cannot be split into shards.
    pub fn draws_in_rounds(&self) -> bool {
        self.optimizer.algorithm == "bayesian" || self.random_plan.is_some()
    }

    /// The number of candidates chosen for evaluation (grid and random; bayesian's pool).
    pub fn candidate_count(&self) -> usize {
        self.selected.len()
    }

    /// Candidate `k`'s concrete predict tree, made when it is asked for (a large grid holds
    /// none of them at once).
    pub fn candidate(&self, k: usize) -> Option<Value> {
        self.selected.get(k).map(|&i| self.space.tree(i))
    }

    /// Whether candidates differ in their traffic load (searched, or sized from each one's KV
    /// cache), so that a summary of a candidate should show it.
    pub fn searches_load(&self) -> bool {
        super::load::varies(&self.base)
    }

    /// The first candidate's tree (the one checked strictly before a run starts), without its
    /// planner section when the Planner refuses that (the candidate is then infeasible, not the
    /// configuration wrong), and with a KV-relative load standing in as a concurrency.
    pub fn first_tree(&self) -> Value {
        let i = self.selected[0];
        let mut t = self.space.tree(i);
        super::load::for_the_check(&mut t);
        if self.space.planner_refusal(i).is_some() {
            t.as_object_mut().expect("a mapping").remove("planner");
        }
        t
    }

    /// Why candidate `i` of the space is infeasible before it runs (its KV cache, or planner
    /// settings the Planner refuses), if it is: (reason category, reason).
    pub(super) fn blocked(&self, i: usize) -> Option<(&'static str, String)> {
        let (b, s) = self.space.shape_set_of(i);
        if let Some(why) = self.kv_short[b][s].clone() {
            return Some(("kv_capacity", why));
        }
        self.space
            .planner_refusal(i)
            .map(|why| ("adapter_constraint", format!("candidate adapter selection infeasible: {why}")))
    }
}

pub(super) fn get<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
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
