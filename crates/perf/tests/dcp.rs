//! Decode context parallelism (`dcp`): the reference's prefill and decode steps and KV capacity
//! for MLA (DeepSeek-V3, Kimi-K2.5; vLLM's LSE all-gather + reduce-scatter merge, SGLang's
//! all-to-all), DSA on vLLM and GQA on vLLM, and its refusals; and DSA's SGLang prefill context
//! parallelism (`cp_size`), whose sparse-CP composition lives in the same attention block.

mod common;

use common::{data_available, est_with};
use serde_json::{json, Value};
use servesim_perf::{estimator, AisConfig};

fn cfg(model: &str, backend: &str, dcp: u32) -> Value {
    json!({"model": model, "system": "h200_sxm", "backend": backend, "tp": 8, "moe_tp_size": 8,
           "moe_ep_size": 1, "dcp": dcp})
}

fn close(got: f64, want: f64) {
    assert!((got - want).abs() <= 1e-9 * want.abs(), "got {got}, reference {want}");
}

/// `$AISIM_REF_VENV/bin/python scripts/dcp_goldens.py` (aisimulate 0.13): the prefill of 4
/// requests reaching 2048 tokens with 1024 cached (the cached stripes gathered first), the decode
/// step at 2048 tokens of KV, and the KV blocks (the rank's budget holds `dcp` times the tokens).
#[test]
fn dcp_step_and_capacity_goldens() {
    if !data_available("h200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the DCP goldens");
        return;
    }
    for (model, backend, dcp, block, prefill, decode, blocks) in [
        ("deepseek-ai/DeepSeek-V3", "vllm", 2, 64, 234.62544699195072, 16.611333883589456, 32294u64),
        ("deepseek-ai/DeepSeek-V3", "vllm", 8, 64, 235.12122449195073, 19.499976683589455, 129177),
        ("deepseek-ai/DeepSeek-V3", "sglang", 4, 1, 164.61018961565887, 12.448611962968053, 4984310),
        ("moonshotai/Kimi-K2.5", "vllm", 4, 64, 296.03143954375696, 15.32990024227354, 48022),
        ("Qwen/Qwen3-30B-A3B", "vllm", 2, 64, 33.13111323749985, 5.9196958584319, 157439),
    ] {
        let e = est_with(cfg(model, backend, dcp));
        close(e.prefill_ms(4, 2048, 1024).unwrap(), prefill);
        close(e.decode_ms(4, 2049).unwrap(), decode);
        let kv = servesim_perf::memory::kv_capacity(&e, None, 8192, block, 0.0).unwrap();
        assert_eq!(kv.blocks, blocks, "{model} {backend} dcp{dcp}: {kv:?}");
    }
}

