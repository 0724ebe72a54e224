//! From raw fields to a [`WorkerArgs`]: defaults, the checks across keys, and timing models
//! resolved (profiles read, external models built).

use super::read::QUEUE_POLICIES;
use super::{
    Backend, ConfigEnv, Deployment, EngineConfig, KvTransfer, KvTransferTimingMode, PreemptionMode, RawConfig, Role,
    StateCacheConfig, WorkerArgs, WORKER_TYPES,
};
use crate::profile::Profile;
use crate::speculative::{SpecSchedule, SpeculativeConfig};
use crate::timing::{ExternalTimer, KvMemory, TimingModel, Unresolved};
use servesim_config::{ConfigError, Field, Result};

impl RawConfig {
    /// Dynamo's launch rules for AIS timing: the timing config's `tp`, `attention_dp` and
    /// `nextn` are the launch's tensor parallelism, data-parallel ranks and MTP depth unless
    /// given, and must agree with them when given; only `pp` 1 launches; the timing config
    /// describes the same role as the engine.
    /// Returns the timing config's MTP depth, which the engine's must match (checked later, as
    /// Dynamo checks it after the speculative settings themselves).
    fn take_ais_identity(
        &mut self,
        key: &str,
        config: &serde_json::Value,
        schedule: SpecSchedule,
    ) -> Result<Option<u32>> {
        let at = |k: &str| format!("{key}.{k}");
        let count = |k: &str| -> Result<u32> {
            match config.get(k) {
                None | Some(serde_json::Value::Null) => Ok(if k == "nextn" { 0 } else { 1 }),
                Some(v) => v
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| ConfigError::new(at(k), format!("expected a non-negative integer, got {v}"))),
            }
        };
        // aisimulate's runner passes the pipeline depth as `aic_pp_size` beside the timing config
        // (it then times the pipeline's hand-offs); a timing config's own pp must match it.
        let pp = count("pp")?;
        match self.pipeline_size.set() {
            Some(given) if given != pp => {
                return Err(ConfigError::new(
                    "aic_pp_size",
                    format!("aic_pp_size ({given}) conflicts with the AIS timing config's pp ({pp})"),
                ))
            }
            None if pp != 1 => {
                return Err(ConfigError::new(at("pp"), format!("engine launch supports only pp=1; got pp={pp}")))
            }
            _ => {}
        }
        let agree = |field: &mut Field<u32>, name: &str, k: &str, v: u32| -> Result<()> {
            match field.set() {
                Some(given) if given != v => Err(ConfigError::new(
                    name,
                    format!("{name} ({given}) conflicts with the AIS timing config's {k} ({v})"),
                )),
                _ => {
                    *field = Field::Set(v);
                    Ok(())
                }
            }
        };
        agree(&mut self.tensor_parallel_size, "tensor_parallel_size", "tp", count("tp")?)?;
        agree(&mut self.dp_size, "dp_size", "attention_dp", count("attention_dp")?)?;
        agree(&mut self.prefill_context_size, "aic_cp_size", "cp_size", count("cp_size")?)?;
        let nextn = count("nextn")?;
        match self.nextn.set() {
            // Dynamo takes a depth the launch left open from the timing config.
            None if nextn > 0 => self.nextn = Field::Set(nextn),
            _ => {}
        }
        let role = WORKER_TYPES[self.role.or(0)];
        let Some(ais_role) = config.get("worker_type").and_then(serde_json::Value::as_str) else {
            return Err(ConfigError::new(
                at("worker_type"),
                "missing (required by Dynamo: aggregated, prefill or decode)",
            ));
        };
        if ais_role != role {
            return Err(ConfigError::new(
                at("worker_type"),
                format!(
                    "AIS worker_type must match engine role: the timing config says {ais_role:?}, the engine {role:?}"
                ),
            ));
        }
        // The timing config (already checked by its provider) may time ngram drafts, but
        // Dynamo's engine launch has no ngram draft scheduler; aisimulate's replay roles take
        // its draft count as the canonical depth (the provider refuses it beside `nextn`).
        match config.get("speculation").filter(|v| !v.is_null()) {
            None => Ok(Some(nextn)),
            Some(_) if schedule == SpecSchedule::Dynamo => {
                Err(ConfigError::new(at("speculation"), "engine launch does not implement ngram draft scheduling"))
            }
            // An EAGLE-3 chain (servesim's extension of the timing config, checked by its
            // provider): its draft count, 3 when unstated as in the reference.
            Some(spec)
                if spec.get("kind").and_then(serde_json::Value::as_str) == Some("eagle3")
                    && spec.get("draft_config").is_some() =>
            {
                Ok(Some(
                    spec.pointer("/params/num_speculative_tokens").and_then(serde_json::Value::as_u64).unwrap_or(3)
                        as u32,
                ))
            }
            // A standalone draft model (servesim's extension too, checked by its provider): its
            // draft count, which it requires.
            Some(spec)
                if spec.get("kind").and_then(serde_json::Value::as_str) == Some("draft_model")
                    && spec.get("draft_model_path").is_some() =>
            {
                match spec.pointer("/params/num_speculative_tokens").and_then(serde_json::Value::as_u64) {
                    Some(n @ 1..=5) => Ok(Some(n as u32)),
                    _ => Err(ConfigError::new(
                        at("speculation"),
                        "draft_model requires params.num_speculative_tokens in 1..=5",
                    )),
                }
            }
            // A DFlash / DSpark block drafter (servesim's extension too, checked by its
            // provider): `params.num_draft_tokens`, else its checkpoint's block (DFlash's counts
            // the anchor).
            Some(spec)
                if matches!(spec.get("kind").and_then(serde_json::Value::as_str), Some("dflash" | "dspark"))
                    && spec.get("draft_config").is_some() =>
            {
                let dflash = spec["kind"] == "dflash";
                let block =
                    |k: &str| spec.get("draft_config").and_then(|c| c.get(k)).and_then(serde_json::Value::as_u64);
                let n = match spec.pointer("/params/num_draft_tokens").and_then(serde_json::Value::as_u64) {
                    Some(n) => Some(n),
                    None if dflash => block("block_size").map(|b| b.saturating_sub(1)),
                    None => block("dspark_block_size").or_else(|| block("block_size")),
                };
                match n {
                    Some(n @ 1..=5) => Ok(Some(n as u32)),
                    _ => Err(ConfigError::new(at("speculation"), "speculative replay requires 1..5 draft tokens")),
                }
            }
            Some(spec) => crate::speculative::ais_speculation_tokens(spec)
                .map(Some)
                .map_err(|why| ConfigError::new(at("speculation"), why)),
        }
    }

    pub(super) fn normalise(mut self, env: ConfigEnv) -> Result<WorkerArgs> {
        if self.emit_kv_token_ids == Field::Set(true) && self.emit_kv_events != Field::Set(true) {
            return Err(ConfigError::new("engine.emit_kv_token_ids", "emit_kv_token_ids requires emit_kv_events"));
        }
        let ais_identity = match &self.timing {
            Some(Unresolved::Timer(t)) if t.provider == "ais" || t.provider == "aic" => {
                Some((t.key.clone(), t.config.clone()))
            }
            _ => None,
        };
        let (timing, timing_fallback) = match self.timing.take() {
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
                    Ok(profile) => (
                        TimingModel::Interpolated { path: r.path, profile: profile.into(), dynamo_form: r.dynamo_form },
                        None,
                    ),
                    Err(why) if r.fallback => (TimingModel::Polynomial, Some(why)),
                    Err(why) => return Err(ConfigError::new(r.key, why)),
                }
            }
        };
        if timing.fuses_mixed_passes() && self.decode_speedup_ratio.or(1.0) != 1.0 {
            return Err(ConfigError::new(
                "decode_speedup_ratio",
                "a timing model that fuses mixed passes (pass_model: fused) times prefill and decode as one \
                 forward, so decode_speedup_ratio cannot scale the decode part alone; use speedup_ratio",
            ));
        }
        // After the model is built, so a bad key in its config is named first.
        let ais_nextn = match ais_identity {
            Some((key, config)) => self.take_ais_identity(&key, &config, env.spec_schedule)?,
            None => None,
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
        // Dynamo's checks, in its order and words.
        let prefill_schedule_interval = self.prefill_schedule_interval.unwrap_or(1);
        let prefill_decode_interval = self.prefill_decode_interval.unwrap_or(0);
        if prefill_schedule_interval == 0 {
            return Err(ConfigError::new(
                "engine.prefill_schedule_interval",
                "prefill_schedule_interval must be positive",
            ));
        }
        if backend != Backend::Vllm && prefill_schedule_interval != 1 {
            return Err(ConfigError::new(
                "engine.prefill_schedule_interval",
                "prefill_schedule_interval is supported only for backend=vllm; use prefill_decode_interval for \
                 backend=sglang",
            ));
        }
        if backend != Backend::Sglang && prefill_decode_interval != 0 {
            return Err(ConfigError::new(
                "engine.prefill_decode_interval",
                "prefill_decode_interval is supported only for backend=sglang",
            ));
        }
        let async_scheduling = self.async_scheduling.or(false);
        if async_scheduling && backend != Backend::Vllm {
            return Err(ConfigError::new(
                "async_scheduling",
                "async_scheduling is modelled only for backend=vllm (SGLang's overlap scheduler is not modelled)",
            ));
        }
        if async_scheduling && self.host_offload.is_some() {
            return Err(ConfigError::new(
                "async_scheduling",
                "async_scheduling is not modelled with native_host_offload yet",
            ));
        }
        positive(self.tensor_parallel_size, "tensor_parallel_size")?;
        positive(self.pipeline_size, "aic_pp_size")?;
        positive(self.prefill_context_size, "aic_cp_size")?;
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
        // Dynamo's checks, in its order and words: rates need a depth, the depth is 1..=5, then
        // the rates themselves, then the decode speedup (bursts already model it).
        let speculative = match (self.nextn.set(), self.accept_rates) {
            (None, Some((path, _))) => return Err(ConfigError::new(path, "aic_nextn_accept_rates requires aic_nextn")),
            (None, None) => None,
            (Some(n), rates) => {
                let (path, text) = match &rates {
                    Some((path, text)) => (path.as_str(), Some(text.as_str())),
                    None => ("aic_nextn", None),
                };
                let rates = crate::speculative::conditional_accept_rates(n, text)
                    .map_err(|why| ConfigError::new(if (1..=5).contains(&n) { path } else { "aic_nextn" }, why))?;
                if self.decode_speedup_ratio.or(1.0) != 1.0 {
                    return Err(ConfigError::new(
                        "decode_speedup_ratio",
                        "aic_nextn requires decode_speedup_ratio=1.0 because MTP output acceleration is modeled by \
                         burst sampling",
                    ));
                }
                Some(SpeculativeConfig {
                    nextn: n,
                    accept_rates: rates,
                    seed: self.mtp_seed.or(42),
                    schedule: env.spec_schedule,
                })
            }
        };
        if ais_nextn.is_some_and(|n| n != speculative.as_ref().map_or(0, |s| s.nextn)) {
            return Err(ConfigError::new("engine.aic_nextn", "canonical nextn conflicts with scheduler aic_nextn"));
        }
        let max_num_seqs = self.max_num_seqs.nullable_or(Some(256));
        let max_num_batched_tokens = self.max_num_batched_tokens.nullable_or(Some(8192));
        let num_gpu_blocks_is_explicit = self.num_gpu_blocks_is_explicit.or(self.num_gpu_blocks.is_set());
        let num_gpu_blocks = match &timing {
            // Like Dynamo: a timing model that knows the GPU sizes the cache from its memory
            // unless the user gave the capacity.
            TimingModel::External(e) if !num_gpu_blocks_is_explicit => {
                let memory = KvMemory { block_size, max_num_batched_tokens, limits: self.memory };
                match e.timer().kv_cache_blocks(&memory) {
                    None => self.num_gpu_blocks.or(16384),
                    Some(Ok(blocks)) => match u32::try_from(blocks) {
                        Ok(b) if b > 0 => b,
                        _ => {
                            return Err(ConfigError::new(
                                "engine.num_gpu_blocks",
                                format!(
                                    "the KV cache sized from GPU memory holds {blocks} blocks of {block_size} tokens; \
                                     it must hold at least one (and fewer than 2^32)"
                                ),
                            ))
                        }
                    },
                    Some(Err(why)) => {
                        return Err(ConfigError::new(
                            "engine.num_gpu_blocks",
                            format!("not given, and the KV cache cannot be sized from GPU memory: {why}"),
                        ))
                    }
                }
            }
            _ => self.num_gpu_blocks.or(16384),
        };
        let mut deployment = Deployment {
            dp_size,
            tensor_parallel_size: self.tensor_parallel_size.or(1),
            prefill_context_parallel_size: self.prefill_context_size.or(1),
            startup_time_s: self.startup_time.set(),
            kv_transfer: KvTransfer {
                bytes_per_token: self.kv_bytes_per_token.set(),
                bandwidth_gbps: kv_transfer_bandwidth,
                mode: if self.kv_transfer_timing_mode.or(0) == 0 {
                    KvTransferTimingMode::FullPrompt
                } else {
                    KvTransferTimingMode::DestinationMissing
                },
                state_bytes: 0,
                whole_ns: true,
            },
            router_queue_policy: self.router_queue_policy.set().map(|i| QUEUE_POLICIES[i]),
            memory: self.memory,
            num_gpu_blocks_is_explicit,
        };
        let host_offload = check_host_offload(
            self.host_offload.as_ref(),
            self.kv_cache_bytes_per_token,
            backend,
            block_size,
            (self.enable_prefix_caching, self.nextn.is_set()),
            (self.g3_offload.as_ref(), role == Role::Aggregated),
        )?;
        let g3_offload = check_g3_offload(
            self.g3_offload.as_ref(),
            host_offload.is_some(),
            block_size as u64 * self.kv_cache_bytes_per_token.or(0),
            dp_size,
        )?;
        let state_cache = check_state_cache(
            self.state_bytes_per_request,
            self.prefix_match_unit,
            (backend, block_size, num_gpu_blocks),
            self.kv_cache_bytes_per_token,
            host_offload.is_some(),
        )?;
        if state_cache.is_some() {
            // The reference's checks around the G1-only state cache. (KV event export beside it
            // is refused where it is set up: `servesim serve`'s ZMQ publishers; the canonical
            // config, which has emit_kv_events, refuses state_cache altogether.)
            let refuse = |key: &str, why: &str| Err(ConfigError::new(key, why));
            if role == Role::Aggregated {
                // An aggregated worker hands nothing off, so transfer settings are a mistake.
                let transfer = &deployment.kv_transfer;
                if transfer.bytes_per_token.is_some() || transfer.bandwidth_gbps.is_some() {
                    return refuse(
                        "state_cache",
                        "state_cache does not support kv_transfer_bytes_per_token or kv_transfer_bandwidth",
                    );
                }
                if self.kv_transfer_timing_mode.or(0) != 0 {
                    return refuse("state_cache", "state_cache does not support non-default kv_transfer_timing_mode");
                }
            } else {
                // A prefill worker hands the request's state to the decode worker beside its KV.
                deployment.kv_transfer.state_bytes = self.state_bytes_per_request.or(0);
            }
            if self.prefix_match_unit.is_set() && speculative.is_some() {
                return refuse("prefix_match_unit", "prefix_match_unit does not support speculative decoding");
            }
        }
        let engine = EngineConfig {
            backend,
            num_gpu_blocks,
            block_size,
            max_model_len: self.max_model_len.set(),
            max_num_seqs,
            max_num_batched_tokens,
            enable_prefix_caching: self.enable_prefix_caching.or(true),
            enable_chunked_prefill: self.enable_chunked_prefill.or(true),
            speedup_ratio: ratio(self.speedup_ratio, "speedup_ratio")?,
            decode_speedup_ratio: ratio(self.decode_speedup_ratio, "decode_speedup_ratio")?,
            async_scheduling,
            preemption_mode: if self.preemption_mode.or(0) == 0 { PreemptionMode::Lifo } else { PreemptionMode::Fifo },
            role,
            timing,
            sglang: self.sglang,
            speculative,
            reasoning: self.reasoning,
            prefill_schedule_interval,
            prefill_decode_interval,
            timing_fallback,
            kv_cache_bytes_per_token: self.kv_cache_bytes_per_token.set(),
            host_offload,
            g3_offload,
            state_cache,
        };
        Ok(WorkerArgs { engine, deployment })
    }
}

