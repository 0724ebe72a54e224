//! The paged KV block pool with prefix caching.
//!
//! Every block a request holds is a physical *copy*. A copy is first private to the request
//! (its tokens are not computed yet); once its tokens are computed it becomes *cached* under its
//! sequence hash and other requests can reuse it. Cached copies that no request references are
//! *inactive*: they stay resident in an LRU list (oldest first) and are evicted only when fresh
//! blocks are needed. The same hash can have several copies (two requests computed the same block
//! before either was visible); a hash is reported removed only when its last copy goes.

use hashbrown::HashTable;
use rustc_hash::FxHashSet;

use crate::output::KvEvent;

/// End of a list.
const NIL: u32 = u32::MAX;
/// `next_same` of a copy that is not cached (private to its request).
const PRIVATE: u32 = u32::MAX - 1;

/// One physical block: 24 bytes, so a pool of 16,384 blocks costs under 400 KB.
#[derive(Clone, Debug)]
struct Copy {
    hash: u64,
    refs: u32,
    /// LRU neighbours while inactive.
    prev: u32,
    next: u32,
    /// Next copy with the same hash (NIL at the end of the chain), or PRIVATE.
    next_same: u32,
}

impl Copy {
    fn is_cached(&self) -> bool {
        self.next_same != PRIVATE
    }
}

/// Outcome of looking a hash up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Residency {
    Missing,
    /// Resident and referenced by some request.
    Active,
    /// Resident, in the LRU list.
    Inactive,
}

#[derive(Debug)]
pub struct BlockPool {
    capacity: u32,
    copies: Vec<Copy>,
    free_slots: Vec<u32>,
    num_copies: u32,
    num_inactive: u32,
    lru_head: u32,
    lru_tail: u32,
    /// The first copy of every cached hash, found by the hash itself. Block hashes are XXH3
    /// outputs, already uniformly spread, so the table uses them as they are; it stores 4-byte
    /// copy indices rather than (hash, entry) pairs, which keeps it a fifth of a map's size.
    by_hash: HashTable<u32>,
    record_events: bool,
    events: Vec<KvEvent>,
    /// Copies a store to a shared host pool still reads ([`Self::hold`]): released, they keep
    /// their capacity (a cached one stays a prefix hit but out of the LRU) until the store
    /// completes.
    held: FxHashSet<u32>,
    /// Held private copies whose last reference went: freed when their hold ends.
    released_held: FxHashSet<u32>,
}

impl BlockPool {
    pub fn new(capacity: u32, record_events: bool) -> Self {
        BlockPool {
            capacity,
            copies: Vec::new(),
            free_slots: Vec::new(),
            num_copies: 0,
            num_inactive: 0,
            lru_head: NIL,
            lru_tail: NIL,
            by_hash: HashTable::new(),
            record_events,
            events: Vec::new(),
            held: FxHashSet::default(),
            released_held: FxHashSet::default(),
        }
    }

    /// A store to a shared host pool reads `copies`: until [`Self::release_held`], releasing
    /// one does not free its capacity.
    pub fn hold(&mut self, copies: &[u32]) {
        for &copy in copies {
            debug_assert!(self.copies[copy as usize].refs > 0, "a held copy is in use");
            self.held.insert(copy);
        }
    }

    /// The store that held `copies` completed: each released one becomes free (private) or the
    /// newest LRU entry (cached), the last copy first, so a shared prefix is evicted last.
    pub fn release_held(&mut self, copies: &[u32]) {
        for &copy in copies.iter().rev() {
            if !self.held.remove(&copy) {
                continue;
            }
            if self.released_held.remove(&copy) {
                self.free_slot(copy);
            } else if self.copies[copy as usize].refs == 0 {
                self.lru_push_back(copy);
                self.num_inactive += 1;
            }
        }
    }

    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Blocks referenced by requests (what `gpu_cache_usage` reports).
    pub fn num_active(&self) -> u32 {
        self.num_copies - self.num_inactive
    }

    /// Cached blocks nobody references (reusable, evictable).
    pub fn num_inactive(&self) -> u32 {
        self.num_inactive
    }

    /// The first copy cached under `hash`.
    fn first_copy(&self, hash: u64) -> Option<u32> {
        let copies = &self.copies;
        self.by_hash.find(hash, |&c| copies[c as usize].hash == hash).copied()
    }

    pub fn lookup(&self, hash: u64) -> Residency {
        match self.first_copy(hash) {
            None => Residency::Missing,
            Some(first) if self.any_referenced(first) => Residency::Active,
            Some(_) => Residency::Inactive,
        }
    }

    /// Takes the events recorded since the last call.
    pub fn drain_events(&mut self, out: &mut Vec<KvEvent>) {
        out.append(&mut self.events);
    }

