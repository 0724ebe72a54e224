//! The recurrent-state cache of a hybrid state-space model on vLLM (`state_cache`).
//!
//! Besides its KV blocks, every running request holds its recurrent state in
//! `blocks_per_state` blocks of the same pool (its *working* state). A state is only valid at
//! the position it was computed to, so a prompt reuses a cached prefix only up to a position
//! whose state was *saved*: the token blocks must be resident and so must every block of the
//! saved state. A saved state is a set of cache entries of its own, one per state block, keyed
//! by the prefix hash at that position; like token blocks they are reusable while resident and
//! evicted least recently used first.
//!
//! Where states are saved:
//!
//! - **Default retention** (no `prefix_match_unit`): whenever a pass leaves a request's computed
//!   tokens on a block boundary, its working state becomes the saved state there. The next
//!   write moves that saved state to fresh blocks (the working copy is overwritten), and the
//!   request's next save drops its older one: a request keeps one saved state.
//! - **Align mode** (`prefix_match_unit` = u): prefill passes stop at block boundaries, at the
//!   prompt's last full block and at its last u-aligned tail; the state is saved at the last
//!   full block below the prompt's end and at a tail that is not block-aligned. The working
//!   state moves to fresh blocks whenever it starts writing another block; the old one stays
//!   held until the next pass (the forward still reads it) and then, if saved, stays cached.
//!
//! A restore reads the saved state's blocks into a fresh working state. A saved state published
//! in a pass is not a hit before the next pass, and a preempted request drops the state it
//! saved in the pass that preempted it.

use rustc_hash::FxHashSet;

use super::{PrefixCost, Req, VllmEngine};
use crate::config::StateCacheConfig;
use crate::pool::Residency;

/// Mixed into a prefix hash to key the blocks of the state saved there (token-block hashes are
/// XXH3 outputs, so a keyed mix of them cannot be mistaken for one).
const STATE_TAG: u64 = 0x5354_4154_455f_4b45;
/// Seed of the prefix hash of a position inside the first block.
const PARTIAL_SEED: u64 = 0x5041_5254_4941_4c00;

fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The engine's state-cache settings and per-pass fence.
#[derive(Debug)]
pub(super) struct StateCache {
    blocks: u32,
    unit: Option<u32>,
    /// Prefixes whose state was saved in this pass: not a hit before the next.
    published: FxHashSet<u64>,
}

impl StateCache {
    pub(super) fn new(cfg: &StateCacheConfig) -> Self {
        StateCache { blocks: cfg.blocks_per_state, unit: cfg.prefix_match_unit, published: FxHashSet::default() }
    }

    /// The cache keys of the state saved at the position whose prefix hash is `prefix`.
    fn keys(&self, prefix: u64) -> impl Iterator<Item = u64> {
        (0..self.blocks).map(move |slot| mix(prefix ^ STATE_TAG, u64::from(slot)))
    }
}

/// A request's recurrent state.
#[derive(Debug, Default)]
pub(super) struct StateSlot {
    /// The working state's copies (empty until the request is first scheduled).
    working: Vec<u32>,
    /// Prefix hash under whose keys the working copies are cached (its state was saved and not
    /// yet overwritten).
    live: Option<u64>,
    /// Default retention: this request's older saved state, moved to copies of their own.
    saved: Option<u64>,
    /// Align mode: the block the working state writes (tokens up to its end).
    block: Option<u32>,
    /// Copies held until the next pass: restore sources and the previous working state.
    held: Vec<u32>,
    /// The prefix hash of a state saved in the current pass.
    saved_now: Option<u64>,
}

/// What a pass's allocation needs for a request's state: saved blocks it reads (by key) and
/// fresh blocks.
pub(super) struct StateNeeds {
    pub(super) sources: Vec<u64>,
    pub(super) fresh: u32,
}

impl VllmEngine {
    /// Blocks one request state takes (0 without a state cache).
    pub(super) fn state_blocks(&self) -> u32 {
        self.state_cache.as_ref().map_or(0, |sc| sc.blocks)
    }

