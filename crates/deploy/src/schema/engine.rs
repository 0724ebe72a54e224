//! `engine`: model, hardware, backend, mode, the worker roles and the KV transfer between them.

use serde_json::Value;

use super::controls::{check_transfer_policy, read_engine_controls, Controls};
use super::estimator::check_estimator_config;
use super::speculation::{check_speculation_engine, read_speculation};
use super::worker::{read_worker, Timing, Worker};
use crate::error::DeployError;
use crate::reader::ErrAt;
use servesim_config::Reader;
use servesim_replay::Tokenization;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Aggregated,
    Disaggregated,
    /// Attention/FFN disaggregation (`engine.afd`), run by `crate::afd`.
    Afd,
}

#[derive(Clone, Debug, PartialEq)]
pub struct KvTransfer {
    pub bytes_per_token: Option<u64>,
    pub bandwidth_gb_per_second: Option<f64>,
    pub timing_mode: &'static str,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Engine {
    pub mode: Mode,
    pub model: String,
    pub hardware: String,
    pub backend: &'static str,
    pub backend_version: Option<String>,
    pub context_length: Option<u32>,
    pub aggregated: Option<Worker>,
    pub prefill: Option<Worker>,
    pub decode: Option<Worker>,
    pub kv_transfer: Option<KvTransfer>,
    pub enable_chunked_prefill: Option<bool>,
    pub systems_paths: Option<Vec<String>>,
    /// Speculative decoding (`nextn` / `nextn_accepted`, or `speculation` of kind `mtp` or
    /// `ngram`).
    pub speculation: Option<Speculation>,
    /// Active model controls (quantisation modes, attention backend, MoE kernels).
    pub controls: Controls,
    /// The frontend's tokenization stage (None when it costs nothing, as the reference drops it).
    pub tokenization: Option<Tokenization>,
    /// The attention/FFN topology of `mode: afd`.
    pub afd: Option<super::afd::Afd>,
    /// `workers.encoder`: the analytical encoder pool (`crate::epd`).
    pub encoder: Option<super::encoder::Encoder>,
}

/// Speculative decoding as the unified config states it: `nextn` draft tokens per decode step,
/// how they are drafted and how many are accepted, and the acceptance stream's seed.
#[derive(Clone, Debug, PartialEq)]
pub struct Speculation {
    pub nextn: u32,
    pub draft: Draft,
    /// The acceptance stream's seed: set (`speculation.seed`, default 42) exactly when the
    /// `speculation` block states the scheme; `engine.nextn` leaves None (the engine's default,
    /// the same 42).
    pub seed: Option<u64>,
}

/// Who drafts, and how acceptance is stated.
#[derive(Clone, Debug, PartialEq)]
pub enum Draft {
    /// Multi-token prediction: `accepted` drafts expected per step. The draft layers' cost is
    /// part of the AIS decode pass (its `nextn`).
    Mtp { accepted: f64 },
    /// Prompt lookup (ngram): drafting is free and the target verifies `nextn + 1` tokens per
    /// request in one block pass (the AIS timing's `speculation`); acceptance as conditional
    /// rates per draft position.
    Ngram { rates: Vec<f64> },
    /// An EAGLE-3 chain: a one-layer draft network (its checkpoint's `config.json`,
    /// `draft_config`) runs beside the target, which verifies `nextn + 1` tokens per request
    /// in one block pass; acceptance as conditional rates per draft position.
    Eagle3 { rates: Vec<f64>, draft_config: Value },
    /// A standalone draft model (`draft_model_path`, looked up as the target model is) at its
    /// own tensor-parallel width (`draft_tp_size`, else the target's); the target verifies
    /// `nextn + 1` tokens per request in one block pass; acceptance as conditional rates.
    DraftModel { rates: Vec<f64>, path: String, tp: Option<u32> },
    /// A block drafter (`kind` dflash or dspark) with its scheme `params` and its checkpoint's
    /// `config.json` (`draft_config`): the draft network proposes `nextn` tokens per round
    /// beside the target's block verify pass; acceptance as conditional rates.
    Block { rates: Vec<f64>, kind: String, params: Value, draft_config: Value },
}

