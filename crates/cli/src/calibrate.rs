//! `servesim calibrate`: fits the timing of a deployment YAML to measurements of that
//! deployment (servesim-calibrate does the fitting; this is the glue: reading the measurement
//! set, running the deployment with a parameter vector, writing the calibration file), and
//! `--calibration FILE`, which `predict -c` and `recommend -c` apply as `--set` overrides.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Args;
use serde_json::{json, Map, Value};
use servesim_calibrate::file::Calibration;
use servesim_calibrate::fit::{self, Options, Outcome, Simulator, Stage};
use servesim_calibrate::stage::{Sample, Window};
use servesim_calibrate::{measured, Metric, Metrics, Param, Params};
use servesim_config::Reader;
use servesim_replay::{RequestRecord, Status};

use crate::failure::Failure;
use crate::output::{check_report_paths, print_out, ReportFile};

/// `servesim calibrate` arguments.
#[derive(Args, Debug)]
pub struct CalibrateArgs {
    /// The measurement set: a YAML file naming the deployment (a `predict -c` configuration)
    /// and its measured stages (see the README's "Calibrating to your deployment").
    #[arg(value_name = "MEASUREMENTS")]
    pub measurements: PathBuf,
    /// Where the calibration file goes.
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: PathBuf,
    /// Replace an existing calibration file.
    #[arg(long)]
    pub overwrite: bool,
    /// Parameters to fit, comma-separated (prefill_scale, decode_scale, pass_overhead_ms,
    /// frontend_ms); the measurement set's `fit:` otherwise, else prefill_scale, decode_scale
    /// and frontend_ms.
    #[arg(long, value_delimiter = ',', value_name = "NAMES")]
    pub fit: Vec<String>,
    /// Metrics the fit matches, comma-separated (ttft_mean, ttft_p99, tpot_mean, e2e_mean,
    /// e2e_p99); the measurement set's `metrics:` otherwise, else the three means.
    #[arg(long, value_delimiter = ',', value_name = "NAMES")]
    pub metrics: Vec<String>,
    /// Simulations per fit, at most (each cross-validation fold gets half).
    #[arg(long, default_value_t = 60, value_name = "N")]
    pub max_evaluations: usize,
    /// Deployments simulated at once (default: the machine's cores).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    #[arg(long, value_enum, default_value = "table")]
    pub format: crate::flags::Format,
}

/// A group of stages measured in one run of one deployment (each stage a window of it).
struct Group {
    deployment: PathBuf,
    sets: Vec<String>,
    roles: Vec<String>,
    has_tokenization: bool,
    stages: Vec<(usize, Window)>,
}

/// The measurement set, read.
struct MeasurementSet {
    stages: Vec<Stage>,
    notes: Vec<String>,
    groups: Vec<Group>,
    free: Vec<Param>,
    metrics: Vec<Metric>,
    inputs: Vec<PathBuf>,
    /// The identity of the first group's deployment (they must agree).
    identity: BTreeMap<String, Value>,
}

const DEFAULT_FIT: [Param; 3] = [Param::PrefillScale, Param::DecodeScale, Param::FrontendMs];
const DEFAULT_METRICS: [Metric; 3] = [Metric::TtftMean, Metric::TpotMean, Metric::E2eMean];

fn names<T: Copy>(list: &[String], parse: fn(&str) -> Option<T>, all: &[&str], what: &str) -> Result<Vec<T>, String> {
    let mut out: Vec<T> = Vec::new();
    for n in list {
        out.push(parse(n.trim()).ok_or_else(|| format!("unknown {what} {n:?}; expected one of {}", all.join(", ")))?);
    }
    Ok(out)
}

fn param_names() -> Vec<&'static str> {
    Param::ALL.iter().map(|p| p.name()).collect()
}

fn metric_names() -> Vec<&'static str> {
    Metric::ALL.iter().map(|m| m.name()).collect()
}

