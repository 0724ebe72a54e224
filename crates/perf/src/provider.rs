//! The `ais` / `aic` timing provider: the reference's `ForwardPassPerfModelConfig` keys, an
//! estimator shared by every worker with the same configuration, and the engine's
//! [`PassTimer`].

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::{json, Map, Value};
use servesim_engine::ConfigError;
use servesim_engine::PassTimer;

use crate::db::{Database, DatabaseMode, Dtype};
use crate::error::{PerfError, Result};
use crate::estimator::Estimator;
use crate::model::{Family, Layout, ModelSpec};
use crate::systems::{find_system, resolve_version, systems_roots};

/// A validated AIS timing configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct AisConfig {
    pub model: String,
    pub system: String,
    pub backend: String,
    pub worker_type: String,
    pub backend_version: Option<String>,
    pub tp: u32,
    pub pp: u32,
    /// Prefill context parallelism (SGLang's all-gather variant: dense, plain and hybrid MoE,
    /// Gemma 4).
    pub cp_size: u32,
    /// Decode context parallelism (`dcp`): the KV striped over that many TP ranks (`dcp.rs`).
    pub dcp: u32,
    pub attention_dp: u32,
    pub moe_tp_size: Option<u32>,
    pub moe_ep_size: Option<u32>,
    pub nextn: u32,
    /// Draft tokens per decode step of a drafted scheme (`speculation`: ngram prompt lookup or
    /// an EAGLE-3 chain), which the target verifies in one block pass; 0: none.
    pub ngram: u32,
    /// The EAGLE-3 draft layer (`speculation: {kind: eagle3, draft_config}`), timed beside the
    /// target (`eagle3.rs`).
    pub eagle3: Option<crate::eagle3::DraftGeometry>,
    /// A standalone draft model (`speculation: {kind: draft_model, draft_model_path}`), whose
    /// whole graphs are timed beside the target (`draft_model.rs`).
    pub draft_model: Option<crate::draft_model::DraftModel>,
    /// A block drafter (`speculation: {kind: dflash | dspark, draft_config}`), timed beside the
    /// target (`block_draft.rs`).
    pub block_draft: Option<crate::block_draft::BlockDraft>,
    pub gemm_quant_mode: Option<Dtype>,
    pub moe_quant_mode: Option<Dtype>,
    pub fmha_quant_mode: Option<Dtype>,
    pub kvcache_quant_mode: Option<Dtype>,
    pub systems_paths: Vec<String>,
    pub attention_backend: Option<String>,
    pub enable_shared_layer: bool,
    /// Measured tables (SILICON) or speed-of-light rooflines (SOL).
    pub database_mode: DatabaseMode,
    /// Refuse data whose version directories' `collection_meta.yaml` do not cover their tables
    /// (`systems::check_provenance`); the timing is the same either way.
    pub strict_provenance: bool,
    /// How a pass that both prefills and decodes is timed (servesim's own key).
    pub pass_model: PassModel,
    /// Corrections fitted to measurements by `servesim calibrate` (servesim's own key).
    pub calibration: PassCalibration,
    /// What the engine's decode context counts (servesim's own key `decode_context`).
    pub decode_context: DecodeContext,
    /// The large-EP all-to-all backends (`moe_comm_backend`, the reference's per-phase
    /// `ModelConfig.moe_comm_backend`), with `enable_eplb` / `wideep_num_slots`.
    pub moe_comm: crate::moe_a2a::MoeComm,
    /// The vision tower this worker hosts (native VL replay): the reference's `encoder_parallel`
    /// and servesim's own `vision_image`, the one image shape of the workload.
    pub vision: Option<HostedVision>,
    /// The configuration as given, for the canonical dump.
    pub raw: Value,
}

/// The vision tower a language worker hosts and the image shape it encodes.
#[derive(Clone, Debug, PartialEq)]
pub struct HostedVision {
    pub layout: crate::vision::EncoderLayout,
    pub height: u32,
    pub width: u32,
    pub min_pixels: Option<u64>,
    pub max_pixels: Option<u64>,
}

/// What the context length an engine hands the timer for a decode step counts, which decides
/// how many tokens of KV the step reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DecodeContext {
    /// Past KV only, the step adds the token it feeds: Dynamo's provider asks
    /// `predict_decode(batch, isl = mean context, osl = 2)`, whose one step reads `mean + 1`
    /// tokens per request (the forward-pass metric `sum_decode_kv_tokens = batch × (isl + 1)`).
    #[default]
    Past,
    /// The sequence length with the token being fed: aisimulate 0.13's engine-stack provider
    /// takes one off its schedulers' mean sequence length before asking for `osl = 2`, so the
    /// step reads `mean` tokens per request (`predict -c`).
    Sequence,
}

/// How a forward pass that computes prompt tokens beside a decode batch is timed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PassModel {
    /// A prefill step plus a decode step, as aisimulate and Dynamo's mocker time it.
    #[default]
    Additive,
    /// One forward over all of the pass's tokens, as vLLM runs a chunked-prefill batch on a GPU
    /// (`Estimator::fused_ms`).
    Fused,
}

/// Corrections to the estimator's pass times, fitted to a deployment's measurements by
/// `servesim calibrate`: a pass that prefills and decodes takes
/// `pass_overhead_ms + prefill_scale × (what its prompt tokens add) + decode_scale × (its decode
/// batch alone)`. With additive timing a mixed pass is two timed steps, each with the overhead.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PassCalibration {
    pub prefill_scale: f64,
    pub decode_scale: f64,
    pub pass_overhead_ms: f64,
}

impl Default for PassCalibration {
    fn default() -> Self {
        PassCalibration { prefill_scale: 1.0, decode_scale: 1.0, pass_overhead_ms: 0.0 }
    }
}

impl PassCalibration {
    /// The keys of the `calibration` object, and the range each must lie in.
    pub const KEYS: [(&'static str, f64, f64); 3] =
        [("prefill_scale", 0.05, 20.0), ("decode_scale", 0.05, 20.0), ("pass_overhead_ms", 0.0, 1000.0)];

    pub fn is_identity(&self) -> bool {
        *self == PassCalibration::default()
    }

    fn from_json(path: &str, v: &Value) -> Result<PassCalibration> {
        let obj = v.as_object().ok_or_else(|| cfg_err(path, "calibration", format!("must be an object, got {v}")))?;
        let mut c = PassCalibration::default();
        for (k, x) in obj {
            let Some(&(_, lo, hi)) = Self::KEYS.iter().find(|(name, _, _)| name == k) else {
                let names: Vec<&str> = Self::KEYS.iter().map(|k| k.0).collect();
                return Err(cfg_err(
                    path,
                    &format!("calibration.{k}"),
                    format!("unknown key; expected one of {}", names.join(", ")),
                ));
            };
            let value = x.as_f64().filter(|f| f.is_finite() && (lo..=hi).contains(f)).ok_or_else(|| {
                cfg_err(path, &format!("calibration.{k}"), format!("must be a number in [{lo}, {hi}], got {x}"))
            })?;
            match k.as_str() {
                "prefill_scale" => c.prefill_scale = value,
                "decode_scale" => c.decode_scale = value,
                _ => c.pass_overhead_ms = value,
            }
        }
        Ok(c)
    }

    /// A pass of `base_ms` of which `decode_ms` is its decode batch's own time.
    fn apply(&self, base_ms: f64, decode_ms: f64) -> f64 {
        self.pass_overhead_ms + self.prefill_scale * (base_ms - decode_ms) + self.decode_scale * decode_ms
    }
}

/// Keys the reference accepts that only select options servesim models the same way whatever
/// their value (or that only the listed values are accepted for).
const KEYS: &[&str] = &[
    "model",
    "system",
    "backend",
    "worker_type",
    "backend_version",
    "fpm_profile",
    "fpm_parquet_path",
    "tp",
    "pp",
    "attention_dp",
    "dcp",
    "moe_tp_size",
    "moe_ep_size",
    "cp_size",
    "gemm_quant_mode",
    "moe_quant_mode",
    "fmha_quant_mode",
    "fpm_fmha_quant_mode",
    "kvcache_quant_mode",
    "comm_quant_mode",
    "nextn",
    "speculation",
    "kv_block_size",
    "decoder_replay",
    "estimation_mode",
    "database_mode",
    "transfer_policy",
    "systems_paths",
    "fallback_policy",
    "estimator_config",
    "attention_backend",
    "moe_kernel_source",
    "enable_shared_layer",
    "strict_provenance",
    "moe_backend",
    "enable_eplb",
    "wideep_num_slots",
    "encoder_parallel",
    // The reference's `ModelConfig.moe_comm_backend` (its enumerator sets it; the forward-pass
    // config has no such key): selects the large-EP MoE graph per phase.
    "moe_comm_backend",
    // servesim's own: `additive` (the reference's) or `fused`, fitted corrections, and what the
    // engine's decode context counts (`past`, Dynamo's provider, or `sequence`, aisimulate's).
    "pass_model",
    "calibration",
    "decode_context",
    // servesim's own, beside `encoder_parallel`: `{height, width, min_pixels?, max_pixels?}`,
    // the shape of the images the hosted tower encodes.
    "vision_image",
];

/// `encoder_parallel` (tp or dp) and `vision_image`: both or neither.
fn read_vision(path: &str, layout: Option<&Value>, image: Option<&Value>) -> Result<Option<HostedVision>> {
    let layout = match layout {
        None | Some(Value::Null) => None,
        Some(v) => Some(v.as_str().and_then(crate::vision::EncoderLayout::parse).ok_or_else(|| {
            cfg_err(path, "encoder_parallel", format!("must be \"tp\" or \"dp\" (or null), got {v}"))
        })?),
    };
    let image = image.filter(|v| !v.is_null());
    let (layout, image) = match (layout, image) {
        (None, None) => return Ok(None),
        (Some(l), Some(i)) => (l, i),
        (Some(_), None) => {
            return Err(cfg_err(
                path,
                "vision_image",
                "is required beside encoder_parallel: the {height, width} of the images the hosted tower encodes",
            ))
        }
        (None, Some(_)) => {
            return Err(cfg_err(path, "encoder_parallel", "is required beside vision_image (tp or dp)"));
        }
    };
    let at = |k: &str| format!("vision_image.{k}");
    let obj = image.as_object().ok_or_else(|| cfg_err(path, "vision_image", "must be an object"))?;
    for k in obj.keys() {
        if !["height", "width", "min_pixels", "max_pixels"].contains(&k.as_str()) {
            return Err(cfg_err(path, &at(k), "unknown key; expected height, width, min_pixels or max_pixels"));
        }
    }
    let positive = |k: &str| -> Result<Option<u64>> {
        match obj.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n >= 1 && n <= u64::from(u32::MAX) => Ok(Some(n)),
                _ => Err(cfg_err(path, &at(k), format!("must be a positive integer, got {v}"))),
            },
        }
    };
    let side = |k: &str| -> Result<u32> {
        positive(k)?.map(|n| n as u32).ok_or_else(|| cfg_err(path, &at(k), "missing (required)"))
    };
    Ok(Some(HostedVision {
        layout,
        height: side("height")?,
        width: side("width")?,
        min_pixels: positive("min_pixels")?,
        max_pixels: positive("max_pixels")?,
    }))
}

