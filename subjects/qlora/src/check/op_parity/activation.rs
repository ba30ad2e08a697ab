//! `op_parity` of `activation`: the launchers of `qlora::ops::activation` against the oracle.

use super::compare::{case_rng, compare, compare_written, uniform, widen, Written};
use super::compare::{Case, Comparison};
use crate::check::op::{Op, Pass};
use crate::check::params::Precision;
use crate::error::Result;
use crate::reference::activation as refop;
use qlora::gpu::GpuContext;
use qlora::ops::activation::*;
use qlora::ops::cast::Bf16;
use rand_chacha::ChaCha8Rng;

/// `op_parity` of SiLU or SwiGLU for one `{rows, cols}` shape. Inputs span
/// [-8, 8], covering both saturated tails of the sigmoid. SwiGLU at
/// precision `bf16` runs the bf16 step's kernels ([`swiglu`]).
pub fn parity(op: Op, gpu: &mut GpuContext, case: &Case<'_>) -> Result<Comparison> {
    let n = case.shape.dim("rows") * case.shape.dim("cols");
    let mut rng = case_rng(case.seed);
    let x = uniform(&mut rng, n, -8.0, 8.0);
    match (op, case.pass) {
        (Op::Silu, Pass::Forward) => {
            let dx_in = gpu.upload(&x)?;
            let want = refop::silu_forward(&widen(&x));
            let mut y = gpu.poisoned(n)?;
            silu_forward(gpu, &dx_in.as_view(), &mut y.as_view_mut())?;
            Ok(compare(&gpu.download(&y)?, &want))
        }
        (Op::Silu, Pass::Backward) => {
            let dx_in = gpu.upload(&x)?;
            let dy = uniform(&mut rng, n, -1.0, 1.0);
            let want = refop::silu_backward(&widen(&x), &widen(&dy))?;
            let d_dy = gpu.upload(&dy)?;
            let mut dx = gpu.poisoned(n)?;
            silu_backward(
                gpu,
                &dx_in.as_view(),
                &d_dy.as_view(),
                &mut dx.as_view_mut(),
            )?;
            Ok(compare(&gpu.download(&dx)?, &want))
        }
        (_, pass) if case.precision == Precision::Bf16 => swiglu::<Bf16>(gpu, pass, &x, rng),
        (_, pass) => swiglu::<f32>(gpu, pass, &x, rng),
    }
}

/// `op_parity` of SwiGLU for the gate `x`, forward or backward, on the
/// kernels that read and write `W`: f32, or bf16 (the bf16 step's gate, up
/// and dy as its GEMMs stored them, and its GEMM operands), held to the f64
/// reference of the inputs as `W` holds them, rounded to `W` ([`Written`]).
/// The f32 arithmetic differs from f64 by ~1e-7 relative, so only values
/// within that of a rounding boundary may land one bf16 step away; a store
/// that truncates, or one that rounds twice, moves about half of all values.
fn swiglu<W: Written>(
    gpu: &mut GpuContext,
    pass: Pass,
    x: &[f32],
    mut rng: ChaCha8Rng,
) -> Result<Comparison>
where
    (W, W): SwigluKernels,
{
    let n = x.len();
    let up = uniform(&mut rng, n, -2.0, 2.0);
    let (gate, up) = (W::rounded(x), W::rounded(&up));
    let (seen_gate, seen_up) = (widen(&W::values(&gate)), widen(&W::values(&up)));
    let (d_gate, d_up) = (gpu.upload(&gate)?, gpu.upload(&up)?);
    match pass {
        Pass::Forward => {
            let want = refop::swiglu_forward(&seen_gate, &seen_up)?;
            let mut y = W::poisoned(gpu, n)?;
            swiglu_forward(
                gpu,
                &d_gate.as_view(),
                &d_up.as_view(),
                &mut y.as_view_mut(),
            )?;
            Ok(compare_written(&gpu.download(&y)?, &want))
        }
        Pass::Backward => {
            let dy = W::rounded(&uniform(&mut rng, n, -1.0, 1.0));
            let seen_dy = widen(&W::values(&dy));
            let (want_g, want_u) = refop::swiglu_backward(&seen_gate, &seen_up, &seen_dy)?;
            let d_dy = gpu.upload(&dy)?;
            let (mut dgate, mut dup) = (W::poisoned(gpu, n)?, W::poisoned(gpu, n)?);
            swiglu_backward(
                gpu,
                &d_gate.as_view(),
                &d_up.as_view(),
                &d_dy.as_view(),
                &mut dgate.as_view_mut(),
                &mut dup.as_view_mut(),
            )?;
            let cg = compare_written(&gpu.download(&dgate)?, &want_g);
            let cu = compare_written(&gpu.download(&dup)?, &want_u);
            Ok(cg.merge(cu))
        }
    }
}
