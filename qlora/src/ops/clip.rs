//! Launchers for `kernels/clip.cu`: global gradient-norm clipping on the device,
//! with no device-to-host copy:
//!
//! ```text
//! S     = sum_t sum_i g_ti^2                       (squared_sum, f64, fixed order)
//! scale = min(1, max_norm / (sqrt(S) + 1e-6))      (scale: a device scalar)
//! g    <- scale * g                                (apply: reads the device scalar)
//! ```

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

use super::launch::{elements, expect_len, vec4_launch, DependentLaunch};
use crate::error::{Error, Result};
use crate::gpu::{GpuContext, TensorTable, THREADS_1D};
use crate::kernels::abi::{Arg, Signature, Signatures};

/// The module of what the training step runs: [`squared_sum_table`] and
/// [`scale`] (AdamW applies the scale).
pub const MODULE: &str = "clip";
/// The module of [`squared_sum`] (tensor by tensor) and [`apply`].
pub const SINGLE_MODULE: &str = "clip_single";

const FINAL: Signature = (
    "squared_sum_final_f64",
    &[Arg::Ptr, Arg::I32, Arg::Ptr, Arg::I32],
);

/// Kernel argument lists by module, checked against the compiled PTX by a
/// unit test. Both modules hold the final sum.
pub const SIGNATURES: &[(&str, Signatures)] = &[
    (
        MODULE,
        &[
            (
                "squared_sum_multi_partial_f32",
                &[Arg::Ptr, Arg::Ptr, Arg::I32, Arg::Ptr],
            ),
            FINAL,
            ("clip_scale_f32", &[Arg::Ptr, Arg::Ptr, Arg::F32, Arg::I32]),
        ],
    ),
    (
        SINGLE_MODULE,
        &[
            (
                "squared_sum_partial_f32",
                &[Arg::Ptr, Arg::Ptr, Arg::I32, Arg::I32],
            ),
            FINAL,
            ("clip_apply_f32", &[Arg::Ptr, Arg::Ptr, Arg::I32]),
        ],
    ),
];

/// Blocks (and partials) of [`squared_sum_table`]: a fixed grid, so the
/// summation order is the same on every run; two blocks per SM of an H100/H200.
pub const TABLE_PARTIALS: usize = 264;

/// At most this many partial sums (blocks) per tensor: two blocks per SM of
/// an H100/H200.
const MAX_PARTIALS_PER_TENSOR: usize = 264;

/// Threads of the final kernel's one block.
const FINAL_THREADS: u32 = 256;

/// float4s each thread of `squared_sum_partial_f32` loads before it sums
/// any (the kernel's `SQ_UNROLL`).
const SQUARED_SUM_UNROLL: usize = 4;
/// Threads per block of `squared_sum_partial_f32`.
const SQUARED_SUM_THREADS: u32 = 512;

/// Blocks (and so partial sums) of the squared sum of a tensor of `n` values:
/// one thread per [`SQUARED_SUM_UNROLL`] float4s, which a thread loads
/// before it sums any, at most [`MAX_PARTIALS_PER_TENSOR`] blocks. So a
/// tensor of up to `264 x 512 x 16` floats (2.16 M) is read in one trip to
/// memory: a grid capped a few blocks short of that sends some threads a
/// second time, and the final sum waits for them. Other block shapes
/// measured no faster (the bandwidth trials and the book's lab history
/// hold the figures).
fn partials_for(n: usize) -> usize {
    n.div_ceil(4 * SQUARED_SUM_UNROLL * SQUARED_SUM_THREADS as usize)
        .clamp(1, MAX_PARTIALS_PER_TENSOR)
}

/// The per-block partial sums of [`squared_sum`] over a fixed list of tensor
/// lengths. The grid of every
/// launch is derived from these lengths alone, so the reduction order (and
/// the result, bit for bit) depends on nothing else.
pub struct SquaredSumWorkspace {
    lens: Vec<usize>,
    partials: CudaSlice<f64>,
}

