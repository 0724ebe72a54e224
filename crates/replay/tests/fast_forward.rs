//! The fast-forwarded decode stretches change nothing: on many random workloads and
//! configurations, every per-request record equals the one from stepping pass by pass.
//! FFSEEDS=N runs N random cases (default 200); FFDEBUG=SEED runs one and prints its configuration.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha12Rng;
use servesim_engine::WorkerArgs;
use servesim_replay::{simulate, Collector, RequestRecord, RouterMode, SimConfig, Sla, Topology};
use servesim_router::RouterConfig;
use servesim_workload::{load_trace, LoadMode, TraceFormat, TraceOptions, Workload};
use servesim_workload::{SessionSpec, TurnSpec};

fn random_workload(rng: &mut ChaCha12Rng) -> Workload {
    let sessions = rng.random_range(5..120);
    let multi_turn = rng.random_bool(0.3);
    let mut t = 0.0;
    let sessions = (0..sessions)
        .map(|s| {
            t += if rng.random_bool(0.3) { 0.0 } else { rng.random_range(0.0..400.0) };
            let turns = if multi_turn { rng.random_range(1..4) } else { 1 };
            let turns = (0..turns)
                .map(|k| {
                    let input = rng.random_range(1..2500u32);
                    let blocks = input.div_ceil(64);
                    // A few shared prefixes.
                    let group = rng.random_range(0..4u32);
                    let ids = (0..blocks)
                        .map(|b| if b < 2 { group * 100 + b } else { 10_000 + s * 1000 + k * 100 + b })
                        .collect();
                    TurnSpec {
                        input_length: input,
                        output_length: rng.random_range(0..300),
                        blocks: ids,
                        delay_ms: if k == 0 { 0.0 } else { rng.random_range(0.0..200.0) },
                        priority: 0,
                        strict_priority: 0,
                        output_tokens: None,
                        meta: None,
                    }
                })
                .collect();
            SessionSpec { name: Some(format!("s{s}").into()), start_ms: t, turns }
        })
        .collect();
    Workload::Trace { sessions, block_tokens: 64 }
}

fn random_engine(rng: &mut ChaCha12Rng) -> WorkerArgs {
    let bs = [4, 16, 32, 64][rng.random_range(0..4)];
    let blocks = rng.random_range(50..3000);
    let backend = if rng.random_bool(0.2) { "trtllm" } else { "vllm" };
    let timing = if rng.random_bool(0.5) {
        r#"{"type": "polynomial"}"#.to_string()
    } else {
        format!(
            r#"{{"type": "fixed", "prefill_ms": {}, "decode_ms": {}}}"#,
            rng.random_range(1..50),
            rng.random_range(1..20)
        )
    };
    let (max_seqs, budget, caching, chunking) =
        (rng.random_range(1..64), rng.random_range(16..8192), rng.random_bool(0.7), rng.random_bool(0.8));
    // Without chunking every prompt (under 2,500 tokens) must fit one pass, or the run stops.
    let budget = if chunking { budget } else { budget.max(2500) };
    let json = format!(
        r#"{{"engine_type": "{backend}", "block_size": {bs}, "num_gpu_blocks": {blocks},
            "max_num_seqs": {max_seqs}, "max_num_batched_tokens": {budget}, "enable_prefix_caching": {caching},
            "enable_chunked_prefill": {chunking}, "preemption_mode": "{}", "timing_model": {timing},
            "speedup_ratio": {}}}"#,
        if rng.random_bool(0.5) { "lifo" } else { "fifo" },
        [0.5, 1.0, 2.0][rng.random_range(0..3)],
    );
    WorkerArgs::parse_json(&json).unwrap()
}

fn records(workload: &Workload, config: &SimConfig) -> (Vec<RequestRecord>, serde_json::Value, u64) {
    let mut out = Vec::new();
    let mut sink = |r: &RequestRecord| out.push(r.clone());
    let report = simulate(workload, config, Collector::new(Sla::default(), Some(&mut sink)), &mut ())
        .unwrap_or_else(|e| panic!("seed {}, fast forward {}: {e}", config.seed, config.fast_forward));
    let mut summary = report.summary_json();
    for k in ["wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s"] {
        summary.remove(k);
    }
    out.sort_by_key(|r| r.ordinal);
    (out, serde_json::Value::Object(summary), report.totals.stretched_passes)
}

