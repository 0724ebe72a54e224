//! Qwen3-VL's and Llama 4's vision towers as the reference prices an image (the analytical encoder pool's
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
//! Llama 4 (`Tiles`, native VL replay only: aisimulate 0.13 refuses it in an encoder pool) shares
//! the ViT blocks. Its processor picks, among the canvases of at most `max_patches` square tiles,
//! the one whose scale to the image is the smallest not below 1 (else the largest), smallest by
//! area among equals; each tile is a sequence of `(336 / 14)²` patches plus a CLS token, and the
//! global thumbnail is one more when the canvas has several tiles. Its ops: the patch-embedding
//! linear on the raw patches (column-parallel, all-gathered), CLS / position add with the
//! pre-norm, the blocks, the post-norm; pixel shuffle, the adaptor MLP (column- then
//! row-parallel, all-reduced) and the connector (column-parallel, all-gathered) on the merged
//! tokens, 144 a tile. The prompt carries the tiles' merged tokens, 3 framing tokens, and one per
//! local tile when there are several.
//!
//! Kimi K3 (`Kimi`, analytical encoder pools; the reference refuses it in native pools) shares the
//! ViT blocks with a QKV projection wider than the tower (1536 over 12 heads of 128). Its
//! processor scales an image down to at most 16384 patches and 512 a side (truncating), then
//! pads each side to the merge stride; one sequence of the padded patches, a merged token per
//! `merge²`. Its ops: the patch embedding and position add, the blocks, a final norm and the
//! temporal pool on the ViT tokens, then PatchMergerV2 replicated on every rank (fc0, activation,
//! fc1 to the language width, post-norm; no collective) on the merged tokens. No installed system
//! has bf16 encoder attention of head size 128, so its pools stop on that table, as the
//! reference's do.
//!
//! Memory (the pool's OOM gate and `encoder_memory_gib`): the GEMM weights in bf16, plus
//! activations `2 · tokens · max(3 · hidden, 3 · qkv width / tp)` over the batch's ViT tokens and
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
    /// Llama 4's fixed tiles and adaptor (None: Qwen3-VL's dynamic resize and PatchMerger).
    pub tiles: Option<Tiles>,
    /// Kimi K3's MoonViT3D and PatchMergerV2 (None: another tower).
    pub kimi: Option<Kimi>,
}

/// The per-tower facts of Kimi K3's image path (MoonViT3D, PatchMergerV2): a QKV projection
/// wider than the tower (`qkv_hidden`), and the processor's patch budget: an image above
/// `max_patches` patches, or wider than `side_patches` on a side, is scaled down (truncating),
/// then padded up to the merge stride on each side.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kimi {
    pub qkv_hidden: u32,
    pub max_patches: u32,
    pub side_patches: u32,
}

/// The per-tower facts of Llama 4's image path: the processor cuts an image into square tiles
/// of `image_size` (the best-fitting canvas of at most `max_tiles` tiles, plus a global
/// thumbnail when it takes more than one), each tile one ViT sequence of its patches and a CLS
/// token; pixel shuffle merges `merge²` patches into one token, which a two-layer adaptor
/// (`adapter_hidden`, `adapter_out`) and the connector to the language width project.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tiles {
    pub image_size: u32,
    pub max_tiles: u32,
    pub resize_to_max_canvas: bool,
    pub add_global_tile: bool,
    pub adapter_hidden: u32,
    pub adapter_out: u32,
}

/// Prompt tokens Llama 4's processor puts around an image's tokens (start, end, and the
/// image marker), and after each local tile's row when a global tile follows.
const LLAMA4_IMAGE_FRAME: u32 = 3;
const LLAMA4_TOKENS_PER_LOCAL_TILE: u32 = 1;

/// One image's encoder work after preprocessing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageShape {
    /// ViT sequences of one image (one per tile; Qwen3-VL: one).
    pub sequences: u32,
    /// Patches of one sequence (what the patch embedding runs on).
    pub patches: u32,
    /// Transformer tokens of one sequence (the patches, plus Llama 4's CLS token).
    pub vit: u32,
    /// Merged tokens of one sequence (what the projector runs on).
    pub merged: u32,
    /// Prompt tokens of one image: its merged tokens plus the processor's framing tokens.
    pub tokens: u32,
}

