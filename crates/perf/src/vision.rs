//! Qwen3-VL's vision tower as the reference prices an image (the analytical encoder pool's
//! `encoder_latency`, its memory, and the image tokens added to the prompt).
//!
//! Geometry: the processor's `smart_resize` rounds each side to the patch × merge stride (ties
//! to even, as Python's `round`), rescaling an image above `max_pixels` down (floor) or below
//! `min_pixels` up (ceil) first. The bundled Qwen3-VL checkpoints carry no preprocessor file,
//! so the pinned budget 65536 … 16777216 pixels applies. The ViT runs over the patches
//! (`(h / patch) · (w / patch)` of them, one sequence per image); the merger emits one token per
//! `merge²` patches, and those are the image's prompt tokens.
//!
//! Ops (one encoder-only worker at tensor width `tp`, weights sharded, no encoder DP), all bf16:
//! patch-embedding GEMM and position add on the patches; per block (`depth` times) add-norm,
//! QKV GEMM, non-causal attention (`encoder_attention_perf`, sqrt-interpolated along the sequence
//! like context attention, heads / tp per GPU), out-projection, all-reduce, add-norm, FFN up,
//! activation, FFN down, all-reduce, and the rotary pass over Q and K (the table attention then
//! goes without its own rope term); then per merger instance (the final one plus one per
//! deepstack index) a LayerNorm, fc0 (column-parallel), activation, fc1 (row-parallel) and an
//! all-reduce, on the merged tokens. A batch of `b` requests runs `b · images` sequences;
//! every op is read at `sequences · tokens` tokens, attention at batch `sequences` and length
//! `tokens`.
//!
//! Memory (the pool's OOM gate and `encoder_memory_gib`): the GEMM weights in bf16, plus
//! activations `2 · tokens · max(3 · hidden, 3 · hidden / tp)` over the batch's ViT tokens and
//! `2 · merged tokens · out_hidden · instances` for the projected embeddings, at least 32 MiB.

use crate::db::{Database, Dtype};
use crate::error::{PerfError, Result};
use crate::interp::{GridSpec, Node};
use crate::parquet_table::{key_u32, Table};
use serde_json::Value;

/// The pinned processor pixel budget of the bundled Qwen3-VL checkpoints.
pub const QWEN3_VL_PIXELS: (u64, u64) = (65536, 16_777_216);

const ENCODER_TABLE: &str = "encoder_attention_perf.parquet";
const ATTN_SPEC: GridSpec = GridSpec::sqrt_along(&["num_heads", "seq_len", "batch"], 1);

/// A Qwen3-VL vision tower (`vision_config`).
#[derive(Clone, Debug, PartialEq)]
pub struct VisionTower {
    pub depth: u32,
    pub hidden: u32,
    pub heads: u32,
    pub intermediate: u32,
    pub patch: u32,
    pub temporal_patch: u32,
    pub merge: u32,
    pub out_hidden: u32,
    pub in_channels: u32,
    /// Merger instances: the final PatchMerger and one per deepstack index.
    pub instances: u32,
    pub min_pixels: u64,
    pub max_pixels: u64,
}

/// One image's encoder work after preprocessing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageShape {
    /// ViT tokens (patches) of its one sequence.
    pub patches: u32,
    /// Merged tokens: what the prompt carries.
    pub tokens: u32,
}

fn field(v: &Value, key: &str, what: &str) -> Result<u32> {
    v.get(key)
        .and_then(Value::as_u64)
        .and_then(|n| u32::try_from(n).ok())
        .filter(|&n| n > 0)
        .ok_or_else(|| PerfError::config(format!("{what}: vision_config.{key} must be a positive integer")))
}

