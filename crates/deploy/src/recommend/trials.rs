//! Running candidates: one trial each (GPU budget and pre-run refusals first, then the cache,
//! then the replay with its planner), spread over threads and kept in candidate order, with
//! progress for a front end; and the bayesian search's rounds over the surrogate in `bayes`.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use rand::SeedableRng;
use serde_json::{Map, Value};

use super::cache::Cache;
use super::rank::{metric, objective, sla_failure};
use super::record::{used_gpus, Trial};
use super::space::Search;
use crate::error::DeployError;
use crate::schema;

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

/// Evaluates jobs `0..jobs.len()` (each named by `job(k)` as its tree and space index); results
/// in job order.
pub(super) fn run_jobs(
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

/// Evaluates one candidate; `true` when its result came from the cache.
fn trial(
    tree: Value,
    blocked: Option<(&'static str, String)>,
    search: &Search,
    base_dir: &Path,
    cache: Option<&Cache>,
) -> (Trial, bool) {
    let mut tree = tree;
    let kv_load = super::load::resolve(&mut tree);
    let used = used_gpus(&tree);
    let mut t =
        Trial { tree, used_gpus: used, status: "feasible", reason_category: None, reason: None, summary: Map::new() };
    if used > search.optimization.budget as u64 {
        t.status = "infeasible";
        t.reason_category = Some("gpu_budget");
        t.reason = Some(if super::epd::has_pool(&t.tree) {
            super::epd::OVER_BUDGET.to_string()
        } else {
            format!("used_gpus={used} > gpu_budget={}", search.optimization.budget)
        });
        return (t, false);
    }
    if let Some((category, why)) = blocked.or(kv_load.err().map(|why| ("kv_capacity", why))) {
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
    if t.tree.pointer("/engine/mode").and_then(Value::as_str) == Some("afd") {
        super::afd::simulate(t);
        return;
    }
    if super::epd::has_analytical_pool(&t.tree) {
        super::epd::simulate(t, base_dir);
        return;
    }
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
    let planner = match crate::planner_run(&p) {
        Ok(r) => r,
        Err(e) => {
            t.status = "unsupported";
            t.reason_category = Some("candidate_materialization");
            t.reason = Some(e);
            return;
        }
    };
    match p.run().planner(planner).go(&mut ()) {
        Ok(ran) => {
            t.summary = crate::planned_summary(&p, &ran);
        }
        Err(e) => {
            t.status = "failed";
            t.reason_category = Some("replay_runtime");
            t.reason = Some(e.to_string());
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

/// Random search in the reference's draw: its rounds, each batch evaluated like a grid's; a trial
/// completes when it ranks as feasible (the reference re-asks, within the round, for one that
/// is infeasible, unsupported or failed).
pub(super) fn reference_random(
    search: &Search,
    plan: &super::pyrandom::Plan,
    base_dir: &Path,
    threads: usize,
    cache: Option<&Cache>,
    progress: &Progress,
) -> Evaluated {
    let mut trials: Vec<Trial> = Vec::new();
    let mut hits = 0;
    plan.run(&search.space, &mut |batch| {
        let jobs: Vec<usize> = (0..batch.len()).collect();
        let job = |k: usize| (search.space.pick_tree(&batch[k]), batch[k].index);
        let mut done = run_jobs(search, &jobs, &job, base_dir, threads, cache, progress);
        hits += done.cache_hits;
        // The reference records a candidate it refuses while it materialises the ask (a failed
        // build, an encoder pool over the budget, KV capacity, a Planner refusal) before the
        // ask's replays.
        const BEFORE_REPLAY: [&str; 4] =
            ["candidate_materialization", "gpu_budget", "kv_capacity", "adapter_constraint"];
        done.trials.sort_by_key(|t| !t.reason_category.is_some_and(|c| BEFORE_REPLAY.contains(&c)));
        let complete =
            done.trials.iter().filter(|t| t.status == "feasible" && super::rank::gate(search, t).is_none()).count();
        trials.extend(done.trials);
        complete as u64
    });
    Evaluated { trials, cache_hits: hits }
}

/// The bayesian search: a Gaussian-process surrogate (Matérn 5/2 over the candidates' scaled knob
/// vectors, its length scale chosen by marginal likelihood) and expected improvement, in rounds
/// of `optimizer.parallelism` candidates (the first drawn at random with the seed; a round's
/// later picks shrink the model's variance around its earlier ones, so a round spreads out).
/// Rounds are evaluated like a grid, so the result depends on the seed only, never on timing or
/// threads; no candidate is proposed twice; at most `max_trials` trials. The `pareto` target
/// scalarises its objectives with random weights each round (ParEGO).
pub(super) fn bayesian(
    search: &Search,
    base_dir: &Path,
    threads: usize,
    cache: Option<&Cache>,
    progress: &Progress,
) -> Evaluated {
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
            super::bayes::propose(&xs, &ys, &cands, want).into_iter().map(|k| proposals[k]).collect()
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
