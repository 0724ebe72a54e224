//! `engine.speculation`: aisimulate 0.13's speculative-decoding block.
//!
//! The reference knows one shape for prompt lookup (`kind: ngram`, `num_speculative_tokens`,
//! `acceptance_rates`, `seed`) and one for its SDK schemes (`kind`, `params`, `draft_model_path`,
//! `draft_config`, `expected_accepted_tokens`, `seed`). Of the schemes, servesim models `mtp`: its
//! draft is `depth` extra target-shaped layers whose cost the AIS timing already folds into the
//! decode pass (the same cost as `nextn: depth`), and its acceptance is the `nextn_accepted`
//! lowering of `expected_accepted_tokens` drawn from the `seed` stream. The other kinds are
//! refused by name with what their cost model needs.

use serde_json::Value;

use super::engine::Mtp;
use super::worker::{Capacity, Timing, Worker};
use crate::error::DeployError;
use crate::reader::ErrAt;
use servesim_config::Reader;

/// The reference's scheme registry, in its order.
const KINDS: [&str; 6] = ["dflash", "draft_model", "dspark", "eagle3", "mtp", "ngram"];

/// `engine.speculation`, read as the reference's schema reads it; `Some` only for the kinds
/// servesim models (today `mtp`), as the MTP settings it lowers to.
pub(super) fn read_speculation(e: &mut Reader) -> Result<Option<Mtp>, DeployError> {
    let Some(mut s) = e.obj("speculation")? else { return Ok(None) };
    let kind = s.text("kind")?.ok_or_else(|| s.err("kind", "missing (required)"))?;
    let draft_checkpoint = s.given("draft_model_path") || s.given("draft_config");
    let missing = |what: &str| s.err("kind", format!("{kind} {what}, which servesim's AIS timing does not model yet"));
    match kind.as_str() {
        "mtp" => {}
        "ngram" => {
            return Err(missing(
                "speculation prices the target's verify attention at one KV pass per request for its \
                 num_speculative_tokens + 1 query tokens (block verify)",
            ))
        }
        "draft_model" | "eagle3" => {
            return Err(missing(
                "speculation needs the draft network's forward passes, KV and weights timed beside the target's",
            ))
        }
        "dflash" | "dspark" => {
            return Err(missing(
                "speculation needs its block-drafting network's forward passes timed beside the target's",
            ))
        }
        other => {
            return Err(s.err(
                "kind",
                format!("unknown speculative scheme kind {other:?}; the reference registers {}", KINDS.join(", ")),
            ))
        }
    }
    if draft_checkpoint {
        let key = if s.given("draft_model_path") { "draft_model_path" } else { "draft_config" };
        return Err(s.err(key, "speculation kind 'mtp' does not accept a draft checkpoint"));
    }
    s.ignored("draft_model_path");
    s.ignored("draft_config");
    let depth = match s.obj("params")? {
        Some(mut p) => {
            let depth = p.integer("depth")?;
            p.finish()?;
            depth
        }
        None => None,
    };
    let depth = match depth {
        None | Some(0) => return Err(s.err("params", "mtp requires params.depth, a positive integer")),
        Some(d) if d > 5 => {
            return Err(s.err("params", format!("speculative replay requires 1..5 draft tokens, got depth {d}")))
        }
        Some(d) => d as u32,
    };
    let accepted = s
        .nonneg("expected_accepted_tokens", false)?
        .ok_or_else(|| s.err("expected_accepted_tokens", "missing (required)"))?;
    if accepted > f64::from(depth) {
        return Err(s.err(
            "expected_accepted_tokens",
            format!("expected_accepted_tokens must be within [0, {depth}] accepted draft tokens"),
        ));
    }
    let seed = match s.value("seed") {
        None => 42,
        Some(Value::Number(n)) if n.is_u64() => n.as_u64().expect("checked"),
        Some(_) => return Err(s.err("seed", "must be an integer in [0, 18446744073709551615]")),
    };
    s.finish()?;
    Ok(Some(Mtp { nextn: depth, accepted, seed: Some(seed) }))
}

/// The reference's conditions on the engine around a speculation scheme: not beside
/// `nextn`, a vLLM or SGLang language engine, and on every worker no host offload, a fixed KV
/// capacity and the default (AIS) timing that carries the draft cost.
pub(super) fn check_speculation_engine(
    e: &Reader,
    backend: &str,
    nextn_given: bool,
    workers: &[&Worker],
    workers_path: &str,
) -> Result<(), DeployError> {
    if nextn_given {
        return Err(e.err("speculation", "speculation cannot be combined with nextn or nextn_accepted"));
    }
    if !matches!(backend, "vllm" | "sglang") {
        return Err(
            e.err("speculation", "mtp speculation requires sglang/vllm aggregated/disaggregated language workers")
        );
    }
    for w in workers {
        let at = |what: &str| format!("{workers_path}.{}.{what}", w.role);
        if w.offload.is_some() {
            return Err(DeployError::new(at("kv_cache.host_offload"), "mtp speculation does not support host_offload"));
        }
        if matches!(w.capacity, Capacity::Default { .. }) {
            return Err(DeployError::new(
                at("kv_cache.capacity"),
                format!("mtp speculation requires explicit fixed KV capacity on workers.{}", w.role),
            ));
        }
        if !matches!(w.timing, Timing::Default) {
            return Err(DeployError::new(
                at("timing"),
                "mtp speculation requires default timing to preserve draft costs",
            ));
        }
    }
    Ok(())
}

/// `engine.speculation` of a recommend configuration: the reference's recommend schema takes
/// only prompt lookup (`kind: ngram`), which servesim does not model yet, so every value is
/// refused here, before the candidates are made.
pub(crate) fn refuse_in_recommend(engine: &Value) -> Result<(), DeployError> {
    let Some(spec) = engine.get("speculation").filter(|v| !v.is_null()) else { return Ok(()) };
    let mut s = Reader::mapping("engine.speculation", spec)?;
    match s.text("kind")? {
        Some(kind) if kind == "ngram" => {
            // The predict reader words why ngram is not modelled.
            let mut e = Reader::mapping("engine", engine)?;
            read_speculation(&mut e).map(|_| ())
        }
        Some(kind) => {
            Err(s.err("kind", format!("{kind} speculation is predict-only: recommend accepts kind ngram alone")))
        }
        None => Err(s.err("kind", "missing (required)")),
    }
}
