//! Attention/FFN disaggregation (AFD): one model served by two pools, attention nodes and FFN
//! (expert) nodes, that hand each layer's activations to each other. This module measures what
//! aisimulate 0.13's AFD estimate measures for one topology and phase: the attention pool's
//! share of a layer, the FFN pool's share, and the one-way activation transfer between them,
//! per layer in milliseconds. The pipeline over microbatches that turns them into a step time
//! is the cluster layer's (`servesim_cluster::afd`).
//!
//! Each pool times its own layout's op list (the attention pool at `tp_a`, the FFN pool at
//! the FFN nodes' width with `f_moe_ep_size`-way expert parallelism), keeping the ops of its
//! side. Ops are sorted by name (embedding, norms before attention, QKV / output projections
//! and attention on the attention side; router, experts and FFN GEMMs on the FFN side; the
//! post-attention norm and the logits GEMM on the boundary, placed by `boundary_on_attn`); the
//! model's own tensor-parallel reductions and MoE dispatch are left out, the pools' exchange
//! standing in for them. Ops of a family the split has no rule for (Mamba, GDN, or a name
//! none of the rules covers) are refused by name.
//!
//! The pools' per-GPU memory ([`prefill_memory`], [`decode_memory`]) is the reference's static
//! estimate (`crate::memory`) with each pool's own weights; [`out_of_memory`] is its check.

use crate::error::{PerfError, Result};
use crate::estimator::Estimator;
use crate::memory::{self, Usage};
use crate::model::Op;

/// Where an op runs under AFD.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Attention,
    Ffn,
    /// Between the two (the post-attention norm, the logits GEMM): `boundary_on_attn` decides.
    Boundary,
    /// The model's own communication, replaced by the pools' exchange.
    Skip,
}

const SKIP_MARKERS: &[&str] =
    &["_p2p", "_ar", "all_reduce", "allreduce", "tp_all_gather", "tp_reduce_scatter", "dispatch"];
const BOUNDARY_MARKERS: &[&str] =
    &["logits_gemm", "reduce_add", "add_norm_2", "_ffn_norm", "_moe_norm", "_mlp_norm", "_dense_ffn_norm"];
const ATTENTION_MARKERS: &[&str] = &[
    "embedding",
    "add_norm_1",
    "_attn_norm",
    "attention",
    "qkv",
    "q_a_layernorm",
    "q_b_proj",
    "kv_b_proj",
    "downscale_gemm",
    "mla",
    "bmm",
    "rope",
];
/// FFN GEMMs whose names also contain the attention side's `proj_gemm`.
const FFN_PROJ_GEMMS: &[&str] = &["down_proj_gemm", "up_proj_gemm", "gate_proj_gemm"];
const FFN_MARKERS: &[&str] = &[
    "router",
    "moe",
    "ffn",
    "mlp",
    "shared",
    "expert",
    "act_gate",
    "_act",
    "gate_up",
    "gate_ffn",
    "up_gemm",
    "down_gemm",
    "down_proj",
    "up_proj",
    "gate_proj",
    "relu",
];

fn has_any(name: &str, markers: &[&str]) -> bool {
    markers.iter().any(|m| name.contains(m))
}

fn side_by_name(op: &Op, name: &str) -> Result<Side> {
    if matches!(op, Op::AllReduce { .. } | Op::P2P { .. } | Op::CpAllGather { .. }) || has_any(name, SKIP_MARKERS) {
        return Ok(Side::Skip);
    }
    for (marker, family) in [("mamba", "Mamba"), ("gdn", "GDN")] {
        if name.contains(marker) {
            return Err(PerfError::unsupported(format!(
                "engine.mode: afd cannot split the {family} op {name:?} between the attention and FFN pools \
                 (the split has rules for attention and FFN / MoE layers only)"
            )));
        }
    }
    if has_any(name, BOUNDARY_MARKERS) || name.ends_with("_combine") {
        return Ok(Side::Boundary);
    }
    let attention_proj = name.contains("proj_gemm") && !has_any(name, FFN_PROJ_GEMMS);
    if has_any(name, ATTENTION_MARKERS) || attention_proj {
        return Ok(Side::Attention);
    }
    if has_any(name, FFN_MARKERS) {
        return Ok(Side::Ffn);
    }
    Err(PerfError::unsupported(format!("engine.mode: afd has no attention/FFN rule for the op {name:?} of this model")))
}

