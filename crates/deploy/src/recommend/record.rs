//! One evaluated candidate ([`Trial`]) and the form shard files and cache entries keep it in:
//! floats as their exact bits, a digest of the values so an edited or damaged record is not
//! read back.

use serde_json::{json, Map, Value};

use super::space::get;

/// One evaluated candidate.
#[derive(Clone, Debug)]
pub struct Trial {
    pub tree: Value,
    pub used_gpus: u64,
    pub status: &'static str,
    pub reason_category: Option<&'static str>,
    pub reason: Option<String>,
    pub summary: Map<String, Value>,
}

pub(super) fn used_gpus(tree: &Value) -> u64 {
    if let Some(g) = super::afd::used_gpus(tree) {
        return g;
    }
    let mut g = super::epd::encoder_gpus(tree);
    if let Some(w) = get(tree, &["engine", "workers"]).and_then(Value::as_object) {
        for p in w.values().filter_map(|r| r.get("parallelism")) {
            let f = |k: &str| p.get(k).and_then(Value::as_u64).unwrap_or(1);
            g += f("replicas") * f("tensor") * f("pipeline") * f("attention_data");
        }
    }
    g
}

/// `v` (an object) with a `digest` of its other values added.
pub fn with_digest(mut v: Value) -> Value {
    let d = content_digest(&v);
    v.as_object_mut().expect("an object").insert("digest".into(), json!(d));
    v
}

/// The digest of an object's values other than its own `digest`.
fn content_digest(v: &Value) -> String {
    let mut rest = v.clone();
    if let Some(o) = rest.as_object_mut() {
        o.remove("digest");
    }
    blake3::hash(canonical(&rest).as_bytes()).to_hex().to_string()
}

/// Whether an object's `digest` matches its values (it was not edited or damaged since).
pub fn digest_holds(v: &Value) -> bool {
    v.get("digest").and_then(Value::as_str).is_some_and(|d| d == content_digest(v))
}

/// Floats as `{"f64": "<16 hex digits>"}` so a cached summary reads back bit for bit.
fn exact_floats(v: &Value) -> Value {
    match v {
        Value::Number(n) if n.is_f64() => json!({"f64": format!("{:016x}", n.as_f64().unwrap().to_bits())}),
        Value::Array(a) => Value::Array(a.iter().map(exact_floats).collect()),
        Value::Object(m) => Value::Object(m.iter().map(|(k, v)| (k.clone(), exact_floats(v))).collect()),
        v => v.clone(),
    }
}

fn from_exact_floats(v: &Value) -> Option<Value> {
    Some(match v {
        Value::Object(m) if m.len() == 1 && m.contains_key("f64") => {
            let bits = u64::from_str_radix(m["f64"].as_str()?, 16).ok()?;
            Value::Number(serde_json::Number::from_f64(f64::from_bits(bits))?)
        }
        Value::Array(a) => Value::Array(a.iter().map(from_exact_floats).collect::<Option<_>>()?),
        Value::Object(m) => Value::Object(
            m.iter().map(|(k, v)| Some((k.clone(), from_exact_floats(v)?))).collect::<Option<Map<_, _>>>()?,
        ),
        v => v.clone(),
    })
}

pub(super) fn canonical(v: &Value) -> String {
    serde_json::to_string(&crate::sorted(v)).expect("serialises")
}

/// A trial as a shard file keeps it (the candidate is named by its index; the tree is rebuilt
/// from the configuration when shards are merged). Floats are kept as their exact bits:
/// serde_json's default parser can read a printed float back one ulp off, and merged shards
/// must equal one run byte for byte.
pub fn trial_json(index: usize, t: &Trial) -> Value {
    with_digest(json!({
        "index": index,
        "status": t.status,
        "reason_category": t.reason_category,
        "reason": t.reason,
        "used_gpus": t.used_gpus,
        "summary": exact_floats(&Value::Object(t.summary.clone())),
    }))
}

const STATUSES: [&str; 6] = ["feasible", "infeasible", "unsupported", "timed_out", "failed", "resource_limited"];
const CATEGORIES: [&str; 15] = [
    "gpu_budget",
    "kv_capacity",
    "sla_constraint",
    "load_constraint",
    "backend_topology",
    "runtime_timeout",
    "resource_limit",
    "candidate_materialization",
    "replay_runtime",
    "runner_contract",
    "invalid_metrics",
    "no_samples",
    "parallel_projection",
    "adapter_constraint",
    "unknown",
];

/// A trial's fields from a shard record or a cache entry (floats kept as bits).
pub(super) fn trial_fields(v: &Value, tree: Value) -> Option<Trial> {
    let status = STATUSES.iter().copied().find(|s| v.get("status").and_then(Value::as_str) == Some(*s))?;
    let reason_category = match v.get("reason_category")? {
        Value::Null => None,
        c => Some(CATEGORIES.iter().copied().find(|s| c.as_str() == Some(*s))?),
    };
    let reason = v.get("reason")?.as_str().map(str::to_string);
    let used_gpus = v.get("used_gpus")?.as_u64()?;
    // The GPU count is the candidate's own: a record that says otherwise is not its record.
    if used_gpus != self::used_gpus(&tree) {
        return None;
    }
    let summary = v.get("summary")?;
    let summary = from_exact_floats(summary)?;
    let summary = summary.as_object()?.clone();
    Some(Trial { tree, used_gpus, status, reason_category, reason, summary })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_floats_read_back_bit_for_bit() {
        let v = json!({"a": 0.1 + 0.2, "b": [1e-300, 5e-324, -0.0, 123456.789e10], "c": 7, "d": "x"});
        assert_eq!(from_exact_floats(&exact_floats(&v)).unwrap(), v);
        let text = serde_json::to_string(&exact_floats(&v)).unwrap();
        let back = from_exact_floats(&serde_json::from_str(&text).unwrap()).unwrap();
        assert_eq!(back["a"].as_f64().unwrap().to_bits(), (0.1f64 + 0.2).to_bits());
    }
}
