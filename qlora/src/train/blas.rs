//! Row-major cuBLAS products with `alpha` and `beta`, which the training step
//! needs and `ops::gemm` does not offer: `C = alpha op(A) op(B) + beta C`
//! lets the LoRA branch add `s (x A^T) B^T` onto the base projection and the
//! backward sum several input gradients into one buffer without extra passes.
//! Operands may be column blocks of a wider matrix ([`Mat`]): the fused q/k/v
//! projection writes one `[T, q + k + v + 2r]` output whose blocks the LoRA
//! products read and update in place.
//!
//! The shape checks, the mapping onto column-major cuBLAS and the math-mode
//! switch are those of [`crate::ops::gemm`] ([`GemmSpec::cublas_config`]).

use cudarc::cublas::Gemm;
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};

use crate::error::{Error, Result};
use crate::gpu::{GemmMath, GpuContext};
use crate::ops::cast::HalfFloat;
use crate::ops::gemm::{gemm_ex_half, with_math_mode, GemmOut, GemmSpec};

/// A row-major matrix inside a buffer: element `(i, j)` is at
/// `offset + i * ld + j`, so a column block of a wider row-major matrix is
/// `offset` = its first column, `ld` = the wider matrix's width.
#[derive(Clone, Copy)]
pub struct Mat<'a> {
    pub buf: &'a CudaSlice<f32>,
    pub offset: usize,
    pub ld: usize,
}

/// [`Mat`], written.
pub struct MatMut<'a> {
    pub buf: &'a mut CudaSlice<f32>,
    pub offset: usize,
    pub ld: usize,
}

impl<'a> Mat<'a> {
    /// The whole buffer as a packed matrix `cols` wide.
    pub fn packed(buf: &'a CudaSlice<f32>, cols: usize) -> Self {
        Mat {
            buf,
            offset: 0,
            ld: cols,
        }
    }
}

impl<'a> MatMut<'a> {
    /// The whole buffer as a packed matrix `cols` wide.
    pub fn packed(buf: &'a mut CudaSlice<f32>, cols: usize) -> Self {
        MatMut {
            buf,
            offset: 0,
            ld: cols,
        }
    }
}

/// Refuses a `[rows, cols]` block at `offset` with row stride `ld` that does
/// not fit in `len` elements (or whose rows overlap).
fn check_block(
    what: &str,
    (rows, cols): (usize, usize),
    offset: usize,
    ld: usize,
    len: usize,
) -> Result<()> {
    let end = offset + (rows.max(1) - 1) * ld + cols;
    if cols > ld || end > len {
        return Err(Error::ShapeMismatch {
            op: "gemm",
            expected: format!("{what}: a [{rows}, {cols}] block at {offset} with row stride {ld} (>= {cols}) within the buffer"),
            got: format!("{len} elements"),
        });
    }
    Ok(())
}

/// `C = alpha op(A) op(B) + beta C` on blocks of wider matrices (shapes as
/// in [`GemmSpec`]; `A` stored `[m, k]` or `[k, m]`, `B` `[k, n]` or `[n, k]`).
#[allow(clippy::too_many_arguments)]
pub fn gemm_blocks(
    gpu: &GpuContext,
    math: GemmMath,
    spec: GemmSpec,
    alpha: f32,
    a: Mat<'_>,
    b: Mat<'_>,
    beta: f32,
    c: MatMut<'_>,
) -> Result<()> {
    let (m, n, k) = (spec.m, spec.n, spec.k);
    if m == 0 || n == 0 || k == 0 {
        return Err(Error::InvalidArgument {
            op: "gemm",
            message: format!("empty product m={m} n={n} k={k}"),
        });
    }
    let a_shape = if spec.trans_a { (k, m) } else { (m, k) };
    let b_shape = if spec.trans_b { (n, k) } else { (k, n) };
    check_block("a", a_shape, a.offset, a.ld, a.buf.len())?;
    check_block("b", b_shape, b.offset, b.ld, b.buf.len())?;
    check_block("c", (m, n), c.offset, c.ld, c.buf.len())?;
    let mut cfg = spec.cublas_config(alpha, beta)?;
    // cuBLAS's first operand is our B, its second our A (see GemmSpec): the
    // leading dimension of each is the row stride of the row-major block.
    cfg.lda = crate::gpu::to_i32("gemm", "ld of b", b.ld)?;
    cfg.ldb = crate::gpu::to_i32("gemm", "ld of a", a.ld)?;
    cfg.ldc = crate::gpu::to_i32("gemm", "ld of c", c.ld)?;
    let blas = gpu.cublas()?;
    let (av, bv) = (a.buf.slice(a.offset..), b.buf.slice(b.offset..));
    let mut cv = c.buf.slice_mut(c.offset..);
    with_math_mode(blas, math, || {
        // SAFETY: check_block proved that every element cuBLAS addresses with
        // these leading dimensions (rows of `ld` floats from each view's
        // start, the last row `cols` long) lies inside its buffer; `c` is
        // borrowed mutably, so it aliases neither input.
        unsafe { blas.gemm(cfg, &bv, &av, &mut cv) }?;
        Ok(())
    })
}

/// `C = alpha op(A) op(B) + beta C` (row-major, packed, shapes as in [`GemmSpec`]).
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
    let a_cols = if spec.trans_a { spec.m } else { spec.k };
    let b_cols = if spec.trans_b { spec.k } else { spec.n };
    let n = spec.n;
    let (a, b) = (Mat::packed(a, a_cols), Mat::packed(b, b_cols));
    gemm_blocks(gpu, math, spec, alpha, a, b, beta, MatMut::packed(c, n))
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

/// `C = alpha op(A) op(B) + beta C` ([`GemmSpec`]) with 16-bit operands
/// (raw bits of f16 or bf16) and a `C` of f32 or bf16 ([`GemmOut`]), f32
/// accumulation. The products of f16 values are those of TF32's 11-bit
/// significands; bf16 keeps 8 significant bits and f32's exponent range.
/// Hopper's 16-bit tensor-core instructions run at twice TF32's rate and
/// take either operand layout.
#[allow(clippy::too_many_arguments)]
pub fn gemm_half<H: HalfFloat, C: GemmOut>(
    gpu: &GpuContext,
    spec: GemmSpec,
    alpha: f32,
    a: &impl DevicePtr<H>,
    b: &impl DevicePtr<H>,
    beta: f32,
    c: &mut impl DevicePtrMut<C>,
) -> Result<()> {
    spec.check(a.len(), b.len(), c.len())?;
    let cfg = spec.cublas_config(alpha, beta)?;
    // cuBLAS's first operand is our B, its second our A (see GemmSpec).
    gemm_ex_half(gpu, cfg, b, a, c)
}
