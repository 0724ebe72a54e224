//! The planner in the loop: [`servesim_planner::Planner`] as the replay's [`Autoscaler`], and
//! the record of what it did (ticks, scaling events, worker lifecycle) for the report.

use serde_json::{json, Value};
use servesim_planner::{Planner, Snapshot, Tick};

use crate::sim::{Autoscaler, LifecycleOp, ScaleDecision};

/// One change of a pool's target size.
#[derive(Clone, Debug, PartialEq)]
pub struct ScalingEvent {
    pub at_s: f64,
    /// `agg`, `prefill` or `decode`.
    pub component: &'static str,
    pub from_count: usize,
    pub to_count: usize,
}

/// The planner and what it did during one run.
pub struct PlannerRun {
    planner: Planner,
    ticks: Vec<Value>,
    pub events: Vec<ScalingEvent>,
    lifecycle: Vec<Value>,
    /// (time s, non-draining prefill workers, non-draining decode workers) after each change.
    pub timeline: Vec<(f64, usize, usize)>,
    initial: (usize, usize),
    /// The reference's ARIMA or Prophet predictor, when the run uses it.
    arima: Option<crate::planner_python::PythonPredictor>,
}

fn opt(x: Option<f64>) -> Value {
    x.map_or(Value::Null, |v| json!(v))
}

impl PlannerRun {
    /// `initial` is the (prefill, decode) worker count at time 0 (prefill 0 when aggregated).
    pub fn new(planner: Planner, initial: (usize, usize)) -> PlannerRun {
        PlannerRun {
            planner,
            ticks: Vec::new(),
            events: Vec::new(),
            lifecycle: Vec::new(),
            timeline: vec![(0.0, initial.0, initial.1)],
            initial,
            arima: None,
        }
    }

    /// Whether it scales one pool of aggregated workers (not prefill and decode pools).
    pub fn is_agg(&self) -> bool {
        self.planner.is_agg()
    }

    /// The planner `cfg` describes, sized against `topology`'s engines (their forward passes
    /// as `model` gives them). Errs when the planner's mode does not match the cluster.
    pub fn for_topology(
        cfg: servesim_planner::PlannerConfig,
        topology: &servesim_cluster::Topology,
        model: impl Fn(
            &servesim_engine::EngineConfig,
        ) -> Option<std::sync::Arc<dyn servesim_planner::PassModel + Send + Sync>>,
    ) -> Result<PlannerRun, String> {
        let disaggregated = topology.is_disaggregated();
        let wants = cfg.mode == servesim_planner::Mode::Disagg;
        if disaggregated != wants {
            return Err(format!(
                "mode {:?} does not match the cluster ({})",
                if wants { "disagg" } else { "agg" },
                if disaggregated {
                    "prefill and decode workers: use mode disagg"
                } else {
                    "aggregated workers: use mode agg"
                }
            ));
        }
        let (prefill, decode) = roles(topology, model);
        let initial = match topology.pools() {
            [agg] => (0, agg.workers as usize),
            [p, d, ..] => (p.workers as usize, d.workers as usize),
            [] => (0, 0),
        };
        // ARIMA and Prophet forecasts come from the reference's own predictors, run through Python.
        let arima = std::cell::RefCell::new(crate::planner_python::PythonPredictor::new());
        let make = |cfg: &servesim_planner::PlannerConfig, series: usize| arima.borrow_mut().series(cfg, series);
        let planner = Planner::with_external(cfg, prefill, decode, Some(&make)).map_err(|e| e.to_string())?;
        let arima = arima.into_inner();
        let mut run = PlannerRun::new(planner, initial);
        run.arima = arima.description.is_some().then_some(arima);
        Ok(run)
    }

    pub fn total_ticks(&self) -> usize {
        self.ticks.len()
    }

    /// Which load predictor ran, and whose code: servesim's own (constant, Kalman), or the
    /// reference's ARIMA through Python (with the versions). Null when throughput scaling is off.
    fn predictor_json(&self) -> Value {
        let cfg = self.planner.config();
        if !cfg.enable_throughput_scaling {
            return Value::Null;
        }
        let name = cfg.load_predictor.name();
        match &self.arima {
            Some(a) => json!({
                "name": name,
                "log1p": cfg.load_predictor_log1p,
                "implementation": a.description,
            }),
            None => json!({"name": name, "log1p": cfg.load_predictor_log1p, "implementation": "servesim"}),
        }
    }

