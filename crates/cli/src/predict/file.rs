//! `servesim predict -c FILE`: the unified deployment YAML (servesim-deploy) run once, written
//! to an output directory as the reference does (`prediction.json`, `requests.jsonl`).

use std::fs;
use std::io::{BufWriter, Write};
use std::time::Instant;

use serde_json::json;
use servesim_replay::{request_json, request_json_with_breakdown, RequestRecord, Status};

use super::args::ConfigFlags;
use crate::failure::Failure;
use crate::outdir::{check_reports, run_inputs, OutputDir};
use crate::output::write_file;
use crate::progress::Bar;
use crate::table;

/// Flags of the flag form that mean nothing with `-c` (the configuration says it).
const CONFIG_MODE_FLAGS: &[&str] = &[
    "-c",
    "--config",
    "--set",
    "--output-dir",
    "--overwrite",
    "--capture-per-request",
    "--stack",
    "--format",
    "--ttft-breakdown",
    "--telemetry",
    "--telemetry-interval-ms",
    "--report-html",
    "--ensemble",
    "--calibration",
    "--timing-jitter-cv",
    "--threads",
    "--online",
    "--no-wall-clock",
];

fn check_no_other_flags() -> Result<(), Failure> {
    let args: Vec<String> = std::env::args().skip(2).collect();
    let mut skip_value = false;
    for a in &args {
        if skip_value {
            skip_value = false;
            continue;
        }
        let name = a.split('=').next().unwrap_or(a);
        if CONFIG_MODE_FLAGS.contains(&name) {
            skip_value = !a.contains('=')
                && !matches!(
                    name,
                    "--overwrite" | "--capture-per-request" | "--ttft-breakdown" | "--online" | "--no-wall-clock"
                );
            continue;
        }
        return Err(Failure::input(format!(
            "{a}: with -c/--config the configuration file describes the run; only --set, --output-dir, \
             --overwrite, --format, --capture-per-request, --stack, --ensemble, --timing-jitter-cv, --threads, \
             --online, --no-wall-clock, --calibration and the report flags (--report-html, --telemetry, --telemetry-interval-ms, --ttft-breakdown) apply"
        )));
    }
    Ok(())
}

/// What varies a `predict -c` run beyond the configuration file: `--ensemble`,
/// `--timing-jitter-cv`, `--threads` and `--online`.
pub struct Variation {
    pub ensemble: Option<usize>,
    pub timing_jitter_cv: Option<f64>,
    pub threads: usize,
    /// Pace the run on the wall clock.
    pub online: bool,
    /// Leave the values measured on the host's clock out of prediction.json.
    pub no_wall_clock: bool,
}

