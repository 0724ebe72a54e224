//! Forward-pass timing models.
//!
//! A pass costs `prefill_ms + decode_ms`. Prefill is paid when the pass computes new prompt
//! tokens, decode when at least one request that already had its first token generates. An
//! external model may instead time a pass that does both as one fused forward
//! ([`PassTimer::fused_ms`]), which is what vLLM's chunked-prefill batches are on a GPU.
//!
//! Besides the built-in models, a [`PassTimer`] implemented outside the engine (the data-driven
//! AIS model of `servesim-perf`) can time passes: it is configured as
//! `{"type": "external", "provider": NAME, "config": {...}}` and built by the caller's
//! [`TimerFactory`], since the engine itself reads no files.

use std::sync::{Arc, Mutex};

use crate::profile::Profile;
use servesim_config::{ConfigError, Reader, Result};

#[derive(Clone, Debug, PartialEq)]
pub enum TimingModel {
    /// Dynamo's default polynomial fit.
    Polynomial,
    /// Constant per-pass costs.
    Fixed { prefill_ms: f64, decode_ms: f64 },
    /// Interpolated from a measured profile (`path` is where it was read from). `dynamo_form`:
    /// the configuration named it as Dynamo does, `{"type": "external", "provider":
    /// "dynamo_profile", "config": {"path": ...}}`, and its canonical form says so again.
    Interpolated { path: String, profile: Arc<Profile>, dynamo_form: bool },
    /// A model implemented outside the engine.
    External(ExternalTimer),
}

/// A forward-pass time model implemented outside the engine crate. Its methods get the
/// shapes the reference's timing providers get (integer means, as Dynamo computes them, or a
/// prefill's totals) and return milliseconds, or why the pass cannot be timed (a query outside
/// the model's data).
pub trait PassTimer: Send + Sync + std::fmt::Debug {
    /// A prefill of `batch` requests whose prompts reach `mean_isl` tokens at the end of the pass,
    /// `mean_prefix` of them already computed (cached or earlier chunks).
    fn prefill_ms(&self, batch: u32, mean_isl: u64, mean_prefix: u64) -> std::result::Result<f64, String>;
    /// A prefill step at the pass's exact totals (`shape.batch > 0`, at least one new token).
    /// aisimulate hands its providers the totals; a model indexed by iteration totals (an FPM
    /// table) reads them as they are, every other one at Dynamo's integer means, which is the
    /// default (a pass whose means leave no new token costs nothing, as before).
    fn prefill_totals_ms(&self, shape: &PrefillShape) -> std::result::Result<f64, String> {
        let b = u64::from(shape.batch.max(1));
        let (isl, prefix) = (shape.total_isl / b, shape.total_prefix / b);
        if isl <= prefix {
            return Ok(0.0);
        }
        self.prefill_ms(shape.batch, isl, prefix)
    }
    /// A decode step of `batch` requests holding `context_tokens` tokens of KV in all, on a rank
    /// whose cache holds `capacity_tokens`.
    fn decode_ms(&self, batch: u32, context_tokens: u64, capacity_tokens: u64) -> std::result::Result<f64, String>;
    /// The provider's configuration, for the canonical dump of the engine configuration.
    fn config(&self) -> serde_json::Value;
    /// Whether this model times a pass that both computes prompt tokens and decodes as one
    /// fused forward ([`PassTimer::fused_ms`]) instead of as a prefill step plus a decode step.
    fn fuses_mixed_passes(&self) -> bool {
        false
    }
    /// A mixed pass as one forward, given its prefill part and its decode part. Called only
    /// when [`PassTimer::fuses_mixed_passes`] says so; a model that fuses implements it.
    fn fused_ms(&self, _prefill: &PrefillShape, _decode: &DecodeShape) -> std::result::Result<f64, String> {
        Err("this timing model does not time fused passes".into())
    }
    /// KV-cache blocks of one rank sized from the GPU's memory, as the reference sizes them
    /// when the configuration gives no `num_gpu_blocks`. `None`: the model knows nothing of
    /// memory, and the engine's default capacity stays.
    fn kv_cache_blocks(&self, _memory: &KvMemory) -> Option<std::result::Result<u64, String>> {
        None
    }
    /// One call of the vision tower a worker hosts (native VL replay) over `images` images of
    /// the workload's one shape, run inside a prefill pass before its language layers.
    fn vision_ms(&self, _images: u32) -> std::result::Result<f64, String> {
        Err("this timing model hosts no vision tower".into())
    }
}

