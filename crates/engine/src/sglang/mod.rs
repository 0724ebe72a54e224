//! The SGLang-style scheduler: a radix prefix cache over pages and SGLang's batch policy
//! (`get_next_batch_to_run`, `update_running_batch`, `retract_decode`).
//!
//! One call to [`SglangEngine::step`] is one forward pass, either
//!
//! * a **prefill** pass (`prefill.rs`): waiting requests are admitted (FIFO, or
//!   longest-prefix-match first) while the page budget — free pages plus evictable cache, minus
//!   the output still promised to running requests (scaled by the adaptive `new_token_ratio`) —
//!   the per-pass prefill budget and the chunk budget allow. Prompts longer than the chunk
//!   budget run in chunks, one chunked request per pass. Requests whose prompt completes get
//!   their first token from the prefill forward, and a KV slot for it right away (if the cache
//!   has none, the token waits for the next decode pass); running requests wait. The pass costs
//!   prefill time only.
//! * or a **decode** pass (`decode.rs`), when nothing was admitted: every running request samples
//!   a token and gets its KV slot in the same step. If the pages to hold them are short, the
//!   first running request with the fewest generated tokens is retracted (its pages outside the
//!   cache are freed and it goes to the back of the queue, to re-prefill later) until they fit,
//!   and `new_token_ratio` is re-estimated from the survivors; otherwise the ratio decays.
//!
//! **Prefill/decode interval** (`prefill_decode_interval` n > 0, SGLang's `_should_defer_prefill`):
//! after a pass in which any attention-DP rank of the worker prefilled, the next n passes admit
//! nothing new (nor continue a chunked prompt); they only decode. A deferred pass with nothing
//! to decode takes no time, and when no rank of the worker ran the model in it, SGLang's
//! `on_idle` resets `new_token_ratio` to its initial value. Drivers of attention-DP ranks tell
//! every rank when a shared pass begins and ends ([`SglangEngine::begin_group_pass`],
//! [`SglangEngine::end_group_pass`]); a rank driven alone is a group of one.
//!
//! **Host loop** (`sglang.host_loop`, aisimulate's replay of SGLang's overlap scheduler): the
//! CPU forms the batch of pass k+1 while pass k runs, then processes pass k's results when it
//! ends. Hence (i) a request is received at the iteration boundary after it arrives (the start
//! of a pass, or at once when nothing runs) and can join the pass after the one starting then;
//! when that pass would have had nothing to run, the loop forms the next one with it at the
//! boundary itself; (ii) a request whose last token comes from pass k is still in pass k+1's
//! batch (its decode slot is counted, its pages held) and leaves when pass k+1 ends. Tokens
//! become visible when their pass ends, as without the loop.
//!
//! Full pages enter the radix tree as soon as their tokens have slots (`cache.rs`; see [`radix`]
//! for the least-recently-used order); KV events are reported for pages entering and leaving
//! the tree. Disaggregated workers use the hooks in `handoff.rs`.

mod cache;
mod decode;
mod handoff;
mod prefill;
pub mod radix;
mod vision;

use std::collections::VecDeque;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::config::{EngineConfig, Role};
use crate::engine::{EngineCounters, EngineOptions};
use crate::handoff::Destinations;
use crate::output::{Admission, Finish, Finished, KvEvent, PassOutput, RejectReason};
use crate::request::EngineRequest;
use crate::sequence::{Sequence, SequenceTable};
use crate::speculative::BurstSampler;
use crate::timing::{jittered, pass_duration_ms, PassJitter};
use radix::{NodeId, PagePool, RadixCache, Run, ROOT};

/// What the SGLang core tracks of a request besides its [`Sequence`] (whose `computed` tokens
/// are those with a KV slot: computed prompt tokens and sampled tokens; its `blocks` stay
/// empty: pages are interchangeable, so only their number is kept).
#[derive(Debug)]
struct Sched {
    /// Pages it holds, backing tokens `[0, pages × page)`.
    pages: u32,
    /// Local hashes of its leading `key_pages` full pages (run-length encoded), computed when
    /// it is matched against the cache while waiting and dropped once it is admitted.
    keys: Vec<Run>,
    key_pages: usize,
    /// Leading pages owned by the radix tree (locked through `lock_node`); the rest are the
    /// request's own.
    tree_pages: usize,
    lock_node: NodeId,
    admitted_before: bool,
}

