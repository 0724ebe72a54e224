//! Host (G2) KV offload: a framework-neutral host cache with virtual-time transfers.
//!
//! This is the mechanism under Dynamo 1.6.1's vLLM `native_host_offload` (see
//! `docs/host-offload.md`): capacity in blocks, LRU eviction with recency epochs, entries
//! pinned while stored or loaded, and transfer timing. A private (per-DP-rank) cache moves
//! blocks over two FIFO lanes ([`FifoLane`], one per direction); a cluster-shared pool divides
//! its links by processor sharing ([`FairLink`]). The vLLM policy that decides which blocks to
//! store, look up and load, and when, belongs to the scheduler that drives [`HostTier`].

mod fair;
mod g3;
mod lane;
mod lru;
mod tier;

#[cfg(test)]
mod tests;

pub use fair::FairLink;
pub use g3::{Direction, G3Completion, G3IoStats, G3Stats, G3Tier, G3TierConfig, Probe};
pub use lane::{bytes_per_ms, FifoLane};
pub use tier::{Completed, HostStats, HostTier, HostTierConfig, Kind, Lookup, StoreOutcome, TransferId};

/// A block's identity in both device and host caches: its sequence hash.
pub type BlockKey = u64;
