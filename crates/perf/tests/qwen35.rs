//! Qwen3.5 (Gated DeltaNet linear attention beside gated full attention; dense and MoE) against
//! the reference estimator (aisimulate 0.13.0.dev202610270000000085, `aisimulate_core` data). The
//! goldens run only when the data is installed; otherwise they print a notice and pass.
//!
//! Every number comes from (vLLM, SGLang and TRT-LLM shapes alike)
//!
//! ```text
//! $AISIM_REF_VENV/bin/python scripts/ais_goldens.py --qwen35
//! ```
//!
//! (`RustForwardPassPerfModel.best_available(cfg)`, then `static_phase_diagnostics(...)` summed
//! over ops for prefills and decode steps, `estimate_forward_pass_time_ms` for forward passes,
//! `estimate_num_gpu_blocks` for KV capacity).

use serde_json::json;
use servesim_perf::db::Dtype;
use servesim_perf::model::{build_ops, Op};
use servesim_perf::{estimator, AisConfig, RankMetrics};

mod common;
use common::{data_available, est_with, MIXED};

fn close(got: f64, want: f64) {
    common::close_to(got, want, 1e-6);
}

fn try_est(cfg: serde_json::Value) -> Result<std::sync::Arc<servesim_perf::Estimator>, String> {
    AisConfig::from_json("config", &cfg).and_then(|c| estimator(&c)).map_err(|e| e.to_string())
}
const PREFILL_RANK: RankMetrics =
    RankMetrics { num_prefill_requests: 3, sum_prefill_tokens: 2000, sum_prefill_kv_tokens: 3000, ..MIXED_EMPTY };
const DECODE_RANK: RankMetrics =
    RankMetrics { num_decode_requests: 40, sum_decode_kv_tokens: 40 * 3000, ..MIXED_EMPTY };
const MIXED_EMPTY: RankMetrics = RankMetrics {
    num_prefill_requests: 0,
    sum_prefill_tokens: 0,
    sum_prefill_kv_tokens: 0,
    num_decode_requests: 0,
    sum_decode_kv_tokens: 0,
};

/// Within 1e-6 of the reference (relative).
/// Qwen3.5-27B (dense): 48 GDN and 16 full-attention layers, bf16, H200 / vLLM 0.24.0.
#[test]
fn qwen35_dense_goldens() {
    if !data_available("h200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the Qwen3.5 goldens");
        return;
    }
    let e = est_with(json!({"model": "Qwen/Qwen3.5-27B", "system": "h200_sxm", "backend": "vllm", "tp": 1}));
    let q = e.model.qwen35.as_ref().unwrap();
    assert_eq!((q.linear_layers, q.full_layers, q.k_heads, q.v_heads, q.ssm_dtype), (48, 16, 16, 48, "float32"));
    close(e.prefill_ms(1, 1024, 0).unwrap(), 72.48991457398729);
    close(e.prefill_ms(2, 2500, 700).unwrap(), 255.42296496495084);
    close(e.prefill_ms(1, 20000, 0).unwrap(), 1575.735849159701);
    close(e.decode_ms(16, 1100).unwrap(), 17.640981296754546);
    close(e.decode_ms(7, 131072).unwrap(), 30.21413971210345);
    close(e.forward_pass_time_ms(&[PREFILL_RANK]).unwrap(), 141.85302753117617);
    close(e.forward_pass_time_ms(&[DECODE_RANK]).unwrap(), 21.082195108196213);
    close(e.forward_pass_time_ms(&[MIXED]).unwrap(), 153.4917165079748);
    let kv = servesim_perf::memory::kv_capacity(&e, None, 8192, 64, 0.0).unwrap();
    assert_eq!(kv.blocks, 18489, "{kv:?}");
}