impl ImageShape {
    /// Qwen3-VL's shape: one sequence whose merged tokens are all the prompt carries.
    pub fn single(patches: u32, tokens: u32) -> ImageShape {
        ImageShape { sequences: 1, patches, vit: patches, merged: tokens, tokens }
    }

    /// The merged tokens of one image (all its sequences): the embeddings the encoder emits.
    pub fn embedded(&self) -> u64 {
        u64::from(self.sequences) * u64::from(self.merged)
    }
}

fn field(v: &Value, key: &str, what: &str) -> Result<u32> {
    v.get(key)
        .and_then(Value::as_u64)
        .and_then(|n| u32::try_from(n).ok())
        .filter(|&n| n > 0)
        .ok_or_else(|| PerfError::config(format!("{what}: vision_config.{key} must be a positive integer")))
}

fn ew(name: &str, scale: f64, on: Tokens, dim_in: u32, dim_out: u32) -> EncoderOp {
    EncoderOp {
        name: name.into(),
        scale,
        on,
        kind: Kind::Elementwise { bytes_per_token: f64::from(dim_in + dim_out) * 2.0 },
    }
}

fn gemm(name: &str, scale: f64, on: Tokens, n: u32, k: u32, fp8_input: bool) -> EncoderOp {
    EncoderOp { name: name.into(), scale, on, kind: Kind::Gemm { n, k, fp8_input } }
}

fn all_reduce(name: &str, scale: f64, on: Tokens, hidden: u32) -> EncoderOp {
    EncoderOp { name: name.into(), scale, on, kind: Kind::AllReduce { hidden } }
}

fn all_gather(name: &str, on: Tokens, elements: u32) -> EncoderOp {
    EncoderOp { name: name.into(), scale: 1.0, on, kind: Kind::AllGather { elements } }
}

