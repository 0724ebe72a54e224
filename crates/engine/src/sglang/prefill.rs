//! Prefill passes: the waiting queue's order, which requests (and how much of each) a pass
//! admits, and what becomes of them when it ends.

use std::collections::VecDeque;

use rustc_hash::FxHashSet;

use super::{radix, SglangEngine};
use crate::config::Role;
use crate::hash::chain_hash;
use crate::output::{Admission, PassOutput, RejectReason};

/// LPM ordering is skipped when more requests than this wait.
const LPM_FALLBACK_THRESHOLD: usize = 128;
/// A request whose cached prefix is at most this many tokens is checked against the prefixes of
/// requests ahead of it in the queue; if they share this many leading tokens it goes later.
const IN_BATCH_PREFIX_TOKENS: u32 = 32;

impl SglangEngine {
    /// Orders the waiting queue: longest cached prefix first (LPM), with requests whose short
    /// prefix duplicates one ahead of them pushed back.
    pub(super) fn order_waiting(&mut self) {
        if !self.cfg.sglang.lpm || !self.cfg.enable_prefix_caching || self.waiting.len() > LPM_FALLBACK_THRESHOLD {
            return;
        }
        let probe_pages = IN_BATCH_PREFIX_TOKENS.div_ceil(self.page) as usize;
        let mut seen = FxHashSet::default();
        let mut keyed: Vec<(bool, std::cmp::Reverse<usize>, u32)> = Vec::with_capacity(self.waiting.len());
        for i in 0..self.waiting.len() {
            let slot = self.waiting[i];
            self.fill_keys(slot, usize::MAX);
            let (keys, key_pages) = (&self.reqs[slot].state.keys, self.reqs[slot].state.key_pages);
            let prefix = self.tree.peek(keys, key_pages);
            let mut later = false;
            if prefix as u32 * self.page <= IN_BATCH_PREFIX_TOKENS && key_pages >= probe_pages {
                let identity =
                    radix::expand(keys).take(probe_pages).fold(None, |parent, k| Some(chain_hash(parent, k)));
                later = !seen.insert(identity);
            }
            keyed.push((later, std::cmp::Reverse(prefix), slot));
        }
        keyed.sort_by_key(|k| (k.0, k.1));
        self.waiting = keyed.into_iter().map(|k| k.2).collect();
    }

    /// Requests whose prompt reaches `max_model_len` leave at the start of a pass.
    pub(super) fn reject_too_long(&mut self, out: &mut PassOutput) {
        let Some(limit) = self.cfg.max_model_len else { return };
        let mut kept = VecDeque::with_capacity(self.waiting.len());
        for slot in std::mem::take(&mut self.waiting) {
            if self.reqs[slot].prompt_len >= limit {
                self.reject(slot, RejectReason::ExceedsMaxModelLen, out);
            } else {
                kept.push_back(slot);
            }
        }
        self.waiting = kept;
    }

    /// The first chunk of `extend` tokens that fits a chunk budget of `budget` tokens: all of
    /// it if its pages fit, else whole pages (0 if not even one page fits).
    fn chunk_of(&self, extend: u32, budget: i64) -> u32 {
        if self.ceil_page(extend) as i64 <= budget {
            extend
        } else {
            ((budget.max(0) as u32 / self.page) * self.page).min(extend)
        }
    }

    /// Why a waiting request that cannot be admitted into an idle engine never will be.
    pub(super) fn never_admissible(&self, slot: u32) -> RejectReason {
        let req = &self.reqs[slot];
        let chunk = self.chunk_of(req.len() - req.computed, self.cfg.sglang.chunked_prefill_size as i64);
        if self.ceil_page(chunk) > self.cfg.sglang.max_prefill_tokens {
            RejectReason::ExceedsPrefillBudget
        } else {
            RejectReason::ExceedsKvCapacity
        }
    }