fn cfg_err(path: &str, key: &str, msg: impl std::fmt::Display) -> PerfError {
    PerfError::config(format!("{}: {msg}", if path.is_empty() { key.to_string() } else { format!("{path}.{key}") }))
}

impl AisConfig {
    /// Reads a configuration object; `path` is its key path, for errors.
    /// A valid ngram `speculation` is timed here (verification); whether an engine launch
    /// schedules its drafts is the engine's to decide.
    pub fn from_json(path: &str, v: &Value) -> Result<AisConfig> {
        let obj = v.as_object().ok_or_else(|| PerfError::config(format!("{path}: must be an object")))?;
        for k in obj.keys() {
            if !KEYS.contains(&k.as_str()) {
                return Err(cfg_err(path, k, format!("unknown key; expected one of {}", KEYS.join(", "))));
            }
        }
        let is_null = |k: &str| obj.get(k).is_none_or(Value::is_null);
        let string = |k: &str| -> Result<Option<String>> {
            match obj.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(other) => Err(cfg_err(path, k, format!("must be a string, got {other}"))),
            }
        };
        let required = |k: &str| -> Result<String> {
            string(k)?.filter(|s| !s.trim().is_empty()).ok_or_else(|| cfg_err(path, k, "missing (required)"))
        };
        let uint = |k: &str, default: Option<u32>| -> Result<Option<u32>> {
            match obj.get(k) {
                None | Some(Value::Null) => Ok(default),
                Some(x) => match x.as_u64() {
                    Some(n) if n >= 1 && n <= u32::MAX as u64 => Ok(Some(n as u32)),
                    _ => Err(cfg_err(path, k, format!("must be a positive integer, got {x}"))),
                },
            }
        };
        let boolean = |k: &str| -> Result<Option<bool>> {
            match obj.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Bool(b)) => Ok(Some(*b)),
                Some(x) => Err(cfg_err(path, k, format!("must be true or false, got {x}"))),
            }
        };
        let quant = |k: &str, allowed: &[&str]| -> Result<Option<Dtype>> {
            let Some(s) = string(k)? else { return Ok(None) };
            let s = s.trim().to_lowercase();
            if s.is_empty() || s == "auto" || s == "none" || s == "null" {
                return Ok(None);
            }
            if !allowed.contains(&s.as_str()) {
                return Err(cfg_err(path, k, format!("{s:?} is not modelled; supported: {}", allowed.join(", "))));
            }
            Ok(Dtype::parse(&s))
        };
        let backend = required("backend")?.to_lowercase();
        if !["vllm", "sglang", "trtllm"].contains(&backend.as_str()) {
            return Err(cfg_err(
                path,
                "backend",
                format!("unknown backend {backend:?}; expected vllm, sglang or trtllm"),
            ));
        }
        let worker_type = string("worker_type")?.unwrap_or_else(|| "aggregated".into());
        if !["aggregated", "prefill", "decode"].contains(&worker_type.as_str()) {
            return Err(cfg_err(
                path,
                "worker_type",
                format!("{worker_type:?}; expected aggregated, prefill or decode"),
            ));
        }
        let moe_comm = match obj.get("moe_comm_backend") {
            None | Some(Value::Null) => None,
            Some(m) => Some(parse_moe_comm(path, &backend, m)?),
        };
        // Options servesim does not model: only their neutral values are accepted.
        for (k, ok) in [
            ("moe_kernel_source", is_null("moe_kernel_source")),
            ("fpm_fmha_quant_mode", is_null("fpm_fmha_quant_mode")),
        ] {
            if !ok {
                let why = "is not supported by servesim's AIS model (only null)";
                return Err(cfg_err(
                    path,
                    k,
                    if matches!(k, "moe_kernel_source" | "wideep_num_slots") {
                        format!("{why}; {WIDE_EP}")
                    } else {
                        why.to_string()
                    },
                ));
            }
        }
        if boolean("decoder_replay")? == Some(true) {
            return Err(cfg_err(path, "decoder_replay", "is not supported (only false)"));
        }
        // Read on any MoE model; outside the large-EP graph they time nothing (`eplb.rs`).
        let eplb = boolean("enable_eplb")? == Some(true);
        // The FPM modes select an estimator (`fpm.rs`) before the op-level one is built.
        let estimation_mode = string("estimation_mode")?;
        if let Some(m) = &estimation_mode {
            if !crate::fpm::MODES.contains(&m.as_str()) {
                return Err(cfg_err(
                    path,
                    "estimation_mode",
                    format!("{m:?}: expected one of {:?}", crate::fpm::MODES),
                ));
            }
        }
        let database_mode = match string("database_mode")? {
            None => DatabaseMode::Silicon,
            Some(m) => DatabaseMode::parse(&m).map_err(|why| cfg_err(path, "database_mode", why))?,
        };
        if let Some(m) = string("fallback_policy")? {
            // Under an FPM mode, `allow` lets the selection fall back to op_level (`fpm.rs`).
            if m != "deny" && !(m == "allow" && crate::fpm::is_fpm_mode(estimation_mode.as_deref())) {
                return Err(cfg_err(
                    path,
                    "fallback_policy",
                    format!("{m:?}: only deny is modelled (a query no data anchors is an error)"),
                ));
            }
        }
        let moe_backend = match string("moe_backend")? {
            None => None,
            Some(m) => crate::eplb::MoeBackend::parse(&m, &backend).map_err(|why| cfg_err(path, "moe_backend", why))?,
        };
        if let Some(m) = string("comm_quant_mode")? {
            if !["half", "auto", "none"].contains(&m.as_str()) {
                return Err(cfg_err(path, "comm_quant_mode", format!("{m:?}: only half is modelled")));
            }
        }
        match obj.get("estimator_config") {
            None | Some(Value::Null) | Some(Value::Object(_)) => {}
            Some(x) => return Err(cfg_err(path, "estimator_config", format!("must be an object, got {x}"))),
        }
        match obj.get("transfer_policy") {
            None | Some(Value::Null) | Some(Value::String(_)) | Some(Value::Array(_)) => {}
            Some(x) => return Err(cfg_err(path, "transfer_policy", format!("must be a string or a list, got {x}"))),
        }
        let nextn = match obj.get("nextn") {
            None | Some(Value::Null) => 0,
            Some(x) => match x.as_u64() {
                Some(n) if n <= 5 => n as u32,
                _ => return Err(cfg_err(path, "nextn", format!("nextn must be in 0..=5, got {x}"))),
            },
        };
        // Dynamo's `ForwardPassSpeculationConfig` and its checks, in its order and words.
        let mut eagle3 = None;
        let mut draft_model = None;
        let mut block_draft = None;
        let ngram = match obj.get("speculation").filter(|v| !v.is_null()) {
            None => 0,
            // servesim's extension: an EAGLE-3 chain with its draft's config. (Dynamo 1.6.1 reads
            // ngram alone: without a draft_config an eagle3 kind gets its message below.)
            Some(spec) if is_eagle3(spec) => {
                let (tokens, geometry) = read_eagle3(path, spec)?;
                let refuse = |why: &str| cfg_err(path, "speculation", why);
                if nextn != 0 {
                    return Err(refuse("eagle3 speculation cannot be combined with nextn"));
                }
                if backend != "vllm" && backend != "sglang" {
                    return Err(refuse("eagle3 speculation requires backend=sglang or vllm"));
                }
                eagle3 = Some(geometry);
                tokens
            }
            // servesim's extension: a standalone draft checkpoint. (Dynamo 1.6.1 has no such kind:
            // without a draft_model_path it gets Dynamo's message below.)
            Some(spec) if is_draft_model(spec) => {
                let draft = read_draft_model(path, spec)?;
                let refuse = |why: &str| cfg_err(path, "speculation", why);
                if nextn != 0 {
                    return Err(refuse("draft_model speculation cannot be combined with nextn"));
                }
                if backend != "vllm" {
                    return Err(refuse(&format!("draft_model modeling supports backends ('vllm',), got {backend:?}")));
                }
                let tokens = draft.tokens;
                draft_model = Some(draft);
                tokens
            }
            // servesim's extension: a DFlash / DSpark block drafter with its draft's config.
            Some(spec) if is_block_draft(spec) => {
                let draft = read_block_draft(path, spec)?;
                if nextn != 0 {
                    let why = format!("{} speculation cannot be combined with nextn", draft.scheme.kind());
                    return Err(cfg_err(path, "speculation", why));
                }
                let tokens = draft.tokens;
                block_draft = Some(draft);
                tokens
            }
            Some(spec) => {
                let tokens = servesim_engine::speculative::ais_speculation_tokens(spec)
                    .map_err(|e| cfg_err(path, "speculation", format!("invalid AIS performance config: {e}")))?;
                let invalid = |why: &str| {
                    cfg_err(
                        path,
                        "speculation",
                        format!("invalid engine config: invalid forward pass perf model config: {why}"),
                    )
                };
                if nextn != 0 {
                    return Err(invalid("ngram speculation cannot be combined with nextn"));
                }
                if backend != "vllm" {
                    return Err(invalid("ngram speculation requires backend=vllm"));
                }
                if !(1..=5).contains(&tokens) {
                    return Err(invalid("ngram num_speculative_tokens must be in 1..=5"));
                }
                tokens
            }
        };
        if let Some(x) = obj.get("kv_block_size") {
            if !x.is_null() && x.as_u64().is_none_or(|n| n == 0) {
                return Err(cfg_err(path, "kv_block_size", format!("must be a positive integer, got {x}")));
            }
        }
        let systems_paths = match obj.get("systems_paths") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| {
                    x.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| cfg_err(path, "systems_paths", "must list directory paths"))
                })
                .collect::<Result<_>>()?,
            Some(x) => return Err(cfg_err(path, "systems_paths", format!("must be a list of paths, got {x}"))),
        };
        let pass_model = match string("pass_model")?.as_deref() {
            None | Some("additive") => PassModel::Additive,
            Some("fused") => PassModel::Fused,
            Some(other) => {
                return Err(cfg_err(path, "pass_model", format!("{other:?}; expected \"additive\" or \"fused\"")))
            }
        };
        let decode_context = match string("decode_context")?.as_deref() {
            None | Some("past") => DecodeContext::Past,
            Some("sequence") => DecodeContext::Sequence,
            Some(other) => {
                return Err(cfg_err(path, "decode_context", format!("{other:?}; expected \"past\" or \"sequence\"")))
            }
        };
        if pass_model == PassModel::Fused && (nextn > 0 || ngram > 0) {
            return Err(cfg_err(
                path,
                "pass_model",
                "fused mixed passes are not modelled with speculative decoding (nextn or ngram speculation)",
            ));
        }
        let vision = read_vision(path, obj.get("encoder_parallel"), obj.get("vision_image"))?;
        Ok(AisConfig {
            model: required("model")?,
            system: required("system")?,
            backend,
            worker_type,
            backend_version: string("backend_version")?,
            tp: uint("tp", Some(1))?.unwrap_or(1),
            pp: uint("pp", Some(1))?.unwrap_or(1),
            cp_size: uint("cp_size", Some(1))?.unwrap_or(1),
            dcp: uint("dcp", Some(1))?.unwrap_or(1),
            attention_dp: uint("attention_dp", Some(1))?.unwrap_or(1),
            moe_tp_size: uint("moe_tp_size", None)?,
            moe_ep_size: uint("moe_ep_size", None)?,
            nextn,
            ngram,
            eagle3,
            draft_model,
            block_draft,
            gemm_quant_mode: quant("gemm_quant_mode", &["bfloat16", "fp8", "fp8_static", "fp8_block", "nvfp4"])?,
            moe_quant_mode: quant(
                "moe_quant_mode",
                &["bfloat16", "fp8", "fp8_block", "w4a16_mxfp4", "int4_wo", "nvfp4"],
            )?,
            fmha_quant_mode: quant("fmha_quant_mode", &["bfloat16", "fp8"])?,
            kvcache_quant_mode: quant("kvcache_quant_mode", &["bfloat16", "fp8"])?,
            systems_paths,
            attention_backend: string("attention_backend")?,
            // Sibling versions' rows load by default only where the tables are read as measurements.
            enable_shared_layer: boolean("enable_shared_layer")?.unwrap_or(database_mode.shared_layer_default()),
            database_mode,
            strict_provenance: boolean("strict_provenance")?.unwrap_or(false),
            pass_model,
            calibration: match obj.get("calibration") {
                None | Some(Value::Null) => PassCalibration::default(),
                Some(c) => PassCalibration::from_json(path, c)?,
            },
            decode_context,
            moe_comm: crate::moe_a2a::MoeComm {
                eplb,
                num_slots: uint("wideep_num_slots", None)?,
                backend: moe_backend,
                ..moe_comm.unwrap_or_default()
            },
            vision,
            raw: v.clone(),
        })
    }

    fn cache_key(&self) -> String {
        format!(
            "{}|{}|{}|{:?}|{}|{}|{}|{}|{}|{:?}|{:?}|{}|{}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{}|{}|{:?}",
            self.model,
            self.system,
            self.backend,
            self.backend_version,
            self.tp,
            self.pp,
            self.cp_size,
            self.attention_dp,
            self.dcp,
            self.moe_tp_size,
            self.moe_ep_size,
            self.nextn,
            self.ngram,
            self.gemm_quant_mode,
            self.moe_quant_mode,
            self.fmha_quant_mode,
            self.kvcache_quant_mode,
            self.systems_paths,
            self.attention_backend,
            // A strict estimator is built (and its data checked) on its own.
            self.strict_provenance,
            self.enable_shared_layer,
            self.database_mode
        ) + &format!("|{:?}|{:?}|{:?}|{:?}", self.moe_comm, self.eagle3, self.draft_model, self.block_draft)
    }
}

