//! The planner's own forward-pass model. In a replay, Dynamo 1.6.1's planner (with aisimulate
//! 0.13) does not ask the hardware model directly: it fits a small regression per workload kind
//! ("fallback regression", `estimation_mode: fpm_regression` on an "unprofiled" system),
//! bootstraps it with a handful of benchmark passes timed by the hardware model
//! (`benchmark_granularity` 8), and keeps tuning it with the forward-pass snapshots it observes
//! at each SLA load tick. Its TTFT/ITL estimates and the capacity search query that fit, and
//! answer "unavailable" until the queried workload kind has `load_min_observations` samples.
//!
//! What it holds, per role (aggregated, prefill or decode):
//! - one store per workload kind (aggregated: pure decode, locally mixed, cross-rank mixed, pure
//!   prefill; prefill and decode roles one each). A store keeps at most `max_num_fpm_samples`
//!   observations in a `√bucket_size × √bucket_size` grid over `ln(1+x)` of its two features
//!   (bounds grow with the data); when full, the oldest sample of the fullest cell goes.
//! - after each accepted sample, a least-squares fit `ms = a + Σ bᵢ·zᵢ` on standardized
//!   features with non-negative slopes (every face of the constraint set is solved, the lowest
//!   squared error wins).
//! - the moving averages the estimates synthesize a "next request" from: mean prompt of the
//!   observed prefills, mean decode context, and (aggregated) the typical prefill mixed into a
//!   decode pass.
//!
//! Features of one pass (all ranks): `[critical attention, global FFN]`, where a rank's
//! attention work is `kv_prefill + pairs` (prefill role), `kv_decode` (decode role) or both
//! (aggregated), `pairs = kv·p/n + p²/(2n) + p/2` for `p` prefill tokens of `n` requests with
//! `kv` cached tokens, and FFN work is the prefill tokens (prefill), decode requests (decode) or
//! both (aggregated), summed over ranks.
//!
//! Known difference: when a full store evicts and several cells are equally full, the
//! reference takes whichever its hash map yields (not reproducible run to run); here the cell
//! that was filled first.

use std::collections::VecDeque;

use crate::capacity::{PassModel, Worker};
use crate::types::{EngineCaps, Fpm, Queued, Scheduled};

/// Benchmark passes per axis the bootstrap times (`benchmark_granularity`).
pub const BOOTSTRAP_GRANULARITY: u64 = 8;
/// Decode contexts the bootstrap times.
const BOOTSTRAP_DECODE_CONTEXTS: [u64; 4] = [500, 2000, 4000, 8000];
const RIDGE_SCALE: f64 = 1e-9;
const INACTIVE_SCALE_TOLERANCE: f64 = 1e-12;
const MIN_PREDICTION_MS: f64 = 1e-6;

/// A fixed-length mean that ignores values until the first positive one.
#[derive(Clone, Debug)]
struct MovingAverage {
    values: VecDeque<f64>,
    sum: f64,
    max_len: usize,
    started: bool,
}

impl MovingAverage {
    fn new(max_len: usize) -> Self {
        MovingAverage { values: VecDeque::new(), sum: 0.0, max_len: max_len.max(1), started: false }
    }

    fn add_after_first_nonzero(&mut self, v: f64) {
        if v > 0.0 {
            self.started = true;
        }
        if !self.started {
            return;
        }
        let v = v.max(0.0);
        self.values.push_back(v);
        self.sum += v;
        while self.values.len() > self.max_len {
            self.sum -= self.values.pop_front().unwrap_or(0.0);
        }
    }

    fn value(&self) -> f64 {
        if self.values.is_empty() {
            0.0
        } else {
            self.sum / self.values.len() as f64
        }
    }
}

/// What a pass did, as the regression tells stores apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    PureDecode,
    LocallyMixed,
    CrossRankMixed,
    PurePrefill,
}

