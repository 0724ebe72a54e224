//! Forward-pass-measurement (FPM) keys: a worker timing's `forward_model`, `fpm_parquet_path`,
//! `estimation_mode` and `fallback_policy`, and the engine's `fpm_profile` identity block, with
//! aisimulate 0.13's validation. Which estimator a worker then gets (and what servesim refuses)
//! is `servesim_perf::fpm`'s.

use serde_json::{json, Value};
use servesim_config::Reader;

use super::controls::Controls;
use crate::error::DeployError;
use crate::reader::ErrAt;

/// Reads a worker timing's FPM keys into its timing controls (`ty`: the timing type).
pub(super) fn read_timing(t: &mut Reader, ty: &str, controls: &mut Controls) -> Result<(), DeployError> {
    let forward = t.one_of("forward_model", &["op_level", "fpm"])?;
    if t.value("estimation_mode").and_then(Value::as_str) == Some("fpm_learned") {
        return Err(t.err(
            "estimation_mode",
            "fpm_learned requires complete ForwardPassMetrics; engine replay's phase-only timing interface cannot \
             supply its batch features. Use the canonical FPM estimate/tune API",
        ));
    }
    let mut mode = t.one_of("estimation_mode", &servesim_perf::fpm::MODES)?;
    let mut fallback = t.one_of("fallback_policy", &["deny", "allow"])?;
    if ty != "default" && mode == Some("fpm_regression") {
        return Err(t.err("estimation_mode", "estimator settings require default timing"));
    }
    // The legacy selector: `forward_model` names the mode when `estimation_mode` does not, and
    // then denies fallback unless told otherwise.
    if ty == "default" && mode.is_none() {
        if let Some(f) = forward {
            mode = Some(if f == "fpm" { "fpm_interpolation" } else { "op_level" });
            fallback = fallback.or(Some("deny"));
        }
    }
    let forward = match mode {
        Some("fpm_interpolation") => "fpm",
        Some("op_level") => "op_level",
        _ => forward.unwrap_or("op_level"),
    };
    if ty != "default" && forward != "op_level" {
        return Err(t.err(
            "forward_model",
            format!("{ty} timing rejects forward_model='{forward}'; forward_model applies to default timing only"),
        ));
    }
    if let Some(p) = t.value("fpm_parquet_path").filter(|v| !v.is_null()) {
        let Some(p) = p.as_str() else {
            return Err(t.err("fpm_parquet_path", "must be a path (a string)"));
        };
        if p.is_empty() {
            return Err(t.err("fpm_parquet_path", "fpm_parquet_path cannot be empty"));
        }
        if ty != "default" || forward != "fpm" {
            return Err(t.err("fpm_parquet_path", "fpm_parquet_path requires default timing with forward_model='fpm'"));
        }
        controls.insert("fpm_parquet_path".into(), json!(p));
    }
    if ty == "default" && servesim_perf::fpm::is_fpm_mode(mode) {
        controls.insert("estimation_mode".into(), json!(mode));
        if let Some(f) = fallback {
            controls.insert("fallback_policy".into(), json!(f));
        }
    }
    Ok(())
}

/// The engine-level `estimation_mode` / `fallback_policy`: an FPM mode goes to every worker's
/// timing (a worker's own overrides it).
pub(super) fn read_engine_mode(e: &mut Reader, controls: &mut Controls) -> Result<(), DeployError> {
    if e.value("estimation_mode").and_then(Value::as_str) == Some("fpm_learned") {
        return Err(e.err(
            "estimation_mode",
            "fpm_learned requires complete ForwardPassMetrics; engine replay's phase-only timing interface cannot \
             supply its batch features. Use the canonical FPM estimate/tune API",
        ));
    }
    let mode = e.one_of("estimation_mode", &servesim_perf::fpm::MODES)?;
    let fallback = e.one_of("fallback_policy", &["deny", "allow"])?;
    if servesim_perf::fpm::is_fpm_mode(mode) {
        controls.insert("estimation_mode".into(), json!(mode));
        if let Some(f) = fallback {
            controls.insert("fallback_policy".into(), json!(f));
        }
    }
    Ok(())
}

