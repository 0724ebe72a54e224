//! One engine rank on the wall clock.
//!
//! Each rank runs on its own thread: it takes commands (new requests, reservations, releases,
//! aborts) between passes, runs a pass with [`Engine::step`], sleeps until the pass's modelled
//! end, and then releases what the pass produced: tokens to the requests' streams, KV events to
//! the router and the ZMQ publisher, and the rank's gauges. The engine's clock is the wall clock
//! since the cluster started: a pass that follows another starts when the previous one ends (so
//! oversleeping never accumulates), and a pass after an idle gap starts now. With speedup 0 no
//! pass sleeps.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustc_hash::{FxHashMap, FxHashSet};
use servesim_engine::{Engine, EngineConfig, EngineOptions, EngineRequest, Finish, PassOutput, Prompt};

use crate::cluster::{Cluster, Command, Done, Job, Out, Role};
use crate::metrics::RankMetrics;

pub struct ActorSetup {
    pub rx: Receiver<Command>,
    pub engine: EngineConfig,
    pub role: Role,
    /// Position of this rank in its pool (offsets the engine's seeds).
    pub engine_index: u32,
    pub dp_rank: u32,
    pub worker: u32,
    pub metrics: Arc<RankMetrics>,
    pub publisher: Option<crate::zmq::Publisher>,
    /// The pool places requests with the KV router (which wants events and lifecycle edges).
    pub routed: bool,
    pub vocabulary: Arc<[u32]>,
    pub speedup: f64,
}

/// A request this rank holds.
struct Live {
    job: Box<Job>,
    first_token: Option<Instant>,
    last_token: Instant,
}

struct Actor {
    cluster: Arc<Cluster>,
    /// Global rank index.
    me: usize,
    pool: usize,
    role: Role,
    worker: u32,
    dp_rank: u32,
    engine: Engine,
    live: FxHashMap<u64, Live>,
    /// Prefill rank: finished requests whose KV waits for the decode side.
    held: FxHashSet<u64>,
    /// Decode rank: requests waiting for blocks, in arrival order.
    /// Decode rank: accepted handoffs waiting for KV blocks, by id.
    pending: FxHashMap<u64, Box<Job>>,
    /// Decode rank: reserved requests whose KV lands at the given instant.
    transfers: Vec<(Instant, u64)>,
    /// Prefill-only server: held requests whose KV has left at the given instant.
    departures: Vec<(Instant, u64)>,
    /// Prefill rank of a prefill-only server: its token goes to the client, its KV to a
    /// decode worker elsewhere.
    remote_decode: bool,
    metrics: Arc<RankMetrics>,
    publisher: Option<crate::zmq::Publisher>,
    routed: bool,
    speedup: f64,
    num_blocks: f64,
    block_size: u32,
    out: PassOutput,
    /// Modelled end of the last pass, in ms since the cluster started.
    last_end: f64,
    shutdown: bool,
}

pub fn run(cluster: Arc<Cluster>, me: usize, s: ActorSetup) {
    let record = s.routed || s.publisher.is_some();
    let mut engine =
        Engine::new(s.engine.clone(), EngineOptions { record_kv_events: record, engine_index: s.engine_index });
    engine.set_output_vocabulary(Some(s.vocabulary.clone()));
    engine.set_record_block_tokens(s.publisher.is_some());
    let pool = cluster.ranks[me].pool;
    let cluster_has_decode = cluster.has_decode_pool();
    let mut a = Actor {
        cluster,
        me,
        pool,
        role: s.role,
        worker: s.worker,
        dp_rank: s.dp_rank,
        engine,
        live: FxHashMap::default(),
        held: FxHashSet::default(),
        pending: FxHashMap::default(),
        transfers: Vec::new(),
        departures: Vec::new(),
        remote_decode: s.role == Role::Prefill && !cluster_has_decode,
        metrics: s.metrics,
        publisher: s.publisher,
        routed: s.routed,
        speedup: s.speedup,
        num_blocks: s.engine.num_gpu_blocks.max(1) as f64,
        block_size: s.engine.block_size,
        out: PassOutput::default(),
        last_end: 0.0,
        shutdown: false,
    };
    a.run(s.rx);
}

