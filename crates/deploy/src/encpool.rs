//! A native encoder pool (`engine.workers.encoder` with `mode: native`), lowered to the
//! replay's event-level pool (`servesim_replay::EncoderPool`, rules in the replay README's
//! "Native encoder pool").
//!
//! What the pool takes from the configuration, as the reference resolves it:
//! - the tower: the model's Qwen3-VL vision tower on the pool's hardware at its tensor width,
//!   sharded (`encoder_parallel: tp`), timed per call by servesim-perf's vision ops through the
//!   timing interface (`PassTimer::vision_ms`);
//! - the CPU preprocessing per image: the first stage's `service_ms` of the Python image
//!   processor's frontend stages (spelled out with `measured_for`, or the host cost table's row
//!   of this workload) over the images of a request;
//! - the transfer: one image's embeddings (merged tokens × hidden × merger instances × 2 bytes)
//!   to every tensor rank of the language worker, at `transfer.bandwidth_gb_per_second`.
//!
//! The language worker runs `--language-only`: its prompts carry the visual tokens (laid out as
//! native VL replay lays them out, every image unique) and it hosts no tower.

use serde_json::{json, Value};
use servesim_perf::vision::{hosted_tower, ImageShape, VisionTower};
use servesim_replay::EncoderPool;
use servesim_workload::SyntheticImages;

use crate::error::DeployError;
use crate::schema::encoder::{Encoder, Images, Native};
use crate::schema::frontend::Measurement;
use crate::schema::Config;
use servesim_replay::FrontendStage;

const HERE: &str = "engine.workers.encoder";

/// The native pool of a configuration, with its tower and image shape (None: no native pool).
fn native(cfg: &Config) -> Option<(&Encoder, &Native, &Images)> {
    let e = cfg.engine.encoder.as_ref()?;
    Some((e, e.native.as_ref()?, cfg.traffic.images.as_ref()?))
}

/// The reference lays out a native pool's images with its native VL replay's geometry (Qwen's
/// pixel budget, Llama 4's tiles) and refuses Kimi K3's patch-budget processor there, before
/// any timing (probed: tests/deploy/predict_epd_kimi_k3.yaml), in these words.
fn refuse_unlaid_family(model: &str, paths: &[String]) -> Result<(), DeployError> {
    let found = servesim_perf::systems::systems_roots(paths).ok().and_then(|roots| {
        let roots: Vec<_> = roots.into_iter().map(|(p, _)| p).collect();
        servesim_perf::model::read_model_config(&servesim_perf::model::find_config(model, &roots).ok()?).ok()
    });
    let Some(root) = found else { return Ok(()) };
    if root.get("model_type").and_then(Value::as_str) == Some("kimi_k3") {
        let family = root.get("architectures").and_then(|a| a.get(0)).and_then(Value::as_str).unwrap_or("kimi_k3");
        return Err(DeployError::new(
            "engine.model",
            format!("{model}: the {family} vision family is not supported by native VL replay"),
        ));
    }
    Ok(())
}

fn tower(cfg: &Config, images: &Images) -> Result<(VisionTower, ImageShape), DeployError> {
    let engine = &cfg.engine;
    let paths = engine.systems_paths.clone().unwrap_or_default();
    refuse_unlaid_family(&engine.model, &paths)?;
    let tower = hosted_tower(&engine.model, &paths, images.min_pixels.map(u64::from), images.max_pixels.map(u64::from))
        .map_err(|e| {
            if e.message.contains("SERVESIM_AIS_SYSTEMS") || e.message.contains("not found") {
                DeployError::new("engine.model", e.message)
            } else {
                DeployError::new(
                    "engine.model",
                    format!("native encoder pools price Qwen3-VL vision towers; '{}' is not supported", engine.model),
                )
            }
        })?;
    let shape =
        tower.image(images.height, images.width).map_err(|e| DeployError::new("traffic.source.images", e.message))?;
    if shape.tokens >= 1 << 16 {
        return Err(DeployError::new(
            "traffic.source.images",
            format!("an image of {} tokens is more than servesim's replay lays out (65535)", shape.tokens),
        ));
    }
    Ok((tower, shape))
}

/// The prompts' image layout under a native pool (None: no native pool).
pub fn images(cfg: &Config) -> Result<Option<SyntheticImages>, DeployError> {
    let Some((_, _, images)) = native(cfg) else { return Ok(None) };
    let (_, shape) = tower(cfg, images)?;
    Ok(Some(SyntheticImages { tokens: shape.tokens, count: images.count, pool: None }))
}

