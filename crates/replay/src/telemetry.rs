//! Telemetry: per-worker (per attention data-parallel rank) and cluster time series sampled on
//! the virtual clock, as the reference's `TelemetryOptions(sample_interval_ms=...)` offers them.
//!
//! A sample at time `t` describes the interval `[t − interval, t)`: counters (passes, tokens,
//! pass time, prefix lookups, arrivals, completions) count what happened in it — a pass counts
//! when it ends — and gauges (running, waiting, KV usage, queues, worker counts) are the state
//! just before `t`'s events. Samples are handed to a [`TelemetrySink`] as the run reaches
//! them, so memory does not grow with the run; a sample's size is fixed by the cluster's size.
//! After the last event one more sample closes the last interval, so that the counters of all
//! samples add up to the run's totals.
//!
//! Fast-forwarded decode stretches are not cut at sample times (that would cost the replay its
//! speed): their passes are counted in the samples their ends fall in, but a gauge sampled while
//! a stretch runs sees the worker as the stretch leaves it. Running and waiting do not change
//! during a stretch; `kv_usage` is ahead by the blocks the stretch's remaining tokens take (at
//! most about one block per running request per block_size passes). `--no-fast-forward` makes
//! the gauges exact.

use std::fmt::Write as _;
use std::io::Write;

use serde_json::{json, Map, Value};
use servesim_engine::{PassOutput, Role};

/// The finest sample interval `servesim predict` accepts, in simulated ms: a forward pass takes
/// milliseconds, so finer samples repeat the state between passes, and at a microsecond a run's
/// telemetry file grows by gigabytes per simulated minute.
pub const MIN_INTERVAL_MS: f64 = 1.0;

/// One rank of one worker over one interval.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkerSample {
    pub pool: Option<Role>,
    pub worker: u32,
    pub dp_rank: u32,
    /// Gauges at the sample time: requests in the running batch and in the waiting queue, and
    /// the fraction of KV blocks held by requests.
    pub running: u32,
    pub waiting: u32,
    pub kv_usage: f64,
    /// Prompt tokens looked up in the prefix cache at admission during the interval, and those
    /// found (`prefix_hit_rate` = hits / lookups).
    pub prefix_lookup_tokens: u64,
    pub prefix_hit_tokens: u64,
    /// Passes that ended in the interval, the output tokens they made visible (not a prefill
    /// worker's), the prompt tokens they computed, and their summed duration.
    pub passes: u64,
    pub output_tokens: u64,
    pub prefill_tokens: u64,
    pub busy_ms: f64,
    /// Gauges of the KV cache at the sample time: blocks held by requests, cached blocks no
    /// request holds, and all blocks.
    pub active_blocks: u32,
    pub inactive_blocks: u32,
    pub total_blocks: u32,
    /// Preemptions in the interval.
    pub preemptions: u64,
    /// The worker is starting, serving or draining (a stopped worker's row is kept in place,
    /// but the Dynamo-shaped sample leaves it out).
    pub state: WorkerPhase,
}

/// Where a worker is in its life, as the Dynamo-shaped sample's id lists tell it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WorkerPhase {
    Starting,
    #[default]
    Active,
    Draining,
    Stopped,
}

impl WorkerSample {
    pub fn prefix_hit_rate(&self) -> Option<f64> {
        (self.prefix_lookup_tokens > 0).then(|| self.prefix_hit_tokens as f64 / self.prefix_lookup_tokens as f64)
    }

    /// Output and prompt tokens per pass.
    pub fn tokens_per_pass(&self) -> Option<f64> {
        (self.passes > 0).then(|| (self.output_tokens + self.prefill_tokens) as f64 / self.passes as f64)
    }

    pub fn mean_pass_ms(&self) -> Option<f64> {
        (self.passes > 0).then(|| self.busy_ms / self.passes as f64)
    }
}

