//! The predict configuration (aisimulate 0.13's unified YAML: `traffic`, `engine`, `evaluation`,
//! `execution`, and the `router:` / `planner:` adapter sections), read strictly: every key by
//! name, unknown keys rejected with their path, values and cross-key rules checked with the
//! reference's messages. A key the reference accepts for a setting servesim does not model is
//! refused where it is read, naming the key and what is missing, never silently ignored.
//!
//! Files: [`traffic`], [`worker`] (one worker role, with [`frontend`]), [`engine`] (with
//! [`speculation`]), [`evaluation`] (the SLA), [`router`] and [`planner`] (the adapter
//! sections); [`Config`] here is the whole file, read by [`read_predict`] / [`read_sections`].

pub mod afd;
pub mod controls;
pub mod encoder;
pub mod engine;
pub mod estimator;
pub mod evaluation;
pub mod fpm;
pub mod frontend;
pub mod offload;
pub mod planner;
pub mod router;
pub mod speculation;
pub mod traffic;
pub mod worker;

use serde_json::Value;

pub use engine::{Engine, KvTransfer, Mode};
pub(crate) use evaluation::read_sla;
pub use evaluation::Sla;
pub use offload::Offload;
pub use router::RouterPolicy;
pub use traffic::{Load, Source, Stop, Traffic};
pub use worker::{Capacity, Parallelism, Timing, Worker};

use engine::read_engine;
use planner::read_planner;
use router::read_router;
use traffic::read_traffic;

use crate::error::DeployError;
use crate::reader::ErrAt;
use servesim_config::Reader;

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub traffic: Traffic,
    pub engine: Engine,
    pub sla: Sla,
    pub router: RouterPolicy,
    /// The planner (`planner: {policy: enabled}`), validated.
    pub planner: Option<servesim_planner::PlannerConfig>,
}

/// Reads a predict configuration. `recommend` sections are refused here (the caller reads them).
pub fn read_predict(root: &Value) -> Result<Config, DeployError> {
    let mut top = Reader::mapping("", root)?;
    for k in ["optimization", "optimizer"] {
        if top.given(k) {
            return Err(
                top.err(k, "predict does not accept ['optimization', 'optimizer'] sections (they belong to recommend)")
            );
        }
        top.value(if k == "optimization" { "optimization" } else { "optimizer" });
    }
    read_sections(top)
}

/// Reads the sections both commands share from `top` (recommend has taken its own already).
pub fn read_sections(mut top: Reader) -> Result<Config, DeployError> {
    let traffic = read_traffic(top.obj("traffic")?)?;
    let engine = match top.obj("engine")? {
        Some(e) => read_engine(e)?,
        None => return Err(top.err("engine", "missing (required: model, hardware and workers)")),
    };
    let sla = match top.obj("evaluation")? {
        Some(mut ev) => {
            let sla = match ev.obj("sla")? {
                Some(s) => read_sla(s)?,
                None => Sla::default(),
            };
            ev.finish()?;
            sla
        }
        None => Sla::default(),
    };
    if let Some(mut ex) = top.obj("execution")? {
        if let Some(mut r) = ex.obj("resources")? {
            // Host limits of the reference's worker processes: nothing to simulate.
            r.nonneg("initialization_timeout_seconds", true)?;
            r.nonneg("shutdown_timeout_seconds", false)?;
            for k in ["memory_limit_gb", "cpu_limit"] {
                if let Some(v) = r.value(k) {
                    if !(v.as_str() == Some("auto") || v.as_f64().is_some_and(|x| x.is_finite() && x > 0.0)) {
                        return Err(r.err(k, format!("must be \"auto\" or a positive number, got {v}")));
                    }
                }
            }
            r.nonneg("reserve_memory_gb", false)?;
            r.nonneg("reserve_memory_fraction", false)?;
            r.nonneg("available_memory_fraction", true)?;
            r.finish()?;
        }
        ex.finish()?;
    }
    let adapters = top.given("router") || top.given("planner");
    let adapter_section = if top.given("planner") { "planner" } else { "router" };
    let router = match top.obj("router")? {
        Some(r) => read_router(r)?,
        None => RouterPolicy::RoundRobin,
    };
    let planner = match top.value("planner") {
        Some(v) => read_planner(v, &engine, &sla)?,
        None => None,
    };
    let raw_engine = top.value("engine");
    top.finish()?;
    encoder::check_epd(&traffic, &engine)?;
    let mut engine = engine;
    if let (Some(images), None) = (&traffic.images, &engine.encoder) {
        // Native VL replay: the aggregated or prefill worker hosts the tower (checked above).
        let host = engine.aggregated.as_mut().or(engine.prefill.as_mut()).expect("checked with the images");
        host.vision.get_or_insert_with(Default::default).images = Some(images.clone());
    }
    frontend::check_workload(&traffic, &mut engine)?;
    // A planner or router section runs on the reference's Dynamo stack, whose runner replays no
    // host loop: native VL, host_loop and frontend workers are refused beside one.
    if adapters
        && [&engine.aggregated, &engine.prefill].into_iter().flatten().any(|w| w.host_loop || w.vision.is_some())
    {
        return Err(DeployError::new(adapter_section, crate::recommend::vl::DYNAMO_HOST_LOOP));
    }
    if engine.encoder.is_some() {
        encoder::check_estimator_policies(raw_engine)?;
    }
    if adapters && engine.encoder.is_some() {
        return Err(DeployError::new(
            "engine.workers.encoder",
            "encoder pools require the offline engine stack without adapters",
        ));
    }
    Ok(Config { traffic, engine, sla, router, planner })
}