    /// The report's `planner` object.
    pub fn to_json(&self) -> Value {
        let cfg = self.planner.config();
        json!({
            "metadata": {
                "mode": if self.planner.is_agg() { "agg" } else { "disagg" },
                "optimization_target": cfg.optimization_target.name(),
                "scale_interval_seconds": cfg.scale_interval_seconds,
                "initial_workers": {"prefill": self.initial.0, "decode": self.initial.1},
                "load_predictor": self.predictor_json(),
            },
            "ticks": self.ticks,
            "scaling_events": self.events.iter().map(|e| json!({
                "at_s": e.at_s,
                "component": e.component,
                "from_count": e.from_count,
                "to_count": e.to_count,
                "reason": if e.to_count > e.from_count { "scale_up" } else { "scale_down" },
            })).collect::<Vec<_>>(),
            "lifecycle_operations": self.lifecycle,
            "total_ticks": self.ticks.len(),
        })
    }

    fn record(&mut self, snap: &Snapshot, t: &Tick, current: (usize, usize)) {
        let d = &t.diagnostics;
        let traffic = t.traffic.map(|w| {
            json!({
                "duration_s": w.duration_s, "num_req": w.num_req, "isl": w.avg_isl, "osl": w.avg_osl,
                "kv_hit_rate": w.avg_kv_hit_rate, "ttft_ms": w.avg_ttft_ms, "itl_ms": w.avg_itl_ms,
            })
        });
        let fpms = |f: &[servesim_planner::Fpm]| -> Vec<Value> {
            f.iter()
                .map(|f| {
                    json!({
                        "worker_id": f.worker, "dp_rank": f.dp_rank, "wall_time": f.wall_time,
                        "scheduled": {
                            "num_prefill_requests": f.scheduled.num_prefill_requests,
                            "sum_prefill_tokens": f.scheduled.sum_prefill_tokens,
                            "sum_prefill_kv_tokens": f.scheduled.sum_prefill_kv_tokens,
                            "num_decode_requests": f.scheduled.num_decode_requests,
                            "sum_decode_kv_tokens": f.scheduled.sum_decode_kv_tokens,
                        },
                        "queued": {
                            "num_prefill_requests": f.queued.num_prefill_requests,
                            "sum_prefill_tokens": f.queued.sum_prefill_tokens,
                            "num_decode_requests": f.queued.num_decode_requests,
                            "sum_decode_kv_tokens": f.queued.sum_decode_kv_tokens,
                        },
                    })
                })
                .collect()
        };
        self.ticks.push(json!({
            "ordinal": t.ordinal,
            "at_ms": t.at_s * 1000.0,
            "run_load_scaling": t.run_load_scaling,
            "run_throughput_scaling": t.run_throughput_scaling,
            "input": {
                "traffic": traffic,
                "fpm_observations": {"prefill": fpms(&snap.prefill_fpms), "decode": fpms(&snap.decode_fpms)},
                "worker_counts": {"prefill": current.0, "decode": current.1},
            },
            "topology": {
                "prefill": {"active": snap.active_prefill, "starting": snap.starting_prefill, "draining": snap.draining_prefill},
                "decode": {"active": snap.active_decode, "starting": snap.starting_decode, "draining": snap.draining_decode},
            },
            "effects": {
                "diagnostics": {
                    "predicted_num_req": opt(d.predicted_num_req),
                    "predicted_isl": opt(d.predicted_isl),
                    "predicted_osl": opt(d.predicted_osl),
                    "predicted_kv_hit_rate": opt(d.predicted_kv_hit_rate),
                    "engine_rps_prefill": opt(d.engine_rps_prefill),
                    "engine_rps_decode": opt(d.engine_rps_decode),
                    "estimated_ttft_ms": opt(d.estimated_ttft_ms),
                    "estimated_itl_ms": opt(d.estimated_itl_ms),
                    "load_decision_reason": d.load_decision_reason,
                    "throughput_decision_reason": d.throughput_decision_reason,
                    "throughput_lower_bound_prefill": d.throughput_lower_bound_prefill,
                    "throughput_lower_bound_decode": d.throughput_lower_bound_decode,
                },
            },
            "runtime_decision": {
                "target_prefill": t.target_prefill,
                "target_decode": t.target_decode,
                "next_tick_ms": t.next_tick_s * 1000.0,
            },
        }));
    }
}