/// The recurrent-state cache of the flat engine args (`state_cache.bytes_per_request`,
/// `prefix_match_unit`), checked as the reference checks its manual G1 geometry: the state takes
/// whole blocks of `block_size` x `kv_cache_bytes_per_token` bytes, and the pool must hold one
/// token block beside one request state.
fn check_state_cache(
    bytes_per_request: Field<u64>,
    prefix_match_unit: Field<u32>,
    (backend, block_size, num_gpu_blocks): (Backend, u32, u32),
    kv_cache_bytes_per_token: Field<u64>,
    host_offload: bool,
) -> Result<Option<StateCacheConfig>> {
    let unit = prefix_match_unit.set();
    let Some(bytes) = bytes_per_request.set() else {
        if unit.is_some() {
            return Err(ConfigError::new("prefix_match_unit", "prefix_match_unit currently requires state_cache"));
        }
        return Ok(None);
    };
    if bytes == 0 {
        return Err(ConfigError::new("state_cache.bytes_per_request", "must be a positive integer"));
    }
    if unit.is_some_and(|u| u == 0 || block_size % u != 0) {
        return Err(ConfigError::new(
            "prefix_match_unit",
            "prefix_match_unit must be a positive divisor of block_size",
        ));
    }
    if backend != Backend::Vllm {
        return Err(ConfigError::new("state_cache", "state_cache requires backend=vllm"));
    }
    if host_offload {
        return Err(ConfigError::new(
            "state_cache",
            "state_cache supports G1 only; native_host_offload is not supported",
        ));
    }
    let Some(per_token) = kv_cache_bytes_per_token.set() else {
        return Err(ConfigError::new("state_cache", "state_cache requires kv_cache_bytes_per_token"));
    };
    if block_size < 2 {
        return Err(ConfigError::new("state_cache", "state_cache requires block_size at least two for vLLM"));
    }
    let blocks = bytes.div_ceil(u64::from(block_size) * per_token);
    if blocks + 1 > u64::from(num_gpu_blocks) {
        return Err(ConfigError::new(
            "state_cache",
            "state_cache capacity must fit one token block and one request state",
        ));
    }
    Ok(Some(StateCacheConfig { blocks_per_state: blocks as u32, prefix_match_unit: unit }))
}

