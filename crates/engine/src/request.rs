//! What a request looks like to the engine: its prompt, how many tokens it may generate, and
//! how its generated token ids are chosen.

use std::sync::Arc;

use crate::hash::{local_block_hash, BlockHashes};

/// The prompt of a request.
///
/// Trace-derived prompts are kept at trace-block level (`Runs`): each trace hash id stands for
/// `run` copies of the token `id as u32`, so a 100k-token prompt costs a few hundred bytes and
/// its block hashes are computed once per run instead of once per token.
#[derive(Clone, Debug)]
pub enum Prompt {
    Tokens(Arc<[u32]>),
    Runs { run: u32, ids: Arc<[u32]>, len: u32 },
}

impl Prompt {
    pub fn len(&self) -> u32 {
        match self {
            Prompt::Tokens(t) => t.len() as u32,
            Prompt::Runs { len, .. } => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Token at position `pos` (< len).
    pub fn token(&self, pos: u32) -> u32 {
        match self {
            Prompt::Tokens(t) => t[pos as usize],
            Prompt::Runs { run, ids, .. } => ids[(pos / run) as usize],
        }
    }

    /// Writes the tokens at `start..start + out.len()` (all < len) into `out`.
    pub fn fill(&self, start: u32, out: &mut [u32]) {
        match self {
            Prompt::Tokens(t) => out.copy_from_slice(&t[start as usize..start as usize + out.len()]),
            Prompt::Runs { .. } => {
                for (i, slot) in out.iter_mut().enumerate() {
                    *slot = self.token(start + i as u32);
                }
            }
        }
    }

    /// Hashes of the prompt's full blocks at `block_size`.
    pub fn block_hashes(&self, block_size: u32) -> BlockHashes {
        match self {
            Prompt::Tokens(t) => BlockHashes::of_tokens(t, block_size as usize),
            Prompt::Runs { run, ids, len } => {
                let full = len / block_size;
                let mut out =
                    BlockHashes { local: Vec::with_capacity(full as usize), seq: Vec::with_capacity(full as usize) };
                let mut scratch = vec![0u32; block_size as usize];
                // A block inside one run is `block_size` copies of one token: its local hash
                // depends only on that token, so consecutive blocks of a run reuse it.
                let mut memo: Option<(u32, u64)> = None;
                for b in 0..full {
                    let start = b * block_size;
                    let end = start + block_size - 1;
                    let local = if start / run == end / run {
                        let token = ids[(start / run) as usize];
                        match memo {
                            Some((t, h)) if t == token => h,
                            _ => {
                                scratch.fill(token);
                                let h = local_block_hash(&scratch);
                                memo = Some((token, h));
                                h
                            }
                        }
                    } else {
                        self.fill(start, &mut scratch);
                        local_block_hash(&scratch)
                    };
                    out.push_local(local);
                }
                out
            }
        }
    }
}

/// A request handed to an engine.
#[derive(Clone, Debug)]
pub struct EngineRequest {
    /// Caller-chosen identity, echoed in every output.
    pub id: u64,
    pub prompt: Prompt,
    /// Tokens to generate (the request completes after exactly this many unless
    /// `max_model_len` stops it earlier).
    pub max_output: u32,
    /// Seed of this request's generated token ids (see [`output_token`]).
    pub token_seed: u64,
    /// Block hashes of the prompt at the engine's block size, if the caller already has them
    /// (a router computes them too); computed by the engine otherwise.
    pub hashes: Option<BlockHashes>,
    /// Exact output token ids to emit (a trace's `output_token_ids`); their number is the
    /// request's output length.
    pub planned_output: Option<Arc<[u32]>>,
}

impl EngineRequest {
    /// A request with generated (not planned) output.
    pub fn new(id: u64, prompt: Prompt, max_output: u32, token_seed: u64) -> Self {
        EngineRequest { id, prompt, max_output, token_seed, hashes: None, planned_output: None }
    }

    /// Output length: the planned tokens' count when there are some.
    pub(crate) fn output_len(&self) -> u32 {
        self.planned_output.as_ref().map_or(self.max_output, |p| p.len() as u32)
    }

    /// Output length (see [`EngineRequest::output_len`]) and how its tokens are chosen.
    pub(crate) fn output_plan(&self, reasoning: Option<&ReasoningConfig>) -> (u32, OutputPlan) {
        let len = self.output_len();
        (len, OutputPlan::new(self.token_seed, self.planned_output.clone(), reasoning, len))
    }
}

/// Reasoning ("thinking") tokens wrapped around the start of every output.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReasoningConfig {
    pub start_thinking_token_id: u32,
    pub end_thinking_token_id: u32,
    /// Share of the output spent thinking, in [0, 1].
    pub thinking_ratio: f64,
}

impl ReasoningConfig {
    /// Thinking tokens (both boundaries included) of an output of `max_output` tokens: none
    /// below 2 tokens or when the share rounds down to 0, else at least 2 and at most all.
    pub fn thinking_tokens(&self, max_output: u32) -> u32 {
        if max_output < 2 {
            return 0;
        }
        let raw = (max_output as f64 * self.thinking_ratio).floor() as u32;
        if raw == 0 {
            0
        } else {
            raw.clamp(2, max_output)
        }
    }
}

/// How the output tokens of one request are chosen: planned ids if the request has them,
/// otherwise the thinking boundaries (when reasoning is on) and a fixed function of the seed.
#[derive(Clone, Debug)]
pub struct OutputPlan {
    seed: u64,
    planned: Option<Arc<[u32]>>,
    /// (thinking tokens, start id, end id)
    thinking: Option<(u32, u32, u32)>,
    /// Ids that generated tokens are drawn from (None: any `u32`).
    vocabulary: Option<Arc<[u32]>>,
}

impl OutputPlan {
    pub fn new(seed: u64, planned: Option<Arc<[u32]>>, reasoning: Option<&ReasoningConfig>, max_output: u32) -> Self {
        let thinking = match (&planned, reasoning) {
            (None, Some(r)) => {
                let n = r.thinking_tokens(max_output);
                (n > 0).then_some((n, r.start_thinking_token_id, r.end_thinking_token_id))
            }
            _ => None,
        };
        OutputPlan { seed, planned, thinking, vocabulary: None }
    }

