//! The traffic load of a search: its search domains (`traffic.load.{concurrency,
//! requests_per_second, sessions_per_second, fraction, speedup}` as `{choices}` or a stepped
//! `{range}`, one knob each, searched after the workers' knobs as the reference's
//! `traffic_load`), and the KV-relative load `type: kv_capacity_fraction`, which each candidate
//! turns into a closed-loop concurrency sized from its own KV cache (the reference's
//! `resolve_kv_load`) before it runs, so its record replays under `predict -c` as it stands.

use serde_json::{json, Value};

use super::limits::{decimal_steps, doublings};
use super::space::{get, Knob, Sampled};
use crate::error::DeployError;
use crate::reader::ErrAt;
use crate::schema;
use servesim_config::Reader;

/// The load keys that take a search domain; only `concurrency` is an integer.
const LOAD_DOMAINS: [&str; 5] = ["concurrency", "requests_per_second", "sessions_per_second", "fraction", "speedup"];

/// The load's searched keys, as knobs over `traffic.load.<key>`; checks the KV-relative load's
/// own rules (a synthetic source, a `fraction`). With `random` (the reference's random draw), a
/// range the reference samples by value (a log range, or a linear one without a step) is
/// sampled by value: its knob lists only its lower bound, as a stand-in.
pub(super) fn load_knobs(base: &Value, random: bool) -> Result<Vec<Knob>, DeployError> {
    let Some(load) = get(base, &["traffic", "load"]).filter(|l| l.is_object()) else { return Ok(Vec::new()) };
    if load.get("type").and_then(Value::as_str) == Some("kv_capacity_fraction") {
        if load.get("fraction").is_none_or(Value::is_null) {
            return Err(DeployError::new("traffic.load", "traffic.load.type='kv_capacity_fraction' requires fraction"));
        }
        if get(base, &["traffic", "source", "type"]).and_then(Value::as_str) == Some("trace") {
            return Err(DeployError::new("traffic", "trace traffic requires trace_timestamps or concurrency load"));
        }
    }
    let mut knobs = Vec::new();
    for key in LOAD_DOMAINS {
        let Some(v) = load.get(key).filter(|v| v.is_object()) else { continue };
        let path = format!("traffic.load.{key}");
        let integer = key == "concurrency";
        let kpath: Vec<String> = ["traffic", "load", key].iter().map(|s| s.to_string()).collect();
        match by_value(v, integer).filter(|_| random) {
            Some(sampled @ Sampled::Continuous { min, max, .. }) => {
                // The range checked as a grid reads it (keys, bounds), then sampled by value.
                let mut checked = v.clone();
                if let Some(r) = checked.get_mut("range").and_then(Value::as_object_mut) {
                    if !integer {
                        r.remove("scale");
                        r.insert("step".into(), json!(max - min));
                    }
                }
                positive_numbers(&path, &checked, integer)?;
                let stand_in = if integer { json!(min as u64) } else { json!(min) };
                knobs.push(Knob { sampled: Some(sampled), ..Knob::new(kpath, vec![stand_in]) });
            }
            _ => knobs.push(Knob::new(kpath, positive_numbers(&path, v, integer)?)),
        }
    }
    Ok(knobs)
}

/// A domain of positive numbers (a load, a memory fraction): `{choices: [...]}` (unique) or
/// `{range: {min, max, step}}` (linear, both bounds included; integer log ranges are the powers
/// of two from `min`). The reference samples a range without a step continuously; a grid cannot,
/// so it is refused.
pub(super) fn positive_numbers(path: &str, v: &Value, integer: bool) -> Result<Vec<Value>, DeployError> {
    let mut o = Reader::mapping(path, v)?;
    let kind = if integer { "a positive integer" } else { "a positive number" };
    let one = |p: &str, x: &Value| -> Result<Value, DeployError> {
        let ok = if integer { x.as_u64().filter(|&n| n > 0).map(|n| json!(n)) } else { positive(x).map(|f| json!(f)) };
        ok.ok_or_else(|| DeployError::new(p, format!("must be {kind}, got {x}")))
    };
    let out = if let Some(c) = o.value("choices") {
        let items = c.as_array().ok_or_else(|| DeployError::new(format!("{path}.choices"), "must be a list"))?;
        if items.is_empty() {
            return Err(DeployError::new(format!("{path}.choices"), "choices must be non-empty"));
        }
        let mut vals: Vec<Value> = Vec::with_capacity(items.len());
        for (i, x) in items.iter().enumerate() {
            let x = one(&format!("{path}.choices[{i}]"), x)?;
            if vals.contains(&x) {
                return Err(DeployError::new(format!("{path}.choices"), "choices must be unique"));
            }
            vals.push(x);
        }
        vals
    } else if let Some(mut r) = o.obj("range")? {
        let here = r.here().to_string();
        let min = r.number("min")?.ok_or_else(|| r.err("min", "missing (required)"))?;
        let max = r.number("max")?.ok_or_else(|| r.err("max", "missing (required)"))?;
        let step = r.number("step")?;
        let scale = r.one_of("scale", &["linear", "log"])?.unwrap_or("linear");
        r.finish()?;
        if !(min.is_finite() && max.is_finite() && min <= max) {
            return Err(DeployError::new(here, "a range requires finite min <= max"));
        }
        if min <= 0.0 {
            return Err(DeployError::new(here, format!("{path} range requires min > 0")));
        }
        if integer && (min.fract() != 0.0 || max.fract() != 0.0 || step.is_some_and(|s| s.fract() != 0.0)) {
            return Err(DeployError::new(here, "an integer range takes integer min, max and step"));
        }
        if min == max {
            vec![one(&here, &if integer { json!(min as u64) } else { json!(min) })?]
        } else {
            match (scale, step) {
                ("linear", Some(s)) if s > 0.0 && s.is_finite() => decimal_steps(&here, min, max, s)?
                    .into_iter()
                    .map(|x| if integer { json!(x.round() as u64) } else { json!(x) })
                    .collect(),
                ("linear", Some(_)) => return Err(DeployError::new(here, "step must be a positive number")),
                ("log", Some(_)) => return Err(DeployError::new(here, "log ranges reject step")),
                ("log", None) if integer => doublings(min as u64, max as u64).map(|x| json!(x)).collect(),
                _ => {
                    return Err(DeployError::new(
                        here,
                        if integer {
                            "integer linear traffic ranges require step"
                        } else {
                            "a continuous range is sampled by the reference; servesim searches a discrete set \
                             (give step, or choices)"
                        },
                    ))
                }
            }
        }
    } else {
        return Err(DeployError::new(path, "a search domain is {choices: [...]} or {range: {...}}"));
    };
    o.finish()?;
    Ok(out)
}

