//! Property-based fuzzing of the input readers: every trace format (Weka as `.json` and
//! `.jsonl`; plain, gzip, zstd and cut-short compressed files; several Mooncake files or Dynamo
//! shards), and the engine and router configuration readers. Whatever the bytes, a reader
//! returns a value or a one-line error naming the file (and a line inside the input when it
//! gives one) with no control characters; it never panics. Unknown configuration keys are
//! always rejected by name.
//!
//! The ordinary test run uses a few cases per target; `scripts/fuzz.sh` runs many
//! (`PROPTEST_CASES`).

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use serde_json::{Map, Value};
use servesim_engine::WorkerArgs;
use servesim_router::RouterConfig;
use servesim_workload::{load_trace, InputError, TraceFormat, TraceOptions};

/// Cases per target: `PROPTEST_CASES`, else a small number that keeps `cargo test` quick.
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64);
    ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() }
}

static SERIAL: AtomicU64 = AtomicU64::new(0);

/// Writes `bytes` to a fresh file with `name`'s extension.
fn file(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("servesim-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{}-{name}", SERIAL.fetch_add(1, Ordering::Relaxed)));
    std::fs::File::create(&path).unwrap().write_all(bytes).unwrap();
    path
}

/// Every reader: a format and the file name it reads (Weka reads `.json` as one object and
/// `.jsonl` as objects gathered line by line).
const FORMATS: [(&str, &str); 7] = [
    ("mooncake", "t.jsonl"),
    ("mooncake-delta", "t.jsonl"),
    ("applied_compute_agentic", "t.jsonl"),
    ("agentic_mooncake", "t.jsonl"),
    ("dynamo", "t.jsonl"),
    ("weka", "t.json"),
    ("weka", "t.jsonl"),
];

/// How a generated text is stored: as it is, or compressed (whole or cut short).
#[derive(Clone, Copy, Debug)]
enum Packing {
    Plain,
    Gzip,
    Zstd,
    /// Compressed, then cut after this fraction of its bytes.
    TruncatedGzip(f64),
    TruncatedZstd(f64),
}

fn packing() -> impl Strategy<Value = Packing> {
    prop_oneof![
        Just(Packing::Plain),
        Just(Packing::Gzip),
        Just(Packing::Zstd),
        (0.0..1.0f64).prop_map(Packing::TruncatedGzip),
        (0.0..1.0f64).prop_map(Packing::TruncatedZstd),
    ]
}

fn pack(bytes: &[u8], packing: Packing) -> Vec<u8> {
    let gzip = || {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(bytes).unwrap();
        enc.finish().unwrap()
    };
    let zstd = || zstd::encode_all(bytes, 1).unwrap();
    let cut = |v: Vec<u8>, f: f64| v[..(v.len() as f64 * f) as usize].to_vec();
    match packing {
        Packing::Plain => bytes.to_vec(),
        Packing::Gzip => gzip(),
        Packing::Zstd => zstd(),
        Packing::TruncatedGzip(f) => cut(gzip(), f),
        Packing::TruncatedZstd(f) => cut(zstd(), f),
    }
}

/// Counts per outcome, printed by the fuzz script (`--nocapture`).
static PARSED: AtomicU64 = AtomicU64::new(0);
static REJECTED: AtomicU64 = AtomicU64::new(0);
static CONFIGS: AtomicU64 = AtomicU64::new(0);

/// Reads `bytes` as a trace of every format and checks the outcome.
fn read_everywhere(bytes: &[u8]) {
    read_packed(bytes, Packing::Plain);
}

/// Reads `bytes`, stored as `packing` says, as a trace of every format and checks the outcome.
fn read_packed(bytes: &[u8], packing: Packing) {
    let lines = bytes.split(|&b| b == b'\n').count();
    let stored = pack(bytes, packing);
    for (format, name) in FORMATS {
        let path = file(name, &stored);
        load_and_check(format, std::slice::from_ref(&path), lines);
        let _ = std::fs::remove_file(&path);
    }
}

fn load_and_check(format: &str, paths: &[PathBuf], lines: usize) {
    let mut options = TraceOptions::new(TraceFormat::parse(format).unwrap());
    options.execution_model = Some("model".into());
    if format == "applied_compute_agentic" {
        options.replay_concurrency = Some(2);
    }
    match load_trace(paths, &options) {
        Ok(_) => {
            PARSED.fetch_add(1, Ordering::Relaxed);
        }
        Err(e) => {
            REJECTED.fetch_add(1, Ordering::Relaxed);
            check_error(&e, paths, lines);
        }
    }
}

fn check_error(e: &InputError, paths: &[PathBuf], lines: usize) {
    let text = e.to_string();
    assert!(!e.message.is_empty(), "an empty message: {e:?}");
    assert!(!text.contains('\n'), "one line: {text}");
    // Input bytes echoed in a message never reach the terminal as control characters.
    assert!(!text.chars().any(char::is_control), "control characters: {text:?}");
    assert!(paths.iter().any(|p| text.contains(&*p.to_string_lossy())), "names the file: {text}");
    if let Some(line) = e.line {
        assert!((1..=lines.max(1)).contains(&line), "line {line} of {lines}: {text}");
    }
}

