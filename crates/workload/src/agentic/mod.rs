//! Agentic workloads: a validated dependency graph of requests grouped into plays.
//!
//! Every agentic format (agentic Mooncake v2, agentic Dynamo request traces, Weka corpora)
//! lowers to rows of the agentic Mooncake v2 shape, which [`GraphBuilder`] validates and
//! compiles into an [`AgenticGraph`]: nodes sorted by `request_id`, their dependency edges
//! (dispatch or completion triggers, with delays), and plays with their roots. The load driver
//! ([`driver::GraphState`]) releases the nodes as their edges fire.
//!
//! What the graph holds in memory: per node its ids, lengths, interned prompt blocks (4 bytes
//! per trace block) and edges. Source hash ids are interned to compact ids in node order, as the
//! reference does; the graph digest is computed over the source ids before they are dropped.

mod builder;
pub mod driver;
pub mod profile;
pub mod snapshot;
pub mod warmup;

pub use crate::session::AgenticIds;
pub use builder::{row_error, GraphBuilder, Loc};

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustc_hash::FxHashMap;
use serde::Deserialize;

use crate::error::InputError;
use crate::session::{TurnMeta, TurnSpec};

pub const AGENTIC_MOONCAKE_SCHEMA: &str = "dynamo.agentic_mooncake";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    Dispatch,
    Completion,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Relation {
    Sequence,
    Spawn,
    Join,
    ReplayBarrier,
}

impl Trigger {
    fn name(self) -> &'static str {
        match self {
            Trigger::Dispatch => "dispatch",
            Trigger::Completion => "completion",
        }
    }
}

impl Relation {
    fn name(self) -> &'static str {
        match self {
            Relation::Sequence => "sequence",
            Relation::Spawn => "spawn",
            Relation::Join => "join",
            Relation::ReplayBarrier => "replay_barrier",
        }
    }

    fn debug_name(self) -> &'static str {
        match self {
            Relation::Sequence => "Sequence",
            Relation::Spawn => "Spawn",
            Relation::Join => "Join",
            Relation::ReplayBarrier => "ReplayBarrier",
        }
    }
}

/// One dependency as rows write it.
#[derive(Clone, Debug, Deserialize)]
pub struct RowDependency {
    pub request_id: String,
    pub trigger: Trigger,
    pub delay_ms: f64,
    pub relation: Relation,
}

/// One request row of the agentic Mooncake v2 shape (what every agentic format lowers to).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct AgenticRow {
    pub request_id: String,
    pub play_id: String,
    #[serde(default)]
    pub source_play_ordinal: Option<usize>,
    pub session_id: String,
    pub model: String,
    #[serde(default, alias = "input_tokens")]
    pub input_length: Option<u64>,
    #[serde(default, alias = "output_tokens")]
    pub output_length: Option<u64>,
    #[serde(default)]
    pub output_token_ids: Option<Vec<u32>>,
    #[serde(default)]
    pub hash_ids: Option<Vec<u64>>,
    pub not_before_ms: f64,
    #[serde(default)]
    pub recorded_api_time_ms: Option<f64>,
    #[serde(default)]
    pub priority: Option<i32>,
    #[serde(default)]
    pub strict_priority: Option<u32>,
    #[serde(default)]
    pub policy_class: Option<String>,
    #[serde(default)]
    pub dependencies: Vec<RowDependency>,
}

