//! Ensemble intervals against a case where the distribution is known: one worker with fixed,
//! negligible pass times under Poisson arrivals. A run of n single-token requests then lasts
//! as long as its last arrival, the sum of n − 1 exponential gaps: an Erlang(n − 1, rate)
//! variable, whose CDF is known in closed form. The ensemble's 90 % interval of `duration_ms`
//! must cover about 90 % of that distribution.

use servesim_engine::WorkerArgs;
use servesim_replay::{ensemble, RouterMode, Run, SimConfig, Topology};
use servesim_workload::{Arrivals, LoadMode, SyntheticSpec, Workload};

/// P(X ≤ x) for X ~ Erlang(k, rate).
fn erlang_cdf(x: f64, k: u32, rate: f64) -> f64 {
    let y = rate * x;
    let mut term = (-y).exp();
    let mut sum = term;
    for j in 1..k {
        term *= y / j as f64;
        sum += term;
    }
    1.0 - sum
}

#[test]
fn ensemble_interval_covers_ninety_percent() {
    let engine = WorkerArgs::parse_json(
        r#"{"block_size": 16, "num_gpu_blocks": 1000, "timing_model": {"type": "fixed", "prefill_ms": 0.001, "decode_ms": 0.001}}"#,
    )
    .unwrap();
    let requests = 20;
    let rate_per_s = 2.0;
    let members = 100;
    let ensembles = 20;
    let mut coverages = Vec::new();
    for e in 0..ensembles {
        let workload = Workload::Synthetic(SyntheticSpec {
            input_tokens: 16,
            output_tokens: 1,
            sessions: requests,
            turns_per_session: 1,
            arrivals: Arrivals::Poisson { rate_per_s },
            // Members use seeds base..base+members; ensembles do not overlap.
            seed: 1_000_000 * (e + 1),
            shared_prefix_ratio: 0.0,
            num_prefix_groups: 0,
            inter_turn_delay_ms: 0.0,
            block_tokens: 16,
            group_seed: servesim_workload::GROUP_SEED,
            cached_prefix_tokens: 0,
            accumulate: false,
            images: None,
        });
        let config = SimConfig {
            router_seed: 1,
            seed: 1,
            ..SimConfig::new(
                Topology::aggregated(engine.clone(), 1).unwrap(),
                RouterMode::RoundRobin,
                LoadMode::Timestamps { speedup: 1.0 },
            )
        };
        let reports = Run::new(&workload, &config).ensemble(members).unwrap();
        let summaries: Vec<_> = reports.iter().map(|r| r.summary_json()).collect();
        let s = ensemble::summarize(&summaries);
        let (lo, hi) = (s["duration_ms_p05"].as_f64().unwrap(), s["duration_ms_p95"].as_f64().unwrap());
        assert!(lo < hi, "members differ: {lo} {hi}");
        // The service time (one 0.001 ms pass) is negligible next to second-long gaps.
        let cdf = |ms: f64| erlang_cdf(ms / 1000.0, requests - 1, rate_per_s);
        coverages.push(cdf(hi) - cdf(lo));
    }
    let mean = coverages.iter().sum::<f64>() / coverages.len() as f64;
    eprintln!("mean coverage {mean:.4} over {ensembles} ensembles of {members}");
    // Nearest-rank quantiles of 100 values are order statistics 6 and 95 (1-based), which cover
    // (95 − 6) / 101 of the distribution on average (one ensemble: ±0.03, one sd); the nominal
    // 90 % within 3 points.
    let expected = (95.0 - 6.0) / 101.0;
    assert!((mean - expected).abs() < 0.025, "mean coverage {mean:.4}, expected {expected:.4}: {coverages:?}");
    assert!((mean - 0.90).abs() < 0.03, "mean coverage {mean:.4}");
    assert!(coverages.iter().all(|c| (0.75..=0.97).contains(c)), "{coverages:?}");
}