/// The checks of `g3_offload` that Dynamo 1.6.1 makes when it builds the replay (after the
/// engine section's own, [`check_host_offload`]), with its messages; then what servesim does
/// not model yet (the shared scope).
fn check_g3_offload(
    raw: Option<&super::RawG3Offload>,
    has_host: bool,
    block_bytes: u64,
    dp_size: u32,
) -> Result<Option<super::G3Offload>> {
    let Some(g3) = raw else { return Ok(None) };
    debug_assert!(has_host, "checked: g3_offload requires native_host_offload");
    if dp_size != 1 {
        return Err(ConfigError::new("dp_size", "g3_offload supports only dp_size=1"));
    }
    let Some(bytes) = g3.num_g3_blocks.checked_mul(block_bytes).filter(|&b| usize::try_from(b).is_ok()) else {
        return Err(ConfigError::new("engine.g3_offload.num_g3_blocks", "G3 capacity bytes overflow"));
    };
    // A rate so small that moving the whole pool at it takes longer than an f64 of milliseconds
    // holds (a subnormal rate): the pool's caps count only for the shared scope.
    let mut rates =
        vec![("read_bandwidth_gbps", g3.read_bandwidth_gbps), ("write_bandwidth_gbps", g3.write_bandwidth_gbps)];
    if g3.cluster_shared {
        rates.push(("shared_read_bandwidth_gbps", g3.shared_read_bandwidth_gbps));
        rates.push(("shared_write_bandwidth_gbps", g3.shared_write_bandwidth_gbps));
    }
    for (key, gbps) in rates {
        if gbps != 0.0 && !(bytes as f64 / (gbps * 1e6)).is_finite() {
            return Err(ConfigError::new(format!("engine.g3_offload.{key}"), "G3 transfer duration overflow"));
        }
    }
    Ok(Some(super::G3Offload {
        cluster_shared: g3.cluster_shared,
        num_g3_blocks: g3.num_g3_blocks,
        latency_to_first_byte_ms: g3.latency_to_first_byte_ms,
        read_bandwidth_gbps: g3.read_bandwidth_gbps,
        write_bandwidth_gbps: g3.write_bandwidth_gbps,
        shared_read_bandwidth_gbps: g3.shared_read_bandwidth_gbps,
        shared_write_bandwidth_gbps: g3.shared_write_bandwidth_gbps,
    }))
}

