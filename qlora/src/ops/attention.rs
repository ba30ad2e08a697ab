//! Launchers for `kernels/attention.cu`: causal grouped-query attention in
//! f32, forward and backward:
//!
//! - `q`, `out` `[batch, seq, heads, head_dim]`; `k`, `v` `[batch, seq, kv_heads, head_dim]`;
//!   query head `h` reads kv head `h / (heads / kv_heads)`;
//! - `P = causal_softmax(S)`, `S_ij = <q_i, k_j> / sqrt(head_dim)`, `out_i = sum_j P_ij v_j`;
//!   `probs` (`[batch, heads, seq, seq]`, zeros above the diagonal) is saved for backward;
//! - backward from `P` and `out`: `dS = P (dP - D)` with `dP_ij = <dout_i, v_j>`
//!   and `D_i = <dout_i, out_i>` (= `sum_j P_ij dP_ij`), `dq = s dS k`,
//!   `dk = s dS^T q`, `dv = P^T dout`, kv gradients summed over the heads of
//!   their group.
//!
//! Two sets of kernels compute this ([`AttnKernels`]): the f32 kernels
//! (tiles of 32 rows, two per thread, every product an f32 FMA) under FP32
//! math, and the tensor-core kernels (16 rows per warp, products by TF32
//! `mma.sync`, f32 accumulation and softmax) under TF32 math, with the same
//! arguments and outputs. Each has a build for head_dim <= 64 and one for
//! head_dim <= 128 (see the comment at the top of the `.cu` file). The f32
//! forward is one pass over the keys (online softmax), the tensor-core one
//! two (the row statistics, then P and P v). The backward is deterministic (no atomics): `attention_bwd_dq_*` writes
//! `dS` to a caller's scratch buffer (the training step's workspace owns one,
//! so nothing is allocated per step), `attention_bwd_dkv_*` gathers each
//! query head's share of `dk` and `dv` per tile of key rows into the same
//! scratch, and `attention_bwd_kv_sum_f32` adds the shares of a group in a
//! fixed order.

use cudarc::driver::{CudaSlice, LaunchArgs, LaunchConfig, PushKernelArg};

use super::gemm::{grid_dim, to_i64};
use super::launch::expect_len;
use crate::error::{Error, Result};
use crate::faults::Faults;
use crate::gpu::{launch_config_1d, to_i32, GemmMath, GpuContext};
use crate::kernels::abi::{Arg, Signatures};

/// One kernel: the module that holds it and its symbol.
#[derive(Debug, Clone, Copy)]
struct Kernel {
    module: &'static str,
    symbol: &'static str,
}

/// Which kernels compute attention in one direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnKernels {
    /// The f32 kernels: every product in f32 on the CUDA cores.
    F32,
    /// The tensor-core kernels: products of TF32-rounded inputs, f32
    /// accumulation and f32 softmax.
    TensorCores,
}

impl AttnKernels {
    /// The kernels for GEMM math `math` in force with `faults`: TF32 math runs
    /// on the tensor cores, FP32 math on the f32 kernels, and so does TF32
    /// under [`Faults::gemm_without_tensor_ops`] (as the GEMMs do).
    pub fn for_math(math: GemmMath, faults: Faults) -> Self {
        match math {
            GemmMath::Tf32 if !faults.gemm_without_tensor_ops => AttnKernels::TensorCores,
            _ => AttnKernels::F32,
        }
    }
}

/// One build of the tiled kernels (see the `.cu` file, whose builds pad
/// head_dim to 64 or 128): its block (threads, and rows of a tile), the
/// floats of dynamic shared memory of its forward and dq kernels
/// (`row_smem`) and of its dk/dv kernel (`kv_smem`), and its kernels, each
/// in a module of its own.
struct Build {
    threads: u32,
    rows: usize,
    row_smem: usize,
    kv_smem: usize,
    fwd: Kernel,
    dq: Kernel,
    dkv: Kernel,
    /// The (not tiled) kernel that adds the group's dk/dv shares; the dkv
    /// module holds it.
    kv_sum: Kernel,
}

const KV_SUM: &str = "attention_bwd_kv_sum_f32";

