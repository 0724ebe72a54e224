//! The discrete-event loop: a virtual clock, the cluster's workers, and the load driver
//! releasing requests.
//!
//! At each instant the loop (1) applies what happens now — passes that end, KV transfers that
//! land, KV events the router gets to see — (2) releases the requests that become ready now and
//! places them on workers, and (3) starts a pass on every idle worker that has work. A pass's
//! results (tokens, completions, KV events) become visible at its end time; completions can make
//! the next turn of a session ready (disaggregated, only after step 3, as in Dynamo: a turn
//! ready at once is released at the same instant, but misses the passes started in it).
//! Disaggregated, a request released at an instant is placed on a prefill worker only after
//! step 3 and the autoscaler's tick at that instant, as Dynamo runs a new request's hand-off
//! actions in its next round: it misses the passes started then, and a worker drained by the
//! tick gets none of the requests arriving with it.
//!
//! Placement, the disaggregated handoff and the cluster's shape belong to `servesim-cluster`;
//! this loop owns time: it runs engine passes, schedules transfers, and applies commands to a
//! worker between its passes (a command for a busy worker waits for its pass to end).

mod handoff;
mod pace;
mod scaling;
mod stretch;
mod telemetry;

pub use pace::{Pacer, WallClock};
pub use scaling::{Autoscaler, LifecycleOp, ScaleDecision, Transition};

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};
use std::ops::Bound::{Excluded, Unbounded};

use rustc_hash::FxHashMap;
use servesim_cluster::{
    Edge, Fact, Flight, Handoff, PassEdges, Placer, PoolSpec, RouterMode, Step, Topology, TransferTiming, WorkerState,
    Workers,
};
use servesim_engine::offload::{SharedG3Pool, SharedHostPool};
use servesim_engine::{
    Engine, EngineOptions, Finish, HostKvEvent, KvEvent, PassOutput, RejectReason, Reserved, Role, Stretch,
    TimingJitter,
};
use servesim_router::{Placement, PrefillLoadEstimator, Routed};

use crate::metrics::{Collector, Overflow, Sla};
use crate::report::Report;
use crate::split;
use servesim_workload::time::Time;
use servesim_workload::{LoadDriver, LoadMode, Ready, Workload, MAX_TIME_MS};

/// Everything that defines one simulated run besides the workload.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub topology: Topology,
    pub router: RouterMode,
    /// What `router_prefill_load_model: ais` predicts prompts' prefill times with (Dynamo's
    /// `ais_perf_config`, kept apart from the workers' timing models).
    pub prefill_load_estimator: Option<std::sync::Arc<dyn PrefillLoadEstimator>>,
    /// Seed of the router's random choices (ties, softmax sampling).
    pub router_seed: u64,
    /// Delay before the router sees the KV events of a pass.
    pub kv_event_lag_ms: f64,
    pub load: LoadMode,
    pub sla: Sla,
    /// Seed of generated token ids.
    pub seed: u64,
    /// Run decode-only stretches in one step when nothing can change during them (the results
    /// are identical; off only to check that).
    pub fast_forward: bool,
    /// Replay each worker of a round-robin cluster on its own when nothing couples them (see
    /// [`crate::split`]); the per-request results are identical, pooled means may differ in
    /// the last bits. Off only to check that.
    pub split_workers: bool,
    /// Threads for split runs; 0 uses every core.
    pub threads: usize,
    /// Per-pass timing jitter as a coefficient of variation (0: off, every pass lasts what the
    /// timing model says). Each engine draws its factors from a stream derived from `seed`, its
    /// pool and its index. Front ends check the value with
    /// [`servesim_engine::TimingJitter::new`]; one it refuses counts as 0 here.
    pub timing_jitter_cv: f64,
}

impl SimConfig {
    /// `topology` under `router` and `load`, with the defaults of `servesim predict`: no
    /// prefill load estimator, seeds 42, KV events seen at once, no SLA, fast-forward and split
    /// runs on every core.
    pub fn new(topology: Topology, router: RouterMode, load: LoadMode) -> SimConfig {
        SimConfig {
            topology,
            router,
            prefill_load_estimator: None,
            router_seed: 42,
            kv_event_lag_ms: 0.0,
            load,
            sla: Sla::default(),
            seed: 42,
            fast_forward: true,
            split_workers: true,
            threads: 0,
            timing_jitter_cv: 0.0,
        }
    }
}

/// Progress notifications for a caller that wants to show them.
pub trait Progress {
    /// Called now and then with the number of finished requests and the total.
    fn update(&mut self, finished: u64, total: u64);

    /// Asked now and then during the run; `true` stops it with [`SimError::Cancelled`] (a
    /// caller such as the Python binding polls for Ctrl-C here).
    fn cancelled(&mut self) -> bool {
        false
    }
}

impl Progress for () {
    fn update(&mut self, _: u64, _: u64) {}
}

#[derive(Debug)]
pub enum SimError {
    /// A worker with pending requests did nothing in a pass (an engine invariant broke).
    Stalled { worker: u32, at_ms: f64 },
    /// The timing model could not time a pass.
    Timing { worker: u32, at_ms: f64, why: String },
    /// Disaggregated workers wait on each other's KV and nothing else can happen.
    Deadlock { at_ms: f64, in_flight: usize },
    /// The router's prefill load model could not time a prompt.
    Router { at_ms: f64, why: String },
    /// The caller's [`Progress::cancelled`] asked the run to stop.
    Cancelled { at_ms: f64 },
    /// More requests waited for admission than the queue limit allows (`Overflow::Fail`).
    QueueFull { at_ms: f64, max: u64 },
    /// Without a queue maximum, an arrival found [`crate::QueueLimit::runaway`] requests
    /// waiting for admission.
    QueueRunaway { at_ms: f64, queued: u64, warn_at: u64 },
    /// The clock would pass [`MAX_TIME_MS`], beyond which times lose
    /// sub-microsecond precision (or are not finite).
    TimeRange { at_ms: f64 },
    /// The autoscaler failed (the reference's own predictor stopped answering, say).
    Planner { at_ms: f64, why: String },
    /// A request no pass can ever schedule: its prompt is over the per-pass token budget and
    /// chunked prefill is off. Dynamo's replay stops such a run ("effect-free zero-duration
    /// pass"), so servesim does too rather than report it as rejected.
    Unschedulable { at_ms: f64, request: u64 },
}