/// The pool's frontend stages (a host cost table's row, or the saved stages measured for this
/// workload), the measurement they price and the row's digest (None: stages written out).
fn stages(
    cfg: &Config,
    native: &Native,
    images: &Images,
) -> Result<(Vec<FrontendStage>, Measurement, Option<String>), DeployError> {
    let needed = Measurement::for_workload(&cfg.engine.model, "python", images, 1);
    match (&native.host_profile, &native.frontend) {
        (Some(profile), _) => {
            let (stages, digest) = crate::host_table::resolve_row(&profile.path, &needed)
                .map_err(|message| DeployError::new(format!("{HERE}.host_profile"), message))?;
            Ok((stages, needed, Some(digest)))
        }
        (None, Some(f)) => {
            if f.measured_for.as_ref() != Some(&needed) {
                return Err(DeployError::new(
                    format!("{HERE}.frontend.measured_for"),
                    "saved encoder frontend stages were measured for another workload",
                ));
            }
            Ok((f.stages.clone(), needed, None))
        }
        (None, None) => unreachable!("a native pool has stages or a host profile (checked when read)"),
    }
}

/// A measurement as the reference writes it (every field, `null` where unset).
fn measurement_json(m: &Measurement) -> Value {
    json!({
        "model": m.model, "frontend": m.frontend, "feature_transport": m.feature_transport, "height": m.height,
        "width": m.width, "count": m.count, "encoding": m.encoding, "min_pixels": m.min_pixels,
        "max_pixels": m.max_pixels,
    })
}

fn stages_json(stages: &[FrontendStage]) -> Value {
    stages
        .iter()
        .map(|s| json!({"workers": s.workers, "service_ms": s.service_ms, "concurrency_scale": s.concurrency_scale}))
        .collect()
}

/// The `frontend` a saved candidate of a native pool carries when the pool reads a host cost
/// table: the table's row, resolved (None: the stages are written out already).
pub fn frontend_json(cfg: &Config) -> Result<Option<Value>, DeployError> {
    let Some((_, native, images)) = native(cfg) else { return Ok(None) };
    if native.host_profile.is_none() {
        return Ok(None);
    }
    let (stages, measured, _) = stages(cfg, native, images)?;
    let mut measured_for = measurement_json(&measured);
    if let Some(m) = measured_for.as_object_mut() {
        m.retain(|_, v| !v.is_null());
    }
    Ok(Some(json!({"stages": stages_json(&stages), "measured_for": measured_for})))
}

/// A native pool resolved for the replay: the replay's pool and the identity `prediction.json`
/// reports under `encoder` (the reference's resolved terms: stages, image shape, transfer and
/// the servers' timing model).
pub struct Resolved {
    pub pool: EncoderPool,
    pub identity: Value,
}

