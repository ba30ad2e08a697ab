//! `op_parity` of `activation`: the launchers of `qlora::ops::activation` against the oracle.

use super::compare::{case_rng, compare, uniform, widen, Case, Comparison};
use crate::check::op::{Op, Pass};
use crate::error::Result;
use crate::reference::activation as refop;
use qlora::gpu::GpuContext;
use qlora::ops::activation::*;

/// `op_parity` of SiLU or SwiGLU for one `{rows, cols}` shape. Inputs span
/// [-8, 8], covering both saturated tails of the sigmoid.
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
        (_, Pass::Forward) => {
            let up = uniform(&mut rng, n, -2.0, 2.0);
            let want = refop::swiglu_forward(&widen(&x), &widen(&up))?;
            let d_up = gpu.upload(&up)?;
            let mut y = gpu.poisoned(n)?;
            swiglu_forward(gpu, &dx_in.as_view(), &d_up.as_view(), &mut y.as_view_mut())?;
            Ok(compare(&gpu.download(&y)?, &want))
        }
        (_, Pass::Backward) => {
            let up = uniform(&mut rng, n, -2.0, 2.0);
            let dy = uniform(&mut rng, n, -1.0, 1.0);
            let (want_g, want_u) = refop::swiglu_backward(&widen(&x), &widen(&up), &widen(&dy))?;
            let d_up = gpu.upload(&up)?;
            let d_dy = gpu.upload(&dy)?;
            let mut dgate = gpu.poisoned(n)?;
            let mut dup = gpu.poisoned(n)?;
            swiglu_backward(
                gpu,
                &dx_in.as_view(),
                &d_up.as_view(),
                &d_dy.as_view(),
                &mut dgate.as_view_mut(),
                &mut dup.as_view_mut(),
            )?;
            let cg = compare(&gpu.download(&dgate)?, &want_g);
            let cu = compare(&gpu.download(&dup)?, &want_u);
            Ok(cg.merge(cu))
        }
    }
}
