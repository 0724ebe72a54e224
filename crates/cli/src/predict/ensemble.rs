//! `predict --ensemble N`, in the flag form and the `-c FILE` form: N seeded members of the run
//! (`servesim_replay::Run::ensemble`), their summaries folded into medians with 90 % intervals.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use servesim_calibrate::file::Calibration;
use servesim_replay::{Run, SimConfig};
use servesim_workload::Workload;

use super::args::{queue_limit, sim_failure, ConfigFlags, PredictArgs};
use crate::failure::Failure;
use crate::flags::Format;
use crate::outdir::OutputDir;
use crate::output::{print_out, write_file, ReportFile};
use crate::table;

/// Refuses an ensemble size out of range, and outputs that describe one run (`per_request`:
/// --report-jsonl, or -c's --capture-per-request).
fn check_ensemble(n: usize, per_request: bool, reports: &crate::flags::reports::ReportFlags) -> Result<(), Failure> {
    if !(2..=100_000).contains(&n) {
        return Err(Failure::input(format!("--ensemble must be between 2 and 100000, got {n}")));
    }
    if per_request || reports.telemetry.is_some() {
        return Err(Failure::input(
            "--ensemble reports intervals of summary values; per-request records (--report-jsonl, \
             --capture-per-request) and --telemetry describe one run (drop --ensemble for them)",
        ));
    }
    Ok(())
}

/// `predict ... --ensemble N` (the flag form): the members' summaries folded into medians and
/// intervals.
pub(super) fn flag_form(
    a: &PredictArgs,
    workload: &Workload,
    config: &SimConfig,
    n: usize,
    calibration: Option<&Calibration>,
    started: Instant,
) -> Result<(), Failure> {
    check_ensemble(n, a.report_jsonl.is_some(), &a.reports)?;
    let mut summary_file = a.report_json.as_deref().map(ReportFile::create).transpose()?;
    let html = a.reports.report_html.as_deref().map(ReportFile::create).transpose()?;
    let queue = queue_limit(a);
    let reports = Run::new(workload, config)
        .queue_limit(queue)
        .ttft_breakdown(a.reports.ttft_breakdown)
        .ensemble(n)
        .map_err(|e| sim_failure(a, e))?;
    let summaries: Vec<_> = reports
        .iter()
        .map(|r| {
            let mut s = r.summary_json();
            s.extend(servesim_replay::workload_keys(workload));
            for key in servesim_replay::WALL_CLOCK_KEYS {
                s.remove(key);
            }
            s
        })
        .collect();
    let mut summary = servesim_replay::ensemble::summarize(&summaries);
    if let Some(c) = calibration {
        widen(c, &mut summary);
    }
    let page = match html {
        Some(file) => Some(crate::flags::reports::write_ensemble_page(
            file,
            "servesim predict --ensemble",
            &summary,
            &summaries,
            &crate::flags::reports::ensemble_variation(config.timing_jitter_cv),
            &crate::flags::reports::flag_config(&config.topology),
        )?),
        None => None,
    };
    if !a.no_wall_clock {
        summary.insert("wall_time_ms".into(), serde_json::json!(started.elapsed().as_secs_f64() * 1000.0));
    }
    let pretty = serde_json::to_string_pretty(&serde_json::Value::Object(summary.clone())).expect("summary serialises");
    match a.format {
        Format::Json => print_out(&format!("{pretty}\n"))?,
        Format::Table => print_out(&table::render_ensemble(&summary, n))?,
    }
    if let (Some(p), Format::Table) = (&page, a.format) {
        print_out(&format!("Saved report to: {}\n", p.display()))?;
    }
    if let Some(mut w) = summary_file.take() {
        w.writer()
            .write_all(pretty.as_bytes())
            .and_then(|_| w.writer().write_all(b"\n"))
            .map_err(|e| Failure::run(format!("{}: write failed: {e}", w.path().display())))?;
        let path = w.path().to_path_buf();
        w.commit().map_err(Failure::run)?;
        if a.format == Format::Table {
            print_out(&format!("Saved full report to: {}\n", path.display()))?;
        }
    }
    Ok(())
}

