//! Reading either JSON shape into [`RawConfig`]: every key by name, unknown ones rejected,
//! keys for things servesim does not model accepted only with a neutral value.

use serde_json::{json, Value};

use super::{Backend, RawConfig, SglangSettings, WORKER_TYPES};
use crate::request::ReasoningConfig;
use crate::timing::{ProfileRef, TimingModel, Unresolved};
use servesim_config::{ConfigError, Field, Reader, Result};

/// `aic_nextn_accept_rates` as Dynamo reads it: a string (`"0.85,0.3,0"`), parsed later against
/// `aic_nextn` (see [`crate::speculative::conditional_accept_rates`]).
fn rates_text(path: &str, v: &Value) -> Result<String> {
    let kind = match v {
        Value::String(s) => return Ok(s.clone()),
        Value::Bool(b) => format!("boolean `{b}`"),
        Value::Number(n) if n.is_f64() => format!("floating point `{n}`"),
        Value::Number(n) => format!("integer `{n}`"),
        Value::Array(_) => "sequence".to_string(),
        Value::Object(_) => "map".to_string(),
        Value::Null => "null".to_string(),
    };
    Err(ConfigError::new(path, format!("invalid type: {kind}, expected a string")))
}

/// A key Dynamo reads as a Rust `usize` (no null, no default on null): its messages are
/// serde's, as Dynamo 1.6.1 prints them (`invalid value: integer `-1`, expected usize`).
fn usize_key(r: &mut Reader, key: &'static str) -> Result<Option<u64>> {
    let Some(v) = r.raw(key) else { return Ok(None) };
    let why = match v {
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(x), _) => return Ok(Some(x)),
            (None, Some(i)) => format!("invalid value: integer `{i}`, expected usize"),
            _ => format!("invalid type: floating point `{n}`, expected usize"),
        },
        Value::Null => "invalid type: null, expected usize".to_string(),
        Value::Bool(b) => format!("invalid type: boolean `{b}`, expected usize"),
        Value::String(s) => format!("invalid type: string {s:?}, expected usize"),
        Value::Array(_) => "invalid type: sequence, expected usize".to_string(),
        Value::Object(_) => "invalid type: map, expected usize".to_string(),
    };
    Err(ConfigError::new(r.path(key), why))
}

const PREEMPTION_MODES: [&str; 2] = ["lifo", "fifo"];
const TRANSFER_MODES: [&str; 2] = ["full_prompt", "destination_missing"];
/// Dynamo's `RouterQueuePolicy` values.
pub(super) const QUEUE_POLICIES: [&str; 3] = ["fcfs", "lcfs", "wspt"];

/// The fields of `native_host_offload`, in Dynamo's order (its error messages list them so).
const HOST_OFFLOAD_KEYS: [&str; 8] = [
    "scope",
    "num_host_blocks",
    "d2h_bandwidth_gbps",
    "h2d_bandwidth_gbps",
    "shared_d2h_bandwidth_gbps",
    "shared_h2d_bandwidth_gbps",
    "latency_to_first_byte_ms",
    "kv_layout_id",
];

/// A JSON value as serde names it in a type error (`string "8"`, `integer `-1``).
fn serde_unexpected(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("boolean `{b}`"),
        Value::Number(n) if n.is_u64() || n.is_i64() => format!("integer `{n}`"),
        Value::Number(n) => format!("floating point `{n}`"),
        Value::String(s) => format!("string {s:?}"),
        Value::Array(_) => "sequence".into(),
        Value::Object(_) => "map".into(),
    }
}

