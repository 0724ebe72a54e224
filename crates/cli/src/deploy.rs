//! `servesim predict -c FILE`: the unified deployment YAML (servesim-deploy) run once, written
//! to an output directory as the reference does (`prediction.json`, `requests.jsonl`).

use std::fs;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::{Args, ValueEnum};
use servesim_replay::{request_json, request_json_with_breakdown, RequestRecord};

use crate::outdir::OutputDir;
use crate::progress::Bar;
use crate::table;
use crate::Failure;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Stack {
    Engine,
    Dynamo,
}

/// The flags of the configuration-file form of predict.
#[derive(Args, Debug, Default)]
pub struct ConfigFlags {
    /// A unified deployment YAML (traffic / engine / evaluation / router); replaces the
    /// trace, engine and load flags.
    #[arg(short = 'c', long = "config", value_name = "FILE", help_heading = "Deployment config")]
    pub config: Option<PathBuf>,
    /// Override a configuration value: a dotted key path and a YAML value (repeatable).
    #[arg(long = "set", value_name = "PATH=VALUE", help_heading = "Deployment config")]
    pub set: Vec<String>,
    /// Where prediction.json (and requests.jsonl) go.
    #[arg(long, value_name = "DIR", default_value = "aisimulate-output", help_heading = "Deployment config")]
    pub output_dir: PathBuf,
    /// Replace an existing output directory.
    #[arg(long, help_heading = "Deployment config")]
    pub overwrite: bool,
    /// Also write requests.jsonl, one record per request.
    #[arg(long, help_heading = "Deployment config")]
    pub capture_per_request: bool,
    /// Accepted for compatibility: servesim has one stack, and `router:` works with either.
    #[arg(long, value_enum, value_name = "NAME", help_heading = "Deployment config")]
    pub stack: Option<Stack>,
}

impl ConfigFlags {
    /// Without -c these flags have nothing to act on.
    pub fn check_flag_form(&self) -> Result<(), Failure> {
        if !self.set.is_empty() || self.overwrite || self.capture_per_request || self.stack.is_some() {
            return Err(Failure::input(
                "--set, --overwrite, --capture-per-request and --stack apply to -c/--config (use --report-json / --report-jsonl with the flag form)",
            ));
        }
        if self.output_dir != Path::new("aisimulate-output") {
            return Err(Failure::input(
                "--output-dir applies to -c/--config (use --report-json / --report-jsonl with the flag form)",
            ));
        }
        Ok(())
    }
}

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
             --online, --no-wall-clock and the report flags (--report-html, --telemetry, --telemetry-interval-ms, --ttft-breakdown) apply"
        )));
    }
    Ok(())
}

/// A directory of servesim's alone (the candidate pages beside a recommend page), written under
/// a temporary name and renamed into place when complete, so an error never leaves a directory
/// that looks like a finished run. Output directories, which may hold the user's files too, are
/// [`crate::outdir::OutputDir`]s.
pub struct Staged {
    tmp: PathBuf,
    target: PathBuf,
    done: bool,
}

