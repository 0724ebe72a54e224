//! The planner's ARIMA load predictor, run by the reference itself: Dynamo's own
//! `ARIMAPredictor` (`dynamo/planner/core/load/predictors.py`, pmdarima's `auto_arima` then
//! `update`) in a Python subprocess. pmdarima's stepwise order search over statsmodels'
//! likelihood fits cannot be reproduced exactly in Rust, and an approximation would silently
//! change scaling decisions; running the reference's code gives its forecasts.
//!
//! The interpreter is `$SERVESIM_PLANNER_PYTHON`, else `python3`; it needs `ai-dynamo` (1.6.1,
//! its planner package) and `pmdarima` importable. One process serves the three series (number
//! of requests, ISL, OSL) of one run. Values cross the pipe as the bits of the f64, so nothing
//! is rounded on the way.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};

use servesim_planner::{ExternalSeries, PlannerConfig};

/// The script the interpreter runs: argv = [log1p (0/1), number of series].
const SCRIPT: &str = r#"
import contextlib, importlib.metadata, struct, sys, types
out = sys.stdout
try:
    with contextlib.redirect_stdout(sys.stderr):
        from dynamo.planner.core.load.predictors import ARIMAPredictor
        import pmdarima
    versions = "ai-dynamo %s pmdarima %s" % (importlib.metadata.version("ai-dynamo"), pmdarima.__version__)
except Exception as e:
    out.write("error %s: %s\n" % (type(e).__name__, str(e).replace("\n", " ")))
    out.flush()
    sys.exit(0)
cfg = types.SimpleNamespace(load_predictor_log1p=sys.argv[1] == "1")
series = [ARIMAPredictor(cfg) for _ in range(int(sys.argv[2]))]
out.write("ok %s (%s)\n" % (versions, sys.executable))
out.flush()
for line in sys.stdin:
    op, *rest = line.split()
    p = series[int(rest[0])]
    if op == "a":
        p.add_data_point(struct.unpack("<d", struct.pack("<Q", int(rest[1])))[0])
    else:
        with contextlib.redirect_stdout(sys.stderr):
            v = float(p.predict_next())
        out.write("%d\n" % struct.unpack("<Q", struct.pack("<d", v))[0])
        out.flush()
"#;

/// What to install when the interpreter cannot run the reference's predictor.
const INSTALL: &str = "load_predictor 'arima' runs Dynamo's own ARIMA predictor (pmdarima auto_arima) through \
    Python, since its forecasts cannot be reproduced exactly in Rust: install ai-dynamo==1.6.1 and pmdarima \
    for python3 (or set SERVESIM_PLANNER_PYTHON to an interpreter that has them, e.g. the venv made by \
    setup_aisimulate.sh --with-dynamo), or use load_predictor 'constant' or 'kalman'";

struct Process {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// The first failure after start-up. The run stops at its next check
    /// ([`crate::sim::Autoscaler::error`]); until then forecasts repeat the last value.
    failed: Option<String>,
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

/// One series of the shared process.
struct Series {
    proc: Arc<Mutex<Process>>,
    index: usize,
    last: f64,
}

impl ExternalSeries for Series {
    fn add(&mut self, value: f64) {
        if !value.is_nan() {
            self.last = value.max(0.0);
        }
        let mut p = self.proc.lock().unwrap_or_else(|e| e.into_inner());
        if p.failed.is_none() {
            if let Err(e) = p.send(&format!("a {} {}\n", self.index, value.to_bits())) {
                p.failed = Some(e);
            }
        }
    }

    fn predict_next(&mut self) -> f64 {
        let mut p = self.proc.lock().unwrap_or_else(|e| e.into_inner());
        if p.failed.is_none() {
            let got = p.send(&format!("p {}\n", self.index)).and_then(|_| p.read()).and_then(|line| {
                line.parse::<u64>().map(f64::from_bits).map_err(|_| format!("unexpected reply {line:?}"))
            });
            match got {
                Ok(v) => return v,
                Err(e) => p.failed = Some(e),
            }
        }
        self.last
    }
}

/// The reference's ARIMA predictor for one run: a factory for [`servesim_planner::Planner::with_external`],
/// and the description of what ran.
pub struct PythonArima {
    proc: Option<Arc<Mutex<Process>>>,
    /// `ai-dynamo X pmdarima Y (interpreter)` once started.
    pub description: Option<String>,
}

impl PythonArima {
    pub fn new() -> PythonArima {
        PythonArima { proc: None, description: None }
    }

    fn start(&mut self, cfg: &PlannerConfig) -> Result<Arc<Mutex<Process>>, String> {
        if let Some(p) = &self.proc {
            return Ok(p.clone());
        }
        let python = std::env::var("SERVESIM_PLANNER_PYTHON").unwrap_or_else(|_| "python3".into());
        let mut child = Command::new(&python)
            .args(["-c", SCRIPT, if cfg.load_predictor_log1p { "1" } else { "0" }, "3"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("{INSTALL} (could not run {python}: {e})"))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(format!("{INSTALL} (could not talk to {python})"));
        };
        let mut p = Process { child, stdin, stdout: BufReader::new(stdout), failed: None };
        let hello = p.read().map_err(|e| format!("{INSTALL} ({python}: {e})"))?;
        let Some(desc) = hello.strip_prefix("ok ") else {
            return Err(format!("{INSTALL} ({python}: {})", hello.strip_prefix("error ").unwrap_or(&hello)));
        };
        self.description = Some(format!("Dynamo's ARIMAPredictor through Python: {desc}"));
        let p = Arc::new(Mutex::new(p));
        self.proc = Some(p.clone());
        Ok(p)
    }

    /// Series `index` of the run `cfg` configures.
    pub fn series(&mut self, cfg: &PlannerConfig, index: usize) -> Result<Box<dyn ExternalSeries>, String> {
        let proc = self.start(cfg)?;
        Ok(Box::new(Series { proc, index, last: 0.0 }))
    }

    /// The first failure of the process after it started, if any.
    pub fn failure(&self) -> Option<String> {
        self.proc.as_ref().and_then(|p| p.lock().unwrap_or_else(|e| e.into_inner()).failed.clone())
    }
}

impl Default for PythonArima {
    fn default() -> Self {
        PythonArima::new()
    }
}
