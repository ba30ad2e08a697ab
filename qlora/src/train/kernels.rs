//! Launchers for `kernels/train.cu`: the one-launch AdamW over a tensor table
//! with the step number in device memory, the device step counter, and a
//! layer's LoRA weight gradients in one pair of kernels.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use crate::error::{Error, Result};
use crate::gpu::{to_i32, GpuContext, TensorTable};
use crate::kernels::abi::{Arg, Signatures};
use crate::ops::launch::{expect_len, DependentLaunch};
use crate::ops::rope::QkvShape;
use crate::train::AdamW;

pub const MODULE: &str = "train";

/// Kernel argument lists, checked against the compiled PTX by a unit test.
pub const SIGNATURES: Signatures = &[
    ("step_count_advance_i32", &[Arg::Ptr, Arg::I32]),
    (
        "lora_grads_partial_tf32",
        &[
            Arg::Ptr,
            Arg::Ptr,
            Arg::Ptr,
            Arg::Ptr,
            Arg::I32,
            Arg::I32,
            Arg::I32,
            Arg::I32,
            Arg::I32,
            Arg::I32,
        ],
    ),
    (
        "lora_grads_final_f32",
        &[
            Arg::Ptr,
            Arg::I32,
            Arg::I32,
            Arg::Ptr,
            Arg::Ptr,
            Arg::Ptr,
            Arg::Ptr,
            Arg::I32,
            Arg::I32,
            Arg::I32,
            Arg::I32,
            Arg::F32,
        ],
    ),
    (
        "adamw_multi_devt_f32",
        &[
            Arg::Ptr,
            Arg::Ptr,
            Arg::I32,
            Arg::Ptr,
            Arg::F32,
            Arg::F32,
            Arg::F32,
            Arg::F32,
            Arg::F32,
        ],
    ),
];

/// Columns of the optimizer's tensor table: parameter, gradient, first and
/// second moment, clip scale (0 = none).
pub const ADAMW_COLUMNS: usize = 5;

fn same_len(what: &str, got: usize, want: usize) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(Error::ShapeMismatch {
            op: "train",
            expected: format!("{what}: {want} elements"),
            got: format!("{got}"),
        })
    }
}

