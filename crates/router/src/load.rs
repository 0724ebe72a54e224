//! Load the router has placed on each target and not yet seen finish: prompt tokens waiting
//! for prefill and KV blocks held by live requests.
//!
//! Lifecycle edges: [`ActiveLoad::add`] when a request is placed, [`ActiveLoad::prefill_done`]
//! at its first token, [`ActiveLoad::free`] when it completes.
//!
//! Pending prompt tokens count in full, except that with a prefill load model the **oldest**
//! pending prompt of a target (its anchor) decays linearly over its predicted prefill time,
//! counted from when it became the anchor: `ceil(tokens × max(0, 1 − elapsed / predicted))`.
//! When the anchor's prefill finishes, the next oldest becomes the anchor at that moment;
//! prompts placed behind it keep their full weight until then (Dynamo's `PrefillLoadTracker`).

use std::collections::VecDeque;
use std::time::Duration;

use rustc_hash::FxHashMap;

use crate::chain_tree::ChainTree;

#[derive(Clone, Debug, Default)]
struct TargetLoad {
    /// Σ pending prompt tokens, undecayed.
    prefill_tokens: u64,
    /// Requests with pending prompt tokens, oldest first.
    prefill_order: VecDeque<u64>,
    /// The oldest pending prompt and since when it decays.
    anchor: Option<(u64, Duration)>,
    /// Active blocks, the chains of the requests holding them (when reuse is assumed).
    blocks: ChainTree,
    /// Active blocks counted per request (when reuse is not assumed).
    block_count: u64,
    requests: u32,
}

#[derive(Clone, Debug)]
struct Placed {
    target: u32,
    pending_prefill: u32,
    /// Predicted time to prefill the pending prompt alone (None: not modelled, no decay).
    expected_prefill: Option<Duration>,
    /// Its blocks: where its chain ends in the target's tree (when reuse is assumed), else how
    /// many.
    blocks: Held,
}

#[derive(Clone, Copy, Debug)]
enum Held {
    Chain(Option<u32>),
    Count(u64),
}

#[derive(Clone, Debug)]
pub struct ActiveLoad {
    targets: Vec<TargetLoad>,
    requests: FxHashMap<u64, Placed>,
    track_blocks: bool,
    assume_reuse: bool,
}

impl ActiveLoad {
    pub fn new(targets: usize, track_blocks: bool, assume_reuse: bool) -> Self {
        ActiveLoad {
            targets: vec![TargetLoad::default(); targets],
            requests: FxHashMap::default(),
            track_blocks,
            assume_reuse,
        }
    }

    /// Adds a target with no load.
    pub fn add_target(&mut self) {
        self.targets.push(TargetLoad::default());
    }

    /// Prompt tokens placed on `target` whose prefill has not finished, undecayed.
    pub fn prefill_tokens(&self, target: usize) -> u64 {
        self.targets[target].prefill_tokens
    }

    /// Pending prompt tokens of `target` at time `now`, the anchor decayed (see the module
    /// documentation). Without a predicted prefill time this is [`ActiveLoad::prefill_tokens`].
    pub fn prefill_tokens_at(&self, target: usize, now: Duration) -> u64 {
        let t = &self.targets[target];
        let Some((anchor, since)) = t.anchor else { return t.prefill_tokens };
        let p = &self.requests[&anchor];
        let full = p.pending_prefill as u64;
        let remaining = match p.expected_prefill {
            None => full,
            Some(d) if d.is_zero() => 0,
            Some(d) => {
                let elapsed = now.saturating_sub(since);
                let fraction = (1.0 - elapsed.as_secs_f64() / d.as_secs_f64()).clamp(0.0, 1.0);
                (full as f64 * fraction).ceil() as u64
            }
        };
        t.prefill_tokens - full + remaining
    }

    /// Active KV blocks on `target`.
    pub fn blocks(&self, target: usize) -> u64 {
        let t = &self.targets[target];
        if self.assume_reuse {
            t.blocks.blocks()
        } else {
            t.block_count
        }
    }

    pub fn requests(&self, target: usize) -> u32 {
        self.targets[target].requests
    }

