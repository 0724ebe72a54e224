//! # servesim-router
//!
//! Request placement shared by the replay driver and the live frontend.
//!
//! [`RoundRobin`] cycles through targets. [`KvRouter`] is a copy of Dynamo's KV-aware router:
//! it learns which prefix blocks each target holds from the engines' KV events ([`Indexer`]),
//! tracks the load it has placed ([`ActiveLoad`]), scores every target as
//!
//! ```text
//! cost = prefill_load_scale × max(0, (pending prefill tokens + prompt) / block_size
//!                                    − overlap_score_credit × decay × cached prefix blocks)
//!        + active blocks + the request's blocks not yet active there
//!        + decode_active_request_weight × active requests
//! ```
//!
//! (with a host (G2) KV cache, the cached prefix counts the host-resident blocks that continue
//! the device prefix at `host_cache_hit_weight` each, as [`CachedPrefix::effective`] does)
//! and picks the cheapest (ties: a seeded uniform draw) or samples a softmax when
//! a temperature is set. With a queue threshold, requests wait in a [`RouterQueue`] while every
//! target is busy prefilling; a [`PolicyProfile`] splits that queue into policy classes
//! ([`policy`]).
//!
//! With `router_prefill_load_model: ais` the pending prefill tokens decay over time (see
//! [`load`]): a [`PrefillLoadEstimator`] predicts each placed prompt's prefill time. The router
//! crate only defines that trait; the data-driven AIS model implements it elsewhere (the CLI
//! wires it in), separately from the engines' timing, as Dynamo keeps `ais_perf_config` apart
//! from the workers' timing model.

mod chain_tree;
pub mod config;
pub mod indexer;
pub mod load;
pub mod policy;
pub mod queue;
pub mod queue_policy;
pub mod yaml_scan;

use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha12Rng;
use servesim_engine::{HostKvEvent, KvEvent};

pub use config::{PrefillLoadModel, QueuePolicy, RouterConfig};
pub use indexer::Indexer;
pub use load::ActiveLoad;
pub use policy::{PolicyClass, PolicyConfig, PolicyError, PolicyProfile};
pub use queue::{Pending, QueueRejection, RouterQueue};

/// Cycles through targets in order.
#[derive(Clone, Debug, Default)]
pub struct RoundRobin {
    next: usize,
}

impl RoundRobin {
    /// The next of `targets` targets. The counter is not wrapped, so when the number of
    /// targets changes (workers join or leave) the next pick is `(last + 1) mod n` in the new
    /// count, as Dynamo's replay placement does.
    pub fn pick(&mut self, targets: usize) -> usize {
        let t = self.next % targets;
        self.next = t + 1;
        t
    }
}

/// The router's prompt-side load model: how long a target takes to prefill one request alone.
pub trait PrefillLoadEstimator: Send + Sync + std::fmt::Debug {
    /// Milliseconds to prefill `new_tokens` prompt tokens of one request whose first
    /// `prefix_tokens` are already cached, or why that cannot be predicted.
    fn prefill_ms(&self, new_tokens: u32, prefix_tokens: u32) -> Result<f64, String>;
}

/// Simulated milliseconds as the router's clock (Dynamo's replay: an epoch plus
/// `Duration::from_secs_f64(ms / 1000)`).
fn clock(now_ms: f64) -> Duration {
    Duration::from_secs_f64(now_ms.max(0.0) / 1000.0)
}

/// A request to place.
#[derive(Clone, Copy, Debug)]
pub struct RouteRequest<'a> {
    pub id: u64,
    /// Sequence hashes of the prompt's full blocks at the engines' block size.
    pub hashes: &'a [u64],
    pub isl: u32,
    pub priority: i32,
    pub strict_priority: u32,
    pub arrival_ms: f64,
    /// The router policy class (or family) the request asks for.
    pub policy_class: Option<&'a str>,
}

/// A target's cached prefix of a request: blocks its device holds from the first, and the
/// blocks its host (G2) cache holds right after those.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CachedPrefix {
    pub device: u32,
    pub host: u32,
}

impl CachedPrefix {
    /// The prefix in device-block equivalents: host blocks count `host_weight` each (Dynamo's
    /// effective overlap).
    pub fn effective(self, host_weight: f64) -> f64 {
        self.device as f64 + self.host as f64 * host_weight
    }
}

/// Where a request went and why.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Placement {
    pub id: u64,
    pub target: usize,
    /// Prefix blocks the router believed the target had cached on its device.
    pub overlap_blocks: u32,
    /// The most prefix blocks any eligible target had cached (`overlap_blocks` short of it is
    /// the placement's overlap regret); `None` when no cache was consulted (round robin).
    pub best_overlap_blocks: Option<u32>,
    pub cost: f64,
    /// When the request entered the router queue, if it waited there.
    pub queued_at_ms: Option<f64>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Routed {
    Placed(Placement),
    Queued,
    /// Its policy class's queue is full (Dynamo stops the replay with this error).
    Rejected(QueueRejection),
}

