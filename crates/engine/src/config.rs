//! Engine configuration: Dynamo's `MockEngineArgs` in either of its JSON shapes.
//!
//! * the canonical nested form printed by Dynamo 1.6.1 (`{"engine": {...}, "dp_size": 1, ...}`);
//! * the flat `MockEngineArgs` form of earlier releases (`{"block_size": 16, "num_gpu_blocks": ...}`).
//!
//! Defaults are Dynamo's. Unknown keys are rejected by name; keys that Dynamo accepts but that
//! describe something servesim does not model are accepted only with a neutral value.

use serde_json::{json, Value};

use crate::json::{ConfigError, Field, ObjectReader, Result};
use crate::profile::Profile;
use crate::request::ReasoningConfig;
use crate::speculative::SpeculativeConfig;
use crate::timing::{ExternalTimer, ProfileRef, TimerFactory, TimingModel, Unresolved};

/// Reads a file a configuration refers to (a timing profile). The engine crate itself never
/// touches the filesystem; callers decide how paths resolve.
pub type FileLoader<'a> = &'a dyn Fn(&str) -> std::result::Result<Vec<u8>, String>;

fn no_files(path: &str) -> std::result::Result<Vec<u8>, String> {
    Err(format!("cannot read {path}: no file access in this context"))
}

/// What reading a configuration may use besides the JSON itself.
#[derive(Clone, Copy)]
pub struct ConfigEnv<'a> {
    /// Reads files the configuration refers to (timing profiles).
    pub files: FileLoader<'a>,
    /// Builds external timing models (`{"type": "external", ...}`); None refuses them.
    pub timers: Option<TimerFactory<'a>>,
}

impl ConfigEnv<'static> {
    /// No files, no external models.
    pub const NONE: ConfigEnv<'static> = ConfigEnv { files: &no_files, timers: None };
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Vllm,
    Sglang,
    Trtllm,
}

impl Backend {
    pub const NAMES: [&'static str; 3] = ["vllm", "sglang", "trtllm"];

    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    /// Block size used when the configuration leaves it at 0 or unset.
    pub fn default_block_size(self) -> u32 {
        match self {
            Backend::Vllm => 64,
            Backend::Sglang => 1,
            Backend::Trtllm => 32,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreemptionMode {
    /// Preempt the most recently admitted running request (vLLM's default).
    Lifo,
    /// Preempt the oldest running request.
    Fifo,
}

/// What a worker does in its cluster: everything, or one side of disaggregated serving.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    Aggregated,
    /// Computes prompts; holds a finished prompt's KV until the decode side has it.
    Prefill,
    /// Receives prompts computed elsewhere and generates the tokens.
    Decode,
}

impl Role {
    pub fn name(self) -> &'static str {
        WORKER_TYPES[self as usize]
    }
}

/// SGLang scheduler knobs (the `sglang` section).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SglangSettings {
    /// Longest-prefix-match ordering of the waiting queue instead of FIFO.
    pub lpm: bool,
    /// Prompt tokens one pass may prefill.
    pub max_prefill_tokens: u32,
    /// Largest prompt chunk per pass.
    pub chunked_prefill_size: u32,
    /// Output tokens per request counted when reserving decode headroom.
    pub clip_max_new_tokens: u32,
    /// In [0, 1]; scales the fraction of future output reserved for running requests.
    pub schedule_conservativeness: f64,
}

impl Default for SglangSettings {
    fn default() -> Self {
        SglangSettings {
            lpm: false,
            max_prefill_tokens: 16384,
            chunked_prefill_size: 8192,
            clip_max_new_tokens: 4096,
            schedule_conservativeness: 1.0,
        }
    }
}

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
}

impl KvTransfer {
    /// Time to move the KV of `tokens` tokens: `tokens × bytes_per_token / (bandwidth GB/s ×
    /// 1e9)` seconds, or 0 when either is unset or the bandwidth is not positive.
    pub fn ms(&self, tokens: u64) -> f64 {
        match (self.bytes_per_token, self.bandwidth_gbps) {
            (Some(bytes), Some(gbps)) if gbps > 0.0 => tokens as f64 * bytes as f64 / (gbps * 1e9) * 1000.0,
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
    /// Seconds a worker takes to start (used when workers are added during a run).
    pub startup_time_s: Option<f64>,
    pub kv_transfer: KvTransfer,
}

impl Deployment {
    /// GPUs one worker occupies (tensor parallel × data parallel).
    pub fn gpus_per_worker(&self) -> u32 {
        self.tensor_parallel_size * self.dp_size
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

/// A normalised engine configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    pub backend: Backend,
    /// KV capacity in blocks (per data-parallel rank).
    pub num_gpu_blocks: u32,
    /// Tokens per KV block.
    pub block_size: u32,
    pub max_model_len: Option<u32>,
    /// Maximum running requests (None = unbounded).
    pub max_num_seqs: Option<u32>,
    /// Per-pass token budget (None = unbounded).
    pub max_num_batched_tokens: Option<u32>,
    pub enable_prefix_caching: bool,
    pub enable_chunked_prefill: bool,
    /// Divides every predicted duration (≤ 0 leaves durations unscaled, as in Dynamo).
    pub speedup_ratio: f64,
    /// Extra divisor for decode time only.
    pub decode_speedup_ratio: f64,
    pub preemption_mode: PreemptionMode,
    pub role: Role,
    pub timing: TimingModel,
    pub sglang: SglangSettings,
    /// Speculative decoding (MTP), when `aic_nextn` is set.
    pub speculative: Option<SpeculativeConfig>,
    /// Thinking tokens around the start of every generated output.
    pub reasoning: Option<ReasoningConfig>,
    /// Why a timing profile was replaced by the polynomial model (the user allowed it).
    pub timing_fallback: Option<String>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        WorkerArgs::default().engine
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
            "dynamo": {
                "reasoning": e.reasoning.map(|r| json!({
                    "start_thinking_token_id": r.start_thinking_token_id,
                    "end_thinking_token_id": r.end_thinking_token_id,
                    "thinking_ratio": r.thinking_ratio,
                })),
            },
        })
    }
}

