//! KV-cache capacity from GPU memory, as the reference sizes it when `num_gpu_blocks` is not
//! given: weights, activations at the per-pass token budget, NCCL buffers and runtime
//! overhead are charged against `mem_capacity × fraction` (vLLM `gpu_memory_utilization`
//! 0.9, SGLang `mem_fraction_static` 0.88 — SGLang takes the fraction after distributed setup and
//! does not charge activations — TRT-LLM `free_gpu_memory_fraction` 0.9 of the free memory).

use crate::error::{PerfError, Result};
use crate::estimator::Estimator;
use crate::model::{Family, Op};

/// The memory a worker's KV cache gets, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct KvCapacity {
    pub weights_bytes: f64,
    pub activations_bytes: f64,
    pub nccl_bytes: f64,
    pub other_bytes: f64,
    pub kv_bytes: f64,
    pub kv_bytes_per_token: f64,
    pub tokens: u64,
    /// `tokens / block_size`, rounded down.
    pub blocks: u64,
}

/// The backend's default memory fraction (`None` for unknown backends).
pub fn default_fraction(backend: &str) -> Option<f64> {
    match backend {
        "vllm" => Some(0.9),
        "sglang" => Some(0.88),
        "trtllm" => Some(0.9),
        _ => None,
    }
}

const GIB: f64 = (1u64 << 30) as f64;

/// How [`kv_capacity`]'s error begins when weights, activations and reservations leave no room
/// for a KV cache (the shape runs out of memory): a property of the shape, not a bad input.
pub const NO_KV_BUDGET: &str = "no KV budget";

/// KV capacity of one worker rank. `fraction`: the backend's memory fraction (default when
/// `None`); `max_num_tokens`: the engine's per-pass token budget; `cuda_graph_bytes`: an extra
/// reservation outside the pool.
pub fn kv_capacity(
    est: &Estimator,
    fraction: Option<f64>,
    max_num_tokens: u64,
    block_size: u32,
    cuda_graph_bytes: f64,
) -> Result<KvCapacity> {
    kv_capacity_for(est, fraction, max_num_tokens, None, block_size, cuda_graph_bytes)
}

