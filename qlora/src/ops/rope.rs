//! Launchers for `kernels/rope.cu`: rotary position embedding, NeoX halves,
//! layout `[batch, seq, heads, head_dim]`. Pair `(x_i, x_{i+half})` at position
//! `pos` is rotated by `pos * theta^(-2i / head_dim)`; the backward rotates by
//! the negative angle (the transpose of a rotation).

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

use super::launch::elements;
use super::launch::expect_len;
use crate::error::{Error, Result};
use crate::gpu::{to_i32, GpuContext};
use crate::kernels::abi::{Arg, Signature, Signatures};
use crate::ops::cast::Bf16;
use crate::Faults;

pub const MODULE: &str = "rope";

/// The op name of the fused q/k/v epilogue's errors.
const OP: &str = "rope_qkv";

/// The module of the fused q/k/v epilogue ([`qkv_forward`]) writing f32.
pub const QKV_FWD_MODULE: &str = "rope_qkv_fwd";

/// The module of the epilogue writing bf16 (a step computing in bf16).
pub const QKV_FWD_BF16_MODULE: &str = "rope_qkv_fwd_bf16";

/// The module of the epilogue's backward ([`qkv_backward`]).
pub const QKV_BWD_MODULE: &str = "rope_qkv_bwd";

/// The module of the backward also writing bf16 ([`qkv_backward_with_bf16`]).
pub const QKV_BWD_BF16_MODULE: &str = "rope_qkv_bwd_bf16";

/// The epilogue's forward and backward modules of a step that computes in
/// bf16 (`bf16`) or in f32.
pub fn qkv_modules(bf16: bool) -> [&'static str; 2] {
    if bf16 {
        [QKV_FWD_BF16_MODULE, QKV_BWD_BF16_MODULE]
    } else {
        [QKV_FWD_MODULE, QKV_BWD_MODULE]
    }
}

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

/// The argument lists of the forward's kernels, a module each
/// ([`QKV_FWD_MODULE`], [`QKV_FWD_BF16_MODULE`]): the same for both.
pub const QKV_FWD_SIGNATURES: Signatures = &[QKV_FWD];
pub const QKV_FWD_BF16_SIGNATURES: Signatures = &[QKV_FWD_BF16];

/// The forward writing f32, and the one writing bf16.
const QKV_FWD: Signature = ("rope_qkv_fwd_f32", QKV_FWD_ARGS);
const QKV_FWD_BF16: Signature = ("rope_qkv_fwd_bf16", QKV_FWD_ARGS);

/// The forward's arguments: the outputs q, k, v are f32 or bf16 pointers.
const QKV_FWD_ARGS: &[Arg] = &[
    Arg::Ptr,
    Arg::I64,
    Arg::Ptr,
    Arg::Ptr,
    Arg::Ptr,
    Arg::F32,
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
    Arg::Ptr,
];

/// The argument lists of the backward's kernels, a module each
/// ([`QKV_BWD_MODULE`], [`QKV_BWD_BF16_MODULE`]).
pub const QKV_BWD_SIGNATURES: Signatures = &[QKV_BWD];
pub const QKV_BWD_BF16_SIGNATURES: Signatures = &[QKV_BWD_BF16];

/// The f32 backward of the fused epilogue.
const QKV_BWD: Signature = (
    "rope_qkv_bwd_f32",
    &[
        Arg::Ptr,
        Arg::Ptr,
        Arg::Ptr,
        Arg::Ptr,
        Arg::Ptr,
        Arg::F32,
        Arg::Ptr,
        Arg::I64,
        Arg::I32,
        Arg::I32,
        Arg::I32,
        Arg::I32,
        Arg::I32,
        Arg::I32,
        Arg::Ptr,
    ],
);

/// The same, also writing the gradient's bf16 rounding: a second output
/// pointer after `dy`.
const QKV_BWD_BF16: Signature = (
    "rope_qkv_bwd_f32_bf16",
    &[
        Arg::Ptr,
        Arg::Ptr,
        Arg::Ptr,
        Arg::Ptr,
        Arg::Ptr,
        Arg::F32,
        Arg::Ptr,
        Arg::Ptr,
        Arg::I64,
        Arg::I32,
        Arg::I32,
        Arg::I32,
        Arg::I32,
        Arg::I32,
        Arg::I32,
        Arg::Ptr,
    ],
);

