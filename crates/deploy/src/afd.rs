//! `engine.mode: afd` under `predict -c`: the attention and FFN pools' per-layer times from the
//! AIS op model (`servesim_perf::afd`), the per-GPU memory check of both pools (a topology that
//! does not fit is refused with the reference's out_of_memory words), the microbatch pipeline and batch schedule of the AFD
//! foreground engine (`servesim_cluster::afd`), and the reference's `prediction.json` for it
//! (`{"afd_replay": …, "summary": …}`).

use serde_json::{json, Map, Value};
use servesim_cluster::afd::{pass_time, schedule_both, LayerTimes};
use servesim_perf::afd::{
    decode_layer_times, decode_memory, out_of_memory, prefill_layer_times, prefill_memory, Pools, Shape,
};
use servesim_perf::{AisConfig, Estimator};
use std::sync::Arc;

use crate::error::DeployError;
use crate::schema::{Config, Load, Source};

fn estimator(config: &Config, tp: u32, moe_tp: u32, moe_ep: u32) -> Result<Arc<Estimator>, DeployError> {
    let e = &config.engine;
    let raw = json!({
        "model": e.model,
        "system": e.hardware,
        "backend": e.backend,
        "backend_version": e.backend_version,
        "tp": tp,
        "pp": 1,
        "attention_dp": 1,
        "moe_tp_size": moe_tp,
        "moe_ep_size": moe_ep,
    });
    let cfg = AisConfig::from_json("", &raw).map_err(|err| DeployError::new("engine", err.message))?;
    servesim_perf::estimator(&cfg).map_err(|err| DeployError::new("engine", err.message))
}

fn times(t: servesim_perf::afd::LayerTimes) -> LayerTimes {
    LayerTimes {
        attention_ms: t.attention_ms,
        ffn_ms: t.ffn_ms,
        a_to_f_ms: t.a_to_f_ms,
        f_to_a_ms: t.f_to_a_ms,
        num_layers: t.num_layers,
    }
}

/// What the reference's candidate build of an AFD topology yields: the pools' per-layer times,
/// measured by the op model, and what the replay then needs.
struct Measured<'a> {
    afd: &'a crate::schema::afd::Afd,
    isl: u32,
    osl: u32,
    slots: u32,
    count: u32,
    shape: Shape,
    ffn_tp: u32,
    prefill: LayerTimes,
    decode: LayerTimes,
}

/// How an AFD failure the reference classes as out of memory begins.
pub const OUT_OF_MEMORY: &str = "out_of_memory";

/// How an AFD failure the reference classes as a failed measurement begins: a pool the op model
/// cannot time (e.g. attention heads that do not split over the FFN pool's width).
pub const INVALID_MEASUREMENT: &str = "invalid_measurement";

/// A pool's timing failure in the reference's category (`e` keeps servesim's reason).
fn unmeasured(e: DeployError) -> DeployError {
    DeployError::new(
        "engine.afd",
        format!("{INVALID_MEASUREMENT}: servesim's op model could not measure the AFD candidate: {}", e.message),
    )
}

/// The reference's words for a topology that does not fit the GPUs (its `phase` is `both`, the
/// only phase servesim predicts).
fn out_of_memory_message(config: &Config) -> String {
    let e = &config.engine;
    format!(
        "{OUT_OF_MEMORY}: the model '{}' does not fit in GPU memory on '{}' with this AFD topology (phase=both); \
         widen tp_a or the F pool (which widens the F-replica under Phase 1 F-DP=1), lower a_batch_size, or use a \
         system with more VRAM per GPU. Check engine.context_length: the default uses the model's full context. A \
         smaller context limit can reduce KV memory; verify it still covers the workload.",
        e.model, e.hardware
    )
}

/// The reason a recommend candidate gets when its build fails with `e`: the reference's
/// `AFDInfeasible: <category>: <message>` for what it classes (out of memory, a failed
/// measurement), else `e`.
pub fn build_failure(e: &DeployError) -> String {
    if e.key == "engine.afd" && [OUT_OF_MEMORY, INVALID_MEASUREMENT].iter().any(|c| e.message.starts_with(c)) {
        format!("candidate build failed: AFDInfeasible: {}", e.message)
    } else {
        format!("candidate build failed: {e}")
    }
}

/// Checks an AFD configuration and measures its topology as the reference's candidate build does
/// (`predict` without the replay): an error here is a candidate the reference fails to build.
pub fn measure_only(config: &Config) -> Result<(), DeployError> {
    measure(config).map(|_| ())
}

