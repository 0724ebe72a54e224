//! Image traffic through an analytical encoder pool (EPD), as aisimulate 0.13 predicts it: not
//! an event-level encoder queue but an overlay on the language replay's aggregate means.
//!
//! 1. The pool ([`Pool::resolve`]): the processor's image geometry gives the visual tokens a
//!    request carries; one encoder-only worker (`servesim_perf::vision`) at the pool's tensor
//!    width runs a batch of `batch_size` requests in `latency` ms (the ops' sum times
//!    `latency_correction`, reported rounded to 3 decimals), so it serves
//!    `batch_size · 1000 / latency` requests a second; its memory (rounded to 3 decimals) plus
//!    the system's NCCL and framework overhead must fit the GPU.
//! 2. The language side ([`Pool::language`]): a plain text replay of the same traffic whose
//!    prompts carry `input_tokens + visual tokens`.
//! 3. The overlay ([`overlay`]): TTFT and end-to-end latency gain the rounded encoder latency;
//!    the request rate is capped at the pool's degraded capacity
//!    `(throughput · rate_degradation) · replicas` when that is lower, output throughput scaled
//!    with it; duration is the completed requests over that rate; GPU-hours count the language
//!    and encoder GPUs. The report keeps only the aggregate means with overlay semantics, under
//!    `{metadata, summary}`.

use serde_json::{json, Map, Value};
use servesim_perf::db::Database;
use servesim_perf::systems::{find_system, resolve_version, systems_roots};
use servesim_perf::vision::VisionTower;
use servesim_replay::Report;

use crate::error::DeployError;
use crate::schema::{Config, Mode, Source};

const KEY: &str = "engine.workers.encoder";

/// A resolved analytical encoder pool (the reference's `EncoderPoolSpec`).
#[derive(Clone, Debug, PartialEq)]
pub struct Pool {
    pub model: String,
    pub system: String,
    pub backend: String,
    pub backend_version: String,
    pub tp: u32,
    pub batch_size: u32,
    pub workers: u32,
    /// One batch's latency, ms, rounded to 3 decimals.
    pub latency_ms: f64,
    /// Requests a second one worker serves (from the unrounded latency).
    pub throughput_rps: f64,
    /// GiB, rounded to 3 decimals.
    pub memory_gib: f64,
    pub rate_degradation: f64,
    pub latency_correction: f64,
    /// Visual tokens of one request (all its images).
    pub visual_tokens: u32,
    pub image_height: u32,
    pub image_width: u32,
    pub image_count: u32,
}

/// Python's `round(x, 3)`: the exact binary value rounded to 3 decimals.
fn round3(x: f64) -> f64 {
    format!("{x:.3}").parse().unwrap_or(x)
}

/// Why no encode-worker row is left (the reference's words).
fn empty_reason(saw_oom: bool) -> &'static str {
    if saw_oom {
        "EPD encoder: the encode worker does not fit in GPU memory for any (tp, batch)."
    } else {
        "EPD encoder: no encode-worker candidate for any encoder tp (tp must divide the ViT geometry and have comm \
         data on this system; see warnings)."
    }
}

fn err(message: impl std::fmt::Display) -> DeployError {
    DeployError::new(KEY, message)
}

impl Pool {
    /// The pool of a configuration (None without images and an encoder pool).
    pub fn resolve(config: &Config) -> Result<Option<Pool>, DeployError> {
        let Some(encoder) = &config.engine.encoder else { return Ok(None) };
        let Some(rows) = Pool::rows(config, &[encoder.tensor], &[encoder.batch_size])? else { return Ok(None) };
        let pool = rows.into_iter().next().expect("rows are never empty");
        Ok(Some(Pool { workers: encoder.replicas, ..pool }))
    }

    /// The encode-worker rows of a configuration's images and encoder settings over the
    /// tensor widths `tps` and batch sizes `batches` (each ascending, duplicates dropped), one
    /// worker each (the reference's `_get_encoder_worker_candidates`): a width without NCCL
    /// data on the system or that does not divide the vision tower is skipped; within a width
    /// the batches run until one does not fit the GPU (the larger ones would not either), and
    /// a batch that does not raise the requests a second is dropped. None without images and
    /// an encoder pool; an error when no row is left.
    pub fn rows(config: &Config, tps: &[u32], batches: &[u32]) -> Result<Option<Vec<Pool>>, DeployError> {
        let Some(images) = &config.traffic.images else { return Ok(None) };
        let Some((rows, saw_oom)) = Pool::scan(config, tps, batches, images.count, false)? else { return Ok(None) };
        if rows.is_empty() {
            return Err(err(empty_reason(saw_oom)));
        }
        Ok(Some(rows))
    }