impl VisionTower {
    /// The tower of a Qwen3-VL `config.json` (`None`: the model has no `vision_config`).
    pub fn from_config(root: &Value, what: &str) -> Result<Option<VisionTower>> {
        let Some(v) = root.get("vision_config").filter(|v| v.is_object()) else { return Ok(None) };
        let text_hidden = root
            .get("text_config")
            .and_then(|t| t.get("hidden_size"))
            .or_else(|| root.get("hidden_size"))
            .and_then(Value::as_u64);
        let out_hidden = field(v, "out_hidden_size", what)?;
        if text_hidden != Some(u64::from(out_hidden)) {
            return Err(PerfError::config(format!(
                "{what}: vision_config.out_hidden_size ({out_hidden}) must match the language hidden_size"
            )));
        }
        let deepstack = v.get("deepstack_visual_indexes").and_then(Value::as_array).map_or(0, Vec::len) as u32;
        let in_channels = match v.get("in_channels") {
            None => 3,
            Some(_) => field(v, "in_channels", what)?,
        };
        Ok(Some(VisionTower {
            depth: field(v, "depth", what)?,
            hidden: field(v, "hidden_size", what)?,
            heads: field(v, "num_heads", what)?,
            intermediate: field(v, "intermediate_size", what)?,
            patch: field(v, "patch_size", what)?,
            temporal_patch: field(v, "temporal_patch_size", what)?,
            merge: field(v, "spatial_merge_size", what)?,
            out_hidden,
            in_channels,
            instances: 1 + deepstack,
            min_pixels: QWEN3_VL_PIXELS.0,
            max_pixels: QWEN3_VL_PIXELS.1,
        }))
    }

    /// The processor's resized `(height, width)`.
    pub fn resize(&self, height: u32, width: u32) -> Result<(u64, u64)> {
        let factor = f64::from(self.patch * self.merge);
        let (h, w) = (f64::from(height), f64::from(width));
        if h.max(w) / h.min(w).max(1.0) > 200.0 {
            return Err(PerfError::config(format!(
                "traffic.source.images: absolute aspect ratio must be smaller than 200, got {:.1}",
                h.max(w) / h.min(w).max(1.0)
            )));
        }
        let mut hb = factor.max((h / factor).round_ties_even() * factor);
        let mut wb = factor.max((w / factor).round_ties_even() * factor);
        if self.max_pixels > 0 && hb * wb > self.max_pixels as f64 {
            let beta = ((h * w) / self.max_pixels as f64).sqrt();
            hb = factor.max((h / beta / factor).floor() * factor);
            wb = factor.max((w / beta / factor).floor() * factor);
        } else if self.min_pixels > 0 && hb * wb < self.min_pixels as f64 {
            let beta = (self.min_pixels as f64 / (h * w)).sqrt();
            hb = (h * beta / factor).ceil() * factor;
            wb = (w * beta / factor).ceil() * factor;
        }
        Ok((hb as u64, wb as u64))
    }

    /// One `height × width` image's patches and prompt tokens.
    pub fn image(&self, height: u32, width: u32) -> Result<ImageShape> {
        let (h, w) = self.resize(height, width)?;
        let stride = u64::from(self.patch * self.merge);
        let tokens = (h / stride) * (w / stride);
        let patches = (h / u64::from(self.patch)) * (w / u64::from(self.patch));
        let too_big = || PerfError::config("traffic.source.images: the image resolves to more than 2^32 patches");
        Ok(ImageShape {
            patches: u32::try_from(patches).map_err(|_| too_big())?,
            tokens: u32::try_from(tokens).map_err(|_| too_big())?,
        })
    }

