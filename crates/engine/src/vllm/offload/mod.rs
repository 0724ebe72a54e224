//! vLLM's `native_host_offload`: the connector policy over [`HostTier`], private to the rank
//! (`dp_rank_local`) or a client of a pool shared by the deployment (`cluster_shared`).
//!
//! Dynamo 1.6.1's semantics (`docs/host-offload.md` §4–6): write-through stores of complete
//! prompt blocks, prepared after the scheduling loop and put on the D2H lane at the pass
//! boundary; allocation fences on device blocks whose copy is still running; a host lookup
//! after the device prefix match, loads into reserved device blocks, and a connector queue for
//! requests that wait on transfers. The scheduler calls the hooks here; with offload off none of
//! them runs.
//!
//! Here: the connector's state and the engine's transfer clock (deadlines, completions, G3
//! sync); `load` holds the host lookup and loads, `boundary` the hooks across a pass (stores,
//! the transfer boundary, aborts), `waiting` the waiting loop with a host cache.

mod boundary;
mod load;
mod waiting;

use std::collections::VecDeque;

use rustc_hash::{FxHashMap, FxHashSet};

use super::{AdmissionDecision, PrefixCost, Req, Scheduled, Status, VllmEngine};
use crate::config::{EngineConfig, Role};
use crate::offload::{
    BlockKey, Completed, Direction, G3Client, G3Stats, HostClient, HostLink, HostStats, HostTier, Kind, Lookup, Probe,
    SharedG3Pool, SharedHostPool, StoreOutcome, TransferId,
};
use crate::output::{Finish, Finished, HostKvEvent, KvEvent, PassOutput, RejectReason, StoredBlock};

/// First-admission attribution of reused prompt tokens: (device, host).
pub type CacheTiers = (u32, u32);

enum Load {
    Loading {
        transfer: TransferId,
        keys: Vec<u64>,
        /// Device blocks held for the G1 prefix and the loaded blocks.
        reserved: Vec<u32>,
        original_g1_tokens: u32,
        loaded_prefix_blocks: u32,
        footprint_blocks: u32,
    },
    Activated {
        original_g1_tokens: u32,
        loaded_prefix_blocks: u32,
        footprint_blocks: u32,
    },
}

/// The connector's state of one request.
struct HostReq {
    /// Sequence hashes of the complete prompt blocks.
    keys: Vec<u64>,
    next_store: usize,
    latest_store: Option<TransferId>,
    load: Option<Load>,
    first_admission_recorded: bool,
    restore: Restore,
}

/// Restore rounds (lookups that start G3 promotions) a waiting request may make while its rank
/// schedules nothing and emits nothing; past it the request stops restoring from G3 (a prefix
/// larger than the host cache could otherwise evict its own promotions forever).
const MAX_RESTORE_ROUNDS_WITHOUT_PROGRESS: u32 = 1024;

/// A request's G3 restore rounds since its rank last made progress.
#[derive(Default)]
struct Restore {
    rounds: u32,
    /// The rank's progress count at the last round.
    rank_progress: u64,
}

impl Restore {
    fn bypassed(&self) -> bool {
        self.rounds >= MAX_RESTORE_ROUNDS_WITHOUT_PROGRESS
    }
}

/// The worker's G3 tier and the promotions in flight from it into the host cache.
struct G3State {
    tier: G3Client,
    /// Read job → the host reservations it fills.
    stages: FxHashMap<u64, Vec<TransferId>>,
    /// Blocks each request promoted at `attempted_at` (a zero-time promotion may be evicted
    /// again at the same instant; it is retried only when its prefix fits).
    attempted_at: f64,
    attempted: FxHashSet<(u64, BlockKey)>,
    /// Passes in which the rank scheduled work or emitted tokens.
    rank_progress: u64,
    /// A G3 transfer elsewhere in the deployment completed since the last advance.
    deployment_progress: bool,
    /// Counts what may unblock a waiting request: G3 writes accepted, promotions started, G3
    /// and host completions, loads started. A pass that takes no time but moves it is run
    /// again at the same instant.
    epoch: u64,
    epoch_at_pass_start: u64,
}

impl HostReq {
    fn reserved_blocks(&self) -> u32 {
        match &self.load {
            Some(Load::Loading { loaded_prefix_blocks, .. } | Load::Activated { loaded_prefix_blocks, .. }) => {
                *loaded_prefix_blocks
            }
            None => 0,
        }
    }

