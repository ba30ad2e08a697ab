//! GEMM launchers: cuBLAS SGEMM (TF32 tensor-op or plain FP32 math), the fp16
//! tensor-core path (cuBLAS GemmEx on f16 inputs, f32 accumulation and
//! output), and the tiled shared-memory kernel `gemm_fwd_f32` of
//! `kernels/gemm.cu`.
//!
//! Every product is row-major `C[m, n] = op(A)[m, k] op(B)[k, n]` ([`GemmSpec`]):
//! `op(A) = A` (`A` stored `[m, k]`) or `A^T` (`A` stored `[k, m]`), and
//! `op(B) = B` (`B` stored `[k, n]`) or `B^T` (`B` stored `[n, k]`). That one
//! form gives `C = A B`, `y = x W^T` ([`linear`]) and the backward
//! products `dA = dC B^T`, `dB = A^T dC`, `dx = dy W`, `dW = dy^T x`
//! ([`linear_backward`]).
//!
//! cuBLAS is column-major. A row-major `X[r, c]` is, read column-major, the
//! matrix `X^T` with leading dimension `c`, so we ask cuBLAS for
//! `C^T[n, m] = op(B)^T op(A)^T`: its first operand is our `B`, its second
//! our `A`, and the transpose flags carry over unchanged.

use std::sync::Arc;

use cudarc::cublas::sys::{cublasComputeType_t, cublasMath_t, cublasOperation_t, cudaDataType_t};
use cudarc::cublas::{result as blas_result, sys as blas_sys, CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use rand_chacha::ChaCha8Rng;

use super::parity::{
    case_rng, compare, uniform, widen, written, Arg, Case, Comparison, Signatures,
};
use crate::check::op::Pass;
use crate::check::params::Precision;
use crate::error::{Error, Result};
use crate::gpu::{GemmMath, GpuContext, GpuOptions};
use crate::mutant::Mutant;
use crate::reference;

/// The kernel module these launchers use.
pub const MODULE: &str = "gemm";

/// Kernel argument lists in the order the launchers push them, checked
/// against the compiled PTX by a unit test.
pub const SIGNATURES: Signatures = &[(
    "gemm_fwd_f32",
    &[
        Arg::Ptr,
        Arg::Ptr,
        Arg::Ptr,
        Arg::I32,
        Arg::I32,
        Arg::I32,
        Arg::I32,
        Arg::I32,
        Arg::I64,
    ],
)];

/// Side of the square tiles of `gemm_fwd_f32` (its `GEMM_TILE`).
pub const TILE: u32 = 16;

/// Which engine computes a GEMM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmEngine {
    /// cuBLAS SGEMM with this math mode.
    Cublas(GemmMath),
    /// cuBLAS GemmEx on f16 copies of `A` and `B` (rounded to nearest on the
    /// device by `cast_fwd_f32_f16`), f32 accumulation, f32 `C`.
    CublasF16,
    /// The tiled shared-memory kernel `gemm_fwd_f32` (plain f32 FMA).
    Tiled,
}

impl GemmEngine {
    /// The cuBLAS engine the context's options choose for `pass`.
    pub fn for_pass(options: &GpuOptions, pass: Pass) -> GemmEngine {
        match pass {
            Pass::Forward => GemmEngine::Cublas(options.forward_math),
            Pass::Backward => GemmEngine::Cublas(options.backward_math),
        }
    }
}

/// The shape of one row-major product `C[m, n] = op(A)[m, k] op(B)[k, n]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmSpec {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// `A` is stored `[k, m]` and used transposed.
    pub trans_a: bool,
    /// `B` is stored `[n, k]` and used transposed.
    pub trans_b: bool,
}

impl GemmSpec {
    /// `C = A B`.
    pub fn plain(m: usize, n: usize, k: usize) -> GemmSpec {
        GemmSpec {
            m,
            n,
            k,
            trans_a: false,
            trans_b: false,
        }
    }

