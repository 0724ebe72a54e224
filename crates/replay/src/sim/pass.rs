//! Passes: starting one on every idle worker that has work (or a fast-forwarded stretch),
//! folding a finished pass's results into the metrics, the routers and the handoff, and the
//! host-cache timing between passes (G3 ticks, deferred transfer boundaries of a shared pool,
//! host wakes of idle workers).

use super::*;

impl Simulation<'_, '_> {
    /// Dynamo 1.6.1 keeps one G3 registry per deployment: with scope `worker_local` each worker
    /// has its own pool of blocks and its own rates, but a completion anywhere bumps one epoch,
    /// and a worker that has not seen the latest epoch wakes its requests waiting on a transfer
    /// at its next advance (an idle worker at once). Called before worker `w` advances its
    /// transfers at `now`.
    pub(super) fn g3_observe(&mut self, pool: usize, w: usize, now: f64) -> bool {
        if !self.pools[pool].g3_coupled {
            return false;
        }
        let total: u64 = self.pools[pool]
            .workers
            .iter_mut()
            .flat_map(|worker| worker.ranks.iter_mut())
            .filter_map(|rank| rank.engine.g3_sync(now))
            .sum();
        let worker = &mut self.pools[pool].workers[w];
        if worker.g3_seen == total {
            return false;
        }
        worker.g3_seen = total;
        for rank in &mut worker.ranks {
            rank.engine.note_g3_deployment_progress();
        }
        true
    }

    /// Schedules the next G3 event of a coupled pool (idle workers observe it then).
    pub(super) fn schedule_g3_ticks(&mut self) {
        let now = self.now;
        let mut ticks = Vec::new();
        for (p, pool) in self.pools.iter().enumerate() {
            if !pool.g3_coupled {
                continue;
            }
            let next = pool
                .workers
                .iter()
                .flat_map(|worker| worker.ranks.iter())
                .filter_map(|rank| rank.engine.g3_next_event_after(now))
                .min_by(f64::total_cmp);
            if let Some(at) = next {
                ticks.push((p, at));
            }
        }
        for (p, at) in ticks {
            if self.g3_ticks.insert((p, Time(at))) {
                self.schedule(at, Event::G3Tick { pool: p as u8 });
            }
        }
    }

    /// A G3 event of the pool: every idle worker that has not seen a completion advances.
    pub(super) fn g3_tick(&mut self, pool: usize) {
        let now = self.now;
        self.g3_ticks.retain(|&(p, Time(at))| p != pool || at > now);
        for w in 0..self.pools[pool].workers.len() {
            if self.pools[pool].workers[w].busy || !self.g3_observe(pool, w, now) {
                continue;
            }
            self.advance_transfers(pool, w);
            self.wake(pool, w);
        }
    }

    /// The end of worker `w`'s pass whose transfer boundary was deferred (a shared pool):
    /// every rank reaches it now, after the passes that ended earlier elsewhere.
    pub(super) fn settle_boundary(&mut self, pool: usize, w: usize) {
        let worker = &mut self.pools[pool].workers[w];
        if !std::mem::take(&mut worker.boundary_pending) {
            return;
        }
        let end = self.now;
        for rank in &mut worker.ranks {
            rank.engine.finish_group_pass(end, &mut rank.output);
        }
    }

    /// A shared host pool advances whenever any of its ranks acts, completing the others'
    /// transfers or making them see a peer's: each idle worker of such a pool wakes at its
    /// next deadline as the pool now stands.
    pub(super) fn schedule_shared_host_wakes(&mut self) {
        for p in 0..self.pools.len() {
            if self.pools[p].shared_host.is_none() {
                continue;
            }
            for w in 0..self.pools[p].workers.len() {
                if !self.pools[p].workers[w].busy {
                    self.schedule_host_wake(p, w);
                }
            }
        }
    }