impl EngineConfig {
    /// Parses a JSON document in either shape (without file access); deployment keys are
    /// checked and dropped.
    pub fn parse_json(text: &str) -> Result<Self> {
        WorkerArgs::parse_json(text).map(|w| w.engine)
    }

    /// Parses a JSON document, reading referenced files (timing profiles) through `files`.
    pub fn parse_json_with(text: &str, files: FileLoader) -> Result<Self> {
        WorkerArgs::parse_json_env(text, ConfigEnv { files, timers: None }).map(|w| w.engine)
    }

    /// Reads a parsed JSON value in either shape (without file access).
    pub fn from_value(value: &Value) -> Result<Self> {
        WorkerArgs::from_value(value).map(|w| w.engine)
    }

    /// Reads a parsed JSON value, reading referenced files through `files`.
    pub fn from_value_with(value: &Value, files: FileLoader) -> Result<Self> {
        Self::from_value_env(value, ConfigEnv { files, timers: None })
    }

    /// Reads a parsed JSON value, resolving files and external timing models through `env`.
    pub fn from_value_env(value: &Value, env: ConfigEnv) -> Result<Self> {
        WorkerArgs::from_value_env(value, env).map(|w| w.engine)
    }

    /// Total KV tokens of one rank.
    pub fn kv_capacity_tokens(&self) -> u64 {
        self.num_gpu_blocks as u64 * self.block_size as u64
    }

    /// The configuration of one rank of a worker with `dp_size` attention data-parallel ranks:
    /// SGLang divides the chunk budget among the ranks and scales the admission ratio by 0.3 at
    /// launch (`handle_data_parallelism`); vLLM and TRT-LLM ranks are plain copies.
    pub fn for_attention_dp(&self, dp_size: u32) -> EngineConfig {
        let mut rank = self.clone();
        if self.backend == Backend::Sglang && dp_size > 1 {
            rank.sglang.chunked_prefill_size /= dp_size;
            rank.sglang.schedule_conservativeness *= 0.3;
        }
        rank
    }

    /// The `engine` section of the canonical form (without the deployment's transfer keys).
    fn canonical_engine_json(&self) -> Value {
        let timing = match &self.timing {
            TimingModel::Polynomial => json!({"type": "polynomial"}),
            TimingModel::Fixed { prefill_ms, decode_ms } => {
                json!({"type": "fixed", "prefill_ms": prefill_ms, "decode_ms": decode_ms})
            }
            TimingModel::Interpolated { path, .. } => json!({"type": "interpolated", "path": path}),
            TimingModel::External(e) => {
                json!({"type": "external", "provider": e.provider, "config": e.timer().config()})
            }
        };
        json!({
                "backend": self.backend.name(),
                "num_gpu_blocks": self.num_gpu_blocks,
                "block_size": self.block_size,
                "max_model_len": self.max_model_len,
                "max_num_seqs": self.max_num_seqs,
                "max_num_batched_tokens": self.max_num_batched_tokens,
                "enable_prefix_caching": self.enable_prefix_caching,
                "enable_chunked_prefill": self.enable_chunked_prefill,
                "speedup_ratio": self.speedup_ratio,
                "decode_speedup_ratio": self.decode_speedup_ratio,
                "worker_type": self.role.name(),
                "preemption_mode": match self.preemption_mode {
                    PreemptionMode::Lifo => "lifo",
                    PreemptionMode::Fifo => "fifo",
                },
                "timing_model": timing,
                "aic_nextn": self.speculative.as_ref().map(|s| s.nextn),
                "aic_nextn_accept_rates": self.speculative.as_ref().map(|s| {
                    s.accept_rates.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(",")
                }),
                "aic_mtp_seed": self.speculative.as_ref().map_or(42, |s| s.seed),
        })
    }
}

/// Fields as read, before defaults and validation.
#[derive(Default)]
struct RawConfig {
    backend: Field<usize>,
    num_gpu_blocks: Field<u32>,
    block_size: Field<u32>,
    max_model_len: Field<u32>,
    max_num_seqs: Field<u32>,
    max_num_batched_tokens: Field<u32>,
    enable_prefix_caching: Field<bool>,
    enable_chunked_prefill: Field<bool>,
    speedup_ratio: Field<f64>,
    decode_speedup_ratio: Field<f64>,
    preemption_mode: Field<usize>,
    role: Field<usize>,
    timing: Option<Unresolved>,
    dp_size: Field<u32>,
    tensor_parallel_size: Field<u32>,
    startup_time: Field<f64>,
    kv_bytes_per_token: Field<u64>,
    kv_transfer_bandwidth: Field<f64>,
    kv_transfer_timing_mode: Field<usize>,
    sglang: SglangSettings,
    sglang_page_size: Field<u32>,
    nextn: Field<u32>,
    accept_rates: Option<(String, Vec<f64>)>,
    mtp_seed: Field<u64>,
    reasoning: Option<ReasoningConfig>,
}

/// Acceptance rates as Dynamo writes them (`"0.85,0.3,0"`) or as a JSON array.
fn parse_rates(path: &str, v: &Value) -> Result<Vec<f64>> {
    let bad = |what: String| ConfigError::new(path, what);
    let items: Vec<f64> = match v {
        Value::String(s) => s
            .split(',')
            .map(|x| x.trim().parse::<f64>().map_err(|_| bad(format!("{x:?} is not a number"))))
            .collect::<Result<_>>()?,
        Value::Array(a) => {
            a.iter().map(|x| x.as_f64().ok_or_else(|| bad(format!("{x} is not a number")))).collect::<Result<_>>()?
        }
        other => return Err(bad(format!("expected a comma-separated string or an array of numbers, got {other}"))),
    };
    for r in &items {
        if !(r.is_finite() && (0.0..=1.0).contains(r)) {
            return Err(bad(format!("every rate must be in [0, 1], got {r}")));
        }
    }
    Ok(items)
}

