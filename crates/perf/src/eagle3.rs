//! EAGLE-3 speculative decoding: the draft network's ops beside the target's.
//!
//! An EAGLE-3 draft is one decoder layer whose QKV projection reads the token embedding and the
//! previous hidden state side by side (input width `2 × hidden`), an `fc` GEMM that fuses three
//! of the target's hidden states into the draft input once per round, and a head over the
//! draft's reduced vocabulary. Its geometry comes from the draft checkpoint's `config.json`
//! (`speculation.draft_config`). As the reference (aisimulate 0.13) prices it:
//!
//! - **decode:** the target verifies `n + 1` tokens per request in one block pass (the layout's
//!   verify width, as for ngram); the draft runs `fc` once and its layer `n` times, one token per
//!   request each. Each draft op is wrapped in [`Op::TokenScale`], which maps the step's verify
//!   batch back to the draft's own width before the op's table is read;
//! - **prefill:** the draft builds its KV over the prompt: `fc` and one layer over the same
//!   tokens as the target;
//! - **mixed passes:** the draft's prefill is timed with the context attention (at the prefill
//!   shape, not in the shared token-major pass), its decode ops with the decode attention.
//!
//! Op names start with `draft_`, as the reference's do, so a mixed pass can tell them apart.
//! Only chains are modelled (the reference's replay refuses trees). The draft's weights and KV
//! do not size a cache: the reference requires a fixed KV capacity beside a draft scheme.

use serde_json::Value;

use crate::db::Dtype;
use crate::error::{PerfError, Result};
use crate::model::{Layout, ModelSpec, Op};

/// EAGLE-3 fuses this many of the target's hidden states (low, middle, high) in `fc`.
const AUX_HIDDENS: u32 = 3;

/// The draft layer's geometry, read from its checkpoint's `config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct DraftGeometry {
    pub layers: u32,
    pub hidden: u32,
    pub inter: u32,
    pub heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub window: u32,
    pub qk_norm: bool,
    /// The head's vocabulary: `draft_vocab_size`, else `vocab_size`.
    pub vocab: u32,
}

impl DraftGeometry {
    /// Reads an HF config as the reference's dense draft geometry reads it: the four widths
    /// required, KV heads defaulting to the heads, the head size to `hidden / heads`, q/k norms
    /// for `model_type: qwen3` layers only.
    pub fn from_hf(cfg: &Value) -> std::result::Result<DraftGeometry, String> {
        let positive = |k: &str| -> std::result::Result<Option<u32>, String> {
            match cfg.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => match v.as_u64() {
                    Some(n) if n > 0 && n <= u32::MAX as u64 => Ok(Some(n as u32)),
                    _ => Err(format!("{k} must be a positive integer, got {v}")),
                },
            }
        };
        let required = ["num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads"];
        let missing: Vec<&str> = required.iter().copied().filter(|k| cfg.get(*k).is_none_or(Value::is_null)).collect();
        if !missing.is_empty() {
            return Err(format!("the draft config lacks required keys: {}", missing.join(", ")));
        }
        let [layers, hidden, inter, heads] = required.map(|k| positive(k).map(|v| v.unwrap_or(1)));
        let (layers, hidden, inter, heads) = (layers?, hidden?, inter?, heads?);
        let head_dim = match positive("head_dim")? {
            Some(d) => d,
            None if !hidden.is_multiple_of(heads) => {
                return Err("hidden_size must be divisible by num_attention_heads when head_dim is absent".into())
            }
            None => hidden / heads,
        };
        let window = if cfg.get("use_sliding_window") == Some(&Value::Bool(false)) {
            0
        } else {
            positive("sliding_window")?.unwrap_or(0)
        };
        let vocab = match positive("draft_vocab_size")? {
            Some(v) => v,
            None => positive("vocab_size")?.ok_or("the draft config needs draft_vocab_size or vocab_size")?,
        };
        Ok(DraftGeometry {
            layers,
            hidden,
            inter,
            heads,
            kv_heads: positive("num_key_value_heads")?.unwrap_or(heads),
            head_dim,
            window,
            qk_norm: cfg.get("model_type").and_then(Value::as_str) == Some("qwen3"),
            vocab,
        })
    }

    /// The reference's checks of a draft against its target and layout.
    pub fn check(&self, m: &ModelSpec, tp: u32) -> Result<()> {
        let refuse = |why: String| Err(PerfError::unsupported(format!("eagle3 speculation: {why}")));
        if !self.heads.is_multiple_of(tp) {
            return refuse(format!("draft num_attention_heads {} must be divisible by tp {tp}", self.heads));
        }
        if !self.inter.is_multiple_of(tp) {
            return refuse(format!("draft intermediate_size {} must be divisible by tp {tp}", self.inter));
        }
        if self.hidden != m.hidden {
            return refuse(format!(
                "draft hidden_size {} != target hidden_size {}; the fc fusion needs matching widths",
                self.hidden, m.hidden
            ));
        }
        Ok(())
    }
}

