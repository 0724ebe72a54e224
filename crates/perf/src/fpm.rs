//! Forward-pass-measurement (FPM) estimation modes: which estimator aisimulate 0.13 selects for
//! a worker's `estimation_mode` / `forward_model: fpm`, and what it refuses with.
//!
//! The reference tries its estimators in a fixed order: `auto` tries op_level, then FPM
//! interpolation over a collected whole-forward table, then the FPM regression; an explicit mode
//! tries that mode alone, or (`fallback_policy: allow`) that mode and then the others in the same
//! order. A regression is trained online from observed passes, so an offline prediction never
//! has one ready: selecting it refuses. Interpolation needs the collected table
//! (`fpm_parquet_path`, or `<data>/<system>/<backend>/<version>/fpm_forward_perf.parquet`) with
//! its metadata sidecar; a missing or malformed table is a failure the next mode may recover.
//! Both FPM modes refuse a speculative scheme (it needs op-level timing), and decode context
//! parallelism outside a vLLM table's measured DCP cells.
//!
//! A selected valid table is interpolated as the reference interpolates it (`fpm_interp.rs`:
//! measured curves, rung brackets, and the roofline transfer where they do not reach). A table
//! is only read, never written.

use std::path::{Path, PathBuf};

use parquet::basic::Type as Physical;
use parquet::file::reader::{FileReader, SerializedFileReader};
use serde_json::Value;

use crate::error::{ErrorKind, PerfError, Result};
use crate::provider::AisConfig;
use crate::systems::{find_system, resolve_version, systems_roots};

/// The largest FPM table file servesim reads (and hashes).
pub const MAX_TABLE_BYTES: u64 = 1 << 30;

/// The estimation modes predict accepts (`fpm_learned` needs telemetry replay cannot supply).
pub const MODES: [&str; 4] = ["auto", "op_level", "fpm_interpolation", "fpm_regression"];

/// The collected table's name in a version directory.
pub const TABLE_BASENAME: &str = "fpm_forward_perf.parquet";

const SCHEMA_NAME: &str = "aic_fpm_forward_perf";
const COORDINATE_SYSTEM: &str = "iteration_totals_balanced_v1";
const MEASUREMENT_POLICIES: [&str; 2] = ["dynamo_native_single_sample_v1", "per_row_single_sample_or_median_of_3"];

/// Columns a table must have, by the kind of value each holds.
const TEXT_COLUMNS: [&str; 15] = [
    "cell_id",
    "model_path",
    "system",
    "backend",
    "backend_version",
    "weight_quantization",
    "gemm_quant_mode",
    "moe_quant_mode",
    "fmha_quant_mode",
    "comm_quant_mode",
    "kv_cache_dtype",
    "moe_backend",
    "attention_backend",
    "workload_kind",
    "partition_policy",
];
/// The execution identity schema 7 adds.
const TEXT_COLUMNS_V7: [&str; 4] = ["model_config_sha256", "execution_profile", "engram_residency", "input_modality"];
const INT_COLUMNS: [&str; 9] =
    ["tp", "pp", "dp", "moe_tp", "moe_ep", "cp", "batch_size", "total_prefill_tokens", "total_kv_read_tokens"];
const BOOL_COLUMNS: [&str; 2] = ["enable_wideep", "enable_eplb"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    OpLevel,
    Interpolation,
    Regression,
}

/// True for the modes that name an FPM estimator.
pub fn is_fpm_mode(mode: Option<&str>) -> bool {
    matches!(mode, Some("fpm_interpolation" | "fpm_regression"))
}

