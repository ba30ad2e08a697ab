//! Launchers for `kernels/activation.cu`: SiLU `y = x sigmoid(x)` and SwiGLU
//! `y = silu(gate) * up`, forward and backward.

use cudarc::driver::{CudaView, CudaViewMut, PushKernelArg};

use super::launch::expect_len;
use super::launch::vec4_launch;
use crate::error::Result;
use crate::gpu::GpuContext;
use crate::kernels::abi::{Arg, Signatures};

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
        ],
    ),
];

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

/// `y = silu(gate) * up`.
pub fn swiglu_forward(
    gpu: &mut GpuContext,
    gate: &CudaView<'_, f32>,
    up: &CudaView<'_, f32>,
    y: &mut CudaViewMut<'_, f32>,
) -> Result<()> {
    let n = gate.len();
    expect_len("swiglu", "up", up.len(), &[n])?;
    expect_len("swiglu", "y", y.len(), &[n])?;
    let Some((n_i, cfg)) = vec4_launch(gpu, "swiglu", n)? else {
        return Ok(());
    };
    let f = gpu.function(SWIGLU_MODULE, "swiglu_fwd_f32")?;
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
) -> Result<()> {
    let n = gate.len();
    expect_len("swiglu", "up", up.len(), &[n])?;
    expect_len("swiglu", "dy", dy.len(), &[n])?;
    expect_len("swiglu", "dgate", dgate.len(), &[n])?;
    expect_len("swiglu", "dup", dup.len(), &[n])?;
    let Some((n_i, cfg)) = vec4_launch(gpu, "swiglu", n)? else {
        return Ok(());
    };
    let f = gpu.function(SWIGLU_MODULE, "swiglu_bwd_f32")?;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(gate).arg(up).arg(dy).arg(dgate).arg(dup).arg(&n_i);
    // SAFETY: swiglu_bwd_f32(const float* gate, const float* up, const float* dy,
    // float* dgate, float* dup, int n): all hold n >= n_i elements; the two
    // outputs are distinct mutable borrows and alias no input.
    unsafe { l.launch(cfg) }?;
    Ok(())
}
