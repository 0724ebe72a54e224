//! SGLang's frontend stages on a language worker (aisimulate's
//! `engine.workers.<aggregated|prefill>.frontend`): after the router has placed a request on a
//! worker, it crosses that worker's stages in order (the tokenizer manager's multimodal
//! processing, its send, the scheduler's receive preparation, ...) and only then reaches the
//! worker's scheduler.
//!
//! Each stage is a pool of `workers` slots serving requests first come, first served; a request
//! waits in the stage's queue while every slot is taken. The requests in service share the pool
//! (processor sharing): while `c` of them are in service, each progresses at the rate of one
//! request per `service_ms · concurrency_scale[c - 1]` ms (`service_ms` when the scale is empty),
//! so a request's time in service depends on the concurrency it meets along the way, not only
//! when it starts. Progress is kept as the fraction of the service still to do and settled at
//! every instant of the run, which is where the reference settles it too (its last bits
//! depend on that).

use std::collections::VecDeque;

use super::Simulation;
use servesim_engine::EngineRequest;

/// One frontend stage: `workers` slots, a request's service time alone, and the scale of that
/// time at each concurrency (entry `c - 1` while `c` requests share the pool; empty: 1).
#[derive(Clone, Debug, PartialEq)]
pub struct FrontendStage {
    pub workers: u32,
    pub service_ms: f64,
    pub concurrency_scale: Vec<f64>,
}

impl FrontendStage {
    /// A request's service time while `c` (≥ 1) requests share the pool.
    fn service_at(&self, c: usize) -> f64 {
        self.service_ms * self.concurrency_scale.get(c - 1).copied().unwrap_or(1.0)
    }
}

/// A request inside a worker's frontend.
pub(super) struct Job {
    pub id: u64,
    pub request: EngineRequest,
    /// The fraction of its current stage's service still to do (1 while it queues).
    remaining: f64,
}

/// One stage's state: the requests in service (in the order they started) and those queued.
struct StageState {
    serving: Vec<Job>,
    queue: VecDeque<Job>,
}

/// The frontend of one worker: its stages' states, settled up to `settled_ms`.
pub(super) struct WorkerFrontend {
    stages: Vec<StageState>,
    settled_ms: f64,
}

impl WorkerFrontend {
    pub fn new(stages: usize, now: f64) -> WorkerFrontend {
        let stages = (0..stages).map(|_| StageState { serving: Vec::new(), queue: VecDeque::new() }).collect();
        WorkerFrontend { stages, settled_ms: now }
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.stages.iter().all(|s| s.serving.is_empty() && s.queue.is_empty())
    }

    /// When the next request finishes a stage (None while the frontend is empty).
    pub fn next_done_ms(&self, spec: &[FrontendStage]) -> Option<f64> {
        let mut next: Option<f64> = None;
        for (state, stage) in self.stages.iter().zip(spec) {
            let c = state.serving.len();
            if c == 0 {
                continue;
            }
            let d = stage.service_at(c);
            for job in &state.serving {
                let at = self.settled_ms + job.remaining * d;
                next = Some(next.map_or(at, |n: f64| n.min(at)));
            }
        }
        next
    }

    /// A request placed on the worker at `now` enters the first stage; `settle` must have run
    /// at `now` first.
    pub fn enter(&mut self, spec: &[FrontendStage], id: u64, request: EngineRequest) {
        self.join(spec, 0, Job { id, request, remaining: 1.0 });
    }

    fn join(&mut self, spec: &[FrontendStage], stage: usize, job: Job) {
        let state = &mut self.stages[stage];
        if state.serving.len() < spec[stage].workers.max(1) as usize {
            state.serving.push(job);
        } else {
            state.queue.push_back(job);
        }
    }

