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
//! Keys are stored run-length encoded: an edge holds [`Run`]s of consecutive pages with the same
//! local hash (a trace block cut into pages of one token is one run), and callers pass keys the
//! same way, so matching, inserting, splitting and trimming cost per run, not per page. Pages
//! are interchangeable, so the tree keeps no page ids: the pool is a count, and a request knows
//! how many pages it holds. With KV events the tree keeps each page's sequence (chained) hash,
//! which events name pages by.

use std::collections::BTreeSet;

use rustc_hash::FxHashMap;

pub type NodeId = u32;
pub const ROOT: NodeId = 0;

/// `n` consecutive pages whose local hash is `key`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub key: u64,
    pub n: u32,
}

/// Appends `n` pages of `key` to `runs`, growing the last run if it has the same key.
pub fn push_run(runs: &mut Vec<Run>, key: u64, n: u32) {
    match runs.last_mut() {
        Some(last) if last.key == key => last.n += n,
        _ => runs.push(Run { key, n }),
    }
}

/// Pages in `runs`.
pub fn pages_of(runs: &[Run]) -> usize {
    runs.iter().map(|r| r.n as usize).sum()
}

/// The local hash of every page of `runs`, in order.
pub fn expand(runs: &[Run]) -> impl Iterator<Item = u64> + '_ {
    runs.iter().flat_map(|r| std::iter::repeat_n(r.key, r.n as usize))
}

/// A position in a run-encoded key sequence, limited to a number of pages.
#[derive(Clone, Copy)]
struct Cursor<'a> {
    runs: &'a [Run],
    /// Pages of `runs[0]` already passed.
    off: u32,
    /// Pages left.
    left: usize,
}

impl<'a> Cursor<'a> {
    fn new(runs: &'a [Run], pages: usize) -> Self {
        Cursor { runs, off: 0, left: pages }
    }

    /// Key of the next page and how many pages from here have it (within the limit).
    fn head(&self) -> Option<(u64, u32)> {
        if self.left == 0 {
            return None;
        }
        let r = self.runs[0];
        Some((r.key, ((r.n - self.off) as usize).min(self.left) as u32))
    }

    fn advance(&mut self, mut pages: usize) {
        self.left -= pages;
        while pages > 0 {
            let here = (self.runs[0].n - self.off) as usize;
            if pages < here {
                self.off += pages as u32;
                return;
            }
            pages -= here;
            self.runs = &self.runs[1..];
            self.off = 0;
        }
    }

    /// Appends the remaining pages to `out`.
    fn append_to(&self, out: &mut Vec<Run>) {
        let mut left = self.left;
        let mut off = self.off;
        for r in self.runs {
            if left == 0 {
                break;
            }
            let n = ((r.n - off) as usize).min(left);
            push_run(out, r.key, n as u32);
            left -= n;
            off = 0;
        }
    }
}

#[derive(Clone, Debug, Default)]
struct Node {
    /// Local hashes of the pages on the edge into this node (run-length encoded).
    keys: Vec<Run>,
    /// Pages on the edge.
    len: u32,
    /// Sequence hash of each page on the edge (empty unless the tree keeps them).
    seqs: Vec<u64>,
    /// Children by the local hash of their first page.
    children: FxHashMap<u64, NodeId>,
    parent: NodeId,
    lock_ref: u32,
    /// Stamp of the last operation that used it.
    last_access: u64,
    /// Whether it is in the evictable-leaf index.
    indexed: bool,
}

/// The pool of physical pages: only how many are free matters.
#[derive(Clone, Debug)]
pub struct PagePool {
    total: u32,
    available: u32,
}

impl PagePool {
    pub fn new(total: u32) -> Self {
        PagePool { total, available: total }
    }

    pub fn available(&self) -> u32 {
        self.available
    }

    pub fn total(&self) -> u32 {
        self.total
    }

    /// Takes `n` pages; false (taking none) if fewer are free.
    pub fn alloc(&mut self, n: u32) -> bool {
        if n > self.available {
            return false;
        }
        self.available -= n;
        true
    }

