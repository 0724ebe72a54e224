//! Lowering a read configuration into servesim's simulation: per-role engine arguments (in the
//! engine crate's flat JSON form, so they pass through the same checks as `--extra-engine-args`),
//! the topology, the workload and load mode, the SLA and the router.
//!
//! The KV cache of `capacity.type: default` is sized from GPU memory the way the reference does
//! (weights, activations at the token budget, NCCL and runtime overhead against the memory
//! fraction; `servesim_perf::memory`), for every timing type, so it needs the model and hardware
//! in the AIS data package even with `fixed` or `polynomial` timing.

use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};
use servesim_cluster::{RouterMode, Topology};
use servesim_engine::{ConfigEnv, SpecSchedule, WorkerArgs};
use servesim_perf::db::Dtype;
use servesim_replay::Sla;
use servesim_router::RouterConfig;
use servesim_workload::formats::WekaBasis;
use servesim_workload::{
    load_trace, Arrivals, LoadMode, SyntheticSpec, TraceFormat, TraceOptions, Workload, AISIMULATE_GROUP_SEED,
};

use crate::error::DeployError;
use crate::schema::{Capacity, Config, Engine, Load, Mode, RouterPolicy, Source, Timing, Worker};

/// One role's lowered engine: the arguments and what the report says about its timing.
#[derive(Clone, Debug)]
pub struct LoweredWorker {
    pub role: &'static str,
    /// Flat engine arguments (Dynamo's form, which has no scheduling intervals).
    pub args_json: Value,
    /// The scheduler's prefill intervals (vLLM's `prefill_schedule_interval`, SGLang's
    /// `prefill_decode_interval`), set on the engine once the arguments are read.
    pub intervals: (u32, u32),
    pub replicas: u32,
    pub gpus: u32,
    pub provenance: Value,
    /// The role's AIS timing configuration, whatever timing the workers use: the KV router's
    /// `ais` prefill load model reads it (the reference builds it from the engine and the
    /// role's worker even when they run fixed or polynomial timing).
    pub ais_config: Value,
    /// SGLang's host-loop replay (set on the engine once the arguments are read).
    pub host_loop: bool,
    /// The vision tower the worker hosts (native VL replay; set on the engine likewise).
    pub vision: Option<servesim_engine::config::VisionSettings>,
}

/// The engines of a configuration, before the workload is read.
#[derive(Clone, Debug)]
pub struct LoweredEngine {
    pub workers: Vec<LoweredWorker>,
}

/// The block size the backend uses when none is given (`resolve_block_size`).
pub fn default_block_size(backend: &str) -> u32 {
    match backend {
        "sglang" => 1,
        "trtllm" => 32,
        _ => 64,
    }
}

fn ais_config(engine: &Engine, w: &Worker, block_size: u32) -> Value {
    let p = &w.parallelism;
    let sharded = p.moe_tensor * p.moe_expert > 1;
    let mut c = Map::new();
    c.insert("model".into(), json!(engine.model));
    c.insert("system".into(), json!(w.hardware.as_deref().unwrap_or(&engine.hardware)));
    c.insert("backend".into(), json!(engine.backend));
    c.insert("worker_type".into(), json!(w.role));
    c.insert("backend_version".into(), json!(engine.backend_version));
    c.insert("tp".into(), json!(p.tensor));
    c.insert("pp".into(), json!(p.pipeline));
    if p.prefill_context != 1 {
        c.insert("cp_size".into(), json!(p.prefill_context));
    }
    if p.decode_context != 1 || p.decode_context_stated {
        c.insert("dcp".into(), json!(p.decode_context));
    }
    c.insert("attention_dp".into(), json!(p.attention_data));
    if sharded {
        c.insert("moe_tp_size".into(), json!(p.moe_tensor));
        c.insert("moe_ep_size".into(), json!(p.moe_expert));
    }
    c.insert("kv_block_size".into(), json!(block_size));
    // aisimulate's schedulers hand its provider sequence lengths that count the token being fed.
    c.insert("decode_context".into(), json!("sequence"));
    c.insert("nextn".into(), json!(engine.speculation.as_ref().map_or(0, |s| s.ais_nextn())));
    if let Some(verify) = engine.speculation.as_ref().and_then(|s| s.ais_speculation()) {
        c.insert("speculation".into(), verify);
    }
    // The model controls, a worker's own overriding the engine's.
    for (k, v) in engine.controls.iter().chain(&w.timing_controls) {
        c.insert(k.clone(), v.clone());
    }
    if let Some(paths) = w.systems_paths.as_ref().or(engine.systems_paths.as_ref()) {
        c.insert("systems_paths".into(), json!(paths));
    }
    Value::Object(c)
}

