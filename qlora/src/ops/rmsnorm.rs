//! Launchers for `kernels/rmsnorm.cu`: RMSNorm over the last dimension,
//! `y_i = x_i gamma_i / sqrt(mean(x^2) + eps)`, its fused residual-add form,
//! and the backward with a deterministic (fixed-order) dgamma reduction.

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, DevicePtr, LaunchConfig, PushKernelArg};

use super::launch::{expect_len, row_threads, DependentLaunch};
use crate::error::{Error, Result};
use crate::gpu::table::address;
use crate::gpu::{launch_config_rows, to_i32, GpuContext};
use crate::kernels::abi::{Arg, Signature, Signatures};
use crate::ops::cast::Bf16;

/// The forwards' module.
pub const MODULE: &str = "rmsnorm";

/// The module of the bf16 step's forwards (the output's bf16 rounding, and
/// the copy of the input): compiled only for a step that computes in bf16.
pub const BF16_MODULE: &str = "rmsnorm_bf16";

/// How a backward build lays a row over its threads.
#[derive(Clone, Copy)]
enum RowLayout {
    /// A warp per row, `packs` packs of four per lane; a block is
    /// [`WARPS_PER_BLOCK`] warps.
    Warp,
    /// A row group of threads per row, `packs` packs per thread.
    Group,
}

/// One build of the backward: its module (which also holds the dgamma
/// final kernel), its kernel, the packs of four columns each thread holds
/// and how a row is laid over the threads.
struct BwdBuild {
    module: &'static str,
    symbol: &'static str,
    packs: usize,
    layout: RowLayout,
}

impl BwdBuild {
    /// Widest row this build takes.
    fn max_hidden(&self) -> usize {
        match self.layout {
            RowLayout::Warp => 4 * 32 * self.packs,
            RowLayout::Group if self.packs == 1 => ONE_PACK_HIDDEN,
            RowLayout::Group => MAX_HIDDEN,
        }
    }
}

const fn warp_build(module: &'static str, symbol: &'static str, packs: usize) -> BwdBuild {
    BwdBuild {
        module,
        symbol,
        packs,
        layout: RowLayout::Warp,
    }
}

/// Every backward build, narrowest rows first: the first whose
/// [`BwdBuild::max_hidden`] covers a row takes it.
const BWD_BUILDS: [BwdBuild; 6] = [
    warp_build("rmsnorm_bwd_warp1", "rmsnorm_bwd_warp1_f32", 1),
    warp_build("rmsnorm_bwd_warp2", "rmsnorm_bwd_warp2_f32", 2),
    warp_build("rmsnorm_bwd_warp4", "rmsnorm_bwd_warp4_f32", 4),
    warp_build("rmsnorm_bwd_warp8", "rmsnorm_bwd_warp8_f32", 8),
    // Up to ONE_PACK_HIDDEN: one pack per thread, up to ROWS_IN_PARALLEL rows.
    BwdBuild {
        module: "rmsnorm_bwd_block",
        symbol: "rmsnorm_bwd_f32",
        packs: 1,
        layout: RowLayout::Group,
    },
    // Up to MAX_HIDDEN: WIDE_PACKS packs per thread, one row at a time.
    BwdBuild {
        module: "rmsnorm_bwd_wide",
        symbol: "rmsnorm_bwd_wide_f32",
        packs: WIDE_PACKS,
        layout: RowLayout::Group,
    },
];

/// Widest row the one-pack backward takes: one pack of four columns per
/// thread, at most 1024 threads.
pub const ONE_PACK_HIDDEN: usize = 4 * 1024;

/// The narrowest build that holds rows `hidden` wide. The warp-per-row
/// builds move rows in 16-byte packs only (their modules compile in half the
/// time without a scalar path), so rows that are not `packed` take the
/// row-group builds, which handle both.
fn bwd_build(hidden: usize, packed: bool) -> &'static BwdBuild {
    BWD_BUILDS
        .iter()
        .filter(|b| packed || !matches!(b.layout, RowLayout::Warp))
        .find(|b| hidden <= b.max_hidden())
        .unwrap_or(&BWD_BUILDS[BWD_BUILDS.len() - 1])
}

/// Whether the backward's rows move in 16-byte packs: `hidden` a multiple
/// of four and every buffer starting 16-byte aligned (then so does every
/// row), the bf16 copy `dx16` 8-byte aligned (four values a store).
fn packed(
    gpu: &GpuContext,
    hidden: usize,
    views: [&CudaView<'_, f32>; 3],
    dx: &CudaViewMut<'_, f32>,
    dx16: Option<&CudaViewMut<'_, Bf16>>,
) -> bool {
    let stream = gpu.stream();
    let aligned = |ptr: u64, bytes: u64| ptr.is_multiple_of(bytes);
    // Event tracking is off on the context's stream (gpu/context.rs), so the
    // guards record nothing; only the addresses are read.
    hidden.is_multiple_of(4)
        && views.iter().all(|v| aligned(v.device_ptr(stream).0, 16))
        && aligned(dx.device_ptr(stream).0, 16)
        && dx16.is_none_or(|b| aligned(b.device_ptr(stream).0, 8))
}

/// The build of rows `hidden` wide in buffers that start 16-byte aligned
/// (whole allocations, as the training step's; its rows start at multiples
/// of `hidden` floats): packed whenever hidden % 4 == 0.
fn aligned_rows_build(hidden: usize) -> &'static BwdBuild {
    bwd_build(hidden, hidden.is_multiple_of(4))
}

