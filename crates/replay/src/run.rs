//! One run, assembled in one place: [`Run`] takes a workload and its [`SimConfig`] and every
//! front end (`servesim predict`, `predict -c`, `recommend`'s trials and candidate pages, the
//! Python binding) says only what differs from the defaults: a queue limit, a per-request sink,
//! TTFT breakdown, telemetry, the planner in the loop, a virtual stop time, wall-clock pacing.
//! [`Run::go`] builds the collector and the loop's options from that and runs
//! [`crate::simulate_with`]; [`Run::ensemble`] runs seeded members instead.
//!
//! ```text
//! Run::new(&workload, &config)          defaults: no queue limit, no records, no telemetry,
//!     .queue_limit(..)                  no planner, to the end of the workload, unpaced
//!     .records(..) .ttft_breakdown(..) .telemetry(..)
//!     .planner(..) .stop_at_ms(..) .online(..)
//!     .go(&mut progress)  ->  Ran { report, planner }
//! ```
//!
//! What a front end makes of the report (its summary keys, files, tables) stays its own.

use serde_json::{json, Map, Value};
use servesim_workload::Workload;

use crate::metrics::{Collector, QueueLimit, RequestRecord};
use crate::planned::PlannerRun;
use crate::report::Report;
use crate::sim::{simulate_with, Autoscaler, Pacer, Progress, RunOptions, SimConfig, SimError, WallClock};
use crate::telemetry::TelemetrySink;

/// Where the per-request records go as requests finish.
pub type RecordSink<'a> = &'a mut (dyn FnMut(&RequestRecord) + Send);

/// The telemetry a run samples: every `interval_ms` of virtual time into `sink`.
struct Telemetry<'a> {
    interval_ms: f64,
    sink: &'a mut (dyn TelemetrySink + Send),
    dynamo: bool,
}

/// How the run follows the wall clock.
enum Pacing<'a> {
    /// The virtual clock jumps from event to event.
    Unpaced,
    /// Each virtual millisecond takes a wall millisecond from the moment the run starts.
    Online,
    /// The caller's pacer.
    By(&'a dyn Pacer),
}

/// One replay of `workload` under `config`, built up from the defaults and run with
/// [`Run::go`].
pub struct Run<'a> {
    workload: &'a Workload,
    config: &'a SimConfig,
    queue: QueueLimit,
    records: Option<RecordSink<'a>>,
    ttft_breakdown: bool,
    telemetry: Option<Telemetry<'a>>,
    planner: Option<PlannerRun>,
    stop_at_ms: Option<f64>,
    pacing: Pacing<'a>,
}

/// A finished run: its report, and the planner with what it did (when one ran).
pub struct Ran {
    pub report: Report,
    pub planner: Option<PlannerRun>,
}