    /// Idle workers of a shared host pool whose next transfer deadline has come advance now,
    /// before any pass starts at this instant: a peer's pass that ended may have moved the pool
    /// (Dynamo settles its idle workers' due transfers right after the pass ends it applies).
    pub(super) fn settle_due_shared_transfers(&mut self) {
        let now = self.now;
        for p in 0..self.pools.len() {
            if self.pools[p].shared_host.is_none() {
                continue;
            }
            for w in 0..self.pools[p].workers.len() {
                let worker = &self.pools[p].workers[w];
                let due = !worker.busy
                    && worker.ranks.iter().filter_map(|r| r.engine.next_transfer_deadline()).any(|at| at <= now);
                if due {
                    self.host_wake(p, w);
                }
            }
        }
    }

    /// Wakes idle worker `w` when its next host transfer completes (the engine has no clock).
    fn schedule_host_wake(&mut self, pool: usize, w: usize) {
        let worker = &self.pools[pool].workers[w];
        let Some(at) = worker.ranks.iter().filter_map(|r| r.engine.next_transfer_deadline()).min_by(f64::total_cmp)
        else {
            return;
        };
        let at = at.max(self.now);
        if worker.host_wake_at.is_some_and(|t| t <= at && t >= self.now) {
            return;
        }
        self.pools[pool].workers[w].host_wake_at = Some(at);
        self.schedule(at, Event::HostWake { pool: pool as u8, worker: w as u32 });
    }

    /// An idle worker's host transfers complete: loads become admissible, deferred requests
    /// wake. A busy worker applies them at its pass boundary instead.
    pub(super) fn host_wake(&mut self, pool: usize, w: usize) {
        let now = self.now;
        let worker = &mut self.pools[pool].workers[w];
        if worker.host_wake_at.is_some_and(|t| t <= now) {
            worker.host_wake_at = None;
        }
        if worker.busy {
            return;
        }
        self.g3_observe(pool, w, now);
        self.advance_transfers(pool, w);
        self.wake(pool, w);
    }

    /// Completes the host transfers due now on every rank of idle worker `w`; the KV events
    /// they cause reach the router at once (Dynamo publishes them when it wakes the rank).
    pub(super) fn advance_transfers(&mut self, pool: usize, w: usize) {
        let dp = self.pools[pool].spec.dp();
        let mut events = PassOutput::default();
        for r in 0..dp {
            self.pools[pool].workers[w].ranks[r].engine.advance_transfers(self.now, &mut events);
            self.publish_kv_events(pool, w * dp + r, &events);
            events.clear();
        }
    }

