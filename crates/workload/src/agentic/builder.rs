//! Building the dependency graph from rows: validation with file and line, prompt-prefix
//! sharing between nodes, and the graph's digest.

use super::*;
use rustc_hash::FxHashSet;

/// Where a row came from.
#[derive(Clone, Copy, Debug, Default)]
pub struct Loc {
    pub file: u16,
    pub line: u32,
}

/// A validated row. The row is boxed: a `Vec<Draft>` then grows by pointers, not by 280-byte
/// rows, and `finish` frees each row as it turns it into a node.
struct Draft {
    /// The row without its `hash_ids`, which are interned into `blocks` as it is pushed.
    row: Box<AgenticRow>,
    blocks: Arc<[u32]>,
    input_length: u32,
    output_length: u32,
    loc: Loc,
}

/// Validates rows one by one and compiles them into a graph.
pub struct GraphBuilder {
    block_tokens: u32,
    source: Provenance,
    files: Vec<PathBuf>,
    drafts: Vec<Draft>,
    ids: FxHashSet<String>,
    /// Hash ids interned to compact block ids in the order rows come, and back.
    interner: FxHashMap<u64, u32>,
    hash_values: Vec<u64>,
}

impl GraphBuilder {
    /// Checks a v2 header (or the header a lowering makes up).
    pub fn new(header: Header, files: Vec<PathBuf>, header_loc: Loc) -> Result<GraphBuilder, InputError> {
        let at = |msg: String| at(&files, header_loc, msg);
        if header.schema != AGENTIC_MOONCAKE_SCHEMA {
            return Err(at(format!(
                "unsupported agentic Mooncake schema {:?}; expected {AGENTIC_MOONCAKE_SCHEMA:?}",
                header.schema
            )));
        }
        if header.version != 2 {
            return Err(at(format!("unsupported agentic Mooncake version {}; expected 2", header.version)));
        }
        if header.block_size == 0 {
            return Err(at("agentic Mooncake block_size must be greater than 0".into()));
        }
        let block_tokens = u32::try_from(header.block_size)
            .map_err(|_| at(format!("agentic Mooncake block_size {} is too large", header.block_size)))?;
        if header.source.format.trim().is_empty() || header.source.digest.trim().is_empty() {
            return Err(at("agentic Mooncake source provenance requires nonempty format and digest".into()));
        }
        Ok(GraphBuilder {
            block_tokens,
            source: header.source,
            files,
            drafts: Vec::new(),
            ids: FxHashSet::default(),
            interner: FxHashMap::default(),
            hash_values: Vec::new(),
        })
    }

    pub fn is_empty(&self) -> bool {
        self.drafts.is_empty()
    }

    pub fn len(&self) -> usize {
        self.drafts.len()
    }

