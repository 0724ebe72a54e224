//! Pages and the radix cache: which pages a request holds, when its full pages join the tree,
//! and how room is made by evicting unlocked cache.

use super::radix::{self, ROOT};
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
        if req.state.key_pages < pages {
            let mut keys = std::mem::take(&mut req.state.keys);
            req.block_keys(req.state.key_pages..pages, &mut self.scratch_tokens, &mut self.key_memo, |key, n| {
                radix::push_run(&mut keys, key, n as u32)
            });
            req.state.keys = keys;
            req.state.key_pages = pages;
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
        let evicted = self.tree.evict((pages - available) as u64 * self.page as u64, &mut freed);
        self.pool.free((evicted / self.page as u64) as u32);
        if self.record_events && evicted > 0 {
            self.events.push(KvEvent::Removed { hashes: freed });
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
        req.block_keys(first..full, &mut self.scratch_tokens, &mut self.key_memo, |key, n| {
            radix::push_run(keys, key, n as u32)
        });
        // The pages before `first` are the tree's (the path to the request's lock node): their
        // sequence hashes are known.
        let parent = (self.record_events && first > 0).then(|| self.tree.last_seq(req.state.lock_node));
        if self.record_events {
            let mut last = parent;
            for key in radix::expand(keys) {
                let seq = chain_hash(last, key);
                seqs.push(seq);
                last = Some(seq);
            }
        }
        let inserted = self.tree.insert(req.state.lock_node, keys, seqs);
        // Pages another request cached first: the request uses the tree's copies and frees its
        // own.
        self.pool.free(inserted.duplicates as u32);
        if inserted.node != req.state.lock_node {
            self.tree.lock(inserted.node);
            self.tree.unlock(req.state.lock_node);
            req.state.lock_node = inserted.node;
        }
        req.state.tree_pages = full;
        if self.record_events && inserted.new_pages > 0 {
            let new = full - inserted.new_pages - first..full - first;
            let parent = if new.start == 0 { parent } else { Some(seqs[new.start - 1]) };
            let locals = radix::expand(keys).skip(new.start);
            let blocks = new.clone().zip(locals).map(|(j, local)| StoredBlock { hash: seqs[j], local }).collect();
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
        self.pool.free(req.state.pages - req.state.tree_pages as u32);
        req.state.pages = 0;
        self.tree.unlock(req.state.lock_node);
        req.state.lock_node = ROOT;
        req.state.tree_pages = 0;
        req.computed = 0;
    }
}
