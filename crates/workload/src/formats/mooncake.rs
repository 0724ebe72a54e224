//! Mooncake JSONL traces.
//!
//! One JSON object per line: `timestamp` (ms; alias `created_time`), `input_length` (alias
//! `input_tokens`; defaults to what the hash ids cover), `output_length` (alias `output_tokens`),
//! `hash_ids` (each stands for `trace_block_size` tokens), and optionally `session_id` and
//! `delay` (alias `delay_ms`) for multi-turn conversations. Rows sharing a `session_id` are the
//! turns of one conversation in file order; a turn's think time is its `delay`, or else the gap
//! between its timestamp and the previous turn's. `priority` and `strict_priority` order the KV
//! router's queue; `output_token_ids` fixes the generated tokens. Unknown fields are ignored
//! (traces come from many tools); everything else is validated and reported with file, line and
//! field.
//!
//! Every row is validated before the replay starts. Traces of single requests in timestamp order
//! are then read again row by row while the replay runs ([`StreamedTrace`]); others are held in
//! memory at trace-block level. [`crate::formats::load_mooncake`] makes either a [`crate::Workload`].

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde::Deserialize;
use serde_json::Value;

use crate::error::InputError;
use crate::ids::{Ids, MAX_TIME_MS};
use crate::input::{not_an_object, Lines, TraceInput};
use crate::session::{SessionSpec, TurnMeta, TurnSpec};

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
    #[serde(default)]
    request_id: Option<String>,
    #[serde(default)]
    policy_class: Option<String>,
}

/// Field names and the types we expect, for errors about rows serde rejected.
const FIELDS: [(&str, &[&str], &str); 11] = [
    ("timestamp", &["timestamp", "created_time"], "a number of milliseconds"),
    ("input_length", &["input_length", "input_tokens"], "a non-negative integer"),
    ("output_length", &["output_length", "output_tokens"], "a non-negative integer"),
    ("hash_ids", &["hash_ids"], "an array of non-negative integers"),
    ("session_id", &["session_id"], "a string"),
    ("delay", &["delay", "delay_ms"], "a number of milliseconds"),
    ("priority", &["priority"], "an integer"),
    ("strict_priority", &["strict_priority"], "a non-negative integer"),
    ("output_token_ids", &["output_token_ids"], "an array of token ids (integers below 2^32)"),
    ("request_id", &["request_id"], "a string"),
    ("policy_class", &["policy_class"], "a string"),
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
                "request_id" | "policy_class" => v.is_string() || v.is_null(),
                _ => true,
            };
            if !ok {
                return (Some(name), format!("expected {want}, got {v}"));
            }
        }
    }
    (None, format!("invalid row: {serde_msg}"))
}

/// A validated Mooncake trace, as [`load`] found it.
pub enum Mooncake {
    /// Single requests in timestamp order, read again row by row while the replay runs.
    Streamed(StreamedTrace),
    /// Every session, held at trace-block level.
    Sessions(Vec<SessionSpec>),
}

/// Reads Mooncake traces (`mooncake`). Several files are replayed together: each file's
/// sessions are kept apart (a `session_id` is local to its file) and all timestamps share one
/// origin. Files may be gzip or zstd compressed, and may be pipes.
///
/// Every row is validated before anything is replayed. A trace whose sessions are single
/// requests in timestamp order — what Mooncake traces are — is then streamed from its files
/// during the replay ([`Mooncake::Streamed`]), so memory follows the requests in flight rather
/// than the trace's length; any other trace is held in memory at trace-block level.
pub fn load(paths: &[impl AsRef<Path>], trace_block_size: u32) -> Result<Mooncake, InputError> {
    let v = validate(paths, trace_block_size)?;
    if v.streamable {
        return Ok(Mooncake::Streamed(StreamedTrace::new(v.inputs, trace_block_size, v.rows, v.interned)));
    }
    Ok(Mooncake::Sessions(v.sessions(trace_block_size)?))
}

