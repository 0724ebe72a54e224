//! Model architecture from a Hugging Face `config.json`, and the op list built from it.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::db::Dtype;
use crate::error::{PerfError, Result};
use crate::mla_ops::{MlaBmmOp, MlaKind, MlaOp};
use crate::moe_ops::{DispatchOp, MoeOp, DISTRIBUTION, MLA_DISTRIBUTION};

/// Which op-list builder a model uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Dense decoder (Llama, Qwen2, Qwen3, Mistral).
    Dense,
    /// Mixture of experts replacing every FFN (Qwen3-MoE, Mixtral, gpt-oss).
    Moe,
    /// Multi-head latent attention with shared + routed experts (DeepSeek-V3 / R1 / V3.1,
    /// Kimi-K2), as the reference's `DeepSeekModel` times it.
    Mla,
    /// DeepSeek sparse attention (DeepSeek-V3.2, GLM-5.x): MLA with the lightning indexer, timed
    /// by the reference's `DeepSeekV32Model` (`dsa.rs`).
    Dsa,
    /// Gemma 4 (the reference's `GEMMA4MIX`): sliding-window and global attention layers of
    /// different widths, a dense MLP beside routed experts on every layer (`gemma4.rs`).
    Gemma4,
    /// MiniMax-M3 (the reference's `MINIMAXM3`): DSA's graph with MiniMax sparse attention, a
    /// block-indexed GQA (`msa.rs`).
    Msa,
    /// DeepSeek-V4 (the reference's `DEEPSEEKV4`): compressed attention (SWA / CSA / HCA) with
    /// mHC residual streams, shared + routed experts (`dsv4.rs`).
    Dsv4,
}

/// What a DSA model adds to the MLA facts (`dsa.rs` builds its graph).
#[derive(Clone, Debug, PartialEq)]
pub struct DsaSpec {
    pub arch: crate::dsa::DsaArch,
    /// Fraction of layers computing the top-k index (`index_topk_freq` & co.; 1: all).
    pub full_frac: f64,
    /// Dense first layers grouped by whether the checkpoint keeps their (gate/up, down)
    /// projections in bf16: `(layers, gate_bf16, down_bf16)`, in first-seen order.
    pub dense_groups: Vec<(u32, bool, bool)>,
    /// Which attention projection groups (q, kv, o, indexer) the checkpoint keeps in bf16, read
    /// loosely (any `self_attn` pattern naming no projection covers the block) and by precise
    /// module paths (vLLM: only a pattern ending at the block covers it).
    pub attn_bf16: [bool; 4],
    pub attn_bf16_precise: [bool; 4],
    /// `kv_lora_rank`, `qk_rope_head_dim` and `index_head_dim` as the KV cache sizes them.
    pub kv_dims: [u32; 3],
}

/// Latent attention widths of an MLA model (`config.json`; DeepSeek-V3's values when absent).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MlaDims {
    pub q_lora_rank: u32,
    pub kv_lora_rank: u32,
    pub qk_nope_head_dim: u32,
    pub qk_rope_head_dim: u32,
    pub v_head_dim: u32,
}

/// The architecture facts the op list needs.
#[derive(Clone, Debug)]
pub struct ModelSpec {
    pub name: String,
    pub source: PathBuf,
    pub architecture: String,
    pub family: Family,
    pub layers: u32,
    pub hidden: u32,
    pub heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub inter: u32,
    pub vocab: u32,
    pub max_position: u32,
    pub topk: u32,
    pub experts: u32,
    pub moe_inter: u32,
    pub qk_norm: bool,
    /// gpt-oss: half the layers attend within this sliding window (0: every layer is global).
    pub sliding_window: u32,
    /// Formats implied by the checkpoint's quantisation config.
    pub quant: Quant,
    /// MLA models: the latent attention widths.
    pub mla: Option<MlaDims>,
    /// Always-active experts beside the routed ones (`n_shared_experts`).
    pub shared_experts: u32,
    /// Leading dense layers (`first_k_dense_replace`); the timing graph still times every layer
    /// as MoE, as the reference does.
    pub dense_layers: u32,
    /// `torch_dtype` / `dtype` of the checkpoint's unquantised tensors.
    pub torch_dtype: Option<String>,
    /// DSA models: the sparse-attention facts.
    pub dsa: Option<DsaSpec>,
    /// Gemma 4: the per-layer-type attention facts.
    pub gemma4: Option<crate::gemma4::Gemma4Spec>,
    /// Hybrid local / global attention models (Llama-4, MiMo-V2-Flash; `hybrid_moe.rs`).
    pub hybrid: Option<crate::hybrid_moe::HybridSpec>,
    /// DeepSeek-V4: the compressed-attention and mHC facts.
    pub dsv4: Option<crate::dsv4::Dsv4Spec>,
    /// DeepSeek-V4.1: the backbone's cross-layer cache, Engram and mHC facts (`dsv41.rs`).
    pub dsv41: Option<crate::dsv41::Dsv41Spec>,
    /// Nemotron-H: the layer kinds and Mamba2 widths (`mamba2.rs`).
    pub nemotron_h: Option<crate::mamba2::NemotronHSpec>,
    /// Qwen3.5: the GDN / full-attention layer split and GDN widths (`gdn.rs`).
    pub qwen35: Option<crate::gdn::Qwen35Spec>,
    /// Muse-Glimmer: the sliding-window / global layer split (`glimmer.rs`).
    pub glimmer: Option<crate::glimmer::GlimmerSpec>,
    /// Kimi-K3: the KDA / MLA layer split, KDA widths and LatentMoE facts (`kimi_k3.rs`).
    pub kimi_k3: Option<crate::kimi_k3::KimiK3Spec>,
}

/// Number formats a checkpoint implies, as the reference infers them from `config.json`'s
/// `quantization_config` (and an `hf_quant_config.json` beside it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Quant {
    pub gemm: Dtype,
    pub moe: Dtype,
    pub kv: Dtype,
    pub fmha: Dtype,
    /// Weight block of block-scaled formats (`weight_block_size[0]`, 128 when not given).
    pub block: u32,
    /// Projections the checkpoint leaves unquantised (its exclusion list).
    pub excluded: Excluded,
}

/// Which projections a quantised checkpoint keeps in 16 bits, from the module patterns its
/// quantisation config excludes (`exclude_modules`, `ignore`, `modules_to_not_convert`). Only
/// the MLA graph reads them, as the reference does: NVFP4 DeepSeek releases keep the q / kv
/// projections (or the whole attention block) and sometimes the shared experts in bf16.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Excluded {
    pub q: bool,
    pub kv: bool,
    pub o: bool,
    pub shared_expert: bool,
}

impl Excluded {
    fn from_patterns<'a>(patterns: impl IntoIterator<Item = &'a str>) -> Excluded {
        const Q: &[&str] = &["q_a_proj", "q_b_proj", "q_proj"];
        const KV: &[&str] = &["kv_a_proj", "kv_b_proj", "kv_proj", "k_proj", "v_proj"];
        const O: &[&str] = &["o_proj"];
        let mut e = Excluded::default();
        for p in patterns {
            let hit = |markers: &[&str]| markers.iter().any(|m| p.contains(m));
            let named = hit(Q) || hit(KV) || hit(O) || p.contains("indexer");
            // A pattern naming the attention block but none of its projections covers them all.
            if p.contains("self_attn") && !named {
                (e.q, e.kv, e.o) = (true, true, true);
            }
            e.q |= hit(Q);
            e.kv |= hit(KV);
            e.o |= hit(O);
            e.shared_expert |= p.to_lowercase().contains("shared_expert");
        }
        e
    }
}

const DENSE: &[&str] =
    &["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM", "MiMoForCausalLM"];
const MOE: &[&str] =
    &["Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM", "MixtralForCausalLM", "GptOssForCausalLM", "MiniMaxM2ForCausalLM"];
/// `KimiK25ForConditionalGeneration` is DeepSeek-V3's text model under `text_config` beside a
/// vision tower that a text-only load leaves out (see `text_config`).
const MLA: &[&str] = &["DeepseekV3ForCausalLM", "KimiK25ForConditionalGeneration"];
const DSA: &[&str] = &["DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM"];
const GEMMA4: &[&str] = &["Gemma4ForConditionalGeneration"];
/// Local / global attention with MoE and dense layers (the reference's `HYBRIDMOE` family):
/// MoE models with their own graph (`hybrid_moe.rs`). Llama-4's text model is under
/// `text_config`.
const HYBRID: &[&str] = &["Llama4ForConditionalGeneration", "MiMoV2FlashForCausalLM"];
/// MiniMax-M3 and its NVFP4 release's multimodal wrapper (the text model under `text_config`).
const MSA: &[&str] = &["MiniMaxM3ForCausalLM", "MiniMaxM3SparseForConditionalGeneration"];
/// MLA architectures the reference knows and servesim does not take yet.
const MLA_OTHER: &[&str] = &["DeepSeekForCausalLM"];

/// The part of a `config.json` that describes the language model: a multimodal wrapper keeps
/// it under `text_config` (Kimi-K2.5 / K2.6 / K2.7, Llama-4), everything else at the top. The reference
/// times a text-only load of such a wrapper exactly as its text model: the vision tower adds no
/// op and no resident weight unless requests carry images (probed on Kimi-K2.5-NVFP4: the same
/// KV capacity and step times with and without `vision_config`).
fn text_config<'a>(arch: &str, cfg: &'a Value, shown: &str) -> Result<&'a Value> {
    if !matches!(
        arch,
        "KimiK25ForConditionalGeneration"
            | "MiniMaxM3SparseForConditionalGeneration"
            | "Llama4ForConditionalGeneration"
    ) && !GEMMA4.contains(&arch)
        && !crate::gdn::ARCHS.contains(&arch)
        && !crate::qwen3vl::ARCHS.contains(&arch)
        && arch != crate::glimmer::ARCH
        && arch != crate::kimi_k3::ARCH
        && arch != crate::dsv41::ARCH
    {
        return Ok(cfg);
    }
    cfg.get("text_config")
        .filter(|t| t.is_object())
        .ok_or_else(|| PerfError::config(format!("{shown}: {arch} needs its language model under text_config")))
}

/// Where the language model's `quantization_config` is: the top level when it has one (the
/// ModelOpt NVFP4 Kimi releases), else the nested text model's (moonshotai/Kimi-K2.5's
/// compressed-tensors INT4), as the reference's `_get_language_quantization_config` reads it.
fn quantisation_scope<'a>(root: &'a Value, text: &'a Value) -> &'a Value {
    if root.get("quantization_config").is_some() {
        root
    } else {
        text
    }
}

/// Where a model's `config.json` is: a file, a directory holding `config.json`, or a Hugging
/// Face id found as `model_configs/<Org>--<Name>_config.json` beside a `systems/` root.
pub fn find_config(model: &str, roots: &[PathBuf]) -> Result<PathBuf> {
    let p = Path::new(model);
    if p.is_file() {
        return Ok(p.to_path_buf());
    }
    if p.is_dir() {
        let c = p.join("config.json");
        if c.is_file() {
            return Ok(c);
        }
        return Err(PerfError::config(format!("model directory {model} has no config.json")));
    }
    let file = format!("{}_config.json", model.replace('/', "--"));
    let mut looked = Vec::new();
    for root in roots {
        let dir = root.parent().map(|d| d.join("model_configs")).unwrap_or_default();
        let c = dir.join(&file);
        if c.is_file() {
            return Ok(c);
        }
        looked.push(dir.display().to_string());
    }
    Err(PerfError::config(format!(
        "model {model:?}: not a file or a directory with config.json, and no {file} in {}",
        if looked.is_empty() { "any model_configs directory".to_string() } else { looked.join(", ") }
    )))
}