/// The cluster over one interval.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterSample {
    /// End of the interval (the sample time) and its length.
    pub t_ms: f64,
    pub interval_ms: f64,
    /// Requests released, completed and rejected in the interval.
    pub arrivals: u64,
    pub completions: u64,
    pub rejections: u64,
    /// Gauges: requests in the routers' queues, requests that arrived and wait for their first
    /// admission, and workers per pool (prefill is 0 when aggregated).
    pub router_queue: u64,
    pub waiting_admission: u64,
    pub prefill_workers: u32,
    pub decode_workers: u32,
    /// The Dynamo-shaped sample's extras: its kind and ordinal (the baseline is 0), the start of
    /// its interval (the previous sample's time; a final sample's interval is shorter), the
    /// traffic of the interval, and the routers' queues per pool (prefill, decode).
    pub kind: SampleKind,
    pub ordinal: u64,
    pub interval_start_ms: f64,
    pub traffic: Traffic,
    pub router_pending: [u64; 2],
}

/// A sample's place in the run: the baseline at t = 0 (Dynamo-shaped samples only), one every
/// interval, and the one closing the run at its end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SampleKind {
    Baseline,
    #[default]
    Periodic,
    Final,
}

impl SampleKind {
    pub fn name(self) -> &'static str {
        match self {
            SampleKind::Baseline => "baseline",
            SampleKind::Periodic => "periodic",
            SampleKind::Final => "final",
        }
    }
}

/// What the requests did in an interval, as Dynamo's replay telemetry counts it: requests that
/// completed (their prompt and output lengths, TTFTs, mean inter-token gaps), KV-router
/// placements (the overlap fraction of the prompt's blocks) and decode forwards.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Traffic {
    pub completed_input_tokens: u64,
    pub completed_output_tokens: u64,
    pub ttft_sum_ms: f64,
    pub ttft_count: u64,
    pub itl_sum_ms: f64,
    pub itl_count: u64,
    pub router_hit_sum: f64,
    pub router_hit_count: u64,
    pub decode_forwards: u64,
    pub decode_tokens: u64,
}

impl Traffic {
    /// Folds in a completed request: its prompt and output lengths, TTFT and mean inter-token
    /// gap (the planner's traffic window counts the same way).
    pub(crate) fn add_completion(&mut self, r: &crate::record::RequestRecord) {
        self.completed_input_tokens += r.input_length as u64;
        self.completed_output_tokens += r.output_length as u64;
        if let Some(v) = r.ttft_ms() {
            self.ttft_sum_ms += v;
            self.ttft_count += 1;
        }
        if let Some(v) = r.tpot_ms() {
            self.itl_sum_ms += v;
            self.itl_count += 1;
        }
    }

    /// Folds in one KV-router placement's hit rate (overlap blocks over prompt blocks).
    pub(crate) fn add_router_hit(&mut self, rate: f64) {
        self.router_hit_sum += rate;
        self.router_hit_count += 1;
    }
}

/// Receives samples as the run reaches them.
pub trait TelemetrySink {
    fn sample(&mut self, cluster: &ClusterSample, workers: &[WorkerSample]);
}

/// Counters of one rank since the last sample.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Counters {
    passes: u64,
    output_tokens: u64,
    prefill_tokens: u64,
    busy_ms: f64,
}

impl Counters {
    fn merge(&mut self, o: &Counters) {
        self.passes += o.passes;
        self.output_tokens += o.output_tokens;
        self.prefill_tokens += o.prefill_tokens;
        self.busy_ms += o.busy_ms;
    }
}

/// The sampler a collector carries when telemetry is on.
pub(crate) struct Telemetry<'s> {
    pub(crate) interval_ms: f64,
    /// The next sample time, `index × interval_ms`.
    pub(crate) next_ms: f64,
    pub(crate) index: u64,
    pub(crate) sink: &'s mut (dyn TelemetrySink + Send),
    /// Per pool, per target (worker × dp + rank).
    pub(crate) counters: Vec<Vec<Counters>>,
    /// Per pool, per target: the engine's cumulative prefix lookups and hits at the last sample.
    pub(crate) prefix_seen: Vec<Vec<(u64, u64)>>,
    /// The collector's cumulative arrivals, completions and rejections at the last sample.
    pub(crate) totals_seen: (u64, u64, u64),
    pub(crate) rows: Vec<WorkerSample>,
    /// Passes of fast-forwarded stretches that end in later samples: (pool, target, sample
    /// index, counters). At most one entry per rank and later sample a stretch reaches.
    ahead: Vec<(usize, usize, u64, Counters)>,
    /// Samples shaped as Dynamo's replay telemetry: a baseline at t = 0, each sample taken after
    /// the arrivals at its instant, a final sample at the run's end (see [`dynamo_sample_jsonl`]).
    pub(crate) dynamo: bool,
    pub(crate) baseline_done: bool,
    /// Samples emitted so far (the next one's ordinal).
    pub(crate) emitted: u64,
    /// The time of the last sample (the next one's interval starts there).
    pub(crate) last_ms: f64,
    /// Traffic since the last sample, and the engines' cumulative preemptions at it.
    pub(crate) traffic: Traffic,
    pub(crate) preemptions_seen: Vec<Vec<u64>>,
    /// Decode forwards and tokens the collector had counted at the last sample.
    pub(crate) forwards_seen: (u64, u64),
}

