//! The measured MLA tables (`mla/` and `mla_bmm/` families) and their queries:
//!
//! ```text
//! mla_context_module_perf     (mla_dtype, kv_cache_dtype, gemm_type) → native heads → [heads][isl][batch]
//! mla_generation_module_perf  (kv_cache_dtype, gemm_type)            → native heads → [heads][batch][isl + step]
//! context_mla_perf            (mla_dtype, kv_cache_dtype)            → [heads][isl][batch]
//! generation_mla_perf         (kv_cache_dtype)                       → [heads][batch][isl + step]
//! mla_bmm_perf                (bmm_dtype, op_name)                   → heads → [num_tokens]
//! ```
//!
//! Context tables blend √latency along the sequence, the others raw; beyond the measured range
//! a query holds the nearest points' utilisation against the op's roofline (`mla_ops.rs`), as
//! every grid table does. Rows merge over the table's sources first-wins. Module rows carry the
//! model they were measured on; its native head count (DeepSeek-V3 / R1 / V3.1: 128,
//! Kimi-K3: 96) keys a measurement family, and a query resolves the model's own family, the
//! only one, the nearest smaller one, or the smallest — the reference's pin and ladder. A
//! missing key is a data error (`ErrorKind::Data`), which a fallback op answers with its
//! granular chain.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use crate::db::{gen_attn_dtype, keep_row, Database};
use crate::error::{ErrorKind, PerfError, Result};
use crate::interp::{Grid, GridSpec, Node};
use crate::mla_ops::{self, MlaBmmOp, MlaKind, MlaOp};
use crate::parquet_table::{key_u32, Table};
use crate::systems::{sources, Source};

const CONTEXT_SPEC: GridSpec = GridSpec::sqrt_along(&["num_heads", "seq_len", "batch"], 1);
const GENERATION_SPEC: GridSpec = GridSpec::raw(&["num_heads", "batch", "seq_len"]);
const BMM_SPEC: GridSpec = GridSpec::raw(&["num_tokens"]);

/// Grids by string key (the dtypes a table is keyed by, joined by `/`), then by an integer
/// (native heads for module tables, heads for the BMM table, 0 otherwise).
type Keyed = BTreeMap<String, BTreeMap<u32, Grid>>;

/// One loaded MLA table and the files it was read from.
#[derive(Debug)]
pub struct MlaTable {
    grids: Keyed,
    looked: Vec<String>,
}

/// The lazily loaded MLA tables of one database.
#[derive(Debug, Default)]
pub struct MlaTables {
    context_module: OnceLock<Result<MlaTable>>,
    generation_module: OnceLock<Result<MlaTable>>,
    context: OnceLock<Result<MlaTable>>,
    generation: OnceLock<Result<MlaTable>>,
    bmm: OnceLock<Result<MlaTable>>,
}

/// The native head count of the model a module row was measured on (the reference's pin).
fn native_heads_of(model: &str) -> Option<u32> {
    match model {
        "deepseek-ai/DeepSeek-V3" | "deepseek-ai/DeepSeek-R1" | "nvidia/DeepSeek-V3.1-NVFP4" => Some(128),
        "moonshotai/Kimi-K3" => Some(96),
        _ => None,
    }
}

/// Which measured family answers a model of `native` heads: its own, the only one, the nearest
/// smaller one, else the smallest.
fn resolve_native(buckets: &BTreeMap<u32, Grid>, native: u32) -> Option<&Grid> {
    if let Some(g) = buckets.get(&native) {
        return Some(g);
    }
    if buckets.len() == 1 {
        return buckets.values().next();
    }
    buckets.range(..=native).next_back().map(|(_, g)| g).or_else(|| buckets.values().next())
}

#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Layout {
    ContextModule,
    GenerationModule,
    Context,
    Generation,
    Bmm,
}

impl Layout {
    /// Every layout, for whoever needs the tables by name (`strict_provenance`).
    pub(crate) const ALL: [Layout; 5] =
        [Layout::ContextModule, Layout::GenerationModule, Layout::Context, Layout::Generation, Layout::Bmm];

