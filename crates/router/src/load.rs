//! Load the router has placed on each target and not yet seen finish: prompt tokens waiting
//! for prefill and KV blocks held by live requests.
//!
//! Lifecycle edges: [`ActiveLoad::add`] when a request is placed, [`ActiveLoad::prefill_done`]
//! at its first token, [`ActiveLoad::free`] when it completes.

use rustc_hash::FxHashMap;

#[derive(Clone, Debug, Default)]
struct TargetLoad {
    prefill_tokens: u64,
    /// Active blocks by hash with their number of holders (when reuse is assumed).
    blocks: FxHashMap<u64, u32>,
    /// Active blocks counted per request (when reuse is not assumed).
    block_count: u64,
    requests: u32,
}

#[derive(Clone, Debug)]
struct Placed {
    target: u32,
    pending_prefill: u32,
    hashes: Vec<u64>,
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

    /// Prompt tokens placed on `target` whose prefill has not finished.
    pub fn prefill_tokens(&self, target: usize) -> u64 {
        self.targets[target].prefill_tokens
    }

    /// Active KV blocks on `target`.
    pub fn blocks(&self, target: usize) -> u64 {
        let t = &self.targets[target];
        if self.assume_reuse {
            t.blocks.len() as u64
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
            hashes.iter().filter(|h| !t.blocks.contains_key(h)).count() as u64
        } else {
            hashes.len() as u64
        }
    }

    pub fn add(&mut self, id: u64, target: usize, hashes: &[u64], pending_prefill: u32) {
        let t = &mut self.targets[target];
        t.prefill_tokens += pending_prefill as u64;
        t.requests += 1;
        let mut kept = Vec::new();
        if self.track_blocks {
            if self.assume_reuse {
                for &h in hashes {
                    *t.blocks.entry(h).or_insert(0) += 1;
                }
                kept = hashes.to_vec();
            } else {
                t.block_count += hashes.len() as u64;
                kept = vec![0; hashes.len()];
            }
        }
        self.requests.insert(id, Placed { target: target as u32, pending_prefill, hashes: kept });
    }

    /// The request produced its first token: its prompt no longer loads prefill.
    pub fn prefill_done(&mut self, id: u64) {
        if let Some(p) = self.requests.get_mut(&id) {
            self.targets[p.target as usize].prefill_tokens -= p.pending_prefill as u64;
            p.pending_prefill = 0;
        }
    }

    /// The request finished (or was dropped): forget it. Returns its target.
    pub fn free(&mut self, id: u64) -> Option<usize> {
        let p = self.requests.remove(&id)?;
        let t = &mut self.targets[p.target as usize];
        t.prefill_tokens -= p.pending_prefill as u64;
        t.requests -= 1;
        if self.assume_reuse {
            for h in &p.hashes {
                let count = t.blocks.get_mut(h).expect("active block is tracked");
                *count -= 1;
                if *count == 0 {
                    t.blocks.remove(h);
                }
            }
        } else {
            t.block_count -= p.hashes.len() as u64;
        }
        Some(p.target as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifecycle_edges() {
        let mut load = ActiveLoad::new(2, true, true);
        load.add(1, 0, &[10, 11, 12], 100);
        load.add(2, 0, &[10, 11, 13], 40);
        assert_eq!((load.prefill_tokens(0), load.blocks(0), load.requests(0)), (140, 4, 2));
        assert_eq!(load.new_blocks(0, &[10, 14]), 1);
        load.prefill_done(1);
        assert_eq!(load.prefill_tokens(0), 40);
        assert_eq!(load.free(2), Some(0));
        assert_eq!((load.prefill_tokens(0), load.blocks(0)), (0, 3));
        load.free(1);
        assert_eq!(load.blocks(0), 0);
        assert_eq!(load.free(1), None);
    }

    #[test]
    fn without_reuse_blocks_are_counted_per_request() {
        let mut load = ActiveLoad::new(1, true, false);
        load.add(1, 0, &[10, 11], 0);
        load.add(2, 0, &[10, 11], 0);
        assert_eq!(load.blocks(0), 4);
        assert_eq!(load.new_blocks(0, &[10]), 1);
        load.free(1);
        assert_eq!(load.blocks(0), 2);
    }
}
