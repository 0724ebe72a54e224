//! `servesim._core.LiveServer`: the live server (`servesim serve`'s engines, routing frontend,
//! OpenAI-compatible HTTP, Prometheus metrics and ZMQ KV events) started inside the Python
//! process, for `servesim.mocker.main.launch_workers`.
//!
//! The server runs on its own tokio runtime (worker threads in the background); the engine ranks
//! are the live crate's own OS threads. Nothing it runs needs the GIL, and every call that waits
//! (starting, `wait`) releases it, so Python threads and the asyncio loop keep running while it
//! serves. `shutdown()` only asks: it is idempotent, returns at once, and the drain (stop
//! accepting, let in-flight responses finish for the grace period, then drop what is left and
//! stop the engines) happens on the runtime; `wait()` blocks until it is over.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use servesim_cluster::{RouterMode, Topology};
use servesim_live::{LiveError, ServeOptions, Shutdown, Timeouts};
use servesim_router::RouterConfig;
use tokio::sync::{oneshot, watch};

/// What the drain task reports once the server has stopped.
#[derive(Default)]
struct Done {
    report: Mutex<Option<Shutdown>>,
    changed: Condvar,
}

/// An in-process live server: one routing frontend over `num_workers` simulated workers.
#[pyclass(module = "servesim._core", frozen)]
pub struct LiveServer {
    addr: SocketAddr,
    worker_addrs: Vec<SocketAddr>,
    model: String,
    workers: usize,
    /// Taken by the first `shutdown()`.
    stop: Mutex<Option<oneshot::Sender<()>>>,
    /// Ends the grace period early.
    force: watch::Sender<bool>,
    done: Arc<Done>,
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
}

fn live_error(e: LiveError) -> PyErr {
    match e {
        LiveError::Listen { .. } | LiveError::ZmqBind { .. } | LiveError::Runtime(_) | LiveError::Spawn { .. } => {
            PyOSError::new_err(e.to_string())
        }
        LiveError::Model(_)
        | LiveError::WorkerPort { .. }
        | LiveError::ZmqPort { .. }
        | LiveError::StateCacheEvents { .. } => PyValueError::new_err(e.to_string()),
        // Shutdown outcomes (responses cut at the timeout or at a second signal): not a start
        // error, but the match must name them.
        LiveError::ShutdownTimeout { .. } | LiveError::StoppedAtOnce { .. } => PyRuntimeError::new_err(e.to_string()),
    }
}

fn seconds(name: &str, v: f64, zero_ok: bool) -> PyResult<Duration> {
    if v.is_finite() && (v > 0.0 || (zero_ok && v == 0.0)) && v <= 1e9 {
        Ok(Duration::from_secs_f64(v))
    } else {
        Err(PyValueError::new_err(format!("{name} must be a number of seconds > 0, got {v}")))
    }
}

