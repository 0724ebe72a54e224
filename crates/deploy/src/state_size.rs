//! Automatic sizing of the recurrent-state cache: `kv_cache.state_cache` without
//! `bytes_per_request`. As the reference (aisimulate 0.13) sizes it, only for Kimi-K3 and
//! DeepSeek-V4 on vLLM at PP=1: the model fixes the pool's block size, its token bytes and ONE
//! state copy per rank, laid out as vLLM's allocator lays them out; every other model needs the
//! manual geometry.
//!
//! - Kimi-K3: the KDA state of a layer (fp32 delta-rule state and the convolutions' window in
//!   `mamba_cache_dtype`) is one page of the hybrid allocator, whose page is an MLA layer's
//!   block; the block grows (by whole multiples of the requested one) until a page holds the
//!   state, and the request's state is one padded page per KDA layer.
//! - DeepSeek-V4: every cache group (sliding-window KV, compressed KV and indexer keys,
//!   compressor states) shares one pool row, the widest group's bytes per block; compressed
//!   entries are the token bytes (one row per 256 tokens) and the rows the sliding-window groups
//!   keep resident are the fixed state.

use serde_json::Value;
use servesim_perf::dsv4::Dsv4Spec;
use servesim_perf::kimi_k3::KimiK3Spec;
use servesim_perf::model::{MlaDims, ModelSpec};

use crate::error::DeployError;
use crate::schema::{Capacity, Engine, Worker};

/// `kv_cache.state_cache` and `kv_cache.prefix_match_unit` of a worker.
#[derive(Clone, Debug, PartialEq)]
pub struct StateCache {
    /// None: to be sized from the model ([`resolve`]).
    pub bytes_per_request: Option<u64>,
    pub prefix_match_unit: Option<u64>,
    /// vLLM's `mamba_cache_dtype` (Kimi-K3's convolution window): auto, float16 or float32.
    pub mamba_cache_dtype: String,
    /// vLLM's indexer KV format (DeepSeek-V4): auto (fp8), fp8 or mxfp4.
    pub indexer_cache_dtype: String,
}

/// The geometry a sized state cache runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizing {
    pub block_size: u32,
    pub kv_bytes_per_token: u64,
    pub bytes_per_request: u64,
}

const U64_MAX: u128 = u64::MAX as u128;

fn in_u64(name: &str, v: u128, min: u128) -> Result<u64, String> {
    if (min..=U64_MAX).contains(&v) {
        Ok(v as u64)
    } else {
        Err(format!("{name} must be an integer from {min} through u64 max"))
    }
}

