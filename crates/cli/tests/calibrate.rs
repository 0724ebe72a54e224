//! `servesim calibrate` and `--calibration`: the fit recovers a timing correction that made the
//! measurements, a calibration applies to `predict -c` as the overrides it stands for and to
//! the flag form as the AIS configuration's `calibration` key, names each way a deployment
//! differs from the one measured, widens ensemble intervals by its model error, and bad input
//! is refused with the file and key.
//!
//! The measurements are servesim's own predictions of the deployment with a known correction
//! (decode 25 % slower, a 7 ms frontend), at two loads, written with its summary keys; the AIS
//! data package must be installed (the test command sets it up), else the fit half skips.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn servesim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_servesim")).args(args).output().expect("run servesim")
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("servesim-calibrate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn write(name: &str, text: &str) -> PathBuf {
    let p = tmp(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// Llama-3.1-8B on one H100, vLLM, fused passes: a Poisson load of 300 requests.
const DEPLOYMENT: &str = "traffic:
  source: {type: synthetic, input_tokens: 512, output_tokens: 64}
  load: {type: poisson, requests_per_second: 4}
  stop: {requests: 300}
engine:
  mode: aggregated
  model: meta-llama/Meta-Llama-3.1-8B
  hardware: h100_sxm
  backend: vllm
  workers:
    aggregated:
      parallelism: {replicas: 1, tensor: 1}
      timing: {type: default, pass_model: fused}
";

const TRUTH: [&str; 3] = [
    "engine.workers.aggregated.timing.calibration.decode_scale=1.25",
    "engine.tokenization.base_ms=7",
    "engine.tokenization.workers=256",
];

fn predict(config: &Path, out: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["predict", "-c", config.to_str().unwrap(), "--output-dir", out.to_str().unwrap()];
    args.extend(["--overwrite", "--format", "json", "--no-wall-clock"]);
    args.extend(extra);
    servesim(&args)
}

fn prediction(out: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(out.join("prediction.json")).unwrap()).unwrap()
}

/// Writes the "measured" stage at `rate` req/s; None without the AIS data.
fn measure(deployment: &Path, rate: u32) -> Option<PathBuf> {
    let out = tmp(&format!("truth-{rate}"));
    let mut extra = vec![format!("traffic.load.requests_per_second={rate}")];
    extra.extend(TRUTH.iter().map(|s| s.to_string()));
    let sets: Vec<&str> = extra.iter().flat_map(|s| ["--set", s.as_str()]).collect();
    let run = predict(deployment, &out, &sets);
    if stderr(&run).contains("no AIS performance data found") {
        return None;
    }
    assert!(run.status.success(), "{}", stderr(&run));
    let p = prediction(&out);
    let keys = ["mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "mean_e2e_latency_ms", "p99_e2e_latency_ms"];
    let measured: serde_json::Map<String, Value> = keys.iter().map(|k| (k.to_string(), p[*k].clone())).collect();
    Some(write(&format!("measured-{rate}.json"), &Value::Object(measured).to_string()))
}

#[test]
fn a_fit_recovers_the_correction_that_made_the_measurements_and_predict_applies_it() {
    let deployment = write("deploy.yaml", DEPLOYMENT);
    let Some(slow) = measure(&deployment, 4) else {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping");
        return;
    };
    let fast = measure(&deployment, 12).unwrap();
    let set = write(
        "measurements.yaml",
        &format!(
            "deployment: deploy.yaml\nfit: [decode_scale, frontend_ms]\nstages:\n  \
             - {{name: low, measured: {}, set: ['traffic.load.requests_per_second=4']}}\n  \
             - {{name: high, measured: {}, set: ['traffic.load.requests_per_second=12']}}\n",
            slow.display(),
            fast.display()
        ),
    );
    let cal = tmp("calibration.json");
    let _ = std::fs::remove_file(&cal);
    let out = servesim(&["calibrate", set.to_str().unwrap(), "-o", cal.to_str().unwrap(), "--format", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let c: Value = serde_json::from_slice(&std::fs::read(&cal).unwrap()).unwrap();
    let param = |k: &str| c["parameters"][k].as_f64().unwrap();
    assert!((param("decode_scale") - 1.25).abs() < 0.01, "{}", c["parameters"]);
    assert!((param("frontend_ms") - 7.0).abs() < 0.5, "{}", c["parameters"]);
    assert_eq!((param("prefill_scale"), param("pass_overhead_ms")), (1.0, 0.0));
    assert_eq!(c["deployment"]["hardware"], "h100_sxm");
    assert_eq!(c["deployment"]["workers.aggregated.timing.pass_model"], "fused");
    assert_eq!(c["cross_validation"]["scheme"], "leave one stage out (one experiment)");
    // The uncalibrated model is off by the correction; the calibrated one is not.
    let median = |which: &str, m: &str| c["error_pct"][which][m]["median_abs_pct"].as_f64().unwrap();
    assert!(median("uncalibrated", "tpot_mean") > 15.0, "{}", c["error_pct"]);
    for m in ["ttft_mean", "tpot_mean", "e2e_mean"] {
        assert!(median("in_sample", m) < 1.0, "{m}: {}", c["error_pct"]);
        assert!(median("cross_validated", m) < 3.0, "{m}: {}", c["error_pct"]);
    }
    // The calibration file is not overwritten without --overwrite.
    let again = servesim(&["calibrate", set.to_str().unwrap(), "-o", cal.to_str().unwrap()]);
    assert_eq!(again.status.code(), Some(2));
    assert!(stderr(&again).contains("exists; give --overwrite"), "{}", stderr(&again));

    // predict -c --calibration is the deployment with the fitted corrections.
    let with_file = tmp("with-calibration");
    let run = predict(
        &deployment,
        &with_file,
        &["--calibration", cal.to_str().unwrap(), "--set", "traffic.load.requests_per_second=12"],
    );
    assert!(run.status.success(), "{}", stderr(&run));
    assert!(!stderr(&run).contains("warning"), "{}", stderr(&run));
    let measured: Value = serde_json::from_slice(&std::fs::read(&fast).unwrap()).unwrap();
    let predicted = prediction(&with_file);
    for k in ["mean_ttft_ms", "mean_tpot_ms", "mean_e2e_latency_ms"] {
        let (p, m) = (predicted[k].as_f64().unwrap(), measured[k].as_f64().unwrap());
        assert!((p / m - 1.0).abs() < 0.01, "{k}: predicted {p}, measured {m}");
    }
    // On other hardware it still runs, with a warning naming the difference.
    let other = predict(
        &deployment,
        &tmp("other-gpu"),
        &["--calibration", cal.to_str().unwrap(), "--set", "engine.hardware=h200_sxm"],
    );
    assert!(other.status.success(), "{}", stderr(&other));
    assert!(
        stderr(&other).contains("hardware: measured on \"h100_sxm\", this deployment has \"h200_sxm\""),
        "{}",
        stderr(&other)
    );
    // With --ensemble the model error widens the intervals.
    let plain = tmp("ensemble-plain");
    let widened = tmp("ensemble-calibrated");
    assert!(predict(&deployment, &plain, &["--ensemble", "3"]).status.success());
    let run = predict(&deployment, &widened, &["--ensemble", "3", "--calibration", cal.to_str().unwrap()]);
    assert!(run.status.success(), "{}", stderr(&run));
    let (p, w) = (prediction(&plain), prediction(&widened));
    assert!(w["calibration_model_error"]["widened"].as_array().unwrap().iter().any(|k| k == "mean_ttft_ms"));
    let width = |v: &Value| v["mean_ttft_ms_p95"].as_f64().unwrap() / v["mean_ttft_ms_p05"].as_f64().unwrap();
    assert!(width(&w) > width(&p), "{} vs {}", width(&w), width(&p));
}

#[test]
fn bad_measurement_sets_are_refused_with_the_file_and_key() {
    let deployment = write("bad-deploy.yaml", DEPLOYMENT);
    let cases: [(&str, String, &str); 5] = [
        (
            "missing-measured",
            "deployment: bad-deploy.yaml\nstages:\n  - {name: a}\n".into(),
            "stages[0].measured: missing",
        ),
        (
            "unknown-key",
            "deployment: bad-deploy.yaml\nstages:\n  - {measured: m.json, rate: 3}\n".into(),
            "stages[0].rate: unknown key",
        ),
        ("no-stages", "deployment: bad-deploy.yaml\nstages: []\n".into(), "stages: must list the measured stages"),
        (
            "bad-window",
            "deployment: bad-deploy.yaml\nstages:\n  - {measured: m.json, window_s: [5, 1]}\n".into(),
            "stages[0].window_s: start 5 is after end 1",
        ),
        (
            "not-a-measurement",
            format!("deployment: bad-deploy.yaml\nstages:\n  - {{measured: {}}}\n", deployment.display()),
            "not a measurement servesim reads",
        ),
    ];
    std::fs::write(tmp("m.json"), r#"{"mean_ttft_ms": 20.0}"#).unwrap();
    for (name, text, want) in cases {
        let set = write(&format!("{name}.yaml"), &text);
        let out = servesim(&["calibrate", set.to_str().unwrap(), "-o", tmp(&format!("{name}.json")).to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{name}: {}", stderr(&out));
        assert!(stderr(&out).contains(want), "{name}: {}", stderr(&out));
        assert!(stderr(&out).contains(set.to_str().unwrap()), "{name}: {}", stderr(&out));
        assert!(!tmp(&format!("{name}.json")).exists(), "{name}");
    }
    // A device or a pipe is read up to the bound, then refused.
    let set = write("endless.yaml", "deployment: bad-deploy.yaml\nstages:\n  - {measured: /dev/zero}\n");
    let out = servesim(&["calibrate", set.to_str().unwrap(), "-o", tmp("endless.json").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("/dev/zero: larger than 67108864 bytes"), "{}", stderr(&out));
    // The calibration file may not replace an input.
    let set = write("inputs.yaml", "deployment: bad-deploy.yaml\nstages:\n  - {measured: m.json}\n");
    let out = servesim(&["calibrate", set.to_str().unwrap(), "-o", tmp("m.json").to_str().unwrap(), "--overwrite"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("refusing to overwrite an input"), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(tmp("m.json")).unwrap(), r#"{"mean_ttft_ms": 20.0}"#);
    // A calibration is refused where it would be ignored.
    let cal = write(
        "fake-cal.json",
        r#"{"format": "servesim-calibration/1", "parameters": {"decode_scale": 1.1}, "deployment": {}}"#,
    );
    let fixed = write(
        "fixed.yaml",
        &DEPLOYMENT.replace("{type: default, pass_model: fused}", "{type: fixed, prefill_ms: 5, decode_ms: 2}"),
    );
    let out = predict(&fixed, &tmp("fixed-out"), &["--calibration", cal.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("timing.type is \"fixed\"; a calibration corrects the default (AIS) timing only"),
        "{}",
        stderr(&out)
    );
    // recommend: a search over modes whose worker blocks the YAML does not list is refused.
    let out = servesim(&[
        "recommend",
        "-c",
        deployment.to_str().unwrap(),
        "--calibration",
        cal.to_str().unwrap(),
        "--set",
        "engine.mode=[aggregated, disaggregated]",
        "--output-dir",
        tmp("recommend-out").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(
            "the search includes disaggregated deployments, whose engine.workers.prefill block the configuration \
             does not list; list it (the calibration applies to the blocks listed) or restrict engine.mode"
        ),
        "{}",
        stderr(&out)
    );
    // The YAML key checks its range, naming the key path.
    let out = predict(
        &deployment,
        &tmp("out-of-range"),
        &["--set", "engine.workers.aggregated.timing.calibration.decode_scale=50"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out)
            .contains("engine.workers.aggregated.timing.calibration.decode_scale: must be in [0.05, 20], got 50"),
        "{}",
        stderr(&out)
    );
    let out = servesim(&[
        "predict",
        "--input-tokens",
        "8",
        "--output-tokens",
        "2",
        "--request-count",
        "2",
        "--request-rate",
        "1",
        "--calibration",
        cal.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(
            "the aggregated workers are not timed by the AIS model; a calibration corrects AIS pass times only"
        ),
        "{}",
        stderr(&out)
    );
    let out = servesim(&["serve", "--port", "0", "--calibration", cal.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("not timed by the AIS model"), "{}", stderr(&out));
}

/// The flag form's AIS timing of the deployment above, with `extra` in its configuration.
fn ais_engine_args(extra: &str) -> String {
    format!(
        r#"{{"block_size": 16, "worker_type": "aggregated", "timing_model": {{"type": "external", "provider": "ais", "config": {{"model": "meta-llama/Meta-Llama-3.1-8B", "system": "h100_sxm", "backend": "vllm", "worker_type": "aggregated", "pass_model": "fused"{extra}}}}}}}"#
    )
}

fn flag_predict(engine_args: &str, extra: &[&str]) -> Output {
    let mut args = vec!["predict", "--extra-engine-args", engine_args, "--format", "json", "--no-wall-clock"];
    args.extend(["--input-tokens", "512", "--output-tokens", "64", "--request-count", "200", "--request-rate", "4"]);
    args.extend(extra);
    servesim(&args)
}

#[test]
fn the_flag_form_applies_a_calibration_as_the_ais_configuration_would() {
    let cal = write(
        "flag-cal.json",
        r#"{"format": "servesim-calibration/1",
            "parameters": {"prefill_scale": 0.9, "decode_scale": 1.25, "frontend_ms": 7},
            "fitted": ["prefill_scale", "decode_scale", "frontend_ms"],
            "deployment": {"model": "meta-llama/Meta-Llama-3.1-8B", "hardware": "h100_sxm", "backend": "vllm",
                           "workers.aggregated.parallelism.tensor": 1,
                           "workers.aggregated.timing.pass_model": "fused"}}"#,
    );
    let calibrated = flag_predict(&ais_engine_args(""), &["--calibration", cal.to_str().unwrap()]);
    if stderr(&calibrated).contains("no AIS performance data found") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping");
        return;
    }
    assert!(calibrated.status.success(), "{}", stderr(&calibrated));
    assert!(!stderr(&calibrated).contains("warning"), "{}", stderr(&calibrated));
    // The same corrections written into the AIS configuration, without the frontend.
    let by_hand =
        flag_predict(&ais_engine_args(r#", "calibration": {"prefill_scale": 0.9, "decode_scale": 1.25}"#), &[]);
    assert!(by_hand.status.success(), "{}", stderr(&by_hand));
    let plain = flag_predict(&ais_engine_args(""), &[]);
    let (c, h, p): (Value, Value, Value) = (
        serde_json::from_slice(&calibrated.stdout).unwrap(),
        serde_json::from_slice(&by_hand.stdout).unwrap(),
        serde_json::from_slice(&plain.stdout).unwrap(),
    );
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap();
    // The engines see the same arrivals 7 ms later: the same passes, each TTFT 7 ms longer.
    assert_eq!(f(&c, "mean_tpot_ms"), f(&h, "mean_tpot_ms"));
    assert!((f(&c, "mean_ttft_ms") - f(&h, "mean_ttft_ms") - 7.0).abs() < 1e-6, "{c} vs {h}");
    assert!(f(&c, "mean_tpot_ms") > 1.2 * f(&p, "mean_tpot_ms"), "{c} vs {p}");
    // A different GPU runs, with the difference named; a calibration in the configuration too is refused.
    let other =
        flag_predict(&ais_engine_args("").replace("h100_sxm", "h200_sxm"), &["--calibration", cal.to_str().unwrap()]);
    assert!(other.status.success(), "{}", stderr(&other));
    assert!(
        stderr(&other).contains("hardware: measured on \"h100_sxm\", this deployment has \"h200_sxm\""),
        "{}",
        stderr(&other)
    );
    let twice = flag_predict(
        &ais_engine_args(r#", "calibration": {"decode_scale": 1.1}"#),
        &["--calibration", cal.to_str().unwrap()],
    );
    assert_eq!(twice.status.code(), Some(2), "{}", stderr(&twice));
    assert!(stderr(&twice).contains("has a calibration of its own"), "{}", stderr(&twice));
    // Disaggregated: both roles are corrected, and the identity names each role.
    let (prefill, decode) =
        (ais_engine_args("").replace("aggregated", "prefill"), ais_engine_args("").replace("aggregated", "decode"));
    let disagg = flag_predict(
        &ais_engine_args(""),
        &["--prefill-engine-args", &prefill, "--decode-engine-args", &decode, "--calibration", cal.to_str().unwrap()],
    );
    assert!(disagg.status.success(), "{}", stderr(&disagg));
    assert!(
        stderr(&disagg).contains("workers.aggregated.parallelism.tensor: measured on 1, this deployment has null"),
        "{}",
        stderr(&disagg)
    );
    // An ensemble's intervals are widened by the model error the file carries.
    let ens = flag_predict(&ais_engine_args(""), &["--ensemble", "3", "--calibration", cal.to_str().unwrap()]);
    assert!(ens.status.success(), "{}", stderr(&ens));
    let e: Value = serde_json::from_slice(&ens.stdout).unwrap();
    assert!(e["calibration_model_error"].is_object(), "{e}");
}
