//! `weka`: Weka/AgentX agent traces — a `.json` file (one trace object), a `.jsonl` file (many)
//! or a directory of them (walked recursively in sorted order; symlinks refused).
//!
//! Each trace object becomes one play. Its top-level requests are split into chains (sessions)
//! by prefix matching on hash ids, with the reference's rules for a short request ahead of the
//! main chain (a "preamble") and for chains that continue one another ("seams"); each subagent
//! marker spawns a child scope of its own chains, joined back (when blocking) into the first
//! later parent request that starts after the subagent ended. Times are seconds. Hash ids are
//! re-derived per file (`source:<file>:<hash>`, blake3) so files never share blocks by
//! accident, with a private id for a partial last block. The lowering follows aisimulate-core
//! 0.13.0's `weka.rs`.

mod lower;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Component, Path, PathBuf};

use rustc_hash::FxHashMap;
use serde::Deserialize;

use super::WekaBasis;
use crate::agentic::{
    AgenticGraph, AgenticRow, GraphBuilder, HashIdScope, Header, Loc, Provenance, Relation, RowDependency, Trigger,
};
use crate::error::InputError;

const JOIN_EPSILON_SECONDS: f64 = 1e-6;
const SEAM_MAX_GAP_SECONDS: f64 = 3600.0;
const SEAM_MIN_OVERLAP_RATIO: f64 = 0.5;

#[derive(Deserialize)]
struct WekaTrace {
    id: String,
    #[serde(default)]
    models: Vec<String>,
    block_size: u64,
    hash_id_scope: String,
    requests: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(tag = "type")]
enum Entry {
    #[serde(rename = "n")]
    Normal(Request),
    #[serde(rename = "s")]
    Streaming(Request),
    #[serde(rename = "subagent")]
    Subagent(Subagent),
}

#[derive(Clone, Deserialize)]
struct Request {
    t: f64,
    model: String,
    #[serde(rename = "in")]
    input_length: u64,
    #[serde(rename = "out")]
    output_length: u64,
    #[serde(default)]
    hash_ids: Vec<u64>,
    #[serde(default)]
    api_time: Option<f64>,
}

#[derive(Deserialize)]
struct Subagent {
    t: f64,
    agent_id: String,
    #[serde(default)]
    duration_ms: Option<i64>,
    status: String,
    requests: Vec<Inner>,
}

#[derive(Deserialize)]
#[serde(tag = "type")]
enum Inner {
    #[serde(rename = "n")]
    Normal(Request),
    #[serde(rename = "s")]
    Streaming(Request),
}

impl Inner {
    fn request(&self) -> &Request {
        match self {
            Inner::Normal(r) | Inner::Streaming(r) => r,
        }
    }
}

impl Entry {
    fn request(&self) -> Option<&Request> {
        match self {
            Entry::Normal(r) | Entry::Streaming(r) => Some(r),
            Entry::Subagent(_) => None,
        }
    }
}

#[derive(Clone)]
struct Indexed {
    source_id: String,
    source_order: usize,
    request: Request,
}

#[derive(Clone)]
struct Fork {
    fork_source_id: Option<String>,
    depth: usize,
    fork_time: f64,
}

#[derive(Default)]
struct Chain {
    requests: Vec<Indexed>,
    fork: Option<Fork>,
    spliced_into: Option<usize>,
    tail_source_id: Option<String>,
    tail_hashes: Vec<u64>,
    tail_end: f64,
    tail_model: String,
}

struct Detection {
    chains: Vec<Chain>,
    main_index: usize,
    worker_indices: Vec<usize>,
}

struct Stream {
    session_id: String,
    requests: Vec<Indexed>,
    fork_source_id: Option<String>,
    scope_id: String,
}

fn err(file: &Path, msg: String) -> InputError {
    InputError::in_file(file, msg)
}

fn request_end(r: &Request) -> f64 {
    r.t + r.api_time.unwrap_or(0.0).max(0.0)
}

fn ms(seconds: f64) -> f64 {
    (seconds.max(0.0) * 1e9).round() / 1e6
}

fn order(a: &Indexed, b: &Indexed) -> std::cmp::Ordering {
    a.request.t.total_cmp(&b.request.t).then(a.source_order.cmp(&b.source_order)).then(a.source_id.cmp(&b.source_id))
}

