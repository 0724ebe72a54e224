//! DeepSeek sparse attention (DSA: DeepSeek-V3.2, GLM-5.x): the measured module tables of the
//! `sparse_attention/` family and the op that reads them.
//!
//! ```text
//! dsa_context_module_perf     (architecture, mla_dtype, kv_cache_dtype, gemm_type) → kernel bucket
//!                             → [num_heads][prefix][isl][batch]
//! dsa_generation_module_perf  (architecture, mla_dtype, kv_cache_dtype, gemm_type) → kernel bucket
//!                             → [num_heads][batch][isl + step]
//! ```
//!
//! One op times a layer's whole attention block (projections, the lightning indexer, top-k
//! selection and sparse MLA). Both grids blend raw latency; a query past the measured range holds
//! the nearest points' utilisation against the block's roofline below. Rows whose `op_name`
//! carries `skip_indexer` are GLM-5.2's reuse layers (they take the top-k index of an earlier
//! layer): a model whose layers share indices blends `w · full + (1 − w) · reuse` with `w` the
//! fraction of indexer-computing layers, and falls back to every layer full where the tables
//! have no matching reuse rows. Each row backs one or both kernel buckets (`trtllm`,
//! `flashmla_kv`); a query asks for `trtllm`, then `flashmla_kv`, then whatever the key holds.
//! Within one source file the last row of a coordinate wins; across sources the first.
//!
//! Context parallelism lives in the block too. SGLang's prefill CP (`cp`) reads the module at
//! the busiest rank's share of the prompt and re-times the indexer's MQA logits and top-k from
//! their own tables (`{glm5,dsv32}_mqa_logits_module_perf`, `…_topk_module_perf`), adding the
//! all-gathers of the new tokens' indexer keys and latent KV; vLLM's decode CP (`dcp`, set by
//! `dcp.rs`) reads the decode module at the gathered heads over the rank's KV stripe and
//! apportions it to the rank's share of the top-k by the roofline.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::Value;

use crate::db::{keep_row, Database, Dtype};
use crate::error::{PerfError, Result};
use crate::interp::{Grid, GridSpec, Node};
use crate::model::{logits_gemm, push_moe_ops, push_shared_beside_routed, DsaSpec, Layout, ModelSpec, Op};
use crate::moe_ops::MLA_DISTRIBUTION;
use crate::parquet_table::{key_u32, Table};
use crate::systems::{sources, SystemSpec};

pub(crate) const CONTEXT_SPEC: GridSpec = GridSpec::raw(&["num_heads", "prefix", "seq_len", "batch"]);
pub(crate) const GENERATION_SPEC: GridSpec = GridSpec::raw(&["num_heads", "batch", "seq_len"]);

/// The kernel bucket a query asks for first (the plain, non-CP path).
pub(crate) const REQUESTED_BUCKET: &str = "trtllm";

/// A DSA architecture and the attention geometry its tables and roofline assume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DsaArch {
    /// `DeepseekV32ForCausalLM`.
    DeepseekV32,
    /// `GlmMoeDsaForCausalLM` (GLM-5, 5.1, 5.2).
    GlmMoeDsa,
}

/// Widths of a DSA attention block (the tables' measured geometry, not read from the config).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DsaDims {
    pub hidden: i128,
    pub q_lora: i128,
    pub kv_lora: i128,
    pub qk_nope: i128,
    pub qk_rope: i128,
    pub v_head: i128,
    pub index_topk: i128,
    pub index_head_dim: i128,
    pub index_heads: i128,
}

impl DsaArch {
    pub fn from_architecture(arch: &str) -> Option<DsaArch> {
        match arch {
            "DeepseekV32ForCausalLM" => Some(DsaArch::DeepseekV32),
            "GlmMoeDsaForCausalLM" => Some(DsaArch::GlmMoeDsa),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DsaArch::DeepseekV32 => "DeepseekV32ForCausalLM",
            DsaArch::GlmMoeDsa => "GlmMoeDsaForCausalLM",
        }
    }

    pub fn dims(self) -> DsaDims {
        match self {
            DsaArch::DeepseekV32 => DsaDims {
                hidden: 7168,
                q_lora: 1536,
                kv_lora: 512,
                qk_nope: 128,
                qk_rope: 64,
                v_head: 128,
                index_topk: 2048,
                index_head_dim: 128,
                index_heads: 64,
            },
            DsaArch::GlmMoeDsa => DsaDims {
                hidden: 6144,
                q_lora: 2048,
                kv_lora: 512,
                qk_nope: 192,
                qk_rope: 64,
                v_head: 256,
                index_topk: 2048,
                index_head_dim: 128,
                index_heads: 32,
            },
        }
    }
}

/// Bytes per token of the fp8 indexer key cache: the key plus one fp32 scale per 128 values.
pub fn indexer_cache_entry_bytes(index_head_dim: u32) -> u32 {
    index_head_dim + index_head_dim.div_ceil(128) * 4
}

/// One DSA attention block, `scale` × its layer latency.
#[derive(Clone, Debug, PartialEq)]
pub struct DsaOp {
    pub name: String,
    pub scale: f64,
    /// The prefill module (else decode).
    pub context: bool,
    /// Heads per GPU.
    pub heads: u32,
    pub kv: Dtype,
    /// Attention compute format of the context table (decode tables are bf16).
    pub fmha: Dtype,
    /// The projections' format: the table's `gemm_type`.
    pub gemm: Dtype,
    /// Formats of the (q, kv, o, indexer) projections, for the resident weights.
    pub proj: [Dtype; 4],
    pub arch: DsaArch,
    /// Fraction of layers that run the indexer (1: every layer).
    pub full_frac: f64,
    /// Prefill context parallelism (SGLang, 1: none): the prompt round-robin split over `cp`
    /// ranks, timed by the sparse-CP composition ([`eval_dsa`]).
    pub cp: u32,
    /// Decode context parallelism (vLLM, 1: none): the KV striped over `dcp` ranks. A decode
    /// block runs the group's `heads · dcp` gathered query heads over the rank's stripe; a
    /// prefill that reuses cached context first gathers the other ranks' stripes.
    pub dcp: u32,
}

impl DsaOp {
    /// Resident weight bytes of the block on one GPU (all its layers): the down-projections and
    /// the indexer replicated, the per-head up- and output projections split over the GPU's
    /// heads, each group in its own format.
    pub fn weight_bytes(&self) -> f64 {
        let d = self.arch.dims();
        let n = self.heads as i128;
        let q = d.hidden * d.q_lora + d.q_lora * n * (d.qk_nope + d.qk_rope);
        let kv = d.hidden * (d.kv_lora + d.qk_rope) + d.kv_lora * n * (d.qk_nope + d.v_head);
        let o = n * d.v_head * d.hidden;
        let indexer = d.q_lora * d.index_head_dim * d.index_heads + d.hidden * d.index_heads;
        let bytes: f64 = [q, kv, o, indexer].iter().zip(self.proj).map(|(&e, dt)| e as f64 * dt.bytes()).sum();
        bytes * self.scale
    }
}

