//! `dynamo`: Dynamo request traces (`dynamo.request.trace.v1`), one or more shards, plain or
//! gzip/zstd compressed.
//!
//! Every shard is read; `request_end` records become requests, terminal tool events
//! (`tool_end`, `tool_error`) link parent and child agent sessions, `request_payload` and
//! `tool_start` lines are skipped. Requests are sorted by (start, end, request_id) across
//! shards. Without `agent_context` the trace replays like Mooncake (one request per session,
//! at its start); with it, it lowers into a dependency graph (see `lower_agentic`).

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;

use crate::agentic::{
    assign_component_plays, AgenticGraph, AgenticRow, GraphBuilder, HashIdScope, Header, Loc, Provenance, Relation,
    RowDependency, Trigger,
};
use crate::error::InputError;
use crate::ids::{Ids, MAX_TIME_MS};
use crate::input::{Lines, TraceInput};
use crate::session::{SessionSpec, TurnMeta, TurnSpec};
use crate::workload::Workload;

/// A Dynamo trace lowered to the load it describes (one value per file, so the size
/// difference between the variants does not matter).
#[allow(clippy::large_enum_variant)]
pub enum Lowered {
    Standard(Workload),
    Agentic(AgenticGraph),
}

#[cfg_attr(test, derive(Debug))]
#[derive(Deserialize)]
struct Record {
    schema: String,
    event_type: String,
    event_time_unix_ms: u64,
    #[serde(default)]
    agent_context: Option<AgentContext>,
    #[serde(default)]
    request: Option<RequestMetrics>,
    #[serde(default)]
    tool: Option<ToolMetrics>,
}

#[cfg_attr(test, derive(Debug))]
#[derive(Clone, Deserialize)]
struct AgentContext {
    session_id: String,
    #[serde(default)]
    parent_session_id: Option<String>,
}

#[cfg_attr(test, derive(Debug))]
#[derive(Deserialize)]
struct RequestMetrics {
    request_id: String,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    request_received_ms: Option<u64>,
    #[serde(default)]
    total_time_ms: Option<f64>,
    replay: ReplayMetrics,
}

#[cfg_attr(test, derive(Debug))]
#[derive(Deserialize)]
struct ReplayMetrics {
    trace_block_size: u64,
    input_length: u64,
    input_sequence_hashes: Vec<u64>,
    #[serde(default)]
    dependencies: Vec<ReplayDependency>,
}

#[cfg_attr(test, derive(Debug))]
#[derive(Deserialize)]
struct ReplayDependency {
    request_id: String,
    relation: Relation,
    trigger: Trigger,
}

#[cfg_attr(test, derive(Debug))]
#[derive(Deserialize)]
struct ToolMetrics {
    tool_call_id: String,
    tool_class: String,
    #[serde(default)]
    claude: Option<ClaudeTool>,
    #[serde(default)]
    started_at_unix_ms: Option<u64>,
    #[serde(default)]
    ended_at_unix_ms: Option<u64>,
    #[serde(default)]
    duration_ms: Option<f64>,
}

#[cfg_attr(test, derive(Debug))]
#[derive(Clone, Deserialize)]
struct ClaudeTool {
    source_request_id: String,
    #[serde(default)]
    consumer_request_id: Option<String>,
    #[serde(default)]
    child_session_id: Option<String>,
    execution_mode: String,
}

struct Entry {
    start: i64,
    end: i64,
    id: String,
    model: Option<String>,
    output_tokens: Option<u64>,
    block_size: u64,
    input_length: u64,
    hashes: Vec<u64>,
    deps: Vec<ReplayDependency>,
    context: Option<AgentContext>,
    loc: Loc,
}

struct Tool {
    session_id: String,
    tool_call_id: String,
    tool_class: String,
    claude: Option<ClaudeTool>,
    loc: Loc,
}

