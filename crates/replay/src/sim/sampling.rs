//! The loop's telemetry hooks: samples taken on the virtual clock (see [`crate::telemetry`]).
//! The loop calls [`Simulation::sample_telemetry`] when it moves the clock and
//! [`Simulation::sample_after_arrivals`] once an instant's arrivals are placed, counts passes as
//! they end, and [`Simulation::finish_telemetry`] after its last event; none of it runs when
//! the collector carries no telemetry.
//!
//! Two timings: servesim's own samples (the CLI's `--telemetry`) see the state just before
//! their instant's events; Dynamo-shaped samples (the Python API's) see it after their
//! instant's events and arrivals, before the passes that start then, with a baseline sample
//! at t = 0 first and a final one at the run's end.

use super::*;
use crate::telemetry::{ClusterSample, SampleKind, WorkerPhase, WorkerSample};
use servesim_cluster::WorkerState;

/// A rank's gauges as a sample reads them.
#[derive(Clone, Copy, Debug)]
pub(super) struct Gauges {
    running: u32,
    waiting: u32,
    active_blocks: u32,
    inactive_blocks: u32,
    /// Cumulative preemptions (counted when the pass that preempts ends).
    preemptions: u64,
}

impl Gauges {
    pub(super) fn of(engine: &Engine) -> Gauges {
        Gauges {
            running: engine.num_running() as u32,
            waiting: engine.num_waiting() as u32,
            active_blocks: engine.active_blocks(),
            inactive_blocks: engine.inactive_blocks(),
            preemptions: engine.counters().preemptions,
        }
    }
}

impl Simulation<'_, '_> {
    fn dynamo_telemetry(&self) -> bool {
        self.collector.telemetry.as_ref().is_some_and(|t| t.dynamo)
    }

    /// Emits every sample due before `now` (servesim's own: at or before `now`), before `now`'s
    /// events apply.
    pub(super) fn sample_telemetry(&mut self, now: f64) {
        if self.dynamo_telemetry() {
            if now > 0.0 && self.collector.telemetry.as_ref().is_some_and(|t| !t.baseline_done) {
                self.emit_sample(SampleKind::Baseline, 0.0);
            }
            while self.collector.telemetry.as_ref().is_some_and(|t| t.next_ms < now) {
                self.emit_sample(SampleKind::Periodic, 0.0);
            }
            return;
        }
        while self.collector.telemetry.as_ref().is_some_and(|t| t.next_ms <= now) {
            self.emit_sample(SampleKind::Periodic, 0.0);
        }
    }

    /// Dynamo-shaped samples due at `now`, once its events and arrivals are in.
    pub(super) fn sample_after_arrivals(&mut self, now: f64) {
        if !self.dynamo_telemetry() {
            return;
        }
        if self.collector.telemetry.as_ref().is_some_and(|t| !t.baseline_done) {
            self.emit_sample(SampleKind::Baseline, 0.0);
        }
        while self.collector.telemetry.as_ref().is_some_and(|t| t.next_ms <= now) {
            self.emit_sample(SampleKind::Periodic, 0.0);
        }
    }

    /// After the last event: the samples up to it and one more that closes its interval (for
    /// Dynamo-shaped samples, the final sample at the last event's time).
    pub(super) fn finish_telemetry(&mut self) {
        if self.dynamo_telemetry() {
            self.sample_after_arrivals(self.now);
            self.emit_sample(SampleKind::Final, self.now);
        } else if self.collector.telemetry.is_some() {
            self.sample_telemetry(self.now);
            self.emit_sample(SampleKind::Periodic, 0.0);
        }
    }