impl Speculation {
    /// Whether the `speculation` block stated the scheme (not `engine.nextn`).
    pub fn stated_by_block(&self) -> bool {
        self.seed.is_some()
    }

    /// The conditional acceptance rates of the draft positions. An expected count lowers as
    /// the reference lowers `nextn_accepted`: the whole drafts always accepted, the next one
    /// with the fractional part, the rest never.
    pub fn accept_rates(&self) -> Vec<f64> {
        let accepted = match &self.draft {
            Draft::Ngram { rates }
            | Draft::Eagle3 { rates, .. }
            | Draft::DraftModel { rates, .. }
            | Draft::Block { rates, .. } => return rates.clone(),
            Draft::Mtp { accepted } => *accepted,
        };
        let whole = accepted.trunc() as usize;
        let n = self.nextn as usize;
        let mut rates = vec![1.0; whole.min(n)];
        if rates.len() < n {
            rates.push(accepted - whole as f64);
        }
        rates.resize(n, 0.0);
        rates
    }

    /// The AIS timing config's `nextn`: the MTP depth (0 for ngram, which is timed by
    /// [`Self::ais_speculation`] instead).
    pub fn ais_nextn(&self) -> u32 {
        match self.draft {
            Draft::Mtp { .. } => self.nextn,
            Draft::Ngram { .. } | Draft::Eagle3 { .. } | Draft::DraftModel { .. } | Draft::Block { .. } => 0,
        }
    }

    /// The AIS timing config's `speculation` (its verify pass, and an EAGLE-3 draft's network
    /// or a standalone draft model).
    pub fn ais_speculation(&self) -> Option<Value> {
        match &self.draft {
            Draft::Mtp { .. } => None,
            Draft::Ngram { .. } => {
                Some(serde_json::json!({"kind": "ngram", "params": {"num_speculative_tokens": self.nextn}}))
            }
            Draft::Eagle3 { draft_config, .. } => Some(serde_json::json!({
                "kind": "eagle3",
                "params": {"num_speculative_tokens": self.nextn},
                "draft_config": draft_config,
            })),
            Draft::DraftModel { path, tp, .. } => {
                let mut params = serde_json::json!({"num_speculative_tokens": self.nextn});
                if let Some(tp) = tp {
                    params["draft_tp_size"] = (*tp).into();
                }
                Some(serde_json::json!({"kind": "draft_model", "draft_model_path": path, "params": params}))
            }
            Draft::Block { kind, params, draft_config, .. } => {
                // The drafts per round as read (a checkpoint's block size may have defaulted it).
                let mut params = params.clone();
                params["num_draft_tokens"] = self.nextn.into();
                Some(serde_json::json!({"kind": kind, "params": params, "draft_config": draft_config}))
            }
        }
    }
}

/// `database_mode` (engine or worker timing), read case-insensitively as the reference does:
/// `Some("SILICON" | "SOL" | "EMPIRICAL" | "HYBRID")`, `None` when absent (SILICON, the measured
/// kernel tables). SOL prices every op at its roofline; EMPIRICAL at its roofline over a
/// utilisation read off the op's measured points; HYBRID reads the tables and estimates only
/// where they miss. servesim-perf refuses, by name, the op families it has no estimate for.
pub(super) fn database_mode(r: &mut Reader) -> Result<Option<&'static str>, DeployError> {
    let Some(m) = r.text("database_mode")? else { return Ok(None) };
    match m.to_ascii_uppercase().as_str() {
        "SILICON" => Ok(Some("SILICON")),
        "SOL" => Ok(Some("SOL")),
        "EMPIRICAL" => Ok(Some("EMPIRICAL")),
        "HYBRID" => Ok(Some("HYBRID")),
        _ => Err(r.err(
            "database_mode",
            format!("unknown value {m:?}; expected one of SILICON, HYBRID, EMPIRICAL, SOL (any case)"),
        )),
    }
}