/// The backward's module for rows `hidden` wide in aligned buffers (the
/// training step's).
pub fn bwd_module_for(hidden: usize) -> &'static str {
    aligned_rows_build(hidden).module
}

/// Backward build `i`'s module: its kernel and the dgamma finals.
macro_rules! bwd_signatures {
    ($i:literal) => {
        (
            BWD_BUILDS[$i].module,
            &[
                (BWD_BUILDS[$i].symbol, BWD_ARGS),
                DGAMMA_FINAL,
                DGAMMA_TABLE,
            ],
        )
    };
}

/// The kernels of each module, by module, checked against the compiled PTX
/// by a unit test.
pub const SIGNATURES: &[(&str, Signatures)] = &[
    (MODULE, &[FWD, RESIDUAL_FWD]),
    (BF16_MODULE, &[FWD_BF16, FWD_BF16_ONLY]),
    bwd_signatures!(0),
    bwd_signatures!(1),
    bwd_signatures!(2),
    bwd_signatures!(3),
    bwd_signatures!(4),
    bwd_signatures!(5),
];

const FWD: Signature = (
    "rmsnorm_fwd_f32",
    &[Arg::Ptr, Arg::Ptr, Arg::Ptr, Arg::I32, Arg::I32, Arg::F32],
);
const FWD_BF16: Signature = (
    "rmsnorm_fwd_f32_bf16",
    &[
        Arg::Ptr,
        Arg::Ptr,
        Arg::Ptr,
        Arg::Ptr,
        Arg::Ptr,
        Arg::I32,
        Arg::I32,
        Arg::F32,
    ],
);
const FWD_BF16_ONLY: Signature = (
    "rmsnorm_fwd_bf16",
    &[
        Arg::Ptr,
        Arg::Ptr,
        Arg::Ptr,
        Arg::Ptr,
        Arg::I32,
        Arg::I32,
        Arg::F32,
    ],
);
const RESIDUAL_FWD: Signature = (
    "rmsnorm_residual_fwd_f32",
    &[
        Arg::Ptr,
        Arg::Ptr,
        Arg::Ptr,
        Arg::Ptr,
        Arg::Ptr,
        Arg::I32,
        Arg::I32,
        Arg::F32,
    ],
);
/// Every backward build takes the same arguments.
const BWD_ARGS: &[Arg] = &[
    Arg::Ptr,
    Arg::Ptr,
    Arg::Ptr,
    Arg::Ptr,
    Arg::Ptr,
    Arg::I32,
    Arg::I32,
    Arg::F32,
    Arg::I32,
    Arg::I32,
    Arg::I32,
    Arg::Ptr,
];
const DGAMMA_FINAL: Signature = (
    "rmsnorm_bwd_dgamma_final_f32",
    &[Arg::Ptr, Arg::Ptr, Arg::I32, Arg::I32, Arg::I32],
);
const DGAMMA_TABLE: Signature = (
    "rmsnorm_bwd_dgamma_table_f32",
    &[Arg::Ptr, Arg::Ptr, Arg::I32, Arg::I32, Arg::I32],
);

/// Threads per block of the residual row kernel (at most; fewer for narrow rows).
const ROW_THREADS: u32 = 256;
/// Packs of four columns each thread of the forward holds (`RMS_PACKS`).
const PACKS_PER_THREAD: usize = 4;
/// Packs per thread of the wide backward, `rmsnorm_bwd_wide_f32`, launched
/// with at most [`WIDE_THREADS`] threads; `rmsnorm_bwd_f32` holds one.
const WIDE_PACKS: usize = 8;
const WIDE_THREADS: usize = 256;
/// Widest row: the wide backward's `4 x 8 x 256` columns.
pub const MAX_HIDDEN: usize = 4 * WIDE_PACKS * WIDE_THREADS;
/// At most this many row chunks in the backward (its partials buffer is
/// `chunks x hidden`): one block each, enough blocks to fill an H100/H200.
const MAX_CHUNKS: usize = 256;
/// Warps per block of the warp-per-row backward (`WARP_ROWS_MAX`): a chunk
/// is a multiple of this many rows, so 1024 rows make 128 chunks of eight,
/// one row per warp; eight rows a chunk measured faster than four (four
/// warps a block) or sixteen at qwen2.5-0.5b's shape.
const WARPS_PER_BLOCK: usize = 8;
/// Rows of a chunk the one-pack backward takes at once (its blockDim.y).
const ROWS_IN_PARALLEL: u32 = 4;
/// Chunk groups of the dgamma final kernel (`DGAMMA_GROUPS`; its blockDim
/// is `32 x 32`).
const FINAL_GROUPS: u32 = 32;
/// Norms one block row of the dgamma table kernel sums (`DGAMMA_NORMS`),
/// their loads in flight together.
const TABLE_NORMS: u32 = 8;

