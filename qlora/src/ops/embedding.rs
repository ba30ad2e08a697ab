//! Launchers for `kernels/embedding.cu`: the gather `y[t, :] = table[tokens[t], :]`
//! and its deterministic scatter-add backward
//! `dtable[v, :] = sum_{t : tokens[t] == v} dy[t, :]` (t ascending, no atomics).

use cudarc::driver::{CudaView, CudaViewMut, DeviceRepr, PushKernelArg};

use super::cast::Bf16;
use super::launch::expect_len;
use super::launch::row_threads;
use crate::error::{Error, Result};
use crate::gpu::{launch_config_rows, to_i32, GpuContext};
use crate::kernels::abi::{Arg, Signatures};

/// The forward's module, which the training step runs (its table is frozen).
pub const MODULE: &str = "embedding";
/// The backward's module.
pub const BWD_MODULE: &str = "embedding_bwd";

/// Both kernels' arguments: a table or dy, tokens, y or dtable, and three
/// sizes.
const ARGS: &[Arg] = &[Arg::Ptr, Arg::Ptr, Arg::Ptr, Arg::I32, Arg::I32, Arg::I32];

/// Kernel argument lists by module, checked against the compiled PTX by a
/// unit test.
pub const SIGNATURES: &[(&str, Signatures)] = &[
    (
        MODULE,
        &[("embedding_fwd_f32", ARGS), ("embedding_fwd_bf16", ARGS)],
    ),
    (BWD_MODULE, &[("embedding_bwd_f32", ARGS)]),
];

/// Threads per block (at most; fewer for narrow rows). The backward kernel's
/// shared match list holds up to 1024 positions, one per thread.
const ROW_THREADS: u32 = 256;

/// Checks that `tokens` lookups in a `[vocab, hidden]` table are a shape
/// the embedding kernels take (the launchers check it too): hidden > 0, and
/// every dimension within the kernels' `int`.
pub fn check_shape(tokens: usize, vocab: usize, hidden: usize) -> Result<()> {
    if hidden == 0 {
        return Err(Error::InvalidArgument {
            op: "embedding",
            message: "hidden must be > 0".into(),
        });
    }
    to_i32("embedding", "tokens", tokens)?;
    to_i32("embedding", "vocab", vocab)?;
    to_i32("embedding", "hidden", hidden).map(|_| ())
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
) -> Result<()> {
    gather(gpu, "embedding_fwd_f32", table, (vocab, hidden), tokens, y)
}

/// [`forward`] from a bf16 table:
/// `y[t, :] = f32(table[tokens[t], :])`, exact.
pub fn forward_bf16(
    gpu: &mut GpuContext,
    table: &CudaView<'_, Bf16>,
    vocab: usize,
    hidden: usize,
    tokens: &CudaView<'_, u32>,
    y: &mut CudaViewMut<'_, f32>,
) -> Result<()> {
    gather(gpu, "embedding_fwd_bf16", table, (vocab, hidden), tokens, y)
}

/// The gather `symbol` (`embedding_fwd_f32` or `embedding_fwd_bf16`, whose
/// table element is `T`).
fn gather<T: DeviceRepr>(
    gpu: &mut GpuContext,
    symbol: &'static str,
    table: &CudaView<'_, T>,
    (vocab, hidden): (usize, usize),
    tokens: &CudaView<'_, u32>,
    y: &mut CudaViewMut<'_, f32>,
) -> Result<()> {
    check_shape(tokens.len(), vocab, hidden)?;
    let ntok = tokens.len();
    expect_len("embedding", "table", table.len(), &[vocab, hidden])?;
    expect_len("embedding", "y", y.len(), &[ntok, hidden])?;
    let ntok_w = gpu.faults().written(ntok);
    if ntok_w == 0 {
        return Ok(());
    }
    let ntok_i = to_i32("embedding", "tokens", ntok_w)?;
    let vocab_i = to_i32("embedding", "vocab", vocab)?;
    let hidden_i = to_i32("embedding", "hidden", hidden)?;
    let f = gpu.function(MODULE, symbol)?;
    let cfg = gpu.launch_rows(ntok_w, row_threads(hidden, ROW_THREADS))?;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(table)
        .arg(tokens)
        .arg(y)
        .arg(&ntok_i)
        .arg(&vocab_i)
        .arg(&hidden_i);
    // SAFETY: embedding_fwd_{f32,bf16}(const T* table, const unsigned int*
    // tokens, float* y, int ntok, int vocab, int hidden), T float or the
    // 16-bit pattern `T` is here: table holds vocab * hidden elements,
    // tokens ntok >= ntok_i, y ntok * hidden (checked above); the kernel
    // reads table only for tokens < vocab. y aliases no input.
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
) -> Result<()> {
    check_shape(tokens.len(), vocab, hidden)?;
    let ntok = tokens.len();
    expect_len("embedding", "dy", dy.len(), &[ntok, hidden])?;
    expect_len("embedding", "dtable", dtable.len(), &[vocab, hidden])?;
    let vocab_w = gpu.faults().written(vocab);
    if vocab_w == 0 {
        return Ok(());
    }
    let ntok_i = to_i32("embedding", "tokens", ntok)?;
    let vocab_i = to_i32("embedding", "vocab", vocab_w)?;
    let hidden_i = to_i32("embedding", "hidden", hidden)?;
    let f = gpu.function(BWD_MODULE, "embedding_bwd_f32")?;
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