/// What sizing a KV cache from memory takes from the engine's configuration (Dynamo's
/// `capacity_estimation_options`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct KvMemory {
    pub block_size: u32,
    /// The per-pass token budget (activation memory); None when unbounded.
    pub max_num_batched_tokens: Option<u32>,
    pub limits: MemoryLimits,
}

/// The memory knobs of a launch: vLLM's, SGLang's and TRT-LLM's memory fractions (each
/// backend reads its own; None: the backend's default) and bytes reserved outside the KV pool
/// for CUDA graphs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MemoryLimits {
    pub gpu_memory_utilization: Option<f64>,
    pub mem_fraction_static: Option<f64>,
    pub free_gpu_memory_fraction: Option<f64>,
    pub cuda_graph_reserved_bytes: Option<u64>,
}

/// Builds a [`PassTimer`] from `{"provider": NAME, "config": {...}}`; `key` is the key path of
/// the configuration, for errors.
pub type TimerFactory<'a> =
    &'a dyn Fn(&str, &str, &serde_json::Value) -> std::result::Result<Arc<dyn PassTimer>, ConfigError>;

/// An external [`PassTimer`] and the first error it reported. A pass it cannot time lasts NaN
/// milliseconds; drivers check every pass end and stop with [`TimingModel::error`].
#[derive(Clone, Debug)]
pub struct ExternalTimer {
    pub provider: String,
    timer: Arc<dyn PassTimer>,
    error: Arc<Mutex<Option<String>>>,
}

impl ExternalTimer {
    pub fn new(provider: impl Into<String>, timer: Arc<dyn PassTimer>) -> Self {
        ExternalTimer { provider: provider.into(), timer, error: Arc::default() }
    }

    pub fn timer(&self) -> &Arc<dyn PassTimer> {
        &self.timer
    }

    fn checked(&self, what: &str, result: std::result::Result<f64, String>) -> f64 {
        let why = match result {
            Ok(ms) if ms.is_finite() && ms >= 0.0 => return ms,
            Ok(ms) => format!("the {} timing model returned {ms} ms for a {what} pass", self.provider),
            Err(why) => format!("the {} timing model cannot time a {what} pass: {why}", self.provider),
        };
        self.error.lock().expect("timer error lock").get_or_insert(why);
        f64::NAN
    }
}

impl PartialEq for ExternalTimer {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.timer, &other.timer)
    }
}

/// An external model before it is built.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TimerRef {
    pub key: String,
    pub provider: String,
    pub config: serde_json::Value,
}

/// A profile a configuration refers to, before it is read.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ProfileRef {
    /// Key path of the reference, for errors.
    pub key: String,
    pub path: String,
    /// Use the polynomial model if the profile cannot be read.
    pub fallback: bool,
    /// Given as Dynamo's `provider: "dynamo_profile"` (see [`TimingModel::Interpolated`]).
    pub dynamo_form: bool,
}

/// Dynamo's name for profile timing: an external model whose config holds only the NPZ's path.
pub const DYNAMO_PROFILE_PROVIDER: &str = "dynamo_profile";

/// Prefill shape of one pass, in Dynamo's aggregate form.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefillShape {
    /// Requests that computed prompt tokens in this pass.
    pub batch: u32,
    /// Σ prompt length reached by each of them at the end of this pass.
    pub total_isl: u64,
    /// Σ prompt tokens each of them had before this pass (cache hits and earlier chunks).
    pub total_prefix: u64,
}

impl PrefillShape {
    /// New prompt tokens as the model sees them: `batch × (mean isl − mean prefix)` with
    /// integer means, which is what Dynamo passes to its perf model.
    pub fn new_tokens(&self) -> u64 {
        if self.batch == 0 {
            return 0;
        }
        let b = self.batch as u64;
        b * (self.total_isl / b).saturating_sub(self.total_prefix / b)
    }
}

/// Decode shape of one pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecodeShape {
    /// Requests past their first token that generate in this pass.
    pub batch: u32,
    /// Σ current length (prompt + generated so far) of those requests.
    pub context_tokens: u64,
    /// KV capacity of the rank in tokens.
    pub capacity_tokens: u64,
}

