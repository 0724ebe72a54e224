//! FPM interpolation over a collected whole-forward table (`estimation_mode: fpm_interpolation`
//! / `forward_model: fpm`), as aisimulate 0.13 times a replay's passes from it.
//!
//! The table holds whole-forward latencies at per-rank iteration totals: prefill points at
//! `(batch_size, total_prefill_tokens, total_kv_read_tokens)` and decode points at
//! `(batch_size, total_kv_read_tokens)`. Rows are grouped into cells by model path and the
//! 19-field execution identity, and by the decode context parallelism a row was measured under
//! when the table has a `dcp` column; the request's identity must match one cell exactly (a
//! deployment that states its DCP, even 1, selects only DCP cells, one that does not only cells
//! without it). A DCP cell is queried at the whole group's iteration totals, like any other, and
//! its points are read from its measured curves only: the roofline transfer is refused for it.
//!
//! A replay's prefill pass is the point `(batch, new tokens, KV read)` at its exact totals (a
//! chunk remainder beside whole prompts is not a multiple of the batch; the reference's engine
//! does not round it to per-request means); a per-request query of `batch` requests reaching
//! `isl` tokens, `prefix` of them cached, is `(batch, batch·(isl−prefix), batch·prefix)`. A
//! decode step of `batch` requests reading `context` tokens each is `(batch, batch·context)`.
//! Each point is first gated to the cell's
//! per-axis bounding box (the table is never extrapolated). A prefill site `(batch, kv)` owns a
//! curve over new tokens, a decode batch owns a curve over KV: a point on its own site's curve
//! is the measured value or the straight line between the two measured neighbours. A decode
//! batch that is not collected, between capture rungs (a rung is marked by an `(x, x+1)` pair
//! of collected batches), blends its segment's bracket rows `lower_rung+1` and `upper_rung`
//! linearly in the batch, each on its own curve (one side alone when only one covers the KV).
//! A prefill batch above the collected ceiling of a table whose batch axis is flat (consecutive
//! batches within 5% at matched totals) is priced at the ceiling when the KV read is under
//! twice the new tokens.
//!
//! Every other point (an uncollected site, a site whose own curve does not cover the point) is
//! transferred from the nearest collected sites that cover it ([`crate::interp::Sites`]): at
//! most 4 sites within 2 octaves in log₂ (batch, KV) space, a prefill site also when its KV is
//! within 32 tokens of the query's and its batch within 2 octaves, the gate waived only for a
//! scale-up overflow along one axis; each site's utilisation `SOL / latency` at the query's
//! curve coordinate, weighted by inverse squared distance, divides the query's SOL. The SOL is
//! the model's whole-pass speed-of-light roofline at the iteration totals
//! ([`crate::estimator::Estimator::fpm_sol_ms`]). A clamped prefill batch under KV pressure is
//! priced at the ceiling times the roofline's ratio of the true shape to the clamped one (at
//! most 1). Without a roofline (an op family it does not model) such points are refused, as the
//! reference refuses them.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use crate::error::{ErrorKind, PerfError, Result};
use crate::estimator::Estimator;
use crate::interp::{Sites, SitesSpec};
use crate::parquet_table::Table;

/// The most rows a table may have: a collected table is a few thousand rows per cell.
pub const MAX_ROWS: usize = 2_000_000;