#[test]
fn fast_forward_gives_identical_records() {
    let mut stretched_runs = 0;
    let mut stretched_passes = 0;
    for seed in 0..std::env::var("FFSEEDS").map_or(200, |v| v.parse().unwrap()) {
        if std::env::var("FFDEBUG").is_ok_and(|v| v != seed.to_string()) {
            continue;
        }
        let mut rng = ChaCha12Rng::seed_from_u64(seed);
        let workload = random_workload(&mut rng);
        let engine = random_engine(&mut rng);
        let workers = rng.random_range(1..4);
        let router = if rng.random_bool(0.3) {
            let queue_threshold = rng.random_bool(0.5).then(|| rng.random_range(0.0..2.0));
            RouterMode::KvRouter(RouterConfig { queue_threshold, ..RouterConfig::default() })
        } else {
            RouterMode::RoundRobin
        };
        let load = if rng.random_bool(0.2) {
            LoadMode::Concurrency { max_sessions: rng.random_range(1..8) }
        } else {
            LoadMode::Timestamps { speedup: 1.0 }
        };
        let mut config = SimConfig {
            topology: Topology::aggregated(engine, workers).unwrap(),
            router,
            prefill_load_estimator: None,
            router_seed: seed,
            kv_event_lag_ms: 0.0,
            load,
            sla: Sla::default(),
            seed,
            fast_forward: false,
            split_workers: true,
            threads: 1,
            timing_jitter_cv: 0.0,
            tokenization: None,
            frontend_stages: Vec::new(),
            encoder_pool: None,
        };
        if std::env::var("FFDEBUG").is_ok() {
            eprintln!("{config:?}");
        }
        let (stepped, stepped_summary, none) = records(&workload, &config);
        assert_eq!(none, 0);
        config.fast_forward = true;
        let (fast, fast_summary, stretched) = records(&workload, &config);
        stretched_passes += stretched;
        assert_eq!(stepped.len(), fast.len(), "seed {seed}");
        for (a, b) in stepped.iter().zip(&fast) {
            assert_eq!(a, b, "seed {seed}: request {} differs", a.ordinal);
        }
        // Totals and exact distributions agree; pooled-gap moments may differ in the last bits
        // (tokens are folded in a different order).
        for key in ["completed_requests", "total_output_tokens", "duration_ms", "p99_ttft_ms", "median_e2e_latency_ms"]
        {
            assert_eq!(stepped_summary[key], fast_summary[key], "seed {seed}: {key}");
        }
        if stepped.iter().any(|r| r.output_length > 20) {
            stretched_runs += 1;
        }
    }
    assert!(std::env::var("FFDEBUG").is_ok() || stretched_runs > 30, "the random workloads exercise long decodes");
    assert!(std::env::var("FFDEBUG").is_ok() || stretched_passes > 20_000, "stretches ran: {stretched_passes} passes");
    eprintln!("{stretched_passes} passes fast-forwarded");
}

