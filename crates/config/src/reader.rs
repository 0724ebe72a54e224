//! [`Reader`]: typed getters over one JSON object that name the offending key path, tell a
//! missing key from an explicit `null`, and (at [`Reader::finish`]) reject the keys nobody asked
//! for.
//!
//! The getters come in three wordings, one per reference the configuration follows; messages are
//! pinned by tests, so a getter's wording is part of its contract:
//!
//! - **Engine JSON** (`u64`, `u32`, `f64`, `bool`, `string`, `choice`, `object`,
//!   `unsupported`, `ignored`): "expected a number, got the string \"x\"", `null` distinct from a
//!   missing key (a `null` can switch a default off). Readers made with [`Reader::new`].
//! - **Deployment YAML** (`obj`, `text`, `nonempty`, `one_of`, `flag`, `number`, `nonneg`,
//!   `integer`, `u32_min`, `positive`, `value`, `given`): "must be a number, got a string", as
//!   aisimulate's pydantic schema says it; `null` is the same as absent, integers are lax
//!   (`2.0` is 2) and a number too large for a float is named. Readers made with
//!   [`Reader::mapping`], which also quotes and cuts unknown keys in paths.
//! - **Dynamo's Planner** (`pydantic_int`, `pydantic_number`, `pydantic_bool`,
//!   `pydantic_literal`): "Input should be a valid integer, got x", as Dynamo's `PlannerConfig`
//!   says it; a key may have aliases, and strings read as booleans as pydantic reads them.

use serde_json::{Map, Value};

use crate::{ConfigError, Field, Result};

/// Reads the keys of one JSON object.
pub struct Reader<'a> {
    prefix: String,
    map: &'a Map<String, Value>,
    known: Vec<&'static str>,
    /// Quote and cut keys too long or odd to show in a path (deployment YAML).
    cut_keys: bool,
}

/// How many characters of an input string a message shows.
const SHOWN_CHARS: usize = 80;

/// `s` quoted for a message, cut to its first 80 characters (then `…` and its length).
pub fn shown(s: &str) -> String {
    match s.char_indices().nth(SHOWN_CHARS) {
        None => format!("{s:?}"),
        Some((end, _)) => format!("{:?}… ({} bytes)", &s[..end], s.len()),
    }
}

/// `path.key` for messages; a key too long to show, or with control characters, is quoted
/// (and cut: [`shown`]).
pub fn join(path: &str, key: &str) -> String {
    let key = if key.chars().nth(SHOWN_CHARS).is_some() || key.chars().any(char::is_control) {
        shown(key)
    } else {
        key.to_string()
    };
    if path.is_empty() {
        key
    } else {
        format!("{path}.{key}")
    }
}

/// A value as the engine wording names it.
fn describe(v: &Value) -> String {
    match v {
        Value::String(s) => format!("the string {s:?}"),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
        other => other.to_string(),
    }
}

/// A value's kind as the deployment wording names it.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// A string that reads as a number too large for a float (`1e400`): YAML keeps it a string.
fn out_of_range(s: &str) -> bool {
    s.trim().parse::<f64>().is_ok_and(f64::is_infinite) && !s.to_ascii_lowercase().contains("inf")
}

impl<'a> Reader<'a> {
    /// An engine-JSON reader: `value` must be an object.
    pub fn new(prefix: &str, value: &'a Value) -> Result<Self> {
        match value {
            Value::Object(map) => Ok(Reader::over(prefix, map)),
            other => Err(ConfigError::new(prefix, format!("expected an object, got {}", describe(other)))),
        }
    }

    /// A reader over a map already in hand.
    pub fn over(prefix: &str, map: &'a Map<String, Value>) -> Self {
        Reader { prefix: prefix.to_string(), map, known: Vec::new(), cut_keys: false }
    }

    /// A deployment-YAML reader: `value` must be a mapping (null reads as an empty one).
    pub fn mapping(path: &str, value: &'a Value) -> Result<Self> {
        static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
        let map = match value {
            Value::Object(m) => m,
            Value::Null => EMPTY.get_or_init(Map::new),
            other => return Err(ConfigError::new(path, format!("must be a mapping, got {}", kind(other)))),
        };
        Ok(Reader { prefix: path.to_string(), map, known: Vec::new(), cut_keys: true })
    }

