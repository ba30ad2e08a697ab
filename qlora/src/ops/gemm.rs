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

use super::cast::{Bf16, HalfFloat};
use super::launch::expect_len;
use crate::error::{Error, Result};
use crate::gpu::{to_i32, Direction, GemmMath, GpuContext, GpuOptions};
use crate::kernels::abi::{Arg, Signatures};

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
    /// cuBLAS GemmEx on bf16 copies of `A` and `B` (`cast_fwd_f32_bf16`),
    /// f32 accumulation, f32 `C`.
    CublasBf16,
    /// The tiled shared-memory kernel `gemm_fwd_f32` (plain f32 FMA).
    Tiled,
}

impl GemmEngine {
    /// The cuBLAS engine the context's options choose for `direction`.
    pub fn for_direction(options: &GpuOptions, direction: Direction) -> GemmEngine {
        GemmEngine::Cublas(options.math(direction))
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

/// `C = op(A) op(B)` on `engine`; overwrites every element of `c` (all but
/// the last under [`crate::Faults::last_element_unwritten`]).
pub fn gemm(
    gpu: &mut GpuContext,
    engine: GemmEngine,
    spec: GemmSpec,
    a: &CudaSlice<f32>,
    b: &CudaSlice<f32>,
    c: &mut CudaSlice<f32>,
) -> Result<()> {
    let len = gpu.faults().written(c.len());
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
        GemmEngine::Cublas(_) | GemmEngine::CublasF16 | GemmEngine::CublasBf16
            if limit == c.len() =>
        {
            cublas_gemm(gpu, engine, spec, a, b, c)
        }
        GemmEngine::Cublas(_) | GemmEngine::CublasF16 | GemmEngine::CublasBf16 => {
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
            let math = if gpu.faults().gemm_without_tensor_ops {
                GemmMath::Fp32
            } else {
                math
            };
            let blas = gpu.cublas()?;
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
            let a16 = cast_to_half::<u16>(gpu, a)?;
            let b16 = cast_to_half::<u16>(gpu, b)?;
            gemm_ex_half(gpu, cfg, &b16, &a16, c)
        }
        GemmEngine::CublasBf16 => {
            let a16 = cast_to_half::<Bf16>(gpu, a)?;
            let b16 = cast_to_half::<Bf16>(gpu, b)?;
            gemm_ex_half(gpu, cfg, &b16, &a16, c)?;
            if gpu.faults().bf16_gemm_output_rounded {
                let rounded = cast_to_half::<Bf16>(gpu, c)?;
                super::cast::bf16_to_f32(gpu, &rounded, c)?;
            }
            Ok(())
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

/// `cublasGemmEx` with `A`, `B` in the 16-bit format `H` (our `B`, `A` in
/// cuBLAS order, as raw bit patterns), f32 `C`, f32 compute (pedantic f32
/// compute, without tensor cores, under
/// [`crate::Faults::gemm_without_tensor_ops`]). The callers check that
/// `first`, `second` and `c` hold what `cfg` addresses.
/// The element type of a 16-bit-operand GEMM's output `C`: f32, or bf16
/// (the f32 accumulator rounded to nearest once, at the store).
pub trait GemmOut: cudarc::driver::DeviceRepr {
    /// Its cuBLAS data type.
    const CUDA_TYPE: cudaDataType_t;
}

impl GemmOut for f32 {
    const CUDA_TYPE: cudaDataType_t = cudaDataType_t::CUDA_R_32F;
}

impl GemmOut for Bf16 {
    const CUDA_TYPE: cudaDataType_t = cudaDataType_t::CUDA_R_16BF;
}

pub(crate) fn gemm_ex_half<H: HalfFloat, C: GemmOut>(
    gpu: &GpuContext,
    cfg: GemmConfig<f32>,
    first: &impl DevicePtr<H>,
    second: &impl DevicePtr<H>,
    c: &mut impl DevicePtrMut<C>,
) -> Result<()> {
    let (blas, stream) = (gpu.cublas()?, gpu.stream());
    let compute = if gpu.faults().gemm_without_tensor_ops {
        cublasComputeType_t::CUBLAS_COMPUTE_32F_PEDANTIC
    } else {
        cublasComputeType_t::CUBLAS_COMPUTE_32F
    };
    let alpha = cfg.alpha;
    let beta = cfg.beta;
    let (first_ptr, _first_sync) = first.device_ptr(stream);
    let (second_ptr, _second_sync) = second.device_ptr(stream);
    let (c_ptr, _c_sync) = c.device_ptr_mut(stream);
    if let Some(tuned) = gpu.tuned_gemms() {
        let types = (H::CUDA_TYPE, C::CUDA_TYPE);
        let ptrs = (
            first_ptr as *const _,
            second_ptr as *const _,
            c_ptr as *mut _,
        );
        // SAFETY: the pointers hold what cublasGemmEx below would read and
        // write (see there), on the same stream; `run` takes the call only
        // for the types and shape it pinned.
        let on = (stream.as_ref(), gpu.capturing());
        if unsafe { tuned.run(&cfg, types, compute, ptrs, on) }? {
            return Ok(());
        }
    }
    // SAFETY: the handle is bound to `stream`, on which the pointers are
    // recorded. Each caller checked `first`/`second` against the shapes of
    // `cfg` (`cublas_gemm`: the same element counts as its checked f32
    // operands, cast element for element; `train::blas::gemm_half`: the
    // spec's), so with these transposes and leading dimensions cuBLAS reads
    // only valid elements of H (2 bytes each, as H::CUDA_TYPE says) and
    // writes exactly the m*n elements of `c`, of the type C::CUDA_TYPE
    // names (accumulated in f32, rounded once at the store). alpha and beta
    // are host f32 values (the default host pointer mode, an f32 compute type).
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
            H::CUDA_TYPE,
            cfg.lda,
            second_ptr as *const _,
            H::CUDA_TYPE,
            cfg.ldb,
            (&beta as *const f32).cast(),
            c_ptr as *mut _,
            C::CUDA_TYPE,
            cfg.ldc,
            compute,
            blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }?;
    Ok(())
}

/// A device copy of `x` in the 16-bit format `H`, rounded to nearest even.
fn cast_to_half<H: HalfFloat>(gpu: &mut GpuContext, x: &CudaSlice<f32>) -> Result<CudaSlice<H>> {
    let mut out = gpu.zeros::<H>(x.len())?;
    super::cast::f32_to_half(gpu, &x.as_view(), &mut out.as_view_mut())?;
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

/// `W^T` (`[cols, rows]`, row-major) of the row-major `[rows, cols]` matrix
/// `w`, on the device: cuBLAS `geam` with `C = 1 * op(A) + 0 * B`, exact
/// for every value (`1 * x + 0 = x`; `B` is the zeroed output itself). What
/// the fast configuration keeps for its backward instead of a second upload
/// of the same values transposed on the host.
pub fn transpose_f32(
    gpu: &GpuContext,
    w: &CudaSlice<f32>,
    (rows, cols): (usize, usize),
) -> Result<CudaSlice<f32>> {
    const OP: &str = "transpose_f32";
    expect_len(OP, "w", w.len(), &[rows, cols])?;
    let (m, n) = (to_i32(OP, "rows", rows)?, to_i32(OP, "cols", cols)?);
    let mut t = gpu.zeros::<f32>(rows * cols)?;
    if rows * cols == 0 {
        return Ok(t);
    }
    {
        let (blas, stream) = (gpu.cublas()?, gpu.stream());
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (w_ptr, _w_sync) = w.device_ptr(stream);
        let (t_ptr, _t_sync) = t.device_ptr_mut(stream);
        // Read column-major, `w` is `[cols, rows]` with leading dimension
        // `cols`, and the row-major `[cols, rows]` output is `[rows, cols]`
        // with leading dimension `rows`: C (m = rows, n = cols) = op(A), op = T.
        // SAFETY: the handle is bound to `stream`, on which both pointers
        // are recorded; `w` holds exactly rows * cols f32 (checked above) and
        // `t` the same, so cuBLAS reads A's and B's (= C's, in place with
        // ldb = ldc and no transpose, as geam allows) rows * cols elements
        // and writes C's. alpha and beta are host f32 values (the default
        // host pointer mode).
        unsafe {
            blas_sys::cublasSgeam(
                *blas.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                m,
                n,
                &alpha,
                w_ptr as *const f32,
                n,
                &beta,
                t_ptr as *const f32,
                m,
                t_ptr as *mut f32,
                m,
            )
        }
        .result()?;
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

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