impl std::fmt::Display for SimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SimError::Stalled { worker, at_ms } => {
                write!(f, "internal error: worker {worker} stopped making progress at t={at_ms} ms")
            }
            SimError::Timing { worker, at_ms, why } => write!(f, "worker {worker} at t={at_ms} ms: {why}"),
            SimError::Router { at_ms, why } => write!(f, "router at t={at_ms} ms: {why}"),
            SimError::Planner { at_ms, why } => write!(f, "planner at t={at_ms} ms: {why}"),
            SimError::Cancelled { at_ms } => write!(f, "replay cancelled at t={at_ms} ms"),
            SimError::QueueFull { at_ms, max } => write!(
                f,
                "overloaded: at t={at_ms} ms a request arrived while {max} requests already waited for admission \
                 (--max-queued {max}); the workers cannot keep up with this load (lower the rate, add workers, \
                 or use --max-queued-policy shed to drop such arrivals)"
            ),
            SimError::QueueRunaway { at_ms, queued, warn_at } => write!(
                f,
                "overloaded: at t={at_ms} ms {queued} requests waited for admission, far past the warning \
                 threshold (--queue-warning {warn_at}: 100 times it, or what a quarter of the memory holds); the workers cannot keep up with this load and memory grows \
                 with the queue, so the run stops (lower the rate or add workers; to let the queue grow, give \
                 --max-queued N, with --max-queued-policy shed to drop arrivals past it)"
            ),
            SimError::TimeRange { at_ms } => write!(
                f,
                "the run's clock would reach t={at_ms} ms, past {} ms (about 278 years), beyond which simulated \
                 times lose sub-microsecond precision: arrival times or delays are too far apart for this run \
                 (compress them with a larger arrival speedup ratio)",
                MAX_TIME_MS
            ),
            SimError::Unschedulable { at_ms, request } => write!(
                f,
                "request {request} at t={at_ms} ms: its prompt exceeds max_num_batched_tokens with chunked prefill \
                 off, so no forward pass can schedule it (Dynamo 1.6.1 stops such a run as well): enable chunked \
                 prefill or raise max_num_batched_tokens"
            ),
            SimError::Deadlock { at_ms, in_flight } => write!(
                f,
                "the disaggregated cluster deadlocked at t={at_ms} ms with {in_flight} requests in flight: the \
                 requests holding KV wait for KV that others hold (give the prefill or decode pool more \
                 num_gpu_blocks)"
            ),
        }
    }
}

impl std::error::Error for SimError {}

/// Runs `workload` to completion and returns the report.
pub fn simulate(
    workload: &Workload,
    config: &SimConfig,
    collector: Collector<'_>,
    progress: &mut dyn Progress,
) -> Result<Report, SimError> {
    simulate_with(workload, config, collector, progress, RunOptions::default())
}

/// What a run may do besides replaying its workload to the end.
#[derive(Default)]
pub struct RunOptions<'h> {
    /// Adds and drains workers at its tick times. An autoscaled run is replayed pass by pass
    /// (no fast-forward, no split): the autoscaler must see every pass.
    pub autoscaler: Option<&'h mut dyn Autoscaler>,
    /// Stop the virtual clock here (aisimulate's `max_virtual_time_seconds`): later arrivals
    /// never come, requests in flight are reported incomplete.
    pub stop_at_ms: Option<f64>,
    /// Paces the run (online replay): whenever the virtual clock moves forward, the loop waits
    /// as long as the pacer says, asking [`Progress::cancelled`] while it waits. The results
    /// are those of the unpaced run.
    pub pacer: Option<&'h dyn Pacer>,
}

/// [`simulate`] with [`RunOptions`].
pub fn simulate_with(
    workload: &Workload,
    config: &SimConfig,
    mut collector: Collector<'_>,
    progress: &mut dyn Progress,
    options: RunOptions<'_>,
) -> Result<Report, SimError> {
    if options.autoscaler.is_some() || options.stop_at_ms.is_some() {
        let config = SimConfig { fast_forward: false, split_workers: false, ..config.clone() };
        let mut sim = Simulation::new(workload, &config, collector, None);
        let scaled = options.autoscaler.is_some();
        if let Some(hook) = options.autoscaler {
            sim.scaling = Some(scaling::Scaling::new(hook, sim.pools.len()));
        }
        sim.stop_at_ms = options.stop_at_ms;
        sim.pacer = options.pacer;
        if options.stop_at_ms.is_some() {
            sim.collector.defer_token_gaps();
        }
        sim.run(progress)?;
        let mut report = Report::build(&config, &sim.collector, sim.now);
        if scaled {
            report.worker_seconds = Some(sim.worker_seconds());
        }
        return Ok(report);
    }
    if split::applies(workload, config, &collector) {
        let end_ms = split::simulate(workload, config, &mut collector, progress, options.pacer)?;
        return Ok(Report::build(config, &collector, end_ms));
    }
    let mut sim = Simulation::new(workload, config, collector, None);
    sim.pacer = options.pacer;
    sim.run(progress)?;
    Ok(Report::build(config, &sim.collector, sim.now))
}

/// Replays only the requests that round-robin places on the workers of one shard; the others
/// are released (so that ordinals and placement stay those of the whole run) and skipped.
/// Returns what the shard collected and when its last event happened.
pub(crate) fn simulate_shard<'c>(
    workload: &Workload,
    config: &SimConfig,
    shard: Shard,
    collector: Collector<'c>,
    progress: &mut dyn Progress,
    pacer: Option<&dyn Pacer>,
) -> Result<(Collector<'c>, f64), SimError> {
    let mut sim = Simulation::new(workload, config, collector, Some(shard));
    sim.pacer = pacer;
    sim.run(progress)?;
    Ok((sim.collector, sim.now))
}

/// Whether new work reaches workers only when the load driver releases it: timestamps decide
/// every release (no closed-loop turns), there are no handoffs and no router queue.
pub(crate) fn work_only_at_releases(workload: &Workload, config: &SimConfig) -> bool {
    matches!(config.load, LoadMode::Timestamps { .. })
        && !config.topology.is_disaggregated()
        && workload.single_turn()
        && !matches!(&config.router, RouterMode::KvRouter(rc) if rc.may_queue())
}

/// Workers `w` with `w % count == index`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shard {
    pub index: usize,
    pub count: usize,
}

/// One attention data-parallel rank: an engine with its own scheduler and KV pool.
struct Rank {
    engine: Engine,
    output: PassOutput,
    /// Whether it ran in the worker's current pass.
    ran: bool,
    /// What waited when the current pass was scheduled (kept for an autoscaler).
    queue: servesim_engine::QueueLoad,
    /// The engine's gauges just before the current pass was scheduled, and its requests just
    /// after (Dynamo-shaped telemetry only: a pass's admissions show once it ends).
    before_pass: Option<(telemetry::Gauges, usize)>,
}

/// A worker: `dp_size` ranks that run passes together (the pass ends at the slowest rank).
struct Worker {
    ranks: Vec<Rank>,
    busy: bool,
    /// Start and end of the pass in flight.
    pass_start: f64,
    pass_end: f64,
    /// The pass in flight is a fast-forwarded stretch of decode passes.
    stretch: Option<Stretch>,
    /// The stretch's passes are not yet committed to the engine (see
    /// [`Simulation::settle_stretch`]).
    stretch_pending: bool,
    /// Sequence number of the `PassEnd` event of the pass in flight: a stretch cut short leaves
    /// its first `PassEnd` in the heap, which is then stale and skipped.
    pass_seq: u64,
    /// Commands that wait for the pass in flight to end: held requests to release (prefill
    /// worker), transferred requests to activate (decode worker).
    /// Releases by (request, rank); activations by (request, decode target).
    pending_releases: Vec<(u64, usize)>,
    pending_activations: Vec<(u64, usize)>,
    /// The host-transfer wakeup scheduled for this idle worker, if any.
    host_wake_at: Option<f64>,
    /// G3 completions of the pool that this worker has seen.
    g3_seen: u64,
    /// The pass in flight reaches its transfer boundary at its end (a shared host or G3 pool;
    /// see [`Simulation::settle_boundary`]).
    boundary_pending: bool,
    /// The number of the worker's next pass, from 0 again once every rank is drained (the
    /// ranks' prefill cadence counts it; see [`Engine::begin_group_pass`]).
    wave_step: u64,
}

