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
            // Dynamo-shaped samples read the KV gauges exactly, which a stretch would skew.
            || self.collector.telemetry.as_ref().is_some_and(|t| t.dynamo)
        {
            return None;
        }
        let release = self.driver.next_ready_ms().unwrap_or(f64::INFINITY);
        if self.work_only_at_releases {
            return Some(release);
        }
        let event = self.events.peek().map_or(f64::INFINITY, |Reverse((t, _, _))| t.0);
        Some(release.min(event))
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
        let engine = &mut worker.ranks[0].engine;
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
            self.schedule(end, Event::PassEnd { pool: pool as u8, worker: w as u32 });
            return;
        }
        engine.commit_stretch(stretch.ends.len() as u32);
        if let Some(t) = self.collector.telemetry.as_mut() {
            t.stretch(pool, w, now, &stretch.ends, stretch.requests.len());
        }
        let end = *stretch.ends.last().expect("a stretch has passes");
        worker.busy = true;
        worker.pass_end = end;
        worker.stretch = Some(stretch);
        self.schedule(end, Event::PassEnd { pool: pool as u8, worker: w as u32 });
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