const PREFILL_AXES: [&str; 3] = ["batch_size", "total_prefill_tokens", "total_kv_read_tokens"];
const DECODE_AXES: [&str; 2] = ["batch_size", "total_kv_read_tokens"];
/// The identity columns a cell is selected by, in the reference's order.
pub const MATCH_COLUMNS: [&str; 19] = [
    "gemm_quant_mode",
    "moe_quant_mode",
    "fmha_quant_mode",
    "comm_quant_mode",
    "kv_cache_dtype",
    "tp",
    "pp",
    "dp",
    "moe_tp",
    "moe_ep",
    "cp",
    "moe_backend",
    "attention_backend",
    "enable_wideep",
    "enable_eplb",
    "model_config_sha256",
    "execution_profile",
    "engram_residency",
    "input_modality",
];
/// The execution identity of a table collected before schema 7.
const LEGACY_EXECUTION: [&str; 4] = ["", "full", "none", "text"];
/// Above this KV read per new token, a clamped prefill batch needs the roofline.
const MAX_KV_PRESSURE: f64 = 2.0;
/// Prefill sites `(batch, total KV)` own a new-token curve.
const PREFILL_SITES: SitesSpec = SitesSpec {
    axes: &PREFILL_AXES,
    site_axes: &[0, 2],
    curve_axis: 1,
    nn_sites: 4,
    max_site_distance: 2.0,
    k_tail: 3,
    own_curve_fallback: true,
    raw_admission: Some((1, 32.0)),
};
/// Decode sites `(batch)` own a KV curve.
const DECODE_SITES: SitesSpec = SitesSpec {
    axes: &DECODE_AXES,
    site_axes: &[0],
    curve_axis: 1,
    nn_sites: 4,
    max_site_distance: 2.0,
    k_tail: 3,
    own_curve_fallback: true,
    raw_admission: None,
};

fn db_err(msg: String) -> PerfError {
    PerfError { kind: ErrorKind::Data, message: format!("perf database error: {msg}") }
}

type Curve = BTreeMap<u32, f64>;

/// The selected cell of a collected table, ready to time passes.
#[derive(Debug)]
pub struct FpmTable {
    path: PathBuf,
    model_path: String,
    /// `(batch, total KV read)` → new tokens → ms.
    prefill: BTreeMap<(u32, u32), Curve>,
    /// batch → total KV read → ms.
    decode: BTreeMap<u32, Curve>,
    prefill_domain: Option<[(u32, u32); 3]>,
    decode_domain: Option<[(u32, u32); 2]>,
    prefill_clamp_max: Option<u32>,
    decode_rungs: Vec<u32>,
    /// The same curves as transfer sites, in key order (the order distance ties break in).
    prefill_sites: Sites,
    decode_sites: Sites,
    /// The model's roofline: an estimator answering SOL ([`FpmTable::with_roofline`]).
    roofline: Option<Arc<Estimator>>,
}

/// One row's place in a cell.
struct Row {
    cell: Vec<String>,
    decode: bool,
    batch: u32,
    tokens: u32,
    kv: u32,
    ms: f64,
}

fn to_u32(path: &str, col: &str, row: usize, v: Option<i64>) -> Result<u32> {
    match v {
        Some(v) => {
            u32::try_from(v).map_err(|_| db_err(format!("FPM row {row} {col}={v} is outside 0..2^32 in {path}")))
        }
        None => Err(db_err(format!("FPM row {row} {col} is null in {path}"))),
    }
}

