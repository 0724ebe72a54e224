//! The tick loop of the planner against scripted snapshots.

use std::sync::Arc;

use serde_json::json;

use crate::*;

fn caps(max_kv: u64) -> EngineCaps {
    EngineCaps {
        max_num_batched_tokens: 8192,
        max_num_seqs: 256,
        max_kv_tokens: max_kv,
        context_length: 40960,
        dp_size: 1,
    }
}

fn role(max_kv: u64, gpus: i64, model: Option<Arc<dyn PassModel + Send + Sync>>) -> RoleEngines {
    RoleEngines { caps: caps(max_kv), gpus_per_replica: gpus, model, nextn: 0 }
}

fn fpm(worker: u32, sched_kv: u32, queued_prefill: u32) -> Fpm {
    Fpm {
        worker,
        scheduled: Scheduled { num_decode_requests: 1, sum_decode_kv_tokens: sched_kv, ..Default::default() },
        queued: Queued { sum_prefill_tokens: queued_prefill, ..Default::default() },
        ..Default::default()
    }
}

fn agg_snapshot(n: u32, util_kv: u32) -> Snapshot {
    Snapshot {
        active_decode: (0..n).collect(),
        decode_fpms: (0..n).map(|w| fpm(w, util_kv, 0)).collect(),
        ..Default::default()
    }
}

#[test]
fn ticks_run_on_the_scale_interval_and_loops_when_due() {
    struct Flat;
    impl PassModel for Flat {
        fn forward_pass_ms(&self, _: &[Scheduled]) -> Result<f64, String> {
            Ok(10.0)
        }
    }
    let cfg = PlannerConfig::from_json(&json!({
        "mode": "agg", "optimization_target": "sla", "enable_load_scaling": true,
        "throughput_adjustment_interval_seconds": 15, "load_adjustment_interval_seconds": 5,
        "load_predictor": "constant"
    }))
    .unwrap();
    let mut p = Planner::new(cfg, None, role(100_000, 2, Some(Arc::new(Flat)))).unwrap();
    let mut seen = Vec::new();
    for _ in 0..6 {
        let at = p.next_tick_s();
        let t = p.on_tick(&Snapshot { now_s: at, ..agg_snapshot(1, 0) });
        seen.push((t.at_s, t.run_load_scaling, t.run_throughput_scaling));
    }
    assert_eq!(
        seen,
        vec![
            (5.0, true, false),
            (10.0, true, false),
            (15.0, true, true),
            (20.0, true, false),
            (25.0, true, false),
            (30.0, true, true)
        ]
    );
}

#[test]
fn easy_agg_load_target_steps_one_replica_per_tick_within_the_budget() {
    // target load: up at ≥ 90 % KV, down at ≤ 70 %; TP2 replicas under a 6-GPU budget (3 max).
    let cfg = PlannerConfig::from_json(&json!({
        "mode": "agg", "optimization_target": "load", "max_gpu_budget": 6,
        "decode_scale_up_kv_rate": 90, "decode_scale_down_kv_rate": 70
    }))
    .unwrap();
    let mut p = Planner::new(cfg, None, role(1000, 2, None)).unwrap();
    // One engine at 95 %: scale up to 2.
    let t = p.on_tick(&agg_snapshot(1, 950));
    assert_eq!((t.target_prefill, t.target_decode), (Some(0), Some(2)));
    assert_eq!(t.diagnostics.load_decision_reason.as_deref(), Some("scale_up"));
    // Still at 1 worker when the next tick comes: scaling in progress, nothing decided.
    let t = p.on_tick(&agg_snapshot(1, 950));
    assert_eq!(t.target_decode, None);
    assert_eq!(t.diagnostics.load_decision_reason.as_deref(), Some("scaling_in_progress"));
    // Two workers, one hot: 3.
    let t = p.on_tick(&agg_snapshot(2, 950));
    assert_eq!(t.target_decode, Some(3));
    // Three hot workers: the 6-GPU ceiling holds them.
    let t = p.on_tick(&agg_snapshot(3, 950));
    assert_eq!(t.target_decode, None);
    assert_eq!(t.diagnostics.load_decision_reason.as_deref(), Some("gpu_budget_guard_hold"));
    // All at 50 %: a step down would put 50 % · 3/2 = 75 % on the survivors, below 90 %: down.
    let t = p.on_tick(&agg_snapshot(3, 500));
    assert_eq!(t.target_decode, Some(2));
    // Two at 65 %: 65 % · 2/1 = 130 % ≥ 90 %: consolidation is refused.
    let t = p.on_tick(&agg_snapshot(2, 650));
    assert_eq!(t.target_decode, None);
    // Between the thresholds: no change.
    let t = p.on_tick(&agg_snapshot(2, 800));
    assert_eq!(t.target_decode, None);
    assert_eq!(t.diagnostics.load_decision_reason.as_deref(), Some("no_change"));
}

