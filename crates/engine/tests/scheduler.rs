//! Scheduler behaviour through the public engine API: token stamps, admission, chunking,
//! preemption order, rejection, prefix reuse, block accounting and KV events.

use servesim_engine::{
    BlockHashes, Engine, EngineConfig, EngineOptions, EngineRequest, Finish, KvEvent, PassOutput, Prompt, RejectReason,
    SpecSchedule,
};

fn engine(json: &str) -> Engine {
    Engine::new(
        EngineConfig::parse_json(json).unwrap(),
        EngineOptions { record_kv_events: true, engine_index: 0, timing_jitter: None },
    )
}

fn tokens(n: u32, salt: u32) -> Vec<u32> {
    (0..n).map(|i| i * 7 + salt * 100_000).collect()
}

fn request(id: u64, prompt: Vec<u32>, max_output: u32) -> EngineRequest {
    EngineRequest::new(id, Prompt::Tokens(prompt.into()), max_output, id)
}

/// Runs passes back to back from `start` until idle; returns every pass.
fn run(e: &mut Engine, start: f64) -> Vec<PassOutput> {
    let mut passes = Vec::new();
    let mut now = start;
    while e.has_work() {
        let mut out = PassOutput::default();
        e.step(now, &mut out);
        now = out.end_ms;
        passes.push(out);
        assert!(passes.len() < 10_000, "engine does not finish");
    }
    passes
}

/// Token times of `id` across passes.
fn token_times(passes: &[PassOutput], id: u64) -> Vec<f64> {
    passes.iter().flat_map(|p| p.tokens.iter().filter(move |t| t.request == id).map(move |_| p.end_ms)).collect()
}

const FIXED: &str = r#""timing_model": {"type": "fixed", "prefill_ms": 40.0, "decode_ms": 10.0}"#;

