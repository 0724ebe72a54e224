//! A host (G2) KV cache: residency, LRU eviction and transfer timing, private to one DP rank or
//! shared by the ranks of a deployment (`cluster_shared`).
//!
//! Its users are *clients*: a private cache has one (client 0), a shared pool one per DP rank
//! that joined it ([`HostTier::register`]). A transfer belongs to the client that started it;
//! its cache effects apply when it physically completes, whichever client's call advanced the
//! pool there, and the completion is delivered to its owner only, at the owner's next
//! [`HostTier::tick`].

use std::cmp::Ordering;
use std::collections::{BTreeSet, VecDeque};

use rustc_hash::{FxHashMap, FxHashSet};

use super::fair::FairLink;
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
    client: usize,
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

/// How transfers move.
enum Transport {
    /// A private cache: one FIFO lane per direction, completion times fixed when queued.
    Fifo { d2h: FifoLane, h2d: FifoLane, due: BTreeSet<Due> },
    /// A shared pool: each direction processor-shared under the clients' own rates and the
    /// pool's cap, so completion times are known only by advancing time.
    Fair { write: FairLink, read: FairLink },
}

/// The rates of one client's link to the host.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HostLink {
    pub d2h_gbps: f64,
    pub h2d_gbps: f64,
    pub latency_to_first_byte_ms: f64,
}

/// One user of the cache (a DP rank).
struct Client {
    link: HostLink,
    /// Stores prepared since the client's last submission, in preparation order.
    prepared: Vec<TransferId>,
    /// Completed transfers of this client not yet delivered by [`HostTier::tick`].
    done: VecDeque<Completed>,
    /// The pool's completion count when this client last ticked.
    seen_epoch: u64,
    /// Residency changes not yet taken, when the client publishes them.
    residency: Option<Vec<HostKvEvent>>,
    /// Completed stores keep a pin on their blocks until [`HostTier::unpin_external`] (a G3
    /// below this client takes them first).
    hold_completed: bool,
}

/// A host (G2) KV cache driven by virtual time in milliseconds.
///
/// The framework adapter decides which blocks to store, look up, touch and load; the tier owns
/// capacity, eviction and transfer timing. A block's host entry exists from the moment its
/// store is prepared (it counts against capacity and cannot be evicted) and becomes loadable
/// when the copy completes. Loads pin their source blocks until they finish or are cancelled.
/// In a private cache times never go backwards, and every completion due by a time must be
/// collected with [`HostTier::tick`] before the tier is changed at that time; a shared pool
/// advances itself to each change and keeps completions for their owners.
pub struct HostTier {
    config: HostTierConfig,
    entries: FxHashMap<BlockKey, Entry>,
    lru: Lru,
    transfers: FxHashMap<TransferId, Transfer>,
    transport: Transport,
    clients: Vec<Option<Client>>,
    /// Transfers completed (and external reservations settled) so far.
    epoch: u64,
    now_ms: f64,
    next_id: u64,
    stats: HostStats,
}

impl HostTier {
    /// A private cache with one client (0) whose link is the config's rates.
    pub fn new(config: HostTierConfig) -> Self {
        let link = HostLink {
            d2h_gbps: config.d2h_gbps,
            h2d_gbps: config.h2d_gbps,
            latency_to_first_byte_ms: config.latency_to_first_byte_ms,
        };
        let mut tier = Self::empty(
            config,
            Transport::Fifo {
                d2h: FifoLane::new(link.d2h_gbps),
                h2d: FifoLane::new(link.h2d_gbps),
                due: BTreeSet::new(),
            },
        );
        tier.register(link);
        tier
    }

    /// A pool shared by the clients that [`Self::register`]; the config's `d2h_gbps` and
    /// `h2d_gbps` are the pool's caps over all of them (its latency is unused: each client's
    /// link has its own).
    pub fn shared(config: HostTierConfig) -> Self {
        Self::empty(
            config,
            Transport::Fair { write: FairLink::new(config.d2h_gbps), read: FairLink::new(config.h2d_gbps) },
        )
    }

    fn empty(config: HostTierConfig, transport: Transport) -> Self {
        assert!(config.capacity_blocks > 0 && config.block_bytes > 0, "host tier needs capacity and a block size");
        Self {
            config,
            entries: FxHashMap::default(),
            lru: Lru::default(),
            transfers: FxHashMap::default(),
            transport,
            clients: Vec::new(),
            epoch: 0,
            now_ms: 0.0,
            next_id: 0,
            stats: HostStats::default(),
        }
    }

    /// Whether this is a pool shared by several clients.
    pub fn is_shared(&self) -> bool {
        matches!(self.transport, Transport::Fair { .. })
    }

