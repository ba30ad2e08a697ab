//! Launchers for `kernels/embedding.cu`: the gather `y[t, :] = table[tokens[t], :]`
//! and its deterministic scatter-add backward
//! `dtable[v, :] = sum_{t : tokens[t] == v} dy[t, :]` (t ascending, no atomics).

use cudarc::driver::{CudaView, CudaViewMut, PushKernelArg};
use rand::Rng;

use super::parity::{
    case_rng, compare, row_threads, uniform, widen, written, Arg, Case, Comparison, Signatures,
};
use crate::check::op::Pass;
use crate::error::{Error, Result};
use crate::gpu::{launch_config_rows, to_i32, GpuContext};
use crate::mutant::Mutant;
use crate::reference::elementwise::expect_len;
use crate::reference::embedding as refop;

pub const MODULE: &str = "embedding";

/// Kernel argument lists, checked against the compiled PTX by a unit test.
pub const SIGNATURES: Signatures = &[
    (
        "embedding_fwd_f32",
        &[Arg::Ptr, Arg::Ptr, Arg::Ptr, Arg::I32, Arg::I32, Arg::I32],
    ),
    (
        "embedding_bwd_f32",
        &[Arg::Ptr, Arg::Ptr, Arg::Ptr, Arg::I32, Arg::I32, Arg::I32],
    ),
];

/// Threads per block (at most; fewer for narrow rows). The backward kernel's
/// shared match list holds up to 1024 positions, one per thread.
const ROW_THREADS: u32 = 256;

fn check_hidden(hidden: usize) -> Result<()> {
    if hidden == 0 {
        return Err(Error::InvalidArgument {
            op: "embedding",
            message: "hidden must be > 0".into(),
        });
    }
    Ok(())
}

/// `y[t, :] = table[tokens[t], :]`; `table` `[vocab, hidden]`, `y`
/// `[tokens.len(), hidden]`. A token `>= vocab` gives a NaN row: tokens live on
/// the device, so they are checked there rather than copied back.
pub fn forward(
    gpu: &mut GpuContext,
    table: &CudaView<'_, f32>,
    vocab: usize,
    hidden: usize,
    tokens: &CudaView<'_, u32>,
    y: &mut CudaViewMut<'_, f32>,
    fault: Option<Mutant>,
) -> Result<()> {
    check_hidden(hidden)?;
    let ntok = tokens.len();
    expect_len("embedding", "table", table.len(), &[vocab, hidden])?;
    expect_len("embedding", "y", y.len(), &[ntok, hidden])?;
    let ntok_w = written(ntok, fault);
    if ntok_w == 0 {
        return Ok(());
    }
    let ntok_i = to_i32("embedding", "tokens", ntok_w)?;
    let vocab_i = to_i32("embedding", "vocab", vocab)?;
    let hidden_i = to_i32("embedding", "hidden", hidden)?;
    let f = gpu.function(MODULE, "embedding_fwd_f32")?;
    let cfg = gpu.launch_rows(ntok_w, row_threads(hidden, ROW_THREADS))?;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(table)
        .arg(tokens)
        .arg(y)
        .arg(&ntok_i)
        .arg(&vocab_i)
        .arg(&hidden_i);
    // SAFETY: embedding_fwd_f32(const float* table, const unsigned int* tokens,
    // float* y, int ntok, int vocab, int hidden): table holds vocab * hidden
    // elements, tokens ntok >= ntok_i, y ntok * hidden (checked above); the
    // kernel reads table only for tokens < vocab. y aliases no input.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// `dtable[v, :] = sum_{t : tokens[t] == v} dy[t, :]`, overwriting `dtable`
/// `[vocab, hidden]` (rows no token names become 0).
pub fn backward(
    gpu: &mut GpuContext,
    dy: &CudaView<'_, f32>,
    vocab: usize,
    hidden: usize,
    tokens: &CudaView<'_, u32>,
    dtable: &mut CudaViewMut<'_, f32>,
    fault: Option<Mutant>,
) -> Result<()> {
    check_hidden(hidden)?;
    let ntok = tokens.len();
    expect_len("embedding", "dy", dy.len(), &[ntok, hidden])?;
    expect_len("embedding", "dtable", dtable.len(), &[vocab, hidden])?;
    let vocab_w = written(vocab, fault);
    if vocab_w == 0 {
        return Ok(());
    }
    let ntok_i = to_i32("embedding", "tokens", ntok)?;
    let vocab_i = to_i32("embedding", "vocab", vocab_w)?;
    let hidden_i = to_i32("embedding", "hidden", hidden)?;
    let f = gpu.function(MODULE, "embedding_bwd_f32")?;
    let cfg = launch_config_rows(vocab_w, row_threads(hidden, ROW_THREADS))?;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(dy)
        .arg(tokens)
        .arg(dtable)
        .arg(&ntok_i)
        .arg(&vocab_i)
        .arg(&hidden_i);
    // SAFETY: embedding_bwd_f32(const float* dy, const unsigned int* tokens,
    // float* dtable, int ntok, int vocab_rows, int hidden): dy holds ntok *
    // hidden elements, tokens ntok, dtable vocab * hidden >= vocab_rows * hidden
    // (checked above); blockDim is a multiple of 32 and <= 1024, the size of
    // the kernel's shared match list. dtable aliases no input.
    unsafe { l.launch(cfg) }?;
    Ok(())
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
                case.mutant,
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
                case.mutant,
            )?;
            Ok(compare(&gpu.download(&dtable)?, &want))
        }
    }
}