    /// The encoder-only worker's ops at tensor width `tp` (weights sharded).
    pub fn ops(&self, tp: u32) -> Result<Vec<EncoderOp>> {
        if tp == 0 || !self.heads.is_multiple_of(tp) || !self.intermediate.is_multiple_of(tp) {
            return Err(PerfError::config(format!(
                "encoder tensor {tp} must divide the ViT's {} heads and {} FFN width",
                self.heads, self.intermediate
            )));
        }
        let (d, h, inter) = (f64::from(self.depth), self.hidden, self.intermediate / tp);
        let head = h / self.heads;
        let ew = |name: &str, scale: f64, dim_in: u32, dim_out: u32| EncoderOp {
            name: name.into(),
            scale,
            on: Tokens::Vit,
            kind: Kind::Elementwise { bytes_per_token: f64::from(dim_in + dim_out) * 2.0 },
        };
        let gemm = |name: &str, scale: f64, on: Tokens, n: u32, k: u32, fp8_input: bool| EncoderOp {
            name: name.into(),
            scale,
            on,
            kind: Kind::Gemm { n, k, fp8_input },
        };
        let ar = |name: &str, scale: f64, on: Tokens, hidden: u32| EncoderOp {
            name: name.into(),
            scale,
            on,
            kind: Kind::AllReduce { hidden },
        };
        let patch_volume = self.in_channels * self.temporal_patch * self.patch * self.patch;
        let mut ops = vec![
            gemm("encoder_patch_embed_gemm", 1.0, Tokens::Vit, h, patch_volume, false),
            ew("encoder_position_embed", 1.0, 2 * h, h),
            ew("encoder_add_norm_1", d, 2 * h, 2 * h),
            gemm("encoder_qkv_gemm", d, Tokens::Vit, 3 * h / tp, h, false),
            EncoderOp {
                name: "encoder_attention".into(),
                scale: d,
                on: Tokens::Vit,
                kind: Kind::Attention { heads: self.heads / tp, head },
            },
            gemm("encoder_proj_gemm", d, Tokens::Vit, h, h / tp, true),
            ar("encoder_ar_1", d, Tokens::Vit, h),
            ew("encoder_add_norm_2", d, 2 * h, 2 * h),
            gemm("encoder_ffn1_gemm", d, Tokens::Vit, inter, h, false),
            ew("encoder_act", d, inter, inter),
            gemm("encoder_ffn2_gemm", d, Tokens::Vit, h, inter, true),
            ar("encoder_ar_2", d, Tokens::Vit, h),
            ew("encoder_rope_apply", d, 6 * h / tp, 6 * h / tp),
        ];
        let n = f64::from(self.instances);
        let merger = h * self.merge * self.merge;
        ops.push(ew("encoder_merger_norm", n, h, h));
        ops.push(gemm("encoder_projector_fc0_gemm", n, Tokens::Merged, merger / tp, merger, false));
        let mut act = ew("encoder_projector_fc0_act", n, merger / tp, merger / tp);
        act.on = Tokens::Merged;
        ops.push(act);
        ops.push(gemm("encoder_projector_fc1_gemm", n, Tokens::Merged, self.out_hidden, merger / tp, false));
        ops.push(ar("encoder_projector_ar", n, Tokens::Merged, self.out_hidden));
        Ok(ops)
    }

    /// One batch of `batch` requests of `images` images each through the encoder-only worker at
    /// tensor width `tp`: each op's latency (ms), in op order.
    pub fn batch_ops(
        &self,
        db: &Database,
        tp: u32,
        batch: u32,
        images: u32,
        shape: ImageShape,
    ) -> Result<Vec<(String, f64)>> {
        let sequences = batch
            .checked_mul(images)
            .ok_or_else(|| PerfError::config("encoder batch × images per request exceeds 2^32"))?;
        let mut attention: Option<AttentionTable> = None;
        let mut out = Vec::new();
        for op in self.ops(tp)? {
            let s = match op.on {
                Tokens::Vit => shape.patches,
                Tokens::Merged => shape.tokens,
            };
            let x =
                sequences.checked_mul(s).ok_or_else(|| PerfError::config("encoder tokens per batch exceed 2^32"))?;
            let ms = match op.kind {
                Kind::Elementwise { bytes_per_token } => db.mem_op_ms(bytes_per_token * f64::from(x)),
                Kind::Gemm { n, k, fp8_input } => db.gemm_op(Dtype::Bfloat16, x, n, k, fp8_input)?.max(0.0),
                Kind::AllReduce { hidden } => {
                    if tp <= 1 {
                        0.0
                    } else {
                        db.custom_allreduce(tp, f64::from(x) * f64::from(hidden))?.max(0.0)
                    }
                }
                Kind::Attention { heads, head } => {
                    if attention.is_none() {
                        attention = Some(AttentionTable::load(db)?);
                    }
                    let table = attention.as_ref().expect("loaded above");
                    table.query(db, heads, head, s, sequences)?.max(0.0)
                }
            };
            out.push((op.name, ms * op.scale));
        }
        Ok(out)
    }

    /// Bytes of one image's projected embeddings, as SGLang's multimodal embedding cache holds
    /// them: the merged tokens × the language hidden size × the merger instances, in bf16.
    pub fn embedding_bytes(&self, shape: ImageShape) -> u64 {
        u64::from(shape.tokens) * u64::from(self.out_hidden) * u64::from(self.instances) * 2
    }

