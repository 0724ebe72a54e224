//! The recurrent-state cache (`state_cache`, `prefix_match_unit`) through the public engine
//! API: where states are saved, which prefixes hit, how a prompt's prefill is split, and the
//! blocks a state takes from the pool.

use servesim_engine::{Engine, EngineConfig, EngineOptions, EngineRequest, PassOutput, Prompt};

/// 16-token blocks of 8 bytes a token: a 512-byte state takes 4 blocks.
fn engine(unit: Option<u32>, blocks: u32) -> Engine {
    let unit = unit.map_or(String::new(), |u| format!(r#", "prefix_match_unit": {u}"#));
    let json = format!(
        r#"{{"block_size": 16, "num_gpu_blocks": {blocks}, "kv_cache_bytes_per_token": 8,
            "state_cache": {{"bytes_per_request": 512}}{unit},
            "timing_model": {{"type": "fixed", "prefill_ms": 40.0, "decode_ms": 10.0}}}}"#
    );
    Engine::new(
        EngineConfig::parse_json(&json).unwrap(),
        EngineOptions { record_kv_events: false, engine_index: 0, timing_jitter: None },
    )
}

fn tokens(n: u32, salt: u32) -> Vec<u32> {
    (0..n).map(|i| i * 7 + salt * 100_000).collect()
}

fn request(id: u64, prompt: Vec<u32>, max_output: u32) -> EngineRequest {
    EngineRequest::new(id, Prompt::Tokens(prompt.into()), max_output, id)
}

fn run(e: &mut Engine) -> Vec<PassOutput> {
    let mut passes = Vec::new();
    let mut now = 0.0;
    while e.has_work() {
        let mut out = PassOutput::default();
        e.step(now, &mut out);
        now = out.end_ms;
        passes.push(out);
        assert!(passes.len() < 10_000, "engine does not finish");
    }
    passes
}

/// Runs `prompt` alone to completion: its generated tokens, its first-token time and the
/// tokens its admission reused.
fn serve(e: &mut Engine, id: u64, prompt: Vec<u32>, output: u32) -> (Vec<u32>, f64, u32) {
    e.submit(request(id, prompt, output));
    let passes = run(e);
    let out = passes.iter().flat_map(|p| p.tokens.iter().filter(|t| t.request == id).map(|t| t.token)).collect();
    let first = passes.iter().find(|p| p.tokens.iter().any(|t| t.request == id)).unwrap().end_ms;
    let reused = passes.iter().flat_map(|p| &p.admissions).find(|a| a.request == id).unwrap().reused_tokens;
    (out, first - passes[0].start_ms, reused)
}

#[test]
fn default_retention_hits_only_the_newest_full_block_state() {
    let mut e = engine(None, 200);
    let prompt = tokens(40, 1);
    // 40 prompt tokens, then 9 computed decode tokens: the state is saved at 48 (a block
    // boundary reached while decoding), not at 32 (inside the one prefill pass).
    let (out, ttft, reused) = serve(&mut e, 1, prompt.clone(), 10);
    assert_eq!((ttft, reused), (40.0, 0));
    // Saved: the 3 full token blocks and the 4 blocks of the state at 48.
    assert_eq!((e.active_blocks(), e.inactive_blocks()), (0, 3 + 4));
    let mut turn2 = prompt.clone();
    turn2.extend(&out);
    turn2.extend(tokens(30, 2));
    let (_, _, reused) = serve(&mut e, 2, turn2, 4);
    assert_eq!(reused, 48);
    // The same first 40 tokens with no state saved inside them: their 2 resident blocks are
    // no hit.
    let mut other = prompt[..40].to_vec();
    other.extend(tokens(20, 3));
    let (_, _, reused) = serve(&mut e, 3, other, 2);
    assert_eq!(reused, 0);
}

#[test]
fn a_running_request_holds_its_state_in_the_pool() {
    let mut e = engine(None, 200);
    e.submit(request(1, tokens(40, 1), 5));
    let mut out = PassOutput::default();
    e.step(0.0, &mut out);
    // 3 token blocks (40 prompt tokens and the next one) and a 4-block state.
    assert_eq!(e.active_blocks(), 3 + 4);
}

