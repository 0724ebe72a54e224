//! The recommend search over Planner settings: the `planner:` section of a recommend
//! configuration as Dynamo 1.6.1's Planner adapter reads it (`planner.md` §8;
//! `dynamo/planner/simulation/{config,provider,presets,load_predictor}.py`), expanded into the
//! list of concrete `planner:` sections the candidates take.
//!
//! Keys: `policy` (default both `disabled` and `enabled`), the four composite groups
//! `scaling_policy`, `fpm_sampling`, `load_sensitivity`, `load_predictor` (each `preset:
//! default` — every preset of the group, also when the group is absent —, a list of preset names
//! and custom mappings, or `preset: false` / `{}` with the group's independent knobs as domains),
//! `max_num_gpus` (8), `max_throughput_scaling_replicas` (8), `min_workers`,
//! `prefill_min_workers`, `decode_min_workers`. The Planner's target comes from
//! `optimization.target`. Scaling policies that use throughput scaling are kept only under an
//! `sla` target with both `ttft_ms` and `itl_ms`.
//!
//! Each point of the space is materialised as the adapter does (`materialize_replay`): policy
//! disabled, or a scaling policy that enables nothing, gives `{policy: disabled}`; otherwise the
//! policy's knobs, the FPM sampling (throughput scaling only), the load sensitivity (load
//! scaling only) and the load predictor the backtest chose for the policy's throughput interval
//! go through the Planner's own configuration (`servesim_planner::PlannerConfig`, its defaults
//! and checks), and the section written is every public field of the result — so
//! `predict -c` replays it as it stands. Points the configuration refuses are kept with their
//! reason (the reference marks them infeasible, `adapter_constraint`). Equal sections are
//! listed once, in the order first met (the space's dimensions in the adapter's order, the last
//! fastest).
//!
//! The load predictor is not a search dimension: for every throughput interval the candidates
//! use, a backtest over the trace's windows picks the preset with the lowest one-step-ahead
//! loss (`sweep_load_predictor`). `constant` and `kalman` are servesim's own; ARIMA and Prophet
//! are Dynamo's, run through Python (`servesim_replay::planner_python`): named in the section,
//! Python is required; in a default list they run when Python can, and are otherwise skipped
//! (still counted for the warmup, so the losses of the others are the reference's) with a
//! notice and the reason in the recommendation's provenance.
//!
//! Files: [`presets`] (the adapter's preset tables and key lists), [`section`] (the context the
//! section is read in, each knob's domain, each composite group's presets or knobs),
//! [`backtest`] (the load-predictor backtest on the trace) and [`mod@expand`] (the space's points,
//! materialised through the Planner's configuration).

pub mod backtest;
pub mod expand;
pub mod presets;
pub mod section;

pub use expand::{expand, public_section, Grid, PlannerSearch, Setting};
pub use section::Context;