fn block_size_of(engine: &Engine, w: &Worker) -> u32 {
    w.block_size.unwrap_or_else(|| default_block_size(engine.backend))
}

fn worker_path(w: &Worker) -> String {
    format!("engine.workers.{}", w.role)
}

/// What one rank stores per token, as the reference's `estimate_kv_bytes_per_token` sizes KV
/// transfers and host offload: the model's KV geometry on the rank in bf16, or in the
/// configured `kvcache_quant_mode` — not in the checkpoint's own KV format, which only the
/// timing uses.
fn reference_kv_bytes(engine: &Engine, w: &Worker, est: &servesim_perf::Estimator) -> f64 {
    let mode = w.timing_controls.get("kvcache_quant_mode").or(engine.controls.get("kvcache_quant_mode"));
    let dtype = mode.and_then(Value::as_str).and_then(Dtype::parse).unwrap_or(Dtype::Bfloat16);
    est.kv_bytes_per_token() / est.layout.kv.bytes() * dtype.bytes()
}

/// Lowers one role to flat engine arguments. `transfer_bytes` is the KV transfer's size per
/// token when the engine resolved it for both roles.
fn lower_worker(engine: &Engine, w: &Worker, transfer_bytes: Option<u64>) -> Result<LoweredWorker, DeployError> {
    let here = worker_path(w);
    let block_size = block_size_of(engine, w);
    let vl = crate::vl::hosted(engine, w)?;
    let mut ais = ais_config(engine, w, block_size);
    if let Some(vl) = &vl {
        // The worker times its tower through the same estimator.
        for (k, v) in &vl.ais {
            ais[*k] = v.clone();
        }
    }
    let perf_err = |key: &str, e: servesim_perf::PerfError| DeployError::new(format!("{here}.{key}"), e.message);
    // The estimator is needed for the memory-sized KV cache, the model's context length and
    // `default` timing.
    let needs_model = matches!(w.timing, Timing::Default)
        || matches!(w.capacity, Capacity::Default { .. })
        || (engine.backend == "vllm" && w.context_length.is_none() && engine.context_length.is_none());
    let build_estimator = || {
        let cfg = servesim_perf::AisConfig::from_json("", &ais).map_err(|e| perf_err("timing", e))?;
        let est = servesim_perf::estimator(&cfg).map_err(|e| match e.message.strip_prefix("dcp: ") {
            // What the AIS config calls `dcp` is this role's `parallelism.decode_context`.
            Some(why) => DeployError::new(format!("{here}.parallelism.decode_context"), why),
            None => perf_err("timing", e),
        })?;
        Ok::<_, DeployError>((cfg, est))
    };
    let (estimator, fpm) = match needs_model.then(build_estimator).transpose()? {
        // Under default timing, the collected FPM table the configuration selects (None:
        // op-level), read once for the KV cap and the provenance.
        Some((cfg, est)) if matches!(w.timing, Timing::Default) => {
            let fpm = servesim_perf::fpm_interp::for_worker(&cfg, &est).map_err(|e| perf_err("timing", e))?;
            (Some(est), fpm)
        }
        built => (built.map(|(_, est)| est), None),
    };
    // Kimi-K3's `nextn` graph is its DSPARK draft: the reference refuses an explicit mtp scheme
    // there (`engine.nextn` is the way in).
    if let (Some(est), Some(spec)) = (&estimator, &engine.speculation) {
        if est.model.kimi_k3.is_some()
            && matches!(spec.draft, crate::schema::engine::Draft::Mtp { .. })
            && spec.stated_by_block()
        {
            return Err(DeployError::new(
                "engine.speculation",
                format!(
                    "Explicit MTP modeling is unsupported for {}: its legacy nextn graph models DSPARK \
                     (give engine.nextn and engine.nextn_accepted instead)",
                    est.model.architecture
                ),
            ));
        }
    }
    let kv_bytes_per_rank = || -> Result<f64, DeployError> {
        match &estimator {
            Some(est) => Ok(reference_kv_bytes(engine, w, est)),
            None => Ok(reference_kv_bytes(engine, w, &build_estimator()?.1)),
        }
    };
    let mut a = Map::new();
    a.insert("engine_type".into(), json!(engine.backend));
    a.insert("worker_type".into(), json!(w.role));
    a.insert("block_size".into(), json!(block_size));
    a.insert("max_num_seqs".into(), json!(w.max_sequences));
    a.insert("max_num_batched_tokens".into(), json!(w.max_batched_tokens));
    if w.async_scheduling {
        a.insert("async_scheduling".into(), json!(true));
    }
    a.insert("enable_prefix_caching".into(), json!(w.prefix_caching));
    if w.host_loop || vl.is_some() {
        // The reference's SGLang reads its chunk budget from `max_batched_tokens` on this path only.
        a.insert("sglang".into(), json!({"chunked_prefill_size": w.max_batched_tokens}));
    }
    a.insert("startup_time".into(), json!(w.startup_seconds));
    a.insert("tensor_parallel_size".into(), json!(w.parallelism.tensor));
    a.insert("dp_size".into(), json!(w.parallelism.attention_data));
    if w.parallelism.pipeline != 1 {
        a.insert("aic_pp_size".into(), json!(w.parallelism.pipeline));
    }
    if w.parallelism.prefill_context != 1 {
        a.insert("aic_cp_size".into(), json!(w.parallelism.prefill_context));
    }
    let blocks = match &w.capacity {
        Capacity::Blocks(b) => *b,
        Capacity::Bytes(bytes) => {
            let per = w.bytes_per_token.expect("checked when read") * block_size as u64;
            bytes / per
        }
        Capacity::Default { memory_fraction, cuda_graph_reserved_bytes } => {
            let est = estimator.as_ref().expect("built for default capacity");
            let cap = servesim_perf::memory::kv_capacity_for(
                est,
                *memory_fraction,
                w.max_batched_tokens as u64,
                Some(w.max_sequences),
                block_size,
                // A hosted vision tower's weights and embedding cache stay outside the pool.
                vl.as_ref().map_or(0.0, |v| v.weights_bytes + v.cache_bytes as f64) + *cuda_graph_reserved_bytes as f64,
            )
            .map_err(|e| perf_err("kv_cache.capacity", e))?;
            // As the reference: a memory-sized cache under FPM interpolation is capped at the
            // table's highest collected decode KV total (it never schedules past its table).
            match &fpm {
                Some(t) => t
                    .cap_blocks(cap.blocks, block_size)
                    .map_err(|why| DeployError::new(format!("{here}.kv_cache.capacity"), why))?,
                None => cap.blocks,
            }
        }
    };
    if blocks == 0 || blocks > u32::MAX as u64 {
        return Err(DeployError::new(
            format!("{here}.kv_cache.capacity"),
            format!("the KV cache holds {blocks} blocks of {block_size} tokens; it must hold at least one (and fewer than 2^32)"),
        ));
    }
    a.insert("num_gpu_blocks".into(), json!(blocks));
    let context = w.context_length.or(engine.context_length);
    if let Some(c) = context {
        a.insert("max_model_len".into(), json!(c));
    } else if engine.backend == "vllm" {
        let est = estimator.as_ref().expect("built for the model's context length");
        a.insert("max_model_len".into(), json!(est.model.max_position));
    }
    let (timing, provenance) = match &w.timing {
        Timing::Fixed { prefill_ms, decode_ms } => (
            json!({"type": "fixed", "prefill_ms": prefill_ms, "decode_ms": decode_ms}),
            json!({"data_version": null, "data_version_unavailable_reason": "configured timing does not use performance data", "estimator": "fixed", "timing_source": "configured"}),
        ),
        Timing::Polynomial => (
            json!({"type": "polynomial"}),
            json!({"data_version": null, "data_version_unavailable_reason": "configured timing does not use performance data", "estimator": "polynomial", "timing_source": "configured"}),
        ),
        Timing::Default => {
            // The estimator that runs (the reference gives a table no data version).
            let provenance = match fpm {
                Some(_) => json!({"data_version": null,
                    "data_version_unavailable_reason": "selected estimator does not expose a data version",
                    "estimator": "fpm_interpolation", "timing_source": "ais", "config": &ais}),
                None => json!({"estimator": "op_level", "timing_source": "ais", "config": &ais}),
            };
            (json!({"type": "external", "provider": "ais", "config": &ais}), provenance)
        }
    };
    a.insert("timing_model".into(), timing);
    if let Some(spec) = &engine.speculation {
        a.insert("aic_nextn".into(), json!(spec.nextn));
        let rates: Vec<String> = spec.accept_rates().iter().map(f64::to_string).collect();
        a.insert("aic_nextn_accept_rates".into(), json!(rates.join(",")));
        if let Some(seed) = spec.seed {
            a.insert("aic_mtp_seed".into(), json!(seed));
        }
    }
    if let (Some(c), false) = (engine.enable_chunked_prefill, w.role == "decode") {
        a.insert("enable_chunked_prefill".into(), json!(c));
    }
    if let Some(t) = &engine.kv_transfer {
        if let Some(b) = t.bandwidth_gb_per_second {
            a.insert("kv_transfer_bandwidth".into(), json!(b));
        }
        a.insert("kv_transfer_timing_mode".into(), json!(t.timing_mode));
        let per_token = match (t.bytes_per_token, transfer_bytes) {
            (Some(n), _) => n,
            // "auto": what one prefill rank stores per token (both roles take the prefill's).
            (None, Some(n)) => n,
            (None, None) => kv_bytes_per_rank()?.round() as u64,
        };
        a.insert("kv_bytes_per_token".into(), json!(per_token));
    }
    if let Some(offload) = &w.offload {
        // What a host transfer moves per token: the configured size, or the model's KV bytes
        // per token on one rank (as the reference's `estimate_kv_bytes_per_token`).
        let per_token = match w.bytes_per_token {
            Some(n) => n,
            None => kv_bytes_per_rank()?.round() as u64,
        };
        a.insert("kv_cache_bytes_per_token".into(), json!(per_token));
        let mut host = offload.host.clone();
        if host["scope"] == "cluster_shared" {
            // Ranks share a host pool only when the KV they store is laid out alike: the
            // reference names the layout by the model, backend, parallelism and block geometry.
            let layout = json!({
                "backend": engine.backend,
                "backend_version": engine.backend_version,
                "block_size": a.get("block_size"),
                "bytes_per_token": per_token,
                "model": engine.model,
                "pp": w.parallelism.pipeline,
                "tp": w.parallelism.tensor,
            });
            host["kv_layout_id"] = json!(layout.to_string());
        }
        a.insert("native_host_offload".into(), host);
        if let Some(g3) = &offload.g3 {
            a.insert("g3_offload".into(), g3.clone());
        }
    }
    if let Some(state) = &w.state_cache {
        let bytes = state.bytes_per_request.expect("sized by state_size::resolve");
        a.insert("state_cache".into(), json!({"bytes_per_request": bytes}));
        if let Some(unit) = state.prefix_match_unit {
            a.insert("prefix_match_unit".into(), json!(unit));
        }
        a.insert("kv_cache_bytes_per_token".into(), json!(w.bytes_per_token));
    }
    Ok(LoweredWorker {
        role: w.role,
        args_json: Value::Object(a),
        intervals: (w.prefill_schedule_interval, w.prefill_decode_interval),
        replicas: w.parallelism.replicas,
        gpus: w.parallelism.gpus(),
        provenance,
        ais_config: ais,
        host_loop: w.host_loop,
        vision: vl.map(|v| v.settings),
    })
}