/// Grids of one table: key (`architecture/mla_dtype/kv/gemm`) → kernel bucket → grid, and the
/// head counts each bucket holds.
#[derive(Debug, Default)]
pub struct DsaTable {
    pub(crate) grids: BTreeMap<String, BTreeMap<String, (Grid, BTreeSet<u32>)>>,
    pub(crate) looked: Vec<String>,
}

/// The lazily loaded module tables of one database: DSA (context, generation) × (full, reuse
/// rows), then MiniMax-M3's MSA tables (context, generation), which share the DSA row schema;
/// and the sparse sub-kernel tables prefill CP reads, by (file prefix, heads).
#[derive(Debug, Default)]
pub struct DsaTables {
    cells: [OnceLock<Result<DsaTable>>; 6],
    sparse: Mutex<BTreeMap<(&'static str, u32), SparseEntry>>,
}

/// One cached load of the sparse sub-kernel tables (an error is cached too).
type SparseEntry = Arc<Result<SparseKernels>>;

/// Batch → (new tokens, cached prefix) → latency of one sparse sub-kernel.
pub(crate) type SparseGrid = BTreeMap<u32, BTreeMap<(u32, u32), f64>>;

/// The indexer's sub-kernels measured alone (`{prefix}_mqa_logits_module_perf`,
/// `{prefix}_topk_module_perf`), which prefill CP re-times at the full and the per-rank length.
#[derive(Debug, Default)]
pub(crate) struct SparseKernels {
    /// The indexer's fp8 MQA logits.
    mqa: SparseGrid,
    /// Top-k over the last rows' scores (`score_mode` other than `flat`).
    topk_last: SparseGrid,
    /// Top-k over a flat score buffer (`score_mode = flat`).
    topk_flat: SparseGrid,
    looked: Vec<String>,
}

/// The file names the DSA tables are read from.
pub const FILES: [&str; 2] = ["dsa_context_module_perf.parquet", "dsa_generation_module_perf.parquet"];

/// The kernel buckets a row backs: a bf16 KV cache has one execution path per shape (both),
/// fp8 rows the kernel they ran.
fn buckets(kernel_source: &str, kv: &str) -> &'static [&'static str] {
    if kv == "bfloat16" {
        return &["trtllm", "flashmla_kv"];
    }
    match kernel_source {
        "sglang_dsa_indexer_trtllm" | "sglang_dsa_skip_indexer_trtllm" => &["trtllm"],
        "sglang_dsa_indexer_flashmla_sparse" | "sglang_dsa_skip_indexer_flashmla_sparse" => &["flashmla_kv"],
        "sglang_dsa_dense_mha_trtllm_ragged" => &["trtllm", "flashmla_kv"],
        k if k.contains("trtllm") => &["trtllm"],
        _ => &["flashmla_kv"],
    }
}

pub(crate) fn select<'a, V>(by: &'a BTreeMap<String, V>, requested: &str) -> Option<(&'a str, &'a V)> {
    [requested, "flashmla_kv", "trtllm"]
        .into_iter()
        .find_map(|b| by.get_key_value(b))
        .or_else(|| by.iter().next())
        .map(|(k, v)| (k.as_str(), v))
}

/// Loads one module table from `file` (the DSA row schema): rows whose `op_name` carries
/// `skip_indexer` when `reuse`, else the others. `decode_fmha` false leaves the attention format
/// out of decode keys (the MSA decode table is keyed without it).
fn load(db: &Database, file: &str, context: bool, reuse: bool, decode_fmha: bool) -> Result<DsaTable> {
    let srcs = sources(&db.spec, &db.backend, &db.version, file, db.shared_layer)?;
    let mut nodes: BTreeMap<String, BTreeMap<String, (Node, BTreeSet<u32>)>> = BTreeMap::new();
    let mut looked = Vec::new();
    for src in &srcs {
        looked.push(src.path.display().to_string());
        if !src.path.exists() {
            continue;
        }
        let t = Table::read(
            &src.path,
            &[
                "op_name",
                "kernel_source",
                "architecture",
                "mla_dtype",
                "kv_cache_dtype",
                "gemm_type",
                "num_heads",
                "batch_size",
                "isl",
                "step",
                "latency",
            ],
        )?;
        let p = t.path.clone();
        let (op, ks) = (t.text_or_none("op_name")?, t.text_or_none("kernel_source")?);
        let (arch, fmha, kv, gemm) =
            (t.text("architecture")?, t.text("mla_dtype")?, t.text("kv_cache_dtype")?, t.text("gemm_type")?);
        let (heads, batch, isl, step, lat) =
            (t.int("num_heads")?, t.int("batch_size")?, t.int("isl")?, t.int("step")?, t.float("latency")?);
        let text = |col: &[Option<String>], i: usize, name: &str| {
            col[i].clone().ok_or_else(|| PerfError::data(format!("{p}: null {name} in row {i}")))
        };
        // This source's rows, the last of a coordinate winning.
        let mut rows: BTreeMap<(String, &'static str, Vec<u32>), f64> = BTreeMap::new();
        for i in 0..t.rows {
            if !keep_row(src, &ks[i]) {
                continue;
            }
            if op[i].as_deref().unwrap_or("").contains("skip_indexer") != reuse {
                continue;
            }
            let kv_name = text(kv, i, "kv_cache_dtype")?;
            let fmha_name = if context || decode_fmha { text(fmha, i, "mla_dtype")? } else { String::new() };
            let key =
                format!("{}/{fmha_name}/{kv_name}/{}", text(arch, i, "architecture")?, text(gemm, i, "gemm_type")?);
            let n = key_u32(&p, "num_heads", i, heads[i])?;
            let b = key_u32(&p, "batch_size", i, batch[i])?;
            let (s, st) = (key_u32(&p, "isl", i, isl[i])?, key_u32(&p, "step", i, step[i])?);
            let path = if context { vec![n, st, s, b] } else { vec![n, b, s.saturating_add(st)] };
            for bucket in buckets(ks[i].as_deref().unwrap_or(""), &kv_name) {
                rows.insert((key.clone(), bucket, path.clone()), lat[i]);
            }
        }
        for ((key, bucket, path), v) in rows {
            let (node, heads) = nodes.entry(key).or_default().entry(bucket.to_string()).or_default();
            heads.insert(path[0]);
            node.insert_first_wins(&path, v);
        }
    }
    let grids = nodes
        .into_iter()
        .map(|(k, by)| (k, by.into_iter().map(|(b, (n, h))| (b, (Grid::new(n), h))).collect()))
        .collect();
    Ok(DsaTable { grids, looked })
}

impl Database {
    fn dsa_table(&self, context: bool, reuse: bool) -> Result<&DsaTable> {
        let i = usize::from(!context) * 2 + usize::from(reuse);
        let file = FILES[usize::from(!context)];
        self.dsa.cells[i].get_or_init(|| load(self, file, context, reuse, true)).as_ref().map_err(Clone::clone)
    }

    /// MiniMax-M3's MSA module table (`file`), decode keys without the attention format.
    pub(crate) fn msa_table(&self, context: bool, file: &str) -> Result<&DsaTable> {
        let i = 4 + usize::from(!context);
        self.dsa.cells[i].get_or_init(|| load(self, file, context, false, false)).as_ref().map_err(Clone::clone)
    }
}

/// The sparse sub-kernel files' name prefix of an architecture.
fn sparse_prefix(arch: DsaArch) -> &'static str {
    match arch {
        DsaArch::DeepseekV32 => "dsv32",
        DsaArch::GlmMoeDsa => "glm5",
    }
}

