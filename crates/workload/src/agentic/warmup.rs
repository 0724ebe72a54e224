//! The preparation phase of warmed agentic snapshots (`agentic_warmup: true`).
//!
//! The reference's semantics (`phase.rs` of aisimulate-core, observed on the installed 0.13
//! build):
//! * Each lane of a snapshot first replays, one request at a time, its **primers** — for every
//!   conversation that continues past the cut, the last request of it recorded before the cut
//!   (latest start) — then [`WARMUP_REQUESTS_PER_LANE`] **warmup** requests cycling over the
//!   primers (or, without primers, the lane's first live request). Each is the source request's
//!   full prompt in the lane's own token space, generating one token; the next of a lane is
//!   released when the previous ends.
//! * The **barrier**: once every preparation request has ended (completed) and nothing is in
//!   flight, the profile opens at that instant. The engines keep their warm KV caches; the
//!   snapshot plays start then; the reports measure from there (times rebased to it, the
//!   preparation requests left out of every metric) and describe the preparation under
//!   `agentic_phases`.
//! * A preparation request that is rejected aborts the run: the profile never opens.
//!
//! [`Plan`] is what the workload holds (built by `snapshot::instantiate`); [`Preparation`] is
//! the load driver's state while it runs.

use std::collections::BTreeMap;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::{AgenticGraph, Play};
use crate::session::{Ready, SessionSpec, TurnMeta, TurnSpec};

/// Warmup requests per lane after its primers (the AgentX methodology's ten).
pub const WARMUP_REQUESTS_PER_LANE: usize = 10;
const PHASE_SCHEMA: &str = "aisimulate.agentic.phases.v1";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Primer,
    Warmup,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Primer => "primer",
            Phase::Warmup => "warmup",
        }
    }
}

/// One preparation request.
#[derive(Clone, Debug)]
pub struct PrepRequest {
    pub phase: Phase,
    pub lane: u32,
    pub source_request_id: Arc<str>,
    pub session: Arc<str>,
    pub turn: TurnSpec,
}

/// The preparation requests, lane by lane, in the order each lane replays them.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    pub requests: Vec<PrepRequest>,
    /// Per lane: its play id and the indices of its requests in `requests`.
    pub lanes: Vec<(Arc<str>, Vec<u32>)>,
}

/// The source nodes a lane replays before the profile: its primers, then the warmups.
pub(super) fn lane_sources(src: &AgenticGraph, play: &Play, t_star: f64) -> (Vec<u32>, Vec<u32>) {
    // The latest historical request of each conversation that has live requests (conversations
    // in name order, as the reference's ordered set walks them).
    let mut live: BTreeMap<&str, Option<u32>> = BTreeMap::new();
    for &i in &play.nodes {
        let n = &src.nodes[i as usize];
        if n.not_before_ms >= t_star {
            live.entry(&n.session_id).or_insert(None);
        }
    }
    for &i in &play.nodes {
        let n = &src.nodes[i as usize];
        if n.not_before_ms >= t_star {
            continue;
        }
        if let Some(slot) = live.get_mut(&*n.session_id) {
            if slot.is_none_or(|c| n.not_before_ms >= src.nodes[c as usize].not_before_ms) {
                *slot = Some(i);
            }
        }
    }
    let primers: Vec<u32> = live.into_values().flatten().collect();
    let sources =
        if primers.is_empty() {
            let first =
                play.nodes.iter().copied().filter(|&i| src.nodes[i as usize].not_before_ms >= t_star).min_by(
                    |&a, &b| src.nodes[a as usize].not_before_ms.total_cmp(&src.nodes[b as usize].not_before_ms),
                );
            first.into_iter().collect()
        } else {
            primers.clone()
        };
    let warmups = (0..WARMUP_REQUESTS_PER_LANE).filter_map(|k| sources.get(k % sources.len().max(1)).copied());
    (primers.clone(), warmups.collect())
}