/// [`kv_capacity`] of a worker that runs at most `max_sequences` requests at once (`None`:
/// not known). Models that keep per-request state beside the token-linear cache reserve it for
/// that many requests (DeepSeek-V4.1's windows and compressor states) and need it known.
pub fn kv_capacity_for(
    est: &Estimator,
    fraction: Option<f64>,
    max_num_tokens: u64,
    max_sequences: Option<u32>,
    block_size: u32,
    cuda_graph_bytes: f64,
) -> Result<KvCapacity> {
    let backend = est.layout.backend.as_str();
    let fraction = match fraction.or_else(|| default_fraction(backend)) {
        Some(f) if f.is_finite() && f > 0.0 && f <= 1.0 => f,
        Some(f) => return Err(PerfError::config(format!("memory fraction must be in (0, 1], got {f}"))),
        None => return Err(PerfError::config(format!("no default memory fraction for backend {backend:?}"))),
    };
    if block_size == 0 {
        return Err(PerfError::config("block_size must be positive"));
    }
    if est.context_ops.iter().any(Op::is_draft) {
        // The reference requires a fixed KV capacity beside a draft scheme.
        return Err(PerfError::unsupported(
            "the KV capacity beside an EAGLE-3 draft is not estimated (its weights and KV would share the \
             budget): set a fixed block count",
        ));
    }
    let m = &est.model;
    let spec = &est.db.spec;
    // Resident weights: every GEMM and the embedding of the context op list, per PP stage.
    let mut weights = 0.0;
    for op in &est.context_ops {
        weights += op_weights(est, op);
    }
    weights /= est.layout.pp.max(1) as f64;
    if let Some(w) = sglang_mla_weights(est, weights) {
        weights = w;
    }
    if m.dsv41.is_some() {
        weights += crate::dsv41::mxfp4_scale_bytes(m, &est.layout);
    }
    let activations = activation_bytes(est, max_num_tokens)?;
    let (nccl, others) = reserved_bytes(est)?;
    // Weights etc. are counted in GiB by the reference and converted back; keep that rounding.
    let (weights, activations, nccl, others) =
        (weights / GIB * GIB, activations / GIB * GIB, nccl / GIB * GIB, others / GIB * GIB);
    let mut non_kv = weights + others + nccl + cuda_graph_bytes;
    if backend != "sglang" {
        non_kv += activations;
    }
    let capacity = spec.mem_capacity;
    let pre_load = if backend == "sglang" { others + nccl } else { 0.0 };
    let non_kv_after = non_kv - pre_load;
    let cap = capacity - pre_load;
    let kv = if backend == "trtllm" { (cap - non_kv_after) * fraction } else { cap * fraction - non_kv_after };
    if kv <= 0.0 {
        return Err(PerfError::config(format!(
            "{NO_KV_BUDGET}: non-KV memory ({:.0} bytes) meets or exceeds the KV-cache limit of {}'s {:.0} bytes",
            non_kv_after.max(0.0),
            spec.name,
            capacity
        )));
    }
    let per_token = est.kv_bytes_per_token();
    // Decode context parallelism stripes the KV: the rank's budget holds the tokens whose whole
    // KV is `dcp` times as large (`dcp.rs`).
    let kv_rank = kv;
    let kv = kv * est.layout.dcp.max(1) as f64;
    let tokens = if let Some(d) = &m.dsv4 {
        d.kv_tokens(est.layout.kv, kv, m.max_position as u64)
    } else if let Some(d) = &m.dsv41 {
        let requests = max_sequences.ok_or_else(|| {
            PerfError::unsupported(
                "DeepSeek-V4.1's KV capacity reserves every request slot's window and compressor state: it needs \
                 the worker's max_num_seqs, which this caller does not give",
            )
        })?;
        d.kv_tokens(kv, u64::from(requests), &est.layout.backend)?
    } else if let Some(k) = &m.kimi_k3 {
        // One request's KDA state (all its slots) comes out of the rank's budget first: it is
        // rank-local, only the MLA layers' latent KV is striped by decode CP. The reference
        // scales the rest by dcp and adds the state back before taking it off again; `+ state -
        // state` keeps its floating-point rounding (the block counts are compared exactly).
        let state = crate::kimi_k3::state_bytes_per_request(k, est.layout.tp);
        let rest = kv_rank - state;
        if rest <= 0.0 || per_token <= 0.0 {
            0
        } else {
            let left = rest * est.layout.dcp.max(1) as f64 + state - state;
            (left / per_token).floor() as u64
        }
    } else if let Some(q) = &m.qwen35 {
        // One request's GDN state comes out of the budget first.
        let left = kv - crate::gdn::state_bytes_per_request(q, est.layout.tp);
        if left <= 0.0 || per_token <= 0.0 {
            0
        } else {
            (left / per_token).floor() as u64
        }
    } else if m.sliding_window > 0 || m.gemma4.is_some() || m.glimmer.is_some() {
        window_capped_tokens(est, kv)
    } else {
        (kv / per_token).floor() as u64
    };
    Ok(KvCapacity {
        weights_bytes: weights,
        activations_bytes: activations,
        nccl_bytes: nccl,
        other_bytes: others,
        kv_bytes: kv_rank.floor(),
        kv_bytes_per_token: per_token,
        tokens,
        blocks: tokens / block_size as u64,
    })
}

/// The backend's memory row for the model: activation coefficients by tensor-parallel width (up
/// to 8), the activation floor in bytes, and the backend's activation and runtime overheads.
struct Row {
    coefficients: &'static [(u32, f64)],
    min_activations: f64,
    activation_overhead: f64,
    other_overhead: f64,
}

