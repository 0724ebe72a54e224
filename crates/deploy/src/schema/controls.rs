//! The engine's model controls: quantisation modes, the attention backend and the MoE kernel
//! choices the reference hands its estimator (`ENGINE_MODEL_CONTROL_FIELDS`). They are read
//! here at engine level and, for the quantisation modes and the attention backend, per worker
//! under `timing` (the worker's value wins), and lowered into the AIS timing config, where
//! servesim-perf times what it has measurements for and refuses the rest by key.

use serde_json::{json, Map, Value};

use crate::error::DeployError;
use servesim_config::Reader;

/// The controls a worker's `timing` may override (the timing identity an encoder pool refuses).
pub(super) const PER_WORKER: [&str; 6] = [
    "gemm_quant_mode",
    "moe_quant_mode",
    "fmha_quant_mode",
    "kvcache_quant_mode",
    "comm_quant_mode",
    "attention_backend",
];

/// Active controls by key, spelled as the AIS timing config spells them.
pub type Controls = Map<String, Value>;

fn read_strings(r: &mut Reader, keys: &[&'static str], into: &mut Controls) -> Result<(), DeployError> {
    for &k in keys {
        if let Some(s) = r.nonempty(k)? {
            into.insert(k.into(), json!(s));
        }
    }
    Ok(())
}

/// The engine-level controls that are active: set, and not the reference's inactive defaults
/// (`enable_eplb: false`, `moe_backend: default`).
pub(super) fn read_engine_controls(e: &mut Reader) -> Result<Controls, DeployError> {
    let mut c = Controls::new();
    read_strings(e, &PER_WORKER, &mut c)?;
    read_strings(e, &["moe_kernel_source"], &mut c)?;
    if let Some(b) = e.nonempty("moe_backend")? {
        if b != "default" {
            c.insert("moe_backend".into(), json!(b));
        }
    }
    if e.flag("enable_eplb")? == Some(true) {
        c.insert("enable_eplb".into(), json!(true));
    }
    if let Some(n) = e.positive("wideep_num_slots")? {
        c.insert("wideep_num_slots".into(), json!(n));
    }
    Ok(c)
}

/// A worker's `timing` overrides.
pub(super) fn read_timing_controls(t: &mut Reader) -> Result<Controls, DeployError> {
    let mut c = Controls::new();
    read_strings(t, &PER_WORKER, &mut c)?;
    Ok(c)
}

/// The transfer kinds and presets the reference's `transfer_policy` takes.
const TRANSFER_KINDS: [&str; 4] = ["xop", "xprofile", "xquant", "xshape"];
const TRANSFER_PRESETS: [&str; 4] = ["aggressive", "balanced", "conservative", "off"];

/// Checks a `transfer_policy` as the reference resolves it: a string is a preset or kind name or
/// a comma-separated run of them (case and surrounding blanks ignored); a list names kinds exactly.
///
/// The policy only says which cross-shape / cross-quant / cross-op borrowings the HYBRID and
/// EMPIRICAL database modes may make where a table has no row; SILICON and SOL never consult it,
/// and servesim's EMPIRICAL / HYBRID make no borrowing (a slice that would need one is refused
/// by name), so a valid policy changes no number servesim gives and is not lowered.
pub(super) fn check_transfer_policy(path: &str, v: &Value) -> Result<(), DeployError> {
    let token = |t: &str| -> Result<(), DeployError> {
        let t = t.trim().to_lowercase();
        if TRANSFER_KINDS.contains(&t.as_str()) || TRANSFER_PRESETS.contains(&t.as_str()) {
            return Ok(());
        }
        Err(DeployError::new(
            path,
            format!(
                "unknown transfer kind/preset {t:?}; valid kinds: {}; presets: {}",
                TRANSFER_KINDS.join(", "),
                TRANSFER_PRESETS.join(", ")
            ),
        ))
    };
    match v {
        Value::Null => Ok(()),
        Value::String(s) => {
            let t = s.trim().to_lowercase();
            if TRANSFER_PRESETS.contains(&t.as_str()) || !t.contains(',') {
                return token(&t);
            }
            t.split(',').map(str::trim).filter(|p| !p.is_empty()).try_for_each(token)
        }
        // A list goes to the estimator as it is: kind names exactly, no presets.
        Value::Array(items) => items.iter().try_for_each(|x| match x {
            Value::String(s) if TRANSFER_KINDS.contains(&s.as_str()) => Ok(()),
            Value::String(s) => Err(DeployError::new(
                path,
                format!(
                    "invalid forward pass perf model config: unknown transfer kind {s:?} (a list names kinds: {})",
                    TRANSFER_KINDS.join(", ")
                ),
            )),
            other => Err(DeployError::new(path, format!("must list transfer kinds as strings, got {other}"))),
        }),
        other => Err(DeployError::new(path, format!("must be a string or a list of strings, got {other}"))),
    }
}
