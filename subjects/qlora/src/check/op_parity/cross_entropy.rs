//! `op_parity` of `cross_entropy`: the launchers of `qlora::ops::cross_entropy` against the oracle.

use super::compare::{case_rng, compare, compare_written, uniform, widen, Case, Comparison};
use crate::check::op::Pass;
use crate::check::params::Precision;
use crate::error::Result;
use crate::reference::cross_entropy as refop;
use cudarc::driver::CudaSlice;
use qlora::gpu::GpuContext;
use qlora::ops::cast::Bf16;
use qlora::ops::cross_entropy::*;
use rand::Rng;

/// `op_parity` of cross-entropy for one `{rows, vocab}` shape: forward compares
/// the per-row losses and the mean, backward the logit gradient. Forward at
/// precision `bf16` runs the bf16 head's fused kernel ([`fused_bf16`]) on
/// logits rounded to bf16, in two chunks of rows as the step runs it, and
/// compares its loss rows, their mean and the gradient it leaves in place
/// (against the reference rounded to bf16).
pub fn parity(gpu: &mut GpuContext, case: &Case<'_>) -> Result<Comparison> {
    let rows = case.shape.dim("rows");
    let vocab = case.shape.dim("vocab");
    let mut rng = case_rng(case.seed);
    let logits = uniform(&mut rng, rows * vocab, -6.0, 6.0);
    let vocab_u = u32::try_from(vocab).unwrap_or(u32::MAX);
    let targets: Vec<u32> = (0..rows).map(|_| rng.random_range(0..vocab_u)).collect();
    let d_logits = gpu.upload(&logits)?;
    let d_targets = gpu.upload(&targets)?;
    if case.pass == Pass::Forward && case.precision == Precision::Bf16 {
        return fused_parity(gpu, &logits, &targets, rows, vocab);
    }
    let x = widen(&logits);
    match case.pass {
        Pass::Forward => {
            let want_rows = refop::row_losses(&x, rows, vocab, &targets)?;
            let want_mean = refop::forward(&x, rows, vocab, &targets)?;
            let (losses, loss, _) = run_forward(gpu, &d_logits, &d_targets, rows, vocab)?;
            let c_rows = compare(&gpu.download(&losses)?, &want_rows);
            let c_mean = compare(&gpu.download(&loss)?, &[want_mean]);
            Ok(c_rows.merge(c_mean))
        }
        Pass::Backward => {
            let want = refop::backward(&x, rows, vocab, &targets)?;
            // The backward reads the row stats its forward wrote, as in the step.
            let (_, _, stats) = run_forward(gpu, &d_logits, &d_targets, rows, vocab)?;
            let mut d = gpu.poisoned(rows * vocab)?;
            backward(
                gpu,
                &d_logits.as_view(),
                rows,
                vocab,
                &d_targets.as_view(),
                &stats,
                &mut d.as_view_mut(),
            )?;
            Ok(compare(&gpu.download(&d)?, &want))
        }
    }
}

/// The forward on the device: per-row losses and their mean (both
/// poison-filled first, so an unwritten value shows) and the row stats.
fn run_forward(
    gpu: &mut GpuContext,
    logits: &CudaSlice<f32>,
    targets: &CudaSlice<u32>,
    rows: usize,
    vocab: usize,
) -> Result<(CudaSlice<f32>, CudaSlice<f32>, RowStats)> {
    let mut losses = gpu.poisoned(rows)?;
    let mut loss = gpu.poisoned(1)?;
    let mut stats = RowStats::new(gpu, rows)?;
    forward(
        gpu,
        &logits.as_view(),
        rows,
        vocab,
        &targets.as_view(),
        &mut losses.as_view_mut(),
        &mut loss.as_view_mut(),
        &mut stats,
    )?;
    Ok((losses, loss, stats))
}

/// [`fused_bf16`] over `logits` rounded to bf16: the first half of the rows
/// (rounded up), then the rest, each launch told the whole batch's rows;
/// then [`mean`] of the loss rows.
fn fused_parity(
    gpu: &mut GpuContext,
    logits: &[f32],
    targets: &[u32],
    rows: usize,
    vocab: usize,
) -> Result<Comparison> {
    let x16: Vec<Bf16> = logits.iter().map(|&v| Bf16::from_f32(v)).collect();
    let x: Vec<f64> = x16.iter().map(|b| f64::from(b.to_f32())).collect();
    let want_rows = refop::row_losses(&x, rows, vocab, targets)?;
    let want_mean = refop::forward(&x, rows, vocab, targets)?;
    let want_grad = refop::backward(&x, rows, vocab, targets)?;
    let mut d_x = gpu.upload(&x16)?;
    let d_targets = gpu.upload(targets)?;
    let mut losses = gpu.poisoned(rows)?;
    let mut loss = gpu.poisoned(1)?;
    let first = rows.div_ceil(2);
    for (r0, n) in [(0, first), (first, rows - first)] {
        if n == 0 {
            continue;
        }
        fused_bf16(
            gpu,
            &mut d_x.slice_mut(r0 * vocab..(r0 + n) * vocab),
            (n, vocab),
            rows,
            &d_targets.slice(r0..r0 + n),
            &mut losses.slice_mut(r0..r0 + n),
        )?;
    }
    mean(gpu, &losses.as_view(), &mut loss.as_view_mut())?;
    let c_rows = compare(&gpu.download(&losses)?, &want_rows);
    let c_mean = compare(&gpu.download(&loss)?, &[want_mean]);
    let c_grad = compare_written(&gpu.download(&d_x)?, &want_grad);
    Ok(c_rows.merge(c_mean).merge(c_grad))
}
