//! Prometheus metrics with the engines' own names, written in the text exposition format.
//!
//! Every engine rank owns one [`RankMetrics`]: its rank thread is the only writer, HTTP
//! handlers read it when `/metrics` is scraped. The encoder groups the series of any subset of
//! ranks (one worker's, or the whole process's) under one `# HELP`/`# TYPE` header per family,
//! which is why this module writes the format itself instead of concatenating registries.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use servesim_engine::Backend;

/// vLLM's time-to-first-token buckets (seconds).
pub const VLLM_TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
];
/// vLLM's inter-token latency buckets.
pub const VLLM_ITL_BUCKETS: &[f64] =
    &[0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0];
/// vLLM's end-to-end latency buckets.
pub const VLLM_E2E_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
    1920.0, 7680.0,
];
pub const SGLANG_TTFT_BUCKETS: &[f64] =
    &[0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0];
pub const SGLANG_ITL_BUCKETS: &[f64] = &[
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100, 0.200, 0.400,
    0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0,
];
pub const SGLANG_E2E_BUCKETS: &[f64] = &[
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0, 600.0, 1200.0,
    1800.0, 2400.0,
];
/// How late a pass's tokens were released after the modelled end of the pass: 50 µs to 10 s.
pub const LATENESS_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.0002, 0.0003, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02,
    0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// A float gauge or counter with a single writer.
#[derive(Default, Debug)]
pub struct Value(AtomicU64);

impl Value {
    pub fn set(&self, v: f64) {
        self.0.store(v.to_bits(), Ordering::Relaxed);
    }

    pub fn add(&self, v: f64) {
        self.set(self.get() + v);
    }

    pub fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
}

/// A cumulative histogram with a single writer.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Per-bucket (non-cumulative) counts; the last one is +Inf.
    counts: Vec<AtomicU64>,
    sum: Value,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram { bounds, counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(), sum: Value::default() }
    }

    pub fn observe(&self, v: f64) {
        self.observe_n(v, 1);
    }

    /// Records `n` observations of the same value.
    pub fn observe_n(&self, v: f64, n: u64) {
        let i = self.bounds.partition_point(|&b| b < v);
        self.counts[i].fetch_add(n, Ordering::Relaxed);
        self.sum.add(v * n as f64);
    }

    /// Adds `other`'s observations (same buckets) to this histogram.
    fn absorb(&self, other: &Histogram) {
        let (counts, sum) = other.snapshot();
        for (mine, c) in self.counts.iter().zip(counts) {
            mine.fetch_add(c, Ordering::Relaxed);
        }
        self.sum.add(sum);
    }

    fn snapshot(&self) -> (Vec<u64>, f64) {
        (self.counts.iter().map(|c| c.load(Ordering::Relaxed)).collect(), self.sum.get())
    }
}

/// Everything one engine rank reports.
#[derive(Debug)]
pub struct RankMetrics {
    pub worker: u32,
    pub rank: u32,
    pub running: Value,
    pub waiting: Value,
    pub kv_usage: Value,
    pub preemptions: Value,
    pub prefix_queries: Value,
    pub prefix_hits: Value,
    pub requests_finished: Value,
    pub ttft: Histogram,
    pub itl: Histogram,
    pub e2e: Histogram,
    /// vLLM's phases of a finished request (arrival to first scheduled, first scheduled to
    /// first token, first to last token, first scheduled to last token): the components TTFT
    /// and E2E are made of, as `predict --ttft-breakdown` reports them.
    pub queue_time: Histogram,
    pub prefill_time: Histogram,
    pub decode_time: Histogram,
    pub inference_time: Histogram,
    pub lateness: Histogram,
}

