//! Launchers for `kernels/draw.cu`: a seeded tensor's values drawn on the
//! device, bit for bit those of [`crate::model::weights::uniform_into`].
//!
//! Value `k` of a tensor is `x_k = (v_k - 1) * 2a - a`, `v_k` in `[1, 2)`
//! the f64 whose 52 fraction bits are the top 52 bits of the `k`-th u64 of
//! the tensor's ChaCha8 stream; stored as `f32(x_k)`, or that f32 rounded to
//! f16 or bf16 (all nearest even), as the host stores it.

use cudarc::driver::{CudaViewMut, DeviceRepr, PushKernelArg};

use super::gemm::to_i64;
use crate::error::Result;
use crate::gpu::{launch_config_1d, GpuContext};
use crate::kernels::abi::{Arg, Signatures};
use crate::model::weights::Stream;
use crate::ops::cast::{Bf16, HalfFloat};

/// The kernel module these launchers use.
pub const MODULE: &str = "draw";

const ARGS: &[Arg] = &[
    Arg::Ptr,
    Arg::I64,
    Arg::I64,
    Arg::I64,
    Arg::I64,
    Arg::I64,
    Arg::I64,
    Arg::F64,
];

/// Kernel argument lists in the order the launchers push them, checked
/// against the compiled PTX by a unit test.
pub const SIGNATURES: Signatures = &[
    ("draw_uniform_f32", ARGS),
    ("draw_uniform_f16", ARGS),
    ("draw_uniform_bf16", ARGS),
];

/// A format a frozen tensor is stored in, and how a drawn value is rounded
/// into it: on the host here, on the device by the kernel named.
pub trait Drawn: DeviceRepr + Copy + Send + Sync + 'static {
    /// The kernel that draws into this format.
    const DRAW: &'static str;
    /// The host's rounding of a drawn value `x` to this format.
    fn from_f64(x: f64) -> Self;
}

impl Drawn for f32 {
    const DRAW: &'static str = "draw_uniform_f32";
    fn from_f64(x: f64) -> Self {
        x as f32
    }
}

/// f16, as raw bits: `x` rounded to f32, then to f16.
impl Drawn for u16 {
    const DRAW: &'static str = "draw_uniform_f16";
    fn from_f64(x: f64) -> Self {
        u16::round(x as f32)
    }
}

/// bf16: `x` rounded to f32, then to bf16.
impl Drawn for Bf16 {
    const DRAW: &'static str = "draw_uniform_bf16";
    fn from_f64(x: f64) -> Self {
        Bf16::round(x as f32)
    }
}

/// Blocks per SM of a draw: enough 256-thread blocks to fill the GPU.
const BLOCKS_PER_SM: u32 = 8;