/// `(context ops, generation ops)` of an EAGLE-3 chain of `tokens` drafts, to append to the
/// target's lists. `l.ngram` must be `tokens` (the target's verify width is `tokens + 1`).
pub fn draft_ops(g: &DraftGeometry, l: &Layout, tokens: u32) -> (Vec<Op>, Vec<Op>) {
    let verify = tokens + 1;
    let scaled = |op: Op| Op::TokenScale { op: Box::new(op), num: 1, den: verify };
    let mut context = vec![fc(g, l)];
    context.extend(layer(g, l, true));
    let mut generation = vec![scaled(fc(g, l))];
    for _ in 0..tokens {
        generation.extend(layer(g, l, false).into_iter().map(scaled));
    }
    (context, generation)
}

fn fc(g: &DraftGeometry, l: &Layout) -> Op {
    Op::gemm("draft_eagle3_fc".into(), 1.0, g.hidden, g.hidden * AUX_HIDDENS, l.gemm, false)
}

/// The draft decoder layer and its head, one token per request (the target's Llama layer with a
/// `2 × hidden` QKV input).
fn layer(g: &DraftGeometry, l: &Layout, ctx: bool) -> Vec<Op> {
    let tp = l.tp;
    let h = g.hidden;
    let n = f64::from(g.layers);
    let kv_per_gpu = (g.kv_heads / tp).max(1);
    let q_width = g.heads * g.head_dim / tp;
    let act = 2.0; // bf16 activations
    let norm = |name: &str| Op::Elementwise { name: name.into(), scale: n, bytes_per_token: f64::from(4 * h) * act };
    let (name, heads, head, window, qk_norm) =
        ("draft_eagle3_attention".to_string(), g.heads / tp, g.head_dim, g.window, g.qk_norm);
    let attention = if ctx {
        let (kv, fmha) = (l.kv, l.fmha);
        Op::ContextAttention {
            name,
            scale: n,
            n: heads,
            n_kv: kv_per_gpu,
            head,
            window,
            kv,
            fmha,
            qk_norm,
            cp: 1,
            rope: true,
        }
    } else {
        // One draft token per request: a plain decode read (the TokenScale wrapper has already
        // folded the verify batch back to the requests).
        Op::GenerationAttention {
            name,
            scale: n,
            n: heads,
            n_kv: kv_per_gpu,
            head,
            window,
            kv: l.kv,
            qk_norm,
            verify: 1,
        }
    };
    vec![
        norm("draft_eagle3_add_norm_1"),
        Op::gemm("draft_eagle3_qkv_gemm".into(), n, q_width + g.head_dim * kv_per_gpu * 2, 2 * h, l.gemm, false),
        attention,
        Op::gemm("draft_eagle3_proj_gemm".into(), n, h, q_width, l.gemm, true),
        norm("draft_eagle3_add_norm_2"),
        Op::gemm("draft_eagle3_gate_ffn1_gemm".into(), n, 2 * g.inter / tp, h, l.gemm, false),
        Op::Elementwise {
            name: "draft_eagle3_act_gate".into(),
            scale: n,
            bytes_per_token: f64::from(2 * g.inter / tp + g.inter / tp) * act,
        },
        Op::gemm("draft_eagle3_ffn2_gemm".into(), n, h, g.inter / tp, l.gemm, true),
        Op::AllReduce { name: "draft_eagle3_ar_1".into(), scale: n, hidden: h, tp },
        Op::AllReduce { name: "draft_eagle3_ar_2".into(), scale: n, hidden: h, tp },
        Op::gemm("draft_eagle3_head_gemm".into(), 1.0, (g.vocab / tp).max(1), h, Dtype::Bfloat16, false),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_geometry_is_read_as_the_reference_reads_it() {
        let cfg = json!({"model_type": "llama", "num_hidden_layers": 1, "hidden_size": 5120,
                         "intermediate_size": 25600, "num_attention_heads": 64, "num_key_value_heads": 8,
                         "vocab_size": 151936, "draft_vocab_size": 32000});
        let g = DraftGeometry::from_hf(&cfg).unwrap();
        assert_eq!((g.head_dim, g.kv_heads, g.vocab, g.qk_norm, g.window), (80, 8, 32000, false, 0));
        let e = DraftGeometry::from_hf(&json!({"hidden_size": 8})).unwrap_err();
        assert_eq!(
            e,
            "the draft config lacks required keys: num_hidden_layers, intermediate_size, num_attention_heads"
        );
        let e = DraftGeometry::from_hf(&json!({"num_hidden_layers": 1, "hidden_size": 10, "intermediate_size": 4,
                                                "num_attention_heads": 3, "vocab_size": 5}))
        .unwrap_err();
        assert!(e.contains("divisible"), "{e}");
    }
}
