//! Per-request timelines and the run-level distributions built from them.
//!
//! Definitions (the reference's, pinned by its probes):
//! * TTFT = first token − arrival; TTST = second token − first token;
//!   E2E = last token − arrival; TPOT = (last − first) / (tokens − 1) per request.
//! * ITL and per-user output throughput pool **every token gap** of every request
//!   (`1000 / gap` for the latter, gaps of 0 skipped), with sketch quantiles.
//! * Only completed requests that produced tokens enter the latency distributions.

use std::sync::Arc;

use rustc_hash::FxHashMap;
use servesim_engine::{Finish, PassOutput, Role};

pub use crate::record::{Admission, Handoff, RequestRecord, Routing, Status, TtftBreakdown, TTFT_PARTS};
use crate::stats::{Samples, Sketch};
use servesim_workload::TurnMeta;

/// Service-level objectives for goodput; a completed request is good when it meets every bound
/// that is set.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sla {
    pub ttft_ms: Option<f64>,
    pub itl_ms: Option<f64>,
    pub e2e_ms: Option<f64>,
}

impl Sla {
    pub fn is_set(&self) -> bool {
        self.ttft_ms.is_some() || self.itl_ms.is_some() || self.e2e_ms.is_some()
    }

    fn met_by(&self, r: &RequestRecord) -> bool {
        // A request without tokens is measured at its terminal time.
        let end = r.last_token_ms.or(r.terminal_ms).unwrap_or(r.arrival_ms);
        let first = r.first_token_ms.unwrap_or(end);
        let (ttft, e2e) = (first - r.arrival_ms, end - r.arrival_ms);
        if self.ttft_ms.is_some_and(|b| ttft > b) || self.e2e_ms.is_some_and(|b| e2e > b) {
            return false;
        }
        if let Some(bound) = self.itl_ms {
            if r.output_length > 1 && (e2e - ttft) / (r.output_length - 1) as f64 > bound {
                return false;
            }
        }
        true
    }
}

/// Accumulates timelines while a run is in progress.
pub struct Collector<'s> {
    /// Requests in flight by id (their release ordinal).
    live: FxHashMap<u64, RequestRecord>,
    next_ordinal: u64,
    sla: Sla,
    sink: Option<&'s mut (dyn FnMut(&RequestRecord) + Send)>,
    pub(crate) totals: Totals,
    pub(crate) ttft: Samples,
    pub(crate) ttst: Samples,
    pub(crate) tpot: Samples,
    pub(crate) e2e: Samples,
    pub(crate) itl: Sketch,
    pub(crate) per_user: Sketch,
    /// The last token gap and its per-user rate (1000 / gap).
    last_rate: (f64, f64),
    /// Runs that may stop with requests in flight: each live request's token gaps, counted
    /// only when it finishes (the reference's ITL statistics leave out unfinished requests).
    pending_gaps: Option<rustc_hash::FxHashMap<u64, Vec<f64>>>,
    /// Requests that arrived and were not admitted yet (they hold memory while they wait).
    queued: u64,
    queue: QueueLimit,
    /// The TTFT parts' distributions, when asked for ([`Collector::with_ttft_breakdown`]).
    pub(crate) ttft_parts: Option<Box<[Samples; crate::record::TTFT_PARTS]>>,
    /// Time series sampled on the virtual clock, when asked for ([`Collector::with_telemetry`]).
    pub(crate) telemetry: Option<crate::telemetry::Telemetry<'s>>,
    /// Where the measured run began on the virtual clock (a warmed agentic profile's start;
    /// 0 otherwise): reported times are measured from it.
    origin_ms: f64,
    /// A warmed agentic run's preparation is under way: its records are not reported.
    preparing: bool,
    /// The run is a warmed agentic one (it began with a preparation).
    warmed: bool,
}

