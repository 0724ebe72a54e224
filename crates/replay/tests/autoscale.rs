//! The autoscaler seam: a scripted autoscaler adds and drains workers at its ticks; the loop
//! places requests only on ready workers, lets draining ones finish, and integrates
//! worker-seconds over the lifecycle.

use servesim_engine::WorkerArgs;
use servesim_planner::Snapshot;
use servesim_replay::{
    simulate_with, Autoscaler, Collector, LifecycleOp, RequestRecord, RouterMode, RunOptions, ScaleDecision, SimConfig,
    Sla, Topology, Transition,
};
use servesim_workload::{Arrivals, LoadMode, SyntheticSpec, Workload};

/// Targets by tick: (tick time ms, target workers).
struct Script {
    ticks: Vec<(f64, usize)>,
    seen: Vec<(f64, usize, usize, usize)>,
    ops: Vec<LifecycleOp>,
}

impl Autoscaler for Script {
    fn first_tick_ms(&mut self) -> Option<f64> {
        self.ticks.first().map(|t| t.0)
    }

    fn on_tick(&mut self, ordinal: u64, snap: &Snapshot) -> ScaleDecision {
        let (at, target) = self.ticks[ordinal as usize];
        self.seen.push((at, snap.active_decode.len(), snap.draining_decode.len(), snap.decode_fpms.len()));
        ScaleDecision {
            target_prefill: None,
            target_decode: Some(target),
            next_tick_ms: self.ticks.get(ordinal as usize + 1).map(|t| t.0),
        }
    }

    fn lifecycle(&mut self, op: &LifecycleOp) {
        self.ops.push(*op);
    }
}

