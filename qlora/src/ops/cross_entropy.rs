//! Launchers for `kernels/cross_entropy.cu`: per-row loss
//! `loss_r = lse(x_r) - x_r[t_r]` (max-shifted), their mean summed in a fixed
//! order, and the logit gradient `(softmax(x_r) - onehot(t_r)) / rows` (in
//! f32, or scaled in f16 for the LM head's f16 GEMM: [`GradElement`]); for
//! the bf16 head, all of it from bf16 logits in one pass ([`fused_bf16`]).

use cudarc::driver::{
    sys, CudaSlice, CudaView, CudaViewMut, DeviceRepr, LaunchConfig, PushKernelArg,
};

use super::cast::Bf16;
use super::launch::expect_len;
use super::launch::row_threads;
use crate::error::{Error, Result};
use crate::gpu::{to_i32, GpuContext};
use crate::kernels::abi::Arg::{Ptr, F32, I32};
use crate::kernels::abi::{Arg, Signatures};

/// The f32 kernels and the mean, which every step runs.
pub const MODULE: &str = "cross_entropy";

/// The bf16 head's fused kernel ([`fused_bf16`]), in a module of its own: a
/// step computing in f32 never runs it, and NVRTC takes several times as
/// long over it as over the rest.
pub const BF16_MODULE: &str = "cross_entropy_bf16";

/// Kernel argument lists by module, checked against the compiled PTX by a
/// unit test.
pub const SIGNATURES: &[(&str, Signatures)] = &[
    (
        MODULE,
        &[
            ("cross_entropy_fwd_f32", &[Ptr, Ptr, Ptr, Ptr, I32, I32]),
            ("cross_entropy_mean_f32", &[Ptr, Ptr, I32]),
            ("cross_entropy_bwd_f32", BWD_ARGS),
            ("cross_entropy_bwd_f16", BWD_ARGS),
        ],
    ),
    (BF16_MODULE, &[("cross_entropy_fused_bf16", FUSED_ARGS)]),
];

/// The fused kernel's arguments: x, targets, losses, rows, vocab,
/// grad_scale, kept_items.
const FUSED_ARGS: &[Arg] = &[Ptr, Ptr, Ptr, I32, I32, F32, I32];

/// The backward kernels' arguments: logits, targets, stats, dlogits, rows,
/// vocab, grad_scale.
const BWD_ARGS: &[Arg] = &[Ptr, Ptr, Ptr, Ptr, I32, I32, F32];

/// What [`backward`] into f16 multiplies `softmax - onehot` by instead of
/// `1 / rows`: `2^12`. The values lie in `[-1, 1]`; scaled, every
/// probability above `2^-26` (1.5e-8) is a normal f16 with TF32's 11-bit
/// significand, and the largest magnitude, 4096, stays far below f16's
/// 65504. The GEMM that reads them takes `alpha = 1 / (rows * 2^12)`.
pub const F16_GRAD_SCALE: f32 = 4096.0;

/// Threads per block of the row kernels: rows are long (up to 151936 logits).
const ROW_THREADS: u32 = 1024;
/// Threads of the one-block mean kernel.
const MEAN_THREADS: u32 = 256;

/// Checks that `[rows, vocab]` logits are a shape the cross-entropy kernels
/// take (the launchers check it too): both > 0 and within the kernels' `int`.
pub fn check_shape(rows: usize, vocab: usize) -> Result<()> {
    dims(rows, vocab).map(|_| ())
}

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

/// The forward's per-row `(max, ln sum exp(x - max))`, `[rows, 2]`, which
/// the backward reads instead of a second pass over the logits.
pub struct RowStats {
    rows: usize,
    stats: CudaSlice<f32>,
}

impl RowStats {
    pub fn new(gpu: &GpuContext, rows: usize) -> Result<Self> {
        Ok(RowStats {
            rows,
            stats: gpu.zeros(2 * rows.max(1))?,
        })
    }

    /// Device bytes held.
    pub fn bytes(&self) -> usize {
        4 * self.stats.len()
    }

    fn expect_rows(&self, rows: usize) -> Result<()> {
        if self.rows == rows {
            return Ok(());
        }
        Err(Error::ShapeMismatch {
            op: "cross_entropy",
            expected: format!("row stats for {rows} rows"),
            got: format!("{}", self.rows),
        })
    }
}

