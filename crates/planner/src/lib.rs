//! # servesim-planner
//!
//! Dynamo's Planner (1.6.1) as pure state machines: no clock, no I/O. A driver calls
//! [`Planner::on_tick`] at each tick time with a [`Snapshot`] of the cluster (worker counts,
//! the last forward-pass snapshot of every (worker, rank), the traffic since the previous tick)
//! and applies the targets it returns. See the README for what is exact and what is not.

pub mod budget;
pub mod capacity;
pub mod config;
pub mod fpm_model;
mod planner;
pub mod predict;
pub mod types;

pub use capacity::{Capacity, EngineQuery, PassModel, Shape, Worker};
pub use config::{ConfigError, Mode, PlannerConfig, PredictorKind, Target, PASSTHROUGH_KEYS};
pub use fpm_model::FpmModel;
pub use planner::{idle_fpm, Diagnostics, ExternalFactory, Planner, RoleEngines, SetupError, Tick};
pub use predict::{ExternalSeries, Predictor};
pub use types::{EngineCaps, Fpm, Queued, Scheduled, Snapshot, Traffic};

#[cfg(test)]
mod tests;
