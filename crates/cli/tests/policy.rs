//! Router policy classes on the command line: `--router-policy-config`, `--model-name`, the
//! `router_policy_config` key and `$DYN_ROUTER_POLICY_CONFIG`, and bad policy files.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

fn servesim(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_servesim"));
    c.args(args).env_remove("DYN_ROUTER_POLICY_CONFIG");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run servesim")
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("servesim-policy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn write(name: &str, text: &str) -> String {
    let p = tmp(name);
    std::fs::write(&p, text).unwrap();
    p.to_string_lossy().into_owned()
}

fn summary(out: &Output) -> Value {
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let mut v: Value = serde_json::from_slice(&out.stdout).unwrap();
    for k in servesim_replay::WALL_CLOCK_KEYS {
        v.as_object_mut().unwrap().remove(k);
    }
    v
}

/// 40 requests at t = 0 with distinct prompts of 400 + i tokens; even ones ask for the
/// `latency` family, odd ones for `batch`.
fn burst(name: &str) -> String {
    let rows: String = (0..40)
        .map(|i| {
            let hashes: Vec<String> = (0..8).map(|k| (1000 + i * 10 + k).to_string()).collect();
            let class = if i % 2 == 0 { "latency" } else { "batch" };
            format!(
                "{{\"timestamp\": 0, \"input_length\": {}, \"output_length\": 4, \"hash_ids\": [{}], \"policy_class\": \"{class}\"}}\n",
                400 + i,
                hashes.join(", ")
            )
        })
        .collect();
    write(&format!("{name}.jsonl"), &rows)
}

const CLASSES: &str = "default_policy_family: batch
uncached_isl_buckets:
  - {min_tokens: 0, bucket: cached}
  - {min_tokens: 32, bucket: uncached}
policy_classes:
  - {name: lat_c, policy_family: latency, cache_bucket: cached, quantum: 1, prefill_busy_threshold: 0}
  - {name: lat_u, policy_family: latency, cache_bucket: uncached, quantum: 4, prefill_busy_threshold: 0}
  - {name: bat_c, policy_family: batch, cache_bucket: cached, quantum: 1, prefill_busy_threshold: 0}
  - {name: bat_u, policy_family: batch, cache_bucket: uncached, quantum: 1, prefill_busy_threshold: 0}
";

const ENGINE: &str = r#"{"engine": {"block_size": 64, "max_num_batched_tokens": 512, "timing_model": {"type": "fixed", "prefill_ms": 40, "decode_ms": 10}}}"#;

fn burst_args<'a>(trace: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![
        "predict",
        trace,
        "--trace-block-size",
        "64",
        "--extra-engine-args",
        ENGINE,
        "--num-workers",
        "2",
        "--router-mode",
        "kv_router",
        "--format",
        "json",
    ];
    a.extend_from_slice(extra);
    a
}

/// Request index (input length − 400) in order of first admission.
fn admission_order(records: &str) -> Vec<(u64, f64)> {
    let mut rows: Vec<(f64, u64)> = std::fs::read_to_string(records)
        .unwrap()
        .lines()
        .map(|l| {
            let r: Value = serde_json::from_str(l).unwrap();
            (r["first_admit_ms"].as_f64().unwrap(), r["input_length"].as_u64().unwrap() - 400)
        })
        .collect();
    rows.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    rows.into_iter().map(|(t, i)| (i, t)).collect()
}

#[test]
fn classes_share_releases_by_quantum_as_in_the_reference() {
    // Dynamo 1.6.1's replay of this burst admits, two at a time as the workers free up:
    // latency (quantum 4 tokens) and batch (quantum 1) requests of ~420 uncached tokens each.
    let (trace, config, records) = (burst("quantum"), write("classes.yaml", CLASSES), tmp("quantum.out"));
    let records = records.to_string_lossy().into_owned();
    summary(&servesim(&burst_args(&trace, &["--router-policy-config", &config, "--report-jsonl", &records]), &[]));
    let order: Vec<u64> = admission_order(&records).into_iter().map(|(i, _)| i).collect();
    let reference = [
        0, 1, 2, 4, 3, 6, 8, 10, 12, 14, 5, 16, 18, 20, 7, 22, 24, 26, 28, 30, 9, 32, 34, 36, 11, 38, 13, 15, 17, 19,
        21, 23, 25, 27, 29, 31, 33, 35, 37, 39,
    ];
    assert_eq!(order, reference);
    // Without the policy file the same burst is one first-come queue (no queueing at all here:
    // router_queue_threshold is unset).
    summary(&servesim(&burst_args(&trace, &["--report-jsonl", &records]), &[]));
    let plain: Vec<u64> = admission_order(&records).into_iter().map(|(i, _)| i).collect();
    assert_eq!(plain, (0..40).collect::<Vec<_>>());
}