/// DSA (DeepSeek-V3.2, GLM-5.x) against `$AISIM_REF_VENV/bin/python scripts/dcp_goldens.py`
/// (aisimulate 0.13), the same steps and capacity as above: vLLM decode CP (the gathered heads
/// over the rank's stripe, the sparse attention over its share of the top-k, the indexer's top-k
/// merge; GLM-5.2's reuse layers blended in) and SGLang prefill CP (the module at the busiest
/// rank's share with the indexer's kernels re-timed, the key and latent all-gathers; the experts
/// over the CP ranks, the KV not divided).
#[test]
fn dsa_context_parallelism_goldens() {
    if !data_available("h200_sxm") || !data_available("b200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the DSA CP goldens");
        return;
    }
    let cases = [
        (
            json!({"model": "deepseek-ai/DeepSeek-V3.2", "system": "h200_sxm", "backend": "vllm", "tp": 8,
                   "moe_tp_size": 8, "moe_ep_size": 1, "dcp": 2}),
            64,
            507.0882834177234,
            15.854228662455167,
            23567u64,
        ),
        (
            json!({"model": "nvidia/GLM-5.2-NVFP4", "system": "b200_sxm", "backend": "vllm", "tp": 8,
                   "moe_tp_size": 1, "moe_ep_size": 8, "dcp": 4}),
            64,
            139.03806186240982,
            16.911615598801387,
            102678,
        ),
        (
            json!({"model": "zai-org/GLM-5-FP8", "system": "h200_sxm", "backend": "sglang", "tp": 1,
                   "moe_tp_size": 1, "moe_ep_size": 8, "cp_size": 8}),
            1,
            211.08268754476953,
            20.797910409113896,
            15976,
        ),
        (
            json!({"model": "nvidia/GLM-5.2-NVFP4", "system": "b200_sxm", "backend": "sglang", "tp": 1,
                   "moe_tp_size": 1, "moe_ep_size": 4, "cp_size": 4}),
            1,
            117.0633213604236,
            12.559363685806229,
            383466,
        ),
    ];
    for (c, block, prefill, decode, blocks) in cases.clone() {
        let e = est_with(c.clone());
        close(e.prefill_ms(4, 2048, 1024).unwrap(), prefill);
        close(e.decode_ms(4, 2049).unwrap(), decode);
        let kv = servesim_perf::memory::kv_capacity(&e, None, 8192, block, 0.0).unwrap();
        assert_eq!(kv.blocks, blocks, "{c}: {kv:?}");
    }
    // The indexer's top-k merge sits between the query gather and the output merge.
    let e = est_with(cases[0].0.clone());
    let names: Vec<String> =
        e.decode_ops(4, 2049).unwrap().into_iter().map(|(n, _)| n).filter(|n| n.contains("_dcp_")).collect();
    let want = ["q_all_gather", "topk_pack", "topk_all_gather", "topk_merge", "lse_all_gather", "lse_correct"];
    let want: Vec<String> = want.iter().map(|s| format!("generation_attention_dcp_{s}")).collect();
    assert_eq!(names[..6], want[..], "{names:?}");
}

/// Kimi-K3 SGLang decode CP on B300 TEP8 against `$AISIM_REF_VENV/bin/python scripts/dcp_goldens.py
/// --only moonshotai/Kimi-K3` (aisimulate 0.13), the same steps and capacity as above: only the MLA
/// layers stripe (the KDA layers keep no KV), the query side is replicated (SGLang's Kimi-K3
/// default: the q_b projection and absorb BMM at `dcp` times the heads, no query all-gather), the
/// outputs merge by all-to-all; the rank's budget loses one request's whole KDA state before the
/// rest holds `dcp` times the MLA tokens (dcp 1 beside it).
#[test]
fn kimi_k3_dcp_goldens() {
    if !data_available("b300_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the Kimi-K3 DCP goldens");
        return;
    }
    let k3 = |dcp: u32| {
        json!({"model": "moonshotai/Kimi-K3", "system": "b300_sxm", "backend": "sglang", "tp": 8,
               "moe_tp_size": 1, "moe_ep_size": 8, "dcp": dcp})
    };
    for (dcp, prefill, decode, blocks) in [
        (2, 227.85005155135696, 16.219278751692173, 3956299u64),
        (8, 228.01658155135695, 17.411727960864933, 15825199),
        (1, 227.28353155135693, 15.518014288004851, 1978149),
    ] {
        let e = est_with(k3(dcp));
        close(e.prefill_ms(4, 2048, 1024).unwrap(), prefill);
        close(e.decode_ms(4, 2049).unwrap(), decode);
        let kv = servesim_perf::memory::kv_capacity(&e, None, 8192, 1, 0.0).unwrap();
        assert_eq!(kv.blocks, blocks, "Kimi-K3 dcp{dcp}: {kv:?}");
    }
    let names: Vec<String> = est_with(k3(2))
        .decode_ops(4, 2049)
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| n.contains("_dcp_"))
        .collect();
    let want = ["a2a_pack", "out_all_to_all", "a2a_combine"].map(|s| format!("generation_attention_dcp_{s}"));
    assert_eq!(names, want, "no query all-gather beside the replicated query side");
}

