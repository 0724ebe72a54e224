//! The seam through which an autoscaler (the planner) acts on a run: at its tick times the loop
//! hands it a settled snapshot of the cluster and applies the worker counts it asks for, adding
//! workers (they take requests once started) and draining others (no new requests; they stop
//! when their requests are done).

use std::collections::BTreeMap;

use servesim_engine::{PassOutput, Role};
use servesim_planner::{Fpm, Queued, Scheduled, Snapshot, Traffic};

use super::*;

/// A policy consulted at tick times on the virtual clock.
pub trait Autoscaler {
    /// The first tick, ms (None: no ticks).
    fn first_tick_ms(&mut self) -> Option<f64>;

    /// One tick: the cluster as it is now; returns the targets and the next tick.
    fn on_tick(&mut self, ordinal: u64, snapshot: &Snapshot) -> ScaleDecision;

    /// A worker changed state (added, ready, draining, stopped).
    fn lifecycle(&mut self, _op: &LifecycleOp) {}

    /// Why the autoscaler cannot go on (its decisions would no longer be the ones it models);
    /// the run stops with it.
    fn error(&self) -> Option<String> {
        None
    }
}

/// Targets are non-draining workers (starting + active); `None` leaves a pool as it is.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ScaleDecision {
    pub target_prefill: Option<usize>,
    pub target_decode: Option<usize>,
    pub next_tick_ms: Option<f64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    Added,
    Ready,
    Draining,
    Stopped,
}

impl Transition {
    pub fn name(self) -> &'static str {
        match self {
            Transition::Added => "worker_added",
            Transition::Ready => "worker_ready",
            Transition::Draining => "worker_draining",
            Transition::Stopped => "worker_stopped",
        }
    }
}

/// One worker lifecycle transition.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LifecycleOp {
    pub at_ms: f64,
    /// `agg`, `prefill` or `decode`.
    pub pool: &'static str,
    pub worker: u32,
    pub transition: Transition,
    /// The tick whose decision caused it (None for a worker finishing its drain later).
    pub tick: Option<u64>,
}

/// An idle rank republishes an empty snapshot this often (the reference's idle cadence).
const IDLE_FPM_INTERVAL_MS: f64 = 1000.0;

/// A rank's last published snapshot (`None`: none yet) and when it was published, ms.
type Published = (Option<Fpm>, f64);

/// The loop's side of an autoscaled run.
pub(super) struct Scaling<'a> {
    pub hook: &'a mut dyn Autoscaler,
    pub next_tick_ms: Option<f64>,
    ordinal: u64,
    /// Per pool: (worker, rank) → (last snapshot, when it was published); `None` until a
    /// worker that has just become ready publishes its first one.
    fpms: Vec<BTreeMap<(u32, u32), Published>>,
    window: Window,
}

/// Traffic since the last tick.
#[derive(Default)]
struct Window {
    start_ms: f64,
    arrivals: u64,
    /// Completed requests (the weight of the mean lengths).
    shapes: u64,
    /// Their lengths and latencies, and the router's hit rates, counted as telemetry counts them.
    counts: crate::telemetry::Traffic,
}

impl<'a> Scaling<'a> {
    pub fn new(hook: &'a mut dyn Autoscaler, pools: usize) -> Scaling<'a> {
        let next_tick_ms = hook.first_tick_ms().filter(|t| t.is_finite());
        Scaling { hook, next_tick_ms, ordinal: 0, fpms: vec![BTreeMap::new(); pools], window: Window::default() }
    }

    pub fn arrival(&mut self) {
        self.window.arrivals += 1;
    }

    pub fn hit_rate(&mut self, rate: f64) {
        self.window.counts.add_router_hit(rate);
    }
}

fn pool_name(role: Role) -> &'static str {
    match role {
        Role::Aggregated => "agg",
        Role::Prefill => "prefill",
        Role::Decode => "decode",
    }
}

fn u32_sat(x: u64) -> u32 {
    x.min(u32::MAX as u64) as u32
}

impl Simulation<'_, '_> {
    /// Records rank `rank` of worker `w`'s pass for the planner, at the pass's end (now):
    /// what the rank ran (`None`: it took part with nothing to run).
    pub(super) fn record_fpm(&mut self, pool: usize, w: usize, rank: usize, out: Option<&PassOutput>) {
        let Some(s) = self.scaling.as_mut() else { return };
        let worker = &self.pools[pool].workers[w];
        // The queue as it was when the pass was scheduled.
        let q = worker.ranks[rank].queue;
        let scheduled = match out {
            Some(out) => Scheduled {
                num_prefill_requests: out.prefill.batch,
                sum_prefill_tokens: u32_sat(out.prefill_tokens),
                var_prefill_length: 0.0,
                sum_prefill_kv_tokens: u32_sat(out.prefill.total_prefix),
                num_decode_requests: out.decode.batch,
                sum_decode_kv_tokens: u32_sat(out.decode.context_tokens),
                var_decode_kv_tokens: 0.0,
            },
            None => Scheduled::default(),
        };
        let fpm = Fpm {
            worker: w as u32,
            dp_rank: rank as u32,
            // Attention-DP ranks step together: every rank's pass lasts as long as the
            // worker's, which ends with its slowest rank.
            wall_time: (self.now - worker.pass_start) / 1000.0,
            scheduled,
            queued: Queued {
                num_prefill_requests: q.prefill_requests,
                sum_prefill_tokens: u32_sat(q.prefill_tokens),
                var_prefill_length: 0.0,
                num_decode_requests: q.decode_requests,
                sum_decode_kv_tokens: u32_sat(q.decode_kv_tokens),
                var_decode_kv_tokens: 0.0,
            },
        };
        s.fpms[pool].insert((w as u32, rank as u32), (Some(fpm), self.now));
    }

