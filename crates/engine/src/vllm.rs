//! The vLLM-style scheduler: one call to [`VllmEngine::step`] is one forward pass.
//!
//! A pass works like vLLM v1's scheduler:
//!
//! 1. **Running requests first**, in admission order, while token budget remains: each gets the
//!    tokens it still has to compute (the rest of its prompt, chunked to the budget, or the one
//!    token it generated last pass). If its next block cannot be allocated, running requests are
//!    preempted (newest first by default) until it fits; preemption is by recompute.
//! 2. **Waiting requests in strict FIFO order** while there is budget and a free slot. The head is
//!    admitted only if its whole known sequence fits next to the blocks already in use (cached
//!    prefix blocks that are already active cost nothing); if it must wait, nobody behind it is
//!    considered. No admissions happen in a pass that preempted.
//! 3. **Decode**: every running request whose known tokens are all computed generates one token.
//!    A request that finished its prompt in this pass gets its first token here.
//!
//! Decode blocks are allocated lazily: a generated token takes KV space when the next pass
//! computes it. Computed full blocks become visible to the prefix cache immediately, so a
//! request admitted later in the same pass can reuse them.
//!
//! Disaggregated workers: a *prefill* worker pays no decode time (its single token comes from
//! the prefill forward) and holds a finished request's KV until [`VllmEngine::release_held`]; a
//! *decode* worker receives prompts computed elsewhere: [`VllmEngine::reserve`] allocates their
//! blocks, [`VllmEngine::activate`] marks them computed when the transfer lands, and prefill time
//! is never charged.

use std::collections::VecDeque;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::config::{Backend, EngineConfig, PreemptionMode, Role};
use crate::engine::{EngineCounters, EngineOptions};
use crate::handoff::{Destinations, Reserved};
use crate::hash::{local_block_hash, BlockHashes};
use crate::output::{Admission, Finish, Finished, KvEvent, PassOutput, RejectReason, StoredBlock, Stretch, TokenOut};
use crate::pool::{BlockPool, Residency};
use crate::request::{EngineRequest, OutputPlan, Prompt};
use crate::speculative::BurstSampler;
use crate::timing::{pass_duration_ms, DecodeShape};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    Waiting,
    Running,
    Preempted,
    /// Decode worker: blocks reserved, KV transfer in flight.
    Reserved,
    /// Prefill worker: finished, KV kept until the decode side has it.
    Held,
}

#[derive(Debug)]
struct Req {
    id: u64,
    prompt: Prompt,
    prompt_len: u32,
    max_output: u32,
    /// How its output tokens are chosen.
    output: OutputPlan,
    generated: u32,
    /// Tokens whose KV has been computed.
    computed: u32,
    /// Hashes of every full block of the known sequence (prompt and generated tokens).
    hashes: BlockHashes,
    /// One pool copy per allocated block.
    lease: Vec<u32>,
    status: Status,
    preemptions: u32,
    /// Budget this request consumed in the current pass.
    pass_tokens: u32,
    /// The part of it counted as committed prefill.
    pass_committed: u32,
    /// Its contribution to the current pass's prefill shape: (prompt before, prompt after).
    pass_prefill: Option<(u32, u32)>,
    /// Its prompt was computed on another worker (disaggregated decode): it decodes from its
    /// first token on.
    transferred: bool,
    /// Arrival order (submission, or acceptance as a destination): an activated destination
    /// rejoins the waiting queue at its place in this order.
    order: u64,
}

impl Req {
    fn len(&self) -> u32 {
        self.prompt_len + self.generated
    }

    fn token_at(&self, pos: u32) -> u32 {
        if pos < self.prompt_len {
            self.prompt.token(pos)
        } else {
            self.output.token(pos - self.prompt_len)
        }
    }
}

/// Prefix-cache hit of a waiting request, after the recompute rule.
#[derive(Clone, Copy, Debug, Default)]
struct PrefixCost {
    cached_tokens: u32,
    /// The part of the hit that lies in blocks other requests already hold.
    active_cached_tokens: u32,
    /// Reused tokens to report for the admission.
    reported: u32,
}

enum AdmissionDecision {
    Admit(PrefixCost),
    Wait,
    Reject(RejectReason),
}

enum Scheduled {
    /// Got `n` tokens of compute (0 only at the end of its sequence).
    Yes(u32),
    /// Could not be scheduled; stop scheduling this queue.
    Blocked,
    /// Preempted itself to make room.
    SelfPreempted,
}

