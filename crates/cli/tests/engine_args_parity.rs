//! Engine arguments Dynamo 1.6.1 turns into something else than their face value, replayed
//! through `servesim predict` against the reference's recorded summaries
//! (`tests/parity/engine_args/*.golden.json`, each recorded with
//! `scripts/parity.py tests/parity/engine_args/<case>.json --record`):
//!
//! - AIS timing without `num_gpu_blocks` sizes the KV cache from GPU memory, with the memory
//!   fractions and `cuda_graph_reserved_bytes` of the launch (census 2026-12, §0 finding 1);
//! - `dynamo.router_queue_policy` replaces the router configuration's queue policy (finding 4);
//! - `prefill_schedule_interval` (vLLM, attention DP) and `prefill_decode_interval` (SGLang) hold
//!   prefills back (census item 26);
//! - MTP speculation: per-position `aic_nextn_accept_rates` (short lists padded with zeros, a
//!   certain first position) with `aic_mtp_seed` on vLLM, SGLang, TRT-LLM and a disaggregated
//!   decode pool, and the depth an AIS timing config's `nextn` gives the launch;
//! - SGLang decode passes timed on the whole Σ of the running sequence lengths even where shared
//!   prefixes make it exceed the KV pool (servesim capped it at the pool: ITL 35 % short).
//!
//! `scripts/parity.py` builds the command line and compares (exact where the reference is
//! deterministic, the listed tolerances against the median of its runs where it is not). The AIS
//! cases need the AIS data (`SERVESIM_AIS_SYSTEMS`, or the aisimulate venv the test command sets
//! up); without it they say so and skip.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn check(case: &str) {
    let path = root().join("tests/parity/engine_args").join(format!("{case}.json"));
    let out = Command::new("python3")
        .arg(root().join("scripts/parity.py"))
        .arg(&path)
        .args(["--binary", env!("CARGO_BIN_EXE_servesim")])
        .output()
        .expect("python3 runs scripts/parity.py");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if stderr.contains("no AIS performance data found") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping {case}");
        return;
    }
    assert!(out.status.success(), "{case} differs from Dynamo 1.6.1:\n{stdout}\n{stderr}");
}

