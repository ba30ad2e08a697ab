//! `op_parity` of `softmax`: the launchers of `qlora::ops::softmax` against the oracle.

use super::compare::{case_rng, compare, uniform, widen, Case, Comparison};
use crate::check::op::Pass;
use crate::error::Result;
use crate::reference::softmax as refop;
use qlora::gpu::GpuContext;
use qlora::ops::softmax::*;

/// `op_parity` of the causal softmax for one `{rows, seq}` shape.
pub fn parity(gpu: &mut GpuContext, case: &Case<'_>) -> Result<Comparison> {
    let rows = case.shape.dim("rows");
    let seq = case.shape.dim("seq");
    let n = rows * seq;
    let mut rng = case_rng(case.seed);
    // The backward gets moderate logits only: near one-hot rows make
    // y (dy - <y, dy>) a cancellation that says nothing about the kernel.
    let x = logits(&mut rng, rows, seq, case.pass == Pass::Forward);
    match case.pass {
        Pass::Forward => {
            let want = refop::forward(&widen(&x), rows, seq)?;
            let d_x = gpu.upload(&x)?;
            let mut y = gpu.poisoned(n)?;
            forward(gpu, &d_x.as_view(), rows, seq, &mut y.as_view_mut())?;
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
            )?;
            Ok(compare(&gpu.download(&dx)?, &want))
        }
    }
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