    /// Emits one sample; `end_ms` is a final sample's time.
    fn emit_sample(&mut self, kind: SampleKind, end_ms: f64) {
        let Some(mut t) = self.collector.telemetry.take() else { return };
        let baseline = kind == SampleKind::Baseline;
        let mut rows = std::mem::take(&mut t.rows);
        rows.clear();
        let mut router_queue = 0;
        let mut router_pending = [0, 0];
        for (p, pool) in self.pools.iter().enumerate() {
            let queued = pool.placer.queued() as u64;
            router_queue += queued;
            router_pending[usize::from(pool.spec.role != Role::Prefill)] += queued;
            let dp = pool.spec.dp();
            for (w, worker) in pool.workers.iter().enumerate() {
                let state = match pool.lifecycle.state(w) {
                    WorkerState::Starting { .. } => WorkerPhase::Starting,
                    WorkerState::Active { .. } => WorkerPhase::Active,
                    WorkerState::Draining { .. } => WorkerPhase::Draining,
                    WorkerState::Stopped => WorkerPhase::Stopped,
                };
                for (r, rank) in worker.ranks.iter().enumerate() {
                    let engine = &rank.engine;
                    let total = engine.config().num_gpu_blocks;
                    let blocks = total.max(1) as f64;
                    let mut g = Gauges::of(engine);
                    // As Dynamo's replay reads them: behind a KV router the state the running
                    // pass was scheduled in (the engine publishes it to the router then); else,
                    // during a pass, the state before it, plus the requests that came since.
                    // Preemptions count when the pass that made them ends.
                    let before_pass = if t.dynamo && worker.busy && rank.ran { rank.before_pass } else { None };
                    if let Some((before, after)) = before_pass {
                        let preemptions = before.preemptions;
                        if pool.placer.is_kv() {
                            g.preemptions = preemptions;
                        } else {
                            let load = (g.running + g.waiting) as usize;
                            let came = load - after.min(load);
                            g = Gauges { waiting: before.waiting + came as u32, ..before };
                        }
                    }
                    let mut row = WorkerSample {
                        pool: Some(pool.spec.role),
                        worker: w as u32,
                        dp_rank: r as u32,
                        running: g.running,
                        waiting: g.waiting,
                        kv_usage: if t.dynamo {
                            g.active_blocks as f64 / blocks
                        } else {
                            engine.active_blocks() as f64 / blocks
                        },
                        active_blocks: g.active_blocks,
                        inactive_blocks: g.inactive_blocks,
                        total_blocks: total,
                        state,
                        ..WorkerSample::default()
                    };
                    if !baseline {
                        let counters = engine.counters();
                        let target = w * dp + r;
                        let (lookups, hits) =
                            t.prefix_delta(p, target, (counters.prefix_queries, counters.prefix_hits));
                        row.prefix_lookup_tokens = lookups;
                        row.prefix_hit_tokens = hits;
                        row.preemptions = t.preemption_delta(p, target, g.preemptions);
                        t.take(p, target, &mut row);
                    }
                    rows.push(row);
                }
            }
        }
        let totals = &self.collector.totals;
        // Workers provisioned now (starting, serving or draining; an autoscaler changes them).
        let (prefill_workers, decode_workers) = match self.pools.as_slice() {
            [agg] => (0, agg.lifecycle.up() as u32),
            [prefill, decode, ..] => (prefill.lifecycle.up() as u32, decode.lifecycle.up() as u32),
            [] => (0, 0),
        };
        let t_ms = match kind {
            SampleKind::Baseline => 0.0,
            SampleKind::Periodic => t.next_ms,
            SampleKind::Final => end_ms,
        };
        let mut cluster = ClusterSample {
            t_ms,
            interval_ms: t.interval_ms,
            router_queue,
            waiting_admission: self.collector.waiting_for_admission(),
            prefill_workers,
            decode_workers,
            kind,
            ordinal: t.emitted,
            interval_start_ms: t.last_ms,
            router_pending,
            ..ClusterSample::default()
        };
        if !baseline {
            let now = (totals.num_requests, totals.completed, totals.rejected);
            let seen = std::mem::replace(&mut t.totals_seen, now);
            cluster.arrivals = now.0 - seen.0;
            cluster.completions = now.1 - seen.1;
            cluster.rejections = now.2 - seen.2;
            let forwards = (totals.decode_forwards, totals.decode_tokens);
            let seen = std::mem::replace(&mut t.forwards_seen, forwards);
            cluster.traffic = std::mem::take(&mut t.traffic);
            cluster.traffic.decode_forwards = forwards.0 - seen.0;
            cluster.traffic.decode_tokens = forwards.1 - seen.1;
        }
        t.sink.sample(&cluster, &rows);
        t.rows = rows;
        t.emitted += 1;
        t.last_ms = t_ms;
        if baseline {
            t.baseline_done = true;
        } else if kind == SampleKind::Periodic {
            t.index += 1;
            t.next_ms = t.index as f64 * t.interval_ms;
        }
        self.collector.telemetry = Some(t);
    }
}