/// Rows of a tile of the f32 kernels (`ATT_ROWS`).
const TILE_ROWS: usize = 32;

/// Query rows per staged chunk of the f32 dk/dv kernel (`AttShape::QCHUNK`).
const QUERY_CHUNK: usize = 32;

/// Shared memory of the f32 forward and dq kernels with keys per chunk
/// `chunk` (`AttShape::CHUNK`): a row tile and a key chunk (rows padded to
/// d + 1) and a 32 x (chunk + 1) tile of probabilities.
const fn f32_row_smem(d: usize, chunk: usize) -> usize {
    (TILE_ROWS + chunk) * (d + 1) + TILE_ROWS * (chunk + 1)
}

/// Shared memory of the f32 dk/dv kernel: a chunk of q and of dout rows and
/// the matching 32 x 33 tiles of dS and P.
const fn f32_kv_smem(d: usize) -> usize {
    2 * QUERY_CHUNK * (d + 1) + 2 * TILE_ROWS * (QUERY_CHUNK + 1)
}

/// Floats of shared memory of every tensor-core kernel, in both builds
/// (`TcShape::SMEM_FLOATS`, asserted there): the 64 query rows padded to
/// d + 8 for d = 128, or the dk/dv kernel's two stages of a q and a dout
/// chunk of 32 rows padded to d + 4 for d = 64, both 8,704.
const TC_SMEM: usize = 8_704;

/// Rows of a tensor-core tile (`TC_ROWS`): four row groups of 16.
const TC_ROWS: usize = 64;

const fn kernel(module: &'static str, symbol: &'static str) -> Kernel {
    Kernel { module, symbol }
}

const F32_D64: Build = Build {
    threads: 256,
    rows: TILE_ROWS,
    row_smem: f32_row_smem(64, 64),
    kv_smem: f32_kv_smem(64),
    fwd: kernel("attention_fwd_d64", "attention_fwd_d64_f32"),
    dq: kernel("attention_dq_d64", "attention_bwd_dq_d64_f32"),
    dkv: kernel("attention_dkv_d64", "attention_bwd_dkv_d64_f32"),
    kv_sum: kernel("attention_dkv_d64", KV_SUM),
};

const F32_D128: Build = Build {
    threads: 256,
    rows: TILE_ROWS,
    row_smem: f32_row_smem(128, 32),
    kv_smem: f32_kv_smem(128),
    fwd: kernel("attention_fwd_d128", "attention_fwd_d128_f32"),
    dq: kernel("attention_dq_d128", "attention_bwd_dq_d128_f32"),
    dkv: kernel("attention_dkv_d128", "attention_bwd_dkv_d128_f32"),
    kv_sum: kernel("attention_dkv_d128", KV_SUM),
};

// Threads: 32 per row group and split part (`TcShape::THREADS`), one part
// in both builds.
const TC_D64: Build = Build {
    threads: 128,
    rows: TC_ROWS,
    row_smem: TC_SMEM,
    kv_smem: TC_SMEM,
    fwd: kernel("attention_tc_fwd_d64", "attention_tc_fwd_d64_f32"),
    dq: kernel("attention_tc_dq_d64", "attention_tc_bwd_dq_d64_f32"),
    dkv: kernel("attention_tc_dkv_d64", "attention_tc_bwd_dkv_d64_f32"),
    kv_sum: kernel("attention_tc_dkv_d64", KV_SUM),
};

const TC_D128: Build = Build {
    threads: 128,
    rows: TC_ROWS,
    row_smem: TC_SMEM,
    kv_smem: TC_SMEM,
    fwd: kernel("attention_tc_fwd_d128", "attention_tc_fwd_d128_f32"),
    dq: kernel("attention_tc_dq_d128", "attention_tc_bwd_dq_d128_f32"),
    dkv: kernel("attention_tc_dkv_d128", "attention_tc_bwd_dkv_d128_f32"),
    kv_sum: kernel("attention_tc_dkv_d128", KV_SUM),
};

/// The build of `kernels` for `head_dim` (validated <= [`MAX_HEAD_DIM`]).
fn build(head_dim: usize, kernels: AttnKernels) -> &'static Build {
    match (head_dim <= 64, kernels) {
        (true, AttnKernels::F32) => &F32_D64,
        (false, AttnKernels::F32) => &F32_D128,
        (true, AttnKernels::TensorCores) => &TC_D64,
        (false, AttnKernels::TensorCores) => &TC_D128,
    }
}

