//! The private host cache of one DP rank: residency, LRU eviction and the two FIFO lanes.

use std::cmp::Ordering;
use std::collections::BTreeSet;

use rustc_hash::{FxHashMap, FxHashSet};

use super::lane::FifoLane;
use super::lru::Lru;
use super::BlockKey;
use crate::output::HostKvEvent;

/// Physical parameters of one private host cache.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HostTierConfig {
    pub capacity_blocks: usize,
    /// Bytes of one KV block: `block_size * kv_cache_bytes_per_token`.
    pub block_bytes: u64,
    /// Device-to-host rate in decimal GB/s; zero is unlimited.
    pub d2h_gbps: f64,
    /// Host-to-device rate in decimal GB/s; zero is unlimited.
    pub h2d_gbps: f64,
    /// Delay before a transfer moves its first byte.
    pub latency_to_first_byte_ms: f64,
}

impl HostTierConfig {
    /// Derive the cache from the engine keys, with the reference's validation messages.
    pub fn new(
        num_host_blocks: usize,
        block_size: usize,
        kv_cache_bytes_per_token: u64,
        d2h_gbps: f64,
        h2d_gbps: f64,
        latency_to_first_byte_ms: f64,
    ) -> Result<Self, String> {
        if num_host_blocks == 0 {
            return Err("native_host_offload.num_host_blocks must be positive".into());
        }
        for (name, value) in [
            ("d2h_bandwidth_gbps", d2h_gbps),
            ("h2d_bandwidth_gbps", h2d_gbps),
            ("latency_to_first_byte_ms", latency_to_first_byte_ms),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(format!("native_host_offload.{name} must be finite and non-negative"));
            }
        }
        let block_bytes = (block_size as u64).checked_mul(kv_cache_bytes_per_token).filter(|&bytes| bytes > 0).ok_or(
            "native_host_offload requires block_size * kv_cache_bytes_per_token to produce a positive, representable block size",
        )?;
        let capacity_bytes = (num_host_blocks as u64)
            .checked_mul(block_bytes)
            .ok_or("native_host_offload capacity in bytes overflowed")?;
        for (name, gbps) in [("d2h_bandwidth_gbps", d2h_gbps), ("h2d_bandwidth_gbps", h2d_gbps)] {
            let bytes_per_ms = gbps * 1e6;
            if !(bytes_per_ms.is_finite() && (gbps == 0.0 || (capacity_bytes as f64 / bytes_per_ms).is_finite())) {
                return Err(format!("native_host_offload.{name} produces an unrepresentable transfer duration"));
            }
        }
        Ok(Self { capacity_blocks: num_host_blocks, block_bytes, d2h_gbps, h2d_gbps, latency_to_first_byte_ms })
    }
}

/// Identity of one store or load, unique within a tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TransferId(pub u64);

/// What the host holds of one block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    Miss,
    /// Its store is prepared or copying; it cannot be loaded yet.
    Pending(TransferId),
    Hit,
}

/// Result of [`HostTier::prepare_store`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreOutcome {
    /// `blocks` new host entries were reserved; the copy starts at the next
    /// [`HostTier::submit_prepared`].
    Prepared { transfer: TransferId, blocks: usize },
    /// Every block is already resident or being stored.
    AlreadyPresent,
    /// Not enough free or evictable host blocks; nothing changed. `unfittable`: the cohort is
    /// larger than the whole cache, so no retry can succeed.
    RetryCapacity { unfittable: bool },
}

/// A transfer that finished, as [`HostTier::tick`] reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct Completed {
    pub kind: Kind,
    pub transfer: TransferId,
    pub request: u64,
    pub blocks: Vec<BlockKey>,
    pub at_ms: f64,
}

/// Direction of a transfer. Declaration order is the order of completions at one instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// Device to host (D2H).
    Store,
    /// Host to device (H2D).
    Load,
    /// Entries reserved for blocks that arrive from outside the device (a G3 promotion); never
    /// on a lane, completed by their owner.
    External,
}