/// Kimi-K3 on `tp` ranks. `block_size` and `kv_bytes_per_token` are the configured ones (None:
/// 64 tokens and the MLA layers' latent KV in `kv_quant`, bf16 when unset); `conv_dtype` is the
/// configured `mamba_cache_dtype`, `model_dtype` the checkpoint's (its text config's `dtype` or
/// `torch_dtype`: what `auto` takes).
#[allow(clippy::too_many_arguments)]
pub fn kimi_k3(
    k: &KimiK3Spec,
    mla: &MlaDims,
    tp: u32,
    block_size: Option<u32>,
    kv_bytes_per_token: Option<u64>,
    kv_quant: Option<&str>,
    conv_dtype: &str,
    model_dtype: Option<&str>,
) -> Result<Sizing, String> {
    let block = u128::from(block_size.unwrap_or(64));
    in_u64("block_size", block, 2)?;
    if block % 16 != 0 {
        return Err("K3 automatic block_size requires a multiple of 16 tokens".into());
    }
    // The reference's KV-cache quantisation modes and their bytes per element.
    let elem_bytes = match kv_quant {
        None | Some("bfloat16") => 2,
        Some("int8" | "fp8") => 1,
        Some(other) => return Err(format!("unsupported kvcache_quant_mode: '{other}'")),
    };
    let (mla_layers, kda_layers) = (u128::from(k.mla_layers), u128::from(k.kda_layers));
    if mla_layers == 0 || kda_layers == 0 {
        return Err("K3 state sizing requires both MLA and KDA layers".into());
    }
    let per_token = match kv_bytes_per_token {
        Some(n) => u128::from(n),
        None => mla_layers * u128::from(mla.kv_lora_rank + mla.qk_rope_head_dim) * elem_bytes,
    };
    let per_token = in_u64("kv_bytes_per_token", per_token, 1)?;
    let per_token = u128::from(per_token);
    if per_token % mla_layers != 0 {
        return Err("kv_bytes_per_token must divide evenly across MLA layers".into());
    }
    let conv_width: u128 = match (conv_dtype, model_dtype) {
        ("auto", Some("float16" | "bfloat16")) | ("float16", _) => 2,
        ("auto", _) => return Err("set mamba_cache_dtype explicitly for an unresolved model dtype".into()),
        ("float32", _) => 4,
        _ => return Err("mamba_cache_dtype must be auto, float16 or float32".into()),
    };
    let heads = u128::from(k.kda_heads / tp.max(1));
    let dim = u128::from(k.kda_head_dim);
    let window = u128::from(k.conv_kernel.saturating_sub(1));
    // One layer's state: the q/k/v convolutions' window and the fp32 recurrent state.
    let raw_page = heads * (3 * dim * window * conv_width + dim * dim * 4);
    let layer_bytes = per_token / mla_layers;
    let requested_page = block * layer_bytes;
    let block = block * raw_page.div_ceil(requested_page);
    in_u64("block_bytes", block * per_token, 1)?;
    let block_size = u32::try_from(block).map_err(|_| "block_size must be an integer from 2 through u64 max")?;
    let bytes_per_request = in_u64("bytes_per_request", kda_layers * block * layer_bytes, 1)?;
    Ok(Sizing { block_size, kv_bytes_per_token: per_token as u64, bytes_per_request })
}

/// The block size of DeepSeek-V4's FlashMLA and indexer kernels.
pub const DSV4_BLOCK: u32 = 256;
/// Its sliding-window KV blocks.
const SWA_BLOCK: u64 = 64;
/// One `fp8_ds_mla` entry: 448 FP8 NoPE bytes, 128 bf16 RoPE bytes and 8 scale bytes.
const ENTRY: u64 = 584;
/// vLLM aligns every page to this many bytes.
const PAGE_ALIGN: u64 = 576;

/// A cache bucket: block size, and sliding window (None: full attention).
type Bucket = (u64, Option<u64>);

/// Compressor-state block size of a compress ratio.
fn state_block(ratio: u32) -> u64 {
    if ratio == 4 {
        4
    } else {
        8
    }
}

