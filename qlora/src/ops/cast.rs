//! Launchers for `kernels/cast.cu`: f32 <-> f16 on the device, with f16
//! values held as their raw bit patterns (`u16`, the `half::f16::to_bits`
//! form).
//!
//! `f32_to_f16`: `y_i = f16(x_i)`, round to nearest even (IEEE 754, as
//! `half::f16::from_f32`). `f16_to_f32`: `y_i = f32(x_i)`, exact.

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, DeviceRepr, PushKernelArg};

use super::gemm::to_i64;
use super::launch::expect_len;
use crate::error::Result;
use crate::gpu::GpuContext;
use crate::kernels::abi::{Arg, Signatures};

/// The kernel module these launchers use.
pub const MODULE: &str = "cast";

/// Kernel argument lists in the order the launchers push them, checked
/// against the compiled PTX by a unit test.
pub const SIGNATURES: Signatures = &[
    ("cast_fwd_f32_f16", &[Arg::Ptr, Arg::Ptr, Arg::I64]),
    ("cast_fwd_f16_f32", &[Arg::Ptr, Arg::Ptr, Arg::I64]),
];

/// The f16 bit pattern of a quiet NaN: the poison of f16 outputs.
pub const F16_NAN_BITS: u16 = 0x7e00;

/// `y = f16(x)` element-wise (round to nearest even); views, so a block of a
/// wider buffer can be cast in place.
pub fn f32_to_f16(gpu: &mut GpuContext, x: &CudaView<f32>, y: &mut CudaViewMut<u16>) -> Result<()> {
    expect_len("cast_fwd_f32_f16", "y", y.len(), &[x.len()])?;
    let n = gpu.faults().written(x.len());
    // Four elements a thread where the views are aligned (see cast.cu).
    launch_cast(gpu, "cast_fwd_f32_f16", x, y, n, 4)
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

/// Runs `symbol` (`cast_fwd_f32_f16` or `cast_fwd_f16_f32`) on the first
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
    // `cast_fwd_f32_f16(const float* x, unsigned short* y, long long n)` with
    // (f32, u16) and `cast_fwd_f16_f32(const unsigned short* x, float* y,
    // long long n)` with (u16, f32), u16 being the 16-bit pattern of an f16.
    // n is at most the length of both views and the grid-stride loops
    // touch only indices < n (the f32 -> f16 kernel's four-element steps
    // only below 4 (n / 4), and only where its own test found both pointers
    // aligned for their vector accesses).
    unsafe { launch.launch(cfg) }?;
    Ok(())
}