/// Whether the overload warning was printed.
static QUEUE_WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// What an open-loop run does when arrivals outpace the workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueLimit {
    /// Warn once on stderr when more requests than this wait for admission (in a split run,
    /// at one shard's workers).
    pub warn_at: u64,
    /// At most this many waiting requests, and what happens to an arrival beyond them.
    pub max: Option<(u64, Overflow)>,
    /// Without `max`: stop the run ([`crate::SimError::QueueRunaway`]) when an arrival finds
    /// this many requests waiting (in a split run, at one shard's workers): a queue that keeps
    /// growing takes all memory. `servesim predict` sets 100 × `warn_at`.
    pub runaway: Option<u64>,
}

impl Default for QueueLimit {
    fn default() -> Self {
        QueueLimit { warn_at: 100_000, max: None, runaway: None }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overflow {
    /// Stop the run with an error.
    Fail,
    /// Drop the arrival (counted as shed).
    Shed,
}

/// Run-level counters.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Totals {
    pub num_requests: u64,
    pub completed: u64,
    pub rejected: u64,
    pub incomplete: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub reused_tokens: u64,
    pub first_admission_reused_tokens: u64,
    /// Latest token time of a completed request.
    pub duration_ms: f64,
    pub good_requests: u64,
    pub good_output_tokens: u64,
    pub preemptions: u64,
    pub prefill_tokens: u64,
    /// Decode forwards and the tokens they produced (more tokens than forwards: accepted
    /// speculative drafts).
    pub decode_forwards: u64,
    pub decode_tokens: u64,
    /// Passes run inside fast-forwarded stretches (a performance statistic).
    pub stretched_passes: u64,
    /// Arrivals dropped because the admission queue was full (`QueueLimit` with `Shed`).
    pub shed: u64,
    /// Host (G2) KV offload counters over every rank, when any has a host cache.
    pub host_offload: Option<HostOffloadTotals>,
    /// SGLang host loop: sums of the TTFT parts over the completed requests with a first token.
    pub host_loop: Option<HostLoopTotals>,
    /// A native encoder pool: the completed requests' summed time from arrival to their images'
    /// embeddings landing, and how many requests that covers.
    pub encoder_wait: Option<(u64, f64)>,
}

/// Sums of [`RequestRecord::host_loop_parts_ms`] (the reference's `mean_frontend_ms`,
/// `mean_scheduler_inbox_wait_ms`, `mean_receive_to_admit_ms`, `mean_prefill_elapsed_ms`,
/// `mean_handoff_to_first_token_ms`) and how many requests they cover.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HostLoopTotals {
    pub requests: u64,
    pub sums_ms: [f64; 5],
}

impl HostLoopTotals {
    /// The mean of each part (0 over no request).
    pub fn means_ms(&self) -> [f64; 5] {
        self.sums_ms.map(|s| if self.requests == 0 { 0.0 } else { s / self.requests as f64 })
    }
}

/// What the host caches did over a run (servesim's own counters: the reference reports none),
/// and the G3 tiers below them (reported as the reference does).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HostOffloadTotals {
    /// Prompt tokens first admissions reused from blocks loaded from the host.
    pub hit_tokens: u64,
    pub stores: u64,
    pub d2h_bytes: u64,
    pub loads: u64,
    pub h2d_bytes: u64,
    pub loads_cancelled: u64,
    pub evicted_blocks: u64,
    /// Store preparations that found no room and were retried at a later pass.
    pub capacity_retries: u64,
    /// The G3 tiers' counters summed over workers, when they have G3.
    pub g3: Option<servesim_engine::offload::G3Stats>,
    /// A shared (`cluster_shared`) pool's `(capacity, resident, used)` blocks at the end, as
    /// Dynamo's `g2_domains` reports them.
    pub g2_domain: Option<(usize, usize, usize)>,
}

impl HostOffloadTotals {
    pub fn add(&mut self, c: &servesim_engine::vllm::HostCounters) {
        self.hit_tokens += c.host_hit_tokens;
        self.stores += c.tier.stores_completed;
        self.d2h_bytes += c.tier.bytes_stored;
        self.loads += c.tier.loads_completed;
        self.h2d_bytes += c.tier.bytes_loaded;
        self.loads_cancelled += c.tier.loads_cancelled;
        self.evicted_blocks += c.tier.blocks_evicted;
        self.capacity_retries += c.tier.capacity_retries;
        if let Some(g3) = &c.g3 {
            self.g3.get_or_insert_with(Default::default).merge(g3);
        }
    }