    /// `y[rows, out] = x[rows, in] W^T`: `m = rows`, `n = out`, `k = in`, `W`
    /// (stored `[out, in]`) transposed.
    pub fn linear(rows: usize, in_dim: usize, out_dim: usize) -> GemmSpec {
        GemmSpec {
            trans_b: true,
            ..GemmSpec::plain(rows, out_dim, in_dim)
        }
    }

    /// `dx[rows, in] = dy[rows, out] W[out, in]`.
    pub fn linear_dx(rows: usize, in_dim: usize, out_dim: usize) -> GemmSpec {
        GemmSpec::plain(rows, in_dim, out_dim)
    }

    /// `dW[out, in] = dy^T x` (dy stored `[rows, out]`, i.e. `[k', m']`).
    pub fn linear_dw(rows: usize, in_dim: usize, out_dim: usize) -> GemmSpec {
        GemmSpec {
            trans_a: true,
            ..GemmSpec::plain(out_dim, in_dim, rows)
        }
    }

    /// The column-major cuBLAS call that computes this row-major product as
    /// `C^T = op(B)^T op(A)^T`, with `C = alpha op(A) op(B) + beta C`:
    /// cuBLAS's first operand is our `B`, stored `[k, n]` (ld n) or `[n, k]`
    /// (ld k); its second is our `A`, stored `[m, k]` (ld k) or `[k, m]` (ld m).
    pub(crate) fn cublas_config(&self, alpha: f32, beta: f32) -> Result<GemmConfig<f32>> {
        let m = crate::gpu::to_i32("gemm", "m", self.m)?;
        let n = crate::gpu::to_i32("gemm", "n", self.n)?;
        let k = crate::gpu::to_i32("gemm", "k", self.k)?;
        let op = |t: bool| {
            if t {
                cublasOperation_t::CUBLAS_OP_T
            } else {
                cublasOperation_t::CUBLAS_OP_N
            }
        };
        Ok(GemmConfig {
            transa: op(self.trans_b),
            transb: op(self.trans_a),
            m: n,
            n: m,
            k,
            alpha,
            lda: if self.trans_b { k } else { n },
            ldb: if self.trans_a { m } else { k },
            beta,
            ldc: n,
        })
    }

    /// Elements of `A`, `B` and `C`.
    pub fn lens(&self) -> (usize, usize, usize) {
        (self.m * self.k, self.k * self.n, self.m * self.n)
    }

    /// Refuses an empty product, or buffers of other lengths than [`GemmSpec::lens`].
    pub(crate) fn check(&self, a: usize, b: usize, c: usize) -> Result<()> {
        if self.m == 0 || self.n == 0 || self.k == 0 {
            return Err(Error::InvalidArgument {
                op: "gemm",
                message: format!("empty product m={} n={} k={}", self.m, self.n, self.k),
            });
        }
        let want = self.lens();
        if (a, b, c) != want {
            return Err(Error::ShapeMismatch {
                op: "gemm",
                expected: format!(
                    "a {}, b {}, c {} elements for {self:?}",
                    want.0, want.1, want.2
                ),
                got: format!("a {a}, b {b}, c {c}"),
            });
        }
        Ok(())
    }
}

/// `C = op(A) op(B)` on `engine`; overwrites every element of `c`.
pub fn gemm(
    gpu: &mut GpuContext,
    engine: GemmEngine,
    spec: GemmSpec,
    a: &CudaSlice<f32>,
    b: &CudaSlice<f32>,
    c: &mut CudaSlice<f32>,
) -> Result<()> {
    let len = c.len();
    gemm_limited(gpu, engine, spec, a, b, c, len)
}

/// `y[rows, out] = x[rows, in] W^T` with `W` stored `[out, in]`.
pub fn linear(
    gpu: &mut GpuContext,
    engine: GemmEngine,
    x: &CudaSlice<f32>,
    w: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    (rows, in_dim, out_dim): (usize, usize, usize),
) -> Result<()> {
    gemm(
        gpu,
        engine,
        GemmSpec::linear(rows, in_dim, out_dim),
        x,
        w,
        y,
    )
}

