//! `op_parity` of `nf4`: the launchers of `qlora::ops::nf4` against the oracle.

use super::compare::{case_rng, compare, compare_written, uniform, Case, Comparison, Written};
use super::gemm::random_inputs;
use crate::check::op::{Op, Pass};
use crate::check::params::Precision;
use crate::error::{Error, Result};
use crate::reference::nf4::{self as ref_nf4, Nf4Tensor, BLOCK};
use qlora::gpu::GpuContext;
use qlora::ops::cast::Bf16;
use qlora::ops::nf4::*;
use rand_chacha::ChaCha8Rng;

// ---- op_parity ---------------------------------------------------------------

/// `op_parity` of `nf4_quantize` (`{rows, cols}`), `nf4_dequantize`
/// (`{rows, cols}`) and `nf4_gemm` (`{m, n, k}`, forward or backward).
/// A length that is not a multiple of 64 is refused before anything runs.
pub fn parity(op: Op, gpu: &mut GpuContext, case: &Case<'_>) -> Result<Comparison> {
    match (op, case.precision) {
        (Op::Nf4Dequantize, Precision::Bf16) => return dequantize_bf16_parity(gpu, case),
        (_, Precision::F32) => {}
        (_, other) => {
            return Err(Error::InvalidArgument {
                op: "nf4",
                message: format!(
                    "NF4 kernels compute in f32 (dequantisation also to bf16), not {other:?}"
                ),
            })
        }
    }
    match op {
        Op::Nf4Quantize => quantize_parity(gpu, case),
        Op::Nf4Dequantize => dequantize_parity(gpu, case),
        Op::Nf4Gemm => gemm_parity(gpu, case),
        other => Err(Error::InvalidArgument {
            op: "nf4",
            message: format!("`{other}` is not an NF4 op"),
        }),
    }
}

/// Weights like a model's: uniform in `[-1, 1)`, scaled per row so blocks
/// have different absmax, and one all-zero block when there are at least two
/// (the zero-block rule is part of the layout).
fn random_weights(rng: &mut ChaCha8Rng, len: usize) -> (Vec<f32>, Vec<f64>) {
    let (mut w32, _) = random_inputs(rng, len);
    for (i, v) in w32.iter_mut().enumerate() {
        // Scales 0.25 .. 2.0 that change every 3 blocks.
        let scale = 0.25 * (1 + (i / (3 * BLOCK)) % 8) as f32;
        *v *= scale;
    }
    if len >= 2 * BLOCK {
        w32[BLOCK..2 * BLOCK].fill(0.0);
    }
    let w64 = w32.iter().map(|&x| f64::from(x)).collect();
    (w32, w64)
}

/// Device codes and absmax, decoded with the reference's own dequantisation
/// and compared with the reference quantisation's decoded values: 0 exactly
/// when every code and every absmax matches. An unwritten absmax (NaN poison)
/// makes its whole block unwritten.
fn quantize_parity(gpu: &mut GpuContext, case: &Case<'_>) -> Result<Comparison> {
    let len = case.shape.dim("rows") * case.shape.dim("cols");
    check_len("nf4_quantize", len)?;
    let mut rng = case_rng(case.seed);
    let (w32, w64) = random_weights(&mut rng, len);
    let reference = ref_nf4::quantize(&w64, BLOCK)?;
    let ref_values = ref_nf4::dequantize(&reference);

    let w = gpu.upload(&w32)?;
    let mut out = Nf4Device {
        // 0xff decodes to code 15 in both nibbles; the absmax poison below is
        // what marks unwritten blocks.
        codes: gpu.upload(&vec![0xffu8; len / 2])?,
        absmax: gpu.poisoned(len / BLOCK)?,
        len,
    };
    quantize(gpu, &w, &mut out)?;
    let device = Nf4Tensor {
        codes: unpack_codes(&gpu.download(&out.codes)?),
        absmax: gpu
            .download(&out.absmax)?
            .into_iter()
            .map(f64::from)
            .collect(),
        len,
        block: BLOCK,
    };
    let decoded: Vec<f32> = ref_nf4::dequantize(&device)
        .into_iter()
        .map(|v| v as f32)
        .collect();
    // Round the reference's decoded values to f32 exactly as the device's
    // were, so that matching codes and absmax compare as exactly 0.
    let ref_values: Vec<f64> = ref_values.iter().map(|&v| f64::from(v as f32)).collect();
    let values = compare(&decoded, &ref_values);
    let absmax32: Vec<f32> = device.absmax.iter().map(|&a| a as f32).collect();
    Ok(values.merge(compare(&absmax32, &reference.absmax)))
}

