//! Wiring of the data-driven (AIS) timing model into engine configurations: the external timer
//! factory for `{"type": "external", "provider": "ais"|"aic"}` and the mocker's `--ais-*` flags
//! (legacy `--aic-*` spellings accepted); and into the KV router as its prompt-side load model
//! (`--router-prefill-load-model ais`), with its own estimator configuration.

use std::sync::Arc;

use clap::{Args, ValueEnum};
use serde_json::{json, Map, Value};
use servesim_engine::{EngineConfig, TimingModel};
use servesim_router::{PrefillLoadEstimator, PrefillLoadModel, RouterConfig};

use crate::failure::Failure;

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
    /// How a pass that prefills beside a decode batch is timed: `additive` (prefill step plus
    /// decode step, as the reference does) or `fused` (one forward over all its tokens, as a GPU
    /// runs it). servesim's own.
    #[arg(long = "ais-pass-model", value_parser = ["additive", "fused"], help_heading = "AIS timing")]
    pub pass_model: Option<String>,
    /// A complete timing config (ForwardPassPerfModelConfig keys) as JSON or a JSON/YAML file.
    #[arg(long = "ais-perf-config", alias = "aic-perf-config", help_heading = "AIS timing")]
    pub perf_config: Option<String>,
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
            ("pass_model", self.pass_model.clone().map(Value::from)),
        ]
    }

    /// The `timing_model` these flags ask for, if any (Dynamo's `build_mocker_engine_args`).
    pub fn timing_model(
        &self,
        model_path: Option<&str>,
        engine_type: &str,
        worker_type: &str,
    ) -> Result<Option<Value>, Failure> {
        let flat: Vec<(&str, Value)> = self.flat().into_iter().filter_map(|(k, v)| v.map(|v| (k, v))).collect();
        let config = if let Some(pc) = &self.perf_config {
            if self.perf_model || !flat.is_empty() {
                return Err(Failure::input("--ais-perf-config cannot be combined with flat AIS/AIC identity flags"));
            }
            let mut v = read_perf_config("--ais-perf-config", pc)?;
            if let Value::Object(m) = &mut v {
                m.entry("worker_type").or_insert_with(|| json!(worker_type));
            }
            v
        } else if self.perf_model {
            let model =
                model_path.ok_or_else(|| Failure::input("--ais-perf-model needs --model-path (the model to time)"))?;
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

/// `--router-prefill-load-model`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RouterLoadModel {
    None,
    /// Dynamo 1.6.1's spelling; `aic` (its documentation's) is accepted too.
    #[value(alias = "aic")]
    Ais,
}

/// The KV router's prompt-side load model flags (Dynamo's `--router-prefill-load-model` and the
/// replay API's `ais_perf_config`).
#[derive(Args, Debug, Default, Clone)]
pub struct RouterLoadFlags {
    /// How the KV router weighs prompts placed but not yet prefilled: `none` counts them in
    /// full; `ais` lets the oldest one on each worker decay over its prefill time predicted by
    /// the AIS model (`router_prefill_load_model` in --router-config).
    #[arg(long, value_enum, value_name = "MODEL")]
    pub router_prefill_load_model: Option<RouterLoadModel>,
    /// AIS configuration of the router's load model (ForwardPassPerfModelConfig keys, as JSON,
    /// a JSON / YAML file). Default: the AIS timing model of the engines the router fronts
    /// (the prefill engines when disaggregated).
    #[arg(long, value_name = "JSON|PATH")]
    pub router_ais_config: Option<String>,
}

/// The router's load model from the AIS estimator: one request prefilled alone, as Dynamo's
/// `predict_prefill(batch = 1, effective_isl, prefix)`.
#[derive(Debug)]
pub struct AisPrefillLoad {
    estimator: Arc<servesim_perf::Estimator>,
}

impl PrefillLoadEstimator for AisPrefillLoad {
    fn prefill_ms(&self, new_tokens: u32, prefix_tokens: u32) -> Result<f64, String> {
        let isl = new_tokens
            .checked_add(prefix_tokens)
            .ok_or_else(|| format!("{new_tokens} + {prefix_tokens} prompt tokens exceed 2^32"))?;
        self.estimator.prefill_ms(1, isl, prefix_tokens).map_err(|e| e.message)
    }
}

impl RouterLoadFlags {
    /// Applies the flags to the router configuration (None: round robin) and builds the load
    /// model it asks for. `front` is the engine the router places requests on (the prefill
    /// engine when disaggregated).
    pub fn resolve(
        &self,
        router: Option<&mut RouterConfig>,
        front: &EngineConfig,
    ) -> Result<Option<Arc<dyn PrefillLoadEstimator>>, Failure> {
        let Some(router) = router else {
            if self.router_prefill_load_model.is_some_and(|m| m != RouterLoadModel::None)
                || self.router_ais_config.is_some()
            {
                return Err(Failure::input(
                    "--router-prefill-load-model ais and --router-ais-config apply to --router-mode kv_router \
                     (round robin takes no load model)",
                ));
            }
            return Ok(None);
        };
        if let Some(flag) = self.router_prefill_load_model {
            let wanted = match flag {
                RouterLoadModel::None => PrefillLoadModel::None,
                RouterLoadModel::Ais => PrefillLoadModel::Ais,
            };
            if router.prefill_load_model != PrefillLoadModel::None && router.prefill_load_model != wanted {
                return Err(Failure::input(
                    "--router-prefill-load-model disagrees with router_prefill_load_model in --router-config",
                ));
            }
            router.prefill_load_model = wanted;
        }
        if router.prefill_load_model == PrefillLoadModel::None {
            if self.router_ais_config.is_some() {
                return Err(Failure::input("--router-ais-config needs --router-prefill-load-model ais"));
            }
            return Ok(None);
        }
        let (key, config) = match &self.router_ais_config {
            Some(arg) => ("--router-ais-config".to_string(), read_perf_config("--router-ais-config", arg)?),
            None => match &front.timing {
                TimingModel::External(t) if t.provider == "ais" || t.provider == "aic" => {
                    ("the engine's timing_model.config".to_string(), t.timer().config())
                }
                _ => {
                    return Err(Failure::input(
                        "the router's prefill load model `ais` needs an AIS configuration: give --router-ais-config \
                         (ForwardPassPerfModelConfig keys, Dynamo's ais_perf_config), or time the engines the router \
                         fronts with the AIS model ({\"type\": \"external\", \"provider\": \"ais\", \"config\": {...}})",
                    ))
                }
            },
        };
        let cfg = servesim_perf::AisConfig::from_json("router_ais_config", &config)
            .map_err(|e| Failure::input(format!("{key}: {}", e.message)))?;
        let estimator = servesim_perf::estimator(&cfg)
            .map_err(|e| Failure::input(format!("router prefill load model ({key}): {}", e.message)))?;
        Ok(Some(Arc::new(AisPrefillLoad { estimator })))
    }
}

/// `--ais-perf-config` / `--router-ais-config` (`flag`): inline JSON, or a JSON / YAML file.
fn read_perf_config(flag: &str, arg: &str) -> Result<Value, Failure> {
    let text = if arg.trim_start().starts_with('{') {
        arg.to_string()
    } else {
        servesim_workload::input::read_config_text(arg)
            .map_err(|e| Failure::input(format!("{flag}: cannot read AIS config {arg:?}: {e}")))?
    };
    let v: Value = if text.trim_start().starts_with('{') {
        serde_json::from_str(&text).map_err(|e| Failure::input(format!("{flag}: invalid JSON: {e}")))?
    } else {
        serde_yaml_ng::from_str(&text).map_err(|e| Failure::input(format!("{flag} {arg}: invalid YAML: {e}")))?
    };
    if !v.is_object() {
        return Err(Failure::input(format!("{flag}: an AIS config must be an object")));
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
        let pc = AisFlags {
            perf_config: Some(r#"{"model": "m", "system": "s", "backend": "sglang"}"#.into()),
            ..Default::default()
        };
        let t = pc.timing_model(None, "vllm", "prefill").unwrap().unwrap();
        assert_eq!(t["config"]["worker_type"], "prefill");
    }

    #[test]
    fn router_load_model_flags() {
        let engine = EngineConfig::default();
        let kv = || RouterConfig::default();
        let none = RouterLoadFlags::default();
        let mut rc = kv();
        assert!(none.resolve(Some(&mut rc), &engine).unwrap().is_none());
        assert_eq!(rc.prefill_load_model, PrefillLoadModel::None);
        // Round robin takes no load model.
        let ais = RouterLoadFlags { router_prefill_load_model: Some(RouterLoadModel::Ais), ..Default::default() };
        let e = ais.resolve(None, &engine).unwrap_err();
        assert!(e.message.contains("apply to --router-mode kv_router"), "{}", e.message);
        // `ais` needs a configuration: none given and the engine is not timed by AIS.
        let e = ais.resolve(Some(&mut kv()), &engine).unwrap_err();
        assert!(
            e.message.contains("give --router-ais-config") && e.message.contains("ais_perf_config"),
            "{}",
            e.message
        );
        // The same through --router-config.
        let mut rc = RouterConfig::parse_json(r#"{"router_prefill_load_model": "aic"}"#).unwrap();
        assert!(none.resolve(Some(&mut rc), &engine).is_err());
        // A config without the model asking for it, and a contradiction.
        let orphan = RouterLoadFlags { router_ais_config: Some("{}".into()), ..Default::default() };
        let e = orphan.resolve(Some(&mut kv()), &engine).unwrap_err();
        assert!(e.message.contains("--router-ais-config needs --router-prefill-load-model ais"), "{}", e.message);
        let off = RouterLoadFlags { router_prefill_load_model: Some(RouterLoadModel::None), ..Default::default() };
        let mut rc = RouterConfig::parse_json(r#"{"router_prefill_load_model": "ais"}"#).unwrap();
        assert!(off.resolve(Some(&mut rc), &engine).unwrap_err().message.contains("disagrees"));
        // A bad estimator configuration is named by its source.
        let bad = RouterLoadFlags {
            router_prefill_load_model: Some(RouterLoadModel::Ais),
            router_ais_config: Some(r#"{"model": "m", "system": "s", "backend": "vllm", "tpp": 1}"#.into()),
        };
        let e = bad.resolve(Some(&mut kv()), &engine).unwrap_err();
        assert!(e.message.contains("--router-ais-config: router_ais_config.tpp: unknown key"), "{}", e.message);
    }
}