/// A load range the reference samples by value: a log range, or a linear float range without a
/// step (an integer linear one needs a step), with distinct positive finite bounds.
fn by_value(v: &Value, integer: bool) -> Option<Sampled> {
    let r = v.get("range")?;
    let (min, max) = (r.get("min")?.as_f64()?, r.get("max")?.as_f64()?);
    let log = r.get("scale").and_then(Value::as_str) == Some("log");
    let sampled = log || (!integer && r.get("step").is_none());
    (sampled && min.is_finite() && max.is_finite() && min > 0.0 && min < max).then_some(Sampled::Continuous {
        min,
        max,
        log,
        integer,
    })
}

fn positive(x: &Value) -> Option<f64> {
    x.as_f64().filter(|f| f.is_finite() && *f > 0.0 && !x.is_boolean())
}

/// Whether the candidates' loads differ: a searched load key, or a KV-relative load (each
/// candidate's concurrency its own).
pub(super) fn varies(base: &Value) -> bool {
    get(base, &["traffic", "load"]).and_then(Value::as_object).is_some_and(|l| {
        l.get("type").and_then(Value::as_str) == Some("kv_capacity_fraction")
            || LOAD_DOMAINS.iter().any(|k| l.get(*k).is_some_and(Value::is_object))
    })
}

/// Whether a candidate's load is KV-relative.
fn kv_relative(tree: &Value) -> bool {
    get(tree, &["traffic", "load", "type"]).and_then(Value::as_str) == Some("kv_capacity_fraction")
}

/// The first candidate as the strict pre-run check reads it: a KV-relative load stands in as a
/// concurrency of one (its own value is known only once the candidate's KV cache is sized).
pub(super) fn for_the_check(tree: &mut Value) {
    if kv_relative(tree) {
        tree["traffic"]["load"] = json!({"type": "concurrency", "concurrency": 1});
    }
}

