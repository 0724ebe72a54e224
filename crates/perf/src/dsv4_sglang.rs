//! DeepSeek-V4 on SGLang: the routed experts' kernel lane and the `moe_backend` overrides. (The
//! CSA top-k correction SGLang's tables carry is [`crate::dsv4_topk`]'s.)
//!
//! SGLang runs a native DeepSeek-V4 checkpoint's fp4 experts (MXFP4 weights) on a kernel of
//! the GPU generation, and the MoE tables file its rows under that kernel's own format name:
//!
//! ```text
//! Blackwell (sm ≥ 100)  trtllm-gen MXFP4 × MXFP8   w4a8_mxfp4_mxfp8_trtllm
//! Hopper (sm 90)        CUTLASS SM90 MXFP4 × bf16  w4a16_mxfp4_cutlass
//! ```
//!
//! The reference picks it when no `moe_quant_mode` is given; other GPUs, other backends, the
//! FP8 re-quantised checkpoints (no fp4 experts) and NVFP4 experts keep the checkpoint's format.

//!
//! `moe_backend`. The reference builds DeepSeek-V4's MoE graph with the default runner for
//! `deepep_moe` (its dispatch ops do not take the override), so the two time alike: probed with
//! `scripts/moe_backend_probe.py`, equal in every metric. `megamoe` replaces the dispatch / MoE /
//! combine ops with one measured MegaMoE module (`dsv4_megamoe_module_perf`, read from the
//! requested version's own directory only) after two checks: `moe_tp_size` 1 and
//! `moe_ep_size` above 1. The packaged data has that table only at versions no system serves
//! (b200_sxm SGLang 0.5.16, gb200 / gb300 0.5.10), so the reference fails on every queryable
//! version for want of it; servesim makes the same checks and refuses by name, and refuses the
//! module also where a table is installed (not modelled).

use crate::db::Dtype;
use crate::error::{PerfError, Result};
use crate::systems::{sources, SystemSpec};

/// The MegaMoE module table.
pub const MEGAMOE_FILE: &str = "dsv4_megamoe_module_perf.parquet";

/// The routed experts' format of a DeepSeek-V4 whose checkpoint format is `checkpoint` (the
/// fp4 experts read as [`Dtype::W4a8Mxfp4Mxfp8`]) on `backend` at `sm_version`.
pub fn moe_format(backend: &str, sm_version: Option<u32>, checkpoint: Dtype) -> Dtype {
    if backend != "sglang" || checkpoint != Dtype::W4a8Mxfp4Mxfp8 {
        return checkpoint;
    }
    match sm_version {
        Some(v) if v >= 100 => Dtype::W4a8Mxfp4Mxfp8Trtllm,
        Some(90) => Dtype::W4a16Mxfp4Cutlass,
        _ => checkpoint,
    }
}

/// `moe_backend: megamoe` on DeepSeek-V4 `model` at `moe_tp` × `moe_ep` on `spec` / SGLang
/// `version`: the reference's checks, then the refusal naming what is missing (always an error:
/// the MegaMoE module is not modelled).
pub fn check_megamoe(model: &str, spec: &SystemSpec, version: &str, moe_tp: u32, moe_ep: u32) -> Result<()> {
    let head = format!("{model}: moe_backend: megamoe");
    if moe_tp != 1 {
        return Err(PerfError::config(format!("{head}: DeepSeek-V4's MegaMoE requires moe_tp_size=1, got {moe_tp}")));
    }
    if moe_ep <= 1 {
        return Err(PerfError::config(format!("{head}: DeepSeek-V4's MegaMoE requires moe_ep_size > 1, got {moe_ep}")));
    }
    let primary = sources(spec, "sglang", version, MEGAMOE_FILE, false)?.into_iter().next().filter(|s| s.path.exists());
    Err(PerfError::unsupported(match primary {
        None => format!(
            "{head}: no {MEGAMOE_FILE} for {} / sglang {version} (the MegaMoE routed module is timed from it alone, \
             as the reference does; the packaged data has it only at b200_sxm 0.5.16 and gb200 / gb300 0.5.10)",
            spec.name
        ),
        Some(src) => {
            format!("{head}: DeepSeek-V4's MegaMoE routed module ({}) is not modelled by servesim", src.path.display())
        }
    }))
}
