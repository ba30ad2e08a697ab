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
//! Three sets of kernels compute this ([`AttnKernels`]): the f32 kernels
//! (tiles of 32 rows, two per thread, every product an f32 FMA) under FP32
//! math, and the tensor-core kernels (16 rows per warp, products by TF32
//! `mma.sync`, f32 accumulation and softmax) under TF32 math, with the same
//! arguments and outputs; and for a bf16 step the bf16 flash kernels, which
//! save each row's log-sum-exp instead of `probs` and recompute `P` in the
//! backward ([`saved_len`]). Each has a build for head_dim <= 64 and one for
//! head_dim <= 128 (see the comment at the top of the `.cu` file). The f32
//! forward is one pass over the keys (online softmax), the tensor-core one
//! two (the row statistics, then P and P v). The backward is deterministic
//! (no atomics): `attention_bwd_dq_*` writes `dS` to a caller's scratch
//! buffer (the training step's workspace owns one, so nothing is allocated
//! per step), `attention_bwd_dkv_*` gathers each query head's share of `dk`
//! and `dv` per tile of key rows into the same scratch, and
//! `attention_bwd_kv_sum_f32` adds the shares of a group in a fixed order.
//! The flash backward turns the first two round: its dk/dv kernel stores
//! `dS` (bf16) and its dq kernel multiplies it, after a kernel of the row
//! dots `D`.

use cudarc::driver::{CudaSlice, CudaViewMut, LaunchConfig, PushKernelArg};

use super::gemm::{grid_dim, to_i64};
use super::launch::{expect_len, DependentLaunch};
use crate::error::{Error, Result};
use crate::faults::Faults;
use crate::gpu::table::address;
use crate::gpu::{launch_config_1d, to_i32, GemmMath, GpuContext};
use crate::kernels::abi::{Arg, Signatures};
use crate::ops::cast::Bf16;
use crate::ops::rope::QkvOut;

/// One kernel: the module that holds it and its symbol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    /// The bf16 flash kernels: products of bf16-rounded inputs on the
    /// tensor cores, f32 accumulation and softmax, and no probabilities
    /// saved: the forward keeps each row's log-sum-exp and the backward
    /// recomputes `P` from it (FlashAttention-2). A step on a bf16 base runs
    /// these in both directions (`train::options::BaseWeights`).
    Bf16,
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

/// q, k and v as a set of kernels reads them: f32 for the f32 and
/// tensor-core kernels, bf16 for the bf16 flash kernels (rounded to nearest
/// even by their producer, at the point where the flash kernels' reference
/// rounds them).
#[derive(Clone, Copy)]
pub enum Qkv<'a> {
    F32(&'a CudaSlice<f32>, &'a CudaSlice<f32>, &'a CudaSlice<f32>),
    Bf16(
        &'a CudaSlice<Bf16>,
        &'a CudaSlice<Bf16>,
        &'a CudaSlice<Bf16>,
    ),
}

impl Qkv<'_> {
    /// Refuses inputs of another format than `kernels` read, and lengths
    /// other than `sh`'s.
    fn check(&self, kernels: AttnKernels, sh: &AttnShape) -> Result<()> {
        let (have, bf16) = match self {
            Qkv::F32(q, k, v) => ([q.len(), k.len(), v.len()], false),
            Qkv::Bf16(q, k, v) => ([q.len(), k.len(), v.len()], true),
        };
        let name = |bf16: bool| if bf16 { "bf16" } else { "f32" };
        let want = kernels == AttnKernels::Bf16;
        if bf16 != want {
            return Err(Error::InvalidArgument {
                op: "attention",
                message: format!(
                    "the {kernels:?} kernels read q, k and v in {}, not {}",
                    name(want),
                    name(bf16)
                ),
            });
        }
        let (q_len, kv_len, _) = lens(sh);
        for (name, i, want) in [("q", 0, q_len), ("k", 1, kv_len), ("v", 2, kv_len)] {
            expect_len("attention", name, have[i], &[want])?;
        }
        Ok(())
    }

    /// The device addresses of q, k and v, for [`for_layout`].
    fn addresses(&self, gpu: &GpuContext) -> [u64; 3] {
        match self {
            Qkv::F32(q, k, v) => [address(gpu, *q), address(gpu, *k), address(gpu, *v)],
            Qkv::Bf16(q, k, v) => [address(gpu, *q), address(gpu, *k), address(gpu, *v)],
        }
    }

    /// Pushes q, k and v, in that order.
    fn push(&self, launch: &mut DependentLaunch<'_>) {
        match self {
            Qkv::F32(q, k, v) => launch.buf(*q).buf(*k).buf(*v),
            Qkv::Bf16(q, k, v) => launch.buf(*q).buf(*k).buf(*v),
        };
    }
}

/// q, k and v on the device in the format a set of kernels reads ([`Qkv`]).
pub enum QkvBuffers {
    F32(CudaSlice<f32>, CudaSlice<f32>, CudaSlice<f32>),
    Bf16(CudaSlice<Bf16>, CudaSlice<Bf16>, CudaSlice<Bf16>),
}

impl QkvBuffers {
    /// Zeroed buffers of `sh` for `kernels`.
    pub fn zeros(gpu: &GpuContext, kernels: AttnKernels, sh: &AttnShape) -> Result<Self> {
        let (q, kv, _) = lens(sh);
        Ok(match kernels {
            AttnKernels::Bf16 => QkvBuffers::Bf16(gpu.zeros(q)?, gpu.zeros(kv)?, gpu.zeros(kv)?),
            _ => QkvBuffers::F32(gpu.zeros(q)?, gpu.zeros(kv)?, gpu.zeros(kv)?),
        })
    }

