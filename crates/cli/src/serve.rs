//! `servesim serve`: parse Dynamo mocker's flags into the live server's options.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use serde_json::{Map, Value};
use servesim_cluster::Topology;
use servesim_engine::{Role, WorkerArgs};
use servesim_live::{load_tokenizer, ServeOptions};

use crate::failure::Failure;
use crate::flags::calibration::FlagCalibration;
use crate::flags::json_arg;
use crate::flags::router::{router_mode, Router};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum EngineType {
    Vllm,
    Sglang,
    Trtllm,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Preemption {
    Lifo,
    Fifo,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DisaggregationMode {
    Agg,
    Prefill,
    Decode,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    ais: crate::flags::ais::AisFlags,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1", help_heading = "Server")]
    host: String,
    /// Port of the frontend (all workers, routed).
    #[arg(long, default_value_t = 8000, help_heading = "Server")]
    port: u16,
    /// Worker i also serves the same API on its own port, base + i.
    #[arg(long, value_name = "PORT", help_heading = "Server")]
    worker_base_port: Option<u16>,
    /// Local model directory: tokenizer.json (token counts and text), the chat template in
    /// tokenizer_config.json, and config.json (KV bytes per token, context length).
    #[arg(long, value_name = "DIR", help_heading = "Model")]
    model_path: Option<PathBuf>,
    /// Name clients use in `model` (default: the model directory's name).
    #[arg(long, value_name = "NAME", help_heading = "Model")]
    model_name: Option<String>,
    /// Context length (prompt plus output) requests are checked against (default: the engine's
    /// max_model_len, else config.json's max_position_embeddings, else 32768).
    #[arg(long, value_name = "TOKENS", help_heading = "Model")]
    max_model_len: Option<u32>,
    /// Seed of generated tokens.
    #[arg(long, default_value_t = 0, help_heading = "Model")]
    seed: u64,
    /// Seconds a client has to send a request's headers (from connecting, or from the
    /// request's first byte).
    #[arg(
        long,
        default_value_t = 10.0,
        value_name = "SECONDS",
        allow_negative_numbers = true,
        help_heading = "Server"
    )]
    header_timeout: f64,
    /// Seconds a client has to send a request's body once its headers are in (408 after).
    #[arg(
        long,
        default_value_t = 30.0,
        value_name = "SECONDS",
        allow_negative_numbers = true,
        help_heading = "Server"
    )]
    body_timeout: f64,
    /// Seconds a kept-alive connection may wait for its next request.
    #[arg(
        long,
        default_value_t = 60.0,
        value_name = "SECONDS",
        allow_negative_numbers = true,
        help_heading = "Server"
    )]
    idle_timeout: f64,
    /// Seconds a client may take none of a response's bytes; then the connection is closed
    /// and a stream's request aborted (its KV freed).
    #[arg(
        long,
        default_value_t = 30.0,
        value_name = "SECONDS",
        allow_negative_numbers = true,
        help_heading = "Server"
    )]
    write_timeout: f64,
    // The doc comment is the --help text, printed as written: `[DONE]` is the SSE terminator,
    // not a link.
    #[allow(rustdoc::broken_intra_doc_links)]
    /// On SIGINT/SIGTERM: seconds in-flight responses may go on before they are cut (a second
    /// signal cuts them at once). A cut stream ends with an error event and [DONE], and the
    /// process then exits 1 instead of 0. Connections with no request in flight close at once.
    #[arg(
        long,
        default_value_t = 30.0,
        value_name = "SECONDS",
        allow_negative_numbers = true,
        help_heading = "Server"
    )]
    shutdown_timeout: f64,
    /// Most engine ranks a /metrics scrape lists one series set each (about 22 KB a rank);
    /// with more, the scrape sums them into one set labelled engine="all", worker_id="all"
    /// (counters, histograms and running/waiting summed, KV usage averaged). Each worker's own
    /// port (--worker-base-port) applies the same cap to its ranks.
    #[arg(
        long,
        default_value_t = servesim_live::metrics::DEFAULT_METRICS_MAX_RANKS as u32,
        value_name = "N",
        help_heading = "Server"
    )]
    metrics_max_ranks: u32,

    #[arg(long, value_enum, help_heading = "Engine")]
    engine_type: Option<EngineType>,
    /// KV blocks per data-parallel rank.
    #[arg(long, value_name = "N", help_heading = "Engine")]
    num_gpu_blocks_override: Option<u32>,
    #[arg(long, value_name = "TOKENS", help_heading = "Engine")]
    block_size: Option<u32>,
    #[arg(long, value_name = "N", help_heading = "Engine")]
    max_num_seqs: Option<u32>,
    #[arg(long, value_name = "N", help_heading = "Engine")]
    max_num_batched_tokens: Option<u32>,
    #[arg(long, overrides_with = "no_enable_prefix_caching", help_heading = "Engine")]
    enable_prefix_caching: bool,
    #[arg(long, help_heading = "Engine")]
    no_enable_prefix_caching: bool,
    #[arg(long, overrides_with = "no_enable_chunked_prefill", help_heading = "Engine")]
    enable_chunked_prefill: bool,
    #[arg(long, help_heading = "Engine")]
    no_enable_chunked_prefill: bool,
    #[arg(long, value_enum, help_heading = "Engine")]
    preemption_mode: Option<Preemption>,
    /// Divides every modelled duration; 0 means no delays at all.
    #[arg(long, value_name = "X", allow_negative_numbers = true, help_heading = "Engine")]
    speedup_ratio: Option<f64>,
    /// Extra divisor of decode time (speculative decoding).
    #[arg(long, value_name = "X", allow_negative_numbers = true, help_heading = "Engine")]
    decode_speedup_ratio: Option<f64>,
    /// Attention data-parallel ranks per worker, each with its own scheduler and KV cache.
    #[arg(long, value_name = "N", help_heading = "Engine")]
    data_parallel_size: Option<u32>,
    /// Seconds before the workers serve (/health is 503 until then).
    #[arg(long, value_name = "SECONDS", help_heading = "Engine")]
    startup_time: Option<f64>,
    /// Thinking tokens: {"start_thinking_token_id": N, "end_thinking_token_id": N, "thinking_ratio": R}.
    #[arg(long, value_name = "JSON", help_heading = "Engine")]
    reasoning: Option<String>,
    /// Engine configuration (inline JSON or a file, Dynamo's MockEngineArgs); its keys override
    /// the individual engine flags.
    #[arg(long, value_name = "JSON|PATH", help_heading = "Engine")]
    extra_engine_args: Option<String>,
    /// A calibration file from `servesim calibrate`: its fitted pass corrections apply to the
    /// workers' AIS timing, and its frontend cost is waited before each request reaches a
    /// worker, so the mock's latencies follow the measured deployment's.
    #[arg(long, value_name = "FILE", help_heading = "Engine")]
    calibration: Option<PathBuf>,

    /// Independent workers in this process.
    #[arg(long, value_name = "N", help_heading = "Workers")]
    num_workers: Option<u32>,
    /// Seconds between worker starts (-1: automatic, as Dynamo).
    #[arg(
        long,
        default_value_t = 0.0,
        value_name = "SECONDS",
        allow_negative_numbers = true,
        help_heading = "Workers"
    )]
    stagger_delay: f64,
    #[arg(long, value_enum, default_value = "round_robin", help_heading = "Workers")]
    router_mode: Router,
    /// KV router configuration (Dynamo's KvRouterConfig keys): inline JSON or a file.
    #[arg(long, value_name = "JSON|PATH", help_heading = "Workers")]
    router_config: Option<String>,
    #[command(flatten)]
    router_load: crate::flags::ais::RouterLoadFlags,
    #[arg(long, default_value_t = 42, value_name = "SEED", help_heading = "Workers")]
    router_seed: u64,

    /// Role of this server's workers. `prefill` answers with one token and the
    /// `kv_transfer_params` a decode server needs; `decode` serves requests that carry them.
    /// Both roles in one process: --num-prefill-workers and --num-decode-workers.
    #[arg(long, value_enum, default_value = "agg", help_heading = "Disaggregated serving")]
    disaggregation_mode: DisaggregationMode,
    /// Disaggregated serving in this process: workers that compute prompts.
    #[arg(long, value_name = "N", help_heading = "Disaggregated serving")]
    num_prefill_workers: Option<u32>,
    /// Disaggregated serving in this process: workers that generate tokens.
    #[arg(long, value_name = "N", help_heading = "Disaggregated serving")]
    num_decode_workers: Option<u32>,
    /// KV transfer bandwidth between prefill and decode workers, GB/s (0: instant).
    #[arg(long, value_name = "GBPS", help_heading = "Disaggregated serving")]
    kv_transfer_bandwidth: Option<f64>,
    /// KV bytes per prompt token moved (default: from the model's config.json).
    #[arg(long, value_name = "BYTES", help_heading = "Disaggregated serving")]
    kv_bytes_per_token: Option<u64>,

    /// Per worker, comma-separated: base port of its ranks' ZMQ PUB sockets for KV events in
    /// vLLM's format (rank r binds base + r).
    #[arg(long, value_name = "PORTS", value_delimiter = ',', help_heading = "KV events")]
    zmq_kv_events_ports: Vec<u16>,
    /// Per worker: base port of the ZMQ ROUTER sockets that replay recent KV events.
    #[arg(long, value_name = "PORTS", value_delimiter = ',', help_heading = "KV events")]
    zmq_replay_ports: Vec<u16>,
    /// Event layout: `vllm` (positional arrays, as vLLM's msgspec structs encode them) or
    /// `named` (maps tagged by `type`, as Dynamo's mocker writes them).
    #[arg(long, value_enum, default_value = "vllm", help_heading = "KV events")]
    zmq_event_format: ZmqEventFormat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ZmqEventFormat {
    Vllm,
    Named,
}

