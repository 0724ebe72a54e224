//! # servesim-live
//!
//! The simulated engines on a wall clock, behind an OpenAI-compatible HTTP API: the mock
//! engine people point gateways, routers, autoscalers and load generators at instead of a GPU.
//! [`server::start`] binds the frontend (and each worker's own port; port 0 picks a free one),
//! starts one thread per engine rank ([`frontend`], [`rank`]) and the ZMQ KV event
//! publishers ([`zmq`]), and serves until [`server::Server::shutdown`]. [`serve`] does both
//! around the process's signals: the first SIGINT/SIGTERM stops accepting and lets in-flight
//! responses finish for `shutdown_timeout`, then drops what is left; a second stops at once.

pub mod conn;
pub mod error;
pub mod frontend;
pub mod http;
pub mod metrics;
pub mod openai;
pub mod rank;
pub mod server;
pub mod tokenizer;
pub mod zmq;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use servesim_cluster::{PoolSpec, RouterMode, Topology};

pub use crate::conn::Timeouts;
pub use crate::error::{LiveError, ModelError};
pub use crate::server::{start, Server, Shutdown};
use crate::tokenizer::Tokenizer;

/// Context length used when neither the engine nor the model says.
pub const DEFAULT_MAX_MODEL_LEN: u32 = 32_768;

/// Most engine ranks (workers × data-parallel ranks) one server runs: each is an OS thread
/// with its own engine, so far more would exhaust threads or memory before serving anything.
pub const MAX_ENGINE_RANKS: u32 = 4_096;

/// Why `topology` cannot be served live, if it cannot: the ranks of a worker run on their own
/// threads, not in lockstep, so the prefill cadences that Dynamo synchronises across a worker's
/// attention-DP ranks (`prefill_schedule_interval`, `prefill_decode_interval`) cannot be
/// modelled with more than one rank per worker. (With one rank they are: the rank is its
/// worker.) Offline replay models them.
pub fn unsupported_live(topology: &Topology) -> Option<String> {
    topology.pools().iter().find_map(|pool| {
        let (dp, e) = (pool.deployment.dp_size, &pool.engine);
        let key = if e.prefill_schedule_interval != 1 {
            "prefill_schedule_interval"
        } else if e.prefill_decode_interval != 0 {
            "prefill_decode_interval"
        } else {
            return None;
        };
        (dp > 1).then(|| {
            format!(
                "engine.{key} with data-parallel size {dp} is not supported by the live server: its attention-DP \
                 ranks do not run passes in lockstep (offline replay models it; live, use dp_size 1)"
            )
        })
    })
}

/// Everything `servesim serve` needs, already validated by the caller.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub host: String,
    pub port: u16,
    /// Worker i also listens on `worker_base_port + i`.
    pub worker_base_port: Option<u16>,
    pub model_name: String,
    /// A model directory: tokenizer, chat template and `config.json`.
    pub model_path: Option<PathBuf>,
    /// The pools: aggregated, prefill and decode, or one side of a disaggregated deployment.
    pub topology: Topology,
    pub router: RouterMode,
    /// What `router_prefill_load_model: ais` predicts prompts' prefill times with.
    pub prefill_load_estimator: Option<Arc<dyn servesim_router::PrefillLoadEstimator>>,
    pub router_seed: u64,
    /// Context length (prompt plus output) requests are checked against.
    pub max_model_len: Option<u32>,
    /// Seconds between worker starts; negative picks Dynamo's automatic spacing.
    pub stagger_delay_s: f64,
    /// Per worker: base port of its ranks' KV event PUB sockets (and replay ROUTER sockets).
    pub zmq_kv_events_ports: Vec<u16>,
    pub zmq_replay_ports: Vec<u16>,
    pub zmq_event_format: zmq::EventFormat,
    /// Seed of generated tokens.
    pub seed: u64,
    /// Connection deadlines (headers, body, idle keep-alive, a client that stops reading).
    pub timeouts: Timeouts,
    /// After the first SIGINT/SIGTERM, how long in-flight responses may go on.
    pub shutdown_timeout: Duration,
    /// Most engine ranks a `/metrics` scrape lists one by one; beyond, their series are summed
    /// into one set labelled `"all"` (see [`metrics::render`]).
    pub metrics_max_ranks: usize,
    /// The modelled cost of the server's own front end per request, in ms (HTTP, parsing,
    /// tokenisation: a calibration's `frontend_ms`): each request waits this long, divided by
    /// the engines' speedup like every modelled duration, before it reaches a worker. 0: none.
    pub frontend_ms: f64,
}

/// When each worker starts serving: after the startup time, workers `stagger` apart, with a
/// 2 s pause after every 32 when staggering (Dynamo's launch pacing).
pub fn ready_offsets(workers: usize, startup_s: f64, stagger_s: f64) -> Vec<Duration> {
    let stagger = if stagger_s < 0.0 {
        match workers {
            0..=32 => 0.0,
            33..=128 => 0.1,
            _ => 0.2,
        }
    } else {
        stagger_s
    };
    (0..workers)
        .map(|i| {
            let pauses = if stagger > 0.0 { (i / 32) as f64 * 2.0 } else { 0.0 };
            wall_duration(startup_s + i as f64 * stagger + pauses)
        })
        .collect()
}

