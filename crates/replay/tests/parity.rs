//! Parity with the reference implementation (NVIDIA Dynamo 1.6.1's offline replay).
//!
//! Each `tests/parity/<case>.json` describes a run in the format of
//! `../shared/parity/dynamo_replay.py`; `<case>.golden.json` is the reference's summary for it,
//! recorded with `scripts/parity.py tests/parity/<case>.json --record`. A case fails when
//! `completed_requests` differs, when one of the headline metrics drifts beyond 2 %, or
//! when any other summary value differs beyond floating-point noise.

use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};
use servesim_engine::{ConfigEnv, WorkerArgs};
use servesim_replay::{simulate, Collector, RouterMode, SimConfig, Sla, Topology, WALL_CLOCK_KEYS};
use servesim_router::{PolicyConfig, RouterConfig};
use servesim_workload::formats::WekaBasis;
use servesim_workload::{
    load_mooncake, load_trace, Arrivals, LoadMode, SyntheticSpec, TraceFormat, TraceOptions, Workload,
};

const HEADLINE: [&str; 9] = [
    "duration_ms",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p90_ttft_ms",
    "p99_ttft_ms",
    "mean_itl_ms",
    "median_e2e_latency_ms",
    "p99_e2e_latency_ms",
    "prefix_cache_reused_ratio",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// An engine's arguments; a profile NPZ it names (Dynamo's `dynamo_profile` timing) is read
/// relative to the case file, as `scripts/parity.py` passes it to the reference.
fn worker_args(engine: Option<&Value>, dp_size: Option<&Value>) -> WorkerArgs {
    let mut v = json!({ "engine": engine.cloned().unwrap_or(json!({})) });
    if let Some(dp) = dp_size {
        v["dp_size"] = dp.clone();
    }
    let dir = root().join("tests/parity");
    let files = |p: &str| std::fs::read(dir.join(p)).map_err(|e| format!("{p}: {e}"));
    WorkerArgs::from_value_env(&v, ConfigEnv { files: &files, ..ConfigEnv::NONE }).expect("engine config")
}

fn run_case(name: &str, case: &Value, case_dir: &Path, router_seed: u64) -> Map<String, Value> {
    let count = |k: &str| case.get(k).and_then(Value::as_u64).unwrap_or(1) as u32;
    let cluster = if case.get("prefill_engine").is_some() || case.get("decode_engine").is_some() {
        Topology::disaggregated(
            (worker_args(case.get("prefill_engine"), case.get("prefill_dp_size")), count("num_prefill_workers")),
            (worker_args(case.get("decode_engine"), case.get("decode_dp_size")), count("num_decode_workers")),
        )
    } else {
        Topology::aggregated(worker_args(case.get("engine"), case.get("dp_size")), count("num_workers"))
    }
    .expect("cluster");
    let block_size = cluster.block_size();
    let f = |k: &str| case.get(k).and_then(Value::as_f64);
    let concurrency = case.get("replay_concurrency").and_then(Value::as_u64).map(|c| c as u32);
    let (workload, load) = if let Some(traces) = case.get("traces").and_then(Value::as_array) {
        // Trace formats: `"traces"`, `"trace_format"`, `"trace_block_size"` (null: the
        // format's own), and the agentic options.
        let shared = root().join("../shared");
        let paths: Vec<PathBuf> = traces
            .iter()
            .map(|t| {
                let t = t.as_str().expect("trace paths are strings");
                let p = if t.contains("${SHARED}") {
                    PathBuf::from(t.replace("${SHARED}", &shared.to_string_lossy()))
                } else {
                    case_dir.join(t)
                };
                assert!(p.exists(), "{} is missing: parity cases need ../shared beside the checkout", p.display());
                p
            })
            .collect();
        let format = TraceFormat::parse(case.get("trace_format").and_then(Value::as_str).unwrap_or("mooncake"))
            .expect("trace format");
        let options = TraceOptions {
            trace_block_size: match case.get("trace_block_size") {
                None => Some(512),
                Some(v) => v.as_u64().map(|b| b as u32),
            },
            arrival_speedup_ratio: f("arrival_speedup_ratio").unwrap_or(1.0),
            replay_concurrency: concurrency,
            agentic_lanes: case.get("agentic_lanes").and_then(Value::as_u64).map(|n| n as u32),
            execution_model: case.get("execution_model").and_then(Value::as_str).map(String::from),
            shared_prefix_ratio: f("trace_shared_prefix_ratio").unwrap_or(0.0),
            num_prefix_groups: case.get("trace_num_prefix_groups").and_then(Value::as_u64).unwrap_or(0) as u32,
            weka_basis: case.get("weka_nested_timestamp_basis").and_then(Value::as_str).map(|b| match b {
                "absolute" => WekaBasis::Absolute,
                "relative" => WekaBasis::Relative,
                _ => WekaBasis::Auto,
            }),
            ..TraceOptions::new(format)
        };
        load_trace(&paths, &options).expect("trace")
    } else if let Some(trace) = case.get("trace").and_then(Value::as_str) {
        let shared = root().join("../shared");
        let path = if trace.contains("${SHARED}") {
            let p = PathBuf::from(trace.replace("${SHARED}", &shared.to_string_lossy()));
            assert!(p.exists(), "{} is missing: parity cases need ../shared beside the checkout", p.display());
            p
        } else {
            case_dir.join(trace)
        };
        // `"trace_lines": N` replays the first N lines of the trace.
        let path = match case.get("trace_lines").and_then(Value::as_u64) {
            Some(n) => {
                let text = std::fs::read_to_string(&path).expect("trace");
                let cut: String = text.lines().take(n as usize).map(|l| format!("{l}\n")).collect();
                let dir = root().join("target/parity-cuts");
                std::fs::create_dir_all(&dir).expect("create target/parity-cuts");
                let file = dir.join(format!("{name}.jsonl"));
                std::fs::write(&file, cut).expect("write trace cut");
                file
            }
            None => path,
        };
        let tbs = case.get("trace_block_size").and_then(Value::as_u64).unwrap_or(512) as u32;
        let load = match concurrency {
            Some(c) => LoadMode::Concurrency { max_sessions: c },
            None => LoadMode::Timestamps { speedup: f("arrival_speedup_ratio").unwrap_or(1.0) },
        };
        (load_mooncake(&[path], tbs).expect("trace"), load)
    } else {
        let s = &case["synthetic"];
        let g = |k: &str| s.get(k).and_then(Value::as_f64);
        let arrivals = match (g("request_rate"), g("arrival_interval_ms")) {
            (Some(r), _) => Arrivals::Poisson { rate_per_s: r },
            (_, Some(ms)) => Arrivals::Interval { interval_ms: ms },
            _ => Arrivals::AllAtOnce,
        };
        let spec = SyntheticSpec {
            input_tokens: g("input_tokens").unwrap() as u32,
            output_tokens: g("output_tokens").unwrap() as u32,
            sessions: g("request_count").unwrap() as u32,
            turns_per_session: g("turns_per_session").unwrap_or(1.0) as u32,
            arrivals,
            seed: g("arrival_seed").unwrap_or(42.0) as u64,
            shared_prefix_ratio: g("shared_prefix_ratio").unwrap_or(0.0),
            num_prefix_groups: g("num_prefix_groups").unwrap_or(0.0) as u32,
            inter_turn_delay_ms: g("inter_turn_delay_ms").unwrap_or(0.0),
            block_tokens: block_size,
            group_seed: servesim_workload::GROUP_SEED,
            cached_prefix_tokens: 0,
            accumulate: false,
            images: None,
        };
        let load = match concurrency {
            Some(c) => LoadMode::Concurrency { max_sessions: c },
            None => LoadMode::Timestamps { speedup: 1.0 },
        };
        (Workload::Synthetic(spec), load)
    };
    let router = match case.get("router_mode").and_then(Value::as_str) {
        Some("kv_router") => {
            let mut rc =
                case.get("router_config").map_or_else(RouterConfig::default, |c| RouterConfig::from_value(c).unwrap());
            // A router policy file is relative to the case; `model_name` picks its profile.
            if let Some(file) = &rc.policy_config_path {
                let text = std::fs::read_to_string(case_dir.join(file)).unwrap();
                let policies = PolicyConfig::from_yaml(&text).unwrap();
                rc.policy_profile =
                    policies.profile(case.get("model_name").and_then(Value::as_str)).cloned().map(std::sync::Arc::new);
            }
            RouterMode::KvRouter(rc)
        }
        _ => RouterMode::RoundRobin,
    };
    let config = SimConfig {
        topology: cluster,
        router,
        prefill_load_estimator: None,
        router_seed,
        kv_event_lag_ms: f("kv_event_lag_ms").unwrap_or(0.0),
        load,
        sla: Sla { ttft_ms: f("sla_ttft_ms"), itl_ms: f("sla_itl_ms"), e2e_ms: f("sla_e2e_ms") },
        seed: 42,
        fast_forward: true,
        split_workers: true,
        threads: 0,
        timing_jitter_cv: 0.0,
        tokenization: None,
        frontend_stages: Vec::new(),
        encoder_pool: None,
    };
    let mut summary =
        simulate(&workload, &config, Collector::new(config.sla, None), &mut ()).expect("simulation").summary_json();
    summary.extend(servesim_replay::workload_keys(&workload));
    summary
}

/// The numbers of a nested JSON object, by dotted path.
fn numeric_leaves(path: &str, v: &Value, out: &mut Vec<(String, f64)>) {
    match v {
        Value::Object(m) => m.iter().for_each(|(k, v)| numeric_leaves(&format!("{path}.{k}"), v, out)),
        v => out.extend(v.as_f64().map(|x| (path.to_string(), x))),
    }
}

/// The median as `statistics.median` takes it (the mean of the middle two of an even count).
fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

fn check(name: &str) {
    let dir = root().join("tests/parity");
    let case: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(format!("{name}.json"))).unwrap()).unwrap();
    let golden: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(format!("{name}.golden.json"))).unwrap()).unwrap();
    // A case whose reference is random lists its own tolerances against the median of several
    // reference runs; a deterministic one gets the headline 2 % and, for everything else, noise.
    // With `"seeds": n` servesim's side is the median over router seeds 42..42+n too.
    let random = case.get("check").and_then(|c| c.get("tolerances")).and_then(Value::as_object);
    let tolerances: Vec<(String, f64)> = match random {
        Some(t) => t.iter().map(|(k, v)| (k.clone(), v.as_f64().unwrap())).collect(),
        None => HEADLINE.iter().map(|k| (k.to_string(), 0.02)).collect(),
    };
    let seeds = case.pointer("/check/seeds").and_then(Value::as_u64).unwrap_or(1);
    let runs: Vec<_> = (0..seeds).map(|k| run_case(name, &case, &dir, 42 + k)).collect();
    let mut ours = runs[0].clone();
    for (key, _) in &tolerances {
        let mut xs: Vec<f64> = runs.iter().map(|r| r[key].as_f64().unwrap()).collect();
        ours.insert(key.clone(), Value::from(median(&mut xs)));
    }
    let mut problems = Vec::new();
    for run in &runs {
        assert_eq!(run["completed_requests"], golden["completed_requests"], "{name}: completed_requests");
    }
    for (key, limit) in &tolerances {
        let (a, b) = (ours[key].as_f64().unwrap(), golden[key].as_f64().unwrap());
        let dev = if b != 0.0 { ((a - b) / b).abs() } else { a.abs() };
        if dev > *limit {
            problems.push(format!(
                "{key}: servesim {a} vs reference {b} ({:.2}% off, limit {:.0}%)",
                dev * 100.0,
                limit * 100.0
            ));
        }
    }
    if random.is_none() {
        // Everything else we report under a reference name must agree to floating-point noise.
        for (key, want) in golden.as_object().unwrap() {
            let (Some(want), Some(got)) = (want.as_f64(), ours.get(key).and_then(Value::as_f64)) else { continue };
            if WALL_CLOCK_KEYS.contains(&key.as_str()) {
                continue;
            }
            if (got - want).abs() > 1e-9_f64.max(1e-6 * want.abs()) {
                problems.push(format!("{key}: servesim {got} vs reference {want}"));
            }
        }
        // Host reuse of first admissions (Dynamo's cache-tier record) and a shared pool's final
        // occupancy.
        if let Some(want) = golden.pointer("/x_cache_tiers/host_reused_input_tokens") {
            if ours.get("host_offload_hit_tokens") != Some(want) {
                problems.push(format!(
                    "host_offload_hit_tokens: servesim {:?} vs reference host_reused_input_tokens {want}",
                    ours.get("host_offload_hit_tokens")
                ));
            }
        }
        if let Some(want) = golden.get("g2_domains") {
            if ours.get("g2_domains") != Some(want) {
                problems.push(format!("g2_domains: servesim {:?} vs reference {want}", ours.get("g2_domains")));
            }
        }
        // Dynamo's nested G3 section: every counter, and the sums of transfer times.
        if let Some(want) = golden.get("g3_offload") {
            let mut leaves = Vec::new();
            numeric_leaves("g3_offload", want, &mut leaves);
            for (path, want) in leaves {
                let mut keys = path.split('.');
                let first = ours.get(keys.next().unwrap());
                let got = keys.fold(first, |v, k| v.and_then(|v| v.get(k)));
                match got.and_then(|v| v.as_f64()) {
                    Some(got) if (got - want).abs() <= 1e-9_f64.max(1e-6 * want.abs()) => {}
                    got => problems.push(format!("{path}: servesim {got:?} vs reference {want}")),
                }
            }
        }
    }
    // Agentic runs: the graph's identity and every play's outcome are exact.
    if let Some(graph) = golden.get("agentic_graph") {
        for key in ["graph_digest", "node_count", "play_count", "source_models", "block_size", "source"] {
            if ours["agentic_graph"][key] != graph[key] {
                problems.push(format!("agentic_graph.{key}: {} vs {}", ours["agentic_graph"][key], graph[key]));
            }
        }
        let statuses = |v: &Value| -> Vec<(Value, Value)> {
            v.as_array().map_or(Vec::new(), |a| a.iter().map(|p| (p["play_id"].clone(), p["status"].clone())).collect())
        };
        if statuses(&ours["agentic_play_outcomes"]) != statuses(&golden["agentic_play_outcomes"]) {
            problems.push("agentic_play_outcomes differ".into());
        }
        if ours["agentic_model_projection"] != golden["agentic_model_projection"] {
            problems.push("agentic_model_projection differs".into());
        }
        for key in ["agentic_lifecycle_event_count", "agentic_lifecycle_digest"] {
            if ours[key] != golden[key] {
                problems.push(format!("{key}: {} vs {}", ours[key], golden[key]));
            }
        }
    }
    assert!(problems.is_empty(), "{name} drifted from the reference:\n  {}", problems.join("\n  "));
}

