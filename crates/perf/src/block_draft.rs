//! Block-drafting speculative decoding (DFlash, DSpark): a draft network that proposes a whole
//! block of tokens per round, timed beside the target's verify pass.
//!
//! Both schemes read a stack of the target's hidden states (the `target_layer_ids` taps)
//! through a `main_proj` GEMM into a dense draft decoder stack, whose geometry is the draft
//! checkpoint's `config.json` (`speculation.draft_config`). As the reference (aisimulate 0.13)
//! prices a round of `n` drafts (the target verifies `n + 1` tokens per request in one block
//! pass, the layout's verify width, as for ngram):
//!
//! - **DFlash** (single shot): `main_proj` once per request, one parallel forward of the stack
//!   over the anchor and `n` mask tokens (`n + 1` tokens per request, so at the verify width),
//!   then the logits head over the `n` drafted positions — the target's full-vocabulary head,
//!   or a speculators-style checkpoint's own reduced one;
//! - **DSpark** (semi-autoregressive): `main_proj` once per request, one parallel forward of
//!   `num_draft_layers` layers over `n` tokens per request, the target-width head over the `n`
//!   positions, then `n` sequential Markov-bias GEMMs (`markov_rank` → vocabulary), one token per
//!   request each;
//! - **prefill:** the draft builds its KV over the prompt: `main_proj` and the stack over the
//!   same tokens as the target.
//!
//! Each draft op whose width differs from the verify width is wrapped in [`Op::TokenScale`]
//! (`tokens per request / verify width`), as the reference's token-width wrapper maps it; the
//! draft's decode attention reads each request's KV once for its block of queries (the
//! reference's sequence basis, with the block's math as a floor). Op names start with `draft_`,
//! so a mixed pass times them with their phase's attention.
//!
//! DSpark's DeepSeek-V4-style draft (`dspark_block_size`) is refused as the reference refuses
//! it: its window-capped draft attention needs a query override the compiled engine does not
//! carry. The drafts' weights and KV do not size a cache: the reference requires a fixed KV
//! capacity beside a draft scheme.

use serde_json::{Map, Value};

use crate::db::Dtype;
use crate::error::{PerfError, Result};
use crate::model::{Family, Layout, ModelSpec, Op};

/// The reference's `LLAMA` family: the architectures its dense draft stacks are validated on.
const LLAMA: [&str; 4] = ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MiMoForCausalLM"];

/// Which block drafter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// Single-shot block diffusion (`kind: dflash`).
    Dflash,
    /// Semi-autoregressive block drafting with a Markov-bias chain (`kind: dspark`).
    Dspark,
}

impl Scheme {
    /// The speculation kind's name.
    pub fn kind(self) -> &'static str {
        match self {
            Scheme::Dflash => "dflash",
            Scheme::Dspark => "dspark",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Scheme::Dflash => "DFlash",
            Scheme::Dspark => "DSpark",
        }
    }

    /// The parameters the reference's scheme takes.
    fn params(self) -> &'static [&'static str] {
        match self {
            Scheme::Dflash => &["num_draft_tokens"],
            Scheme::Dspark => &["num_draft_layers", "num_draft_tokens"],
        }
    }
}

/// One dense draft decoder stack, read from the draft checkpoint's `config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct Geometry {
    pub layers: u32,
    pub hidden: u32,
    pub inter: u32,
    pub heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    /// `vocab_size` when the config states it.
    pub vocab: Option<u32>,
    /// Sliding window (0: full attention).
    pub window: u32,
    pub qk_norm: bool,
}

/// A block drafter as its scheme and draft checkpoint describe it.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockDraft {
    pub scheme: Scheme,
    /// Drafts per round (`num_draft_tokens`); the target verifies `tokens + 1`.
    pub tokens: u32,
    /// The target layers whose hidden states feed `main_proj`.
    pub taps: Vec<u32>,
    /// The dense draft stack; `None` for a DeepSeek-V4-style DSpark draft (not modelled).
    pub geometry: Option<Geometry>,
    /// DFlash: residual streams per tap (`hc_mult` of an mHC target; 1 otherwise).
    pub streams: u32,
    /// DFlash speculators style: the draft's own (reduced) head vocabulary; `None`: the
    /// target's head.
    pub own_head_vocab: Option<u32>,
    /// DSpark: the layers of the stack that run (`num_draft_layers`).
    pub layers: u32,
    /// DSpark: the Markov-bias rank.
    pub markov_rank: u32,
}

