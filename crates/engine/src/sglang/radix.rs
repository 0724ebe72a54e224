//! SGLang's radix prefix cache over pages.
//!
//! Edges are runs of pages keyed by each page's local hash (the hash of its tokens); a node's
//! full key is the path from the root, so two requests share a node exactly when they share the
//! prefix. Nodes that a running request depends on are locked (reference counted up to the
//! root). Unlocked childless nodes are evictable leaves, evicted least recently used first; a
//! leaf larger than the eviction need gives up only its newest pages.

use std::collections::BTreeSet;

use rustc_hash::FxHashMap;

pub type NodeId = u32;
pub const ROOT: NodeId = 0;

#[derive(Clone, Debug, Default)]
struct Node {
    /// Local hashes of the pages on the edge into this node.
    key: Vec<u64>,
    /// Page ids holding those pages.
    value: Vec<u32>,
    /// Sequence (chained) hash of each page, for KV events.
    seq: Vec<u64>,
    children: FxHashMap<u64, NodeId>,
    parent: NodeId,
    lock_ref: u32,
    last_access: u64,
    /// Creation order, breaking ties between leaves last used at the same time.
    created: u64,
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
    /// The current time (the engine's pass counter): touches within a pass tie.
    now: u64,
    created: u64,
    /// Unlocked childless nodes by (last access, creation order, id).
    evictable_leaves: BTreeSet<(u64, u64, NodeId)>,
    /// Tokens in unlocked nodes.
    evictable_tokens: u64,
}

/// Result of a prefix match: matched pages (in order) and the deepest node reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Match {
    pub pages: Vec<u32>,
    pub node: NodeId,
}

impl RadixCache {
    pub fn new(page_size: u32) -> Self {
        let root = Node { lock_ref: 1, ..Node::default() };
        RadixCache {
            nodes: vec![root],
            free_nodes: Vec::new(),
            page_size,
            now: 0,
            created: 0,
            evictable_leaves: BTreeSet::new(),
            evictable_tokens: 0,
        }
    }

    pub fn evictable_tokens(&self) -> u64 {
        self.evictable_tokens
    }

    fn tokens(&self, id: NodeId) -> u64 {
        self.nodes[id as usize].key.len() as u64 * self.page_size as u64
    }

    fn is_leaf(&self, id: NodeId) -> bool {
        id != ROOT && self.nodes[id as usize].children.is_empty()
    }

    /// Advances the clock that orders least-recently-used eviction.
    pub fn set_time(&mut self, now: u64) {
        self.now = now;
    }

    fn sync_leaf(&mut self, id: NodeId) {
        let evictable = self.is_leaf(id) && self.nodes[id as usize].lock_ref == 0;
        let n = &mut self.nodes[id as usize];
        if evictable != n.indexed {
            n.indexed = evictable;
            let entry = (n.last_access, n.created, id);
            if evictable {
                self.evictable_leaves.insert(entry);
            } else {
                self.evictable_leaves.remove(&entry);
            }
        }
    }

    fn touch(&mut self, id: NodeId) {
        let n = &mut self.nodes[id as usize];
        if n.last_access == self.now {
            return;
        }
        if n.indexed {
            self.evictable_leaves.remove(&(n.last_access, n.created, id));
            self.evictable_leaves.insert((self.now, n.created, id));
        }
        n.last_access = self.now;
    }

