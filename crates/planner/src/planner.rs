//! The planner as a state machine on a caller's clock: [`Planner::on_tick`] takes a
//! [`Snapshot`] at each tick time and returns the scaling targets and the next tick time
//! (`dynamo/planner/core/state_machine.py`, `load_scaling.py`, `throughput_scaling.py`, the
//! built-in plugins of `plugins/builtins/local_planner.py` and the replay adapter's
//! bookkeeping of `planner/offline/replay_adapter.py`).

use std::sync::Arc;

use crate::budget;
use crate::capacity::{Capacity, EngineQuery, PassModel, Shape, Worker};
use crate::config::{Mode, PlannerConfig, Target};
use crate::fpm_model::FpmModel;
use crate::predict::{ExternalSeries, Predictor, Unsupported};
use crate::types::{EngineCaps, Fpm, Scheduled, Snapshot, Traffic};

/// One role's engines as the planner sizes them.
#[derive(Clone)]
pub struct Role {
    pub caps: EngineCaps,
    /// GPUs one replica occupies (the budget's cost per replica).
    pub gpus_per_replica: i64,
    /// The hardware's forward-pass model when the workers have one (AIS timing). The planner
    /// does not query it directly: it times the benchmark passes its own fitted model starts
    /// from. Without it (fixed or polynomial timing) the fit starts empty and learns from the
    /// observed passes only, as the reference's replay does when it has no AIS model to
    /// bootstrap from.
    pub model: Option<Arc<dyn PassModel + Send + Sync>>,
    /// Speculative tokens per decode step (MTP), which the decode benchmark passes carry.
    pub nextn: u64,
}

impl std::fmt::Debug for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Role").field("caps", &self.caps).field("gpus_per_replica", &self.gpus_per_replica).finish()
    }
}

/// Why the planner cannot run.
#[derive(Clone, Debug, PartialEq)]
pub enum SetupError {
    Predictor(Unsupported),
    /// Only aggregated and disaggregated deployments replay.
    Mode(&'static str),
    /// The external forecaster could not start (its message says what to install).
    External(String),
}

impl std::fmt::Display for SetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SetupError::Predictor(u) => u.fmt(f),
            SetupError::Mode(m) => write!(f, "planner mode '{m}' cannot replay: use agg or disagg"),
            SetupError::External(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for SetupError {}

/// What one tick decided and why (the reference's tick diagnostics, trimmed).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Diagnostics {
    pub predicted_num_req: Option<f64>,
    pub predicted_isl: Option<f64>,
    pub predicted_osl: Option<f64>,
    pub predicted_kv_hit_rate: Option<f64>,
    pub engine_rps_prefill: Option<f64>,
    pub engine_rps_decode: Option<f64>,
    pub estimated_ttft_ms: Option<f64>,
    pub estimated_itl_ms: Option<f64>,
    pub load_decision_reason: Option<String>,
    pub throughput_decision_reason: Option<String>,
    pub throughput_lower_bound_prefill: i64,
    pub throughput_lower_bound_decode: i64,
}

/// One tick's outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct Tick {
    pub ordinal: u64,
    pub at_s: f64,
    pub run_load_scaling: bool,
    pub run_throughput_scaling: bool,
    /// The traffic window the throughput loop consumed (merged since the last one).
    pub traffic: Option<Traffic>,
    /// Targets (non-draining replicas) to apply; `None` leaves a role as it is.
    pub target_prefill: Option<i64>,
    pub target_decode: Option<i64>,
    pub next_tick_s: f64,
    pub diagnostics: Diagnostics,
}

/// Makes the external forecaster of one series (see [`Planner::with_external`]).
pub type ExternalFactory<'a> = &'a dyn Fn(&PlannerConfig, usize) -> Result<Box<dyn ExternalSeries>, String>;

/// A role's proposal: `None` = no change.
type Proposal = (Option<i64>, Option<i64>);

pub struct Planner {
    cfg: PlannerConfig,
    prefill: Option<Role>,
    /// Decode workers, or the aggregated ones.
    decode: Role,
    num_req: Option<Predictor>,
    isl: Option<Predictor>,
    osl: Option<Predictor>,
    last_isl: Option<f64>,
    last_osl: Option<f64>,
    seen_live: bool,
    last_kv_hit_rate: Option<f64>,
    last_accept_length: f64,
    lower_p: i64,
    lower_d: i64,
    /// Targets requested and not yet reached ("scaling in progress").
    target_p: Option<i64>,
    target_d: Option<i64>,
    ticks: u64,
    next_at: f64,
    last_load: f64,
    last_throughput: f64,
    pending: Option<Traffic>,
    /// Current counts during a tick: ready (active) workers, and non-draining ones (active
    /// and starting).
    num_p: i64,
    num_d: i64,
    cur_p: i64,
    cur_d: i64,
    diag: Diagnostics,
    /// The fitted forward-pass models the SLA estimates and the capacity search query
    /// (prefill role; decode or aggregated role).
    fpm_p: Option<FpmModel>,
    fpm_d: Option<FpmModel>,
}

