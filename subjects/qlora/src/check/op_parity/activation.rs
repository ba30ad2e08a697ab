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
        (_, pass) if case.precision == Precision::Bf16 => {
            swiglu_bf16(gpu, pass, (&x, case.shape.dim("cols")), rng)
        }
        (_, pass) => swiglu_f32(gpu, pass, &x, rng),
    }
}

/// `op_parity` of SwiGLU in f32 for the gate `x`, forward or backward,
/// held to the f64 reference. The f32 arithmetic differs from f64 by ~1e-7
/// relative.
fn swiglu_f32(
    gpu: &mut GpuContext,
    pass: Pass,
    x: &[f32],
    mut rng: ChaCha8Rng,
) -> Result<Comparison> {
    let n = x.len();
    let up = uniform(&mut rng, n, -2.0, 2.0);
    let (seen_gate, seen_up) = (widen(x), widen(&up));
    let (d_gate, d_up) = (gpu.upload(x)?, gpu.upload(&up)?);
    match pass {
        Pass::Forward => {
            let want = refop::swiglu_forward(&seen_gate, &seen_up)?;
            let mut y = gpu.poisoned(n)?;
            swiglu_forward(
                gpu,
                &d_gate.as_view(),
                &d_up.as_view(),
                &mut y.as_view_mut(),
            )?;
            Ok(compare(&gpu.download(&y)?, &want))
        }
        Pass::Backward => {
            let dy = uniform(&mut rng, n, -1.0, 1.0);
            let (want_g, want_u) = refop::swiglu_backward(&seen_gate, &seen_up, &widen(&dy))?;
            let d_dy = gpu.upload(&dy)?;
            let (mut dgate, mut dup) = (gpu.poisoned(n)?, gpu.poisoned(n)?);
            swiglu_backward(
                gpu,
                &d_gate.as_view(),
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

/// Rows of `[a | b]`: row r of `a` then row r of `b` (`cols` each), as the
/// bf16 step keeps gate and up, and dgate and dup.
fn side_by_side<T: Copy>(a: &[T], b: &[T], cols: usize) -> Vec<T> {
    a.chunks(cols)
        .zip(b.chunks(cols))
        .flat_map(|(ra, rb)| ra.iter().chain(rb).copied())
        .collect()
}

/// The two halves of each row of `ab` (`2 cols` wide), apart.
fn apart<T: Copy>(ab: &[T], cols: usize) -> (Vec<T>, Vec<T>) {
    let rows = ab.chunks(2 * cols);
    let a = rows.clone().flat_map(|r| r[..cols].to_vec()).collect();
    let b = rows.flat_map(|r| r[cols..].to_vec()).collect();
    (a, b)
}

/// `op_parity` of the bf16 step's SwiGLU for the gate `x` (`[rows, cols]`),
/// forward or backward: gate, up and dy in bf16 as its GEMMs stored them
/// (gate and up side by side in each row of one matrix, as one GEMM of
/// `[Wg; Wu]` writes them), the results rounded to bf16 (dgate and dup side
/// by side, for one GEMM), held to the f64 reference of the inputs as bf16
/// holds them, rounded to bf16 ([`Written`]). The f32 arithmetic differs
/// from f64 by ~1e-7 relative, so only values within that of a rounding
/// boundary may land one bf16 step away; a store that truncates, or one
/// that rounds twice, moves about half of all values; a row read or
/// written at the wrong place moves nearly all.
fn swiglu_bf16(
    gpu: &mut GpuContext,
    pass: Pass,
    (x, cols): (&[f32], usize),
    mut rng: ChaCha8Rng,
) -> Result<Comparison> {
    let n = x.len();
    let up = uniform(&mut rng, n, -2.0, 2.0);
    let (gate, up) = (Bf16::rounded(x), Bf16::rounded(&up));
    let (seen_gate, seen_up) = (widen(&Bf16::values(&gate)), widen(&Bf16::values(&up)));
    let d_gu = gpu.upload(&side_by_side(&gate, &up, cols))?;
    match pass {
        Pass::Forward => {
            let want = refop::swiglu_forward(&seen_gate, &seen_up)?;
            let mut y = Bf16::poisoned(gpu, n)?;
            swiglu_forward_bf16(gpu, &d_gu.as_view(), cols, &mut y.as_view_mut())?;
            Ok(compare_written(&gpu.download(&y)?, &want))
        }
        Pass::Backward => {
            let dy = Bf16::rounded(&uniform(&mut rng, n, -1.0, 1.0));
            let seen_dy = widen(&Bf16::values(&dy));
            let (want_g, want_u) = refop::swiglu_backward(&seen_gate, &seen_up, &seen_dy)?;
            let d_dy = gpu.upload(&dy)?;
            let mut dgu = Bf16::poisoned(gpu, 2 * n)?;
            swiglu_backward_bf16(
                gpu,
                &d_gu.as_view(),
                cols,
                &d_dy.as_view(),
                &mut dgu.as_view_mut(),
            )?;
            let (dgate, dup) = apart(&gpu.download(&dgu)?, cols);
            Ok(compare_written(&dgate, &want_g).merge(compare_written(&dup, &want_u)))
        }
    }
}