/// Whether a timing config's `speculation` is servesim's EAGLE-3 extension.
pub fn is_eagle3(spec: &Value) -> bool {
    spec.get("kind").and_then(Value::as_str) == Some("eagle3") && spec.get("draft_config").is_some()
}

/// Reads an `eagle3` speculation: `{kind: eagle3, params: {num_speculative_tokens: 1..=5},
/// draft_config: {the draft checkpoint's config.json}}`. A chain only, as the reference's
/// replay takes it; the number of drafts and the draft's geometry.
fn read_eagle3(path: &str, spec: &Value) -> Result<(u32, crate::eagle3::DraftGeometry)> {
    let at = |k: &str| format!("speculation.{k}");
    let obj = spec.as_object().expect("a kind was read from it");
    if let Some(k) = obj.keys().find(|k| !["kind", "params", "draft_config"].contains(&k.as_str())) {
        return Err(cfg_err(path, &at(k), "unknown key; an eagle3 speculation takes kind, params and draft_config"));
    }
    let params = match obj.get("params") {
        None | Some(Value::Null) => serde_json::Map::new(),
        Some(Value::Object(p)) => p.clone(),
        Some(other) => return Err(cfg_err(path, &at("params"), format!("must be a map, got {other}"))),
    };
    if params.contains_key("tree_shape") || params.contains_key("verify_token_budget") {
        return Err(cfg_err(
            path,
            &at("params"),
            "speculative replay requires an EAGLE chain with one verification token per draft",
        ));
    }
    if let Some(k) = params.keys().find(|k| *k != "num_speculative_tokens") {
        return Err(cfg_err(path, &at(&format!("params.{k}")), "unknown key; expected num_speculative_tokens"));
    }
    let tokens = match params.get("num_speculative_tokens") {
        // The reference's EAGLE-3 default chain.
        None => 3,
        Some(v) => match v.as_u64() {
            Some(n @ 1..=5) => n as u32,
            _ => {
                return Err(cfg_err(
                    path,
                    &at("params.num_speculative_tokens"),
                    format!("speculative replay requires 1..5 draft tokens, got {v}"),
                ))
            }
        },
    };
    let draft = obj.get("draft_config").filter(|v| !v.is_null()).ok_or_else(|| {
        cfg_err(
            path,
            &at("draft_config"),
            "EAGLE-3 requires the draft checkpoint's config.json (draft_config): it carries the draft layer \
             geometry and draft_vocab_size",
        )
    })?;
    if !draft.is_object() {
        return Err(cfg_err(path, &at("draft_config"), format!("must be a map, got {draft}")));
    }
    let geometry =
        crate::eagle3::DraftGeometry::from_hf(draft).map_err(|why| cfg_err(path, &at("draft_config"), why))?;
    Ok((tokens, geometry))
}

