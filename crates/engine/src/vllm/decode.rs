//! The decode step of a pass: every request whose known tokens are all computed generates its
//! next token (a burst of accepted drafts with speculative decoding), and finished requests
//! leave.

use super::{Status, VllmEngine};
use crate::config::Role;
use crate::output::{Finish, Finished, PassOutput};
use crate::speculative::SpecSchedule;
use crate::timing::{jittered, pass_duration_ms, DecodeShape, PrefillShape};

impl VllmEngine {
    /// Generates a token for every request whose known tokens are all computed.
    pub(super) fn decode(&mut self, out: &mut PassOutput) {
        let speculative = self.sampler.is_some() && self.cfg.role != Role::Prefill;
        // Whether a just-prefilled request joins the draft forward (see `SpecSchedule`).
        let drafts_after_prefill =
            speculative && self.cfg.speculative.as_ref().is_some_and(|s| s.schedule == SpecSchedule::Dynamo);
        if speculative {
            self.reserve_bursts(drafts_after_prefill, out);
        }
        let mut shape = DecodeShape { capacity_tokens: self.cfg.kv_capacity_tokens(), ..DecodeShape::default() };
        for &slot in &self.running {
            let req = &self.reqs[slot];
            // A first token that comes out of this pass's prefill costs no decode time; every
            // other token does (even a first one, when the prompt was all cached or transferred).
            // With Dynamo's speculative decoding every ready request runs the decode forward (the
            // draft model follows the prefill).
            let decodes = drafts_after_prefill || req.generated > 0 || req.state.pass_prefill.is_none();
            if req.computed >= req.len() && decodes && !self.generation_done(req) {
                shape.batch += 1;
                shape.context_tokens += req.len() as u64;
            }
        }
        out.decode = shape;

        let mut done = std::mem::take(&mut self.scratch_done);
        for i in 0..self.running.len() {
            let slot = self.running[i];
            let req = &self.reqs[slot];
            if req.computed < req.len() {
                continue;
            }
            let decodes = drafts_after_prefill || req.generated > 0 || req.state.pass_prefill.is_none();
            if !self.generation_done(req) {
                // With speculative decoding a decode forward may yield a burst of tokens; a
                // first token out of the prefill forward is always alone, and under
                // aisimulate's schedule every first token is.
                let remaining = self.remaining(slot);
                let first_alone = !drafts_after_prefill && self.reqs[slot].generated == 0;
                let burst = match self.sampler.as_mut() {
                    Some(sampler) if speculative && decodes && !first_alone => sampler.sample(remaining),
                    _ => 1,
                };
                let before = self.reqs[slot].len();
                for _ in 0..burst {
                    self.generate(slot, out);
                }
                if decodes {
                    out.decode_forwards += 1;
                    out.decode_tokens += burst;
                }
                if burst > 1 && !self.generation_done(&self.reqs[slot]) {
                    // The accepted drafts are computed: only the last token dangles.
                    let after = self.reqs[slot].len() - 1;
                    self.reqs[slot].computed = after;
                    if self.cfg.enable_prefix_caching {
                        self.publish_computed_blocks(slot, before, after);
                    }
                }
                if speculative && !self.generation_done(&self.reqs[slot]) {
                    self.return_unused_burst_blocks(slot);
                }
            }
            if self.generation_done(&self.reqs[slot]) {
                done.push(slot);
            }
        }
        if !done.is_empty() {
            // A finished request frees a running slot (and blocks, unless held for a handoff).
            self.destinations.bump();
            self.running.retain(|s| !done.contains(s));
            for &slot in &done {
                self.finish(slot, out);
            }
            done.clear();
        }
        self.scratch_done = done;
    }

    /// When a pass whose compute starts at `compute_start` ends: its prefill part, then its
    /// decode part (`out.decode`), or both as one forward when the timing model fuses them. A
    /// prefill worker's token comes out of the prefill forward: it has no decode part.
    pub(super) fn pass_end(&self, compute_start: f64, prefill: &PrefillShape, out: &PassOutput) -> f64 {
        let timing = &self.cfg.timing;
        let decodes = self.cfg.role != Role::Prefill;
        if decodes {
            if let Some(ms) = timing.fused_ms(prefill, &out.decode) {
                return compute_start + pass_duration_ms(jittered(&self.jitter, ms), self.cfg.speedup_ratio);
            }
        }
        let prefill_ms = jittered(&self.jitter, timing.prefill_ms(prefill));
        let decode_start = compute_start + pass_duration_ms(prefill_ms, self.cfg.speedup_ratio);
        let decode_ms = if decodes { jittered(&self.jitter, timing.decode_ms(&out.decode)) } else { 0.0 };
        decode_start + pass_duration_ms(decode_ms, self.cfg.speedup_ratio * self.cfg.decode_speedup_ratio)
    }