/// Selects the estimator the reference would for `cfg`: Ok(None) when it is op_level (the
/// timing servesim computes), Ok(Some(table)) when it interpolates a checked collected table
/// ([`crate::fpm_interp`]), otherwise the reference's refusal.
pub fn select(cfg: &AisConfig) -> Result<Option<PathBuf>> {
    let raw = &cfg.raw;
    let text = |k: &str| raw.get(k).and_then(Value::as_str);
    if let Some(profile) = raw.get("fpm_profile").filter(|v| !v.is_null()) {
        check_profile_deployment(cfg, profile)?;
    }
    let requested = text("estimation_mode").unwrap_or("auto");
    let allow = text("fallback_policy") == Some("allow");
    let order = [Mode::OpLevel, Mode::Interpolation, Mode::Regression];
    let candidates: Vec<Mode> = match requested {
        "auto" => order.to_vec(),
        m => {
            let first = match m {
                "op_level" => Mode::OpLevel,
                "fpm_interpolation" => Mode::Interpolation,
                _ => Mode::Regression,
            };
            let mut c = vec![first];
            if allow {
                c.extend(order.into_iter().filter(|x| *x != first));
            }
            c
        }
    };
    let mut failures: Vec<PerfError> = Vec::new();
    // Decode context parallelism has no whole-forward regression, and only vLLM tables record
    // DCP cells: both refuse it before any table is read.
    let dcp_refusal = || {
        PerfError::unsupported(format!(
            "unsupported model for Rust core estimator: DCP timing requires measured vLLM FPM interpolation \
             (dcp={} with backend {})",
            cfg.dcp, cfg.backend
        ))
    };
    // A whole-forward table times autoregressive passes: every speculative scheme (MTP's nextn
    // too) needs op-level timing, so the FPM modes refuse it (the reference's words).
    let speculation = raw
        .get("speculation")
        .and_then(|s| s.get("kind"))
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| (cfg.nextn > 0).then(|| "mtp".to_string()));
    let speculation_refusal = |kind: &str| {
        PerfError::unsupported(format!(
            "unsupported model for Rust core estimator: {kind} speculation requires op_level timing"
        ))
    };
    for mode in candidates {
        match mode {
            // servesim's op-level estimator reports its own failures when it is built.
            Mode::OpLevel => return Ok(None),
            Mode::Regression if cfg.dcp > 1 && failures.is_empty() => return Err(dcp_refusal()),
            Mode::Interpolation if cfg.dcp > 1 && cfg.backend != "vllm" => failures.push(dcp_refusal()),
            Mode::Regression if failures.is_empty() && speculation.is_some() => {
                return Err(speculation_refusal(speculation.as_deref().unwrap_or_default()))
            }
            Mode::Interpolation if speculation.is_some() => {
                failures.push(speculation_refusal(speculation.as_deref().unwrap_or_default()))
            }
            Mode::Regression => {
                return Err(PerfError::unsupported(if failures.is_empty() {
                    "regression estimator is not ready; replay requires training observations".to_string()
                } else {
                    let reasons: Vec<String> = failures.iter().map(|e| e.message.clone()).collect();
                    format!(
                        "no timing data for {} with {} on {}: fpm_interpolation: {}. Prediction will not fall back \
                         to an untrained regression estimator",
                        cfg.model,
                        cfg.backend,
                        cfg.system,
                        reasons.join("; ")
                    )
                }))
            }
            Mode::Interpolation => {
                let path = table_path(cfg)?;
                match check_table(&path, cfg) {
                    Ok(_) => return Ok(Some(path)),
                    Err(e) => failures.push(e),
                }
            }
        }
    }
    // Every candidate failed: with one, its own error.
    let e = failures.pop().expect("an explicit mode other than op_level or regression failed");
    Err(e)
}

/// The table interpolation reads: `fpm_parquet_path` (made absolute), or the version
/// directory's.
fn table_path(cfg: &AisConfig) -> Result<PathBuf> {
    let explicit =
        cfg.raw.get("fpm_parquet_path").and_then(Value::as_str).or_else(|| {
            cfg.raw.pointer("/estimator_config/fpm_interpolation/fpm_parquet_path").and_then(Value::as_str)
        });
    if let Some(p) = explicit.filter(|p| !p.is_empty()) {
        return std::path::absolute(p).map_err(|e| PerfError::config(format!("cannot resolve fpm_parquet_path: {e}")));
    }
    let roots = systems_roots(&cfg.systems_paths)?;
    let spec = find_system(&roots, &cfg.system)?;
    let version = resolve_version(&spec, &cfg.backend, cfg.backend_version.as_deref())?;
    Ok(spec.data_dir.join(&cfg.backend).join(version).join(TABLE_BASENAME))
}

fn db_err(msg: String) -> PerfError {
    PerfError { kind: ErrorKind::Data, message: format!("perf database error: {msg}") }
}

