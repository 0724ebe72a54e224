//! Hybrid local / global attention with mixed MoE and dense FFN layers (Llama-4 Scout and
//! Maverick, MiMo-V2-Flash), as the reference's `HybridMoEModel` (family `HYBRIDMOE`) times them.
//!
//! Every layer is one of four kinds: global attention or local (sliding-window / chunked)
//! attention, followed by the fused MoE block or a dense gated FFN. The op list carries one
//! chain per kind present, scaled by the number of layers of that kind. Local layers may have
//! their own attention widths (MiMo-V2-Flash); the KV cache still grows linearly in every layer
//! at the global layers' width, as the reference sizes it (`model.rs` / `memory.rs` read the
//! model-level `kv_heads` and `head_dim`).

use serde_json::Value;

use crate::db::Dtype;
use crate::error::{PerfError, Result};
use crate::model::{attention_op, logits_gemm, push_moe_ops, AttentionHeads, Layout, ModelSpec, Op};
use crate::moe_ops::MLA_DISTRIBUTION;

/// What the layer patterns and the local attention add to a model's facts. Widths are resolved:
/// a local width the config does not give is the model-level one.
#[derive(Clone, Debug, PartialEq)]
pub struct HybridSpec {
    /// Layers per kind: `[global + MoE, local + MoE, local + dense, global + dense]`.
    pub counts: [u32; 4],
    /// Token window of the local layers (Llama-4's `attention_chunk_size`, MiMo's
    /// `sliding_window_size`).
    pub window: u32,
    pub local_heads: u32,
    pub local_kv_heads: u32,
    pub local_head_dim: u32,
    pub local_v_head_dim: u32,
    pub global_v_head_dim: u32,
    /// Intermediate width of the dense FFN layers.
    pub dense_inter: u32,
}

const GLOBAL_MOE: usize = 0;
const LOCAL_MOE: usize = 1;
const LOCAL_DENSE: usize = 2;
const GLOBAL_DENSE: usize = 3;

fn uint(cfg: &Value, key: &str) -> Option<u32> {
    cfg.get(key).and_then(Value::as_u64).map(|v| v as u32)
}

/// The hybrid facts of a Llama-4 (`text_config`) or MiMo-V2-Flash config. Llama-4 alternates
/// local (even) and global (odd) layers and makes layer `i` MoE when `(i + 1)` is a multiple of
/// `interleave_moe_layer_step`; MiMo lists both patterns per layer (`hybrid_layer_pattern`,
/// 1 = global as the reference reads it, and `moe_layer_freq`).
pub fn spec_from_config(arch: &str, root: &Value, cfg: &Value, m: &ModelSpec, shown: &str) -> Result<HybridSpec> {
    let layers = m.layers as usize;
    let (attn, moe): (Vec<u64>, Vec<u64>) = if arch == "Llama4ForConditionalGeneration" {
        if !root.get("vision_config").is_some_and(Value::is_object) {
            // The reference refuses a Llama-4 config without its vision tower's description.
            return Err(PerfError::config(format!("{shown}: {arch} needs its vision_config (as the reference does)")));
        }
        let step = match cfg.get("interleave_moe_layer_step") {
            None => 1,
            Some(v) => v.as_u64().filter(|&s| s > 0).ok_or_else(|| {
                PerfError::config(format!("{shown}: interleave_moe_layer_step must be a positive integer, got {v}"))
            })?,
        };
        (
            (0..layers as u64).map(|i| i % 2).collect(),
            (0..layers as u64).map(|i| u64::from((i + 1) % step == 0)).collect(),
        )
    } else {
        let list = |key: &str| -> Option<Vec<u64>> {
            match cfg.get(key)? {
                Value::Array(a) => a.iter().map(Value::as_u64).collect(),
                other => other.as_u64().map(|x| vec![x; layers]),
            }
        };
        // The attention pattern is a per-layer list; the MoE pattern may also be one value for all.
        let attn = cfg
            .get("hybrid_layer_pattern")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().map(Value::as_u64).collect::<Option<Vec<_>>>());
        (attn.unwrap_or_default(), list("moe_layer_freq").unwrap_or_default())
    };
    if attn.len() != layers || moe.len() != layers {
        return Err(PerfError::config(format!(
            "{shown}: hybrid layer patterns must have {layers} entries (num_hidden_layers), got attention {} and MoE {}",
            attn.len(),
            moe.len()
        )));
    }
    let mut counts = [0u32; 4];
    for (i, (&a, &f)) in attn.iter().zip(&moe).enumerate() {
        let kind = match (a, f) {
            (1, 1) => GLOBAL_MOE,
            (0, 1) => LOCAL_MOE,
            (0, 0) => LOCAL_DENSE,
            (1, 0) => GLOBAL_DENSE,
            _ => {
                return Err(PerfError::config(format!(
                    "{shown}: hybrid layer {i} has attention {a} and MoE {f}; both must be 0 or 1"
                )))
            }
        };
        counts[kind] += 1;
    }
    let width = |key: &str, default: u32| uint(cfg, key).filter(|&v| v > 0).unwrap_or(default);
    let llama4 = arch == "Llama4ForConditionalGeneration";
    Ok(HybridSpec {
        counts,
        window: if llama4 { width("attention_chunk_size", 0) } else { width("sliding_window_size", 0) },
        // The reference reads no local query-head count for either model.
        local_heads: m.heads,
        local_kv_heads: if llama4 { m.kv_heads } else { width("swa_num_key_value_heads", m.kv_heads) },
        local_head_dim: if llama4 { m.head_dim } else { width("swa_head_dim", m.head_dim) },
        local_v_head_dim: if llama4 { m.head_dim } else { width("swa_v_head_dim", m.head_dim) },
        global_v_head_dim: if llama4 { m.head_dim } else { width("v_head_dim", m.head_dim) },
        dense_inter: if llama4 { width("intermediate_size_mlp", m.inter) } else { m.inter },
    })
}