/// Turns a KV-relative load into the concurrency the candidate's KV cache holds at the given
/// fraction: `max(1, floor(fraction × capacity / (isl + ⌊osl / 2⌋)))`, capacity being the load
/// role's (decode when disaggregated) scheduler-visible tokens, block-aligned per rank, times its
/// attention-DP ranks and replicas. `Err` (the reason) when the cache cannot hold one request; a
/// candidate the predict schema refuses is left for its run to report.
pub(super) fn resolve(tree: &mut Value) -> Result<(), String> {
    if !kv_relative(tree) {
        return Ok(());
    }
    let fraction = get(tree, &["traffic", "load", "fraction"]).and_then(positive);
    for_the_check(tree);
    let Some(fraction) = fraction else { return Ok(()) };
    let Ok(config) = schema::read_predict(tree) else { return Ok(()) };
    let (isl, osl) = match &config.traffic.source {
        schema::Source::Synthetic { input_tokens, output_tokens, .. } => (*input_tokens, *output_tokens),
        schema::Source::Session { new_input_tokens, output_tokens, .. } => (*new_input_tokens, *output_tokens),
        schema::Source::Trace { .. } => return Ok(()),
    };
    let e = &config.engine;
    let (role, w) = match (&e.decode, &e.aggregated) {
        (Some(d), _) => ("decode", d),
        (None, Some(a)) => ("agg", a),
        _ => return Ok(()),
    };
    let Some((tokens, _)) = crate::lower::kv_tokens(e, w, w.max_batched_tokens as u64) else { return Ok(()) };
    let block = w.block_size.unwrap_or_else(|| crate::lower::default_block_size(e.backend)) as u64;
    let ranks = w.parallelism.attention_data as u64 * w.parallelism.replicas as u64;
    let capacity = (tokens / block * block).saturating_mul(ranks);
    let expected = isl as u64 + osl as u64 / 2;
    let requests = capacity / expected.max(1);
    if requests < 1 {
        return Err(format!(
            "{role} KV capacity cannot hold one request at {expected} average tokens per in-flight request"
        ));
    }
    let concurrency = ((fraction * requests as f64) as u64).max(1);
    tree["traffic"]["load"]["concurrency"] = json!(concurrency);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn knobs(load: Value) -> Result<Vec<(String, Vec<Value>)>, String> {
        let base = json!({"traffic": {"source": {"type": "synthetic"}, "load": load}});
        load_knobs(&base, false)
            .map(|ks| ks.into_iter().map(|k| (k.path.join("."), k.values)).collect())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn load_domains_are_knobs_over_their_keys() {
        assert_eq!(knobs(json!({"type": "concurrency", "concurrency": 8})).unwrap(), vec![]);
        assert_eq!(
            knobs(json!({"type": "concurrency", "concurrency": {"range": {"min": 4, "max": 12, "step": 4}}})).unwrap(),
            vec![("traffic.load.concurrency".into(), vec![json!(4), json!(8), json!(12)])]
        );
        assert_eq!(
            knobs(json!({"concurrency": {"range": {"min": 2, "max": 20, "scale": "log"}}})).unwrap()[0].1,
            vec![json!(2), json!(4), json!(8), json!(16)]
        );
        // A bound past u64 ends the doublings instead of looping on a saturated value.
        assert_eq!(
            knobs(json!({"concurrency": {"range": {"min": 1, "max": 1e30, "scale": "log"}}})).unwrap()[0].1.len(),
            64
        );
        assert_eq!(
            knobs(json!({"type": "poisson", "requests_per_second": {"range": {"min": 0.1, "max": 0.3, "step": 0.1}}}))
                .unwrap()[0]
                .1,
            vec![json!(0.1), json!(0.2), json!(0.3)]
        );
        assert_eq!(
            knobs(json!({"type": "kv_capacity_fraction", "fraction": {"choices": [0.5, 0.8]}})).unwrap(),
            vec![("traffic.load.fraction".into(), vec![json!(0.5), json!(0.8)])]
        );
        for (load, why) in [
            (
                json!({"type": "poisson", "requests_per_second": {"range": {"min": 1, "max": 4}}}),
                "traffic.load.requests_per_second.range: a continuous range is sampled by the reference",
            ),
            (
                json!({"concurrency": {"range": {"min": 1, "max": 4}}}),
                "traffic.load.concurrency.range: integer linear traffic ranges require step",
            ),
            (
                json!({"concurrency": {"range": {"min": 0, "max": 4, "step": 1}}}),
                "traffic.load.concurrency.range: traffic.load.concurrency range requires min > 0",
            ),
            (json!({"concurrency": {"choices": [4, 4]}}), "traffic.load.concurrency.choices: choices must be unique"),
            (
                json!({"concurrency": {"choices": [2.5]}}),
                "traffic.load.concurrency.choices[0]: must be a positive integer",
            ),
            (json!({"concurrency": {"values": [2]}}), "traffic.load.concurrency: a search domain is"),
        ] {
            let e = knobs(load).unwrap_err();
            assert!(e.starts_with(why), "{e}");
        }
    }

    /// A fixed cache of 1,000 blocks of 16 tokens per rank, attention DP 2, two replicas: 64,000
    /// tokens; requests of 1,000 + 200 / 2 = 1,100 tokens: 58 fit, so fraction 0.5 is 29.
    #[test]
    fn a_kv_fraction_becomes_the_concurrency_the_cache_holds() {
        let mut tree = json!({
            "traffic": {"source": {"type": "synthetic", "input_tokens": 1000, "output_tokens": 200},
                        "load": {"type": "kv_capacity_fraction", "fraction": 0.5}, "stop": {"requests": 10}},
            "engine": {"mode": "aggregated", "model": "Qwen/Qwen3-32B", "hardware": "h200_sxm", "backend": "vllm",
                       "context_length": 4096,
                       "workers": {"aggregated": {
                           "parallelism": {"replicas": 2, "attention_data": 2},
                           "kv_cache": {"block_size": 16, "capacity": {"type": "fixed", "blocks": 1000}},
                           "timing": {"type": "fixed", "prefill_ms": 10, "decode_ms": 5}}}}
        });
        let mut small = tree.clone();
        resolve(&mut tree).unwrap();
        assert_eq!(tree["traffic"]["load"], json!({"type": "concurrency", "concurrency": 29}));
        small["engine"]["workers"]["aggregated"]["kv_cache"]["capacity"]["blocks"] = json!(10);
        small["engine"]["workers"]["aggregated"]["parallelism"] = json!({"replicas": 1});
        assert_eq!(
            resolve(&mut small).unwrap_err(),
            "agg KV capacity cannot hold one request at 1100 average tokens per in-flight request"
        );
    }
}
