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
//!
//! The gathering is here; each page has its file (`run`, `ensemble`, `recommend`) over what
//! they share (`page`: the head, the summary tables, a CDF) and the SVG charts ([`svg`]).

mod ensemble;
mod page;
mod recommend;
mod run;
pub mod svg;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{Map, Value};
use servesim_replay::telemetry::pool_name;
use servesim_replay::{ClusterSample, RequestRecord, Status, TelemetrySink, TtftBreakdown, WorkerSample};

use svg::{escape, Series};

pub use ensemble::{render_ensemble, EnsemblePage};
pub use recommend::{render_recommend, Candidate};
pub use run::{render_run, CandidateContext, PlannerView, RunPage};

/// What the report keeps of one completed request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RequestPoint {
    pub arrival_ms: f64,
    pub ttft_ms: f64,
    pub e2e_ms: f64,
    /// Mean gap between its tokens (none with fewer than two).
    pub itl_ms: Option<f64>,
    pub ttft_parts: [f64; servesim_replay::TTFT_PARTS],
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
                ttft_parts: [0.0, 0.0, 1.0, 9.0 + x, 0.0, 0.0],
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