/// Gradients of `y = x W^T`: `dx[rows, in] = dy W`, `dW[out, in] = dy^T x`.
#[allow(clippy::too_many_arguments)]
pub fn linear_backward(
    gpu: &mut GpuContext,
    engine: GemmEngine,
    x: &CudaSlice<f32>,
    w: &CudaSlice<f32>,
    dy: &CudaSlice<f32>,
    dx: &mut CudaSlice<f32>,
    dw: &mut CudaSlice<f32>,
    (rows, in_dim, out_dim): (usize, usize, usize),
) -> Result<()> {
    gemm(
        gpu,
        engine,
        GemmSpec::linear_dx(rows, in_dim, out_dim),
        dy,
        w,
        dx,
    )?;
    gemm(
        gpu,
        engine,
        GemmSpec::linear_dw(rows, in_dim, out_dim),
        dy,
        x,
        dw,
    )
}

/// `dA[m, k] = dC[m, n] B^T` (B stored `[k, n]`, i.e. `[n', k']`) and
/// `dB[k, n] = A^T dC` (A stored `[m, k]`, i.e. `[k', m']`).
fn backward_specs(m: usize, n: usize, k: usize) -> (GemmSpec, GemmSpec) {
    let da = GemmSpec {
        trans_b: true,
        ..GemmSpec::plain(m, k, n)
    };
    let db = GemmSpec {
        trans_a: true,
        ..GemmSpec::plain(k, n, m)
    };
    (da, db)
}

/// [`gemm`] that stores only the first `write_limit` elements of `c` (in
/// row-major order); `write_limit < c.len()` exists for the
/// `LastElementUnwritten` fault injection. The tiled kernel skips the stores
/// itself; cuBLAS writes a scratch buffer of which only the allowed prefix is
/// copied into `c`.
pub(crate) fn gemm_limited(
    gpu: &mut GpuContext,
    engine: GemmEngine,
    spec: GemmSpec,
    a: &CudaSlice<f32>,
    b: &CudaSlice<f32>,
    c: &mut CudaSlice<f32>,
    write_limit: usize,
) -> Result<()> {
    spec.check(a.len(), b.len(), c.len())?;
    let limit = write_limit.min(c.len());
    match engine {
        GemmEngine::Tiled => launch_tiled(gpu, spec, a, b, c, limit),
        GemmEngine::Cublas(_) | GemmEngine::CublasF16 if limit == c.len() => {
            cublas_gemm(gpu, engine, spec, a, b, c)
        }
        GemmEngine::Cublas(_) | GemmEngine::CublasF16 => {
            let mut scratch = gpu.zeros::<f32>(c.len())?;
            cublas_gemm(gpu, engine, spec, a, b, &mut scratch)?;
            copy_prefix(gpu.stream(), &scratch, c, limit)
        }
    }
}

/// Copies `src[..len]` into `dst[..len]` on `stream`.
pub(crate) fn copy_prefix<T>(
    stream: &Arc<CudaStream>,
    src: &CudaSlice<T>,
    dst: &mut CudaSlice<T>,
    len: usize,
) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let (src_len, dst_len) = (src.len(), dst.len());
    let bad = || Error::InvalidArgument {
        op: "gemm",
        message: format!("prefix {len} exceeds a buffer of {src_len} / {dst_len}"),
    };
    let src_view = src.try_slice(0..len).ok_or_else(bad)?;
    let mut dst_view = dst.try_slice_mut(0..len).ok_or_else(bad)?;
    stream.memcpy_dtod(&src_view, &mut dst_view)?;
    Ok(())
}

