//! `applied_compute_agentic`: one agent session per line, described by lengths only.
//!
//! Line `n` becomes session `applied_compute_agentic_session_<n>` with `num_turns + 1`
//! requests: turn k's prompt is the initial prompt plus every earlier response and tool output
//! (its blocks extend the previous turn's), its output `assistant_response_length[k]`; the last
//! turn's output is `final_assistant_response_length`. Turn k + 1 starts
//! `tool_call_latency[k]` seconds after turn k completes. With a shared-prefix ratio and prefix
//! groups, the first blocks of the initial prompt are shared within group `line % groups`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

use crate::error::InputError;
use crate::input::{not_an_object, Lines, TraceInput};
use crate::session::{SessionSpec, TurnSpec};
use crate::workload::Workload;

#[derive(Deserialize)]
struct Record {
    num_turns: usize,
    input_prompt_length: u64,
    assistant_response_length: Vec<u64>,
    tool_call_output_length: Vec<u64>,
    tool_call_latency: Vec<f64>,
    final_assistant_response_length: u64,
}

pub fn load(path: &Path, tbs: u32, shared_prefix_ratio: f64, groups: u32) -> Result<Workload, InputError> {
    if !(0.0..=1.0).contains(&shared_prefix_ratio) {
        return Err(InputError::new(format!(
            "shared_prefix_ratio must be between 0.0 and 1.0, got {shared_prefix_ratio}"
        )));
    }
    let input = TraceInput::open(path)?;
    let mut lines = Lines::open(&input)?;
    let mut sessions = Vec::new();
    // Ids are compact from the start: a fresh id per private block, one per shared (group,
    // block) pair (what interning the reference's synthetic ids would give, without a map of
    // every id).
    let mut next_id = 0u32;
    let mut shared_ids: HashMap<(u64, u64), u32> = HashMap::new();
    let mut first = true;
    while let Some(line) = lines.next_line() {
        let (lineno, text) = line?;
        let err = |msg: String| InputError::at_line(path, lineno, None, msg);
        if let Some(why) = not_an_object(text, std::mem::replace(&mut first, false)) {
            return Err(err(why));
        }
        let r: Record =
            serde_json::from_slice(text).map_err(|e| err(format!("failed to parse line {lineno} as JSON: {e}")))?;
        for (name, len) in [
            ("assistant_response_length", r.assistant_response_length.len()),
            ("tool_call_output_length", r.tool_call_output_length.len()),
            ("tool_call_latency", r.tool_call_latency.len()),
        ] {
            if len != r.num_turns {
                return Err(err(format!("field {name} length {len} does not match num_turns {}", r.num_turns)));
            }
        }
        if r.input_prompt_length == 0 {
            return Err(err("input_prompt_length must be positive".into()));
        }
        let group = (shared_prefix_ratio > 0.0 && groups > 0).then(|| (lineno - 1) as u64 % groups as u64);
        let bs = tbs as u64;
        let shared = ((r.input_prompt_length.div_ceil(bs) as f64) * shared_prefix_ratio).round() as u64;
        let mut hashes: Vec<u32> = Vec::new();
        let mut extend = |hashes: &mut Vec<u32>, len: u64| -> Result<(), InputError> {
            while (hashes.len() as u64) < len.div_ceil(bs) {
                let b = hashes.len() as u64;
                let id = match group {
                    Some(g) if b < shared => *shared_ids.entry((g, b)).or_insert_with(|| {
                        next_id += 1;
                        next_id - 1
                    }),
                    _ => {
                        next_id += 1;
                        next_id - 1
                    }
                };
                if next_id == u32::MAX {
                    return Err(InputError::in_file(path, "the trace needs more than 2^32 distinct prompt blocks"));
                }
                hashes.push(id);
            }
            Ok(())
        };
        // Every turn's blocks extend the previous turn's, so all turns share the last turn's
        // list and cut it at their own length (interning it once keeps first-seen order).
        let mut len = r.input_prompt_length;
        extend(&mut hashes, len)?;
        let mut lengths = Vec::with_capacity(r.num_turns + 1);
        let mut delays = Vec::with_capacity(r.num_turns + 1);
        let mut delay = 0.0;
        for k in 0..=r.num_turns {
            lengths.push(len);
            delays.push(delay);
            if k < r.num_turns {
                let latency = r.tool_call_latency[k];
                if !latency.is_finite() || latency < 0.0 {
                    return Err(err(format!("tool_call_latency[{k}] must be a finite non-negative number")));
                }
                len += r.assistant_response_length[k] + r.tool_call_output_length[k];
                extend(&mut hashes, len)?;
                delay = latency * 1000.0;
            }
        }
        let blocks: Arc<[u32]> = hashes.into();
        let too_long = |len: u64| err(format!("cumulative input length {len} is too large"));
        let mut turns = Vec::with_capacity(r.num_turns + 1);
        for k in 0..=r.num_turns {
            let output =
                if k < r.num_turns { r.assistant_response_length[k] } else { r.final_assistant_response_length };
            turns.push(TurnSpec {
                input_length: u32::try_from(lengths[k]).map_err(|_| too_long(lengths[k]))?,
                output_length: u32::try_from(output)
                    .map_err(|_| err(format!("output length {output} is too large")))?,
                blocks: blocks.clone(),
                delay_ms: delays[k],
                priority: 0,
                strict_priority: 0,
                output_tokens: None,
                meta: None,
            });
        }
        sessions.push(SessionSpec {
            name: Some(Arc::from(format!("applied_compute_agentic_session_{lineno}"))),
            start_ms: 0.0,
            turns,
        });
    }
    if sessions.is_empty() {
        return Err(InputError::in_file(path, "the trace did not contain any requests"));
    }
    Ok(Workload::Trace { sessions, block_tokens: tbs })
}