/// The E2E latency of each member of an ensemble of one request under `timing_jitter_cv`.
fn jittered_e2e(output_tokens: u32, cv: f64, members: usize) -> Vec<f64> {
    let engine = WorkerArgs::parse_json(
        r#"{"block_size": 16, "num_gpu_blocks": 1000, "timing_model": {"type": "fixed", "prefill_ms": 10, "decode_ms": 5}}"#,
    )
    .unwrap();
    let workload = Workload::Synthetic(SyntheticSpec {
        input_tokens: 64,
        output_tokens,
        sessions: 1,
        turns_per_session: 1,
        arrivals: Arrivals::Interval { interval_ms: 1.0 },
        seed: 3,
        shared_prefix_ratio: 0.0,
        num_prefix_groups: 0,
        inter_turn_delay_ms: 0.0,
        block_tokens: 16,
        group_seed: servesim_workload::GROUP_SEED,
        cached_prefix_tokens: 0,
        accumulate: false,
        images: None,
    });
    let config = SimConfig {
        timing_jitter_cv: cv,
        ..SimConfig::new(
            Topology::aggregated(engine, 1).unwrap(),
            RouterMode::RoundRobin,
            LoadMode::Timestamps { speedup: 1.0 },
        )
    };
    let reports = Run::new(&workload, &config).ensemble(members).unwrap();
    reports.iter().map(|r| r.summary_json()["mean_e2e_latency_ms"].as_f64().unwrap()).collect()
}

fn mean_and_cv(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt() / mean)
}

#[test]
fn timing_jitter_has_the_requested_coefficient_of_variation() {
    let members = 4000;
    // One output token: the request is one prefill pass of 10 ms, so its E2E latency is 10 ms
    // times one jitter factor (mean 1, CV c), to the nanosecond.
    for cv in [0.05, 0.2, 0.5] {
        let e2e = jittered_e2e(1, cv, members);
        let (mean, got) = mean_and_cv(&e2e);
        eprintln!("one pass, cv {cv}: mean {mean:.4} ms, cv {got:.4}");
        assert!(e2e.iter().all(|&x| x > 0.0), "durations stay positive");
        // Standard errors at n = 4000: mean 10·c/√n (0.16 ms at c = 0.5), CV about
        // c·√((1 + 2c²)/(2n)) for a log-normal (0.0069 at c = 0.5); four of each allowed.
        assert!((mean - 10.0).abs() < 4.0 * 10.0 * cv / (members as f64).sqrt(), "cv {cv}: mean {mean}");
        let se = cv * ((1.0 + 2.0 * cv * cv) / (2.0 * members as f64)).sqrt();
        assert!((got - cv).abs() < 4.0 * se, "cv {cv}: measured {got}");
    }
    // Five tokens: a 10 ms prefill pass, then four 5 ms decode passes, each with its own
    // factor; the sum's CV is c·√(10² + 4·5²) / 30.
    let cv = 0.3;
    let e2e = jittered_e2e(5, cv, members);
    let (mean, got) = mean_and_cv(&e2e);
    let expected = cv * (100.0f64 + 4.0 * 25.0).sqrt() / 30.0;
    eprintln!("five passes, cv {cv}: mean {mean:.4} ms, cv {got:.4}, expected {expected:.4}");
    assert!((mean - 30.0).abs() < 0.3, "mean {mean}");
    assert!((got - expected).abs() < 0.1 * expected, "measured {got}, expected {expected}");
}

#[test]
fn timing_jitter_is_seeded_and_off_at_zero() {
    let a = jittered_e2e(5, 0.1, 8);
    assert_eq!(a, jittered_e2e(5, 0.1, 8), "same seeds, same durations");
    assert!(a.windows(2).any(|w| w[0] != w[1]), "members draw different factors: {a:?}");
    let exact = jittered_e2e(5, 0.0, 3);
    assert!(exact.iter().all(|&x| x == 30.0), "no jitter: the model's 30 ms exactly, {exact:?}");
}
