//! Routing and disaggregation behaviour through the replay API.

use std::path::PathBuf;

use servesim_engine::WorkerArgs;
use servesim_replay::{simulate, Collector, RequestRecord, RouterMode, SimConfig, Sla, Topology};
use servesim_router::RouterConfig;
use servesim_workload::{load_mooncake, LoadMode};

const FIXED: &str = r#""timing_model": {"type": "fixed", "prefill_ms": 40.0, "decode_ms": 10.0}"#;

fn trace(name: &str, rows: &[&str]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("servesim-routing-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, rows.join("\n")).unwrap();
    p
}

fn run(path: &PathBuf, topology: Topology, router: RouterMode) -> Vec<RequestRecord> {
    let workload = load_mooncake(&[path], 16).unwrap();
    let load = LoadMode::Timestamps { speedup: 1.0 };
    let config = SimConfig { router_seed: 1, seed: 1, ..SimConfig::new(topology, router, load) };
    let mut records = Vec::new();
    let mut sink = |r: &RequestRecord| records.push(r.clone());
    simulate(&workload, &config, Collector::new(Sla::default(), Some(&mut sink)), &mut ()).unwrap();
    records.sort_by_key(|r| r.ordinal);
    records
}

fn engine(extra: &str) -> WorkerArgs {
    WorkerArgs::parse_json(&format!(r#"{{"block_size": 16, "num_gpu_blocks": 1000, {FIXED}{extra}}}"#)).unwrap()
}

fn aggregated(engine: WorkerArgs, workers: u32) -> Topology {
    Topology::aggregated(engine, workers).unwrap()
}

#[test]
fn router_queue_releases_by_priority() {
    // One worker, queueing as soon as anything is pending: B and C wait for A's prefill, and C,
    // with priority 5 (five seconds' head start), is released first.
    let path = trace(
        "prio.jsonl",
        &[
            r#"{"timestamp": 0, "input_length": 160, "output_length": 2, "hash_ids": [1,2,3,4,5,6,7,8,9,10]}"#,
            r#"{"timestamp": 1, "input_length": 16, "output_length": 2, "hash_ids": [20]}"#,
            r#"{"timestamp": 2, "input_length": 16, "output_length": 2, "hash_ids": [30], "priority": 5}"#,
        ],
    );
    let cluster = aggregated(engine(r#", "max_num_seqs": 1"#), 1);
    let router = RouterMode::KvRouter(RouterConfig { queue_threshold: Some(0.0), ..RouterConfig::default() });
    let r = run(&path, cluster, router);
    assert!(r[1].queue_wait_ms > 0.0 && r[2].queue_wait_ms > 0.0);
    assert!(r[2].first_admit_ms < r[1].first_admit_ms, "{:?} vs {:?}", r[2].first_admit_ms, r[1].first_admit_ms);
}

#[test]
fn kv_router_follows_the_cached_prefix() {
    // Two workers; the second turn of a conversation goes where the first turn's blocks are.
    let path = trace(
        "prefix.jsonl",
        &[
            r#"{"session_id": "a", "timestamp": 0, "input_length": 64, "output_length": 2, "hash_ids": [1,2,3,4]}"#,
            r#"{"timestamp": 1, "input_length": 16, "output_length": 2, "hash_ids": [50]}"#,
            r#"{"session_id": "a", "delay": 100, "input_length": 96, "output_length": 2, "hash_ids": [1,2,3,4,5,6]}"#,
        ],
    );
    let cluster = aggregated(engine(""), 2);
    let r = run(&path, cluster.clone(), RouterMode::KvRouter(RouterConfig::default()));
    assert_eq!(r[2].decode_worker, r[0].decode_worker);
    assert_eq!(r[2].route_overlap_tokens, Some(64));
    assert_eq!(r[2].reused_input_tokens, 64);
    // Round robin alternates: without the request in between, the second turn lands on the
    // other worker and reuses nothing.
    let path = trace(
        "prefix-rr.jsonl",
        &[
            r#"{"session_id": "a", "timestamp": 0, "input_length": 64, "output_length": 2, "hash_ids": [1,2,3,4]}"#,
            r#"{"session_id": "a", "delay": 100, "input_length": 96, "output_length": 2, "hash_ids": [1,2,3,4,5,6]}"#,
        ],
    );
    let rr = run(&path, cluster.clone(), RouterMode::RoundRobin);
    assert_ne!(rr[1].decode_worker, rr[0].decode_worker);
    assert_eq!(rr[1].reused_input_tokens, 0);
    let kv = run(&path, cluster, RouterMode::KvRouter(RouterConfig::default()));
    assert_eq!((kv[1].decode_worker, kv[1].reused_input_tokens), (kv[0].decode_worker, 64));
}

#[test]
fn disaggregated_handoff_timeline() {
    // 100-token prompt, 1 GB/s at 1e5 bytes per token: a 10 ms transfer after a 40 ms prefill;
    // the decode worker then produces all three visible tokens, 10 ms apart.
    let path = trace(
        "pd.jsonl",
        &[r#"{"timestamp": 0, "input_length": 100, "output_length": 3, "hash_ids": [1,2,3,4,5,6,7]}"#],
    );
    let cluster = Topology::disaggregated(
        (engine(r#", "kv_transfer_bandwidth": 1.0, "kv_bytes_per_token": 100000"#), 1),
        (engine(""), 1),
    )
    .unwrap();
    let r = &run(&path, cluster, RouterMode::RoundRobin)[0];
    let h = r.handoff.as_ref().unwrap();
    assert_eq!((h.source_held_ms, h.destination_reserved_ms), (Some(40.0), Some(40.0)));
    assert_eq!(
        (h.destination_activated_ms, h.decode_admit_ms, h.source_released_ms),
        (Some(50.0), Some(50.0), Some(50.0))
    );
    assert_eq!((r.first_token_ms, r.last_token_ms, r.output_length), (Some(60.0), Some(80.0), 3));
    assert_eq!((r.prefill_worker, r.decode_worker), (Some(0), Some(0)));
}

#[test]
fn data_parallel_ranks_share_the_pass_barrier() {
    // One worker with two ranks: the short prompt lands on rank 1 but its first token waits for
    // the slower rank 0 pass, as every token of a grouped pass is stamped at its end.
    let path = trace(
        "dp.jsonl",
        &[
            r#"{"timestamp": 0, "input_length": 1000, "output_length": 2, "hash_ids": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33,34,35,36,37,38,39,40,41,42,43,44,45,46,47,48,49,50,51,52,53,54,55,56,57,58,59,60,61,62,63]}"#,
            r#"{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [99]}"#,
        ],
    );
    let engine =
        WorkerArgs::parse_json(r#"{"engine": {"block_size": 16, "num_gpu_blocks": 1000}, "dp_size": 2}"#).unwrap();
    let r = run(&path, aggregated(engine, 1), RouterMode::RoundRobin);
    assert_eq!((r[0].dp_rank, r[1].dp_rank), (0, 1));
    assert_eq!(r[0].first_token_ms, r[1].first_token_ms);
    // prefill(1000 tokens) = 32.1059 ms; the 10-token prompt alone would take 16.66 ms.
    assert!((r[1].first_token_ms.unwrap() - 32.1059).abs() < 1e-3, "{:?}", r[1].first_token_ms);
}

#[test]
fn round_robin_cycles_workers_before_ranks() {
    let rows: Vec<String> = (0..6)
        .map(|i| format!(r#"{{"timestamp": {i}, "input_length": 16, "output_length": 1, "hash_ids": [{i}]}}"#))
        .collect();
    let rows: Vec<&str> = rows.iter().map(String::as_str).collect();
    let path = trace("rr-dp.jsonl", &rows);
    let engine =
        WorkerArgs::parse_json(r#"{"engine": {"block_size": 16, "num_gpu_blocks": 1000}, "dp_size": 2}"#).unwrap();
    let r = run(&path, aggregated(engine, 3), RouterMode::RoundRobin);
    let placed: Vec<(u32, u32)> = r.iter().map(|r| (r.decode_worker.unwrap(), r.dp_rank)).collect();
    assert_eq!(placed, vec![(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]);
}
