//! Gemma 4 (`Gemma4ForConditionalGeneration`, the reference's `GEMMA4MIX` family): the text
//! model under `text_config`, its op graph, formats and window-capped KV cache.
//!
//! Every layer is either a sliding-window (`sliding_attention`) or a global (`full_attention`)
//! attention layer; the two kinds differ in KV heads and head width, and a global layer with
//! `attention_k_eq_v` projects no V (the cache still holds K and V). Every layer runs a dense
//! gated MLP and, on the MoE variants, the routed experts after it. The reference times the
//! layers of each kind as one block scaled by their count, sliding-window layers first, with
//! no tensor-parallel all-reduce op, and a logits GEMM in both phases.
//!
//! A text-only load leaves the vision tower out: it adds no op and no resident weight unless
//! requests carry images (probed on google/gemma-4-26B-A4B: the same step times and KV
//! capacity with and without `vision_config`).

use serde_json::Value;

use crate::db::Dtype;
use crate::error::{PerfError, Result};
use crate::model::{attention_op, logits_gemm, moe_block, AttentionHeads, Layout, ModelSpec, Op};
use crate::moe_ops::MLA_DISTRIBUTION;

/// What a Gemma 4 adds to the common model facts.
#[derive(Clone, Debug, PartialEq)]
pub struct Gemma4Spec {
    pub swa_layers: u32,
    pub global_layers: u32,
    /// Sliding-window layers: KV heads and head width (`num_key_value_heads`, `head_dim`).
    pub swa_kv_heads: u32,
    pub swa_head: u32,
    /// Global layers (`num_global_key_value_heads`, `global_head_dim`; the sliding-window
    /// values when null, as on the dense variants).
    pub global_kv_heads: u32,
    pub global_head: u32,
    /// `sliding_window` (0: none).
    pub window: u32,
    /// Global layers reuse K's projection as V (`attention_k_eq_v`).
    pub k_eq_v: bool,
    /// The checkpoint keeps the attention projections (a `self_attn` exclusion) / the MLP and
    /// experts (a `.mlp` exclusion) in bf16.
    pub attn_bf16: bool,
    pub mlp_bf16: bool,
}

/// The Gemma 4 facts of a text config; `patterns`: the checkpoint's quantisation exclusions.
pub(crate) fn spec_from_config(cfg: &Value, layers: u32, patterns: &[String], shown: &str) -> Result<Gemma4Spec> {
    let types = cfg
        .get("layer_types")
        .and_then(Value::as_array)
        .ok_or_else(|| PerfError::config(format!("{shown}: Gemma 4 needs layer_types")))?;
    if types.len() != layers as usize {
        return Err(PerfError::config(format!(
            "{shown}: Gemma 4 layer_types has {} entries for {layers} layers",
            types.len()
        )));
    }
    let (mut swa, mut global) = (0, 0);
    for t in types {
        match t.as_str() {
            Some("sliding_attention") => swa += 1,
            Some("full_attention") => global += 1,
            _ => {
                return Err(PerfError::config(format!(
                    "{shown}: Gemma 4 layer type {t} is neither sliding_attention nor full_attention"
                )))
            }
        }
    }
    let uint = |k: &str| cfg.get(k).and_then(Value::as_u64).map(|v| v as u32);
    let swa_kv_heads = uint("num_key_value_heads")
        .filter(|&v| v > 0)
        .ok_or_else(|| PerfError::config(format!("{shown}: missing num_key_value_heads")))?;
    let swa_head =
        uint("head_dim").filter(|&v| v > 0).ok_or_else(|| PerfError::config(format!("{shown}: missing head_dim")))?;
    let lower: Vec<String> = patterns.iter().map(|p| p.to_lowercase()).collect();
    Ok(Gemma4Spec {
        swa_layers: swa,
        global_layers: global,
        swa_kv_heads,
        swa_head,
        global_kv_heads: uint("num_global_key_value_heads").unwrap_or(swa_kv_heads),
        global_head: uint("global_head_dim").unwrap_or(swa_head),
        window: uint("sliding_window").unwrap_or(0),
        k_eq_v: cfg.get("attention_k_eq_v").and_then(Value::as_bool).unwrap_or(false),
        attn_bf16: lower.iter().any(|p| p.contains("self_attn")),
        mlp_bf16: lower.iter().any(|p| p.contains(".mlp")),
    })
}

