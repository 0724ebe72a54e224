//! Property tests of the request parser: generated bodies (request-shaped JSON, random bytes,
//! and JSON cut or corrupted at random) must never panic, must get a 400 with a message when
//! refused, must satisfy the context-length bound when accepted, and must be judged as the
//! Value-tree parser this crate had before ([`super::legacy`]) judged them, with one known
//! difference: numbers beyond f64 (`1E400`) in values the reader skips (see
//! [`numbers_beyond_f64_are_refused_only_where_read`]).
//!
//! Each property runs `SERVESIM_FUZZ_CASES` cases (default 2,000: a few seconds in CI); for a
//! long run: `SERVESIM_FUZZ_CASES=1000000 cargo test --release -p servesim-live fuzz -- --nocapture`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Map, Value};

use super::{legacy, parse, ApiError, ErrorKind};
use crate::tokenizer::Tokenizer;

const MAX_MODEL_LEN: u32 = 64;

fn tokenizer() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(Tokenizer::approximate)
}

fn cases() -> u32 {
    std::env::var("SERVESIM_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(2_000)
}

fn runner() -> TestRunner {
    TestRunner::new(Config { cases: cases(), failure_persistence: None, ..Config::default() })
}

const KEYS: &[&str] = &[
    "prompt",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "min_tokens",
    "stream",
    "stream_options",
    "n",
    "best_of",
    "model",
    "nvext",
    "stop",
    "seed",
    "temperature",
    "top_k",
    "logprobs",
    "top_logprobs",
    "echo",
    "tools",
    "chat_template_kwargs",
    "add_generation_prompt",
    "kv_transfer_params",
    "ignore_eos",
    "user",
    "top_p",
];
const INNER_KEYS: &[&str] = &[
    "role",
    "content",
    "type",
    "text",
    "include_usage",
    "continuous_usage_stats",
    "extra_fields",
    "backend_instance_id",
    "ignore_eos",
    "do_remote_prefill",
    "name",
    "tool_calls",
    "x",
];
const WORDS: &[&str] = &["worker_id", "text", "user", "assistant", "system", "hello world", "", "m", "servesim-model"];

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-3i64..80).prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-2.0f64..100.0).prop_map(Value::from),
        "[a-z ,.!]{0,24}".prop_map(Value::from),
        prop::sample::select(WORDS).prop_map(Value::from),
    ]
}

fn json() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(INNER_KEYS), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())),
        ]
    })
}

/// Values that look like what the fields want, to get past the type checks.
fn plausible() -> impl Strategy<Value = Value> {
    let part = prop_oneof![
        "[a-z ]{0,12}".prop_map(|t| serde_json::json!({"type": "text", "text": t})),
        Just(serde_json::json!({"type": "image_url", "image_url": {"url": "x"}})),
    ];
    let content = prop_oneof![
        "[a-z .]{0,40}".prop_map(Value::from),
        prop::collection::vec(part, 0..3).prop_map(Value::Array),
        Just(Value::Null),
    ];
    let message = (prop::sample::select(&["user", "assistant", "system"][..]), content)
        .prop_map(|(role, content)| serde_json::json!({"role": role, "content": content}));
    prop_oneof![
        prop::collection::vec(message, 0..4).prop_map(Value::Array),
        prop::collection::vec(0u32..70_000, 0..80).prop_map(Value::from),
        prop::collection::vec(prop::collection::vec(0u32..100, 0..4).prop_map(Value::from), 0..3)
            .prop_map(Value::Array),
        (1u32..90).prop_map(Value::from),
        Just(serde_json::json!({"include_usage": true})),
        Just(serde_json::json!({"extra_fields": ["worker_id"], "backend_instance_id": 0})),
        Just(serde_json::json!({"do_remote_prefill": true})),
        Just(serde_json::json!([{"type": "function", "function": {"name": "f"}}])),
        Just(serde_json::json!({"enable_thinking": false})),
    ]
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    let value = prop_oneof![2 => plausible(), 1 => json()];
    let object = prop::collection::vec((prop::sample::select(KEYS), value), 0..9).prop_map(|kv| {
        let map: Map<String, Value> = kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        serde_json::to_vec(&Value::Object(map)).expect("serialises")
    });
    prop_oneof![
        6 => object.clone(),
        1 => prop::collection::vec(any::<u8>(), 0..64),
        1 => json().prop_map(|v| serde_json::to_vec(&v).expect("serialises")),
        // Corrupted: a byte replaced, or the body cut short.
        2 => (object, any::<prop::sample::Index>(), any::<u8>(), any::<bool>()).prop_map(|(mut b, at, byte, cut)| {
            if !b.is_empty() {
                let i = at.index(b.len());
                if cut {
                    b.truncate(i);
                } else {
                    b[i] = byte;
                }
            }
            b
        }),
    ]
}

