//! Distributions as the reference reports them: mean, min, max, median, p75, p90, p95, p99 and
//! population standard deviation.
//!
//! [`Samples`] keeps every value and takes quantiles at rank `round((n − 1) · q)` of the sorted
//! values, as the reference does for per-request metrics — up to [`Samples::DEFAULT_LIMIT`]
//! values, beyond which it folds them into a sketch so that memory stays bounded on runs of
//! millions of requests (a run known to be larger than that sketches from its first value).
//! [`Sketch`] keeps exact moments but estimates quantiles with a DDSketch (relative accuracy
//! 0.1 %), as the reference does for its pooled per-token families.

/// Summary of a distribution, in report order.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Summary {
    pub count: u64,
    pub mean: f64,
    pub min: f64,
    pub max: f64,
    pub median: f64,
    pub p75: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
    pub std: f64,
}

impl Summary {
    /// `(suffix, value)` pairs in report order: mean, min, max, median, p75, p90, p95, p99, std.
    pub fn fields(&self) -> [(&'static str, f64); 9] {
        [
            ("mean", self.mean),
            ("min", self.min),
            ("max", self.max),
            ("median", self.median),
            ("p75", self.p75),
            ("p90", self.p90),
            ("p95", self.p95),
            ("p99", self.p99),
            ("std", self.std),
        ]
    }
}

/// Welford running moments.
#[derive(Clone, Copy, Debug)]
struct Moments {
    count: u64,
    mean: f64,
    m2: f64,
    min: f64,
    max: f64,
}

impl Default for Moments {
    fn default() -> Self {
        Moments { count: 0, mean: 0.0, m2: 0.0, min: f64::INFINITY, max: f64::NEG_INFINITY }
    }
}

impl Moments {
    fn add(&mut self, x: f64) {
        self.count += 1;
        let delta = x - self.mean;
        self.mean += delta / self.count as f64;
        self.m2 += delta * (x - self.mean);
        self.min = self.min.min(x);
        self.max = self.max.max(x);
    }

    /// Folds in the moments of other values (Chan et al.'s pairwise update).
    fn merge(&mut self, other: &Moments) {
        if other.count == 0 {
            return;
        }
        if self.count == 0 {
            *self = *other;
            return;
        }
        let n = self.count + other.count;
        let delta = other.mean - self.mean;
        let (a, b) = (self.count as f64, other.count as f64);
        self.mean += delta * b / n as f64;
        self.m2 += other.m2 + delta * delta * a * b / n as f64;
        self.count = n;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }

    fn summary(&self, quantile: impl Fn(f64) -> f64) -> Summary {
        if self.count == 0 {
            return Summary::default();
        }
        Summary {
            count: self.count,
            mean: self.mean,
            min: self.min,
            max: self.max,
            median: quantile(0.5),
            p75: quantile(0.75),
            p90: quantile(0.90),
            p95: quantile(0.95),
            p99: quantile(0.99),
            std: (self.m2 / self.count as f64).max(0.0).sqrt(),
        }
    }
}

fn rank(count: u64, q: f64) -> u64 {
    (((count - 1) as f64) * q).round().clamp(0.0, (count - 1) as f64) as u64
}

/// Keeps every value while there are at most `limit` of them, then a [`Sketch`] of them.
#[derive(Clone, Debug)]
pub struct Samples {
    values: Vec<f64>,
    limit: usize,
    overflow: Option<Box<Sketch>>,
}

impl Default for Samples {
    fn default() -> Self {
        Samples::with_limit(Samples::DEFAULT_LIMIT)
    }
}

impl Samples {
    /// 100,000 values (800 KB) per distribution: exact quantiles for any run of that many
    /// requests, 0.1 % relative accuracy beyond.
    pub const DEFAULT_LIMIT: usize = 100_000;

    pub fn with_limit(limit: usize) -> Self {
        Samples { values: Vec::new(), limit, overflow: None }
    }

    pub fn add(&mut self, x: f64) {
        if let Some(sketch) = self.overflow.as_mut() {
            sketch.add(x);
            return;
        }
        self.values.push(x);
        if self.values.len() > self.limit {
            self.fold();
        }
    }

