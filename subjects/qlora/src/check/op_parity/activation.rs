//! `op_parity` of `activation`: the launchers of `qlora::ops::activation` against the oracle.

use super::compare::{case_rng, compare, rounded_to_bf16, uniform, widen, widened_bf16};
use super::compare::{Case, Comparison};
use crate::check::op::{Op, Pass};
use crate::check::params::Precision;
use crate::error::Result;
use crate::reference::activation as refop;
use qlora::gpu::GpuContext;
use qlora::ops::activation::*;
use qlora::ops::cast::Bf16;

/// `op_parity` of SiLU or SwiGLU for one `{rows, cols}` shape. Inputs span
/// [-8, 8], covering both saturated tails of the sigmoid. SwiGLU at
/// precision `bf16` runs the kernels that write bf16 ([`parity_bf16`]).
pub fn parity(op: Op, gpu: &mut GpuContext, case: &Case<'_>) -> Result<Comparison> {
    if op == Op::Swiglu && case.precision == Precision::Bf16 {
        return parity_bf16(gpu, case);
    }
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

/// `op_parity` of the SwiGLU kernels that write bf16, forward or backward,
/// against the f64 reference rounded to bf16 (nearest, ties to even): what a
/// cast after the f32 kernel would store. The f32 arithmetic differs from
/// f64 by ~1e-7 relative, so only values within that of a rounding
/// boundary may land one bf16 step away; a store that truncates, or one
/// that rounds twice, moves about half of all values.
fn parity_bf16(gpu: &mut GpuContext, case: &Case<'_>) -> Result<Comparison> {
    let n = case.shape.dim("rows") * case.shape.dim("cols");
    let mut rng = case_rng(case.seed);
    let x = uniform(&mut rng, n, -8.0, 8.0);
    let up = uniform(&mut rng, n, -2.0, 2.0);
    let (gate_d, up_d) = (gpu.upload(&x)?, gpu.upload(&up)?);
    let poison = || gpu.upload(&vec![Bf16::from_f32(f32::NAN); n]);
    match case.pass {
        Pass::Forward => {
            let want = rounded_to_bf16(&refop::swiglu_forward(&widen(&x), &widen(&up))?);
            let mut y = poison()?;
            swiglu_forward(
                gpu,
                &gate_d.as_view(),
                &up_d.as_view(),
                &mut y.as_view_mut(),
            )?;
            Ok(compare(&widened_bf16(&gpu.download(&y)?), &want))
        }
        Pass::Backward => {
            let dy = uniform(&mut rng, n, -1.0, 1.0);
            let (want_g, want_u) = refop::swiglu_backward(&widen(&x), &widen(&up), &widen(&dy))?;
            let dy_d = gpu.upload(&dy)?;
            let (mut dgate, mut dup) = (poison()?, poison()?);
            swiglu_backward(
                gpu,
                &gate_d.as_view(),
                &up_d.as_view(),
                &dy_d.as_view(),
                &mut dgate.as_view_mut(),
                &mut dup.as_view_mut(),
            )?;
            let cg = compare(
                &widened_bf16(&gpu.download(&dgate)?),
                &rounded_to_bf16(&want_g),
            );
            let cu = compare(
                &widened_bf16(&gpu.download(&dup)?),
                &rounded_to_bf16(&want_u),
            );
            Ok(cg.merge(cu))
        }
    }
}
