//! Up-front estimates of the simulator's memory, for the front ends to refuse, before anything
//! is built, counts whose state this machine cannot hold (instead of aborting out of memory
//! halfway). The flag form and the deployment YAML use the same figures.

/// Bytes of simulator state an idle worker rank holds (measured: about 1.8 KB; doubled).
pub const WORKER_BYTES: u64 = 4096;
/// Bytes a synthetic turn holds besides its prompt's block ids (4 bytes each).
pub const TURN_BYTES: u64 = 128;
/// Bytes a prompt block of a request in flight takes in the engine and the router (its hashes
/// and sequence state; measured: about 57 with 64-token blocks, 20M-token prompts).
pub const PROMPT_BLOCK_BYTES: u64 = 64;

/// Memory the system can give this process without swapping (Linux `MemAvailable`).
pub fn available() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

/// `bytes` for a message: "38.1 GiB".
pub fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// Bytes one synthetic session in flight holds: each turn's prompt as block ids of
/// `block_tokens` tokens, and the engine's state of the turn in flight.
pub fn session_bytes(input_tokens: u64, turns: u64, block_tokens: u64) -> u64 {
    let blocks = input_tokens.div_ceil(block_tokens.max(1));
    turns
        .saturating_mul(TURN_BYTES.saturating_add(blocks.saturating_mul(4)))
        .saturating_add(blocks.saturating_mul(PROMPT_BLOCK_BYTES))
}

/// Bytes the history of a session whose prompts accumulate holds at its longest: every token
/// it said and generated (4 bytes each), and the engine's state of that prompt in flight.
pub fn history_bytes(history_tokens: u64, block_tokens: u64) -> u64 {
    let blocks = history_tokens.div_ceil(block_tokens.max(1));
    history_tokens.saturating_mul(4).saturating_add(blocks.saturating_mul(PROMPT_BLOCK_BYTES))
}
