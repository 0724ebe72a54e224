//! Exact parallelism: replaying round-robin workers separately.
//!
//! When requests are released by their timestamps alone (single-turn sessions, no
//! closed-loop concurrency), placed round-robin, and served by aggregated workers, nothing a
//! worker does can influence another: which worker gets a request depends only on its release
//! order, and when it is released depends only on the trace. Each worker can then be replayed
//! on its own. A shard replays the workers `w` with `w % shards == index`: it walks the whole
//! workload, skips the requests round-robin gives to other workers (keeping their ordinals, so
//! ids and token streams are those of the whole run), and collects the rest. The number of
//! shards depends on the number of workers only (one per worker, at most [`MAX_SHARDS`], so
//! that ten thousand workers do not walk the workload ten thousand times); shards run on a
//! small thread pool and are merged in shard order, so the report does not depend on the
//! number of threads.
//!
//! Per-request timelines are identical to a single-loop run; exact-quantile distributions are
//! too; pooled token-gap means and deviations are merged with Chan's formula and may differ
//! from a single loop's running sums in the last bits.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use crate::metrics::Collector;
use servesim_cluster::RouterMode;

use crate::sim::{simulate_shard, work_only_at_releases, Pacer, Progress, Shard, SimConfig, SimError};
use servesim_workload::Workload;

/// Most shards a run is split into.
pub const MAX_SHARDS: usize = 64;

/// Whether this run can be split by worker.
pub(crate) fn applies(workload: &Workload, config: &SimConfig, collector: &Collector<'_>) -> bool {
    let [pool] = config.topology.pools() else {
        return false;
    };
    config.split_workers
        && pool.workers > 1
        // Workers with G3 see each other's completions (one registry per deployment).
        && pool.engine.g3_offload.is_none()
        // Workers of a shared host pool advance each other's transfers.
        && !pool.engine.host_offload.as_ref().is_some_and(|h| h.cluster_shared)
        && config.router == RouterMode::RoundRobin
        && work_only_at_releases(workload, config)
        // Per-request records are written in completion order as the run goes.
        && !collector.has_sink()
        // A queue bound applies to the whole cluster's queue, not to each shard's.
        && collector.queue_limit().max.is_none()
        // Telemetry samples the whole cluster at each instant.
        && !collector.has_telemetry()
}

