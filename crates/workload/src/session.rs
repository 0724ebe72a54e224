//! What every workload source lowers to: sessions of turns, each turn one request at
//! trace-block level, and the request the load driver releases. A leaf: the sources
//! ([`crate::formats`], [`crate::synthetic`], [`crate::agentic`]) and the driver import it, it
//! imports none of them.

use std::sync::Arc;

use servesim_engine::Prompt;

/// What a trace says about a request besides its prompt and lengths: its ids (reported per
/// request) and its router policy class.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TurnMeta {
    /// `request_id` from the trace.
    pub request_id: Option<Arc<str>>,
    /// `policy_class` from the trace (carried, not reported, as in the reference).
    pub policy_class: Option<Arc<str>>,
    /// Agentic inputs: the request's place in its play.
    pub agentic: Option<AgenticIds>,
}

/// One request as the workload describes it, at trace-block level.
#[derive(Clone, Debug)]
pub struct TurnSpec {
    pub input_length: u32,
    pub output_length: u32,
    /// Prompt content: block `i` is `block_tokens` copies of token `blocks[i]`, truncated to
    /// `input_length` tokens.
    pub blocks: Arc<[u32]>,
    /// Think time after the previous turn completes (0 for the first turn).
    pub delay_ms: f64,
    /// Router queue priority: like arriving this many seconds earlier (negative counts as 0).
    pub priority: i32,
    /// Router queue tier, compared before anything else (higher first).
    pub strict_priority: u32,
    /// Exact output token ids (`output_token_ids`), one per output token.
    pub output_tokens: Option<Arc<[u32]>>,
    /// Ids and policy class, when the trace gives them.
    pub meta: Option<Arc<TurnMeta>>,
}

impl TurnSpec {
    /// The prompt: block `i` is `block_tokens` copies of `blocks[i]`, cut at `input_length`.
    pub fn prompt(&self, block_tokens: u32) -> Prompt {
        Prompt::Runs { run: block_tokens, ids: self.blocks.clone(), len: self.input_length }
    }
}

#[derive(Clone, Debug)]
pub struct SessionSpec {
    /// `session_id` from the trace or a generated name, reported as the records' `session_id`;
    /// `None` for a request that is not part of a session (a trace row without `session_id`, a
    /// one-turn synthetic request): Dynamo reports `null` for its `session_id` and `turn_index`.
    pub name: Option<Arc<str>>,
    /// First arrival (trace timestamp, ms).
    pub start_ms: f64,
    pub turns: Vec<TurnSpec>,
}

/// The agentic identity of a request, as per-request records report it.
#[derive(Clone, Debug, PartialEq)]
pub struct AgenticIds {
    /// Graph ordinal (position in `request_id` order); the record's uuid is this + 1.
    pub node: u32,
    pub request_id: Arc<str>,
    pub play_id: Arc<str>,
    pub conversation_id: Arc<str>,
    pub lane: Option<u32>,
    pub root_id: Option<Arc<str>>,
    pub parent_id: Option<Arc<str>>,
}

/// A request the driver releases.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ready {
    pub session: u32,
    pub turn: u32,
    pub arrival_ms: f64,
}
