//! A worker's G3 tier: secondary KV storage below the host cache, in virtual time.
//!
//! This is the storage of Dynamo 1.6.1's `g3_offload` with scope `worker_local`
//! (`docs/host-offload.md` §8): capacity in blocks, least-recently-used eviction, writes that
//! reserve their entries at submission and reads that pin their sources. Each direction serves
//! its transfers by processor sharing at the worker's rate ([`FairLink`]); a transfer moves its
//! first byte `latency_to_first_byte_ms` after submission. The host cache decides what to
//! write and read; this tier only keeps entries, counters and time.

use rustc_hash::{FxHashMap, FxHashSet};

use super::{BlockKey, FairLink};

/// The sizes and rates of one worker's G3 tier.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct G3TierConfig {
    pub capacity_blocks: usize,
    pub block_bytes: u64,
    pub latency_to_first_byte_ms: f64,
    pub read_gbps: f64,
    pub write_gbps: f64,
}

/// What the tier holds of one block, as a lookup sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    Miss,
    /// Its write is still running.
    Pending,
    Resident,
}

/// Direction of a G3 transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// G3 to host (a promotion).
    Read,
    /// Host to G3.
    Write,
}

/// Counters of one direction.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct G3IoStats {
    pub submitted_jobs: u64,
    pub completed_jobs: u64,
    pub cancelled_jobs: u64,
    pub completed_bytes: u64,
    /// Sum over completed jobs of submission to completion.
    pub transfer_ms: f64,
}

/// Cumulative counters of a tier, under the names Dynamo's replay report gives them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct G3Stats {
    /// Block probes of lookups (every one, retries included).
    pub lookup_probes: u64,
    pub lookup_hits: u64,
    pub lookup_pending: u64,
    pub read: G3IoStats,
    pub write: G3IoStats,
    pub evictions: u64,
    /// Reads of blocks another worker wrote (always zero for a worker's own tier).
    pub cross_worker_read_blocks: u64,
    pub resident_blocks: u64,
    pub pending_blocks: u64,
    /// Requests that stopped restoring from G3 after too many rounds without progress.
    pub bypassed_restores: u64,
}

impl G3Stats {
    /// Sum of the counters of several tiers.
    pub fn merge(&mut self, o: &G3Stats) {
        let io = |a: &mut G3IoStats, b: &G3IoStats| {
            a.submitted_jobs += b.submitted_jobs;
            a.completed_jobs += b.completed_jobs;
            a.cancelled_jobs += b.cancelled_jobs;
            a.completed_bytes += b.completed_bytes;
            a.transfer_ms += b.transfer_ms;
        };
        self.lookup_probes += o.lookup_probes;
        self.lookup_hits += o.lookup_hits;
        self.lookup_pending += o.lookup_pending;
        io(&mut self.read, &o.read);
        io(&mut self.write, &o.write);
        self.evictions += o.evictions;
        self.cross_worker_read_blocks += o.cross_worker_read_blocks;
        self.resident_blocks += o.resident_blocks;
        self.pending_blocks += o.pending_blocks;
        self.bypassed_restores += o.bypassed_restores;
    }
}

/// A finished G3 transfer, as [`G3Tier::take_completed`] delivers it.
#[derive(Clone, Debug, PartialEq)]
pub struct G3Completion {
    pub job: u64,
    pub direction: Direction,
    pub keys: Vec<BlockKey>,
    pub at_ms: f64,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    pending: bool,
    pins: u32,
    /// Recency: the tier's ordinal at the last probe hit or completion.
    touched: u64,
}

struct Job {
    direction: Direction,
    keys: Vec<BlockKey>,
    submitted_ms: f64,
}

/// One worker's G3 tier. Times never go backwards: a command stamped before the tier's present
/// acts at its present.
pub struct G3Tier {
    config: G3TierConfig,
    entries: FxHashMap<BlockKey, Entry>,
    jobs: FxHashMap<u64, Job>,
    link: FairLink,
    /// Finished transfers not yet delivered, in completion order.
    completed: Vec<G3Completion>,
    /// Counts probes, submissions and completions; orders recency and names jobs.
    ordinal: u64,
    /// When each transfer completed, in order.
    completion_times: Vec<f64>,
    stats: G3Stats,
}