    pub fn free(&mut self, n: u32) {
        self.available += n;
        debug_assert!(self.available <= self.total, "more pages freed than taken");
    }
}

#[derive(Clone, Debug)]
pub struct RadixCache {
    nodes: Vec<Node>,
    free_nodes: Vec<NodeId>,
    page_size: u32,
    /// Whether nodes keep their pages' sequence hashes.
    with_seq: bool,
    /// The last stamp handed out (see the module documentation).
    clock: u64,
    /// Unlocked childless nodes by (last access, id).
    evictable_leaves: BTreeSet<(u64, NodeId)>,
    /// Tokens in unlocked nodes.
    evictable_tokens: u64,
}

/// Result of a prefix match: how many pages matched and the deepest node reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Match {
    pub pages: usize,
    pub node: NodeId,
}

/// Result of an insertion: the deepest node now covering the inserted pages, how many of the
/// caller's pages the tree already had under the same key (a prefix of them: the caller frees
/// those and uses the tree's), and how many were new (the rest).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Inserted {
    pub node: NodeId,
    pub duplicates: usize,
    pub new_pages: usize,
}

impl RadixCache {
    /// An empty tree; `with_seq` keeps each page's sequence hash.
    pub fn new(page_size: u32, with_seq: bool) -> Self {
        let root = Node { lock_ref: 1, ..Node::default() };
        RadixCache {
            nodes: vec![root],
            free_nodes: Vec::new(),
            page_size,
            with_seq,
            clock: 0,
            evictable_leaves: BTreeSet::new(),
            evictable_tokens: 0,
        }
    }

    pub fn evictable_tokens(&self) -> u64 {
        self.evictable_tokens
    }

    /// Sequence hash of the last page on the path to `node` (not the root; with `with_seq`).
    pub fn last_seq(&self, node: NodeId) -> u64 {
        *self.nodes[node as usize].seqs.last().expect("a node with sequence hashes")
    }

    fn tokens(&self, id: NodeId) -> u64 {
        self.nodes[id as usize].len as u64 * self.page_size as u64
    }