/// Reads the sparse sub-kernel tables of `prefix` at `heads` query heads: within a source the
/// last row of a coordinate wins, across sources the first.
fn load_sparse(db: &Database, prefix: &str, heads: u32) -> Result<SparseKernels> {
    let mut out = SparseKernels::default();
    for (file, topk) in [("mqa_logits", false), ("topk", true)] {
        let file = format!("{prefix}_{file}_module_perf.parquet");
        for src in sources(&db.spec, &db.backend, &db.version, &file, db.shared_layer)? {
            out.looked.push(src.path.display().to_string());
            if !src.path.exists() {
                continue;
            }
            let t = Table::read(
                &src.path,
                &["kernel_source", "num_heads", "score_mode", "batch_size", "isl", "step", "latency"],
            )?;
            let p = t.path.clone();
            let (ks, mode) = (t.text_or_none("kernel_source")?, t.text_or_none("score_mode")?);
            let row_heads = t.int_or_none("num_heads")?;
            let (batch, isl, step, lat) = (t.int("batch_size")?, t.int("isl")?, t.int("step")?, t.float("latency")?);
            let mut rows: BTreeMap<(u8, u32, u32, u32), f64> = BTreeMap::new();
            for i in 0..t.rows {
                if !keep_row(&src, &ks[i]) || row_heads[i].is_some_and(|h| h != i64::from(heads)) {
                    continue;
                }
                let kind = match (topk, mode[i].as_deref()) {
                    (false, _) => 0,
                    (true, Some("flat")) => 2,
                    (true, _) => 1,
                };
                let coord = (
                    key_u32(&p, "batch_size", i, batch[i])?,
                    key_u32(&p, "isl", i, isl[i])?,
                    key_u32(&p, "step", i, step[i])?,
                );
                rows.insert((kind, coord.0, coord.1, coord.2), lat[i]);
            }
            for ((kind, b, s, st), v) in rows {
                let grid = match kind {
                    0 => &mut out.mqa,
                    1 => &mut out.topk_last,
                    _ => &mut out.topk_flat,
                };
                grid.entry(b).or_default().entry((s, st)).or_insert(v);
            }
        }
    }
    Ok(out)
}

impl Database {
    fn dsa_sparse(&self, arch: DsaArch, heads: u32) -> SparseEntry {
        let prefix = sparse_prefix(arch);
        let mut cache = self.dsa.sparse.lock().expect("dsa sparse tables");
        Arc::clone(cache.entry((prefix, heads)).or_insert_with(|| Arc::new(load_sparse(self, prefix, heads))))
    }
}

/// A sub-kernel measured alone at `batch` sequences of `s` new tokens after `prefix` cached:
/// the nearest measured batch and length (the smaller of two equally near), linear in the prefix
/// between measured ones and held beyond them. `Ok(None)` when nothing is measured;
/// `Err(longest)` when `s` is past the longest measured length, where these kernels grow faster
/// than linearly and the end is not held. Shared with DeepSeek-V4's CSA top-k selector
/// (`dsv4_topk.rs`).
pub(crate) fn nearest_shape_ms(
    grid: &SparseGrid,
    batch: u32,
    s: u32,
    prefix: u32,
) -> std::result::Result<Option<f64>, u32> {
    let Some(t) = grid.get(&batch).or_else(|| grid.iter().min_by_key(|(&k, _)| k.abs_diff(batch)).map(|(_, v)| v))
    else {
        return Ok(None);
    };
    let Some(longest) = t.keys().map(|k| k.0).max() else { return Ok(None) };
    if s > longest {
        return Err(longest);
    }
    let near = t.keys().map(|k| k.0).min_by_key(|&i| i.abs_diff(s)).unwrap_or(longest);
    let row: Vec<(u32, f64)> = t.range((near, 0)..=(near, u32::MAX)).map(|(k, &v)| (k.1, v)).collect();
    let (Some(&first), Some(&last)) = (row.first(), row.last()) else { return Ok(None) };
    let below = row.iter().rev().find(|p| p.0 <= prefix).copied().unwrap_or(first);
    let above = row.iter().find(|p| p.0 >= prefix).copied().unwrap_or(last);
    Ok(Some(if below.0 == above.0 {
        below.1
    } else {
        below.1 + (above.1 - below.1) * f64::from(prefix - below.0) / f64::from(above.0 - below.0)
    }))
}

fn key_of(op: &DsaOp) -> String {
    // Decode tables are measured with bf16 attention.
    let fmha = if op.context { op.fmha } else { Dtype::Bfloat16 };
    format!("{}/{}/{}/{}", op.arch.name(), fmha.name(), op.kv.name(), op.gemm.name())
}

/// Whether the reuse rows can stand in for `op`'s reuse layers: on vLLM the reuse table must
/// hold the same key, kernel bucket (asking for `bucket`) and head count as the full one;
/// elsewhere any reuse row will do.
fn has_reuse(db: &Database, op: &DsaOp, bucket: &str) -> Result<bool> {
    let reuse = db.dsa_table(op.context, true)?;
    if db.backend != "vllm" {
        return Ok(!reuse.grids.is_empty());
    }
    let full = db.dsa_table(op.context, false)?;
    let key = key_of(op);
    let (Some(f), Some(r)) = (full.grids.get(&key), reuse.grids.get(&key)) else { return Ok(false) };
    let (Some((fb, (_, fh))), Some((rb, (_, rh)))) = (select(f, bucket), select(r, bucket)) else {
        return Ok(false);
    };
    Ok(fb == rb && fh.contains(&op.heads) && rh.contains(&op.heads))
}

