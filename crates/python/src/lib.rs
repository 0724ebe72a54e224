//! `servesim._core`: the native half of the `servesim` Python package.
//!
//! The Python side (`python/servesim/`) does the argument plumbing and the reference's
//! Python-side validation; this module does what needs the Rust core: normalising engine
//! configurations, running a replay on the virtual clock, and running the live server in-process
//! (`live::LiveServer`, behind `servesim.mocker.main.launch_workers`). Values cross the boundary
//! as JSON text, which keeps the key order of the summary and per-request records exactly as the
//! report emits it (`json.loads` preserves order).
//!
//! A replay runs with the GIL released. The driver asks [`Progress::cancelled`] now and then;
//! the binding answers by briefly taking the GIL and running Python's signal handlers, so
//! Ctrl-C raises `KeyboardInterrupt` within a fraction of a second and the run stops cleanly.
//! An online replay (`online=True`) is the same run paced by a [`servesim_replay::WallClock`]: the driver
//! sleeps until each virtual instant is due, asking [`Progress::cancelled`] while it sleeps.

mod live;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use serde_json::Value;
use servesim_engine::{ConfigEnv, ConfigError, PassTimer, WorkerArgs};
use servesim_replay::planned::PlannerRun;
use servesim_replay::telemetry::dynamo_sample_jsonl;
use servesim_replay::{
    request_json, ClusterSample, Progress, RequestRecord, RouterMode, Run, SimConfig, SimError, Sla, TelemetrySink,
    Topology, WorkerSample,
};
use servesim_router::{PolicyConfig, RouterConfig};
use servesim_workload::formats::WekaBasis;
use servesim_workload::{load_trace, Arrivals, LoadMode, SyntheticSpec, TraceFormat, TraceOptions, Workload};

fn timer_factory(key: &str, provider: &str, config: &Value) -> Result<Arc<dyn PassTimer>, ConfigError> {
    servesim_perf::build_timer(key, provider, config)
}

/// Parses an engine configuration (either of Dynamo's JSON shapes); relative file paths inside
/// it (timing profiles) are relative to `dir`.
pub(crate) fn worker_args(text: &str, dir: &Path) -> Result<WorkerArgs, String> {
    let value: Value = serde_json::from_str(text).map_err(|e| format!("invalid JSON: {e}"))?;
    let files = |path: &str| {
        let full = dir.join(path);
        std::fs::read(&full).map_err(|e| format!("cannot read {}: {e}", full.display()))
    };
    WorkerArgs::from_value_env(&value, ConfigEnv { files: &files, timers: Some(&timer_factory), ..ConfigEnv::NONE })
        .map_err(|e| config_message(&e))
}

/// The reference's wording: `invalid engine launch config: <path>: <message>`.
fn config_message(e: &ConfigError) -> String {
    if e.path.is_empty() {
        format!("invalid engine launch config: {}", e.message)
    } else {
        format!("invalid engine launch config: {}: {}", e.path, e.message)
    }
}

/// `_normalize_mocker_config(text)`: the canonical form of a configuration as JSON text.
#[pyfunction]
fn normalize_mocker_config_json(text: &str) -> PyResult<String> {
    let args = worker_args(text, Path::new(".")).map_err(PyValueError::new_err)?;
    Ok(args.to_canonical_json().to_string())
}

/// An error raised by Python code the run calls back (a telemetry callback); the run stops at
/// its next check and the error is re-raised.
type CallbackError = Arc<Mutex<Option<PyErr>>>;

/// Polls Python's signal handlers from inside the run (at most every 50 ms), and stops the run
/// once a callback has raised.
struct Interrupts {
    last: Instant,
    error: Option<PyErr>,
    callback_error: CallbackError,
}

impl Progress for Interrupts {
    fn update(&mut self, _finished: u64, _total: u64) {}

    fn cancelled(&mut self) -> bool {
        if self.error.is_none() {
            if let Some(e) = self.callback_error.lock().unwrap_or_else(|p| p.into_inner()).take() {
                self.error = Some(e);
            }
        }
        if self.error.is_none() && self.last.elapsed() >= Duration::from_millis(50) {
            self.last = Instant::now();
            if let Err(e) = Python::with_gil(|py| py.check_signals()) {
                self.error = Some(e);
            }
        }
        self.error.is_some()
    }
}

