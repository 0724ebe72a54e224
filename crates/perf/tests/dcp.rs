//! Decode context parallelism (`dcp`): the reference's prefill and decode steps and KV capacity
//! for MLA (DeepSeek-V3, Kimi-K2.5; vLLM's LSE all-gather + reduce-scatter merge, SGLang's
//! all-to-all) and GQA on vLLM, and its refusals.

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
    let e = refuse(json!({"model": "nvidia/GLM-5.2-NVFP4", "system": "b200_sxm", "backend": "vllm", "tp": 8,
                          "moe_tp_size": 8, "moe_ep_size": 1, "dcp": 2}));
    assert!(e.contains("is timed by the reference but not modelled by servesim"), "{e}");
}