/// Layer latency of one table variant, asking for kernel `bucket`: context for `b` sequences of
/// `s` new tokens after `prefix` cached ones, decode for `b` requests at KV length `s`.
fn query(db: &Database, op: &DsaOp, reuse: bool, b: u32, s: u32, prefix: u32, bucket: &str) -> Result<f64> {
    let spec = &db.spec;
    let table = db.dsa_table(op.context, reuse)?;
    let key = key_of(op);
    let what = format!(
        "{} DSA module{}",
        if op.context { "context" } else { "generation" },
        if reuse { " (reuse layers)" } else { "" }
    );
    let missing = || {
        PerfError::data(format!(
            "no {what} data for {key} on {} / {} {} (have: {}; looked in {})",
            spec.name,
            db.backend,
            db.version,
            table.grids.keys().cloned().collect::<Vec<_>>().join(", "),
            table.looked.join(", ")
        ))
    };
    let (_, (grid, _)) = table.grids.get(&key).and_then(|by| select(by, bucket)).ok_or_else(missing)?;
    let flops = flops_of(db, op)?;
    let dims = op.arch.dims();
    let vllm = db.backend == "vllm";
    let (kv, fmha, gemm) = (op.kv, op.fmha, op.gemm);
    let v = if op.context {
        let sol = move |c: &[f64]| {
            context_sol(spec, &dims, kv, fmha, gemm, flops, [c[3], c[2], c[1], c[0]].map(|x| x as i128), reuse, vllm)
        };
        grid.query(&CONTEXT_SPEC, &sol, &[op.heads as f64, prefix as f64, s as f64, b as f64])
    } else {
        let sol = move |c: &[f64]| {
            generation_sol(spec, &dims, kv, gemm, flops, [c[1], c[2], c[0]].map(|x| x as i128), 1, reuse && vllm)
        };
        grid.query(&GENERATION_SPEC, &sol, &[op.heads as f64, b as f64, s as f64])
    };
    v.map_err(|e| e.context(format!("{what} on {} / {} {}", spec.name, db.backend, db.version)))
}

fn flops_of(db: &Database, op: &DsaOp) -> Result<Flops> {
    let spec = &db.spec;
    let attn = if op.context { op.fmha.flops(spec)? } else { Dtype::Bfloat16.flops(spec)? };
    Ok(Flops { gemm: op.gemm.flops(spec)?, indexer: Dtype::Fp8.flops(spec)?, attn })
}

/// `eval` of a DSA op: `scale × max(0, latency)`, the layer latency blending indexer-computing
/// and reuse layers by `full_frac` where reuse rows exist. Under decode context parallelism a
/// decode block is read at the group's gathered heads over the rank's `⌈s / dcp⌉` stripe, the
/// measured time apportioned by the roofline ratio of a top-k filtered to the rank's
/// `⌈topk / dcp⌉` owned slots against the whole top-k (the indexer still scores the stripe);
/// a prefill over cached context adds the gather of the other ranks' stripes. Prefill context
/// parallelism takes [`cp_context`].
pub fn eval_dsa(db: &Database, op: &DsaOp, b: u32, s: u32, prefix: u32) -> Result<f64> {
    let dcp = op.dcp.max(1);
    let striped;
    let (op, s) = if op.context || dcp == 1 {
        (op, s)
    } else {
        striped = DsaOp { heads: op.heads * dcp, ..op.clone() };
        (&striped, s.div_ceil(dcp))
    };
    let bucket = if op.context && op.cp > 1 { "flashmla_kv" } else { REQUESTED_BUCKET };
    let w = if op.full_frac >= 1.0 || has_reuse(db, op, bucket)? { op.full_frac } else { 1.0 };
    if op.context && op.cp > 1 {
        let full = cp_context(db, op, false, b, s, prefix)? * op.scale;
        let v = if w >= 1.0 { full } else { w * full + (1.0 - w) * cp_context(db, op, true, b, s, prefix)? * op.scale };
        return Ok(match cached_gather(db, op, b, prefix, w)? {
            Some(g) => (v + g * op.scale).max(0.0),
            None => v,
        });
    }
    let one = |reuse: bool| -> Result<f64> {
        let v = query(db, op, reuse, b, s, prefix, bucket)?;
        Ok(if op.context || dcp == 1 { v } else { v * owned_topk_ratio(db, op, reuse, b, s)? })
    };
    let full = one(false)?;
    let mut v = if w >= 1.0 { full } else { w * full + (1.0 - w) * one(true)? };
    if op.context {
        v += cached_gather(db, op, b, prefix, w)?.unwrap_or(0.0);
    }
    Ok(v.max(0.0) * op.scale)
}

/// The decode roofline with the sparse attention over the rank's owned `⌈topk / dcp⌉` slots,
/// over the one with the whole top-k, in `[0, 1]` (`op` holds the gathered heads, `s` the
/// stripe).
fn owned_topk_ratio(db: &Database, op: &DsaOp, reuse: bool, b: u32, s: u32) -> Result<f64> {
    let flops = flops_of(db, op)?;
    let no_indexer = reuse && db.backend == "vllm";
    let at = [b, s, op.heads].map(i128::from);
    let sol = |div: u32| generation_sol(&db.spec, &op.arch.dims(), op.kv, op.gemm, flops, at, div, no_indexer);
    let (whole, owned) = (sol(1), sol(op.dcp));
    Ok(if whole > 0.0 { (owned / whole).clamp(0.0, 1.0) } else { 1.0 })
}

/// The all-gather of the cached context's stripes a DCP rank pays before a prefill attends to
/// it (unscaled, ms; `None` without DCP or cache): per cached token the latent KV entry and the
/// indexer key, the latter only on the `w` share of layers that run the indexer.
fn cached_gather(db: &Database, op: &DsaOp, b: u32, prefix: u32, w: f64) -> Result<Option<f64>> {
    if op.dcp <= 1 || prefix == 0 || b == 0 {
        return Ok(None);
    }
    let elements = 576.0 * op.kv.bytes() / 2.0 + w.clamp(0.0, 1.0) * 128.0;
    let cached = f64::from(b.saturating_mul(prefix));
    Ok(Some(db.nccl("half", "all_gather", op.dcp, cached * elements)?))
}

