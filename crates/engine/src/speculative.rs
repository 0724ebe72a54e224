//! Speculative decoding (MTP / Eagle): how many draft tokens a decode forward accepts.
//!
//! With conditional acceptance rates `r₀ … r₍ₙ₋₁₎`, a forward always yields the verified token
//! and then keeps drafted token `i` with probability `rᵢ` as long as every earlier one was kept:
//! the expected burst is `1 + Σᵢ Πⱼ≤ᵢ rⱼ`.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha12Rng;

/// Speculative decoding settings (`aic_nextn`, `aic_nextn_accept_rates`, `aic_mtp_seed`).
#[derive(Clone, Debug, PartialEq)]
pub struct SpeculativeConfig {
    /// Draft tokens per forward, 1..=5.
    pub nextn: u32,
    /// Conditional acceptance probability of each draft position (`nextn` of them).
    pub accept_rates: Vec<f64>,
    pub seed: u64,
    /// Whose speculative schedule the engine follows.
    pub schedule: SpecSchedule,
}

/// The two references schedule speculative decoding differently around the prefill and the
/// batch budget (same sampler, same forward timing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SpecSchedule {
    /// Dynamo 1.6.1's mocker (engine arguments): a request whose prompt completes in a pass joins
    /// that pass's draft forward and may emit a burst as its first output; drafts take no batch
    /// budget.
    #[default]
    Dynamo,
    /// aisimulate 0.13's engine (the unified config): a first token out of the prefill comes
    /// alone, with no decode forward; and vLLM charges each decoding request its `nextn` drafts
    /// against `max_num_batched_tokens`, as vLLM schedules speculative tokens.
    Aisimulate,
}

impl SpeculativeConfig {
    /// Dynamo's default rates, truncated to `nextn`.
    pub const DEFAULT_RATES: [f64; 5] = [0.85, 0.3, 0.0, 0.0, 0.0];

    /// Largest burst of one forward.
    pub fn max_burst(&self) -> u32 {
        self.nextn + 1
    }
}

/// Dynamo 1.6.1's reading of `aic_nextn_accept_rates` for a depth of `nextn` (checked first:
/// 1..=5): a comma-separated string of numbers, each finite and in [0, 1]; an absent or blank
/// string means the default rates; missing trailing positions are 0 and extra ones are dropped.
/// Errors are Dynamo's messages.
pub fn conditional_accept_rates(nextn: u32, rates: Option<&str>) -> Result<Vec<f64>, String> {
    if !(1..=5).contains(&nextn) {
        return Err(format!("aic_nextn must be in 1..=5, got {nextn}"));
    }
    let mut parsed = match rates.map(str::trim).filter(|r| !r.is_empty()) {
        // Rust's float syntax, as the reference parses it ("inf", "nan", ".5", "5e-1").
        Some(text) => text
            .split(',')
            .map(|r| r.trim().parse::<f64>().map_err(|e| format!("invalid aic_nextn_accept_rates value {r:?}: {e}")))
            .collect::<Result<Vec<_>, _>>()?,
        None => SpeculativeConfig::DEFAULT_RATES.to_vec(),
    };
    if let Some((i, r)) = parsed.iter().enumerate().find(|(_, r)| !(r.is_finite() && (0.0..=1.0).contains(*r))) {
        return Err(format!("aic_nextn_accept_rates[{i}] must be finite and in [0, 1], got {r}"));
    }
    parsed.resize(nextn as usize, 0.0);
    Ok(parsed)
}