    fn merge(&mut self, o: &HostOffloadTotals) {
        let HostOffloadTotals {
            hit_tokens,
            stores,
            d2h_bytes,
            loads,
            h2d_bytes,
            loads_cancelled,
            evicted_blocks,
            capacity_retries,
            g3,
            g2_domain,
        } = *o;
        self.g2_domain = self.g2_domain.or(g2_domain);
        if let Some(g3) = &g3 {
            self.g3.get_or_insert_with(Default::default).merge(g3);
        }
        self.hit_tokens += hit_tokens;
        self.stores += stores;
        self.d2h_bytes += d2h_bytes;
        self.loads += loads;
        self.h2d_bytes += h2d_bytes;
        self.loads_cancelled += loads_cancelled;
        self.evicted_blocks += evicted_blocks;
        self.capacity_retries += capacity_retries;
    }
}

impl Totals {
    fn merge(&mut self, other: &Totals) {
        // Destructured so that a new counter cannot be forgotten here.
        let Totals {
            num_requests,
            completed,
            rejected,
            incomplete,
            input_tokens,
            output_tokens,
            reused_tokens,
            first_admission_reused_tokens,
            duration_ms,
            good_requests,
            good_output_tokens,
            preemptions,
            prefill_tokens,
            decode_forwards,
            decode_tokens,
            stretched_passes,
            shed,
            host_offload,
            host_loop,
            encoder_wait,
        } = *other;
        if let Some((n, sum)) = encoder_wait {
            let mine = self.encoder_wait.get_or_insert((0, 0.0));
            mine.0 += n;
            mine.1 += sum;
        }
        if let Some(h) = host_loop {
            let mine = self.host_loop.get_or_insert_with(HostLoopTotals::default);
            mine.requests += h.requests;
            for (a, b) in mine.sums_ms.iter_mut().zip(h.sums_ms) {
                *a += b;
            }
        }
        if let Some(h) = host_offload {
            self.host_offload.get_or_insert_with(HostOffloadTotals::default).merge(&h);
        }
        self.num_requests += num_requests;
        self.completed += completed;
        self.rejected += rejected;
        self.incomplete += incomplete;
        self.input_tokens += input_tokens;
        self.output_tokens += output_tokens;
        self.reused_tokens += reused_tokens;
        self.first_admission_reused_tokens += first_admission_reused_tokens;
        self.duration_ms = self.duration_ms.max(duration_ms);
        self.good_requests += good_requests;
        self.good_output_tokens += good_output_tokens;
        self.preemptions += preemptions;
        self.prefill_tokens += prefill_tokens;
        self.decode_forwards += decode_forwards;
        self.decode_tokens += decode_tokens;
        self.stretched_passes += stretched_passes;
        self.shed += shed;
    }
}

impl<'s> Collector<'s> {
    pub fn new(sla: Sla, sink: Option<&'s mut (dyn FnMut(&RequestRecord) + Send)>) -> Self {
        Collector {
            live: FxHashMap::default(),
            next_ordinal: 0,
            sla,
            sink,
            totals: Totals::default(),
            ttft: Samples::default(),
            ttst: Samples::default(),
            tpot: Samples::default(),
            e2e: Samples::default(),
            itl: Sketch::default(),
            per_user: Sketch::default(),
            last_rate: (f64::NAN, f64::NAN),
            pending_gaps: None,
            queued: 0,
            queue: QueueLimit::default(),
            ttft_parts: None,
            telemetry: None,
            origin_ms: 0.0,
            preparing: false,
            warmed: false,
        }
    }

    /// The run starts with a preparation (a warmed agentic snapshot): until
    /// [`Collector::begin_profile`], finished requests are not reported one by one.
    pub fn begin_preparation(&mut self) {
        self.preparing = true;
        self.warmed = true;
    }

