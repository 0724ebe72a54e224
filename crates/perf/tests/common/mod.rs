//! What the golden test files share: whether the AIS data is installed, building an estimator
//! from a timing config, the mixed forward pass they time, and the relative comparison.
#![allow(dead_code)] // each test binary uses its own subset

use std::sync::Arc;

use servesim_perf::{estimator, AisConfig, Estimator, RankMetrics};

/// Whether the AIS data package holding `system` (e.g. `h200_sxm`) is found.
pub fn data_available(system: &str) -> bool {
    match servesim_perf::systems::systems_roots(&[]) {
        Ok(roots) => roots.iter().any(|(r, _)| r.join(format!("{system}.yaml")).is_file()),
        Err(_) => false,
    }
}

/// The estimator of a timing config (`ForwardPassPerfModelConfig` keys); panics on refusal.
pub fn est_with(cfg: serde_json::Value) -> Arc<Estimator> {
    estimator(&AisConfig::from_json("config", &cfg).unwrap()).unwrap()
}

/// The mixed forward pass the goldens record: 3 prefills of 2000 tokens over 3000 cached, with
/// 100 decodes at 700 KV tokens each.
pub const MIXED: RankMetrics = RankMetrics {
    num_prefill_requests: 3,
    sum_prefill_tokens: 2000,
    sum_prefill_kv_tokens: 3000,
    num_decode_requests: 100,
    sum_decode_kv_tokens: 70000,
};

/// `got` within `rel` of the reference's `want` (absolute below 1).
pub fn close_to(got: f64, want: f64, rel: f64) {
    assert!((got - want).abs() <= rel * want.abs().max(1.0), "got {got}, reference {want}");
}
