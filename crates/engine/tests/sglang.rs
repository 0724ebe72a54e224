//! The SGLang-style scheduler: extend/decode passes, chunking, prefix reuse, LPM ordering,
//! retraction and KV events.

use servesim_engine::{
    BlockHashes, Engine, EngineConfig, EngineOptions, EngineRequest, Finish, KvEvent, PassOutput, Prompt, RejectReason,
};

const FIXED: &str = r#""timing_model": {"type": "fixed", "prefill_ms": 40.0, "decode_ms": 10.0}"#;

fn engine(extra: &str) -> Engine {
    let json = format!(r#"{{"engine_type": "sglang", {FIXED}, {extra}}}"#);
    Engine::new(
        EngineConfig::parse_json(&json).unwrap(),
        EngineOptions { record_kv_events: true, engine_index: 0, timing_jitter: None },
    )
}

fn tokens(n: u32, salt: u32) -> Vec<u32> {
    (0..n).map(|i| i * 7 + salt * 100_000).collect()
}

fn request(id: u64, prompt: Vec<u32>, max_output: u32) -> EngineRequest {
    EngineRequest::new(id, Prompt::Tokens(prompt.into()), max_output, id)
}

fn step(e: &mut Engine, now: f64) -> PassOutput {
    let mut out = PassOutput::default();
    e.step(now, &mut out);
    out
}

fn ids(v: impl IntoIterator<Item = u64>) -> Vec<u64> {
    v.into_iter().collect()
}

#[test]
fn an_extend_pass_only_produces_first_tokens() {
    let mut e = engine(r#""block_size": 16, "num_gpu_blocks": 1000"#);
    e.submit(request(1, tokens(200, 1), 3));
    let p1 = step(&mut e, 0.0);
    assert_eq!((p1.end_ms, ids(p1.tokens.iter().map(|t| t.request))), (40.0, vec![1]));
    e.submit(request(2, tokens(50, 2), 3));
    // The new prompt takes the pass; the running request gets nothing and no decode is paid.
    let p2 = step(&mut e, 40.0);
    assert_eq!((p2.end_ms, ids(p2.tokens.iter().map(|t| t.request))), (80.0, vec![2]));
    let p3 = step(&mut e, 80.0);
    assert_eq!((p3.end_ms, ids(p3.tokens.iter().map(|t| t.request))), (90.0, vec![1, 2]));
    assert_eq!((p3.decode.batch, p3.decode.context_tokens), (2, 201 + 51));
}

#[test]
fn prompts_are_cut_at_a_page_boundary_when_the_chunk_budget_runs_out() {
    let mut e = engine(r#""block_size": 64, "num_gpu_blocks": 1000, "sglang": {"chunked_prefill_size": 1024}"#);
    e.submit(request(1, tokens(1000, 1), 2));
    e.submit(request(2, tokens(600, 2), 2));
    let p = step(&mut e, 0.0);
    // 1000 tokens charge 1024 (16 pages): nothing is left for the second prompt.
    assert_eq!((p.prefill_tokens, p.admissions.len()), (1000, 1));
    e.submit(request(3, tokens(900, 3), 2));
    let p = step(&mut e, p.end_ms);
    // 600 (charged 640) fits; the next prompt is cut to the 384 tokens left.
    assert_eq!(p.prefill_tokens, 600 + 384);
    assert_eq!(ids(p.tokens.iter().map(|t| t.request)), vec![2]);
}

#[test]
fn prefix_reuse_stops_before_the_last_token() {
    let mut e = engine(r#""block_size": 1, "num_gpu_blocks": 10000"#);
    e.submit(request(1, tokens(50, 1), 2));
    let mut now = 0.0;
    while e.has_work() {
        now = step(&mut e, now).end_ms;
    }
    e.submit(request(2, tokens(50, 1), 2));
    let p = step(&mut e, now);
    assert_eq!(p.admissions[0].reused_tokens, 49);
    assert_eq!(p.prefill_tokens, 1);
}

#[test]
fn lpm_admits_the_longest_cached_prefix_first() {
    let run = |policy: &str| {
        let mut e = engine(&format!(
            r#""block_size": 16, "num_gpu_blocks": 1000, "max_num_seqs": 1, "sglang": {{"schedule_policy": "{policy}"}}"#
        ));
        e.submit(request(1, tokens(160, 1), 1));
        let now = step(&mut e, 0.0).end_ms;
        e.submit(request(2, tokens(160, 2), 1));
        e.submit(request(3, tokens(160, 1), 1));
        step(&mut e, now).admissions[0].request
    };
    assert_eq!(run("fifo"), 2);
    assert_eq!(run("lpm"), 3, "request 3 shares request 1's cached prompt");
}

#[test]
fn retraction_takes_the_request_with_the_fewest_tokens() {
    // 10 pages of 4 tokens; two requests that need 6 pages each by the end.
    let mut e = engine(
        r#""block_size": 4, "num_gpu_blocks": 10, "enable_prefix_caching": false,
           "sglang": {"clip_max_new_tokens": 1, "schedule_conservativeness": 0.1}"#,
    );
    e.submit(request(1, tokens(8, 1), 16));
    let mut now = step(&mut e, 0.0).end_ms;
    now = step(&mut e, now).end_ms;
    e.submit(request(2, tokens(12, 2), 16));
    let mut retracted = Vec::new();
    let mut done = Vec::new();
    for _ in 0..100 {
        if !e.has_work() {
            break;
        }
        let p = step(&mut e, now);
        now = p.end_ms;
        retracted.extend(p.preempted);
        done.extend(p.finished.iter().filter(|f| f.finish == Finish::Completed).map(|f| f.request));
    }
    assert_eq!(retracted.first(), Some(&2), "the younger request is retracted");
    assert_eq!(done.len(), 2, "both finish eventually");
    assert_eq!(e.counters().preemptions, retracted.len() as u64);
}

#[test]
fn a_request_that_can_never_fit_is_rejected() {
    let mut e = engine(r#""block_size": 4, "num_gpu_blocks": 8"#);
    e.submit(request(1, tokens(64, 1), 4));
    let mut now = 0.0;
    let mut finished = Vec::new();
    for _ in 0..10 {
        if !e.has_work() {
            break;
        }
        let p = step(&mut e, now);
        now = p.end_ms;
        finished.extend(p.finished);
    }
    assert_eq!(finished.len(), 1);
    assert_eq!(finished[0].finish, Finish::Rejected(RejectReason::ExceedsKvCapacity));
    assert!(!e.has_work());
}

#[test]
fn kv_events_use_chained_page_hashes() {
    let mut e = engine(r#""block_size": 16, "num_gpu_blocks": 100"#);
    let prompt = tokens(40, 1);
    let expected = BlockHashes::of_tokens(&prompt, 16);
    e.submit(request(1, prompt, 2));
    let p = step(&mut e, 0.0);
    let stored: Vec<u64> = p
        .kv_events
        .iter()
        .flat_map(|ev| match ev {
            KvEvent::Stored { blocks, .. } => blocks.iter().map(|b| b.hash).collect(),
            _ => vec![],
        })
        .collect();
    assert_eq!(stored, expected.seq);
}

#[test]
fn abort_releases_pages_and_keeps_the_cached_prefix() {
    let mut e = engine(r#""block_size": 16, "num_gpu_blocks": 100"#);
    e.set_record_block_tokens(true);
    e.submit(request(1, tokens(64, 1), 100));
    e.submit(request(2, tokens(64, 2), 3));
    let p = step(&mut e, 0.0);
    assert_eq!(p.stored_tokens.len(), 8 * 16, "both prompts' pages are stored with their tokens");
    assert_eq!(&p.stored_tokens[..64], &tokens(64, 1)[..]);
    assert!(e.abort(1));
    assert!(!e.abort(1));
    assert_eq!(e.num_running(), 1);
    let mut now = p.end_ms;
    while e.has_work() {
        let p = step(&mut e, now);
        assert!(p.tokens.iter().all(|t| t.request == 2));
        now = p.end_ms;
    }
    // Nothing is held any more; request 1's prompt pages are reusable.
    assert_eq!(e.active_blocks(), 0);
    e.submit(request(3, tokens(64, 1), 1));
    let p = step(&mut e, now);
    assert_eq!(p.admissions[0].reused_tokens, 48, "the cached prefix, less the recomputed last page");
}

/// Runs the engine until it has no work; returns every pass.
fn run(e: &mut Engine) -> Vec<PassOutput> {
    let (mut now, mut passes) = (0.0, Vec::new());
    while e.has_work() {
        let p = step(e, now);
        now = p.end_ms;
        passes.push(p);
        assert!(passes.len() < 10_000, "the engine stopped making progress");
    }
    passes
}

#[test]
fn a_lone_request_blocked_by_a_chunked_prompt_is_refused_with_the_true_reason() {
    // 10 pages of 16. A (100 + 100) is admitted with a clipped output reserve of 8 tokens; B's
    // first 16-token chunk takes the rest of the chunk budget and holds a page. A then grows into
    // the last free pages and needs the one B holds: SGLang stops for good here (the reference
    // spins forever). servesim refuses A and says why — it would fit in the cache on its own.
    let mut e = engine(
        r#""block_size": 16, "num_gpu_blocks": 10, "sglang": {"chunked_prefill_size": 128, "clip_max_new_tokens": 8}"#,
    );
    e.submit(request(1, tokens(100, 1), 100));
    e.submit(request(2, tokens(120, 2), 4));
    let passes = run(&mut e);
    let finished: Vec<_> = passes.iter().flat_map(|p| p.finished.iter().copied()).collect();
    assert_eq!(finished[0].request, 1);
    assert_eq!(finished[0].finish, Finish::Rejected(RejectReason::KvHeldElsewhere));
    assert!(RejectReason::KvHeldElsewhere.describe().contains("partially prefilled"));
    // A had generated up to the 10th page: 144 tokens fit in 9 pages, the 145th needs a 10th.
    let a_tokens = passes.iter().flat_map(|p| &p.tokens).filter(|t| t.request == 1).count();
    assert_eq!(a_tokens, 144 - 100);
    assert_eq!(finished[1].request, 2);
    assert_eq!(finished[1].finish, Finish::Completed);
}

#[test]
fn a_chunk_larger_than_max_prefill_tokens_is_refused_as_such() {
    let mut e = engine(r#""block_size": 16, "num_gpu_blocks": 1000, "sglang": {"max_prefill_tokens": 256}"#);
    e.submit(request(1, tokens(600, 1), 4));
    let finished: Vec<_> = run(&mut e).iter().flat_map(|p| p.finished.iter().copied()).collect();
    assert_eq!(finished[0].finish, Finish::Rejected(RejectReason::ExceedsPrefillBudget));
}

#[test]
fn first_token_slots_are_all_or_none_and_retraction_requeues_at_the_back() {
    // 8 pages of 16; with a 1-token output reserve three 32-token prompts are admitted together
    // (6 pages). Their first tokens need a page each and only 2 are free: SGLang gives none of
    // them a slot, so the first tokens wait for the next (decode) pass.
    let mut e = engine(r#""block_size": 16, "num_gpu_blocks": 8, "sglang": {"clip_max_new_tokens": 1}"#);
    e.submit(request(1, tokens(32, 1), 40));
    e.submit(request(2, tokens(32, 2), 3));
    e.submit(request(3, tokens(32, 3), 3));
    let p1 = step(&mut e, 0.0);
    assert_eq!(ids(p1.admissions.iter().map(|a| a.request)), vec![1, 2, 3]);
    assert!(p1.tokens.is_empty());
    // Request 4 does not fit yet. Decoding, the three still need a page each: the first of those
    // with the fewest outputs is retracted, and the other two sample their first tokens.
    e.submit(request(4, tokens(48, 4), 2));
    let p2 = step(&mut e, p1.end_ms);
    assert_eq!(p2.preempted, vec![1]);
    assert_eq!(ids(p2.tokens.iter().map(|t| t.request)), vec![2, 3]);
    // The retracted request queued behind request 4: once 2 and 3 finish, 4 is admitted first.
    let mut now = p2.end_ms;
    let admitted = loop {
        let p = step(&mut e, now);
        now = p.end_ms;
        if !p.admissions.is_empty() {
            break ids(p.admissions.iter().map(|a| a.request));
        }
    };
    assert_eq!(admitted, vec![4, 1]);
}

/// A prefill worker keeps a finished prompt (and its pages) until the decode side has the KV.
/// With `cache_held_prompts` (aisimulate) the pages are in the radix cache meanwhile, so a prompt
/// sharing the prefix reuses them before the hold is released; without it (Dynamo) only after.
#[test]
fn a_held_prompt_is_cached_while_its_kv_moves_when_asked() {
    for (cache_held, reused) in [(true, 144), (false, 0)] {
        let mut cfg = EngineConfig::parse_json(&format!(
            r#"{{"engine_type": "sglang", {FIXED}, "block_size": 16, "num_gpu_blocks": 1000, "worker_type": "prefill"}}"#
        ))
        .unwrap();
        cfg.sglang.cache_held_prompts = cache_held;
        let mut e = Engine::new(cfg, EngineOptions { record_kv_events: true, engine_index: 0, timing_jitter: None });
        e.submit(request(1, tokens(160, 1), 1));
        let p1 = step(&mut e, 0.0);
        assert_eq!(ids(p1.finished.iter().map(|f| f.request)), vec![1]);
        let mut second = tokens(160, 1);
        second[150..].iter_mut().for_each(|t| *t += 1);
        e.submit(request(2, second, 1));
        let p2 = step(&mut e, p1.end_ms);
        assert_eq!(p2.admissions[0].reused_tokens, reused, "the held prompt's nine full pages, if cached");
        e.release_held(1);
        e.release_held(2);
        assert!(!e.has_work());
    }
}

fn host_loop_engine() -> Engine {
    let mut cfg = EngineConfig::parse_json(&format!(
        r#"{{"engine_type": "sglang", {FIXED}, "block_size": 16, "num_gpu_blocks": 1000}}"#
    ))
    .unwrap();
    cfg.sglang.host_loop = true;
    Engine::new(cfg, EngineOptions { record_kv_events: false, engine_index: 0, timing_jitter: None })
}

fn token_ids(p: &PassOutput) -> Vec<u64> {
    ids(p.tokens.iter().map(|t| t.request))
}

/// The host loop (aisimulate's replay of SGLang's overlap scheduler), as the reference runs
/// it (probed with fixed timing, 10 ms prefill and 3 ms decode passes, here scaled to 40 and
/// 10): a request that arrives while a pass runs is received when the next pass begins and is
/// prefilled in the pass after that; a request whose last token came from a pass is still in the
/// next decode batch, which runs even with nobody else in it. Without the loop the arrival is
/// prefilled in the very next pass.
#[test]
fn the_host_loop_receives_at_pass_boundaries_and_sees_finishes_one_pass_late() {
    let mut e = host_loop_engine();
    e.submit(request(1, tokens(64, 1), 1));
    let p = step(&mut e, 0.0);
    assert_eq!((p.end_ms, token_ids(&p), ids(p.finished.iter().map(|f| f.request))), (40.0, vec![1], vec![1]));
    // Arrives at 20, during the prefill.
    e.submit(request(2, tokens(64, 2), 2));
    let p = step(&mut e, 40.0);
    assert_eq!((p.end_ms, token_ids(&p), p.decode.batch, p.prefill_tokens), (50.0, vec![], 1, 0));
    let p = step(&mut e, 50.0);
    assert_eq!((p.end_ms, token_ids(&p)), (90.0, vec![2]));
    let p = step(&mut e, 90.0);
    assert_eq!((p.end_ms, token_ids(&p), p.decode.batch), (100.0, vec![2], 1));
    // Request 2's phantom pass, then nothing.
    let p = step(&mut e, 100.0);
    assert_eq!((p.end_ms, token_ids(&p), p.decode.batch), (110.0, vec![], 1));
    assert!(!e.has_work());

    // A request that arrives during the phantom pass, when the loop has nothing else to run,
    // is received when that pass ends and runs at once.
    let mut e = host_loop_engine();
    e.submit(request(1, tokens(64, 1), 2));
    assert_eq!(step(&mut e, 0.0).end_ms, 40.0);
    assert_eq!(token_ids(&step(&mut e, 40.0)), vec![1]);
    assert_eq!(step(&mut e, 50.0).decode.batch, 1);
    e.submit(request(2, tokens(64, 2), 2));
    let p = step(&mut e, 60.0);
    assert_eq!((p.end_ms, token_ids(&p)), (100.0, vec![2]));

    // The plain scheduler prefills the arrival in the next pass.
    let mut e = engine(r#""block_size": 16, "num_gpu_blocks": 1000"#);
    e.submit(request(1, tokens(64, 1), 1));
    step(&mut e, 0.0);
    e.submit(request(2, tokens(64, 2), 2));
    let p = step(&mut e, 40.0);
    assert_eq!((p.end_ms, token_ids(&p)), (80.0, vec![2]));
}

/// The host loop reports when it received each request (at the start of a pass) and when it
/// formed a pass's batch (while the pass before ran), as the reference's `scheduler_received_ms`
/// and admission times; a batch formed while a request's last pass ran counts it among the
/// running ones (probed on the reference: one running slot, a request received while another
/// decodes is admitted when that one's phantom pass begins and prefilled after it).
#[test]
fn the_host_loop_reports_receipts_and_when_it_formed_each_batch() {
    let mut cfg = EngineConfig::parse_json(&format!(
        r#"{{"engine_type": "sglang", {FIXED}, "block_size": 16, "num_gpu_blocks": 1000, "max_num_seqs": 1}}"#
    ))
    .unwrap();
    cfg.sglang.host_loop = true;
    let mut e = Engine::new(cfg, EngineOptions { record_kv_events: false, engine_index: 0, timing_jitter: None });
    e.submit(request(1, tokens(64, 1), 2));
    let p = step(&mut e, 0.0);
    assert_eq!(
        (p.received.clone(), p.formed_ms, ids(p.admissions.iter().map(|a| a.request))),
        (vec![1], None, vec![1])
    );
    // Arrives at 20, during the prefill: received when the next pass begins, after its batch.
    e.submit(request(2, tokens(64, 2), 2));
    let p = step(&mut e, 40.0);
    assert_eq!((p.received.clone(), p.formed_ms, token_ids(&p)), (vec![2], Some(0.0), vec![1]));
    // Request 1 finished at 50 but held the only slot when this batch was formed (at 40): its
    // phantom pass runs alone, and request 2 waits (it is not refused).
    let p = step(&mut e, 50.0);
    assert_eq!((p.end_ms, p.admissions.len(), p.finished.len(), p.prefill_tokens), (60.0, 0, 0, 0));
    let p = step(&mut e, 60.0);
    assert_eq!((p.formed_ms, ids(p.admissions.iter().map(|a| a.request)), p.end_ms), (Some(50.0), vec![2], 100.0));
    assert!(p.received.is_empty());

    // Without the loop nothing is reported.
    let mut e = engine(r#""block_size": 16, "num_gpu_blocks": 1000"#);
    e.submit(request(1, tokens(64, 1), 2));
    let p = step(&mut e, 0.0);
    assert_eq!((p.received.len(), p.formed_ms), (0, None));
}
