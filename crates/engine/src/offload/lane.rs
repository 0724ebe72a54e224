//! One direction of a private host link: a FIFO queue with a fixed rate.

/// Decimal GB/s as bytes per millisecond; zero means unlimited.
pub fn bytes_per_ms(gbps: f64) -> f64 {
    if gbps == 0.0 {
        f64::INFINITY
    } else {
        gbps * 1e6
    }
}

/// A serial copy engine: a transfer starts once it is ready and the previous one has finished,
/// and then runs alone at the full rate. Completion times are fixed when a transfer is queued.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FifoLane {
    bytes_per_ms: f64,
    /// When the last queued transfer finishes.
    tail_ms: f64,
}

impl FifoLane {
    /// A lane of `gbps` decimal GB/s (zero: transfers take no time).
    pub fn new(gbps: f64) -> Self {
        Self { bytes_per_ms: bytes_per_ms(gbps), tail_ms: 0.0 }
    }

    /// Queue `bytes` that may start at `ready_ms`; returns when they have arrived.
    pub fn push(&mut self, ready_ms: f64, bytes: u64) -> f64 {
        let start = self.tail_ms.max(ready_ms);
        let duration = if self.bytes_per_ms.is_infinite() { 0.0 } else { bytes as f64 / self.bytes_per_ms };
        self.tail_ms = start + duration;
        self.tail_ms
    }

    /// When the lane is free again.
    pub fn tail_ms(&self) -> f64 {
        self.tail_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: u64 = 1_000_000_000;

    #[test]
    fn transfers_queue_behind_each_other() {
        let mut lane = FifoLane::new(1.0);
        assert_eq!(lane.push(0.0, GB), 1000.0);
        assert_eq!(lane.push(0.0, GB), 2000.0);
        // Ready after the tail: starts when ready, not when the lane went idle.
        assert_eq!(lane.push(2500.0, GB / 2), 3000.0);
    }

    #[test]
    fn first_byte_latency_overlaps_the_queue() {
        // Both transfers are ready 5 ms after submission; the second waits for the first anyway.
        let mut lane = FifoLane::new(1.0);
        assert_eq!(lane.push(5.0, GB), 1005.0);
        assert_eq!(lane.push(5.0, GB), 2005.0);
    }

    #[test]
    fn zero_bandwidth_is_unlimited() {
        let mut lane = FifoLane::new(0.0);
        assert_eq!(lane.push(7.0, u64::MAX), 7.0);
        assert_eq!(lane.push(3.0, GB), 7.0);
        assert_eq!(lane.tail_ms(), 7.0);
    }

    #[test]
    fn rates_are_decimal_gigabytes() {
        // 8 MiB (a 64-token block at 128 KiB per token) at the default 32 GB/s.
        let mut lane = FifoLane::new(32.0);
        assert_eq!(lane.push(0.0, 8 * 1024 * 1024), 8.0 * 1024.0 * 1024.0 / 32e6);
    }
}