impl SquaredSumWorkspace {
    /// Scratch for tensors of the given lengths, in the order they will be passed.
    pub fn new(gpu: &GpuContext, lens: &[usize]) -> Result<Self> {
        let total: usize = lens.iter().map(|&n| partials_for(n)).sum();
        Ok(SquaredSumWorkspace {
            lens: lens.to_vec(),
            partials: gpu.zeros(total.max(1))?,
        })
    }
}

/// The [`TABLE_PARTIALS`] partial sums of [`squared_sum_table`].
pub struct TableSumWorkspace {
    partials: CudaSlice<f64>,
}

impl TableSumWorkspace {
    pub fn new(gpu: &GpuContext) -> Result<Self> {
        Ok(TableSumWorkspace {
            partials: gpu.zeros(TABLE_PARTIALS)?,
        })
    }
}

/// `sq[0] = sum_t sum_i g_ti^2` over all `tensors`, accumulated in f64 on the
/// device in a fixed order.
pub fn squared_sum(
    gpu: &mut GpuContext,
    tensors: &[CudaView<'_, f32>],
    ws: &mut SquaredSumWorkspace,
    sq: &mut CudaViewMut<'_, f64>,
) -> Result<()> {
    let lens: Vec<usize> = tensors.iter().map(|t| t.len()).collect();
    if lens != ws.lens {
        return Err(Error::ShapeMismatch {
            op: "squared_sum",
            expected: format!("tensors of lengths {:?}", ws.lens),
            got: format!("{lens:?}"),
        });
    }
    expect_len("squared_sum", "sq", sq.len(), &[1])?;
    let f = gpu.function(SINGLE_MODULE, "squared_sum_partial_f32")?;
    let total: usize = lens.iter().map(|&n| partials_for(n)).sum();
    let mut first = 0;
    for t in tensors {
        let n = t.len();
        let blocks = partials_for(n);
        let n_i = elements("squared_sum", n)?;
        let first_i = crate::gpu::to_i32("squared_sum", "partials", first)?;
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (gpu.block_threads(SQUARED_SUM_THREADS), 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = gpu.stream().launch_builder(&f);
        l.arg(t).arg(&mut ws.partials).arg(&n_i).arg(&first_i);
        // SAFETY: squared_sum_partial_f32(const float* x, double* partials,
        // int n, int first): x holds n elements; block b writes
        // partials[first + b] with first + b < total = the workspace's length
        // (sized from the same lengths, checked above). blockDim (512, or 32
        // under the SerialisedLaunch fault) is a multiple of 32, as the
        // reduction needs.
        unsafe { l.launch(cfg) }?;
        first += blocks;
    }
    sum_partials(gpu, SINGLE_MODULE, &ws.partials, total, sq)
}

/// `sq[0]` = the sum of `partials[0, total)` in a fixed order: the final
/// kernel of `module` (the partials' module), launched as the dependent of
/// the partial launch just before it.
fn sum_partials(
    gpu: &mut GpuContext,
    module: &str,
    partials: &CudaSlice<f64>,
    total: usize,
    sq: &mut CudaViewMut<'_, f64>,
) -> Result<()> {
    if total > partials.len() {
        return Err(Error::ShapeMismatch {
            op: "squared_sum",
            expected: format!("at least {total} partials"),
            got: format!("{}", partials.len()),
        });
    }
    let total_i = crate::gpu::to_i32("squared_sum", "partials", total)?;
    let write = i32::from(gpu.faults().written(1) == 1);
    let f = gpu.function(module, "squared_sum_final_f64")?;
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (FINAL_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut l = DependentLaunch::new(gpu, &f);
    l.buf(partials).i32(total_i).buf_mut(sq).i32(write);
    // SAFETY: squared_sum_final_f64(const double* partials, int total,
    // double* sq, int write): partials holds at least total_i values
    // (checked above), sq one (checked by the callers); one block of FINAL_THREADS, a multiple of 32.
    // The kernel waits for its predecessor (the last partial launch, which
    // itself ran after the earlier ones in stream order) before it reads.
    unsafe { l.launch(cfg) }
}

/// `sq[0] = sum_i ||g_i||^2` over every tensor of `table` (one column: the
/// tensors themselves), in two launches whatever the number of tensors:
/// [`TABLE_PARTIALS`] block partials, then their sum.
pub fn squared_sum_table(
    gpu: &mut GpuContext,
    table: &TensorTable,
    ws: &mut TableSumWorkspace,
    sq: &mut CudaViewMut<'_, f64>,
) -> Result<()> {
    if table.columns != 1 {
        return Err(Error::ShapeMismatch {
            op: "squared_sum",
            expected: "a one-column table".into(),
            got: format!("{} columns", table.columns),
        });
    }
    expect_len("squared_sum", "sq", sq.len(), &[1])?;
    let n = crate::gpu::to_i32("squared_sum", "tensors", table.tensors)?;
    let f = gpu.function(MODULE, "squared_sum_multi_partial_f32")?;
    let cfg = LaunchConfig {
        grid_dim: (TABLE_PARTIALS as u32, 1, 1),
        block_dim: (THREADS_1D, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(&table.ptrs)
        .arg(&table.offsets)
        .arg(&n)
        .arg(&mut ws.partials);
    // SAFETY: squared_sum_multi_partial_f32(const unsigned long long* ptrs,
    // const long long* offsets, int n_tensors, double* partials): the table holds n_tensors addresses of
    // live f32 tensors whose lengths are the offsets' differences
    // (TensorTable's owner keeps them alive), so every read is in bounds; the
    // grid is exactly TABLE_PARTIALS blocks, one partial each, in a workspace
    // of TABLE_PARTIALS; THREADS_1D is a multiple of 32 as the reduction
    // needs.
    unsafe { l.launch(cfg) }?;
    sum_partials(gpu, MODULE, &ws.partials, TABLE_PARTIALS, sq)
}

/// `scale[0] = min(1, max_norm / (sqrt(sq[0]) + 1e-6))`, device to device.
pub fn scale(
    gpu: &mut GpuContext,
    sq: &CudaView<'_, f64>,
    max_norm: f64,
    scale: &mut CudaViewMut<'_, f32>,
) -> Result<()> {
    if !(max_norm.is_finite() && max_norm > 0.0) {
        return Err(Error::InvalidArgument {
            op: "clip_scale",
            message: format!("max_norm must be a finite number > 0, got {max_norm}"),
        });
    }
    expect_len("clip_scale", "sq", sq.len(), &[1])?;
    expect_len("clip_scale", "scale", scale.len(), &[1])?;
    let write = i32::from(gpu.faults().written(1) == 1);
    let max_norm_f = max_norm as f32;
    let f = gpu.function(MODULE, "clip_scale_f32")?;
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (32, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(sq).arg(scale).arg(&max_norm_f).arg(&write);
    // SAFETY: clip_scale_f32(const double* sq, float* scale, float max_norm,
    // int write): sq and scale hold one element each (checked above); only
    // thread 0 of block 0 reads and writes.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// `g <- scale[0] * g`, in place; the scale is read on the device.
pub fn apply(
    gpu: &mut GpuContext,
    g: &mut CudaViewMut<'_, f32>,
    scale: &CudaView<'_, f32>,
) -> Result<()> {
    expect_len("clip_apply", "scale", scale.len(), &[1])?;
    let Some((n_i, cfg)) = vec4_launch(gpu, "clip_apply", g.len())? else {
        return Ok(());
    };
    let f = gpu.function(SINGLE_MODULE, "clip_apply_f32")?;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(g).arg(scale).arg(&n_i);
    // SAFETY: clip_apply_f32(float* g, const float* scale, int n): g holds
    // n >= n_i elements, scale one (checked above); g and scale are distinct
    // buffers (a mutable and a shared borrow).
    unsafe { l.launch(cfg) }?;
    Ok(())
}