/// Checks a collected table and its sidecar as the reference loads them (file, sidecar identity,
/// columns and their types, row count) and returns its row count. Reads only.
pub fn check_table(path: &Path, cfg: &AisConfig) -> Result<usize> {
    if !path.is_file() {
        return Err(db_err(format!(
            "File does not exist at {}. No fpm_forward data collected for this backend/version.",
            path.display()
        )));
    }
    // Bounded before the digest reads it all: a table of MAX_ROWS rows is far smaller.
    check_size(path)?;
    let version = match &cfg.backend_version {
        Some(v) => v.clone(),
        None => {
            let roots = systems_roots(&cfg.systems_paths)?;
            resolve_version(&find_system(&roots, &cfg.system)?, &cfg.backend, None)?
        }
    };
    let sidecar = path.with_extension("metadata.json");
    let (schema_version, expected_rows) = check_sidecar(&sidecar, &cfg.system, &cfg.backend, &version)?;
    check_digest(&sidecar, path)?;
    selector_dcp(&sidecar)?;
    let shown = path.display();
    let file = std::fs::File::open(path).map_err(|e| db_err(format!("cannot open {shown}: {e}")))?;
    let reader = SerializedFileReader::new(file)
        .map_err(|e| db_err(format!("cannot read the FPM parquet table {shown}: {e}")))?;
    let meta = reader.metadata();
    let schema = meta.file_metadata().schema_descr();
    let columns: Vec<(String, Physical)> = (0..schema.num_columns())
        .map(|i| (schema.column(i).name().to_string(), schema.column(i).physical_type()))
        .collect();
    let names: Vec<&str> = columns.iter().map(|(n, _)| n.as_str()).collect();
    let mut required: Vec<(&str, &str, &[Physical])> = Vec::new();
    let text_types: &[Physical] = &[Physical::BYTE_ARRAY];
    let int_types: &[Physical] = &[Physical::INT32, Physical::INT64];
    for c in TEXT_COLUMNS {
        required.push((c, "string", text_types));
    }
    if schema_version >= 7 {
        for c in TEXT_COLUMNS_V7 {
            required.push((c, "string", text_types));
        }
    }
    for c in INT_COLUMNS {
        required.push((c, "integer", int_types));
    }
    for c in BOOL_COLUMNS {
        required.push((c, "boolean", &[Physical::BOOLEAN]));
    }
    required.push(("latency_ms", "floating-point", &[Physical::DOUBLE, Physical::FLOAT]));
    // Optional: the decode context parallelism a row was measured under (a cell per size).
    if names.contains(&"dcp") {
        required.push(("dcp", "integer", int_types));
    }
    for (name, kind, types) in required {
        match columns.iter().find(|(n, _)| n == name) {
            None => {
                return Err(db_err(format!(
                    "parquet column {name:?} missing at {shown} (have: [{}])",
                    names.join(", ")
                )))
            }
            Some((_, t)) if !types.contains(t) => {
                return Err(db_err(format!("FPM column {name:?} of {shown} must hold {kind} values, got {t}")))
            }
            Some(_) => {}
        }
    }
    let rows = check_rows(meta, path)?;
    if expected_rows != Some(rows as u64) {
        return Err(db_err(format!(
            "FPM row_count mismatch: sidecar={} actual={rows}: {shown}",
            expected_rows.map_or("None".to_string(), |v| v.to_string())
        )));
    }
    if rows == 0 {
        return Err(db_err(format!("FPM database contains no rows: {shown}")));
    }
    Ok(rows)
}

/// Refuses a table file over [`MAX_TABLE_BYTES`].
fn check_size(path: &Path) -> Result<()> {
    let size = std::fs::metadata(path).map_err(|e| db_err(format!("cannot read {}: {e}", path.display())))?.len();
    if size > MAX_TABLE_BYTES {
        return Err(db_err(format!(
            "FPM table {} is {size} bytes; servesim reads at most {MAX_TABLE_BYTES} ({} MiB)",
            path.display(),
            MAX_TABLE_BYTES >> 20
        )));
    }
    Ok(())
}

/// A table's row count from its footer, refused over [`crate::fpm_interp::MAX_ROWS`]: a small
/// file of repeated values can still declare more rows than memory holds once decoded. The
/// row groups are what a read decodes, so their counts are bounded too.
fn check_rows(meta: &parquet::file::metadata::ParquetMetaData, path: &Path) -> Result<usize> {
    let max = crate::fpm_interp::MAX_ROWS as i64;
    let declared = meta.file_metadata().num_rows();
    let in_groups = meta.row_groups().iter().fold(0i64, |sum, g| sum.saturating_add(g.num_rows().max(0)));
    let most = declared.max(in_groups);
    if most > max {
        return Err(db_err(format!("FPM table {} has {most} rows; servesim reads at most {max}", path.display())));
    }
    Ok(declared.max(0) as usize)
}

