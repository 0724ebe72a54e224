//! Limits of `servesim predict`'s inputs (reliability audit 2026-12: N5, N6, N13, N14, N16,
//! N18, D9, D14, D16, D17): every hostile or out-of-range input ends in one clear line and exit
//! 2 (or 1 for an overload found during the run), and temporary files do not outlive the run.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn example() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/conversation.jsonl").to_string_lossy().into_owned()
}

fn servesim() -> Command {
    Command::new(env!("CARGO_BIN_EXE_servesim"))
}

fn run(args: &[&str]) -> Output {
    servesim().args(args).output().expect("run servesim")
}

/// A fresh directory for one test.
fn dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("servesim-limits-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

/// The command failed with `code` and printed exactly `message` (one line) on stderr.
fn fails_with(out: &Output, code: i32, message: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{err}");
    assert_eq!(err, format!("error: {message}\n"));
}

const SYNTHETIC: [&str; 6] = ["--input-tokens", "100", "--output-tokens", "10", "--request-count", "2"];

fn synthetic(extra: &[&str]) -> Output {
    let mut args = vec!["predict"];
    args.extend(SYNTHETIC);
    args.extend(extra);
    run(&args)
}

fn row(t: u64) -> String {
    format!("{{\"timestamp\": {t}, \"input_length\": 100, \"output_length\": 2, \"hash_ids\": [{t}]}}\n")
}

// N16
#[test]
fn control_characters_of_a_bad_line_are_escaped() {
    let d = dir("escape");
    let t = d.join("e.jsonl");
    std::fs::write(&t, b"\x1b]0;PWNED\x07\x1b[2J\x00\n").unwrap();
    let out = run(&["predict", t.to_str().unwrap()]);
    fails_with(&out, 2, &format!("{}:1: expected a JSON object, found \\x1b]0;PWNED\\x07\\x1b[2J\\x00", t.display()));
}

// N5
#[test]
fn a_trace_line_past_the_limit_is_refused_naming_file_and_line() {
    let d = dir("long-line");
    let t = d.join("t.jsonl");
    let ids: Vec<String> = (0..400).map(|i| i.to_string()).collect();
    let long = format!(
        "{{\"timestamp\": 1, \"input_length\": 204800, \"output_length\": 2, \"hash_ids\": [{}]}}\n",
        ids.join(", ")
    );
    std::fs::write(&t, format!("{}{long}", row(0))).unwrap();
    let out = servesim().args(["predict", t.to_str().unwrap()]).env("SERVESIM_MAX_LINE_BYTES", "1K").output().unwrap();
    fails_with(
        &out,
        2,
        &format!(
            "{}:2: the line is longer than 1024 bytes (1 KiB), the limit of a trace line; set SERVESIM_MAX_LINE_BYTES \
             to raise it",
            t.display()
        ),
    );
    // The same line within a larger limit is read.
    let out = servesim()
        .args(["predict", t.to_str().unwrap(), "--format", "json"])
        .env("SERVESIM_MAX_LINE_BYTES", "4K")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out =
        servesim().args(["predict", t.to_str().unwrap()]).env("SERVESIM_MAX_LINE_BYTES", "lots").output().unwrap();
    fails_with(
        &out,
        2,
        "SERVESIM_MAX_LINE_BYTES=\"lots\": expected a positive number of bytes (e.g. 536870912 or 512M)",
    );
}

// N5
#[test]
fn a_compressed_bomb_stops_at_the_decompression_limit() {
    let d = dir("bomb");
    let t = d.join("bomb.jsonl.zst");
    // 64 MiB of blanks before a row: a few KB compressed.
    let mut text = vec![b' '; 32 << 20];
    text.extend(vec![b'\n'; 32 << 20]);
    text.extend(row(0).as_bytes());
    let packed = zstd::encode_all(&text[..], 3).unwrap();
    std::fs::write(&t, &packed).unwrap();
    let started = Instant::now();
    let out = servesim()
        .args(["predict", t.to_str().unwrap()])
        .env("SERVESIM_MAX_DECOMPRESSED_BYTES", "16M")
        .output()
        .unwrap();
    fails_with(
        &out,
        2,
        &format!(
            "{}:1: cannot read: decompresses to more than 16777216 bytes (16 MiB) from {} bytes ({:.1} KiB) (a \
             decompression bomb?); set SERVESIM_MAX_DECOMPRESSED_BYTES to allow more",
            t.display(),
            packed.len(),
            packed.len() as f64 / 1024.0
        ),
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    // Within the default limit (1 GiB for a small file) the row after the blanks is replayed.
    let out = run(&["predict", t.to_str().unwrap(), "--format", "json"]);
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["completed_requests"], 1, "{}", String::from_utf8_lossy(&out.stderr));
}

// N6
#[test]
fn a_device_of_nul_bytes_is_refused_without_a_spool() {
    let d = dir("dev-zero");
    let tmp = d.join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let out = servesim().args(["predict", "/dev/zero"]).env("TMPDIR", &tmp).output().unwrap();
    fails_with(&out, 2, "/dev/zero: starts with NUL bytes: binary data (a device such as /dev/zero?), not a trace");
    assert!(listing(&tmp).is_empty(), "{:?}", listing(&tmp));
}

// N6
#[test]
fn a_pipe_past_the_spool_limit_is_refused_and_its_spool_removed() {
    let d = dir("spool-limit");
    let tmp = d.join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let mut child = servesim()
        .args(["predict", "/dev/stdin"])
        .env("TMPDIR", &tmp)
        .env("SERVESIM_MAX_SPOOL_BYTES", "1M")
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    // An endless generator: it stops when servesim closes the pipe.
    let writer = std::thread::spawn(move || {
        let mut t = 0;
        while stdin.write_all(row(t).as_bytes()).is_ok() {
            t += 1;
        }
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    fails_with(
        &out,
        2,
        "/dev/stdin: a piped or device input is copied to a temporary file (in $TMPDIR) before it is read, and this \
         one passed 1048576 bytes (1 MiB); set SERVESIM_MAX_SPOOL_BYTES to allow more, or give a regular file",
    );
    assert!(listing(&tmp).is_empty(), "{:?}", listing(&tmp));
}

/// Starts `predict /dev/stdin` on a pipe left open, waits for its spool in `tmp`, sends
/// `signal` and returns the exit code.
fn interrupted_while_spooling(tmp: &Path, signal: &str) -> Option<i32> {
    let mut child = servesim()
        .args(["predict", "/dev/stdin"])
        .env("TMPDIR", tmp)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(row(0).repeat(1000).as_bytes()).unwrap();
    stdin.flush().unwrap();
    let started = Instant::now();
    while listing(tmp).is_empty() || std::fs::metadata(tmp.join(&listing(tmp)[0])).map_or(0, |m| m.len()) == 0 {
        assert!(started.elapsed() < Duration::from_secs(20), "no spool appeared");
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = Command::new("kill").args([signal, &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let code = child.wait().unwrap().code();
    drop(stdin);
    code
}

// N13 (N6's spool when the run is stopped)
#[test]
fn sigint_and_sigterm_remove_the_spool_of_a_piped_trace() {
    let d = dir("signal");
    let tmp = d.join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    assert_eq!(interrupted_while_spooling(&tmp, "-INT"), Some(130));
    assert!(listing(&tmp).is_empty(), "{:?}", listing(&tmp));
    assert_eq!(interrupted_while_spooling(&tmp, "-TERM"), Some(143));
    assert!(listing(&tmp).is_empty(), "{:?}", listing(&tmp));
}

// N18
#[test]
fn times_the_clock_cannot_hold_are_refused_naming_the_flag() {
    let past = "past 8796093022208 ms (about 278 years), beyond which simulated times lose sub-microsecond precision";
    fails_with(
        &synthetic(&["--arrival-interval-ms", "1e308"]),
        2,
        &format!(
            "--arrival-interval-ms is too large: 1e308 ms apart, 2 sessions' arrivals span about 1e308 ms, {past}"
        ),
    );
    fails_with(
        &synthetic(&["--request-rate", "1e-308"]),
        2,
        &format!(
            "--request-rate is too small: 1e-308 per second spreads 2 sessions' arrivals over about inf ms, {past}"
        ),
    );
    fails_with(
        &synthetic(&["--request-rate", "1", "--turns-per-session", "2", "--inter-turn-delay-ms", "1e308"]),
        2,
        &format!(
            "--inter-turn-delay-ms is too large: 1 think times of 1e308 ms after arrivals spanning 1.1e4 ms reach \
             about 1e308 ms, {past}"
        ),
    );
    fails_with(
        &synthetic(&["--request-rate", "1", "--arrival-speedup-ratio", "1e-310"]),
        2,
        &format!(
            "--arrival-speedup-ratio is too small: 1e-310 stretches the arrivals and think times to about inf ms, \
             {past}"
        ),
    );
    // A trace's timestamps are stretched by the ratio while the run goes.
    fails_with(
        &run(&["predict", &example(), "--arrival-speedup-ratio", "1e-310"]),
        2,
        "--arrival-speedup-ratio 1e-310: the run's clock would reach t=inf ms, past 8796093022208 ms (about 278 \
         years), beyond which simulated times lose sub-microsecond precision: arrival times or delays are too far \
         apart for this run (compress them with a larger arrival speedup ratio)",
    );
}

fn mean_ttft(extra: &[&str]) -> f64 {
    let out = synthetic(&[&["--format", "json"], extra].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    summary["mean_ttft_ms"].as_f64().unwrap()
}

// D16
#[test]
fn arrival_times_keep_sub_microsecond_precision_or_are_refused() {
    let near = mean_ttft(&["--arrival-interval-ms", "1000"]);
    let far = mean_ttft(&["--arrival-interval-ms", "8e12"]);
    assert!((near - far).abs() < 1e-3, "{near} vs {far}");
    let out = synthetic(&["--arrival-interval-ms", "1e13"]);
    assert_eq!(out.status.code(), Some(2));
    // Trace timestamps: the same limit.
    let d = dir("far-timestamp");
    let t = d.join("t.jsonl");
    std::fs::write(&t, format!("{}{}", row(0), row(9_000_000_000_000))).unwrap();
    fails_with(
        &run(&["predict", t.to_str().unwrap()]),
        2,
        &format!(
            "{}:2: `timestamp`: 9000000000000 is outside the supported range (±8.796093022208e12 ms); timestamps are \
             milliseconds",
            t.display()
        ),
    );
}

// N14
#[test]
fn a_telemetry_interval_below_a_millisecond_is_refused() {
    let d = dir("telemetry");
    let tel = d.join("tel.csv");
    let out = run(&["predict", &example(), "--telemetry", tel.to_str().unwrap(), "--telemetry-interval-ms", "1e-9"]);
    fails_with(
        &out,
        2,
        "--telemetry-interval-ms must be at least 1 (one sample per simulated millisecond), got 1e-9: finer samples \
         only repeat the state between forward passes, and fill the disk",
    );
    assert!(listing(&d).is_empty(), "{:?}", listing(&d));
    let out = run(&["predict", &example(), "--telemetry", tel.to_str().unwrap(), "--telemetry-interval-ms", "1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

// D9
#[test]
fn a_prompt_no_worker_can_hold_is_refused_before_it_is_generated() {
    let started = Instant::now();
    let out = run(&[
        "predict",
        "--input-tokens",
        "4294967295",
        "--output-tokens",
        "10",
        "--request-count",
        "1",
        "--request-rate",
        "1",
    ]);
    fails_with(
        &out,
        2,
        "--input-tokens 4294967295: a prompt needs 67108864 KV blocks of 64 tokens, more than the workers' cache holds \
         (16384 blocks, 1048576 tokens); no request could run (raise num_gpu_blocks in the engine arguments, or lower \
         --input-tokens)",
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    let out = run(&[
        "predict",
        "--input-tokens",
        "1000",
        "--output-tokens",
        "10",
        "--request-count",
        "1",
        "--request-rate",
        "1",
        "--num-prefill-workers",
        "1",
        "--decode-engine-args",
        r#"{"max_model_len": 1000}"#,
    ]);
    fails_with(
        &out,
        2,
        "--input-tokens 1000: a prompt must be shorter than the decode workers' max_model_len (1000); no request \
         could run",
    );
}

const OVERLOAD: [&str; 8] =
    ["--input-tokens", "1000", "--output-tokens", "100", "--request-count", "2000", "--request-rate", "10000"];

// D14
#[test]
fn a_runaway_open_loop_queue_stops_unless_max_queued_allows_it() {
    let mut args = vec!["predict"];
    args.extend(OVERLOAD);
    let out = run(&[&args[..], &["--queue-warning", "1"]].concat());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let last = err.lines().last().unwrap();
    assert!(last.starts_with("error: overloaded: at t="), "{err}");
    assert!(
        last.ends_with(
            " ms 100 requests waited for admission, far past the warning threshold (--queue-warning 1: 100 times it, \
             or what a quarter of the memory holds); the workers \
             cannot keep up with this load and memory grows with the queue, so the run stops (lower the rate or add \
             workers; to let the queue grow, give --max-queued N, with --max-queued-policy shed to drop arrivals past \
             it)"
        ),
        "{err}"
    );
    let out = run(&[&args[..], &["--queue-warning", "1", "--max-queued", "100000", "--format", "json"]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["completed_requests"], 2000);
}

// D17
#[test]
fn flag_messages_name_the_flag_and_the_value() {
    fails_with(&synthetic(&["--request-rate", "0"]), 2, "--request-rate must be a positive number, got 0");
    let ex = example();
    fails_with(
        &run(&["predict", &ex, "--extra-engine-args", "[1,2]"]),
        2,
        "--extra-engine-args [1,2]: neither inline JSON (a JSON object, {...}) nor a readable JSON file (a JSON array \
         is not a configuration object)",
    );
    fails_with(
        &run(&["predict", &ex, "--extra-engine-args", "not json"]),
        2,
        "--extra-engine-args not json: neither inline JSON (a JSON object, {...}) nor a readable JSON file (cannot \
         read: No such file or directory (os error 2))",
    );
    fails_with(
        &run(&["predict", &ex, "--num-workers", "-1"]),
        2,
        "--num-workers -1: must not be negative (it takes a whole number, 0 or more)",
    );
    fails_with(
        &synthetic(&["--request-rate", "1", "--turns-per-session", "-3"]),
        2,
        "--turns-per-session -3: must not be negative (it takes a whole number, 0 or more)",
    );
    // Signed values still reach their own checks.
    fails_with(&run(&["predict", &ex, "--kv-event-lag-ms", "-1"]), 2, "--kv-event-lag-ms must be a finite number ≥ 0");
}