/// `tokenization`: `workers` tokenizers (default 1), each taking `base_ms` plus
/// `per_input_token_us` per prompt token.
fn read_tokenization(e: &mut Reader) -> Result<Option<Tokenization>, DeployError> {
    let Some(mut t) = e.obj("tokenization")? else { return Ok(None) };
    let workers = t.positive("workers")?.unwrap_or(1);
    let base_ms = t.nonneg("base_ms", false)?.unwrap_or(0.0);
    let per_input_token_us = t.nonneg("per_input_token_us", false)?.unwrap_or(0.0);
    t.finish()?;
    if base_ms == 0.0 && per_input_token_us == 0.0 {
        return Ok(None);
    }
    Ok(Some(Tokenization { workers, base_ms, per_input_token_ms: per_input_token_us / 1000.0 }))
}

/// `nextn` / `nextn_accepted`, with the reference's rules.
fn read_mtp(e: &mut Reader) -> Result<Option<Speculation>, DeployError> {
    let nextn = e.u32_min("nextn", 0)?.unwrap_or(0);
    if nextn > 5 {
        return Err(e.err("nextn", "must be at most 5"));
    }
    let accepted = e.nonneg("nextn_accepted", false)?;
    match (nextn, accepted) {
        (0, None) => Ok(None),
        (0, Some(_)) => Err(e.err("nextn_accepted", "nextn_accepted requires nextn > 0 and must be within [0, nextn]")),
        (_, None) => Err(e.err("nextn", "nextn requires explicit nextn_accepted")),
        (n, Some(a)) if a > f64::from(n) => {
            Err(e.err("nextn_accepted", "nextn_accepted requires nextn > 0 and must be within [0, nextn]"))
        }
        (nextn, Some(accepted)) => Ok(Some(Speculation { nextn, draft: Draft::Mtp { accepted }, seed: None })),
    }
}