impl FpmTable {
    /// Reads the table at `path` (already checked by [`crate::fpm::check_table`]) and selects
    /// the cell of `model_path` with the request identity `identity` (19 fields, and the stated
    /// DCP as a 20th). Reads only.
    pub fn load(
        path: &Path,
        identity: &[String],
        model_path: &str,
        system: &str,
        backend: &str,
        version: &str,
    ) -> Result<FpmTable> {
        let shown = path.display().to_string();
        let mut wanted: Vec<&str> = vec![
            "cell_id",
            "model_path",
            "system",
            "backend",
            "backend_version",
            "workload_kind",
            "partition_policy",
            "batch_size",
            "total_prefill_tokens",
            "total_kv_read_tokens",
            "latency_ms",
            "kv_seed_regime",
            "dcp",
            "measurement_policy",
        ];
        wanted.extend(MATCH_COLUMNS);
        // Bounded before a column is decoded, however the caller found the table.
        crate::fpm::check_bounds(path)?;
        let t = Table::read(path, &wanted).map_err(|e| db_err(e.message))?;
        // A `dcp` column makes the decode context parallelism a row was measured under part of
        // its cell's identity; the sidecar's selector may pin it.
        let dcp_col = if t.has("dcp") { Some(t.int_or_none("dcp")?) } else { None };
        let tp_col = t.int_or_none("tp")?;
        let selector = crate::fpm::selector_dcp(&path.with_extension("metadata.json"))?;
        let text = |c: &str| t.text_or_none(c);
        let model_col = text("model_path")?;
        let kind_col = text("workload_kind")?;
        let policy_col = text("partition_policy")?;
        let sys_col = text("system")?;
        let backend_col = text("backend")?;
        let version_col = text("backend_version")?;
        let seed_col = if t.has("kv_seed_regime") { Some(text("kv_seed_regime")?) } else { None };
        let batch_col = t.int_or_none("batch_size")?;
        let tok_col = t.int_or_none("total_prefill_tokens")?;
        let kv_col = t.int_or_none("total_kv_read_tokens")?;
        let ms_col = t.float("latency_ms")?;
        let schema7 = t.has("model_config_sha256");
        let mut ident_cols: Vec<Vec<String>> = Vec::new();
        for (i, c) in MATCH_COLUMNS.iter().enumerate() {
            let col: Vec<String> = match i {
                5..=10 => t.int_or_none(c)?.into_iter().map(|v| v.map_or(String::new(), |v| v.to_string())).collect(),
                13 | 14 => match t.bool_if_present(c)? {
                    Some(v) => v.into_iter().map(|b| if b { "True" } else { "False" }.to_string()).collect(),
                    None => return Err(db_err(format!("FPM column {c:?} of {shown} must hold boolean values"))),
                },
                15..=18 if !schema7 => vec![LEGACY_EXECUTION[i - 15].to_string(); t.rows],
                _ => text(c)?.iter().map(|v| v.clone().unwrap_or_default()).collect(),
            };
            ident_cols.push(col);
        }
        let mut rows = Vec::with_capacity(t.rows);
        for r in 0..t.rows {
            let s = |col: &[Option<String>]| col[r].clone().unwrap_or_default();
            let kind = s(&kind_col);
            if kind != "prefill" && kind != "decode" {
                return Err(db_err(format!("FPM row {r} has unknown workload_kind={kind:?}")));
            }
            let policy = s(&policy_col);
            if policy != "balanced_v1" {
                return Err(db_err(format!(
                    "FPM row {r} has unsupported partition_policy={policy:?} (expected \"balanced_v1\")"
                )));
            }
            let v = s(&version_col);
            if v != version {
                return Err(db_err(format!(
                    "FPM row {r} backend_version={v:?} does not match the database version directory {version:?}"
                )));
            }
            let v = s(&sys_col);
            if v != system {
                return Err(db_err(format!("FPM row {r} system={v:?} does not match the database system {system:?}")));
            }
            let v = s(&backend_col);
            if v != backend {
                return Err(db_err(format!(
                    "FPM row {r} backend={v:?} does not match the database backend {backend:?}"
                )));
            }
            let ms = ms_col[r];
            if !ms.is_finite() || ms <= 0.0 {
                return Err(db_err(format!("FPM row {r} has non-finite/non-positive latency_ms={ms:?}")));
            }
            let batch = to_u32(&shown, "batch_size", r, batch_col[r])?;
            let tokens = to_u32(&shown, "total_prefill_tokens", r, tok_col[r])?;
            let kv = to_u32(&shown, "total_kv_read_tokens", r, kv_col[r])?;
            if batch < 1 {
                return Err(db_err(format!(
                    "FPM row {r} has invalid workload coordinates: batch_size={batch}, \
                     total_prefill_tokens={tokens}, total_kv_read_tokens={kv}"
                )));
            }
            let decode = kind == "decode";
            if !decode && tokens < 1 {
                return Err(db_err(format!("FPM row {r} is a prefill point with no prefill tokens")));
            }
            if decode && tokens != 0 {
                return Err(db_err(format!("FPM row {r} is a decode point carrying prefill tokens")));
            }
            let mut cell = vec![s(&model_col)];
            cell.extend(ident_cols.iter().map(|c| c[r].clone()));
            let dcp = match &dcp_col {
                Some(col) => {
                    let dcp = to_u32(&shown, "dcp", r, col[r])?;
                    let tp = to_u32(&shown, "tp", r, tp_col[r])?;
                    if dcp == 0 || tp == 0 || tp % dcp != 0 {
                        return Err(db_err(format!("FPM row {r} dcp must be positive and divide tp")));
                    }
                    cell.push(dcp.to_string());
                    Some(dcp)
                }
                None => None,
            };
            if selector.is_some_and(|declared| declared != dcp) {
                return Err(db_err(format!("FPM row {r} dcp disagrees with the sidecar selector")));
            }
            for (offset, name) in [(12usize, "moe_backend"), (13usize, "attention_backend")] {
                if cell[offset].is_empty() {
                    return Err(db_err(format!(
                        "FPM row {r} {name} must be a non-empty string (\"auto\" or a pinned name)"
                    )));
                }
            }
            let seed = seed_col.as_ref().map(|c| s(c)).unwrap_or_default();
            if !cell[16..20].iter().map(String::as_str).eq(LEGACY_EXECUTION) && (decode || kv > 0) && seed != "real_kv"
            {
                return Err(db_err(format!(
                    "FPM row {r}: config-bound cached prefill/decode requires real_kv provenance"
                )));
            }
            if seed == "fake_fallback" {
                return Err(PerfError::unsupported(format!(
                    "FPM table {shown} row {r} is a fake_fallback KV-seed measurement: the reference heals it by \
                     in-station extrapolation, which servesim does not implement"
                )));
            }
            rows.push(Row { cell, decode, batch, tokens, kv, ms });
        }
        // The same coordinates twice in one cell would silently overwrite a latency.
        let mut seen: BTreeSet<(&[String], bool, u32, u32, u32)> = BTreeSet::new();
        for (r, row) in rows.iter().enumerate() {
            if !seen.insert((&row.cell, row.decode, row.batch, row.tokens, row.kv)) {
                return Err(db_err(format!(
                    "FPM row {r} collides with an earlier row at the same cell coordinates (phase={:?}, \
                     batch_size={}, total_prefill_tokens={}, total_kv_read_tokens={}); refusing to silently \
                     overwrite latencies.",
                    if row.decode { "decode" } else { "prefill" },
                    row.batch,
                    row.tokens,
                    row.kv
                )));
            }
        }
        let mut wanted_cell = vec![model_path.to_string()];
        wanted_cell.extend(identity.iter().cloned());
        let mut table = FpmTable {
            path: path.to_path_buf(),
            model_path: model_path.to_string(),
            prefill: BTreeMap::new(),
            decode: BTreeMap::new(),
            prefill_domain: None,
            decode_domain: None,
            prefill_clamp_max: None,
            decode_rungs: Vec::new(),
            prefill_sites: Sites::new(Vec::new(), Vec::new()),
            decode_sites: Sites::new(Vec::new(), Vec::new()),
            roofline: None,
        };
        let mut found = false;
        for row in rows.iter().filter(|r| r.cell == wanted_cell) {
            found = true;
            if row.decode {
                table.decode.entry(row.batch).or_default().insert(row.kv, row.ms);
                let d = table.decode_domain.get_or_insert([(row.batch, row.batch), (row.kv, row.kv)]);
                widen(&mut d[0], row.batch);
                widen(&mut d[1], row.kv);
            } else {
                table.prefill.entry((row.batch, row.kv)).or_default().insert(row.tokens, row.ms);
                let d = table.prefill_domain.get_or_insert([
                    (row.batch, row.batch),
                    (row.tokens, row.tokens),
                    (row.kv, row.kv),
                ]);
                widen(&mut d[0], row.batch);
                widen(&mut d[1], row.tokens);
                widen(&mut d[2], row.kv);
            }
        }
        if !found {
            let mut available: Vec<String> = rows
                .iter()
                .map(|r| format!("({:?}, {:?})", r.cell[0], &r.cell[1..]))
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            available.truncate(8);
            let ident: Vec<String> =
                MATCH_COLUMNS.iter().chain(&["dcp"]).zip(identity).map(|(c, v)| format!("{c}={v:?}")).collect();
            return Err(db_err(format!(
                "No FPM cell matches model_path={model_path:?} with identity {{{}}}. FPM never substitutes another \
                 model's curves; collect data under this exact model path or query with the collected path. \
                 Collected cells (model_path, identity): [{}]",
                ident.join(", "),
                available.join(", ")
            )));
        }
        if table.prefill_domain.is_some() && table.prefill_batch_axis_is_flat() {
            table.prefill_clamp_max = table.prefill_domain.map(|d| d[0].1);
        }
        table.decode_rungs = table
            .decode
            .keys()
            .copied()
            .filter(|b| b.checked_add(1).is_some_and(|n| table.decode.contains_key(&n)))
            .collect();
        let points = |c: &Curve| c.iter().map(|(&k, &v)| (k, v)).collect::<Vec<_>>();
        let (keys, curves) = table.prefill.iter().map(|(&(b, kv), c)| (vec![b, kv], points(c))).unzip();
        table.prefill_sites = Sites::new(keys, curves);
        let (keys, curves) = table.decode.iter().map(|(&b, c)| (vec![b], points(c))).unzip();
        table.decode_sites = Sites::new(keys, curves);
        Ok(table)
    }