/// The vLLM-style engine (also TRT-LLM's, with its admission policy).
#[derive(Debug)]
pub struct VllmEngine {
    cfg: EngineConfig,
    pool: BlockPool,
    reqs: Vec<Option<Req>>,
    free_slots: Vec<u32>,
    waiting: VecDeque<u32>,
    running: Vec<u32>,
    /// Reserved (decode worker) and held (prefill worker) requests by id.
    parked: FxHashMap<u64, u32>,
    /// Decode worker: accepted requests waiting for their pages.
    destinations: Destinations,
    next_order: u64,
    counters: EngineCounters,
    // Per-pass state.
    budget: u32,
    preempted_any: bool,
    /// Speculative decoding's burst sampler.
    sampler: Option<BurstSampler>,
    scratch_tokens: Vec<u32>,
    scratch_done: Vec<u32>,
    /// Ids generated tokens are drawn from (see [`crate::Engine::set_output_vocabulary`]).
    vocabulary: Option<Arc<[u32]>>,
    /// Record the tokens of stored blocks, drained into [`PassOutput::stored_tokens`].
    record_tokens: bool,
    stored_tokens: Vec<u32>,
}

impl VllmEngine {
    pub fn new(cfg: EngineConfig, options: EngineOptions) -> Self {
        let sampler = cfg.speculative.as_ref().map(|s| BurstSampler::new(s, options.engine_index));
        // Decode workers do not publish KV events (nothing routes on their cache).
        let record = options.record_kv_events && cfg.enable_prefix_caching && cfg.role != Role::Decode;
        VllmEngine {
            pool: BlockPool::new(cfg.num_gpu_blocks, record),
            scratch_tokens: vec![0; cfg.block_size as usize],
            cfg,
            reqs: Vec::new(),
            free_slots: Vec::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            parked: FxHashMap::default(),
            destinations: Destinations::default(),
            next_order: 0,
            counters: EngineCounters::default(),
            budget: 0,
            preempted_any: false,
            sampler,
            scratch_done: Vec::new(),
            vocabulary: None,
            record_tokens: false,
            stored_tokens: Vec::new(),
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

    /// Removes request `id` wherever it is (waiting, running, reserved or held) and frees its
    /// blocks; its computed full blocks stay in the prefix cache. False if it is not here.
    pub fn abort(&mut self, id: u64) -> bool {
        if self.destinations.remove(id) {
            return true;
        }
        self.destinations.bump();
        let slot = if let Some(slot) = self.parked.remove(&id) {
            slot
        } else if let Some(pos) = self.running.iter().position(|&s| self.req(s).id == id) {
            self.running.remove(pos)
        } else if let Some(pos) = self.waiting.iter().position(|&s| self.req(s).id == id) {
            self.waiting.remove(pos).expect("position is in the queue")
        } else {
            return false;
        };
        let req = self.remove(slot);
        for &copy in req.lease.iter().rev() {
            self.pool.release(copy);
        }
        true
    }

    /// Queues a request; it is considered for admission at the next pass.
    pub fn submit(&mut self, mut request: EngineRequest) {
        let bs = self.cfg.block_size;
        let (max_output, output) = request.output_plan(self.cfg.reasoning.as_ref());
        let output = output.with_vocabulary(self.vocabulary.clone());
        request.max_output = max_output;
        if self.cfg.backend == Backend::Trtllm {
            // TRT-LLM clamps the output to what the cache (and max_model_len) can ever hold.
            let prompt = request.prompt.len();
            let mut limit = self.cfg.kv_capacity_tokens().saturating_sub(prompt as u64) as u32;
            if let Some(max_len) = self.cfg.max_model_len {
                limit = limit.min(max_len.saturating_sub(prompt));
            }
            request.max_output = request.max_output.min(limit);
        }
        let hashes = match request.hashes {
            Some(h) => h,
            None if self.cfg.enable_prefix_caching => request.prompt.block_hashes(bs),
            None => BlockHashes::default(),
        };
        let req = Req {
            id: request.id,
            prompt_len: request.prompt.len(),
            prompt: request.prompt,
            max_output: request.max_output,
            output,
            generated: 0,
            computed: 0,
            hashes,
            lease: Vec::new(),
            status: Status::Waiting,
            preemptions: 0,
            pass_tokens: 0,
            pass_committed: 0,
            pass_prefill: None,
            transferred: false,
            order: self.next_order,
        };
        self.next_order += 1;
        let slot = self.insert(req);
        self.waiting.push_back(slot);
    }

    fn insert(&mut self, req: Req) -> u32 {
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

    /// Decode worker: accepts a request whose prompt is computed elsewhere; it waits for its
    /// blocks in [`VllmEngine::retry_destination`]. Refused if it can never fit.
    pub fn accept_destination(&mut self, request: EngineRequest) -> Result<(), RejectReason> {
        let bs = self.cfg.block_size;
        let prompt = request.prompt.len();
        if self.cfg.max_model_len.is_some_and(|m| prompt >= m) {
            return Err(RejectReason::ExceedsMaxModelLen);
        }
        let blocks = if self.cfg.backend == Backend::Trtllm {
            // TRT-LLM reserves through completion.
            (prompt + self.trtllm_output(&request)).div_ceil(bs)
        } else {
            prompt.div_ceil(bs)
        };
        if blocks > self.cfg.num_gpu_blocks {
            return Err(RejectReason::ExceedsKvCapacity);
        }
        self.destinations.push(request);
        Ok(())
    }

    /// Decode worker: tries to reserve blocks for the oldest accepted request, if an attempt is
    /// due (see [`crate::handoff`]).
    pub fn retry_destination(&mut self) -> Option<Reserved> {
        self.destinations.due()?;
        let slots_full = self.cfg.max_num_seqs.is_some_and(|m| self.running.len() >= m as usize);
        if slots_full || !self.destination_fits() {
            self.destinations.failed();
            return None;
        }
        let request = self.destinations.pop();
        let id = request.id;
        match self.reserve(request) {
            Ok(reused) => Some(Reserved { request: id, reused_tokens: reused }),
            Err(request) => {
                // Not enough blocks now: back at the head, until capacity changes.
                self.destinations.push_front(request);
                self.destinations.failed();
                None
            }
        }
    }

    /// TRT-LLM admits a destination only if its whole lifetime fits next to what running
    /// requests and earlier handoffs will still grow into; vLLM is optimistic.
    fn destination_fits(&self) -> bool {
        if self.cfg.backend != Backend::Trtllm {
            return true;
        }
        let Some(request) = self.destinations.due() else { return false };
        let bs = self.cfg.block_size;
        let to_finish = |r: &Req| (r.prompt_len + r.max_output).div_ceil(bs).saturating_sub(r.lease.len() as u32);
        let running: u32 = self.running.iter().map(|&s| to_finish(self.req(s))).sum();
        let handoffs: u32 = self
            .parked
            .values()
            .chain(self.waiting.iter())
            .map(|&s| self.req(s))
            .filter(|r| r.transferred)
            .map(to_finish)
            .sum();
        let free = self.cfg.num_gpu_blocks.saturating_sub(self.pool.num_active());
        let available = free.saturating_sub(running).saturating_sub(handoffs);
        (request.prompt.len() + self.trtllm_output(request)).div_ceil(bs) <= available
    }

    /// A TRT-LLM request's output, clamped to what the cache (and max_model_len) can hold.
    fn trtllm_output(&self, request: &EngineRequest) -> u32 {
        let (max_output, _) = request.output_plan(self.cfg.reasoning.as_ref());
        let prompt = request.prompt.len();
        let mut limit = self.cfg.kv_capacity_tokens().saturating_sub(prompt as u64) as u32;
        if let Some(max_len) = self.cfg.max_model_len {
            limit = limit.min(max_len.saturating_sub(prompt));
        }
        max_output.min(limit)
    }

    /// Allocates blocks for the prompt of a request computed on a prefill worker, reusing any
    /// prefix already cached here (vLLM; TRT-LLM takes fresh blocks). Returns the reused prompt
    /// tokens, or the request back if the blocks are not available now.
    fn reserve(&mut self, request: EngineRequest) -> Result<u32, EngineRequest> {
        let bs = self.cfg.block_size;
        let trtllm = self.cfg.backend == Backend::Trtllm;
        let (mut max_output, output) = request.output_plan(self.cfg.reasoning.as_ref());
        if trtllm {
            max_output = self.trtllm_output(&request);
        }
        let output = output.with_vocabulary(self.vocabulary.clone());
        let hashes = match &request.hashes {
            Some(h) => h.clone(),
            None if self.cfg.enable_prefix_caching => request.prompt.block_hashes(bs),
            None => BlockHashes::default(),
        };
        let prompt_len = request.prompt.len();
        let hits = if self.cfg.enable_prefix_caching && !trtllm {
            hashes.seq.iter().take_while(|h| self.pool.lookup(**h) != Residency::Missing).count()
        } else {
            0
        };
        let fresh = prompt_len.div_ceil(bs) - hits as u32;
        let mut lease = Vec::new();
        if !self.pool.allocate(&hashes.seq[..hits], fresh, &mut lease) {
            return Err(request);
        }
        let reused = hits as u32 * bs;
        let req = Req {
            id: request.id,
            prompt_len,
            prompt: request.prompt,
            max_output,
            output,
            generated: 0,
            computed: reused,
            hashes,
            lease,
            status: Status::Reserved,
            preemptions: 0,
            pass_tokens: 0,
            pass_committed: 0,
            pass_prefill: None,
            transferred: true,
            order: self.next_order,
        };
        self.next_order += 1;
        let slot = self.insert(req);
        self.parked.insert(request.id, slot);
        Ok(reused)
    }

    /// Decode worker: the KV of a reserved request has arrived; it joins the waiting queue, at
    /// its place in arrival order, with its prompt computed.
    pub fn activate(&mut self, id: u64) {
        let slot = self.parked.remove(&id).expect("activating a reserved request");
        let (before, prompt_len, order) = {
            let req = self.req(slot);
            debug_assert_eq!(req.status, Status::Reserved);
            (req.computed, req.prompt_len, req.order)
        };
        if self.cfg.enable_prefix_caching {
            self.publish_computed_blocks(slot, before, prompt_len);
        }
        let req = self.reqs[slot as usize].as_mut().expect("live request slot");
        req.computed = prompt_len;
        req.status = Status::Waiting;
        let at = self.waiting.iter().position(|&s| self.req(s).order > order).unwrap_or(self.waiting.len());
        self.waiting.insert(at, slot);
    }

    /// Prefill worker: the decode side has the KV of finished request `id`; free it.
    pub fn release_held(&mut self, id: u64) {
        let slot = self.parked.remove(&id).expect("releasing a held request");
        let req = self.remove(slot);
        debug_assert_eq!(req.status, Status::Held);
        for &copy in req.lease.iter().rev() {
            self.pool.release(copy);
        }
        self.destinations.bump();
    }

    /// Whether a pass would have anything to do.
    pub fn has_work(&self) -> bool {
        !self.running.is_empty() || !self.waiting.is_empty()
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len() + self.destinations.len()
    }

    /// Blocks held by requests.
    pub fn active_blocks(&self) -> u32 {
        self.pool.num_active()
    }

    pub fn counters(&self) -> EngineCounters {
        self.counters
    }

    fn req(&self, slot: u32) -> &Req {
        self.reqs[slot as usize].as_ref().expect("live request slot")
    }

    fn remove(&mut self, slot: u32) -> Req {
        self.free_slots.push(slot);
        self.reqs[slot as usize].take().expect("live request slot")
    }

    /// Executes one forward pass starting at `now_ms` and describes it in `out`.
    pub fn step(&mut self, now_ms: f64, out: &mut PassOutput) {
        out.clear();
        out.start_ms = now_ms;
        self.budget = self.cfg.max_num_batched_tokens.unwrap_or(u32::MAX);
        self.preempted_any = false;
        for &slot in &self.running {
            let r = self.reqs[slot as usize].as_mut().expect("running slot");
            r.pass_tokens = 0;
            r.pass_committed = 0;
            r.pass_prefill = None;
        }

        self.schedule_running(out);
        self.admit_waiting(out);

        let prefill_ms = self.cfg.timing.prefill_ms(&out.prefill);
        let decode_start = now_ms + pass_duration_ms(prefill_ms, self.cfg.speedup_ratio);
        out.end_ms = self.decode(decode_start, out);
        self.pool.drain_events(&mut out.kv_events);
        out.stored_tokens.append(&mut self.stored_tokens);
    }

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
            || self.cfg.role != Role::Aggregated
            || k > self.cfg.max_num_batched_tokens.unwrap_or(u32::MAX)
        {
            return false;
        }
        let bs = self.cfg.block_size;
        let events = self.pool.records_events();
        let mut passes = u32::MAX;
        let mut context = 0u64;
        for &slot in &self.running {
            let r = self.req(slot);
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
        let mut t = now_ms;
        for j in 0..passes {
            if t >= horizon_ms {
                break;
            }
            let shape = DecodeShape { batch: k, context_tokens: context + (j * k) as u64, capacity_tokens: capacity };
            let decode_ms = self.cfg.timing.decode_ms(&shape);
            let decode_start = t + pass_duration_ms(0.0, self.cfg.speedup_ratio);
            t = decode_start + pass_duration_ms(decode_ms, self.cfg.speedup_ratio * self.cfg.decode_speedup_ratio);
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
        out.requests.extend(self.running.iter().map(|&slot| self.req(slot).id));
        true
    }

    /// How many of the next `passes` decode passes of every running request find the blocks
    /// they grow into without preempting anyone, and without evicting a block the waiting head
    /// would reuse (its admission could change).
    fn passes_with_room(&self, passes: u32) -> u32 {
        let bs = self.cfg.block_size;
        // Pass j of a request of length `len` computes position len-1+j, which needs a new
        // block when it is a multiple of the block size.
        let first_new_block = |slot: u32| {
            let len = self.req(slot).len();
            (bs - (len - 1) % bs) % bs
        };
        let blocks_within = |m: u32| -> u64 {
            let firsts = self.running.iter().map(|&s| first_new_block(s));
            firsts.map(|j0| if j0 < m { ((m - 1 - j0) / bs + 1) as u64 } else { 0 }).sum()
        };
        let needed = blocks_within(passes);
        let free = self.pool.num_free() as u64;
        if needed <= free {
            return passes;
        }
        let head_hashes = self.waiting.front().map_or(&[][..], |&slot| &self.req(slot).hashes.seq[..]);
        let evictable =
            self.pool.eviction_order().take((needed - free) as usize).take_while(|h| !head_hashes.contains(h)).count()
                as u64;
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
        for _ in 0..passes {
            for i in 0..self.running.len() {
                let slot = self.running[i];
                let req = self.reqs[slot as usize].as_mut().expect("running slot");
                let (before, target) = (req.computed, req.computed + 1);
                req.computed = target;
                let fresh = target.div_ceil(bs).saturating_sub(req.lease.len() as u32);
                if fresh > 0 {
                    let fits = self.pool.allocate(&[], fresh, &mut req.lease);
                    assert!(fits, "plan_stretch checked the room");
                }
                if self.cfg.enable_prefix_caching {
                    self.publish_computed_blocks(slot, before, target);
                }
            }
            for i in 0..self.running.len() {
                let slot = self.running[i];
                self.req_mut(slot).generated += 1;
                self.hash_filled_block(slot);
            }
        }
    }

    fn schedule_running(&mut self, out: &mut PassOutput) {
        let mut cursor = 0;
        while cursor < self.running.len() && self.budget > 0 {
            let slot = self.running[cursor];
            match self.schedule(slot, None, out) {
                Scheduled::Yes(_) => cursor += 1,
                Scheduled::Blocked => break,
                // The next request has moved into this position.
                Scheduled::SelfPreempted => {}
            }
        }
    }

    fn admit_waiting(&mut self, out: &mut PassOutput) {
        let max_seqs = self.cfg.max_num_seqs.map_or(usize::MAX, |m| m as usize);
        while !self.preempted_any && self.running.len() < max_seqs {
            let Some(slot) = self.next_admission() else {
                break;
            };
            match self.admission(slot) {
                AdmissionDecision::Reject(reason) => {
                    self.leave_waiting(slot);
                    let req = self.remove(slot);
                    out.finished.push(Finished { request: req.id, finish: Finish::Rejected(reason) });
                }
                AdmissionDecision::Wait => break,
                AdmissionDecision::Admit(cost) => match self.schedule(slot, Some(cost), out) {
                    Scheduled::Yes(used) => {
                        if used == 0 && self.budget == 0 {
                            break;
                        }
                    }
                    _ => break,
                },
            }
        }
    }

    /// The waiting request considered next: the head, or, while destinations wait for blocks
    /// (decode worker), the first request whose KV has arrived — a request that would need
    /// fresh blocks for a prefill does not compete with them.
    fn next_admission(&self) -> Option<u32> {
        if self.destinations.is_empty() {
            return self.waiting.front().copied();
        }
        self.waiting.iter().copied().find(|&s| self.prompt_in_place(self.req(s)))
    }

    /// Whether a request's prompt is computed and in its blocks (a transferred prompt that
    /// arrived, not yet preempted).
    fn prompt_in_place(&self, req: &Req) -> bool {
        req.computed >= req.prompt_len && req.lease.len() as u32 * self.cfg.block_size >= req.prompt_len
    }

    fn leave_waiting(&mut self, slot: u32) {
        let pos = self.waiting.iter().position(|&s| s == slot).expect("slot is waiting");
        self.waiting.remove(pos);
    }

    /// Whether the waiting head can be admitted now.
    fn admission(&mut self, slot: u32) -> AdmissionDecision {
        let bs = self.cfg.block_size;
        let capacity = self.cfg.num_gpu_blocks;
        let req = self.req(slot);
        if self.prompt_in_place(req) {
            // A transferred prompt in its blocks: only a running slot is needed (and, as in the
            // reference, no prefix-cache hit is reported for it).
            return AdmissionDecision::Admit(PrefixCost::default());
        }
        if let Some(max_len) = self.cfg.max_model_len {
            if req.prompt_len >= max_len {
                return AdmissionDecision::Reject(RejectReason::ExceedsMaxModelLen);
            }
        }
        let known_blocks = req.len().div_ceil(bs);
        let trtllm = self.cfg.backend == Backend::Trtllm;
        // TRT-LLM reserves a request's whole lifetime (prompt and every output token).
        let footprint = if trtllm { (req.prompt_len + req.max_output).div_ceil(bs) } else { known_blocks };
        let never_fits = footprint > capacity || (trtllm && req.prompt_len as u64 >= self.cfg.kv_capacity_tokens());
        if req.status == Status::Waiting && never_fits {
            return AdmissionDecision::Reject(RejectReason::ExceedsKvCapacity);
        }
        let cost = self.prefix_cost(req);
        if !self.cfg.enable_chunked_prefill {
            let uncached_prompt = req.prompt_len - cost.cached_tokens.min(req.prompt_len);
            if uncached_prompt > self.cfg.max_num_batched_tokens.unwrap_or(u32::MAX) {
                return AdmissionDecision::Reject(RejectReason::ExceedsBatchBudget);
            }
        }
        let mut available = capacity - self.pool.num_active();
        let needed = footprint - cost.active_cached_tokens / bs;
        if trtllm {
            // Guaranteed no evict: what running requests will still grow into is spoken for.
            let promised: u32 = self
                .running
                .iter()
                .map(|&s| {
                    let r = self.req(s);
                    (r.prompt_len + r.max_output).div_ceil(bs).saturating_sub(r.lease.len() as u32)
                })
                .sum();
            available = available.saturating_sub(promised);
        }
        if needed > available {
            if self.running.is_empty() && self.pool.num_active() == 0 {
                // Nothing will ever free a block for it (a preempted request that outgrew the
                // cache): refuse it rather than wait forever.
                return AdmissionDecision::Reject(RejectReason::ExceedsKvCapacity);
            }
            return AdmissionDecision::Wait;
        }
        AdmissionDecision::Admit(cost)
    }

    /// The cached prefix a waiting request would reuse. At least the last known token is
    /// recomputed when the request still has tokens to generate (its logits are needed).
    fn prefix_cost(&self, req: &Req) -> PrefixCost {
        if !self.cfg.enable_prefix_caching {
            return PrefixCost::default();
        }
        let bs = self.cfg.block_size;
        let len = req.len();
        // vLLM recomputes at least the last known token when it still needs its logits;
        // TRT-LLM reuses every full cached block.
        let recompute = self.cfg.backend == Backend::Vllm && !self.generation_done(req);
        let max_blocks = if recompute { len.saturating_sub(1) / bs } else { len / bs };
        let limit = (max_blocks as usize).min(req.hashes.len());
        let (mut hits, mut active) = (0u32, 0u32);
        for &h in &req.hashes.seq[..limit] {
            match self.pool.lookup(h) {
                Residency::Missing => break,
                Residency::Active => {
                    hits += 1;
                    active += 1;
                }
                Residency::Inactive => hits += 1,
            }
        }
        if self.sampler.is_some() && hits > 0 {
            // The drafter needs the hidden states of the last matched block: recompute it.
            hits -= 1;
            active = active.min(hits);
        }
        PrefixCost { cached_tokens: hits * bs, active_cached_tokens: active * bs, reported: hits * bs }
    }

    fn generation_done(&self, req: &Req) -> bool {
        req.generated >= req.max_output || self.cfg.max_model_len.is_some_and(|m| req.len() >= m)
    }

    /// Gives `slot` its share of this pass: allocates blocks for the tokens it computes,
    /// preempting others if needed, and publishes newly computed full blocks to the cache.
    fn schedule(&mut self, slot: u32, admit: Option<PrefixCost>, out: &mut PassOutput) -> Scheduled {
        let bs = self.cfg.block_size;
        let req = self.req(slot);
        let cached = admit.map_or(0, |c| c.cached_tokens);
        let eff_before = req.computed + cached;
        let prompt_before = eff_before.min(req.prompt_len);
        let remaining = req.len() - eff_before;
        let prompt_remaining = req.prompt_len - prompt_before;
        if prompt_remaining > 0 && !self.cfg.enable_chunked_prefill && prompt_remaining > self.budget {
            return Scheduled::Blocked;
        }
        let desired = remaining.min(self.budget);
        if desired == 0 && remaining > 0 {
            return Scheduled::Blocked;
        }
        let target = eff_before + desired;

        // Allocate blocks through `target`, reusing the cached prefix on first allocation.
        let hit_blocks = (cached / bs) as usize;
        loop {
            let req = self.reqs[slot as usize].as_mut().expect("live request slot");
            let held = req.lease.len().max(hit_blocks) as u32;
            let fresh = target.div_ceil(bs).saturating_sub(held);
            let hits = if req.lease.is_empty() { &req.hashes.seq[..hit_blocks] } else { &[][..] };
            // Most decode tokens land in a block the request already holds.
            if (fresh == 0 && hits.is_empty()) || self.pool.allocate(hits, fresh, &mut req.lease) {
                break;
            }
            let Some(victim) = self.pick_victim() else {
                return Scheduled::Blocked;
            };
            self.preempt(victim, out);
            if victim == slot {
                return Scheduled::SelfPreempted;
            }
        }

        if self.cfg.enable_prefix_caching {
            self.publish_computed_blocks(slot, eff_before, target);
        }

        let readmission = self.req(slot).preemptions > 0;
        let req = self.reqs[slot as usize].as_mut().expect("live request slot");
        let prompt_after = target.min(req.prompt_len);
        if prompt_after > prompt_before {
            // Everything a request computes in a pass that reaches into its prompt counts,
            // including generated tokens it recomputes after a preemption, and a decode worker's
            // recomputation (what Dynamo reports as committed prefill).
            out.prefill_tokens += desired as u64;
            req.pass_committed = desired;
            // A decode worker's prefill costs no time: it is not part of the prefill shape.
            if self.cfg.role != Role::Decode {
                out.prefill.batch += 1;
                out.prefill.total_isl += prompt_after as u64;
                out.prefill.total_prefix += prompt_before as u64;
                req.pass_prefill = Some((prompt_before, prompt_after));
            }
        }
        req.computed = target;
        req.pass_tokens = desired;
        out.computed_tokens += desired as u64;
        self.budget -= desired;
        if let Some(cost) = admit {
            req.status = Status::Running;
            let id = req.id;
            self.counters.prefix_queries += req.len() as u64;
            self.counters.prefix_hits += cost.reported as u64;
            self.leave_waiting(slot);
            self.running.push(slot);
            out.admissions.push(Admission { request: id, reused_tokens: cost.reported, readmission });
        }
        Scheduled::Yes(desired)
    }

    /// Caches the blocks of `slot` that became fully computed between `before` and `after`
    /// tokens, recording `Stored` events for consecutive newly visible blocks.
    fn publish_computed_blocks(&mut self, slot: u32, before: u32, after: u32) {
        let bs = self.cfg.block_size;
        let (first, end) = ((before / bs) as usize, (after / bs) as usize);
        if first == end {
            return;
        }
        let req = self.reqs[slot as usize].as_ref().expect("live request slot");
        if !self.pool.records_events() {
            for b in first..end {
                self.pool.cache(req.lease[b], req.hashes.seq[b]);
            }
            return;
        }
        let mut run: Vec<StoredBlock> = Vec::new();
        let mut run_parent = None;
        let mut events = Vec::new();
        for b in first..end {
            let hash = req.hashes.seq[b];
            if self.pool.cache(req.lease[b], hash) {
                if run.is_empty() {
                    run_parent = b.checked_sub(1).map(|p| req.hashes.seq[p]);
                }
                if self.record_tokens {
                    let start = b as u32 * bs;
                    self.stored_tokens.extend((start..start + bs).map(|pos| req.token_at(pos)));
                }
                run.push(StoredBlock { hash, local: req.hashes.local[b] });
            } else if !run.is_empty() {
                events.push(KvEvent::Stored { parent: run_parent, blocks: std::mem::take(&mut run) });
            }
        }
        if !run.is_empty() {
            events.push(KvEvent::Stored { parent: run_parent, blocks: run });
        }
        for e in events {
            self.pool.push_event(e);
        }
    }

    fn pick_victim(&self) -> Option<u32> {
        if self.cfg.backend == Backend::Trtllm {
            // TRT-LLM never preempts; admission guarantees the blocks.
            return None;
        }
        match self.cfg.preemption_mode {
            PreemptionMode::Lifo => self.running.last().copied(),
            PreemptionMode::Fifo => self.running.first().copied(),
        }
    }

    /// Preempts by recompute: frees the request's blocks (cached ones stay reusable) and puts
    /// it at the front of the waiting queue with its generated tokens kept.
    fn preempt(&mut self, slot: u32, out: &mut PassOutput) {
        let pos = self.running.iter().position(|&s| s == slot).expect("victim is running");
        self.running.remove(pos);
        // A victim already scheduled in this pass (FIFO preemption) leaves the list without the
        // cursor moving back, so the request after the one being scheduled is passed over until
        // the next pass — as in the reference's scheduling loop.
        let req = self.reqs[slot as usize].as_mut().expect("live request slot");
        for &copy in req.lease.iter().rev() {
            self.pool.release(copy);
        }
        req.lease.clear();
        req.status = Status::Preempted;
        req.computed = 0;
        req.preemptions += 1;
        // Give back what it was granted earlier in this pass.
        self.budget += req.pass_tokens;
        out.computed_tokens -= req.pass_tokens as u64;
        out.prefill_tokens -= std::mem::take(&mut req.pass_committed) as u64;
        if let Some((before, after)) = req.pass_prefill.take() {
            out.prefill.batch -= 1;
            out.prefill.total_isl -= after as u64;
            out.prefill.total_prefix -= before as u64;
        }
        req.pass_tokens = 0;
        out.preempted.push(req.id);
        self.waiting.push_front(slot);
        self.preempted_any = true;
        self.counters.preemptions += 1;
        self.destinations.bump();
    }

    /// Generates a token for every request whose known tokens are all computed; returns the
    /// pass end time.
    fn decode(&mut self, decode_start: f64, out: &mut PassOutput) -> f64 {
        let speculative = self.sampler.is_some() && self.cfg.role != Role::Prefill;
        if speculative {
            self.reserve_bursts(out);
        }
        let mut shape = DecodeShape { capacity_tokens: self.cfg.kv_capacity_tokens(), ..DecodeShape::default() };
        for &slot in &self.running {
            let req = self.req(slot);
            // A first token that comes out of this pass's prefill costs no decode time; every
            // other token does (even a first one, when the prompt was all cached or transferred).
            // With speculative decoding every ready request runs the decode forward (the draft
            // model follows the prefill).
            let decodes = speculative || req.generated > 0 || req.pass_prefill.is_none();
            if req.computed >= req.len() && decodes && !self.generation_done(req) {
                shape.batch += 1;
                shape.context_tokens += req.len() as u64;
            }
        }
        // A prefill worker's token comes out of the prefill forward.
        let decode_ms =
            if self.cfg.role == Role::Prefill { 0.0 } else { self.cfg.timing.decode_ms(&shape) };
        out.decode = shape;
        let end = decode_start + pass_duration_ms(decode_ms, self.cfg.speedup_ratio * self.cfg.decode_speedup_ratio);

        let mut done = std::mem::take(&mut self.scratch_done);
        for i in 0..self.running.len() {
            let slot = self.running[i];
            let req = self.req(slot);
            if req.computed < req.len() {
                continue;
            }
            let decodes = speculative || req.generated > 0 || req.pass_prefill.is_none();
            if !self.generation_done(req) {
                // With speculative decoding a decode forward may yield a burst of tokens; a
                // first token out of the prefill forward is always alone.
                let remaining = self.remaining(slot);
                let burst = match self.sampler.as_mut() {
                    Some(sampler) if speculative && decodes => sampler.sample(remaining),
                    _ => 1,
                };
                let before = self.req(slot).len();
                for _ in 0..burst {
                    self.generate(slot, out);
                }
                if decodes {
                    out.decode_forwards += 1;
                    out.decode_tokens += burst;
                }
                if burst > 1 && !self.generation_done(self.req(slot)) {
                    // The accepted drafts are computed: only the last token dangles.
                    let after = self.req(slot).len() - 1;
                    self.req_mut(slot).computed = after;
                    if self.cfg.enable_prefix_caching {
                        self.publish_computed_blocks(slot, before, after);
                    }
                }
            }
            if self.generation_done(self.req(slot)) {
                done.push(slot);
            }
        }
        if !done.is_empty() {
            // A finished request frees a running slot (and blocks, unless held for a handoff).
            self.destinations.bump();
            self.running.retain(|s| !done.contains(s));
            for &slot in &done {
                if self.cfg.role == Role::Prefill {
                    // Keep the KV until the decode worker has it.
                    let req = self.reqs[slot as usize].as_mut().expect("live request slot");
                    req.status = Status::Held;
                    let id = req.id;
                    self.parked.insert(id, slot);
                    out.finished.push(Finished { request: id, finish: Finish::Completed });
                    continue;
                }
                let req = self.remove(slot);
                for &copy in req.lease.iter().rev() {
                    self.pool.release(copy);
                }
                out.finished.push(Finished { request: req.id, finish: Finish::Completed });
            }
            done.clear();
        }
        self.scratch_done = done;
        end
    }

    /// Tokens `slot` may still generate.
    fn remaining(&self, slot: u32) -> u32 {
        let req = self.req(slot);
        let by_output = req.max_output - req.generated;
        self.cfg.max_model_len.map_or(by_output, |m| by_output.min(m.saturating_sub(req.len())))
    }

    /// Speculative decoding: before the forward, every request that decodes gets the blocks a
    /// full burst could fill; requests are preempted (newest first) until that fits.
    fn reserve_bursts(&mut self, out: &mut PassOutput) {
        let bs = self.cfg.block_size;
        let max_burst = self.cfg.speculative.as_ref().map_or(1, |s| s.max_burst());
        loop {
            let mut wants: Vec<(u32, u32)> = Vec::new();
            for &slot in &self.running {
                let req = self.req(slot);
                if req.computed < req.len() || self.generation_done(req) {
                    continue;
                }
                let want = (req.len() + max_burst.min(self.remaining(slot))).div_ceil(bs);
                let extra = want.saturating_sub(req.lease.len() as u32);
                if extra > 0 {
                    wants.push((slot, extra));
                }
            }
            let total: u32 = wants.iter().map(|w| w.1).sum();
            if self.pool.can_allocate(total) {
                for (slot, extra) in wants {
                    let req = self.reqs[slot as usize].as_mut().expect("live request slot");
                    let ok = self.pool.allocate(&[], extra, &mut req.lease);
                    debug_assert!(ok);
                }
                return;
            }
            let Some(victim) = self.pick_victim() else { return };
            self.preempt(victim, out);
        }
    }

    fn req_mut(&mut self, slot: u32) -> &mut Req {
        self.reqs[slot as usize].as_mut().expect("live request slot")
    }

    /// Appends one generated token; hashes the block it completes.
    fn generate(&mut self, slot: u32, out: &mut PassOutput) {
        let req = self.reqs[slot as usize].as_mut().expect("live request slot");
        let token = req.output.token(req.generated);
        req.generated += 1;
        out.tokens.push(TokenOut { request: req.id, token });
        self.hash_filled_block(slot);
    }

    /// With prefix caching, hashes the block the last generated token filled, if it did.
    fn hash_filled_block(&mut self, slot: u32) {
        let bs = self.cfg.block_size;
        let req = self.reqs[slot as usize].as_mut().expect("live request slot");
        let len = req.len();
        if self.cfg.enable_prefix_caching && len.is_multiple_of(bs) {
            let start = len - bs;
            for (k, t) in self.scratch_tokens.iter_mut().enumerate() {
                *t = req.token_at(start + k as u32);
            }
            req.hashes.push_local(local_block_hash(&self.scratch_tokens));
        }
    }
}
