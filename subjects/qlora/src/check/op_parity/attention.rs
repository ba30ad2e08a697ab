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
/// (FP32 math), tf32 the tensor-core kernels (TF32 math), bf16 the bf16
/// flash kernels.
fn kernels(gpu: &GpuContext, precision: Precision) -> Result<AttnKernels> {
    let faults = gpu.faults();
    match precision {
        Precision::F32 => Ok(AttnKernels::for_math(GemmMath::Fp32, faults)),
        Precision::Tf32 => Ok(AttnKernels::for_math(GemmMath::Tf32, faults)),
        Precision::Bf16 => Ok(AttnKernels::Bf16),
        other => Err(Error::InvalidArgument {
            op: "attention",
            message: format!("attention computes in f32, tf32 or bf16, not {other:?}"),
        }),
    }
}

/// `op_parity` for one shape `{batch, seq, heads, kv_heads, head_dim}`, on
/// the kernels of the case's precision (see [`kernels`]).
///
/// Forward compares `out` and what the forward saves (the probabilities, or
/// the flash kernels' row log-sum-exps) with the reference. Backward runs
/// the device forward, then the device backward from what it saved, and
/// compares `dq`, `dk`, `dv` with the reference backward. The bf16 flash
/// kernels are held to the reference with bf16 rounding where they round
/// ([`reference::attention::flash_bf16_forward`]).
pub fn parity(gpu: &mut GpuContext, case: &Case<'_>) -> Result<Comparison> {
    let kernels = kernels(gpu, case.precision)?;
    let sh = AttnShape {
        batch: case.shape.dim("batch"),
        seq: case.shape.dim("seq"),
        heads: case.shape.dim("heads"),
        kv_heads: case.shape.dim("kv_heads"),
        head_dim: case.shape.dim("head_dim"),
    };
    check_shape(&sh)?;
    let (q_len, kv_len, _) = lens(&sh);
    let mut rng = case_rng(case.seed);
    // q scaled by 4 so the softmax rows are far from uniform (score standard
    // deviation about 1.3 rather than 0.3).
    let (mut q32, _) = random_inputs(&mut rng, q_len);
    q32.iter_mut().for_each(|x| *x *= 4.0);
    let (k32, _) = random_inputs(&mut rng, kv_len);
    let (v32, _) = random_inputs(&mut rng, kv_len);
    let (dout32, _) = random_inputs(&mut rng, q_len);
    // For the flash kernels, rounded to bf16 as the step's q/k/v epilogue rounds them.
    let qkv = QkvBuffers::upload(gpu, kernels, [&q32, &k32, &v32])?;
    let mut out = gpu.poisoned(q_len)?;
    let mut saved = gpu.poisoned(saved_len(&sh, kernels))?;
    forward(gpu, kernels, qkv.as_qkv(), &mut out, &mut saved, &sh)?;
    let oracle = Oracle::new(kernels, [&q32, &k32, &v32, &dout32], &sh)?;
    match case.pass {
        Pass::Forward => {
            let c_out = compare(&gpu.download(&out)?, &oracle.out);
            let c_saved = compare(&gpu.download(&saved)?, &oracle.saved);
            Ok(c_out.merge(c_saved))
        }
        Pass::Backward => {
            let dout = gpu.upload(&dout32)?;
            let mut dq = gpu.poisoned(q_len)?;
            let mut dk = gpu.poisoned(kv_len)?;
            let mut dv = gpu.poisoned(kv_len)?;
            // Poisoned scratch: the kernels must never read what they did not write.
            let mut scratch = gpu.poisoned(backward_scratch_len(&sh, kernels))?;
            backward(
                gpu,
                kernels,
                qkv.as_qkv(),
                &out,
                &saved,
                &dout,
                &mut scratch,
                (&mut dq, &mut dk, &mut dv),
                &sh,
            )?;
            let (ref_dq, ref_dk, ref_dv) = oracle.backward()?;
            let c_dq = compare(&gpu.download(&dq)?, &ref_dq);
            let c_dk = compare(&gpu.download(&dk)?, &ref_dk);
            let c_dv = compare(&gpu.download(&dv)?, &ref_dv);
            Ok(c_dq.merge(c_dk).merge(c_dv))
        }
    }
}

/// The reference a set of kernels is held to, forward done: the exact
/// attention of the f32 inputs for the probability-saving kernels; for the
/// bf16 flash kernels, attention of the inputs rounded to bf16 with bf16
/// rounding where the kernels round.
struct Oracle {
    flash: bool,
    sh: reference::attention::AttnShape,
    /// q, k, v and dout as the reference reads them (rounded for flash).
    inputs: [Vec<f64>; 4],
    /// The unrounded dout (the flash kernels' row dots use it).
    dout: Vec<f64>,
    out: Vec<f64>,
    /// The probabilities, or the row log-sum-exps in log2 units.
    saved: Vec<f64>,
}

impl Oracle {
    fn new(kernels: AttnKernels, f32s: [&[f32]; 4], sh: &AttnShape) -> Result<Oracle> {
        let flash = kernels == AttnKernels::Bf16;
        let round = |x: f32| {
            let x = f64::from(x);
            if flash {
                reference::attention::round_bf16(x)
            } else {
                x
            }
        };
        let inputs = f32s.map(|t| t.iter().map(|&x| round(x)).collect::<Vec<f64>>());
        let sh = oracle_shape(sh);
        let [q, k, v, _] = &inputs;
        let (out, saved) = if flash {
            reference::attention::flash_bf16_forward(q, k, v, &sh)?
        } else {
            reference::attention::forward(q, k, v, &sh)?
        };
        let dout = f32s[3].iter().map(|&x| f64::from(x)).collect();
        Ok(Oracle {
            flash,
            sh,
            inputs,
            dout,
            out,
            saved,
        })
    }

    /// `(dq, dk, dv)` of the reference backward.
    fn backward(&self) -> Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
        let [q, k, v, dout_r] = &self.inputs;
        if self.flash {
            let d = self.sh.head_dim;
            let dots: Vec<f64> = (self.dout.chunks(d).zip(self.out.chunks(d)))
                .map(|(a, b)| a.iter().zip(b).map(|(x, y)| x * y).sum())
                .collect();
            reference::attention::flash_bf16_backward(q, k, v, dout_r, &dots, &self.sh)
        } else {
            reference::attention::backward(q, k, v, &self.saved, dout_r, &self.sh)
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
