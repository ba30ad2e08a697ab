//! Launchers for `kernels/nf4.cu`: NF4 quantisation and dequantisation
//! (block 64, absmax), and the GEMMs that read NF4 weights directly.
//!
//! Values, code book, tie rule and zero-block rule are those of the host
//! format [`crate::model::nf4`]; only the storage differs: the device packs two
//! codes per byte ([`pack_codes`]), element `e` in byte `e / 2`, low nibble
//! for even `e`, high nibble for odd `e`. `absmax` is f32 (the max of f32
//! values, so exactly the host's).
//!
//! - quantise: `absmax_b = max |w_i|`, `code_i = argmin_c |w_i / absmax_b - CODE_BOOK[c]|`
//! - dequantise: `w'_i = CODE_BOOK[code_i] * absmax_{i / 64}` (f32), or that
//!   product rounded to bf16 (nearest, ties to even) for a bf16 GEMM
//! - forward GEMM: `y[m, n] = x[m, k] deq(W)^T`, `W` stored `[n, k]`
//! - backward GEMM: `dx[m, k] = dy[m, n] deq(W)`

use cudarc::driver::{CudaSlice, CudaViewMut, LaunchConfig, PushKernelArg};

use super::cast::Bf16;
use super::gemm::{grid_dim, to_i64, TILE};
use crate::error::{Error, Result};
use crate::gpu::{to_i32, GpuContext};
use crate::kernels::abi::{Arg, Signatures};
use crate::model::nf4::{Nf4Tensor, BLOCK};

/// The kernel module these launchers use.
pub const MODULE: &str = "nf4";

/// Kernel argument lists in the order the launchers push them, checked
/// against the compiled PTX by a unit test.
pub const SIGNATURES: Signatures = &[
    (
        "nf4_quantize_f32",
        &[Arg::Ptr, Arg::Ptr, Arg::Ptr, Arg::I64, Arg::I64],
    ),
    (
        "nf4_dequantize_f32",
        &[Arg::Ptr, Arg::Ptr, Arg::Ptr, Arg::I64, Arg::I64],
    ),
    (
        "nf4_dequantize_bf16",
        &[
            Arg::Ptr,
            Arg::Ptr,
            Arg::Ptr,
            Arg::I64,
            Arg::I64,
            Arg::Ptr,
            Arg::Ptr,
            Arg::I64,
        ],
    ),
    (
        "nf4_gemm_fwd_f32",
        &[
            Arg::Ptr,
            Arg::Ptr,
            Arg::Ptr,
            Arg::Ptr,
            Arg::I32,
            Arg::I32,
            Arg::I32,
            Arg::I64,
        ],
    ),
    (
        "nf4_gemm_bwd_f32",
        &[
            Arg::Ptr,
            Arg::Ptr,
            Arg::Ptr,
            Arg::Ptr,
            Arg::I32,
            Arg::I32,
            Arg::I32,
            Arg::I64,
        ],
    ),
];

/// Warps (= NF4 blocks) per thread block of `nf4_quantize_f32`.
const QUANTIZE_WARPS: u32 = 8;

/// An NF4 tensor on the device: packed codes and per-block absmax.
pub struct Nf4Device {
    /// `len / 2` bytes, two codes each.
    pub codes: CudaSlice<u8>,
    /// `len / 64` block maxima.
    pub absmax: CudaSlice<f32>,
    /// Number of elements.
    pub len: usize,
}

/// Refuses a length the NF4 layout cannot hold: zero, or not a whole number
/// of 64-element blocks.
pub fn check_len(op: &'static str, len: usize) -> Result<()> {
    if len == 0 || !len.is_multiple_of(BLOCK) {
        return Err(Error::InvalidArgument {
            op,
            message: format!(
                "NF4 length {len} must be a positive multiple of {BLOCK} (the block size)"
            ),
        });
    }
    Ok(())
}

/// Two codes per byte: element `2i` in the low nibble of byte `i`, `2i + 1`
/// in the high nibble. `codes.len()` must be even (it is a multiple of 64).
pub fn pack_codes(codes: &[u8]) -> Vec<u8> {
    codes
        .chunks(2)
        .map(|p| (p[0] & 0x0f) | (p.get(1).copied().unwrap_or(0) & 0x0f) << 4)
        .collect()
}