/// The sparse sub-kernel tables `op`'s prefill CP reads, refused by name where a table is empty.
fn cp_kernels(db: &Database, op: &DsaOp) -> Result<SparseEntry> {
    let kernels = db.dsa_sparse(op.arch, op.heads);
    let k = kernels.as_ref().as_ref().map_err(Clone::clone)?;
    let missing: Vec<&str> = [("mqa", &k.mqa), ("topk_last", &k.topk_last), ("topk_flat", &k.topk_flat)]
        .into_iter()
        .filter(|(_, g)| g.is_empty())
        .map(|(n, _)| n)
        .collect();
    if !missing.is_empty() {
        let p = sparse_prefix(op.arch);
        return Err(PerfError::data(format!(
            "DSA prefill context parallelism (cp_size={}) of {} needs the sparse indexer tables ['{}'] at \
             num_heads={}: no rows in {p}_mqa_logits_module_perf.parquet / {p}_topk_module_perf.parquet for {} / {} \
             {}{}",
            op.cp,
            op.arch.name(),
            missing.join("', '"),
            op.heads,
            db.spec.name,
            db.backend,
            db.version,
            if k.looked.is_empty() { String::new() } else { format!(" (looked in {})", k.looked.join(", ")) }
        )));
    }
    Ok(kernels)
}

/// Checks before the first pass that the prefill CP blocks among `ops` find their sparse
/// sub-kernel tables (a graph whose layers all reuse the top-k index needs none).
pub(crate) fn check_cp_tables(db: &Database, ops: &[Op]) -> Result<()> {
    for op in ops {
        if let Op::Dsa(d) = op {
            if d.context && d.cp > 1 && d.full_frac > 0.0 {
                cp_kernels(db, d)?;
            }
        }
    }
    Ok(())
}

/// One layer variant of a prefill split round-robin over `op.cp` ranks (unscaled, ms): the
/// module table (kernel bucket `flashmla_kv`) at the busiest rank's `⌈s / cp⌉` new tokens, with
/// the indexer's MQA logits and top-k re-timed from their own tables (the whole prompt's cost
/// shared over the ranks in place of the per-rank one the module measured), plus the
/// all-gathers of every new token's indexer key and latent KV. Reuse layers run no indexer:
/// neither the re-timing nor the key gather.
fn cp_context(db: &Database, op: &DsaOp, reuse: bool, b: u32, s: u32, prefix: u32) -> Result<f64> {
    let cp = op.cp;
    let per_rank = s.div_ceil(cp).max(1);
    let mut v = query(db, op, reuse, b, per_rank, prefix, "flashmla_kv")?;
    if !reuse {
        let kernels = cp_kernels(db, op)?;
        let k = kernels.as_ref().as_ref().map_err(Clone::clone)?;
        let at = |grid: &SparseGrid, s: u32| {
            nearest_shape_ms(grid, b, s, prefix).map_err(|longest| {
                PerfError::data(format!(
                    "DSA CP: isl={s} exceeds the collected sparse-kernel grid (max isl={longest}); the indexer's \
                     kernels grow faster than linearly with the prompt, so servesim does not clamp it"
                ))
            })
        };
        let lookups = (at(&k.mqa, s)?, at(&k.mqa, per_rank)?, at(&k.topk_last, s)?, at(&k.topk_flat, per_rank)?);
        if let (Some(mqa_all), Some(mqa_rank), Some(last_all), Some(flat_rank)) = lookups {
            let cp = f64::from(cp);
            v += (mqa_all / cp - mqa_rank) + (last_all / cp - flat_rank);
        }
    }
    let d = op.arch.dims();
    let tokens = f64::from(b) * f64::from(s);
    if !reuse {
        v += db.nccl("half", "all_gather", cp, tokens * d.index_head_dim as f64)?;
    }
    v += db.nccl("half", "all_gather", cp, tokens * (d.kv_lora + d.qk_rope) as f64)?;
    Ok(v)
}

/// Why `op` has no FPM roofline: a prefill block under context parallelism, whose composition
/// reads measured sub-kernel tables only (the reference's words).
pub(crate) fn fpm_refusal(op: &DsaOp) -> Option<PerfError> {
    (op.context && op.cp > 1).then(|| {
        PerfError::unsupported(format!(
            "forward_model='fpm' SOL roofline has no implementation for DSA context parallelism (cp_size={}) \
             on op {} (as in the reference: the prefill CP block is timed from measured tables only)",
            op.cp, op.name
        ))
    })
}

/// The block's speed-of-light time at an FPM table's per-request coordinates (ms, scaled): the
/// FPM roofline transfer hands `batch`, new tokens `s` and cached `prefix` (decode: the KV
/// length `s`) as fractions, which the block's integer roofline takes rounded to the nearest
/// whole (`batch` and `s` at least one). A prefill blends the indexer-computing and reuse
/// layers by `full_frac` as it stands (no table is asked whether reuse rows exist); a decode
/// step blends them on vLLM only (elsewhere every layer prices the indexer). Prefill context
/// parallelism composes measured sub-kernel tables and has no roofline: refused by name, as
/// the reference does (decode context parallelism is refused for every family before, in
/// [`crate::estimator::Estimator::fpm_sol_ms`]).
pub fn fpm_sol(db: &Database, op: &DsaOp, batch: f64, s: f64, prefix: f64) -> Result<f64> {
    if let Some(e) = fpm_refusal(op) {
        return Err(e);
    }
    let whole = |v: f64, least: f64| v.round().max(least) as i128;
    let (spec, dims, vllm, flops) = (&db.spec, op.arch.dims(), db.backend == "vllm", flops_of(db, op)?);
    let (b, s, prefix, heads) = (whole(batch, 1.0), whole(s, 1.0), whole(prefix, 0.0), i128::from(op.heads));
    let sol = |reuse: bool| {
        if op.context {
            context_sol(spec, &dims, op.kv, op.fmha, op.gemm, flops, [b, s, prefix, heads], reuse, vllm)
        } else {
            generation_sol(spec, &dims, op.kv, op.gemm, flops, [b, s, heads], 1, reuse && vllm)
        }
    };
    let w = if op.context || vllm { op.full_frac } else { 1.0 };
    let v = if w >= 1.0 { sol(false) } else { w * sol(false) + (1.0 - w) * sol(true) };
    Ok(v.max(0.0) * op.scale)
}

/// Tensor-core rates of a sparse-attention block's three op groups.
#[derive(Clone, Copy)]
pub(crate) struct Flops {
    pub gemm: f64,
    pub indexer: f64,
    pub attn: f64,
}

/// Roofline (ms): the three groups' math at their rates, or moving `bytes`, whichever is slower.
pub(crate) fn finish(spec: &SystemSpec, flops: Flops, ops: [i128; 3], bytes: f64) -> f64 {
    let math = (ops[0] as f64 / flops.gemm + ops[1] as f64 / flops.indexer + ops[2] as f64 / flops.attn) * 1000.0;
    math.max(bytes / spec.mem_bw * 1000.0)
}

