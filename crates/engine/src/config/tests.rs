use serde_json::Value;

use super::*;
use crate::profile::Profile;

fn parse(s: &str) -> Result<EngineConfig> {
    EngineConfig::parse_json(s)
}

/// The canonical dump of an engine configuration with the default deployment.
fn dump(c: &EngineConfig) -> Value {
    WorkerArgs { engine: c.clone(), deployment: Deployment::default() }.to_canonical_json()
}

#[test]
fn defaults_match_dynamo() {
    let c = parse("{}").unwrap();
    assert_eq!(c.backend, Backend::Vllm);
    assert_eq!(c.block_size, 64);
    assert_eq!(c.num_gpu_blocks, 16384);
    assert_eq!(c.max_num_seqs, Some(256));
    assert_eq!(c.max_num_batched_tokens, Some(8192));
    assert!(c.enable_prefix_caching && c.enable_chunked_prefill);
    assert_eq!(c.preemption_mode, PreemptionMode::Lifo);
    assert_eq!(c.speedup_ratio, 1.0);
    assert_eq!(c.decode_speedup_ratio, 1.0);
    assert_eq!(c.timing, TimingModel::Polynomial);
    assert_eq!(WorkerArgs::default().deployment.gpus_per_worker(), 1);
}

#[test]
fn flat_and_canonical_forms_agree() {
    let flat =
        parse(r#"{"block_size":16,"num_gpu_blocks":1000,"max_num_seqs":null,"preemption_mode":"Fifo"}"#).unwrap();
    let nested =
        parse(r#"{"engine":{"block_size":16,"num_gpu_blocks":1000,"max_num_seqs":null,"preemption_mode":"fifo"},"dp_size":1}"#)
            .unwrap();
    assert_eq!(flat, nested);
    assert_eq!(flat.block_size, 16);
    assert_eq!(flat.max_num_seqs, None, "explicit null means unbounded");
    assert_eq!(flat.preemption_mode, PreemptionMode::Fifo);
}

#[test]
fn canonical_dump_round_trips() {
    let c = parse(r#"{"engine":{"block_size":16,"timing_model":{"type":"fixed","prefill_ms":40,"decode_ms":10}}}"#)
        .unwrap();
    let w = WorkerArgs { engine: c, deployment: Deployment { dp_size: 2, ..Deployment::default() } };
    let again = WorkerArgs::from_value(&w.to_canonical_json()).unwrap();
    assert_eq!(w, again);
}

#[test]
fn dynamo_normalised_defaults_are_accepted() {
    // What `_normalize_mocker_config({})` prints in Dynamo 1.6.1.
    let dump = r#"{"engine":{"backend":"vllm","num_gpu_blocks":16384,"block_size":64,"max_model_len":null,
      "max_num_seqs":256,"max_num_batched_tokens":8192,"prefill_schedule_interval":1,"prefill_decode_interval":0,
      "enable_prefix_caching":true,"enable_chunked_prefill":true,"speedup_ratio":1.0,"decode_speedup_ratio":1.0,
      "aic_nextn":null,"aic_nextn_accept_rates":null,"aic_mtp_seed":42,"worker_type":"aggregated",
      "preemption_mode":"lifo","emit_kv_events":false,"emit_kv_token_ids":false,"kv_transfer_bytes_per_token":null,
      "kv_transfer_bandwidth":null,"kv_transfer_timing_mode":"full_prompt","timing_model":{"type":"polynomial"},
      "sglang":{"schedule_policy":"fifo"},"trtllm":{"capacity_scheduler_policy":"guaranteed_no_evict"}},
      "dp_size":1,"tensor_parallel_size":1,"startup_time":null,"num_gpu_blocks_is_explicit":false,
      "gpu_memory_utilization":null,"mem_fraction_static":null,"free_gpu_memory_fraction":null,
      "cuda_graph_reserved_bytes":null,"dynamo":{"enable_local_indexer":false,"bootstrap_port":null,
      "handoff_session_timeout_ms":300000,"reasoning":null,"response_replay_trace_path":null,
      "zmq_kv_events_port":null,"zmq_replay_port":null,"router_queue_policy":null}}"#;
    assert_eq!(parse(dump).unwrap(), parse("{}").unwrap());
}

#[test]
fn engine_family_defaults_and_constraints() {
    assert_eq!(parse(r#"{"engine_type": "sglang"}"#).unwrap().block_size, 1);
    assert_eq!(parse(r#"{"engine_type": "sglang", "sglang": {"page_size": 16}}"#).unwrap().block_size, 16);
    assert_eq!(parse(r#"{"engine_type": "trtllm"}"#).unwrap().block_size, 32);
    assert!(parse(r#"{"engine_type": "sglang", "block_size": 8, "sglang": {"page_size": 8}}"#).is_ok());
    let e = parse(r#"{"engine_type": "sglang", "block_size": 8, "sglang": {"page_size": 4}}"#).unwrap_err();
    assert_eq!(e.path, "sglang.page_size");
    assert!(e.message.contains("need to match"));
    let e = parse(r#"{"engine_type": "sglang", "block_size": 4, "sglang": {"chunked_prefill_size": 6}}"#).unwrap_err();
    assert_eq!(e.path, "sglang.chunked_prefill_size");
    assert!(parse(r#"{"engine_type": "sglang", "block_size": 4, "sglang": {"chunked_prefill_size": 8}}"#).is_ok());
    // Every backend takes max_model_len, as the reference's does.
    assert_eq!(parse(r#"{"engine_type": "sglang", "max_model_len": 100}"#).unwrap().max_model_len, Some(100));
    assert_eq!(parse(r#"{"engine_type": "trtllm", "max_model_len": 100}"#).unwrap().max_model_len, Some(100));
    assert_eq!(parse(r#"{"max_model_len": 0}"#).unwrap_err().path, "max_model_len");
    let e = parse(r#"{"engine_type": "sglang", "enable_chunked_prefill": false}"#).unwrap_err();
    assert_eq!(
        (e.path.as_str(), e.message.as_str()),
        ("enable_chunked_prefill", "enable_chunked_prefill=false is not supported for backend=sglang")
    );
    assert!(parse(r#"{"enable_chunked_prefill": false}"#).is_ok(), "vLLM runs without chunking");
    let c =
        parse(r#"{"engine": {"backend": "sglang", "sglang": {"schedule_policy": "lpm", "max_prefill_tokens": 4096}}}"#)
            .unwrap();
    assert!(c.sglang.lpm);
    assert_eq!(c.sglang.max_prefill_tokens, 4096);
    assert_eq!(parse(r#"{"sglang": {"schedule_policy": "random"}}"#).unwrap_err().path, "sglang.schedule_policy");
    // Above 1 is allowed (it only scales the admission ratio); negative or NaN is not.
    assert_eq!(
        parse(r#"{"sglang": {"schedule_conservativeness": 1.5}}"#).unwrap().sglang.schedule_conservativeness,
        1.5
    );
    assert_eq!(
        parse(r#"{"sglang": {"schedule_conservativeness": -0.5}}"#).unwrap_err().path,
        "sglang.schedule_conservativeness"
    );
    // Attention DP divides the chunk budget per rank: it must stay at least a page.
    let e =
        parse(r#"{"engine": {"backend": "sglang", "sglang": {"chunked_prefill_size": 1}}, "dp_size": 2}"#).unwrap_err();
    assert_eq!(e.message, "SGLang attention DP size 2 reduces chunked_prefill_size=1 to zero");
    let e = parse(
        r#"{"engine": {"backend": "sglang", "block_size": 16, "sglang": {"chunked_prefill_size": 16}}, "dp_size": 2}"#,
    )
    .unwrap_err();
    assert_eq!(e.path, "dp_size");
    assert!(e.message.contains("less than one page"), "{}", e.message);
    assert!(parse(r#"{"engine": {"backend": "sglang", "block_size": 16}, "dp_size": 2}"#).is_ok());
    assert_eq!(
        parse(r#"{"trtllm": {"capacity_scheduler_policy": "max_utilization"}}"#).unwrap_err().path,
        "trtllm.capacity_scheduler_policy"
    );
}

/// `aic_nextn` and its rates as Dynamo 1.6.1 reads them (messages probed on the reference's
/// `normalize_mocker_config` and replay entry points).
#[test]
fn speculative_decoding_settings() {
    let spec = |json: &str| parse(json).unwrap().speculative.unwrap();
    assert_eq!(spec(r#"{"aic_nextn": 3}"#).accept_rates, vec![0.85, 0.3, 0.0]);
    assert_eq!(spec(r#"{"aic_nextn": 3, "aic_nextn_accept_rates": "1,0.5"}"#).accept_rates, vec![1.0, 0.5, 0.0]);
    assert_eq!(spec(r#"{"aic_nextn": 2, "aic_nextn_accept_rates": "1,0.5,0.25"}"#).accept_rates, vec![1.0, 0.5]);
    assert_eq!(spec(r#"{"aic_nextn": 2, "aic_nextn_accept_rates": " 5e-1 , .25 "}"#).accept_rates, vec![0.5, 0.25]);
    // A blank string is the default rates.
    assert_eq!(spec(r#"{"aic_nextn": 2, "aic_nextn_accept_rates": " "}"#).accept_rates, vec![0.85, 0.3]);
    assert_eq!(spec(r#"{"engine": {"aic_nextn": 2}}"#).seed, 42);
    assert_eq!(spec(r#"{"aic_nextn": 1, "aic_mtp_seed": 7}"#).seed, 7);
    let err = |json: &str| parse(json).unwrap_err();
    for bad in [0, 6] {
        let e = err(&format!(r#"{{"aic_nextn": {bad}, "aic_nextn_accept_rates": "x"}}"#));
        assert_eq!(
            (e.path.as_str(), e.message.clone()),
            ("aic_nextn", format!("aic_nextn must be in 1..=5, got {bad}"))
        );
    }
    for (bad, want) in [
        (r#""nan""#, "aic_nextn_accept_rates[0] must be finite and in [0, 1], got NaN"),
        (r#""inf""#, "aic_nextn_accept_rates[0] must be finite and in [0, 1], got inf"),
        (r#""0.5,-0.1""#, "aic_nextn_accept_rates[1] must be finite and in [0, 1], got -0.1"),
        (r#""1.1""#, "aic_nextn_accept_rates[0] must be finite and in [0, 1], got 1.1"),
        (r#""bad""#, r#"invalid aic_nextn_accept_rates value "bad": invalid float literal"#),
        (r#""0.5,""#, r#"invalid aic_nextn_accept_rates value "": cannot parse float from empty string"#),
        ("3", "invalid type: integer `3`, expected a string"),
        ("[0.5, 0.5]", "invalid type: sequence, expected a string"),
    ] {
        let e = err(&format!(r#"{{"aic_nextn": 2, "aic_nextn_accept_rates": {bad}}}"#));
        assert_eq!((e.path.as_str(), e.message.as_str()), ("aic_nextn_accept_rates", want), "{bad}");
    }
    assert_eq!(err(r#"{"aic_nextn_accept_rates": "0.5"}"#).message, "aic_nextn_accept_rates requires aic_nextn");
    let e = err(r#"{"aic_nextn": 2, "decode_speedup_ratio": 2.0}"#);
    assert_eq!(e.path, "decode_speedup_ratio");
    assert_eq!(
        e.message,
        "aic_nextn requires decode_speedup_ratio=1.0 because MTP output acceleration is modeled by burst sampling"
    );
    // The depth is checked before the rates, the rates before the speedup.
    assert!(err(r#"{"aic_nextn": 2, "decode_speedup_ratio": 2.0, "aic_nextn_accept_rates": "x"}"#)
        .message
        .starts_with("invalid aic_nextn_accept_rates value"));
    let c = parse(r#"{"aic_nextn": 2, "aic_nextn_accept_rates": "1,0.5"}"#).unwrap();
    assert_eq!(EngineConfig::from_value(&dump(&c)).unwrap(), c);
}

#[test]
fn reasoning_settings() {
    let c =
        parse(r#"{"reasoning": {"start_thinking_token_id": 1, "end_thinking_token_id": 2, "thinking_ratio": 0.5}}"#)
            .unwrap();
    assert_eq!(c.reasoning.unwrap().thinking_ratio, 0.5);
    let nested =
        parse(r#"{"engine": {}, "dynamo": {"reasoning": {"start_thinking_token_id": 1, "end_thinking_token_id": 2, "thinking_ratio": 0.5}}}"#)
            .unwrap();
    assert_eq!(nested, c);
    assert_eq!(EngineConfig::from_value(&dump(&c)).unwrap(), c);
    let e =
        parse(r#"{"reasoning": {"start_thinking_token_id": 1, "end_thinking_token_id": 2, "thinking_ratio": 1.5}}"#)
            .unwrap_err();
    assert_eq!(e.path, "reasoning.thinking_ratio");
    let e = parse(r#"{"reasoning": {"start_thinking_token_id": 1, "thinking_ratio": 0.5}}"#).unwrap_err();
    assert_eq!(e.path, "reasoning.end_thinking_token_id");
}

/// A two-point NPZ profile and its bytes (read back as "p.npz" by the tests' file readers).
fn small_profile() -> (Profile, Vec<u8>) {
    let profile = Profile {
        prefill_isl: vec![128.0, 256.0],
        prefill_ttft_ms: vec![4.0, 8.0],
        decode_active_kv_tokens: vec![1024.0, 2048.0],
        decode_context_length: vec![128.0, 256.0],
        decode_itl: vec![1.0, 1.5, 2.0, 2.5],
    };
    let bytes = profile.to_npz();
    (profile, bytes)
}

#[test]
fn profiled_timing_reads_through_the_loader() {
    let (profile, bytes) = small_profile();
    let files = |p: &str| if p == "p.npz" { Ok(bytes.clone()) } else { Err(format!("cannot read {p}")) };
    let c = EngineConfig::parse_json_with(r#"{"planner_profile_data": "p.npz"}"#, &files).unwrap();
    assert!(matches!(&c.timing, TimingModel::Interpolated { profile: p, .. } if **p == profile));
    let nested = EngineConfig::parse_json_with(
        r#"{"engine": {"timing_model": {"type": "interpolated", "path": "p.npz"}}}"#,
        &files,
    )
    .unwrap();
    assert_eq!(nested.timing, c.timing);
    // A missing or malformed profile is an error unless fallback was asked for.
    let e = EngineConfig::parse_json_with(r#"{"planner_profile_data": "q.npz"}"#, &files).unwrap_err();
    assert_eq!(e.path, "planner_profile_data");
    let e = EngineConfig::parse_json_with(
        r#"{"engine": {"timing_model": {"type": "interpolated", "path": "q.npz"}}}"#,
        &files,
    )
    .unwrap_err();
    assert_eq!(e.path, "engine.timing_model.path");
    let c = EngineConfig::parse_json_with(
        r#"{"timing_model": {"type": "interpolated", "path": "q.npz", "fallback": "polynomial"}}"#,
        &files,
    )
    .unwrap();
    assert_eq!(c.timing, TimingModel::Polynomial);
    assert!(c.timing_fallback.unwrap().contains("q.npz"));
    let garbage = |_: &str| Ok(b"not a zip".to_vec());
    let e = EngineConfig::parse_json_with(r#"{"planner_profile_data": "p.npz"}"#, &garbage).unwrap_err();
    assert!(e.message.contains("not an NPZ archive"), "{e}");
}

/// Dynamo's form of profile timing (what `--planner-profile-data` writes): the same interpolated
/// model, its errors keyed to the config's path, and its canonical form kept on a round trip.
#[test]
fn dynamo_profile_provider_is_the_interpolated_model() {
    let (profile, bytes) = small_profile();
    let files = |p: &str| if p == "p.npz" { Ok(bytes.clone()) } else { Err(format!("cannot read {p}")) };
    let env = || ConfigEnv { files: &files, ..ConfigEnv::NONE };
    let dynamo = |config: &str| {
        let text = format!(
            r#"{{"engine": {{"timing_model": {{"type": "external", "provider": "dynamo_profile"{config}}}}}}}"#
        );
        WorkerArgs::parse_json_env(&text, env())
    };
    let w = dynamo(r#", "config": {"path": "p.npz"}"#).unwrap();
    let TimingModel::Interpolated { profile: p, path, dynamo_form } = &w.engine.timing else {
        panic!("{:?}", w.engine.timing)
    };
    assert_eq!((&**p, path.as_str(), *dynamo_form), (&profile, "p.npz", true));
    let canonical = w.to_canonical_json();
    assert_eq!(
        canonical["engine"]["timing_model"],
        serde_json::json!({"type": "external", "provider": "dynamo_profile", "config": {"path": "p.npz"}})
    );
    assert_eq!(WorkerArgs::from_value_env(&canonical, env()).unwrap(), w);
    // Times exactly as servesim's own interpolated form of the same file.
    let own = EngineConfig::parse_json_with(
        r#"{"engine": {"timing_model": {"type": "interpolated", "path": "p.npz"}}}"#,
        &files,
    )
    .unwrap();
    let TimingModel::Interpolated { profile: q, .. } = &own.timing else { panic!() };
    assert_eq!(q, p);
    // Errors name the key; no fallback to the polynomial model.
    let e = dynamo(r#", "config": {"path": "q.npz"}"#).unwrap_err();
    assert_eq!((e.path.as_str(), e.message.as_str()), ("engine.timing_model.config.path", "cannot read q.npz"));
    let e = dynamo("").unwrap_err();
    assert_eq!(e.path, "engine.timing_model.config");
    let e = dynamo(r#", "config": {}"#).unwrap_err();
    assert_eq!(e.path, "engine.timing_model.config.path");
    let e = dynamo(r#", "config": {"path": "p.npz", "extra": 1}"#).unwrap_err();
    assert_eq!(e.path, "engine.timing_model.config.extra");
    let e = dynamo(r#", "config": {"path": 3}"#).unwrap_err();
    assert_eq!(e.path, "engine.timing_model.config.path");
}

#[test]
fn kv_transfer_delay() {
    let transfer = |json: &str| WorkerArgs::parse_json(json).unwrap().deployment.kv_transfer;
    let t = transfer(r#"{"kv_bytes_per_token": 1000000, "kv_transfer_bandwidth": 1.0}"#);
    assert_eq!(t.ms(128), 128.0);
    assert_eq!(t.ms(8), 8.0);
    let t = transfer(r#"{"engine": {"kv_transfer_bytes_per_token": 131072, "kv_transfer_bandwidth": 64.0}}"#);
    assert!((t.ms(10_000) - 20.48).abs() < 1e-12);
    assert_eq!(transfer(r#"{"kv_bytes_per_token": 1000}"#).ms(100), 0.0, "no bandwidth");
    assert_eq!(transfer(r#"{"kv_bytes_per_token": 1000, "kv_transfer_bandwidth": 0}"#).ms(100), 0.0);
}

#[test]
fn sglang_attention_dp_ranks_split_the_chunk_budget() {
    let c = parse(r#"{"engine": {"backend": "sglang", "sglang": {"schedule_conservativeness": 0.5}}}"#).unwrap();
    let rank = c.for_attention_dp(2);
    assert_eq!(rank.sglang.chunked_prefill_size, 4096);
    assert!((rank.sglang.schedule_conservativeness - 0.15).abs() < 1e-12);
    assert_eq!(c.for_attention_dp(1), c);
    let v = parse(r#"{"engine": {"backend": "vllm"}}"#).unwrap();
    assert_eq!(v.for_attention_dp(4), v);
}

#[test]
fn unknown_keys_are_named() {
    let e = parse(r#"{"block_size":16,"blok_size":8}"#).unwrap_err();
    assert_eq!(e.path, "blok_size");
    assert!(e.message.starts_with("unknown key"));
    let e = parse(r#"{"engine":{"foo":1}}"#).unwrap_err();
    assert_eq!(e.path, "engine.foo");
    let e = parse(r#"{"engine":{"timing_model":{"type":"fixed","prefill_ms":1,"decode_ms":1,"x":2}}}"#).unwrap_err();
    assert_eq!(e.path, "engine.timing_model.x");
}

#[test]
fn bad_values_are_named() {
    let e = parse(r#"{"num_gpu_blocks":"many"}"#).unwrap_err();
    assert_eq!(e.path, "num_gpu_blocks");
    assert!(e.message.contains("\"many\""), "{e}");
    assert_eq!(parse(r#"{"max_num_seqs":0}"#).unwrap_err().path, "max_num_seqs");
    assert_eq!(parse(r#"{"preemption_mode":"random"}"#).unwrap_err().path, "preemption_mode");
    assert_eq!(parse(r#"{"aic_nextn":6}"#).unwrap_err().path, "aic_nextn");
    assert!(parse(r#"{"block_size":16} true"#).unwrap_err().message.contains("trailing"));
    assert_eq!(parse(r#"{"is_prefill":true,"is_decode":true}"#).unwrap_err().path, "is_prefill");
}

/// A stand-in for the AIS model: a GPU whose memory fraction `f` leaves `f × 100,000` KV tokens
/// less one token per 100 tokens of per-pass budget.
#[derive(Debug)]
struct MemoryAware;

impl crate::timing::PassTimer for MemoryAware {
    fn prefill_ms(&self, _: u32, _: u64, _: u64) -> std::result::Result<f64, String> {
        Ok(1.0)
    }
    fn decode_ms(&self, _: u32, _: u64, _: u64) -> std::result::Result<f64, String> {
        Ok(1.0)
    }
    fn config(&self) -> Value {
        serde_json::json!({"model": "m", "system": "s", "backend": "vllm", "worker_type": "aggregated"})
    }
    fn kv_cache_blocks(&self, m: &crate::timing::KvMemory) -> Option<std::result::Result<u64, String>> {
        let f = m.limits.gpu_memory_utilization.unwrap_or(0.9);
        let tokens = f * 100_000.0 - m.max_num_batched_tokens.unwrap_or(8192) as f64 / 100.0;
        let tokens = tokens - m.limits.cuda_graph_reserved_bytes.unwrap_or(0) as f64;
        Some(if tokens > 0.0 { Ok(tokens as u64 / m.block_size as u64) } else { Err("no KV budget".into()) })
    }
}

fn with_ais(json: &str) -> Result<WorkerArgs> {
    let factory = |_: &str, _: &str, _: &Value| -> Result<std::sync::Arc<dyn crate::timing::PassTimer>> {
        Ok(std::sync::Arc::new(MemoryAware))
    };
    let env = ConfigEnv { files: &no_files, timers: Some(&factory), ..ConfigEnv::NONE };
    WorkerArgs::parse_json_env(json, env)
}

fn ais_engine(extra_top: &str, extra_engine: &str, ais: &str) -> String {
    format!(
        r#"{{{extra_top}"engine":{{{extra_engine}"block_size":16,"timing_model":{{"type":"external","provider":"ais",
        "config":{{"model":"m","system":"s","backend":"vllm","worker_type":"aggregated"{ais}}}}}}}}}"#
    )
}

/// Dynamo 1.6.1 (`_normalize_mocker_config` with aisimulate installed) sizes the KV cache from GPU
/// memory under AIS timing unless the capacity is the user's: 3,904 blocks of 64 for
/// Qwen3-32B TP1 on H200 where the mocker default is 16,384 (census 2026-12, §0 finding 1).
#[test]
fn ais_timing_sizes_the_kv_cache_unless_it_is_given() {
    let w = with_ais(&ais_engine("", "", "")).unwrap();
    assert_eq!(w.engine.num_gpu_blocks, (90_000 - 81) / 16);
    assert!(!w.deployment.num_gpu_blocks_is_explicit);
    let w = with_ais(&ais_engine(r#""gpu_memory_utilization":0.5,"cuda_graph_reserved_bytes":919,"#, "", "")).unwrap();
    assert_eq!(w.engine.num_gpu_blocks, (50_000 - 81 - 919) / 16);
    let w = with_ais(&ais_engine("", r#""max_num_batched_tokens":2048,"#, "")).unwrap();
    assert_eq!(w.engine.num_gpu_blocks, (90_000 - 20) / 16);
    // Given: kept, unless the launch says it was not the user's.
    let w = with_ais(&ais_engine("", r#""num_gpu_blocks":1000,"#, "")).unwrap();
    assert_eq!(w.engine.num_gpu_blocks, 1000);
    assert!(w.deployment.num_gpu_blocks_is_explicit);
    let w = with_ais(&ais_engine(r#""num_gpu_blocks_is_explicit":false,"#, r#""num_gpu_blocks":1000,"#, "")).unwrap();
    assert_eq!(w.engine.num_gpu_blocks, (90_000 - 81) / 16);
    // The canonical dump keeps the knobs, so it normalises to the same thing again.
    let w = with_ais(&ais_engine(r#""gpu_memory_utilization":0.5,"#, "", "")).unwrap();
    let again = with_ais(&w.to_canonical_json().to_string()).unwrap();
    assert_eq!(again.engine.num_gpu_blocks, w.engine.num_gpu_blocks);
    assert_eq!(again.deployment.memory, w.deployment.memory);
    // A budget that leaves no room names the key.
    let e = with_ais(&ais_engine(r#""cuda_graph_reserved_bytes":100000000,"#, "", "")).unwrap_err();
    assert_eq!(e.path, "engine.num_gpu_blocks");
    assert!(e.message.contains("cannot be sized from GPU memory: no KV budget"), "{e}");
    // Without a timing model that knows the GPU the fractions change nothing, as in Dynamo.
    let w = WorkerArgs::parse_json(r#"{"gpu_memory_utilization":0.5,"engine":{}}"#).unwrap();
    assert_eq!(w.engine.num_gpu_blocks, 16384);
    for bad in [r#"{"gpu_memory_utilization":1.5,"engine":{}}"#, r#"{"mem_fraction_static":-0.1}"#] {
        let e = WorkerArgs::parse_json(bad).unwrap_err();
        assert!(e.message.contains("must be finite and in [0, 1]"), "{e}");
    }
}

/// aisimulate's runner passes the pipeline depth (`aic_pp_size`) and the prefill context
/// parallelism (`aic_cp_size`) beside the timing config: pp then launches, and CP ranks widen
/// the worker (pipeline stages do not, as the reference counts GPUs).
#[test]
fn pipeline_and_prefill_cp_come_with_the_runners_keys() {
    let flat = |top: &str, ais: &str| {
        format!(
            r#"{{{top}"engine_type":"vllm","block_size":16,"timing_model":{{"type":"external","provider":"ais",
            "config":{{"model":"m","system":"s","backend":"vllm","worker_type":"aggregated"{ais}}}}}}}"#
        )
    };
    let w = with_ais(&flat(r#""aic_pp_size":2,"#, r#","pp":2"#)).unwrap();
    assert_eq!(w.deployment.gpus_per_worker(), 1);
    let w = with_ais(&flat(r#""aic_cp_size":2,"tensor_parallel_size":2,"#, r#","tp":2,"cp_size":2"#)).unwrap();
    assert_eq!(w.deployment.gpus_per_worker(), 4);
    let w = with_ais(&flat("", r#","cp_size":2"#)).unwrap();
    assert_eq!(w.deployment.prefill_context_parallel_size, 2);
    for (cfg, want) in [
        (flat("", r#","pp":2"#), "engine launch supports only pp=1; got pp=2"),
        (flat(r#""aic_pp_size":2,"#, ""), "aic_pp_size (2) conflicts with the AIS timing config's pp (1)"),
        (flat(r#""aic_cp_size":2,"#, ""), "aic_cp_size (2) conflicts with the AIS timing config's cp_size (1)"),
    ] {
        let e = with_ais(&cfg).unwrap_err();
        assert!(e.to_string().contains(want), "{e}");
    }
}

/// Dynamo's launch rules for an AIS timing config (its messages, probed on 1.6.1).
#[test]
fn ais_identity_sets_and_must_agree_with_the_launch() {
    let w = with_ais(&ais_engine("", "", r#","tp":2,"attention_dp":2,"nextn":2"#)).unwrap();
    assert_eq!((w.deployment.tensor_parallel_size, w.deployment.dp_size), (2, 2));
    assert_eq!(w.engine.speculative.as_ref().map(|s| s.nextn), Some(2));
    let cases = [
        (ais_engine("", "", r#","pp":2"#), "engine launch supports only pp=1; got pp=2"),
        (ais_engine(r#""tensor_parallel_size":2,"#, "", ""), "conflicts with the AIS timing config's tp (1)"),
        (ais_engine(r#""dp_size":2,"#, "", ""), "conflicts with the AIS timing config's attention_dp (1)"),
        (ais_engine("", r#""aic_nextn":1,"#, r#","nextn":2"#), "canonical nextn conflicts with scheduler aic_nextn"),
        (ais_engine("", r#""aic_nextn":2,"#, ""), "canonical nextn conflicts with scheduler aic_nextn"),
        // The depth's own range comes first, and the speculation scheme before the conflict.
        (ais_engine("", r#""aic_nextn":6,"#, r#","nextn":2"#), "aic_nextn must be in 1..=5, got 6"),
        (
            ais_engine(
                "",
                r#""aic_nextn":2,"#,
                r#","speculation":{"kind":"ngram","params":{"num_speculative_tokens":2}}"#,
            ),
            "engine launch does not implement ngram draft scheduling",
        ),
        (ais_engine("", r#""worker_type":"prefill","#, ""), "AIS worker_type must match engine role"),
        (
            ais_engine("", "", "").replace(r#","worker_type":"aggregated""#, ""),
            "worker_type`: missing (required by Dynamo: aggregated, prefill or decode)",
        ),
    ];
    for (json, want) in cases {
        let e = with_ais(&json).unwrap_err();
        assert!(e.to_string().contains(want), "{json}: {e}");
    }
}

/// aisimulate's replay roles schedule the ngram drafts Dynamo's launch refuses: the timing
/// config's draft count is the canonical depth, which `aic_nextn` must match.
#[test]
fn replay_roles_schedule_ngram_drafts_at_the_timing_configs_depth() {
    let factory = |_: &str, _: &str, _: &Value| -> Result<std::sync::Arc<dyn crate::timing::PassTimer>> {
        Ok(std::sync::Arc::new(MemoryAware))
    };
    let env = ConfigEnv { files: &no_files, timers: Some(&factory), spec_schedule: SpecSchedule::Aisimulate };
    let ngram = |nextn: u32| {
        ais_engine(
            "",
            &format!(r#""aic_nextn":{nextn},"aic_nextn_accept_rates":"0.5,0.5","#),
            r#","speculation":{"kind":"ngram","params":{"num_speculative_tokens":2}}"#,
        )
    };
    let w = WorkerArgs::parse_json_env(&ngram(2), env).unwrap();
    let spec = w.engine.speculative.unwrap();
    assert_eq!((spec.nextn, spec.accept_rates, spec.schedule), (2, vec![0.5, 0.5], SpecSchedule::Aisimulate));
    let e = WorkerArgs::parse_json_env(&ngram(3), env).unwrap_err();
    assert!(e.to_string().contains("canonical nextn conflicts with scheduler aic_nextn"), "{e}");
}

#[test]
fn kv_event_flags_follow_dynamos_rule_and_the_queue_policy_is_kept() {
    let e = parse(r#"{"engine":{"emit_kv_token_ids":true}}"#).unwrap_err();
    assert_eq!(
        (e.path.as_str(), e.message.as_str()),
        ("engine.emit_kv_token_ids", "emit_kv_token_ids requires emit_kv_events")
    );
    parse(r#"{"engine":{"emit_kv_token_ids":true,"emit_kv_events":true}}"#).unwrap();
    let w = WorkerArgs::parse_json(r#"{"engine":{},"dynamo":{"router_queue_policy":"lcfs"}}"#).unwrap();
    assert_eq!(w.deployment.router_queue_policy, Some("lcfs"));
    assert_eq!(w.to_canonical_json()["dynamo"]["router_queue_policy"], "lcfs");
    let e = WorkerArgs::parse_json(r#"{"engine":{},"dynamo":{"router_queue_policy":"lifo"}}"#).unwrap_err();
    assert_eq!(e.path, "dynamo.router_queue_policy");
}

/// `native_host_offload` with `kv_cache_bytes_per_token`, canonical form.
fn offload(host: &str, extra: &str) -> Result<EngineConfig> {
    parse(&format!(r#"{{"engine": {{"kv_cache_bytes_per_token": 1000, "native_host_offload": {host}{extra}}}}}"#))
}

#[test]
fn host_offload_is_read_in_both_forms_and_dumped_as_dynamo_normalises_it() {
    let c = offload(r#"{"num_host_blocks": 8}"#, "").unwrap();
    let host = c.host_offload.clone().unwrap();
    assert_eq!((host.num_host_blocks, host.d2h_bandwidth_gbps, host.h2d_bandwidth_gbps), (8, 32.0, 32.0));
    assert_eq!(host.latency_to_first_byte_ms, 0.0);
    let flat = parse(r#"{"kv_cache_bytes_per_token": 1000, "native_host_offload": {"num_host_blocks": 8}}"#).unwrap();
    assert_eq!(flat, c);
    let engine = &dump(&c)["engine"];
    assert_eq!(engine["kv_cache_bytes_per_token"], 1000);
    // Dynamo 1.6.1 prints the bandwidths always and the latency only when it is not zero.
    assert_eq!(
        engine["native_host_offload"],
        serde_json::json!({"num_host_blocks": 8, "d2h_bandwidth_gbps": 32.0, "h2d_bandwidth_gbps": 32.0})
    );
    let c = offload(r#"{"num_host_blocks": 8, "latency_to_first_byte_ms": 0.5}"#, "").unwrap();
    assert_eq!(dump(&c)["engine"]["native_host_offload"]["latency_to_first_byte_ms"], 0.5);
    assert_eq!(EngineConfig::from_value(&dump(&c)).unwrap(), c);
    // The scope only when shared, the pool caps only when not 80, the layout id when given
    // (probed with Dynamo 1.6.1's `normalize_mocker_config`), in its order; a round trip is
    // stable.
    let shared = offload(
        r#"{"num_host_blocks": 10, "scope": "cluster_shared", "kv_layout_id": "tp1",
            "shared_d2h_bandwidth_gbps": 5, "latency_to_first_byte_ms": 0.5}"#,
        "",
    )
    .unwrap();
    let printed = &dump(&shared)["engine"]["native_host_offload"];
    assert_eq!(
        serde_json::to_string(printed).unwrap(),
        r#"{"scope":"cluster_shared","num_host_blocks":10,"d2h_bandwidth_gbps":32.0,"h2d_bandwidth_gbps":32.0,"shared_d2h_bandwidth_gbps":5.0,"latency_to_first_byte_ms":0.5,"kv_layout_id":"tp1"}"#
    );
    assert_eq!(EngineConfig::from_value(&dump(&shared)).unwrap(), shared);
    let local =
        offload(r#"{"num_host_blocks": 10, "kv_layout_id": "tp1", "shared_h2d_bandwidth_gbps": 5}"#, "").unwrap();
    assert_eq!(
        serde_json::to_string(&dump(&local)["engine"]["native_host_offload"]).unwrap(),
        r#"{"num_host_blocks":10,"d2h_bandwidth_gbps":32.0,"h2d_bandwidth_gbps":32.0,"shared_h2d_bandwidth_gbps":5.0,"kv_layout_id":"tp1"}"#
    );
    // Without offload neither key is printed; the byte size alone changes nothing.
    let plain = parse("{}").unwrap();
    assert!(dump(&plain)["engine"].get("native_host_offload").is_none());
    assert!(dump(&plain)["engine"].get("kv_cache_bytes_per_token").is_none());
    let bytes_only = parse(r#"{"engine": {"kv_cache_bytes_per_token": 1000}}"#).unwrap();
    assert_eq!(bytes_only.host_offload, None);
}

#[test]
fn host_offload_errors_are_dynamos_in_its_order() {
    let err = |host: &str, extra: &str| offload(host, extra).unwrap_err().to_string();
    assert_eq!(err("{}", ""), "`engine.native_host_offload`: missing field `num_host_blocks`");
    assert_eq!(
        err(r#"{"num_host_blocks": 8, "foo": 1}"#, ""),
        "`engine.native_host_offload.foo`: unknown field `foo`, expected one of `scope`, `num_host_blocks`, \
         `d2h_bandwidth_gbps`, `h2d_bandwidth_gbps`, `shared_d2h_bandwidth_gbps`, `shared_h2d_bandwidth_gbps`, \
         `latency_to_first_byte_ms`, `kv_layout_id`"
    );
    assert_eq!(
        err(r#"{"num_host_blocks": "8"}"#, ""),
        "`engine.native_host_offload.num_host_blocks`: invalid type: string \"8\", expected usize"
    );
    assert!(err(r#"{"num_host_blocks": 8, "scope": "worker_local"}"#, "").contains("is a G3 scope"));
    assert!(err(r#"{"num_host_blocks": 8, "scope": "x"}"#, "").contains("unknown host_offload.scope `x`"));
    let msg = |host: &str, extra: &str| offload(host, extra).unwrap_err().message;
    assert_eq!(msg(r#"{"num_host_blocks": 0}"#, ""), "native_host_offload.num_host_blocks must be positive");
    assert_eq!(
        msg(r#"{"num_host_blocks": 8, "h2d_bandwidth_gbps": -1, "latency_to_first_byte_ms": -1}"#, ""),
        "native_host_offload.h2d_bandwidth_gbps must be finite and non-negative"
    );
    assert_eq!(
        msg(r#"{"num_host_blocks": 8, "scope": "cluster_shared"}"#, ""),
        "cluster_shared native_host_offload requires a nonempty kv_layout_id"
    );
    assert_eq!(
        msg(r#"{"num_host_blocks": 8}"#, r#", "backend": "sglang""#),
        "native_host_offload is supported only for backend=vllm"
    );
    assert_eq!(
        msg(r#"{"num_host_blocks": 8}"#, r#", "enable_prefix_caching": false"#),
        "native_host_offload requires enable_prefix_caching=true"
    );
    assert_eq!(
        msg(r#"{"num_host_blocks": 8}"#, r#", "aic_nextn": 1"#),
        "native_host_offload does not support aic_nextn in the initial implementation"
    );
    assert_eq!(
        parse(r#"{"engine": {"native_host_offload": {"num_host_blocks": 8}}}"#).unwrap_err().message,
        "native_host_offload requires kv_cache_bytes_per_token to derive the physical host block size"
    );
    assert_eq!(
        parse(r#"{"engine": {"kv_cache_bytes_per_token": 0}}"#).unwrap_err().message,
        "kv_cache_bytes_per_token must be positive"
    );
    assert_eq!(
        parse(r#"{"engine": {"kv_cache_bytes_per_token": 18446744073709551615, "native_host_offload": {"num_host_blocks": 8}}}"#)
            .unwrap_err()
            .message,
        "native_host_offload requires block_size * kv_cache_bytes_per_token to produce a positive, representable block size"
    );
    assert_eq!(
        msg(r#"{"num_host_blocks": 18446744073709551615}"#, ""),
        "native_host_offload capacity in bytes overflowed"
    );
    assert_eq!(
        msg(r#"{"num_host_blocks": 8, "d2h_bandwidth_gbps": 1e308}"#, ""),
        "native_host_offload.d2h_bandwidth_gbps produces an unrepresentable transfer duration"
    );
    // Prefill and decode workers take host offload too, as in Dynamo 1.6.1.
    for role in ["prefill", "decode"] {
        let config = parse(&format!(
            r#"{{"engine": {{"worker_type": "{role}", "kv_cache_bytes_per_token": 131072, "native_host_offload": {{"num_host_blocks": 8}}}}}}"#
        ))
        .unwrap();
        assert_eq!(config.host_offload.as_ref().map(|h| h.num_host_blocks), Some(8), "{role}");
    }
}

/// `g3_offload` with Dynamo 1.6.1's messages (probed with `normalize_mocker_config` and its
/// replay), checked in its order: shape, G3 values, host offload present, aggregated, then the
/// host section's own checks, then dp_size and capacity as its replay checks them.
#[test]
fn g3_offload_is_read_checked_and_dumped_as_dynamo_does() {
    let host = r#""kv_cache_bytes_per_token": 131072, "native_host_offload": {"num_host_blocks": 64}"#;
    let err = |g3: &str, extra: &str| {
        let e = parse(&format!(r#"{{"engine": {{{host}, "g3_offload": {g3}{extra}}}}}"#)).unwrap_err();
        (e.path, e.message)
    };
    let c =
        parse(&format!(r#"{{"engine": {{{host}, "g3_offload": {{"scope": "worker_local", "num_g3_blocks": 8}}}}}}"#))
            .unwrap();
    let g3 = c.g3_offload.unwrap();
    assert_eq!((g3.num_g3_blocks, g3.latency_to_first_byte_ms, g3.read_bandwidth_gbps), (8, 0.1, 10.0));
    assert_eq!(
        (g3.write_bandwidth_gbps, g3.shared_read_bandwidth_gbps, g3.shared_write_bandwidth_gbps),
        (10.0, 80.0, 80.0)
    );
    assert_eq!(
        dump(&c)["engine"]["g3_offload"],
        json!({"scope": "worker_local", "num_g3_blocks": 8, "latency_to_first_byte_ms": 0.1,
               "read_bandwidth_gbps": 10.0, "write_bandwidth_gbps": 10.0,
               "shared_read_bandwidth_gbps": 80.0, "shared_write_bandwidth_gbps": 80.0})
    );
    assert_eq!(parse(&format!(r#"{{"engine": {{{host}, "g3_offload": null}}}}"#)).unwrap().g3_offload, None);
    let at = |key: &str| format!("engine.g3_offload{key}");
    assert_eq!(err(r#"{"num_g3_blocks": 8}"#, ""), (at(""), "missing field `scope`".into()));
    assert_eq!(err(r#"{"scope": "worker_local"}"#, ""), (at(""), "missing field `num_g3_blocks`".into()));
    assert_eq!(
        err(r#"{"scope": "dp_rank_local", "num_g3_blocks": 8}"#, ""),
        (at(".scope"), "unknown variant `dp_rank_local`, expected `worker_local` or `cluster_shared`".into())
    );
    assert_eq!(err(r#"{"scope": 5, "num_g3_blocks": 8}"#, "").1, "invalid type: integer `5`, expected string or map");
    assert_eq!(
        err(r#"{"scope": "worker_local", "num_g3_blocks": 8, "foo": 1}"#, ""),
        (
            at(".foo"),
            "unknown field `foo`, expected one of `scope`, `num_g3_blocks`, `latency_to_first_byte_ms`, \
             `read_bandwidth_gbps`, `write_bandwidth_gbps`, `shared_read_bandwidth_gbps`, `shared_write_bandwidth_gbps`"
                .into()
        )
    );
    assert_eq!(
        err(r#"{"scope": "worker_local", "num_g3_blocks": "8"}"#, "").1,
        r#"invalid type: string "8", expected usize"#
    );
    assert_eq!(
        err(r#"{"scope": "worker_local", "num_g3_blocks": -1}"#, "").1,
        "invalid value: integer `-1`, expected usize"
    );
    assert_eq!(
        err(r#"{"scope": "worker_local", "num_g3_blocks": 8, "read_bandwidth_gbps": null}"#, "").1,
        "invalid type: null, expected f64"
    );
    assert_eq!(err("5", "").1, "invalid type: integer `5`, expected struct G3OffloadConfig");
    assert_eq!(err("[]", "").1, "invalid length 0, expected struct G3OffloadConfig with 7 elements");
    assert_eq!(
        err(r#"{"scope": "worker_local", "num_g3_blocks": 0}"#, ""),
        (at(""), "g3_offload.num_g3_blocks must be positive".into())
    );
    // The block count first, then the timing, whatever else is wrong.
    assert_eq!(
        err(r#"{"scope": "worker_local", "num_g3_blocks": 0, "latency_to_first_byte_ms": -1}"#, "").1,
        "g3_offload.num_g3_blocks must be positive"
    );
    for key in ["latency_to_first_byte_ms", "read_bandwidth_gbps", "shared_write_bandwidth_gbps"] {
        assert_eq!(
            err(&format!(r#"{{"scope": "worker_local", "num_g3_blocks": 8, "{key}": -1}}"#), "").1,
            "g3_offload timing must be finite and non-negative"
        );
    }
    let g3 = r#"{"scope": "worker_local", "num_g3_blocks": 8}"#;
    let without_host = |g3: &str, extra: &str| {
        parse(&format!(r#"{{"engine": {{"kv_cache_bytes_per_token": 131072, "g3_offload": {g3}{extra}}}}}"#))
            .unwrap_err()
            .message
    };
    assert_eq!(without_host(g3, ""), "g3_offload requires native_host_offload");
    assert_eq!(without_host(g3, r#", "worker_type": "prefill""#), "g3_offload requires native_host_offload");
    assert_eq!(
        without_host(r#"{"scope": "worker_local", "num_g3_blocks": 0}"#, ""),
        "g3_offload.num_g3_blocks must be positive"
    );
    assert_eq!(err(g3, r#", "worker_type": "decode""#).1, "g3_offload is supported only for worker_type=aggregated");
    // The G3 section is checked before the host section it needs.
    let bad_host = r#""kv_cache_bytes_per_token": 131072, "native_host_offload": {"num_host_blocks": 0}"#;
    let both = |g3: &str| parse(&format!(r#"{{"engine": {{{bad_host}, "g3_offload": {g3}}}}}"#)).unwrap_err().message;
    assert_eq!(both(r#"{"scope": "worker_local", "num_g3_blocks": 0}"#), "g3_offload.num_g3_blocks must be positive");
    assert_eq!(both(g3), "native_host_offload.num_host_blocks must be positive");
    assert_eq!(err(g3, r#", "backend": "sglang""#).1, "native_host_offload is supported only for backend=vllm");
    // What Dynamo's replay checks when it builds the deployment.
    let e = parse(&format!(r#"{{"engine": {{{host}, "g3_offload": {g3}}}, "dp_size": 2}}"#)).unwrap_err();
    assert_eq!((e.path.as_str(), e.message.as_str()), ("dp_size", "g3_offload supports only dp_size=1"));
    assert_eq!(
        err(r#"{"scope": "worker_local", "num_g3_blocks": 4611686018427387904}"#, ""),
        (at(".num_g3_blocks"), "G3 capacity bytes overflow".into())
    );
    // A rate at which the pool would take longer than an f64 holds (Dynamo's "G3 transfer
    // duration overflow"); the pool's caps count only when the pool is shared.
    assert_eq!(
        err(r#"{"scope": "worker_local", "num_g3_blocks": 8, "write_bandwidth_gbps": 1e-310}"#, ""),
        (at(".write_bandwidth_gbps"), "G3 transfer duration overflow".into())
    );
    let local_tiny_cap = r#"{"scope": "worker_local", "num_g3_blocks": 8, "shared_read_bandwidth_gbps": 1e-310}"#;
    assert!(parse(&format!(r#"{{"engine": {{{host}, "g3_offload": {local_tiny_cap}}}}}"#)).is_ok());
    assert_eq!(
        err(r#"{"scope": "cluster_shared", "num_g3_blocks": 8, "shared_read_bandwidth_gbps": 1e-310}"#, ""),
        (at(".shared_read_bandwidth_gbps"), "G3 transfer duration overflow".into())
    );
    // One pool for the deployment: printed as Dynamo 1.6.1's normalize_mocker_config prints it.
    let shared =
        parse(&format!(r#"{{"engine": {{{host}, "g3_offload": {{"scope": "cluster_shared", "num_g3_blocks": 8}}}}}}"#))
            .unwrap();
    assert!(shared.g3_offload.unwrap().cluster_shared);
    assert_eq!(
        serde_json::to_string(&dump(&shared)["engine"]["g3_offload"]).unwrap(),
        r#"{"scope":"cluster_shared","num_g3_blocks":8,"latency_to_first_byte_ms":0.1,"read_bandwidth_gbps":10.0,"write_bandwidth_gbps":10.0,"shared_read_bandwidth_gbps":80.0,"shared_write_bandwidth_gbps":80.0}"#
    );
    // Below a `cluster_shared` host pool too (the `g3_below_shared_host_*` goldens).
    let shared_host = r#""kv_cache_bytes_per_token": 131072,
        "native_host_offload": {"num_host_blocks": 64, "scope": "cluster_shared", "kv_layout_id": "tp1"}"#;
    let c = parse(&format!(
        r#"{{"engine": {{{shared_host}, "g3_offload": {{"scope": "worker_local", "num_g3_blocks": 8}}}}}}"#
    ))
    .unwrap();
    assert!(c.host_offload.as_ref().is_some_and(|h| h.cluster_shared));
    assert_eq!(c.g3_offload.as_ref().map(|g| g.num_g3_blocks), Some(8));
}

#[test]
fn prefill_intervals_are_read_checked_and_dumped_as_dynamo_does() {
    let c = parse(r#"{"engine": {"prefill_schedule_interval": 4}}"#).unwrap();
    assert_eq!((c.prefill_schedule_interval, c.prefill_decode_interval), (4, 0));
    assert_eq!(dump(&c)["engine"]["prefill_schedule_interval"], 4);
    let c = parse(r#"{"engine": {"backend": "sglang", "prefill_decode_interval": 3}}"#).unwrap();
    assert_eq!((c.prefill_schedule_interval, c.prefill_decode_interval), (1, 3));
    assert_eq!(dump(&c)["engine"]["prefill_decode_interval"], 3);
    let d = parse("{}").unwrap();
    assert_eq!((d.prefill_schedule_interval, d.prefill_decode_interval), (1, 0));
    assert_eq!(WorkerArgs::from_value(&dump(&c)).unwrap().engine, c, "the dump reads back");
    // Dynamo 1.6.1's errors (`_normalize_mocker_config`), value by value.
    let err = |engine: &str| {
        let e = parse(&format!(r#"{{"engine": {engine}}}"#)).unwrap_err();
        (e.path, e.message)
    };
    let psi = "engine.prefill_schedule_interval".to_string();
    let pdi = "engine.prefill_decode_interval".to_string();
    assert_eq!(
        err(r#"{"prefill_schedule_interval": 0}"#),
        (psi.clone(), "prefill_schedule_interval must be positive".into())
    );
    assert_eq!(
        err(r#"{"prefill_schedule_interval": -1}"#),
        (psi.clone(), "invalid value: integer `-1`, expected usize".into())
    );
    assert_eq!(
        err(r#"{"prefill_schedule_interval": 1.5}"#),
        (psi.clone(), "invalid type: floating point `1.5`, expected usize".into())
    );
    assert_eq!(
        err(r#"{"prefill_schedule_interval": "2"}"#),
        (psi.clone(), "invalid type: string \"2\", expected usize".into())
    );
    assert_eq!(
        err(r#"{"prefill_schedule_interval": null}"#),
        (psi.clone(), "invalid type: null, expected usize".into())
    );
    let vllm_only = "prefill_schedule_interval is supported only for backend=vllm; use prefill_decode_interval for \
                     backend=sglang";
    for backend in ["sglang", "trtllm"] {
        assert_eq!(
            err(&format!(r#"{{"backend": "{backend}", "prefill_schedule_interval": 2}}"#)),
            (psi.clone(), vllm_only.into())
        );
    }
    assert_eq!(
        err(r#"{"backend": "sglang", "prefill_decode_interval": -1}"#),
        (pdi.clone(), "invalid value: integer `-1`, expected usize".into())
    );
    assert_eq!(
        err(r#"{"backend": "sglang", "prefill_decode_interval": true}"#),
        (pdi.clone(), "invalid type: boolean `true`, expected usize".into())
    );
    for backend in ["vllm", "trtllm"] {
        assert_eq!(
            err(&format!(r#"{{"backend": "{backend}", "prefill_decode_interval": 2}}"#)),
            (pdi.clone(), "prefill_decode_interval is supported only for backend=sglang".into())
        );
    }
    // Neutral values are accepted everywhere.
    assert!(parse(
        r#"{"engine": {"backend": "trtllm", "prefill_schedule_interval": 1, "prefill_decode_interval": 0}}"#
    )
    .is_ok());
}
