//! `servesim predict`'s flags ([`PredictArgs`], with the `-c FILE` form's [`ConfigFlags`]) and
//! the checks and values read from them alone: the timing jitter, the queue limit, which flag a
//! failed run is about.

use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};
use servesim_replay::memory::available as available_memory;
use servesim_replay::{Overflow, QueueLimit, SimError};
use servesim_workload::error::short_number;
use servesim_workload::TraceFormat;

use crate::failure::Failure;
use crate::flags::router::Router;
use crate::flags::{Format, Stack};

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
pub enum QueuePolicy {
    Fail,
    Shed,
}

#[derive(Args, Debug)]
pub struct PredictArgs {
    /// Trace files to replay (plain, gzip or zstd; a pipe works too). Several Mooncake files or
    /// Dynamo shards are replayed together; a Weka source may be a directory. Limits: a line
    /// may hold 256 MiB ($SERVESIM_MAX_LINE_BYTES), a compressed file may decompress to 1000
    /// times its size or 1 GiB ($SERVESIM_MAX_DECOMPRESSED_BYTES), a pipe is copied to $TMPDIR
    /// up to 16 GiB ($SERVESIM_MAX_SPOOL_BYTES); values in bytes, or with a K, M, G suffix.
    #[arg(value_name = "TRACE")]
    pub(crate) traces: Vec<PathBuf>,
    /// mooncake | mooncake-delta | applied_compute_agentic | agentic_mooncake | dynamo | weka.
    #[arg(long, value_parser = parse_trace_format, default_value = "mooncake", value_name = "FORMAT")]
    pub(crate) trace_format: TraceFormat,
    /// Tokens each trace hash id stands for (default: 512 for Mooncake formats; the trace's own
    /// for agentic_mooncake, dynamo and weka, which it must then match).
    #[arg(long, value_name = "TOKENS")]
    pub(crate) trace_block_size: Option<u32>,
    /// Agentic traces: replay plays as a closed loop on N lanes (a lane starts the next play
    /// when its play ends).
    #[arg(long, value_name = "N")]
    pub(crate) agentic_lanes: Option<u32>,
    /// Agentic traces: the target model the source models are projected onto (required for
    /// agentic_mooncake, weka and agentic Dynamo traces; reported, no effect on timing).
    #[arg(long, value_name = "NAME")]
    pub(crate) execution_model: Option<String>,
    /// Weka: nested subagent timestamps are absolute, relative to their marker, or decided
    /// from the corpus (auto).
    #[arg(long, value_enum, value_name = "BASIS")]
    pub(crate) weka_nested_timestamp_basis: Option<NestedBasis>,
    /// applied_compute_agentic: fraction of the initial prompt shared within a prefix group.
    #[arg(long, default_value_t = 0.0, value_name = "RATIO")]
    pub(crate) trace_shared_prefix_ratio: f64,
    /// applied_compute_agentic: number of prefix groups (line % groups).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub(crate) trace_num_prefix_groups: u32,

    /// Engine configuration: inline JSON or a JSON file, flat `MockEngineArgs` or Dynamo's
    /// canonical `{"engine": {...}}` form.
    #[arg(long, value_name = "JSON|PATH")]
    pub(crate) extra_engine_args: Option<String>,
    /// Aggregated workers (default 1).
    #[arg(long, value_name = "N")]
    pub(crate) num_workers: Option<u32>,
    #[arg(long, value_enum, default_value = "round_robin")]
    pub(crate) router_mode: Router,
    /// KV router configuration (Dynamo's `KvRouterConfig` keys): inline JSON or a JSON file.
    #[arg(long, value_name = "JSON|PATH")]
    pub(crate) router_config: Option<String>,
    #[command(flatten)]
    pub(crate) router_load: crate::flags::ais::RouterLoadFlags,
    /// Seed of the KV router's random choices (ties, softmax sampling).
    #[arg(long, default_value_t = 42, value_name = "SEED")]
    pub(crate) router_seed: u64,
    /// Delay before the KV router sees the cache events of a pass.
    #[arg(long, default_value_t = 0.0, value_name = "MS")]
    pub(crate) kv_event_lag_ms: f64,
    /// Router policy classes for the KV router's queue (Dynamo's policy YAML: families,
    /// uncached-ISL buckets, classes with quantum, busy thresholds and limits). Default: the
    /// router configuration's `router_policy_config`, else $DYN_ROUTER_POLICY_CONFIG.
    #[arg(long, value_name = "FILE")]
    pub(crate) router_policy_config: Option<String>,
    /// The model the requests are for: picks its profile under `models:` in the router policy
    /// configuration (otherwise the root profile applies).
    #[arg(long, value_name = "NAME")]
    pub(crate) model_name: Option<String>,

