//! A native encoder pool (aisimulate's `engine.workers.encoder` with `mode: native`: SGLang's
//! `--encoder-only` servers): a released request's images are encoded here before the request
//! reaches the router; its arrival time stays the release time, so its TTFT includes the pool.
//!
//! The rules (probed on the reference's compiled replay; see the replay README's "Native
//! encoder pool"):
//! - a request's `count` images are split into `min(count, instances)` parts as evenly as
//!   possible, the larger parts first; part `j` of the `i`-th request (release order) goes to
//!   server `(i + j) mod instances` and waits in that server's FIFO queue;
//! - an idle server takes up to `max_batch` parts from its queue (parts, not images) and runs
//!   them as one batch: the image processor over the batch's images
//!   (`preprocess_ms_per_image` each) and then one call of the vision tower over all of them;
//! - each part's embeddings then travel to the language worker on their own link:
//!   `transfer_ms_per_image` per image of the part, transfers never waiting for each other,
//!   and the server takes its next batch as soon as the tower call ends;
//! - a request leaves the pool when the last of its parts has arrived.

use std::collections::{BTreeMap, VecDeque};

use servesim_engine::Prompt;
use servesim_workload::time::Time;
use servesim_workload::Ready;

/// The pool's shape and costs.
#[derive(Clone, Debug, PartialEq)]
pub struct EncoderPool {
    /// Encoder servers (at least 1).
    pub instances: u32,
    /// Parts one server batches at most (SGLang's `SGLANG_ENCODER_MAX_BATCH_SIZE`).
    pub max_batch: u32,
    /// Images on every request.
    pub images_per_request: u32,
    /// CPU preprocessing of one image on a server, ms.
    pub preprocess_ms_per_image: f64,
    /// Bytes of one image's embeddings sent to the language worker (all its ranks).
    pub transfer_bytes_per_image: f64,
    /// The link's bandwidth, GB/s (10^9 bytes).
    pub transfer_bandwidth_gb_s: f64,
    /// One call of the tower over `n` images, ms, at index `n` (index 0: 0 ms), up to the
    /// largest batch: `max_batch` parts of the largest part.
    pub tower_ms: Vec<f64>,
}

impl EncoderPool {
    /// The image counts of a request's parts, larger first.
    pub fn parts(&self) -> Vec<u32> {
        let n = self.images_per_request;
        let k = n.min(self.instances.max(1));
        if k == 0 {
            return Vec::new();
        }
        (0..k).map(|j| n / k + u32::from(j < n % k)).collect()
    }

    /// The most images one batch holds.
    pub fn max_batch_images(&self) -> u32 {
        self.parts().first().copied().unwrap_or(0) * self.max_batch.max(1)
    }

    fn transfer_ms(&self, images: u32) -> f64 {
        f64::from(images) * self.transfer_bytes_per_image / (self.transfer_bandwidth_gb_s * 1e9) * 1e3
    }
}

/// A request in the pool: what it will be released with, and its parts still on the way.
struct Job {
    ready: Ready,
    prompt: Prompt,
    remaining: u32,
    done_ms: f64,
}

/// One part queued on a server: its request (release order) and its image count.
#[derive(Clone, Copy)]
struct Part {
    job: u64,
    images: u32,
}

#[derive(Default)]
struct Server {
    queue: VecDeque<Part>,
    /// When the tower call of its batch in flight ends (None: idle).
    busy_until: Option<f64>,
}

/// A turn whose images all reached the language worker.
pub(super) struct EncodedTurn {
    pub ready: Ready,
    pub prompt: Prompt,
}

/// The pool's state.
pub(super) struct Encoders {
    spec: EncoderPool,
    servers: Vec<Server>,
    jobs: BTreeMap<u64, Job>,
    /// Requests whose last part lands at a time, by (that time, release order).
    done: BTreeMap<(Time, u64), u64>,
    next_job: u64,
}

impl Encoders {
    pub fn new(spec: EncoderPool) -> Encoders {
        let servers = (0..spec.instances.max(1)).map(|_| Server::default()).collect();
        Encoders { spec, servers, jobs: BTreeMap::new(), done: BTreeMap::new(), next_job: 0 }
    }

    /// A turn released at `now` enters its servers' queues; `settle(now)` starts the batches
    /// once every turn of the instant is in (they batch together).
    pub fn admit(&mut self, now: f64, ready: Ready, prompt: Prompt) {
        let job = self.next_job;
        self.next_job += 1;
        let parts = self.spec.parts();
        if parts.is_empty() {
            // No image: it passes straight through.
            self.jobs.insert(job, Job { ready, prompt, remaining: 0, done_ms: now });
            self.done.insert((Time(now), job), job);
            return;
        }
        let w = self.servers.len() as u64;
        for (j, &images) in parts.iter().enumerate() {
            let server = ((job + j as u64) % w) as usize;
            self.servers[server].queue.push_back(Part { job, images });
        }
        self.jobs.insert(job, Job { ready, prompt, remaining: parts.len() as u32, done_ms: f64::NEG_INFINITY });
    }

    /// Brings the servers to `now`: a server whose batch ended by then, or idle, takes its next
    /// batch from what waits now (the pool is visited at every batch's end: see
    /// [`Self::next_event_ms`]).
    pub fn settle(&mut self, now: f64) {
        for s in &mut self.servers {
            if s.busy_until.is_some_and(|t| t <= now) {
                s.busy_until = None;
            }
        }
        self.start_batches(now);
    }

