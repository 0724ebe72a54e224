//! `servesim predict`: parse arguments, build the workload and the cluster, run, print. The
//! flags are [`args`]; `-c FILE` is [`mod@file`]; `--ensemble N` (either form) is [`ensemble`].

mod args;
mod ensemble;
mod epd;
mod file;

pub use args::PredictArgs;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use servesim_engine::{ConfigError, WorkerArgs};
use servesim_replay::memory::{available as available_memory, gib, session_bytes, WORKER_BYTES};
use servesim_replay::{request_json, request_json_with_breakdown, RequestRecord, Run, SimConfig, Sla, Topology};
use servesim_workload::formats::WekaBasis;
use servesim_workload::{load_trace, Arrivals, LoadMode, SyntheticSpec, TraceOptions, Workload};

use crate::failure::Failure;
use crate::flags::calibration::FlagCalibration;
use crate::flags::router::{router_mode, router_policy};
use crate::flags::workers::worker_args;
use crate::flags::{json_arg, Format};
use crate::output::{check_report_paths, print_out, ReportFile};
use crate::progress::Bar;
use crate::table;
use args::{check_online, queue_limit, sim_failure, timing_jitter_cv, NestedBasis};

/// The workers: one aggregated pool, or prefill and decode pools, with the calibration's pass
/// corrections in their timing.
fn cluster(a: &PredictArgs, mut calibration: Option<&mut FlagCalibration>) -> Result<Topology, Failure> {
    let engine = worker_args("extra-engine-args", a.extra_engine_args.as_deref())?;
    let mut calibrated = |role: &str, mut args: WorkerArgs| -> Result<WorkerArgs, Failure> {
        if let Some(c) = calibration.as_deref_mut() {
            c.apply(role, &mut args)?;
        }
        Ok(args)
    };
    let disaggregated = a.num_prefill_workers.is_some()
        || a.num_decode_workers.is_some()
        || a.prefill_engine_args.is_some()
        || a.decode_engine_args.is_some();
    let cluster = if disaggregated {
        if a.num_workers.is_some() {
            return Err(Failure::input(
                "--num-workers sets an aggregated cluster; use --num-prefill-workers and --num-decode-workers",
            ));
        }
        let staged = |flag: &str, arg: &Option<String>| match arg {
            Some(_) => worker_args(flag, arg.as_deref()),
            None => Ok(engine.clone()),
        };
        Topology::disaggregated(
            (
                calibrated("prefill", staged("prefill-engine-args", &a.prefill_engine_args)?)?,
                a.num_prefill_workers.unwrap_or(1),
            ),
            (
                calibrated("decode", staged("decode-engine-args", &a.decode_engine_args)?)?,
                a.num_decode_workers.unwrap_or(1),
            ),
        )
    } else {
        Topology::aggregated(calibrated("aggregated", engine)?, a.num_workers.unwrap_or(1))
    };
    cluster.map_err(crate::failure::topology_error)
}

fn positive(name: &str, v: Option<f64>) -> Result<(), Failure> {
    match v {
        Some(x) if !(x.is_finite() && x > 0.0) => {
            Err(Failure::input(format!("--{name} must be a positive number, got {x}")))
        }
        _ => Ok(()),
    }
}

