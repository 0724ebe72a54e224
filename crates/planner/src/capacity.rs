//! Per-engine capacity search (`core/perf_model/engine_query.py`): the sustainable request rate
//! of one engine for a request shape, searched over batch sizes against a forward-pass model.

use crate::types::{EngineCaps, Scheduled};

/// Batch candidates beyond which the search samples evenly.
pub const MAX_CANDIDATES: u64 = 128;
/// The largest prefix-cache hit rate the prefill discount trusts.
pub const MAX_KV_HIT_DISCOUNT: f64 = 0.95;
const U32_MAX: u64 = u32::MAX as u64;

/// Times one forward pass from per-attention-DP-rank batch statistics (ms), as
/// `forward_pass_time_ms` does (`ais-timing.md` §8).
pub trait PassModel {
    fn forward_pass_ms(&self, ranks: &[Scheduled]) -> Result<f64, String>;
}

/// Which engine is sized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Worker {
    Prefill,
    Decode,
    Aggregated,
}

/// A request shape and its SLA (seconds).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    pub isl: u64,
    pub osl: u64,
    pub ttft_sla_s: Option<f64>,
    pub itl_sla_s: Option<f64>,
    pub accept_length: f64,
    pub kv_hit_rate: Option<f64>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Capacity {
    pub rps: f64,
    pub ttft_s: Option<f64>,
    pub itl_s: Option<f64>,
    pub e2e_s: Option<f64>,
    pub eligible: bool,
}

/// 1..=max, or 128 evenly spaced values from 1 to max.
pub fn batch_sizes(max_batch: u64) -> Vec<u64> {
    if max_batch == 0 {
        return Vec::new();
    }
    if max_batch <= MAX_CANDIDATES {
        return (1..=max_batch).collect();
    }
    let span = max_batch - 1;
    (0..MAX_CANDIDATES).map(|i| 1 + i * span / (MAX_CANDIDATES - 1)).collect()
}

/// `isl · (1 − min(0.95, hit))`, rounded up, at least 1.
pub fn effective_prefill_isl(isl: u64, kv_hit_rate: Option<f64>) -> u64 {
    let hit = kv_hit_rate.filter(|h| h.is_finite()).unwrap_or(0.0).clamp(0.0, MAX_KV_HIT_DISCOUNT);
    let v = isl as f64 * (1.0 - hit);
    let c = if v <= 0.0 { 0 } else { v.ceil() as u64 };
    c.max(1)
}

/// Decode context of a request in the middle of its output: `isl + ⌊osl/2⌋`.
pub fn decode_context(isl: u64, osl: u64) -> u64 {
    (isl + osl / 2).clamp(1, U32_MAX)
}

fn accept(a: f64) -> f64 {
    if a.is_finite() && a > 1.0 {
        a
    } else {
        1.0
    }
}

fn sla_ok(v: Option<f64>, sla: Option<f64>) -> bool {
    match sla {
        None => true,
        Some(s) => v.is_some_and(|v| v <= s),
    }
}

/// `_select_capacity` (throughput objective): eligible beats ineligible, then the higher rps.
fn select(current: Option<Capacity>, c: Capacity) -> Capacity {
    match current {
        None => c,
        Some(cur) if !cur.eligible && c.eligible => c,
        Some(cur) if cur.eligible && !c.eligible => cur,
        Some(cur) => {
            if c.rps > cur.rps {
                c
            } else {
                cur
            }
        }
    }
}

fn split(total: u64, ranks: usize, rank: usize) -> u32 {
    let n = ranks.max(1) as u64;
    (total / n + u64::from((rank as u64) < total % n)).min(U32_MAX) as u32
}

/// The engine's forward-pass queries: synthetic batches split evenly over its DP ranks.
pub struct EngineQuery<'a> {
    pub model: &'a dyn PassModel,
    pub caps: EngineCaps,
    pub worker: Worker,
}