/// A positive integer as the reference's checks take one (an integral float too).
fn positive(v: &Value, name: &str) -> std::result::Result<u32, String> {
    let n = match v {
        Value::Number(n) => {
            n.as_u64().or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0).map(|f| f as u64))
        }
        _ => None,
    };
    match n {
        Some(n @ 1..=0xFFFF_FFFF) => Ok(n as u32),
        _ => Err(format!("{name} must be a positive integer, got {v}.")),
    }
}

fn positive_at(cfg: &Value, key: &str) -> std::result::Result<Option<u32>, String> {
    match cfg.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => positive(v, key).map(Some),
    }
}

/// `target_layer_ids`: a non-empty list of nonnegative integers.
fn taps(v: &Value) -> std::result::Result<Vec<u32>, String> {
    let list = match v {
        Value::Array(a) if !a.is_empty() => a,
        _ => return Err("target_layer_ids must be a non-empty list or tuple of nonnegative integers".into()),
    };
    list.iter()
        .map(|x| {
            let n = match x {
                Value::Number(n) => {
                    n.as_u64().or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0).map(|f| f as u64))
                }
                _ => None,
            };
            n.and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| "target_layer_ids must contain nonnegative integers".into())
        })
        .collect()
}

impl Geometry {
    /// Reads an HF config as the reference's dense draft geometry reads it: the four widths
    /// required, KV heads defaulting to the heads, the head size to `hidden / heads`, the
    /// window unless `use_sliding_window: false`, q/k norms for `model_type: qwen3` only.
    pub fn from_hf(cfg: &Value) -> std::result::Result<Geometry, String> {
        let required = ["num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads"];
        let missing: Vec<String> =
            required.iter().filter(|k| cfg.get(**k).is_none_or(Value::is_null)).map(|k| format!("'{k}'")).collect();
        if !missing.is_empty() {
            return Err(format!("dense draft config lacks required keys: [{}]", missing.join(", ")));
        }
        let [layers, hidden, inter, heads] = required.map(|k| positive(&cfg[k], k));
        let (layers, hidden, inter, heads) = (layers?, hidden?, inter?, heads?);
        if cfg.get("head_dim").is_none() && !hidden.is_multiple_of(heads) {
            return Err(
                "dense draft hidden_size must be divisible by num_attention_heads when head_dim is absent".into()
            );
        }
        let window = if cfg.get("use_sliding_window") == Some(&Value::Bool(false)) {
            0
        } else {
            positive_at(cfg, "sliding_window")?.unwrap_or(0)
        };
        Ok(Geometry {
            layers,
            hidden,
            inter,
            heads,
            kv_heads: positive_at(cfg, "num_key_value_heads")?.unwrap_or(heads),
            head_dim: positive_at(cfg, "head_dim")?.unwrap_or(hidden / heads),
            vocab: match cfg.get("vocab_size") {
                None => None,
                Some(v) => Some(positive(v, "vocab_size")?),
            },
            window,
            qk_norm: cfg.get("model_type").and_then(Value::as_str) == Some("qwen3"),
        })
    }
}

impl BlockDraft {
    /// Reads a `dflash` / `dspark` scheme as the reference's scheme constructors do: `params`
    /// (`num_draft_tokens`; DSpark also `num_draft_layers`) and the draft checkpoint's
    /// `config.json`, in the reference's words. `kind` must be `dflash` or `dspark`.
    pub fn read(
        kind: &str,
        params: &Map<String, Value>,
        draft_config: Option<&Value>,
    ) -> std::result::Result<Self, String> {
        let scheme = match kind {
            "dflash" => Scheme::Dflash,
            "dspark" => Scheme::Dspark,
            other => return Err(format!("{other:?} is not a block-drafting scheme")),
        };
        let mut unknown: Vec<&str> =
            params.keys().map(String::as_str).filter(|k| !scheme.params().contains(k)).collect();
        if !unknown.is_empty() {
            unknown.sort_unstable();
            let list: Vec<String> = unknown.iter().map(|k| format!("'{k}'")).collect();
            return Err(format!("Unknown parameters for speculative scheme '{kind}': [{}]", list.join(", ")));
        }
        let cfg = match draft_config {
            Some(c @ Value::Object(m)) if !m.is_empty() => c,
            _ => {
                return Err(match scheme {
                    Scheme::Dflash => {
                        "DFlash requires the draft checkpoint's config.json (draft_config): it carries \
                                       block_size, the stack geometry and the aux/target layer ids."
                    }
                    Scheme::Dspark => {
                        "DSpark requires the draft checkpoint's config.json (draft_config): it carries \
                                       the block size, target_layer_ids and markov_rank."
                    }
                }
                .into())
            }
        };
        let param = |k: &str| params.get(k).filter(|v| !v.is_null());
        let draft = match scheme {
            Scheme::Dflash => Self::read_dflash(cfg, param("num_draft_tokens"))?,
            Scheme::Dspark => Self::read_dspark(cfg, param("num_draft_tokens"), param("num_draft_layers"))?,
        };
        if !(1..=5).contains(&draft.tokens) {
            return Err(format!(
                "speculative replay requires 1..5 draft tokens, got num_draft_tokens {}",
                draft.tokens
            ));
        }
        Ok(draft)
    }

