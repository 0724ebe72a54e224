//! The run page: summary, latency distributions and latency over time, the decomposed TTFT,
//! the planner's decisions, cluster load and per-worker heatmaps from telemetry, and the
//! configuration; for a recommend candidate, where it stands in its search.

use super::page::{cdf, fmt_value, page_head, summary_tables};
use super::*;

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