/// Per-row losses into `losses` `[rows]`, their mean into `loss` `[1]`, and
/// the rows' stats for the backward into `stats`. A target `>= vocab` gives
/// that row (and so the mean) NaN: the targets live on the device, so they
/// are checked there.
#[allow(clippy::too_many_arguments)]
pub fn forward(
    gpu: &mut GpuContext,
    logits: &CudaView<'_, f32>,
    rows: usize,
    vocab: usize,
    targets: &CudaView<'_, u32>,
    losses: &mut CudaViewMut<'_, f32>,
    loss: &mut CudaViewMut<'_, f32>,
    stats: &mut RowStats,
) -> Result<()> {
    let vocab_i = dims(rows, vocab)?.1;
    expect_len("cross_entropy", "logits", logits.len(), &[rows, vocab])?;
    expect_len("cross_entropy", "targets", targets.len(), &[rows])?;
    expect_len("cross_entropy", "losses", losses.len(), &[rows])?;
    stats.expect_rows(rows)?;
    expect_len("cross_entropy", "loss", loss.len(), &[1])?;
    // Under the fault the last row's loss is left unwritten; the mean still
    // reads it (it is the mean over all rows).
    let rows_w = gpu.faults().written(rows);
    if rows_w > 0 {
        let rows_w_i = to_i32("cross_entropy", "rows", rows_w)?;
        let f = gpu.function(MODULE, "cross_entropy_fwd_f32")?;
        let cfg = gpu.launch_rows(rows_w, row_threads(vocab, ROW_THREADS))?;
        let mut l = gpu.stream().launch_builder(&f);
        l.arg(logits)
            .arg(targets)
            .arg(&mut *losses)
            .arg(&mut stats.stats)
            .arg(&rows_w_i)
            .arg(&vocab_i);
        // SAFETY: cross_entropy_fwd_f32(const float* logits, const unsigned int*
        // targets, float* losses, float2* stats, int rows, int vocab): logits
        // hold rows * vocab elements, targets and losses rows >= rows_w_i, and
        // stats 2 rows floats, a whole (so 8-byte aligned) allocation (checked
        // above); the kernel indexes logits by a target only when it is < vocab.
        unsafe { l.launch(cfg) }?;
    }
    mean(gpu, &losses.as_view(), loss)
}