    fn read_dflash(cfg: &Value, tokens: Option<&Value>) -> std::result::Result<Self, String> {
        let block = cfg.get("block_size").filter(|v| !v.is_null());
        let nested = cfg.get("transformer_layer_config").filter(|v| !v.is_null());
        let aux = cfg.get("aux_hidden_state_layer_ids").filter(|v| !v.is_null());
        let (ids, geometry, streams, own_head_vocab) = match (nested, aux) {
            // Speculators style: nested layer geometry, mHC-aware injection, own embedding and
            // reduced-vocabulary head.
            (Some(layer), Some(aux)) => {
                let g = Geometry::from_hf(layer)?;
                let streams = match layer.get("hc_mult") {
                    None => 1,
                    Some(v) => positive(v, "injection_streams")?,
                };
                let vocab = positive(cfg.get("draft_vocab_size").unwrap_or(&Value::Null), "draft_vocab_size")?;
                (Some(aux), Some(g), streams, Some(vocab))
            }
            _ => {
                let ids = cfg.get("dflash_config").and_then(|d| d.get("target_layer_ids")).filter(|v| !v.is_null());
                let g = match ids {
                    Some(_) => Some(Geometry::from_hf(cfg)?),
                    None => None,
                };
                (ids, g, 1, None)
            }
        };
        let (Some(block), Some(ids), Some(geometry)) = (block, ids, geometry) else {
            return Err("draft config lacks 'block_size' plus 'dflash_config.target_layer_ids' (z-lab style) or \
                        'aux_hidden_state_layer_ids' (speculators style); not a DFlash draft checkpoint?"
                .into());
        };
        let tokens = match tokens {
            Some(v) => positive(v, "num_draft_tokens")?,
            // block_size counts the anchor.
            None => positive(block, "block_size")?.saturating_sub(1),
        };
        if tokens == 0 {
            return Err("num_draft_tokens must be a positive integer, got 0.".into());
        }
        Ok(BlockDraft {
            scheme: Scheme::Dflash,
            tokens,
            taps: taps(ids)?,
            layers: geometry.layers,
            geometry: Some(geometry),
            streams,
            own_head_vocab,
            markov_rank: 0,
        })
    }

    fn read_dspark(cfg: &Value, tokens: Option<&Value>, layers: Option<&Value>) -> std::result::Result<Self, String> {
        let given = |k: &str| cfg.get(k).filter(|v| !v.is_null());
        let (block, ids, geometry, default_layers, rank) = if let Some(block) = given("dspark_block_size") {
            // DeepSeek-V4 style: geometry from the target.
            let ids = given("dspark_target_layer_ids").filter(|v| v.as_array().is_none_or(|a| !a.is_empty()));
            let Some(ids) = ids else {
                return Err("V4-style DSpark draft config lacks 'dspark_target_layer_ids' (the target hidden-state \
                            taps that size the main_proj injection GEMM)."
                    .into());
            };
            let layers = given("n_mtp_layers").cloned().unwrap_or(Value::from(3));
            (block, ids, None, layers, given("dspark_markov_rank"))
        } else if let (Some(block), Some(ids)) = (given("block_size"), given("target_layer_ids")) {
            let g = Geometry::from_hf(cfg)?;
            if g.vocab.is_none() {
                return Err("dense DSpark draft config requires vocab_size for its owned embedding and head".into());
            }
            let layers = Value::from(g.layers);
            (block, ids, Some(g), layers, given("markov_rank"))
        } else {
            return Err("draft config lacks 'dspark_block_size' (V4 style) or 'block_size'+'target_layer_ids' \
                        (dense style); not a DSpark draft checkpoint?"
                .into());
        };
        let tokens = positive(tokens.unwrap_or(block), "num_draft_tokens")?;
        let layers = positive(layers.unwrap_or(&default_layers), "num_draft_layers")?;
        let taps = taps(ids)?;
        let markov_rank = match rank {
            None => 256,
            Some(v) => positive(v, "markov_rank")?,
        };
        if let Some(g) = &geometry {
            if layers > g.layers {
                return Err("num_draft_layers cannot exceed the draft checkpoint's num_hidden_layers".into());
            }
        }
        Ok(BlockDraft {
            scheme: Scheme::Dspark,
            tokens,
            taps,
            geometry,
            streams: 1,
            own_head_vocab: None,
            layers,
            markov_rank,
        })
    }

