//! `servesim recommend -c FILE`: a search over deployments of one model under a GPU budget
//! (spec: `shared/reference/aisimulate.md` §5-§6). Every candidate is a concrete predict
//! configuration — the input tree with each searched knob replaced by one value — read by the
//! same strict schema and replayed like `predict -c`, so each `recommendations/NNNN.yaml` is
//! replayable as it stands.
//!
//! The engine's `mode` and `backend` are searched (a value or `{choices: [...]}`; omitted, the
//! reference's domains: both modes, vLLM and SGLang), one branch of the space per pair. Knobs
//! per worker role: `parallelism.{replicas, tensor, attention_data}` and
//! `scheduler.{max_batched_tokens, max_sequences}`, each a scalar, `{choices: [...]}` or
//! `{range: {min, max, step, scale}}`. Without explicit parallelism the preset pool applies
//! (GPUs per worker 1, 2, 4, 8, 16, replicas up to the budget; plain TP for dense models, the
//! TEP / DEP / MoE-TP / DTP shapes for MoE models), or a `parallelism.preset` list of shapes;
//! the scheduler knobs default to the reference's lists.
//!
//! The module's files, in dependency order (each uses only files listed before it):
//! [`limits`] (how large a search may be), [`space`] (the space and the search), `load` (the
//! traffic load's domains and the KV-relative load), [`read`] (reading the recommend sections), [`record`] (a trial and its stored form), [`cache`],
//! [`mod@rank`] (scores, ranking and the output files), `bayes` (the surrogate model, a leaf),
//! [`trials`] (running candidates; the bayesian rounds) and [`shard`]; `evaluate` here picks
//! the search's way of running.

mod afd;
mod bayes;
pub mod cache;
pub(crate) mod epd;
pub mod limits;
mod load;
mod pyrandom;
pub mod rank;
pub mod read;
pub mod record;
pub mod shard;
pub mod space;
pub mod trials;
pub(crate) mod vl;

use std::path::Path;

pub use cache::{inputs_digest, Cache};
pub use limits::{too_many_values, MAX_DOMAIN_VALUES, MAX_GRID_CANDIDATES, MAX_POOL_CANDIDATES};
pub use rank::{avg_gpu, objective, outputs, rank, Ranked};
pub use read::{read_search, DEFAULT_PARETO_OBJECTIVES, TARGETS};
pub use record::{digest_holds, trial_json, with_digest, Trial};
pub use shard::{evaluate_indices, evaluate_shard, trial_from_json};
pub use space::{Optimization, Optimizer, Search, Space};
pub use trials::{prepare_candidate, trial_count, Evaluated, Progress};

use trials::{bayesian, run_jobs};

/// Runs the search on `threads` threads (0: every core): grid and random evaluate their
/// candidates, in candidate order whatever thread finished first; bayesian proposes rounds of
/// `optimizer.parallelism` candidates from what the earlier rounds found.
pub fn evaluate(
    search: &Search,
    base_dir: &Path,
    threads: usize,
    cache: Option<&Cache>,
    progress: &Progress,
) -> Evaluated {
    if search.optimizer.algorithm == "bayesian" {
        return bayesian(search, base_dir, threads, cache, progress);
    }
    if let Some(plan) = &search.random_plan {
        return trials::reference_random(search, plan, base_dir, threads, cache, progress);
    }
    let jobs: Vec<usize> = (0..search.selected.len()).collect();
    run_jobs(
        search,
        &jobs,
        &|k| (search.space.tree(search.selected[k]), search.selected[k]),
        base_dir,
        threads,
        cache,
        progress,
    )
}
