//! Image traffic (`traffic.source.images`) and the dedicated encoder pool
//! (`engine.workers.encoder`), read with the reference's checks and words.
//!
//! servesim models the reference's analytical pool (`mode: analytical`, EPD): the language
//! replay runs the prompts at their text plus visual tokens and the pool's batch latency and
//! rate are laid over its means (`crate::epd`). A native pool (`mode: native`, SGLang's
//! `--encoder-only` servers) is replayed event by event ahead of the router
//! (`crate::encpool`, `servesim-replay`'s `sim::encoders`). Images without a pool are encoded
//! on the aggregated or prefill SGLang worker (native VL replay, `crate::vl`).

use super::engine::Engine;
use super::engine::Mode;
use super::traffic::{Load, Traffic};
use super::worker::{Timing, Worker};
use crate::error::DeployError;
use crate::reader::ErrAt;
use serde_json::Value;
use servesim_config::Reader;

/// `traffic.source.images`: the same images on every synthetic request.
#[derive(Clone, Debug, PartialEq)]
pub struct Images {
    pub height: u32,
    pub width: u32,
    pub count: u32,
    pub encoding: &'static str,
    /// `identity: {pool: N}`: requests draw from N images (None: every image is unique).
    pub pool: Option<u32>,
    pub min_pixels: Option<u32>,
    pub max_pixels: Option<u32>,
}

/// `engine.workers.encoder`.
#[derive(Clone, Debug, PartialEq)]
pub struct Encoder {
    /// `mode: native`: the pool replayed event by event (None: the analytical overlay).
    pub native: Option<Native>,
    pub hardware: Option<String>,
    pub backend_version: Option<String>,
    pub tensor: u32,
    pub replicas: u32,
    pub batch_size: u32,
    pub latency_correction: f64,
    pub rate_degradation: f64,
}

/// What a native pool adds: the image processor's stages (spelled out with `measured_for`, or
/// resolved from `host_profile` against the workload when the configuration is read) and the
/// embeddings' link to the language worker.
#[derive(Clone, Debug, PartialEq)]
pub struct Native {
    pub frontend: Option<super::frontend::Frontend>,
    pub host_profile: Option<super::frontend::HostProfile>,
    pub transfer_gb_s: f64,
}

pub(crate) fn read_images(mut r: Reader) -> Result<Images, DeployError> {
    let here = r.here().to_string();
    let height = r.positive("height")?.ok_or_else(|| DeployError::new(&here, "height is required"))?;
    let width = r.positive("width")?.ok_or_else(|| DeployError::new(&here, "width is required"))?;
    let count = r.positive("count")?.unwrap_or(1);
    let encoding = r.one_of("encoding", &["png", "jpeg"])?.unwrap_or("png");
    let pool = match r.value("identity") {
        None => None,
        Some(v) if v.as_str() == Some("unique") => None,
        Some(v) if v.is_object() => {
            let mut p = Reader::mapping(&r.path("identity"), v)?;
            let n = p.positive("pool")?.ok_or_else(|| p.err("pool", "pool is required"))?;
            p.finish()?;
            Some(n)
        }
        Some(_) => return Err(r.err("identity", "must be \"unique\" or {pool: N}")),
    };
    let min_pixels = r.positive("min_pixels")?;
    let max_pixels = r.positive("max_pixels")?;
    if let (Some(lo), Some(hi)) = (min_pixels, max_pixels) {
        if lo > hi {
            return Err(r.err("min_pixels", "images.min_pixels cannot exceed images.max_pixels"));
        }
    }
    r.finish()?;
    Ok(Images { height, width, count, encoding, pool, min_pixels, max_pixels })
}