fn row(est: &Estimator) -> Row {
    let m = &est.model;
    let backend = est.layout.backend.as_str();
    // The reference's hybrid local / global family (Llama-4, MiMo-V2-Flash), Qwen3.5, Nemotron-H
    // (NEMOTRONH) and the Qwen3-VL families have no coefficients of their own and take the
    // backends' default rows.
    let hybrid = m.hybrid.is_some()
        || m.nemotron_h.is_some()
        || m.qwen35.is_some()
        || crate::qwen3vl::default_activation_row(&m.architecture);
    const SGLANG_MIN: f64 = 90.0 * 1024.0 * 1024.0;
    const MIN: f64 = 70.0 * 1024.0 * 1024.0;
    let (coefficients, min_activations, activation_overhead, other_overhead): (&'static [(u32, f64)], f64, f64, f64) =
        match (backend, m.family) {
            ("sglang", _) if hybrid => (&[(1, 13.0), (2, 8.0), (4, 6.5), (8, 6.5)], SGLANG_MIN, 0.15, 0.20),
            // Kimi-K3 has SGLang coefficients (the MoE row) but none in the table vLLM and TRT-LLM
            // share: their default row.
            (b, _) if hybrid || (b != "sglang" && m.kimi_k3.is_some()) => {
                (&[(1, 10.0), (2, 6.0), (4, 5.0), (8, 5.0)], MIN, 0.0, 0.0)
            }
            ("sglang", Family::Dense) => (&[(1, 14.0), (2, 8.5), (4, 6.5), (8, 6.5)], SGLANG_MIN, 0.15, 0.20),
            ("sglang", Family::Moe | Family::Mla | Family::Dsa | Family::Gemma4 | Family::Dsv4) => {
                (&[(1, 28.0), (2, 17.0), (4, 13.0), (8, 13.0)], SGLANG_MIN, 0.15, 0.20)
            }
            // MiniMax-M3 has no entry in the reference's tables: their `default` row.
            ("sglang", Family::Msa) => (&[(1, 13.0), (2, 8.0), (4, 6.5), (8, 6.5)], SGLANG_MIN, 0.15, 0.20),
            (_, Family::Dense) => (&[(1, 11.0), (2, 6.5), (4, 5.0), (8, 5.0)], MIN, 0.0, 0.0),
            (_, Family::Msa) => (&[(1, 10.0), (2, 6.0), (4, 5.0), (8, 5.0)], MIN, 0.0, 0.0),
            (_, Family::Moe | Family::Mla | Family::Dsa | Family::Gemma4 | Family::Dsv4) => {
                (&[(1, 22.0), (2, 13.0), (4, 10.0), (8, 10.0)], MIN, 0.0, 0.0)
            }
        };
    Row { coefficients, min_activations, activation_overhead, other_overhead }
}

/// Activation bytes of one GPU running passes of `tokens` tokens: the backend's coefficient of
/// the model's attention width, the MoE dispatch workspace where the model pays it, the floor
/// and the backend's overhead.
fn activation_bytes(est: &Estimator, tokens: u64) -> Result<f64> {
    let m = &est.model;
    let row = row(est);
    let tp_clamped = est.layout.tp.min(8);
    let c = row
        .coefficients
        .iter()
        .find(|(t, _)| *t == tp_clamped)
        .map(|(_, c)| *c)
        .ok_or_else(|| PerfError::unsupported(format!("no activation coefficient for tp={}", est.layout.tp)))?;
    // The reference uses the model's whole attention width here, not the per-GPU share.
    let h = (m.heads * m.head_dim) as f64;
    let mut activations = 2.0 * tokens as f64 * h * c;
    if matches!(m.family, Family::Mla | Family::Dsa | Family::Dsv4) || (m.family == Family::Gemma4 && m.routed()) {
        // The MoE block-scale dispatch workspace (fp32 scales per 128 elements) of the
        // DeepSeek family and Gemma 4, over every attention-DP rank's tokens; Gemma 4's and
        // DeepSeek-V4's are as wide as the residual stream, not the attention.
        let l = &est.layout;
        let width = if matches!(m.family, Family::Gemma4 | Family::Dsv4) { m.hidden as f64 } else { h };
        activations += tokens as f64 * width * l.attention_dp as f64 * m.experts as f64 * m.topk as f64
            / l.moe_ep.max(1) as f64
            / 128.0
            * 4.0;
    }
    let mut activations = activations.max(row.min_activations);
    activations *= 1.0 + row.activation_overhead;
    Ok(activations)
}

/// The NCCL buffers and the runtime's other memory (CUDA context, cuBLAS) of one GPU, in bytes.
fn reserved_bytes(est: &Estimator) -> Result<(f64, f64)> {
    let spec = &est.db.spec;
    let tp_clamped = est.layout.tp.min(8);
    let nccl = spec.nccl_mem.iter().find(|(g, _)| *g == tp_clamped).map(|(_, b)| *b).ok_or_else(|| {
        PerfError::data(format!("{}.yaml: misc.nccl_mem has no entry for {tp_clamped} GPUs", spec.name))
    })?;
    Ok((nccl, spec.other_mem * (1.0 + row(est).other_overhead)))
}

/// One GPU's memory by use, in GiB (the reference's static memory estimate).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Usage {
    pub weights: f64,
    pub activations: f64,
    pub kvcache: f64,
    pub nccl: f64,
    pub others: f64,
}

