//! Forward-pass-measurement (FPM) estimation in `predict -c`, against aisimulate 0.13 on a stock
//! install (whose data package ships no FPM tables). Each expected message was recorded with
//! `$(../shared/parity/setup_aisimulate.sh) ../shared/parity/aisimulate_predict.py CFG.yaml --set KEY=VALUE`
//! on the config `BASE` below (Qwen3-8B, vLLM 0.24.0 on one H200, default timing); the fallback
//! run's metrics equal the op-level run's (the reference's `processed_*_per_s` are wall-clock
//! rates, not simulated).

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

const BASE: &str = "traffic:\n  source: {type: synthetic, input_tokens: 1024, output_tokens: 128}\n  load: {type: concurrency, concurrency: 16}\n  stop: {requests: 40}\nengine:\n  mode: aggregated\n  model: Qwen/Qwen3-8B\n  hardware: h200_sxm\n  backend: vllm\n  workers:\n    aggregated:\n      parallelism: {replicas: 1, tensor: 1}\n      timing: {type: default}\n";

const PROFILE: &str = "{schema_version: 1, model: Qwen/Qwen3-8B, model_revision: 0123456789abcdef0123456789abcdef01234567, \
    architecture: Qwen3ForCausalLM, context_length: 40960, num_experts: 0, provenance: test, deployments: [{system: h200_sxm, \
    backend: vllm, backend_version: 0.24.0, tp: 1, dp: 1, moe_tp: 1, moe_ep: 1, gemm_quant_mode: bfloat16, \
    moe_quant_mode: bfloat16, fmha_quant_mode: bfloat16, comm_quant_mode: half, kv_cache_dtype: bfloat16, \
    resources: {cache_layout: linear, kv_bytes_per_token: 147456, max_num_tokens: 8192, max_batch_size: 256, \
    weights_bytes: 16400000000, activations_bytes: 1000000000, runtime_overhead_bytes: 500000000, \
    comm_overhead_bytes: 0, provenance: synthetic}}]}";

const T: &str = "engine.workers.aggregated.timing";

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("servesim-fpm-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn run(name: &str, sets: &[String]) -> (Output, PathBuf) {
    let cfg = dir().join(format!("{name}.yaml"));
    std::fs::write(&cfg, BASE).unwrap();
    let out_dir = dir().join(format!("{name}-out"));
    let mut args: Vec<String> =
        ["predict", "-c", cfg.to_str().unwrap(), "--output-dir", out_dir.to_str().unwrap()].map(String::from).to_vec();
    args.extend(["--format".into(), "json".into(), "--overwrite".into()]);
    for s in sets {
        args.extend(["--set".into(), s.clone()]);
    }
    (Command::new(env!("CARGO_BIN_EXE_servesim")).args(&args).output().unwrap(), out_dir)
}

fn data_missing(out: &Output) -> bool {
    String::from_utf8_lossy(&out.stderr).contains("no AIS performance data found")
}

/// Exit 2, one line, every wanted part; None without AIS data.
fn refused(name: &str, sets: &[String], wants: &[&str]) -> Option<String> {
    let (out, out_dir) = run(name, sets);
    if data_missing(&out) {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping {name}");
        return None;
    }
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{name}: {err}");
    assert_eq!(err.trim().lines().count(), 1, "{name}: {err}");
    for w in wants {
        assert!(err.contains(w), "{name}: {err:?} lacks {w:?}");
    }
    assert!(!err.contains("panicked"), "{name}");
    assert!(!out_dir.join("prediction.json").exists(), "{name}");
    Some(err)
}

fn set(k: &str, v: &str) -> String {
    format!("{k}={v}")
}