    /// Draws generated tokens from `vocabulary` (planned and thinking-boundary ids are kept as
    /// they are). An empty list is ignored.
    pub fn with_vocabulary(mut self, vocabulary: Option<Arc<[u32]>>) -> Self {
        self.vocabulary = vocabulary.filter(|v| !v.is_empty());
        self
    }

    /// The `index`-th output token.
    pub fn token(&self, index: u32) -> u32 {
        if let Some(p) = &self.planned {
            return p[index as usize];
        }
        if let Some((n, start, end)) = self.thinking {
            if index == 0 {
                return start;
            }
            if index == n - 1 {
                return end;
            }
        }
        let raw = output_token(self.seed, index);
        match &self.vocabulary {
            // Multiply-shift maps the 32-bit draw onto the list without a division.
            Some(v) => v[((raw as u64 * v.len() as u64) >> 32) as usize],
            None => raw,
        }
    }
}

/// The id of the `index`-th generated token of a request: a fixed function of the request's
/// token seed, so a run is reproducible without storing generated tokens.
pub fn output_token(token_seed: u64, index: u32) -> u32 {
    let mut z = token_seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thinking_token_counts() {
        let r = |ratio| ReasoningConfig { start_thinking_token_id: 1, end_thinking_token_id: 2, thinking_ratio: ratio };
        assert_eq!(r(0.3).thinking_tokens(100), 30);
        assert_eq!(r(0.3).thinking_tokens(1), 0);
        assert_eq!(r(0.1).thinking_tokens(10), 2, "raw 1 is raised to 2");
        assert_eq!(r(0.05).thinking_tokens(5), 0);
        assert_eq!(r(1.0).thinking_tokens(7), 7);
    }

    #[test]
    fn thinking_boundaries_sit_at_the_edges_of_the_span() {
        const S: u32 = 151667;
        const E: u32 = 151668;
        let cfg =
            |ratio| ReasoningConfig { start_thinking_token_id: S, end_thinking_token_id: E, thinking_ratio: ratio };
        let marks = |ratio: f64, n: u32| -> String {
            let plan = OutputPlan::new(9, None, Some(&cfg(ratio)), n);
            (0..n)
                .map(|i| match plan.token(i) {
                    S => 'S',
                    E => 'E',
                    _ => 'r',
                })
                .collect()
        };
        assert_eq!(marks(0.6, 10), "SrrrrErrrr");
        assert_eq!(marks(0.1, 10), "SErrrrrrrr");
        assert_eq!(marks(0.05, 10), "rrrrrrrrrr");
        assert_eq!(marks(0.5, 1), "r");
        assert_eq!(marks(1.0, 10), "SrrrrrrrrE");
        // Planned tokens win over reasoning.
        let plan = OutputPlan::new(9, Some(vec![5, 6, 7].into()), Some(&cfg(1.0)), 3);
        assert_eq!((0..3).map(|i| plan.token(i)).collect::<Vec<_>>(), vec![5, 6, 7]);
    }

    #[test]
    fn generated_tokens_come_from_the_vocabulary() {
        let vocab: Arc<[u32]> = vec![100, 200, 300].into();
        let r = ReasoningConfig { start_thinking_token_id: 7, end_thinking_token_id: 8, thinking_ratio: 0.5 };
        let plan = OutputPlan::new(3, None, Some(&r), 40).with_vocabulary(Some(vocab));
        let ids: Vec<u32> = (0..40).map(|i| plan.token(i)).collect();
        assert_eq!((ids[0], ids[19]), (7, 8), "thinking boundaries are kept");
        let drawn: Vec<u32> = ids.iter().enumerate().filter(|(i, _)| *i != 0 && *i != 19).map(|(_, &t)| t).collect();
        assert!(drawn.iter().all(|t| [100, 200, 300].contains(t)), "{drawn:?}");
        for t in [100, 200, 300] {
            assert!(drawn.contains(&t), "{t} never drawn in {drawn:?}");
        }
        // Same seed, same tokens; planned ids are never remapped.
        let again = OutputPlan::new(3, None, Some(&r), 40).with_vocabulary(Some(vec![100, 200, 300].into()));
        assert_eq!((0..40).map(|i| again.token(i)).collect::<Vec<_>>(), ids);
        let planned = OutputPlan::new(3, Some(vec![5, 6].into()), None, 2).with_vocabulary(Some(vec![1].into()));
        assert_eq!((planned.token(0), planned.token(1)), (5, 6));
    }

    fn expand(prompt: &Prompt) -> Vec<u32> {
        let mut v = vec![0; prompt.len() as usize];
        prompt.fill(0, &mut v);
        v
    }

    #[test]
    fn runs_expand_like_the_trace_loader() {
        let p = Prompt::Runs { run: 4, ids: vec![7, 9, 11].into(), len: 10 };
        assert_eq!(expand(&p), vec![7, 7, 7, 7, 9, 9, 9, 9, 11, 11]);
    }

    #[test]
    fn run_hashes_equal_token_hashes() {
        // Aligned runs (fast path) and runs that straddle blocks (slow path).
        for (run, bs) in [(512, 64), (8, 4), (6, 4), (3, 16)] {
            let p = Prompt::Runs { run, ids: vec![5, 6, 5, 8, 1, 2, 3, 4, 9, 9].into(), len: run * 9 + 1 };
            let tokens = expand(&p);
            assert_eq!(p.block_hashes(bs), BlockHashes::of_tokens(&tokens, bs as usize), "run {run} bs {bs}");
        }
    }
}