/// JSON values of any shape, small.
fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        prop_oneof![Just(0i64), Just(1), Just(-1), Just(64), Just(512), Just(1 << 32)].prop_map(Value::from),
        "[a-z0-9_:-]{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(key(), inner, 0..6).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Keys the readers know (trace rows, agentic records, engine and router settings), and others.
fn key() -> impl Strategy<Value = String> {
    let known = [
        "timestamp",
        "input_length",
        "output_length",
        "hash_ids",
        "session_id",
        "delay",
        "priority",
        "strict_priority",
        "policy_class",
        "output_token_ids",
        "type",
        "version",
        "request_id",
        "play_id",
        "dependencies",
        "trigger",
        "kind",
        "parents",
        "turns",
        "tool_latency_ms",
        "isl",
        "osl",
        "block_size",
        "agent_context",
        "conversation_id",
        "requests",
        "num_gpu_blocks",
        "max_num_seqs",
        "engine",
        "dp_size",
        "speedup_ratio",
        "timing_model",
        "reasoning",
        "sglang",
        "aic_nextn",
        "overlap_score_credit",
        "router_temperature",
        "router_queue_threshold",
        "prefill_load_scale",
    ];
    prop_oneof![prop::sample::select(known.to_vec()).prop_map(str::to_string), "[a-z_]{1,10}"]
}

/// A JSON-lines text whose rows are mostly objects with trace keys.
fn rows() -> impl Strategy<Value = Vec<u8>> {
    let row = prop_oneof![
        4 => prop::collection::btree_map(key(), json(), 0..8)
            .prop_map(|m| serde_json::to_vec(&Value::Object(m.into_iter().collect::<Map<_, _>>())).unwrap()),
        1 => json().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        1 => prop::collection::vec(any::<u8>(), 0..40),
    ];
    prop::collection::vec(row, 0..8).prop_map(|rows| rows.join(&b"\n"[..]))
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn trace_readers_survive_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        read_everywhere(&bytes);
    }

    #[test]
    fn trace_readers_survive_arbitrary_rows(bytes in rows()) {
        read_everywhere(&bytes);
    }

    #[test]
    fn trace_readers_survive_compressed_and_truncated_rows(bytes in rows(), packing in packing()) {
        read_packed(&bytes, packing);
    }

    #[test]
    fn multi_file_readers_survive_several_files(a in rows(), b in rows(), packing in packing()) {
        let lines = a.split(|&x| x == b'\n').count().max(b.split(|&x| x == b'\n').count());
        let paths = [file("shard-0.jsonl", &pack(&a, packing)), file("shard-1.jsonl", &b)];
        for format in ["mooncake", "dynamo"] {
            load_and_check(format, &paths, lines);
        }
        for p in paths {
            let _ = std::fs::remove_file(p);
        }
    }

    #[test]
    fn engine_config_reader_never_panics(doc in prop::collection::btree_map(key(), json(), 0..8)) {
        let text = serde_json::to_string(&doc).unwrap();
        let _ = WorkerArgs::parse_json(&text);
        let nested = serde_json::json!({ "engine": doc }).to_string();
        let _ = WorkerArgs::parse_json(&nested);
        CONFIGS.fetch_add(2, Ordering::Relaxed);
    }

    #[test]
    fn router_config_reader_never_panics(doc in prop::collection::btree_map(key(), json(), 0..8)) {
        let _ = RouterConfig::parse_json(&serde_json::to_string(&doc).unwrap());
        CONFIGS.fetch_add(1, Ordering::Relaxed);
    }

    #[test]
    fn config_readers_survive_arbitrary_text(text in "\\PC{0,80}") {
        let _ = WorkerArgs::parse_json(&text);
        let _ = RouterConfig::parse_json(&text);
        CONFIGS.fetch_add(2, Ordering::Relaxed);
    }

    #[test]
    fn unknown_config_keys_are_rejected_by_name(unknown in "zz_[a-z]{1,8}", value in json()) {
        let doc = Value::Object([(unknown.clone(), value)].into_iter().collect());
        let text = doc.to_string();
        let e = WorkerArgs::parse_json(&text).expect_err("unknown engine key accepted");
        prop_assert!(e.path.contains(&unknown) || e.message.contains(&unknown), "{e}");
        let e = RouterConfig::parse_json(&text).expect_err("unknown router key accepted");
        prop_assert!(e.path.contains(&unknown) || e.message.contains(&unknown), "{e}");
        CONFIGS.fetch_add(2, Ordering::Relaxed);
    }
}

/// Prints how many inputs were read and how they ended (with `--test-threads 1 --nocapture`
/// it runs last, after every target).
#[test]
fn zz_counts() {
    eprintln!(
        "fuzz counts: trace files read {} (parsed {}, rejected with a located error {}); config documents read {}",
        PARSED.load(Ordering::Relaxed) + REJECTED.load(Ordering::Relaxed),
        PARSED.load(Ordering::Relaxed),
        REJECTED.load(Ordering::Relaxed),
        CONFIGS.load(Ordering::Relaxed)
    );
}