    /// Starts the measured run at `origin_ms` (a warmed agentic profile opening, with nothing in
    /// flight): what was collected so far (the preparation) is dropped, and reported times are
    /// measured from there on.
    pub fn begin_profile(&mut self, origin_ms: f64) {
        debug_assert!(self.live.is_empty(), "the profile opens with nothing in flight");
        self.origin_ms = origin_ms;
        self.preparing = false;
        self.totals = Totals::default();
        for samples in [&mut self.ttft, &mut self.ttst, &mut self.tpot, &mut self.e2e] {
            samples.clear();
        }
        for samples in self.ttft_parts.iter_mut().flat_map(|p| p.iter_mut()) {
            samples.clear();
        }
        self.itl = Sketch::default();
        self.per_user = Sketch::default();
        self.last_rate = (f64::NAN, f64::NAN);
    }

    /// Where the measured run began (see [`Collector::begin_profile`]).
    pub fn origin_ms(&self) -> f64 {
        self.origin_ms
    }

    /// Collects the distributions of the TTFT parts ([`TtftBreakdown`]) for the summary.
    pub fn with_ttft_breakdown(mut self) -> Self {
        self.ttft_parts = Some(Box::default());
        self
    }

    pub fn has_ttft_breakdown(&self) -> bool {
        self.ttft_parts.is_some()
    }

    /// Samples per-worker and cluster time series every `interval_ms` of virtual time and hands
    /// them to `sink` as the run goes (the run is then not split across threads).
    pub fn with_telemetry(
        mut self,
        interval_ms: f64,
        sink: &'s mut (dyn crate::telemetry::TelemetrySink + Send),
    ) -> Self {
        self.telemetry = Some(crate::telemetry::Telemetry::new(interval_ms, sink));
        self
    }

    /// Telemetry samples timed and counted as Dynamo's replay telemetry does (a baseline at
    /// t = 0, samples after their instant's arrivals, a final sample at the end; decode passes
    /// are not fast-forwarded). Call after [`Collector::with_telemetry`].
    pub fn with_dynamo_samples(mut self) -> Self {
        if let Some(t) = self.telemetry.as_mut() {
            t.dynamo = true;
        }
        self
    }

    pub fn has_telemetry(&self) -> bool {
        self.telemetry.is_some()
    }

    /// Requests that arrived and wait for their first admission.
    pub fn waiting_for_admission(&self) -> u64 {
        self.queued
    }

    /// Sets what happens when requests pile up waiting for admission.
    pub fn with_queue_limit(mut self, queue: QueueLimit) -> Self {
        self.queue = queue;
        self
    }

    pub fn queue_limit(&self) -> QueueLimit {
        self.queue
    }

    /// What to do with an arrival now: `None` to take it, or the overflow policy when the
    /// queue is full.
    pub fn overflow(&self) -> Option<(u64, Overflow)> {
        self.queue.max.filter(|&(max, _)| self.queued >= max)
    }

    /// The runaway bound an arrival now would pass (see [`QueueLimit::runaway`]).
    pub fn runaway(&self) -> Option<u64> {
        self.queue.runaway.filter(|&n| self.queue.max.is_none() && self.queued >= n)
    }

    /// Counts an arrival dropped because the queue was full.
    pub fn shed(&mut self) {
        self.totals.shed += 1;
    }

