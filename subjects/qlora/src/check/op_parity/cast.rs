//! `op_parity` of `cast`: the launchers of `qlora::ops::cast` against the oracle.

use super::compare::{case_rng, compare, Case, Comparison, Written};
use crate::error::Result;
use cudarc::driver::CudaSlice;
use half::f16;
use qlora::gpu::table::address;
use qlora::gpu::{GpuContext, TensorTable};
use qlora::ops::cast::Bf16;
use qlora::ops::cast::*;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// `op_parity` for one shape `{n}`: both directions, bit for bit, and
/// f32 -> f16 again on views one element in (unaligned).
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

    // f32 -> f16
    let x_dev = gpu.upload(&x)?;
    let mut h_dev = gpu.upload(&vec![F16_NAN_BITS; n])?;
    f32_to_f16(gpu, &x_dev.as_view(), &mut h_dev.as_view_mut())?;
    let narrowed: Vec<f32> = gpu
        .download(&h_dev)?
        .into_iter()
        .map(|b| f16::from_bits(b).to_f32())
        .collect();
    let mut down = compare(&narrowed, &reference);
    // The same values from one element in: views that start off the
    // 16-byte boundary, which the kernel casts one element at a time.
    if n > 1 {
        let mut h_dev = gpu.upload(&vec![F16_NAN_BITS; n])?;
        f32_to_f16(gpu, &x_dev.slice(1..), &mut h_dev.slice_mut(1..))?;
        let shifted: Vec<f32> = gpu.download(&h_dev)?[1..]
            .iter()
            .map(|&b| f16::from_bits(b).to_f32())
            .collect();
        down = down.merge(compare(&shifted, &reference[1..]));
    }

    let poisoned = gpu.upload(&vec![F16_NAN_BITS; n])?;
    let widen = |b: u16| f16::from_bits(b).to_f32();
    down = down.merge(multi(gpu, &x_dev, (poisoned, widen), &reference)?);

    // f16 -> f32, from the reference bit patterns
    let bits_dev = gpu.upload(&ref_bits)?;
    let mut y_dev = gpu.poisoned(n)?;
    f16_to_f32(gpu, &bits_dev, &mut y_dev)?;
    let up = compare(&gpu.download(&y_dev)?, &reference);

    Ok(down.merge(up))
}

/// `op_parity` of the bf16 casts for one shape `{n}`: both directions, bit
/// for bit against `half::bf16`, f32 -> bf16 again on views one element in.
///
/// The inputs are random f32 bit patterns of every finite exponent (bf16
/// keeps f32's range, so its rounding is tested at every binade), plus
/// the exact ties `1 + 2^-8` and `1 + 3 * 2^-8` (to even: down and up)
/// and a value that rounds up into the next binade. Compared as f32
/// values, so any rounding difference is a non-zero relative error.
pub fn parity_bf16(gpu: &mut GpuContext, case: &Case<'_>) -> Result<Comparison> {
    let n = case.shape.dim("n");
    let mut rng = case_rng(case.seed);
    let x = random_finite_bits(&mut rng, n);
    let ref_bits: Vec<Bf16> = x.iter().map(|&v| Bf16::from_f32(v)).collect();
    let reference: Vec<f64> = ref_bits.iter().map(|b| f64::from(b.to_f32())).collect();
    let x_dev = gpu.upload(&x)?;
    let mut h_dev = Bf16::poisoned(gpu, n)?;
    f32_to_bf16(gpu, &x_dev.as_view(), &mut h_dev.as_view_mut())?;
    let mut down = compare(&Bf16::values(&gpu.download(&h_dev)?), &reference);
    if n > 1 {
        let mut h_dev = Bf16::poisoned(gpu, n)?;
        f32_to_bf16(gpu, &x_dev.slice(1..), &mut h_dev.slice_mut(1..))?;
        let shifted = Bf16::values(&gpu.download(&h_dev)?[1..]);
        down = down.merge(compare(&shifted, &reference[1..]));
    }
    let bf16 = (Bf16::poisoned(gpu, n)?, Bf16::to_f32 as fn(Bf16) -> f32);
    down = down.merge(multi(gpu, &x_dev, bf16, &reference)?);
    let bits_dev = gpu.upload(&ref_bits)?;
    let mut y_dev = gpu.poisoned(n)?;
    bf16_to_f32(gpu, &bits_dev, &mut y_dev)?;
    let up = compare(&gpu.download(&y_dev)?, &reference);
    Ok(down.merge(up))
}

