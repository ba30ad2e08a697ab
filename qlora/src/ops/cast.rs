//! Launchers for `kernels/cast.cu`: f32 <-> f16 and f32 <-> bf16 on the
//! device, with both 16-bit formats held as their raw bit patterns: f16 as
//! `u16` (the `half::f16::to_bits` form), bf16 as [`Bf16`].
//!
//! `f32_to_f16`: `y_i = f16(x_i)`, round to nearest even (IEEE 754, as
//! `half::f16::from_f32`). `f32_to_bf16`: `y_i = bf16(x_i)`, round to nearest
//! even (as `half::bf16::from_f32`). Back to f32: exact.

use cudarc::cublas::sys::cudaDataType_t;
use cudarc::driver::{
    CudaSlice, CudaView, CudaViewMut, DeviceRepr, PushKernelArg, ValidAsZeroBits,
};

use super::gemm::to_i64;
use super::launch::expect_len;
use crate::error::{Error, Result};
use crate::gpu::{GpuContext, TensorTable};
use crate::kernels::abi::{Arg, Signatures};

/// The kernel module these launchers use.
pub const MODULE: &str = "cast";

/// Kernel argument lists in the order the launchers push them, checked
/// against the compiled PTX by a unit test.
pub const SIGNATURES: Signatures = &[
    ("cast_fwd_f32_f16", &[Arg::Ptr, Arg::Ptr, Arg::I64]),
    ("cast_fwd_f16_f32", &[Arg::Ptr, Arg::Ptr, Arg::I64]),
    ("cast_fwd_f32_bf16", &[Arg::Ptr, Arg::Ptr, Arg::I64]),
    ("cast_fwd_bf16_f32", &[Arg::Ptr, Arg::Ptr, Arg::I64]),
    (
        "cast_multi_f32_f16",
        &[Arg::Ptr, Arg::Ptr, Arg::I32, Arg::I64],
    ),
    (
        "cast_multi_f32_bf16",
        &[Arg::Ptr, Arg::Ptr, Arg::I32, Arg::I64],
    ),
];

/// A bf16 value as its raw bit pattern (`half::bf16::to_bits`): the upper
/// 16 bits of the f32 of the same sign, exponent and leading 7 fraction
/// bits. Its own type, so a bf16 buffer is never read as f16.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(transparent)]
pub struct Bf16(pub u16);

impl Bf16 {
    /// The bf16 nearest to `x`, ties to even.
    pub fn from_f32(x: f32) -> Self {
        Bf16(half::bf16::from_f32(x).to_bits())
    }

    /// The value, exactly.
    pub fn to_f32(self) -> f32 {
        half::bf16::from_bits(self.0).to_f32()
    }
}

// SAFETY: `Bf16` is `repr(transparent)` over `u16`, so it has u16's size,
// alignment and (absent) padding; the kernels read and write it as
// `unsigned short`, the same 2-byte pattern.
unsafe impl DeviceRepr for Bf16 {}
// SAFETY: all-zero bits are a valid u16 and the bf16 value +0.0.
unsafe impl ValidAsZeroBits for Bf16 {}

/// A 16-bit float format the tensor-core GEMMs take as operands (f32
/// accumulation), held as raw bits: f16 (`u16`) or bf16 ([`Bf16`]).
pub trait HalfFloat: DeviceRepr + ValidAsZeroBits + Copy + Unpin + Send + Sync + 'static {
    /// Its cuBLAS data type.
    const CUDA_TYPE: cudaDataType_t;
    /// The cast kernel that rounds f32 into this format.
    const FROM_F32: &'static str;
    /// The kernel that copies and rounds the tensors of a table
    /// ([`copy_round_multi`]).
    const MULTI_FROM_F32: &'static str;
    /// The format's name in messages.
    const NAME: &'static str;
    /// The host's rounding of `x` to this format (nearest, ties to even).
    fn round(x: f32) -> Self;
}

impl HalfFloat for u16 {
    const CUDA_TYPE: cudaDataType_t = cudaDataType_t::CUDA_R_16F;
    const FROM_F32: &'static str = "cast_fwd_f32_f16";
    const MULTI_FROM_F32: &'static str = "cast_multi_f32_f16";
    const NAME: &'static str = "f16";
    fn round(x: f32) -> Self {
        half::f16::from_f32(x).to_bits()
    }
}

impl HalfFloat for Bf16 {
    const CUDA_TYPE: cudaDataType_t = cudaDataType_t::CUDA_R_16BF;
    const FROM_F32: &'static str = "cast_fwd_f32_bf16";
    const MULTI_FROM_F32: &'static str = "cast_multi_f32_bf16";
    const NAME: &'static str = "bf16";
    fn round(x: f32) -> Self {
        Bf16::from_f32(x)
    }
}

/// The f16 bit pattern of a quiet NaN: the poison of f16 outputs.
pub const F16_NAN_BITS: u16 = 0x7e00;

/// `y = f16(x)` element-wise (round to nearest even); views, so a block of a
/// wider buffer can be cast in place.
pub fn f32_to_f16(gpu: &mut GpuContext, x: &CudaView<f32>, y: &mut CudaViewMut<u16>) -> Result<()> {
    f32_to_half(gpu, x, y)
}