const PREEMPTION_MODES: [&str; 2] = ["lifo", "fifo"];
const WORKER_TYPES: [&str; 3] = ["aggregated", "prefill", "decode"];
const TRANSFER_MODES: [&str; 2] = ["full_prompt", "destination_missing"];

impl RawConfig {
    /// Keys shared by the flat form and the canonical `engine` section.
    fn read_engine_keys(&mut self, r: &mut ObjectReader) -> Result<()> {
        self.num_gpu_blocks = r.u32("num_gpu_blocks")?;
        self.block_size = r.u32("block_size")?;
        self.max_model_len = r.u32("max_model_len")?;
        self.max_num_seqs = r.u32("max_num_seqs")?;
        self.max_num_batched_tokens = r.u32("max_num_batched_tokens")?;
        self.enable_prefix_caching = r.bool("enable_prefix_caching")?;
        self.enable_chunked_prefill = r.bool("enable_chunked_prefill")?;
        self.speedup_ratio = r.f64("speedup_ratio")?;
        self.decode_speedup_ratio = r.f64("decode_speedup_ratio")?;
        self.preemption_mode = r.choice("preemption_mode", &PREEMPTION_MODES)?;
        self.role = r.choice("worker_type", &WORKER_TYPES)?;
        self.kv_transfer_bandwidth = r.f64("kv_transfer_bandwidth")?;
        self.kv_transfer_timing_mode = r.choice("kv_transfer_timing_mode", &TRANSFER_MODES)?;
        if let Some(mut t) = r.object("timing_model")? {
            self.timing = Some(TimingModel::read(&mut t)?);
            t.finish()?;
        }
        self.nextn = r.u32("aic_nextn")?;
        let rates_path = r.path("aic_nextn_accept_rates");
        self.accept_rates = match r.raw("aic_nextn_accept_rates") {
            None | Some(Value::Null) => None,
            Some(v) => Some((rates_path.clone(), parse_rates(&rates_path, v)?)),
        };
        self.mtp_seed = r.u64("aic_mtp_seed")?;
        // Sections for the other backends may be present (Dynamo prints them with defaults).
        if let Some(mut sg) = r.object("sglang")? {
            self.read_sglang(&mut sg)?;
            sg.finish()?;
        }
        if let Some(mut t) = r.object("trtllm")? {
            t.unsupported(
                "capacity_scheduler_policy",
                &[json!("guaranteed_no_evict"), json!("GUARANTEED_NO_EVICT")],
                "a TRT-LLM capacity policy other than guaranteed_no_evict",
            )?;
            t.finish()?;
        }
        Ok(())
    }