/// The reference's data ships no FPM table: interpolation (`forward_model: fpm`, the legacy
/// spelling, or `estimation_mode: fpm_interpolation` at either level) refuses with the missing
/// file, in the version directory the op-level tables come from, or at `fpm_parquet_path`.
#[test]
fn interpolation_without_a_table_refuses_with_the_missing_file() {
    let missing = "No fpm_forward data collected for this backend/version.";
    for (name, sets) in [
        ("legacy", vec![set(&format!("{T}.forward_model"), "fpm")]),
        ("worker-mode", vec![set(&format!("{T}.estimation_mode"), "fpm_interpolation")]),
        ("engine-mode", vec![set("engine.estimation_mode", "fpm_interpolation")]),
        (
            "engine-deny",
            vec![set("engine.estimation_mode", "fpm_interpolation"), set("engine.fallback_policy", "deny")],
        ),
    ] {
        let Some(err) = refused(name, &sets, &["perf database error: File does not exist at ", missing]) else {
            return;
        };
        assert!(err.contains("/h200_sxm/vllm/0.24.0/fpm_forward_perf.parquet."), "{name}: {err}");
    }
    let path = dir().join("absent.parquet");
    refused(
        "absent-path",
        &[set(&format!("{T}.forward_model"), "fpm"), set(&format!("{T}.fpm_parquet_path"), path.to_str().unwrap())],
        &[&format!("File does not exist at {}. {missing}", path.display())],
    );
    // A parquet without its sidecar (the reference checks the pair before the table).
    let junk = dir().join("junk.parquet");
    std::fs::write(&junk, b"not a parquet").unwrap();
    refused(
        "no-sidecar",
        &[set(&format!("{T}.forward_model"), "fpm"), set(&format!("{T}.fpm_parquet_path"), junk.to_str().unwrap())],
        &[&format!(
            "FPM database is missing its metadata sidecar: {}. The parquet/metadata pair is atomic; refusing to load an unmatched parquet.",
            dir().join("junk.metadata.json").display()
        )],
    );
    assert_eq!(std::fs::read(&junk).unwrap(), b"not a parquet", "the table is only read");
}

/// A regression is trained from observed passes; an offline prediction has none, so selecting it
/// refuses (also with `fallback_policy: allow`: the selected mode is tried first).
#[test]
fn regression_is_never_ready_offline() {
    let why = "regression estimator is not ready; replay requires training observations";
    refused("reg-engine", &[set("engine.estimation_mode", "fpm_regression")], &[why]);
    refused(
        "reg-worker",
        &[set(&format!("{T}.forward_model"), "fpm"), set(&format!("{T}.estimation_mode"), "fpm_regression")],
        &[why],
    );
    refused(
        "reg-allow",
        &[set(&format!("{T}.estimation_mode"), "fpm_regression"), set(&format!("{T}.fallback_policy"), "allow")],
        &[why],
    );
}

/// `auto` tries op_level first, and `fallback_policy: allow` falls back from a missing (or
/// malformed) table to op_level: the same prediction as op_level timing.
#[test]
fn auto_and_allow_fall_back_to_op_level() {
    let (base, base_dir) = run("op-level", &[]);
    if data_missing(&base) {
        return;
    }
    assert!(base.status.success(), "{}", String::from_utf8_lossy(&base.stderr));
    let read =
        |d: &PathBuf| -> Value { serde_json::from_slice(&std::fs::read(d.join("prediction.json")).unwrap()).unwrap() };
    let reference = read(&base_dir);
    let junk = dir().join("fallback-junk.parquet");
    std::fs::write(&junk, b"x").unwrap();
    for (name, sets) in [
        ("auto", vec![set(&format!("{T}.forward_model"), "fpm"), set(&format!("{T}.estimation_mode"), "auto")]),
        (
            "allow",
            vec![
                set(&format!("{T}.estimation_mode"), "fpm_interpolation"),
                set(&format!("{T}.fallback_policy"), "allow"),
            ],
        ),
        (
            "engine-allow",
            vec![set("engine.estimation_mode", "fpm_interpolation"), set("engine.fallback_policy", "allow")],
        ),
        (
            "allow-junk",
            vec![
                set(&format!("{T}.forward_model"), "fpm"),
                set(&format!("{T}.fallback_policy"), "allow"),
                set(&format!("{T}.fpm_parquet_path"), junk.to_str().unwrap()),
            ],
        ),
    ] {
        let (out, d) = run(name, &sets);
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        let ours = read(&d);
        for k in ["mean_ttft_ms", "p90_ttft_ms", "mean_itl_ms", "mean_e2e_latency_ms", "output_throughput_tok_s"] {
            assert_eq!(ours[k], reference[k], "{name}: {k}");
        }
    }
}