pub struct KvRouter {
    cfg: RouterConfig,
    num_targets: usize,
    /// Targets that may receive requests (a worker starting up or draining takes none).
    eligible: Vec<bool>,
    block_size: u32,
    /// What the busy thresholds of the policy classes are fractions of.
    max_num_batched_tokens: u32,
    indexer: Indexer,
    load: ActiveLoad,
    queue: RouterQueue,
    rng: ChaCha12Rng,
    /// Per-target (cost, cached prefix) of the request being placed.
    scores: Vec<(f64, CachedPrefix)>,
    estimator: Option<Arc<dyn PrefillLoadEstimator>>,
    /// Why a placed prompt's prefill time could not be predicted (the first time it happened).
    error: Option<String>,
}

impl KvRouter {
    pub fn new(cfg: RouterConfig, targets: usize, block_size: u32, max_num_batched_tokens: u32, seed: u64) -> Self {
        KvRouter {
            max_num_batched_tokens,
            num_targets: targets,
            eligible: vec![true; targets],
            indexer: Indexer::new(targets),
            load: ActiveLoad::new(targets, cfg.track_active_blocks, cfg.assume_kv_reuse),
            queue: RouterQueue::new(
                cfg.policy_profile
                    .as_deref()
                    .cloned()
                    .unwrap_or_else(|| PolicyProfile::synthetic(cfg.queue_threshold, cfg.queue_policy)),
            ),
            rng: ChaCha12Rng::seed_from_u64(seed),
            scores: Vec::with_capacity(targets),
            block_size,
            cfg,
            estimator: None,
            error: None,
        }
    }

    /// Sets the model `router_prefill_load_model: ais` predicts prefill times with.
    pub fn with_prefill_load_estimator(mut self, estimator: Option<Arc<dyn PrefillLoadEstimator>>) -> Self {
        self.estimator = estimator;
        self
    }