/// Projection work of `tokens` tokens: (GEMM ops, weight elements). A layer that skips the
/// indexer and prices that (`no_indexer`) drops its projections too.
fn projections(d: &DsaDims, tokens: i128, heads: i128, no_indexer: bool) -> (i128, i128) {
    let (ih, idim) = if no_indexer { (0, 0) } else { (d.index_heads, d.index_head_dim) };
    let qk = d.qk_nope + d.qk_rope;
    let out = d.q_lora + d.kv_lora + d.qk_rope + idim;
    let ops = 2 * tokens * d.hidden * out
        + 2 * tokens * d.q_lora * heads * qk
        + 2 * tokens * d.q_lora * ih * d.index_head_dim
        + 2 * tokens * d.hidden * ih
        + 2 * tokens * heads * d.v_head * d.hidden
        + 2 * heads * tokens * d.qk_nope * d.kv_lora
        + 2 * heads * tokens * d.kv_lora * d.v_head;
    let weights = d.hidden * out
        + d.q_lora * heads * qk
        + d.q_lora * ih * d.index_head_dim
        + d.hidden * ih
        + heads * d.v_head * d.hidden;
    (ops, weights)
}

/// Prefill roofline (ms) of `[b, s, prefix, heads]`: projections, the fp8 indexer logits (only
/// when the sequence outgrows the top-k window) and sparse MLA over
/// `Σ_{i<s} min(prefix + i + 1, topk)` key pairs. Reuse layers run no indexer; on vLLM they
/// also skip its projections.
#[allow(clippy::too_many_arguments)]
fn context_sol(
    spec: &SystemSpec,
    d: &DsaDims,
    kv: Dtype,
    fmha: Dtype,
    gemm: Dtype,
    flops: Flops,
    [b, s, prefix, heads]: [i128; 4],
    reuse: bool,
    vllm: bool,
) -> f64 {
    let topk = d.index_topk;
    let full = s + prefix;
    let tokens = b * s;
    let (gemm_ops, weights) = projections(d, tokens, heads, reuse && vllm);
    let indexer = !reuse && full > topk;
    let indexer_ops = if indexer { 2 * tokens * d.index_heads * d.index_head_dim * full } else { 0 };
    let pairs = if full <= topk {
        b * (full * (full + 1) - prefix * (prefix + 1)) / 2
    } else if prefix >= topk {
        tokens * topk
    } else {
        b * (topk * (topk + 1) - prefix * (prefix + 1)) / 2 + b * (full - topk) * topk
    };
    let attn_width = d.kv_lora + d.qk_rope;
    let attn_ops = 2 * heads * (attn_width + d.kv_lora) * pairs;
    let kv_bytes = (b * heads * full.min(topk) * attn_width) as f64 * kv.bytes();
    let indexer_bytes =
        if indexer { (b * full * indexer_cache_entry_bytes(d.index_head_dim as u32) as i128) as f64 } else { 0.0 };
    let q_bytes = (tokens * heads * (d.qk_nope + d.qk_rope)) as f64 * fmha.bytes() * 2.0;
    let bytes = weights as f64 * gemm.bytes() + kv_bytes + indexer_bytes + q_bytes;
    finish(spec, flops, [gemm_ops, indexer_ops, attn_ops], bytes)
}

/// Decode roofline (ms) of `[b, s, heads]`, one token per request, the sparse attention over
/// `⌈topk / topk_div⌉` keys at most; `no_indexer` (vLLM reuse layers) drops the indexer's
/// projections, logits and cache reads.
#[allow(clippy::too_many_arguments)]
fn generation_sol(
    spec: &SystemSpec,
    d: &DsaDims,
    kv: Dtype,
    gemm: Dtype,
    flops: Flops,
    [b, s, heads]: [i128; 3],
    topk_div: u32,
    no_indexer: bool,
) -> f64 {
    let (gemm_ops, weights) = projections(d, b, heads, no_indexer);
    let ih = if no_indexer { 0 } else { d.index_heads };
    let div = i128::from(topk_div.max(1));
    let effective = s.min((d.index_topk + div - 1) / div);
    let attn_width = d.kv_lora + d.qk_rope;
    let indexer_ops = 2 * b * ih * d.index_head_dim * s;
    let attn_ops = 2 * b * heads * (attn_width + d.kv_lora) * effective;
    let indexer_bytes =
        if no_indexer { 0.0 } else { (b * s * indexer_cache_entry_bytes(d.index_head_dim as u32) as i128) as f64 };
    let bytes = weights as f64 * gemm.bytes() + indexer_bytes + (b * effective * attn_width) as f64 * kv.bytes();
    finish(spec, flops, [gemm_ops, indexer_ops, attn_ops], bytes)
}

/// Fraction of a model's layers that compute the indexer when `index_topk_freq` layers share
/// one top-k index: a layer reuses when `index_topk_pattern[layer] == 'S'`, else (with an
/// offset) when `max(layer − offset + 1, 0) % freq ≠ 0`, else when `max(layer − 1, 0) % freq ≠
/// 0`. GLM-5.2 (freq 4, offset 3, 78 layers): 21 / 78.
pub fn full_layer_fraction(freq: u32, pattern: Option<&str>, offset: Option<i64>, layers: u32) -> f64 {
    if (freq <= 1 && pattern.is_none()) || layers == 0 {
        return 1.0;
    }
    let freq = i64::from(freq.max(1));
    let reuses = |layer: i64| match (pattern, offset) {
        (Some(p), _) => p.as_bytes().get(layer as usize) == Some(&b'S'),
        (None, Some(o)) => (layer - o + 1).max(0) % freq != 0,
        (None, None) => (layer - 1).max(0) % freq != 0,
    };
    let full = (0..i64::from(layers)).filter(|&l| !reuses(l)).count();
    full as f64 / layers as f64
}