impl<'s> Telemetry<'s> {
    pub(crate) fn new(interval_ms: f64, sink: &'s mut (dyn TelemetrySink + Send)) -> Self {
        Telemetry {
            interval_ms,
            next_ms: interval_ms,
            index: 1,
            sink,
            counters: Vec::new(),
            prefix_seen: Vec::new(),
            totals_seen: (0, 0, 0),
            rows: Vec::new(),
            ahead: Vec::new(),
            dynamo: false,
            baseline_done: false,
            emitted: 0,
            last_ms: 0.0,
            traffic: Traffic::default(),
            preemptions_seen: Vec::new(),
            forwards_seen: (0, 0),
        }
    }

    /// The preemptions since the last sample, given the engine's cumulative count.
    pub(crate) fn preemption_delta(&mut self, pool: usize, target: usize, cumulative: u64) -> u64 {
        if self.preemptions_seen.len() <= pool {
            self.preemptions_seen.resize_with(pool + 1, Vec::new);
        }
        let p = &mut self.preemptions_seen[pool];
        if p.len() <= target {
            p.resize(target + 1, 0);
        }
        cumulative - std::mem::replace(&mut p[target], cumulative)
    }

    fn counters(&mut self, pool: usize, target: usize) -> &mut Counters {
        if self.counters.len() <= pool {
            self.counters.resize_with(pool + 1, Vec::new);
        }
        let p = &mut self.counters[pool];
        if p.len() <= target {
            p.resize(target + 1, Counters::default());
        }
        &mut p[target]
    }

    /// A pass of rank `target` of pool `pool` ended (`visible`: its tokens reach clients).
    pub(crate) fn pass(&mut self, pool: usize, target: usize, out: &PassOutput, visible: bool) {
        let c = self.counters(pool, target);
        c.passes += 1;
        if visible {
            c.output_tokens += out.tokens.len() as u64;
        }
        c.prefill_tokens += out.prefill_tokens;
        c.busy_ms += out.end_ms - out.start_ms;
    }

    /// The sample whose interval holds time `t`: sample `k` covers `[(k − 1)·interval, k·interval)`.
    fn bucket(&self, t: f64) -> u64 {
        (t / self.interval_ms).floor() as u64 + 1
    }

    /// A fast-forwarded stretch starting at `start_ms`: `requests` tokens at each of `ends`.
    /// It is counted when it starts; each pass goes to the sample its end falls in, later
    /// samples' shares wait in `ahead`.
    pub(crate) fn stretch(&mut self, pool: usize, target: usize, start_ms: f64, ends: &[f64], requests: usize) {
        debug_assert!(ends.windows(2).all(|w| w[0] <= w[1]), "a stretch's passes end in order");
        let mut previous = start_ms;
        let mut i = 0;
        while i < ends.len() {
            // A run of passes in one bucket: the first settles it with a division, then passes
            // ending below `inside` (a relative hair under the end of the bucket, so that a
            // division rounding up at the boundary is still settled by `bucket`) share it
            // without one; past it, each pass's own bucket decides.
            let k = self.bucket(ends[i]).max(self.index);
            let inside = k as f64 * self.interval_ms * (1.0 - 1e-12);
            let first = i;
            let mut busy_ms = ends[i] - previous;
            previous = ends[i];
            i += 1;
            loop {
                // Pass ends increase (each pass starts when the one before ends).
                let below = i + ends[i..].partition_point(|&end| end < inside);
                for &end in &ends[i..below] {
                    busy_ms += end - previous;
                    previous = end;
                }
                i = below;
                if i < ends.len() && self.bucket(ends[i]).max(self.index) == k {
                    busy_ms += ends[i] - previous;
                    previous = ends[i];
                    i += 1;
                    continue;
                }
                break;
            }
            let passes = (i - first) as u64;
            let c = Counters { passes, output_tokens: passes * requests as u64, prefill_tokens: 0, busy_ms };
            self.add(pool, target, k, c);
        }
    }

