//! The predict configuration (aisimulate 0.13's unified YAML: `traffic`, `engine`, `evaluation`,
//! `execution`, and the `router:` / `planner:` adapter sections), read strictly: every key by
//! name, unknown keys rejected with their path, values and cross-key rules checked with the
//! reference's messages. Keys the reference accepts for features servesim does not model are
//! recognised and refused as unsupported (naming the key), never silently ignored.

use serde_json::{json, Value};

use crate::reader::Obj;
use crate::DeployError;

#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    Synthetic {
        input_tokens: u32,
        output_tokens: u32,
    },
    Session {
        new_input_tokens: u32,
        output_tokens: u32,
        turns: u32,
        shared_prefix_ratio: f64,
        prefix_groups: u32,
        inter_turn_delay_ms: f64,
    },
    Trace {
        paths: Vec<String>,
        format: &'static str,
        block_size: Option<u32>,
        nested_timestamp_basis: Option<&'static str>,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub enum Load {
    Concurrency(u32),
    /// Rate per second (requests or sessions, per the source), seed.
    Poisson {
        rate: f64,
        seed: u64,
    },
    ConstantRate {
        rate: f64,
    },
    TraceTimestamps {
        speedup: f64,
        agentic_lanes: Option<u32>,
    },
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stop {
    /// Requests (synthetic) or sessions (synthetic-session).
    pub count: Option<u32>,
    pub count_per_load_unit: Option<f64>,
    pub max_virtual_time_seconds: Option<f64>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Traffic {
    pub source: Source,
    pub load: Load,
    pub stop: Stop,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Aggregated,
    Disaggregated,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Parallelism {
    pub replicas: u32,
    pub tensor: u32,
    pub pipeline: u32,
    pub attention_data: u32,
    pub moe_tensor: u32,
    pub moe_expert: u32,
}

impl Parallelism {
    /// GPUs one worker occupies.
    pub fn gpus(&self) -> u32 {
        self.tensor * self.pipeline * self.attention_data
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
    pub block_size: Option<u32>,
    pub prefix_caching: bool,
    pub bytes_per_token: Option<u64>,
    pub capacity: Capacity,
    pub timing: Timing,
    pub startup_seconds: f64,
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
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sla {
    pub ttft_ms: Option<f64>,
    pub itl_ms: Option<f64>,
    pub e2e_ms: Option<f64>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum RouterPolicy {
    RoundRobin,
    KvRouter { overlap_score_credit: f64, prefill_load_scale: f64, temperature: f64, ais_load_model: bool },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub traffic: Traffic,
    pub engine: Engine,
    pub sla: Sla,
    pub router: RouterPolicy,
    /// The planner (`planner: {policy: enabled}`), validated.
    pub planner: Option<servesim_planner::PlannerConfig>,
}

/// The reference's estimator controls as its canonical dumps write them: online correction and
/// FPM-regression settings (which tune the model from observed forward passes), feature weights,
/// and the FPM-interpolation method.
fn estimator_defaults() -> Value {
    let sampling = json!({"bins_per_axis": [4, 4], "max_observations": 64});
    json!({
        "correction": {
            "enabled": true,
            "factor_bounds": {"max": 2.0, "min": 0.5},
            "feature_space": "legacy_workload",
            "max_batch_size": 512,
            "max_kv_tokens": 2_000_000,
            "max_num_tokens": 8192,
            "min_observations": 5,
            "sampling": sampling,
        },
        "features": {"attention_kv_weight": 1.0, "ffn_token_weight": 1.0, "prefill_attention_pair_weight": 1.0},
        "fpm_interpolation": {"method": "sol"},
        "fpm_regression": {
            "fit": {"kind": "standardized_nnls", "rebuild_interval": null, "singular_ridge_scale": 1e-9},
            "min_observations": 5,
            "sampling": sampling,
        },
        "op_level": {},
    })
}

/// Accepts `given` when every value it sets is the reference's default (a mapping may leave
/// keys out); anything else is a setting servesim does not model.
fn only_defaults(path: &str, given: &Value, default: &Value) -> Result<(), DeployError> {
    match (given, default) {
        (Value::Object(g), Value::Object(d)) => {
            for (k, v) in g {
                let at = crate::reader::join(path, k);
                match d.get(k) {
                    Some(dv) => only_defaults(&at, v, dv)?,
                    None => return Err(DeployError::new(at, "unknown key")),
                }
            }
            Ok(())
        }
        (Value::Null, _) => Ok(()),
        (Value::Number(a), Value::Number(b)) if a.as_f64() == b.as_f64() => Ok(()),
        (g, d) if g == d => Ok(()),
        (_, d) => {
            Err(DeployError::new(path, format!("only the reference's default ({d}) is supported by servesim yet")))
        }
    }
}

fn unsupported(o: &mut Obj, key: &'static str, what: &str) -> Result<(), DeployError> {
    if o.raw(key).is_some() {
        return Err(o.err(key, format!("{what} is not supported by servesim yet")));
    }
    Ok(())
}

/// Reads a predict configuration. `recommend` sections are refused here (the caller reads them).
pub fn read_predict(root: &Value) -> Result<Config, DeployError> {
    let mut top = Obj::new("", root)?;
    for k in ["optimization", "optimizer"] {
        if top.has(k) {
            return Err(
                top.err(k, "predict does not accept ['optimization', 'optimizer'] sections (they belong to recommend)")
            );
        }
        top.raw(if k == "optimization" { "optimization" } else { "optimizer" });
    }
    read_sections(top)
}

/// Reads the sections both commands share from `top` (recommend has taken its own already).
pub fn read_sections(mut top: Obj) -> Result<Config, DeployError> {
    let traffic = read_traffic(top.obj("traffic")?)?;
    let engine = match top.obj("engine")? {
        Some(e) => read_engine(e)?,
        None => return Err(top.err("engine", "missing (required: model, hardware and workers)")),
    };
    let sla = match top.obj("evaluation")? {
        Some(mut ev) => {
            let sla = match ev.obj("sla")? {
                Some(s) => read_sla(s)?,
                None => Sla::default(),
            };
            ev.finish()?;
            sla
        }
        None => Sla::default(),
    };
    if let Some(mut ex) = top.obj("execution")? {
        if let Some(mut r) = ex.obj("resources")? {
            // Host limits of the reference's worker processes: nothing to simulate.
            r.nonneg("initialization_timeout_seconds", true)?;
            r.nonneg("shutdown_timeout_seconds", false)?;
            for k in ["memory_limit_gb", "cpu_limit"] {
                if let Some(v) = r.raw(k) {
                    if !(v.as_str() == Some("auto") || v.as_f64().is_some_and(|x| x.is_finite() && x > 0.0)) {
                        return Err(r.err(k, format!("must be \"auto\" or a positive number, got {v}")));
                    }
                }
            }
            r.nonneg("reserve_memory_gb", false)?;
            r.nonneg("reserve_memory_fraction", false)?;
            r.nonneg("available_memory_fraction", true)?;
            r.finish()?;
        }
        ex.finish()?;
    }
    let router = match top.obj("router")? {
        Some(r) => read_router(r)?,
        None => RouterPolicy::RoundRobin,
    };
    let planner = match top.raw("planner") {
        Some(v) => read_planner(v, &engine, &sla)?,
        None => None,
    };
    top.finish()?;
    Ok(Config { traffic, engine, sla, router, planner })
}

pub(crate) fn read_sla(mut s: Obj) -> Result<Sla, DeployError> {
    let sla = Sla {
        ttft_ms: s.nonneg("ttft_ms", true)?,
        itl_ms: s.nonneg("itl_ms", true)?,
        e2e_ms: s.nonneg("e2e_ms", true)?,
    };
    if sla.e2e_ms.is_some() && (sla.ttft_ms.is_some() || sla.itl_ms.is_some()) {
        return Err(DeployError::new(s.here(), "e2e_ms is mutually exclusive with ttft_ms/itl_ms"));
    }
    s.finish()?;
    Ok(sla)
}

fn read_router(mut r: Obj) -> Result<RouterPolicy, DeployError> {
    let policy = r.choice("policy", &["round_robin", "kv_router"])?.unwrap_or("round_robin");
    let load_model = match r.obj("prefill_load_model")? {
        Some(mut m) => {
            let t = m.choice("type", &["none", "ais", "aic"])?.unwrap_or("none");
            m.finish()?;
            t
        }
        None => "none",
    };
    let credit = r.f64("overlap_score_credit")?;
    let scale = r.f64("prefill_load_scale")?;
    let temp = r.f64("temperature")?;
    let here = r.here().to_string();
    r.finish()?;
    if policy == "round_robin" {
        if load_model != "none" || credit.is_some() || scale.is_some() || temp.is_some() {
            return Err(DeployError::new(
                here,
                "round_robin requires prefill_load_model none and takes no overlap_score_credit, prefill_load_scale or temperature",
            ));
        }
        return Ok(RouterPolicy::RoundRobin);
    }
    for (k, v) in [("overlap_score_credit", credit), ("prefill_load_scale", scale), ("temperature", temp)] {
        if let Some(x) = v {
            if !(x.is_finite() && x >= 0.0) {
                return Err(DeployError::new(format!("{here}.{k}"), format!("must be a finite number ≥ 0, got {x}")));
            }
        }
    }
    Ok(RouterPolicy::KvRouter {
        overlap_score_credit: credit.unwrap_or(1.0),
        prefill_load_scale: scale.unwrap_or(1.0),
        temperature: temp.unwrap_or(0.0),
        ais_load_model: load_model != "none",
    })
}

const FORMATS: [&str; 6] =
    ["mooncake", "mooncake-delta", "agentic_mooncake", "applied_compute_agentic", "dynamo", "weka"];

fn read_traffic(t: Option<Obj>) -> Result<Traffic, DeployError> {
    let Some(mut t) = t else {
        // Predict's default traffic: synthetic 1024/128, concurrency 10, 100 requests.
        return Ok(Traffic {
            source: Source::Synthetic { input_tokens: 1024, output_tokens: 128 },
            load: Load::Concurrency(10),
            stop: Stop { count: Some(100), ..Stop::default() },
        });
    };
    let here = t.here().to_string();
    let source = match t.obj("source")? {
        Some(s) => read_source(s)?,
        None => Source::Synthetic { input_tokens: 1024, output_tokens: 128 },
    };
    let (load, load_path, lanes) = match t.obj("load")? {
        Some(l) => {
            let p = l.here().to_string();
            let (load, lanes) = read_load(l)?;
            (load, p, lanes)
        }
        None => (Load::Concurrency(10), format!("{here}.load"), None),
    };
    let mut stop = Stop::default();
    let mut stop_keys = Vec::new();
    let stop_path = format!("{here}.stop");
    if let Some(mut s) = t.obj("stop")? {
        let requests = s.positive("requests")?;
        let rpl = s.nonneg("requests_per_load_unit", true)?;
        let sessions = s.positive("sessions")?;
        let spl = s.nonneg("sessions_per_load_unit", true)?;
        let mvt = s.nonneg("max_virtual_time_seconds", true)?;
        s.finish()?;
        for (k, set) in [
            ("requests", requests.is_some()),
            ("requests_per_load_unit", rpl.is_some()),
            ("sessions", sessions.is_some()),
            ("sessions_per_load_unit", spl.is_some()),
            ("max_virtual_time_seconds", mvt.is_some()),
        ] {
            if set {
                stop_keys.push(k);
            }
        }
        stop.max_virtual_time_seconds = mvt;
        let session_source = matches!(source, Source::Session { .. });
        let counts = stop_keys.iter().filter(|k| **k != "max_virtual_time_seconds").count();
        if counts > 1 {
            return Err(DeployError::new(&stop_path, "traffic.stop requires exactly one count condition"));
        }
        match &source {
            Source::Trace { .. } => {}
            _ if session_source => {
                if requests.is_some() || rpl.is_some() {
                    return Err(DeployError::new(&stop_path, "synthetic session traffic requires a session stop"));
                }
                stop.count = sessions;
                stop.count_per_load_unit = spl;
            }
            _ => {
                if sessions.is_some() || spl.is_some() {
                    return Err(DeployError::new(&stop_path, "synthetic request traffic requires a request stop"));
                }
                stop.count = requests;
                stop.count_per_load_unit = rpl;
            }
        }
    }
    t.finish()?;
    match &source {
        Source::Trace { format, .. } => {
            if !matches!(load, Load::TraceTimestamps { .. } | Load::Concurrency(_)) {
                return Err(DeployError::new(
                    &load_path,
                    "trace traffic requires trace_timestamps or concurrency load",
                ));
            }
            if stop_keys.iter().any(|k| *k != "max_virtual_time_seconds") {
                return Err(DeployError::new(&stop_path, "trace traffic only accepts max_virtual_time_seconds"));
            }
            if matches!(*format, "agentic_mooncake" | "weka") {
                if !matches!(load, Load::TraceTimestamps { .. }) {
                    return Err(DeployError::new(&load_path, format!("{format} requires trace_timestamps load")));
                }
                if stop.max_virtual_time_seconds.is_some() {
                    return Err(DeployError::new(
                        &stop_path,
                        format!("{format} does not support max_virtual_time_seconds"),
                    ));
                }
            }
            if *format == "applied_compute_agentic" && !matches!(load, Load::Concurrency(_)) {
                return Err(DeployError::new(&load_path, "applied_compute_agentic requires concurrency load"));
            }
            if lanes.is_some() && !matches!(*format, "weka" | "agentic_mooncake" | "dynamo") {
                return Err(DeployError::new(
                    &load_path,
                    "agentic_lanes requires weka, agentic_mooncake, or agentic dynamo input",
                ));
            }
        }
        _ => {
            if matches!(load, Load::TraceTimestamps { .. }) {
                return Err(DeployError::new(&load_path, "synthetic traffic does not accept trace_timestamps load"));
            }
            if stop.max_virtual_time_seconds.is_some() {
                return Err(DeployError::new(&stop_path, "max_virtual_time_seconds is trace-only"));
            }
            if stop_keys.is_empty() {
                return Err(DeployError::new(&stop_path, "synthetic traffic requires a stop condition"));
            }
            if let Some(ratio) = stop.count_per_load_unit {
                let unit = match load {
                    Load::Concurrency(c) => c as f64,
                    Load::Poisson { rate, .. } | Load::ConstantRate { rate } => rate,
                    Load::TraceTimestamps { .. } => 0.0,
                };
                stop.count = Some(((ratio * unit).round() as u32).max(1));
            }
        }
    }
    Ok(Traffic { source, load, stop })
}

fn read_source(mut s: Obj) -> Result<Source, DeployError> {
    let ty = s.choice("type", &["synthetic", "synthetic-session", "trace"])?.unwrap_or("synthetic");
    let here = s.here().to_string();
    let source = match ty {
        "synthetic" => {
            let input_tokens = s.positive("input_tokens")?.unwrap_or(1024);
            let output_tokens = s.positive("output_tokens")?.unwrap_or(128);
            if s.u64("cached_prefix_tokens")?.unwrap_or(0) != 0 {
                return Err(s.err(
                    "cached_prefix_tokens",
                    "a cached prefix in synthetic requests is not supported by servesim yet",
                ));
            }
            unsupported(&mut s, "images", "multimodal (image) traffic")?;
            Source::Synthetic { input_tokens, output_tokens }
        }
        "synthetic-session" => {
            let new_input_tokens = s.positive("new_input_tokens_per_turn")?.unwrap_or(1024);
            let output_tokens = s.positive("output_tokens_per_turn")?.unwrap_or(128);
            let (mut turns, mut ratio, mut groups, mut delay) = (4, 0.0, 0, 0.0);
            if let Some(mut ss) = s.obj("session")? {
                turns = ss.u32_min("turns", 2)?.unwrap_or(4);
                ratio = ss.nonneg("shared_prefix_ratio", false)?.unwrap_or(0.0);
                if ratio > 1.0 {
                    return Err(ss.err("shared_prefix_ratio", format!("must be in [0, 1], got {ratio}")));
                }
                groups = ss.u32_min("prefix_groups", 0)?.unwrap_or(0);
                delay = ss.nonneg("inter_turn_delay_ms", false)?.unwrap_or(0.0);
                ss.finish()?;
            }
            Source::Session {
                new_input_tokens,
                output_tokens,
                turns,
                shared_prefix_ratio: ratio,
                prefix_groups: groups,
                inter_turn_delay_ms: delay,
            }
        }
        _ => {
            let paths = match s.raw("paths") {
                Some(Value::Array(items)) => items
                    .iter()
                    .map(|p| {
                        p.as_str().map(str::to_string).ok_or_else(|| s.err("paths", "every path must be a string"))
                    })
                    .collect::<Result<Vec<_>, _>>()?,
                Some(_) => return Err(s.err("paths", "must be a list of paths")),
                None => Vec::new(),
            };
            if paths.iter().all(|p| p.is_empty()) || paths.iter().any(|p| p.is_empty()) {
                return Err(s.err("paths", "trace paths must contain at least one nonempty path"));
            }
            let format = s.choice("format", &FORMATS)?.unwrap_or("mooncake");
            if format != "dynamo" && paths.len() != 1 {
                return Err(s.err("paths", format!("trace format '{format}' requires exactly one path")));
            }
            let block_size = s.positive("block_size")?;
            let basis = s.choice("nested_timestamp_basis", &["auto", "absolute", "relative"])?;
            if basis.is_some() && format != "weka" {
                return Err(
                    s.err("nested_timestamp_basis", "nested_timestamp_basis is only valid for trace format 'weka'")
                );
            }
            Source::Trace { paths, format, block_size, nested_timestamp_basis: basis }
        }
    };
    let _ = here;
    s.finish()?;
    Ok(source)
}

fn read_load(mut l: Obj) -> Result<(Load, Option<u32>), DeployError> {
    let ty = l
        .choice("type", &["concurrency", "poisson", "constant_rate", "trace_timestamps", "kv_capacity_fraction"])?
        .unwrap_or("concurrency");
    let allowed: &[&str] = match ty {
        "concurrency" => &["type", "concurrency"],
        "poisson" => &["type", "requests_per_second", "sessions_per_second", "seed"],
        "constant_rate" => &["type", "requests_per_second", "sessions_per_second"],
        "trace_timestamps" => &[
            "type",
            "speedup",
            "agentic_lanes",
            "agentic_snapshot",
            "agentic_warmup",
            "agentic_warmup_policy",
            "agentic_profile",
        ],
        _ => &["type", "fraction"],
    };
    let all = [
        "concurrency",
        "requests_per_second",
        "sessions_per_second",
        "seed",
        "speedup",
        "agentic_lanes",
        "agentic_snapshot",
        "agentic_warmup",
        "agentic_warmup_policy",
        "agentic_profile",
        "fraction",
    ];
    // As the reference counts them: a key is used when it is set (not null), except that
    // `agentic_warmup: false` and the default warmup policy are no use at all; its own
    // canonical dumps (`prediction_config`, `recommendations/*.yaml`) write them on every load.
    let warmup = l.bool("agentic_warmup")?.unwrap_or(false);
    let policy = l.choice("agentic_warmup_policy", &["repeated_prefixes", "live_trajectory_v1"])?;
    let used = |k: &str| match k {
        "agentic_warmup" => warmup,
        "agentic_warmup_policy" => policy.is_some_and(|p| p != "repeated_prefixes"),
        _ => l.has(k),
    };
    let extra: Vec<&str> = all.iter().copied().filter(|k| used(k) && !allowed.contains(k)).collect();
    if !extra.is_empty() {
        return Err(DeployError::new(l.here(), format!("traffic.load.type='{ty}' does not accept {extra:?}")));
    }
    // Null fields of the load model are no use either, whatever the type.
    for k in all {
        if !l.has(k) {
            l.raw(k);
        }
    }
    let mut lanes = None;
    let load = match ty {
        "concurrency" => Load::Concurrency(l.positive("concurrency")?.unwrap_or(10)),
        "poisson" | "constant_rate" => {
            let r = l.nonneg("requests_per_second", true)?;
            let s = l.nonneg("sessions_per_second", true)?;
            let rate = match (r, s) {
                (Some(x), None) | (None, Some(x)) => x,
                (Some(_), Some(_)) => {
                    return Err(
                        l.err("requests_per_second", "give requests_per_second or sessions_per_second, not both")
                    )
                }
                (None, None) => {
                    return Err(DeployError::new(
                        l.here(),
                        format!("{ty} synthetic traffic requires requests_per_second"),
                    ))
                }
            };
            if ty == "poisson" {
                Load::Poisson { rate, seed: l.u64("seed")?.unwrap_or(42) }
            } else {
                Load::ConstantRate { rate }
            }
        }
        "trace_timestamps" => {
            let speedup = l.nonneg("speedup", true)?.unwrap_or(1.0);
            lanes = l.positive("agentic_lanes")?;
            for k in ["agentic_snapshot", "agentic_profile"] {
                unsupported(&mut l, k, "agentic snapshots, warmup and profiles")?;
            }
            if warmup || policy.is_some_and(|p| p != "repeated_prefixes") {
                let k = if warmup { "agentic_warmup" } else { "agentic_warmup_policy" };
                return Err(l.err(k, "agentic snapshots, warmup and profiles is not supported by servesim yet"));
            }
            Load::TraceTimestamps { speedup, agentic_lanes: lanes }
        }
        _ => return Err(l.err("type", "kv_capacity_fraction load is recommend-only")),
    };
    l.finish()?;
    Ok((load, lanes))
}

fn read_engine(mut e: Obj) -> Result<Engine, DeployError> {
    let mode = match e.choice("mode", &["aggregated", "disaggregated", "afd"])?.unwrap_or("aggregated") {
        "aggregated" => Mode::Aggregated,
        "disaggregated" => Mode::Disaggregated,
        _ => return Err(e.err("mode", "afd (attention-FFN disaggregation) is not supported by servesim yet")),
    };
    let model = e.nonempty("model")?.ok_or_else(|| e.err("model", "missing (required)"))?;
    let hardware = e.nonempty("hardware")?.ok_or_else(|| e.err("hardware", "missing (required)"))?;
    if hardware == "auto" {
        return Err(e.err("hardware", "engine.hardware='auto' is recommendation-only"));
    }
    let backend = e.choice("backend", &["vllm", "sglang", "trtllm"])?.unwrap_or("vllm");
    let backend_version = e.nonempty("backend_version")?;
    let context_length = match e.raw("context_length") {
        None => None,
        Some(Value::String(s)) if s == "max" => None,
        Some(_) => Some(e.positive("context_length")?.expect("present")),
    };
    let nextn = e.u32_min("nextn", 0)?.unwrap_or(0);
    if nextn > 0 {
        return Err(
            e.err("nextn", "MTP speculation (nextn > 0) in the unified config is not supported by servesim yet")
        );
    }
    e.nonneg("nextn_accepted", false)?;
    let enable_chunked_prefill = e.bool("enable_chunked_prefill")?;
    if e.bool("enable_eplb")? == Some(true) {
        return Err(e.err("enable_eplb", "expert-parallel load balancing is not supported by servesim yet"));
    }
    let systems_paths = match e.raw("systems_paths") {
        None => None,
        Some(Value::Array(a)) => Some(
            a.iter()
                .map(|p| match p.as_str() {
                    Some(s) if !s.is_empty() && !s.contains(',') => Ok(s.to_string()),
                    _ => Err(e.err("systems_paths", "every entry must be a nonempty path without commas")),
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
        Some(_) => return Err(e.err("systems_paths", "must be a list of paths")),
    };
    if let Some(m) =
        e.choice("database_mode", &["SILICON", "HYBRID", "EMPIRICAL", "SOL", "silicon", "hybrid", "empirical", "sol"])?
    {
        if !m.eq_ignore_ascii_case("silicon") {
            return Err(e.err("database_mode", format!("{m} is not supported by servesim yet (SILICON only)")));
        }
    }
    if let Some(m) = e.choice("estimation_mode", &["auto", "op_level", "fpm_interpolation", "fpm_regression"])? {
        if !matches!(m, "auto" | "op_level") {
            return Err(e.err("estimation_mode", format!("{m} is not supported by servesim yet (op_level only)")));
        }
    }
    e.choice("fallback_policy", &["deny", "allow"])?;
    for k in [
        "speculation",
        "tokenization",
        "afd",
        "fpm_profile",
        "decoder_replay",
        "enable_shared_layer",
        "strict_provenance",
        "transfer_policy",
        "wideep_num_slots",
        "moe_backend",
        "moe_kernel_source",
        "attention_backend",
        "gemm_quant_mode",
        "moe_quant_mode",
        "kvcache_quant_mode",
        "fmha_quant_mode",
        "comm_quant_mode",
    ] {
        if let Some(v) = e.raw(k) {
            if v != &Value::Bool(false) {
                return Err(e.err(k, "this key is not supported by servesim yet"));
            }
        }
    }
    if let Some(v) = e.raw("estimator_config") {
        only_defaults(&e.path("estimator_config"), v, &estimator_defaults())?;
    }
    let kv_transfer = match e.obj("kv_transfer")? {
        Some(mut t) => {
            let bytes_per_token = match t.raw("bytes_per_token") {
                None => None,
                Some(Value::String(s)) if s == "auto" => None,
                Some(_) => Some(
                    t.u64("bytes_per_token")?
                        .filter(|&n| n > 0)
                        .ok_or_else(|| t.err("bytes_per_token", "must be \"auto\" or a positive integer"))?,
                ),
            };
            let bandwidth = t.nonneg("bandwidth_gb_per_second", true)?;
            let mode =
                t.choice("timing_mode", &["full_prompt", "destination_missing"])?.unwrap_or("destination_missing");
            t.finish()?;
            Some(KvTransfer { bytes_per_token, bandwidth_gb_per_second: bandwidth, timing_mode: mode })
        }
        None => None,
    };
    let workers_path = e.path("workers");
    let (mut aggregated, mut prefill, mut decode) = (None, None, None);
    if let Some(mut w) = e.obj("workers")? {
        if w.raw("encoder").is_some() {
            return Err(w.err("encoder", "encoder pools are not supported by servesim yet"));
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
        Mode::Aggregated => {
            if prefill.is_some() || decode.is_some() {
                return Err(DeployError::new(&workers_path, "aggregated mode takes workers.aggregated only"));
            }
            if kv_transfer.is_some() {
                return Err(e.err("kv_transfer", "kv_transfer applies to disaggregated mode"));
            }
            if aggregated.is_none() {
                aggregated = Some(read_worker(
                    Obj::new(&format!("{workers_path}.aggregated"), &Value::Null)?,
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
        }
    }
    e.finish()?;
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
    })
}

fn read_worker(mut w: Obj, role: &'static str, backend: &str) -> Result<Worker, DeployError> {
    let hardware = w.nonempty("hardware")?;
    let context_length = w.positive("context_length")?;
    let mut p = Parallelism { replicas: 1, tensor: 1, pipeline: 1, attention_data: 1, moe_tensor: 1, moe_expert: 1 };
    if let Some(mut o) = w.obj("parallelism")? {
        p.replicas = o.positive("replicas")?.unwrap_or(1);
        p.tensor = o.positive("tensor")?.unwrap_or(1);
        p.pipeline = o.positive("pipeline")?.unwrap_or(1);
        p.attention_data = o.positive("attention_data")?.unwrap_or(1);
        p.moe_tensor = o.positive("moe_tensor")?.unwrap_or(1);
        p.moe_expert = o.positive("moe_expert")?.unwrap_or(1);
        for k in ["prefill_context", "decode_context"] {
            if o.positive(k)?.is_some_and(|v| v != 1) {
                return Err(o.err(k, "context parallelism is not supported by servesim yet"));
            }
        }
        if p.pipeline != 1 {
            return Err(o.err("pipeline", "pipeline parallelism is not supported by servesim yet"));
        }
        o.finish()?;
    }
    let default_seqs = if role == "prefill" { 1 } else { 256 };
    let (mut mbt, mut seqs) = (8192, default_seqs);
    if let Some(mut s) = w.obj("scheduler")? {
        mbt = s.positive("max_batched_tokens")?.unwrap_or(8192);
        seqs = s.positive("max_sequences")?.unwrap_or(default_seqs);
        if s.positive("prefill_schedule_interval")?.is_some_and(|v| v != 1) {
            return Err(s.err("prefill_schedule_interval", "values other than 1 are not supported by servesim yet"));
        }
        if s.u32_min("prefill_decode_interval", 0)?.is_some_and(|v| v != 0) {
            return Err(s.err("prefill_decode_interval", "values other than 0 are not supported by servesim yet"));
        }
        s.finish()?;
    }
    let (mut block_size, mut prefix_caching, mut bytes_per_token) = (None, true, None);
    let mut capacity = Capacity::Default { memory_fraction: None, cuda_graph_reserved_bytes: 0 };
    if let Some(mut k) = w.obj("kv_cache")? {
        block_size = k.positive("block_size")?;
        prefix_caching = k.bool("prefix_caching")?.unwrap_or(true);
        bytes_per_token = match k.raw("bytes_per_token") {
            None => None,
            Some(Value::String(s)) if s == "auto" => None,
            Some(_) => Some(
                k.u64("bytes_per_token")?
                    .filter(|&n| n > 0)
                    .ok_or_else(|| k.err("bytes_per_token", "must be \"auto\" or a positive integer"))?,
            ),
        };
        for key in ["prefix_match_unit", "host_offload", "g3_offload", "kvcr", "state_cache"] {
            unsupported(&mut k, key, key)?;
        }
        if let Some(mut c) = k.obj("capacity")? {
            let ty = c.choice("type", &["default", "fixed"])?.unwrap_or("default");
            let frac = c.nonneg("memory_fraction", true)?;
            if frac.is_some_and(|f| f > 1.0) {
                return Err(c.err("memory_fraction", "must be in (0, 1]"));
            }
            let blocks = c.u64("blocks")?;
            let bytes = c.u64("bytes")?;
            let cg = c.u64("cuda_graph_reserved_bytes")?.unwrap_or(0);
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
                        if bytes_per_token.is_none() {
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
        k.finish()?;
    }
    let _ = backend;
    let timing = match w.obj("timing")? {
        None => Timing::Default,
        Some(mut t) => {
            let ty = t.choice("type", &["default", "fixed", "polynomial"])?.unwrap_or("default");
            let pre = t.nonneg("prefill_ms", false)?;
            let dec = t.nonneg("decode_ms", false)?;
            let here = t.here().to_string();
            let mut identity = false;
            for k in [
                "gemm_quant_mode",
                "moe_quant_mode",
                "fmha_quant_mode",
                "kvcache_quant_mode",
                "comm_quant_mode",
                "attention_backend",
            ] {
                identity |= t.raw(k).is_some();
            }
            if identity && ty != "default" {
                return Err(DeployError::new(&here, "quantization and backend identity require default timing"));
            }
            if identity {
                return Err(DeployError::new(
                    &here,
                    "quantization and attention-backend overrides are not supported by servesim yet",
                ));
            }
            for k in ["forward_model", "fpm_parquet_path", "systems_paths"] {
                unsupported(&mut t, k, k)?;
            }
            // The reference writes its defaults for these into every canonical dump.
            if let Some(v) = t.raw("estimator_config") {
                only_defaults(&t.path("estimator_config"), v, &estimator_defaults())?;
            }
            if let Some(v) = t.raw("transfer_policy") {
                only_defaults(&t.path("transfer_policy"), v, &json!(["xshape", "xquant", "xprofile", "xop"]))?;
            }
            t.choice("estimation_mode", &["auto", "op_level"])?;
            t.choice("fallback_policy", &["deny", "allow"])?;
            t.choice("database_mode", &["SILICON", "silicon"])?;
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
    let startup_seconds = w.nonneg("startup_seconds", false)?.unwrap_or(0.0);
    w.finish()?;
    Ok(Worker {
        role,
        hardware,
        context_length,
        parallelism: p,
        max_batched_tokens: mbt,
        max_sequences: seqs,
        block_size,
        prefix_caching,
        bytes_per_token,
        capacity,
        timing,
        startup_seconds,
    })
}

/// Keys of the `planner:` section passed to the Planner's configuration unchanged.
const PLANNER_PASSTHROUGH: &[&str] = &[
    "enable_throughput_scaling",
    "enable_load_scaling",
    "throughput_adjustment_interval_seconds",
    "load_adjustment_interval_seconds",
    "max_throughput_scaling_replicas",
    "max_num_fpm_samples",
    "fpm_sample_bucket_size",
    "load_scaling_down_sensitivity",
    "load_min_observations",
    "load_predictor",
    "load_predictor_log1p",
    "prophet_window_size",
    "kalman_q_level",
    "kalman_q_trend",
    "kalman_r",
    "kalman_min_points",
];

/// The section's public names for the Planner's fields.
const PLANNER_RENAMES: &[(&str, &str)] = &[
    ("max_num_gpus", "max_gpu_budget"),
    ("min_num_gpus", "min_gpu_budget"),
    ("min_workers", "min_endpoint"),
    ("prefill_min_workers", "prefill_min_endpoint"),
    ("decode_min_workers", "decode_min_endpoint"),
];

/// The `planner:` section (aisimulate's Dynamo adapter, `planner.md` §8): `policy`, `target`,
/// the passthrough keys and the renames; `mode`, the SLA and the load thresholds are derived.
/// `None` when the policy is `disabled`.
fn read_planner(v: &Value, engine: &Engine, sla: &Sla) -> Result<Option<servesim_planner::PlannerConfig>, DeployError> {
    let m = v.as_object().ok_or_else(|| DeployError::new("planner", "adapter section 'planner' must be a mapping"))?;
    let extra: Vec<String> = m
        .keys()
        .filter(|k| {
            !matches!(k.as_str(), "policy" | "target")
                && !PLANNER_PASSTHROUGH.contains(&k.as_str())
                && !PLANNER_RENAMES.iter().any(|(public, _)| public == k)
        })
        .map(|k| format!("'{k}'"))
        .collect();
    if !extra.is_empty() {
        return Err(DeployError::new("planner", format!("Extra inputs are not permitted: [{}]", extra.join(", "))));
    }
    let policy = match m.get("policy") {
        None | Some(Value::Null) => "disabled",
        Some(Value::String(s)) if s == "disabled" || s == "enabled" => s.as_str(),
        Some(other) => {
            return Err(DeployError::new(
                "planner.policy",
                format!("Input should be 'disabled' or 'enabled', got {other}"),
            ))
        }
    };
    if policy == "disabled" {
        return Ok(None);
    }
    let target = match m.get("target") {
        None | Some(Value::Null) => "throughput",
        Some(Value::String(s)) if matches!(s.as_str(), "throughput" | "latency" | "sla" | "load") => s.as_str(),
        Some(_) => {
            return Err(DeployError::new("planner.target", "planner.target must be throughput, latency, sla, or load"))
        }
    };
    let mut out = serde_json::Map::new();
    let disagg = engine.mode == Mode::Disaggregated;
    out.insert("mode".into(), json!(if disagg { "disagg" } else { "agg" }));
    out.insert("optimization_target".into(), json!(target));
    for k in PLANNER_PASSTHROUGH {
        if let Some(v) = m.get(*k) {
            out.insert((*k).into(), v.clone());
        }
    }
    for (public, field) in PLANNER_RENAMES {
        if let Some(v) = m.get(*public) {
            out.insert((*field).into(), v.clone());
        }
    }
    let gpus =
        |w: &Option<Worker>| w.as_ref().map(|w| w.parallelism.tensor as u64 * w.parallelism.attention_data as u64);
    if disagg {
        out.insert("prefill_engine_num_gpu".into(), json!(gpus(&engine.prefill)));
        out.insert("decode_engine_num_gpu".into(), json!(gpus(&engine.decode)));
    } else {
        out.insert("decode_engine_num_gpu".into(), json!(gpus(&engine.aggregated)));
    }
    if target == "sla" {
        let throughput = m.get("enable_throughput_scaling").and_then(Value::as_bool).unwrap_or(true);
        match (sla.ttft_ms, sla.itl_ms) {
            (Some(ttft), Some(itl)) => {
                out.insert("ttft_ms".into(), json!(ttft));
                out.insert("itl_ms".into(), json!(itl));
            }
            _ if throughput => {
                return Err(DeployError::new(
                    "planner",
                    "Planner throughput scaling requires evaluation.sla.ttft_ms and evaluation.sla.itl_ms",
                ))
            }
            _ => {}
        }
    }
    if target == "load" {
        out.insert("decode_scale_up_kv_rate".into(), json!(90));
        out.insert("decode_scale_down_kv_rate".into(), json!(70));
        if disagg {
            out.insert("prefill_scale_up_queue_tokens".into(), json!(1));
            out.insert("prefill_scale_down_queue_tokens".into(), json!(0));
        }
    }
    let cfg = servesim_planner::PlannerConfig::from_json(&Value::Object(out)).map_err(|e| {
        // Report the user's key for a renamed field.
        let key = PLANNER_RENAMES.iter().find(|(_, f)| *f == e.key).map_or(e.key.as_str(), |(p, _)| *p);
        if key.is_empty() {
            DeployError::new("planner", e.message)
        } else {
            DeployError::new(format!("planner.{key}"), e.message)
        }
    })?;
    Ok(Some(cfg))
}
