//! `evaluation.sla`: the latency targets a run is judged against.

use crate::error::DeployError;
use servesim_config::Reader;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sla {
    pub ttft_ms: Option<f64>,
    pub itl_ms: Option<f64>,
    pub e2e_ms: Option<f64>,
}

pub(crate) fn read_sla(mut s: Reader) -> Result<Sla, DeployError> {
    let sla = Sla {
        ttft_ms: s.nonneg("ttft_ms", true)?,
        itl_ms: s.nonneg("itl_ms", true)?,
        e2e_ms: s.nonneg("e2e_ms", true)?,
    };
    if sla.e2e_ms.is_some() && (sla.ttft_ms.is_some() || sla.itl_ms.is_some()) {
        return Err(DeployError::new(s.here(), "e2e_ms is mutually exclusive with ttft_ms/itl_ms"));
    }
    s.finish()?;
    Ok(sla)
}