/// Whether a timing config's `speculation` is servesim's block-drafting (DFlash, DSpark)
/// extension.
pub fn is_block_draft(spec: &Value) -> bool {
    matches!(spec.get("kind").and_then(Value::as_str), Some("dflash" | "dspark"))
}

/// Reads a `dflash` / `dspark` speculation: `{kind, params, draft_config}` (`block_draft.rs`).
fn read_block_draft(path: &str, spec: &Value) -> Result<crate::block_draft::BlockDraft> {
    let at = |k: &str| format!("speculation.{k}");
    let obj = spec.as_object().expect("a kind was read from it");
    if let Some(k) = obj.keys().find(|k| !["kind", "params", "draft_config"].contains(&k.as_str())) {
        return Err(cfg_err(
            path,
            &at(k),
            "unknown key; a block-drafting speculation takes kind, params and draft_config",
        ));
    }
    let params = match obj.get("params") {
        None | Some(Value::Null) => serde_json::Map::new(),
        Some(Value::Object(p)) => p.clone(),
        Some(other) => return Err(cfg_err(path, &at("params"), format!("must be a map, got {other}"))),
    };
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or_default();
    crate::block_draft::BlockDraft::read(kind, &params, obj.get("draft_config").filter(|v| !v.is_null()))
        .map_err(|why| cfg_err(path, "speculation", why))
}

/// Whether a timing config's `speculation` is servesim's standalone-draft extension.
pub fn is_draft_model(spec: &Value) -> bool {
    spec.get("kind").and_then(Value::as_str) == Some("draft_model") && spec.get("draft_model_path").is_some()
}

/// Reads a `draft_model` speculation: `{kind: draft_model, draft_model_path: <checkpoint id>,
/// params: {num_speculative_tokens: 1..=5, draft_tp_size}}`, a chain as the reference's replay
/// takes it.
fn read_draft_model(path: &str, spec: &Value) -> Result<crate::draft_model::DraftModel> {
    let at = |k: &str| format!("speculation.{k}");
    let obj = spec.as_object().expect("a kind was read from it");
    if let Some(k) = obj.keys().find(|k| !["kind", "params", "draft_model_path"].contains(&k.as_str())) {
        return Err(cfg_err(
            path,
            &at(k),
            "unknown key; a draft_model speculation takes kind, params and draft_model_path",
        ));
    }
    let draft = match obj.get("draft_model_path") {
        Some(Value::String(p)) if !p.trim().is_empty() => p.clone(),
        None | Some(Value::Null) => {
            return Err(cfg_err(
                path,
                &at("draft_model_path"),
                "draft_model requires draft_model_path (the standalone draft checkpoint)",
            ))
        }
        Some(other) => {
            return Err(cfg_err(path, &at("draft_model_path"), format!("must be a nonempty string, got {other}")))
        }
    };
    let params = match obj.get("params") {
        None | Some(Value::Null) => serde_json::Map::new(),
        Some(Value::Object(p)) => p.clone(),
        Some(other) => return Err(cfg_err(path, &at("params"), format!("must be a map, got {other}"))),
    };
    if let Some(k) = params.keys().find(|k| !["num_speculative_tokens", "draft_tp_size"].contains(&k.as_str())) {
        return Err(cfg_err(
            path,
            &at(&format!("params.{k}")),
            "unknown key; expected num_speculative_tokens or draft_tp_size",
        ));
    }
    let tokens = match params.get("num_speculative_tokens") {
        None | Some(Value::Null) => {
            return Err(cfg_err(
                path,
                &at("params.num_speculative_tokens"),
                "draft_model requires params['num_speculative_tokens'] (the deployment K; there is no checkpoint \
                 default)",
            ))
        }
        Some(v) => match v.as_u64() {
            Some(n @ 1..=5) => n as u32,
            _ => {
                return Err(cfg_err(
                    path,
                    &at("params.num_speculative_tokens"),
                    format!("speculative replay requires 1..5 draft tokens, got {v}"),
                ))
            }
        },
    };
    let tp = match params.get("draft_tp_size") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(n @ 1..=64) => Some(n as u32),
            _ => {
                return Err(cfg_err(
                    path,
                    &at("params.draft_tp_size"),
                    format!("draft_tp_size must be a positive integer (at most 64), got {v}"),
                ))
            }
        },
    };
    Ok(crate::draft_model::DraftModel { path: draft, tokens, tp })
}

/// Kernel-lane walk for attention: the framework's default lane for this GPU generation
/// (`attention_lane_defaults.yaml`), then the table's lanes densest first, then `default`.
pub(crate) fn lane_order(db: &Database, arch: &str, generation: bool, pin: Option<&str>) -> Result<Vec<String>> {
    let mut lanes: Vec<(String, usize, usize)> = db.attention_lanes(generation)?;
    let mut out: Vec<String> = Vec::new();
    match pin {
        Some(p) if p != "default" => {
            // The user's choice: its stored lanes first, and an error if the tables hold none.
            let wanted = override_lanes(&db.backend, p)?;
            if !wanted.iter().any(|w| lanes.iter().any(|(l, _, _)| l == w)) {
                let mut available: Vec<&str> = lanes.iter().map(|(l, _, _)| l.as_str()).collect();
                available.sort_unstable();
                return Err(PerfError::unsupported(format!(
                    "attention_backend={p:?} has no {} attention measurements for system {:?}, backend {:?}, \
                     version {:?}; expected at least one stored lane of {wanted:?}, available lanes: {available:?}",
                    if generation { "generation" } else { "context" },
                    db.spec.name,
                    db.backend,
                    db.version,
                )));
            }
            out.extend(wanted.iter().map(|w| w.to_string()));
        }
        Some(_) => {}
        None => out.extend(
            framework_default_lane(&db.spec.root, &db.backend, &db.version, db.spec.sm_version, arch)
                .filter(|p| p != "default"),
        ),
    }
    lanes.sort_by(|a, b| b.1.cmp(&a.1).then(b.2.cmp(&a.2)));
    for (l, _, _) in lanes {
        if !out.contains(&l) {
            out.push(l);
        }
    }
    if !out.iter().any(|l| l == "default") {
        out.push("default".into());
    }
    Ok(out)
}

/// The stored lanes (kernel sources) a user's `attention_backend` names on `backend`, most
/// specific first: SGLang stores its lanes under the user-facing names, vLLM under its own
/// labels (flashinfer's differ across versions), TRT-LLM under none of them.
fn override_lanes(backend: &str, choice: &str) -> Result<&'static [&'static str]> {
    let table: &[(&str, &[&str])] = match backend {
        "sglang" => &[
            ("fa3", &["fa3"]),
            ("triton", &["triton"]),
            ("trtllm_mha", &["trtllm_mha"]),
            ("flashinfer", &["flashinfer"]),
            ("fla", &["fla"]),
        ],
        "vllm" => &[
            ("triton", &["vllm_triton_attn"]),
            ("flashinfer", &["vllm_flashinfer_trtllmprefill", "vllm_flashinfer_trtllmdecode", "vllm_flashinfer"]),
        ],
        _ => &[],
    };
    match table.iter().find(|(name, _)| *name == choice) {
        Some((_, lanes)) => Ok(lanes),
        None => {
            let mut supported: Vec<&str> = table.iter().map(|(name, _)| *name).collect();
            supported.sort_unstable();
            supported.push("default");
            Err(PerfError::unsupported(format!(
                "attention_backend={choice:?} is not supported on backend {backend:?}; supported values: {supported:?}"
            )))
        }
    }
}

fn framework_default_lane(
    root: &std::path::Path,
    backend: &str,
    version: &str,
    sm: Option<u32>,
    arch: &str,
) -> Option<String> {
    let text = std::fs::read_to_string(root.join("attention_lane_defaults.yaml")).ok()?;
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).ok()?;
    let sm = sm?;
    let pick = |table: &serde_yaml_ng::Value| -> Option<String> {
        let versions = table.get(backend)?.as_mapping()?;
        // The newest listed version not above the requested one.
        let mut best: Option<(Vec<i64>, &serde_yaml_ng::Value)> = None;
        for (k, v) in versions {
            let k = match k {
                serde_yaml_ng::Value::String(s) => s.clone(),
                serde_yaml_ng::Value::Number(n) => n.to_string(),
                _ => continue,
            };
            let key = crate::systems::version_key(&k);
            if key <= crate::systems::version_key(version) && best.as_ref().is_none_or(|(b, _)| key > *b) {
                best = Some((key, v));
            }
        }
        let (_, per_sm) = best?;
        per_sm
            .as_mapping()?
            .iter()
            .find(|(k, _)| k.as_u64() == Some(sm as u64))
            .and_then(|(_, v)| v.as_str().map(str::to_string))
    };
    doc.get("architectures").and_then(|a| a.get(arch)).and_then(&pick).or_else(|| pick(&doc))
}