/// The launch of a register-held row kernel over `units` (rows, or row
/// chunks): one block per unit, threads enough for `hidden` columns at
/// `packs` packs of four per thread (the kernel's own count: 4 in the
/// forward, 1 or 8 in the backward); one block in all under the test-only fault
/// [`crate::Faults::serialised_launch`] (the kernel loops over the units).
fn row_loop_config(
    gpu: &GpuContext,
    units: usize,
    hidden: usize,
    packs: usize,
) -> Result<LaunchConfig> {
    let threads = row_threads(hidden.div_ceil(4 * packs), 1024);
    let blocks = if gpu.faults().serialised_launch {
        1
    } else {
        units
    };
    launch_config_rows(blocks, threads)
}

/// Checks that `[rows, hidden]` is a shape the RMSNorm kernels take (the
/// launchers check it too): hidden in `1..=`[`MAX_HIDDEN`] (the widest row
/// the register-held backward holds), rows within the kernels' `int`.
pub fn check_shape(rows: usize, hidden: usize) -> Result<()> {
    check_dims(rows, hidden).map(|_| ())
}

fn check_dims(rows: usize, hidden: usize) -> Result<(i32, i32)> {
    if hidden == 0 || hidden > MAX_HIDDEN {
        return Err(Error::InvalidArgument {
            op: "rmsnorm",
            message: format!("hidden must be in 1..={MAX_HIDDEN}, got {hidden}"),
        });
    }
    Ok((
        to_i32("rmsnorm", "rows", rows)?,
        to_i32("rmsnorm", "hidden", hidden)?,
    ))
}

/// `y = rmsnorm(x) * gamma`; `x`, `y` are `[rows, hidden]`, `gamma` `[hidden]`.
#[allow(clippy::too_many_arguments)]
pub fn forward(
    gpu: &mut GpuContext,
    x: &CudaView<'_, f32>,
    gamma: &CudaView<'_, f32>,
    rows: usize,
    hidden: usize,
    eps: f64,
    y: &mut CudaViewMut<'_, f32>,
) -> Result<()> {
    let out = ForwardOut {
        y: Some(y),
        y16: None,
        x_copy: None,
    };
    forward_into(gpu, (x, gamma), (rows, hidden), eps, out)
}

/// [`forward`], also writing `y16`, the bf16 rounding of `y` (nearest, ties
/// to even) that a bf16 GEMM reads next: one pass instead of a cast after.
/// With `x_copy`, also a copy of `x` from the same pass (the bf16 step's
/// next residual stream, which a GEMM then adds onto).
#[allow(clippy::too_many_arguments)]
pub fn forward_with_bf16(
    gpu: &mut GpuContext,
    x: &CudaView<'_, f32>,
    gamma: &CudaView<'_, f32>,
    rows: usize,
    hidden: usize,
    eps: f64,
    (y, y16): (&mut CudaViewMut<'_, f32>, &mut CudaViewMut<'_, Bf16>),
    x_copy: Option<&mut CudaViewMut<'_, f32>>,
) -> Result<()> {
    expect_len("rmsnorm", "y16", y16.len(), &[rows, hidden])?;
    let out = ForwardOut {
        y: Some(y),
        y16: Some(y16),
        x_copy,
    };
    forward_into(gpu, (x, gamma), (rows, hidden), eps, out)
}

/// [`forward`]'s bf16 rounding alone, for a norm whose f32 output nothing
/// reads: `y16` as [`forward_with_bf16`] writes it, and `x_copy` likewise.
pub fn forward_bf16(
    gpu: &mut GpuContext,
    (x, gamma): (&CudaView<'_, f32>, &CudaView<'_, f32>),
    (rows, hidden): (usize, usize),
    eps: f64,
    y16: &mut CudaViewMut<'_, Bf16>,
    x_copy: Option<&mut CudaViewMut<'_, f32>>,
) -> Result<()> {
    expect_len("rmsnorm", "y16", y16.len(), &[rows, hidden])?;
    let out = ForwardOut {
        y: None,
        y16: Some(y16),
        x_copy,
    };
    forward_into(gpu, (x, gamma), (rows, hidden), eps, out)
}

