//! Arrivals and departures: releasing a ready turn as a request, routing and placing it on a
//! worker, the router's lifecycle edges, and finishing a request (telling the load driver,
//! which may make the session's next turn ready).

use super::*;
use servesim_engine::Prompt;

impl Simulation<'_, '_> {
    /// Disaggregated: tells the load driver about the requests that ended at this instant, now
    /// that the workers idle at it have started their passes. Dynamo's disaggregated replay
    /// does so (pinned by the parity case `x_disagg_followup_misses_passes`): a follow-up turn
    /// ready at once is released at this instant but waits for the next pass of a busy
    /// prefill worker. Returns whether a turn became ready now; it is released at the next
    /// iteration.
    pub(super) fn tell_ended_sessions(&mut self) -> bool {
        if self.ended.is_empty() {
            return false;
        }
        for (session, completed) in std::mem::take(&mut self.ended) {
            self.driver.on_complete(session, self.now, completed);
        }
        self.next_release_ms().is_some_and(|t| t <= self.now)
    }

    /// A turn becomes a request: registered, hashed, and placed (or, disaggregated, started on
    /// its handoff).
    /// `prompt` is the one drawn when a frontend stage took the turn in (drawing it again would
    /// grow an accumulating session's history twice); `encoded`: that stage was the native
    /// encoder pool, whose images all landed now.
    pub(super) fn release(&mut self, r: &Ready, prompt: Option<Prompt>, encoded: bool) {
        if let Some(shard) = self.shard {
            let pool = &mut self.pools[0];
            let target = pool.placer.peek_round_robin().expect("only round-robin runs split");
            if target / pool.spec.dp() % shard.count != shard.index {
                pool.placer.skip_round_robin();
                self.collector.skip_arrival();
                // Another shard serves it; here its (single-turn) session is over.
                self.driver.on_complete(r.session, self.now, true);
                return;
            }
        }
        if let Some(s) = self.scaling.as_mut() {
            s.arrival();
        }
        // A prompt drawn by the tokenization stage: the request leaves the frontend now.
        let tokenized_at = (prompt.is_some() && !encoded).then_some(self.now);
        let prompt = prompt.unwrap_or_else(|| self.driver.prompt(r));
        let planned_output = self.driver.planned_output(r);
        let session = self.driver.session(r.session);
        let turn = &session.turns[r.turn as usize];
        let id = self.collector.arrive(
            session.name.clone(),
            r.turn,
            r.arrival_ms,
            prompt.len(),
            turn.output_length,
            turn.meta.clone(),
        );
        if let Some(at) = tokenized_at {
            self.collector.tokenized(id, at);
        }
        if encoded {
            self.collector.encoded(id, self.now);
        }
        // The KV router places by block hashes; engines hash what they need themselves.
        let hashes = if self.pools.iter().any(|p| p.placer.is_kv()) {
            prompt.block_hashes(self.config.topology.block_size())
        } else {
            Default::default()
        };
        let flight = Flight {
            hashes,
            planned_output,
            priority: turn.priority,
            strict_priority: turn.strict_priority,
            policy_class: turn.meta.as_ref().and_then(|m| m.policy_class.clone()),
            ..Flight::new(
                id,
                prompt,
                turn.output_length,
                r.arrival_ms,
                self.config.seed,
                &self.config.topology,
                r.session,
            )
        };
        self.flights.insert(id, flight);
        match self.flights.get_mut(&id).and_then(|f| f.handoff.as_mut()).map(Handoff::start) {
            // Dynamo's disaggregated replay queues a new request's hand-off actions and runs
            // them at its next round at this instant: after the prefill workers idle now have
            // started their passes and after the planner's tick (a worker it drains now gets
            // none of the requests arriving now).
            Some(step) => self.unplaced.push((id, step)),
            None => self.route(0, id),
        }
    }