/// The keys' own validation, worded as the reference's.
#[test]
fn fpm_keys_are_validated_as_the_reference_does() {
    let path = format!("{T}.fpm_parquet_path");
    refused(
        "path-needs-fpm",
        &[set(&path, "x.parquet")],
        &[&path, "fpm_parquet_path requires default timing with forward_model='fpm'"],
    );
    refused(
        "poly-fpm",
        &[set(&format!("{T}.type"), "polynomial"), set(&format!("{T}.forward_model"), "fpm")],
        &["polynomial timing rejects forward_model='fpm'; forward_model applies to default timing only"],
    );
    refused(
        "poly-reg",
        &[set(&format!("{T}.type"), "polynomial"), set(&format!("{T}.estimation_mode"), "fpm_regression")],
        &["estimator settings require default timing"],
    );
    refused(
        "learned",
        &[set("engine.estimation_mode", "fpm_learned")],
        &["engine.estimation_mode", "fpm_learned requires complete ForwardPassMetrics"],
    );
    refused("bad-forward", &[set(&format!("{T}.forward_model"), "fpm_x")], &["forward_model"]);
}

/// `engine.fpm_profile`: checked against the engine as the reference checks it; a profile that
/// passes needs the checkpoint's `config.json` at the pinned revision to verify its architecture,
/// which the reference fetches from the network (offline: refused) and servesim never does.
#[test]
fn fpm_profiles_are_checked_against_the_engine() {
    let p = |extra: &[String]| {
        let mut v = vec![set("engine.fpm_profile", PROFILE), set("engine.backend_version", "0.24.0")];
        v.extend(extra.iter().cloned());
        v
    };
    refused(
        "profile-model",
        &p(&[set("engine.fpm_profile.model", "Qwen/Qwen3-32B")]),
        &["engine.fpm_profile", "engine.model must match engine.fpm_profile.model"],
    );
    refused(
        "profile-version",
        &p(&[set("engine.backend_version", "0.19.0")]),
        &["engine.backend_version does not match any FPM profile deployment"],
    );
    refused(
        "profile-literal",
        &[set("engine.fpm_profile", PROFILE)],
        &["engine.fpm_profile requires a literal engine.backend_version for vllm"],
    );
    refused(
        "profile-revision",
        &p(&[set("engine.fpm_profile.model_revision", "main")]),
        &["engine.fpm_profile.model_revision", "provide a pinned model_revision, not a mutable or unknown placeholder"],
    );
    refused(
        "profile-shape",
        &p(&[set("engine.workers.aggregated.parallelism.tensor", "2")]),
        &["no matching FPM deployment profile for 'Qwen/Qwen3-8B', h200_sxm/vllm/0.24.0, \
           (tp,pp,dp,moe_tp,moe_ep,cp)=(2, 1, 1, 1, 1, 1), worker_type=aggregated; provide explicit resources \
           and precision for that deployment"],
    );
    refused(
        "profile-quant",
        &p(&[set("engine.fpm_profile", &PROFILE.replace("gemm_quant_mode: bfloat16", "gemm_quant_mode: fp4"))]),
        &["unknown FPM gemm_quant_mode: 'fp4'"],
    );
    refused(
        "profile-ok",
        &p(&[]),
        &["cannot verify FPM profile architecture: config.json metadata for 'Qwen/Qwen3-8B' at \
           model_revision='0123456789abcdef0123456789abcdef01234567' could not be resolved; make the pinned \
           checkpoint configuration available"],
    );
}

/// Writes the generated FPM table (`scripts/fpm_table.py`, deterministic) into a fresh directory
/// with the reference venv's pyarrow; None (with a notice) without the venv.
fn generated_table(name: &str) -> Option<PathBuf> {
    generated_table_with(name, &[])
}