    /// Brings the frontend to `now`: the requests whose stage ends by then move on (into the next
    /// stage, or out into `out`, in the order they finish), the others progress by the elapsed
    /// time at the concurrency they had, and queued requests take the freed slots. A stage that
    /// takes no time is crossed at once.
    pub fn settle(&mut self, spec: &[FrontendStage], now: f64, out: &mut Vec<Job>) {
        let elapsed = now - self.settled_ms;
        let mut done: VecDeque<(usize, Job)> = VecDeque::new();
        for (i, (state, stage)) in self.stages.iter_mut().zip(spec).enumerate() {
            let c = state.serving.len();
            if c == 0 {
                continue;
            }
            let d = stage.service_at(c);
            let settled = self.settled_ms;
            let mut k = 0;
            while k < state.serving.len() {
                let job = &mut state.serving[k];
                if settled + job.remaining * d <= now {
                    done.push_back((i, state.serving.remove(k)));
                    continue;
                }
                if elapsed > 0.0 {
                    job.remaining -= elapsed / d;
                }
                k += 1;
            }
        }
        self.settled_ms = now;
        while !done.is_empty() {
            while let Some((i, mut job)) = done.pop_front() {
                if i + 1 == spec.len() {
                    out.push(job);
                } else {
                    job.remaining = 1.0;
                    self.join(spec, i + 1, job);
                }
            }
            // Freed slots take queued requests; one starting a stage that takes no time is
            // through it at once.
            for (i, (state, stage)) in self.stages.iter_mut().zip(spec).enumerate() {
                while state.serving.len() < stage.workers.max(1) as usize {
                    let Some(job) = state.queue.pop_front() else { break };
                    state.serving.push(job);
                }
                if !state.serving.is_empty() && stage.service_at(state.serving.len()) == 0.0 {
                    done.extend(state.serving.drain(..).map(|job| (i, job)));
                }
            }
        }
    }
}

impl Simulation<'_, '_> {
    /// When the next request finishes a stage of some worker's frontend.
    pub(super) fn next_stage_done_ms(&self) -> Option<f64> {
        let spec = &self.config.frontend_stages;
        self.frontends.iter().flatten().filter_map(|f| f.next_done_ms(spec)).reduce(f64::min)
    }

    /// Whether requests placed on pool `pool` cross frontend stages first.
    pub(super) fn has_frontend(&self, pool: usize) -> bool {
        pool == 0 && !self.config.frontend_stages.is_empty()
    }

    /// Request `id`, placed on worker `w` of the prompt pool now, enters the worker's frontend
    /// (and leaves it at once if its stages take no time).
    pub(super) fn enter_frontend(&mut self, w: usize, id: u64, request: EngineRequest) {
        let now = self.now;
        let spec = &self.config.frontend_stages;
        if self.frontends.len() <= w {
            self.frontends.resize_with(w + 1, || None);
        }
        let frontend = self.frontends[w].get_or_insert_with(|| WorkerFrontend::new(spec.len(), now));
        let mut out = Vec::new();
        frontend.settle(spec, now, &mut out);
        frontend.enter(spec, id, request);
        frontend.settle(spec, now, &mut out);
        self.leave_frontend(w, out);
    }

    /// Brings every worker's frontend to now; the requests through it reach their scheduler.
    /// The reference settles the stages' progress when a request enters or leaves a stage and
    /// when a pass that computed tokens ends, not at other instants (such as the end of a host
    /// loop pass that only holds finished requests): progress is settled at those instants
    /// only, which decides its last bits.
    pub(super) fn settle_frontends(&mut self) {
        if self.frontends.is_empty() {
            self.stage_ticks.clear();
            return;
        }
        let now = self.now;
        let mut ticks = std::mem::take(&mut self.stage_ticks);
        let spec = &self.config.frontend_stages;
        let mut out = Vec::new();
        for w in 0..self.frontends.len() {
            let Some(frontend) = self.frontends[w].as_mut() else { continue };
            if !ticks.contains(&w) && frontend.next_done_ms(spec).is_none_or(|t| t > now) {
                continue;
            }
            frontend.settle(spec, now, &mut out);
            if !out.is_empty() {
                self.leave_frontend(w, std::mem::take(&mut out));
            }
        }
        // The buffer is kept for the next instant's ticks.
        ticks.clear();
        self.stage_ticks = ticks;
    }

