//! The reference's `recommend_planner_dynamo` example (`aisimulate recommend --stack dynamo`,
//! random search, 2 trials, the default aggregated space plus the Planner adapter's dimensions,
//! 240 s of the Mooncake synthetic trace): both candidates it reported — the planner disabled
//! at 1 × TP8, and enabled (`throughput_600_5`, the backtest's `constant` predictor, target
//! `sla` from `goodput_per_gpu`) at 22 × TP1 — are points of servesim's grid over the same
//! space, with the reference's planner section as servesim writes it, and evaluate there to
//! the reference's metrics and score within 2 %.
//!
//! tests/deploy/recommend_planner_dynamo.yaml is the example with its trace path pointed at
//! ../shared; tests/deploy/recommend_candidates.golden.json holds the reference's candidates
//! (made by `$(../shared/parity/setup_aisimulate.sh --with-dynamo)
//! ../shared/parity/aisimulate_predict.py recommend_planner_dynamo.yaml --stack dynamo`).
//! Without the AIS data (`SERVESIM_AIS_SYSTEMS`) or the shared trace the test says so and
//! skips.

use std::path::{Path, PathBuf};

use serde_json::Value;
use servesim_deploy::recommend::{evaluate_indices, rank, read_search};

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/deploy")
}

/// The knobs that tell candidates of this space apart: parallel shape, scheduler limits and
/// the planner section.
fn point(tree: &Value) -> Value {
    let w = &tree["engine"]["workers"]["aggregated"];
    serde_json::json!({
        "replicas": w["parallelism"]["replicas"], "tensor": w["parallelism"]["tensor"],
        "attention_data": w["parallelism"]["attention_data"],
        "max_batched_tokens": w["scheduler"]["max_batched_tokens"], "max_sequences": w["scheduler"]["max_sequences"],
        "planner": tree["planner"],
    })
}

#[test]
fn the_references_planner_candidates_are_in_the_grid_and_agree_within_two_percent() {
    let dir = deploy_dir();
    let text = std::fs::read_to_string(dir.join("recommend_planner_dynamo.yaml")).unwrap();
    let mut tree = servesim_deploy::tree::parse_yaml(&text).unwrap();
    if !dir.join("../../../shared/traces/mooncake_synthetic_trace.jsonl").exists() {
        eprintln!("NOTICE: ../shared/traces is missing beside the checkout; skipping");
        return;
    }
    servesim_deploy::tree::apply_set(&mut tree, "optimizer.algorithm=grid").unwrap();
    let search = read_search(&tree, &dir).unwrap();
    // The default agg space: 62 shapes (TP 1-16, replicas to the 32-GPU budget) x 3 x 3 scheduler
    // values x 39 planner settings (disabled; throughput_180/600 x 4 FPM presets; load_180_5/10 x
    // 3 sensitivities; hybrid_180/600 x 4 x 3).
    assert_eq!(search.space.planner_settings().len(), 39);
    assert_eq!(search.space.len(), 62 * 9 * 39);
    let golden: Value =
        serde_json::from_slice(&std::fs::read(dir.join("recommend_candidates.golden.json")).unwrap()).unwrap();
    let reference = golden["examples"]["recommend_planner_dynamo"].as_array().unwrap();
    let wanted: Vec<Value> = reference.iter().map(|c| point(&c["prediction_config"])).collect();
    let mut found = vec![None; wanted.len()];
    for i in 0..search.space.len() {
        let p = point(&search.space.tree(i));
        if let Some(k) = wanted.iter().position(|w| *w == p) {
            assert!(found[k].is_none(), "candidate {k} appears twice");
            found[k] = Some(i);
        }
    }
    let indices: Vec<usize> = found
        .iter()
        .zip(&wanted)
        .map(|(f, w)| f.unwrap_or_else(|| panic!("the reference's candidate {w} is not in the grid")))
        .collect();
    let trials = evaluate_indices(&search, &indices, &dir, 2);
    if trials.iter().any(|t| t.reason.as_deref().is_some_and(|r| r.contains("no AIS performance data found"))) {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping");
        return;
    }
    let ranked = rank(&search, trials);
    let mut worst = (0.0f64, String::new());
    for (k, c) in reference.iter().enumerate() {
        let t = &ranked.trials[k];
        let id = c["candidate_id"].as_str().unwrap();
        assert_eq!(t.status, "feasible", "{id}: {:?}", t.reason);
        assert_eq!(t.used_gpus, c["used_gpus"].as_u64().unwrap(), "{id}: used GPUs");
        let mut compare = |key: &str, x: f64, y: f64| {
            let dev = if y == 0.0 { x.abs() } else { ((x - y) / y).abs() };
            assert!(dev <= 0.02, "{id}: {key} = {x}, reference {y} ({:.3} %)", dev * 100.0);
            if dev > worst.0 {
                worst = (dev, format!("{id} {key}"));
            }
        };
        for (key, want) in c["metrics"].as_object().unwrap() {
            let x = t.summary[key].as_f64().unwrap();
            if key == "completed_requests" {
                assert_eq!(x, want.as_f64().unwrap(), "{id}: {key}");
            } else {
                compare(key, x, want.as_f64().unwrap());
            }
        }
        // The ranking's score: goodput per time-averaged GPU (gpu_hours over the run).
        compare("score", ranked.scores[k], c["score"].as_f64().unwrap());
        let planned = c["prediction_config"]["planner"]["policy"] == "enabled";
        assert_eq!(t.summary.contains_key("planner_total_ticks"), planned, "{id}: planner_total_ticks");
    }
    // The planner candidate starts at 22 GPUs and is cut to its 8-GPU budget: about 8.5 GPUs on
    // average, and the ranking reads that average.
    let avg = servesim_deploy::recommend::avg_gpu(&ranked.trials[1]);
    assert!((8.0..9.0).contains(&avg), "average GPUs {avg}");
    eprintln!("worst deviation {:.2e} % ({})", worst.0 * 100.0, worst.1);
}
