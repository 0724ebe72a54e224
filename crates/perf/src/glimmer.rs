//! Muse-Glimmer (`MuseGlimmerForConditionalGeneration`, the reference's `MUSEGLIMMER` family): a
//! dense decoder of sliding-window and global attention layers, read from `text_config` (a
//! text-only load leaves the vision tower out: no op, no resident weight).
//!
//! Every layer has the same head geometry and runs one gated SwiGLU MLP at `intermediate_size`;
//! the layer kinds differ only in the attention window (`sliding_window` on
//! `sliding_attention` layers, none on `full_attention` ones). What sets the graph apart from
//! the dense one:
//!
//! - Q/K RMS-norm on every layer, in both phases;
//! - an attention output gate on every layer: a `hidden → heads·head_dim` GEMM
//!   (`gate_proj`) and a sigmoid multiply of the attention output, before `o_proj`;
//! - global layers skip the rotary pass (`layer_rope_theta` 0): their context attention is
//!   charged no RoPE traffic;
//! - the KV cache keeps at most the window on the sliding-window layers, so the KV budget holds
//!   the longest sequence whose window-capped cache fits (not budget / bytes-per-token).
//!
//! As the reference times it, each layer kind is one block scaled by its layer count
//! (sliding-window first), the two tensor-parallel all-reduces per layer sit after the blocks,
//! and the logits GEMM runs in bf16 in both phases. The memory model charges activations by the
//! dense (Llama) coefficient row. Logit softcapping, `qk_scale_factor` and `output_multiplier`
//! are scalar folds the reference does not time either.

use serde_json::Value;

use crate::db::Dtype;
use crate::error::{PerfError, Result};
use crate::model::{attention_op, logits_gemm, AttentionHeads, Layout, ModelSpec, Op};

/// The wrapper architecture.
pub const ARCH: &str = "MuseGlimmerForConditionalGeneration";

/// What a Muse-Glimmer adds to the dense model facts.
#[derive(Clone, Debug, PartialEq)]
pub struct GlimmerSpec {
    pub swa_layers: u32,
    pub global_layers: u32,
    /// `sliding_window` of the sliding-window layers (positive).
    pub window: u32,
}

/// The Muse-Glimmer facts of its text config: the layer kinds (`layer_types`, one per layer)
/// and the window.
pub(crate) fn spec_from_config(cfg: &Value, layers: u32, shown: &str) -> Result<GlimmerSpec> {
    let types = cfg
        .get("layer_types")
        .and_then(Value::as_array)
        .ok_or_else(|| PerfError::config(format!("{shown}: Muse-Glimmer needs text_config.layer_types")))?;
    if types.len() != layers as usize {
        return Err(PerfError::config(format!(
            "{shown}: Muse-Glimmer layer_types has {} entries for {layers} layers (num_hidden_layers)",
            types.len()
        )));
    }
    let (mut swa_layers, mut global_layers) = (0, 0);
    for t in types {
        match t.as_str() {
            Some("sliding_attention") => swa_layers += 1,
            Some("full_attention") => global_layers += 1,
            _ => {
                return Err(PerfError::config(format!(
                    "{shown}: Muse-Glimmer layer type {t} is neither sliding_attention nor full_attention"
                )))
            }
        }
    }
    let window = cfg.get("sliding_window").and_then(Value::as_u64).filter(|&w| w > 0 && w <= u32::MAX as u64);
    let window = window.ok_or_else(|| {
        PerfError::config(format!("{shown}: Muse-Glimmer needs a positive integer text_config.sliding_window"))
    })? as u32;
    Ok(GlimmerSpec { swa_layers, global_layers, window })
}