    /// The reference's checks of the draft against its target, backend and layout.
    pub fn check(&self, m: &ModelSpec, l: &Layout) -> Result<()> {
        let refuse = |why: String| Err(PerfError::unsupported(format!("{} speculation: {why}", self.scheme.kind())));
        let llama = LLAMA.contains(&m.architecture.as_str())
            && m.family == Family::Dense
            && m.hybrid.is_none()
            && m.gemma4.is_none();
        let title = self.scheme.title();
        let Some(g) = &self.geometry else {
            // DSpark's DeepSeek-V4 style.
            if m.family != Family::Dsv4 {
                return refuse(format!(
                    "DSpark modeling supports model families ('DEEPSEEKV4',) for this draft style, got {}. Add the \
                     family's draft geometry to DSparkScheme before enabling it.",
                    m.architecture
                ));
            }
            return refuse(
                "DraftOpSpec.query_overrides are unsupported by the compiled engine (a DeepSeek-V4-style DSpark \
                 draft's attention is capped at the sliding window, which the reference refuses to time)"
                    .into(),
            );
        };
        if !llama {
            let families = match self.scheme {
                Scheme::Dflash => "('LLAMA', 'DEEPSEEKV4')",
                Scheme::Dspark => "('LLAMA',) for this draft style",
            };
            if self.scheme == Scheme::Dflash && m.family == Family::Dsv4 {
                return refuse(format!(
                    "a DeepSeek-V4 target ({}) is not modelled by servesim yet: its verify pass and an mHC \
                     speculators-style draft beside it have no golden",
                    m.architecture
                ));
            }
            return refuse(format!(
                "{title} modeling supports model families {families}, got {}. Add the family's draft geometry \
                 before enabling it.",
                m.architecture
            ));
        }
        let backends: &[&str] = match self.scheme {
            Scheme::Dflash => &["vllm"],
            Scheme::Dspark => &["vllm", "sglang"],
        };
        if !backends.contains(&l.backend.as_str()) {
            let list: Vec<String> = backends.iter().map(|b| format!("'{b}'")).collect();
            let list = if list.len() == 1 { format!("({},)", list[0]) } else { format!("({})", list.join(", ")) };
            return refuse(format!("{title} modeling supports backends {list}, got '{}'.", l.backend));
        }
        if self.scheme == Scheme::Dspark && g.vocab != Some(m.vocab) {
            return refuse("dense DSpark draft vocab_size must match the target vocabulary".into());
        }
        if self.own_head_vocab.is_none() && g.hidden != m.hidden {
            let why = match self.scheme {
                Scheme::Dflash => "mismatched-width DFlash drafts are unvalidated modeling territory",
                Scheme::Dspark => "the main_proj injection requires matching widths.",
            };
            return refuse(format!("draft hidden_size {} != target hidden_size {}; {why}", g.hidden, m.hidden));
        }
        let bad: Vec<String> = self.taps.iter().filter(|&&i| i >= m.layers).map(u32::to_string).collect();
        if !bad.is_empty() {
            return refuse(format!(
                "{} target_layer_ids [{}] out of range for a {}-layer target.",
                self.scheme.kind(),
                bad.join(", "),
                m.layers
            ));
        }
        if !g.heads.is_multiple_of(l.tp) {
            return refuse(format!("draft num_attention_heads {} must be divisible by tp_size {}", g.heads, l.tp));
        }
        if !g.inter.is_multiple_of(l.tp) {
            return refuse(format!("draft intermediate_size {} must be divisible by tp_size {}", g.inter, l.tp));
        }
        if l.cp > 1 || l.pp > 1 {
            return refuse("pipeline or prefill context parallelism beside a block draft is not modelled".into());
        }
        Ok(())
    }