#[test]
fn a_worker_count_mismatch_blocks_load_scaling() {
    let cfg = PlannerConfig::from_json(&json!({
        "mode": "agg", "optimization_target": "load",
        "decode_scale_up_kv_rate": 90, "decode_scale_down_kv_rate": 70
    }))
    .unwrap();
    let mut p = Planner::new(cfg, None, role(1000, 1, None)).unwrap();
    let mut s = agg_snapshot(2, 990);
    s.decode_fpms.pop();
    let t = p.on_tick(&s);
    assert_eq!(t.target_decode, None);
    assert_eq!(t.diagnostics.load_decision_reason.as_deref(), Some("worker_count_mismatch"));
}

#[test]
fn load_scaling_waits_while_a_worker_is_starting() {
    // The replay adapter's worker counts: a role whose non-draining count (active + starting)
    // differs from its ready count is still scaling, even once the requested target is reached.
    let cfg = PlannerConfig::from_json(&json!({
        "mode": "agg", "optimization_target": "load",
        "decode_scale_up_kv_rate": 90, "decode_scale_down_kv_rate": 70
    }))
    .unwrap();
    let mut p = Planner::new(cfg, None, role(1000, 1, None)).unwrap();
    assert_eq!(p.on_tick(&agg_snapshot(1, 950)).target_decode, Some(2));
    // The new worker is starting: the target (2 non-draining) is reached, 1 is ready.
    let starting = Snapshot { starting_decode: vec![1], ..agg_snapshot(1, 950) };
    let t = p.on_tick(&starting);
    assert_eq!(t.target_decode, None);
    assert_eq!(t.diagnostics.load_decision_reason.as_deref(), Some("scaling_in_progress"));
    // Ready: decisions resume.
    assert_eq!(p.on_tick(&agg_snapshot(2, 950)).target_decode, Some(3));
}

#[test]
fn sla_without_a_hardware_model_starts_the_fit_empty() {
    // No AIS model to bootstrap from: the fitted models start empty, so the SLA loops answer
    // "insufficient data" / "model not ready" until the observed passes fill them.
    let cfg = PlannerConfig::from_json(&json!({
        "mode": "agg", "optimization_target": "sla", "enable_load_scaling": true,
        "throughput_adjustment_interval_seconds": 10, "load_adjustment_interval_seconds": 5,
        "load_predictor": "constant", "load_min_observations": 5
    }))
    .unwrap();
    let mut p = Planner::new(cfg, None, role(100_000, 1, None)).unwrap();
    let t = p.on_tick(&agg_snapshot(1, 500));
    assert_eq!(t.diagnostics.load_decision_reason.as_deref(), Some("insufficient_data"));
    let busy = Snapshot {
        traffic: Traffic { duration_s: 10.0, num_req: 100.0, avg_isl: 1000.0, avg_osl: 100.0, ..Default::default() },
        ..agg_snapshot(1, 500)
    };
    let t = p.on_tick(&busy);
    assert!(t.run_throughput_scaling);
    assert_eq!(t.diagnostics.throughput_decision_reason.as_deref(), Some("model_not_ready"));
    assert_eq!((t.target_prefill, t.target_decode), (None, None));
}