    fn add(&mut self, pool: usize, target: usize, bucket: u64, c: Counters) {
        if bucket <= self.index {
            self.counters(pool, target).merge(&c);
            return;
        }
        self.counters(pool, target);
        let ahead = &mut self.ahead;
        match ahead.iter_mut().find(|(p, t, b, _)| (*p, *t, *b) == (pool, target, bucket)) {
            Some((_, _, _, have)) => have.merge(&c),
            None => ahead.push((pool, target, bucket, c)),
        }
    }

    /// Takes the counters of rank `target` of pool `pool` for the current sample, and moves
    /// in what stretches already counted for the next one.
    pub(crate) fn take(&mut self, pool: usize, target: usize, row: &mut WorkerSample) {
        let c = std::mem::take(self.counters(pool, target));
        row.passes = c.passes;
        row.output_tokens = c.output_tokens;
        row.prefill_tokens = c.prefill_tokens;
        row.busy_ms = c.busy_ms;
        let next = self.index + 1;
        if let Some(i) = self.ahead.iter().position(|&(p, t, b, _)| (p, t, b) == (pool, target, next)) {
            let (_, _, _, c) = self.ahead.swap_remove(i);
            self.counters(pool, target).merge(&c);
        }
    }

    /// The prefix lookups since the last sample, given the engine's cumulative counters.
    pub(crate) fn prefix_delta(&mut self, pool: usize, target: usize, cumulative: (u64, u64)) -> (u64, u64) {
        if self.prefix_seen.len() <= pool {
            self.prefix_seen.resize_with(pool + 1, Vec::new);
        }
        let p = &mut self.prefix_seen[pool];
        if p.len() <= target {
            p.resize(target + 1, (0, 0));
        }
        let seen = std::mem::replace(&mut p[target], cumulative);
        (cumulative.0 - seen.0, cumulative.1 - seen.1)
    }
}

/// The file formats telemetry is written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TelemetryFormat {
    /// One JSON object per sample: the cluster's keys and a `workers` array.
    Jsonl,
    /// One row per worker rank and sample (`scope` = `worker`) and one per sample for the
    /// cluster (`scope` = `cluster`); columns that do not apply are empty.
    Csv,
}

impl TelemetryFormat {
    /// By the file's extension (`.csv`, else JSONL).
    pub fn for_path(path: &std::path::Path) -> TelemetryFormat {
        match path.extension().and_then(|e| e.to_str()) {
            Some(e) if e.eq_ignore_ascii_case("csv") => TelemetryFormat::Csv,
            _ => TelemetryFormat::Jsonl,
        }
    }
}

pub fn pool_name(pool: Option<Role>) -> &'static str {
    match pool {
        Some(Role::Aggregated) | None => "agg",
        Some(Role::Prefill) => "prefill",
        Some(Role::Decode) => "decode",
    }
}

/// A sample as a JSON object (the JSONL format's line).
pub fn sample_json(cluster: &ClusterSample, workers: &[WorkerSample]) -> Value {
    let mut m = Map::new();
    m.insert("t_ms".into(), json!(cluster.t_ms));
    m.insert("interval_ms".into(), json!(cluster.interval_ms));
    m.insert("arrivals".into(), json!(cluster.arrivals));
    m.insert("completions".into(), json!(cluster.completions));
    m.insert("rejections".into(), json!(cluster.rejections));
    m.insert("router_queue".into(), json!(cluster.router_queue));
    m.insert("waiting_admission".into(), json!(cluster.waiting_admission));
    m.insert("prefill_workers".into(), json!(cluster.prefill_workers));
    m.insert("decode_workers".into(), json!(cluster.decode_workers));
    let rows: Vec<Value> = workers
        .iter()
        .map(|w| {
            json!({
                "pool": pool_name(w.pool),
                "worker": w.worker,
                "dp_rank": w.dp_rank,
                "running": w.running,
                "waiting": w.waiting,
                "kv_usage": w.kv_usage,
                "prefix_hit_rate": w.prefix_hit_rate(),
                "passes": w.passes,
                "output_tokens": w.output_tokens,
                "prefill_tokens": w.prefill_tokens,
                "tokens_per_pass": w.tokens_per_pass(),
                "mean_pass_ms": w.mean_pass_ms(),
            })
        })
        .collect();
    m.insert("workers".into(), Value::Array(rows));
    Value::Object(m)
}

