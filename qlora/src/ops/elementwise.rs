//! Launchers for `kernels/elementwise.cu`: residual add `y = a + b` (backward
//! `da = db = dy`) and scale `y = s x` (backward `dx = s dy`).

use cudarc::driver::{CudaView, CudaViewMut, PushKernelArg};

use super::launch::expect_len;
use super::launch::vec4_launch;
use crate::error::Result;
use crate::gpu::GpuContext;
use crate::kernels::abi::{Arg, Signatures};

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
) -> Result<()> {
    let n = a.len();
    expect_len("residual_add", "b", b.len(), &[n])?;
    expect_len("residual_add", "y", y.len(), &[n])?;
    let Some((n_i, cfg)) = vec4_launch(gpu, "residual_add", n)? else {
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
) -> Result<()> {
    let n = dy.len();
    expect_len("residual_add", "da", da.len(), &[n])?;
    expect_len("residual_add", "db", db.len(), &[n])?;
    let Some((n_i, cfg)) = vec4_launch(gpu, "residual_add", n)? else {
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
) -> Result<()> {
    launch_scale(gpu, "scale_fwd_f32", x, s, y)
}

/// `dx = s dy`.
pub fn scale_backward(
    gpu: &mut GpuContext,
    dy: &CudaView<'_, f32>,
    s: f64,
    dx: &mut CudaViewMut<'_, f32>,
) -> Result<()> {
    launch_scale(gpu, "scale_bwd_f32", dy, s, dx)
}

fn launch_scale(
    gpu: &mut GpuContext,
    symbol: &str,
    x: &CudaView<'_, f32>,
    s: f64,
    y: &mut CudaViewMut<'_, f32>,
) -> Result<()> {
    let n = x.len();
    expect_len("scale", "output", y.len(), &[n])?;
    let Some((n_i, cfg)) = vec4_launch(gpu, "scale", n)? else {
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