    fn fold(&mut self) {
        let mut sketch = Box::<Sketch>::default();
        for &v in &self.values {
            sketch.add(v);
        }
        self.values = Vec::new();
        self.overflow = Some(sketch);
    }

    /// Told that up to `n` values are coming: when that is more than the limit, sketch from
    /// the start instead of buffering `limit` values only to fold them later. The values then
    /// go into the sketch in the same order, so its summary is the one folding would give.
    pub fn expect(&mut self, n: u64) {
        if n > self.limit as u64 && self.overflow.is_none() {
            self.fold();
        }
    }

    /// Drops every value, keeping the limit and whether values are sketched from the start.
    pub fn clear(&mut self) {
        self.values.clear();
        if self.overflow.is_some() {
            self.overflow = Some(Box::default());
        }
    }

    /// Folds in another distribution's values: still exact if both were and their values fit.
    pub fn merge(&mut self, other: &Samples) {
        match &other.overflow {
            None => {
                for &v in &other.values {
                    self.add(v);
                }
            }
            Some(sketch) => {
                let mut merged = (**sketch).clone();
                if let Some(mine) = &self.overflow {
                    merged.merge(mine);
                } else {
                    for &v in &self.values {
                        merged.add(v);
                    }
                }
                self.values = Vec::new();
                self.overflow = Some(Box::new(merged));
            }
        }
    }

    /// Whether quantiles are exact (no more than `limit` values were added).
    pub fn is_exact(&self) -> bool {
        self.overflow.is_none()
    }

    pub fn summary(&self) -> Summary {
        if let Some(sketch) = &self.overflow {
            return sketch.summary();
        }
        let mut sorted = self.values.clone();
        sorted.sort_by(f64::total_cmp);
        let mut m = Moments::default();
        // Sum in sorted order so the result does not depend on completion order.
        for &x in &sorted {
            m.add(x);
        }
        let n = sorted.len() as u64;
        m.summary(|q| sorted[rank(n, q) as usize])
    }
}

/// DDSketch with logarithmic mapping: a positive value `x` falls in bin `ceil(log_γ x)` with
/// `γ = (1 + α) / (1 − α)`, and a bin is represented by `2 γ^i / (γ + 1)`, which is within `α`
/// of every value it holds. Zeros are counted apart. When more than `max_bins` bins exist the
/// lowest ones are merged (the high quantiles stay accurate).
#[derive(Clone, Debug)]
pub struct Sketch {
    moments: Moments,
    gamma: f64,
    ln_gamma: f64,
    max_bins: usize,
    /// Counts for bins `offset .. offset + bins.len()`.
    offset: i32,
    bins: Vec<u64>,
    zeros: u64,
    /// A value and how many copies of it were added last and are not counted yet. Token gaps
    /// come in runs (every request of a pass sees the same gap), so most additions only
    /// increment this.
    run: (f64, u64),
    /// The bin the last counted value fell in, as `(lo, hi, key)`: values strictly between
    /// `lo` and `hi` fall in bin `key` too. Pass durations drift slowly, so consecutive runs
    /// mostly share a bin, and this spares the logarithm. A cache only: it changes no count.
    last_bin: (f64, f64, i32),
}

impl Default for Sketch {
    fn default() -> Self {
        Sketch::new(0.001, 32768)
    }
}

impl Sketch {
    pub fn new(relative_accuracy: f64, max_bins: usize) -> Self {
        let gamma = (1.0 + relative_accuracy) / (1.0 - relative_accuracy);
        Sketch {
            moments: Moments::default(),
            gamma,
            ln_gamma: (2.0 * relative_accuracy / (1.0 - relative_accuracy)).ln_1p(),
            max_bins,
            offset: 0,
            bins: Vec::new(),
            zeros: 0,
            run: (f64::NAN, 0),
            last_bin: (f64::NAN, f64::NAN, 0),
        }
    }

    pub fn count(&self) -> u64 {
        self.moments.count + self.run.1
    }