    /// Adds a client with its own link; returns its id. A private cache has exactly one.
    pub fn register(&mut self, link: HostLink) -> usize {
        assert!(self.is_shared() || self.clients.is_empty(), "a private host cache has one client");
        self.clients.push(Some(Client {
            link,
            prepared: Vec::new(),
            done: VecDeque::new(),
            seen_epoch: self.epoch,
            residency: None,
            hold_completed: false,
        }));
        self.clients.len() - 1
    }

    fn client(&mut self, client: usize) -> &mut Client {
        self.clients[client].as_mut().expect("a registered host client")
    }

    /// Record residency changes from now on for `client`, for the router (Dynamo 1.6.1
    /// subscribes a rank to its host cache when the rank publishes KV events; a rank of a
    /// shared pool sees every block of the pool).
    pub fn publish_residency(&mut self, client: usize) {
        // A rank joining a warm shared pool first learns what it holds already (a private cache
        // keeps no router identities before its owner subscribes, so it starts empty).
        let mut resident: Vec<BlockKey> = if self.is_shared() {
            self.entries.iter().filter(|(_, e)| e.state == State::Resident).map(|(&k, _)| k).collect()
        } else {
            Vec::new()
        };
        resident.sort_unstable();
        let events = self.client(client).residency.get_or_insert_with(Vec::new);
        if !resident.is_empty() {
            events.push(HostKvEvent::Stored { hashes: resident });
        }
    }

    /// Moves the residency changes recorded for `client` since its last call to `out`.
    pub fn drain_residency(&mut self, client: usize, out: &mut Vec<HostKvEvent>) {
        if let Some(events) = self.client(client).residency.as_mut() {
            out.append(events);
        }
    }

    fn publish(&mut self, event: HostKvEvent) {
        for client in self.clients.iter_mut().flatten() {
            if let Some(events) = client.residency.as_mut() {
                events.push(event.clone());
            }
        }
    }

