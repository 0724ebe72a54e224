//! `database_mode: SOL`: every op at its speed-of-light roofline, against the reference's per-op
//! evidence (aisimulate 0.13, `static_phase_diagnostics` under `database_mode: SOL`). Runs only
//! when the AIS data is installed; otherwise each test prints a notice and passes.
//!
//! The numbers were recorded with the reference venv's python:
//!
//! ```text
//! $AISIM_REF_VENV/bin/python scripts/ais_ops.py CONFIG BATCH ISL PREFIX --database-mode SOL
//! ```
//!
//! with each case's config and shape below (prefill: BATCH requests reaching ISL tokens, PREFIX
//! cached; decode: BATCH requests at context ISL + 1).

use serde_json::{json, Value};
use servesim_perf::{estimator, AisConfig, Estimator};

fn est(cfg: Value) -> Option<std::sync::Arc<Estimator>> {
    let system = cfg["system"].as_str().unwrap().to_string();
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

fn sol(mut cfg: Value) -> Value {
    cfg["worker_type"] = json!("aggregated");
    cfg["database_mode"] = json!("sol");
    cfg
}

type Case = (Value, [u32; 3], &'static [(&'static str, f64)]);

#[test]
fn every_op_is_the_references_roofline() {
    let cases: Vec<Case> = vec![
        (
            json!({"model": "Qwen/Qwen3-8B", "system": "h200_sxm", "backend": "vllm", "tp": 1}),
            [2, 1000, 300],
            &[
                ("context_embedding", 0.002389333333333333),
                ("context_add_norm_1", 0.344064),
                ("context_qkv_gemm", 2.5649292812942366),
                ("context_attention", 0.5432503181071789),
                ("context_proj_gemm", 1.7099528541961577),
                ("context_gate_ffn1_gemm", 10.259717125176946),
                ("context_act_gate", 0.7741439999999999),
                ("context_ffn2_gemm", 5.129858562588473),
                ("context_logits_gemm", 0.2594341333333333),
                ("generation_embedding", 3.413333333333333e-06),
                ("generation_add_norm_1", 0.00049152),
                ("generation_qkv_gemm", 0.37779456),
                ("generation_attention", 0.06202368),
                ("generation_gate_ffn1_gemm", 1.5108096),
                ("generation_act_gate", 0.0011059199999999998),
            ],
        ),
        (
            json!({"model": "Qwen/Qwen3-30B-A3B", "system": "h200_sxm", "backend": "sglang", "tp": 2,
                   "moe_tp_size": 1, "moe_ep_size": 2}),
            [8, 1500, 0],
            &[
                ("context_moe_pre_dispatch", 5.2428799999999995),
                ("context_moe", 21.98510812537917),
                ("context_moe_post_dispatch", 5.2428799999999995),
                ("generation_moe_pre_dispatch", 0.003495253333333334),
                ("generation_moe", 3.02399488),
            ],
        ),
        (
            json!({"model": "deepseek-ai/DeepSeek-V3", "system": "h200_sxm", "backend": "sglang", "tp": 8,
                   "moe_tp_size": 1, "moe_ep_size": 8}),
            [4, 1500, 300],
            &[("context_mla_block", 2.7284578361981797), ("generation_mla_block", 0.07338218666666668)],
        ),
    ];
    for (cfg, [b, isl, prefix], want) in cases {
        let Some(e) = est(sol(cfg.clone())) else { return };
        let ops: Vec<(String, f64)> =
            e.prefill_ops(b, isl, prefix).unwrap().into_iter().chain(e.decode_ops(b, isl + 1).unwrap()).collect();
        for (name, ms) in want {
            let got = ops.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("{cfg}: no op {name}")).1;
            assert!((got - ms).abs() <= 1e-9 * ms, "{cfg}: {name} = {got}, reference {ms}");
        }
        // The tables' times are another thing: the rooflines are below them.
        let mut silicon = cfg.clone();
        silicon["worker_type"] = json!("aggregated");
        let s = est(silicon).unwrap();
        assert!(e.decode_ms(b, isl + 1).unwrap() < s.decode_ms(b, isl + 1).unwrap(), "{cfg}");
    }
}

#[test]
fn families_without_a_roofline_are_refused_by_name() {
    let dsa = json!({"model": "deepseek-ai/DeepSeek-V3.2", "system": "h200_sxm", "backend": "sglang", "tp": 8,
                     "moe_tp_size": 1, "moe_ep_size": 8});
    let Some(e) = est(sol(dsa)) else { return };
    let err = e.prefill_ms(1, 100, 0).unwrap_err().message;
    assert!(err.contains("database_mode SOL is not modelled for DSA sparse attention"), "{err}");
    let cfg = json!({"model": "Qwen/Qwen3-8B", "system": "h200_sxm", "backend": "vllm", "worker_type": "aggregated", "database_mode": "Sol"});
    assert!(AisConfig::from_json("config", &cfg).unwrap().database_mode.is_sol());
}
