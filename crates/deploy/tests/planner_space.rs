//! The recommend search over Planner settings against the reference's own expansion.
//!
//! tests/deploy/planner_space.golden.json holds, for each case of
//! tests/deploy/planner_space_cases.json, what Dynamo 1.6.1's Planner adapter makes of it:
//! every distinct `config.adapters["dynamo.planner"]` of its search space in the order first
//! met, the load-predictor backtest (winner and loss of every preset per throughput interval)
//! or the error. Made by `$(../shared/parity/setup_aisimulate.sh --with-dynamo)
//! scripts/planner_space_reference.py tests/deploy/planner_space_cases.json` (aisimulate
//! 0.13.0.dev202610130000000070 + ai-dynamo 1.6.1).
//!
//! A default list's ARIMA and Prophet presets run through Dynamo's own predictors when
//! `SERVESIM_PLANNER_PYTHON` (or `python3`) has them: then every winner, setting and loss is the
//! reference's. Without that Python they are skipped: where the reference's backtest picked one,
//! the expected winner is the best of the others by the reference's own losses, and the
//! settings that use it are expected with that predictor.

use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};
use servesim_deploy::recommend::read_search;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/deploy")
}

/// A recommend configuration for a case: one fixed-timing worker per role, the case's traffic,
/// SLA, target and `planner:` section.
fn config(case: &Value) -> Value {
    let disagg = case["mode"] == "disaggregated";
    let worker = json!({
        "parallelism": {"preset": false, "replicas": 1, "tensor": 1},
        "scheduler": {"max_batched_tokens": 8192, "max_sequences": 256},
        "kv_cache": {"capacity": {"type": "fixed", "blocks": 1000}},
        "timing": {"type": "fixed", "prefill_ms": 10, "decode_ms": 5},
    });
    let workers =
        if disagg { json!({"prefill": worker.clone(), "decode": worker}) } else { json!({"aggregated": worker}) };
    let source = match case.get("trace") {
        Some(t) => {
            json!({"type": "trace", "paths": [t["path"]], "format": t.get("format").unwrap_or(&json!("mooncake"))})
        }
        None => json!({"type": "synthetic", "input_tokens": 512, "output_tokens": 64}),
    };
    let load = if case.get("trace").is_some() {
        json!({"type": "trace_timestamps"})
    } else {
        json!({"type": "concurrency", "concurrency": 4})
    };
    let mut c = json!({
        "traffic": {"source": source, "load": load},
        "engine": {"mode": if disagg { "disaggregated" } else { "aggregated" }, "backend": "vllm", "model": "Qwen/Qwen3-32B",
                   "hardware": "h200_sxm", "context_length": 4096, "workers": workers},
        "optimization": case["optimization"],
        "planner": case["planner"],
    });
    if let Some(sla) = case.get("sla") {
        c["evaluation"] = json!({"sla": sla});
    } else if case["optimization"]["target"] == "min_gpus" {
        // min_gpus needs an SLA bound before anything else is read (the reference's config
        // check); the case is about the Planner's target map behind it.
        c["evaluation"] = json!({"sla": {"ttft_ms": 1000}});
    }
    c
}

/// Whether a predictor entry (a preset name or a custom mapping) is one servesim runs.
fn supported(entry: &Value) -> bool {
    let family = match entry.as_str() {
        Some(name) => name.split('_').next().unwrap_or_default(),
        None => entry.get("load_predictor").and_then(Value::as_str).unwrap_or("constant"),
    };
    matches!(family, "constant" | "kalman")
}

/// The Planner fields a predictor preset or custom mapping gives a setting (every public knob,
/// the defaults where the family does not set them).
fn predictor_fields(entry: &Value) -> Map<String, Value> {
    let (family, log1p, kalman) = match entry.as_str() {
        Some("constant_last") => ("constant", false, None),
        Some("kalman_default_raw") => ("kalman", false, Some((1.0, 0.1, 10.0, 5))),
        Some("kalman_default_log1p") => ("kalman", true, Some((1.0, 0.1, 10.0, 5))),
        Some("kalman_reactive_raw") => ("kalman", false, Some((10.0, 1.0, 5.0, 3))),
        Some("kalman_reactive_log1p") => ("kalman", true, Some((10.0, 1.0, 5.0, 3))),
        Some(other) => panic!("not a supported preset: {other}"),
        None => {
            let f = |k: &str| entry[k].as_f64().unwrap();
            let family = entry["load_predictor"].as_str().unwrap();
            let k = (family == "kalman").then(|| {
                (f("kalman_q_level"), f("kalman_q_trend"), f("kalman_r"), entry["kalman_min_points"].as_i64().unwrap())
            });
            (if family == "kalman" { "kalman" } else { "constant" }, entry["load_predictor_log1p"] == true, k)
        }
    };
    let (q, t, r, mp) = kalman.unwrap_or((1.0, 0.1, 10.0, 5));
    let mut m = Map::new();
    m.insert("load_predictor".into(), json!(family));
    m.insert("load_predictor_log1p".into(), json!(log1p));
    m.insert("prophet_window_size".into(), json!(50));
    m.insert("kalman_q_level".into(), json!(q));
    m.insert("kalman_q_trend".into(), json!(t));
    m.insert("kalman_r".into(), json!(r));
    m.insert("kalman_min_points".into(), json!(mp));
    m
}

