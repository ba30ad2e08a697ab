//! `op_parity` of `gemm`: the launchers of `qlora::ops::gemm` against the oracle.

use super::compare::{case_rng, compare, uniform, widen, Case, Comparison, Written};
use crate::check::op::Pass;
use crate::check::params::Precision;
use crate::error::{Error, Result};
use crate::reference;
use cudarc::driver::CudaSlice;
use qlora::gpu::{GemmMath, GpuContext};
use qlora::ops::cast::Bf16;
use qlora::ops::gemm::*;
use rand_chacha::ChaCha8Rng;

// ---- op_parity ---------------------------------------------------------------

/// `n` values uniform in `[-1, 1)`, as the f32 the device gets and as the f64
/// the reference gets (the same numbers).
pub(crate) fn random_inputs(rng: &mut ChaCha8Rng, n: usize) -> (Vec<f32>, Vec<f64>) {
    let v32 = uniform(rng, n, -1.0, 1.0);
    let v64 = widen(&v32);
    (v32, v64)
}

/// `x[rows, cols]` transposed to `[cols, rows]`.
fn transpose<T: Copy>(x: &[T], rows: usize, cols: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(x.len());
    for c in 0..cols {
        for r in 0..rows {
            out.push(x[r * cols + c]);
        }
    }
    out
}

/// The engines a precision is checked on: f32 runs cuBLAS FP32 and the tiled
/// kernel (both must agree with the reference), tf32 cuBLAS TF32 tensor ops,
/// f16 and bf16 the GemmEx paths on operands rounded to that format.
fn engines(precision: Precision) -> Vec<GemmEngine> {
    match precision {
        Precision::F32 => vec![GemmEngine::Cublas(GemmMath::Fp32), GemmEngine::Tiled],
        Precision::Tf32 => vec![GemmEngine::Cublas(GemmMath::Tf32)],
        Precision::F16 => vec![GemmEngine::CublasF16],
        Precision::Bf16 => vec![GemmEngine::CublasBf16],
    }
}

/// The reference's operands for `precision`: the inputs themselves, except
/// for bf16, whose reference is the exact product of the operands rounded
/// to bf16 (nearest, ties to even) as the device rounds them. Against that
/// twin, what is left of a bf16 GEMM's error is its f32 accumulation: the
/// rounding of the inputs is all the error bf16 may add.
fn reference_operand(precision: Precision, v: Vec<f64>) -> Vec<f64> {
    match precision {
        Precision::Bf16 => Bf16::reference(&v),
        _ => v,
    }
}

/// Runs one product on a poisoned output and compares it with `reference`.
fn check_product(
    gpu: &mut GpuContext,
    engine: GemmEngine,
    spec: GemmSpec,
    (a, b): (&CudaSlice<f32>, &CudaSlice<f32>),
    reference: &[f64],
) -> Result<Comparison> {
    let len = spec.m * spec.n;
    let mut out = gpu.poisoned(len)?;
    gemm(gpu, engine, spec, a, b, &mut out)?;
    Ok(compare(&gpu.download(&out)?, reference))
}

