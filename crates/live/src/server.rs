//! Starting and stopping the server: [`start`] binds every listener (port 0 picks a free one),
//! starts the engines and serves until [`Server::shutdown`], which stops accepting, lets
//! in-flight responses finish for a grace period and then aborts what is left.
//!
//! Connections are served by hyper directly (not `axum::serve`) so that each socket gets the
//! deadlines of [`crate::conn`] and each connection can be told to finish gracefully or be
//! dropped.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::conn::{ConnState, TimedIo, Timeouts, Tracked};
use crate::error::LiveError;
use crate::frontend::{Frontend, FrontendSpec};
use crate::tokenizer::Tokenizer;
use crate::{http, ready_offsets, zmq, ServeOptions, DEFAULT_MAX_MODEL_LEN};

/// A running server.
pub struct Server {
    addr: SocketAddr,
    worker_addrs: Vec<SocketAddr>,
    frontend: Arc<Frontend>,
    model: String,
    /// Stop accepting; connections finish their current response and close.
    stop: watch::Sender<bool>,
    /// Drop every connection now.
    abort: watch::Sender<bool>,
    /// One per listener; each returns how many connections it dropped.
    listeners: JoinSet<usize>,
}

/// How a shutdown went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shutdown {
    /// Every in-flight response finished within the grace period.
    pub drained: bool,
    /// `force` ended the grace period early.
    pub forced: bool,
    /// Connections dropped with a response still in flight.
    pub aborted_connections: usize,
}

impl Server {
    /// The frontend's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Each worker's own address (with `worker_base_port`).
    pub fn worker_addrs(&self) -> &[SocketAddr] {
        &self.worker_addrs
    }

    pub fn model(&self) -> &str {
        &self.model
    }

    pub fn num_workers(&self) -> usize {
        self.frontend.num_workers()
    }

    /// Stops accepting connections and lets in-flight responses finish for up to `grace`, or
    /// until `force` resolves; then drops the connections that are left (their requests are
    /// aborted and their KV freed) and stops the engines.
    pub async fn shutdown(mut self, grace: Duration, force: impl Future<Output = ()>) -> Shutdown {
        let _ = self.stop.send(true);
        let mut aborted = 0;
        let listeners = &mut self.listeners;
        let drain = async {
            while let Some(n) = listeners.join_next().await {
                aborted += n.unwrap_or(0);
            }
        };
        let (drained, forced) = tokio::select! {
            _ = drain => (true, false),
            _ = tokio::time::sleep(grace) => (false, false),
            _ = force => (false, true),
        };
        if !drained {
            let _ = self.abort.send(true);
            while let Some(n) = self.listeners.join_next().await {
                aborted += n.unwrap_or(0);
            }
        }
        let c = self.frontend.clone();
        let _ = tokio::task::spawn_blocking(move || c.shutdown()).await;
        Shutdown { drained, forced, aborted_connections: aborted }
    }
}

/// Binds the frontend (and each worker's port), starts the engines and serves. Errors are about
/// setup (ports, ZMQ sockets).
pub async fn start(opts: ServeOptions, tokenizer: Tokenizer) -> Result<Server, LiveError> {
    let pools = opts.topology.pools();
    let workers: usize = pools.iter().map(|p| p.workers as usize).sum();
    let startup_time_s = pools[0].deployment.startup_time_s.unwrap_or(0.0);
    let listen = |port: u16, worker: Option<usize>| {
        let host = opts.host.clone();
        async move {
            TcpListener::bind((host.as_str(), port)).await.map_err(|source| LiveError::Listen {
                addr: format!("{host}:{port}"),
                worker,
                source,
            })
        }
    };
    // Bind everything before starting anything, so a busy port fails fast.
    let frontend_listener = listen(opts.port, None).await?;
    let mut worker_listeners = Vec::new();
    if let Some(base) = opts.worker_base_port {
        for w in 0..workers {
            let port = u16::try_from(base as usize + w).map_err(|_| LiveError::WorkerPort { base, worker: w })?;
            worker_listeners.push(listen(port, Some(w)).await?);
        }
    }
    let mut kv_publishers = Vec::new();
    for w in 0..workers {
        let Some(&base) = opts.zmq_kv_events_ports.get(w) else { break };
        if crate::pool_of_worker(pools, w).engine.state_cache.is_some() {
            return Err(LiveError::StateCacheEvents { worker: w });
        }
        let dp = crate::pool_of_worker(pools, w).deployment.dp_size;
        let mut ranks = Vec::new();
        for r in 0..dp {
            let port = u16::try_from(base as u32 + r).map_err(|_| LiveError::ZmqPort { base, rank: r })?;
            let replay = match opts.zmq_replay_ports.get(w) {
                Some(&rb) => Some(u16::try_from(rb as u32 + r).map_err(|_| LiveError::ZmqPort { base: rb, rank: r })?),
                None => None,
            };
            ranks.push(Some(zmq::start(&opts.host, port, replay, opts.zmq_event_format).await?));
        }
        kv_publishers.push(ranks);
    }

    let tokenizer = Arc::new(tokenizer);
    let frontend = Frontend::start(FrontendSpec {
        topology: opts.topology.clone(),
        router: opts.router.clone(),
        prefill_load_estimator: opts.prefill_load_estimator.clone(),
        router_seed: opts.router_seed,
        speedup: pools[0].engine.speedup_ratio,
        vocabulary: tokenizer.vocabulary(),
        kv_publishers,
        seed: opts.seed,
    })?;
    let mut max_model_len = opts.max_model_len.or(frontend.max_model_len()).unwrap_or(DEFAULT_MAX_MODEL_LEN);
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

    let speedup = pools[0].engine.speedup_ratio;
    let frontend_delay =
        if speedup > 0.0 { crate::wall_duration(opts.frontend_ms / 1000.0 / speedup) } else { Duration::ZERO };
    let (stop, stop_rx) = watch::channel(false);
    let (abort, abort_rx) = watch::channel(false);
    let mut listeners = JoinSet::new();
    let mut addrs = Vec::new();
    let all = std::iter::once((frontend_listener, None))
        .chain(worker_listeners.into_iter().enumerate().map(|(w, l)| (l, Some(w))));
    for (listener, worker) in all {
        let addr = listener.local_addr().map_err(|source| LiveError::Listen {
            addr: format!("{}:{}", opts.host, opts.port),
            worker,
            source,
        })?;
        addrs.push(addr);
        let app = http::router(Arc::new(http::Service {
            host: opts.host.clone(),
            port: addr.port(),
            frontend: frontend.clone(),
            tokenizer: tokenizer.clone(),
            model: opts.model_name.clone(),
            max_model_len,
            worker,
            ready_at: ready_at.clone(),
            created,
            id_salt,
            body_timeout: opts.timeouts.body,
            aborting: abort_rx.clone(),
            metrics_max_ranks: opts.metrics_max_ranks,
            frontend_delay,
        }));
        listeners.spawn(accept_loop(listener, app, opts.timeouts, stop_rx.clone(), abort_rx.clone()));
    }
    Ok(Server {
        addr: addrs[0],
        worker_addrs: addrs[1..].to_vec(),
        frontend,
        model: opts.model_name.clone(),
        stop,
        abort,
        listeners,
    })
}

