//! Large expert parallelism (the reference's large-EP MoE graph, `moe_a2a.rs`): per-op and
//! per-pass prefill times against aisimulate 0.13.0.dev202610270000000085. They run only when
//! the data is installed; otherwise each test prints a notice and passes.
//!
//! Every number comes from `$AISIM_REF_VENV/bin/python scripts/ais_wide_ep_goldens.py`: the
//! reference model built with `ModelConfig.moe_comm_backend = {"context": "deepep_ht"}` (as its
//! Task enumerator sets it; the forward-pass config has no such key) and the per-op context
//! latencies of the vLLM backend's static breakdown at `(batch, isl, prefix)`.

use serde_json::json;
use servesim_perf::{estimator, AisConfig};

mod common;
use common::data_available;

fn config(system: &str, tp: u32, dp: u32, ep: u32, large_ep: bool, slots: u32) -> serde_json::Value {
    let mut cfg = json!({"model": "MiniMaxAI/MiniMax-M2.7", "system": system, "backend": "vllm",
                         "worker_type": "aggregated", "tp": tp, "attention_dp": dp, "moe_tp_size": 1,
                         "moe_ep_size": ep});
    if large_ep {
        cfg["moe_comm_backend"] = json!({"context": "deepep_ht"});
    }
    if slots > 0 {
        cfg["wideep_num_slots"] = json!(slots);
    }
    cfg
}

