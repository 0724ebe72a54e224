//! Workers that start, serve, drain and stop during a run.
//!
//! A worker added during a run starts (for its deployment's startup time; the driver reports
//! when it is ready), then serves. A draining worker takes no new requests and stops once the
//! requests it has are done. Workers present at the start of a run are ready at once. This
//! module keeps the states and the pool's GPU-time accounting; drivers own the clock.

/// Where a worker is in its life.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum WorkerState {
    /// Added at `since_ms`; takes requests once ready.
    Starting {
        since_ms: f64,
    },
    Active {
        since_ms: f64,
    },
    /// Takes no new requests; stops when it has none.
    Draining {
        since_ms: f64,
    },
    Stopped,
}

/// The workers of one pool.
#[derive(Clone, Debug, PartialEq)]
pub struct Workers {
    states: Vec<WorkerState>,
    /// Worker-milliseconds of the workers that stopped (the rest is counted on demand).
    stopped_ms: f64,
    /// When each worker came up (for its share of worker-time).
    started_at: Vec<f64>,
}

impl Workers {
    /// `n` workers serving from time 0.
    pub fn new(n: usize) -> Workers {
        Workers { states: vec![WorkerState::Active { since_ms: 0.0 }; n], stopped_ms: 0.0, started_at: vec![0.0; n] }
    }

    pub fn len(&self) -> usize {
        self.states.len()
    }

    pub fn is_empty(&self) -> bool {
        self.states.is_empty()
    }

    pub fn state(&self, worker: usize) -> WorkerState {
        self.states[worker]
    }

    /// Whether `worker` takes new requests.
    pub fn is_active(&self, worker: usize) -> bool {
        matches!(self.states[worker], WorkerState::Active { .. })
    }

    /// Workers taking new requests.
    pub fn active(&self) -> usize {
        self.states.iter().filter(|s| matches!(s, WorkerState::Active { .. })).count()
    }

    /// Workers that are starting, serving or draining (they occupy GPUs).
    pub fn up(&self) -> usize {
        self.states.iter().filter(|s| !matches!(s, WorkerState::Stopped)).count()
    }

    /// Adds a worker starting at `now_ms`; returns its index (the placer's new slot has the
    /// same one).
    pub fn add(&mut self, now_ms: f64) -> usize {
        self.states.push(WorkerState::Starting { since_ms: now_ms });
        self.started_at.push(now_ms);
        self.states.len() - 1
    }

    /// A starting worker is ready. False if it was not starting (it was removed meanwhile).
    pub fn ready(&mut self, worker: usize, now_ms: f64) -> bool {
        if !matches!(self.states[worker], WorkerState::Starting { .. }) {
            return false;
        }
        self.states[worker] = WorkerState::Active { since_ms: now_ms };
        true
    }

    /// The worker takes no new requests from now on. A starting worker stops at once (it had
    /// nothing yet). Returns whether it changed.
    pub fn drain(&mut self, worker: usize, now_ms: f64) -> bool {
        match self.states[worker] {
            WorkerState::Starting { .. } => {
                self.stop(worker, now_ms);
                true
            }
            WorkerState::Active { .. } => {
                self.states[worker] = WorkerState::Draining { since_ms: now_ms };
                true
            }
            WorkerState::Draining { .. } | WorkerState::Stopped => false,
        }
    }

    /// A draining worker with nothing left stops.
    pub fn stop(&mut self, worker: usize, now_ms: f64) {
        if self.states[worker] != WorkerState::Stopped {
            self.stopped_ms += now_ms - self.started_at[worker];
            self.states[worker] = WorkerState::Stopped;
        }
    }

    /// Worker-milliseconds spent by every worker up to `now_ms` (starting, serving and
    /// draining all occupy GPUs).
    pub fn worker_ms(&self, now_ms: f64) -> f64 {
        let running: f64 = self
            .states
            .iter()
            .zip(&self.started_at)
            .filter(|(s, _)| !matches!(s, WorkerState::Stopped))
            .map(|(_, &t)| now_ms - t)
            .sum();
        self.stopped_ms + running
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scripted_schedule_of_workers() {
        let mut w = Workers::new(2);
        assert_eq!((w.active(), w.up()), (2, 2));
        // t=100: a worker is added; it starts for 50 ms.
        let n = w.add(100.0);
        assert_eq!(n, 2);
        assert!(!w.is_active(n));
        assert_eq!((w.active(), w.up()), (2, 3));
        assert!(w.ready(n, 150.0));
        assert!(!w.ready(n, 160.0), "already ready");
        // t=200: worker 0 drains; it stops when its requests are done at 260.
        assert!(w.drain(0, 200.0));
        assert!(!w.drain(0, 210.0));
        assert_eq!(w.state(0), WorkerState::Draining { since_ms: 200.0 });
        assert_eq!(w.active(), 2);
        w.stop(0, 260.0);
        assert_eq!(w.up(), 2);
        // A worker drained while starting stops at once.
        let m = w.add(300.0);
        assert!(w.drain(m, 310.0));
        assert_eq!(w.state(m), WorkerState::Stopped);
        assert!(!w.ready(m, 350.0));
        // Worker time at 400: worker 0 260, worker 1 400, worker 2 300 (since 100), worker 3 10.
        assert_eq!(w.worker_ms(400.0), 260.0 + 400.0 + 300.0 + 10.0);
    }
}
