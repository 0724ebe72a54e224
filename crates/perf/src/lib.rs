//! Data-driven forward-pass timing for servesim: NVIDIA's AIS / aiconfigurator op-level
//! estimator, re-implemented from its specification.
//!
//! A model's `config.json` becomes a list of operations per phase ([`model`]); each op is looked
//! up in measured kernel-latency tables read from an installed `aisimulate_core` /
//! `aiconfigurator_core` package ([`systems`], [`db`]) with the reference's interpolation
//! rules ([`interp`]); the ops add up to prefill / decode step times and forward-pass times
//! ([`mod@estimator`]). [`provider`] plugs it into the engine as the `ais` / `aic` timing model.

pub mod afd;
pub mod block_draft;
pub mod db;
pub mod dcp;
pub mod draft_model;
pub mod dsa;
pub mod dsv4;
pub mod dsv41;
pub mod dsv4_sglang;
pub mod dsv4_topk;
pub mod eagle3;
pub mod empirical;
mod empirical_mla;
mod empirical_moe;
pub mod eplb;
pub mod error;
pub mod estimator;
pub mod fpm;
pub mod fpm_interp;
pub mod gdn;
pub mod gemma4;
pub mod glimmer;
pub mod hybrid_moe;
pub mod interp;
pub mod kimi_k3;
pub mod mamba2;
pub mod memory;
pub mod mla;
pub mod mla_ops;
pub mod model;
pub mod moe;
pub mod moe_a2a;
pub mod moe_ops;
pub mod msa;
pub mod parquet_table;
pub mod provider;
pub mod qwen3vl;
pub mod systems;
pub mod vision;
pub mod wideep_mla;

pub use error::{ErrorKind, PerfError};
pub use estimator::{Estimator, RankMetrics};
pub use provider::{
    build_timer, estimator, planner_model, timer_factory, AisConfig, AisTimer, DecodeContext, PassCalibration,
    PassModel, PlannerModel,
};