/// The regression features of one pass, or `None` for a pass without work. `Err` when the
/// role cannot run that pass (decode work on a prefill engine, or prefill on a decode one).
fn features(worker: Worker, ranks: &[Scheduled]) -> Result<Option<(Kind, [f64; 2])>, ()> {
    let (mut prefill, mut decode, mut mixed) = (false, false, false);
    for s in ranks {
        match worker {
            Worker::Prefill if s.num_decode_requests > 0 => return Err(()),
            Worker::Decode if s.sum_prefill_tokens > 0 => return Err(()),
            _ => {}
        }
        let (p, d) = (s.sum_prefill_tokens > 0, s.num_decode_requests > 0);
        prefill |= p;
        decode |= d;
        mixed |= p && d;
    }
    let kind = match (prefill, decode) {
        (false, false) => return Ok(None),
        (false, true) => Kind::PureDecode,
        (true, false) => Kind::PurePrefill,
        (true, true) if mixed => Kind::LocallyMixed,
        (true, true) => Kind::CrossRankMixed,
    };
    let (mut attention, mut prefill_tokens, mut decode_requests) = (0.0f64, 0.0, 0.0);
    for s in ranks {
        let p = f64::from(s.sum_prefill_tokens);
        let n = f64::from(s.num_prefill_requests);
        let (kv_prefill, pairs) = if p > 0.0 {
            let kv = f64::from(s.sum_prefill_kv_tokens);
            (kv, kv * p / n + p * p / (2.0 * n) + p / 2.0)
        } else {
            (0.0, 0.0)
        };
        let kv_decode = f64::from(s.sum_decode_kv_tokens);
        let rank = match worker {
            Worker::Prefill => kv_prefill + pairs,
            Worker::Decode => kv_decode,
            Worker::Aggregated => kv_prefill + kv_decode + pairs,
        };
        attention = attention.max(rank);
        prefill_tokens += p;
        decode_requests += f64::from(s.num_decode_requests);
    }
    let ffn = match worker {
        Worker::Prefill => prefill_tokens,
        Worker::Decode => decode_requests,
        Worker::Aggregated => prefill_tokens + decode_requests,
    };
    let x = [attention, ffn];
    if x.iter().all(|v| v.is_finite() && *v >= 0.0) {
        Ok(Some((kind, x)))
    } else {
        Err(())
    }
}

/// A fitted line on standardized features.
#[derive(Clone, Copy, Debug)]
struct Fit {
    intercept: f64,
    slopes: [f64; 2],
    means: [f64; 2],
    scales: [f64; 2],
    active: [bool; 2],
}

impl Fit {
    fn standardize(&self, x: &[f64; 2]) -> Option<[f64; 2]> {
        let mut z = [0.0; 2];
        for a in 0..2 {
            if self.active[a] {
                z[a] = (x[a] - self.means[a]) / self.scales[a];
                if !z[a].is_finite() {
                    return None;
                }
            }
        }
        Some(z)
    }

    fn at(&self, z: &[f64; 2]) -> f64 {
        self.intercept + self.slopes[0] * z[0] + self.slopes[1] * z[1]
    }

    fn predict(&self, x: &[f64; 2]) -> Option<f64> {
        let y = self.at(&self.standardize(x)?);
        y.is_finite().then_some(y)
    }

    /// A fit with every slope zero is kept only while the data cannot pin a slope down.
    fn usable(&self, observations: usize) -> bool {
        let varying = self.active.iter().filter(|a| **a).count();
        observations <= varying || self.slopes.iter().any(|b| *b != 0.0)
    }
}

/// Gauss-Jordan elimination with partial pivoting; `None` when a pivot vanishes.
fn solve(mut a: Vec<Vec<f64>>, mut b: Vec<f64>) -> Option<Vec<f64>> {
    let n = b.len();
    for col in 0..n {
        let mut pivot = col;
        for row in col + 1..n {
            if a[row][col].abs() >= a[pivot][col].abs() {
                pivot = row;
            }
        }
        if a[pivot][col].abs() < 1e-12 {
            return None;
        }
        a.swap(col, pivot);
        b.swap(col, pivot);
        let d = a[col][col];
        for v in &mut a[col][col..] {
            *v /= d;
        }
        b[col] /= d;
        let (pivot_row, pivot_b) = (a[col].clone(), b[col]);
        for (row, (r, rb)) in a.iter_mut().zip(b.iter_mut()).enumerate() {
            let f = r[col];
            if row == col || f == 0.0 {
                continue;
            }
            for (v, p) in r[col..].iter_mut().zip(&pivot_row[col..]) {
                *v -= f * p;
            }
            *rb -= f * pivot_b;
        }
    }
    Some(b)
}

