//! Engine configuration: Dynamo's `MockEngineArgs` in either of its JSON shapes.
//!
//! * the canonical nested form printed by Dynamo 1.6.1 (`{"engine": {...}, "dp_size": 1, ...}`);
//! * the flat `MockEngineArgs` form of earlier releases (`{"block_size": 16, "num_gpu_blocks": ...}`).
//!
//! Defaults are Dynamo's. Unknown keys are rejected by name; keys that Dynamo accepts but that
//! describe something servesim does not model are accepted only with a neutral value.
//!
//! The types live here; [`WorkerArgs`] and the deployment keys in `worker`, reading both JSON
//! shapes into raw fields in `read`, defaults and validation in `normalise`.

mod normalise;
mod read;
#[cfg(test)]
mod tests;
mod worker;

use serde_json::{json, Value};

use crate::request::ReasoningConfig;
use crate::speculative::{SpecSchedule, SpeculativeConfig};
use crate::timing::{MemoryLimits, TimerFactory, TimingModel, Unresolved};
use servesim_config::{Field, Result};

pub use worker::{Deployment, KvTransfer, KvTransferTimingMode, WorkerArgs};

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
    /// Whose speculative schedule the engine follows. Dynamo's engine launch has no ngram
    /// draft scheduler and refuses a timing config's `speculation`; aisimulate's replay roles
    /// (the unified config) schedule those drafts at the timing config's depth.
    pub spec_schedule: SpecSchedule,
}

impl ConfigEnv<'static> {
    /// No files, no external models, Dynamo's schedule.
    pub const NONE: ConfigEnv<'static> =
        ConfigEnv { files: &no_files, timers: None, spec_schedule: SpecSchedule::Dynamo };
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
    /// A prefill worker's finished prompt joins the radix cache when it finishes, while its KV
    /// moves to the decode side (aisimulate's engine), rather than once the decode side has it
    /// (Dynamo's mocker, the default). Not an engine argument: the unified YAML sets it.
    pub cache_held_prompts: bool,
    /// A running request's decoded pages join the radix cache as they fill (Dynamo's mocker,
    /// the default) rather than when it finishes (aisimulate's engine, as SGLang does): a
    /// request retracted meanwhile then re-prefills past its prompt. Not an engine argument:
    /// the unified YAML clears it.
    pub cache_decoded_pages: bool,
    /// Retraction takes the running request with the fewest generated tokens, then the longest
    /// prompt, then the latest admitted (SGLang's `retract_decode` order, aisimulate's engine)
    /// rather than the first with the fewest generated tokens (Dynamo's mocker, the default).
    /// Not an engine argument: the unified YAML sets it.
    pub retract_in_sglang_order: bool,
    /// Replay each pass as one iteration of SGLang's overlap scheduler (aisimulate's
    /// `host_loop`): requests are received at iteration boundaries and a request is known to be
    /// finished one pass after its last token. Not an engine argument: the unified YAML sets it.
    pub host_loop: bool,
    /// The vision tower this worker hosts (aisimulate's native VL replay). Not an engine
    /// argument: the unified YAML sets it.
    pub vision: Option<VisionSettings>,
}

/// Native VL replay on an SGLang worker: every prompt starts with `images_per_request` images
/// of `image_tokens` tokens each, an image named by its first token (identical images have
/// identical tokens); a prefill pass encodes the distinct images its chunks reach that the
/// embedding cache does not hold, in one call of the hosted tower.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VisionSettings {
    pub image_tokens: u32,
    pub images_per_request: u32,
    /// One image's embeddings in the cache.
    pub image_bytes: u64,
    /// SGLang's multimodal embedding cache (`SGLANG_VLM_CACHE_SIZE_MB`), bytes.
    pub cache_bytes: u64,
}