impl RankMetrics {
    pub fn new(backend: Backend, worker: u32, rank: u32) -> Self {
        let (ttft, itl, e2e) = match backend {
            Backend::Sglang => (SGLANG_TTFT_BUCKETS, SGLANG_ITL_BUCKETS, SGLANG_E2E_BUCKETS),
            Backend::Vllm | Backend::Trtllm => (VLLM_TTFT_BUCKETS, VLLM_ITL_BUCKETS, VLLM_E2E_BUCKETS),
        };
        RankMetrics {
            worker,
            rank,
            running: Value::default(),
            waiting: Value::default(),
            kv_usage: Value::default(),
            preemptions: Value::default(),
            prefix_queries: Value::default(),
            prefix_hits: Value::default(),
            requests_finished: Value::default(),
            ttft: Histogram::new(ttft),
            itl: Histogram::new(itl),
            e2e: Histogram::new(e2e),
            queue_time: Histogram::new(VLLM_E2E_BUCKETS),
            prefill_time: Histogram::new(VLLM_E2E_BUCKETS),
            decode_time: Histogram::new(VLLM_E2E_BUCKETS),
            inference_time: Histogram::new(VLLM_E2E_BUCKETS),
            lateness: Histogram::new(LATENESS_BUCKETS),
        }
    }
}

impl RankMetrics {
    /// One set of series for all of `ranks`: counters, histograms and the running and waiting
    /// gauges summed, KV usage averaged over the ranks.
    fn aggregate(ranks: &[&RankMetrics], backend: Backend) -> RankMetrics {
        let all = RankMetrics::new(backend, 0, 0);
        for m in ranks {
            for (to, from) in [
                (&all.running, &m.running),
                (&all.waiting, &m.waiting),
                (&all.kv_usage, &m.kv_usage),
                (&all.preemptions, &m.preemptions),
                (&all.prefix_queries, &m.prefix_queries),
                (&all.prefix_hits, &m.prefix_hits),
                (&all.requests_finished, &m.requests_finished),
            ] {
                to.add(from.get());
            }
            for (to, from) in [
                (&all.ttft, &m.ttft),
                (&all.itl, &m.itl),
                (&all.e2e, &m.e2e),
                (&all.queue_time, &m.queue_time),
                (&all.prefill_time, &m.prefill_time),
                (&all.decode_time, &m.decode_time),
                (&all.inference_time, &m.inference_time),
                (&all.lateness, &m.lateness),
            ] {
                to.absorb(from);
            }
        }
        all.kv_usage.set(all.kv_usage.get() / ranks.len().max(1) as f64);
        all
    }
}

/// Writes a label value with the format's escapes.
fn escape(out: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

fn number(out: &mut String, v: f64) {
    if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        let _ = write!(out, "{:.1}", v);
    } else {
        let _ = write!(out, "{v}");
    }
}

struct Encoder<'a> {
    out: String,
    model: &'a str,
    backend: Backend,
    /// The series stand for many ranks: their rank and worker labels say `"all"`.
    aggregate: bool,
}