/// Most bytes hyper buffers per connection, each way: written response bytes the client has not
/// taken yet (beyond the kernel's socket buffer), and a request's headers (larger ones get
/// 431). With [`http::SSE_WRITE_BYTES`] per write, a stream whose client stops reading holds
/// at most about 80 KiB of rendered events in the server; the tokens behind them wait as ids.
pub const WRITE_BUFFER: usize = 64 * 1024;

/// Accepts connections until told to stop, then waits for them to end.
async fn accept_loop(
    listener: TcpListener,
    app: axum::Router,
    timeouts: Timeouts,
    mut stop: watch::Receiver<bool>,
    abort: watch::Receiver<bool>,
) -> usize {
    let mut conns = JoinSet::new();
    let conn_stop = stop.clone();
    loop {
        tokio::select! {
            _ = until(&mut stop) => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => {
                    conns.spawn(connection(tcp, app.clone(), timeouts, conn_stop.clone(), abort.clone()));
                }
                // Out of file descriptors, say: wait a little instead of spinning.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            },
        }
    }
    drop(listener);
    let mut aborted = 0;
    while let Some(r) = conns.join_next().await {
        aborted += matches!(r, Ok(true)) as usize;
    }
    aborted
}

/// Serves one connection; true if it was dropped with a request in flight.
async fn connection(
    tcp: TcpStream,
    app: axum::Router,
    timeouts: Timeouts,
    mut stop: watch::Receiver<bool>,
    mut abort: watch::Receiver<bool>,
) -> bool {
    // Streams are many small writes: send each as soon as it is written.
    let _ = tcp.set_nodelay(true);
    let state = ConnState::new();
    let in_flight = state.clone();
    let io = TokioIo::new(TimedIo::new(tcp, state.clone(), timeouts));
    let tower = TowerToHyperService::new(app);
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        req.extensions_mut().insert(state.cut.clone());
        let guard = state.begin();
        let response = hyper::service::Service::call(&tower, req);
        async move {
            let response = response.await?;
            Ok::<_, Infallible>(response.map(|inner| axum::body::Body::new(Tracked { inner, guard })))
        }
    });
    let conn = hyper::server::conn::http1::Builder::new().max_buf_size(WRITE_BUFFER).serve_connection(io, service);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return false,
        _ = until(&mut stop) => {}
        _ = until(&mut abort) => return cut(conn.as_mut(), &in_flight).await,
    }
    // No request in flight: an idle keep-alive connection, or one whose request headers are
    // still arriving. Nothing would be lost by waiting for it, so it is closed now instead of
    // holding the shutdown until its header or idle timeout. (hyper calls the service as soon
    // as a request's headers are in, so a request that has begun is always seen here.)
    if !in_flight.in_flight() {
        return false;
    }
    conn.as_mut().graceful_shutdown();
    tokio::select! {
        // The response may have been cut and written before this task saw the abort.
        _ = conn.as_mut() => in_flight.cut.is_set(),
        _ = until(&mut abort) => cut(conn.as_mut(), &in_flight).await,
    }
}

/// How long a connection cut at shutdown may take to write its last bytes: the error event
/// that ends a stream (see `http::sse::SseStream`), or a 503 for a response still being prepared.
pub const FLUSH_AT_ABORT: Duration = Duration::from_millis(500);

/// The grace period is over: the connection's response ends now (a stream with an error event
/// and `[DONE]`), which gets [`FLUSH_AT_ABORT`] to reach the client before the connection is
/// dropped. True if a request was in flight (it is aborted and its KV freed).
async fn cut<F: Future>(conn: std::pin::Pin<&mut F>, state: &ConnState) -> bool {
    if state.in_flight() {
        let _ = tokio::time::timeout(FLUSH_AT_ABORT, conn).await;
        return true;
    }
    state.cut.is_set()
}

/// Waits until `flag` is set (or its sender is gone).
async fn until(flag: &mut watch::Receiver<bool>) {
    let _ = flag.wait_for(|set| *set).await;
}
