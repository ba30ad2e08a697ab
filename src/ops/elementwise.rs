//! Launchers for `kernels/elementwise.cu`: residual add `y = a + b` (backward
//! `da = db = dy`) and scale `y = s x` (backward `dx = s dy`).

use cudarc::driver::{CudaView, CudaViewMut, PushKernelArg};
use rand::Rng;

use super::parity::{
    case_rng, compare, uniform, vec4_launch, widen, Arg, Case, Comparison, Signatures,
};
use crate::check::op::{Op, Pass};
use crate::error::Result;
use crate::gpu::GpuContext;
use crate::mutant::Mutant;
use crate::reference;
use crate::reference::elementwise::expect_len;

pub const MODULE: &str = "elementwise";

/// Kernel argument lists, checked against the compiled PTX by a unit test.
pub const SIGNATURES: Signatures = &[
    (
        "residual_add_fwd_f32",
        &[Arg::Ptr, Arg::Ptr, Arg::Ptr, Arg::I32],
    ),
    (
        "residual_add_bwd_f32",
        &[Arg::Ptr, Arg::Ptr, Arg::Ptr, Arg::I32],
    ),
    ("scale_fwd_f32", &[Arg::Ptr, Arg::Ptr, Arg::F32, Arg::I32]),
    ("scale_bwd_f32", &[Arg::Ptr, Arg::Ptr, Arg::F32, Arg::I32]),
];

/// `y = a + b`, all of one length.
pub fn residual_add(
    gpu: &mut GpuContext,
    a: &CudaView<'_, f32>,
    b: &CudaView<'_, f32>,
    y: &mut CudaViewMut<'_, f32>,
    fault: Option<Mutant>,
) -> Result<()> {
    let n = a.len();
    expect_len("residual_add", "b", b.len(), &[n])?;
    expect_len("residual_add", "y", y.len(), &[n])?;
    let Some((n_i, cfg)) = vec4_launch(gpu, "residual_add", n, fault)? else {
        return Ok(());
    };
    let f = gpu.function(MODULE, "residual_add_fwd_f32")?;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(a).arg(b).arg(y).arg(&n_i);
    // SAFETY: residual_add_fwd_f32(const float* a, const float* b, float* y, int n):
    // a, b, y hold n >= n_i elements (checked above); y does not alias a or b
    // (a shared and a mutable borrow).
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// `da = dy`, `db = dy`.
pub fn residual_add_backward(
    gpu: &mut GpuContext,
    dy: &CudaView<'_, f32>,
    da: &mut CudaViewMut<'_, f32>,
    db: &mut CudaViewMut<'_, f32>,
    fault: Option<Mutant>,
) -> Result<()> {
    let n = dy.len();
    expect_len("residual_add", "da", da.len(), &[n])?;
    expect_len("residual_add", "db", db.len(), &[n])?;
    let Some((n_i, cfg)) = vec4_launch(gpu, "residual_add", n, fault)? else {
        return Ok(());
    };
    let f = gpu.function(MODULE, "residual_add_bwd_f32")?;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(dy).arg(da).arg(db).arg(&n_i);
    // SAFETY: residual_add_bwd_f32(const float* dy, float* da, float* db, int n):
    // all three hold n >= n_i elements; da and db are distinct mutable borrows.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// `y = s x`.
pub fn scale(
    gpu: &mut GpuContext,
    x: &CudaView<'_, f32>,
    s: f64,
    y: &mut CudaViewMut<'_, f32>,
    fault: Option<Mutant>,
) -> Result<()> {
    launch_scale(gpu, "scale_fwd_f32", x, s, y, fault)
}

/// `dx = s dy`.
pub fn scale_backward(
    gpu: &mut GpuContext,
    dy: &CudaView<'_, f32>,
    s: f64,
    dx: &mut CudaViewMut<'_, f32>,
    fault: Option<Mutant>,
) -> Result<()> {
    launch_scale(gpu, "scale_bwd_f32", dy, s, dx, fault)
}

fn launch_scale(
    gpu: &mut GpuContext,
    symbol: &str,
    x: &CudaView<'_, f32>,
    s: f64,
    y: &mut CudaViewMut<'_, f32>,
    fault: Option<Mutant>,
) -> Result<()> {
    let n = x.len();
    expect_len("scale", "output", y.len(), &[n])?;
    let Some((n_i, cfg)) = vec4_launch(gpu, "scale", n, fault)? else {
        return Ok(());
    };
    let s_f = s as f32;
    let f = gpu.function(MODULE, symbol)?;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(x).arg(y).arg(&s_f).arg(&n_i);
    // SAFETY: scale_{fwd,bwd}_f32(const float* x, float* y, float s, int n):
    // x and y hold n >= n_i elements and do not alias.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// `op_parity` of residual add or scale for one `{rows, cols}` shape.
pub fn parity(op: Op, gpu: &mut GpuContext, case: &Case<'_>) -> Result<Comparison> {
    let n = case.shape.dim("rows") * case.shape.dim("cols");
    let mut rng = case_rng(case.seed);
    let fault = case.mutant;
    match (op, case.pass) {
        (Op::ResidualAdd, Pass::Forward) => {
            let a = uniform(&mut rng, n, -2.0, 2.0);
            let b = uniform(&mut rng, n, -2.0, 2.0);
            let want = reference::elementwise::residual_add(&widen(&a), &widen(&b))?;
            let (da, db) = (gpu.upload(&a)?, gpu.upload(&b)?);
            let mut y = gpu.poisoned(n)?;
            residual_add(
                gpu,
                &da.as_view(),
                &db.as_view(),
                &mut y.as_view_mut(),
                fault,
            )?;
            Ok(compare(&gpu.download(&y)?, &want))
        }
        (Op::ResidualAdd, Pass::Backward) => {
            let g = uniform(&mut rng, n, -2.0, 2.0);
            let (want_a, want_b) = reference::elementwise::residual_add_backward(&widen(&g));
            let dg = gpu.upload(&g)?;
            let mut da = gpu.poisoned(n)?;
            let mut db = gpu.poisoned(n)?;
            residual_add_backward(
                gpu,
                &dg.as_view(),
                &mut da.as_view_mut(),
                &mut db.as_view_mut(),
                fault,
            )?;
            let ca = compare(&gpu.download(&da)?, &want_a);
            let cb = compare(&gpu.download(&db)?, &want_b);
            Ok(ca.merge(cb))
        }
        (_, pass) => {
            let x = uniform(&mut rng, n, -2.0, 2.0);
            // A scale that is not a power of two, so the product really rounds.
            let s = f64::from(rng.random_range(0.3f32..3.0));
            let dx = gpu.upload(&x)?;
            let mut y = gpu.poisoned(n)?;
            let want = if pass == Pass::Forward {
                scale(gpu, &dx.as_view(), s, &mut y.as_view_mut(), fault)?;
                reference::elementwise::scale(&widen(&x), s)
            } else {
                scale_backward(gpu, &dx.as_view(), s, &mut y.as_view_mut(), fault)?;
                reference::elementwise::scale_backward(&widen(&x), s)
            };
            Ok(compare(&gpu.download(&y)?, &want))
        }
    }
}