/// A model's `config.json` (as [`find_config`] found it), read bounded: HF configs may carry
/// `Infinity` / `NaN` literals, which JSON forbids, so they are read as ±1e308 / null.
pub fn read_model_config(path: &Path) -> Result<Value> {
    let text = servesim_config::read_config_text(path)
        .map_err(|e| PerfError::config(format!("cannot read {}: {e}", path.display())))?;
    let text = text.replace("-Infinity", "-1e308").replace("Infinity", "1e308").replace("NaN", "null");
    serde_json::from_str(&text).map_err(|e| PerfError::config(format!("{} is not valid JSON: {e}", path.display())))
}

fn uint(cfg: &Value, key: &str) -> Option<u32> {
    cfg.get(key).and_then(Value::as_u64).map(|v| v as u32)
}

impl ModelSpec {
    pub fn load(model: &str, roots: &[PathBuf]) -> Result<ModelSpec> {
        let path = find_config(model, roots)?;
        let cfg = read_model_config(&path)?;
        let hf_quant = hf_quant_config(&path)?;
        Self::from_config_with(model, &path, &cfg, hf_quant.as_ref())
    }

    pub fn from_config(name: &str, path: &Path, cfg: &Value) -> Result<ModelSpec> {
        Self::from_config_with(name, path, cfg, None)
    }

    fn from_config_with(name: &str, path: &Path, cfg: &Value, hf_quant: Option<&Value>) -> Result<ModelSpec> {
        let shown = path.display();
        let arch = cfg
            .get("architectures")
            .and_then(Value::as_array)
            .and_then(|a| a.first())
            .and_then(Value::as_str)
            .ok_or_else(|| PerfError::config(format!("{shown}: no architectures entry")))?
            .to_string();
        let root = cfg;
        let cfg = text_config(&arch, root, &shown.to_string())?;
        let family = if DENSE.contains(&arch.as_str()) {
            Family::Dense
        } else if MOE.contains(&arch.as_str()) || HYBRID.contains(&arch.as_str()) {
            Family::Moe
        } else if arch == crate::mamba2::ARCH {
            // Nemotron-H has its own graph (`mamba2.rs`); its MoE layers are plain MoE.
            Family::Moe
        } else if MLA.contains(&arch.as_str()) {
            Family::Mla
        } else if DSA.contains(&arch.as_str()) {
            Family::Dsa
        } else if GEMMA4.contains(&arch.as_str()) {
            Family::Gemma4
        } else if MSA.contains(&arch.as_str()) {
            Family::Msa
        } else if arch == crate::dsv4::ARCH {
            Family::Dsv4
        } else if crate::gdn::ARCHS.contains(&arch.as_str()) {
            // Qwen3.5: the dense or MoE graph's facts, its own op list (`gdn.rs`).
            if uint(cfg, "num_experts").unwrap_or(0) > 0 {
                Family::Moe
            } else {
                Family::Dense
            }
        } else if let Some(f) = crate::qwen3vl::family(&arch) {
            f
        } else if arch == crate::kimi_k3::ARCH {
            // Kimi-K3: MoE facts and MLA widths, its own op list (`kimi_k3.rs`).
            Family::Moe
        } else if arch == crate::glimmer::ARCH {
            // Muse-Glimmer: the dense graph's facts, its own op list (`glimmer.rs`).
            Family::Dense
        } else if arch == crate::dsv41::ARCH {
            // DeepSeek-V4.1: MoE facts, its own stages and cross-layer cache (`dsv41.rs`).
            Family::Moe
        } else if MLA_OTHER.contains(&arch.as_str()) {
            return Err(PerfError::unsupported(format!(
                "{shown}: {arch} (the reference's DEEPSEEK family under another name) is not supported by servesim yet: no packaged model uses it to check servesim against; supported: {}",
                [DENSE, MOE, HYBRID, MLA, DSA, GEMMA4, MSA, &[crate::dsv4::ARCH], &[crate::dsv41::ARCH], &[crate::mamba2::ARCH], &crate::gdn::ARCHS, crate::qwen3vl::ARCHS, &[crate::glimmer::ARCH]].concat().join(", ")
            )));
        } else {
            return Err(PerfError::unsupported(format!(
                "{shown}: architecture {arch} is not supported by servesim's op builder; supported: {}",
                [
                    DENSE,
                    MOE,
                    HYBRID,
                    MLA,
                    DSA,
                    GEMMA4,
                    MSA,
                    &[crate::dsv4::ARCH],
                    &[crate::dsv41::ARCH],
                    &[crate::mamba2::ARCH],
                    &crate::gdn::ARCHS,
                    crate::qwen3vl::ARCHS,
                    &[crate::glimmer::ARCH],
                    &[crate::kimi_k3::ARCH],
                ]
                .concat()
                .join(", ")
            )));
        };
        let need =
            |k: &str| uint(cfg, k).ok_or_else(|| PerfError::config(format!("{shown}: missing or non-integer {k}")));
        let hidden = need("hidden_size")?;
        let heads = need("num_attention_heads")?;
        let nemotron_h = arch == crate::mamba2::ARCH;
        // Nemotron-3-Ultra gives its depth only as the layer list.
        let layers =
            if nemotron_h { crate::mamba2::layer_count(cfg, &shown.to_string())? } else { need("num_hidden_layers")? };
        let vocab = need("vocab_size")?;
        let kv_heads = uint(cfg, "num_key_value_heads").filter(|&v| v > 0).unwrap_or(heads);
        let head_dim = uint(cfg, "head_dim").filter(|&v| v > 0).unwrap_or(hidden.checked_div(heads).unwrap_or(0));
        let inter = uint(cfg, "intermediate_size").unwrap_or(0);
        let topk = uint(cfg, "num_experts_per_tok")
            .or_else(|| uint(cfg, "top_k_experts"))
            // Kimi-K3's KimiLinearConfig spells it this way.
            .or_else(|| uint(cfg, "num_experts_per_token"))
            .unwrap_or(0);
        let experts = uint(cfg, "num_local_experts")
            .filter(|&v| v > 0)
            .or_else(|| uint(cfg, "n_routed_experts").filter(|&v| v > 0))
            .or_else(|| uint(cfg, "num_experts"))
            .unwrap_or(0);
        let moe_inter = uint(cfg, "moe_intermediate_size").filter(|&v| v > 0).unwrap_or(inter);
        if heads == 0 || head_dim == 0 || hidden == 0 || layers == 0 {
            return Err(PerfError::config(format!(
                "{shown}: hidden_size, num_attention_heads, head_dim and num_hidden_layers must be positive"
            )));
        }
        if family == Family::Dense && inter == 0 {
            return Err(PerfError::config(format!("{shown}: missing intermediate_size")));
        }
        // Gemma 4 comes in dense variants too (no experts: every layer is the dense MLP).
        // Nemotron-H checks its MoE facts only when its layer string has MoE layers.
        if !matches!(family, Family::Dense | Family::Gemma4)
            && !nemotron_h
            && (topk == 0 || experts == 0 || moe_inter == 0)
        {
            return Err(PerfError::config(format!(
                "{shown}: a mixture-of-experts model needs num_experts_per_tok, the expert count and moe_intermediate_size"
            )));
        }
        let quant = quantisation(quantisation_scope(root, cfg), hf_quant, &shown.to_string())?;
        let arch_name = arch.clone();
        let gpt_oss = arch == "GptOssForCausalLM";
        let width = |k: &str, default: u32| uint(cfg, k).filter(|&v| v > 0).unwrap_or(default);
        let mla = (matches!(family, Family::Mla | Family::Dsa) || arch == crate::kimi_k3::ARCH).then(|| MlaDims {
            q_lora_rank: width("q_lora_rank", 1536),
            kv_lora_rank: width("kv_lora_rank", 512),
            qk_nope_head_dim: width("qk_nope_head_dim", 128),
            qk_rope_head_dim: width("qk_rope_head_dim", 64),
            v_head_dim: width("v_head_dim", 128),
        });
        let mut spec = ModelSpec {
            name: name.to_string(),
            source: path.to_path_buf(),
            qk_norm: matches!(arch.as_str(), "Qwen3ForCausalLM" | "Qwen3MoeForCausalLM" | "MiniMaxM2ForCausalLM"),
            architecture: arch.clone(),
            family,
            layers,
            hidden,
            heads,
            kv_heads,
            head_dim,
            inter,
            vocab,
            max_position: uint(cfg, "max_position_embeddings").unwrap_or(0),
            topk,
            experts,
            moe_inter,
            sliding_window: if gpt_oss { 128 } else { 0 },
            quant,
            mla,
            shared_experts: uint(cfg, "n_shared_experts").or_else(|| uint(cfg, "num_shared_experts")).unwrap_or(0),
            dense_layers: uint(cfg, "first_k_dense_replace").unwrap_or(0),
            torch_dtype: ["dtype", "torch_dtype"].iter().find_map(|k| lower_str(root.get(*k))),
            dsa: if family == Family::Dsa {
                Some(crate::dsa::spec_from_config(
                    cfg,
                    &arch_name,
                    layers,
                    &exclude_patterns(cfg, hf_quant),
                    &shown.to_string(),
                )?)
            } else {
                None
            },
            gemma4: if family == Family::Gemma4 {
                Some(crate::gemma4::spec_from_config(
                    cfg,
                    layers,
                    &exclude_patterns(quantisation_scope(root, cfg), hf_quant),
                    &shown.to_string(),
                )?)
            } else {
                None
            },
            hybrid: None,
            nemotron_h: if nemotron_h { Some(crate::mamba2::spec_from_config(cfg, &shown.to_string())?) } else { None },
            dsv4: if family == Family::Dsv4 {
                Some(crate::dsv4::Dsv4Spec::from_config(cfg, layers, &shown.to_string())?)
            } else {
                None
            },
            dsv41: if arch == crate::dsv41::ARCH {
                Some(crate::dsv41::Dsv41Spec::from_config(cfg, &shown.to_string())?)
            } else {
                None
            },
            qwen35: None,
            kimi_k3: if arch == crate::kimi_k3::ARCH {
                Some(crate::kimi_k3::spec_from_config(cfg, layers, hidden, &shown.to_string())?)
            } else {
                None
            },
            glimmer: if arch == crate::glimmer::ARCH {
                Some(crate::glimmer::spec_from_config(cfg, layers, &shown.to_string())?)
            } else {
                None
            },
        };
        if crate::gdn::ARCHS.contains(&arch_name.as_str()) {
            crate::gdn::refuse_layer_formats(root, cfg, hf_quant, &shown.to_string())?;
            let patterns = exclude_patterns(quantisation_scope(root, cfg), hf_quant);
            spec.qwen35 = Some(crate::gdn::spec_from_config(root, cfg, layers, &patterns, &shown.to_string())?);
        }
        if family == Family::Dsv4 || spec.dsv41.is_some() {
            // The reference runs DeepSeek-V4's sparse attention on an fp8 KV cache whatever the
            // checkpoint declares, and its native checkpoints' fp4 routed experts as MXFP4 weights
            // with MXFP8 activations (unless the experts are NVFP4).
            spec.quant.kv = Dtype::Fp8;
            // (DeepSeek-V4.1 declares it in its quantization_config.)
            let declared = if spec.dsv41.is_some() {
                root.get("quantization_config").and_then(|q| q.get("expert_dtype"))
            } else {
                cfg.get("expert_dtype")
            };
            let fp4_experts = lower_str(declared).as_deref() == Some("fp4");
            if fp4_experts && spec.quant.moe != Dtype::Nvfp4 {
                spec.quant.moe = Dtype::W4a8Mxfp4Mxfp8;
            }
        }
        if HYBRID.contains(&arch_name.as_str()) {
            spec.hybrid = Some(crate::hybrid_moe::spec_from_config(&arch_name, root, cfg, &spec, &shown.to_string())?);
        }
        Ok(spec)
    }