fn config(startup_time: Option<f64>) -> SimConfig {
    let startup = startup_time.map_or(String::new(), |s| format!(r#", "startup_time": {s}"#));
    let engine = WorkerArgs::parse_json(&format!(
        r#"{{"block_size": 16, "num_gpu_blocks": 4000, "timing_model": {{"type": "fixed", "prefill_ms": 20.0, "decode_ms": 10.0}}{startup}}}"#
    ))
    .unwrap();
    SimConfig {
        router_seed: 1,
        seed: 1,
        ..SimConfig::new(
            Topology::aggregated(engine, 1).unwrap(),
            RouterMode::RoundRobin,
            LoadMode::Timestamps { speedup: 1.0 },
        )
    }
}

/// 200 requests, one every 50 ms (0 .. 9950 ms), 20 output tokens each (≈ 210 ms of work).
fn workload() -> Workload {
    Workload::Synthetic(SyntheticSpec {
        input_tokens: 64,
        output_tokens: 20,
        sessions: 200,
        turns_per_session: 1,
        arrivals: Arrivals::Interval { interval_ms: 50.0 },
        seed: 1,
        shared_prefix_ratio: 0.0,
        num_prefix_groups: 0,
        inter_turn_delay_ms: 0.0,
        block_tokens: 16,
        group_seed: servesim_workload::GROUP_SEED,
        cached_prefix_tokens: 0,
        accumulate: false,
        images: None,
    })
}

fn run(script: &mut Script, startup: Option<f64>) -> (servesim_replay::Report, Vec<RequestRecord>) {
    let mut records = Vec::new();
    let mut sink = |r: &RequestRecord| records.push(r.clone());
    let options = RunOptions { autoscaler: Some(script), stop_at_ms: None, pacer: None };
    let cfg = config(startup);
    let report =
        simulate_with(&workload(), &cfg, Collector::new(Sla::default(), Some(&mut sink)), &mut (), options).unwrap();
    records.sort_by_key(|r| r.ordinal);
    (report, records)
}

#[test]
fn workers_join_at_a_tick_and_drain_at_a_later_one() {
    let mut script = Script { ticks: vec![(2000.0, 3), (6000.0, 1), (8000.0, 1)], seen: Vec::new(), ops: Vec::new() };
    let (report, records) = run(&mut script, None);
    assert_eq!(report.totals.completed, 200);
    // Requests arriving in (2 s, 6 s] go round robin over three workers; before 2 s and after
    // 6 s only worker 0 takes new ones.
    let worker = |r: &RequestRecord| r.decode_worker.unwrap();
    assert!(records.iter().filter(|r| r.arrival_ms < 2000.0).all(|r| worker(r) == 0));
    let middle: Vec<u32> =
        records.iter().filter(|r| r.arrival_ms > 2000.0 && r.arrival_ms < 6000.0).map(worker).collect();
    for w in 0..3 {
        assert!(middle.iter().filter(|&&x| x == w).count() >= 20, "worker {w} served part of the middle: {middle:?}");
    }
    assert!(records.iter().filter(|r| r.arrival_ms > 6000.0).all(|r| worker(r) == 0));
    // The snapshots: one worker, then three, then one (the drained ones stopped: each had at
    // most ~200 ms of work left at 6 s); one forward-pass snapshot per active rank.
    assert_eq!(script.seen, vec![(2000.0, 1, 0, 1), (6000.0, 3, 0, 3), (8000.0, 1, 0, 1)]);
    // Lifecycle: added and ready at 2 s (no startup time); at 6 s the newest drains first, and
    // each stops once its requests are done.
    let ops: Vec<(u32, Transition)> = script.ops.iter().map(|o| (o.worker, o.transition)).collect();
    assert_eq!(
        &ops[..4],
        &[(1, Transition::Added), (1, Transition::Ready), (2, Transition::Added), (2, Transition::Ready)]
    );
    let position = |w: u32, t: Transition| ops.iter().position(|&o| o == (w, t)).unwrap();
    assert!(position(2, Transition::Draining) < position(1, Transition::Draining));
    assert!(position(2, Transition::Draining) < position(2, Transition::Stopped));
    assert!(position(1, Transition::Draining) < position(1, Transition::Stopped));
    assert_eq!(ops.len(), 8);
    let stopped: Vec<f64> =
        script.ops.iter().filter(|o| o.transition == Transition::Stopped).map(|o| o.at_ms).collect();
    assert!(stopped.iter().all(|&t| (6000.0..6500.0).contains(&t)), "{stopped:?}");
    // Worker-seconds: worker 0 for the whole run, workers 1 and 2 from 2 s until they stopped.
    let end_s = report.end_ms / 1000.0;
    let expected = end_s + stopped.iter().map(|t| t / 1000.0 - 2.0).sum::<f64>();
    assert!(
        (report.decode_worker_seconds() - expected).abs() < 1e-9,
        "{} vs {expected}",
        report.decode_worker_seconds()
    );
}

#[test]
fn a_started_worker_takes_requests_only_after_its_startup_time() {
    let mut script = Script { ticks: vec![(2000.0, 2), (9000.0, 2)], seen: Vec::new(), ops: Vec::new() };
    let (_, records) = run(&mut script, Some(1.5));
    let ready = script.ops.iter().find(|o| o.transition == Transition::Ready).unwrap();
    assert_eq!((ready.worker, ready.at_ms), (1, 3500.0));
    assert!(records.iter().filter(|r| r.arrival_ms < 3500.0).all(|r| r.decode_worker == Some(0)));
    assert!(records.iter().any(|r| r.arrival_ms > 3500.0 && r.decode_worker == Some(1)));
    // While it starts it is not active: the tick at 2 s saw one worker, the one at 9 s two.
    assert_eq!((script.seen[0].1, script.seen[1].1), (1, 2));
}

#[test]
fn a_virtual_time_stop_counts_requests_in_flight_as_incomplete() {
    let options = RunOptions { autoscaler: None, stop_at_ms: Some(5000.0), pacer: None };
    let report =
        simulate_with(&workload(), &config(None), Collector::new(Sla::default(), None), &mut (), options).unwrap();
    // Arrivals at 0, 50, ..., 5000 ms: 101 requests; the last one or few are still running.
    assert_eq!(report.totals.num_requests, 101);
    assert!(report.totals.incomplete >= 1 && report.totals.completed + report.totals.incomplete == 101);
    assert_eq!(report.end_ms, 5000.0);
}
