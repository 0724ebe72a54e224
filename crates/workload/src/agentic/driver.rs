//! Releasing the requests of an agentic graph as their dependencies fire.
//!
//! The reference's scheduling semantics (`driver.rs` of aisimulate-core):
//! * A root is ready at its `not_before_ms`; a dependent once **all** its edges have fired, at
//!   `max(not_before_ms, max(fire + delay))`, where an edge fires when its source is dispatched
//!   (`dispatch` trigger) or completes (`completion`).
//! * Ready requests are released in (ready time, graph ordinal) order; a dispatch edge with no
//!   delay releases its target in the same instant.
//! * A request that is rejected fails its play: the play's requests not yet dispatched are
//!   skipped, and the play is reported failed once its dispatched requests have ended.
//! * With lanes, plays run as a closed loop: the first N plays start at 0, and when a play ends
//!   (completed, or failed with nothing left in flight) its lane starts the next play at once,
//!   every node at `start + max(0, not_before − earliest root not_before)`.
//! * Snapshots (`snapshot`) are a graph of one play per lane, all released from 0 as without
//!   lanes; nothing follows them.
//! * Warmed snapshots first run their preparation ([`super::warmup`]); the plays start when it
//!   opens the profile, and every time reported (lifecycle, play outcomes) is measured from then.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::warmup::{PhaseEvidence, Preparation};
use super::{AgenticGraph, Trigger};
use crate::session::{Ready, SessionSpec, TurnMeta};
use crate::time::Time;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NodeState {
    Blocked,
    Ready,
    Emitted,
    Completed,
    Failed,
    Skipped,
}

struct PlayState {
    lane: Option<u32>,
    pending_terminals: u32,
    completed: u32,
    failed: bool,
    client_finished: bool,
    quiescent_at: Option<f64>,
    root_dispatch: Option<f64>,
    max_terminal: Option<f64>,
    /// (time, node) of the first failure.
    primary_failure: Option<(f64, u32)>,
}

/// How one play ended, as `agentic_play_outcomes` reports it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PlayOutcome {
    pub play_id: String,
    pub status: &'static str,
    pub causal_terminal_ms: Option<f64>,
    pub settled_at_ms: Option<f64>,
    pub failure_request_id: Option<String>,
    pub failure_status: Option<&'static str>,
}

/// What the driver saw of the graph's execution.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AgenticOutcome {
    pub trajectory_e2e_ms: Vec<f64>,
    pub plays: Vec<PlayOutcome>,
    pub lifecycle_events: u64,
    pub lifecycle_digest: String,
    /// Warmed snapshots: what the preparation did.
    pub phases: Option<PhaseEvidence>,
}

const LIFECYCLE_SCHEMA: &str = "aisimulate.agentic.lifecycle.v1";

pub struct GraphState {
    graph: Arc<AgenticGraph>,
    state: Vec<NodeState>,
    remaining: Vec<u32>,
    ready_after: Vec<f64>,
    /// Edges by source: (first index into `edges`, count) per node and trigger.
    dispatch_out: Vec<Vec<(u32, f64)>>,
    completion_out: Vec<Vec<(u32, f64)>>,
    plays: Vec<PlayState>,
    lanes: Vec<Option<u32>>,
    next_pending_play: usize,
    ready: BinaryHeap<Reverse<(Time, u32)>>,
    /// Released requests until they end.
    released: FxHashMap<u32, SessionSpec>,
    in_flight: u32,
    lifecycle: blake3::Hasher,
    lifecycle_count: u64,
    /// Requests that ended at `pending_at`, applied together in graph order (as the reference
    /// applies one timestamp's feedback: causal terminals by graph ordinal, then quiescence).
    pending: Vec<(u32, bool)>,
    pending_at: f64,
    /// Scratch buffer of a lifecycle line.
    line: Vec<u8>,
    /// Warmed snapshots: the preparation phase, and the instant the profile opened (the zero of
    /// every time reported), told once to the caller ([`GraphState::take_profile_start`]).
    preparation: Option<Preparation>,
    origin_ms: f64,
    profile_start: Option<f64>,
}

