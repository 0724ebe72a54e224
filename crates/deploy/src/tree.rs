//! The configuration as a tree: YAML text to a JSON value (one mapping), and `--set PATH=VALUE`
//! overrides applied to it before the schema reads it.

use serde_json::{Map, Value};

use crate::DeployError;

/// Reads YAML text into a JSON value; the document must be one mapping.
pub fn parse_yaml(text: &str) -> Result<Value, DeployError> {
    let value: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(text).map_err(|e| DeployError::new("", format!("malformed YAML: {e}")))?;
    let json = to_json("", value)?;
    if !json.is_object() {
        return Err(DeployError::new("", "the configuration must contain one YAML mapping"));
    }
    Ok(json)
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
        Y::String(s) => Value::String(s),
        Y::Sequence(items) => Value::Array(
            items
                .into_iter()
                .enumerate()
                .map(|(i, x)| to_json(&format!("{path}[{i}]"), x))
                .collect::<Result<_, _>>()?,
        ),
        Y::Mapping(m) => {
            let mut out = Map::new();
            for (k, v) in m {
                let key = match k {
                    Y::String(s) => s,
                    other => {
                        return Err(DeployError::new(path, format!("mapping keys must be strings, got {other:?}")))
                    }
                };
                let child = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
                let v = to_json(&child, v)?;
                out.insert(key, v);
            }
            Value::Object(out)
        }
        Y::Tagged(t) => to_json(path, t.value)?,
    })
}

/// Applies one `PATH=VALUE` override: a dotted path of mapping keys (no list indexes) and a
/// YAML value. Missing mappings along the path are created.
pub fn apply_set(root: &mut Value, spec: &str) -> Result<(), DeployError> {
    let (path, text) =
        spec.split_once('=').ok_or_else(|| DeployError::new("", format!("--set {spec:?}: expected PATH=VALUE")))?;
    let path = path.trim();
    let parts: Vec<&str> = path.split('.').collect();
    if path.is_empty() || parts.iter().any(|p| p.is_empty()) {
        return Err(DeployError::new("", format!("--set {spec:?}: the path must be dot-separated keys")));
    }
    let value: serde_yaml_ng::Value = serde_yaml_ng::from_str(text)
        .map_err(|e| DeployError::new(path, format!("--set: malformed YAML value {text:?}: {e}")))?;
    let value = to_json(path, value)?;
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

    #[test]
    fn yaml_must_be_a_mapping() {
        assert!(parse_yaml("- 1\n- 2\n").unwrap_err().to_string().contains("one YAML mapping"));
        assert!(parse_yaml("a: [1, \n").unwrap_err().to_string().contains("malformed YAML"));
    }
}