/// `mooncake-delta`: each row holds only the turn's new tokens; a turn's prompt is the
/// session's earlier prompts and outputs followed by them (held in memory).
pub fn load_delta(paths: &[impl AsRef<Path>], trace_block_size: u32) -> Result<Vec<SessionSpec>, InputError> {
    validate(paths, trace_block_size)?.sessions(trace_block_size)
}

/// The files of a trace, every row validated.
struct Validated {
    inputs: Vec<TraceInput>,
    /// Rows of each file.
    rows: Vec<u64>,
    /// Every session is one request and sessions start in file order.
    streamable: bool,
    /// Hash ids are interned (see [`Ids`]).
    interned: bool,
}

impl Validated {
    /// The sessions of every file, in file order.
    fn sessions(&self, trace_block_size: u32) -> Result<Vec<SessionSpec>, InputError> {
        let mut sessions = Vec::new();
        let mut ids = Ids::new(self.interned);
        for input in &self.inputs {
            read_file(input, trace_block_size, &mut ids, &mut sessions)?;
        }
        Ok(sessions)
    }
}

fn validate(paths: &[impl AsRef<Path>], trace_block_size: u32) -> Result<Validated, InputError> {
    if trace_block_size == 0 {
        return Err(InputError::new("trace block size must be at least 1").with_field("trace_block_size"));
    }
    let mut inputs = Vec::with_capacity(paths.len());
    let mut rows = Vec::with_capacity(paths.len());
    let mut streamable = true;
    let mut wide_ids = false;
    let mut order = IdOrder::default();
    for path in paths {
        let input = TraceInput::open(path.as_ref())?;
        let scan = scan_file(&input, trace_block_size, &mut order)?;
        rows.push(scan.rows);
        streamable &= scan.streamable;
        wide_ids |= scan.wide_ids;
        inputs.push(input);
    }
    let interned = wide_ids || !order.first_seen;
    Ok(Validated { inputs, rows, streamable, interned })
}

/// A `session_id` as written: `1` and `"1"` are different sessions.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct SessionKey {
    numeric: bool,
    name: String,
}

/// One validated row.
struct ParsedRow {
    /// Every id the row lists, reached by its prompt or not (the reference numbers them all).
    hash_ids: Vec<u64>,
    /// How many leading ids the prompt reaches: its blocks.
    reached: usize,
    turn: TurnSpec,
    session_id: Option<SessionKey>,
    timestamp: Option<f64>,
    delay: Option<f64>,
}

impl ParsedRow {
    /// The row as a session of its own (its start is its timestamp, 0 without one).
    fn into_session(self, blocks: Arc<[u32]>) -> SessionSpec {
        SessionSpec {
            name: self.session_id.map(|id| id.name.into()),
            start_ms: self.timestamp.unwrap_or(0.0),
            turns: vec![TurnSpec { blocks, ..self.turn }],
        }
    }
}

/// The non-empty lines of a trace file with their line numbers, parsed and validated.
struct Rows {
    lines: Lines,
    tbs: u32,
    first: bool,
}

impl Rows {
    fn open(input: &TraceInput, tbs: u32) -> Result<Rows, InputError> {
        Ok(Rows { lines: Lines::open(input)?, tbs, first: true })
    }
}

impl Iterator for Rows {
    type Item = Result<(usize, ParsedRow), InputError>;

    fn next(&mut self) -> Option<Self::Item> {
        let first = std::mem::replace(&mut self.first, false);
        let tbs = self.tbs;
        let path = self.lines.path().to_path_buf();
        match self.lines.next_line()? {
            Err(e) => Some(Err(e)),
            Ok((lineno, text)) => Some(parse_row(text, &path, lineno, tbs, first).map(|row| (lineno, row))),
        }
    }
}