/// Cumulative counts of one tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostStats {
    pub stores_completed: u64,
    pub blocks_stored: u64,
    pub bytes_stored: u64,
    pub loads_completed: u64,
    pub blocks_loaded: u64,
    pub bytes_loaded: u64,
    pub loads_cancelled: u64,
    pub blocks_evicted: u64,
    pub capacity_retries: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Storing(TransferId),
    Resident,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    state: State,
    /// Loads reading this block; a pinned block is not evictable.
    pins: u32,
}

struct Transfer {
    kind: Kind,
    request: u64,
    blocks: Vec<BlockKey>,
    /// Fixed once the transfer is on its lane.
    completes_at_ms: Option<f64>,
}

/// A queued completion; ordered by time, then stores before loads, then by id.
#[derive(Clone, Copy, Debug)]
struct Due {
    at_ms: f64,
    kind: Kind,
    transfer: TransferId,
}

impl Ord for Due {
    fn cmp(&self, other: &Self) -> Ordering {
        self.at_ms.total_cmp(&other.at_ms).then(self.kind.cmp(&other.kind)).then(self.transfer.cmp(&other.transfer))
    }
}

impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Due {}

/// One DP rank's private host (G2) KV cache, driven by virtual time in milliseconds.
///
/// The framework adapter decides which blocks to store, look up, touch and load; the tier owns
/// capacity, eviction and transfer timing. A block's host entry exists from the moment its
/// store is prepared (it counts against capacity and cannot be evicted) and becomes loadable
/// when the copy completes. Loads pin their source blocks until they finish or are cancelled.
/// Times given to it never go backwards, and every completion due by a time must be collected
/// with [`HostTier::tick`] before the tier is changed at that time.
pub struct HostTier {
    config: HostTierConfig,
    entries: FxHashMap<BlockKey, Entry>,
    lru: Lru,
    transfers: FxHashMap<TransferId, Transfer>,
    /// Stores prepared since the last submission, in preparation order.
    prepared: Vec<TransferId>,
    d2h: FifoLane,
    h2d: FifoLane,
    due: BTreeSet<Due>,
    now_ms: f64,
    next_id: u64,
    stats: HostStats,
    /// Residency changes not yet taken, when they are published ([`Self::publish_residency`]).
    residency: Option<Vec<HostKvEvent>>,
    /// Completed stores keep a pin on their blocks until [`HostTier::unpin_external`] (a G3
    /// below this tier takes them first).
    hold_completed: bool,
}

impl HostTier {
    pub fn new(config: HostTierConfig) -> Self {
        assert!(config.capacity_blocks > 0 && config.block_bytes > 0, "host tier needs capacity and a block size");
        Self {
            config,
            entries: FxHashMap::default(),
            lru: Lru::default(),
            transfers: FxHashMap::default(),
            prepared: Vec::new(),
            d2h: FifoLane::new(config.d2h_gbps),
            h2d: FifoLane::new(config.h2d_gbps),
            due: BTreeSet::new(),
            now_ms: 0.0,
            next_id: 0,
            stats: HostStats::default(),
            residency: None,
            hold_completed: false,
        }
    }

    /// Record residency changes from now on, for the router (Dynamo 1.6.1 subscribes a rank to
    /// its private host cache when the rank publishes KV events).
    pub fn publish_residency(&mut self) {
        self.residency.get_or_insert_with(Vec::new);
    }

    /// Moves the residency changes recorded since the last call to `out`.
    pub fn drain_residency(&mut self, out: &mut Vec<HostKvEvent>) {
        if let Some(events) = self.residency.as_mut() {
            out.append(events);
        }
    }

    /// From now on a completed store's blocks stay pinned, outside the LRU order, until
    /// [`Self::unpin_external`] releases them.
    pub fn hold_completed_sources(&mut self) {
        self.hold_completed = true;
    }

    /// Release one pin of each block (held store sources); the blocks this leaves unpinned
    /// become the most recent, together.
    pub fn unpin_external(&mut self, keys: &[BlockKey]) {
        self.unpin(keys);
    }

