//! `estimator_config` (of the engine or of a worker's `timing`): the reference's settings of its
//! forward-pass-measurement (FPM) estimators — online correction, FPM interpolation and
//! regression, and the regression's feature weights. They tune only those estimators; the
//! op-level estimator, the one forward model servesim times with (`timing.forward_model: fpm`
//! is refused), reads none of them, so the reference's predictions with any accepted value
//! equal its predictions without the block (probed: `correction: {enabled: false}`,
//! `min_observations: 7`, a negative feature weight, `fit: {kind: spline}`). servesim therefore
//! checks the block as the installed reference does (its types, names, enumerations and ranges,
//! probed) and then ignores it. The few settings whose shape servesim does not know (FPM
//! profiles, learned and selector estimators, linear and spline fit tuning) are refused.

use serde_json::{Map, Value};

use crate::error::DeployError;
use crate::reader::join;

type Check = Result<(), DeployError>;

/// Settings the reference accepts whose accepted shapes servesim does not know.
const UNKNOWN_SHAPES: [&str; 7] = [
    "fpm_learned",
    "selector",
    "op_level.execution_profile",
    "correction.mode",
    "fpm_interpolation.fpm_parquet_path",
    "fpm_regression.fit.linear",
    "fpm_regression.fit.spline",
];

const AXES: [&str; 19] = [
    "attention",
    "moe",
    "n",
    "E",
    "P",
    "maxE",
    "maxP",
    "minP",
    "P2",
    "F",
    "nE",
    "logF",
    "meanE",
    "meanP",
    "cvE2",
    "cvP2",
    "logN",
    "n2",
    "logP",
];