/// A float as ryu writes it (shortest round trip, `.0` on integers, as serde_json below 1e16;
/// null if not finite).
/// Whole numbers below 10^15 (counts, times on a millisecond grid, idle gauges) are written as
/// integers with `.0`, the same text ryu gives them, without its digit search.
fn push_f64(out: &mut String, x: f64) {
    if (0.0..1e15).contains(&x) && x.fract() == 0.0 && x.is_sign_positive() {
        push_u64(out, x as u64);
        out.push_str(".0");
    } else if x.is_finite() {
        out.push_str(ryu::Buffer::new().format_finite(x));
    } else {
        out.push_str("null");
    }
}

fn push_opt(out: &mut String, x: Option<f64>) {
    match x {
        Some(v) => push_f64(out, v),
        None => out.push_str("null"),
    }
}

fn push_u64(out: &mut String, x: impl itoa::Integer) {
    out.push_str(itoa::Buffer::new().format(x));
}

/// A sample as one JSON line, the text of [`sample_json`] written without building it (the
/// telemetry file of a long run has many samples). Numbers are pushed as itoa and ryu format
/// them rather than through `write!`: a line per sample and worker rank is most of what
/// telemetry costs a replay.
pub fn sample_jsonl(c: &ClusterSample, workers: &[WorkerSample], out: &mut String) {
    out.push_str("{\"t_ms\":");
    push_f64(out, c.t_ms);
    out.push_str(",\"interval_ms\":");
    push_f64(out, c.interval_ms);
    for (key, v) in [
        (",\"arrivals\":", c.arrivals),
        (",\"completions\":", c.completions),
        (",\"rejections\":", c.rejections),
        (",\"router_queue\":", c.router_queue),
        (",\"waiting_admission\":", c.waiting_admission),
        (",\"prefill_workers\":", c.prefill_workers as u64),
        (",\"decode_workers\":", c.decode_workers as u64),
    ] {
        out.push_str(key);
        push_u64(out, v);
    }
    out.push_str(",\"workers\":[");
    for (i, w) in workers.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str("{\"pool\":\"");
        out.push_str(pool_name(w.pool));
        out.push_str("\",\"worker\":");
        push_u64(out, w.worker);
        out.push_str(",\"dp_rank\":");
        push_u64(out, w.dp_rank);
        out.push_str(",\"running\":");
        push_u64(out, w.running);
        out.push_str(",\"waiting\":");
        push_u64(out, w.waiting);
        out.push_str(",\"kv_usage\":");
        push_f64(out, w.kv_usage);
        out.push_str(",\"prefix_hit_rate\":");
        push_opt(out, w.prefix_hit_rate());
        out.push_str(",\"passes\":");
        push_u64(out, w.passes);
        out.push_str(",\"output_tokens\":");
        push_u64(out, w.output_tokens);
        out.push_str(",\"prefill_tokens\":");
        push_u64(out, w.prefill_tokens);
        out.push_str(",\"tokens_per_pass\":");
        push_opt(out, w.tokens_per_pass());
        out.push_str(",\"mean_pass_ms\":");
        push_opt(out, w.mean_pass_ms());
        out.push('}');
    }
    out.push_str("]}\n");
}