impl Staged {
    pub fn new(target: &Path, overwrite: bool) -> Result<Staged, Failure> {
        if target.exists() && !overwrite {
            return Err(Failure::input(format!(
                "{}: output directory exists; pass --overwrite to replace it",
                target.display()
            )));
        }
        let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "output".into());
        let parent = match target.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        fs::create_dir_all(&parent).map_err(|e| Failure::input(format!("{}: cannot create: {e}", parent.display())))?;
        let tmp = parent.join(format!(".{name}.partial-{}", std::process::id()));
        let _ = fs::remove_dir_all(&tmp);
        fs::create_dir(&tmp).map_err(|e| Failure::input(format!("{}: cannot create: {e}", tmp.display())))?;
        servesim_workload::scratch::register(&tmp);
        Ok(Staged { tmp, target: target.to_path_buf(), done: false })
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.tmp.join(file)
    }

    /// Moves the finished directory into place (replacing an old one).
    pub fn commit(mut self) -> Result<(), Failure> {
        let fail = |e: std::io::Error| Failure::run(format!("{}: cannot move into place: {e}", self.target.display()));
        if self.target.exists() {
            let old = self.tmp.with_extension("old");
            fs::rename(&self.target, &old).map_err(fail)?;
            fs::rename(&self.tmp, &self.target).map_err(fail)?;
            let _ = fs::remove_dir_all(&old);
        } else {
            fs::rename(&self.tmp, &self.target).map_err(fail)?;
        }
        servesim_workload::scratch::unregister(&self.tmp);
        self.done = true;
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.done {
            let _ = fs::remove_dir_all(&self.tmp);
            servesim_workload::scratch::unregister(&self.tmp);
        }
    }
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), Failure> {
    fs::write(path, bytes).map_err(|e| Failure::run(format!("{}: write failed: {e}", path.display())))
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

/// Everything a `-c` run reads: the configuration file and the paths its tree names.
pub fn run_inputs(config: &Path, tree: &serde_json::Value) -> Vec<PathBuf> {
    let mut inputs = vec![config.to_path_buf()];
    inputs.extend(servesim_deploy::input_paths(tree, &servesim_deploy::config_base(config)));
    inputs
}

/// Refuses reports that would overwrite an input or land on one of servesim's outputs.
pub fn check_reports(reports: &[(&str, &Path)], inputs: &[PathBuf], output_dir: &Path) -> Result<(), Failure> {
    crate::output::check_report_paths(reports, inputs)?;
    crate::outdir::check_reports_clear_of_outputs(reports, output_dir)
}

pub fn predict(
    f: &ConfigFlags,
    flags: &crate::reports::ReportFlags,
    json: bool,
    variation: &Variation,
) -> Result<(), Failure> {
    let started = Instant::now();
    check_no_other_flags()?;
    let path = f.config.as_deref().expect("called with -c");
    let cv = crate::predict::timing_jitter_cv(variation.timing_jitter_cv)?;
    let mut prepared = servesim_deploy::prepare_file(path, &f.set).map_err(Failure::input)?;
    prepared.sim.timing_jitter_cv = cv;
    prepared.sim.threads = variation.threads;
    let tree = servesim_deploy::load_tree(path, &f.set).map_err(Failure::input)?;
    let inputs = run_inputs(path, &tree);
    check_reports(&flags.paths(), &inputs, &f.output_dir)?;
    if let Some(n) = variation.ensemble {
        return predict_ensemble(f, flags, json, &prepared, n, &inputs, &tree);
    }
    // The output directory first: reports may be written inside it.
    let staged = OutputDir::open(&f.output_dir, f.overwrite, &inputs)?;
    let mut outputs = crate::reports::Outputs::open(flags)?;
    let mut records = if f.capture_per_request {
        let p = staged.path("requests.jsonl");
        Some(BufWriter::new(
            fs::File::create(&p).map_err(|e| Failure::run(format!("{}: cannot create: {e}", p.display())))?,
        ))
    } else {
        None
    };
    let crate::reports::Outputs { requests, series, telemetry, html, interval_ms, breakdown } = &mut outputs;
    let want_html = html.is_some();
    let record_json = if *breakdown { request_json_with_breakdown } else { request_json };
    let mut telemetry_writer = crate::reports::telemetry_writer(telemetry);
    let mut telemetry_sink = crate::reports::telemetry_sink(telemetry_writer.as_mut(), want_html.then_some(series));
    let mut write_error: Option<std::io::Error> = None;
    let mut sink = |r: &RequestRecord| {
        if want_html {
            requests.add(r);
        }
        if let (Some(w), None) = (records.as_mut(), write_error.as_ref()) {
            let line = record_json(r);
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
    let view = planner.as_ref().map(|run| crate::reports::planner_view(run, run.is_agg(), report.totals.duration_ms));
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

/// `predict -c ... --ensemble N`: prediction.json holds the members' medians with `<key>_p05`
/// and `<key>_p95` beside each numeric key, as the flag form's ensemble summary does.
fn predict_ensemble(
    f: &ConfigFlags,
    flags: &crate::reports::ReportFlags,
    json: bool,
    prepared: &servesim_deploy::Prepared,
    n: usize,
    inputs: &[PathBuf],
    tree: &serde_json::Value,
) -> Result<(), Failure> {
    crate::predict::check_ensemble(n, f.capture_per_request, flags)?;
    if prepared.config.planner.is_some() {
        return Err(Failure::input(
            "--ensemble does not run a planner yet: remove `planner:` from the configuration, or drop --ensemble",
        ));
    }
    let staged = OutputDir::open(&f.output_dir, f.overwrite, inputs)?;
    let html = flags.report_html.as_deref().map(crate::output::ReportFile::create).transpose()?;
    // Members run to the end of the workload: `traffic.stop.max_virtual_time_seconds` does not
    // apply to them (Prepared::run would set it).
    let reports = servesim_replay::Run::new(&prepared.workload, &prepared.sim)
        .ttft_breakdown(flags.ttft_breakdown)
        .ensemble(n)
        .map_err(Failure::run)?;
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
    let summary = servesim_deploy::sorted(&serde_json::Value::Object(servesim_replay::ensemble::summarize(&summaries)));
    let compact = serde_json::to_string(&summary).expect("summary serialises");
    write_file(&staged.path("prediction.json"), compact.as_bytes())?;
    staged.commit()?;
    let page = match html {
        // The page shows the configuration file as read (with --set applied).
        Some(file) => Some(crate::reports::write_ensemble_page(
            file,
            "servesim predict -c --ensemble",
            summary.as_object().expect("the summary is an object"),
            &summaries,
            &crate::reports::ensemble_variation(prepared.sim.timing_jitter_cv),
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
