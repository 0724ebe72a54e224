//! The load-predictor backtest (`sweep_load_predictor`): the trace's requests in windows of a
//! throughput interval, each supported predictor preset's one-step-ahead loss, the lowest
//! winning, over the trace's rows as `servesim_workload::rows` reads them.

use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};
use servesim_workload::rows::{self, Row, RowFormat};

use super::presets::{scaling_fields, Predictor};
use super::section::Context;
use crate::error::DeployError;

/// What the backtest chose: the winner per throughput interval and the state for the record.
pub(super) struct Backtest {
    pub(super) winners: Vec<(i64, Predictor)>,
    pub(super) state: Value,
}

/// One aggregated traffic window: requests, mean ISL, mean OSL.
type Window = (f64, f64, f64);

/// The load-predictor backtest (`sweep_load_predictor`): per distinct throughput interval of
/// the kept policies, every supported candidate's mean one-step-ahead loss over the trace's
/// windows after the common warmup; the lowest wins (the first on ties), the first candidate
/// when none has a loss (or the traffic is not a Mooncake / Dynamo trace).
///
/// ARIMA and Prophet candidates run the reference's own predictors through Python: always when
/// the section names them (`named_python`: the caller has checked that Python can run them),
/// and for a default list whenever the backtest has windows to score and the Python side is
/// there, as the reference backtests its whole default list. Without it they are skipped, and
/// the state says which and why (`skipped`, `skipped_because`): the winner may then differ from
/// the reference's.
pub(super) fn sweep_load_predictor(
    policies: &[Value],
    candidates: &[Value],
    ctx: &Context,
    named_python: bool,
) -> Result<Backtest, DeployError> {
    let mut intervals: Vec<i64> = policies.iter().map(scaling_fields).filter(|f| f.0).filter_map(|f| f.2).collect();
    intervals.sort_unstable();
    intervals.dedup();
    let label = |i: usize| candidates[i].as_str().map_or_else(|| format!("custom_{i}"), str::to_string);
    let preds: Vec<Predictor> = candidates.iter().map(Predictor::of).collect();
    if intervals.is_empty() {
        return Ok(Backtest {
            winners: Vec::new(),
            state: json!({"best_by_interval": {}, "losses": {}, "reason": "no_throughput_scaling_candidate"}),
        });
    }
    let trace = trace_rows(ctx)?;
    // A default list's Python presets: run when there are windows to score and Python can.
    let mut python = Ok(named_python);
    if !named_python && trace.is_some() {
        if let Some(p) = preds.iter().find(|p| p.in_python()) {
            python = servesim_replay::planner_python::available(&p.family).map(|_| true);
        }
    }
    let runs = |p: &Predictor| p.supported() || (python == Ok(true) && p.in_python());
    let skipped: Vec<Value> = (0..preds.len()).filter(|&i| !runs(&preds[i])).map(|i| json!(label(i))).collect();
    let mut skipped_state = json!({"skipped": skipped});
    if let (Err(why), false) = (&python, skipped.is_empty()) {
        skipped_state["skipped_because"] = json!(why);
    }
    let entry_of = |i: usize| candidates[i].clone();
    let Some(first) = (0..preds.len()).find(|&i| runs(&preds[i])) else {
        return Err(DeployError::new("planner.load_predictor", "no constant or kalman load predictor to choose from"));
    };
    let with_skipped = |mut state: Value| {
        for (k, v) in skipped_state.as_object().into_iter().flatten() {
            state[k] = v.clone();
        }
        state
    };
    let (rows, origin) = match trace {
        Some(rows) => rows,
        None => {
            let best: Map<String, Value> = intervals.iter().map(|i| (i.to_string(), entry_of(first))).collect();
            return Ok(Backtest {
                winners: intervals.iter().map(|&i| (i, preds[first].clone())).collect(),
                state: with_skipped(
                    json!({"best_by_interval": best, "losses": {}, "reason": "static_workload_configured_fallback"}),
                ),
            });
        }
    };
    let warmup = preds.iter().map(Predictor::min_points).max().unwrap_or(0).max(0) as usize;
    let mut winners = Vec::new();
    let mut best_map = Map::new();
    let mut losses_map = Map::new();
    let mut fallback = Vec::new();
    for &interval in &intervals {
        let windows = build_windows(&rows, origin, interval);
        let mut losses = Map::new();
        let mut best: Option<(usize, f64)> = None;
        for (i, p) in preds.iter().enumerate() {
            if !runs(p) {
                continue;
            }
            let loss =
                evaluate(&windows, p, interval, warmup).map_err(|e| DeployError::new("planner.load_predictor", e))?;
            if p.in_python() {
                if let Some(why) = servesim_replay::planner_python::failure() {
                    return Err(DeployError::new(
                        "planner.load_predictor",
                        format!(
                            "the {} load predictor (Dynamo's, through Python) failed in the backtest: {why}",
                            p.family
                        ),
                    ));
                }
            }
            losses.insert(label(i), if loss.is_finite() { json!(loss) } else { Value::Null });
            if best.is_none_or(|(_, b)| loss < b) && loss.is_finite() {
                best = Some((i, loss));
            }
        }
        let w = match best {
            Some((i, _)) => i,
            None => {
                fallback.push(interval);
                first
            }
        };
        winners.push((interval, preds[w].clone()));
        best_map.insert(interval.to_string(), entry_of(w));
        losses_map.insert(interval.to_string(), Value::Object(losses));
    }
    let reason = if fallback.is_empty() {
        "swept".to_string()
    } else {
        format!(
            "swept; no_winner_configured_fallback@[{}]",
            fallback.iter().map(i64::to_string).collect::<Vec<_>>().join(", ")
        )
    };
    Ok(Backtest {
        winners,
        state: with_skipped(json!({"best_by_interval": best_map, "losses": losses_map, "reason": reason})),
    })
}

