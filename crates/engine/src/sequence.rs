//! The per-request state both engine families keep, and the table that holds it.
//!
//! A [`Sequence`] is a request as an engine tracks it: its prompt, how many tokens it may
//! generate and how they are chosen, how far generation and KV computation have come, the
//! hashes of its full blocks and the blocks it holds. Each family adds its own scheduling state
//! (`S`). Requests live in a [`SequenceTable`] and are named by their slot there; the engines'
//! queues hold slots.

use std::collections::VecDeque;
use std::ops::{Index, IndexMut, Range};
use std::sync::Arc;

use crate::hash::{local_block_hash, BlockHashes};
use crate::output::TokenOut;
use crate::request::{EngineRequest, OutputPlan, Prompt, ReasoningConfig};

#[derive(Debug)]
pub(crate) struct Sequence<S> {
    pub id: u64,
    pub prompt: Prompt,
    pub prompt_len: u32,
    /// Output tokens it may generate (as clamped by the engine).
    pub max_output: u32,
    /// How its output tokens are chosen.
    pub output: OutputPlan,
    pub generated: u32,
    /// Tokens of the known sequence whose KV is in this engine's cache. The vLLM core counts a
    /// token once a forward has computed it (a generated token dangles until the next pass);
    /// the SGLang core gives a sampled token its KV slot at once. 0 before the first admission
    /// and after a preemption or retraction.
    pub computed: u32,
    /// Hashes of the leading full blocks of the known sequence. The vLLM core keeps local and
    /// sequence hashes of every full block; the SGLang core keys its radix tree by local hashes
    /// alone (`seq` stays empty), computed when it matches a waiting request against the cache
    /// and dropped once the request is admitted.
    pub hashes: BlockHashes,
    /// Its KV blocks (the SGLang core's pages), backing its leading tokens in order.
    pub blocks: Vec<u32>,
    /// Its prompt was computed on another worker (disaggregated decode).
    pub transferred: bool,
    /// The engine family's own scheduling state.
    pub state: S,
}

impl<S> Sequence<S> {
    /// A request as it enters an engine: nothing generated or computed, no blocks. Its hashes
    /// are those the caller supplied, if any.
    pub fn new(
        request: EngineRequest,
        reasoning: Option<&ReasoningConfig>,
        vocabulary: Option<Arc<[u32]>>,
        state: S,
    ) -> Self {
        let (max_output, output) = request.output_plan(reasoning);
        Sequence {
            id: request.id,
            prompt_len: request.prompt.len(),
            prompt: request.prompt,
            max_output,
            output: output.with_vocabulary(vocabulary),
            generated: 0,
            computed: 0,
            hashes: request.hashes.unwrap_or_default(),
            blocks: Vec::new(),
            transferred: false,
            state,
        }
    }

    /// Tokens known so far: the prompt and what has been generated.
    pub fn len(&self) -> u32 {
        self.prompt_len + self.generated
    }

    /// Token at position `pos` of the known sequence (prompt, then output).
    pub fn token_at(&self, pos: u32) -> u32 {
        if pos < self.prompt_len {
            self.prompt.token(pos)
        } else {
            self.output.token(pos - self.prompt_len)
        }
    }

    /// Output tokens still to generate (before any `max_model_len` limit).
    pub fn remaining_output(&self) -> u32 {
        self.max_output - self.generated
    }

    /// Whether every output token has been generated.
    pub fn output_done(&self) -> bool {
        self.generated >= self.max_output
    }

    /// Generates the next output token.
    pub fn next_token(&mut self) -> TokenOut {
        let token = self.output.token(self.generated);
        self.generated += 1;
        TokenOut { request: self.id, token }
    }

    /// Local hash of full block `block` of the known sequence; `scratch` holds one block.
    pub fn block_key(&self, block: u32, scratch: &mut [u32]) -> u64 {
        let start = block * scratch.len() as u32;
        for (k, t) in scratch.iter_mut().enumerate() {
            *t = self.token_at(start + k as u32);
        }
        local_block_hash(scratch)
    }

    /// Hands the local hashes of full blocks `blocks` of the known sequence, in order, to
    /// `emit(hash, count)` as runs of `count` consecutive blocks with that hash (`scratch` holds
    /// one block). Blocks made of one repeated token (a trace block cut into smaller blocks)
    /// share a hash, computed once per trace block and handed over as one run; `memo` carries
    /// the last one across calls.
    pub fn block_keys(
        &self,
        blocks: Range<usize>,
        scratch: &mut [u32],
        memo: &mut (u32, u64),
        mut emit: impl FnMut(u64, usize),
    ) {
        let size = scratch.len() as u32;
        let mut i = blocks.start;
        while i < blocks.end {
            let start = i as u32 * size;
            if let Prompt::Runs { run, ids, .. } = &self.prompt {
                let end = start + size - 1;
                if end < self.prompt_len && start / run == end / run {
                    let token = ids[(start / run) as usize];
                    if memo.0 != token || memo.1 == 0 {
                        scratch.fill(token);
                        *memo = (token, local_block_hash(scratch));
                    }
                    // Every block up to the end of this trace block has the same hash.
                    let run_end = ((start / run + 1) * run).min(self.prompt_len);
                    let same = ((run_end - start) / size) as usize;
                    let n = same.min(blocks.end - i).max(1);
                    emit(memo.1, n);
                    i += n;
                    continue;
                }
            }
            emit(self.block_key(i as u32, scratch), 1);
            i += 1;
        }
    }
}