    /// Decode worker: the state computed through the prompt on the prefill worker arrives in
    /// `copies` (reserved beside the prompt's blocks) and is the request's working state, as
    /// if its last prefill pass had run here; it was saved nowhere on this worker.
    pub(super) fn state_received(req: &mut Req, copies: Vec<u32>, block_size: u32) {
        if copies.is_empty() {
            return;
        }
        let st = &mut req.state.cache;
        st.working = copies;
        st.block = Some(req.prompt_len.saturating_sub(1) / block_size);
    }

    /// A new pass: last pass's saves become hits and the copies held across it are released.
    pub(super) fn state_pass_start(&mut self) {
        let Some(sc) = self.state_cache.as_mut() else { return };
        sc.published.clear();
        for &slot in &self.running {
            for copy in self.reqs[slot].state.cache.held.drain(..) {
                self.pool.release(copy);
            }
        }
    }

    /// The hash of the first `tokens` tokens of `req`: the block hash on a block boundary,
    /// else the hash of the partial block's tokens chained to it.
    fn state_prefix(&self, req: &Req, tokens: u32) -> Option<u64> {
        let bs = self.cfg.block_size;
        let full = tokens / bs;
        let parent = match full {
            0 => PARTIAL_SEED,
            n => *req.hashes.seq.get(n as usize - 1)?,
        };
        if tokens.is_multiple_of(bs) {
            return (tokens > 0).then_some(parent);
        }
        Some((full * bs..tokens).fold(mix(parent, u64::from(tokens)), |h, pos| mix(h, u64::from(req.token_at(pos)))))
    }

    /// Whether a state saved at `prefix` is resident and may be restored in this pass.
    fn has_saved_state(&self, sc: &StateCache, prefix: u64) -> bool {
        !sc.published.contains(&prefix) && sc.keys(prefix).all(|k| self.pool.lookup(k) != Residency::Missing)
    }

    /// The cached prefix a waiting request reuses: the longest resident token prefix, cut back
    /// to the last position with a saved state.
    pub(super) fn state_prefix_cost(&self, req: &Req) -> PrefixCost {
        let sc = self.state_cache.as_ref().expect("state cache on");
        let bs = self.cfg.block_size;
        let needs_logits = !self.generation_done(req);
        let len = req.len();
        let (cached, blocks) = match sc.unit {
            None => {
                let limit = if needs_logits { len.saturating_sub(1) / bs } else { len / bs };
                let limit = (limit as usize).min(req.hashes.len());
                let (overlap, _) = self.resident_prefix(&req.hashes.seq[..limit]);
                let count = (1..=overlap)
                    .rev()
                    .find(|&n| self.has_saved_state(sc, req.hashes.seq[n as usize - 1]))
                    .unwrap_or(0);
                (count * bs, count)
            }
            Some(unit) => {
                let (overlap, _) = self.resident_prefix(&req.hashes.seq);
                let limit = if needs_logits { len.saturating_sub(1) } else { len };
                let limit = limit.min(((overlap + 1) * bs).saturating_sub(1));
                let tokens = (1..=limit / unit)
                    .rev()
                    .map(|i| i * unit)
                    .find(|&t| self.state_prefix(req, t).is_some_and(|h| self.has_saved_state(sc, h)))
                    .unwrap_or(0);
                (tokens, tokens / bs)
            }
        };
        let (_, active) = self.resident_prefix(&req.hashes.seq[..blocks as usize]);
        PrefixCost { cached_tokens: cached, active_cached_tokens: active * bs, reported: cached }
    }

    /// Blocks admitting `req` with `cost` needs beyond its token blocks: a fresh working state,
    /// and the saved state it restores where that is not already held.
    pub(super) fn state_admission_blocks(&self, req: &Req, cost: PrefixCost) -> u32 {
        let Some(sc) = self.state_cache.as_ref() else { return 0 };
        let inactive = self
            .state_prefix(req, cost.cached_tokens)
            .filter(|_| cost.cached_tokens > 0)
            .map_or(0, |h| sc.keys(h).filter(|&k| self.pool.lookup(k) == Residency::Inactive).count() as u32);
        sc.blocks + inactive
    }