impl Encoder<'_> {
    fn labels(&mut self, m: &RankMetrics, extra: Option<(&str, &str)>) {
        self.out.push('{');
        match self.backend {
            Backend::Sglang => {
                self.out.push_str("engine_type=\"sglang\",model_name=\"");
                escape(&mut self.out, self.model);
                self.out.push_str("\",pp_rank=\"0\",tp_rank=\"0\",dp_rank=\"");
                self.id(m.rank);
                self.out.push('"');
            }
            _ => {
                self.out.push_str("engine=\"");
                self.id(m.rank);
                self.out.push_str("\",model_name=\"");
                escape(&mut self.out, self.model);
                self.out.push('"');
            }
        }
        self.out.push_str(",worker_id=\"");
        self.id(m.worker);
        self.out.push('"');
        if let Some((k, v)) = extra {
            let _ = write!(self.out, ",{k}=\"{v}\"");
        }
        self.out.push('}');
    }

    /// A rank or worker number, or `all` for aggregated series.
    fn id(&mut self, n: u32) {
        if self.aggregate {
            self.out.push_str("all");
        } else {
            let _ = write!(self.out, "{n}");
        }
    }

    fn header(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn scalar(&mut self, ranks: &[&RankMetrics], name: &str, kind: &str, help: &str, get: fn(&RankMetrics) -> f64) {
        self.header(name, kind, help);
        for m in ranks {
            self.out.push_str(name);
            self.labels(m, None);
            self.out.push(' ');
            number(&mut self.out, get(m));
            self.out.push('\n');
        }
    }

    fn histogram(&mut self, ranks: &[&RankMetrics], name: &str, help: &str, get: fn(&RankMetrics) -> &Histogram) {
        self.header(name, "histogram", help);
        for m in ranks {
            let h = get(m);
            let (counts, sum) = h.snapshot();
            let mut cumulative = 0u64;
            let mut le = String::new();
            for (i, c) in counts.iter().enumerate() {
                cumulative += c;
                le.clear();
                number(&mut le, h.bounds.get(i).copied().unwrap_or(f64::INFINITY));
                self.out.push_str(name);
                self.out.push_str("_bucket");
                self.labels(m, Some(("le", &le)));
                let _ = writeln!(self.out, " {cumulative}.0");
            }
            self.out.push_str(name);
            self.out.push_str("_count");
            self.labels(m, None);
            let _ = writeln!(self.out, " {cumulative}.0");
            self.out.push_str(name);
            self.out.push_str("_sum");
            self.labels(m, None);
            self.out.push(' ');
            number(&mut self.out, sum);
            self.out.push('\n');
        }
    }
}

/// Default of `--metrics-max-ranks`: a scrape is about 22 KB per rank listed, so at most about
/// 2.8 MB.
pub const DEFAULT_METRICS_MAX_RANKS: usize = 128;

