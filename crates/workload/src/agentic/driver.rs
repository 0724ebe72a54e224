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
//! * A continuous profile ([`super::profile`]) opens with the snapshots: at every instant, once
//!   the responses of the instant are in, it refills the lanes whose play has ended (lane order;
//!   the corpus play at the cursor, whole, as the lane's next ordinal), then shifts the pending
//!   timers of trees idle for the tree cap and, after the global cap with nothing in flight, of
//!   every lane. At the admission cutoff what was not issued is censored; requests still in
//!   flight at the response-grace deadline are cancelled and the run ends there.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::profile::{self, IdleShift, PlayCounts, ProfileState};
use super::snapshot::{build_instance, recorded_span, Slot};
use super::warmup::{PhaseEvidence, Preparation};
use super::{AgenticGraph, Node, Play, Trigger};
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
    /// Not issued before a profile's admission cutoff.
    Censored,
}

/// How a released request ended for the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum End {
    Completed,
    Rejected,
    /// Still in flight at a profile's response-grace deadline.
    Canceled,
}

impl End {
    fn name(self) -> &'static str {
        match self {
            End::Completed => "completed",
            End::Rejected => "rejected",
            End::Canceled => "canceled",
        }
    }
}

struct PlayState {
    lane: Option<u32>,
    pending_terminals: u32,
    /// Released requests the server has not let go of yet.
    emitted_in_flight: u32,
    /// Requests scheduled to be released (a profile's idle caps shift them).
    timers: u32,
    /// A profile's cutoff censored some of its requests.
    censored: bool,
    completed: u32,
    failed: bool,
    client_finished: bool,
    quiescent_at: Option<f64>,
    root_dispatch: Option<f64>,
    max_terminal: Option<f64>,
    /// (time, node, how) of the first failure.
    primary_failure: Option<(f64, u32, End)>,
}

impl PlayState {
    fn new(lane: Option<u32>, root_dispatch: Option<f64>) -> PlayState {
        PlayState {
            lane,
            pending_terminals: 0,
            emitted_in_flight: 0,
            timers: 0,
            censored: false,
            completed: 0,
            failed: false,
            client_finished: false,
            quiescent_at: None,
            root_dispatch,
            max_terminal: None,
            primary_failure: None,
        }
    }
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
    /// A continuous profile: its `agentic_profile` report.
    pub profile: Option<serde_json::Value>,
}

const LIFECYCLE_SCHEMA: &str = "aisimulate.agentic.lifecycle.v1";

