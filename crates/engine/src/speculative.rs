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
}

impl SpeculativeConfig {
    /// Dynamo's default rates, truncated to `nextn`.
    pub const DEFAULT_RATES: [f64; 5] = [0.85, 0.3, 0.0, 0.0, 0.0];

    /// Largest burst of one forward.
    pub fn max_burst(&self) -> u32 {
        self.nextn + 1
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
        for &r in &self.rates {
            if self.rng.random::<f64>() < r {
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
        BurstSampler::new(&SpeculativeConfig { nextn: rates.len() as u32, accept_rates: rates.to_vec(), seed }, 0)
    }

    #[test]
    fn fixed_rates_give_fixed_bursts() {
        assert_eq!(sampler(&[0.0, 1.0], 42).sample(10), 1);
        assert_eq!(sampler(&[1.0, 1.0], 42).sample(10), 3);
        assert_eq!(sampler(&[1.0, 0.0, 1.0], 42).sample(10), 2, "acceptance stops at the first rejection");
        assert_eq!(sampler(&[1.0, 1.0], 42).sample(2), 2, "capped by what is left");
        assert_eq!(sampler(&[1.0, 1.0], 42).sample(0), 0);
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