    /// A request leaves: its shape and latencies join the window (completed requests only).
    pub(super) fn record_finish(&mut self, id: u64, completed: bool) {
        let Some(s) = self.scaling.as_mut() else { return };
        if !completed {
            return;
        }
        let Some(r) = self.collector.live(id) else { return };
        s.window.shapes += 1;
        s.window.counts.add_completion(r);
    }

    /// Runs the tick due now, if any, and applies its decision.
    pub(super) fn scaling_tick(&mut self) {
        let now = self.now;
        let Some(s) = self.scaling.as_mut() else { return };
        if s.next_tick_ms.is_none_or(|t| t > now) {
            return;
        }
        let ordinal = s.ordinal;
        s.ordinal += 1;
        for p in 0..self.pools.len() {
            for w in 0..self.pools[p].workers.len() {
                self.retire_if_drained(p, w);
            }
        }
        let Some(s) = self.scaling.as_mut() else { return };
        let w = std::mem::take(&mut s.window);
        let mean = |sum: f64, n: u64| if n > 0 { sum / n as f64 } else { 0.0 };
        let c = &w.counts;
        let traffic = Traffic {
            duration_s: (now - w.start_ms) / 1000.0,
            num_req: w.arrivals as f64,
            avg_isl: mean(c.completed_input_tokens as f64, w.shapes),
            avg_osl: mean(c.completed_output_tokens as f64, w.shapes),
            shape_count: w.shapes as f64,
            avg_ttft_ms: mean(c.ttft_sum_ms, c.ttft_count),
            ttft_count: c.ttft_count as f64,
            avg_itl_ms: mean(c.itl_sum_ms, c.itl_count),
            itl_count: c.itl_count as f64,
            avg_kv_hit_rate: mean(c.router_hit_sum, c.router_hit_count),
            hit_rate_count: c.router_hit_count as f64,
            avg_accept_length: None,
            accept_length_count: 0.0,
        };
        s.window.start_ms = now;
        let mut snap = Snapshot { now_s: now / 1000.0, traffic, ..Snapshot::default() };
        let n_pools = self.pools.len();
        for p in 0..n_pools {
            let pool = &self.pools[p];
            let dp = pool.spec.dp() as u32;
            let (mut active, mut starting, mut draining) = (Vec::new(), Vec::new(), Vec::new());
            for wi in 0..pool.lifecycle.len() {
                match pool.lifecycle.state(wi) {
                    WorkerState::Active { .. } => active.push(wi as u32),
                    WorkerState::Starting { .. } => starting.push(wi as u32),
                    WorkerState::Draining { .. } => draining.push(wi as u32),
                    WorkerState::Stopped => {}
                }
            }
            // Latest snapshot of every active rank; a rank silent for a second republishes
            // an idle one. A worker that became ready less than a second ago and has not
            // finished a pass has published nothing yet (the planner then sees fewer
            // snapshots than ready workers: `worker_count_mismatch`).
            let buf = &mut s.fpms[p];
            buf.retain(|(wk, r), _| *r < dp && active.binary_search(wk).is_ok());
            let mut fpms = Vec::new();
            for &wk in &active {
                for r in 0..dp {
                    let since = match pool.lifecycle.state(wk as usize) {
                        WorkerState::Active { since_ms } => since_ms,
                        _ => now,
                    };
                    let entry = buf.entry((wk, r)).or_insert((None, since));
                    let elapsed = now - entry.1;
                    if elapsed >= IDLE_FPM_INTERVAL_MS {
                        entry.1 += (elapsed / IDLE_FPM_INTERVAL_MS).floor() * IDLE_FPM_INTERVAL_MS;
                        entry.0 = Some(servesim_planner::idle_fpm(wk, r));
                    }
                    fpms.extend(entry.0);
                }
            }
            let decode_side = p + 1 == n_pools;
            if decode_side {
                (snap.active_decode, snap.starting_decode, snap.draining_decode, snap.decode_fpms) =
                    (active, starting, draining, fpms);
            } else {
                (snap.active_prefill, snap.starting_prefill, snap.draining_prefill, snap.prefill_fpms) =
                    (active, starting, draining, fpms);
            }
        }
        let decision = s.hook.on_tick(ordinal, &snap);
        s.next_tick_ms = decision.next_tick_ms.filter(|t| t.is_finite() && *t > now);
        let targets = [decision.target_prefill, decision.target_decode];
        for p in 0..n_pools {
            let target = if n_pools == 1 { targets[1] } else { targets[p] };
            if let Some(t) = target {
                self.scale_pool(p, t, ordinal);
            }
        }
    }

