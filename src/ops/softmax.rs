//! Launchers for `kernels/softmax.cu`: causal softmax over `[rows, seq]`, row
//! `r` seeing columns `j <= r % seq`, masked outputs exactly 0.

use cudarc::driver::{CudaView, CudaViewMut, PushKernelArg};

use super::parity::{
    case_rng, compare, row_threads, uniform, widen, written, Arg, Case, Comparison, Signatures,
};
use crate::check::op::Pass;
use crate::error::{Error, Result};
use crate::gpu::{launch_config_rows, to_i32, GpuContext};
use crate::mutant::Mutant;
use crate::reference::elementwise::expect_len;
use crate::reference::softmax as refop;

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

/// `y = causal_softmax(x)`, max-subtracted (unless the fault
/// [`Mutant::SoftmaxWithoutMaxSubtraction`] is injected).
pub fn forward(
    gpu: &mut GpuContext,
    x: &CudaView<'_, f32>,
    rows: usize,
    seq: usize,
    y: &mut CudaViewMut<'_, f32>,
    fault: Option<Mutant>,
) -> Result<()> {
    dims(rows, seq)?;
    expect_len("softmax", "x", x.len(), &[rows, seq])?;
    expect_len("softmax", "y", y.len(), &[rows, seq])?;
    let rows_w = written(rows, fault);
    if rows_w == 0 {
        return Ok(());
    }
    let (rows_i, seq_i) = dims(rows_w, seq)?;
    let subtract_max: i32 = if fault == Some(Mutant::SoftmaxWithoutMaxSubtraction) {
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
    fault: Option<Mutant>,
) -> Result<()> {
    dims(rows, seq)?;
    expect_len("softmax", "y", y.len(), &[rows, seq])?;
    expect_len("softmax", "dy", dy.len(), &[rows, seq])?;
    expect_len("softmax", "dx", dx.len(), &[rows, seq])?;
    let rows_w = written(rows, fault);
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

/// Logits of a case. With `large`, odd rows (and a lone row) span [-1e4, 1e4],
/// where `exp` overflows without the max subtraction; other rows span [-4, 4].
fn logits(rng: &mut rand_chacha::ChaCha8Rng, rows: usize, seq: usize, large: bool) -> Vec<f32> {
    let mut x = Vec::with_capacity(rows * seq);
    for r in 0..rows {
        let range = if large && (r % 2 == 1 || rows == 1) {
            1e4
        } else {
            4.0
        };
        x.extend(uniform(rng, seq, -range, range));
    }
    x
}

/// `op_parity` of the causal softmax for one `{rows, seq}` shape.
pub fn parity(gpu: &mut GpuContext, case: &Case<'_>) -> Result<Comparison> {
    let rows = case.shape.dim("rows");
    let seq = case.shape.dim("seq");
    let n = rows * seq;
    let mut rng = case_rng(case.seed);
    let fault = case.mutant;
    // The backward gets moderate logits only: near one-hot rows make
    // y (dy - <y, dy>) a cancellation that says nothing about the kernel.
    let x = logits(&mut rng, rows, seq, case.pass == Pass::Forward);
    match case.pass {
        Pass::Forward => {
            let want = refop::forward(&widen(&x), rows, seq)?;
            let d_x = gpu.upload(&x)?;
            let mut y = gpu.poisoned(n)?;
            forward(gpu, &d_x.as_view(), rows, seq, &mut y.as_view_mut(), fault)?;
            Ok(compare(&gpu.download(&y)?, &want))
        }
        Pass::Backward => {
            // y is a real softmax output (rounded to f32), as in training.
            let y_f32: Vec<f32> = refop::forward(&widen(&x), rows, seq)?
                .iter()
                .map(|&v| v as f32)
                .collect();
            let dy = uniform(&mut rng, n, -1.0, 1.0);
            let want = refop::backward(&widen(&y_f32), &widen(&dy), rows, seq)?;
            let d_y = gpu.upload(&y_f32)?;
            let d_dy = gpu.upload(&dy)?;
            let mut dx = gpu.poisoned(n)?;
            backward(
                gpu,
                &d_y.as_view(),
                &d_dy.as_view(),
                rows,
                seq,
                &mut dx.as_view_mut(),
                fault,
            )?;
            Ok(compare(&gpu.download(&dx)?, &want))
        }
    }
}