pub(super) fn read_encoder(mut r: Reader) -> Result<Encoder, DeployError> {
    let here = r.here().to_string();
    let mode = r.one_of("mode", &["analytical", "native"])?.unwrap_or("analytical");
    let hardware = r.nonempty("hardware")?;
    let backend_version = r.nonempty("backend_version")?;
    let tensor = r.positive("tensor")?.unwrap_or(1);
    let replicas = r.positive("replicas")?.unwrap_or(1);
    // A native pool's loop batches up to SGLANG_ENCODER_MAX_BATCH_SIZE (8) unless told.
    let batch_size = r.positive("batch_size")?.unwrap_or(if mode == "native" { 8 } else { 1 });
    if batch_size > 8 {
        return Err(r.err("batch_size", format!("must be at most 8 (SGLANG_ENCODER_MAX_BATCH_SIZE), got {batch_size}")));
    }
    let latency_correction = r.nonneg("latency_correction", true)?.unwrap_or(1.0);
    let rate_degradation = r.nonneg("rate_degradation", true)?.unwrap_or(0.9);
    if rate_degradation > 1.0 {
        return Err(r.err("rate_degradation", format!("must be in (0, 1], got {rate_degradation}")));
    }
    let (frontend, host_profile) = super::frontend::read_worker_frontend(&mut r)?;
    let transfer_gb_s = match r.obj("transfer")? {
        None => None,
        Some(mut t) => {
            let bw = t
                .nonneg("bandwidth_gb_per_second", true)?
                .ok_or_else(|| DeployError::new(t.here(), "bandwidth_gb_per_second is required"))?;
            t.finish()?;
            Some(bw)
        }
    };
    r.finish()?;
    let native =
        if mode == "native" {
            // The reference's rules of a native pool, in its order and words.
            let Some(transfer_gb_s) = transfer_gb_s.filter(|_| frontend.is_some() || host_profile.is_some()) else {
                return Err(DeployError::new(
                &here,
                "native encoder replay requires transfer.bandwidth_gb_per_second and one of host_profile or frontend",
            ));
            };
            if host_profile.as_ref().is_some_and(|h| h.frontend != "python") {
                return Err(DeployError::new(
                    format!("{here}.host_profile.frontend"),
                    "the encoder servers run the Python image processor; host_profile.frontend must be python",
                ));
            }
            if let Some(f) = &frontend {
                match &f.measured_for {
                    None => {
                        return Err(DeployError::new(
                            format!("{here}.frontend"),
                            "native encoder frontend stages require measured_for; set host_profile to resolve them \
                         from a host cost table",
                        ))
                    }
                    Some(m) if m.frontend != "python" => return Err(DeployError::new(
                        format!("{here}.frontend.measured_for.frontend"),
                        "the encoder servers run the Python image processor; frontend.measured_for.frontend must be \
                         python",
                    )),
                    Some(_) => {}
                }
            }
            if latency_correction != 1.0 {
                return Err(DeployError::new(
                    format!("{here}.latency_correction"),
                    "latency_correction applies to analytical encoder pools only",
                ));
            }
            Some(Native { frontend, host_profile, transfer_gb_s })
        } else {
            if frontend.is_some() || host_profile.is_some() || transfer_gb_s.is_some() {
                let key = if frontend.is_some() {
                    "frontend"
                } else if host_profile.is_some() {
                    "host_profile"
                } else {
                    "transfer"
                };
                return Err(DeployError::new(
                    format!("{here}.{key}"),
                    "host_profile, frontend and transfer apply to encoder mode=native only",
                ));
            }
            None
        };
    Ok(Encoder {
        native,
        hardware,
        backend_version,
        tensor,
        replicas,
        batch_size,
        latency_correction,
        rate_degradation,
    })
}

/// The reference's cross-section rules of images and an encoder pool (`_validate_epd` and the
/// compiler's), in its order and words.
/// The compiler's estimator-policy rules beside an encoder pool that read values as written (the
/// modes and fallback, which the engine keeps only when they select an FPM estimator): at engine
/// level any mode but `auto` or a fallback but `deny`; on a language worker's timing an `allow`
/// fallback, a mode other than `op_level` / `fpm_interpolation`, a transfer policy or
/// estimator settings.
pub(super) fn check_estimator_policies(engine: Option<&Value>) -> Result<(), DeployError> {
    let Some(engine) = engine else { return Ok(()) };
    let text = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    let mode = text(engine, "estimation_mode");
    let fallback = text(engine, "fallback_policy");
    if mode.as_deref().is_some_and(|m| m != "auto") || fallback.as_deref().is_some_and(|f| f != "deny") {
        return Err(DeployError::new(
            "engine",
            "estimator policies require regular language workers with default timing in every role",
        ));
    }
    for role in ["aggregated", "prefill", "decode"] {
        let Some(timing) = engine.get("workers").and_then(|w| w.get(role)).and_then(|w| w.get("timing")) else {
            continue;
        };
        let mode = text(timing, "estimation_mode");
        let set = |k: &str| timing.get(k).is_some_and(|v| !v.is_null() && v.as_object().is_none_or(|m| !m.is_empty()));
        if text(timing, "fallback_policy").as_deref() == Some("allow")
            || mode.as_deref().is_some_and(|m| !matches!(m, "op_level" | "fpm_interpolation"))
            || set("transfer_policy")
            || set("estimator_config")
        {
            return Err(DeployError::new(
                format!("engine.workers.{role}.timing"),
                "estimator policies require regular language workers with default timing",
            ));
        }
    }
    Ok(())
}

/// The reference's rules of images encoded on the language worker (native VL replay), in its
/// order and words.
fn check_native_vl(engine: &Engine, language: Option<&Worker>, mode: Mode, role: &str) -> Result<(), DeployError> {
    let mode_name = if mode == Mode::Aggregated { "aggregated" } else { "disaggregated" };
    let Some(w) = language.filter(|_| engine.backend == "sglang" && engine.mode == mode) else {
        return Err(DeployError::new(
            "traffic.source.images",
            format!(
                "image workloads require engine.workers.encoder (analytical EPD) or an aggregated or prefill worker \
                 with backend=sglang and concrete mode={mode_name} (native VL replay)"
            ),
        ));
    };
    let here = format!("engine.workers.{role}");
    if w.timing != Timing::Default {
        return Err(DeployError::new(format!("{here}.timing"), "native VL replay requires default timing"));
    }
    super::worker::check_native_vl_parallelism(&w.parallelism)
        .map_err(|why| DeployError::new(format!("{here}.parallelism"), why))?;
    Ok(())
}

