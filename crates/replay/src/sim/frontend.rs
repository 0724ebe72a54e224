//! The frontend's tokenization stage (aisimulate's `engine.tokenization`): a released request
//! first waits for one of `workers` tokenizers, FIFO in release order, each taking `base_ms` plus
//! `per_input_token_ms` per prompt token; it reaches the router when its tokenizer is done. Its
//! arrival time stays the release time, so its TTFT includes the stage.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

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

/// The tokenizers' state: when each is free, and the requests in or waiting for them.
pub(super) struct Tokenizers {
    cost: Tokenization,
    free_at: Vec<f64>,
    /// Requests by (done time, release order), with the prompt drawn at release.
    pending: BinaryHeap<Reverse<(Time, u64, PendingTurn)>>,
    order: u64,
}

/// A released turn waiting for its tokenizer. Ordered by nothing but its place in the heap key.
pub(super) struct PendingTurn {
    pub ready: Ready,
    pub prompt: Prompt,
}

impl PartialEq for PendingTurn {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for PendingTurn {}
impl PartialOrd for PendingTurn {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for PendingTurn {
    fn cmp(&self, _: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

impl Tokenizers {
    pub fn new(cost: Tokenization) -> Tokenizers {
        Tokenizers { cost, free_at: vec![0.0; cost.workers.max(1) as usize], pending: BinaryHeap::new(), order: 0 }
    }

    /// Queues a turn released at `now`: the first tokenizer free takes it (the lowest-numbered
    /// on a tie).
    pub fn admit(&mut self, now: f64, ready: Ready, prompt: Prompt) {
        let (i, &free) =
            self.free_at.iter().enumerate().min_by(|a, b| a.1.total_cmp(b.1)).expect("at least one tokenizer");
        let done = free.max(now) + self.cost.base_ms + self.cost.per_input_token_ms * prompt.len() as f64;
        self.free_at[i] = done;
        self.pending.push(Reverse((Time(done), self.order, PendingTurn { ready, prompt })));
        self.order += 1;
    }

    /// When the next tokenized request is due.
    pub fn next_done_ms(&self) -> Option<f64> {
        self.pending.peek().map(|Reverse((t, _, _))| t.0)
    }

    /// The next request tokenized by `now`, in (done time, release order) order.
    pub fn pop_done(&mut self, now: f64) -> Option<PendingTurn> {
        if self.next_done_ms()? > now {
            return None;
        }
        self.pending.pop().map(|Reverse((_, _, p))| p)
    }
}
