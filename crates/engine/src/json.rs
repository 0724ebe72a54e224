//! A small strict reader over JSON objects: typed getters that name the offending key, a clear
//! difference between a missing key and an explicit `null`, and rejection of unknown keys.

use serde_json::{Map, Value};
use std::fmt;

/// A configuration error naming the key path (`engine.block_size`) it is about.
#[derive(Clone, Debug, PartialEq)]
pub struct ConfigError {
    pub path: String,
    pub message: String,
}

impl ConfigError {
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError { path: path.into(), message: message.into() }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "`{}`: {}", self.path, self.message)
        }
    }
}

impl std::error::Error for ConfigError {}

pub type Result<T> = std::result::Result<T, ConfigError>;

/// A key's state: absent, explicitly `null`, or a value.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Field<T> {
    #[default]
    Missing,
    Null,
    Set(T),
}

impl<T> Field<T> {
    /// The value, with `null` and missing both meaning "use the default".
    pub fn or(self, default: T) -> T {
        match self {
            Field::Set(v) => v,
            _ => default,
        }
    }

    /// `Some(v)` if set, `None` if null, `default` if missing.
    pub fn nullable_or(self, default: Option<T>) -> Option<T> {
        match self {
            Field::Missing => default,
            Field::Null => None,
            Field::Set(v) => Some(v),
        }
    }

    pub fn set(self) -> Option<T> {
        match self {
            Field::Set(v) => Some(v),
            _ => None,
        }
    }

    pub fn is_set(&self) -> bool {
        matches!(self, Field::Set(_))
    }
}

/// Reads the keys of one JSON object; [`ObjectReader::finish`] rejects the keys nobody asked for.
pub struct ObjectReader<'a> {
    prefix: String,
    map: &'a Map<String, Value>,
    known: Vec<&'static str>,
}

fn describe(v: &Value) -> String {
    match v {
        Value::String(s) => format!("the string {s:?}"),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
        other => other.to_string(),
    }
}

impl<'a> ObjectReader<'a> {
    pub fn new(prefix: &str, value: &'a Value) -> Result<Self> {
        match value {
            Value::Object(map) => Ok(ObjectReader { prefix: prefix.to_string(), map, known: Vec::new() }),
            other => Err(ConfigError::new(prefix, format!("expected an object, got {}", describe(other)))),
        }
    }

    pub fn path(&self, key: &str) -> String {
        if self.prefix.is_empty() {
            key.to_string()
        } else {
            format!("{}.{}", self.prefix, key)
        }
    }

    pub fn has(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }

    /// The raw value of `key`, registering it as known.
    pub fn raw(&mut self, key: &'static str) -> Option<&'a Value> {
        self.known.push(key);
        self.map.get(key)
    }

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
    pub fn object(&mut self, key: &'static str) -> Result<Option<ObjectReader<'a>>> {
        let path = self.path(key);
        match self.field(key) {
            Field::Set(v) => Ok(Some(ObjectReader::new(&path, v)?)),
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
