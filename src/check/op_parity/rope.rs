//! `op_parity` of `rope`: the launchers of `qlora::ops::rope` against the oracle.

use super::compare::{case_rng, compare, uniform, widen, Case, Comparison};
use crate::check::op::Pass;
use crate::error::Result;
use crate::reference::rope as refop;
use cudarc::driver::{CudaView, CudaViewMut};
use qlora::gpu::GpuContext;
use qlora::model::ModelConfig;
use qlora::ops::rope::*;

/// `op_parity` of RoPE for one `{batch, seq, heads, head_dim}` shape, with the
/// presets' theta (1e6).
pub fn parity(gpu: &mut GpuContext, case: &Case<'_>) -> Result<Comparison> {
    let (batch, seq, heads, head_dim) = (
        case.shape.dim("batch"),
        case.shape.dim("seq"),
        case.shape.dim("heads"),
        case.shape.dim("head_dim"),
    );
    let theta = ModelConfig::ROPE_THETA;
    let n = batch * seq * heads * head_dim;
    let mut rng = case_rng(case.seed);
    let x = uniform(&mut rng, n, -2.0, 2.0);
    let d_x = gpu.upload(&x)?;
    let mut y = gpu.poisoned(n)?;
    let (launcher, reference): (Launcher, RefRope) = match case.pass {
        Pass::Forward => (forward, refop::forward),
        Pass::Backward => (backward, refop::backward),
    };
    let dims = (batch, seq, heads, head_dim);
    launcher(
        gpu,
        &d_x.as_view(),
        batch,
        seq,
        heads,
        head_dim,
        theta,
        &mut y.as_view_mut(),
    )?;
    let want = reference(&widen(&x), dims.0, dims.1, dims.2, dims.3, theta)?;
    Ok(compare(&gpu.download(&y)?, &want))
}

/// A RoPE launcher: `(gpu, x, batch, seq, heads, head_dim, theta, y)`.
type Launcher = fn(
    &mut GpuContext,
    &CudaView<'_, f32>,
    usize,
    usize,
    usize,
    usize,
    f64,
    &mut CudaViewMut<'_, f32>,
) -> qlora::Result<()>;

/// A reference RoPE direction: `(x, batch, seq, heads, head_dim, theta)`.
type RefRope = fn(&[f64], usize, usize, usize, usize, f64) -> Result<Vec<f64>>;