impl Default for SglangSettings {
    fn default() -> Self {
        SglangSettings {
            lpm: false,
            max_prefill_tokens: 16384,
            chunked_prefill_size: 8192,
            clip_max_new_tokens: 4096,
            schedule_conservativeness: 1.0,
            cache_held_prompts: false,
            cache_decoded_pages: true,
            retract_in_sglang_order: false,
            host_loop: false,
            vision: None,
        }
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
    /// vLLM's async scheduling (`--async-scheduling`, on by default since vLLM 0.14): the
    /// next pass is scheduled when the current one starts, so a request arriving during a pass
    /// joins the pass after next (see `VllmEngine::schedulable`). Off by default, as in the
    /// reference; vLLM only.
    pub async_scheduling: bool,
    pub preemption_mode: PreemptionMode,
    pub role: Role,
    pub timing: TimingModel,
    pub sglang: SglangSettings,
    /// Speculative decoding (MTP), when `aic_nextn` is set.
    pub speculative: Option<SpeculativeConfig>,
    /// Thinking tokens around the start of every generated output.
    pub reasoning: Option<ReasoningConfig>,
    /// vLLM with attention DP: new prefill work starts only on every n-th pass of the worker's
    /// ranks while they decode (1 = every pass; see [`crate::vllm`]). Always 1 for the other
    /// backends.
    pub prefill_schedule_interval: u64,
    /// SGLang: passes after a prefill (on any attention-DP rank of the worker) that only decode
    /// before the next prefill may start (0 = none; see [`crate::sglang`]). Always 0 for the
    /// other backends.
    pub prefill_decode_interval: u64,
    /// Why a timing profile was replaced by the polynomial model (the user allowed it).
    pub timing_fallback: Option<String>,
    /// Physical KV bytes of one token (`kv_cache_bytes_per_token`): sizes host blocks.
    pub kv_cache_bytes_per_token: Option<u64>,
    /// vLLM's host (G2) KV cache (`native_host_offload`): per DP rank, or one pool for the
    /// deployment (`cluster_shared`).
    pub host_offload: Option<HostOffload>,
    /// A G3 tier below each worker's host cache (`g3_offload`, scope `worker_local`).
    pub g3_offload: Option<G3Offload>,
    /// The recurrent-state cache (`state_cache`, `prefix_match_unit`; vLLM only).
    pub state_cache: Option<StateCacheConfig>,
}

/// The recurrent-state cache of a hybrid state-space model: every running request holds its
/// state in `blocks_per_state` blocks of the KV pool, and a prompt reuses a cached prefix only
/// where a state was saved (see `vllm/state_cache.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateCacheConfig {
    /// Blocks one request state takes: `bytes_per_request` over the bytes of a block, rounded up.
    pub blocks_per_state: u32,
    /// `prefix_match_unit`: None keeps one saved state per request at its newest full block
    /// (vLLM's default retention); Some(unit) saves states at the prompt's last full block and
    /// unit-aligned tail, and splits prefill at block boundaries (vLLM's align mode).
    pub prefix_match_unit: Option<u32>,
}

/// The `native_host_offload` section: a host KV cache private to each DP rank, or one pool
/// the deployment's ranks share (see `docs/host-offload.md`).
#[derive(Clone, Debug, PartialEq)]
pub struct HostOffload {
    /// One pool for the deployment (`cluster_shared`) rather than one cache per DP rank.
    pub cluster_shared: bool,
    /// Capacity in blocks: per DP rank, or of the shared pool.
    pub num_host_blocks: u64,
    /// Device-to-host rate of a rank in decimal GB/s; zero is unlimited.
    pub d2h_bandwidth_gbps: f64,
    /// Host-to-device rate of a rank in decimal GB/s; zero is unlimited.
    pub h2d_bandwidth_gbps: f64,
    /// Caps of a shared pool over all its ranks (a private cache does not use them).
    pub shared_d2h_bandwidth_gbps: f64,
    pub shared_h2d_bandwidth_gbps: f64,
    pub latency_to_first_byte_ms: f64,
    /// Identity of the stored layout (required for `cluster_shared`).
    pub kv_layout_id: Option<String>,
}

impl HostOffload {
    /// The host tier these keys describe for blocks of `block_size` tokens of
    /// `bytes_per_token`: a rank's private cache with its own rates, or (`pool`) the shared
    /// pool with the pool's caps as its rates.
    pub fn tier_config(&self, block_size: u32, bytes_per_token: u64, pool: bool) -> crate::offload::HostTierConfig {
        let (d2h, h2d) = if pool {
            (self.shared_d2h_bandwidth_gbps, self.shared_h2d_bandwidth_gbps)
        } else {
            (self.d2h_bandwidth_gbps, self.h2d_bandwidth_gbps)
        };
        crate::offload::HostTierConfig::new(
            self.num_host_blocks as usize,
            block_size as usize,
            bytes_per_token,
            d2h,
            h2d,
            self.latency_to_first_byte_ms,
        )
        .expect("validated host offload configuration")
    }