/// The replay's pool of a configuration (None: no native pool).
pub fn lower(cfg: &Config) -> Result<Option<Resolved>, DeployError> {
    let Some((e, native, images)) = native(cfg) else { return Ok(None) };
    let engine = &cfg.engine;
    // The tower's family is checked before any host table lookup, as the reference does.
    let (tower, shape) = tower(cfg, images)?;
    let (stages, measured, digest) = stages(cfg, native, images)?;
    // The servers' GPU memory at the batch cap, over the parts one server batches.
    let row = crate::epd::Pool::native(cfg, e.tensor, e.replicas)?.map_err(|why| {
        DeployError::new(
            HERE,
            format!("native encoder: no feasible tp/workers; tp={} workers={}: {why}", e.tensor, e.replicas),
        )
    })?;
    let preprocess_ms_per_image = stages[0].service_ms / f64::from(images.count);
    let language = engine.aggregated.as_ref().or(engine.prefill.as_ref());
    let language_tp = language.map_or(1, |w| w.parallelism.tensor);
    let transfer_bytes_per_image = tower.embedding_bytes(shape) as f64 * f64::from(language_tp);
    // The encoder server's timing: a prefill-shaped rank of the pool's width whose model
    // compiles the vision tower, sharded.
    let system = e.hardware.clone().unwrap_or_else(|| engine.hardware.clone());
    let version = e
        .backend_version
        .clone()
        .or_else(|| (system == engine.hardware).then(|| engine.backend_version.clone()).flatten());
    let mut image = json!({"height": images.height, "width": images.width});
    if let Some(lo) = images.min_pixels {
        image["min_pixels"] = json!(lo);
    }
    if let Some(hi) = images.max_pixels {
        image["max_pixels"] = json!(hi);
    }
    let mut ais = json!({
        "model": engine.model,
        "system": system,
        "backend": engine.backend,
        "worker_type": "prefill",
        "backend_version": version,
        "tp": e.tensor,
        "pp": 1,
        "attention_dp": 1,
        "encoder_parallel": "tp",
        "vision_image": image,
    });
    if let Some(paths) = &engine.systems_paths {
        ais["systems_paths"] = json!(paths);
    }
    let timing_config = timing_identity(&ais, cfg, &row.backend_version)?;
    let timer = servesim_perf::build_timer(&format!("{HERE}.timing"), "aic", &ais)
        .map_err(|e| DeployError::new(HERE, format!("{}: {}", e.path, e.message)))?;
    let mut pool = EncoderPool {
        instances: e.replicas,
        max_batch: e.batch_size,
        images_per_request: images.count,
        preprocess_ms_per_image,
        transfer_bytes_per_image,
        transfer_bandwidth_gb_s: native.transfer_gb_s,
        tower_ms: Vec::new(),
    };
    pool.tower_ms = (0..=pool.max_batch_images())
        .map(|n| timer.vision_ms(n).map_err(|why| DeployError::new(HERE, why)))
        .collect::<Result<Vec<f64>, _>>()?;
    let identity = json!({
        "host_profile_digest": digest,
        "native": {
            "frontend": {"measured_for": measurement_json(&measured), "stages": stages_json(&stages)},
            "host_profile_digest": digest,
            "preprocess_ms_per_image": preprocess_ms_per_image,
            "preprocess_source": "frontend_process_extrapolated",
            "shape": {
                "sequences": shape.sequences, "patch_tokens": shape.patches, "transformer_tokens": shape.vit,
                "output_tokens": shape.merged,
            },
            "timing_model": {"type": "external", "provider": "aic", "config": timing_config},
            "transfer_bandwidth_gb_s": native.transfer_gb_s,
            "transfer_bytes_per_image": tower.embedding_bytes(shape),
        },
    });
    Ok(Some(Resolved { pool, identity }))
}

/// The servers' timing model as the reference spells it out (its canonical forward-pass
/// configuration: every field, the defaults of an encoder server's prefill-shaped rank).
fn timing_identity(ais: &Value, cfg: &Config, version: &str) -> Result<Value, DeployError> {
    let paths = cfg.engine.systems_paths.clone().unwrap_or_default();
    let roots = servesim_perf::systems::systems_roots(&paths).map_err(|e| DeployError::new(HERE, e.message))?;
    let roots: Vec<String> = roots.iter().map(|(p, _)| p.display().to_string()).collect();
    let c = json!({
        "attention_backend": null, "attention_dp": 1, "backend": ais["backend"], "backend_version": version,
        "comm_quant_mode": null, "cp_size": null, "database_mode": "SILICON", "dcp": null, "decoder_replay": false,
        "enable_shared_layer": null, "encoder_parallel": "tp", "estimation_mode": "auto", "estimator_config": {},
        "fallback_policy": "deny", "fmha_quant_mode": null, "fpm_fmha_quant_mode": null, "fpm_profile": null,
        "gemm_quant_mode": null, "kv_block_size": null, "kvcache_quant_mode": null, "model": ais["model"],
        "moe_ep_size": null, "moe_quant_mode": null, "moe_tp_size": null, "nextn": 0, "pp": 1, "speculation": null,
        "strict_provenance": false, "system": ais["system"], "systems_paths": roots, "tp": ais["tp"],
        "transfer_policy": null, "worker_type": "prefill",
    });
    Ok(c)
}

/// The summary keys of a native pool: its GPUs (beside the language workers' in the total and
/// the GPU hours over the run) and the mean time from a request's arrival to its images'
/// embeddings landing.
pub fn summarise(cfg: &Config, report: &servesim_replay::Report, s: &mut serde_json::Map<String, Value>) {
    let Some((e, _, _)) = native(cfg) else { return };
    let gpus = e.tensor * e.replicas;
    let total = crate::epd::language_gpus(cfg) + gpus;
    let (n, sum) = report.totals.encoder_wait.unwrap_or((0, 0.0));
    s.insert("encoder_latency_ms".into(), json!(if n == 0 { 0.0 } else { sum / n as f64 }));
    s.insert("encoder_gpus".into(), json!(gpus));
    s.insert("total_gpus".into(), json!(total));
    // The pool's servers are provisioned over the language workers' span (the replay's end,
    // which a host loop's last iteration carries past the last token), not `duration_ms`.
    s.insert("gpu_hours".into(), json!(report.gpu_hours() + f64::from(gpus) * report.end_ms / 3_600_000.0));
}