fn lcp(a: &[u64], b: &[u64]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

fn precedes_marker(inner: f64, marker: f64) -> bool {
    inner < marker - JOIN_EPSILON_SECONDS
}

/// Reads a corpus into a validated graph.
pub fn load(path: &Path, expected: Option<u32>, basis: WekaBasis, speedup: f64) -> Result<AgenticGraph, InputError> {
    let files = collect_files(path)?;
    if files.is_empty() {
        return Err(err(path, format!("Weka source {} contains no JSON or JSONL files", path.display())));
    }
    // Raw corpus digest over every file's relative path, length and bytes (read in chunks).
    let mut corpus = blake3::Hasher::new();
    corpus.update(b"aisimulate-weka-corpus-v1\0");
    for (file, rel) in &files {
        let len = std::fs::metadata(file).map_err(|e| err(file, format!("cannot read: {e}")))?.len();
        corpus.update(&(rel.len() as u64).to_le_bytes());
        corpus.update(rel.as_bytes());
        corpus.update(&len.to_le_bytes());
        let mut f = std::fs::File::open(file).map_err(|e| err(file, format!("cannot open: {e}")))?;
        corpus.update_reader(&mut f).map_err(|e| err(file, format!("cannot read: {e}")))?;
    }
    let raw_digest = corpus.finalize().to_hex().to_string();
    // Preflight: headers, models, requests, block sizes, timestamp evidence.
    let mut block_size = None;
    let mut relative_witness = false;
    let mut replayable_subagents = 0;
    for_each_trace(&files, |name, file, trace| {
        let e = |m: String| err(file, m);
        validate_header(&trace, name).map_err(e)?;
        validate_models(&trace, name).map_err(e)?;
        for entry in &trace.requests {
            match entry {
                Entry::Normal(r) | Entry::Streaming(r) => validate_request(r, name).map_err(e)?,
                Entry::Subagent(s) => {
                    validate_subagent(s, name).map_err(e)?;
                    for inner in &s.requests {
                        validate_request(inner.request(), name).map_err(e)?;
                    }
                    if !s.requests.is_empty() {
                        replayable_subagents += 1;
                        if s.requests.iter().any(|i| precedes_marker(i.request().t, s.t)) {
                            relative_witness = true;
                        }
                    }
                }
            }
        }
        match block_size {
            Some(b) if b != trace.block_size => {
                return Err(err(
                    file,
                    format!("Weka corpus mixes block sizes: {name} has {}, expected {b}", trace.block_size),
                ))
            }
            None => block_size = Some(trace.block_size),
            _ => {}
        }
        Ok(())
    })?;
    let resolved = match basis {
        WekaBasis::Absolute => "absolute",
        WekaBasis::Relative => "relative",
        WekaBasis::Auto if replayable_subagents == 0 => "not_applicable",
        WekaBasis::Auto if relative_witness => "relative",
        WekaBasis::Auto => "absolute",
    };
    let relative = resolved == "relative";
    let block_size = block_size.expect("a corpus has a trace");
    if let Some(expected) = expected {
        if expected as u64 != block_size {
            return Err(InputError::new(format!(
                "Weka source block size {block_size} does not match configured block size {expected}"
            )));
        }
    }
    let mut sem = blake3::Hasher::new();
    sem.update(b"aisimulate-weka-corpus-semantics-v2\0");
    sem.update(&(raw_digest.len() as u64).to_le_bytes());
    sem.update(raw_digest.as_bytes());
    sem.update(&(resolved.len() as u64).to_le_bytes());
    sem.update(resolved.as_bytes());
    let digest = sem.finalize().to_hex().to_string();
    let header = Header {
        schema: crate::agentic::AGENTIC_MOONCAKE_SCHEMA.into(),
        version: 2,
        block_size,
        hash_id_scope: HashIdScope::Local,
        source: Provenance { format: "weka".into(), digest },
    };
    let file_list: Vec<PathBuf> = files.iter().map(|(f, _)| f.clone()).collect();
    let mut builder = GraphBuilder::new(header, file_list.clone(), Loc::default())?;
    let mut ordinal = 0;
    for_each_trace(&files, |name, file, trace| {
        let rows = lower::lower_trace(&trace, name, ordinal, relative).map_err(|m| err(file, m))?;
        ordinal += 1;
        let f = file_list.iter().position(|p| p == file).unwrap_or(0) as u16;
        for row in rows {
            builder.push(Loc { file: f, line: 0 }, row)?;
        }
        Ok(())
    })?;
    let mut graph = builder.finish(speedup)?;
    graph.weka_basis = Some(resolved);
    Ok(graph)
}

/// Every trace object of the corpus in order, parsed one at a time from its file (plain or
/// compressed), with its source name (`file` or `file#NNNNNN` for JSONL).
fn for_each_trace(
    files: &[(PathBuf, String)],
    mut visit: impl FnMut(&str, &Path, WekaTrace) -> Result<(), InputError>,
) -> Result<(), InputError> {
    for (file, rel) in files {
        let jsonl = file.extension().and_then(|e| e.to_str()).is_some_and(|e| e.eq_ignore_ascii_case("jsonl"));
        let input = crate::input::TraceInput::open(file)?;
        let mut reader = input.reader()?;
        let mut count = 0;
        if !jsonl {
            // One object: read whole (it is held whole once parsed anyway).
            let max = input.max_line_bytes();
            let mut text = Vec::new();
            std::io::Read::read_to_end(&mut std::io::Read::take(&mut reader, max + 1), &mut text)
                .map_err(|e| err(file, format!("cannot read: {e}")))?;
            if text.len() as u64 > max {
                return Err(input.line_too_long(None, "the Weka JSON object"));
            }
            let mut objects = serde_json::Deserializer::from_slice(&text).into_iter::<serde::de::IgnoredAny>();
            let mut end = 0;
            while let Some(next) = objects.next() {
                next.map_err(|e| {
                    err(file, format!("parsing Weka source {} object {}: {e}", file.display(), count + 1))
                })?;
                let start = end;
                end = objects.byte_offset();
                if count > 0 {
                    return Err(err(
                        file,
                        format!(
                            "Weka JSON source {} contains more than one object; use a .jsonl extension",
                            file.display()
                        ),
                    ));
                }
                let trace: WekaTrace = serde_json::from_slice(&text[start..end])
                    .map_err(|e| err(file, format!("parsing Weka source {} object 1: {e}", file.display())))?;
                count += 1;
                visit(rel, file, trace)?;
            }
        } else {
            // One object per line; an object written over several lines is gathered until it
            // parses.
            let max = input.max_line_bytes();
            let mut buf: Vec<u8> = Vec::new();
            let mut line = Vec::new();
            let mut lineno = 0;
            loop {
                if buf.is_empty() {
                    lineno +=
                        crate::input::skip_blanks(&mut reader).map_err(|e| err(file, format!("cannot read: {e}")))?;
                }
                lineno += 1;
                let left = max.saturating_sub(buf.len() as u64);
                let n = crate::input::read_line_capped(&mut reader, &mut line, left)
                    .map_err(|e| err(file, format!("cannot read: {e}")))?
                    .ok_or_else(|| input.line_too_long(Some(lineno), "the Weka JSONL object read up to this line"))?;
                if n > 0 {
                    buf.extend_from_slice(&line);
                }
                let text = buf.trim_ascii();
                if text.is_empty() {
                    buf.clear();
                    if n == 0 {
                        break;
                    }
                    continue;
                }
                if n > 0 && !text.ends_with(b"}") {
                    continue;
                }
                let trace = match serde_json::from_slice::<WekaTrace>(text) {
                    Err(e) if e.is_eof() && n > 0 => continue,
                    Err(e) => {
                        return Err(err(
                            file,
                            format!("parsing Weka source {} object {}: {e}", file.display(), count + 1),
                        ))
                    }
                    Ok(trace) => trace,
                };
                let name = format!("{rel}#{count:06}");
                count += 1;
                visit(&name, file, trace)?;
                buf.clear();
                if n == 0 {
                    break;
                }
            }
        }
        if count == 0 {
            return Err(err(file, format!("Weka source {} contains no trace objects", file.display())));
        }
    }
    Ok(())
}

fn collect_files(path: &Path) -> Result<Vec<(PathBuf, String)>, InputError> {
    let meta = std::fs::symlink_metadata(path).map_err(|e| err(path, format!("failed to stat Weka source: {e}")))?;
    if meta.file_type().is_symlink() {
        return Err(err(path, format!("Weka source may not be a symlink: {}", path.display())));
    }
    let ext_ok = |p: &Path| {
        p.extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| e.eq_ignore_ascii_case("json") || e.eq_ignore_ascii_case("jsonl"))
    };
    if meta.is_file() {
        if !ext_ok(path) {
            return Err(err(
                path,
                format!("Weka source file must use a .json or .jsonl extension: {}", path.display()),
            ));
        }
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        return Ok(vec![(path.to_path_buf(), name)]);
    }
    if !meta.is_dir() {
        return Err(err(path, format!("Weka source is neither a file nor directory: {}", path.display())));
    }
    fn visit(
        root: &Path,
        dir: &Path,
        out: &mut Vec<(PathBuf, String)>,
        ext_ok: &dyn Fn(&Path) -> bool,
    ) -> Result<(), InputError> {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .map_err(|e| err(dir, format!("failed to read Weka directory: {e}")))?
            .filter_map(Result::ok)
            .collect();
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let p = entry.path();
            let meta = std::fs::symlink_metadata(&p).map_err(|e| err(&p, e.to_string()))?;
            if meta.file_type().is_symlink() {
                return Err(err(&p, format!("Weka corpus may not contain symlinks: {}", p.display())));
            }
            if meta.is_dir() {
                visit(root, &p, out, ext_ok)?;
                continue;
            }
            if !meta.is_file() || !ext_ok(&p) {
                continue;
            }
            let rel = p.strip_prefix(root).expect("below root");
            let parts: Vec<&str> = rel
                .components()
                .filter_map(|c| match c {
                    Component::Normal(v) => v.to_str(),
                    _ => None,
                })
                .collect();
            out.push((p.clone(), parts.join("/")));
        }
        Ok(())
    }
    let mut out = Vec::new();
    visit(path, path, &mut out, &ext_ok)?;
    out.sort_by(|a, b| a.1.cmp(&b.1));
    Ok(out)
}

