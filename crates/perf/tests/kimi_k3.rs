//! Kimi-K3 (69 KDA linear-attention and 24 MLA layers, a dense first FFN, LatentMoE with two
//! shared experts) on SGLang and vLLM against the reference estimator (aisimulate
//! 0.13.0.dev202610270000000085, `aisimulate_core` data). The goldens run only when the data is
//! installed; otherwise they print a notice and pass.
//!
//! Every number comes from
//!
//! ```text
//! $AISIM_REF_VENV/bin/python scripts/ais_goldens.py --kimi-k3
//! ```
//!
//! (`static_phase_diagnostics` summed over ops for prefills and decode steps,
//! `estimate_forward_pass_time_ms` for the mixed pass, `estimate_num_gpu_blocks` for KV capacity).
//! Per op, `scripts/ais_ops.py` on these shapes shows every op equal to the last bit.

use serde_json::json;
use servesim_perf::db::Dtype;
use servesim_perf::{estimator, AisConfig};

mod common;
use common::{data_available, est_with, MIXED};

fn close(got: f64, want: f64) {
    common::close_to(got, want, 1e-6);
}

fn cfg(system: &str, tp: u32) -> serde_json::Value {
    json!({"model": "moonshotai/Kimi-K3", "system": system, "backend": "sglang", "tp": tp, "moe_tp_size": 1,
           "moe_ep_size": tp})
}

/// B200 TEP8 (the 12-head KDA shard: decode through the fused kernel's row) and B300 TEP4.
#[test]
fn kimi_k3_step_goldens() {
    if !data_available("b200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the Kimi-K3 goldens");
        return;
    }
    let e = est_with(cfg("b200_sxm", 8));
    let k = e.model.kimi_k3.as_ref().unwrap();
    assert_eq!((k.kda_layers, k.mla_layers, k.kda_heads, k.latent, k.shared_experts), (69, 24, 96, 3584, 2));
    // The checkpoint's MXFP4 experts run with MXFP8 activations on SGLang / Blackwell; the
    // attention, shared experts and dense MLP stay bf16.
    assert_eq!((e.layout.gemm, e.layout.moe, e.layout.kv), (Dtype::Bfloat16, Dtype::W4a8Mxfp4Mxfp8, Dtype::Bfloat16));
    close(e.prefill_ms(2, 1000, 0).unwrap(), 150.82397229963865);
    close(e.prefill_ms(1, 4096, 1024).unwrap(), 188.09566119741118);
    close(e.decode_ms(16, 1100).unwrap(), 23.60497430879474);
    close(e.decode_ms(64, 4097).unwrap(), 36.26328190295111);
    close(e.forward_pass_time_ms(&[MIXED]).unwrap(), 153.84927498815048);
    let e = est_with(cfg("b300_sxm", 4));
    close(e.prefill_ms(4, 777, 0).unwrap(), 242.58474400278973);
    close(e.decode_ms(33, 5000).unwrap(), 40.40139760332397);
}

/// vLLM on H200 TEP16 and B200 TEP8: the FlashKDA prefill kernel, one fused decode kernel for
/// the KDA layers (no separate gated norm), and the MLA layers priced by the MLA module table
/// (its granular fallback where the table has no row).
#[test]
fn kimi_k3_vllm_step_goldens() {
    if !data_available("h200_sxm") || !data_available("b200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the Kimi-K3 vLLM goldens");
        return;
    }
    let vllm = |system: &str, tp: u32| {
        let mut c = cfg(system, tp);
        c["backend"] = json!("vllm");
        est_with(c)
    };
    let e = vllm("h200_sxm", 16);
    close(e.prefill_ms(2, 1000, 0).unwrap(), 561.508484955636);
    close(e.prefill_ms(1, 4096, 1024).unwrap(), 796.4014023235262);
    close(e.decode_ms(16, 1100).unwrap(), 53.45242858959402);
    close(e.decode_ms(64, 4097).unwrap(), 88.91003794808871);
    close(e.forward_pass_time_ms(&[MIXED]).unwrap(), 590.1369312369455);
    let kv = servesim_perf::memory::kv_capacity(&e, None, 8192, 64, 0.0).unwrap();
    assert_eq!(kv.blocks, 16010, "{kv:?}");
    let e = vllm("b200_sxm", 8);
    close(e.prefill_ms(4, 777, 0).unwrap(), 492.7390747391402);
    close(e.decode_ms(33, 5000).unwrap(), 51.177618382145795);
}

/// KV capacity on B300 TEP8: the MLA layers' latent KV only, net of one request's KDA state in
/// its five slots.
#[test]
fn kimi_k3_kv_golden() {
    if !data_available("b300_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the Kimi-K3 KV golden");
        return;
    }
    let e = est_with(cfg("b300_sxm", 8));
    assert_eq!(e.kv_bytes_per_token(), 24.0 * 576.0 * 2.0);
    let k = e.model.kimi_k3.as_ref().unwrap();
    // 69 layers × (12 × 128 × 128 × 4 + 3 × 3 × 12 × 128 × 2) × 5 slots.
    assert_eq!(servesim_perf::kimi_k3::state_bytes_per_request(k, 8), 69.0 * (786432.0 + 27648.0) * 5.0);
    let kv = servesim_perf::memory::kv_capacity(&e, None, 8192, 1, 0.0).unwrap();
    assert_eq!(kv.blocks, 1978149, "{kv:?}");
}