fn flag_bool(on: bool, off: bool) -> Option<bool> {
    match (on, off) {
        (true, _) => Some(true),
        (_, true) => Some(false),
        _ => None,
    }
}

/// The worker arguments: individual flags, then `--extra-engine-args` on top.
fn worker_args(a: &ServeArgs, kv_bytes_from_model: Option<u64>) -> Result<WorkerArgs, Failure> {
    // Counts of 0 are refused here, naming the flag (the configuration would name its key).
    for (flag, v) in [
        ("num-gpu-blocks-override", a.num_gpu_blocks_override),
        ("max-num-seqs", a.max_num_seqs),
        ("max-num-batched-tokens", a.max_num_batched_tokens),
        ("data-parallel-size", a.data_parallel_size),
    ] {
        if v == Some(0) {
            return Err(Failure::input(format!("--{flag} must be at least 1")));
        }
    }
    if let Some(arg) = &a.extra_engine_args {
        extra_engine_args_shape(arg)?;
    }
    let mut flags = Map::new();
    let mut put = |k: &str, v: Option<Value>| {
        if let Some(v) = v {
            flags.insert(k.to_string(), v);
        }
    };
    put(
        "engine_type",
        a.engine_type.map(|t| {
            Value::from(match t {
                EngineType::Vllm => "vllm",
                EngineType::Sglang => "sglang",
                EngineType::Trtllm => "trtllm",
            })
        }),
    );
    // A NaN or infinity would become JSON null (unset) on the way into the configuration.
    let finite = |flag: &str, v: Option<f64>| match v {
        Some(x) if !x.is_finite() => Err(Failure::input(format!("--{flag} must be a finite number, got {x}"))),
        Some(x) if x < 0.0 => Err(Failure::input(format!("--{flag} must be ≥ 0, got {x}"))),
        v => Ok(v.map(Value::from)),
    };
    put("num_gpu_blocks", a.num_gpu_blocks_override.map(Value::from));
    put("block_size", a.block_size.map(Value::from));
    put("max_num_seqs", a.max_num_seqs.map(Value::from));
    put("max_num_batched_tokens", a.max_num_batched_tokens.map(Value::from));
    put("enable_prefix_caching", flag_bool(a.enable_prefix_caching, a.no_enable_prefix_caching).map(Value::from));
    put("enable_chunked_prefill", flag_bool(a.enable_chunked_prefill, a.no_enable_chunked_prefill).map(Value::from));
    put("preemption_mode", a.preemption_mode.map(|p| Value::from(if p == Preemption::Lifo { "lifo" } else { "fifo" })));
    put("speedup_ratio", finite("speedup-ratio", a.speedup_ratio)?);
    put("decode_speedup_ratio", finite("decode-speedup-ratio", a.decode_speedup_ratio)?);
    put("dp_size", a.data_parallel_size.map(Value::from));
    put("startup_time", finite("startup-time", a.startup_time)?);
    put("kv_transfer_bandwidth", finite("kv-transfer-bandwidth", a.kv_transfer_bandwidth)?);
    put("kv_bytes_per_token", a.kv_bytes_per_token.map(Value::from));
    let engine_name = match a.engine_type {
        Some(EngineType::Sglang) => "sglang",
        Some(EngineType::Trtllm) => "trtllm",
        _ => "vllm",
    };
    put(
        "timing_model",
        a.ais.timing_model(a.model_path.as_deref().and_then(|p| p.to_str()), engine_name, "aggregated")?,
    );
    if let Some(r) = &a.reasoning {
        let v: Value =
            serde_json::from_str(r).map_err(|e| Failure::input(format!("--reasoning: invalid JSON: {e}")))?;
        flags.insert("reasoning".into(), v);
    }
    let given = !flags.is_empty();
    let mut value = Value::Object(flags);
    if let Some(arg) = &a.extra_engine_args {
        let extra: Value = json_arg("extra-engine-args", arg, |text, _| {
            serde_json::from_str(text).map_err(|e| servesim_engine::ConfigError::new("", format!("invalid JSON: {e}")))
        })?;
        match extra {
            Value::Object(extra) if extra.contains_key("engine") => {
                if given {
                    return Err(Failure::input(
                        "--extra-engine-args in the nested {\"engine\": ...} form cannot be combined with \
                         individual engine flags; use the flat form or put everything in the file",
                    ));
                }
                value = Value::Object(extra);
            }
            Value::Object(extra) => {
                let map = value.as_object_mut().expect("an object");
                for (k, v) in extra {
                    map.insert(k, v);
                }
            }
            _ => return Err(Failure::input("--extra-engine-args: the engine configuration must be a JSON object")),
        }
    }
    // Dynamo's defaults for what only the command line sets.
    if let Value::Object(map) = &mut value {
        if !map.contains_key("engine") {
            if !map.contains_key("kv_transfer_bandwidth") {
                map.insert("kv_transfer_bandwidth".into(), Value::from(64.0));
            }
            if let (false, Some(b)) = (map.contains_key("kv_bytes_per_token"), kv_bytes_from_model) {
                map.insert("kv_bytes_per_token".into(), Value::from(b));
            }
        }
    }
    let dir = a.extra_engine_args.as_deref().filter(|s| !s.trim_start().starts_with('{'));
    let base = dir.and_then(|p| std::path::Path::new(p).parent().map(|d| d.to_path_buf())).unwrap_or_default();
    let files = |path: &str| {
        let full = base.join(path);
        std::fs::read(&full).map_err(|e| format!("cannot read {}: {e}", full.display()))
    };
    let args = crate::flags::workers::worker_args_from_value(&value, &files)
        .map_err(|e| Failure::input(format!("engine configuration: {e}")))?;
    if let Some(why) = &args.engine.timing_fallback {
        eprintln!("warning: engine configuration: {why}; using the polynomial timing model instead");
    }
    Ok(args)
}

