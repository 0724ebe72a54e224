//! `recommend -c` with an analytical encoder pool (EPD), as aisimulate 0.13 searches one
//! (`sweeper/epd.py`): `engine.workers.encoder` takes `tensor`, `replicas` and `batch_size` as
//! a value or `{choices: [...]}`. Before the search the pool's rows are resolved once per
//! backend (`crate::epd::Pool::rows`: every tensor width the vision tower and the system's NCCL
//! data allow, each batch that fits the GPU and raises the requests a second), each row crossed
//! with every replica count whose GPUs stay below the budget; that catalog is one more knob of
//! each branch (the last), so every language candidate is tried beside every pool. A candidate
//! whose language and encoder GPUs together pass the budget is infeasible (`gpu_budget`);
//! one that runs is the language side replayed at its visual-token prompts with the pool laid
//! over its means (`crate::epd::overlay`), so its score, strict-SLA check and GPUs count the
//! pool. Ties rank as the reference's do: by the resolved pool, field by field.
//!
//! The reference's rules on what an analytical pool is searched beside are checked in its
//! words. A bayesian search sees the pool as the reference's surrogate sees its categorical
//! `encoder_candidate`: one 0/1 feature per pool of the catalog (`Space::raw_features`).

use serde_json::{json, Map, Value};

use super::record::Trial;
use super::space::{get, Knob, Optimization};
use crate::epd::{overlay, Pool};
use crate::error::DeployError;
use crate::schema;

const KEY: &str = "engine.workers.encoder";

/// The searched keys of `engine.workers.encoder`.
const DOMAINS: [&str; 3] = ["tensor", "replicas", "batch_size"];

