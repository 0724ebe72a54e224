//! The recommend page: the candidates' Pareto chart and a table sortable by any column, linking
//! each candidate's run page.

use super::page::page_head;
use super::*;

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
