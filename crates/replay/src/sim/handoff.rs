//! Carrying out the disaggregated handoff's steps between a worker's passes: destination
//! retries, transfers, activation and releasing the source.

use super::*;

impl Simulation<'_, '_> {
    /// Decode target `t` (a rank of a decode worker) tries to reserve blocks for the oldest
    /// request waiting there; true if it did.
    pub(super) fn retry_destination(&mut self, pool: usize, t: usize) -> bool {
        let (w, r) = self.pools[pool].spec.locate(t);
        let engine = &mut self.pools[pool].workers[w].ranks[r].engine;
        let Some(Reserved { request, reused_tokens }) = engine.retry_destination() else {
            return false;
        };
        self.collector.destination_reserved(request, self.now);
        self.handoff(request, Fact::DestinationReserved { reused_tokens });
        true
    }

    /// Every rank of decode worker `w` tries its oldest waiting destination, as each rank's
    /// pass end does; true if any reserved one.
    pub(super) fn retry_destinations(&mut self, pool: usize, w: usize) -> bool {
        let dp = self.pools[pool].spec.dp();
        let mut reserved = false;
        for r in 0..dp {
            let t = self.pools[pool].spec.target(w, r);
            reserved |= self.retry_destination(pool, t);
        }
        reserved
    }

    /// Reports `fact` to request `id`'s handoff and carries out the steps it leads to.
    pub(super) fn handoff(&mut self, id: u64, fact: Fact) {
        let timing = self.transfer.expect("a disaggregated cluster");
        if let Fact::DestinationRefused(_) = fact {
            self.collector.destination_refused(id);
        }
        let flight = self.flights.get_mut(&id).expect("handed-off request is in flight");
        let steps = flight.handoff.as_mut().expect("a disaggregated request").on(fact, &timing);
        for step in steps {
            self.carry_out(id, step);
        }
    }

    pub(super) fn carry_out(&mut self, id: u64, step: Step) {
        match step {
            Step::PlaceOnPrefill => self.route(0, id),
            Step::PlaceOnDecode => self.route(1, id),
            Step::StartTransfer { delay_ms } => self.schedule(self.now + delay_ms, Event::TransferDone { request: id }),
            Step::Activate => {
                // Like every command to an engine, an activation waits for the pass in flight.
                let t = self.flights[&id].decode_target.expect("routed to a decode worker");
                let (w, _) = self.pools[1].spec.locate(t);
                let worker = &mut self.pools[1].workers[w];
                if worker.busy {
                    worker.pending_activations.push((id, t));
                } else {
                    self.activate(t, id);
                }
            }
            Step::ReleaseSource => self.release_source(id),
            Step::Reject(reason) => {
                self.router_edge(1, Edge::Free(id));
                self.finish(id, Finish::Rejected(reason));
            }
            Step::AbortSource => {
                let t = self.flights[&id].prefill_target.expect("placed on a prefill worker");
                let (w, r) = self.pools[0].spec.locate(t);
                let worker = &mut self.pools[0].workers[w];
                worker.ranks[r].engine.abort(id);
                worker.reset_wave_if_drained();
                self.wake(0, w);
            }
            Step::AbortDestination => {
                let t = self.flights[&id].decode_target.expect("placed on a decode worker");
                let (w, r) = self.pools[1].spec.locate(t);
                let worker = &mut self.pools[1].workers[w];
                worker.ranks[r].engine.abort(id);
                worker.reset_wave_if_drained();
                self.wake(1, w);
            }
        }
    }

    /// Decode target `t` takes the transferred KV.
    pub(super) fn activate(&mut self, t: usize, id: u64) {
        let (w, r) = self.pools[1].spec.locate(t);
        self.pools[1].workers[w].ranks[r].engine.activate(id);
        self.wake(1, w);
        self.collector.destination_activated(id, self.now);
        self.retry_destination(1, t);
        self.handoff(id, Fact::Activated);
    }

    /// The prefill worker may free the KV it holds for `id` (at the end of its current pass).
    pub(super) fn release_source(&mut self, id: u64) {
        let t = self.flights[&id].prefill_target.expect("prefilled");
        let (w, r) = self.pools[0].spec.locate(t);
        let worker = &mut self.pools[0].workers[w];
        if worker.busy {
            // Recorded now: the request may be gone by the time the pass ends.
            self.collector.source_released(id, worker.pass_end);
            worker.pending_releases.push((id, r));
        } else {
            worker.ranks[r].engine.release_held(id);
            worker.reset_wave_if_drained();
            self.collector.source_released(id, self.now);
            self.wake(0, w);
            if self.scaling.is_some() {
                self.retire_if_drained(0, w);
            }
        }
    }
}