    /// Resident weight bytes of the tower on one rank of a `tp`-wide language worker hosting
    /// it: sharded `tp` ways, or whole on every rank under encoder DP.
    pub fn weights_bytes(&self, tp: u32, layout: EncoderLayout) -> Result<f64> {
        let width = match layout {
            EncoderLayout::Tensor => tp,
            EncoderLayout::Data => 1,
        };
        Ok(self
            .ops(width)?
            .iter()
            .map(|op| match op.kind {
                Kind::Gemm { n, k, .. } => f64::from(n) * f64::from(k) * 2.0 * op.scale,
                _ => 0.0,
            })
            .sum())
    }

    /// One encoder call on a `tp`-wide language worker hosting the tower, over `images` images
    /// of one shape, ms: every op's time summed. Sharded (`Tensor`) the ops run at width `tp`
    /// over all the images; replicated (`Data`) each rank runs the whole tower over its share,
    /// the busiest rank's `ceil(images / tp)`, and the embeddings are all-gathered (NCCL in
    /// half precision, `out_hidden × instances × tp` elements per merged token of the share).
    pub fn call_ms(
        &self,
        db: &Database,
        tp: u32,
        layout: EncoderLayout,
        images: u32,
        shape: ImageShape,
    ) -> Result<f64> {
        if images == 0 {
            return Ok(0.0);
        }
        let (width, local) = match layout {
            EncoderLayout::Tensor => (tp, images),
            EncoderLayout::Data => (1, images.div_ceil(tp.max(1))),
        };
        let mut ms: f64 = self.batch_ops(db, width, 1, local, shape)?.iter().map(|(_, v)| v).sum();
        if layout == EncoderLayout::Data && tp > 1 {
            let per_token = f64::from(self.out_hidden) * f64::from(self.instances) * f64::from(tp);
            let tokens = f64::from(local) * f64::from(shape.tokens);
            ms += db.nccl("half", "all_gather", tp, tokens * per_token)?.max(0.0);
        }
        Ok(ms)
    }

    /// The encoder-only worker's memory for a batch, GiB: `(total, weights, activations)`.
    pub fn memory_gib(&self, tp: u32, batch: u32, images: u32, shape: ImageShape) -> Result<(f64, f64, f64)> {
        let weights: f64 = self
            .ops(tp)?
            .iter()
            .map(|op| match op.kind {
                Kind::Gemm { n, k, .. } => f64::from(n) * f64::from(k) * 2.0 * op.scale,
                _ => 0.0,
            })
            .sum();
        let visuals = f64::from(batch) * f64::from(images);
        let vit_tokens = visuals * f64::from(shape.patches);
        let live = (3 * self.hidden).max(3 * self.hidden / tp);
        let mut act = 2.0 * vit_tokens * f64::from(live);
        act += 2.0 * visuals * f64::from(shape.tokens) * f64::from(self.out_hidden) * f64::from(self.instances);
        let act = act.max(32.0 * 1024.0 * 1024.0);
        let gib = (1u64 << 30) as f64;
        Ok(((weights + act) / gib, weights / gib, act / gib))
    }
}

/// The tower a language worker hosts (native VL replay): the model's Qwen3-VL vision tower,
/// read from its `config.json` under the systems roots, with the processor's pixel budget
/// overridden by `images.min_pixels` / `max_pixels` when given.
pub fn hosted_tower(
    model: &str,
    systems_paths: &[String],
    min_pixels: Option<u64>,
    max_pixels: Option<u64>,
) -> Result<VisionTower> {
    let roots = crate::systems::systems_roots(systems_paths)?;
    let root_paths: Vec<_> = roots.iter().map(|(p, _)| p.clone()).collect();
    let path = crate::model::find_config(model, &root_paths)?;
    let root = crate::model::read_model_config(&path)?;
    let model_type = root.get("model_type").and_then(Value::as_str).unwrap_or("");
    if root.get("vision_config").is_none_or(Value::is_null) {
        return Err(PerfError::config(format!("{model} has no vision encoder configuration")));
    }
    if !model_type.starts_with("qwen3_vl") {
        return Err(PerfError::unsupported(format!(
            "native VL replay in servesim prices Qwen3-VL vision towers; the tower of '{model}' ({model_type}) is \
             not supported by servesim yet"
        )));
    }
    let mut tower = VisionTower::from_config(&root, model)?
        .ok_or_else(|| PerfError::config(format!("{model} has no vision encoder configuration")))?;
    if let Some(lo) = min_pixels {
        tower.min_pixels = lo;
    }
    if let Some(hi) = max_pixels {
        tower.max_pixels = hi;
    }
    Ok(tower)
}

