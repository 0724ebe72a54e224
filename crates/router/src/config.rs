//! Router configuration: Dynamo's `KvRouterConfig` JSON.

use serde_json::{json, Value};
use servesim_config::{ConfigError, Reader, Result};

use std::sync::Arc;

use crate::policy::PolicyProfile;

pub use crate::queue_policy::QueuePolicy;

/// How the router models the prompt-side (prefill) load it has placed on a target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefillLoadModel {
    /// Pending prompt tokens count in full until the request's first token.
    None,
    /// The oldest pending prompt on a target decays linearly over the time a
    /// [`crate::PrefillLoadEstimator`] (the AIS model) predicts for its prefill; the others count
    /// in full until they become the oldest (Dynamo's `router_prefill_load_model: ais`).
    Ais,
}

#[derive(Clone, Debug, PartialEq)]
pub struct RouterConfig {
    /// Credit per device-cached prefix block against the prompt's prefill cost.
    pub overlap_score_credit: f64,
    /// Shrinks the overlap credit on workers with more active prefill than the least loaded.
    pub overlap_score_credit_decay: f64,
    /// Weight of the (credited) prefill blocks in the cost.
    pub prefill_load_scale: f64,
    /// Block-equivalent cost per active request on a worker.
    pub decode_active_request_weight: f64,
    /// What one host-resident (G2) block continuing a worker's device prefix counts for in its
    /// cached prefix, against 1 for a device block (Dynamo's `host_cache_hit_weight`).
    pub host_cache_hit_weight: f64,
    /// 0 picks the cheapest worker; > 0 samples from a softmax over normalised costs.
    pub temperature: f64,
    /// Count active KV blocks of each worker's requests in the cost.
    pub track_active_blocks: bool,
    /// De-duplicate active blocks shared by several requests (by block hash).
    pub assume_kv_reuse: bool,
    /// Count prompt tokens not yet prefilled in the cost.
    pub track_prefill_tokens: bool,
    /// Queue requests while every worker's pending prefill exceeds this fraction of
    /// `max_num_batched_tokens` (None: never queue).
    pub queue_threshold: Option<f64>,
    pub queue_policy: QueuePolicy,
    /// `router_prefill_load_model`.
    pub prefill_load_model: PrefillLoadModel,
    /// `router_policy_config`: the path of a policy-class YAML file, as given (read by the
    /// front end, which sets [`RouterConfig::policy_profile`]).
    pub policy_config_path: Option<String>,
    /// The policy classes of the router's queue; None: one class made of `queue_threshold` and
    /// `queue_policy`.
    pub policy_profile: Option<Arc<PolicyProfile>>,
}

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig {
            overlap_score_credit: 1.0,
            overlap_score_credit_decay: 0.0,
            prefill_load_scale: 1.0,
            decode_active_request_weight: 0.0,
            host_cache_hit_weight: 0.75,
            temperature: 0.0,
            track_active_blocks: true,
            assume_kv_reuse: true,
            track_prefill_tokens: true,
            queue_threshold: None,
            queue_policy: QueuePolicy::Fcfs,
            prefill_load_model: PrefillLoadModel::None,
            policy_config_path: None,
            policy_profile: None,
        }
    }
}

/// A cache-hit weight: Dynamo's range and words.
fn unit_weight(r: &Reader, key: &'static str, v: f64) -> Result<f64> {
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(ConfigError::new(r.path(key), format!("{key} must be between 0 and 1, got {v}")))
    }
}

fn non_negative(r: &Reader, key: &'static str, v: f64) -> Result<f64> {
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(ConfigError::new(r.path(key), format!("must be a finite number ≥ 0, got {v}")))
    }
}