/// AdamW on every tensor of `table` (columns p, g, m, v, scale; see
/// [`ADAMW_COLUMNS`]) in one launch, each gradient multiplied by its clip
/// scale first when the tensor has one, with the step number `t = step[0]`
/// read on the device. `lr_sign` is `1` for descent (`-1` only for the
/// sign-flip fault).
pub fn adamw_table(
    gpu: &mut GpuContext,
    table: &TensorTable,
    step: &CudaSlice<i32>,
    hyper: &AdamW,
    lr_sign: f32,
) -> Result<()> {
    same_len("table columns", table.columns, ADAMW_COLUMNS)?;
    same_len("step", step.len(), 1)?;
    let n = to_i32("adamw", "tensors", table.tensors)?;
    let k = crate::ops::adamw::as_kernel_args(hyper);
    let lr = lr_sign * k.lr as f32;
    let (b1, b2, eps, wd) = (
        k.beta1 as f32,
        k.beta2 as f32,
        k.eps as f32,
        k.weight_decay as f32,
    );
    let f = gpu.function(MODULE, "adamw_multi_devt_f32")?;
    let cfg = gpu.launch_1d(table.total);
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(&table.ptrs).arg(&table.offsets).arg(&n).arg(step);
    l.arg(&lr).arg(&b1).arg(&b2).arg(&eps).arg(&wd);
    // SAFETY: adamw_multi_devt_f32(const unsigned long long* ptrs, const long
    // long* offsets, int n_tensors, const int* step, float lr, float beta1,
    // float beta2, float eps, float weight_decay): the table has 5 columns
    // of n_tensors addresses of live f32 buffers (the trainer that built it
    // owns them and never reallocates them) whose lengths are the offsets'
    // differences, or 0 in the scale column; p, m, v of one tensor are
    // distinct buffers, and no tensor appears twice; step holds one element.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// `step[0] += by` on the device.
pub fn advance_step(gpu: &mut GpuContext, step: &mut CudaSlice<i32>, by: i32) -> Result<()> {
    same_len("step", step.len(), 1)?;
    let f = gpu.function(MODULE, "step_count_advance_i32")?;
    let cfg = crate::gpu::launch_config_1d(1, 1);
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(step).arg(&by);
    // SAFETY: step_count_advance_i32(int* step, int by): step holds one
    // element (checked above); only thread 0 of block 0 touches it.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// The largest LoRA rank [`lora_grads_tf32`] takes (`LORA_RANKS` in train.cu).
pub const LORA_GRADS_MAX_RANK: usize = 16;
/// Columns of a wide operand one warp of `lora_grads_partial_tf32` takes
/// (`LORA_M`).
const LORA_GRADS_COLS: usize = 16;
/// Warps of a block of `lora_grads_partial_tf32` (`LORA_WARPS`).
const LORA_GRADS_WARPS: usize = 8;
/// Rows of one slice (`LORA_SLICE`).
const LORA_GRADS_SLICE: usize = 64;
/// Partial sums of one tile and slice (`LORA_TILE`).
const LORA_GRADS_TILE_FLOATS: usize = LORA_GRADS_COLS * LORA_GRADS_MAX_RANK;

/// The gradients [`lora_grads_tf32`] writes: `dBq [q_dim, r]`, `dBv [kv_dim,
/// r]`, `dAq [r, hidden]`, `dAv [r, hidden]`, row-major.
pub struct LoraGrads<'a> {
    pub dbq: &'a mut CudaSlice<f32>,
    pub dbv: &'a mut CudaSlice<f32>,
    pub daq: &'a mut CudaSlice<f32>,
    pub dav: &'a mut CudaSlice<f32>,
}

/// Scratch of [`lora_grads_tf32`]: the partial sums of every column tile of
/// the four products over every slice of rows. Allocated once per shape, so
/// the step allocates nothing (and can be captured in a graph).
pub struct LoraGradsWorkspace {
    partials: CudaSlice<f32>,
}

impl LoraGradsWorkspace {
    /// Scratch for the LoRA gradients of `sh` with `hidden` columns of `n1`.
    pub fn new(gpu: &GpuContext, sh: &QkvShape, hidden: usize) -> Result<Self> {
        Ok(LoraGradsWorkspace {
            partials: gpu.zeros(Self::floats(sh, hidden))?,
        })
    }

    /// Floats of the scratch.
    pub fn floats(sh: &QkvShape, hidden: usize) -> usize {
        let (tiles, slices) = Self::tiles_and_slices(sh, hidden);
        tiles * slices * LORA_GRADS_TILE_FLOATS
    }

    /// Column tiles of the four products, and slices of the rows.
    fn tiles_and_slices(sh: &QkvShape, hidden: usize) -> (usize, usize) {
        let tiles = sh.q_dim().div_ceil(LORA_GRADS_COLS)
            + sh.kv_dim().div_ceil(LORA_GRADS_COLS)
            + 2 * hidden.div_ceil(LORA_GRADS_COLS);
        (tiles, sh.rows.div_ceil(LORA_GRADS_SLICE))
    }
}

/// Whether [`lora_grads_tf32`] runs on `gpu`: it needs TF32 tensor cores
/// (compute capability 8.0; below it the kernel's body is empty).
pub fn lora_grads_tf32_runs(gpu: &GpuContext) -> bool {
    gpu.facts().compute_capability.0 >= 8
}

/// One layer's LoRA weight gradients of q and v, from the LoRA
/// down-projections `u = uq | uv` (`[rows, 2 r]`, the fused projection's
/// output `y = n1 S^T` past its q, k, v columns, as
/// [`crate::ops::rope::qkv_forward`] copies them), the gradient `dy` of that
/// output (`[rows, width]`, columns `q | k | v | uq | uv`, [`QkvShape`]) and
/// the norm's output `n1` (`[rows, hidden]`):
///
/// `dBq = s dy_q^T uq`, `dBv = s dy_v^T uv`, `dAq = duq^T n1`, `dAv = duv^T n1`
///
/// (`duq`, `duv` already carry `s`), in TF32 math as cuBLAS's TF32 GEMMs
/// compute them (operands rounded to tf32, f32 sums): slices of rows summed
/// by one kernel, the slices added in order by a second, so every entry is
/// the same on every run. Needs compute capability 8.0 (TF32 tensor cores).
pub fn lora_grads_tf32(
    gpu: &mut GpuContext,
    (sh, hidden, s): (&QkvShape, usize, f32),
    (u, dy, n1): (&CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>),
    ws: &mut LoraGradsWorkspace,
    out: LoraGrads<'_>,
) -> Result<()> {
    check_lora_grads(gpu, (sh, hidden), (u, dy, n1), ws, &out)?;
    let (tiles, slices) = LoraGradsWorkspace::tiles_and_slices(sh, hidden);
    let i32_of = |what, v| to_i32("lora_grads", what, v);
    // The kernels' int arguments; the kernels compute `width` from them.
    let dims = LoraDims {
        tiles: i32_of("tiles", tiles)?,
        slices: i32_of("slices", slices)?,
        rows: i32_of("rows", sh.rows)?,
        shape: [
            i32_of("hidden", hidden)?,
            i32_of("q_dim", sh.q_dim())?,
            i32_of("kv_dim", sh.kv_dim())?,
            i32_of("rank", sh.rank)?,
        ],
    };
    // Sizes the kernels compute in int: they must fit one.
    i32_of("width", sh.width())?;
    i32_of("outputs", tiles * LORA_GRADS_TILE_FLOATS)?;
    launch_lora_partial(gpu, &dims, (u, dy, n1), ws)?;
    launch_lora_final(gpu, &dims, ws, out, s)
}

/// The int arguments of the two LoRA-gradient kernels.
struct LoraDims {
    tiles: i32,
    slices: i32,
    rows: i32,
    /// `hidden, q_dim, kv_dim, r`.
    shape: [i32; 4],
}

/// Refuses what [`lora_grads_tf32`] cannot take, by name: a device before
/// compute capability 8.0, an empty shape, a rank above
/// [`LORA_GRADS_MAX_RANK`], a buffer or scratch of another length.
fn check_lora_grads(
    gpu: &GpuContext,
    (sh, hidden): (&QkvShape, usize),
    (u, dy, n1): (&CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>),
    ws: &LoraGradsWorkspace,
    out: &LoraGrads<'_>,
) -> Result<()> {
    let (rows, r) = (sh.rows, sh.rank);
    let cc = gpu.facts().compute_capability;
    if r == 0 || r > LORA_GRADS_MAX_RANK || rows == 0 || hidden == 0 || !lora_grads_tf32_runs(gpu) {
        return Err(Error::InvalidArgument {
            op: "lora_grads",
            message: format!(
                "need compute capability 8.0, rows, hidden and a rank of 1..={LORA_GRADS_MAX_RANK}: \
                 compute capability {}.{}, rows {rows}, hidden {hidden}, rank {r}",
                cc.0, cc.1
            ),
        });
    }
    const OP: &str = "lora_grads";
    expect_len(OP, "u", u.len(), &[rows, 2 * r])?;
    expect_len(OP, "dy", dy.len(), &[rows, sh.width()])?;
    expect_len(OP, "n1", n1.len(), &[rows, hidden])?;
    expect_len(OP, "dBq", out.dbq.len(), &[sh.q_dim(), r])?;
    expect_len(OP, "dBv", out.dbv.len(), &[sh.kv_dim(), r])?;
    expect_len(OP, "dAq", out.daq.len(), &[r, hidden])?;
    expect_len(OP, "dAv", out.dav.len(), &[r, hidden])?;
    let floats = LoraGradsWorkspace::floats(sh, hidden);
    expect_len(OP, "scratch", ws.partials.len(), &[floats])
}

/// `lora_grads_partial_tf32`: each slice's sums into the scratch.
fn launch_lora_partial(
    gpu: &mut GpuContext,
    dims: &LoraDims,
    (u, dy, n1): (&CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>),
    ws: &mut LoraGradsWorkspace,
) -> Result<()> {
    let f = gpu.function(MODULE, "lora_grads_partial_tf32")?;
    let blocks = dims.tiles.unsigned_abs().div_ceil(LORA_GRADS_WARPS as u32);
    let cfg = LaunchConfig {
        grid_dim: (blocks, dims.slices.unsigned_abs(), 1),
        block_dim: (32 * LORA_GRADS_WARPS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(u).arg(dy).arg(n1).arg(&mut ws.partials);
    l.arg(&dims.tiles).arg(&dims.rows);
    for v in &dims.shape {
        l.arg(v);
    }
    // SAFETY: lora_grads_partial_tf32(const float* u, const float* dy, const
    // float* n1, float* partials, int tiles, int rows, int hidden, int q_dim,
    // int kv_dim, int r): u holds rows x 2 r, dy rows x width, n1 rows x hidden
    // (check_lora_grads), r <= LORA_RANKS, on a device of compute capability
    // 8.0 or later (the kernel's body); warp w of block (x, slice) takes tile
    // x * LORA_WARPS + w < tiles and writes its LORA_TILE partials of that
    // slice, inside the scratch sized tiles x slices x LORA_TILE.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// `lora_grads_final_f32`: the slices added in order, scaled, into `out`;
/// a programmatic dependent of the partial kernel.
fn launch_lora_final(
    gpu: &mut GpuContext,
    dims: &LoraDims,
    ws: &LoraGradsWorkspace,
    out: LoraGrads<'_>,
    s: f32,
) -> Result<()> {
    let f = gpu.function(MODULE, "lora_grads_final_f32")?;
    let mut l = DependentLaunch::new(gpu, &f);
    l.buf(&ws.partials).i32(dims.tiles).i32(dims.slices);
    l.buf_mut(out.dbq).buf_mut(out.dbv);
    l.buf_mut(out.daq).buf_mut(out.dav);
    for &v in &dims.shape {
        l.i32(v);
    }
    l.f32(s);
    let threads = 32 * LORA_GRADS_WARPS as u32;
    let outputs = dims.tiles.unsigned_abs() * LORA_GRADS_TILE_FLOATS as u32;
    let cfg = LaunchConfig {
        grid_dim: (outputs.div_ceil(threads), 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: lora_grads_final_f32(const float* partials, int tiles, int
    // slices, float* dbq, float* dbv, float* daq, float* dav, int hidden, int
    // q_dim, int kv_dim, int r, float s): one thread per partial of a slice
    // (tiles x LORA_TILE, which fits an int, past the last returning),
    // reading the scratch's slices and writing the outputs only at entries
    // inside their products' sizes (check_lora_grads); the four outputs are
    // distinct mutable borrows. It waits for the partial kernel before it
    // reads the scratch.
    unsafe { l.launch(cfg) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of `#define name` in train.cu.
    fn cu_define(name: &str) -> Option<usize> {
        crate::kernels::cu_define(include_str!("../kernels/train.cu"), name)
    }

    /// The launcher sizes the grid and the scratch by the kernel's own tile,
    /// warp and slice sizes.
    #[test]
    fn lora_grads_constants_are_the_kernels() {
        assert_eq!(cu_define("LORA_M"), Some(LORA_GRADS_COLS));
        assert_eq!(cu_define("LORA_RANKS"), Some(LORA_GRADS_MAX_RANK));
        assert_eq!(cu_define("LORA_WARPS"), Some(LORA_GRADS_WARPS));
        assert_eq!(cu_define("LORA_SLICE"), Some(LORA_GRADS_SLICE));
    }
}
