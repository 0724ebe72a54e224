//! Decode context parallelism (vLLM `-dcp`, SGLang `--dcp-size`; the AIS config's `dcp`): the
//! persistent KV of a tensor-parallel group is striped by token position over `dcp` of its
//! ranks, each holding about `1/dcp` of every sequence.
//!
//! A decode step then runs its attention on every rank for the whole DCP group's query heads
//! (`n · dcp`, gathered) over the rank's own `⌈s / dcp⌉` KV stripe, and merges the partial
//! outputs by their log-sum-exp. As the reference prices it, every decode attention op of the
//! target model (a draft keeps its whole KV on every rank) is read at that geometry and is
//! followed by the merge's collectives:
//!
//! * the query all-gather (`q_all_gather`, fp8 when attention runs in fp8),
//! * vLLM's default merge (`ag_rs`): the fp32 LSE all-gather, the in-place output correction and
//!   the output reduce-scatter by head; SGLang's (`a2a`): output and LSE packed into one
//!   all-to-all, then unpacked and combined.
//!
//! A prefill on the same engine that reuses cached context first all-gathers the other ranks'
//! stripes of it. The KV capacity of a rank's budget grows by `dcp` (`memory.rs`).
//!
//! DSA sparse attention (DeepSeek-V3.2, GLM-5.x) also merges the indexer's per-rank top-k
//! candidates before the sparse attention: each rank packs its (fp32 score, int32 id) pairs, one
//! all-gather over the group, then a top-k over the merged `dcp · topk` (`topk_pack`,
//! `topk_all_gather`, `topk_merge`); the block itself prices the rank's share (`dsa.rs`).
//!
//! Modelled where the reference's model classes claim it: multi-head latent attention
//! (DeepSeek-V3 family, Kimi-K2.5) on vLLM and SGLang, DSA on vLLM (FlashMLA sparse: fp8 KV
//! unless the FlashInfer sparse backend is pinned), Kimi-K3's MLA layers on SGLang (its KDA
//! layers keep no KV), and GQA (Llama-style dense, plain MoE) on vLLM while
//! `dcp ≤ tp / kv_heads` (DCP only de-duplicates KV heads that TP replicates).
//! The merge style and the replicated query projection (the reference's `dcp_comm`,
//! `dcp_q_replicate`) are the backends' defaults: the AIS config has no key for them. The
//! query side is replicated only for Kimi-K3 on SGLang (its model override's default): the
//! decode q_b projection and absorb BMM run for the group's `n · dcp` heads on every rank and
//! the query all-gather goes.

use crate::db::Dtype;
use crate::error::{PerfError, Result};
use crate::mla_ops::MlaKind;
use crate::model::{DsaSpec, Family, Layout, ModelSpec, Op};

/// The latent KV entry the reference's MLA ops gather per cached token, in elements: DeepSeek-V3's
/// `kv_lora_rank + qk_rope_head_dim`, whatever the model.
const MLA_GATHER_ELEMENTS: f64 = 576.0;

/// An attention op whose KV is striped over `dcp` ranks.
#[derive(Clone, Debug, PartialEq)]
pub struct Striped {
    /// The op as the rank runs it. A decode MLA op's heads are already the gathered `n · dcp`;
    /// a GQA decode op keeps its own (its Q/K norm stays rank-local) and is widened when read.
    pub op: Box<Op>,
    pub dcp: u32,
    /// Context side: the cached-context all-gather, `(half-precision elements per cached token,
    /// the op's scale)`. `None`: a decode op, read over the rank's stripe.
    pub gather: Option<(f64, f64)>,
}