/// A sample as Dynamo's replay telemetry shapes it (`dynamo.replay.TelemetryOptions`'s
/// samples), one JSON line: what the Python API hands back. Keys and their order are the
/// reference's; see docs/telemetry.md, "The Python API's samples".
pub fn dynamo_sample_jsonl(c: &ClusterSample, workers: &[WorkerSample], out: &mut String) {
    let t = &c.traffic;
    let _ = write!(out, "{{\"sample_ordinal\":{},\"kind\":\"{}\",\"interval_start_ms\":", c.ordinal, c.kind.name());
    push_f64(out, c.interval_start_ms);
    out.push_str(",\"sampled_at_ms\":");
    push_f64(out, c.t_ms);
    out.push_str(",\"traffic\":{\"duration_s\":");
    push_f64(out, (c.t_ms - c.interval_start_ms) / 1000.0);
    let mean = |sum: f64, n: u64| if n > 0 { sum / n as f64 } else { 0.0 };
    let completed = c.completions;
    let _ = write!(out, ",\"arriving_requests\":{},\"completed_requests\":{},\"avg_isl\":", c.arrivals, completed);
    push_f64(out, mean(t.completed_input_tokens as f64, completed));
    out.push_str(",\"avg_osl\":");
    push_f64(out, mean(t.completed_output_tokens as f64, completed));
    out.push_str(",\"avg_ttft_ms\":");
    push_f64(out, mean(t.ttft_sum_ms, t.ttft_count));
    out.push_str(",\"avg_itl_ms\":");
    push_f64(out, mean(t.itl_sum_ms, t.itl_count));
    let _ = write!(out, ",\"ttft_count\":{},\"itl_count\":{},\"avg_router_kv_hit_rate\":", t.ttft_count, t.itl_count);
    push_f64(out, mean(t.router_hit_sum, t.router_hit_count));
    let _ = write!(out, ",\"router_kv_hit_rate_count\":{},\"avg_accept_length\":", t.router_hit_count);
    push_opt(out, (t.decode_forwards > 0).then(|| t.decode_tokens as f64 / t.decode_forwards as f64));
    let _ = write!(out, ",\"accept_length_forward_count\":{}}}", t.decode_forwards);
    let prefill = |w: &&WorkerSample| w.pool == Some(Role::Prefill);
    let listed = |w: &&WorkerSample| w.state != WorkerPhase::Stopped;
    for (name, want_prefill) in [("prefill_scheduler_metrics", true), ("decode_scheduler_metrics", false)] {
        let _ = write!(out, ",\"{name}\":[");
        let rows = workers.iter().filter(|w| prefill(w) == want_prefill).filter(listed);
        for (i, w) in rows.enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(
                out,
                "{{\"worker_id\":{},\"dp_rank\":{},\"active_blocks\":{},\"inactive_blocks\":{},\"total_blocks\":{},\"active_cache_usage\":",
                w.worker, w.dp_rank, w.active_blocks, w.inactive_blocks, w.total_blocks
            );
            let total = w.total_blocks.max(1) as f64;
            push_f64(out, w.active_blocks as f64 / total);
            out.push_str(",\"physical_cache_usage\":");
            push_f64(out, (w.active_blocks + w.inactive_blocks) as f64 / total);
            let _ = write!(out, ",\"running_requests\":{},\"waiting_requests\":{}}}", w.running, w.waiting);
        }
        out.push(']');
    }
    for (name, want_prefill) in [("prefill_interval_metrics", true), ("decode_interval_metrics", false)] {
        let preemptions: u64 = workers.iter().filter(|w| prefill(w) == want_prefill).map(|w| w.preemptions).sum();
        // Dynamo 1.6.1's replay reports no cache lookups here (0 in every run probed).
        let _ = write!(
            out,
            ",\"{name}\":{{\"cache_hit_tokens\":0,\"cache_total_tokens\":0,\"preemptions\":{preemptions}}}"
        );
    }
    let _ = write!(
        out,
        ",\"router_pending_prefill_requests\":{},\"router_pending_decode_requests\":{}",
        c.router_pending[0], c.router_pending[1]
    );
    for (phase, label) in
        [(WorkerPhase::Active, "active"), (WorkerPhase::Starting, "starting"), (WorkerPhase::Draining, "draining")]
    {
        for (pool, want_prefill) in [("prefill", true), ("decode", false)] {
            let _ = write!(out, ",\"{label}_{pool}_ids\":[");
            let mut ids: Vec<u32> = workers
                .iter()
                .filter(|w| prefill(w) == want_prefill && w.state == phase && w.dp_rank == 0)
                .map(|w| w.worker)
                .collect();
            ids.dedup();
            for (i, id) in ids.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                let _ = write!(out, "{id}");
            }
            out.push(']');
        }
    }
    out.push_str("}\n");
}