#[test]
fn the_policy_file_can_come_from_the_router_config_or_the_environment() {
    let (trace, config) = (burst("sources"), write("same.yaml", CLASSES));
    let by_flag = summary(&servesim(&burst_args(&trace, &["--router-policy-config", &config]), &[]));
    let key = format!(r#"{{"router_policy_config": "{config}"}}"#);
    let by_key = summary(&servesim(&burst_args(&trace, &["--router-config", &key]), &[]));
    let by_env = summary(&servesim(&burst_args(&trace, &[]), &[("DYN_ROUTER_POLICY_CONFIG", &config)]));
    let without = summary(&servesim(&burst_args(&trace, &[]), &[]));
    assert_eq!(by_flag, by_key);
    assert_eq!(by_flag, by_env);
    assert_ne!(by_flag, without);
}

#[test]
fn model_name_picks_a_model_profile() {
    // The root profile queues nothing (no busy thresholds); the model's makes latency first.
    let config = write(
        "models.yaml",
        "default_policy_family: batch
uncached_isl_buckets: [{min_tokens: 0, bucket: all}]
policy_classes:
  - {name: lat, policy_family: latency, cache_bucket: all, quantum: 1}
  - {name: bat, policy_family: batch, cache_bucket: all, quantum: 1}
models:
  mymodel:
    default_policy_family: batch
    uncached_isl_buckets: [{min_tokens: 0, bucket: all}]
    policy_classes:
      - {name: lat, policy_family: latency, cache_bucket: all, quantum: 100000, prefill_busy_threshold: 0}
      - {name: bat, policy_family: batch, cache_bucket: all, quantum: 1, prefill_busy_threshold: 0}
",
    );
    let (trace, records) = (burst("models"), tmp("models.out").to_string_lossy().into_owned());
    let run = |extra: &[&str]| {
        let mut a = vec!["--router-policy-config", config.as_str(), "--report-jsonl", records.as_str()];
        a.extend_from_slice(extra);
        summary(&servesim(&burst_args(&trace, &a), &[]));
        admission_order(&records).into_iter().map(|(i, _)| i).collect::<Vec<_>>()
    };
    assert_eq!(run(&[]), (0..40).collect::<Vec<_>>(), "root profile: no queueing");
    assert_eq!(run(&["--model-name", "other"]), (0..40).collect::<Vec<_>>(), "unknown model: root profile");
    let order = run(&["--model-name", "mymodel"]);
    // As the reference: 0 and 1 are placed at once, then every queued latency request goes
    // before the first queued batch one.
    let first_batch = order.iter().position(|&i| i > 1 && i % 2 == 1).unwrap();
    assert_eq!(&order[..first_batch], &[0, 1, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34, 36]);
}

/// Exit code 2 and a one-line message with every needle.
fn rejects(args: &[&str], needles: &[&str]) {
    let out = servesim(args, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "args {args:?}: stderr {err}");
    assert!(!err.contains("panicked"), "{err}");
    for n in needles {
        assert!(err.contains(n), "expected {n:?} in {err:?}");
    }
}

#[test]
fn bad_policy_files_name_file_and_key() {
    let trace = burst("bad");
    let bad = write("bad_key.yaml", &CLASSES.replace("quantum: 4,", "quantum: 4, quantun: 2,"));
    rejects(&burst_args(&trace, &["--router-policy-config", &bad]), &["bad_key.yaml", "policy_classes[1]", "quantun"]);
    let bad = write("zero.yaml", &CLASSES.replace("quantum: 4,", "quantum: 0,"));
    rejects(&burst_args(&trace, &["--router-policy-config", &bad]), &["zero.yaml", "`policy_classes[1].quantum`"]);
    let bad = write(
        "incomplete.yaml",
        &CLASSES.replace("cache_bucket: uncached, quantum: 1,", "cache_bucket: cached, quantum: 1,"),
    );
    rejects(&burst_args(&trace, &["--router-policy-config", &bad]), &["incomplete.yaml", "policy_classes"]);
    let missing = tmp("nonesuch.yaml").to_string_lossy().into_owned();
    rejects(&burst_args(&trace, &["--router-policy-config", &missing]), &["nonesuch.yaml", "cannot read"]);
    let good = write("good.yaml", CLASSES);
    rejects(
        &["predict", &trace, "--router-policy-config", &good],
        &["--router-policy-config applies to --router-mode kv_router"],
    );
    let env = servesim(&burst_args(&trace, &[]), &[("DYN_ROUTER_POLICY_CONFIG", &missing)]);
    assert_eq!(env.status.code(), Some(2), "a bad file from the environment is bad input too");
}

#[test]
fn a_full_class_queue_stops_the_run_as_in_the_reference() {
    let config = write(
        "limit.yaml",
        "default_policy_family: batch
uncached_isl_buckets: [{min_tokens: 0, bucket: all}]
policy_classes:
  - {name: lat, policy_family: latency, cache_bucket: all, quantum: 1000, prefill_busy_threshold: 0, request_queue_limit_per_worker: 2}
  - {name: bat, policy_family: batch, cache_bucket: all, quantum: 1000, prefill_busy_threshold: 0}
",
    );
    let trace = burst("limit");
    let out = servesim(&burst_args(&trace, &["--router-policy-config", &config]), &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("router policy class \"lat\" queue requests limit reached (current=4, limit=4)"), "{err}");
}