    pub(crate) fn file(self) -> &'static str {
        match self {
            Layout::ContextModule => "mla_context_module_perf.parquet",
            Layout::GenerationModule => "mla_generation_module_perf.parquet",
            Layout::Context => "context_mla_perf.parquet",
            Layout::Generation => "generation_mla_perf.parquet",
            Layout::Bmm => "mla_bmm_perf.parquet",
        }
    }
}

fn text(col: &[Option<String>], i: usize, name: &str, path: &str) -> Result<String> {
    col[i].clone().ok_or_else(|| PerfError::data(format!("{path}: null {name} in row {i}")))
}

fn load(db: &Database, layout: Layout) -> Result<MlaTable> {
    let srcs: Vec<Source> = sources(&db.spec, &db.backend, &db.version, layout.file(), db.shared_layer)?;
    let mut nodes: BTreeMap<String, BTreeMap<u32, Node>> = BTreeMap::new();
    let mut looked = Vec::new();
    for src in &srcs {
        looked.push(src.path.display().to_string());
        if !src.path.exists() {
            continue;
        }
        let t = Table::read(
            &src.path,
            &[
                "mla_dtype",
                "kv_cache_dtype",
                "gemm_type",
                "bmm_dtype",
                "op_name",
                "model",
                "num_heads",
                "tp_size",
                "batch_size",
                "isl",
                "step",
                "num_tokens",
                "latency",
                "kernel_source",
            ],
        )?;
        let p = t.path.clone();
        let ks = t.text_or_none("kernel_source")?;
        let heads = t.int("num_heads")?;
        let lat = t.float("latency")?;
        let module = matches!(layout, Layout::ContextModule | Layout::GenerationModule);
        let (kv, fmha, gemm, bmm_dt, op_name, model, tp) = (
            if layout == Layout::Bmm { &[] } else { t.text("kv_cache_dtype")? },
            if matches!(layout, Layout::ContextModule | Layout::Context) { t.text("mla_dtype")? } else { &[] },
            if module { t.text("gemm_type")? } else { &[] },
            if layout == Layout::Bmm { t.text("bmm_dtype")? } else { &[] },
            if layout == Layout::Bmm { t.text("op_name")? } else { &[] },
            if module { t.text("model")? } else { &[] },
            if module && t.has("tp_size") { t.int("tp_size")? } else { Vec::new() },
        );
        let (batch, isl, step, tokens) = if layout == Layout::Bmm {
            (Vec::new(), Vec::new(), Vec::new(), t.int("num_tokens")?)
        } else {
            let step = if matches!(layout, Layout::Generation | Layout::GenerationModule) {
                t.int("step")?
            } else {
                Vec::new()
            };
            (t.int("batch_size")?, t.int("isl")?, step, Vec::new())
        };
        for i in 0..t.rows {
            if !keep_row(src, &ks[i]) {
                continue;
            }
            let n = key_u32(&p, "num_heads", i, heads[i])?;
            let (key, bucket, path) = match layout {
                Layout::Bmm => {
                    let key = format!("{}/{}", text(bmm_dt, i, "bmm_dtype", &p)?, text(op_name, i, "op_name", &p)?);
                    (key, n, vec![key_u32(&p, "num_tokens", i, tokens[i])?])
                }
                _ => {
                    let b = key_u32(&p, "batch_size", i, batch[i])?;
                    let mut s = key_u32(&p, "isl", i, isl[i])?;
                    if !step.is_empty() {
                        s = s.saturating_add(key_u32(&p, "step", i, step[i])?);
                    }
                    let kv = text(kv, i, "kv_cache_dtype", &p)?;
                    let key = match layout {
                        Layout::ContextModule => {
                            format!("{}/{kv}/{}", text(fmha, i, "mla_dtype", &p)?, text(gemm, i, "gemm_type", &p)?)
                        }
                        Layout::GenerationModule => format!("{kv}/{}", text(gemm, i, "gemm_type", &p)?),
                        Layout::Context => format!("{}/{kv}", text(fmha, i, "mla_dtype", &p)?),
                        _ => kv,
                    };
                    let bucket = if module { module_native(model, &tp, i, n, &p)? } else { 0 };
                    let path = if matches!(layout, Layout::ContextModule | Layout::Context) {
                        vec![n, s, b]
                    } else {
                        vec![n, b, s]
                    };
                    (key, bucket, path)
                }
            };
            nodes.entry(key).or_default().entry(bucket).or_default().insert_first_wins(&path, lat[i]);
        }
    }
    if nodes.is_empty() {
        return Err(PerfError::data(format!(
            "no {} rows for {} / {} {} (looked in {})",
            layout.file().trim_end_matches(".parquet"),
            db.spec.name,
            db.backend,
            db.version,
            if looked.is_empty() { "no source file found".to_string() } else { looked.join(", ") }
        )));
    }
    let grids =
        nodes.into_iter().map(|(k, by)| (k, by.into_iter().map(|(b, n)| (b, Grid::new(n))).collect())).collect();
    Ok(MlaTable { grids, looked })
}