/// The build whose forward runs `kernels` for `head_dim`: the tensor-core
/// forward moves q, k and v in 16-byte pieces only (its module compiles
/// faster without a scalar path, and it is on the cold pre-warm's critical
/// path), so a head_dim that is not a multiple of four takes the f32
/// forward. q, k and v are whole allocations, so with head_dim % 4 == 0
/// every row starts 16-byte aligned.
fn fwd_build(head_dim: usize, kernels: AttnKernels) -> &'static Build {
    let packed = head_dim.is_multiple_of(4);
    build(head_dim, if packed { kernels } else { AttnKernels::F32 })
}

/// The dimensions of one attention call: `q` is `[batch, seq, heads,
/// head_dim]`, `k` and `v` are `[batch, seq, kv_heads, head_dim]`, and query
/// head `h` reads kv head `h / (heads / kv_heads)` (grouped-query attention).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnShape {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// The kernel modules the launchers use for `head_dim` with `fwd` kernels
/// in the forward and `bwd` kernels in the backward: the forward's module,
/// then the backward's two (the dk/dv one holds kv_sum).
pub fn modules_for(head_dim: usize, fwd: AttnKernels, bwd: AttnKernels) -> [&'static str; 3] {
    let (f, b) = (fwd_build(head_dim, fwd), build(head_dim, bwd));
    [f.fwd.module, b.dq.module, b.dkv.module]
}

/// Argument lists of the kernels, in the order the launchers push them.
const FWD_ARGS: &[Arg] = &[
    Arg::Ptr,
    Arg::Ptr,
    Arg::Ptr,
    Arg::Ptr,
    Arg::Ptr,
    Arg::I32,
    Arg::I32,
    Arg::I32,
    Arg::I32,
    Arg::I32,
    Arg::F32,
    Arg::I64,
];
const DQ_ARGS: &[Arg] = &[
    Arg::Ptr,
    Arg::Ptr,
    Arg::Ptr,
    Arg::Ptr,
    Arg::Ptr,
    Arg::Ptr,
    Arg::Ptr,
    Arg::I32,
    Arg::I32,
    Arg::I32,
    Arg::I32,
    Arg::I32,
    Arg::F32,
];
const DKV_ARGS: &[Arg] = &[
    Arg::Ptr,
    Arg::Ptr,
    Arg::Ptr,
    Arg::Ptr,
    Arg::Ptr,
    Arg::Ptr,
    Arg::I32,
    Arg::I32,
    Arg::I32,
    Arg::I32,
];
const KV_SUM_ARGS: &[Arg] = &[
    Arg::Ptr,
    Arg::Ptr,
    Arg::Ptr,
    Arg::Ptr,
    Arg::I32,
    Arg::I32,
    Arg::I32,
    Arg::I32,
    Arg::I32,
    Arg::F32,
    Arg::I64,
];

/// The modules of each build and the kernels each holds.
macro_rules! signatures {
    ($($b:ident),*) => {
        &[$(
            ($b.fwd.module, &[($b.fwd.symbol, FWD_ARGS)]),
            ($b.dq.module, &[($b.dq.symbol, DQ_ARGS)]),
            ($b.dkv.module, &[($b.dkv.symbol, DKV_ARGS), (KV_SUM, KV_SUM_ARGS)]),
        )*]
    };
}

/// The kernels of each module, by module, checked against their PTX by a
/// unit test.
pub const SIGNATURES: &[(&str, Signatures)] = signatures!(F32_D64, F32_D128, TC_D64, TC_D128);

/// The largest head_dim the kernels' builds take.
pub const MAX_HEAD_DIM: usize = 128;

/// Grid limit of the y and z dimensions.
const MAX_GRID_YZ: u32 = 65_535;

/// Element counts of `q`, `k`/`v` and `probs`.
pub fn lens(sh: &AttnShape) -> (usize, usize, usize) {
    (
        sh.batch * sh.seq * sh.heads * sh.head_dim,
        sh.batch * sh.seq * sh.kv_heads * sh.head_dim,
        sh.batch * sh.heads * sh.seq * sh.seq,
    )
}

