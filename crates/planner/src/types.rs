//! What the planner observes: forward-pass snapshots per (worker, rank), traffic windows and
//! worker counts; and the engine limits it sizes against.

/// Scheduled batch of one rank's last forward pass (`ForwardPassMetrics.scheduled_requests`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Scheduled {
    pub num_prefill_requests: u32,
    pub sum_prefill_tokens: u32,
    pub var_prefill_length: f64,
    pub sum_prefill_kv_tokens: u32,
    pub num_decode_requests: u32,
    pub sum_decode_kv_tokens: u32,
    pub var_decode_kv_tokens: f64,
}

/// What waits in one rank's queue (`ForwardPassMetrics.queued_requests`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Queued {
    pub num_prefill_requests: u32,
    pub sum_prefill_tokens: u32,
    pub var_prefill_length: f64,
    pub num_decode_requests: u32,
    pub sum_decode_kv_tokens: u32,
    pub var_decode_kv_tokens: f64,
}

/// One (worker, attention-DP rank) forward-pass snapshot.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Fpm {
    pub worker: u32,
    pub dp_rank: u32,
    /// Duration of the last pass, seconds.
    pub wall_time: f64,
    pub scheduled: Scheduled,
    pub queued: Queued,
}

/// Traffic of one window (or several merged), as the replay adapter reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Traffic {
    pub duration_s: f64,
    /// Offered arrivals.
    pub num_req: f64,
    /// Mean ISL / OSL of the completed requests, weighted by `shape_count`.
    pub avg_isl: f64,
    pub avg_osl: f64,
    pub shape_count: f64,
    pub avg_ttft_ms: f64,
    pub ttft_count: f64,
    pub avg_itl_ms: f64,
    pub itl_count: f64,
    pub avg_kv_hit_rate: f64,
    pub hit_rate_count: f64,
    pub avg_accept_length: Option<f64>,
    pub accept_length_count: f64,
}

fn weighted(a: f64, wa: f64, b: f64, wb: f64) -> f64 {
    let w = wa + wb;
    if w > 0.0 {
        (a * wa + b * wb) / w
    } else {
        0.0
    }
}

impl Traffic {
    /// `_merge_traffic`: durations, arrivals and counts add; each mean is weighted by its own
    /// count.
    pub fn merge(&self, next: &Traffic) -> Traffic {
        Traffic {
            duration_s: self.duration_s + next.duration_s,
            num_req: self.num_req + next.num_req,
            avg_isl: weighted(self.avg_isl, self.shape_count, next.avg_isl, next.shape_count),
            avg_osl: weighted(self.avg_osl, self.shape_count, next.avg_osl, next.shape_count),
            shape_count: self.shape_count + next.shape_count,
            avg_ttft_ms: weighted(self.avg_ttft_ms, self.ttft_count, next.avg_ttft_ms, next.ttft_count),
            ttft_count: self.ttft_count + next.ttft_count,
            avg_itl_ms: weighted(self.avg_itl_ms, self.itl_count, next.avg_itl_ms, next.itl_count),
            itl_count: self.itl_count + next.itl_count,
            avg_kv_hit_rate: weighted(
                self.avg_kv_hit_rate,
                self.hit_rate_count,
                next.avg_kv_hit_rate,
                next.hit_rate_count,
            ),
            hit_rate_count: self.hit_rate_count + next.hit_rate_count,
            avg_accept_length: match (self.avg_accept_length, next.avg_accept_length) {
                (None, None) => None,
                (Some(a), None) => Some(a),
                (None, Some(b)) => Some(b),
                (Some(a), Some(b)) => Some(weighted(a, self.accept_length_count, b, next.accept_length_count)),
            },
            accept_length_count: self.accept_length_count + next.accept_length_count,
        }
    }
}

/// Engine limits of one role (`_engine_caps`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EngineCaps {
    pub max_num_batched_tokens: u64,
    pub max_num_seqs: u64,
    /// `num_gpu_blocks · block_size · dp_size`.
    pub max_kv_tokens: u64,
    pub context_length: u64,
    pub dp_size: u32,
}

/// The cluster as a tick sees it. Aggregated deployments report their workers as decode.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    pub now_s: f64,
    /// Workers taking requests (ready, not draining), per role.
    pub active_prefill: Vec<u32>,
    pub active_decode: Vec<u32>,
    pub starting_prefill: Vec<u32>,
    pub starting_decode: Vec<u32>,
    pub draining_prefill: Vec<u32>,
    pub draining_decode: Vec<u32>,
    pub prefill_fpms: Vec<Fpm>,
    pub decode_fpms: Vec<Fpm>,
    /// Traffic since the previous tick.
    pub traffic: Traffic,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merging_weights_each_mean_by_its_own_count() {
        let a = Traffic {
            duration_s: 5.0,
            num_req: 10.0,
            avg_isl: 1000.0,
            avg_osl: 100.0,
            shape_count: 8.0,
            avg_ttft_ms: 200.0,
            ttft_count: 9.0,
            avg_kv_hit_rate: 0.5,
            hit_rate_count: 10.0,
            avg_accept_length: None,
            ..Traffic::default()
        };
        let b = Traffic {
            duration_s: 5.0,
            num_req: 4.0,
            avg_isl: 2000.0,
            avg_osl: 300.0,
            shape_count: 2.0,
            avg_ttft_ms: 0.0,
            ttft_count: 0.0,
            avg_kv_hit_rate: 0.0,
            hit_rate_count: 0.0,
            avg_accept_length: Some(1.5),
            accept_length_count: 3.0,
            ..Traffic::default()
        };
        let m = a.merge(&b);
        assert_eq!((m.duration_s, m.num_req, m.shape_count), (10.0, 14.0, 10.0));
        // (1000·8 + 2000·2) / 10 = 1200; (100·8 + 300·2) / 10 = 140.
        assert_eq!((m.avg_isl, m.avg_osl), (1200.0, 140.0));
        assert_eq!(m.avg_ttft_ms, 200.0, "a window with no TTFT samples does not dilute the mean");
        assert_eq!(m.avg_kv_hit_rate, 0.5);
        assert_eq!(m.avg_accept_length, Some(1.5), "one side None: the other");
        assert_eq!(Traffic::default().merge(&Traffic::default()).avg_isl, 0.0, "zero weight gives 0");
    }
}