    /// The table with the roofline of the model `est` times (the same op lists, every op at its
    /// speed of light) for the points the curves do not cover.
    pub fn with_roofline(mut self, est: &Estimator) -> Result<FpmTable> {
        let db = &est.db;
        let sol = crate::db::Database::open(db.spec.clone(), &db.backend, &db.version, db.shared_layer)?
            .with_mode(crate::db::DatabaseMode::Sol);
        let roofline = Estimator::new(Arc::new(sol), est.model.clone(), est.layout.clone(), None)?;
        self.roofline = Some(Arc::new(roofline));
        Ok(self)
    }

    /// Whether consecutive collected prefill batches agree at matched totals (median
    /// |ratio − 1| ≤ 5% over at least 3 overlapping points): the batch clamp's certificate.
    fn prefill_batch_axis_is_flat(&self) -> bool {
        let batches: Vec<u32> = self.prefill.keys().map(|k| k.0).collect::<BTreeSet<_>>().into_iter().collect();
        if batches.len() < 2 {
            return false;
        }
        let mut dev = Vec::new();
        for pair in batches.windows(2) {
            for ((_, kv), upper) in self.prefill.range((pair[1], 0)..=(pair[1], u32::MAX)) {
                let Some(lower) = self.prefill.get(&(pair[0], *kv)) else { continue };
                let (first, last) = (*lower.keys().next().unwrap(), *lower.keys().next_back().unwrap());
                for (&total, &ms) in upper {
                    if first <= total && total <= last {
                        let base = held_curve_value(lower, total as f64);
                        if base > 0.0 {
                            dev.push((ms / base - 1.0).abs());
                        }
                    }
                }
            }
        }
        dev.len() >= 3 && crate::interp::median(&mut dev) <= 0.05
    }