/// The kernels' scalar arguments, validated.
struct Dims {
    batch: i32,
    seq: i32,
    heads: i32,
    kv_heads: i32,
    head_dim: i32,
    scale: f32,
}

impl Dims {
    /// Pushes `batch, seq, heads, kv_heads, head_dim, scale`, in that order
    /// (the tail of the forward, dq and kv_sum argument lists).
    fn push<'a>(&'a self, launch: &mut LaunchArgs<'a>) {
        launch
            .arg(&self.batch)
            .arg(&self.seq)
            .arg(&self.heads)
            .arg(&self.kv_heads)
            .arg(&self.head_dim)
            .arg(&self.scale);
    }
}

/// Checks that `sh` is a shape the kernels take (the launchers check it
/// too, through the same rules): no empty dimension, heads a multiple of
/// kv_heads (each kv head serves a whole group of query heads), head_dim at
/// most [`MAX_HEAD_DIM`] (the widest build), heads and batch within the
/// grid's y and z limits, and every dimension within the kernels' `int`.
pub fn check_shape(sh: &AttnShape) -> Result<()> {
    validate(sh).map(|_| ())
}

fn validate(sh: &AttnShape) -> Result<Dims> {
    let bad = |message: String| Error::InvalidArgument {
        op: "attention",
        message,
    };
    if sh.batch == 0 || sh.seq == 0 || sh.heads == 0 || sh.head_dim == 0 {
        return Err(bad(format!("empty shape {sh:?}")));
    }
    if sh.kv_heads == 0 || !sh.heads.is_multiple_of(sh.kv_heads) {
        return Err(bad(format!(
            "heads ({}) must be a multiple of kv_heads ({})",
            sh.heads, sh.kv_heads
        )));
    }
    if sh.head_dim > MAX_HEAD_DIM {
        return Err(bad(format!(
            "head_dim {} exceeds the kernels' {MAX_HEAD_DIM}",
            sh.head_dim
        )));
    }
    grid_dim("attention", "heads", sh.heads, MAX_GRID_YZ)?;
    grid_dim("attention", "batch", sh.batch, MAX_GRID_YZ)?;
    Ok(Dims {
        batch: to_i32("attention", "batch", sh.batch)?,
        seq: to_i32("attention", "seq", sh.seq)?,
        heads: to_i32("attention", "heads", sh.heads)?,
        kv_heads: to_i32("attention", "kv_heads", sh.kv_heads)?,
        head_dim: to_i32("attention", "head_dim", sh.head_dim)?,
        scale: (1.0 / (sh.head_dim as f64).sqrt()) as f32,
    })
}

/// One block of `b.threads` per (`b.rows` rows, head, batch), with
/// `floats` of dynamic shared memory.
fn tile_config(sh: &AttnShape, b: &Build, floats: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (
            sh.seq.div_ceil(b.rows) as u32,
            sh.heads as u32,
            sh.batch as u32,
        ),
        block_dim: (b.threads, 1, 1),
        shared_mem_bytes: (floats * 4) as u32,
    }
}

/// The forward and dq kernels: one block per tile of query rows. Every
/// build stays within the 48 KiB a launch gets without opting in (see the
/// unit test).
fn row_config(sh: &AttnShape, b: &Build) -> LaunchConfig {
    tile_config(sh, b, b.row_smem)
}

/// The dk/dv kernel: one block per tile of key rows.
fn kv_config(sh: &AttnShape, b: &Build) -> LaunchConfig {
    tile_config(sh, b, b.kv_smem)
}

/// Forward with GEMM math `math` (TF32: the tensor-core kernels, see
/// [`AttnKernels::for_math`]): writes `out` and `probs`.
pub fn forward(
    gpu: &mut GpuContext,
    math: GemmMath,
    (q, k, v): (&CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>),
    out: &mut CudaSlice<f32>,
    probs: &mut CudaSlice<f32>,
    sh: &AttnShape,
) -> Result<()> {
    let len = gpu.faults().written(out.len());
    let b = fwd_build(sh.head_dim, AttnKernels::for_math(math, gpu.faults()));
    forward_limited(gpu, b, (q, k, v), out, probs, sh, len)
}