impl G3Tier {
    pub fn new(config: G3TierConfig) -> Self {
        assert!(config.capacity_blocks > 0 && config.block_bytes > 0, "G3 tier needs capacity and a block size");
        Self {
            config,
            entries: FxHashMap::default(),
            jobs: FxHashMap::default(),
            // Only per-worker rates apply; the link-wide cap is unlimited.
            link: FairLink::new(0.0),
            completed: Vec::new(),
            ordinal: 0,
            completion_times: Vec::new(),
            stats: G3Stats::default(),
        }
    }

    pub fn config(&self) -> &G3TierConfig {
        &self.config
    }

    /// Counters, with the present residency.
    pub fn stats(&self) -> G3Stats {
        let mut stats = self.stats;
        stats.pending_blocks = self.entries.values().filter(|e| e.pending).count() as u64;
        stats.resident_blocks = self.entries.len() as u64 - stats.pending_blocks;
        stats
    }

    /// Counts a request that gave up restoring from this tier.
    pub fn note_bypassed_restore(&mut self) {
        self.stats.bypassed_restores += 1;
    }

    /// Whether the tier has an entry for `key` (pending or resident); touches nothing.
    pub fn contains(&self, key: BlockKey) -> bool {
        self.entries.contains_key(&key)
    }

    /// A lookup's probe of one block: counted, and a resident block becomes the most recent.
    pub fn probe(&mut self, key: BlockKey) -> Probe {
        self.stats.lookup_probes += 1;
        self.ordinal += 1;
        match self.entries.get_mut(&key) {
            None => Probe::Miss,
            Some(entry) if entry.pending => {
                self.stats.lookup_pending += 1;
                Probe::Pending
            }
            Some(entry) => {
                entry.touched = self.ordinal;
                self.stats.lookup_hits += 1;
                Probe::Resident
            }
        }
    }

    /// Submit a transfer at `now_ms`; returns its job id, or `None` when nothing is accepted.
    ///
    /// A write keeps the leading blocks the tier lacks that fit in its free capacity plus its
    /// evictable blocks (resident, unpinned, none of `keys`, held or not; least recent first,
    /// then by key),
    /// evicts what it must and reserves pending entries for them. A read needs every block
    /// resident and pins them until it completes.
    pub fn submit(&mut self, direction: Direction, keys: &[BlockKey], now_ms: f64) -> Option<u64> {
        self.advance(now_ms);
        // Every block of a write is protected from its eviction, the ones G3 holds already too.
        let protected: FxHashSet<BlockKey> = keys.iter().copied().collect();
        let mut keys: Vec<BlockKey> = match direction {
            Direction::Write => keys.iter().copied().filter(|key| !self.entries.contains_key(key)).collect(),
            Direction::Read => keys.to_vec(),
        };
        if keys.is_empty() {
            return None;
        }
        match direction {
            Direction::Write => {
                let free = self.config.capacity_blocks - self.entries.len();
                let mut victims: Vec<(u64, BlockKey)> = self
                    .entries
                    .iter()
                    .filter(|(key, e)| !e.pending && e.pins == 0 && !protected.contains(key))
                    .map(|(&key, e)| (e.touched, key))
                    .collect();
                victims.sort_unstable();
                keys.truncate(free + victims.len());
                if keys.is_empty() {
                    return None;
                }
                for &(_, victim) in victims.iter().take(keys.len().saturating_sub(free)) {
                    self.entries.remove(&victim);
                    self.stats.evictions += 1;
                }
                for &key in &keys {
                    self.entries.insert(key, Entry { pending: true, pins: 0, touched: 0 });
                }
            }
            Direction::Read => {
                if keys.iter().any(|key| self.entries.get(key).is_none_or(|e| e.pending)) {
                    return None;
                }
                for key in &keys {
                    self.entries.get_mut(key).expect("checked resident").pins += 1;
                }
            }
        }
        self.ordinal += 1;
        let job = self.ordinal;
        let now = self.link.now_ms();
        let (client, gbps) = match direction {
            Direction::Read => (0, self.config.read_gbps),
            Direction::Write => (1, self.config.write_gbps),
        };
        self.io(direction).submitted_jobs += 1;
        let bytes = keys.len() as u64 * self.config.block_bytes;
        self.link.submit(job, client, gbps, now + self.config.latency_to_first_byte_ms, bytes);
        self.jobs.insert(job, Job { direction, keys, submitted_ms: now });
        Some(job)
    }