    /// `(context ops, generation ops)` of the draft, to append to the target's lists. `m` is
    /// the target; `l.ngram` must be `self.tokens`. [`Self::check`] first.
    pub fn draft_ops(&self, m: &ModelSpec, l: &Layout) -> (Vec<Op>, Vec<Op>) {
        let g = self.geometry.as_ref().expect("checked: a dense draft stack");
        let prefix = format!("draft_{}", self.scheme.kind());
        let n = self.tokens;
        let verify = n + 1;
        let scaled = |op: Op, width: u32| {
            if width == verify {
                op
            } else {
                Op::TokenScale { op: Box::new(op), num: width, den: verify }
            }
        };
        let (stack, main_proj) = match self.scheme {
            Scheme::Dflash => {
                let k = m.hidden * self.taps.len() as u32 * self.streams;
                (g.clone(), Op::gemm(format!("{prefix}_main_proj"), 1.0, g.hidden, k, l.gemm, false))
            }
            Scheme::Dspark => (
                Geometry { layers: self.layers, ..g.clone() },
                Op::gemm(
                    format!("{prefix}_main_proj"),
                    1.0,
                    m.hidden,
                    m.hidden * self.taps.len() as u32,
                    l.gemm,
                    false,
                ),
            ),
        };
        let mut context = vec![main_proj.clone()];
        context.extend(stack_ops(&stack, l, &prefix, None));
        // The stack's forward width per request: anchor + n masks (DFlash) or n (DSpark).
        let width = match self.scheme {
            Scheme::Dflash => verify,
            Scheme::Dspark => n,
        };
        let mut generation = vec![scaled(main_proj, 1)];
        generation.extend(stack_ops(&stack, l, &prefix, Some(width)).into_iter().map(|op| scaled(op, width)));
        match self.scheme {
            Scheme::Dflash => {
                let vocab = self.own_head_vocab.unwrap_or(m.vocab);
                let head = Op::gemm(
                    format!("{prefix}_head_gemm"),
                    1.0,
                    (vocab / l.tp).max(1),
                    g.hidden,
                    Dtype::Bfloat16,
                    false,
                );
                generation.push(scaled(head, n));
            }
            Scheme::Dspark => {
                let head =
                    Op::gemm(format!("{prefix}_head_gemm"), 1.0, m.vocab / l.tp, m.hidden, Dtype::Bfloat16, false);
                generation.push(scaled(head, n));
                let markov = Op::gemm(
                    format!("{prefix}_markov_bias_gemm"),
                    f64::from(n),
                    m.vocab,
                    self.markov_rank,
                    Dtype::Bfloat16,
                    false,
                );
                generation.push(scaled(markov, 1));
            }
        }
        (context, generation)
    }
}

