//! Large expert parallelism (the reference's large-EP MoE graph, `moe_a2a.rs`): per-op and
//! per-pass prefill times against aisimulate 0.13.0.dev202610270000000085. They run only when
//! the data is installed; otherwise each test prints a notice and passes.
//!
//! SGLang's wide-EP graphs of the MLA and DSA families (`wideep_mla.rs`) are checked the same way
//! against `$AISIM_REF_VENV/bin/python scripts/ais_wide_ep_goldens.py --sglang` (below).
//!
//! Every vLLM number comes from `$AISIM_REF_VENV/bin/python scripts/ais_wide_ep_goldens.py`: the
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

/// `(model, system)` and `(tp, attention dp, moe_ep, cp, enable_eplb)`.
type Deployment = (&'static str, &'static str);
type SglangLayout = (u32, u32, u32, u32, bool);
type SglangCase = ((Deployment, SglangLayout), (u32, u32, u32), f64, &'static [(&'static str, f64)]);

/// `(((model, system), (tp, attention dp, moe_ep, cp, enable_eplb)), (batch, isl, prefix),
/// reference total, reference ops)`: SGLang 0.5.14's wide-EP graphs of the MLA and DSA families
/// with DeepEP high-throughput in the context phase, from
/// `$AISIM_REF_VENV/bin/python scripts/ais_wide_ep_goldens.py --sglang` (the fmha / KV formats
/// its resolver sets for DeepSeek-V3 are servesim's defaults under the key).
#[rustfmt::skip]
const SGLANG_CASES: &[SglangCase] = &[
    ((("deepseek-ai/DeepSeek-V3", "h200_sxm"), (1, 8, 8, 1, false)), (2, 3000, 0), 748.9079228926956, &[("context_qkv_a_proj_gemm", 10.40357650722016), ("context_embedding", 0.025400000000000002), ("context_add_norm_1", 5.6486), ("context_downscale_gemm", 10.40357650722016), ("context_attention", 187.12429224381188), ("context_gate_ffn1_gemm", 18.39959970859539), ("context_act_gate", 1.3541999999999998), ("context_ffn2_gemm", 9.054976397138791), ("context_moe_dispatch", 43.61311157675917), ("context_moe", 377.4110947755032), ("context_moe_combine", 85.46949517644693)]),
    ((("deepseek-ai/DeepSeek-V3", "h200_sxm"), (1, 8, 8, 1, false)), (1, 100, 0), 86.8658020998959, &[("context_qkv_a_proj_gemm", 0.8667653311243205), ("context_embedding", 0.0033733333333333332), ("context_add_norm_1", 0.27409333333333336), ("context_downscale_gemm", 0.8667653311243205), ("context_attention", 34.516506447394306), ("context_gate_ffn1_gemm", 0.9987190981705983), ("context_act_gate", 0.20252), ("context_ffn2_gemm", 0.66061100512743), ("context_moe_dispatch", 2.7716657075726863), ("context_moe", 41.11198542171291), ("context_moe_combine", 4.592797091002671)]),
    ((("deepseek-ai/DeepSeek-V3", "h200_sxm"), (1, 8, 8, 1, false)), (4, 1000, 500), 301.13201014292156, &[("context_qkv_a_proj_gemm", 8.843660763242267), ("context_embedding", 0.010466666666666666), ("context_add_norm_1", 2.004866666666667), ("context_downscale_gemm", 8.843660763242267), ("context_attention", 78.87518732348026), ("context_gate_ffn1_gemm", 5.98118063499725), ("context_act_gate", 0.5734), ("context_ffn2_gemm", 3.9146726751639176), ("context_moe_dispatch", 16.252208891068108), ("context_moe", 143.60787607708147), ("context_moe_combine", 32.224829681312706)]),
    ((("deepseek-ai/DeepSeek-V3", "h200_sxm"), (1, 8, 8, 1, false)), (16, 8192, 0), 19226.508750108307, &[("context_qkv_a_proj_gemm", 213.08047065159286), ("context_embedding", 0.49233546666666667), ("context_add_norm_1", 119.58085386666667), ("context_downscale_gemm", 213.08047065159286), ("context_attention", 7114.82003918803), ("context_gate_ffn1_gemm", 394.72346538967554), ("context_act_gate", 25.768254400000004), ("context_ffn2_gemm", 193.4683577219645), ("context_moe_dispatch", 947.3871855054583), ("context_moe", 8356.33795841762), ("context_moe_combine", 1647.7693588490386)]),
    ((("deepseek-ai/DeepSeek-V3", "h200_sxm"), (1, 16, 16, 1, false)), (2, 3000, 0), 1000.1286007038452, &[("context_qkv_a_proj_gemm", 10.40357650722016), ("context_embedding", 0.025400000000000002), ("context_add_norm_1", 5.6486), ("context_downscale_gemm", 10.40357650722016), ("context_attention", 187.12429224381188), ("context_gate_ffn1_gemm", 18.39959970859539), ("context_act_gate", 1.3541999999999998), ("context_ffn2_gemm", 9.054976397138791), ("context_moe_dispatch", 76.1951262109375), ("context_moe", 496.2021157070463), ("context_moe_combine", 185.31713742187503)]),
    ((("deepseek-ai/DeepSeek-V3", "h200_sxm"), (1, 16, 16, 1, false)), (1, 100, 0), 83.20792884195376, &[("context_qkv_a_proj_gemm", 0.8667653311243205), ("context_embedding", 0.0033733333333333332), ("context_add_norm_1", 0.27409333333333336), ("context_downscale_gemm", 0.8667653311243205), ("context_attention", 34.516506447394306), ("context_gate_ffn1_gemm", 0.9987190981705983), ("context_act_gate", 0.20252), ("context_ffn2_gemm", 0.66061100512743), ("context_moe_dispatch", 5.511807499999999), ("context_moe", 29.333038712346127), ("context_moe_combine", 9.973728749999998)]),
    ((("deepseek-ai/DeepSeek-V3", "h200_sxm"), (1, 16, 16, 1, false)), (4, 1000, 500), 404.98958610983914, &[("context_qkv_a_proj_gemm", 8.843660763242267), ("context_embedding", 0.010466666666666666), ("context_add_norm_1", 2.004866666666667), ("context_downscale_gemm", 8.843660763242267), ("context_attention", 78.87518732348026), ("context_gate_ffn1_gemm", 5.98118063499725), ("context_act_gate", 0.5734), ("context_ffn2_gemm", 3.9146726751639176), ("context_moe_dispatch", 29.875159843749994), ("context_moe", 195.2351315538798), ("context_moe_combine", 70.83219921874999)]),
    ((("deepseek-ai/DeepSeek-V3", "h200_sxm"), (1, 16, 16, 1, false)), (16, 8192, 0), 25031.207255554655, &[("context_qkv_a_proj_gemm", 213.08047065159286), ("context_embedding", 0.49233546666666667), ("context_add_norm_1", 119.58085386666667), ("context_downscale_gemm", 213.08047065159286), ("context_attention", 7114.82003918803), ("context_gate_ffn1_gemm", 394.72346538967554), ("context_act_gate", 25.768254400000004), ("context_ffn2_gemm", 193.4683577219645), ("context_moe_dispatch", 1526.99287), ("context_moe", 11607.99613821847), ("context_moe_combine", 3621.2039999999997)]),
    ((("deepseek-ai/DeepSeek-V3", "h200_sxm"), (2, 8, 16, 1, false)), (2, 3000, 0), 584.5840731642169, &[("context_qkv_a_proj_gemm", 5.412643356516716), ("context_tp_all_gather", 11.799143623046875), ("context_embedding", 0.025400000000000002), ("context_add_norm_1", 5.6486), ("context_downscale_gemm", 10.40357650722016), ("context_attention", 102.72033669724213), ("context_tp_reduce_scatter", 12.456121665039062), ("context_gate_ffn1_gemm", 9.719062157082401), ("context_act_gate", 0.7686), ("context_ffn2_gemm", 5.674965404918771), ("context_moe_dispatch", 41.628349140625005), ("context_moe", 278.6772314094007), ("context_moe_combine", 99.65004320312501)]),
    ((("deepseek-ai/DeepSeek-V3", "h200_sxm"), (2, 8, 16, 1, false)), (1, 100, 0), 79.84341989193244, &[("context_qkv_a_proj_gemm", 0.8036806619415588), ("context_tp_all_gather", 0.7926473437500001), ("context_embedding", 0.0033733333333333332), ("context_add_norm_1", 0.27409333333333336), ("context_downscale_gemm", 0.8667653311243205), ("context_attention", 35.3582516068073), ("context_tp_reduce_scatter", 0.7389006250000001), ("context_gate_ffn1_gemm", 0.9262239644372904), ("context_act_gate", 0.19276000000000001), ("context_ffn2_gemm", 0.6760173470333769), ("context_moe_dispatch", 4.39863375), ("context_moe", 27.468892595171926), ("context_moe_combine", 7.34318)]),
    ((("deepseek-ai/DeepSeek-V3", "h200_sxm"), (2, 8, 16, 1, false)), (4, 1000, 500), 238.05681138352156, &[("context_qkv_a_proj_gemm", 2.33491573921014), ("context_tp_all_gather", 4.85136216796875), ("context_embedding", 0.010466666666666666), ("context_add_norm_1", 2.004866666666667), ("context_downscale_gemm", 8.843660763242267), ("context_attention", 46.97205229615564), ("context_tp_reduce_scatter", 4.85478626953125), ("context_gate_ffn1_gemm", 7.972530171606276), ("context_act_gate", 0.3782), ("context_ffn2_gemm", 2.164680557352266), ("context_moe_dispatch", 17.692401875), ("context_moe", 100.0679813351216), ("context_moe_combine", 39.908906875)]),
    ((("deepseek-ai/DeepSeek-V3", "h200_sxm"), (2, 8, 16, 1, false)), (16, 8192, 0), 13001.849726331522, &[("context_qkv_a_proj_gemm", 106.54023532579643), ("context_tp_all_gather", 222.60791000000003), ("context_embedding", 0.49233546666666667), ("context_add_norm_1", 119.58085386666667), ("context_downscale_gemm", 213.08047065159286), ("context_attention", 3392.202793155744), ("context_tp_reduce_scatter", 233.63732), ("context_gate_ffn1_gemm", 197.36173269483777), ("context_act_gate", 12.9756272), ("context_ffn2_gemm", 96.73417886098225), ("context_moe_dispatch", 774.0881699999999), ("context_moe", 5803.998069109235), ("context_moe_combine", 1828.5500300000003)]),
    ((("deepseek-ai/DeepSeek-V3", "h200_sxm"), (1, 16, 16, 1, true)), (2, 3000, 0), 791.6667332928895, &[("context_qkv_a_proj_gemm", 10.40357650722016), ("context_embedding", 0.025400000000000002), ("context_add_norm_1", 5.6486), ("context_downscale_gemm", 10.40357650722016), ("context_attention", 187.12429224381188), ("context_gate_ffn1_gemm", 18.39959970859539), ("context_act_gate", 1.3541999999999998), ("context_ffn2_gemm", 9.054976397138791), ("context_moe_dispatch", 76.1951262109375), ("context_moe", 287.7402482960906), ("context_moe_combine", 185.31713742187503)]),
    ((("deepseek-ai/DeepSeek-V3", "h200_sxm"), (1, 16, 16, 1, true)), (1, 100, 0), 81.97108566241491, &[("context_qkv_a_proj_gemm", 0.8667653311243205), ("context_embedding", 0.0033733333333333332), ("context_add_norm_1", 0.27409333333333336), ("context_downscale_gemm", 0.8667653311243205), ("context_attention", 34.516506447394306), ("context_gate_ffn1_gemm", 0.9987190981705983), ("context_act_gate", 0.20252), ("context_ffn2_gemm", 0.66061100512743), ("context_moe_dispatch", 5.511807499999999), ("context_moe", 28.09619553280728), ("context_moe_combine", 9.973728749999998)]),
    ((("deepseek-ai/DeepSeek-V3", "h200_sxm"), (1, 16, 16, 1, true)), (4, 1000, 500), 311.3758844755172, &[("context_qkv_a_proj_gemm", 8.843660763242267), ("context_embedding", 0.010466666666666666), ("context_add_norm_1", 2.004866666666667), ("context_downscale_gemm", 8.843660763242267), ("context_attention", 78.87518732348026), ("context_gate_ffn1_gemm", 5.98118063499725), ("context_act_gate", 0.5734), ("context_ffn2_gemm", 3.9146726751639176), ("context_moe_dispatch", 29.875159843749994), ("context_moe", 101.62142991955791), ("context_moe_combine", 70.83219921874999)]),
    ((("deepseek-ai/DeepSeek-V3", "h200_sxm"), (1, 16, 16, 1, true)), (16, 8192, 0), 19725.242822990993, &[("context_qkv_a_proj_gemm", 213.08047065159286), ("context_embedding", 0.49233546666666667), ("context_add_norm_1", 119.58085386666667), ("context_downscale_gemm", 213.08047065159286), ("context_attention", 7114.82003918803), ("context_gate_ffn1_gemm", 394.72346538967554), ("context_act_gate", 25.768254400000004), ("context_ffn2_gemm", 193.4683577219645), ("context_moe_dispatch", 1526.99287), ("context_moe", 6302.031705654805), ("context_moe_combine", 3621.2039999999997)]),
    ((("deepseek-ai/DeepSeek-V3", "h200_sxm"), (1, 1, 8, 8, false)), (2, 3000, 0), 169.29266279321376, &[("context_qkv_a_proj_gemm", 1.6231099004016813), ("context_embedding", 0.0058000000000000005), ("context_add_norm_1", 0.8662), ("context_downscale_gemm", 1.6231099004016813), ("context_attention", 59.452319542186686), ("context_cp_all_gather", 1.940272392578125), ("context_gate_ffn1_gemm", 7.604675226819282), ("context_act_gate", 0.3294), ("context_ffn2_gemm", 1.7112266362882127), ("context_moe_dispatch", 7.676921753913083), ("context_moe", 71.4872430764804), ("context_moe_combine", 14.972384364144613)]),
    ((("deepseek-ai/DeepSeek-V3", "h200_sxm"), (1, 1, 8, 8, false)), (1, 100, 0), 86.6423050425995, &[("context_qkv_a_proj_gemm", 0.7774407947001148), ("context_embedding", 0.0030485333333333336), ("context_add_norm_1", 0.19484213333333336), ("context_downscale_gemm", 0.7774407947001148), ("context_attention", 40.30079668753764), ("context_cp_all_gather", 0.9143614062500001), ("context_gate_ffn1_gemm", 1.0274568978283138), ("context_act_gate", 0.18553760000000002), ("context_ffn2_gemm", 0.592594646745258), ("context_moe_dispatch", 1.6469302745726038), ("context_moe", 37.112797334044416), ("context_moe_combine", 3.109057939554355)]),
    ((("deepseek-ai/DeepSeek-V3", "h200_sxm"), (1, 1, 8, 8, false)), (4, 1000, 500), 79.389936606877, &[("context_qkv_a_proj_gemm", 0.9740482743416735), ("context_embedding", 0.003933333333333334), ("context_add_norm_1", 0.4107333333333334), ("context_downscale_gemm", 0.9740482743416735), ("context_attention", 14.236049342525183), ("context_cp_all_gather", 1.172606455078125), ("context_gate_ffn1_gemm", 1.2597326524689207), ("context_act_gate", 0.2318), ("context_ffn2_gemm", 0.7659448473096749), ("context_moe_dispatch", 3.990597583344016), ("context_moe", 48.135319676915444), ("context_moe_combine", 7.235122833885631)]),
    ((("deepseek-ai/DeepSeek-V3", "h200_sxm"), (1, 1, 8, 8, false)), (16, 8192, 0), 2605.2293368323876, &[("context_qkv_a_proj_gemm", 26.345695752515383), ("context_embedding", 0.06416693333333334), ("context_add_norm_1", 15.107731733333335), ("context_downscale_gemm", 26.345695752515383), ("context_attention", 1060.4446391204253), ("context_cp_all_gather", 14.004456249999999), ("context_gate_ffn1_gemm", 49.34043317370944), ("context_act_gate", 3.3811568), ("context_ffn2_gemm", 27.895489109887016), ("context_moe_dispatch", 118.26080475048141), ("context_moe", 1044.5422448022025), ("context_moe_combine", 219.49682265398454)]),
    ((("deepseek-ai/DeepSeek-V3.2", "h200_sxm"), (1, 8, 8, 1, false)), (2, 3000, 0), 993.0596307594435, &[("context_attention", 457.75715312500006), ("context_gate_ffn1_gemm", 18.39959970859539), ("context_act_gate", 1.3541999999999998), ("context_ffn2_gemm", 9.054976397138791), ("context_moe_dispatch", 43.61311157675917), ("context_moe", 377.4110947755032), ("context_moe_combine", 85.46949517644693)]),
    ((("deepseek-ai/DeepSeek-V3.2", "h200_sxm"), (1, 8, 8, 1, false)), (1, 100, 0), 102.24319832358628, &[("context_attention", 51.9049), ("context_gate_ffn1_gemm", 0.9987190981705983), ("context_act_gate", 0.20252), ("context_ffn2_gemm", 0.66061100512743), ("context_moe_dispatch", 2.7716657075726863), ("context_moe", 41.11198542171291), ("context_moe_combine", 4.592797091002671)]),
    ((("deepseek-ai/DeepSeek-V3.2", "h200_sxm"), (1, 8, 8, 1, false)), (4, 1000, 500), 270.9559207672406, &[("context_attention", 68.40175280761719), ("context_gate_ffn1_gemm", 5.98118063499725), ("context_act_gate", 0.5734), ("context_ffn2_gemm", 3.9146726751639176), ("context_moe_dispatch", 16.252208891068108), ("context_moe", 143.60787607708147), ("context_moe_combine", 32.224829681312706)]),
    ((("deepseek-ai/DeepSeek-V3.2", "h200_sxm"), (1, 8, 8, 1, false)), (16, 8192, 0), 17307.703485234706, &[("context_attention", 5742.248904950947), ("context_gate_ffn1_gemm", 394.72346538967554), ("context_act_gate", 25.768254400000004), ("context_ffn2_gemm", 193.4683577219645), ("context_moe_dispatch", 947.3871855054583), ("context_moe", 8356.33795841762), ("context_moe_combine", 1647.7693588490386)]),
    ((("deepseek-ai/DeepSeek-V3.2", "h200_sxm"), (2, 4, 8, 1, true)), (2, 3000, 0), 517.5524053621737, &[("context_tp_all_gather", 11.799143623046875), ("context_attention", 273.606183203125), ("context_tp_reduce_scatter", 12.456121665039062), ("context_gate_ffn1_gemm", 9.719062157082401), ("context_act_gate", 0.7686), ("context_ffn2_gemm", 5.674965404918771), ("context_moe_dispatch", 22.88642557771943), ("context_moe", 134.80619965397884), ("context_moe_combine", 45.835704077263266)]),
    ((("deepseek-ai/DeepSeek-V3.2", "h200_sxm"), (2, 4, 8, 1, true)), (1, 100, 0), 108.29176369129736, &[("context_tp_all_gather", 0.7926473437500001), ("context_attention", 59.162375000000004), ("context_tp_reduce_scatter", 0.7389006250000001), ("context_gate_ffn1_gemm", 0.9262239644372904), ("context_act_gate", 0.19276000000000001), ("context_ffn2_gemm", 0.6760173470333769), ("context_moe_dispatch", 2.1192146888553944), ("context_moe", 40.044290017655925), ("context_moe_combine", 3.639334704565378)]),
    ((("deepseek-ai/DeepSeek-V3.2", "h200_sxm"), (2, 4, 8, 1, true)), (4, 1000, 500), 173.81754137062177, &[("context_tp_all_gather", 4.85136216796875), ("context_attention", 60.0902064453125), ("context_tp_reduce_scatter", 4.85478626953125), ("context_gate_ffn1_gemm", 7.972530171606276), ("context_act_gate", 0.3782), ("context_ffn2_gemm", 2.164680557352266), ("context_moe_dispatch", 9.36272758627738), ("context_moe", 65.49498582971947), ("context_moe_combine", 18.648062342853876)]),
    ((("deepseek-ai/DeepSeek-V3.2", "h200_sxm"), (2, 4, 8, 1, true)), (16, 8192, 0), 7652.204083338337, &[("context_tp_all_gather", 222.60791000000003), ("context_attention", 3078.4463816412194), ("context_tp_reduce_scatter", 233.63732), ("context_gate_ffn1_gemm", 197.36173269483777), ("context_act_gate", 12.9756272), ("context_ffn2_gemm", 96.73417886098225), ("context_moe_dispatch", 473.344980103629), ("context_moe", 2497.036538577428), ("context_moe_combine", 840.0594142602415)]),
    ((("deepseek-ai/DeepSeek-V3.2", "b200_sxm"), (1, 16, 16, 1, false)), (2, 3000, 0), 606.9388091058665, &[("context_attention", 154.18893749999998), ("context_gate_ffn1_gemm", 8.924035596815102), ("context_act_gate", 0.9130987012987013), ("context_ffn2_gemm", 4.285273262705459), ("context_moe_dispatch", 44.51847317654697), ("context_moe", 318.69281804835686), ("context_moe_combine", 75.4161728201434)]),
    ((("deepseek-ai/DeepSeek-V3.2", "b200_sxm"), (1, 16, 16, 1, false)), (1, 100, 0), 83.48169749301452, &[("context_attention", 51.578931250000004), ("context_gate_ffn1_gemm", 0.9134166697661081), ("context_act_gate", 0.1951683116883117), ("context_ffn2_gemm", 0.6314937000473341), ("context_moe_dispatch", 3.215695906107372), ("context_moe", 21.99848236383072), ("context_moe_combine", 4.948509291574662)]),
    ((("deepseek-ai/DeepSeek-V3.2", "b200_sxm"), (1, 16, 16, 1, false)), (4, 1000, 500), 223.71004752750395, &[("context_attention", 51.46724287109375), ("context_gate_ffn1_gemm", 3.412733342094359), ("context_act_gate", 0.4263662337662338), ("context_ffn2_gemm", 2.7190019641436782), ("context_moe_dispatch", 17.33009377723484), ("context_moe", 118.43216316181103), ("context_moe_combine", 29.922446177360047)]),
    ((("deepseek-ai/DeepSeek-V3.2", "b200_sxm"), (1, 16, 16, 1, false)), (16, 8192, 0), 14195.015357912183, &[("context_attention", 3822.0620304914487), ("context_gate_ffn1_gemm", 185.78963067796496), ("context_act_gate", 16.1322494961039), ("context_ffn2_gemm", 91.56962150997586), ("context_moe_dispatch", 970.8867536856204), ("context_moe", 7681.093680027554), ("context_moe_combine", 1427.4813920235147)]),
];

