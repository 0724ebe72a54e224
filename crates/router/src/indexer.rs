//! Which prefix blocks each target (worker, or worker × data-parallel rank) holds, as its KV
//! events report them.
//!
//! A block's sequence hash identifies the block *and* everything before it, so the radix tree
//! of prefixes a target holds is stored flat: one hash set per target. Matching a request
//! walks its sequence hashes from the root and stops at the first block the target lacks,
//! which is exactly the walk down a radix tree.
//!
//! A target with a host (G2) cache also reports which blocks its host memory holds
//! (`HostPinned` events in Dynamo). Those form a second, lower tier per target: a request's
//! host hits on a target are the blocks that continue its device prefix there, block after
//! block, in host memory (Dynamo's lower-tier continuation from the device match).

use rustc_hash::FxHashSet;
use servesim_engine::{HostKvEvent, KvEvent};

#[derive(Clone, Debug, Default)]
pub struct Indexer {
    targets: Vec<FxHashSet<u64>>,
    /// Host-resident blocks per target (empty sets until a target reports any).
    host: Vec<FxHashSet<u64>>,
    /// Whether any target ever reported host residency (spares the lower-tier walk).
    has_host: bool,
}

impl Indexer {
    pub fn new(targets: usize) -> Self {
        Indexer {
            targets: vec![FxHashSet::default(); targets],
            host: vec![FxHashSet::default(); targets],
            has_host: false,
        }
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

    /// Applies a change in `target`'s host residency.
    pub fn apply_host(&mut self, target: usize, event: &HostKvEvent) {
        let set = &mut self.host[target];
        match event {
            HostKvEvent::Stored { hashes } => {
                self.has_host = true;
                set.extend(hashes.iter().copied());
            }
            HostKvEvent::Removed { hashes } => {
                for h in hashes {
                    set.remove(h);
                }
            }
        }
    }

    /// Adds a target that holds nothing yet; returns its index.
    pub fn add_target(&mut self) -> usize {
        self.targets.push(FxHashSet::default());
        self.host.push(FxHashSet::default());
        self.targets.len() - 1
    }

    /// Forgets everything a target held (it left the pool).
    pub fn clear(&mut self, target: usize) {
        self.targets[target].clear();
        self.host[target].clear();
    }

    /// Whether any target has reported host-resident blocks.
    pub fn has_host_tier(&self) -> bool {
        self.has_host
    }

    /// Blocks of `hashes` from `device_overlap` on that `target` holds in host memory, up to the
    /// first it lacks: what its host cache adds to its device prefix.
    pub fn host_hits(&self, target: usize, hashes: &[u64], device_overlap: u32) -> u32 {
        let set = &self.host[target];
        if set.is_empty() {
            return 0;
        }
        hashes[device_overlap as usize..].iter().take_while(|h| set.contains(h)).count() as u32
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

    #[test]
    fn host_hits_continue_the_device_prefix() {
        let mut ix = Indexer::new(2);
        ix.apply(0, &stored(&[1, 2]));
        ix.apply_host(0, &HostKvEvent::Stored { hashes: vec![1, 2, 3, 4, 6] });
        assert!(ix.has_host_tier());
        let hashes = [1, 2, 3, 4, 5, 6];
        assert_eq!(ix.overlap(0, &hashes), 2);
        assert_eq!(ix.host_hits(0, &hashes, 2), 2, "3 and 4 continue the device prefix; 6 is past a gap");
        assert_eq!(ix.host_hits(1, &hashes, 0), 0);
        // Without a device prefix the host walk starts at the first block.
        assert_eq!(ix.host_hits(0, &[1, 2, 9], 0), 2);
        ix.apply_host(0, &HostKvEvent::Removed { hashes: vec![3] });
        assert_eq!(ix.host_hits(0, &hashes, 2), 0);
        ix.clear(0);
        assert_eq!(ix.host_hits(0, &[1], 0), 0);
    }
}