    fn first_key(&self, id: NodeId) -> u64 {
        self.nodes[id as usize].keys[0].key
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

    /// Pages at the start of `child`'s edge whose keys are the next ones of `keys`.
    fn common_prefix(&self, child: NodeId, mut keys: Cursor) -> usize {
        let mut common = 0;
        for r in &self.nodes[child as usize].keys {
            let mut n = r.n;
            while n > 0 {
                let Some((key, avail)) = keys.head() else { return common };
                if key != r.key {
                    return common;
                }
                let step = n.min(avail);
                keys.advance(step as usize);
                common += step as usize;
                n -= step;
            }
        }
        common
    }

    /// Length in pages of the cached prefix of the first `pages` pages of `keys`, without
    /// changing anything (LPM scoring).
    pub fn peek(&self, keys: &[Run], pages: usize) -> usize {
        let mut cur = Cursor::new(keys, pages);
        let (mut node, mut i) = (ROOT, 0);
        while let Some((key, _)) = cur.head() {
            let Some(&child) = self.nodes[node as usize].children.get(&key) else { break };
            let common = self.common_prefix(child, cur);
            i += common;
            if common < self.nodes[child as usize].len as usize {
                break;
            }
            cur.advance(common);
            node = child;
        }
        i
    }

    /// Matches the longest cached prefix of the first `pages` pages of `keys` and locks it.
    /// Every fully matched node is marked as used now; a partially matched edge is split so the
    /// match ends on a node, which keeps the edge's old stamp.
    pub fn match_and_lock(&mut self, keys: &[Run], pages: usize) -> Match {
        let stamp = self.tick();
        let mut cur = Cursor::new(keys, pages);
        let (mut node, mut i) = (ROOT, 0);
        while let Some((key, _)) = cur.head() {
            let Some(&child) = self.nodes[node as usize].children.get(&key) else { break };
            let common = self.common_prefix(child, cur);
            i += common;
            if common < self.nodes[child as usize].len as usize {
                node = self.split(child, common);
                break;
            }
            self.touch(child, stamp);
            cur.advance(common);
            node = child;
        }
        self.lock(node);
        Match { pages: i, node }
    }

    /// Splits `id` after `at` pages: a new node takes the first `at` pages (and the lock count
    /// and access stamp), `id` keeps the rest as its child. Returns the new node.
    fn split(&mut self, id: NodeId, at: usize) -> NodeId {
        let n = &mut self.nodes[id as usize];
        // Runs wholly before the split point, and how far into the next one it falls.
        let (mut whole, mut into) = (0, at as u32);
        while into >= n.keys[whole].n {
            into -= n.keys[whole].n;
            whole += 1;
        }
        let mut head_keys: Vec<Run> = n.keys.drain(..whole).collect();
        if into > 0 {
            head_keys.push(Run { key: n.keys[0].key, n: into });
            n.keys[0].n -= into;
        }
        let head_seqs = if n.seqs.is_empty() { Vec::new() } else { n.seqs.drain(..at).collect() };
        n.len -= at as u32;
        let head = Node {
            keys: head_keys,
            len: at as u32,
            seqs: head_seqs,
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

    /// Inserts pages (`keys` their local hashes, `seqs` their chained hashes — empty when the
    /// tree keeps none) below `start`, which ends exactly where they start, and marks the path
    /// from the root as used now. A childless node on the way that nobody else depends on
    /// (unlocked, or `start` locked only by the caller) grows in place instead of getting a
    /// child.
    pub fn insert(&mut self, start: NodeId, keys: &[Run], seqs: &[u64]) -> Inserted {
        let total = pages_of(keys);
        let mut out = Inserted { node: start, duplicates: 0, new_pages: 0 };
        if total == 0 {
            return out;
        }
        let stamp = self.tick();
        let mut up = start;
        while up != ROOT {
            self.touch(up, stamp);
            up = self.nodes[up as usize].parent;
        }
        let mut cur = Cursor::new(keys, total);
        let (mut node, mut i) = (start, 0);
        let seqs_from = |i: usize| if seqs.is_empty() { seqs } else { &seqs[i..] };
        while let Some((key, _)) = cur.head() {
            let n = &self.nodes[node as usize];
            let own_leaf =
                node != ROOT && n.children.is_empty() && (n.lock_ref == 0 || (node == start && n.lock_ref == 1));
            if own_leaf {
                self.extend_leaf(node, cur, seqs_from(i), stamp);
                out.node = node;
                out.new_pages = total - i;
                return out;
            }
            let Some(&child) = self.nodes[node as usize].children.get(&key) else {
                out.node = self.new_leaf(node, cur, seqs_from(i));
                out.new_pages = total - i;
                return out;
            };
            let common = self.common_prefix(child, cur);
            out.duplicates += common;
            i += common;
            cur.advance(common);
            if common < self.nodes[child as usize].len as usize {
                let mid = self.split(child, common);
                out.node = if i < total {
                    out.new_pages = total - i;
                    self.new_leaf(mid, cur, seqs_from(i))
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

    fn extend_leaf(&mut self, id: NodeId, keys: Cursor, seqs: &[u64], stamp: u64) {
        self.touch(id, stamp);
        let n = &mut self.nodes[id as usize];
        keys.append_to(&mut n.keys);
        n.len += keys.left as u32;
        if self.with_seq {
            n.seqs.extend_from_slice(seqs);
        }
        if n.lock_ref == 0 {
            self.evictable_tokens += keys.left as u64 * self.page_size as u64;
        }
    }

    /// A new unlocked leaf below `parent`, stamped with an operation of its own.
    fn new_leaf(&mut self, parent: NodeId, keys: Cursor, seqs: &[u64]) -> NodeId {
        let stamp = self.tick();
        let mut runs = Vec::new();
        keys.append_to(&mut runs);
        let first = runs[0].key;
        let leaf = self.new_node(Node {
            keys: runs,
            len: keys.left as u32,
            seqs: if self.with_seq { seqs.to_vec() } else { Vec::new() },
            children: FxHashMap::default(),
            parent,
            lock_ref: 0,
            last_access: stamp,
            indexed: false,
        });
        self.nodes[parent as usize].children.insert(first, leaf);
        self.evictable_tokens += self.tokens(leaf);
        self.sync_leaf(parent);
        self.sync_leaf(leaf);
        leaf
    }

    /// Evicts at least `tokens` tokens of unlocked cache, least recently used leaves first,
    /// newest pages of a leaf first. With sequence hashes, appends those of the freed pages to
    /// `freed` (a leaf's in order); returns the tokens evicted.
    pub fn evict(&mut self, tokens: u64, freed: &mut Vec<u64>) -> u64 {
        let page = self.page_size as u64;
        let mut done = 0;
        while done < tokens {
            let Some(&(stamp, leaf)) = self.evictable_leaves.first() else { break };
            let size = self.tokens(leaf);
            let need_pages = (tokens - done).div_ceil(page) as usize;
            let n = &mut self.nodes[leaf as usize];
            if need_pages < n.len as usize {
                // Give up only the newest pages of a large leaf.
                let keep = n.len as usize - need_pages;
                let mut cut = need_pages as u32;
                while let Some(last) = n.keys.last_mut() {
                    if last.n > cut {
                        last.n -= cut;
                        break;
                    }
                    cut -= last.n;
                    n.keys.pop();
                }
                n.len = keep as u32;
                if !n.seqs.is_empty() {
                    freed.extend(n.seqs.drain(keep..));
                }
                let gone = need_pages as u64 * page;
                self.evictable_tokens -= gone;
                done += gone;
                continue;
            }
            self.evictable_leaves.remove(&(stamp, leaf));
            n.indexed = false;
            let parent = n.parent;
            let first = n.keys[0].key;
            freed.append(&mut n.seqs);
            n.keys = Vec::new();
            n.len = 0;
            self.nodes[parent as usize].children.remove(&first);
            self.evictable_tokens -= size;
            done += size;
            self.free_nodes.push(leaf);
            self.sync_leaf(parent);
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Run-length keys of a page-by-page key list.
    fn runs(keys: &[u64]) -> Vec<Run> {
        let mut out = Vec::new();
        for &k in keys {
            push_run(&mut out, k, 1);
        }
        out
    }

    /// Sequence hashes along the path to `node` (the tests use them as page identities).
    fn path_seqs(t: &RadixCache, mut node: NodeId) -> Vec<u64> {
        let mut parts = Vec::new();
        while node != ROOT {
            parts.push(t.nodes[node as usize].seqs.clone());
            node = t.nodes[node as usize].parent;
        }
        parts.into_iter().rev().flatten().collect()
    }

    fn insert(t: &mut RadixCache, start: NodeId, keys: &[u64], seqs: &[u64]) -> Inserted {
        t.insert(start, &runs(keys), seqs)
    }

    fn match_lock(t: &mut RadixCache, keys: &[u64]) -> Match {
        t.match_and_lock(&runs(keys), keys.len())
    }

    /// A tree built by requests that each match their keys, insert the rest and finish.
    fn tree_with(paths: &[(&[u64], &[u64])]) -> RadixCache {
        let mut t = RadixCache::new(4, true);
        for (keys, seqs) in paths {
            let m = match_lock(&mut t, keys);
            insert(&mut t, m.node, &keys[m.pages..], &seqs[m.pages..]);
            t.unlock(m.node);
        }
        t
    }

    #[test]
    fn runs_merge_equal_neighbours_and_cursors_walk_them() {
        let r = runs(&[7, 7, 7, 8, 7, 7]);
        assert_eq!(r, vec![Run { key: 7, n: 3 }, Run { key: 8, n: 1 }, Run { key: 7, n: 2 }]);
        assert_eq!(pages_of(&r), 6);
        assert_eq!(expand(&r).collect::<Vec<_>>(), vec![7, 7, 7, 8, 7, 7]);
        let mut c = Cursor::new(&r, 5);
        c.advance(2);
        assert_eq!(c.head(), Some((7, 1)));
        c.advance(2);
        assert_eq!(c.head(), Some((7, 1)), "limited to 5 pages");
        let mut rest = Vec::new();
        c.append_to(&mut rest);
        assert_eq!(rest, vec![Run { key: 7, n: 1 }]);
        c.advance(1);
        assert_eq!(c.head(), None);
    }

    #[test]
    fn partial_matches_split_the_edge() {
        let mut t = tree_with(&[(&[1, 2, 3, 4], &[10, 11, 12, 13])]);
        assert_eq!(t.peek(&runs(&[1, 2, 9]), 3), 2, "peek does not split");
        assert_eq!(t.peek(&runs(&[1, 2, 9]), 1), 1, "peek stops at the page limit");
        let m = match_lock(&mut t, &[1, 2, 9]);
        assert_eq!(m.pages, 2);
        // The split node holds the shared prefix; the old node keeps the rest as its child.
        assert_eq!(path_seqs(&t, m.node), vec![10, 11]);
        let ins = insert(&mut t, m.node, &[9], &[20]);
        assert_eq!(ins.duplicates, 0);
        assert_eq!(path_seqs(&t, ins.node), vec![10, 11, 20]);
        t.unlock(m.node);
        let full = match_lock(&mut t, &[1, 2, 3, 4]);
        assert_eq!(full.pages, 4);
        assert_eq!(path_seqs(&t, full.node), vec![10, 11, 12, 13]);
        t.unlock(full.node);
        assert_eq!(t.evictable_tokens(), 5 * 4);
    }

    #[test]
    fn runs_split_inside_a_run() {
        // One edge of 5 pages with key 3, then 2 with key 4; a request shares 2 pages of it.
        let mut t = tree_with(&[(&[3, 3, 3, 3, 3, 4, 4], &[1, 2, 3, 4, 5, 6, 7])]);
        let m = match_lock(&mut t, &[3, 3, 5]);
        assert_eq!(m.pages, 2);
        assert_eq!(t.nodes[m.node as usize].keys, vec![Run { key: 3, n: 2 }]);
        let rest = *t.nodes[m.node as usize].children.values().next().unwrap();
        assert_eq!(t.nodes[rest as usize].keys, vec![Run { key: 3, n: 3 }, Run { key: 4, n: 2 }]);
        assert_eq!(t.nodes[rest as usize].len, 5);
        t.unlock(m.node);
        // Longer than the cached run: the match stops where the run ends.
        assert_eq!(t.peek(&runs(&[3; 9]), 9), 5);
        assert_eq!(t.peek(&runs(&[3, 3, 3, 3, 3, 4, 4, 4]), 8), 7);
    }

    #[test]
    fn inserting_cached_pages_reports_duplicates() {
        let mut t = tree_with(&[(&[1, 2], &[10, 11])]);
        let ins = insert(&mut t, ROOT, &[1, 2, 3], &[50, 51, 52]);
        assert_eq!((ins.duplicates, ins.new_pages), (2, 1), "only the last page is new");
        // The unlocked leaf [1, 2] grows in place rather than getting a child.
        assert_eq!(path_seqs(&t, ins.node), vec![10, 11, 52]);
        assert_eq!(t.nodes[ins.node as usize].seqs, vec![10, 11, 52]);
        assert_eq!(t.nodes[ins.node as usize].len, 3);
    }

    #[test]
    fn a_leaf_another_request_depends_on_gets_a_child() {
        let mut t = tree_with(&[(&[1, 2], &[10, 11])]);
        let other = match_lock(&mut t, &[1, 2]);
        let mine = match_lock(&mut t, &[1, 2]);
        let ins = insert(&mut t, mine.node, &[3], &[12]);
        assert_ne!(ins.node, mine.node, "shared by two requests: not extended in place");
        assert_eq!(path_seqs(&t, ins.node), vec![10, 11, 12]);
        t.unlock(other.node);
        // Locked only by this request now: it grows in place.
        let mine2 = match_lock(&mut t, &[1, 2, 3]);
        t.unlock(mine.node);
        let ins2 = insert(&mut t, mine2.node, &[4], &[13]);
        assert_eq!(ins2.node, mine2.node);
        assert_eq!(t.last_seq(ins2.node), 13);
    }

    #[test]
    fn eviction_takes_least_recently_used_leaves_and_trims_large_ones() {
        // Three requests in turn; the third splits [1,2,3] after [1,2].
        let mut t = tree_with(&[(&[1, 2, 3], &[10, 11, 12]), (&[5, 6], &[20, 21]), (&[1, 2, 7], &[0, 0, 30])]);
        // Leaves: [3] (first request), [5,6], [7]. Lock the [5,6] path.
        let m = match_lock(&mut t, &[5, 6]);
        let mut freed = Vec::new();
        // One page from the least recently used unlocked leaf ([3]).
        assert_eq!(t.evict(4, &mut freed), 4);
        assert_eq!(freed, vec![12]);
        // Next: leaf [7]; then [1,2] became a leaf and goes too — trimmed from its newest page.
        freed.clear();
        assert_eq!(t.evict(8, &mut freed), 8);
        assert_eq!(freed, vec![30, 11]);
        assert_eq!(t.peek(&runs(&[1, 2]), 2), 1);
        // The locked path survives any eviction.
        freed.clear();
        t.evict(1000, &mut freed);
        assert_eq!(freed, vec![10]);
        assert_eq!(t.peek(&runs(&[5, 6]), 2), 2);
        t.unlock(m.node);
        freed.clear();
        assert_eq!(t.evict(1000, &mut freed), 8);
        assert_eq!(freed, vec![20, 21]);
    }

    #[test]
    fn trimming_cuts_runs_from_the_end() {
        let mut t = tree_with(&[(&[1, 1, 1, 2, 2, 2], &[1, 2, 3, 4, 5, 6])]);
        let mut freed = Vec::new();
        assert_eq!(t.evict(4 * 4, &mut freed), 16);
        assert_eq!(freed, vec![3, 4, 5, 6]);
        assert_eq!(t.peek(&runs(&[1, 1, 1, 2]), 4), 2);
        let node = t.match_and_lock(&runs(&[1, 1]), 2).node;
        assert_eq!(t.nodes[node as usize].keys, vec![Run { key: 1, n: 2 }]);
    }

    #[test]
    fn without_sequence_hashes_nothing_is_reported() {
        let mut t = RadixCache::new(1, false);
        t.insert(ROOT, &runs(&[4, 4, 4]), &[]);
        let mut freed = Vec::new();
        assert_eq!(t.evict(2, &mut freed), 2);
        assert!(freed.is_empty());
        assert_eq!(t.evictable_tokens(), 1);
    }

    #[test]
    fn leaves_are_ordered_by_operation_not_by_creation() {
        // Leaves created in the order 1, 2, 3; then 1 is matched again: it is the most recent.
        let mut t = RadixCache::new(4, true);
        for (k, v) in [(1u64, 10u64), (2, 20), (3, 30)] {
            insert(&mut t, ROOT, &[k], &[v]);
        }
        let m = match_lock(&mut t, &[1]);
        t.unlock(m.node);
        let mut freed = Vec::new();
        t.evict(8, &mut freed);
        assert_eq!(freed, vec![20, 30]);
    }

    #[test]
    fn an_insertion_marks_its_whole_path_as_used() {
        // [1] then [1,2] (a child of [1] after a split by [1,3]); [9] is inserted later.
        let mut t = tree_with(&[(&[1, 2], &[10, 11]), (&[1, 3], &[0, 13])]);
        insert(&mut t, ROOT, &[9], &[90]);
        // Extending [1,3]'s leaf touches [1] too, so [1,2]'s leaf is the oldest, then [9].
        let m = match_lock(&mut t, &[1, 3]);
        insert(&mut t, m.node, &[4], &[14]);
        t.unlock(m.node);
        let mut freed = Vec::new();
        t.evict(8, &mut freed);
        assert_eq!(freed, vec![11, 90]);
    }

    #[test]
    fn page_pool_counts_pages() {
        let mut pool = PagePool::new(3);
        assert!(pool.alloc(2));
        pool.free(1);
        assert_eq!(pool.available(), 2);
        assert!(pool.alloc(2));
        assert!(!pool.alloc(1));
        assert_eq!((pool.available(), pool.total()), (0, 3));
    }
}