/// `seconds` as a wall-clock duration, clamped to [0, 10⁹ s] (about 31 years) so that extreme
/// configurations (a bandwidth of 1e-300 GB/s, a speedup of 1e-300) mean "never" instead of
/// overflowing `Duration` or `Instant`.
pub(crate) fn wall_duration(seconds: f64) -> Duration {
    Duration::from_secs_f64(if seconds.is_nan() { 0.0 } else { seconds.clamp(0.0, 1e9) })
}

/// Loads the tokenizer: the model's own with a model directory that has `tokenizer.json`, else
/// the built-in approximate one.
pub fn load_tokenizer(model_path: Option<&std::path::Path>) -> Result<Tokenizer, ModelError> {
    match model_path {
        Some(dir) if dir.join("tokenizer.json").exists() => Tokenizer::from_dir(dir),
        Some(dir) if !dir.is_dir() => Err(ModelError::NotADirectory(dir.to_path_buf())),
        _ => Ok(Tokenizer::approximate()),
    }
}

/// Runs the server until SIGINT/SIGTERM, then drains it for `shutdown_timeout` (a second
/// signal stops it at once). Errors are about setup (ports, files).
pub fn serve(opts: ServeOptions, tokenizer: Tokenizer) -> Result<(), LiveError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("servesim-http")
        .build()
        .map_err(LiveError::Runtime)?;
    runtime.block_on(async move {
        let mut signals = Signals::new();
        let (grace, model, startup_time_s) =
            (opts.shutdown_timeout, opts.model_name.clone(), opts.topology.pools()[0].deployment.startup_time_s);
        let server = server::start(opts, tokenizer).await?;
        println!("servesim: serving {model} on http://{} ({} worker(s))", server.addr(), server.num_workers());
        for (w, addr) in server.worker_addrs().iter().enumerate() {
            println!("servesim: worker {w} on http://{addr}");
        }
        if let Some(s) = startup_time_s.filter(|s| *s > 0.0) {
            println!("servesim: ready in {s:.1} s (--startup-time)");
        }
        use std::io::Write;
        let _ = std::io::stdout().flush();

        signals.next().await;
        eprintln!(
            "servesim: shutting down; finishing in-flight requests for up to {} s (a second signal stops at once)",
            grace.as_secs_f64()
        );
        let report = server.shutdown(grace, signals.next()).await;
        shutdown_outcome(report, grace)
    })
}

/// How a shutdown ends the process: `Ok` when no request was cut (every in-flight response
/// finished, or nothing was in flight when the grace period ended or a second signal came);
/// an error, so a non-zero exit, when responses were dropped with their requests aborted.
pub fn shutdown_outcome(report: Shutdown, grace: Duration) -> Result<(), LiveError> {
    let dropped = report.aborted_connections;
    if dropped == 0 {
        return Ok(());
    }
    Err(if report.forced {
        LiveError::StoppedAtOnce { dropped }
    } else {
        LiveError::ShutdownTimeout { seconds: grace.as_secs_f64(), dropped }
    })
}

/// SIGINT and SIGTERM, listened for from startup on so that none is missed between two waits.
struct Signals {
    #[cfg(unix)]
    int: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn new() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Signals { int: signal(SignalKind::interrupt()).ok(), term: signal(SignalKind::terminate()).ok() }
        }
        #[cfg(not(unix))]
        Signals {}
    }

    async fn next(&mut self) {
        #[cfg(unix)]
        {
            async fn recv(s: &mut Option<tokio::signal::unix::Signal>) {
                match s {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending().await,
                }
            }
            tokio::select! {
                _ = recv(&mut self.int) => {}
                _ = recv(&mut self.term) => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// The pool of global worker index `worker` (workers are numbered pool after pool).
pub(crate) fn pool_of_worker(pools: &[PoolSpec], worker: usize) -> &PoolSpec {
    let mut w = worker;
    for pool in pools {
        if w < pool.workers as usize {
            return pool;
        }
        w -= pool.workers as usize;
    }
    &pools[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stagger_spaces_workers_and_pauses_every_32() {
        let d = ready_offsets(40, 1.0, 0.5);
        assert_eq!(d[0], Duration::from_secs_f64(1.0));
        assert_eq!(d[1], Duration::from_secs_f64(1.5));
        assert_eq!(d[33], Duration::from_secs_f64(1.0 + 33.0 * 0.5 + 2.0));
        let auto = ready_offsets(40, 0.0, -1.0);
        assert_eq!(auto[1], Duration::from_secs_f64(0.1));
        assert!(ready_offsets(8, 0.0, -1.0).iter().all(|d| d.is_zero()));
        assert_eq!(ready_offsets(2, 0.0, 1e300)[1], Duration::from_secs(1_000_000_000), "clamped, no panic");
    }

    #[test]
    fn wall_durations_never_overflow() {
        assert_eq!(wall_duration(f64::NAN), Duration::ZERO);
        assert_eq!(wall_duration(-3.0), Duration::ZERO);
        assert_eq!(wall_duration(1e300), Duration::from_secs(1_000_000_000));
        let far = std::time::Instant::now() + wall_duration(1e300);
        assert!(far > std::time::Instant::now());
    }
}