    /// Admits waiting requests into this pass's prefill batch; returns them in order.
    pub(super) fn build_prefill_batch(&mut self, out: &mut PassOutput, max_running: usize) -> Vec<u32> {
        let page = self.page;
        let clip = self.cfg.sglang.clip_max_new_tokens;
        let promised: f64 =
            self.running.iter().map(|&s| self.reqs[s].remaining_output().min(clip) as f64 * self.new_token_ratio).sum();
        let mut rem_total = self.reservable_tokens() as f64 - promised;
        let mut rem_input = self.cfg.sglang.max_prefill_tokens as i64;
        let mut rem_chunk = self.cfg.sglang.chunked_prefill_size as i64;
        let decode_worker = self.cfg.role == Role::Decode;
        self.pass_images.clear();
        let mut admitted = Vec::new();
        while let Some(&slot) = self.waiting.get(admitted.len()) {
            if self.running.len() + admitted.len() >= max_running {
                break;
            }
            let fresh = self.reqs[slot].computed == 0;
            // A fresh request matches its sequence once, never its last token when it still has
            // one to sample; a chunked continuation goes on from the tokens it holds.
            let cached = if fresh && self.cfg.enable_prefix_caching {
                let req = &self.reqs[slot];
                let match_len = if req.output_done() { req.len() } else { req.len() - 1 };
                self.fill_keys(slot, (match_len / page) as usize);
                let state = &self.reqs[slot].state;
                let limit = ((match_len / page) as usize).min(state.key_pages);
                self.tree.peek(&state.keys, limit)
            } else {
                0
            };
            let req = &self.reqs[slot];
            let start = req.computed.max(cached as u32 * page);
            let extend = req.len() - start;
            if extend == 0 && !fresh {
                break;
            }
            let chunk = self.chunk_of(extend, rem_chunk);
            if chunk == 0 && extend > 0 {
                break;
            }
            // Budgets are charged for whole pages of computed tokens, not the cached prefix.
            let charged = self.ceil_page(chunk);
            let reserve_out = if chunk < extend { 0 } else { req.remaining_output().min(clip) };
            if (charged + reserve_out) as f64 >= rem_total || charged as i64 > rem_input || charged as i64 > rem_chunk {
                break;
            }
            let chunk_end = start + chunk;
            if fresh {
                let m = self.tree.match_and_lock(&self.reqs[slot].state.keys, cached);
                let req = &mut self.reqs[slot];
                req.state.keys = Vec::new();
                req.state.key_pages = 0;
                req.state.pages = m.pages as u32;
                req.state.tree_pages = cached;
                req.state.lock_node = m.node;
            }
            let need = chunk_end.div_ceil(page) - self.reqs[slot].state.pages;
            if need as u64 * page as u64 > self.reservable_tokens() || !self.make_room(need) {
                if fresh {
                    self.release(slot);
                }
                break;
            }
            let req = &mut self.reqs[slot];
            self.pool.alloc(need);
            req.state.pages += need;
            let before = req.computed.max(cached as u32 * page);
            if fresh {
                let readmission = req.state.admitted_before;
                req.state.admitted_before = true;
                self.counters.prefix_queries += req.len() as u64;
                self.counters.prefix_hits += before as u64;
                out.admissions.push(Admission { request: req.id, reused_tokens: before, readmission, tiers: None });
            }
            req.computed = chunk_end;
            out.computed_tokens += chunk as u64;
            out.prefill_tokens += chunk as u64;
            // A decode worker's (re)prefill costs no time: it is not part of the prefill shape.
            if !decode_worker {
                out.prefill.batch += 1;
                out.prefill.total_isl += chunk_end as u64;
                out.prefill.total_prefix += before as u64;
            }
            if let Some(v) = &self.cfg.sglang.vision {
                self.pass_images.chunk(v, &self.reqs[slot].prompt, before, chunk_end);
            }
            rem_total -= (charged + reserve_out) as f64;
            rem_input -= charged as i64;
            rem_chunk -= charged as i64;
            admitted.push(slot);
            if rem_chunk <= 0 {
                break;
            }
        }
        self.waiting.drain(..admitted.len());
        admitted
    }

    /// After a prefill pass: unfinished prompts cache their computed pages and go back to the
    /// front of the queue; finished ones join the running batch with their first token, which
    /// gets a KV slot now if the cache has room (evicting only cache), all or none.
    pub(super) fn finish_prefill(&mut self, admitted: &[u32], out: &mut PassOutput) {
        let mut fresh = Vec::new();
        for &slot in admitted {
            let req = &self.reqs[slot];
            if req.computed < req.len() {
                let full = self.floor_pages(req.computed) as usize;
                self.cache_pages(slot, full);
                self.waiting.push_front(slot);
            } else {
                fresh.push(slot);
            }
        }
        let mut completed = Vec::new();
        fresh.retain(|&slot| {
            let req = &mut self.reqs[slot];
            if req.output_done() {
                completed.push(slot);
                return false;
            }
            if req.remaining_output() == 1 {
                // Its only token finishes it: it never needs a slot.
                completed.push(slot);
                out.tokens.push(req.next_token());
                return false;
            }
            true
        });
        let decoded_pages = self.cfg.sglang.cache_decoded_pages;
        if !decoded_pages {
            // What the prefill computed joins the cache; the first token's page does not.
            for &slot in &fresh {
                let full = self.floor_pages(self.reqs[slot].computed) as usize;
                self.cache_pages(slot, full);
            }
        }
        let need: u32 = fresh.iter().map(|&s| self.growth(s, 1)).sum();
        let page_need = need / self.page;
        if self.make_room(page_need) {
            for &slot in &fresh {
                self.sample_with_slot(slot, out);
                if decoded_pages {
                    let full = self.floor_pages(self.reqs[slot].computed) as usize;
                    self.cache_pages(slot, full);
                }
            }
        }
        self.running.extend_from_slice(&fresh);
        for slot in completed {
            self.complete(slot, out);
        }
    }
}