    /// `q`, `k` and `v` uploaded for `kernels`: as they are, or rounded to
    /// bf16 (nearest, ties to even, as the step's q/k/v epilogue rounds
    /// them) for the flash kernels.
    pub fn upload(gpu: &GpuContext, kernels: AttnKernels, [q, k, v]: [&[f32]; 3]) -> Result<Self> {
        let bf16 =
            |x: &[f32]| gpu.upload(&x.iter().map(|&x| Bf16::from_f32(x)).collect::<Vec<_>>());
        Ok(match kernels {
            AttnKernels::Bf16 => QkvBuffers::Bf16(bf16(q)?, bf16(k)?, bf16(v)?),
            _ => QkvBuffers::F32(gpu.upload(q)?, gpu.upload(k)?, gpu.upload(v)?),
        })
    }

    /// Device bytes of q, k and v of `sh` for `kernels`.
    pub fn bytes_for(sh: &AttnShape, kernels: AttnKernels) -> usize {
        let (q, kv, _) = lens(sh);
        let element = if kernels == AttnKernels::Bf16 { 2 } else { 4 };
        element * (q + 2 * kv)
    }

    /// Device bytes of these buffers.
    pub fn bytes(&self) -> usize {
        match self {
            QkvBuffers::F32(q, k, v) => 4 * (q.len() + k.len() + v.len()),
            QkvBuffers::Bf16(q, k, v) => 2 * (q.len() + k.len() + v.len()),
        }
    }

    /// The kernels' inputs.
    pub fn as_qkv(&self) -> Qkv<'_> {
        match self {
            QkvBuffers::F32(q, k, v) => Qkv::F32(q, k, v),
            QkvBuffers::Bf16(q, k, v) => Qkv::Bf16(q, k, v),
        }
    }

    /// The buffers as the q/k/v epilogue writes them.
    pub fn as_out(&mut self) -> QkvOut<'_> {
        match self {
            QkvBuffers::F32(q, k, v) => QkvOut::F32(q, k, v),
            QkvBuffers::Bf16(q, k, v) => QkvOut::Bf16(q, k, v),
        }
    }
}

/// What a set's forward saves for its backward ([`saved_len`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Saves {
    /// The probabilities; the backward writes dS to its scratch.
    Probs,
    /// Each row's log-sum-exp (the flash kernels); the backward recomputes
    /// P, and writes the row dots D and dS (bf16) to its scratch.
    RowLse,
}

impl Saves {
    /// Launches `launch`: as a programmatic dependent for the flash kernels
    /// (`RowLse`), each of which waits for its predecessor where it must,
    /// in stream order for the others.
    ///
    /// # Safety
    /// [`DependentLaunch::launch`]'s contract for the flash kernels,
    /// [`DependentLaunch::launch_in_order`]'s for the others.
    unsafe fn launch(self, launch: &mut DependentLaunch<'_>, cfg: LaunchConfig) -> Result<()> {
        // SAFETY: the caller's contract, for the way taken.
        unsafe {
            match self {
                Saves::RowLse => launch.launch(cfg),
                Saves::Probs => launch.launch_in_order(cfg),
            }
        }
    }
}

/// One build of the tiled kernels (see the `.cu` file, whose builds pad
/// head_dim to 64 or 128): its block (threads, and rows of a tile), the
/// bytes of dynamic shared memory of its forward, dq and dk/dv kernels,
/// what its forward saves, and its kernels, each in a module of its own.
struct Build {
    threads: u32,
    rows: usize,
    fwd_smem: usize,
    dq_smem: usize,
    dkv_smem: usize,
    saves: Saves,
    fwd: Kernel,
    dq: Kernel,
    dkv: Kernel,
    /// The (not tiled) kernel that adds the group's dk/dv shares: in the
    /// dkv module, or in the flash builds' dots module, beside the row dots
    /// ([`DOTS`]).
    kv_sum: Kernel,
}

const KV_SUM: &str = "attention_bwd_kv_sum_f32";
/// The flash kernels' row dots `D`, in the module of their kv_sum (not
/// tiled: one kernel for both builds' modules).
const DOTS: &str = "attention_flash_bwd_dots_f32";

/// Rows of a tile of the f32 kernels (`ATT_ROWS`).
const TILE_ROWS: usize = 32;

/// Query rows per staged chunk of the f32 dk/dv kernel (`AttShape::QCHUNK`).
const QUERY_CHUNK: usize = 32;

/// Bytes of shared memory of the f32 forward and dq kernels with keys per
/// chunk `chunk` (`AttShape::CHUNK`): a row tile and a key chunk (rows
/// padded to d + 1) and a 32 x (chunk + 1) tile of probabilities, in f32.
const fn f32_row_smem(d: usize, chunk: usize) -> usize {
    4 * ((TILE_ROWS + chunk) * (d + 1) + TILE_ROWS * (chunk + 1))
}

/// Bytes of shared memory of the f32 dk/dv kernel: a chunk of q and of dout
/// rows and the matching 32 x 33 tiles of dS and P, in f32.
const fn f32_kv_smem(d: usize) -> usize {
    4 * (2 * QUERY_CHUNK * (d + 1) + 2 * TILE_ROWS * (QUERY_CHUNK + 1))
}

/// Bytes of shared memory of every tensor-core kernel, in both builds
/// (`TcShape::SMEM_FLOATS` floats, asserted there): the 64 query rows padded
/// to d + 8 for d = 128, or the dk/dv kernel's two stages of a q and a dout
/// chunk of 32 rows padded to d + 4 for d = 64, both 8,704 floats.
const TC_SMEM: usize = 4 * 8_704;

/// Rows of a tensor-core tile (`TC_ROWS`): four row groups of 16.
const TC_ROWS: usize = 64;

const fn kernel(module: &'static str, symbol: &'static str) -> Kernel {
    Kernel { module, symbol }
}