/// The DSA facts of a `config.json`: the architecture's geometry, the indexer-sharing fraction
/// and the dense first layers' formats under the checkpoint's exclusion `patterns`.
pub fn spec_from_config(cfg: &Value, arch: &str, layers: u32, patterns: &[String], shown: &str) -> Result<DsaSpec> {
    let arch = DsaArch::from_architecture(arch)
        .ok_or_else(|| PerfError::unsupported(format!("{shown}: {arch} is not a DSA architecture")))?;
    let freq = cfg.get("index_topk_freq").and_then(Value::as_u64).unwrap_or(1).max(1) as u32;
    let pattern = match cfg.get("index_topk_pattern") {
        Some(Value::String(p)) => Some(p.clone()),
        Some(Value::Array(a)) => Some(a.iter().map(|x| if x.as_str() == Some("S") { 'S' } else { 'F' }).collect()),
        _ => None,
    };
    let offset = cfg.get("index_skip_topk_offset").and_then(Value::as_i64);
    let full_frac = full_layer_fraction(freq, pattern.as_deref(), offset, layers);
    let dense = cfg.get("first_k_dense_replace").and_then(Value::as_u64).unwrap_or(0).min(layers as u64) as u32;
    let mut dense_groups: Vec<(u32, bool, bool)> = Vec::new();
    for layer in 0..dense {
        let key = (dense_bf16(patterns, layer, true), dense_bf16(patterns, layer, false));
        match dense_groups.iter_mut().find(|g| (g.1, g.2) == key) {
            Some(g) => g.0 += 1,
            None => dense_groups.push((1, key.0, key.1)),
        }
    }
    let attn_bf16 = attention_bf16(patterns, false);
    let attn_bf16_precise = attention_bf16(patterns, true);
    let width =
        |k: &str, default: u32| cfg.get(k).and_then(Value::as_u64).filter(|&v| v > 0).unwrap_or(default as u64) as u32;
    let kv_dims = [width("kv_lora_rank", 512), width("qk_rope_head_dim", 64), width("index_head_dim", 128)];
    Ok(DsaSpec { arch, full_frac, dense_groups, attn_bf16, attn_bf16_precise, kv_dims })
}

/// Which attention projection groups (q, kv, o, indexer) exclusion `patterns` keep in bf16.
/// Loosely, a pattern naming `self_attn` but none of the block's projections (or its indexer)
/// covers the whole block; by precise module paths only a pattern ending at the block
/// (`self_attn`, `self_attn*`, `self_attn.*`) does, so norm exclusions leave the projections
/// quantised, and the indexer counts only as the block or by its GEMMs. (Compressed-tensors
/// `re:` patterns are not evaluated on the precise path.)
fn attention_bf16(patterns: &[String], precise: bool) -> [bool; 4] {
    let indexer: &[&str] = if precise { &["indexer.wq_b", "indexer.wk", "indexer.weights_proj"] } else { &["indexer"] };
    let groups: [&[&str]; 4] = [
        &["q_a_proj", "q_b_proj", "q_proj"],
        &["kv_a_proj", "kv_b_proj", "kv_proj", "k_proj", "v_proj"],
        &["o_proj"],
        indexer,
    ];
    let block_end = |rest: &str| matches!(rest, "" | "*" | ".*" | r"\..*");
    let mut out = [false; 4];
    for p in patterns {
        if precise && p.starts_with("re:") {
            continue;
        }
        let names_block = match p.rsplit_once("self_attn") {
            None => false,
            Some((_, rest)) if precise => block_end(rest),
            Some(_) => !groups.iter().flat_map(|g| g.iter()).any(|m| p.contains(m)),
        };
        if names_block {
            return [true; 4];
        }
        if precise && p.rsplit_once("indexer").is_some_and(|(_, rest)| block_end(rest)) {
            out[3] = true;
        }
        for (hit, markers) in out.iter_mut().zip(groups) {
            *hit |= markers.iter().any(|m| p.contains(m));
        }
    }
    out
}

/// Whether the checkpoint keeps dense layer `layer`'s fused gate/up (`gate_up`) or down
/// projection in bf16: a pattern naming the module path literally, or a glob (`*` any run)
/// matching the module's path or one of its dotted parts.
fn dense_bf16(patterns: &[String], layer: u32, gate_up: bool) -> bool {
    let shards: &[&str] = if gate_up { &["gate_proj", "up_proj"] } else { &["down_proj"] };
    let literal = shards.iter().all(|shard| {
        let path = format!(".model.layers.{layer}.mlp.{shard}.");
        patterns.iter().any(|p| path.contains(&format!(".{}.", p.trim_end_matches('.'))))
    });
    if literal {
        return true;
    }
    let name = format!("model.layers.{layer}.mlp.{}", if gate_up { "gate_up_proj" } else { "down_proj" });
    patterns.iter().any(|p| glob(p, &name) || name.split('.').any(|part| glob(p, part)))
}

/// `*` matches any run of characters, everything else itself; the whole text must match.
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut i, mut j, mut star, mut mark) = (0, 0, None, 0);
    while j < t.len() {
        if i < p.len() && p[i] != b'*' && p[i] == t[j] {
            (i, j) = (i + 1, j + 1);
        } else if i < p.len() && p[i] == b'*' {
            (star, mark, i) = (Some(i), j, i + 1);
        } else if let Some(s) = star {
            (i, mark, j) = (s + 1, mark + 1, mark + 1);
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&c| c == b'*')
}

