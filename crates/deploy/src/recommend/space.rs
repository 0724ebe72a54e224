//! The search space and the search: every candidate a mixed-radix index over the parallel-shape
//! sets, the scheduler knobs, the router settings and the planner settings, its concrete predict
//! tree made when it is asked for; a [`Search`] is the options, the space and the candidates
//! chosen for evaluation.

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

/// One searched knob: where it lives in the tree and the values it takes.
#[derive(Clone, Debug)]
pub(super) struct Knob {
    pub(super) path: Vec<String>,
    pub(super) values: Vec<Value>,
}

/// The search space: every candidate is a mixed-radix index over the parallel-shape sets, the
/// knobs (the last one fastest), the router settings and the planner settings (innermost), and
/// its concrete predict tree is made when it is needed, so a large space costs no memory until
/// it is evaluated.
#[derive(Clone, Debug)]
pub struct Space {
    pub(super) base: Value,
    pub(super) roles: Vec<&'static str>,
    pub(super) shape_sets: Vec<Vec<(u64, u64, u64)>>,
    pub(super) knobs: Vec<Knob>,
    /// Concrete `router:` sections; empty when the configuration has none.
    pub(super) routers: Vec<Value>,
    /// Concrete `planner:` sections; empty when the configuration has none.
    pub(super) planners: Vec<crate::planner_search::Setting>,
}

impl Space {
    pub(super) fn per_shape(&self) -> usize {
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
    pub(super) fn raw_features(&self, i: usize) -> Vec<f64> {
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

    pub(super) fn gpus(&self, i: usize) -> u64 {
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
    pub(super) kv_short: Vec<Option<String>>,
    /// Candidates the KV filter marked infeasible (grid) or left out of the pool sampled
    /// (random, bayesian).
    pub kv_excluded: usize,
    /// What the planner's load-predictor backtest found (`planner:` searches only).
    pub planner_backtest: Option<Value>,
}

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
    pub(super) fn blocked(&self, i: usize) -> Option<(&'static str, String)> {
        if let Some(why) = self.kv_short[self.space.split(i).0].clone() {
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
