//! Disaggregated serving in the vLLM core. A *prefill* worker pays no decode time (its single
//! token comes from the prefill forward) and holds a finished request's KV until
//! [`VllmEngine::release_held`]. A *decode* worker receives prompts computed elsewhere: it
//! accepts them ([`VllmEngine::accept_destination`]), reserves their blocks oldest first
//! ([`VllmEngine::retry_destination`], see [`crate::handoff`]), marks them computed when the
//! transfer lands ([`VllmEngine::activate`]) and never charges prefill time for them.

use super::{lifetime, Req, Status, VllmEngine};
use crate::handoff::Reserved;
use crate::output::RejectReason;
use crate::pool::Residency;
use crate::request::EngineRequest;

impl VllmEngine {
    /// Decode worker: accepts a request whose prompt is computed elsewhere; it waits for its
    /// blocks in [`VllmEngine::retry_destination`]. Refused if it can never fit.
    pub fn accept_destination(&mut self, request: EngineRequest) -> Result<(), RejectReason> {
        let blocks = self.destination_blocks(&request);
        self.destinations.accept(request, blocks, &self.cfg)
    }

    /// Blocks a destination needs reserved: its prompt's (vLLM), or its whole lifetime's
    /// (TRT-LLM reserves through completion), and with a state cache the blocks of the
    /// request state that arrives beside its KV.
    fn destination_blocks(&self, request: &EngineRequest) -> u32 {
        let prompt = request.prompt.len();
        let output = self.output_limit(prompt, request.output_len());
        self.policy.footprint_tokens(prompt, prompt, output).div_ceil(self.cfg.block_size) + self.state_blocks()
    }

    /// Decode worker: tries to reserve blocks for the oldest accepted request, if an attempt is
    /// due (see [`crate::handoff`]).
    pub fn retry_destination(&mut self) -> Option<Reserved> {
        self.destinations.attempting();
        self.destinations.due()?;
        let slots_full = self.cfg.max_num_seqs.is_some_and(|m| self.running.len() >= m as usize);
        if slots_full || !self.destination_fits() {
            self.destinations.failed();
            return None;
        }
        let request = self.destinations.pop();
        let outcome = self.reserve(request);
        // Not enough blocks now: back at the head, until capacity changes.
        self.destinations.settle(outcome)
    }

    /// Whether the policy lets the oldest destination reserve now (TRT-LLM's leaves room for
    /// what running requests and earlier handoffs will still grow into).
    fn destination_fits(&self) -> bool {
        let Some(request) = self.destinations.due() else { return false };
        let running = self.running.iter().map(|&s| lifetime(&self.reqs[s]));
        let handoffs = self
            .parked
            .values()
            .chain(self.waiting.iter())
            .map(|&s| &self.reqs[s])
            .filter(|r| r.transferred)
            .map(lifetime);
        let free = self.cfg.num_gpu_blocks.saturating_sub(self.pool.num_active());
        let blocks = self.destination_blocks(request);
        self.policy.destination_fits(blocks, free, self.cfg.block_size, running, handoffs)
    }

    /// Allocates blocks for the prompt of a request computed on a prefill worker, reusing any
    /// prefix already cached here if the policy does. Returns the reservation, or the request
    /// back if the blocks are not available now.
    fn reserve(&mut self, mut request: EngineRequest) -> Result<Reserved, EngineRequest> {
        let bs = self.cfg.block_size;
        let caching = self.cfg.enable_prefix_caching;
        if request.hashes.is_none() && caching {
            request.hashes = Some(request.prompt.block_hashes(bs));
        }
        let cached: &[u64] = request.hashes.as_ref().map_or(&[], |h| &h.seq);
        let hits = if caching && self.policy.reserve_reuses_cache() {
            cached.iter().take_while(|h| self.pool.lookup(**h) != Residency::Missing).count()
        } else {
            0
        };
        let fresh = request.prompt.len().div_ceil(bs) - hits as u32;
        let state = self.state_blocks();
        let mut lease = Vec::new();
        if !self.pool.allocate(&cached[..hits], fresh + state, &mut lease) {
            return Err(request);
        }
        if self.host_copy_pending(&lease[hits..]) {
            // Never receive handed-off KV into blocks whose old contents are still being
            // copied to the host: give them back and try again when that copy completes.
            self.pool.release_lease(&lease);
            return Err(request);
        }
        let reused = hits as u32 * bs;
        let mut req = self.sequence(request, Status::Reserved);
        req.computed = reused;
        // The request state lands in blocks of its own: it becomes the working state.
        let working = lease.split_off(lease.len() - state as usize);
        Self::state_received(&mut req, working, bs);
        req.blocks = lease;
        req.transferred = true;
        let id = req.id;
        let slot = self.reqs.insert(req);
        self.parked.insert(id, slot);
        Ok(Reserved { request: id, reused_tokens: reused })
    }

    /// Decode worker: the KV of a reserved request has arrived; it joins the waiting queue, at
    /// its place in arrival order, with its prompt computed.
    pub fn activate(&mut self, id: u64) {
        let slot = self.parked.remove(&id).expect("activating a reserved request");
        let req = &self.reqs[slot];
        debug_assert_eq!(req.state.status, Status::Reserved);
        let (before, prompt_len, order) = (req.computed, req.prompt_len, req.state.order);
        if self.cfg.enable_prefix_caching {
            self.publish_computed_blocks(slot, before, prompt_len);
        }
        let req = &mut self.reqs[slot];
        req.computed = prompt_len;
        req.state.status = Status::Waiting;
        let at = self.waiting.iter().position(|&s| self.reqs[s].state.order > order).unwrap_or(self.waiting.len());
        self.waiting.insert(at, slot);
    }

    /// Prefill worker: the decode side has the KV of finished request `id`; free it.
    pub fn release_held(&mut self, id: u64) {
        let slot = self.parked.remove(&id).expect("releasing a held request");
        self.state_release(slot, false);
        let req = self.reqs.remove(slot);
        debug_assert_eq!(req.state.status, Status::Held);
        self.pool.release_lease(&req.blocks);
        self.destinations.bump();
    }

    /// The waiting request considered next: the head, or, while destinations wait for blocks
    /// (decode worker), the first request whose KV has arrived — a request that would need
    /// fresh blocks for a prefill does not compete with them.
    pub(super) fn next_admission(&self) -> Option<u32> {
        if self.destinations.is_empty() && self.late_from.is_none() {
            return self.waiting.front().copied();
        }
        self.waiting
            .iter()
            .copied()
            .find(|&s| self.schedulable(s) && (self.destinations.is_empty() || self.prompt_in_place(&self.reqs[s])))
    }

    /// Whether this pass may schedule `slot`. With vLLM's async scheduling (on by default
    /// since vLLM 0.14) the engine schedules pass k+1 as soon as pass k is launched, so a
    /// request that arrives while pass k runs is first scheduled into pass k+2 — unless pass k
    /// left nothing to run, and the engine waited for it.
    pub(super) fn schedulable(&self, slot: u32) -> bool {
        self.late_from.is_none_or(|late| self.reqs[slot].state.submitted_after < late)
    }

    /// Whether a request's prompt is computed and in its blocks (a transferred prompt that
    /// arrived, not yet preempted).
    pub(super) fn prompt_in_place(&self, req: &Req) -> bool {
        req.computed >= req.prompt_len && req.blocks.len() as u32 * self.cfg.block_size >= req.prompt_len
    }
}