    /// The table this cell was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A prefill step: `batch` requests reaching `isl` tokens, `prefix` of them cached, ms.
    pub fn prefill_ms(&self, batch: u32, isl: u32, prefix: u32) -> Result<f64> {
        if batch == 0 || isl <= prefix {
            return Ok(0.0);
        }
        let b = u64::from(batch);
        self.prefill_total_ms(batch, b * u64::from(isl - prefix), b * u64::from(prefix))
    }

    /// A prefill step at its iteration totals: `batch` requests computing `new_tokens` prompt
    /// tokens in all while reading `kv_read` cached or earlier-chunk tokens, ms. A replay's pass
    /// is timed here, at its exact totals (the reference's engine does not round them to
    /// per-request means first).
    pub fn prefill_total_ms(&self, batch: u32, new_tokens: u64, kv_read: u64) -> Result<f64> {
        if batch == 0 || new_tokens == 0 {
            return Ok(0.0);
        }
        let mut coords = [f64::from(batch), new_tokens as f64, kv_read as f64];
        let mut scale = 1.0;
        if let Some(max) = self.prefill_clamp_max.filter(|m| coords[0] > f64::from(*m)) {
            let clamped = [f64::from(max), coords[1], coords[2]];
            if coords[2] < MAX_KV_PRESSURE * coords[1] {
                coords = clamped;
            } else {
                // The true shape (more, shorter requests) never costs more than the clamped one.
                // Without the roofline the batch stays, and the domain refuses it.
                let sol = |c: &[f64]| self.roofline.as_ref().and_then(|r| r.fpm_sol_ms(false, c).ok());
                if let (Some(t), Some(c)) = (sol(&coords), sol(&clamped)) {
                    if t.is_finite() && c.is_finite() && t > 0.0 && c > 0.0 {
                        scale = (t / c).min(1.0);
                        coords = clamped;
                    }
                }
            }
        }
        let domain = self.prefill_domain.ok_or_else(|| self.no_rows("prefill"))?;
        self.gate("prefill", &PREFILL_AXES, &domain, &coords)?;
        let ms = self.resolve(false, &coords)? * scale;
        self.valid("prefill", ms, &coords)
    }

