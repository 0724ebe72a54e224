//! The SGLang-style scheduler: a radix prefix cache over pages and SGLang's batch policy
//! (`get_next_batch_to_run`, `update_running_batch`, `retract_decode`).
//!
//! One call to [`SglangEngine::step`] is one forward pass, either
//!
//! * a **prefill** pass: waiting requests are admitted (FIFO, or longest-prefix-match first)
//!   while the page budget — free pages plus evictable cache, minus the output still promised to
//!   running requests (scaled by the adaptive `new_token_ratio`) — the per-pass prefill budget
//!   and the chunk budget allow. Prompts longer than the chunk budget run in chunks, one chunked
//!   request per pass. Requests whose prompt completes get their first token from the prefill
//!   forward, and a KV slot for it right away (if the cache has none, the token waits for the
//!   next decode pass); running requests wait. The pass costs prefill time only.
//! * or a **decode** pass, when nothing was admitted: every running request samples a token
//!   and gets its KV slot in the same step. If the pages to hold them are short, the first
//!   running request with the fewest generated tokens is retracted (its pages outside the cache
//!   are freed and it goes to the back of the queue, to re-prefill later) until they fit, and
//!   `new_token_ratio` is re-estimated from the survivors; otherwise the ratio decays.
//!
//! Full pages enter the radix tree as soon as their tokens have slots (see [`radix`] for the
//! least-recently-used order); KV events are reported for pages entering and leaving the tree.

pub mod radix;

use std::collections::VecDeque;
use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::config::{EngineConfig, Role};
use crate::engine::{EngineCounters, EngineOptions};
use crate::handoff::{Destinations, Reserved};
use crate::hash::{chain_hash, local_block_hash};
use crate::output::{Admission, Finish, Finished, KvEvent, PassOutput, RejectReason, StoredBlock, TokenOut};
use crate::request::{EngineRequest, OutputPlan, Prompt};
use crate::speculative::BurstSampler;
use crate::timing::{pass_duration_ms, DecodeShape};
use radix::{NodeId, PagePool, RadixCache, ROOT};

/// LPM ordering is skipped when more requests than this wait.
const LPM_FALLBACK_THRESHOLD: usize = 128;
/// A request whose cached prefix is at most this many tokens is checked against the prefixes of
/// requests ahead of it in the queue; if they share this many leading tokens it goes later.
const IN_BATCH_PREFIX_TOKENS: u32 = 32;
/// SGLang's `SGLANG_RETRACT_DECODE_STEPS`: decode steps of headroom per surviving request when
/// a retraction re-estimates `new_token_ratio`.
const RETRACT_DECODE_STEPS: f64 = 20.0;

#[derive(Debug)]
struct Req {
    id: u64,
    prompt: Prompt,
    prompt_len: u32,
    max_output: u32,
    /// How its output tokens are chosen.
    output: OutputPlan,
    generated: u32,
    /// Local hashes of the leading full pages of the known sequence, computed when a waiting
    /// request is matched against the cache and dropped once it is admitted.
    keys: Vec<u64>,
    /// Pages allocated to it, backing tokens `[0, pages.len() × page)`.
    pages: Vec<u32>,
    /// Leading pages owned by the radix tree (locked through `lock_node`); the rest are the
    /// request's own.
    tree_pages: usize,
    lock_node: NodeId,
    /// Tokens that have a KV slot: computed prompt tokens and sampled tokens. 0 while it waits
    /// for its first admission or after a retraction.
    materialized: u32,
    admitted_before: bool,
    /// Prompt computed elsewhere (disaggregated decode).
    transferred: bool,
}

impl Req {
    fn len(&self) -> u32 {
        self.prompt_len + self.generated
    }

    /// Token at position `pos` of the known sequence (prompt, then output).
    fn token_at(&self, pos: u32) -> u32 {
        if pos < self.prompt_len {
            self.prompt.token(pos)
        } else {
            self.output.token(pos - self.prompt_len)
        }
    }

    fn remaining_output(&self) -> u32 {
        self.max_output - self.generated
    }

    fn done(&self) -> bool {
        self.generated >= self.max_output
    }

