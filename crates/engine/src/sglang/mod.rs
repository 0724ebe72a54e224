//! The SGLang-style scheduler: a radix prefix cache over pages and SGLang's batch policy.
//!
//! One call to [`SglangEngine::step`] is one forward pass, either
//!
//! * an **extend** pass: waiting requests are admitted (FIFO, or longest-prefix-match first)
//!   while the page budget — free pages plus evictable cache, minus the output still promised to
//!   running requests (scaled by the adaptive `new_token_ratio`) — the per-pass prefill budget
//!   and the chunk budget allow. Prompts longer than `chunked_prefill_size` run in chunks, one
//!   chunked request per pass. Only requests whose prompt completes get a token (their first);
//!   running requests wait for the next pass. The pass costs prefill time only.
//! * or a **decode** pass, when nothing was admitted: every running request generates a token.
//!   If the pages to hold them are short, the running request with the fewest generated tokens
//!   is retracted (its pages not in the cache are freed; it re-prefills later, reusing its
//!   cached prefix). Decode time uses the logical context of the whole batch.
//!
//! Computed full pages enter the radix tree as they are produced; KV events are reported for
//! pages entering and leaving the tree.

pub mod radix;

use std::collections::VecDeque;
use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::config::{EngineConfig, WorkerType};
use crate::engine::{EngineCounters, EngineOptions};
use crate::hash::{local_block_hash, BlockHashes};
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