impl<'a> Run<'a> {
    /// `workload` under `config`, with the defaults: no queue limit ([`QueueLimit::default`]),
    /// no per-request records, no TTFT breakdown, no telemetry, no planner, run to the end of
    /// the workload without pacing. The SLA goodput is measured against is `config.sla`.
    pub fn new(workload: &'a Workload, config: &'a SimConfig) -> Run<'a> {
        Run {
            workload,
            config,
            queue: QueueLimit::default(),
            records: None,
            ttft_breakdown: false,
            telemetry: None,
            planner: None,
            stop_at_ms: None,
            pacing: Pacing::Unpaced,
        }
    }

    /// What happens when requests pile up waiting for admission.
    pub fn queue_limit(mut self, queue: QueueLimit) -> Self {
        self.queue = queue;
        self
    }

    /// Hands every finished request's record to `sink` (none: records are not kept).
    pub fn records(mut self, sink: Option<RecordSink<'a>>) -> Self {
        self.records = sink;
        self
    }

    /// Collects the distributions of the TTFT parts for the summary.
    pub fn ttft_breakdown(mut self, on: bool) -> Self {
        self.ttft_breakdown = on;
        self
    }

    /// Samples per-worker and cluster time series every `interval_ms` of virtual time into
    /// `sink` (the run is then not split across threads).
    pub fn telemetry(mut self, interval_ms: f64, sink: &'a mut (dyn TelemetrySink + Send)) -> Self {
        self.telemetry = Some(Telemetry { interval_ms, sink, dynamo: false });
        self
    }

    /// Times and counts the telemetry samples as Dynamo's replay telemetry does (see
    /// [`Collector::with_dynamo_samples`]); no effect without [`Run::telemetry`].
    pub fn dynamo_samples(mut self) -> Self {
        if let Some(t) = self.telemetry.as_mut() {
            t.dynamo = true;
        }
        self
    }

    /// Runs `planner` in the loop as the autoscaler (none: the workers stay as configured). An
    /// autoscaled run is replayed pass by pass; [`Ran::planner`] hands it back with what it did.
    pub fn planner(mut self, planner: Option<PlannerRun>) -> Self {
        self.planner = planner;
        self
    }

    /// Stops the virtual clock at `ms` (none: at the end of the workload); later arrivals never
    /// come, requests in flight are reported incomplete.
    pub fn stop_at_ms(mut self, ms: Option<f64>) -> Self {
        self.stop_at_ms = ms;
        self
    }

    /// Online replay: paces the run on the wall clock from the moment it starts, each virtual
    /// millisecond taking a wall millisecond. The report is the unpaced run's.
    pub fn online(mut self, on: bool) -> Self {
        self.pacing = if on { Pacing::Online } else { Pacing::Unpaced };
        self
    }

    /// Paces the run by `pacer` instead of the wall clock from its start.
    pub fn pacer(mut self, pacer: &'a dyn Pacer) -> Self {
        self.pacing = Pacing::By(pacer);
        self
    }

    /// The collector of this run's records, breakdown, telemetry and queue limit.
    fn collector(&mut self) -> Collector<'a> {
        let mut collector = Collector::new(self.config.sla, self.records.take()).with_queue_limit(self.queue);
        if self.ttft_breakdown {
            collector = collector.with_ttft_breakdown();
        }
        if let Some(t) = self.telemetry.take() {
            collector = collector.with_telemetry(t.interval_ms, t.sink);
            if t.dynamo {
                collector = collector.with_dynamo_samples();
            }
        }
        collector
    }

    /// Runs the replay, telling `progress` how it goes (and asking it whether to stop).
    pub fn go(mut self, progress: &mut dyn Progress) -> Result<Ran, SimError> {
        let collector = self.collector();
        let clock = matches!(self.pacing, Pacing::Online).then(WallClock::start);
        let pacer = match self.pacing {
            Pacing::Unpaced => None,
            Pacing::Online => clock.as_ref().map(|c| c as &dyn Pacer),
            Pacing::By(p) => Some(p),
        };
        let mut planner = self.planner;
        let options = RunOptions {
            autoscaler: planner.as_mut().map(|run| run as &mut dyn Autoscaler),
            stop_at_ms: self.stop_at_ms,
            pacer,
        };
        let report = simulate_with(self.workload, self.config, collector, progress, options)?;
        Ok(Ran { report, planner })
    }

    /// Runs `n` seeded members of this run instead (see [`crate::ensemble`]) on
    /// `config.threads` threads, each with this run's queue limit and TTFT breakdown; returns
    /// their reports in member order, or the first member's error. An ensemble describes
    /// summaries: its members keep no records or telemetry, run no planner, are not paced, and
    /// run to the end of the workload (a stop time set here is not applied to them).
    pub fn ensemble(self, n: usize) -> Result<Vec<Report>, SimError> {
        debug_assert!(
            self.records.is_none()
                && self.telemetry.is_none()
                && self.planner.is_none()
                && matches!(self.pacing, Pacing::Unpaced),
            "an ensemble keeps summaries only"
        );
        crate::ensemble::run(self.workload, self.config, self.queue, self.ttft_breakdown, n)
    }
}

impl Ran {
    /// The planner's keys in a run's summary (`planner_total_ticks`), added at its end; nothing
    /// without a planner.
    pub fn add_planner_keys(&self, summary: &mut Map<String, Value>) {
        if let Some(run) = &self.planner {
            summary.insert("planner_total_ticks".into(), json!(run.total_ticks()));
        }
    }
}