    /// The row of a native pool at tensor width `tp` with `workers` servers (the reference's
    /// `_native_encoder_rows`): one analytical row at the pool's batch cap, its memory gated at
    /// the parts one server batches (a request's images spread over the servers, so a part
    /// holds `ceil(count / workers)` of them). `Ok(Err(why))`: this width and server count do
    /// not fit (the GPU memory, or no row at this width), which a search skips.
    pub fn native(config: &Config, tp: u32, workers: u32) -> Result<Result<Pool, String>, DeployError> {
        let (Some(images), Some(encoder)) = (&config.traffic.images, &config.engine.encoder) else {
            return Err(err("a native encoder pool needs traffic.source.images"));
        };
        let part = images.count.div_ceil(workers.max(1));
        let (rows, saw_oom) = Pool::scan(config, &[tp], &[encoder.batch_size], part, true)?
            .expect("images and an encoder pool (checked above)");
        Ok(match rows.into_iter().next() {
            Some(row) => Ok(Pool { workers, ..row }),
            None => Err(empty_reason(saw_oom).to_string()),
        })
    }

    /// The rows over `tps` and `batches` with the memory and latency of batches of requests of
    /// `per_request` images each (the visual tokens stay the whole request's), and whether a
    /// batch ran out of GPU memory.
    fn scan(
        config: &Config,
        tps: &[u32],
        batches: &[u32],
        per_request: u32,
        native: bool,
    ) -> Result<Option<(Vec<Pool>, bool)>, DeployError> {
        let (Some(images), Some(encoder)) = (&config.traffic.images, &config.engine.encoder) else { return Ok(None) };
        let engine = &config.engine;
        let perf = |e: servesim_perf::PerfError| err(e.message);
        let roots = systems_roots(engine.systems_paths.as_deref().unwrap_or(&[])).map_err(perf)?;
        let root_paths: Vec<_> = roots.iter().map(|(p, _)| p.clone()).collect();
        let path = servesim_perf::model::find_config(&engine.model, &root_paths).map_err(perf)?;
        let root = servesim_perf::model::read_model_config(&path).map_err(perf)?;
        let model = &engine.model;
        let model_type = root.get("model_type").and_then(Value::as_str).unwrap_or("");
        if root.get("vision_config").is_none_or(Value::is_null) || servesim_perf::vision::unpriced_tower(model_type) {
            return Err(err(format!(
                "EPD (encoder disaggregation) requested but model '{model}' has no vision encoder."
            )));
        }
        if model_type == "llama4" || model_type == "gemma4" {
            // aisimulate 0.13 refuses these towers in an encoder pool (probed on its predict).
            return Err(err(format!(
                "encoder pools price Qwen3-VL and Kimi K3 vision towers in aisimulate 0.13; '{model}' ({model_type}) \
                 is not supported"
            )));
        }
        if !model_type.starts_with("qwen3_vl") && model_type != "kimi_k3" {
            return Err(err(format!(
                "servesim's encoder pools price Qwen3-VL and Kimi K3 vision towers; the tower of '{model}' \
                 ({model_type}) is not supported by servesim yet"
            )));
        }
        let mut tower = VisionTower::from_config(&root, model)
            .map_err(perf)?
            .ok_or_else(|| err(format!("model '{model}' has no vision encoder servesim can read (vision_config)")))?;
        // A native pool prices the processor's geometry, its pixel budget included (the
        // analytical pool, the image's own size).
        if native {
            if let Some(lo) = images.min_pixels {
                tower.min_pixels = u64::from(lo);
            }
            if let Some(hi) = images.max_pixels {
                tower.max_pixels = u64::from(hi);
            }
        }
        let shape = tower
            .image(images.height, images.width)
            .map_err(|e| DeployError::new("traffic.source.images", e.message))?;
        let visual_tokens = shape
            .tokens
            .checked_mul(images.count)
            .ok_or_else(|| DeployError::new("traffic.source.images", "visual tokens per request exceed 2^32"))?;
        let Source::Synthetic { input_tokens, output_tokens, .. } = config.traffic.source else {
            unreachable!("images are read on synthetic sources only")
        };
        let context = match engine.context_length {
            Some(c) => Some(u64::from(c)),
            None => root
                .get("text_config")
                .and_then(|t| t.get("max_position_embeddings"))
                .or_else(|| root.get("max_position_embeddings"))
                .and_then(Value::as_u64),
        };
        if context.is_some_and(|c| u64::from(input_tokens) + u64::from(visual_tokens) + u64::from(output_tokens) > c) {
            return Err(err("EPD text + visual + output tokens exceed context_length"));
        }
        // The encoder's data: its own system and version, else the language worker's version
        // on the same system, else the system's current one.
        let system = encoder.hardware.clone().unwrap_or_else(|| engine.hardware.clone());
        let requested = encoder.backend_version.clone().or_else(|| {
            if system == engine.hardware {
                engine.backend_version.clone()
            } else {
                None
            }
        });
        let spec = find_system(&roots, &system).map_err(perf)?;
        let version = resolve_version(&spec, engine.backend, requested.as_deref()).map_err(perf)?;
        let others = if engine.backend == "sglang" { 0.2 } else { 0.0 };
        let gib = (1u64 << 30) as f64;
        let capacity = spec.mem_capacity / gib;
        let (nccl_mem, other_mem) = (spec.nccl_mem.clone(), spec.other_mem);
        let db = Database::open(spec, engine.backend, &version, true).map_err(perf)?;
        let sorted = |xs: &[u32]| {
            let mut v = xs.to_vec();
            v.sort_unstable();
            v.dedup();
            v
        };
        let mut rows = Vec::new();
        let mut saw_oom = false;
        for tp in sorted(tps) {
            let Some(&(_, nccl)) = nccl_mem.iter().find(|(g, _)| *g == tp.min(8)) else { continue };
            if tower.ops(tp).is_err() {
                continue;
            }
            let overhead = (nccl + other_mem * (1.0 + others)) / gib;
            let mut best = 0.0;
            for batch in sorted(batches) {
                let ops = tower.batch_ops(&db, tp, batch, per_request, shape).map_err(perf)?;
                let (memory, _, _) = tower.memory_gib(tp, batch, per_request, shape).map_err(perf)?;
                if memory + overhead >= capacity {
                    saw_oom = true;
                    break;
                }
                let latency = ops.iter().map(|(_, ms)| ms).sum::<f64>() * encoder.latency_correction;
                if !(latency > 0.0 && latency.is_finite()) {
                    return Err(err(format!(
                        "EPD encoder: invalid batch latency ({latency}) at tp={tp} bs={batch}; the encoder perf data \
                         or latency correction is invalid."
                    )));
                }
                let throughput = f64::from(batch) * 1000.0 / latency;
                if throughput <= best {
                    continue;
                }
                best = throughput;
                rows.push(Pool {
                    model: model.clone(),
                    system: system.clone(),
                    backend: engine.backend.to_string(),
                    backend_version: version.clone(),
                    tp,
                    batch_size: batch,
                    workers: 1,
                    latency_ms: round3(latency),
                    throughput_rps: throughput,
                    memory_gib: round3(memory),
                    rate_degradation: encoder.rate_degradation,
                    latency_correction: encoder.latency_correction,
                    visual_tokens,
                    image_height: images.height,
                    image_width: images.width,
                    image_count: images.count,
                });
            }
        }
        Ok(Some((rows, saw_oom)))
    }