/// The reference's model family of an architecture (its `ARCHITECTURE_TO_MODEL_FAMILY`), as its
/// messages name it.
fn reference_family(architecture: &str) -> &str {
    match architecture {
        "LlamaForCausalLM" | "Qwen2ForCausalLM" | "Qwen3ForCausalLM" | "MiMoForCausalLM" => "LLAMA",
        "Qwen3VLForConditionalGeneration" => "QWEN3VL",
        "Qwen3VLMoeForConditionalGeneration" => "QWEN3VL_MOE",
        "DeepSeekForCausalLM" | "DeepseekV3ForCausalLM" => "DEEPSEEK",
        "DeepseekV32ForCausalLM" | "GlmMoeDsaForCausalLM" => "DEEPSEEKV32",
        "DeepseekV4ForCausalLM" => "DEEPSEEKV4",
        "DeepseekV41ForCausalLM" => "DEEPSEEKV41",
        "Glm5NextForConditionalGeneration" => "GLM53FLASH",
        "KimiK25ForConditionalGeneration" => "KIMIK25",
        "KimiK3ForConditionalGeneration" => "KIMIK3",
        "NemotronForCausalLM" | "DeciLMForCausalLM" => "NEMOTRONNAS",
        "NemotronHForCausalLM" | "NemotronH_Omni_Reasoning_V3" => "NEMOTRONH",
        "MixtralForCausalLM"
        | "GptOssForCausalLM"
        | "Qwen2MoeForCausalLM"
        | "Qwen3MoeForCausalLM"
        | "MiniMaxM2ForCausalLM" => "MOE",
        "MiniMaxM3ForCausalLM" | "MiniMaxM3SparseForConditionalGeneration" => "MINIMAXM3",
        "Step3p7ForConditionalGeneration"
        | "Step3p5ForCausalLM"
        | "Step3p7FlashForCausalLM"
        | "Step3p5FlashForCausalLM" => "STEP3P7",
        "MiMoV2FlashForCausalLM" | "Llama4ForConditionalGeneration" => "HYBRIDMOE",
        "Qwen3_5ForConditionalGeneration" | "Qwen3_5MoeForConditionalGeneration" | "Qwen3_5MoeForCausalLM" => "QWEN35",
        "Gemma4ForConditionalGeneration" => "GEMMA4MIX",
        "MuseGlimmerForConditionalGeneration" => "MUSEGLIMMER",
        "Mistral3ForConditionalGeneration" => "MISTRAL3",
        other => other,
    }
}

/// The reference's refusal of prefill context parallelism (`cp_size > 1`) on `architecture`
/// and `backend`, in its words: every model class that claims prefill CP claims it on SGLang
/// only, and MiniMax-M3, Qwen3.5, Nemotron-H / Nemotron-NAS, Kimi-K3, DeepSeek-V4.1 and
/// GLM-5.3-Flash claim it nowhere. `None` where the reference would build the graph, or does not
/// know the architecture (servesim's own gate decides then).
pub(crate) fn prefill_cp_refusal(architecture: &str, backend: &str, cp: u32) -> Option<PerfError> {
    let family = reference_family(architecture);
    let claimed = match family {
        "LLAMA" | "QWEN3VL" | "MISTRAL3" | "MOE" | "QWEN3VL_MOE" | "HYBRIDMOE" | "STEP3P7" | "GEMMA4MIX"
        | "DEEPSEEK" | "KIMIK25" | "DEEPSEEKV32" | "DEEPSEEKV4" | "MUSEGLIMMER" => backend == "sglang",
        "KIMIK3" | "NEMOTRONNAS" | "NEMOTRONH" | "MINIMAXM3" | "QWEN35" | "DEEPSEEKV41" | "GLM53FLASH" => false,
        _ => return None,
    };
    (!claimed).then(|| {
        PerfError::unsupported(format!(
            "Context parallelism (cp_size={cp}) is not supported for model_family='{family}' on \
             backend='{backend}'. The model class must override ``supports_cp`` and implement CP in its op \
             pipeline."
        ))
    })
}

/// Whether the reference's model class of `family` claims decode CP on `backend`.
fn claimed(family: &str, backend: &str) -> bool {
    match family {
        "DEEPSEEK" | "KIMIK25" => matches!(backend, "vllm" | "sglang"),
        "LLAMA" | "QWEN3VL" | "MISTRAL3" | "MOE" | "QWEN3VL_MOE" | "DEEPSEEKV32" => backend == "vllm",
        "KIMIK3" => backend == "sglang",
        _ => false,
    }
}

