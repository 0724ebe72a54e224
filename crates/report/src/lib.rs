//! # servesim-report
//!
//! One self-contained HTML file per run: the summary, latency distributions (CDFs and
//! histograms), latency over time, the decomposed TTFT, cluster load and per-worker heatmaps
//! from telemetry, and the run's configuration; and a page for `recommend` (Pareto chart and a
//! candidate table sortable by any column). Charts are SVG drawn here (see the README for why):
//! no script or font is fetched when the page is viewed, and the same run gives the same bytes.
//!
//! The data is gathered while the run goes: [`Requests`] from per-request records (completed
//! requests with a first token), [`TelemetrySeries`] as a [`TelemetrySink`] that keeps at most
//! [`MAX_COLUMNS`] time columns (merging neighbours as the run grows), so memory stays bounded.

pub mod svg;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{Map, Value};
use servesim_replay::telemetry::pool_name;
use servesim_replay::{ClusterSample, RequestRecord, Status, TelemetrySink, TtftBreakdown, WorkerSample};

use svg::{escape, Series};

/// What the report keeps of one completed request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RequestPoint {
    pub arrival_ms: f64,
    pub ttft_ms: f64,
    pub e2e_ms: f64,
    /// Mean gap between its tokens (none with fewer than two).
    pub itl_ms: Option<f64>,
    pub ttft_parts: [f64; 5],
}

/// The completed requests of a run, as the report needs them (40 bytes each).
#[derive(Clone, Debug, Default)]
pub struct Requests {
    pub points: Vec<RequestPoint>,
}

impl Requests {
    pub fn add(&mut self, r: &RequestRecord) {
        if r.status != Status::Completed {
            return;
        }
        let (Some(ttft), Some(e2e), Some(parts)) = (r.ttft_ms(), r.e2e_ms(), r.ttft_breakdown_ms()) else {
            return;
        };
        self.points.push(RequestPoint {
            arrival_ms: r.arrival_ms,
            ttft_ms: ttft,
            e2e_ms: e2e,
            itl_ms: r.tpot_ms(),
            ttft_parts: parts.parts(),
        });
    }
}

/// Time columns kept at most; beyond, neighbouring columns are merged.
pub const MAX_COLUMNS: usize = 400;

/// One time column of telemetry (one or several merged samples).
#[derive(Clone, Debug, Default)]
struct Column {
    /// End of the last sample merged in.
    t_ms: f64,
    /// Samples merged in.
    weight: u32,
    /// Per row: sums of the gauges over the merged samples (NaN: the row did not exist).
    running: Vec<f64>,
    kv: Vec<f64>,
    arrivals: u64,
    completions: u64,
    output_tokens: u64,
    router_queue: f64,
    waiting_admission: f64,
    duration_ms: f64,
}

impl Column {
    fn merge(&mut self, o: &Column) {
        self.t_ms = o.t_ms;
        self.weight += o.weight;
        for (a, b) in [(&mut self.running, &o.running), (&mut self.kv, &o.kv)] {
            if a.len() < b.len() {
                a.resize(b.len(), f64::NAN);
            }
            for (x, y) in a.iter_mut().zip(b) {
                *x = if x.is_nan() {
                    *y
                } else if y.is_nan() {
                    *x
                } else {
                    *x + y
                };
            }
        }
        self.arrivals += o.arrivals;
        self.completions += o.completions;
        self.output_tokens += o.output_tokens;
        self.router_queue += o.router_queue;
        self.waiting_admission += o.waiting_admission;
        self.duration_ms += o.duration_ms;
    }
}

/// Telemetry kept for the report: per worker rank and cluster series over at most
/// [`MAX_COLUMNS`] columns.
#[derive(Clone, Debug, Default)]
pub struct TelemetrySeries {
    /// Row labels (`agg/0`, `prefill/1.r0`, ...) by (pool, worker, rank).
    rows: BTreeMap<(u8, u32, u32), usize>,
    labels: Vec<String>,
    columns: Vec<Column>,
    pending: Column,
    /// Samples per column.
    stride: u32,
    pub interval_ms: f64,
    samples: u64,
}

