//! Property-based fuzzing of the deployment YAML reader (`tree::parse_yaml`, `tree::apply_set`
//! and the schema behind them). Whatever the text, the reader returns a tree or one error line
//! of bounded length; it never panics and never takes long. Generated configurations written
//! in block and flow style, with quotes, brackets, `#`, `!` and `:` inside their strings, read
//! back as written, and the depth pre-scan never counts less nesting than they have.
//!
//! The ordinary test run uses a few cases per target; `PROPTEST_CASES=N` runs more, e.g.
//! `PROPTEST_CASES=20000 cargo test --release -p servesim-deploy --test fuzz_yaml -- --nocapture`
//! (each target prints its counts).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use serde_json::{json, Map, Value};
use servesim_deploy::tree::{apply_set, parse_yaml, scan, MAX_DEPTH};

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64);
    ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() }
}

static READ: AtomicU64 = AtomicU64::new(0);
static REFUSED: AtomicU64 = AtomicU64::new(0);
static ROUND_TRIPS: AtomicU64 = AtomicU64::new(0);
static DEEP: AtomicU64 = AtomicU64::new(0);

fn counts(target: &str) {
    eprintln!(
        "fuzz counts after {target}: read {}, refused {}, round trips {}, deep {}",
        READ.load(Ordering::Relaxed),
        REFUSED.load(Ordering::Relaxed),
        ROUND_TRIPS.load(Ordering::Relaxed),
        DEEP.load(Ordering::Relaxed)
    );
}

/// Reads `text` and checks the outcome: a mapping, or one bounded line (with the line number
/// inside the text when it gives one).
fn read(text: &str) {
    let started = Instant::now();
    match parse_yaml(text) {
        Ok(v) => {
            READ.fetch_add(1, Ordering::Relaxed);
            assert!(v.is_object());
            // The schema reads any tree without panicking.
            let _ = servesim_deploy::schema::read_predict(&v);
        }
        Err(e) => {
            REFUSED.fetch_add(1, Ordering::Relaxed);
            let msg = e.to_string();
            assert!(!msg.is_empty());
            assert!(!msg.contains('\n'), "one line: {msg:?}");
            assert!(msg.chars().count() < 1200, "bounded: {} chars: {msg:.200}", msg.chars().count());
            if let Some(rest) = msg.strip_prefix("line ") {
                let line: usize = rest.split(':').next().unwrap().parse().unwrap();
                assert!((1..=text.lines().count().max(1)).contains(&line), "line {line}: {msg}");
            }
        }
    }
    assert!(started.elapsed() < Duration::from_secs(2), "{:?} for {} bytes", started.elapsed(), text.len());
}

/// YAML-ish text: the characters that matter to the tokenizer, often.
fn yamlish() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("\n".to_string()),
        Just("  ".to_string()),
        Just(": ".to_string()),
        Just("- ".to_string()),
        Just("? ".to_string()),
        Just("[".to_string()),
        Just("]".to_string()),
        Just("{".to_string()),
        Just("}".to_string()),
        Just(", ".to_string()),
        Just("'".to_string()),
        Just("\"".to_string()),
        Just("\\".to_string()),
        Just(" #".to_string()),
        Just("|".to_string()),
        Just(">-".to_string()),
        Just("!".to_string()),
        Just("!!binary ".to_string()),
        Just("&a ".to_string()),
        Just("*a".to_string()),
        Just("<<: ".to_string()),
        Just("---\n".to_string()),
        Just("\t".to_string()),
        Just("\u{feff}".to_string()),
        Just("99999999999999999999".to_string()),
        Just("1e400".to_string()),
        Just("2.0".to_string()),
        "[a-z]{1,6}",
        "[0-9]{1,4}",
        any::<char>().prop_map(String::from),
    ];
    prop::collection::vec(piece, 0..80).prop_map(|p| p.concat())
}

/// A configuration-like tree: mappings of short keys, lists, strings (with YAML's special
/// characters inside), integers and booleans.
fn tree() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        "[a-z][a-z0-9_]{0,6}".prop_map(|s| json!(format!("s{s}"))),
        "[ -~]{0,12}".prop_map(Value::from),
        (-1000i64..1000).prop_map(Value::from),
        any::<bool>().prop_map(Value::from),
    ];
    leaf.prop_recursive(8, 64, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z][a-z0-9_]{0,5}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

fn depth(v: &Value) -> usize {
    match v {
        Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
        Value::Object(m) => 1 + m.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// A string scalar: plain when it is one of ours (`s...`), else single-quoted.
fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) if s.starts_with('s') && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') => s.clone(),
        Value::String(s) => format!("'{}'", s.replace('\'', "''")),
        other => other.to_string(),
    }
}

