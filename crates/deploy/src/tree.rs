//! The configuration as a tree: YAML text to a JSON value (one mapping), and `--set PATH=VALUE`
//! overrides applied to it before the schema reads it.
//!
//! The YAML is read as PyYAML's `safe_load` reads it where that matters to a user: a leading
//! byte-order mark is skipped and `<<:` merge keys are applied (explicit keys win, then the
//! earlier of several merged mappings). What PyYAML would turn into something else than plain
//! data is refused by key path: YAML tags (`!custom`, `!!binary`), and numbers that are not
//! finite. Before the parser sees the text, a linear pre-scan ([`scan`]) caps the nesting
//! depth: the parser's cost grows with the square of the depth (a 200 KB file of `{a: ` takes
//! minutes), and no configuration nests deeper than a dozen levels.

use serde_json::{Map, Value};

use crate::error::DeployError;

/// The deepest nesting of lists and mappings accepted.
pub const MAX_DEPTH: usize = 64;

/// The longest string (value or key) accepted, in bytes: longer than any path or name.
pub const MAX_STRING: usize = 4096;

/// How many characters of an input string a message shows.
const SHOWN_CHARS: usize = 80;

pub use servesim_config::reader::{join, shown};

/// Reads YAML text into a JSON value; the document must be one mapping.
pub fn parse_yaml(text: &str) -> Result<Value, DeployError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let json = parse("", text)?;
    if !json.is_object() {
        return Err(DeployError::new("", "the configuration must contain one YAML mapping"));
    }
    Ok(json)
}

/// One YAML document to JSON; `path`: where it goes in the tree (for messages).
fn parse(path: &str, text: &str) -> Result<Value, DeployError> {
    let found = scan::scan(text, MAX_DEPTH).map_err(|d| too_deep(path, d.line))?;
    if !found.tags.is_empty() {
        // Tags the parser resolves itself (`!!binary`, `!<…>`) are dropped by it without a
        // trace: each tag is first replaced by a numbered local one the parser keeps.
        // Should the scan have taken text inside a scalar for a tag, the marked text yields no
        // tag (or no document) and the text is read as it is.
        let marked = mark_tags(text, &found.tags);
        if let Ok(v) = serde_yaml_ng::from_str::<serde_yaml_ng::Value>(&marked) {
            if let Some((at, tag)) = first_tag(path, &v) {
                return Err(tag_error(&at, &tag, &found.tags, text));
            }
        }
    }
    let value = match serde_yaml_ng::from_str::<serde_yaml_ng::Value>(text) {
        Ok(v) => v,
        // An integer beyond 64 bits is an error of the parser; read it as the float PyYAML's
        // int would become in a float field, so the reader can say it is too large.
        Err(e) if is_big_integer_error(&e) && !found.big_ints.is_empty() => {
            serde_yaml_ng::from_str(&widen_big_ints(text, &found.big_ints)).map_err(|e| malformed(path, &e))?
        }
        Err(e) => return Err(malformed(path, &e)),
    };
    if let Some((at, tag)) = first_tag(path, &value) {
        return Err(tag_error(&at, &tag, &found.tags, text));
    }
    to_json(path, value)
}

fn too_deep(path: &str, line: usize) -> DeployError {
    DeployError::new(path, format!("line {line}: lists and mappings nest deeper than {MAX_DEPTH} levels"))
}

fn malformed(path: &str, e: &serde_yaml_ng::Error) -> DeployError {
    let text = e.to_string();
    if text.starts_with("recursion limit exceeded") {
        if let Some(at) = e.location() {
            return too_deep(path, at.line());
        }
    }
    DeployError::new(path, format!("malformed YAML: {}", cut_message(&text)))
}

/// The parser's messages quote scalars whole; a message is cut to a readable length.
fn cut_message(text: &str) -> String {
    match text.char_indices().nth(4 * SHOWN_CHARS) {
        None => text.to_string(),
        Some((end, _)) => format!("{}… ({} bytes)", &text[..end], text.len()),
    }
}

fn is_big_integer_error(e: &serde_yaml_ng::Error) -> bool {
    let text = e.to_string();
    text.contains(" as u128,") || text.contains(" as i128,")
}

