//! Expert-parallel load balancing (`enable_eplb`) and redundant expert slots
//! (`wideep_num_slots`) on the fused MoE block.
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
use crate::moe_a2a::MoeComm;

/// Refuses the load-balancing knobs on a model without routed experts, as the reference does
/// ("EPLB, slots, moe_backend and moe_kernel_source require an MoE model").
pub fn check_moe_controls(model: &str, routed: bool, comm: &MoeComm) -> Result<()> {
    if routed || (!comm.eplb && comm.num_slots.is_none()) {
        return Ok(());
    }
    let keys = match (comm.eplb, comm.num_slots) {
        (true, Some(_)) => "enable_eplb and wideep_num_slots",
        (true, None) => "enable_eplb",
        _ => "wideep_num_slots",
    };
    Err(PerfError::config(format!(
        "{model}: {keys}: the model has no routed experts (expert-parallel load balancing and \
         redundant expert slots apply to MoE layers only)"
    )))
}

/// Whether the knobs are set but, the fused block being timed, change nothing: the reference's
/// behaviour outside its large-EP graph.
pub fn inert_on_fused_block(comm: &MoeComm) -> bool {
    !comm.is_large_ep() && (comm.eplb || comm.num_slots.is_some())
}
