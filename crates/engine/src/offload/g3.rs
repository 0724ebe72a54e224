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
    /// The worker whose write stored it.
    writer: usize,
}

struct Job {
    worker: usize,
    direction: Direction,
    keys: Vec<BlockKey>,
    submitted_ms: f64,
}

/// How transfers move.
enum Links {
    /// One worker's tier: its reads and its writes each at the worker's rate, not sharing.
    Worker(FairLink),
    /// A deployment's pool: each direction shared by the workers under the pool's cap.
    Pool { read: FairLink, write: FairLink },
}

/// A G3 tier with its workers (one for `worker_local`, every worker of the deployment for
/// `cluster_shared`). Times never go backwards: a command stamped before the tier's present
/// acts at its present.
pub struct G3Tier {
    config: G3TierConfig,
    entries: FxHashMap<BlockKey, Entry>,
    jobs: FxHashMap<u64, Job>,
    links: Links,
    /// Finished transfers not yet delivered, by worker, in completion order.
    completed: Vec<Vec<G3Completion>>,
    /// Counts probes, submissions and completions; orders recency and names jobs.
    ordinal: u64,
    /// When each transfer completed, in order.
    completion_times: Vec<f64>,
    stats: G3Stats,
}

impl G3Tier {
    /// One worker's tier (its worker is 0).
    pub fn new(config: G3TierConfig) -> Self {
        // Only per-worker rates apply; the link-wide cap is unlimited.
        let mut tier = Self::empty(config, Links::Worker(FairLink::new(0.0)));
        tier.register();
        tier
    }

    /// A pool for the deployment's workers ([`Self::register`]), each direction capped at
    /// `shared_read_gbps` / `shared_write_gbps` over all of them.
    pub fn shared(config: G3TierConfig, shared_read_gbps: f64, shared_write_gbps: f64) -> Self {
        Self::empty(
            config,
            Links::Pool { read: FairLink::new(shared_read_gbps), write: FairLink::new(shared_write_gbps) },
        )
    }

    fn empty(config: G3TierConfig, links: Links) -> Self {
        assert!(config.capacity_blocks > 0 && config.block_bytes > 0, "G3 tier needs capacity and a block size");
        Self {
            config,
            entries: FxHashMap::default(),
            jobs: FxHashMap::default(),
            links,
            completed: Vec::new(),
            ordinal: 0,
            completion_times: Vec::new(),
            stats: G3Stats::default(),
        }
    }

    /// Adds a worker; returns its id. A worker's own tier has exactly one.
    pub fn register(&mut self) -> usize {
        assert!(matches!(self.links, Links::Pool { .. }) || self.completed.is_empty(), "a worker tier has one worker");
        self.completed.push(Vec::new());
        self.completed.len() - 1
    }

    pub fn config(&self) -> &G3TierConfig {
        &self.config
    }

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

    /// Whether `key` has an entry (resident or pending); changes nothing.
    pub fn contains(&self, key: BlockKey) -> bool {
        self.entries.contains_key(&key)
    }

    /// A lookup: a resident hit becomes the most recent.
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

    /// Starts a transfer of `worker`. A write keeps the blocks the tier lacks, truncated to the
    /// leading ones that fit in the free capacity plus the evictable entries (resident,
    /// unpinned, not in `keys`), evicting the least recent of those it needs; a read needs
    /// every block resident and pins them. `None` when nothing is written or a read cannot
    /// start.
    pub fn submit(&mut self, worker: usize, direction: Direction, keys: &[BlockKey], now_ms: f64) -> Option<u64> {
        self.advance(now_ms);
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
                    self.entries.insert(key, Entry { pending: true, pins: 0, touched: 0, writer: worker });
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
        self.io(direction).submitted_jobs += 1;
        let bytes = keys.len() as u64 * self.config.block_bytes;
        let latency = self.config.latency_to_first_byte_ms;
        let gbps = match direction {
            Direction::Read => self.config.read_gbps,
            Direction::Write => self.config.write_gbps,
        };
        let now = match &mut self.links {
            Links::Worker(link) => {
                // Reads and writes are two clients of the worker's link, so they do not share.
                let now = link.now_ms();
                link.submit(job, u64::from(direction == Direction::Write), gbps, now + latency, bytes);
                now
            }
            Links::Pool { read, write } => {
                let link = if direction == Direction::Read { read } else { write };
                let now = link.now_ms();
                link.submit(job, worker as u64, gbps, now + latency, bytes);
                now
            }
        };
        self.jobs.insert(job, Job { worker, direction, keys, submitted_ms: now });
        Some(job)
    }