fn sglang_config(model: &str, system: &str, (tp, dp, ep, cp, eplb): SglangLayout) -> serde_json::Value {
    json!({"model": model, "system": system, "backend": "sglang", "worker_type": "aggregated", "tp": tp,
           "attention_dp": dp, "cp_size": cp, "moe_tp_size": 1, "moe_ep_size": ep, "enable_eplb": eplb,
           "moe_comm_backend": {"context": "deepep_ht"}})
}

#[test]
fn sglang_mla_and_dsa_wide_ep_context_matches_the_reference_per_op() {
    if !data_available("h200_sxm") || !data_available("b200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the SGLang wide-EP goldens");
        return;
    }
    let mut worst = 0f64;
    for (((model, system), layout), (b, isl, prefix), total, ops) in SGLANG_CASES {
        let cfg = sglang_config(model, system, *layout);
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
    eprintln!("SGLang wide-EP goldens: {} passes, largest relative difference {worst:e}", SGLANG_CASES.len());
}

type SglangDecode = ((Deployment, SglangLayout), (u32, u32), f64, &'static [(&'static str, f64)]);

/// One decode step `(batch, context)` of the same deployments: the wide-EP attention module and
/// the fused MoE block (the generation phase takes no DeepEP), from the same script's
/// `static_gen` breakdown at `(batch, context − 1, osl 2)`.
#[rustfmt::skip]
const SGLANG_DECODE: &[SglangDecode] = &[
    ((("deepseek-ai/DeepSeek-V3", "h200_sxm"), (1, 8, 8, 1, false)), (8, 2001), 33.50169247226935, &[("generation_qkv_a_proj_gemm", 0.7796825481530231), ("generation_embedding", 0.0030298666666666667), ("generation_add_norm_1", 0.1902874666666667), ("generation_downscale_gemm", 0.7796825481530231), ("generation_attention", 6.913081152343751), ("generation_router_gemm", 0.4357297627462281), ("generation_shared_gate_up_gemm", 0.8395226837860214), ("generation_shared_act_gate", 0.1845616), ("generation_shared_ffn2_gemm", 0.5398906494180361), ("generation_moe_pre_dispatch", 1.0575875), ("generation_moe", 20.816361694335935), ("generation_moe_post_dispatch", 0.9622749999999999)]),
    ((("deepseek-ai/DeepSeek-V3", "h200_sxm"), (1, 8, 8, 1, false)), (64, 4097), 52.890317642190624, &[("generation_qkv_a_proj_gemm", 0.7565271079620584), ("generation_embedding", 0.0032389333333333334), ("generation_add_norm_1", 0.24129973333333335), ("generation_downscale_gemm", 0.7565271079620584), ("generation_attention", 14.886140269465772), ("generation_router_gemm", 0.38383911757005584), ("generation_shared_gate_up_gemm", 0.8229848684536086), ("generation_shared_act_gate", 0.19549280000000002), ("generation_shared_ffn2_gemm", 0.5382639956143167), ("generation_moe_pre_dispatch", 2.5932625), ("generation_moe", 29.232176208496096), ("generation_moe_post_dispatch", 2.480565)]),
    ((("deepseek-ai/DeepSeek-V3", "h200_sxm"), (1, 8, 8, 1, false)), (1, 101), 22.881717707245873, &[("generation_qkv_a_proj_gemm", 1.0150726533691024), ("generation_embedding", 0.0030037333333333333), ("generation_add_norm_1", 0.18391093333333336), ("generation_downscale_gemm", 1.0150726533691024), ("generation_attention", 5.9809546875), ("generation_router_gemm", 0.3754346722529994), ("generation_shared_gate_up_gemm", 1.2879947026570637), ("generation_shared_act_gate", 0.18319519999999997), ("generation_shared_ffn2_gemm", 0.6167777652541796), ("generation_moe_pre_dispatch", 0.9163725), ("generation_moe", 10.483020706176758), ("generation_moe_post_dispatch", 0.8209075)]),
    ((("deepseek-ai/DeepSeek-V3", "h200_sxm"), (1, 16, 16, 1, false)), (8, 2001), 48.995117080227466, &[("generation_qkv_a_proj_gemm", 0.7796825481530231), ("generation_embedding", 0.0030298666666666667), ("generation_add_norm_1", 0.1902874666666667), ("generation_downscale_gemm", 0.7796825481530231), ("generation_attention", 6.913081152343751), ("generation_router_gemm", 0.4357297627462281), ("generation_shared_gate_up_gemm", 0.8395226837860214), ("generation_shared_act_gate", 0.1845616), ("generation_shared_ffn2_gemm", 0.5398906494180361), ("generation_moe_pre_dispatch", 13.533340178571427), ("generation_moe", 12.92173273086548), ("generation_moe_post_dispatch", 11.874575892857143)]),
    ((("deepseek-ai/DeepSeek-V3", "h200_sxm"), (1, 16, 16, 1, false)), (64, 4097), 121.03336345980014, &[("generation_qkv_a_proj_gemm", 0.7565271079620584), ("generation_embedding", 0.0032389333333333334), ("generation_add_norm_1", 0.24129973333333335), ("generation_downscale_gemm", 0.7565271079620584), ("generation_attention", 14.886140269465772), ("generation_router_gemm", 0.38383911757005584), ("generation_shared_gate_up_gemm", 0.8229848684536086), ("generation_shared_act_gate", 0.19549280000000002), ("generation_shared_ffn2_gemm", 0.5382639956143167), ("generation_moe_pre_dispatch", 35.92665803571428), ("generation_moe", 29.531065597534184), ("generation_moe_post_dispatch", 36.99132589285714)]),
    ((("deepseek-ai/DeepSeek-V3", "h200_sxm"), (1, 16, 16, 1, false)), (1, 101), 37.38662506871786, &[("generation_qkv_a_proj_gemm", 1.0150726533691024), ("generation_embedding", 0.0030037333333333333), ("generation_add_norm_1", 0.18391093333333336), ("generation_downscale_gemm", 1.0150726533691024), ("generation_attention", 5.9809546875), ("generation_router_gemm", 0.3754346722529994), ("generation_shared_gate_up_gemm", 1.2879947026570637), ("generation_shared_act_gate", 0.18319519999999997), ("generation_shared_ffn2_gemm", 0.6167777652541796), ("generation_moe_pre_dispatch", 10.031994642857143), ("generation_moe", 9.011134853363037), ("generation_moe_post_dispatch", 7.682078571428572)]),
    ((("deepseek-ai/DeepSeek-V3", "h200_sxm"), (2, 8, 16, 1, false)), (8, 2001), 40.51586014885575, &[("generation_qkv_a_proj_gemm", 0.7796825481530231), ("generation_embedding", 0.0030298666666666667), ("generation_add_norm_1", 0.1902874666666667), ("generation_downscale_gemm", 0.7796825481530231), ("generation_attention", 4.57886015625), ("generation_router_gemm", 0.4357297627462281), ("generation_shared_gate_up_gemm", 0.7558035411768489), ("generation_shared_act_gate", 0.18378080000000002), ("generation_shared_ffn2_gemm", 0.3655119931532277), ("generation_moe_pre_dispatch", 10.571942678571428), ("generation_moe", 12.200390930175782), ("generation_moe_post_dispatch", 9.671157857142855)]),
    ((("deepseek-ai/DeepSeek-V3", "h200_sxm"), (2, 8, 16, 1, false)), (64, 4097), 82.67115837326837, &[("generation_qkv_a_proj_gemm", 0.7565271079620584), ("generation_embedding", 0.0032389333333333334), ("generation_add_norm_1", 0.24129973333333335), ("generation_downscale_gemm", 0.7565271079620584), ("generation_attention", 9.72515766449752), ("generation_router_gemm", 0.38383911757005584), ("generation_shared_gate_up_gemm", 0.7314577673872312), ("generation_shared_act_gate", 0.1892464), ("generation_shared_ffn2_gemm", 0.46164800557825303), ("generation_moe_pre_dispatch", 25.606394821428566), ("generation_moe", 19.26885528564453), ("generation_moe_post_dispatch", 24.546966428571427)]),
    ((("deepseek-ai/DeepSeek-V3", "h200_sxm"), (2, 8, 16, 1, false)), (1, 101), 33.34899820320096, &[("generation_qkv_a_proj_gemm", 1.0150726533691024), ("generation_embedding", 0.0030037333333333333), ("generation_add_norm_1", 0.18391093333333336), ("generation_downscale_gemm", 1.0150726533691024), ("generation_attention", 4.238928125), ("generation_router_gemm", 0.3754346722529994), ("generation_shared_gate_up_gemm", 0.997851515809695), ("generation_shared_act_gate", 0.1830976), ("generation_shared_ffn2_gemm", 0.49797689335213763), ("generation_moe_pre_dispatch", 9.181251607142858), ("generation_moe", 7.384806566238404), ("generation_moe_post_dispatch", 8.27259125)]),
    ((("deepseek-ai/DeepSeek-V3", "h200_sxm"), (1, 16, 16, 1, true)), (8, 2001), 48.995117080227466, &[("generation_qkv_a_proj_gemm", 0.7796825481530231), ("generation_embedding", 0.0030298666666666667), ("generation_add_norm_1", 0.1902874666666667), ("generation_downscale_gemm", 0.7796825481530231), ("generation_attention", 6.913081152343751), ("generation_router_gemm", 0.4357297627462281), ("generation_shared_gate_up_gemm", 0.8395226837860214), ("generation_shared_act_gate", 0.1845616), ("generation_shared_ffn2_gemm", 0.5398906494180361), ("generation_moe_pre_dispatch", 13.533340178571427), ("generation_moe", 12.92173273086548), ("generation_moe_post_dispatch", 11.874575892857143)]),
    ((("deepseek-ai/DeepSeek-V3", "h200_sxm"), (1, 16, 16, 1, true)), (64, 4097), 121.03336345980014, &[("generation_qkv_a_proj_gemm", 0.7565271079620584), ("generation_embedding", 0.0032389333333333334), ("generation_add_norm_1", 0.24129973333333335), ("generation_downscale_gemm", 0.7565271079620584), ("generation_attention", 14.886140269465772), ("generation_router_gemm", 0.38383911757005584), ("generation_shared_gate_up_gemm", 0.8229848684536086), ("generation_shared_act_gate", 0.19549280000000002), ("generation_shared_ffn2_gemm", 0.5382639956143167), ("generation_moe_pre_dispatch", 35.92665803571428), ("generation_moe", 29.531065597534184), ("generation_moe_post_dispatch", 36.99132589285714)]),
    ((("deepseek-ai/DeepSeek-V3", "h200_sxm"), (1, 16, 16, 1, true)), (1, 101), 37.38662506871786, &[("generation_qkv_a_proj_gemm", 1.0150726533691024), ("generation_embedding", 0.0030037333333333333), ("generation_add_norm_1", 0.18391093333333336), ("generation_downscale_gemm", 1.0150726533691024), ("generation_attention", 5.9809546875), ("generation_router_gemm", 0.3754346722529994), ("generation_shared_gate_up_gemm", 1.2879947026570637), ("generation_shared_act_gate", 0.18319519999999997), ("generation_shared_ffn2_gemm", 0.6167777652541796), ("generation_moe_pre_dispatch", 10.031994642857143), ("generation_moe", 9.011134853363037), ("generation_moe_post_dispatch", 7.682078571428572)]),
    ((("deepseek-ai/DeepSeek-V3", "h200_sxm"), (1, 1, 8, 8, false)), (8, 2001), 21.91296048730832, &[("generation_qkv_a_proj_gemm", 0.7796825481530231), ("generation_embedding", 0.0030298666666666667), ("generation_add_norm_1", 0.1902874666666667), ("generation_downscale_gemm", 0.7796825481530231), ("generation_attention", 6.913081152343751), ("generation_router_gemm", 0.4357297627462281), ("generation_shared_gate_up_gemm", 0.8395226837860214), ("generation_shared_act_gate", 0.1845616), ("generation_shared_ffn2_gemm", 0.5398906494180361), ("generation_moe_pre_dispatch", 0.3822357515990734), ("generation_moe", 10.483020706176758), ("generation_moe_post_dispatch", 0.3822357515990734)]),
    ((("deepseek-ai/DeepSeek-V3", "h200_sxm"), (1, 1, 8, 8, false)), (64, 4097), 41.04902249737995, &[("generation_qkv_a_proj_gemm", 0.7565271079620584), ("generation_embedding", 0.0032389333333333334), ("generation_add_norm_1", 0.24129973333333335), ("generation_downscale_gemm", 0.7565271079620584), ("generation_attention", 14.886140269465772), ("generation_router_gemm", 0.38383911757005584), ("generation_shared_gate_up_gemm", 0.8229848684536086), ("generation_shared_act_gate", 0.19549280000000002), ("generation_shared_ffn2_gemm", 0.5382639956143167), ("generation_moe_pre_dispatch", 0.8241734346747399), ("generation_moe", 20.816361694335935), ("generation_moe_post_dispatch", 0.8241734346747399)]),
    ((("deepseek-ai/DeepSeek-V3", "h200_sxm"), (1, 1, 8, 8, false)), (1, 101), 16.723342948884294, &[("generation_qkv_a_proj_gemm", 1.0150726533691024), ("generation_embedding", 0.0030037333333333333), ("generation_add_norm_1", 0.18391093333333336), ("generation_downscale_gemm", 1.0150726533691024), ("generation_attention", 5.9809546875), ("generation_router_gemm", 0.3754346722529994), ("generation_shared_gate_up_gemm", 1.2879947026570637), ("generation_shared_act_gate", 0.18319519999999997), ("generation_shared_ffn2_gemm", 0.6167777652541796), ("generation_moe_pre_dispatch", 0.2245531953126192), ("generation_moe", 5.612819557189941), ("generation_moe_post_dispatch", 0.2245531953126192)]),
    ((("deepseek-ai/DeepSeek-V3.2", "h200_sxm"), (1, 8, 8, 1, false)), (8, 2001), 34.30732264028622, &[("generation_attention", 9.47139375), ("generation_router_gemm", 0.4357297627462281), ("generation_shared_gate_up_gemm", 0.8395226837860214), ("generation_shared_act_gate", 0.1845616), ("generation_shared_ffn2_gemm", 0.5398906494180361), ("generation_moe_pre_dispatch", 1.0575875), ("generation_moe", 20.816361694335935), ("generation_moe_post_dispatch", 0.9622749999999999)]),
    ((("deepseek-ai/DeepSeek-V3.2", "h200_sxm"), (1, 8, 8, 1, false)), (64, 4097), 50.63648449013408, &[("generation_attention", 14.3899), ("generation_router_gemm", 0.38383911757005584), ("generation_shared_gate_up_gemm", 0.8229848684536086), ("generation_shared_act_gate", 0.19549280000000002), ("generation_shared_ffn2_gemm", 0.5382639956143167), ("generation_moe_pre_dispatch", 2.5932625), ("generation_moe", 29.232176208496096), ("generation_moe_post_dispatch", 2.480565)]),
    ((("deepseek-ai/DeepSeek-V3.2", "h200_sxm"), (1, 8, 8, 1, false)), (1, 101), 22.916034296341, &[("generation_attention", 8.23233125), ("generation_router_gemm", 0.3754346722529994), ("generation_shared_gate_up_gemm", 1.2879947026570637), ("generation_shared_act_gate", 0.18319519999999997), ("generation_shared_ffn2_gemm", 0.6167777652541796), ("generation_moe_pre_dispatch", 0.9163725), ("generation_moe", 10.483020706176758), ("generation_moe_post_dispatch", 0.8209075)]),
    ((("deepseek-ai/DeepSeek-V3.2", "h200_sxm"), (2, 4, 8, 1, true)), (8, 2001), 27.414020850341682, &[("generation_attention", 7.533023437499999), ("generation_router_gemm", 0.4357297627462281), ("generation_shared_gate_up_gemm", 0.7558035411768489), ("generation_shared_act_gate", 0.18378080000000002), ("generation_shared_ffn2_gemm", 0.3655119931532277), ("generation_moe_pre_dispatch", 1.2569050000000002), ("generation_moe", 15.73600881576538), ("generation_moe_post_dispatch", 1.1472574999999998)]),
    ((("deepseek-ai/DeepSeek-V3.2", "h200_sxm"), (2, 4, 8, 1, true)), (64, 4097), 42.156265208687394, &[("generation_attention", 11.8035), ("generation_router_gemm", 0.38383911757005584), ("generation_shared_gate_up_gemm", 0.7314577673872312), ("generation_shared_act_gate", 0.1892464), ("generation_shared_ffn2_gemm", 0.46164800557825303), ("generation_moe_pre_dispatch", 2.6108000000000002), ("generation_moe", 23.680648918151856), ("generation_moe_post_dispatch", 2.295125)]),
    ((("deepseek-ai/DeepSeek-V3.2", "h200_sxm"), (2, 4, 8, 1, true)), (1, 101), 17.33147088397526, &[("generation_attention", 6.49993125), ("generation_router_gemm", 0.3754346722529994), ("generation_shared_gate_up_gemm", 0.997851515809695), ("generation_shared_act_gate", 0.1830976), ("generation_shared_ffn2_gemm", 0.49797689335213763), ("generation_moe_pre_dispatch", 1.2594975), ("generation_moe", 6.332756452560425), ("generation_moe_post_dispatch", 1.1849249999999998)]),
    ((("deepseek-ai/DeepSeek-V3.2", "b200_sxm"), (1, 16, 16, 1, false)), (8, 2001), 68.62098574234804, &[("generation_attention", 7.731178125), ("generation_router_gemm", 0.4885422305928336), ("generation_shared_gate_up_gemm", 0.8442942251761755), ("generation_shared_act_gate", 0.18397346493506495), ("generation_shared_ffn2_gemm", 0.5038328874442313), ("generation_moe_pre_dispatch", 26.551992857142857), ("generation_moe", 9.115059452056885), ("generation_moe_post_dispatch", 23.2021125)]),
    ((("deepseek-ai/DeepSeek-V3.2", "b200_sxm"), (1, 16, 16, 1, false)), (64, 4097), 232.5633789951568, &[("generation_attention", 9.5343), ("generation_router_gemm", 0.36247555083698696), ("generation_shared_gate_up_gemm", 0.9667279505067402), ("generation_shared_act_gate", 0.19078771948051948), ("generation_shared_ffn2_gemm", 0.6097831336988344), ("generation_moe_pre_dispatch", 102.80221071428572), ("generation_moe", 20.612340354919436), ("generation_moe_post_dispatch", 97.48475357142857)]),
    ((("deepseek-ai/DeepSeek-V3.2", "b200_sxm"), (1, 16, 16, 1, false)), (1, 101), 57.66141884191711, &[("generation_attention", 6.216281250000001), ("generation_router_gemm", 0.32197155803442), ("generation_shared_gate_up_gemm", 0.8073146657811271), ("generation_shared_act_gate", 0.18312168311688312), ("generation_shared_ffn2_gemm", 0.5008506551384926), ("generation_moe_pre_dispatch", 21.652167857142857), ("generation_moe", 6.727529029846192), ("generation_moe_post_dispatch", 21.252182142857137)]),
];