/// A line's event type, and whether it wraps its event (`{"event": …}`, whatever the value).
#[derive(Deserialize)]
struct Outline<'a> {
    #[serde(default, deserialize_with = "present")]
    event: bool,
    #[serde(default)]
    event_type: Option<&'a str>,
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    serde::de::IgnoredAny::deserialize(d).map(|_| true)
}

/// Reads the record of a line, or `None` for a line that carries none (a skipped event type).
/// Most lines go through typed fields in one pass over the text; a line that does not (a
/// wrapped event, escapes in the event type, any error) is read again through a JSON value,
/// which is what defines the accepted lines and the error messages.
fn parse_line(text: &[u8]) -> Result<Option<Record>, String> {
    match parse_line_typed(text) {
        Some(parsed) => Ok(parsed),
        None => parse_line_value(text),
    }
}

fn parse_line_typed(text: &[u8]) -> Option<Option<Record>> {
    let outline: Outline = serde_json::from_slice(text).ok()?;
    if outline.event {
        return None;
    }
    match outline.event_type? {
        "request_payload" | "tool_start" => Some(None),
        "request_end" | "tool_end" | "tool_error" => {
            let record: Record = serde_json::from_slice(text).ok()?;
            (record.schema == "dynamo.request.trace.v1").then_some(Some(record))
        }
        _ => None,
    }
}

fn parse_line_value(text: &[u8]) -> Result<Option<Record>, String> {
    let value: Value = serde_json::from_slice(text).map_err(|e| e.to_string())?;
    let Some(object) = value.as_object() else { return Ok(None) };
    let event = object.get("event").unwrap_or(&value);
    let event_type =
        event.get("event_type").and_then(Value::as_str).or_else(|| object.get("event_type").and_then(Value::as_str));
    if matches!(event_type, Some("request_payload" | "tool_start")) {
        return Ok(None);
    }
    if !matches!(event_type, Some("request_end" | "tool_end" | "tool_error")) {
        return Err(format!(
            "request trace supports request_end, terminal tool events, request_payload, and tool_start; got {event_type:?}"
        ));
    }
    let record: Record = serde_json::from_value(event.clone()).map_err(|e| e.to_string())?;
    if record.schema != "dynamo.request.trace.v1" {
        return Err(format!("unsupported Dynamo request trace schema {:?}", record.schema));
    }
    Ok(Some(record))
}

fn sat(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}

