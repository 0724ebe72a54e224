//! Ranking the trials: each target's objective, the feasibility gates (GPU budget, KV, SLA,
//! goodput floor), the order and Pareto front, and the files of a recommendation
//! (`recommendation.json`, `recommendation.csv`, the replayable configs).

use serde_json::{json, Map, Value};

use super::record::{canonical, Trial};
use super::space::{get, Search};
use crate::schema;

const METRIC_KEYS: [&str; 25] = [
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
    "encoder_latency_ms",
    "encoder_gpus",
    "encoder_memory_gib",
    "encoder_power_coverage",
    "encoder_power_w",
];

pub(super) fn metric(t: &Trial, k: &str) -> f64 {
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

/// Strict-SLA feasibility (always applied for min_gpus): the aggregate means, inclusive; a
/// missing or non-finite metric, or one without samples, fails closed. The reason lists every
/// violation as the reference words them (`strict aggregate SLA violation: ttft 836.831ms >
/// 700ms`, values as Python's `{:g}`).
pub(super) fn sla_failure(sla: &schema::Sla, t: &Trial) -> Option<String> {
    let mut violations = Vec::new();
    match t.summary.get("completed_requests").and_then(Value::as_f64) {
        None => violations.push("completed_requests is missing".to_string()),
        Some(c) if !c.is_finite() => violations.push("completed_requests is non-finite".into()),
        Some(c) if c <= 0.0 => violations.push("completed_requests is zero".into()),
        Some(_) => {}
    }
    for (label, bound, key, samples) in [
        ("ttft", sla.ttft_ms, "mean_ttft_ms", "num_ttft_samples"),
        ("tpot", sla.itl_ms, "mean_tpot_ms", "num_tpot_samples"),
        ("e2e", sla.e2e_ms, "mean_e2e_latency_ms", "num_e2e_latency_samples"),
    ] {
        let Some(b) = bound else { continue };
        match t.summary.get(samples).and_then(Value::as_f64) {
            None => violations.push(format!("{label} sample count {samples} is missing")),
            Some(n) if !n.is_finite() => violations.push(format!("{label} sample count {samples} is non-finite")),
            Some(n) if n <= 0.0 => {
                violations.push(format!("{label} has no qualifying samples ({samples}={})", py_g(n)))
            }
            Some(_) => {}
        }
        match t.summary.get(key).and_then(Value::as_f64) {
            None => violations.push(format!("{label} metric {key} is missing")),
            Some(v) if !v.is_finite() => violations.push(format!("{label} metric {key} is non-finite")),
            Some(v) if v > b => violations.push(format!("{label} {}ms > {}ms", py_g(v), py_g(b))),
            Some(_) => {}
        }
    }
    (!violations.is_empty()).then(|| format!("strict aggregate SLA violation: {}", violations.join("; ")))
}

/// A finite number as Python's `format(x, "g")`: six significant digits, trailing zeros
/// dropped, scientific notation below 1e-4 or from 1e6.
fn py_g(x: f64) -> String {
    if x == 0.0 {
        return if x.is_sign_negative() { "-0".into() } else { "0".into() };
    }
    // The exponent after rounding to six significant digits.
    let sci = format!("{x:.5e}");
    let (mantissa, exp) = sci.split_once('e').expect("an exponent");
    let exp: i32 = exp.parse().expect("an integer exponent");
    let trim = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s.to_string()
        }
    };
    if (-4..6).contains(&exp) {
        let decimals = usize::try_from(5 - exp).unwrap_or(0);
        trim(&format!("{x:.decimals$}"))
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim(mantissa), exp.abs())
    }
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

/// Why a trial that ran is infeasible after all, if it is: the strict (or min_gpus) SLA, then
/// the goodput floor, as (reason category, reason).
pub(super) fn gate(search: &Search, t: &Trial) -> Option<(&'static str, String)> {
    let o = &search.optimization;
    if o.strict_sla || o.target == "min_gpus" {
        if let Some(why) = sla_failure(&search.sla, t) {
            return Some(("sla_constraint", why));
        }
    }
    let floor = o.min_goodput_rps?;
    let g = metric(t, "goodput_request_throughput_rps");
    (g < floor).then(|| ("load_constraint", format!("goodput_request_throughput_rps={g} < min_goodput_rps={floor}")))
}

pub fn rank(search: &Search, mut trials: Vec<Trial>) -> Ranked {
    let o = &search.optimization;
    for t in trials.iter_mut().filter(|t| t.status == "feasible") {
        if let Some((category, why)) = gate(search, t) {
            t.status = "infeasible";
            t.reason_category = Some(category);
            t.reason = Some(why);
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
    let keys: Vec<String> = trials.iter().map(|t| canonical(&super::epd::tie_tree(t))).collect();
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

/// The knobs a candidate sets (its point in the search space); `load`: the load it ran, when the
/// candidates' loads differ.
fn knobs_of(t: &Trial, identity: (bool, bool), load: bool) -> Value {
    let mut m = Map::new();
    for (searched, key) in [(identity.0, "mode"), (identity.1, "backend")] {
        if let Some(v) = get(&t.tree, &["engine", key]).filter(|_| searched) {
            m.insert(format!("engine.{key}"), v.clone());
        }
    }
    if let Some(w) = get(&t.tree, &["engine", "workers"]).and_then(Value::as_object) {
        for (role, cfg) in w {
            if role == "encoder" {
                for k in ["tensor", "replicas", "batch_size"] {
                    if let Some(v) = cfg.get(k) {
                        m.insert(format!("encoder.{k}"), v.clone());
                    }
                }
                continue;
            }
            for (section, keys) in [
                ("parallelism", &["replicas", "tensor", "pipeline", "attention_data", "moe_tensor", "moe_expert"][..]),
                ("scheduler", &["max_batched_tokens", "max_sequences"][..]),
                ("kv_cache", &["block_size"][..]),
            ] {
                for k in keys {
                    if let Some(v) = cfg.get(section).and_then(|s| s.get(*k)) {
                        m.insert(format!("{role}.{section}.{k}"), v.clone());
                    }
                }
            }
            if let Some(v) = cfg.pointer("/kv_cache/capacity/memory_fraction") {
                m.insert(format!("{role}.kv_cache.capacity.memory_fraction"), v.clone());
            }
        }
    }
    if let Some(l) = get(&t.tree, &["traffic", "load"]).and_then(Value::as_object).filter(|_| load) {
        for (k, v) in l.iter().filter(|(k, _)| *k != "type") {
            m.insert(format!("traffic.load.{k}"), v.clone());
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
        // Only a feasible candidate has a score: the reference records none for one a gate
        // (budget, SLA, goodput floor) turned away, however far it ran.
        let score = if t.summary.is_empty() || t.status != "feasible" { Value::Null } else { json!(r.scores[i]) };
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
            "config": knobs_of(t, search.space.searches_identity(), search.searches_load()),
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
    if let Some(d) = &search.random_draw {
        doc["provenance"]["random_draw"] = json!(d);
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

#[cfg(test)]
mod tests {
    use super::py_g;

    #[test]
    fn numbers_read_as_pythons_g_format() {
        for (x, want) in [
            (836.8312345, "836.831"),
            (700.0, "700"),
            (0.5, "0.5"),
            (1234567.0, "1.23457e+06"),
            (999999.5, "1e+06"),
            (0.00012345678, "0.000123457"),
            (0.000012345, "1.2345e-05"),
            (0.0, "0"),
            (-42.25, "-42.25"),
            (99.99999, "100"),
        ] {
            assert_eq!(py_g(x), want, "{x}");
        }
    }
}
