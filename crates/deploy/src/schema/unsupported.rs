//! Keys the reference accepts for what servesim does not model: refused by path, or accepted
//! only at the reference's defaults (the estimator controls of its canonical dumps).

use serde_json::{json, Value};

use crate::error::DeployError;
use crate::reader::ErrAt;
use servesim_config::Reader;

/// The reference's estimator controls as its canonical dumps write them: online correction and
/// FPM-regression settings (which tune the model from observed forward passes), feature weights,
/// and the FPM-interpolation method.
pub(super) fn estimator_defaults() -> Value {
    let sampling = json!({"bins_per_axis": [4, 4], "max_observations": 64});
    json!({
        "correction": {
            "enabled": true,
            "factor_bounds": {"max": 2.0, "min": 0.5},
            "feature_space": "legacy_workload",
            "max_batch_size": 512,
            "max_kv_tokens": 2_000_000,
            "max_num_tokens": 8192,
            "min_observations": 5,
            "sampling": sampling,
        },
        "features": {"attention_kv_weight": 1.0, "ffn_token_weight": 1.0, "prefill_attention_pair_weight": 1.0},
        "fpm_interpolation": {"method": "sol"},
        "fpm_regression": {
            "fit": {"kind": "standardized_nnls", "rebuild_interval": null, "singular_ridge_scale": 1e-9},
            "min_observations": 5,
            "sampling": sampling,
        },
        "op_level": {},
    })
}

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