/// [`generated_table`] with `scripts/fpm_table.py`'s options `args`.
fn generated_table_with(name: &str, args: &[&str]) -> Option<PathBuf> {
    let venv = std::env::var("AISIM_REF_VENV").ok().filter(|v| !v.is_empty())?;
    let python = PathBuf::from(venv).join("bin/python");
    if !python.is_file() {
        eprintln!("NOTICE: {} missing; skipping the FPM table tests", python.display());
        return None;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = dir().join(name);
    let status = Command::new(python).arg(root.join("scripts/fpm_table.py")).arg(&out).args(args).output().unwrap();
    assert!(status.status.success(), "{}", String::from_utf8_lossy(&status.stderr));
    Some(out.join("fpm_forward_perf.parquet"))
}

fn run_file(name: &str, yaml: &str, table: &std::path::Path) -> (Output, PathBuf) {
    let cfg = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fpm").join(yaml);
    let out_dir = dir().join(format!("{name}-out"));
    let args = [
        "predict",
        "-c",
        cfg.to_str().unwrap(),
        "--output-dir",
        out_dir.to_str().unwrap(),
        "--format",
        "json",
        "--overwrite",
        "--set",
        &format!("{T}.fpm_parquet_path={}", table.display()),
    ];
    (Command::new(env!("CARGO_BIN_EXE_servesim")).args(args).output().unwrap(), out_dir)
}

/// Runs `yaml` on the generated table and compares every metric of the reference's prediction
/// `expected` within 1e-6 relative; the reference's prediction (None without data or venv).
fn matches_the_reference(name: &str, yaml: &str, expected: &str) -> Option<Value> {
    matches_the_reference_on(name, yaml, expected, &[], 1e-6)
}

/// [`matches_the_reference`] on the table `scripts/fpm_table.py` writes with `table_args`, every
/// metric within `rel` relative.
fn matches_the_reference_on(name: &str, yaml: &str, expected: &str, table_args: &[&str], rel: f64) -> Option<Value> {
    let table = generated_table_with(&format!("{name}-table"), table_args)?;
    let before = std::fs::read(&table).unwrap();
    let (out, out_dir) = run_file(name, yaml, &table);
    if data_missing(&out) {
        return None;
    }
    assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read(&table).unwrap(), before, "the table is only read");
    let ours: Value = serde_json::from_slice(&std::fs::read(out_dir.join("prediction.json")).unwrap()).unwrap();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fpm").join(expected);
    let reference: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    // Wall-clock rates of the process, not simulated quantities.
    let skip = ["wall_time_ms", "call_wall_ms", "processed_output_tokens_per_s", "processed_tokens_per_s"];
    let mut compared = 0;
    for (k, v) in reference.as_object().unwrap() {
        let (Some(r), false) = (v.as_f64(), skip.contains(&k.as_str())) else { continue };
        let Some(o) = ours.get(k).and_then(Value::as_f64) else { continue };
        let tol = rel * r.abs().max(1e-3);
        assert!((o - r).abs() <= tol, "{name}: {k}: servesim {o} vs reference {r}");
        compared += 1;
    }
    assert!(compared >= 60, "{name}: only {compared} metrics compared");
    // The provenance names the estimator that ran, as the reference's does.
    let (o, r) = (&ours["prediction_provenance"]["aggregated"], &reference["prediction_provenance"]["aggregated"]);
    for key in ["estimator", "data_version", "data_version_unavailable_reason"] {
        assert_eq!(o[key], r[key], "{name}: prediction_provenance.aggregated.{key}");
    }
    Some(reference)
}

/// Inside coverage (every prefill an exact collected point, every decode step on its batch's KV
/// curve, the KV cache capped at the table's decode ceiling): every metric of the reference's
/// prediction within 1e-6 relative. Recorded as the YAML header says.
#[test]
fn interpolation_over_a_generated_table_matches_the_reference() {
    let Some(reference) = matches_the_reference(
        "golden",
        "predict_fpm_interp_qwen3_8b.yaml",
        "predict_fpm_interp_qwen3_8b.expected.json",
    ) else {
        return;
    };
    // The table's own points: TTFT is the (4, 4096, 0) prefill row.
    assert_eq!(reference["mean_ttft_ms"].as_f64(), Some(230.1569179999999));
}

/// Concurrency 8: every prefill pass fills the 8192-token budget with whole prompts (the
/// (8, 8192, 0) row), decode at batch 8.
#[test]
fn interpolation_at_concurrency_8_matches_the_reference() {
    let Some(reference) = matches_the_reference(
        "golden-c8",
        "predict_fpm_interp_qwen3_8b_c8.yaml",
        "predict_fpm_interp_qwen3_8b_c8.expected.json",
    ) else {
        return;
    };
    assert_eq!(reference["completed_requests"].as_f64(), Some(32.0));
    assert_eq!(reference["mean_ttft_ms"].as_f64(), Some(456.31383600000015));
}