/// The native head family of module row `i`: the pinned head count of the row's model; a
/// sharded row (tp > 1) must hold exactly its share of it.
fn module_native(model: &[Option<String>], tp: &[i64], i: usize, heads: u32, path: &str) -> Result<u32> {
    let name = model[i].clone().unwrap_or_default();
    if name.is_empty() {
        return Err(PerfError::data(format!("{path}: MLA module row {i} names no model")));
    }
    let native = native_heads_of(&name).ok_or_else(|| {
        PerfError::data(format!(
            "{path}: MLA module row {i} was measured on {name:?}, whose native head count is not known"
        ))
    })?;
    let tp = tp.get(i).map(|&t| t.max(1) as u64).unwrap_or(1);
    if tp > 1 && heads as u64 * tp != native as u64 {
        return Err(PerfError::data(format!(
            "{path}: MLA module row {i} ({name}) has {heads} heads at tp_size {tp}, not a share of its {native} heads"
        )));
    }
    Ok(native)
}

impl Database {
    fn mla_table(&self, layout: Layout) -> Result<&MlaTable> {
        let t = &self.mla;
        let cell = match layout {
            Layout::ContextModule => &t.context_module,
            Layout::GenerationModule => &t.generation_module,
            Layout::Context => &t.context,
            Layout::Generation => &t.generation,
            Layout::Bmm => &t.bmm,
        };
        cell.get_or_init(|| load(self, layout)).as_ref().map_err(Clone::clone)
    }
}

fn missing(db: &Database, what: &str, key: &str, table: &MlaTable) -> PerfError {
    PerfError::data(format!(
        "no {what} data for {key} on {} / {} {} (have: {}; looked in {})",
        db.spec.name,
        db.backend,
        db.version,
        table.grids.keys().cloned().collect::<Vec<_>>().join(", "),
        table.looked.join(", ")
    ))
}

/// The `(full − prefix²/full)` share of a context pass's attention work that is new.
fn prefix_correction(full: u32, prefix: u32) -> f64 {
    if full == 0 {
        return 0.0;
    }
    let (f, p) = (full as f64, prefix as f64);
    (f * f - p * p) / (f * f)
}

/// The measured slice an MLA op reads (its table, dtype key and, for a module, native head
/// family), and what to call it in messages.
pub(crate) fn slice<'d>(db: &'d Database, op: &MlaOp) -> Result<(&'d Grid, &'static str)> {
    let (layout, key, what) = match op.kind {
        MlaKind::ContextModule => (
            Layout::ContextModule,
            format!("{}/{}/{}", op.fmha.name(), op.kv.name(), op.gemm.name()),
            "context MLA module",
        ),
        MlaKind::Context => (Layout::Context, format!("{}/{}", op.fmha.name(), op.kv.name()), "context MLA"),
        MlaKind::GenerationModule => {
            (Layout::GenerationModule, format!("{}/{}", op.kv.name(), op.gemm.name()), "generation MLA module")
        }
        MlaKind::Generation => (Layout::Generation, op.kv.name().to_string(), "generation MLA"),
    };
    let module = matches!(op.kind, MlaKind::ContextModule | MlaKind::GenerationModule);
    let table = db.mla_table(layout)?;
    let buckets = table.grids.get(&key).ok_or_else(|| missing(db, what, &key, table))?;
    let grid = if module { resolve_native(buckets, op.native_heads) } else { buckets.get(&0) }
        .ok_or_else(|| missing(db, what, &key, table))?;
    Ok((grid, what))
}