    /// A request that generated its last token leaves, freeing its blocks (a prefill worker
    /// keeps them until the decode worker has the KV).
    fn finish(&mut self, slot: u32, out: &mut PassOutput) {
        let id = self.reqs[slot].id;
        out.finished.push(Finished { request: id, finish: Finish::Completed });
        if self.cfg.role == Role::Prefill {
            self.reqs[slot].state.status = Status::Held;
            self.parked.insert(id, slot);
        } else {
            self.state_release(slot, false);
            let req = self.reqs.remove(slot);
            self.pool.release_lease(&req.blocks);
        }
    }

    /// Tokens `slot` may still generate.
    pub(super) fn remaining(&self, slot: u32) -> u32 {
        let req = &self.reqs[slot];
        let by_output = req.remaining_output();
        self.cfg.max_model_len.map_or(by_output, |m| by_output.min(m.saturating_sub(req.len())))
    }

    /// Speculative decoding: before the forward, every request that decodes gets the blocks a
    /// full burst could fill (a first token out of the prefill, when it comes alone, one token);
    /// requests are preempted (newest first) until that fits.
    fn reserve_bursts(&mut self, drafts_after_prefill: bool, out: &mut PassOutput) {
        let bs = self.cfg.block_size;
        let max_burst = self.cfg.speculative.as_ref().map_or(1, |s| s.max_burst());
        loop {
            let mut wants: Vec<(u32, u32)> = Vec::new();
            for &slot in &self.running {
                let req = &self.reqs[slot];
                if req.computed < req.len() || self.generation_done(req) {
                    continue;
                }
                let alone = !drafts_after_prefill && req.generated == 0;
                let burst = if alone { 1 } else { max_burst };
                let want = (req.len() + burst.min(self.remaining(slot))).div_ceil(bs);
                let extra = want.saturating_sub(req.blocks.len() as u32);
                if extra > 0 {
                    wants.push((slot, extra));
                }
            }
            let total: u32 = wants.iter().map(|w| w.1).sum();
            if self.pool.can_allocate(total) {
                for (slot, extra) in wants {
                    let ok = self.pool.allocate(&[], extra, &mut self.reqs[slot].blocks);
                    debug_assert!(ok);
                }
                return;
            }
            let Some(victim) = self.policy.victim(&self.running) else { return };
            // The prefill of this pass has run: a victim preempted here keeps the prompt work it
            // was scheduled for in the pass's committed prefill and prefill shape (the reference
            // retracts decode candidates after scheduling but keeps executed prefill in its
            // forward-pass metrics: `emit_speculative_ready_tokens` leaves `scheduled` alone,
            // scheduler/vllm/core.rs).
            let s = &mut self.reqs[victim].state;
            s.pass_tokens = 0;
            s.pass_committed = 0;
            s.pass_prefill = None;
            self.preempt(victim, out);
        }
    }

    /// After a burst, a request keeps the blocks its tokens occupy; the rest of its reservation
    /// goes back to the free pool (the reference reserves for a full burst, evicting cached
    /// blocks if it must, then takes from the reservation only what the accepted tokens fill
    /// and cancels the remainder: `emit_speculative_ready_tokens` in scheduler/vllm/core.rs,
    /// `BlockPool::cancel`). The evictions stay done; the unused blocks are free, not active.
    fn return_unused_burst_blocks(&mut self, slot: u32) {
        let req = &mut self.reqs[slot];
        let keep = req.len().div_ceil(self.cfg.block_size) as usize;
        while req.blocks.len() > keep {
            let copy = req.blocks.pop().expect("a block beyond the kept ones");
            self.pool.release(copy);
        }
    }

    /// Appends one generated token; hashes the block it completes.
    fn generate(&mut self, slot: u32, out: &mut PassOutput) {
        out.tokens.push(self.reqs[slot].next_token());
        self.hash_filled_block(slot);
    }

    /// With prefix caching, hashes the block the last generated token filled, if it did.
    pub(super) fn hash_filled_block(&mut self, slot: u32) {
        let bs = self.cfg.block_size;
        let req = &mut self.reqs[slot];
        let len = req.len();
        if self.cfg.enable_prefix_caching && len.is_multiple_of(bs) {
            let key = req.block_key(len / bs - 1, &mut self.scratch_tokens);
            req.hashes.push_local(key);
        }
    }
}