impl Usage {
    pub fn total(&self) -> f64 {
        self.weights + self.activations + self.kvcache + self.nccl + self.others
    }
}

/// The memory of one GPU of `est`'s layout that holds the weights of `ops` (its share of the
/// model's op list, as a disaggregated pool holds it), runs passes of `tokens` tokens and keeps
/// `kv_bytes` of KV cache.
pub fn usage_of_ops(est: &Estimator, ops: &[&Op], tokens: u64, kv_bytes: f64) -> Result<Usage> {
    let weights: f64 = ops.iter().map(|op| op_weights(est, op)).sum::<f64>() / est.layout.pp.max(1) as f64;
    let (nccl, others) = reserved_bytes(est)?;
    Ok(Usage {
        weights: weights / GIB,
        activations: activation_bytes(est, tokens)? / GIB,
        kvcache: kv_bytes / GIB,
        nccl: nccl / GIB,
        others: others / GIB,
    })
}

/// KV bytes of one sequence of `len` tokens on one GPU of `est`'s layout. Caches that are not a
/// fixed number of bytes per token and window are refused (DeepSeek-V4's and DSA's compressed
/// caches, Kimi-K3's, Qwen3.5's and Nemotron-H's recurrent states).
pub fn kv_bytes_per_sequence(est: &Estimator, len: u64) -> Result<f64> {
    let m = &est.model;
    let family = if m.dsv4.is_some() {
        Some("DeepSeek-V4")
    } else if m.dsa.is_some() {
        Some("DSA")
    } else if m.kimi_k3.is_some() {
        Some("Kimi-K3")
    } else if m.qwen35.is_some() {
        Some("Qwen3.5")
    } else if m.nemotron_h.is_some() {
        Some("Nemotron-H")
    } else {
        None
    };
    if let Some(family) = family {
        return Err(PerfError::unsupported(format!(
            "the per-sequence KV memory of the {family} cache is not modelled for a memory check"
        )));
    }
    if let Some(d) = &m.dsv41 {
        return d.kv_bytes(len, &est.layout.backend);
    }
    let bytes = if m.sliding_window > 0 || m.gemma4.is_some() || m.glimmer.is_some() {
        window_capped_bytes(est, len)
    } else {
        est.kv_bytes_per_token() * len as f64
    };
    Ok(bytes / est.layout.dcp.max(1) as f64)
}

