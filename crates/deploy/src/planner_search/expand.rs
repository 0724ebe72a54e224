//! The section expanded into concrete `planner:` sections: the space's points in the adapter's
//! order, each materialised through the Planner's configuration (refusals kept as infeasible),
//! equal sections listed once.

use serde_json::{json, Map, Value};
use servesim_planner::config::{PlannerConfig, PredictorKind};
use servesim_planner::PASSTHROUGH_KEYS;

use super::backtest::sweep_load_predictor;
use super::presets::{
    pair_fields, scaling_fields, Predictor, FPM_KEYS, FPM_SAMPLING, LOAD_KEYS, LOAD_PREDICTOR_PRESETS,
    LOAD_SENSITIVITY, PREDICTOR_KEYS, SCALING_KEYS, SCALING_POLICIES, TOP_KEYS,
};
use super::section::{
    check_entries, domain, independent, is_square, knob_kind, one, planner_target, product, py, py_names, read_group,
    vals, Context, Kind, Preset,
};
use crate::error::DeployError;

/// One concrete `planner:` section; `infeasible` says why the Planner refuses it.
#[derive(Clone, Debug, PartialEq)]
pub struct Setting {
    pub section: Value,
    pub infeasible: Option<String>,
}

/// The expanded search: the settings, the adapter's knob grid they come from, and what the
/// load-predictor backtest found (for the recommendation's provenance; `None` when every
/// candidate has the planner disabled).
#[derive(Clone, Debug)]
pub struct PlannerSearch {
    pub settings: Vec<Setting>,
    pub grid: Grid,
    pub load_predictor: Option<Value>,
}

/// The adapter's knobs as the reference's random search draws them: each knob's value count in
/// the adapter's order (policy and groups, worker minimums, independent group knobs), and for
/// every point of their product (the last knob fastest, duplicates included: a disabled policy
/// beside every scaling policy) the index of the setting it materialises to. `log` lists the
/// knobs given as log ranges (their position in `sizes`, their values in the knob's order as
/// numbers), whose draw the reference weights by value. `before_router`: the
/// `planner:` section comes before a `router:` one, so its knobs are drawn first (the reference
/// merges its adapters' knobs in the order of their sections; the recommend reader sets it).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Grid {
    pub sizes: Vec<usize>,
    pub cells: Vec<usize>,
    pub log: Vec<(usize, Vec<f64>)>,
    pub before_router: bool,
}