impl TelemetrySink for TelemetrySeries {
    fn sample(&mut self, c: &ClusterSample, workers: &[WorkerSample]) {
        if self.stride == 0 {
            self.stride = 1;
        }
        self.interval_ms = c.interval_ms;
        self.samples += 1;
        let mut col = Column {
            t_ms: c.t_ms,
            weight: 1,
            running: vec![f64::NAN; self.labels.len()],
            kv: vec![f64::NAN; self.labels.len()],
            arrivals: c.arrivals,
            completions: c.completions,
            router_queue: c.router_queue as f64,
            waiting_admission: c.waiting_admission as f64,
            duration_ms: c.interval_ms,
            output_tokens: 0,
        };
        for w in workers {
            let pool = match pool_name(w.pool) {
                "prefill" => 0,
                "decode" => 1,
                _ => 2,
            };
            let key = (pool, w.worker, w.dp_rank);
            let row = match self.rows.get(&key) {
                Some(&r) => r,
                None => {
                    let r = self.labels.len();
                    self.rows.insert(key, r);
                    self.labels.push(format!("{}/{}.r{}", pool_name(w.pool), w.worker, w.dp_rank));
                    col.running.push(f64::NAN);
                    col.kv.push(f64::NAN);
                    r
                }
            };
            col.running[row] = w.running as f64;
            col.kv[row] = w.kv_usage;
            col.output_tokens += w.output_tokens;
        }
        if self.pending.weight == 0 {
            self.pending = col;
        } else {
            self.pending.merge(&col);
        }
        if self.pending.weight >= self.stride {
            self.columns.push(std::mem::take(&mut self.pending));
            if self.columns.len() >= MAX_COLUMNS {
                let old = std::mem::take(&mut self.columns);
                for pair in old.chunks(2) {
                    let mut c = pair[0].clone();
                    if let Some(b) = pair.get(1) {
                        c.merge(b);
                    }
                    self.columns.push(c);
                }
                self.stride *= 2;
            }
        }
    }
}

impl TelemetrySeries {
    fn all_columns(&self) -> Vec<&Column> {
        let mut v: Vec<&Column> = self.columns.iter().collect();
        if self.pending.weight > 0 {
            v.push(&self.pending);
        }
        v
    }

    /// Worker rank rows in pool, worker, rank order.
    fn ordered_rows(&self) -> Vec<(String, usize)> {
        self.rows.values().map(|&r| (self.labels[r].clone(), r)).collect()
    }

    pub fn num_rows(&self) -> usize {
        self.labels.len()
    }

    pub fn num_samples(&self) -> u64 {
        self.samples
    }
}

/// Everything the run page shows.
pub struct RunPage<'a> {
    pub title: &'a str,
    /// The summary object (as in `--report-json`).
    pub summary: &'a Map<String, Value>,
    /// The run's configuration, shown as JSON.
    pub config: &'a Value,
    pub requests: &'a Requests,
    pub telemetry: Option<&'a TelemetrySeries>,
    pub planner: Option<&'a PlannerView>,
    /// When the run is a candidate of a recommend search: where it stands in it.
    pub candidate: Option<&'a CandidateContext<'a>>,
}

/// A recommend candidate's place in its search, shown at the top of its run page.
pub struct CandidateContext<'a> {
    /// Rank in the ranked view (1 = best), if in it.
    pub rank: Option<usize>,
    pub status: &'a str,
    /// Why it is not feasible, if it is not.
    pub reason: Option<&'a str>,
    pub score: f64,
    /// What the score measures (the search's target).
    pub target: &'a str,
    /// The recommend page, relative to this page.
    pub search_href: &'a str,
    /// Whether this page's replay gave the summary the search ranked (it differs only when the
    /// search read a stale entry of its trial cache).
    pub matches_search: bool,
}

/// What a planner in the loop did, for the run page.
pub struct PlannerView {
    /// Aggregated workers (one count) rather than prefill and decode pools.
    pub agg: bool,
    /// (time s, prefill workers, decode workers) from the start and after each change.
    pub timeline: Vec<(f64, usize, usize)>,
    /// When the run ended (s): the last counts hold until then.
    pub end_s: f64,
    /// (time s, component, from, to) of each scaling decision.
    pub events: Vec<(f64, String, usize, usize)>,
}

const STYLE: &str = "body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:24px auto;max-width:1580px;color:#222;padding:0 16px}\
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}\
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(620px,1fr));gap:12px}\
svg{width:100%;max-width:980px;height:auto;background:#fff;border:1px solid #eee}\
svg .title{font-size:14px;font-weight:600}svg .tick{font-size:11px;fill:#555}svg .label{font-size:12px;fill:#333}\
svg .legend{font-size:12px}svg .grid{stroke:#eee}svg .axis{stroke:#999}\
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}\
th{background:#f5f5f5;cursor:default}td:first-child,th:first-child{text-align:left;white-space:nowrap}\
table.sortable th{cursor:pointer}pre{background:#f7f7f7;padding:10px;overflow:auto;white-space:pre-wrap;font-size:12px;max-height:480px}\
.note{color:#666;font-size:13px}";