/// The inverse of [`pack_codes`].
pub fn unpack_codes(packed: &[u8]) -> Vec<u8> {
    packed.iter().flat_map(|&b| [b & 0x0f, b >> 4]).collect()
}

/// Uploads a host [`Nf4Tensor`] (block 64) in the device layout.
pub fn upload(gpu: &GpuContext, t: &Nf4Tensor) -> Result<Nf4Device> {
    check_len("nf4_upload", t.len)?;
    if t.block != BLOCK || t.codes.len() != t.len || t.absmax.len() * BLOCK != t.len {
        return Err(Error::ShapeMismatch {
            op: "nf4_upload",
            expected: format!("{} codes and {} blocks of {BLOCK}", t.len, t.len / BLOCK),
            got: format!(
                "{} codes and {} blocks of {}",
                t.codes.len(),
                t.absmax.len(),
                t.block
            ),
        });
    }
    // The host's absmax is the max of f32 inputs, so the cast is exact
    // for tensors quantised from f32 data.
    let absmax: Vec<f32> = t.absmax.iter().map(|&a| a as f32).collect();
    Ok(Nf4Device {
        codes: gpu.upload(&pack_codes(&t.codes))?,
        absmax: gpu.upload(&absmax)?,
        len: t.len,
    })
}

impl Nf4Device {
    /// Bytes on the device: the packed codes and the f32 block absmax.
    pub fn bytes(&self) -> usize {
        self.codes.len() + 4 * self.absmax.len()
    }

    /// A zeroed tensor of `len` values (codes and absmax), ready for
    /// [`quantize`] to fill; `len` must be a multiple of the block.
    pub fn zeros(gpu: &GpuContext, len: usize) -> Result<Self> {
        check_len("nf4_quantize", len)?;
        Ok(Nf4Device {
            codes: gpu.zeros(len / 2)?,
            absmax: gpu.zeros(len / BLOCK)?,
            len,
        })
    }
}

fn check_device(op: &'static str, t: &Nf4Device) -> Result<()> {
    check_len(op, t.len)?;
    if t.codes.len() * 2 != t.len || t.absmax.len() * BLOCK != t.len {
        return Err(Error::ShapeMismatch {
            op,
            expected: format!("{} code bytes and {} absmax", t.len / 2, t.len / BLOCK),
            got: format!("{} and {}", t.codes.len(), t.absmax.len()),
        });
    }
    Ok(())
}

/// Quantises `w` (length a multiple of 64) into `out`.
pub fn quantize(gpu: &mut GpuContext, w: &CudaSlice<f32>, out: &mut Nf4Device) -> Result<()> {
    let len = gpu.faults().written(w.len());
    quantize_limited(gpu, w, out, len)
}

fn quantize_limited(
    gpu: &mut GpuContext,
    w: &CudaSlice<f32>,
    out: &mut Nf4Device,
    write_limit: usize,
) -> Result<()> {
    check_len("nf4_quantize", w.len())?;
    check_device("nf4_quantize", out)?;
    if out.len != w.len() {
        return Err(Error::ShapeMismatch {
            op: "nf4_quantize",
            expected: format!("an NF4 tensor of {} elements", w.len()),
            got: format!("{}", out.len),
        });
    }
    let n_blocks = w.len() / BLOCK;
    let grid = grid_dim(
        "nf4_quantize",
        "blocks",
        n_blocks.div_ceil(QUANTIZE_WARPS as usize),
        u32::MAX >> 1,
    )?;
    let len = to_i64("nf4_quantize", w.len())?;
    let limit = to_i64("nf4_quantize", write_limit.min(w.len()))?;
    let cfg = LaunchConfig {
        grid_dim: (grid, 1, 1),
        block_dim: (32 * QUANTIZE_WARPS, 1, 1),
        shared_mem_bytes: 0,
    };
    let func = gpu.function(MODULE, "nf4_quantize_f32")?;
    let mut launch = gpu.stream().launch_builder(&func);
    launch
        .arg(w)
        .arg(&mut out.codes)
        .arg(&mut out.absmax)
        .arg(&len)
        .arg(&limit);
    // SAFETY: arguments match `nf4_quantize_f32(const float* w, unsigned
    // char* codes, float* absmax, long long len, long long write_limit)` in
    // order and type. len is a multiple of 64 (checked), codes holds len/2
    // bytes and absmax len/64 floats (checked). Warp `blk` of the grid reads
    // w[64 blk .. 64 blk + 64), writes codes[32 blk .. 32 blk + 32) and
    // absmax[blk], and returns when blk >= len/64; the block is a whole number
    // of warps, as the full-mask shuffles need.
    unsafe { launch.launch(cfg) }?;
    Ok(())
}

