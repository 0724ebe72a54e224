//! The run report: the summary object (the reference's key names) and per-request records.

use serde_json::{json, Map, Value};
use servesim_engine::Role;

use crate::metrics::{Collector, RequestRecord, Status, Totals, TtftBreakdown};
use crate::sim::SimConfig;
use crate::stats::{Samples, Summary};
use servesim_workload::agentic::AgenticGraph;
use servesim_workload::Workload;

/// Latency and throughput distributions of a run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Distributions {
    pub ttft: Summary,
    pub ttst: Summary,
    pub tpot: Summary,
    pub itl: Summary,
    pub e2e: Summary,
    pub per_user: Summary,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    pub totals: Totals,
    pub dist: Distributions,
    /// Virtual time at which the last event happened.
    pub end_ms: f64,
    /// Workers and GPUs per worker of the prefill pool (0 when aggregated) and of the decode
    /// (or aggregated) pool.
    pub prefill_workers: u32,
    pub prefill_gpus_per_worker: u32,
    pub decode_workers: u32,
    pub decode_gpus_per_worker: u32,
    pub sla_set: bool,
    /// Speculative decoding is configured (the report then shows accept lengths).
    pub speculative: bool,
    /// Host time the run took (set by the caller that measured it).
    pub wall_time_ms: f64,
    /// Arrivals dropped at a full admission queue, when the run sheds them.
    pub shed: Option<u64>,
    /// Worker-seconds (prefill, decode) integrated over the workers' lifecycle, when an
    /// autoscaler changed them during the run; otherwise workers × duration.
    pub worker_seconds: Option<(f64, f64)>,
    /// Distributions of the TTFT parts (in [`TtftBreakdown::NAMES`] order), when collected.
    pub ttft_parts: Option<[Summary; crate::record::TTFT_PARTS]>,
}

impl Report {
    pub(crate) fn build(config: &SimConfig, c: &Collector<'_>, end_ms: f64) -> Report {
        let pools = config.topology.pools();
        let (prefill, decode) = match pools {
            [aggregated] => (None, aggregated),
            [prefill, decode] => (Some(prefill), decode),
            _ => unreachable!("a topology has one or two pools"),
        };
        Report {
            totals: c.totals,
            dist: Distributions {
                ttft: c.ttft.summary(),
                ttst: c.ttst.summary(),
                tpot: c.tpot.summary(),
                itl: c.itl.summary(),
                e2e: c.e2e.summary(),
                per_user: c.per_user.summary(),
            },
            end_ms,
            prefill_workers: prefill.map_or(0, |p| p.workers),
            prefill_gpus_per_worker: prefill.map_or(0, |p| p.deployment.gpus_per_worker()),
            decode_workers: decode.workers,
            decode_gpus_per_worker: decode.deployment.gpus_per_worker(),
            sla_set: config.sla.is_set(),
            speculative: pools.iter().any(|p| p.engine.speculative.is_some()),
            wall_time_ms: 0.0,
            shed: matches!(c.queue_limit().max, Some((_, crate::metrics::Overflow::Shed))).then_some(c.totals.shed),
            worker_seconds: None,
            ttft_parts: c.ttft_parts.as_ref().map(|p| std::array::from_fn(|i| p[i].summary())),
        }
    }

    /// `x` per second of simulated duration; `None` when the duration is 0 (no request
    /// produced a token after time 0, e.g. every `output_length` is 0), where a rate has no
    /// meaning. See [`Report::notes`].
    pub fn rate(&self, x: f64) -> Option<f64> {
        let d = self.totals.duration_ms;
        (d > 0.0).then(|| x / (d / 1000.0).max(1e-9))
    }

