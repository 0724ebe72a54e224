//! Goldens against the reference estimator (aisimulate 0.13.0.dev202610270000000085,
//! `aisimulate_core` data). They run only when the data is installed; otherwise each test prints
//! a notice and passes.
//!
//! Produced with the reference venv's python (`/tmp/golden.py`, recorded in
//! crates/perf/README.md): `RustForwardPassPerfModel.best_available(cfg)` then
//! `static_phase_diagnostics(...)` summed over ops (prefill, and decode at
//! `context_length = context − 1`) or `estimate_forward_pass_time_ms` (forward passes).

use serde_json::json;
use servesim_perf::{estimator, AisConfig, RankMetrics};

fn data_available() -> bool {
    match servesim_perf::systems::systems_roots(&[]) {
        Ok(roots) => roots.iter().any(|(r, _)| r.join("h200_sxm.yaml").is_file()),
        Err(_) => false,
    }
}

fn est(model: &str, system: &str, backend: &str, tp: u32) -> std::sync::Arc<servesim_perf::Estimator> {
    let cfg = AisConfig::from_json(
        "config",
        &json!({"model": model, "system": system, "backend": backend, "worker_type": "aggregated", "tp": tp}),
    )
    .unwrap();
    estimator(&cfg).unwrap()
}

fn close(got: f64, want: f64) {
    assert!((got - want).abs() <= 1e-9 * want.abs().max(1.0), "got {got}, reference {want}");
}

#[test]
fn reference_goldens() {
    if !data_available() {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the reference goldens");
        return;
    }
    let q = est("Qwen/Qwen3-32B", "h200_sxm", "vllm", 2);
    close(q.prefill_ms(1, 1024, 0).unwrap(), 53.67781995651973);
    close(q.prefill_ms(2, 2500, 700).unwrap(), 197.72663502776066);
    close(q.prefill_ms(3, 33000, 0).unwrap(), 7844.4516481275905);
    close(q.decode_ms(16, 1100).unwrap(), 13.281420129614514);
    close(q.decode_ms(7, 131072).unwrap(), 40.259631708522);
    let mixed = RankMetrics {
        num_prefill_requests: 3,
        sum_prefill_tokens: 2000,
        sum_prefill_kv_tokens: 3000,
        num_decode_requests: 100,
        sum_decode_kv_tokens: 70000,
    };
    close(q.forward_pass_time_ms(&[mixed]).unwrap(), 116.17427907458445);
    // Attention DP: the slowest rank.
    close(q.forward_pass_time_ms(&[RankMetrics::default(), mixed]).unwrap(), 116.17427907458445);
    let l = est("meta-llama/Meta-Llama-3.1-8B", "h100_sxm", "sglang", 1);
    close(l.prefill_ms(4, 777, 0).unwrap(), 67.63373369897943);
    close(l.decode_ms(256, 8000).unwrap(), 94.34212156827148);
    close(l.decode_ms(1024, 1024).unwrap(), 69.55970436565147);
    let s = est("Qwen/Qwen3-8B", "h100_sxm", "vllm", 4);
    close(s.prefill_ms(1, 20000, 0).unwrap(), 216.40299066515905);
    close(s.decode_ms(33, 5000).unwrap(), 6.250786712240968);
}

#[test]
fn clear_errors_with_real_data() {
    if !data_available() {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping");
        return;
    }
    let bad = |v: serde_json::Value| estimator(&AisConfig::from_json("config", &v).unwrap()).unwrap_err().message;
    let e = bad(json!({"model": "Qwen/Qwen3-8B", "system": "h999", "backend": "vllm"}));
    assert!(e.contains("unknown GPU system \"h999\"") && e.contains("h200_sxm"), "{e}");
    let e = bad(json!({"model": "deepseek-ai/DeepSeek-V3", "system": "h200_sxm", "backend": "vllm"}));
    assert!(e.contains("multi-head latent attention"), "{e}");
    let e = bad(json!({"model": "no/such-model", "system": "h200_sxm", "backend": "vllm"}));
    assert!(e.contains("no--such-model_config.json"), "{e}");
    let e = bad(json!({"model": "Qwen/Qwen3-8B", "system": "h200_sxm", "backend": "vllm", "backend_version": "0.19.0"}));
    assert!(e.contains("not a queryable version") && e.contains("current = 0.24.0"), "{e}");
}

/// `aisimulate_core.sdk.memory.kv_cache.estimate_num_gpu_blocks(model, system, backend,
/// scheduler_block_size=B, max_num_tokens=8192, max_batch_size=256, memory_fraction_kind="of_total",
/// memory_fraction_value=0.9 (vllm) / 0.88 (sglang), tp_size=T)` (recorded with /tmp/kv.py).
#[test]
fn kv_capacity_goldens() {
    if !data_available() {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the KV capacity goldens");
        return;
    }
    use servesim_perf::memory::kv_capacity;
    for (model, system, backend, tp, block, want) in [
        ("Qwen/Qwen3-32B", "h200_sxm", "vllm", 2, 64, 11742u64),
        ("Qwen/Qwen3-8B", "h100_sxm", "vllm", 1, 64, 5979),
        ("Qwen/Qwen3-32B", "h200_sxm", "sglang", 2, 1, 733828),
        ("meta-llama/Meta-Llama-3.1-70B", "h100_sxm", "vllm", 4, 16, 28376),
    ] {
        let e = est(model, system, backend, tp);
        let got = kv_capacity(&e, None, 8192, block, 0.0).unwrap();
        assert_eq!(got.blocks, want, "{model} {system} {backend} tp{tp}: {got:?}");
    }
}
