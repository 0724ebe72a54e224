//! Wiring of the data-driven (AIS) timing model into engine configurations: the external timer
//! factory for `{"type": "external", "provider": "ais"|"aic"}` and the mocker's `--ais-*` flags
//! (legacy `--aic-*` spellings accepted).

use std::sync::Arc;

use clap::Args;
use serde_json::{json, Map, Value};
use servesim_engine::{ConfigEnv, ConfigError, FileLoader, PassTimer, WorkerArgs};

use crate::Failure;

/// Dynamo's mocker flags for the AIS timing model.
#[derive(Args, Debug, Default, Clone)]
pub struct AisFlags {
    /// Time passes with the AIS model of this worker's model (--model-path).
    #[arg(long = "ais-perf-model", alias = "aic-perf-model", help_heading = "AIS timing")]
    pub perf_model: bool,
    /// GPU system (default h200_sxm).
    #[arg(long = "ais-system", alias = "aic-system", help_heading = "AIS timing")]
    pub system: Option<String>,
    /// Kernel-table backend (default: the engine's).
    #[arg(long = "ais-backend", alias = "aic-backend", help_heading = "AIS timing")]
    pub backend: Option<String>,
    #[arg(long = "ais-backend-version", alias = "aic-backend-version", help_heading = "AIS timing")]
    pub backend_version: Option<String>,
    #[arg(long = "ais-tp-size", alias = "aic-tp-size", help_heading = "AIS timing")]
    pub tp_size: Option<u32>,
    #[arg(long = "ais-moe-tp-size", alias = "aic-moe-tp-size", help_heading = "AIS timing")]
    pub moe_tp_size: Option<u32>,
    #[arg(long = "ais-moe-ep-size", alias = "aic-moe-ep-size", help_heading = "AIS timing")]
    pub moe_ep_size: Option<u32>,
    #[arg(long = "ais-attention-dp-size", alias = "aic-attention-dp-size", help_heading = "AIS timing")]
    pub attention_dp_size: Option<u32>,
    #[arg(long = "ais-nextn", alias = "aic-nextn", help_heading = "AIS timing")]
    pub nextn: Option<u32>,
    /// A complete timing config (ForwardPassPerfModelConfig keys) as JSON or a JSON/YAML file.
    #[arg(long = "ais-perf-config", alias = "aic-perf-config", help_heading = "AIS timing")]
    pub perf_config: Option<String>,
}

/// The factory the engine configuration resolves `external` timing models with.
pub fn factory(key: &str, provider: &str, config: &Value) -> Result<Arc<dyn PassTimer>, ConfigError> {
    servesim_perf::build_timer(key, provider, config)
}

/// Worker arguments (engine and deployment) from JSON text, resolving timing profiles through
/// `files` and AIS timing models.
pub fn parse_worker_json(text: &str, files: FileLoader) -> Result<WorkerArgs, ConfigError> {
    let value: Value = serde_json::from_str(text).map_err(|e| ConfigError::new("", format!("invalid JSON: {e}")))?;
    worker_args_from_value(&value, files)
}

/// Worker arguments from a parsed value, resolving timing profiles and AIS timing models.
pub fn worker_args_from_value(value: &Value, files: FileLoader) -> Result<WorkerArgs, ConfigError> {
    WorkerArgs::from_value_env(value, ConfigEnv { files, timers: Some(&factory) })
}

impl AisFlags {
    fn flat(&self) -> Vec<(&'static str, Option<Value>)> {
        vec![
            ("system", self.system.clone().map(Value::from)),
            ("backend", self.backend.clone().map(Value::from)),
            ("backend_version", self.backend_version.clone().map(Value::from)),
            ("tp", self.tp_size.map(Value::from)),
            ("moe_tp_size", self.moe_tp_size.map(Value::from)),
            ("moe_ep_size", self.moe_ep_size.map(Value::from)),
            ("attention_dp", self.attention_dp_size.map(Value::from)),
            ("nextn", self.nextn.map(Value::from)),
        ]
    }