/// Least squares on standardized features with non-negative slopes: every subset of the
/// varying axes is fitted (intercept always free), subsets with a negative slope are dropped,
/// and the lowest squared error wins. `None` below `min_observations` or without spread.
fn fit(observations: &[([f64; 2], f64)], min_observations: usize) -> Option<Fit> {
    if observations.len() < min_observations || observations.is_empty() {
        return None;
    }
    // Welford means and spreads, in the order the samples are held.
    let (mut means, mut m2) = ([0.0f64; 2], [0.0f64; 2]);
    for (i, (x, _)) in observations.iter().enumerate() {
        let k = (i + 1) as f64;
        for a in 0..2 {
            let delta = x[a] - means[a];
            means[a] += delta / k;
            m2[a] += delta * (x[a] - means[a]);
        }
    }
    let n = observations.len() as f64;
    let mut scales = [0.0; 2];
    let mut active = [false; 2];
    for a in 0..2 {
        scales[a] = (m2[a] / n).max(0.0).sqrt();
        active[a] = scales[a].is_finite() && scales[a] > INACTIVE_SCALE_TOLERANCE * means[a].abs().max(1.0);
    }
    let varying: Vec<usize> = (0..2).filter(|a| active[*a]).collect();
    if varying.is_empty() {
        return None;
    }
    let shell = Fit { intercept: 0.0, slopes: [0.0; 2], means, scales, active };
    let z: Vec<([f64; 2], f64)> =
        observations.iter().map(|(x, y)| shell.standardize(x).map(|z| (z, *y))).collect::<Option<_>>()?;
    let mut best: Option<(f64, Fit)> = None;
    for mask in 0..(1usize << varying.len()) {
        let axes: Vec<usize> =
            varying.iter().enumerate().filter(|(i, _)| mask & (1 << i) != 0).map(|(_, a)| *a).collect();
        let size = axes.len() + 1;
        let (mut lhs, mut rhs) = (vec![vec![0.0; size]; size], vec![0.0; size]);
        for (zx, y) in &z {
            let row: Vec<f64> = std::iter::once(1.0).chain(axes.iter().map(|a| zx[*a])).collect();
            for i in 0..size {
                rhs[i] += row[i] * y;
                for j in 0..size {
                    lhs[i][j] += row[i] * row[j];
                }
            }
        }
        let solution = solve(lhs.clone(), rhs.clone()).or_else(|| {
            let scale = (0..size).map(|i| lhs[i][i].abs()).sum::<f64>().max(1.0);
            let mut ridged = lhs;
            for (i, row) in ridged.iter_mut().enumerate().skip(1) {
                row[i] += scale * RIDGE_SCALE;
            }
            solve(ridged, rhs)
        });
        let Some(solution) = solution else { continue };
        if !solution.iter().all(|v| v.is_finite()) || solution[1..].iter().any(|b| *b < 0.0) {
            continue;
        }
        let mut candidate = shell;
        candidate.intercept = solution[0];
        for (i, a) in axes.iter().enumerate() {
            candidate.slopes[*a] = solution[i + 1];
        }
        let sse: f64 = z.iter().map(|(zx, y)| (candidate.at(zx) - y).powi(2)).sum();
        if sse.is_finite() && best.as_ref().is_none_or(|(e, _)| sse < *e) {
            best = Some((sse, candidate));
        }
    }
    best.map(|(_, f)| f)
}

/// One observation: (sequence number, raw features, observed ms).
type Sample = (u64, [f64; 2], f64);

/// One workload kind's retained samples and fit.
#[derive(Clone, Debug)]
struct Store {
    kind: Kind,
    /// Cells in the order they were first filled: (cell, samples oldest first).
    cells: Vec<([usize; 2], VecDeque<Sample>)>,
    total: usize,
    lo: [f64; 2],
    hi: [f64; 2],
    fit: Option<Fit>,
}

impl Store {
    fn new(kind: Kind) -> Self {
        Store { kind, cells: Vec::new(), total: 0, lo: [f64::INFINITY; 2], hi: [f64::NEG_INFINITY; 2], fit: None }
    }

    fn cell_of(&self, x: &[f64; 2], bins: usize) -> [usize; 2] {
        let mut key = [0; 2];
        for (a, (k, v)) in key.iter_mut().zip(x).enumerate() {
            let (lo, hi) = (self.lo[a], self.hi[a]);
            if hi > lo {
                let idx = ((v.ln_1p() - lo) / (hi - lo) * bins as f64) as isize;
                *k = idx.clamp(0, bins as isize - 1) as usize;
            }
        }
        key
    }

    fn push(&mut self, key: [usize; 2], sample: Sample) {
        match self.cells.iter_mut().find(|(k, _)| *k == key) {
            Some((_, cell)) => cell.push_back(sample),
            None => self.cells.push((key, VecDeque::from([sample]))),
        }
    }

    /// The retained samples, oldest first.
    fn samples(&self) -> Vec<Sample> {
        let mut all: Vec<_> = self.cells.iter().flat_map(|(_, c)| c.iter().copied()).collect();
        all.sort_by_key(|s| s.0);
        all
    }

    fn add(&mut self, seq: u64, x: [f64; 2], ms: f64, p: &Params) {
        if !ms.is_finite() || ms <= 0.0 || !x.iter().all(|v| v.is_finite() && *v >= 0.0) {
            return;
        }
        let mut widened = false;
        for ((lo, hi), v) in self.lo.iter_mut().zip(self.hi.iter_mut()).zip(x) {
            let v = v.ln_1p();
            if v < *lo {
                *lo = v;
                widened = true;
            }
            if v > *hi {
                *hi = v;
                widened = true;
            }
        }
        if widened && self.total > 0 {
            let samples = self.samples();
            self.cells.clear();
            for s in samples {
                let key = self.cell_of(&s.1, p.bins);
                self.push(key, s);
            }
        }
        let key = self.cell_of(&x, p.bins);
        self.push(key, (seq, x, ms));
        self.total += 1;
        if self.total > p.max_observations {
            let fullest = self.cells.iter().map(|(_, c)| c.len()).max().unwrap_or(0);
            if let Some(i) = self.cells.iter().position(|(_, c)| c.len() == fullest) {
                self.cells[i].1.pop_front();
                self.total -= 1;
                if self.cells[i].1.is_empty() {
                    self.cells.remove(i);
                }
            }
        }
        let retained: Vec<([f64; 2], f64)> = self.samples().into_iter().map(|(_, x, y)| (x, y)).collect();
        let candidate = fit(&retained, p.min_observations);
        if candidate.is_none_or(|c| c.usable(self.total)) {
            self.fit = candidate;
        }
    }

