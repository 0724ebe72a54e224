//! Worker arguments (an engine and its deployment) from JSON, as `predict`'s
//! `--extra-engine-args` / `--prefill-engine-args` / `--decode-engine-args` and `serve`'s engine
//! configuration give them: timing profiles read relative to the file, `external` timing models
//! (AIS) built by `servesim-perf`.

use std::sync::Arc;

use serde_json::Value;
use servesim_engine::{ConfigEnv, ConfigError, FileLoader, PassTimer, WorkerArgs};

use super::json_arg;
use crate::failure::Failure;

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
    WorkerArgs::from_value_env(value, ConfigEnv { files, timers: Some(&factory), ..ConfigEnv::NONE })
}

/// The worker arguments `--FLAG` gives (inline JSON or a JSON file; none: the defaults), with a
/// warning when their timing model falls back to the polynomial one.
pub(crate) fn worker_args(flag: &str, arg: Option<&str>) -> Result<WorkerArgs, Failure> {
    let Some(arg) = arg else { return Ok(WorkerArgs::default()) };
    let args = json_arg(flag, arg, |text, dir| {
        let files = |path: &str| {
            let full = dir.join(path);
            std::fs::read(&full).map_err(|e| format!("cannot read {}: {e}", full.display()))
        };
        parse_worker_json(text, &files)
    })?;
    if let Some(why) = &args.engine.timing_fallback {
        eprintln!("warning: --{flag}: {why}; using the polynomial timing model instead");
    }
    Ok(args)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

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