impl Actor {
    fn run(&mut self, rx: Receiver<Command>) {
        // Whether the last iteration ran a pass that did something: the next pass starts at its
        // end. Otherwise the engine waits for news before stepping again.
        let mut busy = false;
        loop {
            if !busy {
                // Idle (or stuck until a command changes something): wait for a command or the
                // next KV transfer to land.
                let first_due = self.transfers.iter().chain(&self.departures).map(|t| t.0).min();
                let cmd = match first_due {
                    Some(due) => match rx.recv_timeout(due.saturating_duration_since(Instant::now())) {
                        Ok(c) => Some(c),
                        Err(RecvTimeoutError::Timeout) => None,
                        Err(RecvTimeoutError::Disconnected) => return,
                    },
                    None => match rx.recv() {
                        Ok(c) => Some(c),
                        Err(_) => return,
                    },
                };
                if let Some(c) = cmd {
                    self.command(c);
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(c) => self.command(c),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return,
                }
            }
            if self.shutdown {
                return;
            }
            self.land_transfers();
            self.retry_destination();
            if !self.engine.has_work() {
                // Aborts and releases change the state without a pass.
                self.gauges();
                busy = false;
                continue;
            }
            let wall = self.cluster.now_ms();
            let start = if busy || self.speedup <= 0.0 { self.last_end } else { self.last_end.max(wall) };
            let mut out = std::mem::take(&mut self.out);
            self.engine.step(start, &mut out);
            if self.speedup > 0.0 {
                let deadline = self.cluster.origin + crate::wall_duration(out.end_ms / 1000.0);
                let now = Instant::now();
                if deadline > now {
                    std::thread::sleep(deadline - now);
                }
                let late = Instant::now().saturating_duration_since(deadline);
                if out.end_ms > out.start_ms {
                    self.metrics.lateness.observe(late.as_secs_f64());
                }
            } else {
                std::thread::yield_now();
            }
            self.last_end = out.end_ms;
            busy = !out.is_empty() || out.end_ms > out.start_ms;
            self.release(&out);
            self.out = out;
        }
    }

    fn command(&mut self, c: Command) {
        match c {
            Command::Submit(job) => self.submit(job),
            Command::Reserve(job) => {
                if job.shared.cancelled.load(Ordering::SeqCst) {
                    self.drop_transferred(&job);
                } else {
                    self.accept(job);
                }
            }
            Command::Release(id) => {
                if self.held.remove(&id) {
                    self.engine.release_held(id);
                }
            }
            Command::Abort(id) => self.abort(id),
            Command::Shutdown => self.shutdown = true,
        }
    }

    fn submit(&mut self, job: Box<Job>) {
        if job.shared.cancelled.load(Ordering::SeqCst) {
            if self.routed {
                self.cluster.router_free(self.pool, job.id);
            }
            return;
        }
        let max_output = if self.role == Role::Prefill { 1 } else { job.max_output };
        let hashes = (!job.hashes.is_empty()).then(|| job.hashes.clone());
        self.engine.submit(EngineRequest {
            id: job.id,
            prompt: Prompt::Tokens(job.prompt.clone()),
            max_output,
            token_seed: job.token_seed,
            hashes,
            planned_output: None,
        });
        let now = Instant::now();
        self.live.insert(job.id, Live { job, first_token: None, last_token: now });
    }

    /// A transferred request that will not run here: the prefill side may free its copy.
    fn drop_transferred(&mut self, job: &Job) {
        if let Some(rank) = job.prefill_rank {
            self.cluster.release(rank, job.id);
        }
        if self.routed {
            self.cluster.router_free(self.pool, job.id);
        }
    }

