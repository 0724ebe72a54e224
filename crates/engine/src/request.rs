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