const F32_D64: Build = Build {
    threads: 256,
    rows: TILE_ROWS,
    fwd_smem: f32_row_smem(64, 64),
    dq_smem: f32_row_smem(64, 64),
    dkv_smem: f32_kv_smem(64),
    saves: Saves::Probs,
    fwd: kernel("attention_fwd_d64", "attention_fwd_d64_f32"),
    dq: kernel("attention_dq_d64", "attention_bwd_dq_d64_f32"),
    dkv: kernel("attention_dkv_d64", "attention_bwd_dkv_d64_f32"),
    kv_sum: kernel("attention_dkv_d64", KV_SUM),
};

const F32_D128: Build = Build {
    threads: 256,
    rows: TILE_ROWS,
    fwd_smem: f32_row_smem(128, 32),
    dq_smem: f32_row_smem(128, 32),
    dkv_smem: f32_kv_smem(128),
    saves: Saves::Probs,
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
    fwd_smem: TC_SMEM,
    dq_smem: TC_SMEM,
    dkv_smem: TC_SMEM,
    saves: Saves::Probs,
    fwd: kernel("attention_tc_fwd_d64", "attention_tc_fwd_d64_f32"),
    dq: kernel("attention_tc_dq_d64", "attention_tc_bwd_dq_d64_f32"),
    dkv: kernel("attention_tc_dkv_d64", "attention_tc_bwd_dkv_d64_f32"),
    kv_sum: kernel("attention_tc_dkv_d64", KV_SUM),
};

const TC_D128: Build = Build {
    threads: 128,
    rows: TC_ROWS,
    fwd_smem: TC_SMEM,
    dq_smem: TC_SMEM,
    dkv_smem: TC_SMEM,
    saves: Saves::Probs,
    fwd: kernel("attention_tc_fwd_d128", "attention_tc_fwd_d128_f32"),
    dq: kernel("attention_tc_dq_d128", "attention_tc_bwd_dq_d128_f32"),
    dkv: kernel("attention_tc_dkv_d128", "attention_tc_bwd_dkv_d128_f32"),
    kv_sum: kernel("attention_tc_dkv_d128", KV_SUM),
};

// The bf16 flash kernels: four warps of 16 rows (`FL_THREADS`, `FL_ROWS`),
// shared memory `FlShape::{FWD,DQ,DKV}_SMEM` (asserted in the `.cu` file).
const FLASH_D64: Build = Build {
    threads: 128,
    rows: 64,
    fwd_smem: 36_864,
    dq_smem: 36_864,
    dkv_smem: 27_904,
    saves: Saves::RowLse,
    fwd: kernel("attention_flash_fwd_d64", "attention_flash_fwd_d64_bf16"),
    dq: kernel("attention_flash_dq_d64", "attention_flash_bwd_dq_d64_bf16"),
    dkv: kernel(
        "attention_flash_dkv_d64",
        "attention_flash_bwd_dkv_d64_bf16",
    ),
    kv_sum: kernel("attention_flash_dots_d64", KV_SUM),
};

/// [`FLASH_D64`] for any head_dim and alignment (its kernels test at run
/// time how each row can move); the dots module is the same.
const FLASH_ANY_D64: Build = Build {
    fwd: kernel("attention_flash_any_d64", "attention_flash_fwd_d64_bf16"),
    dq: kernel("attention_flash_any_d64", "attention_flash_bwd_dq_d64_bf16"),
    dkv: kernel(
        "attention_flash_any_d64",
        "attention_flash_bwd_dkv_d64_bf16",
    ),
    ..FLASH_D64
};

const FLASH_D128: Build = Build {
    threads: 128,
    rows: 64,
    fwd_smem: 34_816,
    dq_smem: 26_624,
    dkv_smem: 43_648,
    saves: Saves::RowLse,
    fwd: kernel("attention_flash_fwd_d128", "attention_flash_fwd_d128_bf16"),
    dq: kernel(
        "attention_flash_dq_d128",
        "attention_flash_bwd_dq_d128_bf16",
    ),
    dkv: kernel(
        "attention_flash_dkv_d128",
        "attention_flash_bwd_dkv_d128_bf16",
    ),
    kv_sum: kernel("attention_flash_dots_d128", KV_SUM),
};

/// [`FLASH_D128`] for any head_dim and alignment.
const FLASH_ANY_D128: Build = Build {
    fwd: kernel("attention_flash_any_d128", "attention_flash_fwd_d128_bf16"),
    dq: kernel(
        "attention_flash_any_d128",
        "attention_flash_bwd_dq_d128_bf16",
    ),
    dkv: kernel(
        "attention_flash_any_d128",
        "attention_flash_bwd_dkv_d128_bf16",
    ),
    ..FLASH_D128
};

/// The build of `kernels` for `head_dim` (validated <= [`MAX_HEAD_DIM`]);
/// for the flash kernels, their aligned build ([`for_layout`] picks the
/// one a call's tensors allow).
fn build(head_dim: usize, kernels: AttnKernels) -> &'static Build {
    match (head_dim <= 64, kernels) {
        (true, AttnKernels::F32) => &F32_D64,
        (false, AttnKernels::F32) => &F32_D128,
        (true, AttnKernels::TensorCores) => &TC_D64,
        (false, AttnKernels::TensorCores) => &TC_D128,
        (true, AttnKernels::Bf16) => &FLASH_D64,
        (false, AttnKernels::Bf16) => &FLASH_D128,
    }
}

/// Bytes every tensor of a flash call must start at a multiple of for the
/// aligned build: a 16-byte piece of a row (and with head_dim a multiple
/// of 8, every row of every tensor starts at one too).
const FLASH_ALIGN: u64 = 16;

