//! Ensemble intervals against a case where the distribution is known: one worker with fixed,
//! negligible pass times under Poisson arrivals. A run of n single-token requests then lasts
//! as long as its last arrival, the sum of n − 1 exponential gaps: an Erlang(n − 1, rate)
//! variable, whose CDF is known in closed form. The ensemble's 90 % interval of `duration_ms`
//! must cover about 90 % of that distribution.

use servesim_engine::WorkerArgs;
use servesim_replay::{
    ensemble, Arrivals, LoadMode, QueueLimit, RouterMode, SimConfig, Sla, SyntheticSpec, Topology, Workload,
};

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
        let reports =
            ensemble::run(&workload, &config, Sla::default(), QueueLimit::default(), false, members, 0).unwrap();
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
