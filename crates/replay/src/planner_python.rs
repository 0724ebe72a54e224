//! The planner's ARIMA and Prophet load predictors, run by the reference itself: Dynamo's own
//! `ARIMAPredictor` (pmdarima's `auto_arima` then `update`) and `ProphetPredictor` (a Prophet
//! fit per forecast) from `dynamo/planner/core/load/predictors.py`, in a Python subprocess.
//! Their likelihood fits cannot be reproduced exactly in Rust, and an approximation would
//! silently change scaling decisions; running the reference's code gives its forecasts.
//!
//! The interpreter is `$SERVESIM_PLANNER_PYTHON`, else `python3`; it needs `ai-dynamo` (1.6.1,
//! its planner package) with what that module imports (pmdarima, prophet, filterpy). One
//! process per servesim process serves every series of every run (a `predict`, each candidate
//! of a `recommend`, the recommend's load-predictor backtest): a series is created with its
//! family and knobs, fed, asked, and dropped with its run. Values cross the pipe as the bits of
//! the f64, so nothing is rounded on the way.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};

use servesim_planner::config::PredictorKind;
use servesim_planner::{ExternalSeries, PlannerConfig};

/// The script the interpreter runs. Requests, one a line: `n ID FAMILY LOG1P WINDOW INTERVAL`
/// (a new series), `a ID BITS` (an observation), `p ID` (a forecast: its bits, or `e MESSAGE`
/// when the predictor raises one of the errors the reference's callers catch), `d ID` (drop).
const SCRIPT: &str = r#"
import contextlib, importlib.metadata, struct, sys, types
out = sys.stdout
try:
    with contextlib.redirect_stdout(sys.stderr):
        from dynamo.planner.core.load.predictors import LOAD_PREDICTORS
        import pmdarima, prophet
    versions = "ai-dynamo %s pmdarima %s prophet %s" % (
        importlib.metadata.version("ai-dynamo"), pmdarima.__version__, importlib.metadata.version("prophet"))
except Exception as e:
    out.write("error %s: %s\n" % (type(e).__name__, str(e).replace("\n", " ")))
    out.flush()
    sys.exit(0)
CAUGHT = (ArithmeticError, IndexError, RuntimeError, TypeError, ValueError)
series = {}
out.write("ok %s (%s)\n" % (versions, sys.executable))
out.flush()
for line in sys.stdin:
    op, sid, *rest = line.split()
    if op == "n":
        cfg = types.SimpleNamespace(load_predictor_log1p=rest[1] == "1", prophet_window_size=int(rest[2]),
                                    throughput_adjustment_interval_seconds=int(rest[3]))
        with contextlib.redirect_stdout(sys.stderr):
            series[sid] = LOAD_PREDICTORS[rest[0]](cfg)
    elif op == "a":
        with contextlib.redirect_stdout(sys.stderr):
            series[sid].add_data_point(struct.unpack("<d", struct.pack("<Q", int(rest[0])))[0])
    elif op == "d":
        series.pop(sid, None)
    else:
        try:
            with contextlib.redirect_stdout(sys.stderr):
                v = float(series[sid].predict_next())
            out.write("%d\n" % struct.unpack("<Q", struct.pack("<d", v))[0])
        except CAUGHT as e:
            out.write("e %s: %s\n" % (type(e).__name__, str(e).replace("\n", " ")))
        out.flush()
"#;

/// What to install when the interpreter cannot run the reference's predictor.
fn install(family: &str) -> String {
    let (what, lib) = match family {
        "prophet" => ("Prophet predictor (a Prophet fit per forecast)", "prophet"),
        _ => ("ARIMA predictor (pmdarima auto_arima)", "pmdarima"),
    };
    format!(
        "load_predictor '{family}' runs Dynamo's own {what} through Python, since its forecasts cannot be \
         reproduced exactly in Rust: install ai-dynamo==1.6.1 and {lib} for python3 (or set \
         SERVESIM_PLANNER_PYTHON to an interpreter that has them, e.g. the venv made by setup_aisimulate.sh \
         --with-dynamo), or use load_predictor 'constant' or 'kalman'"
    )
}

/// Whether servesim runs `family` through the reference's Python predictor.
pub fn runs_in_python(family: PredictorKind) -> bool {
    matches!(family, PredictorKind::Arima | PredictorKind::Prophet)
}

struct Process {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// The first failure after start-up. A run stops at its next check
    /// ([`crate::sim::Autoscaler::error`]); until then forecasts repeat the last value.
    failed: Option<String>,
    /// `ai-dynamo X pmdarima Y prophet Z (interpreter)`.
    versions: String,
    next_id: u64,
}

impl Process {
    fn send(&mut self, line: &str) -> Result<(), String> {
        self.stdin.write_all(line.as_bytes()).and_then(|_| self.stdin.flush()).map_err(|e| e.to_string())
    }