/// The encoder catalog of a search: per backend, the concrete `engine.workers.encoder`
/// sections its candidates take, in the reference's order (tensor, batch, then replicas as
/// listed).
pub(super) struct Catalog {
    per_backend: Vec<(&'static str, Vec<Value>)>,
}

impl Catalog {
    /// The knob of a branch of `backend`.
    pub(super) fn knob(&self, backend: &str) -> Knob {
        let values = self.per_backend.iter().find(|(b, _)| *b == backend).map(|(_, v)| v.clone()).unwrap_or_default();
        Knob::new(vec!["engine".into(), "workers".into(), "encoder".into()], values)
    }
}

/// One searched key: a positive integer or `{choices: [...]}` of distinct positive integers.
fn domain(section: &Map<String, Value>, key: &str, default: u32) -> Result<Vec<u32>, DeployError> {
    let path = format!("{KEY}.{key}");
    let one = |p: &str, v: &Value| -> Result<u32, DeployError> {
        let n = v.as_u64().filter(|n| *n > 0 && v.is_u64()).and_then(|n| u32::try_from(n).ok());
        let n = n.ok_or_else(|| DeployError::new(p, format!("must be a positive integer, got {v}")))?;
        if key == "batch_size" && n > 8 {
            return Err(DeployError::new(p, format!("must be at most 8 (SGLANG_ENCODER_MAX_BATCH_SIZE), got {n}")));
        }
        Ok(n)
    };
    match section.get(key) {
        None | Some(Value::Null) => Ok(vec![default]),
        Some(Value::Object(m)) if m.keys().eq(["choices"]) => {
            let items =
                m["choices"].as_array().ok_or_else(|| DeployError::new(format!("{path}.choices"), "must be a list"))?;
            if items.is_empty() {
                return Err(DeployError::new(format!("{path}.choices"), "choices must be a nonempty list"));
            }
            let mut out = Vec::new();
            for (i, v) in items.iter().enumerate() {
                let n = one(&format!("{path}.choices[{i}]"), v)?;
                if out.contains(&n) {
                    return Err(DeployError::new(format!("{path}.choices"), "choices must contain unique values"));
                }
                out.push(n);
            }
            Ok(out)
        }
        Some(Value::Object(_)) => Err(DeployError::new(
            path,
            "an encoder domain is a value or {choices: [...]} (the reference takes no ranges here)",
        )),
        Some(v) => Ok(vec![one(&path, v)?]),
    }
}

/// Reads `engine.workers.encoder` of a recommend configuration (None without one), checks the
/// reference's rules of an analytical EPD search, and resolves the pool's catalog for each
/// backend.
pub(super) fn read(
    base: &Value,
    root: &Value,
    optimization: &Optimization,
    sla: &schema::Sla,
    backends: &[&'static str],
) -> Result<Option<Catalog>, DeployError> {
    let Some(section) = get(base, &["engine", "workers", "encoder"]).filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let section = section.as_object().ok_or_else(|| DeployError::new(KEY, "must be a mapping"))?;
    let native = section.get("mode").and_then(Value::as_str) == Some("native");
    let tensors = domain(section, "tensor", 1)?;
    let replicas = domain(section, "replicas", 1)?;
    let batches = domain(section, "batch_size", 1)?;
    if native {
        return read_native(base, root, section, optimization, backends, (&tensors, &replicas, &batches)).map(Some);
    }
    // The configuration's own rules first (images beside the pool, a fixed concurrency: the
    // predict schema's, read on a probe of the pool per backend), as the reference reads its
    // recommend configuration before it compiles the search.
    if super::load::varies(base) {
        return Err(DeployError::new(
            "traffic.load",
            "analytical EPD requires fixed synthetic concurrency, not rate or load search",
        ));
    }
    let probes = backends
        .iter()
        .map(|&b| Ok((b, schema::read_predict(&probe(base, section, b, tensors[0], batches[0]))?)))
        .collect::<Result<Vec<_>, DeployError>>()?;
    // Then the search's rules of an analytical pool (`SmartSearchConfig._validate_epd` and its
    // goal checks), in the reference's words.
    let constraints = root.pointer("/optimization/constraints");
    if constraints.and_then(|c| c.get("min_goodput_rps")).is_some_and(|v| !v.is_null()) {
        return Err(DeployError::new(
            "optimization.constraints.min_goodput_rps",
            "analytical EPD cannot enforce min_goodput_rps",
        ));
    }
    budget_and_version_gates(constraints, section, backends)?;
    let targets: &[&str] =
        if optimization.target == "pareto" { &optimization.pareto_objectives } else { &[optimization.target] };
    let bounded = sla.ttft_ms.is_some() || sla.itl_ms.is_some() || sla.e2e_ms.is_some();
    let aggregate = optimization.strict_sla || optimization.target == "min_gpus";
    if targets.iter().any(|t| matches!(*t, "goodput" | "goodput_per_gpu")) || (bounded && !aggregate) {
        return Err(DeployError::new(
            "optimization",
            "analytical EPD supports aggregate strict_sla, not per-request goodput (set optimization.strict_sla: \
             true to gate the SLA on the overlay's aggregate means)",
        ));
    }
    // The catalog, once per backend: the pool does not depend on the language shape.
    let mut per_backend = Vec::new();
    for (backend, config) in probes {
        let rows = Pool::rows(&config, &tensors, &batches)?.expect("images and an encoder pool (checked when read)");
        let mut values = Vec::new();
        for row in &rows {
            for &w in &replicas {
                if u64::from(row.tp) * u64::from(w) >= u64::from(optimization.budget) {
                    continue;
                }
                let mut v = section.clone();
                v.insert("tensor".into(), json!(row.tp));
                v.insert("replicas".into(), json!(w));
                v.insert("batch_size".into(), json!(row.batch_size));
                values.push(Value::Object(v));
            }
        }
        per_backend.push((backend, values));
    }
    if per_backend.iter().all(|(_, v)| v.is_empty()) {
        return Err(DeployError::new(KEY, "no feasible encoder pool for the requested shape and GPU budget"));
    }
    Ok(Some(Catalog { per_backend }))
}

/// The gates an analytical and a native pool share, in the reference's words: a GPU budget
/// without a floor, and a pinned encoder version only with one backend.
fn budget_and_version_gates(
    constraints: Option<&Value>,
    section: &Map<String, Value>,
    backends: &[&'static str],
) -> Result<(), DeployError> {
    if constraints.and_then(|c| c.get("min_candidate_gpus")).is_some_and(|v| !v.is_null()) {
        return Err(DeployError::new(
            "optimization.constraints.min_candidate_gpus",
            "EPD currently supports gpu_budget only, not min_gpu_budget",
        ));
    }
    if section.get("backend_version").is_some_and(|v| !v.is_null()) && backends.len() != 1 {
        return Err(DeployError::new(
            format!("{KEY}.backend_version"),
            "encoder.backend_version requires a single backend",
        ));
    }
    Ok(())
}

/// The catalog around a native pool (`engine.workers.encoder.mode: native`): every tensor width
/// crossed with every server count, in the order listed, each gated at its own server count
/// (`Pool::native`: the batch cap's memory at the parts one server batches) and kept when its
/// GPUs stay below the budget. A candidate replays the pool event by event beside its
/// language workers (`predict -c`'s replay), so the analytical overlay's rules on loads, goals
/// and SLAs do not apply; the pool takes one batch cap.
fn read_native(
    base: &Value,
    root: &Value,
    section: &Map<String, Value>,
    optimization: &Optimization,
    backends: &[&'static str],
    (tensors, replicas, batches): (&[u32], &[u32], &[u32]),
) -> Result<Catalog, DeployError> {
    // The reference reads the pool's own settings (its link and stages) first, then its one
    // batch cap, then the rest of the configuration.
    let given = |k: &str| section.get(k).is_some_and(|v| !v.is_null());
    let one_cap = || -> Result<(), DeployError> {
        if batches.len() != 1 {
            return Err(DeployError::new(
                format!("{KEY}.batch_size"),
                "native encoder replay takes one batch cap, not a batch_size search",
            ));
        }
        Ok(())
    };
    if given("transfer") && given("frontend") != given("host_profile") {
        one_cap()?;
    }
    // The pool's probe runs at a fixed load: a native pool's search may search the load.
    let probes = backends
        .iter()
        .map(|&b| {
            let mut tree = probe(base, section, b, tensors[0], batches[0]);
            if let Some(t) = tree.get_mut("traffic").and_then(Value::as_object_mut) {
                t.insert("load".into(), json!({"type": "concurrency", "concurrency": 1}));
            }
            Ok((b, schema::read_predict(&tree)?))
        })
        .collect::<Result<Vec<_>, DeployError>>()?;
    one_cap()?;
    let constraints = root.pointer("/optimization/constraints");
    budget_and_version_gates(constraints, section, backends)?;
    let mut per_backend = Vec::new();
    for (backend, mut config) in probes {
        // The stages a saved candidate carries: a host cost table's row, resolved once.
        let frontend = crate::encpool::frontend_json(&config)?;
        let mut rejected = Vec::new();
        let mut values = Vec::new();
        for &tp in tensors {
            for &w in replicas {
                if let Some(e) = config.engine.encoder.as_mut() {
                    e.tensor = tp;
                    e.replicas = w;
                }
                match Pool::native(&config, tp, w)? {
                    Err(why) => rejected.push(format!("tp={tp} workers={w}: {why}")),
                    Ok(_) if u64::from(tp) * u64::from(w) >= u64::from(optimization.budget) => {}
                    Ok(_) => {
                        let mut v = section.clone();
                        v.insert("tensor".into(), json!(tp));
                        v.insert("replicas".into(), json!(w));
                        v.insert("batch_size".into(), json!(batches[0]));
                        if let Some(f) = &frontend {
                            v.remove("host_profile");
                            v.insert("frontend".into(), f.clone());
                        }
                        values.push(Value::Object(v));
                    }
                }
            }
        }
        if rejected.len() == tensors.len() * replicas.len() {
            return Err(DeployError::new(
                KEY,
                format!("native encoder: no feasible tp/workers; {}", rejected.join("; ")),
            ));
        }
        per_backend.push((backend, values));
    }
    if per_backend.iter().all(|(_, v)| v.is_empty()) {
        return Err(DeployError::new(KEY, "no feasible encoder pool for the requested shape and GPU budget"));
    }
    Ok(Catalog { per_backend })
}

/// A predict configuration of the pool alone: the search's traffic and engine identity, one
/// encoder row and a one-GPU aggregated language worker (the pool does not depend on it).
fn probe(base: &Value, section: &Map<String, Value>, backend: &str, tensor: u32, batch: u32) -> Value {
    let engine = &base["engine"];
    let mut encoder = section.clone();
    for key in DOMAINS {
        encoder.remove(key);
    }
    encoder.insert("tensor".into(), json!(tensor));
    encoder.insert("batch_size".into(), json!(batch));
    let mut e = Map::new();
    e.insert("mode".into(), json!("aggregated"));
    e.insert("backend".into(), json!(backend));
    for key in ["model", "hardware", "context_length", "systems_paths"] {
        if let Some(v) = engine.get(key) {
            e.insert(key.into(), v.clone());
        }
    }
    match engine.get("backend_version") {
        Some(Value::Object(m)) => {
            if let Some(v) = m.get(backend) {
                e.insert("backend_version".into(), v.clone());
            }
        }
        Some(v) => {
            e.insert("backend_version".into(), v.clone());
        }
        None => {}
    }
    e.insert(
        "workers".into(),
        json!({"encoder": encoder, "aggregated": {"parallelism": {"replicas": 1, "tensor": 1}}}),
    );
    let mut t = Map::new();
    if let Some(traffic) = base.get("traffic") {
        t.insert("traffic".into(), traffic.clone());
    }
    t.insert("engine".into(), Value::Object(e));
    Value::Object(t)
}

/// Whether a candidate runs beside an encoder pool.
pub(super) fn has_pool(tree: &Value) -> bool {
    get(tree, &["engine", "workers", "encoder"]).is_some_and(|v| !v.is_null())
}

/// Whether a candidate runs beside an analytical encoder pool (the overlay); a native pool is
/// replayed with its language workers as `predict -c` replays it.
pub(super) fn has_analytical_pool(tree: &Value) -> bool {
    get(tree, &["engine", "workers", "encoder"])
        .is_some_and(|v| !v.is_null() && v.get("mode").and_then(Value::as_str) != Some("native"))
}

/// GPUs of a candidate's encoder pool (0 without one): tensor × replicas.
pub(super) fn encoder_gpus(tree: &Value) -> u64 {
    let Some(e) = get(tree, &["engine", "workers", "encoder"]).filter(|v| !v.is_null()) else { return 0 };
    let f = |k: &str| e.get(k).and_then(Value::as_u64).unwrap_or(1);
    f("tensor").saturating_mul(f("replicas"))
}

/// The reason a candidate over the GPU budget gives.
pub(super) const OVER_BUDGET: &str = "language plus encoder pool exceeds gpu_budget";

/// Runs a candidate with an encoder pool: the language replay, then the overlay. Its summary
/// is the overlay's (without `total_gpus`, which the reference keeps in the metadata) and the
/// resolved pool under `encoder` (the ranking's tie order reads it).
pub(super) fn simulate(t: &mut Trial, base_dir: &std::path::Path) {
    if let Err((status, category, why)) = run(t, base_dir) {
        t.status = status;
        t.reason_category = Some(category);
        t.reason = Some(why);
    }
}

type Failure = (&'static str, &'static str, String);

fn run(t: &mut Trial, base_dir: &std::path::Path) -> Result<(), Failure> {
    let fail = |status: &'static str, category: &'static str, why: String| Err((status, category, why));
    let config = match schema::read_predict(&t.tree) {
        Ok(c) => c,
        Err(e) => return fail("unsupported", "candidate_materialization", e.to_string()),
    };
    let pool = match Pool::resolve(&config) {
        Ok(Some(p)) => p,
        Ok(None) => return fail("unsupported", "candidate_materialization", format!("{KEY}: missing")),
        Err(e) => return fail("failed", "candidate_materialization", format!("candidate build failed: {e}")),
    };
    let mut p = match crate::prepare(pool.language(&config), base_dir) {
        Ok(p) => p,
        Err(e) => {
            let kv = e.message.contains("KV") || e.key.contains("kv_cache");
            return if kv {
                fail("infeasible", "kv_capacity", e.to_string())
            } else {
                fail("unsupported", "candidate_materialization", e.to_string())
            };
        }
    };
    p.sim.threads = 1;
    let ran = match p.run().go(&mut ()) {
        Ok(r) => r,
        Err(e) => return fail("failed", "replay_runtime", e.to_string()),
    };
    if let Some(e) = p.workload.take_error() {
        return fail("failed", "replay_runtime", e.to_string());
    }
    match overlay(&p, &pool, &ran.report) {
        Ok(doc) => {
            let mut summary = doc["summary"].as_object().cloned().unwrap_or_default();
            summary.remove("total_gpus");
            summary.insert("encoder".into(), pool.to_json());
            t.summary = summary;
            Ok(())
        }
        Err(e) => fail("failed", "replay_runtime", e.to_string()),
    }
}

/// The tree the ranking breaks ties on: a candidate's own, with its encoder section replaced by
/// the resolved pool (the reference compares its candidates' configs, whose `encoder` is the
/// resolved pool, key by key).
pub(super) fn tie_tree(t: &Trial) -> std::borrow::Cow<'_, Value> {
    match t.summary.get("encoder") {
        Some(pool) if has_pool(&t.tree) => {
            let mut tree = t.tree.clone();
            if let Some(w) = tree.pointer_mut("/engine/workers").and_then(Value::as_object_mut) {
                w.insert("encoder".into(), pool.clone());
            }
            std::borrow::Cow::Owned(tree)
        }
        _ => std::borrow::Cow::Borrowed(&t.tree),
    }
}
