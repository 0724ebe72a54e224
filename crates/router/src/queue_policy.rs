//! The order in which the router's queue releases requests: a leaf that the configuration and
//! the policy classes both name.

/// Order in which queued requests are released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueuePolicy {
    /// First come, first served (priority moves a request earlier by `priority` seconds).
    Fcfs,
    /// Last come, first served: a deliberately bad policy for comparisons.
    Lcfs,
    /// Weighted shortest processing time (Smith's rule): short prompts first.
    Wspt,
}