/// Whether two refusals name the same parameter (the new parser names nested ones by path:
/// `nvext.backend_instance_id` where the old one said `backend_instance_id`).
fn same_param(new: &ApiError, old: &ApiError) -> bool {
    match (&new.param, &old.param) {
        (Some(n), Some(o)) => n == o || n.ends_with(&format!(".{o}")) || n.starts_with(&format!("{o}.")),
        (n, o) => n == o,
    }
}

#[test]
fn parser_never_panics_and_agrees_with_the_value_tree_parser() {
    let runs = AtomicU64::new(0);
    let accepted = AtomicU64::new(0);
    runner()
        .run(&(body(), any::<bool>()), |(bytes, chat)| {
            runs.fetch_add(1, Ordering::Relaxed);
            let new = parse(&bytes, chat, tokenizer(), MAX_MODEL_LEN);
            let old = legacy::parse(&bytes, chat, tokenizer(), MAX_MODEL_LEN);
            let text = String::from_utf8_lossy(&bytes);
            match (&new, &old) {
                // The old parser refused a number beyond f64 somewhere; the new one refuses it
                // only where it reads it, so it may accept, or refuse for another reason.
                (_, Err(o)) if o.message.contains("number out of range") => {
                    if let Err(n) = &new {
                        prop_assert_eq!(n.kind, ErrorKind::BadRequest);
                        prop_assert!(!n.message.is_empty());
                    }
                }
                (Ok(n), Ok(o)) => {
                    accepted.fetch_add(1, Ordering::Relaxed);
                    prop_assert_eq!(n, o, "{}", text);
                    prop_assert!(!n.prompt.is_empty());
                    prop_assert!(n.prompt.len() as u64 + n.max_tokens as u64 <= MAX_MODEL_LEN as u64);
                }
                (Err(n), Err(o)) => {
                    prop_assert_eq!(n.kind, ErrorKind::BadRequest);
                    prop_assert!(!n.message.is_empty());
                    prop_assert!(same_param(n, o), "{}: {:?} vs {:?}", text, n, o);
                }
                _ => prop_assert!(false, "{}: new {:?}, old {:?}", text, new, old),
            }
            Ok(())
        })
        .unwrap();
    eprintln!(
        "request parser: {} executions, {} accepted, 0 crashes",
        runs.load(Ordering::Relaxed),
        accepted.load(Ordering::Relaxed)
    );
}

/// Numbers beyond f64 (`1E400`) are valid JSON syntax. serde_json's `Value` refuses them anywhere
/// in a body; the streaming reader only where it reads one, because skipped values are checked
/// for syntax only (serde's `IgnoredAny`), which is also what vLLM does (Python's json reads
/// them as inf and an unknown field is ignored). Found by the property above (a corrupted
/// `42.8254` became `42E8254...` inside a skipped object).
#[test]
fn numbers_beyond_f64_are_refused_only_where_read() {
    let t = tokenizer();
    let skipped = br#"{"prompt": "hi", "user": 1E400, "nvext": {"x": [-1e999]}, "max_tokens": 2}"#;
    assert!(legacy::parse(skipped, false, t, MAX_MODEL_LEN).is_err());
    let accepted = parse(skipped, false, t, MAX_MODEL_LEN).expect("skipped numbers are not read");
    assert_eq!(accepted.max_tokens, 2);
    let read = br#"{"prompt": "hi", "max_tokens": 1E400}"#;
    let e = parse(read, false, t, MAX_MODEL_LEN).expect_err("a field read as a number");
    assert!(e.message.contains("number out of range"), "{e:?}");
}
