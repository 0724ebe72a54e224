//! `servesim predict` on every trace format and on trace inputs that used to go wrong: pipes,
//! compressed files, wide hash ids, odd encodings, rows that are not objects, and one bad input
//! per validation rule family (header, rows, graph, cross-shard, tools).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_servesim")
}

fn servesim(args: &[&str]) -> Output {
    Command::new(bin()).args(args).output().expect("run servesim")
}

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("servesim-traces-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write(name: &str, bytes: &[u8]) -> String {
    let p = dir().join(name);
    std::fs::write(&p, bytes).unwrap();
    p.to_str().unwrap().to_string()
}

fn summary(out: &Output) -> Value {
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("one JSON summary")
}

fn completed(args: &[&str]) -> u64 {
    summary(&servesim(args))["completed_requests"].as_u64().unwrap()
}

/// Fails with exit code 2 and a message containing every needle.
fn rejects(args: &[&str], needles: &[&str]) {
    let out = servesim(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?} should fail with exit 2; stderr: {err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: stderr lacks {n:?}:\n{err}");
    }
}

const THREE: &str = r#"{"timestamp": 0, "input_length": 300, "output_length": 4, "hash_ids": [1]}
{"timestamp": 10, "input_length": 300, "output_length": 4, "hash_ids": [2]}
{"timestamp": 20, "input_length": 300, "output_length": 4, "hash_ids": [3]}
"#;