    fn abort(&mut self, id: u64) {
        if let Some(job) = self.pending.remove(&id) {
            self.engine.abort(id);
            self.drop_transferred(&job);
            return;
        }
        self.held.remove(&id);
        self.transfers.retain(|t| t.1 != id);
        self.departures.retain(|t| t.1 != id);
        let found = self.engine.abort(id);
        if let Some(l) = self.live.remove(&id) {
            // A reserved or running decode request no longer needs the prefill copy.
            if let Some(rank) = l.job.prefill_rank {
                self.cluster.release(rank, id);
            }
        }
        if found && self.routed {
            self.cluster.router_free(self.pool, id);
        }
    }

    /// Decode rank: reserves blocks for waiting transferred prompts, in order, until one does
    /// not fit; starts their transfers.
    /// A handoff for this decode rank: it waits in the engine for its blocks.
    fn accept(&mut self, job: Box<Job>) {
        let request = EngineRequest {
            id: job.id,
            prompt: Prompt::Tokens(job.prompt.clone()),
            max_output: job.max_output,
            token_seed: job.token_seed,
            hashes: (!job.hashes.is_empty()).then(|| job.hashes.clone()),
            planned_output: None,
        };
        match self.engine.accept_destination(request) {
            Ok(()) => {
                self.pending.insert(job.id, job);
            }
            Err(reason) => {
                let _ = job.sink.send(Out::Failed(format!("request rejected: {}", reason.describe())));
                self.drop_transferred(&job);
            }
        }
    }

    /// Between passes the engine tries to reserve blocks for its oldest waiting handoff; the
    /// transfer starts when it gets them.
    fn retry_destination(&mut self) {
        let Some(reserved) = self.engine.retry_destination() else { return };
        let job = self.pending.remove(&reserved.request).expect("a reserved handoff is pending");
        let delay = if self.speedup > 0.0 {
            self.cluster.transfer_delay(job.prompt.len() as u32, reserved.reused_tokens)
        } else {
            Duration::ZERO
        };
        self.transfers.push((Instant::now() + delay, job.id));
        let now = Instant::now();
        self.live.insert(job.id, Live { job, first_token: None, last_token: now });
    }

    fn land_transfers(&mut self) {
        let now = Instant::now();
        // Prefill-only server: KV that has been sent is freed.
        let mut i = 0;
        while i < self.departures.len() {
            if self.departures[i].0 > now {
                i += 1;
                continue;
            }
            let (_, id) = self.departures.swap_remove(i);
            if self.held.remove(&id) {
                self.engine.release_held(id);
            }
        }
        if self.transfers.is_empty() {
            return;
        }
        let mut i = 0;
        while i < self.transfers.len() {
            if self.transfers[i].0 > now {
                i += 1;
                continue;
            }
            let (_, id) = self.transfers.swap_remove(i);
            let Some(l) = self.live.get(&id) else { continue };
            let prefill = l.job.prefill_rank;
            if l.job.shared.cancelled.load(Ordering::SeqCst) {
                self.abort(id);
                continue;
            }
            self.engine.activate(id);
            if let Some(rank) = prefill {
                self.cluster.release(rank, id);
            }
        }
    }

    /// Publishes the rank's state to its metrics.
    fn gauges(&self) {
        let m = &self.metrics;
        m.running.set(self.engine.num_running() as f64);
        m.waiting.set(self.engine.num_waiting() as f64);
        m.kv_usage.set(self.engine.active_blocks() as f64 / self.num_blocks);
        let c = self.engine.counters();
        m.preemptions.set(c.preemptions as f64);
        m.prefix_queries.set(c.prefix_queries as f64);
        m.prefix_hits.set(c.prefix_hits as f64);
    }