fn flow(v: &Value) -> String {
    match v {
        Value::Array(a) => format!("[{}]", a.iter().map(flow).collect::<Vec<_>>().join(", ")),
        Value::Object(m) => {
            format!("{{{}}}", m.iter().map(|(k, v)| format!("{k}: {}", flow(v))).collect::<Vec<_>>().join(", "))
        }
        other => scalar(other),
    }
}

/// Block style where `style` says so (a bit per container, in order), flow style elsewhere.
fn block(v: &Value, indent: usize, style: &mut impl Iterator<Item = bool>, out: &mut String) {
    let pad = " ".repeat(indent);
    let nested =
        |x: &Value| matches!(x, Value::Array(a) if !a.is_empty()) || matches!(x, Value::Object(m) if !m.is_empty());
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                if nested(x) && style.next().unwrap_or(true) {
                    out.push_str(&format!("{pad}{k}:\n"));
                    block(x, indent + 2, style, out);
                } else {
                    out.push_str(&format!("{pad}{k}: {}\n", flow(x)));
                }
            }
        }
        Value::Array(a) => {
            for x in a {
                if nested(x) && style.next().unwrap_or(true) {
                    out.push_str(&format!("{pad}-\n"));
                    block(x, indent + 2, style, out);
                } else {
                    out.push_str(&format!("{pad}- {}\n", flow(x)));
                }
            }
        }
        other => out.push_str(&format!("{pad}{}\n", scalar(other))),
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn any_text_reads_or_is_refused_in_one_line(text in yamlish()) {
        read(&text);
    }

    #[test]
    fn any_bytes_read_or_are_refused_in_one_line(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        read(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn written_configurations_read_back_as_written(
        root in prop::collection::btree_map("[a-z][a-z0-9_]{0,5}", tree(), 1..5),
        style in prop::collection::vec(any::<bool>(), 0..64),
    ) {
        let v = Value::Object(root.into_iter().collect());
        let mut text = String::new();
        block(&v, 0, &mut style.into_iter(), &mut text);
        prop_assert_eq!(parse_yaml(&text).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?, v.clone());
        let found = scan::scan(&text, usize::MAX).unwrap();
        prop_assert!(found.depth >= depth(&v), "scan depth {} < {} in\n{}", found.depth, depth(&v), text);
        prop_assert!(found.tags.is_empty(), "{:?} in\n{}", found.tags, text);
        let flat = flow(&v);
        prop_assert_eq!(parse_yaml(&flat).map_err(|e| TestCaseError::fail(format!("{e}\n{flat}")))?, v);
        ROUND_TRIPS.fetch_add(1, Ordering::Relaxed);
    }

    #[test]
    fn mutated_configurations_read_or_are_refused_in_one_line(
        root in prop::collection::btree_map("[a-z][a-z0-9_]{0,5}", tree(), 1..5),
        style in prop::collection::vec(any::<bool>(), 0..64),
        cuts in prop::collection::vec((any::<prop::sample::Index>(), yamlish()), 1..4),
    ) {
        let v = Value::Object(root.into_iter().collect());
        let mut text = String::new();
        block(&v, 0, &mut style.into_iter(), &mut text);
        for (at, piece) in cuts {
            let mut i = at.index(text.len() + 1);
            while !text.is_char_boundary(i) {
                i -= 1;
            }
            text.insert_str(i, &piece.chars().take(12).collect::<String>());
        }
        read(&text);
    }

    #[test]
    fn deep_nesting_is_refused_quickly(
        opens in prop::collection::vec(prop_oneof![Just("["), Just("{a: "), Just("- "), Just("\n")], 0..400),
        prefix in "[a-z]{1,4}: ",
    ) {
        let text = format!("{prefix}{}", opens.concat());
        read(&text);
        let nest = opens.iter().filter(|o| **o == "[" || **o == "{a: ").count();
        if nest > MAX_DEPTH {
            let e = parse_yaml(&text).unwrap_err().to_string();
            prop_assert!(e.ends_with("lists and mappings nest deeper than 64 levels"), "{}", e);
        }
        DEEP.fetch_add(1, Ordering::Relaxed);
    }

    #[test]
    fn overrides_apply_or_are_refused_in_one_line(path in "[a-z.]{0,12}", value in yamlish()) {
        let mut v = json!({"engine": {"model": "m"}});
        if let Err(e) = apply_set(&mut v, &format!("{path}={value}")) {
            let msg = e.to_string();
            prop_assert!(!msg.contains('\n'), "{}", msg);
            prop_assert!(msg.chars().count() < 1200);
        }
    }
}

#[test]
fn zz_print_counts() {
    counts("all targets (this runs last with --test-threads 1)");
}