/// Checks an `estimator_config` at `path` as the reference reads it (first every key and type,
/// then the ranges, in the reference's order).
pub(super) fn check_estimator_config(path: &str, v: &Value) -> Check {
    if v.is_null() {
        return Ok(());
    }
    let top = object(
        path,
        Some(v),
        &["features", "op_level", "fpm_interpolation", "fpm_regression", "fpm_learned", "selector", "correction"],
    )?;
    let Some(top) = top else { return Ok(()) };
    for rel in UNKNOWN_SHAPES {
        if lookup(top, rel).is_some_and(|x| !x.is_null()) {
            return Err(DeployError::new(join(path, rel), "this setting is not supported by servesim yet"));
        }
    }
    let at = |k: &str| join(path, k);
    let features = object(
        &at("features"),
        top.get("features"),
        &["attention_kv_weight", "prefill_attention_pair_weight", "ffn_token_weight"],
    )?;
    for (k, x) in features.into_iter().flatten() {
        weight(&join(&at("features"), k), x)?;
    }
    object(&at("op_level"), top.get("op_level"), &["execution_profile"])?;
    let interp = at("fpm_interpolation");
    if let Some(o) = object(
        &interp,
        top.get("fpm_interpolation"),
        &["method", "text_only", "fpm_parquet_path", "collect_coverage", "unrecorded_quant_modes"],
    )? {
        variant(&join(&interp, "method"), o.get("method"), &["auto", "sol", "direct"])?;
        boolean(&join(&interp, "text_only"), o.get("text_only"))?;
        boolean(&join(&interp, "collect_coverage"), o.get("collect_coverage"))?;
        list(&join(&interp, "unrecorded_quant_modes"), o.get("unrecorded_quant_modes"), |p, x| {
            variant(p, Some(x), &["fmha", "comm"])
        })?;
    }
    // The regression's sampling and fit, with the defaults the reference fills in.
    let reg = at("fpm_regression");
    let invalid_reg = |field: &str, why: &str| DeployError::new(join(&reg, field), why);
    let (mut axes_len, mut bins, mut reg_max, mut reg_min, mut ridge, mut rebuild) =
        (2usize, vec![4u64, 4], 64u64, 5u64, 1e-9f64, None::<u64>);
    let (mut default_axes, mut spline) = (true, false);
    if let Some(o) = object(&reg, top.get("fpm_regression"), &["sampling", "min_observations", "fit"])? {
        let s = join(&reg, "sampling");
        if let Some(so) = object(&s, o.get("sampling"), &["axes", "bins_per_axis", "max_observations"])? {
            if let Some(axes) = list(&join(&s, "axes"), so.get("axes"), |p, x| variant(p, Some(x), &AXES))? {
                let names: Vec<&Value> = axes.iter().collect();
                if !(1..=6).contains(&names.len()) {
                    return Err(invalid_reg("sampling.axes", "must contain 1 to 6 axes"));
                }
                if names.iter().enumerate().any(|(i, a)| names[..i].contains(a)) {
                    return Err(invalid_reg("sampling.axes", "must not contain repeated axes"));
                }
                axes_len = names.len();
                default_axes = names.len() == 2 && names[0] == "attention" && names[1] == "moe";
            }
            if let Some(b) = list(&join(&s, "bins_per_axis"), so.get("bins_per_axis"), |p, x| {
                unsigned(p, Some(x), u64::MAX).map(|_| ())
            })? {
                bins = b.iter().filter_map(Value::as_u64).collect();
            }
            reg_max = unsigned(&join(&s, "max_observations"), so.get("max_observations"), u64::MAX)?.unwrap_or(reg_max);
        }
        reg_min = unsigned(&join(&reg, "min_observations"), o.get("min_observations"), u64::MAX)?.unwrap_or(reg_min);
        let f = join(&reg, "fit");
        if let Some(fo) =
            object(&f, o.get("fit"), &["kind", "singular_ridge_scale", "rebuild_interval", "linear", "spline"])?
        {
            variant(&join(&f, "kind"), fo.get("kind"), &["standardized_nnls", "linear", "spline"])?;
            spline = fo.get("kind").and_then(Value::as_str) == Some("spline");
            let r = fo.get("singular_ridge_scale");
            if r.is_some_and(Value::is_null) {
                return Err(DeployError::new(join(&f, "singular_ridge_scale"), "must be a number, got null"));
            }
            ridge = number(&join(&f, "singular_ridge_scale"), r)?.unwrap_or(ridge);
            // The one optional count: null is "never rebuild on a timer".
            rebuild =
                unsigned(&join(&f, "rebuild_interval"), fo.get("rebuild_interval").filter(|x| !x.is_null()), u64::MAX)?;
        }
    }
    let corr = at("correction");
    let (mut c_bins, mut c_max, mut c_min, mut lo, mut hi) = ([4u64, 4], 64u64, 5u64, Some(0.5), Some(2.0));
    let (mut tokens, mut batch, mut kv) = (8192u64, 512u64, 2_000_000u64);
    if let Some(o) = object(
        &corr,
        top.get("correction"),
        &[
            "enabled",
            "mode",
            "feature_space",
            "sampling",
            "min_observations",
            "factor_bounds",
            "max_num_tokens",
            "max_batch_size",
            "max_kv_tokens",
        ],
    )? {
        boolean(&join(&corr, "enabled"), o.get("enabled"))?;
        variant(&join(&corr, "feature_space"), o.get("feature_space"), &["legacy_workload"])?;
        let s = join(&corr, "sampling");
        if let Some(so) = object(&s, o.get("sampling"), &["bins_per_axis", "max_observations"])? {
            if let Some(b) = list(&join(&s, "bins_per_axis"), so.get("bins_per_axis"), |p, x| {
                unsigned(p, Some(x), u64::MAX).map(|_| ())
            })? {
                if b.len() != 2 {
                    return Err(DeployError::new(
                        join(&s, "bins_per_axis"),
                        format!("expected an array of length 2, got {}", b.len()),
                    ));
                }
                c_bins = [b[0].as_u64().unwrap_or(0), b[1].as_u64().unwrap_or(0)];
            }
            c_max = unsigned(&join(&s, "max_observations"), so.get("max_observations"), u64::MAX)?.unwrap_or(c_max);
        }
        c_min = unsigned(&join(&corr, "min_observations"), o.get("min_observations"), u64::MAX)?.unwrap_or(c_min);
        let b = join(&corr, "factor_bounds");
        if let Some(bo) = object(&b, o.get("factor_bounds"), &["min", "max"])? {
            // A given mapping replaces the defaults: a bound it leaves out is unbounded.
            lo = number(&join(&b, "min"), bo.get("min"))?;
            hi = number(&join(&b, "max"), bo.get("max"))?;
        }
        let u32_max = u32::MAX as u64;
        tokens = unsigned(&join(&corr, "max_num_tokens"), o.get("max_num_tokens"), u32_max)?.unwrap_or(tokens);
        batch = unsigned(&join(&corr, "max_batch_size"), o.get("max_batch_size"), u32_max)?.unwrap_or(batch);
        kv = unsigned(&join(&corr, "max_kv_tokens"), o.get("max_kv_tokens"), u32_max)?.unwrap_or(kv);
    }
    // The reference's validation, in its order.
    if axes_len != bins.len() {
        return Err(invalid_reg("sampling.bins_per_axis", "must contain exactly one bin count per sampling axis"));
    }
    if !(1..=6).contains(&bins.len()) {
        return Err(invalid_reg("sampling.bins_per_axis", "must contain 1 to 6 bin counts"));
    }
    if bins
        .iter()
        .try_fold(1u64, |n, &b| if b == 0 { None } else { n.checked_mul(b) })
        .is_none_or(|n| n > isize::MAX as u64)
    {
        return Err(invalid_reg("sampling.bins_per_axis", "must be positive and have a representable product"));
    }
    if reg_max == 0 {
        return Err(invalid_reg("sampling.max_observations", "must be positive"));
    }
    if rebuild == Some(0) {
        return Err(invalid_reg("fit.rebuild_interval", "must be positive or null"));
    }
    if spline && !default_axes {
        return Err(invalid_reg("sampling.axes", "must be ['attention', 'moe'] for spline fitting"));
    }
    if spline && reg_max < 32 {
        return Err(invalid_reg("sampling.max_observations", "must be at least 32 for spline fitting"));
    }
    if !ridge.is_finite() || ridge < 0.0 {
        return Err(invalid_reg("fit.singular_ridge_scale", "must be finite and nonnegative"));
    }
    let options = |what: &str, max: u64, min: u64| -> Check {
        let why = if max == 0 {
            "max_observations must be >= 1"
        } else if min == 0 {
            "min_observations must be >= 1"
        } else if min > max {
            "min_observations must be <= max_observations"
        } else {
            return Ok(());
        };
        Err(DeployError::new(join(path, what), why))
    };
    options("correction", c_max, c_min)?;
    let bounds_why = if lo.is_some_and(|x: f64| !x.is_finite() || x <= 0.0 || x > 1.0) {
        Some("factor_bounds.min must be finite and in (0.0, 1.0]")
    } else if hi.is_some_and(|x: f64| !x.is_finite() || x < 1.0) {
        Some("factor_bounds.max must be finite and >= 1.0")
    } else if tokens == 0 {
        Some("max_num_tokens must be >= 1")
    } else if batch == 0 {
        Some("max_batch_size must be >= 1")
    } else if kv == 0 {
        Some("max_kv_tokens must be >= 1")
    } else if c_bins.contains(&0) {
        Some("sampling.bins_per_axis must be positive")
    } else {
        None
    };
    if let Some(why) = bounds_why {
        return Err(DeployError::new(corr, why));
    }
    options("fpm_regression", reg_max, reg_min)
}