type Req = Sequence<Sched>;

/// The SGLang-style engine.
#[derive(Debug)]
pub struct SglangEngine {
    cfg: EngineConfig,
    page: u32,
    /// log2 of the page size, if it is a power of two.
    page_shift: Option<u32>,
    pool: PagePool,
    tree: RadixCache,
    reqs: SequenceTable<Sched>,
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
    /// Per-pass timing noise.
    jitter: Option<PassJitter>,
    record_events: bool,
    events: Vec<KvEvent>,
    scratch_tokens: Vec<u32>,
    /// The last single-token page hashed (see [`Sequence::block_keys`]).
    key_memo: (u32, u64),
    /// Keys and sequence hashes of the pages of one radix insertion.
    scratch_keys: Vec<Run>,
    scratch_seqs: Vec<u64>,
    /// Ids generated tokens are drawn from (see [`crate::Engine::set_output_vocabulary`]).
    vocabulary: Option<Arc<[u32]>>,
    /// Record the tokens of stored pages, drained into [`PassOutput::stored_tokens`].
    record_tokens: bool,
    stored_tokens: Vec<u32>,
    /// This pass is deferred by the prefill/decode interval.
    deferred: bool,
    /// `new_token_ratio` at launch (restored on idle rounds of the interval).
    init_ratio: f64,
    /// Passes that may still not prefill (the prefill/decode interval).
    prefill_rounds_remaining: u64,
    /// The driver began a shared pass ([`SglangEngine::begin_group_pass`]) and will end it.
    grouped: bool,
    /// Of the current pass: prompt tokens were computed; the model ran (a prefill, or a decode
    /// that sampled); it was deferred with nothing to decode.
    prefill_in_pass: bool,
    model_work_in_pass: bool,
    interval_idle_in_pass: bool,
    /// Host loop: requests submitted since the last pass began (not yet received).
    inbox: Vec<u32>,
    /// Host loop: the end of the last pass that ran something (a pass beginning then follows
    /// it back to back, so its batch was formed when that one began).
    last_busy_end: Option<f64>,
    /// Host loop: when that pass began.
    last_busy_start: f64,
    /// Host loop: requests finished in the last pass, still in the batch of the next one
    /// (`lingering`), and those of the current pass's batch (`phantoms`).
    lingering: Vec<u32>,
    phantoms: Vec<u32>,
    /// Native VL replay: the embedding cache, and the images the pass being built reaches.
    embeddings: Option<vision::EmbeddingCache>,
    pass_images: vision::PassImages,
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
        let record_events = options.record_kv_events && cfg.enable_prefix_caching && cfg.role != Role::Decode;
        SglangEngine {
            page,
            page_shift: page.is_power_of_two().then(|| page.trailing_zeros()),
            pool: PagePool::new(cfg.num_gpu_blocks),
            tree: RadixCache::new(page, record_events),
            reqs: SequenceTable::default(),
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
            jitter: PassJitter::new(options.timing_jitter, options.engine_index),
            record_events,
            events: Vec::new(),
            scratch_tokens: vec![0; page as usize],
            key_memo: (0, 0),
            scratch_keys: Vec::new(),
            scratch_seqs: Vec::new(),
            vocabulary: None,
            record_tokens: false,
            stored_tokens: Vec::new(),
            deferred: false,
            init_ratio,
            prefill_rounds_remaining: 0,
            grouped: false,
            prefill_in_pass: false,
            model_work_in_pass: false,
            interval_idle_in_pass: false,
            inbox: Vec::new(),
            last_busy_end: None,
            last_busy_start: 0.0,
            lingering: Vec::new(),
            phantoms: Vec::new(),
            embeddings: cfg.sglang.vision.as_ref().map(vision::EmbeddingCache::new),
            pass_images: vision::PassImages::default(),
            cfg,
        }
    }

    /// A pass shared by the attention-DP ranks of a worker begins (called on every rank,
    /// whether it steps or not); [`SglangEngine::end_group_pass`] follows.
    pub fn begin_group_pass(&mut self) {
        self.grouped = true;
        self.prefill_in_pass = false;
        self.model_work_in_pass = false;
        self.interval_idle_in_pass = false;
    }

    /// Whether this rank computed prompt tokens in the current pass.
    pub fn prefilled_in_pass(&self) -> bool {
        self.prefill_in_pass
    }

    /// Whether this rank ran the model in the current pass.
    pub fn ran_model_in_pass(&self) -> bool {
        self.model_work_in_pass
    }

    /// The shared pass ended: `any_prefilled` and `any_ran_model` over all the worker's ranks.
    /// A prefill anywhere restarts the interval; otherwise one round of it has passed.
    pub fn end_group_pass(&mut self, any_prefilled: bool, any_ran_model: bool) {
        if self.interval_idle_in_pass && !any_ran_model {
            self.new_token_ratio = self.init_ratio;
        }
        self.prefill_rounds_remaining = if any_prefilled {
            self.cfg.prefill_decode_interval
        } else {
            self.prefill_rounds_remaining.saturating_sub(1)
        };
        self.grouped = false;
        self.interval_idle_in_pass = false;
    }

    /// Whether the current pass was held back by the prefill/decode interval (a deferred pass
    /// with no effect still counts the interval down: drivers run the next one at once).
    pub fn deferred_in_pass(&self) -> bool {
        self.deferred
    }

    /// Whether nothing is left here: no request queued, running, held or reserved, and no
    /// round of the interval still to run.
    pub fn is_drained(&self) -> bool {
        !self.has_work() && self.parked.is_empty() && self.destinations.is_empty()
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
        if self.destinations.cancel(id) {
            return true;
        }
        let found = self.parked.remove(&id).or_else(|| {
            let reqs = &self.reqs;
            reqs.take_from(&mut self.running, id)
                .or_else(|| reqs.take_from(&mut self.waiting, id))
                .or_else(|| reqs.take_from(&mut self.arrived, id))
                .or_else(|| {
                    let pos = self.inbox.iter().position(|&s| reqs[s].id == id)?;
                    Some(self.inbox.remove(pos))
                })
        });
        let Some(slot) = found else { return false };
        self.release(slot);
        self.reqs.remove(slot);
        true
    }

    /// A request as this engine tracks it: its output limited by `max_model_len`, its cache
    /// keys (local page hashes) as the caller gave them, if it did.
    fn sequence(&self, mut request: EngineRequest) -> Req {
        // The radix tree is keyed by local hashes alone.
        let given = request.hashes.take().map(|h| h.local).unwrap_or_default();
        let mut keys = Vec::new();
        for &key in &given {
            radix::push_run(&mut keys, key, 1);
        }
        let sched =
            Sched { pages: 0, keys, key_pages: given.len(), tree_pages: 0, lock_node: ROOT, admitted_before: false };
        let mut req = Sequence::new(request, self.cfg.reasoning.as_ref(), self.vocabulary.clone(), sched);
        if let Some(limit) = self.cfg.max_model_len {
            req.max_output = req.max_output.min(limit.saturating_sub(req.prompt_len));
        }
        req
    }

    pub fn submit(&mut self, request: EngineRequest) {
        let req = self.sequence(request);
        let slot = self.reqs.insert(req);
        if self.cfg.sglang.host_loop {
            self.inbox.push(slot);
        } else {
            self.waiting.push_back(slot);
        }
    }

    /// Whether a pass would have anything to do (a round of the interval still to count down
    /// is something).
    pub fn has_work(&self) -> bool {
        !self.running.is_empty()
            || !self.waiting.is_empty()
            || !self.arrived.is_empty()
            || !self.inbox.is_empty()
            || !self.lingering.is_empty()
            || self.prefill_rounds_remaining > 0
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn queue_load(&self) -> crate::output::QueueLoad {
        let mut q = crate::output::QueueLoad::default();
        // As SGLang's waiting-queue statistics count them: a request that has produced no
        // output yet (a chunked prefill in progress included) queues its whole prompt as
        // prefill; one with output (retracted) or a transferred one queues its sequence as
        // decode.
        for &slot in self.waiting.iter().chain(self.arrived.iter()).chain(self.inbox.iter()) {
            let req = &self.reqs[slot];
            if req.generated > 0 || req.transferred {
                q.decode_requests += 1;
                q.decode_kv_tokens += req.len() as u64;
            } else {
                q.prefill_requests += 1;
                q.prefill_tokens += req.prompt_len as u64;
            }
        }
        for len in self.destinations.prompt_lens() {
            q.decode_requests += 1;
            q.decode_kv_tokens += len as u64;
        }
        q
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len() + self.arrived.len() + self.inbox.len() + self.destinations.len()
    }

    /// Pages held by requests or locked in the cache.
    pub fn active_blocks(&self) -> u32 {
        self.pool.total() - self.pool.available() - (self.tree.evictable_tokens() / self.page as u64) as u32
    }

    /// Cached pages no request holds (evictable).
    pub fn inactive_blocks(&self) -> u32 {
        (self.tree.evictable_tokens() / self.page as u64) as u32
    }

    pub fn counters(&self) -> EngineCounters {
        self.counters
    }

    /// `tokens / page`: a shift when the page size is a power of two (the per-token paths
    /// divide by it several times per token).
    fn floor_pages(&self, tokens: u32) -> u32 {
        match self.page_shift {
            Some(shift) => tokens >> shift,
            None => tokens / self.page,
        }
    }

    /// `tokens` rounded up to whole pages.
    fn ceil_page(&self, tokens: u32) -> u32 {
        let whole = self.floor_pages(tokens) * self.page;
        if whole == tokens {
            tokens
        } else {
            whole + self.page
        }
    }

    /// A request that is done: its full pages with KV slots join the cache and it leaves (a
    /// prefill worker keeps it, with its pages, until the decode side has them; with
    /// `cache_held_prompts` the pages are in the cache meanwhile, locked, so a later prompt
    /// sharing its prefix reuses them while the KV moves).
    fn complete(&mut self, slot: u32, out: &mut PassOutput) {
        let id = self.reqs[slot].id;
        out.finished.push(Finished { request: id, finish: Finish::Completed });
        if self.cfg.role == Role::Prefill {
            if self.cfg.sglang.cache_held_prompts {
                let req = &self.reqs[slot];
                let full = self.floor_pages(req.len().min(req.computed)) as usize;
                self.cache_pages(slot, full);
            }
            self.parked.insert(id, slot);
        } else if self.cfg.sglang.host_loop {
            // The loop learns it finished when this pass's results are processed, after it
            // formed the next batch.
            self.lingering.push(slot);
        } else {
            self.retire(slot);
        }
    }

    fn retire(&mut self, slot: u32) {
        self.destinations.bump();
        let req = &self.reqs[slot];
        let full = self.floor_pages(req.len().min(req.computed)) as usize;
        self.cache_pages(slot, full);
        self.release(slot);
        self.reqs.remove(slot);
    }

    fn reject(&mut self, slot: u32, reason: RejectReason, out: &mut PassOutput) {
        self.release(slot);
        let req = self.reqs.remove(slot);
        out.finished.push(Finished { request: req.id, finish: Finish::Rejected(reason) });
    }

    /// Host loop: the requests submitted so far are received (queued behind the waiting ones),
    /// at the start of the pass `out` reports.
    fn receive_inbox(&mut self, out: &mut PassOutput) {
        for &slot in &self.inbox {
            out.received.push(self.reqs[slot].id);
        }
        self.waiting.extend(self.inbox.drain(..));
    }

    pub fn step(&mut self, now_ms: f64, out: &mut PassOutput) {
        out.clear();
        out.start_ms = now_ms;
        let grouped = std::mem::take(&mut self.grouped);
        if !grouped {
            self.begin_group_pass();
        }
        self.deferred = self.prefill_rounds_remaining > 0;
        let host_loop = self.cfg.sglang.host_loop;
        // Host loop: back to back with a busy pass, this pass's batch was formed when that one
        // began, before the requests that came since were received.
        let formed_earlier = host_loop && self.last_busy_end == Some(now_ms);
        if host_loop {
            self.phantoms = std::mem::take(&mut self.lingering);
            let idle_then = self.running.is_empty() && self.waiting.is_empty() && self.phantoms.is_empty();
            if !formed_earlier || idle_then {
                self.receive_inbox(out);
            } else {
                // Formed when the pass before began, with the requests then running: those
                // that finished in it were among them.
                out.formed_ms = Some(self.last_busy_start);
            }
        }
        // Transferred requests (decode worker) join the batch; while some still wait for a
        // slot, nothing new is prefilled.
        let max_running = self.cfg.max_num_seqs.map_or(usize::MAX, |m| m as usize);
        while self.running.len() < max_running {
            let Some(slot) = self.arrived.pop_front() else { break };
            self.running.push(slot);
            out.admissions.push(Admission {
                request: self.reqs[slot].id,
                reused_tokens: 0,
                readmission: false,
                tiers: None,
            });
        }
        self.reject_too_long(out);
        self.order_waiting();
        // Nothing is prefilled while transferred requests wait for a running slot, nor, on a
        // decode worker, while accepted requests wait for pages.
        // Nor during the prefill/decode interval.
        // A batch formed while the pass before ran counts the requests that finished in it:
        // they were running then, and still hold their slots.
        let room = if out.formed_ms.is_some() { max_running.saturating_sub(self.phantoms.len()) } else { max_running };
        let admitted = if self.arrived.is_empty() && self.destinations.is_empty() && !self.deferred {
            self.build_prefill_batch(out, room)
        } else {
            Vec::new()
        };
        // Host loop: requests finished in the last pass still hold their slots and pages in
        // this one, so a waiting request is not refused while they do.
        let held = !self.parked.is_empty() || !self.destinations.is_empty();
        let idle = self.running.is_empty() && self.phantoms.is_empty() && self.arrived.is_empty();
        if admitted.is_empty() && idle && !held && !self.deferred {
            if let Some(slot) = self.waiting.pop_front() {
                // Nothing runs, nothing holds pages that will come back, and the head still
                // cannot be admitted: it never will be.
                let reason = self.never_admissible(slot);
                self.reject(slot, reason, out);
            }
        }
        if let Some(j) = self.jitter.as_mut() {
            j.next_pass();
        }
        // Native VL: the pass first encodes the images its chunks reach that are not cached.
        let vision_ms = match self.embeddings.as_mut() {
            // Timed to the nanosecond on its own, as the reference's engine adds it.
            Some(cache) if !admitted.is_empty() => {
                (self.cfg.timing.vision_ms(self.pass_images.encode(cache)) * 1e6).round() / 1e6
            }
            _ => 0.0,
        };
        let prefill_ms = jittered(&self.jitter, vision_ms + self.cfg.timing.prefill_ms(&out.prefill));
        let decode_start = now_ms + pass_duration_ms(prefill_ms, self.cfg.speedup_ratio);
        self.prefill_in_pass = out.prefill_tokens > 0;
        out.end_ms = if admitted.is_empty() {
            // A deferred pass with nothing to decode is an idle round of the interval.
            self.interval_idle_in_pass =
                self.deferred && self.running.iter().all(|&s| self.reqs[s].remaining_output() == 0);
            let end = self.decode(decode_start, out);
            self.model_work_in_pass = self.prefill_in_pass || out.decode_tokens > 0;
            end
        } else {
            self.finish_prefill(&admitted, out);
            self.model_work_in_pass = self.prefill_in_pass;
            decode_start
        };
        if host_loop {
            // The requests that came while this batch was formed are received now; those that
            // finished in the previous pass leave.
            self.receive_inbox(out);
            let busy = out.prefill_tokens > 0 || out.decode_forwards > 0 || !self.phantoms.is_empty();
            self.last_busy_end = busy.then_some(out.end_ms);
            self.last_busy_start = now_ms;
            for slot in std::mem::take(&mut self.phantoms) {
                self.retire(slot);
            }
        }
        out.kv_events.append(&mut self.events);
        out.stored_tokens.append(&mut self.stored_tokens);
        if !grouped {
            // Alone, this rank is its worker's only one.
            self.end_group_pass(self.prefill_in_pass, self.model_work_in_pass);
        }
    }
}