    /// Validates one row (the rules of the reference's row checks).
    pub fn push(&mut self, loc: Loc, mut row: AgenticRow) -> Result<(), InputError> {
        let err = |msg: String| at(&self.files, loc, msg);
        for (name, v) in [("request_id", &row.request_id), ("play_id", &row.play_id), ("session_id", &row.session_id)] {
            if v.trim().is_empty() {
                return Err(err(format!("has empty {name}")));
            }
        }
        if self.ids.contains(&row.request_id) {
            return Err(err(format!("duplicates request_id {}", row.request_id)));
        }
        let Some(hash_ids) = &row.hash_ids else { return Err(err("is missing hash_ids".into())) };
        if hash_ids.is_empty() {
            return Err(err("has empty hash_ids".into()));
        }
        let Some(input_length) = row.input_length else { return Err(err("is missing input_length".into())) };
        if input_length == 0 {
            return Err(err("has zero input_length".into()));
        }
        let bs = self.block_tokens as u64;
        let expected = input_length.div_ceil(bs);
        if hash_ids.len() as u64 != expected {
            return Err(err(format!(
                "has input_length {input_length} at block_size {bs} and requires exactly {expected} hash_ids, got {}",
                hash_ids.len()
            )));
        }
        if row.model.trim().is_empty() {
            return Err(err("has an empty model".into()));
        }
        let Some(output_length) = row.output_length else { return Err(err("is missing output_length".into())) };
        if let Some(ids) = &row.output_token_ids {
            if ids.len() as u64 != output_length {
                return Err(err(format!(
                    "output_length {output_length} does not match output_token_ids length {}",
                    ids.len()
                )));
            }
        }
        if !row.not_before_ms.is_finite() || row.not_before_ms < 0.0 || row.not_before_ms > crate::ids::MAX_TIME_MS {
            return Err(err(format!("has invalid not_before_ms {}", row.not_before_ms)));
        }
        if row.recorded_api_time_ms.is_some_and(|d| !d.is_finite() || d < 0.0) {
            return Err(err(format!("has invalid recorded_api_time_ms {:?}", row.recorded_api_time_ms)));
        }
        for d in &row.dependencies {
            if d.request_id.trim().is_empty() {
                return Err(err("has a dependency with an empty request_id".into()));
            }
            if !d.delay_ms.is_finite() || d.delay_ms < 0.0 || d.delay_ms > crate::ids::MAX_TIME_MS {
                return Err(err(format!("has invalid dependency delay {}", d.delay_ms)));
            }
            let ok = matches!(
                (d.relation, d.trigger),
                (Relation::Sequence, Trigger::Completion)
                    | (Relation::Spawn, _)
                    | (Relation::Join, Trigger::Completion)
                    | (Relation::ReplayBarrier, Trigger::Completion)
            );
            if !ok {
                return Err(err(format!(
                    "has invalid {} dependency with {} trigger",
                    d.relation.debug_name(),
                    if d.trigger == Trigger::Dispatch { "Dispatch" } else { "Completion" }
                )));
            }
        }
        let input_length =
            u32::try_from(input_length).map_err(|_| err(format!("input_length {input_length} is too large")))?;
        let output_length =
            u32::try_from(output_length).map_err(|_| err(format!("output_length {output_length} is too large")))?;
        self.ids.insert(row.request_id.clone());
        let (interner, values) = (&mut self.interner, &mut self.hash_values);
        let blocks: Arc<[u32]> = row
            .hash_ids
            .take()
            .unwrap_or_default()
            .iter()
            .map(|&h| {
                *interner.entry(h).or_insert_with(|| {
                    values.push(h);
                    (values.len() - 1) as u32
                })
            })
            .collect();
        self.drafts.push(Draft { row: Box::new(row), blocks, input_length, output_length, loc });
        Ok(())
    }