#[test]
fn first_token_comes_from_the_prefill_pass() {
    // Observed probe c1: 100 prompt tokens, 5 output, fixed 40/10 ms.
    let mut e = engine(&format!(r#"{{"block_size": 16, "num_gpu_blocks": 1000, {FIXED}}}"#));
    e.submit(request(1, tokens(100, 1), 5));
    let passes = run(&mut e, 0.0);
    assert_eq!(token_times(&passes, 1), vec![40.0, 50.0, 60.0, 70.0, 80.0]);
    assert_eq!(passes.last().unwrap().finished[0].finish, Finish::Completed);
    assert_eq!(e.active_blocks(), 0);
}

#[test]
fn admission_waits_for_the_pass_boundary_and_reuses_computed_blocks() {
    // Observed probe c2.
    let mut e = engine(&format!(r#"{{"block_size": 16, "num_gpu_blocks": 1000, {FIXED}}}"#));
    let b_prompt = tokens(100, 2);
    e.submit(request(1, tokens(200, 1), 3));
    e.submit(request(2, b_prompt.clone(), 5));
    let mut out = PassOutput::default();
    e.step(0.0, &mut out);
    assert_eq!(out.end_ms, 40.0, "a prefill-only pass pays no decode time");
    // C arrives at 15 while the pass runs; it shares B's first 48 tokens.
    let mut c_prompt = b_prompt[..48].to_vec();
    c_prompt.extend(tokens(2, 3));
    e.submit(request(3, c_prompt, 4));
    let mut passes = vec![out];
    passes.extend(run(&mut e, 40.0));
    let admitted = &passes[1].admissions;
    assert_eq!((admitted[0].request, admitted[0].reused_tokens), (3, 48));
    assert_eq!(token_times(&passes, 1), vec![40.0, 90.0, 100.0]);
    assert_eq!(token_times(&passes, 2), vec![40.0, 90.0, 100.0, 110.0, 120.0]);
    assert_eq!(token_times(&passes, 3), vec![90.0, 100.0, 110.0, 120.0]);
}

#[test]
fn polynomial_decode_uses_context_of_decoding_requests() {
    // Observed probe c3: pass 2 = prefill(2 new tokens) + decode(p = (201 + 101) / 16000).
    let mut e = engine(r#"{"block_size": 16, "num_gpu_blocks": 1000}"#);
    let b_prompt = tokens(100, 2);
    e.submit(request(1, tokens(200, 1), 3));
    e.submit(request(2, b_prompt.clone(), 5));
    let mut out = PassOutput::default();
    e.step(0.0, &mut out);
    assert_eq!(out.end_ms, 21.094341999999997);
    let mut c_prompt = b_prompt[..48].to_vec();
    c_prompt.extend(tokens(2, 3));
    e.submit(request(3, c_prompt, 4));
    e.step(out.end_ms, &mut out);
    assert_eq!((out.decode.batch, out.decode.context_tokens), (2, 302));
    assert_eq!(out.end_ms, 44.376399);
}

#[test]
fn long_prompts_are_chunked_to_the_token_budget() {
    // Observed probe c4: 20,000 tokens at t=0, 300 at t=5, budget 8192.
    let mut e = engine(r#"{"block_size": 16, "num_gpu_blocks": 10000}"#);
    e.submit(request(1, tokens(20_000, 1), 3));
    let mut out = PassOutput::default();
    e.step(0.0, &mut out);
    assert_eq!(out.prefill_tokens, 8192);
    e.submit(request(2, tokens(300, 2), 3));
    e.step(out.end_ms, &mut out);
    assert_eq!(out.prefill_tokens, 8192);
    assert!(out.admissions.is_empty(), "no budget left for the short request");
    e.step(out.end_ms, &mut out);
    assert_eq!((out.prefill_tokens, out.admissions.len()), (3616 + 300, 1));
    assert_eq!(out.end_ms, 420.68964900000003);
    assert_eq!(out.tokens.len(), 2, "both first tokens in the pass that finishes both prompts");
}

fn small(mode: &str) -> Engine {
    engine(&format!(
        r#"{{"block_size": 4, "num_gpu_blocks": 6, "max_num_batched_tokens": 16, "max_num_seqs": 2,
            "enable_prefix_caching": false, "preemption_mode": "{mode}", {FIXED}}}"#
    ))
}

/// Steps until a pass preempts; returns the preempted ids and the pass count.
fn until_preemption(e: &mut Engine) -> (Vec<u64>, usize) {
    let mut out = PassOutput::default();
    let mut now = 0.0;
    for pass in 1..100 {
        e.step(now, &mut out);
        now = out.end_ms;
        if !out.preempted.is_empty() {
            return (out.preempted.clone(), pass);
        }
    }
    panic!("no preemption");
}

#[test]
fn lifo_preempts_the_newest_running_request() {
    let mut e = small("lifo");
    e.submit(request(1, tokens(8, 1), 8));
    e.submit(request(2, tokens(8, 2), 8));
    // Both hold 3 blocks after pass 2; in pass 6 r1 computes its 13th token and needs a 7th.
    let (victims, pass) = until_preemption(&mut e);
    assert_eq!((victims, pass), (vec![2], 6));
    assert_eq!((e.num_running(), e.num_waiting()), (1, 1));
    assert_eq!(e.counters().preemptions, 1);
    // The victim resumes and both finish with all their tokens.
    let passes = run(&mut e, 1000.0);
    assert_eq!(token_times(&passes, 2).len(), 8 - 5, "tokens generated before preemption are kept");
    assert!(passes.iter().flat_map(|p| &p.admissions).any(|a| a.request == 2 && a.readmission));
}

#[test]
fn fifo_preempts_the_oldest_running_request() {
    let mut e = small("fifo");
    e.submit(request(1, tokens(8, 1), 8));
    e.submit(request(2, tokens(8, 2), 8));
    let (victims, _) = until_preemption(&mut e);
    assert_eq!(victims, vec![1]);
}

#[test]
fn a_waiting_head_that_does_not_fit_blocks_the_queue() {
    let mut e = engine(&format!(
        r#"{{"block_size": 4, "num_gpu_blocks": 6, "max_num_batched_tokens": 32, "max_num_seqs": 3,
            "enable_prefix_caching": false, {FIXED}}}"#
    ));
    e.submit(request(1, tokens(16, 1), 1)); // holder: 4 blocks
    e.submit(request(2, tokens(12, 2), 1)); // needs 3 > 2 free
    e.submit(request(3, tokens(4, 3), 1)); // would fit, but strict FIFO
    let mut out = PassOutput::default();
    e.step(0.0, &mut out);
    let admitted: Vec<u64> = out.admissions.iter().map(|a| a.request).collect();
    assert_eq!(admitted, vec![1]);
    assert!(out.preempted.is_empty());
    e.step(out.end_ms, &mut out);
    let admitted: Vec<u64> = out.admissions.iter().map(|a| a.request).collect();
    assert_eq!(admitted, vec![2, 3]);
}

#[test]
fn requests_that_can_never_fit_are_rejected() {
    let mut e = engine(&format!(r#"{{"block_size": 4, "num_gpu_blocks": 4, "max_num_batched_tokens": 32, {FIXED}}}"#));
    e.submit(request(1, tokens(20, 1), 2)); // 5 blocks > 4
    e.submit(request(2, tokens(4, 2), 2));
    let mut out = PassOutput::default();
    e.step(0.0, &mut out);
    assert_eq!(out.finished[0].request, 1);
    assert_eq!(out.finished[0].finish, Finish::Rejected(RejectReason::ExceedsKvCapacity));
    assert_eq!(out.admissions[0].request, 2);
    assert_eq!(e.counters().preemptions, 0);
}

#[test]
fn max_model_len_rejects_long_prompts_and_stops_generation() {
    let mut e = engine(&format!(r#"{{"block_size": 4, "num_gpu_blocks": 100, "max_model_len": 10, {FIXED}}}"#));
    e.submit(request(1, tokens(10, 1), 5));
    e.submit(request(2, tokens(7, 2), 5));
    let passes = run(&mut e, 0.0);
    let rejected = passes[0].finished.iter().find(|f| f.request == 1).unwrap();
    assert_eq!(rejected.finish, Finish::Rejected(RejectReason::ExceedsMaxModelLen));
    assert_eq!(token_times(&passes, 2).len(), 3, "7 + 3 = max_model_len");
}

#[test]
fn without_chunked_prefill_prompts_wait_for_a_whole_budget() {
    let cfg = format!(
        r#"{{"block_size": 4, "num_gpu_blocks": 100, "max_num_batched_tokens": 16,
            "enable_chunked_prefill": false, {FIXED}}}"#
    );
    let mut e = engine(&cfg);
    e.submit(request(1, tokens(12, 1), 2));
    e.submit(request(2, tokens(8, 2), 2)); // 12 + 8 > 16: waits for the next pass
    e.submit(request(3, tokens(17, 3), 2)); // never fits in one pass
    let passes = run(&mut e, 0.0);
    assert_eq!(passes[0].admissions.len(), 1);
    assert_eq!(passes[1].admissions[0].request, 2);
    let f = passes.iter().flat_map(|p| &p.finished).find(|f| f.request == 3).unwrap();
    assert_eq!(f.finish, Finish::Rejected(RejectReason::ExceedsBatchBudget));
}

#[test]
fn zero_output_requests_complete_without_a_token() {
    let mut e = engine(&format!(r#"{{"block_size": 16, "num_gpu_blocks": 100, {FIXED}}}"#));
    e.submit(request(1, tokens(40, 1), 0));
    let passes = run(&mut e, 0.0);
    assert_eq!(passes.len(), 1);
    assert!(passes[0].tokens.is_empty());
    assert_eq!(passes[0].finished[0].finish, Finish::Completed);
    assert_eq!(e.active_blocks(), 0);
}

#[test]
fn blocks_computed_earlier_in_a_pass_are_reusable_in_that_pass() {
    let mut e = engine(&format!(r#"{{"block_size": 16, "num_gpu_blocks": 100, {FIXED}}}"#));
    e.submit(request(1, tokens(100, 1), 2));
    e.submit(request(2, tokens(100, 1), 2));
    let mut out = PassOutput::default();
    e.step(0.0, &mut out);
    let reused: Vec<u32> = out.admissions.iter().map(|a| a.reused_tokens).collect();
    assert_eq!(reused, vec![0, 96]);
}

#[test]
fn the_last_prompt_token_is_always_recomputed() {
    // A block-aligned prompt that is entirely cached still recomputes its last block.
    let mut e = engine(&format!(r#"{{"block_size": 16, "num_gpu_blocks": 100, {FIXED}}}"#));
    e.submit(request(1, tokens(64, 1), 1));
    run(&mut e, 0.0);
    e.submit(request(2, tokens(64, 1), 1));
    let passes = run(&mut e, 100.0);
    assert_eq!(passes[0].admissions[0].reused_tokens, 48);
    assert_eq!(passes[0].prefill_tokens, 16);
}

#[test]
fn decode_blocks_are_allocated_when_the_token_is_computed() {
    let mut e =
        engine(&format!(r#"{{"block_size": 4, "num_gpu_blocks": 100, "enable_prefix_caching": false, {FIXED}}}"#));
    e.submit(request(1, tokens(8, 1), 5));
    let mut out = PassOutput::default();
    e.step(0.0, &mut out);
    // The first generated token (position 8) has no block until the next pass computes it.
    assert_eq!(e.active_blocks(), 2);
    e.step(out.end_ms, &mut out);
    assert_eq!(e.active_blocks(), 3);
}

#[test]
fn kv_events_carry_dynamo_block_hashes() {
    let mut e = engine(&format!(r#"{{"block_size": 16, "num_gpu_blocks": 5, {FIXED}}}"#));
    let prompt = tokens(40, 1);
    let expected = BlockHashes::of_tokens(&prompt, 16);
    e.submit(request(1, prompt, 9));
    let passes = run(&mut e, 0.0);
    let KvEvent::Stored { parent, blocks } = &passes[0].kv_events[0] else { panic!("stored first") };
    assert_eq!(*parent, None);
    assert_eq!(blocks.iter().map(|b| b.hash).collect::<Vec<_>>(), expected.seq);
    assert_eq!(blocks.iter().map(|b| b.local).collect::<Vec<_>>(), expected.local);
    // Position 47 (the 8th generated token) completes the third block when the pass that
    // generates the 9th token computes it; the block is stored under the prompt's last block.
    let later: Vec<&KvEvent> = passes[1..].iter().flat_map(|p| &p.kv_events).collect();
    let [KvEvent::Stored { parent, blocks }] = later.as_slice() else { panic!("one more stored event: {later:?}") };
    assert_eq!(*parent, Some(expected.seq[1]));
    let generated_block = blocks[0].hash;

    // Another 5-block prompt evicts all three, least recently released (the leaf) first.
    e.submit(request(2, tokens(70, 2), 1));
    let passes = run(&mut e, 1000.0);
    let removed: Vec<u64> = passes
        .iter()
        .flat_map(|p| &p.kv_events)
        .flat_map(|ev| match ev {
            KvEvent::Removed { hashes } => hashes.clone(),
            _ => vec![],
        })
        .collect();
    assert_eq!(removed, vec![generated_block, expected.seq[1], expected.seq[0]]);
}

#[test]
fn a_preempted_request_reuses_its_own_cached_blocks() {
    let mut e = engine(&format!(
        r#"{{"block_size": 4, "num_gpu_blocks": 6, "max_num_batched_tokens": 16, "max_num_seqs": 2, {FIXED}}}"#
    ));
    e.submit(request(1, tokens(8, 1), 8));
    e.submit(request(2, tokens(8, 2), 8));
    let passes = run(&mut e, 0.0);
    let readmit = passes.iter().flat_map(|p| &p.admissions).find(|a| a.readmission).unwrap();
    assert_eq!(readmit.request, 2);
    assert!(readmit.reused_tokens >= 8, "its prompt blocks were still cached: {}", readmit.reused_tokens);
    assert_eq!(token_times(&passes, 1).len(), 8);
    assert_eq!(token_times(&passes, 2).len(), 8);
}

#[test]
fn speculative_decoding_emits_accepted_bursts() {
    // nextn 2 with drafts always accepted: a forward yields 3 tokens, the first one included.
    let mut e = engine(&format!(
        r#"{{"block_size": 4, "num_gpu_blocks": 8, "aic_nextn": 2, "aic_nextn_accept_rates": "1,1", {FIXED}}}"#
    ));
    e.submit(request(1, tokens(4, 1), 0));
    e.submit(request(2, tokens(4, 2), 3));
    let passes = run(&mut e, 0.0);
    assert_eq!(passes.len(), 1);
    assert_eq!(token_times(&passes, 2), vec![50.0, 50.0, 50.0], "one forward, three tokens");
    assert_eq!((passes[0].decode_forwards, passes[0].decode_tokens), (1, 3));
    assert_eq!(passes[0].finished.len(), 2);

    // Drafts never accepted: one token per forward.
    let mut e = engine(&format!(
        r#"{{"block_size": 4, "num_gpu_blocks": 8, "aic_nextn": 2, "aic_nextn_accept_rates": "0,0", {FIXED}}}"#
    ));
    e.submit(request(2, tokens(4, 2), 3));
    let passes = run(&mut e, 0.0);
    assert_eq!(token_times(&passes, 2), vec![50.0, 60.0, 70.0]);
}

#[test]
fn aisimulates_speculative_schedule_emits_the_first_token_alone_and_charges_drafts() {
    let spec = |json: &str| {
        let mut cfg = EngineConfig::parse_json(json).unwrap();
        cfg.speculative.as_mut().unwrap().schedule = SpecSchedule::Aisimulate;
        Engine::new(cfg, EngineOptions { record_kv_events: true, engine_index: 0, timing_jitter: None })
    };
    // Drafts always accepted: the first token comes out of the prefill alone (40 ms, no decode
    // forward), then one forward yields the other three.
    let mut e = spec(&format!(
        r#"{{"block_size": 4, "num_gpu_blocks": 16, "aic_nextn": 2, "aic_nextn_accept_rates": "1,1", {FIXED}}}"#
    ));
    e.submit(request(2, tokens(4, 2), 4));
    let passes = run(&mut e, 0.0);
    assert_eq!(token_times(&passes, 2), vec![40.0, 50.0, 50.0, 50.0]);
    assert_eq!((passes[1].decode_forwards, passes[1].decode_tokens), (1, 3));

    // A decoding request takes 1 + nextn tokens of the batch budget: with 8, request 1's two
    // drafts leave request 2's 8-token prompt 5 tokens in the next pass (Dynamo's schedule: 7).
    let json = format!(
        r#"{{"block_size": 4, "num_gpu_blocks": 64, "max_num_batched_tokens": 8, "aic_nextn": 2, "aic_nextn_accept_rates": "0,0", {FIXED}}}"#
    );
    let second_pass_prefill = |mut e: Engine| {
        e.submit(request(1, tokens(4, 1), 4));
        let mut first = PassOutput::default();
        e.step(0.0, &mut first);
        e.submit(request(2, tokens(8, 2), 4));
        let mut second = PassOutput::default();
        e.step(first.end_ms, &mut second);
        second.prefill_tokens
    };
    assert_eq!(second_pass_prefill(spec(&json)), 5);
    assert_eq!(second_pass_prefill(engine(&json)), 7);
}

#[test]
fn planned_output_tokens_are_emitted_as_given() {
    let mut e = engine(&format!(r#"{{"block_size": 4, "num_gpu_blocks": 100, {FIXED}}}"#));
    let mut r = request(1, tokens(6, 1), 99);
    r.planned_output = Some(vec![11, 22, 33, 44, 55].into());
    e.submit(r);
    let passes = run(&mut e, 0.0);
    let emitted: Vec<u32> = passes.iter().flat_map(|p| p.tokens.iter().map(|t| t.token)).collect();
    assert_eq!(emitted, vec![11, 22, 33, 44, 55], "the plan's length wins over max_output");
}

#[test]
fn reasoning_wraps_the_start_of_the_output() {
    let mut e = engine(&format!(
        r#"{{"block_size": 4, "num_gpu_blocks": 100, {FIXED},
            "reasoning": {{"start_thinking_token_id": 151667, "end_thinking_token_id": 151668, "thinking_ratio": 0.6}}}}"#
    ));
    e.submit(request(1, tokens(6, 1), 10));
    let passes = run(&mut e, 0.0);
    let emitted: Vec<u32> = passes.iter().flat_map(|p| p.tokens.iter().map(|t| t.token)).collect();
    assert_eq!(emitted.len(), 10);
    assert_eq!((emitted[0], emitted[5]), (151667, 151668));
    assert!(emitted.iter().enumerate().all(|(i, &t)| (i == 0 || i == 5) || (t != 151667 && t != 151668)));
}

#[test]
fn recomputing_generated_tokens_alone_is_progress_that_takes_no_time() {
    // r2 is preempted after generating tokens; once r1 is gone it recomputes its prompt and
    // then, with a 4-token budget, its generated tokens on their own: no prompt token, no
    // decode, so such passes take no time — yet they are progress, not an idle engine.
    let mut e = engine(&format!(
        r#"{{"block_size": 4, "num_gpu_blocks": 6, "max_num_batched_tokens": 4, "max_num_seqs": 2,
            "enable_prefix_caching": false, "preemption_mode": "lifo", {FIXED}}}"#
    ));
    e.submit(request(1, tokens(4, 1), 13));
    e.submit(request(2, tokens(4, 2), 12));
    let passes = run(&mut e, 0.0);
    let recompute: Vec<&PassOutput> = passes
        .iter()
        .filter(|p| p.computed_tokens > 0 && p.prefill.batch == 0 && p.tokens.is_empty() && p.admissions.is_empty())
        .collect();
    assert!(!recompute.is_empty(), "a pass recomputes generated tokens only");
    for p in recompute {
        assert_eq!(p.end_ms, p.start_ms);
        assert!(!p.is_empty());
    }
    assert_eq!((token_times(&passes, 1).len(), token_times(&passes, 2).len()), (13, 12));
}

#[test]
fn abort_frees_a_request_wherever_it_is() {
    // 10 blocks of 16: request 1 (100 tokens, 7 blocks) runs, request 2 (60 tokens) waits.
    let mut e = engine(&format!(r#"{{"block_size": 16, "num_gpu_blocks": 10, {FIXED}}}"#));
    e.submit(request(1, tokens(100, 1), 50));
    e.submit(request(2, tokens(60, 2), 5));
    let mut out = PassOutput::default();
    e.step(0.0, &mut out);
    assert_eq!((e.num_running(), e.num_waiting()), (1, 1));
    let held = e.active_blocks();
    assert!(held >= 7, "request 1 holds its prompt blocks: {held}");
    assert!(e.abort(1), "running request");
    assert_eq!((e.num_running(), e.active_blocks()), (0, 0), "its blocks are free at once");
    assert!(!e.abort(1), "already gone");
    // The waiting request now fits; the aborted one never produces output again.
    let passes = run(&mut e, out.end_ms);
    assert!(passes.iter().all(|p| p.tokens.iter().all(|t| t.request == 2)));
    assert_eq!(token_times(&passes, 2).len(), 5);
    // A waiting request can be aborted too, and a freed prompt stays cached.
    e.submit(request(3, tokens(100, 1), 5));
    assert!(e.abort(3));
    assert!(!e.has_work());
    e.submit(request(4, tokens(100, 1), 1));
    e.step(1000.0, &mut out);
    assert_eq!(out.admissions[0].reused_tokens, 96, "request 1's computed blocks are still cached");
}

#[test]
fn stored_tokens_are_the_blocks_of_stored_events() {
    let mut e = engine(&format!(r#"{{"block_size": 4, "num_gpu_blocks": 100, {FIXED}}}"#));
    e.set_record_block_tokens(true);
    e.set_output_vocabulary(Some(vec![5000, 5001, 5002].into()));
    let prompt = tokens(10, 3);
    e.submit(request(1, prompt.clone(), 6));
    let passes = run(&mut e, 0.0);
    let mut all_tokens = Vec::new();
    let mut stored_hashes = Vec::new();
    for p in &passes {
        let blocks: usize =
            p.kv_events.iter().map(|ev| if let KvEvent::Stored { blocks, .. } = ev { blocks.len() } else { 0 }).sum();
        assert_eq!(p.stored_tokens.len(), blocks * 4);
        all_tokens.extend_from_slice(&p.stored_tokens);
        for ev in &p.kv_events {
            if let KvEvent::Stored { blocks, .. } = ev {
                stored_hashes.extend(blocks.iter().map(|b| b.hash));
            }
        }
    }
    let generated: Vec<u32> = passes.iter().flat_map(|p| p.tokens.iter().map(|t| t.token)).collect();
    assert!(generated.iter().all(|t| (5000..=5002).contains(t)), "{generated:?}");
    // 16 tokens known, the last is never computed: 3 full blocks are stored, prompt then output.
    let sequence: Vec<u32> = prompt.iter().copied().chain(generated.iter().copied()).collect();
    assert_eq!(all_tokens, sequence[..12].to_vec());
    assert_eq!(stored_hashes, BlockHashes::of_tokens(&all_tokens, 4).seq);
}

#[test]
fn abort_frees_reserved_and_held_requests() {
    // Prefill worker: a finished request holds its KV until released; abort frees it instead.
    let mut p = engine(&format!(r#"{{"block_size": 16, "num_gpu_blocks": 100, "is_prefill": true, {FIXED}}}"#));
    p.submit(request(1, tokens(64, 1), 1));
    let passes = run(&mut p, 0.0);
    assert_eq!(passes.last().unwrap().finished[0].finish, Finish::Completed);
    assert_eq!(p.active_blocks(), 4, "held for the decode side");
    assert!(p.abort(1));
    assert_eq!(p.active_blocks(), 0);
    // Decode worker: blocks reserved for a transfer in flight are freed by an abort.
    let mut d = engine(&format!(r#"{{"block_size": 16, "num_gpu_blocks": 100, "is_decode": true, {FIXED}}}"#));
    d.accept_destination(request(2, tokens(64, 2), 5)).unwrap();
    assert_eq!(d.retry_destination().map(|r| (r.request, r.reused_tokens)), Some((2, 0)));
    assert_eq!(d.active_blocks(), 4);
    assert!(d.abort(2));
    assert_eq!(d.active_blocks(), 0);
    assert!(!d.has_work());
}

#[test]
fn destinations_are_tried_oldest_first_once_per_capacity_change() {
    // A decode worker of 10 blocks of 16: request 1 (8 blocks) runs; 2 and 3 (4 blocks each)
    // wait for blocks.
    let mut d = engine(&format!(r#"{{"block_size": 16, "num_gpu_blocks": 10, "is_decode": true, {FIXED}}}"#));
    for (id, len) in [(1, 128), (2, 64), (3, 64)] {
        d.accept_destination(request(id, tokens(len, id as u32), 3)).unwrap();
    }
    assert_eq!(d.retry_destination().map(|r| r.request), Some(1), "one reservation per attempt");
    assert_eq!(d.retry_destination(), None, "2 does not fit");
    assert_eq!(d.num_waiting(), 2);
    d.activate(1);
    // Nothing freed capacity since 2 failed: not tried again.
    assert_eq!(d.retry_destination(), None);
    let mut now = 0.0;
    let mut reserved = Vec::new();
    while d.has_work() {
        let mut p = PassOutput::default();
        d.step(now, &mut p);
        now = p.end_ms;
        // As a driver does: one attempt after every pass.
        if let Some(r) = d.retry_destination() {
            reserved.push((r.request, now));
            d.activate(r.request);
        }
    }
    // Request 1 finishes in the pass ending at 30 ms (3 tokens); only then is 2 tried, and 3 at
    // the end of the next pass (a single attempt per pass).
    assert_eq!(reserved, vec![(2, 30.0), (3, 40.0)]);
    // A prompt larger than the cache is refused at once.
    let e = d.accept_destination(request(4, tokens(200, 4), 1)).unwrap_err();
    assert_eq!(e, RejectReason::ExceedsKvCapacity);
}

/// vLLM's async scheduling: pass k+1 is scheduled when pass k starts, so a request that arrives
/// while pass k runs is first computed in pass k+2; one that finds the engine idle, or a pass that
/// left nothing running, is scheduled at once.
#[test]
fn async_scheduling_admits_a_request_arriving_mid_pass_one_pass_later() {
    // Returns the passes and the first-token time of request 2, submitted after pass `at`.
    let first_token_of_late = |async_scheduling: bool, at: usize| {
        let mut e = engine(&format!(
            r#"{{"block_size": 16, "num_gpu_blocks": 1000, "async_scheduling": {async_scheduling}, {FIXED}}}"#
        ));
        e.submit(request(1, tokens(100, 1), 5));
        let (mut now, mut passes) = (0.0, Vec::new());
        loop {
            if passes.len() == at {
                e.submit(request(2, tokens(50, 2), 2));
            }
            if !e.has_work() {
                break;
            }
            let mut out = PassOutput::default();
            e.step(now, &mut out);
            now = out.end_ms;
            passes.push(out);
        }
        token_times(&passes, 2)[0]
    };
    // Submitted during pass 1 (the prefill, 0–40): the synchronous engine computes it in pass 2
    // (40–90, prefill plus decode); the async one had scheduled pass 2 as a decode (40–50) and
    // computes it in pass 3 (50–100).
    assert_eq!(first_token_of_late(false, 1), 90.0);
    assert_eq!(first_token_of_late(true, 1), 100.0);
    // Before anything runs, both schedule it into the first pass.
    assert_eq!(first_token_of_late(true, 0), first_token_of_late(false, 0));
    // Request 1 finishes in pass 5 (its 5th token): nothing was scheduled ahead of pass 6.
    assert_eq!(first_token_of_late(true, 5), first_token_of_late(false, 5));
    // Only vLLM's scheduler is modelled.
    let e = EngineConfig::parse_json(r#"{"engine_type": "sglang", "async_scheduling": true}"#).unwrap_err();
    assert_eq!(e.path, "async_scheduling");
    assert!(e.message.contains("only for backend=vllm"), "{}", e.message);
}