/// Dequantises `t` into `out` (`out.len() == t.len`).
pub fn dequantize(gpu: &mut GpuContext, t: &Nf4Device, out: &mut CudaSlice<f32>) -> Result<()> {
    if out.len() != t.len {
        return Err(Error::ShapeMismatch {
            op: "nf4_dequantize",
            expected: format!("{} output elements", t.len),
            got: format!("{}", out.len()),
        });
    }
    let len = gpu.faults().written(out.len());
    dequantize_limited(gpu, t, out, 0, len)
}

/// That `len` values fit an output of `out_len` elements from `first`, and
/// that `first` is a multiple of `align` (the kernel's stores stay aligned).
fn check_target(
    op: &'static str,
    len: usize,
    (out_len, first): (usize, usize),
    align: usize,
) -> Result<()> {
    if first.is_multiple_of(align) && first + len <= out_len {
        return Ok(());
    }
    Err(Error::ShapeMismatch {
        op,
        expected: format!("{len} output elements from a multiple of {align}"),
        got: format!("{out_len} elements from {first}"),
    })
}

/// Dequantises `t` into `out[first .. first + t.len]`: a block of rows of a
/// larger matrix (`first` a multiple of 4, so the kernel's float4 stores stay
/// aligned).
pub fn dequantize_into(
    gpu: &mut GpuContext,
    t: &Nf4Device,
    out: &mut CudaSlice<f32>,
    first: usize,
) -> Result<()> {
    check_target("nf4_dequantize", t.len, (out.len(), first), 4)?;
    dequantize_limited(gpu, t, out, first, t.len)
}

/// Dequantises `t` to bf16 into `out[first .. first + t.len]`:
/// `bf16(CODE_BOOK[code_i] * absmax_b)`, the product rounded once, as the
/// host's `half::bf16::from_f32` rounds it. `first` is a multiple of 8, so
/// the kernel's 16-byte stores stay aligned.
pub fn dequantize_bf16_into(
    gpu: &mut GpuContext,
    t: &Nf4Device,
    out: &mut CudaSlice<Bf16>,
    first: usize,
) -> Result<()> {
    check_target("nf4_dequantize_bf16", t.len, (out.len(), first), 8)?;
    let mut out = out.slice_mut(first..first + t.len);
    launch_bf16(gpu, t, &mut out, None)
}

/// A layer's bf16 q/k/v stack `out = [Wq; Wk; Wv; Aq; Av]` in one launch:
/// `t` (the q, k and v rows) dequantised to bf16 into `out[.. t.len]` as
/// [`dequantize_bf16_into`] does, then the LoRA A tensors `a` and `b` (f32,
/// the same length) rounded to bf16 after them (nearest, ties to even, as
/// [`crate::ops::cast::f32_to_bf16`] rounds). `out` holds exactly those
/// values.
pub fn dequantize_bf16_stack(
    gpu: &mut GpuContext,
    t: &Nf4Device,
    (a, b): (&CudaSlice<f32>, &CudaSlice<f32>),
    out: &mut CudaSlice<Bf16>,
) -> Result<()> {
    // The launch checks `out` against the codes and both rows.
    if a.len() != b.len() {
        return Err(Error::ShapeMismatch {
            op: "nf4_dequantize_bf16",
            expected: "two LoRA A tensors of one length".into(),
            got: format!("{} and {}", a.len(), b.len()),
        });
    }
    launch_bf16(gpu, t, &mut out.as_view_mut(), Some((a, b)))
}

fn dequantize_limited(
    gpu: &mut GpuContext,
    t: &Nf4Device,
    out: &mut CudaSlice<f32>,
    first: usize,
    write_limit: usize,
) -> Result<()> {
    let mut out = out.slice_mut(first..first + t.len);
    launch_f32(gpu, t, &mut out, write_limit)
}

