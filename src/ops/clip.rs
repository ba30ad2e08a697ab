//! Launchers for `kernels/clip.cu`.

use super::parity::{unsupported, Case, Comparison};
use crate::check::op::Op;
use crate::error::Result;
use crate::gpu::GpuContext;

/// `op_parity` for one shape.
pub fn parity(_op: Op, _gpu: &mut GpuContext, _case: &Case<'_>) -> Result<Comparison> {
    Err(unsupported("clip"))
}
