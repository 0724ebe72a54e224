//! Expert-parallel load balancing (`enable_eplb`), redundant expert slots (`wideep_num_slots`)
//! and SGLang's MoE runner (`moe_backend`, see [`MoeBackend`]) on the fused MoE block.
//!
//! aisimulate 0.13 reads both keys into its model config wherever they are given (the unified
//! YAML's `engine`, the forward-pass timing config behind `predict -c`, `recommend -c` and
//! Dynamo), but it only acts on them inside the large-EP graph, and the forward-pass config
//! never selects that graph (`moe_comm_backend` is set by its Task enumerator alone). On the
//! fused block they change neither an op's time nor the weights, so neither the KV capacity:
//! `predict -c` on Qwen3-30B-A3B at DEP4 on H200 gives the same report with and without
//! `enable_eplb: true, wideep_num_slots: 144` on vLLM, SGLang and TRT-LLM alike (probed, and
//! recorded as `tests/deploy/predict_disagg_dep_moe_eplb.yaml`). What the reference checks
//! before building is that the model has routed experts and that the slot count is a positive
//! integer (the latter is the config readers'); servesim does the same and otherwise keeps the
//! fused graph. The slot rules of TRT-LLM's wide EP (slots ≥ experts, slots = experts without
//! EPLB) apply only to its large-EP graph, which is not modelled (see `moe_a2a.rs`).

use crate::error::{PerfError, Result};
use crate::model::{Family, ModelSpec};
use crate::moe_a2a::MoeComm;

/// SGLang's MoE runner override (`moe_backend`), which the reference accepts on SGLang only.
///
/// Its builders read it in two families: Qwen3.5, whose DeepEP branch prices a pre-dispatch op
/// the reference's op table has retired (so it cannot time the model with it) and which refuses
/// MegaMoE, and DeepSeek-V4, whose MegaMoE graph is its own (`dsv4_sglang.rs`; its `deepep_moe`
/// graph is the default one). Every other MoE family
/// is built as with the default runner: probed on h200_sxm / SGLang 0.5.14 with
/// `deepep_moe` and `megamoe` against the default at attention-DP × EP 2 to 8 — Qwen3-MoE
/// (and at TP 2 × EP 2), Qwen3-VL-MoE, gpt-oss, MiniMax-M2.7, Llama-4 Scout, Gemma-4 26B,
/// Nemotron-3 Nano, MiMo-V2-Flash, DeepSeek-V3, V3.2, Kimi-K2.5, GLM-5.2: every simulated metric
/// identical (`scripts/moe_backend_probe.py`: 26 pairs, servesim within 3.6e-15 of each).
/// servesim accepts it there and times the default graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoeBackend {
    /// `deepep_moe`: DeepEP dispatch.
    DeepEp,
    /// `megamoe`: SGLang's MegaMoE kernels (DeepSeek-V4).
    MegaMoe,
}

impl MoeBackend {
    /// Reads a `moe_backend` value (`default` is no override), with the reference's two checks.
    pub fn parse(value: &str, backend: &str) -> std::result::Result<Option<MoeBackend>, String> {
        let parsed = match value {
            "default" => return Ok(None),
            "deepep_moe" => MoeBackend::DeepEp,
            "megamoe" => MoeBackend::MegaMoe,
            _ => return Err(format!("unsupported moe_backend {value:?}; expected default, deepep_moe or megamoe")),
        };
        if backend != "sglang" {
            return Err(format!("{value:?}: a moe_backend override requires backend=sglang, got {backend}"));
        }
        Ok(Some(parsed))
    }

    pub fn name(self) -> &'static str {
        match self {
            MoeBackend::DeepEp => "deepep_moe",
            MoeBackend::MegaMoe => "megamoe",
        }
    }
}

/// Refuses the MoE controls on a model without routed experts, as the reference does ("EPLB,
/// slots, moe_backend and moe_kernel_source require an MoE model"), and a `moe_backend` the
/// model's builder cannot time.
pub fn check_moe_controls(name: &str, model: &ModelSpec, comm: &MoeComm) -> Result<()> {
    let keys: Vec<&str> = [
        (comm.eplb, "enable_eplb"),
        (comm.num_slots.is_some(), "wideep_num_slots"),
        (comm.backend.is_some(), "moe_backend"),
    ]
    .into_iter()
    .filter_map(|(set, key)| set.then_some(key))
    .collect();
    if keys.is_empty() {
        return Ok(());
    }
    if !model.routed() {
        return Err(PerfError::config(format!(
            "{name}: {}: the model has no routed experts (expert-parallel load balancing, redundant expert slots \
             and the MoE runner apply to MoE layers only)",
            keys.join(", ")
        )));
    }
    let Some(backend) = comm.backend else { return Ok(()) };
    let why = if model.qwen35.is_some() {
        match backend {
            MoeBackend::DeepEp => {
                "Qwen3.5's DeepEP branch prices a MoE pre-dispatch op (MoEDispatch with moe_backend='deepep_moe') \
                 that aisimulate 0.13 has retired, so neither tool can time it"
            }
            MoeBackend::MegaMoe => {
                "Qwen3.5 does not model moe_backend='megamoe' (SGLang's MegaMoE serves DeepSeek-V4 only)"
            }
        }
    } else if model.family == Family::Dsv4 {
        // deepep_moe times the default graph; megamoe is `dsv4_sglang::check_megamoe`'s.
        return Ok(());
    } else {
        return Ok(());
    };
    Err(PerfError::unsupported(format!("{name}: moe_backend: {}: {why}", backend.name())))
}

/// Whether the knobs are set but, the fused block being timed, change nothing: the reference's
/// behaviour outside its large-EP graph.
pub fn inert_on_fused_block(comm: &MoeComm) -> bool {
    !comm.is_large_ep() && (comm.eplb || comm.num_slots.is_some())
}
