//! Duration-limited agentic replay (`traffic.load.agentic_profile`): the options, the corpus
//! the lanes are refilled from, and the state the load driver keeps while the profile runs
//! ([`super::driver`] applies it).
//!
//! What the reference does (aisimulate-core 0.13 `replay/loadgen/profile.rs` and `driver.rs`,
//! and the installed 0.13 build, probed on `tests/deploy/agentic_snapshot_trace.jsonl`):
//! * The profile needs seeded snapshots, one per lane. It opens at 0, or at the warmup barrier
//!   (`agentic_warmup`), and closes admission at `open + duration`.
//! * Lanes refill: when a lane's play has finished on the client side, the lane starts the
//!   corpus play `cursor mod plays` **from its start** (no cut) as ordinal `k + 1` of that lane,
//!   at once, in a prompt-token space of its own; the cursor (first `lanes`, or the snapshot's
//!   `corpus_cursor`) advances by one. Lanes are refilled in lane order.
//! * Only a play's roots wait for their recorded start: a request that depends on another is
//!   released when its dependencies fire (plus their delays), not at its recorded start.
//! * Idle caps: a tree is idle from the profile's opening or its last terminal until it issues a
//!   request; the whole run is idle while nothing is in flight. When a tree has been idle for
//!   `tree_idle_cap_seconds` (or the run for `global_idle_cap_seconds`), its pending timers are
//!   moved earlier so that the first fires now, keeping their spacing; each shift is reported.
//! * At the cutoff, requests not yet issued are censored (`never_issued_requests`); in-flight
//!   ones get `response_grace_seconds`, then are cancelled (reported `canceled`, the play
//!   `incomplete`) and the run ends at the grace deadline (or as soon as nothing is in flight
//!   after the cutoff). The report's times are on the run's clock (a warmed profile's include
//!   the preparation); the play outcomes measure from the opening. `cancel_drain_seconds` bounds the
//!   cancellation acknowledgement, which offline replay gives at once.
//! * The summary counts every issued request (`num_requests`), cancelled ones included; the
//!   latency metrics and `duration_ms` cover the completed ones (first issue to last success);
//!   `agentic_profile` reports the counts (`aisimulate.agentic.profile.v1`).

use serde_json::{json, Value};

use super::AgenticGraph;

pub const PROFILE_SCHEMA: &str = "aisimulate.agentic.profile.v1";

/// The most requests a profile's plays may instantiate over a run: each keeps its identities
/// (a few hundred bytes) for the reports until the run ends.
pub const MAX_PROFILE_REQUESTS: u64 = 1_000_000;

/// `traffic.load.agentic_profile`, in seconds.
#[derive(Clone, Debug, PartialEq)]
pub struct ProfileOptions {
    pub duration_seconds: f64,
    pub response_grace_seconds: f64,
    pub cancel_drain_seconds: f64,
    pub tree_idle_cap_seconds: f64,
    pub global_idle_cap_seconds: f64,
}

impl Default for ProfileOptions {
    fn default() -> Self {
        ProfileOptions {
            duration_seconds: 3600.0,
            response_grace_seconds: 30.0,
            cancel_drain_seconds: 10.0,
            tree_idle_cap_seconds: 300.0,
            global_idle_cap_seconds: 10.0,
        }
    }
}

/// The keys, and whether each must be positive (else non-negative).
pub const KEYS: [(&str, bool); 5] = [
    ("duration_seconds", true),
    ("response_grace_seconds", false),
    ("cancel_drain_seconds", false),
    ("tree_idle_cap_seconds", true),
    ("global_idle_cap_seconds", true),
];

impl ProfileOptions {
    pub fn get_mut(&mut self, key: &str) -> Option<&mut f64> {
        Some(match key {
            "duration_seconds" => &mut self.duration_seconds,
            "response_grace_seconds" => &mut self.response_grace_seconds,
            "cancel_drain_seconds" => &mut self.cancel_drain_seconds,
            "tree_idle_cap_seconds" => &mut self.tree_idle_cap_seconds,
            "global_idle_cap_seconds" => &mut self.global_idle_cap_seconds,
            _ => return None,
        })
    }