    /// Why some summary values are null (empty when none is).
    pub fn notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        if self.rate(0.0).is_none() {
            notes.push(
                "throughputs are null: the simulated duration is 0 ms (no output token was produced after \
                 time 0), so a rate over it is undefined"
                    .to_string(),
            );
        }
        notes
    }

    /// Tokens per decode forward (1 without speculative decoding).
    pub fn mean_accept_length(&self) -> f64 {
        let t = &self.totals;
        if t.decode_forwards == 0 {
            0.0
        } else {
            t.decode_tokens as f64 / t.decode_forwards as f64
        }
    }

    pub fn prefill_worker_seconds(&self) -> f64 {
        self.worker_seconds.map_or(self.prefill_workers as f64 * self.end_ms / 1000.0, |w| w.0)
    }

    pub fn decode_worker_seconds(&self) -> f64 {
        self.worker_seconds.map_or(self.decode_workers as f64 * self.end_ms / 1000.0, |w| w.1)
    }

    pub fn gpu_hours(&self) -> f64 {
        (self.prefill_worker_seconds() * self.prefill_gpus_per_worker as f64
            + self.decode_worker_seconds() * self.decode_gpus_per_worker as f64)
            / 3600.0
    }

    /// The summary object. Keys follow the reference; keys it lacks are servesim additions.
    pub fn summary_json(&self) -> Map<String, Value> {
        let t = &self.totals;
        let rate = |x: u64| json!(self.rate(x as f64));
        let mut m = Map::new();
        let mut put = |k: &str, v: Value| {
            m.insert(k.to_string(), v);
        };
        put("num_requests", json!(t.num_requests));
        put("completed_requests", json!(t.completed));
        put("rejected_requests", json!(t.rejected));
        put("incomplete_requests", json!(t.incomplete));
        if let Some(shed) = self.shed {
            put("shed_requests", json!(shed));
        }
        put("total_input_tokens", json!(t.input_tokens));
        put("total_output_tokens", json!(t.output_tokens));
        put("duration_ms", json!(t.duration_ms));
        put("wall_time_ms", json!(self.wall_time_ms));
        put("request_throughput_rps", rate(t.completed));
        put("input_throughput_tok_s", rate(t.input_tokens));
        put("output_throughput_tok_s", rate(t.output_tokens));
        put("total_throughput_tok_s", rate(t.input_tokens + t.output_tokens));
        put("prefill_worker_seconds", json!(self.prefill_worker_seconds()));
        put("decode_worker_seconds", json!(self.decode_worker_seconds()));
        put("prefill_gpus_per_worker", json!(self.prefill_gpus_per_worker));
        put("decode_gpus_per_worker", json!(self.decode_gpus_per_worker));
        put("gpu_hours", json!(self.gpu_hours()));
        if self.sla_set {
            put("goodput_completed_requests", json!(t.good_requests));
            put("goodput_request_throughput_rps", rate(t.good_requests));
            put("goodput_output_throughput_tok_s", rate(t.good_output_tokens));
        }
        let processed = t.input_tokens + t.output_tokens;
        let wall_s = self.wall_time_ms / 1000.0;
        let per_wall = |x: u64| if wall_s > 0.0 { x as f64 / wall_s } else { 0.0 };
        put("processed_tokens", json!(processed));
        put("processed_tokens_per_s", json!(per_wall(processed)));
        put("processed_output_tokens_per_s", json!(per_wall(t.output_tokens)));
        let ratio = |x: u64| {
            if t.input_tokens > 0 {
                x as f64 / t.input_tokens as f64
            } else {
                0.0
            }
        };
        put("prefix_cache_reused_ratio", json!(ratio(t.reused_tokens)));
        put("first_admission_prefix_cache_reused_ratio", json!(ratio(t.first_admission_reused_tokens)));
        put("committed_prefill_tokens", json!(t.prefill_tokens));
        put("num_preemptions", json!(t.preemptions));
        if let Some(h) = &t.host_offload {
            // servesim's own host-offload counters, under names the reference does not use.
            put("host_offload_hit_tokens", json!(h.hit_tokens));
            put("host_offload_stores", json!(h.stores));
            put("host_offload_d2h_bytes", json!(h.d2h_bytes));
            put("host_offload_loads", json!(h.loads));
            put("host_offload_h2d_bytes", json!(h.h2d_bytes));
            put("host_offload_loads_cancelled", json!(h.loads_cancelled));
            put("host_offload_evicted_blocks", json!(h.evicted_blocks));
            put("host_offload_capacity_retries", json!(h.capacity_retries));
            if let Some(g3) = &h.g3 {
                // Dynamo's own section, under its names.
                put("g3_offload", g3_json(g3));
            }
            if let Some((capacity, resident, used)) = h.g2_domain {
                put(
                    "g2_domains",
                    json!([{"capacity_blocks": capacity, "resident_blocks": resident, "used_blocks": used}]),
                );
            }
        }
        if self.speculative {
            put("decode_forwards", json!(t.decode_forwards));
            put("mean_accept_length", json!(self.mean_accept_length()));
        }
        put("num_ttft_samples", json!(self.dist.ttft.count));
        put("num_tpot_samples", json!(self.dist.tpot.count));
        put("num_e2e_latency_samples", json!(self.dist.e2e.count));
        for (name, s) in [
            ("ttft", &self.dist.ttft),
            ("ttst", &self.dist.ttst),
            ("tpot", &self.dist.tpot),
            ("itl", &self.dist.itl),
            ("e2e_latency", &self.dist.e2e),
        ] {
            for (stat, v) in s.fields() {
                put(&format!("{stat}_{name}_ms"), json!(v));
            }
        }
        for (stat, v) in self.dist.per_user.fields() {
            put(&format!("{stat}_output_token_throughput_per_user"), json!(v));
        }
        if let Some(parts) = &self.ttft_parts {
            for (name, s) in TtftBreakdown::NAMES.iter().zip(parts) {
                put(&format!("mean_ttft_{name}_ms"), json!(s.mean));
                put(&format!("p90_ttft_{name}_ms"), json!(s.p90));
            }
        }
        let notes = self.notes();
        if !notes.is_empty() {
            put("notes", json!(notes));
        }
        m
    }
}