pub(super) fn check_epd(traffic: &Traffic, engine: &Engine) -> Result<(), DeployError> {
    let workers = "engine.workers";
    let (images, encoder) = (traffic.images.as_ref(), engine.encoder.as_ref());
    // The language worker that hosts the scheduler loop and the vision tower.
    let (language, mode) = match (&engine.aggregated, &engine.prefill) {
        (Some(w), _) => (Some(w), Mode::Aggregated),
        (None, p) => (p.as_ref(), Mode::Disaggregated),
    };
    let role = if mode == Mode::Aggregated { "aggregated" } else { "prefill" };
    let host_aware = language.is_some_and(|w| w.host_loop || w.vision.is_some());
    if let (Some(e), true, Some(w)) = (encoder, host_aware, language) {
        if e.native.is_none() {
            return Err(DeployError::new(
                format!("{workers}.encoder"),
                "engine.workers.encoder (analytical EPD) and the language worker's host_loop or vision (native VL \
                 replay) are exclusive",
            ));
        }
        if w.vision.is_some() || w.frontend.is_some() || w.host_profile.is_some() {
            let key = if w.vision.is_some() {
                "vision"
            } else if w.frontend.is_some() {
                "frontend"
            } else {
                "host_profile"
            };
            return Err(DeployError::new(
                format!("{workers}.{role}.{key}"),
                "with a native encoder pool the language worker runs --language-only: it neither hosts the vision \
                 tower nor prices image frontend stages; only host_loop applies",
            ));
        }
    }
    if images.is_none() && language.is_some_and(|w| w.vision.is_some()) {
        return Err(DeployError::new(
            format!("{workers}.{role}.vision"),
            format!("workers.{role}.vision requires traffic.source.images"),
        ));
    }
    match (images, encoder) {
        (None, None) => return Ok(()),
        (Some(_), None) => return check_native_vl(engine, language, mode, role),
        (None, Some(_)) => {
            return Err(DeployError::new(
                format!("{workers}.encoder"),
                "EPD requires both traffic.source.images and engine.workers.encoder",
            ))
        }
        (Some(_), Some(_)) => {}
    }
    let images = images.expect("matched");
    if images.pool.is_some() {
        return Err(DeployError::new(
            "traffic.source.images.identity",
            "encoder pools do not model image identity pools; traffic.source.images.identity must be unique",
        ));
    }
    if encoder.expect("matched").native.is_some() {
        if engine.backend != "sglang" {
            return Err(DeployError::new("engine.backend", "native encoder replay requires backend=sglang"));
        }
        for w in [&engine.aggregated, &engine.prefill, &engine.decode].into_iter().flatten() {
            let here = format!("{workers}.{}", w.role);
            if w.timing != Timing::Default {
                return Err(DeployError::new(
                    format!("{here}.timing"),
                    "native encoder replay requires default language timing",
                ));
            }
            if w.startup_seconds != 0.0 {
                return Err(DeployError::new(
                    format!("{here}.startup_seconds"),
                    "encoder pools require static worker pools",
                ));
            }
        }
        return Ok(());
    }
    if images.min_pixels.is_some() || images.max_pixels.is_some() {
        return Err(DeployError::new(
            "traffic.source.images",
            "images.min_pixels and max_pixels are honored only by native VL replay, not by analytical EPD",
        ));
    }
    if !matches!(traffic.load, Load::Concurrency(_)) {
        return Err(DeployError::new(
            "traffic.load",
            "analytical EPD requires fixed synthetic concurrency, not rate or load search",
        ));
    }
    // The compiler's estimator-policy rules: an encoder pool takes the default data and policy.
    if engine.systems_paths.is_some() {
        return Err(DeployError::new("engine.systems_paths", "engine.systems_paths does not support encoder pools"));
    }
    let roles = || [&engine.aggregated, &engine.prefill, &engine.decode].into_iter().flatten();
    if roles().any(|w| w.systems_paths.is_some() || w.timing_controls.contains_key("database_mode")) {
        return Err(DeployError::new(
            workers,
            "estimator policies require regular language workers with default timing",
        ));
    }
    if ["database_mode", "enable_shared_layer", "strict_provenance"].iter().any(|k| engine.controls.contains_key(*k)) {
        return Err(DeployError::new(
            "engine",
            "estimator policies require regular language workers with default timing in every role",
        ));
    }
    for w in roles() {
        let here = format!("{workers}.{}", w.role);
        if w.timing != Timing::Default {
            return Err(DeployError::new(
                format!("{here}.timing"),
                "analytical EPD requires default op_level language timing",
            ));
        }
        if w.startup_seconds != 0.0 {
            return Err(DeployError::new(
                format!("{here}.startup_seconds"),
                "encoder pools require static worker pools",
            ));
        }
        if let Some(key) = super::controls::PER_WORKER.iter().find(|k| w.timing_controls.contains_key(**k)) {
            return Err(DeployError::new(
                format!("{here}.timing.{key}"),
                "explicit timing identity requires the canonical forward-pass provider",
            ));
        }
    }
    Ok(())
}
