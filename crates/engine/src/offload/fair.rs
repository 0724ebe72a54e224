//! One direction of a shared host link: processor sharing under two caps.
//!
//! Every transfer that has passed its first-byte time moves at
//! `min(client_rate / ready transfers of its client, shared_rate / all ready transfers)`.
//! A transfer still waiting for its first byte takes no share, and a share one client cannot use
//! is not handed to the others. Each arrival, first byte, completion or cancellation re-divides
//! the link, so completion times are known only by advancing time.

use super::lane::bytes_per_ms;

struct Job {
    id: u64,
    client: u64,
    ready_ms: f64,
    bytes: f64,
    client_rate: f64,
}

/// A processor-sharing link (zero GB/s: unlimited).
pub struct FairLink {
    now_ms: f64,
    shared_rate: f64,
    /// In submission order, which is the order of completions at one instant.
    jobs: Vec<Job>,
}

impl FairLink {
    /// A link whose transfers together move at most `shared_gbps`.
    pub fn new(shared_gbps: f64) -> Self {
        Self { now_ms: 0.0, shared_rate: bytes_per_ms(shared_gbps), jobs: Vec::new() }
    }

    pub fn now_ms(&self) -> f64 {
        self.now_ms
    }

    pub fn is_idle(&self) -> bool {
        self.jobs.is_empty()
    }

    /// Start transfer `id` of `client` (whose own transfers together move at most
    /// `client_gbps`): it moves its first byte at `ready_ms`, not before the link's present.
    pub fn submit(&mut self, id: u64, client: u64, client_gbps: f64, ready_ms: f64, bytes: u64) {
        assert!(self.jobs.iter().all(|job| job.id != id), "transfer {id} is already on the link");
        self.jobs.push(Job {
            id,
            client,
            ready_ms: ready_ms.max(self.now_ms),
            bytes: bytes as f64,
            client_rate: bytes_per_ms(client_gbps),
        });
    }

    /// Drop a transfer; the others share what it used. False if it is not on the link.
    pub fn cancel(&mut self, id: u64) -> bool {
        let before = self.jobs.len();
        self.jobs.retain(|job| job.id != id);
        self.jobs.len() != before
    }

    fn rates(&self) -> Vec<f64> {
        let ready = |job: &Job| job.ready_ms <= self.now_ms;
        let total = self.jobs.iter().filter(|job| ready(job)).count();
        self.jobs
            .iter()
            .map(|job| {
                if !ready(job) {
                    return 0.0;
                }
                let mine = self.jobs.iter().filter(|other| ready(other) && other.client == job.client).count();
                (job.client_rate / mine as f64).min(self.shared_rate / total as f64)
            })
            .collect()
    }

    fn event_times(&self, rates: &[f64]) -> Vec<f64> {
        self.jobs
            .iter()
            .zip(rates)
            .map(|(job, rate)| if job.ready_ms > self.now_ms { job.ready_ms } else { self.now_ms + job.bytes / rate })
            .collect()
    }

    /// The next first byte or completion under the present set of transfers.
    pub fn next_event(&self) -> Option<f64> {
        self.event_times(&self.rates()).into_iter().min_by(f64::total_cmp)
    }

    /// The next first byte or completion of `client`'s transfers (the others' set its rate).
    pub fn next_event_of(&self, client: u64) -> Option<f64> {
        let times = self.event_times(&self.rates());
        self.jobs.iter().zip(times).filter(|(job, _)| job.client == client).map(|(_, at)| at).min_by(f64::total_cmp)
    }

