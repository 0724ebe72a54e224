//! # servesim-replay
//!
//! Offline replay on a virtual clock: workloads (Mooncake traces, synthetic load), the load
//! driver that releases their requests, the event loop that runs them through simulated
//! workers, and the metrics and report of the run.

pub mod agentic;
pub mod ensemble;
pub mod error;
pub mod formats;
pub mod input;
pub mod memory;
pub mod metrics;
pub mod paths;
pub mod planned;
pub mod planner_python;
pub mod report;
pub mod scratch;
pub mod sim;
mod split;
pub mod stats;
pub mod synthetic;
pub mod telemetry;
mod time;
pub mod trace;
pub mod workload;

pub use error::InputError;
pub use formats::{load_trace, TraceFormat, TraceOptions};
pub use metrics::{Collector, Handoff, Overflow, QueueLimit, RequestRecord, Sla, Status, TtftBreakdown};
pub use report::{request_json, request_json_with_breakdown, Report, WALL_CLOCK_KEYS};
pub use servesim_cluster::{RouterMode, Topology};
pub use sim::{
    simulate, simulate_with, Autoscaler, LifecycleOp, Pacer, Progress, RunOptions, ScaleDecision, SimConfig, SimError,
    Transition, WallClock,
};
pub use synthetic::{Arrivals, SyntheticSpec};
pub use telemetry::{ClusterSample, TelemetrySink, WorkerSample};
pub use trace::{load_mooncake, load_mooncake_delta};
pub use workload::{LoadMode, Workload};