/// The CSV format's header line.
pub const CSV_HEADER: &str = "t_ms,scope,pool,worker,dp_rank,running,waiting,kv_usage,prefix_hit_rate,passes,\
output_tokens,prefill_tokens,tokens_per_pass,mean_pass_ms,arrivals,completions,rejections,router_queue,\
waiting_admission,prefill_workers,decode_workers\n";

fn opt(x: Option<f64>) -> String {
    x.map_or(String::new(), |v| v.to_string())
}

/// A sample as CSV lines (one per worker rank, then the cluster's).
pub fn sample_csv(cluster: &ClusterSample, workers: &[WorkerSample], out: &mut String) {
    let t = cluster.t_ms;
    for w in workers {
        let _ = writeln!(
            out,
            "{t},worker,{},{},{},{},{},{},{},{},{},{},{},{},,,,,,,",
            pool_name(w.pool),
            w.worker,
            w.dp_rank,
            w.running,
            w.waiting,
            w.kv_usage,
            opt(w.prefix_hit_rate()),
            w.passes,
            w.output_tokens,
            w.prefill_tokens,
            opt(w.tokens_per_pass()),
            opt(w.mean_pass_ms()),
        );
    }
    let c = cluster;
    let _ = writeln!(
        out,
        "{t},cluster,,,,,,,,,,,,,{},{},{},{},{},{},{}",
        c.arrivals,
        c.completions,
        c.rejections,
        c.router_queue,
        c.waiting_admission,
        c.prefill_workers,
        c.decode_workers
    );
}

/// Writes samples to a file as they come; the first write error is kept and later samples
/// are dropped.
pub struct TelemetryWriter<W: Write> {
    out: W,
    format: TelemetryFormat,
    line: String,
    error: Option<std::io::Error>,
}

impl<W: Write> TelemetryWriter<W> {
    pub fn new(out: W, format: TelemetryFormat) -> Self {
        let mut w = TelemetryWriter { out, format, line: String::new(), error: None };
        if format == TelemetryFormat::Csv {
            w.write(CSV_HEADER.as_bytes());
        }
        w
    }

    fn write(&mut self, bytes: &[u8]) {
        if self.error.is_none() {
            if let Err(e) = self.out.write_all(bytes) {
                self.error = Some(e);
            }
        }
    }

    /// Flushes and returns the first write error, if any.
    pub fn finish(mut self) -> Result<W, std::io::Error> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        self.out.flush()?;
        Ok(self.out)
    }
}

impl<W: Write> TelemetrySink for TelemetryWriter<W> {
    fn sample(&mut self, cluster: &ClusterSample, workers: &[WorkerSample]) {
        let mut line = std::mem::take(&mut self.line);
        line.clear();
        match self.format {
            TelemetryFormat::Jsonl => sample_jsonl(cluster, workers, &mut line),
            TelemetryFormat::Csv => sample_csv(cluster, workers, &mut line),
        }
        self.write(line.as_bytes());
        self.line = line;
    }
}

/// Several sinks fed the same samples.
impl<A: TelemetrySink, B: TelemetrySink> TelemetrySink for (A, B) {
    fn sample(&mut self, cluster: &ClusterSample, workers: &[WorkerSample]) {
        self.0.sample(cluster, workers);
        self.1.sample(cluster, workers);
    }
}

impl<T: TelemetrySink + ?Sized> TelemetrySink for &mut T {
    fn sample(&mut self, cluster: &ClusterSample, workers: &[WorkerSample]) {
        (**self).sample(cluster, workers);
    }
}

