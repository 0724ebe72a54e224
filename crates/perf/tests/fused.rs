//! The hardware-faithful pass model (`pass_model: fused`): a pass that prefills beside a decode
//! batch is one forward. These tests pin its definition against the op lists the reference's
//! static steps use; they run only when the AIS data is installed.

use serde_json::json;
use servesim_perf::{estimator, AisConfig, Estimator};

fn est(model: &str, system: &str, tp: u32) -> Option<std::sync::Arc<Estimator>> {
    // (The expert split is read for MoE models only.)
    let cfg =
        json!({"model": model, "system": system, "backend": "vllm", "tp": tp, "moe_tp_size": tp, "moe_ep_size": 1});
    match servesim_perf::systems::systems_roots(&[]) {
        Ok(roots) if roots.iter().any(|(r, _)| r.join(format!("{system}.yaml")).is_file()) => {
            Some(estimator(&AisConfig::from_json("config", &cfg).unwrap()).unwrap())
        }
        _ => {
            eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping");
            None
        }
    }
}

fn sum(ops: &[(String, f64)], keep: impl Fn(&str) -> bool) -> f64 {
    ops.iter().filter(|(name, _)| keep(name)).map(|(_, ms)| ms).sum()
}

fn close(got: f64, want: f64) {
    assert!((got - want).abs() <= 1e-9 * want.abs().max(1.0), "got {got}, want {want}");
}

/// Every token-major op at all of the pass's tokens, each attention at its own part's shape,
/// and one logits row per sequence.
fn fused_by_definition(e: &Estimator, p: u32, isl: u32, prefix: u32, d: u32, kv: u32) -> f64 {
    let all = p * (isl - prefix) + d;
    let is_attention = |n: &str| n.ends_with("_attention");
    let is_logits = |n: &str| n.ends_with("logits_gemm");
    sum(&e.prefill_ops(1, all, 0).unwrap(), |n| !is_attention(n) && !is_logits(n))
        + sum(&e.prefill_ops(p, isl, prefix).unwrap(), is_attention)
        + sum(&e.decode_ops(d, kv).unwrap(), is_attention)
        + sum(&e.decode_ops(p + d, kv).unwrap(), is_logits)
}

#[test]
fn a_mixed_pass_is_one_forward_over_all_its_tokens() {
    for (model, system, tp) in [("meta-llama/Meta-Llama-3.1-8B", "h100_sxm", 1), ("Qwen/Qwen3-30B-A3B", "h200_sxm", 2)]
    {
        let Some(e) = est(model, system, tp) else { return };
        // A mostly cached prompt beside 64 decodes (the real-hardware set's typical pass), and a
        // long chunk beside a few.
        for (p, isl, prefix, d, kv) in [(1, 547, 544, 64, 701), (2, 2048, 0, 5, 3000)] {
            let fused = e.fused_ms(p, isl, prefix, d, kv).unwrap();
            close(fused, fused_by_definition(&e, p, isl, prefix, d, kv));
            let additive = e.prefill_ms(p, isl, prefix).unwrap() + e.decode_ms(d, kv).unwrap();
            assert!(fused < additive, "{model}: fused {fused} ms, additive {additive} ms");
            assert!(fused > e.decode_ms(d, kv).unwrap(), "{model}: the prefill part costs something");
        }
        // A pass with one part only is that part's step.
        close(e.fused_ms(1, 547, 544, 0, 1).unwrap(), e.prefill_ms(1, 547, 544).unwrap());
        close(e.fused_ms(0, 0, 0, 64, 701).unwrap(), e.decode_ms(64, 701).unwrap());
    }
}

/// The sparse-attention blocks (DSA: DeepSeek-V3.2, MSA: MiniMax-M3) hold their projections and
/// indexer inside the one attention op: the fused pass runs each block at its own part's shape,
/// never at the whole pass's tokens as one prompt.
#[test]
fn sparse_attention_blocks_run_at_their_parts_shapes() {
    for model in ["deepseek-ai/DeepSeek-V3.2", "MiniMaxAI/MiniMax-M3"] {
        let Some(e) = est(model, "h200_sxm", 8) else { return };
        for (p, isl, prefix, d, kv) in [(3, 1667, 1000, 100, 701), (1, 512, 0, 31, 1501)] {
            let fused = e.fused_ms(p, isl, prefix, d, kv).unwrap();
            close(fused, fused_by_definition(&e, p, isl, prefix, d, kv));
            let prefill_alone = e.prefill_ms(p, isl, prefix).unwrap();
            let additive = prefill_alone + e.decode_ms(d, kv).unwrap();
            assert!(fused < additive, "{model}: fused {fused} ms, additive {additive} ms");
            assert!(fused > prefill_alone, "{model}: the decode batch costs something");
        }
    }
}

#[test]
fn the_pass_model_is_checked_by_key() {
    let base = json!({"model": "meta-llama/Meta-Llama-3.1-8B", "system": "h100_sxm", "backend": "vllm"});
    let with = |k: &str, v: serde_json::Value| {
        let mut c = base.clone();
        c[k] = v;
        c
    };
    let e = AisConfig::from_json("timing", &with("pass_model", json!("fusion"))).unwrap_err();
    assert_eq!(e.message, r#"timing.pass_model: "fusion"; expected "additive" or "fused""#);
    let mut c = with("pass_model", json!("fused"));
    c["nextn"] = json!(1);
    let e = AisConfig::from_json("timing", &c).unwrap_err();
    assert!(e.message.starts_with("timing.pass_model: fused mixed passes are not modelled with speculative"), "{e:?}");
    assert_eq!(AisConfig::from_json("timing", &base).unwrap().pass_model, servesim_perf::PassModel::Additive);
}