/// Concurrency 20 on a table whose prefill curves reach down to 8 new tokens (sites at KV 0,
/// 1024 and 4096) and whose decode batches run to 24: prompts are chunked, and the pass at
/// t=920.465657 ms prefills one's 8-token remainder (1016 cached) beside four whole prompts while
/// 15 requests decode. The reference's engine times that prefill at its iteration totals (5,
/// 4104, 1016): 232.43921280256802 ms, where the integer means (5, 4105, 1015) give
/// 232.49339089726638 (`scripts/fpm_pass_goldens.py --chunked`); the 0.0542 ms apart is the
/// first pass where they differ. Every metric within 1e-9 relative; recorded as the YAML header
/// says.
#[test]
fn a_chunk_remainder_pass_is_timed_at_its_totals_as_the_reference_does() {
    let batches: Vec<String> = (1..=24).map(|b| b.to_string()).collect();
    let batches = batches.join(",");
    let args = ["--prefill-kv", "1024,4096", "--prefill-min-tokens", "8", "--decode-batches", &batches];
    let Some(reference) = matches_the_reference_on(
        "golden-c20",
        "predict_fpm_interp_qwen3_8b_c20.yaml",
        "predict_fpm_interp_qwen3_8b_c20.expected.json",
        &args,
        1e-9,
    ) else {
        return;
    };
    assert_eq!(reference["completed_requests"].as_f64(), Some(60.0));
    assert_eq!(reference["mean_ttft_ms"].as_f64(), Some(546.6093377333328));
    assert_eq!(reference["mean_itl_ms"].as_f64(), Some(16.417404611023596));
    // The last four prompts' first token ends that pass: its start, its prefill at the totals
    // and its decode part (15 requests, 15368 past tokens: 10.10228 ms), as reported (µs).
    let end = 920.465657 + 232.43921280256802 + 10.10228;
    assert!((reference["max_ttft_ms"].as_f64().unwrap() - end).abs() < 1e-6);
}

/// At concurrency 24 the cache is capped at the table's decode ceiling (20480 tokens) in
/// `predict -c` as in the reference, so both admit the same prompts and fail on the same first
/// pass outside the table (a chunked prompt's remainder reading 1016 cached tokens); recorded
/// with the golden YAML and `--set traffic.load.concurrency=24 --set traffic.stop.requests=48`.
#[test]
fn the_capped_cache_fails_on_the_reference_s_first_uncovered_pass() {
    let Some(table) = generated_table("c24-table") else { return };
    let cfg = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fpm/predict_fpm_interp_qwen3_8b.yaml");
    let out_dir = dir().join("c24-out");
    let out = Command::new(env!("CARGO_BIN_EXE_servesim"))
        .args(["predict", "-c", cfg.to_str().unwrap(), "--output-dir", out_dir.to_str().unwrap(), "--overwrite"])
        .args(["--set", &format!("{T}.fpm_parquet_path={}", table.display())])
        .args(["--set", "traffic.load.concurrency=24", "--set", "traffic.stop.requests=48"])
        .output()
        .unwrap();
    if data_missing(&out) {
        return;
    }
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(
            "perf database error: FPM prefill query total_kv_read_tokens=1016 is outside the collected domain \
             [0, 0] for model_path=\"Qwen/Qwen3-8B\"."
        ),
        "{err}"
    );
}

/// Leaving coverage (a cached-prefix prefill chunk on a table with KV=0 prefill sites only):
/// the same mid-replay refusal as the reference (its run exits 1 with this message).
#[test]
fn a_pass_outside_the_table_is_refused_as_the_reference_does() {
    let Some(table) = generated_table("uncovered-table") else { return };
    let (out, out_dir) = run_file("uncovered", "predict_fpm_interp_uncovered.yaml", &table);
    if data_missing(&out) {
        return;
    }
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(
            "perf database error: FPM prefill query total_kv_read_tokens=8192 is outside the collected domain \
             [0, 0] for model_path=\"Qwen/Qwen3-8B\". FPM never extrapolates; collect a wider sweep or use \
             forward_model='op_level'."
        ),
        "{err}"
    );
    assert!(!err.contains("panicked"));
    assert!(!out_dir.join("prediction.json").exists());
}