    /// Requests out of worker `w`'s frontend now are submitted to its scheduler, in the order
    /// they came out.
    fn leave_frontend(&mut self, w: usize, out: Vec<Job>) {
        if out.is_empty() {
            return;
        }
        self.moved_since_retry = true;
        self.settle_stretch(0, w);
        self.wake(0, w);
        for job in out {
            self.collector.staged(job.id, self.now);
            self.pools[0].workers[w].ranks[0].engine.submit(job.request);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use servesim_engine::Prompt;

    fn request(id: u64) -> EngineRequest {
        EngineRequest::new(id, Prompt::Tokens(vec![1; 4].into()), 2, 7)
    }

    /// Runs requests arriving at `arrivals` through `spec` and returns when each leaves, settling
    /// at every arrival and every stage end, as the replay's loop does.
    fn run(spec: &[FrontendStage], arrivals: &[f64]) -> Vec<f64> {
        let mut f = WorkerFrontend::new(spec.len(), 0.0);
        let mut left = vec![f64::NAN; arrivals.len()];
        let mut next = 0;
        let mut out = Vec::new();
        loop {
            let arrival = arrivals.get(next).copied();
            let now = match (arrival, f.next_done_ms(spec)) {
                (Some(a), Some(d)) => a.min(d),
                (Some(a), None) => a,
                (None, Some(d)) => d,
                (None, None) => break,
            };
            f.settle(spec, now, &mut out);
            while arrivals.get(next) == Some(&now) {
                f.enter(spec, next as u64, request(next as u64));
                next += 1;
            }
            f.settle(spec, now, &mut out);
            for job in out.drain(..) {
                left[job.id as usize] = now;
            }
        }
        assert!(f.is_empty());
        left
    }

    fn stage(workers: u32, service_ms: f64, scale: &[f64]) -> FrontendStage {
        FrontendStage { workers, service_ms, concurrency_scale: scale.to_vec() }
    }

    /// One slot: first come, first served.
    #[test]
    fn one_slot_serves_in_arrival_order() {
        let left = run(&[stage(1, 50.0, &[])], &[0.0, 10.0, 20.0]);
        assert_eq!(left, vec![50.0, 100.0, 150.0]);
    }

    /// Two slots sharing the pool at twice the time: a request slows down when a second one
    /// starts and speeds up when it is alone again (the reference's digits, last bits included,
    /// from a fixed-timing probe of these arrivals on one two-slot stage; see the engine README's
    /// "SGLang frontend stages").
    #[test]
    fn shared_slots_progress_at_the_concurrency_they_meet() {
        let left = run(&[stage(2, 50.0, &[1.0, 2.0])], &[0.0, 10.0, 20.0, 30.0, 40.0]);
        assert_eq!(left, vec![90.00000000000001, 110.00000000000001, 190.0, 210.00000000000003, 250.0]);
    }

    /// Stages in a row, and stages that take no time are crossed at once.
    #[test]
    fn stages_are_crossed_in_order() {
        let spec = [stage(2, 30.0, &[1.0, 1.5]), stage(1, 7.0, &[]), stage(1, 3.0, &[])];
        assert_eq!(run(&spec, &[0.0, 10.0, 20.0, 30.0, 40.0]), vec![50.0, 65.0, 95.0, 110.0, 130.0]);
        let spec = [stage(1, 0.0, &[]), stage(2, 0.0, &[1.0, 2.0]), stage(1, 5.0, &[])];
        assert_eq!(run(&spec, &[0.0, 10.0, 20.0]), vec![5.0, 15.0, 25.0]);
    }
}