/// DeepSeek-V4 with the indexer in `indexer` (auto: fp8) and `draft_tokens` drafts per step
/// (they widen each sliding window).
pub fn deepseek_v4(d: &Dsv4Spec, indexer: &str, draft_tokens: u64) -> Result<Sizing, String> {
    if d.head_dim != 512 || d.qk_rope_head_dim != 64 || d.index_head_dim != 128 {
        return Err("DeepSeek V4 sizing follows vLLM's fp8_ds_mla layout: head_dim 512, RoPE 64, indexer 128".into());
    }
    if d.compress_ratios.iter().any(|r| ![0, 4, 128].contains(r)) {
        return Err("DeepSeek V4 sizing supports compress ratios 0, 4 and 128".into());
    }
    let dim = u64::from(d.index_head_dim);
    let indexer_entry = match indexer {
        // FP8 keys and one fp32 scale per 128 values.
        "auto" | "fp8" => dim + dim.div_ceil(128) * 4,
        // Two values a byte and one E8M0 scale per 32 values.
        "mxfp4" => dim / 2 + dim / 32,
        _ => return Err("indexer_cache_dtype must be auto, fp8 or mxfp4".into()),
    };
    let window = u64::from(d.sliding_window);
    // (bucket, page bytes) of every cache layer, in layer order.
    let page = |slots: u64, slot_bytes: u64| (slots * slot_bytes).div_ceil(PAGE_ALIGN) * PAGE_ALIGN;
    let mut layers: Vec<(Bucket, u64)> = Vec::new();
    for &ratio in &d.compress_ratios {
        layers.push(((SWA_BLOCK, Some(window)), page(SWA_BLOCK, ENTRY)));
        if ratio == 0 {
            continue;
        }
        let overlap = if ratio == 4 { 2 } else { 1 };
        let sb = state_block(ratio);
        let state: Bucket = (sb, Some(overlap * u64::from(ratio)));
        let mut caches = vec![(ENTRY, u64::from(d.head_dim))];
        if ratio == 4 {
            caches.push((indexer_entry, dim));
        }
        for (entry, width) in caches {
            layers.push(((u64::from(DSV4_BLOCK), None), page(u64::from(DSV4_BLOCK / ratio), entry)));
            layers.push((state, page(sb, 2 * overlap * width * 4)));
        }
    }
    // Buckets in first-seen order, each with its page sizes (first-seen order) and layer counts.
    let mut buckets: Vec<(Bucket, Vec<(u64, u64)>)> = Vec::new();
    for (bucket, p) in layers {
        let i = match buckets.iter().position(|(b, _)| *b == bucket) {
            Some(i) => i,
            None => {
                buckets.push((bucket, Vec::new()));
                buckets.len() - 1
            }
        };
        let pages = &mut buckets[i].1;
        match pages.iter_mut().find(|(q, _)| *q == p) {
            Some((_, n)) => *n += 1,
            None => pages.push((p, 1)),
        }
    }
    // A balanced bucket holds as many layers of each of its page sizes: it splits into groups
    // of `repeats` layers per page size, the count vLLM picks to pad least (ties: the larger).
    let balanced = |pages: &[(u64, u64)]| pages.iter().all(|&(_, n)| n == pages[0].1).then(|| pages[0].1);
    let repeats_of: Vec<Option<u64>> = buckets.iter().map(|(_, p)| balanced(p)).collect();
    let lower = buckets
        .iter()
        .zip(&repeats_of)
        .filter_map(|((_, p), r)| r.filter(|_| p.len() > 1))
        .max()
        .ok_or("DeepSeek V4 sizing expects compressed layers with compressor states")?;
    let values: Vec<u64> = repeats_of.iter().flatten().copied().collect();
    let upper = values.iter().copied().max().unwrap_or(lower);
    let padding = |r: u64| values.iter().map(|v| (r - v % r) % r).sum::<u64>();
    let mut repeats = lower;
    for r in lower..=upper {
        if padding(r) <= padding(repeats) {
            repeats = r;
        }
    }
    // (block size, sliding window, bytes per block) of every group.
    let mut groups = Vec::new();
    for (((block, window), pages), balanced) in buckets.iter().zip(&repeats_of) {
        let count = balanced.map_or(1, |r| r.div_ceil(repeats));
        for index in 0..count {
            let bytes: u64 = pages.iter().map(|&(p, total)| p * total.saturating_sub(index).div_ceil(count)).sum();
            groups.push((*block, *window, bytes));
        }
    }
    let row = groups.iter().map(|g| g.2).max().unwrap_or(0);
    // W window tokens and k drafts span up to cdiv(W + k, B) + 1 blocks of B tokens.
    let fixed_rows: u64 = groups
        .iter()
        .filter_map(|&(block, window, _)| window.filter(|&w| w > 0).map(|w| (w + draft_tokens).div_ceil(block) + 1))
        .sum();
    Ok(Sizing {
        block_size: DSV4_BLOCK,
        kv_bytes_per_token: row.div_ceil(u64::from(DSV4_BLOCK)),
        bytes_per_request: fixed_rows * row,
    })
}