impl TimingModel {
    /// Reads a `timing_model` object; an interpolated model comes back as a reference to its
    /// profile file.
    pub(crate) fn read(r: &mut Reader) -> Result<Unresolved> {
        match r.choice("type", &["polynomial", "fixed", "interpolated", "external"])?.set() {
            None => Err(ConfigError::new(
                r.path("type"),
                "missing; expected \"polynomial\", \"fixed\", \"interpolated\" or \"external\"",
            )),
            Some(0) => Ok(Unresolved::Model(TimingModel::Polynomial)),
            Some(3) => {
                let provider = r
                    .string("provider")?
                    .set()
                    .ok_or_else(|| ConfigError::new(r.path("provider"), "missing (the external timing model's name)"))?
                    .to_string();
                if provider == DYNAMO_PROFILE_PROVIDER {
                    // Dynamo's `--planner-profile-data`: the same interpolated model, read now.
                    let Some(mut c) = r.object("config")? else {
                        return Err(ConfigError::new(
                            r.path("config"),
                            "missing (the dynamo_profile timing model needs {\"path\": NPZ})",
                        ));
                    };
                    let key = c.path("path");
                    let path = c
                        .string("path")?
                        .set()
                        .ok_or_else(|| ConfigError::new(&key, "missing (the profile NPZ to interpolate)"))?
                        .to_string();
                    c.finish()?;
                    return Ok(Unresolved::Profile(ProfileRef { key, path, fallback: false, dynamo_form: true }));
                }
                let config = r.raw("config").cloned().unwrap_or(serde_json::Value::Object(Default::default()));
                Ok(Unresolved::Timer(TimerRef { key: r.path("config"), provider, config }))
            }
            Some(2) => {
                let path = r
                    .string("path")?
                    .set()
                    .ok_or_else(|| ConfigError::new(r.path("path"), "missing (the profile NPZ to interpolate)"))?
                    .to_string();
                let fallback = match r.string("fallback")?.set() {
                    None => false,
                    Some("polynomial") => true,
                    Some(other) => {
                        return Err(ConfigError::new(
                            r.path("fallback"),
                            format!("unknown value {other:?}; expected \"polynomial\""),
                        ))
                    }
                };
                Ok(Unresolved::Profile(ProfileRef { key: r.path("path"), path, fallback, dynamo_form: false }))
            }
            Some(_) => {
                let mut get = |key: &'static str| -> Result<f64> {
                    match r.f64(key)?.set() {
                        Some(v) if v.is_finite() && v >= 0.0 => Ok(v),
                        Some(v) => Err(ConfigError::new(r.path(key), format!("must be a finite number ≥ 0, got {v}"))),
                        None => Err(ConfigError::new(r.path(key), "missing (required by the fixed timing model)")),
                    }
                };
                let prefill_ms = get("prefill_ms")?;
                let decode_ms = get("decode_ms")?;
                Ok(Unresolved::Model(TimingModel::Fixed { prefill_ms, decode_ms }))
            }
        }
    }

    /// Unscaled prefill time of a pass in ms. An external model gets the pass's totals
    /// ([`PassTimer::prefill_totals_ms`]), the built-in ones Dynamo's new-token count.
    /// One call of the hosted vision tower over `images` images (0 ms for none). Only an
    /// external model times one; the configuration refuses a tower beside any other.
    pub fn vision_ms(&self, images: u32) -> f64 {
        if images == 0 {
            return 0.0;
        }
        match self {
            TimingModel::External(e) => e.checked("vision", e.timer.vision_ms(images)),
            _ => f64::NAN,
        }
    }

    pub fn prefill_ms(&self, shape: &PrefillShape) -> f64 {
        let t = shape.new_tokens();
        match self {
            TimingModel::External(e) => {
                if shape.batch == 0 || shape.total_isl <= shape.total_prefix {
                    return 0.0;
                }
                e.checked("prefill", e.timer.prefill_totals_ms(shape))
            }
            _ if t == 0 => 0.0,
            TimingModel::Polynomial => {
                let t = t as f64;
                (4.209989e-07 * t * t + 1.518344e-02 * t + 1.650142e+01).max(0.0)
            }
            TimingModel::Fixed { prefill_ms, .. } => *prefill_ms,
            TimingModel::Interpolated { profile, .. } => profile.prefill_ms(t as f64),
        }
    }

    /// Unscaled decode time of a pass in ms.
    pub fn decode_ms(&self, shape: &DecodeShape) -> f64 {
        if shape.batch == 0 {
            return 0.0;
        }
        match self {
            TimingModel::Polynomial => {
                let p = if shape.capacity_tokens == 0 {
                    1.0
                } else {
                    (shape.context_tokens as f64 / shape.capacity_tokens as f64).min(1.0)
                };
                (-25.74 * p * p + 54.01 * p + 5.74).max(1.0)
            }
            TimingModel::Fixed { decode_ms, .. } => *decode_ms,
            // Interpolated at (tokens in the batch's KV, integer mean context).
            TimingModel::Interpolated { profile, .. } => {
                profile.decode_ms(shape.context_tokens as f64, (shape.context_tokens / shape.batch as u64) as f64)
            }
            TimingModel::External(e) => {
                e.checked("decode", e.timer.decode_ms(shape.batch, shape.context_tokens, shape.capacity_tokens))
            }
        }
    }

    /// A pass that computes prompt tokens and decodes, timed as one fused forward, when the
    /// model does that (an external model whose [`PassTimer::fuses_mixed_passes`]); None when
    /// the pass costs its prefill part plus its decode part, as Dynamo times it.
    pub fn fused_ms(&self, prefill: &PrefillShape, decode: &DecodeShape) -> Option<f64> {
        match self {
            TimingModel::External(e) if e.timer.fuses_mixed_passes() && prefill.batch > 0 && decode.batch > 0 => {
                Some(e.checked("mixed", e.timer.fused_ms(prefill, decode)))
            }
            _ => None,
        }
    }

    /// Whether mixed passes are timed as one fused forward (see [`TimingModel::fused_ms`]).
    pub fn fuses_mixed_passes(&self) -> bool {
        matches!(self, TimingModel::External(e) if e.timer.fuses_mixed_passes())
    }

    /// Why an external model could not time a pass (the pass lasted NaN ms), if it failed.
    pub fn error(&self) -> Option<String> {
        match self {
            TimingModel::External(e) => e.error.lock().expect("timer error lock").clone(),
            _ => None,
        }
    }
}

