//! # servesim-live
//!
//! The simulated engines on a wall clock, behind an OpenAI-compatible HTTP API: the mock
//! engine people point gateways, routers, autoscalers and load generators at instead of a GPU.
//! [`serve`] binds the frontend (and each worker's own port), starts one actor thread per
//! engine rank ([`cluster`], [`actor`]), the ZMQ KV event publishers ([`zmq`]) and serves until
//! SIGINT or SIGTERM, after which it stops accepting, finishes in-flight responses and returns.

pub mod actor;
pub mod cluster;
pub mod http;
pub mod metrics;
pub mod openai;
pub mod tokenizer;
pub mod zmq;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use servesim_cluster::{PoolSpec, RouterMode, Topology};

use crate::cluster::{Cluster, ClusterSpec};
use crate::tokenizer::Tokenizer;

/// Context length used when neither the engine nor the model says.
pub const DEFAULT_MAX_MODEL_LEN: u32 = 32_768;

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
pub fn load_tokenizer(model_path: Option<&std::path::Path>) -> Result<Tokenizer, String> {
    match model_path {
        Some(dir) if dir.join("tokenizer.json").exists() => Tokenizer::from_dir(dir),
        Some(dir) if !dir.is_dir() => Err(format!(
            "--model-path {}: not a local directory (servesim reads tokenizer files locally and downloads nothing)",
            dir.display()
        )),
        _ => Ok(Tokenizer::approximate()),
    }
}

/// Runs the server until SIGINT/SIGTERM. Errors are about setup (ports, files).
pub fn serve(opts: ServeOptions, tokenizer: Tokenizer) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("servesim-http")
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    runtime.block_on(serve_async(opts, tokenizer))
}

async fn serve_async(opts: ServeOptions, tokenizer: Tokenizer) -> Result<(), String> {
    let pools = opts.topology.pools();
    let workers: usize = pools.iter().map(|p| p.workers as usize).sum();
    let startup_time_s = pools[0].deployment.startup_time_s.unwrap_or(0.0);
    // Bind everything before starting anything, so a busy port fails fast.
    let frontend = tokio::net::TcpListener::bind((opts.host.as_str(), opts.port))
        .await
        .map_err(|e| format!("cannot listen on {}:{}: {e}", opts.host, opts.port))?;
    let mut worker_listeners = Vec::new();
    if let Some(base) = opts.worker_base_port {
        for w in 0..workers {
            let port = base as usize + w;
            let port = u16::try_from(port).map_err(|_| format!("--worker-base-port {base}: worker {w} has no port"))?;
            let l = tokio::net::TcpListener::bind((opts.host.as_str(), port))
                .await
                .map_err(|e| format!("cannot listen on {}:{port} (worker {w}): {e}", opts.host))?;
            worker_listeners.push(l);
        }
    }
    let mut kv_publishers = Vec::new();
    for w in 0..workers {
        let Some(&base) = opts.zmq_kv_events_ports.get(w) else { break };
        let dp = pool_of(pools, w).deployment.dp_size;
        let mut ranks = Vec::new();
        for r in 0..dp {
            let port = u16::try_from(base as u32 + r).map_err(|_| format!("ZMQ port {base}+{r} is out of range"))?;
            let replay = match opts.zmq_replay_ports.get(w) {
                Some(&rb) => {
                    Some(u16::try_from(rb as u32 + r).map_err(|_| format!("ZMQ port {rb}+{r} is out of range"))?)
                }
                None => None,
            };
            ranks.push(Some(zmq::start(&opts.host, port, replay, opts.zmq_event_format).await?));
        }
        kv_publishers.push(ranks);
    }

    let tokenizer = Arc::new(tokenizer);
    let speedup = pools[0].engine.speedup_ratio;
    let cluster = Cluster::start(ClusterSpec {
        topology: opts.topology.clone(),
        router: opts.router.clone(),
        prefill_load_estimator: opts.prefill_load_estimator.clone(),
        router_seed: opts.router_seed,
        speedup,
        vocabulary: tokenizer.vocabulary(),
        kv_publishers,
        seed: opts.seed,
    });
    let mut max_model_len = opts.max_model_len.or(cluster.max_model_len()).unwrap_or(DEFAULT_MAX_MODEL_LEN);
    // A request longer than one rank's KV cache could start, stream, and only then fail when it
    // can no longer grow; vLLM refuses such a context length at startup. Here the front door
    // refuses such requests with a 400 instead.
    let capacity = pools.iter().map(|p| p.rank_engine().kv_capacity_tokens()).min().unwrap_or(u64::MAX);
    if max_model_len as u64 > capacity {
        eprintln!(
            "warning: the context length ({max_model_len} tokens) exceeds the KV cache of one rank \
             ({capacity} tokens); requests are limited to {capacity} tokens"
        );
        max_model_len = capacity as u32;
    }
    let started = Instant::now();
    let ready_at: Arc<Vec<Instant>> = Arc::new(
        ready_offsets(workers, startup_time_s, opts.stagger_delay_s).into_iter().map(|d| started + d).collect(),
    );
    let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let id_salt = created.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ std::process::id() as u64;
    let service = |worker, port| {
        Arc::new(http::Service {
            host: opts.host.clone(),
            port,
            cluster: cluster.clone(),
            tokenizer: tokenizer.clone(),
            model: opts.model_name.clone(),
            max_model_len,
            worker,
            ready_at: ready_at.clone(),
            created,
            id_salt,
        })
    };

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut servers = tokio::task::JoinSet::new();
    let mut listeners = vec![(frontend, None)];
    listeners.extend(worker_listeners.into_iter().enumerate().map(|(w, l)| (l, Some(w))));
    for (listener, worker) in listeners {
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        match worker {
            None => println!("servesim: serving {} on http://{addr} ({workers} worker(s))", opts.model_name),
            Some(w) => println!("servesim: worker {w} on http://{addr}"),
        }
        let app = http::router(service(worker, addr.port()));
        let mut stop = stop_rx.clone();
        servers.spawn(async move {
            let shutdown = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            // Streams are many small writes: send each as soon as it is written.
            let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
                let _ = tcp.set_nodelay(true);
            });
            axum::serve(listener, app).with_graceful_shutdown(shutdown).await
        });
    }
    if startup_time_s > 0.0 {
        println!("servesim: ready in {startup_time_s:.1} s (--startup-time)");
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();

    wait_for_signal().await;
    eprintln!("servesim: shutting down; finishing in-flight requests");
    let _ = stop_tx.send(true);
    while let Some(r) = servers.join_next().await {
        if let Ok(Err(e)) = r {
            eprintln!("servesim: server error: {e}");
        }
    }
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.shutdown()).await.map_err(|e| e.to_string())?;
    Ok(())
}

/// The pool of global worker index `worker` (workers are numbered pool after pool).
fn pool_of(pools: &[PoolSpec], worker: usize) -> &PoolSpec {
    let mut w = worker;
    for pool in pools {
        if w < pool.workers as usize {
            return pool;
        }
        w -= pool.workers as usize;
    }
    &pools[0]
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
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