    /// The `timing_model` these flags ask for, if any (Dynamo's `build_mocker_engine_args`).
    pub fn timing_model(&self, model_path: Option<&str>, engine_type: &str, worker_type: &str) -> Result<Option<Value>, Failure> {
        let flat: Vec<(&str, Value)> = self.flat().into_iter().filter_map(|(k, v)| v.map(|v| (k, v))).collect();
        let config = if let Some(pc) = &self.perf_config {
            if self.perf_model || !flat.is_empty() {
                return Err(Failure::input("--ais-perf-config cannot be combined with flat AIS/AIC identity flags"));
            }
            let mut v = read_perf_config(pc)?;
            if let Value::Object(m) = &mut v {
                m.entry("worker_type").or_insert_with(|| json!(worker_type));
            }
            v
        } else if self.perf_model {
            let model = model_path.ok_or_else(|| Failure::input("--ais-perf-model needs --model-path (the model to time)"))?;
            let mut m = Map::new();
            m.insert("model".into(), json!(model));
            m.insert("backend".into(), json!(engine_type));
            m.insert("system".into(), json!("h200_sxm"));
            m.insert("worker_type".into(), json!(worker_type));
            for (k, v) in flat {
                m.insert(k.into(), v);
            }
            Value::Object(m)
        } else if !flat.is_empty() {
            return Err(Failure::input("--ais-* identity flags need --ais-perf-model (or use --ais-perf-config)"));
        } else {
            return Ok(None);
        };
        Ok(Some(json!({"type": "external", "provider": "ais", "config": config})))
    }
}

/// `--ais-perf-config`: inline JSON, or a JSON / YAML file.
fn read_perf_config(arg: &str) -> Result<Value, Failure> {
    let text = if arg.trim_start().starts_with('{') {
        arg.to_string()
    } else {
        std::fs::read_to_string(arg).map_err(|e| Failure::input(format!("cannot read AIS perf config {arg:?}: {e}")))?
    };
    let v: Value = if text.trim_start().starts_with('{') {
        serde_json::from_str(&text).map_err(|e| Failure::input(format!("--ais-perf-config: invalid JSON: {e}")))?
    } else {
        serde_yaml_ng::from_str(&text).map_err(|e| Failure::input(format!("--ais-perf-config {arg}: invalid YAML: {e}")))?
    };
    if !v.is_object() {
        return Err(Failure::input("AIS perf config must contain an object"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_build_the_reference_timing_model() {
        let f = AisFlags { perf_model: true, tp_size: Some(2), system: Some("h100_sxm".into()), ..Default::default() };
        let t = f.timing_model(Some("Qwen/Qwen3-8B"), "vllm", "decode").unwrap().unwrap();
        assert_eq!(
            t,
            json!({"type": "external", "provider": "ais", "config": {"model": "Qwen/Qwen3-8B", "backend": "vllm",
                   "system": "h100_sxm", "worker_type": "decode", "tp": 2}})
        );
        assert!(AisFlags::default().timing_model(None, "vllm", "aggregated").unwrap().is_none());
        let both = AisFlags { perf_config: Some("{}".into()), tp_size: Some(2), ..Default::default() };
        assert!(both.timing_model(None, "vllm", "aggregated").is_err());
        let pc = AisFlags { perf_config: Some(r#"{"model": "m", "system": "s", "backend": "sglang"}"#.into()), ..Default::default() };
        let t = pc.timing_model(None, "vllm", "prefill").unwrap().unwrap();
        assert_eq!(t["config"]["worker_type"], "prefill");
    }

    #[test]
    fn unknown_timing_config_keys_are_rejected_by_path() {
        let v = json!({"engine": {"timing_model": {"type": "external", "provider": "ais",
                       "config": {"model": "m", "system": "s", "backend": "vllm", "bogus": 1}}}});
        let e = worker_args_from_value(&v, &|_| Err("no files".into())).unwrap_err();
        assert_eq!(e.path, "engine.timing_model.config.bogus");
        assert!(e.message.starts_with("unknown key"), "{}", e.message);
        let v = json!({"engine": {"timing_model": {"type": "external", "provider": "other", "config": {}}}});
        let e = worker_args_from_value(&v, &|_| Err("no files".into())).unwrap_err();
        assert!(e.message.contains("unknown external timing provider"), "{e}");
    }
}
