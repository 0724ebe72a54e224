//! The workload: what to replay, as one of its sources (sessions read from a trace, a trace
//! streamed from its files, synthetic load, an agentic graph), and the dispatch over them that
//! the load driver takes its sessions from.
//!
//! A workload is a list of sessions. A session is an ordered list of turns (requests); turn
//! `k + 1` becomes ready `delay` ms after turn `k` completes (closed loop), while different
//! sessions run independently. A request that is not part of a multi-turn conversation is a
//! one-turn session.

use std::borrow::Cow;
use std::sync::Arc;

use crate::agentic::AgenticGraph;
use crate::error::InputError;
use crate::formats::mooncake::StreamedTrace;
use crate::session::SessionSpec;
use crate::synthetic::SyntheticSpec;

/// What to replay: sessions read from a trace, a trace streamed from its files, or a synthetic
/// load generated as it is needed. Streamed and synthetic runs of any length hold only the
/// sessions in flight.
#[derive(Clone, Debug)]
pub enum Workload {
    Trace {
        sessions: Vec<SessionSpec>,
        /// Tokens each prompt block stands for.
        block_tokens: u32,
    },
    Streamed(StreamedTrace),
    Synthetic(SyntheticSpec),
    /// Multi-turn sessions whose rows hold only each turn's new tokens (`mooncake-delta`; a
    /// [`SyntheticSpec`] with `accumulate` generates such sessions too):
    /// a turn's prompt is everything the session said and generated before, plus its tokens.
    /// Every turn has planned output tokens (they are part of the next prompt).
    Accumulating {
        sessions: Vec<SessionSpec>,
        block_tokens: u32,
    },
    /// An agentic dependency graph.
    Graph(Arc<AgenticGraph>),
}

impl Workload {
    /// Tokens each prompt block stands for.
    pub fn block_tokens(&self) -> u32 {
        match self {
            Workload::Trace { block_tokens, .. } | Workload::Accumulating { block_tokens, .. } => *block_tokens,
            Workload::Streamed(trace) => trace.block_tokens(),
            Workload::Synthetic(spec) => spec.unit_tokens(),
            Workload::Graph(g) => g.block_tokens,
        }
    }

    pub fn num_requests(&self) -> u64 {
        match self {
            Workload::Trace { sessions, .. } | Workload::Accumulating { sessions, .. } => {
                sessions.iter().map(|s| s.turns.len() as u64).sum()
            }
            Workload::Streamed(trace) => trace.num_requests(),
            Workload::Synthetic(spec) => spec.sessions as u64 * spec.turns_per_session as u64,
            Workload::Graph(g) => g.num_requests(),
        }
    }

    /// A continuous agentic profile: the run ends at the profile's own deadlines, and its
    /// control events (refills, idle caps, the cutoff) come between passes.
    pub fn is_profile(&self) -> bool {
        matches!(self, Workload::Graph(g) if g.profile.is_some())
    }

    /// No session has a second turn (so nothing is released in response to a completion).
    pub fn single_turn(&self) -> bool {
        match self {
            Workload::Trace { sessions, .. } => sessions.iter().all(|s| s.turns.len() <= 1),
            Workload::Accumulating { sessions, .. } => sessions.iter().all(|s| s.turns.len() <= 1),
            Workload::Streamed(_) => true,
            Workload::Synthetic(spec) => spec.turns_per_session <= 1,
            // Completions release dependents.
            Workload::Graph(g) => g.nodes.iter().all(|n| n.deps.is_empty()) && g.lanes.is_none(),
        }
    }

    /// Why a streamed trace ended early: a file changed or vanished after it was validated.
    /// The replay then covers the requests read before the error.
    pub fn take_error(&self) -> Option<InputError> {
        match self {
            Workload::Streamed(trace) => trace.take_error(),
            _ => None,
        }
    }

    /// A turn's prompt is its session's history followed by the turn's own tokens.
    pub fn accumulates(&self) -> bool {
        match self {
            Workload::Accumulating { .. } => true,
            Workload::Synthetic(spec) => spec.accumulate,
            _ => false,
        }
    }

    /// The sessions in the order they start (by first arrival, ties in trace order).
    pub(crate) fn stream(&self) -> SessionStream<'_> {
        match self {
            Workload::Graph(_) => SessionStream::Trace { sessions: &[], order: Vec::new(), next: 0 },
            Workload::Trace { sessions, .. } | Workload::Accumulating { sessions, .. } => {
                let mut order: Vec<u32> = (0..sessions.len() as u32).collect();
                order.sort_by(|&a, &b| sessions[a as usize].start_ms.total_cmp(&sessions[b as usize].start_ms));
                SessionStream::Trace { sessions, order, next: 0 }
            }
            Workload::Streamed(trace) => {
                let mut generator: Box<dyn Iterator<Item = SessionSpec>> = Box::new(trace.sessions_iter());
                SessionStream::Generated { head: generator.next(), generator }
            }
            Workload::Synthetic(spec) => {
                let mut generator: Box<dyn Iterator<Item = SessionSpec>> = Box::new(spec.sessions_iter());
                SessionStream::Generated { head: generator.next(), generator }
            }
        }
    }
}

/// The sessions of a workload in the order they start.
pub(crate) enum SessionStream<'w> {
    Trace {
        sessions: &'w [SessionSpec],
        order: Vec<u32>,
        next: usize,
    },
    /// `head` is the next session, generated (or read) one step ahead so its start can be
    /// looked at.
    Generated {
        generator: Box<dyn Iterator<Item = SessionSpec>>,
        head: Option<SessionSpec>,
    },
}

impl<'w> SessionStream<'w> {
    pub(crate) fn peek_start(&self) -> Option<f64> {
        match self {
            SessionStream::Trace { sessions, order, next } => order.get(*next).map(|&i| sessions[i as usize].start_ms),
            SessionStream::Generated { head, .. } => head.as_ref().map(|s| s.start_ms),
        }
    }

    pub(crate) fn next(&mut self) -> Option<Cow<'w, SessionSpec>> {
        match self {
            SessionStream::Trace { sessions, order, next } => {
                let i = *order.get(*next)?;
                *next += 1;
                Some(Cow::Borrowed(&sessions[i as usize]))
            }
            SessionStream::Generated { generator, head } => std::mem::replace(head, generator.next()).map(Cow::Owned),
        }
    }
}