    pub const DEFAULT_BANDWIDTH_GBPS: f64 = 32.0;
    pub const DEFAULT_SHARED_BANDWIDTH_GBPS: f64 = 80.0;

    /// The section as Dynamo 1.6.1 normalises it: the scope only when shared, the pool caps
    /// only when not the default, the latency only when it is not zero, the layout id when set.
    fn canonical_json(&self) -> Value {
        let mut v = serde_json::Map::new();
        if self.cluster_shared {
            v.insert("scope".into(), json!("cluster_shared"));
        }
        v.insert("num_host_blocks".into(), json!(self.num_host_blocks));
        v.insert("d2h_bandwidth_gbps".into(), json!(self.d2h_bandwidth_gbps));
        v.insert("h2d_bandwidth_gbps".into(), json!(self.h2d_bandwidth_gbps));
        for (key, gbps) in [
            ("shared_d2h_bandwidth_gbps", self.shared_d2h_bandwidth_gbps),
            ("shared_h2d_bandwidth_gbps", self.shared_h2d_bandwidth_gbps),
        ] {
            if gbps != Self::DEFAULT_SHARED_BANDWIDTH_GBPS {
                v.insert(key.into(), json!(gbps));
            }
        }
        if self.latency_to_first_byte_ms != 0.0 {
            v.insert("latency_to_first_byte_ms".into(), json!(self.latency_to_first_byte_ms));
        }
        if let Some(id) = &self.kv_layout_id {
            v.insert("kv_layout_id".into(), json!(id));
        }
        Value::Object(v)
    }
}

/// The `g3_offload` section: secondary storage of each worker (`worker_local`) or one pool for
/// the deployment (`cluster_shared`), staged through the host cache (see
/// `docs/host-offload.md` §8).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct G3Offload {
    /// One pool for the deployment (`cluster_shared`) rather than one per worker.
    pub cluster_shared: bool,
    /// Capacity in blocks: per worker, or of the shared pool.
    pub num_g3_blocks: u64,
    pub latency_to_first_byte_ms: f64,
    /// Per-worker rates in decimal GB/s; zero is unlimited.
    pub read_bandwidth_gbps: f64,
    pub write_bandwidth_gbps: f64,
    /// Pool caps of the `cluster_shared` scope; a worker-local tier does not use them.
    pub shared_read_bandwidth_gbps: f64,
    pub shared_write_bandwidth_gbps: f64,
}

impl G3Offload {
    /// The tier's sizes and per-worker rates, for host blocks of `block_bytes`.
    pub fn tier_config(&self, block_bytes: u64) -> crate::offload::G3TierConfig {
        crate::offload::G3TierConfig {
            capacity_blocks: self.num_g3_blocks as usize,
            block_bytes,
            latency_to_first_byte_ms: self.latency_to_first_byte_ms,
            read_gbps: self.read_bandwidth_gbps,
            write_gbps: self.write_bandwidth_gbps,
        }
    }

    pub const DEFAULT_LATENCY_MS: f64 = 0.1;
    pub const DEFAULT_BANDWIDTH_GBPS: f64 = 10.0;
    pub const DEFAULT_SHARED_BANDWIDTH_GBPS: f64 = 80.0;

    /// The section as Dynamo 1.6.1 normalises it: every key.
    fn canonical_json(&self) -> Value {
        json!({
            "scope": if self.cluster_shared { "cluster_shared" } else { "worker_local" },
            "num_g3_blocks": self.num_g3_blocks,
            "latency_to_first_byte_ms": self.latency_to_first_byte_ms,
            "read_bandwidth_gbps": self.read_bandwidth_gbps,
            "write_bandwidth_gbps": self.write_bandwidth_gbps,
            "shared_read_bandwidth_gbps": self.shared_read_bandwidth_gbps,
            "shared_write_bandwidth_gbps": self.shared_write_bandwidth_gbps,
        })
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        WorkerArgs::default().engine
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
        WorkerArgs::parse_json_env(text, ConfigEnv { files, ..ConfigEnv::NONE }).map(|w| w.engine)
    }

    /// Reads a parsed JSON value in either shape (without file access).
    pub fn from_value(value: &Value) -> Result<Self> {
        WorkerArgs::from_value(value).map(|w| w.engine)
    }