impl std::fmt::Debug for Planner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Planner").field("cfg", &self.cfg).field("ticks", &self.ticks).finish()
    }
}

impl Planner {
    /// `prefill` is `None` for an aggregated deployment (`mode: agg`).
    pub fn new(cfg: PlannerConfig, prefill: Option<Role>, decode: Role) -> Result<Planner, SetupError> {
        Planner::with_external(cfg, prefill, decode, None)
    }

    /// As [`Planner::new`]; `external` makes the forecaster of each series (0 = number of
    /// requests, 1 = ISL, 2 = OSL) for a `load_predictor` servesim does not implement (ARIMA).
    /// It is called only when throughput scaling predicts with such a predictor.
    pub fn with_external(
        cfg: PlannerConfig,
        prefill: Option<Role>,
        decode: Role,
        external: Option<ExternalFactory<'_>>,
    ) -> Result<Planner, SetupError> {
        match cfg.mode {
            Mode::Prefill => return Err(SetupError::Mode("prefill")),
            Mode::Decode => return Err(SetupError::Mode("decode")),
            _ => {}
        }
        let needs_model = cfg.enable_throughput_scaling || cfg.optimization_target == Target::Sla;
        let bootstrap = decode.model.is_some() && prefill.as_ref().is_none_or(|p| p.model.is_some());
        let predictor = |cfg: &PlannerConfig, series: usize| -> Result<Option<Predictor>, SetupError> {
            if !cfg.enable_throughput_scaling {
                return Ok(None);
            }
            let ext = match external {
                Some(make) if cfg.load_predictor == crate::config::PredictorKind::Arima => {
                    Some(make(cfg, series).map_err(SetupError::External)?)
                }
                _ => None,
            };
            Predictor::with_external(cfg, ext).map(Some).map_err(SetupError::Predictor)
        };
        let fitted = |role: &Role, worker: Worker| -> FpmModel {
            let mut m = FpmModel::new(
                worker,
                role.caps,
                cfg.max_num_fpm_samples.max(1) as usize,
                cfg.fpm_sample_bucket_size.max(1) as usize,
                cfg.load_min_observations.max(1) as usize,
            );
            // `prepare_planner_replay` bootstraps only when both roles have an AIS model.
            if let Some(hw) = role.model.as_deref().filter(|_| bootstrap) {
                let passes = m.bootstrap_passes(hw, role.nextn);
                m.bootstrap(&passes);
            }
            m
        };
        let (fpm_p, fpm_d) = if needs_model {
            let d = fitted(&decode, if cfg.mode == Mode::Agg { Worker::Aggregated } else { Worker::Decode });
            (prefill.as_ref().map(|p| fitted(p, Worker::Prefill)), Some(d))
        } else {
            (None, None)
        };
        Ok(Planner {
            fpm_p,
            fpm_d,
            num_req: predictor(&cfg, 0)?,
            isl: predictor(&cfg, 1)?,
            osl: predictor(&cfg, 2)?,
            last_isl: None,
            last_osl: None,
            seen_live: false,
            last_kv_hit_rate: None,
            last_accept_length: 1.0,
            // The throughput lower bounds start at the minimum endpoints.
            lower_p: cfg.min_endpoint_for(true),
            lower_d: cfg.min_endpoint_for(false),
            target_p: None,
            target_d: None,
            ticks: 0,
            next_at: cfg.scale_interval_seconds,
            last_load: 0.0,
            last_throughput: 0.0,
            pending: None,
            num_p: 0,
            num_d: 0,
            cur_p: 0,
            cur_d: 0,
            diag: Diagnostics::default(),
            cfg,
            prefill,
            decode,
        })
    }

    pub fn config(&self) -> &PlannerConfig {
        &self.cfg
    }

    pub fn is_agg(&self) -> bool {
        self.prefill.is_none()
    }

    /// When the next tick is due, seconds.
    pub fn next_tick_s(&self) -> f64 {
        self.next_at
    }