    /// Adds a value ≥ 0.
    pub fn add(&mut self, x: f64) {
        self.add_n(x, 1);
    }

    /// Adds `n` copies of a value ≥ 0.
    pub fn add_n(&mut self, x: f64, n: u64) {
        if x == self.run.0 {
            self.run.1 += n;
        } else {
            self.settle();
            self.run = (x, n);
        }
    }

    /// Counts the pending run.
    fn settle(&mut self) {
        let (x, n) = self.run;
        if n == 0 {
            return;
        }
        self.run.1 = 0;
        if n == 1 {
            self.moments.add(x);
        } else {
            self.moments.merge(&Moments { count: n, mean: x, m2: 0.0, min: x, max: x });
        }
        if x <= 0.0 {
            self.zeros += n;
            return;
        }
        let (lo, hi, cached) = self.last_bin;
        let key = if x > lo && x < hi { cached } else { self.bin_of(x) };
        self.add_to_bin(key, n);
    }

    /// The bin of a value > 0, `ceil(ln x / ln γ)`, remembered with the range of values sure to
    /// share it (see `last_bin`).
    fn bin_of(&mut self, x: f64) -> i32 {
        // The ceiling without libm's ceil (a call on baseline x86-64; this runs once per pass):
        // truncation rounds towards zero, so only a positive fraction needs the +1.
        let v = x.ln() / self.ln_gamma;
        let truncated = v as i32;
        let key = truncated.saturating_add(i32::from((truncated as f64) < v));
        // Bin `key` holds γ^(key−1) < x ≤ γ^key. Staying a relative 1e-9 inside its edges moves
        // `v` by about 1e-9 / ln γ (5e-7 at α = 0.001), far beyond the rounding of `ln` and the
        // division (about 1e-12 here), so a value inside gets `key` from the formula as well.
        if key > i32::MIN && key < i32::MAX {
            let lo = ((key - 1) as f64 * self.ln_gamma).exp() * (1.0 + 1e-9);
            let hi = (key as f64 * self.ln_gamma).exp() * (1.0 - 1e-9);
            self.last_bin = (lo, hi, key);
        }
        key
    }

    /// This sketch with its pending run counted.
    fn settled(&self) -> std::borrow::Cow<'_, Sketch> {
        if self.run.1 == 0 {
            return std::borrow::Cow::Borrowed(self);
        }
        let mut s = self.clone();
        s.settle();
        std::borrow::Cow::Owned(s)
    }

    fn add_to_bin(&mut self, key: i32, count: u64) {
        if self.bins.is_empty() {
            self.offset = key;
            self.bins.push(0);
        } else if key < self.offset {
            let grow = (self.offset - key) as usize;
            if self.bins.len() + grow > self.max_bins {
                // Collapse: count it in the lowest bin.
                self.bins[0] += count;
                return;
            }
            self.bins.splice(0..0, std::iter::repeat_n(0, grow));
            self.offset = key;
        } else if key >= self.offset + self.bins.len() as i32 {
            let new_len = (key - self.offset + 1) as usize;
            self.bins.resize(new_len, 0);
            if self.bins.len() > self.max_bins {
                let excess = self.bins.len() - self.max_bins;
                let merged: u64 = self.bins[..=excess].iter().sum();
                self.bins.drain(..excess);
                self.bins[0] = merged;
                self.offset += excess as i32;
            }
        }
        let idx = (key - self.offset).max(0) as usize;
        self.bins[idx] += count;
    }

    /// Folds in another sketch with the same accuracy: exact counts, so the quantiles are those
    /// of one sketch fed every value.
    pub fn merge(&mut self, other: &Sketch) {
        assert!(self.gamma == other.gamma && self.max_bins == other.max_bins, "sketches of one accuracy");
        self.settle();
        let other = other.settled();
        self.moments.merge(&other.moments);
        self.zeros += other.zeros;
        for (i, &count) in other.bins.iter().enumerate() {
            if count > 0 {
                self.add_to_bin(other.offset + i as i32, count);
            }
        }
    }