fn measure(config: &Config) -> Result<Measured<'_>, DeployError> {
    let afd = config.engine.afd.as_ref().ok_or_else(|| DeployError::new("engine.afd", "missing (required)"))?;
    let (isl, osl) = match config.traffic.source {
        Source::Synthetic { cached_prefix_tokens: p, .. } if p > 0 => {
            return Err(DeployError::new(
                "traffic.source.cached_prefix_tokens",
                "cached_prefix_tokens is unsupported for AFD",
            ))
        }
        Source::Synthetic { input_tokens, output_tokens, .. } => (input_tokens, output_tokens),
        _ => {
            return Err(DeployError::new(
                "traffic.source",
                "AFD prediction requires fixed-length synthetic request traffic",
            ))
        }
    };
    let slots =
        match config.traffic.load {
            Load::Concurrency(c) => c,
            _ => return Err(DeployError::new(
                "traffic.load",
                "AFD under a rate load is not supported by servesim yet (the AFD schedule takes a concurrency load)",
            )),
        };
    if config.traffic.stop.max_virtual_time_seconds.is_some() {
        return Err(DeployError::new(
            "traffic.stop.max_virtual_time_seconds",
            "AFD engine replay does not yet support max_sim_time_ms",
        ));
    }
    if config.planner.is_some() {
        return Err(DeployError::new("planner", "the planner scales regular worker pools; AFD has none"));
    }
    let count = config.traffic.stop.count.unwrap_or(100);

    // The system's node size decides the FFN pool's width and which attention widths fit.
    let at = |e: servesim_perf::PerfError| DeployError::new("engine", e.message);
    let roots = servesim_perf::systems::systems_roots(&[]).map_err(at)?;
    let gpus_per_node = servesim_perf::systems::find_system(&roots, &config.engine.hardware).map_err(at)?.gpus_per_node;
    if gpus_per_node % afd.tp_a != 0 {
        return Err(DeployError::new(
            "engine.afd.tp_a",
            format!("tp_a={} must divide gpus_per_node={gpus_per_node}", afd.tp_a),
        ));
    }
    let attention = estimator(config, afd.tp_a, afd.tp_a, 1).map_err(unmeasured)?;
    let ffn_tp = afd.n_f_nodes * gpus_per_node;
    let ep = afd.f_moe_ep_size;
    let experts = attention.model.experts;
    if experts == 0 && ep != 1 {
        return Err(DeployError::new("engine.afd.f_moe_ep_size", "dense AFD topologies require f_moe_ep_size=1"));
    }
    if ffn_tp % ep != 0 {
        return Err(DeployError::new(
            "engine.afd.f_moe_ep_size",
            format!("f_moe_ep_size={ep} must divide ffn_tp={ffn_tp}"),
        ));
    }
    if experts > 0 && experts % ep != 0 {
        return Err(DeployError::new(
            "engine.afd.f_moe_ep_size",
            format!("f_moe_ep_size={ep} must divide num_experts={experts}"),
        ));
    }
    let ffn = estimator(config, ffn_tp, ffn_tp / ep, ep).map_err(unmeasured)?;
    let shape = Shape {
        n_a_nodes: afd.n_a_nodes,
        n_f_nodes: afd.n_f_nodes,
        gpus_per_node,
        tp_a: afd.tp_a,
        f_moe_ep_size: ep,
        a_batch_size: afd.a_batch_size,
        num_microbatches: afd.num_microbatches,
        boundary_on_attn: afd.boundary_on_attn,
    };
    let pools = Pools { attention: &attention, ffn: &ffn };
    let at = |e: servesim_perf::PerfError| DeployError::new("engine.afd", e.message);
    let timing = |e: servesim_perf::PerfError| unmeasured(at(e));
    let prefill = times(prefill_layer_times(&pools, &shape, isl, 0).map_err(timing)?);
    let decode = times(decode_layer_times(&pools, &shape, isl, osl).map_err(timing)?);
    // Each request's KV is sized for the whole context the engine serves (the model's unless
    // engine.context_length limits it), as the reference's candidate build sizes it.
    let context = config.engine.context_length.or(Some(attention.model.max_position).filter(|&n| n > 0));
    let memory = [
        prefill_memory(&pools, &shape, isl, context).map_err(at)?,
        decode_memory(&pools, &shape, isl, osl, context).map_err(at)?,
    ];
    if out_of_memory(&pools, &memory) {
        return Err(DeployError::new("engine.afd", out_of_memory_message(config)));
    }
    Ok(Measured { afd, isl, osl, slots, count, shape, ffn_tp, prefill, decode })
}