impl VisionTower {
    /// The tower of a Qwen3-VL or Llama 4 `config.json` (`None`: the model has no
    /// `vision_config`).
    pub fn from_config(root: &Value, what: &str) -> Result<Option<VisionTower>> {
        let Some(v) = root.get("vision_config").filter(|v| v.is_object()) else { return Ok(None) };
        match root.get("model_type").and_then(Value::as_str) {
            Some("llama4") => return llama4_tower(root, v, what).map(Some),
            Some("kimi_k3") => return kimi_tower(root, v, what).map(Some),
            _ => {}
        }
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
            tiles: None,
            kimi: None,
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

    /// One `height × width` image's sequences, their tokens and the image's prompt tokens.
    pub fn image(&self, height: u32, width: u32) -> Result<ImageShape> {
        if let Some(t) = &self.tiles {
            let tiles = t.sequences(height, width)?;
            let side = t.image_size / self.patch;
            let merged = (t.image_size / (self.patch * self.merge)).pow(2);
            let local = tiles - u32::from(t.add_global_tile && tiles > 1);
            let mut tokens = tiles * merged + LLAMA4_IMAGE_FRAME;
            if local > 1 {
                tokens += local * LLAMA4_TOKENS_PER_LOCAL_TILE;
            }
            return Ok(ImageShape { sequences: tiles, patches: side * side, vit: side * side + 1, merged, tokens });
        }
        if let Some(k) = &self.kimi {
            return self.kimi_image(k, height, width);
        }
        let (h, w) = self.resize(height, width)?;
        let stride = u64::from(self.patch * self.merge);
        let tokens = (h / stride) * (w / stride);
        let patches = (h / u64::from(self.patch)) * (w / u64::from(self.patch));
        let too_big = || PerfError::config("traffic.source.images: the image resolves to more than 2^32 patches");
        Ok(ImageShape::single(
            u32::try_from(patches).map_err(|_| too_big())?,
            u32::try_from(tokens).map_err(|_| too_big())?,
        ))
    }

    /// The encoder-only worker's ops at tensor width `tp` (weights sharded): the tower's input
    /// ops, the shared ViT blocks, and the tower's projector.
    pub fn ops(&self, tp: u32) -> Result<Vec<EncoderOp>> {
        if tp == 0 || !self.heads.is_multiple_of(tp) || !self.intermediate.is_multiple_of(tp) {
            return Err(PerfError::config(format!(
                "encoder tensor {tp} must divide the ViT's {} heads and {} FFN width",
                self.heads, self.intermediate
            )));
        }
        match (&self.tiles, &self.kimi) {
            (Some(t), _) => self.llama4_ops(t, tp),
            (None, Some(k)) => Ok(self.kimi_ops(k, tp)),
            (None, None) => Ok(self.qwen3_vl_ops(tp)),
        }
    }

    /// Kimi K3: one sequence of the padded patch grid. The image is scaled by the smallest of
    /// 1, `sqrt(max_patches / patches)` (patches counted on the raw image, floored per side,
    /// at least 1) and the side limit over each side; each scaled side is truncated (at least
    /// 1, at most the side limit) and padded up to the merge stride. At most 512 patches a side
    /// after padding (the tower's fixed rotary table).
    fn kimi_image(&self, k: &Kimi, height: u32, width: u32) -> Result<ImageShape> {
        let p = f64::from(self.patch);
        let (h, w) = (f64::from(height), f64::from(width));
        let limit = f64::from(k.side_patches) * p;
        let patches = (h / p).floor().max(1.0) * (w / p).floor().max(1.0);
        let scale = 1f64.min((f64::from(k.max_patches) / patches).sqrt()).min(limit / h).min(limit / w);
        let side = |x: f64| (x * scale).trunc().max(1.0).min(limit) as u64;
        let stride = u64::from(self.patch * self.merge);
        let (ph, pw) = (side(h).div_ceil(stride) * stride, side(w).div_ceil(stride) * stride);
        let patch = u64::from(self.patch);
        if ph.max(pw) / patch > 512 {
            return Err(PerfError::config(format!(
                "traffic.source.images: Kimi K3 supports at most 512 spatial patches per side after processor \
                 padding, got {}x{}",
                ph / patch,
                pw / patch
            )));
        }
        // At most 512 × 512 patches: both fit u32.
        Ok(ImageShape::single(((ph / patch) * (pw / patch)) as u32, ((ph / stride) * (pw / stride)) as u32))
    }

    /// Kimi K3: the patch embedding (temporal patch 1) and the position add, the blocks (their
    /// QKV `qkv_hidden` wide), a final norm and the temporal pool on the ViT tokens; then the
    /// PatchMergerV2 on the merged tokens, replicated on every rank (no collective): fc0,
    /// activation, fc1 to the language width, and a post-norm.
    fn kimi_ops(&self, k: &Kimi, tp: u32) -> Vec<EncoderOp> {
        let h = self.hidden;
        let mut ops = vec![
            gemm("encoder_patch_embed_gemm", 1.0, Tokens::Vit, h, self.in_channels * self.patch * self.patch, false),
            ew("encoder_position_embed", 1.0, Tokens::Vit, 2 * h, h),
        ];
        ops.extend(self.blocks(tp, k.qkv_hidden));
        let merger = h * self.merge * self.merge;
        let (on, out) = (Tokens::Merged, self.out_hidden);
        ops.extend([
            ew("encoder_final_norm", 1.0, Tokens::Vit, h, h),
            ew("encoder_patch_merge_pool", 1.0, Tokens::Vit, h, h),
            gemm("encoder_projector_fc0_gemm", 1.0, on, merger, merger, false),
            ew("encoder_projector_fc0_act", 1.0, on, merger, merger),
            gemm("encoder_projector_fc1_gemm", 1.0, on, out, merger, false),
            ew("encoder_projector_post_norm", 1.0, on, out, out),
        ]);
        ops
    }

    /// The transformer blocks both towers share (`depth` times each): add-norm, QKV, non-causal
    /// attention, out-projection, all-reduce, add-norm, FFN up, activation, FFN down,
    /// all-reduce, and the rotary pass over Q and K.
    fn vit_blocks(&self, tp: u32) -> Vec<EncoderOp> {
        self.blocks(tp, self.hidden)
    }

    /// [`Self::vit_blocks`] with a QKV projection `qkv` wide (Kimi K3's is wider than the
    /// tower; its heads are `qkv / heads` wide).
    fn blocks(&self, tp: u32, qkv: u32) -> Vec<EncoderOp> {
        let (d, h, inter) = (f64::from(self.depth), self.hidden, self.intermediate / tp);
        let on = Tokens::Vit;
        vec![
            ew("encoder_add_norm_1", d, on, 2 * h, 2 * h),
            gemm("encoder_qkv_gemm", d, on, 3 * qkv / tp, h, false),
            EncoderOp {
                name: "encoder_attention".into(),
                scale: d,
                on,
                kind: Kind::Attention { heads: self.heads / tp, head: qkv / self.heads },
            },
            gemm("encoder_proj_gemm", d, on, h, qkv / tp, true),
            all_reduce("encoder_ar_1", d, on, h),
            ew("encoder_add_norm_2", d, on, 2 * h, 2 * h),
            gemm("encoder_ffn1_gemm", d, on, inter, h, false),
            ew("encoder_act", d, on, inter, inter),
            gemm("encoder_ffn2_gemm", d, on, h, inter, true),
            all_reduce("encoder_ar_2", d, on, h),
            ew("encoder_rope_apply", d, on, 6 * qkv / tp, 6 * qkv / tp),
        ]
    }

    /// Qwen3-VL: patch-embedding GEMM over the 3-D patch volume and the position add, the
    /// blocks, then per merger instance a LayerNorm, fc0 (column-parallel), activation, fc1
    /// (row-parallel) and an all-reduce on the merged tokens.
    fn qwen3_vl_ops(&self, tp: u32) -> Vec<EncoderOp> {
        let h = self.hidden;
        let patch_volume = self.in_channels * self.temporal_patch * self.patch * self.patch;
        let mut ops = vec![
            gemm("encoder_patch_embed_gemm", 1.0, Tokens::Vit, h, patch_volume, false),
            ew("encoder_position_embed", 1.0, Tokens::Vit, 2 * h, h),
        ];
        ops.extend(self.vit_blocks(tp));
        let n = f64::from(self.instances);
        let merger = h * self.merge * self.merge;
        let on = Tokens::Merged;
        ops.extend([
            ew("encoder_merger_norm", n, Tokens::Vit, h, h),
            gemm("encoder_projector_fc0_gemm", n, on, merger / tp, merger, false),
            ew("encoder_projector_fc0_act", n, on, merger / tp, merger / tp),
            gemm("encoder_projector_fc1_gemm", n, on, self.out_hidden, merger / tp, false),
            all_reduce("encoder_projector_ar", n, on, self.out_hidden),
        ]);
        ops
    }

    /// Llama 4: a patch-embedding linear over each tile's raw patches (column-parallel, its
    /// output gathered), the CLS / position add and pre-LayerNorm, the blocks, the post-norm;
    /// then on the merged tokens pixel shuffle, the adaptor MLP (column- then row-parallel,
    /// all-reduced, GELU after each) and the connector to the language width (column-parallel,
    /// gathered).
    fn llama4_ops(&self, t: &Tiles, tp: u32) -> Result<Vec<EncoderOp>> {
        let h = self.hidden;
        for (what, dim) in [
            ("hidden_size", h),
            ("projector_input_dim", t.adapter_hidden),
            ("the language hidden_size", self.out_hidden),
        ] {
            if !dim.is_multiple_of(tp) {
                return Err(PerfError::config(format!(
                    "encoder tensor {tp} must divide Llama 4's vision {what} ({dim})"
                )));
            }
        }
        let mut ops =
            vec![gemm("encoder_patch_embedding_gemm", 1.0, Tokens::Patch, h / tp, 3 * self.patch * self.patch, false)];
        if tp > 1 {
            ops.push(all_gather("encoder_patch_embedding_all_gather", Tokens::Patch, h));
        }
        ops.push(ew("encoder_class_position_norm", 1.0, Tokens::Vit, 3 * h, 3 * h));
        ops.extend(self.vit_blocks(tp));
        ops.push(ew("encoder_post_norm", 1.0, Tokens::Vit, 2 * h, 2 * h));
        let on = Tokens::Merged;
        let merged = h * self.merge * self.merge;
        let (ah, ao) = (t.adapter_hidden / tp, t.adapter_out);
        ops.extend([
            ew("encoder_projector_pixel_shuffle", 1.0, on, merged, merged),
            gemm("encoder_projector_adapter_fc0_gemm", 1.0, on, ah, merged, false),
            ew("encoder_projector_adapter_fc0_act", 1.0, on, ah, ah),
            gemm("encoder_projector_adapter_fc1_gemm", 1.0, on, ao, t.adapter_hidden / tp, false),
            all_reduce("encoder_projector_adapter_ar", 1.0, on, ao),
            ew("encoder_projector_adapter_fc1_act", 1.0, on, ao, ao),
            gemm("encoder_projector_mm_gemm", 1.0, on, self.out_hidden / tp, ao, false),
        ]);
        if tp > 1 {
            ops.push(all_gather("encoder_projector_mm_all_gather", on, self.out_hidden));
        }
        Ok(ops)
    }

    /// Refuses a layout the reference does not run this tower in: SGLang (0.5.19) reads
    /// `--mm-enable-dp-encoder` in its Qwen-VL towers, never Llama 4's.
    pub fn check_layout(&self, layout: EncoderLayout) -> Result<()> {
        if self.tiles.is_some() && layout == EncoderLayout::Data {
            return Err(PerfError::unsupported(
                "Llama 4's vision tower is tensor-parallel only in SGLang (it does not read --mm-enable-dp-encoder); \
                 use encoder_parallel: tp",
            ));
        }
        Ok(())
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
        let sequences = Self::sequences(batch, images, shape)?;
        let mut attention: Option<AttentionTable> = None;
        let mut out = Vec::new();
        for op in self.ops(tp)? {
            let ms = self.op_ms(db, tp, sequences, shape, &op, &mut attention)?;
            out.push((op.name, ms));
        }
        Ok(out)
    }

    /// One op of [`Self::batch_ops`] alone, ms (its attention table read for it).
    pub fn batch_op_ms(
        &self,
        db: &Database,
        tp: u32,
        batch: u32,
        images: u32,
        shape: ImageShape,
        op: &EncoderOp,
    ) -> Result<f64> {
        self.op_ms(db, tp, Self::sequences(batch, images, shape)?, shape, op, &mut None)
    }

    fn sequences(batch: u32, images: u32, shape: ImageShape) -> Result<u32> {
        batch
            .checked_mul(images)
            .and_then(|n| n.checked_mul(shape.sequences))
            .ok_or_else(|| PerfError::config("encoder sequences per batch exceed 2^32"))
    }

    fn op_ms(
        &self,
        db: &Database,
        tp: u32,
        sequences: u32,
        shape: ImageShape,
        op: &EncoderOp,
        attention: &mut Option<AttentionTable>,
    ) -> Result<f64> {
        let s = match op.on {
            Tokens::Patch => shape.patches,
            Tokens::Vit => shape.vit,
            Tokens::Merged => shape.merged,
        };
        let x = sequences.checked_mul(s).ok_or_else(|| PerfError::config("encoder tokens per batch exceed 2^32"))?;
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
            Kind::AllGather { elements } => {
                if tp <= 1 {
                    0.0
                } else {
                    db.nccl("half", "all_gather", tp, f64::from(x) * f64::from(elements))?.max(0.0)
                }
            }
            Kind::Attention { heads, head } => {
                if attention.is_none() {
                    *attention = Some(AttentionTable::load(db)?);
                }
                let table = attention.as_ref().expect("loaded above");
                table.query(db, heads, head, s, sequences)?.max(0.0)
            }
        };
        Ok(ms * op.scale)
    }

