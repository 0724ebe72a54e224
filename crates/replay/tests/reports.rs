//! The decomposed TTFT and the telemetry time series, through the replay API.

use servesim_engine::WorkerArgs;
use servesim_replay::telemetry::{TelemetryFormat, TelemetryWriter};
use servesim_replay::{
    request_json, simulate, ClusterSample, Collector, Report, RequestRecord, RouterMode, SimConfig, Sla, Status,
    TelemetrySink, Topology, WorkerSample,
};
use servesim_router::RouterConfig;
use servesim_workload::{Arrivals, LoadMode, SyntheticSpec, Workload};

fn engine(extra: &str) -> WorkerArgs {
    WorkerArgs::parse_json(&format!(r#"{{"block_size": 16, "num_gpu_blocks": 4000, "max_num_seqs": 16{extra}}}"#))
        .unwrap()
}

fn workload(requests: u32, rate: f64, shared: f64) -> Workload {
    Workload::Synthetic(SyntheticSpec {
        input_tokens: 600,
        output_tokens: 40,
        sessions: requests,
        turns_per_session: 1,
        arrivals: Arrivals::Poisson { rate_per_s: rate },
        seed: 7,
        shared_prefix_ratio: shared,
        num_prefix_groups: if shared > 0.0 { 4 } else { 0 },
        inter_turn_delay_ms: 0.0,
        block_tokens: 16,
        group_seed: servesim_workload::GROUP_SEED,
        cached_prefix_tokens: 0,
        accumulate: false,
        images: None,
    })
}

fn config(topology: Topology, router: RouterMode) -> SimConfig {
    SimConfig {
        topology,
        router,
        prefill_load_estimator: None,
        router_seed: 3,
        kv_event_lag_ms: 0.0,
        load: LoadMode::Timestamps { speedup: 1.0 },
        sla: Sla::default(),
        seed: 5,
        fast_forward: true,
        split_workers: true,
        threads: 0,
        timing_jitter_cv: 0.0,
        tokenization: None,
        frontend_stages: Vec::new(),
        encoder_pool: None,
    }
}

/// Runs with the TTFT breakdown; returns the records in release order and the report.
fn run_breakdown(workload: &Workload, config: &SimConfig) -> (Vec<RequestRecord>, Report) {
    let mut records = Vec::new();
    let mut sink = |r: &RequestRecord| records.push(r.clone());
    let collector = Collector::new(Sla::default(), Some(&mut sink)).with_ttft_breakdown();
    let report = simulate(workload, config, collector, &mut ()).unwrap();
    records.sort_by_key(|r| r.ordinal);
    (records, report)
}

/// Every completed request's parts are ≥ 0 and add up to its TTFT; returns the parts' sums.
fn check_parts(records: &[RequestRecord]) -> [f64; servesim_replay::TTFT_PARTS] {
    let mut sums = [0.0; servesim_replay::TTFT_PARTS];
    let completed: Vec<_> = records.iter().filter(|r| r.status == Status::Completed).collect();
    assert!(!completed.is_empty());
    for r in completed {
        let ttft = r.ttft_ms().unwrap();
        let parts = r.ttft_breakdown_ms().unwrap().parts();
        assert!(parts.iter().all(|&p| p >= 0.0), "negative part in {parts:?} (request {})", r.ordinal);
        let total: f64 = parts.iter().sum();
        assert!(
            (total - ttft).abs() <= 1e-9 * ttft.max(1.0),
            "request {}: {parts:?} sum to {total}, TTFT {ttft}",
            r.ordinal
        );
        for (s, p) in sums.iter_mut().zip(parts) {
            *s += p;
        }
    }
    sums
}

#[test]
fn ttft_parts_sum_to_ttft_aggregated() {
    // Two workers behind a KV router that queues as soon as a worker has a prompt pending:
    // requests wait at the router, then in the engines' queues, then prefill.
    let router = RouterMode::KvRouter(RouterConfig { queue_threshold: Some(0.0), ..RouterConfig::default() });
    let topology = Topology::aggregated(engine(""), 2).unwrap();
    let (records, report) = run_breakdown(&workload(300, 40.0, 0.5), &config(topology, router));
    let [frontend, router_queue, engine_queue, prefill, kv_transfer, first_token] = check_parts(&records);
    // Without a tokenization stage the frontend costs nothing.
    assert_eq!(frontend, 0.0);
    assert!(router_queue > 0.0 && engine_queue >= 0.0 && prefill > 0.0, "{router_queue} {engine_queue} {prefill}");
    // Aggregated: the prompt's last pass emits the first token; nothing moves between workers.
    assert_eq!((kv_transfer, first_token), (0.0, 0.0));
    let summary = report.summary_json();
    let mean_prefill = summary["mean_ttft_prefill_ms"].as_f64().unwrap();
    let n = records.iter().filter(|r| r.status == Status::Completed).count() as f64;
    assert!((mean_prefill - prefill / n).abs() < 1e-6 * mean_prefill);
    assert!(summary["p90_ttft_router_queue_ms"].as_f64().unwrap() > 0.0);
    // Engine queueing shows with a round-robin router on one busy worker.
    let topology = Topology::aggregated(engine(r#", "max_num_seqs": 4"#), 1).unwrap();
    let (records, _) = run_breakdown(&workload(200, 30.0, 0.0), &config(topology, RouterMode::RoundRobin));
    let [_, router_queue, engine_queue, ..] = check_parts(&records);
    assert_eq!(router_queue, 0.0);
    assert!(engine_queue > 0.0);
}

/// With the frontend's tokenization stage, its cost is a part of its own: a request's whole
/// tokenization (base plus per-token cost) when tokenizers never queue, and the wait for a
/// tokenizer besides when they do.
#[test]
fn the_frontend_is_its_own_ttft_part() {
    let topology = Topology::aggregated(engine(""), 2).unwrap();
    let w = workload(200, 30.0, 0.0);
    let with = |workers: u32| {
        let tokenization = servesim_replay::Tokenization { workers, base_ms: 9.5, per_input_token_ms: 0.01 };
        let c = SimConfig { tokenization: Some(tokenization), ..config(topology.clone(), RouterMode::RoundRobin) };
        run_breakdown(&w, &c)
    };
    let (records, report) = with(64);
    let [frontend, router_queue, ..] = check_parts(&records);
    for r in records.iter().filter(|r| r.status == Status::Completed) {
        let part = r.ttft_breakdown_ms().unwrap().frontend;
        let cost = 9.5 + 0.01 * f64::from(r.input_length);
        assert!((part - cost).abs() < 1e-6, "request {}: frontend {part}, tokenization {cost}", r.ordinal);
    }
    assert_eq!(router_queue, 0.0);
    let n = records.iter().filter(|r| r.status == Status::Completed).count() as f64;
    let mean = report.summary_json()["mean_ttft_frontend_ms"].as_f64().unwrap();
    assert!((mean - frontend / n).abs() < 1e-9 * mean);
    // One tokenizer at 30 req/s with a ~12 ms cost: requests wait for it, in the same part.
    let (records, _) = with(1);
    let [queued, ..] = check_parts(&records);
    assert!(queued > frontend, "{queued} <= {frontend}");
}

#[test]
fn ttft_parts_sum_to_ttft_disaggregated() {
    for backend in ["vllm", "sglang"] {
        let prefill = engine(&format!(
            r#", "engine_type": "{backend}", "kv_transfer_bandwidth": 2.0, "kv_bytes_per_token": 100000"#
        ));
        let decode = engine(&format!(r#", "engine_type": "{backend}""#));
        let topology = Topology::disaggregated((prefill, 2), (decode, 2)).unwrap();
        let (records, report) = run_breakdown(&workload(200, 30.0, 0.0), &config(topology, RouterMode::RoundRobin));
        let [_, _, _, prefill, kv_transfer, first_token] = check_parts(&records);
        assert!(
            prefill > 0.0 && kv_transfer > 0.0 && first_token > 0.0,
            "{backend}: {prefill} {kv_transfer} {first_token}"
        );
        assert!(report.summary_json()["mean_ttft_kv_transfer_ms"].as_f64().unwrap() > 0.0);
    }
}

#[test]
fn without_the_breakdown_reports_are_unchanged() {
    let topology = Topology::aggregated(engine(""), 2).unwrap();
    let c = config(topology, RouterMode::RoundRobin);
    let w = workload(100, 20.0, 0.0);
    let plain = simulate(&w, &c, Collector::new(Sla::default(), None), &mut ()).unwrap().summary_json();
    assert!(!plain.keys().any(|k| k.starts_with("mean_ttft_") && k != "mean_ttft_ms"));
    let (records, _) = run_breakdown(&w, &c);
    assert!(request_json(&records[0]).get("ttft_breakdown_ms").is_none());
}

/// Keeps every sample.
#[derive(Default)]
struct Keep(Vec<(ClusterSample, Vec<WorkerSample>)>);

impl TelemetrySink for Keep {
    fn sample(&mut self, cluster: &ClusterSample, workers: &[WorkerSample]) {
        self.0.push((cluster.clone(), workers.to_vec()));
    }
}

fn run_telemetry(workload: &Workload, config: &SimConfig, interval: f64) -> (Keep, Report, Vec<RequestRecord>) {
    let mut keep = Keep::default();
    let mut records = Vec::new();
    let mut sink = |r: &RequestRecord| records.push(r.clone());
    let collector = Collector::new(Sla::default(), Some(&mut sink)).with_telemetry(interval, &mut keep);
    let report = simulate(workload, config, collector, &mut ()).unwrap();
    records.sort_by_key(|r| r.ordinal);
    (keep, report, records)
}

fn reconcile(keep: &Keep, report: &Report, interval: f64, workers: usize) {
    let t = &report.totals;
    let samples = &keep.0;
    for (i, (c, w)) in samples.iter().enumerate() {
        assert_eq!(c.t_ms, (i + 1) as f64 * interval);
        assert_eq!(w.len(), workers);
        assert!(w.iter().all(|w| (0.0..=1.0).contains(&w.kv_usage)));
    }
    // The last sample closes the interval of the last event.
    assert!(samples.last().unwrap().0.t_ms > report.end_ms);
    let sum = |f: &dyn Fn(&WorkerSample) -> u64| -> u64 { samples.iter().flat_map(|(_, ws)| ws.iter().map(f)).sum() };
    assert_eq!(samples.iter().map(|(c, _)| c.arrivals).sum::<u64>(), t.num_requests);
    assert_eq!(samples.iter().map(|(c, _)| c.completions).sum::<u64>(), t.completed);
    assert_eq!(sum(&|w| w.output_tokens), t.output_tokens);
    assert_eq!(sum(&|w| w.prefill_tokens), t.prefill_tokens);
    // Something was running and holding KV at some sample; at the end everything is idle.
    assert!(samples.iter().any(|(_, w)| w.iter().any(|w| w.running > 0 && w.kv_usage > 0.0)));
    let (_, last) = samples.last().unwrap();
    assert!(last.iter().all(|w| w.running == 0 && w.waiting == 0));
}

#[test]
fn telemetry_reconciles_with_the_summary() {
    let topology = Topology::aggregated(engine(""), 3).unwrap();
    let c = config(topology, RouterMode::KvRouter(RouterConfig::default()));
    let w = workload(300, 25.0, 0.6);
    let (keep, report, records) = run_telemetry(&w, &c, 500.0);
    assert!(report.totals.stretched_passes > 0, "the run fast-forwards");
    reconcile(&keep, &report, 500.0, 3);
    // Prefix hits show where the shared prefixes were cached.
    assert!(keep.0.iter().any(|(_, ws)| ws.iter().any(|w| w.prefix_hit_rate().is_some_and(|r| r > 0.0))));
    // Telemetry observes: the per-request records are those of a run without it.
    let mut plain = Vec::new();
    let mut sink = |r: &RequestRecord| plain.push(r.clone());
    simulate(&w, &c, Collector::new(Sla::default(), Some(&mut sink)), &mut ()).unwrap();
    plain.sort_by_key(|r| r.ordinal);
    assert_eq!(plain, records);
}

#[test]
fn telemetry_reconciles_disaggregated_and_data_parallel() {
    let prefill = engine(r#", "kv_transfer_bandwidth": 2.0, "kv_bytes_per_token": 100000"#);
    let topology = Topology::disaggregated((prefill, 2), (engine(""), 1)).unwrap();
    let (keep, report, _) = run_telemetry(&workload(150, 20.0, 0.0), &config(topology, RouterMode::RoundRobin), 250.0);
    reconcile(&keep, &report, 250.0, 3);
    let dp = WorkerArgs::parse_json(r#"{"block_size": 16, "num_gpu_blocks": 4000, "max_num_seqs": 16, "dp_size": 2}"#)
        .unwrap();
    let topology = Topology::aggregated(dp, 2).unwrap();
    let (keep, report, _) = run_telemetry(&workload(150, 20.0, 0.0), &config(topology, RouterMode::RoundRobin), 1000.0);
    reconcile(&keep, &report, 1000.0, 4);
    assert_eq!(keep.0[0].1.iter().map(|w| (w.worker, w.dp_rank)).collect::<Vec<_>>(), [(0, 0), (0, 1), (1, 0), (1, 1)]);
}

#[test]
fn telemetry_files_are_deterministic() {
    let topology = Topology::aggregated(engine(""), 2).unwrap();
    let c = config(topology, RouterMode::KvRouter(RouterConfig::default()));
    let w = workload(100, 20.0, 0.5);
    let write = |format| {
        let mut writer = TelemetryWriter::new(Vec::new(), format);
        let collector = Collector::new(Sla::default(), None).with_telemetry(1000.0, &mut writer);
        simulate(&w, &c, collector, &mut ()).unwrap();
        writer.finish().unwrap()
    };
    let jsonl = write(TelemetryFormat::Jsonl);
    assert_eq!(jsonl, write(TelemetryFormat::Jsonl));
    let first: serde_json::Value = serde_json::from_slice(jsonl.split(|&b| b == b'\n').next().unwrap()).unwrap();
    assert_eq!(first["workers"].as_array().unwrap().len(), 2);
    let csv = String::from_utf8(write(TelemetryFormat::Csv)).unwrap();
    let lines = jsonl.split(|&b| b == b'\n').filter(|l| !l.is_empty()).count();
    // A header, then two worker rows and a cluster row per sample.
    assert_eq!(csv.lines().count(), 1 + 3 * lines);
    assert!(csv.lines().all(|l| l.split(',').count() == 21));
}
