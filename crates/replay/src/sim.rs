//! The discrete-event loop: a virtual clock, a cluster of simulated workers, and the load
//! driver releasing requests.
//!
//! At each instant the loop (1) applies what happens now — passes that end, KV transfers that
//! land, KV events the router gets to see — (2) releases the requests that become ready now and
//! places them on workers, and (3) starts a pass on every idle worker that has work. A pass's
//! results (tokens, completions, KV events) become visible at its end time; completions can make
//! the next turn of a session ready.
//!
//! Aggregated clusters have one pool of workers. Disaggregated clusters have a prefill pool,
//! whose workers compute the prompt (and a token nobody sees), and a decode pool: when a prompt
//! is done the request is routed to a decode worker, which reserves blocks for it; the KV
//! transfer takes `kv_transfer_ms` of the prefill engine, after which the decode worker
//! generates every visible token and the prefill worker frees its copy.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use rustc_hash::FxHashMap;
use servesim_engine::timing::whole_ns;
use servesim_engine::{
    Backend, BlockHashes, Engine, EngineConfig, EngineOptions, EngineRequest, Finish, KvEvent, KvTransferTimingMode,
    PassOutput, Prompt, Reserved, Stretch, WorkerType,
};
use servesim_router::{KvRouter, Placement, RoundRobin, RouteRequest, Routed, RouterConfig};

use crate::error::InputError;
use crate::metrics::{Collector, Sla, Stage};
use crate::report::Report;
use crate::split;
use crate::time::Time;
use crate::workload::{LoadDriver, LoadMode, Ready, Workload};

/// Workers of one role, all with the same engine.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    pub engine: EngineConfig,
    pub workers: u32,
}

#[derive(Clone, Debug)]
#[allow(clippy::large_enum_variant)] // a configuration value, built once
pub enum Cluster {
    Aggregated(PoolConfig),
    Disaggregated { prefill: PoolConfig, decode: PoolConfig },
}

impl Cluster {
    /// Checks the pools fit together and gives each engine its role.
    pub fn normalise(self) -> Result<Cluster, InputError> {
        fn role(mut pool: PoolConfig, want: WorkerType, flag: &str) -> Result<PoolConfig, InputError> {
            if pool.workers == 0 {
                return Err(InputError::new(format!("{flag} must be at least 1")));
            }
            match pool.engine.worker_type {
                WorkerType::Aggregated => pool.engine.worker_type = want,
                t if t == want => {}
                t => {
                    return Err(InputError::new(format!(
                        "worker_type {t:?} does not fit the {} pool",
                        format!("{want:?}").to_lowercase()
                    )))
                }
            }
            Ok(pool)
        }
        match self {
            Cluster::Aggregated(pool) => {
                if pool.engine.worker_type != WorkerType::Aggregated {
                    return Err(InputError::new(
                        "a prefill or decode worker_type needs a disaggregated cluster \
                         (--num-prefill-workers/--num-decode-workers)",
                    ));
                }
                Ok(Cluster::Aggregated(role(pool, WorkerType::Aggregated, "--num-workers")?))
            }
            Cluster::Disaggregated { prefill, decode } => {
                let prefill = role(prefill, WorkerType::Prefill, "--num-prefill-workers")?;
                let decode = role(decode, WorkerType::Decode, "--num-decode-workers")?;
                if prefill.engine.dp_size != 1 || decode.engine.dp_size != 1 {
                    return Err(InputError::new("disaggregated pools need dp_size 1"));
                }
                if prefill.engine.block_size != decode.engine.block_size {
                    return Err(InputError::new(format!(
                        "prefill and decode engines need the same block_size ({} vs {})",
                        prefill.engine.block_size, decode.engine.block_size
                    )));
                }
                Ok(Cluster::Disaggregated { prefill, decode })
            }
        }
    }

    /// The pools in order: the aggregated pool, or prefill then decode.
    pub fn pools(&self) -> Vec<&PoolConfig> {
        match self {
            Cluster::Aggregated(p) => vec![p],
            Cluster::Disaggregated { prefill, decode } => vec![prefill, decode],
        }
    }