    fn predict(&self, x: &[f64; 2]) -> Option<f64> {
        Some(self.fit.as_ref()?.predict(x)?.max(MIN_PREDICTION_MS))
    }
}

#[derive(Clone, Copy, Debug)]
struct Params {
    bins: usize,
    max_observations: usize,
    min_observations: usize,
}

/// The planner's model of one role: regression stores, the running averages its estimates
/// synthesize a next request from, and the engine limits the queries chunk by.
#[derive(Clone, Debug)]
pub struct FpmModel {
    worker: Worker,
    caps: EngineCaps,
    params: Params,
    stores: Vec<Store>,
    seq: u64,
    avg_isl: MovingAverage,
    avg_decode_length: MovingAverage,
    avg_prefill_requests: MovingAverage,
    avg_prefill_tokens: MovingAverage,
}

impl FpmModel {
    /// `max_samples` = `max_num_fpm_samples`, `bucket_size` = `fpm_sample_bucket_size` (a
    /// perfect square: its root is the grid's side), `min_observations` =
    /// `load_min_observations`.
    pub fn new(
        worker: Worker,
        caps: EngineCaps,
        max_samples: usize,
        bucket_size: usize,
        min_observations: usize,
    ) -> Self {
        let kinds: &[Kind] = match worker {
            Worker::Prefill => &[Kind::PurePrefill],
            Worker::Decode => &[Kind::PureDecode],
            Worker::Aggregated => &[Kind::PureDecode, Kind::LocallyMixed, Kind::CrossRankMixed, Kind::PurePrefill],
        };
        FpmModel {
            worker,
            caps,
            params: Params {
                bins: (bucket_size as f64).sqrt().floor().max(1.0) as usize,
                max_observations: max_samples.max(1),
                min_observations: min_observations.max(1),
            },
            stores: kinds.iter().map(|k| Store::new(*k)).collect(),
            seq: 0,
            avg_isl: MovingAverage::new(max_samples),
            avg_decode_length: MovingAverage::new(max_samples),
            avg_prefill_requests: MovingAverage::new(max_samples),
            avg_prefill_tokens: MovingAverage::new(max_samples),
        }
    }

    /// The benchmark passes the reference seeds the model with, timed by `hw`: one prefill of
    /// 100, 100 + step, … ≤ max_num_batched_tokens tokens (step = (MBT − 100) / 8), and decode
    /// batches 1, 1 + step, … ≤ max_num_seqs (step = MNS / 8) at contexts 500, 2000, 4000 and
    /// 8000 while they fit one rank's KV cache. An aggregated role takes both.
    pub fn bootstrap_passes(&self, hw: &dyn PassModel, nextn: u64) -> Vec<Fpm> {
        let mut out = Vec::new();
        let pass = |s: Scheduled| hw.forward_pass_ms(&[s]).ok().filter(|ms| *ms > 0.0 && ms.is_finite());
        if self.worker != Worker::Decode {
            let max = self.caps.max_num_batched_tokens;
            let step = (max.saturating_sub(100) / BOOTSTRAP_GRANULARITY).max(1);
            let mut isl = 100;
            while isl <= max {
                let s = Scheduled { num_prefill_requests: 1, sum_prefill_tokens: isl as u32, ..Scheduled::default() };
                if let Some(ms) = pass(s) {
                    out.push(Fpm { wall_time: ms / 1000.0, scheduled: s, ..Fpm::default() });
                }
                isl += step;
            }
        }
        if self.worker != Worker::Prefill {
            let dp = u64::from(self.caps.dp_size.max(1));
            let kv_cap = match self.caps.max_kv_tokens / dp {
                0 => 16384 * 16,
                kv => kv,
            };
            let max = self.caps.max_num_seqs;
            let step = (max / BOOTSTRAP_GRANULARITY).max(1);
            for ctx in BOOTSTRAP_DECODE_CONTEXTS {
                let mut bs = 1;
                while bs <= max {
                    let kv = bs * ctx;
                    if kv > kv_cap {
                        break;
                    }
                    // Timed as one decode step of the next token (context + 1), recorded at the
                    // context itself.
                    let batch = bs * (nextn + 1);
                    let timed = Scheduled {
                        num_decode_requests: batch as u32,
                        sum_decode_kv_tokens: (batch * (ctx + 1)) as u32,
                        ..Scheduled::default()
                    };
                    if let Some(ms) = pass(timed) {
                        let s = Scheduled {
                            num_decode_requests: bs as u32,
                            sum_decode_kv_tokens: kv as u32,
                            ..Scheduled::default()
                        };
                        out.push(Fpm { wall_time: ms / 1000.0, scheduled: s, ..Fpm::default() });
                    }
                    bs += step;
                }
            }
        }
        out
    }

