//! Launchers for `kernels/rope.cu`: rotary position embedding, NeoX halves,
//! layout `[batch, seq, heads, head_dim]`. Pair `(x_i, x_{i+half})` at position
//! `pos` is rotated by `pos * theta^(-2i / head_dim)`; the backward rotates by
//! the negative angle (the transpose of a rotation).

use cudarc::driver::{CudaView, CudaViewMut, PushKernelArg};

use super::launch::elements;
use super::launch::expect_len;
use crate::error::{Error, Result};
use crate::gpu::{to_i32, GpuContext};
use crate::kernels::abi::{Arg, Signatures};

pub const MODULE: &str = "rope";

/// Heads a thread rotates with one angle (`ROPE_HEADS` in the kernel).
const ROPE_HEADS: usize = 4;

/// Kernel argument lists, checked against the compiled PTX by a unit test.
pub const SIGNATURES: Signatures = &[
    (
        "rope_fwd_f32",
        &[
            Arg::Ptr,
            Arg::Ptr,
            Arg::I64,
            Arg::I32,
            Arg::I32,
            Arg::I32,
            Arg::F64,
        ],
    ),
    (
        "rope_bwd_f32",
        &[
            Arg::Ptr,
            Arg::Ptr,
            Arg::I64,
            Arg::I32,
            Arg::I32,
            Arg::I32,
            Arg::F64,
        ],
    ),
];

/// The dimensions of a RoPE launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RopeDims {
    batch: usize,
    seq: usize,
    heads: usize,
    head_dim: usize,
}

impl RopeDims {
    fn len(&self) -> usize {
        self.batch * self.seq * self.heads * self.head_dim
    }
}

#[allow(clippy::too_many_arguments)]
fn launch(
    gpu: &mut GpuContext,
    symbol: &str,
    x: &CudaView<'_, f32>,
    d: RopeDims,
    theta: f64,
    y: &mut CudaViewMut<'_, f32>,
) -> Result<()> {
    if d.head_dim == 0 || !d.head_dim.is_multiple_of(2) {
        return Err(Error::InvalidArgument {
            op: "rope",
            message: format!("head_dim must be even and > 0, got {}", d.head_dim),
        });
    }
    if !(theta.is_finite() && theta > 0.0) {
        return Err(Error::InvalidArgument {
            op: "rope",
            message: format!("theta must be a finite number > 0, got {theta}"),
        });
    }
    let dims = [d.batch, d.seq, d.heads, d.head_dim];
    expect_len("rope", "input", x.len(), &dims)?;
    expect_len("rope", "output", y.len(), &dims)?;
    let npairs = gpu.faults().written(d.len() / 2);
    if npairs == 0 {
        return Ok(());
    }
    let npairs_i = i64::from(elements("rope", npairs)?);
    let seq_i = to_i32("rope", "seq", d.seq)?;
    let heads_i = to_i32("rope", "heads", d.heads)?;
    let head_dim_i = to_i32("rope", "head_dim", d.head_dim)?;
    let f = gpu.function(MODULE, symbol)?;
    // One thread per (position, pair, group of ROPE_HEADS heads); the kernel
    // takes ln theta, its angles' exponent.
    let ln_theta = theta.ln();
    let cfg = gpu.launch_1d(d.batch * d.seq * d.heads.div_ceil(ROPE_HEADS) * (d.head_dim / 2));
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(x)
        .arg(y)
        .arg(&npairs_i)
        .arg(&seq_i)
        .arg(&heads_i)
        .arg(&head_dim_i)
        .arg(&ln_theta);
    // SAFETY: rope_{fwd,bwd}_f32(const float* x, float* y, long long npairs,
    // int seq, int heads, int head_dim, double ln_theta): the grid-stride loop
    // covers every (position, pair, head group) and writes only pairs p <
    // npairs, and pair p touches elements
    // (p / half) * head_dim + (p % half) and that + half, both < 2 * npairs <=
    // batch * seq * heads * head_dim = len(x) = len(y) (checked above); x and
    // y do not alias.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// RoPE: `y = R(angle) x`, `x` and `y` `[batch, seq, heads, head_dim]`.
#[allow(clippy::too_many_arguments)]
pub fn forward(
    gpu: &mut GpuContext,
    x: &CudaView<'_, f32>,
    batch: usize,
    seq: usize,
    heads: usize,
    head_dim: usize,
    theta: f64,
    y: &mut CudaViewMut<'_, f32>,
) -> Result<()> {
    let d = RopeDims {
        batch,
        seq,
        heads,
        head_dim,
    };
    launch(gpu, "rope_fwd_f32", x, d, theta, y)
}

/// Gradient of RoPE: `dx = R(-angle) dy`.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    gpu: &mut GpuContext,
    dy: &CudaView<'_, f32>,
    batch: usize,
    seq: usize,
    heads: usize,
    head_dim: usize,
    theta: f64,
    dx: &mut CudaViewMut<'_, f32>,
) -> Result<()> {
    let d = RopeDims {
        batch,
        seq,
        heads,
        head_dim,
    };
    launch(gpu, "rope_bwd_f32", dy, d, theta, dx)
}