/// `(context ops, generation ops)` of a DSA model, as the reference's `DeepSeekV32Model` lays
/// them out (fused MoE path):
///
/// ```text
/// embedding, add_norm_1, attention (DSA module), add_norm_2,
/// [SGLang, one stage, no MTP / attention DP: dense first layers — attention all-reduce,
///  gate/up GEMM, act, down GEMM, FFN all-reduce],
/// shared expert (gate/up GEMM, act, down GEMM), router GEMM, dispatch, experts, combine,
/// logits GEMM, p2p
/// ```
///
/// The MoE ops count the MoE layers only when the dense layers are timed apart, else every
/// layer. Decode runs the shared expert beside the routed chain (the slower of the two) and MTP
/// scales it by `(L + nextn) / L`. The shared expert is split over `moe_tp`. The attention
/// block's table is keyed by one projection format, the output projection's; indices shared
/// across layers (GLM-5.2) blend reuse layers in on SGLang and vLLM.
pub fn build_dsa_ops(m: &ModelSpec, l: &Layout) -> Result<(Vec<Op>, Vec<Op>)> {
    let d = m.dsa.as_ref().ok_or_else(|| PerfError::config(format!("{}: not a DSA model", m.name)))?;
    if l.ngram > 0 {
        return Err(PerfError::unsupported(format!("{}: ngram verification of DSA attention is not modelled", m.name)));
    }
    let (tp, h) = (l.tp, m.hidden);
    let layers = m.layers as f64;
    let mtp = if l.nextn == 0 { 1.0 } else { (l.nextn as f64 + layers) / layers };
    let sglang = l.backend == "sglang";
    let dense_apart = sglang && l.pp == 1 && l.cp == 1 && l.attention_dp == 1 && l.nextn == 0;
    let groups: &[(u32, bool, bool)] = if dense_apart { &d.dense_groups } else { &[] };
    if !groups.is_empty() && (m.inter == 0 || !m.inter.is_multiple_of(tp)) {
        return Err(PerfError::config(format!(
            "{}: the dense layers' intermediate_size {} must be positive and divisible by tp={tp}",
            m.name, m.inter
        )));
    }
    let moe_layers = layers - groups.iter().map(|g| g.0 as f64).sum::<f64>();
    let full_frac = if sglang || l.backend == "vllm" { d.full_frac } else { 1.0 };
    let gemm_of = |bf16: bool| if bf16 { Dtype::Bfloat16 } else { l.gemm };
    // The projections' formats; the module table is keyed by the output projection's.
    let proj = if l.backend == "vllm" { d.attn_bf16_precise } else { d.attn_bf16 }.map(gemm_of);
    let act = 2.0;
    let dsa = |ctx: bool, scale: f64| {
        Op::Dsa(DsaOp {
            name: if ctx { "context_attention" } else { "generation_attention" }.into(),
            scale,
            context: ctx,
            heads: m.heads / tp,
            kv: l.kv,
            fmha: l.fmha,
            gemm: proj[2],
            proj,
            arch: d.arch,
            full_frac,
            cp: if ctx { l.cp.max(1) } else { 1 },
            dcp: 1,
        })
    };
    if l.moe_comm.is_large_ep() && sglang {
        return Ok(crate::wideep_mla::dsa_ops(m, l, dsa));
    }
    let mut out = (Vec::new(), Vec::new());
    for (ctx, list) in [(true, &mut out.0), (false, &mut out.1)] {
        let phase = if ctx { "context" } else { "generation" };
        let nm = |x: &str| format!("{phase}_{x}");
        let s = if ctx { 1.0 } else { mtp };
        let ls = layers * s;
        let gemm = Op::gemm;
        // Under prefill CP the norms run on the busiest rank's floored share of the tokens;
        // every other op of the graph sees the whole prompt (the attention block splits it itself).
        let add_norm = |name: &str| {
            let op = Op::Elementwise { name: nm(name), scale: ls, bytes_per_token: (2 * h + 2 * h) as f64 * act };
            if ctx && l.cp > 1 {
                Op::TokenScale { op: Box::new(op), num: 1, den: l.cp }
            } else {
                op
            }
        };
        list.push(Op::Embedding { name: nm("embedding"), scale: s, bytes_per_token: h as f64 * 2.0 });
        list.push(add_norm("add_norm_1"));
        list.push(dsa(ctx, ls));
        list.push(add_norm("add_norm_2"));
        for (i, &(count, gate_bf16, down_bf16)) in groups.iter().enumerate() {
            let prefix = if groups.len() == 1 { format!("{phase}_dense") } else { format!("{phase}_dense_{i}") };
            let (c, inter) = (count as f64, m.inter / tp);
            list.extend([
                Op::AllReduce { name: format!("{prefix}_attn_ar"), scale: c, hidden: h, tp },
                gemm(format!("{prefix}_gate_up_gemm"), c, 2 * inter, h, gemm_of(gate_bf16), false),
                Op::Elementwise {
                    name: format!("{prefix}_act_gate"),
                    scale: c,
                    bytes_per_token: (2 * inter + inter) as f64 * act,
                },
                gemm(format!("{prefix}_down_gemm"), c, h, inter, gemm_of(down_bf16), true),
                Op::AllReduce { name: format!("{prefix}_ffn_ar"), scale: c, hidden: h, tp },
            ]);
        }
        if moe_layers > 0.0 {
            let ms = moe_layers * s;
            let inter = m.moe_inter / l.moe_tp;
            let shared = vec![
                gemm(nm("shared_gate_up_gemm"), ms, 2 * inter, h, l.shared_gemm, false),
                Op::Elementwise { name: nm("shared_act_gate"), scale: ms, bytes_per_token: (3 * inter) as f64 * act },
                gemm(nm("shared_ffn2_gemm"), ms, h, inter, l.shared_gemm, false),
            ];
            let mut routed = Vec::new();
            push_moe_ops(&mut routed, m, l, ctx, ms, MLA_DISTRIBUTION);
            if !ctx && l.cp > 1 {
                // A decode step behind the CP ranks' replicated attention: only the combine
                // all-reduces.
                for op in &mut routed {
                    if let Op::MoeDispatch(d) = op {
                        *d = d.clone().behind_replicated_cp(l.cp);
                    }
                }
            }
            push_shared_beside_routed(list, ctx, phase, shared, routed);
        }
        list.push(logits_gemm(nm("logits_gemm"), s, m, tp));
        list.push(Op::pipeline_p2p(nm("p2p"), s, h, l));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glm52_shares_indices_over_four_layers() {
        assert_eq!(full_layer_fraction(4, None, Some(3), 78), 21.0 / 78.0);
        assert_eq!(full_layer_fraction(1, None, None, 61), 1.0);
        assert_eq!(full_layer_fraction(2, Some("FSFS"), None, 4), 0.5);
    }

    #[test]
    fn indexer_entry_carries_one_scale_per_128_values() {
        assert_eq!(indexer_cache_entry_bytes(128), 132);
    }

    #[test]
    fn dense_layer_exclusions() {
        let p = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // GLM-5.2-NVFP4 keeps its first layers whole in bf16.
        let glm = p(&["model.layers.0*", "model.layers.1.*", "model.layers.10.self_attn*"]);
        assert!(dense_bf16(&glm, 0, true) && dense_bf16(&glm, 1, false));
        assert!(!dense_bf16(&glm, 2, true));
        assert!(dense_bf16(&p(&["model.layers.2.mlp.down_proj"]), 2, false));
        assert!(!dense_bf16(&p(&["model.layers.2.mlp.down_proj"]), 2, true));
        let norm = p(&["model.layers.3.self_attn.kv_a_layernorm"]);
        assert_eq!((attention_bf16(&norm, false), attention_bf16(&norm, true)), ([true; 4], [false; 4]));
        assert_eq!(attention_bf16(&p(&["model.layers.3.self_attn*"]), true), [true; 4]);
        // DeepSeek-V3.2-NVFP4: q / kv / indexer named one by one, o_proj quantised.
        let v32 = p(&[
            "model.layers.0.self_attn.indexer*",
            "model.layers.0.self_attn.kv_b_proj",
            "model.layers.0.self_attn.q_a_proj",
        ]);
        assert_eq!(attention_bf16(&v32, true), [true, true, false, true]);
        assert_eq!(attention_bf16(&v32, false), [true, true, false, true]);
        assert!(glob("a*c", "abbc") && !glob("a*c", "abcd") && glob("*", ""));
    }
}
