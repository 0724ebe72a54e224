//! `engine.speculation`: aisimulate 0.13's speculative-decoding block.
//!
//! The reference knows one shape for prompt lookup (`kind: ngram`, `num_speculative_tokens`,
//! `acceptance_rates`, `seed`) and one for its SDK schemes (`kind`, `params`, `draft_model_path`,
//! `draft_config`, `expected_accepted_tokens`, `seed`), which also takes `ngram` (with
//! `params.num_speculative_tokens`). servesim models four kinds:
//!
//! - `mtp`: its draft is `depth` extra target-shaped layers whose cost the AIS timing already
//!   folds into the decode pass (the same cost as `nextn: depth`), and its acceptance is the
//!   `nextn_accepted` lowering of `expected_accepted_tokens`;
//! - `ngram`: drafting is free (host-side lookup) and the target verifies `n + 1` tokens per
//!   request in one block pass (the AIS timing's `speculation`: every op at `n + 1` tokens per
//!   request, decode attention at one KV read per request); acceptance is `acceptance_rates`
//!   (conditional, per draft position) or, in the scheme shape, `expected_accepted_tokens`;
//! - `eagle3`: the target verifies as for ngram, and a one-layer draft network, whose geometry
//!   is the draft checkpoint's `config.json` given as `draft_config`, runs beside it (the AIS
//!   timing's `servesim_perf::eagle3`); a chain of `params.num_speculative_tokens` drafts (3 by
//!   default), acceptance from `expected_accepted_tokens`;
//! - `draft_model` (vLLM): the target verifies as for ngram, and a whole smaller model named by
//!   `draft_model_path` drafts: its generation graph once per draft token, its context graph
//!   over the prompt (`servesim_perf::draft_model`); `params.num_speculative_tokens` is
//!   required, `params.draft_tp_size` optional;
//! - `dflash` and `dspark` (block drafting): the target verifies as for ngram, and a dense draft
//!   stack (its geometry, block size and target-layer taps from `draft_config`) proposes a
//!   block of `params.num_draft_tokens` per round beside it (`servesim_perf::block_draft`):
//!   DFlash in one parallel forward, DSpark in one forward plus a sequential Markov-bias chain.
//!
//! Like mtp, the drafted kinds need a fixed KV capacity and default timing on every worker, as
//! the reference requires. All draw acceptance from the `seed` stream. EAGLE trees are refused
//! (the reference's replay refuses them too), as is a `draft_model_path` beside eagle3, dflash or
//! dspark (servesim does not fetch checkpoints: it reads the draft's `config.json` as
//! `draft_config`).

use serde_json::Value;

use super::engine::{Draft, Speculation};
use super::worker::{Capacity, Timing, Worker};
use crate::error::DeployError;
use crate::reader::ErrAt;
use servesim_config::Reader;

/// The reference's scheme registry, in its order.
const KINDS: [&str; 6] = ["dflash", "draft_model", "dspark", "eagle3", "mtp", "ngram"];

/// `engine.speculation`, read as the reference's schema reads it; `Some` for the kinds servesim
/// models (`mtp`, `ngram`, `eagle3`, `draft_model`).
pub(super) fn read_speculation(e: &mut Reader) -> Result<Option<Speculation>, DeployError> {
    let Some(mut s) = e.obj("speculation")? else { return Ok(None) };
    let kind = s.text("kind")?.ok_or_else(|| s.err("kind", "missing (required)"))?;
    match kind.as_str() {
        "mtp" => {}
        // The prompt-lookup shape: what it states alone (the scheme shape has neither key).
        "ngram" if s.given("num_speculative_tokens") || s.given("acceptance_rates") => {
            return read_ngram_rates(s).map(Some)
        }
        "ngram" => {}
        // The reference requires a fixed KV capacity beside a draft scheme, so the draft's KV and
        // weights never size a cache there: what is missing is the draft's time per step.
        "eagle3" => return read_eagle3(s).map(Some),
        "draft_model" => return read_draft_model(s).map(Some),
        "dflash" | "dspark" => return read_block(&kind, s).map(Some),
        other => {
            return Err(s.err(
                "kind",
                format!("unknown speculative scheme kind {other:?}; the reference registers {}", KINDS.join(", ")),
            ))
        }
    }
    let ngram = kind == "ngram";
    if s.given("draft_model_path") || s.given("draft_config") {
        let key = if s.given("draft_model_path") { "draft_model_path" } else { "draft_config" };
        return Err(s.err(key, format!("speculation kind '{kind}' does not accept a draft checkpoint")));
    }
    s.ignored("draft_model_path");
    s.ignored("draft_config");
    let (param, depth) = match s.obj("params")? {
        Some(mut p) => {
            let param = if ngram { "num_speculative_tokens" } else { "depth" };
            if ngram && p.has("trigger_rate") {
                // The scheme takes it, the reference's timing config then refuses it.
                return Err(p.err("trigger_rate", "ngram params must contain only num_speculative_tokens"));
            }
            let depth = p.integer(param)?;
            p.finish()?;
            (param, depth)
        }
        None => (if ngram { "num_speculative_tokens" } else { "depth" }, None),
    };
    let depth = match depth {
        None | Some(0) => return Err(s.err("params", format!("{kind} requires params.{param}, a positive integer"))),
        Some(d) if d > 5 => {
            return Err(s.err("params", format!("speculative replay requires 1..5 draft tokens, got {param} {d}")))
        }
        Some(d) => d as u32,
    };
    let (accepted, seed) = read_acceptance(s, depth)?;
    let draft = if ngram {
        // The expected count lowers to rates as for MTP.
        let rates = Speculation { nextn: depth, draft: Draft::Mtp { accepted }, seed: None }.accept_rates();
        Draft::Ngram { rates }
    } else {
        Draft::Mtp { accepted }
    };
    Ok(Some(Speculation { nextn: depth, draft, seed: Some(seed) }))
}