/// Checks that `m` on `l` can be timed under decode CP, in the reference's words where it
/// refuses; what the reference times but servesim does not is refused by name.
/// `attention_backend` is the user's attention kernel pin.
pub fn check(m: &ModelSpec, l: &Layout, attention_backend: Option<&str>) -> Result<()> {
    let (dcp, backend) = (l.dcp, l.backend.as_str());
    if dcp <= 1 {
        return Ok(());
    }
    if !l.tp.is_multiple_of(dcp) {
        return Err(PerfError::config("dcp_size must be positive and divide tp_size"));
    }
    let family = reference_family(&m.architecture);
    if !claimed(family, backend) {
        return Err(PerfError::unsupported(format!(
            "Decode context parallelism (dcp_size={dcp}) is not supported for model_family='{family}' on \
             backend='{backend}'. The model class must override ``supports_dcp`` and implement the KV-sharded \
             decode path."
        )));
    }
    let plain = m.hybrid.is_none()
        && m.gemma4.is_none()
        && m.qwen35.is_none()
        && m.nemotron_h.is_none()
        && m.glimmer.is_none()
        && m.kimi_k3.is_none();
    let gqa = match m.family {
        // Kimi-K3 stripes its MLA layers' latent KV; the KDA layers keep none.
        Family::Moe if m.kimi_k3.is_some() && m.mla.is_some() => false,
        Family::Dsa if plain && m.dsa.is_some() => false,
        Family::Mla if plain && m.dsa.is_none() && m.mla.is_some() => false,
        Family::Dense | Family::Moe if plain && m.mla.is_none() => true,
        _ => {
            return Err(PerfError::unsupported(format!(
                "{}: decode context parallelism (dcp={dcp}) of {} ({family}) is timed by the reference but not \
                 modelled by servesim (it models multi-head latent attention, Kimi-K3 and plain GQA models)",
                m.name, m.architecture
            )))
        }
    };
    // vLLM's FlashMLA sparse kernel (DSA's default decode backend) merges only by LSE all-gather
    // and reduce-scatter, and only from an fp8 KV cache; FlashInfer's sparse MLA does both.
    let flashinfer = attention_backend.is_some_and(|b| b.to_ascii_lowercase().contains("flashinfer"));
    if m.family == Family::Dsa && backend == "vllm" && !flashinfer && l.kv.bytes() != 1.0 {
        return Err(PerfError::config(format!(
            "{} decode context parallelism on vLLM's FlashMLA sparse backend requires an fp8 KV cache (got \
             kvcache_quant_mode={}); the bf16 sparse path returns no LSE for the DCP merge.",
            m.architecture,
            l.kv.name()
        )));
    }
    // MLA keeps one latent KV on every rank: any DCP that divides TP de-duplicates it.
    let limit = l.tp / m.kv_heads.max(1);
    if gqa && dcp > limit {
        return Err(PerfError::config(format!(
            "dcp_size={dcp} exceeds the KV-head replication of this layout ({limit}): GQA decode CP only \
             de-duplicates kv heads that TP replicates (dcp <= tp / kv_heads)."
        )));
    }
    Ok(())
}

/// The first decode attention op a rewrite met: its name-giving block's scale, its heads on
/// this rank and the query / output widths per head the merge moves.
#[derive(Clone, Copy)]
struct Hit {
    scale: f64,
    heads: u32,
    q_dim: u32,
    v_dim: u32,
    /// The indexer's top-k a DSA block merges over the group (0: none).
    topk: u32,
}

/// Rewrites the op lists of `m` on `l` for decode CP (`l.dcp > 1`): every decode attention op of
/// the target model reads its stripe and is followed by the merge's collectives, every context
/// attention op gathers the cached stripes first. Draft ops (`draft_…`) are left alone.
pub fn apply(
    m: &ModelSpec,
    l: &Layout,
    attention_backend: Option<&str>,
    context: &mut Vec<Op>,
    generation: &mut Vec<Op>,
) -> Result<()> {
    let dcp = l.dcp;
    if dcp <= 1 {
        return Ok(());
    }
    check(m, l, attention_backend)?;
    let q_replicate = replicates_q(m, l);
    let latent = match &m.dsa {
        Some(DsaSpec { kv_dims: [lora, rope, _], .. }) => Some((lora + rope, *lora)),
        None => m.mla.map(|d| (d.kv_lora_rank + d.qk_rope_head_dim, d.kv_lora_rank)),
    };
    let mut rewritten = Vec::with_capacity(generation.len() + 4);
    let mut touched = 0;
    for op in std::mem::take(generation) {
        if op.is_draft() {
            rewritten.push(op);
            continue;
        }
        let mut hit = None;
        let op = stripe_decode(op, dcp, latent, &mut hit);
        let op = if q_replicate { replicate_q_side(op, dcp) } else { op };
        let name = op.name().to_string();
        rewritten.push(op);
        if let Some(hit) = hit {
            rewritten.extend(merge_ops(&name, hit, l, q_replicate));
            touched += 1;
        }
    }
    if touched == 0 {
        return Err(PerfError::unsupported(format!(
            "{}: no decode attention op to stripe; decode context parallelism cannot be priced for this graph",
            m.name
        )));
    }
    *generation = rewritten;
    let kv_bytes = l.kv.bytes();
    *context = std::mem::take(context)
        .into_iter()
        .map(|op| if op.is_draft() { op } else { stripe_context(op, dcp, kv_bytes) })
        .collect();
    Ok(())
}