/// Builds the workload and the load mode, rejecting contradictory flags.
fn workload(a: &PredictArgs, block_size: u32) -> Result<(Workload, LoadMode), Failure> {
    let synthetic = [a.input_tokens.is_some(), a.output_tokens.is_some(), a.request_count.is_some()];
    let any_synthetic = synthetic.iter().any(|&b| b);
    if a.replay_concurrency == Some(0) {
        return Err(Failure::input("--replay-concurrency must be at least 1"));
    }
    positive("arrival-speedup-ratio", a.arrival_speedup_ratio)?;
    if a.replay_concurrency.is_some() && a.arrival_speedup_ratio.is_some() {
        return Err(Failure::input(
            "--arrival-speedup-ratio applies to trace timestamps and cannot be combined with --replay-concurrency",
        ));
    }
    if !a.traces.is_empty() {
        if any_synthetic || a.request_rate.is_some() || a.arrival_interval_ms.is_some() {
            return Err(Failure::input(
                "give either trace files or a synthetic load (--input-tokens/--output-tokens/--request-count), not both",
            ));
        }
        let options = TraceOptions {
            trace_block_size: a.trace_block_size,
            arrival_speedup_ratio: a.arrival_speedup_ratio.unwrap_or(1.0),
            replay_concurrency: a.replay_concurrency,
            agentic_lanes: a.agentic_lanes,
            execution_model: a.execution_model.clone(),
            shared_prefix_ratio: a.trace_shared_prefix_ratio,
            num_prefix_groups: a.trace_num_prefix_groups,
            weka_basis: a.weka_nested_timestamp_basis.map(|b| match b {
                NestedBasis::Auto => WekaBasis::Auto,
                NestedBasis::Absolute => WekaBasis::Absolute,
                NestedBasis::Relative => WekaBasis::Relative,
            }),
            ..TraceOptions::new(a.trace_format)
        };
        return load_trace(&a.traces, &options).map_err(Failure::input);
    }
    if !synthetic.iter().all(|&b| b) {
        return Err(Failure::input(if any_synthetic {
            "a synthetic load needs all of --input-tokens, --output-tokens and --request-count"
        } else {
            "nothing to replay: give trace files or a synthetic load (--input-tokens, --output-tokens, --request-count); see --help"
        }));
    }
    let controls = [a.request_rate.is_some(), a.arrival_interval_ms.is_some(), a.replay_concurrency.is_some()];
    if controls.iter().filter(|&&b| b).count() != 1 {
        return Err(Failure::input(
            "a synthetic load needs exactly one of --request-rate, --arrival-interval-ms, --replay-concurrency",
        ));
    }
    if a.agentic_lanes.is_some() || a.execution_model.is_some() || a.weka_nested_timestamp_basis.is_some() {
        return Err(Failure::input(
            "--agentic-lanes, --execution-model and --weka-nested-timestamp-basis apply to agentic traces",
        ));
    }
    let arrivals = match (a.request_rate, a.arrival_interval_ms) {
        (Some(rate), _) => Arrivals::Poisson { rate_per_s: rate },
        (_, Some(ms)) => Arrivals::Interval { interval_ms: ms },
        _ => Arrivals::AllAtOnce,
    };
    let spec = SyntheticSpec {
        input_tokens: a.input_tokens.unwrap_or_default(),
        output_tokens: a.output_tokens.unwrap_or_default(),
        sessions: a.request_count.unwrap_or_default(),
        turns_per_session: a.turns_per_session,
        arrivals,
        seed: a.arrival_seed,
        shared_prefix_ratio: a.shared_prefix_ratio,
        num_prefix_groups: a.num_prefix_groups,
        inter_turn_delay_ms: a.inter_turn_delay_ms,
        block_tokens: block_size,
        group_seed: servesim_workload::GROUP_SEED,
        cached_prefix_tokens: 0,
        accumulate: false,
        images: None,
    };
    // As in Dynamo's synthetic replay, the speedup divides the generated arrival times and
    // think times.
    let load = match a.replay_concurrency {
        Some(c) => LoadMode::Concurrency { max_sessions: c },
        None => LoadMode::Timestamps { speedup: a.arrival_speedup_ratio.unwrap_or(1.0) },
    };
    let flag_error = |e: servesim_workload::InputError| match &e.field {
        Some(field) => Failure::input(format!("--{field} {}", e.message)),
        None => Failure::input(e),
    };
    spec.validate().map_err(flag_error)?;
    spec.check_times(a.arrival_speedup_ratio.filter(|_| a.replay_concurrency.is_none()).unwrap_or(1.0))
        .map_err(flag_error)?;
    Ok((Workload::Synthetic(spec), load))
}

