//! Decode passes: every running request samples its next token (or burst) with a KV slot for
//! each, after retraction has made the pages for them.

use super::SglangEngine;
use crate::config::Role;
use crate::output::{PassOutput, RejectReason};
use crate::timing::{jittered, pass_duration_ms, DecodeShape};

/// SGLang's `SGLANG_RETRACT_DECODE_STEPS`: decode steps of headroom per surviving request when
/// a retraction re-estimates `new_token_ratio`.
const RETRACT_DECODE_STEPS: f64 = 20.0;

impl SglangEngine {
    /// Tokens of new pages `slot` needs to give `burst` more tokens a slot.
    pub(super) fn growth(&self, slot: u32, burst: u32) -> u32 {
        let r = &self.reqs[slot];
        let burst = burst.min(r.remaining_output());
        self.ceil_page(r.len() + burst).saturating_sub(r.state.pages * self.page)
    }

    /// Samples the next token of `slot` and gives it a KV slot (a new page at a page boundary).
    pub(super) fn sample_with_slot(&mut self, slot: u32, out: &mut PassOutput) {
        let page = self.page;
        let whole = self.floor_pages(self.reqs[slot].computed);
        let req = &mut self.reqs[slot];
        if whole * page == req.computed && whole >= req.state.pages {
            let ok = self.pool.alloc(1);
            debug_assert!(ok, "room was made for every slot");
            req.state.pages += 1;
        }
        req.computed += 1;
        out.tokens.push(req.next_token());
    }

    /// A decode pass over the running batch; returns its end time.
    pub(super) fn decode(&mut self, decode_start: f64, out: &mut PassOutput) -> f64 {
        let mut completed = Vec::new();
        self.running.retain(|&s| {
            let done = self.reqs[s].output_done();
            if done {
                completed.push(s);
            }
            !done
        });
        for slot in completed.drain(..) {
            self.complete(slot, out);
        }
        // Retract until every running request's next burst has pages.
        let max_burst = self.max_burst;
        let growth = |e: &SglangEngine| -> u64 { e.running.iter().map(|&s| e.growth(s, max_burst) as u64).sum() };
        let mut retracted = Vec::new();
        let mut total_growth = growth(self);
        while total_growth > self.reservable_tokens() && self.running.len() > 1 {
            let pos = self.retraction_victim();
            let slot = self.running.remove(pos);
            self.release(slot);
            let req = &mut self.reqs[slot];
            req.state.keys = Vec::new();
            req.state.key_pages = 0;
            out.preempted.push(req.id);
            self.counters.preemptions += 1;
            retracted.push(slot);
            total_growth = growth(self);
        }
        if self.interval_idle_in_pass {
            // An idle round of the prefill/decode interval is no decode step: the ratio stays
            // (see `end_group_pass`).
        } else if retracted.is_empty() {
            self.new_token_ratio = (self.new_token_ratio - self.decay_step).max(self.min_ratio);
        } else {
            // SGLang's `retract_decode`: headroom for the survivors from what they generated.
            let (decoded, max_new) = self.running.iter().fold((0u64, 0u64), |(d, m), &s| {
                let r = &self.reqs[s];
                (d + r.generated as u64, m + r.max_output as u64)
            });
            let n = self.running.len() as f64;
            self.new_token_ratio = ((decoded as f64 + RETRACT_DECODE_STEPS * n) / (max_new as f64 + 1.0)).min(1.0);
            self.destinations.bump();
        }
        let mut end = decode_start;
        if self.running.is_empty() && !self.phantoms.is_empty() {
            // Host loop: only requests already finished are in the batch; it still runs.
            end = self.decode_running(decode_start, out);
        } else if !self.running.is_empty() {
            // Retraction is over: the running batch and its growth are as computed last.
            let need = (total_growth / self.page as u64) as u32;
            if self.make_room(need) {
                end = self.decode_running(decode_start, out);
            } else if self.cfg.role == Role::Decode && !self.running.iter().any(|&s| self.exceeds_capacity(s)) {
                // A disaggregated decode engine whose other pages are reserved for incoming
                // prompts: the request keeps its place and the pass does nothing, as Dynamo's
                // does; those prompts arrive, join the batch and retraction makes room.
            } else {
                // A lone request the cache cannot grow: SGLang would stop here for good.
                for slot in std::mem::take(&mut self.running) {
                    let reason = if self.exceeds_capacity(slot) {
                        RejectReason::ExceedsKvCapacity
                    } else {
                        RejectReason::KvHeldElsewhere
                    };
                    self.reject(slot, reason, out);
                }
            }
        }
        // Retracted requests queue behind everything that has not run yet.
        self.waiting.extend(retracted);
        end
    }