    /// A point of one phase from its site's own curve, or transferred through the roofline.
    fn resolve(&self, decode: bool, coords: &[f64]) -> Result<f64> {
        let (sites, spec) =
            if decode { (&self.decode_sites, &DECODE_SITES) } else { (&self.prefill_sites, &PREFILL_SITES) };
        // The roofline is only asked off the curves; its first failure explains a miss.
        let failure: RefCell<Option<PerfError>> = RefCell::new(None);
        let sol = |c: &[f64]| -> f64 {
            let r = match &self.roofline {
                Some(r) => r.fpm_sol_ms(decode, c),
                None => Err(PerfError::unsupported("no model roofline is attached to the FPM table")),
            };
            r.unwrap_or_else(|e| {
                failure.borrow_mut().get_or_insert(e);
                f64::NAN
            })
        };
        sites.query(spec, &sol, coords).map_err(|e| {
            if e.kind != ErrorKind::NoAnchor {
                return e;
            }
            match failure.take() {
                Some(why) => PerfError {
                    // servesim's own gaps stay unsupported; the reference's misses are data misses.
                    kind: if why.kind == ErrorKind::Unsupported { ErrorKind::Unsupported } else { ErrorKind::Data },
                    message: format!("perf database error: {}; SOL roofline unavailable: {}", e.message, why.message),
                },
                None => db_err(e.message),
            }
        })
    }

    /// The KV cache of a worker whose capacity is sized from memory, capped at the highest
    /// collected decode KV total (the reference never schedules past its decode table).
    pub fn cap_blocks(&self, blocks: u64, block_size: u32) -> std::result::Result<u64, String> {
        let Some(ceiling) = self.decode_domain.map(|d| d[1].1) else { return Ok(blocks) };
        let covered = u64::from(ceiling) / u64::from(block_size.max(1));
        if covered == 0 {
            return Err(format!(
                "FPM decode KV ceiling {ceiling} does not cover one scheduler block of {block_size} tokens"
            ));
        }
        Ok(blocks.min(covered))
    }

    /// A decode step of `batch` requests reading `total_kv` past tokens of KV in all, ms.
    pub fn decode_total_ms(&self, batch: u32, total_kv: u32) -> Result<f64> {
        if batch == 0 {
            return Ok(0.0);
        }
        let b = f64::from(batch);
        let coords = [b, f64::from(total_kv)];
        let domain = self.decode_domain.ok_or_else(|| self.no_rows("decode"))?;
        self.gate("decode", &DECODE_AXES, &domain, &coords)?;
        let kv = coords[1];
        if let Some((lo, hi)) = self.bracket(b) {
            let covers = |row: u32| self.decode.get(&row).is_some_and(|c| curve_covers(c, kv));
            // A covering row answers from its own curve.
            let value = |row: u32| -> Result<f64> { self.resolve(true, &[f64::from(row), kv]) };
            let ms = match (covers(lo), covers(hi)) {
                (false, false) => {
                    let span = |r: u32| {
                        self.decode.get(&r).map(|c| (*c.keys().next().unwrap(), *c.keys().next_back().unwrap()))
                    };
                    return Err(db_err(format!(
                        "FPM decode bracket rows {lo}/{hi} do not cover total_kv_read_tokens={kv}                  \
                         (curves span {:?} and {:?}); FPM never extrapolates.",
                        span(lo).unwrap_or_default(),
                        span(hi).unwrap_or_default()
                    )));
                }
                (true, false) => value(lo)?,
                (false, true) => value(hi)?,
                (true, true) if lo == hi => value(lo)?,
                (true, true) => {
                    let (l, h) = (value(lo)?, value(hi)?);
                    l + (h - l) * ((b - f64::from(lo)) / (f64::from(hi) - f64::from(lo)))
                }
            };
            if !ms.is_finite() || ms <= 0.0 {
                return Err(db_err(format!(
                    "FPM decode bracket interpolation produced an invalid latency ({ms}) at {coords:?}."
                )));
            }
            return Ok(ms);
        }
        let ms = self.resolve(true, &coords)?;
        self.valid("decode", ms, &coords)
    }