/// The reference's message without pydantic's wrapping.
fn core(msg: &str) -> String {
    if let Some(rest) = msg.split("Value error, ").nth(1) {
        return rest.split(" [type=").next().unwrap().to_string();
    }
    if msg.contains("Extra inputs are not permitted") {
        return "Extra inputs are not permitted".into();
    }
    msg.trim_start_matches("Planner candidate: ").to_string()
}

/// Messages that are servesim's own where the reference's is a bare pydantic or Python error.
const OWN_MESSAGES: &[(&str, &str)] = &[
    ("err_policy", "planner.policy: planner.policy choices must be disabled or enabled; got ['auto']"),
    ("err_min_gpus_target", "planner: optimization.target 'min_gpus' has no Planner target"),
];

#[test]
fn planner_search_spaces_match_the_reference() {
    let golden: Value =
        serde_json::from_slice(&std::fs::read(deploy_dir().join("planner_space.golden.json")).unwrap()).unwrap();
    let mut checked = 0;
    for case in golden["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        if let Some(t) = case.get("trace") {
            let path = deploy_dir().join(t["path"].as_str().unwrap());
            if !path.exists() {
                eprintln!("NOTICE: {} is missing; skipping case {name}", path.display());
                continue;
            }
        }
        let expected = &case["expected"];
        let result = read_search(&config(case), &deploy_dir());
        if let Some(err) = expected.get("error") {
            let e = result.err().unwrap_or_else(|| panic!("{name}: accepted, the reference refuses: {err}"));
            let text = e.to_string();
            let want = OWN_MESSAGES
                .iter()
                .find(|(n, _)| *n == name)
                .map_or_else(|| core(err.as_str().unwrap()), |(_, m)| m.to_string());
            assert!(text.contains(&want), "{name}: {text:?} lacks {want:?}");
            assert!(e.key.starts_with("planner"), "{name}: key {}", e.key);
            checked += 1;
            continue;
        }
        let search = result.unwrap_or_else(|e| panic!("{name}: {e}"));
        let ours = search.space.planner_settings();
        let reference = expected["load_predictor"].clone();
        // The presets servesim skipped (ARIMA, Prophet): not scored.
        let skipped: Vec<String> = search
            .planner_backtest
            .as_ref()
            .and_then(|b| b.get("skipped"))
            .and_then(Value::as_array)
            .map(|a| a.iter().map(|l| l.as_str().unwrap().to_string()).collect())
            .unwrap_or_default();
        for l in &skipped {
            if !l.starts_with("custom_") {
                assert!(!supported(&json!(l)), "{name}: {l} skipped");
            }
        }
        // The winners servesim can take: the reference's, or, where it skipped that preset, the
        // best preset it scored by the reference's losses (the first on ties).
        let mut substituted: Vec<(i64, Map<String, Value>)> = Vec::new();
        let mut best_expected = Map::new();
        if let Some(best) = reference.get("best_by_interval").and_then(Value::as_object) {
            for (interval, entry) in best {
                let mut winner = entry.clone();
                // Substituted only where servesim left the reference's winner out (no Python).
                if !supported(entry) && entry.as_str().is_some_and(|l| skipped.iter().any(|s| s == l)) {
                    let losses = reference["losses"][interval].as_object().unwrap();
                    let mut pick: Option<(&String, f64)> = None;
                    for (l, v) in losses {
                        let Some(v) = v.as_f64() else { continue };
                        if skipped.contains(l) || pick.is_some_and(|(_, b)| b <= v) {
                            continue;
                        }
                        pick = Some((l, v));
                    }
                    winner = json!(pick.expect("a supported preset with a loss").0);
                    substituted.push((interval.parse().unwrap(), predictor_fields(&winner)));
                }
                best_expected.insert(interval.clone(), winner);
            }
        }
        let mut want_feasible: Vec<Value> = Vec::new();
        let mut want_refused: Vec<String> = Vec::new();
        for s in expected["settings"].as_array().unwrap() {
            if let Some(why) = s.get("infeasible") {
                let why = core(why.as_str().unwrap());
                if !want_refused.contains(&why) {
                    want_refused.push(why);
                }
                continue;
            }
            let mut s = s.clone();
            if s["enable_throughput_scaling"] == true {
                let interval = s["throughput_adjustment_interval_seconds"].as_i64().unwrap();
                if let Some((_, fields)) = substituted.iter().find(|(i, _)| *i == interval) {
                    for (k, v) in fields {
                        s[k] = v.clone();
                    }
                }
            }
            want_feasible.push(s);
        }
        eprintln!(
            "{name}: {} settings, {} refused, substituted {:?}",
            ours.len(),
            ours.iter().filter(|s| s.infeasible.is_some()).count(),
            substituted.iter().map(|s| s.0).collect::<Vec<_>>()
        );
        let got_feasible: Vec<Value> =
            ours.iter().filter(|s| s.infeasible.is_none()).map(|s| s.section.clone()).collect();
        assert_eq!(got_feasible.len(), want_feasible.len(), "{name}: number of feasible settings");
        for (i, (g, w)) in got_feasible.iter().zip(&want_feasible).enumerate() {
            assert_eq!(g, w, "{name}: setting {i}");
        }
        let mut got_refused: Vec<String> = Vec::new();
        for s in ours.iter().filter_map(|s| s.infeasible.as_deref()) {
            let why = s.trim_start_matches("Planner candidate: ").to_string();
            if !got_refused.contains(&why) {
                got_refused.push(why);
            }
        }
        assert_eq!(got_refused, want_refused, "{name}: refused settings");
        // The backtest: the same reason and winners, and every supported preset's loss.
        match search.planner_backtest.as_ref() {
            None => assert!(reference.is_null(), "{name}: no backtest state"),
            Some(state) => {
                assert_eq!(state["reason"], reference["reason"], "{name}: backtest reason");
                assert_eq!(state["best_by_interval"], Value::Object(best_expected), "{name}: winners");
                for (interval, losses) in reference["losses"].as_object().unwrap() {
                    for (label, want) in losses.as_object().unwrap() {
                        let got = &state["losses"][interval][label];
                        if skipped.contains(label) {
                            assert!(got.is_null(), "{name}: {label} is skipped, not scored");
                            continue;
                        }
                        match (got.as_f64(), want.as_f64()) {
                            (None, None) => {}
                            (Some(x), Some(y)) => {
                                // Dynamo's ARIMA / Prophet fits run in another interpreter than the
                                // recording's, with its own library builds: pmdarima's auto_arima
                                // lands up to 6e-5 apart on the Mooncake trace (measured).
                                let tol = if supported(&json!(label)) { 1e-12 } else { 1e-3 };
                                assert!((x - y).abs() <= tol * y.abs(), "{name} @{interval}: {label} {x} vs {y}")
                            }
                            _ => panic!("{name} @{interval}: {label} {got} vs {want}"),
                        }
                    }
                }
            }
        }
        checked += 1;
    }
    eprintln!("{checked} cases checked");
    assert!(checked >= 24, "only {checked} cases checked");
}