    fn due(last: f64, interval: f64, at: f64) -> bool {
        at - last >= interval - 1e-9
    }

    fn min_ep(&self, prefill: bool) -> i64 {
        self.cfg.min_endpoint_for(prefill)
    }

    /// Runs the tick due now on `snap` (taken at [`Planner::next_tick_s`]).
    pub fn on_tick(&mut self, snap: &Snapshot) -> Tick {
        let at = self.next_at;
        let run_load = Self::due(self.last_load, self.cfg.load_adjustment_interval_seconds as f64, at);
        let run_tp = self.cfg.enable_throughput_scaling
            && Self::due(self.last_throughput, self.cfg.throughput_adjustment_interval_seconds as f64, at);
        if run_load {
            self.last_load = at;
        }
        if run_tp {
            self.last_throughput = at;
        }
        self.diag = Diagnostics::default();
        self.num_p = snap.active_prefill.len() as i64;
        self.num_d = snap.active_decode.len() as i64;
        // A requested target is reached once the non-draining count equals it.
        let cur_p = (snap.active_prefill.len() + snap.starting_prefill.len()) as i64;
        let cur_d = (snap.active_decode.len() + snap.starting_decode.len()) as i64;
        if self.target_p == Some(cur_p) {
            self.target_p = None;
        }
        if self.target_d == Some(cur_d) {
            self.target_d = None;
        }
        (self.cur_p, self.cur_d) = (cur_p, cur_d);
        self.pending = Some(match self.pending.take() {
            None => snap.traffic,
            Some(p) => p.merge(&snap.traffic),
        });
        // Whenever the load interval has come round (load scaling on or not), the SLA target
        // feeds the snapshots to the fitted models first; both loops of the tick see the tuned
        // fit.
        if run_load && self.cfg.optimization_target == Target::Sla {
            if self.is_agg() {
                if let Some(m) = self.fpm_d.as_mut() {
                    m.observe(&snap.decode_fpms);
                }
            } else {
                if let Some(m) = self.fpm_p.as_mut() {
                    m.observe(&snap.prefill_fpms);
                }
                if let Some(m) = self.fpm_d.as_mut() {
                    m.observe(&snap.decode_fpms);
                }
            }
        }
        let mut consumed = None;
        let mut proposal: Option<Proposal> = None;
        if run_tp {
            let window = self.pending.take().unwrap_or_default();
            consumed = Some(window);
            if window.duration_s > 0.0 {
                proposal = self.throughput(&window);
            } else {
                self.diag.throughput_decision_reason = Some("no_traffic_data".into());
            }
        }
        if run_load && self.cfg.enable_load_scaling {
            if let Some(p) = self.load(snap) {
                proposal = Some(p);
            }
        }
        self.diag.throughput_lower_bound_prefill = self.lower_p;
        self.diag.throughput_lower_bound_decode = self.lower_d;
        let (mut target_prefill, mut target_decode) = (None, None);
        if let Some((p, d)) = proposal {
            let tp = if self.is_agg() { cur_p } else { p.unwrap_or(cur_p) };
            let td = d.unwrap_or(cur_d);
            if tp != cur_p || td != cur_d {
                if self.is_agg() {
                    target_prefill = Some(0);
                    target_decode = Some(td);
                    self.target_d = Some(td);
                } else {
                    target_prefill = Some(tp);
                    target_decode = Some(td);
                    if p.is_some() && tp != cur_p {
                        self.target_p = Some(tp);
                    }
                    if d.is_some() && td != cur_d {
                        self.target_d = Some(td);
                    }
                }
            }
        }
        if target_prefill.is_none() && target_decode.is_none() {
            if let Some((p, d)) = self.budget_reconcile(snap) {
                target_prefill = Some(p);
                target_decode = Some(d);
                if !self.is_agg() && p != self.num_p {
                    self.target_p = Some(p);
                }
                if d != self.num_d {
                    self.target_d = Some(d);
                }
            }
        }
        self.ticks += 1;
        self.next_at = at + self.cfg.scale_interval_seconds;
        Tick {
            ordinal: self.ticks - 1,
            at_s: at,
            run_load_scaling: run_load,
            run_throughput_scaling: run_tp,
            traffic: consumed,
            target_prefill,
            target_decode,
            next_tick_s: self.next_at,
            diagnostics: std::mem::take(&mut self.diag),
        }
    }