/// `telemetry_options` as the Python side resolved them: the sample interval and the sinks.
struct TelemetryJob {
    interval_ms: f64,
    /// Keep the samples and return them (`ReplayReport.telemetry`).
    capture: bool,
    /// Called with each sample as a dict, with the GIL taken, as the run reaches it.
    callback: Option<Py<PyAny>>,
    /// Each sample as one JSON line.
    jsonl_path: Option<PathBuf>,
}

/// Feeds each sample, shaped as Dynamo's replay telemetry shapes it
/// ([`dynamo_sample_jsonl`]), to the sinks `telemetry_options` asked for.
struct PythonTelemetry {
    line: String,
    captured: Option<Vec<String>>,
    file: Option<std::io::BufWriter<std::fs::File>>,
    write_error: Option<std::io::Error>,
    /// The callback and `json.loads`.
    callback: Option<(Py<PyAny>, Py<PyAny>)>,
    callback_error: CallbackError,
}

impl TelemetrySink for PythonTelemetry {
    fn sample(&mut self, cluster: &ClusterSample, workers: &[WorkerSample]) {
        self.line.clear();
        dynamo_sample_jsonl(cluster, workers, &mut self.line);
        if let Some(file) = self.file.as_mut() {
            if self.write_error.is_none() {
                if let Err(e) = file.write_all(self.line.as_bytes()) {
                    self.write_error = Some(e);
                }
            }
        }
        let text = self.line.trim_end();
        if let Some(captured) = self.captured.as_mut() {
            captured.push(text.to_string());
        }
        if let Some((callback, loads)) = &self.callback {
            let mut slot = self.callback_error.lock().unwrap_or_else(|p| p.into_inner());
            if slot.is_none() {
                let called = Python::with_gil(|py| -> PyResult<()> {
                    let sample = loads.call1(py, (text,))?;
                    callback.call1(py, (sample,))?;
                    Ok(())
                });
                if let Err(e) = called {
                    *slot = Some(e);
                }
            }
        }
    }
}

/// Everything a replay needs, owned, so that it can run without the GIL.
struct Job {
    trace_files: Vec<PathBuf>,
    extra_engine_args: Option<String>,
    prefill_engine_args: Option<String>,
    decode_engine_args: Option<String>,
    disaggregated: bool,
    router_config: Option<String>,
    num_workers: u32,
    num_prefill_workers: u32,
    num_decode_workers: u32,
    replay_concurrency: Option<u32>,
    agentic_lanes: Option<u32>,
    kv_router: bool,
    arrival_speedup_ratio: f64,
    trace_block_size: Option<u32>,
    trace_format: TraceFormat,
    trace_shared_prefix_ratio: f64,
    trace_num_prefix_groups: u32,
    execution_model: Option<String>,
    weka_basis: Option<WekaBasis>,
    sla: Sla,
    capture_per_request: bool,
    report_jsonl_path: Option<PathBuf>,
    kv_event_lag_ms: f64,
    router_seed: u64,
    synthetic: Option<SyntheticSpec>,
    /// `max_sim_time_ms`: the replay stops at this virtual time; requests in flight then are
    /// reported incomplete.
    stop_at_ms: Option<f64>,
    /// The planner in the loop, as `servesim predict --planner-config` takes it (JSON text).
    planner_config: Option<String>,
    /// Picks the model's profile in a router policy file.
    model_name: Option<String>,
    telemetry: Option<TelemetryJob>,
    /// `replay_mode="online"`: pace the run on the wall clock (virtual ms = wall ms from the
    /// start of the simulation).
    online: bool,
}

enum Failure {
    Input(String),
    /// Bad values the reference rejects with `ValueError`.
    Value(String),
    Interrupted(PyErr),
}

/// Reads the KV router's policy classes from the file its configuration names
/// (`router_policy_config`, a YAML path as in Dynamo's `KvRouterConfig`) and sets the profile of
/// `model_name` (else the file's root profile). `$DYN_ROUTER_POLICY_CONFIG` is not read here:
/// the reference's Python replay does not read it either. Errors are the reference's
/// `ValueError` messages.
pub(crate) fn load_router_policy(rc: &mut RouterConfig, model_name: Option<&str>) -> Result<(), String> {
    let Some(path) = rc.policy_config_path.clone() else { return Ok(()) };
    let text = servesim_workload::input::read_config_text(&path)
        .map_err(|e| format!("failed to read router policy config {path}: {e}"))?;
    let config =
        PolicyConfig::from_yaml(&text).map_err(|e| format!("failed to parse router policy config {path}: {e}"))?;
    rc.policy_profile = config.profile(model_name).cloned().map(Arc::new);
    Ok(())
}

