//! The load driver: releases the turns of a workload as the virtual clock advances and turns
//! complete, by timestamp or under a closed-loop cap on active sessions.

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use servesim_engine::Prompt;

use crate::agentic::driver::GraphState;
use crate::session::{Ready, SessionSpec};
use crate::time::Time;
use crate::workload::{SessionStream, Workload};

/// How requests are released.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LoadMode {
    /// Sessions start at their timestamps (shifted so the first is at 0) divided by `speedup`;
    /// think times are divided by `speedup` too.
    Timestamps { speedup: f64 },
    /// Closed loop: at most `max_sessions` sessions active; a new one starts when one finishes.
    /// Timestamps are ignored and think times are not scaled.
    Concurrency { max_sessions: u32 },
}

/// Releases the turns of a workload as time advances and turns complete. Sessions are taken
/// from the workload as they start and dropped when their last turn completes; agentic graphs
/// are released node by node as their dependencies fire.
pub struct LoadDriver<'w> {
    mode: LoadMode,
    stream: SessionStream<'w>,
    /// Timestamp mode: the first session's start, time zero of the run.
    origin_ms: f64,
    /// Started sessions by number (the order they started in), with their next turn.
    active: FxHashMap<u32, Active<'w>>,
    started: u32,
    /// Started sessions with a turn ready at a time, ordered by (time, session number).
    ready: BinaryHeap<Reverse<(Time, u32)>>,
    active_sessions: u32,
    in_flight: u32,
    /// Delta traces and aisimulate's synthetic sessions: prompts accumulate within a session.
    accumulate: bool,
    block_tokens: u32,
    graph: Option<GraphState>,
}

struct Active<'w> {
    spec: Cow<'w, SessionSpec>,
    next_turn: u32,
    /// Delta traces: everything the session said and generated so far.
    history: Vec<u32>,
    /// Delta traces: the output drawn for the turn in flight (see [`LoadDriver::planned_output`]).
    output: Option<Arc<[u32]>>,
}

impl<'w> LoadDriver<'w> {
    pub fn new(workload: &'w Workload, mode: LoadMode) -> Self {
        let stream = workload.stream();
        let origin_ms = stream.peek_start().unwrap_or(0.0);
        let mut d = LoadDriver {
            mode,
            stream,
            origin_ms,
            active: FxHashMap::default(),
            started: 0,
            ready: BinaryHeap::new(),
            active_sessions: 0,
            in_flight: 0,
            accumulate: workload.accumulates(),
            block_tokens: workload.block_tokens(),
            graph: match workload {
                Workload::Graph(g) => Some(GraphState::new(g.clone())),
                _ => None,
            },
        };
        if let LoadMode::Concurrency { .. } = mode {
            d.start_sessions(0.0);
        }
        d
    }

    /// Takes the next session from the stream and makes its first turn ready at `at_ms`.
    fn start_next(&mut self, at_ms: f64) -> bool {
        let Some(session) = self.stream.next() else {
            return false;
        };
        let number = self.started;
        self.started += 1;
        if session.turns.is_empty() {
            return true;
        }
        self.active_sessions += 1;
        self.active.insert(number, Active { spec: session, next_turn: 0, history: Vec::new(), output: None });
        self.ready.push(Reverse((Time(at_ms), number)));
        true
    }

    /// Timestamp mode: when the next session starts on the run's clock.
    fn next_start_ms(&self) -> Option<f64> {
        match self.mode {
            LoadMode::Timestamps { speedup } => self.stream.peek_start().map(|t| (t - self.origin_ms) / speedup),
            LoadMode::Concurrency { .. } => None,
        }
    }

    fn start_sessions(&mut self, now: f64) {
        match self.mode {
            LoadMode::Concurrency { max_sessions } => {
                while self.active_sessions < max_sessions && self.start_next(now) {}
            }
            LoadMode::Timestamps { .. } => {
                while let Some(t) = self.next_start_ms().filter(|&t| t <= now) {
                    self.start_next(t);
                }
            }
        }
    }