/// Reference quantisation uploaded in the device layout, dequantised on the
/// device, against the reference dequantisation.
fn dequantize_parity(gpu: &mut GpuContext, case: &Case<'_>) -> Result<Comparison> {
    let (dev, reference) = quantized_case(gpu, case)?;
    let mut out = gpu.poisoned(dev.len)?;
    dequantize(gpu, &dev, &mut out)?;
    Ok(compare(&gpu.download(&out)?, &reference))
}

/// As [`dequantize_parity`], dequantised to bf16 (`dequantize_bf16_into`)
/// against the reference rounded to f32 and then to bf16, nearest even, as
/// the device rounds its f32 product: a value may differ by one bf16 ulp
/// only where the f64 and f32 code books' products straddle a rounding
/// boundary, while a truncating cast errs on nearly every value. Then as a
/// q/k/v stack (`dequantize_bf16_stack`): the same values followed by two
/// f32 rows of one `cols` each, rounded to bf16 after them.
fn dequantize_bf16_parity(gpu: &mut GpuContext, case: &Case<'_>) -> Result<Comparison> {
    let (dev, reference) = quantized_case(gpu, case)?;
    let mut out = <Bf16 as Written>::poisoned(gpu, dev.len)?;
    dequantize_bf16_into(gpu, &dev, &mut out, 0)?;
    let alone = compare_written(&gpu.download(&out)?, &reference);
    let cols = case.shape.dim("cols");
    let mut rng = case_rng(case.seed ^ 1);
    let (a, b) = (
        uniform(&mut rng, cols, -1.0, 1.0),
        uniform(&mut rng, cols, -1.0, 1.0),
    );
    let (d_a, d_b) = (gpu.upload(&a)?, gpu.upload(&b)?);
    let mut stack = <Bf16 as Written>::poisoned(gpu, dev.len + 2 * cols)?;
    dequantize_bf16_stack(gpu, &dev, (&d_a, &d_b), &mut stack)?;
    let mut want = reference;
    want.extend(a.iter().chain(&b).map(|&v| f64::from(v)));
    Ok(alone.merge(compare_written(&gpu.download(&stack)?, &want)))
}

/// The case's weights quantised by the reference, uploaded in the device
/// layout, with the reference's dequantisation of them.
fn quantized_case(gpu: &GpuContext, case: &Case<'_>) -> Result<(Nf4Device, Vec<f64>)> {
    let len = case.shape.dim("rows") * case.shape.dim("cols");
    check_len("nf4_dequantize", len)?;
    let mut rng = case_rng(case.seed);
    let (_, w64) = random_weights(&mut rng, len);
    let t = ref_nf4::quantize(&w64, BLOCK)?;
    Ok((upload(gpu, &t)?, ref_nf4::dequantize(&t)))
}

/// Forward: `y = x deq(W)^T` against `reference::nf4::linear_nf4`. Backward:
/// `dx = dy deq(W)` against `reference::gemm::matmul(dy, deq(W))`.
fn gemm_parity(gpu: &mut GpuContext, case: &Case<'_>) -> Result<Comparison> {
    let (m, n, k) = (
        case.shape.dim("m"),
        case.shape.dim("n"),
        case.shape.dim("k"),
    );
    check_len("nf4_gemm", n * k)?;
    let mut rng = case_rng(case.seed);
    let (_, w64) = random_weights(&mut rng, n * k);
    let t = ref_nf4::quantize(&w64, BLOCK)?;
    let w = upload(gpu, &t)?;
    match case.pass {
        Pass::Forward => {
            let (x32, x64) = random_inputs(&mut rng, m * k);
            let reference = ref_nf4::linear_nf4(&x64, &t, m, k, n)?;
            let x = gpu.upload(&x32)?;
            let mut y = gpu.poisoned(m * n)?;
            gemm_forward(gpu, &x, &w, &mut y, (m, n, k))?;
            Ok(compare(&gpu.download(&y)?, &reference))
        }
        Pass::Backward => {
            let (dy32, dy64) = random_inputs(&mut rng, m * n);
            let reference =
                crate::reference::gemm::matmul(&dy64, &ref_nf4::dequantize(&t), m, k, n)?;
            let dy = gpu.upload(&dy32)?;
            let mut dx = gpu.poisoned(m * k)?;
            gemm_backward(gpu, &dy, &w, &mut dx, (m, n, k))?;
            Ok(compare(&gpu.download(&dx)?, &reference))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_weights_have_a_zero_block_and_varied_scales() {
        let mut rng = case_rng(3);
        let (_, w) = random_weights(&mut rng, 8 * BLOCK);
        let t = qlora::model::nf4::quantize(&w, BLOCK).unwrap();
        assert_eq!(t.absmax[1], 0.0);
        assert!(t.absmax[0] < 0.3 && t.absmax[3] > 0.3);
    }
}