    fn unreserved_tail_blocks(&self) -> u32 {
        match &self.load {
            Some(
                Load::Loading { loaded_prefix_blocks, footprint_blocks, .. }
                | Load::Activated { loaded_prefix_blocks, footprint_blocks, .. },
            ) => footprint_blocks.saturating_sub(*loaded_prefix_blocks),
            None => 0,
        }
    }
}

struct Hit {
    keys: Vec<u64>,
    base_blocks: u32,
    original_g1_tokens: u32,
    footprint_blocks: u32,
}

enum HostLookup {
    Miss,
    Hit(Hit),
    Deferred,
}

enum StartLoad {
    Queued,
    Deferred,
    Retry,
    CapacityBlocked,
}

/// Cumulative host-offload counters of one rank (servesim's own; the reference reports none).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HostCounters {
    pub tier: HostStats,
    /// Prompt tokens whose first admission reused a host-loaded block.
    pub host_hit_tokens: u64,
    /// The worker's G3 tier, when it has one.
    pub g3: Option<G3Stats>,
}

/// The host tier of one rank and the connector state around it.
#[derive(Default)]
pub(super) struct HostState {
    tier: Option<HostClient>,
    g3: Option<G3State>,
    /// Pending D2H of a physical device block (pool slot): reusing its capacity must wait.
    slot_deps: FxHashMap<u32, TransferId>,
    deps_by_transfer: FxHashMap<TransferId, Vec<u32>>,
    load_by_key: FxHashMap<u64, TransferId>,
    compute_not_before: f64,
    reqs: FxHashMap<u64, HostReq>,
    /// vLLM's `skipped_waiting`, in order: (slot, request id) entries, of which those whose
    /// slot is a member for that request are live. As in Dynamo, a request that leaves from
    /// the middle leaves its entry behind (only the front is popped), and one that comes back
    /// while that entry remains takes its old place. `sleeping` members wait for a transfer.
    connector: VecDeque<(u32, u64)>,
    /// The connector's members: slot → request id.
    members: FxHashMap<u32, u64>,
    sleeping: FxHashSet<u32>,
    /// Running requests scheduled in the current pass.
    scheduled: FxHashSet<u32>,
    host_hit_tokens: u64,
}

impl std::fmt::Debug for HostState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostState").field("requests", &self.reqs.len()).finish()
    }
}

impl HostState {
    /// The rank's host cache, if configured: private, or its client of `shared`; and its G3
    /// tier, if configured: its own, or its client of `shared_g3`.
    /// `publish_residency`: the rank publishes KV events, so host residency goes to the router
    /// too (every block of a shared pool).
    pub(super) fn new(
        cfg: &EngineConfig,
        publish_residency: bool,
        shared: Option<&SharedHostPool>,
        shared_g3: Option<&SharedG3Pool>,
    ) -> Option<Box<Self>> {
        let h = cfg.host_offload.as_ref()?;
        let bytes_per_token = cfg.kv_cache_bytes_per_token.expect("validated: offload has kv_cache_bytes_per_token");
        let tier = h.tier_config(cfg.block_size, bytes_per_token, false);
        let host = match shared {
            Some(pool) => HostClient::join(
                pool,
                HostLink {
                    d2h_gbps: tier.d2h_gbps,
                    h2d_gbps: tier.h2d_gbps,
                    latency_to_first_byte_ms: tier.latency_to_first_byte_ms,
                },
            ),
            None => HostClient::private(tier),
        };
        if publish_residency {
            host.lock().publish_residency(host.id());
        }
        let g3 = cfg.g3_offload.map(|g| {
            // Completed stores wait for their handoff to G3 before they may be evicted.
            host.lock().hold_completed_sources(host.id());
            G3State {
                tier: match shared_g3 {
                    Some(pool) => G3Client::join(pool),
                    None => G3Client::own(g.tier_config(tier.block_bytes)),
                },
                stages: FxHashMap::default(),
                attempted_at: 0.0,
                attempted: FxHashSet::default(),
                rank_progress: 0,
                deployment_progress: false,
                epoch: 0,
                epoch_at_pass_start: 0,
            }
        });
        Some(Box::new(HostState { tier: Some(host), g3, ..Default::default() }))
    }

