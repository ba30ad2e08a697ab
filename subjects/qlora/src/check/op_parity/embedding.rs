//! `op_parity` of `embedding`: the launchers of `qlora::ops::embedding` against the oracle.

use super::compare::{case_rng, compare, uniform, widen, Case, Comparison};
use crate::check::op::Pass;
use crate::error::Result;
use crate::reference::embedding as refop;
use qlora::gpu::GpuContext;
use qlora::ops::embedding::*;
use rand::Rng;

/// `op_parity` of the embedding for one `{tokens, vocab, hidden}` shape.
pub fn parity(gpu: &mut GpuContext, case: &Case<'_>) -> Result<Comparison> {
    let ntok = case.shape.dim("tokens");
    let vocab = case.shape.dim("vocab");
    let hidden = case.shape.dim("hidden");
    let mut rng = case_rng(case.seed);
    let toks = tokens(&mut rng, ntok, vocab);
    let d_tok = gpu.upload(&toks)?;
    match case.pass {
        Pass::Forward => {
            let table = uniform(&mut rng, vocab * hidden, -1.0, 1.0);
            let want = refop::forward(&widen(&table), vocab, hidden, &toks)?;
            let d_table = gpu.upload(&table)?;
            let mut y = gpu.poisoned(ntok * hidden)?;
            forward(
                gpu,
                &d_table.as_view(),
                vocab,
                hidden,
                &d_tok.as_view(),
                &mut y.as_view_mut(),
            )?;
            Ok(compare(&gpu.download(&y)?, &want))
        }
        Pass::Backward => {
            let dy = uniform(&mut rng, ntok * hidden, -1.0, 1.0);
            let want = refop::backward(&widen(&dy), vocab, hidden, &toks)?;
            let d_dy = gpu.upload(&dy)?;
            let mut dtable = gpu.poisoned(vocab * hidden)?;
            backward(
                gpu,
                &d_dy.as_view(),
                vocab,
                hidden,
                &d_tok.as_view(),
                &mut dtable.as_view_mut(),
            )?;
            Ok(compare(&gpu.download(&dtable)?, &want))
        }
    }
}

/// Tokens of a case: half drawn from the first 8 ids (so the backward must
/// add repeated tokens), half from the whole vocabulary.
fn tokens(rng: &mut rand_chacha::ChaCha8Rng, ntok: usize, vocab: usize) -> Vec<u32> {
    let small = vocab.min(8) as u32;
    let vocab = u32::try_from(vocab).unwrap_or(u32::MAX);
    (0..ntok)
        .map(|t| {
            if t % 2 == 0 {
                rng.random_range(0..small)
            } else {
                rng.random_range(0..vocab)
            }
        })
        .collect()
}
