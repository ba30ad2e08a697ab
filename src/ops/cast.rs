//! Launchers for `kernels/cast.cu`: f32 <-> f16 on the device, with f16
//! values held as their raw bit patterns (`u16`, the `half::f16::to_bits`
//! form).
//!
//! `f32_to_f16`: `y_i = f16(x_i)`, round to nearest even (IEEE 754, as
//! `half::f16::from_f32`). `f16_to_f32`: `y_i = f32(x_i)`, exact.

use cudarc::driver::{CudaSlice, DeviceRepr, PushKernelArg};
use half::f16;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::gemm::to_i64;
use super::parity::{case_rng, compare, written, Arg, Case, Comparison, Signatures};
use crate::error::Result;
use crate::gpu::GpuContext;
use crate::reference::elementwise::expect_len;

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

/// `y = f16(x)` element-wise (round to nearest even).
pub fn f32_to_f16(gpu: &mut GpuContext, x: &CudaSlice<f32>, y: &mut CudaSlice<u16>) -> Result<()> {
    expect_len("cast_fwd_f32_f16", "y", y.len(), &[x.len()])?;
    launch_f32_to_f16(gpu, x, y, x.len())
}

/// `y = f32(x)` element-wise (exact).
pub fn f16_to_f32(gpu: &mut GpuContext, x: &CudaSlice<u16>, y: &mut CudaSlice<f32>) -> Result<()> {
    expect_len("cast_fwd_f16_f32", "y", y.len(), &[x.len()])?;
    launch_f16_to_f32(gpu, x, y, x.len())
}

/// Runs `symbol` (`cast_fwd_f32_f16` or `cast_fwd_f16_f32`) on the first
/// `n <= x.len()` elements (`n < len` only for the `LastElementUnwritten`
/// fault injection).
fn launch_cast<A: DeviceRepr, B: DeviceRepr>(
    gpu: &mut GpuContext,
    symbol: &'static str,
    x: &CudaSlice<A>,
    y: &mut CudaSlice<B>,
    n: usize,
) -> Result<()> {
    let n = to_i64(symbol, n.min(x.len()).min(y.len()))?;
    let cfg = gpu.launch_1d(x.len());
    let func = gpu.function(MODULE, symbol)?;
    let mut launch = gpu.stream().launch_builder(&func);
    launch.arg(x).arg(y).arg(&n);
    // SAFETY: the callers pair each symbol with its element types:
    // `cast_fwd_f32_f16(const float* x, unsigned short* y, long long n)` with
    // (f32, u16) and `cast_fwd_f16_f32(const unsigned short* x, float* y,
    // long long n)` with (u16, f32), u16 being the 16-bit pattern of an f16.
    // n is at most the length of both buffers and the grid-stride loop
    // touches only indices < n.
    unsafe { launch.launch(cfg) }?;
    Ok(())
}

fn launch_f32_to_f16(
    gpu: &mut GpuContext,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<u16>,
    n: usize,
) -> Result<()> {
    launch_cast(gpu, "cast_fwd_f32_f16", x, y, n)
}

fn launch_f16_to_f32(
    gpu: &mut GpuContext,
    x: &CudaSlice<u16>,
    y: &mut CudaSlice<f32>,
    n: usize,
) -> Result<()> {
    launch_cast(gpu, "cast_fwd_f16_f32", x, y, n)
}

/// `n` f32 values with random signs and magnitudes log-uniform over
/// `[2^-26, 2^15]`: f16 subnormals (below 2^-14), values that round to zero
/// (below 2^-25) and the top binade of f16 all occur.
fn random_wide(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let exponent = rng.random_range(-26.0f32..15.0);
            let sign = if rng.random_bool(0.5) { -1.0 } else { 1.0 };
            sign * exponent.exp2()
        })
        .collect()
}

/// `op_parity` for one shape `{n}`: both directions, bit for bit.
///
/// f32 -> f16 on the device is compared with `half::f16::from_f32` of the same
/// inputs; f16 -> f32 on the device converts those reference bit patterns
/// back and is compared with `half`'s exact widening. Any rounding difference
/// shows as a non-zero relative error (contracts use tolerance 0).
pub fn parity(gpu: &mut GpuContext, case: &Case<'_>) -> Result<Comparison> {
    let n = case.shape.dim("n");
    let mut rng = case_rng(case.seed);
    let x = random_wide(&mut rng, n);
    let ref_bits: Vec<u16> = x.iter().map(|&v| f16::from_f32(v).to_bits()).collect();
    let reference: Vec<f64> = ref_bits
        .iter()
        .map(|&b| f64::from(f16::from_bits(b).to_f32()))
        .collect();
    let limit = written(n, case.mutant);

    // f32 -> f16
    let x_dev = gpu.upload(&x)?;
    let mut h_dev = gpu.upload(&vec![F16_NAN_BITS; n])?;
    launch_f32_to_f16(gpu, &x_dev, &mut h_dev, limit)?;
    let narrowed: Vec<f32> = gpu
        .download(&h_dev)?
        .into_iter()
        .map(|b| f16::from_bits(b).to_f32())
        .collect();
    let down = compare(&narrowed, &reference);

    // f16 -> f32, from the reference bit patterns
    let bits_dev = gpu.upload(&ref_bits)?;
    let mut y_dev = gpu.poisoned(n)?;
    launch_f16_to_f32(gpu, &bits_dev, &mut y_dev, limit)?;
    let up = compare(&gpu.download(&y_dev)?, &reference);

    Ok(down.merge(up))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poison_is_nan_and_inputs_stay_finite_in_f16() {
        assert!(f16::from_bits(F16_NAN_BITS).is_nan());
        let mut rng = case_rng(1);
        let x = random_wide(&mut rng, 4096);
        assert!(x.iter().all(|v| f16::from_f32(*v).is_finite()));
        // Subnormal and flushed-to-zero values both occur.
        assert!(x
            .iter()
            .any(|v| v.abs() < 6.1e-5 && f16::from_f32(*v).to_f32() != 0.0));
        assert!(x.iter().any(|v| f16::from_f32(*v).to_f32() == 0.0));
    }
}
