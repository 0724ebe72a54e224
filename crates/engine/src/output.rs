//! What one forward pass reports back to its driver.

use crate::timing::{DecodeShape, PrefillShape};

/// One block made visible in the prefix cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredBlock {
    /// Sequence (chained) hash: the block's identity.
    pub hash: u64,
    /// Local hash of the block's tokens alone.
    pub local: u64,
}

/// Changes to the set of cached blocks, in the form Dynamo's KV router consumes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvEvent {
    /// Consecutive blocks of one sequence became visible; `parent` is the sequence hash of the
    /// block before the first of them.
    Stored { parent: Option<u64>, blocks: Vec<StoredBlock> },
    /// The last resident copies of these hashes were evicted.
    Removed { hashes: Vec<u64> },
}

/// A change in which blocks a rank's host (G2) cache holds, as Dynamo 1.6.1 publishes it to
/// the router in `HostPinned`-tier KV events: blocks become resident when their store to host
/// memory completes and leave when the host cache evicts them. Blocks are named by sequence
/// hash, in the order the tier handled them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostKvEvent {
    Stored { hashes: Vec<u64> },
    Removed { hashes: Vec<u64> },
}

/// A generated token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenOut {
    pub request: u64,
    pub token: u32,
}

/// Why a request was refused without running to completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RejectReason {
    /// Its KV footprint exceeds the whole cache.
    ExceedsKvCapacity,
    /// The prompt is at least `max_model_len` tokens.
    ExceedsMaxModelLen,
    /// Chunked prefill is off and the prompt is larger than the per-pass token budget.
    ExceedsBatchBudget,
    /// SGLang: a prompt chunk is larger than `max_prefill_tokens`, so no pass can take it.
    ExceedsPrefillBudget,
    /// SGLang: a lone running request cannot grow because the rest of the cache is held by
    /// requests that are partially prefilled or waiting for a KV transfer (SGLang itself stops
    /// making progress here).
    KvHeldElsewhere,
}

impl RejectReason {
    pub fn describe(self) -> &'static str {
        match self {
            RejectReason::ExceedsKvCapacity => "needs more KV blocks than the cache has",
            RejectReason::ExceedsMaxModelLen => "prompt is not shorter than max_model_len",
            RejectReason::ExceedsBatchBudget => "prompt exceeds max_num_batched_tokens with chunked prefill off",
            RejectReason::ExceedsPrefillBudget => "prompt chunk exceeds sglang.max_prefill_tokens",
            RejectReason::KvHeldElsewhere => {
                "KV cache ran out while it decoded: the rest is held by partially prefilled or transferring requests"
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    Completed,
    Rejected(RejectReason),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Finished {
    pub request: u64,
    pub finish: Finish,
}

/// A request moved from the waiting queue into the running batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Admission {
    pub request: u64,
    /// Tokens served from the prefix cache.
    pub reused_tokens: u32,
    /// Whether the request had been preempted before.
    pub readmission: bool,
    /// With a host cache, at the first admission: the reused tokens found on the device and
    /// those loaded from the host.
    pub tiers: Option<(u32, u32)>,
}

/// Decode-only passes run in one go: every listed request generated one token in each pass,
/// the passes ending at `ends`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stretch {
    pub requests: Vec<u64>,
    pub ends: Vec<f64>,
}

impl Stretch {
    pub fn clear(&mut self) {
        self.requests.clear();
        self.ends.clear();
    }
}

/// What waits in an engine's queues (the planner's `queued_requests`): prompts not yet started,
/// and decodes that cannot run yet (preempted requests, transferred prompts waiting for pages).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct QueueLoad {
    pub prefill_requests: u32,
    /// Σ prompt length of the waiting prompts.
    pub prefill_tokens: u64,
    pub decode_requests: u32,
    /// Σ KV tokens of the waiting decodes.
    pub decode_kv_tokens: u64,
}

/// Everything that happened in one pass. Tokens and completions are stamped at `end_ms`;
/// admissions happened at `start_ms`.
#[derive(Clone, Debug, Default)]
pub struct PassOutput {
    pub start_ms: f64,
    pub end_ms: f64,
    /// Generated tokens, in the order the requests decoded.
    pub tokens: Vec<TokenOut>,
    /// Requests that left the engine (after their last token, if any).
    pub finished: Vec<Finished>,
    pub admissions: Vec<Admission>,
    /// SGLang host loop: when this pass's batch, and so its admissions, was formed (`None`: at
    /// `start_ms`; the loop forms a batch while the pass before it runs).
    pub formed_ms: Option<f64>,
    /// SGLang host loop: requests its scheduler received from its inbox in this pass, at
    /// `start_ms` (a pass boundary).
    pub received: Vec<u64>,
    /// Requests preempted (sent back to the waiting queue) in this pass.
    pub preempted: Vec<u64>,
    /// KV cache changes (empty unless the engine records them).
    pub kv_events: Vec<KvEvent>,
    /// Host (G2) cache residency changes, recorded with `kv_events` when the rank has a host
    /// cache.
    pub host_kv_events: Vec<HostKvEvent>,
    /// With [`crate::Engine::set_record_block_tokens`]: the token ids of every block in this
    /// pass's `Stored` events, in event order, `block_size` per block.
    pub stored_tokens: Vec<u32>,
    pub prefill: PrefillShape,
    pub decode: DecodeShape,
    /// Prompt tokens computed in this pass.
    pub prefill_tokens: u64,
    /// Every token computed in this pass: prompt chunks, generated tokens recomputed after a
    /// preemption (a pass of only those takes no time but is progress), decode inputs.
    pub computed_tokens: u64,
    /// Decode forwards (requests past their first token that generated) and the tokens they
    /// produced: more tokens than forwards means speculative drafts were accepted.
    pub decode_forwards: u32,
    pub decode_tokens: u32,
}

impl PassOutput {
    pub fn clear(&mut self) {
        self.tokens.clear();
        self.finished.clear();
        self.admissions.clear();
        self.formed_ms = None;
        self.received.clear();
        self.preempted.clear();
        self.kv_events.clear();
        self.host_kv_events.clear();
        self.stored_tokens.clear();
        self.prefill = PrefillShape::default();
        self.decode = DecodeShape::default();
        self.prefill_tokens = 0;
        self.computed_tokens = 0;
        self.decode_forwards = 0;
        self.decode_tokens = 0;
    }

    /// Whether the pass did anything at all.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
            && self.finished.is_empty()
            && self.admissions.is_empty()
            && self.preempted.is_empty()
            && self.prefill_tokens == 0
            && self.computed_tokens == 0
    }
}
