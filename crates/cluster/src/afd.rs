//! Attention/FFN disaggregation (AFD) as a foreground engine: the attention nodes and the FFN
//! nodes of one AFD deployment run a batch of requests through full passes (one prefill pass,
//! then a decode pass per further output token), every layer pipelined over microbatches. What
//! one layer costs on each side comes from the timing model (`servesim_perf::afd`); this module
//! owns the pipeline that turns it into a pass time and the batch schedule that turns passes
//! into request latencies, as aisimulate 0.13's AFD replay schedules them. No clock, no I/O.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// How compute and the transfers between the pools overlap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pipeline {
    /// Three microbatches in flight: the round trip is its own stage (the cycle is the slowest
    /// of attention, FFN and the round trip) when enough microbatches hide it, else
    /// [`Pipeline::Conservative`].
    Optimistic,
    /// Each side waits for its own outgoing transfer.
    Conservative,
    /// Nothing overlaps.
    Serial,
}

impl Pipeline {
    pub const NAMES: [&'static str; 3] = ["optimistic", "conservative", "serial"];

    pub fn parse(s: &str) -> Option<Pipeline> {
        match s {
            "optimistic" => Some(Pipeline::Optimistic),
            "conservative" => Some(Pipeline::Conservative),
            "serial" => Some(Pipeline::Serial),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Pipeline::Optimistic => "optimistic",
            Pipeline::Conservative => "conservative",
            Pipeline::Serial => "serial",
        }
    }
}

/// One phase's per-layer times (ms): attention, FFN, and the one-way transfers before the
/// communication correction.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerTimes {
    pub attention_ms: f64,
    pub ffn_ms: f64,
    pub a_to_f_ms: f64,
    pub f_to_a_ms: f64,
    pub num_layers: u32,
}

/// A full pass of one phase through the pipeline.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PassTime {
    /// The pass: the first (layer, microbatch) unit's four stages, then one cycle per further unit.
    pub step_ms: f64,
    pub cycle_ms: f64,
    pub fill_ms: f64,
    /// The model the cycle was computed with (optimistic falls back to conservative without
    /// enough microbatches; one microbatch is serial).
    pub effective: Pipeline,
    pub communication_hidden: bool,
}

/// The pass time of `t` under `pipeline` with `microbatches` microbatches, the transfers scaled
/// by `comm_overhead_factor`.
pub fn pass_time(t: &LayerTimes, pipeline: Pipeline, microbatches: u32, comm_overhead_factor: f64) -> PassTime {
    let (a, f) = (t.attention_ms, t.ffn_ms);
    let a2f = t.a_to_f_ms * comm_overhead_factor;
    let f2a = t.f_to_a_ms * comm_overhead_factor;
    let round_trip = a2f + f2a;
    let blocking = (a + a2f).max(f + f2a);
    let (effective, cycle, hidden) = match pipeline {
        _ if microbatches == 1 => (Pipeline::Serial, a + a2f + f + f2a, false),
        Pipeline::Serial => (Pipeline::Serial, a + a2f + f + f2a, false),
        Pipeline::Conservative => (Pipeline::Conservative, blocking, false),
        Pipeline::Optimistic => {
            // Hiding the round trip takes two microbatches plus its share of the compute stage.
            let needed = 2.0 + round_trip / a.max(f).max(1e-9);
            if (microbatches as f64) < needed {
                (Pipeline::Conservative, blocking, false)
            } else {
                (Pipeline::Optimistic, a.max(f).max(round_trip), round_trip <= a.max(f))
            }
        }
    };
    let fill = a + f + a2f + f2a;
    let units = (microbatches as u64 * t.num_layers as u64).saturating_sub(1);
    PassTime {
        step_ms: fill + cycle * units as f64,
        cycle_ms: cycle,
        fill_ms: fill,
        effective,
        communication_hidden: hidden,
    }
}

/// One request of the AFD schedule.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AfdRequest {
    /// When it may start: its arrival, or the free concurrency slot it waited for.
    pub arrival_ms: f64,
    pub first_token_ms: f64,
    pub end_ms: f64,
}

/// The schedule of a pure AFD deployment (`phase: both`).
#[derive(Clone, Debug, PartialEq)]
pub struct AfdSchedule {
    pub requests: Vec<AfdRequest>,
    pub batches: u64,
    pub passes: u64,
}