pub(super) fn read_engine(mut e: Reader) -> Result<Engine, DeployError> {
    let mode = match e.one_of("mode", &["aggregated", "disaggregated", "afd"])?.unwrap_or("aggregated") {
        "aggregated" => Mode::Aggregated,
        "disaggregated" => Mode::Disaggregated,
        _ => Mode::Afd,
    };
    let model = e.nonempty("model")?.ok_or_else(|| e.err("model", "missing (required)"))?;
    let hardware = e.nonempty("hardware")?.ok_or_else(|| e.err("hardware", "missing (required)"))?;
    if hardware == "auto" {
        return Err(e.err("hardware", "engine.hardware='auto' is recommendation-only"));
    }
    let backend = e.one_of("backend", &["vllm", "sglang", "trtllm"])?.unwrap_or("vllm");
    let backend_version = e.nonempty("backend_version")?;
    let context_length = match e.value("context_length") {
        None => None,
        Some(Value::String(s)) if s == "max" => None,
        Some(_) => Some(e.positive("context_length")?.expect("present")),
    };
    let mtp = read_mtp(&mut e)?;
    let speculation = read_speculation(&mut e)?;
    let enable_chunked_prefill = e.flag("enable_chunked_prefill")?;
    let mut controls = read_engine_controls(&mut e)?;
    let systems_paths = read_systems_paths(&mut e)?;
    // Every mode but SILICON is an estimator policy; SILICON is the default whether written or not.
    let sol = database_mode(&mut e)?.filter(|m| *m != "SILICON");
    super::fpm::read_engine_mode(&mut e, &mut controls)?;
    let tokenization_given = e.given("tokenization");
    let tokenization = read_tokenization(&mut e)?;
    // Checked by servesim-perf on the data the AIS timing reads (the timing is the same).
    let strict_provenance = e.flag("strict_provenance")?.unwrap_or(false);
    let afd_block = e.obj("afd")?;
    if mode != Mode::Afd && afd_block.is_some() {
        return Err(e.err("afd", "engine.afd requires engine.mode='afd'"));
    }
    if let Some(v) = e.value("fpm_profile").filter(|v| !v.is_null()) {
        let cx = super::fpm::ProfileContext {
            model: &model,
            backend,
            backend_version: backend_version.as_deref(),
            context_length,
            afd: mode == Mode::Afd,
        };
        let profile = super::fpm::read_profile(&e.path("fpm_profile"), v, &cx)?;
        controls.insert("fpm_profile".into(), profile);
    }
    for k in ["decoder_replay"] {
        if let Some(v) = e.value(k) {
            if v != &Value::Bool(false) {
                return Err(e.err(k, "this key is not supported by servesim yet"));
            }
        }
    }
    // Estimator policies: where a table's rows come from (`enable_shared_layer`: the requested
    // version alone when false; SILICON's default, true, also borrows declared donors, earlier
    // versions and shared kernels) and which borrowings the non-SILICON modes may make
    // (`transfer_policy`, inert under SILICON). Like every estimator policy in the reference
    // they need default timing in every role.
    let mut policy_key = sol.map(|_| "database_mode");
    let shared_layer = e.flag("enable_shared_layer")?;
    if shared_layer.is_some() {
        policy_key = Some("enable_shared_layer");
    }
    if let Some(v) = e.value("transfer_policy").filter(|v| !v.is_null()) {
        check_transfer_policy(&e.path("transfer_policy"), v)?;
        policy_key = Some("transfer_policy");
    }
    if let Some(v) = e.value("estimator_config") {
        check_estimator_config(&e.path("estimator_config"), v)?;
    }
    let kv_transfer = match e.obj("kv_transfer")? {
        Some(mut t) => {
            let bytes_per_token = match t.value("bytes_per_token") {
                None => None,
                Some(Value::String(s)) if s == "auto" => None,
                Some(_) => Some(
                    t.integer("bytes_per_token")?
                        .filter(|&n| n > 0)
                        .ok_or_else(|| t.err("bytes_per_token", "must be \"auto\" or a positive integer"))?,
                ),
            };
            let bandwidth = t.nonneg("bandwidth_gb_per_second", true)?;
            let mode =
                t.one_of("timing_mode", &["full_prompt", "destination_missing"])?.unwrap_or("destination_missing");
            t.finish()?;
            Some(KvTransfer { bytes_per_token, bandwidth_gb_per_second: bandwidth, timing_mode: mode })
        }
        None => None,
    };
    let workers_path = e.path("workers");
    let (mut aggregated, mut prefill, mut decode, mut encoder) = (None, None, None, None);
    if let Some(mut w) = e.obj("workers")? {
        if let Some(o) = w.obj("encoder")? {
            if mode == Mode::Afd {
                return Err(w.err("encoder", "AFD does not support encoder pools"));
            }
            encoder = Some(super::encoder::read_encoder(o)?);
        }
        if let Some(o) = w.obj("aggregated")? {
            aggregated = Some(read_worker(o, "aggregated", backend)?);
        }
        if let Some(o) = w.obj("prefill")? {
            prefill = Some(read_worker(o, "prefill", backend)?);
        }
        if let Some(o) = w.obj("decode")? {
            decode = Some(read_worker(o, "decode", backend)?);
        }
        w.finish()?;
    }
    match mode {
        Mode::Afd => {}
        Mode::Aggregated => {
            if prefill.is_some() || decode.is_some() {
                return Err(DeployError::new(&workers_path, "aggregated mode takes workers.aggregated only"));
            }
            if kv_transfer.is_some() {
                return Err(e.err("kv_transfer", "kv_transfer applies to disaggregated mode"));
            }
            if aggregated.is_none() {
                aggregated = Some(read_worker(
                    Reader::mapping(&format!("{workers_path}.aggregated"), &Value::Null)?,
                    "aggregated",
                    backend,
                )?);
            }
        }
        Mode::Disaggregated => {
            if aggregated.is_some() {
                return Err(DeployError::new(
                    &workers_path,
                    "disaggregated mode takes workers.prefill and workers.decode, not aggregated",
                ));
            }
            if prefill.is_none() || decode.is_none() {
                return Err(DeployError::new(
                    &workers_path,
                    "disaggregated mode requires workers.prefill and workers.decode",
                ));
            }
            // Both roles run the same hybrid model: the decode worker resumes from the state
            // the prefill worker hands over.
            let states = [&prefill, &decode].map(|w| w.as_ref().is_some_and(|w| w.state_cache.is_some()));
            if states[0] != states[1] {
                return Err(DeployError::new(
                    &workers_path,
                    "disaggregated state_cache must be set on both prefill and decode workers",
                ));
            }
        }
    }
    let staged =
        [&aggregated, &prefill].into_iter().flatten().any(|w| w.frontend.is_some() || w.host_profile.is_some());
    if tokenization_given && staged && mode != Mode::Afd && encoder.is_none() {
        return Err(e.err(
            "tokenization",
            "engine.tokenization and SGLang frontend stages both price request tokenization; use one",
        ));
    }
    let mut afd = None;
    if mode == Mode::Afd {
        let given: Vec<&str> = [&aggregated, &prefill, &decode].into_iter().flatten().map(|w| w.role).collect();
        let block = afd_block.ok_or_else(|| e.err("afd", "engine.mode='afd' requires engine.afd"))?;
        afd = Some(super::afd::read_afd(block, &given)?);
        check_afd_engine(
            &e,
            &AfdExtras {
                kv_transfer: kv_transfer.is_some(),
                nextn: mtp.is_some() || speculation.is_some(),
                controls: controls.keys().next().cloned(),
                policy: policy_key.or(strict_provenance.then_some("strict_provenance")),
                systems_paths: systems_paths.as_ref().is_some_and(|p| p.as_slice() != ["default"]),
                chunked_prefill: enable_chunked_prefill.is_some(),
                tokenization: tokenization.is_some(),
            },
        )?;
    }
    let workers: Vec<&Worker> = [&aggregated, &prefill, &decode].into_iter().flatten().collect();
    if let Some(spec) = &speculation {
        check_speculation_engine(&e, spec, backend, mtp.is_some(), &workers, &workers_path)?;
    }
    for w in workers {
        check_offload(w, backend, &workers_path)?;
        if !matches!(w.timing, Timing::Default) {
            const MESSAGE: &str = "engine model controls require default timing in every regular language role";
            if mtp.is_some() {
                return Err(e.err("nextn", MESSAGE));
            }
            if let Some(k) = controls.keys().next() {
                return Err(DeployError::new(format!("{}.{k}", e.here()), MESSAGE));
            }
            if let Some(k) = policy_key {
                return Err(
                    e.err(k, "estimator policies require regular language workers with default timing in every role")
                );
            }
        }
    }
    e.finish()?;
    // Carried to every worker's AIS timing config with the model controls, but after their
    // default-timing rule: it asks for a data check, which fixed and polynomial timing skip.
    if strict_provenance {
        controls.insert("strict_provenance".into(), Value::Bool(true));
    }
    // Written out when false, or when true under a mode whose default is false (EMPIRICAL).
    if shared_layer == Some(false) || (shared_layer == Some(true) && sol.is_some()) {
        controls.insert("enable_shared_layer".into(), Value::Bool(shared_layer == Some(true)));
    }
    if let Some(m) = sol {
        controls.insert("database_mode".into(), Value::String(m.into()));
    }
    Ok(Engine {
        mode,
        model,
        hardware,
        backend,
        backend_version,
        context_length,
        aggregated,
        prefill,
        decode,
        kv_transfer,
        enable_chunked_prefill,
        systems_paths,
        speculation: mtp.or(speculation),
        controls,
        tokenization,
        afd,
        encoder,
    })
}

