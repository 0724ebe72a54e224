//! The flags of the reports people look at: the decomposed TTFT, telemetry files and the
//! one-file HTML report (rendered by servesim-report; this is glue).

use std::path::{Path, PathBuf};

use clap::Args;
use servesim_replay::telemetry::{TelemetryFormat, TelemetryWriter};
use servesim_replay::{TelemetrySink, Topology};
use servesim_report::{Requests, TelemetrySeries};

use crate::failure::Failure;
use crate::output::ReportFile;

/// Default telemetry interval (the reference's `sample_interval_ms`).
pub const DEFAULT_INTERVAL_MS: f64 = 1000.0;

#[derive(Args, Debug, Default, Clone)]
pub struct ReportFlags {
    /// Split each request's TTFT into router_queue, engine_queue, prefill, kv_transfer and
    /// first_token (`ttft_breakdown_ms` in the per-request records; their means and p90s in the
    /// summary as `mean_ttft_<part>_ms` / `p90_ttft_<part>_ms`).
    #[arg(long, help_heading = "Reports")]
    pub ttft_breakdown: bool,
    /// Write per-worker and cluster time series sampled on the virtual clock here: CSV for a
    /// `.csv` file, JSON lines otherwise.
    #[arg(long, value_name = "PATH", help_heading = "Reports")]
    pub telemetry: Option<PathBuf>,
    /// Telemetry sample interval in simulated ms (default 1000).
    #[arg(long, value_name = "MS", help_heading = "Reports")]
    pub telemetry_interval_ms: Option<f64>,
    /// Write a self-contained HTML report (summary, latency charts, telemetry heatmaps,
    /// configuration) here.
    #[arg(long, value_name = "PATH", help_heading = "Reports")]
    pub report_html: Option<PathBuf>,
}

impl ReportFlags {
    /// The report paths to check against the inputs and each other.
    pub fn paths(&self) -> Vec<(&'static str, &Path)> {
        let mut v = Vec::new();
        if let Some(p) = &self.telemetry {
            v.push(("telemetry", p.as_path()));
        }
        if let Some(p) = &self.report_html {
            v.push(("report-html", p.as_path()));
        }
        v
    }

    /// Whether telemetry is sampled (for a file or for the HTML report's charts).
    pub fn sampled(&self) -> bool {
        self.telemetry.is_some() || self.report_html.is_some()
    }

    pub fn check(&self) -> Result<f64, Failure> {
        match self.telemetry_interval_ms {
            Some(ms) if !(ms.is_finite() && ms > 0.0) => {
                Err(Failure::input(format!("--telemetry-interval-ms must be a positive number, got {ms}")))
            }
            // Finer samples only repeat the state between forward passes (milliseconds), and
            // write gigabytes per simulated minute.
            Some(ms) if ms < servesim_replay::telemetry::MIN_INTERVAL_MS => Err(Failure::input(format!(
                "--telemetry-interval-ms must be at least {} (one sample per simulated millisecond), got {ms}: finer \
                 samples only repeat the state between forward passes, and fill the disk",
                servesim_replay::telemetry::MIN_INTERVAL_MS,
                ms = servesim_workload::error::short_number(ms)
            ))),
            Some(_) if !self.sampled() => {
                Err(Failure::input("--telemetry-interval-ms applies to --telemetry or --report-html"))
            }
            Some(ms) => Ok(ms),
            None => Ok(DEFAULT_INTERVAL_MS),
        }
    }
}

/// The report outputs of one run, open before it starts. A run borrows its fields apart: the
/// per-request sink feeds `requests`, the telemetry sink (see [`telemetry_sink`]) `telemetry`
/// and `series`.
pub struct Outputs {
    pub interval_ms: f64,
    pub breakdown: bool,
    pub telemetry: Option<(ReportFile, TelemetryFormat)>,
    pub html: Option<ReportFile>,
    pub requests: Requests,
    pub series: TelemetrySeries,
}

impl Outputs {
    pub fn open(flags: &ReportFlags) -> Result<Outputs, Failure> {
        let interval_ms = flags.check()?;
        let telemetry = match &flags.telemetry {
            Some(p) => Some((ReportFile::create(p)?, TelemetryFormat::for_path(p))),
            None => None,
        };
        let html = flags.report_html.as_deref().map(ReportFile::create).transpose()?;
        Ok(Outputs {
            interval_ms,
            breakdown: flags.ttft_breakdown,
            telemetry,
            html,
            requests: Requests::default(),
            series: TelemetrySeries::default(),
        })
    }

