//! SGLang's radix prefix cache over pages.
//!
//! Edges are runs of pages keyed by each page's local hash (the hash of its tokens); a node's
//! full key is the path from the root, so two requests share a node exactly when they share the
//! prefix. Nodes that a running request depends on are locked (reference counted up to the
//! root). Unlocked childless nodes are evictable leaves, evicted least recently used first; a
//! leaf larger than the eviction need gives up only its newest pages.
//!
//! "Recently" is the order of cache operations, as in SGLang (which stamps nodes with the wall
//! clock at each match or insert): every match and every insert takes a new stamp from a counter,
//! and a node created by an insert takes one more, so leaves touched by different operations of
//! the same forward pass are ordered by operation.
//!
//! A page id is in the tree at most once, so a page's hashes live in arrays indexed by page id
//! and a node holds only its page ids: at page size 1 a cached token costs 12 bytes (4 without
//! KV events) rather than three vectors' worth per node.

use std::collections::BTreeSet;

use rustc_hash::FxHashMap;

pub type NodeId = u32;
pub const ROOT: NodeId = 0;

#[derive(Clone, Debug, Default)]
struct Node {
    /// Page ids on the edge into this node; their local hashes are the edge's key.
    value: Vec<u32>,
    /// Children by the local hash of their first page.
    children: FxHashMap<u64, NodeId>,
    parent: NodeId,
    lock_ref: u32,
    /// Stamp of the last operation that used it.
    last_access: u64,
    /// Whether it is in the evictable-leaf index.
    indexed: bool,
}

/// Page ids handed out newest-freed first, then never-used ones in order.
#[derive(Clone, Debug)]
pub struct PagePool {
    total: u32,
    next_fresh: u32,
    free: Vec<u32>,
}

impl PagePool {
    pub fn new(total: u32) -> Self {
        PagePool { total, next_fresh: 0, free: Vec::new() }
    }

    pub fn available(&self) -> u32 {
        self.free.len() as u32 + (self.total - self.next_fresh)
    }

    pub fn total(&self) -> u32 {
        self.total
    }

    pub fn alloc(&mut self, n: u32, out: &mut Vec<u32>) -> bool {
        if n > self.available() {
            return false;
        }
        for _ in 0..n {
            let page = match self.free.pop() {
                Some(p) => p,
                None => {
                    self.next_fresh += 1;
                    self.next_fresh - 1
                }
            };
            out.push(page);
        }
        true
    }

    pub fn free(&mut self, pages: &[u32]) {
        self.free.extend_from_slice(pages);
    }
}

#[derive(Clone, Debug)]
pub struct RadixCache {
    nodes: Vec<Node>,
    free_nodes: Vec<NodeId>,
    page_size: u32,
    /// Local hash of each page in the tree, by page id.
    page_key: Vec<u64>,
    /// Sequence (chained) hash of each page in the tree, by page id; empty unless the owner
    /// reports KV events.
    page_seq: Vec<u64>,
    /// The last stamp handed out (see the module documentation).
    clock: u64,
    /// Unlocked childless nodes by (last access, id).
    evictable_leaves: BTreeSet<(u64, NodeId)>,
    /// Tokens in unlocked nodes.
    evictable_tokens: u64,
}

/// Result of a prefix match: matched pages (in order) and the deepest node reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Match {
    pub pages: Vec<u32>,
    pub node: NodeId,
}

/// Result of an insertion: the deepest node now covering the inserted pages, which of the
/// caller's pages the tree already had under the same key (a prefix of them: the caller frees
/// those and uses the tree's), and how many were new (the rest).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Inserted {
    pub node: NodeId,
    pub duplicates: Vec<u32>,
    pub new_pages: usize,
}

impl RadixCache {
    /// A tree over `pages` physical pages; `with_seq` keeps each page's sequence hash.
    pub fn new(page_size: u32, pages: u32, with_seq: bool) -> Self {
        let root = Node { lock_ref: 1, ..Node::default() };
        RadixCache {
            nodes: vec![root],
            free_nodes: Vec::new(),
            page_size,
            page_key: vec![0; pages as usize],
            page_seq: if with_seq { vec![0; pages as usize] } else { Vec::new() },
            clock: 0,
            evictable_leaves: BTreeSet::new(),
            evictable_tokens: 0,
        }
    }

