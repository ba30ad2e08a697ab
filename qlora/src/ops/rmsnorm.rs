//! Launchers for `kernels/rmsnorm.cu`: RMSNorm over the last dimension,
//! `y_i = x_i gamma_i / sqrt(mean(x^2) + eps)`, its fused residual-add form,
//! and the backward with a deterministic (fixed-order) dgamma reduction.

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

use super::launch::expect_len;
use super::launch::row_threads;
use crate::error::{Error, Result};
use crate::gpu::{launch_config_rows, to_i32, GpuContext};
use crate::kernels::abi::{Arg, Signatures};

/// The forwards' module.
pub const MODULE: &str = "rmsnorm";

/// One build of the backward: its module (which also holds the dgamma
/// final kernel), its kernel, and the packs of four columns each thread
/// holds.
struct BwdBuild {
    module: &'static str,
    symbol: &'static str,
    packs: usize,
}

/// Rows up to [`ONE_PACK_HIDDEN`] wide: one pack per thread.
const BWD_ONE_PACK: BwdBuild = BwdBuild {
    module: "rmsnorm_bwd",
    symbol: "rmsnorm_bwd_f32",
    packs: 1,
};

/// Wider rows, up to [`MAX_HIDDEN`]: [`WIDE_PACKS`] packs per thread.
const BWD_WIDE: BwdBuild = BwdBuild {
    module: "rmsnorm_bwd_wide",
    symbol: "rmsnorm_bwd_wide_f32",
    packs: WIDE_PACKS,
};

/// Widest row the one-pack backward takes: one pack of four columns per
/// thread, at most 1024 threads.
pub const ONE_PACK_HIDDEN: usize = 4 * 1024;

fn bwd_build(hidden: usize) -> &'static BwdBuild {
    if hidden <= ONE_PACK_HIDDEN {
        &BWD_ONE_PACK
    } else {
        &BWD_WIDE
    }
}

/// The backward's module for rows `hidden` wide.
pub fn bwd_module_for(hidden: usize) -> &'static str {
    bwd_build(hidden).module
}

/// The kernels of each module, by module, checked against the compiled PTX
/// by a unit test.
pub const SIGNATURES: &[(&str, Signatures)] = &[
    (MODULE, &[FWD, RESIDUAL_FWD]),
    (
        BWD_ONE_PACK.module,
        &[(BWD_ONE_PACK.symbol, BWD_ARGS), DGAMMA_FINAL],
    ),
    (
        BWD_WIDE.module,
        &[(BWD_WIDE.symbol, BWD_ARGS), DGAMMA_FINAL],
    ),
];

type Signature = (&'static str, &'static [Arg]);

const FWD: Signature = (
    "rmsnorm_fwd_f32",
    &[Arg::Ptr, Arg::Ptr, Arg::Ptr, Arg::I32, Arg::I32, Arg::F32],
);
const RESIDUAL_FWD: Signature = (
    "rmsnorm_residual_fwd_f32",
    &[
        Arg::Ptr,
        Arg::Ptr,
        Arg::Ptr,
        Arg::Ptr,
        Arg::Ptr,
        Arg::I32,
        Arg::I32,
        Arg::F32,
    ],
);
/// Both backward builds take the same arguments.
const BWD_ARGS: &[Arg] = &[
    Arg::Ptr,
    Arg::Ptr,
    Arg::Ptr,
    Arg::Ptr,
    Arg::Ptr,
    Arg::I32,
    Arg::I32,
    Arg::F32,
    Arg::I32,
    Arg::I32,
];
const DGAMMA_FINAL: Signature = (
    "rmsnorm_bwd_dgamma_final_f32",
    &[Arg::Ptr, Arg::Ptr, Arg::I32, Arg::I32, Arg::I32],
);