/// Keys whose values depend on the host, not on the simulation.
pub const WALL_CLOCK_KEYS: [&str; 3] = ["wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s"];

fn pool_name(stage: Role) -> &'static str {
    match stage {
        Role::Aggregated => "agg",
        Role::Prefill => "prefill",
        Role::Decode => "decode",
    }
}

/// A per-request record with its `ttft_breakdown_ms` (null without a first token) appended.
pub fn request_json_with_breakdown(r: &RequestRecord) -> Value {
    let mut v = request_json(r);
    let parts = r.ttft_breakdown_ms().map(|b| {
        let mut m = Map::new();
        for (name, x) in TtftBreakdown::NAMES.iter().zip(b.parts()) {
            m.insert(name.to_string(), json!(x));
        }
        Value::Object(m)
    });
    if let Value::Object(m) = &mut v {
        m.insert("ttft_breakdown_ms".into(), parts.unwrap_or(Value::Null));
    }
    v
}

/// One per-request record, with the reference's keys in the reference's order (agentic
/// requests start with their ids); servesim's own keys follow `terminal_status`.
pub fn request_json(r: &RequestRecord) -> Value {
    let mut m = Map::new();
    let mut put = |k: &str, v: Value| {
        m.insert(k.to_string(), v);
    };
    let agentic = r.meta.as_ref().and_then(|m| m.agentic.as_ref());
    if let Some(a) = agentic {
        // A snapshot's request is `{play_id}:request:{the trace's id}`; the top-level id is the
        // trace's, as in the reference (the full one is under `agentic`).
        let trace_id = a.request_id.strip_prefix(&*a.play_id).and_then(|s| s.strip_prefix(":request:"));
        put("request_id", json!(trace_id.unwrap_or(&a.request_id)));
        put("play_id", json!(&*a.play_id));
        put("session_id", json!(r.session.as_deref()));
        put("turn_index", Value::Null);
        let mut ids = Map::new();
        ids.insert("request_id".into(), json!(&*a.request_id));
        ids.insert("play_id".into(), json!(&*a.play_id));
        ids.insert("conversation_id".into(), json!(&*a.conversation_id));
        if let Some(lane) = a.lane {
            // A snapshot play (one per lane) and the prefix cache it warms.
            ids.insert("lane_id".into(), json!(format!("lane:{lane}")));
            ids.insert("cache_id".into(), json!(format!("{}:cache", a.play_id)));
        }
        ids.insert("root_id".into(), json!(a.root_id.as_deref()));
        if let Some(p) = &a.parent_id {
            ids.insert("parent_id".into(), json!(&**p));
        }
        put("agentic", Value::Object(ids));
        if r.warmed_profile {
            put("agentic_phase", json!("profile"));
        }
        put("uuid", json!(format!("00000000-0000-0000-0000-{:012x}", a.node as u64 + 1)));
    } else {
        put("session_id", json!(r.session.as_deref()));
        put("turn_index", if r.session.is_some() { json!(r.turn) } else { Value::Null });
        put("uuid", json!(format!("00000000-0000-0000-0000-{:012x}", r.ordinal + 1)));
    }
    put("arrival_time_ms", json!(r.arrival_ms));
    put("dispatched_at_ms", if agentic.is_some() { json!(r.arrival_ms) } else { Value::Null });
    put("first_admit_ms", json!(r.first_admit_ms));
    put("terminal_time_ms", json!(r.terminal_ms));
    put("first_token_ms", json!(r.first_token_ms));
    put("last_token_ms", json!(r.last_token_ms));
    put("ttft_ms", json!(r.ttft_ms()));
    put("ttst_ms", json!(r.ttst_ms()));
    put("e2e_latency_ms", json!(r.e2e_ms()));
    put("itl_ms", json!(r.tpot_ms()));
    put("input_length", json!(r.input_length));
    put("requested_output_length", json!(r.requested_output_length));
    put("output_length", json!(r.output_length));
    put("reused_input_tokens", json!(r.reused_input_tokens));
    // The workers' ranks in flat numbering (`worker × dp + dp_rank`), as the reference writes
    // them; the last placement of each side counts.
    let scheduler = |side: &[Role]| r.routing.iter().rev().find(|p| side.contains(&p.pool)).map(|p| p.scheduler);
    put("prefill_worker_idx", json!(r.prefill_worker.and(scheduler(&[Role::Prefill]))));
    // A failed handoff never reached its decode worker.
    let decoded = !matches!(r.status, Status::Failed(_));
    put(
        "decode_worker_idx",
        json!(r.decode_worker.filter(|_| decoded).and(scheduler(&[Role::Aggregated, Role::Decode]))),
    );
    let h = r.handoff.as_ref();
    put("prefill_admit_ms", if h.is_some() { json!(r.first_admit_ms) } else { Value::Null });
    put("source_held_ms", json!(h.and_then(|h| h.source_held_ms)));
    put("destination_reserved_ms", json!(h.and_then(|h| h.destination_reserved_ms)));
    put("destination_activated_ms", json!(h.and_then(|h| h.destination_activated_ms)));
    put("decode_admit_ms", json!(h.and_then(|h| h.decode_admit_ms)));
    put("source_released_ms", json!(h.and_then(|h| h.source_released_ms)));
    put("decode_reused_input_tokens", json!(h.and_then(|h| h.decode_reused_input_tokens)));
    put("prefill_route_overlap_tokens", if h.is_some() { json!(r.route_overlap_tokens) } else { Value::Null });
    put("decode_route_overlap_tokens", json!(h.and_then(|h| h.decode_route_overlap_tokens)));
    let routing: Vec<Value> = r
        .routing
        .iter()
        .map(|p| {
            json!({
                "pool": pool_name(p.pool),
                "outcome": if p.queued_at_ms.is_some() { "queued" } else { "immediate" },
                "queue_entered_at_ms": p.queued_at_ms,
                "released_at_ms": p.queued_at_ms.map(|_| p.placed_at_ms),
                "queue_wait_ms": p.queued_at_ms.map_or(0.0, |q| p.placed_at_ms - q),
                "logical_worker_id": p.worker,
                "scheduler_id": p.scheduler,
                "dp_rank": p.dp_rank,
                "reported_overlap_tokens": p.overlap_tokens,
                "selected_overlap_blocks": p.overlap_blocks.map(|o| o.0),
                "best_available_overlap_blocks": p.overlap_blocks.map(|o| o.1),
                "overlap_regret_blocks": p.overlap_blocks.map(|o| o.1 - o.0),
                "placement_replica_id": Value::Null,
            })
        })
        .collect();
    put("routing_history", Value::Array(routing));
    let admissions: Vec<Value> = r
        .admission_history
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let mut entry = json!({
                "admission_ordinal": i,
                "pool_admission_ordinal": a.pool_ordinal,
                "pool": pool_name(a.pool),
                "at_ms": a.at_ms,
                "reused_input_tokens": a.reused_tokens,
            });
            if let (Some((g1, host)), Some(map)) = (a.tiers, entry.as_object_mut()) {
                map.insert("g1_reused_input_tokens".into(), json!(g1));
                map.insert("host_reused_input_tokens".into(), json!(host));
            }
            entry["is_readmission"] = json!(a.pool_ordinal > 0);
            entry
        })
        .collect();
    put("admission_history", Value::Array(admissions));
    put("admission_count", json!(r.admissions));
    // Admissions after a pool's first one (a disaggregated request's decode admission is its
    // decode pool's first, not a readmission).
    put("readmission_count", json!(r.admission_history.iter().filter(|a| a.pool_ordinal > 0).count()));
    put("pressure_record_ordinals", json!([]));
    put("terminal_status", json!(r.status.name()));
    if let Status::Rejected(reason) | Status::Failed(reason) = r.status {
        put("rejection_reason", json!(reason.describe()));
    }
    put("first_admission_reused_input_tokens", json!(r.first_admission_reused_input_tokens));
    if let Some((g1, host)) = r.first_admission_tiers {
        // Only with host offload, as in the reference.
        put("first_admission_g1_reused_input_tokens", json!(g1));
        put("first_admission_host_reused_input_tokens", json!(host));
    }
    if let Some(done) = r.frontend_done_ms {
        // When the request left SGLang's frontend stages, or the tokenizer (the reference's keys).
        put(if r.frontend_staged { "frontend_ready_ms" } else { "tokenized_ms" }, json!(done));
    }
    if let Some(ready) = r.encoder_ready_ms {
        put("encoder_ready_ms", json!(ready));
    }
    if let Some(received) = r.scheduler_received_ms {
        // SGLang's host loop (the reference's keys); it selects a request for a batch when it
        // admits it.
        put("scheduler_received_ms", json!(received));
        put("selected_ms", json!(r.first_admit_ms));
        put("prefill_complete_ms", json!(r.prefill_complete_ms()));
    }
    put("dp_rank", json!(r.dp_rank));
    put("route_overlap_tokens", json!(r.route_overlap_tokens));
    put("queue_wait_ms", json!(r.queue_wait_ms));
    Value::Object(m)
}

