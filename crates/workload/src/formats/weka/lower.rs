//! Chain detection and lowering of one Weka trace object: requests split into chains by
//! prefix matching (preambles, seams), subagent scopes, and the rows with their dependencies.

use super::*;

fn push_dep(values: &mut Vec<RowDependency>, d: RowDependency) {
    if !values.iter().any(|e| e.request_id == d.request_id && e.trigger == d.trigger && e.relation == d.relation) {
        values.push(d);
    }
}

fn split_preamble(mut requests: Vec<Indexed>) -> (Vec<Indexed>, Vec<Indexed>) {
    requests.sort_by(order);
    if requests.len() < 2 || requests[0].request.hash_ids.is_empty() {
        return (Vec::new(), requests);
    }
    let first = &requests[0].request;
    if requests[1..].iter().any(|o| lcp(&first.hash_ids, &o.request.hash_ids) > 0) {
        return (Vec::new(), requests);
    }
    if first.output_length > 64 {
        let others: HashSet<u64> = requests[1..].iter().flat_map(|r| r.request.hash_ids.iter().copied()).collect();
        if first.hash_ids.iter().any(|h| others.contains(h)) {
            return (Vec::new(), requests);
        }
    }
    let first = requests.remove(0);
    (vec![first], requests)
}

fn append_chain(index: usize, chain: &mut Chain, by_source: &mut HashMap<String, usize>, r: Indexed) {
    by_source.insert(r.source_id.clone(), index);
    if !r.request.hash_ids.is_empty() {
        chain.tail_source_id = Some(r.source_id.clone());
        chain.tail_hashes.clone_from(&r.request.hash_ids);
        chain.tail_end = request_end(&r.request);
        chain.tail_model.clone_from(&r.request.model);
    }
    chain.requests.push(r);
}

fn extension_target(chains: &[Chain], r: &Request) -> Option<usize> {
    let mut best = None;
    let mut best_len = 0;
    for (i, c) in chains.iter().enumerate() {
        let n = c.tail_hashes.len();
        if n == 0
            || n > r.hash_ids.len()
            || n <= best_len
            || c.tail_model != r.model
            || c.tail_end > r.t + JOIN_EPSILON_SECONDS
            || c.tail_hashes != r.hash_ids[..n]
        {
            continue;
        }
        best = Some(i);
        best_len = n;
    }
    best
}

fn max_lcp_chain(chains: &[Chain], hashes: &[u64]) -> (Option<usize>, usize) {
    let mut best = None;
    let mut key = (0, 0);
    for (i, c) in chains.iter().enumerate() {
        let depth = lcp(&c.tail_hashes, hashes);
        let k = (depth, c.tail_hashes.len());
        if depth > 0 && k > key {
            best = Some(i);
            key = k;
        }
    }
    (best, key.0)
}

fn seam_eligible(chain: &Chain, tail: &Request) -> bool {
    let Some(fork) = &chain.fork else { return false };
    if fork.depth == 0 || chain.requests.is_empty() {
        return false;
    }
    let first = &chain.requests[0].request;
    let gap = first.t - request_end(tail);
    let overlap = fork.depth as f64 / tail.hash_ids.len().max(1) as f64;
    request_end(tail) <= first.t + JOIN_EPSILON_SECONDS
        && first.model == tail.model
        && !(gap > SEAM_MAX_GAP_SECONDS && overlap < SEAM_MIN_OVERLAP_RATIO)
}