/// Qwen3.5-35B-A3B (MoE, 256 experts + a shared expert), experts split by EP.
#[test]
fn qwen35_moe_goldens() {
    if !data_available("h200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the Qwen3.5 goldens");
        return;
    }
    let e = est_with(json!({"model": "Qwen/Qwen3.5-35B-A3B", "system": "h200_sxm", "backend": "vllm", "tp": 2,
                            "moe_tp_size": 1, "moe_ep_size": 2}));
    close(e.prefill_ms(2, 1000, 0).unwrap(), 28.648696002212407);
    close(e.prefill_ms(2, 3000, 500).unwrap(), 54.04912197926881);
    close(e.decode_ms(16, 1100).unwrap(), 6.91101191844679);
    close(e.decode_ms(64, 4097).unwrap(), 12.081525065557255);
    close(e.forward_pass_time_ms(&[MIXED]).unwrap(), 32.23742084598536);
    let kv = servesim_perf::memory::kv_capacity(&e, None, 8192, 64, 0.0).unwrap();
    assert_eq!(kv.blocks, 148049, "{kv:?}");
}

/// nvidia/Qwen3.5-122B-A10B-NVFP4 on B200: NVFP4 routed experts, while the checkpoint's
/// exclusions keep the GDN / attention projections and the shared experts in bf16; fp8 KV.
#[test]
fn qwen35_nvfp4_goldens() {
    if !data_available("h200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the Qwen3.5 goldens");
        return;
    }
    let e = est_with(json!({"model": "nvidia/Qwen3.5-122B-A10B-NVFP4", "system": "b200_sxm", "backend": "vllm",
                            "tp": 4, "moe_tp_size": 4, "moe_ep_size": 1}));
    assert_eq!(
        (e.layout.gemm, e.layout.shared_gemm, e.layout.moe, e.layout.kv),
        (Dtype::Bfloat16, Dtype::Bfloat16, Dtype::Nvfp4, Dtype::Fp8)
    );
    close(e.prefill_ms(4, 777, 0).unwrap(), 28.106158112034947);
    close(e.decode_ms(33, 5000).unwrap(), 5.898480106989527);
    close(e.forward_pass_time_ms(&[MIXED]).unwrap(), 25.373719489533848);
    let kv = servesim_perf::memory::kv_capacity(&e, None, 8192, 64, 0.0).unwrap();
    assert_eq!(kv.blocks, 380482, "{kv:?}");
}

/// SGLang 0.5.14: no MoE pre-dispatch, the shared expert's scalar gate fused into the merge,
/// decode overlapping the shared and routed experts (H200, and B200 where the fp32 state keeps
/// the decode recurrence on the FLA rows).
#[test]
fn qwen35_sglang_goldens() {
    if !data_available("h200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the Qwen3.5 goldens");
        return;
    }
    let e = est_with(json!({"model": "Qwen/Qwen3.5-27B", "system": "h200_sxm", "backend": "sglang", "tp": 1}));
    close(e.prefill_ms(1, 1024, 0).unwrap(), 83.02554492672037);
    close(e.prefill_ms(2, 2500, 700).unwrap(), 300.3187275309696);
    close(e.decode_ms(16, 1100).unwrap(), 16.870911026855346);
    close(e.decode_ms(7, 131072).unwrap(), 29.69678894770013);
    close(e.forward_pass_time_ms(&[MIXED]).unwrap(), 174.35037667957627);
    let kv = servesim_perf::memory::kv_capacity(&e, None, 8192, 1, 0.0).unwrap();
    assert_eq!(kv.blocks, 1149302, "{kv:?}");

    let e = est_with(json!({"model": "Qwen/Qwen3.5-35B-A3B", "system": "h200_sxm", "backend": "sglang", "tp": 2,
                            "moe_tp_size": 1, "moe_ep_size": 2}));
    close(e.prefill_ms(2, 1000, 0).unwrap(), 30.674200379643153);
    close(e.prefill_ms(2, 3000, 500).unwrap(), 60.088094207309034);
    close(e.decode_ms(16, 1100).unwrap(), 6.091469208328157);
    close(e.decode_ms(64, 4097).unwrap(), 10.969357064827674);
    close(e.forward_pass_time_ms(&[MIXED]).unwrap(), 32.89867179342338);
    let kv = servesim_perf::memory::kv_capacity(&e, None, 8192, 1, 0.0).unwrap();
    assert_eq!(kv.blocks, 9202463, "{kv:?}");

    let e = est_with(json!({"model": "Qwen/Qwen3.5-35B-A3B", "system": "b200_sxm", "backend": "sglang", "tp": 4,
                            "moe_tp_size": 4, "moe_ep_size": 1}));
    close(e.prefill_ms(4, 777, 0).unwrap(), 17.05855831898214);
    close(e.decode_ms(33, 5000).unwrap(), 4.96578395693196);
}