#[test]
fn sglang_wide_ep_decode_matches_the_reference_per_op() {
    if !data_available("h200_sxm") || !data_available("b200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the SGLang wide-EP goldens");
        return;
    }
    let mut worst = 0f64;
    for (((model, system), layout), (b, context), total, ops) in SGLANG_DECODE {
        let cfg = sglang_config(model, system, *layout);
        let e = estimator(&AisConfig::from_json("config", &cfg).unwrap()).unwrap();
        let ours = e.decode_ops(*b, *context).unwrap();
        let names: Vec<&str> = ours.iter().map(|(n, _)| n.as_str()).collect();
        let want: Vec<&str> = ops.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, want, "{cfg}: op list");
        for ((name, got), (_, want)) in ours.iter().zip(ops.iter()) {
            assert!(rel(*got, *want) <= 1e-6, "{cfg} {b}@{context} {name}: {got}, reference {want}");
            worst = worst.max(rel(*got, *want));
        }
        let got = e.decode_ms(*b, *context).unwrap();
        assert!(rel(got, *total) <= 1e-6, "{cfg} {b}@{context}: {got}, reference {total}");
        worst = worst.max(rel(got, *total));
    }
    eprintln!("SGLang wide-EP decode goldens: {} steps, largest relative difference {worst:e}", SGLANG_DECODE.len());
}