/// Threads per block of the residual row kernel (at most; fewer for narrow rows).
const ROW_THREADS: u32 = 256;
/// Packs of four columns each thread of the forward holds (`RMS_PACKS`).
const PACKS_PER_THREAD: usize = 4;
/// Packs per thread of the wide backward, `rmsnorm_bwd_wide_f32`, launched
/// with at most [`WIDE_THREADS`] threads; `rmsnorm_bwd_f32` holds one.
const WIDE_PACKS: usize = 8;
const WIDE_THREADS: usize = 256;
/// Widest row: the wide backward's `4 x 8 x 256` columns.
pub const MAX_HIDDEN: usize = 4 * WIDE_PACKS * WIDE_THREADS;
/// At most this many row chunks in the backward (its partials buffer is
/// `chunks x hidden`): one block each, enough blocks to fill an H100/H200.
const MAX_CHUNKS: usize = 256;
/// Rows of a chunk the one-pack backward takes at once (its blockDim.y).
const ROWS_IN_PARALLEL: u32 = 4;
/// Chunk groups of the dgamma final kernel (`DGAMMA_GROUPS`; its blockDim
/// is `32 x 32`).
const FINAL_GROUPS: u32 = 32;

/// The launch of a register-held row kernel over `units` (rows, or row
/// chunks): one block per unit, threads enough for `hidden` columns at
/// `packs` packs of four per thread (the kernel's own count: 4 in the
/// forward, 1 or 8 in the backward); one block in all under the test-only fault
/// [`crate::Faults::serialised_launch`] (the kernel loops over the units).
fn row_loop_config(
    gpu: &GpuContext,
    units: usize,
    hidden: usize,
    packs: usize,
) -> Result<LaunchConfig> {
    let threads = row_threads(hidden.div_ceil(4 * packs), 1024);
    let blocks = if gpu.faults().serialised_launch {
        1
    } else {
        units
    };
    launch_config_rows(blocks, threads)
}

fn check_dims(rows: usize, hidden: usize) -> Result<(i32, i32)> {
    if hidden == 0 || hidden > MAX_HIDDEN {
        return Err(Error::InvalidArgument {
            op: "rmsnorm",
            message: format!("hidden must be in 1..={MAX_HIDDEN}, got {hidden}"),
        });
    }
    Ok((
        to_i32("rmsnorm", "rows", rows)?,
        to_i32("rmsnorm", "hidden", hidden)?,
    ))
}