/// The weighted one-step-ahead loss of one window (`window_loss`).
fn window_loss(n_hat: f64, i_hat: f64, o_hat: f64, w: Window) -> f64 {
    let e = |p: f64, a: f64| (p.max(0.0).ln_1p() - a.max(0.0).ln_1p()).abs();
    let (n_hat, i_hat, o_hat) = (n_hat.max(0.0), i_hat.max(0.0), o_hat.max(0.0));
    let (n, isl, osl) = w;
    0.4 * e(n_hat * i_hat, n * isl) + 0.4 * e(n_hat * o_hat, n * osl) + 0.1 * e(i_hat, isl) + 0.1 * e(o_hat, osl)
}

/// The mean loss of one predictor over the windows, forecasting before each window is observed
/// (`evaluate_preset`); infinite when no window counts, or when a forecast fails (NaN: the
/// reference's predictor raised, so it would have made no forecast).
fn evaluate(windows: &[Window], p: &Predictor, interval_s: i64, warmup: usize) -> Result<f64, String> {
    let (mut n, mut i, mut o) = (p.series(interval_s)?, p.series(interval_s)?, p.series(interval_s)?);
    let mut losses = Vec::new();
    for (k, w) in windows.iter().enumerate() {
        let (nh, ih, oh) = (n.predict_next(), i.predict_next(), o.predict_next());
        if nh.is_nan() || ih.is_nan() || oh.is_nan() {
            return Ok(f64::INFINITY);
        }
        if k >= warmup {
            losses.push(window_loss(nh, ih, oh, *w));
        }
        n.add(w.0);
        i.add(w.1);
        o.add(w.2);
    }
    if losses.is_empty() {
        Ok(f64::INFINITY)
    } else {
        Ok(exact_sum(&losses) / losses.len() as f64)
    }
}

/// A sum without intermediate rounding (Shewchuk's partials, as Python's `math.fsum`).
fn exact_sum(xs: &[f64]) -> f64 {
    let mut partials: Vec<f64> = Vec::new();
    for &x0 in xs {
        let mut x = x0;
        let mut keep = Vec::with_capacity(partials.len() + 1);
        for &p in &partials {
            let (hi, lo) = if x.abs() < p.abs() { (p, x) } else { (x, p) };
            let s = hi + lo;
            let err = lo - (s - hi);
            if err != 0.0 {
                keep.push(err);
            }
            x = s;
        }
        keep.push(x);
        partials = keep;
    }
    partials.iter().sum()
}

/// The trace's windows of `interval_s` seconds from its first to its last (`_extract_metrics`):
/// requests, mean ISL and mean OSL per window, empty windows as zeros.
fn build_windows(rows: &[Row], origin: f64, interval_s: i64) -> Vec<Window> {
    let interval_ms = interval_s as f64 * 1000.0;
    let mut groups: std::collections::BTreeMap<i64, (u64, u64, u64)> = Default::default();
    for &(t, isl, osl) in rows {
        let index = ((t - origin) / interval_ms).floor() as i64;
        let g = groups.entry(index).or_default();
        g.0 += 1;
        g.1 += isl;
        g.2 += osl;
    }
    let (Some((&lo, _)), Some((&hi, _))) = (groups.first_key_value(), groups.last_key_value()) else {
        return Vec::new();
    };
    (lo..=hi)
        .map(|k| match groups.get(&k) {
            Some(&(n, isl, osl)) => (n as f64, isl as f64 / n as f64, osl as f64 / n as f64),
            None => (0.0, 0.0, 0.0),
        })
        .collect()
}