/// The fields `--calibration` compares: what makes measurements of one deployment say
/// something about another.
pub fn identity(tree: &Value) -> BTreeMap<String, Value> {
    let engine = &tree["engine"];
    let mut id = BTreeMap::new();
    for key in ["model", "hardware", "backend", "backend_version"] {
        id.insert(key.to_string(), engine.get(key).cloned().unwrap_or(Value::Null));
    }
    for (role, w) in engine.get("workers").and_then(Value::as_object).into_iter().flatten() {
        let p = &w["parallelism"];
        for k in ["tensor", "pipeline", "expert", "attention_data"] {
            if let Some(v) = p.get(k).filter(|v| !v.is_null()) {
                id.insert(format!("workers.{role}.parallelism.{k}"), v.clone());
            }
        }
        let pass = w.pointer("/timing/pass_model").cloned().unwrap_or(json!("additive"));
        id.insert(format!("workers.{role}.timing.pass_model"), pass);
        let async_ = w.pointer("/scheduler/async_scheduling").cloned().unwrap_or(json!(false));
        id.insert(format!("workers.{role}.scheduler.async_scheduling"), async_);
    }
    id
}

/// The `--set` overrides that apply parameters to a deployment tree with these worker roles.
fn param_sets(p: &Params, roles: &[String], has_tokenization: bool, frontend: bool) -> Vec<String> {
    let mut sets = Vec::new();
    for role in roles {
        for (param, name) in [
            (p.prefill_scale, "prefill_scale"),
            (p.decode_scale, "decode_scale"),
            (p.pass_overhead_ms, "pass_overhead_ms"),
        ] {
            sets.push(format!("engine.workers.{role}.timing.calibration.{name}={param}"));
        }
    }
    if frontend {
        sets.push(format!("engine.tokenization.base_ms={}", p.frontend_ms));
        if !has_tokenization {
            // Connections are served in parallel: the frontend's cost without a queue of its own.
            sets.push("engine.tokenization.workers=256".into());
        }
    }
    sets
}

/// The `--set` overrides a calibration file stands for on the deployment `tree`, and warnings
/// for every way the deployment differs from the one measured.
pub fn overrides(path: &Path, tree: &Value) -> Result<(Calibration, Vec<String>), Failure> {
    let c = Calibration::read(path).map_err(Failure::input)?;
    let engine = &tree["engine"];
    let roles: Vec<String> =
        engine.get("workers").and_then(Value::as_object).map(|m| m.keys().cloned().collect()).unwrap_or_default();
    if roles.is_empty() {
        return Err(Failure::input(format!(
            "--calibration {}: the configuration has no engine.workers block to apply it to",
            path.display()
        )));
    }
    for role in &roles {
        if let Some(t) = engine.pointer(&format!("/workers/{role}/timing/type")).and_then(Value::as_str) {
            if t != "default" {
                return Err(Failure::input(format!(
                    "--calibration {}: engine.workers.{role}.timing.type is {t:?}; a calibration corrects the \
                     default (AIS) timing only",
                    path.display()
                )));
            }
        }
        if engine.pointer(&format!("/workers/{role}/timing/calibration")).is_some() {
            return Err(Failure::input(format!(
                "--calibration {}: engine.workers.{role}.timing.calibration is set in the configuration too; keep one",
                path.display()
            )));
        }
    }
    let frontend = c.fitted.contains(&Param::FrontendMs) || c.params.frontend_ms > 0.0;
    let has_tokenization = engine.get("tokenization").is_some_and(|t| !t.is_null());
    if frontend && engine.pointer("/tokenization/base_ms").is_some() {
        return Err(Failure::input(format!(
            "--calibration {}: the calibration fitted the frontend's cost and engine.tokenization.base_ms is set \
             in the configuration too; keep one",
            path.display()
        )));
    }
    for d in c.differences(&identity(tree)) {
        eprintln!("warning: --calibration {}: {d}; the calibration may not hold here", path.display());
    }
    let sets = param_sets(&c.params, &roles, has_tokenization, frontend);
    Ok((c, sets))
}