    /// Bytes of one image's projected embeddings, as SGLang's multimodal embedding cache holds
    /// them: the merged tokens × the language hidden size × the merger instances, in bf16.
    pub fn embedding_bytes(&self, shape: ImageShape) -> u64 {
        shape.embedded() * u64::from(self.out_hidden) * u64::from(self.instances) * 2
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
            let tokens = f64::from(local) * shape.embedded() as f64;
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
        let vit_tokens = visuals * f64::from(shape.sequences) * f64::from(shape.vit);
        // The wider of the residual stream's three copies and this rank's QKV shard.
        let qkv = self.kimi.as_ref().map_or(self.hidden, |k| k.qkv_hidden);
        let live = (3 * self.hidden).max(3 * qkv / tp);
        let mut act = 2.0 * vit_tokens * f64::from(live);
        act += 2.0 * visuals * shape.embedded() as f64 * f64::from(self.out_hidden) * f64::from(self.instances);
        let act = act.max(32.0 * 1024.0 * 1024.0);
        let gib = (1u64 << 30) as f64;
        Ok(((weights + act) / gib, weights / gib, act / gib))
    }
}

/// The tower a language worker hosts (native VL replay): the model's Qwen3-VL or Llama 4 vision tower,
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
    if unpriced_tower(model_type) {
        return Err(PerfError::unsupported(format!(
            "{model} has no vision encoder to compile: aisimulate 0.13 does not price its {model_type} vision tower, \
             so native VL replay cannot encode its images"
        )));
    }
    if model_type == "gemma4" {
        return Err(PerfError::unsupported(format!(
            "{model}: the Gemma4ForConditionalGeneration vision family is not supported by native VL replay (its \
             images are sized from a soft-token budget, not a pixel budget or fixed tiles; aisimulate 0.13 refuses it \
             too)"
        )));
    }
    if !model_type.starts_with("qwen3_vl") && model_type != "llama4" {
        return Err(PerfError::unsupported(format!(
            "native VL replay in servesim prices Qwen3-VL and Llama 4 vision towers; the tower of '{model}' \
             ({model_type}) is not supported by servesim yet"
        )));
    }
    let mut tower = VisionTower::from_config(&root, model)?
        .ok_or_else(|| PerfError::config(format!("{model} has no vision encoder configuration")))?;
    if tower.tiles.is_some() {
        // Fixed tiles: the processor's pixel budget does not apply.
        return Ok(tower);
    }
    if let Some(lo) = min_pixels {
        tower.min_pixels = lo;
    }
    if let Some(hi) = max_pixels {
        tower.max_pixels = hi;
    }
    Ok(tower)
}