/// What an AFD engine states beside `engine.afd` that the AFD estimate has no place for.
struct AfdExtras {
    kv_transfer: bool,
    nextn: bool,
    controls: Option<String>,
    policy: Option<&'static str>,
    systems_paths: bool,
    chunked_prefill: bool,
    tokenization: bool,
}

/// The reference's refusals of engine keys under `mode: afd` (its AFD estimate reads the
/// default SILICON data with the model's own formats).
fn check_afd_engine(e: &Reader, x: &AfdExtras) -> Result<(), DeployError> {
    if x.kv_transfer {
        return Err(e.err("kv_transfer", "AFD mode rejects kv_transfer; A/F transfers are modeled by engine.afd"));
    }
    if x.chunked_prefill {
        return Err(e.err("enable_chunked_prefill", "enable_chunked_prefill is unsupported for AFD"));
    }
    if x.nextn {
        return Err(e.err("nextn", "engine model controls require default timing in every regular language role"));
    }
    if let Some(k) = &x.controls {
        return Err(DeployError::new(
            format!("{}.{k}", e.here()),
            "engine model controls require default timing in every regular language role",
        ));
    }
    if x.systems_paths {
        return Err(e.err("systems_paths", "engine.systems_paths does not support AFD"));
    }
    if let Some(k) = x.policy {
        return Err(e.err(k, "estimator policies require regular language workers with default timing in every role"));
    }
    if x.tokenization {
        return Err(
            e.err("tokenization", "engine.tokenization requires token replay; AFD and analytical EPD are unsupported")
        );
    }
    Ok(())
}

