//! One scenario through both drivers: the replay on its virtual clock and the live server on
//! the wall clock must tell each request's handoff the same facts and carry out the same steps
//! (as Dynamo's live/offline conformance tests compare normalised handoff actions).
//!
//! Each driver builds its handoffs from the topology ([`Topology::handoff`]), so a
//! [`HandoffTap`] on the topology hears every fact and step of either run without the drivers
//! knowing. Requests go one at a time, so each one's sequence is the driver's alone to decide.
//!
//! The test lives here rather than in `crates/cluster/tests`: driving both drivers from the
//! cluster crate would need it to depend (for tests) on the two crates that depend on it.

mod common;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use servesim_cluster::{Fact, HandoffTap, RouterMode, Step, Topology};
use servesim_engine::WorkerArgs;
use servesim_replay::{simulate, Collector, SimConfig, Sla};
use servesim_workload::{load_mooncake, LoadMode};

use common::{options, post, start_with, stop};

/// What one request's handoff heard: its first step, then each fact and the steps it led to.
type Heard = Vec<(Option<Fact>, Vec<Step>)>;

/// What a tap heard, request by request (by id) in order of arrival.
type Log = Mutex<Vec<(u64, Heard)>>;

/// A tap and what it heard.
fn recorder() -> (HandoffTap, Arc<Log>) {
    let log: Arc<Log> = Arc::default();
    let sink = log.clone();
    let tap = HandoffTap::new(move |id, fact, steps: &[Step]| {
        let mut log = sink.lock().unwrap();
        let at = match log.iter().position(|(i, _)| *i == id) {
            Some(at) => at,
            None => {
                log.push((id, Vec::new()));
                log.len() - 1
            }
        };
        log[at].1.push((fact, steps.to_vec()));
    });
    (tap, log)
}

fn heard(log: &Log) -> Vec<Heard> {
    log.lock().unwrap().iter().map(|(_, h)| h.clone()).collect()
}

/// Workers whose passes take fixed times and whose KV takes 1 ms a token to move; the decode
/// side holds 256 tokens. (A prompt the decode side could never hold is not part of the
/// scenario: the live server's front door refuses it with a 400 before any handoff starts.)
fn topology(backend: &str) -> Topology {
    let worker = |blocks: u32| {
        let mut args = json!({
            "engine_type": backend,
            "timing_model": {"type": "fixed", "prefill_ms": 20.0, "decode_ms": 5.0},
            "block_size": 16, "num_gpu_blocks": blocks, "speedup_ratio": 0.0,
            "kv_bytes_per_token": 1_000_000, "kv_transfer_bandwidth": 1.0,
        });
        if backend == "sglang" {
            args["sglang"] = json!({"page_size": 16});
        }
        WorkerArgs::from_value(&args).expect("valid engine arguments")
    };
    Topology::disaggregated((worker(1000), 1), (worker(16), 1)).expect("a topology")
}

/// The scenario, as (prompt blocks, prompt tokens, output tokens): a request; one that shares
/// its first four blocks (the decode worker has them cached); one that extends the first.
const REQUESTS: [(&[u32], u32, u32); 3] =
    [(&[1, 2, 3, 4, 5, 6, 7], 100, 4), (&[1, 2, 3, 4, 8, 9, 10], 100, 3), (&[1, 2, 3, 4, 5, 6, 7, 11, 12], 140, 2)];

/// The live prompt of a request: 16 ids of its own for each block, so prompts share exactly the
/// blocks their trace rows share.
fn live_prompt(blocks: &[u32], len: u32) -> Vec<u32> {
    let mut prompt: Vec<u32> = blocks.iter().flat_map(|b| (0..16).map(move |t| 10_000 + b * 16 + t)).collect();
    prompt.truncate(len as usize);
    prompt
}

fn replay(topology: Topology) -> Vec<Heard> {
    let (tap, log) = recorder();
    let dir = std::env::temp_dir().join(format!("servesim-conformance-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path: PathBuf = dir.join(format!("{}.jsonl", std::thread::current().name().unwrap_or("t").replace("::", "-")));
    let rows: Vec<String> = REQUESTS
        .iter()
        .enumerate()
        .map(|(k, (blocks, isl, osl))| {
            json!({"timestamp": k * 10_000, "input_length": isl, "output_length": osl, "hash_ids": blocks}).to_string()
        })
        .collect();
    std::fs::write(&path, rows.join("\n")).unwrap();
    let workload = load_mooncake(&[&path], 16).unwrap();
    let config =
        SimConfig::new(topology.tap_handoffs(tap), RouterMode::RoundRobin, LoadMode::Timestamps { speedup: 1.0 });
    simulate(&workload, &config, Collector::new(Sla::default(), None), &mut ()).expect("the replay runs");
    heard(&log)
}

async fn live(topology: Topology) -> Vec<Heard> {
    let (tap, log) = recorder();
    let server = start_with(options(topology.tap_handoffs(tap))).await;
    for (blocks, isl, osl) in REQUESTS {
        let req = json!({"prompt": live_prompt(blocks, isl), "max_tokens": osl});
        let (status, body): (u16, Value) = post(server.addr(), "/v1/completions", req).await;
        assert_eq!(status, 200, "{body}");
    }
    stop(server).await;
    heard(&log)
}

async fn same_handoffs(backend: &str) {
    let offline = replay(topology(backend));
    let online = live(topology(backend)).await;
    assert_eq!(offline.len(), REQUESTS.len(), "every request was handed off: {offline:?}");
    // The scenario is what it says: five facts a request, and the decode worker's cache shows.
    let reused: Vec<Option<u32>> = offline
        .iter()
        .map(|h| {
            assert_eq!(h.len(), 5, "{h:?}");
            h.iter().find_map(|(f, _)| match f {
                Some(Fact::DestinationReserved { reused_tokens }) => Some(*reused_tokens),
                _ => None,
            })
        })
        .collect();
    assert_eq!(reused, [Some(0), Some(64), Some(96)]);
    for (k, (a, b)) in offline.iter().zip(&online).enumerate() {
        assert_eq!(a, b, "request {k}: the replay (left) and the live server (right) differ");
    }
    assert_eq!(offline.len(), online.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_handoffs_are_the_same_in_replay_and_live() {
    same_handoffs("vllm").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_handoffs_are_the_same_in_replay_and_live() {
    same_handoffs("sglang").await;
}