/// Whether aisimulate 0.13 leaves a family's `vision_config` unpriced (it serves the model as
/// text: Muse-Glimmer's `muse_glimmer_vision`), so the model counts as having no vision encoder.
pub fn unpriced_tower(model_type: &str) -> bool {
    model_type == "muse_glimmer"
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
    /// A sequence's raw patches (Llama 4's patch embedding, before the CLS token).
    Patch,
    /// The ViT's sequence.
    Vit,
    /// The merger's output tokens.
    Merged,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    Elementwise {
        bytes_per_token: f64,
    },
    Gemm {
        n: u32,
        k: u32,
        fp8_input: bool,
    },
    AllReduce {
        hidden: u32,
    },
    /// NCCL all-gather in half precision, `elements` per token.
    AllGather {
        elements: u32,
    },
    Attention {
        heads: u32,
        head: u32,
    },
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

/// Kimi K3's tower from its `vision_config` (MoonViT3D blocks over 14-pixel patches, a 2 × 2
/// `sd2_tpool` merge and the `patchmergerv2` projector), with the processor's default limits
/// (16384 patches, 512 a side): the reference's checks, in its words.
fn kimi_tower(root: &Value, v: &Value, what: &str) -> Result<VisionTower> {
    let int = |key: &str| field(v, key, what);
    let bad = |why: String| PerfError::config(format!("{what}: {why}"));
    let merge = match v.get("merge_kernel_size").and_then(Value::as_array).map(Vec::as_slice) {
        Some([a, b]) if a.as_u64().is_some_and(|n| n > 0) && a == b => a.as_u64().unwrap_or(0) as u32,
        _ => return Err(bad("Kimi K3 requires a square merge_kernel_size of two positive integers".into())),
    };
    for (key, want) in [("merge_type", "sd2_tpool"), ("mm_projector_type", "patchmergerv2")] {
        if v.get(key).and_then(Value::as_str) != Some(want) {
            return Err(bad(format!("Kimi K3 vision modeling requires {key}='{want}', got {}", v[key])));
        }
    }
    let hidden = int("vt_hidden_size")?;
    let heads = int("vt_num_attention_heads")?;
    let qkv_hidden = match v.get("qkv_hidden_size") {
        None | Some(Value::Null) => hidden,
        Some(_) => int("qkv_hidden_size")?,
    };
    if hidden % 2 != 0 || !qkv_hidden.is_multiple_of(heads) || !(qkv_hidden / heads).is_multiple_of(4) {
        return Err(bad(format!(
            "Kimi K3 needs an even vt_hidden_size and qkv_hidden_size ({qkv_hidden}) split into heads of a multiple \
             of 4 over vt_num_attention_heads ({heads})"
        )));
    }
    if int("mm_hidden_size")? != hidden {
        return Err(bad("Kimi K3 PatchMergerV2 requires mm_hidden_size to match vt_hidden_size".into()));
    }
    let out_hidden = int("text_hidden_size")?;
    let text_hidden = root.get("text_config").and_then(|t| t.get("hidden_size")).and_then(Value::as_u64);
    if text_hidden != Some(u64::from(out_hidden)) {
        return Err(bad(format!("Kimi K3 vision text_hidden_size ({out_hidden}) must match the language hidden_size")));
    }
    int("init_pos_emb_time")?;
    if root.get("preprocessor_config").is_some_and(|p| !p.is_null()) {
        return Err(bad("servesim reads Kimi K3's default processor limits only (16384 patches, 512 a side); its \
             preprocessor_config is not modelled"
            .into()));
    }
    Ok(VisionTower {
        depth: int("vt_num_hidden_layers")?,
        hidden,
        heads,
        intermediate: int("vt_intermediate_size")?,
        patch: int("patch_size")?,
        temporal_patch: 1,
        merge,
        out_hidden,
        in_channels: 3,
        instances: 1,
        min_pixels: 0,
        max_pixels: 0,
        tiles: None,
        kimi: Some(Kimi { qkv_hidden, max_patches: 16384, side_patches: 512 }),
    })
}

/// Llama 4's tower from its `vision_config` and `image_processor_config` (the published
/// checkpoint's widths: a 34-block ViT of 1408 over 14-pixel patches of 336-pixel tiles).
fn llama4_tower(root: &Value, v: &Value, what: &str) -> Result<VisionTower> {
    let int = |key: &str| field(v, key, what);
    let hidden = int("hidden_size")?;
    let heads = int("num_attention_heads")?;
    let intermediate = int("intermediate_size")?;
    let patch = int("patch_size")?;
    let image_size = int("image_size")?;
    let (depth, in_channels) = (int("num_hidden_layers")?, int("num_channels")?);
    let (adapter_hidden, adapter_out) = (int("projector_input_dim")?, int("projector_output_dim")?);
    let vision_out = int("vision_output_dim")?;
    let bad = |m: String| Err(PerfError::config(format!("{what}: {m}")));
    if !hidden.is_multiple_of(heads) {
        return bad(format!("vision_config.hidden_size ({hidden}) must divide by num_attention_heads ({heads})"));
    }
    let ratio = v.get("pixel_shuffle_ratio").and_then(Value::as_f64).filter(|r| *r > 0.0 && r.is_finite());
    let Some(ratio) = ratio else { return bad("vision_config.pixel_shuffle_ratio must be a positive number".into()) };
    let merge = (1.0 / ratio).round();
    if !(1.0..=64.0).contains(&merge) || (ratio * merge - 1.0).abs() > 1e-9 {
        return bad(format!("vision_config.pixel_shuffle_ratio ({ratio}) must have an integral reciprocal"));
    }
    let merge = merge as u32;
    if hidden * merge * merge != intermediate {
        return bad(format!(
            "Llama 4's pixel-shuffle width hidden_size × {merge}² must equal vision_config.intermediate_size ({intermediate})"
        ));
    }
    if adapter_out != vision_out {
        return bad(format!(
            "vision_config.projector_output_dim ({adapter_out}) must equal vision_output_dim ({vision_out})"
        ));
    }
    if !image_size.is_multiple_of(patch * merge) {
        return bad(format!("vision_config.image_size ({image_size}) must divide by patch_size × {merge}"));
    }
    let out_hidden = root
        .get("text_config")
        .and_then(|t| t.get("hidden_size"))
        .and_then(Value::as_u64)
        .and_then(|n| u32::try_from(n).ok())
        .filter(|&n| n > 0)
        .ok_or_else(|| PerfError::config(format!("{what}: text_config.hidden_size must be a positive integer")))?;
    let proc = root.get("image_processor_config").filter(|p| p.is_object()).ok_or_else(|| {
        PerfError::config(format!(
            "{what}: image_processor_config is required for Llama 4 images (max_patches, resize_to_max_canvas, \
             add_global_tile)"
        ))
    })?;
    let defaults = proc.get("image_processor_type").is_some();
    let flag = |key: &str, default: bool| -> Result<bool> {
        match proc.get(key) {
            Some(Value::Bool(b)) => Ok(*b),
            None if defaults => Ok(default),
            _ => Err(PerfError::config(format!("{what}: image_processor_config.{key} must be a boolean"))),
        }
    };
    let max_tiles = match proc.get("max_patches") {
        None if defaults => 16,
        p => p
            .and_then(Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
            .filter(|&n| (1..=1024).contains(&n))
            .ok_or_else(|| {
                PerfError::config(format!("{what}: image_processor_config.max_patches must be a positive integer"))
            })?,
    };
    Ok(VisionTower {
        depth,
        hidden,
        heads,
        intermediate,
        patch,
        temporal_patch: 1,
        merge,
        out_hidden,
        in_channels,
        instances: 1,
        min_pixels: 0,
        max_pixels: 0,
        tiles: Some(Tiles {
            image_size,
            max_tiles,
            resize_to_max_canvas: flag("resize_to_max_canvas", false)?,
            add_global_tile: flag("add_global_tile", true)?,
            adapter_hidden,
            adapter_out,
        }),
        kimi: None,
    })
}

impl Tiles {
    /// The ViT sequences of one `height × width` image: the canvas of at most `max_tiles`
    /// tiles (every `rows × cols` split of every tile count) whose scale to the image is the
    /// smallest that does not shrink it (the largest with `resize_to_max_canvas`; if every
    /// canvas shrinks it, the one that shrinks it least), the smallest such canvas by area;
    /// its tiles, plus the global thumbnail when there are several.
    pub fn sequences(&self, height: u32, width: u32) -> Result<u32> {
        if height == 0 || width == 0 {
            return Err(PerfError::config("traffic.source.images: height and width must be positive"));
        }
        let (h, w) = (f64::from(height), f64::from(width));
        let mut canvases: Vec<(u32, u32, f64)> = Vec::new();
        for count in (1..=self.max_tiles).rev() {
            for rows in 1..=count {
                if count.is_multiple_of(rows) {
                    let (ch, cw) = (rows * self.image_size, (count / rows) * self.image_size);
                    canvases.push((ch, cw, (f64::from(ch) / h).min(f64::from(cw) / w)));
                }
            }
        }
        let up = canvases.iter().map(|c| c.2).filter(|&s| s >= 1.0);
        let chosen = if self.resize_to_max_canvas {
            up.fold(None, |m: Option<f64>, s| Some(m.map_or(s, |m| m.max(s))))
        } else {
            up.fold(None, |m: Option<f64>, s| Some(m.map_or(s, |m| m.min(s))))
        };
        let chosen = chosen.unwrap_or_else(|| canvases.iter().map(|c| c.2).fold(f64::MIN, f64::max));
        let (ch, cw, _) = canvases
            .iter()
            .filter(|c| (c.2 - chosen).abs() <= 1e-12)
            .min_by_key(|c| u64::from(c.0) * u64::from(c.1))
            .copied()
            .expect("the chosen scale is one of the canvases'");
        let local = (ch / self.image_size) * (cw / self.image_size);
        Ok(local + u32::from(self.add_global_tile && local > 1))
    }
}
