//! The frontend of one process: its workers and how requests reach them.
//!
//! A [`Frontend`] serves one aggregated pool of workers, or a prefill pool and a decode pool (or
//! one side of them, for a single-role server), built from a [`Topology`]. Each worker has
//! `dp_size` ranks; each rank is a [`crate::rank`] thread that owns one engine. Requests are
//! placed by the pool's [`Placer`] (round robin or the KV router, fed with the pool's KV events
//! and lifecycle edges), or pinned to a worker when they come in on that worker's own port. A
//! disaggregated request follows its [`Handoff`]: the ranks report
//! the facts ([`FrontendHandle`]), and `Frontend::carry_out`, the one step interpreter,
//! carries out the steps that move the request between ranks (placements, the transfer,
//! releases, aborts).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Sender as RankSender;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;
use servesim_cluster::{Edge, Fact, Flight, Handoff, Placer, PoolSpec, RouterMode, Step, Topology, TransferTiming};
use servesim_engine::{Backend, BlockHashes, KvEvent, Prompt, Role};
use servesim_router::{Placement, Routed};
use tokio::sync::mpsc::Receiver;

use crate::metrics::RankMetrics;
use crate::rank::stream::{RequestState, Sink, StreamMsg, NOWHERE};
use crate::rank::{self, Client, Command, FrontendHandle, LiveFlight, RankSetup};

pub struct RankHandle {
    pub tx: RankSender<Command>,
    pub metrics: Arc<RankMetrics>,
    pub worker: u32,
    pub pool: usize,
}

pub struct Pool {
    pub spec: PoolSpec,
    /// Global indices of this pool's workers, in order.
    pub workers: Vec<usize>,
    /// Global index of the first rank of the pool's first worker.
    first_rank: usize,
    placer: Mutex<Placer>,
    /// Whether the router's load model's first failure was reported.
    router_warned: AtomicBool,
    /// Requests waiting in the KV router's queue.
    queued: Mutex<FxHashMap<u64, Box<LiveFlight>>>,
}

impl Pool {
    pub fn role(&self) -> Role {
        self.spec.role
    }

    pub fn dp(&self) -> usize {
        self.spec.dp()
    }

    /// The global index of the rank of `target`.
    fn rank(&self, target: usize) -> usize {
        self.first_rank + target
    }
}

/// How a frontend is built.
pub struct FrontendSpec {
    pub topology: Topology,
    pub router: RouterMode,
    /// What `router_prefill_load_model: ais` predicts prompts' prefill times with.
    pub prefill_load_estimator: Option<Arc<dyn servesim_router::PrefillLoadEstimator>>,
    pub router_seed: u64,
    /// Wall-clock speedup of every pass (0: no sleeping).
    pub speedup: f64,
    /// Ids generated tokens are drawn from.
    pub vocabulary: Arc<[u32]>,
    /// Per worker: the ZMQ publisher channel of each of its ranks.
    pub kv_publishers: Vec<Vec<Option<crate::zmq::Publisher>>>,
    /// Seed of generated tokens.
    pub seed: u64,
}

pub struct Frontend {
    topology: Topology,
    pub pools: Vec<Pool>,
    pub ranks: Vec<RankHandle>,
    /// Per worker: its pool and its global rank indices.
    pub worker_pool: Vec<usize>,
    pub worker_ranks: Vec<std::ops::Range<usize>>,
    worker_rr: Vec<AtomicUsize>,
    pub origin: Instant,
    pub backend: Backend,
    pub block_size: u32,
    /// How KV moves to a decode worker (none for an aggregated server).
    transfer: Option<TransferTiming>,
    speedup: f64,
    next_id: AtomicU64,
    seed: u64,
    /// Whether requests need prompt block hashes (the KV router places by them, and takes the
    /// ranks' KV events and lifecycle edges).
    hash_prompts: bool,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// Why a request could not be submitted.
#[derive(Debug)]
pub enum SubmitError {
    UnknownWorker,
}

/// A submitted request: its output stream, and a guard that cancels it when dropped early.
pub struct Submission {
    pub rx: Receiver<StreamMsg>,
    pub guard: AbortGuard,
}

pub struct AbortGuard {
    id: u64,
    state: Arc<RequestState>,
    frontend: Arc<Frontend>,
}

impl AbortGuard {
    /// The worker that has the request now (its decode worker once tokens flow).
    pub fn worker(&self) -> Option<u32> {
        let at = self.state.location.load(Ordering::SeqCst);
        (at != NOWHERE).then(|| self.frontend.ranks[at].worker)
    }