fn read_set(path: &Path) -> Result<MeasurementSet, Failure> {
    let shown = path.display().to_string();
    let text = measured::read_bounded(path).map_err(Failure::input)?;
    let yaml: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&text).map_err(|e| Failure::input(format!("{shown}: not valid YAML: {e}")))?;
    let root: Value = serde_json::to_value(yaml).map_err(|e| Failure::input(format!("{shown}: {e}")))?;
    let base = path.parent().map(Path::to_path_buf).filter(|p| !p.as_os_str().is_empty()).unwrap_or_else(|| ".".into());
    let at = |e: servesim_config::ConfigError| Failure::input(format!("{shown}: {}", e.plain()));
    let mut top = Reader::mapping("", &root).map_err(at)?;
    let default_deployment = top.text("deployment").map_err(at)?;
    let list = |r: &mut Reader, key: &'static str| -> Result<Vec<String>, Failure> {
        match r.value(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| {
                    x.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| Failure::input(format!("{shown}: {}: must list strings", r.path(key))))
                })
                .collect(),
            Some(other) => Err(Failure::input(format!("{shown}: {}: must be a list, got {other}", r.path(key)))),
        }
    };
    let free = names(&list(&mut top, "fit")?, Param::parse, &param_names(), "parameter")
        .map_err(|e| Failure::input(format!("{shown}: fit: {e}")))?;
    let metrics = names(&list(&mut top, "metrics")?, Metric::parse, &metric_names(), "metric")
        .map_err(|e| Failure::input(format!("{shown}: metrics: {e}")))?;
    let stages_v = match top.value("stages") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        _ => return Err(Failure::input(format!("{shown}: stages: must list the measured stages (at least one)"))),
    };
    top.finish().map_err(at)?;
    let mut inputs = vec![path.to_path_buf()];
    let mut stages = Vec::new();
    let mut notes = Vec::new();
    let mut groups: Vec<Group> = Vec::new();
    let mut identity_of_first: Option<BTreeMap<String, Value>> = None;
    for (i, v) in stages_v.iter().enumerate() {
        let here = format!("stages[{i}]");
        let mut s = Reader::mapping(&here, v).map_err(at)?;
        let measured_path = base.join(
            s.text("measured")
                .map_err(at)?
                .ok_or_else(|| Failure::input(format!("{shown}: {here}.measured: missing (the measurement file)")))?,
        );
        let baseline = s.text("baseline").map_err(at)?.map(|b| base.join(b));
        let deployment =
            s.text("deployment").map_err(at)?.or(default_deployment.clone()).map(|d| base.join(d)).ok_or_else(
                || Failure::input(format!("{shown}: {here}.deployment: missing, and no top-level deployment")),
            )?;
        let sets = list(&mut s, "set")?;
        let window = match s.value("window_s") {
            None => Window::ALL,
            Some(Value::Array(a)) if a.len() == 2 && a.iter().all(|x| x.as_f64().is_some_and(f64::is_finite)) => {
                let (lo, hi) = (a[0].as_f64().unwrap_or(0.0), a[1].as_f64().unwrap_or(0.0));
                if lo > hi {
                    return Err(Failure::input(format!("{shown}: {here}.window_s: start {lo} is after end {hi}")));
                }
                Window { start_ms: lo * 1000.0, end_ms: hi * 1000.0 }
            }
            Some(other) => {
                return Err(Failure::input(format!(
                    "{shown}: {here}.window_s: must be [start, end] in seconds, got {other}"
                )))
            }
        };
        let name = s.text("name").map_err(at)?.unwrap_or_else(|| format!("stage {i}"));
        // By default the stages of one deployment file make one experiment, whatever their load.
        let experiment = s.text("experiment").map_err(at)?.unwrap_or_else(|| deployment.display().to_string());
        s.finish().map_err(at)?;
        let m = measured::read(&measured_path, baseline.as_deref())
            .map_err(|e| Failure::input(format!("{shown}: {here}.measured: {e}")))?;
        for n in &m.notes {
            let note = format!("{} ({}): {n}", measured_path.display(), m.format);
            if !notes.contains(&note) {
                notes.push(note);
            }
        }
        inputs.push(measured_path);
        inputs.extend(baseline);
        let index = stages.len();
        stages.push(Stage { name, group: experiment, measured: m.metrics });
        match groups.iter_mut().find(|g| g.deployment == deployment && g.sets == sets) {
            Some(g) => g.stages.push((index, window)),
            None => {
                let tree = servesim_deploy::load_tree(&deployment, &sets)
                    .map_err(|e| Failure::input(format!("{shown}: {here}.deployment: {e}")))?;
                let id = identity(&tree);
                match &identity_of_first {
                    None => identity_of_first = Some(id),
                    Some(first) if *first != id => {
                        return Err(Failure::input(format!(
                            "{shown}: {here}: its deployment differs from the first stage's in {}; one calibration is \
                             fitted to one deployment (model, GPU, backend, parallelism, pass model)",
                            first
                                .iter()
                                .filter(|(k, v)| id.get(*k) != Some(*v))
                                .map(|(k, _)| k.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        )))
                    }
                    Some(_) => {}
                }
                inputs.extend(crate::outdir::run_inputs(&deployment, &tree));
                let engine = &tree["engine"];
                let roles = engine
                    .get("workers")
                    .and_then(Value::as_object)
                    .map(|m| m.keys().cloned().collect())
                    .unwrap_or_default();
                let has_tokenization = engine.get("tokenization").is_some_and(|t| !t.is_null());
                groups.push(Group { deployment, sets, roles, has_tokenization, stages: vec![(index, window)] });
            }
        }
    }
    Ok(MeasurementSet { stages, notes, groups, free, metrics, inputs, identity: identity_of_first.unwrap_or_default() })
}