    /// Blocks of a request that would be new on `target` (not already active there).
    pub fn new_blocks(&self, target: usize, hashes: &[u64]) -> u64 {
        if !self.track_blocks {
            return 0;
        }
        let t = &self.targets[target];
        if self.assume_reuse {
            // Sequence hashes are chained, and a target holds the whole chain of every request
            // placed on it, so the hashes it holds form a prefix of `hashes`.
            (hashes.len() - t.blocks.matched(hashes)) as u64
        } else {
            hashes.len() as u64
        }
    }

    /// Places request `id` on `target` at time `now` with `pending_prefill` prompt tokens to
    /// compute, predicted (if modelled) to take `expected_prefill` alone.
    pub fn add(
        &mut self,
        id: u64,
        target: usize,
        hashes: &[u64],
        pending_prefill: u32,
        expected_prefill: Option<Duration>,
        now: Duration,
    ) {
        let t = &mut self.targets[target];
        t.prefill_tokens += pending_prefill as u64;
        t.requests += 1;
        if pending_prefill > 0 {
            t.prefill_order.push_back(id);
            if t.anchor.is_none() {
                t.anchor = Some((id, now));
            }
        }
        let blocks = match (self.track_blocks, self.assume_reuse) {
            (false, _) => Held::Count(0),
            (true, true) => Held::Chain(t.blocks.add(hashes)),
            (true, false) => {
                t.block_count += hashes.len() as u64;
                Held::Count(hashes.len() as u64)
            }
        };
        self.requests.insert(id, Placed { target: target as u32, pending_prefill, expected_prefill, blocks });
    }

    /// Drops the pending prompt of `id` (if any) at time `now`; the next oldest becomes the
    /// anchor if `id` was it.
    fn end_prefill(&mut self, id: u64, now: Duration) {
        let Some(p) = self.requests.get_mut(&id) else { return };
        if p.pending_prefill == 0 {
            return;
        }
        let t = &mut self.targets[p.target as usize];
        t.prefill_tokens -= p.pending_prefill as u64;
        p.pending_prefill = 0;
        if t.prefill_order.front() == Some(&id) {
            t.prefill_order.pop_front();
        } else {
            t.prefill_order.retain(|&r| r != id);
        }
        if t.anchor.is_some_and(|(a, _)| a == id) {
            t.anchor = t.prefill_order.front().map(|&next| (next, now));
        }
    }

    /// The request produced its first token at `now`: its prompt no longer loads prefill.
    pub fn prefill_done(&mut self, id: u64, now: Duration) {
        self.end_prefill(id, now);
    }