/// The KV-cache budget rule of a backend (version): the memory fraction, the allocator's
/// reserved share, the tolerance, and whether the fraction applies to the memory left after
/// everything else (TRT-LLM) or to the whole GPU (vLLM's `gpu_memory_utilization`, SGLang's
/// `mem_fraction_static`). vLLM's default fraction is 0.9 up to 0.19 and 0.92 from 0.22.
fn kv_budget_rule(backend: &str, version: &str) -> Option<(f64, f64, f64, bool)> {
    match backend {
        "vllm" => {
            let fraction = if version.starts_with("0.14") || version.starts_with("0.19") { 0.9 } else { 0.92 };
            Some((fraction, 0.0, 0.02, false))
        }
        "sglang" => Some((0.88, 0.0, 0.02, false)),
        "trtllm" => Some((0.9, 0.015, 0.02, true)),
        _ => None,
    }
}

/// Whether `usage` does not fit one GPU of `est`'s system: its total reaches the GPU's memory,
/// or (`check_kv`) its KV cache exceeds what the backend's default memory fraction leaves for it.
pub fn out_of_memory(est: &Estimator, usage: &Usage, check_kv: bool) -> bool {
    let capacity = est.db.spec.mem_capacity / GIB;
    let total = usage.total();
    if total >= capacity {
        return true;
    }
    if !check_kv {
        return false;
    }
    let Some((fraction, reserved, tolerance, of_free)) = kv_budget_rule(&est.layout.backend, &est.db.version) else {
        return false;
    };
    let non_kv = total - usage.kvcache;
    let scale = (1.0 - reserved) * (1.0 - tolerance);
    let budget = if of_free { (capacity - non_kv) * fraction * scale } else { capacity * fraction * scale - non_kv };
    usage.kvcache > budget
}

/// Resident weight bytes of one op (all its layers): GEMMs and the embedding table by shape,
/// the experts split over their GPUs; a fallback op weighs its granular chain (the fused MLA
/// module itself carries none), an overlap both chains.
fn op_weights(est: &Estimator, op: &Op) -> f64 {
    let m = &est.model;
    match op {
        Op::Gemm { n, k, dtype, scale, .. } => *n as f64 * *k as f64 * dtype.bytes() * scale,
        Op::SmallGemm(g) => g.n as f64 * g.k as f64 * g.dtype.bytes() * g.scale,
        // The MLA, DSA and hybrid graphs and MSA's look up the whole vocabulary; the others their
        // tensor-parallel share.
        Op::Embedding { scale, .. } => {
            let whole = matches!(m.family, Family::Mla | Family::Dsa | Family::Gemma4 | Family::Msa | Family::Dsv4)
                || m.hybrid.is_some()
                || m.nemotron_h.is_some();
            let rows = if whole { m.vocab } else { m.vocab / est.layout.tp };
            rows as f64 * m.hidden as f64 * 2.0 * scale
        }
        Op::Moe(moe) => moe.weight_bytes(),
        Op::ExpertCompute(e) => e.moe.weight_bytes(),
        Op::Dsa(dsa) => dsa.weight_bytes(),
        Op::Dsv4Attn(a) => a.weight_bytes(),
        Op::Dsv41(d) => d.weight_bytes(),
        Op::Mhc(h) => h.weight_bytes(),
        Op::Striped(st) => op_weights(est, &st.op),
        Op::TpShare { op, .. } => op_weights(est, op),
        Op::Fallback { primary, fallback, .. } => {
            let p = op_weights(est, primary);
            if p > 0.0 {
                p
            } else {
                fallback.iter().map(|o| op_weights(est, o)).sum()
            }
        }
        Op::Overlap { a, b, .. } => {
            a.iter().map(|o| op_weights(est, o)).sum::<f64>() + b.iter().map(|o| op_weights(est, o)).sum::<f64>()
        }
        _ => 0.0,
    }
}