fn fmt_value(v: &Value) -> String {
    match v {
        Value::Number(n) => match n.as_f64() {
            Some(x) if n.is_f64() => {
                if x.abs() >= 1000.0 {
                    format!("{x:.1}")
                } else {
                    format!("{x:.3}")
                }
            }
            _ => n.to_string(),
        },
        Value::Null => "–".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Headline rows: (label, summary keys of mean, p50, p90, p99).
const LATENCIES: [(&str, &str); 4] = [
    ("TTFT (ms)", "ttft_ms"),
    ("ITL (ms)", "itl_ms"),
    ("TPOT (ms)", "tpot_ms"),
    ("E2E latency (ms)", "e2e_latency_ms"),
];

fn summary_tables(out: &mut String, s: &Map<String, Value>) {
    out.push_str(
        r#"<h2>Summary</h2><div class="grid"><div><table data-table="counts"><tr><th>metric</th><th>value</th></tr>"#,
    );
    for key in [
        "num_requests",
        "completed_requests",
        "rejected_requests",
        "total_input_tokens",
        "total_output_tokens",
        "duration_ms",
        "request_throughput_rps",
        "output_throughput_tok_s",
        "total_throughput_tok_s",
        "goodput_request_throughput_rps",
        "prefix_cache_reused_ratio",
        "num_preemptions",
        "gpu_hours",
    ] {
        if let Some(v) = s.get(key) {
            let _ = write!(out, "<tr><td>{}</td><td>{}</td></tr>", escape(key), escape(&fmt_value(v)));
        }
    }
    out.push_str(r#"</table></div><div><table data-table="latency"><tr><th>latency</th><th>mean</th><th>median</th><th>p90</th><th>p99</th><th>max</th></tr>"#);
    for (label, key) in LATENCIES {
        let _ = write!(out, "<tr><td>{label}</td>");
        for stat in ["mean", "median", "p90", "p99", "max"] {
            let v = s.get(&format!("{stat}_{key}")).map(fmt_value).unwrap_or_else(|| "–".into());
            let _ = write!(out, "<td>{}</td>", escape(&v));
        }
        out.push_str("</tr>");
    }
    out.push_str("</table></div></div>");
    out.push_str(r#"<details><summary>every summary value</summary><table data-table="summary"><tr><th>key</th><th>value</th></tr>"#);
    for (k, v) in s {
        let _ = write!(out, "<tr><td>{}</td><td>{}</td></tr>", escape(k), escape(&fmt_value(v)));
    }
    out.push_str("</table></details>");
}

/// The CDF of `values` as at most 400 points of (value, fraction ≤ value).
fn cdf(name: &str, values: &mut [f64]) -> Series {
    values.sort_unstable_by(f64::total_cmp);
    let n = values.len();
    let k = n.min(400);
    let points = (0..k)
        .map(|i| {
            let rank = if k <= 1 { n - 1 } else { i * (n - 1) / (k - 1) };
            (values[rank], (rank + 1) as f64 / n as f64)
        })
        .collect();
    Series { name: name.into(), points }
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i]
}

/// Latency by arrival time: p50 and p90 of TTFT and E2E in up to 100 time bins.
fn over_time(points: &[RequestPoint]) -> Vec<Series> {
    let t0 = points.iter().map(|p| p.arrival_ms).fold(f64::INFINITY, f64::min);
    let t1 = points.iter().map(|p| p.arrival_ms).fold(f64::NEG_INFINITY, f64::max);
    let bins = 100usize.min(points.len().max(1));
    let width = ((t1 - t0) / bins as f64).max(1e-9);
    let mut ttft: Vec<Vec<f64>> = vec![Vec::new(); bins];
    let mut e2e: Vec<Vec<f64>> = vec![Vec::new(); bins];
    for p in points {
        let b = (((p.arrival_ms - t0) / width) as usize).min(bins - 1);
        ttft[b].push(p.ttft_ms);
        e2e[b].push(p.e2e_ms);
    }
    let mut series: Vec<Series> = ["TTFT p50", "TTFT p90", "E2E p50", "E2E p90"]
        .iter()
        .map(|n| Series { name: n.to_string(), points: Vec::new() })
        .collect();
    for b in 0..bins {
        if ttft[b].is_empty() {
            continue;
        }
        let x = (t0 + (b as f64 + 0.5) * width) / 1000.0;
        ttft[b].sort_unstable_by(f64::total_cmp);
        e2e[b].sort_unstable_by(f64::total_cmp);
        series[0].points.push((x, quantile(&ttft[b], 0.5)));
        series[1].points.push((x, quantile(&ttft[b], 0.9)));
        series[2].points.push((x, quantile(&e2e[b], 0.5)));
        series[3].points.push((x, quantile(&e2e[b], 0.9)));
    }
    series
}

fn page_head(out: &mut String, title: &str) {
    let _ = write!(
        out,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width,initial-scale=1\"><title>{}</title><style>{STYLE}</style></head><body>",
        escape(title)
    );
}

/// The run page.
pub fn render_run(page: &RunPage<'_>) -> String {
    let mut out = String::new();
    page_head(&mut out, page.title);
    let _ = write!(out, "<h1>{}</h1>", escape(page.title));
    if let Some(c) = page.candidate {
        let rank = c.rank.map_or_else(|| "not ranked".to_string(), |r| format!("rank {r}"));
        let reason = c.reason.map(|r| format!(" ({})", escape(r))).unwrap_or_default();
        let _ = write!(
            out,
            r#"<p class="note" data-candidate="{status}">A candidate of a <a href="{href}">recommend search</a>: {rank}, {status}{reason}, score {score} (target {target}). {replay}</p>"#,
            replay = if c.matches_search {
                "Replayed again after the search with telemetry on; the replay gave the summary the search ranked."
            } else {
                "Replayed again after the search with telemetry on: <b>the replay differs from the result the search ranked</b> (read from its trial cache); what is shown here is the replay."
            },
            href = escape(c.search_href),
            status = escape(c.status),
            score = escape(&fmt_value(&serde_json::json!(c.score))),
            target = escape(c.target),
        );
    }
    out.push_str(r#"<p class="note">servesim replay report: every time is simulated (virtual clock). Latency charts cover completed requests.</p>"#);
    summary_tables(&mut out, page.summary);

    let points = &page.requests.points;
    out.push_str("<h2>Latency distributions</h2>");
    if points.is_empty() {
        out.push_str(r#"<p class="note">No request completed with a first token.</p>"#);
    } else {
        let mut ttft: Vec<f64> = points.iter().map(|p| p.ttft_ms).collect();
        let mut itl: Vec<f64> = points.iter().filter_map(|p| p.itl_ms).collect();
        let mut e2e: Vec<f64> = points.iter().map(|p| p.e2e_ms).collect();
        out.push_str(r#"<div class="grid">"#);
        for (i, (id, name, values)) in
            [("ttft", "TTFT", &mut ttft), ("itl", "ITL (per-request mean)", &mut itl), ("e2e", "E2E latency", &mut e2e)]
                .into_iter()
                .enumerate()
        {
            if values.is_empty() {
                continue;
            }
            let series = cdf(name, values);
            out.push_str(&svg::line_chart(
                &format!("{id}-cdf"),
                &format!("{name}: cumulative distribution"),
                "ms",
                "fraction of requests",
                &[series],
                true,
            ));
            out.push_str(&svg::histogram(
                &format!("{id}-hist"),
                &format!("{name}: histogram"),
                "ms",
                name,
                values,
                40,
                i,
            ));
        }
        out.push_str("</div>");
        out.push_str(r#"<h2>Latency over time</h2><div class="grid">"#);
        let mut series = over_time(points);
        let e2e = series.split_off(2);
        out.push_str(&svg::line_chart(
            "ttft-over-time",
            "TTFT by arrival time (p50, p90 per time bin)",
            "arrival time (s)",
            "ms",
            &series,
            false,
        ));
        out.push_str(&svg::line_chart(
            "e2e-over-time",
            "E2E latency by arrival time (p50, p90 per time bin)",
            "arrival time (s)",
            "ms",
            &e2e,
            false,
        ));
        out.push_str("</div>");
        out.push_str("<h2>Time to first token, decomposed</h2>");
        let n = points.len() as f64;
        let means: Vec<(&str, f64)> = TtftBreakdown::NAMES
            .iter()
            .enumerate()
            .map(|(i, name)| (*name, points.iter().map(|p| p.ttft_parts[i]).sum::<f64>() / n))
            .collect();
        out.push_str(r#"<div class="grid">"#);
        out.push_str(&svg::stacked_bar("ttft-breakdown", "Mean TTFT by component", &means, "ms"));
        out.push_str("</div>");
        out.push_str(
            r#"<p class="note">router_queue: arrival to placement; engine_queue: placement to first admission (vLLM's <code>request_queue_time</code>); prefill: admission to prompt done (vLLM's <code>request_prefill_time</code> when aggregated); kv_transfer: prompt done to KV on the decode worker; first_token: KV landed to first token (disaggregated only).</p>"#,
        );
    }

    if let Some(t) = page.telemetry {
        telemetry_section(&mut out, t);
    } else {
        out.push_str(r#"<h2>Cluster over time</h2><p class="note">No telemetry was sampled.</p>"#);
    }
    if let Some(p) = page.planner {
        planner_section(&mut out, p);
    }

    out.push_str("<h2>Configuration</h2><pre>");
    out.push_str(&escape(&serde_json::to_string_pretty(page.config).unwrap_or_default()));
    out.push_str("</pre></body></html>\n");
    out
}

/// Everything the ensemble page shows.
pub struct EnsemblePage<'a> {
    pub title: &'a str,
    /// The folded summary: each numeric key the members' median, with `<key>_p05` and
    /// `<key>_p95` beside it.
    pub summary: &'a Map<String, Value>,
    /// Every member's own summary, in member order.
    pub members: &'a [Map<String, Value>],
    /// What varied between the members, shown under the title.
    pub variation: &'a str,
    pub config: &'a Value,
}

/// Interval-bar rows (name, p05, median, p95) from (name, (median, p05, p95)).
fn bars<'a>(v: &[(&'a str, (f64, f64, f64))]) -> Vec<(&'a str, f64, f64, f64)> {
    v.iter().map(|&(n, (mid, lo, hi))| (n, lo, mid, hi)).collect()
}

/// (median, p05, p95) of `key` in a folded ensemble summary, if it has all three.
fn interval(s: &Map<String, Value>, key: &str) -> Option<(f64, f64, f64)> {
    let get = |k: &str| s.get(k).and_then(Value::as_f64);
    Some((get(key)?, get(&format!("{key}_p05"))?, get(&format!("{key}_p95"))?))
}

/// The ensemble page: the median and 90 % interval of every metric, as a table and as
/// interval bars, and the members' distribution of the headline latencies.
pub fn render_ensemble(page: &EnsemblePage<'_>) -> String {
    let mut out = String::new();
    page_head(&mut out, page.title);
    let s = page.summary;
    let _ = write!(
        out,
        r#"<h1>{}</h1><p class="note">servesim ensemble report: {} runs of the same configuration ({}). Each value is the members' median; p05 and p95 bound the central 90 % interval (nearest-rank quantiles over the members). Every time is simulated (virtual clock).</p>"#,
        escape(page.title),
        page.members.len(),
        escape(page.variation)
    );
    let mut rows: Vec<(String, &str, &str)> = Vec::new();
    for (label, key) in LATENCIES {
        for stat in ["mean", "p90"] {
            rows.push((format!("{stat} {}", label.trim_end_matches(" (ms)")), stat, key));
        }
    }
    let latency: Vec<(String, (f64, f64, f64))> = rows
        .iter()
        .filter_map(|(name, stat, key)| interval(s, &format!("{stat}_{key}")).map(|v| (name.clone(), v)))
        .collect();
    let throughput: Vec<(&str, (f64, f64, f64))> =
        [("output tokens/s", "output_throughput_tok_s"), ("total tokens/s", "total_throughput_tok_s")]
            .into_iter()
            .filter_map(|(name, key)| interval(s, key).map(|v| (name, v)))
            .collect();
    out.push_str(r#"<h2>Intervals</h2><div class="grid">"#);
    let latency_rows: Vec<(&str, (f64, f64, f64))> = latency.iter().map(|(n, v)| (n.as_str(), *v)).collect();
    out.push_str(&svg::interval_bars(
        "ensemble-latency",
        "Latency: median and 90 % interval over the members",
        "ms",
        &bars(&latency_rows),
    ));
    out.push_str(&svg::interval_bars(
        "ensemble-throughput",
        "Throughput: median and 90 % interval over the members",
        "tokens/s",
        &bars(&throughput),
    ));
    out.push_str("</div>");

    out.push_str(r#"<h2>Members</h2><div class="grid">"#);
    for (id, label, key) in [("members-ttft", "TTFT", "ttft_ms"), ("members-e2e", "E2E latency", "e2e_latency_ms")] {
        let series: Vec<Series> = ["mean", "p90"]
            .iter()
            .filter_map(|stat| {
                let k = format!("{stat}_{key}");
                let mut v: Vec<f64> = page.members.iter().filter_map(|m| m.get(&k).and_then(Value::as_f64)).collect();
                (!v.is_empty()).then(|| cdf(&format!("{stat} {label}"), &mut v))
            })
            .collect();
        out.push_str(&svg::line_chart(
            id,
            &format!("{label} of each member: cumulative distribution over the members"),
            "ms",
            "fraction of members",
            &series,
            true,
        ));
    }
    out.push_str("</div>");

    out.push_str(r#"<h2>Every metric</h2><table data-table="ensemble"><tr><th>metric</th><th>median</th><th>p05</th><th>p95</th></tr>"#);
    for (key, v) in s {
        if key.ends_with("_p05") || key.ends_with("_p95") {
            continue;
        }
        let (lo, hi) = match (s.get(&format!("{key}_p05")), s.get(&format!("{key}_p95"))) {
            (Some(lo), Some(hi)) => (fmt_value(lo), fmt_value(hi)),
            _ => ("–".into(), "–".into()),
        };
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(key),
            escape(&fmt_value(v)),
            escape(&lo),
            escape(&hi)
        );
    }
    out.push_str("</table>");
    out.push_str("<h2>Configuration</h2><pre>");
    out.push_str(&escape(&serde_json::to_string_pretty(page.config).unwrap_or_default()));
    out.push_str("</pre></body></html>\n");
    out
}

fn planner_section(out: &mut String, p: &PlannerView) {
    out.push_str(r#"<h2>Planner</h2><div class="grid">"#);
    let counts = |pick: fn(&(f64, usize, usize)) -> usize| -> Vec<(f64, f64)> {
        let mut points: Vec<(f64, f64)> = p.timeline.iter().map(|e| (e.0, pick(e) as f64)).collect();
        if let Some(&(_, last)) = points.last() {
            points.push((p.end_s.max(points[points.len() - 1].0), last));
        }
        points
    };
    let series = if p.agg {
        vec![Series { name: "workers".into(), points: counts(|e| e.2) }]
    } else {
        vec![
            Series { name: "prefill workers".into(), points: counts(|e| e.1) },
            Series { name: "decode workers".into(), points: counts(|e| e.2) },
        ]
    };
    out.push_str(&svg::line_chart(
        "planner-workers",
        "Workers taking traffic (starting ones not yet, draining ones no longer)",
        "time (s)",
        "workers",
        &series,
        true,
    ));
    out.push_str("</div>");
    if p.events.is_empty() {
        out.push_str(r#"<p class="note">The planner made no scaling decision.</p>"#);
        return;
    }
    let _ = write!(
        out,
        r#"<details><summary>{} scaling decisions</summary><table data-table="scaling-events"><tr><th>time (s)</th><th>component</th><th>from</th><th>to</th></tr>"#,
        p.events.len()
    );
    for (at_s, component, from, to) in &p.events {
        let _ = write!(out, "<tr><td>{at_s:.1}</td><td>{}</td><td>{from}</td><td>{to}</td></tr>", escape(component));
    }
    out.push_str("</table></details>");
}

fn telemetry_section(out: &mut String, t: &TelemetrySeries) {
    let cols = t.all_columns();
    let _ = write!(
        out,
        r#"<h2>Cluster over time</h2><p class="note">Telemetry sampled every {} ms of simulated time ({} samples{}).</p><div class="grid">"#,
        t.interval_ms,
        t.samples,
        if t.stride > 1 { format!(", shown in columns of {}", t.stride) } else { String::new() }
    );
    let x = |c: &Column| c.t_ms / 1000.0;
    let rate = |c: &Column, v: u64| v as f64 / (c.duration_ms / 1000.0).max(1e-9);
    let mean = |c: &Column, v: f64| v / c.weight.max(1) as f64;
    let load = [
        Series { name: "arrivals/s".into(), points: cols.iter().map(|c| (x(c), rate(c, c.arrivals))).collect() },
        Series { name: "completions/s".into(), points: cols.iter().map(|c| (x(c), rate(c, c.completions))).collect() },
        Series {
            name: "waiting for admission".into(),
            points: cols.iter().map(|c| (x(c), mean(c, c.waiting_admission))).collect(),
        },
        Series { name: "router queue".into(), points: cols.iter().map(|c| (x(c), mean(c, c.router_queue))).collect() },
    ];
    out.push_str(&svg::line_chart(
        "cluster-load",
        "Requests over time",
        "time (s)",
        "requests, requests/s",
        &load,
        false,
    ));
    let tokens = [Series {
        name: "output tokens/s".into(),
        points: cols.iter().map(|c| (x(c), rate(c, c.output_tokens))).collect(),
    }];
    out.push_str(&svg::line_chart("throughput", "Output throughput over time", "time (s)", "tokens/s", &tokens, false));
    out.push_str("</div>");
    let rows = t.ordered_rows();
    let labels: Vec<String> = rows.iter().map(|(l, _)| l.clone()).collect();
    let times: Vec<f64> = cols.iter().map(|c| x(c)).collect();
    let grid = |f: &dyn Fn(&Column) -> &Vec<f64>| -> Vec<Vec<f64>> {
        rows.iter()
            .map(|&(_, r)| cols.iter().map(|c| f(c).get(r).map_or(f64::NAN, |v| v / c.weight.max(1) as f64)).collect())
            .collect()
    };
    let running = grid(&|c| &c.running);
    let vmax = running.iter().flatten().copied().filter(|v| v.is_finite()).fold(0.0, f64::max);
    out.push_str(r#"<h2>Workers over time</h2><div class="grid">"#);
    out.push_str(&svg::heatmap(
        "heatmap-running",
        "Running requests per worker rank",
        &labels,
        &times,
        &running,
        vmax,
        "running",
    ));
    let kv: Vec<Vec<f64>> = grid(&|c| &c.kv).into_iter().map(|r| r.into_iter().map(|v| v * 100.0).collect()).collect();
    // Scaled to the fullest cell, so that a lightly used cache still shows its pattern.
    let kv_max = kv.iter().flatten().copied().filter(|v| v.is_finite()).fold(0.0, f64::max);
    let kv_max = if kv_max > 0.0 { kv_max } else { 100.0 };
    out.push_str(&svg::heatmap("heatmap-kv", "KV cache usage per worker rank (%)", &labels, &times, &kv, kv_max, "%"));
    out.push_str("</div>");
}

/// One candidate of a recommend search.
pub struct Candidate {
    pub id: String,
    pub status: String,
    pub score: f64,
    pub gpus: u64,
    /// Output tokens/s per GPU and per user (the Pareto axes), mean TTFT and TPOT.
    pub throughput_per_gpu: f64,
    pub throughput_per_user: f64,
    pub mean_ttft_ms: Option<f64>,
    pub mean_tpot_ms: Option<f64>,
    pub knobs: Value,
    pub pareto: bool,
    /// Rank in the ranked view (1 = best), if in it.
    pub rank: Option<usize>,
    /// Its run page, relative to the recommend page, if it has one.
    pub page: Option<String>,
}

const SORT_SCRIPT: &str = "document.querySelectorAll('table.sortable').forEach(function(t){\
t.querySelectorAll('th').forEach(function(th,i){th.addEventListener('click',function(){\
var rows=Array.prototype.slice.call(t.querySelectorAll('tr')).slice(1);var asc=th.dataset.dir!=='asc';\
t.querySelectorAll('th').forEach(function(h){delete h.dataset.dir;});th.dataset.dir=asc?'asc':'desc';\
rows.sort(function(a,b){var x=a.children[i].dataset.v,y=b.children[i].dataset.v;\
var nx=parseFloat(x),ny=parseFloat(y);var c=(!isNaN(nx)&&!isNaN(ny))?nx-ny:String(x).localeCompare(String(y));\
return asc?c:-c;});rows.forEach(function(r){t.appendChild(r);});});});});";

/// The recommend page: the candidates on the throughput-per-GPU / per-user plane with the
/// Pareto front, and a table sortable by any column.
pub fn render_recommend(title: &str, target: &str, candidates: &[Candidate], config: &Value) -> String {
    let mut out = String::new();
    page_head(&mut out, title);
    let _ = write!(
        out,
        r#"<h1>{}</h1><p class="note">servesim recommend: {} candidates, target <b>{}</b>. Click a column header to sort.{}</p>"#,
        escape(title),
        candidates.len(),
        escape(target),
        match candidates.iter().filter(|c| c.page.is_some()).count() {
            0 => String::new(),
            1 => " 1 candidate links to its own run page (replayed again after the search with telemetry on).".into(),
            n => format!(
                " {n} candidates link to their own run pages (replayed again after the search with telemetry on)."
            ),
        }
    );
    let point = |c: &Candidate| (c.throughput_per_user, c.throughput_per_gpu);
    let pick = |f: &dyn Fn(&Candidate) -> bool| candidates.iter().filter(|c| f(c)).map(point).collect::<Vec<_>>();
    let series = [
        (Series { name: "feasible".into(), points: pick(&|c| c.status == "feasible" && !c.pareto) }, false),
        (Series { name: "infeasible".into(), points: pick(&|c| c.status != "feasible") }, false),
        (Series { name: "Pareto front".into(), points: pick(&|c| c.pareto) }, true),
    ];
    out.push_str(&svg::scatter(
        "pareto",
        "Candidates: throughput per GPU against throughput per user",
        "output tokens/s per user",
        "output tokens/s per GPU",
        &series,
    ));
    out.push_str(r#"<h2>Candidates</h2><table class="sortable" data-table="candidates"><tr><th>candidate</th><th>rank</th><th>status</th><th>score</th><th>GPUs</th><th>tok/s per GPU</th><th>tok/s per user</th><th>mean TTFT (ms)</th><th>mean TPOT (ms)</th><th>Pareto</th><th>knobs</th></tr>"#);
    let num = |v: f64| {
        if v.is_finite() && v.fract() == 0.0 && v.abs() < 1e15 {
            (format!("{v}"), format!("{v:.0}"))
        } else if v.is_finite() {
            (format!("{v}"), format!("{v:.3}"))
        } else {
            (String::new(), "–".into())
        }
    };
    // Ranked candidates first, best first; then the others in candidate order.
    let mut order: Vec<&Candidate> = candidates.iter().collect();
    order.sort_by_key(|c| (c.rank.is_none(), c.rank, c.id.clone()));
    for c in order {
        match &c.page {
            Some(href) => {
                let _ = write!(
                    out,
                    r#"<tr><td data-v="{id}"><a href="{href}">{id}</a></td>"#,
                    id = escape(&c.id),
                    href = escape(href)
                );
            }
            None => {
                let _ = write!(out, r#"<tr><td data-v="{id}">{id}</td>"#, id = escape(&c.id));
            }
        }
        let rank = c.rank.map_or((String::new(), "–".to_string()), |r| (r.to_string(), r.to_string()));
        let _ = write!(out, r#"<td data-v="{}">{}</td>"#, rank.0, rank.1);
        let _ = write!(out, r#"<td data-v="{s}">{s}</td>"#, s = escape(&c.status));
        for v in [
            c.score,
            c.gpus as f64,
            c.throughput_per_gpu,
            c.throughput_per_user,
            c.mean_ttft_ms.unwrap_or(f64::NAN),
            c.mean_tpot_ms.unwrap_or(f64::NAN),
        ] {
            let (data, shown) = num(v);
            let _ = write!(out, r#"<td data-v="{data}">{shown}</td>"#);
        }
        let knobs = match &c.knobs {
            Value::String(s) => s.clone(),
            other => serde_json::to_string(other).unwrap_or_default(),
        };
        let _ = write!(
            out,
            r#"<td data-v="{p}">{p}</td><td data-v="{k}" style="text-align:left">{k}</td></tr>"#,
            p = if c.pareto { "yes" } else { "" },
            k = escape(&knobs)
        );
    }
    out.push_str("</table><h2>Search configuration</h2><pre>");
    out.push_str(&escape(&serde_json::to_string_pretty(config).unwrap_or_default()));
    let _ = writeln!(out, "</pre><script>{SORT_SCRIPT}</script></body></html>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t: f64, running: u32) -> (ClusterSample, Vec<WorkerSample>) {
        let c = ClusterSample { t_ms: t, interval_ms: 10.0, arrivals: 1, completions: 1, ..ClusterSample::default() };
        let w = WorkerSample { running, kv_usage: 0.5, output_tokens: 3, ..WorkerSample::default() };
        (c, vec![w])
    }

    #[test]
    fn telemetry_stays_bounded_and_keeps_totals() {
        let mut s = TelemetrySeries::default();
        let n = 5 * MAX_COLUMNS as u64 + 7;
        for i in 0..n {
            let (c, w) = sample((i + 1) as f64 * 10.0, (i % 4) as u32);
            s.sample(&c, &w);
        }
        let cols = s.all_columns();
        assert!(cols.len() <= MAX_COLUMNS, "{}", cols.len());
        assert_eq!(cols.iter().map(|c| c.arrivals).sum::<u64>(), n);
        assert_eq!(cols.iter().map(|c| c.output_tokens).sum::<u64>(), 3 * n);
        assert_eq!(cols.iter().map(|c| c.weight as u64).sum::<u64>(), n);
        assert_eq!(cols.last().unwrap().t_ms, n as f64 * 10.0);
        // Gauges are averaged: running cycles 0..4, so a merged column's mean is 1.5.
        let c = cols[0];
        assert_eq!(c.running[0] / c.weight as f64, 1.5);
    }

    #[test]
    fn pages_are_deterministic_and_self_contained() {
        let mut requests = Requests::default();
        for i in 0..50 {
            let x = i as f64;
            requests.points.push(RequestPoint {
                arrival_ms: x * 100.0,
                ttft_ms: 10.0 + x,
                e2e_ms: 100.0 + 2.0 * x,
                itl_ms: Some(5.0),
                ttft_parts: [0.0, 1.0, 9.0 + x, 0.0, 0.0],
            });
        }
        let summary: Map<String, Value> =
            serde_json::from_str(r#"{"num_requests": 50, "mean_ttft_ms": 34.5}"#).unwrap();
        let config = serde_json::json!({"workers": 1});
        let page = RunPage {
            title: "t",
            summary: &summary,
            config: &config,
            requests: &requests,
            telemetry: None,
            planner: None,
            candidate: None,
        };
        let a = render_run(&page);
        assert_eq!(a, render_run(&page));
        assert!(!a.contains("http"), "nothing is fetched when the page is viewed");
        assert!(!a.contains("<script"));
        assert_eq!(a.matches("data-chart=").count(), 9);
        assert!(!a.contains("data-candidate"));
        // A recommend candidate's page says where it stands and links back.
        let context = CandidateContext {
            rank: None,
            status: "infeasible",
            reason: Some("mean_ttft_ms=30 > 20"),
            score: 2.5,
            target: "throughput",
            search_href: "../my%20rec.html",
            matches_search: false,
        };
        let b = render_run(&RunPage { candidate: Some(&context), ..page });
        assert!(b.contains(r#"<a href="../my%20rec.html">recommend search</a>: not ranked, infeasible (mean_ttft_ms=30 &gt; 20), score 2.500 (target throughput)"#), "{b}");
        assert!(b.contains("the replay differs from the result the search ranked"));
    }

    #[test]
    fn the_candidate_table_links_the_pages_there_are() {
        let row = |id: &str, page: Option<&str>| Candidate {
            id: id.into(),
            status: "feasible".into(),
            score: 1.0,
            gpus: 1,
            throughput_per_gpu: 10.0,
            throughput_per_user: 5.0,
            mean_ttft_ms: Some(1.0),
            mean_tpot_ms: None,
            knobs: Value::String("agg".into()),
            pareto: false,
            rank: None,
            page: page.map(String::from),
        };
        let rows = [row("candidate-000001", Some("rec/candidate-000001.html")), row("candidate-000002", None)];
        let html = render_recommend("t", "throughput", &rows, &serde_json::json!({}));
        assert!(html.contains(
            r#"<td data-v="candidate-000001"><a href="rec/candidate-000001.html">candidate-000001</a></td>"#
        ));
        assert!(html.contains(r#"<td data-v="candidate-000002">candidate-000002</td>"#));
        assert_eq!(html.matches("<a href=").count(), 1);
        assert!(html.contains("1 candidate links to its own run page"));
    }
}
