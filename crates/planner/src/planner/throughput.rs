//! Throughput-based (predictive) scaling, as Dynamo's `throughput_scaling.py`: the traffic
//! predictors observe each adjustment interval's window, and the replicas follow from the
//! predicted load over one worker's capacity at the SLA.

use super::*;

impl Planner {
    fn observe_traffic(&mut self, t: &Traffic) {
        if let Some(p) = self.num_req.as_mut() {
            p.add(t.num_req);
        }
        if t.num_req > 0.0 {
            self.seen_live = true;
            self.last_isl = Some(t.avg_isl);
            self.last_osl = Some(t.avg_osl);
        }
        let (mut isl, mut osl) = (t.avg_isl, t.avg_osl);
        if t.num_req == 0.0 && self.seen_live {
            isl = self.last_isl.unwrap_or(0.0);
            osl = self.last_osl.unwrap_or(0.0);
        }
        if let Some(p) = self.isl.as_mut() {
            p.add(isl);
        }
        if let Some(p) = self.osl.as_mut() {
            p.add(osl);
        }
        // The replay reports the hit rate as 0.0 for a window without admissions; kept as is.
        self.last_kv_hit_rate = Some(t.avg_kv_hit_rate);
        if let Some(a) = t.avg_accept_length.filter(|a| a.is_finite()) {
            self.last_accept_length = self.clamp_accept(a);
        }
    }

    fn clamp_accept(&self, a: f64) -> f64 {
        let nextn = self.cfg.speculative_nextn;
        if nextn <= 0 {
            1.0
        } else {
            a.clamp(1.0, (nextn + 1) as f64)
        }
    }

    /// The capacity search's view of an engine: the fitted model, queried as one rank. (The
    /// reference's unprofiled planner model has no attention-DP grouping: it puts a synthetic
    /// batch on a single rank, with the engine's whole KV capacity.)
    fn query<'a>(&'a self, role: &'a RoleEngines, worker: Worker) -> Option<EngineQuery<'a>> {
        let caps = EngineCaps { dp_size: 1, ..role.caps };
        self.fpm(worker).map(|m| EngineQuery { model: m as &dyn PassModel, caps, worker })
    }

    fn capacity(&self, worker: Worker, isl: f64, osl: f64, hit: Option<f64>) -> Option<Capacity> {
        let role = match worker {
            Worker::Prefill => self.prefill.as_ref()?,
            _ => &self.decode,
        };
        if isl <= 0.0 || (worker != Worker::Prefill && osl <= 0.0) {
            return None;
        }
        let q = self.query(role, worker)?;
        let shape = Shape {
            isl: isl.ceil() as u64,
            osl: (osl.ceil() as u64).max(1),
            ttft_sla_s: matches!(worker, Worker::Prefill | Worker::Aggregated).then_some(self.cfg.ttft_ms / 1000.0),
            itl_sla_s: matches!(worker, Worker::Decode | Worker::Aggregated).then_some(self.cfg.itl_ms / 1000.0),
            accept_length: if worker == Worker::Prefill { 1.0 } else { self.last_accept_length },
            kv_hit_rate: hit,
        };
        q.capacity(&shape).ok().flatten()
    }

    fn cap_change(&self, desired: i64, current: i64) -> i64 {
        let limit = self.cfg.max_throughput_scaling_replicas;
        desired.max((current - limit).max(0)).min(current + limit)
    }

    pub(super) fn throughput(&mut self, window: &Traffic) -> Option<Proposal> {
        self.observe_traffic(window);
        let nr = self.num_req.as_mut().map(|p| p.predict_next())?;
        let isl = self.isl.as_mut().map(|p| p.predict_next())?;
        let osl = self.osl.as_mut().map(|p| p.predict_next())?;
        let hit = self.last_kv_hit_rate;
        self.diag.predicted_num_req = Some(nr);
        self.diag.predicted_isl = Some(isl);
        self.diag.predicted_osl = Some(osl);
        self.diag.predicted_kv_hit_rate = hit;
        let demand = nr / window.duration_s;
        let load_on = self.cfg.enable_load_scaling;
        if self.is_agg() {
            let cap = self.capacity(Worker::Aggregated, isl, osl, hit).filter(|c| c.rps > 0.0);
            let not_ready = cap.is_none();
            let desired = match cap {
                Some(c) => {
                    self.diag.engine_rps_prefill = Some(c.rps);
                    self.diag.engine_rps_decode = Some(c.rps);
                    ((demand / c.rps).ceil() as i64).max(self.min_ep(false))
                }
                None => self.num_d,
            };
            let desired = self.cap_change(desired, self.num_d).max(self.min_ep(false));
            let gpu = self.decode.gpus_per_replica;
            let (desired, ceiling) =
                budget::guard_single(self.num_d, desired, gpu, -1, self.cfg.max_gpu_budget, self.min_ep(false));
            if load_on {
                self.lower_d = desired;
                self.diag.throughput_decision_reason = Some(
                    if not_ready {
                        "model_not_ready"
                    } else if ceiling == Some(budget::GUARD_HOLD) {
                        budget::GUARD_HOLD
                    } else {
                        "set_lower_bound"
                    }
                    .into(),
                );
                return None;
            }
            let (desired, reason) = budget::guard_single(
                self.num_d,
                desired,
                gpu,
                self.cfg.min_gpu_budget,
                self.cfg.max_gpu_budget,
                self.min_ep(false),
            );
            if desired == self.num_d {
                self.diag.throughput_decision_reason =
                    Some(if not_ready { "model_not_ready" } else { reason.or(ceiling).unwrap_or("no_change") }.into());
                return None;
            }
            self.diag.throughput_decision_reason = Some(if not_ready { "model_not_ready" } else { "scale" }.into());
            return Some((None, Some(desired)));
        }
        let cap_p = self.capacity(Worker::Prefill, isl, osl, hit).filter(|c| c.rps > 0.0);
        let cap_d = self.capacity(Worker::Decode, isl, osl, None).filter(|c| c.rps > 0.0);
        if let Some(c) = cap_p {
            self.diag.engine_rps_prefill = Some(c.rps);
        }
        if let Some(c) = cap_d {
            self.diag.engine_rps_decode = Some(c.rps);
        }
        let not_ready = cap_p.is_none() || cap_d.is_none();
        let (p, d) = match (cap_p, cap_d) {
            (Some(cp), Some(cd)) => (
                ((demand / cp.rps).ceil() as i64).max(self.min_ep(true)),
                ((demand / cd.rps).ceil() as i64).max(self.min_ep(false)),
            ),
            _ => (self.num_p, self.num_d),
        };
        let p = self.cap_change(p, self.num_p).max(self.min_ep(true));
        let d = self.cap_change(d, self.num_d).max(self.min_ep(false));
        let (p, d) = self.fit_ceiling(p, d);
        if load_on {
            self.lower_p = p;
            self.lower_d = d;
            self.diag.throughput_decision_reason =
                Some(if not_ready { "model_not_ready" } else { "set_lower_bound" }.into());
            return None;
        }
        let (p, d, reason) = self.guard_pair(p, d);
        if p == self.num_p && d == self.num_d {
            self.diag.throughput_decision_reason =
                Some(if not_ready { "model_not_ready" } else { reason.unwrap_or("no_change") }.into());
            return None;
        }
        self.diag.throughput_decision_reason = Some("scale".into());
        Some((Some(p), Some(d)))
    }
}
