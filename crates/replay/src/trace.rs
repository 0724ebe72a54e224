//! Mooncake JSONL traces.
//!
//! One JSON object per line: `timestamp` (ms; alias `created_time`), `input_length` (alias
//! `input_tokens`; defaults to what the hash ids cover), `output_length` (alias `output_tokens`),
//! `hash_ids` (each stands for `trace_block_size` tokens), and optionally `session_id` and
//! `delay` (alias `delay_ms`) for multi-turn conversations. Rows sharing a `session_id` are the
//! turns of one conversation in file order; a turn's think time is its `delay`, or else the gap
//! between its timestamp and the previous turn's. `priority` and `strict_priority` order the KV
//! router's queue; `output_token_ids` fixes the generated tokens. Unknown fields are ignored (traces come from many tools); everything else is
//! validated and reported with file, line and field.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;

use crate::error::InputError;
use crate::workload::{SessionSpec, TurnSpec, Workload};

#[derive(Deserialize)]
struct Row {
    #[serde(default, alias = "created_time")]
    timestamp: Option<f64>,
    #[serde(default, alias = "input_tokens")]
    input_length: Option<u64>,
    #[serde(default, alias = "output_tokens")]
    output_length: Option<u64>,
    #[serde(default)]
    hash_ids: Option<Vec<u64>>,
    #[serde(default)]
    session_id: Option<Value>,
    #[serde(default, alias = "delay_ms")]
    delay: Option<f64>,
    #[serde(default)]
    priority: Option<i32>,
    #[serde(default)]
    strict_priority: Option<u32>,
    #[serde(default)]
    output_token_ids: Option<Vec<u32>>,
}

/// Field names and the types we expect, for errors about rows serde rejected.
const FIELDS: [(&str, &[&str], &str); 9] = [
    ("timestamp", &["timestamp", "created_time"], "a number of milliseconds"),
    ("input_length", &["input_length", "input_tokens"], "a non-negative integer"),
    ("output_length", &["output_length", "output_tokens"], "a non-negative integer"),
    ("hash_ids", &["hash_ids"], "an array of non-negative integers"),
    ("session_id", &["session_id"], "a string"),
    ("delay", &["delay", "delay_ms"], "a number of milliseconds"),
    ("priority", &["priority"], "an integer"),
    ("strict_priority", &["strict_priority"], "a non-negative integer"),
    ("output_token_ids", &["output_token_ids"], "an array of token ids (integers below 2^32)"),
];

/// Finds which field made serde fail, by checking each against its expected type.
fn explain_row_error(line: &str, serde_msg: &str) -> (Option<&'static str>, String) {
    let Ok(Value::Object(map)) = serde_json::from_str::<Value>(line) else {
        return (None, format!("invalid JSON: {serde_msg}"));
    };
    for (name, keys, want) in FIELDS {
        for key in keys {
            let Some(v) = map.get(*key) else { continue };
            let ok = match name {
                "timestamp" | "delay" => v.is_number() || v.is_null(),
                "input_length" | "output_length" | "strict_priority" => {
                    v.as_u64().is_some_and(|n| n <= u32::MAX as u64) || v.is_null()
                }
                "priority" => v.as_i64().is_some_and(|n| i32::try_from(n).is_ok()) || v.is_null(),
                "hash_ids" => v.is_null() || v.as_array().is_some_and(|a| a.iter().all(Value::is_u64)),
                "output_token_ids" => {
                    v.is_null()
                        || v.as_array()
                            .is_some_and(|a| a.iter().all(|t| t.as_u64().is_some_and(|n| n <= u32::MAX as u64)))
                }
                _ => true,
            };
            if !ok {
                return (Some(name), format!("expected {want}, got {v}"));
            }
        }
    }
    (None, format!("invalid row: {serde_msg}"))
}

/// Reads Mooncake traces. Several files are replayed together: each file's sessions are kept
/// apart (a `session_id` is local to its file) and all timestamps share one origin.
pub fn load_mooncake(paths: &[impl AsRef<Path>], trace_block_size: u32) -> Result<Workload, InputError> {
    if trace_block_size == 0 {
        return Err(InputError::new("trace block size must be at least 1").with_field("trace_block_size"));
    }
    let mut sessions = Vec::new();
    for path in paths {
        read_file(path.as_ref(), trace_block_size, &mut sessions)?;
    }
    Ok(Workload::Trace { sessions, block_tokens: trace_block_size })
}