    /// Seeds the model with benchmark passes (`load_benchmark_fpms`), each one pass. (The
    /// reference skips this fit for attention-DP engines only when a profiled
    /// `ais_perf_model` names their rank count; its default unprofiled model, the one built
    /// here, treats every rank as an engine of its own and fits them all.)
    pub fn bootstrap(&mut self, passes: &[Fpm]) {
        for f in passes {
            self.note_next_request(f);
        }
        let its: Vec<Vec<Fpm>> = passes.iter().map(|f| vec![*f]).collect();
        self.tune(&its);
    }

    /// Feeds one tick's snapshots (`add_observations`): the running averages in snapshot
    /// order, then the fit with each (worker, rank) as one pass, in the order of the
    /// reference's string worker ids.
    pub fn observe(&mut self, fpms: &[Fpm]) {
        if fpms.is_empty() {
            return;
        }
        for f in fpms {
            self.note_next_request(f);
        }
        let mut sorted: Vec<&Fpm> = fpms.iter().collect();
        sorted.sort_by(|a, b| a.worker.to_string().cmp(&b.worker.to_string()).then(a.dp_rank.cmp(&b.dp_rank)));
        let its: Vec<Vec<Fpm>> = sorted.iter().map(|f| vec![**f]).collect();
        self.tune(&its);
    }

    fn note_next_request(&mut self, f: &Fpm) {
        let s = &f.scheduled;
        if s.num_prefill_requests > 0 {
            self.avg_isl.add_after_first_nonzero(f64::from(s.sum_prefill_tokens) / f64::from(s.num_prefill_requests));
        } else {
            self.avg_isl.add_after_first_nonzero(0.0);
        }
        if s.num_decode_requests > 0 {
            self.avg_decode_length
                .add_after_first_nonzero(f64::from(s.sum_decode_kv_tokens) / f64::from(s.num_decode_requests));
        }
    }

    fn tune(&mut self, iterations: &[Vec<Fpm>]) {
        for ranks in iterations {
            let scheduled: Vec<Scheduled> = ranks.iter().map(|f| f.scheduled).collect();
            let wall = ranks.iter().map(|f| f.wall_time).filter(|w| w.is_finite() && *w > 0.0).fold(0.0, f64::max);
            if let Ok(Some((kind, x))) = features(self.worker, &scheduled) {
                if wall > 0.0 {
                    self.seq += 1;
                    let (seq, params) = (self.seq, self.params);
                    if let Some(store) = self.stores.iter_mut().find(|s| s.kind == kind) {
                        store.add(seq, x, wall * 1000.0, &params);
                    }
                }
            }
            // The typical prefill an aggregated decode pass carries: the busiest rank's.
            if let Some(busiest) = ranks.iter().max_by_key(|f| {
                let s = &f.scheduled;
                u64::from(s.sum_prefill_tokens) + u64::from(s.sum_decode_kv_tokens) + u64::from(s.num_decode_requests)
            }) {
                let s = &busiest.scheduled;
                let requests = if s.num_prefill_requests > 0 { f64::from(s.num_prefill_requests) } else { 0.0 };
                self.avg_prefill_requests.add_after_first_nonzero(requests);
                self.avg_prefill_tokens.add_after_first_nonzero(f64::from(s.sum_prefill_tokens));
            }
        }
    }

    /// Whether any workload kind has a fit (`has_sufficient_data`).
    pub fn ready(&self) -> bool {
        self.stores.iter().any(|s| s.fit.is_some())
    }

    /// Estimated time of one pass (ms): 0 for a pass without work, `None` while the pass's
    /// workload kind has no fit or the role cannot run it.
    pub fn estimate_ms(&self, ranks: &[Scheduled]) -> Option<f64> {
        match features(self.worker, ranks) {
            Err(()) => None,
            Ok(None) => Some(0.0),
            Ok(Some((kind, x))) => self.stores.iter().find(|s| s.kind == kind)?.predict(&x),
        }
    }

    /// Mean prompt of the observed prefill passes (per request).
    pub fn avg_isl(&self) -> f64 {
        self.avg_isl.value()
    }

    /// Mean decode context of the observed passes (per request).
    pub fn avg_decode_length(&self) -> f64 {
        self.avg_decode_length.value()
    }