/// Loaded databases by (systems root, system, backend, version).
type Databases = Mutex<HashMap<(PathBuf, String, String, String, bool, DatabaseMode), Arc<Database>>>;

/// Loaded databases, shared by every estimator on the same data.
fn databases() -> &'static Databases {
    static DBS: OnceLock<Databases> = OnceLock::new();
    DBS.get_or_init(Default::default)
}

fn estimators() -> &'static Mutex<HashMap<String, Arc<Estimator>>> {
    static EST: OnceLock<Mutex<HashMap<String, Arc<Estimator>>>> = OnceLock::new();
    EST.get_or_init(Default::default)
}

/// Builds (or reuses) the estimator for a configuration.
pub fn estimator(cfg: &AisConfig) -> Result<Arc<Estimator>> {
    crate::fpm::select(cfg)?;
    let key = cfg.cache_key();
    if let Some(e) = estimators().lock().expect("estimators").get(&key) {
        return Ok(Arc::clone(e));
    }
    let roots = systems_roots(&cfg.systems_paths)?;
    let spec = find_system(&roots, &cfg.system)?;
    let version = resolve_version(&spec, &cfg.backend, cfg.backend_version.as_deref())?;
    let root_paths: Vec<PathBuf> = roots.iter().map(|(p, _)| p.clone()).collect();
    let mut model_roots = vec![spec.root.clone()];
    model_roots.extend(root_paths.iter().filter(|p| **p != spec.root).cloned());
    // A profile root (`systems/profiles/...`) has no model_configs beside it: the installed
    // package's configs still name its models, as the reference finds them.
    for (p, _) in systems_roots(&[]).unwrap_or_default() {
        if !model_roots.contains(&p) {
            model_roots.push(p);
        }
    }
    let model = ModelSpec::load(&cfg.model, &model_roots)?;
    if cfg.strict_provenance {
        // The tables `Database::open` reads, and the MLA ones an MLA model reads.
        let mut tables = Database::TABLES.to_vec();
        if model.family == Family::Mla {
            tables.extend(crate::mla::Layout::ALL.map(crate::mla::Layout::file));
        }
        if model.family == Family::Dsa {
            tables.extend(crate::dsa::FILES);
        }
        if model.family == Family::Msa {
            tables.extend(crate::msa::FILES);
        }
        if model.family == Family::Dsv4 {
            tables.extend(crate::dsv4::MODULE_FILES);
            tables.push(crate::dsv4::MHC_FILE);
        }
        crate::systems::check_provenance(&spec, &cfg.backend, &version, &tables)?;
    }
    let db_key = (
        spec.root.clone(),
        cfg.system.clone(),
        cfg.backend.clone(),
        version.clone(),
        cfg.enable_shared_layer,
        cfg.database_mode,
    );
    let db = {
        let mut dbs = databases().lock().expect("databases");
        match dbs.get(&db_key) {
            Some(db) => Arc::clone(db),
            None => {
                let db = Database::open(spec.clone(), &cfg.backend, &version, cfg.enable_shared_layer)?;
                let db = Arc::new(db.with_mode(cfg.database_mode));
                dbs.insert(db_key, Arc::clone(&db));
                db
            }
        }
    };
    if cfg.tp > 1 && model.heads % cfg.tp != 0 {
        return Err(PerfError::unsupported(format!(
            "{}: {} attention heads do not split over tp={}",
            cfg.model, model.heads, cfg.tp
        )));
    }
    if cfg.cp_size > 1 {
        // A model class the reference gives no prefill CP is refused in its words first.
        if let Some(e) = crate::dcp::prefill_cp_refusal(&model.architecture, &cfg.backend, cfg.cp_size) {
            return Err(e);
        }
        // The reference prices prefill CP only on SGLang (vLLM's context parallelism is the
        // decode-side DCP), as a pure-CP attention group.
        if cfg.backend != "sglang" {
            return Err(PerfError::unsupported(format!(
                "context parallelism (cp_size={}) is not supported on backend={:?}; the reference models prefill \
                 context parallelism on sglang only",
                cfg.cp_size, cfg.backend
            )));
        }
        if cfg.tp != 1 || cfg.attention_dp != 1 {
            return Err(PerfError::config(format!(
                "sglang CP requires tp_size=1 and attention_dp_size=1 when cp_size>1 (CP and attention TP/DP are \
                 mutually exclusive on sglang). Got tp_size={}, attention_dp_size={}, cp_size={}.",
                cfg.tp, cfg.attention_dp, cfg.cp_size
            )));
        }
        // Dense models, Gemma 4, the plain MoE family (Qwen3-MoE, Qwen2-MoE, Mixtral, gpt-oss,
        // MiniMax-M2: the reference's `MOEModel`), the hybrid local/global MoE family (Llama-4,
        // MiMo-V2-Flash), the MLA family (DeepSeek-V3 / R1 / V3.1, Kimi-K2.5: the reference's
        // `DeepSeekModel`), DSA (DeepSeek-V3.2, GLM-5.x: its sparse-CP composition is timed in the
        // attention block, `dsa.rs`) and DeepSeek-V4 (`dsv4.rs`); the other families' CP graphs
        // are their own (not modelled).
        let plain_moe = model.family == Family::Moe
            && model.qwen35.is_none()
            && model.kimi_k3.is_none()
            && model.nemotron_h.is_none();
        let modelled =
            matches!(model.family, Family::Dense | Family::Gemma4 | Family::Mla | Family::Dsa | Family::Dsv4);
        if !modelled && !plain_moe {
            return Err(PerfError::unsupported(format!(
                "{}: context parallelism (cp_size={}) is modelled for dense models, Gemma 4, the \
                 plain and hybrid MoE families, the MLA family (DeepSeek-V3 / R1 / V3.1, Kimi-K2.5), DSA (GLM-5.x) and DeepSeek-V4 only",
                cfg.model, cfg.cp_size
            )));
        }
    }
    // The reference defaults both MoE widths to 1 and requires them to cover tp × attention_dp.
    let (moe_tp, moe_ep) = match model.family {
        Family::Dense => (1, 1),
        // (A dense Gemma 4 too: the reference checks its widths as a MoE model's.)
        _ => (cfg.moe_tp_size.unwrap_or(1), cfg.moe_ep_size.unwrap_or(1)),
    };
    if model.family != Family::Dense {
        // Prefill context parallelism is an attention width of its own beside tp × attention_dp.
        let width = cfg.tp as u64 * cfg.attention_dp as u64 * cfg.cp_size.max(1) as u64;
        if moe_tp as u64 * moe_ep as u64 != width {
            return Err(PerfError::config(format!(
                "{}: moe_tp_size × moe_ep_size ({moe_tp} × {moe_ep}{}) must equal tp × attention_dp{} ({} × {}{}); set moe_tp_size and moe_ep_size",
                cfg.model,
                if cfg.moe_tp_size.is_none() || cfg.moe_ep_size.is_none() { ", unset values default to 1" } else { "" },
                if cfg.cp_size > 1 { " × cp_size" } else { "" },
                cfg.tp,
                cfg.attention_dp,
                if cfg.cp_size > 1 { format!(" × {}", cfg.cp_size) } else { String::new() }
            )));
        }
        if model.routed() && model.experts < moe_ep {
            return Err(PerfError::config(format!(
                "{}: moe_ep_size {moe_ep} exceeds the model's {} experts",
                cfg.model, model.experts
            )));
        }
    }
    let moe_comm = large_ep_comm(cfg, &model, moe_tp, moe_ep, spec.gpus_per_node)?;
    crate::eplb::check_moe_controls(&cfg.model, &model, &moe_comm)?;
    if model.family == Family::Dsv4 && moe_comm.backend == Some(crate::eplb::MoeBackend::MegaMoe) {
        crate::dsv4_sglang::check_megamoe(&cfg.model, &spec, &version, moe_tp, moe_ep)?;
    }
    if model.dsv41.is_some() {
        crate::dsv41::check_moe_backend(&cfg.model, moe_comm.backend)?;
    }
    if model.family == Family::Gemma4 && !model.routed() && cfg.moe_ep_size.unwrap_or(1) != 1 {
        return Err(PerfError::config(format!(
            "{}: a dense Gemma 4 takes moe_ep_size=1, got {}",
            cfg.model,
            cfg.moe_ep_size.unwrap_or(1)
        )));
    }
    let gemm = cfg.gemm_quant_mode.unwrap_or(model.quant.gemm);
    // SGLang's wide-EP MLA rows are labelled fp8_block attention over an fp8 KV cache: the
    // reference's resolver sets both for a DeepSeek-V3-architecture model whose tuple takes
    // DeepEP (an explicit value stays).
    let wide_mla = moe_comm.is_large_ep() && cfg.backend == "sglang" && model.family == Family::Mla;
    let kv = cfg.kvcache_quant_mode.unwrap_or(if wide_mla { Dtype::Fp8 } else { model.quant.kv });
    let moe = cfg.moe_quant_mode.unwrap_or(model.quant.moe);
    // Kimi-K3's MXFP4 experts on SGLang / Blackwell run with MXFP8 activations (`kimi_k3.rs`).
    let moe = match (&model.kimi_k3, cfg.moe_quant_mode) {
        (Some(_), None) => crate::kimi_k3::moe_format(&cfg.model, &cfg.backend, spec.sm_version, moe),
        _ => moe,
    };
    // DeepSeek-V4's fp4 experts on SGLang run on a kernel of the GPU generation (`dsv4_sglang.rs`).
    let moe = match cfg.moe_quant_mode {
        None if model.family == Family::Dsv4 || model.dsv41.is_some() => {
            crate::dsv4_sglang::moe_format(&cfg.backend, spec.sm_version, moe)
        }
        _ => moe,
    };
    // Gemma 4: the attention projections, dense MLP and experts each follow the checkpoint's
    // bf16 exclusions (`gemm` then times the projections, `shared_gemm` the MLP).
    let gemma4 = model.gemma4.as_ref().map(|g| crate::gemma4::formats(g, gemm, moe, cfg.gemm_quant_mode.is_some()));
    let (gemm, moe) = gemma4.map_or((gemm, moe), |(proj, _, experts)| (proj, experts));
    // Qwen3.5: the projections and the FFN side (dense MLP or shared expert) each follow the
    // checkpoint's bf16 exclusions (`gemm` then times the projections, `shared_gemm` the FFN).
    let qwen35 =
        model.qwen35.as_ref().map(|q| crate::gdn::formats(q, model.routed(), gemm, cfg.gemm_quant_mode.is_some()));
    let gemm = qwen35.map_or(gemm, |(proj, _)| proj);
    if model.routed() && moe == Dtype::Fp8Block && (model.moe_inter / moe_tp) % model.quant.block != 0 {
        return Err(PerfError::config(format!(
            "{}: fp8_block experts need (moe_intermediate_size {} / moe_tp_size {moe_tp}) to be a multiple of the weight block {}",
            cfg.model, model.moe_inter, model.quant.block
        )));
    }
    let layout = Layout {
        tp: cfg.tp,
        pp: cfg.pp,
        cp: cfg.cp_size,
        dcp: cfg.dcp,
        attention_dp: cfg.attention_dp,
        moe_tp,
        moe_ep,
        nextn: cfg.nextn,
        ngram: cfg.ngram,
        gemm,
        // Shared experts the checkpoint leaves unquantised run in bf16 unless the GEMM format
        // was given explicitly.
        shared_gemm: if let Some((_, mlp, _)) = gemma4 {
            mlp
        } else if let Some((_, ffn)) = qwen35 {
            ffn
        } else if model.quant.excluded.shared_expert && cfg.gemm_quant_mode.is_none() {
            Dtype::Bfloat16
        } else {
            gemm
        },
        kv,
        // An fp8 checkpoint implies fp8 attention, but vLLM's tables only hold bf16 FMHA, as do
        // every backend's DSA tables; the reference then times attention in bf16 (only when
        // fmha_quant_mode is not given).
        fmha: cfg.fmha_quant_mode.unwrap_or(if wide_mla {
            Dtype::Fp8Block
        } else if cfg.backend == "vllm"
            || model.family == Family::Dsa
            || sglang_mla_runs_bf16(&model, cfg, &version, &spec)
        {
            Dtype::Bfloat16
        } else if model.family == Family::Dsv4 && !cfg.database_mode.is_sol() {
            crate::dsv4::context_fmha(&db, model.quant.fmha, kv)?
        } else {
            model.quant.fmha
        }),
        moe,
        backend: cfg.backend.clone(),
        moe_comm,
    };
    if model.dsv41.is_some() && !cfg.database_mode.is_sol() {
        crate::dsv41::require_table(&db)?;
    }
    let mut est = Estimator::new(db, model, layout, cfg.attention_backend.as_deref())?;
    if let Some(g) = &cfg.eagle3 {
        if est.model.family != Family::Dense || est.model.hybrid.is_some() || est.model.gemma4.is_some() {
            return Err(PerfError::unsupported(format!(
                "{}: EAGLE-3 modelling supports the dense Llama-style family ({} is not), as the reference's",
                cfg.model, est.model.architecture
            )));
        }
        if est.layout.cp > 1 {
            return Err(PerfError::unsupported(format!(
                "{}: EAGLE-3 with prefill context parallelism is not modelled",
                cfg.model
            )));
        }
        g.check(&est.model, est.layout.tp)?;
        let (ctx, gen) = crate::eagle3::draft_ops(g, &est.layout, cfg.ngram);
        est.context_ops.extend(ctx);
        est.generation_ops.extend(gen);
    }
    if let Some(d) = &cfg.draft_model {
        if !matches!(est.model.family, Family::Dense | Family::Moe) || est.model.hybrid.is_some() {
            return Err(PerfError::unsupported(format!(
                "{}: draft_model speculation is modelled on dense and plain MoE targets, not {} (the draft's \
                 attention would be read from this target's kernel lanes, which no golden checks)",
                cfg.model, est.model.architecture
            )));
        }
        if est.layout.cp > 1 || est.layout.pp > 1 {
            return Err(PerfError::unsupported(format!(
                "{}: draft_model speculation with pipeline or prefill context parallelism is not modelled",
                cfg.model
            )));
        }
        let (ctx, gen) = crate::draft_model::draft_ops(d, &est.layout, &model_roots)?;
        est.context_ops.extend(ctx);
        est.generation_ops.extend(gen);
    }
    if let Some(d) = &cfg.block_draft {
        d.check(&est.model, &est.layout).map_err(|e| e.context(cfg.model.clone()))?;
        let (ctx, gen) = d.draft_ops(&est.model, &est.layout);
        est.context_ops.extend(ctx);
        est.generation_ops.extend(gen);
    }
    // Decode context parallelism stripes the target's attention, drafts aside (`dcp.rs`).
    crate::dcp::apply(
        &est.model,
        &est.layout,
        cfg.attention_backend.as_deref(),
        &mut est.context_ops,
        &mut est.generation_ops,
    )
    .map_err(|e| e.context("dcp"))?;
    est.check_attention_lanes()?;
    crate::dsa::check_cp_tables(&est.db, &est.context_ops)?;
    let est = Arc::new(est);
    estimators().lock().expect("estimators").insert(key, Arc::clone(&est));
    Ok(est)
}

