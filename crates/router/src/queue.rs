//! The router's pending queue: requests wait here while every worker is busy prefilling, and
//! are released as load drains (routed with the load of that moment and the cache overlap they
//! saw when queued).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::config::QueuePolicy;

/// A request waiting in the router.
#[derive(Clone, Debug)]
pub struct Pending {
    pub id: u64,
    pub hashes: Vec<u64>,
    pub isl: u32,
    pub priority: i32,
    pub strict_priority: u32,
    pub arrival_ms: f64,
    pub queued_at_ms: f64,
    /// Prefix blocks each target had cached when the request was queued: Dynamo scores a
    /// released request with the load of the moment but the cache overlap it saw on arrival.
    pub overlaps: Vec<u32>,
}

struct Entry {
    /// Compared first, higher first.
    tier: u32,
    /// Compared next, lower first.
    key: f64,
    /// Arrival order breaks ties.
    seq: u64,
    pending: Pending,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    /// Greatest = released first (BinaryHeap is a max-heap).
    fn cmp(&self, other: &Self) -> Ordering {
        self.tier.cmp(&other.tier).then_with(|| other.key.total_cmp(&self.key)).then_with(|| other.seq.cmp(&self.seq))
    }
}

pub struct RouterQueue {
    policy: QueuePolicy,
    heap: BinaryHeap<Entry>,
    seq: u64,
}

impl RouterQueue {
    pub fn new(policy: QueuePolicy) -> Self {
        RouterQueue { policy, heap: BinaryHeap::new(), seq: 0 }
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    pub fn push(&mut self, p: Pending) {
        // A priority of n moves a request as if it had arrived n seconds earlier.
        let bump_ms = p.priority.max(0) as f64 * 1000.0;
        let key = match self.policy {
            QueuePolicy::Fcfs => p.arrival_ms - bump_ms,
            QueuePolicy::Lcfs => -(p.arrival_ms + bump_ms),
            // Smith's rule: highest weight per unit of work first.
            QueuePolicy::Wspt => -(1.0 + p.priority.max(0) as f64) / (p.isl.max(1) as f64),
        };
        self.seq += 1;
        self.heap.push(Entry { tier: p.strict_priority, key, seq: self.seq, pending: p });
    }

    pub fn pop(&mut self) -> Option<Pending> {
        self.heap.pop().map(|e| e.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(id: u64, arrival: f64, isl: u32, priority: i32, strict: u32) -> Pending {
        Pending {
            id,
            hashes: vec![],
            isl,
            priority,
            strict_priority: strict,
            arrival_ms: arrival,
            queued_at_ms: arrival,
            overlaps: vec![],
        }
    }

    fn order(policy: QueuePolicy, items: Vec<Pending>) -> Vec<u64> {
        let mut q = RouterQueue::new(policy);
        for i in items {
            q.push(i);
        }
        std::iter::from_fn(|| q.pop()).map(|p| p.id).collect()
    }

    #[test]
    fn policies_order_requests() {
        let items = || vec![p(1, 0.0, 900, 0, 0), p(2, 10.0, 100, 0, 0), p(3, 20.0, 500, 0, 0)];
        assert_eq!(order(QueuePolicy::Fcfs, items()), vec![1, 2, 3]);
        assert_eq!(order(QueuePolicy::Lcfs, items()), vec![3, 2, 1]);
        assert_eq!(order(QueuePolicy::Wspt, items()), vec![2, 3, 1]);
    }

    #[test]
    fn priorities_bump_and_strict_tiers_dominate() {
        // Priority 1 counts as arriving a second earlier.
        let items = vec![p(1, 0.0, 10, 0, 0), p(2, 500.0, 10, 1, 0), p(3, 2000.0, 10, 1, 0)];
        assert_eq!(order(QueuePolicy::Fcfs, items), vec![2, 1, 3]);
        let items = vec![p(1, 0.0, 10, 5, 0), p(2, 9e9, 10, 0, 1)];
        assert_eq!(order(QueuePolicy::Fcfs, items), vec![2, 1]);
        // Equal keys keep arrival order.
        let items = vec![p(1, 5.0, 10, 0, 0), p(2, 5.0, 10, 0, 0)];
        assert_eq!(order(QueuePolicy::Fcfs, items), vec![1, 2]);
    }
}
