//! The `servesim` command as users call it: output formats, report files, and bad input.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/conversation.jsonl")
}

fn servesim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_servesim")).args(args).output().expect("run servesim")
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("servesim-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn json_stdout(out: &Output) -> Value {
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("stdout is exactly one JSON document")
}

/// Drops the keys measured on the host clock.
fn simulated(mut v: Value) -> Value {
    for k in servesim_replay::WALL_CLOCK_KEYS {
        v.as_object_mut().unwrap().remove(k);
    }
    v
}

#[test]
fn default_output_is_the_metrics_table() {
    let out = servesim(&["predict", example().to_str().unwrap(), "--num-workers", "2"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("servesim | LLM Metrics"));
    for row in ["Time to First Token (ms)", "Inter Token Latency (ms)", "Request Count (requests)"] {
        assert!(text.contains(row), "missing row {row}:\n{text}");
    }
    assert!(text.contains("│ Request Count (requests)") && text.contains("│      403 │"), "{text}");
    assert!(text.contains("Prefix Cache Reused Ratio: "));
    assert!(out.stderr.is_empty(), "no progress bar when stderr is not a terminal");
}

#[test]
fn json_format_prints_only_the_summary_and_reports_are_written() {
    let (summary_path, records_path) = (tmp("summary.json"), tmp("requests.jsonl"));
    let out = servesim(&[
        "predict",
        example().to_str().unwrap(),
        "--format",
        "json",
        "--report-json",
        summary_path.to_str().unwrap(),
        "--report-jsonl",
        records_path.to_str().unwrap(),
    ]);
    let summary = json_stdout(&out);
    assert_eq!(summary["completed_requests"], 403);
    assert_eq!(summary["num_requests"], 403);
    let file: Value = serde_json::from_str(&std::fs::read_to_string(&summary_path).unwrap()).unwrap();
    assert_eq!(file, summary);
    let records: Vec<Value> =
        std::fs::read_to_string(&records_path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(records.len(), 403);
    // The records add up to the summary.
    let output: u64 = records.iter().map(|r| r["output_length"].as_u64().unwrap()).sum();
    assert_eq!(output, summary["total_output_tokens"].as_u64().unwrap());
    let mean_ttft = records.iter().map(|r| r["ttft_ms"].as_f64().unwrap()).sum::<f64>() / 403.0;
    assert!((mean_ttft - summary["mean_ttft_ms"].as_f64().unwrap()).abs() < 1e-6);
    assert!(records.iter().all(|r| r["terminal_status"] == "completed"));
    // Later turns of a conversation arrive after the previous turn finished.
    let chat: Vec<&Value> = records.iter().filter(|r| r["session_id"] == "chat-0").collect();
    assert!(chat.len() > 1);
}

#[test]
fn same_inputs_give_the_same_report() {
    let ex = example();
    let args = ["predict", ex.to_str().unwrap(), "--num-workers", "3", "--format", "json"];
    let a = simulated(json_stdout(&servesim(&args)));
    let b = simulated(json_stdout(&servesim(&args)));
    assert_eq!(serde_json::to_string(&a).unwrap(), serde_json::to_string(&b).unwrap());
}

#[test]
fn kv_routing_is_reproducible_with_a_seed() {
    let ex = example();
    let run = |seed: &str, extra: &[&str]| {
        let mut args = vec!["predict", ex.to_str().unwrap(), "--num-workers", "4", "--router-mode", "kv_router"];
        args.extend_from_slice(&["--router-seed", seed, "--format", "json"]);
        args.extend_from_slice(extra);
        serde_json::to_string(&simulated(json_stdout(&servesim(&args)))).unwrap()
    };
    assert_eq!(run("7", &[]), run("7", &[]));
    let sampled = ["--router-config", r#"{"router_temperature": 1.0}"#];
    assert_eq!(run("7", &sampled), run("7", &sampled));
    assert_ne!(run("7", &sampled), run("8", &sampled), "the seed drives the sampling");
    // Routing on cache overlap reuses more of the chats' prefixes than round robin.
    let reuse = |v: &str| serde_json::from_str::<Value>(v).unwrap()["prefix_cache_reused_ratio"].as_f64().unwrap();
    let rr =
        simulated(json_stdout(&servesim(&["predict", ex.to_str().unwrap(), "--num-workers", "4", "--format", "json"])));
    assert!(reuse(&run("7", &[])) > rr["prefix_cache_reused_ratio"].as_f64().unwrap());
}

#[test]
fn disaggregated_serving_reports_both_pools() {
    let ex = example();
    let records = tmp("disagg.jsonl");
    let args = [
        "predict",
        ex.to_str().unwrap(),
        "--num-prefill-workers",
        "2",
        "--num-decode-workers",
        "3",
        "--prefill-engine-args",
        r#"{"kv_transfer_bandwidth": 10.0, "kv_bytes_per_token": 131072}"#,
        "--router-mode",
        "kv_router",
        "--format",
        "json",
        "--report-jsonl",
        records.to_str().unwrap(),
    ];
    let a = json_stdout(&servesim(&args));
    assert_eq!(a["completed_requests"], 403);
    let duration_s = a["duration_ms"].as_f64().unwrap() / 1000.0;
    assert!((a["prefill_worker_seconds"].as_f64().unwrap() - 2.0 * duration_s).abs() < 1.0);
    assert!((a["decode_worker_seconds"].as_f64().unwrap() - 3.0 * duration_s).abs() < 1.0);
    let text = std::fs::read_to_string(&records).unwrap();
    for line in text.lines() {
        let r: Value = serde_json::from_str(line).unwrap();
        let t = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k} in {r}"));
        // Prefill, hold, reservation, transfer (131072 B/token at 10 GB/s), decode.
        assert!(t("prefill_admit_ms") <= t("source_held_ms"));
        assert!(t("source_held_ms") <= t("destination_reserved_ms"));
        let transfer = t("input_length") * 131072.0 / 10e9 * 1000.0;
        assert!(t("destination_activated_ms") - t("destination_reserved_ms") >= transfer - 1e-6);
        assert!(t("decode_admit_ms") >= t("destination_activated_ms"));
        assert!(t("first_token_ms") > t("decode_admit_ms"));
        assert!(r["prefill_worker_idx"].as_u64().unwrap() < 2 && r["decode_worker_idx"].as_u64().unwrap() < 3);
        // A request admitted once by each pool has no readmission (Dynamo 1.6.1 counts the
        // admissions after a pool's first one, the entries flagged `is_readmission`).
        let history = r["admission_history"].as_array().unwrap();
        let flagged = history.iter().filter(|a| a["is_readmission"] == true).count();
        assert_eq!(r["readmission_count"], flagged, "{r}");
        assert_eq!(r["admission_count"], history.len(), "{r}");
    }
    let b = json_stdout(&servesim(&args));
    assert_eq!(simulated(a), simulated(b));
}

#[test]
fn profiled_timing_from_an_npz_next_to_the_config() {
    use servesim_engine::profile::Profile;
    let dir = tmp("profile");
    std::fs::create_dir_all(&dir).unwrap();
    // Twice the polynomial's prefill cost at 1000 tokens, a flat 20 ms decode step.
    let profile = Profile {
        prefill_isl: vec![1.0, 1000.0, 8192.0],
        prefill_ttft_ms: vec![33.0, 64.2, 338.3],
        decode_active_kv_tokens: vec![0.0, 1_000_000.0],
        decode_context_length: vec![0.0, 100_000.0],
        decode_itl: vec![20.0, 20.0, 20.0, 20.0],
    };
    std::fs::write(dir.join("profile.npz"), profile.to_npz()).unwrap();
    let config = dir.join("engine.json");
    std::fs::write(&config, r#"{"planner_profile_data": "profile.npz"}"#).unwrap();
    let ex = example();
    let run = |engine: &str| {
        json_stdout(&servesim(&["predict", ex.to_str().unwrap(), "--format", "json", "--extra-engine-args", engine]))
    };
    let profiled = run(config.to_str().unwrap());
    let itl = profiled["median_itl_ms"].as_f64().unwrap();
    assert!((itl - 20.0).abs() < 0.05, "decode steps take the profile's 20 ms, got {itl}");
    assert_ne!(profiled["mean_ttft_ms"], run("{}")["mean_ttft_ms"]);

    // A broken profile stops the run, unless falling back was asked for.
    std::fs::write(dir.join("broken.npz"), b"not an archive").unwrap();
    std::fs::write(&config, r#"{"planner_profile_data": "broken.npz"}"#).unwrap();
    rejects(
        &["predict", ex.to_str().unwrap(), "--extra-engine-args", config.to_str().unwrap()],
        &["engine.json", "`planner_profile_data`", "broken.npz", "not an NPZ archive"],
    );
    std::fs::write(
        &config,
        r#"{"timing_model": {"type": "interpolated", "path": "broken.npz", "fallback": "polynomial"}}"#,
    )
    .unwrap();
    let out = servesim(&[
        "predict",
        ex.to_str().unwrap(),
        "--format",
        "json",
        "--extra-engine-args",
        config.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("using the polynomial timing model"));
}

#[test]
fn flat_and_canonical_engine_args_are_equivalent() {
    let run = |engine: &str| {
        simulated(json_stdout(&servesim(&[
            "predict",
            example().to_str().unwrap(),
            "--format",
            "json",
            "--extra-engine-args",
            engine,
        ])))
    };
    let flat = run(r#"{"block_size": 32, "num_gpu_blocks": 2000}"#);
    let nested = run(r#"{"engine": {"block_size": 32, "num_gpu_blocks": 2000}, "dp_size": 1}"#);
    let file = tmp("engine.json");
    std::fs::write(&file, r#"{"block_size": 32, "num_gpu_blocks": 2000}"#).unwrap();
    let from_file = run(file.to_str().unwrap());
    assert_eq!(flat, nested);
    assert_eq!(flat, from_file);
    assert_ne!(flat, run("{}"), "the configuration matters");
}

#[test]
fn synthetic_load() {
    let out = servesim(&[
        "predict",
        "--input-tokens",
        "512",
        "--output-tokens",
        "32",
        "--request-count",
        "50",
        "--replay-concurrency",
        "4",
        "--turns-per-session",
        "2",
        "--sla-ttft-ms",
        "100",
        "--sla-itl-ms",
        "20",
        "--format",
        "json",
    ]);
    let s = json_stdout(&out);
    assert_eq!(s["completed_requests"], 100, "50 sessions of 2 turns");
    assert!(s["goodput_completed_requests"].as_u64().unwrap() <= 100);
}

/// Runs and expects exit code 2 with a one-line message containing every `needle`.
fn rejects(args: &[&str], needles: &[&str]) {
    let out = servesim(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "args {args:?}: stderr {err}");
    assert!(!err.contains("panicked") && !err.contains("backtrace"), "{err}");
    for n in needles {
        assert!(err.contains(n), "expected {n:?} in {err:?}");
    }
    assert!(out.stdout.is_empty());
}

fn trace(name: &str, text: &str) -> String {
    let p = tmp(name);
    std::fs::write(&p, text).unwrap();
    p.to_string_lossy().into_owned()
}

#[test]
fn bad_traces_name_file_line_and_field() {
    let good = r#"{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}"#;
    let t = trace("malformed.jsonl", &format!("{good}\n{{\"timestamp\": 3,\n"));
    rejects(&["predict", &t], &["malformed.jsonl:2:", "invalid JSON"]);
    let t = trace("missing.jsonl", &format!("{good}\n{good}\n{{\"timestamp\": 3, \"hash_ids\": [1]}}\n"));
    rejects(&["predict", &t], &["missing.jsonl:3:", "`output_length`", "missing"]);
    let t = trace("short.jsonl", r#"{"timestamp": 0, "input_length": 2000, "output_length": 2, "hash_ids": [1]}"#);
    rejects(&["predict", &t], &["short.jsonl:1:", "`input_length`", "exceed"]);
    let t = trace("types.jsonl", r#"{"timestamp": 0, "output_length": "two", "hash_ids": [1]}"#);
    rejects(&["predict", &t], &["types.jsonl:1:", "`output_length`", "\"two\""]);
    rejects(&["predict", "/no/such/trace.jsonl"], &["/no/such/trace.jsonl", "cannot open"]);
}

#[test]
fn bad_engine_configuration_is_named() {
    let ex = example();
    let ex = ex.to_str().unwrap();
    rejects(&["predict", ex, "--extra-engine-args", r#"{"block_sise": 16}"#], &["`block_sise`", "unknown key"]);
    rejects(
        &["predict", ex, "--extra-engine-args", r#"{"engine": {"num_gpu_blocks": -1}}"#],
        &["`engine.num_gpu_blocks`"],
    );
    let file = tmp("bad-engine.json");
    std::fs::write(&file, "{\n  \"block_size\": 16,\n  \"max_num_seqs\": ,\n}\n").unwrap();
    rejects(&["predict", ex, "--extra-engine-args", file.to_str().unwrap()], &["bad-engine.json", "line 3"]);
    rejects(&["predict", ex, "--extra-engine-args", "/no/such/engine.json"], &["/no/such/engine.json", "cannot read"]);
}

#[test]
fn contradictory_flags_are_rejected() {
    let ex = example();
    let ex = ex.to_str().unwrap();
    rejects(&["predict", ex, "--input-tokens", "10"], &["either trace files or a synthetic load"]);
    rejects(&["predict"], &["nothing to replay"]);
    rejects(
        &["predict", "--input-tokens", "10", "--output-tokens", "2", "--request-count", "5"],
        &["exactly one of --request-rate"],
    );
    rejects(
        &[
            "predict",
            "--input-tokens",
            "10",
            "--output-tokens",
            "2",
            "--request-count",
            "5",
            "--request-rate",
            "1",
            "--arrival-interval-ms",
            "5",
        ],
        &["exactly one of"],
    );
    rejects(
        &["predict", ex, "--replay-concurrency", "4", "--arrival-speedup-ratio", "2"],
        &["--arrival-speedup-ratio"],
    );
    rejects(&["predict", ex, "--num-workers", "0"], &["--num-workers"]);
    rejects(&["predict", ex, "--report-json", "/no/such/dir/out.json"], &["/no/such/dir/out.json", "cannot create"]);
    rejects(&["predict", ex, "--router-config", "{}"], &["--router-config applies to --router-mode kv_router"]);
    rejects(
        &["predict", ex, "--router-mode", "kv_router", "--router-config", r#"{"overlap_weight": 1}"#],
        &["--router-config", "`overlap_weight`", "unknown key"],
    );
    rejects(&["predict", ex, "--num-workers", "2", "--num-decode-workers", "2"], &["--num-workers"]);
    rejects(
        &["predict", ex, "--num-prefill-workers", "1", "--decode-engine-args", r#"{"block_size": 32}"#],
        &["same block_size"],
    );
    rejects(&["predict", ex, "--extra-engine-args", r#"{"worker_type": "decode"}"#], &["disaggregated"]);
}

#[test]
fn timing_jitter_is_seeded_checked_and_off_by_default() {
    let run = |extra: &[&str]| {
        let mut args = vec![
            "predict",
            "--input-tokens",
            "256",
            "--output-tokens",
            "32",
            "--request-count",
            "40",
            "--request-rate",
            "20",
            "--format",
            "json",
            "--no-wall-clock",
        ];
        args.extend_from_slice(extra);
        let out = servesim(&args);
        assert!(out.status.success(), "{extra:?}: {}", String::from_utf8_lossy(&out.stderr));
        out.stdout
    };
    let exact = run(&[]);
    assert_eq!(exact, run(&["--timing-jitter-cv", "0"]), "cv 0 is no jitter, byte for byte");
    let jittered = run(&["--timing-jitter-cv", "0.1"]);
    assert_ne!(exact, jittered, "jitter changes the timing");
    assert_eq!(jittered, run(&["--timing-jitter-cv", "0.1"]), "same seed, same report");
    assert_ne!(jittered, run(&["--timing-jitter-cv", "0.1", "--arrival-seed", "7"]));
    for bad in ["-0.1", "1.5", "nan", "inf"] {
        rejects(
            &[
                "predict",
                "--input-tokens",
                "8",
                "--output-tokens",
                "2",
                "--request-count",
                "2",
                "--request-rate",
                "1",
                "--timing-jitter-cv",
                bad,
            ],
            &["--timing-jitter-cv", "between 0 and 1"],
        );
    }
}

#[test]
fn deployment_config_runs_an_ensemble() {
    let config = tmp("ensemble.yaml");
    std::fs::write(
        &config,
        "traffic:\n  source: {type: synthetic, input_tokens: 128, output_tokens: 16}\n  load: {type: concurrency, concurrency: 4}\n  stop: {requests: 20}\nengine:\n  model: Qwen/Qwen3-32B\n  hardware: h200_sxm\n  context_length: 4096\n  workers:\n    aggregated:\n      kv_cache: {capacity: {type: fixed, blocks: 1000}}\n      timing: {type: fixed, prefill_ms: 10, decode_ms: 5}\n",
    )
    .unwrap();
    let out_dir = tmp("ensemble-out");
    let args = [
        "predict",
        "-c",
        config.to_str().unwrap(),
        "--output-dir",
        out_dir.to_str().unwrap(),
        "--overwrite",
        "--ensemble",
        "9",
        "--timing-jitter-cv",
        "0.1",
    ];
    let out = servesim(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("ensemble of 9 runs: median and 90 % interval"), "{text}");
    let first = std::fs::read(out_dir.join("prediction.json")).unwrap();
    let summary: Value = serde_json::from_slice(&first).unwrap();
    assert_eq!(summary["ensemble_members"], 9);
    let (lo, mid, hi) = (
        summary["mean_e2e_latency_ms_p05"].as_f64().unwrap(),
        summary["mean_e2e_latency_ms"].as_f64().unwrap(),
        summary["mean_e2e_latency_ms_p95"].as_f64().unwrap(),
    );
    assert!(lo < mid && mid < hi, "jitter spreads the members: {lo} {mid} {hi}");
    assert_eq!(summary["completed_requests"], 20);
    assert!(summary.get("prediction_provenance").is_some(), "the -c summary keeps its keys");
    // Deterministic: the same file again.
    assert!(servesim(&args).status.success());
    assert_eq!(first, std::fs::read(out_dir.join("prediction.json")).unwrap());
    rejects(
        &["predict", "-c", config.to_str().unwrap(), "--ensemble", "4", "--capture-per-request"],
        &["--ensemble", "--capture-per-request"],
    );
}

/// `traffic.stop.max_virtual_time_seconds` stops every ensemble member where the single run
/// stops: without jitter the members replay the same run, so the ensemble's medians are the
/// plain `predict -c` summary (until this was fixed, members ran to the end of the workload).
#[test]
fn deployment_config_ensemble_stops_at_the_virtual_time_limit() {
    let rows: String = (0..40)
        .map(|i| {
            format!(
                "{{\"timestamp\": {}, \"input_length\": 128, \"output_length\": 16, \"hash_ids\": [{i}]}}\n",
                i * 50
            )
        })
        .collect();
    let rows = trace("ensemble-stop.jsonl", &rows);
    let config = tmp("ensemble-stop.yaml");
    std::fs::write(
        &config,
        format!(
            "traffic:\n  source: {{type: trace, paths: [{rows}], format: mooncake}}\n  load: {{type: trace_timestamps}}\n  stop: {{max_virtual_time_seconds: 0.5}}\nengine:\n  model: Qwen/Qwen3-32B\n  hardware: h200_sxm\n  context_length: 4096\n  workers:\n    aggregated:\n      kv_cache: {{capacity: {{type: fixed, blocks: 1000}}}}\n      timing: {{type: fixed, prefill_ms: 10, decode_ms: 5}}\n"
        ),
    )
    .unwrap();
    let run = |out_dir: &str, extra: &[&str]| -> Value {
        let out_dir = tmp(out_dir);
        let mut args =
            vec!["predict", "-c", config.to_str().unwrap(), "--output-dir", out_dir.to_str().unwrap(), "--overwrite"];
        args.extend_from_slice(extra);
        let out = servesim(&args);
        assert!(out.status.success(), "{extra:?}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&std::fs::read(out_dir.join("prediction.json")).unwrap()).unwrap()
    };
    let single = run("ensemble-stop-single", &["--no-wall-clock"]);
    let ensemble = run("ensemble-stop-members", &["--ensemble", "3"]);
    let completed = single["completed_requests"].as_u64().unwrap();
    assert!(completed > 0 && completed < 40, "the stop time cuts the run: {completed} of 40");
    assert_eq!(ensemble["ensemble_members"], 3);
    for key in ["completed_requests", "incomplete_requests", "duration_ms", "mean_ttft_ms", "mean_e2e_latency_ms"] {
        assert_eq!(ensemble[key], single[key], "{key}");
        assert_eq!(ensemble[format!("{key}_p05")], single[key], "{key}_p05");
        assert_eq!(ensemble[format!("{key}_p95")], single[key], "{key}_p95");
    }
}

#[test]
fn online_paces_the_run_on_the_wall_clock_and_changes_no_simulated_value() {
    // 20 requests, one every 25 ms: about half a second simulated.
    let synthetic = [
        "predict",
        "--input-tokens",
        "256",
        "--output-tokens",
        "16",
        "--request-count",
        "20",
        "--arrival-interval-ms",
        "25",
        "--num-workers",
        "2",
        "--format",
        "json",
        "--no-wall-clock",
    ];
    let offline = servesim(&synthetic);
    let started = std::time::Instant::now();
    let online = servesim(&[&synthetic[..], &["--online"]].concat());
    let wall_ms = started.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(online.stdout, offline.stdout, "{}", String::from_utf8_lossy(&online.stderr));
    let duration_ms = json_stdout(&online)["duration_ms"].as_f64().unwrap();
    assert!(duration_ms > 450.0, "{duration_ms}");
    assert!(
        wall_ms >= duration_ms && wall_ms < 3.0 * duration_ms + 500.0,
        "wall {wall_ms} ms, simulated {duration_ms}"
    );

    // The deployment-config form takes it too.
    let config = tmp("online.yaml");
    std::fs::write(
        &config,
        "traffic:\n  source: {type: synthetic, input_tokens: 128, output_tokens: 16}\n  load: {type: concurrency, concurrency: 4}\n  stop: {requests: 20}\nengine:\n  model: Qwen/Qwen3-32B\n  hardware: h200_sxm\n  context_length: 4096\n  workers:\n    aggregated:\n      kv_cache: {capacity: {type: fixed, blocks: 1000}}\n      timing: {type: fixed, prefill_ms: 10, decode_ms: 5}\n",
    )
    .unwrap();
    let run = |dir: &str, extra: &[&str]| {
        let out_dir = tmp(dir);
        let args =
            ["predict", "-c", config.to_str().unwrap(), "--output-dir", out_dir.to_str().unwrap(), "--overwrite"];
        let started = std::time::Instant::now();
        let out = servesim(&[&args[..], extra].concat());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let summary: Value = serde_json::from_slice(&std::fs::read(out_dir.join("prediction.json")).unwrap()).unwrap();
        (simulated(summary), started.elapsed().as_secs_f64() * 1000.0)
    };
    let (unpaced, _) = run("online-off", &[]);
    let (paced, wall_ms) = run("online-on", &["--online"]);
    assert_eq!(paced, unpaced);
    let duration_ms = paced["duration_ms"].as_f64().unwrap();
    assert!(duration_ms > 100.0 && wall_ms >= duration_ms, "wall {wall_ms} ms, simulated {duration_ms}");

    rejects(&[&synthetic[..], &["--online", "--ensemble", "3"]].concat(), &["--online", "--ensemble"]);
}