/// Dynamo 1.6.1's checks of `kv_cache_bytes_per_token` and `native_host_offload`, with its
/// messages and in its order.
fn check_host_offload(
    raw: Option<&super::RawHostOffload>,
    kv_cache_bytes_per_token: Field<u64>,
    backend: Backend,
    block_size: u32,
    (prefix_caching, nextn): (Field<bool>, bool),
    (g3, aggregated): (Option<&super::RawG3Offload>, bool),
) -> Result<Option<super::HostOffload>> {
    const KEY: &str = "engine.native_host_offload";
    if kv_cache_bytes_per_token == Field::Set(0) {
        return Err(ConfigError::new("engine.kv_cache_bytes_per_token", "kv_cache_bytes_per_token must be positive"));
    }
    // Dynamo checks the G3 section before the host section it requires.
    if let Some(g3) = g3 {
        let fail = |message: &str| Err(ConfigError::new("engine.g3_offload", message));
        if g3.num_g3_blocks == 0 {
            return fail("g3_offload.num_g3_blocks must be positive");
        }
        let timing = [
            g3.latency_to_first_byte_ms,
            g3.read_bandwidth_gbps,
            g3.write_bandwidth_gbps,
            g3.shared_read_bandwidth_gbps,
            g3.shared_write_bandwidth_gbps,
        ];
        if timing.iter().any(|v| !(v.is_finite() && *v >= 0.0)) {
            return fail("g3_offload timing must be finite and non-negative");
        }
        if raw.is_none() {
            return fail("g3_offload requires native_host_offload");
        }
        if !aggregated {
            return fail("g3_offload is supported only for worker_type=aggregated");
        }
    }
    let Some(h) = raw else { return Ok(None) };
    let fail = |message: String| Err(ConfigError::new(KEY, message));
    if h.num_host_blocks == 0 {
        return fail("native_host_offload.num_host_blocks must be positive".into());
    }
    let rates = [
        ("d2h_bandwidth_gbps", h.d2h_bandwidth_gbps),
        ("h2d_bandwidth_gbps", h.h2d_bandwidth_gbps),
        ("shared_d2h_bandwidth_gbps", h.shared_d2h_bandwidth_gbps),
        ("shared_h2d_bandwidth_gbps", h.shared_h2d_bandwidth_gbps),
    ];
    for (name, value) in rates.into_iter().chain([("latency_to_first_byte_ms", h.latency_to_first_byte_ms)]) {
        if !(value.is_finite() && value >= 0.0) {
            return fail(format!("native_host_offload.{name} must be finite and non-negative"));
        }
    }
    if h.cluster_shared && h.kv_layout_id.as_deref().is_none_or(|id| id.trim().is_empty()) {
        return fail("cluster_shared native_host_offload requires a nonempty kv_layout_id".into());
    }
    if backend != Backend::Vllm {
        return fail("native_host_offload is supported only for backend=vllm".into());
    }
    if prefix_caching == Field::Set(false) {
        return fail("native_host_offload requires enable_prefix_caching=true".into());
    }
    if nextn {
        return fail("native_host_offload does not support aic_nextn in the initial implementation".into());
    }
    let Some(bytes_per_token) = kv_cache_bytes_per_token.set() else {
        return fail(
            "native_host_offload requires kv_cache_bytes_per_token to derive the physical host block size".into(),
        );
    };
    let Some(block_bytes) = (block_size as u64).checked_mul(bytes_per_token).filter(|&b| b > 0) else {
        return fail(
            "native_host_offload requires block_size * kv_cache_bytes_per_token to produce a positive, \
             representable block size"
                .into(),
        );
    };
    let Some(capacity_bytes) = h.num_host_blocks.checked_mul(block_bytes) else {
        return fail("native_host_offload capacity in bytes overflowed".into());
    };
    for (name, gbps) in rates {
        let bytes_per_ms = gbps * 1e6;
        if !(bytes_per_ms.is_finite() && (gbps == 0.0 || (capacity_bytes as f64 / bytes_per_ms).is_finite())) {
            return fail(format!("native_host_offload.{name} produces an unrepresentable transfer duration"));
        }
    }
    Ok(Some(super::HostOffload {
        cluster_shared: h.cluster_shared,
        num_host_blocks: h.num_host_blocks,
        d2h_bandwidth_gbps: h.d2h_bandwidth_gbps,
        h2d_bandwidth_gbps: h.h2d_bandwidth_gbps,
        shared_d2h_bandwidth_gbps: h.shared_d2h_bandwidth_gbps,
        shared_h2d_bandwidth_gbps: h.shared_h2d_bandwidth_gbps,
        latency_to_first_byte_ms: h.latency_to_first_byte_ms,
        kv_layout_id: h.kv_layout_id.clone(),
    }))
}
