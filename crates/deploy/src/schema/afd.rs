//! `engine.afd`: one attention/FFN-disaggregated topology (`engine.mode: afd`), with the
//! reference's rules. Pure AFD (`phase: both`, `combined_with_pd: false`) is modelled; an AFD
//! phase paired with a prefill or decode companion pool (`combined_with_pd: true`) is refused
//! by name.

use servesim_cluster::afd::Pipeline;
use servesim_config::Reader;

use crate::error::DeployError;
use crate::reader::ErrAt;

#[derive(Clone, Debug, PartialEq)]
pub struct Afd {
    pub n_a_nodes: u32,
    pub n_f_nodes: u32,
    pub tp_a: u32,
    /// Requests in flight per attention worker.
    pub a_batch_size: u32,
    pub f_moe_ep_size: u32,
    pub num_microbatches: u32,
    pub pipeline: Pipeline,
    pub comm_overhead_factor: f64,
    pub boundary_on_attn: bool,
}

const PHASES: &[&str] = &["prefill", "decode", "both"];

/// Reads `engine.afd`; `workers`: the regular worker roles the engine names.
pub(super) fn read_afd(mut a: Reader, workers: &[&str]) -> Result<Afd, DeployError> {
    let phase = a.one_of("phase", PHASES)?.ok_or_else(|| a.err("phase", "missing (required)"))?;
    let combined = a.flag("combined_with_pd")?.ok_or_else(|| a.err("combined_with_pd", "missing (required)"))?;
    let required = |a: &mut Reader, k: &'static str| a.positive(k)?.ok_or_else(|| a.err(k, "missing (required)"));
    let n_a_nodes = required(&mut a, "n_a_nodes")?;
    let n_f_nodes = required(&mut a, "n_f_nodes")?;
    let tp_a = required(&mut a, "tp_a")?;
    let a_batch_size = required(&mut a, "a_batch_size")?;
    let f_moe_ep_size = a.positive("f_moe_ep_size")?.unwrap_or(1);
    let num_microbatches = a.positive("num_microbatches")?.unwrap_or(3);
    let pipeline = match a.one_of("pipeline_model", &Pipeline::NAMES)? {
        Some(p) => Pipeline::parse(p).expect("one of the names"),
        None => Pipeline::Optimistic,
    };
    let comm_overhead_factor = a.nonneg("comm_overhead_factor", true)?.unwrap_or(1.0);
    let boundary_on_attn = a.flag("boundary_on_attn")?.unwrap_or(true);
    if combined {
        if phase == "both" {
            return Err(a.err("phase", "AFD+P/D requires phase='prefill' or phase='decode'"));
        }
        return Err(a.err(
            "combined_with_pd",
            "AFD+P/D (one AFD phase beside a prefill or decode companion pool) is not supported by servesim yet; \
             use phase: both with combined_with_pd: false",
        ));
    }
    if phase != "both" {
        return Err(
            a.err("phase", "pure AFD prediction requires phase='both'; use combined_with_pd=true for one phase")
        );
    }
    if !workers.is_empty() {
        return Err(a.err("combined_with_pd", "pure AFD prediction rejects regular aggregated/prefill/decode workers"));
    }
    a.finish()?;
    Ok(Afd {
        n_a_nodes,
        n_f_nodes,
        tp_a,
        a_batch_size,
        f_moe_ep_size,
        num_microbatches,
        pipeline,
        comm_overhead_factor,
        boundary_on_attn,
    })
}
