//! SGLang's frontend stages on the language worker (`engine.workers.<aggregated|prefill>.frontend`)
//! and the measured host cost table they can come from (`host_profile`), read with the
//! reference's rules and words.
//!
//! Stages are request-level pools a request crosses after the router placed it and before the
//! worker's scheduler receives it (replayed by `servesim-replay`'s `sim::stages`). Spelled-out
//! stages may say which workload they were measured on (`measured_for`); a host cost table holds
//! such rows, one per measured workload, and `host_profile` picks the row of the prediction's
//! workload exactly. Both only describe image workloads: on a text workload the reference
//! refuses `host_profile` and measured stages, and runs plain stages as they are.

use std::path::{Path, PathBuf};

use serde_json::Value;
use servesim_config::Reader;
use servesim_replay::FrontendStage;

use super::encoder::Images;
use super::engine::Engine;
use super::traffic::Traffic;
use crate::error::DeployError;
use crate::reader::ErrAt;

/// `frontend`: the stages, and the workload they were measured on, if said.
#[derive(Clone, Debug, PartialEq)]
pub struct Frontend {
    pub stages: Vec<FrontendStage>,
    pub measured_for: Option<Measurement>,
}

/// `host_profile`: take the stages from a measured host cost table.
#[derive(Clone, Debug, PartialEq)]
pub struct HostProfile {
    /// Made absolute against the working directory, as the reference does.
    pub path: PathBuf,
    pub frontend: &'static str,
}

/// The model, frontend, feature transport and image workload a set of stages was measured on
/// (the reference's `FrontendMeasurementConfig`; two are the same measurement when every field
/// is equal).
#[derive(Clone, Debug, PartialEq)]
pub struct Measurement {
    pub model: String,
    pub frontend: &'static str,
    pub feature_transport: &'static str,
    pub height: u32,
    pub width: u32,
    pub count: u32,
    pub encoding: &'static str,
    pub min_pixels: Option<u32>,
    pub max_pixels: Option<u32>,
}

const FRONTENDS: [&str; 2] = ["python", "rust"];

impl Measurement {
    /// The measurement a prediction of `model` over `images` on `tensor` ranks needs. SGLang
    /// 0.5.19's Python tokenizer manager always hands image features over in shared memory; the
    /// Rust workers keep them inline on one rank and use shared memory across tensor ranks.
    pub fn for_workload(model: &str, frontend: &'static str, images: &Images, tensor: u32) -> Measurement {
        Measurement {
            model: model.to_string(),
            frontend,
            feature_transport: if frontend == "python" || tensor > 1 { "shm" } else { "inline" },
            height: images.height,
            width: images.width,
            count: images.count,
            encoding: images.encoding,
            min_pixels: images.min_pixels,
            max_pixels: images.max_pixels,
        }
    }

    /// The reference's one-line description (`model frontend transport HxWxN encoding [pixels]`).
    pub fn describe(&self) -> String {
        let mut s = format!(
            "{} {} {} {}x{}x{} {}",
            self.model, self.frontend, self.feature_transport, self.height, self.width, self.count, self.encoding
        );
        for (name, value) in [("min_pixels", self.min_pixels), ("max_pixels", self.max_pixels)] {
            if let Some(v) = value {
                s.push_str(&format!(" {name}={v}"));
            }
        }
        s
    }

    pub(crate) fn read(mut m: Reader) -> Result<Measurement, DeployError> {
        let here = m.here().to_string();
        let required = |what: &str| DeployError::new(&here, format!("{what} is required"));
        let model = m.nonempty("model")?.ok_or_else(|| required("model"))?;
        let frontend = m.one_of("frontend", &FRONTENDS)?.ok_or_else(|| required("frontend"))?;
        let feature_transport =
            m.one_of("feature_transport", &["inline", "shm"])?.ok_or_else(|| required("feature_transport"))?;
        let height = m.positive("height")?.ok_or_else(|| required("height"))?;
        let width = m.positive("width")?.ok_or_else(|| required("width"))?;
        let count = m.positive("count")?.unwrap_or(1);
        let encoding = m.one_of("encoding", &["png", "jpeg"])?.unwrap_or("png");
        let min_pixels = m.positive("min_pixels")?;
        let max_pixels = m.positive("max_pixels")?;
        m.finish()?;
        Ok(Measurement { model, frontend, feature_transport, height, width, count, encoding, min_pixels, max_pixels })
    }
}