#[derive(Debug)]
struct Req {
    id: u64,
    prompt: Prompt,
    prompt_len: u32,
    max_output: u32,
    /// How its output tokens are chosen.
    output: OutputPlan,
    generated: u32,
    /// Full pages of the known sequence: local and chained hashes.
    hashes: BlockHashes,
    /// Page ids backing tokens `[0, pages.len() × page)`.
    pages: Vec<u32>,
    /// Leading pages owned by the radix tree (locked through `lock_node`); the rest are the
    /// request's own.
    tree_pages: usize,
    lock_node: NodeId,
    /// Tokens whose KV has been computed.
    materialized: u32,
    admitted_before: bool,
    /// Prompt computed elsewhere (disaggregated decode); reused tokens to report.
    transferred: Option<u32>,
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
    parked: FxHashMap<u64, u32>,
    /// Decode worker: transferred requests ready to join the running batch.
    arrived: VecDeque<u32>,
    new_token_ratio: f64,
    init_ratio: f64,
    min_ratio: f64,
    decay_step: f64,
    counters: EngineCounters,
    /// Passes run so far: the cache's clock for least-recently-used order.
    passes: u64,
    /// Speculative decoding's burst sampler, and the largest burst.
    sampler: Option<BurstSampler>,
    max_burst: u32,
    record_events: bool,
    events: Vec<KvEvent>,
    scratch_tokens: Vec<u32>,
    /// Reused by every radix insertion for the hashes it newly stored.
    scratch_stored: Vec<u64>,
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
        SglangEngine {
            page,
            pool: PagePool::new(cfg.num_gpu_blocks),
            tree: RadixCache::new(page),
            reqs: Vec::new(),
            free_slots: Vec::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            parked: FxHashMap::default(),
            arrived: VecDeque::new(),
            new_token_ratio: init_ratio,
            init_ratio,
            min_ratio,
            decay_step: (init_ratio - min_ratio) / 600.0,
            counters: EngineCounters::default(),
            passes: 0,
            sampler: cfg.speculative.as_ref().map(|s| BurstSampler::new(s, options.engine_index)),
            max_burst: cfg.speculative.as_ref().map_or(1, |s| s.max_burst()),
            record_events: options.record_kv_events
                && cfg.enable_prefix_caching
                && cfg.worker_type != WorkerType::Decode,
            events: Vec::new(),
            scratch_tokens: vec![0; page as usize],
            scratch_stored: Vec::new(),
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
        let (max_output, output) = request.output_plan(self.cfg.reasoning.as_ref());
        let output = output.with_vocabulary(self.vocabulary.clone());
        let hashes = match request.hashes {
            Some(h) => h,
            None => request.prompt.block_hashes(self.page),
        };
        Req {
            id: request.id,
            prompt_len: request.prompt.len(),
            prompt: request.prompt,
            max_output,
            output,
            generated: 0,
            hashes,
            pages: Vec::new(),
            tree_pages: 0,
            lock_node: ROOT,
            materialized: 0,
            admitted_before: false,
            transferred: None,
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
        self.waiting.len() + self.arrived.len()
    }

    /// Pages held by requests or locked in the cache.
    pub fn active_blocks(&self) -> u32 {
        self.pool.total() - self.pool.available() - (self.tree.evictable_tokens() / self.page as u64) as u32
    }

    pub fn counters(&self) -> EngineCounters {
        self.counters
    }

    /// Tokens of cached prefix a request can reuse: whole pages, and never its last token.
    fn cacheable_prefix_pages(&self, req: &Req) -> usize {
        if !self.cfg.enable_prefix_caching {
            return 0;
        }
        let limit = ((req.len().saturating_sub(1)) / self.page) as usize;
        self.tree.peek(&req.hashes.local[..limit.min(req.hashes.len())])
    }

    /// Frees pages for `pages` new ones by evicting cache if needed. False if impossible.
    fn make_room(&mut self, pages: u32) -> bool {
        let available = self.pool.available();
        if pages <= available {
            return true;
        }
        let mut freed = Vec::new();
        let mut removed = Vec::new();
        self.tree.evict((pages - available) as u64 * self.page as u64, &mut freed, &mut removed);
        self.pool.free(&freed);
        if self.record_events && !removed.is_empty() {
            self.events.push(KvEvent::Removed { hashes: removed });
        }
        pages <= self.pool.available()
    }

    /// Moves the fully computed pages of `slot` that are not in the tree yet into it, and moves
    /// the request's lock to the new deepest node.
    fn cache_computed_pages(&mut self, slot: u32) {
        if !self.cfg.enable_prefix_caching {
            return;
        }
        let page = self.page;
        let req = self.reqs[slot as usize].as_mut().expect("live request slot");
        let full = ((req.materialized / page) as usize).min(req.hashes.len());
        if full <= req.tree_pages {
            return;
        }
        let range = req.tree_pages..full;
        let mut stored = std::mem::take(&mut self.scratch_stored);
        stored.clear();
        let (node, duplicates) = self.tree.insert(
            req.lock_node,
            &req.hashes.local[range.clone()],
            &req.pages[range.clone()],
            &req.hashes.seq[range.clone()],
            &mut stored,
        );
        if !duplicates.is_empty() {
            // Another request cached these pages first: use the tree's copies.
            self.pool.free(&duplicates);
            let tree_pages = self.tree.path_pages(node);
            req.pages[..full].copy_from_slice(&tree_pages[..full]);
        }
        self.tree.lock(node);
        self.tree.unlock(req.lock_node);
        req.lock_node = node;
        req.tree_pages = full;
        if self.record_events && !stored.is_empty() {
            let first = full - stored.len();
            let parent = first.checked_sub(1).map(|p| req.hashes.seq[p]);
            let blocks =
                (first..full).map(|b| StoredBlock { hash: req.hashes.seq[b], local: req.hashes.local[b] }).collect();
            self.events.push(KvEvent::Stored { parent, blocks });
            if self.record_tokens {
                self.stored_tokens.extend((first as u32 * page..full as u32 * page).map(|pos| req.token_at(pos)));
            }
        }
        self.scratch_stored = stored;
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

    /// Orders the waiting queue: longest cached prefix first (LPM), with requests whose short
    /// prefix duplicates one ahead of them pushed back.
    fn order_waiting(&mut self) {
        if !self.cfg.sglang.lpm || self.waiting.len() > LPM_FALLBACK_THRESHOLD {
            return;
        }
        let probe_pages = IN_BATCH_PREFIX_TOKENS.div_ceil(self.page) as usize;
        let mut seen = FxHashSet::default();
        let mut keyed: Vec<(bool, std::cmp::Reverse<usize>, u32)> = Vec::with_capacity(self.waiting.len());
        for &slot in &self.waiting {
            let req = self.req(slot);
            let prefix = self.cacheable_prefix_pages(req);
            let mut later = false;
            if prefix as u32 * self.page <= IN_BATCH_PREFIX_TOKENS && req.hashes.len() >= probe_pages {
                later = !seen.insert(req.hashes.seq[probe_pages - 1]);
            }
            keyed.push((later, std::cmp::Reverse(prefix), slot));
        }
        keyed.sort_by_key(|k| (k.0, k.1));
        self.waiting = keyed.into_iter().map(|k| k.2).collect();
    }

    pub fn step(&mut self, now_ms: f64, out: &mut PassOutput) {
        out.clear();
        out.start_ms = now_ms;
        self.passes += 1;
        self.tree.set_time(self.passes);
        // Transferred requests (decode worker) join the batch.
        let max_running = self.cfg.max_num_seqs.map_or(usize::MAX, |m| m as usize);
        while self.running.len() < max_running {
            let Some(slot) = self.arrived.pop_front() else { break };
            let req = self.req_mut(slot);
            let (id, reused) = (req.id, req.transferred.unwrap_or(0));
            self.running.push(slot);
            out.admissions.push(Admission { request: id, reused_tokens: reused, readmission: false });
        }
        self.order_waiting();
        let admitted = self.build_prefill_batch(out, max_running);
        if admitted.is_empty() && self.running.is_empty() {
            if let Some(slot) = self.waiting.pop_front() {
                // Nothing runs and the head still does not fit: it never will.
                self.release(slot);
                let req = self.remove(slot);
                out.finished
                    .push(Finished { request: req.id, finish: Finish::Rejected(RejectReason::ExceedsKvCapacity) });
            }
        }
        let prefill_ms = self.cfg.timing.prefill_ms(&out.prefill);
        let ratio = self.cfg.speedup_ratio;
        let decode_start = now_ms + pass_duration_ms(prefill_ms, ratio);
        let mut retracted = false;
        out.end_ms = if admitted.is_empty() {
            let (end, r) = self.decode(decode_start, out);
            retracted = r;
            end
        } else {
            self.finish_extend(&admitted, out);
            decode_start
        };
        if retracted {
            self.new_token_ratio = self.init_ratio;
        }
        self.new_token_ratio = (self.new_token_ratio - self.decay_step).max(self.min_ratio);
        out.kv_events.append(&mut self.events);
        out.stored_tokens.append(&mut self.stored_tokens);
    }

    /// Admits waiting requests into this pass's prefill batch; returns them in order.
    fn build_prefill_batch(&mut self, out: &mut PassOutput, max_running: usize) -> Vec<u32> {
        let page = self.page;
        let clip = self.cfg.sglang.clip_max_new_tokens;
        let promised: f64 =
            self.running.iter().map(|&s| self.req(s).remaining_output().min(clip) as f64 * self.new_token_ratio).sum();
        let mut rem_total =
            (self.pool.available() as u64 * page as u64 + self.tree.evictable_tokens()) as f64 - promised;
        let mut rem_input = self.cfg.sglang.max_prefill_tokens as i64;
        let mut rem_chunk = self.cfg.sglang.chunked_prefill_size as i64;
        let decode_worker = self.cfg.worker_type == WorkerType::Decode;
        let mut admitted = Vec::new();
        let mut oom = false;
        while let Some(&slot) = self.waiting.get(admitted.len()) {
            if self.running.len() + admitted.len() >= max_running {
                break;
            }
            let req = self.req(slot);
            let fresh = req.pages.is_empty();
            let prefix_pages = if fresh { self.cacheable_prefix_pages(req) } else { 0 };
            let before = if fresh { prefix_pages as u32 * page } else { req.materialized };
            let extend = req.len() - before;
            if extend == 0 {
                break;
            }
            // What does not fit in the pass's chunk budget is cut at a page boundary.
            let chunk = if extend as i64 <= rem_chunk { extend } else { (rem_chunk.max(0) as u32 / page) * page };
            if chunk == 0 {
                break;
            }
            let charged = chunk.div_ceil(page) * page;
            let reserve_out = if chunk < extend { 0 } else { req.remaining_output().min(clip) };
            if (charged + reserve_out) as f64 >= rem_total || charged as i64 > rem_input || charged as i64 > rem_chunk {
                break;
            }
            // Allocate: lock the cached prefix (first chunk), then pages for the chunk.
            if fresh {
                let keys = req.hashes.local[..prefix_pages].to_vec();
                let m = self.tree.match_prefix(&keys);
                self.tree.lock(m.node);
                let req = self.req_mut(slot);
                req.pages = m.pages;
                req.tree_pages = prefix_pages;
                req.lock_node = m.node;
                req.materialized = before;
            }
            let need = (before + chunk).div_ceil(page) - self.req(slot).pages.len() as u32;
            if !self.make_room(need) {
                if fresh {
                    self.release(slot);
                }
                oom = true;
                break;
            }
            let mut pages = std::mem::take(&mut self.req_mut(slot).pages);
            self.pool.alloc(need, &mut pages);
            let req = self.req_mut(slot);
            req.pages = pages;
            if !req.admitted_before || fresh {
                let readmission = req.admitted_before;
                req.admitted_before = true;
                let id = req.id;
                let total = req.len() as u64;
                self.counters.prefix_queries += total;
                self.counters.prefix_hits += before as u64;
                out.admissions.push(Admission { request: id, reused_tokens: before, readmission });
            }
            self.req_mut(slot).materialized = before + chunk;
            out.computed_tokens += chunk as u64;
            if !decode_worker {
                out.prefill.batch += 1;
                out.prefill.total_isl += (before + chunk) as u64;
                out.prefill.total_prefix += before as u64;
                out.prefill_tokens += chunk as u64;
            }
            rem_total -= (need * page + reserve_out) as f64;
            rem_input -= charged as i64;
            rem_chunk -= charged as i64;
            admitted.push(slot);
            if rem_chunk <= 0 {
                break;
            }
        }
        if oom {
            self.new_token_ratio = self.init_ratio;
        }
        for _ in 0..admitted.len() {
            self.waiting.pop_front();
        }
        admitted
    }

    /// After an extend pass: cache what was computed; unfinished prompts go back to the front
    /// of the queue, finished ones join the running batch with their first token.
    fn finish_extend(&mut self, admitted: &[u32], out: &mut PassOutput) {
        let mut unfinished = Vec::new();
        for &slot in admitted {
            self.cache_computed_pages(slot);
            let req = self.req(slot);
            if req.materialized < req.len() {
                unfinished.push(slot);
                continue;
            }
            self.running.push(slot);
            if self.req(slot).generated < self.req(slot).max_output {
                self.generate(slot, out);
            }
        }
        for &slot in unfinished.iter().rev() {
            self.waiting.push_front(slot);
        }
        self.retire_finished(out);
    }

    fn generate(&mut self, slot: u32, out: &mut PassOutput) {
        let page = self.page;
        let req = self.reqs[slot as usize].as_mut().expect("live request slot");
        let token = req.output.token(req.generated);
        req.generated += 1;
        out.tokens.push(TokenOut { request: req.id, token });
        let len = req.len();
        // Generated pages are hashed only for the radix cache (and its KV events).
        if self.cfg.enable_prefix_caching && len.is_multiple_of(page) {
            let start = len - page;
            for (k, t) in self.scratch_tokens.iter_mut().enumerate() {
                *t = req.token_at(start + k as u32);
            }
            req.hashes.push_local(local_block_hash(&self.scratch_tokens));
        }
    }

    /// Removes running requests that have all their tokens.
    fn retire_finished(&mut self, out: &mut PassOutput) {
        let mut i = 0;
        while i < self.running.len() {
            let slot = self.running[i];
            let req = self.req(slot);
            if req.generated < req.max_output {
                i += 1;
                continue;
            }
            self.running.remove(i);
            self.cache_computed_pages(slot);
            if self.cfg.worker_type == WorkerType::Prefill {
                let req = self.req_mut(slot);
                let id = req.id;
                self.parked.insert(id, slot);
                out.finished.push(Finished { request: id, finish: Finish::Completed });
                continue;
            }
            self.release(slot);
            let req = self.remove(slot);
            out.finished.push(Finished { request: req.id, finish: Finish::Completed });
        }
    }

    /// A decode pass over the running batch; returns its end time and whether it retracted.
    fn decode(&mut self, decode_start: f64, out: &mut PassOutput) -> (f64, bool) {
        self.retire_finished(out);
        let page = self.page;
        // Pages to hold every running request's next token (a full burst with speculative
        // decoding: everything but the last token of the burst gets computed).
        let growth = |e: &SglangEngine| -> u32 { e.running.iter().map(|&s| e.pages_needed(s)).sum() };
        let mut retracted = false;
        loop {
            let need = growth(self);
            let room = self.pool.available() as u64 + self.tree.evictable_tokens() / page as u64;
            if need as u64 <= room || self.running.len() <= 1 {
                break;
            }
            self.retract(out);
            retracted = true;
        }
        let need = growth(self);
        if !self.make_room(need) {
            // A single request larger than the cache: refuse it.
            for slot in std::mem::take(&mut self.running) {
                self.release(slot);
                let req = self.remove(slot);
                out.finished
                    .push(Finished { request: req.id, finish: Finish::Rejected(RejectReason::ExceedsKvCapacity) });
            }
            return (decode_start, retracted);
        }
        let capacity = self.cfg.kv_capacity_tokens();
        let context: u64 = self.running.iter().map(|&s| self.req(s).len() as u64).sum();
        let shape = DecodeShape {
            batch: self.running.len() as u32,
            context_tokens: context.min(capacity),
            capacity_tokens: capacity,
        };
        out.decode = shape;
        let decode_ms =
            if self.cfg.worker_type == WorkerType::Prefill { 0.0 } else { self.cfg.timing.decode_ms(&shape) };
        let ratio = self.cfg.speedup_ratio * self.cfg.decode_speedup_ratio;
        let end = decode_start + pass_duration_ms(decode_ms, ratio);
        let prefill_worker = self.cfg.worker_type == WorkerType::Prefill;
        for i in 0..self.running.len() {
            let slot = self.running[i];
            let need = self.pages_needed(slot);
            let mut pages = std::mem::take(&mut self.req_mut(slot).pages);
            self.pool.alloc(need, &mut pages);
            let remaining = self.req(slot).remaining_output();
            let burst = match self.sampler.as_mut() {
                Some(sampler) if !prefill_worker => sampler.sample(remaining),
                _ => remaining.min(1),
            };
            let req = self.req_mut(slot);
            req.pages = pages;
            for _ in 0..burst {
                self.generate(slot, out);
            }
            let req = self.req_mut(slot);
            req.materialized = req.len() - 1;
            out.decode_forwards += 1;
            out.decode_tokens += burst;
            out.computed_tokens += burst as u64;
            self.cache_computed_pages(slot);
        }
        self.retire_finished(out);
        (end, retracted)
    }

    /// New pages `slot` needs before its next decode forward.
    fn pages_needed(&self, slot: u32) -> u32 {
        let r = self.req(slot);
        let burst = self.max_burst.min(r.remaining_output()).max(1);
        (r.len() + burst - 1).div_ceil(self.page).saturating_sub(r.pages.len() as u32)
    }

    /// Retracts the running request with the fewest generated tokens (the longest prompt among
    /// equals): its pages outside the cache are freed and it waits at the front of the queue.
    fn retract(&mut self, out: &mut PassOutput) {
        let (pos, _) = self
            .running
            .iter()
            .enumerate()
            .min_by_key(|(_, &s)| {
                let r = self.req(s);
                (r.generated, std::cmp::Reverse(r.prompt_len))
            })
            .expect("running is not empty");
        let slot = self.running.remove(pos);
        self.release(slot);
        let req = self.req_mut(slot);
        out.preempted.push(req.id);
        self.waiting.push_front(slot);
        self.counters.preemptions += 1;
    }

    /// Decode worker: reserves pages for a prompt computed elsewhere.
    pub fn reserve(&mut self, request: EngineRequest) -> Result<u32, EngineRequest> {
        let page = self.page;
        let prompt_pages = request.prompt.len().div_ceil(page);
        let hashes = match &request.hashes {
            Some(h) => h.clone(),
            None => request.prompt.block_hashes(page),
        };
        let hit = if self.cfg.enable_prefix_caching { self.tree.peek(&hashes.local) } else { 0 };
        let available = self.pool.available() as u64 + self.tree.evictable_tokens() / page as u64;
        if (prompt_pages - hit as u32) as u64 > available {
            return Err(request);
        }
        let id = request.id;
        let mut req = self.new_req(request);
        let m = self.tree.match_prefix(&req.hashes.local[..hit]);
        self.tree.lock(m.node);
        req.pages = m.pages;
        req.tree_pages = hit;
        req.lock_node = m.node;
        let need = prompt_pages - hit as u32;
        let slot = self.insert_req(req);
        let room = self.make_room(need);
        debug_assert!(room, "room was checked");
        let mut pages = std::mem::take(&mut self.req_mut(slot).pages);
        self.pool.alloc(need, &mut pages);
        let req = self.req_mut(slot);
        req.pages = pages;
        let reused = hit as u32 * page;
        req.transferred = Some(reused);
        self.parked.insert(id, slot);
        Ok(reused)
    }

    /// Decode worker: the KV of a reserved request arrived.
    pub fn activate(&mut self, id: u64) {
        let slot = self.parked.remove(&id).expect("activating a reserved request");
        let req = self.req_mut(slot);
        req.materialized = req.prompt_len;
        self.cache_computed_pages(slot);
        self.arrived.push_back(slot);
    }

    /// Prefill worker: the decode side has the KV of `id`; free it.
    pub fn release_held(&mut self, id: u64) {
        let slot = self.parked.remove(&id).expect("releasing a held request");
        self.release(slot);
        self.remove(slot);
    }
}