/// The side `op` runs on. Parallel op chains stay whole: every op of both chains (their
/// communication aside) must be on one side.
pub fn side(op: &Op) -> Result<Side> {
    let name = op.name().to_lowercase();
    let Op::Overlap { a, b, .. } = op else { return side_by_name(op, &name) };
    if a.is_empty() && b.is_empty() {
        return side_by_name(op, &name);
    }
    let mut found: Option<Side> = None;
    for inner in a.iter().chain(b) {
        match side(inner)? {
            Side::Skip => {}
            s if found.is_none_or(|f| f == s) => found = Some(s),
            _ => {
                return Err(PerfError::unsupported(format!(
                    "engine.mode: afd cannot split {name:?}: its parallel op chains span the attention and FFN \
                     pools"
                )))
            }
        }
    }
    found.ok_or_else(|| {
        PerfError::unsupported(format!("engine.mode: afd has no attention/FFN rule for the op {name:?}"))
    })
}

/// The ops of `ops` the attention pool (`attention`) or the FFN pool runs.
fn pool_ops(ops: &[Op], attention: bool, boundary_on_attn: bool) -> Result<Vec<&Op>> {
    let mut out = Vec::new();
    for op in ops {
        let keep = match side(op)? {
            Side::Attention => attention,
            Side::Ffn => !attention,
            Side::Boundary => attention == boundary_on_attn,
            Side::Skip => false,
        };
        if keep {
            out.push(op);
        }
    }
    Ok(out)
}

/// One AFD topology as the measurement sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    pub n_a_nodes: u32,
    pub n_f_nodes: u32,
    pub gpus_per_node: u32,
    pub tp_a: u32,
    pub f_moe_ep_size: u32,
    /// Requests in flight per attention worker, over all its microbatches.
    pub a_batch_size: u32,
    pub num_microbatches: u32,
    pub boundary_on_attn: bool,
}

impl Shape {
    /// Attention workers: data-parallel replicas of `tp_a` GPUs over the attention nodes.
    pub fn attention_workers(&self) -> u32 {
        self.n_a_nodes * self.gpus_per_node / self.tp_a
    }

    /// FFN GPUs: one FFN replica spans every FFN node.
    pub fn ffn_gpus(&self) -> u32 {
        self.n_f_nodes * self.gpus_per_node
    }

    /// Requests of one microbatch on one attention worker.
    pub fn micro_batch(&self) -> u32 {
        self.a_batch_size.div_ceil(self.num_microbatches).max(1)
    }
}

/// Per-layer times of one phase, in ms; the transfers before any communication correction.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerTimes {
    pub attention_ms: f64,
    pub ffn_ms: f64,
    pub a_to_f_ms: f64,
    pub f_to_a_ms: f64,
    pub num_layers: u32,
}

/// The two pools' estimators: the same model, system and backend at each pool's layout.
pub struct Pools<'a> {
    pub attention: &'a Estimator,
    pub ffn: &'a Estimator,
}

/// Chance that a token has at least one of its `topk` experts on a given one of `nodes` FFN
/// nodes (experts spread evenly); `1 / nodes` for a dense FFN.
fn send_probability(experts: u32, topk: u32, nodes: u32) -> f64 {
    let per_node = experts.checked_div(nodes).unwrap_or(0);
    if experts == 0 || topk == 0 || nodes <= 1 || per_node == 0 {
        return 1.0 / nodes.max(1) as f64;
    }
    let elsewhere = experts - per_node;
    if topk > elsewhere {
        return 1.0;
    }
    // C(elsewhere, k) / C(experts, k), as a product of k ratios.
    let none_here: f64 = (0..topk).map(|i| (elsewhere - i) as f64 / (experts - i) as f64).product();
    1.0 - none_here
}

/// The per-layer communication of `x` tokens per attention worker: the one-way transfer, the
/// FFN nodes' all-gather plus reduce-scatter of the tokens, and the attention side's sum of
/// the expert-parallel partial results.
struct Exchange {
    transfer_ms: f64,
    ffn_collectives_ms: f64,
    attention_combine_ms: f64,
}