    /// The bracket rows of an uncollected decode batch between capture rungs.
    fn bracket(&self, batch: f64) -> Option<(u32, u32)> {
        if self.decode_rungs.is_empty() || self.decode.keys().any(|&b| f64::from(b) == batch) {
            return None;
        }
        let lower = *self.decode_rungs.iter().rev().find(|&&r| f64::from(r) < batch)?;
        let hi = self
            .decode_rungs
            .iter()
            .copied()
            .find(|&r| f64::from(r) >= batch)
            .unwrap_or(*self.decode.keys().next_back().expect("a decode row"));
        Some((lower + 1, hi))
    }

    fn gate(&self, phase: &str, axes: &[&str], domain: &[(u32, u32)], coords: &[f64]) -> Result<()> {
        for ((axis, &(low, high)), &v) in axes.iter().zip(domain).zip(coords) {
            if !(f64::from(low) <= v && v <= f64::from(high)) {
                return Err(db_err(format!(
                    "FPM {phase} query {axis}={v} is outside the collected domain [{low}, {high}] for model_path={:?}. \
                     FPM never extrapolates; collect a wider sweep or use forward_model='op_level'.",
                    self.model_path
                )));
            }
        }
        Ok(())
    }

    fn valid(&self, phase: &str, ms: f64, coords: &[f64]) -> Result<f64> {
        if !ms.is_finite() || ms <= 0.0 {
            return Err(db_err(format!("FPM {phase} interpolation produced an invalid latency ({ms}) at {coords:?}.")));
        }
        Ok(ms)
    }

    fn no_rows(&self, phase: &str) -> PerfError {
        db_err(format!("FPM cell of {} has no {phase} rows (model_path={:?}).", self.path.display(), self.model_path))
    }
}

fn widen(slot: &mut (u32, u32), v: u32) {
    slot.0 = slot.0.min(v);
    slot.1 = slot.1.max(v);
}

fn curve_covers(curve: &Curve, q: f64) -> bool {
    match (curve.keys().next(), curve.keys().next_back()) {
        (Some(&lo), Some(&hi)) => f64::from(lo) <= q && q <= f64::from(hi),
        _ => false,
    }
}

/// The measured value at `q` on one curve, or the straight line between its two measured
/// neighbours; None outside the curve.
fn own_curve_value(curve: &Curve, q: f64) -> Option<f64> {
    if !curve_covers(curve, q) {
        return None;
    }
    // Covered, so a point at or below `q` and, unless `q` is that point, one above it exist
    // (looked up in the map: this runs once per simulated pass).
    let below = q.floor() as u32;
    let (&c_lo, &lo) = curve.range(..=below).next_back()?;
    if f64::from(c_lo) == q {
        return Some(lo);
    }
    let (&c_hi, &hi) = curve.range(below + 1..).next()?;
    let w = (q - f64::from(c_lo)) / (f64::from(c_hi) - f64::from(c_lo));
    Some(lo + (hi - lo) * w)
}

/// A curve's value with its end points held beyond its range (the flatness certificate only).
fn held_curve_value(curve: &Curve, q: f64) -> f64 {
    let (first, last) = (*curve.keys().next().unwrap(), *curve.keys().next_back().unwrap());
    if q <= f64::from(first) {
        return curve[&first];
    }
    if q >= f64::from(last) {
        return curve[&last];
    }
    own_curve_value(curve, q).unwrap_or(curve[&last])
}