/// The text with each tag replaced by `!~N` (N: its index, base 36), padded with spaces to the
/// tag's length so that every column stays where it was. A tag too short for that (`!`, `!x`)
/// is a local one, which the parser keeps: it stays.
fn mark_tags(text: &str, tags: &[scan::Tag]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for (i, t) in tags.iter().enumerate() {
        let marker = format!("!~{}", base36(i));
        if marker.len() > t.end - t.start {
            continue;
        }
        out.push_str(&text[at..t.start]);
        out.push_str(&marker);
        out.extend(std::iter::repeat_n(' ', t.end - t.start - marker.len()));
        at = t.end;
    }
    out.push_str(&text[at..]);
    out
}

fn base36(mut n: usize) -> String {
    let mut digits = Vec::new();
    loop {
        digits.push(b"0123456789abcdefghijklmnopqrstuvwxyz"[n % 36]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    digits.reverse();
    String::from_utf8(digits).expect("ASCII digits")
}

/// The key path and tag (as the parser shows it, e.g. `!custom`) of the first tagged node.
fn first_tag(path: &str, v: &serde_yaml_ng::Value) -> Option<(String, String)> {
    use serde_yaml_ng::Value as Y;
    match v {
        Y::Tagged(t) => Some((path.to_string(), t.tag.to_string())),
        Y::Sequence(items) => items.iter().enumerate().find_map(|(i, x)| first_tag(&format!("{path}[{i}]"), x)),
        Y::Mapping(m) => m.iter().find_map(|(k, x)| {
            let key = match k {
                Y::String(s) => s.as_str(),
                Y::Tagged(t) => return Some((path.to_string(), t.tag.to_string())),
                _ => "?",
            };
            first_tag(&join(path, key), x)
        }),
        _ => None,
    }
}

fn tag_error(path: &str, tag: &str, tags: &[scan::Tag], text: &str) -> DeployError {
    let original = tag
        .strip_prefix("!~")
        .and_then(|n| usize::from_str_radix(n, 36).ok())
        .and_then(|i| tags.get(i))
        .map(|t| (shown_tag(&text[t.start..t.end]), Some(t.line)));
    let (tag, line) = original.unwrap_or_else(|| (shown_tag(tag), None));
    let line = line.map(|l| format!(" on line {l}")).unwrap_or_default();
    DeployError::new(path, format!("YAML tags are not supported (found {tag}{line}); remove the tag"))
}

fn shown_tag(tag: &str) -> String {
    match tag.char_indices().nth(SHOWN_CHARS) {
        None => tag.to_string(),
        Some((end, _)) => format!("{}…", &tag[..end]),
    }
}

/// The text with each integer beyond 64 bits replaced by a float literal of about the same
/// value, padded with spaces to the integer's length.
fn widen_big_ints(text: &str, ranges: &[(usize, usize)]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for &(start, end) in ranges {
        let digits = &text[start..end];
        let Some(x) = scan::big_int_value(digits) else { continue };
        let mut literal = format!("{x:e}");
        let mut precision = 16;
        while literal.len() > digits.len() && precision > 0 {
            precision -= 1;
            literal = format!("{x:.precision$e}");
        }
        if literal.len() > digits.len() {
            continue;
        }
        out.push_str(&text[at..start]);
        out.push_str(&literal);
        out.extend(std::iter::repeat_n(' ', digits.len() - literal.len()));
        at = end;
    }
    out.push_str(&text[at..]);
    out
}

fn long_string(path: &str, s: &str) -> DeployError {
    DeployError::new(
        path,
        format!("a string of {} bytes is longer than the {MAX_STRING} accepted: {}", s.len(), shown(s)),
    )
}

fn kind(v: &serde_yaml_ng::Value) -> &'static str {
    use serde_yaml_ng::Value as Y;
    match v {
        Y::Null => "null",
        Y::Bool(_) => "a boolean",
        Y::Number(_) => "a number",
        Y::String(_) => "a string",
        Y::Sequence(_) => "a list",
        Y::Mapping(_) => "a mapping",
        Y::Tagged(_) => "a tagged value",
    }
}

fn to_json(path: &str, v: serde_yaml_ng::Value) -> Result<Value, DeployError> {
    use serde_yaml_ng::Value as Y;
    Ok(match v {
        Y::Null => Value::Null,
        Y::Bool(b) => Value::Bool(b),
        Y::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                let f = n.as_f64().unwrap_or(f64::NAN);
                serde_json::Number::from_f64(f)
                    .map(Value::Number)
                    .ok_or_else(|| DeployError::new(path, format!("{f} is not a finite number")))?
            }
        }
        Y::String(s) if s.len() > MAX_STRING => return Err(long_string(path, &s)),
        Y::String(s) => Value::String(s),
        Y::Sequence(items) => Value::Array(
            items
                .into_iter()
                .enumerate()
                .map(|(i, x)| to_json(&format!("{path}[{i}]"), x))
                .collect::<Result<_, _>>()?,
        ),
        Y::Mapping(m) => {
            let mut merges = Vec::new();
            let mut explicit = Vec::new();
            for (k, v) in m {
                let key = match k {
                    Y::String(s) if s.len() > MAX_STRING => return Err(long_string(path, &s)),
                    Y::String(s) => s,
                    other => {
                        let key = match &other {
                            Y::Number(n) => n.to_string(),
                            Y::Bool(b) => b.to_string(),
                            Y::Null => "null".to_string(),
                            _ => kind(&other).to_string(),
                        };
                        return Err(DeployError::new(
                            path,
                            format!("mapping keys must be strings, got {}", shown(&key)),
                        ));
                    }
                };
                if key == "<<" {
                    merges.push(v);
                } else {
                    explicit.push((key, v));
                }
            }
            // PyYAML's merge: the merged mappings first (of a list of them, the earlier wins),
            // then the mapping's own keys over them.
            let mut out = Map::new();
            let at = join(path, "<<");
            for merge in merges {
                match merge {
                    m @ Y::Mapping(_) => {
                        if let Value::Object(m) = to_json(&at, m)? {
                            out.extend(m);
                        }
                    }
                    Y::Sequence(items) => {
                        let mut maps = Vec::with_capacity(items.len());
                        for (i, item) in items.into_iter().enumerate() {
                            let here = format!("{at}[{i}]");
                            match item {
                                m @ Y::Mapping(_) => maps.push(to_json(&here, m)?),
                                other => {
                                    return Err(DeployError::new(
                                        here,
                                        format!("expected a mapping for merging, but found {}", kind(&other)),
                                    ))
                                }
                            }
                        }
                        for m in maps.into_iter().rev() {
                            if let Value::Object(m) = m {
                                out.extend(m);
                            }
                        }
                    }
                    other => {
                        return Err(DeployError::new(
                            at,
                            format!("expected a mapping or list of mappings for merging, but found {}", kind(&other)),
                        ))
                    }
                }
            }
            for (key, v) in explicit {
                let v = to_json(&join(path, &key), v)?;
                out.insert(key, v);
            }
            Value::Object(out)
        }
        // `first_tag` refuses every tag before the conversion.
        Y::Tagged(t) => return Err(DeployError::new(path, format!("YAML tags are not supported (found {})", t.tag))),
    })
}