    /// The engine whose block size prompts are hashed at.
    pub fn block_size(&self) -> u32 {
        self.pools()[0].engine.block_size
    }
}

/// How requests are assigned to workers.
#[derive(Clone, Debug, PartialEq)]
pub enum RouterMode {
    RoundRobin,
    KvRouter(RouterConfig),
}

/// Everything that defines one simulated run besides the workload.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub cluster: Cluster,
    pub router: RouterMode,
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
}

/// Progress notifications for a caller that wants to show them.
pub trait Progress {
    /// Called now and then with the number of finished requests and the total.
    fn update(&mut self, finished: u64, total: u64);
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
}

impl std::fmt::Display for SimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SimError::Stalled { worker, at_ms } => {
                write!(f, "internal error: worker {worker} stopped making progress at t={at_ms} ms")
            }
            SimError::Timing { worker, at_ms, why } => write!(f, "worker {worker} at t={at_ms} ms: {why}"),
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
    mut collector: Collector<'_>,
    progress: &mut dyn Progress,
) -> Result<Report, SimError> {
    if split::applies(workload, config, &collector) {
        let end_ms = split::simulate(workload, config, &mut collector, progress)?;
        return Ok(Report::build(config, &collector, end_ms));
    }
    let mut sim = Simulation::new(workload, config, collector, None);
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
) -> Result<(Collector<'c>, f64), SimError> {
    let mut sim = Simulation::new(workload, config, collector, Some(shard));
    sim.run(progress)?;
    Ok((sim.collector, sim.now))
}

/// Whether new work reaches workers only when the load driver releases it: timestamps decide
/// every release (no closed-loop turns), there are no handoffs and no router queue.
pub(crate) fn work_only_at_releases(workload: &Workload, config: &SimConfig) -> bool {
    matches!(config.load, LoadMode::Timestamps { .. })
        && matches!(config.cluster, Cluster::Aggregated(_))
        && workload.single_turn()
        && !matches!(&config.router, RouterMode::KvRouter(rc) if rc.queue_threshold.is_some())
}

/// The next (worker × dp + rank) target of round-robin placement: it cycles through the workers
/// first, then their ranks.
fn round_robin_target(rr: &mut RoundRobin, workers: usize, dp: usize) -> usize {
    let k = rr.pick(workers * dp);
    (k % workers) * dp + k / workers
}

/// Workers `w` with `w % count == index`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shard {
    pub index: usize,
    pub count: usize,
}

enum Placer {
    RoundRobin(RoundRobin),
    Kv(Box<KvRouter>),
}

/// One attention data-parallel rank: an engine with its own scheduler and KV pool.
struct Rank {
    engine: Engine,
    output: PassOutput,
    /// Whether it ran in the worker's current pass.
    ran: bool,
}

/// A worker: `dp_size` ranks that run passes together (the pass ends at the slowest rank).
struct Worker {
    ranks: Vec<Rank>,
    busy: bool,
    /// End of the pass in flight.
    pass_end: f64,
    /// The pass in flight is a fast-forwarded stretch of decode passes.
    stretch: Option<Stretch>,
    /// Prefill worker: held requests to release at the end of the current pass.
    pending_releases: Vec<u64>,
    /// Decode worker: transferred requests to activate at the end of the current pass.
    pending_activations: Vec<u64>,
}

struct Pool {
    role: Stage,
    engine: EngineConfig,
    /// Ranks per worker; routing targets are `worker × dp + rank`.
    dp: usize,
    workers: Vec<Worker>,
    placer: Placer,
}

/// Something scheduled for a later instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    PassEnd { pool: u8, worker: u32 },
    TransferDone { request: u64 },
    KvVisible { batch: u64 },
}

