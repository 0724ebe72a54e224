//! The frontend's tokenization stage (aisimulate's `engine.tokenization`): a released request
//! first waits for one of `workers` tokenizers, FIFO in release order, each taking `base_ms` plus
//! `per_input_token_ms` per prompt token; it reaches the router when its tokenizer is done. Its
//! arrival time stays the release time, so its TTFT includes the stage.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use servesim_engine::Prompt;
use servesim_workload::time::Time;
use servesim_workload::Ready;

/// Tokenization cost and parallelism.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tokenization {
    /// Tokenizers working in parallel (at least 1).
    pub workers: u32,
    pub base_ms: f64,
    pub per_input_token_ms: f64,
}

/// The tokenizers' state: when each busy one is free, and the requests in or waiting for them.
/// Idle tokenizers are alike, so only busy ones are kept (at most `workers`, however large the
/// configured number).
pub(super) struct Tokenizers {
    cost: Tokenization,
    busy_until: BinaryHeap<Reverse<Time>>,
    /// Requests by (done time, release order), with the prompt drawn at release.
    pending: BTreeMap<(Time, u64), PendingTurn>,
    order: u64,
}

/// A released turn waiting for its tokenizer.
pub(super) struct PendingTurn {
    pub ready: Ready,
    pub prompt: Prompt,
}

impl Tokenizers {
    pub fn new(cost: Tokenization) -> Tokenizers {
        Tokenizers { cost, busy_until: BinaryHeap::new(), pending: BTreeMap::new(), order: 0 }
    }

    /// Queues a turn released at `now`: an idle tokenizer starts it now, or else the first to
    /// become free.
    pub fn admit(&mut self, now: f64, ready: Ready, prompt: Prompt) {
        while self.busy_until.peek().is_some_and(|Reverse(t)| t.0 <= now) {
            self.busy_until.pop();
        }
        let start = if self.busy_until.len() < self.cost.workers.max(1) as usize {
            now
        } else {
            self.busy_until.pop().map_or(now, |Reverse(t)| t.0)
        };
        let done = start + self.cost.base_ms + self.cost.per_input_token_ms * prompt.len() as f64;
        self.busy_until.push(Reverse(Time(done)));
        self.pending.insert((Time(done), self.order), PendingTurn { ready, prompt });
        self.order += 1;
    }

    /// When the next tokenized request is due.
    pub fn next_done_ms(&self) -> Option<f64> {
        self.pending.first_key_value().map(|((t, _), _)| t.0)
    }

    /// The next request tokenized by `now`, in (done time, release order) order.
    pub fn pop_done(&mut self, now: f64) -> Option<PendingTurn> {
        if self.next_done_ms()? > now {
            return None;
        }
        self.pending.pop_first().map(|(_, p)| p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(session: u32, tokens: u32) -> (Ready, Prompt) {
        (Ready { session, turn: 0, arrival_ms: 0.0 }, Prompt::Tokens(vec![7; tokens as usize].into()))
    }

    /// Two tokenizers at 10 ms + 1 ms per token: the third request waits for the first to
    /// finish; they come out by done time, then release order.
    #[test]
    fn requests_queue_for_the_first_free_tokenizer() {
        let mut t = Tokenizers::new(Tokenization { workers: 2, base_ms: 10.0, per_input_token_ms: 1.0 });
        for (s, n) in [(0, 5), (1, 2), (2, 1), (3, 0)] {
            let (r, p) = turn(s, n);
            t.admit(0.0, r, p);
        }
        // Done at 15, 12, then 12 + 11 = 23, 15 + 10 = 25.
        assert_eq!(t.next_done_ms(), Some(12.0));
        assert!(t.pop_done(11.9).is_none());
        let order: Vec<(u32, f64)> = std::iter::from_fn(|| t.next_done_ms().zip(t.pop_done(f64::MAX)))
            .map(|(at, p)| (p.ready.session, at))
            .collect();
        assert_eq!(order, vec![(1, 12.0), (0, 15.0), (2, 23.0), (3, 25.0)]);
        // Idle again by 30: a new request starts at once.
        let (r, p) = turn(4, 0);
        t.admit(30.0, r, p);
        assert_eq!(t.next_done_ms(), Some(40.0));
    }

    /// However many tokenizers are configured, only the busy ones take memory.
    #[test]
    fn a_huge_tokenizer_count_costs_nothing() {
        let mut t = Tokenizers::new(Tokenization { workers: u32::MAX, base_ms: 1.0, per_input_token_ms: 0.0 });
        let (r, p) = turn(0, 3);
        t.admit(5.0, r, p);
        assert_eq!(t.busy_until.len(), 1);
        assert_eq!(t.next_done_ms(), Some(6.0));
    }
}
