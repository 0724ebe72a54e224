//! A run from its workload to its report: the loop over the whole cluster, or, when nothing
//! couples the workers, one loop per worker on threads (`split`); then the report. The loop
//! itself (`sim`) knows nothing of either.

use crate::metrics::Collector;
use crate::report::Report;
use crate::sim::{run_loop, Progress, RunOptions, SimConfig, SimError};
use crate::split;
use servesim_workload::Workload;

/// Runs `workload` to completion and returns the report.
pub fn simulate(
    workload: &Workload,
    config: &SimConfig,
    collector: Collector<'_>,
    progress: &mut dyn Progress,
) -> Result<Report, SimError> {
    simulate_with(workload, config, collector, progress, RunOptions::default())
}

/// [`simulate`] with [`RunOptions`].
pub fn simulate_with(
    workload: &Workload,
    config: &SimConfig,
    mut collector: Collector<'_>,
    progress: &mut dyn Progress,
    options: RunOptions<'_>,
) -> Result<Report, SimError> {
    if options.autoscaler.is_some() || options.stop_at_ms.is_some() || workload.is_profile() {
        // An autoscaled or stopped run is replayed pass by pass, in one loop: the autoscaler
        // must see every pass, and the stop cuts the whole cluster at one instant (an agentic
        // profile's deadlines too, and its idle caps move timers between passes).
        let config = SimConfig { fast_forward: false, split_workers: false, ..config.clone() };
        let looped = run_loop(workload, &config, collector, progress, options)?;
        let mut report = Report::build(&config, &looped.collector, looped.end_ms);
        report.worker_seconds = looped.worker_seconds;
        return Ok(report);
    }
    if split::applies(workload, config, &collector) {
        let end_ms = split::simulate(workload, config, &mut collector, progress, options.pacer)?;
        return Ok(Report::build(config, &collector, end_ms));
    }
    let looped = run_loop(workload, config, collector, progress, options)?;
    Ok(Report::build(config, &looped.collector, looped.end_ms))
}
