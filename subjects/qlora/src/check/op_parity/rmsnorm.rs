//! `op_parity` of `rmsnorm`: the launchers of `qlora::ops::rmsnorm` against the oracle.

use super::compare::{case_rng, compare, compare_written, uniform, widen, Written};
use super::compare::{Case, Comparison};
use crate::check::op::Pass;
use crate::check::params::Precision;
use crate::error::Result;
use crate::reference::rmsnorm as refop;
use cudarc::driver::CudaSlice;
use qlora::gpu::GpuContext;
use qlora::model::ModelConfig;
use qlora::ops::cast::Bf16;
use qlora::ops::rmsnorm::*;
use rand_chacha::ChaCha8Rng;

/// `op_parity` of RMSNorm for one `{rows, hidden}` shape. Forward runs both the
/// plain and the fused residual kernel (at precision `bf16`: the forward
/// that also writes `y`'s bf16 rounding and the one that writes only that,
/// both held to the reference rounded to bf16); backward compares dx and dgamma (at precision `bf16`: the
/// training step's form, dx added onto a residual gradient and the sum's
/// bf16 rounding written in the same pass).
pub fn parity(gpu: &mut GpuContext, case: &Case<'_>) -> Result<Comparison> {
    let rows = case.shape.dim("rows");
    let hidden = case.shape.dim("hidden");
    let eps = ModelConfig::RMS_EPS;
    let n = rows * hidden;
    let mut rng = case_rng(case.seed);
    let x = uniform(&mut rng, n, -2.0, 2.0);
    let gamma = uniform(&mut rng, hidden, 0.5, 1.5);
    let d_x = gpu.upload(&x)?;
    let d_gamma = gpu.upload(&gamma)?;
    // The kernel sees eps rounded to f32; so does the reference.
    let eps_ref = f64::from(eps as f32);
    match case.pass {
        Pass::Forward if case.precision == Precision::Bf16 => {
            // y and its bf16 rounding, and a copy of x, written in one pass.
            let want = refop::forward(&widen(&x), &widen(&gamma), rows, hidden, eps_ref)?;
            let (mut y, mut y16) = (gpu.poisoned(n)?, Bf16::poisoned(gpu, n)?);
            let mut copy = gpu.poisoned(n)?;
            forward_with_bf16(
                gpu,
                &d_x.as_view(),
                &d_gamma.as_view(),
                rows,
                hidden,
                eps,
                (&mut y.as_view_mut(), &mut y16.as_view_mut()),
                Some(&mut copy.as_view_mut()),
            )?;
            let full = compare(&gpu.download(&y)?, &want);
            let with_f32 = compare_written(&gpu.download(&y16)?, &want);
            let copied = compare(&gpu.download(&copy)?, &widen(&x));
            // The rounding alone (a norm whose f32 output nothing reads),
            // with and without the copy.
            let (mut alone, mut alone_copy) = (Bf16::poisoned(gpu, n)?, gpu.poisoned(n)?);
            let inputs = (&d_x.as_view(), &d_gamma.as_view());
            let copy = Some(&mut alone_copy.as_view_mut());
            forward_bf16(
                gpu,
                inputs,
                (rows, hidden),
                eps,
                &mut alone.as_view_mut(),
                copy,
            )?;
            let alone = compare_written(&gpu.download(&alone)?, &want);
            let alone_copied = compare(&gpu.download(&alone_copy)?, &widen(&x));
            let mut bare = Bf16::poisoned(gpu, n)?;
            forward_bf16(
                gpu,
                inputs,
                (rows, hidden),
                eps,
                &mut bare.as_view_mut(),
                None,
            )?;
            let bare = compare_written(&gpu.download(&bare)?, &want);
            Ok(full
                .merge(with_f32)
                .merge(copied)
                .merge(alone)
                .merge(alone_copied)
                .merge(bare))
        }
        Pass::Forward => {
            let want = refop::forward(&widen(&x), &widen(&gamma), rows, hidden, eps_ref)?;
            let mut y = gpu.poisoned(n)?;
            forward(
                gpu,
                &d_x.as_view(),
                &d_gamma.as_view(),
                rows,
                hidden,
                eps,
                &mut y.as_view_mut(),
            )?;
            let plain = compare(&gpu.download(&y)?, &want);

            // Fused: h = a + b is rounded to f32 exactly as the kernel rounds it.
            let b = uniform(&mut rng, n, -1.0, 1.0);
            let h_f32: Vec<f32> = x.iter().zip(&b).map(|(p, q)| p + q).collect();
            let want_y = refop::forward(&widen(&h_f32), &widen(&gamma), rows, hidden, eps_ref)?;
            let d_b = gpu.upload(&b)?;
            let mut h = gpu.poisoned(n)?;
            let mut y2 = gpu.poisoned(n)?;
            forward_residual(
                gpu,
                &d_x.as_view(),
                &d_b.as_view(),
                &d_gamma.as_view(),
                rows,
                hidden,
                eps,
                &mut h.as_view_mut(),
                &mut y2.as_view_mut(),
            )?;
            let fused_h = compare(&gpu.download(&h)?, &widen(&h_f32));
            let fused_y = compare(&gpu.download(&y2)?, &want_y);
            Ok(plain.merge(fused_h).merge(fused_y))
        }
        Pass::Backward if case.precision == Precision::Bf16 => {
            backward_onto_residual(gpu, case, &mut rng, (&x, &gamma), (&d_x, &d_gamma))
        }
        Pass::Backward => {
            let dy = uniform(&mut rng, n, -1.0, 1.0);
            let (want_dx, want_dg) = refop::backward(
                &widen(&x),
                &widen(&gamma),
                &widen(&dy),
                rows,
                hidden,
                eps_ref,
            )?;
            let d_dy = gpu.upload(&dy)?;
            let mut dx = gpu.poisoned(n)?;
            let mut dgamma = gpu.poisoned(hidden)?;
            let mut ws = BackwardWorkspace::new(gpu, rows, hidden)?;
            backward(
                gpu,
                &d_x.as_view(),
                &d_gamma.as_view(),
                &d_dy.as_view(),
                rows,
                hidden,
                eps,
                &mut dx.as_view_mut(),
                &mut dgamma.as_view_mut(),
                &mut ws,
            )?;
            let c_dx = compare(&gpu.download(&dx)?, &want_dx);
            let c_dg = compare(&gpu.download(&dgamma)?, &want_dg);
            Ok(c_dx.merge(c_dg))
        }
    }
}

