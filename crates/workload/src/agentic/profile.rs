//! Duration-limited agentic replay (`traffic.load.agentic_profile`): the options and their
//! checks. The replay itself is not modelled yet; the unified YAML refuses a profile once its
//! options are valid, saying so.
//!
//! What the reference does (aisimulate-core 0.13 `replay/loadgen/profile.rs` and `driver.rs`,
//! and the installed 0.13 build, probed on `tests/deploy/agentic_snapshot_trace.jsonl`):
//! * The profile needs seeded snapshots, one per lane. It opens at 0, or at the warmup barrier
//!   (`agentic_warmup`), and closes admission at `open + duration`.
//! * Lanes refill: when a lane's play has finished on the client side, the lane starts the
//!   corpus play `cursor mod plays` **from its start** (no cut) as ordinal `k + 1` of that lane,
//!   at once; the cursor (first `lanes`) advances by one. Lanes are refilled in lane order.
//! * Idle caps: a tree is idle from the profile's opening or its last terminal until it issues a
//!   request; the whole run is idle while nothing is in flight. When a tree has been idle for
//!   `tree_idle_cap_seconds` (or the run for `global_idle_cap_seconds`), its pending timers are
//!   moved earlier so that the first fires now, keeping their spacing; each shift is reported.
//! * At the cutoff, requests not yet issued are censored (`never_issued_requests`); in-flight
//!   ones get `response_grace_seconds`, then are cancelled (reported `canceled`, the play
//!   `incomplete`) and the run ends at the grace deadline. `cancel_drain_seconds` bounds the
//!   cancellation acknowledgement, which offline replay gives at once.
//! * The summary counts every issued request (`num_requests`), cancelled ones included; the
//!   latency metrics and `duration_ms` cover the completed ones (first issue to last success);
//!   `agentic_profile` reports the counts (`aisimulate.agentic.profile.v1`).

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