/// Each stage of a group run, by index, with its metrics.
type GroupRun = Result<Vec<(usize, Option<Metrics>)>, String>;

/// Runs the measurement set's deployments.
struct Runner<'a> {
    groups: &'a [Group],
    frontend: bool,
    threads: usize,
    /// The first run's error, if the deployment cannot run at all.
    error: Option<String>,
}

impl Runner<'_> {
    fn run_group(&self, g: &Group, p: &Params) -> GroupRun {
        let mut sets = g.sets.clone();
        sets.extend(param_sets(p, &g.roles, g.has_tokenization, self.frontend));
        let mut prepared = servesim_deploy::prepare_file(&g.deployment, &sets)?;
        prepared.sim.threads = 1;
        let mut samples = Vec::new();
        let mut sink = |r: &RequestRecord| {
            if r.status == Status::Completed {
                if let (Some(ttft_ms), Some(e2e_ms)) = (r.ttft_ms(), r.e2e_ms()) {
                    samples.push(Sample { arrival_ms: r.arrival_ms, ttft_ms, e2e_ms, tpot_ms: r.tpot_ms() });
                }
            }
        };
        let result = prepared.run().records(Some(&mut sink)).go(&mut ());
        match result {
            Ok(_) => Ok(g.stages.iter().map(|&(i, w)| (i, servesim_calibrate::stage::metrics(&samples, w))).collect()),
            // A run that cannot finish (a queue that never drains) predicts nothing.
            Err(_) => Ok(g.stages.iter().map(|&(i, _)| (i, None)).collect()),
        }
    }
}

impl Simulator for Runner<'_> {
    fn predict(&mut self, params: &Params, stages: &[usize]) -> Vec<Option<Metrics>> {
        let wanted: Vec<&Group> =
            self.groups.iter().filter(|g| g.stages.iter().any(|(i, _)| stages.contains(i))).collect();
        let mut found: BTreeMap<usize, Option<Metrics>> = BTreeMap::new();
        let this = &*self;
        let results: Vec<GroupRun> = std::thread::scope(|scope| {
            let mut out = Vec::new();
            for chunk in wanted.chunks(this.threads.max(1)) {
                let handles: Vec<_> = chunk.iter().map(|g| scope.spawn(move || this.run_group(g, params))).collect();
                out.extend(
                    handles
                        .into_iter()
                        .map(|h| h.join().unwrap_or_else(|_| Err("a simulation thread panicked".into()))),
                );
            }
            out
        });
        for r in results {
            match r {
                Ok(v) => found.extend(v),
                Err(e) => {
                    self.error.get_or_insert(e);
                }
            }
        }
        stages.iter().map(|i| found.get(i).cloned().flatten()).collect()
    }
}

