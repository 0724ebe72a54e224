//! Decode-side handoff bookkeeping shared by the engine families.
//!
//! In disaggregated serving a decode worker accepts requests whose prompt is computed on a
//! prefill worker. An accepted request waits here, oldest first, until pages can be reserved for
//! its KV. Like the reference's schedulers, the engine tries only the oldest one per attempt, and
//! tries it again only after capacity may have grown (a request finished, was preempted or
//! retracted, or pages were released): each such event bumps a capacity generation, and a head
//! that failed in the current generation is not tried again until the next.

use std::collections::VecDeque;

use crate::config::EngineConfig;
use crate::output::RejectReason;
use crate::request::EngineRequest;

/// A destination reservation that succeeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reserved {
    pub request: u64,
    /// Prompt tokens this worker already had cached (they need no transfer).
    pub reused_tokens: u32,
}

#[derive(Debug, Default)]
pub(crate) struct Destinations {
    pending: VecDeque<EngineRequest>,
    /// Capacity generation in which the head last failed to reserve.
    head_failed_in: Option<u64>,
    generation: u64,
    /// A host (G2) transfer completed while requests waited here: the rank runs a pass so
    /// that its end tries the head again (see [`Destinations::wake`]).
    retry_ready: bool,
}

impl Destinations {
    pub fn push(&mut self, request: EngineRequest) {
        self.pending.push_back(request);
    }

    /// Accepts a request whose KV needs `blocks` blocks (pages) here, unless it can never be
    /// reserved: its prompt reaches `max_model_len`, or the cache has fewer blocks.
    pub fn accept(&mut self, request: EngineRequest, blocks: u32, cfg: &EngineConfig) -> Result<(), RejectReason> {
        if cfg.max_model_len.is_some_and(|m| request.prompt.len() >= m) {
            return Err(RejectReason::ExceedsMaxModelLen);
        }
        if blocks > cfg.num_gpu_blocks {
            return Err(RejectReason::ExceedsKvCapacity);
        }
        self.push(request);
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// Prompt lengths of the waiting requests.
    pub fn prompt_lens(&self) -> impl Iterator<Item = u32> + '_ {
        self.pending.iter().map(|r| r.prompt.len())
    }

    /// Capacity may have grown: the head is worth another attempt.
    pub fn bump(&mut self) {
        self.generation += 1;
    }

    /// A host transfer completed, which may have freed device capacity (a D2H copy no longer
    /// pins the blocks it reads): the head is worth another attempt, and the rank must run a
    /// pass for it even with nothing else to do, as Dynamo 1.6.1 readies a decode rank whose
    /// idle transfer completion found destinations waiting.
    pub fn wake(&mut self) {
        if !self.pending.is_empty() {
            self.bump();
            self.retry_ready = true;
        }
    }

    /// Whether a pass is owed to a [`Destinations::wake`].
    pub fn retry_ready(&self) -> bool {
        self.retry_ready
    }

    /// An attempt is being made: the pass owed to a wake has run.
    pub fn attempting(&mut self) {
        self.retry_ready = false;
    }

    /// The oldest request, if an attempt at it is due.
    pub fn due(&self) -> Option<&EngineRequest> {
        let head = self.pending.front()?;
        (self.head_failed_in != Some(self.generation)).then_some(head)
    }

    /// The head's attempt failed; it waits for the next capacity change.
    pub fn failed(&mut self) {
        self.head_failed_in = Some(self.generation);
    }

    /// Puts back a head taken with [`Destinations::pop`] whose reservation did not go through.
    pub fn push_front(&mut self, request: EngineRequest) {
        self.pending.push_front(request);
    }

    /// The head's pages are reserved: it leaves the queue.
    pub fn pop(&mut self) -> EngineRequest {
        self.head_failed_in = None;
        self.pending.pop_front().expect("a due head")
    }

    /// Ends an attempt at a head taken with [`Destinations::pop`]: a reservation that failed
    /// puts the request back at the head, to wait for the next capacity change.
    pub fn settle(&mut self, outcome: Result<Reserved, EngineRequest>) -> Option<Reserved> {
        match outcome {
            Ok(reserved) => Some(reserved),
            Err(request) => {
                self.push_front(request);
                self.failed();
                None
            }
        }
    }

    /// Request `id` is cancelled: true if it was waiting here for its pages (it is gone now).
    /// Otherwise the engine holds it and frees it, which may free capacity for the head.
    pub fn cancel(&mut self, id: u64) -> bool {
        if self.remove(id) {
            return true;
        }
        self.bump();
        false
    }

    /// Removes request `id` (cancelled before its pages were reserved).
    pub fn remove(&mut self, id: u64) -> bool {
        let Some(pos) = self.pending.iter().position(|r| r.id == id) else { return false };
        self.pending.remove(pos);
        if pos == 0 {
            self.head_failed_in = None;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::Prompt;

    fn request(id: u64) -> EngineRequest {
        EngineRequest::new(id, Prompt::Tokens(vec![1, 2, 3].into()), 1, 0)
    }

    #[test]
    fn a_failed_head_waits_for_the_next_capacity_change() {
        let mut d = Destinations::default();
        d.push(request(1));
        d.push(request(2));
        assert_eq!(d.due().map(|r| r.id), Some(1));
        d.failed();
        assert!(d.due().is_none(), "no capacity change since the failure");
        d.bump();
        assert_eq!(d.due().map(|r| r.id), Some(1));
        assert_eq!(d.pop().id, 1);
        // The next head has never been tried: it is due at once.
        assert_eq!(d.due().map(|r| r.id), Some(2));
        d.failed();
        assert!(d.remove(2));
        d.push(request(3));
        assert_eq!(d.due().map(|r| r.id), Some(3), "a new head is due");
    }
}
