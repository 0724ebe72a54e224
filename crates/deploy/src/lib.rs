//! The deployment question as one YAML file: aisimulate 0.13's unified configuration
//! (`traffic`, `engine`, `evaluation`, `execution`, `router:`; spec:
//! `shared/reference/aisimulate.md` §3), read strictly ([`schema`]), overridden with
//! `--set PATH=VALUE` ([`tree`]), and lowered into servesim's replay ([`lower`]). `predict -c`
//! runs one such deployment ([`Prepared::run`]).

pub mod afd;
pub mod encpool;
pub mod epd;
mod error;
pub mod host_table;
pub mod lower;
pub mod planner_search;
pub mod reader;
pub mod recommend;
pub mod schema;
pub mod state_size;
pub mod tree;
pub mod vl;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{json, Map, Value};
use servesim_replay::memory::{gib, history_bytes, session_bytes, WORKER_BYTES};
use servesim_replay::{Ran, Report, Run, SimConfig};
use servesim_router::{PrefillLoadEstimator, PrefillLoadModel};
use servesim_workload::{LoadMode, Workload};

pub use error::DeployError;
pub use schema::Config;

/// Reads a configuration file and applies `--set` overrides, giving the tree.
pub fn load_tree(path: &Path, sets: &[String]) -> Result<Value, String> {
    let text = servesim_workload::input::read_config_text(path)
        .map_err(|e| format!("could not read configuration {}: {e}", path.display()))?;
    let mut tree = tree::parse_yaml(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    for s in sets {
        tree::apply_set(&mut tree, s).map_err(|e| format!("--set {s}: {e}"))?;
    }
    migrate_systems_path(&mut tree).map_err(|e| e.to_string())?;
    Ok(tree)
}

/// The reference's legacy `engine.systems_path` (one directory) read as `systems_paths: [it]`;
/// both given must agree.
pub fn migrate_systems_path(tree: &mut Value) -> Result<(), DeployError> {
    let Some(engine) = tree.get_mut("engine").and_then(Value::as_object_mut) else { return Ok(()) };
    let Some(path) = engine.remove("systems_path") else { return Ok(()) };
    let here = "engine.systems_path";
    let one = match &path {
        Value::Null => return Ok(()),
        Value::String(s) if s.trim().is_empty() => return Err(DeployError::new(here, "path must be nonempty")),
        Value::String(s) if s.contains(',') => {
            return Err(DeployError::new(
                here,
                "systems_path must name one nonempty local directory, not a comma-separated list",
            ))
        }
        Value::String(_) => json!([path]),
        _ => return Err(DeployError::new(here, "must be a path")),
    };
    match engine.get("systems_paths").filter(|v| !v.is_null()) {
        Some(given) if *given != one => Err(DeployError::new(here, "systems_path conflicts with systems_paths")),
        _ => {
            engine.insert("systems_paths".into(), one);
            Ok(())
        }
    }
}

/// Where a configuration tree names performance-data directories: the engine's
/// `systems_paths` and each worker's `timing.systems_paths`.
pub const SYSTEMS_PATHS_POINTERS: [&str; 4] = [
    "/engine/systems_paths",
    "/engine/workers/aggregated/timing/systems_paths",
    "/engine/workers/prefill/timing/systems_paths",
    "/engine/workers/decode/timing/systems_paths",
];

/// The files and directories a configuration tree reads besides itself: its trace paths
/// (`traffic.source.paths`) and performance-data paths ([`SYSTEMS_PATHS_POINTERS`]), resolved
/// against `base`, the configuration's directory. Front ends refuse to write over them.
pub fn input_paths(tree: &Value, base: &Path) -> Vec<PathBuf> {
    let list = |p: &str| tree.pointer(p).and_then(Value::as_array).cloned().unwrap_or_default();
    let mut out = Vec::new();
    let pointers = std::iter::once("/traffic/source/paths").chain(SYSTEMS_PATHS_POINTERS);
    for v in pointers.flat_map(list) {
        if let Some(s) = v.as_str().filter(|s| !s.is_empty()) {
            let p = Path::new(s);
            out.push(if p.is_absolute() { p.to_path_buf() } else { base.join(p) });
        }
    }
    out
}

/// The directory a configuration file's relative paths start from.
pub fn config_base(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// A predict configuration ready to run.
pub struct Prepared {
    pub config: Config,
    pub engine: lower::LoweredEngine,
    pub sim: SimConfig,
    pub workload: Workload,
    /// A native encoder pool's resolved identity (`prediction.json`'s `encoder`).
    pub encoder: Option<Value>,
}

/// The router's prompt-side load model from the AIS estimator of the engines it fronts.
#[derive(Debug)]
struct AisPrefillLoad(Arc<servesim_perf::Estimator>);

impl PrefillLoadEstimator for AisPrefillLoad {
    fn prefill_ms(&self, new_tokens: u32, prefix_tokens: u32) -> Result<f64, String> {
        let isl = new_tokens.checked_add(prefix_tokens).ok_or("prompt length exceeds 2^32")?;
        self.0.prefill_ms(1, isl, prefix_tokens).map_err(|e| e.message)
    }
}

/// Bytes a finished request's record keeps until the summary is made.
const RECORD_BYTES: u64 = 64;

/// Bytes a native encoder server's state and queue take, at least.
const ENCODER_SERVER_BYTES: u64 = 256;

/// Refuses, before anything is built for them, worker counts and synthetic sessions whose
/// simulator state cannot fit in `memory` bytes (the flag form's guards, on the YAML's keys):
/// a run that would abort out of memory halfway is an input error named by its key.
pub fn check_memory(config: &Config, memory: u64) -> Result<(), DeployError> {
    let e = &config.engine;
    let mut ranks: u64 = 0;
    for (role, w) in [("aggregated", &e.aggregated), ("prefill", &e.prefill), ("decode", &e.decode)] {
        let Some(w) = w else { continue };
        let p = &w.parallelism;
        let here = (p.replicas as u64).saturating_mul(p.attention_data.max(1) as u64);
        ranks = ranks.saturating_add(here);
        if ranks.saturating_mul(WORKER_BYTES) > memory {
            return Err(DeployError::new(
                format!("engine.workers.{role}.parallelism.replicas"),
                format!(
                    "{ranks} engine ranks need about {} of memory; this machine has {} available (at most {} ranks)",
                    gib(ranks.saturating_mul(WORKER_BYTES)),
                    gib(memory),
                    memory / WORKER_BYTES
                ),
            ));
        }
    }
    // A native encoder pool keeps a queue per server.
    if let Some(pool) = e.encoder.as_ref().filter(|p| p.native.is_some()) {
        let bytes = (pool.replicas as u64).saturating_mul(ENCODER_SERVER_BYTES);
        if bytes > memory {
            return Err(DeployError::new(
                "engine.workers.encoder.replicas",
                format!(
                    "{} encoder servers need about {} of memory; this machine has {} available (at most {} servers)",
                    pool.replicas,
                    gib(bytes),
                    gib(memory),
                    memory / ENCODER_SERVER_BYTES
                ),
            ));
        }
    }
    let (input, turns, history, key) = match &config.traffic.source {
        schema::Source::Synthetic { input_tokens, .. } => (*input_tokens, 1, 0, "traffic.source.input_tokens"),
        // The last turn's prompt: every earlier prompt and output, and its own new tokens.
        schema::Source::Session { new_input_tokens, output_tokens, turns, .. } => (
            *new_input_tokens,
            *turns,
            (*turns as u64).saturating_mul(*new_input_tokens as u64 + *output_tokens as u64),
            "traffic.source.new_input_tokens_per_turn",
        ),
        schema::Source::Trace { .. } => return Ok(()),
    };
    let count = config.traffic.stop.count.unwrap_or(100) as u64;
    let in_flight = match config.traffic.load {
        schema::Load::Concurrency(c) => (c as u64).min(count).max(1),
        _ => 1,
    };
    // Blocks of the smallest size an engine uses: the estimate errs high.
    let per_session = session_bytes(input as u64, turns as u64, 16).saturating_add(history_bytes(history, 16));
    let need = per_session
        .saturating_mul(in_flight)
        .saturating_add(count.saturating_mul(turns as u64).saturating_mul(RECORD_BYTES));
    if need > memory {
        return Err(DeployError::new(
            key,
            format!(
                "{input} tokens × {turns} turn(s) × {in_flight} session(s) in flight ({count} in all){} need about {} \
                 of memory; this machine has {} available",
                if history > 0 { format!(", with histories of up to {history} tokens,") } else { String::new() },
                gib(need),
                gib(memory)
            ),
        ));
    }
    Ok(())
}

/// Refuses a synthetic prompt no worker can ever take (it would be generated, then rejected,
/// and the run would report nothing): one that reaches a worker's context length or needs more
/// KV blocks than its cache has. Disaggregated requests pass through both pools.
fn check_prompt_fits(config: &Config, topology: &servesim_replay::Topology) -> Result<(), DeployError> {
    let (input, turns, key) = match &config.traffic.source {
        schema::Source::Synthetic { input_tokens, .. } => (*input_tokens as u64, 1u64, "traffic.source.input_tokens"),
        schema::Source::Session { new_input_tokens, .. } => {
            (*new_input_tokens as u64, 1, "traffic.source.new_input_tokens_per_turn")
        }
        schema::Source::Trace { .. } => return Ok(()),
    };
    let prompt = input.saturating_mul(turns);
    for pool in topology.pools() {
        let engine = pool.rank_engine();
        if let Some(max) = engine.max_model_len.filter(|&m| prompt >= m as u64) {
            return Err(DeployError::new(
                key,
                format!(
                    "{input}: a prompt must be shorter than the workers' context length ({max}); no request could run"
                ),
            ));
        }
        let blocks = prompt.div_ceil(engine.block_size.max(1) as u64);
        if blocks > engine.num_gpu_blocks as u64 {
            return Err(DeployError::new(
                key,
                format!(
                    "{input}: a prompt of {blocks} KV blocks cannot fit the workers' KV cache ({} blocks of {} tokens); \
                     no request could run",
                    engine.num_gpu_blocks, engine.block_size
                ),
            ));
        }
    }
    Ok(())
}

/// Lowers a read configuration. `base`: the directory relative trace paths start from.
pub fn prepare(config: Config, base: &Path) -> Result<Prepared, DeployError> {
    if config.engine.encoder.as_ref().is_some_and(|e| e.native.is_none()) {
        // `epd` runs the pool's language side (`epd::Pool::language`), which has none.
        return Err(DeployError::new(
            "engine.workers.encoder",
            "an encoder pool is an overlay on its language replay's means (servesim_deploy::epd, run by predict -c \
             and recommend -c); a plain replay with one is not supported by servesim yet",
        ));
    }
    if let Some(memory) = servesim_replay::memory::available() {
        check_memory(&config, memory)?;
    }
    let engine = lower::lower_engine(&config.engine)?;
    let topology = lower::topology(&engine)?;
    check_prompt_fits(&config, &topology)?;
    let (workload, load) = lower::workload(&config, base, topology.block_size())?;
    let mut router = lower::router(&config);
    if router.kv_config_mut().is_some() && topology.mixed_block_sizes() {
        let sizes: Vec<String> = topology.pools().iter().map(|p| p.engine.block_size.to_string()).collect();
        return Err(DeployError::new(
            "router.policy",
            format!(
                "kv_router over prefill and decode workers with different block sizes ({}) is not supported by \
                 servesim yet (the router hashes prompts in one block size); give both roles the same \
                 kv_cache.block_size",
                sizes.join(" vs ")
            ),
        ));
    }
    let mut estimator: Option<Arc<dyn PrefillLoadEstimator>> = None;
    if let Some(r) = router.kv_config_mut() {
        if r.prefill_load_model == PrefillLoadModel::Ais {
            // The prefill (or aggregated) role, priced by AIS even behind fixed or polynomial
            // worker timing, as the reference's router does.
            let ais = &engine.workers[0].ais_config;
            let at = |e: servesim_perf::PerfError| DeployError::new("router.prefill_load_model", e.message);
            let cfg = servesim_perf::AisConfig::from_json("", ais).map_err(at)?;
            let est = servesim_perf::estimator(&cfg).map_err(at)?;
            estimator = Some(Arc::new(AisPrefillLoad(est)));
        }
    }
    if matches!(load, LoadMode::Concurrency { .. })
        && matches!(config.traffic.load, schema::Load::TraceTimestamps { .. })
    {
        unreachable!("trace load modes come from the trace reader");
    }
    let sim = SimConfig {
        prefill_load_estimator: estimator,
        sla: lower::sla(&config),
        seed: lower::seed(&config),
        tokenization: config.engine.tokenization,
        frontend_stages: lower::frontend_stages(&config.engine),
        ..SimConfig::new(topology, router, load)
    };
    let mut sim = sim;
    let encoder = encpool::lower(&config)?.map(|r| {
        sim.encoder_pool = Some(r.pool);
        r.identity
    });
    Ok(Prepared { config, engine, sim, workload, encoder })
}

/// Reads, overrides and lowers a predict configuration file.
pub fn prepare_file(path: &Path, sets: &[String]) -> Result<Prepared, String> {
    prepare_tree(path, &load_tree(path, sets)?)
}

/// [`prepare_file`] of a configuration tree already read from `path` (by [`load_tree`]).
pub fn prepare_tree(path: &Path, tree: &Value) -> Result<Prepared, String> {
    let config = schema::read_predict(tree).map_err(|e| format!("{}: {e}", path.display()))?;
    let base = path.parent().unwrap_or(Path::new("."));
    prepare(config, base).map_err(|e| format!("{}: {e}", path.display()))
}

/// The planner of a prepared prediction, ready to run (None without a `planner:` section).
pub fn planner_run(p: &Prepared) -> Result<Option<servesim_replay::planned::PlannerRun>, String> {
    let Some(cfg) = p.config.planner.clone() else { return Ok(None) };
    servesim_replay::planned::PlannerRun::for_topology(cfg, &p.sim.topology, servesim_perf::planner_model)
        .map(Some)
        .map_err(|e| format!("planner: {e}"))
}

impl Prepared {
    /// The prediction as a run, with what the configuration says beyond the engine and the
    /// load: its stop time (`traffic.stop.max_virtual_time_seconds`). The front end adds its
    /// planner ([`planner_run`]), record sink, reports and pacing, and runs it.
    pub fn run(&self) -> Run<'_> {
        Run::new(&self.workload, &self.sim)
            .stop_at_ms(self.config.traffic.stop.max_virtual_time_seconds.map(|s| s * 1000.0))
    }
}

/// The summary `prediction.json` holds: the replay report under the reference's keys plus the
/// prediction's own (timing provenance per role, eviction policy, power not modelled).
pub fn prediction_summary(p: &Prepared, report: &Report) -> Map<String, Value> {
    let mut s = report.summary_json();
    s.extend(servesim_replay::workload_keys(&p.workload));
    let mut prov = Map::new();
    for w in &p.engine.workers {
        prov.insert(w.role.to_string(), w.provenance.clone());
    }
    s.insert("prediction_provenance".into(), Value::Object(prov));
    s.insert("kv_eviction_policy".into(), json!("lru"));
    encpool::summarise(&p.config, report, &mut s);
    if let Some(identity) = &p.encoder {
        s.insert("encoder".into(), identity.clone());
    }
    s.insert("power_w".into(), Value::Null);
    s.insert("power_coverage".into(), Value::Null);
    let e = &p.config.engine;
    let kvcr = [&e.aggregated, &e.prefill, &e.decode]
        .into_iter()
        .flatten()
        .any(|w| w.offload.as_ref().is_some_and(|o| o.kvcr.is_some()));
    if [&e.aggregated, &e.prefill].into_iter().flatten().any(|w| w.host_loop) {
        // SGLang's host loop: the parts of the mean TTFT, as the reference reports them.
        let [frontend, inbox, to_admit, prefill, handoff] = report.totals.host_loop.unwrap_or_default().means_ms();
        s.insert("mean_frontend_ms".into(), json!(frontend));
        s.insert("mean_scheduler_inbox_wait_ms".into(), json!(inbox));
        s.insert("mean_receive_to_admit_ms".into(), json!(to_admit));
        s.insert("mean_prefill_elapsed_ms".into(), json!(prefill));
        s.insert("mean_handoff_to_first_token_ms".into(), json!(handoff));
        // A token is seen when its pass ends (no measured host costs: `host_profile` is
        // refused), so the loop observes every result at once.
        s.insert("mean_result_observation_delay_ms".into(), json!(0.0));
    }
    if kvcr {
        // The reference's KVCR counters: no request of the YAML's traffic carries the KV hints
        // a pull needs (see `schema::offload`), so they stay at zero.
        s.insert(
            "kvcr".into(),
            json!({"blocks": 0, "bytes": 0, "loaded_blocks": 0, "pulls": {"partial": 0, "success": 0},
                   "remote_deliver_ms": 0.0, "source_wait_ms": 0.0}),
        );
    }
    s
}

/// [`prediction_summary`] of a run with its planner, if it had one: `planner_total_ticks`
/// beside the replay's keys (what the ranking reads with `gpu_hours`).
pub fn planned_summary(p: &Prepared, ran: &Ran) -> Map<String, Value> {
    let mut s = prediction_summary(p, &ran.report);
    ran.add_planner_keys(&mut s);
    s
}

/// Sorts an object's keys recursively (the reference writes `prediction.json` with sorted keys).
pub fn sorted(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            Value::Object(keys.into_iter().map(|k| (k.clone(), sorted(&m[k]))).collect())
        }
        Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Every path a configuration reads is an input the front ends will not write over: traces,
    /// the engine's performance data and each worker's.
    #[test]
    fn input_paths_cover_traces_and_every_systems_path() {
        let tree = json!({
            "traffic": {"source": {"paths": ["t.jsonl"]}},
            "engine": {
                "systems_paths": ["/data/a"],
                "workers": {"decode": {"timing": {"systems_paths": ["b", ""]}}},
            },
        });
        let base = Path::new("/cfg");
        assert_eq!(input_paths(&tree, base), [base.join("t.jsonl"), PathBuf::from("/data/a"), base.join("b")]);
    }

    /// The legacy `engine.systems_path` is one entry of `systems_paths` (aisimulate's
    /// `_migrate_systems_path`), read through `load_tree` by predict and recommend alike.
    #[test]
    fn the_legacy_systems_path_migrates() {
        let migrate = |engine: Value| {
            let mut tree = json!({"engine": engine});
            migrate_systems_path(&mut tree).map(|()| tree).map_err(|e| e.to_string())
        };
        let t = migrate(json!({"systems_path": "/data/a"})).unwrap();
        assert_eq!(t["engine"], json!({"systems_paths": ["/data/a"]}));
        let same = migrate(json!({"systems_path": "/data/a", "systems_paths": ["/data/a"]})).unwrap();
        assert_eq!(same, t);
        let e = migrate(json!({"systems_path": "/data/a", "systems_paths": ["/data/b"]})).unwrap_err();
        assert_eq!(e, "engine.systems_path: systems_path conflicts with systems_paths");
        assert!(migrate(json!({"systems_path": "/a,/b"})).unwrap_err().contains("not a comma-separated list"));
        assert!(migrate(json!({"systems_path": ""})).unwrap_err().contains("nonempty"));
        assert!(migrate(json!({"systems_path": 3})).unwrap_err().contains("must be a path"));
        // Through the file reader, overrides included.
        let dir = std::env::temp_dir().join(format!("servesim-systems-path-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = dir.join("c.yaml");
        std::fs::write(&cfg, "engine: {model: m}\n").unwrap();
        let t = load_tree(&cfg, &["engine.systems_path=/data/c".to_string()]).unwrap();
        assert_eq!(t["engine"]["systems_paths"], json!(["/data/c"]));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// SGLang's host-loop replay is accepted on the roles the reference gives it (aggregated, and
    /// prefill in disaggregated mode) with the reference's gates; its frontend stages and host
    /// cost tables are refused by name; on decode it stays an unknown key, as there.
    #[test]
    fn host_loop_is_gated_as_in_the_reference() {
        let config_with = |backend: &str, role: &str, extra: Value| {
            let mut worker = json!({"kv_cache": {"capacity": {"type": "fixed", "blocks": 100}},
                                    "timing": {"type": "fixed", "prefill_ms": 1, "decode_ms": 1}});
            for (k, v) in extra.as_object().unwrap() {
                worker[k] = v.clone();
            }
            let mut workers = json!({});
            workers[role] = worker;
            if role != "aggregated" {
                let other = if role == "prefill" { "decode" } else { "prefill" };
                workers[other] = json!({"kv_cache": {"capacity": {"type": "fixed", "blocks": 100}},
                                        "timing": {"type": "fixed", "prefill_ms": 1, "decode_ms": 1}});
            }
            let mode = if role == "aggregated" { "aggregated" } else { "disaggregated" };
            let mut root = json!({"engine": {"mode": mode, "backend": backend, "model": "m", "hardware": "h",
                                             "context_length": 1024, "workers": workers}});
            if mode == "disaggregated" {
                root["engine"]["kv_transfer"] = json!({"bandwidth_gb_per_second": 50});
            }
            schema::read_predict(&root).map_err(|e| e.to_string())
        };
        let config = |role: &str, extra: Value| config_with("sglang", role, extra).map(|_| ());
        let host_loop = |role: &str, extra: Value| {
            let c = config_with("sglang", role, extra).unwrap();
            [c.engine.aggregated, c.engine.prefill].into_iter().flatten().any(|w| w.host_loop)
        };
        assert!(!host_loop("aggregated", json!({"host_loop": false})));
        assert!(!host_loop("aggregated", json!({})));
        assert!(host_loop("aggregated", json!({"host_loop": true})));
        assert!(host_loop("prefill", json!({"host_loop": true})));
        let e = config_with("vllm", "aggregated", json!({"host_loop": true})).map(|_| ()).unwrap_err();
        assert_eq!(e, "engine.workers.aggregated.host_loop: host_loop is supported only for backend=sglang");
        let e = config("aggregated", json!({"host_loop": true, "parallelism": {"attention_data": 2}})).unwrap_err();
        assert!(e.starts_with("engine.workers.aggregated.host_loop: native VL replay requires"), "{e}");
        assert!(e.contains("attention_data=1"), "{e}");
        let e = config("aggregated", json!({"host_loop": true, "frontend": {"stages": []}})).unwrap_err();
        assert_eq!(e, "engine.workers.aggregated.frontend.stages: needs at least one stage");
        // Frontend stages imply the host loop, which `host_loop: false` contradicts.
        assert!(host_loop("prefill", json!({"frontend": {"stages": [{"service_ms": 1}]}})));
        let e = config("aggregated", json!({"host_loop": false, "frontend": {"stages": [{"service_ms": 1}]}}));
        assert_eq!(
            e.unwrap_err(),
            "engine.workers.aggregated.host_loop: frontend stages run ahead of the scheduler loop; drop host_loop: false"
        );
        // The vision tower needs images to encode (native VL replay, `vl.rs`), and SGLang.
        let e = config("prefill", json!({"vision": {}})).unwrap_err();
        assert_eq!(e, "engine.workers.prefill.vision: workers.prefill.vision requires traffic.source.images");
        let e = config_with("vllm", "aggregated", json!({"vision": {"cache_mib": 0}})).map(|_| ()).unwrap_err();
        assert_eq!(e, "engine.workers.aggregated.vision: vision is supported only for backend=sglang");
        let e = config("aggregated", json!({"vision": {"encoder_parallel": "ep"}})).unwrap_err();
        assert!(e.starts_with("engine.workers.aggregated.vision.encoder_parallel:"), "{e}");
        assert!(config("decode", json!({"host_loop": true})).unwrap_err().contains("unknown key"));
        // Every reference mode is accepted, in any case (servesim-perf refuses the op families
        // it has no estimate for, by name, when the timing is built).
        for m in ["SOL", "sol", "Sol", "silicon", "HYBRID", "empirical", "Empirical"] {
            let timing = json!({"type": "default", "database_mode": m});
            assert_eq!(config("aggregated", json!({"timing": timing})), Ok(()), "{m}");
        }
        let timing = json!({"type": "default", "database_mode": "ROOFLINE"});
        let e = config("aggregated", json!({"timing": timing})).unwrap_err();
        assert!(e.contains("database_mode: unknown value \"ROOFLINE\""), "{e}");
        // An estimator setting on fixed timing is refused, as the reference refuses it.
        let timing = json!({"type": "fixed", "prefill_ms": 1, "decode_ms": 1, "database_mode": "SOL"});
        let e = config("aggregated", json!({"timing": timing})).unwrap_err();
        assert_eq!(e, "engine.workers.aggregated.timing.database_mode: estimator settings require default timing");
    }

    /// The recurrent-state cache (`kv_cache.state_cache`, `prefix_match_unit`): the reference's
    /// checks in its words; a valid one is accepted on an aggregated worker.
    #[test]
    fn state_cache_is_checked_as_the_reference_checks_it() {
        let config = |backend: &str, worker: Value| {
            let root = json!({"engine": {"mode": "aggregated", "backend": backend, "model": "m", "hardware": "h",
                                         "context_length": 1024, "workers": {"aggregated": worker}}});
            schema::read_predict(&root).map(|_| ()).map_err(|e| e.to_string())
        };
        let fixed = |extra: Value| {
            let mut kv = json!({"block_size": 16, "bytes_per_token": 1024,
                                "capacity": {"type": "fixed", "blocks": 5}});
            kv.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            json!({"kv_cache": kv, "timing": {"type": "fixed", "prefill_ms": 1, "decode_ms": 1}})
        };
        let state = json!({"bytes_per_request": 65536});
        for (kv, want) in [
            (
                json!({"prefix_match_unit": 4}),
                "kv_cache.prefix_match_unit: prefix_match_unit currently requires state_cache",
            ),
            (
                json!({"prefix_match_unit": 5, "state_cache": state}),
                "prefix_match_unit must be a positive divisor of block_size",
            ),
            (
                json!({"prefix_match_unit": 0, "state_cache": state}),
                "kv_cache.prefix_match_unit: must be a positive integer",
            ),
            (
                json!({"state_cache": {"bytes_per_request": 0}}),
                "state_cache.bytes_per_request: must be a positive integer",
            ),
            (json!({"state_cache": {"bytes": 1}}), "state_cache.bytes: unknown key"),
            (json!({"state_cache": {"mamba_cache_dtype": "bfloat16"}}), "state_cache.mamba_cache_dtype: unknown value"),
            (
                json!({"state_cache": state, "host_offload": {"num_host_blocks": 10}}),
                "state_cache supports G1 only; host_offload is not supported",
            ),
            (
                json!({"state_cache": state, "block_size": 1, "capacity": {"type": "fixed", "blocks": 100000}}),
                "state_cache requires block_size at least two for vLLM",
            ),
            // 65536 bytes are 4 blocks of 16 tokens × 1024 bytes: 5 blocks fit them and one token block.
            (
                json!({"state_cache": {"bytes_per_request": 65537}}),
                "state_cache capacity must fit one token block and one request state",
            ),
        ] {
            let e = config("vllm", fixed(kv.clone())).unwrap_err();
            assert!(e.contains(want), "{kv}: {e}");
        }
        assert_eq!(config("vllm", fixed(json!({"state_cache": state}))), Ok(()));
        assert_eq!(config("vllm", fixed(json!({"state_cache": state, "prefix_match_unit": 4}))), Ok(()));
        let e = config("vllm", json!({"kv_cache": {"state_cache": state}})).unwrap_err();
        assert!(e.ends_with("kv_cache.state_cache: state_cache requires fixed capacity (blocks or bytes)"), "{e}");
        let e = config("vllm", json!({"kv_cache": {"state_cache": state, "capacity": {"type": "fixed", "blocks": 9}}}))
            .unwrap_err();
        assert!(e.contains("manual KV capacity requires explicit positive block_size within u64"), "{e}");
        let e = config("sglang", fixed(json!({"state_cache": state}))).unwrap_err();
        assert!(e.contains("state_cache requires backend=vllm and mode=aggregated or disaggregated (G1 only)"), "{e}");
        // Without bytes_per_request the state is sized from the model when lowered
        // (`state_size`), on vLLM only; the fixed capacity may then be in bytes.
        let auto = json!({"state_cache": {}, "capacity": {"type": "fixed", "bytes": 1 << 30}});
        assert_eq!(config("vllm", fixed(auto.clone())), Ok(()));
        let e = config("sglang", fixed(auto)).unwrap_err();
        assert!(e.contains("state_cache requires backend=vllm and mode=aggregated or disaggregated (G1 only)"), "{e}");
    }
}