/// A calibration's model error widens the intervals beyond the arrival noise; the summary
/// says by how much (`calibration_model_error`).
fn widen(c: &Calibration, summary: &mut serde_json::Map<String, serde_json::Value>) {
    let widened = c.widen(summary);
    let log_rms: serde_json::Map<_, _> =
        c.model_error.iter().map(|(m, e)| (m.name().to_string(), serde_json::json!(e.log_rms))).collect();
    summary.insert(
        "calibration_model_error".into(),
        serde_json::json!({
            "source": if c.cross_validated { "cross-validated" } else { "in-sample" },
            "log_rms": log_rms,
            "widened": widened,
        }),
    );
}

/// A `predict -c` run as read: the prepared deployment, its input files, the configuration tree
/// (with --set applied) and the calibration, if any.
pub(super) struct Loaded<'a> {
    pub prepared: &'a servesim_deploy::Prepared,
    pub inputs: &'a [PathBuf],
    pub tree: &'a serde_json::Value,
    pub calibration: Option<&'a Calibration>,
}

/// `predict -c ... --ensemble N`: prediction.json holds the members' medians with `<key>_p05`
/// and `<key>_p95` beside each numeric key, as the flag form's ensemble summary does.
pub(super) fn file_form(
    f: &ConfigFlags,
    flags: &crate::flags::reports::ReportFlags,
    json: bool,
    n: usize,
    run: Loaded<'_>,
) -> Result<(), Failure> {
    let Loaded { prepared, inputs, tree, calibration } = run;
    check_ensemble(n, f.capture_per_request, flags)?;
    if prepared.config.planner.is_some() {
        return Err(Failure::input(
            "--ensemble does not run a planner yet: remove `planner:` from the configuration, or drop --ensemble",
        ));
    }
    let staged = OutputDir::open(&f.output_dir, f.overwrite, inputs)?;
    let html = flags.report_html.as_deref().map(ReportFile::create).transpose()?;
    // Every member stops where the run would (`traffic.stop.max_virtual_time_seconds`).
    let reports = prepared.run().ttft_breakdown(flags.ttft_breakdown).ensemble(n).map_err(Failure::run)?;
    if let Some(e) = prepared.workload.take_error() {
        return Err(Failure::run(format!("{e} (the trace changed during the replay)")));
    }
    let summaries: Vec<_> = reports
        .iter()
        .map(|r| {
            let mut s = servesim_deploy::prediction_summary(prepared, r);
            for key in servesim_replay::WALL_CLOCK_KEYS {
                s.remove(key);
            }
            s
        })
        .collect();
    let mut folded = servesim_replay::ensemble::summarize(&summaries);
    if let Some(c) = calibration {
        widen(c, &mut folded);
    }
    let summary = servesim_deploy::sorted(&serde_json::Value::Object(folded));
    let compact = serde_json::to_string(&summary).expect("summary serialises");
    write_file(&staged.path("prediction.json"), compact.as_bytes())?;
    staged.commit()?;
    let page = match html {
        // The page shows the configuration file as read (with --set applied).
        Some(file) => Some(crate::flags::reports::write_ensemble_page(
            file,
            "servesim predict -c --ensemble",
            summary.as_object().expect("the summary is an object"),
            &summaries,
            &crate::flags::reports::ensemble_variation(prepared.sim.timing_jitter_cv),
            tree,
        )?),
        None => None,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&summary).expect("summary serialises"));
    } else {
        print!("{}", table::render_ensemble(summary.as_object().expect("the summary is an object"), n));
        println!("Saved prediction to: {}", f.output_dir.join("prediction.json").display());
        if let Some(p) = page {
            println!("Saved report to: {}", p.display());
        }
    }
    Ok(())
}