fn forward_limited(
    gpu: &mut GpuContext,
    b: &Build,
    (q, k, v): (&CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>),
    out: &mut CudaSlice<f32>,
    probs: &mut CudaSlice<f32>,
    sh: &AttnShape,
    write_limit: usize,
) -> Result<()> {
    let d = validate(sh)?;
    let (q_len, kv_len, p_len) = lens(sh);
    expect_len("attention", "q", q.len(), &[q_len])?;
    expect_len("attention", "k", k.len(), &[kv_len])?;
    expect_len("attention", "v", v.len(), &[kv_len])?;
    expect_len("attention", "out", out.len(), &[q_len])?;
    expect_len("attention", "probs", probs.len(), &[p_len])?;
    let limit = to_i64("attention", write_limit.min(q_len))?;
    let cfg = row_config(sh, b);
    let func = gpu.function(b.fwd.module, b.fwd.symbol)?;
    let mut launch = gpu.stream().launch_builder(&func);
    launch.arg(q).arg(k).arg(v).arg(out).arg(probs);
    d.push(&mut launch);
    launch.arg(&limit);
    // SAFETY: arguments match `attention_fwd_dXX_f32` and
    // `attention_tc_fwd_dXX_f32(const float* q, const float* k, const float*
    // v, float* out, float* probs, int batch, int seq, int heads, int
    // kv_heads, int head_dim, float scale, long long write_limit)` in order
    // and type. The lengths were checked against the shape above; heads is a
    // multiple of kv_heads, so every kv head index is < kv_heads. The grid is
    // (ceil(seq / rows), heads, batch) for the build's tile rows; each block
    // touches only its rows of q/out/probs (guarded by i < seq) and rows
    // j < seq of k and v (columns t < head_dim), and uses the dynamic shared
    // memory row_config provides for the build (head_dim <= 64 or <= 128;
    // validate() refused more). The block has the build's thread count, the
    // one its kernels' tiling assumes (256 for f32, 32 per 16-row warp tile
    // for the tensor-core kernels). The tensor-core kernels' zero-filling
    // cp.async copies of rows past seq read nothing (their source address is
    // the tensor's first row, which exists).
    unsafe { launch.launch(cfg) }?;
    Ok(())
}

/// Floats of the scratch [`backward`] needs: `dS` (the length of `probs`)
/// and each query head's share of `dk` and `dv` (twice the length of `q`).
pub fn backward_scratch_len(sh: &AttnShape) -> usize {
    let (q_len, _, p_len) = lens(sh);
    p_len + 2 * q_len
}

/// Backward from the saved `probs` with GEMM math `math` (TF32: the
/// tensor-core kernels): writes `dq`, `dk`, `dv`, using `scratch`
/// ([`backward_scratch_len`] floats) for `dS` and the per-head shares.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    gpu: &mut GpuContext,
    math: GemmMath,
    (q, k, v): (&CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>),
    out: &CudaSlice<f32>,
    probs: &CudaSlice<f32>,
    dout: &CudaSlice<f32>,
    scratch: &mut CudaSlice<f32>,
    (dq, dk, dv): (
        &mut CudaSlice<f32>,
        &mut CudaSlice<f32>,
        &mut CudaSlice<f32>,
    ),
    sh: &AttnShape,
) -> Result<()> {
    let len = gpu.faults().written(dv.len());
    let b = build(sh.head_dim, AttnKernels::for_math(math, gpu.faults()));
    backward_limited(
        gpu,
        b,
        (q, k, v),
        out,
        probs,
        dout,
        scratch,
        (dq, dk, dv),
        sh,
        len,
    )
}

