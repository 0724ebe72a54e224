//! Every trace format the reference replays, and the options that go with them.
//!
//! | format | lowers to | held in memory |
//! |---|---|---|
//! | `mooncake` ([`mooncake`]) | sessions | nothing when its rows are single requests in time order (streamed); else every row at trace-block level |
//! | `mooncake-delta` | accumulating sessions | every row; a session's history while it runs |
//! | `applied_compute_agentic` | sessions | every turn at trace-block level |
//! | `agentic_mooncake` | dependency graph | the graph |
//! | `dynamo` | sessions (standard) or graph (with `agent_context`) | the requests of every shard (they are sorted across shards); tool events as ids only |
//! | `weka` | dependency graph | the graph, and one trace object at a time while it is lowered |

pub mod applied;
pub mod dynamo;
pub mod mooncake;
pub mod mooncake_v2;
pub mod weka;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::agentic::AgenticGraph;
use crate::driver::LoadMode;
use crate::error::InputError;
use crate::workload::Workload;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceFormat {
    Mooncake,
    MooncakeDelta,
    AppliedComputeAgentic,
    AgenticMooncake,
    Dynamo,
    Weka,
}

impl TraceFormat {
    /// Parses a format name (with the reference's aliases).
    pub fn parse(name: &str) -> Option<TraceFormat> {
        Some(match name {
            "mooncake" => TraceFormat::Mooncake,
            "mooncake-delta" | "mooncake_delta" => TraceFormat::MooncakeDelta,
            "applied_compute_agentic" => TraceFormat::AppliedComputeAgentic,
            "agentic_mooncake" | "agentic-mooncake" => TraceFormat::AgenticMooncake,
            "dynamo" => TraceFormat::Dynamo,
            "weka" => TraceFormat::Weka,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            TraceFormat::Mooncake => "mooncake",
            TraceFormat::MooncakeDelta => "mooncake-delta",
            TraceFormat::AppliedComputeAgentic => "applied_compute_agentic",
            TraceFormat::AgenticMooncake => "agentic_mooncake",
            TraceFormat::Dynamo => "dynamo",
            TraceFormat::Weka => "weka",
        }
    }
}

/// How Weka timestamps nested under a subagent marker are read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WekaBasis {
    #[default]
    Auto,
    Absolute,
    Relative,
}

#[derive(Clone, Debug)]
pub struct TraceOptions {
    pub format: TraceFormat,
    /// Tokens per hash id; `None` takes the format's own (512 for Mooncake, the embedded or
    /// declared size for the others).
    pub trace_block_size: Option<u32>,
    pub arrival_speedup_ratio: f64,
    pub replay_concurrency: Option<u32>,
    pub agentic_lanes: Option<u32>,
    /// Request-boundary snapshots of the lanes (`agentic::snapshot`).
    pub agentic_snapshot: Option<crate::agentic::snapshot::SnapshotOptions>,
    pub execution_model: Option<String>,
    /// `applied_compute_agentic` only.
    pub shared_prefix_ratio: f64,
    pub num_prefix_groups: u32,
    /// `weka` only (`None`: not given).
    pub weka_basis: Option<WekaBasis>,
}

impl TraceOptions {
    pub fn new(format: TraceFormat) -> TraceOptions {
        TraceOptions {
            format,
            trace_block_size: None,
            arrival_speedup_ratio: 1.0,
            replay_concurrency: None,
            agentic_lanes: None,
            agentic_snapshot: None,
            execution_model: None,
            shared_prefix_ratio: 0.0,
            num_prefix_groups: 0,
            weka_basis: None,
        }
    }
}

/// Reads a Mooncake trace (see [`mooncake::load`]): streamed when its rows are single requests
/// in time order, else held as sessions.
pub fn load_mooncake(paths: &[impl AsRef<Path>], trace_block_size: u32) -> Result<Workload, InputError> {
    Ok(match mooncake::load(paths, trace_block_size)? {
        mooncake::Mooncake::Streamed(trace) => Workload::Streamed(trace),
        mooncake::Mooncake::Sessions(sessions) => Workload::Trace { sessions, block_tokens: trace_block_size },
    })
}

/// Reads a `mooncake-delta` trace (see [`mooncake::load_delta`]).
pub fn load_mooncake_delta(paths: &[impl AsRef<Path>], trace_block_size: u32) -> Result<Workload, InputError> {
    let sessions = mooncake::load_delta(paths, trace_block_size)?;
    Ok(Workload::Accumulating { sessions, block_tokens: trace_block_size })
}

fn bad(msg: impl Into<String>) -> InputError {
    InputError::new(msg)
}

