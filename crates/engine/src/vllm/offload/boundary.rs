//! The scheduler's hooks across a pass: completions at its start, allocation fences and
//! first-admission attribution during it, stores prepared after the scheduling loop and put on
//! the D2H lane at the transfer boundary (the pass end, or the attention-DP group's), and a
//! request's abort cancelling its load.

use super::*;

impl VllmEngine {
    /// Pass start: completions due by now (an idle rank's were applied when it woke).
    pub(in crate::vllm) fn host_pass_start(&mut self, now_ms: f64) {
        if let Some(g3) = self.host.as_mut().and_then(|h| h.g3.as_mut()) {
            g3.epoch_at_pass_start = g3.epoch;
        }
        if self.host.is_some() {
            self.advance_transfers(now_ms);
            self.host.as_mut().unwrap().scheduled.clear();
        }
    }

    /// After an allocation of `fresh` new blocks for `slot`: fence on capacity whose copy to
    /// the host is still running, and note the request as scheduled in this pass.
    pub(in crate::vllm) fn host_allocated(&mut self, slot: u32, fresh: u32) {
        let Some(h) = self.host.as_mut() else { return };
        h.scheduled.insert(slot);
        let blocks = &self.reqs[slot].blocks;
        for &b in &blocks[blocks.len() - fresh as usize..] {
            if let Some(t) = h.pending_dep(b) {
                h.compute_not_before = h.compute_not_before.max(t);
            }
        }
    }

    /// A preempted request's stores are flushed before its blocks are freed.
    pub(in crate::vllm) fn host_preempted(&mut self, id: u64) {
        let Some(h) = self.host.as_mut() else { return };
        if let Some(r) = h.reqs.get_mut(&id) {
            r.restore.rounds = 0;
        }
        if let Some(t) = h.reqs.get(&id).and_then(|r| r.latest_store).and_then(|t| h.completes_at(t)) {
            h.compute_not_before = h.compute_not_before.max(t);
        }
    }

    /// A newly admitted request: the store cursor jumps past a loaded prefix; the first
    /// admission says where its reused tokens came from.
    pub(in crate::vllm) fn host_admitted(&mut self, slot: u32, reused: u32) -> Option<CacheTiers> {
        let bs = self.cfg.block_size;
        let h = self.host.as_mut()?;
        let req = &self.reqs[slot];
        let hreq = h.req(req, bs);
        hreq.restore.rounds = 0;
        let tiers = match hreq.load.take() {
            Some(Load::Activated { original_g1_tokens, .. }) => {
                let g1 = original_g1_tokens.min(reused);
                hreq.next_store = (reused / bs) as usize;
                (g1, reused - g1)
            }
            Some(Load::Loading { .. }) => panic!("a loading request cannot be admitted"),
            None => (reused, 0),
        };
        if hreq.first_admission_recorded {
            return None;
        }
        hreq.first_admission_recorded = true;
        h.host_hit_tokens += tiers.1 as u64;
        Some(tiers)
    }