impl Worker {
    /// The wave restarts when no rank has anything left.
    fn reset_wave_if_drained(&mut self) {
        if !self.busy && self.ranks.iter().all(|r| r.engine.is_drained()) {
            self.wave_step = 0;
        }
    }
}

struct Pool {
    spec: PoolSpec,
    workers: Vec<Worker>,
    placer: Placer,
    /// Which workers start, serve, drain or have stopped (all serve without an autoscaler).
    lifecycle: Workers,
    /// Workers with G3 tiers that see each other's completions (see [`Simulation::g3_observe`]).
    g3_coupled: bool,
    /// The host pool every rank of the pool shares (`cluster_shared`), if any.
    shared_host: Option<SharedHostPool>,
    /// The G3 pool every worker of the pool shares (`cluster_shared`), if any.
    shared_g3: Option<SharedG3Pool>,
}

/// Something scheduled for a later instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    PassEnd {
        pool: u8,
        worker: u32,
    },
    TransferDone {
        request: u64,
    },
    KvVisible {
        batch: u64,
    },
    /// A worker the autoscaler added has started.
    WorkerReady {
        pool: u8,
        worker: u32,
    },
    /// A host (G2) KV transfer of an idle worker completes.
    /// A G3 transfer of some worker of the pool completes: idle workers see it.
    G3Tick {
        pool: u8,
    },
    HostWake {
        pool: u8,
        worker: u32,
    },
}

/// What replay keeps beside a request in flight: the session it belongs to.
type ReplayFlight = Flight<u32>;

struct Simulation<'a, 'c> {
    workload: &'a Workload,
    config: &'a SimConfig,
    driver: LoadDriver<'a>,
    pools: Vec<Pool>,
    /// Disaggregated: the prefill pool's KV transfer timing.
    transfer: Option<TransferTiming>,
    events: BinaryHeap<Reverse<(Time, u64, Event)>>,
    seq: u64,
    now: f64,
    flights: FxHashMap<u64, ReplayFlight>,
    /// KV events waiting out the router's lag: batch id -> (pool, target, device events, host
    /// residency events).
    lagged: FxHashMap<u64, (usize, usize, Vec<KvEvent>, Vec<HostKvEvent>)>,
    collector: Collector<'c>,
    finished: u64,
    /// New work reaches workers only when the load driver releases it (no closed-loop turns,
    /// no router queue, no handoffs): a worker can run ahead until the next release.
    work_only_at_releases: bool,
    spare_stretch: Stretch,
    /// The instant of the last start of passes (see [`Simulation::settle_stretch`]).
    passes_started_ms: f64,
    shard: Option<Shard>,
    /// Workers that may start a pass: (pool, worker). Only they are visited at an instant, so
    /// idle workers cost nothing.
    awake: BTreeSet<(usize, usize)>,
    /// The `G3Tick` events scheduled, by pool.
    g3_ticks: BTreeSet<(usize, Time)>,
    /// Disaggregated: the sessions of requests that ended at this instant (and whether they
    /// completed), told to the load driver after the workers idle now have started their
    /// passes (see [`Simulation::tell_ended_sessions`]).
    ended: Vec<(u32, bool)>,
    /// Disaggregated: requests released at this instant whose first hand-off step (placing
    /// them on a prefill worker) waits until the workers idle now have started their passes
    /// and the autoscaler's tick due now has run (see [`Simulation::release`]).
    unplaced: Vec<(u64, Step)>,
    /// The autoscaler's side of the run, if one acts on it.
    scaling: Option<scaling::Scaling<'a>>,
    /// The virtual-time stop, if any.
    stop_at_ms: Option<f64>,
    /// Paces the run on the wall clock, if any.
    pacer: Option<&'a dyn Pacer>,
    /// A request the router refused (its policy class's queue was full): the run stops with
    /// this, as Dynamo's replay does.
    rejected: Option<String>,
    /// The first request no pass could schedule (see [`SimError::Unschedulable`]).
    unschedulable: Option<u64>,
}

impl<'a, 'c> Simulation<'a, 'c> {
    fn new(workload: &'a Workload, config: &'a SimConfig, mut collector: Collector<'c>, shard: Option<Shard>) -> Self {
        collector.expect_requests(workload.num_requests());
        // One cluster-shared host pool for the whole deployment: a disaggregated one's prefill
        // and decode workers join the same pool (the topology checked that they agree on it).
        let mut deployment_host = None;
        let pools = config
            .topology
            .pools()
            .iter()
            .enumerate()
            .map(|(p, spec)| {
                let placer = Placer::new(spec, &config.router, config.router_seed)
                    .with_prefill_load_estimator(config.prefill_load_estimator.clone());
                let record_kv_events = placer.is_kv();
                let dp = spec.deployment.dp_size;
                let rank_engine = spec.rank_engine();
                // A shard's run builds engines for its own workers only: the others never get
                // a request.
                let served = |w: u32| shard.is_none_or(|s| w as usize % s.count == s.index);
                let jitter = pool_jitter(config, p);
                let shared = SharedPools::of(&rank_engine, &mut deployment_host);
                let workers = (0..spec.workers)
                    .map(|w| {
                        let ranks = if served(w) { dp } else { 0 };
                        new_worker(&rank_engine, w, ranks, record_kv_events, jitter, &shared)
                    })
                    .collect();
                Pool {
                    spec: spec.clone(),
                    workers,
                    placer,
                    lifecycle: Workers::new(spec.workers as usize),
                    g3_coupled: spec.engine.g3_offload.is_some(),
                    shared_host: shared.host,
                    shared_g3: shared.g3,
                }
            })
            .collect();
        let transfer = config.topology.transfer_timing();
        Simulation {
            workload,
            config,
            driver: LoadDriver::new(workload, config.load),
            pools,
            transfer,
            events: BinaryHeap::new(),
            seq: 0,
            now: 0.0,
            flights: FxHashMap::default(),
            lagged: FxHashMap::default(),
            collector,
            finished: 0,
            work_only_at_releases: work_only_at_releases(workload, config),
            spare_stretch: Stretch::default(),
            passes_started_ms: f64::NEG_INFINITY,
            shard,
            awake: BTreeSet::new(),
            g3_ticks: BTreeSet::new(),
            ended: Vec::new(),
            unplaced: Vec::new(),
            scaling: None,
            stop_at_ms: None,
            pacer: None,
            rejected: None,
            unschedulable: None,
        }
    }