/// Reads the section and expands it (see the module documentation).
pub fn expand(section: &Value, ctx: &Context) -> Result<PlannerSearch, DeployError> {
    let m = section
        .as_object()
        .ok_or_else(|| DeployError::new("planner", "adapter section 'planner' must be a mapping"))?;
    for k in m.keys() {
        if !TOP_KEYS.contains(&k.as_str()) {
            let hint = match k.as_str() {
                "target" => " (recommend takes the Planner's target from optimization.target)",
                "min_num_gpus" => " (recommend searches with the Planner's default min_num_gpus, -1)",
                _ => "",
            };
            return Err(DeployError::new(format!("planner.{k}"), format!("Extra inputs are not permitted{hint}")));
        }
    }
    let get = |k: &str| m.get(k).filter(|v| !v.is_null());
    let groups = [
        ("scaling_policy", read_group("scaling_policy", get("scaling_policy"))?, &SCALING_KEYS[..]),
        ("fpm_sampling", read_group("fpm_sampling", get("fpm_sampling"))?, &FPM_KEYS[..]),
        ("load_sensitivity", read_group("load_sensitivity", get("load_sensitivity"))?, &LOAD_KEYS[..]),
        ("load_predictor", read_group("load_predictor", get("load_predictor"))?, &PREDICTOR_KEYS[1..]),
    ];
    // A group's independent knobs only with `preset: false` (`_validate_preset_conflicts`).
    for (name, g, knobs) in &groups {
        let mut given: Vec<&str> = knobs.iter().copied().filter(|k| get(k).is_some()).collect();
        given.sort_unstable();
        match &g.preset {
            Preset::Off => {}
            Preset::Default { given: false } if !given.is_empty() => {
                return Err(DeployError::new(
                    format!("planner.{name}"),
                    format!(
                        "planner.{name} uses the default preset and cannot be combined with independent knobs {}",
                        py_names(&given)
                    ),
                ))
            }
            preset => {
                let mut conflicts: Vec<String> = given.iter().map(|s| format!("'{s}'")).collect();
                if g.family.is_some() {
                    conflicts.push("'load_predictor.type'".into());
                }
                if !conflicts.is_empty() {
                    return Err(DeployError::new(
                        format!("planner.{name}"),
                        format!(
                            "planner.{name}.preset cannot be combined with independent knobs [{}]",
                            conflicts.join(", ")
                        ),
                    ));
                }
                if let Preset::List(entries) = preset {
                    check_entries(name, entries)?;
                }
            }
        }
    }
    // Every independent knob's domain, read once (types, choices, ranges).
    for k in TOP_KEYS.iter().skip(5).filter(|k| !matches!(**k, "max_throughput_scaling_replicas" | "max_num_gpus")) {
        if let Some(v) = get(k) {
            domain(&format!("planner.{k}"), v, knob_kind(k))?;
        }
    }
    if let Some(v) = get("load_scaling_down_sensitivity") {
        let values: Vec<i64> = match v.pointer("/range/max") {
            Some(max) => max.as_i64().into_iter().collect(),
            None => domain("planner.load_scaling_down_sensitivity", v, Kind::NonNegInt)?
                .iter()
                .filter_map(Value::as_i64)
                .collect(),
        };
        if values.iter().any(|&x| x > 100) {
            return Err(DeployError::new(
                "planner.load_scaling_down_sensitivity",
                "load_scaling_down_sensitivity must be <= 100",
            ));
        }
    }
    if let Some(v) = get("fpm_sample_bucket_size") {
        if let Some(r) = v.get("range") {
            let (min, max) = (r["min"].as_i64().unwrap_or(0), r["max"].as_i64().unwrap_or(-1));
            let step = r.get("step").and_then(Value::as_i64).unwrap_or(1).max(1) as usize;
            if !(min..=max).step_by(step).any(is_square) {
                return Err(DeployError::new(
                    "planner.fpm_sample_bucket_size",
                    "fpm_sample_bucket_size range contains no perfect squares",
                ));
            }
        } else {
            let values = domain("planner.fpm_sample_bucket_size", v, Kind::PosInt)?;
            if values.iter().any(|x| !is_square(x.as_i64().unwrap_or(0))) {
                return Err(DeployError::new(
                    "planner.fpm_sample_bucket_size",
                    "fpm_sample_bucket_size values must be perfect squares",
                ));
            }
        }
    }
    let positive = |k: &str| -> Result<i64, DeployError> {
        match get(k) {
            None => Ok(8),
            Some(v) => Ok(one(&format!("planner.{k}"), v, Kind::PosInt, false)?.as_i64().expect("an integer")),
        }
    };
    let max_num_gpus = positive("max_num_gpus")?;
    let max_replicas = positive("max_throughput_scaling_replicas")?;
    let policies: Vec<Value> = match get("policy") {
        None => vec![json!("disabled"), json!("enabled")],
        Some(v) => {
            let items: Vec<Value> = match v {
                Value::Object(o) if o.len() == 1 && o.contains_key("choices") => {
                    let c = o["choices"].as_array().cloned().unwrap_or_default();
                    if c.is_empty() {
                        return Err(DeployError::new("planner.policy.choices", "choices must be a nonempty list"));
                    }
                    if (1..c.len()).any(|i| c[..i].contains(&c[i])) {
                        return Err(DeployError::new("planner.policy.choices", "choices must contain unique values"));
                    }
                    c
                }
                other => vec![other.clone()],
            };
            let mut bad: Vec<Value> = items.iter().filter(|x| *x != "disabled" && *x != "enabled").cloned().collect();
            if !bad.is_empty() {
                bad.sort_by_key(py);
                return Err(DeployError::new(
                    "planner.policy",
                    format!("planner.policy choices must be disabled or enabled; got {}", py(&Value::Array(bad))),
                ));
            }
            items
        }
    };
    // The worker minimums (`_validate_public_fields`), checked on every branch; the
    // role-specific ones are dimensions of the disaggregated branches only (the adapter's
    // `choices_by_branch`), so an aggregated branch searches without them.
    let mut workers: Vec<(&str, Vec<Value>)> = Vec::new();
    for (k, min) in [("min_workers", 0), ("prefill_min_workers", 1), ("decode_min_workers", 1)] {
        let Some(v) = get(k) else { continue };
        // Scalars and choices are typed as the reference's models type them; a range may reach
        // below the minimum, which the adapter's own check names.
        let values = domain(&format!("planner.{k}"), v, knob_kind(k))?;
        let low: Vec<Value> = values.iter().filter(|x| x.as_i64().is_some_and(|x| x < min)).cloned().collect();
        if !low.is_empty() {
            return Err(DeployError::new(
                format!("planner.{k}"),
                format!("planner.{k} choices must be >= {min}; got {}", py(&Value::Array(low))),
            ));
        }
        if k == "min_workers" || ctx.disaggregated {
            workers.push((k, values));
        }
    }
    // Predictors named explicitly: ARIMA and Prophet run the reference's own predictors through
    // Python (the backtest and each candidate's run); without an interpreter that has them they
    // are refused with what to install. The default lists skip them.
    let predictor_group = &groups[3].1;
    let mut named: Vec<(String, String)> = Vec::new();
    match &predictor_group.preset {
        Preset::List(entries) => {
            for (i, e) in entries.iter().enumerate() {
                let p = Predictor::of(e);
                if p.in_python() {
                    named.push((format!("planner.load_predictor.preset[{i}]"), p.family.clone()));
                }
            }
        }
        Preset::Off => {
            if let Some(t) = &predictor_group.family {
                let families = domain("planner.load_predictor.type", t, Kind::Family)?;
                for f in families.iter().filter_map(Value::as_str).filter(|f| matches!(*f, "arima" | "prophet")) {
                    named.push(("planner.load_predictor.type".into(), f.to_string()));
                }
            }
        }
        Preset::Default { .. } => {}
    }
    if policies.iter().all(|p| p == "disabled") {
        // The adapter's only knob is then the policy, one value.
        return Ok(PlannerSearch {
            settings: vec![Setting { section: json!({"policy": "disabled"}), infeasible: None }],
            grid: Grid { sizes: vec![1], cells: vec![0], ..Grid::default() },
            load_predictor: None,
        });
    }
    let target = planner_target(ctx.target, ctx.pareto_objectives)?;
    // Each group's entries: its list, every preset, or its independent mappings.
    let bools = vec![json!(false), json!(true)];
    let entries = |i: usize| -> Result<Vec<Value>, DeployError> {
        let (name, g, _) = &groups[i];
        Ok(match (&g.preset, *name) {
            (Preset::List(e), _) => e.clone(),
            (Preset::Default { .. }, "scaling_policy") => SCALING_POLICIES.iter().map(|p| json!(p.0)).collect(),
            (Preset::Default { .. }, "fpm_sampling") => FPM_SAMPLING.iter().map(|p| json!(p.0)).collect(),
            (Preset::Default { .. }, "load_sensitivity") => LOAD_SENSITIVITY.iter().map(|p| json!(p.0)).collect(),
            (Preset::Default { .. }, _) => LOAD_PREDICTOR_PRESETS.iter().map(|p| json!(p.0)).collect(),
            (Preset::Off, "scaling_policy") => independent(
                &SCALING_KEYS,
                &SCALING_KEYS.map(get),
                &[bools.clone(), bools.clone(), vals(&[json!(180), json!(600)]), vals(&[json!(5), json!(10)])],
            )?,
            (Preset::Off, "fpm_sampling") => independent(
                &FPM_KEYS,
                &FPM_KEYS.map(get),
                &[vals(&[json!(32), json!(64), json!(128)]), vals(&[json!(4), json!(16), json!(64)])],
            )?
            .into_iter()
            .filter(|e| is_square(e["fpm_sample_bucket_size"].as_i64().unwrap_or(0)))
            .collect(),
            (Preset::Off, "load_sensitivity") => independent(
                &LOAD_KEYS,
                &LOAD_KEYS.map(get),
                &[vals(&[json!(70), json!(80), json!(90)]), vals(&[json!(3), json!(5), json!(8)])],
            )?,
            (Preset::Off, _) => {
                let mut given: Vec<Option<&Value>> = vec![g.family.as_ref()];
                given.extend(PREDICTOR_KEYS[1..].iter().map(|k| get(k)));
                independent(
                    &PREDICTOR_KEYS,
                    &given,
                    &[
                        vals(&[json!("constant"), json!("arima"), json!("prophet"), json!("kalman")]),
                        bools.clone(),
                        vals(&[json!(20), json!(50)]),
                        vals(&[json!(1.0), json!(10.0)]),
                        vals(&[json!(0.1), json!(1.0)]),
                        vals(&[json!(5.0), json!(10.0)]),
                        vals(&[json!(3), json!(5)]),
                    ],
                )?
            }
        })
    };
    // Throughput scaling needs the sla target with both token bounds (`_policy_filter`).
    let sla_ok = target == "sla" && ctx.sla.ttft_ms.is_some() && ctx.sla.itl_ms.is_some();
    let (kept, dropped): (Vec<Value>, Vec<Value>) =
        entries(0)?.into_iter().partition(|e| !scaling_fields(e).0 || sla_ok);
    if !dropped.is_empty() && matches!(groups[0].1.preset, Preset::List(_)) {
        return Err(DeployError::new(
            "planner.scaling_policy",
            format!(
                "Planner scaling_policy contains choices that are incompatible with the selected optimization \
                 target/SLA: {}",
                py(&Value::Array(dropped))
            ),
        ));
    }
    if kept.is_empty() {
        return Err(DeployError::new(
            "planner.scaling_policy",
            if target != "sla" {
                "every Planner scaling_policy enables throughput scaling, which requires a goodput target"
            } else {
                "Planner throughput scaling requires evaluation.sla.ttft_ms and evaluation.sla.itl_ms"
            },
        ));
    }
    // Only throughput scaling forecasts (the reference imports its predictors on that path only).
    if let Some((path, family)) = named.first().filter(|_| kept.iter().any(|e| scaling_fields(e).0)) {
        servesim_replay::planner_python::available(family).map_err(|e| DeployError::new(path.clone(), e))?;
    }
    let backtest = sweep_load_predictor(&kept, &entries(3)?, ctx, !named.is_empty())?;
    // The dimensions in the adapter's order; a group given as independent knobs is listed as
    // those knobs, after the others.
    let throughput = kept.iter().any(|e| scaling_fields(e).0);
    let load = kept.iter().any(|e| scaling_fields(e).1);
    let mut dims: Vec<(String, Vec<Value>)> = Vec::new();
    let mut knob_dims: Vec<(String, Vec<Value>)> = Vec::new();
    let mut log = Vec::new();
    let mut add = |name: &str, i: usize, list: Vec<Value>| {
        if matches!(groups[i].1.preset, Preset::Off) {
            let keys: Vec<String> =
                list.first().and_then(Value::as_object).map(|o| o.keys().cloned().collect()).unwrap_or_default();
            for k in keys {
                let mut values: Vec<Value> = Vec::new();
                for e in &list {
                    if !values.contains(&e[&k]) {
                        values.push(e[&k].clone());
                    }
                }
                if get(&k).and_then(|v| v.pointer("/range/scale")).and_then(Value::as_str) == Some("log") {
                    // Its position among the independent knobs; the others go before them.
                    log.push((knob_dims.len(), values.iter().filter_map(Value::as_f64).collect()));
                }
                knob_dims.push((format!("{name}.{k}"), values));
            }
        } else {
            dims.push((name.to_string(), list));
        }
    };
    add("scaling_policy", 0, kept.clone());
    let mut plain: Vec<(String, Vec<Value>)> = vec![("policy".into(), policies)];
    if throughput {
        add("fpm_sampling", 1, entries(1)?);
    }
    if load {
        add("load_sensitivity", 2, entries(2)?);
    }
    // `dims` holds the groups in order; the policy goes right after the scaling policy.
    let mut ordered: Vec<(String, Vec<Value>)> = Vec::new();
    let mut rest = dims.into_iter();
    if !matches!(groups[0].1.preset, Preset::Off) {
        ordered.push(rest.next().expect("the scaling policy"));
    }
    ordered.append(&mut plain);
    ordered.extend(rest);
    for (k, values) in workers {
        ordered.push((k.to_string(), values));
    }
    for (position, _) in &mut log {
        *position += ordered.len();
    }
    ordered.extend(knob_dims);
    let names: Vec<String> = ordered.iter().map(|d| d.0.clone()).collect();
    let values: Vec<Vec<Value>> = ordered.into_iter().map(|d| d.1).collect();
    let mut settings: Vec<Setting> = Vec::new();
    let mut cells = Vec::new();
    for combo in product(&values) {
        let pick = |group: &str| -> Option<Value> {
            if let Some(j) = names.iter().position(|n| n == group) {
                return Some(combo[j].clone());
            }
            let prefix = format!("{group}.");
            let parts: Map<String, Value> = names
                .iter()
                .zip(&combo)
                .filter_map(|(n, v)| n.strip_prefix(&prefix).map(|k| (k.to_string(), v.clone())))
                .collect();
            (!parts.is_empty()).then_some(Value::Object(parts))
        };
        let s = materialize(&pick, target, ctx, max_num_gpus, max_replicas, &backtest.winners);
        match settings.iter().position(|x| *x == s) {
            Some(i) => cells.push(i),
            None => {
                cells.push(settings.len());
                settings.push(s);
            }
        }
    }
    let grid = Grid { sizes: values.iter().map(Vec::len).collect(), cells, log, before_router: false };
    Ok(PlannerSearch { settings, grid, load_predictor: Some(backtest.state) })
}

