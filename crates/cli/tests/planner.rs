//! The Planner in the loop (`planner:` in `predict -c`, `--planner-config` in flag form): the
//! reference's scaling decisions, GPU-hours and latencies on its planner example cases, and
//! bad input.
//!
//! tests/planner/NAME.yaml are the reference's example configs (trace paths pointed at
//! ../shared beside the checkout); NAME.golden.json hold the reference's summary keys, scaling
//! events and tick count, reduced from ../shared/parity/aisimulate-examples/NAME.expected.json,
//! which `$(../shared/parity/setup_aisimulate.sh --with-dynamo)
//! ../shared/parity/aisimulate_predict.py NAME.yaml --stack dynamo` made (aisimulate
//! 0.13.0.dev202610130000000070 with ai-dynamo 1.6.1). The runs need the AIS data
//! (`SERVESIM_AIS_SYSTEMS`) and the shared traces; without them the tests say so and skip.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{json, Value};

fn planner_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/planner")
}

fn shared_trace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces/mooncake_synthetic_trace.jsonl")
}

fn servesim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_servesim")).args(args).output().expect("run servesim")
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("servesim-planner-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn predict_config(config: &Path, out_dir: &Path) -> Output {
    servesim(&[
        "predict",
        "-c",
        config.to_str().unwrap(),
        "--output-dir",
        out_dir.to_str().unwrap(),
        "--overwrite",
        "--format",
        "json",
    ])
}

fn skip(out: &Output) -> bool {
    if stderr(out).contains("no AIS performance data found") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the planner goldens");
        return true;
    }
    if !shared_trace().exists() {
        eprintln!("NOTICE: ../shared/traces is missing beside the checkout; skipping the planner goldens");
        return true;
    }
    false
}

