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
//!
//! The loop itself is here; `arrive` releases, routes, places and finishes requests,
//! `pass` starts and applies passes (and the host-cache timing between them), `handoff`
//! carries out the disaggregated handoff's steps, `stretch` fast-forwards decode passes,
//! `scaling` runs the autoscaler and `sampling` takes the telemetry samples.

mod arrive;
mod encoders;
mod frontend;
mod handoff;
mod pace;
mod pass;
mod sampling;
mod scaling;
mod stages;
mod stretch;

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
use servesim_workload::time::Time;
use servesim_workload::{LoadDriver, LoadMode, Ready, Workload, MAX_TIME_MS};

pub use encoders::EncoderPool;
pub use frontend::Tokenization;
pub use stages::FrontendStage;

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
    /// `split.rs`); the per-request results are identical, pooled means may differ in
    /// the last bits. Off only to check that.
    pub split_workers: bool,
    /// Threads for split runs; 0 uses every core.
    pub threads: usize,
    /// Per-pass timing jitter as a coefficient of variation (0: off, every pass lasts what the
    /// timing model says). Each engine draws its factors from a stream derived from `seed`, its
    /// pool and its index. Front ends check the value with
    /// [`servesim_engine::TimingJitter::new`]; one it refuses counts as 0 here.
    pub timing_jitter_cv: f64,
    /// The frontend's tokenization stage, if any (aisimulate's `engine.tokenization`).
    pub tokenization: Option<Tokenization>,
    /// SGLang's frontend stages on each worker of the pool that computes prompts (aisimulate's
    /// `engine.workers.<aggregated|prefill>.frontend`), crossed in order between the router's
    /// placement and the worker's scheduler; empty without them.
    pub frontend_stages: Vec<FrontendStage>,
    /// A native encoder pool every request's images cross before the router (aisimulate's
    /// `engine.workers.encoder` with `mode: native`), if any.
    pub encoder_pool: Option<EncoderPool>,
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
            tokenization: None,
            frontend_stages: Vec::new(),
            encoder_pool: None,
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
    /// The workload cannot go on (an agentic profile that cannot refill its lanes).
    Workload { at_ms: f64, why: String },
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
            SimError::Workload { at_ms, why } => write!(f, "workload at t={at_ms} ms: {why}"),
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

/// What the loop left at its end: the collector, the time of its last event, and the worker
/// seconds an autoscaled run used.
pub(crate) struct Looped<'c> {
    pub collector: Collector<'c>,
    pub end_ms: f64,
    pub worker_seconds: Option<(f64, f64)>,
}

