//! DeepSeek-V4 (`DeepseekV4ForCausalLM`: DeepSeek-V4-Flash / -Pro and their FP8 / NVFP4
//! checkpoints, the reference's `DEEPSEEKV4` family): the config facts its compressed attention
//! rests on and the KV cache a sequence holds.
//!
//! Attention is one 512-wide latent KV head per layer. Every layer keeps the last
//! `sliding_window` tokens uncompressed; a layer's `compress_ratios` entry adds what it keeps of
//! the rest:
//!
//! ```text
//! ratio 0    SWA  nothing more
//! ratio 4    CSA  one compressed entry per 4 tokens + an fp4 indexer entry (index_head_dim / 2
//!                 bytes) per compressed entry; two compressors (KV and indexer), each with
//!                 fp32 KV and score state of 2 × 2·ratio × width
//! ratio 128  HCA  one compressed entry per 128 tokens; one compressor, fp32 state 2 × ratio × 512
//! ```
//!
//! So a sequence's KV is not linear in its length (a constant decode state, a window-capped part
//! and a compressed part): capacity is the longest single sequence whose KV fits the budget, by
//! the same doubling-then-bisection search the window-capped families use
//! ([`crate::memory::longest_fitting`]). The whole cache stays on every tensor-parallel rank (one
//! KV head is not split).
//!
//! Timing is not modelled yet: a DeepSeek-V4 model is refused ([`unsupported`]) naming the ops
//! servesim lacks, after its config is read, so a malformed config is named first.

use serde_json::Value;

use crate::db::Dtype;
use crate::error::{PerfError, Result};

/// The architecture string of the family.
pub const ARCH: &str = "DeepseekV4ForCausalLM";

/// The compress ratios the reference's model takes (SWA, CSA, HCA).
const RATIOS: [u32; 3] = [0, 4, 128];

/// Width in bytes of one fp32 compressor state element.
const STATE_BYTES: f64 = 4.0;

/// What DeepSeek-V4's compressed attention and mHC read from `config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct Dsv4Spec {
    /// One ratio per decoder layer (the config's list cut to `num_hidden_layers`: the entries past
    /// it belong to the MTP layers).
    pub compress_ratios: Vec<u32>,
    pub sliding_window: u32,
    /// Width of the latent KV entry (and of each query head).
    pub head_dim: u32,
    pub qk_rope_head_dim: u32,
    pub q_lora_rank: u32,
    pub o_lora_rank: u32,
    pub o_groups: u32,
    pub index_n_heads: u32,
    pub index_head_dim: u32,
    pub index_topk: u32,
    /// mHC: residual streams per token and Sinkhorn iterations of its mixing matrix.
    pub hc_mult: u32,
    pub hc_sinkhorn_iters: u32,
}

impl Dsv4Spec {
    /// Read the facts from a DeepSeek-V4 `config.json` of `layers` decoder layers; `shown` names
    /// the file in errors.
    pub fn from_config(cfg: &Value, layers: u32, shown: &str) -> Result<Dsv4Spec> {
        let need = |k: &str| {
            cfg.get(k).and_then(Value::as_u64).map(|v| v as u32).ok_or_else(|| {
                PerfError::config(format!("{shown}: {ARCH} needs an integer {k} (DeepSeek-V4 attention / mHC)"))
            })
        };
        let listed = cfg.get("compress_ratios").and_then(Value::as_array).ok_or_else(|| {
            PerfError::config(format!("{shown}: {ARCH} needs compress_ratios, one integer per layer"))
        })?;
        let mut compress_ratios = Vec::with_capacity(listed.len());
        for v in listed {
            let r = v.as_u64().ok_or_else(|| {
                PerfError::config(format!("{shown}: compress_ratios holds {v}, not a non-negative integer"))
            })?;
            compress_ratios.push(r as u32);
        }
        if compress_ratios.len() < layers as usize {
            return Err(PerfError::config(format!(
                "{shown}: compress_ratios has {} entries, fewer than num_hidden_layers {layers}",
                compress_ratios.len()
            )));
        }
        compress_ratios.truncate(layers as usize);
        if let Some(r) = compress_ratios.iter().find(|r| !RATIOS.contains(r)) {
            return Err(PerfError::unsupported(format!(
                "{shown}: compress ratio {r} is not one DeepSeek-V4's attention has (0: SWA, 4: CSA, 128: HCA)"
            )));
        }
        Ok(Dsv4Spec {
            compress_ratios,
            sliding_window: need("sliding_window")?,
            head_dim: need("head_dim")?,
            qk_rope_head_dim: need("qk_rope_head_dim")?,
            q_lora_rank: need("q_lora_rank")?,
            o_lora_rank: need("o_lora_rank")?,
            o_groups: need("o_groups")?,
            index_n_heads: need("index_n_heads")?,
            index_head_dim: need("index_head_dim")?,
            index_topk: need("index_topk")?,
            hc_mult: need("hc_mult")?,
            hc_sinkhorn_iters: need("hc_sinkhorn_iters")?,
        })
    }

    /// Layers with compress ratio `ratio`.
    pub fn layers_with(&self, ratio: u32) -> usize {
        self.compress_ratios.iter().filter(|&&r| r == ratio).count()
    }

    /// KV bytes one sequence of `len` tokens holds with `kv`-typed cache entries, over all
    /// layers (see the module notes; the fp32 compressor state is there from the first token).
    pub fn kv_bytes_per_sequence(&self, kv: Dtype, len: u64) -> f64 {
        let entry = self.head_dim as f64 * kv.bytes();
        let width = self.head_dim as f64;
        let index_width = self.index_head_dim as f64;
        let windowed = len.min(self.sliding_window as u64) as f64;
        let mut total = 0.0;
        for &ratio in &self.compress_ratios {
            total += windowed * entry;
            if ratio == 0 {
                continue;
            }
            let r = ratio as u64;
            let compressed = (len / r) as f64;
            let compressors = if ratio == 4 { 2.0 } else { 1.0 };
            total += compressed * entry + 2.0 * ratio as f64 * compressors * width * STATE_BYTES;
            if ratio == 4 {
                // The fp4 indexer cache and its own compressor's state.
                total += compressed * index_width * 0.5 + 2.0 * ratio as f64 * 2.0 * index_width * STATE_BYTES;
            }
        }
        total
    }

    /// The longest single sequence whose KV fits `budget` bytes (`context_length` bounds a cache
    /// that stops growing; DeepSeek-V4's compressed part always grows).
    pub fn kv_tokens(&self, kv: Dtype, budget: f64, context_length: u64) -> u64 {
        crate::memory::longest_fitting(budget, context_length, |len| self.kv_bytes_per_sequence(kv, len))
    }
}

/// The refusal for a DeepSeek-V4 model whose config parsed into `spec`: what servesim would
/// need to time it as the reference does.
pub fn unsupported(shown: &str, spec: &Dsv4Spec) -> PerfError {
    PerfError::unsupported(format!(
        "{shown}: {ARCH} (the reference's DEEPSEEKV4 family: {} CSA, {} HCA and {} SWA layers) is not \
         timed by servesim yet: it lacks the DeepSeek-V4 compressed-attention module op (the \
         dsv4_{{csa,hca}}_{{context,generation}}_module_perf tables, the CSA top-k calibration \
         dsv4_csa_topk_calib_perf and the module's roofline) and the mHC hyper-connection op \
         (mhc_module_perf); servesim refuses rather than time it as another family",
        spec.layers_with(4),
        spec.layers_with(128),
        spec.layers_with(0),
    ))
}
