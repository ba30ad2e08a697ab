//! Launchers for `kernels/activation.cu`: SiLU `y = x sigmoid(x)` and SwiGLU
//! `y = silu(gate) * up`, forward and backward. SwiGLU writes f32, or for a
//! bf16 GEMM that reads its output next, the bf16 rounding of the same f32
//! result (nearest, ties to even; [`SwigluOut`]).

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
            (
                "swiglu_fwd_f32_bf16",
                &[Arg::Ptr, Arg::Ptr, Arg::Ptr, Arg::I32],
            ),
            (
                "swiglu_bwd_f32_bf16",
                &[Arg::Ptr, Arg::Ptr, Arg::Ptr, Arg::Ptr, Arg::Ptr, Arg::I32],
            ),
        ],
    ),
];

/// The element SwiGLU writes: `f32`, or [`Bf16`] (the f32 result rounded
/// once at the store, as a cast kernel after it would round it).
pub trait SwigluOut: DeviceRepr {
    /// The forward kernel writing this element.
    const FORWARD: &'static str;
    /// The backward kernel writing this element.
    const BACKWARD: &'static str;
}

impl SwigluOut for f32 {
    const FORWARD: &'static str = "swiglu_fwd_f32";
    const BACKWARD: &'static str = "swiglu_bwd_f32";
}

impl SwigluOut for Bf16 {
    const FORWARD: &'static str = "swiglu_fwd_f32_bf16";
    const BACKWARD: &'static str = "swiglu_bwd_f32_bf16";
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

/// `y = silu(gate) * up`, in f32 or rounded to bf16 (`Y`).
pub fn swiglu_forward<Y: SwigluOut>(
    gpu: &mut GpuContext,
    gate: &CudaView<'_, f32>,
    up: &CudaView<'_, f32>,
    y: &mut CudaViewMut<'_, Y>,
) -> Result<()> {
    let n = gate.len();
    expect_len("swiglu", "up", up.len(), &[n])?;
    expect_len("swiglu", "y", y.len(), &[n])?;
    let Some((n_i, cfg)) = vec4_launch(gpu, "swiglu", n)? else {
        return Ok(());
    };
    let f = gpu.function(SWIGLU_MODULE, Y::FORWARD)?;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(gate).arg(up).arg(y).arg(&n_i);
    // SAFETY: swiglu_fwd_f32{,_bf16}(const float* gate, const float* up, Y* y,
    // int n), Y float or unsigned short as `Y`: all hold n >= n_i elements;
    // y aliases neither input.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// `dgate = dy * up * silu'(gate)`, `dup = dy * silu(gate)`, in f32 or
/// rounded to bf16 (`Y`).
pub fn swiglu_backward<Y: SwigluOut>(
    gpu: &mut GpuContext,
    gate: &CudaView<'_, f32>,
    up: &CudaView<'_, f32>,
    dy: &CudaView<'_, f32>,
    dgate: &mut CudaViewMut<'_, Y>,
    dup: &mut CudaViewMut<'_, Y>,
) -> Result<()> {
    let n = gate.len();
    expect_len("swiglu", "up", up.len(), &[n])?;
    expect_len("swiglu", "dy", dy.len(), &[n])?;
    expect_len("swiglu", "dgate", dgate.len(), &[n])?;
    expect_len("swiglu", "dup", dup.len(), &[n])?;
    let Some((n_i, cfg)) = vec4_launch(gpu, "swiglu", n)? else {
        return Ok(());
    };
    let f = gpu.function(SWIGLU_MODULE, Y::BACKWARD)?;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(gate).arg(up).arg(dy).arg(dgate).arg(dup).arg(&n_i);
    // SAFETY: swiglu_bwd_f32{,_bf16}(const float* gate, const float* up,
    // const float* dy, Y* dgate, Y* dup, int n), Y float or unsigned short as
    // `Y`: all hold n >= n_i elements; the two outputs are distinct mutable
    // borrows and alias no input.
    unsafe { l.launch(cfg) }?;
    Ok(())
}