pub fn lower_engine(engine: &Engine) -> Result<LoweredEngine, DeployError> {
    let roles: Vec<&Worker> = match engine.mode {
        Mode::Aggregated => vec![engine.aggregated.as_ref().expect("checked when read")],
        Mode::Disaggregated => vec![
            engine.prefill.as_ref().expect("checked when read"),
            engine.decode.as_ref().expect("checked when read"),
        ],
        Mode::Afd => {
            return Err(DeployError::new(
                "engine.mode",
                "afd runs as its own foreground engine (servesim predict -c); it has no regular workers to lower",
            ))
        }
    };
    // The reference sizes a KV transfer by the prefill worker, for both roles: by its state
    // cache's token bytes (configured or sized with the state), else by the model.
    let transfer_bytes = match (&engine.kv_transfer, engine.prefill.as_ref()) {
        (Some(t), Some(p)) if t.bytes_per_token.is_none() && p.state_cache.is_some() => {
            crate::state_size::resolve(engine, p)?.bytes_per_token
        }
        (Some(t), Some(p)) if t.bytes_per_token.is_none() => {
            let cfg = servesim_perf::AisConfig::from_json("", &ais_config(engine, p, block_size_of(engine, p)))
                .map_err(|e| DeployError::new(format!("{}.timing", worker_path(p)), e.message))?;
            let est = servesim_perf::estimator(&cfg)
                .map_err(|e| DeployError::new(format!("{}.timing", worker_path(p)), e.message))?;
            Some(reference_kv_bytes(engine, p, &est).round() as u64)
        }
        _ => None,
    };
    let workers = roles
        .into_iter()
        .map(|w| lower_worker(engine, &crate::state_size::resolve(engine, w)?, transfer_bytes))
        .collect::<Result<_, _>>()?;
    Ok(LoweredEngine { workers })
}

