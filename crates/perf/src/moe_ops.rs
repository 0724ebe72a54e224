//! The mixture-of-experts ops of a model's op list: the fused expert FFN and the token
//! dispatch / combine around it (data and rooflines). Their latencies come from the `moe_perf`
//! table in `moe.rs`; `model.rs` lays them out.

use crate::db::{Database, Dtype};
use crate::model::{Layout, ModelSpec};

/// The routing skew the reference's MoE models query the table at (`power_law` with α = 1.2).
pub const DISTRIBUTION: &str = "power_law_1.2";

/// The routing skew the reference's DeepSeek-family (MLA) models query the table at
/// (`power_law` with α = 1.01).
pub const MLA_DISTRIBUTION: &str = "power_law_1.01";

/// Fused MoE FFN of one layer.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeOp {
    pub name: String,
    pub scale: f64,
    pub hidden: u32,
    pub inter: u32,
    pub topk: u32,
    pub experts: u32,
    pub moe_tp: u32,
    pub moe_ep: u32,
    pub attention_dp: u32,
    pub dtype: Dtype,
    pub distribution: String,
    /// Gated (SwiGLU: gate, up, down) expert FFN; `false` for two-GEMM experts.
    pub gated: bool,
}

impl MoeOp {
    /// The routed experts of `m` at layout `l`'s MoE widths and format, `hidden` wide (the
    /// model's hidden size, or a latent width).
    pub(crate) fn routed(
        name: String,
        scale: f64,
        hidden: u32,
        (m, l): (&ModelSpec, &Layout),
        distribution: &str,
        gated: bool,
    ) -> MoeOp {
        MoeOp {
            name,
            scale,
            hidden,
            inter: m.moe_inter,
            topk: m.topk,
            experts: m.experts,
            moe_tp: l.moe_tp,
            moe_ep: l.moe_ep,
            attention_dp: l.attention_dp,
            dtype: l.moe,
            distribution: distribution.to_string(),
            gated,
        }
    }

    fn gemms(&self) -> u64 {
        if self.gated {
            3
        } else {
            2
        }
    }

    /// Resident expert weights of this op (all its layers) on one GPU, bytes: the reference's
    /// `floor(floor(h · inter · E · bytes · gemms / ep) / tp) · scale`.
    pub fn weight_bytes(&self) -> f64 {
        let raw =
            self.hidden as f64 * self.inter as f64 * self.experts as f64 * self.dtype.bytes() * self.gemms() as f64;
        ((raw / self.moe_ep.max(1) as f64).floor() / self.moe_tp.max(1) as f64).floor() * self.scale
    }

    /// The MoE roofline at `tokens` (already multiplied by attention DP), ms.
    pub fn sol_ms(&self, db: &Database, tokens: u32, flops: f64) -> f64 {
        let total = tokens as u64 * self.topk as u64;
        let ep = (self.moe_ep as u64).max(1);
        let tp = (self.moe_tp as u64).max(1);
        let (h, inter, ne, g) = (self.hidden as u64, self.inter as u64, self.experts as u64, self.gemms());
        let ops = total * h * inter * g * 2 / ep / tp;
        let mem = total / ep * h * 2 + total / ep * inter * g / tp + h * inter * g / tp * (ne / ep).min(total / ep);
        let math_ms = ops as f64 / flops * 1000.0;
        let mem_ms = mem as f64 * self.dtype.bytes() / db.spec.mem_bw * 1000.0;
        math_ms.max(mem_ms)
    }
}

/// MoE token dispatch (before the experts) or combine (after them).
#[derive(Clone, Debug, PartialEq)]
pub struct DispatchOp {
    pub name: String,
    pub scale: f64,
    pub hidden: u32,
    pub moe_tp: u32,
    pub moe_ep: u32,
    pub attention_dp: u32,
    /// `true` before the experts, `false` for the combine after them.
    pub pre: bool,
    pub backend: String,
    pub dtype: Dtype,
    /// The model prices the attention all-reduce itself, so vLLM's dispatch adds none (the
    /// reference's `attn_ar_modeled`; Qwen3.5).
    pub attn_ar_modeled: bool,
    /// The context parallelism of the attention before it (the reference's `attn_cp_size`;
    /// 1: none). On SGLang a prefill dispatch gathers the CP-split tokens and its combine
    /// scatters them back; see `cp_decode` for a decode step's.
    pub attn_cp: u32,
    /// A decode step behind context-parallel ranks (the reference's `is_context = false` with
    /// `attn_cp_size > 1`, set by its hybrid and Gemma 4 builders): the attention is replicated
    /// over the CP ranks, so the dispatch moves nothing and the combine all-reduces the experts'
    /// partial outputs.
    pub cp_decode: bool,
}

impl DispatchOp {
    /// The dispatch (`pre`) or combine of `hidden`-wide tokens at layout `l`.
    pub(crate) fn at(name: String, scale: f64, hidden: u32, l: &Layout, pre: bool) -> DispatchOp {
        DispatchOp {
            name,
            scale,
            hidden,
            moe_tp: l.moe_tp,
            moe_ep: l.moe_ep,
            attention_dp: l.attention_dp,
            pre,
            backend: l.backend.clone(),
            dtype: l.moe,
            attn_ar_modeled: false,
            attn_cp: 1,
            cp_decode: false,
        }
    }

    /// The same op behind prefill attention split over `cp` context-parallel ranks.
    pub(crate) fn behind_cp(self, cp: u32) -> DispatchOp {
        DispatchOp { attn_cp: cp, ..self }
    }

    /// The same op in a decode step whose attention is replicated over `cp` ranks.
    pub(crate) fn behind_replicated_cp(self, cp: u32) -> DispatchOp {
        DispatchOp { attn_cp: cp, cp_decode: true, ..self }
    }

    /// The same op where the model prices the attention all-reduce itself.
    pub(crate) fn attn_ar_modeled(self) -> DispatchOp {
        DispatchOp { attn_ar_modeled: true, ..self }
    }
}