/// A seeded agentic graph busy enough to keep several workers decoding: plays of sequential
/// turns whose prompts grow, some with a sub-agent spawned at a turn's dispatch and joined by
/// the next turn, and completion delays of 0 to 30 ms (some exactly 0: a follow-up arrives at
/// the instant its parent ends).
fn busy_agentic_graph(plays: u32, seed: u64) -> String {
    let mut state = seed;
    let mut next = move |n: u64| {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 33) % n
    };
    let dep = |id: &str, trigger: &str, delay: u64, relation: &str| {
        format!(r#"{{"request_id":"{id}","trigger":"{trigger}","delay_ms":{delay},"relation":"{relation}"}}"#)
    };
    let mut text = String::from(
        r#"{"schema":"dynamo.agentic_mooncake","version":2,"block_size":16,"hash_id_scope":"local","source":{"format":"f","digest":"d"}}"#,
    );
    text.push('\n');
    for p in 0..plays {
        let mut hashes: Vec<u64> = Vec::new();
        let mut deps: Vec<String> = Vec::new();
        for t in 0..3 + next(4) {
            let id = format!("p{p:03}-r{t}");
            for _ in 0..1 + next(6) {
                hashes.push(p as u64 * 1000 + hashes.len() as u64);
            }
            let not_before = if t == 0 { next(2000) } else { 0 };
            text.push_str(&format!(
                r#"{{"request_id":"{id}","play_id":"play{p:03}","session_id":"s{p}","model":"m","input_length":{},"output_length":{},"hash_ids":{hashes:?},"not_before_ms":{not_before},"dependencies":[{}]}}"#,
                hashes.len() * 16,
                1 + next(200),
                deps.join(","),
            ));
            text.push('\n');
            let delay = if next(3) == 0 { 0 } else { next(30) };
            deps = vec![dep(&id, "completion", delay, "sequence")];
            if next(3) == 0 {
                let child = format!("{id}-sub");
                text.push_str(&format!(
                    r#"{{"request_id":"{child}","play_id":"play{p:03}","session_id":"s{p}-sub","model":"m","input_length":32,"output_length":{},"hash_ids":[{},{}],"not_before_ms":0,"dependencies":[{}]}}"#,
                    1 + next(100),
                    900_000 + 2 * p as u64,
                    900_001 + 2 * p as u64,
                    dep(&id, "dispatch", next(20), "spawn"),
                ));
                text.push('\n');
                deps.push(dep(&child, "completion", 0, "join"));
            }
        }
    }
    text
}

#[test]
fn agentic_graph_stretches_are_cut_where_work_arrives() {
    // On a graph workload a completion anywhere can release work for any worker, so stretches
    // run until work is placed on their worker and are cut there. The records must be those of
    // stepping every pass, and the stretches must be long: planned up front (ending at every
    // other worker's next pass end) they covered 340 passes with round robin and 151 with the KV
    // router here, against 7,061 and 1,323 cut where work arrives.
    let path = std::env::temp_dir().join(format!("servesim-ff-agentic-{}.jsonl", std::process::id()));
    std::fs::write(&path, busy_agentic_graph(120, 7)).unwrap();
    let options = TraceOptions { execution_model: Some("t".into()), ..TraceOptions::new(TraceFormat::AgenticMooncake) };
    let (workload, load) = load_trace(std::slice::from_ref(&path), &options).unwrap();
    std::fs::remove_file(&path).unwrap();
    let engine = WorkerArgs::parse_json(r#"{"block_size": 16, "num_gpu_blocks": 150, "max_num_seqs": 8}"#).unwrap();
    for (workers, router, min_stretched) in
        [(3, RouterMode::RoundRobin, 5_000), (2, RouterMode::KvRouter(RouterConfig::default()), 1_000)]
    {
        let mut config = SimConfig {
            topology: Topology::aggregated(engine.clone(), workers).unwrap(),
            router,
            prefill_load_estimator: None,
            router_seed: 7,
            kv_event_lag_ms: 0.0,
            load,
            sla: Sla::default(),
            seed: 7,
            fast_forward: false,
            split_workers: true,
            threads: 1,
            timing_jitter_cv: 0.0,
            tokenization: None,
            frontend_stages: Vec::new(),
            encoder_pool: None,
        };
        let (stepped, stepped_summary, _) = records(&workload, &config);
        config.fast_forward = true;
        let (fast, fast_summary, stretched) = records(&workload, &config);
        let what = format!("{workers} workers, {:?}", config.router);
        assert_eq!(stepped.len(), 766, "{what}");
        assert!(stepped.iter().map(|r| r.admissions).sum::<u32>() > 766, "{what}: the cache is under pressure");
        assert!(stretched >= min_stretched, "{what}: {stretched} passes fast-forwarded");
        for (a, b) in stepped.iter().zip(&fast) {
            assert_eq!(a, b, "{what}: request {} differs", a.ordinal);
        }
        for key in ["completed_requests", "total_output_tokens", "duration_ms", "p99_ttft_ms", "median_e2e_latency_ms"]
        {
            assert_eq!(stepped_summary[key], fast_summary[key], "{what}: {key}");
        }
    }
}