/// Engine arguments with external timing models resolved by servesim-perf.
pub fn worker_args(w: &LoweredWorker) -> Result<WorkerArgs, DeployError> {
    let factory = servesim_perf::timer_factory();
    let no_files = |p: &str| -> Result<Vec<u8>, String> {
        Err(format!("{p}: timing profiles are not read from the unified config"))
    };
    // aisimulate's replay roles: its speculative schedule, ngram drafts included.
    let env = ConfigEnv { files: &no_files, timers: Some(&factory), spec_schedule: SpecSchedule::Aisimulate };
    let mut args = WorkerArgs::from_value_env(&w.args_json, env)
        .map_err(|e| DeployError::new(format!("engine.workers.{}", w.role), format!("{e}")))?;
    // Checked against the backend when read.
    (args.engine.prefill_schedule_interval, args.engine.prefill_decode_interval) =
        (u64::from(w.intervals.0), u64::from(w.intervals.1));
    // aisimulate's SGLang prefill worker caches a prompt while its KV moves.
    args.engine.sglang.cache_held_prompts = true;
    // Its decode: pages join the cache when a request finishes; retraction in SGLang's order.
    args.engine.sglang.cache_decoded_pages = false;
    args.engine.sglang.retract_in_sglang_order = true;
    // Its KV transfer times are exact, not whole nanoseconds.
    args.deployment.kv_transfer.whole_ns = false;
    args.engine.sglang.host_loop = w.host_loop;
    args.engine.sglang.vision = w.vision;
    Ok(args)
}

