//! Launchers for `kernels/attention.cu`: causal grouped-query attention in
//! f32, forward and backward, with the layouts and the math of
//! [`crate::reference::attention`]:
//!
//! - `q`, `out` `[batch, seq, heads, head_dim]`; `k`, `v` `[batch, seq, kv_heads, head_dim]`;
//!   query head `h` reads kv head `h / (heads / kv_heads)`;
//! - `P = causal_softmax(S)`, `S_ij = <q_i, k_j> / sqrt(head_dim)`, `out_i = sum_j P_ij v_j`;
//!   `probs` (`[batch, heads, seq, seq]`, zeros above the diagonal) is saved for backward;
//! - backward from `P`: `dS = P (dP - rowsum(P dP))` with `dP_ij = <dout_i, v_j>`,
//!   `dq = s dS k`, `dk = s dS^T q`, `dv = P^T dout`, kv gradients summed over
//!   the heads of their group.
//!
//! The backward is deterministic (no atomics): `attention_bwd_dq_f32` writes
//! `dS` to a scratch buffer, and `attention_bwd_dkv_f32` gathers `dk` and
//! `dv` per key row in a fixed order.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::gemm::{grid_dim, random_inputs, to_i64};
use super::parity::{case_rng, compare, written, Arg, Case, Comparison, Signatures};
use crate::check::op::Pass;
use crate::check::params::Precision;
use crate::error::{Error, Result};
use crate::gpu::{to_i32, GpuContext};
use crate::reference;
pub use crate::reference::attention::AttnShape;

/// The kernel module these launchers use.
pub const MODULE: &str = "attention";

/// Kernel argument lists in the order the launchers push them, checked
/// against the compiled PTX by a unit test.
pub const SIGNATURES: Signatures = &[
    (
        "attention_fwd_f32",
        &[
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
        ],
    ),
    (
        "attention_bwd_dq_f32",
        &[
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
        ],
    ),
    (
        "attention_bwd_dkv_f32",
        &[
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
        ],
    ),
];

/// Threads per block of the row kernels (forward, dq): a multiple of 32, as
/// their block reductions need.
const ROW_THREADS: u32 = 128;

/// Dynamic shared memory a block may use without raising the function's limit.
const MAX_DYNAMIC_SHARED: usize = 48 * 1024;

/// Grid limit of the y and z dimensions.
const MAX_GRID_YZ: u32 = 65_535;

/// Element counts of `q`, `k`/`v` and `probs`.
fn lens(sh: &AttnShape) -> (usize, usize, usize) {
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
    if (sh.head_dim + sh.seq) * 4 > MAX_DYNAMIC_SHARED {
        return Err(bad(format!(
            "head_dim + seq = {} floats exceed the {MAX_DYNAMIC_SHARED}-byte shared-memory row buffer",
            sh.head_dim + sh.seq
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
        scale: sh.scale() as f32,
    })
}

fn expect(what: &str, got: usize, want: usize) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(Error::ShapeMismatch {
            op: "attention",
            expected: format!("{what}: {want} elements"),
            got: format!("{got}"),
        })
    }
}

/// One block per (query row, head, batch), with the row buffer in shared memory.
fn row_config(sh: &AttnShape) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (sh.seq as u32, sh.heads as u32, sh.batch as u32),
        block_dim: (ROW_THREADS, 1, 1),
        // validate() bounded this by MAX_DYNAMIC_SHARED.
        shared_mem_bytes: ((sh.head_dim + sh.seq) * 4) as u32,
    }
}

/// Forward: writes `out` and `probs`.
pub fn forward(
    gpu: &mut GpuContext,
    (q, k, v): (&CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>),
    out: &mut CudaSlice<f32>,
    probs: &mut CudaSlice<f32>,
    sh: &AttnShape,
) -> Result<()> {
    let len = out.len();
    forward_limited(gpu, (q, k, v), out, probs, sh, len)
}