    /// Whether the model has routed experts (a Gemma 4 may not).
    pub fn routed(&self) -> bool {
        self.family != Family::Dense && self.experts > 0
    }
}

/// The `hf_quant_config.json` that belongs to a model config: `<stem>_hf_quant_config.json`
/// beside a `<stem>_config.json` (the packages' `model_configs/` layout), or
/// `hf_quant_config.json` beside a `config.json`.
fn hf_quant_config(config: &Path) -> Result<Option<Value>> {
    let Some(name) = config.file_name().and_then(|n| n.to_str()) else { return Ok(None) };
    let candidate = match name.strip_suffix("_config.json") {
        Some(stem) => config.with_file_name(format!("{stem}_hf_quant_config.json")),
        None => config.with_file_name("hf_quant_config.json"),
    };
    if !candidate.is_file() {
        return Ok(None);
    }
    let text = servesim_config::read_config_text(&candidate)
        .map_err(|e| PerfError::config(format!("cannot read {}: {e}", candidate.display())))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| PerfError::config(format!("{} is not valid JSON: {e}", candidate.display())))
}

fn lower_str(v: Option<&Value>) -> Option<String> {
    v.and_then(Value::as_str).map(|s| s.trim().to_lowercase()).filter(|s| !s.is_empty())
}

/// Formats from the checkpoint's quantisation metadata, following the reference's
/// `_infer_quantization_fields` / `_infer_quant_modes_from_raw_config`: none → bf16 everywhere;
/// `fp8` with a weight block size → fp8_block GEMMs and experts; dynamic per-tensor `fp8` →
/// fp8; other per-tensor `fp8` → fp8_static GEMMs and fp8 experts; `mxfp4` → bf16 GEMMs with
/// w4a16_mxfp4 experts; `nvfp4` (ModelOpt) → nvfp4 GEMMs and experts; ModelOpt
/// `mixed_precision` → per layer (`mixed_precision`). An fp8 / fp8_block /
/// nvfp4 checkpoint (or an fp8 KV declaration) also runs attention in fp8 with an fp8 KV cache.
fn quantisation(cfg: &Value, hf_quant: Option<&Value>, shown: &str) -> Result<Quant> {
    let q = cfg.get("quantization_config").filter(|v| v.is_object());
    let hf = hf_quant.and_then(|v| v.get("quantization")).filter(|v| v.is_object());
    let field = |keys: &[&str]| -> Option<String> {
        keys.iter()
            .find_map(|k| lower_str(hf.and_then(|h| h.get(*k))))
            .or_else(|| keys.iter().find_map(|k| lower_str(q.and_then(|q| q.get(*k)))))
    };
    let mut algo = field(&["quant_algo", "quant_method", "quantization_method"]);
    match algo.as_deref() {
        Some("w4a16_mxfp4") => algo = Some("mxfp4".into()),
        Some("mixed-precision" | "mixedprecision") => algo = Some("mixed_precision".into()),
        _ => {}
    }
    if algo.as_deref() == Some("fp8")
        && q.and_then(|q| q.get("weight_block_size")).and_then(Value::as_array).is_some_and(|a| !a.is_empty())
    {
        algo = Some("fp8_block".into());
    }
    let mut kv_algo =
        field(&["kv_cache_quant_algo", "kv_cache_quant_method", "kv_cache_dtype"]).map(|k| match k.as_str() {
            "fp8" | "e4m3" | "e5m2" => "fp8".to_string(),
            "fp16" | "float16" | "bf16" | "bfloat16" => "bfloat16".to_string(),
            _ => k,
        });
    if kv_algo.is_none() {
        if let Some(scheme) = q.and_then(|q| q.get("kv_cache_scheme")).filter(|v| v.is_object()) {
            let ty = lower_str(scheme.get("type")).unwrap_or_default();
            let bits = scheme.get("num_bits").and_then(Value::as_u64);
            if ty.contains("fp8") {
                kv_algo = Some("fp8".into());
            } else if ty == "float" {
                kv_algo = match bits {
                    Some(b) if b <= 8 => Some("fp8".into()),
                    Some(b) if b >= 16 => Some("bfloat16".into()),
                    _ => None,
                };
            }
        }
    }
    let dynamic = q.and_then(|q| {
        match lower_str(q.get("activation_scheme")).as_deref() {
            Some("dynamic") => return Some(true),
            Some("static") => return Some(false),
            _ => {}
        }
        let groups = q.get("config_groups")?.as_object()?;
        let found: Vec<bool> = groups
            .values()
            .filter_map(Value::as_object)
            .flat_map(|g| ["input_activations", "weights"].into_iter().filter_map(move |k| g.get(k)))
            .filter_map(|item| item.get("dynamic").map(|d| d.as_bool().unwrap_or(false)))
            .collect();
        (!found.is_empty()).then(|| found.iter().any(|d| *d))
    });
    let bf = Dtype::Bfloat16;
    let (gemm, moe) = match algo.as_deref() {
        None => (bf, bf),
        Some("fp8") if dynamic == Some(true) => (Dtype::Fp8, Dtype::Fp8),
        // Per-tensor fp8 that does not declare dynamic activations is calibrated (static);
        // its experts have no static lane and run as fp8.
        Some("fp8") => (Dtype::Fp8Static, Dtype::Fp8),
        Some("fp8_block") => (Dtype::Fp8Block, Dtype::Fp8Block),
        Some("mxfp4") => (bf, Dtype::W4a16Mxfp4),
        Some("nvfp4") => (Dtype::Nvfp4, Dtype::Nvfp4),
        Some("compressed-tensors") => compressed_tensors(q, shown)?,
        Some("mixed_precision") => mixed_precision(q, hf, dynamic, shown)?,
        Some(other) => {
            return Err(PerfError::unsupported(format!(
                "{shown}: quantisation {other:?} is not modelled (supported: none, fp8, fp8_block, mxfp4, nvfp4, compressed-tensors, mixed_precision); set gemm_quant_mode / moe_quant_mode explicitly"
            )))
        }
    };
    let mut kv = match kv_algo.as_deref() {
        None | Some("bfloat16") | Some("none") => bf,
        Some("fp8") => Dtype::Fp8,
        Some(other) => {
            return Err(PerfError::unsupported(format!(
                "{shown}: KV cache quantisation {other:?} is not modelled (supported: fp8, bfloat16)"
            )))
        }
    };
    let mut fmha = bf;
    if kv_algo.as_deref() == Some("none") {
        fmha = bf;
    } else if matches!(algo.as_deref(), Some("fp8") | Some("fp8_block") | Some("nvfp4"))
        || kv_algo.as_deref() == Some("fp8")
    {
        fmha = Dtype::Fp8;
        kv = Dtype::Fp8;
    }
    let block = q
        .and_then(|q| q.get("weight_block_size"))
        .and_then(Value::as_array)
        .and_then(|a| a.first())
        .and_then(Value::as_u64)
        .filter(|b| *b > 0)
        .unwrap_or(128) as u32;
    let patterns = exclude_patterns(cfg, hf_quant);
    let excluded = Excluded::from_patterns(patterns.iter().map(String::as_str));
    Ok(Quant { gemm, moe, kv, fmha, block, excluded })
}

/// GEMM and expert formats of a ModelOpt `MIXED_PRECISION` checkpoint, which names a format per
/// layer (`quantized_layers`, in `hf_quant_config.json` and / or `quantization_config`) or per
/// config group (`config_groups`: a weight spec's `quant_algo`, else 8-bit float → fp8, or mxfp8
/// with 32-element groups, and 4-bit float → nvfp4). As the reference's
/// `_infer_mixed_precision_quant_modes` reads it, the layers split in two: routed experts (a name
/// with `.experts.`, ending in `.experts`, or naming `routing_expert`; never a shared expert) and
/// everything else, and each side takes one format by precedence —
///
/// ```text
/// GEMMs:   base quant_method fp8 (+ weight block → fp8_block, else per-tensor as plain fp8)
///          > mxfp8 → fp8_block > fp8 → fp8 (dynamic) / fp8_static > w4a16_nvfp4 > nvfp4
/// experts: w4a16_nvfp4 > nvfp4 > mxfp8 → fp8_block > fp8
/// ```
///
/// MXFP8 is priced as fp8_block (one byte per weight at the fp8 tensor-core rate; only the scale
/// granularity differs), as the reference approximates it. A side with no layer stays bf16, as
/// there. Where the reference silently falls back to bf16 — a side whose formats it has no mode
/// for, or a checkpoint naming no layer format at all — servesim refuses, naming the formats; a
/// w4a16_nvfp4 side is refused too (servesim has no weight-only NVFP4 timing).
fn mixed_precision(
    q: Option<&Value>,
    hf: Option<&Value>,
    dynamic: Option<bool>,
    shown: &str,
) -> Result<(Dtype, Dtype)> {
    use std::collections::BTreeSet;
    let normal = |v: Option<&Value>| -> Option<String> {
        let a = lower_str(v)?;
        Some(match a.as_str() {
            "e4m3" | "e5m2" => "fp8".to_string(),
            "fp4" => "nvfp4".to_string(),
            _ => a,
        })
    };
    let algo_of = |spec: &Value| -> Option<String> {
        ["quant_algo", "quantization_algo", "quant_method"].iter().find_map(|k| normal(spec.get(*k)))
    };
    let (mut gemm_algos, mut moe_algos) = (BTreeSet::new(), BTreeSet::new());
    let mut add = |target: &str, algo: String| {
        let t = target.to_lowercase();
        let routed = !t.contains("shared_expert")
            && (t.contains(".experts.") || t.ends_with(".experts") || t.contains("routing_expert"));
        if routed { &mut moe_algos } else { &mut gemm_algos }.insert(algo);
    };
    let mut layers = |section: Option<&Value>| {
        let Some(map) = section.and_then(|s| s.get("quantized_layers")).and_then(Value::as_object) else { return };
        for (target, meta) in map {
            let algo = if meta.is_object() { algo_of(meta) } else { normal(Some(meta)) };
            if let Some(a) = algo {
                add(target, a);
            }
        }
    };
    layers(hf);
    layers(q);
    for group in q.and_then(|q| q.get("config_groups")).and_then(Value::as_object).into_iter().flat_map(|g| g.values())
    {
        let Some(w) = group.get("weights").filter(|w| w.is_object()) else { continue };
        let ty = lower_str(w.get("type")).unwrap_or_default();
        let algo = algo_of(w).or_else(|| match w.get("num_bits").and_then(Value::as_u64) {
            Some(8) if ty.contains("float") && w.get("group_size").and_then(Value::as_u64) == Some(32) => {
                Some("mxfp8".into())
            }
            Some(8) if ty.contains("float") => Some("fp8".into()),
            Some(4) if ty.contains("float") => Some("nvfp4".into()),
            _ => None,
        });
        let Some(algo) = algo else { continue };
        for target in group.get("targets").and_then(Value::as_array).into_iter().flatten() {
            let t = target.as_str().map(str::to_string).unwrap_or_else(|| target.to_string());
            add(&t, algo.clone());
        }
    }
    let list = |set: &BTreeSet<String>| set.iter().cloned().collect::<Vec<_>>().join(", ");
    let refuse = |side: &str, set: &BTreeSet<String>, why: &str| {
        PerfError::unsupported(format!(
            "{shown}: MIXED_PRECISION {side} formats [{}] {why}; set gemm_quant_mode / moe_quant_mode explicitly",
            list(set)
        ))
    };
    let no_mode = "have no timing mode (modelled: mxfp8, fp8, nvfp4)";
    let weight_only = "include w4a16_nvfp4 (weight-only NVFP4), which servesim does not model";
    let has = |set: &BTreeSet<String>, a: &str| set.contains(a);
    // Some expert-only requantisations keep the base checkpoint's fp8 description for the rest.
    let base_fp8 = q.and_then(|q| lower_str(q.get("quant_method"))).as_deref() == Some("fp8");
    let blocked = q.and_then(|q| q.get("weight_block_size")).and_then(Value::as_array).is_some_and(|a| !a.is_empty());
    let per_tensor_fp8 = if dynamic == Some(true) { Dtype::Fp8 } else { Dtype::Fp8Static };
    if gemm_algos.is_empty() && moe_algos.is_empty() && !base_fp8 {
        return Err(PerfError::unsupported(format!(
            "{shown}: MIXED_PRECISION quantisation names no layer format (no quantized_layers or config_groups weight format); set gemm_quant_mode / moe_quant_mode explicitly"
        )));
    }
    let gemm = if base_fp8 && blocked {
        Dtype::Fp8Block
    } else if base_fp8 {
        per_tensor_fp8
    } else if has(&gemm_algos, "mxfp8") {
        Dtype::Fp8Block
    } else if has(&gemm_algos, "fp8") {
        per_tensor_fp8
    } else if has(&gemm_algos, "w4a16_nvfp4") {
        return Err(refuse("GEMM", &gemm_algos, weight_only));
    } else if has(&gemm_algos, "nvfp4") {
        Dtype::Nvfp4
    } else if gemm_algos.is_empty() {
        Dtype::Bfloat16
    } else {
        return Err(refuse("GEMM", &gemm_algos, no_mode));
    };
    let moe = if has(&moe_algos, "w4a16_nvfp4") {
        return Err(refuse("routed-expert", &moe_algos, weight_only));
    } else if has(&moe_algos, "nvfp4") {
        Dtype::Nvfp4
    } else if has(&moe_algos, "mxfp8") {
        Dtype::Fp8Block
    } else if has(&moe_algos, "fp8") {
        Dtype::Fp8
    } else if moe_algos.is_empty() {
        Dtype::Bfloat16
    } else {
        return Err(refuse("routed-expert", &moe_algos, no_mode));
    };
    Ok((gemm, moe))
}