    /// The final boundary of a tick that changes nothing (`engine_adapter.py`,
    /// `_project_scale_to`): when no scaling is under way and no worker is starting, the ready
    /// counts are lifted to the minimum endpoints and clamped into the GPU budget band (say a
    /// deployment that starts with more replicas than `max_num_gpus`): one aggregated pool by
    /// `proportional_clamp_single`, a disaggregated pair jointly. The clamps leave a pair inside
    /// the band as it is. Returns the (prefill, decode) targets (prefill 0 when aggregated).
    fn budget_reconcile(&self, snap: &Snapshot) -> Option<(i64, i64)> {
        if self.target_p.is_some() || self.target_d.is_some() {
            return None;
        }
        if !snap.starting_prefill.is_empty() || !snap.starting_decode.is_empty() {
            return None;
        }
        let (min, max) = (self.cfg.min_gpu_budget, self.cfg.max_gpu_budget);
        let (pg, dg) = self.gpus();
        let (pm, dm) = (self.min_ep(true), self.min_ep(false));
        let (p, d) = (if self.is_agg() { 0 } else { self.num_p }, self.num_d);
        let (tp, td) = if self.is_agg() {
            (0, budget::clamp_single(d.max(dm), dg, min, max, dm))
        } else {
            budget::clamp_pair(p.max(pm), d.max(dm), pg, dg, min, max, pm, dm)
        };
        (tp != p || td != d).then_some((tp, td))
    }

    /// `_scaling_in_progress` on the replay adapter's worker counts: a requested target not yet
    /// reached by the non-draining count, or an expected count (that target, else the
    /// non-draining count) other than the ready count, i.e. a worker of the role still starting.
    /// (Aggregated deployments report no prefill counts, so their prefill side never is.)
    fn scaling_in_progress(&self, prefill: bool) -> bool {
        let (target, cur, ready) = if prefill {
            if self.is_agg() {
                return false;
            }
            (self.target_p, self.cur_p, self.num_p)
        } else {
            (self.target_d, self.cur_d, self.num_d)
        };
        target.is_some_and(|t| t != cur) || target.unwrap_or(cur) != ready
    }

    // ----------------------------------------------------------------------------------------
    // Throughput (predictive) scaling.

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

    fn fpm(&self, worker: Worker) -> Option<&FpmModel> {
        match worker {
            Worker::Prefill => self.fpm_p.as_ref(),
            _ => self.fpm_d.as_ref(),
        }
    }

