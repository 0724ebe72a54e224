//! Fast-forward: how far a worker can run decode passes ahead, and starting and applying
//! such a stretch.

use super::*;

impl Simulation<'_, '_> {
    /// Until when worker `w` of `pool` can run ahead without missing new work; None if it
    /// cannot run ahead at all.
    pub(super) fn fast_forward_horizon(&self, pool: usize) -> Option<f64> {
        let p = &self.pools[pool];
        if !self.config.fast_forward
            || p.spec.role != Role::Aggregated
            || p.spec.dp() != 1
            || self.config.kv_event_lag_ms > 0.0
            // Frontend stages settle their progress at every pass end, as the reference does.
            || !self.config.frontend_stages.is_empty()
            // Dynamo-shaped samples read the KV gauges exactly, which a stretch would skew.
            || self.collector.telemetry.as_ref().is_some_and(|t| t.dynamo)
        {
            return None;
        }
        let release = self.next_release_ms().unwrap_or(f64::INFINITY);
        if self.only_releases_bound_stretches() {
            return Some(release);
        }
        let event = self.events.peek().map_or(f64::INFINITY, |Reverse((t, _, _))| t.0);
        Some(release.min(event))
    }

    /// Whether stretches are committed lazily and cut short when work reaches their worker.
    ///
    /// With closed-loop turns (or agentic dependencies), a request ending on one worker can
    /// release work for any other, so a stretch planned up front would have to end before any
    /// other worker's next pass end, which in a busy cluster is about one pass. Instead the
    /// stretch runs to the next known release, its passes stay uncommitted, and when work is
    /// placed on its worker mid-stretch [`Simulation::settle_stretch`] keeps only the passes
    /// that started before that instant, as stepping pass by pass would have. Nothing else
    /// reads a worker's engine mid-pass, except telemetry samples and the autoscaler, which
    /// keep the planned-up-front stretches.
    pub(super) fn lazy_stretches(&self) -> bool {
        !self.work_only_at_releases && self.scaling.is_none() && self.collector.telemetry.is_none()
    }

    /// Whether a stretch need only end before the next release (not before other workers'
    /// pass ends): only releases bring work, or stretches are cut when work reaches them.
    pub(super) fn only_releases_bound_stretches(&self) -> bool {
        self.work_only_at_releases || self.lazy_stretches()
    }

    /// Before work reaches worker `w` of `pool` at this instant: if it runs an uncommitted
    /// stretch, the passes that started before now are committed and the rest dropped. The
    /// pass in flight then ends the worker's pass; if it ends now, it is applied now, as its
    /// `PassEnd` would have been before the arrivals of this instant.
    pub(super) fn settle_stretch(&mut self, pool: usize, w: usize) {
        let now = self.now;
        let worker = &mut self.pools[pool].workers[w];
        if !std::mem::take(&mut worker.stretch_pending) {
            return;
        }
        let stretch = worker.stretch.as_mut().expect("a pending stretch is in flight");
        // Pass j starts when pass j-1 ends. A pass ending now was followed by the next one
        // once this instant's passes have started (work placed by a zero-time pass of another
        // worker comes after that).
        let started = self.passes_started_ms == now;
        let keep = 1 + stretch.ends.iter().take_while(|&&end| end < now || (started && end == now)).count();
        let keep = keep.min(stretch.ends.len());
        worker.ranks[0].engine.commit_stretch(keep as u32);
        if keep == stretch.ends.len() {
            return;
        }
        stretch.ends.truncate(keep);
        let end = stretch.ends[keep - 1];
        worker.pass_end = end;
        if end > now {
            self.schedule_pass_end(pool, w, end);
            return;
        }
        worker.busy = false;
        worker.pass_seq = u64::MAX;
        let stretch = worker.stretch.take().expect("checked above");
        self.apply_stretch(stretch);
        self.wake(pool, w);
    }

    /// Plans a stretch of decode passes for an idle single-rank worker, if it can run one.
    pub(super) fn plan_stretch(&mut self, pool: usize, w: usize) -> Option<Stretch> {
        let horizon = self.fast_forward_horizon(pool)?;
        let mut stretch = std::mem::take(&mut self.spare_stretch);
        if self.pools[pool].workers[w].ranks[0].engine.plan_stretch(self.now, horizon, &mut stretch) {
            Some(stretch)
        } else {
            self.spare_stretch = stretch;
            None
        }
    }

    /// Starts a planned stretch, cut at the horizon as it stands now (other workers' passes
    /// may have moved it closer), or a single normal pass if too little of it remains.
    pub(super) fn start_stretch(&mut self, pool: usize, w: usize, mut stretch: Stretch, others: f64) {
        let now = self.now;
        let horizon = self.fast_forward_horizon(pool).expect("the pool fast-forwards").min(others);
        // Pass j starts when pass j-1 ends; every pass must start before the horizon.
        let keep = 1 + stretch.ends.iter().take_while(|&&end| end < horizon).count();
        stretch.ends.truncate(keep.min(stretch.ends.len()));
        let worker = &mut self.pools[pool].workers[w];
        if stretch.ends.len() < 2 {
            // The first planned pass is exactly this step, and it takes time.
            self.spare_stretch = stretch;
            let rank = &mut worker.ranks[0];
            rank.engine.step(now, &mut rank.output);
            rank.ran = true;
            let end = rank.output.end_ms;
            debug_assert!(end > now);
            worker.busy = true;
            worker.pass_end = end;
            self.schedule_pass_end(pool, w, end);
            return;
        }
        let lazy = self.lazy_stretches();
        let worker = &mut self.pools[pool].workers[w];
        if lazy {
            worker.stretch_pending = true;
        } else {
            worker.ranks[0].engine.commit_stretch(stretch.ends.len() as u32);
        }
        if let Some(t) = self.collector.telemetry.as_mut() {
            t.stretch(pool, w, now, &stretch.ends, stretch.requests.len());
        }
        let end = *stretch.ends.last().expect("a stretch has passes");
        worker.busy = true;
        worker.pass_end = end;
        worker.stretch = Some(stretch);
        self.schedule_pass_end(pool, w, end);
    }

    /// Records the tokens of a fast-forwarded stretch, pass by pass as single steps would.
    pub(super) fn apply_stretch(&mut self, stretch: Stretch) {
        self.collector.stretch_tokens(&stretch.requests, &stretch.ends);
        let tokens = (stretch.ends.len() * stretch.requests.len()) as u64;
        self.collector.count_decode(tokens, tokens);
        self.collector.totals.stretched_passes += stretch.ends.len() as u64;
        self.spare_stretch = stretch;
    }
}