    /// Whether entries for `keys` could be reserved now without touching anything: the blocks
    /// missing fit in the free capacity plus the evictable blocks outside `keys`.
    pub fn can_reserve_external_prefix(&self, keys: &[BlockKey]) -> bool {
        let protected: FxHashSet<BlockKey> = keys.iter().copied().collect();
        let missing = protected.iter().filter(|key| !self.entries.contains_key(key)).count();
        let needed = missing.saturating_sub(self.config.capacity_blocks - self.entries.len());
        let entries = &self.entries;
        let victims = self.lru.oldest(needed, |key| {
            !protected.contains(&key) && entries.get(&key).is_some_and(|e| e.state == State::Resident && e.pins == 0)
        });
        victims.len() == needed
    }

    /// Reserve entries for blocks that will arrive from outside the device, as store admission
    /// does (evicting if it must) but with no copy on a lane: the owner completes or cancels it.
    pub fn reserve_external(&mut self, request: u64, keys: &[BlockKey], now_ms: f64) -> StoreOutcome {
        self.reserve(request, keys, now_ms, Kind::External)
    }

    /// The external blocks arrived: they become resident, each in turn the most recent.
    pub fn complete_external(&mut self, transfer: TransferId) {
        let t = self.transfers.remove(&transfer).expect("external reservation");
        assert_eq!(t.kind, Kind::External, "not an external reservation");
        for &key in &t.blocks {
            let entry = self.entries.get_mut(&key).expect("reserved entry");
            debug_assert_eq!(entry.state, State::Storing(transfer));
            entry.state = State::Resident;
            if entry.pins == 0 {
                self.lru.touch(key);
            }
        }
        // A promotion landing here is host residency like a completed store (Dynamo publishes
        // it in the same advance).
        if let Some(events) = self.residency.as_mut() {
            events.push(HostKvEvent::Stored { hashes: t.blocks });
        }
    }

    /// Roll back an external reservation.
    pub fn cancel_external(&mut self, transfer: TransferId) {
        let t = self.transfers.remove(&transfer).expect("external reservation");
        assert_eq!(t.kind, Kind::External, "not an external reservation");
        for key in &t.blocks {
            self.entries.remove(key);
        }
    }

    #[cfg(test)]
    pub(crate) fn pins(&self, key: BlockKey) -> u32 {
        self.entries.get(&key).map_or(0, |e| e.pins)
    }

    pub fn config(&self) -> &HostTierConfig {
        &self.config
    }

    pub fn stats(&self) -> HostStats {
        self.stats
    }

    /// `(resident, used)` blocks; used also counts the entries of stores in flight.
    pub fn occupancy(&self) -> (usize, usize) {
        let resident = self.entries.values().filter(|entry| entry.state == State::Resident).count();
        (resident, self.entries.len())
    }

    pub fn lookup(&self, key: BlockKey) -> Lookup {
        match self.entries.get(&key).map(|entry| entry.state) {
            None => Lookup::Miss,
            Some(State::Storing(transfer)) => Lookup::Pending(transfer),
            Some(State::Resident) => Lookup::Hit,
        }
    }

    /// Make a resident, unpinned block the most recently used; other blocks are outside the
    /// LRU order and are left alone.
    pub fn touch(&mut self, key: BlockKey) {
        if self.entries.get(&key).is_some_and(|entry| entry.state == State::Resident && entry.pins == 0) {
            self.lru.touch(key);
        }
    }

    /// vLLM's touch of a request's prompt blocks: in reverse, so the first block ends most recent.
    pub fn touch_prompt(&mut self, keys: &[BlockKey]) {
        for &key in keys.iter().rev() {
            self.touch(key);
        }
    }

    /// Reserve host entries for the blocks of `cohort` that the host lacks, evicting the least
    /// recently used resident, unpinned blocks outside the cohort when the cache is full. The
    /// copy is queued by the next [`Self::submit_prepared`]. All or nothing.
    pub fn prepare_store(&mut self, request: u64, cohort: &[BlockKey], now_ms: f64) -> StoreOutcome {
        self.reserve(request, cohort, now_ms, Kind::Store)
    }

