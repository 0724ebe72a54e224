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
//! **Prefill cadence** (`prefill_schedule_interval` n > 1, vLLM with attention DP only): the
//! ranks of a worker count their shared passes (the wave, from 0, restarted when every rank is
//! empty); on a pass whose wave step is not a multiple of n, a rank that has a decoding request
//! starts no prefill work — running requests still in their prompt are skipped, and admission
//! stops at the first waiting request with more than one token to compute — unless its last
//! full scheduling pass left requests waiting (it is capacity-bound, and throttling would only
//! idle it). Drivers tell the engine the wave step with [`VllmEngine::begin_group_pass`].
//!
//! This module holds the pass and its scheduling (steps 1 and 2); step 3 is in `decode.rs`.
//! TRT-LLM runs the same core under another `policy::Policy` (guaranteed-no-evict admission,
//! no preemption, outputs clamped to the cache). Runs of decode-only passes can be planned and
//! committed at once (`stretch.rs`); disaggregated workers use the hooks in `handoff.rs`.

mod decode;
mod handoff;
mod offload;
mod policy;
mod state_cache;
mod stretch;

use std::collections::VecDeque;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::config::{EngineConfig, Role};
use crate::engine::{EngineCounters, EngineOptions};
use crate::handoff::Destinations;
use crate::output::{Admission, Finish, Finished, KvEvent, PassOutput, RejectReason, StoredBlock};
use crate::pool::{BlockPool, Residency};
use crate::request::EngineRequest;
use crate::sequence::{Sequence, SequenceTable};
use crate::speculative::{BurstSampler, SpecSchedule};
use crate::timing::PassJitter;
use policy::Policy;

pub use offload::{CacheTiers, HostCounters};

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

/// What the vLLM core tracks of a request besides its [`Sequence`].
#[derive(Debug)]
struct Sched {
    status: Status,
    preemptions: u32,
    /// Budget this request consumed in the current pass.
    pass_tokens: u32,
    /// The part of it counted as committed prefill.
    pass_committed: u32,
    /// Its contribution to the current pass's prefill shape: (prompt before, prompt after).
    pass_prefill: Option<(u32, u32)>,
    /// Arrival order (submission, or acceptance as a destination): an activated destination
    /// rejoins the waiting queue at its place in this order.
    order: u64,
    /// Passes the engine had started when the request was submitted (see
    /// [`VllmEngine::schedulable`]).
    submitted_after: u64,
    /// Its recurrent state (with `state_cache`).
    cache: state_cache::StateSlot,
}

impl Sched {
    fn new(status: Status, order: u64) -> Self {
        Sched {
            status,
            preemptions: 0,
            pass_tokens: 0,
            pass_committed: 0,
            pass_prefill: None,
            order,
            submitted_after: 0,
            cache: state_cache::StateSlot::default(),
        }
    }
}

type Req = Sequence<Sched>;

/// A request's lifetime in tokens (prompt and whole output) and the blocks it holds: what
/// [`Policy::promised_blocks`] reads.
fn lifetime(req: &Req) -> (u32, u32) {
    (req.prompt_len + req.max_output, req.blocks.len() as u32)
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
    policy: Policy,
    pool: BlockPool,
    reqs: SequenceTable<Sched>,
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
    /// Batch-budget tokens each decoding request's drafts take beyond its own token (see
    /// `SpecSchedule`).
    draft_budget: u32,
    /// Per-pass timing noise.
    jitter: Option<PassJitter>,
    scratch_tokens: Vec<u32>,
    scratch_done: Vec<u32>,
    /// Ids generated tokens are drawn from (see [`crate::Engine::set_output_vocabulary`]).
    vocabulary: Option<Arc<[u32]>>,
    /// Record the tokens of stored blocks, drained into [`PassOutput::stored_tokens`].
    record_tokens: bool,
    stored_tokens: Vec<u32>,
    /// Buffers of the fast-forward's room check (see `stretch.rs`).
    stretch_firsts: Vec<u32>,
    stretch_positions: FxHashMap<u64, u64>,
    /// The host (G2) KV cache and its connector state (`native_host_offload`).
    host: Option<Box<offload::HostState>>,
    /// The prefill cadence: the worker's pass count and ranks, as the driver last said (a rank
    /// driven alone is a group of one, which never throttles).
    wave_step: u64,
    group_ranks: u32,
    /// The last pass that scheduled without throttling or preempting left requests waiting.
    prefill_capacity_bound: bool,
    /// This pass throttles new prefill work.
    defer_prefills: bool,
    /// Passes started so far (a stretch counts each of its passes).
    passes: u64,
    /// vLLM's async scheduling: the pass about to start was scheduled when the last one started,
    /// because that one left requests running.
    prescheduled: bool,
    /// This pass admits no request submitted at or after this pass count (see
    /// [`VllmEngine::schedulable`]).
    late_from: Option<u64>,
    /// The recurrent-state cache (`state_cache`).
    state_cache: Option<state_cache::StateCache>,
}