    /// Reads a parsed JSON value, reading referenced files through `files`.
    pub fn from_value_with(value: &Value, files: FileLoader) -> Result<Self> {
        Self::from_value_env(value, ConfigEnv { files, ..ConfigEnv::NONE })
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
            TimingModel::Interpolated { path, dynamo_form: true, .. } => {
                json!({"type": "external", "provider": crate::timing::DYNAMO_PROFILE_PROVIDER, "config": {"path": path}})
            }
            TimingModel::Interpolated { path, .. } => json!({"type": "interpolated", "path": path}),
            TimingModel::External(e) => {
                json!({"type": "external", "provider": e.provider, "config": e.timer().config()})
            }
        };
        let mut engine = json!({
                "backend": self.backend.name(),
                "num_gpu_blocks": self.num_gpu_blocks,
                "block_size": self.block_size,
                "max_model_len": self.max_model_len,
                "max_num_seqs": self.max_num_seqs,
                "max_num_batched_tokens": self.max_num_batched_tokens,
                "prefill_schedule_interval": self.prefill_schedule_interval,
                "prefill_decode_interval": self.prefill_decode_interval,
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
        });
        // Dynamo prints these two only when they are set.
        if let Some(bytes) = self.kv_cache_bytes_per_token {
            engine["kv_cache_bytes_per_token"] = json!(bytes);
        }
        // servesim's own; printed only when on.
        if self.async_scheduling {
            engine["async_scheduling"] = json!(true);
        }
        if let Some(host) = &self.host_offload {
            engine["native_host_offload"] = host.canonical_json();
        }
        if let Some(g3) = &self.g3_offload {
            engine["g3_offload"] = g3.canonical_json();
        }
        if let Some(state) = &self.state_cache {
            engine["state_cache_blocks_per_request"] = json!(state.blocks_per_state);
            engine["prefix_match_unit"] = json!(state.prefix_match_unit);
        }
        engine
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
    async_scheduling: Field<bool>,
    preemption_mode: Field<usize>,
    role: Field<usize>,
    timing: Option<Unresolved>,
    dp_size: Field<u32>,
    tensor_parallel_size: Field<u32>,
    /// `aic_pp_size`: the pipeline depth aisimulate's runner passes beside the timing config.
    pipeline_size: Field<u32>,
    /// `aic_cp_size`, or the AIS timing config's `cp_size`: prefill context parallelism, which
    /// widens the worker.
    prefill_context_size: Field<u32>,
    startup_time: Field<f64>,
    kv_bytes_per_token: Field<u64>,
    kv_transfer_bandwidth: Field<f64>,
    kv_transfer_timing_mode: Field<usize>,
    sglang: SglangSettings,
    sglang_page_size: Field<u32>,
    nextn: Field<u32>,
    /// `aic_nextn_accept_rates` (its key path, its text).
    accept_rates: Option<(String, String)>,
    mtp_seed: Field<u64>,
    reasoning: Option<ReasoningConfig>,
    memory: MemoryLimits,
    num_gpu_blocks_is_explicit: Field<bool>,
    router_queue_policy: Field<usize>,
    emit_kv_events: Field<bool>,
    emit_kv_token_ids: Field<bool>,
    kv_cache_bytes_per_token: Field<u64>,
    host_offload: Option<RawHostOffload>,
    g3_offload: Option<RawG3Offload>,
    /// `state_cache.bytes_per_request` and `prefix_match_unit` (flat engine args only).
    state_bytes_per_request: Field<u64>,
    prefix_match_unit: Field<u32>,
    prefill_schedule_interval: Option<u64>,
    prefill_decode_interval: Option<u64>,
}

/// `native_host_offload` as read (types checked), before the checks across keys.
struct RawHostOffload {
    cluster_shared: bool,
    num_host_blocks: u64,
    d2h_bandwidth_gbps: f64,
    h2d_bandwidth_gbps: f64,
    shared_d2h_bandwidth_gbps: f64,
    shared_h2d_bandwidth_gbps: f64,
    latency_to_first_byte_ms: f64,
    kv_layout_id: Option<String>,
}

/// `g3_offload` as read (types checked), before the checks across keys.
struct RawG3Offload {
    cluster_shared: bool,
    num_g3_blocks: u64,
    latency_to_first_byte_ms: f64,
    read_bandwidth_gbps: f64,
    write_bandwidth_gbps: f64,
    shared_read_bandwidth_gbps: f64,
    shared_write_bandwidth_gbps: f64,
}

const WORKER_TYPES: [&str; 3] = ["aggregated", "prefill", "decode"];
