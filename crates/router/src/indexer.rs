//! Which prefix blocks each target (worker, or worker × data-parallel rank) holds, as its KV
//! events report them.
//!
//! A block's sequence hash identifies the block *and* everything before it, so the radix tree
//! of prefixes a target holds is stored flat: one hash set per target. Matching a request
//! walks its sequence hashes from the root and stops at the first block the target lacks,
//! which is exactly the walk down a radix tree.

use rustc_hash::FxHashSet;
use servesim_engine::KvEvent;

#[derive(Clone, Debug, Default)]
pub struct Indexer {
    targets: Vec<FxHashSet<u64>>,
}

impl Indexer {
    pub fn new(targets: usize) -> Self {
        Indexer { targets: vec![FxHashSet::default(); targets] }
    }

    pub fn apply(&mut self, target: usize, event: &KvEvent) {
        let set = &mut self.targets[target];
        match event {
            KvEvent::Stored { blocks, .. } => set.extend(blocks.iter().map(|b| b.hash)),
            KvEvent::Removed { hashes } => {
                for h in hashes {
                    set.remove(h);
                }
            }
        }
    }

    /// Adds a target that holds nothing yet; returns its index.
    pub fn add_target(&mut self) -> usize {
        self.targets.push(FxHashSet::default());
        self.targets.len() - 1
    }

    /// Forgets everything a target held (it left the pool).
    pub fn clear(&mut self, target: usize) {
        self.targets[target].clear();
    }

    /// Number of leading blocks of `hashes` that `target` holds.
    pub fn overlap(&self, target: usize, hashes: &[u64]) -> u32 {
        let set = &self.targets[target];
        hashes.iter().take_while(|h| set.contains(h)).count() as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use servesim_engine::StoredBlock;

    fn stored(hashes: &[u64]) -> KvEvent {
        KvEvent::Stored { parent: None, blocks: hashes.iter().map(|&h| StoredBlock { hash: h, local: h }).collect() }
    }

    #[test]
    fn store_remove_and_overlap() {
        let mut ix = Indexer::new(2);
        ix.apply(0, &stored(&[1, 2, 3]));
        ix.apply(1, &stored(&[1, 9]));
        assert_eq!(ix.overlap(0, &[1, 2, 3, 4]), 3);
        assert_eq!(ix.overlap(1, &[1, 2, 3, 4]), 1);
        assert_eq!(ix.overlap(1, &[5, 1]), 0, "matching starts at the first block");
        ix.apply(0, &KvEvent::Removed { hashes: vec![2] });
        assert_eq!(ix.overlap(0, &[1, 2, 3]), 1, "a missing block ends the match");
        assert_eq!(ix.overlap(1, &[1, 9]), 2);
        ix.clear(0);
        assert_eq!(ix.overlap(0, &[1]), 0);
    }
}