    /// vLLM's align split: a prefill pass stops at a block boundary, at the prompt's last full
    /// block and at its unit-aligned tail, so the states saved there are computed exactly.
    pub(super) fn align_state_prefill(&self, start: u32, prompt: u32, known: u32, desired: u32) -> u32 {
        let Some(StateCache { unit: Some(unit), .. }) = self.state_cache.as_ref() else {
            return desired;
        };
        let bs = self.cfg.block_size;
        let prefill_end = prompt.max(known.saturating_sub(1));
        if !self.cfg.enable_prefix_caching || start >= prefill_end {
            return desired;
        }
        let mut end = start + desired;
        if end < prefill_end {
            let aligned = end / bs * bs;
            // A block larger than the whole budget makes progress, then stops at a boundary.
            if aligned > start || bs <= self.cfg.max_num_batched_tokens.unwrap_or(u32::MAX) {
                end = aligned;
            }
        }
        let last_full = known / bs * bs;
        let tail = prompt / unit * unit;
        let next = (!start.is_multiple_of(bs)).then(|| start + bs - start % bs);
        for stop in [next, Some(last_full), (last_full < tail && tail < prompt).then_some(tail)].into_iter().flatten() {
            if start < stop && stop < end {
                end = stop;
            }
        }
        end - start
    }

    /// What computing `slot` from `before` (its restored prefix `cached` on first scheduling)
    /// through `target` needs for its state.
    pub(super) fn state_needs(&self, slot: u32, cached: u32, before: u32, target: u32) -> StateNeeds {
        let Some(sc) = self.state_cache.as_ref() else { return StateNeeds { sources: Vec::new(), fresh: 0 } };
        let req = &self.reqs[slot];
        let st = &req.state.cache;
        if st.working.is_empty() {
            let sources = match self.state_prefix(req, cached).filter(|_| cached > 0) {
                Some(h) => sc.keys(h).collect(),
                None => Vec::new(),
            };
            return StateNeeds { sources, fresh: sc.blocks };
        }
        let writes = target > before
            && match sc.unit {
                None => st.live.is_some(),
                Some(_) => st.block != Some((target - 1) / self.cfg.block_size) || st.live.is_some(),
            };
        StateNeeds { sources: Vec::new(), fresh: if writes { sc.blocks } else { 0 } }
    }

    /// Allocates the blocks `slot` needs to compute through `target` (restoring its cached
    /// prefix of `cached` tokens on first scheduling) together with its state's: all or nothing.
    /// Returns the token blocks allocated, or None if they do not fit.
    pub(super) fn allocate_with_state(&mut self, slot: u32, cached: u32, before: u32, target: u32) -> Option<u32> {
        let bs = self.cfg.block_size;
        let hit_blocks = (cached / bs) as usize;
        let needs = self.state_needs(slot, cached, before, target);
        let req = &mut self.reqs[slot];
        let held = req.blocks.len().max(hit_blocks) as u32;
        let fresh = target.div_ceil(bs).saturating_sub(held);
        let mut hits: Vec<u64> = if req.blocks.is_empty() { req.hashes.seq[..hit_blocks].to_vec() } else { Vec::new() };
        let token_hits = hits.len();
        hits.extend(&needs.sources);
        if hits.is_empty() && fresh + needs.fresh == 0 {
            return Some(0);
        }
        let start = req.blocks.len();
        if !self.pool.allocate(&hits, fresh + needs.fresh, &mut req.blocks) {
            return None;
        }
        let state_fresh = req.blocks.split_off(req.blocks.len() - needs.fresh as usize);
        let sources: Vec<u32> =
            req.blocks.drain(start + token_hits..start + token_hits + needs.sources.len()).collect();
        self.state_allocated(slot, sources, state_fresh, target);
        Some(fresh)
    }