/// Predicts a pure AFD deployment (`phase: both`): the reference's prediction document.
pub fn predict(config: &Config) -> Result<Value, DeployError> {
    let Measured { afd, isl, osl, slots, count, shape, ffn_tp, prefill, decode } = measure(config)?;
    let p = pass_time(&prefill, afd.pipeline, afd.num_microbatches, afd.comm_overhead_factor);
    let d = pass_time(&decode, afd.pipeline, afd.num_microbatches, afd.comm_overhead_factor);

    let workers = shape.attention_workers();
    let total_batch = workers * afd.a_batch_size;
    let capacity = total_batch.min(slots).max(1);
    let arrivals = vec![0.0; count as usize];
    let run = schedule_both(&arrivals, capacity, Some(slots), p.step_ms, d.step_ms, osl);
    let total_gpus = workers * afd.tp_a + ffn_tp;
    let intervals = |t: &LayerTimes| 4 * t.num_layers as u64 * afd.num_microbatches as u64;
    let decode_passes = osl.saturating_sub(1) as u64;
    let stage_intervals = run.batches * (intervals(&prefill) + decode_passes * intervals(&decode));

    let n = run.requests.len() as f64;
    let first = run.requests.iter().map(|r| r.arrival_ms).fold(f64::INFINITY, f64::min);
    let end = run.requests.iter().map(|r| r.end_ms).fold(0.0, f64::max);
    let duration_ms = end - first;
    let ttft: Vec<f64> = run.requests.iter().map(|r| r.first_token_ms - r.arrival_ms).collect();
    let tpot: Vec<f64> = run
        .requests
        .iter()
        .map(|r| if decode_passes > 0 { (r.end_ms - r.first_token_ms) / decode_passes as f64 } else { 0.0 })
        .collect();
    let e2e: Vec<f64> = run.requests.iter().map(|r| r.end_ms - r.arrival_ms).collect();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / n;
    let (input, output) = (n * isl as f64, n * osl as f64);
    let seconds = duration_ms / 1000.0;
    let mean_tpot = mean(&tpot);
    let mut s = Map::new();
    for (k, v) in [
        ("duration_ms", duration_ms),
        ("num_requests", n),
        ("total_input_tokens", input),
        ("total_output_tokens", output),
        ("request_throughput_rps", n / seconds),
        ("input_throughput_tok_s", input / seconds),
        ("output_throughput_tok_s", output * 1000.0 / duration_ms),
        ("total_throughput_tok_s", (input + output) / seconds),
        ("gpu_hours", total_gpus as f64 * duration_ms / 3_600_000.0),
        ("num_ttft_samples", n),
        ("num_tpot_samples", if osl > 1 { n } else { 0.0 }),
        ("num_e2e_latency_samples", n),
        ("mean_ttft_ms", mean(&ttft)),
        ("mean_tpot_ms", mean_tpot),
        ("mean_e2e_latency_ms", mean(&e2e)),
        ("mean_output_token_throughput_per_user", if mean_tpot > 0.0 { 1000.0 / mean_tpot } else { 0.0 }),
        ("completed_requests", n),
        ("error_rate", 0.0),
        ("num_total_gpus", total_gpus as f64),
    ] {
        s.insert(k.into(), json!(v));
    }
    let sla = &config.sla;
    if sla.ttft_ms.is_some() || sla.itl_ms.is_some() || sla.e2e_ms.is_some() {
        let within = |bound: Option<f64>, x: f64| bound.is_none_or(|b| x <= b);
        let good = (0..ttft.len())
            .filter(|&i| within(sla.ttft_ms, ttft[i]) && within(sla.itl_ms, tpot[i]) && within(sla.e2e_ms, e2e[i]))
            .count() as f64;
        s.insert("goodput_completed_requests".into(), json!(good));
        s.insert("goodput_request_throughput_rps".into(), json!(good / seconds));
        s.insert("goodput_output_throughput_tok_s".into(), json!(good * osl as f64 / seconds));
    }
    s.insert("power_w".into(), Value::Null);
    s.insert("power_coverage".into(), Value::Null);
    s.insert(
        "prediction_provenance".into(),
        json!({"runner": {"unavailable_reason": "runner did not report effective timing provenance"}}),
    );
    let layer = |t: &LayerTimes, pass: &servesim_cluster::afd::PassTime| {
        json!({"attention_ms": t.attention_ms, "ffn_ms": t.ffn_ms, "a_to_f_ms": t.a_to_f_ms, "f_to_a_ms": t.f_to_a_ms,
               "num_layers": t.num_layers, "step_ms": pass.step_ms, "cycle_ms": pass.cycle_ms,
               "effective_pipeline_model": pass.effective.name(), "communication_hidden": pass.communication_hidden})
    };
    Ok(json!({
        "afd_replay": {
            "afd_passes": run.passes,
            "afd_stage_intervals": stage_intervals,
            "batch_capacity": capacity,
            "batches": run.batches,
            "companion": null,
            "deployment_mode": "afd",
            "executor": "afd_foreground",
            "phase": "both",
        },
        "afd_layers": {"prefill": layer(&prefill, &p), "decode": layer(&decode, &d)},
        "summary": Value::Object(s),
    }))
}