    /// Checks the graph (edges, cycles, roots, play order), normalises its times (earliest
    /// `not_before_ms` at 0, then divided by `speedup`), computes its digest and interns its
    /// hash ids.
    pub fn finish(mut self, speedup: f64) -> Result<AgenticGraph, InputError> {
        drop(std::mem::take(&mut self.ids));
        let files = std::mem::take(&mut self.files);
        let first_file = files.first().cloned().unwrap_or_default();
        let in_file = |msg: String| InputError::in_file(&first_file, msg);
        if self.drafts.is_empty() {
            return Err(in_file("agentic trace did not contain any requests".into()));
        }
        self.drafts.sort_by(|a, b| a.row.request_id.cmp(&b.row.request_id));
        let index: FxHashMap<&str, u32> =
            self.drafts.iter().enumerate().map(|(i, d)| (d.row.request_id.as_str(), i as u32)).collect();
        let mut play_index: FxHashMap<&str, u32> = FxHashMap::default();
        let mut play_names: Vec<&str> = Vec::new();
        let mut play_nodes: Vec<Vec<u32>> = Vec::new();
        let mut deps: Vec<Vec<Edge>> = Vec::with_capacity(self.drafts.len());
        for (i, d) in self.drafts.iter().enumerate() {
            let p = *play_index.entry(d.row.play_id.as_str()).or_insert_with(|| {
                play_names.push(d.row.play_id.as_str());
                play_nodes.push(Vec::new());
                (play_names.len() - 1) as u32
            });
            play_nodes[p as usize].push(i as u32);
            let mut edges = Vec::with_capacity(d.row.dependencies.len());
            for dep in &d.row.dependencies {
                let at_node = |msg: String| at(&files, d.loc, msg);
                let Some(&source) = index.get(dep.request_id.as_str()) else {
                    return Err(at_node(format!(
                        "request {} references unknown request_id {}",
                        d.row.request_id, dep.request_id
                    )));
                };
                if source as usize == i {
                    return Err(at_node(format!("request {} cannot depend on itself", d.row.request_id)));
                }
                let src = &self.drafts[source as usize].row;
                if src.play_id != d.row.play_id {
                    return Err(at_node(format!(
                        "request {} in play {} depends on request {} in play {}",
                        d.row.request_id, d.row.play_id, dep.request_id, src.play_id
                    )));
                }
                edges.push(Edge { source, trigger: dep.trigger, delay_ms: dep.delay_ms, relation: dep.relation });
            }
            deps.push(edges);
        }
        // Cycles (Kahn's algorithm), checked before roots.
        let n = self.drafts.len();
        let mut indegree: Vec<usize> = deps.iter().map(Vec::len).collect();
        let mut dependents: Vec<Vec<u32>> = vec![Vec::new(); n];
        for (i, edges) in deps.iter().enumerate() {
            for e in edges {
                dependents[e.source as usize].push(i as u32);
            }
        }
        let mut queue: VecDeque<u32> = (0..n as u32).filter(|&i| indegree[i as usize] == 0).collect();
        let mut visited = 0;
        while let Some(i) = queue.pop_front() {
            visited += 1;
            for &t in &dependents[i as usize] {
                indegree[t as usize] -= 1;
                if indegree[t as usize] == 0 {
                    queue.push_back(t);
                }
            }
        }
        if visited != n {
            let blocked: Vec<&str> =
                (0..n).filter(|&i| indegree[i] > 0).take(8).map(|i| self.drafts[i].row.request_id.as_str()).collect();
            return Err(in_file(format!(
                "cycle detected among {} agentic requests; blocked request IDs: {}",
                n - visited,
                blocked.join(", ")
            )));
        }
        // Plays: roots, ordinals, order.
        let mut plays: Vec<(Option<usize>, Play)> = Vec::with_capacity(play_names.len());
        for (p, nodes) in play_nodes.into_iter().enumerate() {
            let ordinal = self.drafts[nodes[0] as usize].row.source_play_ordinal;
            if nodes.iter().any(|&i| self.drafts[i as usize].row.source_play_ordinal != ordinal) {
                return Err(in_file(format!("play {} has inconsistent source_play_ordinal values", play_names[p])));
            }
            let roots: Vec<u32> = nodes.iter().copied().filter(|&i| deps[i as usize].is_empty()).collect();
            if roots.is_empty() {
                return Err(in_file(format!("play {} must have at least one root request, found 0", play_names[p])));
            }
            plays.push((ordinal, Play { id: play_names[p].into(), nodes, roots }));
        }
        let ordered = plays.iter().filter(|(o, _)| o.is_some()).count();
        if ordered != 0 && ordered != plays.len() {
            return Err(in_file("source_play_ordinal must be set for every play when it is used".into()));
        }
        if ordered == plays.len() {
            let mut ordinals: Vec<usize> = plays.iter().map(|(o, _)| o.unwrap()).collect();
            ordinals.sort_unstable();
            for (expected, actual) in ordinals.into_iter().enumerate() {
                if actual != expected {
                    return Err(in_file(format!(
                        "source_play_ordinal values must be unique and contiguous from 0; expected {expected}, found {actual}"
                    )));
                }
            }
            plays.sort_by_key(|(o, _)| o.unwrap());
        } else {
            plays.sort_by(|a, b| a.1.id.cmp(&b.1.id));
        }
        let plays: Vec<Play> = plays.into_iter().map(|(_, p)| p).collect();
        let mut node_play = vec![0u32; n];
        for (p, play) in plays.iter().enumerate() {
            for &i in &play.nodes {
                node_play[i as usize] = p as u32;
            }
        }
        // Normalise times.
        let min_nb = self.drafts.iter().map(|d| d.row.not_before_ms).fold(f64::INFINITY, f64::min);
        for (d, edges) in self.drafts.iter_mut().zip(deps.iter_mut()) {
            d.row.not_before_ms = (d.row.not_before_ms - min_nb) / speedup;
            for (e, rd) in edges.iter_mut().zip(d.row.dependencies.iter_mut()) {
                e.delay_ms /= speedup;
                rd.delay_ms = e.delay_ms;
            }
        }
        drop(std::mem::take(&mut self.interner));
        let graph_digest = digest(self.block_tokens, &mut self.drafts, &self.hash_values);
        drop(std::mem::take(&mut self.hash_values));
        // Identities and interned prompts.
        let root_id: Vec<Option<Arc<str>>> = plays
            .iter()
            .map(|p| (p.roots.len() == 1).then(|| Arc::from(self.drafts[p.roots[0] as usize].row.request_id.as_str())))
            .collect();
        let mut models: Vec<String> = Vec::new();
        let mut model_index: FxHashMap<String, u32> = FxHashMap::default();
        let mut sessions: FxHashMap<String, Arc<str>> = FxHashMap::default();
        let mut nodes = Vec::with_capacity(n);
        let request_ids: Vec<Arc<str>> = self.drafts.iter().map(|d| Arc::from(d.row.request_id.as_str())).collect();
        for (i, (d, edges)) in self.drafts.into_iter().zip(deps).enumerate() {
            let model = *model_index.entry(d.row.model.clone()).or_insert_with(|| {
                models.push(d.row.model.clone());
                (models.len() - 1) as u32
            });
            let blocks = d.blocks;
            let session: Arc<str> =
                sessions.entry(d.row.session_id.clone()).or_insert_with(|| d.row.session_id.as_str().into()).clone();
            let parent_id = edges
                .iter()
                .filter(|e| e.relation == Relation::Spawn)
                .map(|e| e.source)
                .min()
                .map(|s| request_ids[s as usize].clone());
            let play = node_play[i];
            let ids = AgenticIds {
                node: i as u32,
                request_id: request_ids[i].clone(),
                play_id: plays[play as usize].id.clone(),
                conversation_id: session.clone(),
                lane: None,
                root_id: root_id[play as usize].clone(),
                parent_id,
            };
            let turn = TurnSpec {
                input_length: d.input_length,
                output_length: d.output_length,
                blocks,
                delay_ms: 0.0,
                priority: d.row.priority.unwrap_or(0),
                strict_priority: d.row.strict_priority.unwrap_or(0),
                output_tokens: d.row.output_token_ids.map(Into::into),
                meta: Some(Arc::new(TurnMeta {
                    request_id: Some(request_ids[i].clone()),
                    policy_class: d.row.policy_class.map(Into::into),
                    agentic: Some(ids),
                })),
            };
            nodes.push(Node {
                request_id: request_ids[i].clone(),
                source_request_id: None,
                play,
                session_id: session,
                model,
                not_before_ms: d.row.not_before_ms,
                recorded_api_ms: d.row.recorded_api_time_ms,
                deps: edges,
                turn,
                file: d.loc.file,
                line: d.loc.line,
            });
        }
        share_prompt_prefixes(&mut nodes);
        Ok(AgenticGraph {
            block_tokens: self.block_tokens,
            source: self.source,
            graph_digest,
            nodes,
            plays,
            models,
            weka_basis: None,
            lanes: None,
            snapshot: None,
            execution_model: None,
            preparation: None,
            profile: None,
            outcome: Mutex::new(None),
        })
    }
}

