//! Load-based (reactive) scaling, as Dynamo's `load_scaling.py`: from the ranks' forward-pass
//! metrics, either the easy thresholds on KV and queue utilisation or the per-worker SLA
//! estimates of the fitted pass model.

use super::*;

impl Planner {
    pub(super) fn load(&mut self, snap: &Snapshot) -> Option<Proposal> {
        let easy = self.cfg.optimization_target != Target::Sla;
        if self.is_agg() {
            if snap.decode_fpms.is_empty() {
                self.diag.load_decision_reason = Some("no_fpm_data".into());
                return None;
            }
            if self.scaling_in_progress(false) {
                self.diag.load_decision_reason = Some("scaling_in_progress".into());
                return None;
            }
            if !fpm_covers(&snap.decode_fpms, self.num_d) {
                self.diag.load_decision_reason = Some("worker_count_mismatch".into());
                return None;
            }
            let n = self.num_d;
            let refused_label = "scale_down_refused_consolidation";
            let mut any_refused = false;
            let desired = if easy {
                self.kv_utilisation_scaling(&snap.decode_fpms, n, true)?
            } else {
                if !self.model_ready(Worker::Aggregated, n) {
                    return None;
                }
                let p = self.agg_prefill_sla(&snap.decode_fpms, n);
                any_refused |= self.diag.load_decision_reason.as_deref() == Some(refused_label);
                let d = self.agg_decode_sla(&snap.decode_fpms, n);
                any_refused |= self.diag.load_decision_reason.as_deref() == Some(refused_label);
                match (p, d) {
                    (Some(p), _) if p > n => p,
                    (_, Some(d)) if d > n => d,
                    (None, Some(d)) if d < n => d,
                    (Some(p), Some(d)) if p < n && d < n => p.max(d),
                    _ => n,
                }
            };
            let original = desired;
            let mut desired = desired.max(self.min_ep(false));
            if self.cfg.enable_throughput_scaling {
                desired = desired.max(self.lower_d);
            }
            let (desired, budget_reason) = budget::guard_single(
                n,
                desired,
                self.decode.gpus_per_replica,
                self.cfg.min_gpu_budget,
                self.cfg.max_gpu_budget,
                self.min_ep(false),
            );
            // The SLA target keeps "load wanted fewer, the throughput floor held it" as its own
            // reason even when nothing changes, and a refused consolidation unless the floor
            // held the count anyway.
            let floor_capped = if easy { desired > original } else { desired > original && original < n };
            let reason = if desired < n {
                if floor_capped {
                    "scale_down_capped_by_throughput"
                } else {
                    "scale_down"
                }
            } else if desired > n {
                "scale_up"
            } else if easy {
                "no_change"
            } else if any_refused && !floor_capped {
                refused_label
            } else if floor_capped {
                "scale_down_capped_by_throughput"
            } else {
                "no_change"
            };
            self.diag.load_decision_reason = Some(budget_reason.unwrap_or(reason).into());
            if !easy && desired == n {
                return None;
            }
            return Some((None, Some(desired)));
        }
        let (pf, df) = (&snap.prefill_fpms, &snap.decode_fpms);
        if pf.is_empty() && df.is_empty() {
            self.diag.load_decision_reason = Some("no_fpm_data".into());
            return None;
        }
        if self.scaling_in_progress(true) || self.scaling_in_progress(false) {
            self.diag.load_decision_reason = Some("scaling_in_progress".into());
            return None;
        }
        if (!pf.is_empty() && !fpm_covers(pf, self.num_p)) || (!df.is_empty() && !fpm_covers(df, self.num_d)) {
            self.diag.load_decision_reason = Some("worker_count_mismatch".into());
            return None;
        }
        let p_desired = if pf.is_empty() {
            None
        } else if easy {
            self.prefill_easy(pf, self.num_p)
        } else {
            self.prefill_sla(pf, self.num_p)
        };
        let d_desired = if df.is_empty() {
            None
        } else if easy {
            self.kv_utilisation_scaling(df, self.num_d, false)
        } else {
            self.decode_sla(df, self.num_d)
        };
        let (orig_p, orig_d) = (p_desired.unwrap_or(self.num_p), d_desired.unwrap_or(self.num_d));
        let (mut p, mut d) = (orig_p, orig_d);
        if self.cfg.enable_throughput_scaling {
            p = p.max(self.lower_p);
            d = d.max(self.lower_d);
        }
        let (floor_p, floor_d) = (p, d);
        p = p.max(self.min_ep(true));
        d = d.max(self.min_ep(false));
        if self.cfg.enable_throughput_scaling && (floor_p > orig_p || floor_d > orig_d) {
            (p, d) = self.fit_ceiling(p, d);
        }
        let (p, d, budget_reason) = self.guard_pair(p, d);
        let reason = if p > self.num_p || d > self.num_d {
            "scale_up"
        } else if p < self.num_p || d < self.num_d {
            "scale_down"
        } else {
            "no_change"
        };
        self.diag.load_decision_reason = Some(budget_reason.unwrap_or(reason).into());
        if p == self.num_p && d == self.num_d {
            return None;
        }
        Some((Some(p), Some(d)))
    }