pub fn topology(lowered: &LoweredEngine) -> Result<Topology, DeployError> {
    let t = match lowered.workers.as_slice() {
        [agg] => Topology::aggregated(worker_args(agg)?, agg.replicas),
        // aisimulate's engine lets each role keep its own block size (Dynamo's replay does not).
        [p, d] => Topology::disaggregated_own_block_sizes((worker_args(p)?, p.replicas), (worker_args(d)?, d.replicas)),
        _ => unreachable!("one or two roles"),
    };
    t.map_err(|e| DeployError::new("engine.workers", e.message))
}

/// The workload and load mode. `base` is the configuration file's directory: trace paths are
/// relative to it.
pub fn workload(cfg: &Config, base: &Path, block_size: u32) -> Result<(Workload, LoadMode), DeployError> {
    let t = &cfg.traffic;
    match &t.source {
        Source::Trace { paths, format, block_size: tb, nested_timestamp_basis } => {
            let fmt = TraceFormat::parse(format).expect("formats are checked when read");
            let files: Vec<PathBuf> = paths
                .iter()
                .map(|p| if Path::new(p).is_absolute() { PathBuf::from(p) } else { base.join(p) })
                .collect();
            for (i, f) in files.iter().enumerate() {
                if !f.exists() {
                    return Err(DeployError::new(
                        format!("traffic.source.paths[{i}]"),
                        format!("{} does not exist", f.display()),
                    ));
                }
            }
            let mut opts = TraceOptions::new(fmt);
            opts.trace_block_size = *tb;
            match t.load {
                Load::Concurrency(c) => opts.replay_concurrency = Some(c),
                Load::TraceTimestamps { speedup, agentic_lanes, ref agentic_snapshot } => {
                    opts.arrival_speedup_ratio = speedup;
                    opts.agentic_lanes = agentic_lanes;
                    opts.agentic_snapshot = agentic_snapshot.clone();
                }
                _ => unreachable!("checked when read"),
            }
            if matches!(*format, "agentic_mooncake" | "weka" | "dynamo") {
                opts.execution_model = Some(cfg.engine.model.clone());
            }
            opts.weka_basis = nested_timestamp_basis.map(|b| match b {
                "absolute" => WekaBasis::Absolute,
                "relative" => WekaBasis::Relative,
                _ => WekaBasis::Auto,
            });
            load_trace(&files, &opts).map_err(|e| DeployError::new("traffic.source", e))
        }
        source => {
            let (input, output, turns, ratio, groups, delay, cached) = match source {
                Source::Synthetic { input_tokens, output_tokens, cached_prefix_tokens } => {
                    (*input_tokens, *output_tokens, 1, 0.0, 0, 0.0, *cached_prefix_tokens)
                }
                Source::Session {
                    new_input_tokens,
                    output_tokens,
                    turns,
                    shared_prefix_ratio,
                    prefix_groups,
                    inter_turn_delay_ms,
                } => (
                    *new_input_tokens,
                    *output_tokens,
                    *turns,
                    *shared_prefix_ratio,
                    *prefix_groups,
                    *inter_turn_delay_ms,
                    0,
                ),
                Source::Trace { .. } => unreachable!(),
            };
            let (arrivals, load, seed) = match t.load {
                Load::Concurrency(c) => (Arrivals::AllAtOnce, LoadMode::Concurrency { max_sessions: c }, 42),
                Load::Poisson { rate, seed } => {
                    (Arrivals::Poisson { rate_per_s: rate }, LoadMode::Timestamps { speedup: 1.0 }, seed)
                }
                Load::ConstantRate { rate } => {
                    (Arrivals::Interval { interval_ms: 1000.0 / rate }, LoadMode::Timestamps { speedup: 1.0 }, 42)
                }
                Load::TraceTimestamps { .. } => unreachable!("checked when read"),
            };
            let spec = SyntheticSpec {
                input_tokens: input,
                output_tokens: output,
                sessions: t.stop.count.expect("synthetic traffic has a count stop"),
                turns_per_session: turns,
                arrivals,
                seed,
                shared_prefix_ratio: ratio,
                num_prefix_groups: groups,
                inter_turn_delay_ms: delay,
                block_tokens: block_size,
                group_seed: AISIMULATE_GROUP_SEED,
                cached_prefix_tokens: cached,
                // A session's later turns carry its history (aisimulate's synthetic-session).
                accumulate: matches!(source, Source::Session { .. }),
                images: match crate::vl::of_config(cfg)? {
                    Some(v) => Some(v.images),
                    None => crate::encpool::images(cfg)?,
                },
            };
            spec.validate().map_err(|e| DeployError::new("traffic", e))?;
            // Arrivals or think times past what the clock holds precisely: named by their key.
            spec.check_times(1.0).map_err(|e| {
                let rate =
                    if turns > 1 { "traffic.load.sessions_per_second" } else { "traffic.load.requests_per_second" };
                match e.field.as_deref() {
                    Some("inter-turn-delay-ms") => DeployError::new("traffic.source.inter_turn_delay_ms", &e.message),
                    // The flag form words a constant rate as an interval: here it is a rate.
                    Some("request-rate" | "arrival-interval-ms") => {
                        let rest = e.message.trim_start_matches("is too large: ").trim_start_matches("is too small: ");
                        DeployError::new(rate, format!("is too small: {rest}"))
                    }
                    _ => DeployError::new("traffic", &e.message),
                }
            })?;
            Ok((Workload::Synthetic(spec), load))
        }
    }
}

