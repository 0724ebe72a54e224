//! Standalone draft-model speculative decoding: a whole smaller model drafts for the target.
//!
//! The draft (e.g. Qwen3-0.6B for Qwen3-8B) is a complete model of its own: its embedding, its
//! layers, its head and its own KV cache; it reads none of the target's hidden states. As the
//! reference (aisimulate 0.13, vLLM's `method="draft_model"`) prices a chain of `n` drafts:
//!
//! - **decode:** the draft's whole generation graph runs `n` times, one token per request each
//!   (every op wrapped in [`Op::TokenScale`] to fold the step's verify batch back to the
//!   requests), and the target verifies `n + 1` tokens per request in one block pass (the
//!   layout's verify width, as for ngram);
//! - **prefill:** the draft's whole context graph runs over the same prompt, building its KV.
//!
//! The draft is built by servesim's own op builder from the draft checkpoint's config (found as
//! the target's is, in the data's `model_configs`), at the draft's tensor-parallel width
//! (`draft_tp_size`, else the target's), pipeline width 1, with the target's number formats
//! (the reference's draft inherits the target's quantisation). Its op names gain the `draft_`
//! prefix, as the reference's do, so a mixed pass times them with their phase's attention.
//!
//! Only dense Llama-style drafts are modelled: a MoE, MLA or hybrid draft's ops read the
//! model's expert and attention geometry, which the target's estimator does not hold. The
//! draft's weights and KV do not size a cache: the reference requires a fixed KV capacity
//! beside a draft scheme.

use std::path::PathBuf;

use crate::error::{PerfError, Result};
use crate::model::{build_ops, Family, Layout, ModelSpec, Op};

/// A standalone draft: its checkpoint id, its chain length and its tensor-parallel width.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DraftModel {
    /// The draft checkpoint's id (`draft_model_path`), looked up as the target's model is.
    pub path: String,
    /// Drafts per round (`params.num_speculative_tokens`).
    pub tokens: u32,
    /// `params.draft_tp_size`; the target's tensor-parallel width when unset.
    pub tp: Option<u32>,
}

/// `(context ops, generation ops)` of `d`, to append to the target's lists. `target` is the
/// target's layout; its verify width (`ngram + 1`) must be `d.tokens + 1`.
pub fn draft_ops(d: &DraftModel, target: &Layout, roots: &[PathBuf]) -> Result<(Vec<Op>, Vec<Op>)> {
    let draft = ModelSpec::load(&d.path, roots)?;
    let refuse = |why: String| Err(PerfError::unsupported(format!("draft_model speculation ({}): {why}", d.path)));
    if draft.family != Family::Dense || draft.hybrid.is_some() || draft.gemma4.is_some() || draft.glimmer.is_some() {
        return refuse(format!(
            "only dense Llama-style drafts are modelled, not {} (a MoE, MLA or hybrid draft's ops need its own \
             expert and attention geometry beside the target's)",
            draft.architecture
        ));
    }
    let tp = d.tp.unwrap_or(target.tp);
    if !draft.heads.is_multiple_of(tp) {
        return refuse(format!("the draft's {} attention heads do not split over draft tp {tp}", draft.heads));
    }
    // The reference rebuilds the target's model config for the draft: its TP (experts follow
    // it), one pipeline stage, no MTP or speculation of its own, the target's formats.
    let layout = Layout { tp, pp: 1, cp: 1, dcp: 1, moe_tp: tp, moe_ep: 1, nextn: 0, ngram: 0, ..target.clone() };
    let (context, generation) = build_ops(&draft, &layout)?;
    let verify = d.tokens + 1;
    let context = context.into_iter().map(drafted).collect();
    let generation = (0..d.tokens)
        .flat_map(|_| generation.iter().cloned())
        .map(|op| Op::TokenScale { op: Box::new(drafted(op)), num: 1, den: verify })
        .collect();
    Ok((context, generation))
}

/// `op` under the draft's name (`draft_<name>`).
fn drafted(mut op: Op) -> Op {
    let name = op.name_mut();
    name.insert_str(0, "draft_");
    op
}
