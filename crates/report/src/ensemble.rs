//! The ensemble page: the median and 90 % interval of every metric over the members, as a table
//! and as interval bars.

use super::page::{cdf, fmt_value, page_head, LATENCIES};
use super::*;

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