    /// Serve transfers up to `to_ms`; returns `(id, completion time)` in time order, and in
    /// submission order within one instant.
    pub fn advance(&mut self, to_ms: f64) -> Vec<(u64, f64)> {
        let to_ms = to_ms.max(self.now_ms);
        let mut done = Vec::new();
        loop {
            let rates = self.rates();
            let events = self.event_times(&rates);
            let next = events.iter().copied().min_by(f64::total_cmp);
            let step_to = next.map_or(to_ms, |at| at.min(to_ms));
            let elapsed = step_to - self.now_ms;
            for ((job, rate), at) in self.jobs.iter_mut().zip(&rates).zip(&events) {
                if job.ready_ms <= self.now_ms {
                    // The event chosen as a completion is exact: subtracting bytes at a large
                    // timestamp could leave a residue too small to ever drain.
                    job.bytes = if *at <= step_to { 0.0 } else { (job.bytes - rate * elapsed).max(0.0) };
                }
            }
            self.now_ms = step_to;
            let now = self.now_ms;
            self.jobs.retain(|job| {
                let finished = job.ready_ms <= now && job.bytes == 0.0;
                if finished {
                    done.push((job.id, now));
                }
                !finished
            });
            if next.is_none_or(|at| at > to_ms) {
                return done;
            }
            if now == to_ms && self.next_event().is_none_or(|at| at > to_ms) {
                return done;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: u64 = 1_000_000_000;

    #[test]
    fn two_concurrent_transfers_share_the_link() {
        let mut link = FairLink::new(1.0);
        link.submit(0, 0, 0.0, 0.0, GB);
        link.submit(1, 1, 0.0, 0.0, GB);
        assert_eq!(link.next_event(), Some(2000.0));
        assert_eq!(link.advance(5000.0), [(0, 2000.0), (1, 2000.0)]);
        assert!(link.is_idle() && link.now_ms() == 5000.0);
    }

    #[test]
    fn a_transfer_joining_halfway_slows_the_first() {
        // Alone for 0.5 s (0.5 GB moved), then 0.5 GB/s each: the first finishes at 1.5 s, by
        // when the second has moved 0.5 GB; it runs alone for its last 0.5 GB.
        let mut link = FairLink::new(1.0);
        link.submit(0, 0, 0.0, 0.0, GB);
        assert!(link.advance(500.0).is_empty());
        link.submit(1, 1, 0.0, 500.0, GB);
        assert_eq!(link.next_event(), Some(1500.0));
        assert_eq!(link.advance(1500.0), [(0, 1500.0)]);
        assert_eq!(link.advance(f64::MAX), [(1, 2000.0)]);
    }

    #[test]
    fn first_byte_latency_takes_no_share() {
        // The second transfer is ready at 0.5 s: same times as joining halfway.
        let mut link = FairLink::new(1.0);
        link.submit(0, 0, 0.0, 0.0, GB);
        link.submit(1, 1, 0.0, 500.0, GB);
        assert_eq!(link.next_event(), Some(500.0));
        assert_eq!(link.advance(f64::MAX), [(0, 1500.0), (1, 2000.0)]);
    }

    #[test]
    fn a_client_cap_binds_before_the_shared_cap() {
        // Shared 4 GB/s; client 0 may use 1 GB/s for its two transfers, client 1 1 GB/s.
        // Client 0's transfers get 0.5 GB/s each (not the 4/3 shared share); client 1 gets 1 GB/s.
        let mut link = FairLink::new(4.0);
        link.submit(0, 0, 1.0, 0.0, GB);
        link.submit(1, 0, 1.0, 0.0, GB);
        link.submit(2, 1, 1.0, 0.0, GB);
        assert_eq!(link.advance(f64::MAX), [(2, 1000.0), (0, 2000.0), (1, 2000.0)]);
    }

    #[test]
    fn the_shared_cap_binds_before_a_client_cap() {
        // Shared 1 GB/s among three ready transfers of generous clients: 1/3 GB/s each.
        let mut link = FairLink::new(1.0);
        for id in 0..3 {
            link.submit(id, id, 10.0, 0.0, GB);
        }
        let done = link.advance(f64::MAX);
        assert_eq!(done.len(), 3);
        assert!(done.iter().all(|(_, at)| (at - 3000.0).abs() < 1e-9));
    }

    #[test]
    fn cancellation_gives_the_share_back() {
        let mut link = FairLink::new(1.0);
        link.submit(0, 0, 0.0, 0.0, GB);
        link.submit(1, 0, 0.0, 0.0, GB);
        assert!(link.advance(1000.0).is_empty()); // 0.5 GB each moved
        assert!(link.cancel(0) && !link.cancel(0));
        assert_eq!(link.next_event(), Some(1500.0));
        assert_eq!(link.advance(f64::MAX), [(1, 1500.0)]);
    }

    #[test]
    fn zero_bandwidth_completes_at_the_first_byte() {
        let mut link = FairLink::new(0.0);
        link.submit(0, 0, 0.0, 3.0, GB);
        link.submit(1, 0, 0.0, 0.0, GB);
        assert_eq!(link.advance(10.0), [(1, 0.0), (0, 3.0)]);
    }
}