/// `rel` (dotted) inside `o`.
fn lookup<'a>(o: &'a Map<String, Value>, rel: &str) -> Option<&'a Value> {
    let mut parts = rel.split('.');
    let mut cur = o.get(parts.next()?)?;
    for p in parts {
        cur = cur.as_object()?.get(p)?;
    }
    Some(cur)
}

/// A mapping with only `keys` (null: absent, all defaults).
fn object<'a>(path: &str, v: Option<&'a Value>, keys: &[&str]) -> Result<Option<&'a Map<String, Value>>, DeployError> {
    match v {
        None => Ok(None),
        Some(Value::Object(o)) => {
            for k in o.keys() {
                if !keys.contains(&k.as_str()) {
                    return Err(DeployError::new(
                        join(path, k),
                        format!("unknown key; expected one of: {}", keys.join(", ")),
                    ));
                }
            }
            Ok(Some(o))
        }
        Some(other) => Err(DeployError::new(path, format!("must be a mapping, got {other}"))),
    }
}

fn boolean(path: &str, v: Option<&Value>) -> Check {
    match v {
        None | Some(Value::Bool(_)) => Ok(()),
        Some(other) => Err(DeployError::new(path, format!("must be true or false, got {other}"))),
    }
}

fn variant(path: &str, v: Option<&Value>, allowed: &[&str]) -> Check {
    match v {
        None => Ok(()),
        Some(Value::String(s)) if allowed.contains(&s.as_str()) => Ok(()),
        Some(other) => Err(DeployError::new(path, format!("{other} is not one of: {}", allowed.join(", ")))),
    }
}

/// A nonnegative integer up to `max`, if given.
fn unsigned(path: &str, v: Option<&Value>, max: u64) -> Result<Option<u64>, DeployError> {
    match v {
        None => Ok(None),
        Some(x) => match x.as_u64() {
            Some(n) if n <= max => Ok(Some(n)),
            _ => Err(DeployError::new(path, format!("must be an integer in 0..={max}, got {x}"))),
        },
    }
}

/// A number; null is absent.
fn number(path: &str, v: Option<&Value>) -> Result<Option<f64>, DeployError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x.as_f64().map(Some).ok_or_else(|| DeployError::new(path, format!("must be a number, got {x}"))),
    }
}

/// A feature weight: any number, or the reference's spellings of the non-finite ones.
fn weight(path: &str, v: &Value) -> Check {
    match v {
        Value::Number(_) => Ok(()),
        Value::String(s) if matches!(s.as_str(), "NaN" | "Infinity" | "-Infinity") => Ok(()),
        other => Err(DeployError::new(path, format!("must be a number, got {other}"))),
    }
}

/// A list whose every entry passes `each`; null is absent.
fn list<'a>(
    path: &str,
    v: Option<&'a Value>,
    each: impl Fn(&str, &Value) -> Check,
) -> Result<Option<&'a Vec<Value>>, DeployError> {
    match v {
        None => Ok(None),
        Some(Value::Array(a)) => {
            for (i, x) in a.iter().enumerate() {
                each(&format!("{path}[{i}]"), x)?;
            }
            Ok(Some(a))
        }
        Some(other) => Err(DeployError::new(path, format!("must be a list, got {other}"))),
    }
}