/// Launches `nf4_dequantize_f32` of `t` into `out` (a view of exactly
/// `t.len` floats, starting 16 bytes aligned), writing its first
/// `write_limit` elements, at most one wave of full SMs (the kernel's
/// grid-stride loop takes the rest): a warp per span of 256 elements,
/// float4 stores.
fn launch_f32(
    gpu: &mut GpuContext,
    t: &Nf4Device,
    out: &mut CudaViewMut<'_, f32>,
    write_limit: usize,
) -> Result<()> {
    check_device("nf4_dequantize", t)?;
    let len = to_i64("nf4_dequantize", t.len)?;
    let limit = to_i64("nf4_dequantize", write_limit.min(t.len))?;
    let cfg = gpu.launch_1d_per_sm(t.len.div_ceil(256) * 32, 8);
    let func = gpu.function(MODULE, "nf4_dequantize_f32")?;
    let mut launch = gpu.stream().launch_builder(&func);
    launch
        .arg(&t.codes)
        .arg(&t.absmax)
        .arg(out)
        .arg(&len)
        .arg(&limit);
    // SAFETY: arguments match `nf4_dequantize_f32(const unsigned char*
    // codes, const float* absmax, float* out, long long len, long long
    // write_limit)` in order and type. check_device proved codes holds
    // len/2 bytes and absmax len/64 floats; `out` is a view of exactly len
    // elements (len a multiple of 64). The kernel reads code word w and
    // absmax[w / 8] only for w < len/8 and writes elements below len only.
    // The inputs are whole allocations, so the word loads are aligned; `out`
    // starts at a multiple of 4 floats (checked by the callers), so the
    // float4 stores are aligned. Blocks are THREADS_1D threads, whole warps,
    // as the shuffles need.
    unsafe { launch.launch(cfg) }?;
    Ok(())
}

/// Launches `nf4_dequantize_bf16` of `t` into `out`, a view starting 16
/// bytes aligned of exactly `t.len` values, or with `rows` (a q/k/v
/// stack's LoRA A tensors, of one length) of `t.len` plus both rows. The
/// codes' part is written up to the fault's limit; a warp per 128 code
/// words (four a lane), one 16-byte store a word, and enough threads for
/// the rows' values; at most one wave of full SMs.
fn launch_bf16(
    gpu: &mut GpuContext,
    t: &Nf4Device,
    out: &mut CudaViewMut<'_, Bf16>,
    rows: Option<(&CudaSlice<f32>, &CudaSlice<f32>)>,
) -> Result<()> {
    const OP: &str = "nf4_dequantize_bf16";
    check_device(OP, t)?;
    let rows_len = rows.map_or(0, |(a, _)| a.len());
    if out.len() != t.len + 2 * rows_len {
        return Err(Error::ShapeMismatch {
            op: OP,
            expected: format!("{} output values", t.len + 2 * rows_len),
            got: format!("{}", out.len()),
        });
    }
    let (len, rows_i) = (to_i64(OP, t.len)?, to_i64(OP, rows_len)?);
    let limit = to_i64(OP, gpu.faults().written(t.len))?;
    // One warp per NF4_BF16_WARP_WORDS = 128 code words, or a thread per
    // value of the rows where those are more.
    let threads = ((t.len / 8).div_ceil(128) * 32).max(2 * rows_len);
    let cfg = gpu.launch_1d_per_sm(threads, 8);
    let func = gpu.function(MODULE, OP)?;
    let null = 0u64;
    let mut launch = gpu.stream().launch_builder(&func);
    launch
        .arg(&t.codes)
        .arg(&t.absmax)
        .arg(out)
        .arg(&len)
        .arg(&limit);
    match rows {
        Some((a, b)) => launch.arg(a).arg(b),
        None => launch.arg(&null).arg(&null),
    };
    launch.arg(&rows_i);
    // SAFETY: arguments match `nf4_dequantize_bf16(const unsigned char*
    // codes, const float* absmax, unsigned short* out, long long len, long
    // long write_limit, const float* rows_a, const float* rows_b, long long
    // rows_len)` in order and type (Bf16 is `repr(transparent)` over its
    // bits; a null pointer is 8 zero bytes, with rows_len 0 never read).
    // check_device proved codes holds len/2 bytes and absmax len/64 floats;
    // `out` holds exactly len + 2 rows_len elements (checked above) and each
    // row tensor rows_len floats (the callers check both have one length).
    // The kernel reads code word w and absmax[w / 8] only for w < len/8,
    // the rows only below rows_len, and writes out below len + 2 rows_len
    // only. The inputs are whole allocations, so the word loads are aligned;
    // `out` starts at a multiple of 8 bf16 (checked by the callers), so the
    // 16-byte stores are aligned. Blocks are THREADS_1D threads, whole
    // warps, as the per-warp passes need.
    unsafe { launch.launch(cfg) }?;
    Ok(())
}