/// Requests of a session usually resend the session's earlier prompt and add to it: a node
/// whose blocks are a prefix of a longer node's in its session shares that node's list (a
/// prompt is cut at its own `input_length`).
fn share_prompt_prefixes(nodes: &mut [Node]) {
    let mut by_session: FxHashMap<Arc<str>, Vec<usize>> = FxHashMap::default();
    for (i, n) in nodes.iter().enumerate() {
        by_session.entry(n.session_id.clone()).or_default().push(i);
    }
    for (_, mut members) in by_session {
        if members.len() < 2 {
            continue;
        }
        members.sort_by_key(|&i| std::cmp::Reverse(nodes[i].turn.blocks.len()));
        let mut longest: Vec<Arc<[u32]>> = Vec::new();
        for i in members {
            let blocks = nodes[i].turn.blocks.clone();
            match longest.iter().find(|l| l.starts_with(&blocks)) {
                Some(l) => nodes[i].turn.blocks = l.clone(),
                None => longest.push(blocks),
            }
            if longest.len() > 8 {
                longest.remove(0);
            }
        }
    }
}

fn at(files: &[PathBuf], loc: Loc, msg: String) -> InputError {
    match files.get(loc.file as usize) {
        Some(f) if loc.line > 0 => InputError::at_line(f, loc.line as usize, None, msg),
        Some(f) => InputError::in_file(f, msg),
        None => InputError::new(msg),
    }
}

/// An error about a row, located.
pub fn row_error(path: &Path, line: usize, msg: impl Into<String>) -> InputError {
    InputError::at_line(path, line, None, msg)
}