#[allow(clippy::too_many_arguments)]
fn backward_limited(
    gpu: &mut GpuContext,
    b: &Build,
    (q, k, v): (&CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>),
    out: &CudaSlice<f32>,
    probs: &CudaSlice<f32>,
    dout: &CudaSlice<f32>,
    scratch: &mut CudaSlice<f32>,
    (dq, dk, dv): (
        &mut CudaSlice<f32>,
        &mut CudaSlice<f32>,
        &mut CudaSlice<f32>,
    ),
    sh: &AttnShape,
    dv_write_limit: usize,
) -> Result<()> {
    let d = validate(sh)?;
    let (q_len, kv_len, p_len) = lens(sh);
    expect_len("attention", "q", q.len(), &[q_len])?;
    expect_len("attention", "k", k.len(), &[kv_len])?;
    expect_len("attention", "v", v.len(), &[kv_len])?;
    expect_len("attention", "out", out.len(), &[q_len])?;
    expect_len("attention", "probs", probs.len(), &[p_len])?;
    expect_len("attention", "dout", dout.len(), &[q_len])?;
    expect_len("attention", "dq", dq.len(), &[q_len])?;
    expect_len("attention", "dk", dk.len(), &[kv_len])?;
    expect_len("attention", "dv", dv.len(), &[kv_len])?;
    expect_len(
        "attention",
        "scratch",
        scratch.len(),
        &[backward_scratch_len(sh)],
    )?;
    let limit = to_i64("attention", dv_write_limit.min(kv_len))?;
    let (mut ds, mut shares) = scratch.split_at_mut(p_len);
    let (mut pk, mut pv) = shares.split_at_mut(q_len);

    let cfg = row_config(sh, b);
    let func = gpu.function(b.dq.module, b.dq.symbol)?;
    let mut launch = gpu.stream().launch_builder(&func);
    launch
        .arg(k)
        .arg(v)
        .arg(probs)
        .arg(out)
        .arg(dout)
        .arg(&mut *dq)
        .arg(&mut ds);
    d.push(&mut launch);
    // SAFETY: arguments match `attention_bwd_dq_dXX_f32` and
    // `attention_tc_bwd_dq_dXX_f32(const float* k,
    // const float* v, const float* probs, const float* out, const float* dout,
    // float* dq, float* ds, int batch, int seq, int heads, int kv_heads, int
    // head_dim, float scale)` in order and type. Lengths were checked against
    // the shape (ds is the first probs-length part of the scratch); the grid
    // is (ceil(seq / rows), heads, batch), each block reads rows j < seq of k
    // and v and its rows i < seq of probs, out and dout, writes entries
    // j <= i of those rows of ds (the tensor-core kernel may also write
    // entry i + 1 of a row, inside the row since seq is even then, which
    // nothing reads) and the rows of dq, and uses the dynamic shared memory
    // row_config provides for its build, with the build's thread count.
    unsafe { launch.launch(cfg) }?;

    let cfg = kv_config(sh, b);
    let func = gpu.function(b.dkv.module, b.dkv.symbol)?;
    let mut launch = gpu.stream().launch_builder(&func);
    launch
        .arg(q)
        .arg(dout)
        .arg(probs)
        .arg(&mut ds)
        .arg(&mut pk)
        .arg(&mut pv)
        .arg(&d.batch)
        .arg(&d.seq)
        .arg(&d.heads)
        .arg(&d.head_dim);
    // SAFETY: arguments match `attention_bwd_dkv_dXX_f32` and
    // `attention_tc_bwd_dkv_dXX_f32(const float* q, const
    // float* dout, const float* probs, const float* ds, float* pk, float* pv,
    // int batch, int seq, int heads, int head_dim)` in order and type. q and
    // dout hold q_len floats, probs and ds p_len, pk and pv are the two
    // q_len-float parts of the scratch after ds (split, so disjoint). The
    // grid is (ceil(seq / rows), heads, batch); each block reads only entries
    // i >= j, i < seq of its columns of probs/ds (exactly the entries the
    // dq kernel wrote, which ran before it on this stream) and rows i < seq
    // of q/dout of its head, writes elements t < head_dim of its rows j < seq
    // of pk and pv, and uses the dynamic shared memory kv_config provides
    // with the build's thread count.
    unsafe { launch.launch(cfg) }?;

    let cfg = launch_config_1d(kv_len, 65_535);
    let func = gpu.function(b.kv_sum.module, b.kv_sum.symbol)?;
    let mut launch = gpu.stream().launch_builder(&func);
    launch.arg(&mut pk).arg(&mut pv).arg(dk).arg(dv);
    d.push(&mut launch);
    launch.arg(&limit);
    // SAFETY: arguments match `attention_bwd_kv_sum_f32(const float* pk,
    // const float* pv, float* dk, float* dv, int batch, int seq, int heads,
    // int kv_heads, int head_dim, float scale, long long write_limit)` in
    // order and type. The grid-stride loop covers the kv_len elements of dk
    // and dv (checked lengths) and reads the group's heads of pk and pv, each
    // q_len long (heads is a multiple of kv_heads, validated), written by the
    // previous kernel on this stream.
    unsafe { launch.launch(cfg) }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shared memory the launch configs ask for: the sizes the doc
    /// comments of the kernels state, all within the 48 KiB a launch gets
    /// without opting in.
    #[test]
    fn launch_configs_fit_the_default_shared_memory() {
        let sh = |head_dim| AttnShape {
            batch: 4,
            seq: 256,
            heads: 14,
            kv_heads: 2,
            head_dim,
        };
        let bytes = |c: LaunchConfig| c.shared_mem_bytes;
        let (f32k, tc) = (AttnKernels::F32, AttnKernels::TensorCores);
        let cfg = |hd, k, kv: bool| {
            let b = build(hd, k);
            if kv {
                kv_config(&sh(hd), b)
            } else {
                row_config(&sh(hd), b)
            }
        };
        assert_eq!(bytes(cfg(64, f32k, false)), 33_280);
        assert_eq!(bytes(cfg(128, f32k, false)), 37_248);
        assert_eq!(bytes(cfg(64, f32k, true)), 25_088);
        assert_eq!(bytes(cfg(128, f32k, true)), 41_472);
        for kv in [false, true] {
            assert_eq!(bytes(cfg(64, tc, kv)), 34_816);
            assert_eq!(bytes(cfg(128, tc, kv)), 34_816);
        }
        assert_eq!(cfg(16, f32k, false).grid_dim, (8, 14, 4));
        assert_eq!(cfg(16, tc, false).grid_dim, (4, 14, 4));
        assert_eq!(cfg(16, tc, false).block_dim, (128, 1, 1));
        assert_eq!(cfg(128, tc, true).block_dim, (128, 1, 1));
        assert_eq!(
            modules_for(16, f32k, f32k),
            ["attention_fwd_d64", "attention_dq_d64", "attention_dkv_d64"]
        );
        assert_eq!(
            modules_for(68, tc, f32k),
            [
                "attention_tc_fwd_d128",
                "attention_dq_d128",
                "attention_dkv_d128"
            ]
        );
        // The tensor-core forward moves 16-byte pieces only.
        assert_eq!(
            modules_for(66, tc, tc),
            [
                "attention_fwd_d128",
                "attention_tc_dq_d128",
                "attention_tc_dkv_d128"
            ]
        );
    }

    /// TF32 math takes the tensor cores unless the fault turns them off.
    #[test]
    fn math_picks_the_kernels() {
        let off = Faults::default();
        let fault = Faults {
            gemm_without_tensor_ops: true,
            ..off
        };
        assert_eq!(
            AttnKernels::for_math(GemmMath::Tf32, off),
            AttnKernels::TensorCores
        );
        assert_eq!(AttnKernels::for_math(GemmMath::Fp32, off), AttnKernels::F32);
        assert_eq!(
            AttnKernels::for_math(GemmMath::Tf32, fault),
            AttnKernels::F32
        );
    }

    #[test]
    fn shapes_the_kernels_cannot_take_are_refused() {
        let ok = AttnShape {
            batch: 1,
            seq: 256,
            heads: 12,
            kv_heads: 2,
            head_dim: 128,
        };
        assert!(validate(&ok).is_ok());
        assert!(validate(&AttnShape { kv_heads: 5, ..ok }).is_err());
        assert!(validate(&AttnShape { kv_heads: 0, ..ok }).is_err());
        assert!(validate(&AttnShape { seq: 20_000, ..ok }).is_ok());
        assert!(validate(&AttnShape {
            head_dim: 130,
            ..ok
        })
        .is_err());
        assert!(validate(&AttnShape {
            heads: 70_000,
            kv_heads: 1,
            ..ok
        })
        .is_err());
    }
}