    /// Registers a released request; returns its id (its release ordinal).
    pub fn arrive(
        &mut self,
        session: Option<Arc<str>>,
        turn: u32,
        arrival_ms: f64,
        input: u32,
        output: u32,
        meta: Option<Arc<TurnMeta>>,
    ) -> u64 {
        let record = RequestRecord {
            ordinal: self.next_ordinal,
            session,
            turn,
            arrival_ms,
            frontend_done_ms: None,
            frontend_staged: false,
            warmed_profile: self.warmed && !self.preparing,
            encoder_ready_ms: None,
            first_admit_ms: None,
            scheduler_received_ms: None,
            terminal_ms: None,
            first_token_ms: None,
            second_token_ms: None,
            last_token_ms: None,
            input_length: input,
            requested_output_length: output,
            output_length: 0,
            reused_input_tokens: 0,
            first_admission_reused_input_tokens: 0,
            first_admission_tiers: None,
            admissions: 0,
            status: Status::Incomplete,
            prefill_worker: None,
            decode_worker: None,
            dp_rank: 0,
            route_overlap_tokens: None,
            queue_wait_ms: 0.0,
            handoff: None,
            meta,
            routing: Vec::new(),
            admission_history: Vec::new(),
        };
        self.next_ordinal += 1;
        self.totals.num_requests += 1;
        self.queued += 1;
        // Once per process: a split run has a collector per shard.
        if self.queued > self.queue.warn_at && !QUEUE_WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
            eprintln!(
                "warning: more than {} requests have arrived and wait for admission at t={arrival_ms:.3} ms; the \
                 workers cannot keep up and memory grows with the queue (--max-queued bounds it)",
                self.queue.warn_at
            );
        }
        let id = record.ordinal;
        self.live.insert(id, record);
        id
    }

    /// SGLang host loop: the worker's scheduler received request `id` at `at_ms` (the first
    /// receipt counts).
    pub fn received(&mut self, id: u64, at_ms: f64) {
        if let Some(r) = self.live.get_mut(&id) {
            r.scheduler_received_ms.get_or_insert(at_ms);
        }
    }

    /// Notes when the frontend's tokenization stage passed request `id` on (see
    /// [`RequestRecord::frontend_done_ms`]).
    pub fn tokenized(&mut self, id: u64, at_ms: f64) {
        if let Some(r) = self.live.get_mut(&id) {
            r.frontend_done_ms = Some(at_ms);
        }
    }

    /// Notes when request `id`'s images all reached the language worker from a native encoder
    /// pool (see [`RequestRecord::encoder_ready_ms`]).
    pub fn encoded(&mut self, id: u64, at_ms: f64) {
        if let Some(r) = self.live.get_mut(&id) {
            r.encoder_ready_ms = Some(at_ms);
        }
    }

    /// Notes when request `id` left its worker's SGLang frontend stages (see
    /// [`RequestRecord::frontend_ms`]).
    pub fn staged(&mut self, id: u64, at_ms: f64) {
        if let Some(r) = self.live.get_mut(&id) {
            r.frontend_done_ms = Some(at_ms);
            r.frontend_staged = true;
        }
    }

    /// Gives the next release ordinal to a request another shard of the run replays.
    pub fn skip_arrival(&mut self) {
        self.next_ordinal += 1;
    }

    /// Whether finished requests are reported one by one (to a JSONL writer).
    pub fn has_sink(&self) -> bool {
        self.sink.is_some()
    }

    /// Told how many requests the run has at most: per-request distributions of runs too large
    /// for exact quantiles are sketched from the start (see [`Samples::expect`]).
    pub fn expect_requests(&mut self, n: u64) {
        for samples in [&mut self.ttft, &mut self.ttst, &mut self.tpot, &mut self.e2e] {
            samples.expect(n);
        }
        for samples in self.ttft_parts.iter_mut().flat_map(|p| p.iter_mut()) {
            samples.expect(n);
        }
    }

    /// Folds in what another shard of the same run collected (its requests all finished).
    pub fn merge(&mut self, other: &Collector<'_>) {
        debug_assert!(other.live.is_empty());
        self.totals.merge(&other.totals);
        self.ttft.merge(&other.ttft);
        self.ttst.merge(&other.ttst);
        self.tpot.merge(&other.tpot);
        self.e2e.merge(&other.e2e);
        self.itl.merge(&other.itl);
        self.per_user.merge(&other.per_user);
        if let (Some(mine), Some(theirs)) = (self.ttft_parts.as_mut(), other.ttft_parts.as_ref()) {
            for (a, b) in mine.iter_mut().zip(theirs.iter()) {
                a.merge(b);
            }
        }
    }

    fn get(&mut self, id: u64) -> &mut RequestRecord {
        self.live.get_mut(&id).expect("request is in flight")
    }

    /// The request was placed on rank `dp_rank` of `worker` in the `role` pool.
    #[allow(clippy::too_many_arguments)]
    pub fn placed(
        &mut self,
        id: u64,
        role: Role,
        worker: usize,
        dp_rank: usize,
        scheduler: usize,
        overlap_tokens: u32,
        overlap_blocks: Option<(u32, u32)>,
        queued_at: Option<f64>,
        now: f64,
    ) {
        let r = self.get(id);
        let worker = worker as u32;
        r.dp_rank = dp_rank as u32;
        if let Some(q) = queued_at {
            r.queue_wait_ms += now - q;
        }
        r.routing.push(Routing {
            pool: role,
            queued_at_ms: queued_at,
            placed_at_ms: now,
            worker,
            dp_rank: dp_rank as u32,
            scheduler: scheduler as u32,
            overlap_tokens,
            overlap_blocks,
        });
        match role {
            Role::Aggregated => {
                r.decode_worker = Some(worker);
                r.route_overlap_tokens = Some(overlap_tokens);
            }
            Role::Prefill => {
                r.prefill_worker = Some(worker);
                r.route_overlap_tokens = Some(overlap_tokens);
            }
            Role::Decode => {
                r.decode_worker = Some(worker);
                r.handoff.get_or_insert_with(Handoff::default).decode_route_overlap_tokens = Some(overlap_tokens);
            }
        }
    }

    /// The prefill worker finished the prompt and holds its KV (disaggregated).
    pub fn source_held(&mut self, id: u64, at_ms: f64) {
        self.get(id).handoff.get_or_insert_with(Handoff::default).source_held_ms = Some(at_ms);
    }

    pub fn destination_reserved(&mut self, id: u64, at_ms: f64) {
        self.get(id).handoff.get_or_insert_with(Handoff::default).destination_reserved_ms = Some(at_ms);
    }

    pub fn destination_activated(&mut self, id: u64, at_ms: f64) {
        self.get(id).handoff.get_or_insert_with(Handoff::default).destination_activated_ms = Some(at_ms);
    }

    /// The prefill worker freed its copy after the transfer (a failed handoff's copy is dropped,
    /// which the reference does not report as a release).
    pub fn source_released(&mut self, id: u64, at_ms: f64) {
        let h = self.get(id).handoff.get_or_insert_with(Handoff::default);
        if !h.destination_refused {
            h.source_released_ms = Some(at_ms);
        }
    }

    /// The decode worker refused the request: its handoff failed, and so does the request.
    pub fn destination_refused(&mut self, id: u64) {
        self.get(id).handoff.get_or_insert_with(Handoff::default).destination_refused = true;
    }

    /// An admission on the decode worker (the first, or a readmission after a preemption
    /// there); `reused` is the prefix-cache hit it reports (none for a transferred prompt). The
    /// record keeps the largest hit over the decode admissions, as the reference does.
    pub fn decode_admit(&mut self, id: u64, at_ms: f64, reused: u32) {
        let r = self.get(id);
        r.admissions += 1;
        r.push_admission(Role::Decode, at_ms, reused);
        let h = r.handoff.get_or_insert_with(Handoff::default);
        h.decode_admit_ms.get_or_insert(at_ms);
        h.decode_reused_input_tokens = Some(h.decode_reused_input_tokens.unwrap_or(0).max(reused));
    }

    pub fn arrival_of(&self, id: u64) -> f64 {
        self.live[&id].arrival_ms
    }

    pub fn admit(&mut self, id: u64, at_ms: f64, reused: u32) {
        let r = self.live.get_mut(&id).expect("request is in flight");
        if r.first_admit_ms.is_none() {
            self.queued -= 1;
            r.first_admit_ms = Some(at_ms);
            r.first_admission_reused_input_tokens = reused;
        }
        r.admissions += 1;
        r.reused_input_tokens = r.reused_input_tokens.max(reused);
        // The prompt's pool: SGLang's disaggregated requests are placed on decode first.
        let pool = r
            .routing
            .iter()
            .find(|p| p.pool != Role::Decode)
            .or(r.routing.first())
            .map_or(Role::Aggregated, |p| p.pool);
        r.push_admission(pool, at_ms, reused);
    }

    /// Where the reused tokens of the admission just recorded came from (with host offload,
    /// reported for first admissions).
    pub fn admit_tiers(&mut self, id: u64, tiers: (u32, u32)) {
        let r = self.get(id);
        r.first_admission_tiers.get_or_insert(tiers);
        if let Some(last) = r.admission_history.last_mut() {
            last.tiers = Some(tiers);
        }
    }

    /// Records a visible token; returns whether it was the request's first.
    pub fn token(&mut self, id: u64, at_ms: f64) -> bool {
        let r = self.get(id);
        let first = r.output_length == 0;
        let gap = r.last_token_ms.map(|last| at_ms - last);
        match r.output_length {
            0 => r.first_token_ms = Some(at_ms),
            1 => r.second_token_ms = Some(at_ms),
            _ => {}
        }
        r.last_token_ms = Some(at_ms);
        r.output_length += 1;
        if let Some(gap) = gap {
            match self.pending_gaps.as_mut() {
                Some(pending) => pending.entry(id).or_default().push(gap),
                None => self.token_gap(gap, 1),
            }
        }
        first
    }

    /// The run may stop with requests in flight (a virtual-time stop): token gaps count when
    /// their request finishes, not as they come.
    pub(crate) fn defer_token_gaps(&mut self) {
        self.pending_gaps.get_or_insert_with(Default::default);
    }

    /// Counts `n` token gaps of `gap_ms`: one ITL sample each, and a per-user rate.
    fn token_gap(&mut self, gap_ms: f64, n: u64) {
        self.itl.add_n(gap_ms, n);
        if gap_ms > 0.0 {
            // Gaps repeat (a pass's tokens share one), and so does their rate.
            if gap_ms != self.last_rate.0 {
                self.last_rate = (gap_ms, 1000.0 / gap_ms);
            }
            self.per_user.add_n(self.last_rate.1, n);
        }
    }

    /// The tokens of a fast-forwarded stretch: each of `ids` (all past their first token)
    /// gets one token at each of `ends`.
    pub fn stretch_tokens(&mut self, ids: &[u64], ends: &[f64]) {
        let (Some(&first), Some(&last)) = (ends.first(), ends.last()) else {
            return;
        };
        if self.pending_gaps.is_some() {
            for &end in ends {
                for &id in ids {
                    self.token(id, end);
                }
            }
            return;
        }
        for &id in ids {
            let r = self.live.get_mut(&id).expect("request is in flight");
            let previous = r.last_token_ms.expect("a stretch decodes requests that have tokens");
            if r.output_length == 1 {
                r.second_token_ms = Some(first);
            }
            r.output_length += ends.len() as u32;
            r.last_token_ms = Some(last);
            self.token_gap(first - previous, 1);
        }
        // Later gaps are the passes' durations, the same for every request.
        for pair in ends.windows(2) {
            self.token_gap(pair[1] - pair[0], ids.len() as u64);
        }
    }

    /// Counts decode forwards and their tokens (fast-forwarded passes).
    pub fn count_decode(&mut self, forwards: u64, tokens: u64) {
        self.totals.decode_forwards += forwards;
        self.totals.decode_tokens += tokens;
    }

    /// Counts what a pass did beyond individual requests' timelines.
    pub fn count_pass(&mut self, out: &PassOutput, visible: bool) {
        self.totals.preemptions += out.preempted.len() as u64;
        self.totals.prefill_tokens += out.prefill_tokens;
        if visible {
            self.totals.decode_forwards += out.decode_forwards as u64;
            self.totals.decode_tokens += out.decode_tokens as u64;
        }
    }

    /// The record of a request in flight.
    pub fn live(&self, id: u64) -> Option<&RequestRecord> {
        self.live.get(&id)
    }

    /// Closes a request's timeline and folds it into the run metrics.
    pub fn finish(&mut self, id: u64, at_ms: f64, finish: Finish) {
        let mut r = self.live.remove(&id).expect("request is in flight");
        if r.first_admit_ms.is_none() {
            self.queued -= 1;
        }
        r.terminal_ms = Some(at_ms);
        let refused = r.handoff.as_ref().is_some_and(|h| h.destination_refused);
        r.status = match finish {
            Finish::Completed => Status::Completed,
            Finish::Rejected(reason) if refused => Status::Failed(reason),
            Finish::Rejected(reason) => Status::Rejected(reason),
        };
        if let Some(gaps) = self.pending_gaps.as_mut().and_then(|p| p.remove(&id)) {
            for gap in gaps {
                self.token_gap(gap, 1);
            }
        }
        self.fold(&r);
    }

    fn fold(&mut self, r: &RequestRecord) {
        let t = &mut self.totals;
        match r.status {
            Status::Completed => {
                t.completed += 1;
                t.input_tokens += r.input_length as u64;
                t.output_tokens += r.output_length as u64;
                let decode_reused = r.handoff.as_ref().and_then(|h| h.decode_reused_input_tokens).unwrap_or(0);
                t.reused_tokens += r.reused_input_tokens.max(decode_reused) as u64;
                t.first_admission_reused_tokens += r.first_admission_reused_input_tokens as u64;
                if let Some(last) = r.last_token_ms {
                    t.duration_ms = t.duration_ms.max(last - self.origin_ms);
                }
                if self.sla.is_set() && self.sla.met_by(r) {
                    t.good_requests += 1;
                    t.good_output_tokens += r.output_length as u64;
                }
                if let Some(v) = r.ttft_ms() {
                    self.ttft.add(v);
                }
                if let Some(ready) = r.encoder_ready_ms {
                    let e = t.encoder_wait.get_or_insert((0, 0.0));
                    e.0 += 1;
                    e.1 += ready - r.arrival_ms;
                }
                if let Some(parts) = r.host_loop_parts_ms() {
                    let h = t.host_loop.get_or_insert_with(HostLoopTotals::default);
                    h.requests += 1;
                    for (sum, v) in h.sums_ms.iter_mut().zip(parts) {
                        *sum += v;
                    }
                }
                if let (Some(parts), Some(b)) = (self.ttft_parts.as_mut(), r.ttft_breakdown_ms()) {
                    for (samples, v) in parts.iter_mut().zip(b.parts()) {
                        samples.add(v);
                    }
                }
                if let Some(v) = r.ttst_ms() {
                    self.ttst.add(v);
                }
                if let Some(v) = r.tpot_ms() {
                    self.tpot.add(v);
                }
                if let Some(v) = r.e2e_ms() {
                    self.e2e.add(v);
                }
                if let Some(tel) = self.telemetry.as_mut() {
                    tel.traffic.add_completion(r);
                }
            }
            Status::Rejected(_) | Status::Failed(_) => t.rejected += 1,
            Status::Incomplete | Status::Canceled => t.incomplete += 1,
        }
        if let Some(sink) = self.sink.as_mut().filter(|_| !self.preparing) {
            if self.origin_ms == 0.0 {
                sink(r);
            } else {
                sink(&r.rebased(self.origin_ms));
            }
        }
    }

    /// Sets the run's measured duration (an agentic profile measures its observation window).
    pub(crate) fn set_duration_ms(&mut self, ms: f64) {
        self.totals.duration_ms = ms;
    }

    /// Reports the requests still in flight as incomplete (the run was cut short), or as
    /// cancelled at `canceled_at_ms` (an agentic profile's deadline cancels them).
    pub fn close_incomplete(&mut self, canceled_at_ms: Option<f64>) {
        let mut pending: Vec<RequestRecord> = self.live.drain().map(|(_, r)| r).collect();
        pending.sort_by_key(|r| r.ordinal);
        for mut r in pending {
            if let Some(at) = canceled_at_ms {
                r.status = Status::Canceled;
                r.terminal_ms = Some(at);
            }
            self.fold(&r);
        }
    }
}