/// TRT-LLM 1.3.0rc20 (and rc23, which reads rc20's GDN rows): the reference's pre-dispatch
/// all-reduces the attention output a second time, and decode runs the shared expert after the
/// routed chain.
#[test]
fn qwen35_trtllm_goldens() {
    if !data_available("h200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the Qwen3.5 goldens");
        return;
    }
    let e = est_with(json!({"model": "Qwen/Qwen3.5-27B", "system": "h200_sxm", "backend": "trtllm", "tp": 2}));
    close(e.prefill_ms(1, 1024, 0).unwrap(), 47.74816309142346);
    close(e.prefill_ms(2, 2500, 700).unwrap(), 159.11202170073753);
    close(e.decode_ms(16, 1100).unwrap(), 10.082352982113536);
    close(e.forward_pass_time_ms(&[MIXED]).unwrap(), 96.66217094220511);
    let kv = servesim_perf::memory::kv_capacity(&e, None, 8192, 32, 0.0).unwrap();
    assert_eq!(kv.blocks, 102737, "{kv:?}");

    let e = est_with(json!({"model": "Qwen/Qwen3.5-35B-A3B", "system": "b200_sxm", "backend": "trtllm", "tp": 2,
                            "moe_tp_size": 1, "moe_ep_size": 2}));
    close(e.prefill_ms(2, 1000, 0).unwrap(), 19.410987944649065);
    close(e.prefill_ms(2, 3000, 500).unwrap(), 36.59458005387357);
    close(e.decode_ms(16, 1100).unwrap(), 5.883823123751624);
    close(e.decode_ms(64, 4097).unwrap(), 8.537496544434761);
    close(e.forward_pass_time_ms(&[MIXED]).unwrap(), 21.35224655527363);
    let kv = servesim_perf::memory::kv_capacity(&e, None, 8192, 32, 0.0).unwrap();
    assert_eq!(kv.blocks, 423077, "{kv:?}");

    let e = est_with(json!({"model": "nvidia/Qwen3.5-122B-A10B-NVFP4", "system": "b200_sxm", "backend": "trtllm",
                            "tp": 4, "moe_tp_size": 4, "moe_ep_size": 1}));
    close(e.prefill_ms(4, 777, 0).unwrap(), 47.1029137669617);
    close(e.decode_ms(33, 5000).unwrap(), 6.197779193057692);
    close(e.forward_pass_time_ms(&[MIXED]).unwrap(), 38.27558029366515);

    let e = est_with(json!({"model": "Qwen/Qwen3.5-35B-A3B", "system": "h200_sxm", "backend": "trtllm",
                            "backend_version": "1.3.0rc23", "tp": 2, "moe_tp_size": 1, "moe_ep_size": 2}));
    close(e.prefill_ms(2, 1000, 0).unwrap(), 28.99516440776311);
    close(e.decode_ms(16, 1100).unwrap(), 6.874280497791997);
}

