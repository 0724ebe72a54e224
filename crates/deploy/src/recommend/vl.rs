//! Native VL replay and the SGLang host loop in a recommend configuration.
//!
//! Images without `engine.workers.encoder` are encoded by the vision tower on the aggregated or
//! prefill SGLang worker (`crate::vl`); a worker with `host_loop`, `frontend`, `host_profile` or
//! `vision` is host-aware. Both are settings every candidate shares, never search dimensions:
//! the candidates differ in their searched knobs only, and each replays through the predict
//! schema as `predict -c` would. What this file adds before the space is built:
//! - the reference's recommendation gates, in its order and words: a host-aware worker wants
//!   its mode and `backend: sglang` concrete, then `parallelism` with `preset: false`, no
//!   pipeline and no attention data parallelism; an image workload without an encoder pool
//!   wants the same of its language worker, default timing, and the same parallelism;
//! - the Dynamo stack (a `planner:` or `router:` section) replays no host loop: refused up
//!   front, where the reference fails every candidate with the same words;
//! - the tower's settings spelled out on the host worker (`cache_mib`, `encoder_parallel`, the
//!   defaults filled in), so a saved recommendation names what its candidate ran, as the
//!   reference writes it.

use serde_json::{json, Value};

use super::space::get;
use crate::error::DeployError;

/// The aggregated worker hosts the tower and the loop in aggregated mode, the prefill worker in
/// disaggregated mode.
const HOSTS: [(&str, &str); 2] = [("aggregated", "aggregated"), ("prefill", "disaggregated")];

/// The reference's refusal of a host-aware worker on the Dynamo stack (its runner's words).
pub(crate) const DYNAMO_HOST_LOOP: &str =
    "runner does not support the SGLang host loop (vision, frontend, sglang.host_loop, sglang.vlm_cache_bytes); \
     use --stack engine: a planner or router section runs on the Dynamo stack, which replays neither native VL \
     (images without engine.workers.encoder) nor a host_loop or frontend worker";

fn given<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    get(v, path).filter(|v| !v.is_null())
}

fn host_aware(worker: &Value) -> bool {
    worker.get("host_loop").and_then(Value::as_bool) == Some(true)
        || ["frontend", "host_profile", "vision"].iter().any(|k| worker.get(*k).is_some_and(|v| !v.is_null()))
}

/// Images encoded on the language worker: images without an encoder pool.
pub(super) fn native_images(base: &Value) -> bool {
    given(base, &["traffic", "source", "images"]).is_some() && given(base, &["engine", "workers", "encoder"]).is_none()
}

/// `parallelism` of a host-aware worker in a recommendation: `preset: false`, and pipeline and
/// attention data parallelism absent or 1 (a domain is refused, even of one value).
fn check_parallelism(base: &Value, role: &str) -> Result<(), DeployError> {
    let p = given(base, &["engine", "workers", role, "parallelism"]);
    let preset_off = p.and_then(|p| p.get("preset")).is_some_and(|v| v == &json!(false) || v == &json!({}));
    let one = |key: &str| p.and_then(|p| p.get(key)).filter(|v| !v.is_null()).is_none_or(|v| v.as_u64() == Some(1));
    if !preset_off || !one("pipeline") || !one("attention_data") {
        return Err(DeployError::new(
            format!("engine.workers.{role}.parallelism"),
            "native VL recommendation requires the host-aware worker's parallelism with preset: false, pipeline=1 \
             and attention_data=1",
        ));
    }
    Ok(())
}

/// The reference's gates of host-aware workers and image workloads without an encoder pool,
/// given the searched modes and backends (each a domain as read).
pub(super) fn check(base: &Value, modes: &[&str], backends: &[&str]) -> Result<(), DeployError> {
    let workers = given(base, &["engine", "workers"]);
    let worker = |role: &str| workers.and_then(|w| w.get(role)).filter(|v| !v.is_null());
    for (role, mode) in HOSTS {
        if !worker(role).is_some_and(host_aware) {
            continue;
        }
        if modes != [mode] {
            return Err(DeployError::new(
                "engine.mode",
                format!("host recommendation on workers.{role} requires concrete mode={mode}"),
            ));
        }
        if backends != ["sglang"] {
            return Err(DeployError::new("engine.backend", "host recommendation requires concrete backend=sglang"));
        }
        check_parallelism(base, role)?;
    }
    let images = given(base, &["traffic", "source", "images"]).is_some();
    let (role, mode) = if worker("aggregated").is_some() { HOSTS[0] } else { HOSTS[1] };
    if !images {
        if worker(role).is_some_and(|w| w.get("vision").is_some_and(|v| !v.is_null())) {
            return Err(DeployError::new(
                format!("engine.workers.{role}.vision"),
                format!("workers.{role}.vision requires traffic.source.images"),
            ));
        }
        return Ok(());
    }
    if !native_images(base) {
        return Ok(());
    }
    if worker(role).is_none() || backends != ["sglang"] || modes != [mode] {
        return Err(DeployError::new(
            "traffic.source.images",
            format!(
                "image workloads require engine.workers.encoder (analytical EPD) or an aggregated or prefill worker \
                 with backend=sglang and concrete mode={mode} (native VL replay)"
            ),
        ));
    }
    let timing = given(base, &["engine", "workers", role, "timing", "type"]).and_then(Value::as_str);
    if timing.is_some_and(|t| t != "default") {
        return Err(DeployError::new(
            format!("engine.workers.{role}.timing"),
            "native VL replay requires default timing",
        ));
    }
    check_parallelism(base, role)
}

/// Refuses a host-aware worker (or native VL) beside a `planner:` or `router:` section.
pub(super) fn check_stack(base: &Value, planner: bool) -> Result<(), DeployError> {
    let section = if planner {
        "planner"
    } else if given(base, &["router"]).is_some() {
        "router"
    } else {
        return Ok(());
    };
    let hosted = HOSTS.iter().any(|(role, _)| given(base, &["engine", "workers", role]).is_some_and(host_aware));
    if hosted || native_images(base) {
        return Err(DeployError::new(section, DYNAMO_HOST_LOOP));
    }
    Ok(())
}

/// Spells the tower's settings out on the host worker of an image workload without an encoder
/// pool (the defaults: a 100 MiB embedding cache, the tower sharded over the tensor group), as
/// every candidate runs them. Called after `check`.
pub(super) fn pin_vision(base: &mut Value) {
    if !native_images(base) {
        return;
    }
    let role = if given(base, &["engine", "workers", "aggregated"]).is_some() { "aggregated" } else { "prefill" };
    let Some(worker) = base.pointer_mut(&format!("/engine/workers/{role}")).and_then(Value::as_object_mut) else {
        return;
    };
    let vision = worker.entry("vision").or_insert_with(|| json!({}));
    if vision.is_null() {
        *vision = json!({});
    }
    if let Some(v) = vision.as_object_mut() {
        v.entry("cache_mib").or_insert(json!(100));
        v.entry("encoder_parallel").or_insert(json!("tp"));
    }
}