#[pymethods]
impl LiveServer {
    /// Validates the options, binds every port (port 0 picks a free one), starts the engines and
    /// serves in the background. `engine_config` is a configuration the Rust reader takes (as
    /// `servesim.mocker.config.core_config_text` renders it); its `worker_type` sets the role.
    #[new]
    #[pyo3(signature = (
        engine_config, *, num_workers=1, host="127.0.0.1".to_string(), port=8000, worker_base_port=None,
        model_path=None, model_name=None, max_model_len=None, stagger_delay=0.0, router_mode="round_robin",
        router_config=None, router_seed=42, zmq_kv_events_ports=Vec::new(), zmq_replay_ports=Vec::new(),
        zmq_event_format="named", seed=0, shutdown_timeout=30.0, config_dir=None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        engine_config: &str,
        num_workers: u32,
        host: String,
        port: u16,
        worker_base_port: Option<u16>,
        model_path: Option<PathBuf>,
        model_name: Option<String>,
        max_model_len: Option<u32>,
        stagger_delay: f64,
        router_mode: &str,
        router_config: Option<String>,
        router_seed: u64,
        zmq_kv_events_ports: Vec<u16>,
        zmq_replay_ports: Vec<u16>,
        zmq_event_format: &str,
        seed: u64,
        shutdown_timeout: f64,
        config_dir: Option<PathBuf>,
    ) -> PyResult<Self> {
        let dir = config_dir.unwrap_or_else(|| PathBuf::from("."));
        let args = crate::worker_args(engine_config, &dir).map_err(PyValueError::new_err)?;
        if !(args.engine.speedup_ratio.is_finite() && args.engine.speedup_ratio >= 0.0) {
            return Err(PyValueError::new_err("speedup_ratio must be a finite number ≥ 0"));
        }
        if num_workers == 0 {
            return Err(PyValueError::new_err(format!("--num-workers must be at least 1, got {num_workers}")));
        }
        let topology = Topology::one_side(args.engine.role, args.clone(), num_workers)
            .map_err(|e| PyValueError::new_err(format!("{} {}", e.field, e.message)))?;
        if let Some(why) = servesim_live::unsupported_live(&topology) {
            return Err(PyValueError::new_err(why));
        }
        let pools = topology.pools();
        let workers: u32 = pools.iter().map(|p| p.workers).sum();
        let ranks: u64 = pools.iter().map(|p| p.workers as u64 * p.deployment.dp_size as u64).sum();
        if ranks > servesim_live::MAX_ENGINE_RANKS as u64 {
            return Err(PyValueError::new_err(format!(
                "{ranks} engine ranks (workers × data-parallel size) asked for; one process runs at most {} \
                 (each rank is a thread)",
                servesim_live::MAX_ENGINE_RANKS
            )));
        }
        for (name, ports) in [("zmq_kv_events_ports", &zmq_kv_events_ports), ("zmq_replay_ports", &zmq_replay_ports)] {
            if !ports.is_empty() && ports.len() != workers as usize {
                return Err(PyValueError::new_err(format!(
                    "{name} needs one port per worker ({workers}), got {}",
                    ports.len()
                )));
            }
        }
        if !zmq_replay_ports.is_empty() && zmq_kv_events_ports.is_empty() {
            return Err(PyValueError::new_err("zmq_replay_ports needs zmq_kv_events_ports"));
        }
        if !(stagger_delay.is_finite() && (stagger_delay >= 0.0 || stagger_delay == -1.0)) {
            return Err(PyValueError::new_err("stagger_delay must be ≥ 0, or -1 for automatic spacing"));
        }
        if max_model_len == Some(0) {
            return Err(PyValueError::new_err("max_model_len must be at least 1"));
        }
        let zmq_event_format = match zmq_event_format {
            "named" => servesim_live::zmq::EventFormat::Named,
            "vllm" => servesim_live::zmq::EventFormat::Vllm,
            other => {
                return Err(PyValueError::new_err(format!("zmq_event_format must be 'named' or 'vllm', got '{other}'")))
            }
        };
        let router = match (router_mode, router_config) {
            ("round_robin", None) => RouterMode::RoundRobin,
            ("round_robin", Some(_)) => {
                return Err(PyValueError::new_err("router_config applies to router_mode 'kv_router'"))
            }
            ("kv_router", config) => RouterMode::KvRouter(match config {
                Some(text) => {
                    RouterConfig::parse_json(&text).map_err(|e| PyValueError::new_err(format!("router_config: {e}")))?
                }
                None => RouterConfig::default(),
            }),
            (other, _) => {
                return Err(PyValueError::new_err(format!(
                    "router_mode must be either 'round_robin' or 'kv_router', got '{other}'"
                )))
            }
        };
        let grace = seconds("shutdown_timeout", shutdown_timeout, true)?;
        let facts = match &model_path {
            Some(dir) if dir.is_dir() => servesim_live::tokenizer::model_facts(dir).unwrap_or_else(|e| {
                eprintln!("warning: {e}; context length and KV size not read from the model");
                Default::default()
            }),
            _ => Default::default(),
        };
        let tokenizer =
            servesim_live::load_tokenizer(model_path.as_deref()).map_err(|e| PyValueError::new_err(e.to_string()))?;
        if let (Some(dir), true) = (&model_path, tokenizer.is_approximate()) {
            eprintln!("warning: {} has no tokenizer.json; using the built-in approximate tokenizer", dir.display());
        }
        let model = model_name.unwrap_or_else(|| {
            model_path
                .as_deref()
                .and_then(Path::file_name)
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "servesim-model".to_string())
        });
        let mut router = router;
        if let Some(rc) = router.kv_config_mut() {
            // The policy classes of `router_policy_config`, with the served model's profile.
            crate::load_router_policy(rc, Some(&model)).map_err(PyValueError::new_err)?;
        }
        let opts = ServeOptions {
            host,
            port,
            worker_base_port,
            model_name: model.clone(),
            model_path,
            max_model_len: max_model_len.or(args.engine.max_model_len).or(facts.max_position_embeddings),
            topology,
            router,
            prefill_load_estimator: None,
            router_seed,
            stagger_delay_s: stagger_delay,
            zmq_kv_events_ports,
            zmq_replay_ports,
            zmq_event_format,
            seed,
            timeouts: Timeouts {
                header: Duration::from_secs(10),
                body: Duration::from_secs(30),
                idle: Duration::from_secs(60),
                write: Duration::from_secs(30),
            },
            shutdown_timeout: grace,
            metrics_max_ranks: servesim_live::metrics::DEFAULT_METRICS_MAX_RANKS,
            frontend_ms: 0.0,
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("servesim-http")
            .build()
            .map_err(|e| PyOSError::new_err(format!("cannot start the async runtime: {e}")))?;
        let server =
            py.allow_threads(|| runtime.block_on(servesim_live::start(opts, tokenizer))).map_err(live_error)?;
        let (stop, stop_rx) = oneshot::channel::<()>();
        let (force, mut force_rx) = watch::channel(false);
        let done = Arc::new(Done::default());
        let (addr, worker_addrs, workers) = (server.addr(), server.worker_addrs().to_vec(), server.num_workers());
        let reporter = done.clone();
        runtime.spawn(async move {
            // The sender dropped (the object went away) stops the server too.
            let _ = stop_rx.await;
            let forced = async move {
                let _ = force_rx.wait_for(|f| *f).await;
            };
            let report = server.shutdown(grace, forced).await;
            *reporter.report.lock().unwrap_or_else(|p| p.into_inner()) = Some(report);
            reporter.changed.notify_all();
        });
        Ok(LiveServer {
            addr,
            worker_addrs,
            model,
            workers,
            stop: Mutex::new(Some(stop)),
            force,
            done,
            runtime: Mutex::new(Some(runtime)),
        })
    }

    /// `(host, port)` of the frontend (all workers, routed).
    #[getter]
    fn address(&self) -> (String, u16) {
        (self.addr.ip().to_string(), self.addr.port())
    }

    /// `http://host:port` of the frontend.
    #[getter]
    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `(host, port)` of each worker's own listener (empty without `worker_base_port`).
    #[getter]
    fn worker_addresses(&self) -> Vec<(String, u16)> {
        self.worker_addrs.iter().map(|a| (a.ip().to_string(), a.port())).collect()
    }

    #[getter]
    fn model_name(&self) -> &str {
        &self.model
    }

    #[getter]
    fn num_workers(&self) -> usize {
        self.workers
    }

    /// True once the server has stopped (after `shutdown()` and the drain).
    #[getter]
    fn stopped(&self) -> bool {
        self.done.report.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    /// Starts a graceful shutdown and returns at once: stop accepting, let in-flight responses
    /// finish for `shutdown_timeout`, then drop what is left and stop the engines. Calling it
    /// again does nothing, except that `force=True` ends the grace period now.
    #[pyo3(signature = (force=false))]
    fn shutdown(&self, force: bool) {
        if let Some(stop) = self.stop.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = stop.send(());
        }
        if force {
            let _ = self.force.send(true);
        }
    }

    /// Waits (GIL released) until the server has stopped, at most `timeout` seconds; True if it
    /// has. Python signal handlers run while waiting (Ctrl-C raises `KeyboardInterrupt`).
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let deadline = match timeout {
            Some(t) => Some(Instant::now() + seconds("timeout", t.max(0.0), true)?),
            None => None,
        };
        loop {
            let step = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()).min(Duration::from_millis(50)),
                None => Duration::from_millis(50),
            };
            let stopped = py.allow_threads(|| {
                let guard = self.done.report.lock().unwrap_or_else(|p| p.into_inner());
                let (guard, _) = self
                    .done
                    .changed
                    .wait_timeout_while(guard, step, |r| r.is_none())
                    .unwrap_or_else(|p| p.into_inner());
                guard.is_some()
            });
            if stopped {
                return Ok(true);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(false);
            }
            py.check_signals()?;
        }
    }

    /// How the shutdown went (`drained`, `forced`, `aborted_connections`), or None while serving.
    fn shutdown_report<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(r) = *self.done.report.lock().unwrap_or_else(|p| p.into_inner()) else { return Ok(None) };
        let d = PyDict::new(py);
        d.set_item("drained", r.drained)?;
        d.set_item("forced", r.forced)?;
        d.set_item("aborted_connections", r.aborted_connections)?;
        Ok(Some(d))
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Leaving a `with` block shuts the server down and waits for it.
    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.shutdown(false);
        self.wait(py, None)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!(
            "LiveServer(url='http://{}', model_name='{}', num_workers={}, stopped={})",
            self.addr,
            self.model,
            self.workers,
            self.stopped()
        )
    }
}

impl Drop for LiveServer {
    /// A server dropped while serving stops at once (no grace period) before its runtime goes.
    fn drop(&mut self) {
        if !self.stopped() {
            self.shutdown(true);
            let guard = self.done.report.lock().unwrap_or_else(|p| p.into_inner());
            let _ = self.done.changed.wait_timeout_while(guard, Duration::from_secs(5), |r| r.is_none());
        }
        if let Some(rt) = self.runtime.lock().unwrap_or_else(|p| p.into_inner()).take() {
            rt.shutdown_background();
        }
    }
}