    /// Refuses a step down whose survivors would cross the scale-up threshold.
    fn consolidation_safe(desired: i64, ready: i64, values: &[f64], up: f64) -> i64 {
        if 0 < desired && desired < ready {
            let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            if max * ready as f64 / desired as f64 >= up {
                return ready;
            }
        }
        desired
    }

    fn thresholds_decode(&self) -> Option<(f64, f64)> {
        Some(match self.cfg.optimization_target {
            Target::Load => (self.cfg.decode_scale_up_kv_rate? / 100.0, self.cfg.decode_scale_down_kv_rate? / 100.0),
            Target::Latency => (0.4, 0.1),
            _ => (1.0, 0.6),
        })
    }

    /// Easy decode/agg decision on KV utilisation values.
    fn decide_on_kv_utilisation(&mut self, utils: &[f64], n: i64) -> Option<i64> {
        let (up, down) = match self.thresholds_decode() {
            Some(t) => t,
            None => {
                self.diag.load_decision_reason = Some("insufficient_data".into());
                return None;
            }
        };
        let is_load = self.cfg.optimization_target == Target::Load;
        if utils.is_empty() || n == 0 {
            self.diag.load_decision_reason = Some("insufficient_data".into());
            return None;
        }
        if utils.iter().any(|&u| if is_load { u >= up } else { u > up }) {
            return Some(n + 1);
        }
        let down_ok = if is_load { utils.iter().all(|&u| u <= down) } else { utils.iter().all(|&u| u < down) };
        if n > 1 && down_ok {
            let desired = (n - 1).max(self.min_ep(false));
            return Some(Self::consolidation_safe(desired, n, utils, up));
        }
        self.diag.load_decision_reason = Some("no_change".into());
        None
    }

    /// Easy KV-utilisation scaling of decode (or aggregated) workers: each rank's scheduled and
    /// queued decode KV over the KV capacity; aggregated ranks also count the queued prefill
    /// tokens (they will need KV on the same worker).
    fn kv_utilisation_scaling(&mut self, fpms: &[Fpm], n: i64, aggregated: bool) -> Option<i64> {
        let max_kv = self.decode.caps.max_kv_tokens as f64;
        if max_kv <= 0.0 {
            self.diag.load_decision_reason = Some("insufficient_data".into());
            return None;
        }
        let utils: Vec<f64> = fpms
            .iter()
            .map(|f| {
                let queued_prefill = if aggregated { f.queued.sum_prefill_tokens as f64 } else { 0.0 };
                (f.scheduled.sum_decode_kv_tokens as f64 + f.queued.sum_decode_kv_tokens as f64 + queued_prefill)
                    / max_kv
            })
            .collect();
        self.decide_on_kv_utilisation(&utils, n)
    }

    fn prefill_easy(&mut self, fpms: &[Fpm], n: i64) -> Option<i64> {
        if n == 0 {
            self.diag.load_decision_reason = Some("insufficient_data".into());
            return None;
        }
        let target = self.cfg.optimization_target;
        let (up, down, values): (f64, f64, Vec<f64>) = if target == Target::Load {
            let (Some(up), Some(down)) =
                (self.cfg.prefill_scale_up_queue_tokens, self.cfg.prefill_scale_down_queue_tokens)
            else {
                self.diag.load_decision_reason = Some("insufficient_data".into());
                return None;
            };
            (up as f64, down as f64, fpms.iter().map(|f| f.queued.sum_prefill_tokens as f64).collect())
        } else {
            let ctx = self.prefill.as_ref().map_or(0, |r| r.caps.context_length) as f64;
            if ctx <= 0.0 {
                self.diag.load_decision_reason = Some("insufficient_data".into());
                return None;
            }
            let (up, down) = if target == Target::Latency { (0.1, 0.0) } else { (1.0, 0.1) };
            (up, down, fpms.iter().map(|f| f.queued.sum_prefill_tokens as f64 / ctx).collect())
        };
        if values.iter().any(|&v| v >= up) {
            return Some(n + 1);
        }
        if n > 1 {
            let down_ok = if target == Target::Throughput {
                values.iter().all(|&v| v < down)
            } else {
                values.iter().all(|&v| v <= down)
            };
            if down_ok {
                let desired = (n - 1).max(self.min_ep(true));
                return Some(Self::consolidation_safe(desired, n, &values, up));
            }
        }
        self.diag.load_decision_reason = Some("no_change".into());
        None
    }

