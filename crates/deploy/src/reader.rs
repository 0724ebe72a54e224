//! A strict, path-aware reader over one mapping of the configuration tree: every key is taken
//! by name, values are checked, and `finish` rejects whatever was not taken, naming its path.

use serde_json::{Map, Value};

use crate::error::DeployError;
pub use crate::tree::join;
use crate::tree::shown;

pub struct Obj<'a> {
    path: String,
    map: &'a Map<String, Value>,
    taken: Vec<&'static str>,
}

/// A string that reads as a number too large for a float (`1e400`): YAML keeps it a string.
fn out_of_range(s: &str) -> bool {
    s.trim().parse::<f64>().is_ok_and(f64::is_infinite) && !s.to_ascii_lowercase().contains("inf")
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
        allowed.iter().find(|a| **a == s).copied().map(Some).ok_or_else(|| {
            self.err(key, format!("unknown value {}; expected one of {}", shown(&s), allowed.join(", ")))
        })
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
            Some(Value::String(s)) if out_of_range(s) => {
                Err(self.err(key, format!("{} is out of range: a number must be finite", shown(s))))
            }
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

    /// A non-negative integer. A float with no fractional part (`2.0`) is one, as in pydantic's
    /// lax mode; one beyond u64 (YAML's `99999999999999999999` reads as a float) is too large.
    pub fn u64(&mut self, key: &'static str) -> Result<Option<u64>, DeployError> {
        const TOO_LARGE: &str = "is too large (an integer here is at most 18446744073709551615)";
        match self.raw(key) {
            None => Ok(None),
            Some(Value::Number(n)) => {
                if let Some(u) = n.as_u64() {
                    return Ok(Some(u));
                }
                let x = n.as_f64().unwrap_or(f64::NAN);
                if n.is_i64() || x < 0.0 {
                    Err(self.err(key, format!("must be a non-negative integer, got {n}")))
                } else if x.fract() != 0.0 {
                    Err(self.err(key, format!("must be an integer, got {n}")))
                } else if x >= 18446744073709551616.0 {
                    Err(self.err(key, format!("the number {TOO_LARGE}")))
                } else {
                    Ok(Some(x as u64))
                }
            }
            Some(Value::String(s)) if out_of_range(s) && !s.trim().starts_with('-') => {
                Err(self.err(key, format!("{} {TOO_LARGE}", shown(s))))
            }
            Some(v) => Err(self.err(key, format!("must be an integer, got {}", kind(v)))),
        }
    }

    /// An integer ≥ `min` that fits u32.
    pub fn u32_min(&mut self, key: &'static str, min: u32) -> Result<Option<u32>, DeployError> {
        match self.u64(key)? {
            None => Ok(None),
            Some(n) if n >= min as u64 && n <= u32::MAX as u64 => Ok(Some(n as u32)),
            Some(n) if n > u32::MAX as u64 => {
                Err(self.err(key, format!("{n} is too large (an integer here is at most {})", u32::MAX)))
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::{apply_set, parse_yaml};

    fn read_u64(yaml: &str) -> Result<Option<u64>, String> {
        let v = parse_yaml(yaml).unwrap();
        let mut o = Obj::new("stop", &v["stop"]).unwrap();
        o.u64("requests").map_err(|e| e.to_string())
    }

    /// N20: integers too large, out-of-range numbers written as strings, and integral floats.
    #[test]
    fn integers_get_clear_messages() {
        let too_large = "stop.requests: the number is too large (an integer here is at most 18446744073709551615)";
        assert_eq!(read_u64("stop: {requests: 99999999999999999999}"), Err(too_large.to_string()));
        assert_eq!(read_u64("stop: {requests: 1.0e+30}"), Err(too_large.to_string()));
        assert_eq!(read_u64("stop: {requests: 2.0}"), Ok(Some(2)));
        assert_eq!(read_u64("stop: {requests: 2.5}"), Err("stop.requests: must be an integer, got 2.5".into()));
        assert_eq!(
            read_u64("stop: {requests: -3}"),
            Err("stop.requests: must be a non-negative integer, got -3".into())
        );
        assert_eq!(
            read_u64("stop: {requests: -3.0}"),
            Err("stop.requests: must be a non-negative integer, got -3.0".into())
        );
        let mut v = parse_yaml("stop: {}").unwrap();
        apply_set(&mut v, "stop.requests=1e400").unwrap();
        let mut o = Obj::new("stop", &v["stop"]).unwrap();
        assert_eq!(
            o.u64("requests").unwrap_err().to_string(),
            "stop.requests: \"1e400\" is too large (an integer here is at most 18446744073709551615)"
        );
        let v = parse_yaml("stop: {rate: 1e400, n: 4294967296}").unwrap();
        let mut o = Obj::new("stop", &v["stop"]).unwrap();
        assert_eq!(
            o.f64("rate").unwrap_err().to_string(),
            "stop.rate: \"1e400\" is out of range: a number must be finite"
        );
        assert_eq!(
            o.positive("n").unwrap_err().to_string(),
            "stop.n: 4294967296 is too large (an integer here is at most 4294967295)"
        );
    }

    /// N17: an unknown value and an unknown key are shown cut to 80 characters.
    #[test]
    fn long_values_and_keys_are_cut() {
        let long = "v".repeat(1000);
        let v = parse_yaml(&format!("e: {{backend: {long}, {long}: 1}}")).unwrap();
        let mut o = Obj::new("e", &v["e"]).unwrap();
        let cut = format!("{:?}… (1000 bytes)", "v".repeat(80));
        assert_eq!(
            o.choice("backend", &["vllm", "sglang"]).unwrap_err().to_string(),
            format!("e.backend: unknown value {cut}; expected one of vllm, sglang")
        );
        assert_eq!(o.finish().unwrap_err().to_string(), format!("e.{cut}: unknown key; expected one of: backend"));
    }
}