    pub fn evictable_tokens(&self) -> u64 {
        self.evictable_tokens
    }

    /// Sequence hash of a page in the tree (with `with_seq`).
    pub fn seq_of(&self, page: u32) -> u64 {
        self.page_seq[page as usize]
    }

    fn tokens(&self, id: NodeId) -> u64 {
        self.nodes[id as usize].value.len() as u64 * self.page_size as u64
    }

    fn first_key(&self, id: NodeId) -> u64 {
        self.page_key[self.nodes[id as usize].value[0] as usize]
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Adds `id` to, or removes it from, the evictable-leaf index as its state requires.
    fn sync_leaf(&mut self, id: NodeId) {
        let n = &self.nodes[id as usize];
        let evictable = id != ROOT && n.children.is_empty() && n.lock_ref == 0;
        if evictable != n.indexed {
            let entry = (n.last_access, id);
            self.nodes[id as usize].indexed = evictable;
            if evictable {
                self.evictable_leaves.insert(entry);
            } else {
                self.evictable_leaves.remove(&entry);
            }
        }
    }

    fn touch(&mut self, id: NodeId, stamp: u64) {
        let n = &mut self.nodes[id as usize];
        if n.last_access == stamp {
            return;
        }
        if n.indexed {
            self.evictable_leaves.remove(&(n.last_access, id));
            self.evictable_leaves.insert((stamp, id));
        }
        n.last_access = stamp;
    }

    fn new_node(&mut self, node: Node) -> NodeId {
        match self.free_nodes.pop() {
            Some(id) => {
                self.nodes[id as usize] = node;
                id
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as NodeId
            }
        }
    }

    /// Pages at the start of `child`'s edge whose keys are the start of `keys`.
    fn common_prefix(&self, child: NodeId, keys: &[u64]) -> usize {
        let value = &self.nodes[child as usize].value;
        value.iter().zip(keys).take_while(|&(&page, key)| self.page_key[page as usize] == *key).count()
    }

    /// Length in pages of the cached prefix of `keys`, without changing anything (LPM scoring).
    pub fn peek(&self, keys: &[u64]) -> usize {
        let (mut node, mut i) = (ROOT, 0);
        while i < keys.len() {
            let Some(&child) = self.nodes[node as usize].children.get(&keys[i]) else { break };
            let common = self.common_prefix(child, &keys[i..]);
            i += common;
            if common < self.nodes[child as usize].value.len() {
                break;
            }
            node = child;
        }
        i
    }

    /// Matches the longest cached prefix of `keys` and locks it. Every fully matched node is
    /// marked as used now; a partially matched edge is split so the match ends on a node, which
    /// keeps the edge's old stamp.
    pub fn match_and_lock(&mut self, keys: &[u64]) -> Match {
        let stamp = self.tick();
        let (mut node, mut i) = (ROOT, 0);
        let mut pages = Vec::new();
        while i < keys.len() {
            let Some(&child) = self.nodes[node as usize].children.get(&keys[i]) else { break };
            let common = self.common_prefix(child, &keys[i..]);
            if common < self.nodes[child as usize].value.len() {
                node = self.split(child, common);
                pages.extend_from_slice(&self.nodes[node as usize].value);
                break;
            }
            self.touch(child, stamp);
            pages.extend_from_slice(&self.nodes[child as usize].value);
            i += common;
            node = child;
        }
        self.lock(node);
        Match { pages, node }
    }

    /// Splits `id` after `at` pages: a new node takes the first `at` pages (and the lock count
    /// and access stamp), `id` keeps the rest as its child. Returns the new node.
    fn split(&mut self, id: NodeId, at: usize) -> NodeId {
        let n = &mut self.nodes[id as usize];
        let head = Node {
            value: n.value.drain(..at).collect(),
            children: FxHashMap::default(),
            parent: n.parent,
            lock_ref: n.lock_ref,
            last_access: n.last_access,
            indexed: false,
        };
        let parent = head.parent;
        let mid = self.new_node(head);
        let (first, rest_first) = (self.first_key(mid), self.first_key(id));
        self.nodes[mid as usize].children.insert(rest_first, id);
        self.nodes[id as usize].parent = mid;
        self.nodes[parent as usize].children.insert(first, mid);
        mid
    }

    /// Locks the path from `node` to the root (a request depends on it).
    pub fn lock(&mut self, mut node: NodeId) {
        while node != ROOT {
            if self.nodes[node as usize].lock_ref == 0 {
                self.evictable_tokens -= self.tokens(node);
            }
            self.nodes[node as usize].lock_ref += 1;
            self.sync_leaf(node);
            node = self.nodes[node as usize].parent;
        }
    }

    pub fn unlock(&mut self, mut node: NodeId) {
        while node != ROOT {
            let n = &mut self.nodes[node as usize];
            n.lock_ref -= 1;
            if n.lock_ref == 0 {
                self.evictable_tokens += self.tokens(node);
            }
            self.sync_leaf(node);
            node = self.nodes[node as usize].parent;
        }
    }

    /// Records the identity of pages entering the tree.
    fn adopt(&mut self, keys: &[u64], values: &[u32], seqs: &[u64]) {
        for (&page, &key) in values.iter().zip(keys) {
            self.page_key[page as usize] = key;
        }
        if !self.page_seq.is_empty() {
            for (&page, &seq) in values.iter().zip(seqs) {
                self.page_seq[page as usize] = seq;
            }
        }
    }

    /// Inserts pages (`keys` local hashes, `values` page ids, `seqs` chained hashes — empty
    /// when the tree keeps none) below `start`, which ends exactly where they start, and marks
    /// the path from the root as used now. A childless node on the way that nobody else depends
    /// on (unlocked, or `start` locked only by the caller) grows in place instead of getting a
    /// child.
    pub fn insert(&mut self, start: NodeId, keys: &[u64], values: &[u32], seqs: &[u64]) -> Inserted {
        let mut out = Inserted { node: start, duplicates: Vec::new(), new_pages: 0 };
        if keys.is_empty() {
            return out;
        }
        let stamp = self.tick();
        let mut up = start;
        while up != ROOT {
            self.touch(up, stamp);
            up = self.nodes[up as usize].parent;
        }
        let (mut node, mut i) = (start, 0);
        while i < keys.len() {
            let n = &self.nodes[node as usize];
            let own_leaf =
                node != ROOT && n.children.is_empty() && (n.lock_ref == 0 || (node == start && n.lock_ref == 1));
            let seqs_from = |i: usize| if seqs.is_empty() { seqs } else { &seqs[i..] };
            if own_leaf {
                self.extend_leaf(node, &keys[i..], &values[i..], seqs_from(i), stamp);
                out.node = node;
                out.new_pages = keys.len() - i;
                return out;
            }
            let Some(&child) = self.nodes[node as usize].children.get(&keys[i]) else {
                out.node = self.new_leaf(node, &keys[i..], &values[i..], seqs_from(i));
                out.new_pages = keys.len() - i;
                return out;
            };
            let common = self.common_prefix(child, &keys[i..]);
            out.duplicates.extend_from_slice(&values[i..i + common]);
            i += common;
            if common < self.nodes[child as usize].value.len() {
                let mid = self.split(child, common);
                out.node = if i < keys.len() {
                    out.new_pages = keys.len() - i;
                    self.new_leaf(mid, &keys[i..], &values[i..], seqs_from(i))
                } else {
                    mid
                };
                return out;
            }
            self.touch(child, stamp);
            node = child;
        }
        out.node = node;
        out
    }

    fn extend_leaf(&mut self, id: NodeId, keys: &[u64], values: &[u32], seqs: &[u64], stamp: u64) {
        self.touch(id, stamp);
        self.adopt(keys, values, seqs);
        let n = &mut self.nodes[id as usize];
        n.value.extend_from_slice(values);
        if n.lock_ref == 0 {
            self.evictable_tokens += values.len() as u64 * self.page_size as u64;
        }
    }

    /// A new unlocked leaf below `parent`, stamped with an operation of its own.
    fn new_leaf(&mut self, parent: NodeId, keys: &[u64], values: &[u32], seqs: &[u64]) -> NodeId {
        let stamp = self.tick();
        self.adopt(keys, values, seqs);
        let leaf = self.new_node(Node {
            value: values.to_vec(),
            children: FxHashMap::default(),
            parent,
            lock_ref: 0,
            last_access: stamp,
            indexed: false,
        });
        self.nodes[parent as usize].children.insert(keys[0], leaf);
        self.evictable_tokens += self.tokens(leaf);
        self.sync_leaf(parent);
        self.sync_leaf(leaf);
        leaf
    }

    /// Evicts at least `tokens` tokens of unlocked cache, least recently used leaves first,
    /// newest pages of a leaf first. Appends the freed pages to `freed`; returns the tokens
    /// evicted.
    pub fn evict(&mut self, tokens: u64, freed: &mut Vec<u32>) -> u64 {
        let page = self.page_size as u64;
        let mut done = 0;
        while done < tokens {
            let Some(&(stamp, leaf)) = self.evictable_leaves.first() else { break };
            let size = self.tokens(leaf);
            let need_pages = (tokens - done).div_ceil(page) as usize;
            let n = &mut self.nodes[leaf as usize];
            if need_pages < n.value.len() {
                // Give up only the newest pages of a large leaf.
                let keep = n.value.len() - need_pages;
                freed.extend(n.value.drain(keep..));
                let gone = need_pages as u64 * page;
                self.evictable_tokens -= gone;
                done += gone;
                continue;
            }
            self.evictable_leaves.remove(&(stamp, leaf));
            n.indexed = false;
            let parent = n.parent;
            let first = self.page_key[n.value[0] as usize];
            freed.append(&mut n.value);
            self.nodes[parent as usize].children.remove(&first);
            self.evictable_tokens -= size;
            done += size;
            self.free_nodes.push(leaf);
            self.sync_leaf(parent);
        }
        done
    }

    /// Pages from the root to `node`.
    pub fn path_pages(&self, mut node: NodeId) -> Vec<u32> {
        let mut parts = Vec::new();
        while node != ROOT {
            parts.push(&self.nodes[node as usize].value[..]);
            node = self.nodes[node as usize].parent;
        }
        parts.into_iter().rev().flatten().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tree built by requests that each match their keys, insert the rest and finish.
    fn tree_with(paths: &[(&[u64], &[u32])]) -> RadixCache {
        let mut t = RadixCache::new(4, 256, false);
        for (keys, values) in paths {
            let m = t.match_and_lock(keys);
            let n = m.pages.len();
            t.insert(m.node, &keys[n..], &values[n..], &[]);
            t.unlock(m.node);
        }
        t
    }

    #[test]
    fn partial_matches_split_the_edge() {
        let mut t = tree_with(&[(&[1, 2, 3, 4], &[10, 11, 12, 13])]);
        assert_eq!(t.peek(&[1, 2, 9]), 2, "peek does not split");
        let m = t.match_and_lock(&[1, 2, 9]);
        assert_eq!(m.pages, vec![10, 11]);
        // The split node holds the shared prefix; the old node keeps the rest as its child.
        assert_eq!(t.path_pages(m.node), vec![10, 11]);
        let ins = t.insert(m.node, &[9], &[20], &[]);
        assert!(ins.duplicates.is_empty());
        assert_eq!(t.path_pages(ins.node), vec![10, 11, 20]);
        t.unlock(m.node);
        let full = t.match_and_lock(&[1, 2, 3, 4]);
        assert_eq!(full.pages, vec![10, 11, 12, 13]);
        t.unlock(full.node);
        assert_eq!(t.evictable_tokens(), 5 * 4);
    }

    #[test]
    fn inserting_cached_pages_reports_duplicates() {
        let mut t = tree_with(&[(&[1, 2], &[10, 11])]);
        let ins = t.insert(ROOT, &[1, 2, 3], &[50, 51, 52], &[]);
        assert_eq!((ins.duplicates, ins.new_pages), (vec![50, 51], 1), "only the last page is new");
        // The unlocked leaf [1, 2] grows in place rather than getting a child.
        assert_eq!(t.path_pages(ins.node), vec![10, 11, 52]);
        assert_eq!(t.nodes[ins.node as usize].value, vec![10, 11, 52]);
    }

    #[test]
    fn a_leaf_another_request_depends_on_gets_a_child() {
        let mut t = tree_with(&[(&[1, 2], &[10, 11])]);
        let other = t.match_and_lock(&[1, 2]);
        let mine = t.match_and_lock(&[1, 2]);
        let ins = t.insert(mine.node, &[3], &[12], &[]);
        assert_ne!(ins.node, mine.node, "shared by two requests: not extended in place");
        assert_eq!(t.path_pages(ins.node), vec![10, 11, 12]);
        t.unlock(other.node);
        // Locked only by this request now: it grows in place.
        let mine2 = t.match_and_lock(&[1, 2, 3]);
        t.unlock(mine.node);
        let ins2 = t.insert(mine2.node, &[4], &[13], &[]);
        assert_eq!(ins2.node, mine2.node);
    }

    #[test]
    fn eviction_takes_least_recently_used_leaves_and_trims_large_ones() {
        // Three requests in turn; the third splits [1,2,3] after [1,2].
        let mut t = tree_with(&[(&[1, 2, 3], &[10, 11, 12]), (&[5, 6], &[20, 21]), (&[1, 2, 7], &[0, 0, 30])]);
        // Leaves: [3] (first request), [5,6], [7]. Lock the [5,6] path.
        let m = t.match_and_lock(&[5, 6]);
        let mut freed = Vec::new();
        // One page from the least recently used unlocked leaf ([3]).
        assert_eq!(t.evict(4, &mut freed), 4);
        assert_eq!(freed, vec![12]);
        // Next: leaf [7]; then [1,2] became a leaf and goes too — trimmed from its newest page.
        freed.clear();
        assert_eq!(t.evict(8, &mut freed), 8);
        assert_eq!(freed, vec![30, 11]);
        assert_eq!(t.peek(&[1, 2]), 1);
        // The locked path survives any eviction.
        freed.clear();
        t.evict(1000, &mut freed);
        assert_eq!(freed, vec![10]);
        assert_eq!(t.peek(&[5, 6]), 2);
        t.unlock(m.node);
        assert_eq!(t.evict(1000, &mut freed), 8);
    }

    #[test]
    fn leaves_are_ordered_by_operation_not_by_creation() {
        // Leaves created in the order 1, 2, 3; then 1 is matched again: it is the most recent.
        let mut t = RadixCache::new(4, 256, false);
        for (k, v) in [(1u64, 10u32), (2, 20), (3, 30)] {
            t.insert(ROOT, &[k], &[v], &[]);
        }
        let m = t.match_and_lock(&[1]);
        t.unlock(m.node);
        let mut freed = Vec::new();
        t.evict(8, &mut freed);
        assert_eq!(freed, vec![20, 30]);
    }

    #[test]
    fn an_insertion_marks_its_whole_path_as_used() {
        // [1] then [1,2] (a child of [1] after a split by [1,3]); [9] is inserted later.
        let mut t = tree_with(&[(&[1, 2], &[10, 11]), (&[1, 3], &[0, 13])]);
        t.insert(ROOT, &[9], &[90], &[]);
        // Extending [1,3]'s leaf touches [1] too, so [1,2]'s leaf is the oldest, then [9].
        let m = t.match_and_lock(&[1, 3]);
        t.insert(m.node, &[4], &[14], &[]);
        t.unlock(m.node);
        let mut freed = Vec::new();
        t.evict(8, &mut freed);
        assert_eq!(freed, vec![11, 90]);
    }

    #[test]
    fn page_pool_reuses_freed_pages_first() {
        let mut pool = PagePool::new(3);
        let mut pages = Vec::new();
        assert!(pool.alloc(2, &mut pages));
        assert_eq!(pages, vec![0, 1]);
        pool.free(&[0]);
        assert_eq!(pool.available(), 2);
        pages.clear();
        assert!(pool.alloc(2, &mut pages));
        assert_eq!(pages, vec![0, 2]);
        assert!(!pool.alloc(1, &mut pages));
    }
}