/// The draft scheme of an AIS timing config's `speculation` (Dynamo 1.6.1's
/// `ForwardPassSpeculationConfig`): `{"kind": "ngram", "params": {"num_speculative_tokens": n}}`
/// is the only scheme it knows. Returns the number of speculative tokens, or serde's message for
/// a malformed value, as the reference words it.
pub fn ais_speculation_tokens(v: &serde_json::Value) -> Result<u32, String> {
    use serde_json::Value;
    let describe = |v: &Value| match v {
        Value::Null => "null".to_string(),
        Value::Bool(b) => format!("boolean `{b}`"),
        Value::Number(n) if n.is_f64() => format!("floating point `{n}`"),
        Value::Number(n) => format!("integer `{n}`"),
        Value::String(s) => format!("string {s:?}"),
        Value::Array(_) => "sequence".to_string(),
        Value::Object(_) => "map".to_string(),
    };
    let obj = match v {
        Value::Object(o) => o,
        Value::Array(a) => {
            return Err(format!(
                "invalid length {}, expected adjacently tagged enum ForwardPassSpeculationConfig",
                a.len()
            ))
        }
        other => {
            return Err(format!(
                "invalid type: {}, expected adjacently tagged enum ForwardPassSpeculationConfig",
                describe(other)
            ))
        }
    };
    if let Some(k) = obj.keys().find(|k| *k != "kind" && *k != "params") {
        return Err(format!("invalid value: string {k:?}, expected \"kind\" or \"params\""));
    }
    match obj.get("kind") {
        None => return Err("missing field `kind`".into()),
        Some(Value::String(s)) if s == "ngram" => {}
        Some(Value::String(s)) => return Err(format!("unknown variant `{s}`, expected `ngram`")),
        Some(other) => return Err(format!("invalid type: {}, expected string or map", describe(other))),
    }
    let params = match obj.get("params") {
        None => return Err("missing field `params`".into()),
        Some(Value::Object(p)) => p,
        Some(other) => {
            return Err(format!(
                "invalid type: {}, expected struct variant ForwardPassSpeculationConfig::Ngram",
                describe(other)
            ))
        }
    };
    if let Some(k) = params.keys().find(|k| *k != "num_speculative_tokens") {
        return Err(format!("unknown field `{k}`, expected `num_speculative_tokens`"));
    }
    match params.get("num_speculative_tokens") {
        None => Err("missing field `num_speculative_tokens`".into()),
        Some(Value::Number(n)) => match (n.as_u64(), n.as_i64()) {
            (Some(x), _) if x <= u32::MAX as u64 => Ok(x as u32),
            (Some(x), _) => Err(format!("invalid value: integer `{x}`, expected u32")),
            (None, Some(i)) => Err(format!("invalid value: integer `{i}`, expected u32")),
            _ => Err(format!("invalid type: floating point `{n}`, expected u32")),
        },
        Some(other) => Err(format!("invalid type: {}, expected u32", describe(other))),
    }
}

/// Draws burst sizes from a seeded stream.
#[derive(Clone, Debug)]
pub struct BurstSampler {
    rates: Vec<f64>,
    rng: ChaCha12Rng,
}

impl BurstSampler {
    /// One sampler per engine; the engine's index in its pool offsets the seed (as Dynamo
    /// offsets it by worker and rank).
    pub fn new(cfg: &SpeculativeConfig, engine_index: u32) -> Self {
        BurstSampler {
            rates: cfg.accept_rates.clone(),
            rng: ChaCha12Rng::seed_from_u64(cfg.seed.wrapping_add(engine_index as u64)),
        }
    }

    /// Tokens one forward produces for a request with `remaining` tokens left to generate.
    pub fn sample(&mut self, remaining: u32) -> u32 {
        if remaining == 0 {
            return 0;
        }
        let mut tokens = 1;
        // `random_bool` as the reference draws: a rate of exactly 1 takes nothing from the stream
        // (a uniform draw compared with the rate would, and shift every later draw).
        for &r in &self.rates {
            if self.rng.random_bool(r) {
                tokens += 1;
            } else {
                break;
            }
        }
        tokens.min(remaining)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(rates: &[f64], seed: u64) -> BurstSampler {
        BurstSampler::new(
            &SpeculativeConfig {
                nextn: rates.len() as u32,
                accept_rates: rates.to_vec(),
                seed,
                schedule: SpecSchedule::Dynamo,
            },
            0,
        )
    }

    #[test]
    fn fixed_rates_give_fixed_bursts() {
        assert_eq!(sampler(&[0.0, 1.0], 42).sample(10), 1);
        assert_eq!(sampler(&[1.0, 1.0], 42).sample(10), 3);
        assert_eq!(sampler(&[1.0, 0.0, 1.0], 42).sample(10), 2, "acceptance stops at the first rejection");
        assert_eq!(sampler(&[1.0, 1.0], 42).sample(2), 2, "capped by what is left");
        assert_eq!(sampler(&[1.0, 1.0], 42).sample(0), 0);
    }

    /// A certain acceptance draws nothing (rand's Bernoulli), so the stream after it is the
    /// stream without it: Dynamo 1.6.1's TRT-LLM replay with rates "1,0.8,0.5,0.2" differed by
    /// 2.6 % in p99 TTFT while a uniform draw was spent on the leading 1.
    #[test]
    fn a_certain_acceptance_takes_no_draw() {
        let mut certain = sampler(&[1.0, 0.5], 9);
        let mut plain = sampler(&[0.5], 9);
        for _ in 0..200 {
            assert_eq!(certain.sample(10), plain.sample(10) + 1);
        }
    }

    #[test]
    fn seeded_streams() {
        let draw = |seed| {
            let mut s = sampler(&[0.5, 0.5, 0.5], seed);
            (0..64).map(|_| s.sample(100)).collect::<Vec<_>>()
        };
        assert_eq!(draw(42), draw(42));
        assert_ne!(draw(42), draw(43));
    }

    #[test]
    fn mean_burst_matches_the_rates() {
        let mut s = sampler(&[0.7, 0.5, 0.2], 7);
        let n = 200_000;
        let mean = (0..n).map(|_| s.sample(100) as f64).sum::<f64>() / n as f64;
        // 1 + 0.7 + 0.7·0.5 + 0.7·0.5·0.2 = 2.12
        assert!((mean - 2.12).abs() < 0.01, "{mean}");
    }
}