/// DSPARK speculation (`nextn`): the KDA layers verify `nextn + 1` tokens per request (SGLang on
/// B200 through the fused SM100 verify row, on B300 likewise; vLLM on H200 through the Triton
/// chain-verify pair), and the draft model (SGLang's GQA draft, vLLM's MLA-style one) runs
/// beside. Prefill and the mixed pass are those of the plain model, as in the reference.
#[test]
fn kimi_k3_dspark_step_goldens() {
    if !data_available("b200_sxm") || !data_available("h200_sxm") || !data_available("b300_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the Kimi-K3 DSPARK goldens");
        return;
    }
    let spec = |system: &str, backend: &str, tp: u32, nextn: u32| {
        let mut c = cfg(system, tp);
        c["backend"] = json!(backend);
        c["nextn"] = json!(nextn);
        est_with(c)
    };
    let e = spec("b200_sxm", "sglang", 8, 3);
    let names: Vec<String> = e.decode_ops(1, 100).unwrap().into_iter().map(|(n, _)| n).collect();
    for n in ["generation_kda_verify", "draft_qkv_gemm", "draft_attention", "draft_kv_proj_gemm", "draft_logits_gemm"] {
        assert!(names.iter().any(|x| x == n), "{n} missing from {names:?}");
    }
    close(e.prefill_ms(2, 1000, 0).unwrap(), 150.82397229963865);
    close(e.decode_ms(16, 1100).unwrap(), 35.116610699631316);
    close(e.decode_ms(64, 4097).unwrap(), 60.10446583014733);
    close(e.forward_pass_time_ms(&[MIXED]).unwrap(), 153.84927498815048);
    let e = spec("h200_sxm", "vllm", 16, 2);
    close(e.prefill_ms(2, 1000, 0).unwrap(), 561.508484955636);
    close(e.decode_ms(16, 1100).unwrap(), 72.50806193156562);
    close(e.decode_ms(64, 4097).unwrap(), 148.35821570391465);
    close(e.forward_pass_time_ms(&[MIXED]).unwrap(), 590.1369312369455);
    let e = spec("b300_sxm", "sglang", 4, 1);
    close(e.decode_ms(33, 5000).unwrap(), 55.81760592874774);
}

/// KV capacity with DSPARK: the draft's KV beside the MLA latent per token — SGLang's GQA keys
/// and values split over TP8 (5 layers × 2 × 2 heads × 64), vLLM's latent replicated
/// (5 layers × 576).
#[test]
fn kimi_k3_dspark_kv_goldens() {
    if !data_available("b300_sxm") || !data_available("h200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the Kimi-K3 DSPARK KV goldens");
        return;
    }
    let mut c = cfg("b300_sxm", 8);
    c["nextn"] = json!(3);
    let e = est_with(c);
    assert_eq!(e.kv_bytes_per_token(), (24.0 * 576.0 + 5.0 * 2.0 * 2.0 * 64.0) * 2.0);
    let kv = servesim_perf::memory::kv_capacity(&e, None, 8192, 1, 0.0).unwrap();
    assert_eq!(kv.blocks, 1810510, "{kv:?}");
    let mut c = cfg("h200_sxm", 16);
    c["backend"] = json!("vllm");
    c["nextn"] = json!(2);
    let e = est_with(c);
    assert_eq!(e.kv_bytes_per_token(), (24.0 * 576.0 + 5.0 * 576.0) * 2.0);
    let kv = servesim_perf::memory::kv_capacity(&e, None, 8192, 64, 0.0).unwrap();
    assert_eq!(kv.blocks, 13249, "{kv:?}");
}

/// What is not modelled is refused by name: TRT-LLM, ngram drafts, attention DP, and a
/// tensor-parallel size the KDA heads do not divide by.
#[test]
fn kimi_k3_refusals() {
    if !data_available("b200_sxm") {
        return;
    }
    let err = |extra: serde_json::Value| {
        let mut c = cfg("b200_sxm", 8);
        c.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        AisConfig::from_json("config", &c).and_then(|c| estimator(&c)).map(|_| ()).unwrap_err().to_string()
    };
    let e = err(json!({"backend": "trtllm"}));
    assert!(e.contains("Kimi-K3 (KDA + MLA) is timed on backends sglang and vllm only; not trtllm"), "{e}");
    let ngram = json!({"kind": "ngram", "params": {"num_speculative_tokens": 3}});
    let e = err(json!({"backend": "vllm", "speculation": ngram}));
    assert!(e.contains("without ngram drafts (ngram 3)"), "{e}");
    let e = err(json!({"tp": 2, "attention_dp": 4, "moe_ep_size": 8}));
    assert!(e.contains("attention_dp (got 4)"), "{e}");
}
