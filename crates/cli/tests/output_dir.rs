//! The output directory of `predict -c`, `recommend -c` and `recommend merge`, and the reports
//! beside it: servesim replaces only what it wrote, never an input or a user's file (audit
//! 2026-12: N1–N3, N8–N11, N13, N19, N22, N23).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn servesim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_servesim")).args(args).output().expect("run servesim")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A fresh scratch directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("servesim-outdir-{}", std::process::id())).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const TRACE: &str = "{\"timestamp\": 0, \"input_length\": 100, \"output_length\": 5, \"hash_ids\": [1]}\n\
{\"timestamp\": 0, \"input_length\": 200, \"output_length\": 3, \"hash_ids\": [2]}\n\
{\"timestamp\": 15, \"input_length\": 50, \"output_length\": 4, \"hash_ids\": [1]}\n";

/// A predict configuration reading `trace.jsonl` beside it, with fixed timing (no data needed).
const CONFIG: &str = "traffic:\n  source: {type: trace, format: mooncake, paths: [trace.jsonl], block_size: 512}\n  \
load: {type: trace_timestamps}\nengine:\n  model: Qwen/Qwen3-32B\n  hardware: h200_sxm\n  context_length: 4096\n  \
workers:\n    aggregated:\n      kv_cache: {capacity: {type: fixed, blocks: 1000}}\n      \
timing: {type: fixed, prefill_ms: 10, decode_ms: 5}\n";

/// A 6-candidate grid over the same trace.
const SEARCH: &str = "traffic:\n  source: {type: trace, format: mooncake, paths: [trace.jsonl], block_size: 512}\n  \
load: {type: trace_timestamps}\nengine:\n  mode: aggregated\n  backend: vllm\n  model: Qwen/Qwen3-32B\n  hardware: h200_sxm\n  context_length: 4096\n  \
workers:\n    aggregated:\n      parallelism: {preset: false, replicas: {choices: [1, 2]}, tensor: 1}\n      \
scheduler: {max_batched_tokens: 8192, max_sequences: {choices: [16, 32, 64]}}\n      \
kv_cache: {capacity: {type: fixed, blocks: 1000}}\n      timing: {type: fixed, prefill_ms: 10, decode_ms: 5}\n\
optimization: {target: throughput_per_gpu}\noptimizer: {algorithm: grid}\n";

/// A directory holding a configuration (`cfg.yaml`, `text`) and its trace.
fn project(name: &str, text: &str) -> (PathBuf, PathBuf) {
    let dir = scratch(name);
    std::fs::write(dir.join("trace.jsonl"), TRACE).unwrap();
    std::fs::write(dir.join("cfg.yaml"), text).unwrap();
    let cfg = dir.join("cfg.yaml");
    (dir, cfg)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn refused(out: &Output, wants: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(wants), "{err:?} lacks {wants:?}");
    assert!(!err.contains("panicked"), "{err}");
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

#[test]
fn an_output_directory_holding_an_input_is_refused_and_left_alone() {
    // N1: the configuration's own directory as the output directory.
    let (dir, cfg) = project("holds-input", CONFIG);
    std::fs::write(dir.join("NOTES.txt"), "notes").unwrap();
    std::fs::create_dir(dir.join("sub")).unwrap();
    let out = servesim(&["predict", "-c", s(&cfg), "--output-dir", s(&dir), "--overwrite"]);
    refused(&out, "an input of this run");
    assert_eq!(names(&dir), ["NOTES.txt", "cfg.yaml", "sub", "trace.jsonl"]);
    assert_eq!(std::fs::read_to_string(dir.join("trace.jsonl")).unwrap(), TRACE);
    // A parent of the inputs is refused the same way.
    let parent = dir.parent().unwrap();
    let out = servesim(&["predict", "-c", s(&cfg), "--output-dir", s(parent), "--overwrite"]);
    refused(&out, "an input of this run");
    assert!(cfg.exists());
    // recommend -c too.
    let (sdir, scfg) = project("holds-input-search", SEARCH);
    let out = servesim(&["recommend", "-c", s(&scfg), "--output-dir", s(&sdir), "--overwrite"]);
    refused(&out, "an input of this run");
    assert_eq!(names(&sdir), ["cfg.yaml", "trace.jsonl"]);
}

#[test]
fn overwrite_replaces_only_servesims_own_outputs() {
    // N1: unrelated files, and servesim's older outputs that this run does not write again.
    let (dir, cfg) = project("own-outputs", CONFIG);
    let out_dir = dir.join("out");
    std::fs::create_dir(&out_dir).unwrap();
    std::fs::write(out_dir.join("NOTES.txt"), "mine").unwrap();
    std::fs::create_dir(out_dir.join("plots")).unwrap();
    std::fs::write(out_dir.join("plots/a.png"), "png").unwrap();
    std::fs::write(out_dir.join("prediction.json"), "old").unwrap();
    std::fs::write(out_dir.join("requests.jsonl"), "old").unwrap();
    // Without --overwrite a directory with anything in it is refused.
    let out = servesim(&["predict", "-c", s(&cfg), "--output-dir", s(&out_dir)]);
    refused(&out, "is not empty (it holds NOTES.txt, plots, prediction.json, requests.jsonl)");
    let out = servesim(&["predict", "-c", s(&cfg), "--output-dir", s(&out_dir), "--overwrite"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(names(&out_dir), ["NOTES.txt", "plots", "prediction.json"], "the stale requests.jsonl is ours");
    assert_eq!(std::fs::read_to_string(out_dir.join("NOTES.txt")).unwrap(), "mine");
    assert_eq!(std::fs::read_to_string(out_dir.join("plots/a.png")).unwrap(), "png");
    let doc: Value = serde_json::from_slice(&std::fs::read(out_dir.join("prediction.json")).unwrap()).unwrap();
    assert_eq!(doc["completed_requests"], 3);
}

#[test]
fn recommend_overwrite_keeps_user_files_among_its_outputs() {
    let (dir, cfg) = project("rec-own", SEARCH);
    let out_dir = dir.join("out");
    let out = servesim(&["recommend", "-c", s(&cfg), "--output-dir", s(&out_dir)]);
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::write(out_dir.join("recommendations/why.md"), "my notes").unwrap();
    std::fs::write(out_dir.join("recommendations/9999.yaml"), "stale: true").unwrap();
    std::fs::write(out_dir.join("cache/keep.txt"), "mine").unwrap();
    std::fs::write(out_dir.join("summary.xlsx"), "mine").unwrap();
    let out = servesim(&["recommend", "-c", s(&cfg), "--output-dir", s(&out_dir), "--overwrite"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let recs = names(&out_dir.join("recommendations"));
    assert!(recs.contains(&"why.md".to_string()) && !recs.contains(&"9999.yaml".to_string()), "{recs:?}");
    assert_eq!(std::fs::read_to_string(out_dir.join("cache/keep.txt")).unwrap(), "mine");
    assert_eq!(std::fs::read_to_string(out_dir.join("summary.xlsx")).unwrap(), "mine");
    assert!(out_dir.join("recommendation.json").exists() && out_dir.join("recommendation.csv").exists());
    assert!(names(&out_dir).iter().all(|n| !n.starts_with('.')), "{:?}", names(&out_dir));
}

#[test]
fn merge_refuses_to_write_over_the_shards_it_reads() {
    let (dir, cfg) = project("merge-over-shards", SEARCH);
    let shards = dir.join("shards");
    for k in ["0/2", "1/2"] {
        let out = servesim(&["recommend", "-c", s(&cfg), "--shard", k, "--output-dir", s(&shards)]);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let out = servesim(&["recommend", "merge", s(&shards), "--output-dir", s(&shards), "--overwrite"]);
    refused(&out, "an input of this run");
    assert_eq!(names(&shards), ["shard-0-of-2.json", "shard-1-of-2.json"]);
}

#[test]
fn output_paths_that_are_files_or_links_are_refused_and_empty_directories_accepted() {
    // N19.
    let (dir, cfg) = project("file-or-link", CONFIG);
    let file = dir.join("results");
    std::fs::write(&file, "a file").unwrap();
    let out = servesim(&["predict", "-c", s(&cfg), "--output-dir", s(&file), "--overwrite"]);
    refused(&out, "exists and is not a directory");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "a file");
    assert!(!dir.join(".results.old").exists());
    let real = dir.join("real");
    std::fs::create_dir(&real).unwrap();
    std::os::unix::fs::symlink(&real, dir.join("link")).unwrap();
    let out = servesim(&["predict", "-c", s(&cfg), "--output-dir", s(&dir.join("link")), "--overwrite"]);
    refused(&out, "is a symbolic link");
    assert!(std::fs::symlink_metadata(dir.join("link")).unwrap().file_type().is_symlink());
    // An existing empty directory needs no --overwrite.
    let out = servesim(&["predict", "-c", s(&cfg), "--output-dir", s(&real)]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(names(&real), ["prediction.json"]);
}

#[test]
fn reports_may_not_overwrite_the_traces_a_configuration_names() {
    // N2: the trace is named by the YAML, not on the command line.
    let (dir, cfg) = project("report-on-trace", CONFIG);
    let trace = dir.join("trace.jsonl");
    for flag in ["--report-html", "--telemetry"] {
        let out = servesim(&["predict", "-c", s(&cfg), "--output-dir", s(&dir.join("o")), flag, s(&trace)]);
        refused(&out, "is the input");
        assert_eq!(std::fs::read_to_string(&trace).unwrap(), TRACE, "{flag}");
    }
    let link = dir.join("link.jsonl");
    std::os::unix::fs::symlink(&trace, &link).unwrap();
    let out = servesim(&["predict", "-c", s(&cfg), "--output-dir", s(&dir.join("o")), "--report-html", s(&link)]);
    refused(&out, "is the input");
    let (sdir, scfg) = project("report-on-trace-search", SEARCH);
    let strace = sdir.join("trace.jsonl");
    let out = servesim(&["recommend", "-c", s(&scfg), "--output-dir", s(&sdir.join("o")), "--report-html", s(&strace)]);
    refused(&out, "is the input");
    assert_eq!(std::fs::read_to_string(&strace).unwrap(), TRACE);
    // A shard file read by merge is an input too.
    for k in ["0/2", "1/2"] {
        let out = servesim(&["recommend", "-c", s(&scfg), "--shard", k, "--output-dir", s(&sdir.join("sh"))]);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let shard = sdir.join("sh/shard-0-of-2.json");
    let before = std::fs::read(&shard).unwrap();
    let out = servesim(&[
        "recommend",
        "merge",
        s(&sdir.join("sh")),
        "--output-dir",
        s(&sdir.join("m")),
        "--report-html",
        s(&shard),
    ]);
    refused(&out, "is the input");
    assert_eq!(std::fs::read(&shard).unwrap(), before);
    // And a report may not land on one of servesim's own outputs.
    let out = servesim(&[
        "predict",
        "-c",
        s(&cfg),
        "--output-dir",
        s(&dir.join("o")),
        "--report-html",
        s(&dir.join("o/prediction.json")),
    ]);
    refused(&out, "servesim writes its own outputs there");
}

#[test]
fn reports_inside_the_output_directory_survive_overwrite() {
    // N3: written after the results are committed, into the directory that stays.
    let (dir, cfg) = project("reports-inside", CONFIG);
    let out_dir = dir.join("out");
    for overwrite in [false, true] {
        let mut args = vec![
            "predict".to_string(),
            "-c".into(),
            s(&cfg).into(),
            "--output-dir".into(),
            s(&out_dir).into(),
            "--report-html".into(),
            s(&out_dir.join("report.html")).into(),
            "--telemetry".into(),
            s(&out_dir.join("tel.csv")).into(),
        ];
        if overwrite {
            args.push("--overwrite".into());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = servesim(&args);
        assert!(out.status.success(), "overwrite {overwrite}: {}", stderr(&out));
        assert_eq!(names(&out_dir), ["prediction.json", "report.html", "tel.csv"], "overwrite {overwrite}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("Saved report to:"), "{stdout}");
        assert!(std::fs::read_to_string(out_dir.join("report.html")).unwrap().starts_with("<!DOCTYPE html>"));
    }
}

#[test]
fn no_wall_clock_makes_prediction_json_byte_identical() {
    // N22.
    let (dir, cfg) = project("no-wall-clock", CONFIG);
    let run = |name: &str| {
        let out_dir = dir.join(name);
        let out = servesim(&["predict", "-c", s(&cfg), "--output-dir", s(&out_dir), "--no-wall-clock"]);
        assert!(out.status.success(), "{}", stderr(&out));
        std::fs::read(out_dir.join("prediction.json")).unwrap()
    };
    let (a, b) = (run("a"), run("b"));
    assert_eq!(a, b);
    let doc: Value = serde_json::from_slice(&a).unwrap();
    assert!(doc.get("wall_time_ms").is_none() && doc.get("processed_tokens_per_s").is_none(), "{doc}");
}

/// The trace changed between shards: the merge is refused (N9).
#[test]
fn merge_refuses_shards_run_on_different_trace_contents() {
    let (dir, cfg) = project("merge-inputs", SEARCH);
    let shards = dir.join("shards");
    let out = servesim(&["recommend", "-c", s(&cfg), "--shard", "0/2", "--output-dir", s(&shards)]);
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::write(dir.join("trace.jsonl"), TRACE.replace("\"output_length\": 5", "\"output_length\": 25")).unwrap();
    let out = servesim(&["recommend", "-c", s(&cfg), "--shard", "1/2", "--output-dir", s(&shards)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = servesim(&["recommend", "merge", s(&shards), "--output-dir", s(&dir.join("m"))]);
    refused(&out, "was run on other inputs");
    assert!(!dir.join("m").exists() || names(&dir.join("m")).is_empty());
}

/// Shard files and cache entries edited after they were written are not trusted (N11).
#[test]
fn edited_shards_and_cache_entries_are_not_trusted() {
    let (dir, cfg) = project("edited", SEARCH);
    let shards = dir.join("shards");
    for k in ["0/2", "1/2"] {
        let out = servesim(&["recommend", "-c", s(&cfg), "--shard", k, "--output-dir", s(&shards)]);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let shard = shards.join("shard-0-of-2.json");
    let mut doc: Value = serde_json::from_slice(&std::fs::read(&shard).unwrap()).unwrap();
    doc["trials"][0]["used_gpus"] = Value::from(1u64 + doc["trials"][0]["used_gpus"].as_u64().unwrap());
    std::fs::write(&shard, serde_json::to_vec(&doc).unwrap()).unwrap();
    let out = servesim(&["recommend", "merge", s(&shards), "--output-dir", s(&dir.join("m"))]);
    refused(&out, "changed or damaged after it was written");

    // A cache entry edited to a huge throughput is replayed again, not ranked first.
    let out_dir = dir.join("out");
    let out = servesim(&["recommend", "-c", s(&cfg), "--output-dir", s(&out_dir), "--format", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let first: Value = serde_json::from_slice(&std::fs::read(out_dir.join("recommendation.json")).unwrap()).unwrap();
    let mut edited = 0;
    for shard_dir in std::fs::read_dir(out_dir.join("cache")).unwrap() {
        for entry in std::fs::read_dir(shard_dir.unwrap().path()).unwrap() {
            let p = entry.unwrap().path();
            let mut v: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
            v["summary"]["output_throughput_tok_s"] = serde_json::json!({"f64": format!("{:016x}", 5e6f64.to_bits())});
            std::fs::write(&p, serde_json::to_vec(&v).unwrap()).unwrap();
            edited += 1;
        }
    }
    assert_eq!(edited, 6);
    let out = servesim(&["recommend", "-c", s(&cfg), "--output-dir", s(&out_dir), "--overwrite"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let again: Value = serde_json::from_slice(&std::fs::read(out_dir.join("recommendation.json")).unwrap()).unwrap();
    assert_eq!(again["counts"]["cache_hits"], 0, "no edited entry is used");
    assert_eq!(first["candidates"], again["candidates"]);
}

/// An interrupted search's finished trials are read by the next run (N13), and a staging
/// directory a killed run left is removed.
#[test]
fn an_interrupted_search_is_resumed_from_its_cache() {
    let (dir, cfg) = project("resume", SEARCH);
    let out_dir = dir.join("out");
    let out = servesim(&["recommend", "-c", s(&cfg), "--output-dir", s(&out_dir)]);
    assert!(out.status.success(), "{}", stderr(&out));
    // What a run killed before it finished leaves: its cache and its staging directory.
    for name in ["recommendation.json", "recommendation.csv"] {
        std::fs::remove_file(out_dir.join(name)).unwrap();
    }
    std::fs::remove_dir_all(out_dir.join("recommendations")).unwrap();
    std::fs::create_dir(out_dir.join(".servesim-partial-4000000000")).unwrap();
    let out = servesim(&["recommend", "-c", s(&cfg), "--output-dir", s(&out_dir), "--format", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["counts"]["cache_hits"], 6);
    assert_eq!(names(&out_dir), ["cache", "recommendation.csv", "recommendation.json", "recommendations"]);
}

/// A replicas domain of a hundred thousand values runs: the shapes over the GPU budget are
/// dropped before any candidate is built (N8).
#[test]
fn a_huge_parallel_domain_costs_only_what_fits_the_budget() {
    let text = SEARCH.replace("replicas: {choices: [1, 2]}", "replicas: {range: {min: 1, max: 100000, step: 1}}");
    let (dir, cfg) =
        project("huge-domain", &text.replace("max_sequences: {choices: [16, 32, 64]}", "max_sequences: 16"));
    let out = servesim(&[
        "recommend",
        "-c",
        s(&cfg),
        "--output-dir",
        s(&dir.join("out")),
        "--set",
        "optimization.constraints={max_candidate_gpus: 4}",
        "--format",
        "json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["counts"]["evaluated"], 4, "replicas 1 to 4 fit 4 GPUs");
    assert_eq!(doc["provenance"]["over_budget_excluded"], 100000 - 4);
    // A non-parallel knob of more than a million values is refused before it is built.
    let text = SEARCH.replace(
        "max_sequences: {choices: [16, 32, 64]}",
        "max_sequences: {range: {min: 1, max: 4000000000, step: 1}}",
    );
    let (dir, cfg) = project("too-many-values", &text);
    let out = servesim(&["recommend", "-c", s(&cfg), "--output-dir", s(&dir.join("out"))]);
    refused(&out, "engine.workers.aggregated.scheduler.max_sequences.range: holds 4000000000 values");
}

/// A Weka corpus holding a symbolic link loop: refused at once, not walked forever, and the
/// input error that every candidate hits exits 2 (N10, N23).
#[test]
fn a_corpus_with_a_link_loop_is_refused_by_every_search_path() {
    let dir = scratch("link-loop");
    let corpus = dir.join("corpus");
    std::fs::create_dir(&corpus).unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/parity/gen/weka.jsonl"),
        corpus.join("a.jsonl"),
    )
    .unwrap();
    std::os::unix::fs::symlink(".", corpus.join("loop")).unwrap();
    let text = SEARCH.replace(
        "{type: trace, format: mooncake, paths: [trace.jsonl], block_size: 512}",
        "{type: trace, format: weka, paths: [corpus]}",
    );
    std::fs::write(dir.join("cfg.yaml"), text).unwrap();
    for extra in [&[][..], &["--no-cache"][..]] {
        let started = std::time::Instant::now();
        let out = servesim(
            &[&["recommend", "-c", s(&dir.join("cfg.yaml")), "--output-dir", s(&dir.join("out"))][..], extra].concat(),
        );
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("symlink") || stderr(&out).contains("symbolic link"), "{}", stderr(&out));
        assert!(started.elapsed().as_secs() < 20);
        assert!(!dir.join("out").exists(), "{extra:?}: a failed run leaves no output directory it created");
    }
}

/// SIGINT removes the reports being written (a signal skips their clean-up on drop) and
/// exits 130; the previous reports stay (N13).
#[test]
fn an_interrupted_run_leaves_no_temporary_reports() {
    let dir = scratch("sigint");
    std::fs::write(dir.join("r.jsonl"), "previous").unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_servesim"))
        .args(["predict", "--input-tokens", "1000", "--output-tokens", "1000", "--request-count", "2000000"])
        .args(["--request-rate", "1000", "--max-queued", "10000000"])
        .args(["--report-jsonl", s(&dir.join("r.jsonl")), "--telemetry", s(&dir.join("t.csv"))])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let hidden = || names(&dir).into_iter().filter(|n| n.starts_with('.')).count();
    let started = std::time::Instant::now();
    while hidden() < 2 && started.elapsed().as_secs() < 30 {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(hidden(), 2, "{:?}", names(&dir));
    let status = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let code = child.wait().unwrap().code();
    assert_eq!(code, Some(130));
    assert_eq!(names(&dir), ["r.jsonl"]);
    assert_eq!(std::fs::read_to_string(dir.join("r.jsonl")).unwrap(), "previous");
}

/// The flag form's limits hold on the YAML path too: a telemetry interval below a millisecond
/// (N14) and arrival times past what the clock holds precisely (N18), by their key.
#[test]
fn the_yaml_path_keeps_the_flag_forms_limits() {
    let dir = scratch("yaml-limits");
    let cfg = dir.join("cfg.yaml");
    std::fs::write(
        &cfg,
        CONFIG.replace(
            "source: {type: trace, format: mooncake, paths: [trace.jsonl], block_size: 512}\n  load: {type: trace_timestamps}",
            "source: {type: synthetic, input_tokens: 64, output_tokens: 4}\n  load: {type: constant_rate, requests_per_second: 1e-300}\n  stop: {requests: 3}",
        ),
    )
    .unwrap();
    let out = servesim(&[
        "predict",
        "-c",
        s(&project("yaml-limits-telemetry", CONFIG).1),
        "--output-dir",
        s(&dir.join("o")),
        "--telemetry",
        s(&dir.join("t.csv")),
        "--telemetry-interval-ms",
        "1e-9",
    ]);
    refused(&out, "--telemetry-interval-ms must be at least 1 (one sample per simulated millisecond), got 1e-9");
    let out = servesim(&["predict", "-c", s(&cfg), "--output-dir", s(&dir.join("o"))]);
    refused(&out, "traffic.load.requests_per_second: is too small: 1e303 ms apart");
    assert!(!dir.join("t.csv").exists());
}
