//! Recency of the evictable host blocks.

use std::collections::BTreeSet;

use rustc_hash::FxHashMap;

use super::BlockKey;

/// Least-recently-used order over resident, unpinned host blocks.
///
/// Each touch opens a new epoch. Blocks that become evictable together (a completed store, the
/// sources of a finished load) share one epoch, because vLLM hands them over as a Python set
/// with no stable order; inside an epoch the smaller key is the older.
#[derive(Default)]
pub(super) struct Lru {
    clock: u64,
    epoch_of: FxHashMap<BlockKey, u64>,
    oldest_first: BTreeSet<(u64, BlockKey)>,
}

impl Lru {
    /// Make `key` the most recent.
    pub(super) fn touch(&mut self, key: BlockKey) {
        self.touch_together(&[key]);
    }

    /// Make `keys` the most recent, all in one epoch.
    pub(super) fn touch_together(&mut self, keys: &[BlockKey]) {
        if keys.is_empty() {
            return;
        }
        self.clock += 1;
        for &key in keys {
            self.remove(key);
            self.epoch_of.insert(key, self.clock);
            self.oldest_first.insert((self.clock, key));
        }
    }

    /// Take `key` out of the order (pinned or gone).
    pub(super) fn remove(&mut self, key: BlockKey) {
        if let Some(epoch) = self.epoch_of.remove(&key) {
            self.oldest_first.remove(&(epoch, key));
        }
    }

    /// Up to `count` of the oldest keys that `eligible` accepts, oldest first.
    pub(super) fn oldest(&self, count: usize, mut eligible: impl FnMut(BlockKey) -> bool) -> Vec<BlockKey> {
        self.oldest_first.iter().map(|&(_, key)| key).filter(|&key| eligible(key)).take(count).collect()
    }

    #[cfg(test)]
    pub(super) fn order(&self) -> Vec<BlockKey> {
        self.oldest_first.iter().map(|&(_, key)| key).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn touches_reorder_and_cohorts_tie_break_by_key() {
        let mut lru = Lru::default();
        lru.touch(30);
        lru.touch_together(&[20, 10]);
        lru.touch(5);
        assert_eq!(lru.order(), [30, 10, 20, 5]);
        lru.touch(30);
        assert_eq!(lru.order(), [10, 20, 5, 30]);
        lru.remove(20);
        lru.remove(99);
        assert_eq!(lru.oldest(2, |_| true), [10, 5]);
        assert_eq!(lru.oldest(5, |key| key != 5), [10, 30]);
    }
}