    pub fn records_events(&self) -> bool {
        self.record_events
    }

    pub(crate) fn push_event(&mut self, event: KvEvent) {
        if self.record_events {
            self.events.push(event);
        }
    }

    /// Blocks never allocated or freed (allocating them evicts nothing).
    pub fn num_free(&self) -> u32 {
        self.capacity - self.num_copies
    }

    /// Hashes of the inactive blocks in eviction order (least recently used first).
    pub fn eviction_order(&self) -> impl Iterator<Item = u64> + '_ {
        let mut c = self.lru_head;
        std::iter::from_fn(move || {
            (c != NIL).then(|| {
                let copy = &self.copies[c as usize];
                c = copy.next;
                copy.hash
            })
        })
    }

    /// Whether `fresh` new blocks could be allocated (evicting inactive ones).
    pub fn can_allocate(&self, fresh: u32) -> bool {
        fresh <= self.capacity - self.num_copies + self.num_inactive
    }

    /// Appends to `lease` one copy for each hash in `hits` (resident prefix blocks, reused) and
    /// `fresh` new private copies, evicting inactive blocks as needed. All or nothing: returns
    /// false and changes nothing if the blocks cannot be found.
    pub fn allocate(&mut self, hits: &[u64], fresh: u32, lease: &mut Vec<u32>) -> bool {
        let free = self.capacity - self.num_copies;
        let evictions = fresh.saturating_sub(free);
        // Each hit's first copy is found once: it tells whether the hit is inactive and is where
        // acquiring it starts. They wait in `lease` until the allocation is known to fit.
        let start = lease.len();
        lease.reserve(hits.len() + fresh as usize);
        for &h in hits {
            lease.push(self.first_copy(h).expect("prefix hit must be resident"));
        }
        if evictions > 0 {
            // Inactive hits are about to be reused, so they cannot make room for themselves.
            let inactive_hits = lease[start..].iter().filter(|&&first| !self.any_referenced(first)).count() as u32;
            if evictions > self.num_inactive - inactive_hits {
                lease.truncate(start);
                return false;
            }
        }
        for copy in &mut lease[start..] {
            *copy = self.acquire(*copy);
        }
        if evictions > 0 {
            let mut removed = Vec::with_capacity(evictions as usize);
            for _ in 0..evictions {
                if let Some(h) = self.evict_oldest() {
                    removed.push(h);
                }
            }
            if !removed.is_empty() {
                self.push_event(KvEvent::Removed { hashes: removed });
            }
        }
        for _ in 0..fresh {
            let copy = self.new_copy();
            lease.push(copy);
        }
        true
    }

    /// Makes a private copy cache-visible under `hash`. Returns true if it is the first resident
    /// copy of that hash (the caller reports it as stored).
    pub fn cache(&mut self, copy: u32, hash: u64) -> bool {
        debug_assert!(!self.copies[copy as usize].is_cached() && self.copies[copy as usize].refs == 1);
        self.copies[copy as usize].hash = hash;
        let copies = &mut self.copies;
        match self.by_hash.find_mut(hash, |&c| copies[c as usize].hash == hash) {
            Some(first) => {
                // The newest copy heads the chain.
                copies[copy as usize].next_same = *first;
                *first = copy;
                false
            }
            None => {
                copies[copy as usize].next_same = NIL;
                self.by_hash.insert_unique(hash, copy, |&c| copies[c as usize].hash);
                true
            }
        }
    }

    /// Takes a referenced copy out of the cache: its hash is no longer a hit through it, and it
    /// is private to its holder again (a state about to be overwritten in place).
    pub fn uncache(&mut self, copy: u32) {
        debug_assert!(self.copies[copy as usize].is_cached() && self.copies[copy as usize].refs > 0);
        self.unlink_same(copy);
        self.copies[copy as usize].next_same = PRIVATE;
    }

    /// Frees every inactive copy cached under `hash` (a superseded saved state): true if the
    /// hash is gone. Referenced copies stay.
    pub fn discard_inactive(&mut self, hash: u64) -> bool {
        let mut c = self.first_copy(hash).unwrap_or(NIL);
        while c != NIL {
            let next = self.copies[c as usize].next_same;
            let held = !self.held.is_empty() && self.held.contains(&c);
            if self.copies[c as usize].refs == 0 && !held {
                self.lru_unlink(c);
                self.num_inactive -= 1;
                self.unlink_same(c);
                self.free_slot(c);
            }
            c = next;
        }
        self.first_copy(hash).is_none()
    }

    /// Removes cached `copy` from its hash's chain of copies.
    fn unlink_same(&mut self, copy: u32) {
        let hash = self.copies[copy as usize].hash;
        let after = self.copies[copy as usize].next_same;
        let copies = &mut self.copies;
        let Ok(entry) = self.by_hash.find_entry(hash, |&c| copies[c as usize].hash == hash) else {
            unreachable!("a cached copy is in the table")
        };
        let first = *entry.get();
        if first == copy {
            if after == NIL {
                entry.remove();
            } else {
                *entry.into_mut() = after;
            }
            return;
        }
        let mut c = first;
        while copies[c as usize].next_same != copy {
            c = copies[c as usize].next_same;
        }
        copies[c as usize].next_same = after;
    }

    /// Drops one reference to `copy`: a private copy is freed, a cached one becomes the newest
    /// LRU entry when its last reference goes.
    pub fn release(&mut self, copy: u32) {
        let c = &mut self.copies[copy as usize];
        debug_assert!(c.refs > 0);
        c.refs -= 1;
        if c.refs > 0 {
            return;
        }
        let cached = c.is_cached();
        if !self.held.is_empty() && self.held.contains(&copy) {
            if !cached {
                self.released_held.insert(copy);
            }
            return;
        }
        if !cached {
            self.free_slot(copy);
            return;
        }
        self.lru_push_back(copy);
        self.num_inactive += 1;
    }

    /// Releases every copy of a request's lease, last block first: the end of a sequence
    /// becomes evictable before its prefix.
    pub fn release_lease(&mut self, lease: &[u32]) {
        for &copy in lease.iter().rev() {
            self.release(copy);
        }
    }

    /// Whether a request references (or a running store holds) any copy in the chain that
    /// starts at `first`.
    fn any_referenced(&self, first: u32) -> bool {
        let mut c = first;
        while c != NIL {
            let copy = &self.copies[c as usize];
            // A held copy is outside the LRU: reusing it takes no evictable block.
            if copy.refs > 0 || (!self.held.is_empty() && self.held.contains(&c)) {
                return true;
            }
            c = copy.next_same;
        }
        false
    }

    /// Takes a reference to a cached hash whose first copy is `first`; returns the copy taken.
    fn acquire(&mut self, first: u32) -> u32 {
        // Prefer a copy that is already referenced; otherwise reactivate an inactive one.
        let mut c = first;
        while c != NIL {
            if self.copies[c as usize].refs > 0 {
                self.copies[c as usize].refs += 1;
                return c;
            }
            c = self.copies[c as usize].next_same;
        }
        if self.held.is_empty() || !self.held.contains(&first) {
            self.lru_unlink(first);
            self.num_inactive -= 1;
        }
        self.copies[first as usize].refs = 1;
        first
    }

    /// Evicts the least recently used inactive copy; returns its hash if that was the last copy.
    fn evict_oldest(&mut self) -> Option<u64> {
        let victim = self.lru_head;
        debug_assert!(victim != NIL);
        self.lru_unlink(victim);
        self.num_inactive -= 1;
        let hash = self.copies[victim as usize].hash;
        let after = self.copies[victim as usize].next_same;
        let copies = &mut self.copies;
        let Ok(entry) = self.by_hash.find_entry(hash, |&c| copies[c as usize].hash == hash) else {
            unreachable!("an inactive copy is cached")
        };
        let first = *entry.get();
        let gone = if first == victim && after == NIL {
            entry.remove();
            true
        } else {
            if first == victim {
                *entry.into_mut() = after;
            } else {
                let mut c = first;
                while copies[c as usize].next_same != victim {
                    c = copies[c as usize].next_same;
                }
                copies[c as usize].next_same = after;
            }
            false
        };
        self.free_slot(victim);
        gone.then_some(hash)
    }

    fn new_copy(&mut self) -> u32 {
        let copy = Copy { hash: 0, refs: 1, prev: NIL, next: NIL, next_same: PRIVATE };
        self.num_copies += 1;
        match self.free_slots.pop() {
            Some(slot) => {
                self.copies[slot as usize] = copy;
                slot
            }
            None => {
                self.copies.push(copy);
                (self.copies.len() - 1) as u32
            }
        }
    }

    fn free_slot(&mut self, copy: u32) {
        self.num_copies -= 1;
        self.free_slots.push(copy);
    }

    fn lru_push_back(&mut self, c: u32) {
        self.copies[c as usize].prev = self.lru_tail;
        self.copies[c as usize].next = NIL;
        if self.lru_tail == NIL {
            self.lru_head = c;
        } else {
            self.copies[self.lru_tail as usize].next = c;
        }
        self.lru_tail = c;
    }

    fn lru_unlink(&mut self, c: u32) {
        let (prev, next) = (self.copies[c as usize].prev, self.copies[c as usize].next);
        if prev == NIL {
            self.lru_head = next;
        } else {
            self.copies[prev as usize].next = next;
        }
        if next == NIL {
            self.lru_tail = prev;
        } else {
            self.copies[next as usize].prev = prev;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Allocates one private block and caches it under `hash`.
    fn cached_block(pool: &mut BlockPool, hash: u64) -> u32 {
        let mut lease = Vec::new();
        assert!(pool.allocate(&[], 1, &mut lease));
        pool.cache(lease[0], hash);
        lease[0]
    }

    fn removed(pool: &mut BlockPool) -> Vec<u64> {
        let mut ev = Vec::new();
        pool.drain_events(&mut ev);
        ev.into_iter()
            .flat_map(|e| match e {
                KvEvent::Removed { hashes } => hashes,
                _ => vec![],
            })
            .collect()
    }

    #[test]
    fn duplicate_copies_are_visible_once() {
        let mut pool = BlockPool::new(2, true);
        let mut lease = Vec::new();
        assert!(pool.allocate(&[], 2, &mut lease));
        assert!(pool.cache(lease[0], 7), "first copy becomes visible");
        assert!(!pool.cache(lease[1], 7), "second copy does not");
        assert_eq!(pool.num_active(), 2);
        pool.release(lease[0]);
        pool.release(lease[1]);
        assert_eq!((pool.num_active(), pool.num_inactive()), (0, 2));
        // Evicting one copy reports nothing; evicting the second reports the hash.
        let mut l = Vec::new();
        assert!(pool.allocate(&[], 1, &mut l));
        assert!(removed(&mut pool).is_empty());
        assert!(pool.allocate(&[], 1, &mut l));
        assert_eq!(removed(&mut pool), vec![7]);
    }

    #[test]
    fn allocation_is_all_or_nothing() {
        // Capacity 1 with hash 9 inactive: reusing 9 and asking one fresh block cannot fit.
        let mut pool = BlockPool::new(1, true);
        let c = cached_block(&mut pool, 9);
        pool.release(c);
        let mut lease = Vec::new();
        assert!(!pool.allocate(&[9], 1, &mut lease));
        assert!(lease.is_empty());
        assert_eq!((pool.num_active(), pool.num_inactive()), (0, 1));
        assert_eq!(pool.lookup(9), Residency::Inactive);
        // Without the fresh block it fits and reactivates the copy.
        assert!(pool.allocate(&[9], 0, &mut lease));
        assert_eq!(pool.lookup(9), Residency::Active);
    }

    #[test]
    fn eviction_is_least_recently_released_first() {
        let mut pool = BlockPool::new(3, true);
        let a = cached_block(&mut pool, 1);
        let b = cached_block(&mut pool, 2);
        let c = cached_block(&mut pool, 3);
        // Released leaf first (as a finished request does), so the leaf is older.
        pool.release(c);
        pool.release(b);
        pool.release(a);
        let mut lease = Vec::new();
        assert!(pool.allocate(&[], 2, &mut lease));
        assert_eq!(removed(&mut pool), vec![3, 2]);
        assert_eq!(pool.lookup(1), Residency::Inactive);
    }

    #[test]
    fn shared_hits_are_reference_counted() {
        let mut pool = BlockPool::new(4, false);
        let a = cached_block(&mut pool, 5);
        let mut lease = Vec::new();
        assert!(pool.allocate(&[5], 0, &mut lease));
        assert_eq!(lease, vec![a], "an active copy is shared, not duplicated");
        pool.release(a);
        assert_eq!(pool.lookup(5), Residency::Active);
        pool.release(a);
        assert_eq!(pool.lookup(5), Residency::Inactive);
        assert_eq!(pool.num_active(), 0);
    }
    #[test]
    fn held_sources_keep_their_capacity_until_the_store_completes() {
        let mut pool = BlockPool::new(3, false);
        let a = cached_block(&mut pool, 1);
        let mut private = Vec::new();
        assert!(pool.allocate(&[], 1, &mut private));
        let b = cached_block(&mut pool, 2);
        pool.hold(&[a, private[0], b]);
        pool.release_lease(&[a, private[0], b]);
        // Released but held: not free, not evictable, and a cached one is still a hit.
        assert_eq!((pool.num_free(), pool.num_inactive(), pool.num_active()), (0, 0, 3));
        assert!(!pool.can_allocate(1));
        assert_eq!(pool.lookup(1), Residency::Active);
        // Reusing a held hit takes no evictable block, and releasing it keeps it held.
        let mut lease = Vec::new();
        assert!(pool.allocate(&[1], 0, &mut lease));
        pool.release(a);
        // The store completes: the private copy is freed, the cached ones join the LRU, the
        // last first, so the prefix (1) is the most recent.
        pool.release_held(&[a, private[0], b]);
        assert_eq!((pool.num_free(), pool.num_inactive()), (1, 2));
        assert_eq!(pool.eviction_order().collect::<Vec<_>>(), [2, 1]);
    }
}
