//! The KV router's lifecycle edges of one pass, as both drivers read them off a rank's
//! [`PassOutput`]: a request's prompt stops loading its target at its first visible token
//! ([`Edge::PrefillDone`]) and the request leaves the pool when it finishes ([`Edge::Free`]).
//!
//! The rule, Dynamo's: a prefill worker's token is its prompt's end (nobody sees it, so it is
//! always the edge); in an aggregated pool a request whose last token comes in this pass is
//! freed at that token, in token order, and gets no prefill edge before it (Dynamo handles one
//! output signal at a time, and a completed one only frees); every other finished request is
//! freed after the pass's tokens, in the order the engine finished them.
//!
//! Round-robin pools have no edges: [`PassEdges::of`] with `routed: false` yields none, but
//! still asks whether each visible token is a request's first, so a driver can count tokens
//! through the same call.

use servesim_engine::{Finished, PassOutput, Role};

/// A router lifecycle edge of one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Edge {
    /// The request's prompt is done: it no longer loads its target's prefill budget.
    PrefillDone(u64),
    /// The request left the pool.
    Free(u64),
}

impl Edge {
    pub fn request(self) -> u64 {
        match self {
            Edge::PrefillDone(id) | Edge::Free(id) => id,
        }
    }
}

/// The edges of one rank's pass, asked for token by token and finish by finish (so a driver
/// can act on each edge before it looks at the next token).
#[derive(Clone, Debug)]
pub struct PassEdges {
    role: Role,
    routed: bool,
    /// Aggregated and routed: (request, index of its last token in the pass) of each request
    /// that finished in the pass with a token in it.
    terminal: Vec<(u64, usize)>,
}

impl PassEdges {
    /// The edges of `out`, a pass of a rank in a pool of `role`; `routed` when a KV router
    /// places the pool's requests (round robin takes no edges).
    pub fn of(role: Role, routed: bool, out: &PassOutput) -> PassEdges {
        let mut terminal = Vec::new();
        if routed && role == Role::Aggregated && !out.finished.is_empty() {
            terminal.extend(
                out.finished
                    .iter()
                    .filter_map(|f| out.tokens.iter().rposition(|t| t.request == f.request).map(|i| (f.request, i))),
            );
        }
        PassEdges { role, routed, terminal }
    }

    /// The edge at the pass's token `i` (of request `request`). `first_visible` says whether
    /// the token is the first its client sees of the request; it is asked for every token
    /// except a prefill worker's, whose token nobody sees.
    pub fn at_token(&self, i: usize, request: u64, first_visible: impl FnOnce() -> bool) -> Option<Edge> {
        let edge = self.role == Role::Prefill || first_visible();
        if !self.routed {
            None
        } else if self.terminal.contains(&(request, i)) {
            Some(Edge::Free(request))
        } else {
            edge.then_some(Edge::PrefillDone(request))
        }
    }

    /// The edge of a request the pass finished, unless its last token freed it already.
    pub fn at_finish(&self, f: &Finished) -> Option<Edge> {
        (self.routed && !self.terminal.iter().any(|&(id, _)| id == f.request)).then_some(Edge::Free(f.request))
    }
}

/// Every edge of `out` in order: at the tokens, then at the finishes. `first_visible` is asked
/// as in [`PassEdges::at_token`], once per token, in token order.
pub fn router_edges(
    role: Role,
    routed: bool,
    out: &PassOutput,
    mut first_visible: impl FnMut(u64) -> bool,
) -> Vec<Edge> {
    let edges = PassEdges::of(role, routed, out);
    let mut all: Vec<Edge> = out
        .tokens
        .iter()
        .enumerate()
        .filter_map(|(i, t)| edges.at_token(i, t.request, || first_visible(t.request)))
        .collect();
    all.extend(out.finished.iter().filter_map(|f| edges.at_finish(f)));
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use servesim_engine::{Finish, TokenOut};

    fn pass(tokens: &[u64], finished: &[u64]) -> PassOutput {
        PassOutput {
            tokens: tokens.iter().map(|&request| TokenOut { request, token: 0 }).collect(),
            finished: finished.iter().map(|&request| Finished { request, finish: Finish::Completed }).collect(),
            ..PassOutput::default()
        }
    }

    #[test]
    fn a_first_token_is_the_prefill_edge_and_a_finish_frees() {
        // Request 1 shows its first token, 2 its second; 3 finishes without a token here.
        let out = pass(&[1, 2], &[3]);
        let seen = |id| id == 1;
        let edges = router_edges(Role::Decode, true, &out, seen);
        assert_eq!(edges, vec![Edge::PrefillDone(1), Edge::Free(3)]);
    }

    #[test]
    fn an_aggregated_request_whose_first_token_is_its_last_is_only_freed_there() {
        // Request 1's only token ends it; 2 goes on. The free comes at 1's token, before 2's edge.
        let out = pass(&[1, 2], &[1]);
        let edges = router_edges(Role::Aggregated, true, &out, |_| true);
        assert_eq!(edges, vec![Edge::Free(1), Edge::PrefillDone(2)]);
        // A decode pool has no terminal tokens: the first token is the edge, the finish frees.
        let edges = router_edges(Role::Decode, true, &out, |_| true);
        assert_eq!(edges, vec![Edge::PrefillDone(1), Edge::PrefillDone(2), Edge::Free(1)]);
    }

    #[test]
    fn a_prefill_token_is_always_the_edge_and_nobody_is_asked_about_it() {
        let out = pass(&[4], &[4]);
        let edges = router_edges(Role::Prefill, true, &out, |_| panic!("a prefill token is not shown"));
        assert_eq!(edges, vec![Edge::PrefillDone(4), Edge::Free(4)]);
    }

    #[test]
    fn round_robin_has_no_edges_but_every_visible_token_is_counted() {
        let out = pass(&[1, 1, 2], &[1]);
        let mut asked = Vec::new();
        let edges = router_edges(Role::Aggregated, false, &out, |id| {
            asked.push(id);
            true
        });
        assert!(edges.is_empty());
        assert_eq!(asked, vec![1, 1, 2]);
    }
}
