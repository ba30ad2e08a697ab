//! Launchers for `kernels/cross_entropy.cu`: per-row loss
//! `loss_r = lse(x_r) - x_r[t_r]` (max-shifted), their mean summed in a fixed
//! order, and the logit gradient `(softmax(x_r) - onehot(t_r)) / rows`.

use cudarc::driver::{CudaView, CudaViewMut, LaunchConfig, PushKernelArg};
use rand::Rng;

use super::parity::{
    case_rng, compare, row_threads, uniform, widen, written, Arg, Case, Comparison, Signatures,
};
use crate::check::op::Pass;
use crate::error::{Error, Result};
use crate::gpu::{to_i32, GpuContext};
use crate::mutant::Mutant;
use crate::reference::cross_entropy as refop;
use crate::reference::elementwise::expect_len;

pub const MODULE: &str = "cross_entropy";

/// Kernel argument lists, checked against the compiled PTX by a unit test.
pub const SIGNATURES: Signatures = &[
    (
        "cross_entropy_fwd_f32",
        &[Arg::Ptr, Arg::Ptr, Arg::Ptr, Arg::I32, Arg::I32],
    ),
    ("cross_entropy_mean_f32", &[Arg::Ptr, Arg::Ptr, Arg::I32]),
    (
        "cross_entropy_bwd_f32",
        &[Arg::Ptr, Arg::Ptr, Arg::Ptr, Arg::I32, Arg::I32, Arg::F32],
    ),
];

/// Threads per block of the row kernels: rows are long (up to 151936 logits).
const ROW_THREADS: u32 = 1024;
/// Threads of the one-block mean kernel.
const MEAN_THREADS: u32 = 256;

fn dims(rows: usize, vocab: usize) -> Result<(i32, i32)> {
    if vocab == 0 || rows == 0 {
        return Err(Error::InvalidArgument {
            op: "cross_entropy",
            message: format!("rows and vocab must be > 0, got {rows} and {vocab}"),
        });
    }
    Ok((
        to_i32("cross_entropy", "rows", rows)?,
        to_i32("cross_entropy", "vocab", vocab)?,
    ))
}