/// Renders the metrics of `ranks` in the Prometheus text format (version 0.0.4), under the
/// metric names of `backend`'s engine: one series per rank (labelled with its rank and worker,
/// as vLLM labels each engine of a process) for up to `max_ranks` ranks. With more, a scrape
/// would grow by about 22 KB a rank (90 MB for 4,096), so the ranks are summed into one set of
/// series whose rank and worker labels are `"all"`: counters, histograms and the running and
/// waiting gauges are sums, KV usage is the mean. Queries that sum over ranks
/// (`sum(vllm:num_requests_running)`, `histogram_quantile(0.99, sum by (le) (rate(..)))`) give
/// the same answer either way; a comment line says how many ranks were aggregated.
pub fn render(ranks: &[&RankMetrics], model: &str, backend: Backend, max_ranks: usize) -> String {
    let mut e = Encoder { out: String::with_capacity(8192), model, backend, aggregate: false };
    let all;
    let one;
    let ranks = if ranks.len() > max_ranks {
        let _ = writeln!(
            e.out,
            "# servesim: {} engine ranks aggregated into the series labelled \"all\" (--metrics-max-ranks {max_ranks})",
            ranks.len()
        );
        all = RankMetrics::aggregate(ranks, backend);
        one = [&all];
        e.aggregate = true;
        &one[..]
    } else {
        ranks
    };
    match backend {
        Backend::Sglang => {
            e.scalar(ranks, "sglang:num_running_reqs", "gauge", "The number of running requests.", |m| m.running.get());
            e.scalar(ranks, "sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", |m| {
                m.waiting.get()
            });
            e.scalar(ranks, "sglang:token_usage", "gauge", "The token usage of the KV cache.", |m| m.kv_usage.get());
            e.scalar(ranks, "sglang:cache_hit_rate", "gauge", "The prefix cache hit rate.", |m| {
                let q = m.prefix_queries.get();
                if q > 0.0 {
                    m.prefix_hits.get() / q
                } else {
                    0.0
                }
            });
            e.scalar(ranks, "sglang:num_requests_total", "counter", "Number of finished requests.", |m| {
                m.requests_finished.get()
            });
            e.histogram(
                ranks,
                "sglang:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                |m| &m.ttft,
            );
            e.histogram(
                ranks,
                "sglang:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                |m| &m.itl,
            );
            e.histogram(
                ranks,
                "sglang:e2e_request_latency_seconds",
                "Histogram of end-to-end request latency in seconds.",
                |m| &m.e2e,
            );
        }
        Backend::Vllm | Backend::Trtllm => {
            let p = if backend == Backend::Vllm { "vllm" } else { "trtllm" };
            let n = |s: &str| format!("{p}:{s}");
            e.scalar(
                ranks,
                &n("num_requests_running"),
                "gauge",
                "Number of requests in model execution batches.",
                |m| m.running.get(),
            );
            e.scalar(ranks, &n("num_requests_waiting"), "gauge", "Number of requests waiting to be processed.", |m| {
                m.waiting.get()
            });
            e.scalar(ranks, &n("kv_cache_usage_perc"), "gauge", "KV-cache usage. 1 means 100 percent usage.", |m| {
                m.kv_usage.get()
            });
            e.scalar(
                ranks,
                &n("gpu_cache_usage_perc"),
                "gauge",
                "GPU KV-cache usage (alias of kv_cache_usage_perc).",
                |m| m.kv_usage.get(),
            );
            e.scalar(
                ranks,
                &n("num_preemptions_total"),
                "counter",
                "Cumulative number of preemptions from the engine.",
                |m| m.preemptions.get(),
            );
            if backend == Backend::Vllm {
                e.scalar(
                    ranks,
                    &n("prefix_cache_queries_total"),
                    "counter",
                    "Prefix cache queries, in terms of number of queried tokens.",
                    |m| m.prefix_queries.get(),
                );
                e.scalar(
                    ranks,
                    &n("prefix_cache_hits_total"),
                    "counter",
                    "Prefix cache hits, in terms of number of cached tokens.",
                    |m| m.prefix_hits.get(),
                );
            }
            type Get = fn(&RankMetrics) -> &Histogram;
            let histograms: [(&str, &str, Get); 7] = [
                ("time_to_first_token_seconds", "Histogram of time to first token in seconds.", |m| &m.ttft),
                ("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", |m| &m.itl),
                ("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", |m| &m.e2e),
                ("request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", |m| {
                    &m.queue_time
                }),
                ("request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", |m| {
                    &m.prefill_time
                }),
                ("request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", |m| {
                    &m.decode_time
                }),
                ("request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", |m| {
                    &m.inference_time
                }),
            ];
            for (name, help, get) in histograms {
                e.histogram(ranks, &n(name), help, get);
            }
        }
    }
    e.histogram(
        ranks,
        "servesim:pass_lateness_seconds",
        "How late each pass's tokens were released after the modelled end of the pass.",
        |m| &m.lateness,
    );
    e.out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_with_inf_and_sum() {
        let m = RankMetrics::new(Backend::Vllm, 0, 1);
        m.ttft.observe(0.003);
        m.ttft.observe_n(0.03, 2);
        m.ttft.observe(1e6);
        let text = render(&[&m], "m\"x", Backend::Vllm, 8);
        let line = |prefix: &str| {
            text.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no {prefix} in\n{text}")).to_string()
        };
        let labels = r#"engine="1",model_name="m\"x",worker_id="0""#;
        assert_eq!(
            line("vllm:time_to_first_token_seconds_bucket{"),
            format!("vllm:time_to_first_token_seconds_bucket{{{labels},le=\"0.001\"}} 0.0")
        );
        assert!(text.contains(&format!("vllm:time_to_first_token_seconds_bucket{{{labels},le=\"0.005\"}} 1.0")));
        assert!(text.contains(&format!("vllm:time_to_first_token_seconds_bucket{{{labels},le=\"0.04\"}} 3.0")));
        assert!(text.contains(&format!("vllm:time_to_first_token_seconds_bucket{{{labels},le=\"+Inf\"}} 4.0")));
        assert!(text.contains(&format!("vllm:time_to_first_token_seconds_count{{{labels}}} 4.0")));
        let sum: f64 = line("vllm:time_to_first_token_seconds_sum").rsplit(' ').next().unwrap().parse().unwrap();
        assert!((sum - (0.063 + 1e6)).abs() < 1e-6);
        assert_eq!(text.matches("# TYPE vllm:num_preemptions_total counter").count(), 1);
    }

    #[test]
    fn engine_types_pick_their_names() {
        let m = RankMetrics::new(Backend::Trtllm, 2, 0);
        let text = render(&[&m], "x", Backend::Trtllm, 8);
        assert!(text.contains("trtllm:num_requests_running{"));
        assert!(!text.contains("prefix_cache"), "TRT-LLM exports no prefix cache counters");
        let m = RankMetrics::new(Backend::Sglang, 0, 0);
        let text = render(&[&m], "x", Backend::Sglang, 8);
        assert!(text.contains("sglang:num_queue_reqs{engine_type=\"sglang\""));
        assert!(text.contains("sglang:inter_token_latency_seconds_bucket{engine_type=\"sglang\",model_name=\"x\",pp_rank=\"0\",tp_rank=\"0\",dp_rank=\"0\",worker_id=\"0\",le=\"0.002\"} 0.0"));
    }

    #[test]
    fn many_ranks_are_aggregated_into_one_bounded_set_of_series() {
        let ranks: Vec<RankMetrics> = (0..300).map(|i| RankMetrics::new(Backend::Vllm, i / 2, i % 2)).collect();
        for (i, m) in ranks.iter().enumerate() {
            m.running.set(1.0);
            m.kv_usage.set(if i % 2 == 0 { 0.5 } else { 0.0 });
            m.ttft.observe(0.003);
            m.requests_finished.set(2.0);
        }
        let refs: Vec<&RankMetrics> = ranks.iter().collect();
        let listed = render(&refs[..128], "m", Backend::Vllm, 128);
        assert_eq!(listed.matches("vllm:num_requests_running{").count(), 128, "up to the cap, one series a rank");
        let text = render(&refs, "m", Backend::Vllm, 128);
        assert!(text.len() < 30_000, "one rank's worth of series, not 300: {} bytes", text.len());
        assert!(listed.len() > 100 * text.len() / 2, "the cap is what bounds it: {} vs {}", listed.len(), text.len());
        let all = r#"engine="all",model_name="m",worker_id="all""#;
        assert!(text.starts_with("# servesim: 300 engine ranks aggregated"), "{}", &text[..100]);
        assert!(text.contains(&format!("vllm:num_requests_running{{{all}}} 300.0\n")), "gauges are summed");
        assert!(text.contains(&format!("vllm:kv_cache_usage_perc{{{all}}} 0.25\n")), "KV usage is the mean");
        assert!(text.contains(&format!("vllm:time_to_first_token_seconds_bucket{{{all},le=\"0.005\"}} 300.0\n")));
        assert!(text.contains(&format!("vllm:time_to_first_token_seconds_count{{{all}}} 300.0\n")));
        assert_eq!(text.matches("vllm:num_requests_running{").count(), 1);
        let parsed_sum: f64 = text
            .lines()
            .find(|l| l.starts_with("vllm:time_to_first_token_seconds_sum{"))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap();
        assert!((parsed_sum - 0.9).abs() < 1e-9, "{parsed_sum}");
        let sglang: Vec<RankMetrics> = (0..3).map(|i| RankMetrics::new(Backend::Sglang, 0, i)).collect();
        let text = render(&sglang.iter().collect::<Vec<_>>(), "m", Backend::Sglang, 2);
        assert!(text.contains(r#"sglang:num_running_reqs{engine_type="sglang",model_name="m",pp_rank="0",tp_rank="0",dp_rank="all",worker_id="all"} 0.0"#));
    }
}
