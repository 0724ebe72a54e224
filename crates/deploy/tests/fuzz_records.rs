//! Property-based fuzzing of the recommend records read back from disk: shard trials and
//! trial-cache entries (`recommend::trial_from_json`, the digest that guards them). Whatever a
//! file holds, reading it never panics; a record whose values were changed after it was written
//! is refused unless its digest was recomputed; and every record read back is the candidate's
//! (its GPU count is the candidate's own).
//!
//! `PROPTEST_CASES=N cargo test --release -p servesim-deploy --test fuzz_records -- --nocapture`
//! runs N cases per target and prints the counts.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use serde_json::{json, Value};
use servesim_deploy::recommend::{digest_holds, read_search, trial_from_json, trial_json, with_digest, Search, Trial};

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64);
    ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() }
}

static ACCEPTED: AtomicU64 = AtomicU64::new(0);
static REFUSED: AtomicU64 = AtomicU64::new(0);

fn counts(target: &str) {
    eprintln!(
        "fuzz counts after {target}: accepted {}, refused {}",
        ACCEPTED.load(Ordering::Relaxed),
        REFUSED.load(Ordering::Relaxed)
    );
}

/// A 4-candidate search (replicas 1 or 2, tensor 1 or 2), read once.
fn search() -> &'static Search {
    static SEARCH: std::sync::OnceLock<Search> = std::sync::OnceLock::new();
    SEARCH.get_or_init(read)
}

fn read() -> Search {
    let root = json!({
        "engine": {"mode": "aggregated", "backend": "vllm", "model": "m", "hardware": "h", "workers": {"aggregated": {
            "parallelism": {"preset": false, "replicas": {"choices": [1, 2]}, "tensor": {"choices": [1, 2]}},
            "scheduler": {"max_batched_tokens": 8192, "max_sequences": 64},
        }}},
        "optimizer": {"algorithm": "grid"},
    });
    read_search(&root, Path::new(".")).unwrap()
}

fn gpus(s: &Search, i: usize) -> u64 {
    let p = &s.candidate(i).unwrap()["engine"]["workers"]["aggregated"]["parallelism"];
    p["replicas"].as_u64().unwrap() * p["tensor"].as_u64().unwrap()
}

/// A valid record of candidate `i`.
fn record(s: &Search, i: usize, throughput: f64) -> Value {
    let mut summary = serde_json::Map::new();
    summary.insert("output_throughput_tok_s".into(), json!(throughput));
    summary.insert("completed_requests".into(), json!(10));
    let t = Trial {
        tree: s.candidate(i).unwrap(),
        used_gpus: gpus(s, i),
        status: "feasible",
        reason_category: None,
        reason: None,
        summary,
    };
    trial_json(i, &t)
}

fn check(s: &Search, v: &Value) {
    match trial_from_json(s, v) {
        Some((i, t)) => {
            ACCEPTED.fetch_add(1, Ordering::Relaxed);
            assert!(digest_holds(v), "an accepted record carries a matching digest");
            assert_eq!(t.used_gpus, gpus(s, i), "an accepted record is its candidate's");
        }
        None => {
            REFUSED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Arbitrary JSON values, a few levels deep.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
        "[a-z0-9_]{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("[a-z_]{1,10}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

const FIELDS: [&str; 7] = ["index", "status", "reason_category", "reason", "used_gpus", "summary", "digest"];

proptest! {
    #![proptest_config(config())]

    /// One field of a valid record replaced by anything: refused unless the value is the same,
    /// never a panic.
    #[test]
    fn edited_records_are_refused(i in 0usize..4, field in 0usize..FIELDS.len(), value in any_json(), tp in 0.0f64..1e6) {
        let s = search();
        let mut v = record(s, i, tp);
        let before = v.clone();
        v[FIELDS[field]] = value;
        check(s, &v);
        if v != before {
            prop_assert!(trial_from_json(s, &v).is_none(), "an edited record was accepted: {v}");
        }
        counts("edited_records_are_refused");
    }

    /// Anything at all with a recomputed digest (a record written by something else): read
    /// or refused, and when read, consistent with its candidate.
    #[test]
    fn arbitrary_records_with_their_digest_never_mislead(value in any_json(), i in 0u64..6, gpus_claimed in 0u64..8) {
        let s = search();
        let mut v = match value {
            Value::Object(m) => Value::Object(m),
            other => json!({"summary": other}),
        };
        v["index"] = json!(i);
        v["used_gpus"] = json!(gpus_claimed);
        v["status"] = json!("feasible");
        v["reason_category"] = Value::Null;
        v["reason"] = Value::Null;
        if !v["summary"].is_object() {
            v["summary"] = json!({});
        }
        check(s, &with_digest(v));
        counts("arbitrary_records_with_their_digest_never_mislead");
    }

    /// Bytes as a shard or cache file might hold after damage: parsing never panics.
    #[test]
    fn damaged_bytes_never_panic(i in 0usize..4, cut in 0usize..400, flip in 0usize..400, bit in 0u8..8) {
        let s = search();
        let mut bytes = serde_json::to_vec(&record(s, i, 1234.5)).unwrap();
        if flip < bytes.len() {
            bytes[flip] ^= 1 << bit;
        }
        bytes.truncate(cut.max(1));
        if let Ok(v) = serde_json::from_slice::<Value>(&bytes) {
            check(s, &v);
        } else {
            REFUSED.fetch_add(1, Ordering::Relaxed);
        }
        counts("damaged_bytes_never_panic");
    }
}

#[test]
fn a_valid_record_reads_back() {
    let s = search();
    for i in 0..4 {
        let (j, t) = trial_from_json(s, &record(s, i, 99.0)).unwrap();
        assert_eq!(j, i);
        assert_eq!(t.summary["output_throughput_tok_s"], 99.0);
    }
    let mut wrong = record(s, 3, 99.0);
    wrong["used_gpus"] = json!(1);
    assert!(trial_from_json(s, &with_digest(wrong)).is_none(), "a GPU count that is not the candidate's");
}
