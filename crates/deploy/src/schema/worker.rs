//! One worker role of `engine.workers` (aggregated, prefill, decode): parallelism, scheduler
//! limits, KV cache, timing model.

use serde_json::{json, Value};

use super::controls::{check_transfer_policy, read_timing_controls, Controls};
use super::engine::read_systems_paths;
use super::estimator::check_estimator_config;
use super::offload::{read_offload, Offload};
use crate::error::DeployError;
use crate::reader::ErrAt;
use servesim_config::Reader;

#[derive(Clone, Debug, PartialEq)]
pub struct Parallelism {
    pub replicas: u32,
    pub tensor: u32,
    pub pipeline: u32,
    /// Prefill context parallelism: ranks of one attention group that split each prompt.
    pub prefill_context: u32,
    /// Decode context parallelism: tensor-parallel ranks that stripe the KV cache by position
    /// (the AIS config's `dcp`; no extra GPUs).
    pub decode_context: u32,
    /// Whether the config states `decode_context` (even 1): an FPM table's DCP cells are
    /// selected only by a deployment that states it.
    pub decode_context_stated: bool,
    pub attention_data: u32,
    pub moe_tensor: u32,
    pub moe_expert: u32,
}

impl Parallelism {
    /// GPUs one worker occupies.
    pub fn gpus(&self) -> u32 {
        self.tensor * self.pipeline * self.attention_data * self.prefill_context
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Timing {
    Default,
    Fixed { prefill_ms: f64, decode_ms: f64 },
    Polynomial,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Capacity {
    Default { memory_fraction: Option<f64>, cuda_graph_reserved_bytes: u64 },
    Blocks(u64),
    Bytes(u64),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Worker {
    pub role: &'static str,
    pub hardware: Option<String>,
    pub context_length: Option<u32>,
    pub parallelism: Parallelism,
    pub max_batched_tokens: u32,
    pub max_sequences: u32,
    /// vLLM with attention DP: new prefill work starts only on every n-th pass while decoding.
    pub prefill_schedule_interval: u32,
    /// SGLang: decode-only passes after a prefill before the next may start.
    pub prefill_decode_interval: u32,
    /// vLLM's async scheduling (servesim's own key; see the engine's `async_scheduling`).
    pub async_scheduling: bool,
    pub block_size: Option<u32>,
    pub prefix_caching: bool,
    pub bytes_per_token: Option<u64>,
    pub capacity: Capacity,
    /// Host (G2) and G3 caches below the device cache.
    pub offload: Option<Offload>,
    /// The recurrent-state cache (`state_cache`, `prefix_match_unit`); its bytes are sized from
    /// the model when lowered if not given (`crate::state_size`).
    pub state_cache: Option<crate::state_size::StateCache>,
    pub timing: Timing,
    /// `timing.systems_paths`: this worker's performance data, in place of the engine's.
    pub systems_paths: Option<Vec<String>>,
    /// `timing`'s quantisation and attention-backend overrides of the engine's controls.
    pub timing_controls: Controls,
    pub startup_seconds: f64,
    /// SGLang's host-loop replay (`host_loop`, aggregated or prefill worker).
    pub host_loop: bool,
    /// `vision`: the vision tower this worker hosts (native VL replay), as written; images
    /// without an encoder pool put the default one on the aggregated or prefill worker.
    pub vision: Option<Vision>,
    /// SGLang's frontend stages ahead of the scheduler (`frontend`; implies the host loop).
    pub frontend: Option<super::frontend::Frontend>,
    /// The host cost table the stages come from (`host_profile`; resolved against the workload
    /// into `frontend` once the configuration is read).
    pub host_profile: Option<super::frontend::HostProfile>,
}

/// `workers.<aggregated|prefill>.vision` (the reference's `VisionPredictionConfig`).
#[derive(Clone, Debug, PartialEq)]
pub struct Vision {
    /// SGLang's multimodal embedding cache, MiB (`SGLANG_VLM_CACHE_SIZE_MB`).
    pub cache_mib: u64,
    /// `tp` (the tower sharded over the tensor group) or `dp` (replicated, images split).
    pub encoder_parallel: &'static str,
    /// The images it encodes (`traffic.source.images`), set once the whole configuration is
    /// read; None when the workload has none (refused).
    pub images: Option<super::encoder::Images>,
}

impl Default for Vision {
    fn default() -> Self {
        Vision { cache_mib: 100, encoder_parallel: "tp", images: None }
    }
}

pub(super) fn read_worker(mut w: Reader, role: &'static str, backend: &str) -> Result<Worker, DeployError> {
    let hardware = w.nonempty("hardware")?;
    let context_length = w.positive("context_length")?;
    let mut p = Parallelism {
        replicas: 1,
        tensor: 1,
        pipeline: 1,
        prefill_context: 1,
        decode_context: 1,
        decode_context_stated: false,
        attention_data: 1,
        moe_tensor: 1,
        moe_expert: 1,
    };
    if let Some(mut o) = w.obj("parallelism")? {
        p.replicas = o.positive("replicas")?.unwrap_or(1);
        p.tensor = o.positive("tensor")?.unwrap_or(1);
        p.pipeline = o.positive("pipeline")?.unwrap_or(1);
        p.attention_data = o.positive("attention_data")?.unwrap_or(1);
        p.moe_tensor = o.positive("moe_tensor")?.unwrap_or(1);
        p.moe_expert = o.positive("moe_expert")?.unwrap_or(1);
        p.prefill_context = o.positive("prefill_context")?.unwrap_or(1);
        if let Some(dcp) = o.positive("decode_context")? {
            if !p.tensor.is_multiple_of(dcp) {
                return Err(o.err("decode_context", "decode_context must divide tensor parallelism"));
            }
            if p.prefill_context > 1 && dcp > 1 && role == "aggregated" {
                return Err(o.err(
                    "decode_context",
                    format!(
                        "aggregated workers support at most one of parallelism.prefill_context and \
                         parallelism.decode_context above 1 (got prefill_context={}, decode_context={dcp}); use a \
                         disaggregated deployment to apply prefill CP on the prefill worker and decode CP on the \
                         decode worker",
                        p.prefill_context
                    ),
                ));
            }
            p.decode_context = dcp;
            p.decode_context_stated = true;
        }
        o.finish()?;
    }
    let default_seqs = if role == "prefill" { 1 } else { 256 };
    let (mut mbt, mut seqs) = (8192, default_seqs);
    let (mut schedule_interval, mut decode_interval) = (1, 0);
    let mut async_scheduling = false;
    if let Some(mut s) = w.obj("scheduler")? {
        async_scheduling = s.flag("async_scheduling")?.unwrap_or(false);
        if async_scheduling && backend != "vllm" {
            return Err(s.err(
                "async_scheduling",
                format!("workers.{role}.scheduler.async_scheduling is modelled only for backend=vllm"),
            ));
        }
        mbt = s.positive("max_batched_tokens")?.unwrap_or(8192);
        seqs = s.positive("max_sequences")?.unwrap_or(default_seqs);
        // Each interval belongs to one backend; elsewhere only its default is accepted.
        for (key, min, default, owner) in
            [("prefill_schedule_interval", 1, 1, "vllm"), ("prefill_decode_interval", 0, 0, "sglang")]
        {
            let v = s.u32_min(key, min)?.unwrap_or(default);
            if v != default && backend != owner {
                return Err(s.err(key, format!("workers.{role}.scheduler.{key} is supported only for backend={owner}")));
            }
            if key == "prefill_schedule_interval" {
                schedule_interval = v;
            } else {
                decode_interval = v;
            }
        }
        s.finish()?;
    }
    let (mut block_size, mut prefix_caching, mut bytes_per_token) = (None, true, None);
    let mut capacity = Capacity::Default { memory_fraction: None, cuda_graph_reserved_bytes: 0 };
    let mut offload = None;
    let mut state_cache = None;
    if let Some(mut k) = w.obj("kv_cache")? {
        block_size = k.positive("block_size")?;
        prefix_caching = k.flag("prefix_caching")?.unwrap_or(true);
        bytes_per_token = match k.value("bytes_per_token") {
            None => None,
            Some(Value::String(s)) if s == "auto" => None,
            Some(_) => Some(
                k.integer("bytes_per_token")?
                    .filter(|&n| n > 0)
                    .ok_or_else(|| k.err("bytes_per_token", "must be \"auto\" or a positive integer"))?,
            ),
        };
        let state_keys = read_state_cache(&mut k)?;
        offload = read_offload(&mut k)?;
        if let Some(mut c) = k.obj("capacity")? {
            let ty = c.one_of("type", &["default", "fixed"])?.unwrap_or("default");
            let frac = c.nonneg("memory_fraction", true)?;
            if frac.is_some_and(|f| f > 1.0) {
                return Err(c.err("memory_fraction", "must be in (0, 1]"));
            }
            let blocks = c.integer("blocks")?;
            let bytes = c.integer("bytes")?;
            let cg = c.integer("cuda_graph_reserved_bytes")?.unwrap_or(0);
            let here = c.here().to_string();
            c.finish()?;
            capacity = if ty == "fixed" {
                match (blocks, bytes) {
                    (None, None) => return Err(DeployError::new(here, "fixed KV capacity requires blocks or bytes")),
                    (Some(_), Some(_)) => {
                        return Err(DeployError::new(here, "fixed KV capacity accepts only one of blocks or bytes"))
                    }
                    _ if frac.is_some() => {
                        return Err(DeployError::new(here, "fixed KV capacity rejects memory_fraction"))
                    }
                    _ if cg != 0 => {
                        return Err(DeployError::new(here, "fixed KV capacity rejects cuda_graph_reserved_bytes"))
                    }
                    (Some(0), _) | (_, Some(0)) => {
                        return Err(DeployError::new(here, "fixed KV capacity must be positive"))
                    }
                    (Some(b), None) => Capacity::Blocks(b),
                    (None, Some(b)) => {
                        // An inferred state cache resolves the token bytes from the model.
                        let inferred = state_keys.as_ref().is_some_and(|s| matches!(s.state, Some(None)));
                        if bytes_per_token.is_none() && !inferred {
                            return Err(DeployError::new(
                                here,
                                "fixed KV capacity in bytes requires kv_cache.bytes_per_token",
                            ));
                        }
                        Capacity::Bytes(b)
                    }
                }
            } else {
                if blocks.is_some() || bytes.is_some() {
                    return Err(DeployError::new(here, "default KV capacity rejects blocks or bytes"));
                }
                Capacity::Default { memory_fraction: frac, cuda_graph_reserved_bytes: cg }
            };
        }
        if let Some(state) = state_keys {
            let prefix_match_unit = state.prefix_match_unit;
            let (mamba_cache_dtype, indexer_cache_dtype) = (state.mamba.clone(), state.indexer.clone());
            let bytes =
                check_state_cache(&k, state, backend, block_size, bytes_per_token, &capacity, offload.as_ref())?;
            state_cache = Some(crate::state_size::StateCache {
                bytes_per_request: bytes,
                prefix_match_unit,
                mamba_cache_dtype,
                indexer_cache_dtype,
            });
        }
        k.finish()?;
    }
    let mut systems_paths = None;
    let mut timing_controls = Controls::new();
    let timing = match w.obj("timing")? {
        None => Timing::Default,
        Some(mut t) => {
            let ty = t.one_of("type", &["default", "fixed", "polynomial"])?.unwrap_or("default");
            let pre = t.nonneg("prefill_ms", false)?;
            let dec = t.nonneg("decode_ms", false)?;
            let here = t.here().to_string();
            timing_controls = read_timing_controls(&mut t)?;
            if !timing_controls.is_empty() && ty != "default" {
                return Err(DeployError::new(&here, "quantization and backend identity require default timing"));
            }
            // servesim's own: time a pass that prefills beside decodes as one forward.
            if t.one_of("pass_model", &["additive", "fused"])? == Some("fused") {
                if ty != "default" {
                    return Err(t.err(
                        "pass_model",
                        "fused passes need default (AIS op-level) timing: only it times a pass's ops",
                    ));
                }
                timing_controls.insert("pass_model".into(), json!("fused"));
            }
            // servesim's own: pass-time corrections fitted by `servesim calibrate`.
            if let Some(mut c) = t.obj("calibration")? {
                if ty != "default" {
                    return Err(t.err(
                        "calibration",
                        "a calibration corrects default (AIS op-level) timing; fixed and polynomial timing take none",
                    ));
                }
                let mut fitted = serde_json::Map::new();
                for (key, lo, hi) in servesim_perf::PassCalibration::KEYS {
                    if let Some(x) = c.number(key)? {
                        if !(lo..=hi).contains(&x) {
                            return Err(c.err(key, format!("must be in [{lo}, {hi}], got {x}")));
                        }
                        fitted.insert(key.into(), json!(x));
                    }
                }
                c.finish()?;
                timing_controls.insert("calibration".into(), Value::Object(fitted));
            }
            // Forward-pass-measurement selection (`fpm.rs`): read before the estimator keys.
            super::fpm::read_timing(&mut t, ty, &mut timing_controls)?;
            systems_paths = read_systems_paths(&mut t)?;
            if let Some(v) = t.value("estimator_config") {
                check_estimator_config(&t.path("estimator_config"), v)?;
            }
            // Inert under SILICON (see `check_transfer_policy`) and kept to default timing, except
            // for the default policy the reference writes into every canonical dump.
            if let Some(v) = t.value("transfer_policy").filter(|v| !v.is_null()) {
                check_transfer_policy(&t.path("transfer_policy"), v)?;
                if ty != "default" && v != &json!(["xshape", "xquant", "xprofile", "xop"]) {
                    return Err(t.err("transfer_policy", "estimator settings require default timing"));
                }
            }
            if let Some(m) = super::engine::database_mode(&mut t)? {
                // The reference's rule for every estimator setting of a worker's timing.
                if ty != "default" {
                    return Err(t.err("database_mode", "estimator settings require default timing"));
                }
                // Also an explicit SILICON: a worker's own mode overrides the engine's.
                timing_controls.insert("database_mode".into(), json!(m));
            }
            t.finish()?;
            match ty {
                "fixed" => match (pre, dec) {
                    (Some(p), Some(d)) => Timing::Fixed { prefill_ms: p, decode_ms: d },
                    _ => return Err(DeployError::new(here, "fixed timing requires prefill_ms and decode_ms")),
                },
                other => {
                    if pre.is_some() || dec.is_some() {
                        return Err(DeployError::new(here, format!("{other} timing rejects fixed timing values")));
                    }
                    if other == "polynomial" {
                        Timing::Polynomial
                    } else {
                        Timing::Default
                    }
                }
            }
        }
    };
    let (frontend, host_profile) =
        if role != "decode" { super::frontend::read_worker_frontend(&mut w)? } else { (None, None) };
    let staged = frontend.is_some() || host_profile.is_some();
    let (host_loop, vision) =
        if role != "decode" { read_host_loop(&mut w, backend, &p, staged)? } else { (false, None) };
    let startup_seconds = w.nonneg("startup_seconds", false)?.unwrap_or(0.0);
    w.finish()?;
    Ok(Worker {
        role,
        hardware,
        context_length,
        parallelism: p,
        max_batched_tokens: mbt,
        max_sequences: seqs,
        prefill_schedule_interval: schedule_interval,
        async_scheduling,
        prefill_decode_interval: decode_interval,
        block_size,
        prefix_caching,
        bytes_per_token,
        capacity,
        offload,
        state_cache,
        timing,
        systems_paths,
        timing_controls,
        startup_seconds,
        host_loop,
        vision,
        frontend,
        host_profile,
    })
}

/// The reference's host-aware settings of an aggregated or prefill worker: `host_loop` replays
/// each pass as one SGLang overlap-scheduler iteration (requests received at iteration
/// boundaries, a forward's outputs seen by the scheduler one iteration later; see the engine's
/// `sglang` module) and `vision` hosts the vision tower (native VL replay, the engine's
/// `sglang::vision`). Frontend stages (`staged`: `frontend` or `host_profile`) run ahead of the
/// loop and imply it. The reference's gates: SGLang only, one pipeline stage, no attention DP,
/// no context parallelism.
fn read_host_loop(
    w: &mut Reader,
    backend: &str,
    p: &Parallelism,
    staged: bool,
) -> Result<(bool, Option<Vision>), DeployError> {
    let vision = match w.obj("vision")? {
        None => None,
        Some(mut v) => {
            let cache_mib = v.integer("cache_mib")?.unwrap_or(100);
            if cache_mib > u64::MAX >> 20 {
                return Err(v.err("cache_mib", "is too large"));
            }
            let encoder_parallel = v.one_of("encoder_parallel", &["tp", "dp"])?.unwrap_or("tp");
            v.finish()?;
            Some(Vision { cache_mib, encoder_parallel, images: None })
        }
    };
    let host_loop = match w.flag("host_loop")? {
        Some(false) if staged => {
            return Err(w.err("host_loop", "frontend stages run ahead of the scheduler loop; drop host_loop: false"))
        }
        Some(flag) => flag,
        None => staged,
    };
    if !host_loop && vision.is_none() {
        return Ok((false, None));
    }
    let key = if host_loop { "host_loop" } else { "vision" };
    if backend != "sglang" {
        return Err(w.err(key, format!("{key} is supported only for backend=sglang")));
    }
    check_native_vl_parallelism(p).map_err(|why| w.err(key, why))?;
    Ok((host_loop, vision))
}

/// The reference's parallelism gate of the worker hosting the host loop or the vision tower
/// (also of image workloads without an encoder pool, which host it implicitly).
pub(super) fn check_native_vl_parallelism(p: &Parallelism) -> Result<(), &'static str> {
    if p.pipeline != 1 || p.attention_data != 1 || p.prefill_context != 1 || p.decode_context != 1 {
        return Err("native VL replay requires the host-aware worker's parallelism with pipeline=1, \
                    attention_data=1, prefill_context=1 and decode_context=1");
    }
    Ok(())
}

/// `kv_cache.state_cache` and `kv_cache.prefix_match_unit` as read: the state bytes a request
/// holds (None: to be inferred from the model) and the prefix-match unit.
#[derive(Clone, Debug)]
struct StateCacheKeys {
    /// Some when `state_cache` is set: its `bytes_per_request`, if given.
    state: Option<Option<u64>>,
    prefix_match_unit: Option<u64>,
    /// `mamba_cache_dtype` and `indexer_cache_dtype` (what sizes an inferred state).
    mamba: String,
    indexer: String,
}

fn read_state_cache(k: &mut Reader) -> Result<Option<StateCacheKeys>, DeployError> {
    let prefix_match_unit = match k.integer("prefix_match_unit")? {
        Some(0) => return Err(k.err("prefix_match_unit", "must be a positive integer")),
        unit => unit,
    };
    let (mut mamba, mut indexer) = ("auto".to_string(), "auto".to_string());
    let state = match k.obj("state_cache")? {
        None => None,
        Some(mut s) => {
            let bytes = s.integer("bytes_per_request")?;
            if bytes == Some(0) {
                return Err(s.err("bytes_per_request", "must be a positive integer"));
            }
            // Sizing inputs of the inferred state (vLLM's mamba and indexer cache dtypes).
            if let Some(d) = s.one_of("mamba_cache_dtype", &["auto", "float16", "float32"])? {
                mamba = d.to_string();
            }
            if let Some(d) = s.one_of("indexer_cache_dtype", &["auto", "fp8", "mxfp4"])? {
                indexer = d.to_string();
            }
            s.finish()?;
            Some(bytes)
        }
    };
    Ok((state.is_some() || prefix_match_unit.is_some()).then_some(StateCacheKeys {
        state,
        prefix_match_unit,
        mamba,
        indexer,
    }))
}

/// The reference's checks of a recurrent-state cache (`kv_cache` geometry first, then the
/// engine's backend), in its order and words; returns the state bytes of a request (None: sized
/// from the model when lowered, where the geometry checks of a sized state run).
fn check_state_cache(
    k: &Reader,
    keys: StateCacheKeys,
    backend: &str,
    block_size: Option<u32>,
    bytes_per_token: Option<u64>,
    capacity: &Capacity,
    offload: Option<&Offload>,
) -> Result<Option<u64>, DeployError> {
    let Some(bytes_per_request) = keys.state else {
        return Err(k.err("prefix_match_unit", "prefix_match_unit currently requires state_cache"));
    };
    if let Some(unit) = keys.prefix_match_unit {
        if bytes_per_request.is_some() && block_size.is_none_or(|b| u64::from(b) % unit != 0) {
            return Err(k.err("prefix_match_unit", "prefix_match_unit must be a positive divisor of block_size"));
        }
    }
    if matches!(capacity, Capacity::Default { .. }) {
        return Err(k.err("state_cache", "state_cache requires fixed capacity (blocks or bytes)"));
    }
    if let Some(o) = offload {
        let tier = if o.g3.is_some() { "g3_offload" } else { "host_offload" };
        return Err(k.err("state_cache", format!("state_cache supports G1 only; {tier} is not supported")));
    }
    let Some(bytes_per_request) = bytes_per_request else {
        return check_state_backend(k, backend).map(|()| None);
    };
    let (Some(block_size), Some(bytes_per_token)) = (block_size, bytes_per_token) else {
        let name = if block_size.is_none() { "block_size" } else { "bytes_per_token" };
        return Err(k.err("state_cache", format!("manual KV capacity requires explicit positive {name} within u64")));
    };
    let block_bytes = u64::from(block_size) * bytes_per_token;
    let blocks = match *capacity {
        Capacity::Blocks(b) => b,
        Capacity::Bytes(b) => b / block_bytes,
        Capacity::Default { .. } => unreachable!("refused above"),
    };
    if blocks == 0 {
        return Err(k.err("capacity", "fixed KV capacity must fit at least one block within u64"));
    }
    if block_size < 2 {
        return Err(k.err("state_cache", "state_cache requires block_size at least two for vLLM"));
    }
    if blocks < bytes_per_request.div_ceil(block_bytes) + 1 {
        return Err(k.err("state_cache", "state_cache capacity must fit one token block and one request state"));
    }
    check_state_backend(k, backend)?;
    Ok(Some(bytes_per_request))
}

fn check_state_backend(k: &Reader, backend: &str) -> Result<(), DeployError> {
    if backend != "vllm" {
        return Err(
            k.err("state_cache", "state_cache requires backend=vllm and mode=aggregated or disaggregated (G1 only)")
        );
    }
    Ok(())
}
