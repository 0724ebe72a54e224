//! Fast-forward: several decode-only passes planned and committed at once, when nothing can
//! change during them. The passes and the final state are exactly those of pass-by-pass
//! [`VllmEngine::step`]s; only the work per pass goes.

use rustc_hash::FxHashMap;

use super::{AdmissionDecision, VllmEngine};
use crate::config::Role;
use crate::output::Stretch;
use crate::timing::{pass_duration_ms, DecodeShape};

impl VllmEngine {
    /// Plans several decode-only passes to run at once, when nothing can change during them:
    /// every running request is decoding (one budget token each), none completes, the waiting
    /// head cannot be admitted, every block a request grows into can be allocated without
    /// preempting anyone, and every pass starts before `horizon_ms` (when new work could
    /// arrive). When KV events are recorded no request may reach a block boundary either (the
    /// events of each pass must come out with it). The passes are exactly those
    /// [`VllmEngine::step`] would run; nothing changes until [`VllmEngine::commit_stretch`].
    /// Returns false when a normal step is needed (fewer than two passes qualify, or the first
    /// would take no time).
    pub fn plan_stretch(&mut self, now_ms: f64, horizon_ms: f64, out: &mut Stretch) -> bool {
        out.clear();
        let k = self.running.len() as u32;
        if k == 0
            || self.sampler.is_some()
            // Jittered passes are drawn one by one.
            || self.jitter.is_some()
            || self.cfg.role != Role::Aggregated
            // Host transfers complete at pass boundaries, one pass at a time.
            || self.host.is_some()
            // States are saved at block boundaries, one pass at a time.
            || self.state_cache.is_some()
            || k > self.cfg.max_num_batched_tokens.unwrap_or(u32::MAX)
        {
            return false;
        }
        let bs = self.cfg.block_size;
        let events = self.pool.records_events();
        let mut passes = u32::MAX;
        let mut context = 0u64;
        for &slot in &self.running {
            let r = &self.reqs[slot];
            let len = r.len();
            if r.generated == 0 || r.computed + 1 != len || self.generation_done(r) {
                return false;
            }
            // No completion: the pass that generates the last token is a normal step.
            passes = passes.min(self.remaining(slot).saturating_sub(1));
            if events {
                // No block boundary: positions len-1 ..= len+passes hold no multiple of the
                // block size (no new block to compute into, none fully computed, none filled).
                let boundary = (len - 1).div_ceil(bs) * bs;
                if boundary <= len {
                    return false;
                }
                passes = passes.min(boundary - len - 1);
            }
            context += len as u64;
        }
        if !events {
            passes = passes.min(self.passes_with_room(passes));
        }
        if passes < 2 {
            return false;
        }
        if let Some(&head) = self.waiting.front() {
            let slots_full = self.cfg.max_num_seqs.is_some_and(|m| self.running.len() >= m as usize);
            if !slots_full && !matches!(self.admission(head), AdmissionDecision::Wait) {
                return false;
            }
        }
        let capacity = self.cfg.kv_capacity_tokens();
        // A decode-only pass has no prefill part: it starts after a zero-length one.
        let prefill_part = pass_duration_ms(0.0, self.cfg.speedup_ratio);
        let decode_ratio = self.cfg.speedup_ratio * self.cfg.decode_speedup_ratio;
        let mut t = now_ms;
        for j in 0..passes {
            if t >= horizon_ms {
                break;
            }
            let shape = DecodeShape { batch: k, context_tokens: context + (j * k) as u64, capacity_tokens: capacity };
            let decode_ms = self.cfg.timing.decode_ms(&shape);
            let decode_start = t + prefill_part;
            t = decode_start + pass_duration_ms(decode_ms, decode_ratio);
            if !t.is_finite() {
                // The timing model cannot time this pass: let a normal step report it.
                out.clear();
                return false;
            }
            out.ends.push(t);
        }
        if out.ends.len() < 2 || out.ends[0] <= now_ms {
            out.clear();
            return false;
        }
        out.requests.extend(self.running.iter().map(|&slot| self.reqs[slot].id));
        true
    }