/// The module patterns a checkpoint's quantisation config keeps unquantised
/// (`modules_to_not_convert`, `exclude_modules`, `ignore`; `hf_quant_config.json`'s too).
fn exclude_patterns(cfg: &Value, hf_quant: Option<&Value>) -> Vec<String> {
    let q = cfg.get("quantization_config").filter(|v| v.is_object());
    let hf = hf_quant.and_then(|v| v.get("quantization")).filter(|v| v.is_object());
    let mut patterns = Vec::new();
    for (section, keys) in
        [(q, &["modules_to_not_convert", "exclude_modules", "ignore"][..]), (hf, &["exclude_modules", "ignore"][..])]
    {
        for key in keys {
            let list = section.and_then(|s| s.get(*key)).and_then(Value::as_array);
            patterns.extend(list.into_iter().flatten().filter_map(Value::as_str).map(str::to_string));
        }
    }
    patterns
}

/// GEMM and expert formats of a compressed-tensors checkpoint, as the reference's
/// `parse_compressed_tensors_quant` reads it: the first config group's weight spec names the
/// format (4-bit int → int4_wo, 8-bit int → int8_wo, 8-bit float → fp8, or fp8_block when block
/// structured, 4-bit float → w4a16_mxfp4), and it applies to the GEMMs unless the `ignore` list
/// names the attention projections, to the routed experts unless it names experts (not shared
/// ones); what is ignored stays bf16. Weight-only int formats have no GEMM tables, and the
/// reference has no int8 expert or w4a16_mxfp4 GEMM mode: those are refused.
fn compressed_tensors(q: Option<&Value>, shown: &str) -> Result<(Dtype, Dtype)> {
    let bf = Dtype::Bfloat16;
    let groups = q.and_then(|q| q.get("config_groups")).and_then(Value::as_object);
    let base = groups.into_iter().flat_map(|g| g.values()).find_map(|group| {
        let w = group.get("weights")?;
        let bits = w.get("num_bits").and_then(Value::as_u64)?;
        let ty = lower_str(w.get("type")).unwrap_or_default();
        let blocked = lower_str(w.get("strategy")).as_deref() == Some("block")
            || w.get("block_structure").is_some_and(|b| !b.is_null() && b != &Value::Bool(false));
        match (bits, ty.contains("int"), ty.contains("float")) {
            (4, true, _) => Some("int4_wo"),
            (8, true, _) => Some("int8_wo"),
            (8, _, true) if blocked => Some("fp8_block"),
            (8, _, true) => Some("fp8"),
            (4, _, true) => Some("w4a16_mxfp4"),
            _ => None,
        }
    });
    let Some(base) = base else { return Ok((bf, bf)) };
    let (mut attention, mut experts) = (false, false);
    for p in q.and_then(|q| q.get("ignore")).and_then(Value::as_array).into_iter().flatten() {
        let p = p.as_str().map(str::to_lowercase).unwrap_or_else(|| p.to_string().to_lowercase());
        attention |= ["self_attn", "q_proj", "k_proj", "v_proj", "o_proj"].iter().any(|m| p.contains(m));
        experts |= p.contains("expert") && !p.contains("shared_expert");
    }
    let refuse = |what: &str| {
        PerfError::unsupported(format!(
            "{shown}: compressed-tensors {base} {what} are not modelled (the reference has no such mode or no tables); set gemm_quant_mode / moe_quant_mode explicitly"
        ))
    };
    let gemm = match (attention, base) {
        (true, _) => bf,
        (false, "fp8") => Dtype::Fp8,
        (false, "fp8_block") => Dtype::Fp8Block,
        _ => return Err(refuse("GEMMs")),
    };
    let moe = match (experts, base) {
        (true, _) => bf,
        (false, "int4_wo") => Dtype::Int4Wo,
        (false, "fp8") => Dtype::Fp8,
        (false, "fp8_block") => Dtype::Fp8Block,
        (false, "w4a16_mxfp4") => Dtype::W4a16Mxfp4,
        _ => return Err(refuse("experts")),
    };
    Ok((gemm, moe))
}

/// One operation of a phase's op list. `scale` multiplies its latency (layers, MTP).
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// Token embedding lookup: `bytes_per_token · x` through memory.
    Embedding { name: String, scale: f64, bytes_per_token: f64 },
    /// An element-wise op: `bytes_per_token · x` through memory.
    Elementwise { name: String, scale: f64, bytes_per_token: f64 },
    /// `x × k · k × n` matrix multiply; the logits GEMM sees one token per request.
    /// `fp8_input`: its input comes out of an op that can hand it over in FP8 (the attention
    /// output and the activated FFN), which a static-FP8 GEMM does not rescale.
    Gemm { name: String, scale: f64, n: u32, k: u32, dtype: Dtype, logits: bool, fp8_input: bool },
    ContextAttention {
        name: String,
        scale: f64,
        n: u32,
        n_kv: u32,
        head: u32,
        window: u32,
        kv: Dtype,
        fmha: Dtype,
        qk_norm: bool,
        /// Prefill context parallelism: the busiest rank's share of the attention (1: none).
        cp: u32,
        /// The fused rotary pass over Q and K is charged (false: NoPE layers).
        rope: bool,
    },
    GenerationAttention {
        name: String,
        scale: f64,
        n: u32,
        n_kv: u32,
        head: u32,
        window: u32,
        kv: Dtype,
        qk_norm: bool,
        /// Query tokens per request of a block-verify pass (1: plain decode). The step's token
        /// batch is `verify` times the requests, but the kernel reads each request's KV once
        /// for all of them: the table is read at the request batch, and the full block's math
        /// bounds it from below.
        verify: u32,
    },
    /// Custom all-reduce of `hidden` elements per token over `tp` GPUs.
    AllReduce { name: String, scale: f64, hidden: u32, tp: u32 },
    /// Pipeline hand-off of `hidden` bf16 elements per token.
    P2P { name: String, scale: f64, hidden: u32, pp: u32 },
    /// Prefill context parallelism's all-gather of every token's KV over the `gpus` CP ranks
    /// (`elements` half-precision elements per token; all tokens, not the rank's share).
    CpAllGather { name: String, scale: f64, elements: f64, gpus: u32 },
    /// Fused mixture-of-experts FFN.
    Moe(MoeOp),
    /// MoE token dispatch / combine communication.
    MoeDispatch(DispatchOp),
    /// Large-EP all-to-all dispatch / combine (`moe_a2a.rs`).
    MoeA2a(crate::moe_a2a::A2aOp),
    /// Large-EP expert compute (`moe_a2a.rs`).
    ExpertCompute(crate::moe_a2a::ExpertComputeOp),
    /// MLA attention: a fused module or a kernel table.
    Mla(MlaOp),
    /// MLA absorption BMM around the decode kernel.
    MlaBmm(MlaBmmOp),
    /// A DSA sparse-attention block.
    Dsa(crate::dsa::DsaOp),
    /// An MSA sparse-attention block.
    Msa(crate::msa::MsaOp),
    /// A DeepSeek-V4 compressed-attention block.
    Dsv4Attn(crate::dsv4::Dsv4AttnOp),
    /// A measured DeepSeek-V4.1 module (attention, mHC, Engram, projection; `dsv41.rs`).
    Dsv41(crate::dsv41::Dsv41Op),
    /// One half of DeepSeek-V4's mHC.
    Mhc(crate::dsv4::MhcOp),
    /// A Mamba2 kernel (Nemotron-H; `mamba2.rs`).
    Mamba2(crate::mamba2::Mamba2Op),
    /// A Qwen3.5 GDN kernel (`gdn.rs`).
    Gdn(crate::gdn::GdnOp),
    /// A Kimi-K3 KDA kernel (`kimi_k3.rs`).
    Kda(crate::kimi_k3::KdaOp),
    /// A GEMM timed by its roofline where its width is below the measured grid (`gdn.rs`).
    SmallGemm(crate::gdn::SmallGemmOp),
    /// An NCCL collective moving `elements` `dtype` elements per token over `gpus` GPUs (`kind`:
    /// all_gather, reduce_scatter, alltoall): decode context parallelism's merges (`dcp.rs`).
    Nccl { name: String, scale: f64, kind: &'static str, dtype: &'static str, elements: f64, gpus: u32 },
    /// An attention op over a KV striped by decode context parallelism (`dcp.rs`).
    Striped(crate::dcp::Striped),
    /// `primary`, or when its table lacks the data, the sum of `fallback`.
    Fallback { name: String, primary: Box<Op>, fallback: Vec<Op> },
    /// A wide-EP MLA attention module (`wideep_mla.rs`).
    WideEpMla(crate::wideep_mla::WideEpMlaOp),
    /// `op` on the attention tensor-parallel rank's share of the step's tokens (`x / tp`,
    /// floored; the batch unchanged): the reference's `scale_num_tokens` (`wideep_mla.rs`).
    TpShare { op: Box<Op>, tp: u32 },
    /// Two op chains on parallel streams: the slower chain's sum.
    Overlap { name: String, a: Vec<Op>, b: Vec<Op> },
    /// A speculative draft's op, run at its own width: the step's token batch (and token
    /// count) times `num / den`, floored, before `op`'s table is read (the reference's
    /// `TokenScale`; `eagle3.rs`).
    TokenScale { op: Box<Op>, num: u32, den: u32 },
}