/// A request between its release and its completion.
struct Flight {
    session: u32,
    prompt: Prompt,
    hashes: BlockHashes,
    max_output: u32,
    token_seed: u64,
    priority: i32,
    strict_priority: u32,
    output_tokens: Option<Arc<[u32]>>,
    /// Disaggregated: the prompt is computed (the prefill worker holds its KV).
    prefilled: bool,
    /// Disaggregated: blocks reserved on the decode worker (prompt tokens it had cached).
    reserved: Option<u32>,
    prefill_worker: Option<u32>,
    decode_worker: Option<u32>,
}

struct Simulation<'a, 'c> {
    workload: &'a Workload,
    config: &'a SimConfig,
    driver: LoadDriver<'a>,
    pools: Vec<Pool>,
    events: BinaryHeap<Reverse<(Time, u64, Event)>>,
    seq: u64,
    now: f64,
    flights: FxHashMap<u64, Flight>,
    /// KV events waiting out the router's lag: batch id -> (pool, worker, events).
    lagged: FxHashMap<u64, (usize, usize, Vec<KvEvent>)>,
    collector: Collector<'c>,
    finished: u64,
    /// New work reaches workers only when the load driver releases it (no closed-loop turns,
    /// no router queue, no handoffs): a worker can run ahead until the next release.
    work_only_at_releases: bool,
    spare_stretch: Stretch,
    shard: Option<Shard>,
}

impl<'a, 'c> Simulation<'a, 'c> {
    fn new(workload: &'a Workload, config: &'a SimConfig, mut collector: Collector<'c>, shard: Option<Shard>) -> Self {
        collector.expect_requests(workload.num_requests());
        let roles: &[Stage] = match config.cluster {
            Cluster::Aggregated(_) => &[Stage::Aggregated],
            Cluster::Disaggregated { .. } => &[Stage::Prefill, Stage::Decode],
        };
        let pools = config
            .cluster
            .pools()
            .into_iter()
            .zip(roles)
            .map(|(pc, &role)| {
                let placer = match &config.router {
                    RouterMode::RoundRobin => Placer::RoundRobin(RoundRobin::default()),
                    RouterMode::KvRouter(rc) => {
                        let rc = match role {
                            Stage::Aggregated => rc.clone(),
                            Stage::Prefill => rc.for_prefill(),
                            Stage::Decode => rc.for_decode(),
                        };
                        let budget = pc.engine.max_num_batched_tokens.unwrap_or(8192);
                        Placer::Kv(Box::new(KvRouter::new(
                            rc,
                            (pc.workers * pc.engine.dp_size) as usize,
                            pc.engine.block_size,
                            budget,
                            config.router_seed,
                        )))
                    }
                };
                let record_kv_events = matches!(placer, Placer::Kv(_));
                let workers = (0..pc.workers)
                    .map(|w| Worker {
                        ranks: (0..pc.engine.dp_size)
                            .map(|rank| Rank {
                                engine: Engine::new(
                                    pc.engine.clone(),
                                    EngineOptions { record_kv_events, engine_index: w * pc.engine.dp_size + rank },
                                ),
                                output: PassOutput::default(),
                                ran: false,
                            })
                            .collect(),
                        busy: false,
                        pass_end: 0.0,
                        stretch: None,
                        pending_releases: Vec::new(),
                        pending_activations: Vec::new(),
                    })
                    .collect();
                Pool { role, engine: pc.engine.clone(), dp: pc.engine.dp_size as usize, workers, placer }
            })
            .collect();
        Simulation {
            workload,
            config,
            driver: LoadDriver::new(workload, config.load),
            pools,
            events: BinaryHeap::new(),
            seq: 0,
            now: 0.0,
            flights: FxHashMap::default(),
            lagged: FxHashMap::default(),
            collector,
            finished: 0,
            work_only_at_releases: work_only_at_releases(workload, config),
            spare_stretch: Stretch::default(),
            shard,
        }
    }

    fn schedule(&mut self, at: f64, event: Event) {
        self.events.push(Reverse((Time(at), self.seq, event)));
        self.seq += 1;
    }

