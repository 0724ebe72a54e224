//! Muse-Glimmer (`MuseGlimmerForConditionalGeneration`, the reference's `MUSEGLIMMER` family)
//! against the reference (aisimulate 0.13, `aisimulate_core`): step times, forward passes and KV
//! capacity on each backend, prompts and contexts inside and past the 2048-token window, and
//! SGLang prefill context parallelism. Runs only when the AIS data is installed; otherwise each
//! test prints a notice and passes.
//!
//! Numbers recorded with
//!
//! ```text
//! $AISIM_REF_VENV/bin/python scripts/ais_goldens.py --glimmer
//! ```
//!
//! (`static_phase_diagnostics` summed for prefill and for decode at `context − 1`,
//! `estimate_forward_pass_time_ms` for the mixed pass, `estimate_num_gpu_blocks` at 8192 tokens
//! per pass with the backend's default memory fraction).

use serde_json::json;
use servesim_perf::model::Op;

mod common;
use common::{data_available, est_with, MIXED};

const MODEL: &str = "meta-models/Muse-Glimmer-30B";

fn close(got: f64, want: f64) {
    common::close_to(got, want, 1e-6);
}

fn est(mut cfg: serde_json::Value) -> std::sync::Arc<servesim_perf::Estimator> {
    cfg["worker_type"] = json!("aggregated");
    est_with(cfg)
}

fn installed() -> bool {
    let ok = ["h200_sxm", "b200_sxm", "gb200"].iter().all(|s| data_available(s));
    if !ok {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the Muse-Glimmer goldens");
    }
    ok
}

/// Step times and forward passes: sliding-window and global blocks with Q/K-norm, the output
/// gate, NoPE global layers; vLLM, SGLang (also with prefill CP) and TRT-LLM, TP 1 to 8.
#[test]
fn step_time_goldens() {
    if !installed() {
        return;
    }
    let e = est(json!({"model": "meta-models/Muse-Glimmer-30B", "system": "h200_sxm", "backend": "vllm", "tp": 1}));
    close(e.prefill_ms(4, 1024, 0).unwrap(), 299.307943643436);
    close(e.prefill_ms(1, 20000, 0).unwrap(), 1593.98568782638);
    close(e.prefill_ms(2, 3000, 500).unwrap(), 369.57222454933583);
    close(e.decode_ms(4, 1025).unwrap(), 17.052311670930944);
    close(e.decode_ms(16, 1100).unwrap(), 17.24340325272041);
    close(e.decode_ms(7, 131072).unwrap(), 20.571748156324407);
    close(e.forward_pass_time_ms(&[MIXED]).unwrap(), 159.5451281885607);
    let e = est(json!({"model": "meta-models/Muse-Glimmer-30B", "system": "h200_sxm", "backend": "sglang", "tp": 2}));
    close(e.prefill_ms(1, 8192, 0).unwrap(), 384.88336734729137);
    close(e.decode_ms(64, 4097).unwrap(), 12.252618876084926);
    close(e.forward_pass_time_ms(&[MIXED]).unwrap(), 96.88478585360606);
    let e = est(json!({"model": "meta-models/Muse-Glimmer-30B", "system": "b200_sxm", "backend": "trtllm", "tp": 4}));
    close(e.prefill_ms(4, 777, 0).unwrap(), 50.738395898368424);
    close(e.prefill_ms(1, 20000, 0).unwrap(), 290.7048450383141);
    close(e.decode_ms(33, 5000).unwrap(), 6.963084217186789);
    let e = est(json!({"model": "meta-models/Muse-Glimmer-30B", "system": "gb200", "backend": "vllm", "tp": 8}));
    close(e.prefill_ms(2, 2500, 700).unwrap(), 40.08996929793936);
    close(e.decode_ms(256, 8000).unwrap(), 11.403505047338626);
    let e = est(
        json!({"model": "meta-models/Muse-Glimmer-30B", "system": "h200_sxm", "backend": "sglang", "tp": 1, "cp_size": 2}),
    );
    close(e.prefill_ms(1, 8192, 0).unwrap(), 329.2318209347202);
    close(e.prefill_ms(2, 2500, 700).unwrap(), 150.79984872631215);
    close(e.decode_ms(16, 1100).unwrap(), 17.180623559806712);
}