/// Which NF4 GEMM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Nf4Gemm {
    /// `y[m, n] = x[m, k] deq(W)^T`.
    Forward,
    /// `dx[m, k] = dy[m, n] deq(W)`.
    Backward,
}

/// `y[m, n] = x[m, k] deq(W)^T` with `W` stored `[n, k]` as NF4.
pub fn gemm_forward(
    gpu: &mut GpuContext,
    x: &CudaSlice<f32>,
    w: &Nf4Device,
    y: &mut CudaSlice<f32>,
    (m, n, k): (usize, usize, usize),
) -> Result<()> {
    let len = gpu.faults().written(y.len());
    nf4_gemm(gpu, Nf4Gemm::Forward, x, w, y, (m, n, k), len)
}

/// `dx[m, k] = dy[m, n] deq(W)` with `W` stored `[n, k]` as NF4: the
/// gradient of [`gemm_forward`] with respect to `x`.
pub fn gemm_backward(
    gpu: &mut GpuContext,
    dy: &CudaSlice<f32>,
    w: &Nf4Device,
    dx: &mut CudaSlice<f32>,
    (m, n, k): (usize, usize, usize),
) -> Result<()> {
    let len = gpu.faults().written(dx.len());
    nf4_gemm(gpu, Nf4Gemm::Backward, dy, w, dx, (m, n, k), len)
}

/// Checks that `(m, n, k)` is a shape the fused NF4 GEMMs take (their
/// launchers check it too): `W` (`[n, k]`) a whole number of NF4 blocks
/// ([`check_len`]), m > 0, every dimension within the kernels' `int`, and
/// m within the grid's y limit (one block row per `TILE` rows).
pub fn check_gemm_shape(op: &'static str, m: usize, n: usize, k: usize) -> Result<()> {
    check_len(op, n.saturating_mul(k))?;
    if m == 0 {
        return Err(Error::InvalidArgument {
            op,
            message: "m must be > 0".into(),
        });
    }
    to_i32(op, "m", m)?;
    to_i32(op, "n", n)?;
    to_i32(op, "k", k)?;
    grid_dim(op, "rows", m.div_ceil(TILE as usize), 65_535).map(|_| ())
}

