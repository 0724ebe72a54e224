//! `servesim`: command-line entry point. Argument parsing, file I/O and output formatting only;
//! the simulation lives in the `servesim-engine` and `servesim-replay` crates, the live server
//! in `servesim-live`.

mod calibrate;
mod candidate_pages;
mod failure;
mod flags;
mod outdir;
mod output;
mod perf;
mod predict;
mod progress;
mod recommend;
mod serve;
mod table;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use failure::Failure;

#[derive(Parser)]
#[command(name = "servesim", version, about = "GPU-free simulator of LLM inference serving")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replay a trace or a synthetic load through simulated workers and report latencies.
    Predict(Box<predict::PredictArgs>),
    /// Search deployments of a model under a GPU budget (a deployment YAML with search domains)
    /// and rank them.
    Recommend(Box<recommend::RecommendArgs>),
    /// Serve simulated engines on a wall clock: OpenAI-compatible HTTP API, Prometheus metrics
    /// with vLLM names, ZMQ KV events.
    Serve(Box<serve::ServeArgs>),
    /// Predicted prefill / decode step times of the data-driven (AIS) timing model.
    Perf(Box<perf::PerfArgs>),
    /// Fit the timing of a deployment YAML to measurements of that deployment and write a
    /// calibration file for --calibration.
    Calibrate(Box<calibrate::CalibrateArgs>),
}

/// An argument with backticks around a flag (`` `--num-workers` ``, copied from Markdown) would
/// otherwise be taken for a file name or a value; a shell runs `` `--num-workers` `` as a
/// command and passes its empty output instead: an empty
/// argument that is not a flag's value.
fn stray_backticks(args: impl Iterator<Item = std::ffi::OsString>) -> Option<Failure> {
    let mut previous_is_flag = false;
    for arg in args {
        let arg = arg.to_string_lossy();
        if arg.is_empty() && !previous_is_flag {
            return Some(Failure::input(
                "an empty argument where a flag or a file was expected (a shell runs `...` in backticks as a \
                 command and passes its empty output; write flags without backticks)",
            ));
        }
        previous_is_flag = arg.starts_with("--") && !arg.contains('=');
        let bare = arg.trim_matches('`');
        if bare.len() < arg.len() && bare.starts_with('-') {
            return Some(Failure::input(format!("argument {arg} has stray backticks around a flag; write {bare}")));
        }
    }
    None
}

/// Every option value that looks like a negative number is taken as that value (`--num-workers
/// -1`), so it is refused as out of range rather than reported as an unknown flag `-1`.
fn negatives_as_values(cmd: clap::Command) -> clap::Command {
    let names: Vec<String> = cmd.get_subcommands().map(|c| c.get_name().to_string()).collect();
    let cmd = cmd.mut_args(|a| if a.get_action().takes_values() { a.allow_negative_numbers(true) } else { a });
    names.iter().fold(cmd, |cmd, name| cmd.mut_subcommand(name, negatives_as_values))
}

/// A negative number given to an option that counts or sizes something: one line naming the
/// option (clap's own message says only "invalid digit found in string").
fn negative_count(e: &clap::Error) -> Option<Failure> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if !matches!(e.kind(), ErrorKind::ValueValidation | ErrorKind::InvalidValue) {
        return None;
    }
    let (Some(ContextValue::String(arg)), Some(ContextValue::String(value))) =
        (e.get(ContextKind::InvalidArg), e.get(ContextKind::InvalidValue))
    else {
        return None;
    };
    let negative = value.trim().strip_prefix('-').is_some_and(|v| v.parse::<f64>().is_ok());
    negative.then(|| {
        let flag = arg.split_whitespace().next().unwrap_or(arg);
        Failure::input(format!("{flag} {value}: must not be negative (it takes a whole number, 0 or more)"))
    })
}

/// SIGINT and SIGTERM delete the temporary files the run registered (spools of piped traces,
/// reports being written) and end the process with 130 or 143, as the default action would
/// have, which leaves them behind. Not for `serve`, which shuts down gracefully on them.
fn remove_scratch_on_signals() {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM]) else { return };
    // If the thread cannot start, `signals` is dropped with the closure and the default
    // actions come back.
    let _ = std::thread::Builder::new().name("signals".into()).spawn(move || {
        if let Some(signal) = signals.forever().next() {
            servesim_workload::scratch::remove_all();
            std::process::exit(128 + signal);
        }
    });
}

fn main() -> ExitCode {
    if let Some(f) = stray_backticks(std::env::args_os().skip(1)) {
        eprintln!("error: {}", f.message);
        return ExitCode::from(f.code);
    }
    let matches = match negatives_as_values(Cli::command()).try_get_matches() {
        Ok(m) => m,
        Err(e) => match negative_count(&e) {
            Some(f) => {
                eprintln!("error: {}", f.message);
                return ExitCode::from(f.code);
            }
            None => e.exit(),
        },
    };
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if matches!(cli.command, Command::Predict(_) | Command::Recommend(_)) {
        remove_scratch_on_signals();
    }
    let result = match cli.command {
        Command::Predict(args) => predict::run(*args),
        Command::Recommend(args) => recommend::run(*args),
        Command::Serve(args) => serve::run(*args),
        Command::Perf(args) => perf::run(*args),
        Command::Calibrate(args) => calibrate::run(*args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("error: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}