/// `y[i]` = value `first + i` of `stream`, in `T`'s format, for every `i`
/// of `y`.
pub fn uniform<T: Drawn>(
    gpu: &mut GpuContext,
    stream: &Stream,
    first: usize,
    y: &mut CudaViewMut<T>,
) -> Result<()> {
    let n = to_i64(T::DRAW, y.len())?;
    let first_i = to_i64(T::DRAW, first)?;
    to_i64(T::DRAW, first + y.len())?;
    let k = stream.key;
    let pair = |lo: u32, hi: u32| ((u64::from(hi) << 32) | u64::from(lo)) as i64;
    let (k01, k23, k45, k67) = (
        pair(k[0], k[1]),
        pair(k[2], k[3]),
        pair(k[4], k[5]),
        pair(k[6], k[7]),
    );
    // One thread per ChaCha block of eight values. The grid ignores the
    // test-only fault that serialises the step's launches: drawing the
    // weights is the trainer's setup, not the step the fault slows.
    let sms = gpu.facts().sm_count.max(1);
    let cfg = launch_config_1d(y.len().div_ceil(8) + 1, sms.saturating_mul(BLOCKS_PER_SM));
    let func = gpu.function(MODULE, T::DRAW)?;
    let mut launch = gpu.stream().launch_builder(&func);
    launch
        .arg(y)
        .arg(&n)
        .arg(&first_i)
        .arg(&k01)
        .arg(&k23)
        .arg(&k45)
        .arg(&k67)
        .arg(&stream.bound);
    // SAFETY: each symbol is paired with its element type through `Drawn`
    // (`draw_uniform_f32(float*, ...)` with f32, `draw_uniform_f16` and
    // `draw_uniform_bf16(unsigned short*, ...)` with the 2-byte patterns u16
    // and Bf16), and the arguments match the signature above (checked
    // against the PTX). The kernel writes `y[i]` for `0 <= i < n` only, and
    // `n` is the length of `y`; `first + n` fits an i64 (checked above), so
    // its block indices do not overflow.
    unsafe { launch.launch(cfg) }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::weights::{uniform_into, Draw, TensorId};

    /// The kernel's ChaCha8 block function, word for word.
    fn chacha8_block(key: &[u32; 8], block: u64) -> [u32; 16] {
        let mut input = [0u32; 16];
        input[..4].copy_from_slice(&[0x6170_7865, 0x3320_646e, 0x7962_2d32, 0x6b20_6574]);
        input[4..12].copy_from_slice(key);
        input[12] = block as u32;
        input[13] = (block >> 32) as u32;
        let mut x = input;
        let quarter = |x: &mut [u32; 16], a: usize, b: usize, c: usize, d: usize| {
            x[a] = x[a].wrapping_add(x[b]);
            x[d] = (x[d] ^ x[a]).rotate_left(16);
            x[c] = x[c].wrapping_add(x[d]);
            x[b] = (x[b] ^ x[c]).rotate_left(12);
            x[a] = x[a].wrapping_add(x[b]);
            x[d] = (x[d] ^ x[a]).rotate_left(8);
            x[c] = x[c].wrapping_add(x[d]);
            x[b] = (x[b] ^ x[c]).rotate_left(7);
        };
        for _ in 0..4 {
            for (a, b, c, d) in [(0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15)] {
                quarter(&mut x, a, b, c, d);
            }
            for (a, b, c, d) in [(0, 5, 10, 15), (1, 6, 11, 12), (2, 7, 8, 13), (3, 4, 9, 14)] {
                quarter(&mut x, a, b, c, d);
            }
        }
        std::array::from_fn(|i| x[i].wrapping_add(input[i]))
    }

    /// The kernel's value `k` of `stream`, as `draw.cu` computes it.
    fn kernel_value(stream: &Stream, k: usize) -> f64 {
        let w = chacha8_block(&stream.key, (k / 8) as u64);
        let j = k % 8;
        let u = (u64::from(w[2 * j + 1]) << 32) | u64::from(w[2 * j]);
        let v12 = f64::from_bits(0x3FF0_0000_0000_0000 | (u >> 12));
        let a = stream.bound;
        (v12 - 1.0) * (a - -a) + -a
    }

    /// The arithmetic `draw.cu` does is the arithmetic of the host's draw:
    /// the same values, at the stream's start and far into it.
    #[test]
    fn the_kernels_arithmetic_draws_the_hosts_values() {
        for (seed, id, std) in [
            (0, TensorId::Embedding, 1.0),
            (7, TensorId::Proj { layer: 3, which: 5 }, 0.03),
        ] {
            let draw = Draw {
                id,
                len: 1 << 20,
                std,
            };
            let stream = draw.stream(seed);
            for start in [0usize, 5, 8, 1_000_003] {
                let mut host = vec![0.0f64; 21];
                uniform_into(seed, id, std, start, &mut host, |v| v);
                let device: Vec<f64> = (start..start + 21)
                    .map(|k| kernel_value(&stream, k))
                    .collect();
                assert_eq!(host, device, "seed {seed} {id:?} from {start}");
            }
        }
    }

    #[test]
    fn the_host_roundings_are_the_stores_of_each_format() {
        let x = 0.123_456_789_012_345_f64;
        assert_eq!(f32::from_f64(x), x as f32);
        assert_eq!(u16::from_f64(x), half::f16::from_f32(x as f32).to_bits());
        assert_eq!(Bf16::from_f64(x), Bf16::from_f32(x as f32));
    }
}
