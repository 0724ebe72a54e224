//! Where a request goes within a pool: round robin or Dynamo's KV router over the pool's
//! targets, one per (worker, attention-DP rank): `target = worker × dp + rank`.
//!
//! Workers can join and leave: a worker that is starting or draining takes no new requests
//! (round robin cycles through the active workers only; the KV router scores only their
//! ranks), and requests already placed on a draining worker finish there.

use servesim_engine::{HostKvEvent, KvEvent, Role};
use std::sync::Arc;

use servesim_router::{
    KvRouter, Placement, PrefillLoadEstimator, QueuePolicy, RoundRobin, RouteRequest, Routed, RouterConfig,
};

use crate::edges::Edge;
use crate::topology::PoolSpec;

/// How requests are assigned to workers.
#[derive(Clone, Debug, PartialEq)]
pub enum RouterMode {
    RoundRobin,
    KvRouter(RouterConfig),
}

impl RouterMode {
    /// The KV router's configuration, if requests go through one.
    pub fn kv_config_mut(&mut self) -> Option<&mut RouterConfig> {
        match self {
            RouterMode::KvRouter(rc) => Some(rc),
            RouterMode::RoundRobin => None,
        }
    }
}

enum Kind {
    RoundRobin(Rotation),
    Kv(Box<KvRouter>),
}

/// Round robin over (worker, rank) targets, in the two orders Dynamo's replay uses.
///
/// - Aggregated pools: a counter picks the next active worker, then that worker's own counter
///   picks its rank. With a fixed set of workers this visits every worker's rank 0, then every
///   worker's rank 1, and so on; a worker that joins starts at its rank 0 while the others go
///   on from where they were.
/// - Prefill and decode pools (`flat`): one counter over the active workers' targets in order,
///   every rank of a worker before the next worker (0.0, 0.1, 1.0, 1.1).
#[derive(Clone, Debug, Default)]
struct Rotation {
    flat: bool,
    workers: RoundRobin,
    /// The next rank of each worker slot.
    next_rank: Vec<u32>,
}

impl Rotation {
    fn pick(&mut self, active: &[usize], dp: usize) -> usize {
        if self.flat {
            let i = self.workers.pick(active.len() * dp);
            return active[i / dp] * dp + i % dp;
        }
        let worker = active[self.workers.pick(active.len())];
        if self.next_rank.len() <= worker {
            self.next_rank.resize(worker + 1, 0);
        }
        let rank = self.next_rank[worker] as usize % dp;
        self.next_rank[worker] = rank as u32 + 1;
        worker * dp + rank
    }
}

/// Places the requests of one pool.
pub struct Placer {
    kind: Kind,
    dp: usize,
    /// Worker slots ever created (removed workers keep theirs: targets are stable).
    slots: usize,
    /// Workers that take new requests, in the order round robin visits them.
    active: Vec<usize>,
}

impl std::fmt::Debug for Placer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.is_kv() { "kv" } else { "round_robin" };
        f.debug_struct("Placer").field("kind", &kind).field("active", &self.active).finish()
    }
}

/// The router configuration a pool of `role` uses (Dynamo tunes the prefill and decode
/// routers differently).
pub fn router_config_for(role: Role, config: &RouterConfig) -> RouterConfig {
    match role {
        Role::Aggregated => config.clone(),
        Role::Prefill => config.for_prefill(),
        Role::Decode => config.for_decode(),
    }
}

/// The router configuration in front of `pool`: its role's, with the queue policy its workers'
/// arguments name (Dynamo's `dynamo.router_queue_policy` replaces the router configuration's).
pub fn pool_router_config(pool: &PoolSpec, config: &RouterConfig) -> RouterConfig {
    let mut rc = router_config_for(pool.role, config);
    if let Some(policy) = pool.deployment.router_queue_policy {
        rc.queue_policy = match policy {
            "lcfs" => QueuePolicy::Lcfs,
            "wspt" => QueuePolicy::Wspt,
            _ => QueuePolicy::Fcfs,
        };
    }
    rc
}

impl Placer {
    /// A placer for `pool`'s initial workers, all active.
    pub fn new(pool: &PoolSpec, mode: &RouterMode, seed: u64) -> Placer {
        let slots = pool.workers as usize;
        let dp = pool.dp();
        let kind = match mode {
            RouterMode::RoundRobin => {
                Kind::RoundRobin(Rotation { flat: pool.role != Role::Aggregated, ..Rotation::default() })
            }
            RouterMode::KvRouter(rc) => {
                let budget = pool.engine.max_num_batched_tokens.unwrap_or(8192);
                let rc = pool_router_config(pool, rc);
                Kind::Kv(Box::new(KvRouter::new(rc, slots * dp, pool.engine.block_size, budget, seed)))
            }
        };
        Placer { kind, dp, slots, active: (0..slots).collect() }
    }