/// `(projections, dense MLP, experts)` formats: the checkpoint's bf16 exclusions apply unless
/// the GEMM format was given explicitly (then `gemm` and `moe` as given).
pub(crate) fn formats(g: &Gemma4Spec, gemm: Dtype, moe: Dtype, gemm_explicit: bool) -> (Dtype, Dtype, Dtype) {
    let bf = Dtype::Bfloat16;
    if gemm_explicit {
        return (gemm, gemm, moe);
    }
    let mlp = |d: Dtype| if g.mlp_bf16 { bf } else { d };
    (if g.attn_bf16 { bf } else { gemm }, mlp(gemm), mlp(moe))
}

/// `(context ops, generation ops)`: per phase the embedding, the sliding-window block and the
/// global block (each scaled by its layer count and MTP), the logits GEMM and the pipeline
/// hand-off. `l.gemm` times the attention projections, `l.shared_gemm` the dense MLP.
pub(crate) fn build_gemma4_ops(m: &ModelSpec, l: &Layout) -> Result<(Vec<Op>, Vec<Op>)> {
    let g = m.gemma4.as_ref().ok_or_else(|| PerfError::config(format!("{}: not a Gemma 4 model", m.name)))?;
    let (tp, h) = (l.tp, m.hidden);
    let layers = m.layers as f64;
    let mtp = if l.nextn == 0 { 1.0 } else { (l.nextn as f64 + layers) / layers };
    let heads = m.heads / tp;
    let inter = m.inter / tp;
    let routed = m.routed();
    let gemm = Op::gemm;
    let norm = |name: String, scale: f64, width: u32| Op::Elementwise {
        name,
        scale,
        bytes_per_token: (2 * width + 2 * width) as f64 * 2.0,
    };
    let mut out = (Vec::new(), Vec::new());
    for (phase, list) in [("context", &mut out.0), ("generation", &mut out.1)] {
        let ctx = phase == "context";
        let s = if ctx { 1.0 } else { mtp };
        list.push(Op::Embedding { name: format!("{phase}_embedding"), scale: s, bytes_per_token: h as f64 * 2.0 });
        let kinds = [
            ("swa", g.swa_layers, g.swa_kv_heads, g.swa_head, g.window, false),
            ("global", g.global_layers, g.global_kv_heads, g.global_head, 0, g.k_eq_v),
        ];
        for (kind, count, kv_heads, head, window, k_eq_v) in kinds {
            if count == 0 {
                continue;
            }
            let c = count as f64 * s;
            let p = format!("{phase}_{kind}");
            let kv = kv_heads.div_ceil(tp);
            let q_width = m.heads * head / tp;
            let qkv = q_width + kv * head * if k_eq_v { 1 } else { 2 };
            list.push(norm(format!("{p}_attn_norm"), c, h));
            list.push(gemm(format!("{p}_qkv_gemm"), c, qkv, h, l.gemm, false));
            let attending = AttentionHeads { n: heads, n_kv: kv, head, window, qk_norm: false };
            list.push(attention_op(ctx, format!("{phase}_attention"), c, attending, l));
            list.push(gemm(format!("{p}_proj_gemm"), c, h, q_width, l.gemm, true));
            list.push(norm(format!("{p}_ffn_norm"), c, h));
            list.push(gemm(format!("{p}_shared_mlp_gate_up_gemm"), c, 2 * inter, h, l.shared_gemm, false));
            list.push(Op::Elementwise {
                name: format!("{p}_shared_mlp_act"),
                scale: c,
                bytes_per_token: (2 * inter + inter) as f64 * 2.0,
            });
            list.push(gemm(format!("{p}_shared_mlp_down_gemm"), c, h, inter, l.shared_gemm, true));
            if routed {
                // The reference emits the router GEMM only for 128 experts or more.
                let mut block = moe_block(&p, m, l, c, MLA_DISTRIBUTION, m.experts >= 128);
                if l.cp > 1 {
                    for op in &mut block {
                        if let Op::MoeDispatch(d) = op {
                            let cp = d.clone();
                            *d = if ctx { cp.behind_cp(l.cp) } else { cp.behind_replicated_cp(l.cp) };
                        }
                    }
                }
                list.extend(block);
            }
        }
        list.push(logits_gemm(format!("{phase}_logits_gemm"), s, m, tp));
        list.push(Op::pipeline_p2p(format!("{phase}_p2p"), s, h, l));
        if ctx && l.cp > 1 {
            // Prefill context parallelism: each attention kind's layers all-gather the whole
            // prompt's new KV (K and V, the window notwithstanding), in half-precision elements.
            for (kind, count, kv_heads, head) in [
                ("swa", g.swa_layers, g.swa_kv_heads, g.swa_head),
                ("global", g.global_layers, g.global_kv_heads, g.global_head),
            ] {
                if count > 0 {
                    list.push(Op::CpAllGather {
                        name: format!("context_cp_all_gather_{kind}"),
                        scale: count as f64,
                        elements: (kv_heads.div_ceil(tp) * head * 2) as f64 * l.kv.bytes() / 2.0,
                        gpus: l.cp,
                    });
                }
            }
        }
    }
    Ok(out)
}