    pub fn total_gpus(&self) -> u32 {
        self.tp * self.workers
    }

    /// The language side: the same configuration as a text replay whose prompts carry the
    /// visual tokens, without images or pool.
    pub fn language(&self, config: &Config) -> Config {
        let mut c = config.clone();
        if let Source::Synthetic { input_tokens, .. } = &mut c.traffic.source {
            *input_tokens += self.visual_tokens;
        }
        c.traffic.images = None;
        c.engine.encoder = None;
        c
    }

    /// `metadata.encoder` (the reference's `asdict(EncoderPoolSpec)`; power not modelled).
    pub fn to_json(&self) -> Value {
        json!({
            "backend": self.backend, "backend_version": self.backend_version, "batch_size": self.batch_size,
            "image_count": self.image_count, "image_height": self.image_height, "image_width": self.image_width,
            "latency_correction": self.latency_correction, "latency_ms": self.latency_ms,
            "memory_gib": self.memory_gib, "mode": "analytical", "model": self.model, "native": null,
            "power_coverage": 0.0, "power_w": null, "rate_degradation": self.rate_degradation,
            "system": self.system, "throughput_rps": self.throughput_rps, "tp": self.tp,
            "visual_tokens": self.visual_tokens, "workers": self.workers,
        })
    }
}

