//! Pages and the radix cache: which pages a request holds, when its full pages join the tree,
//! and how room is made by evicting unlocked cache.

use super::radix::ROOT;
use super::SglangEngine;
use crate::hash::chain_hash;
use crate::output::{KvEvent, StoredBlock};

impl SglangEngine {
    /// Computes the keys of `slot`'s full pages up to `pages` (fewer if the sequence is
    /// shorter).
    pub(super) fn fill_keys(&mut self, slot: u32, pages: usize) {
        let page = self.page;
        let req = &mut self.reqs[slot];
        let pages = pages.min((req.len() / page) as usize);
        if req.hashes.local.len() < pages {
            let mut keys = std::mem::take(&mut req.hashes.local);
            keys.reserve_exact(pages - keys.len());
            req.block_keys(keys.len()..pages, &mut self.scratch_tokens, &mut self.key_memo, &mut keys);
            req.hashes.local = keys;
        }
    }

    /// Tokens the pool could hand out now: free pages and unlocked cache.
    pub(super) fn reservable_tokens(&self) -> u64 {
        self.pool.available() as u64 * self.page as u64 + self.tree.evictable_tokens()
    }

    /// Frees pages for `pages` new ones by evicting cache if needed. False if impossible.
    pub(super) fn make_room(&mut self, pages: u32) -> bool {
        let available = self.pool.available();
        if pages <= available {
            return true;
        }
        let mut freed = Vec::new();
        self.tree.evict((pages - available) as u64 * self.page as u64, &mut freed);
        self.pool.free(&freed);
        if self.record_events && !freed.is_empty() {
            self.events.push(KvEvent::Removed { hashes: freed.iter().map(|&p| self.tree.seq_of(p)).collect() });
        }
        pages <= self.pool.available()
    }

    /// Moves the first `full` pages of `slot` into the tree (those not there yet) and moves the
    /// request's lock to the deepest node covering them.
    pub(super) fn cache_pages(&mut self, slot: u32, full: usize) {
        if !self.cfg.enable_prefix_caching || full <= self.reqs[slot].state.tree_pages {
            return;
        }
        let page = self.page;
        let req = &mut self.reqs[slot];
        let first = req.state.tree_pages;
        let (keys, seqs) = (&mut self.scratch_keys, &mut self.scratch_seqs);
        keys.clear();
        seqs.clear();
        keys.reserve(full - first);
        req.block_keys(first..full, &mut self.scratch_tokens, &mut self.key_memo, keys);
        // The pages before `first` are the tree's: their sequence hashes are known.
        let parent = (self.record_events && first > 0).then(|| self.tree.seq_of(req.blocks[first - 1]));
        if self.record_events {
            let mut last = parent;
            for &key in keys.iter() {
                let seq = chain_hash(last, key);
                seqs.push(seq);
                last = Some(seq);
            }
        }
        let inserted = self.tree.insert(req.state.lock_node, keys, &req.blocks[first..full], seqs);
        if !inserted.duplicates.is_empty() {
            // Another request cached these pages first: use the tree's copies.
            self.pool.free(&inserted.duplicates);
            let tree_pages = self.tree.path_pages(inserted.node);
            req.blocks[..full].copy_from_slice(&tree_pages[..full]);
        }
        if inserted.node != req.state.lock_node {
            self.tree.lock(inserted.node);
            self.tree.unlock(req.state.lock_node);
            req.state.lock_node = inserted.node;
        }
        req.state.tree_pages = full;
        if self.record_events && inserted.new_pages > 0 {
            let new = full - inserted.new_pages - first..full - first;
            let parent = if new.start == 0 { parent } else { Some(seqs[new.start - 1]) };
            let blocks = new.clone().map(|j| StoredBlock { hash: seqs[j], local: keys[j] }).collect();
            self.events.push(KvEvent::Stored { parent, blocks });
            if self.record_tokens {
                let tokens = (first + new.start) as u32 * page..full as u32 * page;
                self.stored_tokens.extend(tokens.map(|pos| req.token_at(pos)));
            }
        }
    }

    /// Frees the request's own pages and unlocks its cached prefix.
    pub(super) fn release(&mut self, slot: u32) {
        let req = &mut self.reqs[slot];
        self.pool.free(&req.blocks[req.state.tree_pages..]);
        req.blocks.clear();
        self.tree.unlock(req.state.lock_node);
        req.state.lock_node = ROOT;
        req.state.tree_pages = 0;
        req.computed = 0;
    }
}