const GEMM: &[&str] = &[
    "bfloat16",
    "int8_wo",
    "int4_wo",
    "fp8",
    "fp8_static",
    "sq",
    "fp8_block",
    "fp8_ootb",
    "nvfp4",
    "nvfp4_wo",
    "w4a16_nvfp4",
];
const MOE: &[&str] = &[
    "bfloat16",
    "fp8",
    "int4_wo",
    "fp8_block",
    "w4afp8",
    "nvfp4",
    "nvfp4_wo",
    "w4a16_mxfp4",
    "w4a8_mxfp4_mxfp8",
    "w4a8_mxfp4_mxfp8_trtllm",
    "w4a16_mxfp4_cutlass",
    "w4a16_nvfp4",
    "w4a16_mxfp4_humming",
];
const FMHA: &[&str] = &["bfloat16", "float16", "fp8", "fp8_block"];
const KV: &[&str] = &["bfloat16", "int8", "fp8"];
const COMM: &[&str] = &["half", "int8", "fp8"];
const MUTABLE: &[&str] = &["main", "master", "head", "latest", "current", "unknown", "tbd", "unpinned"];

/// The engine's context for checking a profile against it.
pub(super) struct ProfileContext<'a> {
    pub model: &'a str,
    pub backend: &'a str,
    pub backend_version: Option<&'a str>,
    pub context_length: Option<u32>,
    pub afd: bool,
}