/// The bounds every read of an FPM table goes through before its columns are decoded: the file
/// size, then the row count its footer declares. Whichever way the table was named
/// (`fpm_parquet_path`, the version directory of the systems data, or a systems directory an
/// FPM profile was materialised into), reading it costs at most these bounds.
pub fn check_bounds(path: &Path) -> Result<usize> {
    check_size(path)?;
    let shown = path.display();
    let file = std::fs::File::open(path).map_err(|e| db_err(format!("cannot open {shown}: {e}")))?;
    let reader = SerializedFileReader::new(file)
        .map_err(|e| db_err(format!("cannot read the FPM parquet table {shown}: {e}")))?;
    check_rows(reader.metadata(), path)
}

/// The sidecar's `parquet_sha256` against the table's bytes (the pair is written atomically; a
/// mismatch is an interrupted or foreign writer).
fn check_digest(sidecar: &Path, path: &Path) -> Result<()> {
    let m = read_sidecar(sidecar)?;
    let actual =
        crate::fpm_interp::sha256_file(path).map_err(|e| db_err(format!("cannot read {}: {e}", path.display())))?;
    let declared = m.get("parquet_sha256");
    if declared.and_then(Value::as_str) != Some(actual.as_str()) {
        let shown = match declared {
            None => "None".to_string(),
            Some(Value::String(s)) => format!("Some(String({s:?}))"),
            Some(v) => format!("Some({v})"),
        };
        return Err(db_err(format!(
            "FPM parquet digest mismatch: sidecar={shown} actual={actual:?}. The pair at {} is inconsistent \
             (interrupted writer?).",
            path.parent().unwrap_or(path).display()
        )));
    }
    Ok(())
}

fn read_sidecar(path: &Path) -> Result<serde_json::Map<String, Value>> {
    let shown = path.display();
    if !path.is_file() {
        return Err(db_err(format!(
            "FPM database is missing its metadata sidecar: {shown}. The parquet/metadata pair is atomic; \
             refusing to load an unmatched parquet."
        )));
    }
    let text = servesim_config::read_config_text(path).map_err(|e| db_err(format!("cannot read {shown}: {e}")))?;
    let doc: Value = serde_json::from_str(&text)
        .map_err(|e| db_err(format!("FPM metadata sidecar is not valid JSON: {shown} ({e})")))?;
    match doc {
        Value::Object(m) => Ok(m),
        _ => Err(db_err(format!("FPM metadata sidecar must be a JSON object: {shown}"))),
    }
}

/// The decode context parallelism the sidecar's `configuration_selector` pins its rows to:
/// None without a selector, `Some(None)` for a selector without `dcp` (rows without DCP only),
/// `Some(Some(n))` for `dcp: n`.
pub(crate) fn selector_dcp(sidecar: &Path) -> Result<Option<Option<u32>>> {
    let m = read_sidecar(sidecar)?;
    let Some(selector) = m.get("configuration_selector") else { return Ok(None) };
    let Some(selector) = selector.as_object() else {
        return Err(db_err("FPM configuration_selector must be an object".into()));
    };
    match selector.get("dcp") {
        None => Ok(Some(None)),
        Some(v) => match v.as_u64().and_then(|v| u32::try_from(v).ok()).filter(|v| *v > 0) {
            Some(dcp) => Ok(Some(Some(dcp))),
            None => Err(db_err("FPM selector dcp must be a positive integer".into())),
        },
    }
}