pub fn load(paths: &[PathBuf], expected_block_size: Option<u32>, speedup: f64) -> Result<Lowered, InputError> {
    let mut entries: Vec<Entry> = Vec::new();
    let mut tools: Vec<Tool> = Vec::new();
    let mut ids: HashSet<String> = HashSet::new();
    for (f, path) in paths.iter().enumerate() {
        let input = TraceInput::open(path)?;
        let mut lines = Lines::open(&input)?;
        while let Some(line) = lines.next_line() {
            let (lineno, text) = line?;
            let err = |msg: String| InputError::at_line(path, lineno, None, msg);
            let loc = Loc { file: f as u16, line: lineno as u32 };
            let Some(record) =
                parse_line(text).map_err(|e| err(format!("failed to parse {}:{lineno}: {e}", path.display())))?
            else {
                continue;
            };
            if record.event_type == "request_end" {
                let Some(req) = record.request else {
                    return Err(err("request_end is missing request metrics".into()));
                };
                if req.request_id.trim().is_empty() {
                    return Err(err("request_id must be nonempty".into()));
                }
                if !ids.insert(req.request_id.clone()) {
                    return Err(err(format!("duplicate request_id {:?}", req.request_id)));
                }
                let total = match req.total_time_ms {
                    Some(v) if !(v.is_finite() && (0.0..=MAX_TIME_MS).contains(&v)) => {
                        return Err(err("request duration must be finite and nonnegative".into()))
                    }
                    Some(v) => Some(v.round() as u64),
                    None => None,
                };
                let end = match (req.request_received_ms, total) {
                    (Some(s), Some(d)) => s.saturating_add(d),
                    _ => record.event_time_unix_ms,
                };
                let start = req
                    .request_received_ms
                    .unwrap_or_else(|| record.event_time_unix_ms.saturating_sub(total.unwrap_or(0)));
                entries.push(Entry {
                    start: sat(start),
                    end: sat(end),
                    id: req.request_id,
                    model: req.model,
                    output_tokens: req.output_tokens,
                    block_size: req.replay.trace_block_size,
                    input_length: req.replay.input_length,
                    hashes: req.replay.input_sequence_hashes,
                    deps: req.replay.dependencies,
                    context: record.agent_context,
                    loc,
                });
            } else {
                let (Some(ctx), Some(tool)) = (record.agent_context, record.tool) else { continue };
                if ctx.session_id.trim().is_empty() {
                    return Err(err("tool session_id must be nonempty".into()));
                }
                if tool.tool_call_id.trim().is_empty() {
                    return Err(err("tool_call_id must be nonempty".into()));
                }
                if tool.tool_class.trim().is_empty() {
                    return Err(err("tool_class must be nonempty".into()));
                }
                if tool.duration_ms.is_some_and(|d| !(d.is_finite() && d >= 0.0)) {
                    return Err(err("tool duration must be finite and nonnegative".into()));
                }
                let end = sat(tool.ended_at_unix_ms.unwrap_or(record.event_time_unix_ms));
                let start = tool
                    .started_at_unix_ms
                    .map(sat)
                    .or_else(|| tool.duration_ms.map(|d| end.saturating_sub(d.round() as i64)))
                    .unwrap_or(end);
                if end < start {
                    return Err(err("tool end time precedes start time".into()));
                }
                tools.push(Tool {
                    session_id: ctx.session_id,
                    tool_call_id: tool.tool_call_id,
                    tool_class: tool.tool_class,
                    claude: tool.claude,
                    loc,
                });
            }
        }
    }
    let first_file = &paths[0];
    if entries.is_empty() {
        return Err(InputError::in_file(first_file, "Dynamo trace contains no request_end records"));
    }
    let at = |loc: Loc, msg: String| InputError::at_line(&paths[loc.file as usize], loc.line as usize, None, msg);
    let contextual = entries.iter().filter(|e| e.context.is_some()).count();
    if contextual != 0 && contextual != entries.len() {
        let odd = entries.iter().find(|e| e.context.is_some() != entries[0].context.is_some()).unwrap_or(&entries[0]);
        return Err(at(odd.loc, "Dynamo request trace cannot mix requests with and without agent_context".into()));
    }
    let block_size = entries[0].block_size;
    if block_size == 0 {
        return Err(at(entries[0].loc, "embedded trace block size must be positive".into()));
    }
    if let Some(e) = entries.iter().find(|e| e.block_size != block_size) {
        return Err(at(
            e.loc,
            format!("mixed replay trace_block_size values are not supported ({} and {block_size})", e.block_size),
        ));
    }
    if let Some(expected) = expected_block_size {
        if expected as u64 != block_size {
            return Err(InputError::new(format!(
                "trace_block_size {expected} does not match embedded Dynamo request trace block size {block_size}"
            )));
        }
    }
    let block_tokens = u32::try_from(block_size)
        .map_err(|_| at(entries[0].loc, format!("trace_block_size {block_size} is too large")))?;
    entries.sort_by(|a, b| (a.start, a.end, &a.id).cmp(&(b.start, b.end, &b.id)));
    if contextual == 0 {
        lower_standard(entries, block_tokens, paths).map(Lowered::Standard)
    } else {
        lower_agentic(entries, tools, block_tokens, paths, speedup).map(Lowered::Agentic)
    }
}