fn forward_limited(
    gpu: &mut GpuContext,
    (q, k, v): (&CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>),
    out: &mut CudaSlice<f32>,
    probs: &mut CudaSlice<f32>,
    sh: &AttnShape,
    write_limit: usize,
) -> Result<()> {
    let d = validate(sh)?;
    let (q_len, kv_len, p_len) = lens(sh);
    expect("q", q.len(), q_len)?;
    expect("k", k.len(), kv_len)?;
    expect("v", v.len(), kv_len)?;
    expect("out", out.len(), q_len)?;
    expect("probs", probs.len(), p_len)?;
    let limit = to_i64("attention", write_limit.min(q_len))?;
    let cfg = row_config(sh);
    let func = gpu.function(MODULE, "attention_fwd_f32")?;
    let mut launch = gpu.stream().launch_builder(&func);
    launch
        .arg(q)
        .arg(k)
        .arg(v)
        .arg(out)
        .arg(probs)
        .arg(&d.batch)
        .arg(&d.seq)
        .arg(&d.heads)
        .arg(&d.kv_heads)
        .arg(&d.head_dim)
        .arg(&d.scale)
        .arg(&limit);
    // SAFETY: arguments match `attention_fwd_f32(const float* q, const float*
    // k, const float* v, float* out, float* probs, int batch, int seq, int
    // heads, int kv_heads, int head_dim, float scale, long long write_limit)`
    // in order and type. The lengths were checked against the shape above;
    // heads is a multiple of kv_heads, so every kv head index is < kv_heads.
    // The grid is exactly (seq, heads, batch), each block touches only its
    // row's q/out/probs and rows j <= i < seq of k and v, and uses
    // (head_dim + seq) floats of dynamic shared memory, which is what
    // shared_mem_bytes provides. The block is 128 threads, a multiple of 32,
    // as the warp-shuffle reductions need.
    unsafe { launch.launch(cfg) }?;
    Ok(())
}

/// Backward from the saved `probs`: writes `dq`, `dk`, `dv`.
pub fn backward(
    gpu: &mut GpuContext,
    (q, k, v): (&CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>),
    probs: &CudaSlice<f32>,
    dout: &CudaSlice<f32>,
    (dq, dk, dv): (
        &mut CudaSlice<f32>,
        &mut CudaSlice<f32>,
        &mut CudaSlice<f32>,
    ),
    sh: &AttnShape,
) -> Result<()> {
    let len = dv.len();
    backward_limited(gpu, (q, k, v), probs, dout, (dq, dk, dv), sh, len)
}

fn backward_limited(
    gpu: &mut GpuContext,
    (q, k, v): (&CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>),
    probs: &CudaSlice<f32>,
    dout: &CudaSlice<f32>,
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
    expect("q", q.len(), q_len)?;
    expect("k", k.len(), kv_len)?;
    expect("v", v.len(), kv_len)?;
    expect("probs", probs.len(), p_len)?;
    expect("dout", dout.len(), q_len)?;
    expect("dq", dq.len(), q_len)?;
    expect("dk", dk.len(), kv_len)?;
    expect("dv", dv.len(), kv_len)?;
    let limit = to_i64("attention", dv_write_limit.min(kv_len))?;
    // dS, written in full (zeros above the diagonal) by the first kernel.
    let mut ds = gpu.zeros::<f32>(p_len)?;

    let cfg = row_config(sh);
    let func = gpu.function(MODULE, "attention_bwd_dq_f32")?;
    let mut launch = gpu.stream().launch_builder(&func);
    launch
        .arg(k)
        .arg(v)
        .arg(probs)
        .arg(dout)
        .arg(&mut *dq)
        .arg(&mut ds)
        .arg(&d.batch)
        .arg(&d.seq)
        .arg(&d.heads)
        .arg(&d.kv_heads)
        .arg(&d.head_dim)
        .arg(&d.scale);
    // SAFETY: arguments match `attention_bwd_dq_f32(const float* k, const
    // float* v, const float* probs, const float* dout, float* dq, float* ds,
    // int batch, int seq, int heads, int kv_heads, int head_dim, float scale)`
    // in order and type. Lengths were checked against the shape (ds was just
    // allocated with the probs length); the grid is exactly (seq, heads,
    // batch), each block reads rows j <= i of k and v and row (b, h, i) of
    // probs, writes row (b, h, i) of ds and dq, and uses (head_dim + seq)
    // floats of dynamic shared memory, as provided. 128 threads, a multiple of 32.
    unsafe { launch.launch(cfg) }?;

    let kv_threads = (sh.head_dim.div_ceil(32) * 32).min(ROW_THREADS as usize) as u32;
    let cfg = LaunchConfig {
        grid_dim: (sh.seq as u32, sh.kv_heads as u32, sh.batch as u32),
        block_dim: (kv_threads, 1, 1),
        shared_mem_bytes: 0,
    };
    let func = gpu.function(MODULE, "attention_bwd_dkv_f32")?;
    let mut launch = gpu.stream().launch_builder(&func);
    launch
        .arg(q)
        .arg(dout)
        .arg(probs)
        .arg(&ds)
        .arg(dk)
        .arg(dv)
        .arg(&d.batch)
        .arg(&d.seq)
        .arg(&d.heads)
        .arg(&d.kv_heads)
        .arg(&d.head_dim)
        .arg(&d.scale)
        .arg(&limit);
    // SAFETY: arguments match `attention_bwd_dkv_f32(const float* q, const
    // float* dout, const float* probs, const float* ds, float* dk, float* dv,
    // int batch, int seq, int heads, int kv_heads, int head_dim, float scale,
    // long long write_limit)` in order and type. Lengths were checked; the
    // grid is exactly (seq, kv_heads, batch) (kv_heads <= heads, within the
    // grid limit), each thread reads column j of probs/ds and rows i >= j of
    // q/dout for the heads of its group only, and writes element t <
    // head_dim of row (b, j, g) of dk and dv. The launch is ordered after the
    // dq kernel on the same stream, so ds is complete.
    unsafe { launch.launch(cfg) }?;
    Ok(())
}