fn launch_tiled(
    gpu: &mut GpuContext,
    spec: GemmSpec,
    a: &CudaSlice<f32>,
    b: &CudaSlice<f32>,
    c: &mut CudaSlice<f32>,
    write_limit: usize,
) -> Result<()> {
    let m = crate::gpu::to_i32("gemm", "m", spec.m)?;
    let n = crate::gpu::to_i32("gemm", "n", spec.n)?;
    let k = crate::gpu::to_i32("gemm", "k", spec.k)?;
    let grid_x = grid_dim("gemm", "n", spec.n.div_ceil(TILE as usize), u32::MAX >> 1)?;
    let grid_y = grid_dim("gemm", "m", spec.m.div_ceil(TILE as usize), 65_535)?;
    let trans_a = i32::from(spec.trans_a);
    let trans_b = i32::from(spec.trans_b);
    let limit = to_i64("gemm", write_limit)?;
    let cfg = LaunchConfig {
        grid_dim: (grid_x, grid_y, 1),
        block_dim: (TILE, TILE, 1),
        shared_mem_bytes: 0,
    };
    let func = gpu.function(MODULE, "gemm_fwd_f32")?;
    let stream = gpu.stream();
    let mut launch = stream.launch_builder(&func);
    launch
        .arg(a)
        .arg(b)
        .arg(c)
        .arg(&m)
        .arg(&n)
        .arg(&k)
        .arg(&trans_a)
        .arg(&trans_b)
        .arg(&limit);
    // SAFETY: arguments match `gemm_fwd_f32(const float* a, const float* b,
    // float* c, int m, int n, int k, int trans_a, int trans_b, long long
    // write_limit)` in order and type. `spec.check` proved a, b, c hold
    // exactly m*k, k*n and m*n f32 values, the kernel reads only indices
    // below those (its loads are guarded by row < m, col < n, p < k) and
    // stores only row*n + col < min(m*n, write_limit). The grid covers
    // ceil(n/16) x ceil(m/16) tiles of 16x16 threads, the block shape the
    // kernel's static shared tiles assume.
    unsafe { launch.launch(cfg) }?;
    Ok(())
}

/// Row-major product through cuBLAS (column-major): `C^T = op(B)^T op(A)^T`.
fn cublas_gemm(
    gpu: &mut GpuContext,
    engine: GemmEngine,
    spec: GemmSpec,
    a: &CudaSlice<f32>,
    b: &CudaSlice<f32>,
    c: &mut CudaSlice<f32>,
) -> Result<()> {
    let cfg = spec.cublas_config(1.0, 0.0)?;
    match engine {
        GemmEngine::Cublas(math) => {
            let blas = gpu.cublas();
            with_math_mode(blas, math, || {
                // SAFETY: `spec.check` proved a, b, c hold m*k, k*n, m*n f32
                // values; with the leading dimensions above cuBLAS reads
                // exactly those elements (column-major views of the row-major
                // buffers) and writes the n x m column-major C^T, which is the
                // m*n row-major C. beta = 0, so c's prior contents are unread.
                unsafe { blas.gemm(cfg, b, a, c) }?;
                Ok(())
            })
        }
        GemmEngine::CublasF16 => {
            let a16 = cast_to_f16(gpu, a)?;
            let b16 = cast_to_f16(gpu, b)?;
            gemm_ex_f16(gpu.cublas(), gpu.stream(), cfg, &b16, &a16, c)
        }
        GemmEngine::Tiled => Err(Error::InvalidArgument {
            op: "gemm",
            message: "the tiled kernel is not a cuBLAS engine".into(),
        }),
    }
}

/// Runs `f` with the handle's math mode set for `math`, then restores the
/// default mode whether `f` succeeded or not (the handle is shared).
pub(crate) fn with_math_mode(
    blas: &CudaBlas,
    math: GemmMath,
    f: impl FnOnce() -> Result<()>,
) -> Result<()> {
    let mode = match math {
        GemmMath::Tf32 => cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH,
        GemmMath::Fp32 => cublasMath_t::CUBLAS_DEFAULT_MATH,
    };
    // SAFETY: the handle is a live cuBLAS handle owned by the context;
    // cublasSetMathMode only changes a field of it.
    unsafe { blas_sys::cublasSetMathMode(*blas.handle(), mode) }.result()?;
    let outcome = f();
    // SAFETY: as above.
    let restored =
        unsafe { blas_sys::cublasSetMathMode(*blas.handle(), cublasMath_t::CUBLAS_DEFAULT_MATH) }
            .result();
    outcome?;
    restored?;
    Ok(())
}