/// Runs the loop over the whole cluster with `options` (see [`crate::simulate_with`], which
/// also decides when a run is split by worker instead).
pub(crate) fn run_loop<'c>(
    workload: &Workload,
    config: &SimConfig,
    collector: Collector<'c>,
    progress: &mut dyn Progress,
    options: RunOptions<'_>,
) -> Result<Looped<'c>, SimError> {
    let mut sim = Simulation::new(workload, config, collector, None);
    let scaled = options.autoscaler.is_some();
    if let Some(hook) = options.autoscaler {
        sim.scaling = Some(scaling::Scaling::new(hook, sim.pools.len()));
    }
    sim.stop_at_ms = options.stop_at_ms;
    sim.pacer = options.pacer;
    if options.stop_at_ms.is_some() || workload.is_profile() {
        sim.collector.defer_token_gaps();
    }
    sim.run(progress)?;
    let worker_seconds = scaled.then(|| sim.worker_seconds());
    let end_ms = sim.now - sim.collector.origin_ms();
    Ok(Looped { collector: sim.collector, end_ms, worker_seconds })
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
    config.tokenization.is_none()
        && config.frontend_stages.is_empty()
        && config.encoder_pool.is_none()
        && matches!(config.load, LoadMode::Timestamps { .. })
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
    before_pass: Option<(sampling::Gauges, usize)>,
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
    /// Idle workers whose last pass did nothing though they had work (see
    /// [`Simulation::retry_effect_free`]).
    effect_free: BTreeSet<(usize, usize)>,
    /// Something happened at this instant since the effect-free workers were last retried.
    moved_since_retry: bool,
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
    /// Released requests in the frontend's tokenizers, if the run has the stage.
    tokenizers: Option<frontend::Tokenizers>,
    /// Released requests in the native encoder pool, if the run has one.
    encoders: Option<encoders::Encoders>,
    /// The frontend stages of each worker of the prompt pool (by worker index, made on first
    /// use), if the run has them.
    frontends: Vec<Option<stages::WorkerFrontend>>,
    /// The prompt pool's workers whose pass that computed tokens ended at this instant (see
    /// [`Simulation::settle_frontends`]).
    stage_ticks: Vec<usize>,
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
            effect_free: BTreeSet::new(),
            moved_since_retry: false,
            g3_ticks: BTreeSet::new(),
            ended: Vec::new(),
            unplaced: Vec::new(),
            scaling: None,
            stop_at_ms: None,
            pacer: None,
            rejected: None,
            unschedulable: None,
            tokenizers: config.tokenization.map(frontend::Tokenizers::new),
            encoders: config.encoder_pool.clone().map(encoders::Encoders::new),
            frontends: Vec::new(),
            stage_ticks: Vec::new(),
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

    /// When the next request reaches the router: the load driver's next release, the
    /// tokenizers' next finished request, or the encoder pool's next change.
    fn next_release_ms(&self) -> Option<f64> {
        let tokenized = self.tokenizers.as_ref().and_then(frontend::Tokenizers::next_done_ms);
        let encoded = self.encoders.as_ref().and_then(encoders::Encoders::next_event_ms);
        let staged = self.next_stage_done_ms();
        [self.driver.next_ready_ms(), tokenized, encoded, staged].into_iter().flatten().reduce(f64::min)
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
        if self.driver.has_preparation() {
            self.collector.begin_preparation();
        }
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
                self.now = match (next_event, self.next_release_ms()) {
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
                    self.collector.close_incomplete(None);
                    return Ok(());
                }
                if self.now > last {
                    self.pace(progress)?;
                    self.moved_since_retry = false;
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
                self.moved_since_retry = true;
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
            self.settle_due_shared_transfers();
            for (id, step) in std::mem::take(&mut self.unplaced) {
                self.carry_out(id, step);
            }
            // A warmed agentic profile opens once its preparation ended (nothing in flight):
            // the measured run starts here.
            if let Some(origin) = self.driver.take_profile_start() {
                self.collector.begin_profile(origin);
            }
            // Requests that crossed their worker's frontend stages by now reach its scheduler.
            self.settle_frontends();
            ready.clear();
            self.driver.pop_ready(now, &mut ready);
            self.moved_since_retry |= !ready.is_empty();
            let mut tokenized = Vec::new();
            if let Some(t) = self.tokenizers.as_mut() {
                // Into the tokenizers; what they finished by now goes on.
                for r in ready.drain(..) {
                    let prompt = self.driver.prompt(&r);
                    t.admit(now, r, prompt);
                }
                while let Some(p) = t.pop_done(now) {
                    tokenized.push(p);
                }
                self.moved_since_retry |= !tokenized.is_empty();
            }
            let mut encoded = Vec::new();
            if let Some(e) = self.encoders.as_mut() {
                // Into the encoder pool; the requests whose images all landed by now go on.
                for r in ready.drain(..) {
                    let prompt = self.driver.prompt(&r);
                    e.admit(now, r, prompt);
                }
                e.settle(now);
                while let Some((turn, _)) = e.pop_done(now) {
                    encoded.push(turn);
                }
                self.moved_since_retry |= !encoded.is_empty();
            }
            let arrivals = ready
                .iter()
                .map(|r| (*r, None, false))
                .chain(tokenized.into_iter().map(|p| (p.ready, Some(p.prompt), false)))
                .chain(encoded.into_iter().map(|t| (t.ready, Some(t.prompt), true)));
            for (r, prompt, encoded) in arrivals.collect::<Vec<_>>() {
                if let Some(queued) = self.collector.runaway() {
                    let warn_at = self.collector.queue_limit().warn_at;
                    return Err(SimError::QueueRunaway { at_ms: now, queued, warn_at });
                }
                match self.collector.overflow() {
                    None => self.release(&r, prompt, encoded),
                    Some((max, Overflow::Fail)) => return Err(SimError::QueueFull { at_ms: now, max }),
                    Some((_, Overflow::Shed)) => {
                        self.collector.shed();
                        self.driver.on_complete(r.session, now, false);
                    }
                }
            }
            if let Some(why) = self.driver.error() {
                return Err(SimError::Workload { at_ms: now, why: why.to_string() });
            }
            if self.driver.profile_finished(now) {
                // A continuous agentic profile ends here: what is still in flight was cancelled
                // (the server keeps it) and the run is over.
                self.finish_telemetry();
                self.record_host_offload();
                self.collector.close_incomplete(Some(now));
                // Its duration is the observation window: first issue to last success.
                self.collector.set_duration_ms(self.driver.observation_ms().unwrap_or(0.0));
                return Ok(());
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
        self.collector.close_incomplete(None);
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
