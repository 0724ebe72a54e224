//! The engine's model controls: quantisation modes, the attention backend and the MoE kernel
//! choices the reference hands its estimator (`ENGINE_MODEL_CONTROL_FIELDS`). They are read
//! here at engine level and, for the quantisation modes and the attention backend, per worker
//! under `timing` (the worker's value wins), and lowered into the AIS timing config, where
//! servesim-perf times what it has measurements for and refuses the rest by key.

use serde_json::{json, Map, Value};

use crate::error::DeployError;
use servesim_config::Reader;

/// The controls a worker's `timing` may override.
const PER_WORKER: [&str; 6] = [
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