/// Refuses worker counts whose state cannot fit in this machine's memory before anything is
/// allocated for them (the CLI's check; the process would otherwise abort out of memory).
fn check_workers((count, name): (u64, &str), memory: Option<u64>) -> Result<(), String> {
    use servesim_replay::memory::{gib, WORKER_BYTES};
    let Some(memory) = memory else { return Ok(()) };
    let need = count.saturating_mul(WORKER_BYTES);
    if need > memory {
        return Err(format!(
            "{name}: {count} workers need about {} of memory; this machine has {} available (at most {} workers)",
            gib(need),
            gib(memory),
            memory / WORKER_BYTES
        ));
    }
    Ok(())
}

/// Refuses synthetic sessions whose prompts cannot fit in this machine's memory before any is
/// generated (the CLI's check): closed-loop runs hold `replay_concurrency` sessions at once.
fn check_sessions(spec: &SyntheticSpec, concurrency: Option<u32>, memory: Option<u64>) -> Result<(), String> {
    use servesim_replay::memory::{gib, session_bytes};
    let Some(memory) = memory else { return Ok(()) };
    let per_session = session_bytes(spec.input_tokens as u64, spec.turns_per_session as u64, spec.block_tokens as u64);
    let sessions = concurrency.unwrap_or(1).min(spec.sessions).max(1) as u64;
    let need = per_session.saturating_mul(sessions);
    if need > memory {
        return Err(format!(
            "turns_per_session {} × input_tokens {}{}: the sessions in flight need about {} of memory; this \
             machine has {} available",
            spec.turns_per_session,
            spec.input_tokens,
            if sessions > 1 { format!(" × replay_concurrency {sessions}") } else { String::new() },
            gib(need),
            gib(memory)
        ));
    }
    Ok(())
}

impl Job {
    fn engine(arg: Option<&str>) -> Result<WorkerArgs, Failure> {
        match arg {
            None => Ok(WorkerArgs::default()),
            Some(text) => worker_args(text, Path::new(".")).map_err(Failure::Input),
        }
    }

    fn topology(&self) -> Result<Topology, Failure> {
        let engine = Self::engine(self.extra_engine_args.as_deref())?;
        let topology = if self.disaggregated {
            let staged = |arg: &Option<String>| match arg {
                Some(text) => Self::engine(Some(text)),
                None => Ok(engine.clone()),
            };
            Topology::disaggregated(
                (staged(&self.prefill_engine_args)?, self.num_prefill_workers),
                (staged(&self.decode_engine_args)?, self.num_decode_workers),
            )
        } else {
            Topology::aggregated(engine, self.num_workers)
        };
        topology.map_err(|e| Failure::Input(format!("{} {}", e.field, e.message)))
    }

    fn workload(&self, block_size: u32) -> Result<(Workload, LoadMode), Failure> {
        if let Some(spec) = &self.synthetic {
            let spec = SyntheticSpec { block_tokens: block_size, ..spec.clone() };
            spec.validate().map_err(|e| Failure::Input(e.to_string()))?;
            check_sessions(&spec, self.replay_concurrency, servesim_replay::memory::available())
                .map_err(Failure::Input)?;
            let load = match self.replay_concurrency {
                Some(c) => LoadMode::Concurrency { max_sessions: c },
                None => LoadMode::Timestamps { speedup: self.arrival_speedup_ratio },
            };
            return Ok((Workload::Synthetic(spec), load));
        }
        let options = TraceOptions {
            trace_block_size: self.trace_block_size,
            arrival_speedup_ratio: self.arrival_speedup_ratio,
            replay_concurrency: self.replay_concurrency,
            agentic_lanes: self.agentic_lanes,
            execution_model: self.execution_model.clone(),
            shared_prefix_ratio: self.trace_shared_prefix_ratio,
            num_prefix_groups: self.trace_num_prefix_groups,
            weka_basis: self.weka_basis,
            ..TraceOptions::new(self.trace_format)
        };
        load_trace(&self.trace_files, &options).map_err(|e| Failure::Input(e.to_string()))
    }

