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