impl Op {
    /// A plain (non-logits) GEMM: `x × k · k × n` per token, `scale` times.
    pub(crate) fn gemm(name: String, scale: f64, n: u32, k: u32, dtype: Dtype, fp8_input: bool) -> Op {
        Op::Gemm { name, scale, n, k, dtype, logits: false, fp8_input }
    }

    pub fn name(&self) -> &str {
        match self {
            Op::Embedding { name, .. }
            | Op::Elementwise { name, .. }
            | Op::Gemm { name, .. }
            | Op::ContextAttention { name, .. }
            | Op::GenerationAttention { name, .. }
            | Op::AllReduce { name, .. }
            | Op::P2P { name, .. }
            | Op::CpAllGather { name, .. }
            | Op::Nccl { name, .. } => name,
            Op::Striped(st) => st.op.name(),
            Op::Moe(m) => &m.name,
            Op::MoeDispatch(d) => &d.name,
            Op::MoeA2a(a) => &a.name,
            Op::ExpertCompute(e) => &e.moe.name,
            Op::Mla(m) => &m.name,
            Op::MlaBmm(b) => &b.name,
            Op::Dsa(d) => &d.name,
            Op::Msa(a) => &a.name,
            Op::Dsv4Attn(a) => &a.name,
            Op::Dsv41(a) => &a.name,
            Op::Mhc(a) => &a.name,
            Op::Mamba2(k) => &k.name,
            Op::Gdn(g) => &g.name,
            Op::Kda(k) => &k.name,
            Op::SmallGemm(g) => &g.name,
            Op::Fallback { name, .. } | Op::Overlap { name, .. } => name,
            Op::WideEpMla(w) => &w.name,
            Op::TokenScale { op, .. } | Op::TpShare { op, .. } => op.name(),
        }
    }

    /// The pipeline hand-off after each of `l.pp − 1` stages: `hidden` elements per token, `s`
    /// times per stage.
    pub(crate) fn pipeline_p2p(name: String, s: f64, hidden: u32, l: &Layout) -> Op {
        Op::P2P { name, scale: (l.pp.saturating_sub(1)) as f64 * s, hidden, pp: l.pp }
    }

    /// The op's name, to rename it (a draft's ops take the `draft_` prefix).
    pub(crate) fn name_mut(&mut self) -> &mut String {
        match self {
            Op::Embedding { name, .. }
            | Op::Elementwise { name, .. }
            | Op::Gemm { name, .. }
            | Op::ContextAttention { name, .. }
            | Op::GenerationAttention { name, .. }
            | Op::AllReduce { name, .. }
            | Op::P2P { name, .. }
            | Op::CpAllGather { name, .. }
            | Op::Nccl { name, .. } => name,
            Op::Striped(st) => st.op.name_mut(),
            Op::Moe(m) => &mut m.name,
            Op::MoeDispatch(d) => &mut d.name,
            Op::MoeA2a(a) => &mut a.name,
            Op::ExpertCompute(e) => &mut e.moe.name,
            Op::Mla(m) => &mut m.name,
            Op::MlaBmm(b) => &mut b.name,
            Op::Dsa(d) => &mut d.name,
            Op::Msa(a) => &mut a.name,
            Op::Dsv4Attn(a) => &mut a.name,
            Op::Dsv41(a) => &mut a.name,
            Op::Mhc(a) => &mut a.name,
            Op::Mamba2(k) => &mut k.name,
            Op::Gdn(g) => &mut g.name,
            Op::Kda(k) => &mut k.name,
            Op::SmallGemm(g) => &mut g.name,
            Op::Fallback { name, .. } | Op::Overlap { name, .. } => name,
            Op::WideEpMla(w) => &mut w.name,
            Op::TokenScale { op, .. } | Op::TpShare { op, .. } => op.name_mut(),
        }
    }

    /// Whether a mixed forward pass times this op apart at the prefill shape: the reference
    /// picks its context attention out by name (`context_attention`), whatever op kind
    /// carries it (a plain attention table, an MLA kernel, a DSA or MSA block). Attention
    /// wrapped in a block under another name (`context_mla_block`) rides with the shared
    /// token pass.
    pub fn is_context_attention(&self) -> bool {
        self.name() == "context_attention"
    }

    /// Whether a mixed forward pass times this op at the decode shape (`generation_attention`,
    /// by name as for [`Op::is_context_attention`]); every other generation op is left out.
    pub fn is_generation_attention(&self) -> bool {
        self.name() == "generation_attention"
    }

    /// Whether this op is a speculative draft's (named `draft_…`, as the reference names
    /// them): a mixed pass times it with its phase's attention, not in the shared pass.
    pub fn is_draft(&self) -> bool {
        self.name().starts_with("draft_")
    }
}

/// Parallel layout and formats the op list is built for.
#[derive(Clone, Debug)]
pub struct Layout {
    pub tp: u32,
    pub pp: u32,
    /// Prefill context parallelism (`cp_size`): the prompt's tokens split over `cp` ranks.
    pub cp: u32,
    /// Decode context parallelism (`dcp`): the KV striped by position over `dcp` of the
    /// tensor-parallel ranks (`dcp.rs`; 1: none).
    pub dcp: u32,
    pub attention_dp: u32,
    pub moe_tp: u32,
    pub moe_ep: u32,
    /// MTP depth: draft layers folded into the generation ops, `nextn + 1` tokens per request.
    pub nextn: u32,
    /// Prompt-lookup (ngram) draft tokens: no draft network, the target verifies `ngram + 1`
    /// tokens per request (0: none; exclusive with `nextn`).
    pub ngram: u32,
    pub gemm: Dtype,
    /// The shared experts' GEMMs (MLA models): bf16 where the checkpoint excludes them and
    /// `gemm` was not set explicitly, else `gemm`.
    pub shared_gemm: Dtype,
    pub kv: Dtype,
    pub fmha: Dtype,
    pub moe: Dtype,
    pub backend: String,
    /// The large-EP all-to-all backends per phase (`moe_a2a.rs`); default: the fused block.
    pub moe_comm: crate::moe_a2a::MoeComm,
}

impl Layout {
    /// Tokens one decode step computes per request: the verified token and the drafts.
    pub fn verify_width(&self) -> u32 {
        self.nextn + self.ngram + 1
    }
}

/// `(context ops, generation ops)` of a model, as the reference's `LLAMAModel` / `MOEModel` lay
/// them out. MoE models differ from dense ones in three places: the FFN is the MoE block
/// (router GEMM, dispatch, experts, combine — the dispatch ops carry the tensor-parallel
/// reduction, so there is no per-layer all-reduce), the context phase has no logits GEMM, and
/// gpt-oss splits attention into sliding-window (128) and global halves.
pub fn build_ops(m: &ModelSpec, l: &Layout) -> Result<(Vec<Op>, Vec<Op>)> {
    let (tp, h) = (l.tp, m.hidden);
    // (Heads are validated positive: fewer heads than GPUs is what cannot be split.)
    if m.heads < tp {
        return Err(PerfError::unsupported(format!(
            "{}: {} attention heads cannot be split over tp={tp}",
            m.name, m.heads
        )));
    }
    if m.dsa.is_some() {
        return crate::dsa::build_dsa_ops(m, l);
    }
    if m.gemma4.is_some() {
        return crate::gemma4::build_gemma4_ops(m, l);
    }
    if m.family == Family::Msa {
        return crate::msa::build_msa_ops(m, l);
    }
    if m.family == Family::Dsv4 {
        return crate::dsv4::build_dsv4_ops(m, l);
    }
    if m.dsv41.is_some() {
        return crate::dsv41::build_dsv41_ops(m, l);
    }
    if let Some(hy) = &m.hybrid {
        return crate::hybrid_moe::build_hybrid_ops(m, hy, l);
    }
    if let Some(nh) = &m.nemotron_h {
        return crate::mamba2::build_nemotron_h_ops(m, nh, l);
    }
    if let Some(q) = &m.qwen35 {
        return crate::gdn::build_qwen35_ops(m, q, l);
    }
    if let Some(k) = &m.kimi_k3 {
        return crate::kimi_k3::build_ops(m, k, l);
    }
    if let Some(g) = &m.glimmer {
        return crate::glimmer::build_glimmer_ops(m, g, l);
    }
    if let Some(dims) = m.mla {
        if l.ngram > 0 {
            // The reference keeps token-basis verify pricing on MLA modules (no width channel).
            return Err(PerfError::unsupported(format!(
                "{}: ngram verification of multi-head latent attention is not modelled",
                m.name
            )));
        }
        return Ok(build_mla_ops(m, &dims, l));
    }
    let layers = m.layers as f64;
    let mtp = if l.nextn == 0 { 1.0 } else { (l.nextn as f64 + layers) / layers };
    let kv_per_gpu = m.kv_heads.div_ceil(tp);
    let heads = m.heads / tp;
    let qkv_n = m.heads * m.head_dim / tp + m.head_dim * kv_per_gpu * 2;
    let proj_k = m.heads * m.head_dim / tp;
    let act = 2.0; // bf16 activations
    let moe = m.family == Family::Moe;
    // gpt-oss: half the layers attend within a window, half globally.
    let attn_split = if m.sliding_window > 0 { 2.0 } else { 1.0 };
    let attention = |ctx: bool, scale: f64, window: u32, name: String| {
        let heads = AttentionHeads { n: heads, n_kv: kv_per_gpu, head: m.head_dim, window, qk_norm: m.qk_norm };
        attention_op(ctx, name, scale, heads, l)
    };
    let mut out = (Vec::new(), Vec::new());
    for (phase, list) in [("context", &mut out.0), ("generation", &mut out.1)] {
        let ctx = phase == "context";
        let s = if ctx { 1.0 } else { mtp };
        let nm = |x: &str| format!("{phase}_{x}");
        if m.sliding_window > 0 {
            list.push(attention(ctx, layers / attn_split * s, m.sliding_window, nm("attention")));
        }
        list.push(Op::Embedding { name: nm("embedding"), scale: s, bytes_per_token: h as f64 * 2.0 });
        list.push(Op::Elementwise {
            name: nm("add_norm_1"),
            scale: layers * s,
            bytes_per_token: (2 * h + 2 * h) as f64 * act,
        });
        list.push(Op::Gemm {
            name: nm("qkv_gemm"),
            scale: layers * s,
            n: qkv_n,
            k: h,
            dtype: l.gemm,
            logits: false,
            fp8_input: false,
        });
        list.push(attention(ctx, layers / attn_split * s, 0, nm("attention")));
        if ctx && l.cp > 1 {
            // Every CP rank gathers the whole prompt's KV of each layer (SGLang's all-gather
            // variant), one layer's K and V per token in half-precision elements.
            let elements = 2.0 * kv_per_gpu as f64 * m.head_dim as f64 * l.kv.bytes() / 2.0;
            list.push(Op::CpAllGather { name: nm("cp_all_gather"), scale: layers, elements, gpus: l.cp });
        }
        list.push(Op::Gemm {
            name: nm("proj_gemm"),
            scale: layers * s,
            n: h,
            k: proj_k,
            dtype: l.gemm,
            logits: false,
            fp8_input: true,
        });
        list.push(Op::Elementwise {
            name: nm("add_norm_2"),
            scale: layers * s,
            bytes_per_token: (2 * h + 2 * h) as f64 * act,
        });
        if moe && ctx && l.moe_comm.is_large_ep() {
            list.extend(crate::moe_a2a::large_ep_block(phase, m, l, layers * s));
        } else if moe {
            push_moe_ops(list, m, l, ctx, layers * s, DISTRIBUTION);
        } else {
            list.push(Op::Gemm {
                name: nm("gate_ffn1_gemm"),
                scale: layers * s,
                n: 2 * m.inter / tp,
                k: h,
                dtype: l.gemm,
                logits: false,
                fp8_input: false,
            });
            list.push(Op::Elementwise {
                name: nm("act_gate"),
                scale: layers * s,
                bytes_per_token: (2 * m.inter / tp + m.inter / tp) as f64 * act,
            });
            list.push(Op::Gemm {
                name: nm("ffn2_gemm"),
                scale: layers * s,
                n: h,
                k: m.inter / tp,
                dtype: l.gemm,
                logits: false,
                fp8_input: true,
            });
        }
        if !(moe && ctx) {
            list.push(logits_gemm(nm("logits_gemm"), s, m, tp));
        }
        list.push(Op::AllReduce { name: nm("embedding_ar"), scale: s, hidden: h, tp });
        if !moe {
            list.push(Op::AllReduce { name: nm("ar_1"), scale: layers * s, hidden: h, tp });
            list.push(Op::AllReduce { name: nm("ar_2"), scale: layers * s, hidden: h, tp });
        }
        list.push(Op::pipeline_p2p(nm("p2p"), s, h, l));
    }
    Ok(out)
}

