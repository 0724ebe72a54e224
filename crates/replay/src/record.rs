//! A request's record: its timeline, placements, admissions and handoff milestones, as the
//! per-request reports write it and the run's distributions are built from it. A leaf: the
//! metrics collector fills records in, telemetry and reports read them.

use std::sync::Arc;

use servesim_engine::{RejectReason, Role};
use servesim_workload::TurnMeta;

/// How a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Completed,
    Rejected(RejectReason),
    /// Disaggregated: the prompt was computed but the decode worker refused the handoff (the
    /// request cannot fit its cache); the reference's `failed`. Counted with the rejections.
    Failed(RejectReason),
    /// Still in flight when an agentic profile's deadline passed: the client cancelled it.
    /// Counted with the incomplete requests.
    Canceled,
    /// Still in flight when the run stopped.
    Incomplete,
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::Completed => "completed",
            Status::Rejected(_) => "rejected",
            Status::Failed(_) => "failed",
            Status::Canceled => "canceled",
            Status::Incomplete => "incomplete",
        }
    }
}

/// The life of one request, as reported per request.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestRecord {
    /// Release order, from 0.
    pub ordinal: u64,
    /// The session's name (`session_id`; `None` outside a session) and the turn's index in it.
    pub session: Option<Arc<str>>,
    pub turn: u32,
    pub arrival_ms: f64,
    /// When the frontend passed the request on: its tokenization stage to the router, or the
    /// worker's SGLang frontend stages to its scheduler (`None` without either).
    pub frontend_done_ms: Option<f64>,
    /// Whether `frontend_done_ms` is the end of SGLang frontend stages (the host loop counts
    /// their time as `mean_frontend_ms`; tokenization's falls in the inbox wait).
    pub frontend_staged: bool,
    /// Released in the measured profile of a warmed agentic run (the reference marks these
    /// `agentic_phase: "profile"`; the preparation's requests are not reported).
    pub warmed_profile: bool,
    /// When the last of its images' embeddings reached the language worker from a native
    /// encoder pool (`None` without one).
    pub encoder_ready_ms: Option<f64>,
    pub first_admit_ms: Option<f64>,
    /// SGLang host loop: when the worker's scheduler received it from its inbox (the pass
    /// boundary after its arrival); `None` without the loop.
    pub scheduler_received_ms: Option<f64>,
    pub terminal_ms: Option<f64>,
    pub first_token_ms: Option<f64>,
    pub second_token_ms: Option<f64>,
    pub last_token_ms: Option<f64>,
    pub input_length: u32,
    pub requested_output_length: u32,
    /// Tokens actually generated.
    pub output_length: u32,
    /// Largest prefix-cache hit over its admissions.
    pub reused_input_tokens: u32,
    pub first_admission_reused_input_tokens: u32,
    /// With host offload: the first admission's reused tokens found on the device and those
    /// loaded from the host (the reference's `first_admission_{g1,host}_reused_input_tokens`).
    pub first_admission_tiers: Option<(u32, u32)>,
    pub admissions: u32,
    pub status: Status,
    /// The worker that computed the prompt (disaggregated), and the one that decoded.
    pub prefill_worker: Option<u32>,
    pub decode_worker: Option<u32>,
    /// Attention data-parallel rank within the (aggregated) worker.
    pub dp_rank: u32,
    /// Prefix tokens the router believed cached on the worker it chose (first pool).
    pub route_overlap_tokens: Option<u32>,
    /// Time spent in the router queue.
    pub queue_wait_ms: f64,
    pub handoff: Option<Handoff>,
    /// Ids from the trace (request id, agentic ids).
    pub meta: Option<Arc<TurnMeta>>,
    /// Every placement on a worker, in order.
    pub routing: Vec<Routing>,
    /// Every admission into a running batch, in order.
    pub admission_history: Vec<Admission>,
}

/// One placement of a request on a worker (the reference's `routing_history` entries).
#[derive(Clone, Debug, PartialEq)]
pub struct Routing {
    pub pool: Role,
    /// When it entered the router queue, if it waited there.
    pub queued_at_ms: Option<f64>,
    pub placed_at_ms: f64,
    pub worker: u32,
    pub dp_rank: u32,
    /// The rank's scheduler in the pool's flat numbering, `worker × dp + dp_rank` (the
    /// reference's `scheduler_id` and `*_worker_idx`).
    pub scheduler: u32,
    pub overlap_tokens: u32,
    /// The KV router's overlap: blocks cached on the chosen worker and the most on any eligible
    /// one (`None` under round robin).
    pub overlap_blocks: Option<(u32, u32)>,
}