// ---- op_parity ---------------------------------------------------------------

/// `op_parity` for one shape `{batch, seq, heads, kv_heads, head_dim}`.
///
/// Forward compares `out` and `probs` with the reference. Backward runs the
/// device forward for `probs`, then the device backward, and compares `dq`,
/// `dk`, `dv` with the reference backward from the reference `probs`.
pub fn parity(gpu: &mut GpuContext, case: &Case<'_>) -> Result<Comparison> {
    if case.precision != Precision::F32 {
        return Err(Error::InvalidArgument {
            op: "attention",
            message: format!("attention computes in f32, not {:?}", case.precision),
        });
    }
    let sh = AttnShape {
        batch: case.shape.dim("batch"),
        seq: case.shape.dim("seq"),
        heads: case.shape.dim("heads"),
        kv_heads: case.shape.dim("kv_heads"),
        head_dim: case.shape.dim("head_dim"),
    };
    validate(&sh)?;
    let (q_len, kv_len, p_len) = lens(&sh);
    let mut rng = case_rng(case.seed);
    // q scaled by 4 so the softmax rows are far from uniform (score standard
    // deviation about 1.3 rather than 0.3).
    let (mut q32, _) = random_inputs(&mut rng, q_len);
    q32.iter_mut().for_each(|x| *x *= 4.0);
    let q64: Vec<f64> = q32.iter().map(|&x| f64::from(x)).collect();
    let (k32, k64) = random_inputs(&mut rng, kv_len);
    let (v32, v64) = random_inputs(&mut rng, kv_len);
    let (ref_out, ref_probs) = reference::attention::forward(&q64, &k64, &v64, &sh)?;

    let q = gpu.upload(&q32)?;
    let k = gpu.upload(&k32)?;
    let v = gpu.upload(&v32)?;
    let mut out = gpu.poisoned(q_len)?;
    let mut probs = gpu.poisoned(p_len)?;
    match case.pass {
        Pass::Forward => {
            let limit = written(q_len, case.mutant);
            forward_limited(gpu, (&q, &k, &v), &mut out, &mut probs, &sh, limit)?;
            let c_out = compare(&gpu.download(&out)?, &ref_out);
            let c_probs = compare(&gpu.download(&probs)?, &ref_probs);
            Ok(c_out.merge(c_probs))
        }
        Pass::Backward => {
            forward_limited(gpu, (&q, &k, &v), &mut out, &mut probs, &sh, q_len)?;
            let (dout32, dout64) = random_inputs(&mut rng, q_len);
            let (ref_dq, ref_dk, ref_dv) =
                reference::attention::backward(&q64, &k64, &v64, &ref_probs, &dout64, &sh)?;
            let dout = gpu.upload(&dout32)?;
            let mut dq = gpu.poisoned(q_len)?;
            let mut dk = gpu.poisoned(kv_len)?;
            let mut dv = gpu.poisoned(kv_len)?;
            let limit = written(kv_len, case.mutant);
            backward_limited(
                gpu,
                (&q, &k, &v),
                &probs,
                &dout,
                (&mut dq, &mut dk, &mut dv),
                &sh,
                limit,
            )?;
            let c_dq = compare(&gpu.download(&dq)?, &ref_dq);
            let c_dk = compare(&gpu.download(&dk)?, &ref_dk);
            let c_dv = compare(&gpu.download(&dv)?, &ref_dv);
            Ok(c_dq.merge(c_dk).merge(c_dv))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(validate(&AttnShape { seq: 20_000, ..ok }).is_err());
        assert!(validate(&AttnShape {
            heads: 70_000,
            kv_heads: 1,
            ..ok
        })
        .is_err());
    }
}