    /// The first prompt whose prefill time the load model could not predict, and why. That
    /// prompt counts in full without decaying (as in Dynamo, which logs a warning); a driver
    /// that must not go on with it checks this after routing.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    pub fn config(&self) -> &RouterConfig {
        &self.cfg
    }

    pub fn indexer(&self) -> &Indexer {
        &self.indexer
    }

    pub fn load(&self) -> &ActiveLoad {
        &self.load
    }

    /// Requests waiting in the router queue.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Adds a target (initially ineligible, like a worker that is starting); returns its index.
    pub fn add_target(&mut self) -> usize {
        self.indexer.add_target();
        self.load.add_target();
        self.eligible.push(false);
        self.num_targets += 1;
        self.num_targets - 1
    }

    /// Whether `target` may receive requests. A target that leaves keeps the load already
    /// placed on it (its requests still finish there); its cache is forgotten when it is removed
    /// ([`KvRouter::forget`]).
    pub fn set_eligible(&mut self, target: usize, eligible: bool) {
        self.eligible[target] = eligible;
    }

    /// Forgets the cache of a removed target.
    pub fn forget(&mut self, target: usize) {
        self.eligible[target] = false;
        self.indexer.clear(target);
    }

    /// Feeds KV events a target published (at the moment the router gets to see them).
    pub fn apply_events(&mut self, target: usize, events: &[KvEvent]) {
        for e in events {
            self.indexer.apply(target, e);
        }
    }

    /// Feeds host (G2) residency changes a target published.
    pub fn apply_host_events(&mut self, target: usize, events: &[HostKvEvent]) {
        for e in events {
            self.indexer.apply_host(target, e);
        }
    }

    /// Whether every eligible target is busy for `class` (true when none is eligible).
    fn all_busy(&self, class: &PolicyClass, now: Duration) -> bool {
        all_busy(&self.load, &self.eligible, self.max_num_batched_tokens, class, now)
    }

    /// `target`'s cached prefix of `hashes`. Host blocks are looked up only when some target
    /// reports them and they carry weight (Dynamo skips a tier of weight 0).
    fn cached_prefix(&self, target: usize, hashes: &[u64]) -> CachedPrefix {
        let device = self.indexer.overlap(target, hashes);
        let host = if self.indexer.has_host_tier() && self.cfg.host_cache_hit_weight > 0.0 {
            self.indexer.host_hits(target, hashes, device)
        } else {
            0
        };
        CachedPrefix { device, host }
    }

    /// Each target's cached prefix of `hashes`.
    fn overlaps(&self, hashes: &[u64]) -> Vec<CachedPrefix> {
        (0..self.num_targets).map(|t| self.cached_prefix(t, hashes)).collect()
    }

    /// Prompt tokens the eligible target with the longest device-cached prefix holds.
    fn best_cached_tokens(&self, overlaps: &[CachedPrefix], isl: u32) -> u32 {
        let best = (0..self.num_targets).filter(|&t| self.eligible[t]).map(|t| overlaps[t].device).max().unwrap_or(0);
        best.saturating_mul(self.block_size).min(isl)
    }

    /// Places a request now, or queues it in its policy class when every target is busy for
    /// that class (or others of the class already wait).
    pub fn route(&mut self, req: RouteRequest<'_>, now_ms: f64) -> Routed {
        let now = clock(now_ms);
        let profile = self.queue.profile();
        // The cache snapshot is taken only where it is needed: to pick a bucket, or for a
        // request that waits (which is later placed on the overlaps seen now, as in Dynamo).
        let (class, mut overlaps) = match profile.direct(req.policy_class) {
            Some(class) => (class, None),
            None => {
                let overlaps = self.overlaps(req.hashes);
                let cached = self.best_cached_tokens(&overlaps, req.isl);
                (profile.resolve(req.policy_class, (req.isl - cached) as u64), Some(overlaps))
            }
        };
        let cfg = profile.class(class);
        if cfg.queueing() && (self.queue.class_len(class) > 0 || self.all_busy(cfg, now)) {
            let overlaps = overlaps.take().unwrap_or_else(|| self.overlaps(req.hashes));
            let cached_tokens = self.best_cached_tokens(&overlaps, req.isl);
            let targets = self.eligible.iter().filter(|&&e| e).count();
            let pending = Pending {
                id: req.id,
                hashes: req.hashes.to_vec(),
                isl: req.isl,
                priority: req.priority,
                strict_priority: req.strict_priority,
                arrival_ms: req.arrival_ms,
                queued_at_ms: now_ms,
                cached_tokens,
                overlaps,
            };
            return match self.queue.push(class, targets, pending) {
                Ok(()) => Routed::Queued,
                Err(rejection) => Routed::Rejected(rejection),
            };
        }
        Routed::Placed(self.place(req, None, overlaps.as_deref(), now))
    }

    /// Predicted time to prefill `pending` new tokens behind `prefix` cached ones, if the load
    /// model is on.
    fn expected_prefill(&mut self, pending: u32, prefix: u32) -> Option<Duration> {
        if pending == 0 || self.cfg.prefill_load_model == PrefillLoadModel::None {
            return None;
        }
        let why = match &self.estimator {
            None => "router_prefill_load_model is ais but no prefill load estimator was given".to_string(),
            Some(e) => match e.prefill_ms(pending, prefix) {
                Ok(ms) if ms.is_finite() && ms >= 0.0 => return Some(Duration::from_secs_f64(ms / 1000.0)),
                Ok(ms) => {
                    format!("the prefill load model predicted {ms} ms for {pending} new tokens after {prefix} cached")
                }
                Err(why) => {
                    format!("the prefill load model cannot time {pending} new tokens after {prefix} cached: {why}")
                }
            },
        };
        self.error.get_or_insert(why);
        None
    }

    /// Scores every target for `req`, picks one and records the load there.
    /// `overlaps`: the cache overlap per target to score with (a queued request's, frozen when
    /// it was queued); `None` asks the indexer now.
    fn place(
        &mut self,
        req: RouteRequest<'_>,
        queued_at_ms: Option<f64>,
        overlaps: Option<&[CachedPrefix]>,
        now: Duration,
    ) -> Placement {
        self.score(&req, overlaps, now);
        let target = self.choose();
        let (cost, prefix) = self.scores[target];
        let overlap_blocks = prefix.device;
        // Dynamo rounds the effective prefix to tokens.
        let effective_tokens = (prefix.effective(self.cfg.host_cache_hit_weight) * self.block_size as f64).round();
        let cached_tokens = (effective_tokens as u32).min(req.isl);
        let pending = if self.cfg.track_prefill_tokens { req.isl - cached_tokens } else { 0 };
        let expected = self.expected_prefill(pending, cached_tokens);
        self.load.add(req.id, target, req.hashes, pending, expected, now);
        let best = self.scores.iter().filter(|s| s.0.is_finite()).map(|s| s.1.device).max().unwrap_or(overlap_blocks);
        Placement { id: req.id, target, overlap_blocks, best_overlap_blocks: Some(best), cost, queued_at_ms }
    }

    fn score(&mut self, req: &RouteRequest<'_>, overlaps: Option<&[CachedPrefix]>, now: Duration) {
        let bs = self.block_size as f64;
        let cfg = &self.cfg;
        let incoming_blocks = req.isl as f64 / bs;
        let least_prefill = (0..self.num_targets)
            .filter(|&t| self.eligible[t])
            .map(|t| self.load.prefill_tokens_at(t, now))
            .min()
            .unwrap_or(0);
        self.scores.clear();
        for t in 0..self.num_targets {
            if !self.eligible[t] {
                self.scores.push((f64::INFINITY, CachedPrefix::default()));
                continue;
            }
            let overlap = match overlaps {
                // A target added since the request was queued had nothing cached for it then.
                Some(frozen) => frozen.get(t).copied().unwrap_or_default(),
                None => self.cached_prefix(t, req.hashes),
            };
            let mut cost = 0.0;
            if cfg.track_prefill_tokens {
                let active_prefill = self.load.prefill_tokens_at(t, now);
                let excess = (active_prefill - least_prefill) as f64 / bs;
                let decay = if cfg.overlap_score_credit_decay > 0.0 && incoming_blocks > 0.0 {
                    1.0 / (1.0 + cfg.overlap_score_credit_decay * excess / incoming_blocks)
                } else {
                    1.0
                };
                let raw = (active_prefill + req.isl as u64) as f64 / bs;
                let credit = cfg.overlap_score_credit * decay * overlap.effective(cfg.host_cache_hit_weight);
                cost += cfg.prefill_load_scale * (raw - credit).max(0.0);
            }
            if cfg.track_active_blocks {
                cost += (self.load.blocks(t) + self.load.new_blocks(t, req.hashes)) as f64;
            }
            cost += cfg.decode_active_request_weight * self.load.requests(t) as f64;
            self.scores.push((cost, overlap));
        }
    }

    /// Index of the chosen target in `self.scores`.
    fn choose(&mut self) -> usize {
        if self.cfg.temperature > 0.0 {
            return self.sample_softmax();
        }
        let best = self.scores.iter().map(|s| s.0).fold(f64::INFINITY, f64::min);
        let tied: Vec<usize> = (0..self.scores.len()).filter(|&t| self.scores[t].0 == best).collect();
        // Dynamo 1.6.1 draws uniformly among tied targets (reservoir sampling). A smaller-cache
        // preference first, as some descriptions of its selector say, moved 6 of 80 fuzz cases
        // with kv_router beyond the reference's spread (tie-heavy ones: load tracking off, or
        // bursts before KV events land) that match with the plain draw.
        if tied.len() == 1 {
            tied[0]
        } else {
            tied[self.rng.random_range(0..tied.len())]
        }
    }

    /// Softmax over costs normalised by their range: `p ∝ exp(−cost / range / T)`.
    fn sample_softmax(&mut self) -> usize {
        let eligible = |s: &(f64, CachedPrefix)| s.0.is_finite();
        let (lo, hi) = self
            .scores
            .iter()
            .filter(|s| eligible(s))
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), s| (lo.min(s.0), hi.max(s.0)));
        let range = hi - lo;
        let weights: Vec<f64> = if range <= 0.0 {
            self.scores.iter().map(|s| if eligible(s) { 1.0 } else { 0.0 }).collect()
        } else {
            let z: Vec<f64> = self.scores.iter().map(|s| -(s.0 / range) / self.cfg.temperature).collect();
            let top = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            z.iter().map(|v| (v - top).exp()).collect()
        };
        let total: f64 = weights.iter().sum();
        let mut u = self.rng.random::<f64>() * total;
        for (t, w) in weights.iter().enumerate() {
            if u < *w {
                return t;
            }
            u -= w;
        }
        // Rounding left `u` past the end: the last target that could be drawn.
        weights.iter().rposition(|&w| w > 0.0).unwrap_or(weights.len() - 1)
    }

    /// The request produced its first token at `now_ms`. Returns requests released from the
    /// queue.
    pub fn prefill_completed(&mut self, id: u64, now_ms: f64) -> Vec<Placement> {
        self.load.prefill_done(id, clock(now_ms));
        self.drain(now_ms)
    }

    /// The request finished at `now_ms`. Returns requests released from the queue.
    pub fn free(&mut self, id: u64, now_ms: f64) -> Vec<Placement> {
        self.load.free(id, clock(now_ms));
        self.drain(now_ms)
    }

    /// Releases queued requests while some target is not busy at `now_ms`, scoring each with
    /// the load left by the ones released before it and the cache overlap it saw when it was
    /// queued (Dynamo 1.6.1 does not look the prefix up again: a request queued before a
    /// worker's KV events arrived is released with overlap 0 there).
    pub fn drain(&mut self, now_ms: f64) -> Vec<Placement> {
        let now = clock(now_ms);
        let mut released = Vec::new();
        loop {
            let (load, eligible, budget) = (&self.load, &self.eligible, self.max_num_batched_tokens);
            let Some(p) = self.queue.pop(|class| !all_busy(load, eligible, budget, class, now)) else {
                break;
            };
            let req = RouteRequest {
                id: p.id,
                hashes: &p.hashes,
                isl: p.isl,
                priority: p.priority,
                strict_priority: p.strict_priority,
                arrival_ms: p.arrival_ms,
                policy_class: None,
            };
            released.push(self.place(req, Some(p.queued_at_ms), Some(&p.overlaps), now));
        }
        released
    }
}