    /// Runs the replay; returns the summary, the per-request records and the planner's report,
    /// as JSON text.
    fn run(self) -> Result<Replayed, Failure> {
        let started = Instant::now();
        let workers = if self.disaggregated {
            (
                self.num_prefill_workers as u64 + self.num_decode_workers as u64,
                "num_prefill_workers + num_decode_workers",
            )
        } else {
            (self.num_workers as u64, "num_workers")
        };
        check_workers(workers, servesim_replay::memory::available()).map_err(Failure::Input)?;
        let topology = self.topology()?;
        let router = if self.kv_router {
            RouterMode::KvRouter(match &self.router_config {
                Some(text) => {
                    let mut rc =
                        RouterConfig::parse_json(text).map_err(|e| Failure::Input(format!("router_config: {e}")))?;
                    load_router_policy(&mut rc, self.model_name.as_deref()).map_err(Failure::Value)?;
                    rc
                }
                None => RouterConfig::default(),
            })
        } else {
            RouterMode::RoundRobin
        };
        let (workload, load) = self.workload(topology.block_size())?;
        let config = SimConfig {
            router_seed: self.router_seed,
            kv_event_lag_ms: self.kv_event_lag_ms,
            sla: self.sla,
            seed: self.synthetic.as_ref().map_or(42, |s| s.seed),
            ..SimConfig::new(topology, router, load)
        };
        let mut jsonl = match &self.report_jsonl_path {
            Some(path) => Some(std::io::BufWriter::new(
                std::fs::File::create(path)
                    .map_err(|e| Failure::Input(format!("{}: cannot create: {e}", path.display())))?,
            )),
            None => None,
        };
        let keep = self.capture_per_request || jsonl.is_some();
        // Agentic records come out in graph order (by request id), as the reference lists them.
        // Others in release order, as the reference lists them (not in completion order).
        let mut records: Vec<(u64, u64, Value)> = Vec::new();
        let mut sink = |r: &RequestRecord| {
            let node = r.meta.as_ref().and_then(|m| m.agentic.as_ref()).map_or(0, |ids| ids.node as u64);
            records.push((node, r.ordinal, request_json(r)));
        };
        let sink_ref: Option<&mut (dyn FnMut(&RequestRecord) + Send)> = if keep { Some(&mut sink) } else { None };
        let planner = match &self.planner_config {
            Some(text) => {
                let v: Value = serde_json::from_str(text)
                    .map_err(|e| Failure::Input(format!("planner_config: malformed JSON: {e}")))?;
                let cfg = servesim_planner::PlannerConfig::from_json(&v).map_err(|e| {
                    let at = if e.path.is_empty() { String::new() } else { format!("{}: ", e.path) };
                    Failure::Input(format!("planner_config: {at}{}", e.message))
                })?;
                let run = PlannerRun::for_topology(cfg, &config.topology, servesim_perf::planner_model)
                    .map_err(|e| Failure::Input(format!("planner_config: {e}")))?;
                Some(run)
            }
            None => None,
        };
        let callback_error: CallbackError = Arc::default();
        let mut telemetry = match &self.telemetry {
            Some(t) => Some(PythonTelemetry {
                line: String::new(),
                captured: t.capture.then(Vec::new),
                file: match &t.jsonl_path {
                    Some(path) => Some(std::io::BufWriter::new(
                        std::fs::File::create(path)
                            .map_err(|e| Failure::Input(format!("{}: cannot create: {e}", path.display())))?,
                    )),
                    None => None,
                },
                write_error: None,
                callback: t.callback.as_ref().map(|c| {
                    Python::with_gil(|py| {
                        let loads = py.import("json").and_then(|m| m.getattr("loads")).map(|f| f.unbind());
                        (c.clone_ref(py), loads.expect("the json module imports"))
                    })
                }),
                callback_error: callback_error.clone(),
            }),
            None => None,
        };
        let mut run = Run::new(&workload, &config)
            .records(sink_ref)
            .planner(planner)
            .stop_at_ms(self.stop_at_ms)
            .online(self.online);
        if let (Some(sink), Some(t)) = (telemetry.as_mut(), &self.telemetry) {
            run = run.telemetry(t.interval_ms, sink).dynamo_samples();
        }
        let mut interrupts = Interrupts { last: Instant::now(), error: None, callback_error: callback_error.clone() };
        let mut ran = match run.go(&mut interrupts) {
            Ok(ran) => ran,
            Err(SimError::Cancelled { .. }) => {
                let e = interrupts.error.unwrap_or_else(|| pyo3::exceptions::PyKeyboardInterrupt::new_err(()));
                return Err(Failure::Interrupted(e));
            }
            Err(e) => return Err(Failure::Input(e.to_string())),
        };
        // A callback that raised at the last sample (after the loop's last check).
        if let Some(e) = callback_error.lock().unwrap_or_else(|p| p.into_inner()).take() {
            return Err(Failure::Interrupted(e));
        }
        let samples = match telemetry {
            Some(mut t) => {
                let path = self.telemetry.as_ref().and_then(|t| t.jsonl_path.as_ref());
                if let (Some(file), Some(path)) = (t.file.as_mut(), path) {
                    let flushed = match t.write_error.take() {
                        Some(e) => Err(e),
                        None => file.flush(),
                    };
                    flushed.map_err(|e| Failure::Input(format!("{}: write failed: {e}", path.display())))?;
                }
                t.captured
            }
            None => None,
        };
        ran.report.wall_time_ms = started.elapsed().as_secs_f64() * 1000.0;
        let mut summary = ran.report.summary_json();
        summary.extend(servesim_replay::workload_keys(&workload));
        ran.add_planner_keys(&mut summary);
        if let Some(e) = workload.take_error() {
            return Err(Failure::Input(e.to_string()));
        }
        records.sort_by_key(|&(node, seq, _)| (node, seq));
        let lines: Vec<String> = records.into_iter().map(|(_, _, v)| v.to_string()).collect();
        if let (Some(w), Some(path)) = (jsonl.as_mut(), self.report_jsonl_path.as_ref()) {
            use std::io::Write;
            let mut write = || -> std::io::Result<()> {
                for line in &lines {
                    w.write_all(line.as_bytes())?;
                    w.write_all(b"\n")?;
                }
                w.flush()
            };
            write().map_err(|e| Failure::Input(format!("{}: write failed: {e}", path.display())))?;
        }
        let summary = Value::Object(summary).to_string();
        Ok((
            summary,
            self.capture_per_request.then_some(lines),
            ran.planner.map(|run| run.to_json().to_string()),
            samples,
        ))
    }
}

