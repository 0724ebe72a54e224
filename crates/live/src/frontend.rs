//! The workers of one process and how requests reach them.
//!
//! A [`Cluster`] is one aggregated pool of workers, or a prefill pool and a decode pool (or one
//! side of them, for a single-role server), built from a [`Topology`]. Each worker has `dp_size`
//! ranks; each rank is an [`crate::actor`] thread that owns one engine. Requests are placed by
//! the pool's [`Placer`] (round robin or the KV router, fed with the pool's KV events), or
//! pinned to a worker when they come in on that worker's own port. A disaggregated request
//! follows its [`Handoff`]: this module carries out the steps that move it between ranks
//! (placements, the transfer, releases), the ranks report the facts.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Sender as RankSender;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;
use servesim_cluster::{
    token_seed, Fact, Flight, Handoff, Order, Placer, PoolSpec, RouterMode, Step, Topology, TransferTiming,
};
use servesim_engine::{Backend, BlockHashes, KvEvent, Prompt, RejectReason, Role};
use servesim_router::{Placement, Routed};
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::mpsc::{OwnedPermit, Receiver, Sender};

use crate::actor::{self, ActorSetup};
use crate::metrics::RankMetrics;

/// What a request's stream receives.
#[derive(Debug)]
pub enum Out {
    /// Tokens released at the end of one pass (or of several, for a stream that fell behind).
    Token(u32),
    Tokens(Box<[u32]>),
    /// The request generated all its tokens: the last ones that had not been sent yet, and how
    /// it went.
    Done {
        tail: Box<[u32]>,
        done: Done,
    },
    /// The engine (or the disaggregated handoff) refused the request.
    Failed(RejectReason),
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

/// Messages a stream's channel holds before its tokens wait on the rank instead.
pub const STREAM_BUFFER: usize = 64;

/// The sending side of a request's stream, used by whichever rank has the request. It never
/// waits: when the client falls behind and the channel is full, new tokens wait in `backlog`
/// (4 bytes each) and go out together with the next ones that fit. The end of the stream has a
/// slot reserved from the start, so it is always delivered, behind everything before it. A
/// client that takes nothing for the write timeout has its connection closed, which drops the
/// receiver: the next send reports [`ClientGone`] and the rank aborts the request.
#[derive(Debug)]
pub struct Sink {
    tx: Sender<Out>,
    last: Option<OwnedPermit<Out>>,
    backlog: Vec<u32>,
}

/// The client of a request went away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientGone;

impl Sink {
    /// A stream's channel: its sink and its receiver.
    pub fn channel() -> (Sink, Receiver<Out>) {
        let (tx, rx) = tokio::sync::mpsc::channel(STREAM_BUFFER + 1);
        let last = tx.clone().try_reserve_owned().ok();
        (Sink { tx, last, backlog: Vec::new() }, rx)
    }

    /// Sends the tokens of one pass, or keeps them until there is room.
    pub fn tokens(&mut self, ids: impl ExactSizeIterator<Item = u32>) -> Result<(), ClientGone> {
        if self.tx.is_closed() {
            return Err(ClientGone);
        }
        if self.tx.capacity() == 0 {
            // Still full: the tokens join the backlog, which grows amortised. (Boxing it for a
            // send that fails, then unboxing it, copied it whole every pass: quadratic in the
            // tokens of a stream whose client has stopped reading.)
            self.backlog.extend(ids);
            return Ok(());
        }
        let msg = if !self.backlog.is_empty() {
            self.backlog.extend(ids);
            Out::Tokens(std::mem::take(&mut self.backlog).into_boxed_slice())
        } else if ids.len() == 1 {
            Out::Token(ids.into_iter().next().expect("one token"))
        } else {
            Out::Tokens(ids.collect())
        };
        match self.tx.try_send(msg) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(Out::Token(t))) => {
                self.backlog.push(t);
                Ok(())
            }
            Err(TrySendError::Full(Out::Tokens(ts))) => {
                self.backlog = ts.into_vec();
                Ok(())
            }
            Err(TrySendError::Full(_)) => unreachable!("only tokens are sent here"),
            Err(TrySendError::Closed(_)) => Err(ClientGone),
        }
    }

    /// Ends the stream: what is left of its tokens, then `done`.
    pub fn done(&mut self, done: Done) {
        let tail = std::mem::take(&mut self.backlog).into_boxed_slice();
        self.end(Out::Done { tail, done });
    }

    /// Ends the stream with a refusal.
    pub fn fail(&mut self, reason: RejectReason) {
        self.end(Out::Failed(reason));
    }

    fn end(&mut self, out: Out) {
        if let Some(permit) = self.last.take() {
            permit.send(out);
        }
    }
}