    /// The request finished (or was dropped) at `now`: forget it. Returns its target.
    pub fn free(&mut self, id: u64, now: Duration) -> Option<usize> {
        self.end_prefill(id, now);
        let p = self.requests.remove(&id)?;
        let t = &mut self.targets[p.target as usize];
        t.requests -= 1;
        match p.blocks {
            Held::Chain(end) => end.into_iter().for_each(|end| t.blocks.remove(end)),
            Held::Count(n) => t.block_count -= n,
        }
        Some(p.target as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Duration = Duration::ZERO;

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn lifecycle_edges() {
        let mut load = ActiveLoad::new(2, true, true);
        load.add(1, 0, &[10, 11, 12], 100, None, T0);
        load.add(2, 0, &[10, 11, 13], 40, None, T0);
        assert_eq!((load.prefill_tokens(0), load.blocks(0), load.requests(0)), (140, 4, 2));
        assert_eq!(load.prefill_tokens_at(0, secs(100.0)), 140, "no model: no decay");
        assert_eq!(load.new_blocks(0, &[10, 14]), 1);
        load.prefill_done(1, T0);
        assert_eq!(load.prefill_tokens(0), 40);
        assert_eq!(load.free(2, T0), Some(0));
        assert_eq!((load.prefill_tokens(0), load.blocks(0)), (0, 3));
        load.free(1, T0);
        assert_eq!(load.blocks(0), 0);
        assert_eq!(load.free(1, T0), None);
    }

    #[test]
    fn new_blocks_of_chained_hashes_count_every_missing_block() {
        // Requests are chains (a block's hash names its whole prefix): branches of a small tree
        // of prompts, placed and freed in a scrambled order. The tree of active chains must count
        // what a holder count per block counts.
        let chain = |branch: u64, len: u64| -> Vec<u64> {
            (0..len).map(|i| if i < 3 { i + 1 } else { (branch + 1) * 1000 + i }).collect()
        };
        let mut load = ActiveLoad::new(1, true, true);
        let mut live = Vec::new();
        // Holders per active block, counted the plain way.
        let mut active: FxHashMap<u64, u32> = FxHashMap::default();
        for step in 0..200u64 {
            let (branch, len) = (step % 5, 1 + (step * 7) % 11);
            let hashes = chain(branch, len);
            let counted = hashes.iter().filter(|h| !active.contains_key(h)).count() as u64;
            assert_eq!(load.new_blocks(0, &hashes), counted, "step {step}");
            load.add(step, 0, &hashes, 0, None, T0);
            for &h in &hashes {
                *active.entry(h).or_insert(0) += 1;
            }
            live.push((step, hashes));
            if step % 3 == 0 {
                let (gone, hashes) = live.remove((step as usize * 5) % live.len());
                load.free(gone, T0);
                for h in &hashes {
                    *active.get_mut(h).unwrap() -= 1;
                }
                active.retain(|_, c| *c > 0);
            }
            assert_eq!(load.blocks(0), active.len() as u64, "step {step}");
        }
    }

    #[test]
    fn without_reuse_blocks_are_counted_per_request() {
        let mut load = ActiveLoad::new(1, true, false);
        load.add(1, 0, &[10, 11], 0, None, T0);
        load.add(2, 0, &[10, 11], 0, None, T0);
        assert_eq!(load.blocks(0), 4);
        assert_eq!(load.new_blocks(0, &[10]), 1);
        load.free(1, T0);
        assert_eq!(load.blocks(0), 2);
    }

    #[test]
    fn only_the_oldest_prompt_decays() {
        // Dynamo's worked example: 64 tokens predicted to take 10 s read 64, 32 and 0 at 0, 5
        // and 10 s.
        let mut load = ActiveLoad::new(1, false, true);
        load.add(1, 0, &[], 64, Some(secs(10.0)), T0);
        assert_eq!(load.prefill_tokens_at(0, T0), 64);
        assert_eq!(load.prefill_tokens_at(0, secs(5.0)), 32);
        assert_eq!(load.prefill_tokens_at(0, secs(10.0)), 0);
        assert_eq!(load.prefill_tokens_at(0, secs(20.0)), 0, "never below zero");
        // Rounded up: 64 × (1 − 1/3) = 42.67 → 43.
        assert_eq!(load.prefill_tokens_at(0, secs(10.0 / 3.0)), 43);
        // A second prompt behind it counts in full while the first is the anchor.
        load.add(2, 0, &[], 100, Some(secs(4.0)), secs(5.0));
        assert_eq!(load.prefill_tokens_at(0, secs(5.0)), 32 + 100);
        // The anchor finishes at 6 s: the next one decays from then.
        load.prefill_done(1, secs(6.0));
        assert_eq!(load.prefill_tokens_at(0, secs(6.0)), 100);
        assert_eq!(load.prefill_tokens_at(0, secs(7.0)), 75);
        // A request without pending prompt tokens (fully cached) never becomes an anchor.
        load.add(3, 0, &[], 0, Some(secs(1.0)), secs(7.0));
        load.free(2, secs(8.0));
        assert_eq!(load.prefill_tokens_at(0, secs(8.0)), 0);
        assert_eq!(load.requests(0), 2, "requests 1 (decoding) and 3");
    }

    #[test]
    fn a_later_prompt_finishing_first_keeps_the_anchor() {
        let mut load = ActiveLoad::new(1, false, true);
        load.add(1, 0, &[], 100, Some(secs(10.0)), T0);
        load.add(2, 0, &[], 50, Some(secs(10.0)), secs(1.0));
        load.add(3, 0, &[], 30, None, secs(2.0));
        load.free(2, secs(5.0));
        assert_eq!(load.prefill_tokens_at(0, secs(5.0)), 50 + 30);
        // An unmodelled anchor does not decay.
        load.prefill_done(1, secs(6.0));
        assert_eq!(load.prefill_tokens_at(0, secs(60.0)), 30);
        // A zero predicted time counts nothing.
        load.add(4, 0, &[], 20, Some(Duration::ZERO), secs(61.0));
        load.free(3, secs(62.0));
        assert_eq!(load.prefill_tokens_at(0, secs(62.0)), 0);
    }
}