    fn reserve(&mut self, request: u64, cohort: &[BlockKey], now_ms: f64, kind: Kind) -> StoreOutcome {
        self.mutate_at(now_ms);
        let mut protected = FxHashSet::default();
        let missing: Vec<BlockKey> =
            cohort.iter().copied().filter(|&key| protected.insert(key) && !self.entries.contains_key(&key)).collect();
        if missing.is_empty() {
            return StoreOutcome::AlreadyPresent;
        }
        let free = self.config.capacity_blocks - self.entries.len();
        let needed = missing.len().saturating_sub(free);
        let entries = &self.entries;
        let victims = self.lru.oldest(needed, |key| {
            !protected.contains(&key) && entries.get(&key).is_some_and(|e| e.state == State::Resident && e.pins == 0)
        });
        if victims.len() < needed {
            if kind == Kind::Store {
                self.stats.capacity_retries += 1;
            }
            return StoreOutcome::RetryCapacity { unfittable: protected.len() > self.config.capacity_blocks };
        }
        for &victim in &victims {
            self.entries.remove(&victim);
            self.lru.remove(victim);
            self.stats.blocks_evicted += 1;
        }
        if let Some(events) = self.residency.as_mut().filter(|_| !victims.is_empty()) {
            events.push(HostKvEvent::Removed { hashes: victims });
        }
        let transfer = self.allocate_id();
        for &key in &missing {
            self.entries.insert(key, Entry { state: State::Storing(transfer), pins: 0 });
        }
        let blocks = missing.len();
        self.transfers.insert(transfer, Transfer { kind, request, blocks: missing, completes_at_ms: None });
        if kind == Kind::Store {
            self.prepared.push(transfer);
        }
        StoreOutcome::Prepared { transfer, blocks }
    }

    /// Put the prepared stores on the D2H lane at an engine-pass boundary, in preparation
    /// order; they may start at `now_ms` plus the first-byte latency. Returns each store's fixed
    /// completion time.
    pub fn submit_prepared(&mut self, now_ms: f64) -> Vec<(TransferId, f64)> {
        self.mutate_at(now_ms);
        let ready = now_ms + self.config.latency_to_first_byte_ms;
        std::mem::take(&mut self.prepared)
            .into_iter()
            .map(|transfer| {
                let bytes = self.bytes(self.transfers[&transfer].blocks.len());
                let at_ms = self.d2h.push(ready, bytes);
                self.enqueue(transfer, at_ms);
                (transfer, at_ms)
            })
            .collect()
    }

    /// Queue a load of `blocks` that may start at `not_before_ms` (for instance when the device
    /// blocks it lands in have finished their own store). `None` when any block is not resident,
    /// the list is empty, repeats a block or exceeds the cache.
    pub fn schedule_load(
        &mut self,
        request: u64,
        blocks: &[BlockKey],
        now_ms: f64,
        not_before_ms: f64,
    ) -> Option<(TransferId, f64)> {
        let now_ms = self.mutate_at(now_ms);
        let mut seen = FxHashSet::default();
        let loadable = !blocks.is_empty()
            && blocks.len() <= self.config.capacity_blocks
            && blocks.iter().all(|key| {
                seen.insert(*key) && self.entries.get(key).is_some_and(|entry| entry.state == State::Resident)
            });
        if !loadable {
            return None;
        }
        for key in blocks {
            let entry = self.entries.get_mut(key).expect("validated load source");
            if entry.pins == 0 {
                self.lru.remove(*key);
            }
            entry.pins += 1;
        }
        let transfer = self.allocate_id();
        let ready = now_ms.max(not_before_ms) + self.config.latency_to_first_byte_ms;
        let at_ms = self.h2d.push(ready, self.bytes(blocks.len()));
        self.transfers
            .insert(transfer, Transfer { kind: Kind::Load, request, blocks: blocks.to_vec(), completes_at_ms: None });
        self.enqueue(transfer, at_ms);
        Some((transfer, at_ms))
    }

    /// Withdraw a queued load and unpin its sources. The H2D lane keeps the time it had
    /// booked. False when the load already completed or never existed.
    pub fn cancel_load(&mut self, transfer: TransferId, now_ms: f64) -> bool {
        if self.transfers.get(&transfer).is_none_or(|t| t.kind != Kind::Load) {
            return false;
        }
        self.mutate_at(now_ms);
        let Transfer { blocks, completes_at_ms, .. } = self.transfers.remove(&transfer).expect("queued load");
        let at_ms = completes_at_ms.expect("a queued load has a completion time");
        assert!(self.due.remove(&Due { at_ms, kind: Kind::Load, transfer }));
        self.unpin(&blocks);
        self.stats.loads_cancelled += 1;
        true
    }