mod erased {
    /// A value serde_json can write (object-safe, for the digest writer).
    pub trait Ser {
        fn write(&self, w: &mut dyn std::io::Write);
    }
    impl<T: serde::Serialize> Ser for T {
        fn write(&self, w: &mut dyn std::io::Write) {
            let _ = serde_json::to_writer(w, self);
        }
    }
}

/// blake3 over the canonical JSON of the graph (`{"block_size", "nodes"}`, dependencies sorted),
/// as the reference computes `graph_digest`.
fn digest(block_size: u32, drafts: &mut [Draft], hash_values: &[u64]) -> String {
    // The nodes are written into one buffer hashed 64 KiB at a time: BLAKE3 hashes large inputs
    // many chunks at once, where a node's few hundred bytes would go one 64-byte block at a time.
    const FLUSH: usize = 1 << 16;
    let mut buf: Vec<u8> = Vec::with_capacity(FLUSH + 4096);
    let rank_t = |t: Trigger| t as u8;
    let rank_r = |r: Relation| r as u8;
    let mut h = blake3::Hasher::new();
    buf.extend_from_slice(format!("{{\"block_size\":{block_size},\"nodes\":[").as_bytes());
    for (i, d) in drafts.iter_mut().enumerate() {
        if i > 0 {
            buf.push(b',');
        }
        let r = &mut d.row;
        r.dependencies.sort_by(|a, b| {
            a.request_id
                .cmp(&b.request_id)
                .then(rank_t(a.trigger).cmp(&rank_t(b.trigger)))
                .then(rank_r(a.relation).cmp(&rank_r(b.relation)))
                .then(a.delay_ms.total_cmp(&b.delay_ms))
        });
        // The node as the reference's serde derive writes it (field order, skipped options).
        let mut w = &mut buf;
        let put = |w: &mut &mut Vec<u8>, key: &str, v: &dyn erased::Ser| {
            let _ = std::io::Write::write_all(w, key.as_bytes());
            v.write(w);
        };
        put(&mut w, "{\"request_id\":", &r.request_id.as_str());
        put(&mut w, ",\"play_id\":", &r.play_id.as_str());
        if let Some(o) = r.source_play_ordinal {
            put(&mut w, ",\"source_play_ordinal\":", &o);
        }
        put(&mut w, ",\"session_id\":", &r.session_id.as_str());
        put(&mut w, ",\"model\":", &r.model.as_str());
        put(&mut w, ",\"input_length\":", &d.input_length);
        put(&mut w, ",\"max_output_tokens\":", &d.output_length);
        put(&mut w, ",\"output_token_ids\":", &r.output_token_ids);
        put(&mut w, ",\"replay_key\":", &r.output_token_ids.as_ref().map(|_| r.request_id.as_str()));
        // The row's hash_ids, as serde writes a list of integers.
        let _ = std::io::Write::write_all(&mut w, b",\"hash_ids\":[");
        for (k, &b) in d.blocks.iter().enumerate() {
            put(&mut w, if k == 0 { "" } else { "," }, &hash_values[b as usize]);
        }
        let _ = std::io::Write::write_all(&mut w, b"]");
        put(&mut w, ",\"not_before_ms\":", &r.not_before_ms);
        if let Some(t) = r.recorded_api_time_ms {
            put(&mut w, ",\"recorded_api_time_ms\":", &t);
        }
        put(&mut w, ",\"priority\":", &r.priority.unwrap_or(0));
        put(&mut w, ",\"strict_priority\":", &r.strict_priority.unwrap_or(0));
        put(&mut w, ",\"policy_class\":", &r.policy_class);
        let _ = std::io::Write::write_all(&mut w, b",\"dependencies\":[");
        for (k, dep) in r.dependencies.iter().enumerate() {
            let open = if k == 0 { "{\"request_id\":" } else { ",{\"request_id\":" };
            put(&mut w, open, &dep.request_id.as_str());
            let _ = std::io::Write::write_all(&mut w, format!(",\"trigger\":\"{}\"", dep.trigger.name()).as_bytes());
            put(&mut w, ",\"delay_ms\":", &dep.delay_ms);
            let _ =
                std::io::Write::write_all(&mut w, format!(",\"relation\":\"{}\"}}", dep.relation.name()).as_bytes());
        }
        let _ = std::io::Write::write_all(&mut w, b"]}");
        if buf.len() >= FLUSH {
            h.update(&buf);
            buf.clear();
        }
    }
    buf.extend_from_slice(b"]}");
    h.update(&buf);
    h.finalize().to_hex().to_string()
}