impl Plan {
    /// Adds lane `lane`'s requests: `sources` as [`lane_sources`] gave them, their prompts in the
    /// lane's token space (`block` maps a source block to the lane's).
    pub(super) fn add_lane(
        &mut self,
        src: &AgenticGraph,
        lane: u32,
        play_id: &Arc<str>,
        root_id: Option<Arc<str>>,
        (primers, warmups): &(Vec<u32>, Vec<u32>),
        mut block: impl FnMut(u32) -> u32,
    ) {
        let mut members = Vec::new();
        let all = primers.iter().map(|&i| (Phase::Primer, i)).chain(warmups.iter().map(|&i| (Phase::Warmup, i)));
        for (ordinal, (phase, i)) in all.enumerate() {
            let n = &src.nodes[i as usize];
            let session: Arc<str> = format!("{play_id}:conversation:{}", n.session_id).into();
            let id: Arc<str> = format!("{play_id}:{}:{ordinal}", phase.name()).into();
            let mut turn = n.turn.clone();
            turn.blocks = n.turn.blocks.iter().map(|&b| block(b)).collect();
            turn.output_length = 1;
            turn.delay_ms = 0.0;
            // The reference's one token: the source's first planned token, or 0.
            turn.output_tokens =
                Some(Arc::from([n.turn.output_tokens.as_ref().and_then(|t| t.first().copied()).unwrap_or(0)]));
            if let Some(meta) = &n.turn.meta {
                let mut meta: TurnMeta = (**meta).clone();
                meta.request_id = Some(id.clone());
                if let Some(ids) = meta.agentic.as_mut() {
                    ids.request_id = id.clone();
                    ids.play_id = play_id.clone();
                    ids.conversation_id = session.clone();
                    ids.lane = Some(lane);
                    ids.root_id = root_id.clone();
                    ids.parent_id = None;
                }
                turn.meta = Some(Arc::new(meta));
            }
            members.push(self.requests.len() as u32);
            self.requests.push(PrepRequest { phase, lane, source_request_id: n.request_id.clone(), session, turn });
        }
        self.lanes.push((play_id.clone(), members));
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct PrepState {
    dispatched_ms: Option<f64>,
    terminal_ms: Option<f64>,
    completed: bool,
}

#[derive(Clone, Debug)]
struct LaneState {
    next: usize,
    in_flight: bool,
    ready_ms: f64,
}

/// What the preparation phase did, as `agentic_phases` reports it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PhaseEvidence {
    pub json: serde_json::Value,
    /// When the profile opened (the measured clock's zero), if it did.
    pub profile_start_ms: Option<f64>,
}

/// The load driver's preparation state. Preparation requests are released with ids
/// `base + index` (after the graph's nodes; a continuous profile numbers the plays it adds
/// after these).
pub struct Preparation {
    plan: Arc<AgenticGraph>,
    base: u32,
    lanes: Vec<LaneState>,
    requests: Vec<PrepState>,
    released: FxHashMap<u32, SessionSpec>,
    in_flight: u32,
    failure: Option<usize>,
    finished_ms: Option<f64>,
    opened: bool,
}

impl Preparation {
    /// `None` when the graph has no preparation to run.
    pub fn new(graph: &Arc<AgenticGraph>) -> Option<Preparation> {
        let plan = graph.preparation.as_ref()?;
        Some(Preparation {
            plan: graph.clone(),
            base: graph.nodes.len() as u32,
            lanes: plan.lanes.iter().map(|_| LaneState { next: 0, in_flight: false, ready_ms: 0.0 }).collect(),
            requests: vec![PrepState::default(); plan.requests.len()],
            released: FxHashMap::default(),
            in_flight: 0,
            failure: None,
            finished_ms: None,
            opened: false,
        })
    }

    fn plan(&self) -> &Plan {
        self.plan.preparation.as_ref().expect("a preparation has a plan")
    }

    /// Whether `id` is a preparation request's.
    pub fn owns(&self, id: u32) -> bool {
        (id as usize).checked_sub(self.base as usize).is_some_and(|k| k < self.requests.len())
    }

    /// Still preparing: the profile has not opened (and the preparation was not aborted).
    pub fn is_running(&self) -> bool {
        self.finished_ms.is_none()
    }

    pub fn next_ready_ms(&self) -> Option<f64> {
        if self.failure.is_some() || self.finished_ms.is_some() {
            return None;
        }
        let plan = self.plan();
        self.lanes
            .iter()
            .zip(&plan.lanes)
            .filter(|(l, (_, members))| !l.in_flight && l.next < members.len())
            .map(|(l, _)| l.ready_ms)
            .min_by(f64::total_cmp)
    }

    /// Releases the next request of every idle lane ready by `now`, in lane order.
    pub fn pop_ready(&mut self, now: f64, out: &mut Vec<Ready>) {
        if self.failure.is_some() || self.finished_ms.is_some() {
            return;
        }
        let graph = self.plan.clone();
        let plan = graph.preparation.as_ref().expect("a preparation has a plan");
        for (lane, (_, members)) in self.lanes.iter_mut().zip(&plan.lanes) {
            if lane.in_flight || lane.next == members.len() || lane.ready_ms > now {
                continue;
            }
            let k = members[lane.next] as usize;
            lane.next += 1;
            lane.in_flight = true;
            self.in_flight += 1;
            self.requests[k].dispatched_ms = Some(now);
            let r = &plan.requests[k];
            let id = self.base + k as u32;
            self.released.insert(
                id,
                SessionSpec { name: Some(r.session.clone()), start_ms: lane.ready_ms, turns: vec![r.turn.clone()] },
            );
            out.push(Ready { session: id, turn: 0, arrival_ms: lane.ready_ms });
        }
    }

