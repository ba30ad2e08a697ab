//! Row-major cuBLAS products with `alpha` and `beta`, which the training step
//! needs and `ops::gemm` does not offer: `C = alpha op(A) op(B) + beta C`
//! lets the LoRA branch add `s (x A^T) B^T` onto the base projection and the
//! backward sum several input gradients into one buffer without extra passes.
//!
//! The shape checks, the mapping onto column-major cuBLAS and the math-mode
//! switch are those of [`crate::ops::gemm`] ([`GemmSpec::cublas_config`]).

use cudarc::cublas::Gemm;
use cudarc::driver::CudaSlice;

use crate::error::Result;
use crate::gpu::{GemmMath, GpuContext};
use crate::ops::gemm::{with_math_mode, GemmSpec};

/// `C = alpha op(A) op(B) + beta C` (row-major, shapes as in [`GemmSpec`]).
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    gpu: &GpuContext,
    math: GemmMath,
    spec: GemmSpec,
    alpha: f32,
    a: &CudaSlice<f32>,
    b: &CudaSlice<f32>,
    beta: f32,
    c: &mut CudaSlice<f32>,
) -> Result<()> {
    spec.check(a.len(), b.len(), c.len())?;
    let cfg = spec.cublas_config(alpha, beta)?;
    let blas = gpu.cublas();
    with_math_mode(blas, math, || {
        // SAFETY: the lengths were checked against the spec above, so with
        // these leading dimensions cuBLAS reads only the m*k, k*n elements of
        // a, b and reads/writes exactly the m*n elements of c (column-major C^T).
        unsafe { blas.gemm(cfg, b, a, c) }?;
        Ok(())
    })
}

/// `y[rows, out] = alpha x[rows, in] W^T + beta y`, `W` stored `[out, in]`.
#[allow(clippy::too_many_arguments)]
pub fn linear(
    gpu: &GpuContext,
    math: GemmMath,
    alpha: f32,
    x: &CudaSlice<f32>,
    w: &CudaSlice<f32>,
    beta: f32,
    y: &mut CudaSlice<f32>,
    (rows, in_dim, out_dim): (usize, usize, usize),
) -> Result<()> {
    let spec = GemmSpec::linear(rows, in_dim, out_dim);
    gemm(gpu, math, spec, alpha, x, w, beta, y)
}

/// `dx[rows, in] = alpha dy[rows, out] W + beta dx`, `W` stored `[out, in]`.
#[allow(clippy::too_many_arguments)]
pub fn linear_dx(
    gpu: &GpuContext,
    math: GemmMath,
    alpha: f32,
    dy: &CudaSlice<f32>,
    w: &CudaSlice<f32>,
    beta: f32,
    dx: &mut CudaSlice<f32>,
    (rows, in_dim, out_dim): (usize, usize, usize),
) -> Result<()> {
    let spec = GemmSpec::linear_dx(rows, in_dim, out_dim);
    gemm(gpu, math, spec, alpha, dy, w, beta, dx)
}

/// `dW[out, in] = alpha dy^T x` (overwritten), `dy` `[rows, out]`, `x` `[rows, in]`.
#[allow(clippy::too_many_arguments)]
pub fn linear_dw(
    gpu: &GpuContext,
    math: GemmMath,
    alpha: f32,
    dy: &CudaSlice<f32>,
    x: &CudaSlice<f32>,
    dw: &mut CudaSlice<f32>,
    (rows, in_dim, out_dim): (usize, usize, usize),
) -> Result<()> {
    let spec = GemmSpec::linear_dw(rows, in_dim, out_dim);
    gemm(gpu, math, spec, alpha, dy, x, 0.0, dw)
}