    /// Starts a pass (or a fast-forwarded stretch) on every idle worker that has work. Returns
    /// whether a pass took no time and created work at this instant.
    pub(super) fn start_passes(&mut self) -> Result<bool, SimError> {
        let now = self.now;
        self.passes_started_ms = now;
        let mut again = false;
        // Workers that could run a stretch of decode passes wait until every other worker has
        // started its pass: work created at this instant must bound their stretches.
        let mut stretches = Vec::new();
        let scaled = self.scaling.is_some();
        let dynamo_gauges = self.collector.telemetry.as_ref().is_some_and(|t| t.dynamo);
        // The awake workers in pool and worker order, as a scan of every worker would visit
        // them; after a pass that did something the scan starts again from the first, as
        // Dynamo's coordinator does, so a worker that pass woke is visited in this call.
        let mut visited: Option<(usize, usize)> = None;
        self.retry_effect_free();
        loop {
            let next = match visited {
                None => self.awake.first().copied(),
                Some(v) => self.awake.range((Excluded(v), Unbounded)).next().copied(),
            };
            let Some((p, w)) = next else { break };
            self.awake.remove(&(p, w));
            visited = Some((p, w));
            {
                let worker = &mut self.pools[p].workers[w];
                if worker.busy || !worker.ranks.iter().any(|r| r.engine.has_work()) {
                    if !worker.busy {
                        self.schedule_host_wake(p, w);
                    }
                    continue;
                }
                if let Some(stretch) = self.plan_stretch(p, w) {
                    stretches.push((p, w, stretch));
                    continue;
                }
                self.g3_observe(p, w, now);
                let worker = &mut self.pools[p].workers[w];
                // Every rank with work starts a pass now; the worker's pass ends when the
                // slowest rank's does, and all its tokens are stamped then.
                let mut end = now;
                let mut effect = false;
                worker.pass_start = now;
                let dp = worker.ranks.len() as u32;
                for rank in &mut worker.ranks {
                    rank.engine.begin_group_pass(worker.wave_step, dp);
                }
                for rank in &mut worker.ranks {
                    rank.ran = rank.engine.has_work();
                    if scaled && !rank.ran {
                        rank.queue = rank.engine.queue_load();
                    }
                    if rank.ran {
                        if dynamo_gauges {
                            let before = sampling::Gauges::of(&rank.engine);
                            rank.engine.step(now, &mut rank.output);
                            rank.before_pass = Some((before, rank.engine.num_running() + rank.engine.num_waiting()));
                        } else {
                            rank.engine.step(now, &mut rank.output);
                        }
                        if scaled {
                            rank.queue = rank.engine.queue_load();
                        }
                        if !rank.output.end_ms.is_finite() {
                            let why = rank.engine.config().timing.error();
                            let why = why.unwrap_or_else(|| "a pass has no finite duration".into());
                            return Err(SimError::Timing { worker: w as u32, at_ms: now, why });
                        }
                        end = end.max(rank.output.end_ms);
                        effect |= !rank.output.is_empty();
                    }
                }
                // With a shared pool (host or G3) the transfer boundary waits for the pass's end
                // in virtual time (see `settle_boundary`); a pass that takes no time reaches it
                // now, as a rank with a private cache does inside its step.
                let defers_boundary = worker.ranks[0].engine.defers_transfer_boundary();
                if defers_boundary && end == now && dp == 1 {
                    let rank = &mut worker.ranks[0];
                    rank.engine.finish_group_pass(end, &mut rank.output);
                    effect |= !rank.output.is_empty();
                }
                let ranks = &worker.ranks;
                let any_prefilled = ranks.iter().any(|r| r.ran && r.engine.prefilled_in_pass());
                let any_ran_model = ranks.iter().any(|r| r.ran && r.engine.ran_model_in_pass());
                let deferred = ranks.iter().any(|r| r.ran && r.engine.deferred_in_pass());
                // A pass that moved only G3 work is retried at this instant, as Dynamo does.
                let g3_retry = end == now && !effect && ranks.iter().any(|r| r.ran && r.engine.g3_retry_now(now));
                let deferred_boundary = end > now && defers_boundary;
                if dp > 1 || deferred_boundary {
                    // Every rank reaches the group's barrier; an idle rank's output carries only
                    // what that boundary produced.
                    for rank in &mut worker.ranks {
                        if !rank.ran {
                            rank.output.clear();
                        }
                        if !deferred_boundary {
                            rank.engine.finish_group_pass(end, &mut rank.output);
                        }
                    }
                }
                worker.boundary_pending = deferred_boundary;
                for rank in &mut worker.ranks {
                    rank.engine.end_group_pass(any_prefilled, any_ran_model);
                }
                worker.wave_step += 1;
                if end > now || effect || deferred || g3_retry {
                    // Dynamo's coordinator scans its ready workers from the first again after
                    // every pass that did something.
                    self.moved_since_retry = true;
                    self.retry_effect_free();
                    visited = None;
                }
                if end > now {
                    let worker = &mut self.pools[p].workers[w];
                    worker.busy = true;
                    worker.pass_end = end;
                    self.schedule_pass_end(p, w, end);
                } else if effect || deferred || g3_retry {
                    // A deferred round of SGLang's prefill/decode interval counts down even when
                    // it does nothing; the next round follows at once.
                    self.apply_pass(p, w);
                    self.wake(p, w);
                    again = true;
                } else if self.pools[p].spec.role == Role::Decode && self.retry_destinations(p, w) {
                    // The empty pass still ends, and its end tries a waiting destination, as
                    // every pass end does; a reservation is progress, so another pass follows
                    // at this instant.
                    self.wake(p, w);
                    again = true;
                } else if self.pools[p].workers[w].ranks.iter().any(|r| r.engine.next_transfer_deadline().is_some()) {
                    // A host transfer the pass started (or waits for) brings the next change.
                    self.schedule_host_wake(p, w);
                    self.effect_free.insert((p, w));
                } else if self.pools[p].shared_host.is_some() || self.pools[p].shared_g3.is_some() {
                    self.effect_free.insert((p, w));
                    // Its requests wait on a shared pool's transfer that another worker has yet
                    // to start or finish (a store prepared in a pass still running, a peer's G3
                    // write): the pool's progress wakes it (`schedule_shared_host_wakes`, the
                    // G3 ticks).
                } else if self.pools[p].spec.role == Role::Aggregated {
                    // Nothing outside an aggregated engine frees its capacity.
                    return Err(SimError::Stalled { worker: w as u32, at_ms: now });
                }
                // Otherwise a disaggregated worker with nothing to do now waits for a hand-off
                // (a source released, a destination activated); it tries again whenever the
                // simulation moves on.
            }
        }
        again |= self.tell_ended_sessions();
        again |= !self.unplaced.is_empty();
        if !self.effect_free.is_empty() && std::mem::take(&mut self.moved_since_retry) {
            // Dynamo's coordinator goes round its instant again after a round that moved
            // anything, and tries its effect-free workers once more then.
            again = true;
        }
        if again {
            // A pass that took no time created work at this instant. It reaches workers at the
            // next iteration, after the ones idle now have started: as pass-by-pass, they start
            // one normal pass now.
            for (p, w, stretch) in stretches {
                self.start_stretch(p, w, stretch, now);
            }
        } else {
            // Unless only releases bound stretches, a stretch must also end before any other
            // worker starting now could finish a pass (and create work for this one).
            let mut first_ends: Vec<f64> = stretches.iter().map(|(_, _, s)| s.ends[0]).collect();
            for (i, (p, w, stretch)) in stretches.into_iter().enumerate() {
                first_ends[i] = f64::INFINITY;
                let others = if self.only_releases_bound_stretches() {
                    f64::INFINITY
                } else {
                    first_ends.iter().copied().fold(f64::INFINITY, f64::min)
                };
                self.start_stretch(p, w, stretch, others);
            }
        }
        Ok(again)
    }