/// The prompt-lookup shape: `num_speculative_tokens` (1..=5), one conditional acceptance rate
/// in [0, 1] per draft position, and `seed`; nothing else.
fn read_ngram_rates(mut s: Reader) -> Result<Speculation, DeployError> {
    let n = match s.integer("num_speculative_tokens")? {
        None => return Err(s.err("num_speculative_tokens", "missing (required)")),
        Some(n @ 1..=5) => n as u32,
        Some(n) => return Err(s.err("num_speculative_tokens", format!("must be in 1..=5, got {n}"))),
    };
    let rates = match s.value("acceptance_rates") {
        None => return Err(s.err("acceptance_rates", "missing (required)")),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_f64()
                    .filter(|r| !v.is_boolean() && (0.0..=1.0).contains(r))
                    .ok_or_else(|| s.err("acceptance_rates", format!("must list numbers in [0, 1], got {v}")))
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => return Err(s.err("acceptance_rates", "must be a list of numbers in [0, 1]")),
    };
    if rates.len() != n as usize {
        return Err(s.err(
            "acceptance_rates",
            "acceptance_rates must contain one conditional probability per speculative token",
        ));
    }
    let seed = read_seed(&mut s)?;
    s.finish()?;
    Ok(Speculation { nextn: n, draft: Draft::Ngram { rates }, seed: Some(seed) })
}

/// The scheme shape of `eagle3`: `params.num_speculative_tokens` (a chain of 1..=5 drafts, 3
/// when unstated, as the reference's scheme defaults it; trees are refused as its replay refuses
/// them), `draft_config` (the draft checkpoint's `config.json`, which the AIS timing reads),
/// `expected_accepted_tokens` and `seed`.
fn read_eagle3(mut s: Reader) -> Result<Speculation, DeployError> {
    if s.given("draft_model_path") {
        return Err(s.err(
            "draft_model_path",
            "servesim does not fetch draft checkpoints: give the draft's config.json as draft_config",
        ));
    }
    s.ignored("draft_model_path");
    let depth = match s.obj("params")? {
        Some(mut p) => {
            if p.has("tree_shape") || p.has("verify_token_budget") {
                return Err(p.err(
                    if p.has("tree_shape") { "tree_shape" } else { "verify_token_budget" },
                    "speculative replay requires an EAGLE chain with one verification token per draft",
                ));
            }
            let d = p.integer("num_speculative_tokens")?;
            p.finish()?;
            d
        }
        None => None,
    };
    let depth = match depth.unwrap_or(3) {
        d @ 1..=5 => d as u32,
        d => {
            return Err(s.err(
                "params",
                format!("speculative replay requires 1..5 draft tokens, got num_speculative_tokens {d}"),
            ))
        }
    };
    let draft_config = match s.value("draft_config") {
        Some(v @ Value::Object(_)) => v.clone(),
        Some(_) => return Err(s.err("draft_config", "must be a mapping (the draft checkpoint's config.json)")),
        None => {
            return Err(s.err(
                "draft_config",
                "EAGLE-3 requires the draft checkpoint's config.json (draft_config): it carries the draft \
                 layer geometry and draft_vocab_size",
            ))
        }
    };
    servesim_perf::eagle3::DraftGeometry::from_hf(&draft_config).map_err(|why| s.err("draft_config", why))?;
    let (accepted, seed) = read_acceptance(s, depth)?;
    // The expected count lowers to rates as for MTP.
    let rates = Speculation { nextn: depth, draft: Draft::Mtp { accepted }, seed: None }.accept_rates();
    Ok(Speculation { nextn: depth, draft: Draft::Eagle3 { rates, draft_config }, seed: Some(seed) })
}

