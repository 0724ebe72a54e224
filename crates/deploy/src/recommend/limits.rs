//! How large a search may be: candidates a grid replays, the pool random and bayesian
//! searches draw from, and the values of one search domain (also the Planner's knobs').

use crate::error::DeployError;

/// The most candidates a grid replays.
pub const MAX_GRID_CANDIDATES: u128 = 1_000_000;
/// The most candidates random and bayesian searches choose from.
pub const MAX_POOL_CANDIDATES: u128 = 20_000_000;

/// The most values one search domain may hold: a million candidates along one axis is already
/// more than a search can replay, and each value costs memory before the first trial.
pub const MAX_DOMAIN_VALUES: u64 = 1_000_000;

/// The refusal of a domain of `count` values.
pub fn too_many_values(path: &str, count: impl std::fmt::Display) -> DeployError {
    DeployError::new(
        path,
        format!(
            "holds {count} values; a search domain holds at most {MAX_DOMAIN_VALUES} (narrow it or raise its step)"
        ),
    )
}

/// A stepped linear range's values, both bounds included: the steps are counted, then each value
/// is rounded to 12 decimals, so decimal steps (0.1, 0.2, 0.3) do not drift. Refused past
/// [`MAX_DOMAIN_VALUES`]; `step` must be positive and finite.
pub fn decimal_steps(here: &str, min: f64, max: f64, step: f64) -> Result<Vec<f64>, DeployError> {
    let steps = ((max - min) / step + 1e-9).floor();
    if steps >= MAX_DOMAIN_VALUES as f64 {
        return Err(too_many_values(here, steps + 1.0));
    }
    Ok((0..=steps as u64).map(|i| ((min + step * i as f64) * 1e12).round() / 1e12).collect())
}

/// An integer log range's values: the powers of two from `min` (at least 1) up to `max`, at most
/// 64 of them whatever `max` is.
pub fn doublings(min: u64, max: u64) -> impl Iterator<Item = u64> {
    std::iter::successors(Some(min.max(1)), |&x| x.checked_mul(2)).take_while(move |&x| x <= max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_bounded_and_do_not_drift() {
        assert_eq!(decimal_steps("r", 0.1, 0.3, 0.1).unwrap(), vec![0.1, 0.2, 0.3]);
        assert!(decimal_steps("r", 0.0, 1e9, 1e-3).unwrap_err().to_string().contains("at most 1000000"));
        assert_eq!(doublings(3, 20).collect::<Vec<_>>(), vec![3, 6, 12]);
        assert_eq!(doublings(1, u64::MAX).count(), 64, "no overflow, no endless loop");
    }
}
