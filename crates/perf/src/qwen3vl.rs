//! Qwen3-VL's text path (`Qwen3VLForConditionalGeneration`, `Qwen3VLMoeForConditionalGeneration`:
//! the reference's `QWEN3VL` / `QWEN3VL_MOE` families) as the reference times a text-only load.
//!
//! The language model sits under `text_config` and is Qwen3's (dense) or Qwen3-MoE's: the same
//! widths, the same op list from the same builders (the reference's VL classes extend its Llama
//! and MoE classes and only append vision-encoder ops, which a text-only load never runs). mRoPE
//! (`rope_scaling.mrope_section`) and `rope_theta` change no op: attention is charged the same
//! rotary pass. No packaged Qwen3-VL declares a quantisation, so everything runs in bf16, read
//! from the root `quantization_config` first, then `text_config`'s, as for Qwen3.
//!
//! Why the reference times Qwen3-VL-8B about 15 % faster per token than Qwen3-8B although its
//! `text_config` matches Qwen3-8B in every width (only `rope_theta` and
//! `max_position_embeddings` differ): the reference enables Q/K RMS-norm from the
//! architecture name (`Qwen3ForCausalLM`, `Qwen3MoeForCausalLM`, `MiniMaxM2ForCausalLM`), and a
//! VL wrapper's model facts carry the vision-encoder config instead, so its attention ops go
//! without the Q/K-norm term even though the checkpoint has `q_norm` / `k_norm`. On h200_sxm,
//! vLLM 0.24.0, TP 1, 4 requests at 1024 tokens (`static_phase_diagnostics`), every op but
//! attention is identical; attention loses 0.950822 ms per pass in both phases (36 layers ×
//! 0.026412 ms of Q/K-norm memory traffic, independent of batch and length):
//!
//! | op                    | Qwen3-8B  | Qwen3-VL-8B |
//! |-----------------------|-----------|-------------|
//! | context_attention     | 5.770276  | 4.819453    |
//! | generation_attention  | 1.575267  | 0.624445    |
//! | prefill pass (sum)    | 85.901960 | 84.951137   |
//! | decode pass (sum)     | 6.260352  | 5.309529    |
//!
//! A decode pass of 6.26 ms loses 15.2 % (the matrix's mean ITL: 6.262909 → 5.312086 ms), a
//! prefill of 86 ms only 1.1 % (mean TTFT 85.902 → 84.951 ms). The KV cache is 7 blocks
//! larger (12226 → 12233 of 64 tokens): the memory model has activation coefficients per family
//! and none for `QWEN3VL` / `QWEN3VL_MOE`, so they take its `default` row (vLLM / TRT-LLM
//! 10, 6, 5, 5 by TP instead of Llama's 11, 6.5, 5, 5 and MoE's 22, 13, 10, 10; SGLang 13, 8,
//! 6.5, 6.5), here 2 × 8192 tokens × 4096 × (11 − 10) bytes = 64 MiB less activation memory. The
//! vision tower's weights are not charged (resident weights are the text ops'; a text-only load
//! builds no encoder op). [`default_activation_row`] tells the memory model.
//!
//! Images (`traffic.source.images`), encoder workers and the `encoder_parallel` knob are refused
//! where they are read (the deploy schema and the AIS config), whatever the model. The vision
//! tower itself, as the reference's analytical encoder pool prices it (image tokens, encoder ops,
//! memory), is [`crate::vision`]; `predict -c` does not route images through it yet.

use crate::model::Family;

/// The dense Qwen3-VL wrapper (2B … 32B).
pub const DENSE_ARCH: &str = "Qwen3VLForConditionalGeneration";
/// The MoE Qwen3-VL wrapper (30B-A3B, 235B-A22B).
pub const MOE_ARCH: &str = "Qwen3VLMoeForConditionalGeneration";
/// Both, as the op builder lists what it supports.
pub const ARCHS: &[&str] = &[DENSE_ARCH, MOE_ARCH];

/// The builder family of a Qwen3-VL architecture (`None`: not one).
pub fn family(arch: &str) -> Option<Family> {
    match arch {
        DENSE_ARCH => Some(Family::Dense),
        MOE_ARCH => Some(Family::Moe),
        _ => None,
    }
}

/// Whether the memory model charges activations by its `default` coefficient row for this
/// architecture (the reference keys the rows by family and has none for the Qwen3-VL families).
pub fn default_activation_row(arch: &str) -> bool {
    ARCHS.contains(&arch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ModelSpec;
    use serde_json::{json, Value};
    use std::path::Path;

    fn text(extra: Value) -> Value {
        let mut t = json!({"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "num_hidden_layers": 36, "intermediate_size": 12288, "vocab_size": 151936,
            "max_position_embeddings": 262144, "dtype": "bfloat16"});
        t.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        t
    }

    #[test]
    fn the_text_model_is_read_from_text_config_without_qk_norm() {
        let vl = json!({"architectures": [DENSE_ARCH], "text_config": text(json!({})),
                        "vision_config": {"depth": 27, "hidden_size": 1152}});
        let m = ModelSpec::from_config("vl", Path::new("vl.json"), &vl).unwrap();
        assert_eq!((m.family, m.layers, m.hidden, m.heads, m.kv_heads), (Family::Dense, 36, 4096, 32, 8));
        assert_eq!((m.head_dim, m.inter, m.vocab, m.max_position), (128, 12288, 151936, 262144));
        assert!(!m.qk_norm, "the reference times a VL wrapper's attention without Q/K-norm");
        // The same widths at the top level as Qwen3 keep it.
        let mut flat = text(json!({}));
        flat["architectures"] = json!(["Qwen3ForCausalLM"]);
        assert!(ModelSpec::from_config("q", Path::new("q.json"), &flat).unwrap().qk_norm);

        let moe = json!({"architectures": [MOE_ARCH], "text_config": text(json!({"num_experts": 128,
            "num_experts_per_tok": 8, "moe_intermediate_size": 768}))});
        let m = ModelSpec::from_config("vlm", Path::new("vlm.json"), &moe).unwrap();
        assert_eq!((m.family, m.experts, m.topk, m.moe_inter, m.qk_norm), (Family::Moe, 128, 8, 768, false));
        assert!(default_activation_row(&m.architecture) && !default_activation_row("Qwen3MoeForCausalLM"));
    }

    #[test]
    fn a_wrapper_without_text_config_is_refused_by_name() {
        let bare = json!({"architectures": [DENSE_ARCH], "hidden_size": 4096});
        let e = ModelSpec::from_config("vl", Path::new("vl.json"), &bare).unwrap_err().to_string();
        assert!(e.contains(DENSE_ARCH) && e.contains("text_config"), "{e}");
    }
}