#[test]
fn easy_disagg_throughput_target_scales_prefill_on_queue_depth() {
    // target throughput: prefill up when a queue holds ≥ one context (40960 tokens), down
    // when all hold < 10 %; decode up when KV > 100 %, down when all < 60 %.
    let cfg = PlannerConfig::from_json(&json!({"optimization_target": "throughput", "max_gpu_budget": 16})).unwrap();
    let mut p = Planner::new(cfg, Some(role(100_000, 2, None)), role(100_000, 2, None)).unwrap();
    let snap = |np: u32, queued: u32, kv: u32| Snapshot {
        active_prefill: (0..np).collect(),
        active_decode: vec![0],
        prefill_fpms: (0..np).map(|w| fpm(w, 0, queued)).collect(),
        decode_fpms: vec![fpm(0, kv, 0)],
        ..Default::default()
    };
    let t = p.on_tick(&snap(1, 50_000, 70_000));
    assert_eq!((t.target_prefill, t.target_decode), (Some(2), Some(1)));
    // Decode at 50 % with one worker cannot go lower; prefill queues under 4096 tokens: 2 → 1.
    let t = p.on_tick(&snap(2, 1000, 50_000));
    assert_eq!((t.target_prefill, t.target_decode), (Some(1), Some(1)));
    let t = p.on_tick(&snap(1, 5000, 50_000));
    assert_eq!((t.target_prefill, t.target_decode), (None, None));
}

/// A model whose pass time is 0.1 ms per prefill token plus 1 ms per decode request.
struct Linear;

impl PassModel for Linear {
    fn forward_pass_ms(&self, ranks: &[Scheduled]) -> Result<f64, String> {
        Ok(ranks.iter().map(|r| 0.1 * r.sum_prefill_tokens as f64 + r.num_decode_requests as f64).fold(0.0, f64::max))
    }
}

#[test]
fn throughput_scaling_sizes_replicas_from_predicted_demand() {
    let cfg = PlannerConfig::from_json(&json!({
        "optimization_target": "sla", "ttft_ms": 1000, "itl_ms": 100, "load_predictor": "constant",
        "throughput_adjustment_interval_seconds": 60, "max_gpu_budget": 64, "max_throughput_scaling_replicas": 3
    }))
    .unwrap();
    assert!(cfg.enable_throughput_scaling && !cfg.enable_load_scaling);
    let model: Arc<dyn PassModel + Send + Sync> = Arc::new(Linear);
    let mut p =
        Planner::new(cfg, Some(role(1_000_000, 1, Some(model.clone()))), role(1_000_000, 1, Some(model))).unwrap();
    let window = Traffic {
        duration_s: 5.0,
        num_req: 50.0,
        avg_isl: 4000.0,
        avg_osl: 100.0,
        shape_count: 50.0,
        ..Default::default()
    };
    let snap = Snapshot { active_prefill: vec![0], active_decode: vec![0], traffic: window, ..Default::default() };
    // Ticks at 5..55 s only merge traffic; the one at 60 s consumes 12 windows: 600 requests
    // in 60 s = 10 rps.
    for _ in 0..11 {
        let t = p.on_tick(&snap);
        assert!(!t.run_throughput_scaling && t.target_prefill.is_none());
    }
    let t = p.on_tick(&snap);
    assert!(t.run_throughput_scaling);
    let w = t.traffic.unwrap();
    assert_eq!((w.duration_s, w.num_req), (60.0, 600.0));
    // Prefill: isl 4000 → batch ≤ ⌊8192/4000⌋ = 2; a prompt token takes 0.1 ms, so
    // rps = b / (0.4 b s) = 2.5 for both (TTFT 400 / 800 ms, within 1000 ms).
    assert!((t.diagnostics.engine_rps_prefill.unwrap() - 2.5).abs() < 1e-9);
    // Decode: ctx 4050; itl = b ms; rps = b / (100 · b ms) = 10 for every b (ITL ≤ 100 ms).
    assert!((t.diagnostics.engine_rps_decode.unwrap() - 10.0).abs() < 1e-9);
    // 10 rps: prefill ⌈10/2.5⌉ = 4 (1 + 3, within the ±3 cap), decode ⌈10/10⌉ = 1.
    assert_eq!((t.target_prefill, t.target_decode), (Some(4), Some(1)));
    assert_eq!(t.diagnostics.throughput_decision_reason.as_deref(), Some("scale"));
    // Five times the demand (still 1 + 1 workers): prefill wants 20 and decode 5; the ±3 cap
    // allows 4 each.
    let busy = Snapshot { traffic: Traffic { num_req: 250.0, ..window }, ..snap.clone() };
    for _ in 0..11 {
        p.on_tick(&busy);
    }
    let t = p.on_tick(&busy);
    assert_eq!((t.target_prefill, t.target_decode), (Some(4), Some(4)));
    assert_eq!(t.diagnostics.predicted_num_req, Some(250.0 * 12.0));
}