/// `op_parity` for one shape `{m, n, k}`.
///
/// Forward: `C = A B` on each engine of the precision, both as the plain
/// product and as the linear form `A (B^T)^T` (W = B^T uploaded transposed),
/// against the reference `A B`. Backward: `dA = dC B^T`, `dB = A^T dC` and
/// the linear-form gradients `dx = dC W`, `dW = dC^T A` (which equal `dA` and
/// `dB^T`), against the reference backward.
pub fn parity(gpu: &mut GpuContext, case: &Case<'_>) -> Result<Comparison> {
    let (m, n, k) = (
        case.shape.dim("m"),
        case.shape.dim("n"),
        case.shape.dim("k"),
    );
    let engines = engines(case.precision);
    let mut rng = case_rng(case.seed);
    let (a32, a64) = random_inputs(&mut rng, m * k);
    let (b32, b64) = random_inputs(&mut rng, k * n);
    let (a64, b64) = (
        reference_operand(case.precision, a64),
        reference_operand(case.precision, b64),
    );
    let a = gpu.upload(&a32)?;
    let b = gpu.upload(&b32)?;
    // W = B^T, stored [n, k]: the linear form y = A W^T is the same product.
    let w = gpu.upload(&transpose(&b32, k, n))?;
    let mut result: Option<Comparison> = None;
    let mut fold = |c: Comparison| {
        result = Some(match result.take() {
            Some(r) => r.merge(c),
            None => c,
        });
    };
    match case.pass {
        Pass::Forward => {
            let c_ref = reference::gemm::matmul(&a64, &b64, m, n, k)?;
            for &engine in &engines {
                let plain = GemmSpec::plain(m, n, k);
                fold(check_product(gpu, engine, plain, (&a, &b), &c_ref)?);
                let lin = GemmSpec::linear(m, k, n);
                fold(check_product(gpu, engine, lin, (&a, &w), &c_ref)?);
            }
        }
        Pass::Backward => {
            let (dc32, dc64) = random_inputs(&mut rng, m * n);
            let dc64 = reference_operand(case.precision, dc64);
            let dc = gpu.upload(&dc32)?;
            let (da_ref, db_ref) = reference::gemm::backward(&a64, &b64, &dc64, m, n, k)?;
            let dw_ref = transpose(&db_ref, k, n);
            let (da_spec, db_spec) = backward_specs(m, n, k);
            let (dx_spec, dw_spec) = (GemmSpec::linear_dx(m, k, n), GemmSpec::linear_dw(m, k, n));
            for &engine in &engines {
                fold(check_product(gpu, engine, da_spec, (&dc, &b), &da_ref)?);
                fold(check_product(gpu, engine, db_spec, (&a, &dc), &db_ref)?);
                fold(check_product(gpu, engine, dx_spec, (&dc, &w), &da_ref)?);
                fold(check_product(gpu, engine, dw_spec, (&dc, &a), &dw_ref)?);
            }
        }
    }
    result.ok_or_else(|| Error::InvalidArgument {
        op: "gemm",
        message: "no engine ran".into(),
    })
}

/// `dA[m, k] = dC[m, n] B^T` (B stored `[k, n]`, i.e. `[n', k']`) and
/// `dB[k, n] = A^T dC` (A stored `[m, k]`, i.e. `[k', m']`).
fn backward_specs(m: usize, n: usize, k: usize) -> (GemmSpec, GemmSpec) {
    let da = GemmSpec {
        trans_b: true,
        ..GemmSpec::plain(m, k, n)
    };
    let db = GemmSpec {
        trans_a: true,
        ..GemmSpec::plain(k, n, m)
    };
    (da, db)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The row-major product a [`GemmSpec`] describes, on the host in f64.
    fn host_gemm(spec: GemmSpec, a: &[f64], b: &[f64]) -> Vec<f64> {
        let GemmSpec {
            m,
            n,
            k,
            trans_a,
            trans_b,
        } = spec;
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                for p in 0..k {
                    let av = if trans_a { a[p * m + i] } else { a[i * k + p] };
                    let bv = if trans_b { b[j * k + p] } else { b[p * n + j] };
                    c[i * n + j] += av * bv;
                }
            }
        }
        c
    }

    /// The specs the launchers build give the reference's products, so the
    /// device only has to get `GemmSpec` right.
    #[test]
    fn specs_reproduce_the_reference_products() {
        let (m, n, k) = (3, 5, 4);
        let mut rng = case_rng(7);
        let (_, a) = random_inputs(&mut rng, m * k);
        let (_, b) = random_inputs(&mut rng, k * n);
        let (_, dc) = random_inputs(&mut rng, m * n);
        let w = transpose(&b, k, n);
        let close = |x: &[f64], y: &[f64]| x.iter().zip(y).all(|(p, q)| (p - q).abs() < 1e-12);

        let c = reference::gemm::matmul(&a, &b, m, n, k).unwrap();
        assert!(close(&host_gemm(GemmSpec::plain(m, n, k), &a, &b), &c));
        assert!(close(&host_gemm(GemmSpec::linear(m, k, n), &a, &w), &c));

        let (da, db) = reference::gemm::backward(&a, &b, &dc, m, n, k).unwrap();
        let (da_spec, db_spec) = backward_specs(m, n, k);
        assert!(close(&host_gemm(da_spec, &dc, &b), &da));
        assert!(close(&host_gemm(db_spec, &a, &dc), &db));

        let (dx, dw) = reference::gemm::linear_backward(&a, &w, &dc, m, k, n).unwrap();
        let (dx_spec, dw_spec) = (GemmSpec::linear_dx(m, k, n), GemmSpec::linear_dw(m, k, n));
        assert!(close(&host_gemm(dx_spec, &dc, &w), &dx));
        assert!(close(&host_gemm(dw_spec, &dc, &a), &dw));
        assert!(close(&dw, &transpose(&db, k, n)));
    }
}
