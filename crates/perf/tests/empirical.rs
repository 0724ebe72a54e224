//! `database_mode: EMPIRICAL` / `HYBRID`: each table-backed op's speed of light over a
//! utilisation read off its own measured points, against the reference's per-op evidence
//! (aisimulate 0.13, `static_phase_diagnostics` under `database_mode: EMPIRICAL`). Runs only when
//! the AIS data is installed; otherwise each test prints a notice and passes.
//!
//! The numbers were recorded with the reference venv's python:
//!
//! ```text
//! $AISIM_REF_VENV/bin/python scripts/ais_ops.py CONFIG BATCH ISL PREFIX --database-mode EMPIRICAL
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

fn with_mode(mut cfg: Value, mode: &str) -> Value {
    cfg["worker_type"] = json!("aggregated");
    cfg["database_mode"] = json!(mode);
    cfg
}

type Case = (Value, [u32; 3], &'static [(&'static str, f64)]);
type ModeCase = (&'static str, Value, &'static [(&'static str, f64)]);

#[test]
fn every_op_is_the_references_empirical_estimate() {
    let cases: Vec<Case> = vec![
        (
            // bf16 GEMMs, context attention after a cached prefix, decode attention, memory ops.
            json!({"model": "Qwen/Qwen3-8B", "system": "h200_sxm", "backend": "vllm", "tp": 1}),
            [2, 1000, 300],
            &[
                ("context_qkv_gemm", 3.226177783589489),
                ("context_attention", 3.3280184913354396),
                ("context_proj_gemm", 2.153312411042599),
                ("context_gate_ffn1_gemm", 12.44186572419569),
                ("context_act_gate", 1.07568),
                ("context_logits_gemm", 0.30787483354819856),
                ("generation_qkv_gemm", 0.5724800229072572),
                ("generation_attention", 1.490922334276277),
                ("generation_ffn2_gemm", 1.054368019104004),
            ],
        ),
        (
            // Static FP8 (the scale-computation delta and the scaling pass taken off the FP8
            // GEMM) and the custom all-reduce on another system and backend.
            json!({"model": "Qwen/Qwen3-32B-FP8-Static-PerTensor", "system": "h100_sxm", "backend": "sglang", "tp": 2}),
            [4, 777, 0],
            &[
                ("context_qkv_gemm", 10.338143950692213),
                ("context_attention", 6.591034848947428),
                ("context_proj_gemm", 4.217883707017189),
                ("context_gate_ffn1_gemm", 45.48670125193452),
                ("context_ffn2_gemm", 13.180886584428716),
                ("context_ar_1", 8.225732556049127),
                ("context_embedding_ar", 0.12852707118826762),
                ("generation_gate_ffn1_gemm", 3.473672597582236),
                ("generation_attention", 2.5993463368581313),
                ("generation_ar_1", 0.1728809726894634),
            ],
        ),
    ];
    for (cfg, [b, isl, prefix], want) in cases {
        let Some(e) = est(with_mode(cfg.clone(), "EMPIRICAL")) else { return };
        let ops: Vec<(String, f64)> =
            e.prefill_ops(b, isl, prefix).unwrap().into_iter().chain(e.decode_ops(b, isl + 1).unwrap()).collect();
        for (name, ms) in want {
            let got = ops.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("{cfg}: no op {name}")).1;
            assert!((got - ms).abs() <= 1e-9 * ms, "{cfg}: {name} = {got}, reference {ms}");
        }
        // The tables' times are another thing; HYBRID reads them where they have the slice.
        let s = est(with_mode(cfg.clone(), "SILICON")).unwrap();
        let h = est(with_mode(cfg.clone(), "hybrid")).unwrap();
        let (emp, sil, hyb) = (
            e.prefill_ms(b, isl, prefix).unwrap(),
            s.prefill_ms(b, isl, prefix).unwrap(),
            h.prefill_ms(b, isl, prefix).unwrap(),
        );
        assert!((emp - sil).abs() > 1e-3 * sil, "{cfg}: EMPIRICAL {emp} vs SILICON {sil}");
        assert_eq!(hyb, sil, "{cfg}");
    }
}

/// MoE expert compute (own curve; under HYBRID without the format, the same-profile format's
/// curve), MoE dispatch, and MLA modules, recorded as above at BATCH 4, ISL 1000, PREFIX 300
/// with `--database-mode` the case's mode; every op of these runs agreed (`0 ops differ`).
#[test]
fn moe_and_mla_ops_are_the_references_estimate() {
    let cases: Vec<ModeCase> = vec![
        (
            "EMPIRICAL",
            json!({"model": "Qwen/Qwen3-30B-A3B", "system": "h200_sxm", "backend": "vllm", "tp": 2,
                   "moe_tp_size": 1, "moe_ep_size": 2}),
            &[
                ("context_moe_pre_dispatch", 2.673028616769222),
                ("context_moe", 22.120418891586187),
                ("generation_moe_pre_dispatch", 0.21854208469390868),
                ("generation_moe", 3.456000137329102),
            ],
        ),
        (
            // TRT-LLM's H200 table has no int4_wo rows: w4a16_mxfp4's curve (same weight bytes and
            // tensor-core rate) against int4_wo's roofline.
            "HYBRID",
            json!({"model": "Qwen/Qwen3-30B-A3B", "system": "h200_sxm", "backend": "trtllm", "tp": 2,
                   "moe_tp_size": 1, "moe_ep_size": 2, "moe_quant_mode": "int4_wo"}),
            &[
                ("context_moe_pre_dispatch", 2.2862524348497386),
                ("context_moe", 32.50957025968622),
                ("generation_moe_pre_dispatch", 0.13570559978485108),
                ("generation_moe", 1.9532664332245502),
            ],
        ),
        (
            "EMPIRICAL",
            json!({"model": "deepseek-ai/DeepSeek-V3", "system": "h200_sxm", "backend": "vllm", "tp": 8,
                   "moe_tp_size": 1, "moe_ep_size": 8, "enable_shared_layer": true}),
            &[
                ("context_mla_block", 32.58928186182547),
                ("context_moe_pre_dispatch", 12.024383976046689),
                ("context_moe", 79.4832614048361),
                ("generation_mla_block", 7.133686218610889),
                ("generation_moe_overlap", 8.339215904529771),
            ],
        ),
        (
            // SGLang has no MLA module rows on H200: the module misses and the granular chain
            // answers, as under SILICON.
            "HYBRID",
            json!({"model": "deepseek-ai/DeepSeek-V3", "system": "h200_sxm", "backend": "sglang", "tp": 8,
                   "moe_tp_size": 1, "moe_ep_size": 8}),
            &[
                ("context_mla_block", 22.81072918212738),
                ("context_moe_pre_dispatch", 13.454343999475242),
                ("context_moe", 80.95191261649133),
                ("generation_mla_block", 4.538789109609897),
                ("generation_moe_overlap", 7.286506904280849),
            ],
        ),
    ];
    for (mode, cfg, want) in cases {
        let Some(e) = est(with_mode(cfg.clone(), mode)) else { return };
        let ops: Vec<(String, f64)> =
            e.prefill_ops(4, 1000, 300).unwrap().into_iter().chain(e.decode_ops(4, 1001).unwrap()).collect();
        for (name, ms) in want {
            let got = ops.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("{cfg}: no op {name}")).1;
            assert!((got - ms).abs() <= 1e-6 * ms, "{mode} {cfg}: {name} = {got}, reference {ms}");
        }
    }
}

#[test]
fn families_without_an_empirical_estimate_are_refused_by_name() {
    // Without MLA module rows EMPIRICAL has no utilisation to read; the reference raises it as
    // not implemented rather than falling to the granular kernels.
    let cfg = json!({"model": "deepseek-ai/DeepSeek-V3", "system": "h200_sxm", "backend": "sglang", "tp": 8,
                     "moe_tp_size": 1, "moe_ep_size": 8});
    let Some(e) = est(with_mode(cfg, "EMPIRICAL")) else { return };
    let err = e.prefill_ms(4, 1000, 300).unwrap_err().message;
    let want = "database_mode EMPIRICAL: context MLA module on h200_sxm: no measured points";
    assert!(err.contains(want), "{err}");
    let cfg = json!({"model": "deepseek-ai/DeepSeek-V3.2", "system": "h200_sxm", "backend": "vllm", "tp": 8,
                     "moe_tp_size": 1, "moe_ep_size": 8});
    let e = est(with_mode(cfg, "HYBRID")).unwrap();
    let err = e.prefill_ms(1, 100, 0).unwrap_err().message;
    assert!(err.contains("database_mode HYBRID is not modelled for DSA sparse attention"), "{err}");
    let cfg = json!({"model": "Qwen/Qwen3-8B", "system": "h200_sxm", "backend": "vllm", "worker_type": "aggregated", "database_mode": "ROOFLINE"});
    let err = AisConfig::from_json("config", &cfg).unwrap_err().message;
    assert!(err.contains("\"ROOFLINE\" is not a database mode (SILICON, SOL, HYBRID or EMPIRICAL)"), "{err}");
    // EMPIRICAL reads the requested version's rows alone unless told otherwise, as the reference.
    let cfg = json!({"model": "Qwen/Qwen3-8B", "system": "h200_sxm", "backend": "vllm", "database_mode": "EMPIRICAL"});
    assert!(!AisConfig::from_json("config", &cfg).unwrap().enable_shared_layer);
    let cfg = json!({"model": "Qwen/Qwen3-8B", "system": "h200_sxm", "backend": "vllm", "database_mode": "HYBRID"});
    assert!(AisConfig::from_json("config", &cfg).unwrap().enable_shared_layer);
}