impl EngineQuery<'_> {
    fn dp(&self) -> usize {
        self.caps.dp_size.max(1) as usize
    }

    fn seconds(&self, ranks: &[Scheduled]) -> Result<f64, String> {
        let ms = self.model.forward_pass_ms(ranks)?;
        if !ms.is_finite() {
            return Err(format!("forward-pass estimate must be finite, got {ms}"));
        }
        Ok(ms.max(0.0) / 1000.0)
    }

    pub fn mixed_s(&self, prefill_tokens: u64, decode_requests: u64, decode_kv: u64) -> Result<f64, String> {
        let dp = self.dp();
        let ranks: Vec<Scheduled> = (0..dp)
            .map(|r| {
                let p = split(prefill_tokens, dp, r);
                Scheduled {
                    num_prefill_requests: u32::from(p > 0),
                    sum_prefill_tokens: p,
                    num_decode_requests: split(decode_requests, dp, r),
                    sum_decode_kv_tokens: split(decode_kv, dp, r),
                    ..Scheduled::default()
                }
            })
            .collect();
        self.seconds(&ranks)
    }

    /// Time of `tokens` prefill tokens chunked at MBT: full chunks, then the tail.
    fn chunked(&self, tokens: u64, chunk: impl Fn(u64) -> Result<f64, String>) -> Result<f64, String> {
        let mbt = self.caps.max_num_batched_tokens.max(1);
        let (full, tail) = (tokens / mbt, tokens % mbt);
        let mut total = 0.0;
        if full > 0 {
            total += chunk(mbt)? * full as f64;
        }
        if tail > 0 {
            total += chunk(tail)?;
        }
        Ok(total)
    }

    pub fn prefill_time_s(&self, tokens: u64) -> Result<f64, String> {
        self.chunked(tokens, |c| self.mixed_s(c, 0, 0))
    }

    pub fn decode_time_s(&self, batch: u64, kv: u64) -> Result<f64, String> {
        self.mixed_s(0, batch, kv)
    }

    fn decode_max_batch(&self, ctx: u64) -> u64 {
        if ctx == 0 {
            return 0;
        }
        self.caps.max_num_seqs.min(self.caps.max_kv_tokens / ctx)
    }

    /// `find_engine_capacity_rps`; `None` when the shape cannot be sized.
    pub fn capacity(&self, s: &Shape) -> Result<Option<Capacity>, String> {
        if s.isl == 0 {
            return Ok(None);
        }
        match self.worker {
            Worker::Prefill => self.prefill_capacity(s),
            Worker::Decode => self.decode_capacity(s),
            Worker::Aggregated => self.aggregated_capacity(s),
        }
    }

    fn prefill_capacity(&self, s: &Shape) -> Result<Option<Capacity>, String> {
        let isl = effective_prefill_isl(s.isl, s.kv_hit_rate);
        let mbt = self.caps.max_num_batched_tokens;
        let max_batch = if isl > mbt { 1 } else { self.caps.max_num_seqs.min(mbt / isl.max(1)) };
        let mut best = None;
        for b in batch_sizes(max_batch) {
            let ttft = self.prefill_time_s((isl * b).min(U32_MAX))?;
            if ttft == 0.0 {
                continue;
            }
            let eligible = sla_ok(Some(ttft), s.ttft_sla_s) && sla_ok(None, s.itl_sla_s);
            let c = Capacity { rps: b as f64 / ttft, ttft_s: Some(ttft), itl_s: None, e2e_s: Some(ttft), eligible };
            best = Some(select(best, c));
        }
        Ok(best)
    }

    fn decode_capacity(&self, s: &Shape) -> Result<Option<Capacity>, String> {
        if s.osl == 0 {
            return Ok(None);
        }
        let acc = accept(s.accept_length);
        let ctx = decode_context(s.isl, s.osl);
        let mut best = None;
        for b in batch_sizes(self.decode_max_batch(ctx)) {
            let itl = self.decode_time_s(b, (b * ctx).min(U32_MAX))? / acc;
            if itl == 0.0 {
                continue;
            }
            let eligible = sla_ok(None, s.ttft_sla_s) && sla_ok(Some(itl), s.itl_sla_s);
            let c = Capacity {
                rps: b as f64 / (s.osl as f64 * itl),
                ttft_s: None,
                itl_s: Some(itl),
                e2e_s: None,
                eligible,
            };
            best = Some(select(best, c));
        }
        Ok(best)
    }

    fn aggregated_capacity(&self, s: &Shape) -> Result<Option<Capacity>, String> {
        let mbt = self.caps.max_num_batched_tokens;
        if s.osl == 0 || mbt <= 1 {
            return Ok(None);
        }
        let isl = effective_prefill_isl(s.isl, s.kv_hit_rate);
        let acc = accept(s.accept_length);
        let ctx = decode_context(s.isl, s.osl);
        let cap = self.decode_max_batch(ctx).min((mbt - 1).max(1));
        let mut best = None;
        for b in batch_sizes(cap) {
            // Prefill tokens per iteration that keep pace with b decoding requests.
            let pre_f = b as f64 * acc * isl as f64 / s.osl.max(1) as f64;
            let pre = if pre_f <= 0.0 { 0 } else { pre_f.ceil() as u64 };
            let budget = mbt.saturating_sub(b);
            if budget == 0 || pre > budget {
                continue;
            }
            let kv = (b * ctx).min(U32_MAX);
            let per_iter = mbt.min(pre);
            let itl = self.mixed_s(per_iter, b, kv)? / acc;
            if itl == 0.0 {
                continue;
            }
            let ttft = self.chunked((per_iter + isl).min(U32_MAX), |c| self.mixed_s(c, b, kv))?;
            let e2e = ttft + itl * s.osl.saturating_sub(1) as f64;
            let eligible = sla_ok(Some(ttft), s.ttft_sla_s) && sla_ok(Some(itl), s.itl_sla_s);
            let c = Capacity {
                rps: b as f64 / (s.osl as f64 * itl),
                ttft_s: Some(ttft),
                itl_s: Some(itl),
                e2e_s: Some(e2e),
                eligible,
            };
            best = Some(select(best, c));
        }
        Ok(best)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A linear model: 1 ms + 0.01 ms per prefill token + 0.1 ms per decode request
    /// + 0.0001 ms per decode KV token, on the slowest rank.
    struct Linear;

    impl PassModel for Linear {
        fn forward_pass_ms(&self, ranks: &[Scheduled]) -> Result<f64, String> {
            Ok(ranks
                .iter()
                .map(|r| {
                    1.0 + 0.01 * r.sum_prefill_tokens as f64
                        + 0.1 * r.num_decode_requests as f64
                        + 0.0001 * r.sum_decode_kv_tokens as f64
                })
                .fold(0.0, f64::max))
        }
    }

    fn caps() -> EngineCaps {
        EngineCaps {
            max_num_batched_tokens: 8192,
            max_num_seqs: 256,
            max_kv_tokens: 100_000,
            context_length: 40960,
            dp_size: 1,
        }
    }

    #[test]
    fn batch_candidates() {
        assert_eq!(batch_sizes(3), vec![1, 2, 3]);
        let c = batch_sizes(1000);
        assert_eq!(c.len(), 128);
        // 1 + i·999 // 127: the first steps and the last value.
        assert_eq!(&c[..3], &[1, 8, 16]);
        assert_eq!(*c.last().unwrap(), 1000);
        assert!(batch_sizes(0).is_empty());
    }

    #[test]
    fn the_hit_rate_discount_is_capped_at_95_percent() {
        assert_eq!(effective_prefill_isl(1000, Some(0.5)), 500);
        // Capped at 0.95; 1000 · (1 − 0.95) is 50.000000000000043 in floating point, so the
        // ceiling is 51, as in the reference's Python.
        assert_eq!(effective_prefill_isl(1000, Some(0.99)), 51, "capped at 0.95");
        assert_eq!(effective_prefill_isl(1000, Some(0.5)), 500);
        assert_eq!(effective_prefill_isl(1001, Some(0.5)), 501, "rounded up");
        assert_eq!(effective_prefill_isl(10, Some(0.95)), 1);
        assert_eq!(effective_prefill_isl(1000, None), 1000);
        assert_eq!(decode_context(1000, 151), 1075);
    }

    #[test]
    fn prefill_capacity_by_hand() {
        let q = EngineQuery { model: &Linear, caps: caps(), worker: Worker::Prefill };
        // isl 3000: max batch = min(256, ⌊8192/3000⌋) = 2.
        // b=1: 3000 tokens, one chunk: 1 + 30 = 31 ms → rps 1/0.031 = 32.26.
        // b=2: 6000 tokens: 1 + 60 = 61 ms → rps 2/0.061 = 32.79 (the best).
        let s = Shape {
            isl: 3000,
            osl: 150,
            ttft_sla_s: Some(0.5),
            itl_sla_s: None,
            accept_length: 1.0,
            kv_hit_rate: None,
        };
        let c = q.capacity(&s).unwrap().unwrap();
        assert!((c.rps - 2.0 / 0.061).abs() < 1e-9, "{c:?}");
        assert!(c.eligible);
        // An isl above MBT: one request, chunked: 10000 = 8192 + 1808 → (1 + 81.92) + (1 + 18.08) ms.
        let s = Shape { isl: 10000, ..s };
        let c = q.capacity(&s).unwrap().unwrap();
        assert!((c.ttft_s.unwrap() - 0.102).abs() < 1e-12, "{c:?}");
        // A 20 ms TTFT SLA makes both candidates ineligible: the best ineligible one (b=2) is kept.
        let s = Shape { isl: 3000, ttft_sla_s: Some(0.02), ..s };
        let c = q.capacity(&s).unwrap().unwrap();
        assert!(!c.eligible && (c.rps - 2.0 / 0.061).abs() < 1e-9, "{c:?}");
        // With a 40 ms SLA only b=1 (31 ms) is eligible, and it wins over the faster b=2.
        let s = Shape { ttft_sla_s: Some(0.040), ..s };
        let c = q.capacity(&s).unwrap().unwrap();
        assert!(c.eligible && (c.rps - 1.0 / 0.031).abs() < 1e-9, "{c:?}");
    }

    #[test]
    fn decode_capacity_by_hand() {
        let q = EngineQuery { model: &Linear, caps: caps(), worker: Worker::Decode };
        // isl 1000, osl 100: ctx = 1050, max batch = min(256, ⌊100000/1050⌋ = 95) = 95.
        // b: itl = 1 + 0.1 b + 0.0001·1050 b = 1 + 0.205 b ms; rps = b / (100 · itl).
        // rps grows with b, so b = 95: itl = 20.475 ms; with an ITL SLA of 10 ms the largest
        // eligible b has 1 + 0.205 b ≤ 10 → b = 43 (9.815 ms).
        let s = Shape { isl: 1000, osl: 100, ttft_sla_s: None, itl_sla_s: None, accept_length: 1.0, kv_hit_rate: None };
        let c = q.capacity(&s).unwrap().unwrap();
        assert!((c.itl_s.unwrap() - 0.020475).abs() < 1e-12);
        assert!((c.rps - 95.0 / (100.0 * 0.020475)).abs() < 1e-9);
        let c = q.capacity(&Shape { itl_sla_s: Some(0.010), ..s }).unwrap().unwrap();
        assert!((c.itl_s.unwrap() - 0.009815).abs() < 1e-12, "{c:?}");
        // An accept length of 2 halves the ITL.
        let c = q.capacity(&Shape { accept_length: 2.0, ..s }).unwrap().unwrap();
        assert!((c.itl_s.unwrap() - 0.020475 / 2.0).abs() < 1e-12);
    }

    #[test]
    fn aggregated_capacity_keeps_prefill_and_decode_balanced() {
        let caps = EngineCaps { max_num_batched_tokens: 2048, ..caps() };
        let q = EngineQuery { model: &Linear, caps, worker: Worker::Aggregated };
        // isl 1000, osl 100: per-iteration prefill pre = ⌈10 b⌉ ≤ 2048 − b → b ≤ 186; the KV
        // cap ⌊100000/1050⌋ = 95 binds first. b = 95: pre = 950, itl = 1 + 9.5 + 9.5 + 9.975
        // = 29.975 ms; ttft = chunks of 950 + 1000 = 1950 < 2048: one pass of 1950 prefill
        // tokens with the decode batch: 1 + 19.5 + 9.5 + 9.975 = 39.975 ms.
        let s = Shape { isl: 1000, osl: 100, ttft_sla_s: None, itl_sla_s: None, accept_length: 1.0, kv_hit_rate: None };
        let c = q.capacity(&s).unwrap().unwrap();
        assert!((c.itl_s.unwrap() - 0.029975).abs() < 1e-12, "{c:?}");
        assert!((c.ttft_s.unwrap() - 0.039975).abs() < 1e-12, "{c:?}");
        assert!((c.e2e_s.unwrap() - (0.039975 + 99.0 * 0.029975)).abs() < 1e-12);
        assert!((c.rps - 95.0 / (100.0 * 0.029975)).abs() < 1e-9);
    }

    #[test]
    fn synthetic_batches_split_over_dp_ranks() {
        struct Max;
        impl PassModel for Max {
            fn forward_pass_ms(&self, ranks: &[Scheduled]) -> Result<f64, String> {
                assert_eq!(ranks.len(), 2);
                Ok(ranks.iter().map(|r| r.sum_prefill_tokens as f64 + r.num_decode_requests as f64).fold(0.0, f64::max))
            }
        }
        let q = EngineQuery { model: &Max, caps: EngineCaps { dp_size: 2, ..caps() }, worker: Worker::Prefill };
        // 5 tokens over 2 ranks: 3 and 2 → the slowest rank, 3 ms.
        assert!((q.mixed_s(5, 0, 0).unwrap() - 0.003).abs() < 1e-15);
        assert!((q.mixed_s(0, 7, 0).unwrap() - 0.004).abs() < 1e-15);
    }
}
