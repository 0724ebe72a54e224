//! Disaggregated serving in the SGLang core. A *prefill* worker keeps a finished request and its
//! pages until [`SglangEngine::release_held`]. A *decode* worker accepts prompts computed
//! elsewhere, reserves their pages oldest first (matching and locking any cached prefix) and,
//! once the KV lands, lets them join the running batch without a prefill.

use super::radix::{self, ROOT};
use super::SglangEngine;
use crate::handoff::Reserved;
use crate::output::RejectReason;
use crate::request::EngineRequest;

impl SglangEngine {
    /// Decode worker: accepts a request whose prompt is computed elsewhere; it waits for its
    /// pages in [`SglangEngine::retry_destination`]. Refused if it can never fit.
    pub fn accept_destination(&mut self, request: EngineRequest) -> Result<(), RejectReason> {
        let pages = request.prompt.len().div_ceil(self.page);
        self.destinations.accept(request, pages, &self.cfg)
    }

    /// Decode worker: tries to reserve pages for the oldest accepted request, if an attempt is
    /// due (see [`crate::handoff`]).
    pub fn retry_destination(&mut self) -> Option<Reserved> {
        self.destinations.due()?;
        let request = self.destinations.pop();
        let outcome = self.reserve(request);
        self.destinations.settle(outcome)
    }

    /// Reserves pages for a prompt computed elsewhere (its cached prefix is matched and locked
    /// first, as SGLang does even when the rest does not fit). Returns the reservation, or the
    /// request back if the pages are not available now.
    fn reserve(&mut self, request: EngineRequest) -> Result<Reserved, EngineRequest> {
        let page = self.page;
        let prompt_pages = request.prompt.len().div_ceil(page);
        let id = request.id;
        let slot = self.reqs.insert(self.sequence(request.clone()));
        let m = if self.cfg.enable_prefix_caching {
            self.fill_keys(slot, usize::MAX);
            let state = &mut self.reqs[slot].state;
            let keys = std::mem::take(&mut state.keys);
            let key_pages = std::mem::take(&mut state.key_pages);
            self.tree.match_and_lock(&keys, key_pages)
        } else {
            radix::Match { pages: 0, node: ROOT }
        };
        let hit = m.pages;
        let need = prompt_pages - hit as u32;
        if need as u64 * page as u64 > self.reservable_tokens() {
            self.tree.unlock(m.node);
            self.reqs.remove(slot);
            return Err(request);
        }
        let room = self.make_room(need);
        debug_assert!(room, "room was checked");
        let req = &mut self.reqs[slot];
        req.state.tree_pages = hit;
        req.state.lock_node = m.node;
        self.pool.alloc(need);
        req.state.pages = (hit as u32) + need;
        req.transferred = true;
        self.parked.insert(id, slot);
        Ok(Reserved { request: id, reused_tokens: hit as u32 * page })
    }

    /// Decode worker: the KV of a reserved request arrived.
    pub fn activate(&mut self, id: u64) {
        let slot = self.parked.remove(&id).expect("activating a reserved request");
        let req = &mut self.reqs[slot];
        req.computed = req.prompt_len;
        let full = (req.prompt_len / self.page) as usize;
        let available_before = self.pool.available();
        self.cache_pages(slot, full);
        self.arrived.push_back(slot);
        // Pages another request had already cached are shared, and this request's copies go
        // back to the pool: that is new capacity, so the waiting destination head may try
        // again now (the reference bumps its capacity generation on `ActivateDestination`
        // when the available tokens grew: scheduler/sglang/core.rs).
        if self.pool.available() > available_before {
            self.destinations.bump();
        }
    }

    /// Prefill worker: the decode side has the KV of `id`; its pages join the cache and the
    /// rest are freed.
    pub fn release_held(&mut self, id: u64) {
        let slot = self.parked.remove(&id).expect("releasing a held request");
        self.retire(slot);
        self.destinations.bump();
    }
}