/// The resident weights of the same deployments (what the KV capacity is sized from): the wide-EP
/// context graph's GEMMs, embedding and experts, which the reference sums without its SGLang
/// checkpoint correction (`weights` lines of the same script).
#[rustfmt::skip]
const SGLANG_WEIGHTS: &[(Deployment, SglangLayout, f64)] = &[
    (("deepseek-ai/DeepSeek-V3", "h200_sxm"), (1, 8, 8, 1, false), 92353200128.0),
    (("deepseek-ai/DeepSeek-V3", "h200_sxm"), (1, 16, 16, 1, false), 49369972736.0),
    (("deepseek-ai/DeepSeek-V3", "h200_sxm"), (2, 8, 16, 1, false), 49369972736.0),
    (("deepseek-ai/DeepSeek-V3", "h200_sxm"), (1, 1, 8, 8, false), 92353200128.0),
    (("deepseek-ai/DeepSeek-V3.2", "h200_sxm"), (1, 8, 8, 1, false), 100861870080.0),
    (("deepseek-ai/DeepSeek-V3.2", "h200_sxm"), (2, 4, 8, 1, true), 95616892928.0),
    (("deepseek-ai/DeepSeek-V3.2", "b200_sxm"), (1, 16, 16, 1, false), 57878642688.0),
];