    fn run(&mut self, progress: &mut dyn Progress) -> Result<(), SimError> {
        let total = self.workload.num_requests();
        let mut ready = Vec::new();
        let mut again = false;
        let mut last_reported = u64::MAX;
        loop {
            if !again {
                let next_event = self.events.peek().map(|Reverse((t, _, _))| t.0);
                self.now = match (next_event, self.driver.next_ready_ms()) {
                    (None, None) => break,
                    (Some(a), Some(b)) => a.min(b),
                    (Some(a), None) | (None, Some(a)) => a,
                };
            }
            let now = self.now;
            while let Some(&Reverse((Time(t), _, event))) = self.events.peek() {
                if t > now {
                    break;
                }
                self.events.pop();
                match event {
                    Event::PassEnd { pool, worker } => {
                        let w = &mut self.pools[pool as usize].workers[worker as usize];
                        w.busy = false;
                        match w.stretch.take() {
                            Some(stretch) => self.apply_stretch(stretch),
                            None => self.apply_pass(pool as usize, worker as usize),
                        }
                    }
                    Event::TransferDone { request } => self.transfer_done(request),
                    Event::KvVisible { batch } => {
                        let (pool, worker, events) = self.lagged.remove(&batch).expect("lagged batch");
                        self.feed_router(pool, worker, &events);
                    }
                }
            }
            ready.clear();
            self.driver.pop_ready(now, &mut ready);
            for r in &ready {
                self.release(r);
            }
            again = false;
            // Workers that could run a stretch of decode passes wait until every other worker
            // has started its pass: work created at this instant must bound their stretches.
            let mut stretches = Vec::new();
            for p in 0..self.pools.len() {
                for w in 0..self.pools[p].workers.len() {
                    let worker = &mut self.pools[p].workers[w];
                    if worker.busy || !worker.ranks.iter().any(|r| r.engine.has_work()) {
                        continue;
                    }
                    if let Some(stretch) = self.plan_stretch(p, w) {
                        stretches.push((p, w, stretch));
                        continue;
                    }
                    let worker = &mut self.pools[p].workers[w];
                    // Every rank with work starts a pass now; the worker's pass ends when the
                    // slowest rank's does, and all its tokens are stamped then.
                    let mut end = now;
                    let mut effect = false;
                    for rank in &mut worker.ranks {
                        rank.ran = rank.engine.has_work();
                        if rank.ran {
                            rank.engine.step(now, &mut rank.output);
                            if !rank.output.end_ms.is_finite() {
                                let why = rank.engine.config().timing.error();
                                let why = why.unwrap_or_else(|| "a pass has no finite duration".into());
                                return Err(SimError::Timing { worker: w as u32, at_ms: now, why });
                            }
                            end = end.max(rank.output.end_ms);
                            effect |= !rank.output.is_empty();
                        }
                    }
                    if end > now {
                        worker.busy = true;
                        worker.pass_end = end;
                        self.schedule(end, Event::PassEnd { pool: p as u8, worker: w as u32 });
                    } else if effect {
                        self.apply_pass(p, w);
                        again = true;
                    } else if self.pools[p].role == Stage::Aggregated {
                        // Nothing outside an aggregated engine frees its capacity.
                        return Err(SimError::Stalled { worker: w as u32, at_ms: now });
                    }
                    // A disaggregated worker with nothing to do now waits for a hand-off (a
                    // source released, a destination activated); it tries again whenever the
                    // simulation moves on.
                }
            }
            if again {
                // A pass that took no time created work at this instant. It reaches workers at
                // the next iteration, after the ones idle now have started: as pass-by-pass,
                // they start one normal pass now.
                for (p, w, stretch) in stretches {
                    self.start_stretch(p, w, stretch, now);
                }
            } else {
                // Unless only releases bring work, a stretch must also end before any other
                // worker starting now could finish a pass (and create work for this one).
                let mut first_ends: Vec<f64> = stretches.iter().map(|(_, _, s)| s.ends[0]).collect();
                for (i, (p, w, stretch)) in stretches.into_iter().enumerate() {
                    first_ends[i] = f64::INFINITY;
                    let others = if self.work_only_at_releases {
                        f64::INFINITY
                    } else {
                        first_ends.iter().copied().fold(f64::INFINITY, f64::min)
                    };
                    self.start_stretch(p, w, stretch, others);
                }
            }
            if self.finished != last_reported {
                last_reported = self.finished;
                progress.update(self.finished, total);
            }
        }
        if !self.flights.is_empty() {
            return Err(SimError::Deadlock { at_ms: self.now, in_flight: self.flights.len() });
        }
        self.collector.close_incomplete();
        Ok(())
    }