    /// Renders the HTML page (if asked for) and moves every report into place.
    pub fn finish(
        mut self,
        title: &str,
        summary: &serde_json::Map<String, serde_json::Value>,
        config: &serde_json::Value,
        planner: Option<&servesim_report::PlannerView>,
    ) -> Result<Vec<PathBuf>, String> {
        let mut written = Vec::new();
        if let Some(mut file) = self.html.take() {
            let page = servesim_report::RunPage {
                title,
                summary,
                config,
                requests: &self.requests,
                telemetry: Some(&self.series).filter(|s| s.num_samples() > 0),
                planner,
                candidate: None,
            };
            let html = servesim_report::render_run(&page);
            std::io::Write::write_all(file.writer(), html.as_bytes())
                .map_err(|e| format!("{}: write failed: {e}", file.path().display()))?;
            written.push(file.path().to_path_buf());
            file.commit()?;
        }
        if let Some((file, _)) = self.telemetry.take() {
            written.push(file.path().to_path_buf());
            file.commit()?;
        }
        Ok(written)
    }
}

/// The run page's view of what the planner did.
pub fn planner_view(
    run: &servesim_replay::planned::PlannerRun,
    agg: bool,
    end_ms: f64,
) -> servesim_report::PlannerView {
    servesim_report::PlannerView {
        agg,
        timeline: run.timeline.clone(),
        end_s: end_ms / 1000.0,
        events: run.events.iter().map(|e| (e.at_s, e.component.to_string(), e.from_count, e.to_count)).collect(),
    }
}

/// The telemetry file's writer, if one was asked for.
pub fn telemetry_writer(
    telemetry: &mut Option<(ReportFile, TelemetryFormat)>,
) -> Option<TelemetryWriter<&mut std::io::BufWriter<std::fs::File>>> {
    telemetry.as_mut().map(|(file, format)| TelemetryWriter::new(file.writer(), *format))
}

/// Every telemetry consumer of a run: the file and the HTML report's series.
pub fn telemetry_sink<'a, W: TelemetrySink + Send>(
    writer: Option<&'a mut W>,
    series: Option<&'a mut TelemetrySeries>,
) -> Option<impl TelemetrySink + Send + 'a> {
    (writer.is_some() || series.is_some()).then_some((writer, series))
}

/// The configuration the HTML report shows for a flag-form run: the command line and the
/// pools the flags made.
pub fn flag_config(topology: &Topology) -> serde_json::Value {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args = format!("servesim {}", args.join(" "));
    let pools: Vec<serde_json::Value> = topology
        .pools()
        .iter()
        .map(|p| {
            let e = &p.engine;
            serde_json::json!({
                "role": format!("{:?}", p.role).to_lowercase(),
                "workers": p.workers,
                "dp_size": p.deployment.dp_size,
                "backend": e.backend.name(),
                "num_gpu_blocks": e.num_gpu_blocks,
                "block_size": e.block_size,
                "max_num_seqs": e.max_num_seqs,
                "max_num_batched_tokens": e.max_num_batched_tokens,
                "enable_prefix_caching": e.enable_prefix_caching,
            })
        })
        .collect();
    serde_json::json!({"command": args, "pools": pools})
}

/// Writes an ensemble's page (`--report-html` with `--ensemble`) into `file`, opened before
/// the run, and moves it into place. `summary` and `members` hold no wall-clock values, so the
/// page is the same for the same inputs.
pub fn write_ensemble_page(
    mut file: crate::output::ReportFile,
    title: &str,
    summary: &serde_json::Map<String, serde_json::Value>,
    members: &[serde_json::Map<String, serde_json::Value>],
    variation: &str,
    config: &serde_json::Value,
) -> Result<PathBuf, Failure> {
    let page = servesim_report::EnsemblePage { title, summary, members, variation, config };
    let html = servesim_report::render_ensemble(&page);
    std::io::Write::write_all(file.writer(), html.as_bytes())
        .map_err(|e| Failure::run(format!("{}: write failed: {e}", file.path().display())))?;
    let path = file.path().to_path_buf();
    file.commit().map_err(Failure::run)?;
    Ok(path)
}

/// What varies between the members of an ensemble, for its page.
pub fn ensemble_variation(timing_jitter_cv: f64) -> String {
    let seeds = "member i adds i to the arrival, router and token seeds";
    if timing_jitter_cv > 0.0 {
        format!("{seeds}; each pass's duration jittered with CV {timing_jitter_cv}")
    } else {
        seeds.to_string()
    }
}