/// `native_host_offload`, with Dynamo 1.6.1's messages for its shape: unknown keys, types,
/// the scope's values and the required `num_host_blocks` (in that order, as serde reports them).
fn read_host_offload(path: &str, v: &Value) -> Result<super::RawHostOffload> {
    let Value::Object(map) = v else {
        return Err(ConfigError::new(
            path,
            format!("invalid type: {}, expected struct NativeHostOffloadConfig", serde_unexpected(v)),
        ));
    };
    let at = |key: &str| format!("{path}.{key}");
    let default_gbps = super::HostOffload::DEFAULT_BANDWIDTH_GBPS;
    let mut out = super::RawHostOffload {
        cluster_shared: false,
        num_host_blocks: 0,
        d2h_bandwidth_gbps: default_gbps,
        h2d_bandwidth_gbps: default_gbps,
        shared_d2h_bandwidth_gbps: 80.0,
        shared_h2d_bandwidth_gbps: 80.0,
        latency_to_first_byte_ms: 0.0,
        kv_layout_id: None,
    };
    let mut blocks = None;
    for (key, value) in map {
        let float = |value: &Value| f64_field(at(key), value);
        match key.as_str() {
            "scope" => match value.as_str() {
                Some("dp_rank_local") => out.cluster_shared = false,
                Some("cluster_shared") => out.cluster_shared = true,
                Some("worker_local") => return Err(ConfigError::new(
                    at(key),
                    "host_offload.scope `worker_local` is a G3 scope; use `dp_rank_local` for per-DP-rank G2 caches",
                )),
                Some(other) => {
                    return Err(ConfigError::new(
                        at(key),
                        format!("unknown host_offload.scope `{other}`; expected `dp_rank_local` or `cluster_shared`"),
                    ))
                }
                None => {
                    return Err(ConfigError::new(
                        at(key),
                        format!("invalid type: {}, expected a string", serde_unexpected(value)),
                    ))
                }
            },
            "num_host_blocks" => {
                blocks = Some(value.as_u64().ok_or_else(|| {
                    ConfigError::new(at(key), format!("invalid type: {}, expected usize", serde_unexpected(value)))
                })?)
            }
            "d2h_bandwidth_gbps" => out.d2h_bandwidth_gbps = float(value)?,
            "h2d_bandwidth_gbps" => out.h2d_bandwidth_gbps = float(value)?,
            "shared_d2h_bandwidth_gbps" => out.shared_d2h_bandwidth_gbps = float(value)?,
            "shared_h2d_bandwidth_gbps" => out.shared_h2d_bandwidth_gbps = float(value)?,
            "latency_to_first_byte_ms" => out.latency_to_first_byte_ms = float(value)?,
            "kv_layout_id" => {
                out.kv_layout_id = match value {
                    Value::Null => None,
                    Value::String(s) => Some(s.clone()),
                    other => {
                        return Err(ConfigError::new(
                            at(key),
                            format!("invalid type: {}, expected a string", serde_unexpected(other)),
                        ))
                    }
                }
            }
            other => {
                let expected = HOST_OFFLOAD_KEYS.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ");
                return Err(ConfigError::new(
                    at(other),
                    format!("unknown field `{other}`, expected one of {expected}"),
                ));
            }
        }
    }
    out.num_host_blocks = blocks.ok_or_else(|| ConfigError::new(path, "missing field `num_host_blocks`"))?;
    Ok(out)
}

const G3_OFFLOAD_KEYS: [&str; 7] = [
    "scope",
    "num_g3_blocks",
    "latency_to_first_byte_ms",
    "read_bandwidth_gbps",
    "write_bandwidth_gbps",
    "shared_read_bandwidth_gbps",
    "shared_write_bandwidth_gbps",
];

/// A number field of an offload section, with serde's message for anything else.
fn f64_field(path: String, value: &Value) -> Result<f64> {
    value
        .as_f64()
        .ok_or_else(|| ConfigError::new(path, format!("invalid type: {}, expected f64", serde_unexpected(value))))
}