/// Validates `engine.fpm_profile` (aisimulate's `FpmModelProfile`) and checks it against the
/// engine as the reference does; returns the profile for the workers' timing.
pub(super) fn read_profile(path: &str, v: &Value, cx: &ProfileContext) -> Result<Value, DeployError> {
    let err = |key: &str, msg: &str| DeployError::new(format!("{path}{key}"), msg);
    let Some(p) = v.as_object() else {
        return Err(err("", "must be a mapping (aisimulate's FpmModelProfile)"));
    };
    const KEYS: [&str; 8] = [
        "schema_version",
        "model",
        "model_revision",
        "architecture",
        "context_length",
        "num_experts",
        "provenance",
        "deployments",
    ];
    for k in p.keys() {
        if !KEYS.contains(&k.as_str()) {
            return Err(err(&format!(".{k}"), "extra inputs are not permitted"));
        }
    }
    for k in KEYS {
        if p.get(k).is_none_or(Value::is_null) {
            return Err(err(&format!(".{k}"), "field required"));
        }
    }
    if p["schema_version"].as_u64() != Some(1) || !p["schema_version"].is_u64() {
        return Err(err(".schema_version", "input should be 1 (an integer)"));
    }
    let text = |o: &serde_json::Map<String, Value>, k: &str, at: &str| -> Result<String, DeployError> {
        match o.get(k).and_then(Value::as_str) {
            Some(s) if !s.trim().is_empty() => Ok(s.to_string()),
            _ => Err(err(&format!("{at}.{k}"), "must be a non-empty string")),
        }
    };
    let int = |o: &serde_json::Map<String, Value>, k: &str, at: &str, min: u64| -> Result<u64, DeployError> {
        match o.get(k).and_then(Value::as_u64) {
            Some(n) if n >= min => Ok(n),
            _ => Err(err(&format!("{at}.{k}"), &format!("must be an integer >= {min}"))),
        }
    };
    let model = text(p, "model", "")?;
    let revision = text(p, "model_revision", "")?;
    if MUTABLE.contains(&revision.trim().to_lowercase().as_str()) {
        return Err(err(".model_revision", "provide a pinned model_revision, not a mutable or unknown placeholder"));
    }
    text(p, "architecture", "")?;
    text(p, "provenance", "")?;
    let context_length = int(p, "context_length", "", 1)?;
    let num_experts = int(p, "num_experts", "", 0)?;
    let Some(deployments) = p["deployments"].as_array().filter(|d| !d.is_empty()) else {
        return Err(err(".deployments", "must list at least one deployment"));
    };
    let mut identities: Vec<(Value, Option<String>)> = Vec::new();
    let mut versions = Vec::new();
    for (i, d) in deployments.iter().enumerate() {
        let at = format!(".deployments[{i}]");
        let Some(d) = d.as_object() else {
            return Err(err(&at, "must be a mapping (aisimulate's FpmDeploymentProfile)"));
        };
        const DKEYS: [&str; 21] = [
            "system",
            "backend",
            "backend_version",
            "tp",
            "pp",
            "dp",
            "moe_tp",
            "moe_ep",
            "cp",
            "gemm_quant_mode",
            "moe_quant_mode",
            "fmha_quant_mode",
            "comm_quant_mode",
            "kv_cache_dtype",
            "moe_backend",
            "attention_backend",
            "enable_wideep",
            "enable_eplb",
            "worker_type",
            "execution_profile",
            "resources",
        ];
        for k in d.keys() {
            if !DKEYS.contains(&k.as_str()) {
                return Err(err(&format!("{at}.{k}"), "extra inputs are not permitted"));
            }
        }
        text(d, "system", &at)?;
        if d.get("backend").and_then(Value::as_str) != Some("vllm") {
            return Err(err(&format!("{at}.backend"), "input should be 'vllm'"));
        }
        if let Some(v) = d.get("backend_version").filter(|v| !v.is_null()) {
            let v = v.as_str().unwrap_or("");
            if v.is_empty()
                || MUTABLE.contains(&v.to_lowercase().as_str())
                || ["previous", "next", ".", ".."].contains(&v)
                || v.chars().any(|c| c.is_whitespace() || matches!(c, '/' | '\\' | '\0'))
            {
                return Err(err(
                    &format!("{at}.backend_version"),
                    "FPM profile backend_version must be a literal, path-safe version label",
                ));
            }
            versions.push(v.to_string());
        }
        let (tp, dp, moe_tp, moe_ep) =
            (int(d, "tp", &at, 1)?, int(d, "dp", &at, 1)?, int(d, "moe_tp", &at, 1)?, int(d, "moe_ep", &at, 1)?);
        for k in ["pp", "cp"] {
            if d.get(k).is_some_and(|v| v.as_u64() != Some(1) || !v.is_u64()) {
                return Err(err(&format!("{at}.{k}"), "input should be 1"));
            }
        }
        for k in ["enable_wideep", "enable_eplb"] {
            if d.get(k).is_some_and(|v| v != &Value::Bool(false)) {
                return Err(err(&format!("{at}.{k}"), "input should be False"));
            }
        }
        for (k, allowed) in [
            ("gemm_quant_mode", GEMM),
            ("moe_quant_mode", MOE),
            ("fmha_quant_mode", FMHA),
            ("comm_quant_mode", COMM),
            ("kv_cache_dtype", KV),
        ] {
            let v = text(d, k, &at)?;
            if !allowed.contains(&v.as_str()) {
                return Err(err(&at, &format!("unknown FPM {k}: '{v}'")));
            }
        }
        for k in ["moe_backend", "attention_backend"] {
            if d.contains_key(k) {
                text(d, k, &at)?;
            }
        }
        let role = match d.get("worker_type").filter(|v| !v.is_null()) {
            None => None,
            Some(Value::String(s)) if ["prefill", "decode", "aggregated"].contains(&s.as_str()) => Some(s.clone()),
            Some(_) => {
                return Err(err(&format!("{at}.worker_type"), "input should be 'prefill', 'decode' or 'aggregated'"))
            }
        };
        if d.get("execution_profile").is_some_and(|v| !v.is_null()) {
            return Err(err(
                &format!("{at}.execution_profile"),
                "speculative-round FPM identities are not supported by servesim (only null)",
            ));
        }
        read_resources(&format!("{path}{at}.resources"), d.get("resources"))?;
        let dense_tp = dp == 1 && moe_ep == 1 && (moe_tp == 1 || moe_tp == tp);
        let moe_ok = (dp == 1 && moe_ep == 1 && moe_tp == tp)
            || (tp == 1 && moe_tp == 1 && moe_ep == dp)
            || (dp == 1 && moe_tp == 1 && moe_ep == tp);
        if !(if num_experts == 0 { dense_tp } else { moe_ok }) {
            return Err(err(
                "",
                "FPM profile requires dense TP or an MoE TP, DEP, or TEP topology with matching world sizes",
            ));
        }
        let identity = json!([d.get("system"), d.get("backend_version"), [tp, 1, dp, moe_tp, moe_ep, 1]]);
        let same: Vec<&Option<String>> = identities.iter().filter(|(id, _)| *id == identity).map(|(_, r)| r).collect();
        if same.contains(&&role) {
            return Err(err(
                "",
                "duplicate FPM deployment identity; specify one precision/resource profile per topology and role",
            ));
        }
        if !same.is_empty() && (same.contains(&&None) || role.is_none()) {
            return Err(err(
                "",
                "ambiguous FPM deployment identity: cannot mix legacy shared and role-specific profiles",
            ));
        }
        identities.push((identity, role));
        if moe_ep > 1 && (num_experts == 0 || num_experts % moe_ep != 0) {
            return Err(err("", "num_experts must be positive and divisible by moe_ep for expert parallelism"));
        }
    }
    // Against the engine (the reference's `_validate_fpm_profile`).
    if cx.model != model {
        return Err(err("", "engine.model must match engine.fpm_profile.model"));
    }
    if cx.backend != "vllm" || cx.afd {
        return Err(err(
            "",
            "FPM profiles support vLLM aggregated/disaggregated decoder workers without AFD or encoders",
        ));
    }
    let version =
        cx.backend_version.map(str::trim).filter(|v| !v.is_empty() && !["current", "previous", "next"].contains(v));
    let Some(version) = version else {
        return Err(err("", "engine.fpm_profile requires a literal engine.backend_version for vllm"));
    };
    if !versions.iter().any(|v| v == version) {
        return Err(err("", "engine.backend_version does not match any FPM profile deployment"));
    }
    if cx.context_length.is_some_and(|c| u64::from(c) > context_length) {
        return Err(err("", "engine.context_length exceeds the FPM profile context_length"));
    }
    Ok(v.clone())
}

