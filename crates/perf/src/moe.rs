//! Mixture-of-experts ops.

use crate::error::{PerfError, Result};
use crate::model::{Layout, ModelSpec, Op};

/// Fused MoE FFN of one layer.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeOp {
    pub name: String,
    pub scale: f64,
}

/// MoE dispatch / combine.
#[derive(Clone, Debug, PartialEq)]
pub struct DispatchOp {
    pub name: String,
    pub scale: f64,
}

/// The MoE table (not read yet).
#[derive(Debug, Default)]
pub struct MoeTable;

pub fn push_moe_ops(_list: &mut Vec<Op>, m: &ModelSpec, _l: &Layout, _ctx: bool, _scale: f64) -> Result<()> {
    Err(PerfError::unsupported(format!(
        "{}: mixture-of-experts models ({}) are not modelled yet",
        m.name, m.architecture
    )))
}

pub fn push_moe_allreduce(_list: &mut Vec<Op>, _m: &ModelSpec, _l: &Layout, _ctx: bool, _scale: f64) {}

pub fn eval_moe(_db: &crate::db::Database, m: &MoeOp, _x: u32) -> Result<f64> {
    Err(PerfError::unsupported(format!("{}: MoE is not modelled yet", m.name)))
}

pub fn eval_dispatch(_db: &crate::db::Database, d: &DispatchOp, _x: u32) -> Result<f64> {
    Err(PerfError::unsupported(format!("{}: MoE is not modelled yet", d.name)))
}