/// The scheme shape of `draft_model`: `draft_model_path` (the draft checkpoint's id, required),
/// `params.num_speculative_tokens` (a chain of 1..=5 drafts, required: the reference has no
/// default for it) and `params.draft_tp_size`, `expected_accepted_tokens` and `seed`. The
/// draft's `config.json` is found as the target's is; a `draft_config` beside the path is
/// refused (the reference only checks that it matches the path's).
fn read_draft_model(mut s: Reader) -> Result<Speculation, DeployError> {
    if s.given("draft_config") {
        return Err(s.err(
            "draft_config",
            "a draft_model draft is read from its checkpoint (draft_model_path); give draft_model_path alone",
        ));
    }
    s.ignored("draft_config");
    let path = match s.text("draft_model_path")? {
        Some(p) if !p.trim().is_empty() => p,
        Some(_) => return Err(s.err("draft_model_path", "draft_model_path must be a nonempty string")),
        None => {
            return Err(
                s.err("draft_model_path", "draft_model requires draft_model_path (the standalone draft checkpoint)")
            )
        }
    };
    let (depth, tp) = match s.obj("params")? {
        Some(mut p) => {
            let d = p.integer("num_speculative_tokens")?;
            let tp = p.integer("draft_tp_size")?;
            p.finish()?;
            (d, tp)
        }
        None => (None, None),
    };
    let depth =
        match depth {
            None => return Err(s.err(
                "params",
                "draft_model requires params.num_speculative_tokens (the deployment K; there is no checkpoint default)",
            )),
            Some(d @ 1..=5) => d as u32,
            Some(d) => {
                return Err(s.err(
                    "params",
                    format!("speculative replay requires 1..5 draft tokens, got num_speculative_tokens {d}"),
                ))
            }
        };
    let tp = match tp {
        None => None,
        Some(t @ 1..=64) => Some(t as u32),
        Some(t) => return Err(s.err("params", format!("draft_tp_size must be in 1..=64, got {t}"))),
    };
    let (accepted, seed) = read_acceptance(s, depth)?;
    // The expected count lowers to rates as for MTP.
    let rates = Speculation { nextn: depth, draft: Draft::Mtp { accepted }, seed: None }.accept_rates();
    Ok(Speculation { nextn: depth, draft: Draft::DraftModel { rates, path, tp }, seed: Some(seed) })
}

/// The scheme shape of `dflash` and `dspark`: `params` (`num_draft_tokens`; DSpark also
/// `num_draft_layers`), `draft_config` (the draft checkpoint's `config.json`, which carries the
/// block size, the stack's geometry and the target layers it reads), `expected_accepted_tokens`
/// and `seed`, checked as the reference's scheme constructors check them
/// (`servesim_perf::block_draft`); the drafts per round must be 1..=5, as its replay requires.
fn read_block(kind: &str, mut s: Reader) -> Result<Speculation, DeployError> {
    if s.given("draft_model_path") {
        return Err(s.err(
            "draft_model_path",
            "servesim does not fetch draft checkpoints: give the draft's config.json as draft_config",
        ));
    }
    s.ignored("draft_model_path");
    let params = match s.value("params") {
        None | Some(Value::Null) => Value::Object(Default::default()),
        Some(v @ Value::Object(_)) => v.clone(),
        Some(_) => return Err(s.err("params", "speculation params must be an object with string keys")),
    };
    let draft_config = match s.value("draft_config") {
        None | Some(Value::Null) => Value::Null,
        Some(v @ Value::Object(_)) => v.clone(),
        Some(_) => return Err(s.err("draft_config", "draft_config must be an object")),
    };
    // Name the key to change: the parameters' own faults, or the drafts per round (which a
    // checkpoint's block size only defaults), are params'; the rest the checkpoint's.
    let at = |why: &str| {
        let params = ["Unknown parameters", "num_draft_", "speculative replay"];
        if params.iter().any(|p| why.contains(p)) {
            "params"
        } else {
            "draft_config"
        }
    };
    let draft = servesim_perf::block_draft::BlockDraft::read(
        kind,
        params.as_object().expect("an object"),
        Some(&draft_config).filter(|v| !v.is_null()),
    )
    .map_err(|why| s.err(at(&why), why))?;
    let depth = draft.tokens;
    let (accepted, seed) = read_acceptance(s, depth)?;
    // The expected count lowers to rates as for MTP.
    let rates = Speculation { nextn: depth, draft: Draft::Mtp { accepted }, seed: None }.accept_rates();
    Ok(Speculation {
        nextn: depth,
        draft: Draft::Block { rates, kind: kind.to_string(), params, draft_config },
        seed: Some(seed),
    })
}