/// `b`, or for a flash build whose aligned kernels the call cannot take
/// (head_dim not a multiple of 8, or a tensor at `addresses` not
/// [`FLASH_ALIGN`]-aligned) its build for any alignment. The step's tensors
/// are whole allocations or views at multiples of 8 elements, so a step
/// with head_dim a multiple of 8 takes the aligned build, as its pre-warm
/// ([`modules_for`]) predicts.
fn for_layout(b: &'static Build, head_dim: usize, addresses: &[u64]) -> &'static Build {
    let aligned = head_dim.is_multiple_of(8) && addresses.iter().all(|a| a % FLASH_ALIGN == 0);
    match (b.saves, aligned, head_dim <= 64) {
        (Saves::RowLse, false, true) => &FLASH_ANY_D64,
        (Saves::RowLse, false, false) => &FLASH_ANY_D128,
        _ => b,
    }
}

/// The build whose forward runs `kernels` for `head_dim`: the tensor-core
/// forward moves q, k and v in 16-byte pieces only (its module compiles
/// faster without a scalar path, and it is on the cold pre-warm's critical
/// path), so a head_dim that is not a multiple of four takes the f32
/// forward (which saves the same probabilities). q, k and v are whole
/// allocations, so with head_dim % 4 == 0 every row starts 16-byte aligned.
fn fwd_build(head_dim: usize, kernels: AttnKernels) -> &'static Build {
    let packed = head_dim.is_multiple_of(4);
    match kernels {
        AttnKernels::TensorCores if !packed => build(head_dim, AttnKernels::F32),
        k => build(head_dim, k),
    }
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
/// in the forward and `bwd` kernels in the backward, on tensors as a step
/// lays them out (aligned, as `for_layout` takes them): the forward's
/// module, then the backward's (dq, dk/dv with kv_sum, or for the flash
/// kernels also the dots module with kv_sum), each once.
pub fn modules_for(head_dim: usize, fwd: AttnKernels, bwd: AttnKernels) -> Vec<&'static str> {
    let f = for_layout(fwd_build(head_dim, fwd), head_dim, &[]);
    let b = for_layout(build(head_dim, bwd), head_dim, &[]);
    let mut modules = vec![f.fwd.module, b.dq.module, b.dkv.module, b.kv_sum.module];
    modules.dedup();
    modules
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

/// The flash forward: `q, k, v, out, lse, out16`, then the tail of
/// [`FWD_ARGS`].
const FLASH_FWD_ARGS: &[Arg] = &[
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
    Arg::I64,
];

/// The flash row dots: `out, dout, dd`, then `batch, seq, heads, kv_heads,
/// head_dim, scale`.
const DOTS_ARGS: &[Arg] = &[
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

/// The flash dk/dv kernel: `q, k, v, dout, lse, dd, pk, pv, dst`, then
/// `batch, seq, ds_stride, heads, kv_heads, head_dim, scale`.
const FLASH_DKV_ARGS: &[Arg] = &[
    Arg::Ptr,
    Arg::Ptr,
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
    Arg::I32,
    Arg::F32,
];

/// The flash dq kernel: `dst, k, dq`, then `batch, seq, ds_stride, heads,
/// kv_heads, head_dim, scale`.
const FLASH_DQ_ARGS: &[Arg] = &[
    Arg::Ptr,
    Arg::Ptr,
    Arg::Ptr,
    Arg::I32,
    Arg::I32,
    Arg::I32,
    Arg::I32,
    Arg::I32,
    Arg::I32,
    Arg::F32,
];

/// The modules of each build and the kernels each holds: a
/// probability-saving build's three (kv_sum in its dkv module); a flash
/// build's three, its build for any alignment (one module) and its dots
/// module (the row dots and kv_sum).
macro_rules! signatures {
    (probs: $($b:ident),*; flash: $($f:ident, $any:ident);*) => {
        &[$(
            ($b.fwd.module, &[($b.fwd.symbol, FWD_ARGS)]),
            ($b.dq.module, &[($b.dq.symbol, DQ_ARGS)]),
            ($b.dkv.module, &[($b.dkv.symbol, DKV_ARGS), (KV_SUM, KV_SUM_ARGS)]),
        )* $(
            ($f.fwd.module, &[($f.fwd.symbol, FLASH_FWD_ARGS)]),
            ($f.dq.module, &[($f.dq.symbol, FLASH_DQ_ARGS)]),
            ($f.dkv.module, &[($f.dkv.symbol, FLASH_DKV_ARGS)]),
            (
                $any.dkv.module,
                &[
                    ($any.fwd.symbol, FLASH_FWD_ARGS),
                    ($any.dq.symbol, FLASH_DQ_ARGS),
                    ($any.dkv.symbol, FLASH_DKV_ARGS),
                ],
            ),
            ($f.kv_sum.module, &[(DOTS, DOTS_ARGS), (KV_SUM, KV_SUM_ARGS)]),
        )*]
    };
}

/// The kernels of each module, by module, checked against their PTX by a
/// unit test.
pub const SIGNATURES: &[(&str, Signatures)] = signatures!(
    probs: F32_D64, F32_D128, TC_D64, TC_D128;
    flash: FLASH_D64, FLASH_ANY_D64; FLASH_D128, FLASH_ANY_D128
);

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

/// Floats the forward of `kernels` saves for the backward: `P`
/// (`[batch, heads, seq, seq]`) for the probability-saving kernels; for
/// [`AttnKernels::Bf16`] each row's log-sum-exp of the scores times
/// `log2(e)`, `lse2_i = log2 sum_j 2^(scale log2(e) <q_i, k_j>)`
/// (`[batch, heads, seq]`).
pub fn saved_len(sh: &AttnShape, kernels: AttnKernels) -> usize {
    match kernels {
        AttnKernels::Bf16 => sh.batch * sh.heads * sh.seq,
        _ => lens(sh).2,
    }
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
    fn push(&self, launch: &mut DependentLaunch<'_>) {
        launch
            .i32(self.batch)
            .i32(self.seq)
            .i32(self.heads)
            .i32(self.kv_heads)
            .i32(self.head_dim)
            .f32(self.scale);
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

/// One block of `b.threads` per (`b.rows` rows, head, batch), with `bytes`
/// of dynamic shared memory. Every build stays within the 48 KiB a launch
/// gets without opting in (see the unit test).
fn tile_config(sh: &AttnShape, b: &Build, bytes: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (
            sh.seq.div_ceil(b.rows) as u32,
            sh.heads as u32,
            sh.batch as u32,
        ),
        block_dim: (b.threads, 1, 1),
        shared_mem_bytes: bytes as u32,
    }
}

/// Forward on `kernels` (see [`AttnKernels::for_math`]): writes `out` and
/// what the backward of the same kernels needs, `saved` ([`saved_len`]
/// floats: the probabilities, or the flash kernels' row log-sum-exps).
pub fn forward(
    gpu: &mut GpuContext,
    kernels: AttnKernels,
    qkv: Qkv<'_>,
    out: &mut CudaSlice<f32>,
    saved: &mut CudaSlice<f32>,
    sh: &AttnShape,
) -> Result<()> {
    forward_into(gpu, kernels, qkv, (out, None), saved, sh)
}

/// [`forward`] on the bf16 flash kernels that also writes `out` rounded to
/// bf16 into `out16` (as [`crate::ops::cast::f32_to_half`] rounds it), in
/// the same pass: the o projection's operand in a bf16 step.
pub fn forward_with_bf16(
    gpu: &mut GpuContext,
    qkv: Qkv<'_>,
    out: &mut CudaSlice<f32>,
    out16: &mut CudaViewMut<'_, Bf16>,
    saved: &mut CudaSlice<f32>,
    sh: &AttnShape,
) -> Result<()> {
    forward_into(gpu, AttnKernels::Bf16, qkv, (out, Some(out16)), saved, sh)
}

fn forward_into(
    gpu: &mut GpuContext,
    kernels: AttnKernels,
    qkv: Qkv<'_>,
    (out, out16): (&mut CudaSlice<f32>, Option<&mut CudaViewMut<'_, Bf16>>),
    saved: &mut CudaSlice<f32>,
    sh: &AttnShape,
) -> Result<()> {
    let d = validate(sh)?;
    qkv.check(kernels, sh)?;
    let q_len = lens(sh).0;
    expect_len("attention", "out", out.len(), &[q_len])?;
    if let Some(o16) = &out16 {
        expect_len("attention", "out16", o16.len(), &[q_len])?;
    }
    expect_len("attention", "saved", saved.len(), &[saved_len(sh, kernels)])?;
    let limit = to_i64("attention", gpu.faults().written(q_len))?;
    let [q, k, v] = qkv.addresses(gpu);
    // No out16 is a null pointer, which any alignment allows.
    let o16 = out16.as_ref().map_or(0, |o| address(gpu, &**o));
    let addresses = [q, k, v, address(gpu, &*out), address(gpu, &*saved), o16];
    let b = for_layout(fwd_build(sh.head_dim, kernels), sh.head_dim, &addresses);
    let cfg = tile_config(sh, b, b.fwd_smem);
    let func = gpu.function(b.fwd.module, b.fwd.symbol)?;
    let mut launch = DependentLaunch::new(gpu, &func);
    qkv.push(&mut launch);
    launch.buf_mut(out).buf_mut(saved);
    // The flash forward takes out16 after saved, null for none.
    match (b.saves, out16) {
        (Saves::RowLse, Some(o16)) => {
            launch.buf_mut(o16);
        }
        (Saves::RowLse, None) => {
            launch.i64(0);
        }
        (Saves::Probs, None) => {}
        (Saves::Probs, Some(_)) => {
            return Err(Error::InvalidArgument {
                op: "attention",
                message: "only the bf16 flash forward writes a bf16 copy of its output".into(),
            })
        }
    }
    d.push(&mut launch);
    launch.i64(limit);
    // SAFETY: arguments match `attention_fwd_dXX_f32`,
    // `attention_tc_fwd_dXX_f32(const float* q, const float* k, const float*
    // v, float* out, float* saved, int batch, int seq, int heads, int
    // kv_heads, int head_dim, float scale, long long write_limit)` in order
    // and type, and `attention_flash_fwd_dXX_bf16`, the same with `const
    // unsigned short*` q, k, v (qkv.check: bf16 exactly for these kernels)
    // and `unsigned short* out16` after saved: q_len elements (checked), or
    // 8 zero bytes, a null pointer, which the kernel tests.
    // The lengths were checked against the shape above (saved: probs or lse, as the kernel writes);
    // heads is a multiple of kv_heads, so every kv head index is < kv_heads.
    // The grid is (ceil(seq / rows), heads, batch) for the kernel's tile
    // rows; each block touches only its rows of q/out/saved (guarded by
    // i < seq) and rows j < seq of k and v (columns t < head_dim), and uses
    // the dynamic shared memory its config provides for the build (head_dim
    // <= 64 or <= 128; validate() refused more), with the thread count its
    // tiling assumes. The tensor-core kernels' zero-filling cp.async copies
    // of rows past seq read nothing (their source address is the tensor's
    // first row, which exists). The flash forward, launched as a
    // programmatic dependent, waits for its predecessor before it touches
    // memory (its first statement); the others are launched in order. A
    // flash kernel of the aligned build moves rows in 16-byte pieces
    // unchecked: for_layout chose that build only for head_dim % 8 == 0 and
    // every tensor 16-byte aligned.
    unsafe { b.saves.launch(&mut launch, cfg) }?;
    Ok(())
}

/// Floats of the scratch [`backward`] on `kernels` needs: `dS` (the
/// length of `probs`) for the probability-saving kernels, or for the flash
/// ones `dS` in bf16, transposed, rows of `seq` rounded up to 8 (two to a
/// float, rounded up), then the row dots `D` (`[batch, heads, seq]`,
/// rounded up to four floats, so each part starts 16-byte aligned); then
/// each query head's share of `dk` and `dv` (twice the length of `q`).
pub fn backward_scratch_len(sh: &AttnShape, kernels: AttnKernels) -> usize {
    ds_floats(sh, kernels) + 2 * lens(sh).0
}

/// Floats of the scratch's first part: `dS`, and for the flash kernels `D`
/// after it ([`backward_scratch_len`]).
fn ds_floats(sh: &AttnShape, kernels: AttnKernels) -> usize {
    match kernels {
        AttnKernels::Bf16 => flash_ds_floats(sh) + saved_len(sh, kernels).next_multiple_of(4),
        _ => lens(sh).2,
    }
}

/// Floats of the flash kernels' stored `dS` ([`backward_scratch_len`]).
fn flash_ds_floats(sh: &AttnShape) -> usize {
    (sh.batch * sh.heads * sh.seq * ds_stride(sh.seq)).div_ceil(2)
}

/// Row length, in bf16, of the flash kernels' stored `dS`: `seq` rounded up
/// to 8, so every row starts 16-byte aligned for the dq kernel's copies.
fn ds_stride(seq: usize) -> usize {
    seq.div_ceil(8) * 8
}

/// Backward on `kernels`, from what their forward saved (`saved`): writes
/// `dq`, `dk`, `dv`, using `scratch` ([`backward_scratch_len`] floats).
#[allow(clippy::too_many_arguments)]
pub fn backward(
    gpu: &mut GpuContext,
    kernels: AttnKernels,
    qkv: Qkv<'_>,
    out: &CudaSlice<f32>,
    saved: &CudaSlice<f32>,
    dout: &CudaSlice<f32>,
    scratch: &mut CudaSlice<f32>,
    (dq, dk, dv): (
        &mut CudaSlice<f32>,
        &mut CudaSlice<f32>,
        &mut CudaSlice<f32>,
    ),
    sh: &AttnShape,
) -> Result<()> {
    let d = validate(sh)?;
    qkv.check(kernels, sh)?;
    let (q_len, kv_len, _) = lens(sh);
    let s_len = saved_len(sh, kernels);
    for (name, len, want) in [
        ("out", out.len(), q_len),
        ("saved", saved.len(), s_len),
        ("dout", dout.len(), q_len),
        ("dq", dq.len(), q_len),
        ("dk", dk.len(), kv_len),
        ("dv", dv.len(), kv_len),
        ("scratch", scratch.len(), backward_scratch_len(sh, kernels)),
    ] {
        expect_len("attention", name, len, &[want])?;
    }
    let limit = to_i64("attention", gpu.faults().written(kv_len))?;
    // The first part of the scratch is dS (and the flash kernels' D), then the shares.
    let (mut first, mut shares) = scratch.split_at_mut(ds_floats(sh, kernels));
    let (mut pk, mut pv) = shares.split_at_mut(q_len);
    let [q, k, v] = qkv.addresses(gpu);
    let addresses = [
        q,
        k,
        v,
        address(gpu, out),
        address(gpu, saved),
        address(gpu, dout),
        address(gpu, &*dq),
        address(gpu, &*dk),
        address(gpu, &*dv),
        address(gpu, &first),
        address(gpu, &pk),
        address(gpu, &pv),
    ];
    let b = for_layout(build(sh.head_dim, kernels), sh.head_dim, &addresses);
    let grads = (&mut *dq, &mut first, &mut pk, &mut pv);
    match (b.saves, qkv) {
        (Saves::Probs, Qkv::F32(q, k, v)) => {
            probs_backward(gpu, b, (q, k, v), out, saved, dout, grads, &d, sh)?
        }
        (Saves::RowLse, Qkv::Bf16(q, k, v)) => {
            flash_backward(gpu, b, (q, k, v), out, saved, dout, grads, &d, sh)?
        }
        // qkv.check refused the other pairs.
        _ => {
            return Err(Error::InvalidArgument {
                op: "attention",
                message: "q, k and v are not in the format the kernels read".into(),
            })
        }
    }

    let cfg = launch_config_1d(kv_len, 65_535);
    let func = gpu.function(b.kv_sum.module, b.kv_sum.symbol)?;
    let mut launch = DependentLaunch::new(gpu, &func);
    launch.buf(&pk).buf(&pv).buf_mut(dk).buf_mut(dv);
    d.push(&mut launch);
    launch.i64(limit);
    // SAFETY: arguments match `attention_bwd_kv_sum_f32(const float* pk,
    // const float* pv, float* dk, float* dv, int batch, int seq, int heads,
    // int kv_heads, int head_dim, float scale, long long write_limit)` in
    // order and type. The grid-stride loop covers the kv_len elements of dk
    // and dv (checked lengths) and reads the group's heads of pk and pv, each
    // q_len long (heads is a multiple of kv_heads, validated), written by the
    // dk/dv kernel earlier on this stream. After the flash kernels it is
    // launched as the dq kernel's dependent: it may start once every dq
    // block has waited for the dkv kernel that wrote pk and pv (the dq
    // kernel lets its dependent start only then), so those writes are
    // visible; it writes dk and dv, which the dq kernel does not touch, and
    // waits for the dq kernel at its end. After the others, in order.
    unsafe { b.saves.launch(&mut launch, cfg) }?;
    Ok(())
}

/// The gradients the dq and dk/dv kernels write: dq, then the scratch's
/// dS (or D), pk and pv.
type Grads<'a, 'b> = (
    &'a mut CudaSlice<f32>,
    &'a mut CudaViewMut<'b, f32>,
    &'a mut CudaViewMut<'b, f32>,
    &'a mut CudaViewMut<'b, f32>,
);

/// dq, dS and the shares pk, pv from the saved probabilities (lengths
/// checked by [`backward`]).
#[allow(clippy::too_many_arguments)]
fn probs_backward(
    gpu: &mut GpuContext,
    b: &Build,
    (q, k, v): (&CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>),
    out: &CudaSlice<f32>,
    probs: &CudaSlice<f32>,
    dout: &CudaSlice<f32>,
    (dq, ds, pk, pv): Grads<'_, '_>,
    d: &Dims,
    sh: &AttnShape,
) -> Result<()> {
    let cfg = tile_config(sh, b, b.dq_smem);
    let func = gpu.function(b.dq.module, b.dq.symbol)?;
    let mut launch = DependentLaunch::new(gpu, &func);
    launch.buf(k).buf(v).buf(probs).buf(out).buf(dout);
    launch.buf_mut(&mut *dq).buf_mut(&mut *ds);
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
    // the build gives its dq kernel, with the build's thread count. These
    // kernels do not wait for a predecessor: launched in stream order.
    unsafe { launch.launch_in_order(cfg) }?;

    let cfg = tile_config(sh, b, b.dkv_smem);
    let func = gpu.function(b.dkv.module, b.dkv.symbol)?;
    let mut launch = gpu.stream().launch_builder(&func);
    launch
        .arg(q)
        .arg(dout)
        .arg(probs)
        .arg(&mut *ds)
        .arg(pk)
        .arg(pv)
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
    // of pk and pv, and uses the dynamic shared memory the build gives it
    // with the build's thread count.
    unsafe { launch.launch(cfg) }?;
    Ok(())
}

/// The row dots D, the shares pk, pv and dS (bf16), then dq from dS, from
/// the forward's row log-sum-exps (lengths checked by [`backward`];
/// `first` is the scratch's dS and D).
#[allow(clippy::too_many_arguments)]
fn flash_backward(
    gpu: &mut GpuContext,
    f: &Build,
    (q, k, v): (&CudaSlice<Bf16>, &CudaSlice<Bf16>, &CudaSlice<Bf16>),
    out: &CudaSlice<f32>,
    lse: &CudaSlice<f32>,
    dout: &CudaSlice<f32>,
    (dq, first, pk, pv): Grads<'_, '_>,
    d: &Dims,
    sh: &AttnShape,
) -> Result<()> {
    let (mut dst, mut dd) = first.split_at_mut(flash_ds_floats(sh));
    // The three kernels are launched as programmatic dependents (each waits
    // for the kernel before it where it must; see the .cu file), so each
    // one's launch, the dkv kernel's loads of k, v, q and dout and the dq
    // kernel's of k overlap the tail of the kernel before it.
    let func = gpu.function(f.kv_sum.module, DOTS)?;
    let mut launch = DependentLaunch::new(gpu, &func);
    launch.buf(out).buf(dout).buf_mut(&mut dd);
    d.push(&mut launch);
    // SAFETY: arguments match `attention_flash_bwd_dots_f32(const float*
    // out, const float* dout, float* dd, int batch, int seq, int heads, int
    // kv_heads, int head_dim, float scale)` in order and type. out and dout
    // hold q_len floats, dd (the scratch's part after dS) at least batch * heads *
    // seq; the grid is (ceil(seq / 64), heads, batch) of 128 threads, two a
    // row, each block reading and writing only its rows < seq; it waits for
    // its predecessor (which may write dout) first.
    unsafe { launch.launch(tile_config(sh, f, 0)) }?;

    let stride = to_i32("attention", "ds_stride", ds_stride(sh.seq))?;
    let func = gpu.function(f.dkv.module, f.dkv.symbol)?;
    let dd = dd.as_view();
    let mut launch = DependentLaunch::new(gpu, &func);
    launch.buf(q).buf(k).buf(v).buf(dout).buf(lse).buf(&dd);
    launch.buf_mut(pk).buf_mut(pv).buf_mut(&mut dst);
    launch.i32(d.batch).i32(d.seq).i32(stride).i32(d.heads);
    launch.i32(d.kv_heads).i32(d.head_dim).f32(d.scale);
    // SAFETY: arguments match `attention_flash_bwd_dkv_dXX_bf16(const
    // unsigned short* q, const unsigned short* k, const unsigned short* v,
    // const float* dout, const float* lse,
    // const float* dd, float* pk, float* pv, unsigned short* dst, int batch,
    // int seq, int ds_stride, int heads, int kv_heads, int head_dim, float
    // scale)` in order and type. dst, dd, pk and pv are disjoint parts of
    // the scratch (split); dst holds batch * heads * seq rows of ds_stride
    // bf16 (flash_ds_floats) and starts at the scratch's start, 16-byte
    // aligned as an allocation is. Each block reads rows < seq of q, dout,
    // lse and dd (as the dots kernel, earlier on this stream, wrote it) and
    // its 64 rows of k and v, writes its key rows < seq of pk and pv and, in
    // dst, only entries (key < seq, query < seq) of its head, and uses the
    // DKV_SMEM bytes of shared memory the config gives, with 128 threads.
    // The aligned build's 16-byte pieces: as in the forward (for_layout).
    // Before it waits for the dots kernel it reads only k, v, q and dout,
    // which that kernel does not write; the kernel before the dots kernel,
    // which may write dout, is done by then (the dots kernel waits for it
    // and lets this one start only at its end).
    unsafe { launch.launch(tile_config(sh, f, f.dkv_smem)) }?;

    let func = gpu.function(f.dq.module, f.dq.symbol)?;
    let dst = dst.as_view();
    let mut launch = DependentLaunch::new(gpu, &func);
    launch.buf(&dst).buf(k).buf_mut(&mut *dq);
    launch.i32(d.batch).i32(d.seq).i32(stride).i32(d.heads);
    launch.i32(d.kv_heads).i32(d.head_dim).f32(d.scale);
    // SAFETY: arguments match `attention_flash_bwd_dq_dXX_bf16(const
    // unsigned short* dst, const unsigned short* k, float* dq, int batch,
    // int seq, int ds_stride, int heads, int kv_heads, int head_dim, float scale)` in
    // order and type. dst is as the dkv kernel, earlier on this stream,
    // wrote it; each block copies 16-byte pieces of its head's rows < seq
    // starting at a query < seq (inside the padded row; the others are
    // zero-filled from the head's first row), masks what it must not use,
    // reads rows < seq of k of its kv head, writes its rows < seq of dq, and
    // uses the DQ_SMEM bytes of shared memory the config gives, with 128
    // threads. Before it waits for the dkv kernel it reads only k. The
    // aligned build's 16-byte pieces: as in the forward (for_layout).
    unsafe { launch.launch(tile_config(sh, f, f.dq_smem)) }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The flash kernels' stored dS: rows padded to 8 bf16 (16 bytes), two
    /// bf16 to a float of the scratch, rounded up; the row dots after it
    /// rounded up to four floats, so the shares start 16-byte aligned.
    #[test]
    fn flash_ds_rows_start_16_byte_aligned() {
        assert_eq!([ds_stride(1), ds_stride(13), ds_stride(256)], [8, 16, 256]);
        let sh = AttnShape {
            batch: 1,
            seq: 13,
            heads: 2,
            kv_heads: 1,
            head_dim: 64,
        };
        let q_len = 13 * 2 * 64;
        assert_eq!(
            backward_scratch_len(&sh, AttnKernels::Bf16),
            2 * 13 * 16 / 2 + 28 + 2 * q_len
        );
        assert_eq!(ds_floats(&sh, AttnKernels::Bf16) % 4, 0);
    }

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
        // The forward's config (the dq kernel's is checked equal to it for
        // the probability-saving builds), or with `kv` the dk/dv kernel's.
        let cfg = |hd, k, kv: bool| {
            let b = build(hd, k);
            if b.saves == Saves::Probs {
                assert_eq!(b.fwd_smem, b.dq_smem);
            }
            tile_config(&sh(hd), b, if kv { b.dkv_smem } else { b.fwd_smem })
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
        // The flash kernels: the aligned build for a head_dim that is a
        // multiple of 8, the build for any alignment (one module) else; the
        // row dots and kv_sum in a module of their own.
        let bf16 = AttnKernels::Bf16;
        assert_eq!(
            modules_for(64, bf16, bf16),
            [
                "attention_flash_fwd_d64",
                "attention_flash_dq_d64",
                "attention_flash_dkv_d64",
                "attention_flash_dots_d64"
            ]
        );
        assert_eq!(
            modules_for(66, bf16, bf16),
            ["attention_flash_any_d128", "attention_flash_dots_d128"]
        );
        // FlShape::{FWD,DQ,DKV}_SMEM, asserted in the `.cu` file.
        let smem = |b: &Build| [b.fwd_smem, b.dq_smem, b.dkv_smem];
        assert_eq!(smem(build(64, bf16)), [36_864, 36_864, 27_904]);
        assert_eq!(smem(build(128, bf16)), [34_816, 26_624, 43_648]);
        assert!(smem(build(128, bf16)).iter().all(|&b| b <= 48 * 1024));
        assert_eq!(cfg(64, bf16, true).grid_dim, (4, 14, 4));
        assert_eq!(cfg(64, bf16, true).block_dim, (128, 1, 1));
        assert_eq!(saved_len(&sh(64), bf16), 4 * 14 * 256);
        assert_eq!(
            backward_scratch_len(&sh(64), bf16),
            4 * 14 * 256 * 256 / 2 + 4 * 14 * 256 + 2 * 4 * 256 * 14 * 64
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

    /// A flash call takes the aligned build only where head_dim is a
    /// multiple of 8 and every tensor starts 16-byte aligned; the other
    /// builds are taken as they are.
    #[test]
    fn the_flash_build_follows_the_tensors_alignment() {
        let aligned = [0x7f00_0000_0000u64, 0x7f00_0000_0100, 0x7f00_0000_0210];
        let off_by_8 = [aligned[0], aligned[1] + 8];
        let flash = |hd| build(hd, AttnKernels::Bf16);
        for (head_dim, addresses, module) in [
            (64, &aligned[..], "attention_flash_dkv_d64"),
            (128, &aligned[..], "attention_flash_dkv_d128"),
            (120, &aligned[..], "attention_flash_dkv_d128"),
            (36, &aligned[..], "attention_flash_any_d64"),
            (64, &off_by_8[..], "attention_flash_any_d64"),
            (128, &off_by_8[..], "attention_flash_any_d128"),
        ] {
            let b = for_layout(flash(head_dim), head_dim, addresses);
            assert_eq!(b.dkv.module, module, "head_dim {head_dim}");
        }
        // Both flash builds share the dots module with kv_sum.
        let any = for_layout(flash(128), 128, &off_by_8);
        assert_eq!(any.kv_sum, flash(128).kv_sum);
        let tc = build(64, AttnKernels::TensorCores);
        assert_eq!(
            for_layout(tc, 34, &off_by_8).dkv.module,
            "attention_tc_dkv_d64"
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