/// One admission (the reference's `admission_history` entries).
#[derive(Clone, Debug, PartialEq)]
pub struct Admission {
    pub pool: Role,
    pub at_ms: f64,
    pub reused_tokens: u32,
    /// Its index among the request's admissions in this pool.
    pub pool_ordinal: u32,
    /// `reused_tokens` split into device (G1) and host tokens, on a rank with a host cache; the
    /// reference writes the split for a request's first admission only.
    pub tiers: Option<(u32, u32)>,
}

/// Milestones of the prefill-to-decode handoff of a disaggregated request.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Handoff {
    /// Prefill done; the prefill worker holds the KV.
    pub source_held_ms: Option<f64>,
    pub destination_reserved_ms: Option<f64>,
    /// The KV reached the decode worker.
    pub destination_activated_ms: Option<f64>,
    /// The prefill worker freed its copy (at the end of the pass it was running then).
    pub source_released_ms: Option<f64>,
    pub decode_admit_ms: Option<f64>,
    /// Largest prefix-cache hit of the decode admissions: none for a transferred prompt, but a
    /// readmission after a preemption there reuses cached blocks (the summary's reuse counts it).
    pub decode_reused_input_tokens: Option<u32>,
    pub decode_route_overlap_tokens: Option<u32>,
    /// The decode worker refused the request: the handoff failed (the prefill copy was dropped,
    /// not released after a transfer).
    pub destination_refused: bool,
}

impl RequestRecord {
    /// The record with every time measured from `origin_ms` (a warmed profile's start).
    pub fn rebased(&self, origin_ms: f64) -> RequestRecord {
        let shift = |t: &mut f64| *t -= origin_ms;
        let mut r = self.clone();
        shift(&mut r.arrival_ms);
        for t in [
            &mut r.frontend_done_ms,
            &mut r.encoder_ready_ms,
            &mut r.first_admit_ms,
            &mut r.scheduler_received_ms,
            &mut r.terminal_ms,
            &mut r.first_token_ms,
            &mut r.second_token_ms,
            &mut r.last_token_ms,
        ] {
            t.iter_mut().for_each(shift);
        }
        for p in &mut r.routing {
            p.queued_at_ms.iter_mut().for_each(shift);
            shift(&mut p.placed_at_ms);
        }
        for a in &mut r.admission_history {
            shift(&mut a.at_ms);
        }
        if let Some(h) = r.handoff.as_mut() {
            for t in [
                &mut h.source_held_ms,
                &mut h.destination_reserved_ms,
                &mut h.destination_activated_ms,
                &mut h.source_released_ms,
                &mut h.decode_admit_ms,
            ] {
                t.iter_mut().for_each(shift);
            }
        }
        r
    }

    pub(crate) fn push_admission(&mut self, pool: Role, at_ms: f64, reused_tokens: u32) {
        let pool_ordinal = self.admission_history.iter().filter(|a| a.pool == pool).count() as u32;
        self.admission_history.push(Admission { pool, at_ms, reused_tokens, pool_ordinal, tiers: None });
    }

    /// Time spent in SGLang frontend stages ahead of the scheduler (`workers.<role>.frontend`;
    /// 0 without them). The host loop's parts of the TTFT start after it.
    pub fn frontend_ms(&self) -> f64 {
        match self.frontend_done_ms {
            Some(done) if self.frontend_staged => done - self.arrival_ms,
            _ => 0.0,
        }
    }

    /// When its prompt was done: its first token aggregated, the prefill worker holding its KV
    /// disaggregated.
    pub fn prefill_complete_ms(&self) -> Option<f64> {
        match &self.handoff {
            Some(h) => h.source_held_ms,
            None => self.first_token_ms,
        }
    }

    /// The host loop's parts of the TTFT after the encoder pool (all of it without a pool),
    /// which add up to it: frontend, scheduler inbox wait (receipt − frontend done), receipt to
    /// admission, admission to prefill complete, and prefill complete to first token (the KV
    /// handoff, disaggregated). A request from a native encoder pool reaches the worker when its
    /// images landed, so its inbox wait starts then (as the reference counts it). `None` without
    /// the loop or before the first token.
    pub fn host_loop_parts_ms(&self) -> Option<[f64; 5]> {
        let received = self.scheduler_received_ms?;
        let (admit, first) = (self.first_admit_ms?, self.first_token_ms?);
        let done = self.prefill_complete_ms()?;
        let frontend = self.frontend_ms();
        let reached = self.encoder_ready_ms.unwrap_or(self.arrival_ms);
        Some([frontend, received - reached - frontend, admit - received, done - admit, first - done])
    }