/// Whether every eligible target is busy for `class` (true when none is eligible).
fn all_busy(
    load: &ActiveLoad,
    eligible: &[bool],
    max_num_batched_tokens: u32,
    class: &PolicyClass,
    now: Duration,
) -> bool {
    (0..eligible.len())
        .filter(|&t| eligible[t])
        .all(|t| class.busy(load.prefill_tokens_at(t, now), max_num_batched_tokens))
}

#[cfg(test)]
mod tests {
    use super::*;
    use servesim_engine::StoredBlock;

    fn stored(hashes: &[u64]) -> KvEvent {
        KvEvent::Stored { parent: None, blocks: hashes.iter().map(|&h| StoredBlock { hash: h, local: h }).collect() }
    }

    fn req(id: u64, hashes: &[u64], isl: u32) -> RouteRequest<'_> {
        RouteRequest { id, hashes, isl, priority: 0, strict_priority: 0, arrival_ms: 0.0, policy_class: None }
    }

    fn placed(r: Routed) -> Placement {
        match r {
            Routed::Placed(p) => p,
            other => panic!("not placed: {other:?}"),
        }
    }

    #[test]
    fn cost_worked_examples() {
        // Block size 16; the numbers Dynamo 1.6.1 logs for the same sequence of requests.
        let mut r = KvRouter::new(RouterConfig::default(), 2, 16, 8192, 1);
        let a: Vec<u64> = (1..=6).collect(); // 100 tokens: 6.25 prefill blocks, 6 full blocks
        let p = placed(r.route(req(1, &a, 100), 0.0));
        assert_eq!(p.cost, 6.25 + 6.0);
        let t0 = p.target;
        // 200 tokens elsewhere: the loaded target would cost (100 + 200) / 16 + 6 + 12 = 36.75.
        let b: Vec<u64> = (101..=112).collect();
        let p = placed(r.route(req(2, &b, 200), 1.0));
        assert_eq!((p.target, p.cost), (1 - t0, 12.5 + 12.0));
        // The same prompt as the first: its blocks are already active there, so they add no
        // decode blocks: (100 + 100) / 16 + 6 = 18.5.
        let p = placed(r.route(req(3, &a, 100), 2.0));
        assert_eq!((p.target, p.cost), (t0, 18.5));
        // Once the blocks are cached and the requests are gone, the prefix is credited:
        // 100 / 16 − 6 + 6 = 6.25.
        r.apply_events(t0, &[stored(&a)]);
        for id in 1..=3 {
            r.free(id, 50.0);
        }
        let p = placed(r.route(req(4, &a, 100), 100.0));
        assert_eq!((p.target, p.overlap_blocks, p.cost), (t0, 6, 6.25));
    }

    #[test]
    fn ties_are_a_seeded_uniform_draw() {
        // Equal costs everywhere (no overlap with the request), caches of different sizes: the
        // cache size does not break the tie, every target is drawn about as often.
        let mut counts = [0u32; 3];
        let mut r = KvRouter::new(RouterConfig::default(), 3, 16, 8192, 7);
        r.apply_events(0, &[stored(&[50, 51])]);
        r.apply_events(2, &[stored(&[60])]);
        for i in 0..3000 {
            let p = placed(r.route(req(i, &[1], 16), 0.0));
            counts[p.target] += 1;
            r.free(i, 0.0);
        }
        assert!(counts.iter().all(|&c| (900..1100).contains(&c)), "{counts:?}");
        let draws = |seed| {
            let mut r = KvRouter::new(RouterConfig::default(), 4, 16, 8192, seed);
            (0..20).map(|i| placed(r.route(req(i, &[], 0), 0.0)).target).collect::<Vec<_>>()
        };
        assert_eq!(draws(3), draws(3), "same seed, same choices");
        assert_ne!(draws(3), draws(4));
    }

    #[test]
    fn host_blocks_after_the_device_prefix_count_at_their_weight() {
        // Target 0 holds blocks 1-2 on its device and 3-5 in host memory; target 1 holds 1-3
        // on its device. Six 16-token blocks: raw prefill 6 blocks, 6 new active blocks each.
        let hashes: Vec<u64> = (1..=6).collect();
        let setup = |cfg: RouterConfig| {
            let mut r = KvRouter::new(cfg, 2, 16, 8192, 1);
            r.apply_events(0, &[stored(&[1, 2])]);
            r.apply_host_events(0, &[HostKvEvent::Stored { hashes: vec![1, 2, 3, 4, 5] }]);
            r.apply_events(1, &[stored(&[1, 2, 3])]);
            r
        };
        // Default weight 0.75: target 0's prefix is 2 + 3 × 0.75 = 4.25 blocks, cost
        // (6 − 4.25) + 6 = 7.75 against (6 − 3) + 6 = 9.
        let mut r = setup(RouterConfig::default());
        let p = placed(r.route(req(1, &hashes, 96), 0.0));
        assert_eq!((p.target, p.overlap_blocks, p.best_overlap_blocks, p.cost), (0, 2, Some(3), 7.75));
        // Its pending prompt is what the effective prefix leaves: 96 − round(4.25 × 16) = 28.
        assert_eq!(r.load().prefill_tokens(0), 28);
        // Weight 0 ignores host memory: 10 against 9.
        let mut r = setup(RouterConfig { host_cache_hit_weight: 0.0, ..RouterConfig::default() });
        assert_eq!(placed(r.route(req(1, &hashes, 96), 0.0)).target, 1);
        // Evicting block 3 from host memory breaks the continuation: 2 blocks, cost 10.
        let mut r = setup(RouterConfig::default());
        r.apply_host_events(0, &[HostKvEvent::Removed { hashes: vec![3] }]);
        assert_eq!(placed(r.route(req(1, &hashes, 96), 0.0)).target, 1);
    }

    #[test]
    fn temperature_samples_cheaper_targets_more_often() {
        let cfg = RouterConfig { temperature: 0.5, ..RouterConfig::default() };
        let mut r = KvRouter::new(cfg, 2, 16, 8192, 11);
        let mut counts = [0; 2];
        for i in 0..2000u64 {
            // Target 0 keeps a 1000-token prefill pending, so it is always the dearer one.
            if i == 0 {
                r.load.add(u64::MAX, 0, &[], 1000, None, Duration::ZERO);
            }
            let p = placed(r.route(req(i, &[], 160), 0.0));
            counts[p.target] += 1;
            r.free(i, 0.0);
        }
        // Costs 72.5 and 10 (range 62.5): p(0) = 1 / (1 + e^2) ≈ 0.12.
        assert!(counts[0] > 150 && counts[0] < 330, "{counts:?}");
    }

    #[test]
    fn queue_holds_requests_while_every_target_is_busy() {
        let cfg = RouterConfig { queue_threshold: Some(0.5), ..RouterConfig::default() };
        let mut r = KvRouter::new(cfg, 1, 16, 64, 1);
        // 64 pending prefill tokens > 0.5 × 64: the only target is busy.
        let p = placed(r.route(req(1, &[], 64), 0.0));
        assert_eq!(r.route(req(2, &[], 10), 1.0), Routed::Queued);
        assert_eq!(r.route(req(3, &[], 10), 2.0), Routed::Queued);
        let released = r.prefill_completed(p.id, 3.0);
        assert_eq!(released.iter().map(|p| p.id).collect::<Vec<_>>(), vec![2, 3]);
        assert_eq!(released[0].queued_at_ms, Some(1.0));
        assert_eq!(r.queued(), 0);
    }

    /// A router with `targets` targets of block 16 and budget 64 over this policy profile.
    fn with_policy(yaml: &str, targets: usize) -> KvRouter {
        let profile = PolicyConfig::from_yaml(yaml).unwrap().profile(None).cloned().map(Arc::new);
        KvRouter::new(RouterConfig { policy_profile: profile, ..RouterConfig::default() }, targets, 16, 64, 1)
    }

    const CLASSES: &str = r#"
