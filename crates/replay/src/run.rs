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
use crate::sim::{Autoscaler, Pacer, Progress, RunOptions, SimConfig, SimError, WallClock};
use crate::simulate::simulate_with;
use crate::telemetry::TelemetrySink;

/// Where the per-request records go as requests finish.
pub type RecordSink<'a> = &'a mut (dyn FnMut(&RequestRecord) + Send);

/// The telemetry a run samples: every `interval_ms` of virtual time into `sink`.
struct Telemetry<'a> {
    interval_ms: f64,
    sink: &'a mut (dyn TelemetrySink + Send),
    dynamo: bool,
}

/// One replay of `workload` under `config`, built up from the defaults and run with
/// [`Run::go`].
pub struct Run<'a> {
    pub(crate) workload: &'a Workload,
    pub(crate) config: &'a SimConfig,
    pub(crate) queue: QueueLimit,
    records: Option<RecordSink<'a>>,
    pub(crate) ttft_breakdown: bool,
    telemetry: Option<Telemetry<'a>>,
    planner: Option<PlannerRun>,
    pub(crate) stop_at_ms: Option<f64>,
    /// Pace the run on the wall clock from the moment it starts.
    online: bool,
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
            online: false,
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
        self.online = on;
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
        let clock = self.online.then(WallClock::start);
        let mut planner = self.planner;
        let options = RunOptions {
            autoscaler: planner.as_mut().map(|run| run as &mut dyn Autoscaler),
            stop_at_ms: self.stop_at_ms,
            pacer: clock.as_ref().map(|c| c as &dyn Pacer),
        };
        let report = simulate_with(self.workload, self.config, collector, progress, options)?;
        Ok(Ran { report, planner })
    }
}

impl Run<'_> {
    /// Whether the run keeps its summary only: no records, telemetry, planner or pacing (what
    /// an ensemble's members are).
    pub(crate) fn summaries_only(&self) -> bool {
        self.records.is_none() && self.telemetry.is_none() && self.planner.is_none() && !self.online
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

#[cfg(test)]
pub(crate) mod tests {
    use servesim_engine::WorkerArgs;
    use servesim_workload::{Arrivals, LoadMode, SyntheticSpec};

    use super::*;
    use crate::{simulate, RouterMode, Topology};

    fn setup() -> (Workload, SimConfig) {
        two_workers(20, Arrivals::Interval { interval_ms: 10.0 })
    }

    /// Two round-robin workers with fixed pass times (10 ms prefill, 5 ms decode) and `sessions`
    /// one-turn synthetic requests of 64 + 8 tokens arriving as `arrivals` says.
    pub(crate) fn two_workers(sessions: u32, arrivals: Arrivals) -> (Workload, SimConfig) {
        let engine = WorkerArgs::parse_json(
            r#"{"block_size": 16, "num_gpu_blocks": 1000, "timing_model": {"type": "fixed", "prefill_ms": 10, "decode_ms": 5}}"#,
        )
        .unwrap();
        let workload = Workload::Synthetic(SyntheticSpec {
            input_tokens: 64,
            output_tokens: 8,
            sessions,
            turns_per_session: 1,
            arrivals,
            seed: 3,
            shared_prefix_ratio: 0.0,
            num_prefix_groups: 0,
            inter_turn_delay_ms: 0.0,
            block_tokens: 16,
            group_seed: servesim_workload::GROUP_SEED,
            cached_prefix_tokens: 0,
            accumulate: false,
            images: None,
        });
        let config = SimConfig::new(
            Topology::aggregated(engine, 2).unwrap(),
            RouterMode::RoundRobin,
            LoadMode::Timestamps { speedup: 1.0 },
        );
        (workload, config)
    }

    #[test]
    fn a_run_with_the_defaults_is_the_plain_simulation() {
        let (workload, config) = setup();
        let ran = Run::new(&workload, &config).go(&mut ()).unwrap();
        let plain = simulate(&workload, &config, Collector::new(config.sla, None), &mut ()).unwrap();
        assert_eq!(ran.report.summary_json(), plain.summary_json());
        assert!(ran.planner.is_none());
    }

    #[test]
    fn records_go_to_the_sink_and_a_stop_time_ends_the_run_early() {
        let (workload, config) = setup();
        let mut seen = 0;
        let mut sink = |_: &RequestRecord| seen += 1;
        let full = Run::new(&workload, &config).records(Some(&mut sink)).go(&mut ()).unwrap();
        assert_eq!(seen, 20);
        assert_eq!(full.report.summary_json()["completed_requests"], 20);
        let stopped = Run::new(&workload, &config).stop_at_ms(Some(50.0)).go(&mut ()).unwrap();
        let done = stopped.report.summary_json()["completed_requests"].as_u64().unwrap();
        assert!(done < 20, "{done}");
        let mut summary = Map::new();
        stopped.add_planner_keys(&mut summary);
        assert!(summary.is_empty(), "no planner, no planner keys");
    }
}