/// A G3 summary as Dynamo 1.6.1's replay report writes it (`bypassed_restores` only when some
/// request gave up restoring).
fn g3_json(g: &servesim_engine::offload::G3Stats) -> Value {
    let io = |io: &servesim_engine::offload::G3IoStats| {
        json!({
            "submitted_jobs": io.submitted_jobs,
            "completed_jobs": io.completed_jobs,
            "cancelled_jobs": io.cancelled_jobs,
            "completed_bytes": io.completed_bytes,
            "transfer_ms": io.transfer_ms,
        })
    };
    let mut v = json!({
        "lookup_probes": g.lookup_probes,
        "lookup_hits": g.lookup_hits,
        "lookup_pending": g.lookup_pending,
        "read": io(&g.read),
        "write": io(&g.write),
        "evictions": g.evictions,
        "cross_worker_read_blocks": g.cross_worker_read_blocks,
        "resident_blocks": g.resident_blocks,
        "pending_blocks": g.pending_blocks,
    });
    if g.bypassed_restores > 0 {
        v["bypassed_restores"] = json!(g.bypassed_restores);
    }
    v
}

/// Summary keys the workload adds to the report (agentic runs: trajectories, graph, plays).
/// Complete once the run that replayed it has finished.
pub fn workload_keys(workload: &Workload) -> Map<String, Value> {
    match workload {
        Workload::Graph(g) => agentic_keys(g),
        _ => Map::new(),
    }
}

