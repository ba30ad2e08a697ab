//! Launchers for `kernels/activation.cu`: SiLU `y = x sigmoid(x)` and SwiGLU
//! `y = silu(gate) * up`, forward and backward. SwiGLU runs on f32, or for
//! the bf16 step on bf16 gate and up, writing the bf16 rounding of the f32
//! results (nearest, ties to even): there gate and up are the two halves of
//! each row of one `[rows, 2 cols]` matrix, as one GEMM of the stacked
//! `[Wg; Wu]` writes them, and the backward writes dgate and dup so.

use cudarc::driver::{CudaView, CudaViewMut, PushKernelArg};

use super::launch::expect_len;
use super::launch::{packed_launch, vec4_launch};
use crate::error::{Error, Result};
use crate::gpu::{to_i32, GpuContext};
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
            ("swiglu_fwd_bf16", &[Arg::Ptr, Arg::Ptr, Arg::I32, Arg::I32]),
            (
                "swiglu_bwd_bf16",
                &[Arg::Ptr, Arg::Ptr, Arg::Ptr, Arg::I32, Arg::I32],
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

/// `y = silu(gate) * up` in f32.
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
    // SAFETY: swiglu_fwd_f32(const float* gate, const float* up, float* y,
    // int n): all hold n >= n_i floats; y aliases neither input.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// `dgate = dy * up * silu'(gate)`, `dup = dy * silu(gate)` in f32.
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
    // SAFETY: swiglu_bwd_f32(const float* gate, const float* up,
    // const float* dy, float* dgate, float* dup, int n): all hold n >= n_i
    // floats; the two outputs are distinct mutable borrows and alias no
    // input.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// The rows `[gate | up]` of `gu` (`[rows, 2 cols]`) as `(n, cols)` with
/// `n = rows * cols`, refusing a `gu` that is not whole such rows.
fn halves(len: usize, cols: usize) -> Result<(usize, i32)> {
    if cols == 0 || !len.is_multiple_of(2 * cols) {
        return Err(Error::ShapeMismatch {
            op: "swiglu",
            expected: format!("gate | up of whole rows of 2 x {cols} values"),
            got: format!("{len} values"),
        });
    }
    Ok((len / 2, to_i32("swiglu", "cols", cols)?))
}

/// `y = silu(gate) * up` of the bf16 step: gate and up the halves of each
/// row of `gu` (`[rows, 2 cols]`, bf16), `y` `[rows, cols]` rounded to bf16.
pub fn swiglu_forward_bf16(
    gpu: &mut GpuContext,
    gu: &CudaView<'_, Bf16>,
    cols: usize,
    y: &mut CudaViewMut<'_, Bf16>,
) -> Result<()> {
    let (n, cols_i) = halves(gu.len(), cols)?;
    expect_len("swiglu", "y", y.len(), &[n])?;
    // Eight bf16 values a thread (the kernels' 16-byte way).
    let Some((n_i, cfg)) = packed_launch(gpu, "swiglu", n, 8)? else {
        return Ok(());
    };
    let f = gpu.function(SWIGLU_MODULE, "swiglu_fwd_bf16")?;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(gu).arg(y).arg(&n_i).arg(&cols_i);
    // SAFETY: swiglu_fwd_bf16(const unsigned short* gu, unsigned short* y,
    // int n, int cols): gu holds 2 n and y n >= n_i bf16 values, row k /
    // cols of gu at 2 cols each (checked whole above); y aliases no input.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// The backward of [`swiglu_forward_bf16`]: `dy` `[rows, cols]` as the
/// down projection's GEMM stored it (bf16), `dgu` `[rows, 2 cols]` the
/// bf16 rounding of `dgate | dup` in each row, for the one input-gradient
/// GEMM of `[Wg; Wu]`.
pub fn swiglu_backward_bf16(
    gpu: &mut GpuContext,
    gu: &CudaView<'_, Bf16>,
    cols: usize,
    dy: &CudaView<'_, Bf16>,
    dgu: &mut CudaViewMut<'_, Bf16>,
) -> Result<()> {
    let (n, cols_i) = halves(gu.len(), cols)?;
    expect_len("swiglu", "dy", dy.len(), &[n])?;
    expect_len("swiglu", "dgate | dup", dgu.len(), &[2 * n])?;
    // Eight bf16 values a thread (the kernels' 16-byte way).
    let Some((n_i, cfg)) = packed_launch(gpu, "swiglu", n, 8)? else {
        return Ok(());
    };
    let f = gpu.function(SWIGLU_MODULE, "swiglu_bwd_bf16")?;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(gu).arg(dy).arg(dgu).arg(&n_i).arg(&cols_i);
    // SAFETY: swiglu_bwd_bf16(const unsigned short* gu, const unsigned
    // short* dy, unsigned short* dgu, int n, int cols): gu and dgu hold 2 n,
    // dy n >= n_i bf16 values (checked above); dgu is a mutable borrow that
    // aliases no input.
    unsafe { l.launch(cfg) }?;
    Ok(())
}