/// `g3_offload`, with Dynamo 1.6.1's messages for its shape: unknown keys, types, the scope's
/// values, then the required `scope` and `num_g3_blocks` (in that order, as serde reports them).
fn read_g3_offload(path: &str, v: &Value) -> Result<super::RawG3Offload> {
    let Value::Object(map) = v else {
        let message = match v {
            Value::Array(items) => {
                format!("invalid length {}, expected struct G3OffloadConfig with 7 elements", items.len())
            }
            other => format!("invalid type: {}, expected struct G3OffloadConfig", serde_unexpected(other)),
        };
        return Err(ConfigError::new(path, message));
    };
    let at = |key: &str| format!("{path}.{key}");
    let mut out = super::RawG3Offload {
        cluster_shared: false,
        num_g3_blocks: 0,
        latency_to_first_byte_ms: super::G3Offload::DEFAULT_LATENCY_MS,
        read_bandwidth_gbps: super::G3Offload::DEFAULT_BANDWIDTH_GBPS,
        write_bandwidth_gbps: super::G3Offload::DEFAULT_BANDWIDTH_GBPS,
        shared_read_bandwidth_gbps: super::G3Offload::DEFAULT_SHARED_BANDWIDTH_GBPS,
        shared_write_bandwidth_gbps: super::G3Offload::DEFAULT_SHARED_BANDWIDTH_GBPS,
    };
    let (mut scope, mut blocks) = (None, None);
    for (key, value) in map {
        let float = |value: &Value| f64_field(at(key), value);
        match key.as_str() {
            "scope" => {
                scope = Some(match value.as_str() {
                    Some("worker_local") => false,
                    Some("cluster_shared") => true,
                    Some(other) => {
                        return Err(ConfigError::new(
                            at(key),
                            format!("unknown variant `{other}`, expected `worker_local` or `cluster_shared`"),
                        ))
                    }
                    None => {
                        return Err(ConfigError::new(
                            at(key),
                            format!("invalid type: {}, expected string or map", serde_unexpected(value)),
                        ))
                    }
                })
            }
            "num_g3_blocks" => {
                blocks = Some(value.as_u64().ok_or_else(|| {
                    let kind = if value.is_i64() { "invalid value" } else { "invalid type" };
                    ConfigError::new(at(key), format!("{kind}: {}, expected usize", serde_unexpected(value)))
                })?)
            }
            "latency_to_first_byte_ms" => out.latency_to_first_byte_ms = float(value)?,
            "read_bandwidth_gbps" => out.read_bandwidth_gbps = float(value)?,
            "write_bandwidth_gbps" => out.write_bandwidth_gbps = float(value)?,
            "shared_read_bandwidth_gbps" => out.shared_read_bandwidth_gbps = float(value)?,
            "shared_write_bandwidth_gbps" => out.shared_write_bandwidth_gbps = float(value)?,
            other => {
                let expected = G3_OFFLOAD_KEYS.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ");
                return Err(ConfigError::new(
                    at(other),
                    format!("unknown field `{other}`, expected one of {expected}"),
                ));
            }
        }
    }
    out.cluster_shared = scope.ok_or_else(|| ConfigError::new(path, "missing field `scope`"))?;
    out.num_g3_blocks = blocks.ok_or_else(|| ConfigError::new(path, "missing field `num_g3_blocks`"))?;
    Ok(out)
}

impl RawConfig {
    /// Keys shared by the flat form and the canonical `engine` section.
    fn read_engine_keys(&mut self, r: &mut Reader) -> Result<()> {
        self.num_gpu_blocks = r.u32("num_gpu_blocks")?;
        self.block_size = r.u32("block_size")?;
        self.max_model_len = r.u32("max_model_len")?;
        self.max_num_seqs = r.u32("max_num_seqs")?;
        self.max_num_batched_tokens = r.u32("max_num_batched_tokens")?;
        self.enable_prefix_caching = r.bool("enable_prefix_caching")?;
        self.enable_chunked_prefill = r.bool("enable_chunked_prefill")?;
        self.speedup_ratio = r.f64("speedup_ratio")?;
        self.decode_speedup_ratio = r.f64("decode_speedup_ratio")?;
        self.async_scheduling = r.bool("async_scheduling")?;
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
            Some(v) => Some((rates_path.clone(), rates_text(&rates_path, v)?)),
        };
        self.mtp_seed = r.u64("aic_mtp_seed")?;
        self.kv_cache_bytes_per_token = r.u64("kv_cache_bytes_per_token")?;
        let host_path = r.path("native_host_offload");
        self.host_offload = match r.raw("native_host_offload") {
            None | Some(Value::Null) => None,
            Some(v) => Some(read_host_offload(&host_path, v)?),
        };
        let g3_path = r.path("g3_offload");
        self.g3_offload = match r.raw("g3_offload") {
            None | Some(Value::Null) => None,
            Some(v) => Some(read_g3_offload(&g3_path, v)?),
        };
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