/// `y = bf16(x)` element-wise (round to nearest even).
pub fn f32_to_bf16(
    gpu: &mut GpuContext,
    x: &CudaView<f32>,
    y: &mut CudaViewMut<Bf16>,
) -> Result<()> {
    f32_to_half(gpu, x, y)
}

/// `y = H(x)` element-wise, rounded to nearest even, in the format `H`.
pub fn f32_to_half<H: HalfFloat>(
    gpu: &mut GpuContext,
    x: &CudaView<f32>,
    y: &mut CudaViewMut<H>,
) -> Result<()> {
    expect_len(H::FROM_F32, "y", y.len(), &[x.len()])?;
    let n = gpu.faults().written(x.len());
    // Four elements a thread where the views are aligned (see cast.cu).
    launch_cast(gpu, H::FROM_F32, x, y, n, 4)
}

/// For every tensor `i` of `table`, whose three columns are each tensor's
/// f32 source, an f32 destination and a destination in the format `H` (an
/// address of 0 where a tensor has none): `copy_i = src_i` and `rounded_i
/// = H(src_i)`, rounded to nearest even. Many small copies and casts in one
/// launch.
pub fn copy_round_multi<H: HalfFloat>(gpu: &mut GpuContext, table: &TensorTable) -> Result<()> {
    let symbol = H::MULTI_FROM_F32;
    if table.columns != 3 {
        return Err(Error::InvalidArgument {
            op: symbol,
            message: format!(
                "a table of sources, copies and roundings has 3 columns, not {}",
                table.columns
            ),
        });
    }
    let n_tensors = crate::gpu::to_i32(symbol, "tensors", table.tensors)?;
    let n_write = to_i64(symbol, gpu.faults().written(table.total))?;
    let cfg = gpu.launch_1d(table.total);
    let func = gpu.function(MODULE, symbol)?;
    let mut launch = gpu.stream().launch_builder(&func);
    launch
        .arg(&table.ptrs)
        .arg(&table.offsets)
        .arg(&n_tensors)
        .arg(&n_write);
    // SAFETY: cast_multi_f32_{f16,bf16}(const unsigned long long* ptrs,
    // const long long* offsets, int n_tensors, long long n_write): the table
    // holds 3 * n_tensors addresses and n_tensors + 1 offsets
    // (TensorTable::new); its builder's promise is that column 0 of tensor i
    // addresses offsets[i + 1] - offsets[i] live f32 values and columns 1
    // and 2, where not 0, as many f32 and 16-bit ones, no destination
    // overlapping another or a source; the kernel touches element e of
    // tensor i only for offsets[i] + e < total, and skips a column of 0.
    unsafe { launch.launch(cfg) }?;
    Ok(())
}

/// `y = f32(x)` element-wise from bf16 (exact).
pub fn bf16_to_f32(
    gpu: &mut GpuContext,
    x: &CudaSlice<Bf16>,
    y: &mut CudaSlice<f32>,
) -> Result<()> {
    expect_len("cast_fwd_bf16_f32", "y", y.len(), &[x.len()])?;
    let n = gpu.faults().written(x.len());
    launch_cast(
        gpu,
        "cast_fwd_bf16_f32",
        &x.as_view(),
        &mut y.as_view_mut(),
        n,
        1,
    )
}

/// `y = f32(x)` element-wise (exact).
pub fn f16_to_f32(gpu: &mut GpuContext, x: &CudaSlice<u16>, y: &mut CudaSlice<f32>) -> Result<()> {
    expect_len("cast_fwd_f16_f32", "y", y.len(), &[x.len()])?;
    let n = gpu.faults().written(x.len());
    launch_cast(
        gpu,
        "cast_fwd_f16_f32",
        &x.as_view(),
        &mut y.as_view_mut(),
        n,
        1,
    )
}

/// Runs `symbol` (one of the four cast kernels) on the first
/// `n <= x.len()` elements (`n < len` only for the `LastElementUnwritten`
/// fault injection), with threads for `per_thread` elements each.
fn launch_cast<A: DeviceRepr, B: DeviceRepr>(
    gpu: &mut GpuContext,
    symbol: &'static str,
    x: &CudaView<A>,
    y: &mut CudaViewMut<B>,
    n: usize,
    per_thread: usize,
) -> Result<()> {
    let n = to_i64(symbol, n.min(x.len()).min(y.len()))?;
    let cfg = gpu.launch_1d(x.len().div_ceil(per_thread));
    let func = gpu.function(MODULE, symbol)?;
    let mut launch = gpu.stream().launch_builder(&func);
    launch.arg(x).arg(y).arg(&n);
    // SAFETY: the callers pair each symbol with its element types:
    // `cast_fwd_f32_f16` / `cast_fwd_f32_bf16(const float* x, unsigned
    // short* y, long long n)` with (f32, u16) / (f32, Bf16), and
    // `cast_fwd_f16_f32` / `cast_fwd_bf16_f32(const unsigned short* x,
    // float* y, long long n)` with (u16, f32) / (Bf16, f32); u16 and Bf16
    // are the 2-byte patterns the kernels take as unsigned short.
    // n is at most the length of both views and the grid-stride loops
    // touch only indices < n (the f32 -> f16 kernel's four-element steps
    // only below 4 (n / 4), and only where its own test found both pointers
    // aligned for their vector accesses).
    unsafe { launch.launch(cfg) }?;
    Ok(())
}
