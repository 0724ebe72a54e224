//! The discrete-event loop: a virtual clock, a cluster of simulated workers, and the load
//! driver releasing requests.
//!
//! At each instant the loop (1) applies the results of passes that end now, (2) releases the
//! requests that become ready now and places them on workers, and (3) starts a pass on every
//! idle worker that has work. A pass's results (tokens, completions) become visible at its end
//! time; completions can make the next turn of a session ready.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use servesim_engine::{Engine, EngineConfig, EngineOptions, EngineRequest, PassOutput, Prompt};

use crate::metrics::{Collector, Sla};
use crate::report::Report;
use crate::time::Time;
use crate::workload::{LoadDriver, LoadMode, Ready, Workload};

/// How requests are assigned to workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouterMode {
    RoundRobin,
}

/// Everything that defines one simulated run besides the workload.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub engine: EngineConfig,
    pub num_workers: u32,
    pub router: RouterMode,
    pub load: LoadMode,
    pub sla: Sla,
    /// Seed of generated token ids.
    pub seed: u64,
}

/// Progress notifications for a caller that wants to show them.
pub trait Progress {
    /// Called now and then with the number of finished requests and the total.
    fn update(&mut self, finished: u64, total: u64);
}

impl Progress for () {
    fn update(&mut self, _: u64, _: u64) {}
}

#[derive(Debug)]
pub enum SimError {
    /// A worker with pending requests did nothing in a pass (an engine invariant broke).
    Stalled { worker: u32, at_ms: f64 },
}

impl std::fmt::Display for SimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SimError::Stalled { worker, at_ms } => {
                write!(f, "internal error: worker {worker} stopped making progress at t={at_ms} ms")
            }
        }
    }
}

impl std::error::Error for SimError {}

struct Worker {
    engine: Engine,
    busy: bool,
    output: PassOutput,
}

/// Runs `workload` to completion and returns the report.
pub fn simulate(
    workload: &Workload,
    config: &SimConfig,
    collector: Collector<'_>,
    progress: &mut dyn Progress,
) -> Result<Report, SimError> {
    let mut sim = Simulation::new(workload, config, collector);
    sim.run(progress)?;
    Ok(Report::build(config, &sim.collector, sim.now))
}

struct Simulation<'a, 'c> {
    workload: &'a Workload,
    config: &'a SimConfig,
    driver: LoadDriver,
    workers: Vec<Worker>,
    next_worker: usize,
    /// Pass completions: (end time, sequence number, worker).
    events: BinaryHeap<Reverse<(Time, u64, u32)>>,
    seq: u64,
    now: f64,
    collector: Collector<'c>,
    finished: u64,
}

impl<'a, 'c> Simulation<'a, 'c> {
    fn new(workload: &'a Workload, config: &'a SimConfig, collector: Collector<'c>) -> Self {
        let workers = (0..config.num_workers)
            .map(|_| Worker {
                engine: Engine::new(config.engine.clone(), EngineOptions::default()),
                busy: false,
                output: PassOutput::default(),
            })
            .collect();
        Simulation {
            workload,
            config,
            driver: LoadDriver::new(workload, config.load),
            workers,
            next_worker: 0,
            events: BinaryHeap::new(),
            seq: 0,
            now: 0.0,
            collector,
            finished: 0,
        }
    }

    fn run(&mut self, progress: &mut dyn Progress) -> Result<(), SimError> {
        let total = self.workload.num_requests() as u64;
        let mut ready = Vec::new();
        let mut again = false;
        let mut last_reported = u64::MAX;
        loop {
            if !again {
                let next_pass = self.events.peek().map(|Reverse((t, _, _))| t.0);
                self.now = match (next_pass, self.driver.next_ready_ms()) {
                    (None, None) => break,
                    (Some(a), Some(b)) => a.min(b),
                    (Some(a), None) | (None, Some(a)) => a,
                };
            }
            let now = self.now;
            while let Some(&Reverse((Time(t), _, w))) = self.events.peek() {
                if t > now {
                    break;
                }
                self.events.pop();
                self.workers[w as usize].busy = false;
                self.apply_pass(w as usize);
            }
            ready.clear();
            self.driver.pop_ready(now, &mut ready);
            for r in &ready {
                self.release(r);
            }
            again = false;
            for w in 0..self.workers.len() {
                let worker = &mut self.workers[w];
                if worker.busy || !worker.engine.has_work() {
                    continue;
                }
                worker.engine.step(now, &mut worker.output);
                if worker.output.end_ms > now {
                    worker.busy = true;
                    self.events.push(Reverse((Time(worker.output.end_ms), self.seq, w as u32)));
                    self.seq += 1;
                } else {
                    if worker.output.is_empty() {
                        return Err(SimError::Stalled { worker: w as u32, at_ms: now });
                    }
                    self.apply_pass(w);
                    again = true;
                }
            }
            if self.finished != last_reported {
                last_reported = self.finished;
                progress.update(self.finished, total);
            }
        }
        self.collector.close_incomplete();
        Ok(())
    }

    /// Hands a released turn to a worker.
    fn release(&mut self, r: &Ready) {
        let turn = &self.workload.sessions[r.session as usize].turns[r.turn as usize];
        let worker = match self.config.router {
            RouterMode::RoundRobin => {
                let w = self.next_worker;
                self.next_worker = (w + 1) % self.workers.len();
                w
            }
        };
        let id = self.collector.arrive(
            r.session,
            r.turn,
            worker as u32,
            r.arrival_ms,
            turn.input_length,
            turn.output_length,
        );
        let ordinal = self.collector.ordinal_of(id);
        let request = EngineRequest {
            id,
            prompt: Prompt::Runs { run: self.workload.block_tokens, ids: turn.blocks.clone(), len: turn.input_length },
            max_output: turn.output_length,
            token_seed: self.config.seed ^ ordinal.wrapping_mul(0x9E37_79B9_7F4A_7C15),
            hashes: None,
        };
        self.workers[worker].engine.submit(request);
    }

    /// Folds the results of worker `w`'s last pass into the metrics and the load driver.
    fn apply_pass(&mut self, w: usize) {
        let out = std::mem::take(&mut self.workers[w].output);
        for a in &out.admissions {
            self.collector.admit(a.request, out.start_ms, a.reused_tokens);
        }
        for t in &out.tokens {
            self.collector.token(t.request, out.end_ms);
        }
        self.collector.count_pass(out.preempted.len(), out.prefill_tokens);
        for f in &out.finished {
            let session = self.collector.session_of(f.request);
            self.collector.finish(f.request, out.end_ms, f.finish);
            self.driver.on_complete(session, out.end_ms);
            self.finished += 1;
        }
        self.workers[w].output = out;
    }
}