/// The worker `w` with its state cache sized (block size, token bytes and state bytes as the
/// reference resolves them), and the reference's capacity checks on that geometry. A worker
/// whose state bytes are given, or that has no state cache, is returned as it is.
pub fn resolve(engine: &Engine, w: &Worker) -> Result<Worker, DeployError> {
    let Some(state) = w.state_cache.as_ref().filter(|s| s.bytes_per_request.is_none()) else {
        return Ok(w.clone());
    };
    let here = format!("engine.workers.{}.kv_cache.state_cache", w.role);
    let err = |m: String| DeployError::new(&here, m);
    let paths = w.systems_paths.as_ref().or(engine.systems_paths.as_ref()).cloned().unwrap_or_default();
    let roots = servesim_perf::systems::systems_roots(&paths).map_err(|e| err(e.message))?;
    let roots: Vec<std::path::PathBuf> = roots.into_iter().map(|(p, _)| p).collect();
    // The family first, from the config's architecture (a model servesim does not time is
    // refused as the reference refuses every other family).
    let path = servesim_perf::model::find_config(engine.model.as_str(), &roots).map_err(|e| err(e.message))?;
    let raw: Value = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| err(format!("{}: not a readable JSON model config", path.display())))?;
    let arch = raw.pointer("/architectures/0").and_then(Value::as_str).unwrap_or("");
    if ![servesim_perf::kimi_k3::ARCH, servesim_perf::dsv4::ARCH].contains(&arch) {
        return Err(
            err("automatic state sizing supports Kimi K3 and DeepSeek V4; supply manual state geometry".into()),
        );
    }
    let model = ModelSpec::load(engine.model.as_str(), &roots).map_err(|e| err(e.message))?;
    if engine.backend != "vllm" || w.parallelism.pipeline != 1 {
        return Err(err("automatic state sizing requires vllm and PP=1".into()));
    }
    let control = |k: &str| w.timing_controls.get(k).or(engine.controls.get(k)).and_then(Value::as_str);
    let kv_quant = control("kvcache_quant_mode");
    let drafts = engine.speculation.as_ref().map_or(0, |s| u64::from(s.nextn));
    let sizing = if let Some(d) = &model.dsv4 {
        if w.block_size.is_some_and(|b| b != DSV4_BLOCK) {
            return Err(err(format!("vLLM's DeepSeek V4 kernels and compressor states use {DSV4_BLOCK}-token blocks")));
        }
        if w.bytes_per_token.is_some() {
            return Err(
                err("DeepSeek V4 token bytes follow vLLM's cache groups; leave bytes_per_token as auto".into()),
            );
        }
        if kv_quant.is_some_and(|q| q != "fp8") {
            return Err(err(
                "vLLM's DeepSeek V4 FlashMLA backend stores fp8_ds_mla KV; use kvcache_quant_mode fp8".into()
            ));
        }
        if state.mamba_cache_dtype != "auto" {
            return Err(err("mamba_cache_dtype applies to Kimi K3 only".into()));
        }
        deepseek_v4(d, &state.indexer_cache_dtype, drafts).map_err(err)?
    } else {
        let k = model.kimi_k3.as_ref().expect("checked above");
        if state.indexer_cache_dtype != "auto" {
            return Err(err("indexer_cache_dtype applies to DeepSeek V4 only".into()));
        }
        let mla = model.mla.as_ref().ok_or_else(|| err("K3 state sizing requires both MLA and KDA layers".into()))?;
        let text = raw.get("text_config").unwrap_or(&raw);
        let model_dtype = text.get("dtype").or_else(|| text.get("torch_dtype")).and_then(Value::as_str);
        kimi_k3(
            k,
            mla,
            w.parallelism.tensor,
            w.block_size,
            w.bytes_per_token,
            kv_quant,
            &state.mamba_cache_dtype,
            model_dtype,
        )
        .map_err(err)?
    };
    if let Some(unit) = state.prefix_match_unit {
        if u64::from(sizing.block_size) % unit != 0 {
            return Err(DeployError::new(
                format!("engine.workers.{}.kv_cache.prefix_match_unit", w.role),
                "prefix_match_unit must be a positive divisor of resolved block_size",
            ));
        }
    }
    let block_bytes = u64::from(sizing.block_size) * sizing.kv_bytes_per_token;
    let blocks = match w.capacity {
        Capacity::Blocks(b) => b,
        Capacity::Bytes(b) => b / block_bytes,
        Capacity::Default { .. } => unreachable!("state_cache requires fixed capacity, checked when read"),
    };
    let cap_here = format!("engine.workers.{}.kv_cache.capacity", w.role);
    if blocks == 0 {
        return Err(DeployError::new(cap_here, "fixed KV capacity must fit at least one block within u64"));
    }
    if blocks < sizing.bytes_per_request.div_ceil(block_bytes) + 1 {
        return Err(err("state_cache capacity must fit one token block and one request state".into()));
    }
    let mut out = w.clone();
    out.block_size = Some(sizing.block_size);
    out.bytes_per_token = Some(sizing.kv_bytes_per_token);
    out.state_cache = Some(StateCache { bytes_per_request: Some(sizing.bytes_per_request), ..state.clone() });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn load(model: &str) -> ModelSpec {
        let roots = servesim_perf::systems::systems_roots(&[]).unwrap();
        let roots: Vec<std::path::PathBuf> = roots.into_iter().map(|(p, _)| p).collect();
        ModelSpec::load(model, &roots).unwrap()
    }

    /// The reference's `estimate_state_cache` (aisimulate_core 0.13, sdk/memory/state.py) on
    /// Kimi-K3, printed by `$AISIM_REF_VENV/bin/python -c "from aisimulate_core.sdk.memory import
    /// estimate_state_cache as e; print(e('moonshotai/Kimi-K3', tp_size=8, ...))"`.
    #[test]
    fn kimi_k3_matches_the_reference_estimates() {
        let m = load("moonshotai/Kimi-K3");
        let (k, mla) = (m.kimi_k3.as_ref().unwrap(), m.mla.as_ref().unwrap());
        let s = |tp, block, bytes, quant, conv| kimi_k3(k, mla, tp, block, bytes, quant, conv, Some("bfloat16"));
        let sized = |b, t, r| Ok(Sizing { block_size: b, kv_bytes_per_token: t, bytes_per_request: r });
        assert_eq!(s(8, None, None, None, "auto"), sized(768, 27648, 61046784));
        assert_eq!(s(16, None, None, None, "auto"), sized(384, 27648, 30523392));
        assert_eq!(s(8, None, None, None, "float32"), sized(768, 27648, 61046784));
        assert_eq!(s(8, None, None, Some("fp8"), "auto"), sized(1472, 13824, 58503168));
        assert_eq!(s(4, Some(128), None, None, "auto"), sized(1536, 27648, 122093568));
        assert_eq!(s(1, None, None, Some("int8"), "auto"), sized(11328, 13824, 450220032));
        let e = |r: Result<Sizing, String>| r.unwrap_err();
        assert_eq!(e(s(8, Some(24), None, None, "auto")), "K3 automatic block_size requires a multiple of 16 tokens");
        assert_eq!(e(s(8, None, Some(1000), None, "auto")), "kv_bytes_per_token must divide evenly across MLA layers");
        assert_eq!(e(s(8, None, None, Some("nvfp4"), "auto")), "unsupported kvcache_quant_mode: 'nvfp4'");
        assert_eq!(
            e(kimi_k3(k, mla, 8, None, None, None, "auto", Some("float32"))),
            "set mamba_cache_dtype explicitly for an unresolved model dtype"
        );
    }

    /// The same estimates on DeepSeek-V4-Flash and -Pro (the reference's per-rank geometry does
    /// not depend on TP): pool row, token bytes and fixed rows.
    #[test]
    fn deepseek_v4_matches_the_reference_estimates() {
        let flash = load("deepseek-ai/DeepSeek-V4-Flash");
        let pro = load("deepseek-ai/DeepSeek-V4-Pro");
        let (f, p) = (flash.dsv4.as_ref().unwrap(), pro.dsv4.as_ref().unwrap());
        let sized = |t, r| Ok(Sizing { block_size: 256, kv_bytes_per_token: t, bytes_per_request: r });
        // Rows of 1002240 bytes, 26 of them fixed; 917568 with MXFP4 keys; 3 drafts: 30 rows.
        assert_eq!(deepseek_v4(f, "auto", 0), sized(3915, 26058240));
        assert_eq!(deepseek_v4(f, "mxfp4", 0), sized(3585, 23856768));
        assert_eq!(deepseek_v4(f, "fp8", 3), sized(3915, 30067200));
        assert_eq!(deepseek_v4(p, "auto", 0), sized(5610, 37335168));
        assert_eq!(deepseek_v4(f, "int4", 0).unwrap_err(), "indexer_cache_dtype must be auto, fp8 or mxfp4");
    }

    /// What the reference refuses when it sizes the state, in its words (its errors for Qwen3-32B,
    /// DeepSeek-V4.1-Flash and PP=2 checked with aisimulate_predict.py on these configs).
    #[test]
    fn sizing_is_refused_as_the_reference_refuses_it() {
        let lower = |model: &str, worker: Value| {
            let mut kv = json!({"capacity": {"type": "fixed", "blocks": 60}, "state_cache": {}});
            let mut worker = worker;
            let extra = worker.as_object_mut().unwrap().remove("kv_cache").unwrap_or(json!({}));
            kv.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            worker["kv_cache"] = kv;
            worker["timing"] = json!({"type": "fixed", "prefill_ms": 1, "decode_ms": 1});
            let root = json!({"engine": {"mode": "aggregated", "backend": "vllm", "model": model,
                "hardware": "b200_sxm", "context_length": 1024, "workers": {"aggregated": worker}}});
            let cfg = crate::schema::read_predict(&root).map_err(|e| e.to_string())?;
            crate::lower::lower_engine(&cfg.engine).map(|_| ()).map_err(|e| e.to_string())
        };
        let (k3, v4) = ("moonshotai/Kimi-K3", "deepseek-ai/DeepSeek-V4-Flash");
        let at = "engine.workers.aggregated.kv_cache.state_cache: ";
        let other = "automatic state sizing supports Kimi K3 and DeepSeek V4; supply manual state geometry";
        for (model, worker, want) in [
            ("Qwen/Qwen3-32B", json!({}), other.to_string()),
            ("deepseek-ai/DeepSeek-V4.1-Flash", json!({}), other.to_string()),
            (k3, json!({"parallelism": {"tensor": 4, "pipeline": 2}}), format!("{at}automatic state sizing requires vllm and PP=1")),
            (k3, json!({"kv_cache": {"block_size": 24}}), format!("{at}K3 automatic block_size requires a multiple of 16 tokens")),
            (k3, json!({"kv_cache": {"state_cache": {"indexer_cache_dtype": "fp8"}}}), format!("{at}indexer_cache_dtype applies to DeepSeek V4 only")),
            (k3, json!({"kv_cache": {"bytes_per_token": 1000}}), format!("{at}kv_bytes_per_token must divide evenly across MLA layers")),
            (
                k3,
                json!({"kv_cache": {"prefix_match_unit": 512}}),
                "engine.workers.aggregated.kv_cache.prefix_match_unit: prefix_match_unit must be a positive divisor of resolved block_size".to_string(),
            ),
            // 768-token blocks of 27648 bytes; the state takes 3 of them.
            (k3, json!({"kv_cache": {"capacity": {"type": "fixed", "blocks": 3}}}), format!("{at}state_cache capacity must fit one token block and one request state")),
            (
                k3,
                json!({"kv_cache": {"capacity": {"type": "fixed", "bytes": 21233663}}}),
                "engine.workers.aggregated.kv_cache.capacity: fixed KV capacity must fit at least one block within u64".to_string(),
            ),
            (v4, json!({"kv_cache": {"block_size": 64}}), format!("{at}vLLM's DeepSeek V4 kernels and compressor states use 256-token blocks")),
            (v4, json!({"kv_cache": {"bytes_per_token": 3915}}), format!("{at}DeepSeek V4 token bytes follow vLLM's cache groups; leave bytes_per_token as auto")),
            (v4, json!({"kv_cache": {"state_cache": {"mamba_cache_dtype": "float32"}}}), format!("{at}mamba_cache_dtype applies to Kimi K3 only")),
            (v4, json!({"kv_cache": {"capacity": {"type": "fixed", "blocks": 26}}}), format!("{at}state_cache capacity must fit one token block and one request state")),
        ] {
            let e = lower(model, worker.clone()).unwrap_err();
            assert!(e.ends_with(&want), "{model} {worker}: {e}");
        }
        assert_eq!(lower(k3, json!({"kv_cache": {"capacity": {"type": "fixed", "blocks": 4}}})), Ok(()));
        assert_eq!(lower(v4, json!({"kv_cache": {"capacity": {"type": "fixed", "blocks": 27}}})), Ok(()));
    }
}