/// `op` with its decode attention striped (inside fallback chains and overlaps too); `hit` takes
/// the first one met.
fn stripe_decode(op: Op, dcp: u32, latent: Option<(u32, u32)>, hit: &mut Option<Hit>) -> Op {
    let wrap = |op: Op| Op::Striped(Striped { op: Box::new(op), dcp, gather: None });
    match op {
        Op::Fallback { name, primary, fallback } => {
            let primary = Box::new(stripe_decode(*primary, dcp, latent, hit));
            let fallback = fallback.into_iter().map(|o| stripe_decode(o, dcp, latent, hit)).collect();
            Op::Fallback { name, primary, fallback }
        }
        Op::Overlap { name, a, b } => {
            let a = a.into_iter().map(|o| stripe_decode(o, dcp, latent, hit)).collect();
            let b = b.into_iter().map(|o| stripe_decode(o, dcp, latent, hit)).collect();
            Op::Overlap { name, a, b }
        }
        Op::GenerationAttention { scale, n, head, .. } => {
            hit.get_or_insert(Hit { scale, heads: n, q_dim: head, v_dim: head, topk: 0 });
            wrap(op)
        }
        Op::Dsa(mut d) if !d.context => {
            let (q_dim, v_dim) = latent.unwrap_or((576, 512));
            let topk = d.arch.dims().index_topk as u32;
            hit.get_or_insert(Hit { scale: d.scale, heads: d.heads, q_dim, v_dim, topk });
            d.dcp = dcp;
            Op::Dsa(d)
        }
        Op::Mla(mut mla) if matches!(mla.kind, MlaKind::Generation | MlaKind::GenerationModule) => {
            // The reference's default latent widths where a config gives none.
            let (q_dim, v_dim) = latent.unwrap_or((576, 512));
            hit.get_or_insert(Hit { scale: mla.scale, heads: mla.heads, q_dim, v_dim, topk: 0 });
            mla.heads *= dcp;
            wrap(Op::Mla(mla))
        }
        other => other,
    }
}

/// Whether every rank runs the query side for the whole DCP group (SGLang's
/// `--dcp-replicate-q-proj`): Kimi-K3's SGLang override turns it on under its default
/// all-to-all merge, every other model leaves it off (the AIS config has no key for it).
fn replicates_q(m: &ModelSpec, l: &Layout) -> bool {
    m.kimi_k3.is_some() && l.backend == "sglang"
}

/// `op` with a replicated query side: the decode q_b projection and the absorb BMM ahead of the
/// attention run for the group's `n · dcp` heads on every rank, `dcp` times the work.
fn replicate_q_side(op: Op, dcp: u32) -> Op {
    let q_side = |name: &str| name.contains("q_b") || name.contains("bmm_pre");
    match op {
        Op::Fallback { name, primary, fallback } => {
            let primary = Box::new(replicate_q_side(*primary, dcp));
            let fallback = fallback.into_iter().map(|o| replicate_q_side(o, dcp)).collect();
            Op::Fallback { name, primary, fallback }
        }
        Op::Overlap { name, a, b } => {
            let a = a.into_iter().map(|o| replicate_q_side(o, dcp)).collect();
            let b = b.into_iter().map(|o| replicate_q_side(o, dcp)).collect();
            Op::Overlap { name, a, b }
        }
        Op::Gemm { name, scale, n, k, dtype, logits, fp8_input } if q_side(&name) => {
            Op::Gemm { name, scale: scale * dcp as f64, n, k, dtype, logits, fp8_input }
        }
        Op::MlaBmm(mut b) if q_side(&b.name) => {
            b.scale *= dcp as f64;
            Op::MlaBmm(b)
        }
        other => other,
    }
}

