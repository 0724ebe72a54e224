//! Host (G2) KV offload: a framework-neutral host cache with virtual-time transfers.
//!
//! This is the mechanism under Dynamo 1.6.1's vLLM `native_host_offload` (see
//! `docs/host-offload.md`): capacity in blocks, LRU eviction with recency epochs, entries
//! pinned while stored or loaded, and transfer timing. A private (per-DP-rank) cache moves
//! blocks over two FIFO lanes ([`FifoLane`], one per direction); a cluster-shared pool divides
//! its links by processor sharing ([`FairLink`]). The vLLM policy that decides which blocks to
//! store, look up and load, and when, belongs to the scheduler that drives [`HostTier`].

mod fair;
mod g3;
mod lane;
mod lru;
mod tier;

#[cfg(test)]
mod tests;

pub use fair::FairLink;
pub use g3::{Direction, G3Completion, G3IoStats, G3Stats, G3Tier, G3TierConfig, Probe};
pub use lane::{bytes_per_ms, FifoLane};
pub use tier::{Completed, HostLink, HostStats, HostTier, HostTierConfig, Kind, Lookup, StoreOutcome, TransferId};

/// A block's identity in both device and host caches: its sequence hash.
pub type BlockKey = u64;

use std::sync::{Arc, Mutex, MutexGuard};

/// A host cache that several DP ranks join: Dynamo's `cluster_shared` G2 pool. The replay
/// driver makes one per deployment and hands it to each rank it builds.
#[derive(Clone)]
pub struct SharedHostPool(Arc<Mutex<HostTier>>);

impl SharedHostPool {
    /// An empty pool; `config`'s rates are the pool's caps over all its clients.
    pub fn new(config: HostTierConfig) -> Self {
        Self(Arc::new(Mutex::new(HostTier::shared(config))))
    }

    /// `(capacity, resident, used)` blocks, as Dynamo's `g2_domains` reports them.
    pub fn occupancy(&self) -> (usize, usize, usize) {
        let tier = self.0.lock().expect("host pool lock");
        let (resident, used) = tier.occupancy();
        (tier.config().capacity_blocks, resident, used)
    }

    pub fn stats(&self) -> HostStats {
        self.0.lock().expect("host pool lock").stats()
    }

    /// Whether `self` and `other` are handles on one pool (a disaggregated deployment's
    /// prefill and decode workers join the same one).
    pub fn same_pool(&self, other: &SharedHostPool) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// One rank's handle on its host cache: a private cache, or its client id in a shared pool.
pub struct HostClient {
    tier: Arc<Mutex<HostTier>>,
    id: usize,
    shared: bool,
}

impl HostClient {
    pub fn private(config: HostTierConfig) -> Self {
        Self { tier: Arc::new(Mutex::new(HostTier::new(config))), id: 0, shared: false }
    }

    /// Joins `pool` with the rank's own link.
    pub fn join(pool: &SharedHostPool, link: HostLink) -> Self {
        let id = pool.0.lock().expect("host pool lock").register(link);
        Self { tier: Arc::clone(&pool.0), id, shared: true }
    }

    pub fn lock(&self) -> MutexGuard<'_, HostTier> {
        self.tier.lock().expect("host cache lock")
    }

    pub fn id(&self) -> usize {
        self.id
    }

    pub fn is_shared(&self) -> bool {
        self.shared
    }
}

/// A G3 tier that a deployment's workers share (`g3_offload` scope `cluster_shared`).
#[derive(Clone)]
pub struct SharedG3Pool(Arc<Mutex<G3Tier>>);

impl SharedG3Pool {
    pub fn new(config: G3TierConfig, shared_read_gbps: f64, shared_write_gbps: f64) -> Self {
        Self(Arc::new(Mutex::new(G3Tier::shared(config, shared_read_gbps, shared_write_gbps))))
    }

    pub fn stats(&self) -> G3Stats {
        self.0.lock().expect("G3 pool lock").stats()
    }
}

/// One worker's handle on its G3 tier: its own, or its id in a shared pool.
pub struct G3Client {
    tier: Arc<Mutex<G3Tier>>,
    id: usize,
    shared: bool,
}

impl G3Client {
    pub fn probe(&self, key: BlockKey) -> Probe {
        self.lock().probe(key)
    }

    pub fn contains(&self, key: BlockKey) -> bool {
        self.lock().contains(key)
    }

    pub fn submit(&self, direction: Direction, keys: &[BlockKey], now_ms: f64) -> Option<u64> {
        self.lock().submit(self.id, direction, keys, now_ms)
    }

    pub fn job_keys(&self, job: u64) -> Vec<BlockKey> {
        self.lock().job_keys(job).to_vec()
    }

    pub fn take_completed(&self, now_ms: f64) -> Vec<G3Completion> {
        self.lock().take_completed(self.id, now_ms)
    }

    pub fn next_deadline(&self) -> Option<f64> {
        self.lock().next_deadline(self.id)
    }

    pub fn sync(&self, now_ms: f64) -> u64 {
        self.lock().sync(now_ms)
    }

    pub fn next_event_after(&self, after_ms: f64) -> Option<f64> {
        self.lock().next_event_after(after_ms)
    }

    pub fn stats(&self) -> G3Stats {
        self.lock().stats()
    }

    pub fn note_bypassed_restore(&self) {
        self.lock().note_bypassed_restore();
    }

    pub fn own(config: G3TierConfig) -> Self {
        Self { tier: Arc::new(Mutex::new(G3Tier::new(config))), id: 0, shared: false }
    }

    pub fn join(pool: &SharedG3Pool) -> Self {
        let id = pool.0.lock().expect("G3 pool lock").register();
        Self { tier: Arc::clone(&pool.0), id, shared: true }
    }

    pub fn lock(&self) -> MutexGuard<'_, G3Tier> {
        self.tier.lock().expect("G3 tier lock")
    }

    pub fn id(&self) -> usize {
        self.id
    }

    pub fn is_shared(&self) -> bool {
        self.shared
    }
}