    /// Earliest time a turn becomes ready, if any is pending.
    pub fn next_ready_ms(&self) -> Option<f64> {
        if let Some(g) = &self.graph {
            return g.next_ready_ms();
        }
        let turn = self.ready.peek().map(|Reverse((t, _))| t.0);
        match (turn, self.next_start_ms()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Releases every turn ready at or before `now`, in (ready time, session) order.
    pub fn pop_ready(&mut self, now: f64, out: &mut Vec<Ready>) {
        if let Some(g) = &mut self.graph {
            g.pop_ready(now, out);
            return;
        }
        self.start_sessions(now);
        while let Some(&Reverse((Time(t), s))) = self.ready.peek() {
            if t > now {
                break;
            }
            self.ready.pop();
            let active = self.active.get_mut(&s).expect("ready sessions are active");
            let turn = active.next_turn;
            active.next_turn += 1;
            self.in_flight += 1;
            out.push(Ready { session: s, turn, arrival_ms: t });
        }
    }

    /// The session a released turn belongs to.
    pub fn session(&self, session: u32) -> &SessionSpec {
        match &self.graph {
            Some(g) => g.session(session),
            None => &self.active[&session].spec,
        }
    }

    /// The prompt of a released turn (delta traces: the session's history and the turn's tokens).
    pub fn prompt(&mut self, r: &Ready) -> Prompt {
        let block_tokens = self.block_tokens;
        if !self.accumulate {
            return self.session(r.session).turns[r.turn as usize].prompt(block_tokens);
        }
        let active = self.active.get_mut(&r.session).expect("released sessions are active");
        let turn = &active.spec.turns[r.turn as usize];
        for i in 0..turn.input_length {
            active.history.push(turn.blocks[(i / block_tokens) as usize]);
        }
        Prompt::Tokens(active.history.as_slice().into())
    }

    /// The output tokens a released turn is to generate, when they are fixed: the trace's
    /// `output_token_ids`, or, in a delta trace, tokens drawn now (what a turn generates is part
    /// of its session's next prompt). The draw is seeded by the session's start ordinal and the
    /// turn, so only turns in flight hold their tokens, and every run draws the same ones.
    pub fn planned_output(&mut self, r: &Ready) -> Option<Arc<[u32]>> {
        if let Some(out) = &self.session(r.session).turns[r.turn as usize].output_tokens {
            return Some(out.clone());
        }
        if !self.accumulate {
            return None;
        }
        use rand::{Rng, SeedableRng};
        let active = self.active.get_mut(&r.session).expect("released sessions are active");
        let seed = 0xD37A_0A7E_5EED_u64 ^ (u64::from(r.session) << 32 | u64::from(r.turn));
        let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(seed);
        let len = active.spec.turns[r.turn as usize].output_length;
        let out: Arc<[u32]> = (0..len).map(|_| rng.random::<u32>()).collect();
        active.output = Some(out.clone());
        Some(out)
    }

    /// Records that the in-flight turn of `session` ended at `now`: completed, or not (rejected).
    /// A rejected agentic request fails its play.
    pub fn on_complete(&mut self, session: u32, now: f64, completed: bool) {
        if let Some(g) = &mut self.graph {
            g.on_complete(session, now, completed);
            return;
        }
        self.in_flight -= 1;
        let active = self.active.get_mut(&session).expect("completed sessions are active");
        let next = active.next_turn;
        let drawn = active.output.take();
        if let Some(turn) = active.spec.turns.get(next as usize) {
            if self.accumulate && completed {
                // The output the previous turn generated is part of the next prompt.
                if let Some(out) = active.spec.turns[next as usize - 1].output_tokens.as_ref().or(drawn.as_ref()) {
                    active.history.extend_from_slice(out);
                }
            }
            let delay = match self.mode {
                LoadMode::Timestamps { speedup } => turn.delay_ms / speedup,
                LoadMode::Concurrency { .. } => turn.delay_ms,
            };
            self.ready.push(Reverse((Time(now + delay), session)));
            return;
        }
        self.active.remove(&session);
        self.active_sessions -= 1;
        if let LoadMode::Concurrency { .. } = self.mode {
            self.start_sessions(now);
        }
    }

    /// Warmed agentic snapshots: whether the run starts with a preparation phase (measured
    /// nowhere; see [`LoadDriver::take_profile_start`]).
    pub fn has_preparation(&self) -> bool {
        self.graph.as_ref().is_some_and(GraphState::has_preparation)
    }

    /// Warmed agentic snapshots: the instant the preparation ended and the measured profile
    /// began, told once (the caller restarts its measurements there, times measured from it).
    pub fn take_profile_start(&mut self) -> Option<f64> {
        self.graph.as_mut().and_then(GraphState::take_profile_start)
    }

    /// A continuous agentic profile has ended at `now` (its cutoff passed with nothing in
    /// flight, or its response-grace deadline came and cancelled what was): the run ends here.
    pub fn profile_finished(&mut self, now: f64) -> bool {
        self.graph.as_mut().is_some_and(|g| g.profile_finished(now))
    }

    /// A continuous agentic profile's observation window (first issue to last success).
    pub fn observation_ms(&self) -> Option<f64> {
        self.graph.as_ref().and_then(GraphState::observation_ms)
    }

    /// Why the workload cannot go on (a continuous agentic profile that cannot refill).
    pub fn error(&self) -> Option<&str> {
        self.graph.as_ref().and_then(GraphState::error)
    }

    /// Nothing in flight and nothing left to release.
    pub fn is_drained(&self) -> bool {
        if let Some(g) = &self.graph {
            return g.is_drained();
        }
        self.in_flight == 0 && self.ready.is_empty() && self.stream.peek_start().is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::TurnSpec;

    fn session(start: f64, delays: &[f64]) -> SessionSpec {
        SessionSpec {
            name: Some("s".into()),
            start_ms: start,
            turns: delays
                .iter()
                .map(|&d| TurnSpec {
                    input_length: 1,
                    output_length: 1,
                    blocks: vec![1].into(),
                    delay_ms: d,
                    priority: 0,
                    strict_priority: 0,
                    output_tokens: None,
                    meta: None,
                })
                .collect(),
        }
    }

    fn drain(d: &mut LoadDriver, now: f64) -> Vec<(u32, u32, f64)> {
        let mut v = Vec::new();
        d.pop_ready(now, &mut v);
        v.into_iter().map(|r| (r.session, r.turn, r.arrival_ms)).collect()
    }

    #[test]
    fn timestamps_are_shifted_and_scaled() {
        let w =
            Workload::Trace { sessions: vec![session(1000.0, &[0.0, 50.0]), session(1010.0, &[0.0])], block_tokens: 1 };
        let mut d = LoadDriver::new(&w, LoadMode::Timestamps { speedup: 2.0 });
        assert_eq!(d.next_ready_ms(), Some(0.0));
        assert_eq!(drain(&mut d, 0.0), vec![(0, 0, 0.0)]);
        assert_eq!(drain(&mut d, 5.0), vec![(1, 0, 5.0)]);
        d.on_complete(0, 30.0, true);
        // Think time 50 ms at speedup 2.
        assert_eq!(d.next_ready_ms(), Some(55.0));
        assert_eq!(drain(&mut d, 55.0), vec![(0, 1, 55.0)]);
        d.on_complete(0, 60.0, true);
        d.on_complete(1, 70.0, true);
        assert!(d.is_drained());
    }

    #[test]
    fn concurrency_holds_a_slot_through_a_session() {
        let w = Workload::Trace {
            sessions: vec![session(0.0, &[0.0, 100.0]), session(5.0, &[0.0]), session(9.0, &[0.0])],
            block_tokens: 1,
        };
        let mut d = LoadDriver::new(&w, LoadMode::Concurrency { max_sessions: 1 });
        assert_eq!(drain(&mut d, 0.0), vec![(0, 0, 0.0)]);
        d.on_complete(0, 10.0, true);
        // Session 0 keeps the slot during its think time.
        assert_eq!(drain(&mut d, 10.0), vec![]);
        assert_eq!(drain(&mut d, 110.0), vec![(0, 1, 110.0)]);
        d.on_complete(0, 120.0, true);
        assert_eq!(drain(&mut d, 120.0), vec![(1, 0, 120.0)]);
    }

    /// aisimulate's synthetic sessions (new = 8, output = 2, three turns): prompts of 8, 18 and 28
    /// tokens, each the previous prompt, the output it generated, and 8 new tokens. Dynamo's
    /// synthetic sessions give each turn a fresh 8-token prompt.
    #[test]
    fn accumulating_synthetic_sessions_carry_their_history() {
        use crate::synthetic::{Arrivals, SyntheticSpec, AISIMULATE_GROUP_SEED};
        let prompts = |accumulate: bool| -> Vec<Vec<u32>> {
            let spec = SyntheticSpec {
                input_tokens: 8,
                output_tokens: 2,
                sessions: 1,
                turns_per_session: 3,
                arrivals: Arrivals::AllAtOnce,
                seed: 42,
                shared_prefix_ratio: 0.0,
                num_prefix_groups: 0,
                inter_turn_delay_ms: 0.0,
                block_tokens: 4,
                group_seed: AISIMULATE_GROUP_SEED,
                cached_prefix_tokens: 0,
                accumulate,
                images: None,
            };
            let w = Workload::Synthetic(spec);
            let mut d = LoadDriver::new(&w, LoadMode::Concurrency { max_sessions: 1 });
            let mut out = Vec::new();
            for t in 0..3 {
                let mut ready = Vec::new();
                d.pop_ready(f64::from(t) * 10.0, &mut ready);
                let r = &ready[0];
                let p = d.prompt(r);
                let mut tokens = vec![0; p.len() as usize];
                p.fill(0, &mut tokens);
                if let Some(generated) = d.planned_output(r) {
                    out.push(generated.to_vec());
                }
                out.push(tokens);
                d.on_complete(r.session, f64::from(t) * 10.0 + 5.0, true);
            }
            out
        };
        // Output drawn, then the prompt, for each turn.
        let p = prompts(true);
        let (out0, p0, out1, p1, p2) = (&p[0], &p[1], &p[2], &p[3], &p[5]);
        assert_eq!((p0.len(), p1.len(), p2.len()), (8, 18, 28));
        assert_eq!(p1[..10], [&p0[..], &out0[..]].concat()[..]);
        assert_eq!(p2[..20], [&p1[..], &out1[..]].concat()[..]);
        assert!(p1[10..].iter().chain(&p2[20..]).all(|t| !p0.contains(t)), "new tokens are fresh");
        let fresh = prompts(false);
        assert_eq!(fresh.iter().map(Vec::len).collect::<Vec<_>>(), [8, 8, 8]);
        assert_ne!(fresh[0], fresh[1]);
    }
}
