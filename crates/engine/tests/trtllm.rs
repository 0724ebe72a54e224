//! TRT-LLM's guaranteed-no-evict admission on the shared core.

use servesim_engine::{Engine, EngineConfig, EngineOptions, EngineRequest, PassOutput, Prompt};

fn engine(json: &str) -> Engine {
    Engine::new(EngineConfig::parse_json(json).unwrap(), EngineOptions::default())
}

fn request(id: u64, prompt: u32, max_output: u32) -> EngineRequest {
    let tokens: Vec<u32> = (0..prompt).map(|i| i + id as u32 * 100_000).collect();
    EngineRequest::new(id, Prompt::Tokens(tokens.into()), max_output, id)
}

/// Runs to idle; returns (passes, generated tokens per request id).
fn run(e: &mut Engine) -> (usize, std::collections::BTreeMap<u64, usize>) {
    let (mut now, mut passes, mut tokens) = (0.0, 0, std::collections::BTreeMap::new());
    let mut out = PassOutput::default();
    while e.has_work() {
        e.step(now, &mut out);
        now = out.end_ms;
        passes += 1;
        for t in &out.tokens {
            *tokens.entry(t.request).or_insert(0) += 1;
        }
        assert!(passes < 100_000);
    }
    (passes, tokens)
}

const SMALL: &str =
    r#""block_size": 4, "num_gpu_blocks": 6, "max_num_batched_tokens": 16, "enable_prefix_caching": false"#;

#[test]
fn admission_reserves_the_whole_lifetime() {
    // 8 prompt + 8 output tokens = 4 blocks each: only one fits in 6 blocks.
    let mut e = engine(&format!(r#"{{"backend": "trtllm", {SMALL}}}"#));
    e.submit(request(1, 8, 8));
    e.submit(request(2, 8, 8));
    let mut out = PassOutput::default();
    e.step(0.0, &mut out);
    assert_eq!((e.num_running(), e.num_waiting()), (1, 1));
    let (_, tokens) = run(&mut e);
    assert_eq!(tokens.values().sum::<usize>(), 16 - 1);
    assert_eq!(e.counters().preemptions, 0);

    // vLLM admits both (future output is not reserved).
    let mut e = engine(&format!(r#"{{"backend": "vllm", {SMALL}}}"#));
    e.submit(request(1, 8, 8));
    e.submit(request(2, 8, 8));
    e.step(0.0, &mut out);
    assert_eq!(e.num_running(), 2);
}

#[test]
fn requests_run_one_after_another_without_preemption() {
    let mut e =
        engine(r#"{"backend": "trtllm", "block_size": 4, "num_gpu_blocks": 4, "enable_prefix_caching": false}"#);
    e.submit(request(1, 4, 12));
    e.submit(request(2, 4, 12));
    let (_, tokens) = run(&mut e);
    assert_eq!(tokens.get(&1), Some(&12));
    assert_eq!(tokens.get(&2), Some(&12));
    assert_eq!(e.counters().preemptions, 0);
}

#[test]
fn running_requests_cap_at_what_the_cache_guarantees() {
    // 7319 blocks of 32; 1096 + 7000 tokens need 253 blocks: exactly 28 requests fit.
    let mut e =
        engine(r#"{"backend": "trtllm", "block_size": 32, "num_gpu_blocks": 7319, "enable_prefix_caching": false}"#);
    for id in 0..64 {
        e.submit(request(id, 1096, 7000));
    }
    let mut out = PassOutput::default();
    let mut now = 0.0;
    for _ in 0..20 {
        e.step(now, &mut out);
        now = out.end_ms;
    }
    assert_eq!((e.num_running(), e.num_waiting()), (28, 36));
    assert_eq!(e.counters().preemptions, 0);
}

#[test]
fn output_is_clamped_to_the_cache() {
    // 4 blocks of 4 tokens hold 16 tokens: a 4-token prompt can generate 12, not 40.
    let mut e =
        engine(r#"{"backend": "trtllm", "block_size": 4, "num_gpu_blocks": 4, "enable_prefix_caching": false}"#);
    e.submit(request(1, 4, 40));
    let (_, tokens) = run(&mut e);
    assert_eq!(tokens.get(&1), Some(&12));
}