/// Per-row losses into `losses` `[rows]` and their mean into `loss` `[1]`.
/// A target `>= vocab` gives that row (and so the mean) NaN: the targets live
/// on the device, so they are checked there.
#[allow(clippy::too_many_arguments)]
pub fn forward(
    gpu: &mut GpuContext,
    logits: &CudaView<'_, f32>,
    rows: usize,
    vocab: usize,
    targets: &CudaView<'_, u32>,
    losses: &mut CudaViewMut<'_, f32>,
    loss: &mut CudaViewMut<'_, f32>,
    fault: Option<Mutant>,
) -> Result<()> {
    let (rows_i, vocab_i) = dims(rows, vocab)?;
    expect_len("cross_entropy", "logits", logits.len(), &[rows, vocab])?;
    expect_len("cross_entropy", "targets", targets.len(), &[rows])?;
    expect_len("cross_entropy", "losses", losses.len(), &[rows])?;
    expect_len("cross_entropy", "loss", loss.len(), &[1])?;
    // Under the fault the last row's loss is left unwritten; the mean still
    // reads it (it is the mean over all rows).
    let rows_w = written(rows, fault);
    if rows_w > 0 {
        let rows_w_i = to_i32("cross_entropy", "rows", rows_w)?;
        let f = gpu.function(MODULE, "cross_entropy_fwd_f32")?;
        let cfg = gpu.launch_rows(rows_w, row_threads(vocab, ROW_THREADS))?;
        let mut l = gpu.stream().launch_builder(&f);
        l.arg(logits)
            .arg(targets)
            .arg(&mut *losses)
            .arg(&rows_w_i)
            .arg(&vocab_i);
        // SAFETY: cross_entropy_fwd_f32(const float* logits, const unsigned int*
        // targets, float* losses, int rows, int vocab): logits hold rows * vocab
        // elements, targets and losses rows >= rows_w_i (checked above); the
        // kernel indexes logits by a target only when it is < vocab.
        unsafe { l.launch(cfg) }?;
    }
    let f = gpu.function(MODULE, "cross_entropy_mean_f32")?;
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (MEAN_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let losses_view = losses.as_view();
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(&losses_view).arg(loss).arg(&rows_i);
    // SAFETY: cross_entropy_mean_f32(const float* losses, float* out, int rows):
    // losses hold rows elements, out one (checked above); one block.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// `dlogits_r = (softmax(x_r) - onehot(t_r)) / rows`, `[rows, vocab]`.
pub fn backward(
    gpu: &mut GpuContext,
    logits: &CudaView<'_, f32>,
    rows: usize,
    vocab: usize,
    targets: &CudaView<'_, u32>,
    dlogits: &mut CudaViewMut<'_, f32>,
    fault: Option<Mutant>,
) -> Result<()> {
    dims(rows, vocab)?;
    expect_len("cross_entropy", "logits", logits.len(), &[rows, vocab])?;
    expect_len("cross_entropy", "targets", targets.len(), &[rows])?;
    expect_len("cross_entropy", "dlogits", dlogits.len(), &[rows, vocab])?;
    let rows_w = written(rows, fault);
    if rows_w == 0 {
        return Ok(());
    }
    let rows_w_i = to_i32("cross_entropy", "rows", rows_w)?;
    let vocab_i = to_i32("cross_entropy", "vocab", vocab)?;
    let grad_scale = (1.0 / rows as f64) as f32;
    let f = gpu.function(MODULE, "cross_entropy_bwd_f32")?;
    let cfg = gpu.launch_rows(rows_w, row_threads(vocab, ROW_THREADS))?;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(logits)
        .arg(targets)
        .arg(dlogits)
        .arg(&rows_w_i)
        .arg(&vocab_i)
        .arg(&grad_scale);
    // SAFETY: cross_entropy_bwd_f32(const float* logits, const unsigned int*
    // targets, float* dlogits, int rows, int vocab, float grad_scale): logits
    // and dlogits hold rows * vocab elements, targets rows >= rows_w_i (checked
    // above); dlogits aliases no input.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// `op_parity` of cross-entropy for one `{rows, vocab}` shape: forward compares
/// the per-row losses and the mean, backward the logit gradient.
pub fn parity(gpu: &mut GpuContext, case: &Case<'_>) -> Result<Comparison> {
    let rows = case.shape.dim("rows");
    let vocab = case.shape.dim("vocab");
    let mut rng = case_rng(case.seed);
    let logits = uniform(&mut rng, rows * vocab, -6.0, 6.0);
    let vocab_u = u32::try_from(vocab).unwrap_or(u32::MAX);
    let targets: Vec<u32> = (0..rows).map(|_| rng.random_range(0..vocab_u)).collect();
    let d_logits = gpu.upload(&logits)?;
    let d_targets = gpu.upload(&targets)?;
    let x = widen(&logits);
    match case.pass {
        Pass::Forward => {
            let want_rows = refop::row_losses(&x, rows, vocab, &targets)?;
            let want_mean = refop::forward(&x, rows, vocab, &targets)?;
            let mut losses = gpu.poisoned(rows)?;
            let mut loss = gpu.poisoned(1)?;
            forward(
                gpu,
                &d_logits.as_view(),
                rows,
                vocab,
                &d_targets.as_view(),
                &mut losses.as_view_mut(),
                &mut loss.as_view_mut(),
                case.mutant,
            )?;
            let c_rows = compare(&gpu.download(&losses)?, &want_rows);
            let c_mean = compare(&gpu.download(&loss)?, &[want_mean]);
            Ok(c_rows.merge(c_mean))
        }
        Pass::Backward => {
            let want = refop::backward(&x, rows, vocab, &targets)?;
            let mut d = gpu.poisoned(rows * vocab)?;
            backward(
                gpu,
                &d_logits.as_view(),
                rows,
                vocab,
                &d_targets.as_view(),
                &mut d.as_view_mut(),
                case.mutant,
            )?;
            Ok(compare(&gpu.download(&d)?, &want))
        }
    }
}