/// One point of the space as the adapter materialises it (`materialize_replay`,
/// `_planner_config_payload`, `_public_planner_config`).
fn materialize(
    pick: &dyn Fn(&str) -> Option<Value>,
    target: &str,
    ctx: &Context,
    max_num_gpus: i64,
    max_replicas: i64,
    winners: &[(i64, Predictor)],
) -> Setting {
    let disabled = Setting { section: json!({"policy": "disabled"}), infeasible: None };
    let scaling = pick("scaling_policy").expect("always a dimension");
    let (ets, els, ti, li) = scaling_fields(&scaling);
    if pick("policy").as_ref().and_then(Value::as_str) != Some("enabled") || !(ets || els) {
        return disabled;
    }
    let mut candidate = Map::new();
    candidate.insert("enable_throughput_scaling".into(), json!(ets));
    candidate.insert("enable_load_scaling".into(), json!(els));
    candidate.insert("throughput_adjustment_interval_seconds".into(), json!(ti));
    candidate.insert("load_adjustment_interval_seconds".into(), json!(li));
    candidate.insert("max_throughput_scaling_replicas".into(), json!(max_replicas));
    if ets {
        candidate.extend(pair_fields(&FPM_SAMPLING, FPM_KEYS, &pick("fpm_sampling").expect("a dimension")));
    }
    if els {
        candidate.extend(pair_fields(&LOAD_SENSITIVITY, LOAD_KEYS, &pick("load_sensitivity").expect("a dimension")));
    }
    if ets {
        if let Some((_, p)) = winners.iter().find(|(i, _)| Some(*i) == ti) {
            candidate.extend(p.fields());
        }
    }
    let mut payload = Map::new();
    payload.insert("mode".into(), json!(if ctx.disaggregated { "disagg" } else { "agg" }));
    payload.insert("optimization_target".into(), json!(target));
    for k in PASSTHROUGH_KEYS {
        if let Some(v) = candidate.get(k) {
            if !(k.ends_with("_interval_seconds") && v.is_null()) {
                payload.insert(k.into(), v.clone());
            }
        }
    }
    payload.insert("max_gpu_budget".into(), json!(max_num_gpus));
    for (public, field) in [
        ("min_workers", "min_endpoint"),
        ("prefill_min_workers", "prefill_min_endpoint"),
        ("decode_min_workers", "decode_min_endpoint"),
    ] {
        if let Some(v) = pick(public).filter(|v| !v.is_null()) {
            payload.insert(field.into(), v);
        }
    }
    if target == "sla" {
        if let Some(t) = ctx.sla.ttft_ms {
            payload.insert("ttft_ms".into(), json!(t));
        }
        if let Some(t) = ctx.sla.itl_ms {
            payload.insert("itl_ms".into(), json!(t));
        }
    }
    let refused = |why: String| {
        let mut section = Map::new();
        section.insert("policy".into(), json!("enabled"));
        for (k, v) in &payload {
            let public = match k.as_str() {
                "mode" | "ttft_ms" | "itl_ms" => continue,
                "optimization_target" => "target",
                "max_gpu_budget" => "max_num_gpus",
                "min_endpoint" => "min_workers",
                "prefill_min_endpoint" => "prefill_min_workers",
                "decode_min_endpoint" => "decode_min_workers",
                other => other,
            };
            section.insert(public.into(), v.clone());
        }
        Setting { section: Value::Object(section), infeasible: Some(format!("Planner candidate: {why}")) }
    };
    let cfg = match PlannerConfig::from_json(&Value::Object(payload.clone())) {
        Ok(c) => c,
        Err(e) => return refused(e.plain()),
    };
    for (key, on, given) in [
        ("throughput_adjustment_interval_seconds", cfg.enable_throughput_scaling, ti),
        ("load_adjustment_interval_seconds", cfg.enable_load_scaling, li),
    ] {
        if on && given.is_none() {
            return refused(format!("{key} cannot be null while its scaling mode is enabled"));
        }
    }
    if cfg.enable_throughput_scaling && (ctx.sla.ttft_ms.is_none() || ctx.sla.itl_ms.is_none()) {
        return refused("Planner throughput scaling requires evaluation.sla.ttft_ms and evaluation.sla.itl_ms".into());
    }
    Setting { section: public_section(&cfg), infeasible: None }
}