    /// After the scheduling loop: prepare the write-through stores of the scheduled running
    /// requests, in running order. Returns when the pass's compute may start.
    pub(in crate::vllm) fn host_after_scheduling(&mut self, now_ms: f64) -> f64 {
        let Some(h) = self.host.as_mut() else { return now_ms };
        let bs = self.cfg.block_size;
        for &slot in &self.running {
            if !h.scheduled.contains(&slot) {
                continue;
            }
            let req = &self.reqs[slot];
            let hreq = h.req(req, bs);
            let end = ((req.computed.min(req.prompt_len) / bs) as usize).min(hreq.keys.len());
            let start = hreq.next_store;
            if end <= start {
                continue;
            }
            let keys = hreq.keys[start..end].to_vec();
            let tier = h.tier();
            let missing: Vec<usize> = (start..end).filter(|&i| tier.lookup(keys[i - start]) == Lookup::Miss).collect();
            drop(tier);
            if missing.is_empty() {
                h.reqs.get_mut(&req.id).unwrap().next_store = end;
                continue;
            }
            // The sources must be settled device blocks: none still being copied itself.
            if missing.iter().any(|&i| i >= req.blocks.len() || h.source_pending(req.blocks[i])) {
                continue;
            }
            let client = h.client();
            let outcome = h.tier().prepare_store(client, req.id, &keys, now_ms);
            match outcome {
                StoreOutcome::AlreadyPresent => h.reqs.get_mut(&req.id).unwrap().next_store = end,
                StoreOutcome::RetryCapacity { .. } => {}
                StoreOutcome::Prepared { transfer, .. } => {
                    let sources: Vec<u32> = missing.iter().map(|&i| req.blocks[i]).collect();
                    for &s in &sources {
                        h.slot_deps.insert(s, transfer);
                    }
                    if h.is_shared() {
                        // Like Mooncake Store and LMCache, a store into a shared pool keeps its
                        // device sources until the copy completes, instead of fencing their
                        // next owner (its completion time is not known when it starts).
                        self.pool.hold(&sources);
                    }
                    h.deps_by_transfer.insert(transfer, sources);
                    let hreq = h.reqs.get_mut(&req.id).unwrap();
                    hreq.latest_store = Some(transfer);
                    hreq.next_store = end;
                    let all = hreq.keys.clone();
                    h.tier().touch_prompt(&all);
                }
            }
        }
        h.compute_not_before.max(now_ms)
    }

    /// The end of a pass: finished requests leave the connector; a rank that is a worker of
    /// its own reaches its transfer boundary at `end_ms` now, a rank of an attention-DP group
    /// when the group's pass ends ([`VllmEngine::finish_group_pass`]).
    pub(in crate::vllm) fn host_boundary(&mut self, end_ms: f64, out: &PassOutput) {
        let Some(h) = self.host.as_mut() else { return };
        for f in &out.finished {
            h.reqs.remove(&f.request);
        }
        if let Some(g3) = h.g3.as_mut() {
            if !h.scheduled.is_empty() || !out.tokens.is_empty() {
                g3.rank_progress += 1;
            }
        }
        if self.group_ranks <= 1 && !self.defers_transfer_boundary() {
            self.transfer_boundary(end_ms);
        }
    }

    /// The transfer boundary at `end_ms`: completions due, the pass's stores on the D2H lane,
    /// completions again (zero-time stores land now).
    fn transfer_boundary(&mut self, end_ms: f64) {
        self.advance_transfers(end_ms);
        let h = self.host.as_ref().unwrap();
        h.tier().submit_prepared(h.client(), end_ms);
        self.advance_transfers(end_ms);
    }

    /// The shared pass of this rank's attention-DP group ends at `end_ms` (the slowest rank's
    /// end): every rank, whether it stepped or idled, reaches its transfer boundary then, as
    /// Dynamo 1.6.1 completes each rank at the group's barrier. KV events of loads that complete
    /// go to `out`.
    pub fn finish_group_pass(&mut self, end_ms: f64, out: &mut PassOutput) {
        if self.host.is_none() || (self.group_ranks <= 1 && !self.defers_transfer_boundary()) {
            return;
        }
        self.transfer_boundary(end_ms);
        self.drain_kv_events(out);
    }

    /// A request leaves the engine (abort): its queued load is cancelled.
    pub(in crate::vllm) fn host_abort(&mut self, slot: u32) {
        let Some(h) = self.host.as_mut() else { return };
        h.leave_connector(slot);
        let id = self.reqs[slot].id;
        if let Some(mut hreq) = h.reqs.remove(&id) {
            if let Some(Load::Loading { transfer, keys, reserved, .. }) = hreq.load.take() {
                for k in &keys {
                    h.load_by_key.remove(k);
                }
                let client = h.client();
                h.tier().cancel_load(client, transfer, 0.0);
                h.sleeping.clear();
                self.pool.release_lease(&reserved);
            }
        }
    }
}