    /// Appends the local hashes of full pages `pages` of the known sequence to `out`. Pages
    /// made of one repeated token (a trace block cut into pages) share a hash, computed once per
    /// block; `memo` carries the last one across calls.
    fn page_keys(
        &self,
        pages: std::ops::Range<usize>,
        page: u32,
        scratch: &mut [u32],
        memo: &mut (u32, u64),
        out: &mut Vec<u64>,
    ) {
        let mut i = pages.start;
        while i < pages.end {
            let start = i as u32 * page;
            if let Prompt::Runs { run, ids, .. } = &self.prompt {
                let end = start + page - 1;
                if end < self.prompt_len && start / run == end / run {
                    let token = ids[(start / run) as usize];
                    if memo.0 != token || memo.1 == 0 {
                        scratch.fill(token);
                        *memo = (token, local_block_hash(scratch));
                    }
                    // Every page up to the end of this block has the same hash.
                    let block_end = ((start / run + 1) * run).min(self.prompt_len);
                    let same = ((block_end - start) / page) as usize;
                    let n = same.min(pages.end - i).max(1);
                    out.extend(std::iter::repeat_n(memo.1, n));
                    i += n;
                    continue;
                }
            }
            for (k, t) in scratch.iter_mut().enumerate() {
                *t = self.token_at(start + k as u32);
            }
            out.push(local_block_hash(scratch));
            i += 1;
        }
    }
}

/// The SGLang-style engine.
#[derive(Debug)]
pub struct SglangEngine {
    cfg: EngineConfig,
    page: u32,
    pool: PagePool,
    tree: RadixCache,
    reqs: Vec<Option<Req>>,
    free_slots: Vec<u32>,
    waiting: VecDeque<u32>,
    running: Vec<u32>,
    /// Prefill worker: finished requests whose KV waits for the decode side. Decode worker:
    /// requests with pages reserved for a transfer in flight.
    parked: FxHashMap<u64, u32>,
    /// Decode worker: transferred requests ready to join the running batch.
    arrived: VecDeque<u32>,
    /// Decode worker: accepted requests waiting for their pages.
    destinations: Destinations,
    new_token_ratio: f64,
    min_ratio: f64,
    decay_step: f64,
    counters: EngineCounters,
    /// Speculative decoding's burst sampler, and the largest burst.
    sampler: Option<BurstSampler>,
    max_burst: u32,
    record_events: bool,
    events: Vec<KvEvent>,
    scratch_tokens: Vec<u32>,
    /// The last single-token page hashed (see [`Req::page_keys`]).
    key_memo: (u32, u64),
    /// Keys and sequence hashes of the pages of one radix insertion.
    scratch_keys: Vec<u64>,
    scratch_seqs: Vec<u64>,
    /// Ids generated tokens are drawn from (see [`crate::Engine::set_output_vocabulary`]).
    vocabulary: Option<Arc<[u32]>>,
    /// Record the tokens of stored pages, drained into [`PassOutput::stored_tokens`].
    record_tokens: bool,
    stored_tokens: Vec<u32>,
}

