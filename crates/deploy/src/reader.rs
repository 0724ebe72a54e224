//! A strict, path-aware reader over one mapping of the configuration tree: every key is taken
//! by name, values are checked, and `finish` rejects whatever was not taken, naming its path.

use serde_json::{Map, Value};

use crate::DeployError;

pub struct Obj<'a> {
    path: String,
    map: &'a Map<String, Value>,
    taken: Vec<&'static str>,
}

pub fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

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

impl<'a> Obj<'a> {
    /// `v` must be a mapping (null reads as an empty one).
    pub fn new(path: &str, v: &'a Value) -> Result<Obj<'a>, DeployError> {
        static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
        let map = match v {
            Value::Object(m) => m,
            Value::Null => EMPTY.get_or_init(Map::new),
            other => return Err(DeployError::new(path, format!("must be a mapping, got {}", kind(other)))),
        };
        Ok(Obj { path: path.to_string(), map, taken: Vec::new() })
    }

    pub fn path(&self, key: &str) -> String {
        join(&self.path, key)
    }

    pub fn here(&self) -> &str {
        &self.path
    }

    pub fn has(&self, key: &str) -> bool {
        self.map.get(key).is_some_and(|v| !v.is_null())
    }

    pub fn raw(&mut self, key: &'static str) -> Option<&'a Value> {
        self.taken.push(key);
        self.map.get(key).filter(|v| !v.is_null())
    }

    pub fn err(&self, key: &str, msg: impl std::fmt::Display) -> DeployError {
        DeployError::new(self.path(key), msg)
    }

    pub fn obj(&mut self, key: &'static str) -> Result<Option<Obj<'a>>, DeployError> {
        let path = self.path(key);
        match self.raw(key) {
            None => Ok(None),
            Some(v) => Obj::new(&path, v).map(Some),
        }
    }

    pub fn string(&mut self, key: &'static str) -> Result<Option<String>, DeployError> {
        match self.raw(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(self.err(key, format!("must be a string, got {}", kind(v)))),
        }
    }

    pub fn nonempty(&mut self, key: &'static str) -> Result<Option<String>, DeployError> {
        match self.string(key)? {
            Some(s) if s.is_empty() => Err(self.err(key, "must be a nonempty string")),
            s => Ok(s),
        }
    }

    pub fn choice(&mut self, key: &'static str, allowed: &[&'static str]) -> Result<Option<&'static str>, DeployError> {
        let Some(s) = self.string(key)? else { return Ok(None) };
        allowed
            .iter()
            .find(|a| **a == s)
            .copied()
            .map(Some)
            .ok_or_else(|| self.err(key, format!("unknown value {s:?}; expected one of {}", allowed.join(", "))))
    }

    pub fn bool(&mut self, key: &'static str) -> Result<Option<bool>, DeployError> {
        match self.raw(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.err(key, format!("must be true or false, got {}", kind(v)))),
        }
    }

    pub fn f64(&mut self, key: &'static str) -> Result<Option<f64>, DeployError> {
        match self.raw(key) {
            None => Ok(None),
            Some(Value::Number(n)) => Ok(n.as_f64()),
            Some(v) => Err(self.err(key, format!("must be a number, got {}", kind(v)))),
        }
    }

    /// A finite number ≥ 0 (`positive`: > 0).
    pub fn nonneg(&mut self, key: &'static str, positive: bool) -> Result<Option<f64>, DeployError> {
        let v = self.f64(key)?;
        if let Some(x) = v {
            let ok = x.is_finite() && if positive { x > 0.0 } else { x >= 0.0 };
            if !ok {
                let want = if positive { "a positive finite number" } else { "a finite number ≥ 0" };
                return Err(self.err(key, format!("must be {want}, got {x}")));
            }
        }
        Ok(v)
    }

    pub fn u64(&mut self, key: &'static str) -> Result<Option<u64>, DeployError> {
        match self.raw(key) {
            None => Ok(None),
            Some(Value::Number(n)) => {
                n.as_u64().map(Some).ok_or_else(|| self.err(key, format!("must be a non-negative integer, got {n}")))
            }
            Some(v) => Err(self.err(key, format!("must be an integer, got {}", kind(v)))),
        }
    }

    /// An integer ≥ `min` that fits u32.
    pub fn u32_min(&mut self, key: &'static str, min: u32) -> Result<Option<u32>, DeployError> {
        match self.u64(key)? {
            None => Ok(None),
            Some(n) if n >= min as u64 && n <= u32::MAX as u64 => Ok(Some(n as u32)),
            Some(n) => Err(self.err(key, format!("must be an integer ≥ {min}, got {n}"))),
        }
    }

    pub fn positive(&mut self, key: &'static str) -> Result<Option<u32>, DeployError> {
        self.u32_min(key, 1)
    }

    /// Rejects any key not taken, naming its path and the accepted keys.
    pub fn finish(self) -> Result<(), DeployError> {
        for k in self.map.keys() {
            if !self.taken.contains(&k.as_str()) {
                let mut known = self.taken.clone();
                known.sort_unstable();
                known.dedup();
                return Err(DeployError::new(
                    join(&self.path, k),
                    format!("unknown key; expected one of: {}", known.join(", ")),
                ));
            }
        }
        Ok(())
    }
}
