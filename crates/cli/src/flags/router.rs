//! The router flags `predict` and `serve` share: `--router-mode` with `--router-config`, and the
//! policy classes of the KV router's queue (`--router-policy-config`, `--model-name`).

use std::path::Path;

use clap::ValueEnum;
use servesim_replay::RouterMode;
use servesim_router::{PolicyConfig, RouterConfig};

use super::json_arg;
use crate::failure::Failure;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum Router {
    RoundRobin,
    KvRouter,
}

/// `--router-mode` and `--router-config` (inline JSON or a file) as a router mode; `predict`
/// and `serve` take the same pair.
pub(crate) fn router_mode(mode: Router, config: Option<&str>) -> Result<RouterMode, Failure> {
    Ok(match mode {
        Router::RoundRobin => {
            if config.is_some() {
                return Err(Failure::input("--router-config applies to --router-mode kv_router"));
            }
            RouterMode::RoundRobin
        }
        Router::KvRouter => RouterMode::KvRouter(match config {
            Some(arg) => json_arg("router-config", arg, |text, _| RouterConfig::parse_json(text))?,
            None => RouterConfig::default(),
        }),
    })
}

/// Loads the KV router's policy classes from `--router-policy-config` (`flag`), else the router
/// configuration's `router_policy_config`, else `$DYN_ROUTER_POLICY_CONFIG`, and picks the
/// profile of `model_name` (or the root one). Without a file, or without a matching profile, the
/// router keeps its one queue from `router_queue_threshold` / `router_queue_policy`.
pub(crate) fn router_policy(
    router: &mut RouterMode,
    flag: Option<&str>,
    model_name: Option<&str>,
) -> Result<(), Failure> {
    let Some(rc) = router.kv_config_mut() else {
        if flag.is_some() {
            return Err(Failure::input("--router-policy-config applies to --router-mode kv_router"));
        }
        return Ok(());
    };
    let env = std::env::var("DYN_ROUTER_POLICY_CONFIG").ok().filter(|v| !v.is_empty());
    let Some(path) = flag.map(str::to_string).or_else(|| rc.policy_config_path.clone()).or(env) else {
        return Ok(());
    };
    let config = load_policy(Path::new(&path)).map_err(Failure::input)?;
    rc.policy_profile = config.profile(model_name).cloned().map(std::sync::Arc::new);
    rc.policy_config_path = Some(path);
    Ok(())
}

/// Reads and checks a router policy file; errors name the file and the key path.
fn load_policy(path: &Path) -> Result<PolicyConfig, String> {
    let text = servesim_workload::input::read_config_text(path)
        .map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
    PolicyConfig::from_yaml(&text).map_err(|e| format!("{}: {e}", path.display()))
}