/// The MoE block's ops renamed from `{phase}_…` to `{prefix}_…`, with the dispatch carrying no
/// quantised volume (the reference's hybrid family hands its dispatch no format).
fn moe_block(m: &ModelSpec, l: &Layout, ctx: bool, scale: f64, prefix: &str) -> Vec<Op> {
    let phase = if ctx { "context" } else { "generation" };
    let mut ops = Vec::new();
    push_moe_ops(&mut ops, m, l, ctx, scale, MLA_DISTRIBUTION);
    let rename = |name: &mut String| *name = format!("{prefix}{}", &name[phase.len()..]);
    for op in &mut ops {
        match op {
            Op::Gemm { name, .. } => rename(name),
            Op::Moe(moe) => rename(&mut moe.name),
            Op::MoeDispatch(d) => {
                rename(&mut d.name);
                d.dtype = Dtype::Bfloat16;
                if !ctx && l.cp > 1 {
                    *d = d.clone().behind_replicated_cp(l.cp);
                }
            }
            _ => {}
        }
    }
    ops
}

/// `(context ops, generation ops)`: the embedding, then per layer kind present (global + MoE,
/// local + MoE, local + dense, global + dense), scaled by its layer count:
///
/// ```text
/// attn_norm, qkv GEMM, attention (local: within the window), proj GEMM, ffn norm,
/// MoE: router GEMM, dispatch, experts (power_law_1.01), combine | dense: gate_up, act, down
/// ```
///
/// then the logits GEMM (in both phases) and the pipeline hand-off. The dispatch ops carry the
/// tensor-parallel reduction of the MoE layers; like the reference, no layer has an all-reduce
/// of its own (dense layers included). MTP scales the generation ops by `(L + nextn) / L`.
pub fn build_hybrid_ops(m: &ModelSpec, hy: &HybridSpec, l: &Layout) -> Result<(Vec<Op>, Vec<Op>)> {
    let (tp, h) = (l.tp, m.hidden);
    if hy.local_heads < tp {
        return Err(PerfError::unsupported(format!(
            "{}: {} local attention heads cannot be split over tp={tp}",
            m.name, hy.local_heads
        )));
    }
    let layers = m.layers as f64;
    let mtp = if l.nextn == 0 { 1.0 } else { (l.nextn as f64 + layers) / layers };
    let act = 2.0;
    let global_kv = m.kv_heads.div_ceil(tp);
    let local_kv = hy.local_kv_heads.div_ceil(tp);
    // (query heads per GPU, KV heads per GPU, Q/K head, V head, window)
    let global = (m.heads / tp, global_kv, m.head_dim, hy.global_v_head_dim, 0);
    let local = (hy.local_heads / tp, local_kv, hy.local_head_dim, hy.local_v_head_dim, hy.window);
    let dense_inter = hy.dense_inter / tp;
    let mut out = (Vec::new(), Vec::new());
    for (ctx, list) in [(true, &mut out.0), (false, &mut out.1)] {
        let phase = if ctx { "context" } else { "generation" };
        let s = if ctx { 1.0 } else { mtp };
        list.push(Op::Embedding { name: format!("{phase}_embedding"), scale: s, bytes_per_token: h as f64 * 2.0 });
        // (kind, name infix, attention widths, MoE FFN)
        let kinds = [
            (GLOBAL_MOE, "global", global, true),
            (LOCAL_MOE, "swa", local, true),
            (LOCAL_DENSE, "swa_dense", local, false),
            (GLOBAL_DENSE, "global_dense", global, false),
        ];
        for (kind, infix, (n, n_kv, head, v_head, window), moe) in kinds {
            if hy.counts[kind] == 0 {
                continue;
            }
            let c = hy.counts[kind] as f64 * s;
            let prefix = format!("{phase}_{infix}");
            let norm = |x: &str| Op::Elementwise {
                name: format!("{prefix}_{x}"),
                scale: c,
                bytes_per_token: (4 * h) as f64 * act,
            };
            let gemm = |name: String, n: u32, k: u32, fp8_input: bool| Op::gemm(name, c, n, k, l.gemm, fp8_input);
            list.push(norm("attn_norm"));
            list.push(gemm(format!("{prefix}_qkv_gemm"), n * head + n_kv * (head + v_head), h, false));
            let attending = AttentionHeads { n, n_kv, head, window, qk_norm: false };
            list.push(attention_op(ctx, format!("{phase}_attention"), c, attending, l));
            list.push(gemm(format!("{prefix}_proj_gemm"), h, n * v_head, true));
            if moe {
                list.push(norm("moe_norm"));
                list.extend(moe_block(m, l, ctx, c, &prefix));
            } else {
                list.push(norm("ffn_norm"));
                // The dense FFN's names carry the attention kind only (`context_swa_dense_…`).
                let ffn = format!("{phase}_{}", infix.trim_end_matches("_dense"));
                list.push(gemm(format!("{ffn}_dense_gate_up_gemm"), 2 * dense_inter, h, false));
                list.push(Op::Elementwise {
                    name: format!("{ffn}_dense_act"),
                    scale: c,
                    bytes_per_token: (3 * dense_inter) as f64 * act,
                });
                list.push(gemm(format!("{ffn}_dense_down_gemm"), h, dense_inter, true));
            }
        }
        list.push(logits_gemm(format!("{phase}_logits_gemm"), s, m, tp));
        list.push(Op::pipeline_p2p(format!("{phase}_p2p"), s, h, l));
        if ctx && l.cp > 1 {
            // Prefill context parallelism: each attention kind's layers all-gather the whole
            // prompt's new KV (the local kind too: the window caps what is kept, not what moves),
            // in half-precision elements.
            let kinds = [("global", global, GLOBAL_MOE, GLOBAL_DENSE), ("swa", local, LOCAL_MOE, LOCAL_DENSE)];
            for (infix, (_, n_kv, head, v_head, _), with_moe, dense) in kinds {
                let layers = hy.counts[with_moe] + hy.counts[dense];
                if layers > 0 {
                    list.push(Op::CpAllGather {
                        name: format!("context_cp_all_gather_{infix}"),
                        scale: layers as f64,
                        elements: (n_kv * (head + v_head)) as f64 * l.kv.bytes() / 2.0,
                        gpus: l.cp,
                    });
                }
            }
        }
    }
    Ok(out)
}