    /// The backends' memory fractions, each finite and in [0, 1] as Dynamo checks them.
    fn read_memory_fractions(&mut self, r: &mut Reader) -> Result<()> {
        let mut fraction = |key: &'static str| -> Result<Option<f64>> {
            match r.f64(key)?.set() {
                Some(v) if !(v.is_finite() && (0.0..=1.0).contains(&v)) => {
                    Err(ConfigError::new(r.path(key), format!("must be finite and in [0, 1], got {v}")))
                }
                v => Ok(v),
            }
        };
        self.memory.gpu_memory_utilization = fraction("gpu_memory_utilization")?;
        self.memory.mem_fraction_static = fraction("mem_fraction_static")?;
        self.memory.free_gpu_memory_fraction = fraction("free_gpu_memory_fraction")?;
        Ok(())
    }

    fn read_reasoning(&mut self, r: &mut Reader) -> Result<()> {
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

    fn read_sglang(&mut self, r: &mut Reader) -> Result<()> {
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
        let positive = |r: &mut Reader, key: &'static str, default: u32| -> Result<u32> {
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

    pub(super) fn read_flat(&mut self, value: &Value) -> Result<()> {
        let mut r = Reader::new("", value)?;
        self.backend = r.choice("engine_type", &Backend::NAMES)?;
        if r.has("backend") {
            self.backend = r.choice("backend", &Backend::NAMES)?;
        }
        self.read_engine_keys(&mut r)?;
        self.dp_size = r.u32("dp_size")?;
        self.tensor_parallel_size = r.u32("tensor_parallel_size")?;
        self.startup_time = r.f64("startup_time")?;
        self.kv_bytes_per_token = r.u64("kv_bytes_per_token")?;
        if let Some(mut state) = r.object("state_cache")? {
            self.state_bytes_per_request = state.u64("bytes_per_request")?;
            state.finish()?;
        }
        self.prefix_match_unit = r.u32("prefix_match_unit")?;
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
        self.pipeline_size = r.u32("aic_pp_size")?;
        self.prefill_context_size = r.u32("aic_cp_size")?;
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
            self.timing = Some(Unresolved::Profile(ProfileRef {
                key,
                path: path.to_string(),
                fallback: false,
                dynamo_form: false,
            }));
        }
        self.read_memory_fractions(&mut r)?;
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
            "has_perf_model",
        ] {
            r.ignored(key);
        }
        self.router_queue_policy = r.choice("router_queue_policy", &QUEUE_POLICIES)?;
        r.finish()
    }

    pub(super) fn read_canonical(&mut self, value: &Value) -> Result<()> {
        let mut top = Reader::new("", value)?;
        let mut e = top.object("engine")?.ok_or_else(|| ConfigError::new("engine", "must be an object"))?;
        self.backend = e.choice("backend", &Backend::NAMES)?;
        self.read_engine_keys(&mut e)?;
        self.kv_bytes_per_token = e.u64("kv_transfer_bytes_per_token")?;
        if e.has("kv_bytes_per_token") {
            self.kv_bytes_per_token = e.u64("kv_bytes_per_token")?;
        }
        self.prefill_schedule_interval = usize_key(&mut e, "prefill_schedule_interval")?;
        self.prefill_decode_interval = usize_key(&mut e, "prefill_decode_interval")?;
        // Live KV-event publishing: no effect on a replay, but Dynamo's rule between them holds.
        self.emit_kv_events = e.bool("emit_kv_events")?;
        self.emit_kv_token_ids = e.bool("emit_kv_token_ids")?;
        for key in ["kv_cache_groups", "kv_cache_capacity_bytes", "state_cache", "prefix_match_unit"] {
            e.unsupported(key, &[], key)?;
        }
        e.finish()?;

        self.dp_size = top.u32("dp_size")?;
        self.tensor_parallel_size = top.u32("tensor_parallel_size")?;
        self.startup_time = top.f64("startup_time")?;
        self.num_gpu_blocks_is_explicit = top.bool("num_gpu_blocks_is_explicit")?;
        self.read_memory_fractions(&mut top)?;
        self.memory.cuda_graph_reserved_bytes = top.u64("cuda_graph_reserved_bytes")?.set();
        if let Some(mut d) = top.object("dynamo")? {
            for key in [
                "enable_local_indexer",
                "bootstrap_port",
                "handoff_session_timeout_ms",
                "zmq_kv_events_port",
                "zmq_replay_port",
            ] {
                d.ignored(key);
            }
            self.router_queue_policy = d.choice("router_queue_policy", &QUEUE_POLICIES)?;
            self.read_reasoning(&mut d)?;
            d.unsupported("response_replay_trace_path", &[], "response replay traces")?;
            d.finish()?;
        }
        top.finish()
    }
}
