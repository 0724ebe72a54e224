//! Per-request timelines and the run-level distributions built from them.
//!
//! Definitions (the reference's, pinned by its probes):
//! * TTFT = first token − arrival; TTST = second token − first token;
//!   E2E = last token − arrival; TPOT = (last − first) / (tokens − 1) per request.
//! * ITL and per-user output throughput pool **every token gap** of every request
//!   (`1000 / gap` for the latter, gaps of 0 skipped), with sketch quantiles.
//! * Only completed requests that produced tokens enter the latency distributions.

use servesim_engine::{Finish, RejectReason};

use crate::stats::{Exact, Sketch};

/// How a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Completed,
    Rejected(RejectReason),
    /// Still in flight when the run stopped.
    Incomplete,
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::Completed => "completed",
            Status::Rejected(_) => "rejected",
            Status::Incomplete => "incomplete",
        }
    }
}

/// The life of one request, as reported per request.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestRecord {
    /// Release order, from 0.
    pub ordinal: u64,
    pub session: u32,
    pub turn: u32,
    pub worker: u32,
    pub arrival_ms: f64,
    pub first_admit_ms: Option<f64>,
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
    pub admissions: u32,
    pub status: Status,
}

impl RequestRecord {
    pub fn ttft_ms(&self) -> Option<f64> {
        self.first_token_ms.map(|t| t - self.arrival_ms)
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
    live: Vec<Option<RequestRecord>>,
    free: Vec<u32>,
    next_ordinal: u64,
    sla: Sla,
    sink: Option<&'s mut dyn FnMut(&RequestRecord)>,
    pub(crate) totals: Totals,
    pub(crate) ttft: Exact,
    pub(crate) ttst: Exact,
    pub(crate) tpot: Exact,
    pub(crate) e2e: Exact,
    pub(crate) itl: Sketch,
    pub(crate) per_user: Sketch,
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
}

impl<'s> Collector<'s> {
    pub fn new(sla: Sla, sink: Option<&'s mut dyn FnMut(&RequestRecord)>) -> Self {
        Collector {
            live: Vec::new(),
            free: Vec::new(),
            next_ordinal: 0,
            sla,
            sink,
            totals: Totals::default(),
            ttft: Exact::default(),
            ttst: Exact::default(),
            tpot: Exact::default(),
            e2e: Exact::default(),
            itl: Sketch::default(),
            per_user: Sketch::default(),
        }
    }

    /// Registers a released request; returns its id (reused after it finishes).
    pub fn arrive(&mut self, session: u32, turn: u32, worker: u32, arrival_ms: f64, input: u32, output: u32) -> u64 {
        let record = RequestRecord {
            ordinal: self.next_ordinal,
            session,
            turn,
            worker,
            arrival_ms,
            first_admit_ms: None,
            terminal_ms: None,
            first_token_ms: None,
            second_token_ms: None,
            last_token_ms: None,
            input_length: input,
            requested_output_length: output,
            output_length: 0,
            reused_input_tokens: 0,
            first_admission_reused_input_tokens: 0,
            admissions: 0,
            status: Status::Incomplete,
        };
        self.next_ordinal += 1;
        self.totals.num_requests += 1;
        match self.free.pop() {
            Some(slot) => {
                self.live[slot as usize] = Some(record);
                slot as u64
            }
            None => {
                self.live.push(Some(record));
                (self.live.len() - 1) as u64
            }
        }
    }

    fn get(&mut self, id: u64) -> &mut RequestRecord {
        self.live[id as usize].as_mut().expect("request is in flight")
    }

    pub fn ordinal_of(&self, id: u64) -> u64 {
        self.live[id as usize].as_ref().expect("request is in flight").ordinal
    }

    pub fn session_of(&self, id: u64) -> u32 {
        self.live[id as usize].as_ref().expect("request is in flight").session
    }

    pub fn admit(&mut self, id: u64, at_ms: f64, reused: u32) {
        let r = self.get(id);
        if r.first_admit_ms.is_none() {
            r.first_admit_ms = Some(at_ms);
            r.first_admission_reused_input_tokens = reused;
        }
        r.admissions += 1;
        r.reused_input_tokens = r.reused_input_tokens.max(reused);
    }

    pub fn token(&mut self, id: u64, at_ms: f64) {
        let r = self.get(id);
        let gap = r.last_token_ms.map(|last| at_ms - last);
        match r.output_length {
            0 => r.first_token_ms = Some(at_ms),
            1 => r.second_token_ms = Some(at_ms),
            _ => {}
        }
        r.last_token_ms = Some(at_ms);
        r.output_length += 1;
        if let Some(gap) = gap {
            self.itl.add(gap);
            if gap > 0.0 {
                self.per_user.add(1000.0 / gap);
            }
        }
    }

    pub fn count_pass(&mut self, preemptions: usize, prefill_tokens: u64) {
        self.totals.preemptions += preemptions as u64;
        self.totals.prefill_tokens += prefill_tokens;
    }

    /// Closes a request's timeline and folds it into the run metrics.
    pub fn finish(&mut self, id: u64, at_ms: f64, finish: Finish) {
        let mut r = self.live[id as usize].take().expect("request is in flight");
        self.free.push(id as u32);
        r.terminal_ms = Some(at_ms);
        r.status = match finish {
            Finish::Completed => Status::Completed,
            Finish::Rejected(reason) => Status::Rejected(reason),
        };
        self.fold(&r);
    }

    fn fold(&mut self, r: &RequestRecord) {
        let t = &mut self.totals;
        match r.status {
            Status::Completed => {
                t.completed += 1;
                t.input_tokens += r.input_length as u64;
                t.output_tokens += r.output_length as u64;
                t.reused_tokens += r.reused_input_tokens as u64;
                t.first_admission_reused_tokens += r.first_admission_reused_input_tokens as u64;
                if let Some(last) = r.last_token_ms {
                    t.duration_ms = t.duration_ms.max(last);
                }
                if self.sla.is_set() && self.sla.met_by(r) {
                    t.good_requests += 1;
                    t.good_output_tokens += r.output_length as u64;
                }
                if let Some(v) = r.ttft_ms() {
                    self.ttft.add(v);
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
            }
            Status::Rejected(_) => t.rejected += 1,
            Status::Incomplete => t.incomplete += 1,
        }
        if let Some(sink) = self.sink.as_mut() {
            sink(r);
        }
    }

    /// Reports the requests still in flight as incomplete (the run was cut short).
    pub fn close_incomplete(&mut self) {
        let mut pending: Vec<RequestRecord> = self.live.iter_mut().filter_map(Option::take).collect();
        pending.sort_by_key(|r| r.ordinal);
        for r in pending {
            self.fold(&r);
        }
    }
}