/// `op` with its context attention gathering the cached stripes first.
fn stripe_context(op: Op, dcp: u32, kv_bytes: f64) -> Op {
    let wrap = |op: Op, elements: f64, scale: f64| {
        Op::Striped(Striped { op: Box::new(op), dcp, gather: Some((elements, scale)) })
    };
    match op {
        Op::Fallback { name, primary, fallback } => {
            let primary = Box::new(stripe_context(*primary, dcp, kv_bytes));
            let fallback = fallback.into_iter().map(|o| stripe_context(o, dcp, kv_bytes)).collect();
            Op::Fallback { name, primary, fallback }
        }
        Op::Overlap { name, a, b } => {
            let a = a.into_iter().map(|o| stripe_context(o, dcp, kv_bytes)).collect();
            let b = b.into_iter().map(|o| stripe_context(o, dcp, kv_bytes)).collect();
            Op::Overlap { name, a, b }
        }
        Op::ContextAttention { scale, n_kv, head, .. } => {
            // One layer's K and V of the rank's KV heads, in half-precision elements.
            let elements = 2.0 * (n_kv * head) as f64 * kv_bytes / 2.0;
            wrap(op, elements, scale)
        }
        Op::Mla(ref mla) if matches!(mla.kind, MlaKind::Context | MlaKind::ContextModule) => {
            let scale = mla.scale;
            wrap(op, MLA_GATHER_ELEMENTS * kv_bytes / 2.0, scale)
        }
        // The block gathers its cached stripes itself (the indexer key's share depends on the
        // tables it reads).
        Op::Dsa(mut d) if d.context => {
            d.dcp = dcp;
            Op::Dsa(d)
        }
        other => other,
    }
}

/// The collectives (and their element-wise passes) that merge one decode attention op's
/// partial outputs over the DCP group, named after the op.
fn merge_ops(name: &str, hit: Hit, l: &Layout, q_replicate: bool) -> Vec<Op> {
    let dcp = l.dcp;
    let Hit { scale, heads, q_dim, v_dim, topk } = hit;
    let gathered = (heads * dcp) as f64;
    let (q_dim, v_dim) = (q_dim as f64, v_dim as f64);
    let nccl = |suffix: &str, kind: &'static str, dtype: &'static str, elements: f64| Op::Nccl {
        name: format!("{name}_dcp_{suffix}"),
        scale,
        kind,
        dtype,
        elements,
        gpus: dcp,
    };
    // An element-wise pass reading `inp` and writing `out` half-precision elements per token.
    let pass = |suffix: &str, inp: f64, out: f64| Op::Elementwise {
        name: format!("{name}_dcp_{suffix}"),
        scale,
        bytes_per_token: (inp + out) * 2.0,
    };
    // With fp8 attention the query is quantised before it is gathered.
    let q_dtype = if l.fmha == Dtype::Fp8 { "fp8" } else { "half" };
    // A replicated query side has every head's query on every rank already.
    let mut ops = Vec::new();
    if !q_replicate {
        ops.push(nccl("q_all_gather", "all_gather", q_dtype, gathered * q_dim));
    }
    if topk > 0 {
        // Each candidate an fp32 score and an int32 id: four half slots.
        let packed = f64::from(topk) * 4.0;
        ops.push(pass("topk_pack", packed, packed));
        ops.push(nccl("topk_all_gather", "all_gather", "half", packed * dcp as f64));
        ops.push(pass("topk_merge", packed * dcp as f64, f64::from(topk) * 2.0));
    }
    if l.backend == "sglang" {
        // One all-to-all of each head's output and LSE (two half slots), then the combine.
        let packed = gathered * (v_dim + 2.0);
        ops.push(pass("a2a_pack", gathered * v_dim, packed));
        ops.push(nccl("out_all_to_all", "alltoall", "half", packed));
        ops.push(pass("a2a_combine", packed, heads as f64 * v_dim));
    } else {
        // The fp32 LSE of every gathered head from each rank, the correction, the reduce-scatter.
        ops.push(nccl("lse_all_gather", "all_gather", "half", gathered * 2.0 * dcp as f64));
        ops.push(pass("lse_correct", gathered * v_dim, gathered * v_dim));
        ops.push(nccl("out_reduce_scatter", "reduce_scatter", "half", gathered * v_dim));
    }
    ops
}