    /// Time (s) to drain one rank group's queued prefill, a next request of the mean observed
    /// prompt added (`estimate_queued_prefill_time`): the queue (scaled by `queue_scale`,
    /// discounted by the hit rate) chunked at MBT, each chunk run beside the rank's decode
    /// batch (aggregated engines; scaled by `decode_scale`, queued decode included when asked).
    pub fn queued_prefill_s(
        &self,
        group: &[&Fpm],
        kv_hit_rate: Option<f64>,
        queue_scale: f64,
        decode_scale: f64,
        include_queued_decode: bool,
    ) -> Option<f64> {
        if self.worker == Worker::Decode {
            return None;
        }
        let keep =
            1.0 - kv_hit_rate.filter(|h| h.is_finite()).unwrap_or(0.0).clamp(0.0, crate::capacity::MAX_KV_HIT_DISCOUNT);
        let (avg_isl, agg) = (self.avg_isl(), self.worker == Worker::Aggregated);
        let ranks: Vec<(Queued, Scheduled)> = group
            .iter()
            .map(|f| {
                let (q, s) = (&f.queued, &f.scheduled);
                let mut tokens = f64::from(q.sum_prefill_tokens) * queue_scale;
                let mut requests = f64::from(q.num_prefill_requests) * queue_scale;
                if avg_isl > 0.0 {
                    tokens += avg_isl;
                    requests += 1.0;
                }
                tokens *= keep;
                let (mut kv, mut reqs) = (f64::from(s.sum_decode_kv_tokens), f64::from(s.num_decode_requests));
                if include_queued_decode {
                    kv += f64::from(q.sum_decode_kv_tokens);
                    reqs += f64::from(q.num_decode_requests);
                }
                let queued = Queued {
                    num_prefill_requests: ceil_u32(requests),
                    sum_prefill_tokens: ceil_u32(tokens),
                    ..Queued::default()
                };
                let decode = Scheduled {
                    num_decode_requests: if agg { ceil_u32(reqs * decode_scale) } else { 0 },
                    sum_decode_kv_tokens: if agg { ceil_u32(kv * decode_scale) } else { 0 },
                    ..Scheduled::default()
                };
                (queued, decode)
            })
            .collect();
        let mbt = self.caps.max_num_batched_tokens.max(1);
        let plans: Vec<(u64, u64)> = ranks
            .iter()
            .map(|(q, _)| (u64::from(q.sum_prefill_tokens) / mbt, u64::from(q.sum_prefill_tokens) % mbt))
            .collect();
        if plans.iter().all(|p| *p == (0, 0)) {
            return Some(0.0);
        }
        let mut cuts = vec![0u64];
        for (full, tail) in &plans {
            if *full > 0 {
                cuts.push(*full);
            }
            if *tail > 0 {
                cuts.push(full + 1);
            }
        }
        cuts.sort_unstable();
        cuts.dedup();
        let mut total = 0.0;
        for w in cuts.windows(2) {
            let (start, repeat) = (w[0], w[1] - w[0]);
            let pass: Vec<Scheduled> = ranks
                .iter()
                .zip(&plans)
                .map(|((q, decode), (full, tail))| {
                    let chunk = if start < *full {
                        mbt
                    } else if start == *full {
                        *tail
                    } else {
                        0
                    };
                    Scheduled {
                        num_prefill_requests: if chunk == 0 { 0 } else { q.num_prefill_requests.max(1) },
                        sum_prefill_tokens: chunk as u32,
                        ..*decode
                    }
                })
                .collect();
            total += self.estimate_ms(&pass)? / 1000.0 * repeat as f64;
        }
        Some(total)
    }

    /// Time (s) of one decode pass of a rank group with a next request of the mean observed
    /// context added (`estimate_scheduled_decode_itl`): scheduled decode (plus queued decode,
    /// plus queued prefill counted as context, when asked) scaled by `decode_scale`. An
    /// aggregated engine's pass carries the typical observed prefill instead of the snapshot's.
    pub fn decode_pass_s(
        &self,
        group: &[&Fpm],
        decode_scale: f64,
        include_queued_decode: bool,
        include_queued_prefill_as_kv: bool,
    ) -> Option<f64> {
        if self.worker == Worker::Prefill {
            return None;
        }
        let agg = self.worker == Worker::Aggregated;
        let avg_len = self.avg_decode_length();
        let ranks: Vec<Scheduled> = group
            .iter()
            .map(|f| {
                let (q, s) = (&f.queued, &f.scheduled);
                let (mut kv, mut reqs) = (f64::from(s.sum_decode_kv_tokens), f64::from(s.num_decode_requests));
                if include_queued_decode {
                    kv += f64::from(q.sum_decode_kv_tokens);
                    reqs += f64::from(q.num_decode_requests);
                }
                if include_queued_prefill_as_kv {
                    kv += f64::from(q.sum_prefill_tokens);
                    reqs += f64::from(q.num_prefill_requests);
                }
                kv *= decode_scale;
                reqs *= decode_scale;
                if avg_len > 0.0 {
                    kv += avg_len;
                    reqs += 1.0;
                }
                let (pr, pt) =
                    if agg { self.typical_prefill() } else { (s.num_prefill_requests, s.sum_prefill_tokens) };
                Scheduled {
                    num_prefill_requests: pr,
                    sum_prefill_tokens: pt,
                    num_decode_requests: ceil_u32(reqs),
                    sum_decode_kv_tokens: ceil_u32(kv),
                    ..Scheduled::default()
                }
            })
            .collect();
        Some(self.estimate_ms(&ranks)? / 1000.0)
    }

