//! Launchers for `kernels/activation.cu`: SiLU `y = x sigmoid(x)` and SwiGLU
//! `y = silu(gate) * up`, forward and backward. SwiGLU runs on f32, or for
//! the bf16 step on bf16 gate and up, writing the bf16 rounding of the f32
//! results (nearest, ties to even; [`SwigluKernels`]).

use cudarc::driver::{CudaView, CudaViewMut, DeviceRepr, PushKernelArg};

use super::launch::expect_len;
use super::launch::vec4_launch;
use crate::error::Result;
use crate::gpu::GpuContext;
use crate::kernels::abi::{Arg, Signatures};
use crate::ops::cast::Bf16;

/// The module of the SwiGLU kernels, which the training step runs.
pub const SWIGLU_MODULE: &str = "swiglu";
/// The module of the SiLU kernels.
pub const SILU_MODULE: &str = "silu";

/// Kernel argument lists by module, checked against the compiled PTX by a
/// unit test.
pub const SIGNATURES: &[(&str, Signatures)] = &[
    (
        SILU_MODULE,
        &[
            ("silu_fwd_f32", &[Arg::Ptr, Arg::Ptr, Arg::I32]),
            ("silu_bwd_f32", &[Arg::Ptr, Arg::Ptr, Arg::Ptr, Arg::I32]),
        ],
    ),
    (
        SWIGLU_MODULE,
        &[
            ("swiglu_fwd_f32", &[Arg::Ptr, Arg::Ptr, Arg::Ptr, Arg::I32]),
            (
                "swiglu_bwd_f32",
                &[Arg::Ptr, Arg::Ptr, Arg::Ptr, Arg::Ptr, Arg::Ptr, Arg::I32],
            ),
            ("swiglu_fwd_bf16", &[Arg::Ptr, Arg::Ptr, Arg::Ptr, Arg::I32]),
            (
                "swiglu_bwd_bf16",
                &[Arg::Ptr, Arg::Ptr, Arg::Ptr, Arg::Ptr, Arg::Ptr, Arg::I32],
            ),
        ],
    ),
];

/// The elements SwiGLU reads (`gate`, `up` and the backward's `dy`: `X`)
/// and writes (`Y`): f32 to f32, and [`Bf16`] to bf16 for the bf16 step,
/// which reads gate, up and dy as its bf16 GEMMs stored them and writes the
/// results rounded once at the store for the bf16 GEMMs that read them
/// next. The arithmetic is f32 in both.
pub trait SwigluKernels {
    /// The forward kernel.
    const FORWARD: &'static str;
    /// The backward kernel.
    const BACKWARD: &'static str;
}

impl SwigluKernels for (f32, f32) {
    const FORWARD: &'static str = "swiglu_fwd_f32";
    const BACKWARD: &'static str = "swiglu_bwd_f32";
}

impl SwigluKernels for (Bf16, Bf16) {
    const FORWARD: &'static str = "swiglu_fwd_bf16";
    const BACKWARD: &'static str = "swiglu_bwd_bf16";
}

/// `y = silu(x)`.
pub fn silu_forward(
    gpu: &mut GpuContext,
    x: &CudaView<'_, f32>,
    y: &mut CudaViewMut<'_, f32>,
) -> Result<()> {
    let n = x.len();
    expect_len("silu", "y", y.len(), &[n])?;
    let Some((n_i, cfg)) = vec4_launch(gpu, "silu", n)? else {
        return Ok(());
    };
    let f = gpu.function(SILU_MODULE, "silu_fwd_f32")?;
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
) -> Result<()> {
    let n = x.len();
    expect_len("silu", "dy", dy.len(), &[n])?;
    expect_len("silu", "dx", dx.len(), &[n])?;
    let Some((n_i, cfg)) = vec4_launch(gpu, "silu", n)? else {
        return Ok(());
    };
    let f = gpu.function(SILU_MODULE, "silu_bwd_f32")?;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(x).arg(dy).arg(dx).arg(&n_i);
    // SAFETY: silu_bwd_f32(const float* x, const float* dy, float* dx, int n):
    // all hold n >= n_i elements; dx aliases neither input.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// `y = silu(gate) * up`, from `X` into `Y` ([`SwigluKernels`]).
pub fn swiglu_forward<X: DeviceRepr, Y: DeviceRepr>(
    gpu: &mut GpuContext,
    gate: &CudaView<'_, X>,
    up: &CudaView<'_, X>,
    y: &mut CudaViewMut<'_, Y>,
) -> Result<()>
where
    (X, Y): SwigluKernels,
{
    let n = gate.len();
    expect_len("swiglu", "up", up.len(), &[n])?;
    expect_len("swiglu", "y", y.len(), &[n])?;
    let Some((n_i, cfg)) = vec4_launch(gpu, "swiglu", n)? else {
        return Ok(());
    };
    let f = gpu.function(SWIGLU_MODULE, <(X, Y)>::FORWARD)?;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(gate).arg(up).arg(y).arg(&n_i);
    // SAFETY: swiglu_fwd_{f32,bf16}(const X* gate, const X* up, Y*
    // y, int n), X and Y float or unsigned short as `X` and `Y` (the kernel
    // `(X, Y)` names): all hold n >= n_i elements; y aliases neither input.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// `dgate = dy * up * silu'(gate)`, `dup = dy * silu(gate)`, in f32 or
/// rounded to bf16 (`Y`).
pub fn swiglu_backward<X: DeviceRepr, Y: DeviceRepr>(
    gpu: &mut GpuContext,
    gate: &CudaView<'_, X>,
    up: &CudaView<'_, X>,
    dy: &CudaView<'_, X>,
    dgate: &mut CudaViewMut<'_, Y>,
    dup: &mut CudaViewMut<'_, Y>,
) -> Result<()>
where
    (X, Y): SwigluKernels,
{
    let n = gate.len();
    expect_len("swiglu", "up", up.len(), &[n])?;
    expect_len("swiglu", "dy", dy.len(), &[n])?;
    expect_len("swiglu", "dgate", dgate.len(), &[n])?;
    expect_len("swiglu", "dup", dup.len(), &[n])?;
    let Some((n_i, cfg)) = vec4_launch(gpu, "swiglu", n)? else {
        return Ok(());
    };
    let f = gpu.function(SWIGLU_MODULE, <(X, Y)>::BACKWARD)?;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(gate).arg(up).arg(dy).arg(dgate).arg(dup).arg(&n_i);
    // SAFETY: swiglu_bwd_{f32,bf16}(const X* gate, const X* up,
    // const X* dy, Y* dgate, Y* dup, int n), X and Y float or unsigned
    // short as `X` and `Y` (the kernel `(X, Y)` names): all hold n >= n_i
    // elements; the two outputs are distinct mutable borrows and alias no
    // input.
    unsafe { l.launch(cfg) }?;
    Ok(())
}