fn events(v: &Value) -> Vec<(f64, String, u64, u64, String)> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["at_s"].as_f64().unwrap(),
                e["component"].as_str().unwrap().to_string(),
                e["from_count"].as_u64().unwrap(),
                e["to_count"].as_u64().unwrap(),
                e["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Easy (`load`, `throughput`) and SLA targets (constant and Kalman predictors, the SLA load
/// loop alone and beside the throughput loop, workers that take 20 s to start, the fit started
/// empty when there is no AIS model), aggregated and disaggregated: the same scaling decisions
/// at the same ticks, and the summary within 2 %. planner_disagg_sla_startup and
/// planner_agg_sla_polynomial were recorded with `python3 scripts/planner_golden.py
/// tests/planner/NAME.yaml --runs 3` (three identical reference runs).
#[test]
fn planner_examples_match_the_reference() {
    for name in [
        "planner_disagg_sla_mooncake",
        "planner_agg_load_mooncake",
        "planner_disagg_throughput_easy",
        "planner_agg_budget_reconcile",
        "planner_agg_hybrid_kalman",
        "planner_disagg_hybrid_kalman",
        "planner_disagg_sla_load",
        "planner_agg_sglang_hybrid",
        "planner_agg_adp_kalman",
        "planner_disagg_sla_startup",
        "planner_agg_sla_polynomial",
    ] {
        if matches_golden(name).is_none() {
            return;
        }
    }
}

/// Runs tests/planner/NAME.yaml and compares it with NAME.golden.json: the same scaling events,
/// the same ticks, counts equal and the rest of the summary within 2 %. Returns the report, or
/// None when the run has to be skipped (AIS data or traces missing).
fn matches_golden(name: &str) -> Option<Value> {
    let out_dir = tmp(name);
    let out = predict_config(&planner_dir().join(format!("{name}.yaml")), &out_dir);
    if skip(&out) {
        return None;
    }
    assert!(out.status.success(), "{name}: {}", stderr(&out));
    let ours: Value = serde_json::from_slice(&std::fs::read(out_dir.join("prediction.json")).unwrap()).unwrap();
    let golden: Value =
        serde_json::from_slice(&std::fs::read(planner_dir().join(format!("{name}.golden.json"))).unwrap()).unwrap();
    assert_eq!(
        events(&ours["planner"]["scaling_events"]),
        events(&golden["planner"]["scaling_events"]),
        "{name}: scaling events"
    );
    assert_eq!(ours["planner"]["total_ticks"], golden["planner"]["total_ticks"], "{name}");
    assert_eq!(ours["summary"]["planner_total_ticks"], golden["planner"]["total_ticks"], "{name}");
    for (key, want) in golden["summary"].as_object().unwrap() {
        let (x, y) = (ours["summary"][key].as_f64().unwrap(), want.as_f64().unwrap());
        if key.ends_with("_requests") {
            assert_eq!(x, y, "{name}: {key}");
            continue;
        }
        let dev = if y == 0.0 { x.abs() } else { ((x - y) / y).abs() };
        assert!(dev <= 0.02, "{name}: {key} = {x}, reference {y} ({:.3} %)", dev * 100.0);
    }
    Some(ours)
}

/// The reference's direct planner replay (`run_trace_replay` on the Mooncake synthetic trace,
/// polynomial timing, 4096 blocks, one aggregated worker, target `load` 90/70, 8-GPU budget)
/// gives 3993 completions, 0.777305869102486 GPU-hours, 204 ticks and 128 scaling events
/// (`shared/reference/aisimulate-howto.md` §6). The same run in flag form:
#[test]
fn planner_config_flag_matches_the_reference_direct_replay() {
    let trace = shared_trace();
    if !trace.exists() {
        eprintln!("NOTICE: ../shared/traces is missing beside the checkout; skipping");
        return;
    }
    let config = json!({
        "mode": "agg", "optimization_target": "load", "decode_scale_up_kv_rate": 90,
        "decode_scale_down_kv_rate": 70, "load_adjustment_interval_seconds": 5, "max_gpu_budget": 8,
        "decode_engine_num_gpu": 1, "report_interval_hours": null, "live_dashboard_port": 0
    })
    .to_string();
    let run = || {
        servesim(&[
            "predict",
            trace.to_str().unwrap(),
            "--num-workers",
            "1",
            "--extra-engine-args",
            r#"{"engine": {"backend": "vllm", "num_gpu_blocks": 4096}}"#,
            "--planner-config",
            &config,
            "--format",
            "json",
            "--no-wall-clock",
        ])
    };
    let out = run();
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["summary"]["completed_requests"], 3993);
    let gpu_hours = v["summary"]["gpu_hours"].as_f64().unwrap();
    assert!((gpu_hours - 0.777305869102486).abs() < 1e-9, "{gpu_hours}");
    assert_eq!(v["planner"]["total_ticks"], 204);
    assert_eq!(v["planner"]["scaling_events"].as_array().unwrap().len(), 128);
    // Every tick that changed the count added or drained workers through the lifecycle.
    let ops = v["planner"]["lifecycle_operations"].as_array().unwrap();
    assert!(ops.iter().any(|o| o["transition"] == "worker_ready"));
    assert!(ops.iter().any(|o| o["transition"] == "worker_stopped"));
    // Deterministic: the same inputs give the same bytes.
    assert_eq!(out.stdout, run().stdout);
}