fn validate_header(t: &WekaTrace, name: &str) -> Result<(), String> {
    if t.id.trim().is_empty() {
        return Err(format!("Weka trace {name} has an empty id"));
    }
    if t.block_size == 0 {
        return Err(format!("Weka trace {name} has zero block_size"));
    }
    if t.hash_id_scope != "local" {
        return Err(format!("Weka trace {name} has unsupported hash_id_scope {:?}; expected local", t.hash_id_scope));
    }
    Ok(())
}

fn validate_subagent(s: &Subagent, name: &str) -> Result<bool, String> {
    if !s.t.is_finite() || s.t < 0.0 {
        return Err(format!("Weka trace {name} has invalid subagent timestamp"));
    }
    if s.agent_id.trim().is_empty() {
        return Err(format!("Weka trace {name} has an empty subagent agent_id"));
    }
    if s.duration_ms.is_some_and(|d| d < 0) {
        return Err(format!("Weka trace {name} has negative duration_ms for subagent {}", s.agent_id));
    }
    let blocking = match s.status.as_str() {
        "completed" => true,
        "async_launched" => false,
        status => {
            return Err(format!(
                "Weka trace {name} has unsupported non-success subagent status {status:?} for {}",
                s.agent_id
            ))
        }
    };
    if blocking && s.requests.is_empty() {
        return Err(format!(
            "Weka trace {name} has blocking subagent {} with no replayable requests; external waits are not modeled",
            s.agent_id
        ));
    }
    Ok(blocking)
}