#[test]
fn block_unit_splits_the_prompt_at_its_last_full_block_and_saves_the_state_there() {
    let mut e = engine(Some(16), 200);
    let prompt = tokens(40, 1);
    // Passes 0→32 and 32→40: the first token comes from the second prefill pass.
    let (out, ttft, _) = serve(&mut e, 1, prompt.clone(), 10);
    assert_eq!(ttft, 80.0);
    let mut turn2 = prompt.clone();
    turn2.extend(&out);
    turn2.extend(tokens(28, 2));
    // Align mode saves no decode state: the hit is the prompt's last full block.
    let (_, ttft, reused) = serve(&mut e, 2, turn2, 4);
    assert_eq!(reused, 32);
    // 32→64 (its last full block), 64→78: two prefill passes.
    assert_eq!(ttft, 80.0);
}

#[test]
fn a_sub_block_unit_saves_the_aligned_tail_and_costs_a_pass_to_reach_the_next_block() {
    let mut e = engine(Some(4), 200);
    let prompt = tokens(42, 1);
    // 0→32, 32→40 (the 4-aligned tail), 40→42.
    let (_, ttft, _) = serve(&mut e, 1, prompt.clone(), 3);
    assert_eq!(ttft, 120.0);
    let mut turn2 = prompt[..40].to_vec();
    turn2.extend(tokens(32, 2));
    // The tail state at 40 hits; 40→48 reaches the next block, 48→64, 64→72.
    let (_, ttft, reused) = serve(&mut e, 2, turn2, 2);
    assert_eq!((reused, ttft), (40, 120.0));
}

/// The flat engine args refuse what the state cache does not go with, as the reference's engine
/// config does: a KV transfer on an aggregated worker (which hands nothing off), sub-block
/// matching beside speculation.
#[test]
fn the_state_cache_refuses_what_it_does_not_go_with() {
    let base = r#""block_size": 16, "num_gpu_blocks": 64, "kv_cache_bytes_per_token": 8,
                  "state_cache": {"bytes_per_request": 512}"#;
    for (extra, want) in [
        (r#""kv_transfer_bandwidth": 10.0"#, "state_cache does not support kv_transfer_bytes_per_token"),
        (r#""kv_transfer_timing_mode": "destination_missing""#, "non-default kv_transfer_timing_mode"),
        (r#""prefix_match_unit": 4, "aic_nextn": 1"#, "prefix_match_unit does not support speculative decoding"),
    ] {
        let e = EngineConfig::parse_json(&format!("{{{base}, {extra}}}")).unwrap_err().to_string();
        assert!(e.contains(want), "{extra}: {e}");
    }
    assert!(EngineConfig::parse_json(&format!("{{{base}}}")).is_ok());
}

/// A disaggregated prefill worker hands the request state to the decode worker beside its KV:
/// the transfer carries the state's bytes, and the decode worker reserves the state's blocks
/// beside the prompt's, so a prompt that fits alone but not with its state is refused.
#[test]
fn a_decode_worker_reserves_the_handed_over_state_beside_the_prompt() {
    let role = |role: &str| {
        format!(
            r#"{{"block_size": 16, "num_gpu_blocks": 12, "kv_cache_bytes_per_token": 8, "worker_type": "{role}",
                "state_cache": {{"bytes_per_request": 500}}, "kv_transfer_bandwidth": 1.0,
                "kv_bytes_per_token": 1000, "timing_model": {{"type": "fixed", "prefill_ms": 40.0, "decode_ms": 10.0}}}}"#
        )
    };
    let args = servesim_engine::WorkerArgs::parse_json(&role("prefill")).unwrap();
    // 100 tokens x 1000 bytes and the 500-byte state over 1 GB/s.
    assert_eq!(args.deployment.kv_transfer.ms(100), 100_500.0 / 1e9 * 1000.0);
    let mut d = Engine::new(
        EngineConfig::parse_json(&role("decode")).unwrap(),
        EngineOptions { record_kv_events: false, engine_index: 0, timing_jitter: None },
    );
    // 128 tokens are 8 blocks and the state 4: 12 fit; 129 tokens need 13.
    assert!(d.accept_destination(request(1, tokens(129, 1), 2)).is_err());
    d.accept_destination(request(2, tokens(128, 2), 2)).unwrap();
    let reserved = d.retry_destination().expect("the prompt and its state fit");
    assert_eq!((reserved.request, reserved.reused_tokens), (2, 0));
    assert_eq!(d.active_blocks(), 12, "prompt blocks and state blocks");
}