fn read_file(path: &Path, tbs: u32, sessions: &mut Vec<SessionSpec>) -> Result<(), InputError> {
    let file = File::open(path).map_err(|e| InputError::in_file(path, format!("cannot open: {e}")))?;
    let reader = BufReader::with_capacity(1 << 20, file);
    // session_id -> (index in `sessions`, timestamp of its latest row)
    let mut by_id: HashMap<String, (usize, Option<f64>)> = HashMap::new();
    let mut rows = 0usize;
    for (i, line) in reader.lines().enumerate() {
        let lineno = i + 1;
        let line = line.map_err(|e| InputError::at_line(path, lineno, None, format!("cannot read: {e}")))?;
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        rows += 1;
        let err = |field: Option<&str>, msg: String| InputError::at_line(path, lineno, field, msg);
        let row: Row = serde_json::from_str(text).map_err(|e| {
            let (field, msg) = explain_row_error(text, &e.to_string());
            err(field, msg)
        })?;

        let hash_ids = match row.hash_ids {
            Some(ids) if !ids.is_empty() => ids,
            Some(_) => return Err(err(Some("hash_ids"), "must not be empty".into())),
            None => return Err(err(Some("hash_ids"), "missing (required)".into())),
        };
        let capacity = hash_ids.len() as u64 * tbs as u64;
        let input_length = row.input_length.unwrap_or(capacity);
        if input_length > capacity {
            return Err(err(
                Some("input_length"),
                format!(
                    "{input_length} tokens exceed what hash_ids cover ({} ids × trace block size {tbs} = {capacity})",
                    hash_ids.len()
                ),
            ));
        }
        if input_length == 0 {
            return Err(err(Some("input_length"), "must be at least 1".into()));
        }
        let input_length = u32::try_from(input_length)
            .map_err(|_| err(Some("input_length"), format!("{input_length} is too large")))?;
        let output_length = match row.output_length {
            Some(n) => u32::try_from(n).map_err(|_| err(Some("output_length"), format!("{n} is too large")))?,
            None => return Err(err(Some("output_length"), "missing (required)".into())),
        };
        if let Some(ids) = &row.output_token_ids {
            if ids.len() != output_length as usize {
                return Err(err(
                    Some("output_token_ids"),
                    format!("has {} tokens but output_length is {output_length}", ids.len()),
                ));
            }
        }
        if let Some(t) = row.timestamp {
            if !t.is_finite() {
                return Err(err(Some("timestamp"), format!("must be finite, got {t}")));
            }
        }
        if let Some(d) = row.delay {
            if !d.is_finite() || d < 0.0 {
                return Err(err(Some("delay"), format!("must be a finite number ≥ 0, got {d}")));
            }
        }
        // Only the blocks the prompt reaches matter.
        let used = input_length.div_ceil(tbs) as usize;
        let blocks: Arc<[u32]> = hash_ids[..used].iter().map(|&h| h as u32).collect();
        let turn = TurnSpec {
            input_length,
            output_length,
            blocks,
            delay_ms: 0.0,
            priority: row.priority.unwrap_or(0),
            strict_priority: row.strict_priority.unwrap_or(0),
            output_tokens: row.output_token_ids.map(Into::into),
        };

        let session_id = match row.session_id {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s),
            Some(Value::Number(n)) => Some(n.to_string()),
            Some(other) => return Err(err(Some("session_id"), format!("expected a string, got {other}"))),
        };
        match session_id {
            None => {
                if row.delay.is_some_and(|d| d != 0.0) {
                    return Err(err(Some("delay"), "a request without session_id cannot have a delay".into()));
                }
                sessions.push(SessionSpec {
                    name: format!("request_{lineno}").into(),
                    start_ms: row.timestamp.unwrap_or(0.0),
                    turns: vec![turn],
                });
            }
            Some(id) => match by_id.get_mut(&id) {
                None => {
                    if row.delay.is_some_and(|d| d != 0.0) {
                        return Err(err(Some("delay"), "the first turn of a session cannot have a delay".into()));
                    }
                    by_id.insert(id.clone(), (sessions.len(), row.timestamp));
                    sessions.push(SessionSpec {
                        name: id.into(),
                        start_ms: row.timestamp.unwrap_or(0.0),
                        turns: vec![turn],
                    });
                }
                Some((index, last_ts)) => {
                    let delay = match (row.delay, row.timestamp, *last_ts) {
                        (Some(d), _, _) => d,
                        (None, Some(t), Some(prev)) => {
                            if t < prev {
                                return Err(err(
                                    Some("timestamp"),
                                    format!("{t} is earlier than the previous turn of session {id:?} ({prev})"),
                                ));
                            }
                            t - prev
                        }
                        _ => 0.0,
                    };
                    if row.timestamp.is_some() {
                        *last_ts = row.timestamp;
                    }
                    sessions[*index].turns.push(TurnSpec { delay_ms: delay, ..turn });
                }
            },
        }
    }
    if rows == 0 {
        return Err(InputError::in_file(path, "the trace has no requests"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn write_trace(name: &str, text: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("servesim-trace-{}-{}", std::process::id(), name));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("t.jsonl");
        std::fs::File::create(&p).unwrap().write_all(text.as_bytes()).unwrap();
        p
    }

    fn load(name: &str, text: &str) -> Result<Vec<SessionSpec>, InputError> {
        match load_mooncake(&[write_trace(name, text)], 512)? {
            Workload::Trace { sessions, .. } => Ok(sessions),
            Workload::Synthetic(_) => unreachable!("a trace loads as a trace"),
        }
    }

    #[test]
    fn rows_sessions_and_aliases() {
        let w = load(
            "ok",
            r#"{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2, 3]}

{"session_id":"a","created_time":1000,"input_tokens":100,"output_tokens":3,"hash_ids":[9]}
{"session_id":"a","delay_ms":50,"input_length":700,"output_length":3,"hash_ids":[9,10]}
{"session_id":"a","timestamp":1300,"output_length":3,"hash_ids":[9,10,11]}
"#,
        )
        .unwrap();
        assert_eq!(w.len(), 2);
        let r = &w[0];
        assert_eq!((&*r.name, r.turns[0].input_length), ("request_1", 600));
        assert_eq!(&*r.turns[0].blocks, &[1, 2], "only the blocks the prompt reaches are kept");
        let a = &w[1];
        assert_eq!((&*a.name, a.start_ms, a.turns.len()), ("a", 1000.0, 3));
        assert_eq!(a.turns[1].delay_ms, 50.0);
        // No delay given: the timestamp gap to the last row that had one.
        assert_eq!(a.turns[2].delay_ms, 300.0);
        assert_eq!(a.turns[2].input_length, 1536, "input_length defaults to the hash capacity");
    }

    #[test]
    fn priorities_are_read() {
        let w = load(
            "prio",
            "{\"timestamp\": 0, \"output_length\": 1, \"hash_ids\": [1], \"priority\": -3, \"strict_priority\": 2}",
        )
        .unwrap();
        let t = &w[0].turns[0];
        assert_eq!((t.priority, t.strict_priority), (-3, 2));
        let e = error("prio-bad", r#"{"output_length": 1, "hash_ids": [1], "strict_priority": -1}"#);
        assert!(e.contains("`strict_priority`"), "{e}");
    }

    #[test]
    fn planned_output_tokens() {
        let w = load("planned", r#"{"output_length": 3, "hash_ids": [1], "output_token_ids": [5, 6, 7]}"#).unwrap();
        assert_eq!(w[0].turns[0].output_tokens.as_deref(), Some(&[5, 6, 7][..]));
        let e = error("planned-bad", r#"{"output_length": 2, "hash_ids": [1], "output_token_ids": [5, 6, 7]}"#);
        assert!(e.contains("`output_token_ids`: has 3 tokens but output_length is 2"), "{e}");
    }

    fn error(name: &str, text: &str) -> String {
        load(name, text).unwrap_err().to_string()
    }

    #[test]
    fn errors_name_line_and_field() {
        let e = error("json", "{\"timestamp\": 0, \"output_length\": 1, \"hash_ids\": [1]}\n{\"timestamp\": 0,");
        assert!(e.contains("t.jsonl:2: invalid JSON: EOF while parsing"), "{e}");
        let e = error("missing", r#"{"timestamp": 0, "input_length": 10, "hash_ids": [1]}"#);
        assert!(e.ends_with("t.jsonl:1: `output_length`: missing (required)"), "{e}");
        let e = error("short", r#"{"timestamp": 0, "input_length": 2000, "output_length": 2, "hash_ids": [1]}"#);
        assert!(e.contains(":1: `input_length`: 2000 tokens exceed what hash_ids cover"), "{e}");
        let e = error("type", r#"{"timestamp": "soon", "output_length": 2, "hash_ids": [1]}"#);
        assert!(e.contains(":1: `timestamp`: expected a number of milliseconds, got \"soon\""), "{e}");
        let e = error("ids", r#"{"output_length": 2, "hash_ids": [1, -2]}"#);
        assert!(e.contains(":1: `hash_ids`: expected an array of non-negative integers"), "{e}");
        let e = error("empty", "\n\n");
        assert!(e.ends_with("t.jsonl: the trace has no requests"), "{e}");
        let e = error("delay", r#"{"session_id": "s", "delay": 5, "output_length": 2, "hash_ids": [1]}"#);
        assert!(e.contains(":1: `delay`: the first turn"), "{e}");
        let e = load_mooncake(&[std::path::Path::new("/nonexistent/trace.jsonl")], 512).unwrap_err().to_string();
        assert!(e.starts_with("/nonexistent/trace.jsonl: cannot open"), "{e}");
    }
}