fn validate_models(t: &WekaTrace, name: &str) -> Result<(), String> {
    let declared: BTreeSet<&str> = t.models.iter().map(String::as_str).collect();
    if declared.iter().any(|m| m.trim().is_empty()) {
        return Err(format!("Weka trace {name} declares an empty model"));
    }
    let mut actual = BTreeSet::new();
    let mut count = 0;
    let mut see = |r: &Request| -> Result<(), String> {
        if r.model.trim().is_empty() {
            return Err(format!("Weka trace {name} has an empty request model"));
        }
        actual.insert(r.model.clone());
        count += 1;
        Ok(())
    };
    for e in &t.requests {
        match e {
            Entry::Normal(r) | Entry::Streaming(r) => see(r)?,
            Entry::Subagent(s) => {
                for i in &s.requests {
                    see(i.request())?;
                }
            }
        }
    }
    if count == 0 {
        return Err(format!("Weka trace {name} has no model requests"));
    }
    let actual_refs: BTreeSet<&str> = actual.iter().map(String::as_str).collect();
    if !declared.is_empty() && !actual_refs.is_subset(&declared) {
        return Err(format!(
            "Weka trace {name} contains request models absent from its declaration: declared {declared:?}, found {actual_refs:?}"
        ));
    }
    Ok(())
}

