//! Workloads: sessions of requests, and the load driver that releases them over time.
//!
//! A workload is a list of sessions. A session is an ordered list of turns (requests); turn
//! `k + 1` becomes ready `delay` ms after turn `k` completes (closed loop), while different
//! sessions run independently. A request that is not part of a multi-turn conversation is a
//! one-turn session.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::time::Time;
use std::sync::Arc;

/// One request as the workload describes it, at trace-block level.
#[derive(Clone, Debug)]
pub struct TurnSpec {
    pub input_length: u32,
    pub output_length: u32,
    /// Prompt content: block `i` is `block_tokens` copies of token `blocks[i]`, truncated to
    /// `input_length` tokens.
    pub blocks: Arc<[u32]>,
    /// Think time after the previous turn completes (0 for the first turn).
    pub delay_ms: f64,
    /// Router queue priority: like arriving this many seconds earlier (negative counts as 0).
    pub priority: i32,
    /// Router queue tier, compared before anything else (higher first).
    pub strict_priority: u32,
    /// Exact output token ids (`output_token_ids`), one per output token.
    pub output_tokens: Option<Arc<[u32]>>,
}

#[derive(Clone, Debug)]
pub struct SessionSpec {
    /// `session_id` from the trace, or a generated name.
    pub name: String,
    /// Whether `name` came from the workload itself (reported as `session_id`).
    pub named: bool,
    /// First arrival (trace timestamp, ms).
    pub start_ms: f64,
    pub turns: Vec<TurnSpec>,
}

#[derive(Clone, Debug, Default)]
pub struct Workload {
    pub sessions: Vec<SessionSpec>,
    /// Tokens each prompt block stands for.
    pub block_tokens: u32,
}

impl Workload {
    pub fn num_requests(&self) -> usize {
        self.sessions.iter().map(|s| s.turns.len()).sum()
    }
}

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

/// A request the driver releases.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ready {
    pub session: u32,
    pub turn: u32,
    pub arrival_ms: f64,
}

/// Releases the turns of a workload as time advances and turns complete.
#[derive(Debug)]
pub struct LoadDriver {
    mode: LoadMode,
    /// Next turn index per session.
    next_turn: Vec<u32>,
    turn_counts: Vec<u32>,
    delays: Vec<Vec<f64>>,
    /// Sessions with a turn ready at a time, ordered by (time, session index).
    ready: BinaryHeap<Reverse<(Time, u32)>>,
    /// Concurrency mode: sessions not started yet, in order.
    next_unstarted: u32,
    active_sessions: u32,
    in_flight: u32,
}

impl LoadDriver {
    pub fn new(workload: &Workload, mode: LoadMode) -> Self {
        let n = workload.sessions.len();
        let mut d = LoadDriver {
            mode,
            next_turn: vec![0; n],
            turn_counts: workload.sessions.iter().map(|s| s.turns.len() as u32).collect(),
            delays: workload.sessions.iter().map(|s| s.turns.iter().map(|t| t.delay_ms).collect()).collect(),
            ready: BinaryHeap::new(),
            next_unstarted: 0,
            active_sessions: 0,
            in_flight: 0,
        };
        match mode {
            LoadMode::Timestamps { speedup } => {
                let origin = workload.sessions.iter().map(|s| s.start_ms).fold(f64::INFINITY, f64::min);
                for (i, s) in workload.sessions.iter().enumerate() {
                    if !s.turns.is_empty() {
                        d.ready.push(Reverse((Time((s.start_ms - origin) / speedup), i as u32)));
                    }
                }
            }
            LoadMode::Concurrency { .. } => d.start_sessions(0.0),
        }
        d
    }

    fn start_sessions(&mut self, now: f64) {
        if let LoadMode::Concurrency { max_sessions } = self.mode {
            while self.active_sessions < max_sessions && (self.next_unstarted as usize) < self.next_turn.len() {
                let s = self.next_unstarted;
                self.next_unstarted += 1;
                if self.turn_counts[s as usize] > 0 {
                    self.active_sessions += 1;
                    self.ready.push(Reverse((Time(now), s)));
                }
            }
        }
    }

    /// Earliest time a turn becomes ready, if any is pending.
    pub fn next_ready_ms(&self) -> Option<f64> {
        self.ready.peek().map(|Reverse((t, _))| t.0)
    }

    /// Releases every turn ready at or before `now`, in (ready time, session) order.
    pub fn pop_ready(&mut self, now: f64, out: &mut Vec<Ready>) {
        while let Some(&Reverse((Time(t), s))) = self.ready.peek() {
            if t > now {
                break;
            }
            self.ready.pop();
            let turn = self.next_turn[s as usize];
            self.next_turn[s as usize] += 1;
            self.in_flight += 1;
            out.push(Ready { session: s, turn, arrival_ms: t });
        }
    }

    /// Records that the in-flight turn of `session` finished at `now`.
    pub fn on_complete(&mut self, session: u32, now: f64) {
        self.in_flight -= 1;
        let s = session as usize;
        let next = self.next_turn[s];
        if next < self.turn_counts[s] {
            let delay = self.delays[s][next as usize];
            let delay = match self.mode {
                LoadMode::Timestamps { speedup } => delay / speedup,
                LoadMode::Concurrency { .. } => delay,
            };
            self.ready.push(Reverse((Time(now + delay), session)));
        } else if let LoadMode::Concurrency { .. } = self.mode {
            self.active_sessions -= 1;
            self.start_sessions(now);
        }
    }

    /// Nothing in flight and nothing left to release.
    pub fn is_drained(&self) -> bool {
        self.in_flight == 0 && self.ready.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(start: f64, delays: &[f64]) -> SessionSpec {
        SessionSpec {
            name: String::new(),
            named: false,
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
        let w = Workload { sessions: vec![session(1000.0, &[0.0, 50.0]), session(1010.0, &[0.0])], block_tokens: 1 };
        let mut d = LoadDriver::new(&w, LoadMode::Timestamps { speedup: 2.0 });
        assert_eq!(d.next_ready_ms(), Some(0.0));
        assert_eq!(drain(&mut d, 0.0), vec![(0, 0, 0.0)]);
        assert_eq!(drain(&mut d, 5.0), vec![(1, 0, 5.0)]);
        d.on_complete(0, 30.0);
        // Think time 50 ms at speedup 2.
        assert_eq!(d.next_ready_ms(), Some(55.0));
        assert_eq!(drain(&mut d, 55.0), vec![(0, 1, 55.0)]);
        d.on_complete(0, 60.0);
        d.on_complete(1, 70.0);
        assert!(d.is_drained());
    }

    #[test]
    fn concurrency_holds_a_slot_through_a_session() {
        let w = Workload {
            sessions: vec![session(0.0, &[0.0, 100.0]), session(5.0, &[0.0]), session(9.0, &[0.0])],
            block_tokens: 1,
        };
        let mut d = LoadDriver::new(&w, LoadMode::Concurrency { max_sessions: 1 });
        assert_eq!(drain(&mut d, 0.0), vec![(0, 0, 0.0)]);
        d.on_complete(0, 10.0);
        // Session 0 keeps the slot during its think time.
        assert_eq!(drain(&mut d, 10.0), vec![]);
        assert_eq!(drain(&mut d, 110.0), vec![(0, 1, 110.0)]);
        d.on_complete(0, 120.0);
        assert_eq!(drain(&mut d, 120.0), vec![(1, 0, 120.0)]);
    }
}