#[test]
fn arima_is_refused_only_when_throughput_scaling_predicts() {
    let sla = PlannerConfig::from_json(&json!({"mode": "agg", "optimization_target": "sla"})).unwrap();
    let model: Arc<dyn PassModel + Send + Sync> = Arc::new(Linear);
    let e = Planner::new(sla, None, role(1000, 1, Some(model))).unwrap_err();
    assert!(e.to_string().contains("'arima' is not supported"), "{e}");
    // Easy targets never predict: the default predictor is harmless there.
    let easy = PlannerConfig::from_json(&json!({"mode": "agg", "optimization_target": "latency"})).unwrap();
    assert!(Planner::new(easy, None, role(1000, 1, None)).is_ok());
}

#[test]
fn ready_workers_outside_the_budget_are_scaled_into_it_at_the_next_tick() {
    // Throughput scaling every 600 s (not due for the first ticks), load scaling off: only the
    // budget boundary acts. 22 one-GPU replicas against max_gpu_budget 8.
    struct Flat;
    impl PassModel for Flat {
        fn forward_pass_ms(&self, _: &[Scheduled]) -> Result<f64, String> {
            Ok(10.0)
        }
    }
    let cfg = PlannerConfig::from_json(&json!({
        "mode": "agg", "optimization_target": "sla", "enable_load_scaling": false,
        "throughput_adjustment_interval_seconds": 600, "load_adjustment_interval_seconds": 5,
        "load_predictor": "constant", "max_gpu_budget": 8
    }))
    .unwrap();
    let mut p = Planner::new(cfg, None, role(100_000, 1, Some(Arc::new(Flat)))).unwrap();
    let t = p.on_tick(&agg_snapshot(22, 0));
    assert_eq!((t.at_s, t.run_throughput_scaling), (5.0, false));
    assert_eq!((t.target_prefill, t.target_decode), (Some(0), Some(8)));
    // Until the pool reaches 8 the target is pending: no second decision.
    assert_eq!(p.on_tick(&agg_snapshot(22, 0)).target_decode, None);
    assert_eq!(p.on_tick(&agg_snapshot(8, 0)).target_decode, None);
    assert_eq!(p.on_tick(&agg_snapshot(8, 0)).target_decode, None);

    // Workers still starting defer it; a pool inside the band is left alone.
    let cfg = PlannerConfig::from_json(&json!({
        "mode": "agg", "optimization_target": "sla", "enable_load_scaling": false,
        "throughput_adjustment_interval_seconds": 600, "load_adjustment_interval_seconds": 5,
        "load_predictor": "constant", "max_gpu_budget": 8
    }))
    .unwrap();
    let mut p = Planner::new(cfg, None, role(100_000, 2, Some(Arc::new(Flat)))).unwrap();
    let starting = Snapshot { starting_decode: vec![5], ..agg_snapshot(5, 0) };
    assert_eq!(p.on_tick(&starting).target_decode, None);
    assert_eq!(p.on_tick(&agg_snapshot(4, 0)).target_decode, None, "4 × 2 GPUs fit");
    // 5 TP2 replicas are 10 GPUs: down to ⌊8 / 2⌋ = 4.
    assert_eq!(p.on_tick(&agg_snapshot(5, 0)).target_decode, Some(4));
}

#[test]
fn minimum_endpoints_wider_than_the_gpu_budget_are_refused_at_startup() {
    // One 16-GPU worker under max_gpu_budget 8: no replica count fits (a replay would otherwise
    // scale the pool to no worker at all); disaggregated, the two floors add up.
    let agg = PlannerConfig::from_json(&json!({"mode": "agg", "enable_load_scaling": true})).unwrap();
    let e = Planner::new(agg.clone(), None, role(1000, 16, None)).unwrap_err();
    assert_eq!(e.to_string(), "minimum endpoint footprint requires 16 GPUs, exceeding max_gpu_budget=8 (max_num_gpus)");
    assert!(Planner::new(agg, None, role(1000, 8, None)).is_ok());
    let disagg = PlannerConfig::from_json(&json!({"mode": "disagg", "enable_load_scaling": true})).unwrap();
    let e = Planner::new(disagg.clone(), Some(role(1000, 4, None)), role(1000, 8, None)).unwrap_err();
    assert_eq!(e.to_string(), "minimum endpoint footprint requires 12 GPUs, exceeding max_gpu_budget=8 (max_num_gpus)");
    assert!(Planner::new(disagg, Some(role(1000, 4, None)), role(1000, 4, None)).is_ok());
}