    /// Disaggregated serving: workers that compute prompts.
    #[arg(long, value_name = "N", help_heading = "Disaggregated serving")]
    pub(crate) num_prefill_workers: Option<u32>,
    /// Disaggregated serving: workers that generate tokens.
    #[arg(long, value_name = "N", help_heading = "Disaggregated serving")]
    pub(crate) num_decode_workers: Option<u32>,
    /// Engine of the prefill workers (default: --extra-engine-args). `kv_transfer_bandwidth`
    /// (GB/s) and `kv_bytes_per_token` here set the KV transfer time.
    #[arg(long, value_name = "JSON|PATH", help_heading = "Disaggregated serving")]
    pub(crate) prefill_engine_args: Option<String>,
    /// Engine of the decode workers (default: --extra-engine-args).
    #[arg(long, value_name = "JSON|PATH", help_heading = "Disaggregated serving")]
    pub(crate) decode_engine_args: Option<String>,

    /// Autoscale the workers with Dynamo's Planner: its `PlannerConfig` as inline JSON or a JSON
    /// file (`mode` agg/disagg, `optimization_target`, intervals, budgets, predictor, ...). The
    /// report then has a `planner` object beside the `summary`.
    #[arg(long, value_name = "JSON|PATH")]
    pub(crate) planner_config: Option<String>,

    /// Closed loop: at most N sessions in flight (timestamps are ignored).
    #[arg(long, value_name = "N")]
    pub(crate) replay_concurrency: Option<u32>,
    /// Overload: at most N requests may wait for admission (arrived, not yet admitted by an
    /// engine); what happens beyond is --max-queued-policy. Without it, an open-loop run stops
    /// (exit 1) when 100 × --queue-warning requests wait: give --max-queued to let the queue
    /// grow further.
    #[arg(long, value_name = "N")]
    pub(crate) max_queued: Option<u64>,
    /// Overload: `fail` stops the run with an error (exit 1) when a request arrives at a full
    /// queue; `shed` drops it and counts it as `shed_requests` in the report.
    #[arg(long, value_enum, default_value = "fail", value_name = "POLICY")]
    pub(crate) max_queued_policy: QueuePolicy,
    /// Overload: warn once on stderr when more than N requests wait for admission.
    #[arg(long, default_value_t = 100_000, value_name = "N")]
    pub(crate) queue_warning: u64,
    /// Divide arrival times (trace timestamps, or the generated synthetic arrivals) and think
    /// times by X (not with --replay-concurrency).
    #[arg(long, value_name = "X")]
    pub(crate) arrival_speedup_ratio: Option<f64>,

    /// Synthetic load: prompt tokens per request.
    #[arg(long, value_name = "N", help_heading = "Synthetic load")]
    pub(crate) input_tokens: Option<u32>,
    /// Synthetic load: output tokens per request.
    #[arg(long, value_name = "N", help_heading = "Synthetic load")]
    pub(crate) output_tokens: Option<u32>,
    /// Synthetic load: number of requests (sessions when --turns-per-session > 1).
    #[arg(long, value_name = "N", help_heading = "Synthetic load")]
    pub(crate) request_count: Option<u32>,
    /// Synthetic load: Poisson arrivals at R sessions per second.
    #[arg(long, value_name = "R", help_heading = "Synthetic load")]
    pub(crate) request_rate: Option<f64>,
    /// Synthetic load: one session every X ms.
    #[arg(long, value_name = "MS", help_heading = "Synthetic load")]
    pub(crate) arrival_interval_ms: Option<f64>,
    #[arg(long, default_value_t = 42, value_name = "SEED", help_heading = "Synthetic load")]
    pub(crate) arrival_seed: u64,
    #[arg(long, default_value_t = 1, value_name = "N", help_heading = "Synthetic load")]
    pub(crate) turns_per_session: u32,
    /// Fraction of each prompt shared within its prefix group.
    #[arg(long, default_value_t = 0.0, value_name = "RATIO", help_heading = "Synthetic load")]
    pub(crate) shared_prefix_ratio: f64,
    #[arg(long, default_value_t = 0, value_name = "N", help_heading = "Synthetic load")]
    pub(crate) num_prefix_groups: u32,
    #[arg(long, default_value_t = 0.0, value_name = "MS", help_heading = "Synthetic load")]
    pub(crate) inter_turn_delay_ms: f64,