    /// A new worker in pool `p` (starting; not yet in the placer's active set). Returns its
    /// index.
    fn add_worker(&mut self, p: usize) -> usize {
        let pool = &mut self.pools[p];
        let w = pool.placer.add_worker();
        let index = pool.lifecycle.add(self.now);
        debug_assert_eq!((w, index), (pool.workers.len(), pool.workers.len()));
        let jitter = pool_jitter(self.config, p);
        let worker = new_worker(
            &pool.spec.rank_engine(),
            w as u32,
            pool.spec.deployment.dp_size,
            pool.placer.is_kv(),
            jitter,
            &SharedPools { host: pool.shared_host.clone(), g3: pool.shared_g3.clone() },
        );
        pool.workers.push(worker);
        w
    }

    /// Something reached worker `w` of `pool` (a request, a command, the end of its pass): it
    /// is visited at the next start of passes.
    fn wake(&mut self, pool: usize, w: usize) {
        self.awake.insert((pool, w));
    }

    fn schedule(&mut self, at: f64, event: Event) {
        self.events.push(Reverse((Time(at), self.seq, event)));
        self.seq += 1;
    }

    /// Schedules the end of worker `w`'s pass in flight (the one `PassEnd` of it that counts).
    fn schedule_pass_end(&mut self, pool: usize, w: usize, at: f64) {
        self.pools[pool].workers[w].pass_seq = self.seq;
        self.schedule(at, Event::PassEnd { pool: pool as u8, worker: w as u32 });
    }

    /// Whether a scheduled event no longer counts (the `PassEnd` of a stretch cut short).
    fn is_stale(&self, seq: u64, event: Event) -> bool {
        match event {
            Event::PassEnd { pool, worker } => self.pools[pool as usize].workers[worker as usize].pass_seq != seq,
            _ => false,
        }
    }

    /// The time of the next event that counts, dropping stale ones on the way.
    fn next_event_ms(&mut self) -> Option<f64> {
        while let Some(&Reverse((Time(t), seq, event))) = self.events.peek() {
            if !self.is_stale(seq, event) {
                return Some(t);
            }
            self.events.pop();
        }
        None
    }

    fn run(&mut self, progress: &mut dyn Progress) -> Result<(), SimError> {
        let total = self.workload.num_requests();
        let mut ready = Vec::new();
        let mut again = false;
        let mut last_reported = u64::MAX;
        let mut iterations: u32 = 0;
        loop {
            iterations = iterations.wrapping_add(1);
            if iterations.is_multiple_of(4096) && progress.cancelled() {
                return Err(SimError::Cancelled { at_ms: self.now });
            }
            if !again {
                let last = self.now;
                let next_event = self.next_event_ms();
                self.now = match (next_event, self.driver.next_ready_ms()) {
                    (None, None) => break,
                    (Some(a), Some(b)) => a.min(b),
                    (Some(a), None) | (None, Some(a)) => a,
                };
                // Autoscaler ticks come while the run has work left.
                if let Some(t) = self.scaling.as_ref().and_then(|s| s.next_tick_ms) {
                    self.now = self.now.min(t);
                }
                if self.now.is_nan() || self.now > MAX_TIME_MS {
                    return Err(SimError::TimeRange { at_ms: self.now });
                }
                if self.stop_at_ms.is_some_and(|stop| self.now > stop) {
                    // Nothing happens after the cutoff: the run ends at its last instant
                    // before it (the reference's duration does too).
                    self.now = last;
                    self.finish_telemetry();
                    self.collector.close_incomplete();
                    return Ok(());
                }
                if self.now > last {
                    self.pace(progress)?;
                }
                if self.collector.telemetry.is_some() {
                    self.sample_telemetry(self.now);
                }
            }
            let now = self.now;
            while let Some(&Reverse((Time(t), seq, event))) = self.events.peek() {
                if t > now {
                    break;
                }
                self.events.pop();
                if self.is_stale(seq, event) {
                    continue;
                }
                match event {
                    Event::PassEnd { pool, worker } => {
                        self.wake(pool as usize, worker as usize);
                        // The pass's transfer boundary was computed with the pass; what the
                        // pool's G3 tiers completed by its end is seen now.
                        if self.g3_observe(pool as usize, worker as usize, now) {
                            self.advance_transfers(pool as usize, worker as usize);
                        }
                        self.settle_boundary(pool as usize, worker as usize);
                        let w = &mut self.pools[pool as usize].workers[worker as usize];
                        w.busy = false;
                        w.pass_seq = u64::MAX;
                        match w.stretch.take() {
                            Some(stretch) => {
                                if std::mem::take(&mut w.stretch_pending) {
                                    w.ranks[0].engine.commit_stretch(stretch.ends.len() as u32);
                                }
                                self.apply_stretch(stretch)
                            }
                            None => self.apply_pass(pool as usize, worker as usize),
                        }
                    }
                    Event::TransferDone { request } => self.handoff(request, Fact::TransferLanded),
                    Event::KvVisible { batch } => {
                        let (pool, target, events, host) = self.lagged.remove(&batch).expect("lagged batch");
                        self.pools[pool].placer.kv_events(target, &events);
                        self.pools[pool].placer.host_kv_events(target, &host);
                    }
                    Event::WorkerReady { pool, worker } => self.worker_ready(pool as usize, worker as usize, None),
                    Event::HostWake { pool, worker } => self.host_wake(pool as usize, worker as usize),
                    Event::G3Tick { pool } => self.g3_tick(pool as usize),
                }
            }
            for (id, step) in std::mem::take(&mut self.unplaced) {
                self.carry_out(id, step);
            }
            ready.clear();
            self.driver.pop_ready(now, &mut ready);
            for r in &ready {
                if let Some(queued) = self.collector.runaway() {
                    let warn_at = self.collector.queue_limit().warn_at;
                    return Err(SimError::QueueRunaway { at_ms: now, queued, warn_at });
                }
                match self.collector.overflow() {
                    None => self.release(r),
                    Some((max, Overflow::Fail)) => return Err(SimError::QueueFull { at_ms: now, max }),
                    Some((_, Overflow::Shed)) => {
                        self.collector.shed();
                        self.driver.on_complete(r.session, now, false);
                    }
                }
            }
            // Dynamo samples the cluster once the arrivals of the instant are placed:
            // disaggregated, at the next round (see `unplaced`).
            if self.collector.telemetry.is_some() && self.unplaced.is_empty() {
                self.sample_after_arrivals(now);
            }
            for pool in &self.pools {
                if let Some(why) = pool.placer.error() {
                    return Err(SimError::Router { at_ms: now, why: why.to_string() });
                }
            }
            if let Some(why) = self.rejected.take() {
                return Err(SimError::Router { at_ms: now, why });
            }
            if let Some(why) = self.scaling.as_ref().and_then(|s| s.hook.error()) {
                return Err(SimError::Planner { at_ms: now, why });
            }
            again = self.start_passes()?;
            self.schedule_g3_ticks();
            self.schedule_shared_host_wakes();
            if let Some(request) = self.unschedulable {
                return Err(SimError::Unschedulable { at_ms: now, request });
            }
            if (!again || !self.unplaced.is_empty()) && self.scaling.is_some() {
                // The cluster has settled at this instant (but for arrivals still to be
                // placed): the autoscaler's tick, then passes on what it changed.
                self.scaling_tick();
                again = self.start_passes()?;
            }
            if self.finished != last_reported {
                last_reported = self.finished;
                progress.update(self.finished, total);
            }
        }
        self.finish_telemetry();
        self.record_host_offload();
        if !self.flights.is_empty() {
            return Err(SimError::Deadlock { at_ms: self.now, in_flight: self.flights.len() });
        }
        self.collector.close_incomplete();
        Ok(())
    }