type Case = ((&'static str, u32, u32, u32, bool, u32), (u32, u32, u32), f64, &'static [(&'static str, f64)]);

/// `((system, tp, attention dp, moe_ep, large EP, wideep_num_slots), (batch, isl, prefix),
/// reference total, reference ops)`; MiniMax-M2.7 (fp8 blocks) on vLLM 0.24.0.
#[rustfmt::skip]
const CASES: &[Case] = &[
    (("h200_sxm", 1, 8, 8, true, 0), (2, 3000, 0), 615.1018362691644, &[("context_embedding", 0.0126), ("context_add_norm_1", 2.5667999999999997), ("context_qkv_gemm", 15.878406955765863), ("context_attention", 35.389270339962785), ("context_proj_gemm", 15.87833295840816), ("context_add_norm_2", 2.5667999999999997), ("context_router_gemm", 1.119940291562614), ("context_moe_dispatch", 63.13023091671057), ("context_moe", 398.66078943014145), ("context_moe_combine", 79.89866537661293), ("context_embedding_ar", 0.0), ("context_p2p", 0.0)]),
    (("h200_sxm", 1, 8, 8, true, 0), (1, 100, 0), 48.21988775230421, &[("context_embedding", 0.00316), ("context_add_norm_1", 0.22568), ("context_qkv_gemm", 0.9176660994688669), ("context_attention", 3.614232196111347), ("context_proj_gemm", 1.0511892999211947), ("context_add_norm_2", 0.22568), ("context_router_gemm", 0.3882908549573686), ("context_moe_dispatch", 22.79607324562967), ("context_moe", 12.660003262758254), ("context_moe_combine", 6.337912793457508), ("context_embedding_ar", 0.0), ("context_p2p", 0.0)]),
    (("h200_sxm", 1, 8, 8, true, 0), (4, 1000, 500), 214.92458783744019, &[("context_embedding", 0.0062), ("context_add_norm_1", 0.9795999999999999), ("context_qkv_gemm", 5.674115793611489), ("context_attention", 12.164395965114341), ("context_proj_gemm", 5.270363667899487), ("context_add_norm_2", 0.9795999999999999), ("context_router_gemm", 0.517528974970961), ("context_moe_dispatch", 29.33189315414056), ("context_moe", 131.9215709745884), ("context_moe_combine", 28.07931930711493), ("context_embedding_ar", 0.0), ("context_p2p", 0.0)]),
    (("h200_sxm", 1, 8, 8, true, 0), (16, 8192, 0), 13991.90140294882, &[("context_embedding", 0.2127152), ("context_add_norm_1", 52.1953696), ("context_qkv_gemm", 339.1409823099772), ("context_attention", 1481.8425883905338), ("context_proj_gemm", 313.03156153361), ("context_add_norm_2", 52.1953696), ("context_router_gemm", 17.778844833374023), ("context_moe_dispatch", 1363.746448135376), ("context_moe", 8708.87783203125), ("context_moe_combine", 1662.8796913146975), ("context_embedding_ar", 0.0), ("context_p2p", 0.0)]),
    (("h200_sxm", 2, 4, 8, true, 288), (2, 3000, 0), 322.03696027166706, &[("context_embedding", 0.0126), ("context_add_norm_1", 2.5667999999999997), ("context_qkv_gemm", 9.483154657856504), ("context_attention", 21.06844058746156), ("context_proj_gemm", 8.370295939464542), ("context_add_norm_2", 2.5667999999999997), ("context_router_gemm", 1.119940291562614), ("context_moe_dispatch", 36.9683822964551), ("context_moe", 199.33039471507072), ("context_moe_combine", 40.39191576628946), ("context_embedding_ar", 0.15823601750656963), ("context_p2p", 0.0)]),
    (("h200_sxm", 2, 4, 8, true, 288), (1, 100, 0), 50.6189070752015, &[("context_embedding", 0.00316), ("context_add_norm_1", 0.22568), ("context_qkv_gemm", 0.7862591817975044), ("context_attention", 3.5810370718791202), ("context_proj_gemm", 0.7139754523833592), ("context_add_norm_2", 0.22568), ("context_router_gemm", 0.3882908549573686), ("context_moe_dispatch", 27.440108785778285), ("context_moe", 11.21322101354599), ("context_moe_combine", 6.034794774837792), ("context_embedding_ar", 0.006699940022081136), ("context_p2p", 0.0)]),
    (("h200_sxm", 2, 4, 8, true, 288), (4, 1000, 500), 115.68220547581438, &[("context_embedding", 0.0062), ("context_add_norm_1", 0.9795999999999999), ("context_qkv_gemm", 3.4592711781754213), ("context_attention", 8.583703988855417), ("context_proj_gemm", 2.876434277670056), ("context_add_norm_2", 0.9795999999999999), ("context_router_gemm", 0.517528974970961), ("context_moe_dispatch", 17.749883872969075), ("context_moe", 65.68619724214076), ("context_moe_combine", 14.785186473978683), ("context_embedding_ar", 0.05859946705400944), ("context_p2p", 0.0)]),
    (("h200_sxm", 2, 4, 8, true, 288), (16, 8192, 0), 7117.070772667534, &[("context_embedding", 0.2127152), ("context_add_norm_1", 52.1953696), ("context_qkv_gemm", 195.84196154276532), ("context_attention", 765.2044819638216), ("context_proj_gemm", 163.42075570424396), ("context_add_norm_2", 52.1953696), ("context_router_gemm", 17.778844833374023), ("context_moe_dispatch", 681.873224067688), ("context_moe", 4354.438916015625), ("context_moe_combine", 831.4398456573487), ("context_embedding_ar", 2.4692884826660153), ("context_p2p", 0.0)]),
    (("b200_sxm", 1, 8, 8, true, 0), (2, 3000, 0), 577.368613030465, &[("context_embedding", 0.008984415584415586), ("context_add_norm_1", 1.670135064935065), ("context_qkv_gemm", 7.815922415814404), ("context_attention", 18.75047191634241), ("context_proj_gemm", 7.245770551895033), ("context_add_norm_2", 1.670135064935065), ("context_router_gemm", 0.5523587466351517), ("context_moe_dispatch", 96.64625350367277), ("context_moe", 315.80707132816315), ("context_moe_combine", 127.2015100224875), ("context_embedding_ar", 0.0), ("context_p2p", 0.0)]),
    (("b200_sxm", 1, 8, 8, true, 0), (1, 100, 0), 40.68233486801205, &[("context_embedding", 0.00309974025974026), ("context_add_norm_1", 0.2107355844155844), ("context_qkv_gemm", 1.2376852879921594), ("context_attention", 3.276393831720064), ("context_proj_gemm", 1.2319317519664763), ("context_add_norm_2", 0.2107355844155844), ("context_router_gemm", 0.34681421717007954), ("context_moe_dispatch", 17.802134485729038), ("context_moe", 9.435903880000113), ("context_moe_combine", 6.9269005043432115), ("context_embedding_ar", 0.0), ("context_p2p", 0.0)]),
    (("b200_sxm", 1, 8, 8, true, 0), (4, 1000, 500), 206.13658297790633, &[("context_embedding", 0.004994805194805194), ("context_add_norm_1", 0.6807116883116884), ("context_qkv_gemm", 3.0237403593811334), ("context_attention", 7.564261762832133), ("context_proj_gemm", 2.8885056942116982), ("context_add_norm_2", 0.6807116883116884), ("context_router_gemm", 0.3895571030432882), ("context_moe_dispatch", 39.754706806410105), ("context_moe", 106.07784506678581), ("context_moe_combine", 45.07154800342396), ("context_embedding_ar", 0.0), ("context_p2p", 0.0)]),
    (("b200_sxm", 1, 8, 8, true, 0), (16, 8192, 0), 12842.288711669202, &[("context_embedding", 0.13373155324675323), ("context_add_norm_1", 32.6074252051948), ("context_qkv_gemm", 161.85471630096436), ("context_attention", 602.8582464153163), ("context_proj_gemm", 146.16525109608966), ("context_add_norm_2", 32.6074252051948), ("context_router_gemm", 10.831477660773698), ("context_moe_dispatch", 1918.821265411377), ("context_moe", 6898.910742187501), ("context_moe_combine", 3037.498430633545), ("context_embedding_ar", 0.0), ("context_p2p", 0.0)]),
    (("h200_sxm", 1, 16, 16, true, 0), (2, 3000, 0), 726.0066639831308, &[("context_embedding", 0.0126), ("context_add_norm_1", 2.5667999999999997), ("context_qkv_gemm", 15.878406955765863), ("context_attention", 35.389270339962785), ("context_proj_gemm", 15.87833295840816), ("context_add_norm_2", 2.5667999999999997), ("context_router_gemm", 1.119940291562614), ("context_moe_dispatch", 63.13023091671057), ("context_moe", 509.5656171441078), ("context_moe_combine", 79.89866537661293), ("context_embedding_ar", 0.0), ("context_p2p", 0.0)]),
    (("h200_sxm", 1, 16, 16, true, 0), (1, 100, 0), 47.18880290783419, &[("context_embedding", 0.00316), ("context_add_norm_1", 0.22568), ("context_qkv_gemm", 0.9176660994688669), ("context_attention", 3.614232196111347), ("context_proj_gemm", 1.0511892999211947), ("context_add_norm_2", 0.22568), ("context_router_gemm", 0.3882908549573686), ("context_moe_dispatch", 22.79607324562967), ("context_moe", 11.62891841828823), ("context_moe_combine", 6.337912793457508), ("context_embedding_ar", 0.0), ("context_p2p", 0.0)]),
    (("h200_sxm", 1, 16, 16, true, 0), (4, 1000, 500), 252.8582225775544, &[("context_embedding", 0.0062), ("context_add_norm_1", 0.9795999999999999), ("context_qkv_gemm", 5.674115793611489), ("context_attention", 12.164395965114341), ("context_proj_gemm", 5.270363667899487), ("context_add_norm_2", 0.9795999999999999), ("context_router_gemm", 0.517528974970961), ("context_moe_dispatch", 29.33189315414056), ("context_moe", 169.85520571470263), ("context_moe_combine", 28.07931930711493), ("context_embedding_ar", 0.0), ("context_p2p", 0.0)]),
    (("h200_sxm", 1, 16, 16, true, 0), (16, 8192, 0), 16414.65433263632, &[("context_embedding", 0.2127152), ("context_add_norm_1", 52.1953696), ("context_qkv_gemm", 339.1409823099772), ("context_attention", 1481.8425883905338), ("context_proj_gemm", 313.03156153361), ("context_add_norm_2", 52.1953696), ("context_router_gemm", 17.778844833374023), ("context_moe_dispatch", 1363.746448135376), ("context_moe", 11131.63076171875), ("context_moe_combine", 1662.8796913146975), ("context_embedding_ar", 0.0), ("context_p2p", 0.0)]),
    (("h200_sxm", 1, 8, 8, false, 0), (2, 3000, 0), 569.4937228274033, &[("context_embedding", 0.0126), ("context_add_norm_1", 2.5667999999999997), ("context_qkv_gemm", 15.878406955765863), ("context_attention", 35.389270339962785), ("context_proj_gemm", 15.87833295840816), ("context_add_norm_2", 2.5667999999999997), ("context_router_gemm", 1.119940291562614), ("context_moe_pre_dispatch", 48.868263164062505), ("context_moe", 398.66078943014145), ("context_moe_post_dispatch", 48.5525196875), ("context_embedding_ar", 0.0), ("context_p2p", 0.0)]),
    (("h200_sxm", 1, 8, 8, false, 0), (1, 100, 0), 23.38229827571703, &[("context_embedding", 0.00316), ("context_add_norm_1", 0.22568), ("context_qkv_gemm", 0.9176660994688669), ("context_attention", 3.614232196111347), ("context_proj_gemm", 1.0511892999211947), ("context_add_norm_2", 0.22568), ("context_router_gemm", 0.3882908549573686), ("context_moe_pre_dispatch", 2.3149734375), ("context_moe", 12.660003262758254), ("context_moe_post_dispatch", 1.9814231249999998), ("context_embedding_ar", 0.0), ("context_p2p", 0.0)]),
    (("h200_sxm", 1, 8, 8, false, 0), (4, 1000, 500), 193.0473167043097, &[("context_embedding", 0.0062), ("context_add_norm_1", 0.9795999999999999), ("context_qkv_gemm", 5.674115793611489), ("context_attention", 12.164395965114341), ("context_proj_gemm", 5.270363667899487), ("context_add_norm_2", 0.9795999999999999), ("context_router_gemm", 0.517528974970961), ("context_moe_pre_dispatch", 17.932509453125), ("context_moe", 131.9215709745884), ("context_moe_post_dispatch", 17.601431875), ("context_embedding_ar", 0.0), ("context_p2p", 0.0)]),
    (("h200_sxm", 1, 8, 8, false, 0), (16, 8192, 0), 13038.356863498746, &[("context_embedding", 0.2127152), ("context_add_norm_1", 52.1953696), ("context_qkv_gemm", 339.1409823099772), ("context_attention", 1481.8425883905338), ("context_proj_gemm", 313.03156153361), ("context_add_norm_2", 52.1953696), ("context_router_gemm", 17.778844833374023), ("context_moe_pre_dispatch", 1035.8265600000002), ("context_moe", 8708.87783203125), ("context_moe_post_dispatch", 1037.25504), ("context_embedding_ar", 0.0), ("context_p2p", 0.0)]),
];

fn rel(got: f64, want: f64) -> f64 {
    if want == 0.0 {
        got.abs()
    } else {
        ((got - want) / want).abs()
    }
}

#[test]
fn large_ep_context_matches_the_reference_per_op() {
    if !data_available("h200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the large-EP goldens");
        return;
    }
    let mut worst = 0f64;
    for ((system, tp, dp, ep, large_ep, slots), (b, isl, prefix), total, ops) in CASES {
        let cfg = config(system, *tp, *dp, *ep, *large_ep, *slots);
        let e = estimator(&AisConfig::from_json("config", &cfg).unwrap()).unwrap();
        let ours = e.prefill_ops(*b, *isl, *prefix).unwrap();
        let names: Vec<&str> = ours.iter().map(|(n, _)| n.as_str()).collect();
        let want: Vec<&str> = ops.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, want, "{cfg}: op list");
        for ((name, got), (_, want)) in ours.iter().zip(ops.iter()) {
            assert!(rel(*got, *want) <= 1e-6, "{cfg} {b}x{isl}+{prefix} {name}: {got}, reference {want}");
            worst = worst.max(rel(*got, *want));
        }
        let got = e.prefill_ms(*b, *isl, *prefix).unwrap();
        assert!(rel(got, *total) <= 1e-6, "{cfg} {b}x{isl}+{prefix}: {got}, reference {total}");
        worst = worst.max(rel(got, *total));
    }
    eprintln!("large-EP goldens: {} passes, largest relative difference {worst:e}", CASES.len());
}

/// The large-EP weights are the fused block's at `moe_tp = 1` (the reference prices the expert
/// compute by its expert count, not by `wideep_num_slots`): the same KV capacity.
#[test]
fn large_ep_keeps_the_fused_kv_capacity() {
    if !data_available("h200_sxm") {
        eprintln!("NOTICE: AIS data not installed; skipping");
        return;
    }
    use servesim_perf::memory::kv_capacity;
    let fused = estimator(&AisConfig::from_json("config", &config("h200_sxm", 1, 8, 8, false, 0)).unwrap()).unwrap();
    let wide = estimator(&AisConfig::from_json("config", &config("h200_sxm", 1, 8, 8, true, 288)).unwrap()).unwrap();
    let (a, b) = (kv_capacity(&fused, None, 8192, 64, 0.0).unwrap(), kv_capacity(&wide, None, 8192, 64, 0.0).unwrap());
    assert_eq!(a.blocks, b.blocks);
}

/// Under EPLB DeepEP prefill routes at `power_law_0.6`, which vLLM's `moe_perf` lacks (nor has
/// it the `uniform` fallback for this shape): the reference fails with a missing-data error
/// naming the key, and so does servesim.
#[test]
fn large_ep_eplb_refuses_like_the_reference_for_want_of_data() {
    if !data_available("h200_sxm") {
        eprintln!("NOTICE: AIS data not installed; skipping");
        return;
    }
    let mut cfg = config("h200_sxm", 1, 8, 8, true, 0);
    cfg["enable_eplb"] = json!(true);
    let e = estimator(&AisConfig::from_json("config", &cfg).unwrap()).unwrap();
    let err = e.prefill_ms(2, 3000, 0).unwrap_err().message;
    assert!(err.contains("context_moe") && err.contains("power_law_0.6 or uniform"), "{err}");
}

/// What is not modelled is refused by name, with what it needs; never a silent fused graph.
#[test]
fn large_ep_refusals_name_what_is_missing() {
    let parse = |extra: serde_json::Value, backend: &str| {
        let mut cfg = json!({"model": "MiniMaxAI/MiniMax-M2.7", "system": "h200_sxm", "backend": backend,
                             "tp": 1, "attention_dp": 8, "moe_tp_size": 1, "moe_ep_size": 8});
        for (k, v) in extra.as_object().unwrap() {
            cfg[k] = v.clone();
        }
        AisConfig::from_json("config", &cfg).map(|_| ()).map_err(|e| e.message)
    };
    let e = parse(json!({"moe_comm_backend": {"generation": "deepep_ll"}}), "vllm").unwrap_err();
    assert!(e.contains("moe_comm_backend.generation") && e.contains("Monte Carlo"), "{e}");
    let e = parse(json!({"moe_comm_backend": {"context": "deepep_ht"}}), "sglang").unwrap_err();
    assert!(e.contains("wideep_deepep_normal_perf") && e.contains("vllm only"), "{e}");
    let e = parse(json!({"moe_comm_backend": {"context": "nvlink_two_sided"}}), "trtllm").unwrap_err();
    assert!(e.contains("\"nvlink_two_sided\" is not modelled"), "{e}");
    let e = parse(json!({"moe_comm_backend": {"context": "deepep"}}), "vllm").unwrap_err();
    assert!(e.contains("unknown all-to-all backend \"deepep\""), "{e}");
    let e = parse(json!({"moe_comm_backend": {"prefill": "deepep_ht"}}), "vllm").unwrap_err();
    assert!(e.contains("moe_comm_backend.prefill") && e.contains("unknown phase"), "{e}");
    let e = parse(json!({"moe_comm_backend": {"context": "deepep_ht"}, "moe_kernel_source": "deepgemm"}), "vllm")
        .unwrap_err();
    assert!(e.contains("moe_kernel_source"), "{e}");
    // EPLB knobs are read without the large-EP graph too (they time nothing there) ...
    parse(json!({"enable_eplb": true, "wideep_num_slots": 288}), "trtllm").unwrap();
    // ... but only as the booleans and positive counts they are.
    let e = parse(json!({"enable_eplb": "yes"}), "vllm").unwrap_err();
    assert!(e.contains("enable_eplb") && e.contains("must be true or false"), "{e}");
    let e = parse(json!({"wideep_num_slots": 0}), "vllm").unwrap_err();
    assert!(e.contains("wideep_num_slots") && e.contains("positive integer"), "{e}");
    parse(json!({"moe_comm_backend": {"context": "deepep_ht"}, "enable_eplb": true, "wideep_num_slots": 288}), "vllm")
        .unwrap();
    if !data_available("h200_sxm") {
        return;
    }
    // Model-level checks: the plain MoE family, moe_tp 1, experts divisible by moe_ep.
    let build = |cfg: serde_json::Value| {
        estimator(&AisConfig::from_json("config", &cfg).unwrap()).map(|_| ()).map_err(|e| e.message)
    };
    let e = build(json!({"model": "deepseek-ai/DeepSeek-V3", "system": "h200_sxm", "backend": "vllm", "tp": 1,
                         "attention_dp": 8, "moe_tp_size": 1, "moe_ep_size": 8,
                         "moe_comm_backend": {"context": "deepep_ht"}}))
    .unwrap_err();
    assert!(e.contains("plain MoE family") && e.contains("wideep_*_mla_perf"), "{e}");
    let e = build(json!({"model": "MiniMaxAI/MiniMax-M2.7", "system": "h200_sxm", "backend": "vllm", "tp": 8,
                         "moe_tp_size": 8, "moe_ep_size": 1, "moe_comm_backend": {"context": "deepep_ht"}}))
    .unwrap_err();
    assert!(e.contains("moe_tp_size = 1"), "{e}");
}

/// Prefill CP beside the large-EP graph on the MLA and DSA families (which the reference builds
/// from its wide-EP MLA tables) never reaches a graph builder: the CP is SGLang's, the one
/// modelled large-EP backend vLLM's, and the large-EP graph the plain MoE family's. Each layer
/// of that gate refuses by name; the Qwen3.5, Nemotron-H and Kimi-K3 builders keep no CP check
/// of their own for the same reason (the reference's refusal in its words comes first).
#[test]
fn large_ep_beside_prefill_cp_is_refused_at_the_gates() {
    let cfg = |model: &str, backend: &str, cp: u32, large_ep: bool| {
        let mut c = json!({"model": model, "system": "h200_sxm", "backend": backend, "tp": 1, "cp_size": cp,
                           "moe_tp_size": 1, "moe_ep_size": 8, "attention_dp": 8 / cp});
        if large_ep {
            c["moe_comm_backend"] = json!({"context": "deepep_ht"});
        }
        c
    };
    for model in ["zai-org/GLM-5-FP8", "deepseek-ai/DeepSeek-V3"] {
        // SGLang (the CP backend): its DeepEP graph is refused while the config is read.
        let e = AisConfig::from_json("config", &cfg(model, "sglang", 2, true)).map(|_| ()).unwrap_err().message;
        assert!(e.contains("moe_comm_backend.context") && e.contains("vllm only"), "{e}");
    }
    if !data_available("h200_sxm") {
        return;
    }
    let build = |c: serde_json::Value| {
        estimator(&AisConfig::from_json("config", &c).unwrap()).map(|_| ()).map_err(|e| e.message)
    };
    for (model, family) in [("zai-org/GLM-5-FP8", "DEEPSEEKV32"), ("deepseek-ai/DeepSeek-V3", "DEEPSEEK")] {
        // vLLM (the large-EP backend): no prefill CP there, in the reference's words.
        let e = build(cfg(model, "vllm", 2, true)).unwrap_err();
        assert_eq!(
            e,
            format!(
                "Context parallelism (cp_size=2) is not supported for model_family='{family}' on backend='vllm'. \
                 The model class must override ``supports_cp`` and implement CP in its op pipeline."
            )
        );
        // Without CP the large-EP graph itself is the plain MoE family's.
        let e = build(cfg(model, "vllm", 1, true)).unwrap_err();
        assert!(e.contains("plain MoE family only") && e.contains("wideep_*_mla_perf"), "{e}");
    }
}

/// The reference prices the large-EP graph under `database_mode: SOL` with rooflines servesim
/// does not have: refused by name, never the tables' numbers under a SOL label.
#[test]
fn large_ep_under_sol_is_refused_by_name() {
    if !data_available("h200_sxm") {
        eprintln!("NOTICE: AIS data not installed; skipping");
        return;
    }
    let mut cfg = config("h200_sxm", 1, 8, 8, true, 0);
    cfg["database_mode"] = json!("SOL");
    let e = estimator(&AisConfig::from_json("config", &cfg).unwrap()).unwrap();
    let err = e.prefill_ms(2, 3000, 0).unwrap_err().message;
    assert!(err.contains("database_mode SOL is not modelled for the large-EP MoE graph"), "{err}");
    // The fused block of the same layout has its SOL.
    let mut fused = config("h200_sxm", 1, 8, 8, false, 0);
    fused["database_mode"] = json!("SOL");
    let sol = estimator(&AisConfig::from_json("config", &fused).unwrap()).unwrap().prefill_ms(2, 3000, 0).unwrap();
    assert!(sol > 0.0 && sol < 569.4937228274033, "SOL {sol} ms is below the SILICON pass");
}

/// `enable_eplb` and `wideep_num_slots` on the fused block: the reference reads them and times
/// the fused graph exactly as without them (`scripts/ais_wide_ep_goldens.py`'s EPLB-on-fused case
/// prints the fused DEP8 case's numbers bit for bit); servesim replays the fused goldens with the
/// knobs set, on every backend's decode too, and refuses them on a dense model as the reference
/// does ("require an MoE model").
#[test]
fn eplb_on_the_fused_block_times_the_fused_graph() {
    if !data_available("h200_sxm") {
        eprintln!("NOTICE: AIS data not installed; skipping");
        return;
    }
    for ((system, tp, dp, ep, large_ep, slots), (b, isl, prefix), total, ops) in CASES {
        if *large_ep {
            continue;
        }
        let mut cfg = config(system, *tp, *dp, *ep, false, 288.max(*slots));
        cfg["enable_eplb"] = json!(true);
        let e = estimator(&AisConfig::from_json("config", &cfg).unwrap()).unwrap();
        let ours = e.prefill_ops(*b, *isl, *prefix).unwrap();
        assert_eq!(ours.len(), ops.len(), "{cfg}: op list");
        for ((name, got), (want_name, want)) in ours.iter().zip(ops.iter()) {
            assert_eq!(name, want_name);
            assert!(rel(*got, *want) <= 1e-6, "{cfg} {b}x{isl}+{prefix} {name}: {got}, reference {want}");
        }
        assert!(rel(e.prefill_ms(*b, *isl, *prefix).unwrap(), *total) <= 1e-6);
    }
    for backend in ["vllm", "sglang", "trtllm"] {
        let base = json!({"model": "Qwen/Qwen3-30B-A3B", "system": "h200_sxm", "backend": backend, "tp": 1,
                          "attention_dp": 4, "moe_tp_size": 1, "moe_ep_size": 4});
        let mut knobs = base.clone();
        knobs["enable_eplb"] = json!(true);
        knobs["wideep_num_slots"] = json!(144);
        let (a, b) = (
            estimator(&AisConfig::from_json("config", &base).unwrap()).unwrap(),
            estimator(&AisConfig::from_json("config", &knobs).unwrap()).unwrap(),
        );
        assert_eq!(a.prefill_ops(2, 2048, 0).unwrap(), b.prefill_ops(2, 2048, 0).unwrap(), "{backend}");
        assert_eq!(a.decode_ops(32, 2100).unwrap(), b.decode_ops(32, 2100).unwrap(), "{backend}");
    }
    let dense = json!({"model": "Qwen/Qwen3-32B", "system": "h200_sxm", "backend": "vllm", "tp": 2,
                       "enable_eplb": true});
    let e = estimator(&AisConfig::from_json("config", &dense).unwrap()).err().unwrap().message;
    assert!(e.contains("enable_eplb: the model has no routed experts"), "{e}");
}
