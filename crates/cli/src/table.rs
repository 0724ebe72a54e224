//! The terminal summary, laid out like AIPerf's "LLM Metrics" table.

use comfy_table::{presets, CellAlignment, ContentArrangement, Table};
use servesim_replay::report::Report;
use servesim_replay::stats::Summary;

/// `v` with two decimals and thousands separators; "n/a" for a value that is not a number.
fn num(v: f64) -> String {
    if !v.is_finite() {
        return "n/a".to_string();
    }
    let s = format!("{:.2}", v.abs());
    let (int, frac) = s.split_once('.').expect("two decimals");
    let mut grouped = String::new();
    for (i, c) in int.chars().enumerate() {
        if i > 0 && (int.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(c);
    }
    format!("{}{grouped}.{frac}", if v < 0.0 { "-" } else { "" })
}

/// A rate over the simulated duration, "n/a" when the duration is 0.
fn rate(report: &Report, x: u64) -> String {
    report.rate(x as f64).map_or_else(|| "n/a".to_string(), num)
}

/// The table; `wall_clock: false` leaves out the host's wall time.
pub fn render(report: &Report, wall_clock: bool) -> String {
    let mut table = Table::new();
    // Heavy header, light body: AIPerf's box style.
    table
        .load_preset(presets::UTF8_FULL)
        .set_style(comfy_table::TableComponent::TopLeftCorner, '┏')
        .set_style(comfy_table::TableComponent::TopRightCorner, '┓')
        .set_style(comfy_table::TableComponent::TopBorder, '━')
        .set_style(comfy_table::TableComponent::TopBorderIntersections, '┳')
        .set_style(comfy_table::TableComponent::HeaderLines, '━')
        .set_style(comfy_table::TableComponent::LeftHeaderIntersection, '┡')
        .set_style(comfy_table::TableComponent::MiddleHeaderIntersections, '╇')
        .set_style(comfy_table::TableComponent::RightHeaderIntersection, '┩')
        .set_style(comfy_table::TableComponent::VerticalLines, '│')
        .remove_style(comfy_table::TableComponent::HorizontalLines)
        .remove_style(comfy_table::TableComponent::MiddleIntersections)
        .remove_style(comfy_table::TableComponent::LeftBorderIntersections)
        .remove_style(comfy_table::TableComponent::RightBorderIntersections)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(["Metric", "avg", "min", "max", "p99", "p90", "p75", "std"]);
    let d = &report.dist;
    let rows: [(&str, &Summary); 5] = [
        ("Time to First Token (ms)", &d.ttft),
        ("Time to Second Token (ms)", &d.ttst),
        ("Request Latency (ms)", &d.e2e),
        ("Inter Token Latency (ms)", &d.itl),
        ("Output Token Throughput Per User (tokens/sec/user)", &d.per_user),
    ];
    let stat_row = |label: String, s: &Summary| {
        vec![label, num(s.mean), num(s.min), num(s.max), num(s.p99), num(s.p90), num(s.p75), num(s.std)]
    };
    for (label, s) in rows {
        if s.count > 0 {
            table.add_row(stat_row(label.to_string(), s));
        }
    }
    if let Some(parts) = &report.ttft_parts {
        for (name, s) in servesim_replay::TtftBreakdown::NAMES.iter().zip(parts) {
            table.add_row(stat_row(format!("  TTFT part: {name} (ms)"), s));
        }
    }
    let t = &report.totals;
    let single = |label: &str, v: String| {
        let mut row = vec![label.to_string(), v];
        row.extend(std::iter::repeat_n("N/A".to_string(), 6));
        row
    };
    table.add_row(single("Output Token Throughput (tokens/sec)", rate(report, t.output_tokens)));
    table.add_row(single("Request Throughput (requests/sec)", rate(report, t.completed)));
    table.add_row(single("Request Count (requests)", t.completed.to_string()));
    if report.sla_set {
        table.add_row(single("Goodput (requests/sec)", rate(report, t.good_requests)));
    }
    for (i, column) in table.column_iter_mut().enumerate() {
        column.set_cell_alignment(if i == 0 { CellAlignment::Left } else { CellAlignment::Right });
    }

    let body = table.to_string();
    let width = body.lines().next().map_or(0, |l| l.chars().count());
    let title = "servesim | LLM Metrics";
    let mut out = format!("{:^width$}\n{body}\n", title);
    let ratio = |x: u64| {
        if t.input_tokens > 0 {
            x as f64 / t.input_tokens as f64
        } else {
            0.0
        }
    };
    out.push_str(&format!("Simulated Duration (ms): {}\n", num(t.duration_ms)));
    if wall_clock {
        out.push_str(&format!("Wall Time (ms): {}\n", num(report.wall_time_ms)));
    }
    out.push_str(&format!("Prefix Cache Reused Ratio: {:.4}\n", ratio(t.reused_tokens)));
    out.push_str(&format!(
        "First Admission Prefix Cache Reused Ratio: {:.4}\n",
        ratio(t.first_admission_reused_tokens)
    ));
    if report.speculative {
        out.push_str(&format!("Mean Accept Length (tokens/forward): {:.3}\n", report.mean_accept_length()));
    }
    if t.preemptions > 0 {
        out.push_str(&format!("Preemptions: {}\n", t.preemptions));
    }
    if t.rejected > 0 {
        out.push_str(&format!("Rejected Requests: {} (see --report-jsonl for reasons)\n", t.rejected));
    }
    if let Some(shed) = report.shed.filter(|&n| n > 0) {
        out.push_str(&format!("Shed Requests: {shed} (arrived at a full queue, --max-queued)\n"));
    }
    for note in report.notes() {
        out.push_str(&format!("Note: {note}\n"));
    }
    out
}

/// The planner's worker-count timeline: one row per change of the non-draining worker counts,
/// with the scaling events of that tick.
pub fn worker_timeline(run: &servesim_replay::planned::PlannerRun) -> String {
    let mut table = Table::new();
    table.load_preset(presets::UTF8_FULL_CONDENSED).set_content_arrangement(ContentArrangement::Disabled);
    let agg = run.timeline.first().is_some_and(|&(_, p, _)| p == 0) && run.events.iter().all(|e| e.component == "agg");
    if agg {
        table.set_header(["Time (s)", "Workers"]);
    } else {
        table.set_header(["Time (s)", "Prefill workers", "Decode workers"]);
    }
    for &(at, p, d) in &run.timeline {
        if agg {
            table.add_row([format!("{at:.0}"), d.to_string()]);
        } else {
            table.add_row([format!("{at:.0}"), p.to_string(), d.to_string()]);
        }
    }
    format!(
        "Planner: {} ticks, {} scaling events; worker counts over time:\n{table}\n",
        run.total_ticks(),
        run.events.len()
    )
}

/// The table of an ensemble: each metric's median over the members and its 90 % interval.
pub fn render_ensemble(summary: &serde_json::Map<String, serde_json::Value>, members: usize) -> String {
    let mut table = Table::new();
    table
        .load_preset(presets::UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(["Metric", "median", "p05", "p95"]);
    let rows = [
        ("Time to First Token, mean (ms)", "mean_ttft_ms"),
        ("Time to First Token, p90 (ms)", "p90_ttft_ms"),
        ("Time to First Token, p99 (ms)", "p99_ttft_ms"),
        ("Inter Token Latency, mean (ms)", "mean_itl_ms"),
        ("Inter Token Latency, p90 (ms)", "p90_itl_ms"),
        ("Request Latency, mean (ms)", "mean_e2e_latency_ms"),
        ("Request Latency, p90 (ms)", "p90_e2e_latency_ms"),
        ("Output Token Throughput (tokens/sec)", "output_throughput_tok_s"),
        ("Request Throughput (requests/sec)", "request_throughput_rps"),
        ("Goodput (requests/sec)", "goodput_request_throughput_rps"),
        ("Simulated Duration (ms)", "duration_ms"),
    ];
    for (label, key) in rows {
        let get = |k: &str| summary.get(k).and_then(serde_json::Value::as_f64).map_or("n/a".to_string(), num);
        if summary.contains_key(key) {
            table.add_row(vec![label.to_string(), get(key), get(&format!("{key}_p05")), get(&format!("{key}_p95"))]);
        }
    }
    for (i, column) in table.column_iter_mut().enumerate() {
        column.set_cell_alignment(if i == 0 { CellAlignment::Left } else { CellAlignment::Right });
    }
    let body = table.to_string();
    let width = body.lines().next().map_or(0, |l| l.chars().count());
    let title = format!("servesim | ensemble of {members} runs: median and 90 % interval");
    format!("{:^width$}\n{body}\n", title)
}

#[cfg(test)]
mod tests {
    use super::num;

    #[test]
    fn numbers_use_thousands_separators() {
        assert_eq!(num(0.0), "0.00");
        assert_eq!(num(1234567.891), "1,234,567.89");
        assert_eq!(num(999.999), "1,000.00");
        assert_eq!(num(-1234.5), "-1,234.50");
    }

    #[test]
    fn values_that_are_not_numbers_read_n_a() {
        assert_eq!(num(f64::NAN), "n/a");
        assert_eq!(num(f64::INFINITY), "n/a");
        assert_eq!(num(f64::NEG_INFINITY), "n/a");
        assert!(num(1e300).ends_with(".00"), "huge finite values render");
    }
}
