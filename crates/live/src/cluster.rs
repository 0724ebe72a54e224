//! The workers of one process and how requests reach them.
//!
//! A [`Cluster`] is one aggregated pool of workers, or a prefill pool and a decode pool. Each
//! worker has `dp_size` ranks; each rank is an [`crate::actor`] thread that owns one engine.
//! Requests are placed on a rank by round robin or by the KV router (per pool, fed with the
//! pool's KV events), or pinned to a worker when they come in on that worker's own port.
//! In a disaggregated cluster a request first runs on a prefill rank; when its prompt is done
//! the prefill rank hands it to the cluster, which places it on a decode rank.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;
use servesim_engine::{Backend, BlockHashes, EngineConfig, KvEvent, WorkerType};
use servesim_router::{KvRouter, Placement, RoundRobin, RouteRequest, Routed, RouterConfig};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

use crate::actor::{self, ActorSetup};
use crate::metrics::RankMetrics;

/// What a request's stream receives.
#[derive(Debug)]
pub enum Out {
    /// Tokens released at the end of one pass.
    Token(u32),
    Tokens(Box<[u32]>),
    /// The request generated all its tokens.
    Done(Done),
    /// The engine refused the request.
    Failed(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Done {
    /// Prompt tokens served from the prefix cache (at prefill).
    pub cached_tokens: u32,
    pub prefill_worker: Option<u32>,
    pub decode_worker: u32,
    /// A prefill-only server finished the prompt: its KV blocks, for a remote decode worker.
    pub remote_blocks: Option<u32>,
}

/// State a request's stream and the actors share.
#[derive(Debug)]
pub struct Shared {
    pub cancelled: AtomicBool,
    pub finished: AtomicBool,
    /// Global index of the rank that has the request now (`NOWHERE` before placement).
    pub location: AtomicUsize,
}

pub const NOWHERE: usize = usize::MAX;

/// A request travelling between ranks.
#[derive(Debug)]
pub struct Job {
    pub id: u64,
    pub prompt: Arc<[u32]>,
    /// Block hashes of the prompt at the engines' block size (empty when nothing needs them).
    pub hashes: BlockHashes,
    pub max_output: u32,
    pub token_seed: u64,
    pub sink: UnboundedSender<Out>,
    pub arrival: Instant,
    pub shared: Arc<Shared>,
    /// Decode worker the request must use (it came in on that worker's port).
    pub pin_decode: Option<usize>,
    /// Disaggregated: the rank holding the prompt's KV, its worker, and the prefix hit there.
    pub prefill_rank: Option<usize>,
    pub prefill_worker: Option<u32>,
    pub cached_tokens: Option<u32>,
}

pub enum Command {
    Submit(Box<Job>),
    /// Decode rank: a prompt computed on a prefill rank; reserve its blocks, then take the KV.
    Reserve(Box<Job>),
    /// Prefill rank: the decode side has the KV of this request.
    Release(u64),
    Abort(u64),
    Shutdown,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Aggregated,
    Prefill,
    Decode,
}

pub struct RankHandle {
    pub tx: Sender<Command>,
    pub metrics: Arc<RankMetrics>,
    pub worker: u32,
    pub pool: usize,
}

enum Placer {
    RoundRobin(RoundRobin),
    Kv {
        router: Box<KvRouter>,
        queued: FxHashMap<u64, Box<Job>>,
        /// Whether the load model's first failure was reported.
        warned: bool,
    },
}

pub struct Pool {
    pub role: Role,
    pub engine: EngineConfig,
    /// Global indices of this pool's workers, in order.
    pub workers: Vec<usize>,
    pub dp: usize,
    /// Global index of the first rank of the pool's first worker.
    first_rank: usize,
    placer: Mutex<Placer>,
}

impl Pool {
    fn rank(&self, target: usize) -> usize {
        self.first_rank + target
    }
}

/// How a cluster is built.
pub struct ClusterSpec {
    /// `(engine, workers)` of the aggregated pool, or of the prefill and decode pools.
    pub pools: Vec<(EngineConfig, u32)>,
    pub kv_router: Option<RouterConfig>,
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

pub struct Cluster {
    pub pools: Vec<Pool>,
    pub ranks: Vec<RankHandle>,
    /// Per worker: its pool and its global rank indices.
    pub worker_pool: Vec<usize>,
    pub worker_ranks: Vec<std::ops::Range<usize>>,
    worker_rr: Vec<AtomicUsize>,
    pub origin: Instant,
    pub backend: Backend,
    pub block_size: u32,
    next_id: AtomicU64,
    seed: u64,
    /// Whether any pool needs prompt block hashes (prefix caching or KV routing).
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
    pub rx: UnboundedReceiver<Out>,
    pub guard: AbortGuard,
}

pub struct AbortGuard {
    id: u64,
    shared: Arc<Shared>,
    cluster: Arc<Cluster>,
}

impl AbortGuard {
    /// The worker that has the request now (its decode worker once tokens flow).
    pub fn worker(&self) -> Option<u32> {
        let at = self.shared.location.load(Ordering::SeqCst);
        (at != NOWHERE).then(|| self.cluster.ranks[at].worker)
    }

    /// The stream ended normally: nothing to cancel.
    pub fn finish(&self) {
        self.shared.finished.store(true, Ordering::SeqCst);
    }
}

impl Drop for AbortGuard {
    fn drop(&mut self) {
        if self.shared.finished.load(Ordering::SeqCst) {
            return;
        }
        self.shared.cancelled.store(true, Ordering::SeqCst);
        let at = self.shared.location.load(Ordering::SeqCst);
        if at != NOWHERE {
            let _ = self.cluster.ranks[at].tx.send(Command::Abort(self.id));
        }
    }
}

impl Cluster {
    /// Builds the pools and starts one actor thread per rank.
    pub fn start(spec: ClusterSpec) -> Arc<Cluster> {
        let origin = Instant::now();
        let mut pools = Vec::new();
        let mut worker_pool = Vec::new();
        let mut worker_ranks = Vec::new();
        let mut rank_count = 0usize;
        for (p, (engine, n)) in spec.pools.iter().enumerate() {
            let role = match engine.worker_type {
                WorkerType::Aggregated => Role::Aggregated,
                WorkerType::Prefill => Role::Prefill,
                WorkerType::Decode => Role::Decode,
            };
            let dp = engine.dp_size as usize;
            let first_rank = rank_count;
            let mut workers = Vec::new();
            for _ in 0..*n {
                workers.push(worker_pool.len());
                worker_pool.push(p);
                worker_ranks.push(rank_count..rank_count + dp);
                rank_count += dp;
            }
            let targets = workers.len() * dp;
            let placer = match &spec.kv_router {
                Some(rc) => {
                    let rc = match role {
                        Role::Aggregated => rc.clone(),
                        Role::Prefill => rc.for_prefill(),
                        Role::Decode => rc.for_decode(),
                    };
                    let budget = engine.max_num_batched_tokens.unwrap_or(8192);
                    Placer::Kv {
                        router: Box::new(
                            KvRouter::new(rc, targets, engine.block_size, budget, spec.router_seed)
                                .with_prefill_load_estimator(spec.prefill_load_estimator.clone()),
                        ),
                        queued: FxHashMap::default(),
                        warned: false,
                    }
                }
                None => Placer::RoundRobin(RoundRobin::default()),
            };
            pools.push(Pool { role, engine: engine.clone(), workers, dp, first_rank, placer: Mutex::new(placer) });
        }
        let mut setups = Vec::new();
        let mut ranks = Vec::new();
        for (w, range) in worker_ranks.iter().enumerate() {
            let p = worker_pool[w];
            let pool = &pools[p];
            for (r, _global) in range.clone().enumerate() {
                let (tx, rx) = std::sync::mpsc::channel();
                let metrics = Arc::new(RankMetrics::new(pool.engine.backend, w as u32, r as u32));
                let publisher = spec.kv_publishers.get(w).and_then(|v| v.get(r).cloned()).flatten();
                ranks.push(RankHandle { tx, metrics: metrics.clone(), worker: w as u32, pool: p });
                let local_index = ranks.len() - 1 - pool.first_rank;
                setups.push(ActorSetup {
                    rx,
                    engine: pool.engine.clone(),
                    role: pool.role,
                    engine_index: local_index as u32,
                    dp_rank: r as u32,
                    worker: w as u32,
                    metrics,
                    publisher,
                    routed: spec.kv_router.is_some(),
                    vocabulary: spec.vocabulary.clone(),
                    speedup: spec.speedup,
                });
            }
        }
        let backend = pools[0].engine.backend;
        let block_size = pools[0].engine.block_size;
        let cluster = Arc::new(Cluster {
            worker_rr: worker_pool.iter().map(|_| AtomicUsize::new(0)).collect(),
            pools,
            ranks,
            worker_pool,
            worker_ranks,
            origin,
            backend,
            block_size,
            next_id: AtomicU64::new(1),
            seed: spec.seed,
            hash_prompts: spec.kv_router.is_some() || spec.pools.iter().any(|p| p.0.enable_prefix_caching),
            threads: Mutex::new(Vec::new()),
        });
        let mut threads = Vec::new();
        for (i, setup) in setups.into_iter().enumerate() {
            let c = cluster.clone();
            let handle = std::thread::Builder::new()
                .name(format!("servesim-rank-{i}"))
                .spawn(move || actor::run(c, i, setup))
                .expect("spawning an engine thread");
            threads.push(handle);
        }
        *cluster.threads.lock().expect("threads lock") = threads;
        cluster
    }

    /// Stops every actor (after the requests they hold are dropped) and waits for them.
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
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            cancelled: AtomicBool::new(false),
            finished: AtomicBool::new(false),
            location: AtomicUsize::new(NOWHERE),
        });
        let hashes = if self.hash_prompts {
            BlockHashes::of_tokens(&prompt, self.block_size as usize)
        } else {
            BlockHashes::default()
        };
        let pin_pool = pin.map(|w| self.worker_pool[w]);
        let job = Box::new(Job {
            id,
            prompt,
            hashes,
            max_output,
            token_seed: self.seed ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15),
            sink: tx,
            arrival: Instant::now(),
            shared: shared.clone(),
            pin_decode: if self.pools.len() > 1 && pin_pool == Some(1) { pin } else { None },
            prefill_rank: None,
            prefill_worker: None,
            cached_tokens: None,
        });
        let first_pin = if pin_pool == Some(0) { pin } else { None };
        self.place(0, job, first_pin);
        Ok(Submission { rx, guard: AbortGuard { id, shared, cluster: self.clone() } })
    }

    /// Places `job` on a rank of pool `p` (on worker `pin` if given) and sends it there.
    fn place(&self, p: usize, job: Box<Job>, pin: Option<usize>) {
        let pool = &self.pools[p];
        let target = match pin {
            Some(w) => {
                let first = self.worker_ranks[w].start - pool.first_rank;
                first + self.worker_rr[w].fetch_add(1, Ordering::Relaxed) % pool.dp
            }
            None => {
                let mut placer = pool.placer.lock().expect("placer lock");
                match &mut *placer {
                    Placer::RoundRobin(rr) => {
                        // Cycle through the workers first, then their ranks.
                        let n = pool.workers.len();
                        let k = rr.pick(n * pool.dp);
                        (k % n) * pool.dp + k / n
                    }
                    Placer::Kv { router, queued, warned } => {
                        let req = RouteRequest {
                            id: job.id,
                            hashes: &job.hashes.seq,
                            isl: job.prompt.len() as u32,
                            priority: 0,
                            strict_priority: 0,
                            arrival_ms: self.now_ms(),
                        };
                        let routed = router.route(req, self.now_ms());
                        if let (Some(why), false) = (router.error(), *warned) {
                            // A live server keeps serving: like Dynamo, the prompt counts in
                            // full without decaying.
                            eprintln!("warning: router: {why}; such prompts count in full without decaying");
                            *warned = true;
                        }
                        match routed {
                            Routed::Placed(pl) => pl.target,
                            Routed::Queued => {
                                queued.insert(job.id, job);
                                return;
                            }
                        }
                    }
                }
            }
        };
        self.dispatch(p, target, job);
    }

    fn dispatch(&self, p: usize, target: usize, job: Box<Job>) {
        let pool = &self.pools[p];
        let rank = pool.rank(target);
        let (id, shared) = (job.id, job.shared.clone());
        let cmd = if pool.role == Role::Decode { Command::Reserve(job) } else { Command::Submit(job) };
        // The command goes first: an abort that reads the new location queues up behind it.
        let _ = self.ranks[rank].tx.send(cmd);
        shared.location.store(rank, Ordering::SeqCst);
        // A client that left between the two lines above read the old location; with
        // sequentially consistent atomics either it sees the new one or this sees its flag
        // (or both, and the second abort finds nothing).
        if shared.cancelled.load(Ordering::SeqCst) {
            let _ = self.ranks[rank].tx.send(Command::Abort(id));
        }
    }

    /// Places requests the KV router released from its queue.
    fn dispatch_released(&self, p: usize, released: Vec<Placement>) {
        for pl in released {
            let job = match &mut *self.pools[p].placer.lock().expect("placer lock") {
                Placer::Kv { queued, .. } => queued.remove(&pl.id),
                Placer::RoundRobin(_) => None,
            };
            if let Some(job) = job {
                if job.shared.cancelled.load(Ordering::SeqCst) {
                    self.router_free(p, job.id);
                    continue;
                }
                self.dispatch(p, pl.target, job);
            }
        }
    }

    /// Feeds a rank's KV events to its pool's router.
    pub fn router_events(&self, p: usize, rank: usize, events: &[KvEvent]) {
        let pool = &self.pools[p];
        if let Placer::Kv { router, .. } = &mut *pool.placer.lock().expect("placer lock") {
            router.apply_events(rank - pool.first_rank, events);
        }
    }

    /// Router lifecycle edge: the request's prompt is done.
    pub fn router_prefill_done(&self, p: usize, id: u64) {
        let released = match &mut *self.pools[p].placer.lock().expect("placer lock") {
            Placer::Kv { router, .. } => router.prefill_completed(id, self.now_ms()),
            Placer::RoundRobin(_) => return,
        };
        self.dispatch_released(p, released);
    }

    /// Router lifecycle edge: the request left the pool.
    pub fn router_free(&self, p: usize, id: u64) {
        let released = match &mut *self.pools[p].placer.lock().expect("placer lock") {
            Placer::Kv { router, .. } => router.free(id, self.now_ms()),
            Placer::RoundRobin(_) => return,
        };
        self.dispatch_released(p, released);
    }

    /// The role of a server whose workers all have one role other than aggregated.
    pub fn single_role(&self) -> Option<Role> {
        match self.pools.as_slice() {
            [p] if p.role != Role::Aggregated => Some(p.role),
            _ => None,
        }
    }

    /// Prefill workers hand their requests to a decode pool in this process (false for a
    /// prefill-only server, whose clients take the KV elsewhere).
    pub fn has_decode_pool(&self) -> bool {
        self.pools.iter().any(|p| p.role == Role::Decode)
    }

    /// A prefill rank finished a prompt: place the request on the decode pool.
    pub fn hand_off(&self, job: Box<Job>) {
        let pin = job.pin_decode;
        self.place(1, job, pin);
    }

    /// Tells prefill rank `rank` that it may free the KV of `id`.
    pub fn release(&self, rank: usize, id: u64) {
        let _ = self.ranks[rank].tx.send(Command::Release(id));
    }

    /// Time to move the KV of a prompt of `prompt_len` tokens (`reused` of them already cached
    /// at the destination), at the prefill pool's bandwidth (a decode-only server's own).
    pub fn transfer_delay(&self, prompt_len: u32, reused: u32) -> Duration {
        let e = &self.pools[0].engine;
        let tokens = match e.kv_transfer_timing_mode {
            servesim_engine::KvTransferTimingMode::FullPrompt => prompt_len as u64,
            servesim_engine::KvTransferTimingMode::DestinationMissing => {
                let bs = e.block_size as u64;
                (prompt_len as u64).div_ceil(bs).saturating_sub(reused as u64 / bs) * bs
            }
        };
        crate::wall_duration(e.kv_transfer_ms(tokens) / 1000.0)
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
        self.pools.iter().filter_map(|p| p.engine.max_model_len).min()
    }
}