    /// Until when worker `w` of `pool` can run ahead without missing new work; None if it
    /// cannot run ahead at all.
    fn fast_forward_horizon(&self, pool: usize) -> Option<f64> {
        let p = &self.pools[pool];
        if !self.config.fast_forward || p.role != Stage::Aggregated || p.dp != 1 || self.config.kv_event_lag_ms > 0.0 {
            return None;
        }
        let release = self.driver.next_ready_ms().unwrap_or(f64::INFINITY);
        if self.work_only_at_releases {
            return Some(release);
        }
        let event = self.events.peek().map_or(f64::INFINITY, |Reverse((t, _, _))| t.0);
        Some(release.min(event))
    }

    /// Plans a stretch of decode passes for an idle single-rank worker, if it can run one.
    fn plan_stretch(&mut self, pool: usize, w: usize) -> Option<Stretch> {
        let horizon = self.fast_forward_horizon(pool)?;
        let mut stretch = std::mem::take(&mut self.spare_stretch);
        if self.pools[pool].workers[w].ranks[0].engine.plan_stretch(self.now, horizon, &mut stretch) {
            Some(stretch)
        } else {
            self.spare_stretch = stretch;
            None
        }
    }

    /// Starts a planned stretch, cut at the horizon as it stands now (other workers' passes
    /// may have moved it closer), or a single normal pass if too little of it remains.
    fn start_stretch(&mut self, pool: usize, w: usize, mut stretch: Stretch, others: f64) {
        let now = self.now;
        let horizon = self.fast_forward_horizon(pool).expect("the pool fast-forwards").min(others);
        // Pass j starts when pass j-1 ends; every pass must start before the horizon.
        let keep = 1 + stretch.ends.iter().take_while(|&&end| end < horizon).count();
        stretch.ends.truncate(keep.min(stretch.ends.len()));
        let worker = &mut self.pools[pool].workers[w];
        let engine = &mut worker.ranks[0].engine;
        if stretch.ends.len() < 2 {
            // The first planned pass is exactly this step, and it takes time.
            self.spare_stretch = stretch;
            let rank = &mut worker.ranks[0];
            rank.engine.step(now, &mut rank.output);
            rank.ran = true;
            let end = rank.output.end_ms;
            debug_assert!(end > now);
            worker.busy = true;
            worker.pass_end = end;
            self.schedule(end, Event::PassEnd { pool: pool as u8, worker: w as u32 });
            return;
        }
        engine.commit_stretch(stretch.ends.len() as u32);
        let end = *stretch.ends.last().expect("a stretch has passes");
        worker.busy = true;
        worker.pass_end = end;
        worker.stretch = Some(stretch);
        self.schedule(end, Event::PassEnd { pool: pool as u8, worker: w as u32 });
    }

    /// Records the tokens of a fast-forwarded stretch, pass by pass as single steps would.
    fn apply_stretch(&mut self, stretch: Stretch) {
        self.collector.stretch_tokens(&stretch.requests, &stretch.ends);
        let tokens = (stretch.ends.len() * stretch.requests.len()) as u64;
        self.collector.count_decode(tokens, tokens);
        self.collector.totals.stretched_passes += stretch.ends.len() as u64;
        self.spare_stretch = stretch;
    }