    /// The stream ended normally: nothing to cancel.
    pub fn finish(&self) {
        self.state.finished.store(true, Ordering::SeqCst);
    }
}

impl Drop for AbortGuard {
    fn drop(&mut self) {
        if self.state.finished.load(Ordering::SeqCst) {
            return;
        }
        self.state.cancelled.store(true, Ordering::SeqCst);
        let at = self.state.location.load(Ordering::SeqCst);
        if at != NOWHERE {
            let _ = self.frontend.ranks[at].tx.send(Command::Abort(self.id));
        }
    }
}

impl Frontend {
    /// Builds the pools and starts one thread per engine rank.
    pub fn start(spec: FrontendSpec) -> Result<Arc<Frontend>, crate::error::LiveError> {
        let origin = Instant::now();
        let mut pools = Vec::new();
        let mut worker_pool = Vec::new();
        let mut worker_ranks = Vec::new();
        let mut rank_count = 0usize;
        for (p, pool) in spec.topology.pools().iter().enumerate() {
            let dp = pool.dp();
            let first_rank = rank_count;
            let mut workers = Vec::new();
            for _ in 0..pool.workers {
                workers.push(worker_pool.len());
                worker_pool.push(p);
                worker_ranks.push(rank_count..rank_count + dp);
                rank_count += dp;
            }
            pools.push(Pool {
                placer: Mutex::new(
                    Placer::new(pool, &spec.router, spec.router_seed)
                        .with_prefill_load_estimator(spec.prefill_load_estimator.clone()),
                ),
                router_warned: AtomicBool::new(false),
                queued: Mutex::new(FxHashMap::default()),
                spec: pool.clone(),
                workers,
                first_rank,
            });
        }
        let routed = matches!(spec.router, RouterMode::KvRouter(_));
        let transfer = spec.topology.transfer_timing();
        let has_decode_pool = spec.topology.pool_of(Role::Decode).is_some();
        let mut setups = Vec::new();
        let mut ranks = Vec::new();
        for (w, range) in worker_ranks.iter().enumerate() {
            let p = worker_pool[w];
            let pool = &pools[p];
            for (r, _global) in range.clone().enumerate() {
                let (tx, rx) = std::sync::mpsc::channel();
                let metrics = Arc::new(RankMetrics::new(pool.spec.engine.backend, w as u32, r as u32));
                let publisher = spec.kv_publishers.get(w).and_then(|v| v.get(r).cloned()).flatten();
                ranks.push(RankHandle { tx, metrics: metrics.clone(), worker: w as u32, pool: p });
                let local_index = ranks.len() - 1 - pool.first_rank;
                setups.push(RankSetup {
                    rx,
                    me: ranks.len() - 1,
                    pool: p,
                    origin,
                    engine: pool.spec.rank_engine(),
                    role: pool.role(),
                    remote_decode: pool.role() == Role::Prefill && !has_decode_pool,
                    transfer,
                    engine_index: local_index as u32,
                    dp_rank: r as u32,
                    worker: w as u32,
                    metrics,
                    publisher,
                    routed,
                    vocabulary: spec.vocabulary.clone(),
                    speedup: spec.speedup,
                });
            }
        }
        let first = &spec.topology.pools()[0];
        let frontend = Arc::new(Frontend {
            worker_rr: worker_pool.iter().map(|_| AtomicUsize::new(0)).collect(),
            backend: first.engine.backend,
            block_size: first.engine.block_size,
            transfer,
            speedup: spec.speedup,
            pools,
            ranks,
            worker_pool,
            worker_ranks,
            origin,
            next_id: AtomicU64::new(1),
            seed: spec.seed,
            hash_prompts: routed,
            threads: Mutex::new(Vec::new()),
            topology: spec.topology,
        });
        let mut threads = Vec::new();
        for (i, setup) in setups.into_iter().enumerate() {
            let handle: Arc<dyn FrontendHandle> = frontend.clone();
            let spawned =
                std::thread::Builder::new().name(format!("servesim-rank-{i}")).spawn(move || rank::run(handle, setup));
            match spawned {
                Ok(handle) => threads.push(handle),
                Err(source) => {
                    // Stop the ranks already running before giving up.
                    *frontend.threads.lock().expect("threads lock") = threads;
                    frontend.shutdown();
                    return Err(crate::error::LiveError::Spawn { rank: i, source });
                }
            }
        }
        *frontend.threads.lock().expect("threads lock") = threads;
        Ok(frontend)
    }

    /// Stops every rank (after the requests they hold are dropped) and waits for them.
    pub fn shutdown(&self) {
        for r in &self.ranks {
            let _ = r.tx.send(Command::Shutdown);
        }
        let threads = std::mem::take(&mut *self.threads.lock().expect("threads lock"));
        for t in threads {
            let _ = t.join();
        }
    }

    /// An engine rank whose thread has ended although no shutdown was asked for (it panicked):
    /// its requests fail, so the server is not healthy.
    pub fn stopped_rank(&self) -> Option<usize> {
        let threads = self.threads.lock().ok()?;
        threads.iter().position(|t| t.is_finished())
    }

