//! The blocks of the requests active on one target, as a radix tree of their hash chains.
//!
//! A request's sequence hashes form a chain from the root (a block's hash names its whole
//! prefix), so the active blocks of a target are the union of chains: a tree. Stored as a radix
//! tree, each node holds a run of consecutive hashes (its label) that the same requests pass
//! through, with their number (holders). Adding, removing or matching a chain then costs one
//! edge lookup per node on its path, plus a comparison of the hashes it shares with the tree,
//! instead of one hash-map probe per block: the requests of a trace rarely share more than a
//! short prefix.
//!
//! Every chain ends on a node boundary (a node is split where a chain ends or leaves it), so
//! the holders of a node are the same along its whole label, and a chain is named by the node
//! it ends in: splits give the head of a node a new slot and leave its end where it was, so
//! that node stays the chain's end until the chain is removed (from it, up to the root).

use rustc_hash::FxHashMap;

/// The parent of the top-level nodes.
const ROOT: u32 = u32::MAX;

#[derive(Clone, Debug, Default)]
struct Node {
    label: Vec<u64>,
    parent: u32,
    /// Active chains passing through this node (0: the slot is free).
    holders: u32,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct ChainTree {
    nodes: Vec<Node>,
    /// Free slots of `nodes` (their label vectors are kept for reuse).
    free: Vec<u32>,
    /// (parent, first hash of the child's label) → child.
    edges: FxHashMap<(u32, u64), u32>,
    /// Distinct blocks held: Σ label lengths.
    blocks: u64,
}

/// Length of the common prefix of two hash runs.
fn common_prefix(a: &[u64], b: &[u64]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl ChainTree {
    /// Distinct blocks of the active chains.
    pub(crate) fn blocks(&self) -> u64 {
        self.blocks
    }

    /// Number of leading hashes of `chain` the tree holds.
    pub(crate) fn matched(&self, chain: &[u64]) -> usize {
        let (mut parent, mut i) = (ROOT, 0);
        while i < chain.len() {
            let Some(&node) = self.edges.get(&(parent, chain[i])) else { break };
            let label = &self.nodes[node as usize].label;
            let m = common_prefix(label, &chain[i..]);
            i += m;
            if m < label.len() {
                break;
            }
            parent = node;
        }
        i
    }

    /// Adds an active chain; returns the node it ends in (None for an empty chain), which
    /// [`ChainTree::remove`] takes.
    pub(crate) fn add(&mut self, chain: &[u64]) -> Option<u32> {
        let (mut parent, mut i) = (ROOT, 0);
        while i < chain.len() {
            let Some(&node) = self.edges.get(&(parent, chain[i])) else {
                let leaf = self.alloc(&chain[i..], parent, 1);
                self.edges.insert((parent, chain[i]), leaf);
                self.blocks += (chain.len() - i) as u64;
                return Some(leaf);
            };
            let label = &self.nodes[node as usize].label;
            let m = common_prefix(label, &chain[i..]);
            let node = if m < label.len() { self.split(parent, node, m) } else { node };
            self.nodes[node as usize].holders += 1;
            i += m;
            parent = node;
        }
        (parent != ROOT).then_some(parent)
    }

    /// Removes one holder of the chain that ends in `end`; nodes left without holders go.
    pub(crate) fn remove(&mut self, end: u32) {
        let mut node = end;
        while node != ROOT {
            let n = &mut self.nodes[node as usize];
            n.holders -= 1;
            if n.holders == 0 {
                // Nothing below it is held either: its only holder was this chain.
                self.blocks -= n.label.len() as u64;
                self.edges.remove(&(n.parent, n.label[0]));
                self.free.push(node);
            }
            node = n.parent;
        }
    }

    /// A node holding `label` under `parent`, in a free slot if there is one.
    fn alloc(&mut self, label: &[u64], parent: u32, holders: u32) -> u32 {
        match self.free.pop() {
            Some(slot) => {
                let n = &mut self.nodes[slot as usize];
                n.label.clear();
                n.label.extend_from_slice(label);
                n.parent = parent;
                n.holders = holders;
                slot
            }
            None => {
                self.nodes.push(Node { label: label.to_vec(), parent, holders });
                (self.nodes.len() - 1) as u32
            }
        }
    }

    /// Splits `node` (a child of `parent`) after its first `at` hashes: a new node takes that
    /// head and its place under `parent`, and `node` keeps the rest and its children. Returns
    /// the head.
    fn split(&mut self, parent: u32, node: u32, at: usize) -> u32 {
        let (holders, first) = {
            let n = &self.nodes[node as usize];
            (n.holders, n.label[0])
        };
        // The head's label is copied out before `alloc` may grow `nodes`.
        let head_label = self.nodes[node as usize].label[..at].to_vec();
        let head = self.alloc(&head_label, parent, holders);
        let n = &mut self.nodes[node as usize];
        n.label.drain(..at);
        n.parent = head;
        let rest = n.label[0];
        self.edges.insert((parent, first), head);
        self.edges.insert((head, rest), node);
        head
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the tree must agree with: a holder count per block.
    #[derive(Default)]
    struct Model(FxHashMap<u64, u32>);

    impl Model {
        fn add(&mut self, chain: &[u64]) {
            for &h in chain {
                *self.0.entry(h).or_insert(0) += 1;
            }
        }
        fn remove(&mut self, chain: &[u64]) {
            for h in chain {
                let c = self.0.get_mut(h).unwrap();
                *c -= 1;
                if *c == 0 {
                    self.0.remove(h);
                }
            }
        }
        fn matched(&self, chain: &[u64]) -> usize {
            chain.iter().take_while(|h| self.0.contains_key(h)).count()
        }
    }

    #[test]
    fn splits_at_chain_ends_and_branches() {
        let mut t = ChainTree::default();
        assert_eq!(t.add(&[]), None);
        let long = t.add(&[1, 2, 3, 4]).unwrap();
        let short = t.add(&[1, 2]).unwrap();
        let branch = t.add(&[1, 2, 5]).unwrap();
        assert_eq!(t.blocks(), 5);
        assert_eq!((t.matched(&[1, 2, 3, 9]), t.matched(&[1, 2, 5, 6]), t.matched(&[7])), (3, 3, 0));
        t.remove(long);
        assert_eq!((t.blocks(), t.matched(&[1, 2, 3])), (3, 2));
        t.remove(short);
        assert_eq!(t.blocks(), 3, "[1, 2, 5] still holds its prefix");
        assert_eq!(t.add(&[1, 2, 5]), Some(branch), "the same chain ends in the same node");
        t.remove(branch);
        t.remove(branch);
        assert_eq!((t.blocks(), t.matched(&[1])), (0, 0));
        assert!(t.edges.is_empty());
    }

    #[test]
    fn agrees_with_a_count_per_block() {
        // Chains from a small tree of prompts (shared heads, branches, prefixes of each other),
        // added and removed in a scrambled order, the same chain sometimes twice.
        let chain = |step: u64| -> Vec<u64> {
            let (branch, len) = (step % 5, (step * 7) % 12);
            (0..len)
                .map(|i| {
                    if i < 3 {
                        i + 1
                    } else if i < 6 {
                        100 + branch % 2 * 10 + i
                    } else {
                        branch * 1000 + i
                    }
                })
                .collect()
        };
        let (mut tree, mut model, mut live) = (ChainTree::default(), Model::default(), Vec::new());
        for step in 0..500u64 {
            let c = chain(step);
            let probe = chain(step + 3);
            assert_eq!(tree.matched(&probe), model.matched(&probe), "step {step}");
            let end = tree.add(&c);
            model.add(&c);
            live.push((c, end));
            if step % 3 != 0 {
                let (gone, end) = live.swap_remove((step as usize * 5) % live.len());
                if let Some(end) = end {
                    tree.remove(end);
                }
                model.remove(&gone);
            }
            assert_eq!(tree.blocks(), model.0.len() as u64, "step {step}");
        }
        for end in live.drain(..).filter_map(|(_, end)| end) {
            tree.remove(end);
        }
        assert_eq!(tree.blocks(), 0);
        assert!(tree.edges.is_empty());
    }
}