/// `(context ops, generation ops)`: per phase the embedding and its all-reduce, the
/// sliding-window block and the global block (each scaled by its layer count and MTP), the
/// per-layer all-reduces, the logits GEMM and the pipeline hand-off; under prefill context
/// parallelism, the context attention is split zigzag and every layer's KV is all-gathered.
pub(crate) fn build_glimmer_ops(m: &ModelSpec, g: &GlimmerSpec, l: &Layout) -> Result<(Vec<Op>, Vec<Op>)> {
    let (tp, h) = (l.tp, m.hidden);
    let layers = m.layers as f64;
    let mtp = if l.nextn == 0 { 1.0 } else { (l.nextn as f64 + layers) / layers };
    let kv = m.kv_heads.div_ceil(tp);
    let q_width = m.heads * m.head_dim / tp;
    let qkv = q_width + kv * m.head_dim * 2;
    let inter = m.inter / tp;
    let gemm = Op::gemm;
    let elementwise = |name: String, scale: f64, read: u32, written: u32| Op::Elementwise {
        name,
        scale,
        bytes_per_token: (read + written) as f64 * 2.0,
    };
    let mut out = (Vec::new(), Vec::new());
    for (phase, list) in [("context", &mut out.0), ("generation", &mut out.1)] {
        let ctx = phase == "context";
        let s = if ctx { 1.0 } else { mtp };
        list.push(Op::Embedding { name: format!("{phase}_embedding"), scale: s, bytes_per_token: h as f64 * 2.0 });
        list.push(Op::AllReduce { name: format!("{phase}_embedding_ar"), scale: s, hidden: h, tp });
        for (kind, count, window) in [("swa", g.swa_layers, g.window), ("global", g.global_layers, 0)] {
            if count == 0 {
                continue;
            }
            let c = count as f64 * s;
            let p = format!("{phase}_{kind}");
            list.push(elementwise(format!("{p}_attn_norm"), c, 2 * h, 2 * h));
            list.push(gemm(format!("{p}_qkv_gemm"), c, qkv, h, l.gemm, false));
            let heads = AttentionHeads { n: m.heads / tp, n_kv: kv, head: m.head_dim, window, qk_norm: true };
            let mut attention = attention_op(ctx, format!("{phase}_attention"), c, heads, l);
            if let Op::ContextAttention { rope, .. } = &mut attention {
                // Global layers are NoPE (`layer_rope_theta` 0).
                *rope = kind == "swa";
            }
            list.push(attention);
            list.push(gemm(format!("{p}_gate_gemm"), c, q_width, h, l.gemm, false));
            list.push(elementwise(format!("{p}_gate_mul"), c, 2 * q_width, q_width));
            list.push(gemm(format!("{p}_proj_gemm"), c, h, q_width, l.gemm, true));
            list.push(elementwise(format!("{p}_ffn_norm"), c, 2 * h, 2 * h));
            list.push(gemm(format!("{p}_mlp_gate_up_gemm"), c, 2 * inter, h, l.gemm, false));
            list.push(elementwise(format!("{p}_mlp_act"), c, 2 * inter, inter));
            list.push(gemm(format!("{p}_mlp_down_gemm"), c, h, inter, l.gemm, true));
        }
        list.push(Op::AllReduce { name: format!("{phase}_ar_1"), scale: layers * s, hidden: h, tp });
        list.push(Op::AllReduce { name: format!("{phase}_ar_2"), scale: layers * s, hidden: h, tp });
        list.push(logits_gemm(format!("{phase}_logits_gemm"), s, m, tp));
        list.push(Op::pipeline_p2p(format!("{phase}_p2p"), s, h, l));
        if ctx && l.cp > 1 {
            // Every layer's K and V of the whole prompt (the window caps only what is kept),
            // in half-precision elements.
            let elements = 2.0 * kv as f64 * m.head_dim as f64 * l.kv.bytes() / 2.0;
            list.push(Op::CpAllGather { name: format!("{phase}_cp_all_gather"), scale: layers, elements, gpus: l.cp });
        }
    }
    Ok(out)
}

/// KV bytes of one sequence of `len` tokens per GPU: the sliding-window layers keep at most the
/// window, the global layers every token.
pub(crate) fn kv_bytes_per_sequence(m: &ModelSpec, g: &GlimmerSpec, tp: u32, kv: Dtype, len: u64) -> f64 {
    let per_layer_token = m.kv_heads.div_ceil(tp) as f64 * m.head_dim as f64 * 2.0 * kv.bytes();
    per_layer_token * (g.swa_layers as f64 * len.min(g.window as u64) as f64 + g.global_layers as f64 * len as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn layer_kinds_and_window_are_read_and_bad_ones_refused() {
        let mut types = vec!["sliding_attention"; 3];
        types.push("full_attention");
        let cfg = json!({"layer_types": types, "sliding_window": 2048});
        assert_eq!(
            spec_from_config(&cfg, 4, "t").unwrap(),
            GlimmerSpec { swa_layers: 3, global_layers: 1, window: 2048 }
        );
        let e = spec_from_config(&cfg, 5, "t").unwrap_err().to_string();
        assert!(e.contains("4 entries for 5 layers"), "{e}");
        let e = spec_from_config(&json!({"layer_types": ["chunked_attention"], "sliding_window": 8}), 1, "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("chunked_attention"), "{e}");
        for w in [json!(0), json!(null), json!("2048")] {
            let e = spec_from_config(&json!({"layer_types": ["full_attention"], "sliding_window": w}), 1, "t")
                .unwrap_err()
                .to_string();
            assert!(e.contains("sliding_window"), "{e}");
        }
        let e = spec_from_config(&json!({"sliding_window": 8}), 1, "t").unwrap_err().to_string();
        assert!(e.contains("layer_types"), "{e}");
    }
}