    /// `_scale_decision`: +1 when every estimate exceeds the SLA, −1 when consolidation is safe.
    fn sla_decision(&mut self, estimates: &[f64], sla: f64, n: i64, min_ep: i64, can_down: bool) -> Option<i64> {
        if estimates.is_empty() {
            self.diag.load_decision_reason = Some("insufficient_data".into());
            return None;
        }
        if estimates.iter().all(|&t| t > sla) {
            return Some(n + 1);
        }
        if can_down {
            return Some((n - 1).max(min_ep));
        }
        self.diag.load_decision_reason = Some("no_change".into());
        None
    }

    /// The snapshots the SLA estimates run over, one (worker, rank) each, in the reference's
    /// order (string worker id, then rank).
    fn groups(fpms: &[Fpm]) -> Vec<&Fpm> {
        let mut out: Vec<&Fpm> = fpms.iter().collect();
        out.sort_by(|a, b| a.worker.to_string().cmp(&b.worker.to_string()).then(a.dp_rank.cmp(&b.dp_rank)));
        out
    }

    /// Whether the role's fitted model can answer (`has_sufficient_data`); says why not.
    fn model_ready(&mut self, worker: Worker, n: i64) -> bool {
        let ready = self.fpm(worker).is_some_and(FpmModel::ready) && n > 0;
        if !ready {
            self.diag.load_decision_reason = Some("insufficient_data".into());
        }
        ready
    }

    /// TTFT load scaling (prefill engines, or the prefill side of aggregated ones): every
    /// engine's estimated TTFT for a next request above the SLA scales up; scale-down needs
    /// every engine to absorb its share of a removed engine's queue (and, aggregated, its
    /// decode batch) within the sensitivity share of the SLA left after its own prefill.
    fn sla_ttft(&mut self, worker: Worker, fpms: &[Fpm], n: i64, min_ep: i64) -> Option<i64> {
        let sens = self.cfg.load_scaling_down_sensitivity as f64 / 100.0;
        let consolidation = consolidation(n);
        let agg = worker == Worker::Aggregated;
        let hit = self.last_kv_hit_rate;
        let model = self.fpm(worker)?;
        let mut scan = SlaScan::new(n);
        for f in Self::groups(fpms) {
            let g = [f];
            if let Some(e) = model.queued_prefill_s(&g, hit, 1.0, 1.0, false) {
                scan.estimates.push(e * 1000.0);
            }
            if !scan.can_down {
                continue;
            }
            let (ds, with_queued_decode) = if agg { (consolidation, true) } else { (1.0, false) };
            let Some(own) = model.queued_prefill_s(&g, hit, 0.0, ds, with_queued_decode) else {
                scan.can_down = false;
                continue;
            };
            let budget = (self.cfg.ttft_ms - own * 1000.0) * sens;
            if budget <= 0.0 {
                scan.refuse();
                continue;
            }
            match model.queued_prefill_s(&g, hit, consolidation, ds, with_queued_decode) {
                None => scan.can_down = false,
                Some(post) if post * 1000.0 - own * 1000.0 >= budget => scan.refuse(),
                Some(_) => {}
            }
        }
        let sla_ms = self.cfg.ttft_ms;
        self.sla_outcome(scan, sla_ms, |d| &mut d.estimated_ttft_ms, n, min_ep, agg)
    }

    /// ITL load scaling (decode engines, or the decode side of aggregated ones): every
    /// engine's estimated ITL with a next request above the SLA scales up; scale-down needs
    /// every engine's KV (scheduled and queued decode, and for aggregated engines queued
    /// prefill) times N/(N−1) to fit its cache and its estimated ITL there to stay under the
    /// sensitivity share of the SLA.
    fn sla_itl(&mut self, role: &RoleEngines, worker: Worker, fpms: &[Fpm], n: i64, min_ep: i64) -> Option<i64> {
        let sens = self.cfg.load_scaling_down_sensitivity as f64 / 100.0;
        let consolidation = consolidation(n);
        let agg = worker == Worker::Aggregated;
        let max_kv = role.caps.max_kv_tokens as f64;
        let accept = self.last_accept_length;
        let model = self.fpm(worker)?;
        let mut scan = SlaScan::new(n);
        for f in Self::groups(fpms) {
            let g = [f];
            if let Some(e) = model.decode_pass_s(&g, 1.0, true, false) {
                scan.estimates.push(e * 1000.0 / accept);
            }
            if !scan.can_down {
                continue;
            }
            let mut kv = f64::from(f.scheduled.sum_decode_kv_tokens) + f64::from(f.queued.sum_decode_kv_tokens);
            if agg {
                kv += f64::from(f.queued.sum_prefill_tokens);
            }
            if max_kv > 0.0 && (kv * consolidation).floor() >= max_kv {
                scan.refuse();
                continue;
            }
            match model.decode_pass_s(&g, consolidation, true, agg) {
                None => scan.can_down = false,
                Some(post) if post * 1000.0 / accept >= self.cfg.itl_ms * sens => scan.refuse(),
                Some(_) => {}
            }
        }
        let sla_ms = self.cfg.itl_ms;
        self.sla_outcome(scan, sla_ms, |d| &mut d.estimated_itl_ms, n, min_ep, agg)
    }