    /// Hands out what a pass produced, at its end. Metrics are updated before anything reaches
    /// a client, so a client that has its answer sees it counted.
    fn release(&mut self, out: &PassOutput) {
        self.gauges();
        let now = Instant::now();
        let mut gone = Vec::new();
        for a in &out.admissions {
            if let Some(l) = self.live.get_mut(&a.request) {
                l.job.cached_tokens.get_or_insert(a.reused_tokens);
            }
        }
        let mut i = 0;
        let tokens = &out.tokens;
        while i < tokens.len() {
            let id = tokens[i].request;
            let mut j = i + 1;
            while j < tokens.len() && tokens[j].request == id {
                j += 1;
            }
            let run = &tokens[i..j];
            i = j;
            if self.role == Role::Prefill && !self.remote_decode {
                // The prefill worker's token is never shown: the decode worker generates them.
                if self.routed {
                    self.cluster.router_prefill_done(self.pool, id);
                }
                continue;
            }
            let Some(l) = self.live.get_mut(&id) else { continue };
            let n = run.len() as u64;
            match l.first_token {
                None => {
                    self.metrics.ttft.observe(now.duration_since(l.job.arrival).as_secs_f64());
                    if n > 1 {
                        self.metrics.itl.observe_n(0.0, n - 1);
                    }
                    l.first_token = Some(now);
                    if self.routed {
                        self.cluster.router_prefill_done(self.pool, id);
                    }
                }
                Some(_) => {
                    self.metrics.itl.observe_n(now.duration_since(l.last_token).as_secs_f64() / n as f64, n);
                }
            }
            l.last_token = now;
            let msg = if run.len() == 1 {
                Out::Token(run[0].token)
            } else {
                Out::Tokens(run.iter().map(|t| t.token).collect())
            };
            if l.job.sink.send(msg).is_err() {
                gone.push(id);
            }
        }
        for f in &out.finished {
            let Some(l) = self.live.remove(&f.request) else { continue };
            match f.finish {
                Finish::Completed if self.remote_decode => {
                    // The client gets the token and the handoff; the KV stays held while it
                    // would take to send it.
                    let blocks = l.job.prompt.len().div_ceil(self.block_size as usize) as u32;
                    let done = Done {
                        cached_tokens: l.job.cached_tokens.unwrap_or(0),
                        prefill_worker: Some(self.worker),
                        decode_worker: self.worker,
                        remote_blocks: Some(blocks),
                    };
                    self.metrics.e2e.observe(now.duration_since(l.job.arrival).as_secs_f64());
                    self.metrics.requests_finished.add(1.0);
                    self.held.insert(f.request);
                    let delay = if self.speedup > 0.0 {
                        self.cluster.transfer_delay(l.job.prompt.len() as u32, 0)
                    } else {
                        Duration::ZERO
                    };
                    self.departures.push((now + delay, f.request));
                    let _ = l.job.sink.send(Out::Done(done));
                }
                Finish::Completed if self.role == Role::Prefill => {
                    if l.job.shared.cancelled.load(Ordering::SeqCst) {
                        self.engine.release_held(f.request);
                    } else {
                        self.held.insert(f.request);
                        let mut job = l.job;
                        job.prefill_rank = Some(self.me);
                        job.prefill_worker = Some(self.worker);
                        self.cluster.hand_off(job);
                    }
                }
                Finish::Completed => {
                    let done = Done {
                        cached_tokens: l.job.cached_tokens.unwrap_or(0),
                        prefill_worker: l.job.prefill_worker,
                        decode_worker: self.worker,
                        remote_blocks: None,
                    };
                    self.metrics.e2e.observe(now.duration_since(l.job.arrival).as_secs_f64());
                    self.metrics.requests_finished.add(1.0);
                    let _ = l.job.sink.send(Out::Done(done));
                }
                Finish::Rejected(reason) => {
                    let _ = l.job.sink.send(Out::Failed(format!("request rejected: {}", reason.describe())));
                    if let Some(rank) = l.job.prefill_rank {
                        self.cluster.release(rank, f.request);
                    }
                }
            }
            if self.routed {
                self.cluster.router_free(self.pool, f.request);
            }
        }
        for id in gone {
            self.abort(id);
        }
        if !out.kv_events.is_empty() {
            if self.routed {
                self.cluster.router_events(self.pool, self.me, &out.kv_events);
            }
            if let Some(p) = &self.publisher {
                p.publish(&out.kv_events, &out.stored_tokens, self.block_size, self.dp_rank);
            }
        }
    }
}