    /// Complete every transfer due by `now_ms`, in time order (stores before loads at one
    /// instant, then by id). A store makes its blocks resident; a load unpins its sources.
    pub fn tick(&mut self, now_ms: f64) -> Vec<Completed> {
        assert!(now_ms.is_finite() && now_ms >= self.now_ms, "host tier time cannot go backwards");
        self.now_ms = now_ms;
        let mut completed = Vec::new();
        while let Some(due) = self.due.first().copied().filter(|due| due.at_ms <= now_ms) {
            self.due.pop_first();
            let Transfer { kind, request, blocks, .. } = self.transfers.remove(&due.transfer).expect("due transfer");
            let bytes = self.bytes(blocks.len());
            match kind {
                Kind::Store => {
                    for key in &blocks {
                        let entry = self.entries.get_mut(key).expect("stored block keeps its entry");
                        debug_assert_eq!(entry.state, State::Storing(due.transfer));
                        entry.state = State::Resident;
                        entry.pins += u32::from(self.hold_completed);
                    }
                    if !self.hold_completed {
                        self.lru.touch_together(&blocks);
                    }
                    if let Some(events) = self.residency.as_mut() {
                        events.push(HostKvEvent::Stored { hashes: blocks.clone() });
                    }
                    self.stats.stores_completed += 1;
                    self.stats.blocks_stored += blocks.len() as u64;
                    self.stats.bytes_stored += bytes;
                }
                Kind::External => unreachable!("external reservations are not on a lane"),
                Kind::Load => {
                    self.unpin(&blocks);
                    self.stats.loads_completed += 1;
                    self.stats.blocks_loaded += blocks.len() as u64;
                    self.stats.bytes_loaded += bytes;
                }
            }
            completed.push(Completed { kind, transfer: due.transfer, request, blocks, at_ms: due.at_ms });
        }
        completed
    }

    /// When the next queued transfer completes.
    pub fn next_deadline(&self) -> Option<f64> {
        self.due.first().map(|due| due.at_ms)
    }

    /// Fixed completion time of a transfer on a lane; `None` for a prepared store not yet
    /// submitted, or a transfer that is over.
    pub fn completes_at(&self, transfer: TransferId) -> Option<f64> {
        self.transfers.get(&transfer)?.completes_at_ms
    }

    /// The transfer is prepared or on a lane.
    pub fn is_in_flight(&self, transfer: TransferId) -> bool {
        self.transfers.contains_key(&transfer)
    }

    /// Transfers are prepared or queued.
    pub fn has_work(&self) -> bool {
        !self.transfers.is_empty()
    }

    fn enqueue(&mut self, transfer: TransferId, at_ms: f64) {
        let entry = self.transfers.get_mut(&transfer).expect("transfer to queue");
        entry.completes_at_ms = Some(at_ms);
        self.due.insert(Due { at_ms, kind: entry.kind, transfer });
    }

    fn unpin(&mut self, blocks: &[BlockKey]) {
        let mut freed = Vec::new();
        for key in blocks {
            let entry = self.entries.get_mut(key).expect("load source keeps its entry");
            entry.pins = entry.pins.checked_sub(1).expect("load source was pinned");
            if entry.pins == 0 && entry.state == State::Resident {
                freed.push(*key);
            }
        }
        self.lru.touch_together(&freed);
    }

    /// The time a change takes effect: never before the tier's present (a command stamped
    /// earlier than the last tick acts now), and never past a completion not yet ticked.
    fn mutate_at(&mut self, now_ms: f64) -> f64 {
        assert!(now_ms.is_finite() && now_ms >= 0.0, "host tier time must be finite and non-negative");
        let now_ms = now_ms.max(self.now_ms);
        assert!(
            self.next_deadline().is_none_or(|at| at >= now_ms),
            "host completions due before {now_ms} ms must be ticked first"
        );
        self.now_ms = now_ms;
        now_ms
    }

    fn allocate_id(&mut self) -> TransferId {
        self.next_id += 1;
        TransferId(self.next_id - 1)
    }

    fn bytes(&self, blocks: usize) -> u64 {
        self.config.block_bytes * blocks as u64
    }
}