/// Layer latency (unscaled, before the clamp) of an MLA op: context ops for `b` sequences of `s`
/// new tokens after `prefix` cached ones; generation ops for `b` requests at KV length `s`.
fn mla_latency(db: &Database, op: &MlaOp, b: u32, s: u32, prefix: u32) -> Result<f64> {
    let spec = &db.spec;
    let n = op.heads as f64;
    if db.mode.is_sol() {
        // The rooflines the tables are interpolated with, at the query itself: a module's
        // projections never enter its context roofline; its decode one adds the two BMMs.
        return Ok(match op.kind {
            MlaKind::ContextModule | MlaKind::Context => {
                let flops = op.fmha.flops(spec)?;
                mla_ops::context_sol_prefix(spec, op.kv, flops, n, s as f64, prefix as f64, b as f64)
            }
            MlaKind::GenerationModule => {
                let attn_flops = gen_attn_dtype(spec, op.kv).flops(spec)?;
                let bmm_flops = op.gemm.flops(spec)?;
                mla_ops::generation_module_sol(spec, op.kv, op.gemm, attn_flops, bmm_flops, n, b as f64, s as f64)
            }
            MlaKind::Generation => {
                let flops = gen_attn_dtype(spec, op.kv).flops(spec)?;
                mla_ops::generation_sol(spec, op.kv, flops, n, b as f64, s as f64)
            }
        });
    }
    crate::empirical_mla::by_mode(
        db,
        || table_latency(db, op, b, s, prefix),
        || crate::empirical_mla::mla_latency(db, op, b, s, prefix),
    )
}

/// The measured layer latency of an MLA op (the tables, whatever the mode).
fn table_latency(db: &Database, op: &MlaOp, b: u32, s: u32, prefix: u32) -> Result<f64> {
    let spec = &db.spec;
    let n = op.heads as f64;
    match op.kind {
        MlaKind::ContextModule | MlaKind::Context => {
            let flops = op.fmha.flops(spec)?;
            let (grid, what) = slice(db, op)?;
            let full = s.checked_add(prefix).ok_or_else(|| PerfError::config("sequence length exceeds 2^32"))?;
            let kv = op.kv;
            let sol = move |c: &[f64]| mla_ops::context_sol(spec, kv, flops, c[0], c[1], c[2]);
            let v = grid
                .query(&CONTEXT_SPEC, &sol, &[n, full as f64, b as f64])
                .map_err(|e| e.context(format!("{what} on {} / {} {}", spec.name, db.backend, db.version)))?;
            Ok(v * prefix_correction(full, prefix))
        }
        MlaKind::GenerationModule | MlaKind::Generation => {
            let attn_flops = gen_attn_dtype(spec, op.kv).flops(spec)?;
            let module = op.kind == MlaKind::GenerationModule;
            let bmm_flops = if module { op.gemm.flops(spec)? } else { 0.0 };
            let (grid, what) = slice(db, op)?;
            let (kv, gemm) = (op.kv, op.gemm);
            let sol = move |c: &[f64]| {
                if module {
                    mla_ops::generation_module_sol(spec, kv, gemm, attn_flops, bmm_flops, c[0], c[1], c[2])
                } else {
                    mla_ops::generation_sol(spec, kv, attn_flops, c[0], c[1], c[2])
                }
            };
            grid.query(&GENERATION_SPEC, &sol, &[n, b as f64, s as f64])
                .map_err(|e| e.context(format!("{what} on {} / {} {}", spec.name, db.backend, db.version)))
        }
    }
}

/// `eval` of an MLA op: `scale × max(0, latency)`.
pub fn eval_mla(db: &Database, op: &MlaOp, b: u32, s: u32, prefix: u32) -> Result<f64> {
    let latency = if op.kind == MlaKind::Context && op.cp > 1 {
        // Prefill context parallelism: the prompt in 2·cp zigzag chunks, the busiest rank (0)
        // holding the first and the last, which attends to almost the whole prompt.
        let c = s.div_ceil(2 * op.cp).max(1);
        mla_latency(db, op, b, c, prefix)? + mla_latency(db, op, b, c, prefix + s - c)?
    } else {
        mla_latency(db, op, b, s, prefix)?
    };
    Ok(latency.max(0.0) * op.scale)
}