    /// Goodput: time-to-first-token bound.
    #[arg(long, value_name = "MS", help_heading = "Goodput")]
    pub(crate) sla_ttft_ms: Option<f64>,
    /// Goodput: bound on a request's mean inter-token latency.
    #[arg(long, value_name = "MS", help_heading = "Goodput")]
    pub(crate) sla_itl_ms: Option<f64>,
    /// Goodput: end-to-end latency bound.
    #[arg(long, value_name = "MS", help_heading = "Goodput")]
    pub(crate) sla_e2e_ms: Option<f64>,

    /// Write the summary JSON here.
    #[arg(long, value_name = "PATH", help_heading = "Output")]
    pub(crate) report_json: Option<PathBuf>,
    /// Write one JSON record per request here.
    #[arg(long, value_name = "PATH", help_heading = "Output")]
    pub(crate) report_jsonl: Option<PathBuf>,
    /// Simulate every pass one by one instead of collapsing decode-only stretches. Slower; it
    /// exists to check fast-forwarding. Identical to a default run: every per-request record
    /// (byte for byte, though requests finishing at the same instant may be listed in another
    /// order) and every summary value except the pooled token-gap statistics (`mean_itl_ms`,
    /// `std_itl_ms`, `mean_output_token_throughput_per_user`,
    /// `std_output_token_throughput_per_user`), which are summed in another order and may differ
    /// in the last digits; and the wall-clock values.
    #[arg(long, help_heading = "Output")]
    pub(crate) no_fast_forward: bool,
    /// Leave out the values measured on the host's clock (`wall_time_ms`,
    /// `processed_tokens_per_s`, `processed_output_tokens_per_s`, the table's wall time), so two
    /// runs of the same inputs and seeds give byte-identical reports.
    #[arg(long, help_heading = "Output")]
    pub(crate) no_wall_clock: bool,
    /// Replay round-robin workers in one loop even when they could run separately on several
    /// threads (per-request results are identical; pooled means may differ in the last bits).
    #[arg(long, help_heading = "Output")]
    pub(crate) no_split_workers: bool,
    /// Threads for runs whose workers replay separately (0: every core).
    #[arg(long, value_name = "N", default_value_t = 0, help_heading = "Output")]
    pub(crate) threads: usize,
    /// Run N seeded variations (arrival seed for synthetic load, router and token seeds) on
    /// every core and report each metric as the median with a 90 % interval (`<key>_p05`,
    /// `<key>_p95` in JSON). Trace timestamps are replayed as they are.
    #[arg(long, value_name = "N", help_heading = "Output")]
    pub(crate) ensemble: Option<usize>,
    /// Pace the replay on the wall clock, as aisimulate's `predict --online`: each simulated
    /// millisecond takes a wall millisecond (engine speedup ratios included), so the run lasts
    /// about its simulated duration. The report is the unpaced run's but for its wall-clock
    /// values.
    #[arg(long, help_heading = "Output")]
    pub(crate) online: bool,
    /// Multiply every forward pass's modelled duration by a random factor with mean 1 and this
    /// coefficient of variation (log-normal; e.g. 0.05), drawn from a stream seeded by
    /// --arrival-seed (and per ensemble member). 0, the default, leaves timing exact.
    #[arg(long, value_name = "CV", allow_negative_numbers = true, help_heading = "Output")]
    pub(crate) timing_jitter_cv: Option<f64>,
    /// `table` (default) prints the metrics table; `json` prints only the summary object.
    #[arg(long, value_enum, default_value = "table", help_heading = "Output")]
    pub(crate) format: Format,
    #[command(flatten)]
    pub(crate) reports: crate::flags::reports::ReportFlags,
    #[command(flatten)]
    pub(crate) deploy: ConfigFlags,
}