    fn read_reasoning(&mut self, r: &mut ObjectReader) -> Result<()> {
        if let Some(mut o) = r.object("reasoning")? {
            let mut id = |key: &'static str| -> Result<u32> {
                o.u32(key)?.set().ok_or_else(|| ConfigError::new(o.path(key), "missing (required by reasoning)"))
            };
            let start = id("start_thinking_token_id")?;
            let end = id("end_thinking_token_id")?;
            let ratio = o
                .f64("thinking_ratio")?
                .set()
                .ok_or_else(|| ConfigError::new(o.path("thinking_ratio"), "missing (required by reasoning)"))?;
            if !(0.0..=1.0).contains(&ratio) {
                return Err(ConfigError::new(o.path("thinking_ratio"), format!("must be in [0, 1], got {ratio}")));
            }
            o.finish()?;
            self.reasoning = Some(ReasoningConfig {
                start_thinking_token_id: start,
                end_thinking_token_id: end,
                thinking_ratio: ratio,
            });
        }
        Ok(())
    }

    fn read_sglang(&mut self, r: &mut ObjectReader) -> Result<()> {
        let d = SglangSettings::default();
        self.sglang.lpm = match r.string("schedule_policy")?.set() {
            None => false,
            Some(p) if p.eq_ignore_ascii_case("fifo") || p.eq_ignore_ascii_case("fcfs") => false,
            Some(p) if p.eq_ignore_ascii_case("lpm") => true,
            Some(p) => {
                return Err(ConfigError::new(
                    r.path("schedule_policy"),
                    format!("unknown value {p:?}; expected fifo (fcfs) or lpm"),
                ))
            }
        };
        self.sglang_page_size = r.u32("page_size")?;
        let positive = |r: &mut ObjectReader, key: &'static str, default: u32| -> Result<u32> {
            match r.u32(key)?.set() {
                Some(0) => Err(ConfigError::new(r.path(key), "must be at least 1")),
                Some(v) => Ok(v),
                None => Ok(default),
            }
        };
        self.sglang.max_prefill_tokens = positive(r, "max_prefill_tokens", d.max_prefill_tokens)?;
        self.sglang.chunked_prefill_size = positive(r, "chunked_prefill_size", d.chunked_prefill_size)?;
        self.sglang.clip_max_new_tokens = positive(r, "clip_max_new_tokens", d.clip_max_new_tokens)?;
        if let Some(c) = r.f64("schedule_conservativeness")?.set() {
            if !c.is_finite() || c < 0.0 {
                return Err(ConfigError::new(
                    r.path("schedule_conservativeness"),
                    format!("must be a finite number ≥ 0, got {c}"),
                ));
            }
            self.sglang.schedule_conservativeness = c;
        }
        Ok(())
    }

    fn read_flat(&mut self, value: &Value) -> Result<()> {
        let mut r = ObjectReader::new("", value)?;
        self.backend = r.choice("engine_type", &Backend::NAMES)?;
        if r.has("backend") {
            self.backend = r.choice("backend", &Backend::NAMES)?;
        }
        self.read_engine_keys(&mut r)?;
        self.dp_size = r.u32("dp_size")?;
        self.tensor_parallel_size = r.u32("tensor_parallel_size")?;
        self.startup_time = r.f64("startup_time")?;
        self.kv_bytes_per_token = r.u64("kv_bytes_per_token")?;
        let is_prefill = r.bool("is_prefill")?.or(false);
        let is_decode = r.bool("is_decode")?.or(false);
        if is_prefill && is_decode {
            return Err(ConfigError::new("is_prefill", "is_prefill and is_decode cannot both be true"));
        }
        if is_prefill {
            self.role = Field::Set(1);
        } else if is_decode {
            self.role = Field::Set(2);
        }
        for key in ["aic_backend", "aic_system", "aic_systems_path", "aic_backend_version", "aic_model_path"] {
            r.unsupported(key, &[], "AIConfigurator timing")?;
        }
        for key in ["aic_tp_size", "aic_moe_tp_size", "aic_moe_ep_size", "aic_attention_dp_size"] {
            r.unsupported(key, &[json!(1)], "AIConfigurator timing")?;
        }
        for key in ["aic_gemm_dtype", "aic_moe_dtype", "aic_fmha_dtype", "aic_kv_cache_dtype", "aic_comm_dtype"] {
            r.unsupported(key, &[], "AIConfigurator timing")?;
        }
        let key = r.path("planner_profile_data");
        if let Some(path) = r.string("planner_profile_data")?.set() {
            self.timing = Some(Unresolved::Profile(ProfileRef { key, path: path.to_string(), fallback: false }));
        }
        for key in ["gpu_memory_utilization", "mem_fraction_static", "free_gpu_memory_fraction"] {
            r.unsupported(key, &[], "KV capacity estimation")?;
        }
        for key in ["num_g2_blocks", "num_g3_blocks", "offload_batch_size"] {
            r.unsupported(key, &[json!(0)], "host KV offload")?;
        }
        r.unsupported("enable_g4_storage", &[json!(false)], "host KV offload")?;
        for key in [
            "bandwidth_g1_to_g2_gbps",
            "bandwidth_g2_to_g1_gbps",
            "bandwidth_g2_to_g3_gbps",
            "bandwidth_g3_to_g2_gbps",
            "bandwidth_g2_to_g4_gbps",
            "bandwidth_g4_to_g2_gbps",
        ] {
            r.unsupported(key, &[], "host KV offload")?;
        }
        self.read_reasoning(&mut r)?;
        r.unsupported("response_replay_trace_path", &[], "response replay traces")?;
        r.unsupported("g1_backend", &[json!("native")], "the KVBM G1 backend")?;
        // Live-deployment plumbing with no effect on simulated behaviour.
        for key in [
            "enable_local_indexer",
            "bootstrap_port",
            "handoff_session_timeout_ms",
            "zmq_kv_events_port",
            "zmq_replay_port",
            "router_queue_policy",
            "has_perf_model",
        ] {
            r.ignored(key);
        }
        r.finish()
    }

    fn read_canonical(&mut self, value: &Value) -> Result<()> {
        let mut top = ObjectReader::new("", value)?;
        let mut e = top.object("engine")?.ok_or_else(|| ConfigError::new("engine", "must be an object"))?;
        self.backend = e.choice("backend", &Backend::NAMES)?;
        self.read_engine_keys(&mut e)?;
        self.kv_bytes_per_token = e.u64("kv_transfer_bytes_per_token")?;
        if e.has("kv_bytes_per_token") {
            self.kv_bytes_per_token = e.u64("kv_bytes_per_token")?;
        }
        e.unsupported("prefill_schedule_interval", &[json!(1)], "prefill_schedule_interval other than 1")?;
        e.unsupported("prefill_decode_interval", &[json!(0)], "prefill_decode_interval other than 0")?;
        e.ignored("emit_kv_events");
        e.ignored("emit_kv_token_ids");
        for key in [
            "kv_cache_bytes_per_token",
            "kv_cache_groups",
            "kv_cache_capacity_bytes",
            "native_host_offload",
            "state_cache",
            "prefix_match_unit",
            "g3_offload",
        ] {
            e.unsupported(key, &[], key)?;
        }
        e.finish()?;

        self.dp_size = top.u32("dp_size")?;
        self.tensor_parallel_size = top.u32("tensor_parallel_size")?;
        self.startup_time = top.f64("startup_time")?;
        top.ignored("num_gpu_blocks_is_explicit");
        for key in
            ["gpu_memory_utilization", "mem_fraction_static", "free_gpu_memory_fraction", "cuda_graph_reserved_bytes"]
        {
            top.unsupported(key, &[], "KV capacity estimation")?;
        }
        if let Some(mut d) = top.object("dynamo")? {
            for key in [
                "enable_local_indexer",
                "bootstrap_port",
                "handoff_session_timeout_ms",
                "zmq_kv_events_port",
                "zmq_replay_port",
                "router_queue_policy",
            ] {
                d.ignored(key);
            }
            self.read_reasoning(&mut d)?;
            d.unsupported("response_replay_trace_path", &[], "response replay traces")?;
            d.finish()?;
        }
        top.finish()
    }

    fn normalise(self, env: ConfigEnv) -> Result<WorkerArgs> {
        let (timing, timing_fallback) = match self.timing {
            None => (TimingModel::Polynomial, None),
            Some(Unresolved::Model(model)) => (model, None),
            Some(Unresolved::Timer(t)) => {
                let Some(build) = env.timers else {
                    return Err(ConfigError::new(
                        t.key,
                        format!("the external timing model {:?} is not available here", t.provider),
                    ));
                };
                let timer = build(&t.key, &t.provider, &t.config)?;
                (TimingModel::External(ExternalTimer::new(t.provider, timer)), None)
            }
            Some(Unresolved::Profile(r)) => {
                let loaded = (env.files)(&r.path)
                    .and_then(|bytes| Profile::from_npz(&bytes).map_err(|e| format!("{}: {e}", r.path)));
                match loaded {
                    Ok(profile) => (TimingModel::Interpolated { path: r.path, profile: profile.into() }, None),
                    Err(why) if r.fallback => (TimingModel::Polynomial, Some(why)),
                    Err(why) => return Err(ConfigError::new(r.key, why)),
                }
            }
        };
        let backend = match self.backend.or(0) {
            0 => Backend::Vllm,
            1 => Backend::Sglang,
            _ => Backend::Trtllm,
        };
        let page_size = self.sglang_page_size.set().filter(|_| backend == Backend::Sglang);
        let block_size = match (self.block_size.or(0), page_size) {
            (0, Some(page)) => page,
            (0, None) => backend.default_block_size(),
            (bs, Some(page)) if bs != page => {
                return Err(ConfigError::new(
                    "sglang.page_size",
                    format!("block_size ({bs}) and sglang.page_size ({page}) need to match"),
                ))
            }
            (bs, _) => bs,
        };
        if backend == Backend::Sglang && !self.sglang.chunked_prefill_size.is_multiple_of(block_size) {
            return Err(ConfigError::new(
                "sglang.chunked_prefill_size",
                format!("{} is not a multiple of the page size {block_size}", self.sglang.chunked_prefill_size),
            ));
        }
        if backend == Backend::Sglang && self.enable_chunked_prefill == Field::Set(false) {
            return Err(ConfigError::new(
                "enable_chunked_prefill",
                "enable_chunked_prefill=false is not supported for backend=sglang",
            ));
        }
        let positive = |field: Field<u32>, name: &str| -> Result<()> {
            if let Field::Set(0) = field {
                return Err(ConfigError::new(name, "must be at least 1"));
            }
            Ok(())
        };
        positive(self.num_gpu_blocks, "num_gpu_blocks")?;
        positive(self.max_model_len, "max_model_len")?;
        positive(self.max_num_seqs, "max_num_seqs")?;
        positive(self.max_num_batched_tokens, "max_num_batched_tokens")?;
        positive(self.dp_size, "dp_size")?;
        positive(self.tensor_parallel_size, "tensor_parallel_size")?;
        let ratio = |field: Field<f64>, name: &str| -> Result<f64> {
            let v = field.or(1.0);
            if !v.is_finite() || v < 0.0 {
                return Err(ConfigError::new(name, format!("must be a finite number ≥ 0, got {v}")));
            }
            Ok(v)
        };
        let role = match self.role.or(0) {
            0 => Role::Aggregated,
            1 => Role::Prefill,
            _ => Role::Decode,
        };
        let dp_size = self.dp_size.or(1);
        if backend == Backend::Sglang && dp_size > 1 {
            // SGLang's attention DP gives each rank chunked_prefill_size / dp_size.
            let cps = self.sglang.chunked_prefill_size;
            let per_rank = cps / dp_size;
            if per_rank == 0 {
                return Err(ConfigError::new(
                    "dp_size",
                    format!("SGLang attention DP size {dp_size} reduces chunked_prefill_size={cps} to zero"),
                ));
            }
            if per_rank < block_size {
                return Err(ConfigError::new(
                    "dp_size",
                    format!(
                        "SGLang attention DP size {dp_size} reduces chunked_prefill_size={cps} to {per_rank} per \
                         rank, less than one page ({block_size} tokens): no prompt could be prefilled"
                    ),
                ));
            }
        }
        if let Field::Set(t) = self.startup_time {
            if !t.is_finite() || t < 0.0 {
                return Err(ConfigError::new("startup_time", "must be a finite number of seconds ≥ 0"));
            }
        }
        let kv_transfer_bandwidth = self.kv_transfer_bandwidth.set();
        if let Some(b) = kv_transfer_bandwidth {
            if !b.is_finite() || b < 0.0 {
                return Err(ConfigError::new("kv_transfer_bandwidth", "must be a finite number of GB/s ≥ 0"));
            }
        }
        let speculative = match (self.nextn.set(), self.accept_rates) {
            (None, Some((path, _))) => {
                return Err(ConfigError::new(path, "accept rates need aic_nextn (speculative decoding) to be set"))
            }
            (None, None) => None,
            (Some(n), rates) => {
                if !(1..=5).contains(&n) {
                    return Err(ConfigError::new("aic_nextn", format!("must be between 1 and 5, got {n}")));
                }
                if self.decode_speedup_ratio.or(1.0) != 1.0 {
                    return Err(ConfigError::new(
                        "decode_speedup_ratio",
                        "must stay 1.0 with aic_nextn: speculative decoding already models the speedup",
                    ));
                }
                let mut rates = rates.map_or_else(|| SpeculativeConfig::DEFAULT_RATES.to_vec(), |(_, r)| r);
                rates.resize(n as usize, 0.0);
                Some(SpeculativeConfig { nextn: n, accept_rates: rates, seed: self.mtp_seed.or(42) })
            }
        };
        let deployment = Deployment {
            dp_size,
            tensor_parallel_size: self.tensor_parallel_size.or(1),
            startup_time_s: self.startup_time.set(),
            kv_transfer: KvTransfer {
                bytes_per_token: self.kv_bytes_per_token.set(),
                bandwidth_gbps: kv_transfer_bandwidth,
                mode: if self.kv_transfer_timing_mode.or(0) == 0 {
                    KvTransferTimingMode::FullPrompt
                } else {
                    KvTransferTimingMode::DestinationMissing
                },
            },
        };
        let engine = EngineConfig {
            backend,
            num_gpu_blocks: self.num_gpu_blocks.or(16384),
            block_size,
            max_model_len: self.max_model_len.set(),
            max_num_seqs: self.max_num_seqs.nullable_or(Some(256)),
            max_num_batched_tokens: self.max_num_batched_tokens.nullable_or(Some(8192)),
            enable_prefix_caching: self.enable_prefix_caching.or(true),
            enable_chunked_prefill: self.enable_chunked_prefill.or(true),
            speedup_ratio: ratio(self.speedup_ratio, "speedup_ratio")?,
            decode_speedup_ratio: ratio(self.decode_speedup_ratio, "decode_speedup_ratio")?,
            preemption_mode: if self.preemption_mode.or(0) == 0 { PreemptionMode::Lifo } else { PreemptionMode::Fifo },
            role,
            timing,
            sglang: self.sglang,
            speculative,
            reasoning: self.reasoning,
            timing_fallback,
        };
        Ok(WorkerArgs { engine, deployment })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<EngineConfig> {
        EngineConfig::parse_json(s)
    }

    /// The canonical dump of an engine configuration with the default deployment.
    fn dump(c: &EngineConfig) -> Value {
        WorkerArgs { engine: c.clone(), deployment: Deployment::default() }.to_canonical_json()
    }

    #[test]
    fn defaults_match_dynamo() {
        let c = parse("{}").unwrap();
        assert_eq!(c.backend, Backend::Vllm);
        assert_eq!(c.block_size, 64);
        assert_eq!(c.num_gpu_blocks, 16384);
        assert_eq!(c.max_num_seqs, Some(256));
        assert_eq!(c.max_num_batched_tokens, Some(8192));
        assert!(c.enable_prefix_caching && c.enable_chunked_prefill);
        assert_eq!(c.preemption_mode, PreemptionMode::Lifo);
        assert_eq!(c.speedup_ratio, 1.0);
        assert_eq!(c.decode_speedup_ratio, 1.0);
        assert_eq!(c.timing, TimingModel::Polynomial);
        assert_eq!(WorkerArgs::default().deployment.gpus_per_worker(), 1);
    }

    #[test]
    fn flat_and_canonical_forms_agree() {
        let flat =
            parse(r#"{"block_size":16,"num_gpu_blocks":1000,"max_num_seqs":null,"preemption_mode":"Fifo"}"#).unwrap();
        let nested =
            parse(r#"{"engine":{"block_size":16,"num_gpu_blocks":1000,"max_num_seqs":null,"preemption_mode":"fifo"},"dp_size":1}"#)
                .unwrap();
        assert_eq!(flat, nested);
        assert_eq!(flat.block_size, 16);
        assert_eq!(flat.max_num_seqs, None, "explicit null means unbounded");
        assert_eq!(flat.preemption_mode, PreemptionMode::Fifo);
    }

    #[test]
    fn canonical_dump_round_trips() {
        let c = parse(r#"{"engine":{"block_size":16,"timing_model":{"type":"fixed","prefill_ms":40,"decode_ms":10}}}"#)
            .unwrap();
        let w = WorkerArgs { engine: c, deployment: Deployment { dp_size: 2, ..Deployment::default() } };
        let again = WorkerArgs::from_value(&w.to_canonical_json()).unwrap();
        assert_eq!(w, again);
    }

    #[test]
    fn dynamo_normalised_defaults_are_accepted() {
        // What `_normalize_mocker_config({})` prints in Dynamo 1.6.1.
        let dump = r#"{"engine":{"backend":"vllm","num_gpu_blocks":16384,"block_size":64,"max_model_len":null,
          "max_num_seqs":256,"max_num_batched_tokens":8192,"prefill_schedule_interval":1,"prefill_decode_interval":0,
          "enable_prefix_caching":true,"enable_chunked_prefill":true,"speedup_ratio":1.0,"decode_speedup_ratio":1.0,
          "aic_nextn":null,"aic_nextn_accept_rates":null,"aic_mtp_seed":42,"worker_type":"aggregated",
          "preemption_mode":"lifo","emit_kv_events":false,"emit_kv_token_ids":false,"kv_transfer_bytes_per_token":null,
          "kv_transfer_bandwidth":null,"kv_transfer_timing_mode":"full_prompt","timing_model":{"type":"polynomial"},
          "sglang":{"schedule_policy":"fifo"},"trtllm":{"capacity_scheduler_policy":"guaranteed_no_evict"}},
          "dp_size":1,"tensor_parallel_size":1,"startup_time":null,"num_gpu_blocks_is_explicit":false,
          "gpu_memory_utilization":null,"mem_fraction_static":null,"free_gpu_memory_fraction":null,
          "cuda_graph_reserved_bytes":null,"dynamo":{"enable_local_indexer":false,"bootstrap_port":null,
          "handoff_session_timeout_ms":300000,"reasoning":null,"response_replay_trace_path":null,
          "zmq_kv_events_port":null,"zmq_replay_port":null,"router_queue_policy":null}}"#;
        assert_eq!(parse(dump).unwrap(), parse("{}").unwrap());
    }

    #[test]
    fn engine_family_defaults_and_constraints() {
        assert_eq!(parse(r#"{"engine_type": "sglang"}"#).unwrap().block_size, 1);
        assert_eq!(parse(r#"{"engine_type": "sglang", "sglang": {"page_size": 16}}"#).unwrap().block_size, 16);
        assert_eq!(parse(r#"{"engine_type": "trtllm"}"#).unwrap().block_size, 32);
        assert!(parse(r#"{"engine_type": "sglang", "block_size": 8, "sglang": {"page_size": 8}}"#).is_ok());
        let e = parse(r#"{"engine_type": "sglang", "block_size": 8, "sglang": {"page_size": 4}}"#).unwrap_err();
        assert_eq!(e.path, "sglang.page_size");
        assert!(e.message.contains("need to match"));
        let e =
            parse(r#"{"engine_type": "sglang", "block_size": 4, "sglang": {"chunked_prefill_size": 6}}"#).unwrap_err();
        assert_eq!(e.path, "sglang.chunked_prefill_size");
        assert!(parse(r#"{"engine_type": "sglang", "block_size": 4, "sglang": {"chunked_prefill_size": 8}}"#).is_ok());
        // Every backend takes max_model_len, as the reference's does.
        assert_eq!(parse(r#"{"engine_type": "sglang", "max_model_len": 100}"#).unwrap().max_model_len, Some(100));
        assert_eq!(parse(r#"{"engine_type": "trtllm", "max_model_len": 100}"#).unwrap().max_model_len, Some(100));
        assert_eq!(parse(r#"{"max_model_len": 0}"#).unwrap_err().path, "max_model_len");
        let e = parse(r#"{"engine_type": "sglang", "enable_chunked_prefill": false}"#).unwrap_err();
        assert_eq!(
            (e.path.as_str(), e.message.as_str()),
            ("enable_chunked_prefill", "enable_chunked_prefill=false is not supported for backend=sglang")
        );
        assert!(parse(r#"{"enable_chunked_prefill": false}"#).is_ok(), "vLLM runs without chunking");
        let c = parse(
            r#"{"engine": {"backend": "sglang", "sglang": {"schedule_policy": "lpm", "max_prefill_tokens": 4096}}}"#,
        )
        .unwrap();
        assert!(c.sglang.lpm);
        assert_eq!(c.sglang.max_prefill_tokens, 4096);
        assert_eq!(parse(r#"{"sglang": {"schedule_policy": "random"}}"#).unwrap_err().path, "sglang.schedule_policy");
        // Above 1 is allowed (it only scales the admission ratio); negative or NaN is not.
        assert_eq!(
            parse(r#"{"sglang": {"schedule_conservativeness": 1.5}}"#).unwrap().sglang.schedule_conservativeness,
            1.5
        );
        assert_eq!(
            parse(r#"{"sglang": {"schedule_conservativeness": -0.5}}"#).unwrap_err().path,
            "sglang.schedule_conservativeness"
        );
        // Attention DP divides the chunk budget per rank: it must stay at least a page.
        let e = parse(r#"{"engine": {"backend": "sglang", "sglang": {"chunked_prefill_size": 1}}, "dp_size": 2}"#)
            .unwrap_err();
        assert_eq!(e.message, "SGLang attention DP size 2 reduces chunked_prefill_size=1 to zero");
        let e = parse(r#"{"engine": {"backend": "sglang", "block_size": 16, "sglang": {"chunked_prefill_size": 16}}, "dp_size": 2}"#)
            .unwrap_err();
        assert_eq!(e.path, "dp_size");
        assert!(e.message.contains("less than one page"), "{}", e.message);
        assert!(parse(r#"{"engine": {"backend": "sglang", "block_size": 16}, "dp_size": 2}"#).is_ok());
        assert_eq!(
            parse(r#"{"trtllm": {"capacity_scheduler_policy": "max_utilization"}}"#).unwrap_err().path,
            "trtllm.capacity_scheduler_policy"
        );
    }

    #[test]
    fn speculative_decoding_settings() {
        let spec = |json: &str| parse(json).unwrap().speculative.unwrap();
        assert_eq!(spec(r#"{"aic_nextn": 3}"#).accept_rates, vec![0.85, 0.3, 0.0]);
        assert_eq!(spec(r#"{"aic_nextn": 3, "aic_nextn_accept_rates": "1,0.5"}"#).accept_rates, vec![1.0, 0.5, 0.0]);
        assert_eq!(spec(r#"{"aic_nextn": 2, "aic_nextn_accept_rates": "1,0.5,0.25"}"#).accept_rates, vec![1.0, 0.5]);
        assert_eq!(spec(r#"{"engine": {"aic_nextn": 2, "aic_nextn_accept_rates": [0.5, 0.5]}}"#).seed, 42);
        assert_eq!(spec(r#"{"aic_nextn": 1, "aic_mtp_seed": 7}"#).seed, 7);
        for bad in ["0", "6"] {
            assert_eq!(parse(&format!(r#"{{"aic_nextn": {bad}}}"#)).unwrap_err().path, "aic_nextn");
        }
        for bad in [r#""nan""#, r#""inf""#, r#""-0.1""#, r#""1.1""#, r#""bad""#, "3"] {
            let e = parse(&format!(r#"{{"aic_nextn": 2, "aic_nextn_accept_rates": {bad}}}"#)).unwrap_err();
            assert_eq!(e.path, "aic_nextn_accept_rates", "{bad}");
        }
        let e = parse(r#"{"aic_nextn_accept_rates": "0.5"}"#).unwrap_err();
        assert!(e.message.contains("need aic_nextn"), "{e}");
        let e = parse(r#"{"aic_nextn": 2, "decode_speedup_ratio": 2.0}"#).unwrap_err();
        assert_eq!(e.path, "decode_speedup_ratio");
        let c = parse(r#"{"aic_nextn": 2, "aic_nextn_accept_rates": "1,0.5"}"#).unwrap();
        assert_eq!(EngineConfig::from_value(&dump(&c)).unwrap(), c);
    }

    #[test]
    fn reasoning_settings() {
        let c = parse(
            r#"{"reasoning": {"start_thinking_token_id": 1, "end_thinking_token_id": 2, "thinking_ratio": 0.5}}"#,
        )
        .unwrap();
        assert_eq!(c.reasoning.unwrap().thinking_ratio, 0.5);
        let nested =
            parse(r#"{"engine": {}, "dynamo": {"reasoning": {"start_thinking_token_id": 1, "end_thinking_token_id": 2, "thinking_ratio": 0.5}}}"#)
                .unwrap();
        assert_eq!(nested, c);
        assert_eq!(EngineConfig::from_value(&dump(&c)).unwrap(), c);
        let e = parse(
            r#"{"reasoning": {"start_thinking_token_id": 1, "end_thinking_token_id": 2, "thinking_ratio": 1.5}}"#,
        )
        .unwrap_err();
        assert_eq!(e.path, "reasoning.thinking_ratio");
        let e = parse(r#"{"reasoning": {"start_thinking_token_id": 1, "thinking_ratio": 0.5}}"#).unwrap_err();
        assert_eq!(e.path, "reasoning.end_thinking_token_id");
    }

    #[test]
    fn profiled_timing_reads_through_the_loader() {
        let profile = Profile {
            prefill_isl: vec![128.0, 256.0],
            prefill_ttft_ms: vec![4.0, 8.0],
            decode_active_kv_tokens: vec![1024.0, 2048.0],
            decode_context_length: vec![128.0, 256.0],
            decode_itl: vec![1.0, 1.5, 2.0, 2.5],
        };
        let bytes = profile.to_npz();
        let files = |p: &str| if p == "p.npz" { Ok(bytes.clone()) } else { Err(format!("cannot read {p}")) };
        let c = EngineConfig::parse_json_with(r#"{"planner_profile_data": "p.npz"}"#, &files).unwrap();
        assert!(matches!(&c.timing, TimingModel::Interpolated { profile: p, .. } if **p == profile));
        let nested = EngineConfig::parse_json_with(
            r#"{"engine": {"timing_model": {"type": "interpolated", "path": "p.npz"}}}"#,
            &files,
        )
        .unwrap();
        assert_eq!(nested.timing, c.timing);
        // A missing or malformed profile is an error unless fallback was asked for.
        let e = EngineConfig::parse_json_with(r#"{"planner_profile_data": "q.npz"}"#, &files).unwrap_err();
        assert_eq!(e.path, "planner_profile_data");
        let e = EngineConfig::parse_json_with(
            r#"{"engine": {"timing_model": {"type": "interpolated", "path": "q.npz"}}}"#,
            &files,
        )
        .unwrap_err();
        assert_eq!(e.path, "engine.timing_model.path");
        let c = EngineConfig::parse_json_with(
            r#"{"timing_model": {"type": "interpolated", "path": "q.npz", "fallback": "polynomial"}}"#,
            &files,
        )
        .unwrap();
        assert_eq!(c.timing, TimingModel::Polynomial);
        assert!(c.timing_fallback.unwrap().contains("q.npz"));
        let garbage = |_: &str| Ok(b"not a zip".to_vec());
        let e = EngineConfig::parse_json_with(r#"{"planner_profile_data": "p.npz"}"#, &garbage).unwrap_err();
        assert!(e.message.contains("not an NPZ archive"), "{e}");
    }

    #[test]
    fn kv_transfer_delay() {
        let transfer = |json: &str| WorkerArgs::parse_json(json).unwrap().deployment.kv_transfer;
        let t = transfer(r#"{"kv_bytes_per_token": 1000000, "kv_transfer_bandwidth": 1.0}"#);
        assert_eq!(t.ms(128), 128.0);
        assert_eq!(t.ms(8), 8.0);
        let t = transfer(r#"{"engine": {"kv_transfer_bytes_per_token": 131072, "kv_transfer_bandwidth": 64.0}}"#);
        assert!((t.ms(10_000) - 20.48).abs() < 1e-12);
        assert_eq!(transfer(r#"{"kv_bytes_per_token": 1000}"#).ms(100), 0.0, "no bandwidth");
        assert_eq!(transfer(r#"{"kv_bytes_per_token": 1000, "kv_transfer_bandwidth": 0}"#).ms(100), 0.0);
    }

    #[test]
    fn sglang_attention_dp_ranks_split_the_chunk_budget() {
        let c = parse(r#"{"engine": {"backend": "sglang", "sglang": {"schedule_conservativeness": 0.5}}}"#).unwrap();
        let rank = c.for_attention_dp(2);
        assert_eq!(rank.sglang.chunked_prefill_size, 4096);
        assert!((rank.sglang.schedule_conservativeness - 0.15).abs() < 1e-12);
        assert_eq!(c.for_attention_dp(1), c);
        let v = parse(r#"{"engine": {"backend": "vllm"}}"#).unwrap();
        assert_eq!(v.for_attention_dp(4), v);
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = parse(r#"{"block_size":16,"blok_size":8}"#).unwrap_err();
        assert_eq!(e.path, "blok_size");
        assert!(e.message.starts_with("unknown key"));
        let e = parse(r#"{"engine":{"foo":1}}"#).unwrap_err();
        assert_eq!(e.path, "engine.foo");
        let e =
            parse(r#"{"engine":{"timing_model":{"type":"fixed","prefill_ms":1,"decode_ms":1,"x":2}}}"#).unwrap_err();
        assert_eq!(e.path, "engine.timing_model.x");
    }

    #[test]
    fn bad_values_are_named() {
        let e = parse(r#"{"num_gpu_blocks":"many"}"#).unwrap_err();
        assert_eq!(e.path, "num_gpu_blocks");
        assert!(e.message.contains("\"many\""), "{e}");
        assert_eq!(parse(r#"{"max_num_seqs":0}"#).unwrap_err().path, "max_num_seqs");
        assert_eq!(parse(r#"{"preemption_mode":"random"}"#).unwrap_err().path, "preemption_mode");
        assert_eq!(parse(r#"{"aic_nextn":6}"#).unwrap_err().path, "aic_nextn");
        assert!(parse(r#"{"block_size":16} true"#).unwrap_err().message.contains("trailing"));
        assert_eq!(parse(r#"{"is_prefill":true,"is_decode":true}"#).unwrap_err().path, "is_prefill");
    }
}