    /// Gives the KV router the model `router_prefill_load_model: ais` predicts prefill times
    /// with (round robin has no use for it).
    pub fn with_prefill_load_estimator(mut self, estimator: Option<Arc<dyn PrefillLoadEstimator>>) -> Placer {
        if let Kind::Kv(router) = self.kind {
            self.kind = Kind::Kv(Box::new(router.with_prefill_load_estimator(estimator)));
        }
        self
    }

    /// The first prompt whose prefill time the router's load model could not predict, and why.
    pub fn error(&self) -> Option<&str> {
        match &self.kind {
            Kind::Kv(router) => router.error(),
            Kind::RoundRobin(_) => None,
        }
    }

    pub fn is_kv(&self) -> bool {
        matches!(self.kind, Kind::Kv(_))
    }

    /// Whether any worker takes new requests.
    pub fn has_active(&self) -> bool {
        !self.active.is_empty()
    }

    /// Places a request, or leaves it in the KV router's queue. Needs an active worker.
    pub fn route(&mut self, req: RouteRequest<'_>, now_ms: f64) -> Routed {
        debug_assert!(self.has_active(), "placing a request with no active worker");
        match &mut self.kind {
            Kind::RoundRobin(rr) => {
                let target = rr.pick(&self.active, self.dp);
                Routed::Placed(Placement {
                    id: req.id,
                    target,
                    overlap_blocks: 0,
                    best_overlap_blocks: None,
                    cost: 0.0,
                    queued_at_ms: None,
                })
            }
            Kind::Kv(router) => router.route(req, now_ms),
        }
    }

    /// The target round robin would pick next, without picking it (None for the KV router).
    pub fn peek_round_robin(&self) -> Option<usize> {
        match &self.kind {
            Kind::RoundRobin(rr) => Some(rr.clone().pick(&self.active, self.dp)),
            Kind::Kv(_) => None,
        }
    }

    /// Moves round robin past its next target (a request placed elsewhere took that turn).
    pub fn skip_round_robin(&mut self) {
        if let Kind::RoundRobin(rr) = &mut self.kind {
            rr.pick(&self.active, self.dp);
        }
    }

    /// KV events of `target` reach the router.
    pub fn kv_events(&mut self, target: usize, events: &[KvEvent]) {
        if let Kind::Kv(router) = &mut self.kind {
            router.apply_events(target, events);
        }
    }

    /// Host (G2) residency changes of `target` reach the router.
    pub fn host_kv_events(&mut self, target: usize, events: &[HostKvEvent]) {
        if let Kind::Kv(router) = &mut self.kind {
            router.apply_host_events(target, events);
        }
    }

    /// Router edge: request `id` produced its first token (its prompt no longer loads the
    /// target) at `now_ms`. Returns requests the router's queue releases.
    pub fn prefill_done(&mut self, id: u64, now_ms: f64) -> Vec<Placement> {
        match &mut self.kind {
            Kind::Kv(router) => router.prefill_completed(id, now_ms),
            Kind::RoundRobin(_) => Vec::new(),
        }
    }

    /// Router edge: request `id` left the pool at `now_ms`. Returns requests the queue
    /// releases.
    pub fn free(&mut self, id: u64, now_ms: f64) -> Vec<Placement> {
        match &mut self.kind {
            Kind::Kv(router) => router.free(id, now_ms),
            Kind::RoundRobin(_) => Vec::new(),
        }
    }

    /// Applies a router lifecycle edge at `now_ms`. Returns requests the queue releases.
    pub fn edge(&mut self, edge: Edge, now_ms: f64) -> Vec<Placement> {
        match edge {
            Edge::PrefillDone(id) => self.prefill_done(id, now_ms),
            Edge::Free(id) => self.free(id, now_ms),
        }
    }

    /// Requests waiting in the router's queue.
    pub fn queued(&self) -> usize {
        match &self.kind {
            Kind::Kv(router) => router.queued(),
            Kind::RoundRobin(_) => 0,
        }
    }

    /// A new worker slot, not yet active (it is starting). Returns its index.
    pub fn add_worker(&mut self) -> usize {
        if let Kind::Kv(router) = &mut self.kind {
            for _ in 0..self.dp {
                router.add_target();
            }
        }
        self.slots += 1;
        self.slots - 1
    }

    /// Whether `worker` takes new requests (it is ready, or it starts draining).
    pub fn set_active(&mut self, worker: usize, active: bool) {
        let pos = self.active.iter().position(|&w| w == worker);
        match (active, pos) {
            (true, None) => {
                let at = self.active.partition_point(|&w| w < worker);
                self.active.insert(at, worker);
            }
            (false, Some(p)) => {
                self.active.remove(p);
            }
            _ => {}
        }
        if let Kind::Kv(router) = &mut self.kind {
            for rank in 0..self.dp {
                router.set_eligible(worker * self.dp + rank, active);
            }
        }
    }