    fn tier(&self) -> std::sync::MutexGuard<'_, HostTier> {
        self.tier.as_ref().expect("host tier").lock()
    }

    /// This rank's id in its host cache.
    fn client(&self) -> usize {
        self.tier.as_ref().expect("host tier").id()
    }

    fn is_shared(&self) -> bool {
        self.tier.as_ref().is_some_and(HostClient::is_shared)
    }

    fn has_ready_waiter(&self) -> bool {
        self.members.len() > self.sleeping.len()
    }

    fn req(&mut self, req: &Req, bs: u32) -> &mut HostReq {
        self.reqs.entry(req.id).or_insert_with(|| {
            let blocks = ((req.prompt_len / bs) as usize).min(req.hashes.len());
            HostReq {
                keys: req.hashes.seq[..blocks].to_vec(),
                next_store: 0,
                latest_store: None,
                load: None,
                first_admission_recorded: false,
                restore: Restore::default(),
            }
        })
    }

    /// Moves a skipped request into the connector queue (at its back if new) to sleep until a
    /// transfer completes; a retry wakes at the end of the admission loop.
    fn skip(&mut self, slot: u32, id: u64, waiting: &mut VecDeque<u32>, retry: Option<&mut Vec<u32>>) {
        if self.members.insert(slot, id).is_none() {
            if let Some(pos) = waiting.iter().position(|&s| s == slot) {
                waiting.remove(pos);
            }
            while self.connector.front().is_some_and(|e| !self.is_live(e)) {
                self.connector.pop_front();
            }
            self.connector.push_back((slot, id));
        }
        self.sleeping.insert(slot);
        if let Some(retry) = retry {
            retry.push(slot);
        }
    }

    pub(super) fn leave_connector(&mut self, slot: u32) -> bool {
        if self.members.remove(&slot).is_none() {
            return false;
        }
        self.sleeping.remove(&slot);
        while self.connector.front().is_some_and(|e| !self.is_live(e)) {
            self.connector.pop_front();
        }
        true
    }

    fn is_live(&self, &(slot, id): &(u32, u64)) -> bool {
        self.members.get(&slot) == Some(&id)
    }

    /// The connector's live members in queue order (a member listed twice, first place).
    fn queued(&self) -> impl Iterator<Item = u32> + '_ {
        self.connector.iter().filter(|e| self.is_live(e)).map(|&(slot, _)| slot)
    }

    fn completes_at(&self, transfer: TransferId) -> Option<f64> {
        self.tier.as_ref().and_then(|t| t.lock().completes_at(transfer))
    }

    /// Whether device block `slot` is the source of a store still running. A private lane
    /// knows it by the store's fixed completion time; a shared pool has none.
    fn source_pending(&self, slot: u32) -> bool {
        if self.is_shared() {
            self.slot_deps.get(&slot).is_some_and(|&t| self.tier().is_in_flight(t))
        } else {
            self.pending_dep(slot).is_some()
        }
    }

    fn pending_dep(&self, slot: u32) -> Option<f64> {
        self.slot_deps.get(&slot).and_then(|&t| self.completes_at(t))
    }

    /// The G3 step of a lookup: walk `keys` (the prompt blocks past the device prefix) and
    /// promote into the host cache, in one read, each block the host lacks and G3 holds, until
    /// a block neither has (or the host cannot take one). True when the request must wait for a
    /// transfer: a promotion started, or a block it needs is still being written somewhere.
    fn stage(&mut self, request: u64, keys: &[BlockKey], now_ms: f64) -> bool {
        let client = self.client();
        let mut tier = self.tier.as_ref().unwrap().lock();
        let g3 = self.g3.as_mut().unwrap();
        if now_ms > g3.attempted_at {
            g3.attempted_at = now_ms;
            g3.attempted.clear();
        }
        let (mut missing, mut reservations, mut deferred) = (Vec::new(), Vec::new(), false);
        for &key in keys {
            match tier.lookup(key) {
                Lookup::Hit => {}
                Lookup::Pending(_) => deferred = true,
                Lookup::Miss => match g3.tier.probe(key) {
                    Probe::Resident => {
                        if g3.attempted.contains(&(request, key)) {
                            // Promoted at this instant already and evicted since: again only if
                            // the whole recoverable prefix fits now.
                            let prefix: Vec<BlockKey> = keys
                                .iter()
                                .copied()
                                .take_while(|&k| tier.lookup(k) != Lookup::Miss || g3.tier.contains(k))
                                .collect();
                            if !tier.can_reserve_external_prefix(&prefix) {
                                break;
                            }
                        }
                        let StoreOutcome::Prepared { transfer, .. } =
                            tier.reserve_external(client, request, &[key], now_ms)
                        else {
                            break;
                        };
                        missing.push(key);
                        reservations.push(transfer);
                    }
                    Probe::Pending => deferred = true,
                    Probe::Miss => break,
                },
            }
        }
        if missing.is_empty() {
            return deferred;
        }
        let Some(job) = g3.tier.submit(Direction::Read, &missing, now_ms) else {
            for reservation in reservations {
                tier.cancel_external(reservation);
            }
            return deferred;
        };
        let restore = &mut self.reqs.get_mut(&request).expect("a looked-up request").restore;
        if restore.rank_progress != g3.rank_progress {
            restore.rank_progress = g3.rank_progress;
            restore.rounds = 0;
        }
        restore.rounds += 1;
        if restore.bypassed() {
            g3.tier.note_bypassed_restore();
        }
        g3.attempted.extend(missing.iter().map(|&k| (request, k)));
        g3.stages.insert(job, reservations);
        g3.epoch += 1;
        true
    }
}