    /// Applies the state part of an allocation: `sources` are the saved copies read, `fresh`
    /// the new blocks `state_needs` asked for.
    pub(super) fn state_allocated(&mut self, slot: u32, sources: Vec<u32>, fresh: Vec<u32>, target: u32) {
        let Some(sc) = self.state_cache.as_mut() else { return };
        if fresh.is_empty() {
            return;
        }
        let bs = self.cfg.block_size;
        let st = &mut self.reqs[slot].state.cache;
        if st.working.is_empty() {
            st.working = fresh;
            st.block = Some(target.saturating_sub(1) / bs);
            match sc.unit {
                // Default retention reads the source within the allocation.
                None => sources.into_iter().for_each(|c| self.pool.release(c)),
                Some(_) => st.held.extend(sources),
            }
            return;
        }
        let new_block = Some((target - 1) / bs);
        if sc.unit.is_some() && st.block != new_block {
            // The working state moves on; the old one is read by this pass's forward.
            let old = std::mem::replace(&mut st.working, fresh);
            st.held.extend(old);
            st.block = new_block;
            st.live = None;
            return;
        }
        // The live saved state is about to be overwritten: keep it in fresh copies.
        let prefix = st.live.take().expect("a write into a saved state");
        for (&copy, key) in fresh.iter().zip(sc.keys(prefix)) {
            self.pool.cache(copy, key);
        }
        for &copy in &st.working {
            self.pool.uncache(copy);
        }
        match sc.unit {
            None => {
                st.saved = Some(prefix);
                fresh.into_iter().for_each(|c| self.pool.release(c));
            }
            Some(_) => st.held.extend(fresh),
        }
    }

    /// After `slot` computed through `target`: saves its state where the mode says.
    pub(super) fn state_commit(&mut self, slot: u32, before: u32, target: u32) {
        let Some(sc) = self.state_cache.as_ref() else { return };
        let req = &self.reqs[slot];
        if target == before || req.state.cache.working.is_empty() || !self.cfg.enable_prefix_caching {
            return;
        }
        let bs = self.cfg.block_size;
        let save = match sc.unit {
            None => target.is_multiple_of(bs),
            Some(unit) => {
                let prompt = req.prompt_len;
                let tail = prompt / unit * unit;
                let replay_full = prompt.saturating_sub(1) / bs * bs;
                target.is_multiple_of(unit) && (target == replay_full || (target == tail && !target.is_multiple_of(bs)))
            }
        };
        let Some(prefix) = save.then(|| self.state_prefix(req, target)).flatten() else { return };
        let sc = self.state_cache.as_mut().expect("state cache on");
        let st = &mut self.reqs[slot].state.cache;
        if let Some(older) = st.saved.take() {
            // Default retention keeps one saved state per request.
            for key in sc.keys(older) {
                self.pool.discard_inactive(key);
            }
        }
        for (&copy, key) in st.working.iter().zip(sc.keys(prefix)) {
            self.pool.cache(copy, key);
        }
        st.live = Some(prefix);
        st.saved_now = Some(prefix);
        sc.published.insert(prefix);
    }

    /// Frees the state of `slot` (finished, aborted or preempted); saved states stay cached.
    /// A preempted request also drops the state it saved in this pass.
    pub(super) fn state_release(&mut self, slot: u32, preempted: bool) {
        let Some(sc) = self.state_cache.as_ref() else { return };
        let st = std::mem::take(&mut self.reqs[slot].state.cache);
        for copy in st.held.into_iter().chain(st.working.into_iter().rev()) {
            self.pool.release(copy);
        }
        if let (true, Some(prefix)) = (preempted, st.saved_now.filter(|p| sc.published.contains(p))) {
            for key in sc.keys(prefix) {
                self.pool.discard_inactive(key);
            }
        }
    }
}