/// Where the forward writes: `y` in f32, its bf16 rounding `y16`, or both;
/// with `y16`, optionally a copy of `x`.
struct ForwardOut<'a, 'y, 'y16, 'c> {
    y: Option<&'a mut CudaViewMut<'y, f32>>,
    y16: Option<&'a mut CudaViewMut<'y16, Bf16>>,
    x_copy: Option<&'a mut CudaViewMut<'c, f32>>,
}

/// The launch of [`forward`], [`forward_with_bf16`] and [`forward_bf16`].
fn forward_into(
    gpu: &mut GpuContext,
    (x, gamma): (&CudaView<'_, f32>, &CudaView<'_, f32>),
    (rows, hidden): (usize, usize),
    eps: f64,
    out: ForwardOut<'_, '_, '_, '_>,
) -> Result<()> {
    check_dims(rows, hidden)?;
    expect_len("rmsnorm", "x", x.len(), &[rows, hidden])?;
    expect_len("rmsnorm", "gamma", gamma.len(), &[hidden])?;
    if let Some(y) = &out.y {
        expect_len("rmsnorm", "y", y.len(), &[rows, hidden])?;
    }
    if let Some(c) = &out.x_copy {
        expect_len("rmsnorm", "x_copy", c.len(), &[rows, hidden])?;
    }
    let bf16 = out.y16.is_some();
    let rows_w = gpu.faults().written(rows);
    if rows_w == 0 {
        return Ok(());
    }
    let (rows_i, hidden_i) = check_dims(rows_w, hidden)?;
    let eps_f = eps as f32;
    let (module, symbol) = match (&out.y, &out.y16) {
        (Some(_), Some(_)) => (BF16_MODULE, FWD_BF16.0),
        (Some(_), None) => (MODULE, FWD.0),
        (None, _) => (BF16_MODULE, FWD_BF16_ONLY.0),
    };
    let f = gpu.function(module, symbol)?;
    // Few threads, four packs each: one row per block keeps plenty of
    // blocks in flight.
    let cfg = row_loop_config(gpu, rows_w, hidden, PACKS_PER_THREAD)?;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(x).arg(gamma);
    if let Some(y) = out.y {
        l.arg(y);
    }
    if let Some(y16) = out.y16 {
        l.arg(y16);
    }
    // The bf16 kernels take x_copy, null for none; only their launchers
    // set it.
    let no_copy = 0u64;
    if bf16 {
        match out.x_copy {
            Some(c) => l.arg(c),
            None => l.arg(&no_copy),
        };
    }
    l.arg(&rows_i).arg(&hidden_i).arg(&eps_f);
    // SAFETY: rmsnorm_fwd_f32(const float* x, const float* gamma, float* y,
    // int rows, int hidden, float eps), rmsnorm_fwd_f32_bf16 with `unsigned
    // short* y16, float* x_copy` after y, rmsnorm_fwd_bf16 with y16 in y's
    // place, then x_copy (the arguments above, in that order; a ForwardOut
    // names y or y16, both from the public launchers, and x_copy only with
    // y16; a null x_copy is 8 zero bytes, which the kernel tests): x, y, y16
    // and x_copy hold rows * hidden >= rows_i * hidden elements and gamma
    // hidden (checked above); y, y16 and x_copy are distinct mutable
    // borrows; blocks loop over the rows; blockDim is a
    // multiple of 32 <= 1024, as the block reduction needs, with 4 *
    // RMS_PACKS * blockDim >= hidden, as the kernel needs.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// Fused residual add + RMSNorm: `h = a + b` (stored: it is the next residual
/// stream), `y = rmsnorm(h) * gamma`, in one pass over `a` and `b`.
#[allow(clippy::too_many_arguments)]
pub fn forward_residual(
    gpu: &mut GpuContext,
    a: &CudaView<'_, f32>,
    b: &CudaView<'_, f32>,
    gamma: &CudaView<'_, f32>,
    rows: usize,
    hidden: usize,
    eps: f64,
    h: &mut CudaViewMut<'_, f32>,
    y: &mut CudaViewMut<'_, f32>,
) -> Result<()> {
    check_dims(rows, hidden)?;
    for (what, len) in [
        ("a", a.len()),
        ("b", b.len()),
        ("h", h.len()),
        ("y", y.len()),
    ] {
        expect_len("rmsnorm", what, len, &[rows, hidden])?;
    }
    expect_len("rmsnorm", "gamma", gamma.len(), &[hidden])?;
    let rows_w = gpu.faults().written(rows);
    if rows_w == 0 {
        return Ok(());
    }
    let (rows_i, hidden_i) = check_dims(rows_w, hidden)?;
    let eps_f = eps as f32;
    let f = gpu.function(MODULE, "rmsnorm_residual_fwd_f32")?;
    let cfg = gpu.launch_rows(rows_w, row_threads(hidden, ROW_THREADS))?;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(a)
        .arg(b)
        .arg(gamma)
        .arg(h)
        .arg(y)
        .arg(&rows_i)
        .arg(&hidden_i)
        .arg(&eps_f);
    // SAFETY: rmsnorm_residual_fwd_f32(const float* a, const float* b,
    // const float* gamma, float* h, float* y, int rows, int hidden, float eps):
    // a, b, h, y hold rows * hidden elements, gamma hidden (checked above);
    // h and y are distinct mutable borrows aliasing no input.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// Scratch of the backward: the per-chunk dgamma partials. Allocated once
/// per shape, so the backward allocates nothing (and can be captured in a
/// CUDA graph).
///
/// Its partials are `1 + slots` regions of `chunks x hidden` floats: region
/// 0 for a backward whose dgamma is summed at once ([`Dgamma::Now`]) or
/// not wanted, region `1 + n` for slot `n` ([`Dgamma::Slot`]), whose sum
/// waits for [`BackwardWorkspace::sum_slots`].
pub struct BackwardWorkspace {
    rows: usize,
    hidden: usize,
    rows_per_chunk: usize,
    chunks: usize,
    slots: usize,
    partials: CudaSlice<f32>,
}

impl BackwardWorkspace {
    /// Scratch for `[rows, hidden]`: `chunks x hidden` floats, at most
    /// `MAX_CHUNKS` chunks of `rows_per_chunk` rows (a multiple of
    /// `WARPS_PER_BLOCK` for the warp-per-row builds).
    pub fn new(gpu: &GpuContext, rows: usize, hidden: usize) -> Result<Self> {
        Self::with_slots(gpu, rows, hidden, 0)
    }

    /// The same, with `slots` more regions of partials for backwards whose
    /// dgamma [`BackwardWorkspace::sum_slots`] sums later, all in one
    /// launch.
    pub fn with_slots(gpu: &GpuContext, rows: usize, hidden: usize, slots: usize) -> Result<Self> {
        check_dims(rows, hidden)?;
        let (rows_per_chunk, chunks) = chunking(rows, hidden);
        Ok(BackwardWorkspace {
            rows,
            hidden,
            rows_per_chunk,
            chunks,
            slots,
            partials: gpu.zeros((1 + slots) * chunks * hidden)?,
        })
    }

    /// Device bytes of [`BackwardWorkspace::with_slots`]'s scratch.
    pub fn bytes_for(rows: usize, hidden: usize, slots: usize) -> usize {
        4 * (1 + slots) * chunking(rows, hidden).1 * hidden
    }

    /// Device bytes of the scratch.
    pub fn bytes(&self) -> usize {
        4 * self.partials.len()
    }

    /// `dgamma_n[i] = sum_c partials_n[c, i]` for every slot `n`, into
    /// target `n` of `dgammas`, each sum in the order [`Dgamma::Now`] adds
    /// it. One launch for every slot.
    pub fn sum_slots(&self, gpu: &mut GpuContext, dgammas: &DgammaTargets) -> Result<()> {
        if (dgammas.slots, dgammas.hidden) != (self.slots, self.hidden) {
            return Err(Error::ShapeMismatch {
                op: "rmsnorm",
                expected: format!("{} targets of {} floats", self.slots, self.hidden),
                got: format!("{} of {}", dgammas.slots, dgammas.hidden),
            });
        }
        // Every backward module holds the table kernel: this one is the
        // module of the build aligned rows take, the one a step pre-warms.
        let module = bwd_module_for(self.hidden);
        let (hidden_i, chunks_i) = (
            to_i32("rmsnorm", "hidden", self.hidden)?,
            to_i32("rmsnorm", "chunks", self.chunks)?,
        );
        let slots = u32::try_from(self.slots).map_err(|_| Error::InvalidArgument {
            op: "rmsnorm",
            message: format!("{} slots exceed a grid", self.slots),
        })?;
        let cfg = LaunchConfig {
            grid_dim: (
                hidden_i.unsigned_abs().div_ceil(32),
                slots.div_ceil(TABLE_NORMS),
                1,
            ),
            block_dim: (32, FINAL_GROUPS, 1),
            shared_mem_bytes: 0,
        };
        let slots_i = to_i32("rmsnorm", "slots", self.slots)?;
        let f = gpu.function(module, DGAMMA_TABLE.0)?;
        let region = self.chunks * self.hidden;
        let slot_partials = self.partials.slice(region..);
        let mut l = gpu.stream().launch_builder(&f);
        l.arg(&slot_partials)
            .arg(&dgammas.ptrs)
            .arg(&hidden_i)
            .arg(&chunks_i)
            .arg(&slots_i);
        // SAFETY: rmsnorm_bwd_dgamma_table_f32(const float* partials, const
        // unsigned long long* dgammas, int hidden, int chunks, int slots):
        // blockDim (32, 32) as its shared tables need; it reads region n <
        // slots of slot_partials (slots x chunks x hidden floats, allocated
        // so) and writes hidden floats at dgammas[n], the address of a
        // tensor of hidden floats (DgammaTargets::new checked each; its
        // owner keeps them alive and unmoved while the targets exist, and
        // the shapes match, checked above).
        unsafe { l.launch(cfg) }?;
        Ok(())
    }
}

/// The tensors [`BackwardWorkspace::sum_slots`] sums into, one a slot, by
/// device address: their owner must keep them alive (and unmoved, as every
/// device allocation is) while these exist.
pub struct DgammaTargets {
    ptrs: CudaSlice<u64>,
    slots: usize,
    hidden: usize,
}

impl DgammaTargets {
    /// Targets of `hidden` floats each: every one of `targets` must be that
    /// long.
    pub fn new(gpu: &GpuContext, targets: &[&CudaSlice<f32>], hidden: usize) -> Result<Self> {
        if let Some(t) = targets.iter().find(|t| t.len() != hidden) {
            return Err(Error::ShapeMismatch {
                op: "rmsnorm",
                expected: format!("dgamma targets of {hidden} floats"),
                got: format!("one of {}", t.len()),
            });
        }
        let addresses: Vec<u64> = targets.iter().map(|t| address(gpu, *t)).collect();
        Ok(DgammaTargets {
            ptrs: gpu.upload(&addresses)?,
            slots: targets.len(),
            hidden,
        })
    }
}

/// Rows per chunk of the backward over `[rows, hidden]`, and chunks: those
/// of the build aligned rows take (the row-group builds, which take the
/// others, run with any chunking).
fn chunking(rows: usize, hidden: usize) -> (usize, usize) {
    let rows_per_chunk = match aligned_rows_build(hidden).layout {
        RowLayout::Warp => WARPS_PER_BLOCK * rows.div_ceil(WARPS_PER_BLOCK * MAX_CHUNKS),
        RowLayout::Group => rows.div_ceil(MAX_CHUNKS),
    }
    .max(1);
    (rows_per_chunk, rows.div_ceil(rows_per_chunk).max(1))
}

/// Where the backward puts its weight gradient.
pub enum Dgamma<'a, 'b> {
    /// Summed into this tensor right after the backward (a second launch).
    Now(&'a mut CudaViewMut<'b, f32>),
    /// Left as partials in slot `n`, for [`BackwardWorkspace::sum_slots`].
    Slot(usize),
    /// Not wanted (a frozen weight): the partials are never summed.
    Discarded,
}

/// Gradients of RMSNorm: `dx` `[rows, hidden]` and `dgamma` `[hidden]`
/// (overwritten, not accumulated). With `u = dy * gamma` and `r` the row's
/// inverse RMS: `dx_i = r u_i - x_i r^3 <u, x> / hidden`,
/// `dgamma_i = sum_rows dy_i x_i r`, summed in a fixed order.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    gpu: &mut GpuContext,
    x: &CudaView<'_, f32>,
    gamma: &CudaView<'_, f32>,
    dy: &CudaView<'_, f32>,
    rows: usize,
    hidden: usize,
    eps: f64,
    dx: &mut CudaViewMut<'_, f32>,
    dgamma: &mut CudaViewMut<'_, f32>,
    ws: &mut BackwardWorkspace,
) -> Result<()> {
    let out = DxOut {
        dx,
        onto: false,
        dx16: None,
    };
    let dgamma = Dgamma::Now(dgamma);
    backward_to(gpu, (x, gamma, dy), (rows, hidden, eps), out, dgamma, ws)
}

/// Where the backward puts `dx`: written to `dx`, or added onto what it
/// holds (`onto`: `dx += rmsnorm'(dy)`, the residual stream's gradient, in
/// the backward's own pass); with `dx16` also the result's bf16 rounding
/// (nearest, ties to even), the bf16 step's next GEMM operand.
pub struct DxOut<'a, 'b> {
    pub dx: &'a mut CudaViewMut<'b, f32>,
    pub onto: bool,
    pub dx16: Option<&'a mut CudaViewMut<'b, Bf16>>,
}

/// [`backward`] of `(x, gamma, dy)` with shape `(rows, hidden, eps)`, its
/// `dx` stored as `out` says and its `dgamma` as `dgamma` says.
pub fn backward_to(
    gpu: &mut GpuContext,
    (x, gamma, dy): (&CudaView<'_, f32>, &CudaView<'_, f32>, &CudaView<'_, f32>),
    (rows, hidden, eps): (usize, usize, f64),
    out: DxOut<'_, '_>,
    dgamma: Dgamma<'_, '_>,
    ws: &mut BackwardWorkspace,
) -> Result<()> {
    check_dims(rows, hidden)?;
    expect_len("rmsnorm", "x", x.len(), &[rows, hidden])?;
    expect_len("rmsnorm", "dy", dy.len(), &[rows, hidden])?;
    expect_len("rmsnorm", "dx", out.dx.len(), &[rows, hidden])?;
    if let Some(dx16) = &out.dx16 {
        expect_len("rmsnorm", "dx16", dx16.len(), &[rows, hidden])?;
    }
    expect_len("rmsnorm", "gamma", gamma.len(), &[hidden])?;
    if let Dgamma::Now(dgamma) = &dgamma {
        expect_len("rmsnorm", "dgamma", dgamma.len(), &[hidden])?;
    }
    if (ws.rows, ws.hidden) != (rows, hidden) {
        return Err(Error::ShapeMismatch {
            op: "rmsnorm",
            expected: format!("a workspace for [{rows}, {hidden}]"),
            got: format!("one for [{}, {}]", ws.rows, ws.hidden),
        });
    }
    // Under the fault the last row is neither written nor summed into dgamma.
    let rows_w = gpu.faults().written(rows);
    let (rows_i, hidden_i) = check_dims(rows_w, hidden)?;
    let eps_f = eps as f32;
    let per_chunk_i = to_i32("rmsnorm", "rows per chunk", ws.rows_per_chunk)?;
    let chunks_i = to_i32("rmsnorm", "chunks", ws.chunks)?;
    let DxOut { dx, onto, dx16 } = out;
    let build = bwd_build(
        hidden,
        packed(gpu, hidden, [x, gamma, dy], dx, dx16.as_deref()),
    );
    let region = ws.chunks * hidden;
    let first = match dgamma {
        Dgamma::Now(_) | Dgamma::Discarded => 0,
        Dgamma::Slot(n) if n < ws.slots => region * (1 + n),
        Dgamma::Slot(n) => {
            return Err(Error::InvalidArgument {
                op: "rmsnorm",
                message: format!("slot {n} of a workspace of {} slots", ws.slots),
            })
        }
    };
    let f = gpu.function(build.module, build.symbol)?;
    let cfg = bwd_config(gpu, build, ws.chunks, hidden)?;
    let onto_i = i32::from(onto);
    let no_dx16 = 0u64;
    let mut partials = ws.partials.slice_mut(first..first + region);
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(x).arg(gamma).arg(dy).arg(&mut *dx).arg(&mut partials);
    l.arg(&rows_i).arg(&hidden_i).arg(&eps_f);
    l.arg(&per_chunk_i).arg(&chunks_i).arg(&onto_i);
    match dx16 {
        Some(b) => l.arg(b),
        None => l.arg(&no_dx16),
    };
    // SAFETY: rmsnorm_bwd{_warp1,_warp2,_warp4,_warp8,,_wide}_f32(const float* x,
    // const float* gamma, const float* dy, float* dx, float* partials, int rows,
    // int hidden, float eps, int rows_per_chunk, int chunks, int onto, unsigned
    // short* dx16): x, dy, dx (and dx16 when given; a null pointer otherwise,
    // which the kernels test before every store) hold rows * hidden >= rows_i *
    // hidden elements, gamma hidden, partials chunks * hidden (one region of
    // the workspace, whose shape is checked above); dx and dx16 are mutable borrows aliasing no
    // input, and each thread reads the elements of dx it writes before it
    // writes them; chunk c touches rows [c * rows_per_chunk, min(rows_i, (c +
    // 1) * rows_per_chunk)) and partials row c; hidden <= the build's
    // max_hidden (bwd_build picks it), and a warp-per-row build, which loads
    // and stores 16-byte packs (8-byte ones of dx16), runs only on packed rows
    // (hidden % 4 == 0, every buffer aligned as `packed` checks), and blockDim
    // is as bwd_config documents, within the kernel's launch bounds.
    unsafe { l.launch(cfg) }?;
    match dgamma {
        Dgamma::Now(dgamma) => dgamma_final(gpu, build, &ws.partials, chunks_i, hidden_i, dgamma),
        Dgamma::Slot(_) | Dgamma::Discarded => Ok(()),
    }
}

/// The backward's launch over `chunks` chunks of rows `hidden` wide:
/// warp-per-row builds take blocks of `32 x WARPS_PER_BLOCK` threads; the
/// others a multiple of 32 threads with `4 * packs * x >= hidden`, and for
/// one pack up to [`ROWS_IN_PARALLEL`] row groups (`x * y <= 1024`).
fn bwd_config(
    gpu: &GpuContext,
    build: &BwdBuild,
    chunks: usize,
    hidden: usize,
) -> Result<LaunchConfig> {
    let mut cfg = row_loop_config(gpu, chunks, hidden, build.packs)?;
    match build.layout {
        RowLayout::Warp => cfg.block_dim = (32, WARPS_PER_BLOCK as u32, 1),
        RowLayout::Group if build.packs == 1 => {
            let per_row = cfg.block_dim.0;
            cfg.block_dim.1 = (1024 / per_row).clamp(1, ROWS_IN_PARALLEL);
        }
        RowLayout::Group => {}
    }
    Ok(cfg)
}

/// `dgamma[i] = sum_c partials[c, i]` in chunk order, launched as the
/// backward's programmatic dependent (its launch hides behind the
/// backward's tail; the kernel waits for the backward before it reads).
fn dgamma_final(
    gpu: &mut GpuContext,
    build: &BwdBuild,
    partials: &CudaSlice<f32>,
    chunks_i: i32,
    hidden_i: i32,
    dgamma: &mut CudaViewMut<'_, f32>,
) -> Result<()> {
    // hidden_i is in 1..=MAX_HIDDEN (check_dims), so its column blocks fit.
    let col_blocks = hidden_i.unsigned_abs().div_ceil(32);
    let cfg = LaunchConfig {
        grid_dim: (col_blocks, 1, 1),
        block_dim: (32, FINAL_GROUPS, 1),
        shared_mem_bytes: 0,
    };
    let f = gpu.function(build.module, DGAMMA_FINAL.0)?;
    let mut l = DependentLaunch::new(gpu, &f);
    l.buf(partials)
        .buf_mut(dgamma)
        .i32(hidden_i)
        .i32(chunks_i)
        .i32(hidden_i);
    // SAFETY: rmsnorm_bwd_dgamma_final_f32(const float* partials, float* dgamma,
    // int hidden, int chunks, int n_write): blockDim (32, 32) as its shared
    // table needs; reads chunks x hidden partials (the workspace's, checked
    // by the caller), writes dgamma[i] for i < hidden (its length, checked by
    // the caller); it waits for its predecessor, the backward that wrote the
    // partials, before it reads them.
    unsafe { l.launch(cfg) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dgamma_constants_are_the_kernels() {
        let define = |name| crate::kernels::cu_define(include_str!("../kernels/rmsnorm.cu"), name);
        assert_eq!(define("DGAMMA_GROUPS"), Some(FINAL_GROUPS as usize));
        assert_eq!(define("DGAMMA_NORMS"), Some(TABLE_NORMS as usize));
    }

    #[test]
    fn shapes_the_kernels_cannot_take_are_refused() {
        assert!(check_shape(300, MAX_HIDDEN).is_ok());
        assert!(check_shape(1, MAX_HIDDEN + 1).is_err());
        assert!(check_shape(1 << 31, 64).is_err());
        assert!(crate::ops::softmax::check_shape(4, 0).is_err());
        assert!(crate::ops::softmax::check_shape(4, 7).is_ok());
        assert!(crate::ops::cross_entropy::check_shape(0, 7).is_err());
        assert!(crate::ops::embedding::check_shape(8, 100, 0).is_err());
        assert!(crate::ops::embedding::check_shape(8, 1 << 31, 4).is_err());
        assert!(crate::ops::embedding::check_shape(8, 100, 4).is_ok());
    }

    #[test]
    fn each_row_width_takes_the_narrowest_build_that_holds_it() {
        let module = |hidden| bwd_build(hidden, true).module;
        for (hidden, expected) in [
            (1, "rmsnorm_bwd_warp1"),
            (128, "rmsnorm_bwd_warp1"),
            (129, "rmsnorm_bwd_warp2"),
            (512, "rmsnorm_bwd_warp4"),
            (896, "rmsnorm_bwd_warp8"),
            (1024, "rmsnorm_bwd_warp8"),
            (1025, "rmsnorm_bwd_block"),
            (ONE_PACK_HIDDEN, "rmsnorm_bwd_block"),
            (ONE_PACK_HIDDEN + 1, "rmsnorm_bwd_wide"),
            (MAX_HIDDEN, "rmsnorm_bwd_wide"),
        ] {
            assert_eq!(module(hidden), expected, "hidden {hidden}");
        }
    }

    #[test]
    fn rows_not_in_packs_take_the_row_group_builds() {
        let module = |hidden| bwd_build(hidden, false).module;
        for (hidden, expected) in [
            (1, "rmsnorm_bwd_block"),
            (33, "rmsnorm_bwd_block"),
            (1023, "rmsnorm_bwd_block"),
            (ONE_PACK_HIDDEN, "rmsnorm_bwd_block"),
            (ONE_PACK_HIDDEN + 1, "rmsnorm_bwd_wide"),
        ] {
            assert_eq!(module(hidden), expected, "hidden {hidden}");
        }
        assert_eq!(bwd_module_for(896), "rmsnorm_bwd_warp8");
        assert_eq!(bwd_module_for(894), "rmsnorm_bwd_block");
    }

    #[test]
    fn every_build_is_listed_with_its_kernels() {
        for build in &BWD_BUILDS {
            let listed = SIGNATURES.iter().find(|(m, _)| *m == build.module);
            let kernels: Vec<&str> = listed
                .map(|(_, k)| k.iter().map(|s| s.0).collect())
                .unwrap_or_default();
            let expected = [build.symbol, DGAMMA_FINAL.0, DGAMMA_TABLE.0];
            assert_eq!(kernels, expected, "{}", build.module);
        }
    }
}