/// `systems_paths` (of the engine or of a worker's timing): directories of performance data, or
/// `default` for the installed package's.
pub(super) fn read_systems_paths(r: &mut Reader) -> Result<Option<Vec<String>>, DeployError> {
    match r.value("systems_paths") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(a)) => a
            .iter()
            .map(|p| match p.as_str() {
                Some(s) if !s.is_empty() && !s.contains(',') => Ok(s.to_string()),
                _ => Err(r.err("systems_paths", "every entry must be a nonempty path without commas")),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(_) => Err(r.err("systems_paths", "must be a list of paths")),
    }
}

/// The reference's rules for a worker's offload tiers that depend on the engine around it.
fn check_offload(w: &Worker, backend: &str, workers_path: &str) -> Result<(), DeployError> {
    let Some(offload) = &w.offload else { return Ok(()) };
    let at = format!("{workers_path}.{}.kv_cache", w.role);
    if backend != "vllm" {
        return Err(DeployError::new(format!("{at}.host_offload"), "host_offload is supported only for backend=vllm"));
    }
    if !w.prefix_caching {
        return Err(DeployError::new(format!("{at}.host_offload"), "host_offload requires prefix_caching=true"));
    }
    if offload.g3.is_some() && (w.role != "aggregated" || w.parallelism.attention_data != 1) {
        return Err(DeployError::new(
            format!("{at}.g3_offload"),
            "g3_offload is supported only for the aggregated worker with attention_data=1",
        ));
    }
    if offload.kvcr.is_some() {
        let refusal = if w.role == "decode" {
            Some("kvcr supports aggregated and prefill workers only")
        } else if w.parallelism.pipeline > 1 {
            Some("kvcr does not support pipeline parallelism (parallelism.pipeline must be 1)")
        } else if w.parallelism.prefill_context > 1 {
            Some("kvcr does not support prefill context parallelism (parallelism.prefill_context must be 1)")
        } else {
            None
        };
        if let Some(why) = refusal {
            return Err(DeployError::new(format!("{at}.kvcr"), why));
        }
    }
    Ok(())
}