/// The largest `--timing-jitter-cv`: beyond it a log-normal factor is mostly tiny passes and a
/// rare huge one, which no longer describes run-to-run variation of a forward pass.
pub const MAX_TIMING_JITTER_CV: f64 = 1.0;

/// Per-pass timing noise: every forward pass's modelled duration is multiplied by a random
/// factor with mean 1 and coefficient of variation `cv`, drawn from a stream seeded by `seed`
/// (offset by the engine's index in its pool). Off unless the driver asks for it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TimingJitter {
    pub cv: f64,
    pub seed: u64,
}

impl TimingJitter {
    /// Jitter of `cv` (finite, 0 ≤ cv ≤ [`MAX_TIMING_JITTER_CV`]); None for 0, which leaves
    /// every duration as the model gives it.
    pub fn new(cv: f64, seed: u64) -> std::result::Result<Option<TimingJitter>, String> {
        if !(cv.is_finite() && (0.0..=MAX_TIMING_JITTER_CV).contains(&cv)) {
            return Err(format!("must be a finite number between 0 and {MAX_TIMING_JITTER_CV}, got {cv}"));
        }
        Ok((cv > 0.0).then_some(TimingJitter { cv, seed }))
    }
}

/// One engine's jitter stream: one factor per pass, applied to the pass's prefill and decode
/// parts alike (a slow pass is slow as a whole).
///
/// The factor is log-normal, exp(N(μ, σ²)) with σ² = ln(1 + cv²) and μ = −σ²/2, so its mean is
/// exactly 1 (the timing model stays unbiased on average) and its CV exactly `cv`. Log-normal
/// rather than normal because a duration must stay positive at any CV, and rather than gamma
/// because it needs only one normal draw per pass and its right skew (rare slow passes, no
/// pass much faster than the model) is the shape measured GPU step times have.
#[derive(Debug)]
pub(crate) struct PassJitter {
    rng: rand_chacha::ChaCha12Rng,
    mu: f64,
    sigma: f64,
    factor: f64,
}

impl PassJitter {
    pub fn new(jitter: Option<TimingJitter>, engine_index: u32) -> Option<PassJitter> {
        use rand::SeedableRng;
        let j = jitter?;
        let sigma2 = (1.0 + j.cv * j.cv).ln();
        // Engines of a pool draw different streams; the constant keeps the stream apart from
        // the token and speculative streams that share the run's seed.
        let seed = j.seed ^ 0x6A09_E667_F3BC_C908 ^ (engine_index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        Some(PassJitter {
            rng: rand_chacha::ChaCha12Rng::seed_from_u64(seed),
            mu: -sigma2 / 2.0,
            sigma: sigma2.sqrt(),
            factor: 1.0,
        })
    }

    /// Draws the factor of the next pass.
    pub fn next_pass(&mut self) {
        use rand::Rng;
        // Box–Muller: u1 in (0, 1] keeps the logarithm finite.
        let u1: f64 = 1.0 - self.rng.random::<f64>();
        let u2: f64 = self.rng.random::<f64>();
        let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        self.factor = (self.mu + self.sigma * z).exp();
    }

    /// `ms` of the current pass, jittered.
    pub fn apply(&self, ms: f64) -> f64 {
        ms * self.factor
    }
}

/// `ms` under an engine's jitter, if it has one (the model's value exactly otherwise).
pub(crate) fn jittered(jitter: &Option<PassJitter>, ms: f64) -> f64 {
    match jitter {
        Some(j) => j.apply(ms),
        None => ms,
    }
}

/// A `timing_model` as read, before referenced files and external models are resolved.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Unresolved {
    Model(TimingModel),
    Profile(ProfileRef),
    Timer(TimerRef),
}