fn metrics_json(m: &Option<Metrics>) -> Value {
    match m {
        None => Value::Null,
        Some(m) => Value::Object(m.iter().map(|(k, v)| (k.name().into(), json!(v))).collect()),
    }
}

/// The fit's account for the calibration file.
fn report(set: &MeasurementSet, out: &Outcome, opts: &Options) -> Map<String, Value> {
    let mut r = Map::new();
    r.insert("metrics".into(), json!(opts.metrics.iter().map(|m| m.name()).collect::<Vec<_>>()));
    r.insert("evaluations".into(), json!(out.fitted.evaluations));
    r.insert("cross_validation".into(), json!({"scheme": out.scheme.describe(), "folds": out.folds}));
    let stages: Vec<Value> = set
        .stages
        .iter()
        .enumerate()
        .map(|(i, s)| {
            json!({
                "name": s.name, "experiment": s.group,
                "measured": metrics_json(&Some(s.measured.clone())),
                "uncalibrated": metrics_json(&out.uncalibrated[i]),
                "calibrated": metrics_json(&out.in_sample[i]),
                "held_out": metrics_json(&out.held_out[i]),
            })
        })
        .collect();
    r.insert("stages".into(), Value::Array(stages));
    let mut errors = Map::new();
    for (label, pred) in
        [("uncalibrated", &out.uncalibrated), ("in_sample", &out.in_sample), ("cross_validated", &out.held_out)]
    {
        let mut per = Map::new();
        for m in Metric::ALL {
            if let Some((median, mean, n)) = fit::summary(&set.stages, pred, m) {
                per.insert(m.name().into(), json!({"median_abs_pct": median, "mean_abs_pct": mean, "stages": n}));
            }
        }
        errors.insert(label.into(), Value::Object(per));
    }
    r.insert("error_pct".into(), Value::Object(errors));
    r
}

fn render(set: &MeasurementSet, out: &Outcome, c: &Calibration, output: &Path) -> String {
    let mut s = String::new();
    let p = &c.params;
    s.push_str(&format!(
        "Fitted {} in {} simulations ({} stages; cross-validation: {}, {} folds)\n",
        c.fitted.iter().map(|p| p.name()).collect::<Vec<_>>().join(", "),
        out.fitted.evaluations,
        set.stages.len(),
        out.scheme.describe(),
        out.folds
    ));
    s.push_str(&format!(
        "  prefill_scale {:.4}  decode_scale {:.4}  pass_overhead_ms {:.3}  frontend_ms {:.3}\n\n",
        p.prefill_scale, p.decode_scale, p.pass_overhead_ms, p.frontend_ms
    ));
    s.push_str("Absolute error, median / mean % over stages\n");
    s.push_str(&format!("  {:<10} {:>18} {:>18} {:>18}\n", "metric", "uncalibrated", "in-sample", "cross-validated"));
    for m in Metric::ALL {
        let cell = |pred: &[Option<Metrics>]| match fit::summary(&set.stages, pred, m) {
            Some((median, mean, _)) => format!("{median:.1} / {mean:.1}"),
            None => "-".into(),
        };
        if set.stages.iter().any(|st| st.measured.contains_key(&m)) {
            s.push_str(&format!(
                "  {:<10} {:>18} {:>18} {:>18}\n",
                m.name(),
                cell(&out.uncalibrated),
                cell(&out.in_sample),
                cell(&out.held_out)
            ));
        }
    }
    s.push_str("\nPer stage: measured -> calibrated (held out), ms\n");
    for (i, st) in set.stages.iter().enumerate() {
        let cells: Vec<String> = st
            .measured
            .iter()
            .map(|(m, meas)| {
                let pred =
                    |v: &Option<Metrics>| v.as_ref().and_then(|x| x.get(m)).map_or("-".into(), |x| format!("{x:.1}"));
                format!("{} {meas:.1} -> {} ({})", m.name(), pred(&out.in_sample[i]), pred(&out.held_out[i]))
            })
            .collect();
        s.push_str(&format!("  {}: {}\n", st.name, cells.join(", ")));
    }
    s.push_str(&format!("\nSaved calibration to: {}\n", output.display()));
    s
}