/// The trace's `(timestamp ms, input length, output length)` rows as the Planner's trace
/// utility reads them (`trace_data.py`): Mooncake rows, or the `request_end` events of a Dynamo
/// request trace, and the origin of their timestamps (0 for Mooncake, whose timestamps are
/// relative; the earliest for Dynamo's absolute ones). `None` when the traffic is not such a
/// trace.
fn trace_rows(ctx: &Context) -> Result<Option<(Vec<Row>, f64)>, DeployError> {
    let Some(source) = ctx.source else { return Ok(None) };
    if source.get("type").and_then(Value::as_str) != Some("trace") {
        return Ok(None);
    }
    let format = match source.get("format").and_then(Value::as_str).unwrap_or("mooncake") {
        "mooncake" => RowFormat::Mooncake,
        "dynamo" => RowFormat::Dynamo,
        _ => return Ok(None),
    };
    let paths: Vec<&str> = source
        .get("paths")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut rows = Vec::new();
    for (k, p) in paths.iter().enumerate() {
        let full = if Path::new(p).is_absolute() { PathBuf::from(p) } else { ctx.base_dir.join(p) };
        let here = format!("traffic.source.paths[{k}]");
        let files =
            if full.is_dir() { rows::trace_files(&full).map_err(|e| DeployError::new(&here, e))? } else { vec![full] };
        for f in files {
            rows::read(&f, format, &mut rows)
                .map_err(|e| DeployError::new(&here, format!("{e} (read by the planner's load-predictor backtest)")))?;
        }
    }
    let origin = if format == RowFormat::Dynamo { rows.iter().map(|r| r.0).fold(f64::INFINITY, f64::min) } else { 0.0 };
    Ok(Some((rows, if origin.is_finite() { origin } else { 0.0 })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::Sla;

    #[test]
    fn windows_follow_the_planners_trace_utility() {
        // Mooncake: buckets from 0 (timestamps are relative), from the first non-empty one to
        // the last, empty ones as zeros.
        let rows = [(100_000.0, 100, 10), (200_000.0, 300, 30), (700_000.0, 50, 5)];
        let w = build_windows(&rows, 0.0, 180);
        assert_eq!(w, vec![(1.0, 100.0, 10.0), (1.0, 300.0, 30.0), (0.0, 0.0, 0.0), (1.0, 50.0, 5.0)]);
        // Dynamo: from the earliest request.
        let w = build_windows(&rows, 100_000.0, 180);
        assert_eq!(w, vec![(2.0, 200.0, 20.0), (0.0, 0.0, 0.0), (0.0, 0.0, 0.0), (1.0, 50.0, 5.0)]);
        assert!(build_windows(&[], 0.0, 60).is_empty());
    }

    #[test]
    fn the_loss_and_its_mean_are_the_backtests() {
        // A perfect forecast costs nothing; negative forecasts count as 0.
        assert_eq!(window_loss(3.0, 100.0, 10.0, (3.0, 100.0, 10.0)), 0.0);
        let l = window_loss(-1.0, -5.0, 10.0, (2.0, 100.0, 10.0));
        let want = 0.4 * (200.0f64).ln_1p() + 0.4 * (20.0f64).ln_1p() + 0.1 * (100.0f64).ln_1p();
        assert!((l - want).abs() < 1e-12, "{l} vs {want}");
        // The mean is taken over an exact sum.
        assert_eq!(exact_sum(&[1e16, 1.0, -1e16]), 1.0);
        assert_eq!(exact_sum(&[0.1; 10]), 1.0);
    }

    #[test]
    fn trace_rows_name_the_file_and_line_of_a_bad_row() {
        let dir = std::env::temp_dir().join(format!("servesim-planner-search-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("bad.jsonl");
        std::fs::write(&f, "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 2}\n\n{\"timestamp\": 5}\n")
            .unwrap();
        let source = json!({"type": "trace", "paths": ["bad.jsonl"], "format": "mooncake"});
        let sla = Sla::default();
        let ctx = Context {
            target: "goodput",
            pareto_objectives: &[],
            sla: &sla,
            disaggregated: false,
            source: Some(&source),
            base_dir: &dir,
        };
        let e = trace_rows(&ctx).unwrap_err();
        assert_eq!(e.key, "traffic.source.paths[0]");
        assert!(e.message.contains("bad.jsonl:3: expected mooncake"), "{e}");
        // Traffic that is not a Mooncake or Dynamo trace has no windows.
        let synthetic = json!({"type": "synthetic"});
        assert!(trace_rows(&Context { source: Some(&synthetic), ..ctx }).unwrap().is_none());
    }
}
