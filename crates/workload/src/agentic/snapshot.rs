//! Request-boundary snapshots of an agentic graph (`agentic_snapshot`).
//!
//! The reference's semantics (`snapshot.rs` of aisimulate-core, and the installed 0.13 build):
//! * Each of the N lanes takes one play of the corpus: lane `l` the play `l mod plays` (or the
//!   `source_play_id` its `initial_selections` entry names), as a new instance of it.
//! * The play is cut at `t*`: drawn in `[first + ¼ span, first + ¾ span]` of its recorded
//!   request starts from a blake3 digest of (schema, seed, graph digest, play id, lane,
//!   ordinal), or the selection's `t_star_ms`. It must lie within the recorded starts.
//! * Requests that started before `t*` are history: they are not replayed. The others start at
//!   `max(0, not_before − t*)`; an edge from history becomes a timer (its recorded dispatch or
//!   completion, plus its delay, minus `t*`), edges between live requests stay edges.
//! * Every instance has its own prompt-token space (no cache reuse across lanes), its own
//!   identities (`agentic-v1:<graph digest>:<seed>:<lane>:<ordinal>`), and all lanes start at
//!   0 together; a trajectory's latency is measured from 0. Nothing follows a snapshot play.
//!
//! [`instantiate`] turns the source graph into a graph of those instances, which the load
//! driver releases as any graph without lanes (one play per lane, labelled with it).

use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::profile::{Corpus, ProfileOptions};
use super::{warmup, AgenticGraph, Edge, Node, Play, Trigger};
use crate::session::TurnMeta;

const SNAPSHOT_SCHEMA: &str = "aisimulate.agentic.snapshot.v1";

/// The most requests the lanes' instances may hold: each is built before the replay starts, and
/// ten million agentic requests already take minutes to replay.
pub const MAX_SNAPSHOT_REQUESTS: u64 = 10_000_000;

/// An exact initial cut of one lane.
#[derive(Clone, Debug, PartialEq)]
pub struct Selection {
    pub source_play_id: String,
    pub t_star_ms: f64,
}

/// `traffic.load.agentic_snapshot`.
#[derive(Clone, Debug, PartialEq)]
pub struct SnapshotOptions {
    pub seed: u64,
    /// One per lane, in lane order.
    pub initial_selections: Option<Vec<Selection>>,
    /// Where the corpus cursor stands after the initial draws (a continuous profile refills
    /// its lanes from there; a snapshot alone never reads it).
    pub corpus_cursor: Option<u64>,
    /// `agentic_warmup`: replay the lanes' primers and warmups before the profile
    /// ([`super::warmup`]).
    pub warmup: bool,
    /// `agentic_profile`: a continuous, duration-limited replay that refills the lanes
    /// ([`super::profile`]).
    pub profile: Option<ProfileOptions>,
}

/// What the source graph was, for the reports.
#[derive(Clone, Debug, PartialEq)]
pub struct SnapshotShape {
    pub source_nodes: usize,
    pub source_plays: usize,
    pub seed: u64,
}

