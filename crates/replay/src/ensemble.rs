//! Ensembles: the same run under N seeded variations, for an interval around each metric.
//!
//! Member `i` (from 0) adds `i` to the seeds that make a run vary: a synthetic workload's arrival
//! seed (Poisson gaps, prefix groups), the router's seed (ties, softmax sampling) and the token
//! seed (speculative acceptance, generated ids). Member 0 is the run itself. A trace's
//! timestamps are not resampled: only the seeded choices vary there. Members run on a pool of
//! threads; each is a complete ordinary run, so results do not depend on the thread count.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use serde_json::{Map, Value};

use crate::metrics::QueueLimit;
use crate::report::Report;
use crate::run::Run;
use crate::sim::{SimConfig, SimError};
use servesim_workload::Workload;

/// The workload and configuration of member `i`.
pub fn member(workload: &Workload, config: &SimConfig, i: u64) -> (Option<Workload>, SimConfig) {
    let mut config = config.clone();
    config.router_seed = config.router_seed.wrapping_add(i);
    config.seed = config.seed.wrapping_add(i);
    // Members already run in parallel; one loop each.
    config.split_workers = false;
    let workload = match workload {
        Workload::Synthetic(spec) if i > 0 => {
            let mut spec = spec.clone();
            spec.seed = spec.seed.wrapping_add(i);
            Some(Workload::Synthetic(spec))
        }
        _ => None,
    };
    (workload, config)
}

impl Run<'_> {
    /// Runs `n` seeded members of this run instead (see the module docs) on
    /// `config.threads` threads, each with this run's queue limit, TTFT breakdown and stop
    /// time; returns their reports in member order, or the first member's error. An ensemble
    /// describes summaries: its members keep no records or telemetry, run no planner and are
    /// not paced.
    pub fn ensemble(self, n: usize) -> Result<Vec<Report>, SimError> {
        debug_assert!(self.summaries_only(), "an ensemble keeps summaries only");
        let each = Member { queue: self.queue, ttft_breakdown: self.ttft_breakdown, stop_at_ms: self.stop_at_ms };
        run(self.workload, self.config, each, n)
    }
}

/// What every member of an ensemble runs with, besides its seeds.
#[derive(Clone, Copy)]
struct Member {
    queue: QueueLimit,
    ttft_breakdown: bool,
    stop_at_ms: Option<f64>,
}

/// Runs `n` members of `workload` under `config` on `config.threads` threads (0: every core),
/// each as `each` says; returns their reports in member order, or the first member's error.
/// [`Run::ensemble`] is the way in.
fn run(workload: &Workload, config: &SimConfig, each: Member, n: usize) -> Result<Vec<Report>, SimError> {
    let threads = match config.threads {
        0 => std::thread::available_parallelism().map_or(1, |t| t.get()),
        t => t,
    }
    .clamp(1, n.max(1));
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<Report, SimError>>>> = Mutex::new((0..n).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let (own, config) = member(workload, config, i as u64);
                let result = Run::new(own.as_ref().unwrap_or(workload), &config)
                    .queue_limit(each.queue)
                    .ttft_breakdown(each.ttft_breakdown)
                    .stop_at_ms(each.stop_at_ms)
                    .go(&mut ())
                    .map(|ran| ran.report);
                results.lock().expect("no member panicked")[i] = Some(result);
            });
        }
    });
    results.into_inner().expect("no member panicked").into_iter().map(|r| r.expect("every member ran")).collect()
}

/// The value at quantile `q` of sorted values (the nearest rank, as the summaries use).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i]
}

/// One summary of the members' summaries: each numeric key becomes the members' median, with
/// `<key>_p05` and `<key>_p95` after it (the ends of the central 90 % interval); other keys
/// (and keys some member lacks or has as null) are member 0's.
pub fn summarize(summaries: &[Map<String, Value>]) -> Map<String, Value> {
    let mut out = Map::new();
    let Some(first) = summaries.first() else { return out };
    for (key, value) in first {
        let values: Option<Vec<f64>> = summaries.iter().map(|s| s.get(key).and_then(Value::as_f64)).collect();
        match values {
            Some(mut v) if value.is_number() => {
                v.sort_by(f64::total_cmp);
                out.insert(key.clone(), number(quantile(&v, 0.5), value));
                out.insert(format!("{key}_p05"), number(quantile(&v, 0.05), value));
                out.insert(format!("{key}_p95"), number(quantile(&v, 0.95), value));
            }
            _ => {
                out.insert(key.clone(), value.clone());
            }
        }
    }
    out.insert("ensemble_members".into(), Value::from(summaries.len() as u64));
    out
}

/// `x` as JSON, an integer when the member-0 value was one.
fn number(x: f64, like: &Value) -> Value {
    if (like.is_u64() || like.is_i64()) && x.fract() == 0.0 {
        if x >= 0.0 {
            Value::from(x as u64)
        } else {
            Value::from(x as i64)
        }
    } else {
        serde_json::json!(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_has_median_and_interval_per_numeric_key() {
        let s: Vec<Map<String, Value>> = (0..21)
            .map(|i| {
                serde_json::from_str(&format!(
                    r#"{{"mean_ttft_ms": {}, "num_requests": 10, "notes": ["x"]}}"#,
                    i as f64
                ))
                .unwrap()
            })
            .collect();
        let m = summarize(&s);
        assert_eq!(m["mean_ttft_ms"], 10.0);
        assert_eq!(m["mean_ttft_ms_p05"], 1.0);
        assert_eq!(m["mean_ttft_ms_p95"], 19.0);
        assert_eq!(m["num_requests"], 10);
        assert_eq!(m["notes"], serde_json::json!(["x"]));
        assert_eq!(m["ensemble_members"], 21);
    }

    /// A summary without the values measured on the host's clock.
    fn simulated(report: &Report) -> Map<String, Value> {
        let mut s = report.summary_json();
        for key in crate::WALL_CLOCK_KEYS {
            s.remove(key);
        }
        s
    }

    #[test]
    fn members_stop_where_the_run_stops_and_member_zero_is_the_run() {
        use servesim_workload::Arrivals;

        let (workload, config) = crate::run::tests::two_workers(40, Arrivals::Poisson { rate_per_s: 100.0 });
        let stop = Some(150.0);
        let plain = Run::new(&workload, &config).stop_at_ms(stop).go(&mut ()).unwrap().report;
        let members = Run::new(&workload, &config).stop_at_ms(stop).ensemble(3).unwrap();
        assert_eq!(simulated(&members[0]), simulated(&plain), "member 0 is the run itself");
        for (i, m) in members.iter().enumerate() {
            let done = m.summary_json()["completed_requests"].as_u64().unwrap();
            assert!(done < 40, "member {i} stopped at 150 ms: {done} of 40 requests completed");
        }
    }
}