/// A list of stages (at least one) at `path`.
pub(crate) fn read_stages(path: &str, v: Option<&Value>) -> Result<Vec<FrontendStage>, DeployError> {
    let items = match v {
        None => return Err(DeployError::new(path, "stages is required")),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(DeployError::new(path, "must be a list of stages")),
    };
    if items.is_empty() {
        return Err(DeployError::new(path, "needs at least one stage"));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let mut s = Reader::mapping(&format!("{path}[{i}]"), item)?;
            let workers = s.positive("workers")?.unwrap_or(1);
            let service_ms =
                s.nonneg("service_ms", false)?.ok_or_else(|| DeployError::new(s.here(), "service_ms is required"))?;
            let concurrency_scale = match s.value("concurrency_scale") {
                None => Vec::new(),
                Some(Value::Array(xs)) => {
                    let scale_path = s.path("concurrency_scale");
                    xs.iter()
                        .enumerate()
                        .map(|(j, x)| match x.as_f64() {
                            Some(f) if f.is_finite() && f > 0.0 => Ok(f),
                            _ => Err(DeployError::new(
                                format!("{scale_path}[{j}]"),
                                format!("must be a positive finite number, got {x}"),
                            )),
                        })
                        .collect::<Result<Vec<f64>, _>>()?
                }
                Some(_) => return Err(s.err("concurrency_scale", "must be a list of positive numbers")),
            };
            if !concurrency_scale.is_empty() && concurrency_scale.len() != workers as usize {
                return Err(s.err("concurrency_scale", "concurrency_scale needs one entry per worker"));
            }
            s.finish()?;
            Ok(FrontendStage { workers, service_ms, concurrency_scale })
        })
        .collect()
}

/// `frontend` and `host_profile` of an aggregated or prefill worker, with the reference's rule
/// that they are one source or the other.
pub(super) fn read_worker_frontend(w: &mut Reader) -> Result<(Option<Frontend>, Option<HostProfile>), DeployError> {
    let frontend = match w.obj("frontend")? {
        None => None,
        Some(mut f) => {
            let stages = read_stages(&f.path("stages"), f.value("stages"))?;
            let measured_for = f.obj("measured_for")?.map(Measurement::read).transpose()?;
            f.finish()?;
            Some(Frontend { stages, measured_for })
        }
    };
    let host_profile = match w.obj("host_profile")? {
        None => None,
        Some(mut h) => {
            let path = h.text("path")?.ok_or_else(|| DeployError::new(h.here(), "path is required"))?;
            if path.trim().is_empty() {
                return Err(h.err("path", "path must be nonempty"));
            }
            let frontend = h.one_of("frontend", &FRONTENDS)?.ok_or_else(|| h.err("frontend", "is required"))?;
            h.finish()?;
            Some(HostProfile { path: absolute(&path), frontend })
        }
    };
    if frontend.is_some() && host_profile.is_some() {
        return Err(w.err("host_profile", "host_profile replaces the explicit frontend stages"));
    }
    Ok((frontend, host_profile))
}

/// `path` made absolute against the working directory (`~` expanded), as the reference's
/// `Path.expanduser().resolve()` does.
fn absolute(path: &str) -> PathBuf {
    let expanded = match (path.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => Path::new(&home).join(rest),
        _ => PathBuf::from(path),
    };
    std::fs::canonicalize(&expanded).unwrap_or_else(|_| std::path::absolute(&expanded).unwrap_or(expanded))
}

/// The reference's compile-time rules of the language worker's stages against the workload:
/// a host cost table resolves to the row of the workload's images (and needs images); stages
/// measured on one workload price only that workload. On success a `host_profile` is replaced
/// by the stages of its row.
pub(super) fn check_workload(traffic: &Traffic, engine: &mut Engine) -> Result<(), DeployError> {
    let (role, worker) = match (engine.aggregated.as_mut(), engine.prefill.as_mut()) {
        (Some(w), _) => ("aggregated", w),
        (None, Some(w)) => ("prefill", w),
        (None, None) => return Ok(()),
    };
    let at = |key: &str| format!("engine.workers.{role}.{key}");
    let images = traffic.images.as_ref();
    if let Some(profile) = worker.host_profile.take() {
        let Some(images) = images else {
            return Err(DeployError::new(at("host_profile"), "host_profile requires an image workload"));
        };
        let needed = Measurement::for_workload(&engine.model, profile.frontend, images, worker.parallelism.tensor);
        let stages = crate::host_table::resolve(&profile.path, &needed)
            .map_err(|message| DeployError::new(at("host_profile"), message))?;
        worker.frontend = Some(Frontend { stages, measured_for: Some(needed) });
        return Ok(());
    }
    let Some(measured) = worker.frontend.as_ref().and_then(|f| f.measured_for.as_ref()) else { return Ok(()) };
    let Some(images) = images else {
        return Err(DeployError::new(
            at("frontend.measured_for"),
            format!("frontend stages were measured for {}; this workload has no images", measured.describe()),
        ));
    };
    let needed = Measurement::for_workload(&engine.model, measured.frontend, images, worker.parallelism.tensor);
    if &needed != measured {
        return Err(DeployError::new(
            at("frontend.measured_for"),
            format!(
                "frontend stages were measured for {}; this prediction needs {}",
                measured.describe(),
                needed.describe()
            ),
        ));
    }
    Ok(())
}
