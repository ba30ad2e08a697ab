//! `op_parity` of `activation`: the launchers of `qlora::ops::activation` against the oracle.

use super::compare::{case_rng, compare, compare_written, uniform, widen, Written};
use super::compare::{Case, Comparison};
use crate::check::op::{Op, Pass};
use crate::check::params::Precision;
use crate::error::Result;
use crate::reference::activation as refop;
use cudarc::driver::CudaSlice;
use qlora::gpu::GpuContext;
use qlora::ops::activation::*;
use qlora::ops::cast::Bf16;
use rand_chacha::ChaCha8Rng;

/// `op_parity` of SiLU or SwiGLU for one `{rows, cols}` shape. Inputs span
/// [-8, 8], covering both saturated tails of the sigmoid. SwiGLU at
/// precision `bf16` runs the kernels that write bf16 ([`swiglu`]).
pub fn parity(op: Op, gpu: &mut GpuContext, case: &Case<'_>) -> Result<Comparison> {
    let n = case.shape.dim("rows") * case.shape.dim("cols");
    let mut rng = case_rng(case.seed);
    let x = uniform(&mut rng, n, -8.0, 8.0);
    let dx_in = gpu.upload(&x)?;
    match (op, case.pass) {
        (Op::Silu, Pass::Forward) => {
            let want = refop::silu_forward(&widen(&x));
            let mut y = gpu.poisoned(n)?;
            silu_forward(gpu, &dx_in.as_view(), &mut y.as_view_mut())?;
            Ok(compare(&gpu.download(&y)?, &want))
        }
        (Op::Silu, Pass::Backward) => {
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
        (_, pass) if case.precision == Precision::Bf16 => {
            swiglu::<Bf16>(gpu, pass, (&x, &dx_in), rng)
        }
        (_, pass) => swiglu::<f32>(gpu, pass, (&x, &dx_in), rng),
    }
}

/// `op_parity` of SwiGLU for the gate `x` (`d_gate` on the device), forward
/// or backward, with the
/// kernels that write `W`: f32, or bf16 (the bf16 step's GEMM operands),
/// held to the f64 reference rounded to bf16 ([`Written`]). The f32
/// arithmetic differs from f64 by ~1e-7 relative, so only values within
/// that of a rounding boundary may land one bf16 step away; a store that
/// truncates, or one that rounds twice, moves about half of all values.
fn swiglu<W: Written + SwigluOut>(
    gpu: &mut GpuContext,
    pass: Pass,
    (x, d_gate): (&[f32], &CudaSlice<f32>),
    mut rng: ChaCha8Rng,
) -> Result<Comparison> {
    let n = x.len();
    let up = uniform(&mut rng, n, -2.0, 2.0);
    let d_up = gpu.upload(&up)?;
    match pass {
        Pass::Forward => {
            let want = refop::swiglu_forward(&widen(x), &widen(&up))?;
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
            let dy = uniform(&mut rng, n, -1.0, 1.0);
            let (want_g, want_u) = refop::swiglu_backward(&widen(x), &widen(&up), &widen(&dy))?;
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