/// What a replay hands back to Python: the summary (JSON), the per-request records (JSON lines)
/// when captured, the planner's report (JSON) when a planner ran, and the telemetry samples
/// (JSON lines) when captured in memory.
type Replayed = (String, Option<Vec<String>>, Option<String>, Option<Vec<String>>);

/// A synthetic load as the Python side passes it: input and output tokens, sessions, request
/// rate, arrival interval (ms), seed, turns per session, shared prefix ratio, prefix groups,
/// inter-turn delay (ms).
type SyntheticArgs = (u32, u32, u32, Option<f64>, Option<f64>, u64, u32, f64, u32, f64);

fn parse_format(name: &str) -> PyResult<TraceFormat> {
    TraceFormat::parse(name).ok_or_else(|| {
        PyException::new_err(format!(
            "trace_format must be 'mooncake', 'mooncake-delta', 'agentic_mooncake'/'agentic-mooncake', 'weka', \
             'applied_compute_agentic', or 'dynamo', got '{name}'"
        ))
    })
}

/// Runs a replay on the virtual clock, paced on the wall clock when `online`. Engine and router
/// configurations are JSON text (the Python side serialises mappings). Returns
/// `(summary_json, per_request_json_lines | None, planner_json | None, telemetry_json_lines | None)`.
/// Errors in the input raise `Exception` with the driver's message; Ctrl-C raises
/// `KeyboardInterrupt`.
#[pyfunction]
#[pyo3(signature = (
    trace_files, *, extra_engine_args=None, prefill_engine_args=None, decode_engine_args=None,
    disaggregated=false, router_config=None, num_workers=1, num_prefill_workers=1, num_decode_workers=1,
    replay_concurrency=None, agentic_lanes=None, router_mode="round_robin", arrival_speedup_ratio=1.0,
    trace_block_size=None, trace_format="mooncake", trace_shared_prefix_ratio=0.0,
    trace_num_prefix_groups=0, execution_model=None, weka_nested_timestamp_basis=None,
    sla_ttft_ms=None, sla_itl_ms=None, sla_e2e_ms=None, capture_per_request=false,
    report_jsonl_path=None, kv_event_lag_ms=None, router_seed=42, synthetic=None, max_sim_time_ms=None,
    planner_config=None, model_name=None, telemetry_sample_interval_ms=None, capture_telemetry=false,
    telemetry_callback=None, telemetry_jsonl_path=None, online=false
))]
#[allow(clippy::too_many_arguments)]
fn run_replay(
    py: Python<'_>,
    trace_files: Vec<PathBuf>,
    extra_engine_args: Option<String>,
    prefill_engine_args: Option<String>,
    decode_engine_args: Option<String>,
    disaggregated: bool,
    router_config: Option<String>,
    num_workers: u32,
    num_prefill_workers: u32,
    num_decode_workers: u32,
    replay_concurrency: Option<u32>,
    agentic_lanes: Option<u32>,
    router_mode: &str,
    arrival_speedup_ratio: f64,
    trace_block_size: Option<u32>,
    trace_format: &str,
    trace_shared_prefix_ratio: f64,
    trace_num_prefix_groups: u32,
    execution_model: Option<String>,
    weka_nested_timestamp_basis: Option<String>,
    sla_ttft_ms: Option<f64>,
    sla_itl_ms: Option<f64>,
    sla_e2e_ms: Option<f64>,
    capture_per_request: bool,
    report_jsonl_path: Option<PathBuf>,
    kv_event_lag_ms: Option<f64>,
    router_seed: u64,
    synthetic: Option<SyntheticArgs>,
    max_sim_time_ms: Option<f64>,
    planner_config: Option<String>,
    model_name: Option<String>,
    telemetry_sample_interval_ms: Option<f64>,
    capture_telemetry: bool,
    telemetry_callback: Option<Py<PyAny>>,
    telemetry_jsonl_path: Option<PathBuf>,
    online: bool,
) -> PyResult<Replayed> {
    // The reference's checks, in its order (for the first error of several).
    let kv_event_lag_ms = kv_event_lag_ms.unwrap_or(0.0);
    if !(kv_event_lag_ms.is_finite() && kv_event_lag_ms >= 0.0) {
        return Err(PyValueError::new_err(format!(
            "kv_event_lag_ms must be finite and non-negative, got {kv_event_lag_ms}"
        )));
    }
    if online && kv_event_lag_ms > 0.0 {
        return Err(PyValueError::new_err("kv_event_lag_ms only supports replay_mode='offline'"));
    }
    let kv_router = match router_mode {
        "round_robin" => false,
        "kv_router" => true,
        other => {
            return Err(PyException::new_err(format!(
                "router_mode must be either 'round_robin' or 'kv_router', got '{other}'"
            )))
        }
    };
    let trace_format = parse_format(trace_format)?;
    if max_sim_time_ms.is_some_and(|t| !(t.is_finite() && t >= 0.0)) {
        return Err(PyValueError::new_err("max_sim_time_ms must be a finite, non-negative value"));
    }
    if online && max_sim_time_ms.is_some() {
        return Err(PyValueError::new_err("max_sim_time_ms only supports replay_mode='offline'"));
    }
    if online && telemetry_sample_interval_ms.is_some() {
        return Err(PyValueError::new_err("replay telemetry only supports replay_mode='offline'"));
    }
    let weka_basis = match weka_nested_timestamp_basis.as_deref() {
        None => None,
        Some("auto") => Some(WekaBasis::Auto),
        Some("absolute") => Some(WekaBasis::Absolute),
        Some("relative") => Some(WekaBasis::Relative),
        Some(_) => {
            return Err(PyValueError::new_err("weka_nested_timestamp_basis must be 'auto', 'absolute', or 'relative'"))
        }
    };
    if replay_concurrency == Some(0) {
        return Err(PyException::new_err("replay_concurrency must be at least 1"));
    }
    if disaggregated && num_workers != 1 {
        return Err(PyException::new_err(
            "num_workers is only used for aggregated replay; use num_prefill_workers and num_decode_workers for disagg replay",
        ));
    }
    // The reference's online replay serves aggregated workers only.
    if online && disaggregated {
        return Err(PyException::new_err("disagg replay only supports replay_mode='offline'"));
    }
    if online && num_workers == 0 {
        return Err(PyException::new_err("online replay requires num_workers >= 1"));
    }
    if !(arrival_speedup_ratio.is_finite() && arrival_speedup_ratio > 0.0) {
        // The reference's synthetic replay names the argument; its trace reader does not.
        let name = if synthetic.is_some() { "arrival_speedup_ratio" } else { "ratio" };
        return Err(PyException::new_err(format!(
            "{name} must be a finite positive number, got {arrival_speedup_ratio}"
        )));
    }
    if trace_block_size == Some(0) {
        return Err(PyException::new_err("trace_block_size must be greater than 0"));
    }
    // Before anything is opened for writing (creating a report truncates it): as the
    // reference, refuse output paths that name a trace file (or one of its links) or each other.
    // Outputs inside a trace directory (a corpus the run walks) are refused too.
    let outputs: Vec<&PathBuf> = report_jsonl_path.iter().chain(telemetry_jsonl_path.iter()).collect();
    for (i, out) in outputs.iter().enumerate() {
        let clash = outputs[..i].iter().any(|other| servesim_workload::paths::same_file(out, other))
            || trace_files.iter().any(|trace| {
                servesim_workload::paths::same_file(out, trace) || servesim_workload::paths::inside_dir(out, trace)
            });
        if clash {
            return Err(PyValueError::new_err("replay output paths must differ from each other and trace files"));
        }
    }
    let telemetry = match telemetry_sample_interval_ms {
        None => None,
        Some(ms) => {
            if !(ms.is_finite() && ms > 0.0) {
                return Err(PyValueError::new_err("telemetry_sample_interval_ms must be a positive finite number"));
            }
            if telemetry_callback.as_ref().is_some_and(|c| !c.bind(py).is_callable()) {
                return Err(pyo3::exceptions::PyTypeError::new_err("telemetry_callback must be callable or None"));
            }
            Some(TelemetryJob {
                interval_ms: ms,
                capture: capture_telemetry,
                callback: telemetry_callback,
                jsonl_path: telemetry_jsonl_path,
            })
        }
    };
    let synthetic =
        synthetic.map(|(input_tokens, output_tokens, sessions, rate, interval, seed, turns, shared, groups, delay)| {
            SyntheticSpec {
                input_tokens,
                output_tokens,
                sessions,
                turns_per_session: turns,
                arrivals: match (rate, interval) {
                    (Some(rate_per_s), _) => Arrivals::Poisson { rate_per_s },
                    (_, Some(interval_ms)) => Arrivals::Interval { interval_ms },
                    _ => Arrivals::AllAtOnce,
                },
                seed,
                shared_prefix_ratio: shared,
                num_prefix_groups: groups,
                inter_turn_delay_ms: delay,
                block_tokens: 0,
                group_seed: servesim_workload::GROUP_SEED,
                cached_prefix_tokens: 0,
                accumulate: false,
                images: None,
            }
        });
    let job = Job {
        trace_files,
        extra_engine_args,
        prefill_engine_args,
        decode_engine_args,
        disaggregated,
        router_config,
        num_workers,
        num_prefill_workers,
        num_decode_workers,
        replay_concurrency,
        agentic_lanes,
        kv_router,
        arrival_speedup_ratio,
        trace_block_size,
        trace_format,
        trace_shared_prefix_ratio,
        trace_num_prefix_groups,
        execution_model,
        weka_basis,
        sla: Sla { ttft_ms: sla_ttft_ms, itl_ms: sla_itl_ms, e2e_ms: sla_e2e_ms },
        capture_per_request,
        report_jsonl_path,
        kv_event_lag_ms,
        router_seed,
        synthetic,
        stop_at_ms: max_sim_time_ms,
        planner_config,
        model_name,
        telemetry,
        online,
    };
    match py.allow_threads(move || job.run()) {
        Ok(out) => Ok(out),
        Err(Failure::Input(message)) => Err(PyException::new_err(message)),
        Err(Failure::Value(message)) => Err(PyValueError::new_err(message)),
        Err(Failure::Interrupted(e)) => Err(e),
    }
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(run_replay, m)?)?;
    m.add_function(wrap_pyfunction!(normalize_mocker_config_json, m)?)?;
    m.add_class::<live::LiveServer>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