/// `loss[0] = (1 / rows) sum_r losses[r]` over every row of `losses`,
/// summed in a fixed order (one block), so the mean is bit-for-bit
/// reproducible.
pub fn mean(
    gpu: &mut GpuContext,
    losses: &CudaView<'_, f32>,
    loss: &mut CudaViewMut<'_, f32>,
) -> Result<()> {
    let rows_i = dims(losses.len(), 1)?.0;
    expect_len("cross_entropy", "loss", loss.len(), &[1])?;
    let f = gpu.function(MODULE, "cross_entropy_mean_f32")?;
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (MEAN_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(losses).arg(loss).arg(&rows_i);
    // SAFETY: cross_entropy_mean_f32(const float* losses, float* out, int rows):
    // losses hold rows elements, out one (checked above); one block.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// The bf16 LM head's cross-entropy, forward and backward in one pass, in
/// place: on entry `x` holds `[rows, vocab]` logits in bf16; on return
/// `x_r = bf16((softmax(x_r) - onehot(t_r)) / total_rows)` and `losses[r] =
/// lse(x_r) - x_r[t_r]` (f32 arithmetic on the bf16 logits' exact values).
/// `rows` may be a chunk of a step's `total_rows`: the gradient is the one
/// of the step's mean loss all the same, and the mean itself is [`mean`]'s,
/// once every chunk is done. No row stats are kept: nothing reads the
/// logits again.
pub fn fused_bf16(
    gpu: &mut GpuContext,
    x: &mut CudaViewMut<'_, Bf16>,
    (rows, vocab): (usize, usize),
    total_rows: usize,
    targets: &CudaView<'_, u32>,
    losses: &mut CudaViewMut<'_, f32>,
) -> Result<()> {
    dims(rows, vocab)?;
    dims(total_rows, vocab)?;
    expect_len("cross_entropy", "logits", x.len(), &[rows, vocab])?;
    expect_len("cross_entropy", "targets", targets.len(), &[rows])?;
    expect_len("cross_entropy", "losses", losses.len(), &[rows])?;
    // Under the fault the last row keeps its logits and its loss is left
    // unwritten.
    let rows_w = gpu.faults().written(rows);
    if rows_w == 0 {
        return Ok(());
    }
    let rows_w_i = to_i32("cross_entropy", "rows", rows_w)?;
    let vocab_i = to_i32("cross_entropy", "vocab", vocab)?;
    // The gradient of the mean loss itself, as in f32: bf16 has f32's
    // exponent range, so a wide vocabulary's smallest probabilities over the
    // rows stay representable with no scale (f16 would flush them to zero).
    let grad_scale = <f32 as GradElement>::grad_scale(total_rows);
    let threads = row_threads(vocab, ROW_THREADS);
    let kept = kept_items(vocab, threads, gpu.facts().max_shared_per_block);
    let kept_i = to_i32("cross_entropy", "kept items", kept)?;
    let f = gpu.function(BF16_MODULE, "cross_entropy_fused_bf16")?;
    let mut cfg = gpu.launch_rows(rows_w, threads)?;
    cfg.shared_mem_bytes = u32::try_from(kept * ITEM_BYTES * threads as usize).map_err(|_| {
        Error::InvalidArgument {
            op: "cross_entropy",
            message: format!("{kept} kept items of {threads} threads"),
        }
    })?;
    let opt_in = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
    f.set_attribute(opt_in, cfg.shared_mem_bytes as i32)?;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(&mut *x)
        .arg(targets)
        .arg(&mut *losses)
        .arg(&rows_w_i)
        .arg(&vocab_i)
        .arg(&grad_scale)
        .arg(&kept_i);
    // SAFETY: cross_entropy_fused_bf16(unsigned short* x, const unsigned int*
    // targets, float* losses, int rows, int vocab, float grad_scale, int
    // kept_items): x holds rows * vocab 2-byte elements (Bf16 is the
    // kernel's raw bf16 bits), targets and losses rows >= rows_w_i (checked
    // above); x is read and written only by the block of its row, and
    // aliases neither other buffer; a target is used as an index only when
    // it is < vocab. The launch gives each block kept_items * blockDim.x
    // 16-byte items of dynamic shared memory, the most the kernel touches,
    // within the device's limit (kept_items) and opted in to above.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// Bytes of one item of [`fused_bf16`]'s kernel: eight bf16 logits.
const ITEM_BYTES: usize = 16;

/// Items a thread of [`fused_bf16`]'s kernel keeps in registers between
/// its two passes over a row (`CE_REG_ITEMS` in cross_entropy.cu; a test
/// holds the two equal).
const REG_ITEMS: usize = 8;

/// Items a thread of [`fused_bf16`]'s kernel (`threads` to a row of
/// `vocab` logits) keeps in shared memory between its passes: those its
/// registers do not hold, as many as `max_shared` bytes a block take.
fn kept_items(vocab: usize, threads: u32, max_shared: usize) -> usize {
    let threads = threads.max(1) as usize;
    let items = (vocab / 8).div_ceil(threads);
    let fit = max_shared / (ITEM_BYTES * threads);
    items.saturating_sub(REG_ITEMS).min(fit)
}

/// An element type the backward writes its gradient in, with its kernel
/// and the factor it multiplies `softmax - onehot` by.
pub trait GradElement: DeviceRepr {
    /// The backward kernel whose `dlogits` is of this type.
    const KERNEL: &'static str;
    /// The factor of `softmax - onehot` in the stored gradient of `rows` rows.
    fn grad_scale(rows: usize) -> f32;
}

/// f32: the gradient of the mean loss itself, `1 / rows`.
impl GradElement for f32 {
    const KERNEL: &'static str = "cross_entropy_bwd_f32";
    fn grad_scale(rows: usize) -> f32 {
        (1.0 / rows as f64) as f32
    }
}

/// f16 as raw bits (rounded to nearest even): scaled by
/// [`F16_GRAD_SCALE`], so the gradient of the mean loss is the stored
/// value over `rows * F16_GRAD_SCALE`.
impl GradElement for u16 {
    const KERNEL: &'static str = "cross_entropy_bwd_f16";
    fn grad_scale(_rows: usize) -> f32 {
        F16_GRAD_SCALE
    }
}

/// `dlogits_r = (softmax(x_r) - onehot(t_r)) * T::grad_scale(rows)`,
/// `[rows, vocab]`, with the row stats [`forward`] wrote for these logits:
/// the gradient of the mean loss in f32 (`/ rows`), or scaled in f16 bits.
#[allow(clippy::too_many_arguments)]
pub fn backward<T: GradElement>(
    gpu: &mut GpuContext,
    logits: &CudaView<'_, f32>,
    rows: usize,
    vocab: usize,
    targets: &CudaView<'_, u32>,
    stats: &RowStats,
    dlogits: &mut CudaViewMut<'_, T>,
) -> Result<()> {
    dims(rows, vocab)?;
    stats.expect_rows(rows)?;
    expect_len("cross_entropy", "logits", logits.len(), &[rows, vocab])?;
    expect_len("cross_entropy", "targets", targets.len(), &[rows])?;
    expect_len("cross_entropy", "dlogits", dlogits.len(), &[rows, vocab])?;
    let rows_w = gpu.faults().written(rows);
    if rows_w == 0 {
        return Ok(());
    }
    let rows_w_i = to_i32("cross_entropy", "rows", rows_w)?;
    let vocab_i = to_i32("cross_entropy", "vocab", vocab)?;
    let grad_scale = T::grad_scale(rows);
    let f = gpu.function(MODULE, T::KERNEL)?;
    let cfg = gpu.launch_rows(rows_w, row_threads(vocab, ROW_THREADS))?;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(logits)
        .arg(targets)
        .arg(&stats.stats)
        .arg(dlogits)
        .arg(&rows_w_i)
        .arg(&vocab_i)
        .arg(&grad_scale);
    // SAFETY: both kernels are (const float* logits, const unsigned int*
    // targets, const float2* stats, Out* dlogits, int rows, int vocab, float
    // grad_scale), and T::KERNEL is the one whose Out is T (f32: float; u16:
    // unsigned short, f16 bits), so the
    // lengths checked in elements of T are the kernel's: logits and dlogits
    // hold rows * vocab elements, targets rows
    // >= rows_w_i and stats 2 rows floats in a whole allocation (checked
    // above); dlogits aliases no input.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hopper's opt-in limit of shared memory a block.
    const HOPPER_SHARED: usize = 232_448;

    /// The launcher sizes the kept items' shared memory by the kernel's own
    /// count of items held in registers.
    #[test]
    fn the_register_items_are_the_kernels() {
        let source = include_str!("../kernels/cross_entropy.cu");
        assert_eq!(
            crate::kernels::cu_define(source, "CE_REG_ITEMS"),
            Some(REG_ITEMS)
        );
    }

    #[test]
    fn a_full_vocabulary_row_is_kept_on_chip_between_the_passes() {
        // 151,936 logits: 18,992 items, 19 a thread of 1,024; 8 in
        // registers, the other 11 (176 KiB a block) in shared memory.
        assert_eq!(kept_items(151_936, 1024, HOPPER_SHARED), 11);
    }

    #[test]
    fn the_kept_items_fit_the_limit_and_never_exceed_what_the_registers_leave() {
        for vocab in [2, 33, 4096, 65_536, 151_936, 300_000] {
            let threads = row_threads(vocab, ROW_THREADS);
            let items = (vocab / 8).div_ceil(threads as usize);
            for limit in [0, 48 * 1024, 100_000, HOPPER_SHARED] {
                let kept = kept_items(vocab, threads, limit);
                assert!(
                    kept * ITEM_BYTES * threads as usize <= limit,
                    "{vocab} {limit}"
                );
                // Shared memory holds only items the registers do not.
                assert!(kept == 0 || REG_ITEMS + kept <= items, "{vocab}");
            }
        }
    }

    #[test]
    fn short_rows_keep_nothing_in_shared_memory_and_small_devices_keep_what_fits() {
        assert_eq!(
            kept_items(1000, row_threads(1000, ROW_THREADS), HOPPER_SHARED),
            0
        );
        assert_eq!(kept_items(7, 32, HOPPER_SHARED), 0);
        // 48 KiB: three items of 1,024 threads; the rest is read again.
        assert_eq!(kept_items(151_936, 1024, 48 * 1024), 3);
        assert_eq!(kept_items(151_936, 1024, 0), 0);
    }
}