    fn start_batches(&mut self, now: f64) {
        let cap = self.spec.max_batch.max(1) as usize;
        for s in &mut self.servers {
            if s.busy_until.is_some() || s.queue.is_empty() {
                continue;
            }
            let take = s.queue.len().min(cap);
            let batch: Vec<Part> = s.queue.drain(..take).collect();
            let images: u32 = batch.iter().map(|p| p.images).sum();
            // The table is built up to `max_batch_images`, which no batch exceeds.
            let tower = self.spec.tower_ms[images as usize];
            let end = now + (self.spec.preprocess_ms_per_image * f64::from(images) + tower);
            s.busy_until = Some(end);
            for p in batch {
                let landed = end + self.spec.transfer_ms(p.images);
                let job = self.jobs.get_mut(&p.job).expect("a queued part's request is in the pool");
                job.remaining -= 1;
                job.done_ms = job.done_ms.max(landed);
                if job.remaining == 0 {
                    self.done.insert((Time(job.done_ms), p.job), p.job);
                }
            }
        }
    }

    /// The next instant the pool changes: a batch ends or a request's images all landed.
    pub fn next_event_ms(&self) -> Option<f64> {
        let busy = self.servers.iter().filter_map(|s| s.busy_until).reduce(f64::min);
        let done = self.done.first_key_value().map(|((t, _), _)| t.0);
        [busy, done].into_iter().flatten().reduce(f64::min)
    }

    /// The next request whose images all landed by `now`, in (time, release order) order, with
    /// when they did.
    pub fn pop_done(&mut self, now: f64) -> Option<(EncodedTurn, f64)> {
        let (&(t, _), _) = self.done.first_key_value()?;
        if t.0 > now {
            return None;
        }
        let (_, job) = self.done.pop_first().expect("peeked");
        let j = self.jobs.remove(&job).expect("a finished request is in the pool");
        Some((EncodedTurn { ready: j.ready, prompt: j.prompt }, t.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(instances: u32, max_batch: u32, count: u32) -> EncoderPool {
        EncoderPool {
            instances,
            max_batch,
            images_per_request: count,
            preprocess_ms_per_image: 1.0,
            transfer_bytes_per_image: 1e6,
            transfer_bandwidth_gb_s: 1.0,
            // 10 ms a call plus 1 ms an image.
            tower_ms: (0..=64).map(|n| if n == 0 { 0.0 } else { 10.0 + f64::from(n) }).collect(),
        }
    }

    fn run(p: EncoderPool, arrivals: &[f64]) -> Vec<(u32, f64)> {
        let mut e = Encoders::new(p);
        let mut out = Vec::new();
        let mut pending: VecDeque<f64> = arrivals.iter().copied().collect();
        let mut session = 0;
        loop {
            let next = [pending.front().copied(), e.next_event_ms()].into_iter().flatten().reduce(f64::min);
            let Some(now) = next else { break };
            while pending.front().is_some_and(|&t| t <= now) {
                pending.pop_front();
                e.admit(now, Ready { session, turn: 0, arrival_ms: now }, Prompt::Tokens(vec![1].into()));
                session += 1;
            }
            e.settle(now);
            while let Some((t, at)) = e.pop_done(now) {
                out.push((t.ready.session, at));
            }
        }
        out
    }

    /// Three images over two servers: parts of 2 and 1, the second request's larger part on
    /// the second server (rotation by request); a batch's parts land 1 ms an image after its
    /// tower call.
    #[test]
    fn parts_rotate_over_servers_and_land_after_the_call() {
        assert_eq!(pool(2, 1, 3).parts(), vec![2, 1]);
        assert_eq!(pool(3, 1, 4).parts(), vec![2, 1, 1]);
        assert_eq!(pool(4, 1, 2).parts(), vec![1, 1]);
        let out = run(pool(2, 1, 3), &[0.0, 1.0]);
        // Request 0: server 0 busy 0..14 (2 images), server 1 0..12; lands at 16 and 13.
        // Request 1: 2 images on server 1 at 12..26 -> 28; 1 image on server 0 at 14..26 -> 27.
        assert_eq!(out, vec![(0, 16.0), (1, 28.0)]);
    }

    /// Requests released at one instant batch together (a closed loop's first requests).
    #[test]
    fn requests_released_together_batch_together() {
        let out = run(pool(1, 4, 1), &[0.0, 0.0, 0.0]);
        // 3 ms of processing and a 13 ms call, then 1 ms each way.
        assert_eq!(out, vec![(0, 17.0), (1, 17.0), (2, 17.0)]);
    }

    /// One server batching up to 4 parts FIFO: the first request runs alone, the next four
    /// wait and run together, the sixth after them.
    #[test]
    fn an_idle_server_batches_what_waits() {
        let out = run(pool(1, 4, 1), &[0.0, 0.5, 1.0, 1.5, 2.0, 2.5]);
        // 0..12 -> 13; 12..(12 + 4 + 14) = 30 -> 31 (four); 30..42 -> 43.
        let times: Vec<f64> = out.iter().map(|o| o.1).collect();
        assert_eq!(times, vec![13.0, 31.0, 31.0, 31.0, 31.0, 43.0]);
    }
}