    /// From now on a completed store of `client` keeps its blocks pinned, outside the LRU
    /// order, until [`Self::unpin_external`] releases them.
    pub fn hold_completed_sources(&mut self, client: usize) {
        self.client(client).hold_completed = true;
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
    pub fn reserve_external(&mut self, client: usize, request: u64, keys: &[BlockKey], now_ms: f64) -> StoreOutcome {
        self.reserve(client, request, keys, now_ms, Kind::External)
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
        self.publish(HostKvEvent::Stored { hashes: t.blocks });
        self.notify_peers(t.client);
    }

    /// Roll back an external reservation.
    pub fn cancel_external(&mut self, transfer: TransferId) {
        let t = self.transfers.remove(&transfer).expect("external reservation");
        assert_eq!(t.kind, Kind::External, "not an external reservation");
        for key in &t.blocks {
            self.entries.remove(key);
        }
        self.notify_peers(t.client);
    }

    /// An entry of a shared pool settled outside a transfer completion: the other clients see
    /// progress at their next tick, `owner` does not.
    fn notify_peers(&mut self, owner: usize) {
        if !self.is_shared() {
            return;
        }
        self.epoch += 1;
        let epoch = self.epoch;
        if let Some(client) = self.clients[owner].as_mut().filter(|c| c.seen_epoch == epoch - 1) {
            client.seen_epoch = epoch;
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
    /// copy is queued by `client`'s next [`Self::submit_prepared`]. All or nothing.
    pub fn prepare_store(&mut self, client: usize, request: u64, cohort: &[BlockKey], now_ms: f64) -> StoreOutcome {
        self.reserve(client, request, cohort, now_ms, Kind::Store)
    }

    fn reserve(&mut self, client: usize, request: u64, cohort: &[BlockKey], now_ms: f64, kind: Kind) -> StoreOutcome {
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
        if !victims.is_empty() {
            self.publish(HostKvEvent::Removed { hashes: victims });
        }
        let transfer = self.allocate_id();
        for &key in &missing {
            self.entries.insert(key, Entry { state: State::Storing(transfer), pins: 0 });
        }
        let blocks = missing.len();
        self.transfers.insert(transfer, Transfer { kind, client, request, blocks: missing, completes_at_ms: None });
        if kind == Kind::Store {
            self.client(client).prepared.push(transfer);
        }
        StoreOutcome::Prepared { transfer, blocks }
    }

    /// Put `client`'s prepared stores on the D2H link at an engine-pass boundary, in
    /// preparation order; they may start at `now_ms` plus the first-byte latency. Returns the
    /// fixed completion time of each store on a private lane (none for a shared pool).
    pub fn submit_prepared(&mut self, client: usize, now_ms: f64) -> Vec<(TransferId, f64)> {
        let start_ms = self.mutate_at(now_ms);
        // A private lane keeps the caller's boundary as the start bound.
        let ready = now_ms + self.client(client).link.latency_to_first_byte_ms;
        std::mem::take(&mut self.client(client).prepared)
            .into_iter()
            .filter_map(|transfer| self.start(transfer, start_ms, ready).map(|at| (transfer, at)))
            .collect()
    }

    /// Puts a transfer on its link, moving its first byte at `ready_ms` (not before `now_ms`);
    /// returns its completion time on a private lane.
    fn start(&mut self, transfer: TransferId, now_ms: f64, ready_ms: f64) -> Option<f64> {
        let t = &self.transfers[&transfer];
        let (kind, client) = (t.kind, t.client);
        let bytes = self.bytes(t.blocks.len());
        let link = self.clients[client].as_ref().expect("a registered host client").link;
        match &mut self.transport {
            Transport::Fifo { d2h, h2d, due } => {
                let lane = if kind == Kind::Load { h2d } else { d2h };
                let at_ms = lane.push(ready_ms, bytes);
                due.insert(Due { at_ms, kind, transfer });
                self.transfers.get_mut(&transfer).expect("transfer to queue").completes_at_ms = Some(at_ms);
                Some(at_ms)
            }
            Transport::Fair { write, read } => {
                let (link_gbps, fair) = if kind == Kind::Load { (link.h2d_gbps, read) } else { (link.d2h_gbps, write) };
                fair.submit(transfer.0, client as u64, link_gbps, ready_ms.max(now_ms), bytes);
                None
            }
        }
    }

    /// Queue a load of `blocks` that may start at `not_before_ms` (for instance when the device
    /// blocks it lands in have finished their own store). `None` when any block is not resident,
    /// the list is empty, repeats a block or exceeds the cache; otherwise the load and its
    /// completion time on a private lane.
    pub fn schedule_load(
        &mut self,
        client: usize,
        request: u64,
        blocks: &[BlockKey],
        now_ms: f64,
        not_before_ms: f64,
    ) -> Option<(TransferId, Option<f64>)> {
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
        let ready = now_ms.max(not_before_ms) + self.client(client).link.latency_to_first_byte_ms;
        self.transfers.insert(
            transfer,
            Transfer { kind: Kind::Load, client, request, blocks: blocks.to_vec(), completes_at_ms: None },
        );
        Some((transfer, self.start(transfer, now_ms, ready)))
    }

    /// Withdraw a queued load and unpin its sources. A FIFO lane keeps the time it had booked;
    /// a shared link re-divides at once. A load that completed but was not delivered yet is
    /// only withdrawn from its owner's deliveries. False when the load never existed or was
    /// delivered.
    pub fn cancel_load(&mut self, client: usize, transfer: TransferId, now_ms: f64) -> bool {
        if self.transfers.get(&transfer).is_none_or(|t| t.kind != Kind::Load) {
            let done = &mut self.client(client).done;
            let before = done.len();
            done.retain(|c| c.transfer != transfer);
            return done.len() != before;
        }
        self.mutate_at(now_ms);
        if !self.transfers.contains_key(&transfer) {
            // Advancing the shared pool to `now_ms` completed it.
            return self.cancel_load(client, transfer, now_ms);
        }
        let Transfer { blocks, completes_at_ms, .. } = self.transfers.remove(&transfer).expect("queued load");
        match &mut self.transport {
            Transport::Fifo { due, .. } => {
                let at_ms = completes_at_ms.expect("a queued load has a completion time");
                assert!(due.remove(&Due { at_ms, kind: Kind::Load, transfer }));
            }
            Transport::Fair { read, .. } => assert!(read.cancel(transfer.0), "a queued load is on the link"),
        }
        self.unpin(&blocks);
        self.stats.loads_cancelled += 1;
        true
    }

    /// Complete every transfer due by `now_ms` and deliver `client`'s completions, in time
    /// order (stores before loads at one instant, then by id). A store makes its blocks
    /// resident; a load unpins its sources. Also says whether any transfer of the cache
    /// completed (or a shared entry settled) since the client's previous tick: in a private
    /// cache, whether anything was delivered.
    pub fn tick(&mut self, client: usize, now_ms: f64) -> (Vec<Completed>, bool) {
        assert!(now_ms.is_finite(), "host tier time must be finite");
        if self.is_shared() {
            // A peer may have advanced the pool past this client's present.
            self.now_ms = self.now_ms.max(now_ms);
        } else {
            assert!(now_ms >= self.now_ms, "host tier time cannot go backwards");
            self.now_ms = now_ms;
        }
        self.advance(self.now_ms);
        let epoch = self.epoch;
        let c = self.client(client);
        let progressed = std::mem::replace(&mut c.seen_epoch, epoch) != epoch;
        let mut completed = Vec::new();
        while c.done.front().is_some_and(|done| done.at_ms <= now_ms) {
            completed.push(c.done.pop_front().expect("a due completion"));
        }
        (completed, progressed)
    }

    /// Applies every physical completion due by `now_ms`.
    fn advance(&mut self, now_ms: f64) {
        let due: Vec<(TransferId, f64)> = match &mut self.transport {
            Transport::Fifo { due, .. } => {
                let mut out = Vec::new();
                while let Some(next) = due.first().copied().filter(|d| d.at_ms <= now_ms) {
                    due.pop_first();
                    out.push((next.transfer, next.at_ms));
                }
                out
            }
            Transport::Fair { write, read } => {
                let mut out: Vec<(TransferId, f64)> = write
                    .advance(now_ms)
                    .into_iter()
                    .chain(read.advance(now_ms))
                    .map(|(id, at)| (TransferId(id), at))
                    .collect();
                // At one instant stores come before loads, then by id.
                let kind = |t: &TransferId| self.transfers[t].kind;
                out.sort_by(|a, b| a.1.total_cmp(&b.1).then(kind(&a.0).cmp(&kind(&b.0))).then(a.0.cmp(&b.0)));
                out
            }
        };
        for (transfer, at_ms) in due {
            self.finish(transfer, at_ms);
        }
    }

    fn finish(&mut self, transfer: TransferId, at_ms: f64) {
        let Transfer { kind, client, request, blocks, .. } = self.transfers.remove(&transfer).expect("due transfer");
        self.epoch += 1;
        let bytes = self.bytes(blocks.len());
        match kind {
            Kind::Store => {
                let hold = self.clients[client].as_ref().is_some_and(|c| c.hold_completed);
                for key in &blocks {
                    let entry = self.entries.get_mut(key).expect("stored block keeps its entry");
                    debug_assert_eq!(entry.state, State::Storing(transfer));
                    entry.state = State::Resident;
                    entry.pins += u32::from(hold);
                }
                if !hold {
                    self.lru.touch_together(&blocks);
                }
                self.publish(HostKvEvent::Stored { hashes: blocks.clone() });
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
        if let Some(c) = self.clients[client].as_mut() {
            c.done.push_back(Completed { kind, transfer, request, blocks, at_ms });
        }
    }

    /// When `client` next has something to collect: a completion on a private lane; in a
    /// shared pool also a first byte anywhere in it, a completion delivered later, or progress
    /// of a peer it has not seen.
    pub fn next_deadline(&self, client: usize) -> Option<f64> {
        match &self.transport {
            Transport::Fifo { due, .. } => due.first().map(|due| due.at_ms),
            Transport::Fair { write, read } => {
                let c = self.clients[client].as_ref().expect("a registered host client");
                let unseen = (c.seen_epoch != self.epoch).then_some(self.now_ms);
                [write.next_event(), read.next_event(), c.done.front().map(|d| d.at_ms), unseen]
                    .into_iter()
                    .flatten()
                    .min_by(f64::total_cmp)
            }
        }
    }

    /// Fixed completion time of a transfer on a private lane; `None` for a prepared store not
    /// yet submitted, a transfer that is over, or any transfer of a shared pool.
    pub fn completes_at(&self, transfer: TransferId) -> Option<f64> {
        self.transfers.get(&transfer)?.completes_at_ms
    }

    /// The transfer is prepared or on a link.
    pub fn is_in_flight(&self, transfer: TransferId) -> bool {
        self.transfers.contains_key(&transfer)
    }

    /// `client` has transfers prepared or queued, or completions to collect.
    pub fn has_work(&self, client: usize) -> bool {
        self.clients[client].as_ref().is_some_and(|c| !c.done.is_empty())
            || self.transfers.values().any(|t| t.client == client)
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
    /// earlier than the last tick acts now). A private cache must have had its completions
    /// ticked first; a shared pool serves its transfers up to it.
    fn mutate_at(&mut self, now_ms: f64) -> f64 {
        assert!(now_ms.is_finite() && now_ms >= 0.0, "host tier time must be finite and non-negative");
        let now_ms = now_ms.max(self.now_ms);
        match &self.transport {
            Transport::Fifo { due, .. } => assert!(
                due.first().is_none_or(|d| d.at_ms >= now_ms),
                "host completions due before {now_ms} ms must be ticked first"
            ),
            Transport::Fair { .. } => self.advance(now_ms),
        }
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