/// `cublasGemmEx` with f16 `A`, `B` (our `B`, `A` in cuBLAS order, as raw
/// f16 bit patterns), f32 `C`, f32 compute.
fn gemm_ex_f16(
    blas: &CudaBlas,
    stream: &Arc<CudaStream>,
    cfg: GemmConfig<f32>,
    first: &CudaSlice<u16>,
    second: &CudaSlice<u16>,
    c: &mut CudaSlice<f32>,
) -> Result<()> {
    let alpha = cfg.alpha;
    let beta = cfg.beta;
    let (first_ptr, _first_sync) = first.device_ptr(stream);
    let (second_ptr, _second_sync) = second.device_ptr(stream);
    let (c_ptr, _c_sync) = c.device_ptr_mut(stream);
    // SAFETY: the handle is bound to `stream`, on which the pointers are
    // recorded. `first`/`second` hold the same element counts as the f32
    // operands `cublas_gemm` checked (cast element for element), so with the
    // same transposes and leading dimensions cuBLAS reads only valid f16
    // elements and writes exactly the m*n f32 elements of `c`. alpha and beta
    // are host f32 values (the default host pointer mode, f32 compute type).
    unsafe {
        blas_result::gemm_ex(
            *blas.handle(),
            cfg.transa,
            cfg.transb,
            cfg.m,
            cfg.n,
            cfg.k,
            (&alpha as *const f32).cast(),
            first_ptr as *const _,
            cudaDataType_t::CUDA_R_16F,
            cfg.lda,
            second_ptr as *const _,
            cudaDataType_t::CUDA_R_16F,
            cfg.ldb,
            (&beta as *const f32).cast(),
            c_ptr as *mut _,
            cudaDataType_t::CUDA_R_32F,
            cfg.ldc,
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
            blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }?;
    Ok(())
}

/// A device f16 copy (raw bit patterns) of `x`, rounded to nearest even.
fn cast_to_f16(gpu: &mut GpuContext, x: &CudaSlice<f32>) -> Result<CudaSlice<u16>> {
    let mut out = gpu.zeros::<u16>(x.len())?;
    super::cast::f32_to_f16(gpu, x, &mut out)?;
    Ok(out)
}

/// A grid dimension, refused when it exceeds the hardware limit `max`.
pub(crate) fn grid_dim(op: &'static str, what: &str, blocks: usize, max: u32) -> Result<u32> {
    match u32::try_from(blocks.max(1)) {
        Ok(b) if b <= max => Ok(b),
        _ => Err(Error::InvalidArgument {
            op,
            message: format!("{what} needs {blocks} blocks, more than the grid limit {max}"),
        }),
    }
}

/// `v` as the kernel's `long long`.
pub(crate) fn to_i64(op: &'static str, v: usize) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::InvalidArgument {
        op,
        message: format!("{v} does not fit a 64-bit signed length"),
    })
}

// ---- op_parity ---------------------------------------------------------------

/// `n` values uniform in `[-1, 1)`, as the f32 the device gets and as the f64
/// the reference gets (the same numbers).
pub(crate) fn random_inputs(rng: &mut ChaCha8Rng, n: usize) -> (Vec<f32>, Vec<f64>) {
    let v32 = uniform(rng, n, -1.0, 1.0);
    let v64 = widen(&v32);
    (v32, v64)
}

/// `x[rows, cols]` transposed to `[cols, rows]`.
fn transpose<T: Copy>(x: &[T], rows: usize, cols: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(x.len());
    for c in 0..cols {
        for r in 0..rows {
            out.push(x[r * cols + c]);
        }
    }
    out
}

/// The engines a precision is checked on: f32 runs cuBLAS FP32 and the tiled
/// kernel (both must agree with the reference), tf32 cuBLAS TF32 tensor ops,
/// f16 the GemmEx fp16 path.
fn engines(precision: Precision) -> Result<Vec<GemmEngine>> {
    match precision {
        Precision::F32 => Ok(vec![GemmEngine::Cublas(GemmMath::Fp32), GemmEngine::Tiled]),
        Precision::Tf32 => Ok(vec![GemmEngine::Cublas(GemmMath::Tf32)]),
        Precision::F16 => Ok(vec![GemmEngine::CublasF16]),
        Precision::Bf16 => Err(Error::InvalidArgument {
            op: "gemm",
            message: "there is no bf16 GEMM path".into(),
        }),
    }
}