    /// (requests, tokens) of the prefill an aggregated decode pass typically carries.
    fn typical_prefill(&self) -> (u32, u32) {
        let tokens = ceil_u32(self.avg_prefill_tokens.value());
        let requests = ceil_u32(self.avg_prefill_requests.value());
        (requests.max(u32::from(tokens > 0)), tokens)
    }
}

fn ceil_u32(v: f64) -> u32 {
    if v <= 0.0 {
        0
    } else {
        v.ceil().min(u32::MAX as f64) as u32
    }
}

/// The capacity search queries the fitted model like any pass model; "not fitted yet" is an
/// error there, which the search reports as no capacity (`model_not_ready`).
impl PassModel for FpmModel {
    fn forward_pass_ms(&self, ranks: &[Scheduled]) -> Result<f64, String> {
        self.estimate_ms(ranks)
            .ok_or_else(|| "the planner's forward-pass model has no fit for this pass yet".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps() -> EngineCaps {
        EngineCaps {
            max_num_batched_tokens: 8192,
            max_num_seqs: 256,
            max_kv_tokens: 100_000,
            context_length: 40960,
            dp_size: 1,
        }
    }

    /// A hardware model exactly linear in the prefill features: 2 ms + 1 ns per attention
    /// pair + 1 µs per prompt token.
    struct LinearPrefill;
    impl PassModel for LinearPrefill {
        fn forward_pass_ms(&self, ranks: &[Scheduled]) -> Result<f64, String> {
            let s = &ranks[0];
            let (p, n) = (f64::from(s.sum_prefill_tokens), f64::from(s.num_prefill_requests.max(1)));
            Ok(2.0 + 1e-6 * (p * p / (2.0 * n) + p / 2.0) + 1e-3 * p)
        }
    }

    #[test]
    fn features_count_attention_pairs_per_rank_and_ffn_over_ranks() {
        // p = 100 tokens of n = 2 requests over 40 cached: pairs = 40·100/2 + 100²/4 + 50 = 4550.
        let prefill = Scheduled {
            num_prefill_requests: 2,
            sum_prefill_tokens: 100,
            sum_prefill_kv_tokens: 40,
            ..Default::default()
        };
        assert_eq!(features(Worker::Prefill, &[prefill]), Ok(Some((Kind::PurePrefill, [4590.0, 100.0]))));
        // A decode engine cannot run a prefill; a prefill engine cannot run decode.
        assert_eq!(features(Worker::Decode, &[prefill]), Err(()));
        let decode = Scheduled { num_decode_requests: 3, sum_decode_kv_tokens: 900, ..Default::default() };
        assert_eq!(features(Worker::Prefill, &[decode]), Err(()));
        assert_eq!(features(Worker::Decode, &[decode]), Ok(Some((Kind::PureDecode, [900.0, 3.0]))));
        // Aggregated, one rank prefilling and one decoding: the critical rank's attention, the
        // FFN work of both.
        assert_eq!(features(Worker::Aggregated, &[prefill, decode]), Ok(Some((Kind::CrossRankMixed, [4590.0, 103.0]))));
        let both = Scheduled { num_decode_requests: 3, sum_decode_kv_tokens: 900, ..prefill };
        assert_eq!(features(Worker::Aggregated, &[both]), Ok(Some((Kind::LocallyMixed, [5490.0, 103.0]))));
        assert_eq!(features(Worker::Aggregated, &[Scheduled::default()]), Ok(None));
    }

    #[test]
    fn fit_recovers_a_linear_law_and_never_takes_a_negative_slope() {
        let law = |x: [f64; 2]| 5.0 + 0.01 * x[0] + 2.0 * x[1];
        let obs: Vec<([f64; 2], f64)> =
            [[100.0, 1.0], [200.0, 3.0], [400.0, 2.0], [800.0, 5.0]].iter().map(|x| (*x, law(*x))).collect();
        let f = fit(&obs, 1).unwrap();
        assert!((f.predict(&[300.0, 4.0]).unwrap() - 16.0).abs() < 1e-9);
        assert!(fit(&obs, 5).is_none(), "below min_observations");
        // Time falling with work: the slope is refused and the mean (8 ms) is left.
        let falling = vec![([1.0, 7.0], 10.0), ([2.0, 7.0], 8.0), ([3.0, 7.0], 6.0)];
        let f = fit(&falling, 1).unwrap();
        assert_eq!(f.slopes, [0.0, 0.0]);
        assert!((f.predict(&[10.0, 7.0]).unwrap() - 8.0).abs() < 1e-12);
        // Such a flat fit is kept only while the data could not pin a slope down.
        assert!(!f.usable(3));
        assert!(f.usable(1));
    }

    #[test]
    fn moving_average_skips_leading_zeros_and_keeps_its_window() {
        let mut m = MovingAverage::new(3);
        for v in [0.0, 0.0, 4.0, 0.0, 2.0] {
            m.add_after_first_nonzero(v);
        }
        assert_eq!(m.value(), 2.0); // [4, 0, 2]
        m.add_after_first_nonzero(6.0);
        assert!((m.value() - 8.0 / 3.0).abs() < 1e-12); // [0, 2, 6]
    }

    #[test]
    fn bootstrap_times_prefill_steps_and_decode_batches_that_fit_the_cache() {
        struct Count;
        impl PassModel for Count {
            fn forward_pass_ms(&self, ranks: &[Scheduled]) -> Result<f64, String> {
                let s = &ranks[0];
                Ok(1.0 + f64::from(s.sum_prefill_tokens) + f64::from(s.sum_decode_kv_tokens) / 1000.0)
            }
        }
        let m = FpmModel::new(Worker::Aggregated, caps(), 64, 16, 5);
        let passes = m.bootstrap_passes(&Count, 1);
        // Prefill: 100 + k·⌊(8192 − 100)/8⌋ = 100, 1111, …, 8188.
        let prefills: Vec<u32> = passes
            .iter()
            .filter(|f| f.scheduled.sum_prefill_tokens > 0)
            .map(|f| f.scheduled.sum_prefill_tokens)
            .collect();
        assert_eq!(prefills, vec![100, 1111, 2122, 3133, 4144, 5155, 6166, 7177, 8188]);
        // Decode: batches 1, 33, …, 225 while batch · context ≤ 100,000 tokens (7 at 500, 2 at
        // 2000, 1 at 4000 and at 8000).
        let decodes: Vec<(u32, u32)> = passes
            .iter()
            .filter(|f| f.scheduled.num_decode_requests > 0)
            .map(|f| (f.scheduled.num_decode_requests, f.scheduled.sum_decode_kv_tokens))
            .collect();
        assert_eq!(decodes.len(), 11);
        assert_eq!(decodes[6], (193, 193 * 500));
        assert_eq!(&decodes[7..], &[(1, 2000), (33, 66_000), (1, 4000), (1, 8000)]);
        // Recorded at the context, timed as the next step of 1 + nextn tokens per request:
        // 33 requests → 66 sequences at 2001 tokens.
        let at = passes
            .iter()
            .find(|f| f.scheduled.num_decode_requests == 33 && f.scheduled.sum_decode_kv_tokens == 66_000)
            .unwrap();
        assert!((at.wall_time - (1.0 + 66.0 * 2001.0 / 1000.0) / 1000.0).abs() < 1e-12);
    }

    #[test]
    fn queued_prefill_is_chunked_at_the_batch_limit_with_a_next_request_added() {
        let mut m = FpmModel::new(Worker::Prefill, caps(), 64, 16, 5);
        let passes = m.bootstrap_passes(&LinearPrefill, 0);
        m.bootstrap(&passes);
        assert!(m.ready());
        // The next request brings the mean bootstrap prompt: (100 + … + 8188) / 9 = 4144.
        assert!((m.avg_isl() - 4144.0).abs() < 1e-9);
        let f = Fpm {
            queued: Queued { num_prefill_requests: 3, sum_prefill_tokens: 10_000, ..Default::default() },
            ..Default::default()
        };
        // 14,144 tokens of 4 requests: one 8192-token chunk and one of 5952.
        let chunk = |p: f64| 2.0 + 1e-6 * (p * p / 8.0 + p / 2.0) + 1e-3 * p;
        let want = (chunk(8192.0) + chunk(5952.0)) / 1000.0;
        let got = m.queued_prefill_s(&[&f], None, 1.0, 1.0, false).unwrap();
        assert!((got - want).abs() < 1e-9 * want, "{got} vs {want}");
        // A 50 % hit rate halves the tokens to prefill: 7072, one chunk.
        let got = m.queued_prefill_s(&[&f], Some(0.5), 1.0, 1.0, false).unwrap();
        assert!((got - chunk(7072.0) / 1000.0).abs() < 1e-9, "{got}");
        // A decode engine has no prefill estimate.
        assert!(FpmModel::new(Worker::Decode, caps(), 64, 16, 5)
            .queued_prefill_s(&[&f], None, 1.0, 1.0, false)
            .is_none());
    }
}
