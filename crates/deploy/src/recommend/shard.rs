//! Shards of a search (candidate i in shard i mod n) and chosen candidates evaluated without
//! the cache; a shard record read back into its trial.

use std::path::Path;

use serde_json::Value;

use super::cache::Cache;
use super::record::{digest_holds, trial_fields, Trial};
use super::space::Search;
use super::trials::{run_jobs, Progress};

/// Evaluates chosen candidates of the space (indexes into it, in that order), without a cache.
pub fn evaluate_indices(search: &Search, indices: &[usize], base_dir: &Path, threads: usize) -> Vec<Trial> {
    let jobs: Vec<usize> = (0..indices.len()).collect();
    let job = |k: usize| (search.space.tree(indices[k]), indices[k]);
    run_jobs(search, &jobs, &job, base_dir, threads, None, &Progress::silent()).trials
}

/// Reads a trial back; `None` when the record is malformed, or was edited or damaged since it
/// was written (its digest does not match).
pub fn trial_from_json(search: &Search, v: &Value) -> Option<(usize, Trial)> {
    if !digest_holds(v) {
        return None;
    }
    let index = v.get("index")?.as_u64()? as usize;
    let tree = search.candidate(index)?;
    Some((index, trial_fields(v, tree)?))
}

/// Evaluates the candidates of shard `k` of `n` (candidate i belongs to shard i mod n).
pub fn evaluate_shard(
    search: &Search,
    base_dir: &Path,
    threads: usize,
    k: usize,
    n: usize,
    cache: Option<&Cache>,
) -> Vec<(usize, Trial)> {
    let indices: Vec<usize> = (0..search.selected.len()).filter(|i| i % n == k).collect();
    if indices.is_empty() {
        return Vec::new();
    }
    let done = run_jobs(
        search,
        &indices,
        &|i| (search.space.tree(search.selected[i]), search.selected[i]),
        base_dir,
        threads,
        cache,
        &Progress::silent(),
    );
    indices.into_iter().zip(done.trials).collect()
}