/// The op list's shape: one GDN chain and one full-attention chain, scaled by their layer
/// counts, and what is refused by name.
#[test]
fn qwen35_op_list_and_refusals() {
    if !data_available("h200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the Qwen3.5 op list");
        return;
    }
    let e = est_with(json!({"model": "Qwen/Qwen3.5-35B-A3B", "system": "h200_sxm", "backend": "vllm", "tp": 2,
                            "moe_tp_size": 1, "moe_ep_size": 2}));
    let (ctx, gen) = build_ops(&e.model, &e.layout).unwrap();
    let find =
        |ops: &[Op], name: &str| ops.iter().find(|o| o.name() == name).cloned().unwrap_or_else(|| panic!("no {name}"));
    match find(&ctx, "context_gdn_scan") {
        Op::Gdn(g) => assert_eq!(
            (g.kernel, g.scale, g.k_heads, g.v_heads, g.hidden),
            ("chunk_gated_delta_rule", 30.0, 8, 16, 2048)
        ),
        other => panic!("{other:?}"),
    }
    match find(&gen, "generation_gdn_recurrence") {
        Op::Gdn(g) => assert_eq!(g.kernel, "fused_sigmoid_gating_delta_rule_update"),
        other => panic!("{other:?}"),
    }
    // The query slice doubled by the output gate: 2 · 8 · 256 + 2 · 1 · 256.
    assert!(matches!(find(&ctx, "context_qkv_gemm"), Op::Gemm { n: 4608, k: 2048, scale, .. } if scale == 10.0));
    assert!(matches!(find(&gen, "generation_full_moe_overlap"), Op::Overlap { .. }));
    assert!(matches!(find(&ctx, "context_gdn_shared_expert_gate_gemm"), Op::SmallGemm(g) if g.n == 1));
    assert!(!ctx.iter().chain(&gen).any(|o| o.name().ends_with("_moe_pre_dispatch")));

    // SGLang: the scalar gate lives in the merge kernel (hidden + shared + routed in, one out),
    // no pre-dispatch, decode still overlapped.
    let base = json!({"model": "Qwen/Qwen3.5-35B-A3B", "system": "h200_sxm", "backend": "sglang", "backend_version": "0.5.14",
                      "tp": 2, "moe_tp_size": 1, "moe_ep_size": 2});
    let e = est_with(base.clone());
    let (ctx, gen) = build_ops(&e.model, &e.layout).unwrap();
    assert!(!ctx
        .iter()
        .chain(&gen)
        .any(|o| o.name().contains("shared_expert_gate") || o.name().contains("pre_dispatch")));
    assert!(
        matches!(find(&ctx, "context_gdn_shared_merge"), Op::Elementwise { bytes_per_token, .. } if bytes_per_token == 4.0 * 2048.0 * 2.0)
    );
    assert!(matches!(find(&gen, "generation_full_moe_overlap"), Op::Overlap { .. }));

    // TRT-LLM: a pre-dispatch in both phases, the shared expert serial in decode.
    let mut trt = base.clone();
    trt["backend"] = json!("trtllm");
    trt["backend_version"] = json!("1.3.0rc20");
    let e = est_with(trt);
    let (ctx, gen) = build_ops(&e.model, &e.layout).unwrap();
    assert!(matches!(find(&ctx, "context_gdn_moe_pre_dispatch"), Op::MoeDispatch(d) if d.pre));
    assert!(matches!(find(&gen, "generation_full_moe_pre_dispatch"), Op::MoeDispatch(d) if d.pre));
    assert!(!gen.iter().any(|o| matches!(o, Op::Overlap { .. })));
    assert!(matches!(find(&gen, "generation_gdn_shared_expert_gate_gemm"), Op::SmallGemm(g) if g.n == 1));

    // SGLang with attention DP: the attention all-reduce folds into the pre-dispatch gather,
    // which runs ahead of the decode overlap.
    let mut dp = base;
    dp["backend"] = json!("sglang");
    dp.as_object_mut().unwrap().remove("backend_version");
    dp["attention_dp"] = json!(2);
    dp["moe_ep_size"] = json!(4);
    let e = est_with(dp);
    let (ctx, gen) = build_ops(&e.model, &e.layout).unwrap();
    assert!(!ctx.iter().any(|o| o.name() == "context_gdn_ar" || o.name() == "context_full_ar"));
    assert!(matches!(find(&ctx, "context_gdn_moe_pre_dispatch"), Op::MoeDispatch(d) if d.pre));
    assert!(matches!(find(&gen, "generation_full_moe_pre_dispatch"), Op::MoeDispatch(d) if d.pre));

    let refused = |cfg: serde_json::Value| try_est(cfg).map(|_| ()).unwrap_err();
    let err = refused(json!({"model": "Qwen/Qwen3.5-27B", "system": "h200_sxm", "backend": "vllm", "tp": 32}));
    assert!(err.contains("heads"), "{err}");
}