fn resolve_seams(
    chains: &mut [Chain],
    forks_by_source: &mut HashMap<String, Vec<usize>>,
    by_source: &mut HashMap<String, usize>,
    request_by_source: &HashMap<String, Request>,
) {
    let mut keys: BTreeSet<String> = forks_by_source.keys().cloned().collect();
    let mut aliases: HashMap<usize, usize> = HashMap::new();
    let mut processed: HashSet<String> = HashSet::new();
    while let Some(source_id) = keys.pop_first() {
        if !processed.insert(source_id.clone()) {
            continue;
        }
        let mut owner = by_source[&source_id];
        while let Some(&next) = aliases.get(&owner) {
            owner = next;
        }
        if chains[owner].tail_source_id.as_deref() != Some(source_id.as_str()) {
            continue;
        }
        let tail = &request_by_source[&source_id];
        let registered: Vec<usize> =
            forks_by_source[&source_id].iter().copied().filter(|&i| chains[i].spliced_into.is_none()).collect();
        let elected = registered.iter().copied().filter(|&i| seam_eligible(&chains[i], tail)).max_by(|&l, &r| {
            let lf = chains[l].fork.as_ref().unwrap();
            let rf = chains[r].fork.as_ref().unwrap();
            lf.depth.cmp(&rf.depth).then_with(|| rf.fork_time.total_cmp(&lf.fork_time)).then_with(|| r.cmp(&l))
        });
        let Some(elected) = elected else { continue };
        let moved = std::mem::take(&mut chains[elected].requests);
        for r in &moved {
            by_source.insert(r.source_id.clone(), owner);
        }
        chains[owner].requests.extend(moved);
        chains[owner].tail_source_id = chains[elected].tail_source_id.clone();
        chains[owner].tail_hashes = chains[elected].tail_hashes.clone();
        chains[owner].tail_end = chains[elected].tail_end;
        chains[owner].tail_model = chains[elected].tail_model.clone();
        chains[elected].spliced_into = Some(owner);
        aliases.insert(elected, owner);
        let Some(new_tail_source) = chains[owner].tail_source_id.clone() else { continue };
        let new_tail_hashes = chains[owner].tail_hashes.clone();
        let new_tail = &request_by_source[&new_tail_source];
        for candidate in registered {
            if candidate == elected || chains[candidate].spliced_into.is_some() {
                continue;
            }
            let first = &chains[candidate].requests[0].request;
            if new_tail.t > first.t + JOIN_EPSILON_SECONDS {
                continue;
            }
            let depth = lcp(&new_tail_hashes, &first.hash_ids);
            if depth == 0 {
                continue;
            }
            let fork = chains[candidate].fork.as_mut().unwrap();
            fork.fork_source_id = Some(new_tail_source.clone());
            fork.depth = depth;
            forks_by_source.entry(new_tail_source.clone()).or_default().push(candidate);
            processed.remove(&new_tail_source);
            keys.insert(new_tail_source.clone());
        }
    }
}

fn detect_chains(mut requests: Vec<Indexed>) -> Detection {
    requests.sort_by(order);
    let mut chains: Vec<Chain> = Vec::new();
    let mut by_source: HashMap<String, usize> = HashMap::new();
    let mut forks_by_source: HashMap<String, Vec<usize>> = HashMap::new();
    let mut request_by_source: HashMap<String, Request> = HashMap::new();
    for r in requests {
        request_by_source.insert(r.source_id.clone(), r.request.clone());
        if r.request.hash_ids.is_empty() {
            if chains.is_empty() {
                chains.push(Chain::default());
            }
            by_source.insert(r.source_id.clone(), 0);
            chains[0].requests.push(r);
            continue;
        }
        if chains.is_empty() {
            chains.push(Chain::default());
            append_chain(0, &mut chains[0], &mut by_source, r);
            continue;
        }
        if let Some(t) = extension_target(&chains, &r.request) {
            append_chain(t, &mut chains[t], &mut by_source, r);
            continue;
        }
        if chains.iter().all(|c| c.tail_hashes.is_empty()) {
            append_chain(0, &mut chains[0], &mut by_source, r);
            continue;
        }
        let (parent, depth) = max_lcp_chain(&chains, &r.request.hash_ids);
        let fork_source_id = parent.and_then(|p| chains[p].tail_source_id.clone());
        let index = chains.len();
        chains.push(Chain {
            fork: Some(Fork { fork_source_id: fork_source_id.clone(), depth, fork_time: r.request.t }),
            ..Default::default()
        });
        append_chain(index, &mut chains[index], &mut by_source, r);
        if let Some(s) = fork_source_id.filter(|_| depth > 0) {
            forks_by_source.entry(s).or_default().push(index);
        }
    }
    resolve_seams(&mut chains, &mut forks_by_source, &mut by_source, &request_by_source);
    let aliases: HashMap<usize, usize> =
        chains.iter().enumerate().filter_map(|(i, c)| c.spliced_into.map(|o| (i, o))).collect();
    let resolve = |mut i: usize| {
        while let Some(&o) = aliases.get(&i) {
            i = o;
        }
        i
    };
    let main_index = chains
        .iter()
        .enumerate()
        .filter(|(_, c)| c.spliced_into.is_none())
        .min_by(|(_, l), (_, r)| order(&l.requests[0], &r.requests[0]))
        .map(|(i, _)| resolve(i))
        .unwrap_or(0);
    let mut worker_indices: Vec<usize> = chains
        .iter()
        .enumerate()
        .filter_map(|(i, c)| (c.spliced_into.is_none() && i != main_index).then_some(i))
        .collect();
    worker_indices.sort_by(|&l, &r| order(&chains[l].requests[0], &chains[r].requests[0]));
    Detection { chains, main_index, worker_indices }
}