impl SglangEngine {
    pub fn new(cfg: EngineConfig, options: EngineOptions) -> Self {
        let page = cfg.block_size;
        let init_ratio = 0.7 * cfg.sglang.schedule_conservativeness;
        let min_ratio = init_ratio * 0.14;
        let max_burst = match (&cfg.speculative, cfg.role) {
            (Some(s), t) if t != Role::Prefill => s.max_burst(),
            _ => 1,
        };
        let record_events =
            options.record_kv_events && cfg.enable_prefix_caching && cfg.role != Role::Decode;
        SglangEngine {
            page,
            pool: PagePool::new(cfg.num_gpu_blocks),
            tree: RadixCache::new(page, cfg.num_gpu_blocks, record_events),
            reqs: Vec::new(),
            free_slots: Vec::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            parked: FxHashMap::default(),
            arrived: VecDeque::new(),
            destinations: Destinations::default(),
            new_token_ratio: init_ratio,
            min_ratio,
            decay_step: (init_ratio - min_ratio) / 600.0,
            counters: EngineCounters::default(),
            sampler: cfg.speculative.as_ref().map(|s| BurstSampler::new(s, options.engine_index)),
            max_burst,
            record_events,
            events: Vec::new(),
            scratch_tokens: vec![0; page as usize],
            key_memo: (0, 0),
            scratch_keys: Vec::new(),
            scratch_seqs: Vec::new(),
            vocabulary: None,
            record_tokens: false,
            stored_tokens: Vec::new(),
            cfg,
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    pub fn set_output_vocabulary(&mut self, vocabulary: Option<Arc<[u32]>>) {
        self.vocabulary = vocabulary;
    }

    pub fn set_record_block_tokens(&mut self, on: bool) {
        self.record_tokens = on;
    }

    /// Removes request `id` wherever it is and frees its pages (unlocking its cached prefix,
    /// which stays in the tree). False if it is not here.
    pub fn abort(&mut self, id: u64) -> bool {
        if self.destinations.remove(id) {
            return true;
        }
        self.destinations.bump();
        let reqs = &self.reqs;
        let is_it = |s: &u32| reqs[*s as usize].as_ref().is_some_and(|r| r.id == id);
        let slot = if let Some(slot) = self.parked.remove(&id) {
            slot
        } else if let Some(pos) = self.running.iter().position(is_it) {
            self.running.remove(pos)
        } else if let Some(pos) = self.waiting.iter().position(is_it) {
            self.waiting.remove(pos).expect("position is in the queue")
        } else if let Some(pos) = self.arrived.iter().position(is_it) {
            self.arrived.remove(pos).expect("position is in the queue")
        } else {
            return false;
        };
        self.release(slot);
        self.remove(slot);
        true
    }

    fn new_req(&self, request: EngineRequest) -> Req {
        let (mut max_output, output) = request.output_plan(self.cfg.reasoning.as_ref());
        if let Some(limit) = self.cfg.max_model_len {
            max_output = max_output.min(limit.saturating_sub(request.prompt.len()));
        }
        Req {
            id: request.id,
            prompt_len: request.prompt.len(),
            prompt: request.prompt,
            max_output,
            output: output.with_vocabulary(self.vocabulary.clone()),
            generated: 0,
            keys: request.hashes.map(|h| h.local).unwrap_or_default(),
            pages: Vec::new(),
            tree_pages: 0,
            lock_node: ROOT,
            materialized: 0,
            admitted_before: false,
            transferred: false,
        }
    }

    fn insert_req(&mut self, req: Req) -> u32 {
        match self.free_slots.pop() {
            Some(s) => {
                self.reqs[s as usize] = Some(req);
                s
            }
            None => {
                self.reqs.push(Some(req));
                (self.reqs.len() - 1) as u32
            }
        }
    }

    fn req(&self, slot: u32) -> &Req {
        self.reqs[slot as usize].as_ref().expect("live request slot")
    }

    fn req_mut(&mut self, slot: u32) -> &mut Req {
        self.reqs[slot as usize].as_mut().expect("live request slot")
    }

    /// Computes the keys of `slot`'s full pages up to `pages` (fewer if the sequence is
    /// shorter).
    fn fill_keys(&mut self, slot: u32, pages: usize) {
        let page = self.page;
        let req = self.reqs[slot as usize].as_mut().expect("live request slot");
        let pages = pages.min((req.len() / page) as usize);
        if req.keys.len() < pages {
            let mut keys = std::mem::take(&mut req.keys);
            keys.reserve_exact(pages - keys.len());
            req.page_keys(keys.len()..pages, page, &mut self.scratch_tokens, &mut self.key_memo, &mut keys);
            req.keys = keys;
        }
    }

    pub fn submit(&mut self, request: EngineRequest) {
        let req = self.new_req(request);
        let slot = self.insert_req(req);
        self.waiting.push_back(slot);
    }

    pub fn has_work(&self) -> bool {
        !self.running.is_empty() || !self.waiting.is_empty() || !self.arrived.is_empty()
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len() + self.arrived.len() + self.destinations.len()
    }

    /// Pages held by requests or locked in the cache.
    pub fn active_blocks(&self) -> u32 {
        self.pool.total() - self.pool.available() - (self.tree.evictable_tokens() / self.page as u64) as u32
    }

    pub fn counters(&self) -> EngineCounters {
        self.counters
    }

    /// Tokens the pool could hand out now: free pages and unlocked cache.
    fn reservable_tokens(&self) -> u64 {
        self.pool.available() as u64 * self.page as u64 + self.tree.evictable_tokens()
    }

    fn ceil_page(&self, tokens: u32) -> u32 {
        tokens.div_ceil(self.page) * self.page
    }

    /// Frees pages for `pages` new ones by evicting cache if needed. False if impossible.
    fn make_room(&mut self, pages: u32) -> bool {
        let available = self.pool.available();
        if pages <= available {
            return true;
        }
        let mut freed = Vec::new();
        self.tree.evict((pages - available) as u64 * self.page as u64, &mut freed);
        self.pool.free(&freed);
        if self.record_events && !freed.is_empty() {
            self.events.push(KvEvent::Removed { hashes: freed.iter().map(|&p| self.tree.seq_of(p)).collect() });
        }
        pages <= self.pool.available()
    }

    /// Moves the first `full` pages of `slot` into the tree (those not there yet) and moves the
    /// request's lock to the deepest node covering them.
    fn cache_pages(&mut self, slot: u32, full: usize) {
        if !self.cfg.enable_prefix_caching || full <= self.req(slot).tree_pages {
            return;
        }
        let page = self.page;
        let req = self.reqs[slot as usize].as_mut().expect("live request slot");
        let first = req.tree_pages;
        let (keys, seqs) = (&mut self.scratch_keys, &mut self.scratch_seqs);
        keys.clear();
        seqs.clear();
        keys.reserve(full - first);
        req.page_keys(first..full, page, &mut self.scratch_tokens, &mut self.key_memo, keys);
        // The pages before `first` are the tree's: their sequence hashes are known.
        let parent = (self.record_events && first > 0).then(|| self.tree.seq_of(req.pages[first - 1]));
        if self.record_events {
            let mut last = parent;
            for &key in keys.iter() {
                let seq = chain_hash(last, key);
                seqs.push(seq);
                last = Some(seq);
            }
        }
        let inserted = self.tree.insert(req.lock_node, keys, &req.pages[first..full], seqs);
        if !inserted.duplicates.is_empty() {
            // Another request cached these pages first: use the tree's copies.
            self.pool.free(&inserted.duplicates);
            let tree_pages = self.tree.path_pages(inserted.node);
            req.pages[..full].copy_from_slice(&tree_pages[..full]);
        }
        if inserted.node != req.lock_node {
            self.tree.lock(inserted.node);
            self.tree.unlock(req.lock_node);
            req.lock_node = inserted.node;
        }
        req.tree_pages = full;
        if self.record_events && inserted.new_pages > 0 {
            let new = full - inserted.new_pages - first..full - first;
            let parent = if new.start == 0 { parent } else { Some(seqs[new.start - 1]) };
            let blocks = new.clone().map(|j| StoredBlock { hash: seqs[j], local: keys[j] }).collect();
            self.events.push(KvEvent::Stored { parent, blocks });
            if self.record_tokens {
                let tokens = (first + new.start) as u32 * page..full as u32 * page;
                self.stored_tokens.extend(tokens.map(|pos| req.token_at(pos)));
            }
        }
    }

    /// Frees the request's own pages and unlocks its cached prefix.
    fn release(&mut self, slot: u32) {
        let req = self.reqs[slot as usize].as_mut().expect("live request slot");
        self.pool.free(&req.pages[req.tree_pages..]);
        req.pages.clear();
        self.tree.unlock(req.lock_node);
        req.lock_node = ROOT;
        req.tree_pages = 0;
        req.materialized = 0;
    }

    fn remove(&mut self, slot: u32) -> Req {
        self.free_slots.push(slot);
        self.reqs[slot as usize].take().expect("live request slot")
    }

    /// A request that is done: its full pages with KV slots join the cache and it leaves (a
    /// prefill worker keeps it, with its pages, until the decode side has them).
    fn complete(&mut self, slot: u32, out: &mut PassOutput) {
        let id = self.req(slot).id;
        out.finished.push(Finished { request: id, finish: Finish::Completed });
        if self.cfg.role == Role::Prefill {
            self.parked.insert(id, slot);
        } else {
            self.retire(slot);
        }
    }

    fn retire(&mut self, slot: u32) {
        self.destinations.bump();
        let req = self.req(slot);
        let full = (req.len().min(req.materialized) / self.page) as usize;
        self.cache_pages(slot, full);
        self.release(slot);
        self.remove(slot);
    }

    fn reject(&mut self, slot: u32, reason: RejectReason, out: &mut PassOutput) {
        self.release(slot);
        let req = self.remove(slot);
        out.finished.push(Finished { request: req.id, finish: Finish::Rejected(reason) });
    }

    /// Orders the waiting queue: longest cached prefix first (LPM), with requests whose short
    /// prefix duplicates one ahead of them pushed back.
    fn order_waiting(&mut self) {
        if !self.cfg.sglang.lpm || !self.cfg.enable_prefix_caching || self.waiting.len() > LPM_FALLBACK_THRESHOLD {
            return;
        }
        let probe_pages = IN_BATCH_PREFIX_TOKENS.div_ceil(self.page) as usize;
        let mut seen = FxHashSet::default();
        let mut keyed: Vec<(bool, std::cmp::Reverse<usize>, u32)> = Vec::with_capacity(self.waiting.len());
        for i in 0..self.waiting.len() {
            let slot = self.waiting[i];
            self.fill_keys(slot, usize::MAX);
            let req = self.req(slot);
            let prefix = self.tree.peek(&req.keys);
            let mut later = false;
            if prefix as u32 * self.page <= IN_BATCH_PREFIX_TOKENS && req.keys.len() >= probe_pages {
                let identity = req.keys[..probe_pages].iter().fold(None, |parent, &k| Some(chain_hash(parent, k)));
                later = !seen.insert(identity);
            }
            keyed.push((later, std::cmp::Reverse(prefix), slot));
        }
        keyed.sort_by_key(|k| (k.0, k.1));
        self.waiting = keyed.into_iter().map(|k| k.2).collect();
    }

    /// Requests whose prompt reaches `max_model_len` leave at the start of a pass.
    fn reject_too_long(&mut self, out: &mut PassOutput) {
        let Some(limit) = self.cfg.max_model_len else { return };
        let mut kept = VecDeque::with_capacity(self.waiting.len());
        for slot in std::mem::take(&mut self.waiting) {
            if self.req(slot).prompt_len >= limit {
                self.reject(slot, RejectReason::ExceedsMaxModelLen, out);
            } else {
                kept.push_back(slot);
            }
        }
        self.waiting = kept;
    }

    pub fn step(&mut self, now_ms: f64, out: &mut PassOutput) {
        out.clear();
        out.start_ms = now_ms;
        // Transferred requests (decode worker) join the batch; while some still wait for a
        // slot, nothing new is prefilled.
        let max_running = self.cfg.max_num_seqs.map_or(usize::MAX, |m| m as usize);
        while self.running.len() < max_running {
            let Some(slot) = self.arrived.pop_front() else { break };
            let req = self.req_mut(slot);
            let id = req.id;
            self.running.push(slot);
            out.admissions.push(Admission { request: id, reused_tokens: 0, readmission: false });
        }
        self.reject_too_long(out);
        self.order_waiting();
        // Nothing is prefilled while transferred requests wait for a running slot, nor, on a
        // decode worker, while accepted requests wait for pages.
        let admitted = if self.arrived.is_empty() && self.destinations.is_empty() {
            self.build_prefill_batch(out, max_running)
        } else {
            Vec::new()
        };
        let held = !self.parked.is_empty() || !self.destinations.is_empty();
        if admitted.is_empty() && self.running.is_empty() && self.arrived.is_empty() && !held {
            if let Some(slot) = self.waiting.pop_front() {
                // Nothing runs, nothing holds pages that will come back, and the head still
                // cannot be admitted: it never will be.
                let reason = self.never_admissible(slot);
                self.reject(slot, reason, out);
            }
        }
        let prefill_ms = self.cfg.timing.prefill_ms(&out.prefill);
        let decode_start = now_ms + pass_duration_ms(prefill_ms, self.cfg.speedup_ratio);
        out.end_ms = if admitted.is_empty() {
            self.decode(decode_start, out)
        } else {
            self.finish_prefill(&admitted, out);
            decode_start
        };
        out.kv_events.append(&mut self.events);
        out.stored_tokens.append(&mut self.stored_tokens);
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
    fn never_admissible(&self, slot: u32) -> RejectReason {
        let req = self.req(slot);
        let chunk = self.chunk_of(req.len() - req.materialized, self.cfg.sglang.chunked_prefill_size as i64);
        if self.ceil_page(chunk) > self.cfg.sglang.max_prefill_tokens {
            RejectReason::ExceedsPrefillBudget
        } else {
            RejectReason::ExceedsKvCapacity
        }
    }

    /// Admits waiting requests into this pass's prefill batch; returns them in order.
    fn build_prefill_batch(&mut self, out: &mut PassOutput, max_running: usize) -> Vec<u32> {
        let page = self.page;
        let clip = self.cfg.sglang.clip_max_new_tokens;
        let promised: f64 =
            self.running.iter().map(|&s| self.req(s).remaining_output().min(clip) as f64 * self.new_token_ratio).sum();
        let mut rem_total = self.reservable_tokens() as f64 - promised;
        let mut rem_input = self.cfg.sglang.max_prefill_tokens as i64;
        let mut rem_chunk = self.cfg.sglang.chunked_prefill_size as i64;
        let decode_worker = self.cfg.role == Role::Decode;
        let mut admitted = Vec::new();
        while let Some(&slot) = self.waiting.get(admitted.len()) {
            if self.running.len() + admitted.len() >= max_running {
                break;
            }
            let fresh = self.req(slot).materialized == 0;
            // A fresh request matches its sequence once, never its last token when it still has
            // one to sample; a chunked continuation goes on from the tokens it holds.
            let cached = if fresh && self.cfg.enable_prefix_caching {
                let req = self.req(slot);
                let match_len = if req.done() { req.len() } else { req.len() - 1 };
                self.fill_keys(slot, (match_len / page) as usize);
                let req = self.req(slot);
                let limit = ((match_len / page) as usize).min(req.keys.len());
                self.tree.peek(&req.keys[..limit])
            } else {
                0
            };
            let req = self.req(slot);
            let start = req.materialized.max(cached as u32 * page);
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
                let req = self.reqs[slot as usize].as_ref().expect("live request slot");
                let m = self.tree.match_and_lock(&req.keys[..cached]);
                let req = self.req_mut(slot);
                req.keys = Vec::new();
                req.pages = m.pages;
                req.tree_pages = cached;
                req.lock_node = m.node;
            }
            let need = chunk_end.div_ceil(page) - self.req(slot).pages.len() as u32;
            if need as u64 * page as u64 > self.reservable_tokens() || !self.make_room(need) {
                if fresh {
                    self.release(slot);
                }
                break;
            }
            let mut pages = std::mem::take(&mut self.req_mut(slot).pages);
            self.pool.alloc(need, &mut pages);
            let req = self.req_mut(slot);
            req.pages = pages;
            let before = req.materialized.max(cached as u32 * page);
            if fresh {
                let readmission = req.admitted_before;
                req.admitted_before = true;
                let id = req.id;
                self.counters.prefix_queries += req.len() as u64;
                self.counters.prefix_hits += before as u64;
                out.admissions.push(Admission { request: id, reused_tokens: before, readmission });
            }
            self.req_mut(slot).materialized = chunk_end;
            out.computed_tokens += chunk as u64;
            out.prefill_tokens += chunk as u64;
            // A decode worker's (re)prefill costs no time: it is not part of the prefill shape.
            if !decode_worker {
                out.prefill.batch += 1;
                out.prefill.total_isl += chunk_end as u64;
                out.prefill.total_prefix += before as u64;
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
    fn finish_prefill(&mut self, admitted: &[u32], out: &mut PassOutput) {
        let mut fresh = Vec::new();
        for &slot in admitted {
            let req = self.req(slot);
            if req.materialized < req.len() {
                let full = (req.materialized / self.page) as usize;
                self.cache_pages(slot, full);
                self.waiting.push_front(slot);
            } else {
                fresh.push(slot);
            }
        }
        let mut completed = Vec::new();
        fresh.retain(|&slot| {
            let req = self.req(slot);
            if req.done() {
                completed.push(slot);
                return false;
            }
            if req.remaining_output() == 1 {
                // Its only token finishes it: it never needs a slot.
                completed.push(slot);
                let req = self.reqs[slot as usize].as_mut().expect("live request slot");
                let token = req.output.token(req.generated);
                req.generated += 1;
                out.tokens.push(TokenOut { request: req.id, token });
                return false;
            }
            true
        });
        let need: u32 = fresh.iter().map(|&s| self.growth(s, 1)).sum();
        let page_need = need / self.page;
        if self.make_room(page_need) {
            for &slot in &fresh {
                self.sample_with_slot(slot, out);
                let full = (self.req(slot).materialized / self.page) as usize;
                self.cache_pages(slot, full);
            }
        }
        self.running.extend_from_slice(&fresh);
        for slot in completed {
            self.complete(slot, out);
        }
    }

    /// Tokens of new pages `slot` needs to give `burst` more tokens a slot.
    fn growth(&self, slot: u32, burst: u32) -> u32 {
        let r = self.req(slot);
        let burst = burst.min(r.remaining_output());
        self.ceil_page(r.len() + burst).saturating_sub(r.pages.len() as u32 * self.page)
    }

    /// Samples the next token of `slot` and gives it a KV slot (a new page at a page boundary).
    fn sample_with_slot(&mut self, slot: u32, out: &mut PassOutput) {
        let page = self.page;
        let req = self.reqs[slot as usize].as_mut().expect("live request slot");
        if req.materialized.is_multiple_of(page) && req.materialized / page >= req.pages.len() as u32 {
            let ok = self.pool.alloc(1, &mut req.pages);
            debug_assert!(ok, "room was made for every slot");
        }
        req.materialized += 1;
        let token = req.output.token(req.generated);
        req.generated += 1;
        out.tokens.push(TokenOut { request: req.id, token });
    }

    /// A decode pass over the running batch; returns its end time.
    fn decode(&mut self, decode_start: f64, out: &mut PassOutput) -> f64 {
        let mut completed = Vec::new();
        self.running.retain(|&s| {
            let done = self.reqs[s as usize].as_ref().expect("live request slot").done();
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
        while growth(self) > self.reservable_tokens() && self.running.len() > 1 {
            let (pos, _) = self
                .running
                .iter()
                .enumerate()
                .min_by_key(|(_, &s)| self.req(s).generated)
                .expect("running is not empty");
            let slot = self.running.remove(pos);
            self.release(slot);
            let req = self.req_mut(slot);
            req.keys = Vec::new();
            out.preempted.push(req.id);
            self.counters.preemptions += 1;
            retracted.push(slot);
        }
        if retracted.is_empty() {
            self.new_token_ratio = (self.new_token_ratio - self.decay_step).max(self.min_ratio);
        } else {
            // SGLang's `retract_decode`: headroom for the survivors from what they generated.
            let (decoded, max_new) = self.running.iter().fold((0u64, 0u64), |(d, m), &s| {
                let r = self.req(s);
                (d + r.generated as u64, m + r.max_output as u64)
            });
            let n = self.running.len() as f64;
            self.new_token_ratio = ((decoded as f64 + RETRACT_DECODE_STEPS * n) / (max_new as f64 + 1.0)).min(1.0);
            self.destinations.bump();
        }
        let mut end = decode_start;
        if !self.running.is_empty() {
            let need = (growth(self) / self.page as u64) as u32;
            if self.make_room(need) {
                end = self.decode_running(decode_start, out);
            } else {
                // A lone request the cache cannot grow: SGLang would stop here for good.
                for slot in std::mem::take(&mut self.running) {
                    let r = self.req(slot);
                    let own = r.len() as u64 + max_burst.min(r.remaining_output()) as u64;
                    let reason = if own > self.cfg.kv_capacity_tokens() {
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

    /// Every running request samples its burst, each token with its KV slot; returns the end of
    /// the pass.
    fn decode_running(&mut self, decode_start: f64, out: &mut PassOutput) -> f64 {
        let capacity = self.cfg.kv_capacity_tokens();
        let context: u64 = self.running.iter().map(|&s| self.req(s).len() as u64).sum();
        let shape = DecodeShape {
            batch: self.running.len() as u32,
            context_tokens: context.min(capacity),
            capacity_tokens: capacity,
        };
        out.decode = shape;
        let prefill_worker = self.cfg.role == Role::Prefill;
        let decode_ms = if prefill_worker { 0.0 } else { self.cfg.timing.decode_ms(&shape) };
        let ratio = self.cfg.speedup_ratio * self.cfg.decode_speedup_ratio;
        let end = decode_start + pass_duration_ms(decode_ms, ratio);
        let mut completed = Vec::new();
        for i in 0..self.running.len() {
            let slot = self.running[i];
            let remaining = self.req(slot).remaining_output();
            let burst = match self.sampler.as_mut() {
                Some(sampler) if !prefill_worker => sampler.sample(remaining),
                _ => remaining.min(1),
            };
            out.decode_forwards += 1;
            out.decode_tokens += burst;
            out.computed_tokens += burst as u64;
            for _ in 0..burst {
                self.sample_with_slot(slot, out);
                if self.req(slot).done() {
                    completed.push(slot);
                    break;
                }
                let full = (self.req(slot).materialized / self.page) as usize;
                self.cache_pages(slot, full);
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

    /// Decode worker: accepts a request whose prompt is computed elsewhere; it waits for its
    /// pages in [`SglangEngine::retry_destination`]. Refused if it can never fit.
    pub fn accept_destination(&mut self, request: EngineRequest) -> Result<(), RejectReason> {
        let prompt = request.prompt.len();
        if self.cfg.max_model_len.is_some_and(|m| prompt >= m) {
            return Err(RejectReason::ExceedsMaxModelLen);
        }
        if self.ceil_page(prompt) as u64 > self.cfg.kv_capacity_tokens() {
            return Err(RejectReason::ExceedsKvCapacity);
        }
        self.destinations.push(request);
        Ok(())
    }

    /// Decode worker: tries to reserve pages for the oldest accepted request, if an attempt is
    /// due (see [`crate::handoff`]).
    pub fn retry_destination(&mut self) -> Option<Reserved> {
        self.destinations.due()?;
        let request = self.destinations.pop();
        let id = request.id;
        match self.reserve(request) {
            Ok(reused) => Some(Reserved { request: id, reused_tokens: reused }),
            Err(request) => {
                self.destinations.push_front(request);
                self.destinations.failed();
                None
            }
        }
    }

    /// Reserves pages for a prompt computed elsewhere (its cached prefix is matched and locked
    /// first, as SGLang does even when the rest does not fit).
    fn reserve(&mut self, request: EngineRequest) -> Result<u32, EngineRequest> {
        let page = self.page;
        let prompt_pages = request.prompt.len().div_ceil(page);
        let id = request.id;
        let slot = self.insert_req(self.new_req(request.clone()));
        let m = if self.cfg.enable_prefix_caching {
            self.fill_keys(slot, usize::MAX);
            let keys = std::mem::take(&mut self.req_mut(slot).keys);
            self.tree.match_and_lock(&keys)
        } else {
            radix::Match { pages: Vec::new(), node: ROOT }
        };
        let hit = m.pages.len();
        let need = prompt_pages - hit as u32;
        if need as u64 * page as u64 > self.reservable_tokens() {
            self.tree.unlock(m.node);
            self.remove(slot);
            return Err(request);
        }
        let room = self.make_room(need);
        debug_assert!(room, "room was checked");
        let req = self.reqs[slot as usize].as_mut().expect("live request slot");
        req.pages = m.pages;
        req.tree_pages = hit;
        req.lock_node = m.node;
        self.pool.alloc(need, &mut req.pages);
        let reused = hit as u32 * page;
        req.transferred = true;
        self.parked.insert(id, slot);
        Ok(reused)
    }

    /// Decode worker: the KV of a reserved request arrived.
    pub fn activate(&mut self, id: u64) {
        let slot = self.parked.remove(&id).expect("activating a reserved request");
        let req = self.req_mut(slot);
        req.materialized = req.prompt_len;
        let full = (req.prompt_len / self.page) as usize;
        self.cache_pages(slot, full);
        self.arrived.push_back(slot);
    }

    /// Prefill worker: the decode side has the KV of `id`; its pages join the cache and the
    /// rest are freed.
    pub fn release_held(&mut self, id: u64) {
        let slot = self.parked.remove(&id).expect("releasing a held request");
        self.retire(slot);
        self.destinations.bump();
    }
}