    fn values(&self) -> [f64; 5] {
        [
            self.duration_seconds,
            self.response_grace_seconds,
            self.cancel_drain_seconds,
            self.tree_idle_cap_seconds,
            self.global_idle_cap_seconds,
        ]
    }

    /// The checks of the whole (each value is already finite and in range): every value, and
    /// the last deadline, must stay finite in milliseconds. The reference's message.
    pub fn validate(&self) -> Result<(), String> {
        let span = self.duration_seconds + self.response_grace_seconds + self.cancel_drain_seconds;
        if self.values().iter().any(|v| !(v * 1000.0).is_finite()) || !(span * 1000.0).is_finite() {
            return Err("agentic_profile deadlines overflow".into());
        }
        Ok(())
    }
}

/// What a continuous profile refills its lanes from: the source graph of the snapshots, where
/// the corpus cursor starts, and the first prompt block id no instance uses yet.
#[derive(Debug)]
pub struct Corpus {
    pub options: ProfileOptions,
    pub cursor: u64,
    pub next_block: u32,
    /// At most this many requests instantiated ([`MAX_PROFILE_REQUESTS`]).
    pub max_requests: u64,
    pub src: AgenticGraph,
}

/// One idle-cap shift of pending timers.
#[derive(Clone, Debug, PartialEq)]
pub struct IdleShift {
    pub at_ms: f64,
    /// The tree's play id; `None` for the global cap.
    pub play_id: Option<String>,
    pub shifted_by_ms: f64,
    pub timer_count: usize,
}

/// The load driver's profile state (times on the run's clock).
#[derive(Debug)]
pub(super) struct ProfileState {
    pub options: ProfileOptions,
    pub start_ms: Option<f64>,
    pub last_advanced_ms: f64,
    /// The last advance at `last_advanced_ms` changed nothing (a control time there is spent).
    pub idle_at_last_advance: bool,
    pub cutoff: bool,
    pub cursor: u64,
    /// Per lane: the play it runs, and the ordinal of its next play.
    pub active_plays: Vec<usize>,
    pub next_ordinals: Vec<u64>,
    /// Refills at one instant: (instant, count), bounded against zero-time loops.
    pub replacements: (Option<f64>, u64),
    /// Per play: since when its tree has had nothing in flight.
    pub tree_idle_since_ms: Vec<Option<f64>>,
    pub global_idle_since_ms: Option<f64>,
    pub issued_requests: u64,
    pub successful_responses: u64,
    pub canceled_requests: u64,
    pub never_issued_requests: u64,
    pub first_request_ms: Option<f64>,
    pub last_successful_response_ms: Option<f64>,
    pub idle_shifts: Vec<IdleShift>,
    pub finished_at_ms: Option<f64>,
    /// Requests every play instantiated so far, and the most there may be.
    pub instantiated: u64,
    pub max_requests: u64,
    pub next_block: u32,
    /// Why the profile cannot go on (the run stops with it).
    pub error: Option<String>,
}

impl ProfileState {
    pub fn new(corpus: &Corpus, lanes: usize, plays: usize, instantiated: u64) -> ProfileState {
        ProfileState {
            options: corpus.options.clone(),
            start_ms: None,
            last_advanced_ms: 0.0,
            idle_at_last_advance: false,
            cutoff: false,
            cursor: corpus.cursor,
            active_plays: (0..lanes).collect(),
            next_ordinals: vec![1; lanes],
            replacements: (None, 0),
            tree_idle_since_ms: vec![None; plays],
            global_idle_since_ms: None,
            issued_requests: 0,
            successful_responses: 0,
            canceled_requests: 0,
            never_issued_requests: 0,
            first_request_ms: None,
            last_successful_response_ms: None,
            idle_shifts: Vec::new(),
            finished_at_ms: None,
            instantiated,
            max_requests: corpus.max_requests,
            next_block: corpus.next_block,
            error: None,
        }
    }

    pub fn open(&mut self, now_ms: f64) {
        self.start_ms = Some(now_ms);
        self.last_advanced_ms = now_ms;
        self.global_idle_since_ms = Some(now_ms);
        self.tree_idle_since_ms.fill(Some(now_ms));
    }

