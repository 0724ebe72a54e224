//! Keys the reference accepts for what servesim does not model: refused by path, or accepted
//! only at the reference's defaults (the transfer policy of its canonical dumps).

use serde_json::Value;

use crate::error::DeployError;
use crate::reader::ErrAt;
use servesim_config::Reader;

/// Accepts `given` when every value it sets is the reference's default (a mapping may leave
/// keys out); anything else is a setting servesim does not model.
pub(super) fn only_defaults(path: &str, given: &Value, default: &Value) -> Result<(), DeployError> {
    match (given, default) {
        (Value::Object(g), Value::Object(d)) => {
            for (k, v) in g {
                let at = crate::reader::join(path, k);
                match d.get(k) {
                    Some(dv) => only_defaults(&at, v, dv)?,
                    None => return Err(DeployError::new(at, "unknown key")),
                }
            }
            Ok(())
        }
        (Value::Null, _) => Ok(()),
        (Value::Number(a), Value::Number(b)) if a.as_f64() == b.as_f64() => Ok(()),
        (g, d) if g == d => Ok(()),
        (_, d) => {
            Err(DeployError::new(path, format!("only the reference's default ({d}) is supported by servesim yet")))
        }
    }
}

pub(super) fn unsupported(o: &mut Reader, key: &'static str, what: &str) -> Result<(), DeployError> {
    if o.value(key).is_some() {
        return Err(o.err(key, format!("{what} is not supported by servesim yet")));
    }
    Ok(())
}
