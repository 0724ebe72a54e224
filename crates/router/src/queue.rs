//! The router's pending queue: requests wait here while every target is busy prefilling, and
//! are released (and routed with fresh state) as load drains.
//!
//! The queue is one heap per policy class ([`crate::policy`]). Within a class, requests are
//! ordered by `strict_priority` tier first (higher first), then by the class's policy key, then
//! by arrival. Across classes, releases follow deficit round robin: visiting a class with a
//! releasable head grants it `quantum` tokens of credit (once per round) and releasing a request
//! spends its uncached prompt tokens (at least 1); a class left with credit is looked at first
//! on the next release; when no head is affordable after a full round, every class with a
//! releasable head is granted as many whole rounds as the closest one needs. A class whose queue
//! empties loses its credit.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::policy::{PolicyClass, PolicyProfile};
use crate::queue_policy::QueuePolicy;

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
    /// Prompt tokens the best eligible target had cached when the request was queued.
    pub cached_tokens: u32,
    /// Each target's cached prefix when the request was queued: Dynamo scores a released
    /// request on these, with fresh loads.
    pub overlaps: Vec<crate::CachedPrefix>,
}

impl Pending {
    /// What releasing this request costs its class: its uncached prompt tokens, at least 1.
    pub fn cost(&self) -> u64 {
        (self.isl.saturating_sub(self.cached_tokens) as u64).max(1)
    }
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

#[derive(Default)]
struct ClassQueue {
    heap: BinaryHeap<Entry>,
    deficit: u64,
    raw_isl_tokens: u64,
    cached_tokens: u64,
}

/// A request refused because its class's queue is full.
#[derive(Clone, Debug, PartialEq)]
pub struct QueueRejection {
    pub class: String,
    /// `requests`, `raw_isl_tokens` or `cached_tokens`.
    pub limit_kind: &'static str,
    pub current: u64,
    pub limit: u64,
}

impl std::fmt::Display for QueueRejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "router policy class {:?} queue {} limit reached (current={}, limit={})",
            self.class, self.limit_kind, self.current, self.limit
        )
    }
}

pub struct RouterQueue {
    profile: PolicyProfile,
    classes: Vec<ClassQueue>,
    /// Where the next round-robin scan starts (the class after the last one released from).
    cursor: usize,
    /// A class that kept credit after its last release, looked at first.
    carry: Option<usize>,
    seq: u64,
    len: usize,
}

impl RouterQueue {
    pub fn new(profile: PolicyProfile) -> Self {
        let classes = profile.classes().iter().map(|_| ClassQueue::default()).collect();
        RouterQueue { profile, classes, cursor: 0, carry: None, seq: 0, len: 0 }
    }