default_policy_family: batch
uncached_isl_buckets: [{min_tokens: 0, bucket: cached}, {min_tokens: 32, bucket: uncached}]
policy_classes:
  - {name: lat_c, policy_family: latency, cache_bucket: cached, quantum: 1, prefill_busy_threshold: 1000}
  - {name: lat_u, policy_family: latency, cache_bucket: uncached, quantum: 1, prefill_busy_threshold: 100}
  - {name: bat_c, policy_family: batch, cache_bucket: cached, quantum: 1, prefill_busy_threshold: 0}
  - {name: bat_u, policy_family: batch, cache_bucket: uncached, quantum: 1, prefill_busy_threshold: 0}
  - {name: capped, quantum: 1, prefill_busy_threshold: 0, request_queue_limit_per_worker: 1}
"#;

    fn classed<'a>(id: u64, hashes: &'a [u64], isl: u32, class: &'a str) -> RouteRequest<'a> {
        RouteRequest { policy_class: Some(class), ..req(id, hashes, isl) }
    }

    #[test]
    fn each_class_has_its_own_busy_threshold() {
        let mut r = with_policy(CLASSES, 1);
        placed(r.route(classed(1, &[], 200, "batch"), 0.0));
        // 200 pending tokens: busy for batch (> 0) and for uncached latency (> 100), not for
        // cached latency (> 1000). Nothing is cached: 10 tokens are the cached bucket (< 32),
        // 40 the uncached one.
        assert_eq!(r.route(classed(2, &[], 10, "batch"), 1.0), Routed::Queued);
        assert_eq!(r.route(classed(3, &[], 40, "latency"), 2.0), Routed::Queued);
        placed(r.route(classed(4, &[], 10, "latency"), 3.0));
        // 10 pending: idle enough for uncached latency, still busy for batch.
        let released = r.prefill_completed(1, 4.0);
        assert_eq!(released.iter().map(|p| p.id).collect::<Vec<_>>(), vec![3]);
        assert_eq!(r.queued(), 1);
        assert!(r.prefill_completed(4, 5.0).is_empty(), "40 pending: batch waits");
        let released = r.prefill_completed(3, 6.0);
        assert_eq!(released.iter().map(|p| (p.id, p.queued_at_ms)).collect::<Vec<_>>(), vec![(2, Some(1.0))]);
    }

    #[test]
    fn buckets_use_the_best_eligible_cache() {
        let hashes: Vec<u64> = (1..=4).collect();
        let cold: Vec<u64> = (100..=103).collect();
        let mut r = with_policy(CLASSES, 2);
        r.apply_events(0, &[stored(&hashes)]);
        placed(r.route(classed(1, &[9], 500, "batch"), 0.0));
        placed(r.route(classed(2, &[8], 500, "batch"), 0.0));
        // Both targets have 500 pending. 64 uncached tokens: uncached latency, busy above 100.
        assert_eq!(r.route(classed(3, &cold, 64, "latency"), 1.0), Routed::Queued);
        assert_eq!((r.queue.class_len(0), r.queue.class_len(1)), (0, 1));
        // All 64 cached on target 0: cached latency, busy only above 1000.
        placed(r.route(classed(4, &hashes, 64, "latency"), 1.0));
        // Target 0 no longer eligible: its cache does not count.
        r.set_eligible(0, false);
        assert_eq!(r.route(classed(5, &hashes, 64, "latency"), 1.0), Routed::Queued);
        assert_eq!((r.queue.class_len(0), r.queue.class_len(1)), (0, 2));
    }

    #[test]
    fn a_full_class_queue_rejects() {
        let mut r = with_policy(CLASSES, 1);
        placed(r.route(classed(1, &[], 10, "batch"), 0.0));
        assert_eq!(r.route(classed(2, &[], 10, "capped"), 1.0), Routed::Queued);
        match r.route(classed(3, &[], 10, "capped"), 2.0) {
            Routed::Rejected(e) => assert_eq!((e.class.as_str(), e.current, e.limit), ("capped", 1, 1)),
            other => panic!("{other:?}"),
        }
        assert_eq!(r.queued(), 1);
    }

    #[test]
    fn a_released_request_keeps_the_overlap_it_saw_when_queued() {
        // Probed on Dynamo 1.6.1: a request queued while the index was empty is released with
        // overlap 0 everywhere, though the prefix has since been stored on a worker.
        let cfg = RouterConfig { queue_threshold: Some(0.5), ..RouterConfig::default() };
        let mut r = KvRouter::new(cfg, 2, 16, 64, 1);
        let a = placed(r.route(req(1, &[7, 8], 64), 0.0));
        let b = placed(r.route(req(2, &[], 64), 0.0));
        assert_ne!(a.target, b.target);
        assert_eq!(r.route(req(3, &[7, 8, 9], 48), 0.0), Routed::Queued);
        r.apply_events(a.target, &[stored(&[7, 8])]);
        let released = r.prefill_completed(a.id, 10.0);
        assert_eq!(released.len(), 1);
        assert_eq!((released[0].overlap_blocks, released[0].best_overlap_blocks), (0, Some(0)));
        // A request routed now (nothing busy) sees the stored prefix.
        r.prefill_completed(b.id, 10.0);
        r.prefill_completed(3, 10.0);
        let d = placed(r.route(req(4, &[7, 8], 32), 10.0));
        assert_eq!(d.best_overlap_blocks, Some(2));
    }

    /// Predicts `ms_per_token` per new prompt token.
    #[derive(Debug)]
    struct PerToken(f64);

    impl PrefillLoadEstimator for PerToken {
        fn prefill_ms(&self, new_tokens: u32, prefix_tokens: u32) -> Result<f64, String> {
            if new_tokens > 10_000 {
                return Err(format!("no data for {new_tokens} tokens after {prefix_tokens}"));
            }
            Ok(self.0 * new_tokens as f64)
        }
    }

    fn ais() -> RouterConfig {
        RouterConfig { prefill_load_model: PrefillLoadModel::Ais, ..RouterConfig::default() }
    }

    #[test]
    fn prefill_load_model_decays_the_oldest_pending_prompt() {
        // 160 tokens (10 blocks) predicted at 0.1 ms per token: 16 ms.
        let mut r = KvRouter::new(ais(), 2, 16, 8192, 1).with_prefill_load_estimator(Some(Arc::new(PerToken(0.1))));
        let p = placed(r.route(req(1, &[], 160), 0.0));
        assert_eq!(p.cost, 10.0);
        let t0 = p.target;
        // 8 ms later half of it is left: 80 + 160 tokens = 15 blocks on t0, 10 on the other.
        r.route(req(2, &[], 160), 8.0);
        assert_eq!(r.load().prefill_tokens_at(t0, clock(8.0)), 80);
        // At 12 ms: t0 holds 40 (decaying), the other 160 in full (its anchor decays from 8 ms:
        // 160 × (1 − 4 / 16) = 120). The third request goes to t0: (40 + 160) / 16 = 12.5.
        let p = placed(r.route(req(3, &[], 160), 12.0));
        assert_eq!((p.target, p.cost), (t0, 12.5));
        // Its first request finishes at 14 ms: request 3 becomes the anchor then.
        r.prefill_completed(1, 14.0);
        assert_eq!(r.load().prefill_tokens_at(t0, clock(14.0)), 160);
        assert_eq!(r.load().prefill_tokens_at(t0, clock(22.0)), 80);
        assert_eq!(r.error(), None);
        // Without the model, nothing decays.
        let mut plain = KvRouter::new(RouterConfig::default(), 1, 16, 8192, 1);
        plain.route(req(1, &[], 160), 0.0);
        assert_eq!(plain.load().prefill_tokens_at(0, clock(1000.0)), 160);
    }

    #[test]
    fn prefill_load_model_errors_are_kept() {
        let mut r = KvRouter::new(ais(), 1, 16, 8192, 1).with_prefill_load_estimator(Some(Arc::new(PerToken(0.1))));
        r.route(req(1, &[], 20_000), 0.0);
        assert_eq!(r.load().prefill_tokens_at(0, clock(1e6)), 20_000, "an unpredicted prompt does not decay");
        assert!(r.error().unwrap().contains("cannot time 20000 new tokens after 0 cached: no data"), "{:?}", r.error());
        let mut missing = KvRouter::new(ais(), 1, 16, 8192, 1);
        missing.route(req(1, &[], 16), 0.0);
        assert!(missing.error().unwrap().contains("no prefill load estimator"));
    }

    #[test]
    fn ineligible_targets_get_nothing_until_they_join() {
        let mut r = KvRouter::new(RouterConfig::default(), 2, 16, 8192, 1);
        r.set_eligible(0, false);
        let h: Vec<u64> = (1..=4).collect();
        for id in 0..5 {
            assert_eq!(placed(r.route(req(id, &h, 64), 0.0)).target, 1, "target 0 is not eligible");
        }
        let t = r.add_target();
        assert_eq!(t, 2);
        assert_eq!(placed(r.route(req(9, &h, 64), 0.0)).target, 1, "a new target starts ineligible");
        r.set_eligible(2, true);
        assert_eq!(placed(r.route(req(10, &h, 64), 0.0)).target, 2, "the idle new target is cheapest");
        // With a temperature, ineligible targets are never sampled either.
        let cfg = RouterConfig { temperature: 1.0, ..RouterConfig::default() };
        let mut r = KvRouter::new(cfg, 3, 16, 8192, 7);
        r.set_eligible(1, false);
        for id in 0..50 {
            assert_ne!(placed(r.route(req(id, &h, 64), 0.0)).target, 1);
        }
    }

    #[test]
    fn round_robin_cycles() {
        let mut rr = RoundRobin::default();
        assert_eq!((0..5).map(|_| rr.pick(3)).collect::<Vec<_>>(), vec![0, 1, 2, 0, 1]);
    }
}