pub fn run(a: CalibrateArgs) -> Result<(), Failure> {
    let threads = a.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())).max(1);
    let set = read_set(&a.measurements)?;
    check_report_paths(&[("output", a.output.as_path())], &set.inputs)?;
    if a.output.exists() && !a.overwrite {
        return Err(Failure::input(format!("--output {}: exists; give --overwrite to replace it", a.output.display())));
    }
    let cli_fit =
        names(&a.fit, Param::parse, &param_names(), "parameter").map_err(|e| Failure::input(format!("--fit: {e}")))?;
    let cli_metrics = names(&a.metrics, Metric::parse, &metric_names(), "metric")
        .map_err(|e| Failure::input(format!("--metrics: {e}")))?;
    let mut free = if !cli_fit.is_empty() {
        cli_fit
    } else if !set.free.is_empty() {
        set.free.clone()
    } else {
        DEFAULT_FIT.to_vec()
    };
    free.sort();
    free.dedup();
    let metrics = if !cli_metrics.is_empty() {
        cli_metrics
    } else if !set.metrics.is_empty() {
        set.metrics.clone()
    } else {
        DEFAULT_METRICS.to_vec()
    };
    if !set.stages.iter().any(|s| metrics.iter().any(|m| s.measured.contains_key(m))) {
        return Err(Failure::input(format!(
            "no stage measured any of {}; choose --metrics among what the files hold",
            metrics.iter().map(|m| m.name()).collect::<Vec<_>>().join(", ")
        )));
    }
    if a.max_evaluations < 2 * (free.len() + 1) || a.max_evaluations > 10_000 {
        return Err(Failure::input(format!(
            "--max-evaluations must be between {} and 10000 for {} free parameters",
            2 * (free.len() + 1),
            free.len()
        )));
    }
    for n in &set.notes {
        eprintln!("note: {n}");
    }
    let opts = Options { free: free.clone(), metrics, start: Params::default(), max_evaluations: a.max_evaluations };
    let mut runner = Runner { groups: &set.groups, frontend: free.contains(&Param::FrontendMs), threads, error: None };
    // The deployment as given must run: its errors are the user's to fix, not a fit's to avoid.
    let all: Vec<usize> = (0..set.stages.len()).collect();
    let uncalibrated = runner.predict(&opts.start, &all);
    if let Some(e) = runner.error.take() {
        return Err(Failure::input(e));
    }
    let out = fit::calibrate(&mut runner, &set.stages, &opts, uncalibrated);
    if let Some(e) = runner.error.take() {
        return Err(Failure::run(e));
    }
    let cross_validated = out.folds > 0;
    let errors_from = if cross_validated { &out.held_out } else { &out.in_sample };
    let model_error =
        Metric::ALL.iter().filter_map(|&m| fit::model_error(&set.stages, errors_from, m).map(|e| (m, e))).collect();
    let calibration = Calibration {
        params: out.fitted.params,
        fitted: free,
        deployment: set.identity.clone(),
        model_error,
        cross_validated,
    };
    let doc = calibration.to_json(report(&set, &out, &opts));
    let text = serde_json::to_string_pretty(&doc).expect("the calibration serialises");
    let mut file = ReportFile::create(&a.output)?;
    file.writer()
        .write_all(text.as_bytes())
        .and_then(|_| file.writer().write_all(b"\n"))
        .map_err(|e| Failure::run(format!("{}: write failed: {e}", a.output.display())))?;
    file.commit().map_err(Failure::run)?;
    if !cross_validated {
        eprintln!(
            "warning: one stage: nothing to cross-validate; the model error is the in-sample error, and intervals \
             rest on the development set's prior"
        );
    }
    match a.format {
        crate::flags::Format::Json => print_out(&format!("{text}\n")),
        crate::flags::Format::Table => print_out(&render(&set, &out, &calibration, &a.output)),
    }
}
