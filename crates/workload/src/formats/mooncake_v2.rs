//! `agentic_mooncake`: the versioned agentic Mooncake graph (line 1 a v2 header, then one
//! request per line with typed dependencies). Headerless legacy rows are refused, as Dynamo
//! 1.6.1 refuses them.

use std::path::Path;

use crate::agentic::{AgenticGraph, AgenticRow, GraphBuilder, Header, Loc};
use crate::error::InputError;
use crate::input::{not_an_object, Lines, TraceInput};

pub fn load(path: &Path, speedup: f64) -> Result<AgenticGraph, InputError> {
    let input = TraceInput::open(path)?;
    let mut lines = Lines::open(&input)?;
    let mut builder: Option<GraphBuilder> = None;
    while let Some(line) = lines.next_line() {
        let (lineno, text) = line?;
        let first = builder.is_none();
        if let Some(why) = not_an_object(text, first) {
            return Err(InputError::at_line(path, lineno, None, why));
        }
        match &mut builder {
            None => {
                let header: Header = serde_json::from_slice(text).map_err(|e| {
                    InputError::at_line(
                        path,
                        lineno,
                        None,
                        format!("failed to parse line {lineno} as the agentic Mooncake v2 header: {e}"),
                    )
                })?;
                builder =
                    Some(GraphBuilder::new(header, vec![path.to_path_buf()], Loc { file: 0, line: lineno as u32 })?);
            }
            Some(b) => {
                let row: AgenticRow = serde_json::from_slice(text).map_err(|e| {
                    InputError::at_line(path, lineno, None, format!("invalid agentic Mooncake v2 request: {e}"))
                })?;
                b.push(Loc { file: 0, line: lineno as u32 }, row)?;
            }
        }
    }
    let Some(builder) = builder else {
        return Err(InputError::in_file(path, "agentic trace file is missing its v2 header"));
    };
    if builder.is_empty() {
        return Err(InputError::in_file(path, "agentic trace file did not contain any requests"));
    }
    builder.finish(speedup)
}
