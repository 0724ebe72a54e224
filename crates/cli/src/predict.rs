//! `servesim predict`: parse arguments, build the workload and the cluster, run, print.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::{Args, ValueEnum};
use servesim_engine::{ConfigError, WorkerArgs};
use servesim_replay::memory::{available as available_memory, gib, session_bytes, WORKER_BYTES};
use servesim_replay::{
    request_json, request_json_with_breakdown, Overflow, QueueLimit, RequestRecord, RouterMode, Run, SimConfig,
    SimError, Sla, Topology,
};
use servesim_router::{PolicyConfig, RouterConfig};
use servesim_workload::error::short_number;
use servesim_workload::formats::WekaBasis;
use servesim_workload::{load_trace, Arrivals, LoadMode, SyntheticSpec, TraceFormat, TraceOptions, Workload};

use crate::output::{check_report_paths, ReportFile};
use crate::progress::Bar;
use crate::table;
use crate::Failure;

fn parse_trace_format(name: &str) -> Result<TraceFormat, String> {
    TraceFormat::parse(name).ok_or_else(|| {
        format!(
            "unknown trace format {name:?}; expected mooncake, mooncake-delta, applied_compute_agentic, \
             agentic_mooncake, dynamo or weka"
        )
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum NestedBasis {
    Auto,
    Absolute,
    Relative,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum Router {
    RoundRobin,
    KvRouter,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum QueuePolicy {
    Fail,
    Shed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Json,
}

#[derive(Args, Debug)]
pub struct PredictArgs {
    /// Trace files to replay (plain, gzip or zstd; a pipe works too). Several Mooncake files or
    /// Dynamo shards are replayed together; a Weka source may be a directory. Limits: a line
    /// may hold 256 MiB ($SERVESIM_MAX_LINE_BYTES), a compressed file may decompress to 1000
    /// times its size or 1 GiB ($SERVESIM_MAX_DECOMPRESSED_BYTES), a pipe is copied to $TMPDIR
    /// up to 16 GiB ($SERVESIM_MAX_SPOOL_BYTES); values in bytes, or with a K, M, G suffix.
    #[arg(value_name = "TRACE")]
    traces: Vec<PathBuf>,
    /// mooncake | mooncake-delta | applied_compute_agentic | agentic_mooncake | dynamo | weka.
    #[arg(long, value_parser = parse_trace_format, default_value = "mooncake", value_name = "FORMAT")]
    trace_format: TraceFormat,
    /// Tokens each trace hash id stands for (default: 512 for Mooncake formats; the trace's own
    /// for agentic_mooncake, dynamo and weka, which it must then match).
    #[arg(long, value_name = "TOKENS")]
    trace_block_size: Option<u32>,
    /// Agentic traces: replay plays as a closed loop on N lanes (a lane starts the next play
    /// when its play ends).
    #[arg(long, value_name = "N")]
    agentic_lanes: Option<u32>,
    /// Agentic traces: the target model the source models are projected onto (required for
    /// agentic_mooncake, weka and agentic Dynamo traces; reported, no effect on timing).
    #[arg(long, value_name = "NAME")]
    execution_model: Option<String>,
    /// Weka: nested subagent timestamps are absolute, relative to their marker, or decided
    /// from the corpus (auto).
    #[arg(long, value_enum, value_name = "BASIS")]
    weka_nested_timestamp_basis: Option<NestedBasis>,
    /// applied_compute_agentic: fraction of the initial prompt shared within a prefix group.
    #[arg(long, default_value_t = 0.0, value_name = "RATIO")]
    trace_shared_prefix_ratio: f64,
    /// applied_compute_agentic: number of prefix groups (line % groups).
    #[arg(long, default_value_t = 0, value_name = "N")]
    trace_num_prefix_groups: u32,

    /// Engine configuration: inline JSON or a JSON file, flat `MockEngineArgs` or Dynamo's
    /// canonical `{"engine": {...}}` form.
    #[arg(long, value_name = "JSON|PATH")]
    extra_engine_args: Option<String>,
    /// Aggregated workers (default 1).
    #[arg(long, value_name = "N")]
    num_workers: Option<u32>,
    #[arg(long, value_enum, default_value = "round_robin")]
    router_mode: Router,
    /// KV router configuration (Dynamo's `KvRouterConfig` keys): inline JSON or a JSON file.
    #[arg(long, value_name = "JSON|PATH")]
    router_config: Option<String>,
    #[command(flatten)]
    router_load: crate::ais::RouterLoadFlags,
    /// Seed of the KV router's random choices (ties, softmax sampling).
    #[arg(long, default_value_t = 42, value_name = "SEED")]
    router_seed: u64,
    /// Delay before the KV router sees the cache events of a pass.
    #[arg(long, default_value_t = 0.0, value_name = "MS")]
    kv_event_lag_ms: f64,
    /// Router policy classes for the KV router's queue (Dynamo's policy YAML: families,
    /// uncached-ISL buckets, classes with quantum, busy thresholds and limits). Default: the
    /// router configuration's `router_policy_config`, else $DYN_ROUTER_POLICY_CONFIG.
    #[arg(long, value_name = "FILE")]
    router_policy_config: Option<String>,
    /// The model the requests are for: picks its profile under `models:` in the router policy
    /// configuration (otherwise the root profile applies).
    #[arg(long, value_name = "NAME")]
    model_name: Option<String>,

    /// Disaggregated serving: workers that compute prompts.
    #[arg(long, value_name = "N", help_heading = "Disaggregated serving")]
    num_prefill_workers: Option<u32>,
    /// Disaggregated serving: workers that generate tokens.
    #[arg(long, value_name = "N", help_heading = "Disaggregated serving")]
    num_decode_workers: Option<u32>,
    /// Engine of the prefill workers (default: --extra-engine-args). `kv_transfer_bandwidth`
    /// (GB/s) and `kv_bytes_per_token` here set the KV transfer time.
    #[arg(long, value_name = "JSON|PATH", help_heading = "Disaggregated serving")]
    prefill_engine_args: Option<String>,
    /// Engine of the decode workers (default: --extra-engine-args).
    #[arg(long, value_name = "JSON|PATH", help_heading = "Disaggregated serving")]
    decode_engine_args: Option<String>,

    /// Autoscale the workers with Dynamo's Planner: its `PlannerConfig` as inline JSON or a JSON
    /// file (`mode` agg/disagg, `optimization_target`, intervals, budgets, predictor, ...). The
    /// report then has a `planner` object beside the `summary`.
    #[arg(long, value_name = "JSON|PATH")]
    planner_config: Option<String>,

    /// Closed loop: at most N sessions in flight (timestamps are ignored).
    #[arg(long, value_name = "N")]
    replay_concurrency: Option<u32>,
    /// Overload: at most N requests may wait for admission (arrived, not yet admitted by an
    /// engine); what happens beyond is --max-queued-policy. Without it, an open-loop run stops
    /// (exit 1) when 100 × --queue-warning requests wait: give --max-queued to let the queue
    /// grow further.
    #[arg(long, value_name = "N")]
    max_queued: Option<u64>,
    /// Overload: `fail` stops the run with an error (exit 1) when a request arrives at a full
    /// queue; `shed` drops it and counts it as `shed_requests` in the report.
    #[arg(long, value_enum, default_value = "fail", value_name = "POLICY")]
    max_queued_policy: QueuePolicy,
    /// Overload: warn once on stderr when more than N requests wait for admission.
    #[arg(long, default_value_t = 100_000, value_name = "N")]
    queue_warning: u64,
    /// Divide arrival times (trace timestamps, or the generated synthetic arrivals) and think
    /// times by X (not with --replay-concurrency).
    #[arg(long, value_name = "X")]
    arrival_speedup_ratio: Option<f64>,

    /// Synthetic load: prompt tokens per request.
    #[arg(long, value_name = "N", help_heading = "Synthetic load")]
    input_tokens: Option<u32>,
    /// Synthetic load: output tokens per request.
    #[arg(long, value_name = "N", help_heading = "Synthetic load")]
    output_tokens: Option<u32>,
    /// Synthetic load: number of requests (sessions when --turns-per-session > 1).
    #[arg(long, value_name = "N", help_heading = "Synthetic load")]
    request_count: Option<u32>,
    /// Synthetic load: Poisson arrivals at R sessions per second.
    #[arg(long, value_name = "R", help_heading = "Synthetic load")]
    request_rate: Option<f64>,
    /// Synthetic load: one session every X ms.
    #[arg(long, value_name = "MS", help_heading = "Synthetic load")]
    arrival_interval_ms: Option<f64>,
    #[arg(long, default_value_t = 42, value_name = "SEED", help_heading = "Synthetic load")]
    arrival_seed: u64,
    #[arg(long, default_value_t = 1, value_name = "N", help_heading = "Synthetic load")]
    turns_per_session: u32,
    /// Fraction of each prompt shared within its prefix group.
    #[arg(long, default_value_t = 0.0, value_name = "RATIO", help_heading = "Synthetic load")]
    shared_prefix_ratio: f64,
    #[arg(long, default_value_t = 0, value_name = "N", help_heading = "Synthetic load")]
    num_prefix_groups: u32,
    #[arg(long, default_value_t = 0.0, value_name = "MS", help_heading = "Synthetic load")]
    inter_turn_delay_ms: f64,

    /// Goodput: time-to-first-token bound.
    #[arg(long, value_name = "MS", help_heading = "Goodput")]
    sla_ttft_ms: Option<f64>,
    /// Goodput: bound on a request's mean inter-token latency.
    #[arg(long, value_name = "MS", help_heading = "Goodput")]
    sla_itl_ms: Option<f64>,
    /// Goodput: end-to-end latency bound.
    #[arg(long, value_name = "MS", help_heading = "Goodput")]
    sla_e2e_ms: Option<f64>,

    /// Write the summary JSON here.
    #[arg(long, value_name = "PATH", help_heading = "Output")]
    report_json: Option<PathBuf>,
    /// Write one JSON record per request here.
    #[arg(long, value_name = "PATH", help_heading = "Output")]
    report_jsonl: Option<PathBuf>,
    /// Simulate every pass one by one instead of collapsing decode-only stretches. Slower; it
    /// exists to check fast-forwarding. Identical to a default run: every per-request record
    /// (byte for byte, though requests finishing at the same instant may be listed in another
    /// order) and every summary value except the pooled token-gap statistics (`mean_itl_ms`,
    /// `std_itl_ms`, `mean_output_token_throughput_per_user`,
    /// `std_output_token_throughput_per_user`), which are summed in another order and may differ
    /// in the last digits; and the wall-clock values.
    #[arg(long, help_heading = "Output")]
    no_fast_forward: bool,
    /// Leave out the values measured on the host's clock (`wall_time_ms`,
    /// `processed_tokens_per_s`, `processed_output_tokens_per_s`, the table's wall time), so two
    /// runs of the same inputs and seeds give byte-identical reports.
    #[arg(long, help_heading = "Output")]
    no_wall_clock: bool,
    /// Replay round-robin workers in one loop even when they could run separately on several
    /// threads (per-request results are identical; pooled means may differ in the last bits).
    #[arg(long, help_heading = "Output")]
    no_split_workers: bool,
    /// Threads for runs whose workers replay separately (0: every core).
    #[arg(long, value_name = "N", default_value_t = 0, help_heading = "Output")]
    threads: usize,
    /// Run N seeded variations (arrival seed for synthetic load, router and token seeds) on
    /// every core and report each metric as the median with a 90 % interval (`<key>_p05`,
    /// `<key>_p95` in JSON). Trace timestamps are replayed as they are.
    #[arg(long, value_name = "N", help_heading = "Output")]
    ensemble: Option<usize>,
    /// Pace the replay on the wall clock, as aisimulate's `predict --online`: each simulated
    /// millisecond takes a wall millisecond (engine speedup ratios included), so the run lasts
    /// about its simulated duration. The report is the unpaced run's but for its wall-clock
    /// values.
    #[arg(long, help_heading = "Output")]
    online: bool,
    /// Multiply every forward pass's modelled duration by a random factor with mean 1 and this
    /// coefficient of variation (log-normal; e.g. 0.05), drawn from a stream seeded by
    /// --arrival-seed (and per ensemble member). 0, the default, leaves timing exact.
    #[arg(long, value_name = "CV", allow_negative_numbers = true, help_heading = "Output")]
    timing_jitter_cv: Option<f64>,
    /// `table` (default) prints the metrics table; `json` prints only the summary object.
    #[arg(long, value_enum, default_value = "table", help_heading = "Output")]
    format: Format,
    #[command(flatten)]
    reports: crate::reports::ReportFlags,
    #[command(flatten)]
    deploy: crate::deploy::ConfigFlags,
}

/// `--router-mode` and `--router-config` (inline JSON or a file) as a router mode; `predict`
/// and `serve` take the same pair.
pub(crate) fn router_mode(mode: Router, config: Option<&str>) -> Result<RouterMode, Failure> {
    Ok(match mode {
        Router::RoundRobin => {
            if config.is_some() {
                return Err(Failure::input("--router-config applies to --router-mode kv_router"));
            }
            RouterMode::RoundRobin
        }
        Router::KvRouter => RouterMode::KvRouter(match config {
            Some(arg) => json_arg("router-config", arg, |text, _| RouterConfig::parse_json(text))?,
            None => RouterConfig::default(),
        }),
    })
}

/// Loads the KV router's policy classes from `--router-policy-config` (`flag`), else the router
/// configuration's `router_policy_config`, else `$DYN_ROUTER_POLICY_CONFIG`, and picks the
/// profile of `model_name` (or the root one). Without a file, or without a matching profile, the
/// router keeps its one queue from `router_queue_threshold` / `router_queue_policy`.
pub(crate) fn router_policy(
    router: &mut RouterMode,
    flag: Option<&str>,
    model_name: Option<&str>,
) -> Result<(), Failure> {
    let Some(rc) = router.kv_config_mut() else {
        if flag.is_some() {
            return Err(Failure::input("--router-policy-config applies to --router-mode kv_router"));
        }
        return Ok(());
    };
    let env = std::env::var("DYN_ROUTER_POLICY_CONFIG").ok().filter(|v| !v.is_empty());
    let Some(path) = flag.map(str::to_string).or_else(|| rc.policy_config_path.clone()).or(env) else {
        return Ok(());
    };
    let config = PolicyConfig::load(Path::new(&path)).map_err(Failure::input)?;
    rc.policy_profile = config.profile(model_name).cloned().map(std::sync::Arc::new);
    rc.policy_config_path = Some(path);
    Ok(())
}

/// Reads an inline JSON document or a JSON file given to `--flag`. `parse` gets the text and the
/// directory that relative paths inside it are relative to.
pub(crate) fn json_arg<T>(
    flag: &str,
    arg: &str,
    parse: impl Fn(&str, &Path) -> Result<T, ConfigError>,
) -> Result<T, Failure> {
    if arg.trim().is_empty() {
        return Err(Failure::input(format!(
            "--{flag} is empty; give inline JSON (e.g. '{{\"block_size\": 64}}') or the path of a JSON file"
        )));
    }
    if arg.trim_start().starts_with('{') {
        return parse(arg, Path::new(".")).map_err(|e| Failure::input(format!("--{flag}: {e}")));
    }
    let neither = |why: String| {
        Failure::input(format!(
            "--{flag} {arg}: neither inline JSON (a JSON object, {{...}}) nor a readable JSON file ({why})",
            arg = servesim_workload::error::escape_controls(arg)
        ))
    };
    if arg.trim_start().starts_with('[') && !Path::new(arg).exists() {
        return Err(neither("a JSON array is not a configuration object".into()));
    }
    let text = std::fs::read_to_string(arg).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => neither(format!("cannot read: {e}")),
        _ => Failure::input(format!("{arg}: cannot read: {e}")),
    })?;
    let dir = Path::new(arg).parent().unwrap_or(Path::new("."));
    parse(&text, dir).map_err(|e| Failure::input(format!("{arg}: {e}")))
}

fn worker_args(flag: &str, arg: Option<&str>) -> Result<WorkerArgs, Failure> {
    let Some(arg) = arg else { return Ok(WorkerArgs::default()) };
    let args = json_arg(flag, arg, |text, dir| {
        let files = |path: &str| {
            let full = dir.join(path);
            std::fs::read(&full).map_err(|e| format!("cannot read {}: {e}", full.display()))
        };
        crate::ais::parse_worker_json(text, &files)
    })?;
    if let Some(why) = &args.engine.timing_fallback {
        eprintln!("warning: --{flag}: {why}; using the polynomial timing model instead");
    }
    Ok(args)
}

/// The workers: one aggregated pool, or prefill and decode pools.
fn cluster(a: &PredictArgs) -> Result<Topology, Failure> {
    let engine = worker_args("extra-engine-args", a.extra_engine_args.as_deref())?;
    let disaggregated = a.num_prefill_workers.is_some()
        || a.num_decode_workers.is_some()
        || a.prefill_engine_args.is_some()
        || a.decode_engine_args.is_some();
    let cluster = if disaggregated {
        if a.num_workers.is_some() {
            return Err(Failure::input(
                "--num-workers sets an aggregated cluster; use --num-prefill-workers and --num-decode-workers",
            ));
        }
        let staged = |flag: &str, arg: &Option<String>| match arg {
            Some(_) => worker_args(flag, arg.as_deref()),
            None => Ok(engine.clone()),
        };
        Topology::disaggregated(
            (staged("prefill-engine-args", &a.prefill_engine_args)?, a.num_prefill_workers.unwrap_or(1)),
            (staged("decode-engine-args", &a.decode_engine_args)?, a.num_decode_workers.unwrap_or(1)),
        )
    } else {
        Topology::aggregated(engine, a.num_workers.unwrap_or(1))
    };
    cluster.map_err(crate::topology_error)
}

fn positive(name: &str, v: Option<f64>) -> Result<(), Failure> {
    match v {
        Some(x) if !(x.is_finite() && x > 0.0) => {
            Err(Failure::input(format!("--{name} must be a positive number, got {x}")))
        }
        _ => Ok(()),
    }
}

/// Builds the workload and the load mode, rejecting contradictory flags.
fn workload(a: &PredictArgs, block_size: u32) -> Result<(Workload, LoadMode), Failure> {
    let synthetic = [a.input_tokens.is_some(), a.output_tokens.is_some(), a.request_count.is_some()];
    let any_synthetic = synthetic.iter().any(|&b| b);
    if a.replay_concurrency == Some(0) {
        return Err(Failure::input("--replay-concurrency must be at least 1"));
    }
    positive("arrival-speedup-ratio", a.arrival_speedup_ratio)?;
    if a.replay_concurrency.is_some() && a.arrival_speedup_ratio.is_some() {
        return Err(Failure::input(
            "--arrival-speedup-ratio applies to trace timestamps and cannot be combined with --replay-concurrency",
        ));
    }
    if !a.traces.is_empty() {
        if any_synthetic || a.request_rate.is_some() || a.arrival_interval_ms.is_some() {
            return Err(Failure::input(
                "give either trace files or a synthetic load (--input-tokens/--output-tokens/--request-count), not both",
            ));
        }
        let options = TraceOptions {
            trace_block_size: a.trace_block_size,
            arrival_speedup_ratio: a.arrival_speedup_ratio.unwrap_or(1.0),
            replay_concurrency: a.replay_concurrency,
            agentic_lanes: a.agentic_lanes,
            execution_model: a.execution_model.clone(),
            shared_prefix_ratio: a.trace_shared_prefix_ratio,
            num_prefix_groups: a.trace_num_prefix_groups,
            weka_basis: a.weka_nested_timestamp_basis.map(|b| match b {
                NestedBasis::Auto => WekaBasis::Auto,
                NestedBasis::Absolute => WekaBasis::Absolute,
                NestedBasis::Relative => WekaBasis::Relative,
            }),
            ..TraceOptions::new(a.trace_format)
        };
        return load_trace(&a.traces, &options).map_err(Failure::input);
    }
    if !synthetic.iter().all(|&b| b) {
        return Err(Failure::input(if any_synthetic {
            "a synthetic load needs all of --input-tokens, --output-tokens and --request-count"
        } else {
            "nothing to replay: give trace files or a synthetic load (--input-tokens, --output-tokens, --request-count); see --help"
        }));
    }
    let controls = [a.request_rate.is_some(), a.arrival_interval_ms.is_some(), a.replay_concurrency.is_some()];
    if controls.iter().filter(|&&b| b).count() != 1 {
        return Err(Failure::input(
            "a synthetic load needs exactly one of --request-rate, --arrival-interval-ms, --replay-concurrency",
        ));
    }
    if a.agentic_lanes.is_some() || a.execution_model.is_some() || a.weka_nested_timestamp_basis.is_some() {
        return Err(Failure::input(
            "--agentic-lanes, --execution-model and --weka-nested-timestamp-basis apply to agentic traces",
        ));
    }
    let arrivals = match (a.request_rate, a.arrival_interval_ms) {
        (Some(rate), _) => Arrivals::Poisson { rate_per_s: rate },
        (_, Some(ms)) => Arrivals::Interval { interval_ms: ms },
        _ => Arrivals::AllAtOnce,
    };
    let spec = SyntheticSpec {
        input_tokens: a.input_tokens.unwrap_or_default(),
        output_tokens: a.output_tokens.unwrap_or_default(),
        sessions: a.request_count.unwrap_or_default(),
        turns_per_session: a.turns_per_session,
        arrivals,
        seed: a.arrival_seed,
        shared_prefix_ratio: a.shared_prefix_ratio,
        num_prefix_groups: a.num_prefix_groups,
        inter_turn_delay_ms: a.inter_turn_delay_ms,
        block_tokens: block_size,
    };
    // As in Dynamo's synthetic replay, the speedup divides the generated arrival times and
    // think times.
    let load = match a.replay_concurrency {
        Some(c) => LoadMode::Concurrency { max_sessions: c },
        None => LoadMode::Timestamps { speedup: a.arrival_speedup_ratio.unwrap_or(1.0) },
    };
    let flag_error = |e: servesim_workload::InputError| match &e.field {
        Some(field) => Failure::input(format!("--{field} {}", e.message)),
        None => Failure::input(e),
    };
    spec.validate().map_err(flag_error)?;
    spec.check_times(a.arrival_speedup_ratio.filter(|_| a.replay_concurrency.is_none()).unwrap_or(1.0))
        .map_err(flag_error)?;
    Ok((Workload::Synthetic(spec), load))
}

/// Refuses counts whose state cannot fit in this machine's memory, before anything is allocated
/// for them (instead of aborting out of memory later).
fn check_counts(a: &PredictArgs, memory: Option<u64>) -> Result<(), Failure> {
    let Some(memory) = memory else { return Ok(()) };
    let workers = [a.num_workers, a.num_prefill_workers, a.num_decode_workers];
    let total: u64 = workers.iter().flatten().map(|&n| n as u64).sum();
    if total.saturating_mul(WORKER_BYTES) > memory {
        let flag = if a.num_workers.is_some() { "--num-workers" } else { "--num-prefill-workers/--num-decode-workers" };
        return Err(Failure::input(format!(
            "{flag}: {total} workers need about {} of memory; this machine has {} available (at most {} workers)",
            gib(total.saturating_mul(WORKER_BYTES)),
            gib(memory),
            memory / WORKER_BYTES
        )));
    }
    Ok(())
}

/// Refuses synthetic sessions whose prompts cannot fit in this machine's memory, before any is
/// generated: each turn's prompt as block ids of `block_size` tokens, and the engine's state of
/// the turn in flight; closed-loop runs hold that many sessions at once.
fn check_sessions(a: &PredictArgs, block_size: u32, memory: Option<u64>) -> Result<(), Failure> {
    let Some(memory) = memory else { return Ok(()) };
    if let (Some(input), true) = (a.input_tokens, a.traces.is_empty()) {
        let per_session = session_bytes(input as u64, a.turns_per_session as u64, block_size as u64);
        let sessions = a.replay_concurrency.unwrap_or(1).min(a.request_count.unwrap_or(1)).max(1) as u64;
        let need = per_session.saturating_mul(sessions);
        if need > memory {
            return Err(Failure::input(format!(
                "--turns-per-session {} × --input-tokens {input}{}: the sessions in flight need about {} of \
                 memory; this machine has {} available",
                a.turns_per_session,
                if sessions > 1 { format!(" × --replay-concurrency {sessions}") } else { String::new() },
                gib(need),
                gib(memory)
            )));
        }
    }
    Ok(())
}

/// Refuses a synthetic prompt that no worker can ever take (it would be generated, then
/// rejected): one that reaches an engine's `max_model_len`, or needs more KV blocks than its
/// cache has. Disaggregated requests pass through both pools, so each must take it.
fn check_prompt_fits(a: &PredictArgs, topology: &Topology) -> Result<(), Failure> {
    let (Some(input), true) = (a.input_tokens, a.traces.is_empty()) else { return Ok(()) };
    let disaggregated = topology.pools().len() > 1;
    for pool in topology.pools() {
        let engine = pool.rank_engine();
        let workers = if disaggregated { format!("the {} workers'", pool.role.name()) } else { "the workers'".into() };
        if let Some(max) = engine.max_model_len.filter(|&m| input >= m) {
            return Err(Failure::input(format!(
                "--input-tokens {input}: a prompt must be shorter than {workers} max_model_len ({max}); no request \
                 could run"
            )));
        }
        let blocks = input.div_ceil(engine.block_size.max(1));
        if blocks > engine.num_gpu_blocks {
            return Err(Failure::input(format!(
                "--input-tokens {input}: a prompt needs {blocks} KV blocks of {} tokens, more than {workers} cache \
                 holds ({} blocks, {} tokens); no request could run (raise num_gpu_blocks in the engine \
                 arguments, or lower --input-tokens)",
                engine.block_size,
                engine.num_gpu_blocks,
                engine.num_gpu_blocks as u64 * engine.block_size as u64
            )));
        }
    }
    Ok(())
}

/// Files the run reads: traces and configuration files (not inline JSON).
fn inputs(a: &PredictArgs) -> Vec<&Path> {
    let mut inputs: Vec<&Path> = a.traces.iter().map(PathBuf::as_path).collect();
    let configs =
        [&a.extra_engine_args, &a.prefill_engine_args, &a.decode_engine_args, &a.router_config, &a.planner_config];
    for arg in configs.into_iter().flatten() {
        if !arg.trim_start().starts_with('{') {
            inputs.push(Path::new(arg));
        }
    }
    inputs
}

/// Prints to stdout. A reader that went away (`servesim predict ... | head`) is not an error:
/// the rest of the output is dropped and the reports are still written.
fn print_out(text: &str) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(Failure::run(format!("stdout: {e}"))),
        _ => Ok(()),
    }
}

/// `--online` paces one run; an ensemble is many.
pub(crate) fn check_online(online: bool, ensemble: Option<usize>) -> Result<(), Failure> {
    if online && ensemble.is_some() {
        return Err(Failure::input("--online paces one run on the wall clock; drop --ensemble (or --online)"));
    }
    Ok(())
}

pub fn run(a: PredictArgs) -> Result<(), Failure> {
    check_online(a.online, a.ensemble)?;
    if a.deploy.config.is_some() {
        let variation = crate::deploy::Variation {
            ensemble: a.ensemble,
            timing_jitter_cv: a.timing_jitter_cv,
            threads: a.threads,
            online: a.online,
            no_wall_clock: a.no_wall_clock,
        };
        return crate::deploy::predict(&a.deploy, &a.reports, a.format == Format::Json, &variation);
    }
    a.deploy.check_flag_form()?;
    let started = Instant::now();
    if a.traces.iter().any(|t| t.as_os_str().is_empty()) {
        return Err(Failure::input(
            "an empty argument was given as a trace path (a shell runs `...` in backticks as a command \
             and passes its empty output; write flags without backticks)",
        ));
    }
    let mut reports: Vec<(&str, &Path)> = [("report-json", &a.report_json), ("report-jsonl", &a.report_jsonl)]
        .into_iter()
        .filter_map(|(flag, p)| p.as_deref().map(|p| (flag, p)))
        .collect();
    reports.extend(a.reports.paths());
    a.reports.check()?;
    check_report_paths(&reports, &inputs(&a))?;
    check_counts(&a, available_memory())?;
    let cluster = cluster(&a)?;
    check_prompt_fits(&a, &cluster)?;
    check_sessions(&a, cluster.block_size(), available_memory())?;
    for (name, v) in [("sla-ttft-ms", a.sla_ttft_ms), ("sla-itl-ms", a.sla_itl_ms), ("sla-e2e-ms", a.sla_e2e_ms)] {
        positive(name, v)?;
    }
    if a.max_queued == Some(0) {
        return Err(Failure::input("--max-queued must be at least 1"));
    }
    if !(a.kv_event_lag_ms.is_finite() && a.kv_event_lag_ms >= 0.0) {
        return Err(Failure::input("--kv-event-lag-ms must be a finite number ≥ 0"));
    }
    let mut router = router_mode(a.router_mode, a.router_config.as_deref())?;
    router_policy(&mut router, a.router_policy_config.as_deref(), a.model_name.as_deref())?;
    // The router's load model times prompts on the engines it places them on.
    let prefill_load_estimator = a.router_load.resolve(router.kv_config_mut(), &cluster.pools()[0].engine)?;
    let (workload, load) = workload(&a, cluster.block_size())?;
    let config = SimConfig {
        topology: cluster,
        router,
        prefill_load_estimator,
        router_seed: a.router_seed,
        kv_event_lag_ms: a.kv_event_lag_ms,
        load,
        sla: Sla { ttft_ms: a.sla_ttft_ms, itl_ms: a.sla_itl_ms, e2e_ms: a.sla_e2e_ms },
        seed: a.arrival_seed,
        fast_forward: !a.no_fast_forward,
        split_workers: !a.no_split_workers,
        threads: a.threads,
        timing_jitter_cv: timing_jitter_cv(a.timing_jitter_cv)?,
    };

    if let Some(n) = a.ensemble {
        if a.planner_config.is_some() {
            return Err(Failure::input(
                "--ensemble does not run a planner yet: drop --planner-config, or run the planned replay alone",
            ));
        }
        return run_ensemble(&a, &workload, &config, n, started);
    }
    let planner = match a.planner_config.as_deref() {
        Some(arg) => Some(planner_run(arg, &config.topology)?),
        None => None,
    };

    // Open outputs before the run so a bad path costs nothing.
    let mut summary_file = a.report_json.as_deref().map(ReportFile::create).transpose()?;
    let mut records = a.report_jsonl.as_deref().map(ReportFile::create).transpose()?;
    let mut outputs = crate::reports::Outputs::open(&a.reports)?;
    let crate::reports::Outputs { requests, series, telemetry, html, interval_ms, breakdown } = &mut outputs;
    let want_html = html.is_some();
    let record_json = if *breakdown { request_json_with_breakdown } else { request_json };
    let mut telemetry_writer = crate::reports::telemetry_writer(telemetry);
    let mut telemetry_sink = crate::reports::telemetry_sink(telemetry_writer.as_mut(), want_html.then_some(series));
    let mut write_error: Option<std::io::Error> = None;
    // Agentic records are written in graph order (by request_id), as the reference lists them;
    // the graph is in memory anyway. They wait as their JSON text (a JSON value tree takes about
    // eight times the bytes). Others are written as requests finish.
    let graph_order = matches!(workload, Workload::Graph(_));
    let mut held: Vec<(u32, Box<[u8]>)> = Vec::new();
    let mut sink = |r: &RequestRecord| {
        if want_html {
            requests.add(r);
        }
        if records.is_none() {
            return;
        }
        if let (true, Some(ids)) = (graph_order, r.meta.as_ref().and_then(|m| m.agentic.as_ref())) {
            let line = serde_json::to_vec(&record_json(r)).expect("a JSON value serialises");
            held.push((ids.node, line.into_boxed_slice()));
            return;
        }
        if let (Some(w), None) = (records.as_mut().map(ReportFile::writer), write_error.as_ref()) {
            let line = record_json(r);
            if let Err(e) =
                serde_json::to_writer(&mut *w, &line).map_err(std::io::Error::from).and_then(|_| w.write_all(b"\n"))
            {
                write_error = Some(e);
            }
        }
    };
    let sink_ref: Option<&mut (dyn FnMut(&RequestRecord) + Send)> =
        if a.report_jsonl.is_some() || want_html { Some(&mut sink) } else { None };
    let mut run = Run::new(&workload, &config)
        .queue_limit(queue_limit(&a))
        .records(sink_ref)
        .ttft_breakdown(*breakdown)
        .planner(planner)
        .online(a.online);
    if let Some(t) = telemetry_sink.as_mut() {
        run = run.telemetry(*interval_ms, t);
    }
    let mut bar = Bar::new();
    let result = run.go(&mut bar);
    bar.finish();
    drop(telemetry_sink);
    let telemetry_error = telemetry_writer.map(|w| w.finish().err()).unwrap_or_default();
    let mut ran = result.map_err(|e| sim_failure(&a, e))?;
    ran.report.wall_time_ms = started.elapsed().as_secs_f64() * 1000.0;
    let (report, planner) = (&ran.report, &ran.planner);

    let mut summary = report.summary_json();
    summary.extend(servesim_replay::workload_keys(&workload));
    if a.no_wall_clock {
        for key in servesim_replay::WALL_CLOCK_KEYS {
            summary.remove(key);
        }
    }
    ran.add_planner_keys(&mut summary);
    let summary = serde_json::Value::Object(summary);
    // With a planner: the summary beside what the planner did.
    let document = match planner {
        Some(run) => serde_json::json!({"summary": summary, "planner": run.to_json()}),
        None => summary.clone(),
    };
    let pretty = serde_json::to_string_pretty(&document).expect("summary serialises");
    match a.format {
        Format::Json => print_out(&format!("{pretty}\n"))?,
        Format::Table => {
            print_out(&table::render(report, !a.no_wall_clock))?;
            if let Some(run) = &planner {
                print_out(&table::worker_timeline(run))?;
            }
        }
    }
    let mut failures = Vec::new();
    if let Some(e) = workload.take_error() {
        failures.push(format!("{e} (the trace changed during the replay; the report covers the rows before it)"));
    }
    held.sort_by_key(|(node, _)| *node);
    for (_, line) in held {
        if let (Some(w), None) = (records.as_mut().map(ReportFile::writer), write_error.as_ref()) {
            if let Err(e) = w.write_all(&line).and_then(|_| w.write_all(b"\n")) {
                write_error = Some(e);
            }
        }
    }
    if let Some(e) = write_error {
        failures.push(format!("{}: write failed: {e}", a.report_jsonl.as_ref().expect("jsonl path").display()));
    }
    if let (Some(e), Some(p)) = (telemetry_error, a.reports.telemetry.as_ref()) {
        failures.push(format!("{}: write failed: {e}", p.display()));
    }
    if let Some(w) = summary_file.as_mut() {
        if let Err(e) = w.writer().write_all(pretty.as_bytes()).and_then(|_| w.writer().write_all(b"\n")) {
            failures.push(format!("{}: write failed: {e}", w.path().display()));
        }
    }
    // Reports replace their previous versions only when the whole run succeeded; otherwise the
    // temporary files are dropped (deleted) and what was there stays.
    if failures.is_empty() {
        let config_json = crate::reports::flag_config(&config.topology);
        // The page is deterministic: no values measured on the host's clock.
        let mut summary_map = summary.as_object().expect("the summary is an object").clone();
        for key in servesim_replay::WALL_CLOCK_KEYS {
            summary_map.remove(key);
        }
        let summary_map = &summary_map;
        let end_ms = summary_map.get("duration_ms").and_then(serde_json::Value::as_f64).unwrap_or(0.0);
        let view = planner.as_ref().map(|run| crate::reports::planner_view(run, run.is_agg(), end_ms));
        match outputs.finish("servesim predict", summary_map, &config_json, view.as_ref()) {
            Ok(paths) if a.format == Format::Table => {
                for p in paths {
                    print_out(&format!("Saved report to: {}\n", p.display()))?;
                }
            }
            Ok(_) => {}
            Err(e) => failures.push(e),
        }
    }
    if failures.is_empty() {
        for file in [records.take(), summary_file.take()].into_iter().flatten() {
            let path = file.path().to_path_buf();
            match file.commit() {
                Ok(()) if a.format == Format::Table && Some(&path) == a.report_json.as_ref() => {
                    print_out(&format!("Saved full report to: {}\n", path.display()))?
                }
                Ok(()) => {}
                Err(e) => failures.push(e),
            }
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(Failure::run(failures.join("; ")))
    }
}

/// `--timing-jitter-cv`, checked (0 when absent).
pub(crate) fn timing_jitter_cv(cv: Option<f64>) -> Result<f64, Failure> {
    let Some(cv) = cv else { return Ok(0.0) };
    servesim_engine::TimingJitter::new(cv, 0).map_err(|e| Failure::input(format!("--timing-jitter-cv {e}")))?;
    Ok(cv)
}

/// What `--queue-warning`, `--max-queued` and `--max-queued-policy` ask of the load driver.
fn queue_limit(a: &PredictArgs) -> QueueLimit {
    let overflow = match a.max_queued_policy {
        QueuePolicy::Fail => Overflow::Fail,
        QueuePolicy::Shed => Overflow::Shed,
    };
    QueueLimit {
        warn_at: a.queue_warning,
        max: a.max_queued.map(|n| (n, overflow)),
        // Without a maximum a queue that keeps growing takes all memory: stop it far past the
        // warning instead, or where the queue would hold a quarter of this machine's memory.
        runaway: a.max_queued.is_none().then(|| {
            let far = a.queue_warning.saturating_mul(RUNAWAY_FACTOR).max(RUNAWAY_FACTOR);
            match available_memory() {
                Some(m) => far.min((m / 4 / QUEUED_REQUEST_BYTES).max(RUNAWAY_FACTOR)),
                None => far,
            }
        }),
    }
}

/// Without --max-queued, an open-loop run stops when this many times --queue-warning requests
/// wait for admission.
const RUNAWAY_FACTOR: u64 = 100;
/// Bytes a request waiting for admission holds (measured: about 700 with 100-token prompts).
const QUEUED_REQUEST_BYTES: u64 = 1024;

/// A failed run's message and exit code: times out of the clock's range come from the input
/// (the trace's timestamps, or --arrival-speedup-ratio), the rest from the run.
fn sim_failure(a: &PredictArgs, e: SimError) -> Failure {
    match e {
        SimError::TimeRange { .. } => match a.arrival_speedup_ratio {
            Some(r) => Failure::input(format!("--arrival-speedup-ratio {}: {e}", short_number(r))),
            None if !a.traces.is_empty() => Failure::input(format!("the trace's timestamps and delays: {e}")),
            None => Failure::input(e),
        },
        // The engine arguments cannot serve the workload: an input error.
        e @ SimError::Unschedulable { .. } => Failure::input(e),
        e => Failure::run(e),
    }
}

/// The planner `--planner-config` describes, sized against the cluster's engines.
fn planner_run(arg: &str, topology: &Topology) -> Result<servesim_replay::planned::PlannerRun, Failure> {
    let cfg = json_arg("planner-config", arg, |text, _| {
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| ConfigError::new("", format!("malformed JSON: {e}")))?;
        servesim_planner::PlannerConfig::from_json(&v).map_err(|e| ConfigError::new(e.key, e.message))
    })?;
    servesim_replay::planned::PlannerRun::for_topology(cfg, topology, servesim_perf::planner_model)
        .map_err(|e| Failure::input(format!("--planner-config: {e}")))
}

/// Refuses an ensemble size out of range, and outputs that describe one run (`per_request`:
/// --report-jsonl, or -c's --capture-per-request).
pub(crate) fn check_ensemble(
    n: usize,
    per_request: bool,
    reports: &crate::reports::ReportFlags,
) -> Result<(), Failure> {
    if !(2..=100_000).contains(&n) {
        return Err(Failure::input(format!("--ensemble must be between 2 and 100000, got {n}")));
    }
    if per_request || reports.telemetry.is_some() {
        return Err(Failure::input(
            "--ensemble reports intervals of summary values; per-request records (--report-jsonl, \
             --capture-per-request) and --telemetry describe one run (drop --ensemble for them)",
        ));
    }
    Ok(())
}

/// `--ensemble N`: the members' summaries folded into medians and intervals.
fn run_ensemble(
    a: &PredictArgs,
    workload: &Workload,
    config: &SimConfig,
    n: usize,
    started: Instant,
) -> Result<(), Failure> {
    check_ensemble(n, a.report_jsonl.is_some(), &a.reports)?;
    let mut summary_file = a.report_json.as_deref().map(ReportFile::create).transpose()?;
    let html = a.reports.report_html.as_deref().map(ReportFile::create).transpose()?;
    let queue = queue_limit(a);
    let reports = Run::new(workload, config)
        .queue_limit(queue)
        .ttft_breakdown(a.reports.ttft_breakdown)
        .ensemble(n)
        .map_err(|e| sim_failure(a, e))?;
    let summaries: Vec<_> = reports
        .iter()
        .map(|r| {
            let mut s = r.summary_json();
            s.extend(servesim_replay::workload_keys(workload));
            for key in servesim_replay::WALL_CLOCK_KEYS {
                s.remove(key);
            }
            s
        })
        .collect();
    let mut summary = servesim_replay::ensemble::summarize(&summaries);
    let page = match html {
        Some(file) => Some(crate::reports::write_ensemble_page(
            file,
            "servesim predict --ensemble",
            &summary,
            &summaries,
            &crate::reports::ensemble_variation(config.timing_jitter_cv),
            &crate::reports::flag_config(&config.topology),
        )?),
        None => None,
    };
    if !a.no_wall_clock {
        summary.insert("wall_time_ms".into(), serde_json::json!(started.elapsed().as_secs_f64() * 1000.0));
    }
    let pretty = serde_json::to_string_pretty(&serde_json::Value::Object(summary.clone())).expect("summary serialises");
    match a.format {
        Format::Json => print_out(&format!("{pretty}\n"))?,
        Format::Table => print_out(&table::render_ensemble(&summary, n))?,
    }
    if let (Some(p), Format::Table) = (&page, a.format) {
        print_out(&format!("Saved report to: {}\n", p.display()))?;
    }
    if let Some(mut w) = summary_file.take() {
        w.writer()
            .write_all(pretty.as_bytes())
            .and_then(|_| w.writer().write_all(b"\n"))
            .map_err(|e| Failure::run(format!("{}: write failed: {e}", w.path().display())))?;
        let path = w.path().to_path_buf();
        w.commit().map_err(Failure::run)?;
        if a.format == Format::Table {
            print_out(&format!("Saved full report to: {}\n", path.display()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: PredictArgs,
    }

    fn args(flags: &[&str]) -> PredictArgs {
        Cli::try_parse_from([&["predict"], flags].concat()).unwrap().args
    }

    #[test]
    fn the_memory_estimate_covers_the_engine_state_of_prompts_in_flight() {
        // 16 sessions of 2e9-token prompts in 64-token blocks: 31.25M blocks each, 4 bytes in
        // the session and 64 in the engine: about 34 GB, refused on a machine with 8 GiB.
        let a = args(&[
            "--input-tokens",
            "2000000000",
            "--output-tokens",
            "1",
            "--request-count",
            "16",
            "--replay-concurrency",
            "16",
        ]);
        let e = check_sessions(&a, 64, Some(8 << 30)).expect_err("refused");
        assert_eq!(
            e.message,
            "--turns-per-session 1 × --input-tokens 2000000000 × --replay-concurrency 16: the sessions in flight need \
             about 31.7 GiB of memory; this machine has 8.0 GiB available"
        );
        assert_eq!(e.code, 2);
        assert!(check_sessions(&a, 64, Some(40 << 30)).is_ok());
    }
}