    /// The capacity search's view of an engine: the fitted model, queried as one rank. (The
    /// reference's unprofiled planner model has no attention-DP grouping: it puts a synthetic
    /// batch on a single rank, with the engine's whole KV capacity.)
    fn query<'a>(&'a self, role: &'a Role, worker: Worker) -> Option<EngineQuery<'a>> {
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

    fn throughput(&mut self, window: &Traffic) -> Option<Proposal> {
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

    fn gpus(&self) -> (i64, i64) {
        (self.prefill.as_ref().map_or(0, |r| r.gpus_per_replica), self.decode.gpus_per_replica)
    }

    /// `_fit_disagg_throughput_ceiling`: the throughput pair under the hard ceiling only.
    fn fit_ceiling(&self, p: i64, d: i64) -> (i64, i64) {
        let (pg, dg) = self.gpus();
        let (pm, dm) = (self.min_ep(true), self.min_ep(false));
        if self.num_p < pm || self.num_d < dm {
            budget::clamp_pair(p.max(pm), d.max(dm), pg, dg, -1, self.cfg.max_gpu_budget, pm, dm)
        } else {
            budget::fit_directional_pair(self.num_p, self.num_d, p, d, pg, dg, -1, self.cfg.max_gpu_budget, pm, dm)
        }
    }

    /// `_apply_disagg_scaling_budget`.
    fn guard_pair(&self, p: i64, d: i64) -> (i64, i64, Option<&'static str>) {
        let (pg, dg) = self.gpus();
        let (pm, dm) = (self.min_ep(true), self.min_ep(false));
        let (min, max) = (self.cfg.min_gpu_budget, self.cfg.max_gpu_budget);
        if self.num_p < pm || self.num_d < dm {
            let (p, d) = budget::clamp_pair(p.max(pm), d.max(dm), pg, dg, min, max, pm, dm);
            return (p, d, Some(budget::RECONCILE));
        }
        budget::guard_pair(self.num_p, self.num_d, p, d, pg, dg, min, max, pm, dm)
    }

    // ----------------------------------------------------------------------------------------
    // Load-based (reactive) scaling.

    fn load(&mut self, snap: &Snapshot) -> Option<Proposal> {
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
                self.kv_easy(&snap.decode_fpms, n, true)?
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
            self.kv_easy(df, self.num_d, false)
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
    fn easy_kv(&mut self, utils: &[f64], n: i64) -> Option<i64> {
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
    fn kv_easy(&mut self, fpms: &[Fpm], n: i64, aggregated: bool) -> Option<i64> {
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
        self.easy_kv(&utils, n)
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
        let consolidation = if n > 1 { n as f64 / (n - 1) as f64 } else { 1.0 };
        let agg = worker == Worker::Aggregated;
        let hit = self.last_kv_hit_rate;
        let model = self.fpm(worker)?;
        let mut estimates = Vec::new();
        let mut can_down = n > 1;
        let mut refused = false;
        for f in Self::groups(fpms) {
            let g = [f];
            if let Some(e) = model.queued_prefill_s(&g, hit, 1.0, 1.0, false) {
                estimates.push(e * 1000.0);
            }
            if !can_down {
                continue;
            }
            let (ds, with_queued_decode) = if agg { (consolidation, true) } else { (1.0, false) };
            let Some(own) = model.queued_prefill_s(&g, hit, 0.0, ds, with_queued_decode) else {
                can_down = false;
                continue;
            };
            let budget = (self.cfg.ttft_ms - own * 1000.0) * sens;
            if budget <= 0.0 {
                can_down = false;
                refused = true;
                continue;
            }
            match model.queued_prefill_s(&g, hit, consolidation, ds, with_queued_decode) {
                None => can_down = false,
                Some(post) if post * 1000.0 - own * 1000.0 >= budget => {
                    can_down = false;
                    refused = true;
                }
                Some(_) => {}
            }
        }
        if let Some(m) = estimates.iter().copied().reduce(f64::max) {
            self.diag.estimated_ttft_ms = Some(m);
        }
        let d = self.sla_decision(&estimates, self.cfg.ttft_ms, n, min_ep, can_down);
        if d.is_none() && refused {
            self.diag.load_decision_reason = Some("scale_down_refused_consolidation".into());
            if agg {
                return Some(n);
            }
        }
        d
    }

    /// ITL load scaling (decode engines, or the decode side of aggregated ones): every
    /// engine's estimated ITL with a next request above the SLA scales up; scale-down needs
    /// every engine's KV (scheduled and queued decode, and for aggregated engines queued
    /// prefill) times N/(N−1) to fit its cache and its estimated ITL there to stay under the
    /// sensitivity share of the SLA.
    fn sla_itl(&mut self, role: &Role, worker: Worker, fpms: &[Fpm], n: i64, min_ep: i64) -> Option<i64> {
        let sens = self.cfg.load_scaling_down_sensitivity as f64 / 100.0;
        let consolidation = if n > 1 { n as f64 / (n - 1) as f64 } else { 1.0 };
        let agg = worker == Worker::Aggregated;
        let max_kv = role.caps.max_kv_tokens as f64;
        let accept = self.last_accept_length;
        let model = self.fpm(worker)?;
        let mut estimates = Vec::new();
        let mut can_down = n > 1;
        let mut refused = false;
        for f in Self::groups(fpms) {
            let g = [f];
            if let Some(e) = model.decode_pass_s(&g, 1.0, true, false) {
                estimates.push(e * 1000.0 / accept);
            }
            if !can_down {
                continue;
            }
            let mut kv = f64::from(f.scheduled.sum_decode_kv_tokens) + f64::from(f.queued.sum_decode_kv_tokens);
            if agg {
                kv += f64::from(f.queued.sum_prefill_tokens);
            }
            if max_kv > 0.0 && (kv * consolidation).floor() >= max_kv {
                can_down = false;
                refused = true;
                continue;
            }
            match model.decode_pass_s(&g, consolidation, true, agg) {
                None => can_down = false,
                Some(post) if post * 1000.0 / accept >= self.cfg.itl_ms * sens => {
                    can_down = false;
                    refused = true;
                }
                Some(_) => {}
            }
        }
        if let Some(m) = estimates.iter().copied().reduce(f64::max) {
            self.diag.estimated_itl_ms = Some(m);
        }
        let d = self.sla_decision(&estimates, self.cfg.itl_ms, n, min_ep, can_down);
        if d.is_none() && refused {
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

/// An idle rank's snapshot.
pub fn idle_fpm(worker: u32, dp_rank: u32) -> Fpm {
    Fpm { worker, dp_rank, wall_time: 0.0, scheduled: Scheduled::default(), queued: Default::default() }
}