/// KV bytes per token per GPU of every layer, no window applied (both K and V are cached on
/// the global layers, even with `attention_k_eq_v`).
pub(crate) fn kv_bytes_per_token(g: &Gemma4Spec, tp: u32, kv: Dtype) -> f64 {
    let swa = (g.swa_layers * g.swa_kv_heads.div_ceil(tp) * g.swa_head) as f64;
    let global = (g.global_layers * g.global_kv_heads.div_ceil(tp) * g.global_head) as f64;
    2.0 * (swa + global) * kv.bytes()
}

/// KV bytes of one sequence of `len` tokens per GPU: the sliding-window layers keep at most
/// the window.
pub(crate) fn kv_bytes_per_sequence(g: &Gemma4Spec, tp: u32, kv: Dtype, len: u64) -> f64 {
    let per_layer = |heads: u32, head: u32| heads.div_ceil(tp) as f64 * head as f64 * 2.0 * kv.bytes();
    let swa_len = if g.window > 0 { len.min(g.window as u64) } else { len };
    g.swa_layers as f64 * per_layer(g.swa_kv_heads, g.swa_head) * swa_len as f64
        + g.global_layers as f64 * per_layer(g.global_kv_heads, g.global_head) * len as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(patterns: &[&str]) -> Gemma4Spec {
        let mut types = vec!["sliding_attention"; 5];
        types.push("full_attention");
        let cfg = json!({"layer_types": types, "num_key_value_heads": 8, "head_dim": 256,
                         "num_global_key_value_heads": 2, "global_head_dim": 512, "sliding_window": 1024,
                         "attention_k_eq_v": true});
        let patterns: Vec<String> = patterns.iter().map(|p| p.to_string()).collect();
        spec_from_config(&cfg, 6, &patterns, "test").unwrap()
    }

    #[test]
    fn layer_kinds_formats_and_window_capped_kv() {
        let g = spec(&["model.language_model.layers.0.self_attn*", "model.language_model.layers.0.mlp*"]);
        assert_eq!((g.swa_layers, g.global_layers, g.global_head, g.window), (5, 1, 512, 1024));
        assert!(g.k_eq_v && g.attn_bf16 && g.mlp_bf16);
        let (bf, f4) = (Dtype::Bfloat16, Dtype::Nvfp4);
        assert_eq!(formats(&g, f4, f4, false), (bf, bf, bf));
        assert_eq!(formats(&g, f4, f4, true), (f4, f4, f4));
        assert_eq!(formats(&spec(&["lm_head"]), f4, f4, false), (f4, f4, f4));
        // tp 2: 4 sliding KV heads × 256 and 1 global KV head × 512, K and V, bf16.
        let per_token = kv_bytes_per_token(&g, 2, bf);
        assert_eq!(per_token, 2.0 * (5.0 * 4.0 * 256.0 + 512.0) * 2.0);
        assert_eq!(kv_bytes_per_sequence(&g, 2, bf, 100), per_token * 100.0);
        let long = kv_bytes_per_sequence(&g, 2, bf, 4096);
        assert_eq!(long, 2.0 * 2.0 * (5.0 * 4.0 * 256.0 * 1024.0 + 512.0 * 4096.0));
    }
}