    /// Waits until the pacer lets the run go on at `self.now`, in slices of at most
    /// [`pace::PACE_SLICE`], stopping with [`SimError::Cancelled`] if the caller cancels.
    fn pace(&self, progress: &mut dyn Progress) -> Result<(), SimError> {
        let Some(pacer) = self.pacer else { return Ok(()) };
        loop {
            let wait = pacer.wait(self.now);
            if wait.is_zero() {
                return Ok(());
            }
            if progress.cancelled() {
                return Err(SimError::Cancelled { at_ms: self.now });
            }
            std::thread::sleep(wait.min(pace::PACE_SLICE));
        }
    }

    /// Adds the host caches' counters to the run's totals (when any rank has one).
    fn record_host_offload(&mut self) {
        let mut counted: Vec<&SharedHostPool> = Vec::new();
        for pool in &self.pools {
            if let Some(shared) = pool.shared_host.as_ref().filter(|s| !counted.iter().any(|c| c.same_pool(s))) {
                counted.push(shared);
                // The pool's transfers are counted once, not by each rank (nor by each role
                // of a disaggregated deployment).
                let totals = self.collector.totals.host_offload.get_or_insert_with(Default::default);
                totals.add(&servesim_engine::vllm::HostCounters { tier: shared.stats(), host_hit_tokens: 0, g3: None });
                totals.g2_domain = Some(shared.occupancy());
            }
            if let Some(shared) = &pool.shared_g3 {
                // Likewise the G3 pool's.
                let totals = self.collector.totals.host_offload.get_or_insert_with(Default::default);
                totals.g3.get_or_insert_with(Default::default).merge(&shared.stats());
            }
            for worker in &pool.workers {
                for rank in &worker.ranks {
                    if let Some(c) = rank.engine.host_counters() {
                        self.collector.totals.host_offload.get_or_insert_with(Default::default).add(&c);
                    }
                }
            }
        }
    }

    /// Dynamo 1.6.1 keeps one G3 registry per deployment: with scope `worker_local` each worker
    /// has its own pool of blocks and its own rates, but a completion anywhere bumps one epoch,
    /// and a worker that has not seen the latest epoch wakes its requests waiting on a transfer
    /// at its next advance (an idle worker at once). Called before worker `w` advances its
    /// transfers at `now`.
    fn g3_observe(&mut self, pool: usize, w: usize, now: f64) -> bool {
        if !self.pools[pool].g3_coupled {
            return false;
        }
        let total: u64 = self.pools[pool]
            .workers
            .iter_mut()
            .flat_map(|worker| worker.ranks.iter_mut())
            .filter_map(|rank| rank.engine.g3_sync(now))
            .sum();
        let worker = &mut self.pools[pool].workers[w];
        if worker.g3_seen == total {
            return false;
        }
        worker.g3_seen = total;
        for rank in &mut worker.ranks {
            rank.engine.note_g3_deployment_progress();
        }
        true
    }

    /// Schedules the next G3 event of a coupled pool (idle workers observe it then).
    fn schedule_g3_ticks(&mut self) {
        let now = self.now;
        let mut ticks = Vec::new();
        for (p, pool) in self.pools.iter().enumerate() {
            if !pool.g3_coupled {
                continue;
            }
            let next = pool
                .workers
                .iter()
                .flat_map(|worker| worker.ranks.iter())
                .filter_map(|rank| rank.engine.g3_next_event_after(now))
                .min_by(f64::total_cmp);
            if let Some(at) = next {
                ticks.push((p, at));
            }
        }
        for (p, at) in ticks {
            if self.g3_ticks.insert((p, Time(at))) {
                self.schedule(at, Event::G3Tick { pool: p as u8 });
            }
        }
    }

    /// A G3 event of the pool: every idle worker that has not seen a completion advances.
    fn g3_tick(&mut self, pool: usize) {
        let now = self.now;
        self.g3_ticks.retain(|&(p, Time(at))| p != pool || at > now);
        for w in 0..self.pools[pool].workers.len() {
            if self.pools[pool].workers[w].busy || !self.g3_observe(pool, w, now) {
                continue;
            }
            self.advance_transfers(pool, w);
            self.wake(pool, w);
        }
    }

    /// The end of worker `w`'s pass whose transfer boundary was deferred (a shared pool):
    /// every rank reaches it now, after the passes that ended earlier elsewhere.
    fn settle_boundary(&mut self, pool: usize, w: usize) {
        let worker = &mut self.pools[pool].workers[w];
        if !std::mem::take(&mut worker.boundary_pending) {
            return;
        }
        let end = self.now;
        for rank in &mut worker.ranks {
            rank.engine.finish_group_pass(end, &mut rank.output);
        }
    }

    /// A shared host pool advances whenever any of its ranks acts, completing the others'
    /// transfers or making them see a peer's: each idle worker of such a pool wakes at its
    /// next deadline as the pool now stands.
    fn schedule_shared_host_wakes(&mut self) {
        for p in 0..self.pools.len() {
            if self.pools[p].shared_host.is_none() {
                continue;
            }
            for w in 0..self.pools[p].workers.len() {
                if !self.pools[p].workers[w].busy {
                    self.schedule_host_wake(p, w);
                }
            }
        }
    }

    /// Wakes idle worker `w` when its next host transfer completes (the engine has no clock).
    fn schedule_host_wake(&mut self, pool: usize, w: usize) {
        let worker = &self.pools[pool].workers[w];
        let Some(at) = worker.ranks.iter().filter_map(|r| r.engine.next_transfer_deadline()).min_by(f64::total_cmp)
        else {
            return;
        };
        let at = at.max(self.now);
        if worker.host_wake_at.is_some_and(|t| t <= at && t >= self.now) {
            return;
        }
        self.pools[pool].workers[w].host_wake_at = Some(at);
        self.schedule(at, Event::HostWake { pool: pool as u8, worker: w as u32 });
    }

    /// An idle worker's host transfers complete: loads become admissible, deferred requests
    /// wake. A busy worker applies them at its pass boundary instead.
    fn host_wake(&mut self, pool: usize, w: usize) {
        let now = self.now;
        let worker = &mut self.pools[pool].workers[w];
        if worker.host_wake_at.is_some_and(|t| t <= now) {
            worker.host_wake_at = None;
        }
        if worker.busy {
            return;
        }
        self.g3_observe(pool, w, now);
        self.advance_transfers(pool, w);
        self.wake(pool, w);
    }

    /// Completes the host transfers due now on every rank of idle worker `w`; the KV events
    /// they cause reach the router at once (Dynamo publishes them when it wakes the rank).
    fn advance_transfers(&mut self, pool: usize, w: usize) {
        let dp = self.pools[pool].spec.dp();
        let mut events = PassOutput::default();
        for r in 0..dp {
            self.pools[pool].workers[w].ranks[r].engine.advance_transfers(self.now, &mut events);
            self.publish_kv_events(pool, w * dp + r, &events);
            events.clear();
        }
    }