/// The earliest a node may be released, before its dependencies fire. In a continuous
/// profile only a play's roots keep their recorded start: a request that depends on another
/// goes as soon as its dependencies have fired (the reference's profile, probed: the
/// dependent of a request that completes 400 ms before the dependent's recorded start is
/// released at the completion plus the edge's delay).
fn gate(node: &Node, profile: bool) -> f64 {
    if profile && !node.deps.is_empty() {
        0.0
    } else {
        node.not_before_ms
    }
}

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
    pending: Vec<(u32, End)>,
    pending_at: f64,
    /// Scratch buffer of a lifecycle line.
    line: Vec<u8>,
    /// Warmed snapshots: the preparation phase, and the instant the profile opened (the zero of
    /// every time reported), told once to the caller ([`GraphState::take_profile_start`]).
    preparation: Option<Preparation>,
    origin_ms: f64,
    profile_start: Option<f64>,
    /// A continuous profile: its state, and the plays (with their requests) it added to the
    /// graph's, numbered after them.
    profile: Option<ProfileState>,
    extra_nodes: Vec<Node>,
    extra_plays: Vec<Play>,
    /// The id of the first added node: after the graph's, and after the ids a warmed
    /// profile's preparation releases its requests with.
    extra_base: usize,
    /// Cancelled requests the server still holds.
    settling: u32,
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
        let plays = graph.plays.iter().map(|_| PlayState::new(None, None)).collect();
        let profile =
            graph.profile.as_ref().map(|c| ProfileState::new(c, graph.plays.len(), graph.plays.len(), n as u64));
        let mut lifecycle = blake3::Hasher::new();
        lifecycle.update(b"aisimulate-agentic-lifecycle-v1\0");
        let mut s = GraphState {
            state: vec![NodeState::Blocked; n],
            remaining: graph.nodes.iter().map(|node| node.deps.len() as u32).collect(),
            ready_after: graph.nodes.iter().map(|node| gate(node, graph.profile.is_some())).collect(),
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
            profile,
            extra_nodes: Vec::new(),
            extra_plays: Vec::new(),
            extra_base: n + graph
                .preparation
                .as_ref()
                .filter(|_| graph.profile.is_some())
                .map_or(0, |p| p.requests.len()),
            settling: 0,
            graph,
        };
        // Node ids index the state: the preparation's ids are never nodes of the graph.
        for _ in n..s.extra_base {
            s.state.push(NodeState::Completed);
            s.remaining.push(0);
            s.ready_after.push(0.0);
            s.dispatch_out.push(Vec::new());
            s.completion_out.push(Vec::new());
        }
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
            if let Some(p) = s.profile.as_mut() {
                p.open(0.0);
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
        if let Some(p) = self.profile.as_mut() {
            p.open(now);
        }
    }

    /// Node `i`: the graph's, or one a profile added.
    fn node(&self, i: u32) -> &Node {
        match (i as usize).checked_sub(self.extra_base) {
            Some(k) => &self.extra_nodes[k],
            None => &self.graph.nodes[i as usize],
        }
    }

    /// Play `p`: the graph's, or one a profile added.
    fn play(&self, p: usize) -> &Play {
        match p.checked_sub(self.graph.plays.len()) {
            Some(k) => &self.extra_plays[k],
            None => &self.graph.plays[p],
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
        let p = self.node(node).play as usize;
        self.plays[p].timers += 1;
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
        // The play's id, and the request's id as its row wrote it (a snapshot instance's
        // source row): the reference's lifecycle names the authored request.
        let play_id = self.play(play).id.clone();
        let request_id = node.map(|n| {
            let n = self.node(n);
            n.source_request_id.clone().unwrap_or_else(|| n.request_id.clone())
        });
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
        let _ = serde_json::to_writer(&mut *line, &*play_id);
        if let Some(id) = request_id {
            line.extend_from_slice(b",\"request_id\":");
            let _ = serde_json::to_writer(&mut *line, &*id);
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
        let mut next = self.ready.peek().map(|Reverse((t, _))| t.0);
        if !self.pending.is_empty() {
            next = Some(next.map_or(self.pending_at, |r| r.min(self.pending_at)));
        }
        match self.profile_control_ms() {
            Some(c) => Some(next.map_or(c, |n| n.min(c))),
            None => next,
        }
    }

    /// Releases every request ready at or before `now` (dispatch edges may release more).
    pub fn pop_ready(&mut self, now: f64, out: &mut Vec<Ready>) {
        if let Some(p) = self.preparation.as_mut().filter(|p| p.is_running()) {
            p.pop_ready(now, out);
            return;
        }
        self.flush();
        if self.profile.as_ref().is_some_and(|p| p.start_ms.is_some()) {
            self.advance_profile(now);
            if self.profile.as_ref().is_some_and(|p| p.cutoff) {
                return; // nothing is issued from the admission cutoff on
            }
        }
        while let Some(&Reverse((Time(t), node))) = self.ready.peek() {
            if t > now {
                break;
            }
            self.ready.pop();
            // Skipped after its play failed, or moved earlier by an idle cap.
            if self.state[node as usize] != NodeState::Ready || t != self.ready_after[node as usize] {
                continue;
            }
            self.state[node as usize] = NodeState::Emitted;
            let p = self.node(node).play as usize;
            let is_root = self.play(p).roots.contains(&node);
            let play = &mut self.plays[p];
            play.pending_terminals += 1;
            play.emitted_in_flight += 1;
            play.timers -= 1;
            if is_root {
                play.root_dispatch = Some(play.root_dispatch.map_or(now, |s: f64| s.min(now)));
            }
            if let Some(profile) = self.profile.as_mut() {
                profile.issued_requests += 1;
                profile.first_request_ms.get_or_insert(now);
                profile.global_idle_since_ms = None;
                profile.tree_idle_since_ms[p] = None;
            }
            self.record(now, p, Some(node), "dispatch", None);
            self.in_flight += 1;
            self.released.insert(node, self.spec(node, t));
            out.push(Ready { session: node, turn: 0, arrival_ms: t });
            self.release_edges(node, Trigger::Dispatch, now);
        }
    }

    fn spec(&self, node: u32, ready_at: f64) -> SessionSpec {
        let n = self.node(node);
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
        self.pending.push((node, if completed { End::Completed } else { End::Rejected }));
    }

    fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let mut batch = std::mem::take(&mut self.pending);
        batch.sort_unstable();
        let now = self.pending_at;
        for &(node, end) in &batch {
            self.terminal(node, now, end);
        }
        for &(node, _) in &batch {
            self.quiescent(node, now);
        }
    }

    fn terminal(&mut self, node: u32, now: f64, end: End) {
        self.in_flight -= 1;
        let p = self.node(node).play as usize;
        self.record(now, p, Some(node), "causal_terminal", Some(end.name()));
        let was_failed = self.plays[p].failed;
        {
            let play = &mut self.plays[p];
            play.pending_terminals -= 1;
            play.max_terminal = Some(play.max_terminal.map_or(now, |m: f64| m.max(now)));
        }
        if end == End::Completed {
            self.state[node as usize] = NodeState::Completed;
            self.plays[p].completed += 1;
            if !was_failed {
                self.release_edges(node, Trigger::Completion, now);
            }
        } else {
            self.state[node as usize] = NodeState::Failed;
            let play = &mut self.plays[p];
            play.failed = true;
            if play.primary_failure.is_none_or(|(t, n, _)| (now, node) < (t, n)) {
                play.primary_failure = Some((now, node, end));
            }
            if !was_failed {
                let members = self.play(p).nodes.clone();
                for i in members {
                    let was = self.state[i as usize];
                    if matches!(was, NodeState::Blocked | NodeState::Ready) {
                        self.state[i as usize] = NodeState::Skipped;
                        if was == NodeState::Ready {
                            self.plays[p].timers -= 1;
                        }
                        self.record(now, p, Some(i), "skipped", None);
                    }
                }
            }
        }
        let play = &self.plays[p];
        let all_completed = !play.failed && play.completed as usize == self.play(p).nodes.len();
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
        let in_flight = self.in_flight;
        if let Some(profile) = self.profile.as_mut() {
            if self.plays[p].pending_terminals == 0 {
                profile.tree_idle_since_ms[p] = Some(now);
                if profile.cutoff {
                    self.plays[p].client_finished = true;
                }
            }
            if in_flight == 0 {
                profile.global_idle_since_ms = Some(now);
            }
            match end {
                End::Completed => {
                    profile.successful_responses += 1;
                    profile.last_successful_response_ms = Some(now);
                }
                End::Canceled => profile.canceled_requests += 1,
                End::Rejected => {}
            }
            if profile.cutoff {
                self.finish_play_if_quiescent(p, now);
            }
        }
    }

    /// Aggregated replay: the request leaves the system as it ends.
    fn quiescent(&mut self, node: u32, now: f64) {
        let p = self.node(node).play as usize;
        self.record(now, p, Some(node), "quiescent", None);
        self.plays[p].emitted_in_flight -= 1;
        self.finish_play_if_quiescent(p, now);
    }

    /// A play settles once the client is done with it and the server holds none of its
    /// requests (a profile's cutoff may retire a play after its last request settled).
    fn finish_play_if_quiescent(&mut self, p: usize, now: f64) {
        let play = &mut self.plays[p];
        if play.quiescent_at.is_none()
            && play.client_finished
            && play.pending_terminals == 0
            && play.emitted_in_flight == 0
        {
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

    /// A profile's control events at `now`, after the instant's responses and before its
    /// releases: the cutoff, the lanes' refills, the idle caps.
    fn advance_profile(&mut self, now: f64) {
        let Some(profile) = self.profile.as_mut() else { return };
        let (cutoff, _, _) = profile.deadlines().expect("an open profile has deadlines");
        profile.last_advanced_ms = now;
        if now >= cutoff {
            if profile.cutoff {
                return;
            }
            profile.cutoff = true;
            let mut censored = 0;
            for i in 0..self.state.len() {
                if matches!(self.state[i], NodeState::Blocked | NodeState::Ready) {
                    self.state[i] = NodeState::Censored;
                    let p = self.node(i as u32).play as usize;
                    self.plays[p].censored = true;
                    censored += 1;
                }
            }
            for p in 0..self.plays.len() {
                self.plays[p].timers = 0;
                if self.plays[p].pending_terminals == 0 {
                    self.plays[p].client_finished = true;
                    self.finish_play_if_quiescent(p, now);
                }
            }
            self.ready.clear();
            if let Some(profile) = self.profile.as_mut() {
                profile.never_issued_requests += censored;
            }
            return;
        }
        let mut progressed = false;
        let lanes = self.profile.as_ref().map_or(0, |p| p.active_plays.len());
        // Lane order, so that simultaneous refills take the corpus in a fixed order.
        for lane in 0..lanes {
            let p = self.profile.as_ref().map_or(0, |pr| pr.active_plays[lane]);
            if self.plays[p].client_finished {
                self.refill(lane, now);
                progressed = true;
            }
        }
        let Some(profile) = self.profile.as_ref() else { return };
        let (tree_cap, global_cap) =
            (profile.options.tree_idle_cap_seconds * 1000.0, profile.options.global_idle_cap_seconds * 1000.0);
        let global = profile.global_idle_since_ms;
        for lane in 0..lanes {
            let Some(profile) = self.profile.as_ref() else { return };
            let p = profile.active_plays[lane];
            if profile.tree_idle_since_ms[p].is_some_and(|t| now >= t + tree_cap) {
                progressed |= self.shift_timers(Some(p), now);
            }
        }
        if global.is_some_and(|t| now >= t + global_cap) {
            progressed |= self.shift_timers(None, now);
        }
        if let Some(profile) = self.profile.as_mut() {
            profile.idle_at_last_advance = !progressed;
        }
    }

    /// Lane `lane`'s play has ended: it starts the corpus play at the cursor, whole, now.
    fn refill(&mut self, lane: usize, now: f64) {
        let graph = self.graph.clone();
        let corpus = graph.profile.as_ref().expect("a profile has a corpus");
        let src = &corpus.src;
        let lanes = graph.plays.len();
        let profile = self.profile.as_mut().expect("a profile refills");
        if profile.error.is_some() {
            return;
        }
        let count = match profile.replacements {
            (Some(t), n) if t == now => n + 1,
            _ => 1,
        };
        // Each corpus cycle may occupy one more lane with future work; more refills than a
        // cycle per lane at one instant never end.
        if count > (src.plays.len() as u64).saturating_mul(lanes as u64) {
            profile.error = Some(format!(
                "agentic profile repeated a corpus cycle for every lane without virtual-time progress at {now} ms"
            ));
            return;
        }
        let source = (profile.cursor % src.plays.len() as u64) as usize;
        let ordinal = profile.next_ordinals[lane];
        let size = src.plays[source].nodes.len() as u64;
        if profile.instantiated + size > profile.max_requests {
            profile.error = Some(format!(
                "the agentic profile's plays would instantiate more than {} requests of the corpus \
                 (lower agentic_profile.duration_seconds or agentic_lanes)",
                profile.max_requests
            ));
            return;
        }
        let at = Slot {
            seed: graph.snapshot.as_ref().map_or(0, |s| s.seed),
            lane,
            ordinal,
            slot: ordinal.saturating_mul(lanes as u64).saturating_add(lane as u64),
        };
        let (first, _) = recorded_span(src, &src.plays[source]);
        let base = self.state.len() as u32;
        // Every instance has a token space of its own.
        let mut next_block = profile.next_block;
        let mut ids = rustc_hash::FxHashMap::default();
        let instance = build_instance(src, &at, source, first, base, &mut |b| {
            *ids.entry(b).or_insert_with(|| {
                next_block += 1;
                next_block - 1
            })
        });
        let instance = match instance {
            Ok(i) => i,
            Err(e) => {
                profile.error = Some(e);
                return;
            }
        };
        let p = self.plays.len();
        profile.next_block = next_block;
        profile.instantiated += size;
        profile.cursor += 1;
        profile.next_ordinals[lane] = ordinal + 1;
        profile.replacements = (Some(now), count);
        let retired = std::mem::replace(&mut profile.active_plays[lane], p);
        profile.tree_idle_since_ms.push(Some(now));
        // The retired play's requests are done with (none is in flight): their prompts can go,
        // so that a long profile holds the prompts of the lanes' current plays only.
        if let Some(k) = retired.checked_sub(graph.plays.len()) {
            let base = self.extra_base;
            for &i in &self.extra_plays[k].nodes {
                let turn = &mut self.extra_nodes[i as usize - base].turn;
                turn.blocks = Arc::from([]);
                turn.output_tokens = None;
            }
        }
        for node in instance.nodes {
            let node = Node { play: p as u32, ..node };
            self.state.push(NodeState::Blocked);
            self.remaining.push(node.deps.len() as u32);
            self.ready_after.push(now + gate(&node, true));
            self.dispatch_out.push(Vec::new());
            self.completion_out.push(Vec::new());
            self.extra_nodes.push(node);
        }
        for k in 0..instance.play.nodes.len() {
            let i = instance.play.nodes[k] as usize;
            for e in self.node(i as u32).deps.clone() {
                let out = match e.trigger {
                    Trigger::Dispatch => &mut self.dispatch_out[e.source as usize],
                    Trigger::Completion => &mut self.completion_out[e.source as usize],
                };
                out.push((i as u32, e.delay_ms));
            }
        }
        self.plays.push(PlayState::new(None, Some(now)));
        let roots = instance.play.roots.clone();
        self.extra_plays.push(instance.play);
        for r in roots {
            self.schedule(r, self.ready_after[r as usize]);
        }
    }

    /// Moves the pending timers of play `only` (every active play when `None`) earlier, so
    /// that the first fires now, keeping their spacing. Whether any moved.
    fn shift_timers(&mut self, only: Option<usize>, now: f64) -> bool {
        let profile = self.profile.as_ref().expect("a profile shifts timers");
        let mut pending = Vec::new();
        for &p in profile.active_plays.iter().filter(|&&p| only.is_none_or(|o| o == p)) {
            if self.plays[p].timers == 0 {
                continue;
            }
            for &i in &self.play(p).nodes {
                if self.state[i as usize] == NodeState::Ready {
                    pending.push((i, self.ready_after[i as usize]));
                }
            }
        }
        let Some(first) = pending.iter().map(|&(_, t)| t).min_by(f64::total_cmp) else {
            return false;
        };
        let shift = first - now;
        if shift <= 0.0 {
            return false;
        }
        for &(i, t) in &pending {
            let shifted = now + (t - first);
            self.ready_after[i as usize] = shifted;
            self.ready.push(Reverse((Time(shifted), i)));
        }
        let play_id = only.map(|p| self.play(p).id.to_string());
        if let Some(profile) = self.profile.as_mut() {
            profile.idle_shifts.push(IdleShift {
                at_ms: now,
                play_id,
                shifted_by_ms: shift,
                timer_count: pending.len(),
            });
        }
        true
    }

    /// When the profile next has something to do: a lane to refill, an idle cap to apply, the
    /// admission cutoff, or, after it, the response-grace deadline of requests still in flight.
    fn profile_control_ms(&self) -> Option<f64> {
        let profile = self.profile.as_ref()?;
        let (cutoff, grace, _) = profile.deadlines()?;
        if profile.error.is_some() || profile.finished_at_ms.is_some() {
            return None;
        }
        if profile.cutoff {
            return (self.in_flight > 0).then_some(grace);
        }
        let last = profile.last_advanced_ms;
        // A control time already spent at the last advance, which changed nothing, is not one.
        let due = |t: f64| {
            let t = t.max(last);
            (t > last || !profile.idle_at_last_advance).then_some(t)
        };
        let finished = profile
            .active_plays
            .iter()
            .filter(|&&p| self.plays[p].client_finished)
            .map(|&p| self.plays[p].max_terminal.unwrap_or(last))
            .min_by(f64::total_cmp);
        if let Some(t) = finished {
            return Some(t.max(last));
        }
        let mut next = cutoff;
        let tree_cap = profile.options.tree_idle_cap_seconds * 1000.0;
        let global_cap = profile.options.global_idle_cap_seconds * 1000.0;
        let mut any_timer = false;
        for &p in &profile.active_plays {
            if self.plays[p].timers == 0 {
                continue;
            }
            any_timer = true;
            if let Some(t) = profile.tree_idle_since_ms[p].and_then(|t| due(t + tree_cap)) {
                next = next.min(t);
            }
        }
        if any_timer {
            if let Some(t) = profile.global_idle_since_ms.and_then(|t| due(t + global_cap)) {
                next = next.min(t);
            }
        }
        Some(next)
    }

    /// A profile has ended at `now`: past the cutoff with nothing in flight, or at the
    /// response-grace deadline, where the requests still in flight are cancelled (the server
    /// keeps them; the run ends there). Once.
    pub fn profile_finished(&mut self, now: f64) -> bool {
        let Some(profile) = self.profile.as_ref() else { return false };
        if profile.finished_at_ms.is_some() || !profile.cutoff {
            return false;
        }
        let (_, grace, _) = profile.deadlines().expect("a cut profile has deadlines");
        if self.in_flight > 0 && now < grace {
            return false;
        }
        self.flush();
        let mut open: Vec<u32> = self.released.keys().copied().collect();
        open.sort_unstable();
        for node in open {
            self.released.remove(&node);
            self.terminal(node, now, End::Canceled);
            self.settling += 1;
        }
        if let Some(profile) = self.profile.as_mut() {
            profile.finished_at_ms = Some(now);
        }
        true
    }

    /// A continuous profile's observation window: from its first issued request to its last
    /// successful response (the reference's `duration_ms` of a profile).
    pub fn observation_ms(&self) -> Option<f64> {
        let p = self.profile.as_ref()?;
        p.first_request_ms.zip(p.last_successful_response_ms).map(|(a, b)| (b - a).max(0.0))
    }

    /// Why a profile cannot go on, if it cannot.
    pub fn error(&self) -> Option<&str> {
        self.profile.as_ref().and_then(|p| p.error.as_deref())
    }

    fn outcome(&self) -> AgenticOutcome {
        let mut e2e = Vec::new();
        let plays = self
            .plays
            .iter()
            .enumerate()
            .map(|(p, s)| {
                let complete = !s.failed && s.completed as usize == self.play(p).nodes.len();
                if complete {
                    if let (Some(a), Some(b)) = (s.root_dispatch, s.max_terminal) {
                        e2e.push(b - a);
                    }
                }
                let status = if s.quiescent_at.is_none() || s.censored {
                    "incomplete"
                } else if s.failed {
                    "failed"
                } else {
                    "completed"
                };
                let authored = |n: u32| {
                    let n = self.node(n);
                    n.source_request_id.as_deref().unwrap_or(&n.request_id).to_string()
                };
                PlayOutcome {
                    play_id: self.play(p).id.to_string(),
                    status,
                    causal_terminal_ms: s
                        .primary_failure
                        .map(|(t, _, _)| t)
                        .or(s.max_terminal)
                        .map(|t| t - self.origin_ms),
                    settled_at_ms: s.quiescent_at.map(|t| t - self.origin_ms),
                    failure_request_id: s.primary_failure.map(|(_, n, _)| authored(n)),
                    failure_status: s.primary_failure.map(|(_, _, end)| end.name()),
                }
            })
            .collect();
        let profile = self.profile.as_ref().map(|p| {
            let counts = PlayCounts {
                started: self.plays.len(),
                client_completed: self.plays.iter().filter(|s| s.client_finished && !s.censored).count(),
                retired: self.plays.iter().filter(|s| s.client_finished).count(),
                server_quiescent: self.plays.iter().filter(|s| s.quiescent_at.is_some()).count(),
                client_in_flight: self.in_flight as usize,
                server_settling: self.settling as usize,
            };
            profile::report(p, &counts)
        });
        AgenticOutcome {
            trajectory_e2e_ms: e2e,
            plays,
            lifecycle_events: self.lifecycle_count,
            lifecycle_digest: self.lifecycle.finalize().to_hex().to_string(),
            phases: self.preparation.as_ref().map(Preparation::evidence),
            profile,
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

#[cfg(test)]
mod tests {
    use super::super::profile::ProfileOptions;
    use super::super::snapshot::{instantiate, Selection, SnapshotOptions};
    use super::super::*;
    use super::*;

    /// Two plays of two requests each (`x2` follows `x1`'s completion after `delay_ms`).
    fn corpus(delay_ms: f64) -> AgenticGraph {
        let header = Header {
            schema: AGENTIC_MOONCAKE_SCHEMA.into(),
            version: 2,
            block_size: 16,
            hash_id_scope: HashIdScope::Local,
            source: Provenance { format: "t".into(), digest: "d".into() },
        };
        let mut b = GraphBuilder::new(header, Vec::new(), Loc::default()).unwrap();
        let row = |id: &str, play: &str, at: f64, after: Option<&str>| AgenticRow {
            request_id: id.into(),
            play_id: play.into(),
            session_id: play.into(),
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
                    delay_ms,
                    relation: Relation::Sequence,
                })
                .into_iter()
                .collect(),
            ..Default::default()
        };
        for r in [
            row("a1", "p", 0.0, None),
            row("a2", "p", 500.0, Some("a1")),
            row("b1", "q", 0.0, None),
            row("b2", "q", 500.0, Some("b1")),
        ] {
            b.push(Loc::default(), r).unwrap();
        }
        b.finish(1.0).unwrap()
    }

    fn profile(o: ProfileOptions, delay_ms: f64, max_requests: u64) -> GraphState {
        let snap = SnapshotOptions {
            seed: 1,
            initial_selections: Some(vec![
                Selection { source_play_id: "p".into(), t_star_ms: 0.0 },
                Selection { source_play_id: "q".into(), t_star_ms: 0.0 },
            ]),
            corpus_cursor: Some(2),
            warmup: false,
            profile: Some(o),
        };
        let mut g = instantiate(corpus(delay_ms), 2, &snap).unwrap();
        g.profile.as_mut().unwrap().max_requests = max_requests;
        GraphState::new(Arc::new(g))
    }

    /// Runs the driver with every request taking `latency_ms`, until the profile ends or fails.
    fn run(g: &mut GraphState, latency_ms: f64) -> Result<f64, String> {
        let mut in_flight: Vec<(f64, u32)> = Vec::new();
        let mut out = Vec::new();
        for _ in 0..100_000 {
            let next_done = in_flight.iter().map(|&(t, _)| t).fold(f64::INFINITY, f64::min);
            let now = g.next_ready_ms().unwrap_or(f64::INFINITY).min(next_done);
            assert!(now.is_finite(), "the profile stalled");
            for &(_, n) in in_flight.iter().filter(|&&(t, _)| t <= now) {
                g.on_complete(n, now, true);
            }
            in_flight.retain(|&(t, _)| t > now);
            out.clear();
            g.pop_ready(now, &mut out);
            in_flight.extend(out.iter().map(|r| (now + latency_ms, r.session)));
            if let Some(e) = g.error() {
                return Err(e.to_string());
            }
            if g.profile_finished(now) {
                return Ok(now);
            }
        }
        panic!("the profile never ended");
    }

    #[test]
    fn lanes_refill_until_the_cutoff_then_in_flight_requests_are_cancelled() {
        let o = ProfileOptions { duration_seconds: 1.0, response_grace_seconds: 0.01, ..ProfileOptions::default() };
        let mut g = profile(o, 10.0, 1000);
        // Each play: x1 at its start (110 ms), x2 10 ms after (the recorded 500 ms gate does not
        // hold in a profile), 110 ms: a play every 230 ms per lane. At the 1000 ms cutoff both
        // lanes' fifth play has x1 in flight (920 to 1030 ms), cancelled at the 1010 ms deadline,
        // and x2 not issued.
        assert_eq!(run(&mut g, 110.0), Ok(1010.0));
        let report = g.outcome().profile.unwrap();
        assert_eq!(report["plays_started"], 10);
        assert_eq!(report["issued_requests"], 18);
        assert_eq!(report["successful_responses"], 16);
        assert_eq!(report["canceled_requests"], 2);
        assert_eq!(report["never_issued_requests"], 2);
        assert_eq!(report["corpus_cursor"], 10);
        assert_eq!(report["client_completed_plays"], 8);
        assert_eq!(report["retired_plays"], 10);
        assert_eq!(report["server_quiescent_plays"], 8);
        assert_eq!(report["unsettled_server_requests"], 2);
        assert_eq!(report["finished_at_ms"], 1010.0);
        let outcome = g.outcome();
        let last = outcome.plays.last().unwrap();
        assert_eq!((last.status, last.failure_status), ("incomplete", Some("canceled")));
        // The failure names the request as its row wrote it.
        assert_eq!(last.failure_request_id.as_deref(), Some("b1"));
    }

    #[test]
    fn plays_that_end_at_once_cannot_refill_forever() {
        let mut g = profile(ProfileOptions::default(), 0.0, 1000);
        let e = run(&mut g, 0.0).unwrap_err();
        assert!(e.contains("repeated a corpus cycle for every lane without virtual-time progress"), "{e}");
    }

    #[test]
    fn the_requests_a_profile_instantiates_are_bounded() {
        let mut g = profile(ProfileOptions::default(), 10.0, 20);
        let e = run(&mut g, 100.0).unwrap_err();
        assert!(e.contains("would instantiate more than 20 requests"), "{e}");
    }
}