#[test]
fn bad_planner_input_names_the_key_and_exits_2() {
    let config = tmp("bad.yaml");
    let base = std::fs::read_to_string(planner_dir().join("planner_agg_load_mooncake.yaml")).unwrap();
    for (extra, want) in [
        ("  bogus_knob: 3\n", "planner: Extra inputs are not permitted: ['bogus_knob']"),
        ("  min_workers: -1\n", "planner.min_workers: Input should be greater than or equal to 0"),
        ("  fpm_sample_bucket_size: 12\n", "fpm_sample_bucket_size must be a perfect square, got 12"),
    ] {
        let text = base.replace("../../../shared", &planner_dir().join("../../../shared").to_string_lossy()) + extra;
        std::fs::write(&config, text).unwrap();
        let out = predict_config(&config, &tmp("bad-out"));
        if stderr(&out).contains("no AIS performance data found") {
            eprintln!("NOTICE: AIS data not installed; skipping");
            return;
        }
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(stderr(&out).contains(want), "{extra:?}: {}", stderr(&out));
    }
    // The SLA target without an SLA, and ARIMA (the reference's default predictor), are refused
    // by name.
    let sla = std::fs::read_to_string(planner_dir().join("planner_disagg_sla_mooncake.yaml")).unwrap();
    let sla = sla.replace("../../../shared", &planner_dir().join("../../../shared").to_string_lossy());
    std::fs::write(&config, sla.replace("  load_predictor: constant\n", "")).unwrap();
    // Without an interpreter that has Dynamo's planner and pmdarima, ARIMA is refused with what
    // to install.
    let out = Command::new(env!("CARGO_BIN_EXE_servesim"))
        .args(["predict", "-c", config.to_str().unwrap(), "--output-dir", tmp("bad-out").to_str().unwrap()])
        .args(["--overwrite", "--format", "json"])
        .env("SERVESIM_PLANNER_PYTHON", "/nonexistent/python3")
        .output()
        .unwrap();
    if skip(&out) {
        return;
    }
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out)
            .contains("load_predictor 'arima' runs Dynamo's own ARIMA predictor (pmdarima auto_arima) through Python")
            && stderr(&out).contains("install ai-dynamo==1.6.1 and pmdarima"),
        "{}",
        stderr(&out)
    );
    let no_sla = sla.replace("evaluation:\n  sla:\n    ttft_ms: 2000\n    itl_ms: 40\n", "");
    std::fs::write(&config, no_sla).unwrap();
    let out = predict_config(&config, &tmp("bad-out"));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("Planner throughput scaling requires evaluation.sla.ttft_ms and evaluation.sla.itl_ms"),
        "{}",
        stderr(&out)
    );
    // Flag form: unknown keys and a mode that does not fit the cluster.
    let trace = shared_trace();
    for (cfg, want) in
        [(r#"{"mode": "agg", "bogus": 1}"#, "bogus"), (r#"{"mode": "disagg"}"#, "does not match the cluster")]
    {
        let out = servesim(&["predict", trace.to_str().unwrap(), "--planner-config", cfg]);
        assert_eq!(out.status.code(), Some(2), "{cfg}: {}", stderr(&out));
        assert!(stderr(&out).contains(want), "{cfg}: {}", stderr(&out));
    }
}

/// `load_predictor: arima` (Dynamo's default) runs the reference's own ARIMAPredictor through
/// the Python in SERVESIM_PLANNER_PYTHON (ai-dynamo 1.6.1 + pmdarima; the venv of
/// `setup_aisimulate.sh --with-dynamo` has both) and the report says so. The golden is the
/// reference's run of the same config (planner_disagg_sla_arima: the whole Mooncake synthetic
/// trace, SLA throughput scaling every 60 s), recorded with `python3 scripts/planner_golden.py
/// tests/planner/planner_disagg_sla_arima.yaml --runs 2` (both runs, and
/// ../shared/parity/aisimulate-examples/planner_disagg_sla_arima.expected.json, agree).
#[test]
fn arima_runs_the_reference_predictor_through_python() {
    if std::env::var_os("SERVESIM_PLANNER_PYTHON").is_none() {
        eprintln!("NOTICE: SERVESIM_PLANNER_PYTHON is not set (a Python with ai-dynamo 1.6.1 and pmdarima); skipping");
        return;
    }
    let Some(ours) = matches_golden("planner_disagg_sla_arima") else { return };
    let predictor = &ours["planner"]["metadata"]["load_predictor"];
    assert_eq!(predictor["name"], "arima");
    let implementation = predictor["implementation"].as_str().unwrap();
    assert!(
        implementation.starts_with("Dynamo's ARIMAPredictor through Python: ai-dynamo 1.6.1 pmdarima"),
        "{implementation}"
    );
}

/// If the reference's ARIMA predictor stops answering mid-run, the run stops with that error:
/// forecasts after it would be stand-ins, not the reference's. A stand-in "interpreter" starts
/// like the real one, takes one observation and exits.
#[test]
fn a_python_predictor_that_dies_stops_the_run() {
    let trace = shared_trace();
    if !trace.exists() {
        eprintln!("NOTICE: ../shared/traces is missing beside the checkout; skipping");
        return;
    }
    let fake = tmp("dying-python");
    std::fs::write(&fake, "#!/bin/sh\necho 'ok ai-dynamo stand-in (stand-in)'\nread line\nexit 0\n").unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let cfg =
        r#"{"mode": "agg", "optimization_target": "sla", "load_predictor": "arima", "enable_load_scaling": false}"#;
    let out = Command::new(env!("CARGO_BIN_EXE_servesim"))
        .args(["predict", trace.to_str().unwrap(), "--format", "json", "--planner-config", cfg])
        .args(["--sla-ttft-ms", "2000", "--sla-itl-ms", "50"])
        .env("SERVESIM_PLANNER_PYTHON", &fake)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(out.stdout.is_empty(), "no report of a run that stopped");
    assert!(
        stderr(&out).contains("planner at t=")
            && stderr(&out).contains("the ARIMA load predictor (Dynamo's, through Python) failed"),
        "{}",
        stderr(&out)
    );
}