impl RouterConfig {
    pub fn parse_json(text: &str) -> Result<Self> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| ConfigError::new("", format!("invalid JSON: {e}")))?;
        Self::from_value(&value)
    }

    /// Reads a (partial) `KvRouterConfig`; missing keys keep Dynamo's defaults.
    pub fn from_value(value: &Value) -> Result<Self> {
        let mut c = RouterConfig::default();
        let mut r = Reader::new("", value)?;
        if let Some(v) = r.f64("overlap_score_credit")?.set() {
            c.overlap_score_credit = non_negative(&r, "overlap_score_credit", v)?;
        }
        if let Some(v) = r.f64("overlap_score_credit_decay")?.set() {
            c.overlap_score_credit_decay = non_negative(&r, "overlap_score_credit_decay", v)?;
        }
        if let Some(v) = r.f64("prefill_load_scale")?.set() {
            c.prefill_load_scale = non_negative(&r, "prefill_load_scale", v)?;
        }
        // Deprecated alias: it wins over prefill_load_scale, and 0 also turns overlap credit off.
        if let Some(v) = r.f64("overlap_score_weight")?.set() {
            c.prefill_load_scale = non_negative(&r, "overlap_score_weight", v)?;
            if v == 0.0 {
                c.overlap_score_credit = 0.0;
            }
        }
        if let Some(v) = r.f64("decode_active_request_weight")?.set() {
            c.decode_active_request_weight = non_negative(&r, "decode_active_request_weight", v)?;
        }
        if let Some(v) = r.f64("host_cache_hit_weight")?.set() {
            c.host_cache_hit_weight = unit_weight(&r, "host_cache_hit_weight", v)?;
        }
        // Disk and external tiers: nothing in Dynamo 1.6.1's mocker publishes them (its G3 tier
        // sends no KV events), so the weight is checked as Dynamo checks it and changes nothing.
        if let Some(v) = r.f64("disk_cache_hit_weight")?.set() {
            unit_weight(&r, "disk_cache_hit_weight", v)?;
        }
        if let Some(v) = r.f64("router_temperature")?.set() {
            c.temperature = non_negative(&r, "router_temperature", v)?;
        }
        c.track_active_blocks = r.bool("router_track_active_blocks")?.or(true);
        c.assume_kv_reuse = r.bool("router_assume_kv_reuse")?.or(true);
        c.track_prefill_tokens = r.bool("router_track_prefill_tokens")?.or(true);
        if let Some(v) = r.f64("router_queue_threshold")?.set() {
            c.queue_threshold = Some(non_negative(&r, "router_queue_threshold", v)?);
        }
        c.queue_policy = match r.choice("router_queue_policy", &["fcfs", "lcfs", "wspt"])?.or(0) {
            0 => QueuePolicy::Fcfs,
            1 => QueuePolicy::Lcfs,
            _ => QueuePolicy::Wspt,
        };
        // Dynamo 1.6.1 spells the AIS load model `ais`; its documentation (and older releases) `aic`.
        c.prefill_load_model = match r.choice("router_prefill_load_model", &["none", "ais", "aic"])?.or(0) {
            0 => PrefillLoadModel::None,
            _ => PrefillLoadModel::Ais,
        };
        // Accepted with any value: they tune a live deployment, not what is simulated here. Dynamo
        // 1.6.1's offline replay takes them too and runs exactly as without them (probed on a
        // workload whose reference runs are deterministic: every summary value identical).
        for key in [
            "router_replica_sync",
            "router_snapshot_threshold",
            "router_reset_states",
            "router_ttl_secs",
            "router_approximate_cache_policy",
            "router_event_threads",
            "skip_initial_worker_wait",
            "use_remote_indexer",
            "serve_indexer",
        ] {
            r.ignored(key);
        }
        // Dynamo refuses durable KV events ("durable_kv_events=true is not supported by this runtime").
        r.unsupported("durable_kv_events", &[json!(false)], "durable KV events (durable_kv_events: true)")?;
        // Features servesim does not model: only their neutral value is accepted.
        r.unsupported("use_kv_events", &[json!(true)], "approximate routing without KV events (use_kv_events: false)")?;
        r.unsupported("router_track_output_blocks", &[json!(false)], "router_track_output_blocks")?;
        r.unsupported("enable_session_prefix_index", &[json!(false)], "the session prefix index")?;
        r.unsupported("shared_cache_type", &[json!("none")], "shared KV caches")?;
        r.unsupported("shared_cache_multiplier", &[], "shared KV caches")?;
        r.unsupported("router_predicted_ttl_secs", &[], "predict-on-route")?;
        r.unsupported("conditional_disagg_enabled", &[json!(false)], "conditional disaggregation")?;
        for key in [
            "conditional_disagg_policy",
            "conditional_disagg_eff_isl_threshold",
            "conditional_disagg_eff_isl_ratio_threshold",
            "conditional_disagg_prefill_busy_threshold",
            "conditional_disagg_decode_busy_threshold",
        ] {
            r.ignored(key);
        }
        c.policy_config_path = r.string("router_policy_config")?.set().map(str::to_string);
        for key in ["router_prefill_policy", "router_decode_policy"] {
            r.unsupported(key, &[], "separate prefill and decode router policies")?;
        }
        r.unsupported("router_tracking_hash", &[json!("public-xxh3-v1")], "keyed tracking hashes")?;
        r.unsupported("router_tracking_key_file", &[], "keyed tracking hashes")?;
        r.unsupported("router_tracking_key_id", &[], "keyed tracking hashes")?;
        r.finish()?;
        Ok(c)
    }

    /// Whether requests may ever wait in the router's queue.
    pub fn may_queue(&self) -> bool {
        match &self.policy_profile {
            Some(profile) => profile.queueing(),
            None => self.queue_threshold.is_some(),
        }
    }

    /// The router in front of prefill workers in a disaggregated deployment: it balances
    /// prefill work and prefix reuse, not decode blocks.
    pub fn for_prefill(&self) -> Self {
        RouterConfig { track_active_blocks: false, ..self.clone() }
    }

    /// The router in front of decode workers: blind to prefix overlap and to prefill load,
    /// it balances decode blocks without assuming reuse between requests.
    pub fn for_decode(&self) -> Self {
        RouterConfig {
            overlap_score_credit: 0.0,
            assume_kv_reuse: false,
            track_prefill_tokens: false,
            prefill_load_model: PrefillLoadModel::None,
            ..self.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_legacy_weight() {
        let c = RouterConfig::parse_json("{}").unwrap();
        assert_eq!(c, RouterConfig::default());
        let c = RouterConfig::parse_json(r#"{"overlap_score_weight": 2.0, "prefill_load_scale": 5.0}"#).unwrap();
        assert_eq!((c.prefill_load_scale, c.overlap_score_credit), (2.0, 1.0));
        let c = RouterConfig::parse_json(r#"{"overlap_score_weight": 0}"#).unwrap();
        assert_eq!((c.prefill_load_scale, c.overlap_score_credit), (0.0, 0.0));
    }

    #[test]
    fn unknown_and_unsupported_keys_are_named() {
        let e = RouterConfig::parse_json(r#"{"router_temprature": 1}"#).unwrap_err();
        assert_eq!(e.path, "router_temprature");
        let e = RouterConfig::parse_json(r#"{"use_kv_events": false}"#).unwrap_err();
        assert_eq!(e.path, "use_kv_events");
        let e = RouterConfig::parse_json(r#"{"router_queue_policy": "sjf"}"#).unwrap_err();
        assert_eq!(e.path, "router_queue_policy");
        let e = RouterConfig::parse_json(r#"{"router_temperature": -1}"#).unwrap_err();
        assert_eq!(e.path, "router_temperature");
        let e = RouterConfig::parse_json(r#"{"router_prefill_load_model": "aiss"}"#).unwrap_err();
        assert_eq!(e.path, "router_prefill_load_model");
    }

    /// Keys Dynamo's `KvRouterConfig.from_json` takes that only tune a live deployment.
    #[test]
    fn deployment_only_keys_are_accepted() {
        let c = RouterConfig::parse_json(
            r#"{"router_snapshot_threshold": 10, "router_reset_states": true, "skip_initial_worker_wait": true,
                "durable_kv_events": false, "router_replica_sync": true, "router_event_threads": 1}"#,
        )
        .unwrap();
        assert_eq!(c, RouterConfig::default());
        assert_eq!(RouterConfig::parse_json(r#"{"durable_kv_events": true}"#).unwrap_err().path, "durable_kv_events");
    }

    #[test]
    fn cache_hit_weights_are_checked_as_dynamo_checks_them() {
        let c = RouterConfig::parse_json(r#"{"host_cache_hit_weight": 0.5, "disk_cache_hit_weight": 1}"#).unwrap();
        assert_eq!(c.host_cache_hit_weight, 0.5);
        assert_eq!(RouterConfig::default().host_cache_hit_weight, 0.75);
        for (key, value) in
            [("host_cache_hit_weight", "1.5"), ("host_cache_hit_weight", "-0.1"), ("disk_cache_hit_weight", "2")]
        {
            let e = RouterConfig::parse_json(&format!(r#"{{"{key}": {value}}}"#)).unwrap_err();
            assert_eq!(e.path, key);
            assert!(e.message.starts_with(&format!("{key} must be between 0 and 1")), "{}", e.message);
        }
    }

    #[test]
    fn prefill_load_model_spellings() {
        for (text, want) in
            [("none", PrefillLoadModel::None), ("ais", PrefillLoadModel::Ais), ("aic", PrefillLoadModel::Ais)]
        {
            let c = RouterConfig::parse_json(&format!(r#"{{"router_prefill_load_model": "{text}"}}"#)).unwrap();
            assert_eq!(c.prefill_load_model, want);
        }
        let c = RouterConfig::parse_json(r#"{"router_prefill_load_model": "ais"}"#).unwrap();
        assert_eq!(c.for_prefill().prefill_load_model, PrefillLoadModel::Ais);
        assert_eq!(c.for_decode().prefill_load_model, PrefillLoadModel::None, "decode routers track no prefill");
    }
}
