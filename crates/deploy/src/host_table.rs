//! Measured host cost tables (`engine.workers.<role>.host_profile.path`): the frontend stages
//! collected on one serving host, one row per measured workload, in the reference's schema-3
//! JSON (`aisimulate.vl.table`). servesim only reads a table, never writes one: it is a user
//! input, read whole up to [`MAX_TABLE_BYTES`] and checked strictly (unknown keys included).
//! A row is looked up exactly (model, frontend, feature transport and image workload all
//! equal); nothing is interpolated or defaulted, and a missing row fails with the command
//! that measures it, in the reference's words.

use std::io::Read;
use std::path::Path;

use serde_json::Value;
use servesim_config::Reader;
use servesim_replay::FrontendStage;

use crate::error::DeployError;
use crate::reader::ErrAt;
use crate::schema::frontend::{read_stages, Measurement};

/// The sglang release whose frontend the stage boundaries were defined on.
pub const SGLANG_VERSION: &str = "0.5.19";

/// The largest table read (a table of thousands of rows is well under a megabyte).
pub const MAX_TABLE_BYTES: u64 = 16 << 20;

/// The stages of the row of `path` measured for exactly `needed`; the error is the message to
/// show (it names the file and, for a missing row, the measurement and how to collect it).
pub fn resolve(path: &Path, needed: &Measurement) -> Result<Vec<FrontendStage>, String> {
    resolve_row(path, needed).map(|(stages, _)| stages)
}

/// [`resolve`], with the row's digest as the reference computes it (`HostCostTable.digest`: the
/// first 16 hex digits of the SHA-256 of the environment, measurement and stages as Python's
/// `json.dumps(..., sort_keys=True)` writes them; the row's provenance does not change it).
pub fn resolve_row(path: &Path, needed: &Measurement) -> Result<(Vec<FrontendStage>, String), String> {
    let shown = path.display().to_string();
    if !path.exists() {
        return Err(format!(
            "host cost table {shown} does not exist yet. Measure the workload on the serving host, from an \
             interpreter with aisimulate installed. Replace the --sglang-python placeholder with the serving \
             interpreter's path, then rerun:\n  {}",
            collect_command(&shown, needed)
        ));
    }
    let invalid = |why: String| {
        format!("host cost table {shown} is not a valid schema-3 table ({why}); re-collect it with this release")
    };
    let text = read_bounded(path).map_err(invalid)?;
    let table: Value = serde_json::from_str(&text).map_err(|e| invalid(format!("not JSON: {e}")))?;
    let (version, rows) = read_table(&table).map_err(|e| invalid(e.to_string()))?;
    let environment = &table["environment"];
    if release(&version) != SGLANG_VERSION {
        return Err(format!(
            "host cost table {shown} was measured with sglang {version}; the frontend model is defined on \
             {SGLANG_VERSION}"
        ));
    }
    let row = rows.into_iter().find(|(measured, _)| measured == needed);
    row.map(|(measured, stages)| {
        let digest = row_digest(environment, &measured, &stages);
        (stages, digest)
    })
    .ok_or_else(|| {
        format!(
            "host cost table {shown} has no row for {}. Measure it on the serving host, from an interpreter with \
             aisimulate installed. Replace the --sglang-python placeholder with the serving interpreter's path, \
             then rerun:\n  {}",
            needed.describe(),
            collect_command(&shown, needed)
        )
    })
}