    /// Starts a pass (or a fast-forwarded stretch) on every idle worker that has work. Returns
    /// whether a pass took no time and created work at this instant.
    fn start_passes(&mut self) -> Result<bool, SimError> {
        let now = self.now;
        self.passes_started_ms = now;
        let mut again = false;
        // Workers that could run a stretch of decode passes wait until every other worker has
        // started its pass: work created at this instant must bound their stretches.
        let mut stretches = Vec::new();
        let scaled = self.scaling.is_some();
        let dynamo_gauges = self.collector.telemetry.as_ref().is_some_and(|t| t.dynamo);
        // The awake workers in pool and worker order, as a scan of every worker would visit
        // them: one woken during the scan is visited now if it comes later, at the next call
        // (at this instant) if not.
        let mut visited: Option<(usize, usize)> = None;
        loop {
            let next = match visited {
                None => self.awake.first().copied(),
                Some(v) => self.awake.range((Excluded(v), Unbounded)).next().copied(),
            };
            let Some((p, w)) = next else { break };
            self.awake.remove(&(p, w));
            visited = Some((p, w));
            {
                let worker = &mut self.pools[p].workers[w];
                if worker.busy || !worker.ranks.iter().any(|r| r.engine.has_work()) {
                    if !worker.busy {
                        self.schedule_host_wake(p, w);
                    }
                    continue;
                }
                if let Some(stretch) = self.plan_stretch(p, w) {
                    stretches.push((p, w, stretch));
                    continue;
                }
                self.g3_observe(p, w, now);
                let worker = &mut self.pools[p].workers[w];
                // Every rank with work starts a pass now; the worker's pass ends when the
                // slowest rank's does, and all its tokens are stamped then.
                let mut end = now;
                let mut effect = false;
                worker.pass_start = now;
                let dp = worker.ranks.len() as u32;
                for rank in &mut worker.ranks {
                    rank.engine.begin_group_pass(worker.wave_step, dp);
                }
                for rank in &mut worker.ranks {
                    rank.ran = rank.engine.has_work();
                    if scaled && !rank.ran {
                        rank.queue = rank.engine.queue_load();
                    }
                    if rank.ran {
                        if dynamo_gauges {
                            let before = telemetry::Gauges::of(&rank.engine);
                            rank.engine.step(now, &mut rank.output);
                            rank.before_pass = Some((before, rank.engine.num_running() + rank.engine.num_waiting()));
                        } else {
                            rank.engine.step(now, &mut rank.output);
                        }
                        if scaled {
                            rank.queue = rank.engine.queue_load();
                        }
                        if !rank.output.end_ms.is_finite() {
                            let why = rank.engine.config().timing.error();
                            let why = why.unwrap_or_else(|| "a pass has no finite duration".into());
                            return Err(SimError::Timing { worker: w as u32, at_ms: now, why });
                        }
                        end = end.max(rank.output.end_ms);
                        effect |= !rank.output.is_empty();
                    }
                }
                // With a shared pool (host or G3) the transfer boundary waits for the pass's end
                // in virtual time (see `settle_boundary`); a pass that takes no time reaches it
                // now, as a rank with a private cache does inside its step.
                let defers_boundary = worker.ranks[0].engine.defers_transfer_boundary();
                if defers_boundary && end == now && dp == 1 {
                    let rank = &mut worker.ranks[0];
                    rank.engine.finish_group_pass(end, &mut rank.output);
                    effect |= !rank.output.is_empty();
                }
                let ranks = &worker.ranks;
                let any_prefilled = ranks.iter().any(|r| r.ran && r.engine.prefilled_in_pass());
                let any_ran_model = ranks.iter().any(|r| r.ran && r.engine.ran_model_in_pass());
                let deferred = ranks.iter().any(|r| r.ran && r.engine.deferred_in_pass());
                // A pass that moved only G3 work is retried at this instant, as Dynamo does.
                let g3_retry = end == now && !effect && ranks.iter().any(|r| r.ran && r.engine.g3_retry_now(now));
                let deferred_boundary = end > now && defers_boundary;
                if dp > 1 || deferred_boundary {
                    // Every rank reaches the group's barrier; an idle rank's output carries only
                    // what that boundary produced.
                    for rank in &mut worker.ranks {
                        if !rank.ran {
                            rank.output.clear();
                        }
                        if !deferred_boundary {
                            rank.engine.finish_group_pass(end, &mut rank.output);
                        }
                    }
                }
                worker.boundary_pending = deferred_boundary;
                for rank in &mut worker.ranks {
                    rank.engine.end_group_pass(any_prefilled, any_ran_model);
                }
                worker.wave_step += 1;
                if end > now {
                    worker.busy = true;
                    worker.pass_end = end;
                    self.schedule_pass_end(p, w, end);
                } else if effect || deferred || g3_retry {
                    // A deferred round of SGLang's prefill/decode interval counts down even when
                    // it does nothing; the next round follows at once.
                    self.apply_pass(p, w);
                    self.wake(p, w);
                    again = true;
                } else if self.pools[p].spec.role == Role::Decode && self.retry_destinations(p, w) {
                    // The empty pass still ends, and its end tries a waiting destination, as
                    // every pass end does; a reservation is progress, so another pass follows
                    // at this instant.
                    self.wake(p, w);
                    again = true;
                } else if self.pools[p].workers[w].ranks.iter().any(|r| r.engine.next_transfer_deadline().is_some()) {
                    // A host transfer the pass started (or waits for) brings the next change.
                    self.schedule_host_wake(p, w);
                } else if self.pools[p].shared_host.is_some() || self.pools[p].shared_g3.is_some() {
                    // Its requests wait on a shared pool's transfer that another worker has yet
                    // to start or finish (a store prepared in a pass still running, a peer's G3
                    // write): the pool's progress wakes it (`schedule_shared_host_wakes`, the
                    // G3 ticks).
                } else if self.pools[p].spec.role == Role::Aggregated {
                    // Nothing outside an aggregated engine frees its capacity.
                    return Err(SimError::Stalled { worker: w as u32, at_ms: now });
                }
                // Otherwise a disaggregated worker with nothing to do now waits for a hand-off
                // (a source released, a destination activated); it tries again whenever the
                // simulation moves on.
            }
        }
        again |= self.tell_ended_sessions();
        again |= !self.unplaced.is_empty();
        if again {
            // A pass that took no time created work at this instant. It reaches workers at the
            // next iteration, after the ones idle now have started: as pass-by-pass, they start
            // one normal pass now.
            for (p, w, stretch) in stretches {
                self.start_stretch(p, w, stretch, now);
            }
        } else {
            // Unless only releases bound stretches, a stretch must also end before any other
            // worker starting now could finish a pass (and create work for this one).
            let mut first_ends: Vec<f64> = stretches.iter().map(|(_, _, s)| s.ends[0]).collect();
            for (i, (p, w, stretch)) in stretches.into_iter().enumerate() {
                first_ends[i] = f64::INFINITY;
                let others = if self.only_releases_bound_stretches() {
                    f64::INFINITY
                } else {
                    first_ends.iter().copied().fold(f64::INFINITY, f64::min)
                };
                self.start_stretch(p, w, stretch, others);
            }
        }
        Ok(again)
    }