impl Autoscaler for PlannerRun {
    fn first_tick_ms(&mut self) -> Option<f64> {
        Some(self.planner.next_tick_s() * 1000.0)
    }

    fn on_tick(&mut self, _ordinal: u64, snap: &Snapshot) -> ScaleDecision {
        let current_p = snap.active_prefill.len() + snap.starting_prefill.len();
        let current_d = snap.active_decode.len() + snap.starting_decode.len();
        let t = self.planner.on_tick(snap);
        self.record(snap, &t, (current_p, current_d));
        let agg = self.planner.is_agg();
        let to_usize = |x: i64| x.max(0) as usize;
        let mut decision = ScaleDecision { next_tick_ms: Some(t.next_tick_s * 1000.0), ..ScaleDecision::default() };
        let (mut p, mut d) = (current_p, current_d);
        if let Some(td) = t.target_decode.map(to_usize).filter(|&td| td != current_d) {
            self.events.push(ScalingEvent {
                at_s: t.at_s,
                component: if agg { "agg" } else { "decode" },
                from_count: current_d,
                to_count: td,
            });
            decision.target_decode = Some(td);
            d = td;
        }
        if !agg {
            if let Some(tp) = t.target_prefill.map(to_usize).filter(|&tp| tp != current_p) {
                // The reference lists a tick's prefill event before its decode event.
                let at = self.events.len() - usize::from(decision.target_decode.is_some());
                self.events.insert(
                    at,
                    ScalingEvent { at_s: t.at_s, component: "prefill", from_count: current_p, to_count: tp },
                );
                decision.target_prefill = Some(tp);
                p = tp;
            }
        }
        if (p, d) != (current_p, current_d) {
            self.timeline.push((t.at_s, p, d));
        }
        decision
    }

    /// The reference's ARIMA or Prophet predictor failed mid-run: the forecasts after it would
    /// be stand-ins, not the reference's, so the run stops instead of reporting them.
    fn error(&self) -> Option<String> {
        let why = self.arima.as_ref()?.failure()?;
        let family = match self.planner.config().load_predictor {
            servesim_planner::config::PredictorKind::Prophet => "Prophet",
            _ => "ARIMA",
        };
        Some(format!("the {family} load predictor (Dynamo's, through Python) failed: {why}"))
    }

    fn lifecycle(&mut self, op: &LifecycleOp) {
        self.lifecycle.push(json!({
            "at_ms": op.at_ms,
            "pool": op.pool,
            "worker_id": op.worker,
            "transition": op.transition.name(),
            "planner_tick_ordinal": op.tick,
        }));
    }
}

/// The planner's view of a cluster's pools: (prefill role, decode or aggregated role), with
/// engine limits and GPUs per replica from the topology and the forward-pass model `model`
/// gives for an engine.
pub fn roles(
    topology: &servesim_cluster::Topology,
    model: impl Fn(&servesim_engine::EngineConfig) -> Option<std::sync::Arc<dyn servesim_planner::PassModel + Send + Sync>>,
) -> (Option<servesim_planner::RoleEngines>, servesim_planner::RoleEngines) {
    let role = |spec: &servesim_cluster::PoolSpec| {
        let e = spec.rank_engine();
        let dp = spec.deployment.dp_size.max(1);
        servesim_planner::RoleEngines {
            caps: servesim_planner::EngineCaps {
                max_num_batched_tokens: e.max_num_batched_tokens.unwrap_or(8192) as u64,
                max_num_seqs: e.max_num_seqs.unwrap_or(256) as u64,
                max_kv_tokens: e.kv_capacity_tokens() * dp as u64,
                context_length: e.max_model_len.unwrap_or(0) as u64,
                dp_size: dp,
            },
            gpus_per_replica: spec.deployment.gpus_per_worker() as i64,
            model: model(&spec.engine),
            nextn: e.speculative.as_ref().map_or(0, |s| u64::from(s.nextn)),
        }
    };
    match topology.pools() {
        [agg] => (None, role(agg)),
        [prefill, decode, ..] => (Some(role(prefill)), role(decode)),
        [] => unreachable!("a topology has a pool"),
    }
}
