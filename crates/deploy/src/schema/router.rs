//! The `router:` adapter section: round robin or Dynamo's KV router and its knobs.

use crate::error::DeployError;
use servesim_config::Reader;

#[derive(Clone, Debug, PartialEq)]
pub enum RouterPolicy {
    RoundRobin,
    KvRouter { overlap_score_credit: f64, prefill_load_scale: f64, temperature: f64, ais_load_model: bool },
}

pub(super) fn read_router(mut r: Reader) -> Result<RouterPolicy, DeployError> {
    let policy = r.one_of("policy", &["round_robin", "kv_router"])?.unwrap_or("round_robin");
    let load_model = match r.obj("prefill_load_model")? {
        Some(mut m) => {
            let t = m.one_of("type", &["none", "ais", "aic"])?.unwrap_or("none");
            m.finish()?;
            t
        }
        None => "none",
    };
    let credit = r.number("overlap_score_credit")?;
    let scale = r.number("prefill_load_scale")?;
    let temp = r.number("temperature")?;
    let here = r.here().to_string();
    r.finish()?;
    if policy == "round_robin" {
        if load_model != "none" || credit.is_some() || scale.is_some() || temp.is_some() {
            return Err(DeployError::new(
                here,
                "round_robin requires prefill_load_model none and takes no overlap_score_credit, prefill_load_scale or temperature",
            ));
        }
        return Ok(RouterPolicy::RoundRobin);
    }
    for (k, v) in [("overlap_score_credit", credit), ("prefill_load_scale", scale), ("temperature", temp)] {
        if let Some(x) = v {
            if !(x.is_finite() && x >= 0.0) {
                return Err(DeployError::new(format!("{here}.{k}"), format!("must be a finite number ≥ 0, got {x}")));
            }
        }
    }
    Ok(RouterPolicy::KvRouter {
        overlap_score_credit: credit.unwrap_or(1.0),
        prefill_load_scale: scale.unwrap_or(1.0),
        temperature: temp.unwrap_or(0.0),
        ais_load_model: load_model != "none",
    })
}