impl VllmEngine {
    pub fn new(cfg: EngineConfig, options: EngineOptions) -> Self {
        let sampler = cfg.speculative.as_ref().map(|s| BurstSampler::new(s, options.engine_index));
        let draft_budget = match &cfg.speculative {
            Some(s) if s.schedule == SpecSchedule::Aisimulate => s.nextn,
            _ => 0,
        };
        // Decode workers do not publish KV events (nothing routes on their cache).
        let record = options.record_kv_events && cfg.enable_prefix_caching && cfg.role != Role::Decode;
        let host = offload::HostState::new(&cfg, record, None, None);
        let cfg_state = cfg.state_cache;
        VllmEngine {
            policy: Policy::of(&cfg),
            pool: BlockPool::new(cfg.num_gpu_blocks, record),
            scratch_tokens: vec![0; cfg.block_size as usize],
            cfg,
            reqs: SequenceTable::default(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            parked: FxHashMap::default(),
            destinations: Destinations::default(),
            next_order: 0,
            counters: EngineCounters::default(),
            budget: 0,
            preempted_any: false,
            sampler,
            draft_budget,
            jitter: PassJitter::new(options.timing_jitter, options.engine_index),
            scratch_done: Vec::new(),
            vocabulary: None,
            record_tokens: false,
            stored_tokens: Vec::new(),
            stretch_firsts: Vec::new(),
            stretch_positions: FxHashMap::default(),
            host,
            wave_step: 0,
            group_ranks: 1,
            prefill_capacity_bound: false,
            defer_prefills: false,
            passes: 0,
            prescheduled: false,
            late_from: None,
            state_cache: cfg_state.as_ref().map(state_cache::StateCache::new),
        }
    }

    /// The next pass is pass `wave_step` of a worker of `dp_size` attention-DP ranks that run
    /// their passes together (see the prefill cadence in the module documentation).
    pub fn begin_group_pass(&mut self, wave_step: u64, dp_size: u32) {
        self.wave_step = wave_step;
        self.group_ranks = dp_size;
    }

    /// Whether nothing is left here: no request queued, running, held or reserved.
    pub fn is_drained(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty() && self.parked.is_empty() && self.destinations.is_empty()
    }

    /// Whether this pass throttles new prefill work (see the module documentation).
    fn throttles_prefill(&self) -> bool {
        let interval = self.cfg.prefill_schedule_interval.max(1);
        self.group_ranks > 1
            && self.cfg.backend == crate::config::Backend::Vllm
            && !self.wave_step.is_multiple_of(interval)
            && !self.prefill_capacity_bound
            && self.running.iter().any(|&s| self.prompt_in_place(&self.reqs[s]))
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
        if self.destinations.cancel(id) {
            return true;
        }
        let found = self
            .parked
            .remove(&id)
            .or_else(|| self.reqs.take_from(&mut self.running, id))
            .or_else(|| self.reqs.take_from(&mut self.waiting, id));
        let found = found.or_else(|| self.host_connector_slot(id));
        let Some(slot) = found else { return false };
        self.host_abort(slot);
        self.state_release(slot, false);
        let req = self.reqs.remove(slot);
        self.pool.release_lease(&req.blocks);
        true
    }

    /// Queues a request; it is considered for admission at the next pass.
    pub fn submit(&mut self, request: EngineRequest) {
        let mut req = self.sequence(request, Status::Waiting);
        req.state.submitted_after = self.passes;
        let slot = self.reqs.insert(req);
        self.waiting.push_back(slot);
    }

    /// A request as this engine tracks it: its prompt hashed (with prefix caching, unless the
    /// caller did), its output limited by the policy, next in arrival order.
    fn sequence(&mut self, mut request: EngineRequest, status: Status) -> Req {
        if request.hashes.is_none() && self.cfg.enable_prefix_caching {
            request.hashes = Some(request.prompt.block_hashes(self.cfg.block_size));
        }
        let sched = Sched::new(status, self.next_order);
        self.next_order += 1;
        let mut req = Sequence::new(request, self.cfg.reasoning.as_ref(), self.vocabulary.clone(), sched);
        req.max_output = self.output_limit(req.prompt_len, req.max_output);
        req
    }

    /// The output a request of `prompt` tokens asking for `output` may generate here.
    fn output_limit(&self, prompt: u32, output: u32) -> u32 {
        self.policy.output_limit(prompt, output, self.cfg.kv_capacity_tokens(), self.cfg.max_model_len)
    }

    /// Whether a pass would have anything to do.
    pub fn has_work(&self) -> bool {
        !self.running.is_empty()
            || !self.waiting.is_empty()
            || self.host_has_ready_waiter()
            || self.destinations.retry_ready()
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn queue_load(&self) -> crate::output::QueueLoad {
        let mut q = crate::output::QueueLoad::default();
        for &slot in &self.waiting {
            let req = &self.reqs[slot];
            if req.state.status == Status::Preempted {
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
        self.waiting.len() + self.destinations.len() + self.host_connector_len()
    }

    /// Blocks held by requests.
    pub fn active_blocks(&self) -> u32 {
        self.pool.num_active()
    }

    /// Cached blocks no request holds.
    pub fn inactive_blocks(&self) -> u32 {
        self.pool.num_inactive()
    }

    pub fn counters(&self) -> EngineCounters {
        self.counters
    }

    /// Executes one forward pass starting at `now_ms` and describes it in `out`.
    pub fn step(&mut self, now_ms: f64, out: &mut PassOutput) {
        out.clear();
        out.start_ms = now_ms;
        self.budget = self.cfg.max_num_batched_tokens.unwrap_or(u32::MAX);
        self.preempted_any = false;
        for &slot in &self.running {
            let s = &mut self.reqs[slot].state;
            s.pass_tokens = 0;
            s.pass_committed = 0;
            s.pass_prefill = None;
        }

        self.defer_prefills = self.throttles_prefill();
        // With async scheduling this pass was scheduled when the last one started, if that one
        // left work: a request submitted since then (during the last pass) waits for the next.
        self.late_from = (self.cfg.async_scheduling && self.prescheduled).then_some(self.passes);
        self.passes += 1;
        self.host_pass_start(now_ms);
        self.state_pass_start();
        self.schedule_running(out);
        if self.host.is_some() {
            self.admit_waiting_host(now_ms, out);
        } else {
            self.admit_waiting(out);
        }
        if !self.defer_prefills && !self.preempted_any {
            self.prefill_capacity_bound = !self.waiting.is_empty();
        }
        let compute_start = self.host_after_scheduling(now_ms);

        if let Some(j) = self.jitter.as_mut() {
            j.next_pass();
        }
        // Timed as scheduled: a request that speculative decoding preempts below keeps its
        // prefill's share of the pass, as in the reference.
        let prefill = out.prefill;
        self.decode(out);
        out.end_ms = self.pass_end(compute_start, &prefill, out);
        self.prescheduled = !self.running.is_empty();
        self.host_boundary(out.end_ms, out);
        self.drain_kv_events(out);
    }

    /// Moves the KV events recorded since the last pass (device and host) to `out`: at the end
    /// of a pass, and when an idle rank's transfers complete (Dynamo publishes those at once).
    pub fn drain_kv_events(&mut self, out: &mut PassOutput) {
        self.pool.drain_events(&mut out.kv_events);
        self.host_drain_residency(&mut out.host_kv_events);
        out.stored_tokens.append(&mut self.stored_tokens);
    }

    fn schedule_running(&mut self, out: &mut PassOutput) {
        let mut cursor = 0;
        while cursor < self.running.len() && self.budget > 0 {
            let slot = self.running[cursor];
            if self.defer_prefills && !self.prompt_in_place(&self.reqs[slot]) {
                // A throttled pass continues no prompt.
                cursor += 1;
                continue;
            }
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
                    let req = self.reqs.remove(slot);
                    out.finished.push(Finished { request: req.id, finish: Finish::Rejected(reason) });
                }
                AdmissionDecision::Wait => break,
                AdmissionDecision::Admit(cost) if self.defer_prefills && self.new_tokens(slot, cost) > 1 => break,
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

    /// Tokens admitting `slot` with `cost` would compute: none for a prompt already in place.
    fn new_tokens(&self, slot: u32, cost: PrefixCost) -> u32 {
        let req = &self.reqs[slot];
        if self.prompt_in_place(req) {
            0
        } else {
            req.len() - cost.cached_tokens.min(req.len())
        }
    }

    fn leave_waiting(&mut self, slot: u32) {
        match self.waiting.iter().position(|&s| s == slot) {
            Some(pos) => {
                self.waiting.remove(pos);
            }
            None => assert!(self.host.as_mut().is_some_and(|h| h.leave_connector(slot)), "slot is waiting"),
        }
    }

    /// Whether the waiting head can be admitted now.
    fn admission(&mut self, slot: u32) -> AdmissionDecision {
        let bs = self.cfg.block_size;
        let capacity = self.cfg.num_gpu_blocks;
        let req = &self.reqs[slot];
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
        let footprint = self.policy.footprint_tokens(req.len(), req.prompt_len, req.max_output).div_ceil(bs);
        if req.state.status == Status::Waiting && self.policy.never_fits(footprint, req.prompt_len, capacity, bs) {
            return AdmissionDecision::Reject(RejectReason::ExceedsKvCapacity);
        }
        let cost = self.prefix_cost(req);
        if !self.cfg.enable_chunked_prefill {
            let uncached_prompt = req.prompt_len - cost.cached_tokens.min(req.prompt_len);
            if uncached_prompt > self.cfg.max_num_batched_tokens.unwrap_or(u32::MAX) {
                return AdmissionDecision::Reject(RejectReason::ExceedsBatchBudget);
            }
        }
        let promised = self.policy.promised_blocks(bs, self.running.iter().map(|&s| lifetime(&self.reqs[s])));
        let available = (capacity - self.pool.num_active()).saturating_sub(promised);
        let needed = footprint - cost.active_cached_tokens / bs + self.state_admission_blocks(req, cost);
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

    /// The leading blocks of `hashes` resident on the device, and how many of them requests
    /// hold (active); the scan stops at the first missing block.
    fn resident_prefix(&self, hashes: &[u64]) -> (u32, u32) {
        let (mut hits, mut active) = (0, 0);
        for &h in hashes {
            match self.pool.lookup(h) {
                Residency::Missing => break,
                Residency::Active => {
                    hits += 1;
                    active += 1;
                }
                Residency::Inactive => hits += 1,
            }
        }
        (hits, active)
    }

    /// The cached prefix a waiting request would reuse. At least the last known token is
    /// recomputed when the policy says so and the request still has tokens to generate.
    fn prefix_cost(&self, req: &Req) -> PrefixCost {
        if !self.cfg.enable_prefix_caching {
            return PrefixCost::default();
        }
        if self.state_cache.is_some() {
            return self.state_prefix_cost(req);
        }
        let bs = self.cfg.block_size;
        let len = req.len();
        let recompute = self.policy.recomputes_last_token() && !self.generation_done(req);
        let max_blocks = if recompute { len.saturating_sub(1) / bs } else { len / bs };
        let limit = (max_blocks as usize).min(req.hashes.len());
        let (mut hits, mut active) = self.resident_prefix(&req.hashes.seq[..limit]);
        if recompute && self.sampler.is_some() && hits > 0 {
            // vLLM's drafter needs the hidden states of the last matched block: recompute it.
            // TRT-LLM (and a request with nothing left to generate) keeps the whole hit: the
            // reference drops the block only under the vLLM policy when logits are needed
            // (`apply_prefix_recompute`/`apply_mtp_prefix_recompute`, kv_manager/vllm_backend.rs).
            hits -= 1;
            active = active.min(hits);
        }
        PrefixCost { cached_tokens: hits * bs, active_cached_tokens: active * bs, reported: hits * bs }
    }

    fn generation_done(&self, req: &Req) -> bool {
        req.output_done() || self.cfg.max_model_len.is_some_and(|m| req.len() >= m)
    }

    /// Gives `slot` its share of this pass: allocates blocks for the tokens it computes,
    /// preempting others if needed, and publishes newly computed full blocks to the cache.
    fn schedule(&mut self, slot: u32, admit: Option<PrefixCost>, out: &mut PassOutput) -> Scheduled {
        let bs = self.cfg.block_size;
        let req = &self.reqs[slot];
        let cached = admit.map_or(0, |c| c.cached_tokens);
        let eff_before = req.computed + cached;
        let prompt_before = eff_before.min(req.prompt_len);
        let remaining = req.len() - eff_before;
        let prompt_remaining = req.prompt_len - prompt_before;
        if prompt_remaining > 0 && !self.cfg.enable_chunked_prefill && prompt_remaining > self.budget {
            return Scheduled::Blocked;
        }
        let desired = self.align_state_prefill(eff_before, req.prompt_len, req.len(), remaining.min(self.budget));
        if desired == 0 && remaining > 0 {
            return Scheduled::Blocked;
        }
        let target = eff_before + desired;

        // Allocate blocks through `target`, reusing the cached prefix on first allocation.
        let hit_blocks = (cached / bs) as usize;
        let allocated = loop {
            if self.state_cache.is_some() {
                if let Some(fresh) = self.allocate_with_state(slot, cached, eff_before, target) {
                    break fresh;
                }
            } else {
                let req = &mut self.reqs[slot];
                let held = req.blocks.len().max(hit_blocks) as u32;
                let fresh = target.div_ceil(bs).saturating_sub(held);
                let hits = if req.blocks.is_empty() { &req.hashes.seq[..hit_blocks] } else { &[][..] };
                // Most decode tokens land in a block the request already holds.
                if (fresh == 0 && hits.is_empty()) || self.pool.allocate(hits, fresh, &mut req.blocks) {
                    break fresh;
                }
            }
            let Some(victim) = self.policy.victim(&self.running) else {
                return Scheduled::Blocked;
            };
            self.preempt(victim, out);
            if victim == slot {
                return Scheduled::SelfPreempted;
            }
        };

        self.host_allocated(slot, allocated);
        if self.cfg.enable_prefix_caching {
            self.publish_computed_blocks(slot, eff_before, target);
        }
        self.state_commit(slot, eff_before, target);

        let req = &mut self.reqs[slot];
        let readmission = req.state.preemptions > 0;
        let prompt_after = target.min(req.prompt_len);
        if prompt_after > prompt_before {
            // Everything a request computes in a pass that reaches into its prompt counts,
            // including generated tokens it recomputes after a preemption, and a decode worker's
            // recomputation (what Dynamo reports as committed prefill).
            out.prefill_tokens += desired as u64;
            req.state.pass_committed = desired;
            // A decode worker's prefill costs no time: it is not part of the prefill shape.
            if self.cfg.role != Role::Decode {
                out.prefill.batch += 1;
                out.prefill.total_isl += prompt_after as u64;
                out.prefill.total_prefix += prompt_before as u64;
                req.state.pass_prefill = Some((prompt_before, prompt_after));
            }
        }
        req.computed = target;
        req.state.pass_tokens = desired;
        out.computed_tokens += desired as u64;
        self.budget -= desired;
        if prompt_remaining == 0 {
            self.budget = self.budget.saturating_sub(self.draft_budget);
        }
        if let Some(cost) = admit {
            req.state.status = Status::Running;
            let id = req.id;
            self.counters.prefix_queries += req.len() as u64;
            self.counters.prefix_hits += cost.reported as u64;
            self.leave_waiting(slot);
            self.running.push(slot);
            let tiers = self.host_admitted(slot, cost.reported);
            out.admissions.push(Admission { request: id, reused_tokens: cost.reported, readmission, tiers });
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
        let req = &self.reqs[slot];
        if !self.pool.records_events() {
            for b in first..end {
                self.pool.cache(req.blocks[b], req.hashes.seq[b]);
            }
            return;
        }
        // Sized for the common case: every block is new and forms one run.
        let mut run: Vec<StoredBlock> = Vec::with_capacity(end - first);
        let mut run_parent = None;
        for b in first..end {
            let hash = req.hashes.seq[b];
            if self.pool.cache(req.blocks[b], hash) {
                if run.is_empty() {
                    run_parent = b.checked_sub(1).map(|p| req.hashes.seq[p]);
                }
                if self.record_tokens {
                    let start = b as u32 * bs;
                    self.stored_tokens.extend((start..start + bs).map(|pos| req.token_at(pos)));
                }
                run.push(StoredBlock { hash, local: req.hashes.local[b] });
            } else if !run.is_empty() {
                self.pool.push_event(KvEvent::Stored { parent: run_parent, blocks: std::mem::take(&mut run) });
            }
        }
        if !run.is_empty() {
            self.pool.push_event(KvEvent::Stored { parent: run_parent, blocks: run });
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
        self.host_preempted(self.reqs[slot].id);
        self.state_release(slot, true);
        let req = &mut self.reqs[slot];
        self.pool.release_lease(&req.blocks);
        req.blocks.clear();
        req.computed = 0;
        let s = &mut req.state;
        s.status = Status::Preempted;
        s.preemptions += 1;
        // Give back what it was granted earlier in this pass.
        self.budget += s.pass_tokens;
        out.computed_tokens -= s.pass_tokens as u64;
        out.prefill_tokens -= std::mem::take(&mut s.pass_committed) as u64;
        if let Some((before, after)) = s.pass_prefill.take() {
            out.prefill.batch -= 1;
            out.prefill.total_isl -= after as u64;
            out.prefill.total_prefix -= before as u64;
        }
        s.pass_tokens = 0;
        out.preempted.push(req.id);
        self.waiting.push_front(slot);
        self.preempted_any = true;
        self.counters.preemptions += 1;
        self.destinations.bump();
    }
}