fn output_tokens(e: &Entry, paths: &[PathBuf]) -> Result<u32, InputError> {
    let at = |msg: String| InputError::at_line(&paths[e.loc.file as usize], e.loc.line as usize, None, msg);
    let n = e.output_tokens.ok_or_else(|| at("missing output_tokens".into()))?;
    u32::try_from(n).map_err(|_| at(format!("output_tokens {n} is too large")))
}

fn lower_standard(entries: Vec<Entry>, tbs: u32, paths: &[PathBuf]) -> Result<Workload, InputError> {
    let first = entries[0].start;
    let mut ids = Ids::new(true);
    let mut sessions = Vec::with_capacity(entries.len());
    for (i, e) in entries.into_iter().enumerate() {
        let at = |msg: String| InputError::at_line(&paths[e.loc.file as usize], e.loc.line as usize, None, msg);
        let capacity = e.hashes.len() as u64 * tbs as u64;
        if e.input_length > capacity {
            return Err(at(format!("input_length {} exceeds hash_ids capacity {capacity}", e.input_length)));
        }
        if e.input_length == 0 {
            return Err(at("input_length must be at least 1".into()));
        }
        let output = output_tokens(&e, paths)?;
        let used = e.input_length.div_ceil(tbs as u64) as usize;
        let blocks = ids.blocks(&e.hashes, used).map_err(&at)?;
        let t = (e.start - first) as f64;
        if t > MAX_TIME_MS {
            return Err(at(format!("request start {t} ms after the first is outside the supported range")));
        }
        sessions.push(SessionSpec {
            name: Some(Arc::from(format!("request_{}", i + 1))),
            start_ms: t,
            turns: vec![TurnSpec {
                input_length: e.input_length as u32,
                output_length: output,
                blocks,
                delay_ms: 0.0,
                priority: 0,
                strict_priority: 0,
                output_tokens: None,
                meta: Some(Arc::new(TurnMeta { request_id: Some(e.id.into()), policy_class: None, agentic: None })),
            }],
        });
    }
    Ok(Workload::Trace { sessions, block_tokens: tbs })
}

fn dependency_between(
    entries: &[Entry],
    source: usize,
    target: usize,
    trigger: Trigger,
    relation: Relation,
) -> RowDependency {
    let source_time = match trigger {
        Trigger::Dispatch => entries[source].start,
        Trigger::Completion => entries[source].end,
    };
    RowDependency {
        request_id: entries[source].id.clone(),
        trigger,
        delay_ms: entries[target].start.saturating_sub(source_time) as f64,
        relation,
    }
}

fn push_dependency(deps: &mut Vec<RowDependency>, d: RowDependency) {
    if deps.iter().any(|e| e.request_id == d.request_id && e.trigger == d.trigger) {
        return;
    }
    deps.push(d);
}