impl GraphState {
    pub fn new(graph: Arc<AgenticGraph>) -> GraphState {
        let n = graph.nodes.len();
        let mut dispatch_out = vec![Vec::new(); n];
        let mut completion_out = vec![Vec::new(); n];
        for (i, node) in graph.nodes.iter().enumerate() {
            for e in &node.deps {
                let out = match e.trigger {
                    Trigger::Dispatch => &mut dispatch_out[e.source as usize],
                    Trigger::Completion => &mut completion_out[e.source as usize],
                };
                out.push((i as u32, e.delay_ms));
            }
        }
        let plays = graph
            .plays
            .iter()
            .map(|_| PlayState {
                lane: None,
                pending_terminals: 0,
                completed: 0,
                failed: false,
                client_finished: false,
                quiescent_at: None,
                root_dispatch: None,
                max_terminal: None,
                primary_failure: None,
            })
            .collect();
        let mut lifecycle = blake3::Hasher::new();
        lifecycle.update(b"aisimulate-agentic-lifecycle-v1\0");
        let mut s = GraphState {
            state: vec![NodeState::Blocked; n],
            remaining: graph.nodes.iter().map(|node| node.deps.len() as u32).collect(),
            ready_after: graph.nodes.iter().map(|node| node.not_before_ms).collect(),
            dispatch_out,
            completion_out,
            plays,
            lanes: Vec::new(),
            next_pending_play: 0,
            ready: BinaryHeap::new(),
            released: FxHashMap::default(),
            in_flight: 0,
            lifecycle,
            lifecycle_count: 0,
            pending: Vec::new(),
            pending_at: 0.0,
            line: Vec::with_capacity(256),
            preparation: Preparation::new(&graph),
            origin_ms: 0.0,
            profile_start: None,
            graph,
        };
        if s.preparation.is_some() {
            return s; // the plays start when the preparation opens the profile
        }
        if s.graph.snapshot.is_some() {
            // One snapshot instance per lane, all started at 0 (`snapshot::instantiate`, which
            // also labels their requests with the lane): their trajectories are measured from
            // there, and no play follows them on their lanes.
            for p in 0..s.graph.plays.len() {
                s.plays[p].root_dispatch = Some(0.0);
                for r in 0..s.graph.plays[p].roots.len() {
                    let root = s.graph.plays[p].roots[r];
                    s.schedule(root, s.ready_after[root as usize]);
                }
            }
            return s;
        }
        match s.graph.lanes {
            None => {
                for p in 0..s.graph.plays.len() {
                    for r in 0..s.graph.plays[p].roots.len() {
                        let root = s.graph.plays[p].roots[r];
                        s.schedule(root, s.ready_after[root as usize]);
                    }
                }
            }
            Some(lanes) => {
                // Lanes past the plays never run one (a freed lane takes the next play), so
                // only the first ones are kept.
                let first = (lanes as usize).min(s.graph.plays.len());
                s.lanes = vec![None; first];
                s.next_pending_play = first;
                for p in 0..first {
                    s.plays[p].lane = Some(p as u32);
                    s.lanes[p] = Some(p as u32);
                }
                for p in 0..first {
                    s.activate_play(p, 0.0);
                }
            }
        }
        s
    }

    /// The preparation ended at `now` with every request completed: the snapshot plays start.
    fn open_profile(&mut self, now: f64) {
        self.origin_ms = now;
        self.profile_start = Some(now);
        for t in &mut self.ready_after {
            *t += now;
        }
        for p in 0..self.graph.plays.len() {
            self.plays[p].root_dispatch = Some(now);
            for r in 0..self.graph.plays[p].roots.len() {
                let root = self.graph.plays[p].roots[r];
                self.schedule(root, self.ready_after[root as usize]);
            }
        }
    }

    /// Whether a preparation phase runs before the measured profile.
    pub fn has_preparation(&self) -> bool {
        self.preparation.is_some()
    }

    /// The instant the profile opened, once (the caller restarts its measurements there).
    pub fn take_profile_start(&mut self) -> Option<f64> {
        self.profile_start.take()
    }

    fn activate_play(&mut self, p: usize, start: f64) {
        let graph = self.graph.clone();
        let play = &graph.plays[p];
        let root_nb = play.roots.iter().map(|&r| graph.nodes[r as usize].not_before_ms).fold(f64::INFINITY, f64::min);
        for &i in &play.nodes {
            self.ready_after[i as usize] = start + (graph.nodes[i as usize].not_before_ms - root_nb).max(0.0);
        }
        for &r in &play.roots {
            self.schedule(r, self.ready_after[r as usize]);
        }
    }

    fn schedule(&mut self, node: u32, at: f64) {
        if self.state[node as usize] != NodeState::Blocked {
            return;
        }
        self.state[node as usize] = NodeState::Ready;
        self.ready.push(Reverse((Time(at), node)));
    }

    fn release_edges(&mut self, source: u32, trigger: Trigger, now: f64) {
        let edges = match trigger {
            Trigger::Dispatch => std::mem::take(&mut self.dispatch_out[source as usize]),
            Trigger::Completion => std::mem::take(&mut self.completion_out[source as usize]),
        };
        for &(target, delay) in &edges {
            let t = target as usize;
            if self.state[t] != NodeState::Blocked {
                continue;
            }
            self.remaining[t] -= 1;
            self.ready_after[t] = self.ready_after[t].max(now + delay);
            if self.remaining[t] == 0 {
                self.schedule(target, self.ready_after[t]);
            }
        }
    }