    /// Disaggregated: tells the load driver about the requests that ended at this instant, now
    /// that the workers idle at it have started their passes. Dynamo's disaggregated replay
    /// does so (pinned by the parity case `x_disagg_followup_misses_passes`): a follow-up turn
    /// ready at once is released at this instant but waits for the next pass of a busy
    /// prefill worker. Returns whether a turn became ready now; it is released at the next
    /// iteration.
    fn tell_ended_sessions(&mut self) -> bool {
        if self.ended.is_empty() {
            return false;
        }
        for (session, completed) in std::mem::take(&mut self.ended) {
            self.driver.on_complete(session, self.now, completed);
        }
        self.driver.next_ready_ms().is_some_and(|t| t <= self.now)
    }

    /// A turn becomes a request: registered, hashed, and placed (or, disaggregated, started on
    /// its handoff).
    fn release(&mut self, r: &Ready) {
        if let Some(shard) = self.shard {
            let pool = &mut self.pools[0];
            let target = pool.placer.peek_round_robin().expect("only round-robin runs split");
            if target / pool.spec.dp() % shard.count != shard.index {
                pool.placer.skip_round_robin();
                self.collector.skip_arrival();
                // Another shard serves it; here its (single-turn) session is over.
                self.driver.on_complete(r.session, self.now, true);
                return;
            }
        }
        if let Some(s) = self.scaling.as_mut() {
            s.arrival();
        }
        let prompt = self.driver.prompt(r);
        let planned_output = self.driver.planned_output(r);
        let session = self.driver.session(r.session);
        let turn = &session.turns[r.turn as usize];
        let id = self.collector.arrive(
            session.name.clone(),
            r.turn,
            r.arrival_ms,
            prompt.len(),
            turn.output_length,
            turn.meta.clone(),
        );
        // The KV router places by block hashes; engines hash what they need themselves.
        let hashes = if self.pools.iter().any(|p| p.placer.is_kv()) {
            prompt.block_hashes(self.config.topology.block_size())
        } else {
            Default::default()
        };
        let flight = Flight {
            hashes,
            planned_output,
            priority: turn.priority,
            strict_priority: turn.strict_priority,
            policy_class: turn.meta.as_ref().and_then(|m| m.policy_class.clone()),
            ..Flight::new(
                id,
                prompt,
                turn.output_length,
                r.arrival_ms,
                self.config.seed,
                &self.config.topology,
                r.session,
            )
        };
        self.flights.insert(id, flight);
        match self.flights.get_mut(&id).and_then(|f| f.handoff.as_mut()).map(Handoff::start) {
            // Dynamo's disaggregated replay queues a new request's hand-off actions and runs
            // them at its next round at this instant: after the prefill workers idle now have
            // started their passes and after the planner's tick (a worker it drains now gets
            // none of the requests arriving now).
            Some(step) => self.unplaced.push((id, step)),
            None => self.route(0, id),
        }
    }

    /// Asks pool `pool`'s placer for a target for request `id` (or leaves it in the router
    /// queue).
    fn route(&mut self, pool: usize, id: u64) {
        let now = self.now;
        let flight = &self.flights[&id];
        match self.pools[pool].placer.route(flight.route_request(), now) {
            Routed::Placed(p) => self.place(pool, p),
            Routed::Queued => {}
            Routed::Rejected(why) => {
                self.rejected.get_or_insert(why.to_string());
            }
        }
    }

    /// Hands a placed request to its worker.
    fn place(&mut self, pool: usize, p: Placement) {
        let role = self.pools[pool].spec.role;
        let bs = self.pools[pool].spec.engine.block_size;
        let dp = self.pools[pool].spec.dp();
        let flight = self.flights.get_mut(&p.id).expect("placed request is in flight");
        let overlap_tokens = (p.overlap_blocks * bs).min(flight.prompt.len());
        // The planner's prefix-hit observation: router admissions with at least one block.
        let isl_blocks = flight.hashes.len();
        if let (Some(s), true) = (self.scaling.as_mut(), self.pools[pool].placer.is_kv() && isl_blocks > 0) {
            s.hit_rate(p.overlap_blocks as f64 / isl_blocks as f64);
        }
        // Dynamo's replay counts the router's hit rate where the prompt is computed (not the
        // decode pool's placement).
        let prompt_pool = self.pools[pool].spec.role != Role::Decode;
        if let (Some(t), true) =
            (self.collector.telemetry.as_mut(), prompt_pool && self.pools[pool].placer.is_kv() && isl_blocks > 0)
        {
            t.traffic.add_router_hit(p.overlap_blocks as f64 / isl_blocks as f64);
        }
        let overlap_blocks = p.best_overlap_blocks.map(|best| (p.overlap_blocks, best));
        let (worker, rank) = (p.target / dp, p.target % dp);
        self.collector.placed(p.id, role, worker, rank, overlap_tokens, overlap_blocks, p.queued_at_ms, self.now);
        match role {
            Role::Aggregated | Role::Prefill => flight.prefill_target = Some(p.target),
            Role::Decode => flight.decode_target = Some(p.target),
        }
        let request = flight.engine_request(role);
        self.settle_stretch(pool, p.target / dp);
        self.wake(pool, p.target / dp);
        let worker = &mut self.pools[pool].workers[p.target / dp];
        if role != Role::Decode {
            worker.ranks[p.target % dp].engine.submit(request);
            return;
        }
        // The request waits on the decode worker for its blocks; an idle worker tries at once, a
        // busy one when its pass ends.
        match worker.ranks[p.target % dp].engine.accept_destination(request) {
            Err(reason) => self.handoff(p.id, Fact::DestinationRefused(reason)),
            Ok(()) if !worker.busy => {
                self.retry_destination(pool, p.target);
            }
            Ok(()) => {}
        }
    }

    /// A request left the system: metrics, load driver.
    fn finish(&mut self, id: u64, finish: Finish) {
        if finish == Finish::Rejected(RejectReason::ExceedsBatchBudget) {
            self.unschedulable.get_or_insert(id);
        }
        self.record_finish(id, finish == Finish::Completed);
        let flight = self.flights.remove(&id).expect("finished request is in flight");
        self.collector.finish(id, self.now, finish);
        if self.transfer.is_some() {
            self.ended.push((flight.extra, finish == Finish::Completed));
        } else {
            self.driver.on_complete(flight.extra, self.now, finish == Finish::Completed);
        }
        self.finished += 1;
    }

    /// Router lifecycle edges; requests the router releases from its queue are placed now.
    fn router_edge(&mut self, pool: usize, edge: Edge) {
        let placer = &mut self.pools[pool].placer;
        if !placer.is_kv() {
            return;
        }
        let released = placer.edge(edge, self.now);
        for p in released {
            self.place(pool, p);
        }
    }