impl<T: TelemetrySink> TelemetrySink for Option<T> {
    fn sample(&mut self, cluster: &ClusterSample, workers: &[WorkerSample]) {
        if let Some(s) = self {
            s.sample(cluster, workers);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_jsonl_line_is_the_json_object() {
        let c = ClusterSample {
            t_ms: 3000.0,
            interval_ms: 1000.0,
            arrivals: 4,
            completions: 2,
            router_queue: 1,
            ..Default::default()
        };
        let busy = WorkerSample {
            pool: Some(Role::Decode),
            worker: 3,
            dp_rank: 1,
            running: 7,
            kv_usage: 0.123456789,
            prefix_lookup_tokens: 300,
            prefix_hit_tokens: 100,
            passes: 3,
            output_tokens: 20,
            busy_ms: 31.25,
            ..Default::default()
        };
        let idle = WorkerSample { pool: Some(Role::Prefill), ..Default::default() };
        for workers in [vec![], vec![busy.clone()], vec![busy, idle]] {
            let mut line = String::new();
            sample_jsonl(&c, &workers, &mut line);
            assert_eq!(line, format!("{}\n", sample_json(&c, &workers)));
        }
    }

    #[test]
    fn whole_numbers_are_written_as_ryu_writes_them() {
        let mut values = vec![0.0, -0.0, 1.0, -1.0, 0.5, 1e15 - 1.0, 1e15, 1e16, 123456789012345.0, 2f64.powi(52)];
        values.extend([f64::MIN_POSITIVE, 5e-324, 1.1304347826086956, 6.364607630439265, 999999999999999.9]);
        for i in 0..2000 {
            values.push(i as f64 * 1000.0);
            values.push(i as f64 / 7.0);
        }
        for x in values {
            let mut s = String::new();
            push_f64(&mut s, x);
            assert_eq!(s, ryu::Buffer::new().format_finite(x), "{x:e}");
        }
        let mut s = String::new();
        push_f64(&mut s, f64::NAN);
        assert_eq!(s, "null");
    }

    #[test]
    fn the_dynamo_shaped_line_has_the_reference_keys_in_order() {
        let c = ClusterSample {
            t_ms: 150.0,
            interval_start_ms: 100.0,
            ordinal: 2,
            arrivals: 3,
            completions: 2,
            traffic: Traffic {
                completed_input_tokens: 512,
                completed_output_tokens: 64,
                ttft_sum_ms: 30.0,
                ttft_count: 2,
                decode_forwards: 4,
                decode_tokens: 4,
                ..Default::default()
            },
            ..Default::default()
        };
        let worker = |pool, worker, state| WorkerSample {
            pool: Some(pool),
            worker,
            active_blocks: 16,
            inactive_blocks: 48,
            total_blocks: 256,
            state,
            ..Default::default()
        };
        let workers = [
            worker(Role::Prefill, 0, WorkerPhase::Active),
            worker(Role::Decode, 0, WorkerPhase::Active),
            worker(Role::Decode, 1, WorkerPhase::Draining),
            worker(Role::Decode, 2, WorkerPhase::Stopped),
        ];
        let mut line = String::new();
        dynamo_sample_jsonl(&c, &workers, &mut line);
        let v: Value = serde_json::from_str(&line).expect("one JSON object");
        assert_eq!(v["traffic"]["duration_s"], json!(0.05));
        assert_eq!(v["traffic"]["avg_isl"], json!(256.0));
        assert_eq!(v["traffic"]["avg_ttft_ms"], json!(15.0));
        assert_eq!(v["traffic"]["avg_itl_ms"], json!(0.0));
        assert_eq!(v["traffic"]["avg_accept_length"], json!(1.0));
        assert_eq!(v["decode_scheduler_metrics"].as_array().map(Vec::len), Some(2));
        assert_eq!(v["decode_scheduler_metrics"][0]["physical_cache_usage"], json!(0.25));
        assert_eq!(v["active_decode_ids"], json!([0]));
        assert_eq!(v["draining_decode_ids"], json!([1]));
        // Keys in the reference's order, at the top level and in `traffic`.
        let order = [
            "sample_ordinal",
            "kind",
            "interval_start_ms",
            "sampled_at_ms",
            "traffic",
            "duration_s",
            "arriving_requests",
            "accept_length_forward_count",
            "prefill_scheduler_metrics",
            "decode_scheduler_metrics",
            "prefill_interval_metrics",
            "decode_interval_metrics",
            "router_pending_prefill_requests",
            "router_pending_decode_requests",
            "active_prefill_ids",
            "active_decode_ids",
            "starting_prefill_ids",
            "starting_decode_ids",
            "draining_prefill_ids",
            "draining_decode_ids",
        ];
        let at: Vec<usize> = order.iter().map(|k| line.find(&format!("\"{k}\"")).expect(k)).collect();
        assert!(at.windows(2).all(|p| p[0] < p[1]), "{line}");
    }
}
