//! Pacing a run on the wall clock (online replay).
//!
//! The event loop stays a virtual-clock simulation: a [`Pacer`] only decides how long the loop
//! waits each time its clock moves forward, so a paced run computes exactly what an unpaced
//! one does, only later. Engine timings already include their speedup ratios, so one virtual
//! millisecond is one wall millisecond ([`WallClock`]).

use std::time::{Duration, Instant};

/// Consulted by the event loop whenever its virtual clock moves forward. Shared by the threads
/// of a split run (one per worker shard), hence `Sync`.
pub trait Pacer: Sync {
    /// The virtual clock has reached `at_ms`: how much longer the run must wait before it goes
    /// on (zero: at once). The loop asks again after waiting, so an answer may be approximate.
    fn wait(&self, at_ms: f64) -> Duration;
}

/// Virtual time `t` ms is due `t` ms of wall time after the clock started.
#[derive(Clone, Copy, Debug)]
pub struct WallClock {
    start: Instant,
}

impl WallClock {
    /// A clock whose virtual time 0 is now.
    pub fn start() -> WallClock {
        WallClock { start: Instant::now() }
    }

    /// A clock whose virtual time 0 is `start`.
    pub fn starting_at(start: Instant) -> WallClock {
        WallClock { start }
    }
}

impl Pacer for WallClock {
    fn wait(&self, at_ms: f64) -> Duration {
        if at_ms.is_nan() || at_ms <= 0.0 {
            return Duration::ZERO;
        }
        // A virtual time beyond what a Duration holds is never due (the run can still be
        // cancelled while it waits).
        let due = Duration::try_from_secs_f64(at_ms / 1000.0).unwrap_or(Duration::MAX);
        due.saturating_sub(self.start.elapsed())
    }
}

/// The longest single sleep of a paced loop: it asks [`super::Progress::cancelled`] between
/// sleeps, so a cancelled run stops within about this long.
pub(crate) const PACE_SLICE: Duration = Duration::from_millis(20);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wall_clock_waits_out_the_rest_of_the_virtual_time() {
        let clock = WallClock::starting_at(Instant::now() - Duration::from_millis(100));
        assert_eq!(clock.wait(0.0), Duration::ZERO);
        assert_eq!(clock.wait(-5.0), Duration::ZERO);
        assert_eq!(clock.wait(f64::NAN), Duration::ZERO);
        assert_eq!(clock.wait(50.0), Duration::ZERO);
        let left = clock.wait(1100.0);
        assert!(left <= Duration::from_millis(1000) && left > Duration::from_millis(900), "{left:?}");
        assert!(clock.wait(f64::INFINITY) > Duration::from_secs(1 << 40));
    }
}