    /// Wakes the workers whose last pass did nothing though they had work: Dynamo's coordinator
    /// tries such a worker again at its next drive (after any pass that did something, at this
    /// instant or a later one), when what the others did may have changed what it finds (a
    /// shared host pool's evictions, a G3 read that clears a promotion's retry guard).
    fn retry_effect_free(&mut self) {
        self.awake.append(&mut self.effect_free);
    }

    /// Folds the results of a worker's last pass (every rank that ran) into the metrics, the
    /// routers and the load driver. Tokens and completions are stamped at the pass end (now).
    pub(super) fn apply_pass(&mut self, pool: usize, w: usize) {
        let dp = self.pools[pool].spec.dp();
        for r in 0..dp {
            let rank = &mut self.pools[pool].workers[w].ranks[r];
            if std::mem::take(&mut rank.ran) {
                let out = std::mem::take(&mut rank.output);
                // A pass that computed tokens is an instant the frontend stages are settled at.
                let staged = !self.config.frontend_stages.is_empty();
                if staged && pool == 0 && (out.prefill_tokens > 0 || out.decode_tokens > 0) {
                    self.stage_ticks.push(w);
                }
                self.apply_rank_pass(pool, w * dp + r, &out);
                self.record_fpm(pool, w, r, Some(&out));
                self.pools[pool].workers[w].ranks[r].output = out;
            } else {
                // An attention-DP rank with nothing to do still takes part in its worker's
                // pass, and the planner sees an empty pass of it. Host loads that completed at
                // the group's barrier publish their blocks.
                let events = std::mem::take(&mut self.pools[pool].workers[w].ranks[r].output);
                self.publish_kv_events(pool, w * dp + r, &events);
                self.pools[pool].workers[w].ranks[r].output = events;
                self.record_fpm(pool, w, r, None);
            }
        }
        // A decode worker tries its oldest waiting destination at the end of every pass; then
        // the commands that waited for the pass to end are applied.
        if self.pools[pool].spec.role == Role::Decode {
            self.retry_destinations(pool, w);
        }
        for (id, r) in std::mem::take(&mut self.pools[pool].workers[w].pending_releases) {
            self.pools[pool].workers[w].ranks[r].engine.release_held(id);
        }
        for (id, t) in std::mem::take(&mut self.pools[pool].workers[w].pending_activations) {
            self.activate(t, id);
        }
        self.pools[pool].workers[w].reset_wave_if_drained();
        if self.scaling.is_some() {
            self.retire_if_drained(pool, w);
        }
    }

