//! Qwen3-VL's text path (the reference's `QWEN3VL` / `QWEN3VL_MOE` families) against the
//! reference (aisimulate 0.13, `aisimulate_core`): step times, forward passes and KV capacity of
//! the dense and MoE wrappers on each backend, and Qwen3-8B beside Qwen3-VL-8B. Runs only when the
//! AIS data is installed; otherwise each test prints a notice and passes.
//!
//! Numbers recorded with
//!
//! ```text
//! $AISIM_REF_VENV/bin/python scripts/ais_goldens.py --qwen3vl
//! ```
//!
//! (`static_phase_diagnostics` summed for prefill and for decode at `context − 1`,
//! `estimate_forward_pass_time_ms` for the mixed pass, `estimate_num_gpu_blocks` at 8192 tokens
//! per pass with the backend's default fraction of the total memory).

use serde_json::json;

mod common;
use common::{data_available, est_with, MIXED};

fn close(got: f64, want: f64) {
    common::close_to(got, want, 1e-9);
}

fn est(
    model: &str,
    system: &str,
    backend: &str,
    tp: u32,
    moe: Option<(u32, u32)>,
) -> std::sync::Arc<servesim_perf::Estimator> {
    let mut cfg = json!({"model": model, "system": system, "backend": backend, "worker_type": "aggregated", "tp": tp});
    if let Some((moe_tp, moe_ep)) = moe {
        cfg["moe_tp_size"] = json!(moe_tp);
        cfg["moe_ep_size"] = json!(moe_ep);
    }
    est_with(cfg)
}

/// Step times and forward passes: Qwen3's dense and MoE graphs without the Q/K-norm term.
#[test]
fn step_time_goldens() {
    if !data_available("h200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the Qwen3-VL goldens");
        return;
    }
    let vl8 = est("Qwen/Qwen3-VL-8B-Instruct", "h200_sxm", "vllm", 1, None);
    assert!(!vl8.model.qk_norm);
    close(vl8.prefill_ms(4, 1024, 0).unwrap(), 84.95113734562307);
    close(vl8.prefill_ms(2, 3000, 500).unwrap(), 107.44241135187576);
    close(vl8.decode_ms(4, 1025).unwrap(), 5.309529471089007);
    close(vl8.decode_ms(64, 4097).unwrap(), 14.845567920422866);
    close(vl8.forward_pass_time_ms(&[MIXED]).unwrap(), 48.44408059342136);
    // Qwen3-8B, the same widths: 36 layers × 0.026412 ms of Q/K-norm more per pass, both phases.
    let q8 = est("Qwen/Qwen3-8B", "h200_sxm", "vllm", 1, None);
    close(q8.prefill_ms(4, 1024, 0).unwrap(), 85.90195974562306);
    close(q8.decode_ms(4, 1025).unwrap(), 6.260351871089008);

    let vl32 = est("Qwen/Qwen3-VL-32B-Instruct", "h200_sxm", "sglang", 2, None);
    close(vl32.prefill_ms(1, 8192, 0).unwrap(), 500.8245836539557);
    close(vl32.decode_ms(16, 1100).unwrap(), 10.84269940522557);
    let vl2 = est("Qwen/Qwen3-VL-2B-Instruct", "h100_sxm", "trtllm", 1, None);
    close(vl2.prefill_ms(4, 777, 0).unwrap(), 16.889362239988895);
    close(vl2.decode_ms(33, 5000).unwrap(), 8.5312421207254);

    let a3b = est("Qwen/Qwen3-VL-30B-A3B-Instruct", "h200_sxm", "vllm", 2, Some((1, 2)));
    close(a3b.prefill_ms(2, 2500, 700).unwrap(), 45.45197280461286);
    close(a3b.decode_ms(16, 1100).unwrap(), 7.602512099348002);
    close(a3b.forward_pass_time_ms(&[MIXED]).unwrap(), 32.7982819005247);
    let a22b = est("Qwen/Qwen3-VL-235B-A22B-Instruct", "b200_sxm", "sglang", 4, Some((4, 1)));
    close(a22b.prefill_ms(1, 8192, 0).unwrap(), 169.13616575868986);
    close(a22b.decode_ms(64, 4097).unwrap(), 22.880743552489815);
}

/// KV capacity: the text ops' weights (the vision tower is not charged) and the memory model's
/// default activation row (Qwen3-VL-8B holds 7 blocks more than Qwen3-8B on vLLM; SGLang does
/// not charge activations).
#[test]
fn kv_capacity_goldens() {
    if !data_available("h200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the Qwen3-VL KV goldens");
        return;
    }
    use servesim_perf::memory::kv_capacity;
    for (model, system, backend, tp, moe, block, want) in [
        ("Qwen/Qwen3-VL-8B-Instruct", "h200_sxm", "vllm", 1, None, 64, 12233u64),
        ("Qwen/Qwen3-8B", "h200_sxm", "vllm", 1, None, 64, 12226),
        ("Qwen/Qwen3-VL-32B-Instruct", "h200_sxm", "sglang", 2, None, 1, 733828),
        ("Qwen/Qwen3-VL-4B-Instruct", "h100_sxm", "vllm", 1, None, 32, 13575),
        ("Qwen/Qwen3-VL-30B-A3B-Instruct", "h200_sxm", "vllm", 2, Some((1, 2)), 64, 32267),
        ("Qwen/Qwen3-VL-235B-A22B-Instruct", "b200_sxm", "sglang", 4, Some((4, 1)), 1, 1006508),
    ] {
        let e = est(model, system, backend, tp, moe);
        let got = kv_capacity(&e, None, 8192, block, 0.0).unwrap();
        assert_eq!(got.blocks, want, "{model} {system} {backend} tp{tp}: {got:?}");
    }
}