/// Applies one `PATH=VALUE` override: a dotted path of mapping keys (no list indexes) and a
/// YAML value. Missing mappings along the path are created.
pub fn apply_set(root: &mut Value, spec: &str) -> Result<(), DeployError> {
    let (path, text) = spec
        .split_once('=')
        .ok_or_else(|| DeployError::new("", format!("--set {}: expected PATH=VALUE", shown(spec))))?;
    let path = path.trim();
    let parts: Vec<&str> = path.split('.').collect();
    if path.is_empty() || parts.iter().any(|p| p.is_empty()) {
        return Err(DeployError::new("", format!("--set {}: the path must be dot-separated keys", shown(spec))));
    }
    let value = parse(path, text).map_err(|e| {
        if e.message.starts_with("malformed YAML: ") {
            DeployError::new(path, format!("--set: malformed YAML value {}: {}", shown(text), &e.message[16..]))
        } else {
            e
        }
    })?;
    let mut node = root;
    for (i, part) in parts.iter().enumerate() {
        let here = parts[..i].join(".");
        let obj = match node {
            Value::Object(m) => m,
            _ => return Err(DeployError::new(&here, "--set: not a mapping, cannot set a key inside it")),
        };
        if i + 1 == parts.len() {
            obj.insert(part.to_string(), value);
            return Ok(());
        }
        let next = obj.entry(part.to_string()).or_insert_with(|| Value::Object(Map::new()));
        if next.is_null() {
            *next = Value::Object(Map::new());
        }
        node = next;
    }
    unreachable!("the loop returns at the last part")
}