/// What the live server keeps beside a request in flight: its client and where it is.
#[derive(Debug)]
pub struct Client {
    pub sink: Sink,
    pub arrival: Instant,
    pub shared: Arc<Shared>,
    /// Decode worker the request must use (it came in on that worker's port).
    pub pin_decode: Option<usize>,
    /// Global ranks holding the request on each side of a handoff, and the prefill worker.
    pub prefill_rank: Option<usize>,
    pub decode_rank: Option<usize>,
    pub prefill_worker: Option<u32>,
    /// Prefix hit at its first admission.
    pub cached_tokens: Option<u32>,
}

/// A request travelling between ranks.
pub type Job = Flight<Client>;

pub enum Command {
    Submit(Box<Job>),
    /// Decode rank: a prompt computed (or being computed) elsewhere; it waits for KV blocks.
    Accept(Box<Job>),
    /// Decode rank: the KV of a request whose blocks this rank reserved lands after the delay.
    Transfer(Box<Job>, Duration),
    /// Prefill rank: the decode side has the KV of this request.
    Release(u64),
    Abort(u64),
    Shutdown,
}

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
    queued: Mutex<FxHashMap<u64, Box<Job>>>,
}

impl Pool {
    pub fn role(&self) -> Role {
        self.spec.role
    }

    pub fn dp(&self) -> usize {
        self.spec.dp()
    }

    fn rank(&self, target: usize) -> usize {
        self.first_rank + target
    }
}