/// Attention DP on every backend (`ais_goldens.py --qwen35-dp`): vLLM's pre-dispatch gathers the
/// ranks' tokens (the model prices the attention all-reduce, so the dispatch adds none), SGLang
/// folds the attention all-reduce into that gather, TRT-LLM prices its pre-dispatch as without
/// DP; pure DEP and attention TP × DP, and the dense model.
#[test]
fn qwen35_attention_dp_goldens() {
    if !data_available("h200_sxm") || !data_available("b200_sxm") {
        eprintln!(
            "NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the Qwen3.5 attention-DP goldens"
        );
        return;
    }
    let moe = |system: &str, backend: &str, tp: u32, dp: u32, ep: u32| {
        est_with(json!({"model": "Qwen/Qwen3.5-35B-A3B", "system": system, "backend": backend, "tp": tp,
                        "attention_dp": dp, "moe_tp_size": 1, "moe_ep_size": ep}))
    };
    let e = moe("h200_sxm", "vllm", 1, 2, 2);
    close(e.prefill_ms(2, 1000, 0).unwrap(), 39.76430987345183);
    close(e.prefill_ms(2, 3000, 500).unwrap(), 82.37236103244666);
    close(e.decode_ms(16, 1100).unwrap(), 8.686829763750591);
    close(e.decode_ms(64, 4097).unwrap(), 14.56516250843405);
    close(e.forward_pass_time_ms(&[MIXED, DECODE_RANK]).unwrap(), 44.07543932516213);
    let e = moe("h200_sxm", "vllm", 2, 2, 4);
    close(e.prefill_ms(2, 1000, 0).unwrap(), 34.080690641227605);
    close(e.decode_ms(16, 1100).unwrap(), 7.195187881371747);
    let e = moe("h200_sxm", "sglang", 1, 4, 4);
    close(e.prefill_ms(2, 1000, 0).unwrap(), 57.32765911237481);
    close(e.prefill_ms(2, 3000, 500).unwrap(), 139.5172951020778);
    close(e.decode_ms(16, 1100).unwrap(), 8.127425941950763);
    close(e.decode_ms(64, 4097).unwrap(), 13.179119858393332);
    close(e.forward_pass_time_ms(&[MIXED, DECODE_RANK, PREFILL_RANK, MIXED]).unwrap(), 62.166526909120876);
    let e = moe("h200_sxm", "sglang", 2, 2, 4);
    close(e.prefill_ms(2, 1000, 0).unwrap(), 36.235092541560846);
    close(e.decode_ms(16, 1100).unwrap(), 6.551030905906588);
    let e = moe("b200_sxm", "trtllm", 1, 2, 2);
    close(e.prefill_ms(2, 1000, 0).unwrap(), 26.3568831004359);
    close(e.decode_ms(16, 1100).unwrap(), 7.150408260474439);
    let e = est_with(json!({"model": "Qwen/Qwen3.5-27B", "system": "h200_sxm", "backend": "vllm", "tp": 1,
                            "attention_dp": 2}));
    close(e.prefill_ms(2, 1000, 0).unwrap(), 140.71477360872115);
    close(e.decode_ms(16, 1100).unwrap(), 17.640981296754546);
}