    fn read(&mut self) -> Result<String, String> {
        let mut s = String::new();
        match self.stdout.read_line(&mut s) {
            Ok(0) => Err("the Python predictor exited".into()),
            Ok(_) => Ok(s.trim_end().to_string()),
            Err(e) => Err(e.to_string()),
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The process every run of this servesim process shares, started on first use (and again
/// after it failed).
static SHARED: Mutex<Option<Arc<Mutex<Process>>>> = Mutex::new(None);

fn lock(p: &Mutex<Process>) -> std::sync::MutexGuard<'_, Process> {
    p.lock().unwrap_or_else(|e| e.into_inner())
}

fn shared(family: &str) -> Result<Arc<Mutex<Process>>, String> {
    let mut slot = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = slot.as_ref().filter(|p| lock(p).failed.is_none()) {
        return Ok(p.clone());
    }
    let install = install(family);
    let python = std::env::var("SERVESIM_PLANNER_PYTHON").unwrap_or_else(|_| "python3".into());
    let mut child = Command::new(&python)
        .args(["-c", SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("{install} (could not run {python}: {e})"))?;
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err(format!("{install} (could not talk to {python})"));
    };
    let mut p =
        Process { child, stdin, stdout: BufReader::new(stdout), failed: None, versions: String::new(), next_id: 0 };
    let hello = p.read().map_err(|e| format!("{install} ({python}: {e})"))?;
    let Some(desc) = hello.strip_prefix("ok ") else {
        return Err(format!("{install} ({python}: {})", hello.strip_prefix("error ").unwrap_or(&hello)));
    };
    p.versions = desc.to_string();
    let p = Arc::new(Mutex::new(p));
    *slot = Some(p.clone());
    Ok(p)
}

/// Starts (or reuses) the shared process for `family`'s predictor; the versions it runs, or
/// what to install.
pub fn available(family: &str) -> Result<String, String> {
    shared(family).map(|p| lock(&p).versions.clone())
}

/// The shared process's failure, if it has one (a caller that read forecasts checks it: after
/// a failure they repeat the last value).
pub fn failure() -> Option<String> {
    SHARED.lock().unwrap_or_else(|e| e.into_inner()).as_ref().and_then(|p| lock(p).failed.clone())
}

/// One series of the reference's predictor in the shared process.
pub struct Series {
    proc: Arc<Mutex<Process>>,
    id: u64,
    last: f64,
    /// A forecast the predictor raised on is NaN (the backtest scores it as no forecast)
    /// instead of failing the run.
    nan_on_error: bool,
}

impl Series {
    /// A new series of `cfg`'s load predictor (ARIMA or Prophet, with `cfg`'s log1p, Prophet
    /// window and throughput interval, as the reference builds it from the Planner config).
    pub fn new(cfg: &PlannerConfig) -> Result<Series, String> {
        let family = cfg.load_predictor.name();
        let proc = shared(family)?;
        let id = {
            let mut p = lock(&proc);
            let id = p.next_id;
            p.next_id += 1;
            let line = format!(
                "n {id} {family} {} {} {}\n",
                u8::from(cfg.load_predictor_log1p),
                cfg.prophet_window_size,
                cfg.throughput_adjustment_interval_seconds
            );
            if let Err(e) = p.send(&line) {
                p.failed.get_or_insert(e);
            }
            id
        };
        Ok(Series { proc, id, last: 0.0, nan_on_error: false })
    }

    /// As [`Series::new`], a forecast the predictor raised on being NaN (the backtest's
    /// `evaluate_preset` disqualifies such a preset) rather than a failure.
    pub fn for_backtest(cfg: &PlannerConfig) -> Result<Series, String> {
        let mut s = Series::new(cfg)?;
        s.nan_on_error = true;
        Ok(s)
    }

    /// `ai-dynamo X pmdarima Y prophet Z (interpreter)`.
    pub fn versions(&self) -> String {
        lock(&self.proc).versions.clone()
    }

    /// The process's first failure, if any.
    pub fn failure(&self) -> Option<String> {
        lock(&self.proc).failed.clone()
    }
}

impl Drop for Series {
    fn drop(&mut self) {
        let mut p = lock(&self.proc);
        if p.failed.is_none() {
            let _ = p.send(&format!("d {}\n", self.id));
        }
    }
}

impl ExternalSeries for Series {
    fn add(&mut self, value: f64) {
        if !value.is_nan() {
            self.last = value.max(0.0);
        }
        let mut p = lock(&self.proc);
        if p.failed.is_none() {
            if let Err(e) = p.send(&format!("a {} {}\n", self.id, value.to_bits())) {
                p.failed = Some(e);
            }
        }
    }

    fn predict_next(&mut self) -> f64 {
        let mut p = lock(&self.proc);
        if p.failed.is_none() {
            let got = p.send(&format!("p {}\n", self.id)).and_then(|_| p.read());
            match got {
                Ok(line) => match (line.parse::<u64>(), line.strip_prefix("e ")) {
                    (Ok(bits), _) => return f64::from_bits(bits),
                    (_, Some(_)) if self.nan_on_error => return f64::NAN,
                    (_, Some(err)) => p.failed = Some(format!("the predictor raised {err}")),
                    _ => p.failed = Some(format!("unexpected reply {line:?}")),
                },
                Err(e) => p.failed = Some(e),
            }
        }
        self.last
    }
}

/// The reference's predictor for one run: a factory for
/// [`servesim_planner::Planner::with_external`], and the description of what ran.
pub struct PythonPredictor {
    proc: Option<Arc<Mutex<Process>>>,
    /// `Dynamo's ARIMAPredictor through Python: ai-dynamo X ...` once started.
    pub description: Option<String>,
}

impl PythonPredictor {
    pub fn new() -> PythonPredictor {
        PythonPredictor { proc: None, description: None }
    }

    /// Series `_index` of the run `cfg` configures.
    pub fn series(&mut self, cfg: &PlannerConfig, _index: usize) -> Result<Box<dyn ExternalSeries>, String> {
        let s = Series::new(cfg)?;
        let class = match cfg.load_predictor {
            PredictorKind::Prophet => "ProphetPredictor",
            _ => "ARIMAPredictor",
        };
        self.description = Some(format!("Dynamo's {class} through Python: {}", s.versions()));
        self.proc = Some(s.proc.clone());
        Ok(Box::new(s))
    }

    /// The first failure of the process after it started, if any.
    pub fn failure(&self) -> Option<String> {
        self.proc.as_ref().and_then(|p| lock(p).failed.clone())
    }
}

impl Default for PythonPredictor {
    fn default() -> Self {
        PythonPredictor::new()
    }
}