/// `y = rmsnorm(x) * gamma`; `x`, `y` are `[rows, hidden]`, `gamma` `[hidden]`.
#[allow(clippy::too_many_arguments)]
pub fn forward(
    gpu: &mut GpuContext,
    x: &CudaView<'_, f32>,
    gamma: &CudaView<'_, f32>,
    rows: usize,
    hidden: usize,
    eps: f64,
    y: &mut CudaViewMut<'_, f32>,
) -> Result<()> {
    check_dims(rows, hidden)?;
    expect_len("rmsnorm", "x", x.len(), &[rows, hidden])?;
    expect_len("rmsnorm", "gamma", gamma.len(), &[hidden])?;
    expect_len("rmsnorm", "y", y.len(), &[rows, hidden])?;
    let rows_w = gpu.faults().written(rows);
    if rows_w == 0 {
        return Ok(());
    }
    let (rows_i, hidden_i) = check_dims(rows_w, hidden)?;
    let eps_f = eps as f32;
    let f = gpu.function(MODULE, "rmsnorm_fwd_f32")?;
    // Few threads, four packs each: one row per block keeps plenty of
    // blocks in flight.
    let cfg = row_loop_config(gpu, rows_w, hidden, PACKS_PER_THREAD)?;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(x)
        .arg(gamma)
        .arg(y)
        .arg(&rows_i)
        .arg(&hidden_i)
        .arg(&eps_f);
    // SAFETY: rmsnorm_fwd_f32(const float* x, const float* gamma, float* y,
    // int rows, int hidden, float eps): x, y hold rows * hidden >= rows_i *
    // hidden elements and gamma hidden (checked above); blocks loop over the
    // rows; blockDim is a multiple of 32 <= 1024, as the block reduction
    // needs, with 4 * RMS_PACKS * blockDim >= hidden, as the kernel needs.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// Fused residual add + RMSNorm: `h = a + b` (stored: it is the next residual
/// stream), `y = rmsnorm(h) * gamma`, in one pass over `a` and `b`.
#[allow(clippy::too_many_arguments)]
pub fn forward_residual(
    gpu: &mut GpuContext,
    a: &CudaView<'_, f32>,
    b: &CudaView<'_, f32>,
    gamma: &CudaView<'_, f32>,
    rows: usize,
    hidden: usize,
    eps: f64,
    h: &mut CudaViewMut<'_, f32>,
    y: &mut CudaViewMut<'_, f32>,
) -> Result<()> {
    check_dims(rows, hidden)?;
    for (what, len) in [
        ("a", a.len()),
        ("b", b.len()),
        ("h", h.len()),
        ("y", y.len()),
    ] {
        expect_len("rmsnorm", what, len, &[rows, hidden])?;
    }
    expect_len("rmsnorm", "gamma", gamma.len(), &[hidden])?;
    let rows_w = gpu.faults().written(rows);
    if rows_w == 0 {
        return Ok(());
    }
    let (rows_i, hidden_i) = check_dims(rows_w, hidden)?;
    let eps_f = eps as f32;
    let f = gpu.function(MODULE, "rmsnorm_residual_fwd_f32")?;
    let cfg = gpu.launch_rows(rows_w, row_threads(hidden, ROW_THREADS))?;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(a)
        .arg(b)
        .arg(gamma)
        .arg(h)
        .arg(y)
        .arg(&rows_i)
        .arg(&hidden_i)
        .arg(&eps_f);
    // SAFETY: rmsnorm_residual_fwd_f32(const float* a, const float* b,
    // const float* gamma, float* h, float* y, int rows, int hidden, float eps):
    // a, b, h, y hold rows * hidden elements, gamma hidden (checked above);
    // h and y are distinct mutable borrows aliasing no input.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// Scratch of the backward: the per-chunk dgamma partials. Allocated once
/// per shape, so the backward allocates nothing (and can be captured in a
/// CUDA graph).
pub struct BackwardWorkspace {
    rows: usize,
    hidden: usize,
    rows_per_chunk: usize,
    chunks: usize,
    partials: CudaSlice<f32>,
}

impl BackwardWorkspace {
    /// Scratch for `[rows, hidden]`: `rows` floats and `chunks x hidden` floats,
    /// `chunks = ceil(rows / ceil(rows / 64))`.
    pub fn new(gpu: &GpuContext, rows: usize, hidden: usize) -> Result<Self> {
        check_dims(rows, hidden)?;
        let rows_per_chunk = rows.div_ceil(MAX_CHUNKS).max(1);
        let chunks = rows.div_ceil(rows_per_chunk).max(1);
        Ok(BackwardWorkspace {
            rows,
            hidden,
            rows_per_chunk,
            chunks,
            partials: gpu.zeros(chunks * hidden)?,
        })
    }
}

/// Gradients of RMSNorm: `dx` `[rows, hidden]` and `dgamma` `[hidden]`
/// (overwritten, not accumulated). With `u = dy * gamma` and `r` the row's
/// inverse RMS: `dx_i = r u_i - x_i r^3 <u, x> / hidden`,
/// `dgamma_i = sum_rows dy_i x_i r`, summed in a fixed order.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    gpu: &mut GpuContext,
    x: &CudaView<'_, f32>,
    gamma: &CudaView<'_, f32>,
    dy: &CudaView<'_, f32>,
    rows: usize,
    hidden: usize,
    eps: f64,
    dx: &mut CudaViewMut<'_, f32>,
    dgamma: &mut CudaViewMut<'_, f32>,
    ws: &mut BackwardWorkspace,
) -> Result<()> {
    check_dims(rows, hidden)?;
    expect_len("rmsnorm", "x", x.len(), &[rows, hidden])?;
    expect_len("rmsnorm", "dy", dy.len(), &[rows, hidden])?;
    expect_len("rmsnorm", "dx", dx.len(), &[rows, hidden])?;
    expect_len("rmsnorm", "gamma", gamma.len(), &[hidden])?;
    expect_len("rmsnorm", "dgamma", dgamma.len(), &[hidden])?;
    if (ws.rows, ws.hidden) != (rows, hidden) {
        return Err(Error::ShapeMismatch {
            op: "rmsnorm",
            expected: format!("a workspace for [{rows}, {hidden}]"),
            got: format!("one for [{}, {}]", ws.rows, ws.hidden),
        });
    }
    // Under the fault the last row is neither written nor summed into dgamma.
    let rows_w = gpu.faults().written(rows);
    let (rows_i, hidden_i) = check_dims(rows_w, hidden)?;
    let eps_f = eps as f32;
    let per_chunk_i = to_i32("rmsnorm", "rows per chunk", ws.rows_per_chunk)?;
    let chunks_i = to_i32("rmsnorm", "chunks", ws.chunks)?;
    // A block walks a chunk of rows, one pack per thread, so each row's loads
    // spread over as many threads as it has packs; rows wider than 1024 packs
    // take eight packs per thread.
    let build = bwd_build(hidden);
    let packs = build.packs;
    let f = gpu.function(build.module, build.symbol)?;
    let mut cfg = row_loop_config(gpu, ws.chunks, hidden, packs)?;
    if packs == 1 {
        // Up to ROWS_IN_PARALLEL rows of a chunk at once, one row group each.
        let per_row = cfg.block_dim.0;
        cfg.block_dim.1 = (1024 / per_row).clamp(1, ROWS_IN_PARALLEL);
    }
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(x)
        .arg(gamma)
        .arg(dy)
        .arg(&mut *dx)
        .arg(&mut ws.partials);
    l.arg(&rows_i).arg(&hidden_i).arg(&eps_f);
    l.arg(&per_chunk_i).arg(&chunks_i);
    // SAFETY: rmsnorm_bwd{,_wide}_f32(const float* x, const float* gamma, const float*
    // dy, float* dx, float* partials, int rows, int hidden, float eps, int
    // rows_per_chunk, int chunks): x, dy, dx hold rows * hidden >= rows_i *
    // hidden elements, gamma hidden, partials chunks * hidden (the workspace
    // shape is checked above); chunk c touches rows [c * rows_per_chunk,
    // min(rows_i, (c + 1) * rows_per_chunk)) and partials row c; blockDim is
    // (x: a multiple of 32 with 4 * packs * x >= hidden; y: 1, or up to 4
    // row groups for one pack) within the kernel's launch bounds (x * y <=
    // 1024, or 256 for eight packs: hidden <= MAX_HIDDEN, checked).
    unsafe { l.launch(cfg) }?;
    let col_blocks = u32::try_from(hidden.div_ceil(32)).map_err(|_| Error::InvalidArgument {
        op: "rmsnorm",
        message: format!("hidden {hidden} is too wide"),
    })?;
    let final_cfg = LaunchConfig {
        grid_dim: (col_blocks, 1, 1),
        block_dim: (32, FINAL_GROUPS, 1),
        shared_mem_bytes: 0,
    };
    let f = gpu.function(build.module, DGAMMA_FINAL.0)?;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(&ws.partials)
        .arg(dgamma)
        .arg(&hidden_i)
        .arg(&chunks_i)
        .arg(&hidden_i);
    // SAFETY: rmsnorm_bwd_dgamma_final_f32(const float* partials, float* dgamma,
    // int hidden, int chunks, int n_write): blockDim (32, 32) as its shared
    // table needs; reads chunks x hidden partials, writes dgamma[i] for
    // i < hidden (its length, checked above).
    unsafe { l.launch(final_cfg) }?;
    Ok(())
}