macro_rules! parity_cases {
    ($($test:ident => $case:literal),* $(,)?) => {
        $(#[test] fn $test() { check($case); })*

        #[test]
        fn every_recorded_case_has_a_test() {
            let listed = [$($case),*];
            for entry in std::fs::read_dir(root().join("tests/parity")).unwrap() {
                let name = entry.unwrap().file_name().into_string().unwrap();
                if let Some(case) = name.strip_suffix(".golden.json") {
                    assert!(listed.contains(&case), "tests/parity/{name} has no test in parity.rs");
                }
            }
        }
    };
}

parity_cases! {
    conversation_trace_8_workers => "a_conversation_8w",
    synthetic_trace_4_workers => "b_synthetic_trace_4w",
    conversation_trace_heavy_preemption => "c_conversation_8w_2048_blocks",
    synthetic_poisson_2_workers => "d_synthetic_1024_128_20rps",
    closed_loop_trace => "e_conversation_concurrency_32",
    arrival_speedup_fifo_preemption_goodput => "f_synthetic_trace_speedup_sla",
    closed_loop_sessions_with_shared_prefixes => "g_sessions_shared_prefix_concurrency",
    fixed_interval_without_chunking_or_caching => "h_synthetic_interval_no_chunking",
    kv_router_conversation_trace => "i_conversation_kv_router_8w",
    disaggregated_kv_router => "j_synthetic_trace_disagg_2p4d_kv_router",
    kv_router_queue_and_legacy_weight => "k_synthetic_trace_router_queue",
    kv_router_policy_classes => "p_policy_classes",
    kv_router_policy_classes_model_profile => "p_policy_classes_model_profile",
    kv_router_queue_fcfs_priorities => "p_router_queue_fcfs_priorities",
    kv_router_queue_wspt => "p_router_queue_wspt",
    disaggregated_round_robin_with_transfer => "l_synthetic_trace_disagg_round_robin_transfer",
    trtllm_conversation_trace => "m_conversation_trtllm_8w",
    trtllm_synthetic_trace => "n_synthetic_trace_trtllm_4w",
    attention_data_parallel_2 => "o_conversation_dp2_4w",
    trtllm_under_memory_pressure => "p_synthetic_trace_trtllm_tight",
    sglang_conversation_trace => "q_conversation_sglang_8w",
    sglang_synthetic_trace => "r_synthetic_trace_sglang_4w",
    sglang_page_size_1 => "s_synthetic_trace_sglang_page1",
    sglang_lpm_under_pressure => "t_conversation_sglang_lpm_tight",
    speculative_decoding => "u_synthetic_trace_mtp",
    sglang_speculative_decoding => "v_synthetic_trace_sglang_mtp",
    sglang_disaggregated => "w_synthetic_trace_sglang_disagg",
    probe_fixed_timing => "probe_c1_fixed_timing",
    conversation_dynamo_profile_4_workers => "y_conversation_dynamo_profile_4w",
    synthetic_dynamo_profile_sglang => "y_synthetic_dynamo_profile_sglang",
    probe_token_stamps => "probe_c2_token_stamps",
    probe_polynomial_timing => "probe_c3_polynomial",
    probe_chunked_prefill => "probe_c4_chunked_prefill",
    probe_integer_means => "probe_integer_means",
    probe_same_pass_hit => "probe_same_pass_hit",
    probe_sessions_and_zero_output => "probe_sessions_zero_output",
    probe_preemption_12_blocks => "probe_preemption_12_blocks",
    probe_preemption_14_blocks => "probe_preemption_14_blocks",
    probe_synthetic_shared_prefix => "probe_synthetic_shared_prefix",
    probe_synthetic_turns => "probe_synthetic_turns",
    probe_synthetic_prefix_groups => "probe_synthetic_prefix_groups",
    probe_disagg_transfer_full_prompt => "probe_disagg_transfer_full_prompt",
    probe_disagg_destination_missing => "probe_disagg_destination_missing",
    probe_sglang_token_stamps_page16 => "probe_sglang_token_stamps_page16",
    probe_sglang_token_stamps_page1 => "probe_sglang_token_stamps_page1",
    probe_sglang_polynomial => "probe_sglang_polynomial",
    probe_sglang_chunked_prefill => "probe_sglang_chunked_prefill",
    probe_trtllm_token_stamps => "probe_trtllm_token_stamps",
    // Minimal cases of the differential fuzzer's findings (../shared/reference/fidelity-findings.md).
    sglang_retraction_requeues_at_the_back => "x_sglang_retraction_conv26",
    sglang_retraction_without_prefix_cache => "x_sglang_retraction_no_cache",
    sglang_retraction_tiny_prompts => "x_sglang_retraction_tiny_prompts",
    sglang_lru_follows_operation_order => "x_sglang_lru_operation_order",
    sglang_attention_dp_normalisation => "x_sglang_attention_dp2",
    sglang_conservativeness_above_1 => "x_sglang_conservativeness_above_1",
    synthetic_prefix_groups_ignore_arrival_seed => "x_synthetic_groups_ignore_arrival_seed",
    vllm_fifo_preemption_skips_a_request => "x_vllm_fifo_preemption_8",
    disaggregated_prefill_waits_for_released_kv => "x_disagg_tight_prefill_waits",
    disaggregated_reservations_one_per_pass => "x_disagg_decode_pressure_reservations",
    sglang_idle_decode_worker_reserves_at_each_empty_pass => "x_sglang_disagg_idle_decode_reserves_each_pass",
    trtllm_mtp_keeps_the_whole_prefix_hit => "x_trtllm_mtp_whole_prefix_hit",
    vllm_disaggregated_mtp_burst_victim_keeps_its_prefill => "x_vllm_disagg_mtp_burst_victim_keeps_prefill",
    sglang_disaggregated_activation_frees_duplicate_pages => "x_sglang_disagg_activation_frees_duplicates",
    // Every trace format: the examples of ../shared/reference/traces.md, and traces made by
    // `scripts/gen_traces.py <format> --requests 300 --seed 11` (in tests/parity/gen).
    format_mooncake_example => "fmt_mooncake_basic",
    format_mooncake_sessions_example => "fmt_mooncake_sessions",
    format_mooncake_delta_example => "fmt_mooncake_delta",
    format_agentic_mooncake_example => "fmt_agentic_v2",
    format_agentic_mooncake_example_one_lane => "fmt_agentic_v2_lanes1",
    format_dynamo_standard_example => "fmt_dynamo_standard",
    format_dynamo_agentic_example => "fmt_dynamo_agentic",
    format_weka_example => "fmt_weka",
    format_applied_compute_agentic_example => "fmt_applied",
    format_mooncake_generated => "fmt_gen_mooncake",
    format_mooncake_delta_generated => "fmt_gen_mooncake_delta",
    format_applied_compute_agentic_generated => "fmt_gen_applied",
    format_agentic_mooncake_generated => "fmt_gen_agentic_mooncake",
    format_agentic_mooncake_generated_four_lanes => "fmt_gen_agentic_mooncake_lanes",
    format_dynamo_standard_generated => "fmt_gen_dynamo",
    format_dynamo_agentic_generated_three_lanes => "fmt_gen_dynamo_agentic",
    format_weka_generated => "fmt_gen_weka",
    disagg_followup_turn_misses_the_passes_starting_at_its_arrival => "x_disagg_followup_misses_passes",
    trtllm_disagg_speedup_rounds_pass_times_twice => "x_trtllm_disagg_speedup_rounds_twice",
    kv_router_queue_release_edges => "x_kv_queue_release_edges",
    disaggregated_data_parallel_sessions => "x_disagg_dp_sessions_2p2d",
    disaggregated_data_parallel_sglang_under_pressure => "x_disagg_dp_sglang_1p2d",
    disaggregated_data_parallel_trace => "x_disagg_dp_trace_1p3d",
    sglang_decode_rank_waits_for_reserved_pages => "x_disagg_sglang_dp_decode_waits_for_room",
    host_offload_h2d_load_after_device_eviction => "offload_fixed_h2d_load",
    host_offload_d2h_fences_reused_device_blocks => "offload_fixed_d2h_fence",
    host_offload_session_turns_hit_the_host => "offload_sessions_host_hits",
    host_offload_h2d_bandwidth_bound => "offload_sessions_h2d_bound",
    host_offload_lru_eviction => "offload_sessions_host_lru",
    // The same trace with its hash ids renumbered: the reference numbers ids in first-seen order
    // before hashing, and the host LRU breaks ties by block hash, so verbatim ids evict other
    // blocks (median TTFT 7 % off).
    host_offload_lru_eviction_renumbered_ids => "offload_sessions_host_lru_renumbered",
    host_offload_chunked_prefill_small_budget => "offload_chunked_small_budget",
    host_offload_preemption_under_pressure => "offload_preemption_pressure",
    host_offload_kv_router_3_workers => "offload_kv_router_3w",
    host_offload_attention_dp_schedule_interval => "offload_dp2_schedule_interval4",
    host_offload_attention_dp_two_workers => "offload_dp2_2w_synthetic",
    host_offload_attention_dp_two_workers_sessions => "offload_dp2_2w_sessions",
    host_offload_attention_dp_kv_router => "offload_dp2_2w_kv_router",
    // The router scores host-resident blocks that continue a worker's device prefix (at
    // host_cache_hit_weight); without that, prefix reuse sits far below the reference's spread.
    host_offload_kv_router_scores_host_blocks => "offload_kv_router_host_tier",
    g3_offload_session_turns_promote_from_g3 => "g3_sessions_worker_local",
    g3_offload_tight_g3_evicts => "g3_sessions_tight",
    g3_offload_instant_lanes => "g3_sessions_instant",
    g3_offload_slow_lanes_and_latency => "g3_sessions_slow_lanes",
    g3_offload_two_workers_round_robin => "g3_2w_round_robin",
    // Behind the KV router (random ties): servesim's median over 20 router seeds against the
    // reference's over 20 runs. With 5 runs a side this case once looked high on reuse.
    g3_offload_kv_router_three_workers => "g3_kv_router_3w",
    host_offload_disaggregated_shared_pool_kv_router => "offload_disagg_shared_cross_kv_router",
    // One host pool for the deployment (`cluster_shared`): cross-worker host hits, held device
    // sources, processor-shared links under the pool's caps, attention DP, the KV router.
    host_offload_shared_pool_sessions_dp2 => "offload_shared_sessions_dp2",
    host_offload_shared_pool_cross_worker_hits => "offload_shared_cross_3w",
    host_offload_shared_pool_attention_dp => "offload_shared_cross_dp2",
    host_offload_shared_pool_slow_links => "offload_shared_cross_slow_links",
    host_offload_shared_pool_tight => "offload_shared_cross_tight",
    host_offload_shared_pool_two_workers => "offload_shared_tier_2w",
    host_offload_shared_pool_kv_router => "offload_shared_kv_router",
    host_offload_shared_pool_peer_store_pending => "offload_shared_peer_store_pending",
    // Synthetic prompts numbered as Dynamo numbers its ids (first seen first): the pool's LRU
    // breaks ties inside a completed store by block hash, so a later request keeps 2 of its
    // group's blocks in the host (128 host-reused tokens) only with the reference's tokens.
    host_offload_shared_pool_synthetic_first_seen_ids => "offload_shared_synthetic_ids",
    // Host offload on disaggregated workers: prefill and decode ranks with their own caches,
    // a decode rank that waits for a D2H copy before receiving KV into its blocks, and one
    // `cluster_shared` pool that both roles join.
    host_offload_disaggregated_prefill_side => "offload_disagg_prefill_host",
    host_offload_disaggregated_decode_side => "offload_disagg_decode_host",
    host_offload_disaggregated_decode_serves_arrived_kv_first => "offload_disagg_decode_pressure",
    host_offload_disaggregated_decode_waits_for_d2h_copies => "offload_disagg_decode_slow_d2h",
    host_offload_disaggregated_attention_dp => "offload_disagg_dp2_both",
    host_offload_disaggregated_private_caches_cross_trace => "offload_disagg_local_cross",
    host_offload_disaggregated_one_shared_pool => "offload_disagg_shared_cross",
    host_offload_disaggregated_shared_pool_prefill_only => "offload_disagg_shared_prefill_only",
    // One G3 pool for the deployment (`cluster_shared`) below private host caches.
    g3_offload_shared_pool_two_workers => "g3_shared_2w_round_robin",
    g3_offload_shared_pool_cross_worker_reads => "g3_shared_cross_3w",
    g3_offload_shared_pool_slow_links => "g3_shared_cross_slow_links",
    g3_offload_shared_pool_tight => "g3_shared_sessions_3w_tight",
    g3_offload_shared_pool_tight_cross_reads => "g3_shared_cross_3w_tight",
    // G3 below a `cluster_shared` host pool: one worker, three with worker-local G3, three with
    // both tiers shared.
    g3_offload_below_shared_host_one_worker => "g3_below_shared_host_1w",
    g3_offload_below_shared_host_worker_local => "g3_below_shared_host_local_3w",
    g3_offload_below_shared_host_both_shared => "g3_below_shared_host_shared_3w",
    // Prefill cadences: vLLM's `prefill_schedule_interval` (attention DP only; dp 1 is
    // unaffected) and SGLang's `prefill_decode_interval` (idle rounds, attention DP, retraction,
    // disaggregated sides).
    vllm_prefill_schedule_interval_attention_dp4_trace => "y_vllm_schedule_interval_3_dp4_trace",
    vllm_prefill_schedule_interval_shared_prefixes => "y_vllm_schedule_interval_4_dp2_shared_prefix",
    vllm_prefill_schedule_interval_without_attention_dp => "y_vllm_schedule_interval_4_dp1_no_effect",
    sglang_prefill_decode_interval_attention_dp2_trace => "y_sglang_decode_interval_2_dp2_trace",
    sglang_prefill_decode_interval_idle_gaps => "y_sglang_decode_interval_3_idle_gaps",
    sglang_prefill_decode_interval_tight_kv => "y_sglang_decode_interval_2_tight_kv",
    sglang_prefill_decode_interval_disaggregated_dp2 => "y_sglang_decode_interval_disagg_dp2",
}