/// The YAML pre-scan (nesting depth, tags, integers beyond 64 bits), shared with the router
/// policy reader.
pub use servesim_router::yaml_scan as scan;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn set_creates_and_replaces() {
        let mut v = parse_yaml("engine:\n  model: a\n").unwrap();
        apply_set(&mut v, "engine.workers.aggregated.parallelism.tensor=4").unwrap();
        apply_set(&mut v, "engine.model=b").unwrap();
        assert_eq!(v, json!({"engine": {"model": "b", "workers": {"aggregated": {"parallelism": {"tensor": 4}}}}}));
        assert!(apply_set(&mut v, "engine.model.x=1").unwrap_err().to_string().contains("engine.model"));
        assert!(apply_set(&mut v, "novalue").is_err());
    }

    fn refused(text: &str) -> String {
        parse_yaml(text).unwrap_err().to_string()
    }

    /// N12: deep nesting is refused by the pre-scan, quickly, naming the line; the parser took
    /// minutes on these (its cost grows with the square of the depth).
    #[test]
    fn deep_nesting_is_refused_quickly_naming_the_line() {
        let started = std::time::Instant::now();
        let deep = "lists and mappings nest deeper than 64 levels";
        assert_eq!(refused(&format!("a: 1\nb: {}\n", "[".repeat(100_000))), format!("line 2: {deep}"));
        assert_eq!(refused(&format!("a:\n  b: {}", "{a: ".repeat(50_000))), format!("line 2: {deep}"));
        assert_eq!(refused(&format!("x: {}1", "- ".repeat(50_000))), format!("line 1: {deep}"));
        let mut block = String::new();
        for i in 0..70 {
            block.push_str(&format!("{}k{i}:\n", " ".repeat(i)));
        }
        assert_eq!(refused(&block), format!("line 65: {deep}"));
        assert!(started.elapsed() < std::time::Duration::from_secs(3), "{:?}", started.elapsed());
        // As deep as allowed: read.
        let v = parse_yaml(&format!("a: {}1{}\n", "[".repeat(63), "]".repeat(63))).unwrap();
        assert!(v["a"].is_array());
    }

    /// Brackets that open nothing: inside quotes, comments, plain and block scalars.
    #[test]
    fn brackets_inside_scalars_are_not_nesting() {
        let many = "[{".repeat(100);
        let text = format!(
            "a: '{many}'\nb: \"{many}\\\" {many}\"\n# {many}\nc: x{many}\nd: |\n  {many}\n  {many}\ne: >-\n    {many}\nf: [\"{many}\", '{many}', x]\ng: 'it''s {many}'\n"
        );
        let v = parse_yaml(&text).unwrap();
        assert_eq!(v["c"], json!(format!("x{many}")));
        assert_eq!(v["d"], json!(format!("{many}\n{many}\n")));
        assert_eq!(v["g"], json!(format!("it's {many}")));
    }

    /// N15: a byte-order mark is skipped, as PyYAML and the trace readers do.
    #[test]
    fn a_byte_order_mark_is_skipped() {
        assert_eq!(parse_yaml("\u{feff}---\na: 1\n").unwrap(), json!({"a": 1}));
        assert_eq!(parse_yaml("\u{feff}# comment\na: 1\n").unwrap(), json!({"a": 1}));
    }

    /// N15: `<<:` merge keys as PyYAML applies them: the mapping's own keys win, then the
    /// earlier of a list of merged mappings; merges inside merged mappings apply first.
    #[test]
    fn merge_keys_apply_as_in_pyyaml() {
        let text = "base: &b {tensor: 2, pipeline: 1}\nmore: &m {pipeline: 8, expert: 3, data: 5}\n\
                    one:\n  <<: *b\n  pipeline: 4\n\
                    two:\n  <<: [*b, *m]\n\
                    deep: &d\n  <<: *b\n  data: 7\n\
                    three:\n  <<: *d\n";
        let v = parse_yaml(text).unwrap();
        assert_eq!(v["one"], json!({"tensor": 2, "pipeline": 4}));
        assert_eq!(v["two"], json!({"tensor": 2, "pipeline": 1, "expert": 3, "data": 5}));
        assert_eq!(v["three"], json!({"tensor": 2, "pipeline": 1, "data": 7}));
        assert_eq!(
            refused("a:\n  <<: 3\n"),
            "a.<<: expected a mapping or list of mappings for merging, but found a number"
        );
        assert_eq!(refused("a:\n  <<: [{x: 1}, 3]\n"), "a.<<[1]: expected a mapping for merging, but found a number");
    }

    /// N21: tags are refused by key path, whether the parser keeps them (`!custom`) or resolves
    /// them away (`!!binary`, verbatim `!<…>`).
    #[test]
    fn tags_are_refused_by_key_path() {
        assert_eq!(
            refused("engine:\n  backend: !custom vllm\n"),
            "engine.backend: YAML tags are not supported (found !custom on line 2); remove the tag"
        );
        assert_eq!(
            refused("traffic:\n  source:\n    type: !!binary aGVsbG8=\n"),
            "traffic.source.type: YAML tags are not supported (found !!binary on line 3); remove the tag"
        );
        assert_eq!(
            refused("a: [1, !<tag:yaml.org,2002:str> 5]\n"),
            "a[1]: YAML tags are not supported (found !<tag:yaml.org,2002:str> on line 1); remove the tag"
        );
        assert_eq!(refused("a: !x 1\n"), "a: YAML tags are not supported (found !x); remove the tag");
        assert_eq!(
            refused("a: {b: &t !!str c}\nd: *t\n"),
            "a.b: YAML tags are not supported (found !!str on line 1); remove the tag"
        );
        // A `!` inside a scalar is no tag.
        assert_eq!(
            parse_yaml("a: 'x !!y'\nb: hi!\nc: \"!z\"\n").unwrap(),
            json!({"a": "x !!y", "b": "hi!", "c": "!z"})
        );
        let mut v = json!({});
        assert_eq!(
            apply_set(&mut v, "engine.model=!!binary aGk=").unwrap_err().to_string(),
            "engine.model: YAML tags are not supported (found !!binary on line 1); remove the tag"
        );
    }

    /// N17: a huge string is refused with its first 80 characters and its length.
    #[test]
    fn huge_strings_are_cut_in_messages() {
        let huge = "m".repeat(100_000);
        let e = refused(&format!("engine:\n  model: {huge}\n"));
        assert_eq!(
            e,
            format!(
                "engine.model: a string of 100000 bytes is longer than the 4096 accepted: {:?}… (100000 bytes)",
                "m".repeat(80)
            )
        );
        let e = refused(&format!("{huge}: 1\n"));
        assert!(e.len() < 300, "{e}");
        let mut v = json!({});
        let e = apply_set(&mut v, &format!("a.b=[{huge}")).unwrap_err().to_string();
        assert!(e.len() < 600, "{}", e.len());
        assert!(
            e.starts_with(&format!("a.b: --set: malformed YAML value \"[{}\"… (100001 bytes): ", "m".repeat(79))),
            "{e}"
        );
    }

    /// N20: integers beyond 64 bits read as floats (to be refused as too large where an integer
    /// is wanted), not as a parser error about u128.
    #[test]
    fn integers_beyond_64_bits_read_as_floats() {
        assert_eq!(parse_yaml("a: 99999999999999999999\n").unwrap(), json!({"a": 1e20}));
        assert_eq!(parse_yaml("a: [-99999999999999999999, 1]\n").unwrap(), json!({"a": [-1e20, 1]}));
        assert_eq!(parse_yaml("a: 0xffffffffffffffffff  # c\n").unwrap(), json!({"a": 4.722366482869645e21}));
        assert_eq!(scan::big_int_value("18446744073709551615"), None);
        assert_eq!(scan::big_int_value("18446744073709551616"), Some(18446744073709551616.0));
        assert_eq!(scan::big_int_value("-9223372036854775808"), None);
        assert_eq!(scan::big_int_value("0123456789012345678901"), None);
    }

    #[test]
    fn yaml_must_be_a_mapping() {
        assert!(parse_yaml("- 1\n- 2\n").unwrap_err().to_string().contains("one YAML mapping"));
        assert!(parse_yaml("a: [1, \n").unwrap_err().to_string().contains("malformed YAML"));
    }
}
