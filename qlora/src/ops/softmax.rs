//! Launchers for `kernels/softmax.cu`: causal softmax over `[rows, seq]`, row
//! `r` seeing columns `j <= r % seq`, masked outputs exactly 0.

use cudarc::driver::{CudaView, CudaViewMut, PushKernelArg};

use super::launch::expect_len;
use super::launch::row_threads;
use crate::error::{Error, Result};
use crate::gpu::{launch_config_rows, to_i32, GpuContext};
use crate::kernels::abi::{Arg, Signatures};

pub const MODULE: &str = "softmax";

/// Kernel argument lists, checked against the compiled PTX by a unit test.
pub const SIGNATURES: Signatures = &[
    (
        "softmax_fwd_f32",
        &[Arg::Ptr, Arg::Ptr, Arg::I32, Arg::I32, Arg::I32],
    ),
    (
        "softmax_bwd_f32",
        &[Arg::Ptr, Arg::Ptr, Arg::Ptr, Arg::I32, Arg::I32],
    ),
];

/// Threads per block (at most; fewer for short rows).
const ROW_THREADS: u32 = 256;

/// Checks that `[rows, seq]` is a shape the softmax kernels take (the
/// launchers check it too): seq > 0, both within the kernels' `int`.
pub fn check_shape(rows: usize, seq: usize) -> Result<()> {
    dims(rows, seq).map(|_| ())
}

fn dims(rows: usize, seq: usize) -> Result<(i32, i32)> {
    if seq == 0 {
        return Err(Error::InvalidArgument {
            op: "softmax",
            message: "seq must be > 0".into(),
        });
    }
    Ok((
        to_i32("softmax", "rows", rows)?,
        to_i32("softmax", "seq", seq)?,
    ))
}

/// `y = causal_softmax(x)`, max-subtracted (unless the fault knob
/// [`crate::Faults::softmax_without_max_subtraction`] is on).
pub fn forward(
    gpu: &mut GpuContext,
    x: &CudaView<'_, f32>,
    rows: usize,
    seq: usize,
    y: &mut CudaViewMut<'_, f32>,
) -> Result<()> {
    dims(rows, seq)?;
    expect_len("softmax", "x", x.len(), &[rows, seq])?;
    expect_len("softmax", "y", y.len(), &[rows, seq])?;
    let rows_w = gpu.faults().written(rows);
    if rows_w == 0 {
        return Ok(());
    }
    let (rows_i, seq_i) = dims(rows_w, seq)?;
    let subtract_max: i32 = if gpu.faults().softmax_without_max_subtraction {
        0
    } else {
        1
    };
    let f = gpu.function(MODULE, "softmax_fwd_f32")?;
    let cfg = launch_config_rows(rows_w, row_threads(seq, ROW_THREADS))?;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(x).arg(y).arg(&rows_i).arg(&seq_i).arg(&subtract_max);
    // SAFETY: softmax_fwd_f32(const float* x, float* y, int rows, int seq,
    // int subtract_max): x, y hold rows * seq >= rows_i * seq elements (checked
    // above) and do not alias; one block per row, a multiple of 32 threads.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// `dx_j = y_j (dy_j - <y, dy>)` over the visible columns, 0 above.
pub fn backward(
    gpu: &mut GpuContext,
    y: &CudaView<'_, f32>,
    dy: &CudaView<'_, f32>,
    rows: usize,
    seq: usize,
    dx: &mut CudaViewMut<'_, f32>,
) -> Result<()> {
    dims(rows, seq)?;
    expect_len("softmax", "y", y.len(), &[rows, seq])?;
    expect_len("softmax", "dy", dy.len(), &[rows, seq])?;
    expect_len("softmax", "dx", dx.len(), &[rows, seq])?;
    let rows_w = gpu.faults().written(rows);
    if rows_w == 0 {
        return Ok(());
    }
    let (rows_i, seq_i) = dims(rows_w, seq)?;
    let f = gpu.function(MODULE, "softmax_bwd_f32")?;
    let cfg = launch_config_rows(rows_w, row_threads(seq, ROW_THREADS))?;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(y).arg(dy).arg(dx).arg(&rows_i).arg(&seq_i);
    // SAFETY: softmax_bwd_f32(const float* y, const float* dy, float* dx,
    // int rows, int seq): all hold rows * seq >= rows_i * seq elements; dx
    // aliases neither input; one block per row, a multiple of 32 threads.
    unsafe { l.launch(cfg) }?;
    Ok(())
}