    fn op(&mut self, pool: usize, worker: usize, transition: Transition, tick: Option<u64>) {
        let at_ms = self.now;
        let name = pool_name(self.pools[pool].spec.role);
        if let Some(s) = self.scaling.as_mut() {
            s.hook.lifecycle(&LifecycleOp { at_ms, pool: name, worker: worker as u32, transition, tick });
        }
    }

    /// Brings pool `p`'s non-draining workers to `target`: adds workers, or drains the newest.
    fn scale_pool(&mut self, p: usize, target: usize, tick: u64) {
        let now = self.now;
        let current = {
            let l = &self.pools[p].lifecycle;
            (0..l.len())
                .filter(|&w| matches!(l.state(w), WorkerState::Active { .. } | WorkerState::Starting { .. }))
                .count()
        };
        for _ in current..target {
            let w = self.add_worker(p);
            self.op(p, w, Transition::Added, Some(tick));
            let startup_ms = self.pools[p].spec.deployment.startup_time_s.unwrap_or(0.0) * 1000.0;
            if startup_ms > 0.0 {
                self.schedule(now + startup_ms, Event::WorkerReady { pool: p as u8, worker: w as u32 });
            } else {
                self.worker_ready(p, w, Some(tick));
            }
        }
        for _ in target..current {
            // The newest non-draining worker leaves first (a starting one stops at once).
            let l = &self.pools[p].lifecycle;
            let Some(w) = (0..l.len())
                .rev()
                .find(|&w| matches!(l.state(w), WorkerState::Active { .. } | WorkerState::Starting { .. }))
            else {
                break;
            };
            self.pools[p].placer.set_active(w, false);
            self.pools[p].lifecycle.drain(w, now);
            self.op(p, w, Transition::Draining, Some(tick));
            self.retire_if_drained(p, w);
        }
    }

    /// A started worker takes requests from now on.
    pub(super) fn worker_ready(&mut self, p: usize, w: usize, tick: Option<u64>) {
        let now = self.now;
        if self.pools[p].lifecycle.ready(w, now) {
            self.pools[p].placer.set_active(w, true);
            if let Some(s) = self.scaling.as_mut() {
                // Its ranks publish their first snapshot at the end of their first pass, or
                // an idle one after a second without passes.
                for r in 0..self.pools[p].spec.dp() as u32 {
                    s.fpms[p].insert((w as u32, r), (None, now));
                }
            }
            self.op(p, w, Transition::Ready, tick);
        }
    }

    /// A draining worker with nothing left stops; the router forgets it.
    pub(super) fn retire_if_drained(&mut self, p: usize, w: usize) {
        if !matches!(self.pools[p].lifecycle.state(w), WorkerState::Draining { .. } | WorkerState::Stopped) {
            return;
        }
        let worker = &self.pools[p].workers[w];
        let idle = !worker.busy
            && worker.pending_releases.is_empty()
            && worker.pending_activations.is_empty()
            && worker.ranks.iter().all(|r| !r.engine.has_work() && r.engine.num_waiting() == 0);
        if !idle || self.holds_requests(p, w) {
            return;
        }
        let was_draining = matches!(self.pools[p].lifecycle.state(w), WorkerState::Draining { .. });
        self.pools[p].lifecycle.stop(w, self.now);
        self.pools[p].placer.remove_worker(w);
        if was_draining {
            self.op(p, w, Transition::Stopped, None);
        }
    }

    /// Whether a request in flight still needs worker `w` of pool `p` (a held prompt's KV).
    fn holds_requests(&self, p: usize, w: usize) -> bool {
        let dp = self.pools[p].spec.dp();
        let role = self.pools[p].spec.role;
        self.flights.values().any(|f| {
            let t = match role {
                Role::Decode => f.decode_target,
                _ => f.prefill_target,
            };
            t.is_some_and(|t| t / dp == w)
                && (role != Role::Prefill || f.handoff.as_ref().is_none_or(|h| h.holds_source()))
        })
    }

    /// Worker-seconds per pool (prefill, decode) integrated over the lifecycle until now.
    pub(super) fn worker_seconds(&self) -> (f64, f64) {
        let secs = |p: &Pool| p.lifecycle.worker_ms(self.now) / 1000.0;
        match self.pools.as_slice() {
            [agg] => (0.0, secs(agg)),
            [prefill, decode] => (secs(prefill), secs(decode)),
            _ => (0.0, 0.0),
        }
    }
}