/// GPUs of the language workers, as the reference counts them (tensor × pipeline × attention
/// DP per worker).
pub(crate) fn language_gpus(config: &Config) -> u32 {
    let e = &config.engine;
    let roles = match e.mode {
        Mode::Aggregated => vec![&e.aggregated],
        _ => vec![&e.prefill, &e.decode],
    };
    roles
        .into_iter()
        .flatten()
        .map(|w| {
            let p = &w.parallelism;
            p.replicas * p.tensor * p.pipeline * p.attention_data
        })
        .sum()
}

/// Each language role's KV cache format and where it came from (the reference's
/// `kv_cache_precision`): an explicit `kvcache_quant_mode`, the checkpoint's declared KV
/// format, or aisimulate's policy.
fn kv_precision(p: &crate::Prepared) -> Value {
    let e = &p.config.engine;
    let mut out = Map::new();
    for w in &p.engine.workers {
        let ais = &w.args_json["timing_model"]["config"];
        let Ok(cfg) = servesim_perf::AisConfig::from_json("", ais) else { continue };
        let Ok(est) = servesim_perf::estimator(&cfg) else { continue };
        let mode = est.layout.kv.name();
        let role = [&e.aggregated, &e.prefill, &e.decode].into_iter().flatten().find(|r| r.role == w.role);
        let explicit = role.is_some_and(|r| r.timing_controls.contains_key("kvcache_quant_mode"))
            || e.controls.contains_key("kvcache_quant_mode");
        let source = if explicit {
            "user_override"
        } else if est.model.quant.kv != servesim_perf::db::Dtype::Bfloat16 && est.model.quant.kv.name() == mode {
            "checkpoint"
        } else {
            "aisimulate_policy"
        };
        out.insert(w.role.to_string(), json!({"dtype": mode, "source": source}));
    }
    Value::Object(out)
}