/// The uniform draw of a lane's cut, in [0, 1).
fn unit_draw(seed: u64, graph_digest: &str, play_id: &str, lane: usize, ordinal: u64) -> f64 {
    let key = serde_json::to_vec(&(SNAPSHOT_SCHEMA, seed, graph_digest, play_id, lane, ordinal))
        .expect("a tuple of strings and integers serialises");
    let digest = blake3::hash(&key);
    let bits = u64::from_le_bytes(digest.as_bytes()[..8].try_into().expect("8 bytes"));
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// The recorded interval of a node: its start and, when recorded, its end.
fn interval(n: &Node) -> (f64, Option<f64>) {
    (n.not_before_ms, n.recorded_api_ms.map(|d| n.not_before_ms + d))
}

/// The lanes' snapshots of `src` as a graph of their own.
pub fn instantiate(src: AgenticGraph, lanes: u32, o: &SnapshotOptions) -> Result<AgenticGraph, String> {
    let lanes = lanes as usize;
    if lanes == 0 || src.plays.is_empty() {
        return Err("agentic snapshots require positive lanes and a nonempty corpus".into());
    }
    if let Some(sel) = &o.initial_selections {
        if sel.len() != lanes {
            return Err("initial_selections must contain exactly one selection per lane".into());
        }
    }
    // Every lane instantiates a whole play (its history included until it is cut): bounded
    // before anything is built.
    let play_nodes = |p: usize| src.plays[p].nodes.len() as u64;
    let instantiated: u64 = match &o.initial_selections {
        Some(sel) => sel
            .iter()
            .map(|s| src.plays.iter().find(|p| *p.id == *s.source_play_id).map_or(0, |p| p.nodes.len() as u64))
            .sum(),
        None => {
            let (rounds, rest) = (lanes as u64 / src.plays.len() as u64, lanes % src.plays.len());
            rounds.saturating_mul(src.nodes.len() as u64).saturating_add((0..rest).map(play_nodes).sum::<u64>())
        }
    };
    if instantiated > MAX_SNAPSHOT_REQUESTS {
        return Err(format!(
            "{lanes} snapshot lanes instantiate {instantiated} requests of the corpus; at most \
             {MAX_SNAPSHOT_REQUESTS} are replayed (lower agentic_lanes)"
        ));
    }
    let mut nodes: Vec<Node> = Vec::new();
    let mut plays: Vec<Play> = Vec::with_capacity(lanes);
    let mut blocks: FxHashMap<(usize, u32), u32> = FxHashMap::default();
    // Per lane: its preparation sources and root id (warmed snapshots only).
    let mut prep = Vec::new();
    for lane in 0..lanes {
        let (p, cut) = match &o.initial_selections {
            Some(sel) => {
                let s = &sel[lane];
                let p = src
                    .plays
                    .iter()
                    .position(|p| *p.id == *s.source_play_id)
                    .ok_or_else(|| format!("unknown snapshot source play {}", s.source_play_id))?;
                (p, Some(s.t_star_ms))
            }
            None => (lane % src.plays.len(), None),
        };
        let play = &src.plays[p];
        let (first, last) = recorded_span(&src, play);
        let t_star = cut.unwrap_or_else(|| {
            first + (0.25 + 0.5 * unit_draw(o.seed, &src.graph_digest, &play.id, lane, 0)) * (last - first)
        });
        if !t_star.is_finite() || t_star < first || t_star > last {
            return Err(format!("snapshot cut must lie within recorded request-start bounds [{first}, {last}]"));
        }
        let at = Slot { seed: o.seed, lane, ordinal: 0, slot: lane as u64 };
        let instance = build_instance(&src, &at, p, t_star, nodes.len() as u32, &mut |b| {
            let next = blocks.len() as u32;
            *blocks.entry((lane, b)).or_insert(next)
        })?;
        if o.warmup {
            prep.push((warmup::lane_sources(&src, play, t_star), instance.root_id.clone()));
        }
        nodes.extend(instance.nodes.into_iter().map(|n| Node { play: lane as u32, ..n }));
        plays.push(instance.play);
    }
    // The preparation prompts take block ids after every live request's, so that a snapshot's
    // requests see the same ids warmed or not.
    let preparation = o.warmup.then(|| {
        let mut plan = warmup::Plan::default();
        for (lane, (sources, root_id)) in prep.iter().enumerate() {
            plan.add_lane(&src, lane as u32, &plays[lane].id, root_id.clone(), sources, |b| {
                let next = blocks.len() as u32;
                *blocks.entry((lane, b)).or_insert(next)
            });
        }
        plan
    });
    if preparation.as_ref().is_some_and(|p| p.lanes.iter().any(|(_, m)| m.is_empty())) {
        return Err("warmup snapshot has no retained request".into());
    }
    let shape = SnapshotShape { source_nodes: src.nodes.len(), source_plays: src.plays.len(), seed: o.seed };
    let (block_tokens, source, graph_digest, models) =
        (src.block_tokens, src.source.clone(), src.graph_digest.clone(), src.models.clone());
    let (weka_basis, execution_model) = (src.weka_basis, src.execution_model.clone());
    let profile = o.profile.clone().map(|options| {
        Box::new(Corpus {
            options,
            cursor: o.corpus_cursor.unwrap_or(lanes as u64),
            next_block: blocks.len() as u32,
            max_requests: super::profile::MAX_PROFILE_REQUESTS,
            src,
        })
    });
    Ok(AgenticGraph {
        block_tokens,
        source,
        graph_digest,
        nodes,
        plays,
        models,
        weka_basis,
        lanes: Some(lanes as u32),
        snapshot: Some(shape),
        execution_model,
        preparation,
        profile,
        outcome: std::sync::Mutex::new(None),
    })
}

/// Where an instance of a play runs: the lane, the play's ordinal on it, and its slot
/// (`ordinal × lanes + lane`), which numbers its requests.
pub(super) struct Slot {
    pub seed: u64,
    pub lane: usize,
    pub ordinal: u64,
    pub slot: u64,
}

/// One instance of a source play, its requests numbered from a base index.
pub(super) struct Instance {
    pub play: Play,
    pub nodes: Vec<Node>,
    /// The instance id of its root, when it has one root.
    pub root_id: Option<Arc<str>>,
}

/// The first and last recorded request start of a play.
pub(super) fn recorded_span(src: &AgenticGraph, play: &Play) -> (f64, f64) {
    let starts = play.nodes.iter().map(|&i| src.nodes[i as usize].not_before_ms);
    (starts.clone().fold(f64::INFINITY, f64::min), starts.fold(f64::NEG_INFINITY, f64::max))
}

/// The instance of source play `p` at `at`, cut at `t_star` (a continuous profile's refills
/// cut at the play's first start: the whole play). Requests started before the cut are history;
/// the others start at `max(0, not_before − t*)`, an edge from history turning into a timer.
/// `intern` maps the source's prompt blocks into the instance's own token space.
pub(super) fn build_instance(
    src: &AgenticGraph,
    at: &Slot,
    p: usize,
    t_star: f64,
    base: u32,
    intern: &mut dyn FnMut(u32) -> u32,
) -> Result<Instance, String> {
    let play = &src.plays[p];
    let request_stride = src.nodes.len() as u64 + 1;
    let play_id: Arc<str> = format!("agentic-v1:{}:{}:{}:{}", src.graph_digest, at.seed, at.lane, at.ordinal).into();
    let request_id = |i: u32| -> Arc<str> { format!("{play_id}:request:{}", src.nodes[i as usize].request_id).into() };
    let root_id = (play.roots.len() == 1).then(|| request_id(play.roots[0]));
    for &i in &play.nodes {
        let n = &src.nodes[i as usize];
        if n.not_before_ms < t_star && n.deps.iter().any(|e| src.nodes[e.source as usize].not_before_ms >= t_star) {
            return Err(format!(
                "snapshot boundary crosses a historical request's unresolved dependency: {}",
                n.request_id
            ));
        }
    }
    let live: Vec<u32> =
        play.nodes.iter().copied().filter(|&i| src.nodes[i as usize].not_before_ms >= t_star).collect();
    let new_index: FxHashMap<u32, u32> = live.iter().enumerate().map(|(k, &i)| (i, base + k as u32)).collect();
    let mut nodes = Vec::with_capacity(live.len());
    for &i in &live {
        let n = &src.nodes[i as usize];
        let mut delay = (n.not_before_ms - t_star).max(0.0);
        let mut deps = Vec::new();
        for e in &n.deps {
            match new_index.get(&e.source) {
                Some(&s) => deps.push(Edge { source: s, ..*e }),
                None => {
                    let (start, end) = interval(&src.nodes[e.source as usize]);
                    let fired = match e.trigger {
                        Trigger::Dispatch => start,
                        Trigger::Completion => end.unwrap_or(start),
                    };
                    delay = delay.max(fired + e.delay_ms - t_star);
                }
            }
        }
        let id = request_id(i);
        let session: Arc<str> = format!("{play_id}:conversation:{}", n.session_id).into();
        let mut turn = n.turn.clone();
        turn.blocks = n.turn.blocks.iter().map(|&b| intern(b)).collect();
        if let Some(meta) = &n.turn.meta {
            let mut meta: TurnMeta = (**meta).clone();
            meta.request_id = Some(id.clone());
            if let Some(ids) = meta.agentic.as_mut() {
                ids.node = (at.slot.wrapping_mul(request_stride).wrapping_add(u64::from(i))) as u32;
                ids.request_id = id.clone();
                ids.play_id = play_id.clone();
                ids.conversation_id = session.clone();
                ids.lane = Some(at.lane as u32);
                ids.root_id = root_id.clone();
                ids.parent_id = ids.parent_id.as_ref().map(|p| format!("{play_id}:request:{p}").into());
            }
            turn.meta = Some(Arc::new(meta));
        }
        nodes.push(Node {
            request_id: id,
            source_request_id: Some(n.request_id.clone()),
            play: 0, // set by the caller, which knows the play's index
            session_id: session,
            model: n.model,
            not_before_ms: delay,
            recorded_api_ms: n.recorded_api_ms,
            deps,
            turn,
            file: n.file,
            line: n.line,
        });
    }
    let members: Vec<u32> = (base..base + nodes.len() as u32).collect();
    let roots = members.iter().copied().filter(|&k| nodes[(k - base) as usize].deps.is_empty()).collect();
    Ok(Instance { play: Play { id: play_id, nodes: members, roots }, nodes, root_id })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference (aisimulate 0.13) cut lane 0 of play `p1` (recorded starts 0 … 2000 ms)
    /// of the graph with this digest at 576.974166 ms for seed 7.
    #[test]
    fn the_sampled_cut_is_the_references() {
        let digest = "f433823e2747f4ed03093c58f62bffc81ad4bd33ba8fc5535edbb5149b77c289";
        let t = (0.25 + 0.5 * unit_draw(7, digest, "p1", 0, 0)) * 2000.0;
        assert!((t - (1000.0 - 423.0258340246136)).abs() < 1e-9, "{t}");
    }
}