/// Why the wide expert-parallel knobs are refused: what servesim would need to time them.
/// The large-EP selection of `cfg` checked against the model and layout as the reference's
/// all-to-all registry checks it (`moe_tp = 1`, `1 < moe_ep ≤ experts`, experts divisible by
/// `moe_ep`, top-k ≤ 8), with the modelled family per backend (plain MoE on vLLM, DeepSeek-V3
/// MLA and DSA on SGLang), the nodes the expert group spans and the wide-EP MLA kernel rows.
fn large_ep_comm(
    cfg: &AisConfig,
    model: &crate::model::ModelSpec,
    moe_tp: u32,
    moe_ep: u32,
    gpus_per_node: u32,
) -> Result<crate::moe_a2a::MoeComm> {
    let c = &cfg.moe_comm;
    if !c.is_large_ep() {
        return Ok(c.clone());
    }
    let refuse = |why: String| PerfError::unsupported(format!("{}: moe_comm_backend: {why}", cfg.model));
    // The MLA (DeepSeek-V3 architecture) and DSA families' wide-EP graph: SGLang's (`wideep_mla.rs`).
    let deepseek =
        (model.family == Family::Mla && model.architecture == "DeepseekV3ForCausalLM") || model.family == Family::Dsa;
    let plain = model.family == Family::Moe && model.hybrid.is_none();
    if !(plain || deepseek) {
        return Err(refuse(format!(
            "the large-EP graph is modelled for the plain MoE family on vLLM (Qwen3-MoE, Qwen2-MoE, Mixtral, \
             gpt-oss, MiniMax-M2) and for DeepSeek-V3-architecture MLA and DSA models on SGLang, not {} (the \
             reference does not build it for hybrid, MiniMax-M3 or DeepSeek-V4 models; Kimi-K2.5's wrapper and \
             Kimi-K3 are not modelled)",
            model.architecture
        )));
    }
    match (plain, cfg.backend.as_str()) {
        (true, "vllm") | (false, "sglang") => {}
        (true, b) => {
            return Err(refuse(format!(
                "the plain MoE family's large-EP graph is modelled on vllm only, not {b} (SGLang's needs its \
                 wide-EP expert-compute tables for this model's shape and its shared-expert layout)"
            )))
        }
        (false, b) => {
            return Err(refuse(format!(
                "the {} family's large-EP graph is modelled on sglang only, not {b} (vLLM's runs the fused MLA \
                 attention with the generic all-to-all block, which no golden checks)",
                model.architecture
            )))
        }
    }
    if deepseek && !matches!(cfg.attention_backend.as_deref(), None | Some("default" | "flashinfer" | "fa3")) {
        return Err(PerfError::unsupported(format!(
            "{}: attention_backend {:?} is not one the wide-EP MLA module takes (flashinfer, fa3; unset or \
             default: flashinfer)",
            cfg.model,
            cfg.attention_backend.as_deref().unwrap_or_default()
        )));
    }
    if moe_tp != 1 || moe_ep <= 1 || !model.experts.is_multiple_of(moe_ep) || model.topk > 8 {
        return Err(refuse(format!(
            "DeepEP needs moe_tp_size = 1 and 1 < moe_ep_size dividing the {} experts, top-k ≤ 8; got moe_tp_size \
             {moe_tp}, moe_ep_size {moe_ep}, top-k {}",
            model.experts, model.topk
        )));
    }
    if gpus_per_node == 0 {
        return Err(refuse(format!("system {} has no node.num_gpus_per_node", cfg.system)));
    }
    let mla_backend = match cfg.attention_backend.as_deref() {
        None | Some("default") => "flashinfer",
        Some(b) => b,
    };
    Ok(crate::moe_a2a::MoeComm {
        node_num: (moe_ep * moe_tp).div_ceil(gpus_per_node),
        mla_backend: mla_backend.to_string(),
        ..c.clone()
    })
}