/// The scheme shape's tail: `expected_accepted_tokens` (required, at most `depth`) and `seed`;
/// nothing else may follow.
fn read_acceptance(mut s: Reader, depth: u32) -> Result<(f64, u64), DeployError> {
    let accepted = s
        .nonneg("expected_accepted_tokens", false)?
        .ok_or_else(|| s.err("expected_accepted_tokens", "missing (required)"))?;
    if accepted > f64::from(depth) {
        return Err(s.err(
            "expected_accepted_tokens",
            format!("expected_accepted_tokens must be within [0, {depth}] accepted draft tokens"),
        ));
    }
    let seed = read_seed(&mut s)?;
    s.finish()?;
    Ok((accepted, seed))
}

/// `seed`: an unsigned 64-bit integer, 42 when absent.
fn read_seed(s: &mut Reader) -> Result<u64, DeployError> {
    match s.value("seed") {
        None => Ok(42),
        Some(Value::Number(n)) if n.is_u64() => Ok(n.as_u64().expect("checked")),
        Some(_) => Err(s.err("seed", "must be an integer in [0, 18446744073709551615]")),
    }
}

/// The reference's conditions on the engine around a speculation scheme: not beside `nextn`, a
/// vLLM (ngram, draft_model) or vLLM / SGLang (mtp, eagle3) language engine, no host offload on
/// any worker, and for the drafted kinds on every worker a fixed KV capacity and the default (AIS) timing that
/// carries the draft cost. (ngram needs op-level timing, which every servesim timing is.)
pub(super) fn check_speculation_engine(
    e: &Reader,
    spec: &Speculation,
    backend: &str,
    nextn_given: bool,
    workers: &[&Worker],
    workers_path: &str,
) -> Result<(), DeployError> {
    if nextn_given {
        return Err(e.err("speculation", "speculation cannot be combined with nextn or nextn_accepted"));
    }
    let (kind, backends) = match spec.draft {
        Draft::Mtp { .. } => ("mtp", &["vllm", "sglang"][..]),
        Draft::Ngram { .. } => ("ngram", &["vllm"][..]),
        Draft::Eagle3 { .. } => ("eagle3", &["sglang", "vllm"][..]),
        Draft::DraftModel { .. } => ("draft_model", &["vllm"][..]),
        // The reference's config takes both engines; its DFlash timing then refuses SGLang.
        Draft::Block { ref kind, .. } => (kind.as_str(), &["sglang", "vllm"][..]),
    };
    if !backends.contains(&backend) {
        return Err(e.err(
            "speculation",
            format!("{kind} speculation requires {} aggregated/disaggregated language workers", backends.join("/")),
        ));
    }
    for w in workers {
        let at = |what: &str| format!("{workers_path}.{}.{what}", w.role);
        if w.offload.is_some() {
            return Err(DeployError::new(
                at("kv_cache.host_offload"),
                format!("{kind} speculation does not support host_offload"),
            ));
        }
        if kind == "ngram" {
            continue;
        }
        if matches!(w.capacity, Capacity::Default { .. }) {
            return Err(DeployError::new(
                at("kv_cache.capacity"),
                format!("{kind} speculation requires explicit fixed KV capacity on workers.{}", w.role),
            ));
        }
        if !matches!(w.timing, Timing::Default) {
            return Err(DeployError::new(
                at("timing"),
                format!("{kind} speculation requires default timing to preserve draft costs"),
            ));
        }
    }
    Ok(())
}

/// `engine.speculation` of a recommend configuration: the reference's recommend schema takes
/// only the prompt-lookup shape (`kind: ngram` with `num_speculative_tokens` and
/// `acceptance_rates`), read here as predict reads it, before the candidates are made.
pub(crate) fn check_in_recommend(engine: &Value) -> Result<Option<Speculation>, DeployError> {
    let Some(spec) = engine.get("speculation").filter(|v| !v.is_null()) else { return Ok(None) };
    let mut s = Reader::mapping("engine.speculation", spec)?;
    match s.text("kind")?.as_deref() {
        Some("ngram") => read_ngram_rates(s).map(Some),
        Some(kind) => {
            Err(s.err("kind", format!("{kind} speculation is predict-only: recommend accepts kind ngram alone")))
        }
        None => Err(s.err("kind", "missing (required)")),
    }
}