#[test]
fn a_trace_from_a_pipe_is_replayed_whole() {
    let mut child = Command::new(bin())
        .args(["predict", "/dev/stdin", "--format", "json"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(THREE.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(summary(&out)["completed_requests"], 3);
}

#[test]
fn gzip_and_zstd_traces_are_read_directly() {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(THREE.as_bytes()).unwrap();
    let gz = write("t.jsonl.gz", &gz.finish().unwrap());
    assert_eq!(completed(&["predict", &gz, "--format", "json"]), 3);
    let zst = write("t.jsonl.zst", &zstd::encode_all(THREE.as_bytes(), 3).unwrap());
    assert_eq!(completed(&["predict", &zst, "--format", "json"]), 3);
    // A gzip file without a telling name is recognised by its bytes.
    let odd = write("gzip-named.jsonl", &std::fs::read(&gz).unwrap());
    assert_eq!(completed(&["predict", &odd, "--format", "json"]), 3);
}

#[test]
fn hash_ids_beyond_32_bits_never_alias() {
    // 2^32 + 1 and 1 are different blocks: the second request must not hit the first's cache.
    let t = write(
        "wide.jsonl",
        br#"{"timestamp": 0, "input_length": 512, "output_length": 2, "hash_ids": [1]}
{"timestamp": 1000, "input_length": 512, "output_length": 2, "hash_ids": [4294967297]}
"#,
    );
    let s = summary(&servesim(&["predict", &t, "--format", "json"]));
    assert_eq!(s["prefix_cache_reused_ratio"], 0.0, "{s}");
    // The same id twice does hit.
    let same = write(
        "same.jsonl",
        br#"{"timestamp": 0, "input_length": 512, "output_length": 2, "hash_ids": [4294967297]}
{"timestamp": 1000, "input_length": 512, "output_length": 2, "hash_ids": [4294967297]}
"#,
    );
    let s = summary(&servesim(&["predict", &same, "--format", "json"]));
    assert!(s["prefix_cache_reused_ratio"].as_f64().unwrap() > 0.4, "{s}");
}

#[test]
fn numeric_and_string_session_ids_stay_apart() {
    let t = write(
        "sessions.jsonl",
        br#"{"session_id": 1, "timestamp": 0, "input_length": 100, "output_length": 2, "hash_ids": [1]}
{"session_id": "1", "timestamp": 0, "input_length": 100, "output_length": 2, "hash_ids": [2]}
"#,
    );
    let records = dir().join("sessions-records.jsonl");
    let out = servesim(&["predict", &t, "--format", "json", "--report-jsonl", records.to_str().unwrap()]);
    summary(&out);
    let turns: Vec<u64> = std::fs::read_to_string(&records)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["turn_index"].as_u64().unwrap())
        .collect();
    assert_eq!(turns, [0, 0], "two sessions of one turn each, not one session of two turns");
}

#[test]
fn rows_and_files_that_are_not_json_lines_are_named() {
    let t =
        write("array-row.jsonl", b"{\"timestamp\": 0, \"output_length\": 1, \"hash_ids\": [1]}\n[0, 300, 4, [1]]\n");
    rejects(&["predict", &t], &["array-row.jsonl:2", "JSON array"]);
    let t = write("array-file.json", b"[\n {\"timestamp\": 0, \"output_length\": 1, \"hash_ids\": [1]}\n]\n");
    rejects(&["predict", &t], &["array-file.json:1", "JSON array", "jq -c"]);
    let utf16: Vec<u8> = THREE.encode_utf16().flat_map(|u| u.to_le_bytes()).collect();
    let t = write("utf16.jsonl", &[&[0xFF, 0xFE][..], &utf16].concat());
    rejects(&["predict", &t], &["UTF-16"]);
    // A UTF-8 byte-order mark is skipped.
    let t = write("bom.jsonl", format!("\u{feff}{THREE}").as_bytes());
    assert_eq!(completed(&["predict", &t, "--format", "json"]), 3);
}

#[test]
fn timestamps_outside_a_sane_range_are_rejected() {
    let t = write(
        "far.jsonl",
        br#"{"timestamp": 0, "input_length": 100, "output_length": 2, "hash_ids": [1]}
{"timestamp": 1e300, "input_length": 100, "output_length": 2, "hash_ids": [1]}
"#,
    );
    rejects(&["predict", &t], &["far.jsonl:2", "timestamp", "outside the supported range"]);
}

fn examples() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/reference/trace-examples");
    assert!(p.exists(), "{} is missing: these tests need ../shared beside the checkout", p.display());
    p
}

fn example(rel: &str) -> String {
    examples().join(rel).to_str().unwrap().to_string()
}

#[test]
fn every_example_trace_replays() {
    let cases: &[(&[&str], &[&str], u64)] = &[
        (&["mooncake/mooncake_basic.jsonl"], &[], 3),
        (&["mooncake/mooncake_sessions.jsonl"], &["--trace-block-size", "128"], 4),
        (
            &["mooncake_delta/mooncake_delta.jsonl"],
            &["--trace-format", "mooncake_delta", "--trace-block-size", "64"],
            3,
        ),
        (&["agentic_mooncake/agentic_v2.jsonl"], &["--trace-format", "agentic-mooncake", "--execution-model", "t"], 4),
        (
            &["agentic_mooncake/agentic_v2.jsonl"],
            &["--trace-format", "agentic_mooncake", "--execution-model", "t", "--agentic-lanes", "1"],
            4,
        ),
        (&["dynamo_standard/shard-000.jsonl", "dynamo_standard/shard-001.jsonl.gz"], &["--trace-format", "dynamo"], 3),
        (&["dynamo_agentic/agentic.jsonl"], &["--trace-format", "dynamo", "--execution-model", "t"], 4),
        (&["weka/trace.json"], &["--trace-format", "weka", "--execution-model", "t"], 5),
        (
            &["applied_compute_agentic/applied.jsonl"],
            &["--trace-format", "applied_compute_agentic", "--replay-concurrency", "2", "--trace-block-size", "64"],
            5,
        ),
    ];
    for (files, flags, want) in cases {
        let mut args = vec!["predict".to_string(), "--format".into(), "json".into()];
        args.extend(files.iter().map(|f| example(f)));
        args.extend(flags.iter().map(|s| s.to_string()));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_eq!(completed(&refs), *want, "{files:?} {flags:?}");
    }
}

#[test]
fn agentic_reports_carry_the_reference_keys() {
    let records = dir().join("agentic-records.jsonl");
    let out = servesim(&[
        "predict",
        &example("agentic_mooncake/agentic_v2.jsonl"),
        "--trace-format",
        "agentic_mooncake",
        "--execution-model",
        " target-model ",
        "--agentic-lanes",
        "1",
        "--format",
        "json",
        "--report-jsonl",
        records.to_str().unwrap(),
    ]);
    let s = summary(&out);
    assert_eq!(s["total_trajectories"], 2);
    assert_eq!(s["completed_trajectories"], 2);
    assert_eq!(s["agentic_graph"]["node_count"], 4);
    assert_eq!(s["agentic_graph"]["source_models"], serde_json::json!(["src-model"]));
    assert_eq!(s["agentic_model_projection"]["target_model"], "target-model");
    assert_eq!(s["agentic_play_outcomes"][0]["play_id"], "p1");
    let rec: Vec<Value> =
        std::fs::read_to_string(&records).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let order: Vec<&str> = rec.iter().map(|r| r["request_id"].as_str().unwrap()).collect();
    assert_eq!(order, ["child", "join", "other-root", "root"], "records in request_id order, as the reference's");
    let child = &rec[0];
    let keys: Vec<&str> = child.as_object().unwrap().keys().map(String::as_str).take(7).collect();
    assert_eq!(keys, ["request_id", "play_id", "session_id", "turn_index", "agentic", "uuid", "arrival_time_ms"]);
    assert_eq!(child["agentic"]["lane_id"], "lane:0");
    assert_eq!(child["agentic"]["parent_id"], "root");
    assert_eq!(child["uuid"], "00000000-0000-0000-0000-000000000001");
    assert_eq!(child["arrival_time_ms"], 5.0);
    assert!(child["routing_history"].as_array().is_some_and(|h| h.len() == 1));
    assert!(child["admission_history"].as_array().is_some_and(|h| h.len() == 1));
}

const HEADER: &str = r#"{"schema":"dynamo.agentic_mooncake","version":2,"block_size":16,"hash_id_scope":"local","source":{"format":"f","digest":"d"}}"#;

fn v2(name: &str, header: &str, rows: &[&str]) -> String {
    let mut text = format!("{header}\n");
    for r in rows {
        text.push_str(r);
        text.push('\n');
    }
    write(name, text.as_bytes())
}

fn row(id: &str, play: &str, deps: &str) -> String {
    format!(
        r#"{{"request_id":"{id}","play_id":"{play}","session_id":"s","model":"m","input_length":16,"output_length":1,"hash_ids":[1],"not_before_ms":0,"dependencies":[{deps}]}}"#
    )
}

fn agentic(path: &str) -> Vec<String> {
    ["predict", path, "--trace-format", "agentic_mooncake", "--execution-model", "t"].map(String::from).to_vec()
}

fn rejects_agentic(path: &str, needles: &[&str]) {
    let args = agentic(path);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    rejects(&refs, needles);
}

#[test]
fn agentic_header_errors() {
    let ok_row = row("a", "p", "");
    let p = v2("h1.jsonl", &HEADER.replace("dynamo.agentic_mooncake", "nope"), &[&ok_row]);
    rejects_agentic(&p, &["h1.jsonl:1", "unsupported agentic Mooncake schema \"nope\""]);
    let p = v2("h2.jsonl", &HEADER.replace("\"version\":2", "\"version\":1"), &[&ok_row]);
    rejects_agentic(&p, &["unsupported agentic Mooncake version 1; expected 2"]);
    let p = v2("h3.jsonl", &HEADER.replace("\"block_size\":16", "\"block_size\":0"), &[&ok_row]);
    rejects_agentic(&p, &["block_size must be greater than 0"]);
    let p = v2("h4.jsonl", &HEADER.replace("\"digest\":\"d\"", "\"digest\":\"\""), &[&ok_row]);
    rejects_agentic(&p, &["source provenance requires nonempty format and digest"]);
    // Legacy headerless rows are refused, as Dynamo 1.6.1 refuses them.
    let p = write("h5.jsonl", format!("{ok_row}\n").as_bytes());
    rejects_agentic(&p, &["h5.jsonl:1", "as the agentic Mooncake v2 header"]);
    // No execution model.
    let p = v2("h6.jsonl", HEADER, &[&ok_row]);
    rejects(&["predict", &p, "--trace-format", "agentic_mooncake"], &["requires a configured target model"]);
    rejects(
        &["predict", &p, "--trace-format", "agentic_mooncake", "--execution-model", "t", "--replay-concurrency", "2"],
        &["agentic_mooncake trace format is not supported with replay_concurrency"],
    );
    rejects(
        &["predict", &p, "--trace-format", "agentic_mooncake", "--execution-model", "t", "--agentic-lanes", "0"],
        &["agentic_lanes must be at least 1"],
    );
}

#[test]
fn agentic_row_errors() {
    let p = v2("r1.jsonl", HEADER, &[&row("", "p", "")]);
    rejects_agentic(&p, &["r1.jsonl:2", "has empty request_id"]);
    let p = v2("r2.jsonl", HEADER, &[&row("a", "p", ""), &row("a", "p", "")]);
    rejects_agentic(&p, &["r2.jsonl:3", "duplicates request_id a"]);
    let p = v2("r3.jsonl", HEADER, &[&row("a", "p", "").replace("[1]", "[1,2]")]);
    rejects_agentic(&p, &["requires exactly 1 hash_ids, got 2"]);
    let p = v2(
        "r4.jsonl",
        HEADER,
        &[
            &row("a", "p", ""),
            &row("b", "p", r#"{"request_id":"a","trigger":"completion","delay_ms":-40,"relation":"sequence"}"#),
        ],
    );
    rejects_agentic(&p, &["r4.jsonl:3", "invalid dependency delay -40"]);
    let p = v2(
        "r5.jsonl",
        HEADER,
        &[
            &row("a", "p", ""),
            &row("b", "p", r#"{"request_id":"a","trigger":"dispatch","delay_ms":0,"relation":"sequence"}"#),
        ],
    );
    rejects_agentic(&p, &["invalid Sequence dependency with Dispatch trigger"]);
    let p = v2("r6.jsonl", HEADER, &[&row("a", "p", "").replace("\"not_before_ms\":0", "\"not_before_ms\":-1")]);
    rejects_agentic(&p, &["invalid not_before_ms -1"]);
}

#[test]
fn agentic_graph_errors() {
    let dep =
        |on: &str| format!(r#"{{"request_id":"{on}","trigger":"completion","delay_ms":0,"relation":"sequence"}}"#);
    let p = v2("g1.jsonl", HEADER, &[&row("a", "p", ""), &row("b", "p", &dep("zz"))]);
    rejects_agentic(&p, &["request b references unknown request_id zz"]);
    let p = v2("g2.jsonl", HEADER, &[&row("a", "p", ""), &row("b", "p", &dep("b"))]);
    rejects_agentic(&p, &["request b cannot depend on itself"]);
    let p = v2("g3.jsonl", HEADER, &[&row("a", "p", ""), &row("b", "q", &dep("a"))]);
    rejects_agentic(&p, &["request b in play q depends on request a in play p"]);
    let p = v2("g4.jsonl", HEADER, &[&row("a", "p", &dep("b")), &row("b", "p", &dep("a"))]);
    rejects_agentic(&p, &["cycle detected among 2 agentic requests; blocked request IDs: a, b"]);
}

fn dynamo_request(id: &str, start: u64, session: Option<&str>, block: u64) -> String {
    let ctx = session.map(|s| format!(r#","agent_context":{{"session_id":"{s}"}}"#)).unwrap_or_default();
    format!(
        r#"{{"schema":"dynamo.request.trace.v1","event_type":"request_end","event_time_unix_ms":{},"request":{{"request_id":"{id}","output_tokens":2,"request_received_ms":{start},"total_time_ms":10,"replay":{{"trace_block_size":{block},"input_length":16,"input_sequence_hashes":[1]}}}}{ctx}}}"#,
        start + 10
    )
}

#[test]
fn dynamo_cross_shard_errors() {
    let a = write("d-a.jsonl", format!("{}\n", dynamo_request("r1", 0, None, 16)).as_bytes());
    let b = write("d-b.jsonl", format!("{}\n", dynamo_request("r1", 5, None, 16)).as_bytes());
    rejects(&["predict", &a, &b, "--trace-format", "dynamo"], &["d-b.jsonl:1", "duplicate request_id \"r1\""]);
    let c = write("d-c.jsonl", format!("{}\n", dynamo_request("r2", 5, None, 32)).as_bytes());
    rejects(
        &["predict", &a, &c, "--trace-format", "dynamo"],
        &["mixed replay trace_block_size values are not supported"],
    );
    rejects(
        &["predict", &a, "--trace-format", "dynamo", "--trace-block-size", "64"],
        &["trace_block_size 64 does not match embedded Dynamo request trace block size 16"],
    );
    let d = write("d-d.jsonl", format!("{}\n", dynamo_request("r3", 5, Some("s"), 16)).as_bytes());
    rejects(
        &["predict", &a, &d, "--trace-format", "dynamo", "--execution-model", "t"],
        &["cannot mix requests with and without agent_context"],
    );
    let e = write(
        "d-e.jsonl",
        b"{\"schema\":\"dynamo.request.trace.v1\",\"event_type\":\"request_start\",\"event_time_unix_ms\":1}\n",
    );
    rejects(&["predict", &e, "--trace-format", "dynamo"], &["d-e.jsonl:1", "request trace supports request_end"]);
    rejects(&["predict", &d, "--trace-format", "dynamo"], &["requires a configured target model"]);
    rejects(
        &["predict", &a, "--trace-format", "dynamo", "--agentic-lanes", "1"],
        &["requires an agentic Dynamo request trace"],
    );
}

#[test]
fn dynamo_tool_errors() {
    let tool = |mode: &str, source: &str| {
        format!(
            r#"{{"schema":"dynamo.request.trace.v1","event_type":"tool_end","event_time_unix_ms":50,"agent_context":{{"session_id":"s"}},"tool":{{"tool_call_id":"t","tool_class":"agent","started_at_unix_ms":20,"ended_at_unix_ms":50,"claude":{{"source_request_id":"{source}","execution_mode":"{mode}"}}}}}}"#
        )
    };
    let base = dynamo_request("r1", 0, Some("s"), 16);
    let p = write("t1.jsonl", format!("{base}\n{}\n", tool("detached", "r1")).as_bytes());
    rejects(
        &["predict", &p, "--trace-format", "dynamo", "--execution-model", "t"],
        &["t1.jsonl:2", "tool \"t\" (agent) has unsupported execution_mode \"detached\""],
    );
    let p = write("t2.jsonl", format!("{base}\n{}\n", tool("blocking", "zz")).as_bytes());
    rejects(
        &["predict", &p, "--trace-format", "dynamo", "--execution-model", "t"],
        &["tool \"t\" references unknown request_id \"zz\""],
    );
    let bad_time = tool("blocking", "r1").replace("\"ended_at_unix_ms\":50", "\"ended_at_unix_ms\":10");
    let p = write("t3.jsonl", format!("{base}\n{bad_time}\n").as_bytes());
    rejects(
        &["predict", &p, "--trace-format", "dynamo", "--execution-model", "t"],
        &["tool end time precedes start time"],
    );
}

#[test]
fn weka_and_other_format_errors() {
    let t = write(
        "w.json",
        br#"{"id": "x", "block_size": 4, "hash_id_scope": "global", "requests": [{"t": 0, "type": "n", "model": "m", "in": 4, "out": 1, "hash_ids": [1]}]}"#,
    );
    rejects(
        &["predict", &t, "--trace-format", "weka", "--execution-model", "t"],
        &["unsupported hash_id_scope \"global\""],
    );
    let t = write(
        "w2.json",
        br#"{"id": "x", "block_size": 4, "hash_id_scope": "local", "requests": [{"t": 0, "type": "n", "model": "m", "in": 4, "out": 1, "hash_ids": [1]}]}"#,
    );
    rejects(
        &["predict", &t, "--trace-format", "weka", "--execution-model", "t", "--trace-block-size", "8"],
        &["Weka source block size 4 does not match configured block size 8"],
    );
    assert_eq!(completed(&["predict", &t, "--trace-format", "weka", "--execution-model", "t", "--format", "json"]), 1);
    let a = write(
        "applied.jsonl",
        br#"{"num_turns":2,"input_prompt_length":600,"assistant_response_length":[8],"tool_call_output_length":[100,50],"tool_call_latency":[0.05,0.02],"final_assistant_response_length":4}"#,
    );
    rejects(&["predict", &a, "--trace-format", "applied_compute_agentic"], &["requires replay_concurrency"]);
    rejects(
        &["predict", &a, "--trace-format", "applied_compute_agentic", "--replay-concurrency", "1"],
        &["applied.jsonl:1", "field assistant_response_length length 1 does not match num_turns 2"],
    );
    rejects(
        &["predict", &a, &a, "--trace-format", "weka", "--execution-model", "t"],
        &["requires exactly one trace file, got 2"],
    );
    rejects(&["predict", &a, "--trace-format", "nope"], &["unknown trace format"]);
}
