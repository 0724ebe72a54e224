//! `--calibration FILE` on the flag forms (`predict` without `-c`, `serve`): there the workers'
//! AIS timing comes as an engine configuration, not a deployment YAML, so the fitted pass
//! corrections go straight into each worker's AIS configuration (its `calibration` key), and
//! the fitted frontend cost becomes the front end's per-request delay.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use servesim_calibrate::file::Calibration;
use servesim_calibrate::Param;
use servesim_engine::{ExternalTimer, TimingModel, WorkerArgs};

use crate::failure::Failure;

/// A calibration file read for a flag form.
pub struct FlagCalibration {
    path: PathBuf,
    pub file: Calibration,
    /// What the workers it was applied to look like, in the calibration file's identity keys.
    identity: BTreeMap<String, Value>,
}

impl FlagCalibration {
    pub fn read(path: &Path) -> Result<FlagCalibration, Failure> {
        let file = Calibration::read(path).map_err(Failure::input)?;
        Ok(FlagCalibration { path: path.to_path_buf(), file, identity: BTreeMap::new() })
    }

    fn refuse(&self, why: String) -> Failure {
        Failure::input(format!("--calibration {}: {why}", self.path.display()))
    }

    /// Puts the fitted pass corrections into the AIS timing configuration of `role`'s workers
    /// (`aggregated`, `prefill` or `decode`). Workers timed by another model are refused: the
    /// corrections were fitted to the AIS model's pass times.
    pub fn apply(&mut self, role: &str, args: &mut WorkerArgs) -> Result<(), Failure> {
        let TimingModel::External(timer) = &args.engine.timing else {
            return Err(self.refuse(format!(
                "the {role} workers are not timed by the AIS model; a calibration corrects AIS pass times only \
                 (use --ais-perf-model, or a timing_model {{\"type\": \"external\", \"provider\": \"ais\", \"config\": {{...}}}} \
                 in the engine configuration)"
            )));
        };
        let provider = timer.provider.clone();
        let mut config = timer.timer().config();
        let key = "timing_model.config";
        let parsed = servesim_perf::AisConfig::from_json(key, &config)
            .map_err(|e| self.refuse(format!("{role}: {}", e.message)))?;
        if !parsed.calibration.is_identity() {
            return Err(self.refuse(format!(
                "the {role} workers' AIS configuration has a calibration of its own ({key}.calibration); keep one"
            )));
        }
        let p = &self.file.params;
        config["calibration"] = json!({
            "prefill_scale": p.prefill_scale,
            "decode_scale": p.decode_scale,
            "pass_overhead_ms": p.pass_overhead_ms,
        });
        let rebuilt =
            servesim_perf::build_timer(key, &provider, &config).map_err(|e| self.refuse(format!("{role}: {e}")))?;
        args.engine.timing = TimingModel::External(ExternalTimer::new(provider, rebuilt));
        self.identity.extend(identity(role, &parsed, args.engine.async_scheduling));
        Ok(())
    }

    /// Warns once for every way the workers it was applied to differ from the ones measured.
    pub fn warn_differences(&self) {
        for d in self.file.differences(&self.identity) {
            eprintln!("warning: --calibration {}: {d}; the calibration may not hold here", self.path.display());
        }
    }

    /// The frontend's fitted cost per request (HTTP, parsing, tokenisation), if the
    /// calibration has one.
    pub fn frontend_ms(&self) -> Option<f64> {
        let p = &self.file.params;
        (self.file.fitted.contains(&Param::FrontendMs) || p.frontend_ms > 0.0).then_some(p.frontend_ms)
    }

    /// The frontend stage a replay models the fitted cost with: one that never queues, as
    /// `predict -c` applies it.
    pub fn tokenization(&self) -> Option<servesim_replay::Tokenization> {
        self.frontend_ms().map(|ms| servesim_replay::Tokenization {
            workers: 256,
            base_ms: ms,
            per_input_token_ms: 0.0,
        })
    }
}

/// A worker's identity in the calibration file's keys (those `predict -c` takes from a
/// deployment YAML).
fn identity(role: &str, c: &servesim_perf::AisConfig, async_scheduling: bool) -> BTreeMap<String, Value> {
    let mut id = BTreeMap::new();
    id.insert("model".to_string(), json!(c.model));
    id.insert("hardware".to_string(), json!(c.system));
    id.insert("backend".to_string(), json!(c.backend));
    id.insert("backend_version".to_string(), json!(c.backend_version));
    let at = |k: &str| format!("workers.{role}.{k}");
    id.insert(at("parallelism.tensor"), json!(c.tp));
    id.insert(at("parallelism.pipeline"), json!(c.pp));
    id.insert(at("parallelism.attention_data"), json!(c.attention_dp));
    if let Some(ep) = c.moe_ep_size {
        id.insert(at("parallelism.expert"), json!(ep));
    }
    let pass = match c.pass_model {
        servesim_perf::PassModel::Additive => "additive",
        servesim_perf::PassModel::Fused => "fused",
    };
    id.insert(at("timing.pass_model"), json!(pass));
    id.insert(at("scheduler.async_scheduling"), json!(async_scheduling));
    id
}