/// Runs one product on a poisoned output and compares it with `reference`.
fn check_product(
    gpu: &mut GpuContext,
    engine: GemmEngine,
    spec: GemmSpec,
    (a, b): (&CudaSlice<f32>, &CudaSlice<f32>),
    reference: &[f64],
    mutant: Option<Mutant>,
) -> Result<Comparison> {
    let len = spec.m * spec.n;
    let mut out = gpu.poisoned(len)?;
    gemm_limited(gpu, engine, spec, a, b, &mut out, written(len, mutant))?;
    Ok(compare(&gpu.download(&out)?, reference))
}

/// `op_parity` for one shape `{m, n, k}`.
///
/// Forward: `C = A B` on each engine of the precision, both as the plain
/// product and as the linear form `A (B^T)^T` (W = B^T uploaded transposed),
/// against the reference `A B`. Backward: `dA = dC B^T`, `dB = A^T dC` and
/// the linear-form gradients `dx = dC W`, `dW = dC^T A` (which equal `dA` and
/// `dB^T`), against the reference backward.
pub fn parity(gpu: &mut GpuContext, case: &Case<'_>) -> Result<Comparison> {
    let (m, n, k) = (
        case.shape.dim("m"),
        case.shape.dim("n"),
        case.shape.dim("k"),
    );
    let engines = engines(case.precision)?;
    let mut rng = case_rng(case.seed);
    let (a32, a64) = random_inputs(&mut rng, m * k);
    let (b32, b64) = random_inputs(&mut rng, k * n);
    let a = gpu.upload(&a32)?;
    let b = gpu.upload(&b32)?;
    // W = B^T, stored [n, k]: the linear form y = A W^T is the same product.
    let w = gpu.upload(&transpose(&b32, k, n))?;
    let mut result: Option<Comparison> = None;
    let mut fold = |c: Comparison| {
        result = Some(match result.take() {
            Some(r) => r.merge(c),
            None => c,
        });
    };
    match case.pass {
        Pass::Forward => {
            let c_ref = reference::gemm::matmul(&a64, &b64, m, n, k)?;
            for &engine in &engines {
                let plain = GemmSpec::plain(m, n, k);
                fold(check_product(
                    gpu,
                    engine,
                    plain,
                    (&a, &b),
                    &c_ref,
                    case.mutant,
                )?);
                let lin = GemmSpec::linear(m, k, n);
                fold(check_product(
                    gpu,
                    engine,
                    lin,
                    (&a, &w),
                    &c_ref,
                    case.mutant,
                )?);
            }
        }
        Pass::Backward => {
            let (dc32, dc64) = random_inputs(&mut rng, m * n);
            let dc = gpu.upload(&dc32)?;
            let (da_ref, db_ref) = reference::gemm::backward(&a64, &b64, &dc64, m, n, k)?;
            let dw_ref = transpose(&db_ref, k, n);
            let (da_spec, db_spec) = backward_specs(m, n, k);
            let (dx_spec, dw_spec) = (GemmSpec::linear_dx(m, k, n), GemmSpec::linear_dw(m, k, n));
            for &engine in &engines {
                fold(check_product(
                    gpu,
                    engine,
                    da_spec,
                    (&dc, &b),
                    &da_ref,
                    case.mutant,
                )?);
                fold(check_product(
                    gpu,
                    engine,
                    db_spec,
                    (&a, &dc),
                    &db_ref,
                    case.mutant,
                )?);
                fold(check_product(
                    gpu,
                    engine,
                    dx_spec,
                    (&dc, &w),
                    &da_ref,
                    case.mutant,
                )?);
                fold(check_product(
                    gpu,
                    engine,
                    dw_spec,
                    (&dc, &a),
                    &dw_ref,
                    case.mutant,
                )?);
            }
        }
    }
    result.ok_or_else(|| Error::InvalidArgument {
        op: "gemm",
        message: "no engine ran".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The row-major product a [`GemmSpec`] describes, on the host in f64.
    fn host_gemm(spec: GemmSpec, a: &[f64], b: &[f64]) -> Vec<f64> {
        let GemmSpec {
            m,
            n,
            k,
            trans_a,
            trans_b,
        } = spec;
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                for p in 0..k {
                    let av = if trans_a { a[p * m + i] } else { a[i * k + p] };
                    let bv = if trans_b { b[j * k + p] } else { b[p * n + j] };
                    c[i * n + j] += av * bv;
                }
            }
        }
        c
    }

    /// The specs the launchers build give the reference's products, so the
    /// device only has to get `GemmSpec` right.
    #[test]
    fn specs_reproduce_the_reference_products() {
        let (m, n, k) = (3, 5, 4);
        let mut rng = case_rng(7);
        let (_, a) = random_inputs(&mut rng, m * k);
        let (_, b) = random_inputs(&mut rng, k * n);
        let (_, dc) = random_inputs(&mut rng, m * n);
        let w = transpose(&b, k, n);
        let close = |x: &[f64], y: &[f64]| x.iter().zip(y).all(|(p, q)| (p - q).abs() < 1e-12);

        let c = reference::gemm::matmul(&a, &b, m, n, k).unwrap();
        assert!(close(&host_gemm(GemmSpec::plain(m, n, k), &a, &b), &c));
        assert!(close(&host_gemm(GemmSpec::linear(m, k, n), &a, &w), &c));

        let (da, db) = reference::gemm::backward(&a, &b, &dc, m, n, k).unwrap();
        let (da_spec, db_spec) = backward_specs(m, n, k);
        assert!(close(&host_gemm(da_spec, &dc, &b), &da));
        assert!(close(&host_gemm(db_spec, &a, &dc), &db));

        let (dx, dw) = reference::gemm::linear_backward(&a, &w, &dc, m, k, n).unwrap();
        let (dx_spec, dw_spec) = (GemmSpec::linear_dx(m, k, n), GemmSpec::linear_dw(m, k, n));
        assert!(close(&host_gemm(dx_spec, &dc, &w), &dx));
        assert!(close(&host_gemm(dw_spec, &dc, &a), &dw));
        assert!(close(&dw, &transpose(&db, k, n)));
    }

    /// The cuBLAS call of `y = x W^T` is the one a direct SGEMM writes
    /// (gpu/throughput.rs `raw_linear`): `W^T` first, both with leading
    /// dimension `in`, `C^T` with `out`; alpha and beta pass through.
    #[test]
    fn the_linear_cublas_call_is_the_direct_sgemm() {
        let (rows, in_dim, out_dim) = (5usize, 7usize, 3usize);
        let cfg = GemmSpec::linear(rows, in_dim, out_dim)
            .cublas_config(0.5, 1.0)
            .unwrap();
        assert_eq!(cfg.transa, cublasOperation_t::CUBLAS_OP_T);
        assert_eq!(cfg.transb, cublasOperation_t::CUBLAS_OP_N);
        assert_eq!((cfg.m, cfg.n, cfg.k), (3, 5, 7));
        assert_eq!((cfg.lda, cfg.ldb, cfg.ldc), (7, 7, 3));
        assert_eq!((cfg.alpha, cfg.beta), (0.5, 1.0));
        // dW = dy^T x: our A (dy, [rows, out]) transposed is cuBLAS's second operand.
        let dw = GemmSpec::linear_dw(rows, in_dim, out_dim)
            .cublas_config(1.0, 0.0)
            .unwrap();
        assert_eq!(dw.transb, cublasOperation_t::CUBLAS_OP_T);
        assert_eq!((dw.m, dw.n, dw.k, dw.ldb), (7, 3, 5, 3));
        assert!(GemmSpec::plain(0, 1, 1).check(0, 1, 0).is_err());
    }
}
