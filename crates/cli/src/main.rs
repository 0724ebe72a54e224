//! `servesim`: command-line entry point. Argument parsing, file I/O and output formatting only;
//! the simulation lives in the `servesim-engine` and `servesim-replay` crates, the live server
//! in `servesim-live`.

mod ais;
mod candidate_pages;
mod deploy;
mod output;
mod perf;
mod predict;
mod progress;
mod recommend;
mod reports;
mod serve;
mod table;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
}

/// A failure to report to the user: a one-line message and an exit code.
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl Failure {
    /// Bad input (arguments, files, configuration): exit code 2.
    pub fn input(message: impl std::fmt::Display) -> Self {
        Failure { code: 2, message: message.to_string() }
    }

    /// The run itself failed: exit code 1.
    pub fn run(message: impl std::fmt::Display) -> Self {
        Failure { code: 1, message: message.to_string() }
    }
}

/// The flag a topology error is about.
pub fn topology_error(e: servesim_cluster::TopologyError) -> Failure {
    let flag = match e.field {
        "num_workers" => "--num-workers",
        "num_prefill_workers" => "--num-prefill-workers",
        "num_decode_workers" => "--num-decode-workers",
        _ => return Failure::input(e.message),
    };
    Failure::input(format!("{flag} {}", e.message))
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

fn main() -> ExitCode {
    if let Some(f) = stray_backticks(std::env::args_os().skip(1)) {
        eprintln!("error: {}", f.message);
        return ExitCode::from(f.code);
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Predict(args) => predict::run(*args),
        Command::Recommend(args) => recommend::run(*args),
        Command::Serve(args) => serve::run(*args),
        Command::Perf(args) => perf::run(*args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("error: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}