    /// The blocks a transfer moves (those a write accepted).
    pub fn job_keys(&self, job: u64) -> &[BlockKey] {
        &self.jobs[&job].keys
    }

    /// Withdraws a transfer still on the link: a write's entries go, a read unpins.
    pub fn cancel(&mut self, job: u64, now_ms: f64) -> bool {
        self.advance(now_ms);
        let cancelled = match &mut self.links {
            Links::Worker(link) => link.cancel(job),
            Links::Pool { read, write } => read.cancel(job) || write.cancel(job),
        };
        if !cancelled {
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

    fn next_link_event(&self) -> Option<f64> {
        match &self.links {
            Links::Worker(link) => link.next_event(),
            Links::Pool { read, write } => {
                read.next_event().into_iter().chain(write.next_event()).min_by(f64::total_cmp)
            }
        }
    }

    /// When `worker` next has something to collect: a first byte or completion of its own
    /// transfers, or one of its completions not yet delivered. (Another worker's completions
    /// reach it through the deployment's progress, which the driver watches with
    /// [`Self::next_event_after`].)
    pub fn next_deadline(&self, worker: usize) -> Option<f64> {
        let link = match &self.links {
            Links::Worker(link) => link.next_event(),
            Links::Pool { read, write } => {
                let client = worker as u64;
                read.next_event_of(client).into_iter().chain(write.next_event_of(client)).min_by(f64::total_cmp)
            }
        };
        link.into_iter().chain(self.completed[worker].iter().map(|c| c.at_ms)).min_by(f64::total_cmp)
    }

    /// Serves transfers up to `now_ms`; returns how many transfers have completed by then.
    pub fn sync(&mut self, now_ms: f64) -> u64 {
        self.advance(now_ms);
        self.completion_times.partition_point(|&at| at <= now_ms) as u64
    }

    /// The first link event or completion after `after_ms`.
    pub fn next_event_after(&self, after_ms: f64) -> Option<f64> {
        let i = self.completion_times.partition_point(|&at| at <= after_ms);
        // A shared pool's link may lag the caller (no worker advanced it yet): its events at or
        // before `after_ms` are served when one does.
        let link = self.next_link_event().filter(|&at| at > after_ms);
        link.into_iter().chain(self.completion_times.get(i).copied()).min_by(f64::total_cmp)
    }

    /// `worker` has transfers running or completions to collect.
    pub fn has_work(&self, worker: usize) -> bool {
        self.jobs.values().any(|j| j.worker == worker) || !self.completed[worker].is_empty()
    }

    /// Serves transfers up to `now_ms` and delivers `worker`'s completions due by then.
    pub fn take_completed(&mut self, worker: usize, now_ms: f64) -> Vec<G3Completion> {
        self.advance(now_ms);
        let (due, later) = std::mem::take(&mut self.completed[worker]).into_iter().partition(|c| c.at_ms <= now_ms);
        self.completed[worker] = later;
        due
    }

    fn advance(&mut self, now_ms: f64) {
        let done = match &mut self.links {
            Links::Worker(link) => link.advance(now_ms),
            Links::Pool { read, write } => {
                // Both directions in one time order, in submission order at one instant.
                let mut done = read.advance(now_ms);
                done.extend(write.advance(now_ms));
                done.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
                done
            }
        };
        for (job, at_ms) in done {
            let Job { worker, direction, keys, submitted_ms } = self.jobs.remove(&job).expect("finished job");
            self.ordinal += 1;
            for key in &keys {
                let entry = self.entries.get_mut(key).expect("a transfer keeps its entries");
                match direction {
                    Direction::Write => entry.pending = false,
                    Direction::Read => {
                        entry.pins -= 1;
                        self.stats.cross_worker_read_blocks += u64::from(entry.writer != worker);
                    }
                }
                entry.touched = self.ordinal;
            }
            let bytes = keys.len() as u64 * self.config.block_bytes;
            let io = self.io(direction);
            io.completed_jobs += 1;
            io.completed_bytes += bytes;
            io.transfer_ms += at_ms - submitted_ms;
            self.completed[worker].push(G3Completion { job, direction, keys, at_ms });
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

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1_000_000;

    /// 1 MB blocks; at 1 GB/s one block takes 1 ms.
    fn tier(capacity: usize, latency: f64, gbps: f64) -> G3Tier {
        G3Tier::new(G3TierConfig {
            capacity_blocks: capacity,
            block_bytes: MB,
            latency_to_first_byte_ms: latency,
            read_gbps: gbps,
            write_gbps: gbps,
        })
    }

    /// Write `keys` at `at` and serve it until it completes; returns the completion.
    fn write(t: &mut G3Tier, keys: &[BlockKey], at: f64) -> G3Completion {
        t.submit(0, Direction::Write, keys, at).expect("accepted");
        loop {
            let mut done = t.take_completed(0, t.next_deadline(0).expect("the write is on the link"));
            if let Some(c) = done.pop() {
                assert!(done.is_empty());
                return c;
            }
        }
    }

    #[test]
    fn writes_are_pending_until_their_bytes_arrive_then_resident() {
        let mut t = tier(4, 0.5, 1.0);
        let job = t.submit(0, Direction::Write, &[1, 2], 10.0).unwrap();
        assert_eq!(t.job_keys(job), [1, 2]);
        assert_eq!(t.probe(1), Probe::Pending);
        // First byte at 10.5, two 1 MB blocks at 1 GB/s: done at 12.5.
        assert_eq!(t.next_deadline(0), Some(10.5));
        assert!(t.take_completed(0, 12.4).is_empty());
        let done = t.take_completed(0, 12.5);
        assert_eq!(done, [G3Completion { job, direction: Direction::Write, keys: vec![1, 2], at_ms: 12.5 }]);
        assert_eq!((t.probe(1), t.probe(3)), (Probe::Resident, Probe::Miss));
        let s = t.stats();
        assert_eq!((s.lookup_probes, s.lookup_hits, s.lookup_pending), (3, 1, 1));
        assert_eq!((s.write.submitted_jobs, s.write.completed_jobs, s.write.completed_bytes), (1, 1, 2 * MB));
        assert_eq!((s.write.transfer_ms, s.resident_blocks, s.pending_blocks), (2.5, 2, 0));
    }

    #[test]
    fn a_write_evicts_the_least_recent_blocks_outside_its_own_cohort() {
        let mut t = tier(3, 0.0, 0.0);
        write(&mut t, &[10, 11], 0.0);
        write(&mut t, &[12], 1.0);
        // 10 and 11 completed together (key order breaks the tie); a probe makes 10 recent.
        assert_eq!(t.probe(10), Probe::Resident);
        // [11, 20]: 11 is present and protected, so 20 evicts 12, the oldest other block.
        let job = t.submit(0, Direction::Write, &[11, 20], 2.0).unwrap();
        assert_eq!(t.job_keys(job), [20]);
        assert_eq!(t.stats().evictions, 1);
        assert!(t.contains(10) && t.contains(11) && !t.contains(12) && t.contains(20));
        // Already present: nothing to write.
        t.take_completed(0, 2.0);
        assert_eq!(t.submit(0, Direction::Write, &[10, 20], 3.0), None);
    }

    #[test]
    fn a_write_keeps_its_leading_blocks_when_pending_and_pinned_blocks_leave_no_room() {
        let mut t = tier(3, 0.0, 1.0);
        write(&mut t, &[1], 0.0);
        t.submit(0, Direction::Write, &[2], 10.0).unwrap(); // pending until 11
        let read = t.submit(0, Direction::Read, &[1], 10.0).unwrap(); // pins 1 until 11
        let job = t.submit(0, Direction::Write, &[5, 6, 7], 10.0).unwrap();
        assert_eq!(t.job_keys(job), [5], "one free block, no evictable one");
        assert_eq!(t.submit(0, Direction::Write, &[8], 10.0), None, "full");
        assert_eq!(t.stats().evictions, 0);
        let done: Vec<u64> = t.take_completed(0, 20.0).iter().map(|c| c.job).collect();
        assert!(done.contains(&read) && done.contains(&job));
    }

    #[test]
    fn reads_need_resident_blocks_and_pin_them() {
        let mut t = tier(2, 0.0, 1.0);
        write(&mut t, &[1], 0.0);
        t.submit(0, Direction::Write, &[2], 1.0).unwrap();
        assert_eq!(t.submit(0, Direction::Read, &[1, 2], 1.0), None, "2 is still pending");
        assert_eq!(t.submit(0, Direction::Read, &[3], 1.0), None);
        t.take_completed(0, 2.0);
        let read = t.submit(0, Direction::Read, &[1], 2.0).unwrap();
        // 1 is pinned, 2 is the only victim.
        let job = t.submit(0, Direction::Write, &[3], 2.0).unwrap();
        assert_eq!(t.job_keys(job), [3]);
        assert!(t.contains(1) && !t.contains(2));
        assert!(t.cancel(read, 2.5) && !t.cancel(read, 2.5));
        assert_eq!(t.stats().read.cancelled_jobs, 1);
    }

    #[test]
    fn transfers_of_one_direction_share_the_worker_rate_and_directions_do_not() {
        // Two 1 MB reads at 1 GB/s share it: both done at 2 ms; the write runs beside them.
        let mut t = tier(8, 0.0, 1.0);
        write(&mut t, &[1], 0.0);
        write(&mut t, &[2], 0.0);
        let (a, b) =
            (t.submit(0, Direction::Read, &[1], 5.0).unwrap(), t.submit(0, Direction::Read, &[2], 5.0).unwrap());
        let w = t.submit(0, Direction::Write, &[3], 5.0).unwrap();
        let done: Vec<(u64, f64)> = t.take_completed(0, 10.0).iter().map(|c| (c.job, c.at_ms)).collect();
        assert_eq!(done, [(w, 6.0), (a, 7.0), (b, 7.0)]);
        assert_eq!(t.sync(6.5), 3, "completed by 6.5: the two seeding writes and the third");
        assert_eq!(t.next_event_after(6.0), Some(7.0));
    }

    #[test]
    fn a_shared_pool_serves_every_worker_under_its_caps_and_counts_cross_worker_reads() {
        // Workers at 1 GB/s each, the pool capped at 1 GB/s per direction, no latency.
        let config = G3TierConfig {
            capacity_blocks: 4,
            block_bytes: MB,
            latency_to_first_byte_ms: 0.0,
            read_gbps: 1.0,
            write_gbps: 1.0,
        };
        let mut t = G3Tier::shared(config, 1.0, 1.0);
        let (a, b) = (t.register(), t.register());
        // Two 1 MB writes at once share the pool's 1 GB/s: both land at 2 ms (alone, 1 ms).
        t.submit(a, Direction::Write, &[1], 0.0).unwrap();
        t.submit(b, Direction::Write, &[2], 0.0).unwrap();
        assert_eq!(t.next_deadline(a), Some(2.0));
        assert_eq!(t.take_completed(a, 2.0).len(), 1, "a gets its own completion only");
        assert_eq!(t.take_completed(b, 2.0).len(), 1);
        // One pool of blocks: b reads what a wrote.
        assert_eq!(t.probe(1), Probe::Resident);
        t.submit(b, Direction::Read, &[1], 2.0).unwrap();
        t.take_completed(b, 3.0);
        let s = t.stats();
        assert_eq!((s.cross_worker_read_blocks, s.resident_blocks, s.write.transfer_ms), (1, 2, 4.0));
        // A worker's deadline follows its own transfers, not its peers'.
        t.submit(a, Direction::Write, &[3], 3.0).unwrap();
        assert_eq!((t.next_deadline(a), t.next_deadline(b)), (Some(4.0), None));
    }
}