#[test]
fn sglang_wide_ep_weights_match_the_reference() {
    if !data_available("h200_sxm") || !data_available("b200_sxm") {
        eprintln!("NOTICE: AIS data not installed; skipping");
        return;
    }
    for ((model, system), layout, want) in SGLANG_WEIGHTS {
        let cfg = sglang_config(model, system, *layout);
        let e = estimator(&AisConfig::from_json("config", &cfg).unwrap()).unwrap();
        let got = servesim_perf::memory::kv_capacity(&e, None, 8192, 64, 0.0).unwrap().weights_bytes;
        assert!(rel(got, *want) <= 1e-12, "{cfg}: weights {got}, reference {want}");
    }
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
    let e = parse(json!({"moe_comm_backend": {"context": "deepep_ht"}}), "trtllm").unwrap_err();
    assert!(e.contains("moe_comm_backend.context") && e.contains("runs on vllm and sglang, not trtllm"), "{e}");
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
    // Model-level checks: the plain MoE family on vLLM, DeepSeek-V3-architecture MLA and DSA
    // models on SGLang, moe_tp 1, experts divisible by moe_ep.
    let build = |cfg: serde_json::Value| {
        estimator(&AisConfig::from_json("config", &cfg).unwrap()).map(|_| ()).map_err(|e| e.message)
    };
    let wide = |model: &str, backend: &str| {
        json!({"model": model, "system": "h200_sxm", "backend": backend, "tp": 1, "attention_dp": 8,
               "moe_tp_size": 1, "moe_ep_size": 8, "moe_comm_backend": {"context": "deepep_ht"}})
    };
    let e = build(wide("deepseek-ai/DeepSeek-V3", "vllm")).unwrap_err();
    assert!(e.contains("moe_comm_backend") && e.contains("modelled on sglang only, not vllm"), "{e}");
    let e = build(wide("MiniMaxAI/MiniMax-M2.7", "sglang")).unwrap_err();
    assert!(e.contains("moe_comm_backend") && e.contains("modelled on vllm only, not sglang"), "{e}");
    let mut pinned = wide("deepseek-ai/DeepSeek-V3", "sglang");
    pinned["attention_backend"] = json!("trtllm_mla");
    let e = build(pinned).unwrap_err();
    assert!(e.contains("attention_backend \"trtllm_mla\"") && e.contains("flashinfer, fa3"), "{e}");
    let e = build(json!({"model": "MiniMaxAI/MiniMax-M2.7", "system": "h200_sxm", "backend": "vllm", "tp": 8,
                         "moe_tp_size": 8, "moe_ep_size": 1, "moe_comm_backend": {"context": "deepep_ht"}}))
    .unwrap_err();
    assert!(e.contains("moe_tp_size = 1"), "{e}");
}