    /// Folds the results of a worker's last pass (every rank that ran) into the metrics, the
    /// routers and the load driver. Tokens and completions are stamped at the pass end (now).
    fn apply_pass(&mut self, pool: usize, w: usize) {
        let dp = self.pools[pool].spec.dp();
        for r in 0..dp {
            let rank = &mut self.pools[pool].workers[w].ranks[r];
            if std::mem::take(&mut rank.ran) {
                let out = std::mem::take(&mut rank.output);
                self.apply_rank_pass(pool, w * dp + r, &out);
                self.record_fpm(pool, w, r, Some(&out));
                self.pools[pool].workers[w].ranks[r].output = out;
            } else {
                // An attention-DP rank with nothing to do still takes part in its worker's
                // pass, and the planner sees an empty pass of it. Host loads that completed at
                // the group's barrier publish their blocks.
                let events = std::mem::take(&mut self.pools[pool].workers[w].ranks[r].output);
                self.publish_kv_events(pool, w * dp + r, &events);
                self.pools[pool].workers[w].ranks[r].output = events;
                self.record_fpm(pool, w, r, None);
            }
        }
        // A decode worker tries its oldest waiting destination at the end of every pass; then
        // the commands that waited for the pass to end are applied.
        if self.pools[pool].spec.role == Role::Decode {
            self.retry_destinations(pool, w);
        }
        for (id, r) in std::mem::take(&mut self.pools[pool].workers[w].pending_releases) {
            self.pools[pool].workers[w].ranks[r].engine.release_held(id);
        }
        for (id, t) in std::mem::take(&mut self.pools[pool].workers[w].pending_activations) {
            self.activate(t, id);
        }
        self.pools[pool].workers[w].reset_wave_if_drained();
        if self.scaling.is_some() {
            self.retire_if_drained(pool, w);
        }
    }

    /// A rank's KV events reach the router now, or after the configured lag.
    /// Hands the KV events of a rank's pass (device and host tiers) to its pool's router, now
    /// or after the configured lag.
    fn publish_kv_events(&mut self, pool: usize, target: usize, out: &PassOutput) {
        let (events, host) = (&out.kv_events, &out.host_kv_events);
        if events.is_empty() && host.is_empty() {
            return;
        }
        if self.config.kv_event_lag_ms > 0.0 {
            let batch = self.seq;
            self.lagged.insert(batch, (pool, target, events.clone(), host.clone()));
            self.schedule(self.now + self.config.kv_event_lag_ms, Event::KvVisible { batch });
        } else {
            let placer = &mut self.pools[pool].placer;
            placer.kv_events(target, events);
            placer.host_kv_events(target, host);
        }
    }

    fn apply_rank_pass(&mut self, pool: usize, target: usize, out: &PassOutput) {
        let role = self.pools[pool].spec.role;
        let now = self.now;
        self.publish_kv_events(pool, target, out);
        for a in &out.admissions {
            if role == Role::Decode {
                self.collector.decode_admit(a.request, out.start_ms, a.reused_tokens);
            } else {
                self.collector.admit(a.request, out.start_ms, a.reused_tokens);
            }
            if let Some(tiers) = a.tiers {
                self.collector.admit_tiers(a.request, tiers);
            }
        }
        // The router's edges (servesim_cluster::edges), each acted on as it comes.
        let edges = PassEdges::of(role, self.pools[pool].placer.is_kv(), out);
        for (i, t) in out.tokens.iter().enumerate() {
            if let Some(edge) = edges.at_token(i, t.request, || self.collector.token(t.request, now)) {
                self.router_edge(pool, edge);
            }
        }
        self.collector.count_pass(out, role != Role::Prefill);
        if let Some(t) = self.collector.telemetry.as_mut() {
            t.pass(pool, target, out, role != Role::Prefill);
        }
        for f in &out.finished {
            if let Some(edge) = edges.at_finish(f) {
                self.router_edge(pool, edge);
            }
            match (role, f.finish) {
                (Role::Prefill, Finish::Completed) => {
                    // The prompt is done: its KV moves once a decode worker has room for it.
                    self.collector.source_held(f.request, now);
                    self.handoff(f.request, Fact::SourceHeld);
                }
                (Role::Prefill, Finish::Rejected(reason)) => self.handoff(f.request, Fact::SourceRefused(reason)),
                _ => self.finish(f.request, f.finish),
            }
        }
    }
}

/// The timing jitter of pool `p`'s engines: the run's seed, offset per pool so prefill and
/// decode engines of the same index draw different streams.
fn pool_jitter(config: &SimConfig, p: usize) -> Option<TimingJitter> {
    let seed = config.seed.wrapping_add((p as u64).wrapping_mul(0xD1B5_4A32_D192_ED03));
    TimingJitter::new(config.timing_jitter_cv, seed).unwrap_or(None)
}

/// The pools a deployment's ranks share (Dynamo builds one per replay deployment): a host
/// pool when `native_host_offload` is `cluster_shared`, a G3 pool when `g3_offload` is; each
/// has the configured capacity and the shared rates as its caps.
struct SharedPools {
    host: Option<SharedHostPool>,
    g3: Option<SharedG3Pool>,
}

impl SharedPools {
    /// The shared pools of a pool of workers running `engine`. `deployment_host` is the
    /// deployment's host pool: made by the first pool of workers that joins one, joined by
    /// the others.
    fn of(engine: &servesim_engine::EngineConfig, deployment_host: &mut Option<SharedHostPool>) -> Self {
        // Offload is validated to come with the byte size of a token.
        let bytes_per_token = engine.kv_cache_bytes_per_token.unwrap_or_default();
        let host = engine.host_offload.as_ref().filter(|h| h.cluster_shared).map(|h| {
            let pool = deployment_host
                .get_or_insert_with(|| SharedHostPool::new(h.tier_config(engine.block_size, bytes_per_token, true)));
            pool.clone()
        });
        let g3 = engine.g3_offload.filter(|g| g.cluster_shared).map(|g| {
            let block_bytes = engine.block_size as u64 * bytes_per_token;
            SharedG3Pool::new(g.tier_config(block_bytes), g.shared_read_bandwidth_gbps, g.shared_write_bandwidth_gbps)
        });
        SharedPools { host, g3 }
    }
}

fn new_worker(
    rank_engine: &servesim_engine::EngineConfig,
    w: u32,
    ranks: u32,
    record_kv_events: bool,
    timing_jitter: Option<TimingJitter>,
    shared: &SharedPools,
) -> Worker {
    Worker {
        ranks: (0..ranks)
            .map(|rank| Rank {
                engine: {
                    let mut engine = Engine::new(
                        rank_engine.clone(),
                        EngineOptions { record_kv_events, engine_index: w * ranks + rank, timing_jitter },
                    );
                    if shared.host.is_some() || shared.g3.is_some() {
                        engine.join_shared_pools(shared.host.as_ref(), shared.g3.as_ref());
                    }
                    engine
                },
                output: PassOutput::default(),
                ran: false,
                queue: Default::default(),
                before_pass: None,
            })
            .collect(),
        busy: false,
        pass_start: 0.0,
        pass_end: 0.0,
        stretch: None,
        stretch_pending: false,
        pass_seq: u64::MAX,
        wave_step: 0,
        pending_releases: Vec::new(),
        pending_activations: Vec::new(),
        host_wake_at: None,
        g3_seen: 0,
        boundary_pending: false,
    }
}
