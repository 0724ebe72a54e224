//! Nemotron-H (NVIDIA Nemotron-3 Nano / Super / Ultra) against the reference (aisimulate 0.13,
//! `NemotronHModel`): step times, forward passes and KV capacity. Runs only when the AIS data is
//! installed; otherwise each test prints a notice and passes.
//!
//! The numbers were recorded with the reference venv's python:
//!
//! ```text
//! $AISIM_REF_VENV/bin/python scripts/ais_goldens.py --nemotron-h
//! ```
//!
//! (`static_phase_diagnostics` summed for prefill and for decode at `context − 1`,
//! `estimate_forward_pass_time_ms` for the mixed pass, `estimate_num_gpu_blocks` at 8192 tokens
//! per pass with the backend's block size and default memory fraction).

use serde_json::json;
use servesim_perf::db::Dtype;

mod common;
use common::{data_available, est_with, MIXED};

fn close(got: f64, want: f64) {
    common::close_to(got, want, 1e-6);
}

fn est(model: &str, system: &str, backend: &str, tp: u32, moe_ep: u32) -> std::sync::Arc<servesim_perf::Estimator> {
    est_with(json!({"model": model, "system": system, "backend": backend, "tp": tp, "moe_tp_size": 1,
                    "moe_ep_size": moe_ep}))
}

const NANO: &str = "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16";

/// The layer string and Mamba2 widths as the configs give them; Ultra's depth comes from its
/// `layers_block_type` list (it has no `num_hidden_layers`).
#[test]
fn config_facts() {
    if !data_available("b200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping");
        return;
    }
    let nano = est(NANO, "h200_sxm", "vllm", 1, 1);
    let nh = nano.model.nemotron_h.as_ref().unwrap();
    assert_eq!(nh.counts, [23, 23, 6, 0]);
    assert_eq!((nh.mamba_heads, nh.mamba_head_dim, nh.d_state, nh.d_conv, nh.n_groups), (64, 64, 128, 4, 8));
    assert_eq!((nh.shared_inter, nh.latent), (3712, 0));
    let ultra = est("nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-FP8", "h200_sxm", "vllm", 8, 8);
    let nh = ultra.model.nemotron_h.as_ref().unwrap();
    assert_eq!(ultra.model.layers, 108);
    assert_eq!(nh.counts, [48, 48, 12, 0]);
    assert_eq!(nh.latent, 2048);
    let q = &ultra.layout;
    // ModelOpt FP8: static per-tensor FP8 GEMMs, FP8 experts and KV.
    assert_eq!((q.gemm, q.moe, q.kv), (Dtype::Fp8Static, Dtype::Fp8, Dtype::Fp8));
    // Only the attention layers keep KV: 12 layers × K and V × 1 KV head per GPU × 128 × fp8.
    assert_eq!(ultra.kv_bytes_per_token(), 12.0 * 2.0 * 128.0);
}

/// Step times, forward passes and KV capacity against the reference's op-level estimator:
/// Mamba2 kernels at the roofline where the backend has no `mamba2_perf` rows (vLLM, SGLang) and
/// from the measured conv rows TRT-LLM's shared linear-attention layer carries (the SSM scan has
/// none: roofline), decode kernels always at the roofline; relu² experts (two GEMMs) in the
/// latent width on Super / Ultra; the all-reduce per layer kind.
#[test]
fn timing_goldens() {
    if !data_available("b200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the Nemotron-H goldens");
        return;
    }
    let nano = est(NANO, "h200_sxm", "vllm", 1, 1);
    close(nano.prefill_ms(2, 1000, 0).unwrap(), 33.50753886557718);
    close(nano.prefill_ms(1, 20000, 0).unwrap(), 252.83845161850948);
    close(nano.prefill_ms(2, 3000, 500).unwrap(), 64.85493463847094);
    close(nano.decode_ms(16, 1100).unwrap(), 8.288886056152668);
    close(nano.decode_ms(7, 131072).unwrap(), 7.827872399663228);
    close(nano.forward_pass_time_ms(&[MIXED]).unwrap(), 35.11263770744968);
    assert_eq!(servesim_perf::memory::kv_capacity(&nano, None, 8192, 64, 0.0).unwrap().blocks, 174648);

    let super_fp8 = est("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-FP8", "h200_sxm", "vllm", 2, 2);
    close(super_fp8.prefill_ms(4, 777, 0).unwrap(), 187.3936500466574);
    close(super_fp8.decode_ms(64, 4097).unwrap(), 82.32527528361568);
    close(super_fp8.forward_pass_time_ms(&[MIXED]).unwrap(), 156.42618653060748);
    assert_eq!(servesim_perf::memory::kv_capacity(&super_fp8, None, 8192, 64, 0.0).unwrap().blocks, 535628);

    let super_fp4 = est("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4", "b200_sxm", "sglang", 1, 1);
    close(super_fp4.prefill_ms(2, 1000, 0).unwrap(), 36.46809663335833);
    close(super_fp4.decode_ms(16, 1100).unwrap(), 8.329429553307177);

    let ultra_fp4 = est("nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-NVFP4", "b200_sxm", "sglang", 2, 2);
    close(ultra_fp4.prefill_ms(2, 1000, 0).unwrap(), 73.30897824835935);
    close(ultra_fp4.decode_ms(16, 1100).unwrap(), 15.992133122228605);
    assert_eq!(servesim_perf::memory::kv_capacity(&ultra_fp4, None, 8192, 1, 0.0).unwrap().blocks, 2715455);

    let ultra_fp8 = est("nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-FP8", "h200_sxm", "vllm", 8, 8);
    close(ultra_fp8.prefill_ms(2, 1000, 0).unwrap(), 198.8319489439418);
    close(ultra_fp8.decode_ms(33, 5000).unwrap(), 95.285234184554);
    close(ultra_fp8.forward_pass_time_ms(&[MIXED]).unwrap(), 209.56237650362655);
    assert_eq!(servesim_perf::memory::kv_capacity(&ultra_fp8, None, 8192, 64, 0.0).unwrap().blocks, 306248);

    let trt = est(NANO, "h200_sxm", "trtllm", 1, 1);
    close(trt.prefill_ms(2, 1000, 0).unwrap(), 32.33731571043575);
    close(trt.prefill_ms(1, 20000, 0).unwrap(), 239.57340406186654);
    // Past the conv table's longest sequence (32768): its utilisation held.
    close(trt.prefill_ms(3, 100000, 0).unwrap(), 5832.255747646872);
    close(trt.decode_ms(16, 1100).unwrap(), 8.86453308096221);
}

/// What servesim does not model of Nemotron-H is refused by name.
#[test]
fn unmodelled_parts_are_refused_by_name() {
    if !data_available("b200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping");
        return;
    }
    let e = est_with(json!({"model": NANO, "system": "h200_sxm", "backend": "vllm", "database_mode": "EMPIRICAL"}))
        .decode_ms(4, 1000)
        .unwrap_err()
        .message;
    assert!(e.contains("database_mode EMPIRICAL is not modelled for the Mamba2 kernels"), "{e}");
}