/// The one-launch copy and rounding of many tensors
/// ([`copy_round_multi`]) on `x` cut into up to three tensors of unequal
/// lengths, each copied and rounded to `H` into its own place of two
/// destinations poisoned with NaNs (`rounded`, given, and an f32 one): the
/// rounding, widened back by `widen`, against `reference` (x rounded on the
/// host, widened back), the copy against `x` itself.
fn multi<H: HalfFloat>(
    gpu: &mut GpuContext,
    x: &CudaSlice<f32>,
    (rounded, widen): (CudaSlice<H>, fn(H) -> f32),
    reference: &[f64],
) -> Result<Comparison> {
    let n = x.len();
    let mut cuts = vec![0, n / 3, n / 2 + 1, n];
    cuts.retain(|&c| c <= n);
    cuts.dedup();
    let copy = gpu.poisoned(n)?;
    let at = |base: u64, bytes: usize, i: usize| base + (bytes * i) as u64;
    let (x_at, c_at, r_at) = (address(gpu, x), address(gpu, &copy), address(gpu, &rounded));
    let mut columns = [Vec::new(), Vec::new(), Vec::new()];
    let mut lens = Vec::new();
    for w in cuts.windows(2) {
        columns[0].push(at(x_at, 4, w[0]));
        columns[1].push(at(c_at, 4, w[0]));
        columns[2].push(at(r_at, std::mem::size_of::<H>(), w[0]));
        lens.push(w[1] - w[0]);
    }
    // The table's addresses stay valid: x and both destinations outlive
    // its one launch.
    let table = TensorTable::new(gpu, &columns, &lens)?;
    copy_round_multi::<H>(gpu, &table)?;
    let exact: Vec<f64> = gpu.download(x)?.into_iter().map(f64::from).collect();
    let copied = compare(&gpu.download(&copy)?, &exact);
    let widened: Vec<f32> = gpu.download(&rounded)?.into_iter().map(widen).collect();
    Ok(compare(&widened, reference).merge(copied))
}

/// `n` finite f32 values from random bit patterns (every exponent below
/// the largest, so bf16's rounding is met at every binade and a carry out
/// of the largest one cannot overflow), the first few replaced by exact
/// ties and a carry into the next binade.
fn random_finite_bits(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    let mut x: Vec<f32> = (0..n)
        .map(|_| {
            let bits: u32 = rng.random();
            // The exponent field in [0, 253]: no infinity or NaN, and no
            // rounding up reaches infinity.
            let exponent = (bits >> 23 & 0xff) % 254;
            f32::from_bits((bits & 0x807f_ffff) | exponent << 23)
        })
        .collect();
    let specials = [
        1.0 + 2f32.powi(-8),
        1.0 + 3.0 * 2f32.powi(-8),
        1.999_999_9,
        -0.0,
    ];
    for (slot, v) in x.iter_mut().zip(specials) {
        *slot = v;
    }
    x
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

    /// The bf16 inputs are finite and stay finite in bf16, and the planted
    /// ties round to even: `1 + 2^-8` down to 1, `1 + 3 * 2^-8` up to
    /// `1 + 2^-6`, and `1.9999999` carries into the next binade.
    #[test]
    fn bf16_inputs_are_finite_and_the_ties_round_to_even() {
        let mut rng = case_rng(2);
        let x = random_finite_bits(&mut rng, 4096);
        assert!(x.iter().all(|v| Bf16::from_f32(*v).to_f32().is_finite()));
        assert_eq!(Bf16::from_f32(x[0]).to_f32(), 1.0);
        assert_eq!(Bf16::from_f32(x[1]).to_f32(), 1.0 + 2f32.powi(-6));
        assert_eq!(Bf16::from_f32(x[2]).to_f32(), 2.0);
        // Subnormal inputs occur, and huge ones.
        assert!(x.iter().any(|v| v.is_subnormal()));
        assert!(x.iter().any(|v| v.abs() > 1e30));
    }
}
