//! `op_parity` of `cross_entropy`: the launchers of `qlora::ops::cross_entropy` against the oracle.

use super::compare::{case_rng, compare, uniform, widen, Case, Comparison};
use crate::check::op::Pass;
use crate::error::Result;
use crate::reference::cross_entropy as refop;
use cudarc::driver::CudaSlice;
use qlora::gpu::GpuContext;
use qlora::ops::cross_entropy::*;
use rand::Rng;

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