/// Seed of generated tokens and arrivals.
pub fn seed(cfg: &Config) -> u64 {
    match cfg.traffic.load {
        Load::Poisson { seed, .. } => seed,
        _ => 42,
    }
}

pub fn sla(cfg: &Config) -> Sla {
    Sla { ttft_ms: cfg.sla.ttft_ms, itl_ms: cfg.sla.itl_ms, e2e_ms: cfg.sla.e2e_ms }
}

/// SGLang's frontend stages on the worker that computes prompts (aggregated or prefill), if it
/// has them (a `host_profile` is resolved into them when the configuration is read).
pub fn frontend_stages(engine: &crate::schema::Engine) -> Vec<servesim_replay::FrontendStage> {
    let worker = engine.aggregated.as_ref().or(engine.prefill.as_ref());
    worker.and_then(|w| w.frontend.as_ref()).map(|f| f.stages.clone()).unwrap_or_default()
}

pub fn router(cfg: &Config) -> RouterMode {
    match &cfg.router {
        RouterPolicy::RoundRobin => RouterMode::RoundRobin,
        RouterPolicy::KvRouter { overlap_score_credit, prefill_load_scale, temperature, ais_load_model } => {
            let mut r = RouterConfig {
                overlap_score_credit: *overlap_score_credit,
                prefill_load_scale: *prefill_load_scale,
                temperature: *temperature,
                ..RouterConfig::default()
            };
            if *ais_load_model {
                r.prefill_load_model = servesim_router::PrefillLoadModel::Ais;
            }
            RouterMode::KvRouter(r)
        }
    }
}