/// The sidecar's contract; returns its schema version and the row count it declares.
fn check_sidecar(path: &Path, system: &str, backend: &str, version: &str) -> Result<(u64, Option<u64>)> {
    let m = read_sidecar(path)?;
    let shown = path.display();
    let shown_value = |k: &str| m.get(k).map_or("None".to_string(), |v| format!("Some({v})"));
    if m.get("schema_name").and_then(Value::as_str) != Some(SCHEMA_NAME) {
        return Err(db_err(format!(
            "unsupported FPM schema_name={} (expected {SCHEMA_NAME:?}): {shown}",
            shown_value("schema_name")
        )));
    }
    let schema_version = m.get("schema_version").and_then(Value::as_u64).filter(|v| matches!(v, 6 | 7));
    let Some(schema_version) = schema_version else {
        return Err(db_err(format!(
            "unsupported FPM schema_version={} (expected 7): {shown}",
            shown_value("schema_version")
        )));
    };
    if m.get("coordinate_system").and_then(Value::as_str) != Some(COORDINATE_SYSTEM) {
        return Err(db_err(format!(
            "unsupported FPM coordinate_system={} (expected {COORDINATE_SYSTEM:?}): {shown}",
            shown_value("coordinate_system")
        )));
    }
    if !m.get("measurement_policy").and_then(Value::as_str).is_some_and(|p| MEASUREMENT_POLICIES.contains(&p)) {
        return Err(db_err(format!(
            "unsupported FPM measurement_policy={} (expected {:?} or {:?}): {shown}",
            shown_value("measurement_policy"),
            MEASUREMENT_POLICIES[0],
            MEASUREMENT_POLICIES[1]
        )));
    }
    for (key, expected) in [("system", system), ("backend", backend), ("backend_version", version)] {
        if m.get(key).and_then(Value::as_str) != Some(expected) {
            return Err(db_err(format!(
                "FPM sidecar {key}={} does not match the database {key} {expected:?}: {shown}",
                shown_value(key)
            )));
        }
    }
    Ok((schema_version, m.get("row_count").and_then(Value::as_u64)))
}