    /// The decision of an SLA check (TTFT or ITL) against `sla_ms`: the largest estimate goes
    /// into the diagnostics' `estimated` field, then [`Planner::sla_decision`]; a scale-down
    /// refused because the engines left would miss the SLA is said, and holds an aggregated
    /// role at `n`.
    fn sla_outcome(
        &mut self,
        scan: SlaScan,
        sla_ms: f64,
        estimated: fn(&mut Diagnostics) -> &mut Option<f64>,
        n: i64,
        min_ep: i64,
        agg: bool,
    ) -> Option<i64> {
        if let Some(m) = scan.estimates.iter().copied().reduce(f64::max) {
            *estimated(&mut self.diag) = Some(m);
        }
        let d = self.sla_decision(&scan.estimates, sla_ms, n, min_ep, scan.can_down);
        if d.is_none() && scan.refused {
            self.diag.load_decision_reason = Some("scale_down_refused_consolidation".into());
            if agg {
                return Some(n);
            }
        }
        d
    }

    fn prefill_sla(&mut self, fpms: &[Fpm], n: i64) -> Option<i64> {
        if !self.model_ready(Worker::Prefill, n) {
            return None;
        }
        let min_ep = self.min_ep(true);
        self.sla_ttft(Worker::Prefill, fpms, n, min_ep)
    }

    fn decode_sla(&mut self, fpms: &[Fpm], n: i64) -> Option<i64> {
        if !self.model_ready(Worker::Decode, n) {
            return None;
        }
        let role = self.decode.clone();
        let min_ep = self.min_ep(false);
        self.sla_itl(&role, Worker::Decode, fpms, n, min_ep)
    }

    fn agg_prefill_sla(&mut self, fpms: &[Fpm], n: i64) -> Option<i64> {
        let min_ep = self.min_ep(false);
        self.sla_ttft(Worker::Aggregated, fpms, n, min_ep)
    }

    fn agg_decode_sla(&mut self, fpms: &[Fpm], n: i64) -> Option<i64> {
        let role = self.decode.clone();
        let min_ep = self.min_ep(false);
        self.sla_itl(&role, Worker::Aggregated, fpms, n, min_ep)
    }
}

/// What an SLA check found over a role's engines: each engine's estimate (ms) for a next
/// request, whether scaling down is still possible, and whether it was refused because the
/// engines left would miss the SLA (rather than for want of an estimate).
struct SlaScan {
    estimates: Vec<f64>,
    can_down: bool,
    refused: bool,
}

impl SlaScan {
    /// Before any engine is looked at: scaling down is possible from `n` > 1 engines.
    fn new(n: i64) -> SlaScan {
        SlaScan { estimates: Vec::new(), can_down: n > 1, refused: false }
    }

    /// An engine could not take its share of a removed one's load within the SLA.
    fn refuse(&mut self) {
        self.can_down = false;
        self.refused = true;
    }
}

/// How much each of `n` engines' load grows when one is removed: N/(N−1) (1 for one engine).
fn consolidation(n: i64) -> f64 {
    if n > 1 {
        n as f64 / (n - 1) as f64
    } else {
        1.0
    }
}

/// `_reconcile_fpm_worker_count`: one snapshot per rank of every counted worker.
fn fpm_covers(fpms: &[Fpm], workers: i64) -> bool {
    let mut ids: Vec<u32> = fpms.iter().map(|f| f.worker).collect();
    ids.sort_unstable();
    ids.dedup();
    if ids.is_empty() || ids.len() as i64 != workers {
        return false;
    }
    let per = |w: u32| fpms.iter().filter(|f| f.worker == w).count();
    let dp = per(ids[0]);
    ids.iter().all(|&w| per(w) == dp) && fpms.len() == ids.len() * dp
}