/// What the reference refuses on SGLang's wide-EP graph, servesim refuses for the same reason
/// (`scripts/ais_wide_ep_goldens.py --sglang` prints the reference's errors): GLM-5's expert
/// shape (hidden 6144) and redundant EPLB slots (288) have no wide-EP expert-compute rows, nor
/// has b200 at EP8; DSA prefill CP needs sparse-indexer tables h200 lacks; SGLang's CP takes no
/// attention DP beside it. vLLM's large-EP graph is the plain MoE family's, which has no CP.
#[test]
fn sglang_wide_ep_refuses_what_the_reference_refuses() {
    if !data_available("h200_sxm") || !data_available("b200_sxm") {
        eprintln!("NOTICE: AIS data not installed; skipping");
        return;
    }
    let prefill = |model: &str, system: &str, layout: SglangLayout, slots: Option<u32>| {
        let mut cfg = sglang_config(model, system, layout);
        if let Some(n) = slots {
            cfg["wideep_num_slots"] = json!(n);
        }
        AisConfig::from_json("config", &cfg)
            .and_then(|c| estimator(&c))
            .and_then(|e| e.prefill_ms(2, 3000, 0))
            .unwrap_err()
            .message
    };
    let e = prefill("zai-org/GLM-5-FP8", "h200_sxm", (1, 8, 8, 1, false), None);
    assert!(e.contains("no wide-EP expert-compute data") && e.contains("hidden 6144"), "{e}");
    let e = prefill("deepseek-ai/DeepSeek-V3", "h200_sxm", (1, 16, 16, 1, true), Some(288));
    assert!(
        e.contains("no wide-EP expert-compute data") && e.contains("power_law_0.6") && e.contains("slots 288"),
        "{e}"
    );
    let e = prefill("deepseek-ai/DeepSeek-V3", "b200_sxm", (1, 8, 8, 1, false), None);
    assert!(e.contains("no wide-EP expert-compute data") && e.contains("moe_ep 8"), "{e}");
    let e = prefill("deepseek-ai/DeepSeek-V3.2", "h200_sxm", (1, 1, 8, 8, false), None);
    assert!(e.contains("DSA prefill context parallelism") && e.contains("sparse indexer tables"), "{e}");
    let e = prefill("deepseek-ai/DeepSeek-V3", "h200_sxm", (1, 4, 8, 2, false), None);
    assert!(e.contains("sglang CP requires tp_size=1 and attention_dp_size=1"), "{e}");
    let cfg = json!({"model": "deepseek-ai/DeepSeek-V3", "system": "h200_sxm", "backend": "vllm", "tp": 1, "cp_size": 2,
                     "attention_dp": 4, "moe_tp_size": 1, "moe_ep_size": 8, "moe_comm_backend": {"context": "deepep_ht"}});
    let e = estimator(&AisConfig::from_json("config", &cfg).unwrap()).map(|_| ()).unwrap_err().message;
    assert_eq!(
        e,
        "Context parallelism (cp_size=2) is not supported for model_family='DEEPSEEK' on backend='vllm'. The model \
         class must override ``supports_cp`` and implement CP in its op pipeline."
    );
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