/// Refuses counts whose state cannot fit in this machine's memory, before anything is allocated
/// for them (instead of aborting out of memory later).
fn check_counts(a: &PredictArgs, memory: Option<u64>) -> Result<(), Failure> {
    let Some(memory) = memory else { return Ok(()) };
    let workers = [a.num_workers, a.num_prefill_workers, a.num_decode_workers];
    let total: u64 = workers.iter().flatten().map(|&n| n as u64).sum();
    if total.saturating_mul(WORKER_BYTES) > memory {
        let flag = if a.num_workers.is_some() { "--num-workers" } else { "--num-prefill-workers/--num-decode-workers" };
        return Err(Failure::input(format!(
            "{flag}: {total} workers need about {} of memory; this machine has {} available (at most {} workers)",
            gib(total.saturating_mul(WORKER_BYTES)),
            gib(memory),
            memory / WORKER_BYTES
        )));
    }
    Ok(())
}

/// Refuses synthetic sessions whose prompts cannot fit in this machine's memory, before any is
/// generated: each turn's prompt as block ids of `block_size` tokens, and the engine's state of
/// the turn in flight; closed-loop runs hold that many sessions at once.
fn check_sessions(a: &PredictArgs, block_size: u32, memory: Option<u64>) -> Result<(), Failure> {
    let Some(memory) = memory else { return Ok(()) };
    if let (Some(input), true) = (a.input_tokens, a.traces.is_empty()) {
        let per_session = session_bytes(input as u64, a.turns_per_session as u64, block_size as u64);
        let sessions = a.replay_concurrency.unwrap_or(1).min(a.request_count.unwrap_or(1)).max(1) as u64;
        let need = per_session.saturating_mul(sessions);
        if need > memory {
            return Err(Failure::input(format!(
                "--turns-per-session {} × --input-tokens {input}{}: the sessions in flight need about {} of \
                 memory; this machine has {} available",
                a.turns_per_session,
                if sessions > 1 { format!(" × --replay-concurrency {sessions}") } else { String::new() },
                gib(need),
                gib(memory)
            )));
        }
    }
    Ok(())
}

/// Refuses a synthetic prompt that no worker can ever take (it would be generated, then
/// rejected): one that reaches an engine's `max_model_len`, or needs more KV blocks than its
/// cache has. Disaggregated requests pass through both pools, so each must take it.
fn check_prompt_fits(a: &PredictArgs, topology: &Topology) -> Result<(), Failure> {
    let (Some(input), true) = (a.input_tokens, a.traces.is_empty()) else { return Ok(()) };
    let disaggregated = topology.pools().len() > 1;
    for pool in topology.pools() {
        let engine = pool.rank_engine();
        let workers = if disaggregated { format!("the {} workers'", pool.role.name()) } else { "the workers'".into() };
        if let Some(max) = engine.max_model_len.filter(|&m| input >= m) {
            return Err(Failure::input(format!(
                "--input-tokens {input}: a prompt must be shorter than {workers} max_model_len ({max}); no request \
                 could run"
            )));
        }
        let blocks = input.div_ceil(engine.block_size.max(1));
        if blocks > engine.num_gpu_blocks {
            return Err(Failure::input(format!(
                "--input-tokens {input}: a prompt needs {blocks} KV blocks of {} tokens, more than {workers} cache \
                 holds ({} blocks, {} tokens); no request could run (raise num_gpu_blocks in the engine \
                 arguments, or lower --input-tokens)",
                engine.block_size,
                engine.num_gpu_blocks,
                engine.num_gpu_blocks as u64 * engine.block_size as u64
            )));
        }
    }
    Ok(())
}

/// Files the run reads: traces and configuration files (not inline JSON).
fn inputs(a: &PredictArgs) -> Vec<&Path> {
    let mut inputs: Vec<&Path> = a.traces.iter().map(PathBuf::as_path).collect();
    let configs =
        [&a.extra_engine_args, &a.prefill_engine_args, &a.decode_engine_args, &a.router_config, &a.planner_config];
    for arg in configs.into_iter().flatten() {
        if !arg.trim_start().starts_with('{') {
            inputs.push(Path::new(arg));
        }
    }
    inputs.extend(a.deploy.calibration.as_deref());
    inputs
}