/// Reads `moe_comm_backend`: `{context: BACKEND, generation: BACKEND}`, either phase absent or
/// null for the fused block there. Only DeepEP high-throughput in the context phase on vLLM is
/// modelled; every other backend or phase is refused by name with what it needs.
fn parse_moe_comm(path: &str, backend: &str, v: &Value) -> Result<crate::moe_a2a::MoeComm> {
    use crate::moe_a2a::BACKENDS;
    let key = "moe_comm_backend";
    let obj = v.as_object().ok_or_else(|| {
        cfg_err(path, key, format!("must be an object {{context: BACKEND, generation: BACKEND}}, got {v}"))
    })?;
    let mut comm = crate::moe_a2a::MoeComm::default();
    for (phase, b) in obj {
        let at = format!("{key}.{phase}");
        let b = match b {
            Value::Null => continue,
            Value::String(s) => s.as_str(),
            other => return Err(cfg_err(path, &at, format!("must be a backend name, got {other}"))),
        };
        if !BACKENDS.contains(&b) {
            return Err(cfg_err(
                path,
                &at,
                format!("unknown all-to-all backend {b:?}; expected one of {}", BACKENDS.join(", ")),
            ));
        }
        match (phase.as_str(), b) {
            ("context", "deepep_ht") if matches!(backend, "vllm" | "sglang") => comm.context = Some(b.to_string()),
            ("context", "deepep_ht") => {
                return Err(cfg_err(
                    path,
                    &at,
                    format!(
                        "deepep_ht runs on vllm and sglang, not {backend} (TRT-LLM uses its own all-to-all \
                         backends, trtllm_deepep_ht and the NVLink ones, which are not modelled)"
                    ),
                ))
            }
            ("generation", "deepep_ll") => {
                return Err(cfg_err(
                    path,
                    &at,
                    "DeepEP low-latency decode is not modelled: it needs the reference's Stage-1 estimator \
                     (OLS calibration of the measured curve and the Monte Carlo routing-skew model); leave the \
                     generation phase unset for the fused decode block",
                ))
            }
            ("context" | "generation", _) => {
                return Err(cfg_err(
                    path,
                    &at,
                    format!(
                        "{b:?} is not modelled; only context: deepep_ht on vllm and sglang is ({b} needs its \
                         all-to-all rows and, on TRT-LLM, the wide-EP expert-compute tables)"
                    ),
                ))
            }
            _ => return Err(cfg_err(path, &at, "unknown phase; expected context or generation")),
        }
    }
    Ok(comm)
}

const WIDE_EP: &str = "wide expert parallelism is modelled only as the context-phase DeepEP high-throughput \
                       graph (moe_comm_backend: {context: deepep_ht}) of plain MoE models on vLLM and of \
                       DeepSeek-V3-architecture MLA and DSA models on SGLang (enable_eplb and \
                       wideep_num_slots are taken, and time nothing on the fused block, as in the reference); \
                       the rest needs the all-to-all dispatch and combine estimators of the other backends \
                       (DeepEP low-latency, NVLink, TRT-LLM DeepEP) and their wide-EP expert-compute tables";

/// SGLang 0.5.14 on Hopper runs DeepSeek-V3's absorbed MLA attention in bf16 whatever the
/// checkpoint's KV format (its FA3 backend does not cast the 576-wide latent query to fp8), so
/// the reference times it in bf16 when `fmha_quant_mode` is not given and the attention backend
/// is the default (or fa3). The reference checks DeepSeek-V3's own architecture: Kimi-K2.5's
/// wrapper keeps its checkpoint's attention format.
fn sglang_mla_runs_bf16(model: &ModelSpec, cfg: &AisConfig, version: &str, spec: &crate::systems::SystemSpec) -> bool {
    let Some(d) = model.mla else { return false };
    model.family == Family::Mla
        && cfg.backend == "sglang"
        && version == "0.5.14"
        && spec.sm_version == Some(90)
        && matches!(cfg.attention_backend.as_deref(), None | Some("fa3"))
        && model.architecture == "DeepseekV3ForCausalLM"
        && d.kv_lora_rank == 512
        && d.qk_rope_head_dim == 64
        && model.torch_dtype.as_deref() == Some("bfloat16")
}

/// The engine-facing timer.
#[derive(Debug)]
pub struct AisTimer {
    pub estimator: Arc<Estimator>,
    pub config: AisConfig,
    /// The collected FPM table this worker interpolates (`estimation_mode: fpm_interpolation`).
    pub fpm: Option<Arc<crate::fpm_interp::FpmTable>>,
    /// The hosted vision tower, when the configuration names one.
    pub vision: Option<TowerTimer>,
}

/// A hosted vision tower timed per encoder call: the call's time by its image count, memoised
/// (one workload has one image shape, so a count is all a call varies by).
#[derive(Debug)]
pub struct TowerTimer {
    pub tower: crate::vision::VisionTower,
    pub shape: crate::vision::ImageShape,
    pub layout: crate::vision::EncoderLayout,
    pub tp: u32,
    memo: Mutex<HashMap<u32, f64>>,
}

impl TowerTimer {
    /// The tower of `cfg`'s model and its image shape (None: the configuration hosts no tower).
    pub fn for_config(cfg: &AisConfig) -> Result<Option<TowerTimer>> {
        let Some(v) = &cfg.vision else { return Ok(None) };
        let tower = crate::vision::hosted_tower(&cfg.model, &cfg.systems_paths, v.min_pixels, v.max_pixels)?;
        let shape = tower.image(v.height, v.width)?;
        tower.check_layout(v.layout)?;
        if v.layout == crate::vision::EncoderLayout::Tensor {
            // The sharded tower must divide by the worker's width.
            tower.ops(cfg.tp)?;
        }
        Ok(Some(TowerTimer { tower, shape, layout: v.layout, tp: cfg.tp, memo: Mutex::default() }))
    }

    pub fn call_ms(&self, db: &Database, images: u32) -> Result<f64> {
        if let Some(ms) = self.memo.lock().expect("vision memo").get(&images) {
            return Ok(*ms);
        }
        let ms = self.tower.call_ms(db, self.tp, self.layout, images, self.shape)?;
        self.memo.lock().expect("vision memo").insert(images, ms);
        Ok(ms)
    }
}

fn narrow(v: u64, what: &str) -> std::result::Result<u32, String> {
    u32::try_from(v).map_err(|_| format!("{what} {v} exceeds the estimator's 2^32 limit"))
}

impl AisTimer {
    /// Tokens of KV one decode step reads per request, from the engine's total context.
    fn decode_kv(&self, batch: u32, context_tokens: u64) -> std::result::Result<u32, String> {
        let mean = narrow(context_tokens / u64::from(batch.max(1)), "mean decode context")?;
        match self.config.decode_context {
            DecodeContext::Past => mean
                .checked_add(1)
                .ok_or_else(|| format!("mean decode context {mean} exceeds the estimator's 2^32 limit")),
            // The estimator needs the token being fed (aisimulate refuses a zero mean likewise).
            DecodeContext::Sequence => Ok(mean.max(1)),
        }
    }

    fn raw_decode_ms(&self, batch: u32, context_tokens: u64) -> std::result::Result<f64, String> {
        if batch == 0 {
            return Ok(0.0);
        }
        let kv = self.decode_kv(batch, context_tokens)?;
        self.estimator.decode_ms(batch, kv).map_err(|e| e.message)
    }
}