/// The requests of one engine, each in a slot that stays its own until it leaves.
#[derive(Debug)]
pub(crate) struct SequenceTable<S> {
    slots: Vec<Option<Sequence<S>>>,
    free: Vec<u32>,
}

impl<S> Default for SequenceTable<S> {
    fn default() -> Self {
        SequenceTable { slots: Vec::new(), free: Vec::new() }
    }
}

impl<S> SequenceTable<S> {
    /// Stores a request; returns its slot (the most recently freed one, if any).
    pub fn insert(&mut self, seq: Sequence<S>) -> u32 {
        match self.free.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some(seq);
                slot
            }
            None => {
                self.slots.push(Some(seq));
                (self.slots.len() - 1) as u32
            }
        }
    }

    /// Takes a request out of the table; its slot is reused.
    pub fn remove(&mut self, slot: u32) -> Sequence<S> {
        self.free.push(slot);
        self.slots[slot as usize].take().expect("live request slot")
    }

    /// Takes the slot of request `id` out of `queue`, if the queue has it.
    pub fn take_from(&self, queue: &mut impl SlotQueue, id: u64) -> Option<u32> {
        queue.take_first(|slot| self[slot].id == id)
    }
}

impl<S> Index<u32> for SequenceTable<S> {
    type Output = Sequence<S>;

    fn index(&self, slot: u32) -> &Sequence<S> {
        self.slots[slot as usize].as_ref().expect("live request slot")
    }
}

impl<S> IndexMut<u32> for SequenceTable<S> {
    fn index_mut(&mut self, slot: u32) -> &mut Sequence<S> {
        self.slots[slot as usize].as_mut().expect("live request slot")
    }
}

/// A queue of request slots (running or waiting).
pub(crate) trait SlotQueue {
    /// Removes the first slot for which `pick` holds, keeping the others in order.
    fn take_first(&mut self, pick: impl FnMut(u32) -> bool) -> Option<u32>;
}

impl SlotQueue for Vec<u32> {
    fn take_first(&mut self, mut pick: impl FnMut(u32) -> bool) -> Option<u32> {
        let pos = self.iter().position(|&s| pick(s))?;
        Some(self.remove(pos))
    }
}

impl SlotQueue for VecDeque<u32> {
    fn take_first(&mut self, mut pick: impl FnMut(u32) -> bool) -> Option<u32> {
        let pos = self.iter().position(|&s| pick(s))?;
        self.remove(pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::BlockHashes;

    fn seq(id: u64, prompt: Prompt, max_output: u32) -> Sequence<()> {
        Sequence::new(EngineRequest::new(id, prompt, max_output, 7), None, None, ())
    }

    #[test]
    fn tokens_continue_from_the_prompt_into_the_output() {
        let mut s = seq(3, Prompt::Tokens(vec![10, 11, 12].into()), 2);
        assert_eq!((s.len(), s.remaining_output(), s.output_done()), (3, 2, false));
        let first = s.next_token();
        assert_eq!(first.request, 3);
        assert_eq!(s.token_at(2), 12);
        assert_eq!(s.token_at(3), first.token);
        s.next_token();
        assert_eq!((s.len(), s.remaining_output(), s.output_done()), (5, 0, true));
    }

    #[test]
    fn block_keys_agree_with_block_hashes() {
        // Trace blocks of 6 tokens cut into blocks of 4 (some inside one trace block, some
        // straddling two) and into blocks of 3 (all inside one).
        let p = Prompt::Runs { run: 6, ids: vec![5, 5, 8, 1].into(), len: 24 };
        for size in [4, 3] {
            let s = seq(1, p.clone(), 0);
            let mut keys = Vec::new();
            let mut memo = (0, 0);
            let mut scratch = vec![0; size];
            let mut push = |key, n| keys.extend(std::iter::repeat_n(key, n));
            s.block_keys(0..2, &mut scratch, &mut memo, &mut push);
            s.block_keys(2..24 / size, &mut scratch, &mut memo, &mut push);
            assert_eq!(keys, p.block_hashes(size as u32).local, "block size {size}");
            let last = keys.len() as u32 - 1;
            assert_eq!(s.block_key(last, &mut scratch), keys[last as usize]);
        }
        assert_eq!(seq(1, p, 0).hashes, BlockHashes::default(), "no hashes unless supplied");
    }

    #[test]
    fn slots_are_reused_and_found_by_id() {
        let mut table = SequenceTable::default();
        let a = table.insert(seq(10, Prompt::Tokens(vec![1].into()), 1));
        let b = table.insert(seq(11, Prompt::Tokens(vec![1].into()), 1));
        let mut running = vec![a, b];
        let mut waiting = VecDeque::from([b]);
        assert_eq!(table.take_from(&mut running, 11), Some(b));
        assert_eq!(running, vec![a]);
        assert_eq!(table.take_from(&mut waiting, 10), None);
        assert_eq!(table.remove(b).id, 11);
        let c = table.insert(seq(12, Prompt::Tokens(vec![1].into()), 1));
        assert_eq!(c, b, "a freed slot is reused");
        assert_eq!(table[c].id, 12);
    }
}