/// Agentic lowering: edges within a session (sequence, delay = the gap between one request's
/// end and the next one's start), exporter dependencies (authoritative for the session pair
/// they link), parent/child edges from tool metadata (spawn from the source request, join into
/// the consumer), or else from timestamps; each connected component becomes a play
/// `dynamo-play:<root request_id>`.
fn lower_agentic(
    entries: Vec<Entry>,
    tools: Vec<Tool>,
    tbs: u32,
    paths: &[PathBuf],
    speedup: f64,
) -> Result<AgenticGraph, InputError> {
    let at = |loc: Loc, msg: String| InputError::at_line(&paths[loc.file as usize], loc.line as usize, None, msg);
    let first_start = entries[0].start;
    let index: HashMap<&str, usize> = entries.iter().enumerate().map(|(i, e)| (e.id.as_str(), i)).collect();
    let session_of =
        |i: usize| entries[i].context.as_ref().expect("agentic entries have a context").session_id.as_str();
    let mut by_session: HashMap<&str, Vec<usize>> = HashMap::new();
    let mut session_order: Vec<&str> = Vec::new();
    let mut parent_by_session: HashMap<&str, &str> = HashMap::new();
    let mut parent_order: Vec<&str> = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let ctx = e.context.as_ref().expect("agentic entries have a context");
        if ctx.session_id.trim().is_empty() {
            return Err(at(e.loc, "session_id must be nonempty".into()));
        }
        by_session
            .entry(ctx.session_id.as_str())
            .or_insert_with(|| {
                session_order.push(ctx.session_id.as_str());
                Vec::new()
            })
            .push(i);
        if let Some(parent) = ctx.parent_session_id.as_deref() {
            match parent_by_session.get(ctx.session_id.as_str()) {
                Some(existing) if *existing != parent => {
                    return Err(at(
                        e.loc,
                        format!(
                            "session {:?} has conflicting parent_session_id values {existing:?} and {parent:?}",
                            ctx.session_id
                        ),
                    ))
                }
                Some(_) => {}
                None => {
                    parent_by_session.insert(ctx.session_id.as_str(), parent);
                    parent_order.push(ctx.session_id.as_str());
                }
            }
        }
    }
    // Entries are already sorted by (start, end, id), so each session's list is too.
    let mut deps: Vec<Vec<RowDependency>> = (0..entries.len()).map(|_| Vec::new()).collect();
    for s in &session_order {
        for pair in by_session[s].windows(2) {
            push_dependency(
                &mut deps[pair[1]],
                dependency_between(&entries, pair[0], pair[1], Trigger::Completion, Relation::Sequence),
            );
        }
    }
    let mut tool_by_child: HashMap<&str, &Tool> = HashMap::new();
    for tool in &tools {
        let Some(claude) = &tool.claude else { continue };
        if !matches!(claude.execution_mode.as_str(), "blocking" | "background") {
            return Err(at(
                tool.loc,
                format!(
                    "tool {:?} ({}) has unsupported execution_mode {:?}",
                    tool.tool_call_id, tool.tool_class, claude.execution_mode
                ),
            ));
        }
        for rid in
            [Some(claude.source_request_id.as_str()), claude.consumer_request_id.as_deref()].into_iter().flatten()
        {
            let Some(&ri) = index.get(rid) else {
                return Err(at(
                    tool.loc,
                    format!("tool {:?} references unknown request_id {rid:?}", tool.tool_call_id),
                ));
            };
            if session_of(ri) != tool.session_id {
                return Err(at(
                    tool.loc,
                    format!(
                        "tool {:?} request {rid:?} belongs to session {:?}, expected {:?}",
                        tool.tool_call_id,
                        session_of(ri),
                        tool.session_id
                    ),
                ));
            }
        }
        let Some(child) = claude.child_session_id.as_deref() else { continue };
        if !by_session.contains_key(child) {
            continue;
        }
        if tool_by_child.insert(child, tool).is_some() {
            return Err(at(tool.loc, format!("multiple tool events reference child session {child:?}")));
        }
    }
    let mut linked: HashSet<(&str, &str)> = HashSet::new();
    for (i, e) in entries.iter().enumerate() {
        for d in &e.deps {
            let Some(&source) = index.get(d.request_id.as_str()) else {
                return Err(at(e.loc, format!("request {:?} depends on unknown request_id {:?}", e.id, d.request_id)));
            };
            if entries[source].start > e.start {
                return Err(at(e.loc, format!("request {:?} depends on later request {:?}", e.id, d.request_id)));
            }
            let (s, ss) = (session_of(i), session_of(source));
            if s != ss {
                linked.insert((s, ss));
                linked.insert((ss, s));
            }
            let mut edge = dependency_between(&entries, source, i, d.trigger, d.relation);
            edge.delay_ms = edge.delay_ms.max(0.0);
            push_dependency(&mut deps[i], edge);
        }
    }
    for child in &parent_order {
        let parent = parent_by_session[child];
        let child_idx = &by_session[child];
        let Some(parent_idx) = by_session.get(parent) else {
            return Err(at(
                entries[child_idx[0]].loc,
                format!("child session {child:?} references unknown parent session {parent:?}"),
            ));
        };
        let first_child = child_idx[0];
        let last_child = *child_idx
            .iter()
            .max_by(|&&a, &&b| {
                (entries[a].end, entries[a].start, &entries[a].id).cmp(&(
                    entries[b].end,
                    entries[b].start,
                    &entries[b].id,
                ))
            })
            .expect("sessions have requests");
        if let Some(tool) = tool_by_child.get(child) {
            let claude = tool.claude.as_ref().expect("explicit tools have metadata");
            let spawn = index[claude.source_request_id.as_str()];
            if !parent_idx.contains(&spawn) {
                return Err(at(
                    tool.loc,
                    format!(
                        "tool {:?} source request {:?} is not in parent session {parent:?}",
                        tool.tool_call_id, claude.source_request_id
                    ),
                ));
            }
            push_dependency(
                &mut deps[first_child],
                dependency_between(&entries, spawn, first_child, Trigger::Dispatch, Relation::Spawn),
            );
            if let Some(consumer) = &claude.consumer_request_id {
                let join = index[consumer.as_str()];
                if !parent_idx.contains(&join) {
                    return Err(at(
                        tool.loc,
                        format!(
                            "tool {:?} consumer request {consumer:?} is not in parent session {parent:?}",
                            tool.tool_call_id
                        ),
                    ));
                }
                if let Some(joined) =
                    child_idx.iter().copied().filter(|&c| entries[c].end <= entries[join].start).max_by(|&a, &b| {
                        (entries[a].end, entries[a].start, &entries[a].id).cmp(&(
                            entries[b].end,
                            entries[b].start,
                            &entries[b].id,
                        ))
                    })
                {
                    push_dependency(
                        &mut deps[join],
                        dependency_between(&entries, joined, join, Trigger::Completion, Relation::Join),
                    );
                }
            }
            continue;
        }
        if linked.contains(&(*child, parent)) {
            continue;
        }
        // max_by_key keeps the last of equal keys, as the reference's does.
        if let Some(spawn) = parent_idx
            .iter()
            .copied()
            .filter(|&p| entries[p].start <= entries[first_child].start)
            .max_by_key(|&p| entries[p].start)
        {
            push_dependency(
                &mut deps[first_child],
                dependency_between(&entries, spawn, first_child, Trigger::Dispatch, Relation::Spawn),
            );
        }
        if let Some(join) = parent_idx
            .iter()
            .copied()
            .filter(|&p| entries[p].start >= entries[last_child].end)
            .min_by_key(|&p| entries[p].start)
        {
            push_dependency(
                &mut deps[join],
                dependency_between(&entries, last_child, join, Trigger::Completion, Relation::Join),
            );
        }
    }
    let tool_count = tools.len();
    let mut rows = Vec::with_capacity(entries.len());
    let mut locs = Vec::with_capacity(entries.len());
    for (i, (e, d)) in entries.iter().zip(deps).enumerate() {
        let output = output_tokens(e, paths)?;
        for dep in &d {
            if dep.delay_ms < 0.0 {
                return Err(at(
                    e.loc,
                    format!(
                        "request {:?} starts {} ms before request {:?} of its session ends (overlapping requests in a session)",
                        e.id, -dep.delay_ms, dep.request_id
                    ),
                ));
            }
        }
        let _ = i;
        rows.push(AgenticRow {
            request_id: e.id.clone(),
            play_id: "dynamo-request-trace".into(),
            source_play_ordinal: None,
            session_id: session_of(i).to_string(),
            model: e.model.clone().unwrap_or_else(|| "unknown".into()),
            input_length: Some(e.input_length),
            output_length: Some(output as u64),
            output_token_ids: None,
            hash_ids: Some(e.hashes.clone()),
            not_before_ms: if d.is_empty() { (e.start - first_start) as f64 } else { 0.0 },
            recorded_api_time_ms: None,
            priority: None,
            strict_priority: None,
            policy_class: None,
            dependencies: d,
        });
        locs.push(e.loc);
    }
    drop(entries);
    assign_component_plays(&mut rows, "dynamo-play");
    let header = Header {
        schema: crate::agentic::AGENTIC_MOONCAKE_SCHEMA.into(),
        version: 2,
        block_size: tbs as u64,
        hash_id_scope: HashIdScope::Local,
        source: Provenance {
            format: "dynamo.request.trace.v1".into(),
            digest: format!("requests:{};tools:{tool_count}", rows.len()),
        },
    };
    let mut builder = GraphBuilder::new(header, paths.to_vec(), Loc::default())?;
    for (row, loc) in rows.into_iter().zip(locs) {
        builder.push(loc, row)?;
    }
    builder.finish(speedup)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-pass reading accepts, skips and refuses exactly the lines the JSON-value reading
    /// does, with the same records and messages.
    #[test]
    fn typed_and_value_readings_agree() {
        let req = r#""request":{"request_id":"r1","output_tokens":4,"replay":{"trace_block_size":16,"input_length":32,"input_sequence_hashes":[1,18446744073709551615]}}"#;
        let tool =
            r#""agent_context":{"session_id":"s"},"tool":{"tool_call_id":"c","tool_class":"agent","duration_ms":1.5}"#;
        let head = r#""schema":"dynamo.request.trace.v1","event_time_unix_ms":1700000000000"#;
        let lines = [
            format!(r#"{{{head},"event_type":"request_end",{req}}}"#),
            format!(r#"{{{head},"event_type":"tool_end",{tool}}}"#),
            format!(r#"{{{head},"event_type":"tool_error",{tool}}}"#),
            format!(r#"{{{head},"event_type":"request_payload","request":{{"x":1}}}}"#),
            format!(r#"{{{head},"event_type":"tool_start"}}"#),
            format!(r#"{{"event":{{{head},"event_type":"request_end",{req}}}}}"#),
            format!(r#"{{"event":null,{head},"event_type":"request_end",{req}}}"#),
            format!(r#"{{{head},"event_type":"request_end",{req}}}"#),
            format!(r#"{{{head},"event_type":"request_end","event_type":"request_end",{req}}}"#),
            format!(r#"{{{head},"event_type":"request_start",{req}}}"#),
            format!(r#"{{{head},"event_type":7,{req}}}"#),
            format!(r#"{{{head},{req}}}"#),
            format!(r#"{{"schema":"other","event_time_unix_ms":1,"event_type":"request_end",{req}}}"#),
            format!(r#"{{{head},"event_type":"request_end","request":{{"request_id":"r"}}}}"#),
            r#"{"schema":"dynamo.request.trace.v1","event_type":"request_end","event_time_unix_ms":1.5}"#.into(),
            "[1, 2]".into(),
            "{not json".into(),
        ];
        let mut typed_lines = 0;
        for line in &lines {
            let value = parse_line_value(line.as_bytes());
            // Whatever the one-pass reading settles, the value reading settles the same way.
            if let Some(typed) = parse_line_typed(line.as_bytes()) {
                typed_lines += 1;
                assert_eq!(format!("{:?}", Ok::<_, String>(typed)), format!("{value:?}"), "{line}");
            }
            assert_eq!(format!("{:?}", parse_line(line.as_bytes())), format!("{value:?}"), "{line}");
        }
        // The bare request_end (also with its event type given twice), tool_end, tool_error,
        // request_payload and tool_start lines.
        assert_eq!(typed_lines, 6);
        // The common line takes the one-pass reading.
        assert!(parse_line_typed(lines[0].as_bytes()).is_some_and(|r| r.is_some()));
        assert!(parse_line_typed(lines[3].as_bytes()).is_some_and(|r| r.is_none()));
    }
}