fn row_digest(environment: &Value, m: &Measurement, stages: &[FrontendStage]) -> String {
    use sha2::Digest;
    let text = |v: &str| serde_json::to_string(v).expect("a string");
    let opt = |v: Option<u32>| v.map_or("null".to_string(), |n| n.to_string());
    let env: Vec<String> = ["cpu", "python", "sglang_version"]
        .iter()
        .map(|k| format!("{}: {}", text(k), text(environment[*k].as_str().unwrap_or(""))))
        .collect();
    let measured = format!(
        "{{\"count\": {}, \"encoding\": {}, \"feature_transport\": {}, \"frontend\": {}, \"height\": {}, \
         \"max_pixels\": {}, \"min_pixels\": {}, \"model\": {}, \"width\": {}}}",
        m.count,
        text(m.encoding),
        text(m.feature_transport),
        text(m.frontend),
        m.height,
        opt(m.max_pixels),
        opt(m.min_pixels),
        text(&m.model),
        m.width
    );
    let stages: Vec<String> = stages
        .iter()
        .map(|s| {
            let scale: Vec<String> = s.concurrency_scale.iter().map(|x| py_float(*x)).collect();
            format!(
                "{{\"concurrency_scale\": [{}], \"service_ms\": {}, \"workers\": {}}}",
                scale.join(", "),
                py_float(s.service_ms),
                s.workers
            )
        })
        .collect();
    let content = format!(
        "{{\"environment\": {{{}}}, \"measured_for\": {measured}, \"stages\": [{}]}}",
        env.join(", "),
        stages.join(", ")
    );
    let hash = sha2::Sha256::digest(content.as_bytes());
    hash.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// A float as Python's `repr` writes it (`9.0`, `0.25`, `1e-05`, `1e+16`).
fn py_float(x: f64) -> String {
    let exp = if x == 0.0 { 0 } else { x.abs().log10().floor() as i32 };
    if (-4..16).contains(&exp) {
        let s = format!("{x}");
        if s.contains('.') {
            s
        } else {
            format!("{s}.0")
        }
    } else {
        let s = format!("{x:e}");
        let (mantissa, e) = s.split_once('e').unwrap_or((&s, "0"));
        let e: i32 = e.parse().unwrap_or(0);
        format!("{mantissa}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs())
    }
}

/// The table's text: a regular file (a pipe or a device could block or never end) of at most
/// [`MAX_TABLE_BYTES`].
fn read_bounded(path: &Path) -> Result<String, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read it: {e}"))?;
    if !meta.is_file() {
        return Err("not a regular file".to_string());
    }
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read it: {e}"))?;
    let mut text = String::new();
    file.take(MAX_TABLE_BYTES + 1).read_to_string(&mut text).map_err(|e| format!("cannot read it: {e}"))?;
    if text.len() as u64 > MAX_TABLE_BYTES {
        return Err(format!("larger than {} MiB", MAX_TABLE_BYTES >> 20));
    }
    Ok(text)
}

/// The table's sglang version and its rows, checked against the schema.
#[allow(clippy::type_complexity)]
fn read_table(table: &Value) -> Result<(String, Vec<(Measurement, Vec<FrontendStage>)>), DeployError> {
    let mut t = Reader::mapping("", table)?;
    match t.value("schema_version") {
        Some(v) if v.as_u64() == Some(3) => {}
        Some(v) => return Err(t.err("schema_version", format!("must be 3, got {v}"))),
        None => return Err(t.err("schema_version", "is required")),
    }
    let mut env = t.obj("environment")?.ok_or_else(|| t.err("environment", "is required"))?;
    let mut version = None;
    for key in ["cpu", "sglang_version", "python"] {
        let v = env.text(key)?.ok_or_else(|| env.err(key, "is required"))?;
        if key == "sglang_version" {
            version = Some(v);
        }
    }
    env.finish()?;
    let rows = match t.value("rows") {
        None => Vec::new(),
        Some(Value::Array(rows)) => rows
            .iter()
            .enumerate()
            .map(|(i, row)| {
                let mut r = Reader::mapping(&format!("rows[{i}]"), row)?;
                let measured =
                    Measurement::read(r.obj("measured_for")?.ok_or_else(|| r.err("measured_for", "is required"))?)?;
                let stages = read_stages(&r.path("stages"), r.value("stages"))?;
                match r.value("provenance") {
                    None | Some(Value::Object(_)) => {}
                    Some(_) => return Err(r.err("provenance", "must be a mapping")),
                }
                r.finish()?;
                Ok((measured, stages))
            })
            .collect::<Result<_, DeployError>>()?,
        Some(_) => return Err(t.err("rows", "must be a list")),
    };
    t.finish()?;
    Ok((version.expect("read above"), rows))
}

/// `major.minor.patch` of a version string, local suffixes dropped.
fn release(version: &str) -> String {
    let public = version.split('+').next().unwrap_or("");
    public.split('.').take(3).collect::<Vec<_>>().join(".")
}

/// The command that measures a missing row on the serving host (the reference's
/// `aisimulate.vl.collect`), each argument quoted for a POSIX shell as Python's `shlex.quote`.
fn collect_command(path: &str, m: &Measurement) -> String {
    let mut parts = vec![
        "python".to_string(),
        "-m".into(),
        "aisimulate.vl.collect".into(),
        "--table".into(),
        shell_quote(path),
        "--model".into(),
        shell_quote(&m.model),
        "--frontend".into(),
        m.frontend.into(),
        "--images".into(),
        format!("{}x{}x{}", m.height, m.width, m.count),
        "--encoding".into(),
        m.encoding.into(),
    ];
    for (name, value) in [("--min-pixels", m.min_pixels), ("--max-pixels", m.max_pixels)] {
        if let Some(v) = value {
            parts.push(name.into());
            parts.push(v.to_string());
        }
    }
    parts.push("--sglang-python".into());
    parts.push(shell_quote(&format!("<python with sglang {SGLANG_VERSION} installed>")));
    parts.join(" ")
}

fn shell_quote(s: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "@%+=:,./-_".contains(c);
    if !s.is_empty() && s.chars().all(safe) {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', "'\"'\"'"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/deploy/host_profile/table.json").canonicalize().unwrap()
    }

    fn needed(frontend: &'static str, tensor: u32, images: &str) -> Measurement {
        let v: Value = serde_json::from_str(images).unwrap();
        let images = crate::schema::encoder::read_images(Reader::mapping("images", &v).unwrap()).unwrap();
        Measurement::for_workload("Qwen/Qwen3-VL-8B-Instruct", frontend, &images, tensor)
    }

    /// Floats as Python's `repr` writes them, which the reference's row digest hashes (values
    /// checked against CPython 3.11).
    #[test]
    fn floats_print_as_python_does() {
        let cases = [
            (9.0, "9.0"),
            (0.25, "0.25"),
            (1.8, "1.8"),
            (1e-5, "1e-05"),
            (1.5e-5, "1.5e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (123456789012345.0, "123456789012345.0"),
            (0.0, "0.0"),
        ];
        for (x, want) in cases {
            assert_eq!(py_float(x), want, "{x}");
        }
    }

    /// The python row's digest is the reference's (aisimulate 0.13's prediction.json of
    /// tests/deploy/predict_encoder_native_host_table.yaml with this table: 118c891b6b7cbee2).
    #[test]
    fn row_digest_is_the_references() {
        let (_, digest) = resolve_row(
            &table(),
            &needed("python", 1, r#"{"height": 448, "width": 448, "count": 2, "encoding": "jpeg"}"#),
        )
        .unwrap();
        assert_eq!(digest, "118c891b6b7cbee2");
    }

    fn stage(workers: u32, service_ms: f64, scale: &[f64]) -> FrontendStage {
        FrontendStage { workers, service_ms, concurrency_scale: scale.to_vec() }
    }

    /// Rows are found exactly, with the stages they hold; the feature transport follows the
    /// frontend and the tensor width. The messages are the reference's, recorded by
    /// `/tmp/servesim-aisim-ref/bin/python scripts/host_table_messages.py tests/deploy/host_profile/table.json`
    /// (`aisimulate.vl.table.resolve_frontend` on the same lookups).
    #[test]
    fn rows_are_looked_up_exactly_with_the_references_messages() {
        let path = table();
        let shown = path.display().to_string();
        let rust = resolve(&path, &needed("rust", 1, r#"{"height": 448, "width": 448}"#)).unwrap();
        assert_eq!(rust, vec![stage(2, 4.5, &[1.0, 1.6]), stage(1, 0.25, &[])]);
        let python =
            resolve(&path, &needed("python", 1, r#"{"height": 448, "width": 448, "count": 2, "encoding": "jpeg"}"#));
        assert_eq!(python.unwrap(), vec![stage(2, 9.0, &[1.0, 1.8]), stage(1, 0.5, &[]), stage(1, 0.25, &[])]);
        let missing = resolve(&path, &needed("rust", 2, r#"{"height": 448, "width": 448}"#)).unwrap_err();
        assert_eq!(
            missing,
            format!(
                "host cost table {shown} has no row for Qwen/Qwen3-VL-8B-Instruct rust shm 448x448x1 png. Measure it \
                 on the serving host, from an interpreter with aisimulate installed. Replace the --sglang-python \
                 placeholder with the serving interpreter's path, then rerun:\n  python -m aisimulate.vl.collect \
                 --table {shown} --model Qwen/Qwen3-VL-8B-Instruct --frontend rust --images 448x448x1 --encoding png \
                 --sglang-python '<python with sglang 0.5.19 installed>'"
            )
        );
        let pixels = r#"{"height": 448, "width": 448, "min_pixels": 100, "max_pixels": 20000}"#;
        let missing = resolve(&path, &needed("python", 1, pixels)).unwrap_err();
        assert!(
            missing.contains(
                " has no row for Qwen/Qwen3-VL-8B-Instruct python shm 448x448x1 png min_pixels=100 max_pixels=20000. "
            ),
            "{missing}"
        );
        assert!(missing.ends_with(" --encoding png --min-pixels 100 --max-pixels 20000 --sglang-python '<python with sglang 0.5.19 installed>'"), "{missing}");
    }

    /// A table that does not exist yet, one of another sglang release, and one that breaks the
    /// schema each fail naming the file; odd characters are quoted for the shell.
    #[test]
    fn unusable_tables_fail_naming_the_file() {
        let dir = std::env::temp_dir().join(format!("servesim-host-table-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let absent = dir.join("my table.json");
        let mut m = needed("rust", 1, r#"{"height": 448, "width": 448}"#);
        m.model = "org/it's".into();
        assert_eq!(
            resolve(&absent, &m).unwrap_err(),
            format!(
                "host cost table {0} does not exist yet. Measure the workload on the serving host, from an \
                 interpreter with aisimulate installed. Replace the --sglang-python placeholder with the serving \
                 interpreter's path, then rerun:\n  python -m aisimulate.vl.collect --table '{0}' --model \
                 'org/it'\"'\"'s' --frontend rust --images 448x448x1 --encoding png --sglang-python '<python with \
                 sglang 0.5.19 installed>'",
                absent.display()
            )
        );
        let text = std::fs::read_to_string(table()).unwrap();
        let old = dir.join("old.json");
        std::fs::write(&old, text.replace("0.5.19+cu128", "0.5.18")).unwrap();
        assert_eq!(
            resolve(&old, &m).unwrap_err(),
            format!(
                "host cost table {} was measured with sglang 0.5.18; the frontend model is defined on 0.5.19",
                old.display()
            )
        );
        for (name, edit, why) in [
            ("v2.json", ("\"schema_version\": 3", "\"schema_version\": 2"), "schema_version: must be 3, got 2"),
            ("extra.json", ("\"rows\": [", "\"extra\": 1, \"rows\": ["), "extra: unknown key"),
            ("stage.json", ("\"service_ms\": 0.25}", "\"service_ms\": -1}"), "rows[0].stages[1].service_ms: must be"),
        ] {
            let bad = dir.join(name);
            std::fs::write(&bad, text.replacen(edit.0, edit.1, 1)).unwrap();
            let e = resolve(&bad, &m).unwrap_err();
            let head = format!("host cost table {} is not a valid schema-3 table ({why}", bad.display());
            assert!(e.starts_with(&head), "{e}");
            assert!(e.ends_with("); re-collect it with this release"), "{e}");
        }
        let huge = dir.join("huge.json");
        std::fs::write(&huge, vec![b' '; MAX_TABLE_BYTES as usize + 1]).unwrap();
        assert!(resolve(&huge, &m).unwrap_err().contains("(larger than 16 MiB)"));
        // A directory, or a pipe or a device, is refused before it is read (a FIFO would block).
        assert!(resolve(&dir, &m).unwrap_err().contains("(not a regular file)"));
        #[cfg(unix)]
        assert!(resolve(Path::new("/dev/zero"), &m).unwrap_err().contains("(not a regular file)"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