/// What a role's KV cache holds against the longest sequence it must take (the recommend
/// search's KV-feasibility filter, aisimulate's `model_hw.parallel_configs_for`): the capacity in
/// tokens, sized at a per-pass token budget of `max_batched_tokens` for `capacity.type: default`,
/// and the context length (the role's, the engine's, or the model's); no tokens when the weights
/// and activations leave no KV budget. `None` when the capacity cannot be estimated here (the
/// trial then reports why when it lowers).
pub fn kv_tokens(engine: &Engine, w: &Worker, max_batched_tokens: u64) -> Option<(u64, u64)> {
    let block_size = w.block_size.unwrap_or_else(|| default_block_size(engine.backend));
    let estimator = || {
        let cfg = servesim_perf::AisConfig::from_json("", &ais_config(engine, w, block_size)).ok()?;
        servesim_perf::estimator(&cfg).ok()
    };
    let mut est = None;
    let tokens = match &w.capacity {
        Capacity::Blocks(b) => b * block_size as u64,
        Capacity::Bytes(bytes) => bytes / w.bytes_per_token?,
        Capacity::Default { memory_fraction, cuda_graph_reserved_bytes } => {
            est = Some(estimator()?);
            match servesim_perf::memory::kv_capacity_for(
                est.as_ref().expect("built"),
                *memory_fraction,
                max_batched_tokens,
                Some(w.max_sequences),
                block_size,
                *cuda_graph_reserved_bytes as f64,
            ) {
                Ok(cap) => cap.tokens,
                // Weights and activations fill the GPU: no KV cache at all, which the filter
                // treats as too short (the reference drops such a shape from the pool).
                Err(e) if e.message.starts_with(servesim_perf::memory::NO_KV_BUDGET) => 0,
                Err(_) => return None,
            }
        }
    };
    let context = match w.context_length.or(engine.context_length) {
        Some(c) => c as u64,
        None => {
            if est.is_none() {
                est = Some(estimator()?);
            }
            est.as_ref().expect("built").model.max_position as u64
        }
    };
    Some((tokens, context))
}
