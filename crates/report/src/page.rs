//! What every page shares: the head and its style sheet, the summary tables and how a value
//! is printed in them, and a latency CDF.

use super::*;

pub(super) const STYLE: &str = "body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:24px auto;max-width:1580px;color:#222;padding:0 16px}\
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}\
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(620px,1fr));gap:12px}\
svg{width:100%;max-width:980px;height:auto;background:#fff;border:1px solid #eee}\
svg .title{font-size:14px;font-weight:600}svg .tick{font-size:11px;fill:#555}svg .label{font-size:12px;fill:#333}\
svg .legend{font-size:12px}svg .grid{stroke:#eee}svg .axis{stroke:#999}\
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}\
th{background:#f5f5f5;cursor:default}td:first-child,th:first-child{text-align:left;white-space:nowrap}\
table.sortable th{cursor:pointer}pre{background:#f7f7f7;padding:10px;overflow:auto;white-space:pre-wrap;font-size:12px;max-height:480px}\
.note{color:#666;font-size:13px}";

pub(super) fn fmt_value(v: &Value) -> String {
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
pub(super) const LATENCIES: [(&str, &str); 4] = [
    ("TTFT (ms)", "ttft_ms"),
    ("ITL (ms)", "itl_ms"),
    ("TPOT (ms)", "tpot_ms"),
    ("E2E latency (ms)", "e2e_latency_ms"),
];

pub(super) fn summary_tables(out: &mut String, s: &Map<String, Value>) {
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
pub(super) fn cdf(name: &str, values: &mut [f64]) -> Series {
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

pub(super) fn page_head(out: &mut String, title: &str) {
    let _ = write!(
        out,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width,initial-scale=1\"><title>{}</title><style>{STYLE}</style></head><body>",
        escape(title)
    );
}