    pub fn num_workers(&self) -> usize {
        self.worker_pool.len()
    }

    pub fn now_ms(&self) -> f64 {
        self.origin.elapsed().as_secs_f64() * 1000.0
    }

    /// Submits a request to the cluster, or to worker `pin` only.
    pub fn submit(
        self: &Arc<Self>,
        prompt: Arc<[u32]>,
        max_output: u32,
        pin: Option<usize>,
    ) -> Result<Submission, SubmitError> {
        if pin.is_some_and(|w| w >= self.num_workers()) {
            return Err(SubmitError::UnknownWorker);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (sink, rx) = Sink::channel();
        let state = Arc::new(RequestState::new());
        let hashes = if self.hash_prompts {
            BlockHashes::of_tokens(&prompt, self.block_size as usize)
        } else {
            BlockHashes::default()
        };
        let pin_pool = pin.map(|w| self.worker_pool[w]);
        let decode = self.topology.pool_of(Role::Decode);
        let client = Client {
            sink,
            arrival: Instant::now(),
            state: state.clone(),
            pin_decode: if decode.is_some() && pin_pool == decode { pin } else { None },
            prefill_rank: None,
            decode_rank: None,
            prefill_worker: None,
            cached_tokens: None,
        };
        let arrival_ms = self.now_ms();
        let mut flight = Box::new(Flight {
            hashes,
            ..Flight::new(id, Prompt::Tokens(prompt), max_output, arrival_ms, self.seed, &self.topology, client)
        });
        let first_pin = if decode.is_none() || pin_pool != decode { pin } else { None };
        match flight.handoff.as_mut().map(Handoff::start) {
            Some(step) => drop(self.carry_out(flight, vec![step])),
            None => self.place(0, flight, first_pin),
        }
        Ok(Submission { rx, guard: AbortGuard { id, state, frontend: self.clone() } })
    }

    /// Carries out handoff steps: the one place the live server does what a request's
    /// [`Handoff`] asks. Steps that move the request (a placement, the transfer) come last; the
    /// others only send commands by id. Returns the request unless a step moved it on (to a
    /// rank or the router's queue): a rank that reported the transfer landing keeps it and
    /// activates it ([`Step::Activate`] is its own); any other caller lets it go, which ends
    /// its stream if the steps did not.
    fn carry_out(&self, flight: Box<LiveFlight>, steps: Vec<Step>) -> Option<Box<LiveFlight>> {
        let mut flight = Some(flight);
        for step in steps {
            let f = flight.as_mut().expect("a step after the request moved on");
            let id = f.id;
            match step {
                Step::PlaceOnPrefill => {
                    let p = self.topology.pool_of(Role::Prefill).expect("a prefill pool");
                    self.place(p, flight.take().expect("the request"), None);
                }
                Step::PlaceOnDecode => {
                    let p = self.topology.pool_of(Role::Decode).expect("a decode pool");
                    let pin = f.extra.pin_decode;
                    self.place(p, flight.take().expect("the request"), pin);
                }
                Step::StartTransfer { delay_ms } => {
                    let rank = f.extra.decode_rank.expect("reserved on a decode rank");
                    let delay =
                        if self.speedup > 0.0 { crate::wall_duration(delay_ms / 1000.0) } else { Duration::ZERO };
                    self.send(rank, id, Command::Transfer(flight.take().expect("the request"), delay));
                }
                // The decode rank that reported the landing activates the KV it holds.
                Step::Activate => {}
                Step::ReleaseSource => {
                    if let Some(rank) = f.extra.prefill_rank {
                        let _ = self.ranks[rank].tx.send(Command::Release(id));
                    }
                }
                Step::AbortSource => {
                    if let Some(rank) = f.extra.prefill_rank {
                        let _ = self.ranks[rank].tx.send(Command::Abort(id));
                    }
                }
                Step::AbortDestination => {
                    if let Some(rank) = f.extra.decode_rank {
                        let _ = self.ranks[rank].tx.send(Command::Abort(id));
                    }
                }
                Step::Reject(reason) => {
                    f.extra.sink.fail(reason);
                    if let Some(p) = self.topology.pool_of(Role::Decode) {
                        self.router_edge(p, Edge::Free(id));
                    }
                }
            }
        }
        flight
    }

    /// Places `flight` on a rank of pool `p` (on worker `pin` if given) and sends it there.
    fn place(&self, p: usize, flight: Box<LiveFlight>, pin: Option<usize>) {
        let pool = &self.pools[p];
        let target = match pin {
            Some(w) => {
                let worker_in_pool = w - pool.workers[0];
                pool.spec.target(worker_in_pool, self.worker_rr[w].fetch_add(1, Ordering::Relaxed) % pool.dp())
            }
            None => {
                let routed = {
                    let mut placer = pool.placer.lock().expect("placer lock");
                    let routed = placer.route(flight.route_request(), self.now_ms());
                    if let Some(why) = placer.error() {
                        if !pool.router_warned.swap(true, Ordering::Relaxed) {
                            // A live server keeps serving: like Dynamo, the prompt counts in
                            // full without decaying.
                            eprintln!("warning: router: {why}; such prompts count in full without decaying");
                        }
                    }
                    routed
                };
                match routed {
                    Routed::Placed(pl) => pl.target,
                    Routed::Queued => {
                        pool.queued.lock().expect("queue lock").insert(flight.id, flight);
                        return;
                    }
                    Routed::Rejected(why) => {
                        // The client's stream ends when its request is dropped.
                        eprintln!("warning: router: request {} refused: {why}", flight.id);
                        return;
                    }
                }
            }
        };
        self.dispatch(p, target, flight);
    }

    fn dispatch(&self, p: usize, target: usize, mut flight: Box<LiveFlight>) {
        let pool = &self.pools[p];
        let rank = pool.rank(target);
        let id = flight.id;
        let cmd = match pool.role() {
            Role::Decode => {
                flight.decode_target = Some(target);
                flight.extra.decode_rank = Some(rank);
                Command::Accept(flight)
            }
            _ => {
                flight.prefill_target = Some(target);
                if pool.role() == Role::Prefill {
                    flight.extra.prefill_rank = Some(rank);
                    flight.extra.prefill_worker = Some(self.ranks[rank].worker);
                }
                Command::Submit(flight)
            }
        };
        self.send(rank, id, cmd);
    }

    /// Sends a command that moves request `id` to `rank`.
    fn send(&self, rank: usize, id: u64, cmd: Command) {
        let state = match &cmd {
            Command::Submit(f) | Command::Accept(f) | Command::Transfer(f, _) => f.extra.state.clone(),
            _ => unreachable!("only commands that carry the request move it"),
        };
        // The command goes first: an abort that reads the new location queues up behind it.
        let _ = self.ranks[rank].tx.send(cmd);
        state.location.store(rank, Ordering::SeqCst);
        // A client that left between the two lines above read the old location; with
        // sequentially consistent atomics either it sees the new one or this sees its flag
        // (or both, and the second abort finds nothing).
        if state.cancelled.load(Ordering::SeqCst) {
            let _ = self.ranks[rank].tx.send(Command::Abort(id));
        }
    }

    /// Places requests the KV router released from its queue.
    fn dispatch_released(&self, p: usize, released: Vec<Placement>) {
        for pl in released {
            let flight = self.pools[p].queued.lock().expect("queue lock").remove(&pl.id);
            if let Some(flight) = flight {
                if flight.extra.state.cancelled.load(Ordering::SeqCst) {
                    self.router_edge(p, Edge::Free(flight.id));
                    continue;
                }
                self.dispatch(p, pl.target, flight);
            }
        }
    }

    /// The role of a server whose workers all have one role other than aggregated.
    pub fn single_role(&self) -> Option<Role> {
        match self.pools.as_slice() {
            [p] if p.role() != Role::Aggregated => Some(p.role()),
            _ => None,
        }
    }

    /// Metrics of worker `w`'s ranks, or of every rank.
    pub fn metrics_of(&self, worker: Option<usize>) -> Vec<&RankMetrics> {
        match worker {
            Some(w) => self.worker_ranks[w].clone().map(|r| &*self.ranks[r].metrics).collect(),
            None => self.ranks.iter().map(|r| &*r.metrics).collect(),
        }
    }

    /// The smallest context any engine accepts (prompt plus output), if limited.
    pub fn max_model_len(&self) -> Option<u32> {
        self.pools.iter().filter_map(|p| p.spec.engine.max_model_len).min()
    }
}

impl FrontendHandle for Frontend {
    fn handoff(&self, flight: Box<LiveFlight>, fact: Fact) -> Option<Box<LiveFlight>> {
        let mut flight = flight;
        let timing = self.transfer.as_ref().expect("a server that hands requests off");
        let steps = flight.handoff.as_mut().expect("a disaggregated request").on(fact, timing);
        self.carry_out(flight, steps)
    }

    fn router_edge(&self, p: usize, edge: Edge) {
        let released = self.pools[p].placer.lock().expect("placer lock").edge(edge, self.now_ms());
        self.dispatch_released(p, released);
    }

    fn kv_events(&self, p: usize, rank: usize, events: &[KvEvent]) {
        let pool = &self.pools[p];
        pool.placer.lock().expect("placer lock").kv_events(rank - pool.first_rank, events);
    }
}