/// What `--extra-engine-args` holds when it is neither inline JSON (`{...}`) nor a file: said
/// plainly instead of "cannot read" a file named after it.
fn extra_engine_args_shape(arg: &str) -> Result<(), Failure> {
    let t = arg.trim();
    if t.is_empty() {
        return Err(Failure::input(
            "--extra-engine-args is empty: give the engine configuration as inline JSON ('{\"block_size\": 16}') or a file",
        ));
    }
    if !t.starts_with('{') && !std::path::Path::new(arg).exists() && serde_json::from_str::<Value>(t).is_ok() {
        return Err(Failure::input("--extra-engine-args: the engine configuration must be a JSON object ({...})"));
    }
    Ok(())
}

pub fn run(a: ServeArgs) -> Result<(), Failure> {
    let facts = match &a.model_path {
        Some(dir) if dir.is_dir() => servesim_live::tokenizer::model_facts(dir).map_err(Failure::input)?,
        _ => Default::default(),
    };
    let tokenizer = load_tokenizer(a.model_path.as_deref()).map_err(Failure::input)?;
    if let (Some(dir), true) = (&a.model_path, tokenizer.is_approximate()) {
        eprintln!("warning: {} has no tokenizer.json; using the built-in approximate tokenizer", dir.display());
    }
    let args = worker_args(&a, facts.kv_bytes_per_token)?;
    let role = match a.disaggregation_mode {
        DisaggregationMode::Agg => args.engine.role,
        DisaggregationMode::Prefill => Role::Prefill,
        DisaggregationMode::Decode => Role::Decode,
    };
    if args.engine.role != Role::Aggregated && args.engine.role != role {
        return Err(Failure::input(format!(
            "--disaggregation-mode and the worker_type of --extra-engine-args disagree ({} vs {})",
            role.name(),
            args.engine.role.name()
        )));
    }
    if !(args.engine.speedup_ratio.is_finite() && args.engine.speedup_ratio >= 0.0) {
        return Err(Failure::input("--speedup-ratio must be a finite number ≥ 0"));
    }
    let disaggregated = a.num_prefill_workers.is_some() || a.num_decode_workers.is_some();
    if role != Role::Aggregated && disaggregated {
        return Err(Failure::input(
            "--disaggregation-mode prefill/decode makes a single-role server; \
             --num-prefill-workers/--num-decode-workers run both roles in this process",
        ));
    }
    let max_model_len = a.max_model_len.or(args.engine.max_model_len).or(facts.max_position_embeddings);
    let mut calibration = a.calibration.as_deref().map(FlagCalibration::read).transpose()?;
    let topology = if disaggregated {
        if a.num_workers.is_some() {
            return Err(Failure::input(
                "--num-workers sets an aggregated cluster; use --num-prefill-workers and --num-decode-workers",
            ));
        }
        let (p, d) = (a.num_prefill_workers.unwrap_or(1), a.num_decode_workers.unwrap_or(1));
        let (mut prefill, mut decode) = (args.clone(), args);
        if let Some(c) = calibration.as_mut() {
            c.apply("prefill", &mut prefill)?;
            c.apply("decode", &mut decode)?;
        }
        Topology::disaggregated((prefill, p), (decode, d))
    } else {
        let mut args = args;
        if let Some(c) = calibration.as_mut() {
            c.apply(role.name(), &mut args)?;
        }
        Topology::one_side(role, args, a.num_workers.unwrap_or(1))
    }
    .map_err(crate::failure::topology_error)?;
    if let Some(c) = &calibration {
        c.warn_differences();
    }
    if let Some(why) = servesim_live::unsupported_live(&topology) {
        return Err(Failure::input(why));
    }
    let workers: u32 = topology.pools().iter().map(|p| p.workers).sum();
    // Each rank is a thread with its own engine: refuse what cannot run before allocating.
    let ranks: u64 = topology.pools().iter().map(|p| p.workers as u64 * p.deployment.dp_size as u64).sum();
    if ranks > servesim_live::MAX_ENGINE_RANKS as u64 {
        return Err(Failure::input(format!(
            "{ranks} engine ranks (workers × --data-parallel-size) asked for; one serve process runs at \
             most {} (each rank is a thread)",
            servesim_live::MAX_ENGINE_RANKS
        )));
    }
    if let Some(base) = a.worker_base_port {
        if base as u64 + workers as u64 - 1 > u16::MAX as u64 {
            return Err(Failure::input(format!(
                "--worker-base-port {base}: {workers} worker(s) need ports up to {}, above 65535",
                base as u64 + workers as u64 - 1
            )));
        }
    }
    if !a.zmq_kv_events_ports.is_empty() && a.zmq_kv_events_ports.len() != workers as usize {
        return Err(Failure::input(format!(
            "--zmq-kv-events-ports needs one port per worker ({workers}), got {}",
            a.zmq_kv_events_ports.len()
        )));
    }
    if !a.zmq_replay_ports.is_empty() {
        if a.zmq_kv_events_ports.is_empty() {
            return Err(Failure::input("--zmq-replay-ports needs --zmq-kv-events-ports"));
        }
        if a.zmq_replay_ports.len() != workers as usize {
            return Err(Failure::input(format!(
                "--zmq-replay-ports needs one port per worker ({workers}), got {}",
                a.zmq_replay_ports.len()
            )));
        }
    }
    if !(a.stagger_delay.is_finite() && (a.stagger_delay >= 0.0 || a.stagger_delay == -1.0)) {
        return Err(Failure::input("--stagger-delay must be ≥ 0, or -1 for automatic spacing"));
    }
    if a.max_model_len == Some(0) {
        return Err(Failure::input("--max-model-len must be at least 1"));
    }
    let mut router = router_mode(a.router_mode, a.router_config.as_deref())?;
    // Requests over HTTP carry no policy class: they take the profile's default family.
    crate::flags::router::router_policy(&mut router, None, a.model_name.as_deref())?;
    // The router's load model times prompts on the engines it places them on (the first pool:
    // aggregated or prefill).
    let prefill_load_estimator = a.router_load.resolve(router.kv_config_mut(), &topology.pools()[0].engine)?;
    let model_name = a.model_name.clone().unwrap_or_else(|| {
        a.model_path
            .as_ref()
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "servesim-model".to_string())
    });
    let seconds = |flag: &str, v: f64| {
        if v.is_finite() && v > 0.0 && v <= 1e9 {
            Ok(std::time::Duration::from_secs_f64(v))
        } else {
            Err(Failure::input(format!("--{flag} must be a number of seconds > 0, got {v}")))
        }
    };
    let timeouts = servesim_live::Timeouts {
        header: seconds("header-timeout", a.header_timeout)?,
        body: seconds("body-timeout", a.body_timeout)?,
        idle: seconds("idle-timeout", a.idle_timeout)?,
        write: seconds("write-timeout", a.write_timeout)?,
    };
    let shutdown_timeout = if a.shutdown_timeout == 0.0 {
        std::time::Duration::ZERO
    } else if a.shutdown_timeout < 0.0 {
        return Err(Failure::input(format!(
            "--shutdown-timeout must be a number of seconds ≥ 0, got {}",
            a.shutdown_timeout
        )));
    } else {
        seconds("shutdown-timeout", a.shutdown_timeout)?
    };
    if a.metrics_max_ranks == 0 {
        return Err(Failure::input("--metrics-max-ranks must be at least 1"));
    }
    if topology.pools().iter().any(|p| p.engine.host_offload.is_some()) {
        // The live actor has no wakeup for a host transfer that completes while it is idle.
        return Err(Failure::input(
            "native_host_offload is not supported by `servesim serve` yet; `servesim predict` and replays model it",
        ));
    }
    let opts = ServeOptions {
        host: a.host.clone(),
        port: a.port,
        worker_base_port: a.worker_base_port,
        model_name,
        model_path: a.model_path.clone(),
        topology,
        router,
        prefill_load_estimator,
        router_seed: a.router_seed,
        max_model_len,
        stagger_delay_s: a.stagger_delay,
        zmq_kv_events_ports: a.zmq_kv_events_ports.clone(),
        zmq_replay_ports: a.zmq_replay_ports.clone(),
        zmq_event_format: match a.zmq_event_format {
            ZmqEventFormat::Vllm => servesim_live::zmq::EventFormat::Vllm,
            ZmqEventFormat::Named => servesim_live::zmq::EventFormat::Named,
        },
        seed: a.seed,
        timeouts,
        shutdown_timeout,
        metrics_max_ranks: a.metrics_max_ranks as usize,
        frontend_ms: calibration.as_ref().and_then(FlagCalibration::frontend_ms).unwrap_or(0.0),
    };
    servesim_live::serve(opts, tokenizer).map_err(Failure::run)
}