    pub fn session(&self, id: u32) -> &SessionSpec {
        &self.released[&id]
    }

    /// A preparation request ended at `now`. Returns the profile's start when this opens it.
    pub fn on_complete(&mut self, id: u32, now: f64, completed: bool) -> Option<f64> {
        self.released.remove(&id);
        let k = (id - self.base) as usize;
        self.requests[k] = PrepState { terminal_ms: Some(now), completed, ..self.requests[k] };
        self.in_flight -= 1;
        if !completed && self.failure.is_none() {
            self.failure = Some(k);
        }
        let lane = self.plan().requests[k].lane as usize;
        self.lanes[lane].in_flight = false;
        self.lanes[lane].ready_ms = now;
        if self.in_flight > 0 || self.finished_ms.is_some() {
            return None;
        }
        if self.failure.is_some() {
            self.finished_ms = Some(now);
            return None;
        }
        let plan = self.plan();
        if self.lanes.iter().zip(&plan.lanes).all(|(l, (_, m))| l.next == m.len()) {
            self.finished_ms = Some(now);
            self.opened = true;
            return Some(now);
        }
        None
    }

    pub fn is_drained(&self) -> bool {
        self.in_flight == 0 && self.next_ready_ms().is_none()
    }

    /// `agentic_phases`, in the reference's shape (without the engine-side admission fields).
    pub fn evidence(&self) -> PhaseEvidence {
        use serde_json::json;
        let plan = self.plan();
        let phase = match (self.finished_ms, self.opened) {
            (Some(_), true) => "profile",
            (Some(_), false) => "aborted",
            (None, _) => {
                let primer_open = plan
                    .requests
                    .iter()
                    .zip(&self.requests)
                    .any(|(r, s)| r.phase == Phase::Primer && s.terminal_ms.is_none());
                if primer_open {
                    "primer"
                } else {
                    "warmup"
                }
            }
        };
        let done = |k: u32, phase: Phase| {
            let (r, s) = (&plan.requests[k as usize], &self.requests[k as usize]);
            r.phase == phase && s.completed
        };
        let lanes: Vec<_> = plan
            .lanes
            .iter()
            .enumerate()
            .map(|(lane, (play_id, members))| {
                json!({
                    "lane_id": lane,
                    "play_id": &**play_id,
                    "primers_expected": members.iter().filter(|&&k| plan.requests[k as usize].phase == Phase::Primer).count(),
                    "primers_completed": members.iter().filter(|&&k| done(k, Phase::Primer)).count(),
                    "warmup_expected": WARMUP_REQUESTS_PER_LANE,
                    "warmup_completed": members.iter().filter(|&&k| done(k, Phase::Warmup)).count(),
                    "requests_quiescent": members.iter().filter(|&&k| self.requests[k as usize].terminal_ms.is_some()).count(),
                })
            })
            .collect();
        let uuid = |k: usize| format!("80000000-0000-0000-0000-{k:012x}");
        let requests: Vec<_> = plan
            .requests
            .iter()
            .zip(&self.requests)
            .enumerate()
            .map(|(k, (r, s))| {
                let ids = r.turn.meta.as_ref().and_then(|m| m.agentic.as_ref());
                json!({
                    "uuid": uuid(k),
                    "phase": r.phase.name(),
                    "lane_id": r.lane,
                    "source_request_id": &*r.source_request_id,
                    "request_id": ids.map(|i| i.request_id.to_string()),
                    "input_length": r.turn.input_length,
                    "max_output_tokens": 1,
                    "dispatched_at_ms": s.dispatched_ms,
                    "terminal_status": s.terminal_ms.map(|_| if s.completed { "completed" } else { "rejected" }),
                    "causal_terminal_at_ms": s.terminal_ms,
                    "quiescent_at_ms": s.terminal_ms,
                    "observed_output_tokens": u32::from(s.completed),
                })
            })
            .collect();
        let profile_start_ms = self.finished_ms.filter(|_| self.opened);
        PhaseEvidence {
            json: json!({
                "schema": PHASE_SCHEMA,
                "phase": phase,
                "barrier_condition": "all_preparation_succeeded_and_server_quiescent",
                "profile_start_ms": profile_start_ms,
                "finished_at_ms": self.finished_ms,
                "failure_request_id": self.failure.map(uuid),
                "failure_reason": self.failure.map(|_| "preparation request ended with Rejected"),
                "lanes": lanes,
                "requests": requests,
            }),
            profile_start_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::snapshot::{instantiate, Selection, SnapshotOptions};
    use super::super::*;
    use super::*;

    /// One play: conversation `main` (a1 at 0, a2 at 100, a3 at 200), a sub-conversation `sub`
    /// spawned at 50 and continued at 150.
    fn graph() -> AgenticGraph {
        let header = Header {
            schema: AGENTIC_MOONCAKE_SCHEMA.into(),
            version: 2,
            block_size: 16,
            hash_id_scope: HashIdScope::Local,
            source: Provenance { format: "t".into(), digest: "d".into() },
        };
        let mut b = GraphBuilder::new(header, Vec::new(), Loc::default()).unwrap();
        let row = |id: &str, session: &str, at: f64, after: Option<&str>| AgenticRow {
            request_id: id.into(),
            play_id: "p".into(),
            session_id: session.into(),
            model: "m".into(),
            input_length: Some(32),
            output_length: Some(2),
            hash_ids: Some(vec![1, 2]),
            not_before_ms: at,
            recorded_api_time_ms: Some(10.0),
            dependencies: after
                .map(|s| RowDependency {
                    request_id: s.into(),
                    trigger: Trigger::Completion,
                    delay_ms: 0.0,
                    relation: Relation::Sequence,
                })
                .into_iter()
                .collect(),
            ..Default::default()
        };
        for r in [
            row("a1", "main", 0.0, None),
            row("b1", "sub", 50.0, Some("a1")),
            row("a2", "main", 100.0, Some("a1")),
            row("b2", "sub", 150.0, Some("b1")),
            row("a3", "main", 200.0, Some("a2")),
        ] {
            b.push(Loc::default(), r).unwrap();
        }
        b.finish(1.0).unwrap()
    }

    fn plan(t_star_ms: f64) -> Plan {
        let o = SnapshotOptions {
            seed: 1,
            initial_selections: Some(vec![Selection { source_play_id: "p".into(), t_star_ms }]),
            corpus_cursor: Some(1),
            warmup: true,
            profile: None,
        };
        instantiate(graph(), 1, &o).unwrap().preparation.unwrap()
    }

    fn sources(p: &Plan) -> Vec<(Phase, String)> {
        p.requests.iter().map(|r| (r.phase, r.source_request_id.to_string())).collect()
    }

    #[test]
    fn primers_are_the_last_requests_before_the_cut_of_continuing_conversations() {
        // Cut at 120: `main` continues (a2 is history, a3 live), and so does `sub` (b1, b2).
        let p = plan(120.0);
        let s = sources(&p);
        assert_eq!(s[..2], [(Phase::Primer, "a2".into()), (Phase::Primer, "b1".into())]);
        assert_eq!(s.len(), 2 + WARMUP_REQUESTS_PER_LANE);
        // The warmups cycle over the primers.
        assert!(s[2..].iter().enumerate().all(|(k, (ph, id))| *ph == Phase::Warmup && *id == s[k % 2].1));
        // One token each, named by phase and ordinal.
        assert!(p.requests.iter().all(|r| r.turn.output_length == 1));
        let id = |k: usize| p.requests[k].turn.meta.as_ref().unwrap().request_id.clone().unwrap();
        assert!(id(0).ends_with(":primer:0") && id(11).ends_with(":warmup:11"), "{} {}", id(0), id(11));
    }

    /// The lanes' instances are bounded before any is built: 2,000,001 lanes of this 5-request
    /// play would be 10,000,005 requests.
    #[test]
    fn snapshot_lanes_are_bounded_before_they_are_built() {
        let o =
            SnapshotOptions { seed: 1, initial_selections: None, corpus_cursor: None, warmup: false, profile: None };
        assert!(instantiate(graph(), 3, &o).is_ok());
        let e = instantiate(graph(), 2_000_001, &o).unwrap_err();
        assert!(e.contains("instantiate 10000005 requests of the corpus; at most 10000000"), "{e}");
    }

    #[test]
    fn without_history_the_warmups_repeat_the_first_live_request() {
        let s = sources(&plan(0.0));
        assert_eq!(s.len(), WARMUP_REQUESTS_PER_LANE);
        assert!(s.iter().all(|(ph, id)| *ph == Phase::Warmup && id == "a1"));
    }
}