impl VllmEngine {
    /// Makes this rank a client of the deployment's shared host pool and/or shared G3 pool
    /// (`cluster_shared`) instead of its own. Called before the engine has seen a request.
    pub fn join_shared_pools(&mut self, host: Option<&SharedHostPool>, g3: Option<&SharedG3Pool>) {
        assert!(self.waiting.is_empty() && self.running.is_empty(), "a rank joins its pools before it runs");
        let record = self.pool.records_events();
        self.host = HostState::new(&self.cfg, record, host, g3);
    }

    /// Whether the pass boundary's host transfers wait for [`Self::finish_group_pass`] from the
    /// driver at the pass's end: a shared pool (host or G3) is advanced by every rank, so a
    /// pass's boundary must not run ahead of the others' present.
    pub fn defers_transfer_boundary(&self) -> bool {
        self.host.as_ref().is_some_and(|h| h.is_shared() || h.g3.as_ref().is_some_and(|g| g.tier.is_shared()))
    }

    /// When the next host transfer completes (the driver wakes an idle worker then).
    pub fn next_transfer_deadline(&self) -> Option<f64> {
        let h = self.host.as_ref()?;
        let g3 = h.g3.as_ref().and_then(|g| g.tier.next_deadline());
        h.tier.as_ref()?.lock().next_deadline(h.client()).into_iter().chain(g3).min_by(f64::total_cmp)
    }

    /// Completes the host transfers due by `now_ms` on an idle rank (loads become admissible
    /// prefixes); true if any completed.
    pub fn advance_transfers(&mut self, now_ms: f64) -> bool {
        if self.host.is_none() {
            return false;
        }
        let h = self.host.as_mut().unwrap();
        let (done, mut any) = h.tier().tick(h.client(), now_ms);
        if let Some(g3) = h.g3.as_mut() {
            any |= std::mem::take(&mut g3.deployment_progress);
            g3.epoch += done.len() as u64;
            let mut tier = h.tier.as_ref().unwrap().lock();
            // Completed stores are handed down to G3 (write-through); the blocks it declines
            // are released now, the others when their write completes.
            for c in done.iter().filter(|c| c.kind == Kind::Store) {
                let accepted = g3.tier.submit(Direction::Write, &c.blocks, now_ms);
                let accepted = accepted.map_or(Vec::new(), |job| g3.tier.job_keys(job));
                let declined: Vec<u64> = c.blocks.iter().copied().filter(|k| !accepted.contains(k)).collect();
                g3.epoch += u64::from(!accepted.is_empty());
                tier.unpin_external(&declined);
            }
            for c in g3.tier.take_completed(now_ms) {
                any = true;
                g3.epoch += 1;
                match c.direction {
                    Direction::Write => tier.unpin_external(&c.keys),
                    Direction::Read => {
                        for reservation in g3.stages.remove(&c.job).expect("a promotion fills reservations") {
                            tier.complete_external(reservation);
                        }
                    }
                }
            }
        }
        self.host_completed(done, any);
        any
    }