    /// The path of `key` below this object.
    pub fn path(&self, key: &str) -> String {
        if self.cut_keys {
            join(&self.prefix, key)
        } else if self.prefix.is_empty() {
            key.to_string()
        } else {
            format!("{}.{}", self.prefix, key)
        }
    }

    /// The path of this object.
    pub fn here(&self) -> &str {
        &self.prefix
    }

    /// An error about `key`.
    pub fn error(&self, key: &str, message: impl std::fmt::Display) -> ConfigError {
        ConfigError::new(self.path(key), message.to_string())
    }

    /// Whether `key` is present (even as `null`).
    pub fn has(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }

    /// Whether `key` is present and not `null`.
    pub fn given(&self, key: &str) -> bool {
        self.map.get(key).is_some_and(|v| !v.is_null())
    }

    /// The raw value of `key` (`null` included), registering it as known.
    pub fn raw(&mut self, key: &'static str) -> Option<&'a Value> {
        self.known.push(key);
        self.map.get(key)
    }

    /// The value of `key` unless absent or `null`, registering it as known.
    pub fn value(&mut self, key: &'static str) -> Option<&'a Value> {
        self.raw(key).filter(|v| !v.is_null())
    }

    /// Accepts `key` with any value; it has no effect on what servesim computes.
    pub fn ignored(&mut self, key: &'static str) {
        self.known.push(key);
    }

    /// Fails on the first key that no getter asked for.
    pub fn finish(self) -> Result<()> {
        for key in self.map.keys() {
            if !self.known.contains(&key.as_str()) {
                let mut known = self.known.clone();
                known.sort_unstable();
                known.dedup();
                return Err(ConfigError::new(
                    self.path(key),
                    format!("unknown key; expected one of: {}", known.join(", ")),
                ));
            }
        }
        Ok(())
    }
}

/// Engine JSON: "expected …, got …"; `null` is distinct from missing.
impl<'a> Reader<'a> {
    fn field(&mut self, key: &'static str) -> Field<&'a Value> {
        match self.raw(key) {
            None => Field::Missing,
            Some(Value::Null) => Field::Null,
            Some(v) => Field::Set(v),
        }
    }

    fn typed<T>(&mut self, key: &'static str, want: &str, f: impl Fn(&'a Value) -> Option<T>) -> Result<Field<T>> {
        match self.field(key) {
            Field::Missing => Ok(Field::Missing),
            Field::Null => Ok(Field::Null),
            Field::Set(v) => match f(v) {
                Some(t) => Ok(Field::Set(t)),
                None => Err(ConfigError::new(self.path(key), format!("expected {want}, got {}", describe(v)))),
            },
        }
    }

    pub fn u64(&mut self, key: &'static str) -> Result<Field<u64>> {
        self.typed(key, "a non-negative integer", |v| v.as_u64())
    }

    /// A non-negative integer that fits in u32.
    pub fn u32(&mut self, key: &'static str) -> Result<Field<u32>> {
        self.typed(key, "a non-negative integer below 2^32", |v| v.as_u64().and_then(|x| u32::try_from(x).ok()))
    }

    pub fn f64(&mut self, key: &'static str) -> Result<Field<f64>> {
        self.typed(key, "a number", |v| v.as_f64())
    }

    pub fn bool(&mut self, key: &'static str) -> Result<Field<bool>> {
        self.typed(key, "true or false", |v| v.as_bool())
    }

    pub fn string(&mut self, key: &'static str) -> Result<Field<&'a str>> {
        self.typed(key, "a string", |v| v.as_str())
    }

    /// A case-insensitive choice among `choices`; returns the index of the match.
    pub fn choice(&mut self, key: &'static str, choices: &[&str]) -> Result<Field<usize>> {
        match self.string(key)? {
            Field::Set(s) => match choices.iter().position(|c| c.eq_ignore_ascii_case(s)) {
                Some(i) => Ok(Field::Set(i)),
                None => Err(ConfigError::new(
                    self.path(key),
                    format!("unknown value {s:?}; expected one of {}", choices.join(", ")),
                )),
            },
            Field::Null => Ok(Field::Null),
            Field::Missing => Ok(Field::Missing),
        }
    }

    /// A nested object, if present and not null.
    pub fn object(&mut self, key: &'static str) -> Result<Option<Reader<'a>>> {
        let path = self.path(key);
        match self.field(key) {
            Field::Set(v) => Ok(Some(Reader::new(&path, v)?)),
            _ => Ok(None),
        }
    }

    /// Accepts `key` only when it is absent, null, or equal to `neutral` (a value that changes
    /// nothing); anything else names a feature servesim does not model.
    pub fn unsupported(&mut self, key: &'static str, neutral: &[Value], what: &str) -> Result<()> {
        if let Field::Set(v) = self.field(key) {
            if !neutral.contains(v) {
                return Err(ConfigError::new(self.path(key), format!("{what} is not supported by servesim")));
            }
        }
        Ok(())
    }
}

/// Deployment YAML: "must be …, got a …"; `null` is the same as absent.
impl<'a> Reader<'a> {
    /// A nested mapping, if present and not null.
    pub fn obj(&mut self, key: &'static str) -> Result<Option<Reader<'a>>> {
        let path = self.path(key);
        match self.value(key) {
            None => Ok(None),
            Some(v) => Reader::mapping(&path, v).map(Some),
        }
    }

    pub fn text(&mut self, key: &'static str) -> Result<Option<String>> {
        match self.value(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(self.error(key, format!("must be a string, got {}", kind(v)))),
        }
    }

    pub fn nonempty(&mut self, key: &'static str) -> Result<Option<String>> {
        match self.text(key)? {
            Some(s) if s.is_empty() => Err(self.error(key, "must be a nonempty string")),
            s => Ok(s),
        }
    }

    /// An exact (case-sensitive) choice among `allowed`.
    pub fn one_of(&mut self, key: &'static str, allowed: &[&'static str]) -> Result<Option<&'static str>> {
        let Some(s) = self.text(key)? else { return Ok(None) };
        allowed.iter().find(|a| **a == s).copied().map(Some).ok_or_else(|| {
            self.error(key, format!("unknown value {}; expected one of {}", shown(&s), allowed.join(", ")))
        })
    }

    pub fn flag(&mut self, key: &'static str) -> Result<Option<bool>> {
        match self.value(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.error(key, format!("must be true or false, got {}", kind(v)))),
        }
    }

    pub fn number(&mut self, key: &'static str) -> Result<Option<f64>> {
        match self.value(key) {
            None => Ok(None),
            Some(Value::Number(n)) => Ok(n.as_f64()),
            Some(Value::String(s)) if out_of_range(s) => {
                Err(self.error(key, format!("{} is out of range: a number must be finite", shown(s))))
            }
            Some(v) => Err(self.error(key, format!("must be a number, got {}", kind(v)))),
        }
    }

    /// A finite number ≥ 0 (`positive`: > 0).
    pub fn nonneg(&mut self, key: &'static str, positive: bool) -> Result<Option<f64>> {
        let v = self.number(key)?;
        if let Some(x) = v {
            let ok = x.is_finite() && if positive { x > 0.0 } else { x >= 0.0 };
            if !ok {
                let want = if positive { "a positive finite number" } else { "a finite number ≥ 0" };
                return Err(self.error(key, format!("must be {want}, got {x}")));
            }
        }
        Ok(v)
    }

    /// A non-negative integer. A float with no fractional part (`2.0`) is one, as in pydantic's
    /// lax mode; one beyond u64 (YAML's `99999999999999999999` reads as a float) is too large.
    pub fn integer(&mut self, key: &'static str) -> Result<Option<u64>> {
        const TOO_LARGE: &str = "is too large (an integer here is at most 18446744073709551615)";
        match self.value(key) {
            None => Ok(None),
            Some(Value::Number(n)) => {
                if let Some(u) = n.as_u64() {
                    return Ok(Some(u));
                }
                let x = n.as_f64().unwrap_or(f64::NAN);
                if n.is_i64() || x < 0.0 {
                    Err(self.error(key, format!("must be a non-negative integer, got {n}")))
                } else if x.fract() != 0.0 {
                    Err(self.error(key, format!("must be an integer, got {n}")))
                } else if x >= 18446744073709551616.0 {
                    Err(self.error(key, format!("the number {TOO_LARGE}")))
                } else {
                    Ok(Some(x as u64))
                }
            }
            Some(Value::String(s)) if out_of_range(s) && !s.trim().starts_with('-') => {
                Err(self.error(key, format!("{} {TOO_LARGE}", shown(s))))
            }
            Some(v) => Err(self.error(key, format!("must be an integer, got {}", kind(v)))),
        }
    }

    /// An integer ≥ `min` that fits u32.
    pub fn u32_min(&mut self, key: &'static str, min: u32) -> Result<Option<u32>> {
        match self.integer(key)? {
            None => Ok(None),
            Some(n) if n >= min as u64 && n <= u32::MAX as u64 => Ok(Some(n as u32)),
            Some(n) if n > u32::MAX as u64 => {
                Err(self.error(key, format!("{n} is too large (an integer here is at most {})", u32::MAX)))
            }
            Some(n) => Err(self.error(key, format!("must be an integer ≥ {min}, got {n}"))),
        }
    }

    pub fn positive(&mut self, key: &'static str) -> Result<Option<u32>> {
        self.u32_min(key, 1)
    }
}

/// Dynamo's Planner: "Input should be …, got …", as pydantic words it. A getter takes a key and
/// its aliases (the first present wins) and does not register them: the Planner checks its keys
/// against its own lists.
impl Reader<'_> {
    /// The value of the first of `keys` present and not null.
    fn first<'k>(&self, keys: &[&'k str]) -> Option<(&'k str, &Value)> {
        keys.iter().find_map(|k| self.map.get(*k).filter(|v| !v.is_null()).map(|v| (*k, v)))
    }

    /// An integer; a float with no fractional part is one.
    pub fn pydantic_int(&self, keys: &[&str]) -> Result<Option<i64>> {
        match self.first(keys) {
            None => Ok(None),
            Some((k, v)) => match v.as_i64().or_else(|| v.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i64)) {
                Some(i) => Ok(Some(i)),
                None => Err(self.error(k, format!("Input should be a valid integer, got {v}"))),
            },
        }
    }

    /// A finite number.
    pub fn pydantic_number(&self, keys: &[&str]) -> Result<Option<f64>> {
        match self.first(keys) {
            None => Ok(None),
            Some((k, v)) => match v.as_f64() {
                Some(f) if f.is_finite() => Ok(Some(f)),
                _ => Err(self.error(k, format!("Input should be a valid number, got {v}"))),
            },
        }
    }

    /// A boolean, or a string pydantic reads as one (`"yes"`, `"off"`, …).
    pub fn pydantic_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.first(&[key]) {
            None => Ok(None),
            Some((k, v)) => match v {
                Value::Bool(b) => Ok(Some(*b)),
                Value::String(s) if matches!(s.to_ascii_lowercase().as_str(), "true" | "1" | "yes" | "on") => {
                    Ok(Some(true))
                }
                Value::String(s) if matches!(s.to_ascii_lowercase().as_str(), "false" | "0" | "no" | "off") => {
                    Ok(Some(false))
                }
                _ => Err(self.error(k, format!("Input should be a valid boolean, got {v}"))),
            },
        }
    }

    /// One of `choices`, exactly (a `Literal[...]`).
    pub fn pydantic_literal<'c>(&self, key: &str, choices: &[&'c str]) -> Result<Option<&'c str>> {
        match self.first(&[key]) {
            None => Ok(None),
            Some((k, v)) => {
                let s = v.as_str().unwrap_or("");
                choices.iter().find(|c| **c == s).copied().map(Some).ok_or_else(|| {
                    let list: Vec<String> = choices.iter().map(|c| format!("'{c}'")).collect();
                    self.error(k, format!("Input should be {}, got {v}", list.join(", ")))
                })
            }
        }
    }
}