impl PassTimer for AisTimer {
    fn prefill_ms(&self, batch: u32, mean_isl: u64, mean_prefix: u64) -> std::result::Result<f64, String> {
        let isl = narrow(mean_isl, "mean input length")?;
        let prefix = narrow(mean_prefix, "mean prefix length")?;
        let ms = match &self.fpm {
            Some(t) => t.prefill_ms(batch, isl, prefix),
            None => self.estimator.prefill_ms(batch, isl, prefix),
        }
        .map_err(|e| e.message)?;
        let c = &self.config.calibration;
        Ok(if c.is_identity() { ms } else { c.apply(ms, 0.0) })
    }

    fn prefill_totals_ms(&self, shape: &servesim_engine::PrefillShape) -> std::result::Result<f64, String> {
        let Some(t) = &self.fpm else {
            let b = u64::from(shape.batch.max(1));
            let (isl, prefix) = (shape.total_isl / b, shape.total_prefix / b);
            return if isl <= prefix { Ok(0.0) } else { self.prefill_ms(shape.batch, isl, prefix) };
        };
        // The table's own coordinates: the pass's new-token and KV-read totals.
        let new_tokens = shape.total_isl.saturating_sub(shape.total_prefix);
        let ms = t.prefill_total_ms(shape.batch, new_tokens, shape.total_prefix).map_err(|e| e.message)?;
        let c = &self.config.calibration;
        Ok(if c.is_identity() { ms } else { c.apply(ms, 0.0) })
    }

    fn decode_ms(&self, batch: u32, context_tokens: u64, capacity_tokens: u64) -> std::result::Result<f64, String> {
        let ms = match &self.fpm {
            // The table's own coordinate: the step's past-KV total, capped at the cache.
            Some(t) if batch > 0 => {
                let past = match self.config.decode_context {
                    DecodeContext::Past => context_tokens,
                    DecodeContext::Sequence => context_tokens.saturating_sub(u64::from(batch)),
                };
                t.decode_total_ms(batch, narrow(past.min(capacity_tokens), "total past KV")?).map_err(|e| e.message)?
            }
            _ => self.raw_decode_ms(batch, context_tokens)?,
        };
        let c = &self.config.calibration;
        Ok(if c.is_identity() || batch == 0 { ms } else { c.apply(ms, ms) })
    }

    fn fuses_mixed_passes(&self) -> bool {
        self.config.pass_model == PassModel::Fused
    }

    fn fused_ms(
        &self,
        prefill: &servesim_engine::PrefillShape,
        decode: &servesim_engine::DecodeShape,
    ) -> std::result::Result<f64, String> {
        // The prefill part at Dynamo's integer means, as `prefill_ms` gets it; the decode part's
        // KV as `decode_ms` reads it (the mean context and the token being generated).
        let b = u64::from(prefill.batch.max(1));
        let isl = narrow(prefill.total_isl / b, "mean input length")?;
        let prefix = narrow(prefill.total_prefix / b, "mean prefix length")?;
        let d = decode.batch;
        let kv = self.decode_kv(d, decode.context_tokens)?;
        let ms = self.estimator.fused_ms(prefill.batch, isl, prefix, d, kv).map_err(|e| e.message)?;
        let c = &self.config.calibration;
        if c.is_identity() {
            return Ok(ms);
        }
        // The decode batch's own share, scaled apart from what the prompt tokens add.
        Ok(c.apply(ms, self.raw_decode_ms(d, decode.context_tokens)?))
    }

    fn config(&self) -> Value {
        self.config.raw.clone()
    }

    fn vision_ms(&self, images: u32) -> std::result::Result<f64, String> {
        let Some(v) = &self.vision else {
            return Err("this AIS configuration hosts no vision tower (encoder_parallel)".into());
        };
        v.call_ms(&self.estimator.db, images).map_err(|e| e.message)
    }

    fn kv_cache_blocks(&self, memory: &servesim_engine::KvMemory) -> Option<std::result::Result<u64, String>> {
        let limits = &memory.limits;
        let fraction = match self.config.backend.as_str() {
            "vllm" => limits.gpu_memory_utilization,
            "sglang" => limits.mem_fraction_static,
            _ => limits.free_gpu_memory_fraction,
        };
        // An unbounded per-pass budget is no activation size; the estimator's default stands in.
        let budget = memory.max_num_batched_tokens.unwrap_or(8192) as u64;
        let reserved = limits.cuda_graph_reserved_bytes.unwrap_or(0) as f64;
        let blocks = crate::memory::kv_capacity(&self.estimator, fraction, budget, memory.block_size, reserved)
            .map(|c| c.blocks)
            .map_err(|e| e.message);
        Some(match &self.fpm {
            Some(t) => blocks.and_then(|b| t.cap_blocks(b, memory.block_size)),
            None => blocks,
        })
    }
}

/// Builds an AIS timer from an engine's `timing_model.config` (provider `ais` or `aic`).
pub fn build_timer(key: &str, provider: &str, config: &Value) -> std::result::Result<Arc<dyn PassTimer>, ConfigError> {
    if provider != "ais" && provider != "aic" {
        return Err(ConfigError::new(
            key.trim_end_matches(".config").to_string() + ".provider",
            format!("unknown external timing provider {provider:?}; expected \"ais\", \"aic\" or \"dynamo_profile\""),
        ));
    }
    let cfg = AisConfig::from_json(key, config).map_err(|e| match e.message.split_once(": ") {
        Some((path, why)) if path.starts_with(key) => ConfigError::new(path, why),
        _ => ConfigError::new(key, e.message),
    })?;
    let est = estimator(&cfg).map_err(|e| ConfigError::new(key, e.message))?;
    let fpm = crate::fpm_interp::for_worker(&cfg, &est).map_err(|e| ConfigError::new(key, e.message))?;
    if cfg.vision.is_some() && fpm.is_some() {
        return Err(ConfigError::new(
            key,
            "a hosted vision tower is timed by the op-level estimator only, not FPM tables",
        ));
    }
    let vision = TowerTimer::for_config(&cfg).map_err(|e| ConfigError::new(key, e.message))?;
    Ok(Arc::new(AisTimer { estimator: est, config: cfg, fpm, vision }))
}

/// The [`servesim_engine::TimerFactory`] for providers `ais` and `aic`.
pub fn timer_factory() -> impl Fn(&str, &str, &Value) -> std::result::Result<Arc<dyn PassTimer>, ConfigError> {
    build_timer
}

/// A canonical JSON object from flat identity fields (the mocker's `--ais-*` flags).
pub fn config_from_flags(model: &str, backend: &str, worker_type: &str, fields: &[(&str, Option<Value>)]) -> Value {
    let mut m = Map::new();
    m.insert("model".into(), json!(model));
    m.insert("backend".into(), json!(backend));
    m.insert("system".into(), json!("h200_sxm"));
    m.insert("worker_type".into(), json!(worker_type));
    for (k, v) in fields {
        if let Some(v) = v {
            m.insert((*k).to_string(), v.clone());
        }
    }
    Value::Object(m)
}

/// The planner's forward-pass model: the estimator's `forward_pass_time_ms`, with the engine's
/// calibration applied rank by rank.
#[derive(Debug)]
pub struct PlannerModel(pub Arc<Estimator>, pub PassCalibration);

impl servesim_planner::PassModel for PlannerModel {
    fn forward_pass_ms(&self, ranks: &[servesim_planner::Scheduled]) -> std::result::Result<f64, String> {
        let ranks: Vec<crate::estimator::RankMetrics> = ranks
            .iter()
            .map(|r| crate::estimator::RankMetrics {
                num_prefill_requests: r.num_prefill_requests,
                sum_prefill_tokens: r.sum_prefill_tokens,
                sum_prefill_kv_tokens: r.sum_prefill_kv_tokens,
                num_decode_requests: r.num_decode_requests,
                sum_decode_kv_tokens: r.sum_decode_kv_tokens,
            })
            .collect();
        if self.1.is_identity() {
            return self.0.forward_pass_time_ms(&ranks).map_err(|e| e.message);
        }
        let mut max = 0.0f64;
        for r in &ranks {
            let all = self.0.rank_latency_ms(r).map_err(|e| e.message)?;
            let decode = if r.num_decode_requests == 0 {
                0.0
            } else {
                let alone = crate::estimator::RankMetrics {
                    num_prefill_requests: 0,
                    sum_prefill_tokens: 0,
                    sum_prefill_kv_tokens: 0,
                    ..*r
                };
                self.0.rank_latency_ms(&alone).map_err(|e| e.message)?
            };
            max = max.max(self.1.apply(all, decode));
        }
        Ok(max)
    }
}

/// The planner model of an engine timed by the AIS provider (None for other timing models).
pub fn planner_model(
    engine: &servesim_engine::EngineConfig,
) -> Option<Arc<dyn servesim_planner::PassModel + Send + Sync>> {
    let servesim_engine::TimingModel::External(e) = &engine.timing else { return None };
    if e.provider != "ais" && e.provider != "aic" {
        return None;
    }
    let cfg = AisConfig::from_json("timing_model.config", &e.timer().config()).ok()?;
    let est = estimator(&cfg).ok()?;
    Some(Arc::new(PlannerModel(est, cfg.calibration)))
}