    fn quantile(&self, q: f64) -> f64 {
        let target = rank(self.moments.count, q);
        if target < self.zeros {
            return 0.0;
        }
        let mut seen = self.zeros;
        for (i, &c) in self.bins.iter().enumerate() {
            seen += c;
            if seen > target {
                let key = self.offset + i as i32;
                return 2.0 * self.gamma.powi(key) / (self.gamma + 1.0);
            }
        }
        self.moments.max
    }

    pub fn summary(&self) -> Summary {
        let s = self.settled();
        s.moments.summary(|q| s.quantile(q))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_uses_rounded_rank() {
        let mut d = Samples::default();
        for x in [40.0, 75.0, 40.0] {
            d.add(x);
        }
        let s = d.summary();
        assert_eq!((s.median, s.p75, s.p99), (40.0, 75.0, 75.0));
        assert!((s.mean - 51.666666666666664).abs() < 1e-12);
        assert!((s.std - 16.49915822768611).abs() < 1e-12, "population std");
    }

    #[test]
    fn remembered_bins_agree_with_the_logarithm() {
        // Values drifting slowly (as pass durations do), jumping, and sitting on and next to bin
        // edges: the remembered bin must always be the one the formula gives.
        let mut s = Sketch::default();
        let formula = |x: f64| (x.ln() / s.ln_gamma).ceil() as i32;
        let mut values = Vec::new();
        let mut x = 3.0;
        for i in 0..20_000 {
            x *= 1.0 + 1e-5 * ((i % 7) as f64 - 2.0);
            values.push(x);
        }
        for k in [-3000, -1, 0, 1, 17, 2000, 9000] {
            let edge = (k as f64 * s.ln_gamma).exp();
            for ulps in -3i64..=3 {
                values.push(f64::from_bits((edge.to_bits() as i64 + ulps) as u64));
            }
        }
        values.extend([1e-300, 1e300, 0.5, 1.0, 2.0, 7.25, 7.25]);
        let expected: Vec<i32> = values.iter().map(|&x| formula(x)).collect();
        for (&x, &want) in values.iter().zip(&expected) {
            let (lo, hi, cached) = s.last_bin;
            let got = if x > lo && x < hi { cached } else { s.bin_of(x) };
            assert_eq!(got, want, "value {x:e}");
        }
    }

    #[test]
    fn sketch_matches_reference_probe() {
        // Pooled token gaps of probe c2: seven gaps of 10 ms and two of 50 ms.
        let mut s = Sketch::default();
        for x in [50.0, 10.0, 50.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0] {
            s.add(x);
        }
        let sum = s.summary();
        assert!((sum.median - 10.004152608697646).abs() < 1e-9, "{}", sum.median);
        assert!((sum.p90 - 50.04891385534592).abs() < 1e-9, "{}", sum.p90);
        assert_eq!((sum.min, sum.max), (10.0, 50.0));
        assert!((sum.mean - 18.88888888888889).abs() < 1e-12);
        assert!((sum.std - 16.62958838566196).abs() < 1e-9);
        let mut per_user = Sketch::default();
        for x in [20.0, 100.0, 20.0, 100.0, 100.0, 100.0, 100.0, 100.0, 100.0] {
            per_user.add(x);
        }
        assert!((per_user.summary().median - 99.9830863317801).abs() < 1e-9);
    }

    #[test]
    fn sketch_is_within_relative_accuracy() {
        let mut s = Sketch::default();
        let mut exact = Samples::default();
        let mut x = 0.37f64;
        for i in 0..20_000 {
            x = (x * 7919.0 + i as f64).rem_euclid(1000.0) + 0.01;
            s.add(x);
            exact.add(x);
        }
        let (a, b) = (s.summary(), exact.summary());
        for (q, e) in [(a.median, b.median), (a.p90, b.p90), (a.p99, b.p99)] {
            assert!((q - e).abs() <= 0.001 * e + 1e-12, "{q} vs {e}");
        }
    }

    #[test]
    fn samples_turn_into_a_sketch_past_their_limit() {
        let mut s = Samples::with_limit(1000);
        for i in 0..1000 {
            s.add(1.0 + i as f64);
        }
        assert!(s.is_exact());
        assert_eq!(s.summary().p90, 900.0, "rank round(999 * 0.9) = 899 holds 900");
        s.add(2000.0);
        assert!(!s.is_exact());
        let sum = s.summary();
        assert_eq!((sum.count, sum.min, sum.max), (1001, 1.0, 2000.0));
        assert!((sum.p90 - 901.0).abs() <= 0.001 * 901.0, "{}", sum.p90);
        assert!((sum.mean - (500_500.0 + 2000.0) / 1001.0).abs() < 1e-9);
    }

    #[test]
    fn expecting_too_many_values_sketches_from_the_start_with_the_same_result() {
        let (mut folded, mut early, mut small) =
            (Samples::with_limit(100), Samples::with_limit(100), Samples::with_limit(100));
        early.expect(150);
        small.expect(100);
        assert!(!early.is_exact() && small.is_exact(), "only more than the limit sketches");
        for i in 0..150 {
            let x = (i as f64 * 0.61).cos().abs() * 40.0 + 1.0;
            folded.add(x);
            early.add(x);
        }
        let (a, b) = (folded.summary(), early.summary());
        assert_eq!((a.count, a.min, a.max, a.median, a.p90, a.p99), (b.count, b.min, b.max, b.median, b.p90, b.p99));
        assert_eq!((a.mean, a.std), (b.mean, b.std), "same values in the same order");
    }

    #[test]
    fn merged_sketches_equal_one_fed_every_value() {
        let (mut a, mut b, mut all) = (Sketch::default(), Sketch::default(), Sketch::default());
        for i in 0..5000 {
            let x = if i % 7 == 0 { 0.0 } else { (i as f64 * 0.37).sin().abs() * 100.0 + i as f64 * 1e-3 };
            if i % 3 == 0 { &mut a } else { &mut b }.add(x);
            all.add(x);
        }
        a.merge(&b);
        let (m, w) = (a.summary(), all.summary());
        assert_eq!((m.count, m.min, m.max), (w.count, w.min, w.max));
        assert_eq!((m.median, m.p75, m.p90, m.p95, m.p99), (w.median, w.p75, w.p90, w.p95, w.p99));
        assert!((m.mean - w.mean).abs() <= 1e-12 * w.mean && (m.std - w.std).abs() <= 1e-9 * w.std);
    }

    #[test]
    fn repeated_adds_equal_single_adds() {
        let (mut one_by_one, mut batched) = (Sketch::default(), Sketch::default());
        for (x, n) in [(12.5, 7), (0.0, 2), (3.25, 1), (12.5, 30), (99.0, 4)] {
            for _ in 0..n {
                one_by_one.add(x);
            }
            batched.add_n(x, n);
        }
        let (a, b) = (one_by_one.summary(), batched.summary());
        assert_eq!((a.count, a.min, a.max, a.median, a.p90, a.p99), (b.count, b.min, b.max, b.median, b.p90, b.p99));
        assert!((a.mean - b.mean).abs() < 1e-12 * a.mean && (a.std - b.std).abs() < 1e-9 * a.std);
    }

    #[test]
    fn merged_samples_stay_exact_while_they_fit() {
        let (mut a, mut b) = (Samples::with_limit(10), Samples::with_limit(10));
        for i in 0..5 {
            a.add(i as f64);
            b.add(10.0 + i as f64);
        }
        a.merge(&b);
        assert!(a.is_exact());
        assert_eq!((a.summary().count, a.summary().median), (10, 10.0));
        a.merge(&b);
        assert!(!a.is_exact(), "15 values do not fit a limit of 10");
        assert_eq!((a.summary().count, a.summary().max), (15, 14.0));
    }

    #[test]
    fn empty_distributions_report_zeros() {
        assert_eq!(Samples::default().summary(), Summary::default());
        assert_eq!(Sketch::default().summary(), Summary::default());
    }
}
