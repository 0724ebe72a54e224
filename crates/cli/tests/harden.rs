//! Hardening of `servesim predict` (issue 12): report files that cannot destroy inputs or be
//! left half written, metrics over zero durations, limits on counts, overload, clear messages.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/conversation.jsonl")
}

fn servesim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_servesim")).args(args).output().expect("run servesim")
}

/// A fresh directory for one test.
fn dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("servesim-harden-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The command failed with exit 2 and one line naming every needle.
fn rejects(args: &[&str], needles: &[&str]) -> String {
    let out = servesim(args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(!err.contains("panicked"), "{err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: {n:?} not in {err}");
    }
    err
}

fn json_stdout(out: &Output) -> Value {
    assert!(out.status.success(), "stderr: {}", stderr(out));
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON document")
}

/// Files in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

#[test]
fn a_report_naming_the_trace_is_refused_and_the_trace_kept() {
    let d = dir("report-is-trace");
    let trace = d.join("trace.jsonl");
    std::fs::copy(example(), &trace).unwrap();
    let before = std::fs::read(&trace).unwrap();
    let t = trace.to_str().unwrap();
    rejects(&["predict", t, "--report-jsonl", t], &["--report-jsonl", t, "input"]);
    rejects(&["predict", t, "--report-json", t], &["--report-json", "input"]);
    // The same file under another name: a relative path, a symlink, a hard link.
    let link = d.join("link.jsonl");
    std::os::unix::fs::symlink(&trace, &link).unwrap();
    rejects(&["predict", t, "--report-jsonl", link.to_str().unwrap()], &["--report-jsonl", "input"]);
    let hard = d.join("hard.jsonl");
    std::fs::hard_link(&trace, &hard).unwrap();
    rejects(&["predict", t, "--report-json", hard.to_str().unwrap()], &["--report-json", "input"]);
    let dotted = format!("{}/./trace.jsonl", d.display());
    rejects(&["predict", t, "--report-jsonl", &dotted], &["input"]);
    // A configuration file is an input too.
    let engine = d.join("engine.json");
    std::fs::write(&engine, r#"{"block_size": 64}"#).unwrap();
    let e = engine.to_str().unwrap();
    rejects(&["predict", t, "--extra-engine-args", e, "--report-json", e], &["--report-json", "input"]);
    assert_eq!(std::fs::read(&trace).unwrap(), before, "the trace is untouched");
    assert_eq!(std::fs::read_to_string(&engine).unwrap(), r#"{"block_size": 64}"#);
}

#[test]
fn both_reports_naming_one_file_are_refused() {
    let d = dir("reports-same");
    let out = d.join("out.json");
    let o = out.to_str().unwrap();
    let ex = example();
    rejects(&["predict", ex.to_str().unwrap(), "--report-json", o, "--report-jsonl", o], &["same file", o]);
    assert!(listing(&d).is_empty(), "nothing was created: {:?}", listing(&d));
    // Also when one is a symlink to the other.
    std::fs::write(&out, "previous\n").unwrap();
    let link = d.join("link.json");
    std::os::unix::fs::symlink(&out, &link).unwrap();
    rejects(
        &["predict", ex.to_str().unwrap(), "--report-json", o, "--report-jsonl", link.to_str().unwrap()],
        &["same file"],
    );
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "previous\n");
}

#[test]
fn a_failed_run_keeps_the_previous_reports() {
    let d = dir("failed-run");
    let (summary, records) = (d.join("summary.json"), d.join("records.jsonl"));
    std::fs::write(&summary, "old summary\n").unwrap();
    std::fs::write(&records, "old records\n").unwrap();
    // A run stopped by bad input leaves both files as they were.
    let bad = d.join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 2, \"hash_ids\": [1]}\nnot json\n",
    )
    .unwrap();
    let out = servesim(&[
        "predict",
        bad.to_str().unwrap(),
        "--report-json",
        summary.to_str().unwrap(),
        "--report-jsonl",
        records.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&summary).unwrap(), "old summary\n");
    assert_eq!(std::fs::read_to_string(&records).unwrap(), "old records\n");
    assert_eq!(listing(&d), ["bad.jsonl", "records.jsonl", "summary.json"], "no temporary files left");
    // A run that fails after the reports were opened (here: the records cannot be written)
    // leaves the previous summary, not the new one or a half-written one.
    let ex = example();
    let out = servesim(&[
        "predict",
        ex.to_str().unwrap(),
        "--report-json",
        summary.to_str().unwrap(),
        "--report-jsonl",
        "/dev/full",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("/dev/full: write failed"), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&summary).unwrap(), "old summary\n");
    assert_eq!(listing(&d), ["bad.jsonl", "records.jsonl", "summary.json"], "no temporary files left");
}

#[test]
fn a_successful_run_replaces_reports_whole_and_through_symlinks() {
    let d = dir("replace");
    let (summary, records) = (d.join("summary.json"), d.join("records.jsonl"));
    std::fs::write(d.join("real.json"), "old\n").unwrap();
    std::os::unix::fs::symlink(d.join("real.json"), &summary).unwrap();
    std::fs::write(&records, "old records\n").unwrap();
    let ex = example();
    let out = servesim(&[
        "predict",
        ex.to_str().unwrap(),
        "--format",
        "json",
        "--report-json",
        summary.to_str().unwrap(),
        "--report-jsonl",
        records.to_str().unwrap(),
    ]);
    let printed = json_stdout(&out);
    assert!(std::fs::symlink_metadata(&summary).unwrap().file_type().is_symlink(), "the symlink stays");
    let written: Value = serde_json::from_str(&std::fs::read_to_string(d.join("real.json")).unwrap()).unwrap();
    assert_eq!(written, printed);
    assert_eq!(std::fs::read_to_string(&records).unwrap().lines().count(), 403);
    assert_eq!(listing(&d), ["real.json", "records.jsonl", "summary.json"], "no temporary files left");
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn zero_duration_rates_are_null_with_a_reason_not_a_billion() {
    let d = dir("zero-duration");
    let t = write(
        &d,
        "zero.jsonl",
        "{\"timestamp\": 0, \"input_length\": 100, \"output_length\": 0, \"hash_ids\": [1]}\n\
         {\"timestamp\": 0, \"input_length\": 100, \"output_length\": 0, \"hash_ids\": [2]}\n",
    );
    let s = json_stdout(&servesim(&["predict", &t, "--format", "json", "--sla-ttft-ms", "100"]));
    assert_eq!(s["duration_ms"], 0.0);
    for key in [
        "request_throughput_rps",
        "input_throughput_tok_s",
        "output_throughput_tok_s",
        "total_throughput_tok_s",
        "goodput_request_throughput_rps",
        "goodput_output_throughput_tok_s",
    ] {
        assert!(s[key].is_null(), "{key} = {}", s[key]);
    }
    let notes = s["notes"].as_array().expect("a notes array says why");
    assert!(notes.iter().any(|n| n.as_str().unwrap().contains("duration is 0")), "{notes:?}");
    // The table says n/a and does not panic.
    let out = servesim(&["predict", &t]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    let row = text.lines().find(|l| l.contains("Request Throughput")).unwrap();
    assert!(row.contains("n/a") && !row.contains("1,000,000,000"), "{row}");
    // A run with a duration keeps its numbers and has no notes.
    let s = json_stdout(&servesim(&["predict", example().to_str().unwrap(), "--format", "json"]));
    assert!(s["request_throughput_rps"].as_f64().unwrap() > 0.0);
    assert!(s.get("notes").is_none());
}

#[test]
fn an_empty_engine_argument_says_so() {
    let ex = example();
    for flag in ["--extra-engine-args", "--prefill-engine-args", "--router-config"] {
        let mut args = vec!["predict", ex.to_str().unwrap(), flag, ""];
        if flag == "--router-config" {
            args.extend(["--router-mode", "kv_router"]);
        }
        rejects(&args, &[flag, "is empty"]);
    }
    rejects(&["predict", ex.to_str().unwrap(), "--extra-engine-args", "  "], &["--extra-engine-args", "is empty"]);
}

#[test]
fn stray_backticks_around_a_flag_are_pointed_out() {
    let ex = example();
    rejects(
        &["predict", ex.to_str().unwrap(), "`--num-workers`", "2"],
        &["`--num-workers`", "backticks", "write --num-workers"],
    );
    // What a shell leaves of `--num-workers` (run as a command): an empty argument.
    rejects(&["predict", ex.to_str().unwrap(), "", "2"], &["empty argument", "backticks"]);
    rejects(&["predict", "", ex.to_str().unwrap()], &["empty argument", "backticks"]);
    // An empty value of a flag is that flag's business.
    rejects(&["predict", ex.to_str().unwrap(), "--extra-engine-args", ""], &["--extra-engine-args", "is empty"]);
}

/// stdout of a successful run.
fn stdout(args: &[&str]) -> Vec<u8> {
    let out = servesim(args);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    out.stdout
}

#[test]
fn no_wall_clock_reports_are_byte_identical_across_runs() {
    let ex = example();
    let args = ["predict", ex.to_str().unwrap(), "--num-workers", "2", "--format", "json", "--no-wall-clock"];
    let first = stdout(&args);
    assert_eq!(first, stdout(&args));
    let s: Value = serde_json::from_slice(&first).unwrap();
    for key in ["wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s"] {
        assert!(s.get(key).is_none(), "{key} left out");
    }
    assert!(s.get("processed_tokens").is_some(), "simulated values stay");
    let table = String::from_utf8(stdout(&["predict", ex.to_str().unwrap(), "--no-wall-clock"])).unwrap();
    assert!(!table.contains("Wall Time"), "{table}");
}

#[test]
fn no_fast_forward_gives_the_same_reports_as_its_help_says() {
    let d = dir("no-ff");
    let ex = example();
    let run = |extra: &[&str], tag: &str| {
        let records = d.join(format!("{tag}.jsonl"));
        let mut args =
            vec!["predict", ex.to_str().unwrap(), "--num-workers", "2", "--format", "json", "--no-wall-clock"];
        let r = records.to_str().unwrap().to_string();
        args.extend(["--report-jsonl", &r]);
        args.extend(extra);
        let summary: Value = serde_json::from_slice(&stdout(&args)).unwrap();
        let mut lines: Vec<String> = std::fs::read_to_string(&records).unwrap().lines().map(String::from).collect();
        lines.sort();
        (summary, lines)
    };
    let (fast, fast_records) = run(&[], "ff");
    let (slow, slow_records) = run(&["--no-fast-forward"], "no-ff");
    assert!(fast_records == slow_records, "per-request records are byte-identical");
    let pooled =
        ["mean_itl_ms", "std_itl_ms", "mean_output_token_throughput_per_user", "std_output_token_throughput_per_user"];
    for (key, v) in fast.as_object().unwrap() {
        if pooled.contains(&key.as_str()) {
            let (a, b) = (v.as_f64().unwrap(), slow[key].as_f64().unwrap());
            assert!((a - b).abs() <= 1e-12 * a.abs().max(1.0), "{key}: {a} vs {b}");
        } else {
            assert!(*v == slow[key], "{key}: {v} vs {}", slow[key]);
        }
    }
    assert_eq!(fast.as_object().unwrap().len(), slow.as_object().unwrap().len());
}

#[test]
fn speedup_ratio_zero_leaves_modelled_durations_unscaled() {
    // The reference's core divides durations by a positive ratio and leaves them as they are
    // at 0; serve at 0 also does not sleep them. So predict at 0 reports what it does at 1.
    let ex = example();
    let at = |ratio: &str| {
        let args = format!("{{\"speedup_ratio\": {ratio}}}");
        stdout(&["predict", ex.to_str().unwrap(), "--format", "json", "--no-wall-clock", "--extra-engine-args", &args])
    };
    assert_eq!(at("0"), at("1"));
    assert_ne!(at("2"), at("1"));
}

const OVERLOAD: [&str; 8] =
    ["--input-tokens", "1000", "--output-tokens", "100", "--request-count", "2000", "--request-rate", "10000"];

fn predict(extra: &[&str]) -> Output {
    let mut args = vec!["predict"];
    args.extend(OVERLOAD);
    args.extend(extra);
    servesim(&args)
}

#[test]
fn an_overloaded_run_warns_once() {
    let out = predict(&["--format", "json", "--queue-warning", "100"]);
    assert!(out.status.success());
    let err = stderr(&out);
    assert_eq!(err.matches("warning:").count(), 1, "{err}");
    assert!(err.contains("more than 100 requests") && err.contains("--max-queued"), "{err}");
    // Workers replayed on separate threads warn once too, at the threshold given.
    let out = predict(&["--format", "json", "--queue-warning", "100", "--num-workers", "4"]);
    let err = stderr(&out);
    assert_eq!(err.matches("warning:").count(), 1, "{err}");
    assert!(err.contains("more than 100 requests"), "{err}");
    // A load the workers keep up with says nothing.
    let out = servesim(&["predict", example().to_str().unwrap(), "--format", "json", "--queue-warning", "100"]);
    assert!(out.status.success() && out.stderr.is_empty(), "{}", stderr(&out));
}

#[test]
fn max_queued_fail_stops_the_run_and_keeps_the_previous_report() {
    let d = dir("max-queued-fail");
    let summary = write(&d, "summary.json", "previous\n");
    let out = predict(&["--max-queued", "50", "--report-json", &summary]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("overloaded") && err.contains("--max-queued 50"), "{err}");
    assert_eq!(std::fs::read_to_string(&summary).unwrap(), "previous\n");
    assert_eq!(listing(&d), ["summary.json"], "no temporary file left");
    rejects(&["predict", example().to_str().unwrap(), "--max-queued", "0"], &["--max-queued", "at least 1"]);
}

#[test]
fn max_queued_shed_drops_arrivals_and_counts_them() {
    let s = json_stdout(&predict(&["--format", "json", "--max-queued", "50", "--max-queued-policy", "shed"]));
    let shed = s["shed_requests"].as_u64().expect("shed_requests reported");
    assert!(shed > 0);
    assert_eq!(s["num_requests"].as_u64().unwrap() + shed, 2000, "every arrival is served or shed");
    assert_eq!(s["completed_requests"], s["num_requests"]);
    // Without the flag the report has no such key (reports stay as they were).
    let s = json_stdout(&servesim(&["predict", example().to_str().unwrap(), "--format", "json"]));
    assert!(s.get("shed_requests").is_none());
}

#[test]
fn counts_beyond_the_machine_are_refused_up_front() {
    let ex = example();
    rejects(
        &["predict", ex.to_str().unwrap(), "--num-workers", "1000000000"],
        &["--num-workers", "available", "at most"],
    );
    rejects(
        &["predict", ex.to_str().unwrap(), "--num-prefill-workers", "1000000000", "--num-decode-workers", "1"],
        &["--num-prefill-workers", "at most"],
    );
    let synthetic = ["--input-tokens", "100", "--output-tokens", "10", "--request-count", "2", "--request-rate", "1"];
    let mut args = vec!["predict", "--turns-per-session", "4000000000"];
    args.extend(synthetic);
    rejects(&args, &["--turns-per-session 4000000000", "available"]);
    // (In a cache that holds such a prompt: otherwise it is refused as one no worker can take.)
    let mut args = vec![
        "predict",
        "--input-tokens",
        "4000000000",
        "--turns-per-session",
        "1000",
        "--extra-engine-args",
        r#"{"num_gpu_blocks": 100000000}"#,
    ];
    args.extend(&synthetic[2..]);
    rejects(&args, &["--input-tokens 4000000000", "available"]);
    // An ordinary count still runs.
    assert!(servesim(&["predict", ex.to_str().unwrap(), "--num-workers", "1000", "--format", "json"]).status.success());
}

#[test]
fn a_reader_that_goes_away_is_not_a_crash() {
    use std::process::Stdio;
    let ex = example();
    for format in ["json", "table"] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_servesim"))
            .args(["predict", ex.to_str().unwrap(), "--format", format])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = stderr(&out);
        assert!(!err.contains("panicked"), "{err}");
        assert!(out.status.success(), "{err}");
    }
}

/// A device or an endless pipe where a configuration file belongs stops at once with exit 2
/// (it filled memory before: `/dev/zero` as engine arguments, a router policy or `-c` hung).
#[test]
fn a_configuration_file_that_never_ends_is_refused() {
    if !Path::new("/dev/zero").exists() {
        return;
    }
    let trace = example();
    let trace = trace.to_str().unwrap();
    let too_large = "larger than 67108864 bytes (64 MiB)";
    rejects(&["predict", trace, "--extra-engine-args", "/dev/zero"], &["/dev/zero: cannot read", too_large]);
    rejects(
        &["predict", trace, "--router-mode", "kv_router", "--router-policy-config", "/dev/zero"],
        &["/dev/zero: cannot read", too_large],
    );
    rejects(
        &[
            "predict",
            trace,
            "--router-mode",
            "kv_router",
            "--router-prefill-load-model",
            "ais",
            "--router-ais-config",
            "/dev/zero",
        ],
        &["--router-ais-config", too_large],
    );
    rejects(&["predict", "-c", "/dev/zero"], &["could not read configuration /dev/zero", too_large]);
}
