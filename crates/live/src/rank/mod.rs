//! One engine rank on the wall clock.
//!
//! Each rank runs on its own thread: it takes commands (new requests, reservations, releases,
//! aborts) between passes, runs a pass with [`Engine::step`], sleeps until the pass's modelled
//! end, and then releases what the pass produced: tokens to the requests' streams
//! ([`stream`]), KV events to the router and the ZMQ publisher, and the rank's gauges. The
//! engine's clock is the wall clock since the server started: a pass that follows another
//! starts when the previous one ends (so oversleeping never accumulates), and a pass after an
//! idle gap starts now. With speedup 0 no pass sleeps.
//!
//! A rank decides nothing about the cluster: it reports what happened through a
//! [`FrontendHandle`] (a disaggregated request's handoff facts, the router's lifecycle edges of
//! its passes, its KV events), and the frontend sends back the commands that follow.

pub mod stream;

use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustc_hash::{FxHashMap, FxHashSet};
use servesim_cluster::{Edge, Fact, Flight, PassEdges, TransferTiming};
use servesim_engine::{Engine, EngineConfig, EngineOptions, Finish, KvEvent, PassOutput, Role};

use crate::metrics::RankMetrics;
use stream::{Done, RequestState, Sink};

/// What the live server keeps beside a request in flight: its client and where it is.
#[derive(Debug)]
pub struct Client {
    pub sink: Sink,
    pub arrival: Instant,
    pub state: Arc<RequestState>,
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
pub type LiveFlight = Flight<Client>;

/// What a rank is told to do, between its passes.
pub enum Command {
    Submit(Box<LiveFlight>),
    /// Decode rank: a prompt computed (or being computed) elsewhere; it waits for KV blocks.
    Accept(Box<LiveFlight>),
    /// Decode rank: the KV of a request whose blocks this rank reserved lands after the delay.
    Transfer(Box<LiveFlight>, Duration),
    /// Prefill rank: the decode side has the KV of this request.
    Release(u64),
    Abort(u64),
    Shutdown,
}

/// What a rank reports to the frontend, which decides what follows.
pub trait FrontendHandle: Send + Sync {
    /// `fact` happened to `flight`'s handoff; the frontend carries out the steps it leads to.
    /// Returns the request unless a step moved it on: a decode rank that reported the transfer
    /// landing (or the activation) keeps it; other callers let it go.
    fn handoff(&self, flight: Box<LiveFlight>, fact: Fact) -> Option<Box<LiveFlight>>;
    /// A router lifecycle edge of a request in pool `pool`.
    fn router_edge(&self, pool: usize, edge: Edge);
    /// KV events of global rank `rank` of pool `pool`, for its router.
    fn kv_events(&self, pool: usize, rank: usize, events: &[KvEvent]);
}

pub struct RankSetup {
    pub rx: Receiver<Command>,
    /// Global rank index, and the pool the rank belongs to.
    pub me: usize,
    pub pool: usize,
    /// When the server started: the engine's clock counts from here.
    pub origin: Instant,
    pub engine: EngineConfig,
    pub role: Role,
    /// Prefill rank of a prefill-only server: its token goes to the client, its KV to a
    /// decode worker elsewhere.
    pub remote_decode: bool,
    /// How handed-off KV is timed (a prefill-only server holds a finished prompt's KV as long
    /// as sending it would take).
    pub transfer: Option<TransferTiming>,
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
struct Resident {
    flight: Box<LiveFlight>,
    /// When a pass first scheduled it (the start of the pass that admitted it).
    scheduled: Option<Instant>,
    first_token: Option<Instant>,
    last_token: Instant,
}

impl Resident {
    fn new(flight: Box<LiveFlight>, now: Instant) -> Self {
        Resident { flight, scheduled: None, first_token: None, last_token: now }
    }
}

struct Rank {
    frontend: Arc<dyn FrontendHandle>,
    origin: Instant,
    /// Global rank index.
    me: usize,
    pool: usize,
    role: Role,
    worker: u32,
    dp_rank: u32,
    engine: Engine,
    resident: FxHashMap<u64, Resident>,
    /// Prefill rank: finished requests whose KV waits for the decode side.
    held: FxHashSet<u64>,
    /// Decode rank: accepted handoffs waiting for KV blocks, by id.
    pending: FxHashMap<u64, Box<LiveFlight>>,
    /// Decode rank: reserved requests whose KV lands at the given instant.
    transfers: Vec<(Instant, u64)>,
    /// Prefill-only server: held requests whose KV has left at the given instant.
    departures: Vec<(Instant, u64)>,
    /// Prefill rank of a prefill-only server: its token goes to the client, its KV to a
    /// decode worker elsewhere.
    remote_decode: bool,
    transfer: Option<TransferTiming>,
    metrics: Arc<RankMetrics>,
    publisher: Option<crate::zmq::Publisher>,
    routed: bool,
    speedup: f64,
    num_blocks: f64,
    block_size: u32,
    out: PassOutput,
    /// Modelled end of the last pass, in ms since the server started.
    last_end: f64,
    shutdown: bool,
}

pub fn run(frontend: Arc<dyn FrontendHandle>, s: RankSetup) {
    let record = s.routed || s.publisher.is_some();
    let mut engine = Engine::new(
        s.engine.clone(),
        EngineOptions { record_kv_events: record, engine_index: s.engine_index, timing_jitter: None },
    );
    engine.set_output_vocabulary(Some(s.vocabulary.clone()));
    engine.set_record_block_tokens(s.publisher.is_some());
    let mut rank = Rank {
        frontend,
        origin: s.origin,
        me: s.me,
        pool: s.pool,
        role: s.role,
        worker: s.worker,
        dp_rank: s.dp_rank,
        engine,
        resident: FxHashMap::default(),
        held: FxHashSet::default(),
        pending: FxHashMap::default(),
        transfers: Vec::new(),
        departures: Vec::new(),
        remote_decode: s.remote_decode,
        transfer: s.transfer,
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
    rank.run(s.rx);
}

impl Rank {
    fn now_ms(&self) -> f64 {
        self.origin.elapsed().as_secs_f64() * 1000.0
    }

    /// Wall time a prefill-only server holds a finished prompt's KV (what sending it to a
    /// remote decode server would take at this server's bandwidth).
    fn hold_for_remote(&self, prompt_len: u32) -> Duration {
        match self.transfer {
            Some(t) if self.speedup > 0.0 => crate::wall_duration(t.delay_ms(prompt_len, 0) / 1000.0),
            _ => Duration::ZERO,
        }
    }

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
            // As at every pass end, a waiting destination gets one attempt; a reservation is
            // progress, so even an empty pass is followed by another.
            let reserved = self.retry_destination();
            if !self.engine.has_work() {
                // Aborts and releases change the state without a pass.
                self.gauges();
                busy = false;
                continue;
            }
            let wall = self.now_ms();
            let start = if busy || self.speedup <= 0.0 { self.last_end } else { self.last_end.max(wall) };
            let mut out = std::mem::take(&mut self.out);
            self.engine.step(start, &mut out);
            if self.speedup > 0.0 {
                let deadline = self.origin + crate::wall_duration(out.end_ms / 1000.0);
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
            // A round of SGLang's prefill/decode interval counts down even when it does nothing:
            // the next one follows at once (its work may be waiting behind it).
            busy = reserved || !out.is_empty() || out.end_ms > out.start_ms || self.engine.deferred_in_pass();
            self.release(&out);
            self.out = out;
        }
    }

    fn command(&mut self, c: Command) {
        match c {
            Command::Submit(flight) => self.submit(flight),
            Command::Accept(flight) => {
                if flight.extra.state.cancelled.load(Ordering::SeqCst) {
                    self.frontend.handoff(flight, Fact::Aborted);
                } else {
                    self.accept(flight);
                }
            }
            Command::Transfer(flight, delay) => {
                self.transfers.push((Instant::now() + delay, flight.id));
                let now = Instant::now();
                self.resident.insert(flight.id, Resident::new(flight, now));
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

    fn submit(&mut self, flight: Box<LiveFlight>) {
        if flight.extra.state.cancelled.load(Ordering::SeqCst) {
            if self.routed {
                self.frontend.router_edge(self.pool, Edge::Free(flight.id));
            }
            if flight.handoff.is_some() {
                self.frontend.handoff(flight, Fact::Aborted);
            }
            return;
        }
        self.engine.submit(flight.engine_request(self.role));
        let now = Instant::now();
        self.resident.insert(flight.id, Resident::new(flight, now));
    }

    fn abort(&mut self, id: u64) {
        let found = self.engine.abort(id);
        if found && self.routed {
            self.frontend.router_edge(self.pool, Edge::Free(id));
        }
        self.held.remove(&id);
        self.transfers.retain(|t| t.1 != id);
        self.departures.retain(|t| t.1 != id);
        let flight = self.pending.remove(&id).or_else(|| self.resident.remove(&id).map(|r| r.flight));
        // A disaggregated request may hold KV on the other side too: its handoff says what to
        // undo there.
        if let Some(flight) = flight.filter(|f| f.handoff.is_some()) {
            self.frontend.handoff(flight, Fact::Aborted);
        }
    }

    /// A handoff for this decode rank: it waits in the engine for its blocks.
    fn accept(&mut self, flight: Box<LiveFlight>) {
        match self.engine.accept_destination(flight.engine_request(Role::Decode)) {
            Ok(()) => {
                self.pending.insert(flight.id, flight);
            }
            Err(reason) => {
                self.frontend.handoff(flight, Fact::DestinationRefused(reason));
            }
        }
    }

    /// Between passes the engine tries to reserve blocks for its oldest waiting handoff; the
    /// handoff goes on when it gets them (the transfer starts, or, SGLang, the prefill).
    fn retry_destination(&mut self) -> bool {
        let Some(reserved) = self.engine.retry_destination() else { return false };
        let flight = self.pending.remove(&reserved.request).expect("a reserved handoff is pending");
        self.frontend.handoff(flight, Fact::DestinationReserved { reused_tokens: reserved.reused_tokens });
        true
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
            let Some(r) = self.resident.get(&id) else { continue };
            if r.flight.extra.state.cancelled.load(Ordering::SeqCst) {
                self.abort(id);
                continue;
            }
            let mut r = self.resident.remove(&id).expect("resident");
            let flight = self.frontend.handoff(r.flight, Fact::TransferLanded).expect("a landed transfer stays");
            self.engine.activate(id);
            r.flight = self.frontend.handoff(flight, Fact::Activated).expect("an activated request stays");
            self.resident.insert(id, r);
            let _ = self.retry_destination();
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

    /// The phase histograms of a request that finished: vLLM's queue (arrival to first
    /// scheduled), prefill (to first token), decode (first to last token) and inference
    /// (first scheduled to last token) times.
    fn observe_phases(&self, l: &Resident) {
        let (Some(scheduled), Some(first)) = (l.scheduled, l.first_token) else { return };
        let secs = |later: Instant, earlier: Instant| later.saturating_duration_since(earlier).as_secs_f64();
        let m = &self.metrics;
        m.queue_time.observe(secs(scheduled, l.flight.extra.arrival));
        m.prefill_time.observe(secs(first, scheduled));
        m.decode_time.observe(secs(l.last_token, first));
        m.inference_time.observe(secs(l.last_token, scheduled));
    }

    /// Hands out what a pass produced, at its end. Metrics are updated before anything reaches
    /// a client, so a client that has its answer sees it counted.
    fn release(&mut self, out: &PassOutput) {
        self.gauges();
        let now = Instant::now();
        let mut gone = Vec::new();
        let pass_start = self.origin + crate::wall_duration(out.start_ms / 1000.0);
        for a in &out.admissions {
            if let Some(l) = self.resident.get_mut(&a.request) {
                l.flight.extra.cached_tokens.get_or_insert(a.reused_tokens);
                l.scheduled.get_or_insert(pass_start.min(now));
            }
        }
        // The router's lifecycle edges, by the rule both drivers share.
        let edges = PassEdges::of(self.role, self.routed, out);
        let mut i = 0;
        let tokens = &out.tokens;
        while i < tokens.len() {
            let id = tokens[i].request;
            let mut j = i + 1;
            while j < tokens.len() && tokens[j].request == id {
                j += 1;
            }
            let run = &tokens[i..j];
            let first = self.resident.get(&id).is_some_and(|l| l.first_token.is_none());
            for k in i..j {
                if let Some(edge) = edges.at_token(k, id, || k == i && first) {
                    self.frontend.router_edge(self.pool, edge);
                }
            }
            i = j;
            if self.role == Role::Prefill && !self.remote_decode {
                // The prefill worker's token is never shown: the decode worker generates them.
                continue;
            }
            let Some(l) = self.resident.get_mut(&id) else { continue };
            let n = run.len() as u64;
            match l.first_token {
                None => {
                    self.metrics.ttft.observe(now.duration_since(l.flight.extra.arrival).as_secs_f64());
                    if n > 1 {
                        self.metrics.itl.observe_n(0.0, n - 1);
                    }
                    l.first_token = Some(now);
                }
                Some(_) => {
                    self.metrics.itl.observe_n(now.duration_since(l.last_token).as_secs_f64() / n as f64, n);
                }
            }
            l.last_token = now;
            if l.flight.extra.sink.tokens(run.iter().map(|t| t.token)).is_err() {
                gone.push(id);
            }
        }
        for f in &out.finished {
            let Some(mut l) = self.resident.remove(&f.request) else { continue };
            match f.finish {
                Finish::Completed if self.remote_decode => {
                    // The client gets the token and the handoff; the KV stays held while it
                    // would take to send it.
                    let blocks = l.flight.prompt.len().div_ceil(self.block_size);
                    let done = Done {
                        cached_tokens: l.flight.extra.cached_tokens.unwrap_or(0),
                        prefill_worker: Some(self.worker),
                        decode_worker: self.worker,
                        remote_blocks: Some(blocks),
                    };
                    self.metrics.e2e.observe(now.duration_since(l.flight.extra.arrival).as_secs_f64());
                    self.observe_phases(&l);
                    self.metrics.requests_finished.add(1.0);
                    self.held.insert(f.request);
                    self.departures.push((now + self.hold_for_remote(l.flight.prompt.len()), f.request));
                    l.flight.extra.sink.done(done);
                }
                Finish::Completed if self.role == Role::Prefill => {
                    // The prompt's KV stays here until the decode side has it (or, if the client
                    // left, until the handoff releases it).
                    self.held.insert(f.request);
                    let cancelled = l.flight.extra.state.cancelled.load(Ordering::SeqCst);
                    let fact = if cancelled { Fact::SourceHeldAfterAbort } else { Fact::SourceHeld };
                    self.frontend.handoff(l.flight, fact);
                }
                Finish::Completed => {
                    let done = Done {
                        cached_tokens: l.flight.extra.cached_tokens.unwrap_or(0),
                        prefill_worker: l.flight.extra.prefill_worker,
                        decode_worker: self.worker,
                        remote_blocks: None,
                    };
                    self.metrics.e2e.observe(now.duration_since(l.flight.extra.arrival).as_secs_f64());
                    self.observe_phases(&l);
                    self.metrics.requests_finished.add(1.0);
                    l.flight.extra.sink.done(done);
                }
                Finish::Rejected(reason) if self.role == Role::Prefill && l.flight.handoff.is_some() => {
                    // Refused before the handoff: the decode side may have reserved pages.
                    self.frontend.handoff(l.flight, Fact::SourceRefused(reason));
                }
                Finish::Rejected(reason) => {
                    l.flight.extra.sink.fail(reason);
                }
            }
            if let Some(edge) = edges.at_finish(f) {
                self.frontend.router_edge(self.pool, edge);
            }
        }
        for id in gone {
            self.abort(id);
        }
        if !out.kv_events.is_empty() {
            if self.routed {
                self.frontend.kv_events(self.pool, self.me, &out.kv_events);
            }
            if let Some(p) = &self.publisher {
                p.publish(&out.kv_events, &out.stored_tokens, self.block_size, self.dp_rank);
            }
        }
    }
}
