//! One worker's arguments: the engine configuration and how the worker is deployed (data
//! parallel ranks, tensor parallelism, start-up time, KV transfer), and the JSON entry points.

use serde_json::{json, Value};

use super::{ConfigEnv, EngineConfig, RawConfig};
use crate::timing::MemoryLimits;
use servesim_config::{ConfigError, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvTransferTimingMode {
    /// The whole prompt moves.
    FullPrompt,
    /// Only the blocks the destination does not have cached move.
    DestinationMissing,
}

/// How a worker's KV moves to another worker (read from the prefill side's arguments).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KvTransfer {
    pub bytes_per_token: Option<u64>,
    /// GB/s; None or ≤ 0 means the KV handoff is instantaneous.
    pub bandwidth_gbps: Option<f64>,
    pub mode: KvTransferTimingMode,
    /// Bytes of request state that move beside the KV of every handoff: a hybrid model's
    /// recurrent state (`state_cache.bytes_per_request` on a prefill worker), else 0.
    pub state_bytes: u64,
    /// The transfer time is kept in whole nanoseconds, as Dynamo's clock keeps it (default);
    /// aisimulate's replay keeps it exact.
    pub whole_ns: bool,
}

impl KvTransfer {
    /// Time to move the KV of `tokens` tokens and the request's state: `(tokens ×
    /// bytes_per_token + state_bytes) / (bandwidth GB/s × 1e9)` seconds, or 0 when either
    /// setting is unset or the bandwidth is not positive.
    pub fn ms(&self, tokens: u64) -> f64 {
        match (self.bytes_per_token, self.bandwidth_gbps) {
            (Some(bytes), Some(gbps)) if gbps > 0.0 => {
                (tokens as f64 * bytes as f64 + self.state_bytes as f64) / (gbps * 1e9) * 1000.0
            }
            _ => 0.0,
        }
    }
}

/// How a worker is deployed: the arguments Dynamo's mocker takes besides the engine's own. The
/// engine never reads them; the cluster layer does.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Deployment {
    /// Attention data-parallel ranks per worker, each an engine of its own.
    pub dp_size: u32,
    pub tensor_parallel_size: u32,
    /// Prefill context-parallel ranks (the AIS timing config's `cp_size`): extra GPUs of one
    /// attention group that split each prompt.
    pub prefill_context_parallel_size: u32,
    /// Seconds a worker takes to start (used when workers are added during a run).
    pub startup_time_s: Option<f64>,
    pub kv_transfer: KvTransfer,
    /// The queue policy of the router in front of these workers, replacing the router
    /// configuration's (Dynamo's replay-only `dynamo.router_queue_policy`): fcfs, lcfs or wspt.
    pub router_queue_policy: Option<&'static str>,
    /// The memory knobs a KV cache sized from memory uses (kept for the canonical form).
    pub memory: MemoryLimits,
    /// Whether `num_gpu_blocks` was the user's (false: sized from memory when the timing
    /// model knows the GPU, else the default).
    pub num_gpu_blocks_is_explicit: bool,
}

impl Deployment {
    /// GPUs one worker occupies (tensor parallel × data parallel × prefill context parallel;
    /// pipeline stages are not counted, as the reference counts them).
    pub fn gpus_per_worker(&self) -> u32 {
        self.tensor_parallel_size * self.dp_size * self.prefill_context_parallel_size
    }
}

impl Default for Deployment {
    fn default() -> Self {
        WorkerArgs::default().deployment
    }
}

/// One worker's arguments in Dynamo's mocker form: the engine configuration and the deployment.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerArgs {
    pub engine: EngineConfig,
    pub deployment: Deployment,
}

impl Default for WorkerArgs {
    fn default() -> Self {
        WorkerArgs::from_value(&json!({})).expect("the empty configuration is valid")
    }
}

impl WorkerArgs {
    /// Parses a JSON document in either shape (without file access).
    pub fn parse_json(text: &str) -> Result<Self> {
        Self::parse_json_env(text, ConfigEnv::NONE)
    }

    /// Parses a JSON document, resolving files and external timing models through `env`.
    pub fn parse_json_env(text: &str, env: ConfigEnv) -> Result<Self> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| ConfigError::new("", format!("invalid JSON: {e}")))?;
        Self::from_value_env(&value, env)
    }

    /// Reads a parsed JSON value in either shape (without file access).
    pub fn from_value(value: &Value) -> Result<Self> {
        Self::from_value_env(value, ConfigEnv::NONE)
    }

    /// Reads a parsed JSON value, resolving files and external timing models through `env`.
    pub fn from_value_env(value: &Value, env: ConfigEnv) -> Result<Self> {
        if !value.is_object() {
            return Err(ConfigError::new("", "engine configuration must be a JSON object"));
        }
        let mut raw = RawConfig::default();
        if value.get("engine").is_some() {
            raw.read_canonical(value)?;
        } else {
            raw.read_flat(value)?;
        }
        raw.normalise(env)
    }

    /// The canonical nested JSON form (what Dynamo 1.6.1 prints after normalising).
    pub fn to_canonical_json(&self) -> Value {
        let (e, d) = (&self.engine, &self.deployment);
        let mut v = e.canonical_engine_json();
        let engine = v.as_object_mut().expect("an object");
        engine.insert("kv_transfer_bytes_per_token".into(), json!(d.kv_transfer.bytes_per_token));
        engine.insert("kv_transfer_bandwidth".into(), json!(d.kv_transfer.bandwidth_gbps));
        engine.insert(
            "kv_transfer_timing_mode".into(),
            json!(match d.kv_transfer.mode {
                KvTransferTimingMode::FullPrompt => "full_prompt",
                KvTransferTimingMode::DestinationMissing => "destination_missing",
            }),
        );
        json!({
            "engine": v,
            "dp_size": d.dp_size,
            "tensor_parallel_size": d.tensor_parallel_size,
            "startup_time": d.startup_time_s,
            "num_gpu_blocks_is_explicit": d.num_gpu_blocks_is_explicit,
            "gpu_memory_utilization": d.memory.gpu_memory_utilization,
            "mem_fraction_static": d.memory.mem_fraction_static,
            "free_gpu_memory_fraction": d.memory.free_gpu_memory_fraction,
            "cuda_graph_reserved_bytes": d.memory.cuda_graph_reserved_bytes,
            "dynamo": {
                "router_queue_policy": d.router_queue_policy,
                "reasoning": e.reasoning.map(|r| json!({
                    "start_thinking_token_id": r.start_thinking_token_id,
                    "end_thinking_token_id": r.end_thinking_token_id,
                    "thinking_ratio": r.thinking_ratio,
                })),
            },
        })
    }
}