/// The summary keys agentic runs add, after the standard ones (the reference's names).
fn agentic_keys(g: &AgenticGraph) -> Map<String, Value> {
    let mut m = Map::new();
    let outcome = g.outcome.lock().ok().and_then(|o| o.clone()).unwrap_or_default();
    let mut samples = Samples::with_limit(usize::MAX);
    for &v in &outcome.trajectory_e2e_ms {
        samples.add(v);
    }
    let s = samples.summary();
    let mut e2e: Vec<(&str, Value)> = s.fields().iter().map(|&(k, v)| (k, json!(v))).collect();
    e2e.push(("p50", json!(s.median)));
    // A continuous profile adds plays as it runs: the outcome has them all.
    let total = outcome.plays.len().max(g.plays.len());
    m.insert("total_trajectories".into(), json!(total));
    m.insert("completed_trajectories".into(), json!(outcome.trajectory_e2e_ms.len()));
    m.insert("incomplete_trajectories".into(), json!(total - outcome.trajectory_e2e_ms.len()));
    for (stat, v) in e2e {
        m.insert(format!("{stat}_trajectory_e2e_latency_ms"), v);
    }
    let models = g.source_models();
    m.insert(
        "agentic_graph".into(),
        json!({
            "source": {"format": g.source.format, "digest": g.source.digest},
            "graph_digest": g.graph_digest,
            "block_size": g.block_tokens,
            "node_count": g.snapshot.as_ref().map_or(g.nodes.len(), |s| s.source_nodes),
            "play_count": g.snapshot.as_ref().map_or(g.plays.len(), |s| s.source_plays),
            "source_models": models,
        }),
    );
    m.insert("agentic_lifecycle_event_count".into(), json!(outcome.lifecycle_events));
    m.insert("agentic_lifecycle_digest".into(), json!(outcome.lifecycle_digest));
    let plays: Vec<Value> = outcome
        .plays
        .iter()
        .map(|p| {
            let mut o = Map::new();
            o.insert("play_id".into(), json!(p.play_id));
            o.insert("status".into(), json!(p.status));
            if let Some(t) = p.causal_terminal_ms {
                o.insert("causal_terminal_ms".into(), json!(t));
            }
            if let Some(t) = p.settled_at_ms {
                o.insert("settled_at_ms".into(), json!(t));
            }
            if let Some(r) = &p.failure_request_id {
                o.insert("failure_request_id".into(), json!(r));
            }
            if let Some(s) = &p.failure_status {
                o.insert("failure_status".into(), json!(s));
            }
            Value::Object(o)
        })
        .collect();
    m.insert("agentic_play_outcomes".into(), Value::Array(plays));
    if let Some(phases) = &outcome.phases {
        m.insert("agentic_phases".into(), phases.json.clone());
    }
    if let Some(profile) = &outcome.profile {
        m.insert("agentic_profile".into(), profile.clone());
    }
    if let Some(basis) = g.weka_basis {
        m.insert("weka_nested_timestamp_basis".into(), json!(basis));
    }
    if let Some(target) = &g.execution_model {
        m.insert(
            "agentic_model_projection".into(),
            json!({
                "policy": "project_to_configured_target",
                "source_models": models,
                "target_model": target,
            }),
        );
    }
    m
}
