//! What more than one subcommand takes: the router flags (`predict`, `serve`), worker engine
//! arguments (`predict`, `serve`), the report flags (`predict`, `predict -c`), the AIS timing
//! and router load flags (`predict`, `serve`), `--calibration` on the flag forms (`predict`,
//! `serve`), the output format and stack (`predict`, `recommend`), and the reading of a flag
//! that holds inline JSON or the path of a JSON file.

pub mod ais;
pub mod calibration;
pub mod reports;
pub mod router;
pub mod workers;

use std::path::Path;

use clap::ValueEnum;
use servesim_engine::ConfigError;

use crate::failure::Failure;

/// `--format` of `predict` and `recommend`: the table, or the JSON summary alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Json,
}

/// `--stack` of `predict -c` and `recommend -c`, accepted for compatibility (one stack).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Stack {
    Engine,
    Dynamo,
}

/// Reads an inline JSON document or a JSON file given to `--flag`. `parse` gets the text and the
/// directory that relative paths inside it are relative to.
pub(crate) fn json_arg<T>(
    flag: &str,
    arg: &str,
    parse: impl Fn(&str, &Path) -> Result<T, ConfigError>,
) -> Result<T, Failure> {
    if arg.trim().is_empty() {
        return Err(Failure::input(format!(
            "--{flag} is empty; give inline JSON (e.g. '{{\"block_size\": 64}}') or the path of a JSON file"
        )));
    }
    if arg.trim_start().starts_with('{') {
        return parse(arg, Path::new(".")).map_err(|e| Failure::input(format!("--{flag}: {e}")));
    }
    let neither = |why: String| {
        Failure::input(format!(
            "--{flag} {arg}: neither inline JSON (a JSON object, {{...}}) nor a readable JSON file ({why})",
            arg = servesim_workload::error::escape_controls(arg)
        ))
    };
    if arg.trim_start().starts_with('[') && !Path::new(arg).exists() {
        return Err(neither("a JSON array is not a configuration object".into()));
    }
    let text = servesim_workload::input::read_config_text(arg).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => neither(format!("cannot read: {e}")),
        _ => Failure::input(format!("{arg}: cannot read: {e}")),
    })?;
    let dir = Path::new(arg).parent().unwrap_or(Path::new("."));
    parse(&text, dir).map_err(|e| Failure::input(format!("{arg}: {e}")))
}
