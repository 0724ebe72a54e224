//! # servesim-replay
//!
//! Offline replay on a virtual clock: the event loop that runs a workload's requests (from
//! `servesim-workload`, released by its load driver) through simulated workers, and the
//! metrics, telemetry and report of the run. Front ends assemble a run with [`Run`]: the
//! workload and its [`SimConfig`], then only what differs from the defaults.

pub mod ensemble;
pub mod memory;
pub mod metrics;
pub mod planned;
pub mod planner_python;
pub mod record;
pub mod report;
mod run;
pub mod sim;
mod simulate;
mod split;
pub mod stats;
pub mod telemetry;

pub use metrics::{Collector, Handoff, Overflow, QueueLimit, RequestRecord, Sla, Status, TtftBreakdown, TTFT_PARTS};
pub use report::{request_json, request_json_with_breakdown, workload_keys, Report, WALL_CLOCK_KEYS};
pub use run::{Ran, RecordSink, Run};
pub use servesim_cluster::{RouterMode, Topology};
pub use sim::{
    Autoscaler, EncoderPool, FrontendStage, LifecycleOp, Pacer, Progress, RunOptions, ScaleDecision, SimConfig,
    SimError, Tokenization, Transition, WallClock,
};
pub use simulate::{simulate, simulate_with};
pub use telemetry::{ClusterSample, TelemetrySink, WorkerSample};