/// KV capacity: the sliding-window layers' cache is capped at the window, so the budget holds
/// the longest sequence whose capped cache fits (longer than the context on these budgets).
#[test]
fn kv_capacity_goldens() {
    if !installed() {
        return;
    }
    use servesim_perf::memory::kv_capacity;
    for (cfg, block, want) in [
        (
            json!({"model": "meta-models/Muse-Glimmer-30B", "system": "h200_sxm", "backend": "vllm", "tp": 1}),
            64,
            89173u64,
        ),
        (
            json!({"model": "meta-models/Muse-Glimmer-30B", "system": "h200_sxm", "backend": "sglang", "tp": 2}),
            1,
            15182012u64,
        ),
        (
            json!({"model": "meta-models/Muse-Glimmer-30B", "system": "b200_sxm", "backend": "trtllm", "tp": 4}),
            32,
            738231u64,
        ),
        (
            json!({"model": "meta-models/Muse-Glimmer-30B", "system": "gb200", "backend": "vllm", "tp": 8}),
            64,
            392421u64,
        ),
        (
            json!({"model": "meta-models/Muse-Glimmer-30B", "system": "h200_sxm", "backend": "sglang", "tp": 1, "cp_size": 2}),
            1,
            5519288u64,
        ),
    ] {
        let e = est(cfg.clone());
        let got = kv_capacity(&e, None, 8192, block, 0.0).unwrap();
        assert_eq!(got.blocks, want, "{cfg}: {got:?}");
    }
}

/// The graph's shape: 39 sliding-window and 13 global layers, the output gate on both, the
/// rotary pass only on the sliding-window layers' context attention.
#[test]
fn op_list_shape() {
    if !installed() {
        return;
    }
    let e = est(json!({"model": MODEL, "system": "h200_sxm", "backend": "vllm", "tp": 2}));
    let g = e.model.glimmer.as_ref().unwrap();
    assert_eq!((g.swa_layers, g.global_layers, g.window), (39, 13, 2048));
    let attn: Vec<_> = e
        .context_ops
        .iter()
        .filter_map(|o| match o {
            Op::ContextAttention { scale, window, rope, qk_norm, n, n_kv, .. } => {
                Some((*scale, *window, *rope, *qk_norm, *n, *n_kv))
            }
            _ => None,
        })
        .collect();
    assert_eq!(attn, vec![(39.0, 2048, true, true, 16, 1), (13.0, 0, false, true, 16, 1)]);
    let gate: Vec<_> = e
        .generation_ops
        .iter()
        .filter_map(|o| match o {
            Op::Gemm { name, n, k, .. } if name.ends_with("gate_gemm") => Some((name.as_str(), *n, *k)),
            _ => None,
        })
        .collect();
    assert_eq!(gate, vec![("generation_swa_gate_gemm", 2048, 6656), ("generation_global_gate_gemm", 2048, 6656)]);
}

/// A config whose layer kinds do not match its depth, or without a window, is refused naming
/// the key.
#[test]
fn malformed_configs_are_refused() {
    use servesim_perf::model::ModelSpec;
    use std::path::Path;
    let mut types = vec!["sliding_attention"; 3];
    types.push("full_attention");
    let text = json!({"hidden_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128,
        "num_hidden_layers": 5, "intermediate_size": 4096, "vocab_size": 1000, "sliding_window": 512,
        "layer_types": types});
    let mut cfg = json!({"architectures": ["MuseGlimmerForConditionalGeneration"], "text_config": text});
    let e = ModelSpec::from_config("g", Path::new("g.json"), &cfg).unwrap_err().to_string();
    assert!(e.contains("layer_types has 4 entries for 5 layers"), "{e}");
    cfg["text_config"]["num_hidden_layers"] = json!(4);
    cfg["text_config"]["sliding_window"] = json!(null);
    let e = ModelSpec::from_config("g", Path::new("g.json"), &cfg).unwrap_err().to_string();
    assert!(e.contains("text_config.sliding_window"), "{e}");
    cfg["text_config"]["sliding_window"] = json!(512);
    let m = ModelSpec::from_config("g", Path::new("g.json"), &cfg).unwrap();
    assert_eq!(m.glimmer.map(|g| (g.swa_layers, g.global_layers, g.window)), Some((3, 1, 512)));
    let e = ModelSpec::from_config(
        "g",
        Path::new("g.json"),
        &json!({"architectures": ["MuseGlimmerForConditionalGeneration"]}),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("text_config"), "{e}");
}