/// The attention heads one GPU computes, and the window they attend within (0: global).
#[derive(Clone, Copy, Debug)]
pub(crate) struct AttentionHeads {
    pub n: u32,
    pub n_kv: u32,
    pub head: u32,
    pub window: u32,
    pub qk_norm: bool,
}

/// A phase's attention op: context attention (prefill, context-parallel as the layout says) or
/// generation attention (decode, verifying the layout's n-gram drafts).
pub(crate) fn attention_op(ctx: bool, name: String, scale: f64, h: AttentionHeads, l: &Layout) -> Op {
    let AttentionHeads { n, n_kv, head, window, qk_norm } = h;
    if ctx {
        Op::ContextAttention {
            name,
            scale,
            n,
            n_kv,
            head,
            window,
            kv: l.kv,
            fmha: l.fmha,
            qk_norm,
            cp: l.cp,
            rope: true,
        }
    } else {
        Op::GenerationAttention { name, scale, n, n_kv, head, window, kv: l.kv, qk_norm, verify: l.ngram + 1 }
    }
}

/// Router GEMM, dispatch, experts and combine of one phase (the reference's fused MoE block),
/// the experts at routing skew `distribution`.
/// The logits GEMM: one token per request, the vocabulary split over tensor parallelism, in
/// bf16 whatever the checkpoint.
pub(crate) fn logits_gemm(name: String, scale: f64, m: &ModelSpec, tp: u32) -> Op {
    Op::Gemm { name, scale, n: m.vocab / tp, k: m.hidden, dtype: Dtype::Bfloat16, logits: true, fp8_input: false }
}

/// Shared experts beside the routed ones (DeepSeek-style MoE): one after the other in context,
/// overlapped (`moe_overlap`) in generation.
pub(crate) fn push_shared_beside_routed(list: &mut Vec<Op>, ctx: bool, phase: &str, shared: Vec<Op>, routed: Vec<Op>) {
    if ctx {
        list.extend(shared);
        list.extend(routed);
    } else {
        list.push(Op::Overlap { name: format!("{phase}_moe_overlap"), a: routed, b: shared });
    }
}

pub(crate) fn push_moe_ops(list: &mut Vec<Op>, m: &ModelSpec, l: &Layout, ctx: bool, scale: f64, distribution: &str) {
    let phase = if ctx { "context" } else { "generation" };
    let mut block = moe_block(phase, m, l, scale, distribution, true);
    if ctx && l.cp > 1 {
        for op in &mut block {
            if let Op::MoeDispatch(d) = op {
                *d = d.clone().behind_cp(l.cp);
            }
        }
    }
    list.extend(block);
}

/// The routed-expert chain under names starting `prefix`: the router GEMM (when `router`),
/// dispatch, experts at routing skew `distribution`, combine.
pub(crate) fn moe_block(
    prefix: &str,
    m: &ModelSpec,
    l: &Layout,
    scale: f64,
    distribution: &str,
    router: bool,
) -> Vec<Op> {
    let phase = prefix;
    let h = m.hidden;
    let mut list = Vec::new();
    if router {
        list.push(Op::Gemm {
            name: format!("{phase}_router_gemm"),
            scale,
            n: m.experts,
            k: h,
            dtype: Dtype::Bfloat16,
            logits: false,
            fp8_input: false,
        });
    }
    let dispatch = |pre: bool| {
        let name = format!("{phase}_moe_{}_dispatch", if pre { "pre" } else { "post" });
        Op::MoeDispatch(DispatchOp::at(name, scale, h, l, pre))
    };
    list.push(dispatch(true));
    list.push(Op::Moe(MoeOp::routed(format!("{phase}_moe"), scale, h, (m, l), distribution, true)));
    list.push(dispatch(false));
    list
}

/// The heads per GPU the MLA kernel tables are asked at: DeepSeek-V3's 128 split over tp, for
/// every model of the family (the tables' head-axis convention).
const MLA_KERNEL_HEADS: u32 = 128;

/// vLLM's plain attention in place of an MLA core (the granular fallback of its MLA module
/// lane): the model's heads and KV heads on this GPU, each `v_head_dim` wide.
pub(crate) fn mla_stand_in_attention(
    name: String,
    scale: f64,
    ctx: bool,
    (m, d): (&ModelSpec, &MlaDims),
    l: &Layout,
) -> Op {
    let (n, n_kv, head) = (m.heads / l.tp, m.kv_heads / l.tp, d.v_head_dim);
    if ctx {
        Op::ContextAttention {
            name,
            scale,
            n,
            n_kv,
            head,
            window: 0,
            kv: l.kv,
            fmha: l.fmha,
            qk_norm: false,
            rope: true,
            cp: 1,
        }
    } else {
        Op::GenerationAttention { name, scale, n, n_kv, head, window: 0, kv: l.kv, qk_norm: false, verify: 1 }
    }
}

/// Prefill context parallelism of an MLA model: every layer all-gathers the whole prompt's
/// latent KV, in half-precision elements.
pub(crate) fn mla_cp_all_gather(name: String, layers: f64, d: &MlaDims, l: &Layout) -> Op {
    let latent = (d.kv_lora_rank + d.qk_rope_head_dim) as f64;
    Op::CpAllGather { name, scale: layers, elements: latent * l.kv.bytes() / 2.0, gpus: l.cp }
}

