//! The loop's telemetry hooks: samples taken on the virtual clock (see [`crate::telemetry`]).
//! The loop calls [`Simulation::sample_telemetry`] when it moves the clock, counts passes as
//! they end, and [`Simulation::finish_telemetry`] after its last event; none of it runs when
//! the collector carries no telemetry.

use super::*;
use crate::telemetry::{ClusterSample, WorkerSample};

impl Simulation<'_, '_> {
    /// Emits every sample due at or before `now` (before `now`'s events apply).
    pub(super) fn sample_telemetry(&mut self, now: f64) {
        while self.collector.telemetry.as_ref().is_some_and(|t| t.next_ms <= now) {
            self.emit_sample();
        }
    }

    /// After the last event: the samples up to it and one more that closes its interval.
    pub(super) fn finish_telemetry(&mut self) {
        if self.collector.telemetry.is_some() {
            self.sample_telemetry(self.now);
            self.emit_sample();
        }
    }

    fn emit_sample(&mut self) {
        let Some(mut t) = self.collector.telemetry.take() else { return };
        let mut rows = std::mem::take(&mut t.rows);
        rows.clear();
        let mut router_queue = 0;
        for (p, pool) in self.pools.iter().enumerate() {
            router_queue += pool.placer.queued() as u64;
            let dp = pool.spec.dp();
            for (w, worker) in pool.workers.iter().enumerate() {
                for (r, rank) in worker.ranks.iter().enumerate() {
                    let engine = &rank.engine;
                    let blocks = engine.config().num_gpu_blocks.max(1) as f64;
                    let counters = engine.counters();
                    let (lookups, hits) =
                        t.prefix_delta(p, w * dp + r, (counters.prefix_queries, counters.prefix_hits));
                    let mut row = WorkerSample {
                        pool: Some(pool.spec.role),
                        worker: w as u32,
                        dp_rank: r as u32,
                        running: engine.num_running() as u32,
                        waiting: engine.num_waiting() as u32,
                        kv_usage: engine.active_blocks() as f64 / blocks,
                        prefix_lookup_tokens: lookups,
                        prefix_hit_tokens: hits,
                        ..WorkerSample::default()
                    };
                    t.take(p, w * dp + r, &mut row);
                    rows.push(row);
                }
            }
        }
        let totals = &self.collector.totals;
        let now = (totals.num_requests, totals.completed, totals.rejected);
        let seen = std::mem::replace(&mut t.totals_seen, now);
        // Workers provisioned now (starting, serving or draining; an autoscaler changes them).
        let (prefill_workers, decode_workers) = match self.pools.as_slice() {
            [agg] => (0, agg.lifecycle.up() as u32),
            [prefill, decode, ..] => (prefill.lifecycle.up() as u32, decode.lifecycle.up() as u32),
            [] => (0, 0),
        };
        let cluster = ClusterSample {
            t_ms: t.next_ms,
            interval_ms: t.interval_ms,
            arrivals: now.0 - seen.0,
            completions: now.1 - seen.1,
            rejections: now.2 - seen.2,
            router_queue,
            waiting_admission: self.collector.waiting_for_admission(),
            prefill_workers,
            decode_workers,
        };
        t.sink.sample(&cluster, &rows);
        t.rows = rows;
        t.index += 1;
        t.next_ms = t.index as f64 * t.interval_ms;
        self.collector.telemetry = Some(t);
    }
}