fn exchange(pools: &Pools, shape: &Shape, x: u32) -> Result<Exchange> {
    let est = pools.attention;
    let hidden = est.model.hidden as f64;
    let p = send_probability(pools.ffn.model.experts, pools.ffn.model.topk, shape.n_f_nodes);
    // One half-precision message of `bytes`, timed as the op twins the reference times it with.
    let elements = |bytes: f64| (bytes.floor() as u64).div_ceil(2);
    let one = |op: Op| est.generation_op_ms(&op, 1, 1);
    let bytes = (p * x as f64 * hidden * 2.0).floor();
    let transfer_ms = if bytes <= 0.0 {
        0.0
    } else {
        let hidden = u32::try_from(elements(bytes))
            .map_err(|_| PerfError::config("engine.afd: one layer's activation transfer exceeds 2^32 elements"))?;
        one(Op::P2P { name: "afd_p2p".into(), scale: 1.0, hidden, pp: 2 })?
    };
    let local = shape.ffn_gpus().min(shape.gpus_per_node);
    let mut ffn_collectives_ms = 0.0;
    if local > 1 {
        let total = x as f64 * shape.attention_workers() as f64;
        let per_rank = (p * total * hidden / local as f64).floor();
        if per_rank > 0.0 {
            for kind in ["all_gather", "reduce_scatter"] {
                ffn_collectives_ms += est.db.nccl("half", kind, local, per_rank)?.max(0.0);
            }
        }
    }
    let mut attention_combine_ms = 0.0;
    if shape.f_moe_ep_size > 1 {
        let tokens = x.div_ceil(shape.tp_a) as f64;
        let bytes = ((shape.f_moe_ep_size + 1) as f64 * tokens * hidden * 2.0).floor();
        if bytes > 0.0 {
            let bytes_per_token = (elements(bytes) * 2) as f64;
            attention_combine_ms =
                one(Op::Elementwise { name: "afd_combine_mem".into(), scale: 1.0, bytes_per_token })?;
        }
    }
    Ok(Exchange { transfer_ms, ffn_collectives_ms, attention_combine_ms })
}

fn layers(pools: &Pools) -> u32 {
    pools.attention.model.layers.max(1)
}

/// The prefill phase: each attention worker prefills one microbatch of `isl`-token prompts
/// (`prefix` of them cached), the FFN pool every worker's microbatch at once.
pub fn prefill_layer_times(pools: &Pools, shape: &Shape, isl: u32, prefix: u32) -> Result<LayerTimes> {
    let s = isl.saturating_sub(prefix).max(1);
    let micro = shape.micro_batch();
    let ffn_batch = micro * shape.attention_workers();
    let num_layers = layers(pools);
    let a_ops = pool_ops(&pools.attention.context_ops, true, shape.boundary_on_attn)?;
    let f_ops = pool_ops(&pools.ffn.context_ops, false, shape.boundary_on_attn)?;
    let mut a = 0.0;
    for op in a_ops {
        a += pools.attention.context_op_at_tokens(op, micro, s, prefix)?;
    }
    let mut f = 0.0;
    for op in f_ops {
        f += pools.ffn.context_op_at_tokens(op, ffn_batch, s, prefix)?;
    }
    let ex = exchange(pools, shape, micro.saturating_mul(s))?;
    Ok(LayerTimes {
        attention_ms: a / num_layers as f64 + ex.attention_combine_ms,
        ffn_ms: f / num_layers as f64 + ex.ffn_collectives_ms,
        a_to_f_ms: ex.transfer_ms,
        f_to_a_ms: ex.transfer_ms,
        num_layers,
    })
}

/// KV lengths apart at which the decode phase is sampled (each sample standing for the steps
/// up to the next).
const DECODE_STRIDE: u32 = 32;

/// The decode phase: one token per request per step, each pool's share averaged over the
/// `osl − 1` steps of a request (sampled every [`DECODE_STRIDE`] KV lengths).
pub fn decode_layer_times(pools: &Pools, shape: &Shape, isl: u32, osl: u32) -> Result<LayerTimes> {
    let micro = shape.micro_batch();
    let ffn_batch = micro * shape.attention_workers();
    let num_layers = layers(pools);
    let a_ops = pool_ops(&pools.attention.generation_ops, true, shape.boundary_on_attn)?;
    let f_ops = pool_ops(&pools.ffn.generation_ops, false, shape.boundary_on_attn)?;
    let ex = exchange(pools, shape, micro)?;
    let steps = osl.saturating_sub(1).max(1);
    let (mut a_sum, mut f_sum, mut weight) = (0.0, 0.0, 0u64);
    let mut i = 0;
    while i < steps {
        let repeat = if osl > 1 { DECODE_STRIDE.min(osl - 1 - i) } else { 1 };
        let context = isl + i + 1;
        let mut a = 0.0;
        for op in &a_ops {
            a += pools.attention.generation_op_ms(op, micro, context)?;
        }
        let mut f = 0.0;
        for op in &f_ops {
            f += pools.ffn.generation_op_ms(op, ffn_batch, context)?;
        }
        a_sum += (a / num_layers as f64 + ex.attention_combine_ms) * repeat as f64;
        f_sum += (f / num_layers as f64 + ex.ffn_collectives_ms) * repeat as f64;
        weight += repeat as u64;
        i += DECODE_STRIDE;
    }
    let w = weight.max(1) as f64;
    Ok(LayerTimes {
        attention_ms: a_sum / w,
        ffn_ms: f_sum / w,
        a_to_f_ms: ex.transfer_ms,
        f_to_a_ms: ex.transfer_ms,
        num_layers,
    })
}

