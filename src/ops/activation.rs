//! Launchers for `kernels/activation.cu`: SiLU `y = x sigmoid(x)` and SwiGLU
//! `y = silu(gate) * up`, forward and backward.

use cudarc::driver::{CudaView, CudaViewMut, PushKernelArg};

use super::parity::{
    case_rng, compare, uniform, vec4_launch, widen, Arg, Case, Comparison, Signatures,
};
use crate::check::op::{Op, Pass};
use crate::error::Result;
use crate::gpu::GpuContext;
use crate::mutant::Mutant;
use crate::reference::activation as refop;
use crate::reference::elementwise::expect_len;

pub const MODULE: &str = "activation";

/// Kernel argument lists, checked against the compiled PTX by a unit test.
pub const SIGNATURES: Signatures = &[
    ("silu_fwd_f32", &[Arg::Ptr, Arg::Ptr, Arg::I32]),
    ("silu_bwd_f32", &[Arg::Ptr, Arg::Ptr, Arg::Ptr, Arg::I32]),
    ("swiglu_fwd_f32", &[Arg::Ptr, Arg::Ptr, Arg::Ptr, Arg::I32]),
    (
        "swiglu_bwd_f32",
        &[Arg::Ptr, Arg::Ptr, Arg::Ptr, Arg::Ptr, Arg::Ptr, Arg::I32],
    ),
];

/// `y = silu(x)`.
pub fn silu_forward(
    gpu: &mut GpuContext,
    x: &CudaView<'_, f32>,
    y: &mut CudaViewMut<'_, f32>,
    fault: Option<Mutant>,
) -> Result<()> {
    let n = x.len();
    expect_len("silu", "y", y.len(), &[n])?;
    let Some((n_i, cfg)) = vec4_launch(gpu, "silu", n, fault)? else {
        return Ok(());
    };
    let f = gpu.function(MODULE, "silu_fwd_f32")?;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(x).arg(y).arg(&n_i);
    // SAFETY: silu_fwd_f32(const float* x, float* y, int n): x and y hold
    // n >= n_i elements and do not alias.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// `dx = silu'(x) dy`.
pub fn silu_backward(
    gpu: &mut GpuContext,
    x: &CudaView<'_, f32>,
    dy: &CudaView<'_, f32>,
    dx: &mut CudaViewMut<'_, f32>,
    fault: Option<Mutant>,
) -> Result<()> {
    let n = x.len();
    expect_len("silu", "dy", dy.len(), &[n])?;
    expect_len("silu", "dx", dx.len(), &[n])?;
    let Some((n_i, cfg)) = vec4_launch(gpu, "silu", n, fault)? else {
        return Ok(());
    };
    let f = gpu.function(MODULE, "silu_bwd_f32")?;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(x).arg(dy).arg(dx).arg(&n_i);
    // SAFETY: silu_bwd_f32(const float* x, const float* dy, float* dx, int n):
    // all hold n >= n_i elements; dx aliases neither input.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// `y = silu(gate) * up`.
pub fn swiglu_forward(
    gpu: &mut GpuContext,
    gate: &CudaView<'_, f32>,
    up: &CudaView<'_, f32>,
    y: &mut CudaViewMut<'_, f32>,
    fault: Option<Mutant>,
) -> Result<()> {
    let n = gate.len();
    expect_len("swiglu", "up", up.len(), &[n])?;
    expect_len("swiglu", "y", y.len(), &[n])?;
    let Some((n_i, cfg)) = vec4_launch(gpu, "swiglu", n, fault)? else {
        return Ok(());
    };
    let f = gpu.function(MODULE, "swiglu_fwd_f32")?;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(gate).arg(up).arg(y).arg(&n_i);
    // SAFETY: swiglu_fwd_f32(const float* gate, const float* up, float* y, int n):
    // all hold n >= n_i elements; y aliases neither input.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// `dgate = dy * up * silu'(gate)`, `dup = dy * silu(gate)`.
pub fn swiglu_backward(
    gpu: &mut GpuContext,
    gate: &CudaView<'_, f32>,
    up: &CudaView<'_, f32>,
    dy: &CudaView<'_, f32>,
    dgate: &mut CudaViewMut<'_, f32>,
    dup: &mut CudaViewMut<'_, f32>,
    fault: Option<Mutant>,
) -> Result<()> {
    let n = gate.len();
    expect_len("swiglu", "up", up.len(), &[n])?;
    expect_len("swiglu", "dy", dy.len(), &[n])?;
    expect_len("swiglu", "dgate", dgate.len(), &[n])?;
    expect_len("swiglu", "dup", dup.len(), &[n])?;
    let Some((n_i, cfg)) = vec4_launch(gpu, "swiglu", n, fault)? else {
        return Ok(());
    };
    let f = gpu.function(MODULE, "swiglu_bwd_f32")?;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(gate).arg(up).arg(dy).arg(dgate).arg(dup).arg(&n_i);
    // SAFETY: swiglu_bwd_f32(const float* gate, const float* up, const float* dy,
    // float* dgate, float* dup, int n): all hold n >= n_i elements; the two
    // outputs are distinct mutable borrows and alias no input.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// `op_parity` of SiLU or SwiGLU for one `{rows, cols}` shape. Inputs span
/// [-8, 8], covering both saturated tails of the sigmoid.
pub fn parity(op: Op, gpu: &mut GpuContext, case: &Case<'_>) -> Result<Comparison> {
    let n = case.shape.dim("rows") * case.shape.dim("cols");
    let mut rng = case_rng(case.seed);
    let fault = case.mutant;
    let x = uniform(&mut rng, n, -8.0, 8.0);
    let dx_in = gpu.upload(&x)?;
    match (op, case.pass) {
        (Op::Silu, Pass::Forward) => {
            let want = refop::silu_forward(&widen(&x));
            let mut y = gpu.poisoned(n)?;
            silu_forward(gpu, &dx_in.as_view(), &mut y.as_view_mut(), fault)?;
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
                fault,
            )?;
            Ok(compare(&gpu.download(&dx)?, &want))
        }
        (_, Pass::Forward) => {
            let up = uniform(&mut rng, n, -2.0, 2.0);
            let want = refop::swiglu_forward(&widen(&x), &widen(&up))?;
            let d_up = gpu.upload(&up)?;
            let mut y = gpu.poisoned(n)?;
            swiglu_forward(
                gpu,
                &dx_in.as_view(),
                &d_up.as_view(),
                &mut y.as_view_mut(),
                fault,
            )?;
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
                fault,
            )?;
            let cg = compare(&gpu.download(&dgate)?, &want_g);
            let cu = compare(&gpu.download(&dup)?, &want_u);
            Ok(cg.merge(cu))
        }
    }
}