    /// The admission cutoff, the response-grace deadline and the cancel-drain deadline.
    pub fn deadlines(&self) -> Option<(f64, f64, f64)> {
        let cutoff = self.start_ms? + self.options.duration_seconds * 1000.0;
        let grace = cutoff + self.options.response_grace_seconds * 1000.0;
        Some((cutoff, grace, grace + self.options.cancel_drain_seconds * 1000.0))
    }
}

/// The play counts the profile report gives.
pub(super) struct PlayCounts {
    pub started: usize,
    pub client_completed: usize,
    pub retired: usize,
    pub server_quiescent: usize,
    pub client_in_flight: usize,
    pub server_settling: usize,
}

/// The `agentic_profile` report (the reference's keys). Its times are on the run's clock,
/// a warmed profile's preparation included (the reference's; the play outcomes and metrics
/// measure from the profile's opening instead).
pub(super) fn report(p: &ProfileState, n: &PlayCounts) -> Value {
    let at = |t: Option<f64>| t;
    let deadlines = p.deadlines();
    let observation = p.first_request_ms.zip(p.last_successful_response_ms).map(|(a, b)| (b - a).max(0.0));
    let o = &p.options;
    let shifts: Vec<Value> = p
        .idle_shifts
        .iter()
        .map(|s| {
            json!({
                "at_ms": s.at_ms,
                "play_id": s.play_id,
                "shifted_by_ms": s.shifted_by_ms,
                "timer_count": s.timer_count,
            })
        })
        .collect();
    json!({
        "schema": PROFILE_SCHEMA,
        "options": {
            "duration_seconds": o.duration_seconds,
            "response_grace_seconds": o.response_grace_seconds,
            "cancel_drain_seconds": o.cancel_drain_seconds,
            "tree_idle_cap_seconds": o.tree_idle_cap_seconds,
            "global_idle_cap_seconds": o.global_idle_cap_seconds,
        },
        "profile_start_ms": at(p.start_ms),
        "admission_cutoff_ms": at(deadlines.map(|d| d.0)),
        "response_grace_deadline_ms": at(deadlines.map(|d| d.1)),
        "cancel_drain_deadline_ms": at(deadlines.map(|d| d.2)),
        "admission_closed": p.cutoff,
        "finished_at_ms": at(p.finished_at_ms),
        // Offline replay acknowledges a cancellation at once.
        "cancel_drain_timed_out": false,
        "unsettled_server_requests": n.client_in_flight + n.server_settling,
        "plays_started": n.started,
        "client_completed_plays": n.client_completed,
        "retired_plays": n.retired,
        "server_quiescent_plays": n.server_quiescent,
        "issued_requests": p.issued_requests,
        "successful_responses": p.successful_responses,
        "canceled_requests": p.canceled_requests,
        "never_issued_requests": p.never_issued_requests,
        "client_in_flight_requests": n.client_in_flight,
        "server_unsettled_requests": n.client_in_flight + n.server_settling,
        "first_request_ms": at(p.first_request_ms),
        "last_successful_response_ms": at(p.last_successful_response_ms),
        "observation_duration_ms": observation,
        "successful_request_throughput":
            observation.filter(|&d| d > 0.0).map(|d| p.successful_responses as f64 * 1000.0 / d),
        "corpus_cursor": p.cursor,
        "idle_shifts": shifts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_and_small_values_are_valid() {
        assert!(ProfileOptions::default().validate().is_ok());
        let o = ProfileOptions { duration_seconds: 5.0, response_grace_seconds: 0.0, ..ProfileOptions::default() };
        assert!(o.validate().is_ok());
    }

    #[test]
    fn huge_values_overflow_in_milliseconds() {
        let mut o = ProfileOptions { duration_seconds: 1e306, ..ProfileOptions::default() };
        assert_eq!(o.validate().unwrap_err(), "agentic_profile deadlines overflow");
        // Each value is finite in ms, their sum is not (the reference refuses this too).
        o.duration_seconds = 1e305;
        o.response_grace_seconds = 1e305;
        assert!(o.validate().is_err());
        o = ProfileOptions { duration_seconds: 1e30, ..ProfileOptions::default() };
        assert!(o.validate().is_ok());
    }
}