/// Every public field of a resolved configuration, under the section's names.
pub fn public_section(cfg: &PlannerConfig) -> Value {
    let family = match cfg.load_predictor {
        PredictorKind::Constant => "constant",
        PredictorKind::Arima => "arima",
        PredictorKind::Prophet => "prophet",
        PredictorKind::Kalman => "kalman",
    };
    let mut m = Map::new();
    m.insert("policy".into(), json!("enabled"));
    m.insert("enable_throughput_scaling".into(), json!(cfg.enable_throughput_scaling));
    m.insert("enable_load_scaling".into(), json!(cfg.enable_load_scaling));
    m.insert("throughput_adjustment_interval_seconds".into(), json!(cfg.throughput_adjustment_interval_seconds));
    m.insert("load_adjustment_interval_seconds".into(), json!(cfg.load_adjustment_interval_seconds));
    m.insert("max_throughput_scaling_replicas".into(), json!(cfg.max_throughput_scaling_replicas));
    m.insert("max_num_fpm_samples".into(), json!(cfg.max_num_fpm_samples));
    m.insert("fpm_sample_bucket_size".into(), json!(cfg.fpm_sample_bucket_size));
    m.insert("load_scaling_down_sensitivity".into(), json!(cfg.load_scaling_down_sensitivity));
    m.insert("load_min_observations".into(), json!(cfg.load_min_observations));
    m.insert("load_predictor".into(), json!(family));
    m.insert("load_predictor_log1p".into(), json!(cfg.load_predictor_log1p));
    m.insert("prophet_window_size".into(), json!(cfg.prophet_window_size));
    m.insert("kalman_q_level".into(), json!(cfg.kalman_q_level));
    m.insert("kalman_q_trend".into(), json!(cfg.kalman_q_trend));
    m.insert("kalman_r".into(), json!(cfg.kalman_r));
    m.insert("kalman_min_points".into(), json!(cfg.kalman_min_points));
    m.insert("target".into(), json!(cfg.optimization_target.name()));
    m.insert("max_num_gpus".into(), json!(cfg.max_gpu_budget));
    m.insert("min_num_gpus".into(), json!(cfg.min_gpu_budget));
    m.insert("min_workers".into(), json!(cfg.min_endpoint));
    if let Some(v) = cfg.prefill_min_endpoint {
        m.insert("prefill_min_workers".into(), json!(v));
    }
    if let Some(v) = cfg.decode_min_endpoint {
        m.insert("decode_min_workers".into(), json!(v));
    }
    Value::Object(m)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::schema::Sla;

    #[test]
    fn a_section_expands_to_resolved_public_sections() {
        let sla = Sla { ttft_ms: Some(500.0), itl_ms: Some(20.0), e2e_ms: None };
        let ctx = Context {
            target: "goodput_per_gpu",
            pareto_objectives: &[],
            sla: &sla,
            disaggregated: true,
            source: None,
            base_dir: Path::new("."),
        };
        let p = expand(
            &json!({"policy": "enabled", "scaling_policy": {"preset": ["throughput_600_5"]},
                    "fpm_sampling": {"preset": ["fine"]}, "load_predictor": {"preset": ["kalman_reactive_log1p"]},
                    "decode_min_workers": 2}),
            &ctx,
        )
        .unwrap();
        assert_eq!(p.settings.len(), 1);
        let s = &p.settings[0].section;
        assert_eq!(s["target"], "sla");
        assert_eq!((s["max_num_fpm_samples"].as_i64(), s["fpm_sample_bucket_size"].as_i64()), (Some(128), Some(64)));
        // A static workload: the list's first predictor.
        assert_eq!((s["load_predictor"].as_str(), s["load_predictor_log1p"].as_bool()), (Some("kalman"), Some(true)));
        assert_eq!(s["kalman_q_level"], 10.0);
        assert_eq!(s["decode_min_workers"], 2);
        assert!(s.get("prefill_min_workers").is_none());
        assert_eq!(p.load_predictor.unwrap()["reason"], "static_workload_configured_fallback");
        // The section reads back as the same Planner configuration.
        let cfg = PlannerConfig::from_json(&json!({
            "mode": "disagg", "optimization_target": "sla", "ttft_ms": 500.0, "itl_ms": 20.0,
            "enable_throughput_scaling": true, "enable_load_scaling": false,
            "throughput_adjustment_interval_seconds": 600, "load_adjustment_interval_seconds": 5,
            "max_num_fpm_samples": 128, "fpm_sample_bucket_size": 64, "load_predictor": "kalman",
            "load_predictor_log1p": true, "kalman_q_level": 10.0, "kalman_q_trend": 1.0, "kalman_r": 5.0,
            "kalman_min_points": 3, "decode_min_endpoint": 2,
        }))
        .unwrap();
        assert_eq!(public_section(&cfg), *s);
    }

    #[test]
    fn role_minimums_are_checked_everywhere_and_searched_only_where_there_are_roles() {
        let sla = Sla { ttft_ms: Some(500.0), itl_ms: Some(20.0), e2e_ms: None };
        let ctx = |disaggregated| Context {
            target: "throughput",
            pareto_objectives: &[],
            sla: &sla,
            disaggregated,
            source: None,
            base_dir: Path::new("."),
        };
        let section = json!({"policy": "enabled", "scaling_policy": {"preset": ["load_180_5"]},
                             "load_sensitivity": {"preset": ["default"]},
                             "prefill_min_workers": {"choices": [2, 4]}, "decode_min_workers": {"choices": [2, 4]}});
        // Aggregated: the adapter's aggregated branch has no role minimums, one candidate.
        let agg = expand(&section, &ctx(false)).unwrap();
        assert_eq!(agg.settings.len(), 1);
        assert!(agg.settings[0].section.get("prefill_min_workers").is_none());
        assert_eq!(agg.settings[0].section["min_workers"], 1);
        // Disaggregated: 2 x 2 candidates.
        let disagg = expand(&section, &ctx(true)).unwrap();
        let pairs: Vec<(i64, i64)> = disagg
            .settings
            .iter()
            .map(|s| {
                (s.section["prefill_min_workers"].as_i64().unwrap(), s.section["decode_min_workers"].as_i64().unwrap())
            })
            .collect();
        assert_eq!(pairs, vec![(2, 2), (2, 4), (4, 2), (4, 4)]);
        // The domain check holds on both (`_validate_public_fields`; a range reaches below it).
        let low = json!({"policy": "enabled", "decode_min_workers": {"range": {"min": 0, "max": 2, "step": 1}}});
        for d in [false, true] {
            let e = expand(&low, &ctx(d)).unwrap_err();
            assert_eq!(e.message, "planner.decode_min_workers choices must be >= 1; got [0]");
        }
    }
}
