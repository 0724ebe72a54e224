//! The waiting loop with a host cache: admitting waiting requests against the headroom that
//! running prefills and loads still reserve, parking those that wait on a transfer in the
//! connector queue, and rejecting what can never fit.

use super::*;

impl VllmEngine {
    /// Blocks this request still reserves as headroom in the pass: the rest of a running
    /// chunked prefill, or the unreserved tail of a load.
    fn host_reservation(&self, slot: u32) -> u32 {
        let bs = self.cfg.block_size;
        let req = &self.reqs[slot];
        let running = if req.state.status == Status::Running && req.computed < req.prompt_len {
            req.len().div_ceil(bs).saturating_sub(req.blocks.len() as u32)
        } else {
            0
        };
        let tail = self.host.as_ref().unwrap().reqs.get(&req.id).map_or(0, HostReq::unreserved_tail_blocks);
        running + tail
    }

    /// The waiting loop with a host cache (`admit_waiting` otherwise).
    pub(in crate::vllm) fn admit_waiting_host(&mut self, now_ms: f64, out: &mut PassOutput) {
        let bs = self.cfg.block_size;
        let max_seqs = self.cfg.max_num_seqs.map_or(usize::MAX, |m| m as usize);
        let mut retry = Vec::new();
        let mut headroom: u32 = self.running.iter().map(|&s| self.host_reservation(s)).sum::<u32>()
            + self.host.as_ref().unwrap().reqs.values().map(HostReq::unreserved_tail_blocks).sum::<u32>();
        while !self.preempted_any && self.running.len() < max_seqs && self.budget > 0 {
            let h = self.host.as_ref().unwrap();
            // With G3, a ready connector waiter that holds device blocks (its load is in flight
            // or done) goes first, ahead of older ready waiters.
            let holder = (h.g3.is_some() && h.has_ready_waiter())
                .then(|| {
                    h.queued().find(|s| {
                        !h.sleeping.contains(s)
                            && h.reqs.get(&self.reqs[*s].id).is_some_and(|r| r.reserved_blocks() > 0)
                    })
                })
                .flatten();
            // A decode rank serves the handed-off requests whose KV has arrived first: always
            // while destinations wait for blocks, and, with a host cache, whenever it has any
            // (Dynamo 1.6.1 models vLLM serving requests that received remote KV before the
            // plain waiting queue, so a host load waiting for capacity cannot starve them). Only
            // a decode rank has such requests, or destinations.
            let materialized = (self.cfg.role == Role::Decode)
                .then(|| self.waiting.iter().copied().find(|&s| self.prompt_in_place(&self.reqs[s])))
                .flatten();
            let next = holder.or(if !self.destinations.is_empty() || materialized.is_some() {
                materialized
            } else if h.has_ready_waiter() {
                h.queued().find(|s| !h.sleeping.contains(s))
            } else {
                self.waiting.front().copied()
            });
            let Some(slot) = next else { break };
            let before = self.host_reservation(slot);
            if self.prompt_in_place(&self.reqs[slot]) {
                // Its KV is in its blocks: no lookup, only a running slot (see `admission`).
                let outcome = self.schedule(slot, Some(PrefixCost::default()), out);
                headroom = headroom.saturating_sub(before) + self.host_reservation(slot);
                match outcome {
                    Scheduled::Yes(used) if !(used == 0 && self.budget == 0) => continue,
                    _ => break,
                }
            }
            let req = &self.reqs[slot];
            if self.cfg.max_model_len.is_some_and(|m| req.prompt_len >= m) {
                self.host_reject(slot, RejectReason::ExceedsMaxModelLen, out);
                headroom -= before;
                continue;
            }
            // The device match, frozen to the loaded prefix after a load; then the host.
            let (g1, g1_active) = self.raw_g1(req);
            let (mut cached, mut active) = (g1 * bs, g1_active * bs);
            let hreq = self.host.as_mut().unwrap().req(&self.reqs[slot], bs);
            let reserved_blocks = hreq.reserved_blocks();
            if let Some(Load::Activated { loaded_prefix_blocks, .. }) = hreq.load {
                cached = loaded_prefix_blocks * bs;
                active = cached;
            }
            let hit = match self.host_lookup(slot, cached / bs, cached, now_ms) {
                HostLookup::Miss => None,
                HostLookup::Hit(hit) => Some(hit),
                HostLookup::Deferred => {
                    self.host.as_mut().unwrap().skip(slot, self.reqs[slot].id, &mut self.waiting, None);
                    continue;
                }
            };
            let req = &self.reqs[slot];
            let capacity = self.cfg.num_gpu_blocks;
            let footprint = self.policy.footprint_tokens(req.len(), req.prompt_len, req.max_output).div_ceil(bs);
            if req.state.status == Status::Waiting && self.policy.never_fits(footprint, req.prompt_len, capacity, bs) {
                self.host_reject(slot, RejectReason::ExceedsKvCapacity, out);
                headroom -= before;
                continue;
            }
            if self.policy.recomputes_last_token() && !self.generation_done(req) {
                let max = (req.len().saturating_sub(1) / bs) * bs;
                if cached > max {
                    cached = max;
                    active = active.min(max);
                }
            }
            let cost = PrefixCost { cached_tokens: cached, active_cached_tokens: active, reported: cached };
            if !self.cfg.enable_chunked_prefill {
                let uncached = req.prompt_len - cost.cached_tokens.min(req.prompt_len);
                if uncached > self.cfg.max_num_batched_tokens.unwrap_or(u32::MAX) {
                    self.host_reject(slot, RejectReason::ExceedsBatchBudget, out);
                    headroom -= before;
                    continue;
                }
            }
            let promised =
                self.policy.promised_blocks(bs, self.running.iter().map(|&s| crate::vllm::lifetime(&self.reqs[s])));
            let mut available = (capacity - self.pool.num_active()).saturating_sub(promised);
            if hit.is_some() {
                available = available.saturating_sub(headroom);
            }
            let needed = footprint.saturating_sub((cost.active_cached_tokens / bs).max(reserved_blocks));
            let decision = if needed > available {
                if self.running.is_empty() && self.pool.num_active() == 0 {
                    AdmissionDecision::Reject(RejectReason::ExceedsKvCapacity)
                } else {
                    AdmissionDecision::Wait
                }
            } else {
                AdmissionDecision::Admit(cost)
            };
            let cost = match decision {
                AdmissionDecision::Admit(cost) => cost,
                AdmissionDecision::Wait => break,
                AdmissionDecision::Reject(reason) => {
                    self.host_reject(slot, reason, out);
                    headroom -= before;
                    continue;
                }
            };
            if let Some(hit) = hit {
                match self.start_load(slot, hit, now_ms) {
                    StartLoad::Queued => {
                        headroom = headroom - before + self.host_reservation(slot);
                        self.host.as_mut().unwrap().skip(slot, self.reqs[slot].id, &mut self.waiting, None);
                    }
                    StartLoad::Deferred => {
                        self.host.as_mut().unwrap().skip(slot, self.reqs[slot].id, &mut self.waiting, None)
                    }
                    StartLoad::Retry => {
                        self.host.as_mut().unwrap().skip(slot, self.reqs[slot].id, &mut self.waiting, Some(&mut retry))
                    }
                    StartLoad::CapacityBlocked => break,
                }
                continue;
            }
            // The prefill cadence is checked where local compute would start: host loads above
            // begin on throttled passes too.
            if self.defer_prefills && self.new_tokens(slot, cost) > 1 {
                break;
            }
            let outcome = self.schedule(slot, Some(cost), out);
            headroom = headroom.saturating_sub(before) + self.host_reservation(slot);
            match outcome {
                Scheduled::Yes(used) if !(used == 0 && self.budget == 0) => {}
                _ => break,
            }
        }
        let h = self.host.as_mut().unwrap();
        for slot in retry {
            h.sleeping.remove(&slot);
        }
    }

    fn host_reject(&mut self, slot: u32, reason: RejectReason, out: &mut PassOutput) {
        self.host_abort(slot);
        if let Some(pos) = self.waiting.iter().position(|&s| s == slot) {
            self.waiting.remove(pos);
        }
        let req = self.reqs.remove(slot);
        self.pool.release_lease(&req.blocks);
        out.finished.push(Finished { request: req.id, finish: Finish::Rejected(reason) });
    }
}