    /// The position in `running` of the request to retract: the fewest generated tokens, and
    /// among those the first (Dynamo's mocker) or, in SGLang's order, the longest prompt and
    /// then the latest admitted.
    fn retraction_victim(&self) -> usize {
        let generated = |pos: usize| self.reqs[self.running[pos]].generated;
        let positions = 0..self.running.len();
        let victim = if self.cfg.sglang.retract_in_sglang_order {
            positions
                .max_by_key(|&pos| (std::cmp::Reverse(generated(pos)), self.reqs[self.running[pos]].prompt_len, pos))
        } else {
            positions.min_by_key(|&pos| generated(pos))
        };
        victim.expect("running is not empty")
    }

    /// Whether `slot` with its next burst needs more KV than the whole cache holds.
    fn exceeds_capacity(&self, slot: u32) -> bool {
        let r = &self.reqs[slot];
        r.len() as u64 + self.max_burst.min(r.remaining_output()) as u64 > self.cfg.kv_capacity_tokens()
    }

    /// Every running request samples its burst, each token with its KV slot; returns the end of
    /// the pass.
    fn decode_running(&mut self, decode_start: f64, out: &mut PassOutput) -> f64 {
        // Σ sequence lengths, not capped at the capacity: requests that share a cached prefix
        // count it once each, so the sum may exceed the pool, and the reference times the pass
        // on the whole sum (its mean context) as well.
        // Host loop: requests that finished in the previous pass are still in the batch.
        let batch = self.running.iter().chain(self.phantoms.iter());
        let context: u64 = batch.map(|&s| self.reqs[s].len() as u64).sum();
        let shape = DecodeShape {
            batch: (self.running.len() + self.phantoms.len()) as u32,
            context_tokens: context,
            capacity_tokens: self.cfg.kv_capacity_tokens(),
        };
        out.decode = shape;
        let prefill_worker = self.cfg.role == Role::Prefill;
        let decode_ms = if prefill_worker { 0.0 } else { jittered(&self.jitter, self.cfg.timing.decode_ms(&shape)) };
        let ratio = self.cfg.speedup_ratio * self.cfg.decode_speedup_ratio;
        let end = decode_start + pass_duration_ms(decode_ms, ratio);
        let mut completed = Vec::new();
        for i in 0..self.running.len() {
            let slot = self.running[i];
            let remaining = self.reqs[slot].remaining_output();
            let burst = match self.sampler.as_mut() {
                Some(sampler) if !prefill_worker => sampler.sample(remaining),
                _ => remaining.min(1),
            };
            out.decode_forwards += 1;
            out.decode_tokens += burst;
            out.computed_tokens += burst as u64;
            for _ in 0..burst {
                self.sample_with_slot(slot, out);
                if self.reqs[slot].output_done() {
                    completed.push(slot);
                    break;
                }
                if self.cfg.sglang.cache_decoded_pages {
                    let full = self.floor_pages(self.reqs[slot].computed) as usize;
                    self.cache_pages(slot, full);
                }
            }
        }
        if !completed.is_empty() {
            self.running.retain(|s| !completed.contains(s));
            for slot in completed {
                self.complete(slot, out);
            }
        }
        end
    }
}