fn parse_row(text: &[u8], path: &Path, lineno: usize, tbs: u32, first: bool) -> Result<ParsedRow, InputError> {
    let err = |field: Option<&str>, msg: String| InputError::at_line(path, lineno, field, msg);
    if let Some(why) = not_an_object(text, first) {
        return Err(err(None, why));
    }
    let row: Row = serde_json::from_slice(text).map_err(|e| {
        let (field, msg) = explain_row_error(&String::from_utf8_lossy(text), &e.to_string());
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
    let input_length =
        u32::try_from(input_length).map_err(|_| err(Some("input_length"), format!("{input_length} is too large")))?;
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
        if !t.is_finite() || t.abs() > MAX_TIME_MS {
            return Err(err(
                Some("timestamp"),
                format!("{t} is outside the supported range (±{MAX_TIME_MS:e} ms); timestamps are milliseconds"),
            ));
        }
    }
    if let Some(d) = row.delay {
        if !d.is_finite() || !(0.0..=MAX_TIME_MS).contains(&d) {
            return Err(err(
                Some("delay"),
                format!("must be a finite number of milliseconds in 0..={MAX_TIME_MS:e}, got {d}"),
            ));
        }
    }
    let session_id = match row.session_id {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(SessionKey { numeric: false, name: s }),
        Some(Value::Number(n)) => Some(SessionKey { numeric: true, name: n.to_string() }),
        Some(other) => return Err(err(Some("session_id"), format!("expected a string, got {other}"))),
    };
    if session_id.is_none() && row.delay.is_some_and(|d| d != 0.0) {
        return Err(err(Some("delay"), "a request without session_id cannot have a delay".into()));
    }
    let reached = input_length.div_ceil(tbs) as usize;
    let meta = (row.request_id.is_some() || row.policy_class.is_some()).then(|| {
        Arc::new(TurnMeta {
            request_id: row.request_id.map(Into::into),
            policy_class: row.policy_class.map(Into::into),
            agentic: None,
        })
    });
    let turn = TurnSpec {
        input_length,
        output_length,
        blocks: Arc::new([]),
        delay_ms: 0.0,
        priority: row.priority.unwrap_or(0),
        strict_priority: row.strict_priority.unwrap_or(0),
        output_tokens: row.output_token_ids.map(Into::into),
        meta,
    };
    Ok(ParsedRow { hash_ids, reached, turn, session_id, timestamp: row.timestamp, delay: row.delay })
}

/// Whether the hash ids met so far are numbered in first-seen order: each id is one already
/// met or the next number (then interning maps every id to itself).
struct IdOrder {
    /// How many distinct ids were met (they are 0..next while `first_seen` holds).
    next: u64,
    first_seen: bool,
}

impl Default for IdOrder {
    fn default() -> Self {
        IdOrder { next: 0, first_seen: true }
    }
}

impl IdOrder {
    fn see(&mut self, ids: &[u64]) {
        for &id in ids {
            if id == self.next {
                self.next += 1;
            } else if id > self.next {
                self.first_seen = false;
                return;
            }
        }
    }
}

/// What a validating pass over a file found.
struct Scan {
    rows: u64,
    /// Every session is one request and sessions start in file order.
    streamable: bool,
    /// Some hash id does not fit in 32 bits (ids are then interned).
    wide_ids: bool,
}

/// Validates every row of a file without keeping them. A `session_id` seen twice makes the
/// file not streamable (its turns are then checked by [`read_file`]). `order` follows the
/// numbering of hash ids across the files of a trace, in file order.
fn scan_file(input: &TraceInput, tbs: u32, order: &mut IdOrder) -> Result<Scan, InputError> {
    let path = input.path();
    let mut seen: HashSet<SessionKey> = HashSet::new();
    let mut rows = 0;
    let mut streamable = true;
    let mut wide_ids = false;
    let mut last_start = f64::NEG_INFINITY;
    for row in Rows::open(input, tbs)? {
        let (lineno, row) = row?;
        rows += 1;
        wide_ids |= row.hash_ids.iter().any(|&h| h > u32::MAX as u64);
        if order.first_seen {
            order.see(&row.hash_ids);
        }
        if let Some(id) = &row.session_id {
            if !seen.insert(id.clone()) {
                streamable = false;
            } else if row.delay.is_some_and(|d| d != 0.0) {
                return Err(InputError::at_line(
                    path,
                    lineno,
                    Some("delay"),
                    format!("the first turn of session {} cannot have a delay", id.name),
                ));
            }
        }
        let start = row.timestamp.unwrap_or(0.0);
        streamable &= start >= last_start;
        last_start = start;
    }
    if rows == 0 {
        return Err(InputError::in_file(path, "the trace has no requests"));
    }
    Ok(Scan { rows, streamable, wide_ids })
}

fn read_file(input: &TraceInput, tbs: u32, ids: &mut Ids, sessions: &mut Vec<SessionSpec>) -> Result<(), InputError> {
    let path = input.path();
    // session_id -> (index in `sessions`, timestamp of its latest row)
    let mut by_id: HashMap<SessionKey, (usize, Option<f64>)> = HashMap::new();
    for row in Rows::open(input, tbs)? {
        let (lineno, row) = row?;
        let err = |field: Option<&str>, msg: String| InputError::at_line(path, lineno, field, msg);
        let blocks = ids.blocks(&row.hash_ids, row.reached).map_err(|e| err(Some("hash_ids"), e))?;
        let Some(id) = row.session_id.clone() else {
            sessions.push(row.into_session(blocks));
            continue;
        };
        let Some((index, last_ts)) = by_id.get_mut(&id) else {
            if row.delay.is_some_and(|d| d != 0.0) {
                return Err(err(Some("delay"), format!("the first turn of session {} cannot have a delay", id.name)));
            }
            by_id.insert(id, (sessions.len(), row.timestamp));
            sessions.push(row.into_session(blocks));
            continue;
        };
        let delay = match (row.delay, row.timestamp, *last_ts) {
            (Some(d), _, _) => d,
            (None, Some(t), Some(prev)) => {
                if t < prev {
                    return Err(err(
                        Some("timestamp"),
                        format!("{t} is earlier than the previous turn of session {:?} ({prev})", id.name),
                    ));
                }
                t - prev
            }
            (None, Some(_), None) => {
                return Err(err(
                    Some("timestamp"),
                    format!("session {:?} cannot infer delay without a previous timestamp", id.name),
                ))
            }
            _ => 0.0,
        };
        if row.timestamp.is_some() {
            *last_ts = row.timestamp;
        }
        sessions[*index].turns.push(TurnSpec { delay_ms: delay, blocks, ..row.turn });
    }
    Ok(())
}

/// A validated trace replayed straight from its files: every session is one request and each
/// file lists them in start order. The files are read again, row by row, each time the
/// workload's sessions are streamed.
#[derive(Clone, Debug)]
pub struct StreamedTrace {
    inputs: Vec<TraceInput>,
    block_tokens: u32,
    /// Rows of each file, as validated.
    rows: Vec<u64>,
    /// Hash ids are interned (see [`Ids`]).
    interned: bool,
    /// A file that changed since it was validated stops its stream; the error is kept here.
    error: Arc<Mutex<Option<InputError>>>,
}

impl StreamedTrace {
    fn new(inputs: Vec<TraceInput>, block_tokens: u32, rows: Vec<u64>, interned: bool) -> Self {
        StreamedTrace { inputs, block_tokens, rows, interned, error: Arc::default() }
    }

    pub fn block_tokens(&self) -> u32 {
        self.block_tokens
    }

    pub fn num_requests(&self) -> u64 {
        self.rows.iter().sum()
    }

    /// The sessions of all files by start time; ties go to the earlier file, then the
    /// earlier line (as a stable sort of the loaded sessions would order them).
    pub fn sessions_iter(&self) -> StreamedSessions {
        let mut files = Vec::with_capacity(self.inputs.len());
        for (input, &rows) in self.inputs.iter().zip(&self.rows) {
            match Rows::open(input, self.block_tokens) {
                Ok(r) => files.push(FileStream { rows: r, head: None, read: 0, expected: rows }),
                Err(e) => self.fail(e),
            }
        }
        let mut stream = StreamedSessions { files, ids: Ids::new(self.interned), error: self.error.clone() };
        for i in 0..stream.files.len() {
            stream.advance(i);
        }
        stream
    }

    /// Why a stream stopped early, if one did (a file changed, vanished or was cut short after
    /// validation).
    pub fn take_error(&self) -> Option<InputError> {
        self.error.lock().map(|mut e| e.take()).unwrap_or(None)
    }

    fn fail(&self, e: InputError) {
        record_error(&self.error, e);
    }
}

fn record_error(slot: &Mutex<Option<InputError>>, e: InputError) {
    if let Ok(mut slot) = slot.lock() {
        slot.get_or_insert(e);
    }
}

struct FileStream {
    rows: Rows,
    head: Option<SessionSpec>,
    read: u64,
    expected: u64,
}

/// Iterator behind [`StreamedTrace::sessions_iter`]: each file's next session, merged.
pub struct StreamedSessions {
    files: Vec<FileStream>,
    ids: Ids,
    error: Arc<Mutex<Option<InputError>>>,
}

impl StreamedSessions {
    fn advance(&mut self, i: usize) {
        let f = &mut self.files[i];
        f.head = match f.rows.next() {
            None => {
                if f.read < f.expected {
                    let e = InputError::in_file(
                        f.rows.lines.path(),
                        format!(
                            "the trace ended after {} of its {} requests: it was cut short after it was validated",
                            f.read, f.expected
                        ),
                    );
                    record_error(&self.error, e);
                }
                None
            }
            Some(Ok((lineno, row))) => {
                f.read += 1;
                match self.ids.blocks(&row.hash_ids, row.reached) {
                    Ok(blocks) => Some(row.into_session(blocks)),
                    Err(e) => {
                        record_error(
                            &self.error,
                            InputError::at_line(f.rows.lines.path(), lineno, Some("hash_ids"), e),
                        );
                        None
                    }
                }
            }
            Some(Err(e)) => {
                record_error(&self.error, e);
                None
            }
        };
    }
}

impl Iterator for StreamedSessions {
    type Item = SessionSpec;

    fn next(&mut self) -> Option<SessionSpec> {
        let mut first: Option<(usize, f64)> = None;
        for (i, f) in self.files.iter().enumerate() {
            if let Some(s) = &f.head {
                if first.is_none_or(|(_, t)| s.start_ms < t) {
                    first = Some((i, s.start_ms));
                }
            }
        }
        let (i, _) = first?;
        let session = self.files[i].head.take();
        self.advance(i);
        session
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::load_mooncake;
    use crate::workload::Workload;
    use std::io::Write;

    /// A trace file in a temporary directory that goes away with it.
    struct TempTrace {
        _dir: tempfile::TempDir,
        path: std::path::PathBuf,
    }

    impl AsRef<Path> for TempTrace {
        fn as_ref(&self) -> &Path {
            &self.path
        }
    }

    impl std::ops::Deref for TempTrace {
        type Target = Path;
        fn deref(&self) -> &Path {
            &self.path
        }
    }

    fn write_trace(name: &str, text: &str) -> TempTrace {
        let dir = tempfile::Builder::new().prefix(&format!("servesim-trace-{name}-")).tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        std::fs::File::create(&path).unwrap().write_all(text.as_bytes()).unwrap();
        TempTrace { _dir: dir, path }
    }

    fn load(name: &str, text: &str) -> Result<Vec<SessionSpec>, InputError> {
        match load_mooncake(&[write_trace(name, text)], 512)? {
            Workload::Trace { sessions, .. } => Ok(sessions),
            Workload::Streamed(trace) => Ok(trace.sessions_iter().collect()),
            _ => unreachable!("a trace loads as a trace"),
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
        assert_eq!((r.name.as_deref(), r.turns[0].input_length), (None, 600));
        // Ids 1, 2, 3, 9, ... are not numbered in first-seen order, so they are interned: 1 → 0,
        // 2 → 1, and 3 (past the prompt) still takes 2, so 9 is 3.
        assert_eq!(&*r.turns[0].blocks, &[0, 1], "only the blocks the prompt reaches are kept");
        assert_eq!(&*w[1].turns[0].blocks, &[3]);
        let a = &w[1];
        assert_eq!((a.name.as_deref(), a.start_ms, a.turns.len()), (Some("a"), 1000.0, 3));
        assert_eq!(a.turns[1].delay_ms, 50.0);
        // No delay given: the timestamp gap to the last row that had one.
        assert_eq!(a.turns[2].delay_ms, 300.0);
        assert_eq!(a.turns[2].input_length, 1536, "input_length defaults to the hash capacity");
    }

    fn summary(sessions: impl IntoIterator<Item = SessionSpec>) -> Vec<(String, f64, u32, usize)> {
        sessions
            .into_iter()
            .map(|s| (s.name.as_deref().unwrap_or("-").to_string(), s.start_ms, s.turns[0].input_length, s.turns.len()))
            .collect()
    }

    #[test]
    fn sorted_single_request_traces_stream_in_the_order_loading_gives() {
        let a = write_trace(
            "stream-a",
            r#"{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]}
{"timestamp": 0, "input_length": 2, "output_length": 1, "hash_ids": [1]}

{"timestamp": 5, "input_length": 3, "output_length": 1, "hash_ids": [1], "session_id": "s"}
{"timestamp": 9, "input_length": 4, "output_length": 1, "hash_ids": [1]}
"#,
        );
        let b = write_trace(
            "stream-b",
            r#"{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}
{"timestamp": 5, "input_length": 6, "output_length": 1, "hash_ids": [1], "session_id": "s"}
{"timestamp": 7, "input_length": 7, "output_length": 1, "hash_ids": [1]}
"#,
        );
        let workload = load_mooncake(&[&a, &b], 512).unwrap();
        let Workload::Streamed(trace) = &workload else { panic!("a sorted single-request trace streams") };
        assert_eq!(workload.num_requests(), 7);
        let mut loaded = Vec::new();
        let mut ids = Ids::new(false);
        read_file(&TraceInput::open(&a).unwrap(), 512, &mut ids, &mut loaded).unwrap();
        read_file(&TraceInput::open(&b).unwrap(), 512, &mut ids, &mut loaded).unwrap();
        loaded.sort_by(|x, y| x.start_ms.total_cmp(&y.start_ms));
        let streamed = summary(trace.sessions_iter());
        assert_eq!(streamed, summary(loaded));
        let lengths: Vec<u32> = streamed.iter().map(|s| s.2).collect();
        assert_eq!(lengths, [1, 2, 5, 3, 6, 7, 4], "by start, ties to the earlier file then line");
        assert_eq!(streamed[0].0, "-", "a row without session_id is in no session");
        assert!(streamed.iter().any(|s| s.0 == "s"), "a named session keeps its name");
        assert_eq!(summary(trace.sessions_iter()), streamed, "every stream reads the files afresh");
        assert!(trace.take_error().is_none());
    }

    #[test]
    fn unsorted_or_multi_turn_traces_are_held_in_memory() {
        let unsorted = r#"{"timestamp": 10, "input_length": 1, "output_length": 1, "hash_ids": [1]}
{"timestamp": 0, "input_length": 2, "output_length": 1, "hash_ids": [1]}
"#;
        let multi_turn = r#"{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1], "session_id": "a"}
{"timestamp": 5, "input_length": 2, "output_length": 1, "hash_ids": [1], "session_id": "a"}
"#;
        for (name, text) in [("unsorted", unsorted), ("multi", multi_turn)] {
            let workload = load_mooncake(&[write_trace(name, text)], 512).unwrap();
            assert!(matches!(workload, Workload::Trace { .. }), "{name}");
        }
    }

    #[test]
    fn a_trace_that_changes_after_validation_ends_its_stream_with_an_error() {
        let path = write_trace(
            "changed",
            r#"{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]}
{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [1]}
"#,
        );
        let workload = load_mooncake(&[&path], 512).unwrap();
        let Workload::Streamed(trace) = &workload else { panic!("streams") };
        std::fs::write(
            &path,
            "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n{\"timestamp\": 1}\n",
        )
        .unwrap();
        assert_eq!(trace.sessions_iter().count(), 1);
        let e = workload.take_error().expect("the stream stopped at line 2");
        assert_eq!((e.line, e.field.as_deref()), (Some(2), Some("hash_ids")));
    }

    #[test]
    fn a_trace_cut_short_during_the_replay_is_an_error() {
        let path = write_trace(
            "cut",
            r#"{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]}
{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [1]}
{"timestamp": 2, "input_length": 1, "output_length": 1, "hash_ids": [1]}
"#,
        );
        let workload = load_mooncake(&[&path], 512).unwrap();
        let Workload::Streamed(trace) = &workload else { panic!("streams") };
        // The last row vanishes between validation and replay (a file still being written,
        // or truncated by another process).
        std::fs::write(&path, "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n")
            .unwrap();
        assert_eq!(trace.sessions_iter().count(), 1);
        let e = workload.take_error().expect("the stream reports the missing rows").to_string();
        assert!(e.contains("ended after 1 of its 3 requests"), "{e}");
    }

    #[test]
    fn wide_hash_ids_are_interned_and_numeric_session_ids_kept_apart() {
        let w = load(
            "wide",
            r#"{"session_id": 1, "timestamp": 0, "output_length": 1, "hash_ids": [4294967297, 1]}
{"session_id": "1", "timestamp": 5, "output_length": 1, "hash_ids": [1, 4294967297]}
"#,
        )
        .unwrap();
        assert_eq!(w.len(), 2, "1 and \"1\" are two sessions");
        assert_eq!(&*w[0].turns[0].blocks, &[0, 1]);
        assert_eq!(&*w[1].turns[0].blocks, &[1, 0]);
        let e = error("array", "[0, 100, 1, [1]]");
        assert!(e.contains("t.jsonl:1: expected one JSON object per line, found a JSON array"), "{e}");
    }

    #[test]
    fn ids_are_numbered_in_first_seen_order_as_the_reference_does() {
        // Already numbered that way: kept as they are.
        let w = load(
            "first-seen",
            r#"{"timestamp": 0, "output_length": 1, "hash_ids": [0, 1, 0]}
{"timestamp": 5, "output_length": 1, "hash_ids": [2, 1]}
"#,
        )
        .unwrap();
        assert_eq!((&*w[0].turns[0].blocks, &*w[1].turns[0].blocks), (&[0, 1, 0][..], &[2, 1][..]));
        // Any other numbering is interned: 7 is the first id met, 3 the second.
        let w = load(
            "renumbered",
            r#"{"timestamp": 0, "output_length": 1, "hash_ids": [7, 3]}
{"timestamp": 5, "output_length": 1, "hash_ids": [3, 9, 7]}
"#,
        )
        .unwrap();
        assert_eq!((&*w[0].turns[0].blocks, &*w[1].turns[0].blocks), (&[0, 1][..], &[1, 2, 0][..]));
        let mut order = IdOrder::default();
        order.see(&[0, 1, 1, 2]);
        assert!(order.first_seen);
        order.see(&[4]);
        assert!(!order.first_seen, "3 was skipped");
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