/// SGLang serving DeepSeek-V3 (one pipeline stage, no MTP, no prefill context parallelism, not
/// the wide-EP graph, whose graph weights the reference keeps) loads what the checkpoint holds, not
/// what the timing graph approximates: the embedding split over tensor parallelism, the dense
/// first layers as gated MLPs, and only the MoE layers' routed experts, shared experts and router.
/// The reference corrects the graph's weights (`graph`) that way; `None` elsewhere.
fn sglang_mla_weights(est: &Estimator, graph: f64) -> Option<f64> {
    let (m, l) = (&est.model, &est.layout);
    if l.backend != "sglang"
        || m.architecture != "DeepseekV3ForCausalLM"
        || l.moe_comm.is_large_ep()
        || l.pp != 1
        || l.nextn != 0
        || l.cp != 1
    {
        return None;
    }
    let (h, tp) = (m.hidden as f64, l.tp as f64);
    let (inter, moe_inter, experts) = (m.inter as f64, m.moe_inter as f64, m.experts as f64);
    let routed = 3.0 * h * moe_inter * experts * l.moe.bytes() / (l.moe_tp as f64 * l.moe_ep as f64);
    let shared = 3.0 * h * moe_inter * l.gemm.bytes() / tp;
    let router = 2.0 * h * experts;
    let dense = 3.0 * h * inter * l.gemm.bytes() / tp;
    let embedding = 2.0 * m.vocab as f64 * h;
    let layers = m.layers as f64;
    let moe_layers = m.layers.saturating_sub(m.dense_layers) as f64;
    let mut w = graph;
    w -= embedding * (1.0 - 1.0 / tp);
    w -= layers * (routed + shared + router);
    w += moe_layers * (routed + m.shared_experts as f64 * shared + router);
    w += (layers - moe_layers) * dense;
    Some(w)
}

/// KV bytes of one sequence of `len` tokens on one GPU when half the layers keep only a
/// sliding window (gpt-oss; Gemma 4's and Muse-Glimmer's sliding-window layers), as the reference
/// sizes it.
fn window_capped_bytes(est: &Estimator, len: u64) -> f64 {
    let m = &est.model;
    if let Some(g) = &m.gemma4 {
        return crate::gemma4::kv_bytes_per_sequence(g, est.layout.tp, est.layout.kv, len);
    }
    if let Some(g) = &m.glimmer {
        return crate::glimmer::kv_bytes_per_sequence(m, g, est.layout.tp, est.layout.kv, len);
    }
    let per_layer_token = m.kv_heads.div_ceil(est.layout.tp) as f64 * m.head_dim as f64 * 2.0 * est.layout.kv.bytes();
    let windowed = (m.layers / 2) as f64;
    let global = (m.layers - m.layers / 2) as f64;
    per_layer_token * (windowed * len.min(m.sliding_window as u64) as f64 + global * len as f64)
}

/// The longest single sequence whose window-capped KV fits `budget` bytes.
fn window_capped_tokens(est: &Estimator, budget: f64) -> u64 {
    longest_fitting(budget, est.model.max_position as u64, |len| window_capped_bytes(est, len))
}

/// The longest single sequence whose KV (`bytes(len)`, non-decreasing in `len`) fits `budget`
/// bytes: the reference's doubling-then-bisection search for caches that are not linear in
/// length. A cache that stops growing is bounded by `context_length` (by the doubled length when
/// that is 0).
pub fn longest_fitting(budget: f64, context_length: u64, bytes: impl Fn(u64) -> f64) -> u64 {
    if budget <= 0.0 {
        return 0;
    }
    let (mut hi, mut hi_bytes) = (1u64, bytes(1));
    if hi_bytes <= 0.0 {
        return 0;
    }
    while hi_bytes <= budget {
        let next = hi * 2;
        let next_bytes = bytes(next);
        if next_bytes == hi_bytes {
            return if context_length > 0 { context_length } else { next };
        }
        (hi, hi_bytes) = (next, next_bytes);
    }
    let mut lo = hi / 2;
    while lo + 1 < hi {
        let mid = (lo + hi) / 2;
        if bytes(mid) <= budget {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}
