//! Request rows for the Planner's load-predictor backtest: each request's arrival (ms),
//! input length and output length, read as the Planner's trace utility (`trace_data.py`)
//! reads them. Only those three fields are read and checked; the full readers
//! ([`crate::formats`]) validate everything else a replay needs. Mooncake rows give
//! `timestamp`, `input_length` and `output_length`; a Dynamo request trace gives its
//! `request_end` events (`request_received_ms`, else the event time; the replay's
//! `input_length`; `output_tokens`), other events skipped.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

/// One request: arrival (ms, as the trace writes it), input length, output length.
pub type Row = (f64, u64, u64);

/// The trace formats the backtest reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowFormat {
    Mooncake,
    Dynamo,
}

/// The trace files under `dir`, sorted. Symbolic links are refused, as the trace readers refuse
/// them in a corpus: followed, a link to an ancestor would make the walk endless.
pub fn trace_files(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(&d).map_err(|e| format!("{}: cannot read: {e}", d.display()))?;
        for e in entries {
            let e = e.map_err(|e| format!("{}: cannot read: {e}", d.display()))?;
            let p = e.path();
            let ty = e.file_type().map_err(|e| format!("{}: {e}", p.display()))?;
            if ty.is_symlink() {
                return Err(format!("{}: a trace directory may not contain symbolic links", p.display()));
            }
            if ty.is_dir() {
                stack.push(p);
            } else if p
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(".jsonl") || n.ends_with(".jsonl.gz"))
            {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Appends the rows of one trace file; an error names the file and line.
pub fn read(path: &Path, format: RowFormat, rows: &mut Vec<Row>) -> Result<(), String> {
    let input = crate::input::TraceInput::open(path).map_err(|e| e.to_string())?;
    let mut lines = crate::input::Lines::open(&input).map_err(|e| e.to_string())?;
    while let Some(line) = lines.next_line() {
        let (n, bytes) = line.map_err(|e| e.to_string())?;
        let text = std::str::from_utf8(bytes).map_err(|_| format!("{}:{n}: not UTF-8", path.display()))?;
        if text.trim().is_empty() {
            continue;
        }
        let at = format!("{}:{n}", path.display());
        let v: Value = serde_json::from_str(text).map_err(|e| format!("Invalid JSON at {at}: {e}"))?;
        let record = v.as_object().ok_or_else(|| format!("Trace row at {at} must be a JSON object"))?;
        let event = match record.get("event") {
            Some(Value::Object(e)) => e,
            _ => record,
        };
        let number = |m: &Map<String, Value>, k: &str| -> Result<f64, String> {
            match m.get(k) {
                Some(Value::Number(x)) if x.as_f64().is_some_and(f64::is_finite) => Ok(x.as_f64().unwrap_or(0.0)),
                _ => Err(format!("{k} must be numeric at {at}")),
            }
        };
        let length = |m: &Map<String, Value>, k: &str| -> Result<u64, String> {
            m.get(k).and_then(Value::as_u64).ok_or_else(|| format!("{k} must be a non-negative integer at {at}"))
        };
        let dynamo = event.get("schema").and_then(Value::as_str) == Some("dynamo.request.trace.v1");
        if format == RowFormat::Dynamo {
            let kind = event.get("event_type").and_then(Value::as_str);
            if kind.is_some() && kind != Some("request_end") {
                continue;
            }
            if !dynamo {
                return Err(format!("Mixed or unsupported warmup trace format at {at}: expected dynamo"));
            }
            if kind != Some("request_end") {
                continue;
            }
            let request = event
                .get("request")
                .and_then(Value::as_object)
                .ok_or_else(|| format!("request_end is missing request payload at {at}"))?;
            let replay = request
                .get("replay")
                .and_then(Value::as_object)
                .ok_or_else(|| format!("request payload is missing replay metrics at {at}"))?;
            let t = if request.get("request_received_ms").is_some_and(|v| !v.is_null()) {
                number(request, "request_received_ms")?
            } else {
                number(event, "event_time_unix_ms")?
            };
            rows.push((t, length(replay, "input_length")?, length(request, "output_tokens")?));
        } else {
            if dynamo || !["timestamp", "input_length", "output_length"].iter().all(|k| record.contains_key(*k)) {
                return Err(format!("Mixed or unsupported warmup trace format at {at}: expected mooncake"));
            }
            rows.push((
                number(record, "timestamp")?,
                length(record, "input_length")?,
                length(record, "output_length")?,
            ));
        }
    }
    Ok(())
}