/// The merge's collectives follow the attention op they merge, named after it; a decode-only
/// step without DCP has none, and the striped decode is cheaper per KV token but pays them.
#[test]
fn dcp_ops_follow_the_decode_attention() {
    if !data_available("h200_sxm") {
        return;
    }
    let names = |backend: &str, dcp: u32| -> Vec<String> {
        let e = est_with(cfg("deepseek-ai/DeepSeek-V3", backend, dcp));
        e.decode_ops(4, 2049).unwrap().into_iter().map(|(n, _)| n).filter(|n| n.contains("_dcp_")).collect()
    };
    assert!(names("vllm", 1).is_empty());
    let vllm = [
        "generation_mla_block_dcp_q_all_gather",
        "generation_mla_block_dcp_lse_all_gather",
        "generation_mla_block_dcp_lse_correct",
        "generation_mla_block_dcp_out_reduce_scatter",
    ];
    assert_eq!(names("vllm", 2), vllm);
    let sglang = [
        "generation_mla_block_dcp_q_all_gather",
        "generation_mla_block_dcp_a2a_pack",
        "generation_mla_block_dcp_out_all_to_all",
        "generation_mla_block_dcp_a2a_combine",
    ];
    assert_eq!(names("sglang", 2), sglang);
}

/// The reference's refusals, in its words: a model class that does not claim DCP on the backend,
/// a GQA layout whose KV heads TP does not replicate `dcp` times, a DCP that does not divide TP.
/// What the reference times but servesim does not (DSA) is refused by name.
#[test]
fn dcp_refusals() {
    if !data_available("h200_sxm") {
        return;
    }
    let refuse = |c: Value| estimator(&AisConfig::from_json("config", &c).unwrap()).map(|_| ()).unwrap_err().message;
    let e = refuse(json!({"model": "Qwen/Qwen3-32B", "system": "h200_sxm", "backend": "sglang", "tp": 2, "dcp": 2}));
    assert_eq!(
        e,
        "dcp: Decode context parallelism (dcp_size=2) is not supported for model_family='LLAMA' on backend='sglang'. \
         The model class must override ``supports_dcp`` and implement the KV-sharded decode path."
    );
    let mut c = cfg("Qwen/Qwen3-30B-A3B", "vllm", 2);
    c["tp"] = json!(4);
    c["moe_tp_size"] = json!(4);
    assert_eq!(
        refuse(c),
        "dcp: dcp_size=2 exceeds the KV-head replication of this layout (1): GQA decode CP only de-duplicates kv \
         heads that TP replicates (dcp <= tp / kv_heads)."
    );
    assert_eq!(refuse(cfg("deepseek-ai/DeepSeek-V3", "vllm", 3)), "dcp: dcp_size must be positive and divide tp_size");
    let e = refuse(cfg("deepseek-ai/DeepSeek-V3", "trtllm", 2));
    assert!(e.contains("model_family='DEEPSEEK' on backend='trtllm'"), "{e}");
    // vLLM's FlashMLA sparse kernel takes DCP only from an fp8 KV cache (the reference's words).
    let e = refuse(json!({"model": "deepseek-ai/DeepSeek-V3.2", "system": "h200_sxm", "backend": "vllm", "tp": 8,
                          "moe_tp_size": 8, "moe_ep_size": 1, "dcp": 2, "kvcache_quant_mode": "bfloat16"}));
    assert_eq!(
        e,
        "dcp: DeepseekV32ForCausalLM decode context parallelism on vLLM's FlashMLA sparse backend requires an fp8 \
         KV cache (got kvcache_quant_mode=bfloat16); the bf16 sparse path returns no LSE for the DCP merge."
    );
    // SGLang's NSA backend has no DCP path: the reference does not claim it.
    let e = refuse(json!({"model": "nvidia/GLM-5.2-NVFP4", "system": "b200_sxm", "backend": "sglang", "tp": 8,
                          "moe_tp_size": 8, "moe_ep_size": 1, "dcp": 2}));
    assert!(e.contains("model_family='DEEPSEEKV32' on backend='sglang'"), "{e}");
    // Prefill CP of DeepSeek-V3.2 needs the indexer's sparse kernel tables, collected for GLM-5 only.
    let e = refuse(json!({"model": "deepseek-ai/DeepSeek-V3.2", "system": "h200_sxm", "backend": "sglang", "tp": 1,
                          "moe_tp_size": 1, "moe_ep_size": 2, "cp_size": 2}));
    assert!(e.contains("needs the sparse indexer tables ['mqa', 'topk_last', 'topk_flat'] at num_heads=128"), "{e}");
}