/// Reads a trace of any format and says how to release its requests.
pub fn load_trace(paths: &[PathBuf], o: &TraceOptions) -> Result<(Workload, LoadMode), InputError> {
    use TraceFormat::*;
    if paths.is_empty() {
        return Err(bad("trace replay requires at least one trace file"));
    }
    if !matches!(o.format, Dynamo | Mooncake) && paths.len() != 1 {
        return Err(bad(format!(
            "trace_format='{}' requires exactly one trace file, got {}",
            o.format.name(),
            paths.len()
        )));
    }
    if !(o.arrival_speedup_ratio.is_finite() && o.arrival_speedup_ratio > 0.0) {
        return Err(bad(format!(
            "arrival speedup ratio must be a finite positive number, got {}",
            o.arrival_speedup_ratio
        )));
    }
    if o.replay_concurrency == Some(0) {
        return Err(bad("replay_concurrency must be at least 1"));
    }
    if o.agentic_lanes == Some(0) {
        return Err(bad("agentic_lanes must be at least 1"));
    }
    if o.agentic_lanes.is_some() && o.replay_concurrency.is_some() {
        return Err(bad("agentic_lanes cannot be combined with replay_concurrency"));
    }
    if o.agentic_lanes.is_some() && !matches!(o.format, AgenticMooncake | Weka | Dynamo) {
        return Err(bad("agentic_lanes requires trace_format='agentic_mooncake', 'weka', or 'dynamo'"));
    }
    if o.weka_basis.is_some() && o.format != Weka {
        return Err(bad("weka_nested_timestamp_basis requires trace_format='weka'"));
    }
    let execution_model = match &o.execution_model {
        Some(m) if m.trim().is_empty() => return Err(bad("execution_model must be non-empty")),
        Some(m) => Some(m.trim().to_string()),
        None => None,
    };
    if matches!(o.format, AgenticMooncake | Weka) && execution_model.is_none() {
        return Err(bad("agentic execution requires a configured target model (give --execution-model)"));
    }
    if o.trace_block_size == Some(0) {
        return Err(bad("trace_block_size must be greater than 0"));
    }
    let sessions_mode = || match o.replay_concurrency {
        Some(c) => LoadMode::Concurrency { max_sessions: c },
        None => LoadMode::Timestamps { speedup: o.arrival_speedup_ratio },
    };
    let graph_mode = LoadMode::Timestamps { speedup: 1.0 };
    if let Some(snap) = &o.agentic_snapshot {
        if o.agentic_lanes.is_none() {
            return Err(bad("agentic_snapshot requires positive agentic_lanes"));
        }
        if o.format == Dynamo {
            // Dynamo snapshots cut at the recorded service intervals of the request log, which
            // the Dynamo reader does not keep.
            return Err(bad("agentic_snapshot over Dynamo request traces is not supported by servesim yet"));
        }
        if o.arrival_speedup_ratio != 1.0 {
            return Err(bad("agentic_snapshot with a speedup other than 1 is not supported by servesim yet"));
        }
        if snap.initial_selections.as_ref().is_some_and(|s| s.len() != o.agentic_lanes.unwrap_or(0) as usize) {
            return Err(bad("initial_selections must contain exactly one selection per lane"));
        }
    }
    let finish_graph = |mut g: AgenticGraph| -> Result<Workload, InputError> {
        g.lanes = o.agentic_lanes;
        g.execution_model = execution_model.clone();
        if let (Some(snap), Some(lanes)) = (&o.agentic_snapshot, o.agentic_lanes) {
            g = crate::agentic::snapshot::instantiate(g, lanes, snap).map_err(bad)?;
        }
        Ok(Workload::Graph(Arc::new(g)))
    };
    match o.format {
        Mooncake => Ok((load_mooncake(paths, o.trace_block_size.unwrap_or(512))?, sessions_mode())),
        MooncakeDelta => Ok((load_mooncake_delta(paths, o.trace_block_size.unwrap_or(512))?, sessions_mode())),
        AppliedComputeAgentic => {
            if o.replay_concurrency.is_none() {
                return Err(bad(
                    "trace_format='applied_compute_agentic' requires replay_concurrency because source traces do \
                     not contain first-turn timestamps (give --replay-concurrency)",
                ));
            }
            let w = applied::load(
                &paths[0],
                o.trace_block_size.unwrap_or(512),
                o.shared_prefix_ratio,
                o.num_prefix_groups,
            )?;
            Ok((w, sessions_mode()))
        }
        AgenticMooncake => {
            if o.replay_concurrency.is_some() {
                return Err(bad("agentic_mooncake trace format is not supported with replay_concurrency"));
            }
            let g = mooncake_v2::load(&paths[0], o.arrival_speedup_ratio)?;
            Ok((finish_graph(g)?, graph_mode))
        }
        Weka => {
            if o.replay_concurrency.is_some() {
                return Err(bad("agentic Dynamo request traces are not supported with replay_concurrency"));
            }
            let g =
                weka::load(&paths[0], o.trace_block_size, o.weka_basis.unwrap_or_default(), o.arrival_speedup_ratio)?;
            Ok((finish_graph(g)?, graph_mode))
        }
        Dynamo => match dynamo::load(paths, o.trace_block_size, o.arrival_speedup_ratio)? {
            dynamo::Lowered::Standard(w) => {
                if o.agentic_lanes.is_some() {
                    return Err(bad("agentic_lanes requires an agentic Dynamo request trace"));
                }
                Ok((w, sessions_mode()))
            }
            dynamo::Lowered::Agentic(g) => {
                if o.replay_concurrency.is_some() {
                    return Err(bad("agentic Dynamo request traces are not supported with replay_concurrency"));
                }
                if execution_model.is_none() {
                    return Err(bad("agentic execution requires a configured target model (give --execution-model)"));
                }
                Ok((finish_graph(g)?, graph_mode))
            }
        },
    }
}
