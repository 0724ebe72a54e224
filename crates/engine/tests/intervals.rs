//! The prefill cadences of Dynamo 1.6.1's schedulers (aisimulate-core 0.13.0):
//! `prefill_schedule_interval` (vLLM with attention DP: new prefill work only on every n-th
//! pass of the worker while a rank decodes) and `prefill_decode_interval` (SGLang: n passes
//! without prefill after any rank prefilled). Whole runs are pinned against the reference by
//! the parity cases `tests/parity/y_*interval*` and `tests/parity/engine_args/*interval*`.

use servesim_engine::{Engine, EngineConfig, EngineOptions, EngineRequest, PassOutput, Prompt};

const FIXED: &str = r#""timing_model": {"type": "fixed", "prefill_ms": 40.0, "decode_ms": 10.0}"#;

fn engine(engine_keys: &str) -> Engine {
    let json = format!(r#"{{"engine": {{{FIXED}, {engine_keys}}}}}"#);
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

/// One pass of rank `e` as pass `wave` of a worker of `dp` ranks (the other ranks idle).
fn group_step(e: &mut Engine, wave: u64, dp: u32, now: f64) -> PassOutput {
    let mut out = PassOutput::default();
    e.begin_group_pass(wave, dp);
    e.step(now, &mut out);
    let (prefilled, ran) = (e.prefilled_in_pass(), e.ran_model_in_pass());
    e.end_group_pass(prefilled, ran);
    out
}

fn step(e: &mut Engine, now: f64) -> PassOutput {
    let mut out = PassOutput::default();
    e.step(now, &mut out);
    out
}

fn admitted(out: &PassOutput) -> Vec<u64> {
    out.admissions.iter().map(|a| a.request).collect()
}

fn sampled(out: &PassOutput) -> Vec<u64> {
    out.tokens.iter().map(|t| t.request).collect()
}

const VLLM: &str = r#""block_size": 16, "num_gpu_blocks": 1000"#;

#[test]
fn vllm_attention_dp_prefills_only_on_cadence_passes_while_decoding() {
    let mut e = engine(&format!(r#"{VLLM}, "prefill_schedule_interval": 3"#));
    e.submit(request(1, tokens(100, 1), 20));
    // Pass 0 is a cadence pass; nothing decodes yet anyway.
    let p = group_step(&mut e, 0, 2, 0.0);
    assert_eq!((admitted(&p), p.end_ms), (vec![1], 40.0));
    e.submit(request(2, tokens(100, 2), 20));
    // Passes 1 and 2: request 1 decodes, request 2 waits.
    for wave in 1..3 {
        let p = group_step(&mut e, wave, 2, p.end_ms);
        assert_eq!((admitted(&p), sampled(&p), p.prefill_tokens), (vec![], vec![1], 0), "pass {wave}");
    }
    // Pass 3 is the next cadence pass.
    let p = group_step(&mut e, 3, 2, 60.0);
    assert_eq!((admitted(&p), sampled(&p), p.prefill_tokens), (vec![2], vec![1, 2], 100));
}

#[test]
fn vllm_without_attention_dp_or_group_never_throttles() {
    for dp in [None, Some(1)] {
        let mut e = engine(&format!(r#"{VLLM}, "prefill_schedule_interval": 4"#));
        e.submit(request(1, tokens(100, 1), 20));
        let first = match dp {
            Some(dp) => group_step(&mut e, 0, dp, 0.0),
            None => step(&mut e, 0.0),
        };
        e.submit(request(2, tokens(100, 2), 20));
        let p = match dp {
            Some(dp) => group_step(&mut e, 1, dp, first.end_ms),
            None => step(&mut e, first.end_ms),
        };
        assert_eq!(admitted(&p), vec![2], "dp {dp:?}");
    }
}

#[test]
fn vllm_a_chunked_prompt_waits_for_the_cadence_too() {
    let mut e = engine(&format!(r#"{VLLM}, "max_num_batched_tokens": 64, "prefill_schedule_interval": 2"#));
    e.submit(request(1, tokens(40, 1), 20));
    let p = group_step(&mut e, 0, 2, 0.0);
    assert_eq!(admitted(&p), vec![1]);
    e.submit(request(2, tokens(200, 2), 20));
    // Pass 1 throttles: request 2 is not admitted.
    let p = group_step(&mut e, 1, 2, 40.0);
    assert_eq!((admitted(&p), p.prefill_tokens), (vec![], 0));
    // Pass 2: admitted with the 63 tokens left of the budget (request 1 takes one).
    let p = group_step(&mut e, 2, 2, 50.0);
    assert_eq!((admitted(&p), p.prefill_tokens), (vec![2], 63));
    // Pass 3 throttles again: the running request's next chunk waits; request 1 decodes.
    let p = group_step(&mut e, 3, 2, 100.0);
    assert_eq!((p.prefill_tokens, sampled(&p)), (0, vec![1]));
    let p = group_step(&mut e, 4, 2, 110.0);
    assert_eq!(p.prefill_tokens, 63);
}

#[test]
fn vllm_a_near_total_prefix_hit_is_admitted_on_a_throttled_pass() {
    let mut e = engine(&format!(r#"{VLLM}, "prefill_schedule_interval": 4"#));
    // 65 tokens: four full cached blocks, and the last token to recompute.
    let prompt = tokens(65, 1);
    e.submit(request(1, prompt.clone(), 20));
    group_step(&mut e, 0, 2, 0.0);
    // One token to compute: admitted at once. Two: waits for the cadence.
    e.submit(request(2, prompt.clone(), 20));
    let mut longer = prompt.clone();
    longer.push(9);
    e.submit(request(3, longer, 20));
    let p = group_step(&mut e, 1, 2, 40.0);
    assert_eq!((admitted(&p), p.prefill_tokens), (vec![2], 1));
    let p = group_step(&mut e, 2, 2, 50.0);
    assert!(admitted(&p).is_empty());
    let p = group_step(&mut e, 4, 2, 60.0);
    assert_eq!((admitted(&p), p.prefill_tokens), (vec![3], 2));
}

#[test]
fn vllm_a_capacity_bound_rank_is_not_throttled() {
    // Two running slots. Pass 0 leaves request 3 waiting: the rank is capacity-bound, so when
    // request 1 finishes, request 3 takes its slot at the next pass although it is off-cadence.
    let mut e = engine(&format!(r#"{VLLM}, "max_num_seqs": 2, "prefill_schedule_interval": 4"#));
    e.submit(request(1, tokens(50, 1), 2));
    e.submit(request(2, tokens(50, 2), 20));
    e.submit(request(3, tokens(50, 3), 20));
    let p = group_step(&mut e, 0, 2, 0.0);
    assert_eq!(admitted(&p), vec![1, 2]);
    let p = group_step(&mut e, 1, 2, 40.0);
    assert_eq!((admitted(&p), p.finished.len()), (vec![], 1));
    let p = group_step(&mut e, 2, 2, 50.0);
    assert_eq!(admitted(&p), vec![3]);
    // Pass 2 left nothing waiting: a request arriving now waits for the cadence (pass 4).
    e.submit(request(4, tokens(50, 4), 20));
    let p = group_step(&mut e, 3, 2, 90.0);
    assert!(admitted(&p).is_empty());
}

const SGLANG: &str = r#""backend": "sglang", "block_size": 16, "num_gpu_blocks": 1000"#;

#[test]
fn sglang_decodes_n_passes_after_a_prefill() {
    let mut e = engine(&format!(r#"{SGLANG}, "prefill_decode_interval": 2"#));
    e.submit(request(1, tokens(100, 1), 20));
    let p = step(&mut e, 0.0);
    assert_eq!((admitted(&p), p.end_ms), (vec![1], 40.0));
    e.submit(request(2, tokens(100, 2), 20));
    let p = step(&mut e, 40.0);
    assert_eq!((admitted(&p), sampled(&p), p.end_ms), (vec![], vec![1], 50.0));
    let p = step(&mut e, 50.0);
    assert_eq!((admitted(&p), sampled(&p), p.end_ms), (vec![], vec![1], 60.0));
    let p = step(&mut e, 60.0);
    assert_eq!((admitted(&p), sampled(&p), p.end_ms), (vec![2], vec![2], 100.0));
}

#[test]
fn sglang_idle_interval_rounds_take_no_time() {
    let mut e = engine(&format!(r#"{SGLANG}, "prefill_decode_interval": 3"#));
    // Its only token finishes it in the prefill pass.
    e.submit(request(1, tokens(100, 1), 1));
    let p = step(&mut e, 0.0);
    assert_eq!(p.finished.len(), 1);
    // Nothing is left but three rounds of the interval: each is a deferred pass of no time.
    e.submit(request(2, tokens(100, 2), 5));
    for round in 0..3 {
        assert!(e.has_work());
        let p = step(&mut e, 40.0);
        assert!(e.deferred_in_pass(), "round {round}");
        assert!(p.is_empty() && p.end_ms == 40.0, "round {round}: {p:?}");
    }
    let p = step(&mut e, 40.0);
    assert!(!e.deferred_in_pass());
    assert_eq!((admitted(&p), p.end_ms), (vec![2], 80.0));
    // Drained, with no interval left, once request 2 is done.
    let mut now = p.end_ms;
    while e.has_work() {
        now = step(&mut e, now).end_ms;
    }
    assert!(e.is_drained());
}

#[test]
fn sglang_a_prefill_on_any_rank_restarts_every_ranks_interval() {
    let mut ranks = [
        engine(&format!(r#"{SGLANG}, "prefill_decode_interval": 1"#)),
        engine(&format!(r#"{SGLANG}, "prefill_decode_interval": 1"#)),
    ];
    // Shared pass: every rank begins and ends it; ranks with work step.
    let pass = |ranks: &mut [Engine; 2], wave: u64, now: f64| -> [PassOutput; 2] {
        let mut outs = [PassOutput::default(), PassOutput::default()];
        for r in ranks.iter_mut() {
            r.begin_group_pass(wave, 2);
        }
        for (r, out) in ranks.iter_mut().zip(outs.iter_mut()) {
            if r.has_work() {
                r.step(now, out);
            }
        }
        let prefilled = ranks.iter().any(|r| r.prefilled_in_pass());
        let ran = ranks.iter().any(|r| r.ran_model_in_pass());
        for r in ranks.iter_mut() {
            r.end_group_pass(prefilled, ran);
        }
        outs
    };
    ranks[0].submit(request(1, tokens(100, 1), 20));
    ranks[1].submit(request(2, tokens(100, 2), 20));
    let [a, b] = pass(&mut ranks, 0, 0.0);
    assert_eq!((admitted(&a), admitted(&b)), (vec![1], vec![2]));
    // Rank 0 prefills again at the first pass the interval allows; rank 1, which only
    // decodes, is held back one more pass by rank 0's prefill.
    ranks[0].submit(request(3, tokens(100, 3), 20));
    let [a, _] = pass(&mut ranks, 1, 40.0);
    assert!(admitted(&a).is_empty());
    let [a, _] = pass(&mut ranks, 2, 50.0);
    assert_eq!(admitted(&a), vec![3]);
    ranks[1].submit(request(4, tokens(100, 4), 20));
    let [_, b] = pass(&mut ranks, 3, 90.0);
    assert_eq!((admitted(&b), sampled(&b)), (vec![], vec![2]));
    let [_, b] = pass(&mut ranks, 4, 100.0);
    assert_eq!(admitted(&b), vec![4]);
}