    /// A turn becomes a request: registered, hashed, and placed on the first pool.
    fn release(&mut self, r: &Ready) {
        if let Some(shard) = self.shard {
            let pool = &mut self.pools[0];
            let (workers, dp) = (pool.workers.len(), pool.dp);
            let Placer::RoundRobin(rr) = &mut pool.placer else { unreachable!("only round-robin runs split") };
            let mut probe = rr.clone();
            if round_robin_target(&mut probe, workers, dp) / dp % shard.count != shard.index {
                *rr = probe;
                self.collector.skip_arrival();
                // Another shard serves it; here its (single-turn) session is over.
                self.driver.on_complete(r.session, self.now, true);
                return;
            }
        }
        let prompt = self.driver.prompt(r);
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
        let needs_hashes = self.pools.iter().any(|p| matches!(p.placer, Placer::Kv(_)));
        let hashes =
            if needs_hashes { prompt.block_hashes(self.config.cluster.block_size()) } else { BlockHashes::default() };
        self.flights.insert(
            id,
            Flight {
                session: r.session,
                prompt,
                hashes,
                max_output: turn.output_length,
                token_seed: self.config.seed ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15),
                priority: turn.priority,
                strict_priority: turn.strict_priority,
                output_tokens: turn.output_tokens.clone(),
                prefilled: false,
                reserved: None,
                prefill_worker: None,
                decode_worker: None,
            },
        );
        if self.pools.len() > 1 && self.pools[1].engine.backend == Backend::Sglang {
            // SGLang's decode side bootstraps first: the destination is chosen and reserved
            // as the request arrives, and the prefill starts once it is.
            self.route(1, id, r.arrival_ms);
        } else {
            self.route(0, id, r.arrival_ms);
        }
    }

    /// Picks a worker of `pool` for request `id` (or leaves it in the router queue).
    fn route(&mut self, pool: usize, id: u64, arrival_ms: f64) {
        let now = self.now;
        let flight = &self.flights[&id];
        let (workers, dp) = (self.pools[pool].workers.len(), self.pools[pool].dp);
        let placement = match &mut self.pools[pool].placer {
            Placer::RoundRobin(rr) => {
                let target = round_robin_target(rr, workers, dp);
                Placement { id, target, overlap_blocks: 0, cost: 0.0, queued_at_ms: None }
            }
            Placer::Kv(router) => {
                let req = RouteRequest {
                    id,
                    hashes: &flight.hashes.seq,
                    isl: flight.prompt.len(),
                    priority: flight.priority,
                    strict_priority: flight.strict_priority,
                    arrival_ms,
                };
                match router.route(req, now) {
                    Routed::Placed(p) => p,
                    Routed::Queued => return,
                }
            }
        };
        self.place(pool, placement);
    }

    /// Hands a placed request to its worker.
    fn place(&mut self, pool: usize, p: Placement) {
        let role = self.pools[pool].role;
        let bs = self.pools[pool].engine.block_size;
        let flight = self.flights.get_mut(&p.id).expect("placed request is in flight");
        let overlap_tokens = (p.overlap_blocks * bs).min(flight.prompt.len());
        let dp = self.pools[pool].dp;
        self.collector.placed(p.id, role, p.target / dp, p.target % dp, overlap_tokens, p.queued_at_ms, self.now);
        match role {
            Stage::Aggregated => flight.decode_worker = Some(p.target as u32),
            Stage::Prefill => flight.prefill_worker = Some(p.target as u32),
            Stage::Decode => flight.decode_worker = Some(p.target as u32),
        }
        let request = self.engine_request(p.id, role == Stage::Prefill);
        if role == Stage::Decode {
            // Disaggregated pools have one rank per worker. The request waits on the worker for
            // its blocks; an idle worker tries at once, a busy one when its pass ends.
            let worker = &mut self.pools[pool].workers[p.target];
            if let Err(reason) = worker.ranks[0].engine.accept_destination(request) {
                if self.flights[&p.id].prefilled {
                    self.source_release(p.id);
                }
                self.router_edge(pool, p.id, true);
                self.finish(p.id, Finish::Rejected(reason));
                return;
            }
            if !worker.busy {
                self.retry_destination(pool, p.target);
            }
        } else {
            let dp = self.pools[pool].dp;
            self.pools[pool].workers[p.target / dp].ranks[p.target % dp].engine.submit(request);
        }
    }

    /// Decode worker `w` tries to reserve blocks for the oldest request waiting there; when it
    /// gets them, the transfer starts (or, SGLang, the prefill: its decode side reserves first).
    fn retry_destination(&mut self, pool: usize, w: usize) {
        let Some(Reserved { request: id, reused_tokens }) =
            self.pools[pool].workers[w].ranks[0].engine.retry_destination()
        else {
            return;
        };
        self.collector.destination_reserved(id, self.now);
        let flight = self.flights.get_mut(&id).expect("reserved request is in flight");
        flight.reserved = Some(reused_tokens);
        if flight.prefilled {
            self.start_transfer(id);
        } else if flight.prefill_worker.is_none() {
            let arrival = self.collector.arrival_of(id);
            self.route(0, id, arrival);
        }
    }

    /// Both sides are ready (prompt computed, destination reserved): the KV starts moving.
    fn start_transfer(&mut self, id: u64) {
        let flight = &self.flights[&id];
        let prompt_len = flight.prompt.len() as u64;
        let reused = flight.reserved.expect("destination reserved") as u64;
        let prefill = &self.pools[0].engine;
        let tokens = match prefill.kv_transfer_timing_mode {
            KvTransferTimingMode::FullPrompt => prompt_len,
            // Whole blocks the destination lacks, the partial last block included.
            KvTransferTimingMode::DestinationMissing => {
                let bs = prefill.block_size as u64;
                (prompt_len.div_ceil(bs) - reused / bs) * bs
            }
        };
        let delay = whole_ns(prefill.kv_transfer_ms(tokens));
        self.schedule(self.now + delay, Event::TransferDone { request: id });
    }

    /// The request as an engine sees it; a prefill worker gets only the prompt (it emits one
    /// token nobody sees).
    fn engine_request(&self, id: u64, prefill_only: bool) -> EngineRequest {
        let flight = &self.flights[&id];
        EngineRequest {
            id,
            prompt: flight.prompt.clone(),
            max_output: if prefill_only { 1 } else { flight.max_output },
            token_seed: flight.token_seed,
            hashes: (!flight.hashes.is_empty()).then(|| flight.hashes.clone()),
            planned_output: if prefill_only { None } else { flight.output_tokens.clone() },
        }
    }

    /// The prefill worker may free the KV it holds for `id` (at the end of its current pass).
    fn source_release(&mut self, id: u64) {
        let prefill = self.flights[&id].prefill_worker.expect("prefilled") as usize;
        let worker = &mut self.pools[0].workers[prefill];
        if worker.busy {
            // Recorded now: the request may be gone by the time the pass ends.
            self.collector.source_released(id, worker.pass_end);
            worker.pending_releases.push(id);
        } else {
            worker.ranks[0].engine.release_held(id);
            self.collector.source_released(id, self.now);
        }
    }

    /// A request left the system: metrics, load driver.
    fn finish(&mut self, id: u64, finish: Finish) {
        let flight = self.flights.remove(&id).expect("finished request is in flight");
        self.collector.finish(id, self.now, finish);
        self.driver.on_complete(flight.session, self.now, finish == Finish::Completed);
        self.finished += 1;
    }

    /// The KV of a request reached its decode worker.
    /// (Activation is a command to the engine, applied between passes.)
    fn transfer_done(&mut self, id: u64) {
        let decode = self.flights[&id].decode_worker.expect("routed to a decode worker") as usize;
        let worker = &mut self.pools[1].workers[decode];
        if worker.busy {
            worker.pending_activations.push(id);
        } else {
            self.activate(decode, id);
        }
    }

    /// The decode worker takes the transferred KV; the prefill worker may let go of its copy.
    fn activate(&mut self, decode: usize, id: u64) {
        self.pools[1].workers[decode].ranks[0].engine.activate(id);
        self.collector.destination_activated(id, self.now);
        self.retry_destination(1, decode);
        self.source_release(id);
    }

    fn feed_router(&mut self, pool: usize, worker: usize, events: &[KvEvent]) {
        if let Placer::Kv(router) = &mut self.pools[pool].placer {
            router.apply_events(worker, events);
        }
    }

    /// Router lifecycle edges; requests the router releases from its queue are placed now.
    fn router_edge(&mut self, pool: usize, id: u64, finished: bool) {
        let released = match &mut self.pools[pool].placer {
            Placer::Kv(router) if finished => router.free(id),
            Placer::Kv(router) => router.prefill_completed(id),
            Placer::RoundRobin(_) => return,
        };
        for p in released {
            self.place(pool, p);
        }
    }

    /// Folds the results of a worker's last pass (every rank that ran) into the metrics, the
    /// routers and the load driver. Tokens and completions are stamped at the pass end (now).
    fn apply_pass(&mut self, pool: usize, w: usize) {
        let dp = self.pools[pool].dp;
        for r in 0..dp {
            let rank = &mut self.pools[pool].workers[w].ranks[r];
            if std::mem::take(&mut rank.ran) {
                let out = std::mem::take(&mut rank.output);
                self.apply_rank_pass(pool, w * dp + r, &out);
                self.pools[pool].workers[w].ranks[r].output = out;
            }
        }
        // A decode worker tries its oldest waiting destination at the end of every pass; then
        // the commands that waited for the pass to end are applied.
        if self.pools[pool].role == Stage::Decode {
            self.retry_destination(pool, w);
        }
        for id in std::mem::take(&mut self.pools[pool].workers[w].pending_releases) {
            self.pools[pool].workers[w].ranks[0].engine.release_held(id);
        }
        for id in std::mem::take(&mut self.pools[pool].workers[w].pending_activations) {
            self.activate(w, id);
        }
    }

    fn apply_rank_pass(&mut self, pool: usize, target: usize, out: &PassOutput) {
        let role = self.pools[pool].role;
        let now = self.now;
        if !out.kv_events.is_empty() {
            if self.config.kv_event_lag_ms > 0.0 {
                let batch = self.seq;
                self.lagged.insert(batch, (pool, target, out.kv_events.clone()));
                self.schedule(now + self.config.kv_event_lag_ms, Event::KvVisible { batch });
            } else {
                self.feed_router(pool, target, &out.kv_events);
            }
        }
        for a in &out.admissions {
            if role == Stage::Decode {
                self.collector.decode_admit(a.request, out.start_ms, a.reused_tokens);
            } else {
                self.collector.admit(a.request, out.start_ms, a.reused_tokens);
            }
        }
        let routed = matches!(self.pools[pool].placer, Placer::Kv(_));
        for t in &out.tokens {
            // The router's prefill edge: the prefill worker's only token, or the first visible one.
            let edge = role == Stage::Prefill || self.collector.token(t.request, now);
            if edge && routed {
                self.router_edge(pool, t.request, false);
            }
        }
        self.collector.count_pass(out, role != Stage::Prefill);
        for f in &out.finished {
            self.router_edge(pool, f.request, true);
            if role == Stage::Prefill && f.finish == Finish::Completed {
                // The prompt is done: its KV moves once a decode worker has room for it.
                self.collector.source_held(f.request, now);
                let flight = self.flights.get_mut(&f.request).expect("prefilled request is in flight");
                flight.prefilled = true;
                match (flight.decode_worker, flight.reserved) {
                    (None, _) => self.route(1, f.request, now),
                    (Some(_), Some(_)) => self.start_transfer(f.request),
                    (Some(_), None) => {} // the reservation is still waiting for room
                }
                continue;
            }
            self.finish(f.request, f.finish);
        }
    }
}
