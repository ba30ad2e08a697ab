//! Launchers for `kernels/rmsnorm.cu`: RMSNorm over the last dimension,
//! `y_i = x_i gamma_i / sqrt(mean(x^2) + eps)`, its fused residual-add form,
//! and the backward with a deterministic (fixed-order) dgamma reduction.

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

use super::launch::expect_len;
use super::launch::row_threads;
use crate::error::{Error, Result};
use crate::gpu::{to_i32, GpuContext};
use crate::kernels::abi::{Arg, Signatures};

pub const MODULE: &str = "rmsnorm";

/// Kernel argument lists, checked against the compiled PTX by a unit test.
pub const SIGNATURES: Signatures = &[
    (
        "rmsnorm_fwd_f32",
        &[Arg::Ptr, Arg::Ptr, Arg::Ptr, Arg::I32, Arg::I32, Arg::F32],
    ),
    (
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
    ),
    (
        "rmsnorm_bwd_f32",
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
    ),
    (
        "rmsnorm_bwd_dgamma_partial_f32",
        &[
            Arg::Ptr,
            Arg::Ptr,
            Arg::Ptr,
            Arg::Ptr,
            Arg::I32,
            Arg::I32,
            Arg::I32,
        ],
    ),
    (
        "rmsnorm_bwd_dgamma_final_f32",
        &[Arg::Ptr, Arg::Ptr, Arg::I32, Arg::I32, Arg::I32],
    ),
];

/// Threads per block of the row kernels (at most; fewer for narrow rows).
const ROW_THREADS: u32 = 256;
/// Threads per block of the dgamma column kernels.
const COL_THREADS: u32 = 128;
/// At most this many row chunks in the dgamma reduction (its partials buffer
/// is `chunks x hidden`).
const MAX_CHUNKS: usize = 64;

fn check_dims(rows: usize, hidden: usize) -> Result<(i32, i32)> {
    if hidden == 0 {
        return Err(Error::InvalidArgument {
            op: "rmsnorm",
            message: "hidden must be > 0".into(),
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
    let cfg = gpu.launch_rows(rows_w, row_threads(hidden, ROW_THREADS))?;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(x)
        .arg(gamma)
        .arg(y)
        .arg(&rows_i)
        .arg(&hidden_i)
        .arg(&eps_f);
    // SAFETY: rmsnorm_fwd_f32(const float* x, const float* gamma, float* y,
    // int rows, int hidden, float eps): x, y hold rows * hidden >= rows_i *
    // hidden elements and gamma hidden (checked above); one block per row,
    // blockDim a multiple of 32 <= 1024 as the block reduction needs.
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

/// Scratch of the backward: each row's inverse RMS and the per-chunk dgamma
/// partials. Allocated once per shape, so the backward allocates nothing
/// (and can be captured in a CUDA graph).
pub struct BackwardWorkspace {
    rows: usize,
    hidden: usize,
    rows_per_chunk: usize,
    chunks: usize,
    inv_rms: CudaSlice<f32>,
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
            inv_rms: gpu.zeros(rows.max(1))?,
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
    if rows_w > 0 {
        let f = gpu.function(MODULE, "rmsnorm_bwd_f32")?;
        let cfg = gpu.launch_rows(rows_w, row_threads(hidden, ROW_THREADS))?;
        let mut l = gpu.stream().launch_builder(&f);
        l.arg(x)
            .arg(gamma)
            .arg(dy)
            .arg(&mut *dx)
            .arg(&mut ws.inv_rms);
        l.arg(&rows_i).arg(&hidden_i).arg(&eps_f);
        // SAFETY: rmsnorm_bwd_f32(const float* x, const float* gamma,
        // const float* dy, float* dx, float* inv_rms, int rows, int hidden,
        // float eps): x, dy, dx hold rows * hidden elements, gamma hidden,
        // inv_rms rows (the workspace shape is checked above); one block per
        // row with a multiple of 32 threads.
        unsafe { l.launch(cfg) }?;
    }
    let per_chunk_i = to_i32("rmsnorm", "rows per chunk", ws.rows_per_chunk)?;
    let chunks_i = to_i32("rmsnorm", "chunks", ws.chunks)?;
    let col_blocks = u32::try_from(hidden.div_ceil(COL_THREADS as usize)).map_err(|_| {
        Error::InvalidArgument {
            op: "rmsnorm",
            message: format!("hidden {hidden} is too wide"),
        }
    })?;
    let chunks_u = u32::try_from(ws.chunks).unwrap_or(u32::MAX);
    let partial_cfg = LaunchConfig {
        grid_dim: (col_blocks, chunks_u, 1),
        block_dim: (COL_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let f = gpu.function(MODULE, "rmsnorm_bwd_dgamma_partial_f32")?;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(x).arg(dy).arg(&ws.inv_rms).arg(&mut ws.partials);
    l.arg(&rows_i).arg(&hidden_i).arg(&per_chunk_i);
    // SAFETY: rmsnorm_bwd_dgamma_partial_f32(const float* x, const float* dy,
    // const float* inv_rms, float* partials, int rows, int hidden,
    // int rows_per_chunk): grid (ceil(hidden / 128), chunks); chunk c reads rows
    // [c * rows_per_chunk, min(rows, ...)) < rows of x, dy, inv_rms and writes
    // partials[c * hidden + i], i < hidden, inside the chunks x hidden buffer.
    unsafe { l.launch(partial_cfg) }?;
    let final_cfg = LaunchConfig {
        grid_dim: (col_blocks, 1, 1),
        block_dim: (COL_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let f = gpu.function(MODULE, "rmsnorm_bwd_dgamma_final_f32")?;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(&ws.partials)
        .arg(dgamma)
        .arg(&hidden_i)
        .arg(&chunks_i)
        .arg(&hidden_i);
    // SAFETY: rmsnorm_bwd_dgamma_final_f32(const float* partials, float* dgamma,
    // int hidden, int chunks, int n_write): reads chunks x hidden partials,
    // writes dgamma[i] for i < hidden (its length, checked above).
    unsafe { l.launch(final_cfg) }?;
    Ok(())
}