/// The dense draft stack (the target's Llama layer, without embedding or head): context ops
/// when `width` is `None`, else decode ops at `width` query tokens per request.
fn stack_ops(g: &Geometry, l: &Layout, prefix: &str, width: Option<u32>) -> Vec<Op> {
    let tp = l.tp;
    let h = g.hidden;
    let n = f64::from(g.layers);
    let kv_per_gpu = (g.kv_heads / tp).max(1);
    let q_width = g.heads * g.head_dim / tp;
    let act = 2.0; // bf16 activations
    let nm = |s: &str| format!("{prefix}_{s}");
    let norm = |s: &str| Op::Elementwise { name: nm(s), scale: n, bytes_per_token: f64::from(4 * h) * act };
    let (heads, head, window, qk_norm) = (g.heads / tp, g.head_dim, g.window, g.qk_norm);
    let attention = match width {
        None => Op::ContextAttention {
            name: nm("attention"),
            scale: n,
            n: heads,
            n_kv: kv_per_gpu,
            head,
            window,
            kv: l.kv,
            fmha: l.fmha,
            qk_norm,
            cp: 1,
            rope: true,
        },
        // One KV read per request for its block of `width` queries (a TokenScale wrapper has
        // already mapped the verify batch to this width).
        Some(width) => Op::GenerationAttention {
            name: nm("attention"),
            scale: n,
            n: heads,
            n_kv: kv_per_gpu,
            head,
            window,
            kv: l.kv,
            qk_norm,
            verify: width,
        },
    };
    vec![
        norm("add_norm_1"),
        Op::gemm(nm("qkv_gemm"), n, q_width + g.head_dim * kv_per_gpu * 2, h, l.gemm, false),
        attention,
        Op::gemm(nm("proj_gemm"), n, h, q_width, l.gemm, true),
        norm("add_norm_2"),
        Op::gemm(nm("gate_ffn1_gemm"), n, 2 * g.inter / tp, h, l.gemm, false),
        Op::Elementwise {
            name: nm("act_gate"),
            scale: n,
            bytes_per_token: f64::from(2 * g.inter / tp + g.inter / tp) * act,
        },
        Op::gemm(nm("ffn2_gemm"), n, h, g.inter / tp, l.gemm, true),
        Op::AllReduce { name: nm("ar_1"), scale: n, hidden: h, tp },
        Op::AllReduce { name: nm("ar_2"), scale: n, hidden: h, tp },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn zlab() -> Value {
        json!({"model_type": "qwen3", "block_size": 16, "dflash_config": {"target_layer_ids": [1, 9, 17, 25, 33]},
               "num_hidden_layers": 5, "hidden_size": 4096, "intermediate_size": 12288,
               "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936})
    }

    #[test]
    fn a_dflash_block_drafts_its_size_less_the_anchor() {
        let p = |v: Value| v.as_object().unwrap().clone();
        let d = BlockDraft::read("dflash", &p(json!({"num_draft_tokens": 4})), Some(&zlab())).unwrap();
        assert_eq!((d.tokens, d.taps.len(), d.streams, d.own_head_vocab), (4, 5, 1, None));
        // The checkpoint's default (block_size 16 → 15 drafts) is past the replay's 1..5.
        let e = BlockDraft::read("dflash", &Map::new(), Some(&zlab())).unwrap_err();
        assert_eq!(e, "speculative replay requires 1..5 draft tokens, got num_draft_tokens 15");
        let mut cfg = zlab();
        cfg["block_size"] = json!(4);
        assert_eq!(BlockDraft::read("dflash", &Map::new(), Some(&cfg)).unwrap().tokens, 3);
        let e = BlockDraft::read("dflash", &p(json!({"num_draft_layers": 2})), Some(&zlab())).unwrap_err();
        assert_eq!(e, "Unknown parameters for speculative scheme 'dflash': ['num_draft_layers']");
        cfg.as_object_mut().unwrap().remove("dflash_config");
        assert!(BlockDraft::read("dflash", &Map::new(), Some(&cfg)).unwrap_err().contains("not a DFlash draft"));
    }

    #[test]
    fn a_dense_dspark_draft_reads_its_stack_and_markov_head() {
        let mut cfg = zlab();
        cfg.as_object_mut().unwrap().remove("dflash_config");
        cfg["block_size"] = json!(5);
        cfg["target_layer_ids"] = json!([1, 9, 17]);
        let d = BlockDraft::read("dspark", &Map::new(), Some(&cfg)).unwrap();
        assert_eq!((d.tokens, d.layers, d.markov_rank, d.taps), (5, 5, 256, vec![1, 9, 17]));
        let p = json!({"num_draft_layers": 6}).as_object().unwrap().clone();
        let e = BlockDraft::read("dspark", &p, Some(&cfg)).unwrap_err();
        assert_eq!(e, "num_draft_layers cannot exceed the draft checkpoint's num_hidden_layers");
        cfg.as_object_mut().unwrap().remove("vocab_size");
        let e = BlockDraft::read("dspark", &Map::new(), Some(&cfg)).unwrap_err();
        assert!(e.contains("requires vocab_size"), "{e}");
        let e = BlockDraft::read("dspark", &Map::new(), None).unwrap_err();
        assert!(e.starts_with("DSpark requires the draft checkpoint's config.json"), "{e}");
        let e = BlockDraft::read("dspark", &Map::new(), Some(&json!({"dspark_block_size": 4}))).unwrap_err();
        assert!(e.contains("lacks 'dspark_target_layer_ids'"), "{e}");
    }
}