/// Threads of a block of the fused q/k/v epilogue's backward (`QKV_THREADS`).
const QKV_THREADS: u32 = 512;

/// Threads of a block of its forward (`QKV_FWD_THREADS`), one item (a
/// rotated pair of q or k, or a column of v) each.
const QKV_FWD_THREADS: u32 = 128;

/// Rows a block of the fused q/k/v epilogues takes (`QKV_ROWS`).
const QKV_ROWS: usize = 4;

/// The largest LoRA rank the fused q/k/v epilogues take (`QKV_MAX_RANK`);
/// the rank must be a power of two.
pub const QKV_MAX_RANK: usize = 16;

/// The largest `head_dim / 2` they take (`QKV_MAX_HALF`).
const QKV_MAX_HALF: usize = 128;

/// Shared memory a block may use without opting in.
const DEFAULT_SHARED_BYTES: usize = 48 << 10;

/// The backward's static shared memory: the angles' sines and cosines and
/// the warps' LoRA partial sums.
const BACKWARD_STATIC_BYTES: usize =
    4 * (2 * QKV_ROWS * QKV_MAX_HALF + (QKV_THREADS as usize / 32) * QKV_ROWS * 2 * QKV_MAX_RANK);

/// The layout of one layer's fused q/k/v projection output, `[rows, width]`
/// row-major: columns `q (heads * head_dim) | k | v (kv_heads * head_dim each)
/// | uq | uv (rank each)`, the product `n1 [Wq; Wk; Wv; Aq; Av]^T`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QkvShape {
    /// `batch * seq`.
    pub rows: usize,
    pub seq: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// The LoRA rank `r` of q and v.
    pub rank: usize,
}

impl QkvShape {
    pub fn q_dim(&self) -> usize {
        self.heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// First column of `uq` (`uv` follows it).
    pub fn u_col(&self) -> usize {
        self.q_dim() + 2 * self.kv_dim()
    }

    /// Columns of the fused output (and rows of the stacked weight).
    pub fn width(&self) -> usize {
        self.u_col() + 2 * self.rank
    }

    /// Checks that this is a shape the fused q/k/v epilogues take (their
    /// launchers check it too): an even head_dim of at most 256, rows a
    /// multiple of seq, a power-of-two rank of at most [`QKV_MAX_RANK`], and
    /// the backward's rows of `dq | dv` within the shared memory a block
    /// gets without opting in.
    pub fn check(&self) -> Result<()> {
        let ok = self.head_dim > 0
            && self.head_dim.is_multiple_of(2)
            && self.head_dim / 2 <= QKV_MAX_HALF
            && self.seq > 0
            && self.rows.is_multiple_of(self.seq)
            && self.rank.is_power_of_two()
            && self.rank <= QKV_MAX_RANK
            && self.backward_shared_bytes() + BACKWARD_STATIC_BYTES <= DEFAULT_SHARED_BYTES;
        if ok {
            Ok(())
        } else {
            Err(Error::InvalidArgument {
                op: OP,
                message: format!(
                    "need an even head_dim <= {}, rows a multiple of seq, a power-of-two rank <= {QKV_MAX_RANK} and {QKV_ROWS} rows of dq | dv within {} bytes: {self:?}",
                    2 * QKV_MAX_HALF,
                    DEFAULT_SHARED_BYTES - BACKWARD_STATIC_BYTES
                ),
            })
        }
    }

    /// The kernels' trailing `rows, seq, heads, kv_heads, head_dim, r`; under
    /// the last-element fault `rows` is one short, so the last row stays
    /// unwritten.
    fn ints(&self, faults: Faults) -> Result<[i32; 6]> {
        let f = |what, v| to_i32(OP, what, v);
        Ok([
            f("rows", faults.written(self.rows))?,
            f("seq", self.seq)?,
            f("heads", self.heads)?,
            f("kv_heads", self.kv_heads)?,
            f("head_dim", self.head_dim)?,
            f("rank", self.rank)?,
        ])
    }

    /// Dynamic shared memory of the backward: its rows' `dq | dv`.
    fn backward_shared_bytes(&self) -> usize {
        4 * QKV_ROWS * (self.q_dim() + self.kv_dim())
    }

    /// The backward: one block per `QKV_ROWS` rows (grid-stride beyond
    /// 65,536 blocks).
    fn launch_config(&self, shared_bytes: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (self.row_blocks(), 1, 1),
            block_dim: (QKV_THREADS, 1, 1),
            shared_mem_bytes: shared_bytes as u32,
        }
    }