/// A table whose sidecar digest does not match its bytes, or whose identity is another
/// deployment's, is refused before the replay (exit 2), naming the file and the field.
#[test]
fn a_foreign_or_altered_table_is_refused() {
    let Some(table) = generated_table("altered-table") else { return };
    let sidecar = table.with_extension("metadata.json");
    let text = std::fs::read_to_string(&sidecar).unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    let digest = doc["parquet_sha256"].as_str().unwrap().to_string();
    std::fs::write(&sidecar, text.replace(&digest, &"0".repeat(64))).unwrap();
    let dirname = table.parent().unwrap().display().to_string();
    refused(
        "digest",
        &[set(&format!("{T}.forward_model"), "fpm"), set(&format!("{T}.fpm_parquet_path"), table.to_str().unwrap())],
        &[&format!("FPM parquet digest mismatch: sidecar=Some(String(\"{}\")) actual=\"{digest}\". The pair at {dirname} is inconsistent (interrupted writer?).", "0".repeat(64))],
    );
    std::fs::write(&sidecar, text.replace("\"h200_sxm\"", "\"b200_sxm\"")).unwrap();
    refused(
        "identity",
        &[set(&format!("{T}.forward_model"), "fpm"), set(&format!("{T}.fpm_parquet_path"), table.to_str().unwrap())],
        &[
            "FPM sidecar system=Some(\"b200_sxm\") does not match the database system \"h200_sxm\"",
            &sidecar.display().to_string(),
        ],
    );
    // A deployment the table was not collected for: no cell matches (the reference's words).
    std::fs::write(&sidecar, &text).unwrap();
    refused(
        "cell",
        &[
            set(&format!("{T}.forward_model"), "fpm"),
            set(&format!("{T}.fpm_parquet_path"), table.to_str().unwrap()),
            set(&format!("{T}.kvcache_quant_mode"), "fp8"),
        ],
        &[
            "No FPM cell matches model_path=\"Qwen/Qwen3-8B\" with identity {gemm_quant_mode=\"bfloat16\"",
            "kv_cache_dtype=\"fp8\"",
        ],
    );
}

/// A DSA model (DeepSeek-V3.2 on an H200 TP8 under SGLang 0.5.14): chunked 6000-token prompts put
/// passes off the collected sites (2 requests prefilling 8192 tokens over 2192 cached), which
/// transfer through the model's roofline with the sparse-attention block's SOL. Every metric of
/// the reference's prediction within 1e-6 relative (mean TTFT 1081.8104 ms, mean ITL 17.3055
/// ms); recorded as the YAML header says.
#[test]
fn interpolation_on_a_dsa_model_matches_the_reference() {
    let args = [
        "--model",
        "deepseek-ai/DeepSeek-V3.2",
        "--backend",
        "sglang",
        "--version",
        "0.5.14",
        "--cell",
        "dsv32_tp8",
        "--par",
        "tp=8,moe_tp=8",
        "--quant",
        "weight_quantization=fp8_block,gemm_quant_mode=fp8_block,moe_quant_mode=fp8_block,kv_cache_dtype=fp8",
        "--decode-context",
        "256,8192,256",
        "--prefill-kv",
        "4096,16384",
        "--prefill-kv-batches",
        "1,2,4,8,16",
    ];
    let Some(reference) = matches_the_reference_on(
        "golden-dsv32",
        "predict_fpm_interp_dsv32_sglang.yaml",
        "predict_fpm_interp_dsv32_sglang.expected.json",
        &args,
        1e-6,
    ) else {
        return;
    };
    assert_eq!(reference["completed_requests"].as_f64(), Some(16.0));
    assert_eq!(reference["mean_ttft_ms"].as_f64(), Some(1081.8104025000002));
    assert_eq!(reference["mean_itl_ms"].as_f64(), Some(17.305480230158775));
}

/// `scripts/fpm_table.py`'s options for Qwen3-30B-A3B on an H200 TP8 (moe_tp 8) under vLLM
/// 0.24.0 with a `dcp` column holding a dcp-1 and a dcp-2 cell (the dcp-2 decode rows timed over
/// the KV stripe), decode batches 1,2,4,5,8,9,16.
const DCP_TABLE: [&str; 16] = [
    "--model",
    "Qwen/Qwen3-30B-A3B",
    "--cell",
    "q30_tp8",
    "--par",
    "tp=8,moe_tp=8",
    "--dcp",
    "1,2",
    "--decode-batches",
    "1,2,4,5,8,9,16",
    "--decode-context",
    "256,4096,256",
    "--prefill-kv",
    "4096,16384",
    "--prefill-kv-batches",
    "1,2,4,8,16",
];