    fn new_node(&mut self, mut node: Node) -> NodeId {
        self.created += 1;
        node.created = self.created;
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

    /// Length in pages of the cached prefix of `keys`, without changing anything (LPM scoring).
    pub fn peek(&self, keys: &[u64]) -> usize {
        let (mut node, mut i) = (ROOT, 0);
        while i < keys.len() {
            let Some(&child) = self.nodes[node as usize].children.get(&keys[i]) else { break };
            let edge = &self.nodes[child as usize].key;
            let common = edge.iter().zip(&keys[i..]).take_while(|(a, b)| a == b).count();
            i += common;
            if common < edge.len() {
                break;
            }
            node = child;
        }
        i
    }

    /// Matches the longest cached prefix of `keys`, splitting a partially matched edge so the
    /// match ends on a node, and marks the path as used now.
    pub fn match_prefix(&mut self, keys: &[u64]) -> Match {
        let (mut node, mut i) = (ROOT, 0);
        let mut pages = Vec::new();
        while i < keys.len() {
            let Some(&child) = self.nodes[node as usize].children.get(&keys[i]) else { break };
            let common = {
                let edge = &self.nodes[child as usize].key;
                edge.iter().zip(&keys[i..]).take_while(|(a, b)| a == b).count()
            };
            let target = if common < self.nodes[child as usize].key.len() { self.split(child, common) } else { child };
            pages.extend_from_slice(&self.nodes[target as usize].value);
            self.touch(target);
            i += common;
            node = target;
            if target != child {
                break;
            }
        }
        Match { pages, node }
    }

    /// Splits `id` after `at` pages: a new node takes the first `at` pages (and the lock count
    /// and access time), `id` keeps the rest as its child. Returns the new node.
    fn split(&mut self, id: NodeId, at: usize) -> NodeId {
        let (parent, head_key, head_value, head_seq, lock_ref, last_access) = {
            let n = &mut self.nodes[id as usize];
            let key: Vec<u64> = n.key.drain(..at).collect();
            let value: Vec<u32> = n.value.drain(..at).collect();
            let seq: Vec<u64> = n.seq.drain(..at).collect();
            (n.parent, key, value, seq, n.lock_ref, n.last_access)
        };
        let first = head_key[0];
        let rest_first = self.nodes[id as usize].key[0];
        let mid = self.new_node(Node {
            key: head_key,
            value: head_value,
            seq: head_seq,
            children: FxHashMap::default(),
            parent,
            lock_ref,
            last_access,
            created: 0,
            indexed: false,
        });
        self.nodes[mid as usize].children.insert(rest_first, id);
        self.nodes[id as usize].parent = mid;
        self.nodes[parent as usize].children.insert(first, mid);
        mid
    }

    /// Locks the path from `node` to the root (a request depends on it).
    pub fn lock(&mut self, mut node: NodeId) {
        while node != ROOT {
            if self.nodes[node as usize].lock_ref == 0 {
                let t = self.tokens(node);
                self.evictable_tokens -= t;
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
                let t = self.tokens(node);
                self.evictable_tokens += t;
            }
            self.sync_leaf(node);
            node = self.nodes[node as usize].parent;
        }
    }

    /// Inserts pages (`keys` local hashes, `values` page ids, `seqs` chained hashes) below
    /// `node`, which ends exactly where they start. Returns the deepest node now covering them
    /// and the pages of `values` that turned out to be cached already (the caller frees those
    /// and uses the tree's); the sequence hashes of the pages that are new are appended to
    /// `stored`.
    pub fn insert(
        &mut self,
        node: NodeId,
        keys: &[u64],
        values: &[u32],
        seqs: &[u64],
        stored: &mut Vec<u64>,
    ) -> (NodeId, Vec<u32>) {
        let (mut node, mut i) = (node, 0);
        let mut duplicates = Vec::new();
        self.touch_if_not_root(node);
        // A request growing its own private leaf (locked by it alone) extends it in place
        // instead of chaining one node per page.
        let n = &self.nodes[node as usize];
        if node != ROOT && n.children.is_empty() && n.lock_ref == 1 && !keys.is_empty() {
            let n = &mut self.nodes[node as usize];
            n.key.extend_from_slice(keys);
            n.value.extend_from_slice(values);
            n.seq.extend_from_slice(seqs);
            stored.extend_from_slice(seqs);
            return (node, duplicates);
        }
        while i < keys.len() {
            let Some(&child) = self.nodes[node as usize].children.get(&keys[i]) else {
                stored.extend_from_slice(&seqs[i..]);
                let leaf = self.new_node(Node {
                    key: keys[i..].to_vec(),
                    value: values[i..].to_vec(),
                    seq: seqs[i..].to_vec(),
                    children: FxHashMap::default(),
                    parent: node,
                    lock_ref: 0,
                    last_access: 0,
                    created: 0,
                    indexed: false,
                });
                self.nodes[node as usize].children.insert(keys[i], leaf);
                self.evictable_tokens += self.tokens(leaf);
                self.sync_leaf(node);
                self.touch_if_not_root(leaf);
                self.sync_leaf(leaf);
                return (leaf, duplicates);
            };
            let common = {
                let edge = &self.nodes[child as usize].key;
                edge.iter().zip(&keys[i..]).take_while(|(a, b)| a == b).count()
            };
            let target = if common < self.nodes[child as usize].key.len() { self.split(child, common) } else { child };
            duplicates.extend_from_slice(&values[i..i + common]);
            self.touch(target);
            i += common;
            node = target;
        }
        (node, duplicates)
    }

    fn touch_if_not_root(&mut self, node: NodeId) {
        if node != ROOT {
            self.touch(node);
        }
    }

    /// Evicts at least `tokens` tokens of unlocked cache, oldest leaves first, newest pages of
    /// a leaf first. Appends the freed pages to `freed` and their sequence hashes to `removed`;
    /// returns the tokens evicted.
    pub fn evict(&mut self, tokens: u64, freed: &mut Vec<u32>, removed: &mut Vec<u64>) -> u64 {
        let page = self.page_size as u64;
        let mut done = 0;
        while done < tokens {
            let Some(&(t, created, leaf)) = self.evictable_leaves.iter().next() else { break };
            let size = self.tokens(leaf);
            let need_pages = (tokens - done).div_ceil(page) as usize;
            let n = &mut self.nodes[leaf as usize];
            if need_pages < n.key.len() {
                // Give up only the newest pages of a large leaf.
                let keep = n.key.len() - need_pages;
                n.key.truncate(keep);
                freed.extend(n.value.drain(keep..).rev());
                removed.extend(n.seq.drain(keep..).rev());
                let gone = need_pages as u64 * page;
                self.evictable_tokens -= gone;
                done += gone;
                continue;
            }
            self.evictable_leaves.remove(&(t, created, leaf));
            n.indexed = false;
            freed.extend(std::mem::take(&mut n.value).into_iter().rev());
            removed.extend(std::mem::take(&mut n.seq).into_iter().rev());
            let first = n.key[0];
            let parent = n.parent;
            n.key.clear();
            self.nodes[parent as usize].children.remove(&first);
            self.evictable_tokens -= size;
            done += size;
            self.free_nodes.push(leaf);
            self.sync_leaf(parent);
        }
        done
    }

    #[cfg(test)]
    fn evict_pages(&mut self, tokens: u64, freed: &mut Vec<u32>) -> u64 {
        self.evict(tokens, freed, &mut Vec::new())
    }

    /// Pages from the root to `node` (for tests and invariants).
    pub fn path_pages(&self, mut node: NodeId) -> Vec<u32> {
        let mut parts = Vec::new();
        while node != ROOT {
            parts.push(self.nodes[node as usize].value.clone());
            node = self.nodes[node as usize].parent;
        }
        parts.into_iter().rev().flatten().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree_with(paths: &[(&[u64], &[u32])]) -> RadixCache {
        let mut t = RadixCache::new(4);
        for (i, (keys, values)) in paths.iter().enumerate() {
            t.set_time(i as u64 + 1);
            let m = t.match_prefix(keys);
            let n = m.pages.len();
            t.insert(m.node, &keys[n..], &values[n..], &keys[n..], &mut Vec::new());
        }
        t
    }

    #[test]
    fn partial_matches_split_the_edge() {
        let mut t = tree_with(&[(&[1, 2, 3, 4], &[10, 11, 12, 13])]);
        assert_eq!(t.peek(&[1, 2, 9]), 2, "peek does not split");
        let m = t.match_prefix(&[1, 2, 9]);
        assert_eq!(m.pages, vec![10, 11]);
        // The split node holds the shared prefix; the old node keeps the rest as its child.
        assert_eq!(t.path_pages(m.node), vec![10, 11]);
        let (leaf, dup) = t.insert(m.node, &[9], &[20], &[99], &mut Vec::new());
        assert!(dup.is_empty());
        assert_eq!(t.path_pages(leaf), vec![10, 11, 20]);
        assert_eq!(t.match_prefix(&[1, 2, 3, 4]).pages, vec![10, 11, 12, 13]);
        assert_eq!(t.evictable_tokens(), 5 * 4);
    }

    #[test]
    fn inserting_cached_pages_reports_duplicates() {
        let mut t = tree_with(&[(&[1, 2], &[10, 11])]);
        let mut stored = Vec::new();
        let (node, dup) = t.insert(ROOT, &[1, 2, 3], &[50, 51, 52], &[7, 8, 9], &mut stored);
        assert_eq!(dup, vec![50, 51]);
        assert_eq!(stored, vec![9], "only the new page is reported");
        assert_eq!(t.path_pages(node), vec![10, 11, 52]);
    }

    #[test]
    fn eviction_takes_oldest_unlocked_leaves_and_trims_large_ones() {
        // Three requests at times 1, 2 and 3; the third splits [1,2,3] after [1,2].
        let mut t = tree_with(&[(&[1, 2, 3], &[10, 11, 12]), (&[5, 6], &[20, 21]), (&[1, 2, 7], &[0, 0, 30])]);
        // Leaves: [3] (used at time 1), [5,6] (2), [7] (3). Lock the [5,6] path.
        t.set_time(4);
        let m = t.match_prefix(&[5, 6]);
        t.lock(m.node);
        let mut freed = Vec::new();
        // One page from the oldest unlocked leaf ([3]).
        assert_eq!(t.evict_pages(4, &mut freed), 4);
        assert_eq!(freed, vec![12]);
        // Next: leaf [7]; then [1,2] became a leaf and goes too — trimmed from its newest page.
        freed.clear();
        assert_eq!(t.evict_pages(8, &mut freed), 8);
        assert_eq!(freed, vec![30, 11]);
        assert_eq!(t.peek(&[1, 2]), 1);
        // The locked path survives any eviction.
        freed.clear();
        t.evict_pages(1000, &mut freed);
        assert_eq!(freed, vec![10]);
        assert_eq!(t.peek(&[5, 6]), 2);
        t.unlock(m.node);
        assert_eq!(t.evict_pages(1000, &mut freed), 8);
    }

    #[test]
    fn leaves_used_in_the_same_pass_go_oldest_node_first() {
        let mut t = RadixCache::new(4);
        t.set_time(1);
        for (k, v) in [(1u64, 10u32), (2, 20), (3, 30)] {
            t.insert(ROOT, &[k], &[v], &[k], &mut Vec::new());
        }
        let mut freed = Vec::new();
        t.evict_pages(8, &mut freed);
        assert_eq!(freed, vec![10, 20]);
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
