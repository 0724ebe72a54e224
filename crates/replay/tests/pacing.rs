//! Wall-clock pacing (online replay): the pacer decides only when the loop goes on, never what
//! it computes; a paced run takes at least its simulated duration; cancelling stops a paced
//! run while it waits.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use servesim_engine::WorkerArgs;
use servesim_replay::{
    simulate_with, Collector, Pacer, Progress, RouterMode, RunOptions, SimConfig, SimError, Sla, Topology, WallClock,
    WALL_CLOCK_KEYS,
};
use servesim_workload::{Arrivals, LoadMode, SyntheticSpec, Workload};

fn engine() -> WorkerArgs {
    WorkerArgs::parse_json(r#"{"block_size": 16, "num_gpu_blocks": 2000, "max_num_seqs": 8}"#).unwrap()
}

fn workload(sessions: u32, interval_ms: f64) -> Workload {
    Workload::Synthetic(SyntheticSpec {
        input_tokens: 300,
        output_tokens: 12,
        sessions,
        turns_per_session: 1,
        arrivals: Arrivals::Interval { interval_ms },
        seed: 7,
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

fn config(workers: u32, router: RouterMode) -> SimConfig {
    SimConfig::new(Topology::aggregated(engine(), workers).unwrap(), router, LoadMode::Timestamps { speedup: 1.0 })
}

/// Records every virtual time the loop asks about and never makes it wait.
#[derive(Default)]
struct Recorder {
    asked: Mutex<Vec<f64>>,
}

impl Pacer for Recorder {
    fn wait(&self, at_ms: f64) -> Duration {
        self.asked.lock().unwrap().push(at_ms);
        Duration::ZERO
    }
}

/// The summary without its wall-clock keys, and the end of the run.
fn run(workload: &Workload, config: &SimConfig, pacer: Option<&dyn Pacer>) -> (serde_json::Value, f64) {
    let options = RunOptions { pacer, ..RunOptions::default() };
    let report = simulate_with(workload, config, Collector::new(Sla::default(), None), &mut (), options).unwrap();
    let mut summary = report.summary_json();
    for key in WALL_CLOCK_KEYS {
        summary.remove(key);
    }
    (serde_json::Value::Object(summary), report.end_ms)
}

#[test]
fn a_paced_run_computes_what_an_unpaced_one_does() {
    // One loop (a KV router couples the workers), and a run split by worker (round robin),
    // whose shards each consult the pacer.
    for (workers, router) in [(2, RouterMode::KvRouter(Default::default())), (3, RouterMode::RoundRobin)] {
        let w = workload(40, 25.0);
        let c = config(workers, router);
        let (unpaced, end) = run(&w, &c, None);
        let recorder = Recorder::default();
        let (paced, paced_end) = run(&w, &c, Some(&recorder));
        assert_eq!(paced, unpaced, "{workers} workers");
        assert_eq!(paced_end, end);
        let asked = recorder.asked.into_inner().unwrap();
        // Asked at every arrival at least (one every 25 ms from 25 ms on), up to the end.
        assert!(asked.len() >= 39, "{} asks", asked.len());
        assert_eq!(asked.iter().copied().fold(0.0, f64::max), end);
        if workers == 2 {
            // One loop: only when its clock moves forward.
            assert!(asked.windows(2).all(|p| p[0] < p[1]), "{asked:?}");
        }
    }
}

#[test]
fn a_wall_clock_run_takes_its_simulated_duration() {
    for (workers, router) in [(1, RouterMode::RoundRobin), (2, RouterMode::RoundRobin)] {
        let w = workload(12, 30.0);
        let c = config(workers, router);
        let started = Instant::now();
        let clock = WallClock::starting_at(started);
        let (_, end_ms) = run(&w, &c, Some(&clock));
        let wall_ms = started.elapsed().as_secs_f64() * 1000.0;
        assert!(end_ms > 300.0, "simulated {end_ms} ms");
        assert!(wall_ms >= end_ms && wall_ms < 2.0 * end_ms + 500.0, "wall {wall_ms} ms, simulated {end_ms} ms");
    }
}

/// Cancels the run the first time it is asked after `after`.
struct CancelAfter(Instant);

impl Progress for CancelAfter {
    fn update(&mut self, _: u64, _: u64) {}
    fn cancelled(&mut self) -> bool {
        Instant::now() >= self.0
    }
}

#[test]
fn cancelling_stops_a_paced_run_while_it_waits() {
    // An arrival every 10 s of virtual time: a paced run would take about ten minutes.
    for (workers, router) in [(1, RouterMode::RoundRobin), (4, RouterMode::RoundRobin)] {
        let w = workload(60, 10_000.0);
        let c = config(workers, router);
        let clock = WallClock::start();
        let started = Instant::now();
        let mut progress = CancelAfter(started + Duration::from_millis(200));
        let options = RunOptions { pacer: Some(&clock), ..RunOptions::default() };
        let result = simulate_with(&w, &c, Collector::new(Sla::default(), None), &mut progress, options);
        let waited = started.elapsed();
        assert!(matches!(result, Err(SimError::Cancelled { .. })), "{workers} workers: {:?}", result.err());
        assert!(waited >= Duration::from_millis(200) && waited < Duration::from_millis(700), "{waited:?}");
    }
}