    /// The forward: as the backward along x, and along y one block per
    /// `QKV_FWD_THREADS` items (`q_dim / 2 + kv_dim / 2 + kv_dim` of them).
    fn forward_launch_config(&self) -> LaunchConfig {
        let items = self.q_dim() / 2 + self.kv_dim() / 2 + self.kv_dim();
        LaunchConfig {
            grid_dim: (
                self.row_blocks(),
                items.div_ceil(QKV_FWD_THREADS as usize) as u32,
                1,
            ),
            block_dim: (QKV_FWD_THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Blocks along x: one per `QKV_ROWS` rows, at most 65,536 (the
    /// kernels stride over the rest).
    fn row_blocks(&self) -> u32 {
        self.rows.div_ceil(QKV_ROWS).min(1 << 16) as u32
    }
}

/// The angle table of [`qkv_forward`] and [`qkv_backward`]: `[2][seq][half]`,
/// the sines then the cosines of `pos * theta^(-2i / head_dim)`, the angle
/// formed and reduced to `[-pi, pi]` in double as the rope kernels do, its
/// sine and cosine rounded to f32 once.
pub fn qkv_angle_table(seq: usize, head_dim: usize, theta: f64) -> Vec<f32> {
    let half = head_dim / 2;
    let two_pi = std::f64::consts::TAU;
    let angle = |pos: usize, i: usize| {
        let a = pos as f64 * (-2.0 * i as f64 / head_dim as f64 * theta.ln()).exp();
        a - (a / two_pi).round_ties_even() * two_pi
    };
    let mut table = vec![0.0f32; 2 * seq * half];
    for pos in 0..seq {
        for i in 0..half {
            let a = angle(pos, i);
            table[pos * half + i] = a.sin() as f32;
            table[(seq + pos) * half + i] = a.cos() as f32;
        }
    }
    table
}

/// The fused projection's epilogue: from `y = n1 [Wq; Wk; Wv; Aq; Av]^T`
/// (`[rows, width]`, see [`QkvShape`]) and the frozen bias `b = [b_q | b_k |
/// b_v]` (`[q_dim + 2 kv_dim]`, zeros for a model without one) computes
/// `q = y_q + b_q + s uq Bq^T`, `k = y_k + b_k`, `v = y_v + b_v + s uv Bv^T`
/// and writes `qr = rope(q)`, `kr = rope(k)` and `v`, packed, in f32 or
/// rounded to bf16 as `out` holds them, and a copy of `y`'s `uq | uv`
/// columns into `u` (`[rows, 2 r]`, what the LoRA gradients read of `y`, so
/// the whole `y` need not be kept). `bq` is `[q_dim, r]`, `bv` `[kv_dim,
/// r]`.
pub fn qkv_forward(
    gpu: &mut GpuContext,
    sh: &QkvShape,
    (y, bias): (&CudaSlice<f32>, &CudaSlice<f32>),
    (bq, bv, s): (&CudaSlice<f32>, &CudaSlice<f32>, f32),
    table: &CudaSlice<f32>,
    out: QkvOut<'_>,
    u: &mut CudaSlice<f32>,
) -> Result<()> {
    sh.check()?;
    expect_len(OP, "rope table", table.len(), &[2, sh.seq, sh.head_dim / 2])?;
    let (rows, qd, kvd, r) = (sh.rows, sh.q_dim(), sh.kv_dim(), sh.rank);
    expect_len(OP, "y", y.len(), &[rows, sh.width()])?;
    expect_len(OP, "bias", bias.len(), &[sh.u_col()])?;
    expect_len(OP, "bq", bq.len(), &[qd, r])?;
    expect_len(OP, "bv", bv.len(), &[kvd, r])?;
    let (qr_len, kr_len, v_len) = out.lens();
    expect_len(OP, "qr", qr_len, &[rows, qd])?;
    expect_len(OP, "kr", kr_len, &[rows, kvd])?;
    expect_len(OP, "v", v_len, &[rows, kvd])?;
    expect_len(OP, "u", u.len(), &[rows, 2 * r])?;
    let ld = sh.width() as i64;
    let ints = sh.ints(gpu.faults())?;
    let (module, symbol) = match out {
        QkvOut::F32(..) => (QKV_FWD_MODULE, QKV_FWD.0),
        QkvOut::Bf16(..) => (QKV_FWD_BF16_MODULE, QKV_FWD_BF16.0),
    };
    let f = gpu.function(module, symbol)?;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(y).arg(&ld).arg(bq).arg(bv).arg(bias).arg(&s);
    match out {
        QkvOut::F32(qr, kr, v) => l.arg(qr).arg(kr).arg(v),
        QkvOut::Bf16(qr, kr, v) => l.arg(qr).arg(kr).arg(v),
    };
    l.arg(u);
    for i in &ints {
        l.arg(i);
    }
    l.arg(table);
    // SAFETY: rope_qkv_fwd_f32(const float* y, long long ld, const float* bq,
    // const float* bv, const float* bias, float s, float* qr, float* kr, float*
    // v, float* u, int rows, int seq, int heads, int kv_heads, int head_dim,
    // int r, const float* table), and rope_qkv_fwd_bf16 with `unsigned short*`
    // qr, kr, v (the symbol follows `out`'s variant): lengths checked above (the table is [2][seq][head_dim / 2], read at
    // pos < seq, i < head_dim / 2). A thread whose item is past the last does
    // nothing but wait at the block's barriers. Row `row < rows` reads y[row * ld + c] for c <
    // width = ld, bias[c] for c < q_dim + 2 kv_dim (its length),
    // bq[c * r + j] for c < q_dim, bv[c * r + j] for c < kv_dim,
    // j < r <= QKV_MAX_RANK (the static u and B-row arrays; head_dim / 2 <=
    // QKV_MAX_HALF sizes the angle arrays), and writes qr, kr, v, u only at
    // row * (their width) + c below that width (u's is 2 r). The outputs
    // are distinct mutable buffers, so nothing aliases.
    unsafe { l.launch(sh.forward_launch_config()) }?;
    Ok(())
}

/// Where [`qkv_forward`] writes q and k after RoPE and v: f32, or rounded
/// to bf16 (nearest, ties to even), the operands of the bf16 flash
/// attention ([`crate::ops::attention::Qkv`]).
pub enum QkvOut<'a> {
    F32(
        &'a mut CudaSlice<f32>,
        &'a mut CudaSlice<f32>,
        &'a mut CudaSlice<f32>,
    ),
    Bf16(
        &'a mut CudaSlice<Bf16>,
        &'a mut CudaSlice<Bf16>,
        &'a mut CudaSlice<Bf16>,
    ),
}

impl QkvOut<'_> {
    /// Elements of qr, kr and v.
    fn lens(&self) -> (usize, usize, usize) {
        match self {
            QkvOut::F32(q, k, v) => (q.len(), k.len(), v.len()),
            QkvOut::Bf16(q, k, v) => (q.len(), k.len(), v.len()),
        }
    }
}

/// The backward of [`qkv_forward`]: from attention's `dqr`, `dkr`, `dv`
/// (packed) writes `dy`'s columns `dq = rope^T(dqr) | dk = rope^T(dkr) | dv |
/// duq = s dq Bq | duv = s dv Bv` (`[rows, width]`), so that
/// `dn1 = dy [Wq; Wk; Wv; Aq; Av]` is one GEMM.
#[allow(clippy::too_many_arguments)]
pub fn qkv_backward(
    gpu: &mut GpuContext,
    sh: &QkvShape,
    (dqr, dkr, dv): (&CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>),
    (bq, bv, s): (&CudaSlice<f32>, &CudaSlice<f32>, f32),
    table: &CudaSlice<f32>,
    dy: &mut CudaSlice<f32>,
) -> Result<()> {
    qkv_backward_into(gpu, sh, (dqr, dkr, dv), (bq, bv, s), table, (dy, None))
}

/// [`qkv_backward`], also writing `dy16`, `dy`'s bf16 rounding (nearest,
/// ties to even; the same layout), which the bf16 step's q/k/v stack GEMM
/// reads next: one pass instead of a cast after.
#[allow(clippy::too_many_arguments)]
pub fn qkv_backward_with_bf16(
    gpu: &mut GpuContext,
    sh: &QkvShape,
    (dqr, dkr, dv): (&CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>),
    (bq, bv, s): (&CudaSlice<f32>, &CudaSlice<f32>, f32),
    table: &CudaSlice<f32>,
    dy: &mut CudaSlice<f32>,
    dy16: &mut CudaViewMut<'_, Bf16>,
) -> Result<()> {
    expect_len(OP, "dy16", dy16.len(), &[sh.rows, sh.width()])?;
    qkv_backward_into(
        gpu,
        sh,
        (dqr, dkr, dv),
        (bq, bv, s),
        table,
        (dy, Some(dy16)),
    )
}

/// The launch of [`qkv_backward`] and [`qkv_backward_with_bf16`].
fn qkv_backward_into(
    gpu: &mut GpuContext,
    sh: &QkvShape,
    (dqr, dkr, dv): (&CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>),
    (bq, bv, s): (&CudaSlice<f32>, &CudaSlice<f32>, f32),
    table: &CudaSlice<f32>,
    (dy, dy16): (&mut CudaSlice<f32>, Option<&mut CudaViewMut<'_, Bf16>>),
) -> Result<()> {
    sh.check()?;
    expect_len(OP, "rope table", table.len(), &[2, sh.seq, sh.head_dim / 2])?;
    let (rows, qd, kvd, r) = (sh.rows, sh.q_dim(), sh.kv_dim(), sh.rank);
    expect_len(OP, "dqr", dqr.len(), &[rows, qd])?;
    expect_len(OP, "dkr", dkr.len(), &[rows, kvd])?;
    expect_len(OP, "dv", dv.len(), &[rows, kvd])?;
    expect_len(OP, "bq", bq.len(), &[qd, r])?;
    expect_len(OP, "bv", bv.len(), &[kvd, r])?;
    expect_len(OP, "dy", dy.len(), &[rows, sh.width()])?;
    let ld = sh.width() as i64;
    let ints = sh.ints(gpu.faults())?;
    let (module, symbol) = if dy16.is_some() {
        (QKV_BWD_BF16_MODULE, QKV_BWD_BF16.0)
    } else {
        (QKV_BWD_MODULE, QKV_BWD.0)
    };
    let f = gpu.function(module, symbol)?;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(dqr).arg(dkr).arg(dv).arg(bq).arg(bv).arg(&s);
    l.arg(dy);
    if let Some(dy16) = dy16 {
        l.arg(dy16);
    }
    l.arg(&ld);
    for i in &ints {
        l.arg(i);
    }
    l.arg(table);
    // SAFETY: rope_qkv_bwd_f32(const float* dqr, const float* dkr, const
    // float* dv, const float* bq, const float* bv, float s, float* dy, long
    // long ld, int rows, int seq, int heads, int kv_heads, int head_dim, int
    // r, const float* table), and rope_qkv_bwd_f32_bf16 with `unsigned short*
    // dy16` after dy when dy16 is given (checked to dy's length, a distinct
    // mutable borrow, written at the same indices as dy): lengths checked
    // above (the table is [2][seq][head_dim / 2], read at
    // pos < seq, i < head_dim / 2). Row `row < rows` reads the
    // packed inputs at row * (their width) + c below that width and bq, bv as
    // in qkv_forward, and writes dy[row * ld + c] for c < width = ld; the
    // dynamic shared memory holds the QKV_ROWS rows of q_dim + kv_dim floats
    // (dq | dv) the kernel stages (check() kept it and the static arrays
    // within the default 48 KiB, with r a power of two <= 16, as the lane
    // split of the B sums needs). dy
    // is the only output and aliases no input.
    unsafe { l.launch(sh.launch_config(sh.backward_shared_bytes())) }?;
    Ok(())
}

/// The dimensions of a RoPE launch.
/// Checks that `x` of `[batch, seq, heads, head_dim]` is a shape the RoPE
/// kernels take (the launchers check it too): head_dim even (the kernels
/// rotate pairs `(i, i + head_dim / 2)`) and > 0, seq, heads and head_dim
/// within the kernels' `int`, and at most [`super::launch::MAX_ELEMENTS`]
/// pairs.
pub fn check_shape(batch: usize, seq: usize, heads: usize, head_dim: usize) -> Result<()> {
    if head_dim == 0 || !head_dim.is_multiple_of(2) {
        return Err(Error::InvalidArgument {
            op: "rope",
            message: format!("head_dim must be even and > 0, got {head_dim}"),
        });
    }
    to_i32("rope", "seq", seq)?;
    to_i32("rope", "heads", heads)?;
    to_i32("rope", "head_dim", head_dim)?;
    let pairs = [batch, seq, heads, head_dim / 2]
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .unwrap_or(usize::MAX);
    elements("rope", pairs).map(|_| ())
}

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
    check_shape(d.batch, d.seq, d.heads, d.head_dim)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The launchers size their grids, blocks and shared memory by the
    /// kernels' own constants.
    #[test]
    fn qkv_constants_are_the_kernels() {
        let define = |name| crate::kernels::cu_define(include_str!("../kernels/rope.cu"), name);
        assert_eq!(define("QKV_THREADS"), Some(QKV_THREADS as usize));
        assert_eq!(define("QKV_FWD_THREADS"), Some(QKV_FWD_THREADS as usize));
        assert_eq!(define("QKV_ROWS"), Some(QKV_ROWS));
        assert_eq!(define("QKV_MAX_RANK"), Some(QKV_MAX_RANK));
        assert_eq!(define("QKV_MAX_HALF"), Some(QKV_MAX_HALF));
    }

    /// qwen2.5-0.5b's layer (14 heads and 2 kv heads of 64, batch 4 x seq
    /// 256): 448 q pairs, 64 k pairs and 128 v columns, one a thread.
    #[test]
    fn the_forward_grid_gives_every_item_a_thread() {
        let qkv = QkvShape {
            rows: 1024,
            seq: 256,
            heads: 14,
            kv_heads: 2,
            head_dim: 64,
            rank: 16,
        };
        let cfg = qkv.forward_launch_config();
        assert_eq!(cfg.grid_dim, (256, 5, 1));
        assert_eq!(cfg.block_dim, (QKV_FWD_THREADS, 1, 1));
        let threads = (cfg.grid_dim.1 * cfg.block_dim.0) as usize;
        assert!(threads >= 448 + 64 + 128 && threads - (448 + 64 + 128) < 128);
    }

    #[test]
    fn shapes_the_kernels_cannot_take_are_refused() {
        assert!(check_shape(4, 256, 14, 64).is_ok());
        let e = check_shape(2, 7, 3, 33).unwrap_err().to_string();
        assert!(e.contains("head_dim must be even"), "{e}");
        assert!(check_shape(1 << 20, 1 << 20, 1, 2).is_err());
        let qkv = QkvShape {
            rows: 14,
            seq: 7,
            heads: 4,
            kv_heads: 2,
            head_dim: 34,
            rank: 4,
        };
        assert!(qkv.check().is_ok());
        assert!(QkvShape { rank: 3, ..qkv }.check().is_err());
        assert!(QkvShape { rows: 15, ..qkv }.check().is_err());
        assert!(QkvShape {
            head_dim: 33,
            ..qkv
        }
        .check()
        .is_err());
    }

    #[test]
    fn the_angle_table_holds_reduced_sines_then_cosines() {
        let (seq, d, theta) = (300, 8, 1e6);
        let t = qkv_angle_table(seq, d, theta);
        let half = d / 2;
        assert_eq!(t.len(), 2 * seq * half);
        // Position 0: no rotation.
        assert!(t[..half].iter().all(|&s| s == 0.0));
        assert!(t[seq * half..seq * half + half].iter().all(|&c| c == 1.0));
        for (pos, i) in [(1, 0), (299, 0), (299, 3), (17, 2)] {
            let angle = pos as f64 * (-2.0 * i as f64 / d as f64 * f64::ln(theta)).exp();
            let (s, c) = (t[pos * half + i] as f64, t[(seq + pos) * half + i] as f64);
            assert!((s - angle.sin()).abs() < 1e-6, "sin at {pos}, {i}");
            assert!((c - angle.cos()).abs() < 1e-6, "cos at {pos}, {i}");
        }
    }
}