/// A duration in ms rounded to whole nanoseconds the way Dynamo's `Duration`-based clock does
/// it (through `Duration::from_secs_f64`, and back through seconds), so summed pass times match
/// its to the last bit. Negative durations are zero; infinite and NaN ones stay so.
pub fn whole_ns(ms: f64) -> f64 {
    pass_duration_ms(ms, 1.0)
}

/// A predicted duration in ms divided by a speedup ratio (ratios ≤ 0 leave it unscaled, as
/// Dynamo does), in whole nanoseconds. Like Dynamo, it rounds twice: the predicted duration to
/// whole nanoseconds, then the scaled one (a single rounding is off by 1 ns about one time in
/// four).
pub fn pass_duration_ms(ms: f64, ratio: f64) -> f64 {
    if ms.is_nan() {
        // An external model that could not time the pass (see `ExternalTimer::checked`): the
        // pass has no duration, and the driver stops with the model's reason.
        return f64::NAN;
    }
    let ms = ms.max(0.0);
    let Some(unscaled) = secs_to_ns(ms / 1000.0) else { return f64::INFINITY };
    // A whole number of nanoseconds under 1,000 s survives the trip through seconds unchanged, so
    // an unscaled pass needs no second rounding.
    let modeled = if ratio > 0.0 && unscaled > 0 && !(ratio == 1.0 && unscaled < 1_000_000_000_000) {
        let Some(ns) = secs_to_ns(ns_to_secs(unscaled) / ratio) else { return f64::INFINITY };
        ns
    } else {
        unscaled
    };
    ns_to_secs(modeled) * 1000.0
}