    /// See [`crate::Engine::g3_sync`].
    pub fn g3_sync(&mut self, now_ms: f64) -> Option<u64> {
        let g3 = self.host.as_mut()?.g3.as_mut()?;
        Some(g3.tier.sync(now_ms))
    }

    /// See [`crate::Engine::g3_next_event_after`].
    pub fn g3_next_event_after(&self, after_ms: f64) -> Option<f64> {
        self.host.as_ref()?.g3.as_ref()?.tier.next_event_after(after_ms)
    }

    /// See [`crate::Engine::g3_retry_now`].
    pub fn g3_retry_now(&self, now_ms: f64) -> bool {
        let Some(g3) = self.host.as_ref().and_then(|h| h.g3.as_ref()) else { return false };
        g3.epoch != g3.epoch_at_pass_start || self.next_transfer_deadline().is_some_and(|at| at <= now_ms)
    }

    /// See [`crate::Engine::note_g3_deployment_progress`].
    pub fn note_g3_deployment_progress(&mut self) {
        if let Some(g3) = self.host.as_mut().and_then(|h| h.g3.as_mut()) {
            g3.deployment_progress = true;
        }
    }

    /// Host counters, when the rank has a host cache.
    pub fn host_counters(&self) -> Option<HostCounters> {
        let h = self.host.as_ref()?;
        Some(HostCounters {
            // A shared pool's counts are the deployment's: the driver reports them once.
            tier: if h.is_shared() { HostStats::default() } else { h.tier().stats() },
            host_hit_tokens: h.host_hit_tokens,
            // A shared G3 pool's counts are the deployment's: the driver reports them once.
            g3: h.g3.as_ref().map(|g| if g.tier.is_shared() { G3Stats::default() } else { g.tier.stats() }),
        })
    }

    /// Host residency changes since the last call (recorded when the rank publishes KV events).
    pub(super) fn host_drain_residency(&mut self, out: &mut Vec<HostKvEvent>) {
        if let Some(h) = self.host.as_ref().filter(|h| h.tier.is_some()) {
            h.tier().drain_residency(h.client(), out);
        }
    }

    pub(super) fn host_has_ready_waiter(&self) -> bool {
        self.host.as_ref().is_some_and(|h| h.has_ready_waiter())
    }

    pub(super) fn host_connector_slot(&self, id: u64) -> Option<u32> {
        self.host.as_ref()?.members.iter().find(|&(_, &r)| r == id).map(|(&s, _)| s)
    }

    pub(super) fn host_connector_len(&self) -> usize {
        self.host.as_ref().map_or(0, |h| h.members.len())
    }

    /// Applies the completed host transfers delivered to this rank; `woke`: some transfer (host
    /// or G3, this rank's or, in a shared pool, a peer's) completed, so the requests waiting on
    /// one are tried again.
    fn host_completed(&mut self, done: Vec<Completed>, woke: bool) {
        let completed_any = !done.is_empty();
        let h = self.host.as_mut().unwrap();
        if woke {
            h.sleeping.clear();
        }
        let mut activate = Vec::new();
        for c in done {
            match c.kind {
                Kind::Store => {
                    let sources = h.deps_by_transfer.remove(&c.transfer).unwrap_or_default();
                    for slot in &sources {
                        if h.slot_deps.get(slot) == Some(&c.transfer) {
                            h.slot_deps.remove(slot);
                        }
                    }
                    if h.is_shared() {
                        self.pool.release_held(&sources);
                    }
                }
                Kind::Load => {
                    for key in &c.blocks {
                        h.load_by_key.remove(key);
                    }
                    activate.push(c.request);
                }
                Kind::External => unreachable!("external reservations do not complete on a lane"),
            }
        }
        for id in activate {
            self.activate_load(id);
        }
        if completed_any {
            self.destinations.wake();
        }
    }

    /// Whether any of `blocks` is the source of a host store still running (private scope:
    /// a freed source goes back to the device pool before its copy ends).
    pub(super) fn host_copy_pending(&self, blocks: &[u32]) -> bool {
        self.host.as_ref().is_some_and(|h| blocks.iter().any(|&b| h.pending_dep(b).is_some()))
    }
}