/// How a language worker lays out the vision tower it hosts over its tensor-parallel group
/// (`vision.encoder_parallel`): `tp` shards it (SGLang's default), `dp` replicates it and
/// splits the images (`--mm-enable-dp-encoder`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncoderLayout {
    Tensor,
    Data,
}

impl EncoderLayout {
    pub fn parse(s: &str) -> Option<EncoderLayout> {
        match s {
            "tp" => Some(EncoderLayout::Tensor),
            "dp" => Some(EncoderLayout::Data),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            EncoderLayout::Tensor => "tp",
            EncoderLayout::Data => "dp",
        }
    }
}

/// Which token count an encoder op runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tokens {
    /// The ViT's patches.
    Vit,
    /// The merger's output tokens.
    Merged,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    Elementwise { bytes_per_token: f64 },
    Gemm { n: u32, k: u32, fp8_input: bool },
    AllReduce { hidden: u32 },
    Attention { heads: u32, head: u32 },
}

#[derive(Clone, Debug, PartialEq)]
pub struct EncoderOp {
    pub name: String,
    pub scale: f64,
    pub on: Tokens,
    pub kind: Kind,
}

/// `encoder_attention_perf`: bf16 slices by head size, `(heads, seq_len, batch) → ms`, the first
/// row of a point winning across the shared-layer sources.
struct AttentionTable {
    by_head: std::collections::BTreeMap<u32, crate::interp::Grid>,
    looked: Vec<String>,
}

impl AttentionTable {
    fn load(db: &Database) -> Result<AttentionTable> {
        let sources = crate::systems::sources(&db.spec, &db.backend, &db.version, ENCODER_TABLE, db.shared_layer)?;
        let mut nodes: std::collections::BTreeMap<u32, Node> = Default::default();
        let mut looked = Vec::new();
        for src in &sources {
            looked.push(src.path.display().to_string());
            let t = Table::read(
                &src.path,
                &["batch_size", "isl", "num_heads", "head_dim", "attn_dtype", "latency", "kernel_source"],
            )?;
            let (b, isl, nh, hd) = (t.int("batch_size")?, t.int("isl")?, t.int("num_heads")?, t.int("head_dim")?);
            let dt = t.text("attn_dtype")?;
            let lat = t.float("latency")?;
            let ks = t.text_or_none("kernel_source")?;
            let path = src.path.display().to_string();
            for i in 0..t.rows {
                if !crate::db::keep_row(src, &ks[i]) || dt[i].as_deref() != Some("bfloat16") {
                    continue;
                }
                let head = key_u32(&path, "head_dim", i, hd[i])?;
                let point = [
                    key_u32(&path, "num_heads", i, nh[i])?,
                    key_u32(&path, "isl", i, isl[i])?,
                    key_u32(&path, "batch_size", i, b[i])?,
                ];
                nodes.entry(head).or_default().insert_first_wins(&point, lat[i]);
            }
        }
        let by_head = nodes.into_iter().map(|(h, n)| (h, crate::interp::Grid::new(n))).collect();
        Ok(AttentionTable { by_head, looked })
    }

    /// Non-causal attention of `b` sequences of `s` tokens, `n` heads of `head` each, ms.
    fn query(&self, db: &Database, n: u32, head: u32, s: u32, b: u32) -> Result<f64> {
        let grid = self.by_head.get(&head).ok_or_else(|| {
            PerfError::data(format!(
                "no bfloat16 encoder attention data for head size {head} on {} / {} {} (looked in {})",
                db.spec.name,
                db.backend,
                db.version,
                if self.looked.is_empty() { "no installed file".to_string() } else { self.looked.join(", ") }
            ))
        })?;
        let flops = Dtype::Bfloat16.flops(&db.spec)?;
        let spec = &db.spec;
        let h = f64::from(head);
        let sol = move |c: &[f64]| {
            let (n, s, b) = (c[0], c[1], c[2]);
            let ops = 2.0 * b * s * s * n * h * 2.0;
            let mem = 2.0 * b * (3.0 * n * s * h + n * s * h);
            (ops / flops * 1000.0).max(mem / spec.mem_bw * 1000.0)
        };
        grid.query(&ATTN_SPEC, &sol, &[f64::from(n), f64::from(s), f64::from(b)])
            .map_err(|e| e.context("encoder attention"))
    }
}
