//! `op_parity` of `attention`: the launchers of `qlora::ops::attention` against the oracle.

use super::compare::{case_rng, compare, Case, Comparison};
use super::gemm::random_inputs;
use crate::check::op::Pass;
use crate::check::params::Precision;
use crate::error::{Error, Result};
use crate::reference;
use qlora::gpu::{GemmMath, GpuContext};
use qlora::ops::attention::*;

// ---- op_parity ---------------------------------------------------------------

/// The attention kernels a precision is checked on: f32 the f32 kernels
/// (FP32 math), tf32 the tensor-core kernels (TF32 math).
fn math(precision: Precision) -> Result<GemmMath> {
    match precision {
        Precision::F32 => Ok(GemmMath::Fp32),
        Precision::Tf32 => Ok(GemmMath::Tf32),
        other => Err(Error::InvalidArgument {
            op: "attention",
            message: format!("attention computes in f32 or tf32, not {other:?}"),
        }),
    }
}

/// `op_parity` for one shape `{batch, seq, heads, kv_heads, head_dim}`, on
/// the kernels of the case's precision (see [`math`]).
///
/// Forward compares `out` and `probs` with the reference. Backward runs the
/// device forward for `probs`, then the device backward, and compares `dq`,
/// `dk`, `dv` with the reference backward from the reference `probs`.
pub fn parity(gpu: &mut GpuContext, case: &Case<'_>) -> Result<Comparison> {
    let math = math(case.precision)?;
    let sh = AttnShape {
        batch: case.shape.dim("batch"),
        seq: case.shape.dim("seq"),
        heads: case.shape.dim("heads"),
        kv_heads: case.shape.dim("kv_heads"),
        head_dim: case.shape.dim("head_dim"),
    };
    check_shape(&sh)?;
    let (q_len, kv_len, p_len) = lens(&sh);
    let mut rng = case_rng(case.seed);
    // q scaled by 4 so the softmax rows are far from uniform (score standard
    // deviation about 1.3 rather than 0.3).
    let (mut q32, _) = random_inputs(&mut rng, q_len);
    q32.iter_mut().for_each(|x| *x *= 4.0);
    let q64: Vec<f64> = q32.iter().map(|&x| f64::from(x)).collect();
    let (k32, k64) = random_inputs(&mut rng, kv_len);
    let (v32, v64) = random_inputs(&mut rng, kv_len);
    let (ref_out, ref_probs) = reference::attention::forward(&q64, &k64, &v64, &oracle_shape(&sh))?;

    let q = gpu.upload(&q32)?;
    let k = gpu.upload(&k32)?;
    let v = gpu.upload(&v32)?;
    let mut out = gpu.poisoned(q_len)?;
    let mut probs = gpu.poisoned(p_len)?;
    match case.pass {
        Pass::Forward => {
            forward(gpu, math, (&q, &k, &v), &mut out, &mut probs, &sh)?;
            let c_out = compare(&gpu.download(&out)?, &ref_out);
            let c_probs = compare(&gpu.download(&probs)?, &ref_probs);
            Ok(c_out.merge(c_probs))
        }
        Pass::Backward => {
            forward(gpu, math, (&q, &k, &v), &mut out, &mut probs, &sh)?;
            let (dout32, dout64) = random_inputs(&mut rng, q_len);
            let (ref_dq, ref_dk, ref_dv) = reference::attention::backward(
                &q64,
                &k64,
                &v64,
                &ref_probs,
                &dout64,
                &oracle_shape(&sh),
            )?;
            let dout = gpu.upload(&dout32)?;
            let mut dq = gpu.poisoned(q_len)?;
            let mut dk = gpu.poisoned(kv_len)?;
            let mut dv = gpu.poisoned(kv_len)?;
            // Poisoned scratch: the kernels must never read what they did not write.
            let mut scratch = gpu.poisoned(backward_scratch_len(&sh))?;
            backward(
                gpu,
                math,
                (&q, &k, &v),
                &out,
                &probs,
                &dout,
                &mut scratch,
                (&mut dq, &mut dk, &mut dv),
                &sh,
            )?;
            let c_dq = compare(&gpu.download(&dq)?, &ref_dq);
            let c_dk = compare(&gpu.download(&dk)?, &ref_dk);
            let c_dv = compare(&gpu.download(&dv)?, &ref_dv);
            Ok(c_dq.merge(c_dk).merge(c_dv))
        }
    }
}

/// The oracle's spelling of a stack attention shape.
fn oracle_shape(sh: &AttnShape) -> reference::attention::AttnShape {
    reference::attention::AttnShape {
        batch: sh.batch,
        seq: sh.seq,
        heads: sh.heads,
        kv_heads: sh.kv_heads,
        head_dim: sh.head_dim,
    }
}