fn nf4_gemm(
    gpu: &mut GpuContext,
    which: Nf4Gemm,
    input: &CudaSlice<f32>,
    w: &Nf4Device,
    output: &mut CudaSlice<f32>,
    (m, n, k): (usize, usize, usize),
    write_limit: usize,
) -> Result<()> {
    let (op, symbol) = match which {
        Nf4Gemm::Forward => ("nf4_gemm_fwd", "nf4_gemm_fwd_f32"),
        Nf4Gemm::Backward => ("nf4_gemm_bwd", "nf4_gemm_bwd_f32"),
    };
    check_gemm_shape(op, m, n, k)?;
    check_device(op, w)?;
    // Forward reads x[m, k] and writes y[m, n]; backward reads dy[m, n] and
    // writes dx[m, k].
    let (in_cols, out_cols) = match which {
        Nf4Gemm::Forward => (k, n),
        Nf4Gemm::Backward => (n, k),
    };
    if m == 0 || w.len != n * k || input.len() != m * in_cols || output.len() != m * out_cols {
        return Err(Error::ShapeMismatch {
            op,
            expected: format!(
                "W {n}x{k} = {} NF4 values, input {m}x{in_cols}, output {m}x{out_cols}",
                n * k
            ),
            got: format!(
                "W {} values, input {}, output {}",
                w.len,
                input.len(),
                output.len()
            ),
        });
    }
    let m_i = to_i32(op, "m", m)?;
    let n_i = to_i32(op, "n", n)?;
    let k_i = to_i32(op, "k", k)?;
    let limit = to_i64(op, write_limit.min(output.len()))?;
    let cfg = LaunchConfig {
        grid_dim: (
            grid_dim(
                op,
                "output columns",
                out_cols.div_ceil(TILE as usize),
                u32::MAX >> 1,
            )?,
            grid_dim(op, "rows", m.div_ceil(TILE as usize), 65_535)?,
            1,
        ),
        block_dim: (TILE, TILE, 1),
        shared_mem_bytes: 0,
    };
    let func = gpu.function(MODULE, symbol)?;
    let mut launch = gpu.stream().launch_builder(&func);
    launch
        .arg(input)
        .arg(&w.codes)
        .arg(&w.absmax)
        .arg(output)
        .arg(&m_i)
        .arg(&n_i)
        .arg(&k_i)
        .arg(&limit);
    // SAFETY: arguments match `nf4_gemm_fwd_f32(const float* x, const
    // unsigned char* codes, const float* absmax, float* y, int m, int n, int
    // k, long long write_limit)` and `nf4_gemm_bwd_f32(const float* dy, const
    // unsigned char* codes, const float* absmax, float* dx, int m, int n, int
    // k, long long write_limit)` in order and type. The checks above proved
    // W holds n*k elements (n*k/2 code bytes, n*k/64 absmax), the input
    // m*in_cols and the output m*out_cols floats; the kernels guard every
    // load by row < m, the W row < n and column < k, and store only
    // row*out_cols + col < min(m*out_cols, write_limit). The grid is
    // ceil(out_cols/16) x ceil(m/16) blocks of 16x16 threads, the tile the
    // kernels' static shared arrays assume.
    unsafe { launch.launch(cfg) }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemm_shapes_the_kernels_cannot_take_are_refused() {
        assert!(check_gemm_shape("nf4_gemm", 32, 4864, 896).is_ok());
        let e = check_gemm_shape("nf4_gemm", 4, 3, 33)
            .unwrap_err()
            .to_string();
        assert!(e.contains("multiple of 64"), "{e}");
        assert!(check_gemm_shape("nf4_gemm", 0, 64, 64).is_err());
        assert!(check_gemm_shape("nf4_gemm", 1 << 24, 64, 64).is_err());
    }

    #[test]
    fn packing_round_trips_and_puts_even_elements_low() {
        let codes: Vec<u8> = (0..64).map(|i| (i * 7 % 16) as u8).collect();
        let packed = pack_codes(&codes);
        assert_eq!(packed.len(), 32);
        assert_eq!(packed[0], codes[0] | codes[1] << 4);
        assert_eq!(unpack_codes(&packed), codes);
    }

    #[test]
    fn lengths_that_are_not_whole_blocks_are_refused() {
        assert!(check_len("nf4", 128).is_ok());
        for bad in [0, 1, 63, 65, 3 * 33] {
            let e = check_len("nf4", bad).unwrap_err().to_string();
            assert!(e.contains("multiple of 64"), "{e}");
        }
    }

    /// The code book in `nf4.cu` (both the f64 table the code choice uses and
    /// the f32 table dequantisation uses) is the host format's, value for value.
    #[test]
    fn kernel_code_book_is_the_host_code_book() {
        let src = crate::kernels::module("nf4").unwrap().source;
        // The literals of a table, as written (C rounds each one directly).
        let table = |name: &str| -> Vec<String> {
            let start = src.find(name).unwrap();
            let body = &src[start..];
            let body = &body[body.find('{').unwrap() + 1..body.find('}').unwrap()];
            body.split(',')
                .map(|s| s.trim().trim_end_matches('f').to_string())
                .filter(|s| !s.is_empty())
                .collect()
        };
        let f64_table = table("NF4_CODE_BOOK_F64[16]");
        let f32_table = table("NF4_CODE_BOOK_F32[16]");
        assert_eq!(f64_table.len(), 16);
        assert_eq!(f32_table.len(), 16);
        for c in 0..16 {
            let v64: f64 = f64_table[c].parse().unwrap();
            let v32: f32 = f32_table[c].parse().unwrap();
            assert_eq!(v64, crate::model::nf4::CODE_BOOK[c], "code {c}");
            assert_eq!(v32, crate::model::nf4::CODE_BOOK[c] as f32, "code {c}");
        }
        assert!(src.contains(&format!(
            "#define NF4_ZERO_CODE {}",
            crate::model::nf4::ZERO_CODE
        )));
        assert!(src.contains(&format!("#define NF4_BLOCK {BLOCK}")));
    }
}