/// `Duration::try_from_secs_f64(secs)` in nanoseconds (`None` when out of range). Passes are
/// timed by the million, so the common case skips the exact conversion: a product `secs × 1e9`
/// whose fraction is not within 0.001 of a half rounds the same as the exact value does (its
/// error is below 1e-4 ns for any duration under 1,000 s).
fn secs_to_ns(secs: f64) -> Option<u64> {
    let ns = secs * 1e9;
    if (0.0..1e12).contains(&ns) {
        // Truncation is the floor of a non-negative value, and the fraction is exact; this keeps
        // libm's floor and round (calls on baseline x86-64) out of the hottest path.
        let whole = ns as u64;
        let fraction = ns - whole as f64;
        if (fraction - 0.5).abs() > 1e-3 {
            return Some(whole + u64::from(fraction > 0.5));
        }
    }
    std::time::Duration::try_from_secs_f64(secs).ok().map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// `Duration::as_secs_f64` of a duration of `ns` nanoseconds.
fn ns_to_secs(ns: u64) -> f64 {
    (ns / 1_000_000_000) as f64 + (ns % 1_000_000_000) as f64 / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_factors_have_mean_one_and_the_requested_cv() {
        assert_eq!(TimingJitter::new(0.0, 1), Ok(None));
        for bad in [-0.01, 1.01, f64::NAN, f64::INFINITY] {
            assert!(TimingJitter::new(bad, 1).is_err(), "{bad}");
        }
        let n = 200_000;
        let mut j = PassJitter::new(TimingJitter::new(0.3, 9).unwrap(), 2).unwrap();
        let f: Vec<f64> = (0..n)
            .map(|_| {
                j.next_pass();
                j.apply(1.0)
            })
            .collect();
        assert!(f.iter().all(|&x| x > 0.0));
        let mean = f.iter().sum::<f64>() / n as f64;
        let sd = (f.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt();
        assert!((mean - 1.0).abs() < 0.003, "mean {mean}");
        assert!((sd / mean - 0.3).abs() < 0.004, "cv {}", sd / mean);
    }

    fn prefill(t: u64) -> f64 {
        TimingModel::Polynomial.prefill_ms(&PrefillShape { batch: 1, total_isl: t, total_prefix: 0 })
    }

    fn decode(p: f64) -> f64 {
        let cap = 1_000_000u64;
        TimingModel::Polynomial.decode_ms(&DecodeShape {
            batch: 1,
            context_tokens: (p * cap as f64) as u64,
            capacity_tokens: cap,
        })
    }

    #[test]
    fn scaled_pass_times_round_twice_like_the_reference() {
        // 5.8142446 ms is 5,814,244.6 ns: 5,814,245 ns before scaling, 2,907,122.5 ns after
        // halving, which Dynamo's clock rounds up (recorded: a trtllm decode pass at context
        // 181 of 131,584 tokens with speedup 4 × decode speedup 0.5 lasts 2.907123 ms in the
        // reference; halving first and rounding once gives 2.907122).
        let ns = |ms: f64| ms * 1e6;
        assert!((ns(pass_duration_ms(5.814244599709888, 2.0)) - 2_907_123.0).abs() < 1e-6);
        assert!((ns(whole_ns(5.814244599709888 / 2.0)) - 2_907_122.0).abs() < 1e-6);
        // Unscaled: one rounding to whole nanoseconds.
        assert!((ns(pass_duration_ms(1.0000004, 0.0)) - 1_000_000.0).abs() < 1e-6);
        assert!((ns(pass_duration_ms(1.0000006, 1.0)) - 1_000_001.0).abs() < 1e-6);
        assert_eq!(pass_duration_ms(-3.0, 2.0), 0.0);
        assert!(pass_duration_ms(f64::NAN, 2.0).is_nan(), "a failed timing model stays visible");
        assert_eq!(pass_duration_ms(f64::INFINITY, 2.0), f64::INFINITY);
    }

    #[test]
    fn fast_rounding_agrees_with_std_durations() {
        use std::time::Duration;
        let exact = |ms: f64, ratio: f64| {
            let unscaled = Duration::from_secs_f64(ms / 1000.0);
            let d = if ratio > 0.0 && !unscaled.is_zero() {
                Duration::from_secs_f64(unscaled.as_secs_f64() / ratio)
            } else {
                unscaled
            };
            d.as_secs_f64() * 1000.0
        };
        // A deterministic spread of durations (0.000001 ms to ~100 s) and ratios, plus exact
        // half-nanosecond cases that take the slow path.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for i in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let ms = (x >> 11) as f64 / (1u64 << 53) as f64 * 10f64.powi((i % 12) as i32 - 6);
            let ratio = [1.0, 2.0, 4.0, 0.5, 1.3, 3.7, 0.0][i % 7];
            assert_eq!(pass_duration_ms(ms, ratio).to_bits(), exact(ms, ratio).to_bits(), "{ms} ms / {ratio}");
        }
        for n in 1..2000u64 {
            let ms = n as f64 / 1e6 + 0.5e-6;
            for ratio in [1.0, 2.0] {
                assert_eq!(pass_duration_ms(ms, ratio).to_bits(), exact(ms, ratio).to_bits(), "{ms} ms / {ratio}");
            }
        }
    }

    #[test]
    fn polynomial_reference_values() {
        for (t, want) in [
            (1, 16.5166),
            (64, 17.4749),
            (512, 24.3857),
            (1000, 32.1059),
            (2048, 49.3629),
            (8192, 169.1369),
            (16384, 378.2779),
        ] {
            assert!((prefill(t) - want).abs() < 1e-3, "prefill({t}) = {}", prefill(t));
        }
        for (p, want) in [(0.0, 5.74), (0.1, 10.8836), (0.25, 17.63375), (0.5, 26.31), (0.75, 31.76875), (1.0, 34.01)] {
            assert!((decode(p) - want).abs() < 1e-3, "decode({p}) = {}", decode(p));
        }
        // Utilisation is clamped at 1.
        assert!((decode(3.0) - 34.01).abs() < 1e-9);
    }

    #[test]
    fn prefill_uses_integer_means() {
        // Dynamo 1.6.1: prompts of 101 and 100 tokens cost prefill(200), not prefill(201).
        let shape = PrefillShape { batch: 2, total_isl: 201, total_prefix: 0 };
        assert_eq!(shape.new_tokens(), 200);
        assert!((TimingModel::Polynomial.prefill_ms(&shape) - 19.554948).abs() < 1e-6);
        // A fully cached prompt costs nothing.
        assert_eq!(
            TimingModel::Polynomial.prefill_ms(&PrefillShape { batch: 1, total_isl: 128, total_prefix: 128 }),
            0.0
        );
    }

    #[test]
    fn fixed_model_charges_per_phase() {
        let m = TimingModel::Fixed { prefill_ms: 40.0, decode_ms: 10.0 };
        assert_eq!(m.prefill_ms(&PrefillShape { batch: 3, total_isl: 300, total_prefix: 10 }), 40.0);
        assert_eq!(m.prefill_ms(&PrefillShape::default()), 0.0);
        assert_eq!(m.decode_ms(&DecodeShape { batch: 2, context_tokens: 5, capacity_tokens: 100 }), 10.0);
        assert_eq!(m.decode_ms(&DecodeShape::default()), 0.0);
    }
}

#[cfg(test)]
mod external_tests {
    use super::*;
    use crate::config::{ConfigEnv, EngineConfig};

    /// 1 ms per new prompt token (mean) per request; decode 2 ms per request; refuses batches
    /// over 4.
    #[derive(Debug)]
    struct Linear;

    impl PassTimer for Linear {
        fn prefill_ms(&self, batch: u32, isl: u64, prefix: u64) -> std::result::Result<f64, String> {
            Ok((batch as u64 * (isl - prefix)) as f64)
        }
        fn decode_ms(&self, batch: u32, _: u64, _: u64) -> std::result::Result<f64, String> {
            if batch > 4 {
                return Err(format!("batch {batch} is outside the measured range"));
            }
            Ok(2.0 * batch as f64)
        }
        fn config(&self) -> serde_json::Value {
            serde_json::json!({"slope": 1})
        }
    }

    /// [`Linear`], except that a pass that both prefills and decodes costs its larger part
    /// plus 1 ms, as one fused forward.
    #[derive(Debug)]
    struct FusedLinear;

    impl PassTimer for FusedLinear {
        fn prefill_ms(&self, batch: u32, isl: u64, prefix: u64) -> std::result::Result<f64, String> {
            Linear.prefill_ms(batch, isl, prefix)
        }
        fn decode_ms(&self, batch: u32, context: u64, capacity: u64) -> std::result::Result<f64, String> {
            Linear.decode_ms(batch, context, capacity)
        }
        fn fuses_mixed_passes(&self) -> bool {
            true
        }
        fn fused_ms(&self, p: &PrefillShape, d: &DecodeShape) -> std::result::Result<f64, String> {
            let b = u64::from(p.batch);
            let prefill = self.prefill_ms(p.batch, p.total_isl / b, p.total_prefix / b)?;
            Ok(prefill.max(self.decode_ms(d.batch, d.context_tokens, d.capacity_tokens)?) + 1.0)
        }
        fn config(&self) -> serde_json::Value {
            serde_json::json!({"slope": 1, "fused": true})
        }
    }

    fn with_linear(json: &str) -> servesim_config::Result<EngineConfig> {
        let factory = |key: &str, provider: &str, config: &serde_json::Value| {
            if provider != "linear" {
                return Err(ConfigError::new(key, format!("unknown provider {provider}")));
            }
            assert_eq!(config["slope"], 1);
            if config["fused"] == true {
                return Ok(Arc::new(FusedLinear) as Arc<dyn PassTimer>);
            }
            Ok(Arc::new(Linear) as Arc<dyn PassTimer>)
        };
        let value: serde_json::Value = serde_json::from_str(json).unwrap();
        EngineConfig::from_value_env(&value, ConfigEnv { timers: Some(&factory), ..ConfigEnv::NONE })
    }

    /// Pass durations of a vLLM engine that gets a 10-token prompt at 0 and, after its first
    /// pass, a 20-token prompt: pass 2 prefills the second beside the first's decode.
    fn mixed_pass_durations(fused: bool, decode_speedup: f64) -> servesim_config::Result<Vec<f64>> {
        use crate::{Engine, EngineOptions, EngineRequest, PassOutput, Prompt};
        let json = format!(
            r#"{{"engine": {{"block_size": 16, "num_gpu_blocks": 100, "decode_speedup_ratio": {decode_speedup},
                "timing_model": {{"type": "external", "provider": "linear", "config": {{"slope": 1, "fused": {fused}}}}}}}}}"#
        );
        let mut engine = Engine::new(with_linear(&json)?, EngineOptions::default());
        let prompt = |n: u32, salt: u32| Prompt::Tokens((0..n).map(|i| i + salt * 1000).collect::<Vec<_>>().into());
        engine.submit(EngineRequest::new(1, prompt(10, 1), 3, 1));
        let (mut now, mut durations) = (0.0, Vec::new());
        while engine.has_work() {
            let mut out = PassOutput::default();
            engine.step(now, &mut out);
            durations.push(out.end_ms - now);
            now = out.end_ms;
            if durations.len() == 1 {
                engine.submit(EngineRequest::new(2, prompt(20, 2), 2, 2));
            }
        }
        Ok(durations)
    }

    #[test]
    fn a_fusing_model_times_a_mixed_pass_as_one_forward() {
        // Additive: pass 2 is the 20-token prefill (20 ms) plus request 1's decode (2 ms).
        assert_eq!(mixed_pass_durations(false, 1.0).unwrap(), [10.0, 22.0, 4.0]);
        // Fused: max(20, 2) + 1. Passes that only prefill or only decode are timed as before.
        assert_eq!(mixed_pass_durations(true, 1.0).unwrap(), [10.0, 21.0, 4.0]);
        // A decode-only speedup cannot apply to a fused pass: refused by key.
        let e = mixed_pass_durations(true, 2.0).unwrap_err();
        assert_eq!(e.path, "decode_speedup_ratio");
        assert!(e.message.contains("fuses mixed passes"), "{}", e.message);
    }

    /// [`Linear`] at the pass's totals: 1 ms per new token, 1 µs per token read.
    #[derive(Debug)]
    struct Totals;

    impl PassTimer for Totals {
        fn prefill_ms(&self, _: u32, _: u64, _: u64) -> std::result::Result<f64, String> {
            Err("timed at the totals".into())
        }
        fn prefill_totals_ms(&self, p: &PrefillShape) -> std::result::Result<f64, String> {
            Ok((p.total_isl - p.total_prefix) as f64 + 1e-3 * p.total_prefix as f64)
        }
        fn decode_ms(&self, _: u32, _: u64, _: u64) -> std::result::Result<f64, String> {
            Ok(0.0)
        }
        fn config(&self) -> serde_json::Value {
            serde_json::json!({})
        }
    }

    /// A chunk remainder beside whole prompts (8 new tokens over 1016 cached, four 1024-token
    /// prompts): a model that takes totals gets them exactly; one that does not, Dynamo's means.
    #[test]
    fn an_external_model_may_take_a_prefill_at_its_totals() {
        let shape = PrefillShape { batch: 5, total_isl: 5120, total_prefix: 1016 };
        let totals = TimingModel::External(ExternalTimer::new("totals", Arc::new(Totals)));
        assert_eq!(totals.prefill_ms(&shape), 4104.0 + 1.016);
        assert_eq!(totals.error(), None);
        // Means 1024 and 203: 5 × 821 = 4105 new tokens.
        let means = TimingModel::External(ExternalTimer::new("linear", Arc::new(Linear)));
        assert_eq!(means.prefill_ms(&shape), 4105.0);
        // No new token: nothing to time, either way.
        let cached = PrefillShape { batch: 2, total_isl: 2048, total_prefix: 2048 };
        assert_eq!(totals.prefill_ms(&cached), 0.0);
        assert_eq!(means.prefill_ms(&cached), 0.0);
    }

    #[test]
    fn an_external_model_times_passes_and_reports_what_it_cannot_time() {
        let json =
            r#"{"engine": {"timing_model": {"type": "external", "provider": "linear", "config": {"slope": 1}}}}"#;
        let cfg = with_linear(json).unwrap();
        let m = &cfg.timing;
        // Integer means, as the reference hands them over: (101 + 100) / 2 = 100.
        assert_eq!(m.prefill_ms(&PrefillShape { batch: 2, total_isl: 201, total_prefix: 0 }), 200.0);
        assert_eq!(m.decode_ms(&DecodeShape { batch: 3, context_tokens: 30, capacity_tokens: 100 }), 6.0);
        assert_eq!(m.error(), None);
        assert!(m.decode_ms(&DecodeShape { batch: 5, context_tokens: 30, capacity_tokens: 100 }).is_nan());
        let why = m.error().unwrap();
        assert!(why.contains("cannot time a decode pass: batch 5 is outside"), "{why}");
        // The canonical dump keeps the provider and its configuration.
        let dump =
            crate::config::WorkerArgs { engine: cfg.clone(), deployment: Default::default() }.to_canonical_json();
        assert_eq!(dump["engine"]["timing_model"]["provider"], "linear");
        // Unknown providers and contexts without external models are refused by key path.
        let e = with_linear(r#"{"engine": {"timing_model": {"type": "external", "provider": "x"}}}"#).unwrap_err();
        assert_eq!(e.path, "engine.timing_model.config");
        let e = EngineConfig::parse_json(json).unwrap_err();
        assert!(e.message.contains("not available here"), "{}", e.message);
    }
}