/// `(context ops, generation ops)` of an MLA model, as the reference's `DeepSeekModel` lays them
/// out for the fused (small-EP) MoE path:
///
/// ```text
/// embedding, add_norm_1, mla_block, add_norm_2,
/// shared expert (gate_up GEMM, act, ffn2 GEMM), router GEMM, dispatch, experts, combine,
/// logits GEMM, [vLLM: tensor-parallel all-reduce, 2 per layer], p2p
/// ```
///
/// The generation phase runs the shared expert beside the routed chain (an overlap: the slower
/// of the two). `mla_block` is the fused attention module when the backend's module table has
/// it, otherwise the granular chain: fused `q_a + kv_a` down-projection, `q_b` up-projection,
/// then on vLLM plain attention on `v_head_dim` heads (context also `kv_b`), elsewhere the MLA
/// kernel (decode between the absorption BMMs), and the output projection. Every layer is
/// timed as a MoE layer (the dense first layers only change resident weights). MTP scales the
/// generation ops by `(L + nextn) / L`.
fn build_mla_ops(m: &ModelSpec, d: &MlaDims, l: &Layout) -> (Vec<Op>, Vec<Op>) {
    let (tp, h) = (l.tp, m.hidden);
    let layers = m.layers as f64;
    let mtp = if l.nextn == 0 { 1.0 } else { (l.nextn as f64 + layers) / layers };
    let vllm = l.backend == "vllm";
    // Projections the checkpoint keeps unquantised run in bf16; the fused q_a + kv_a
    // down-projection only when both are.
    let ex = m.quant.excluded;
    let keep = |excluded: bool| if excluded { Dtype::Bfloat16 } else { l.gemm };
    let (q_gemm, kv_gemm, o_gemm) = (keep(ex.q), keep(ex.kv), keep(ex.o));
    let down_gemm = keep(ex.q && ex.kv);
    if l.moe_comm.is_large_ep() && l.backend == "sglang" {
        return crate::wideep_mla::mla_ops(m, l, down_gemm, &l.moe_comm.mla_backend);
    }
    // The fused module's table is keyed by one GEMM format: a checkpoint mixing formats
    // across its projections has no such row and always runs the granular chain.
    let module_gemm = (q_gemm == kv_gemm && kv_gemm == o_gemm).then_some(o_gemm);
    // The decode BMMs follow the kv projection's format: fp8 when it is quantised.
    let bmm = if kv_gemm == Dtype::Bfloat16 { Dtype::Bfloat16 } else { Dtype::Fp8 };
    let act = 2.0;
    let mut out = (Vec::new(), Vec::new());
    for (ctx, list) in [(true, &mut out.0), (false, &mut out.1)] {
        let phase = if ctx { "context" } else { "generation" };
        let nm = |x: &str| format!("{phase}_{x}");
        let s = if ctx { 1.0 } else { mtp };
        let ls = layers * s;
        // The reference's DeepSeek graph hands no GEMM an FP8 input.
        let gemm =
            |name: &str, n: u32, k: u32, dtype: Dtype| Op::gemm(format!("{phase}_{name}"), ls, n, k, dtype, false);
        let mut granular = vec![
            gemm("downscale_gemm", d.q_lora_rank + d.kv_lora_rank + d.qk_rope_head_dim, h, down_gemm),
            gemm("q_b_proj_gemm", m.heads * (d.qk_nope_head_dim + d.qk_rope_head_dim) / tp, d.q_lora_rank, q_gemm),
        ];
        if ctx {
            granular.push(gemm(
                "kv_b_proj_gemm",
                m.heads * (d.qk_nope_head_dim + d.v_head_dim) / tp,
                d.kv_lora_rank,
                kv_gemm,
            ));
        }
        let kernel = |kind: MlaKind| {
            Op::Mla(MlaOp {
                name: nm("attention"),
                scale: ls,
                kind,
                heads: MLA_KERNEL_HEADS / tp,
                kv: l.kv,
                fmha: l.fmha,
                gemm: l.gemm,
                native_heads: m.heads,
                cp: if ctx { l.cp } else { 1 },
            })
        };
        let bmm_op = |pre: bool| {
            Op::MlaBmm(MlaBmmOp {
                name: nm(if pre { "bmm_pre" } else { "bmm_post" }),
                scale: ls,
                heads: m.heads / tp,
                dtype: bmm,
                pre,
            })
        };
        match (vllm, ctx) {
            (true, _) => granular.push(mla_stand_in_attention(nm("attention"), ls, ctx, (m, d), l)),
            (false, true) => granular.push(kernel(MlaKind::Context)),
            (false, false) => granular.extend([bmm_op(true), kernel(MlaKind::Generation), bmm_op(false)]),
        }
        granular.push(gemm("proj_gemm", h, m.heads * d.v_head_dim / tp, o_gemm));
        let add_norm =
            |name: &str| Op::Elementwise { name: nm(name), scale: ls, bytes_per_token: (2 * h + 2 * h) as f64 * act };
        list.push(Op::Embedding { name: nm("embedding"), scale: s, bytes_per_token: h as f64 * 2.0 });
        list.push(add_norm("add_norm_1"));
        match module_gemm {
            Some(gemm) => {
                // Prefill context parallelism: the module is timed at the whole prompt, its
                // layers shared by the CP ranks.
                let module = Op::Mla(MlaOp {
                    name: nm("mla_module"),
                    scale: if ctx { ls / l.cp.max(1) as f64 } else { ls },
                    kind: if ctx { MlaKind::ContextModule } else { MlaKind::GenerationModule },
                    heads: m.heads / tp,
                    kv: l.kv,
                    fmha: l.fmha,
                    gemm,
                    native_heads: m.heads,
                    cp: 1,
                });
                list.push(Op::Fallback { name: nm("mla_block"), primary: Box::new(module), fallback: granular });
            }
            None => list.extend(granular),
        }
        if ctx && l.cp > 1 {
            list.push(mla_cp_all_gather(nm("cp_all_gather"), layers, d, l));
        }
        list.push(add_norm("add_norm_2"));
        let inter = m.moe_inter / tp;
        let shared = vec![
            gemm("shared_gate_up_gemm", 2 * m.moe_inter / tp, h, l.shared_gemm),
            Op::Elementwise {
                name: nm("shared_act_gate"),
                scale: ls,
                bytes_per_token: (2 * m.moe_inter / tp + inter) as f64 * act,
            },
            gemm("shared_ffn2_gemm", h, inter, l.shared_gemm),
        ];
        let mut routed = Vec::new();
        push_moe_ops(&mut routed, m, l, ctx, ls, MLA_DISTRIBUTION);
        if !ctx && l.cp > 1 {
            // A decode step's attention is replicated over the CP ranks: the dispatch moves
            // nothing, the combine all-reduces the experts' partial outputs.
            for op in &mut routed {
                if let Op::MoeDispatch(d) = op {
                    *d = d.clone().behind_replicated_cp(l.cp);
                }
            }
        }
        push_shared_beside_routed(list, ctx, phase, shared, routed);
        list.push(logits_gemm(nm("logits_gemm"), s, m, tp));
        if vllm {
            list.push(Op::AllReduce { name: nm("tp_allreduce"), scale: 2.0 * layers * s, hidden: h, tp });
        }
        list.push(Op::pipeline_p2p(nm("p2p"), s, h, l));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A model path naming a huge file (sparse here: 65 MiB of holes) is refused, not read whole;
    /// the Infinity / NaN literals of HF configs are read.
    #[test]
    fn model_configs_are_read_bounded() {
        let dir = std::env::temp_dir().join(format!("servesim-perf-model-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let huge = dir.join("huge_config.json");
        std::fs::File::create(&huge).unwrap().set_len((64 << 20) + 1).unwrap();
        let e = ModelSpec::load(huge.to_str().unwrap(), &[]).unwrap_err().message;
        assert!(e.contains("larger than 67108864 bytes (64 MiB)"), "{e}");
        let odd = dir.join("odd_config.json");
        std::fs::write(&odd, r#"{"rope_scaling": {"factor": Infinity, "low": -Infinity, "beta": NaN}}"#).unwrap();
        let v = read_model_config(&odd).unwrap();
        assert_eq!(v["rope_scaling"], json!({"factor": 1e308, "low": -1e308, "beta": null}));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A tiny DeepSeek-V3-shaped config: 4 layers, 16 heads, hidden 256, 8 routed experts.
    fn tiny_mla_config() -> Value {
        json!({
            "architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 256, "num_attention_heads": 16,
            "num_key_value_heads": 16, "intermediate_size": 512, "moe_intermediate_size": 64,
            "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
            "num_hidden_layers": 4, "vocab_size": 1000, "q_lora_rank": 96, "kv_lora_rank": 32,
            "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "torch_dtype": "bfloat16",
            "quantization_config": {"activation_scheme": "dynamic", "quant_method": "fp8", "weight_block_size": [128, 128]}
        })
    }

    fn tiny_mla() -> ModelSpec {
        ModelSpec::from_config("toy/mla", Path::new("toy.json"), &tiny_mla_config()).unwrap()
    }

    fn layout(backend: &str, nextn: u32) -> Layout {
        Layout {
            tp: 4,
            pp: 1,
            cp: 1,
            dcp: 1,
            attention_dp: 1,
            moe_tp: 1,
            moe_ep: 4,
            nextn,
            ngram: 0,
            gemm: Dtype::Fp8Block,
            shared_gemm: Dtype::Fp8Block,
            kv: Dtype::Fp8,
            fmha: Dtype::Bfloat16,
            moe: Dtype::Fp8Block,
            backend: backend.into(),
            moe_comm: Default::default(),
        }
    }

    fn names(ops: &[Op]) -> Vec<&str> {
        ops.iter().map(Op::name).collect()
    }

    fn find<'a>(ops: &'a [Op], name: &str) -> &'a Op {
        ops.iter().find(|o| o.name() == name).unwrap_or_else(|| panic!("no op {name}"))
    }

    #[test]
    fn mla_spec_from_config() {
        let m = tiny_mla();
        assert_eq!(m.family, Family::Mla);
        let d = m.mla.unwrap();
        assert_eq!(
            (d.q_lora_rank, d.kv_lora_rank, d.qk_nope_head_dim, d.qk_rope_head_dim, d.v_head_dim),
            (96, 32, 16, 8, 16)
        );
        assert_eq!((m.experts, m.topk, m.moe_inter, m.shared_experts, m.dense_layers), (8, 2, 64, 1, 1));
        assert_eq!((m.quant.gemm, m.quant.moe, m.quant.kv), (Dtype::Fp8Block, Dtype::Fp8Block, Dtype::Fp8));
    }

    #[test]
    fn mla_op_list_sglang() {
        let (ctx, gen) = build_ops(&tiny_mla(), &layout("sglang", 0)).unwrap();
        assert_eq!(
            names(&ctx),
            [
                "context_embedding",
                "context_add_norm_1",
                "context_mla_block",
                "context_add_norm_2",
                "context_shared_gate_up_gemm",
                "context_shared_act_gate",
                "context_shared_ffn2_gemm",
                "context_router_gemm",
                "context_moe_pre_dispatch",
                "context_moe",
                "context_moe_post_dispatch",
                "context_logits_gemm",
                "context_p2p"
            ]
        );
        assert_eq!(
            names(&gen),
            [
                "generation_embedding",
                "generation_add_norm_1",
                "generation_mla_block",
                "generation_add_norm_2",
                "generation_moe_overlap",
                "generation_logits_gemm",
                "generation_p2p"
            ]
        );
        // The module first (16 heads / tp 4, asked as the model's 16-head family); the granular
        // chain after it, its kernel at DeepSeek-V3's 128 heads / tp.
        let Op::Fallback { primary, fallback, .. } = find(&ctx, "context_mla_block") else { panic!() };
        let Op::Mla(module) = primary.as_ref() else { panic!() };
        assert_eq!(
            (module.kind, module.heads, module.native_heads, module.scale, module.gemm),
            (MlaKind::ContextModule, 4, 16, 4.0, Dtype::Fp8Block)
        );
        assert_eq!(
            names(fallback),
            [
                "context_downscale_gemm",
                "context_q_b_proj_gemm",
                "context_kv_b_proj_gemm",
                "context_attention",
                "context_proj_gemm"
            ]
        );
        let gemm_nk = |op: &Op| match op {
            Op::Gemm { n, k, dtype, .. } => (*n, *k, *dtype),
            _ => panic!("{op:?}"),
        };
        let f8 = Dtype::Fp8Block;
        assert_eq!(gemm_nk(&fallback[0]), (96 + 32 + 8, 256, f8));
        assert_eq!(gemm_nk(&fallback[1]), (16 * 24 / 4, 96, f8));
        assert_eq!(gemm_nk(&fallback[2]), (16 * 32 / 4, 32, f8));
        assert!(matches!(&fallback[3], Op::Mla(MlaOp { kind: MlaKind::Context, heads: 32, .. })));
        assert_eq!(gemm_nk(&fallback[4]), (256, 16 * 16 / 4, f8));
        // Decode: BMM pre, kernel, BMM post (fp8 BMMs under quantised GEMMs).
        let Op::Fallback { fallback, .. } = find(&gen, "generation_mla_block") else { panic!() };
        assert_eq!(
            names(fallback),
            [
                "generation_downscale_gemm",
                "generation_q_b_proj_gemm",
                "generation_bmm_pre",
                "generation_attention",
                "generation_bmm_post",
                "generation_proj_gemm"
            ]
        );
        assert!(matches!(&fallback[2], Op::MlaBmm(MlaBmmOp { heads: 4, dtype: Dtype::Fp8, pre: true, .. })));
        // Shared expert beside the routed chain in decode, at the DeepSeek routing skew.
        let Op::Overlap { a, b, .. } = find(&gen, "generation_moe_overlap") else { panic!() };
        assert_eq!(
            names(a),
            ["generation_router_gemm", "generation_moe_pre_dispatch", "generation_moe", "generation_moe_post_dispatch"]
        );
        assert_eq!(
            names(b),
            ["generation_shared_gate_up_gemm", "generation_shared_act_gate", "generation_shared_ffn2_gemm"]
        );
        let Op::Moe(moe) = &a[2] else { panic!() };
        assert_eq!((moe.distribution.as_str(), moe.inter, moe.moe_ep), ("power_law_1.01", 64, 4));
        assert_eq!(gemm_nk(&b[0]), (2 * 64 / 4, 256, f8));
    }

    #[test]
    fn mla_op_list_vllm_and_mtp() {
        let (ctx, gen) = build_ops(&tiny_mla(), &layout("vllm", 1)).unwrap();
        // vLLM: plain attention on v_head_dim heads in the fallback, and two tensor-parallel
        // all-reduces per layer.
        let Op::Fallback { fallback, .. } = find(&ctx, "context_mla_block") else { panic!() };
        assert!(matches!(&fallback[3], Op::ContextAttention { n: 4, n_kv: 4, head: 16, .. }));
        let Op::Fallback { fallback, .. } = find(&gen, "generation_mla_block") else { panic!() };
        assert_eq!(
            names(fallback),
            ["generation_downscale_gemm", "generation_q_b_proj_gemm", "generation_attention", "generation_proj_gemm"]
        );
        assert!(
            matches!(find(&ctx, "context_tp_allreduce"), Op::AllReduce { scale, hidden: 256, tp: 4, .. } if *scale == 8.0)
        );
        // MTP: generation layers scale by (L + nextn) / L = 5 / 4, the context phase does not.
        assert!(matches!(find(&gen, "generation_tp_allreduce"), Op::AllReduce { scale, .. } if *scale == 10.0));
        assert!(matches!(find(&gen, "generation_add_norm_1"), Op::Elementwise { scale, .. } if *scale == 5.0));
        assert!(matches!(find(&gen, "generation_logits_gemm"), Op::Gemm { scale, logits: true, .. } if *scale == 1.25));
        assert!(matches!(find(&ctx, "context_add_norm_1"), Op::Elementwise { scale, .. } if *scale == 4.0));
    }

    fn quant_of(qc: serde_json::Value, hf: Option<serde_json::Value>) -> Quant {
        quantisation(&json!({ "quantization_config": qc }), hf.as_ref(), "toy.json").unwrap()
    }

    #[test]
    fn checkpoint_formats() {
        // ModelOpt static per-tensor FP8 (no dynamic activations): fp8_static GEMMs, fp8 experts.
        let q = quant_of(
            json!({"quant_algo": "FP8", "config_groups": {"group_0": {"input_activations": {"dynamic": false},
                   "weights": {"dynamic": false}}}, "ignore": ["lm_head"]}),
            None,
        );
        assert_eq!((q.gemm, q.moe, q.kv, q.fmha), (Dtype::Fp8Static, Dtype::Fp8, Dtype::Fp8, Dtype::Fp8));
        // Dynamic per-tensor FP8 stays fp8.
        let q = quant_of(json!({"quant_method": "fp8", "activation_scheme": "dynamic"}), None);
        assert_eq!(q.gemm, Dtype::Fp8);
        // NVFP4 from the hf_quant_config.json beside the config; fp8 attention and KV.
        let hf = json!({"quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8",
                        "exclude_modules": ["model.layers.0.mlp.gate", "lm_head"]}});
        let q = quant_of(json!(null), Some(hf));
        assert_eq!((q.gemm, q.moe, q.kv, q.fmha), (Dtype::Nvfp4, Dtype::Nvfp4, Dtype::Fp8, Dtype::Fp8));
        assert_eq!(q.excluded, Excluded::default());
        assert_eq!(Dtype::Nvfp4.bytes(), 0.5625);
    }

    /// ModelOpt MIXED_PRECISION: per-layer formats split into routed experts and the rest.
    #[test]
    fn mixed_precision_formats() {
        let try_quant = |qc: Value, hf: Option<Value>| {
            quantisation(&json!({ "quantization_config": qc }), hf.as_ref(), "toy.json").map_err(|e| e.to_string())
        };
        // MiniMax-M3-NVFP4's layout: MXFP8 projections and shared experts, NVFP4 routed experts,
        // from hf_quant_config.json; no KV declaration, so bf16 KV and attention.
        let layers = json!({
            "model.layers.0.self_attn.q_proj": {"quant_algo": "MXFP8"},
            "model.layers.3.block_sparse_moe.shared_experts.up_proj": {"quant_algo": "MXFP8"},
            "model.layers.3.block_sparse_moe.experts.7.w1": {"quant_algo": "NVFP4", "group_size": 16},
        });
        let hf = json!({"quantization": {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": null,
                        "quantized_layers": layers}});
        let q = try_quant(json!({"quant_method": "modelopt"}), Some(hf)).unwrap();
        assert_eq!((q.gemm, q.moe, q.kv, q.fmha), (Dtype::Fp8Block, Dtype::Nvfp4, Dtype::Bfloat16, Dtype::Bfloat16));
        // Layers in quantization_config, formats as plain strings; per-tensor FP8 GEMMs are
        // static unless dynamic; fp8 experts; an fp8 KV declaration still means fp8 attention.
        let qc = json!({"quant_algo": "mixed-precision", "kv_cache_quant_algo": "FP8", "quantized_layers": {
            "layers.0.self_attn.o_proj": "FP8", "layers.1.mlp.experts": "fp8"}});
        let q = try_quant(qc, None).unwrap();
        assert_eq!((q.gemm, q.moe, q.kv, q.fmha), (Dtype::Fp8Static, Dtype::Fp8, Dtype::Fp8, Dtype::Fp8));
        // config_groups: an 8-bit float group of 32 is MXFP8, 4-bit float NVFP4; experts only,
        // so the GEMMs stay bf16; a base fp8 quant_method with a weight block sets the GEMMs.
        let groups = json!({
            "g0": {"targets": ["model.layers.1.mlp.experts"], "weights": {"num_bits": 8, "type": "float", "group_size": 32}},
            "g1": {"targets": ["model.layers.2.mlp.routing_experts"], "weights": {"num_bits": 4, "type": "float"}}});
        let q = try_quant(json!({"quant_algo": "MIXED_PRECISION", "config_groups": groups}), None).unwrap();
        assert_eq!((q.gemm, q.moe), (Dtype::Bfloat16, Dtype::Nvfp4));
        let qc = json!({"quant_algo": "MIXED_PRECISION", "quant_method": "fp8", "weight_block_size": [128, 128],
                        "quantized_layers": {"layers.0.mlp.experts.0.w1": "MXFP8", "layers.0.self_attn.q_proj": "NVFP4"}});
        assert_eq!(try_quant(qc, None).map(|q| (q.gemm, q.moe)), Ok((Dtype::Fp8Block, Dtype::Fp8Block)));
        // What has no timing mode is refused, naming the formats.
        let e = try_quant(
            json!({"quant_algo": "MIXED_PRECISION", "quantized_layers": {"l.0.self_attn.q_proj": "INT4_AWQ"}}),
            None,
        )
        .unwrap_err();
        assert!(e.contains("MIXED_PRECISION GEMM formats [int4_awq] have no timing mode"), "{e}");
        let e = try_quant(
            json!({"quant_algo": "MIXED_PRECISION", "quantized_layers": {"l.0.experts.1.w1": "W4A16_NVFP4"}}),
            None,
        )
        .unwrap_err();
        assert!(e.contains("routed-expert formats [w4a16_nvfp4] include w4a16_nvfp4"), "{e}");
        let e = try_quant(json!({"quant_algo": "MIXED_PRECISION"}), None).unwrap_err();
        assert!(e.contains("MIXED_PRECISION quantisation names no layer format"), "{e}");
    }

    #[test]
    fn exclusion_patterns() {
        // DeepSeek-V3.1-NVFP4: q / kv projections named one by one, o_proj stays quantised.
        let e = Excluded::from_patterns([
            "model.layers.3.self_attn.kv_a_proj_with_mqa",
            "model.layers.3.self_attn.q_b_proj",
            "model.layers.61*",
            "lm_head",
        ]);
        assert_eq!(e, Excluded { q: true, kv: true, o: false, shared_expert: false });
        // The whole attention block (Kimi-K2.5-NVFP4 style) and a shared expert.
        let e = Excluded::from_patterns(["model.layers.*.self_attn*", "model.layers.4.mlp.shared_experts.down_proj"]);
        assert_eq!(e, Excluded { q: true, kv: true, o: true, shared_expert: true });
    }

    #[test]
    fn mla_mixed_formats_run_the_granular_chain() {
        let mut m = tiny_mla();
        m.quant.excluded = Excluded { q: true, kv: true, o: false, shared_expert: true };
        let mut l = layout("sglang", 0);
        l.gemm = Dtype::Nvfp4;
        l.shared_gemm = Dtype::Bfloat16;
        let (ctx, gen) = build_ops(&m, &l).unwrap();
        // No fused module (its table is keyed by one format): the granular ops sit in the list.
        assert!(!names(&ctx).contains(&"context_mla_block"));
        let dtype = |ops: &[Op], name: &str| match find(ops, name) {
            Op::Gemm { dtype, .. } => *dtype,
            other => panic!("{other:?}"),
        };
        assert_eq!(dtype(&ctx, "context_downscale_gemm"), Dtype::Bfloat16);
        assert_eq!(dtype(&ctx, "context_q_b_proj_gemm"), Dtype::Bfloat16);
        assert_eq!(dtype(&ctx, "context_proj_gemm"), Dtype::Nvfp4);
        assert_eq!(dtype(&ctx, "context_shared_gate_up_gemm"), Dtype::Bfloat16);
        // The decode BMMs follow the bf16 kv projection.
        assert!(matches!(find(&gen, "generation_bmm_pre"), Op::MlaBmm(MlaBmmOp { dtype: Dtype::Bfloat16, .. })));
    }

    /// Kimi-K2.5's wrapper: the text model under `text_config`, its compressed-tensors INT4
    /// quantisation there too (experts int4_wo; attention, shared experts and dense MLP ignored,
    /// so bf16), the top-level architecture kept. An INT4 GEMM is refused.
    #[test]
    fn kimi_wrapper_reads_its_text_model() {
        let int4 = |ignore: Value| {
            json!({"config_groups": {"group_0": {"targets": ["Linear"], "weights":
                       {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32}}},
                   "ignore": ignore, "quant_method": "compressed-tensors", "kv_cache_scheme": null})
        };
        let mut text = tiny_mla_config();
        text["quantization_config"] = int4(json!(["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*"]));
        let cfg = json!({"architectures": ["KimiK25ForConditionalGeneration"], "dtype": "bfloat16",
                         "text_config": text, "vision_config": {"vt_hidden_size": 1152}});
        let m = ModelSpec::from_config("toy/kimi", Path::new("toy.json"), &cfg).unwrap();
        assert_eq!(
            (m.architecture.as_str(), m.family, m.layers, m.hidden),
            ("KimiK25ForConditionalGeneration", Family::Mla, 4, 256)
        );
        let q = m.quant;
        assert_eq!((q.gemm, q.moe, q.kv, q.fmha), (Dtype::Bfloat16, Dtype::Int4Wo, Dtype::Bfloat16, Dtype::Bfloat16));
        assert!(q.excluded.q && q.excluded.kv && q.excluded.o && q.excluded.shared_expert);
        assert_eq!(m.torch_dtype.as_deref(), Some("bfloat16"));
        let mut text = tiny_mla_config();
        text["quantization_config"] = int4(json!(["lm_head"]));
        let cfg = json!({"architectures": ["KimiK25ForConditionalGeneration"], "text_config": text});
        let e = ModelSpec::from_config("toy/kimi", Path::new("toy.json"), &cfg).unwrap_err().to_string();
        assert!(e.contains("compressed-tensors int4_wo GEMMs are not modelled"), "{e}");
        let e = ModelSpec::from_config(
            "toy/kimi",
            Path::new("toy.json"),
            &json!({"architectures": ["KimiK25ForConditionalGeneration"]}),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("text_config"), "{e}");
    }
}