/// The profile deployment for this worker (the reference's `FpmModelProfile.select`), then the
/// reference's refusal: it verifies the profile's architecture against the checkpoint's
/// `config.json` at the pinned revision, which servesim cannot fetch.
fn check_profile_deployment(cfg: &AisConfig, profile: &Value) -> Result<()> {
    let field = |k: &str| profile.get(k).and_then(Value::as_str).unwrap_or("");
    let shape =
        [cfg.tp, cfg.pp, cfg.attention_dp, cfg.moe_tp_size.unwrap_or(1), cfg.moe_ep_size.unwrap_or(1), cfg.cp_size];
    let version = cfg.backend_version.clone().unwrap_or_default();
    let deployments = profile.get("deployments").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
    let found = deployments.iter().any(|d| {
        let s = |k: &str| d.get(k).and_then(Value::as_str);
        let n = |k: &str, default: u64| d.get(k).and_then(Value::as_u64).unwrap_or(default);
        let dims = [n("tp", 0), n("pp", 1), n("dp", 0), n("moe_tp", 0), n("moe_ep", 0), n("cp", 1)];
        s("system") == Some(cfg.system.as_str())
            && s("backend") == Some(cfg.backend.as_str())
            && s("backend_version") == Some(version.as_str())
            && dims.iter().zip(shape).all(|(a, b)| *a == b as u64)
            && d.get("worker_type").and_then(Value::as_str).is_none_or(|w| w == cfg.worker_type)
    });
    let (tp, pp, dp, mtp, mep, cp) = (shape[0], shape[1], shape[2], shape[3], shape[4], shape[5]);
    if !found {
        return Err(PerfError::config(format!(
            "fpm_profile: no matching FPM deployment profile for '{}', {}/{}/{version}, \
             (tp,pp,dp,moe_tp,moe_ep,cp)=({tp}, {pp}, {dp}, {mtp}, {mep}, {cp}), worker_type={}; provide explicit \
             resources and precision for that deployment",
            cfg.model, cfg.system, cfg.backend, cfg.worker_type
        )));
    }
    Err(PerfError::unsupported(format!(
        "invalid engine config: fpm_profile: cannot verify FPM profile architecture: config.json metadata for \
         '{}' at model_revision='{}' could not be resolved; make the pinned checkpoint configuration available \
         (servesim reads no checkpoint metadata over the network)",
        field("model"),
        field("model_revision")
    )))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use parquet::data_type::{BoolType, ByteArray, ByteArrayType, DoubleType, Int64Type};
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    use parquet::schema::parser::parse_message_type;
    use serde_json::json;

    use super::*;

    /// Writes a one-row table with the given columns left out, and `latency_ms` as text when
    /// `text_latency`; `rows`: 1 or 0.
    fn write_table(path: &Path, drop: &str, text_latency: bool, rows: usize) {
        let mut fields = Vec::new();
        let mut names: Vec<(&str, &str)> = Vec::new();
        for c in TEXT_COLUMNS.iter().chain(&TEXT_COLUMNS_V7) {
            names.push((c, "BYTE_ARRAY"));
        }
        for c in INT_COLUMNS {
            names.push((c, "INT64"));
        }
        for c in BOOL_COLUMNS {
            names.push((c, "BOOLEAN"));
        }
        names.push(("latency_ms", if text_latency { "BYTE_ARRAY" } else { "DOUBLE" }));
        names.retain(|(n, _)| *n != drop);
        for (n, t) in &names {
            fields.push(format!("REQUIRED {t} {n};"));
        }
        let schema = Arc::new(parse_message_type(&format!("message schema {{ {} }}", fields.join(" "))).unwrap());
        let file = std::fs::File::create(path).unwrap();
        let mut w = SerializedFileWriter::new(file, schema, Arc::new(WriterProperties::new())).unwrap();
        let mut g = w.next_row_group().unwrap();
        // Written in chunks, so that a table of millions of rows costs little memory.
        let chunk = rows.clamp(1, 1 << 16);
        let sizes: Vec<usize> = (0..rows).step_by(chunk).map(|start| chunk.min(rows - start)).collect();
        for (n, t) in &names {
            let mut c = g.next_column().unwrap().unwrap();
            match *t {
                "BYTE_ARRAY" => {
                    let v: Vec<ByteArray> = (0..chunk).map(|_| ByteArray::from(*n)).collect();
                    for &k in &sizes {
                        c.typed::<ByteArrayType>().write_batch(&v[..k], None, None).unwrap();
                    }
                }
                "INT64" => {
                    for &k in &sizes {
                        c.typed::<Int64Type>().write_batch(&vec![1; k], None, None).unwrap();
                    }
                }
                "BOOLEAN" => {
                    for &k in &sizes {
                        c.typed::<BoolType>().write_batch(&vec![false; k], None, None).unwrap();
                    }
                }
                _ => {
                    for &k in &sizes {
                        c.typed::<DoubleType>().write_batch(&vec![2.5; k], None, None).unwrap();
                    }
                }
            }
            c.close().unwrap();
        }
        g.close().unwrap();
        w.close().unwrap();
        let sidecar = json!({"schema_name": SCHEMA_NAME, "schema_version": 7, "coordinate_system": COORDINATE_SYSTEM,
            "measurement_policy": MEASUREMENT_POLICIES[0], "system": "h200_sxm", "backend": "vllm",
            "backend_version": "0.24.0", "row_count": rows,
            "parquet_sha256": crate::fpm_interp::sha256_file(path).unwrap()});
        std::fs::write(path.with_extension("metadata.json"), sidecar.to_string()).unwrap();
    }

    fn cfg(path: &Path) -> AisConfig {
        let v = json!({"model": "Qwen/Qwen3-8B", "system": "h200_sxm", "backend": "vllm", "backend_version": "0.24.0",
            "estimation_mode": "fpm_interpolation", "fpm_parquet_path": path.to_str().unwrap()});
        AisConfig::from_json("", &v).unwrap()
    }

    fn dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("servesim-perf-fpm-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// A well-formed table is checked, only read, and selected for interpolation; one whose
    /// sidecar digest does not match its bytes is refused with both digests.
    #[test]
    fn a_valid_table_is_selected_and_a_foreign_digest_refused() {
        let path = dir().join("valid.parquet");
        write_table(&path, "", false, 1);
        let before = std::fs::read(&path).unwrap();
        assert_eq!(check_table(&path, &cfg(&path)), Ok(1));
        assert_eq!(select(&cfg(&path)), Ok(Some(path.clone())));
        assert_eq!(std::fs::read(&path).unwrap(), before);
        let sidecar = path.with_extension("metadata.json");
        let actual = crate::fpm_interp::sha256_file(&path).unwrap();
        let text = std::fs::read_to_string(&sidecar).unwrap().replace(&actual, &"0".repeat(64));
        std::fs::write(&sidecar, text).unwrap();
        let e = select(&cfg(&path)).unwrap_err().message;
        assert_eq!(
            e,
            format!(
                "perf database error: FPM parquet digest mismatch: sidecar=Some(String(\"{}\")) actual=\"{actual}\". \
                 The pair at {} is inconsistent (interrupted writer?).",
                "0".repeat(64),
                dir().display()
            )
        );
    }

    /// Malformed tables: the file and the column named, as errors (no panic).
    #[test]
    fn malformed_tables_name_the_file_and_column() {
        let d = dir();
        let missing = d.join("missing.parquet");
        write_table(&missing, "latency_ms", false, 1);
        let e = check_table(&missing, &cfg(&missing)).unwrap_err().message;
        assert!(
            e.starts_with(&format!(
                "perf database error: parquet column \"latency_ms\" missing at {}",
                missing.display()
            )),
            "{e}"
        );
        let typed = d.join("typed.parquet");
        write_table(&typed, "", true, 1);
        let e = check_table(&typed, &cfg(&typed)).unwrap_err().message;
        assert!(
            e.contains(&format!("FPM column \"latency_ms\" of {} must hold floating-point values", typed.display())),
            "{e}"
        );
        let empty = d.join("empty.parquet");
        write_table(&empty, "", false, 0);
        let e = check_table(&empty, &cfg(&empty)).unwrap_err().message;
        assert_eq!(e, format!("perf database error: FPM database contains no rows: {}", empty.display()));
        let other = d.join("other.parquet");
        write_table(&other, "", false, 1);
        std::fs::write(other.with_extension("metadata.json"), r#"{"schema_name": "x"}"#).unwrap();
        let e = check_table(&other, &cfg(&other)).unwrap_err().message;
        assert!(e.contains("unsupported FPM schema_name=Some(\"x\") (expected \"aic_fpm_forward_perf\")"), "{e}");
        // A file past the size bound is refused before it is hashed (sparse: nothing written).
        let huge = d.join("huge.parquet");
        std::fs::File::create(&huge).unwrap().set_len(MAX_TABLE_BYTES + 1).unwrap();
        let e = check_table(&huge, &cfg(&huge)).unwrap_err().message;
        assert!(
            e.contains(&format!(
                "FPM table {} is {} bytes; servesim reads at most",
                huge.display(),
                MAX_TABLE_BYTES + 1
            )),
            "{e}"
        );
        std::fs::remove_file(&huge).unwrap();
        // With `fallback_policy: allow`, a malformed table falls back to op_level.
        let mut c = cfg(&missing);
        c.raw["fallback_policy"] = json!("allow");
        assert_eq!(select(&c), Ok(None));
    }

    /// A table of more rows than servesim decodes (a small file: its values repeat) is refused
    /// from its footer on every way to it: checked at `fpm_parquet_path`, loaded directly, and
    /// found in the version directory of a systems root (where a named FPM profile is
    /// materialised, and where the engine's default table lives).
    #[test]
    fn a_table_over_the_row_bound_is_refused_before_it_is_decoded() {
        let root = dir().join("rows");
        let table = root.join("data/h200_sxm/vllm/0.24.0").join(TABLE_BASENAME);
        std::fs::create_dir_all(table.parent().unwrap()).unwrap();
        let rows = crate::fpm_interp::MAX_ROWS + 1;
        write_table(&table, "", false, rows);
        assert!(std::fs::metadata(&table).unwrap().len() < MAX_TABLE_BYTES, "under the size bound");
        let want = format!(
            "perf database error: FPM table {} has {rows} rows; servesim reads at most {}",
            table.display(),
            crate::fpm_interp::MAX_ROWS
        );
        assert_eq!(check_table(&table, &cfg(&table)).unwrap_err().message, want);
        assert_eq!(select(&cfg(&table)).unwrap_err().message, want);
        let identity: Vec<String> = vec![String::new(); crate::fpm_interp::MATCH_COLUMNS.len()];
        let e = crate::fpm_interp::FpmTable::load(&table, &identity, "Qwen/Qwen3-8B", "h200_sxm", "vllm", "0.24.0")
            .unwrap_err();
        assert_eq!(e.message, want);
        // The version directory of a systems root (the installed H200 description beside it).
        let installed = crate::systems::systems_roots(&[])
            .ok()
            .and_then(|roots| roots.into_iter().map(|(r, _)| r.join("h200_sxm.yaml")).find(|p| p.is_file()));
        let Some(yaml) = installed else {
            eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the systems-root case");
            return;
        };
        std::fs::copy(yaml, root.join("h200_sxm.yaml")).unwrap();
        let v = json!({"model": "Qwen/Qwen3-8B", "system": "h200_sxm", "backend": "vllm", "backend_version": "0.24.0",
            "estimation_mode": "fpm_interpolation", "systems_paths": [root.to_str().unwrap()]});
        let c = AisConfig::from_json("", &v).unwrap();
        assert_eq!(select(&c).unwrap_err().message, want);
    }
}
