//! The planner as a state machine on a caller's clock: [`Planner::on_tick`] takes a
//! [`Snapshot`] at each tick time and returns the scaling targets and the next tick time
//! (`dynamo/planner/core/state_machine.py`, `load_scaling.py`, `throughput_scaling.py`, the
//! built-in plugins of `plugins/builtins/local_planner.py` and the replay adapter's
//! bookkeeping of `planner/offline/replay_adapter.py`).
//!
//! The tick and what both scalers share are here; `throughput` and `load` hold the two scalers
//! (Dynamo's `throughput_scaling.py` and `load_scaling.py`).

mod load;
mod throughput;

use std::sync::Arc;

use crate::budget;
use crate::capacity::{Capacity, EngineQuery, PassModel, Shape, Worker};
use crate::config::{Mode, PlannerConfig, Target};
use crate::fpm_model::FpmModel;
use crate::predict::{ExternalSeries, Predictor, Unsupported};
use crate::types::{EngineCaps, Fpm, Scheduled, Snapshot, Traffic};

/// One role's engines as the planner sizes them.
#[derive(Clone)]
pub struct RoleEngines {
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

impl std::fmt::Debug for RoleEngines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoleEngines")
            .field("caps", &self.caps)
            .field("gpus_per_replica", &self.gpus_per_replica)
            .finish()
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
    /// The minimum endpoints take more GPUs than `max_num_gpus` (the Planner's startup check,
    /// `_validate_min_endpoint_budgets_at_startup`): GPUs required, the budget.
    Budget(i64, i64),
}

impl std::fmt::Display for SetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SetupError::Predictor(u) => u.fmt(f),
            SetupError::Mode(m) => write!(f, "planner mode '{m}' cannot replay: use agg or disagg"),
            SetupError::External(m) => f.write_str(m),
            SetupError::Budget(need, max) => write!(
                f,
                "minimum endpoint footprint requires {need} GPUs, exceeding max_gpu_budget={max} \
                 (max_num_gpus)"
            ),
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
    prefill: Option<RoleEngines>,
    /// Decode workers, or the aggregated ones.
    decode: RoleEngines,
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
    pub fn new(cfg: PlannerConfig, prefill: Option<RoleEngines>, decode: RoleEngines) -> Result<Planner, SetupError> {
        Planner::with_external(cfg, prefill, decode, None)
    }

    /// As [`Planner::new`]; `external` makes the forecaster of each series (0 = number of
    /// requests, 1 = ISL, 2 = OSL) for a `load_predictor` servesim does not implement (ARIMA,
    /// Prophet).
    /// It is called only when throughput scaling predicts with such a predictor.
    pub fn with_external(
        cfg: PlannerConfig,
        prefill: Option<RoleEngines>,
        decode: RoleEngines,
        external: Option<ExternalFactory<'_>>,
    ) -> Result<Planner, SetupError> {
        match cfg.mode {
            Mode::Prefill => return Err(SetupError::Mode("prefill")),
            Mode::Decode => return Err(SetupError::Mode("decode")),
            _ => {}
        }
        // The minimum endpoints must fit the GPU budget before the Planner starts (a worker wider
        // than max_num_gpus has no count the Planner could keep).
        let floor = |role: Option<&RoleEngines>, prefill: bool| {
            role.map_or(0, |r| cfg.min_endpoint_for(prefill).max(0) * r.gpus_per_replica.max(0))
        };
        let required = floor(prefill.as_ref(), true) + floor(Some(&decode), false);
        if cfg.max_gpu_budget >= 0 && required > cfg.max_gpu_budget {
            return Err(SetupError::Budget(required, cfg.max_gpu_budget));
        }
        let needs_model = cfg.enable_throughput_scaling || cfg.optimization_target == Target::Sla;
        let bootstrap = decode.model.is_some() && prefill.as_ref().is_none_or(|p| p.model.is_some());
        let predictor = |cfg: &PlannerConfig, series: usize| -> Result<Option<Predictor>, SetupError> {
            if !cfg.enable_throughput_scaling {
                return Ok(None);
            }
            let ext = match external {
                Some(make)
                    if matches!(
                        cfg.load_predictor,
                        crate::config::PredictorKind::Arima | crate::config::PredictorKind::Prophet
                    ) =>
                {
                    Some(make(cfg, series).map_err(SetupError::External)?)
                }
                _ => None,
            };
            Predictor::with_external(cfg, ext).map(Some).map_err(SetupError::Predictor)
        };
        let fitted = |role: &RoleEngines, worker: Worker| -> FpmModel {
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
    // Shared by both scalers (`throughput`, `load`): the fitted pass model, the GPU budget and
    // the replica guards.

    fn fpm(&self, worker: Worker) -> Option<&FpmModel> {
        match worker {
            Worker::Prefill => self.fpm_p.as_ref(),
            _ => self.fpm_d.as_ref(),
        }
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
}

/// An idle rank's snapshot.
pub fn idle_fpm(worker: u32, dp_rank: u32) -> Fpm {
    Fpm { worker, dp_rank, wall_time: 0.0, scheduled: Scheduled::default(), queued: Default::default() }
}