    /// A rank's KV events reach the router now, or after the configured lag.
    /// Hands the KV events of a rank's pass (device and host tiers) to its pool's router, now
    /// or after the configured lag.
    fn publish_kv_events(&mut self, pool: usize, target: usize, out: &PassOutput) {
        let (events, host) = (&out.kv_events, &out.host_kv_events);
        if events.is_empty() && host.is_empty() {
            return;
        }
        if self.config.kv_event_lag_ms > 0.0 {
            let batch = self.seq;
            self.lagged.insert(batch, (pool, target, events.clone(), host.clone()));
            self.schedule(self.now + self.config.kv_event_lag_ms, Event::KvVisible { batch });
        } else {
            let placer = &mut self.pools[pool].placer;
            placer.kv_events(target, events);
            placer.host_kv_events(target, host);
        }
    }

    fn apply_rank_pass(&mut self, pool: usize, target: usize, out: &PassOutput) {
        let role = self.pools[pool].spec.role;
        let now = self.now;
        self.publish_kv_events(pool, target, out);
        for &id in &out.received {
            self.collector.received(id, out.start_ms);
        }
        // SGLang's host loop admits a request when it forms the batch, while the pass before runs.
        let admitted_at = out.formed_ms.unwrap_or(out.start_ms);
        for a in &out.admissions {
            if role == Role::Decode {
                self.collector.decode_admit(a.request, admitted_at, a.reused_tokens);
            } else {
                self.collector.admit(a.request, admitted_at, a.reused_tokens);
            }
            if let Some(tiers) = a.tiers {
                self.collector.admit_tiers(a.request, tiers);
            }
        }
        // The router's edges (servesim_cluster::edges), each acted on as it comes.
        let edges = PassEdges::of(role, self.pools[pool].placer.is_kv(), out);
        for (i, t) in out.tokens.iter().enumerate() {
            if let Some(edge) = edges.at_token(i, t.request, || self.collector.token(t.request, now)) {
                self.router_edge(pool, edge);
            }
        }
        self.collector.count_pass(out, role != Role::Prefill);
        if let Some(t) = self.collector.telemetry.as_mut() {
            t.pass(pool, target, out, role != Role::Prefill);
        }
        for f in &out.finished {
            if let Some(edge) = edges.at_finish(f) {
                self.router_edge(pool, edge);
            }
            match (role, f.finish) {
                (Role::Prefill, Finish::Completed) => {
                    // The prompt is done: its KV moves once a decode worker has room for it.
                    self.collector.source_held(f.request, now);
                    self.handoff(f.request, Fact::SourceHeld);
                }
                (Role::Prefill, Finish::Rejected(reason)) => self.handoff(f.request, Fact::SourceRefused(reason)),
                _ => self.finish(f.request, f.finish),
            }
        }
    }
}