fn streams_from(ns: &str, prefix: &str, d: &Detection, mut preamble: Vec<Indexed>) -> Vec<Stream> {
    let mut out = Vec::with_capacity(1 + d.worker_indices.len());
    let main = &d.chains[d.main_index];
    let mut main_requests = main.requests.clone();
    main_requests.append(&mut preamble);
    main_requests.sort_by(order);
    out.push(Stream {
        session_id: format!("{ns}:session:{prefix}"),
        requests: main_requests,
        fork_source_id: main.fork.as_ref().and_then(|f| f.fork_source_id.clone()),
        scope_id: format!("{ns}:scope:{prefix}"),
    });
    for (w, &c) in d.worker_indices.iter().enumerate() {
        let chain = &d.chains[c];
        out.push(Stream {
            session_id: format!("{ns}:session:{prefix}:worker:{w}"),
            requests: chain.requests.clone(),
            fork_source_id: chain.fork.as_ref().and_then(|f| f.fork_source_id.clone()),
            scope_id: format!("{ns}:scope:{prefix}"),
        });
    }
    out
}

fn cross_stream_frontiers(
    streams: &[Stream],
    row_by_source: &HashMap<String, String>,
    deps: &mut HashMap<String, Vec<RowDependency>>,
) {
    let mut by_scope: BTreeMap<&str, Vec<&Stream>> = BTreeMap::new();
    for s in streams {
        by_scope.entry(&s.scope_id).or_default().push(s);
    }
    for scoped in by_scope.values() {
        for target_stream in scoped {
            for target in &target_stream.requests {
                let mut frontier = Vec::new();
                for other in scoped {
                    if std::ptr::eq(*other, *target_stream) {
                        continue;
                    }
                    let latest = other
                        .requests
                        .iter()
                        .filter(|c| {
                            c.request.t < target.request.t
                                && request_end(&c.request) <= target.request.t + JOIN_EPSILON_SECONDS
                        })
                        .max_by(|l, r| {
                            request_end(&l.request)
                                .total_cmp(&request_end(&r.request))
                                .then(l.request.t.total_cmp(&r.request.t))
                                .then(l.source_id.cmp(&r.source_id))
                        });
                    if let Some(l) = latest {
                        frontier.push(l);
                    }
                }
                let pruned: Vec<&Indexed> = frontier
                    .iter()
                    .filter(|c| {
                        !frontier.iter().any(|later| {
                            c.request.t < later.request.t
                                && request_end(&c.request) <= later.request.t + JOIN_EPSILON_SECONDS
                        })
                    })
                    .copied()
                    .collect();
                for p in pruned {
                    push_dep(
                        deps.entry(target.source_id.clone()).or_default(),
                        RowDependency {
                            request_id: row_by_source[&p.source_id].clone(),
                            trigger: Trigger::Completion,
                            delay_ms: 0.0,
                            relation: Relation::ReplayBarrier,
                        },
                    );
                }
            }
        }
    }
}