/// Runs `arrivals` (ms, any order) through one AFD deployment that prefills and decodes: up to
/// `capacity` requests that have arrived by a batch's start form the batch; the batch prefills
/// in one pass and decodes `output_tokens − 1` passes, and the next batch starts when it ends.
/// `slots`: at most that many requests in flight (a concurrency load), each slot free again
/// when its request ends.
pub fn schedule_both(
    arrivals: &[f64],
    capacity: u32,
    slots: Option<u32>,
    prefill: f64,
    decode: f64,
    output_tokens: u32,
) -> AfdSchedule {
    let mut order: Vec<f64> = arrivals.to_vec();
    order.sort_by(f64::total_cmp);
    let capacity = capacity.max(1) as usize;
    let mut free: Option<BinaryHeap<Reverse<OrdF64>>> =
        slots.map(|n| (0..(n as usize).min(order.len())).map(|_| Reverse(OrdF64(0.0))).collect());
    let decode_passes = output_tokens.saturating_sub(1);
    let mut available = 0.0f64;
    let mut out = AfdSchedule { requests: Vec::with_capacity(order.len()), batches: 0, passes: 0 };
    let mut next = 0;
    while next < order.len() {
        let first_slot = free.as_ref().and_then(|h| h.peek()).map_or(0.0, |r| r.0 .0);
        let mut start = available.max(order[next]).max(first_slot);
        let mut batch: Vec<f64> = Vec::new();
        while next < order.len() && batch.len() < capacity {
            let mut arrival = order[next];
            if let Some(h) = free.as_ref() {
                let Some(slot) = h.peek() else { break };
                arrival = arrival.max(slot.0 .0);
            }
            if arrival > start && !batch.is_empty() {
                break;
            }
            start = start.max(arrival);
            if let Some(h) = free.as_mut() {
                h.pop();
            }
            batch.push(arrival);
            next += 1;
        }
        out.batches += 1;
        let prefill_end = start.max(available) + prefill;
        // One step at a time, as the passes run.
        let mut end = prefill_end;
        for _ in 0..decode_passes {
            end += decode;
        }
        available = end;
        out.passes += 1 + decode_passes as u64;
        for arrival in batch {
            if let Some(h) = free.as_mut() {
                h.push(Reverse(OrdF64(end)));
            }
            out.requests.push(AfdRequest { arrival_ms: arrival, first_token_ms: prefill_end, end_ms: end });
        }
    }
    out
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct OrdF64(f64);

impl Eq for OrdF64 {}

impl PartialOrd for OrdF64 {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for OrdF64 {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn times(a: f64, f: f64, c: f64) -> LayerTimes {
        LayerTimes { attention_ms: a, ffn_ms: f, a_to_f_ms: c, f_to_a_ms: c, num_layers: 2 }
    }

    #[test]
    fn pipelines_overlap_as_their_names_say() {
        let t = times(1.0, 2.0, 0.25);
        // fill 3.5; 3 microbatches × 2 layers − 1 = 5 further units.
        let s = pass_time(&t, Pipeline::Serial, 3, 1.0);
        assert_eq!((s.cycle_ms, s.step_ms), (3.5, 3.5 + 5.0 * 3.5));
        let c = pass_time(&t, Pipeline::Conservative, 3, 1.0);
        assert_eq!(c.cycle_ms, 2.25);
        let o = pass_time(&t, Pipeline::Optimistic, 3, 1.0);
        assert_eq!((o.cycle_ms, o.effective, o.communication_hidden), (2.0, Pipeline::Optimistic, true));
        // Too few microbatches to hide a slow network: conservative.
        let slow = pass_time(&times(1.0, 1.0, 1.0), Pipeline::Optimistic, 3, 1.0);
        assert_eq!((slow.effective, slow.cycle_ms), (Pipeline::Conservative, 2.0));
        // One microbatch is serial whatever was asked; the overhead factor scales transfers only.
        let one = pass_time(&t, Pipeline::Optimistic, 1, 2.0);
        assert_eq!((one.effective, one.cycle_ms, one.step_ms), (Pipeline::Serial, 4.0, 4.0 + 4.0));
    }

    #[test]
    fn batches_wait_for_the_previous_batch_and_free_slots() {
        // Capacity 2, concurrency 2: two batches, the second starting when the first ends.
        let s = schedule_both(&[0.0, 0.0, 0.0, 0.0], 2, Some(2), 10.0, 1.0, 4);
        assert_eq!((s.batches, s.passes), (2, 8));
        assert_eq!(s.requests[0], AfdRequest { arrival_ms: 0.0, first_token_ms: 10.0, end_ms: 13.0 });
        assert_eq!(s.requests[3], AfdRequest { arrival_ms: 13.0, first_token_ms: 23.0, end_ms: 26.0 });
        // Open arrivals: a late request starts its own batch at its arrival.
        let s = schedule_both(&[0.0, 100.0], 4, None, 10.0, 1.0, 2);
        assert_eq!(s.batches, 2);
        assert_eq!(s.requests[1], AfdRequest { arrival_ms: 100.0, first_token_ms: 110.0, end_ms: 111.0 });
    }
}