pub fn run(a: PredictArgs) -> Result<(), Failure> {
    check_online(a.online, a.ensemble)?;
    if a.deploy.config.is_some() {
        let variation = file::Variation {
            ensemble: a.ensemble,
            timing_jitter_cv: a.timing_jitter_cv,
            threads: a.threads,
            online: a.online,
            no_wall_clock: a.no_wall_clock,
        };
        return file::predict(&a.deploy, &a.reports, a.format == Format::Json, &variation);
    }
    a.deploy.check_flag_form()?;
    let started = Instant::now();
    if a.traces.iter().any(|t| t.as_os_str().is_empty()) {
        return Err(Failure::input(
            "an empty argument was given as a trace path (a shell runs `...` in backticks as a command \
             and passes its empty output; write flags without backticks)",
        ));
    }
    let mut reports: Vec<(&str, &Path)> = [("report-json", &a.report_json), ("report-jsonl", &a.report_jsonl)]
        .into_iter()
        .filter_map(|(flag, p)| p.as_deref().map(|p| (flag, p)))
        .collect();
    reports.extend(a.reports.paths());
    a.reports.check()?;
    check_report_paths(&reports, &inputs(&a))?;
    check_counts(&a, available_memory())?;
    let mut calibration = a.deploy.calibration.as_deref().map(FlagCalibration::read).transpose()?;
    let cluster = cluster(&a, calibration.as_mut())?;
    if let Some(c) = &calibration {
        c.warn_differences();
    }
    check_prompt_fits(&a, &cluster)?;
    check_sessions(&a, cluster.block_size(), available_memory())?;
    for (name, v) in [("sla-ttft-ms", a.sla_ttft_ms), ("sla-itl-ms", a.sla_itl_ms), ("sla-e2e-ms", a.sla_e2e_ms)] {
        positive(name, v)?;
    }
    if a.max_queued == Some(0) {
        return Err(Failure::input("--max-queued must be at least 1"));
    }
    if !(a.kv_event_lag_ms.is_finite() && a.kv_event_lag_ms >= 0.0) {
        return Err(Failure::input("--kv-event-lag-ms must be a finite number ≥ 0"));
    }
    let mut router = router_mode(a.router_mode, a.router_config.as_deref())?;
    router_policy(&mut router, a.router_policy_config.as_deref(), a.model_name.as_deref())?;
    // The router's load model times prompts on the engines it places them on.
    let prefill_load_estimator = a.router_load.resolve(router.kv_config_mut(), &cluster.pools()[0].engine)?;
    let (workload, load) = workload(&a, cluster.block_size())?;
    let config = SimConfig {
        topology: cluster,
        router,
        prefill_load_estimator,
        router_seed: a.router_seed,
        kv_event_lag_ms: a.kv_event_lag_ms,
        load,
        sla: Sla { ttft_ms: a.sla_ttft_ms, itl_ms: a.sla_itl_ms, e2e_ms: a.sla_e2e_ms },
        seed: a.arrival_seed,
        fast_forward: !a.no_fast_forward,
        split_workers: !a.no_split_workers,
        threads: a.threads,
        timing_jitter_cv: timing_jitter_cv(a.timing_jitter_cv)?,
        tokenization: calibration.as_ref().and_then(FlagCalibration::tokenization),
        frontend_stages: Vec::new(),
        encoder_pool: None,
    };

    if let Some(n) = a.ensemble {
        if a.planner_config.is_some() {
            return Err(Failure::input(
                "--ensemble does not run a planner yet: drop --planner-config, or run the planned replay alone",
            ));
        }
        return ensemble::flag_form(&a, &workload, &config, n, calibration.as_ref().map(|c| &c.file), started);
    }
    let planner = match a.planner_config.as_deref() {
        Some(arg) => Some(planner_run(arg, &config.topology)?),
        None => None,
    };

    // Open outputs before the run so a bad path costs nothing.
    let mut summary_file = a.report_json.as_deref().map(ReportFile::create).transpose()?;
    let mut records = a.report_jsonl.as_deref().map(ReportFile::create).transpose()?;
    let mut outputs = crate::flags::reports::Outputs::open(&a.reports)?;
    let crate::flags::reports::Outputs { requests, series, telemetry, html, interval_ms, breakdown } = &mut outputs;
    let want_html = html.is_some();
    let record_json = if *breakdown { request_json_with_breakdown } else { request_json };
    let mut telemetry_writer = crate::flags::reports::telemetry_writer(telemetry);
    let mut telemetry_sink =
        crate::flags::reports::telemetry_sink(telemetry_writer.as_mut(), want_html.then_some(series));
    let mut write_error: Option<std::io::Error> = None;
    // Agentic records are written in graph order (by request_id), as the reference lists them;
    // the graph is in memory anyway. They wait as their JSON text (a JSON value tree takes about
    // eight times the bytes). Others are written as requests finish.
    let graph_order = matches!(workload, Workload::Graph(_));
    let mut held: Vec<(u32, Box<[u8]>)> = Vec::new();
    let mut sink = |r: &RequestRecord| {
        if want_html {
            requests.add(r);
        }
        if records.is_none() {
            return;
        }
        if let (true, Some(ids)) = (graph_order, r.meta.as_ref().and_then(|m| m.agentic.as_ref())) {
            let line = serde_json::to_vec(&record_json(r)).expect("a JSON value serialises");
            held.push((ids.node, line.into_boxed_slice()));
            return;
        }
        if let (Some(w), None) = (records.as_mut().map(ReportFile::writer), write_error.as_ref()) {
            let line = record_json(r);
            if let Err(e) =
                serde_json::to_writer(&mut *w, &line).map_err(std::io::Error::from).and_then(|_| w.write_all(b"\n"))
            {
                write_error = Some(e);
            }
        }
    };
    let sink_ref: Option<&mut (dyn FnMut(&RequestRecord) + Send)> =
        if a.report_jsonl.is_some() || want_html { Some(&mut sink) } else { None };
    let mut run = Run::new(&workload, &config)
        .queue_limit(queue_limit(&a))
        .records(sink_ref)
        .ttft_breakdown(*breakdown)
        .planner(planner)
        .online(a.online);
    if let Some(t) = telemetry_sink.as_mut() {
        run = run.telemetry(*interval_ms, t);
    }
    let mut bar = Bar::new();
    let result = run.go(&mut bar);
    bar.finish();
    drop(telemetry_sink);
    let telemetry_error = telemetry_writer.map(|w| w.finish().err()).unwrap_or_default();
    let mut ran = result.map_err(|e| sim_failure(&a, e))?;
    ran.report.wall_time_ms = started.elapsed().as_secs_f64() * 1000.0;
    let (report, planner) = (&ran.report, &ran.planner);

    let mut summary = report.summary_json();
    summary.extend(servesim_replay::workload_keys(&workload));
    if a.no_wall_clock {
        for key in servesim_replay::WALL_CLOCK_KEYS {
            summary.remove(key);
        }
    }
    ran.add_planner_keys(&mut summary);
    let summary = serde_json::Value::Object(summary);
    // With a planner: the summary beside what the planner did.
    let document = match planner {
        Some(run) => serde_json::json!({"summary": summary, "planner": run.to_json()}),
        None => summary.clone(),
    };
    let pretty = serde_json::to_string_pretty(&document).expect("summary serialises");
    match a.format {
        Format::Json => print_out(&format!("{pretty}\n"))?,
        Format::Table => {
            print_out(&table::render(report, !a.no_wall_clock))?;
            if let Some(run) = &planner {
                print_out(&table::worker_timeline(run))?;
            }
        }
    }
    let mut failures = Vec::new();
    if let Some(e) = workload.take_error() {
        failures.push(format!("{e} (the trace changed during the replay; the report covers the rows before it)"));
    }
    held.sort_by_key(|(node, _)| *node);
    for (_, line) in held {
        if let (Some(w), None) = (records.as_mut().map(ReportFile::writer), write_error.as_ref()) {
            if let Err(e) = w.write_all(&line).and_then(|_| w.write_all(b"\n")) {
                write_error = Some(e);
            }
        }
    }
    if let Some(e) = write_error {
        failures.push(format!("{}: write failed: {e}", a.report_jsonl.as_ref().expect("jsonl path").display()));
    }
    if let (Some(e), Some(p)) = (telemetry_error, a.reports.telemetry.as_ref()) {
        failures.push(format!("{}: write failed: {e}", p.display()));
    }
    if let Some(w) = summary_file.as_mut() {
        if let Err(e) = w.writer().write_all(pretty.as_bytes()).and_then(|_| w.writer().write_all(b"\n")) {
            failures.push(format!("{}: write failed: {e}", w.path().display()));
        }
    }
    // Reports replace their previous versions only when the whole run succeeded; otherwise the
    // temporary files are dropped (deleted) and what was there stays.
    if failures.is_empty() {
        let config_json = crate::flags::reports::flag_config(&config.topology);
        // The page is deterministic: no values measured on the host's clock.
        let mut summary_map = summary.as_object().expect("the summary is an object").clone();
        for key in servesim_replay::WALL_CLOCK_KEYS {
            summary_map.remove(key);
        }
        let summary_map = &summary_map;
        let end_ms = summary_map.get("duration_ms").and_then(serde_json::Value::as_f64).unwrap_or(0.0);
        let view = planner.as_ref().map(|run| crate::flags::reports::planner_view(run, run.is_agg(), end_ms));
        match outputs.finish("servesim predict", summary_map, &config_json, view.as_ref()) {
            Ok(paths) if a.format == Format::Table => {
                for p in paths {
                    print_out(&format!("Saved report to: {}\n", p.display()))?;
                }
            }
            Ok(_) => {}
            Err(e) => failures.push(e),
        }
    }
    if failures.is_empty() {
        for file in [records.take(), summary_file.take()].into_iter().flatten() {
            let path = file.path().to_path_buf();
            match file.commit() {
                Ok(()) if a.format == Format::Table && Some(&path) == a.report_json.as_ref() => {
                    print_out(&format!("Saved full report to: {}\n", path.display()))?
                }
                Ok(()) => {}
                Err(e) => failures.push(e),
            }
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(Failure::run(failures.join("; ")))
    }
}

/// The planner `--planner-config` describes, sized against the cluster's engines.
fn planner_run(arg: &str, topology: &Topology) -> Result<servesim_replay::planned::PlannerRun, Failure> {
    let cfg = json_arg("planner-config", arg, |text, _| {
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| ConfigError::new("", format!("malformed JSON: {e}")))?;
        servesim_planner::PlannerConfig::from_json(&v).map_err(|e| ConfigError::new(e.path, e.message))
    })?;
    servesim_replay::planned::PlannerRun::for_topology(cfg, topology, servesim_perf::planner_model)
        .map_err(|e| Failure::input(format!("--planner-config: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: PredictArgs,
    }

    fn args(flags: &[&str]) -> PredictArgs {
        Cli::try_parse_from([&["predict"], flags].concat()).unwrap().args
    }

    #[test]
    fn the_memory_estimate_covers_the_engine_state_of_prompts_in_flight() {
        // 16 sessions of 2e9-token prompts in 64-token blocks: 31.25M blocks each, 4 bytes in
        // the session and 64 in the engine: about 34 GB, refused on a machine with 8 GiB.
        let a = args(&[
            "--input-tokens",
            "2000000000",
            "--output-tokens",
            "1",
            "--request-count",
            "16",
            "--replay-concurrency",
            "16",
        ]);
        let e = check_sessions(&a, 64, Some(8 << 30)).expect_err("refused");
        assert_eq!(
            e.message,
            "--turns-per-session 1 × --input-tokens 2000000000 × --replay-concurrency 16: the sessions in flight need \
             about 31.7 GiB of memory; this machine has 8.0 GiB available"
        );
        assert_eq!(e.code, 2);
        assert!(check_sessions(&a, 64, Some(40 << 30)).is_ok());
    }
}