/// The flags of the configuration-file form of predict.
#[derive(Args, Debug, Default)]
pub struct ConfigFlags {
    /// A unified deployment YAML (traffic / engine / evaluation / router); replaces the
    /// trace, engine and load flags.
    #[arg(short = 'c', long = "config", value_name = "FILE", help_heading = "Deployment config")]
    pub config: Option<PathBuf>,
    /// Override a configuration value: a dotted key path and a YAML value (repeatable).
    #[arg(long = "set", value_name = "PATH=VALUE", help_heading = "Deployment config")]
    pub set: Vec<String>,
    /// Where prediction.json (and requests.jsonl) go.
    #[arg(long, value_name = "DIR", default_value = "aisimulate-output", help_heading = "Deployment config")]
    pub output_dir: PathBuf,
    /// Replace an existing output directory.
    #[arg(long, help_heading = "Deployment config")]
    pub overwrite: bool,
    /// Also write requests.jsonl, one record per request.
    #[arg(long, help_heading = "Deployment config")]
    pub capture_per_request: bool,
    /// Accepted for compatibility: servesim has one stack, and `router:` works with either.
    #[arg(long, value_enum, value_name = "NAME", help_heading = "Deployment config")]
    pub stack: Option<Stack>,
    /// A calibration file from `servesim calibrate`: its fitted timing corrections apply to
    /// every worker's AIS timing (and its frontend cost to the frontend); with --ensemble, its
    /// model error widens the intervals. With -c and in the flag form.
    #[arg(long, value_name = "FILE", help_heading = "Deployment config")]
    pub calibration: Option<PathBuf>,
}

impl ConfigFlags {
    /// Without -c these flags have nothing to act on.
    pub fn check_flag_form(&self) -> Result<(), Failure> {
        if !self.set.is_empty() || self.overwrite || self.capture_per_request || self.stack.is_some() {
            return Err(Failure::input(
                "--set, --overwrite, --capture-per-request and --stack apply to -c/--config (use --report-json / --report-jsonl with the flag form)",
            ));
        }
        if self.output_dir != Path::new("aisimulate-output") {
            return Err(Failure::input(
                "--output-dir applies to -c/--config (use --report-json / --report-jsonl with the flag form)",
            ));
        }
        Ok(())
    }
}

/// `--timing-jitter-cv`, checked (0 when absent).
pub(crate) fn timing_jitter_cv(cv: Option<f64>) -> Result<f64, Failure> {
    let Some(cv) = cv else { return Ok(0.0) };
    servesim_engine::TimingJitter::new(cv, 0).map_err(|e| Failure::input(format!("--timing-jitter-cv {e}")))?;
    Ok(cv)
}

/// `--online` paces one run; an ensemble is many.
pub(crate) fn check_online(online: bool, ensemble: Option<usize>) -> Result<(), Failure> {
    if online && ensemble.is_some() {
        return Err(Failure::input("--online paces one run on the wall clock; drop --ensemble (or --online)"));
    }
    Ok(())
}

/// What `--queue-warning`, `--max-queued` and `--max-queued-policy` ask of the load driver.
pub(super) fn queue_limit(a: &PredictArgs) -> QueueLimit {
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
pub(super) fn sim_failure(a: &PredictArgs, e: SimError) -> Failure {
    match e {
        SimError::TimeRange { .. } => match a.arrival_speedup_ratio {
            Some(r) => Failure::input(format!("--arrival-speedup-ratio {}: {e}", short_number(r))),
            None if !a.traces.is_empty() => Failure::input(format!("the trace's timestamps and delays: {e}")),
            None => Failure::input(e),
        },
        // The engine arguments cannot serve the workload: an input error. So is a workload
        // that cannot go on (an agentic profile past its request bound, or refilling forever).
        e @ (SimError::Unschedulable { .. } | SimError::Workload { .. }) => Failure::input(e),
        e => Failure::run(e),
    }
}
