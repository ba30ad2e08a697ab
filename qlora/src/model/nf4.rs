//! NormalFloat4 (NF4) block quantisation, as in QLoRA (Dettmers et al., 2023).
//!
//! A tensor of `len` values is cut into blocks of `block` consecutive values
//! (64 by default). Each block stores one f64 scale `absmax_b = max_i |w_i|` and
//! one 4-bit code per value:
//!
//! ```text
//! code_i = argmin_c | w_i / absmax_b - CODE_BOOK[c] |      (ties: the lower code)
//! deq_i  = CODE_BOOK[code_i] * absmax_b
//! ```
//!
//! so the round-trip error of every value is at most half the gap between the
//! two code-book values around `w_i / absmax_b`, times `absmax_b`. A block of
//! zeros has `absmax_b = 0` and every code points at the code book's exact 0.
//!
//! Storage: one code per element in a `u8` (values `0..16`), unpacked, on the
//! host; the device form packs two codes per byte (`crate::ops::nf4`). The
//! host quantiser computes in f64, so its codes are exact: an NF4 base made
//! here is the same model on every backend.

use crate::error::{Error, Result};
use rayon::prelude::*;

/// The 16 NF4 values of QLoRA (the quantiles of N(0, 1) normalised to
/// `[-1, 1]`, with an exact zero), exactly as published in bitsandbytes.
pub const CODE_BOOK: [f64; 16] = [
    -1.0,
    -0.696_192_800_998_687_7,
    -0.525_073_051_452_636_7,
    -0.394_917_488_098_144_53,
    -0.284_441_381_692_886_35,
    -0.184_773_430_228_233_34,
    -0.091_050_036_251_544_95,
    0.0,
    0.079_580_299_556_255_34,
    0.160_930_201_411_247_25,
    0.246_112_301_945_686_34,
    0.337_915_241_718_292_24,
    0.440_709_829_330_444_34,
    0.562_617_003_917_694_1,
    0.722_956_836_223_602_3,
    1.0,
];

/// Index of the code book's exact zero.
pub const ZERO_CODE: u8 = 7;

/// The block size of QLoRA and of this project's NF4 base weights.
pub const BLOCK: usize = 64;

/// A quantised tensor: one code per element and one absmax per block.
#[derive(Debug, Clone, PartialEq)]
pub struct Nf4Tensor {
    /// One code (`0..16`, an index into [`CODE_BOOK`]) per element, unpacked.
    pub codes: Vec<u8>,
    /// `max |w|` of each block.
    pub absmax: Vec<f64>,
    /// Number of elements.
    pub len: usize,
    /// Elements per block.
    pub block: usize,
}

/// The widest gap between two adjacent code-book values (`1 - 0.6962` at the
/// negative end). Half of it, times a block's absmax, bounds the round-trip
/// error of every value in the block.
pub fn widest_gap() -> f64 {
    CODE_BOOK
        .windows(2)
        .map(|w| w[1] - w[0])
        .fold(0.0, f64::max)
}

/// The code whose value is nearest to `x` (a value already divided by the
/// block's absmax, so in `[-1, 1]`); ties go to the lower code.
pub fn nearest_code(x: f64) -> u8 {
    let mut best = 0u8;
    let mut best_dist = f64::INFINITY;
    for (c, &v) in CODE_BOOK.iter().enumerate() {
        let d = (x - v).abs();
        if d < best_dist {
            best_dist = d;
            best = c as u8;
        }
    }
    best
}

/// Checks that `len` splits into whole blocks and that every value is finite.
pub fn check_input(w: &[f64], block: usize) -> Result<()> {
    if block == 0 {
        return Err(Error::InvalidArgument {
            op: "nf4_quantize",
            message: "block size must be > 0".into(),
        });
    }
    if !w.len().is_multiple_of(block) {
        return Err(Error::InvalidArgument {
            op: "nf4_quantize",
            message: format!(
                "length {} is not a multiple of the block size {block}",
                w.len()
            ),
        });
    }
    if let Some(i) = w.iter().position(|v| !v.is_finite()) {
        return Err(Error::InvalidArgument {
            op: "nf4_quantize",
            message: format!("element {i} is {}, not a finite number", w[i]),
        });
    }
    Ok(())
}

/// Quantises `w` in blocks of `block` values with a per-block absmax and a
/// nearest-value choice from the code book. Refuses a length that is not a
/// multiple of `block`, and non-finite values.
pub fn quantize(w: &[f64], block: usize) -> Result<Nf4Tensor> {
    quantize_with(w, block, nearest_code)
}

/// Quantisation with a pluggable code choice `pick` (a value in `[-1, 1]` to
/// a code), so a different choice reuses the same block logic.
pub fn quantize_with(w: &[f64], block: usize, pick: fn(f64) -> u8) -> Result<Nf4Tensor> {
    check_input(w, block)?;
    let mut codes = vec![ZERO_CODE; w.len()];
    let mut absmax = vec![0.0; w.len() / block];
    // Blocks are independent: quantised on all cores.
    codes
        .par_chunks_mut(block)
        .zip(absmax.par_iter_mut())
        .zip(w.par_chunks(block))
        .for_each(|((codes, amax_out), chunk)| {
            let amax = chunk.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            *amax_out = amax;
            // A zero block has nothing to scale: every value is the exact zero.
            if amax > 0.0 {
                for (code, &v) in codes.iter_mut().zip(chunk) {
                    *code = pick(v / amax);
                }
            }
        });
    Ok(Nf4Tensor {
        codes,
        absmax,
        len: w.len(),
        block,
    })
}

/// `deq_i = CODE_BOOK[code_i] * absmax[i / block]`. A malformed tensor (a
/// code without its block's absmax) decodes that value to NaN, which no
/// check accepts, rather than panicking.
pub fn dequantize(t: &Nf4Tensor) -> Vec<f64> {
    let block = t.block.max(1);
    t.codes
        .iter()
        .enumerate()
        .map(|(i, &c)| {
            let amax = t.absmax.get(i / block).copied().unwrap_or(f64::NAN);
            CODE_BOOK[usize::from(c & 0x0f)] * amax
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_book_is_sorted_symmetric_ends_and_has_zero() {
        assert!(CODE_BOOK.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(CODE_BOOK[0], -1.0);
        assert_eq!(CODE_BOOK[15], 1.0);
        assert_eq!(CODE_BOOK[usize::from(ZERO_CODE)], 0.0);
        assert!((widest_gap() - (1.0 - 0.696_192_800_998_687_7)).abs() < 1e-15);
    }

    #[test]
    fn round_trip_is_exact_on_code_values_and_bounded_elsewhere() {
        let mut w: Vec<f64> = CODE_BOOK.iter().map(|c| c * 3.0).collect();
        w.extend((0..48).map(|i| (i as f64 * 0.37).sin() * 3.0));
        let t = quantize(&w, 64).unwrap();
        let d = dequantize(&t);
        for i in 0..16 {
            assert!((d[i] - w[i]).abs() < 1e-12);
        }
        let bound = widest_gap() / 2.0 * t.absmax[0];
        assert!(w.iter().zip(&d).all(|(a, b)| (a - b).abs() <= bound));
    }

    #[test]
    fn refuses_partial_blocks_and_handles_zero_blocks() {
        let e = quantize(&[1.0; 65], 64).unwrap_err().to_string();
        assert!(e.contains("65") && e.contains("64"), "{e}");
        let t = quantize(&[0.0; 64], 64).unwrap();
        assert_eq!(dequantize(&t), vec![0.0; 64]);
        assert!(quantize(&[f64::NAN; 64], 64).is_err());
    }
}