/// How a cluster is built.
pub struct ClusterSpec {
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
    /// How KV moves to a decode worker: the prefill side's settings (a decode-only server's own).
    transfer: TransferTiming,
    speedup: f64,
    next_id: AtomicU64,
    seed: u64,
    /// Whether requests need prompt block hashes (the KV router places by them).
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
    pub rx: Receiver<Out>,
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
    pub fn start(spec: ClusterSpec) -> Result<Arc<Cluster>, crate::error::LiveError> {
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
                setups.push(ActorSetup {
                    rx,
                    engine: pool.spec.rank_engine(),
                    role: pool.role(),
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
        let cluster = Arc::new(Cluster {
            worker_rr: worker_pool.iter().map(|_| AtomicUsize::new(0)).collect(),
            backend: first.engine.backend,
            block_size: first.engine.block_size,
            transfer: TransferTiming { kv: first.deployment.kv_transfer, block_size: first.engine.block_size },
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
        });
        let mut threads = Vec::new();
        for (i, setup) in setups.into_iter().enumerate() {
            let c = cluster.clone();
            let spawned =
                std::thread::Builder::new().name(format!("servesim-rank-{i}")).spawn(move || actor::run(c, i, setup));
            match spawned {
                Ok(handle) => threads.push(handle),
                Err(source) => {
                    // Stop the ranks already running before giving up.
                    *cluster.threads.lock().expect("threads lock") = threads;
                    cluster.shutdown();
                    return Err(crate::error::LiveError::Spawn { rank: i, source });
                }
            }
        }
        *cluster.threads.lock().expect("threads lock") = threads;
        Ok(cluster)
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

    fn pool_of(&self, role: Role) -> Option<usize> {
        self.pools.iter().position(|p| p.role() == role)
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
        let decode = self.pool_of(Role::Decode);
        let prompt_len = prompt.len() as u32;
        let handoff = match (self.pool_of(Role::Prefill), decode) {
            (Some(_), Some(d)) => Some(Handoff::new(Order::for_backend(self.pools[d].spec.engine.backend), prompt_len)),
            // A decode-only server: the prompt was computed by a prefill server elsewhere.
            (None, Some(_)) => Some(Handoff::remote_source(prompt_len)),
            _ => None,
        };
        let job = Box::new(Flight {
            id,
            prompt: Prompt::Tokens(prompt),
            hashes,
            max_output,
            token_seed: token_seed(self.seed, id),
            planned_output: None,
            priority: 0,
            strict_priority: 0,
            arrival_ms: self.now_ms(),
            policy_class: None,
            prefill_target: None,
            decode_target: None,
            handoff,
            extra: Client {
                sink,
                arrival: Instant::now(),
                shared: shared.clone(),
                pin_decode: if decode.is_some() && pin_pool == decode { pin } else { None },
                prefill_rank: None,
                decode_rank: None,
                prefill_worker: None,
                cached_tokens: None,
            },
        });
        let first_pin = if decode.is_none() || pin_pool != decode { pin } else { None };
        let mut job = job;
        match job.handoff.as_mut().map(Handoff::start) {
            Some(step) => self.carry_out(job, vec![step]),
            None => self.place(0, job, first_pin),
        }
        Ok(Submission { rx, guard: AbortGuard { id, shared, cluster: self.clone() } })
    }

    /// Reports `fact` to `job`'s handoff and carries out the steps it leads to.
    pub fn handoff(&self, mut job: Box<Job>, fact: Fact) {
        let steps = job.handoff.as_mut().expect("a disaggregated request").on(fact, &self.transfer);
        self.carry_out(job, steps);
    }

    /// The transfer settings handoffs are timed with.
    pub fn transfer(&self) -> &TransferTiming {
        &self.transfer
    }

    /// Reports `fact` to the handoff of a request that stays on the rank calling (a decode
    /// rank landing a transfer): the steps that only send commands are carried out; the
    /// activation is the caller's.
    pub fn settle(&self, job: &mut Job, fact: Fact) {
        let steps = job.handoff.as_mut().expect("a disaggregated request").on(fact, &self.transfer);
        for step in steps {
            match step {
                Step::Activate => {}
                Step::ReleaseSource => {
                    if let Some(rank) = job.extra.prefill_rank {
                        self.release(rank, job.id);
                    }
                }
                other => unreachable!("{other:?} after the transfer landed"),
            }
        }
    }

    /// Carries out handoff steps. Steps that move the request (a placement, the transfer) come
    /// last; the others only send commands by id.
    fn carry_out(&self, job: Box<Job>, steps: Vec<Step>) {
        let mut job = Some(job);
        for step in steps {
            let j = job.as_mut().expect("a step after the request moved on");
            let id = j.id;
            match step {
                Step::PlaceOnPrefill => {
                    let p = self.pool_of(Role::Prefill).expect("a prefill pool");
                    self.place(p, job.take().expect("the request"), None);
                }
                Step::PlaceOnDecode => {
                    let p = self.pool_of(Role::Decode).expect("a decode pool");
                    let pin = j.extra.pin_decode;
                    self.place(p, job.take().expect("the request"), pin);
                }
                Step::StartTransfer { delay_ms } => {
                    let rank = j.extra.decode_rank.expect("reserved on a decode rank");
                    let delay =
                        if self.speedup > 0.0 { crate::wall_duration(delay_ms / 1000.0) } else { Duration::ZERO };
                    self.send(rank, id, Command::Transfer(job.take().expect("the request"), delay));
                }
                // The decode rank activates the KV it receives itself.
                Step::Activate => unreachable!("activation happens on the decode rank"),
                Step::ReleaseSource => {
                    if let Some(rank) = j.extra.prefill_rank {
                        self.release(rank, id);
                    }
                }
                Step::AbortSource => {
                    if let Some(rank) = j.extra.prefill_rank {
                        let _ = self.ranks[rank].tx.send(Command::Abort(id));
                    }
                }
                Step::AbortDestination => {
                    if let Some(rank) = j.extra.decode_rank {
                        let _ = self.ranks[rank].tx.send(Command::Abort(id));
                    }
                }
                Step::Reject(reason) => {
                    j.extra.sink.fail(reason);
                    if let Some(p) = self.pool_of(Role::Decode) {
                        self.router_free(p, id);
                    }
                }
            }
        }
    }

    /// Places `job` on a rank of pool `p` (on worker `pin` if given) and sends it there.
    fn place(&self, p: usize, job: Box<Job>, pin: Option<usize>) {
        let pool = &self.pools[p];
        let target = match pin {
            Some(w) => {
                let first = self.worker_ranks[w].start - pool.first_rank;
                first + self.worker_rr[w].fetch_add(1, Ordering::Relaxed) % pool.dp()
            }
            None => {
                let routed = {
                    let mut placer = pool.placer.lock().expect("placer lock");
                    let routed = placer.route(job.route_request(), self.now_ms());
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
                        pool.queued.lock().expect("queue lock").insert(job.id, job);
                        return;
                    }
                    Routed::Rejected(why) => {
                        // The client's stream ends when its job is dropped.
                        eprintln!("warning: router: request {} refused: {why}", job.id);
                        return;
                    }
                }
            }
        };
        self.dispatch(p, target, job);
    }

    fn dispatch(&self, p: usize, target: usize, mut job: Box<Job>) {
        let pool = &self.pools[p];
        let rank = pool.rank(target);
        let id = job.id;
        let cmd = match pool.role() {
            Role::Decode => {
                job.decode_target = Some(target);
                job.extra.decode_rank = Some(rank);
                Command::Accept(job)
            }
            _ => {
                job.prefill_target = Some(target);
                if pool.role() == Role::Prefill {
                    job.extra.prefill_rank = Some(rank);
                    job.extra.prefill_worker = Some(self.ranks[rank].worker);
                }
                Command::Submit(job)
            }
        };
        self.send(rank, id, cmd);
    }

    /// Sends a command that moves request `id` to `rank`.
    fn send(&self, rank: usize, id: u64, cmd: Command) {
        let shared = match &cmd {
            Command::Submit(job) | Command::Accept(job) | Command::Transfer(job, _) => job.extra.shared.clone(),
            _ => unreachable!("only commands that carry the request move it"),
        };
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
            let job = self.pools[p].queued.lock().expect("queue lock").remove(&pl.id);
            if let Some(job) = job {
                if job.extra.shared.cancelled.load(Ordering::SeqCst) {
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
        pool.placer.lock().expect("placer lock").kv_events(rank - pool.first_rank, events);
    }

    /// Router lifecycle edge: the request's prompt is done.
    pub fn router_prefill_done(&self, p: usize, id: u64) {
        let released = self.pools[p].placer.lock().expect("placer lock").prefill_done(id, self.now_ms());
        self.dispatch_released(p, released);
    }

    /// Router lifecycle edge: the request left the pool.
    pub fn router_free(&self, p: usize, id: u64) {
        let released = self.pools[p].placer.lock().expect("placer lock").free(id, self.now_ms());
        self.dispatch_released(p, released);
    }

    /// The role of a server whose workers all have one role other than aggregated.
    pub fn single_role(&self) -> Option<Role> {
        match self.pools.as_slice() {
            [p] if p.role() != Role::Aggregated => Some(p.role()),
            _ => None,
        }
    }

    /// Prefill workers hand their requests to a decode pool in this process (false for a
    /// prefill-only server, whose clients take the KV elsewhere).
    pub fn has_decode_pool(&self) -> bool {
        self.pool_of(Role::Decode).is_some()
    }

    /// Tells prefill rank `rank` that it may free the KV of `id`.
    pub fn release(&self, rank: usize, id: u64) {
        let _ = self.ranks[rank].tx.send(Command::Release(id));
    }

    /// Wall time a prefill-only server holds a finished prompt's KV (what sending it to a remote
    /// decode server would take at this server's bandwidth).
    pub fn hold_for_remote(&self, prompt_len: u32) -> Duration {
        if self.speedup > 0.0 {
            crate::wall_duration(self.transfer.delay_ms(prompt_len, 0) / 1000.0)
        } else {
            Duration::ZERO
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