/// The table a worker interpolates, when the reference would select FPM interpolation for it
/// ([`crate::fpm::select`]); None for op-level timing.
pub fn for_worker(
    cfg: &crate::provider::AisConfig,
    est: &crate::estimator::Estimator,
) -> Result<Option<Arc<FpmTable>>> {
    let Some(path) = crate::fpm::select(cfg)? else { return Ok(None) };
    if cfg.pass_model == crate::provider::PassModel::Fused {
        return Err(PerfError::unsupported(
            "pass_model: fused with FPM interpolation: the collected table times whole prefill and decode \
             passes, not fused mixed ones (use pass_model: additive)",
        ));
    }
    let identity = request_identity(cfg, &est.layout)
        .map_err(|why| PerfError::unsupported(format!("FPM interpolation over {}: {why}", path.display())))?;
    let version = match &cfg.backend_version {
        Some(v) => v.clone(),
        None => {
            let roots = crate::systems::systems_roots(&cfg.systems_paths)?;
            crate::systems::resolve_version(&crate::systems::find_system(&roots, &cfg.system)?, &cfg.backend, None)?
        }
    };
    let table = FpmTable::load(&path, &identity, &cfg.model, &cfg.system, &cfg.backend, &version)?;
    Ok(Some(Arc::new(table.with_roofline(est)?)))
}

/// The request identity servesim can state for a worker: its quantisation as the FPM tables
/// label it, its parallel layout, automatic backends, no wide EP, and the pre-schema-7
/// execution identity. `None` with the reason where servesim cannot derive it.
pub fn request_identity(
    cfg: &crate::provider::AisConfig,
    layout: &crate::model::Layout,
) -> std::result::Result<Vec<String>, String> {
    let raw = &cfg.raw;
    let text = |k: &str| raw.get(k).and_then(Value::as_str);
    for k in ["moe_backend", "attention_backend"] {
        if let Some(v) = text(k).filter(|v| *v != "auto") {
            return Err(format!("{k}={v:?}: servesim matches FPM cells only with automatic backends"));
        }
    }
    if raw.get("enable_wideep").and_then(Value::as_bool) == Some(true)
        || raw.get("enable_eplb").and_then(Value::as_bool) == Some(true)
    {
        return Err("enable_wideep / enable_eplb: servesim matches FPM cells without wide EP only".into());
    }
    if layout.nextn > 0 || layout.ngram > 0 {
        return Err(
            "speculative decoding (nextn / ngram): the FPM decode surface is timed for autoregressive steps only"
                .into(),
        );
    }
    let mut id: Vec<String> = [layout.gemm, layout.moe, layout.fmha].iter().map(|d| d.name().to_string()).collect();
    id.push("half".into());
    id.push(layout.kv.name().into());
    for n in [layout.tp, layout.pp, layout.attention_dp, layout.moe_tp, layout.moe_ep, layout.cp] {
        id.push(n.to_string());
    }
    id.extend(["auto", "auto", "False", "False"].map(String::from));
    id.extend(LEGACY_EXECUTION.map(String::from));
    // A deployment that states its decode context parallelism (even 1) selects the cells measured
    // under it; one that does not, the cells without a `dcp` column.
    if raw.get("dcp").is_some_and(|v| !v.is_null()) {
        id.push(layout.dcp.to_string());
    }
    Ok(id)
}

/// SHA-256 of a file, lowercase hex (the sidecar's `parquet_sha256`). Streams the file.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    use sha2::Digest;
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_matches_the_standard_vectors() {
        use sha2::Digest;
        let hex = |d: &[u8]| hex(&sha2::Sha256::digest(d));
        assert_eq!(hex(b""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        assert_eq!(hex(b"abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        let long = vec![b'a'; 1_000_000];
        assert_eq!(hex(&long), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    }

    fn curve(points: &[(u32, f64)]) -> Curve {
        points.iter().copied().collect()
    }

    #[test]
    fn own_curve_values_are_measured_or_linear_and_never_extrapolated() {
        let c = curve(&[(100, 2.0), (200, 4.0), (400, 5.0)]);
        assert_eq!(own_curve_value(&c, 200.0), Some(4.0));
        assert_eq!(own_curve_value(&c, 150.0), Some(3.0));
        assert_eq!(own_curve_value(&c, 300.0), Some(4.5));
        assert_eq!(own_curve_value(&c, 99.0), None);
        assert_eq!(own_curve_value(&c, 401.0), None);
    }
}