    /// Asks pool `pool`'s placer for a target for request `id` (or leaves it in the router
    /// queue).
    pub(super) fn route(&mut self, pool: usize, id: u64) {
        let now = self.now;
        let flight = &self.flights[&id];
        match self.pools[pool].placer.route(flight.route_request(), now) {
            Routed::Placed(p) => self.place(pool, p),
            Routed::Queued => {}
            Routed::Rejected(why) => {
                self.rejected.get_or_insert(why.to_string());
            }
        }
    }

    /// Hands a placed request to its worker.
    fn place(&mut self, pool: usize, p: Placement) {
        let role = self.pools[pool].spec.role;
        let bs = self.pools[pool].spec.engine.block_size;
        let dp = self.pools[pool].spec.dp();
        let flight = self.flights.get_mut(&p.id).expect("placed request is in flight");
        let overlap_tokens = (p.overlap_blocks * bs).min(flight.prompt.len());
        // The planner's prefix-hit observation: router admissions with at least one block.
        let isl_blocks = flight.hashes.len();
        if let (Some(s), true) = (self.scaling.as_mut(), self.pools[pool].placer.is_kv() && isl_blocks > 0) {
            s.hit_rate(p.overlap_blocks as f64 / isl_blocks as f64);
        }
        // Dynamo's replay counts the router's hit rate where the prompt is computed (not the
        // decode pool's placement).
        let prompt_pool = self.pools[pool].spec.role != Role::Decode;
        if let (Some(t), true) =
            (self.collector.telemetry.as_mut(), prompt_pool && self.pools[pool].placer.is_kv() && isl_blocks > 0)
        {
            t.traffic.add_router_hit(p.overlap_blocks as f64 / isl_blocks as f64);
        }
        let overlap_blocks = p.best_overlap_blocks.map(|best| (p.overlap_blocks, best));
        let (worker, rank) = (p.target / dp, p.target % dp);
        self.collector.placed(
            p.id,
            role,
            worker,
            rank,
            p.target,
            overlap_tokens,
            overlap_blocks,
            p.queued_at_ms,
            self.now,
        );
        match role {
            Role::Aggregated | Role::Prefill => flight.prefill_target = Some(p.target),
            Role::Decode => flight.decode_target = Some(p.target),
        }
        let request = flight.engine_request(role);
        if role != Role::Decode && self.has_frontend(pool) {
            // SGLang's frontend stages come between the router and the scheduler (the host
            // loop's settings allow one rank a worker).
            self.enter_frontend(p.target / dp, p.id, request);
            return;
        }
        self.settle_stretch(pool, p.target / dp);
        self.wake(pool, p.target / dp);
        let worker = &mut self.pools[pool].workers[p.target / dp];
        if role != Role::Decode {
            worker.ranks[p.target % dp].engine.submit(request);
            return;
        }
        // The request waits on the decode worker for its blocks; an idle worker tries at once, a
        // busy one when its pass ends.
        match worker.ranks[p.target % dp].engine.accept_destination(request) {
            Err(reason) => self.handoff(p.id, Fact::DestinationRefused(reason)),
            Ok(()) if !worker.busy => {
                self.retry_destination(pool, p.target);
            }
            Ok(()) => {}
        }
    }

    /// A request left the system: metrics, load driver.
    pub(super) fn finish(&mut self, id: u64, finish: Finish) {
        if finish == Finish::Rejected(RejectReason::ExceedsBatchBudget) {
            self.unschedulable.get_or_insert(id);
        }
        self.record_finish(id, finish == Finish::Completed);
        let flight = self.flights.remove(&id).expect("finished request is in flight");
        self.collector.finish(id, self.now, finish);
        if self.transfer.is_some() {
            self.ended.push((flight.extra, finish == Finish::Completed));
        } else {
            self.driver.on_complete(flight.extra, self.now, finish == Finish::Completed);
        }
        self.finished += 1;
    }

    /// Router lifecycle edges; requests the router releases from its queue are placed now.
    pub(super) fn router_edge(&mut self, pool: usize, edge: Edge) {
        let placer = &mut self.pools[pool].placer;
        if !placer.is_kv() {
            return;
        }
        let released = placer.edge(edge, self.now);
        for p in released {
            self.place(pool, p);
        }
    }
}