/// Runs every worker's shard and merges them into `collector`; returns the time of the last
/// event of the run. A paced run gives every shard its own thread: each follows the wall clock
/// from the start (mostly asleep), and a shard that waited for a thread would start behind it.
pub(crate) fn simulate(
    workload: &Workload,
    config: &SimConfig,
    collector: &mut Collector<'_>,
    progress: &mut dyn Progress,
    pacer: Option<&dyn Pacer>,
) -> Result<f64, SimError> {
    let [pool] = config.topology.pools() else { unreachable!("split runs are aggregated") };
    let count = (pool.workers as usize).min(MAX_SHARDS);
    let threads = match (pacer, config.threads) {
        (Some(_), _) => count,
        (None, 0) => std::thread::available_parallelism().map_or(1, |n| n.get()),
        (None, n) => n,
    }
    .min(count);
    let total = workload.num_requests();
    let queue = collector.queue_limit();
    let breakdown = collector.has_ttft_breakdown();
    let finished = AtomicU64::new(0);
    let cancel = AtomicBool::new(false);
    let next_shard = AtomicUsize::new(0);
    let mut results: Vec<Option<Result<(Collector<'static>, f64), SimError>>> = (0..count).map(|_| None).collect();
    std::thread::scope(|scope| {
        let (done_tx, done_rx) = mpsc::channel();
        let work = |done_tx: mpsc::Sender<_>| loop {
            let index = next_shard.fetch_add(1, Ordering::Relaxed);
            if index >= count {
                break;
            }
            let mut shard_progress = SharedProgress { finished: &finished, reported: 0, cancel: &cancel };
            let shard = Shard { index, count };
            let mut collector = Collector::new(config.sla, None).with_queue_limit(queue);
            if breakdown {
                collector = collector.with_ttft_breakdown();
            }
            let result = simulate_shard(workload, config, shard, collector, &mut shard_progress, pacer);
            if done_tx.send((index, result)).is_err() {
                break;
            }
        };
        let mut spawned = 0;
        for _ in 0..threads {
            let done_tx = done_tx.clone();
            // A machine out of threads runs the shards on fewer (or on this one, below).
            if std::thread::Builder::new().spawn_scoped(scope, move || work(done_tx)).is_ok() {
                spawned += 1;
            }
        }
        if spawned == 0 {
            work(done_tx.clone());
        }
        drop(done_tx);
        let mut received = 0;
        while received < count {
            match done_rx.recv_timeout(Duration::from_millis(100)) {
                Ok((index, result)) => {
                    results[index] = Some(result);
                    received += 1;
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
            progress.update(finished.load(Ordering::Relaxed), total);
            if progress.cancelled() {
                cancel.store(true, Ordering::Relaxed);
            }
        }
    });
    let mut end_ms = 0.0f64;
    for result in results {
        let (shard, shard_end) = result.expect("every shard reports")?;
        collector.merge(&shard);
        end_ms = end_ms.max(shard_end);
    }
    Ok(end_ms)
}

/// A shard's progress, added to the run's.
struct SharedProgress<'a> {
    finished: &'a AtomicU64,
    reported: u64,
    cancel: &'a AtomicBool,
}

impl Progress for SharedProgress<'_> {
    fn update(&mut self, finished: u64, _total: u64) {
        self.finished.fetch_add(finished - self.reported, Ordering::Relaxed);
        self.reported = finished;
    }

    fn cancelled(&mut self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha12Rng;
    use serde_json::Value;

    use super::*;
    use crate::metrics::{RequestRecord, Sla};
    use crate::report::{request_json, WALL_CLOCK_KEYS};
    use crate::simulate::simulate;
    use servesim_cluster::Topology;
    use servesim_engine::WorkerArgs;
    use servesim_workload::{LoadMode, SessionSpec, TurnSpec};

    fn workload(rng: &mut ChaCha12Rng) -> Workload {
        let mut t = 0.0;
        let sessions = (0..rng.random_range(20..300u32))
            .map(|s| {
                t += if rng.random_bool(0.2) { 0.0 } else { rng.random_range(0.0..100.0) };
                let input = rng.random_range(1..3000u32);
                let group = rng.random_range(0..3u32);
                let blocks = (0..input.div_ceil(64)).map(|b| if b < 3 { group * 10 + b } else { 1000 + s * 100 + b });
                let turn = TurnSpec {
                    input_length: input,
                    output_length: rng.random_range(0..200),
                    blocks: blocks.collect(),
                    delay_ms: 0.0,
                    priority: 0,
                    strict_priority: 0,
                    output_tokens: None,
                    meta: None,
                };
                SessionSpec { name: Some(format!("s{s}").into()), start_ms: t, turns: vec![turn] }
            })
            .collect();
        Workload::Trace { sessions, block_tokens: 64 }
    }

    fn config(rng: &mut ChaCha12Rng) -> SimConfig {
        let args = WorkerArgs::parse_json(&format!(
            r#"{{"block_size": 64, "num_gpu_blocks": {}, "max_num_seqs": {}, "dp_size": {}}}"#,
            rng.random_range(60..2000),
            rng.random_range(2..64),
            rng.random_range(1..3),
        ))
        .unwrap();
        SimConfig {
            topology: Topology::aggregated(args, rng.random_range(2..6)).unwrap(),
            router: RouterMode::RoundRobin,
            prefill_load_estimator: None,
            router_seed: 0,
            kv_event_lag_ms: 0.0,
            load: LoadMode::Timestamps { speedup: rng.random_range(0.5..4.0) },
            sla: Sla { ttft_ms: Some(300.0), itl_ms: None, e2e_ms: None },
            seed: 7,
            fast_forward: true,
            split_workers: true,
            threads: 2,
            timing_jitter_cv: 0.0,
            tokenization: None,
            frontend_stages: Vec::new(),
            encoder_pool: None,
        }
    }

    fn summary(workload: &Workload, config: &SimConfig) -> serde_json::Map<String, Value> {
        let mut s = simulate(workload, config, Collector::new(config.sla, None), &mut ()).unwrap().summary_json();
        for key in WALL_CLOCK_KEYS {
            s.remove(key);
        }
        s
    }

    /// Per-request records of the whole run, shard by shard, in ordinal order.
    fn records(workload: &Workload, config: &SimConfig, shards: Option<usize>) -> Vec<Value> {
        let mut out: Vec<RequestRecord> = Vec::new();
        let mut sink = |r: &RequestRecord| out.push(r.clone());
        match shards {
            None => {
                let collector = Collector::new(config.sla, Some(&mut sink));
                assert!(!applies(workload, config, &collector));
                simulate(workload, config, collector, &mut ()).unwrap();
            }
            Some(count) => {
                for index in 0..count {
                    let collector = Collector::new(config.sla, Some(&mut sink));
                    simulate_shard(workload, config, Shard { index, count }, collector, &mut (), None).unwrap();
                }
            }
        }
        out.sort_by_key(|r| r.ordinal);
        out.iter().map(request_json).collect()
    }

    #[test]
    fn shards_replay_exactly_what_one_loop_does() {
        for seed in 0..40 {
            let mut rng = ChaCha12Rng::seed_from_u64(seed);
            let workload = workload(&mut rng);
            let config = config(&mut rng);
            assert!(applies(&workload, &config, &Collector::new(config.sla, None)));
            let pool = &config.topology.pools()[0];
            let whole = records(&workload, &config, None);
            assert_eq!(whole.len(), workload.num_requests() as usize);
            assert_eq!(whole, records(&workload, &config, Some(pool.workers as usize)), "seed {seed}");

            let split = summary(&workload, &config);
            let one_thread = summary(&workload, &SimConfig { threads: 1, ..config.clone() });
            assert_eq!(split, one_thread, "seed {seed}: the thread count must not matter");
            let single = summary(&workload, &SimConfig { split_workers: false, ..config.clone() });
            for (key, v) in &single {
                let (a, b) = (v.as_f64().unwrap_or(f64::NAN), split[key].as_f64().unwrap_or(f64::NAN));
                let close = a == b || (a - b).abs() <= 1e-9 * a.abs().max(b.abs()) || v == &split[key];
                assert!(close, "seed {seed} {key}: one loop {v}, split {}", split[key]);
            }
        }
    }
}