/// `eval` of an absorption BMM for `tokens` decode tokens: the requested format's rows, else
/// bf16's; a head count that is not a power of two takes its own rows when measured, else the
/// next power of two's scaled by the head ratio. The roofline keeps the requested format.
pub fn eval_bmm(db: &Database, op: &MlaBmmOp, tokens: u32) -> Result<f64> {
    let spec = &db.spec;
    let flops = op.dtype.flops(spec)?;
    if db.mode.is_sol() {
        // Linear in the heads, so no power-of-two routing.
        return Ok(mla_ops::bmm_sol(spec, op.dtype, flops, op.heads as f64, tokens as f64).max(0.0) * op.scale);
    }
    let v = crate::empirical_mla::by_mode(
        db,
        || bmm_table_latency(db, op, tokens, flops),
        || crate::empirical_mla::bmm_latency(db, op, tokens, flops),
    )?;
    Ok(v.max(0.0) * op.scale)
}

/// The BMM slice the empirical estimate reads: the requested format's rows when it has any,
/// else bf16's; the op's heads when measured (or a power of two), else the next power of two
/// with the head ratio to scale by. `None` for the grid when the slice is missing.
pub(crate) fn bmm_slice<'d>(db: &'d Database, op: &MlaBmmOp) -> Result<(u32, f64, Option<&'d Grid>)> {
    let table = match db.mla_table(Layout::Bmm) {
        Ok(t) => Some(t),
        Err(e) if e.kind == ErrorKind::Data => None,
        Err(e) => return Err(e),
    };
    let phase = if op.pre { "mla_gen_pre" } else { "mla_gen_post" };
    let has_quant = table.is_some_and(|t| t.grids.keys().any(|k| k.split('/').next() == Some(op.dtype.name())));
    let selected = if has_quant { format!("{}/{phase}", op.dtype.name()) } else { format!("bfloat16/{phase}") };
    let by_heads = table.and_then(|t| t.grids.get(&selected));
    let pow2 = op.heads.next_power_of_two();
    let (heads, head_scale) = if pow2 == op.heads || by_heads.is_some_and(|by| by.contains_key(&op.heads)) {
        (op.heads, 1.0)
    } else {
        (pow2, op.heads as f64 / pow2 as f64)
    };
    Ok((heads, head_scale, by_heads.and_then(|by| by.get(&heads))))
}

/// The measured BMM latency, unscaled (the tables, whatever the mode).
fn bmm_table_latency(db: &Database, op: &MlaBmmOp, tokens: u32, flops: f64) -> Result<f64> {
    let spec = &db.spec;
    let table = db.mla_table(Layout::Bmm)?;
    let phase = if op.pre { "mla_gen_pre" } else { "mla_gen_post" };
    let requested = format!("{}/{phase}", op.dtype.name());
    let has_quant = table.grids.keys().any(|k| k.split('/').next() == Some(op.dtype.name()));
    let key = if table.grids.contains_key(&requested) { requested } else { format!("bfloat16/{phase}") };
    let selected = if has_quant { format!("{}/{phase}", op.dtype.name()) } else { format!("bfloat16/{phase}") };
    let pow2 = op.heads.next_power_of_two();
    let (heads, head_scale) =
        if pow2 == op.heads || table.grids.get(&selected).is_some_and(|by| by.contains_key(&op.heads)) {
            (op.heads, 1.0)
        } else {
            (pow2, op.heads as f64 / pow2 as f64)
        };
    let by_heads = table.grids.get(&key).ok_or_else(|| missing(db, "MLA BMM", &key, table))?;
    let grid =
        by_heads.get(&heads).ok_or_else(|| missing(db, "MLA BMM", &format!("{key} with {heads} heads"), table))?;
    let dtype = op.dtype;
    let sol = move |c: &[f64]| mla_ops::bmm_sol(spec, dtype, flops, heads as f64, c[0]);
    let v = grid
        .query(&BMM_SPEC, &sol, &[tokens as f64])
        .map_err(|e| e.context(format!("MLA BMM on {} / {} {}", spec.name, db.backend, db.version)))?;
    Ok(v * head_scale)
}

/// Whether a failed primary op falls to its granular chain: the reference falls back on missing
/// data only, never on an unanchored query or a configuration error.
pub fn falls_back(e: &PerfError) -> bool {
    e.kind == ErrorKind::Data
}