    /// The worker is gone: the router forgets what it had cached.
    pub fn remove_worker(&mut self, worker: usize) {
        self.set_active(worker, false);
        if let Kind::Kv(router) = &mut self.kind {
            for rank in 0..self.dp {
                router.forget(worker * self.dp + rank);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::Topology;
    use servesim_engine::WorkerArgs;

    fn pool(workers: u32, dp: u32) -> PoolSpec {
        let args = WorkerArgs::parse_json(&format!(r#"{{"dp_size": {dp}}}"#)).unwrap();
        Topology::aggregated(args, workers).unwrap().pools()[0].clone()
    }

    fn place(p: &mut Placer, id: u64) -> usize {
        match p.route(
            RouteRequest {
                id,
                hashes: &[],
                isl: 16,
                priority: 0,
                strict_priority: 0,
                arrival_ms: 0.0,
                policy_class: None,
            },
            0.0,
        ) {
            Routed::Placed(pl) => pl.target,
            other => panic!("not placed: {other:?}"),
        }
    }

    #[test]
    fn round_robin_visits_workers_then_ranks_and_follows_the_active_set() {
        let mut p = Placer::new(&pool(2, 2), &RouterMode::RoundRobin, 0);
        // Targets are worker × 2 + rank: workers first, then ranks.
        assert_eq!((0..4).map(|i| place(&mut p, i)).collect::<Vec<_>>(), vec![0, 2, 1, 3]);
        assert_eq!(p.peek_round_robin(), Some(0));
        p.skip_round_robin();
        assert_eq!(place(&mut p, 5), 2);
        // A third worker joins (starting, then ready); worker 0 drains.
        let w = p.add_worker();
        assert_eq!(w, 2);
        p.set_active(w, true);
        p.set_active(0, false);
        let targets: Vec<usize> = (0..4).map(|i| place(&mut p, 10 + i)).collect();
        assert!(targets.iter().all(|t| t / 2 != 0), "draining worker 0 gets nothing: {targets:?}");
        assert!(targets.iter().any(|t| t / 2 == 2), "the new worker gets requests: {targets:?}");
    }

    #[test]
    fn a_joining_worker_starts_at_its_first_rank_and_the_others_keep_their_own_rank() {
        // Dynamo's aggregated round robin: the worker counter goes on from where it was in the
        // new active set, and each worker keeps the rank it would serve next.
        let mut p = Placer::new(&pool(1, 2), &RouterMode::RoundRobin, 0);
        assert_eq!((0..4).map(|i| place(&mut p, i)).collect::<Vec<_>>(), vec![0, 1, 0, 1]);
        let w = p.add_worker();
        p.set_active(w, true);
        // Worker 1 rank 0 (target 2), worker 0 rank 0 (0), worker 1 rank 1 (3), worker 0 rank 1.
        // (One counter over the four targets would have gone on with 1, 3, 0, 2.)
        assert_eq!((10..14).map(|i| place(&mut p, i)).collect::<Vec<_>>(), vec![2, 0, 3, 1]);
    }

    #[test]
    fn disaggregated_pools_go_through_every_rank_of_a_worker_before_the_next_worker() {
        // Dynamo 1.6.1's disaggregated replay, two decode workers of two ranks: decode
        // placements 0.0, 0.1, 1.0, 1.1, 0.0, ...
        let p = WorkerArgs::parse_json(r#"{"dp_size": 1}"#).unwrap();
        let d = WorkerArgs::parse_json(r#"{"dp_size": 2}"#).unwrap();
        let topology = Topology::disaggregated((p, 1), (d, 2)).unwrap();
        let mut placer = Placer::new(&topology.pools()[1], &RouterMode::RoundRobin, 0);
        assert_eq!((0..6).map(|i| place(&mut placer, i)).collect::<Vec<_>>(), vec![0, 1, 2, 3, 0, 1]);
        // Worker 0 drains: only worker 1's ranks are left.
        placer.set_active(0, false);
        let targets: Vec<usize> = (10..14).map(|i| place(&mut placer, i)).collect();
        assert!(targets.iter().all(|t| t / 2 == 1), "{targets:?}");
    }

    #[test]
    fn the_kv_router_skips_workers_that_are_not_active() {
        let mut p = Placer::new(&pool(2, 1), &RouterMode::KvRouter(RouterConfig::default()), 0);
        p.set_active(1, false);
        for i in 0..4 {
            assert_eq!(place(&mut p, i), 0);
        }
        let w = p.add_worker();
        for i in 0..2 {
            assert_eq!(place(&mut p, 10 + i), 0, "a starting worker takes nothing");
        }
        p.set_active(w, true);
        assert_eq!(place(&mut p, 20), 2, "the new, idle worker is the cheapest");
    }
}