/// The backward as the training step runs it: `dres += dx` on a residual
/// gradient `dres` drawn for the case, with the sum's bf16 rounding, both
/// held to `dres + dx` of the reference (the bf16 copy rounded as it holds
/// it), and dgamma as the plain backward's.
fn backward_onto_residual(
    gpu: &mut GpuContext,
    case: &Case<'_>,
    rng: &mut ChaCha8Rng,
    (x, gamma): (&[f32], &[f32]),
    (d_x, d_gamma): (&CudaSlice<f32>, &CudaSlice<f32>),
) -> Result<Comparison> {
    let rows = case.shape.dim("rows");
    let hidden = case.shape.dim("hidden");
    let n = rows * hidden;
    let eps = ModelConfig::RMS_EPS;
    let dy = uniform(rng, n, -1.0, 1.0);
    let dres_in = uniform(rng, n, -1.0, 1.0);
    let eps_ref = f64::from(eps as f32);
    let (want_dx, want_dg) =
        refop::backward(&widen(x), &widen(gamma), &widen(&dy), rows, hidden, eps_ref)?;
    let want_sum: Vec<f64> = want_dx
        .iter()
        .zip(&dres_in)
        .map(|(d, r)| d + f64::from(*r))
        .collect();
    let d_dy = gpu.upload(&dy)?;
    let mut dres = gpu.upload(&dres_in)?;
    let mut dres16 = Bf16::poisoned(gpu, n)?;
    let mut dgamma = gpu.poisoned(hidden)?;
    let mut ws = BackwardWorkspace::new(gpu, rows, hidden)?;
    let out = DxOut {
        dx: &mut dres.as_view_mut(),
        onto: true,
        dx16: Some(&mut dres16.as_view_mut()),
    };
    let inputs = (&d_x.as_view(), &d_gamma.as_view(), &d_dy.as_view());
    let mut dg = dgamma.as_view_mut();
    let dg = Dgamma::Now(&mut dg);
    backward_to(gpu, inputs, (rows, hidden, eps), out, dg, &mut ws)?;
    let c_sum = compare(&gpu.download(&dres)?, &want_sum);
    let c_16 = compare_written(&gpu.download(&dres16)?, &want_sum);
    let c_dg = compare(&gpu.download(&dgamma)?, &want_dg);
    Ok(c_sum.merge(c_16).merge(c_dg))
}
