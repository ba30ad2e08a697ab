//! Launchers for `kernels/rope.cu`.

use super::parity::{unsupported, Case, Comparison};
use crate::error::Result;
use crate::gpu::GpuContext;

/// `op_parity` for one shape.
pub fn parity(_gpu: &mut GpuContext, _case: &Case<'_>) -> Result<Comparison> {
    Err(unsupported("rope"))
}