/// The prediction document (`{metadata, summary}`) of the language replay `report` of
/// `language` (the prepared [`Pool::language`] configuration) with the pool laid over it.
pub fn overlay(language: &crate::Prepared, pool: &Pool, report: &Report) -> Result<Value, DeployError> {
    let source = crate::prediction_summary(language, report);
    let num = |k: &str| source.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN);
    for k in ["completed_requests", "duration_ms", "output_throughput_tok_s", "mean_ttft_ms", "mean_tpot_ms"]
        .into_iter()
        .chain(["mean_e2e_latency_ms"])
    {
        if !(num(k).is_finite() && num(k) >= 0.0) {
            return Err(err("EPD requires finite complete language replay metrics"));
        }
    }
    let (completed, duration) = (num("completed_requests"), num("duration_ms"));
    if duration <= 0.0 || completed <= 0.0 {
        return Err(err("EPD requires a completed language replay"));
    }
    let lang_gpus = language_gpus(&language.config);
    let share = pool.latency_ms * 1.0;
    let mut seq_s = completed * 1000.0 / duration;
    let mut tokens_s = num("output_throughput_tok_s");
    let capacity = pool.throughput_rps * pool.rate_degradation * f64::from(pool.workers);
    if 0.0 < capacity && capacity < seq_s {
        tokens_s *= capacity / seq_s;
        seq_s = capacity;
    }
    let total_gpus = lang_gpus + pool.tp * pool.workers;
    let span = completed / seq_s * 1000.0;
    let mut s = Map::new();
    for k in [
        "completed_requests",
        "num_ttft_samples",
        "num_tpot_samples",
        "num_e2e_latency_samples",
        "mean_output_token_throughput_per_user",
        "mean_tpot_ms",
    ] {
        if let Some(v) = source.get(k).and_then(Value::as_f64) {
            s.insert(k.into(), json!(v));
        }
    }
    s.insert("output_throughput_tok_s".into(), json!(tokens_s));
    s.insert("mean_ttft_ms".into(), json!(num("mean_ttft_ms") + share));
    s.insert("mean_e2e_latency_ms".into(), json!(num("mean_e2e_latency_ms") + share));
    s.insert("duration_ms".into(), json!(span));
    s.insert("gpu_hours".into(), json!(f64::from(total_gpus) * span / 3_600_000.0));
    s.insert("encoder_latency_ms".into(), json!(pool.latency_ms));
    s.insert("encoder_gpus".into(), json!(f64::from(pool.total_gpus())));
    s.insert("encoder_memory_gib".into(), json!(pool.memory_gib));
    s.insert("encoder_power_coverage".into(), json!(0.0));
    s.insert("power_w".into(), Value::Null);
    s.insert("power_coverage".into(), Value::Null);
    s.insert("metric_semantics".into(), json!("analytical_epd_overlay"));
    let kv = kv_precision(language);
    if kv.as_object().is_some_and(|m| !m.is_empty()) {
        s.insert("kv_cache_precision".into(), kv);
    }
    s.insert(
        "prediction_provenance".into(),
        json!({"runner": {"unavailable_reason": "runner did not report effective timing provenance"}}),
    );
    s.insert("total_gpus".into(), json!(total_gpus));
    // The SLA is echoed, not evaluated: the overlay is of aggregate means (`sla_semantics`).
    let sla = &language.config.sla;
    let bounds: Map<String, Value> = [("ttft_ms", sla.ttft_ms), ("itl_ms", sla.itl_ms), ("e2e_ms", sla.e2e_ms)]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k.to_string(), json!(v))))
        .collect();
    let metadata = json!({
        "metric_semantics": "analytical_epd_overlay",
        "encoder": pool.to_json(),
        "language_gpus": lang_gpus,
        "total_gpus": total_gpus,
        "language_replay_duration_ms": duration,
        "deployment_artifact_generation_supported": false,
        "prediction_config_supported": true,
        "sla_semantics": "aggregate_means_only",
        "aggregate_sla_bounds": if bounds.is_empty() { Value::Null } else { Value::Object(bounds) },
    });
    Ok(crate::sorted(&json!({"metadata": metadata, "summary": Value::Object(s)})))
}

/// A JSON value as Python's `str` shows it (floats always with a decimal point or exponent).
fn py(v: Option<&Value>) -> String {
    match v {
        None => "N/A".into(),
        Some(Value::Null) => "None".into(),
        Some(Value::Number(n)) if n.is_f64() => {
            let x = n.as_f64().unwrap_or(f64::NAN);
            let a = x.abs();
            if x != 0.0 && !(1e-4..1e16).contains(&a) {
                let s = format!("{x:e}");
                let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
                let e: i32 = e.parse().unwrap_or(0);
                format!("{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs())
            } else if x.fract() == 0.0 {
                format!("{x:.1}")
            } else {
                format!("{x}")
            }
        }
        Some(other) => other.to_string(),
    }
}

/// The reference's table form of an analytical EPD prediction.
pub fn table(document: &Value) -> String {
    let s = &document["summary"];
    let mut lines = vec!["AISimulate analytical EPD (aggregate estimates; no encoder queue simulation)".to_string()];
    for k in [
        "mean_ttft_ms",
        "mean_tpot_ms",
        "mean_e2e_latency_ms",
        "output_throughput_tok_s",
        "completed_requests",
        "duration_ms",
        "gpu_hours",
        "encoder_gpus",
        "total_gpus",
    ] {
        lines.push(format!("{k}: {}", py(s.get(k))));
    }
    let reason = "unavailable (energy provider or topology unsupported)";
    lines.push(format!("power_w={reason} power_coverage={reason}"));
    if let Some(kv) = s["kv_cache_precision"].as_object() {
        for (role, p) in ["aggregated", "prefill", "decode"].iter().filter_map(|r| kv.get(*r).map(|p| (r, p))) {
            lines.push(format!(
                "KV cache ({role}): {} (source: {})",
                p["dtype"].as_str().unwrap_or(""),
                p["source"].as_str().unwrap_or("")
            ));
        }
    }
    lines.push("Timing (runner): unavailable (runner did not report effective timing provenance)".into());
    lines.push("duration_ms is a rate-derived accounting interval, not an EPD event timeline.".into());
    lines.join("\n") + "\n"
}