fn read_resources(path: &str, v: Option<&Value>) -> Result<(), DeployError> {
    let err = |key: &str, msg: &str| DeployError::new(format!("{path}{key}"), msg);
    let Some(r) = v.and_then(Value::as_object) else {
        return Err(err("", "field required (a mapping: aisimulate's FpmResourceProfile)"));
    };
    const KEYS: [&str; 11] = [
        "weights_bytes",
        "activations_bytes",
        "runtime_overhead_bytes",
        "comm_overhead_bytes",
        "runtime_memory",
        "kv_bytes_per_token",
        "cache_layout",
        "cache_groups",
        "max_num_tokens",
        "max_batch_size",
        "provenance",
    ];
    for k in r.keys() {
        if !KEYS.contains(&k.as_str()) {
            return Err(err(&format!(".{k}"), "extra inputs are not permitted"));
        }
    }
    let present = |k: &str| r.get(k).is_some_and(|v| !v.is_null());
    for k in ["max_num_tokens", "max_batch_size"] {
        if r.get(k).and_then(Value::as_u64).is_none_or(|n| n == 0) {
            return Err(err(&format!(".{k}"), "must be a positive integer"));
        }
    }
    if r.get("provenance").and_then(Value::as_str).is_none_or(|s| s.trim().is_empty()) {
        return Err(err(".provenance", "must be a non-empty string"));
    }
    let declared = ["weights_bytes", "activations_bytes", "runtime_overhead_bytes", "comm_overhead_bytes"];
    let mut total = 0u128;
    for k in declared {
        if present(k) {
            match r[k].as_u64().filter(|n| *n <= 1 << 53) {
                Some(n) => total += u128::from(n),
                None => return Err(err(&format!(".{k}"), "must be an integer in [0, 2**53]")),
            }
        }
    }
    if total > 1 << 53 {
        return Err(err("", "total non-KV resource bytes must not exceed 2**53"));
    }
    if present("runtime_memory") && declared.iter().any(|k| present(k)) {
        return Err(err("", "runtime_memory cannot be combined with declared non-KV resource bytes"));
    }
    let groups = r.get("cache_groups").and_then(Value::as_array).is_some_and(|g| !g.is_empty());
    match r.get("cache_layout").and_then(Value::as_str) {
        Some("linear") => {
            if !present("kv_bytes_per_token") || groups {
                return Err(err("", "linear cache requires kv_bytes_per_token and no cache_groups"));
            }
        }
        Some("grouped") => {
            return Err(err(".cache_layout", "grouped FPM caches are not supported by servesim (only linear)"));
        }
        _ => return Err(err(".cache_layout", "input should be 'linear' or 'grouped'")),
    }
    if !r.get("kv_bytes_per_token").and_then(Value::as_u64).is_some_and(|n| n > 0 && n <= 1 << 53) {
        return Err(err(".kv_bytes_per_token", "must be a positive integer"));
    }
    Ok(())
}