    pub fn profile(&self) -> &PolicyProfile {
        &self.profile
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Requests waiting in class `class`.
    pub fn class_len(&self, class: usize) -> usize {
        self.classes[class].heap.len()
    }

    /// Queues `p` in class `class`, unless one of the class's limits (each per target, times
    /// `targets`) is already reached; the request that reaches a limit is still taken.
    pub fn push(&mut self, class: usize, targets: usize, p: Pending) -> Result<(), QueueRejection> {
        let cfg = self.profile.class(class);
        let q = &self.classes[class];
        for (kind, current, per_target) in [
            ("requests", q.heap.len() as u64, cfg.request_queue_limit_per_worker),
            ("raw_isl_tokens", q.raw_isl_tokens, cfg.raw_isl_token_queue_limit_per_worker),
            ("cached_tokens", q.cached_tokens, cfg.cached_token_queue_limit_per_worker),
        ] {
            if let Some(limit) = per_target.map(|l| l.saturating_mul(targets as u64)) {
                if current >= limit {
                    return Err(QueueRejection { class: cfg.name.clone(), limit_kind: kind, current, limit });
                }
            }
        }
        // A priority of n moves a request as if it had arrived n seconds earlier.
        let bump_ms = p.priority.max(0) as f64 * 1000.0;
        let key = match cfg.queue_policy {
            QueuePolicy::Fcfs => p.arrival_ms - bump_ms,
            QueuePolicy::Lcfs => -(p.arrival_ms + bump_ms),
            // Smith's rule: highest weight per unit of work (uncached prompt tokens) first.
            QueuePolicy::Wspt => -(1.0 + p.priority.max(0) as f64) / p.cost() as f64,
        };
        self.seq += 1;
        let q = &mut self.classes[class];
        q.raw_isl_tokens += p.isl as u64;
        q.cached_tokens += p.cached_tokens.min(p.isl) as u64;
        q.heap.push(Entry { tier: p.strict_priority, key, seq: self.seq, pending: p });
        self.len += 1;
        Ok(())
    }

    /// The cost of class `class`'s head, if it has one that `releasable` allows out now.
    fn candidate(&self, class: usize, releasable: &mut impl FnMut(&PolicyClass) -> bool) -> Option<u64> {
        let head = self.classes[class].heap.peek()?;
        releasable(self.profile.class(class)).then(|| head.pending.cost())
    }

    /// Releases the next request by deficit round robin over the classes whose head
    /// `releasable` (given the class) allows out now; None when no class may release.
    pub fn pop(&mut self, mut releasable: impl FnMut(&PolicyClass) -> bool) -> Option<Pending> {
        if self.len == 0 {
            self.carry = None;
            return None;
        }
        let n = self.classes.len();
        let mut candidates: Vec<Option<u64>> = vec![None; n];
        let carried = self.carry.take();
        if let Some(c) = carried {
            let cost = self.candidate(c, &mut releasable);
            if cost.is_some_and(|cost| cost <= self.classes[c].deficit) {
                return Some(self.release(c));
            }
            candidates[c] = cost;
        }
        for offset in 0..n {
            let c = (self.cursor + offset) % n;
            let cost = if carried == Some(c) { candidates[c] } else { self.candidate(c, &mut releasable) };
            let Some(cost) = cost else {
                if self.classes[c].heap.is_empty() {
                    self.classes[c].deficit = 0;
                }
                continue;
            };
            candidates[c] = Some(cost);
            // Credit is granted once per round: spend what is left before earning more.
            if cost <= self.classes[c].deficit {
                return Some(self.release(c));
            }
            let quantum = self.profile.class(c).quantum;
            self.classes[c].deficit = self.classes[c].deficit.saturating_add(quantum);
            if cost <= self.classes[c].deficit {
                return Some(self.release(c));
            }
        }
        // No head affordable after a round: grant every candidate class the fewest whole rounds
        // that make some head affordable (each class at its own quantum), then scan again.
        let rounds = (0..n)
            .filter_map(|c| {
                let cost = candidates[c]?;
                Some(cost.saturating_sub(self.classes[c].deficit).div_ceil(self.profile.class(c).quantum))
            })
            .min()?;
        for (c, q) in self.classes.iter_mut().enumerate() {
            if candidates[c].is_some() {
                let grant = self.profile.class(c).quantum.saturating_mul(rounds);
                q.deficit = q.deficit.saturating_add(grant);
            }
        }
        let c = (0..n)
            .map(|o| (self.cursor + o) % n)
            .find(|&c| candidates[c].is_some_and(|cost| cost <= self.classes[c].deficit))?;
        Some(self.release(c))
    }

    fn release(&mut self, c: usize) -> Pending {
        self.cursor = (c + 1) % self.classes.len();
        let q = &mut self.classes[c];
        let p = q.heap.pop().expect("a candidate class has a head").pending;
        q.deficit = q.deficit.saturating_sub(p.cost());
        q.raw_isl_tokens -= p.isl as u64;
        q.cached_tokens -= p.cached_tokens.min(p.isl) as u64;
        self.len -= 1;
        if q.heap.is_empty() {
            q.deficit = 0;
        } else if q.deficit > 0 {
            self.carry = Some(c);
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::PolicyConfig;

    fn p(id: u64, arrival: f64, isl: u32, priority: i32, strict: u32) -> Pending {
        Pending {
            id,
            hashes: vec![],
            isl,
            priority,
            strict_priority: strict,
            arrival_ms: arrival,
            queued_at_ms: arrival,
            cached_tokens: 0,
            overlaps: vec![],
        }
    }

    fn drain(q: &mut RouterQueue) -> Vec<u64> {
        std::iter::from_fn(|| q.pop(|_| true)).map(|p| p.id).collect()
    }

    fn order(policy: QueuePolicy, items: Vec<Pending>) -> Vec<u64> {
        let mut q = RouterQueue::new(PolicyProfile::synthetic(Some(0.0), policy));
        for i in items {
            q.push(0, 1, i).unwrap();
        }
        drain(&mut q)
    }

    /// Two classes, `a` and `b`, with these quanta, both queueing.
    fn two_classes(qa: u64, qb: u64, extra: &str) -> RouterQueue {
        let yaml = format!(
            "default_policy_family: a\nuncached_isl_buckets: [{{min_tokens: 0, bucket: all}}]\npolicy_classes:\n  \
             - {{name: a, policy_family: a, cache_bucket: all, quantum: {qa}, prefill_busy_threshold: 0{extra}}}\n  \
             - {{name: b, policy_family: b, cache_bucket: all, quantum: {qb}, prefill_busy_threshold: 0}}\n"
        );
        RouterQueue::new(PolicyConfig::from_yaml(&yaml).unwrap().profile(None).unwrap().clone())
    }

    #[test]
    fn policies_order_requests() {
        let items = || vec![p(1, 0.0, 900, 0, 0), p(2, 10.0, 100, 0, 0), p(3, 20.0, 500, 0, 0)];
        assert_eq!(order(QueuePolicy::Fcfs, items()), vec![1, 2, 3]);
        assert_eq!(order(QueuePolicy::Lcfs, items()), vec![3, 2, 1]);
        assert_eq!(order(QueuePolicy::Wspt, items()), vec![2, 3, 1]);
        // wspt weighs the uncached prompt: 900 tokens with 850 cached are the shortest work.
        let mut cached = items();
        cached[0].cached_tokens = 850;
        assert_eq!(order(QueuePolicy::Wspt, cached), vec![1, 2, 3]);
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

    #[test]
    fn deficit_round_robin_spends_credit_before_earning_more() {
        // Unit costs, quanta 1 and 3: a class keeps its leftover credit and is looked at first
        // on the next release, so b releases three in a row per round, a one.
        let mut q = two_classes(1, 3, "");
        for i in 0..4 {
            q.push(0, 1, p(10 + i, i as f64, 1, 0, 0)).unwrap();
            q.push(1, 1, p(20 + i, i as f64, 1, 0, 0)).unwrap();
        }
        assert_eq!(drain(&mut q), vec![10, 20, 21, 22, 11, 23, 12, 13]);
        assert!(q.is_empty());
    }

    #[test]
    fn deficit_round_robin_costs_uncached_prompt_tokens() {
        // Quanta 100 and 300 tokens, every request 200 uncached tokens: b affords one in its
        // first round, a needs two rounds; once b is empty, a is granted whole rounds at once.
        let mut q = two_classes(100, 300, "");
        for i in 0..4 {
            q.push(0, 1, p(10 + i, i as f64, 200, 0, 0)).unwrap();
            q.push(1, 1, p(20 + i, i as f64, 200, 0, 0)).unwrap();
        }
        assert_eq!(drain(&mut q), vec![20, 10, 21, 22, 23, 11, 12, 13]);
        // Cached tokens are free: 1000 tokens with 999 cached cost 1, so a releases first.
        let mut q = two_classes(1, 1, "");
        q.push(1, 1, p(2, 0.0, 10, 0, 0)).unwrap();
        q.push(0, 1, Pending { cached_tokens: 999, ..p(1, 1.0, 1000, 0, 0) }).unwrap();
        assert_eq!(drain(&mut q), vec![1, 2]);
    }

    #[test]
    fn a_class_that_may_not_release_is_passed_over() {
        let mut q = two_classes(1, 1, "");
        q.push(0, 1, p(1, 0.0, 1, 0, 0)).unwrap();
        q.push(1, 1, p(2, 1.0, 1, 0, 0)).unwrap();
        let only_b = |c: &PolicyClass| c.name == "b";
        assert_eq!(q.pop(only_b).map(|p| p.id), Some(2));
        assert_eq!(q.pop(only_b).map(|p| p.id), None, "a waits while its targets are busy");
        assert_eq!(q.len(), 1);
        assert_eq!(q.pop(|_| true).map(|p| p.id), Some(1));
        assert_eq!(q.pop(|_| true).map(|p| p.id), None);
    }

    #[test]
    fn limits_scale_with_targets_and_count_what_is_already_queued() {
        let mut q = two_classes(1, 1, ", request_queue_limit_per_worker: 2");
        for i in 0..4 {
            q.push(0, 2, p(i, 0.0, 1, 0, 0)).unwrap();
        }
        let e = q.push(0, 2, p(9, 0.0, 1, 0, 0)).unwrap_err();
        assert_eq!(e.to_string(), "router policy class \"a\" queue requests limit reached (current=4, limit=4)");
        q.push(1, 2, p(9, 0.0, 1, 0, 0)).expect("other classes have their own limits");
        q.pop(|c| c.name == "a").unwrap();
        q.push(0, 2, p(10, 0.0, 1, 0, 0)).expect("room again after a release");

        let mut q =
            two_classes(1, 1, ", raw_isl_token_queue_limit_per_worker: 100, cached_token_queue_limit_per_worker: 50");
        q.push(0, 1, p(1, 0.0, 60, 0, 0)).unwrap();
        q.push(0, 1, p(2, 0.0, 60, 0, 0)).expect("the request that crosses a limit is taken");
        assert_eq!(q.push(0, 1, p(3, 0.0, 1, 0, 0)).unwrap_err().limit_kind, "raw_isl_tokens");
        let mut q = two_classes(1, 1, ", cached_token_queue_limit_per_worker: 50");
        q.push(0, 1, Pending { cached_tokens: 50, ..p(1, 0.0, 60, 0, 0) }).unwrap();
        let e = q.push(0, 1, p(2, 0.0, 60, 0, 0)).unwrap_err();
        assert_eq!((e.limit_kind, e.current, e.limit), ("cached_tokens", 50, 50));
    }
}