fn validate_request(r: &Request, name: &str) -> Result<(), String> {
    if !r.t.is_finite() || r.t < 0.0 || r.t * 1000.0 > crate::ids::MAX_TIME_MS {
        return Err(format!("Weka trace {name} has invalid request timestamp"));
    }
    if r.model.trim().is_empty() {
        return Err(format!("Weka trace {name} has an empty request model"));
    }
    if r.input_length == 0 {
        return Err(format!("Weka trace {name} has a zero-length request"));
    }
    if r.api_time.is_some_and(|v| !v.is_finite() || v < 0.0) {
        return Err(format!("Weka trace {name} has invalid api_time; expected a finite non-negative value"));
    }
    Ok(())
}

fn nested_time(
    inner: f64,
    marker: f64,
    relative: bool,
    name: &str,
    trace: &str,
    agent: &str,
    i: usize,
) -> Result<f64, String> {
    if relative {
        let t = marker + inner;
        if !t.is_finite() {
            return Err(format!(
                "Weka source {name}, trace {trace}, subagent {agent} inner request {i} overflows while converting a relative timestamp"
            ));
        }
        return Ok(t);
    }
    if precedes_marker(inner, marker) {
        return Err(format!(
            "Weka source {name}, trace {trace}, subagent {agent} inner request {i} at {inner} precedes its marker at {marker} under absolute nested_timestamp_basis"
        ));
    }
    Ok(inner.max(marker))
}

fn subagent_end(s: &Subagent, relative: bool) -> Result<f64, String> {
    if let Some(d) = s.duration_ms {
        return Ok(s.t + d as f64 / 1000.0);
    }
    let mut end = s.t;
    for (i, inner) in s.requests.iter().enumerate() {
        let r = inner.request();
        let t = nested_time(r.t, s.t, relative, "<preflighted>", "<preflighted>", &s.agent_id, i)?;
        end = end.max(t + r.api_time.unwrap_or(0.0).max(0.0));
    }
    Ok(end)
}

fn namespace(rel: &str) -> String {
    let d = blake3::hash(rel.as_bytes()).to_hex().to_string();
    format!("weka:{}", &d[..16])
}

fn unique_hash(domain: &str, identity: &str, used: &mut FxHashMap<u64, Box<str>>) -> Result<u64, String> {
    for nonce in 0u32..=u32::MAX {
        let mut h = blake3::Hasher::new();
        h.update(domain.as_bytes());
        h.update(b"\0");
        h.update(identity.as_bytes());
        h.update(b"\0");
        h.update(nonce.to_string().as_bytes());
        let digest = h.finalize();
        let v = u64::from_le_bytes(digest.as_bytes()[..8].try_into().expect("8 bytes"));
        match used.get(&v) {
            Some(existing) if &**existing != identity => continue,
            Some(_) => return Ok(v),
            None => {
                used.insert(v, identity.into());
                return Ok(v);
            }
        }
    }
    Err(format!("could not allocate a collision-free hash for {identity}"))
}

fn normalized_hashes(
    rel: &str,
    request_id: &str,
    r: &Request,
    bs: u64,
    used: &mut FxHashMap<u64, Box<str>>,
) -> Result<Vec<u64>, String> {
    let full = r.input_length / bs;
    let partial = !r.input_length.is_multiple_of(bs);
    let mut out = Vec::with_capacity(full as usize + usize::from(partial));
    for b in 0..full as usize {
        let identity = match r.hash_ids.get(b) {
            Some(h) => format!("source:{rel}:{h}"),
            None => format!("private:missing:{request_id}:{b}"),
        };
        out.push(unique_hash("weka-full-block", &identity, used)?);
    }
    if partial {
        out.push(unique_hash("weka-partial-tail", &format!("{request_id}:{full}:{}", r.input_length), used)?);
    }
    Ok(out)
}