/// One phase's per-GPU memory of the two pools (GiB by use); the FFN pool keeps no KV cache.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PoolMemory {
    pub attention: Usage,
    pub ffn: Usage,
}

/// What one attention GPU and one FFN GPU hold in `phase` (prefill or decode): the weights of
/// their side of that phase's op list, the activations of one microbatch (the FFN pool's over
/// every attention worker), and on the attention side the KV cache of a microbatch's requests at
/// `max_seq_len` tokens each (by default the prompt in prefill, prompt and output in decode) —
/// in decode for every microbatch in flight.
fn phase_memory(
    pools: &Pools,
    shape: &Shape,
    prefill: bool,
    isl: u32,
    osl: u32,
    max_seq_len: Option<u32>,
) -> Result<PoolMemory> {
    let micro = u64::from(shape.micro_batch());
    let ffn_batch = micro * u64::from(shape.attention_workers());
    let (a_list, f_list) = if prefill {
        (&pools.attention.context_ops, &pools.ffn.context_ops)
    } else {
        (&pools.attention.generation_ops, &pools.ffn.generation_ops)
    };
    let a_ops = pool_ops(a_list, true, shape.boundary_on_attn)?;
    let f_ops = pool_ops(f_list, false, shape.boundary_on_attn)?;
    let (tokens_per_request, default_len, in_flight) =
        if prefill { (u64::from(isl), isl.max(1), 1) } else { (1, isl + osl, shape.num_microbatches.max(1)) };
    let len = u64::from(max_seq_len.unwrap_or(default_len));
    let kv = micro as f64 * memory::kv_bytes_per_sequence(pools.attention, len)?;
    let mut attention = memory::usage_of_ops(pools.attention, &a_ops, micro * tokens_per_request, kv)?;
    attention.kvcache *= f64::from(in_flight);
    let ffn = memory::usage_of_ops(pools.ffn, &f_ops, ffn_batch * tokens_per_request, 0.0)?;
    Ok(PoolMemory { attention, ffn })
}

/// The pools' per-GPU memory in the prefill phase (`isl`-token prompts, none cached).
pub fn prefill_memory(pools: &Pools, shape: &Shape, isl: u32, max_seq_len: Option<u32>) -> Result<PoolMemory> {
    phase_memory(pools, shape, true, isl, 0, max_seq_len)
}

/// The pools' per-GPU memory in the decode phase.
pub fn decode_memory(pools: &Pools, shape: &Shape, isl: u32, osl: u32, max_seq_len: Option<u32>) -> Result<PoolMemory> {
    phase_memory(pools, shape, false, isl, osl, max_seq_len)
}

/// Whether either pool runs out of GPU memory in any of `phases`: the attention pool against
/// the GPU and its backend's KV-cache budget, the FFN pool against the GPU.
pub fn out_of_memory(pools: &Pools, phases: &[PoolMemory]) -> bool {
    phases.iter().any(|m| {
        memory::out_of_memory(pools.attention, &m.attention, true) || memory::out_of_memory(pools.ffn, &m.ffn, false)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_probability_is_the_chance_of_an_expert_on_the_node() {
        // Dense, or one node: uniform.
        assert_eq!(send_probability(0, 0, 4), 0.25);
        assert_eq!(send_probability(128, 8, 1), 1.0);
        // 4 experts over 2 nodes, top-1: half the tokens; top-3 always reach both.
        assert!((send_probability(4, 1, 2) - 0.5).abs() < 1e-12);
        assert_eq!(send_probability(4, 3, 2), 1.0);
        // 8 experts, 2 nodes, top-2: 1 − C(4,2)/C(8,2) = 1 − 6/28.
        assert!((send_probability(8, 2, 2) - (1.0 - 6.0 / 28.0)).abs() < 1e-12);
    }
}