pub(super) fn lower_trace(
    trace: &WekaTrace,
    rel: &str,
    ordinal: usize,
    relative: bool,
) -> Result<Vec<AgenticRow>, String> {
    let ns = namespace(rel);
    let play_id = format!("{ns}:play:{}", trace.id);
    let mut top = Vec::new();
    let mut explicit = Vec::new();
    for (outer, e) in trace.requests.iter().enumerate() {
        if let Some(r) = e.request() {
            top.push(Indexed { source_id: format!("outer:{outer}"), source_order: outer, request: r.clone() });
        } else if let Entry::Subagent(s) = e {
            explicit.push((outer, s));
        }
    }
    if top.is_empty() {
        return Err(format!("Weka trace {rel} has no parent requests"));
    }
    let (pre, input) = split_preamble(top);
    let det = detect_chains(input);
    let mut streams = streams_from(&ns, "root", &det, pre);
    let root_stream = streams.iter().position(|s| s.session_id.ends_with(":root")).expect("root stream");
    let parent_count = streams.len();
    let mut join_markers: Vec<(String, Vec<String>)> = Vec::new();
    for (outer, sub) in explicit {
        let blocking = validate_subagent(sub, rel)?;
        let mut owners: Vec<(usize, &Indexed)> = streams[..parent_count]
            .iter()
            .enumerate()
            .flat_map(|(si, s)| s.requests.iter().filter(move |r| r.source_order < outer).map(move |r| (si, r)))
            .collect();
        owners.sort_by_key(|(_, r)| r.source_order);
        let Some((owner_stream, owner)) = owners.pop() else {
            return Err(format!(
                "Weka trace {rel} has subagent {} at outer index {outer} without a preceding parent request",
                sub.agent_id
            ));
        };
        if owners.last().is_some_and(|(_, c)| c.source_order == owner.source_order) {
            return Err(format!(
                "Weka trace {rel} has ambiguous parent-stream ownership for subagent {} at outer index {outer}",
                sub.agent_id
            ));
        }
        let spawn_source = owner.source_id.clone();
        let mut inner = Vec::with_capacity(sub.requests.len());
        for (i, e) in sub.requests.iter().enumerate() {
            let mut r = e.request().clone();
            r.t = nested_time(r.t, sub.t, relative, rel, &trace.id, &sub.agent_id, i)?;
            validate_request(&r, rel)?;
            inner.push(Indexed { source_id: format!("outer:{outer}:inner:{i}"), source_order: i, request: r });
        }
        if inner.is_empty() {
            continue;
        }
        let (pre, input) = split_preamble(inner);
        let cdet = detect_chains(input);
        let prefix = format!("subagent:{outer}:{}", sub.agent_id);
        let mut child = streams_from(&ns, &prefix, &cdet, pre);
        let suffix = format!(":{prefix}");
        let croot = child.iter_mut().find(|s| s.session_id.ends_with(&suffix)).expect("subagent root stream");
        croot.fork_source_id = Some(spawn_source);
        croot.scope_id = croot.session_id.clone();
        let scope = croot.scope_id.clone();
        for s in &mut child {
            s.scope_id = scope.clone();
        }
        let join_source = if blocking {
            let end = subagent_end(sub, relative)?;
            streams[owner_stream]
                .requests
                .iter()
                .filter(|r| r.source_order > outer && r.request.t + JOIN_EPSILON_SECONDS >= end)
                .min_by_key(|r| r.source_order)
                .map(|r| r.source_id.clone())
        } else {
            None
        };
        let range = streams.len()..streams.len() + child.len();
        streams.extend(child);
        if let Some(j) = join_source {
            let terminals: Vec<String> =
                range.filter_map(|i| streams[i].requests.last()).map(|r| r.source_id.clone()).collect();
            if !terminals.is_empty() {
                join_markers.push((j, terminals));
            }
        }
    }
    let root_time = streams.iter().flat_map(|s| s.requests.iter()).map(|r| r.request.t).fold(f64::INFINITY, f64::min);
    let mut row_by_source: HashMap<String, String> = HashMap::new();
    let mut request_by_source: HashMap<String, &Indexed> = HashMap::new();
    for s in &streams {
        for r in &s.requests {
            row_by_source.insert(r.source_id.clone(), format!("{ns}:request:{}", r.source_id));
            request_by_source.insert(r.source_id.clone(), r);
        }
    }
    let root_source = streams[root_stream].requests.first().expect("root stream is non-empty").source_id.clone();
    let mut deps: HashMap<String, Vec<RowDependency>> = HashMap::new();
    for s in &streams {
        for w in s.requests.windows(2) {
            push_dep(
                deps.entry(w[1].source_id.clone()).or_default(),
                RowDependency {
                    request_id: row_by_source[&w[0].source_id].clone(),
                    trigger: Trigger::Completion,
                    delay_ms: ms(w[1].request.t - request_end(&w[0].request)),
                    relation: Relation::Sequence,
                },
            );
        }
    }
    for s in &streams {
        let (Some(first), Some(spawn)) = (s.requests.first(), s.fork_source_id.as_ref()) else { continue };
        let parent = request_by_source.get(spawn).ok_or_else(|| format!("spawn source {spawn} is missing"))?;
        let (trigger, delay) = if first.request.t < request_end(&parent.request) {
            (Trigger::Dispatch, ms(first.request.t - parent.request.t))
        } else {
            (Trigger::Completion, ms(first.request.t - request_end(&parent.request)))
        };
        push_dep(
            deps.entry(first.source_id.clone()).or_default(),
            RowDependency {
                request_id: row_by_source[spawn].clone(),
                trigger,
                delay_ms: delay,
                relation: Relation::Spawn,
            },
        );
    }
    cross_stream_frontiers(&streams, &row_by_source, &mut deps);
    for (target, terminals) in join_markers {
        for term in terminals {
            let t = request_by_source[&target];
            let e = request_by_source[&term];
            push_dep(
                deps.entry(target.clone()).or_default(),
                RowDependency {
                    request_id: row_by_source[&term].clone(),
                    trigger: Trigger::Completion,
                    delay_ms: ms(t.request.t - request_end(&e.request)),
                    relation: Relation::Join,
                },
            );
        }
    }
    for s in &streams {
        let Some(first) = s.requests.first() else { continue };
        if first.source_id == root_source || deps.get(&first.source_id).is_some_and(|e| !e.is_empty()) {
            continue;
        }
        push_dep(
            deps.entry(first.source_id.clone()).or_default(),
            RowDependency {
                request_id: row_by_source[&root_source].clone(),
                trigger: Trigger::Dispatch,
                delay_ms: ms(first.request.t - streams[root_stream].requests[0].request.t),
                relation: Relation::Spawn,
            },
        );
    }
    let mut rows = Vec::new();
    let mut used = FxHashMap::default();
    for s in &streams {
        for r in &s.requests {
            let request_id = row_by_source[&r.source_id].clone();
            let hashes = normalized_hashes(rel, &request_id, &r.request, trace.block_size, &mut used)?;
            rows.push(AgenticRow {
                request_id,
                play_id: play_id.clone(),
                source_play_ordinal: Some(ordinal),
                session_id: s.session_id.clone(),
                model: r.request.model.clone(),
                input_length: Some(r.request.input_length),
                output_length: Some(r.request.output_length),
                output_token_ids: None,
                hash_ids: Some(hashes),
                not_before_ms: ms(r.request.t - root_time),
                recorded_api_time_ms: r.request.api_time.map(ms),
                priority: None,
                strict_priority: None,
                policy_class: None,
                dependencies: deps.remove(&r.source_id).unwrap_or_default(),
            });
        }
    }
    let expected: usize = trace
        .requests
        .iter()
        .map(|e| match e {
            Entry::Normal(_) | Entry::Streaming(_) => 1,
            Entry::Subagent(s) => s.requests.len(),
        })
        .sum();
    if rows.len() != expected {
        return Err(format!("Weka trace {rel} did not lower every source request (orphan subagents are unsupported)"));
    }
    Ok(rows)
}