/// A disabled planner, or one whose every setting is refused, leaves the rest of the search
/// as it was; each candidate carries its planner section in its tree.
#[test]
fn every_candidate_carries_one_planner_setting() {
    let case = json!({
        "planner": {"scaling_policy": {"preset": ["load_180_5", "load_180_10"]}, "load_sensitivity": {"preset": ["default"]}},
        "optimization": {"target": "throughput"},
    });
    let mut c = config(&case);
    c["engine"]["workers"]["aggregated"]["parallelism"]["tensor"] = json!({"choices": [1, 2]});
    let s = read_search(&c, &deploy_dir()).unwrap();
    let settings = s.space.planner_settings();
    assert_eq!(settings.len(), 3, "disabled, and enabled with each load interval");
    assert_eq!(s.candidate_count(), 2 * 3);
    for i in 0..s.candidate_count() {
        let t = s.candidate(i).unwrap();
        assert_eq!(t["planner"], settings[i % 3].section, "the planner is the innermost dimension");
        assert_eq!(t["engine"]["workers"]["aggregated"]["parallelism"]["tensor"], json!(1 + i / 3));
    }
    assert_eq!(s.candidate(1).unwrap()["planner"]["load_adjustment_interval_seconds"], 5);
    assert_eq!(s.candidate(2).unwrap()["planner"]["load_adjustment_interval_seconds"], 10);
    assert_eq!(s.candidate(1).unwrap()["planner"]["target"], "throughput");
}