    pub fn ttft_ms(&self) -> Option<f64> {
        self.first_token_ms.map(|t| t - self.arrival_ms)
    }

    /// Where the time to first token went (see [`TtftBreakdown`]); `None` without a first token.
    pub fn ttft_breakdown_ms(&self) -> Option<TtftBreakdown> {
        let first = self.first_token_ms?;
        let arrival = self.arrival_ms;
        // Each milestone is clamped to the one before it, so every part is ≥ 0 and they telescope.
        let mut at = arrival;
        let mut next = |t: Option<f64>| {
            let t = t.unwrap_or(at).clamp(at, first);
            let part = t - at;
            at = t;
            part
        };
        // The placement that led to the prompt's computation: the aggregated or prefill pool's
        // (SGLang's destination-first handoff places on the decode pool before it).
        let placed = self.routing.iter().find(|p| p.pool != Role::Decode).map(|p| p.placed_at_ms);
        let frontend = next(self.frontend_done_ms);
        let router_queue = next(placed);
        let engine_queue = next(self.first_admit_ms);
        let h = self.handoff.as_ref();
        let prefill = next(Some(h.and_then(|h| h.source_held_ms).unwrap_or(first)));
        let kv_transfer = next(Some(h.and_then(|h| h.destination_activated_ms).unwrap_or(first)));
        // The last part is what remains of TTFT, so that the parts add up to it.
        let first_token = (first - arrival) - (frontend + router_queue + engine_queue + prefill + kv_transfer);
        Some(TtftBreakdown {
            frontend,
            router_queue,
            engine_queue,
            prefill,
            kv_transfer,
            first_token: first_token.max(0.0),
        })
    }

    pub fn ttst_ms(&self) -> Option<f64> {
        Some(self.second_token_ms? - self.first_token_ms?)
    }

    pub fn e2e_ms(&self) -> Option<f64> {
        self.last_token_ms.map(|t| t - self.arrival_ms)
    }

    /// Mean gap between consecutive tokens of this request.
    pub fn tpot_ms(&self) -> Option<f64> {
        if self.output_length < 2 {
            return None;
        }
        Some((self.last_token_ms? - self.first_token_ms?) / (self.output_length - 1) as f64)
    }
}

/// How many parts [`TtftBreakdown`] splits a time to first token into.
pub const TTFT_PARTS: usize = 6;

/// A request's time to first token, split at its milestones (all in ms, each ≥ 0, summing to
/// TTFT):
/// * `frontend`: arrival → the frontend's tokenization stage done (HTTP, parsing and
///   tokenisation: `engine.tokenization`, waiting for a tokenizer included); 0 without the stage.
/// * `router_queue`: frontend done → placement on the worker that computes the prompt (time in the KV
///   router's queue; 0 without one).
/// * `engine_queue`: placement → first admission into a running batch (the engine's waiting
///   queue; vLLM's `request_queue_time`).
/// * `prefill`: first admission → prompt done. Aggregated, that is the pass that emits the first
///   token (vLLM's `request_prefill_time`, preemptions included); disaggregated, the prefill
///   worker holding the prompt's KV.
/// * `kv_transfer`: prompt done → KV landed on the decode worker (waiting for a reservation
///   there, the decode router's queue and the transfer itself); 0 aggregated.
/// * `first_token`: KV landed → first token (the decode worker's queue and first pass); 0
///   aggregated.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TtftBreakdown {
    pub frontend: f64,
    pub router_queue: f64,
    pub engine_queue: f64,
    pub prefill: f64,
    pub kv_transfer: f64,
    pub first_token: f64,
}

impl TtftBreakdown {
    /// The parts' names, in the order of [`TtftBreakdown::parts`].
    pub const NAMES: [&'static str; TTFT_PARTS] =
        ["frontend", "router_queue", "engine_queue", "prefill", "kv_transfer", "first_token"];

    pub fn parts(&self) -> [f64; TTFT_PARTS] {
        [self.frontend, self.router_queue, self.engine_queue, self.prefill, self.kv_transfer, self.first_token]
    }
}