macro_rules! cases {
    ($($test:ident),* $(,)?) => {
        $(#[test] fn $test() { check(stringify!($test)); })*

        #[test]
        fn every_case_has_a_test_and_a_golden() {
            let listed = [$(stringify!($test)),*];
            let dir = root().join("tests/parity/engine_args");
            for entry in std::fs::read_dir(&dir).unwrap() {
                let name = entry.unwrap().file_name().to_string_lossy().into_owned();
                if let Some(case) = name.strip_suffix(".json").filter(|c| !c.ends_with(".golden")) {
                    assert!(listed.contains(&case), "{case} has no test");
                    assert!(dir.join(format!("{case}.golden.json")).exists(), "{case} has no golden");
                }
            }
        }
    };
}

cases!(
    ais_kv_from_memory_vllm,
    ais_kv_from_memory_vllm_fraction,
    ais_kv_from_memory_sglang_fraction,
    ais_kv_from_memory_trtllm_fraction,
    router_queue_policy_lcfs,
    vllm_prefill_schedule_interval_2_dp2,
    vllm_prefill_schedule_interval_4_dp2,
    sglang_prefill_decode_interval_1,
    sglang_prefill_decode_interval_3,
    mtp_rates_seed_vllm,
    mtp_rates_seed_sglang,
    mtp_rates_seed_trtllm,
    mtp_rates_seed_disagg,
    ais_nextn_from_timing_config,
    sglang_ais_decode_context_over_capacity,
);

/// A small synthetic `servesim predict` with `{"engine": ENGINE}` as its engine arguments: its exit
/// status and standard error.
fn run_with_engine(engine: &str) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_servesim"))
        .args(["predict", "--input-tokens", "100", "--output-tokens", "5", "--request-count", "2"])
        .args(["--request-rate", "10", "--extra-engine-args"])
        .arg(format!(r#"{{"engine":{engine}}}"#))
        .output()
        .expect("run servesim");
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Speculation settings Dynamo 1.6.1 refuses stop `servesim predict` with its message (probed on
/// the reference's replay entry points), the key named, exit status 2.
#[test]
fn bad_speculation_settings_are_refused_with_dynamos_messages() {
    let ais = |extra: &str| {
        format!(
            r#"{{"type":"external","provider":"ais","config":{{"model":"m","system":"s","backend":"vllm","worker_type":"aggregated"{extra}}}}}"#
        )
    };
    for (engine, key, message) in [
        (r#"{"aic_nextn":0}"#.to_string(), "aic_nextn", "aic_nextn must be in 1..=5, got 0"),
        (r#"{"aic_nextn":6}"#.to_string(), "aic_nextn", "aic_nextn must be in 1..=5, got 6"),
        (
            r#"{"aic_nextn_accept_rates":"0.5"}"#.to_string(),
            "engine.aic_nextn_accept_rates",
            "aic_nextn_accept_rates requires aic_nextn",
        ),
        (
            r#"{"aic_nextn":2,"aic_nextn_accept_rates":"0.9,2"}"#.to_string(),
            "engine.aic_nextn_accept_rates",
            "aic_nextn_accept_rates[1] must be finite and in [0, 1], got 2",
        ),
        (
            r#"{"aic_nextn":2,"aic_nextn_accept_rates":"abc"}"#.to_string(),
            "engine.aic_nextn_accept_rates",
            r#"invalid aic_nextn_accept_rates value "abc": invalid float literal"#,
        ),
        (
            r#"{"aic_nextn":2,"aic_nextn_accept_rates":[0.5,0.5]}"#.to_string(),
            "engine.aic_nextn_accept_rates",
            "invalid type: sequence, expected a string",
        ),
        (
            r#"{"aic_nextn":2,"decode_speedup_ratio":2.0}"#.to_string(),
            "decode_speedup_ratio",
            "aic_nextn requires decode_speedup_ratio=1.0 because MTP output acceleration is modeled by burst sampling",
        ),
        (
            format!(r#"{{"timing_model":{}}}"#, ais(r#","speculation":{"kind":"mtp","params":{"num_speculative_tokens":2}}"#)),
            "engine.timing_model.config.speculation",
            "invalid AIS performance config: unknown variant `mtp`, expected `ngram`",
        ),
        (
            format!(r#"{{"timing_model":{}}}"#, ais(r#","nextn":1,"speculation":{"kind":"ngram","params":{"num_speculative_tokens":2}}"#)),
            "engine.timing_model.config.speculation",
            "invalid engine config: invalid forward pass perf model config: ngram speculation cannot be combined with nextn",
        ),
    ] {
        let (code, stderr) = run_with_engine(&engine);
        assert_eq!(code, Some(2), "{engine}: {stderr}");
        assert!(stderr.contains(message), "{engine}: {stderr}");
        assert!(stderr.contains(&format!("`{key}`")), "{engine}: the key is named: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{engine}: one line: {stderr}");
    }
    // A blank rate list is the default rates, as in the reference.
    let (code, stderr) = run_with_engine(r#"{"aic_nextn":2,"aic_nextn_accept_rates":" "}"#);
    assert_eq!(code, Some(0), "{stderr}");
}

/// Bad prefill intervals stop `servesim predict` with Dynamo 1.6.1's message for each and exit
/// status 2.
#[test]
fn bad_prefill_intervals_are_refused_with_dynamos_messages() {
    for (engine, message) in [
        (r#"{"prefill_schedule_interval":0}"#, "prefill_schedule_interval must be positive"),
        (r#"{"prefill_schedule_interval":-2}"#, "invalid value: integer `-2`, expected usize"),
        (r#"{"prefill_schedule_interval":2.5}"#, "invalid type: floating point `2.5`, expected usize"),
        (
            r#"{"backend":"sglang","prefill_schedule_interval":2}"#,
            "prefill_schedule_interval is supported only for backend=vllm; use prefill_decode_interval for backend=sglang",
        ),
        (r#"{"backend":"sglang","prefill_decode_interval":-1}"#, "invalid value: integer `-1`, expected usize"),
        (r#"{"prefill_decode_interval":1}"#, "prefill_decode_interval is supported only for backend=sglang"),
    ] {
        let (code, stderr) = run_with_engine(engine);
        assert_eq!(code, Some(2), "{engine}: {stderr}");
        assert!(stderr.contains(message), "{engine}: {stderr}");
        assert!(stderr.contains("engine.prefill_"), "{engine}: the key is named: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{engine}: one line: {stderr}");
    }
    let (code, stderr) = run_with_engine(r#"{"prefill_schedule_interval":3,"max_num_batched_tokens":4096}"#);
    assert_eq!(code, Some(0), "{stderr}");
}

/// A prompt over `max_num_batched_tokens` with chunked prefill off can never be scheduled:
/// Dynamo 1.6.1's replay fails the run ("effect-free zero-duration pass with 5 in-flight
/// requests remaining"), so servesim stops with an input error instead of reporting rejections.
#[test]
fn a_prompt_over_the_pass_budget_without_chunking_stops_the_run() {
    let run = |input_tokens: &str| {
        Command::new(env!("CARGO_BIN_EXE_servesim"))
            .args(["predict", "--input-tokens", input_tokens, "--output-tokens", "5", "--request-count", "5"])
            .args(["--request-rate", "10", "--extra-engine-args"])
            .arg(r#"{"engine":{"enable_chunked_prefill":false,"max_num_batched_tokens":512}}"#)
            .output()
            .expect("run servesim")
    };
    let out = run("1000");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("request 0 at t=0 ms: its prompt exceeds max_num_batched_tokens with chunked prefill off"),
        "{stderr}"
    );
    // A budget that holds the prompt runs.
    let out = run("500");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