    /// How many of the next `passes` decode passes of every running request find the blocks
    /// they grow into without preempting anyone, and without evicting a block the waiting head
    /// would reuse (its admission could change). Called at nearly every pass of a busy worker,
    /// so its buffers are the engine's, reused.
    fn passes_with_room(&mut self, passes: u32) -> u32 {
        let bs = self.cfg.block_size;
        // Pass j of a request of length `len` computes position len-1+j, which needs a new
        // block when it is a multiple of the block size.
        let mut firsts = std::mem::take(&mut self.stretch_firsts);
        firsts.clear();
        firsts.extend(self.running.iter().map(|&slot| {
            let len = self.reqs[slot].len();
            (bs - (len - 1) % bs) % bs
        }));
        let room = self.room_for(&firsts, passes);
        self.stretch_firsts = firsts;
        room
    }

    fn room_for(&mut self, firsts: &[u32], passes: u32) -> u32 {
        let bs = self.cfg.block_size;
        let blocks_within =
            |m: u32| -> u64 { firsts.iter().map(|&j0| if j0 < m { ((m - 1 - j0) / bs + 1) as u64 } else { 0 }).sum() };
        let needed = blocks_within(passes);
        let free = self.pool.num_free() as u64;
        if needed <= free {
            return passes;
        }
        // The evictable blocks before the first one the waiting head could reuse (all of them
        // without a head). Positions in a map, then one pass over the head's hashes: a long head
        // prompt and a long eviction run cost their sum, not their product.
        let want = needed - free;
        let evictable = match self.waiting.front() {
            None => want.min(self.pool.num_inactive() as u64),
            Some(&head) => {
                let position = &mut self.stretch_positions;
                // Clearing costs the table's size: drop one that an unusually long run grew.
                if position.capacity() > 4 * (want as usize).max(256) {
                    *position = FxHashMap::default();
                }
                position.clear();
                let mut taken = 0;
                for h in self.pool.eviction_order().take(want as usize) {
                    position.entry(h).or_insert(taken);
                    taken += 1;
                }
                let head_hashes = &self.reqs[head].hashes.seq;
                head_hashes.iter().filter_map(|h| position.get(h)).min().copied().unwrap_or(taken)
            }
        };
        let room = free + evictable;
        if needed <= room {
            return passes;
        }
        // The largest m with blocks_within(m) <= room (it grows with m).
        let (mut lo, mut hi) = (0, passes);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if blocks_within(mid) <= room {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }

    /// Runs the first `passes` passes of a planned stretch: every running request generates
    /// that many tokens, allocating, caching and hashing blocks at block boundaries exactly as
    /// pass-by-pass steps would (same order, so the pool ends in the same state).
    pub fn commit_stretch(&mut self, passes: u32) {
        let bs = self.cfg.block_size;
        // Every running request continues through the stretch: each pass was scheduled ahead.
        self.passes += u64::from(passes);
        self.prescheduled = true;
        for _ in 0..passes {
            for i in 0..self.running.len() {
                let slot = self.running[i];
                let req = &mut self.reqs[slot];
                let (before, target) = (req.computed, req.computed + 1);
                req.computed = target;
                let fresh = target.div_ceil(bs).saturating_sub(req.blocks.len() as u32);
                if fresh > 0 {
                    let fits = self.pool.allocate(&[], fresh, &mut req.blocks);
                    assert!(fits, "plan_stretch checked the room");
                }
                // A pass adds one token, so a block completes only when that token fills it:
                // checked here, as this runs for every request in every pass of the stretch.
                if self.cfg.enable_prefix_caching && target.is_multiple_of(bs) {
                    self.publish_computed_blocks(slot, before, target);
                }
            }
            for i in 0..self.running.len() {
                let slot = self.running[i];
                self.reqs[slot].generated += 1;
                self.hash_filled_block(slot);
            }
        }
    }
}