/// The v2 header line.
#[derive(Clone, Debug, Deserialize)]
pub struct Header {
    pub schema: String,
    pub version: u32,
    pub block_size: u64,
    pub hash_id_scope: HashIdScope,
    pub source: Provenance,
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum HashIdScope {
    Local,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Provenance {
    pub format: String,
    pub digest: String,
}

#[derive(Clone, Copy, Debug)]
pub struct Edge {
    pub source: u32,
    pub trigger: Trigger,
    pub delay_ms: f64,
    pub relation: Relation,
}

/// A validated request of the graph.
#[derive(Clone, Debug)]
pub struct Node {
    pub request_id: Arc<str>,
    /// A snapshot instance's request: the id its source row had (lifecycle events and play
    /// outcomes name it, as the reference does).
    pub source_request_id: Option<Arc<str>>,
    pub play: u32,
    pub session_id: Arc<str>,
    pub model: u32,
    pub not_before_ms: f64,
    /// `recorded_api_time_ms`: how long the recorded request took (snapshot cuts read it).
    pub recorded_api_ms: Option<f64>,
    pub deps: Vec<Edge>,
    /// The request as the engines see it (its `meta` carries the agentic ids).
    pub turn: TurnSpec,
    /// Where the row came from, for messages.
    pub file: u16,
    pub line: u32,
}

#[derive(Clone, Debug)]
pub struct Play {
    pub id: Arc<str>,
    pub nodes: Vec<u32>,
    pub roots: Vec<u32>,
}

/// A validated, normalised agentic graph.
#[derive(Debug)]
pub struct AgenticGraph {
    pub block_tokens: u32,
    pub source: Provenance,
    pub graph_digest: String,
    pub nodes: Vec<Node>,
    pub plays: Vec<Play>,
    pub models: Vec<String>,
    /// Weka only: how nested timestamps were read.
    pub weka_basis: Option<&'static str>,
    /// Closed loop over plays (`--agentic-lanes`).
    pub lanes: Option<u32>,
    /// Set when the graph is the lanes' request-boundary snapshots of a source graph
    /// (`agentic_snapshot`): its plays are one instance per lane, released at once.
    pub snapshot: Option<snapshot::SnapshotShape>,
    /// Warmed snapshots (`agentic_warmup`): what the lanes replay before the profile opens.
    pub preparation: Option<warmup::Plan>,
    /// A continuous profile (`agentic_profile`): the corpus its lanes are refilled from.
    pub profile: Option<Box<profile::Corpus>>,
    /// The target model the run projects source models onto (`--execution-model`).
    pub execution_model: Option<String>,
    /// What the load driver saw, published when it finishes.
    pub outcome: Mutex<Option<driver::AgenticOutcome>>,
}

impl AgenticGraph {
    pub fn num_requests(&self) -> u64 {
        self.nodes.len() as u64
    }

    /// Sorted, distinct source models.
    pub fn source_models(&self) -> Vec<String> {
        let mut m = self.models.clone();
        m.sort();
        m.dedup();
        m
    }
}

/// Assigns each row's play to the component of the dependency graph it is in, named
/// `<prefix>:<root request_id>` after the earliest root (by `not_before_ms`, then id).
pub fn assign_component_plays(rows: &mut [AgenticRow], prefix: &str) {
    fn find(parent: &mut [usize], v: usize) -> usize {
        let mut r = v;
        while parent[r] != r {
            r = parent[r];
        }
        let mut c = v;
        while parent[c] != r {
            let next = parent[c];
            parent[c] = r;
            c = next;
        }
        r
    }
    let by_id: HashMap<String, usize> = rows.iter().enumerate().map(|(i, r)| (r.request_id.clone(), i)).collect();
    let mut parent: Vec<usize> = (0..rows.len()).collect();
    for (i, row) in rows.iter().enumerate() {
        for d in &row.dependencies {
            if let Some(&s) = by_id.get(&d.request_id) {
                let (a, b) = (find(&mut parent, i), find(&mut parent, s));
                if a != b {
                    parent[a] = b;
                }
            }
        }
    }
    let mut label: HashMap<usize, usize> = HashMap::new();
    for (i, row) in rows.iter().enumerate() {
        if row.dependencies.is_empty() {
            let c = find(&mut parent, i);
            let e = label.entry(c).or_insert(i);
            let cur = &rows[*e];
            if row.not_before_ms.total_cmp(&cur.not_before_ms).then(row.request_id.cmp(&cur.request_id)).is_lt() {
                *e = i;
            }
        }
    }
    let names: Vec<String> = (0..rows.len())
        .map(|i| {
            let c = find(&mut parent, i);
            let l = *label.get(&c).unwrap_or(&i);
            format!("{prefix}:{}", rows[l].request_id)
        })
        .collect();
    for (row, name) in rows.iter_mut().zip(names) {
        row.play_id = name;
    }
}