/// Decode context parallelism 2 over a table recording it: the deployment's `decode_context: 2`
/// selects the dcp-2 cell, read at the whole group's iteration totals (decode batches 6 and 5
/// blend the bracket rows 5/8). Every metric of the reference's prediction within 1e-9 relative;
/// recorded as the YAML header says.
#[test]
fn interpolation_under_decode_context_parallelism_matches_the_reference() {
    let Some(reference) = matches_the_reference_on(
        "golden-dcp",
        "predict_fpm_interp_dcp_qwen3_moe.yaml",
        "predict_fpm_interp_dcp_qwen3_moe.expected.json",
        &DCP_TABLE,
        1e-9,
    ) else {
        return;
    };
    assert_eq!(reference["completed_requests"].as_f64(), Some(30.0));
    assert_eq!(reference["mean_itl_ms"].as_f64(), Some(7.16481));
}

/// What the reference refuses around DCP cells and speculation (each message recorded with
/// `aisimulate_predict.py` on `predict_fpm_interp_dcp_qwen3_moe.yaml` and the `--set`s below): a
/// deployment stating `decode_context: 1` selects only a dcp-1 cell (a table without a dcp column
/// has none), one not stating it only cells without DCP; DCP under SGLang or the regression has
/// no whole-forward timing; every speculative scheme needs op-level timing.
#[test]
fn dcp_cells_and_speculation_are_refused_as_the_reference_does() {
    let Some(dcp_table) = generated_table_with("dcp-refusals", &DCP_TABLE) else { return };
    let plain: Vec<&str> = DCP_TABLE[..6].iter().chain(&DCP_TABLE[8..]).copied().collect();
    let Some(plain_table) = generated_table_with("dcp-refusals-plain", &plain) else { return };
    let cfg = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fpm/predict_fpm_interp_dcp_qwen3_moe.yaml");
    let refuse = |name: &str, table: &PathBuf, sets: &[&str], want: &str| {
        let out_dir = dir().join(format!("{name}-out"));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_servesim"));
        cmd.args(["predict", "-c", cfg.to_str().unwrap(), "--output-dir", out_dir.to_str().unwrap(), "--overwrite"]);
        cmd.args(["--set", &format!("{T}.fpm_parquet_path={}", table.display())]);
        for s in sets {
            cmd.args(["--set", s]);
        }
        let out = cmd.output().unwrap();
        if data_missing(&out) {
            return;
        }
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains(want), "{name}: {err}");
        assert!(!out_dir.join("prediction.json").exists(), "{name}");
    };
    let par = "engine.workers.aggregated.parallelism";
    refuse(
        "dcp1-plain",
        &plain_table,
        &[&format!("{par}.decode_context=1")],
        "input_modality=\"text\", dcp=\"1\"}. FPM never substitutes another model's curves",
    );
    refuse(
        "no-dcp",
        &dcp_table,
        &[&format!("{par}.decode_context=null")],
        "input_modality=\"text\"}. FPM never substitutes another model's curves",
    );
    refuse(
        "sglang",
        &dcp_table,
        &["engine.backend=sglang", "engine.backend_version=0.5.14"],
        "unsupported model for Rust core estimator: DCP timing requires measured vLLM FPM interpolation",
    );
    refuse(
        "regression",
        &dcp_table,
        &[&format!("{T}.estimation_mode=fpm_regression")],
        "unsupported model for Rust core estimator: DCP timing requires measured vLLM FPM interpolation",
    );
    refuse(
        "mtp",
        &dcp_table,
        &[
            "engine.speculation={kind: mtp, params: {depth: 2}, expected_accepted_tokens: 1.5}",
            "engine.workers.aggregated.kv_cache.capacity={type: fixed, blocks: 6000}",
            &format!("{par}.decode_context=null"),
        ],
        "unsupported model for Rust core estimator: mtp speculation requires op_level timing",
    );
}
