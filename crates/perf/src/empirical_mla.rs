//! The EMPIRICAL / HYBRID estimate of MLA attention (context and generation, kernel and module
//! tables) and of its absorption BMMs: the op's roofline at the query over a utilisation read
//! off its own measured slice (`empirical.rs`'s grid). MLA borrows from no other slice: a query
//! whose slice has no points is a miss.
//!
//! Context samples are full-attention points; the query's roofline carries its cached prefix
//! (no prefix correction is applied to the estimate). A module's decode roofline includes its
//! two BMMs, as its table's does.

use crate::db::{gen_attn_dtype, Database, DatabaseMode};
use crate::empirical::{self, UtilGrid};
use crate::error::{ErrorKind, PerfError, Result};
use crate::mla_ops::{self, MlaBmmOp, MlaKind, MlaOp};

/// Under EMPIRICAL an estimate without points is refused rather than a table miss (the reference
/// raises it as not implemented, so a module op does not fall to its granular chain on it);
/// under HYBRID it stays a miss, and a module op falls back as on SILICON.
fn refused(db: &Database, e: PerfError) -> PerfError {
    if e.kind == ErrorKind::Data && db.mode == DatabaseMode::Empirical {
        PerfError::unsupported(format!("database_mode {}: {}", db.mode.name(), e.message))
    } else {
        e
    }
}

/// `table()` under SILICON, `estimate()` under EMPIRICAL, and under HYBRID the table unless it
/// misses its slice.
pub(crate) fn by_mode(
    db: &Database,
    table: impl FnOnce() -> Result<f64>,
    estimate: impl FnOnce() -> Result<f64>,
) -> Result<f64> {
    match db.mode {
        DatabaseMode::Empirical => estimate(),
        DatabaseMode::Hybrid => match table() {
            Err(e) if e.kind == ErrorKind::Data => estimate(),
            r => r,
        },
        _ => table(),
    }
}

/// A roofline over table coordinates.
type Sol<'a> = Box<dyn Fn(&[f64]) -> f64 + 'a>;

/// The estimated layer latency of an MLA op (unscaled): context ops for `b` sequences of `s` new
/// tokens after `prefix` cached ones, generation ops for `b` requests at KV length `s`, ms.
pub(crate) fn mla_latency(db: &Database, op: &MlaOp, b: u32, s: u32, prefix: u32) -> Result<f64> {
    let spec = &db.spec;
    let (kv, gemm) = (op.kv, op.gemm);
    let slice = match crate::mla::slice(db, op) {
        Ok(s) => Some(s),
        Err(e) if e.kind == ErrorKind::Data => None,
        Err(e) => return Err(e),
    };
    let what = match op.kind {
        MlaKind::ContextModule => "context MLA module",
        MlaKind::Context => "context MLA",
        MlaKind::GenerationModule => "generation MLA module",
        MlaKind::Generation => "generation MLA",
    };
    let key = format!(
        "mla:{what}:{}/{}/{}:{}",
        op.fmha.name(),
        kv.name(),
        gemm.name(),
        if matches!(op.kind, MlaKind::ContextModule | MlaKind::GenerationModule) { op.native_heads } else { 0 }
    );
    let n = op.heads as f64;
    let (sol_q, q, sol): (f64, [f64; 3], Sol<'_>) = match op.kind {
        MlaKind::ContextModule | MlaKind::Context => {
            let flops = op.fmha.flops(spec)?;
            let (fs, fp, fb) = (s as f64, prefix as f64, b as f64);
            let sol_q = mla_ops::context_sol_prefix(spec, kv, flops, n, fs, fp, fb);
            (
                sol_q,
                [n, fs + fp, fb],
                Box::new(move |c: &[f64]| mla_ops::context_sol(spec, kv, flops, c[0], c[1], c[2])),
            )
        }
        MlaKind::GenerationModule => {
            let attn = gen_attn_dtype(spec, kv).flops(spec)?;
            let bmm = gemm.flops(spec)?;
            let sol = move |c: &[f64]| mla_ops::generation_module_sol(spec, kv, gemm, attn, bmm, c[0], c[1], c[2]);
            let q = [n, b as f64, s as f64];
            (sol(&q), q, Box::new(sol))
        }
        MlaKind::Generation => {
            let attn = gen_attn_dtype(spec, kv).flops(spec)?;
            let sol = move |c: &[f64]| mla_ops::generation_sol(spec, kv, attn, c[0], c[1], c[2]);
            let q = [n, b as f64, s as f64];
            (sol(&q), q, Box::new(sol))
        }
    };
    let grid = db.util_grids().grid(&key, || {
        Ok(slice.map(|(g, _)| {
            let pts = g.node.leaves().into_iter().map(|(c, v)| (c.iter().map(|&x| x as f64).collect(), v));
            UtilGrid::new(pts, &*sol)
        }))
    })?;
    empirical::estimate(sol_q, &q, grid.as_deref(), 1.0, &format!("{what} on {}", spec.name))
        .map_err(|e| refused(db, e))
}

/// The estimated absorption BMM latency for `tokens` decode tokens (unscaled), ms: the selected
/// slice's utilisation against the requested format's roofline, times the head ratio when a
/// power-of-two slice stands in for the op's heads.
pub(crate) fn bmm_latency(db: &Database, op: &MlaBmmOp, tokens: u32, flops: f64) -> Result<f64> {
    let spec = &db.spec;
    let (heads, head_scale, grid) = crate::mla::bmm_slice(db, op)?;
    let dtype = op.dtype;
    let sol = move |c: &[f64]| mla_ops::bmm_sol(spec, dtype, flops, heads as f64, c[0]);
    let phase = if op.pre { "pre" } else { "post" };
    let key = format!("mla_bmm:{}:{phase}:{heads}", dtype.name());
    let grid = db.util_grids().grid(&key, || {
        Ok(grid.map(|g| {
            let pts = g.node.leaves().into_iter().map(|(c, v)| (c.iter().map(|&x| x as f64).collect(), v));
            UtilGrid::new(pts, sol)
        }))
    })?;
    let q = [tokens as f64];
    let v = empirical::estimate(sol(&q), &q, grid.as_deref(), 1.0, &format!("MLA BMM on {}", spec.name));
    Ok(v.map_err(|e| refused(db, e))? * head_scale)
}