    fn record(&mut self, at_ms: f64, play: usize, node: Option<u32>, event: &str, status: Option<&str>) {
        // One JSON line, written as the reference's serde serialisation writes it.
        let line = &mut self.line;
        line.clear();
        line.extend_from_slice(b"{\"schema\":\"");
        line.extend_from_slice(LIFECYCLE_SCHEMA.as_bytes());
        line.extend_from_slice(b"\",\"ordinal\":");
        line.extend_from_slice(self.lifecycle_count.to_string().as_bytes());
        line.extend_from_slice(b",\"at_ms\":");
        let _ = serde_json::to_writer(&mut *line, &(at_ms - self.origin_ms));
        line.extend_from_slice(b",\"play_id\":");
        let _ = serde_json::to_writer(&mut *line, &*self.graph.plays[play].id);
        if let Some(n) = node {
            line.extend_from_slice(b",\"request_id\":");
            let _ = serde_json::to_writer(&mut *line, &*self.graph.nodes[n as usize].request_id);
        }
        line.extend_from_slice(b",\"event\":\"");
        line.extend_from_slice(event.as_bytes());
        line.push(b'"');
        if let Some(s) = status {
            line.extend_from_slice(b",\"status\":\"");
            line.extend_from_slice(s.as_bytes());
            line.push(b'"');
        }
        line.extend_from_slice(b"}\n");
        self.lifecycle.update(line);
        self.lifecycle_count += 1;
    }

    pub fn next_ready_ms(&self) -> Option<f64> {
        if let Some(p) = self.preparation.as_ref().filter(|p| p.is_running()) {
            return p.next_ready_ms();
        }
        let ready = self.ready.peek().map(|Reverse((t, _))| t.0);
        if self.pending.is_empty() {
            return ready;
        }
        Some(ready.map_or(self.pending_at, |r| r.min(self.pending_at)))
    }

    /// Releases every request ready at or before `now` (dispatch edges may release more).
    pub fn pop_ready(&mut self, now: f64, out: &mut Vec<Ready>) {
        if let Some(p) = self.preparation.as_mut().filter(|p| p.is_running()) {
            p.pop_ready(now, out);
            return;
        }
        self.flush();
        while let Some(&Reverse((Time(t), node))) = self.ready.peek() {
            if t > now {
                break;
            }
            self.ready.pop();
            if self.state[node as usize] != NodeState::Ready {
                continue; // skipped after its play failed
            }
            self.state[node as usize] = NodeState::Emitted;
            let p = self.graph.nodes[node as usize].play as usize;
            let play = &mut self.plays[p];
            play.pending_terminals += 1;
            if self.graph.plays[p].roots.contains(&node) {
                play.root_dispatch = Some(play.root_dispatch.map_or(now, |s: f64| s.min(now)));
            }
            self.record(now, p, Some(node), "dispatch", None);
            self.in_flight += 1;
            self.released.insert(node, self.spec(node, t));
            out.push(Ready { session: node, turn: 0, arrival_ms: t });
            self.release_edges(node, Trigger::Dispatch, now);
        }
    }

    fn spec(&self, node: u32, ready_at: f64) -> SessionSpec {
        let n = &self.graph.nodes[node as usize];
        let mut turn = n.turn.clone();
        if let Some(lane) = self.plays[n.play as usize].lane {
            if let Some(meta) = &turn.meta {
                let mut meta: TurnMeta = (**meta).clone();
                if let Some(ids) = meta.agentic.as_mut() {
                    ids.lane = Some(lane);
                }
                turn.meta = Some(Arc::new(meta));
            }
        }
        SessionSpec { name: Some(n.session_id.clone()), start_ms: ready_at, turns: vec![turn] }
    }

    pub fn session(&self, node: u32) -> &SessionSpec {
        match &self.preparation {
            Some(p) if p.owns(node) => p.session(node),
            _ => &self.released[&node],
        }
    }

    /// A released request ended at `now`, completed or not (applied with the others that end
    /// at the same instant, before the next release).
    pub fn on_complete(&mut self, node: u32, now: f64, completed: bool) {
        if let Some(p) = self.preparation.as_mut().filter(|p| p.owns(node)) {
            if let Some(start) = p.on_complete(node, now, completed) {
                self.open_profile(start);
            }
            return;
        }
        self.released.remove(&node);
        if !self.pending.is_empty() && self.pending_at != now {
            self.flush();
        }
        self.pending_at = now;
        self.pending.push((node, completed));
    }

    fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let mut batch = std::mem::take(&mut self.pending);
        batch.sort_unstable();
        let now = self.pending_at;
        for &(node, completed) in &batch {
            self.terminal(node, now, completed);
        }
        for &(node, _) in &batch {
            self.quiescent(node, now);
        }
    }

    fn terminal(&mut self, node: u32, now: f64, completed: bool) {
        self.in_flight -= 1;
        let p = self.graph.nodes[node as usize].play as usize;
        let status = if completed { "completed" } else { "rejected" };
        self.record(now, p, Some(node), "causal_terminal", Some(status));
        let was_failed = self.plays[p].failed;
        {
            let play = &mut self.plays[p];
            play.pending_terminals -= 1;
            play.max_terminal = Some(play.max_terminal.map_or(now, |m: f64| m.max(now)));
        }
        if completed {
            self.state[node as usize] = NodeState::Completed;
            self.plays[p].completed += 1;
            if !was_failed {
                self.release_edges(node, Trigger::Completion, now);
            }
        } else {
            self.state[node as usize] = NodeState::Failed;
            let play = &mut self.plays[p];
            play.failed = true;
            if play.primary_failure.is_none_or(|(t, n)| (now, node) < (t, n)) {
                play.primary_failure = Some((now, node));
            }
            if !was_failed {
                let graph = self.graph.clone();
                for &i in &graph.plays[p].nodes {
                    if matches!(self.state[i as usize], NodeState::Blocked | NodeState::Ready) {
                        self.state[i as usize] = NodeState::Skipped;
                        self.record(now, p, Some(i), "skipped", None);
                    }
                }
            }
        }
        let play = &self.plays[p];
        let all_completed = !play.failed && play.completed as usize == self.graph.plays[p].nodes.len();
        let ended = (all_completed || play.failed) && play.pending_terminals == 0;
        if ended && !play.client_finished {
            self.plays[p].client_finished = true;
            if let Some(lane) = self.plays[p].lane {
                self.lanes[lane as usize] = None;
                if self.next_pending_play < self.graph.plays.len() {
                    let next = self.next_pending_play;
                    self.next_pending_play += 1;
                    self.lanes[lane as usize] = Some(next as u32);
                    self.plays[next].lane = Some(lane);
                    self.activate_play(next, now);
                }
            }
        }
    }

    /// Aggregated replay: the request leaves the system as it ends.
    fn quiescent(&mut self, node: u32, now: f64) {
        let p = self.graph.nodes[node as usize].play as usize;
        self.record(now, p, Some(node), "quiescent", None);
        let play = &mut self.plays[p];
        if play.quiescent_at.is_none() && play.client_finished && play.pending_terminals == 0 {
            play.quiescent_at = Some(now);
            self.record(now, p, None, "play_quiescent", None);
        }
    }

    pub fn is_drained(&self) -> bool {
        self.preparation.as_ref().is_none_or(Preparation::is_drained)
            && self.pending.is_empty()
            && self.in_flight == 0
            && !self.ready.iter().any(|Reverse((_, n))| self.state[*n as usize] == NodeState::Ready)
    }

    fn outcome(&self) -> AgenticOutcome {
        let mut e2e = Vec::new();
        let plays = self
            .plays
            .iter()
            .enumerate()
            .map(|(p, s)| {
                let complete = !s.failed && s.completed as usize == self.graph.plays[p].nodes.len();
                if complete {
                    if let (Some(a), Some(b)) = (s.root_dispatch, s.max_terminal) {
                        e2e.push(b - a);
                    }
                }
                let status = if s.quiescent_at.is_none() {
                    "incomplete"
                } else if s.failed {
                    "failed"
                } else {
                    "completed"
                };
                PlayOutcome {
                    play_id: self.graph.plays[p].id.to_string(),
                    status,
                    causal_terminal_ms: s
                        .primary_failure
                        .map(|(t, _)| t)
                        .or(s.max_terminal)
                        .map(|t| t - self.origin_ms),
                    settled_at_ms: s.quiescent_at.map(|t| t - self.origin_ms),
                    failure_request_id: s
                        .primary_failure
                        .map(|(_, n)| self.graph.nodes[n as usize].request_id.to_string()),
                    failure_status: s.primary_failure.map(|_| "rejected"),
                }
            })
            .collect();
        AgenticOutcome {
            trajectory_e2e_ms: e2e,
            plays,
            lifecycle_events: self.lifecycle_count,
            lifecycle_digest: self.lifecycle.finalize().to_hex().to_string(),
            phases: self.preparation.as_ref().map(Preparation::evidence),
        }
    }
}

impl Drop for GraphState {
    fn drop(&mut self) {
        self.flush();
        let outcome = self.outcome();
        if let Ok(mut slot) = self.graph.outcome.lock() {
            *slot = Some(outcome);
        }
    }
}