/// `predict -c FILE` (with `--set` overrides): one run of the configuration, or an ensemble of
/// it, written to the output directory; the report flags add their files.
pub fn predict(
    f: &ConfigFlags,
    flags: &crate::flags::reports::ReportFlags,
    json: bool,
    variation: &Variation,
) -> Result<(), Failure> {
    let started = Instant::now();
    check_no_other_flags()?;
    let path = f.config.as_deref().expect("called with -c");
    let cv = super::args::timing_jitter_cv(variation.timing_jitter_cv)?;
    // A calibration is a set of overrides on the configuration as given.
    let mut sets = f.set.clone();
    let mut calibration = None;
    if let Some(c) = &f.calibration {
        let tree = servesim_deploy::load_tree(path, &f.set).map_err(Failure::input)?;
        let (file, extra) = crate::calibrate::overrides(c, &tree)?;
        sets.extend(extra);
        calibration = Some(file);
    }
    // Read once: the tree validated is the tree the run records as its inputs.
    let tree = servesim_deploy::load_tree(path, &sets).map_err(Failure::input)?;
    if tree.pointer("/engine/mode").and_then(|m| m.as_str()) == Some("afd") {
        return afd(f, flags, json, variation, &tree, calibration.is_some());
    }
    let encoder = tree.pointer("/engine/workers/encoder").filter(|e| !e.is_null());
    // A native pool is replayed with the language workers; an analytical one is an overlay.
    if encoder.is_some_and(|e| e.get("mode").and_then(|m| m.as_str()) != Some("native")) {
        return super::epd::predict(f, flags, json, variation, &tree, calibration.is_some());
    }
    let mut prepared = servesim_deploy::prepare_tree(path, &tree).map_err(Failure::input)?;
    prepared.sim.timing_jitter_cv = cv;
    prepared.sim.threads = variation.threads;
    let mut inputs = run_inputs(path, &tree);
    inputs.extend(f.calibration.clone());
    check_reports(&flags.paths(), &inputs, &f.output_dir)?;
    if let Some(n) = variation.ensemble {
        let run = super::ensemble::Loaded {
            prepared: &prepared,
            inputs: &inputs,
            tree: &tree,
            calibration: calibration.as_ref(),
        };
        return super::ensemble::file_form(f, flags, json, n, run);
    }
    // The output directory first: reports may be written inside it.
    let staged = OutputDir::open(&f.output_dir, f.overwrite, &inputs)?;
    let mut outputs = crate::flags::reports::Outputs::open(flags)?;
    let mut records = if f.capture_per_request {
        let p = staged.path("requests.jsonl");
        Some(BufWriter::new(
            fs::File::create(&p).map_err(|e| Failure::run(format!("{}: cannot create: {e}", p.display())))?,
        ))
    } else {
        None
    };
    let crate::flags::reports::Outputs { requests, series, telemetry, html, interval_ms, breakdown } = &mut outputs;
    let want_html = html.is_some();
    let record_json = if *breakdown { request_json_with_breakdown } else { request_json };
    let mut telemetry_writer = crate::flags::reports::telemetry_writer(telemetry);
    let mut telemetry_sink =
        crate::flags::reports::telemetry_sink(telemetry_writer.as_mut(), want_html.then_some(series));
    let mut write_error: Option<std::io::Error> = None;
    let source = prepared.config.traffic.source.clone();
    let mut sink = |r: &RequestRecord| {
        if want_html {
            requests.add(r);
        }
        // As the reference: requests still in flight at the stop are not listed, and a request
        // outside any session is named as its source names it (a one-turn session).
        if let (Some(w), None, false) = (records.as_mut(), write_error.as_ref(), r.status == Status::Incomplete) {
            let mut line = record_json(r);
            if r.session.is_none() && r.meta.as_ref().is_none_or(|m| m.agentic.is_none()) {
                line["session_id"] = json!(source.unnamed_request_id(r.ordinal));
                line["turn_index"] = json!(0);
            }
            if let Err(e) =
                serde_json::to_writer(&mut *w, &line).map_err(std::io::Error::from).and_then(|_| w.write_all(b"\n"))
            {
                write_error = Some(e);
            }
        }
    };
    let sink_ref: Option<&mut (dyn FnMut(&RequestRecord) + Send)> =
        if f.capture_per_request || want_html { Some(&mut sink) } else { None };
    let planner = servesim_deploy::planner_run(&prepared).map_err(Failure::input)?;
    let mut run = prepared.run().records(sink_ref).ttft_breakdown(*breakdown).planner(planner).online(variation.online);
    if let Some(t) = telemetry_sink.as_mut() {
        run = run.telemetry(*interval_ms, t);
    }
    let mut bar = Bar::new();
    let result = run.go(&mut bar);
    bar.finish();
    drop(telemetry_sink);
    if let (Some(Err(e)), Some(p)) = (telemetry_writer.map(|w| w.finish()), flags.telemetry.as_ref()) {
        return Err(Failure::run(format!("{}: write failed: {e}", p.display())));
    }
    let mut ran = result.map_err(Failure::run)?;
    ran.report.wall_time_ms = started.elapsed().as_secs_f64() * 1000.0;
    if let Some(e) = prepared.workload.take_error() {
        return Err(Failure::run(format!("{e} (the trace changed during the replay)")));
    }
    if let Some(e) = write_error {
        return Err(Failure::run(format!("requests.jsonl: write failed: {e}")));
    }
    if let Some(mut w) = records.take() {
        w.flush().map_err(|e| Failure::run(format!("requests.jsonl: write failed: {e}")))?;
    }
    let mut summary_map = servesim_deploy::planned_summary(&prepared, &ran);
    let (report, planner) = (ran.report, ran.planner);
    if variation.no_wall_clock {
        for key in servesim_replay::WALL_CLOCK_KEYS {
            summary_map.remove(key);
        }
    }
    let summary = servesim_deploy::sorted(&serde_json::Value::Object(summary_map));
    // With a planner, the reference's `--stack dynamo` layout: the summary beside the planner.
    let document = match &planner {
        Some(run) => serde_json::json!({"summary": summary, "planner": servesim_deploy::sorted(&run.to_json())}),
        None => summary.clone(),
    };
    let compact = serde_json::to_string(&document).expect("summary serialises");
    write_file(&staged.path("prediction.json"), compact.as_bytes())?;
    // The results first, then the reports (which may sit in the output directory).
    staged.commit()?;
    // The page shows the configuration file as read (with --set applied), and no values
    // measured on the host's clock.
    let mut page_summary = summary.as_object().cloned().unwrap_or_default();
    for key in servesim_replay::WALL_CLOCK_KEYS {
        page_summary.remove(key);
    }
    let view =
        planner.as_ref().map(|run| crate::flags::reports::planner_view(run, run.is_agg(), report.totals.duration_ms));
    let written = outputs.finish("servesim predict -c", &page_summary, &tree, view.as_ref()).map_err(Failure::run)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&summary).expect("summary serialises"));
    } else {
        print!("{}", table::render(&report, true));
        if let Some(run) = &planner {
            print!("{}", table::worker_timeline(run));
        }
        println!("Saved prediction to: {}", f.output_dir.join("prediction.json").display());
        for p in written {
            println!("Saved report to: {}", p.display());
        }
    }
    Ok(())
}

