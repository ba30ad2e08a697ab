//! Row-major cuBLAS products with `alpha` and `beta`, which the training step
//! needs and `ops::gemm` does not offer: `C = alpha op(A) op(B) + beta C`
//! lets the LoRA branch add `s (x A^T) B^T` onto the base projection and the
//! backward sum several input gradients into one buffer without extra passes.
//!
//! The mapping onto column-major cuBLAS is the one of [`crate::ops::gemm`]:
//! we ask for `C^T = op(B)^T op(A)^T`.

use cudarc::cublas::sys::{self as blas_sys, cublasMath_t, cublasOperation_t};
use cudarc::cublas::{Gemm, GemmConfig};
use cudarc::driver::CudaSlice;

use crate::error::{Error, Result};
use crate::gpu::{to_i32, GemmMath, GpuContext};
use crate::ops::gemm::GemmSpec;

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
    let want = spec.lens();
    if spec.m == 0 || spec.n == 0 || spec.k == 0 || (a.len(), b.len(), c.len()) != want {
        return Err(Error::ShapeMismatch {
            op: "train gemm",
            expected: format!(
                "a {}, b {}, c {} elements for {spec:?}",
                want.0, want.1, want.2
            ),
            got: format!("a {}, b {}, c {}", a.len(), b.len(), c.len()),
        });
    }
    let m = to_i32("train gemm", "m", spec.m)?;
    let n = to_i32("train gemm", "n", spec.n)?;
    let k = to_i32("train gemm", "k", spec.k)?;
    let op = |t: bool| {
        if t {
            cublasOperation_t::CUBLAS_OP_T
        } else {
            cublasOperation_t::CUBLAS_OP_N
        }
    };
    let cfg = GemmConfig {
        transa: op(spec.trans_b),
        transb: op(spec.trans_a),
        m: n,
        n: m,
        k,
        alpha,
        lda: if spec.trans_b { k } else { n },
        ldb: if spec.trans_a { m } else { k },
        beta,
        ldc: n,
    };
    let blas = gpu.cublas();
    let mode = match math {
        GemmMath::Tf32 => cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH,
        GemmMath::Fp32 => cublasMath_t::CUBLAS_DEFAULT_MATH,
    };
    // SAFETY: the handle is the context's live cuBLAS handle; setting the
    // math mode only changes a field of it (restored below).
    unsafe { blas_sys::cublasSetMathMode(*blas.handle(), mode) }.result()?;
    // SAFETY: the lengths were checked against the spec above, so with these
    // leading dimensions cuBLAS reads only the m*k, k*n elements of a, b and
    // reads/writes exactly the m*n elements of c (column-major C^T).
    let outcome = unsafe { blas.gemm(cfg, b, a, c) };
    // SAFETY: as above; the shared handle goes back to the default mode.
    let restored =
        unsafe { blas_sys::cublasSetMathMode(*blas.handle(), cublasMath_t::CUBLAS_DEFAULT_MATH) }
            .result();
    outcome?;
    restored?;
    Ok(())
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
    let spec = GemmSpec {
        trans_b: true,
        ..GemmSpec::plain(rows, out_dim, in_dim)
    };
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
    gemm(
        gpu,
        math,
        GemmSpec::plain(rows, in_dim, out_dim),
        alpha,
        dy,
        w,
        beta,
        dx,
    )
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
    let spec = GemmSpec {
        trans_a: true,
        ..GemmSpec::plain(out_dim, in_dim, rows)
    };
    gemm(gpu, math, spec, alpha, dy, x, 0.0, dw)
}