    /// The keys a job moves (for a write: the blocks it accepted).
    pub fn job_keys(&self, job: u64) -> &[BlockKey] {
        &self.jobs[&job].keys
    }

    /// Withdraw a running transfer: a write drops its reserved entries, a read its pins.
    pub fn cancel(&mut self, job: u64, now_ms: f64) -> bool {
        self.advance(now_ms);
        if !self.link.cancel(job) {
            return false;
        }
        let Job { direction, keys, .. } = self.jobs.remove(&job).expect("a job on the link");
        for key in &keys {
            match direction {
                Direction::Write => {
                    self.entries.remove(key);
                }
                Direction::Read => self.entries.get_mut(key).expect("read source").pins -= 1,
            }
        }
        self.io(direction).cancelled_jobs += 1;
        true
    }

    /// The next first byte or completion, or an undelivered completion.
    pub fn next_deadline(&self) -> Option<f64> {
        self.link.next_event().into_iter().chain(self.completed.iter().map(|c| c.at_ms)).min_by(f64::total_cmp)
    }

    /// Serve transfers up to `now_ms` without delivering them; returns how many transfers had
    /// completed by `now_ms` (the tier may have been served further already).
    pub fn sync(&mut self, now_ms: f64) -> u64 {
        self.advance(now_ms);
        self.completion_times.partition_point(|&at| at <= now_ms) as u64
    }

    /// The first completion after `after_ms` (served already or not), or the link's next first
    /// byte.
    pub fn next_event_after(&self, after_ms: f64) -> Option<f64> {
        let i = self.completion_times.partition_point(|&at| at <= after_ms);
        self.link.next_event().into_iter().chain(self.completion_times.get(i).copied()).min_by(f64::total_cmp)
    }

    /// Transfers are running or completions wait for delivery.
    pub fn has_work(&self) -> bool {
        !self.jobs.is_empty() || !self.completed.is_empty()
    }

    /// Serve transfers up to `now_ms` and deliver every completion due by then, in order.
    pub fn take_completed(&mut self, now_ms: f64) -> Vec<G3Completion> {
        self.advance(now_ms);
        let (due, later) = std::mem::take(&mut self.completed).into_iter().partition(|c| c.at_ms <= now_ms);
        self.completed = later;
        due
    }

    fn advance(&mut self, now_ms: f64) {
        for (job, at_ms) in self.link.advance(now_ms) {
            let Job { direction, keys, submitted_ms } = self.jobs.remove(&job).expect("finished job");
            self.ordinal += 1;
            for key in &keys {
                let entry = self.entries.get_mut(key).expect("a transfer keeps its entries");
                match direction {
                    Direction::Write => entry.pending = false,
                    Direction::Read => entry.pins -= 1,
                }
                entry.touched = self.ordinal;
            }
            let bytes = keys.len() as u64 * self.config.block_bytes;
            let io = self.io(direction);
            io.completed_jobs += 1;
            io.completed_bytes += bytes;
            io.transfer_ms += at_ms - submitted_ms;
            self.completed.push(G3Completion { job, direction, keys, at_ms });
            self.completion_times.push(at_ms);
        }
    }

    fn io(&mut self, direction: Direction) -> &mut G3IoStats {
        match direction {
            Direction::Read => &mut self.stats.read,
            Direction::Write => &mut self.stats.write,
        }
    }
}