/// Refuses the replay's per-request, report, ensemble, pacing and calibration options for a run
/// that is not a replay of its own (`what` says which and why).
pub(super) fn refuse_replay_flags(
    f: &ConfigFlags,
    flags: &crate::flags::reports::ReportFlags,
    variation: &Variation,
    calibrated: bool,
    what: &str,
) -> Result<(), Failure> {
    let refused = [
        (f.capture_per_request, "--capture-per-request"),
        (!flags.paths().is_empty(), "the report flags"),
        (variation.ensemble.is_some(), "--ensemble"),
        (variation.timing_jitter_cv.is_some(), "--timing-jitter-cv"),
        (variation.online, "--online"),
        (calibrated, "--calibration"),
    ];
    match refused.iter().find(|(on, _)| *on) {
        Some((_, flag)) => Err(Failure::input(format!("{flag}: not supported by servesim yet with {what}"))),
        None => Ok(()),
    }
}

/// `predict -c` of an `engine.mode: afd` configuration: the AFD foreground engine's schedule
/// (`servesim_deploy::afd`), written as the reference writes it. The replay's per-request,
/// report, ensemble and pacing options have no AFD counterpart yet and are refused by name.
fn afd(
    f: &ConfigFlags,
    flags: &crate::flags::reports::ReportFlags,
    json: bool,
    variation: &Variation,
    tree: &serde_json::Value,
    calibrated: bool,
) -> Result<(), Failure> {
    let path = f.config.as_deref().expect("called with -c");
    refuse_replay_flags(
        f,
        flags,
        variation,
        calibrated,
        "engine.mode: afd (the AFD foreground engine reports the summary only)",
    )?;
    let config =
        servesim_deploy::schema::read_predict(tree).map_err(|e| Failure::input(format!("{}: {e}", path.display())))?;
    let document =
        servesim_deploy::afd::predict(&config).map_err(|e| Failure::input(format!("{}: {e}", path.display())))?;
    let document = servesim_deploy::sorted(&document);
    let inputs = run_inputs(path, tree);
    let staged = OutputDir::open(&f.output_dir, f.overwrite, &inputs)?;
    let compact = serde_json::to_string(&document).expect("prediction serialises");
    write_file(&staged.path("prediction.json"), compact.as_bytes())?;
    staged.commit()?;
    if json {
        println!("{}", serde_json::to_string_pretty(&document).expect("prediction serialises"));
    } else {
        let s = &document["summary"];
        for key in ["mean_ttft_ms", "mean_tpot_ms", "mean_e2e_latency_ms", "output_throughput_tok_s", "duration_ms"] {
            println!("{key:<28} {:>14.3}", s[key].as_f64().unwrap_or(f64::NAN));
        }
        println!("Saved prediction to: {}", f.output_dir.join("prediction.json").display());
    }
    Ok(())
}
