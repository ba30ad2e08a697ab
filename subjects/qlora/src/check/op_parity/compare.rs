//! `op_parity`: run an op on the GPU and compare it with the CPU reference.
//!
//! For each shape: fresh seeded random inputs, the output buffer poisoned with
//! NaN before launch, then `rel_l2 = ||out - ref|| / ||ref||` in f64 against the
//! f64 reference. An element still NaN after the launch counts as unwritten; a
//! non-finite output or an all-constant output never passes.
//!
//! When a shape fails, the output and reference of the worst failing shape
//! (and any inputs the per-op function attached) go into the measurement's
//! [`FailureDump`], which the engine writes as a safetensors artifact.

use crate::check::op::{Op, Pass};
use crate::check::params::{Precision, Shape};
use crate::check::Backend;
use crate::check::MutantFaults;
use crate::check::{op_parity, require_gpu, Comparator, Measurement, TrialContext};
use crate::error::{Error, Result};
use cudarc::driver::{CudaSlice, DeviceRepr};
use falsify_core::report::artifacts::{ArtifactTensor, FailureDump};
use qlora::gpu::GpuContext;
use qlora::ops::cast::Bf16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// What one op invocation on one shape produced, compared with the reference.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Comparison {
    pub rel_l2: f64,
    pub max_abs: f64,
    /// Elements still holding the NaN poison.
    pub unwritten: usize,
    /// Elements that are Inf (NaN counts as unwritten).
    pub non_finite: usize,
    /// The output is constant (all equal) although the reference is not.
    pub constant: bool,
    pub len: usize,
    /// Host copies of the compared tensors (`output`, `reference`; a per-op
    /// function may add its inputs), kept for a failure artifact. Empty for
    /// outputs above [`CAPTURE_LIMIT`] elements.
    pub tensors: Vec<ArtifactTensor>,
}

/// Largest output (in elements) whose host copy is kept for a failure
/// artifact: 4 Mi elements is 16 MiB of f32 plus 32 MiB of f64 reference.
pub const CAPTURE_LIMIT: usize = 1 << 22;

impl Comparison {
    /// Folds another output of the same invocation (e.g. dgamma next to dx).
    pub fn merge(self, other: Comparison) -> Comparison {
        let mut tensors = self.tensors;
        for mut t in other.tensors {
            // Two outputs of one invocation: keep both under distinct names.
            let base = t.name.clone();
            let mut k = 1;
            while tensors.iter().any(|u| u.name == t.name) {
                t.name = format!("{base}_{k}");
                k += 1;
            }
            tensors.push(t);
        }
        Comparison {
            rel_l2: self.rel_l2.max(other.rel_l2),
            max_abs: self.max_abs.max(other.max_abs),
            unwritten: self.unwritten + other.unwritten,
            non_finite: self.non_finite + other.non_finite,
            constant: self.constant || other.constant,
            len: self.len + other.len,
            tensors,
        }
    }
}

/// The element a kernel under test writes: f32, or bf16 bits. Its output
/// buffer is poisoned with NaN, read back as f32 values, and held to the
/// reference as that element can hold it: f32 to the f64 reference itself,
/// bf16 to the reference rounded to bf16 (through f32, nearest, ties to
/// even), which is what a kernel that computes in f32 and stores bf16 should
/// hold.
pub trait Written: DeviceRepr + Copy + Unpin {
    /// A device buffer of `n` NaNs.
    fn poisoned(gpu: &GpuContext, n: usize) -> Result<CudaSlice<Self>>;
    /// The values read back, as f32 (exact).
    fn values(out: &[Self]) -> Vec<f32>;
    /// The f64 reference as this element holds it.
    fn reference(reference: &[f64]) -> Vec<f64>;
    /// f32 values as this element holds them, for an input of this element.
    fn rounded(values: &[f32]) -> Vec<Self>;
}

impl Written for f32 {
    fn poisoned(gpu: &GpuContext, n: usize) -> Result<CudaSlice<f32>> {
        Ok(gpu.poisoned(n)?)
    }
    fn values(out: &[f32]) -> Vec<f32> {
        out.to_vec()
    }
    fn reference(reference: &[f64]) -> Vec<f64> {
        reference.to_vec()
    }
    fn rounded(values: &[f32]) -> Vec<f32> {
        values.to_vec()
    }
}

impl Written for Bf16 {
    fn poisoned(gpu: &GpuContext, n: usize) -> Result<CudaSlice<Bf16>> {
        Ok(gpu.upload(&vec![Bf16::from_f32(f32::NAN); n])?)
    }
    fn values(out: &[Bf16]) -> Vec<f32> {
        out.iter().map(|b| b.to_f32()).collect()
    }
    fn reference(reference: &[f64]) -> Vec<f64> {
        reference
            .iter()
            .map(|&v| f64::from(Bf16::from_f32(v as f32).to_f32()))
            .collect()
    }
    fn rounded(values: &[f32]) -> Vec<Bf16> {
        values.iter().map(|&v| Bf16::from_f32(v)).collect()
    }
}

/// Compares the device output `out` of element `W` (copied back to the
/// host) with the f64 reference as `W` holds it ([`Written::reference`]).
pub fn compare_written<W: Written>(out: &[W], reference: &[f64]) -> Comparison {
    compare(&W::values(out), &W::reference(reference))
}

/// Compares a device output (copied back to the host) with the reference.
pub fn compare(out: &[f32], reference: &[f64]) -> Comparison {
    let mut diff2 = 0.0f64;
    let mut ref2 = 0.0f64;
    let mut max_abs = 0.0f64;
    let mut unwritten = 0;
    let mut non_finite = 0;
    for (&o, &r) in out.iter().zip(reference) {
        ref2 += r * r;
        if o.is_nan() {
            unwritten += 1;
            continue;
        }
        if o.is_infinite() {
            non_finite += 1;
            continue;
        }
        let d = f64::from(o) - r;
        diff2 += d * d;
        max_abs = max_abs.max(d.abs());
    }
    if out.len() != reference.len() {
        unwritten += reference.len().abs_diff(out.len());
    }
    let ref_constant = reference.windows(2).all(|w| w[0] == w[1]);
    let out_constant = out.windows(2).all(|w| w[0] == w[1]);
    let rel_l2 = if ref2 > 0.0 {
        (diff2 / ref2).sqrt()
    } else {
        diff2.sqrt()
    };
    let tensors = if out.len().max(reference.len()) <= CAPTURE_LIMIT {
        vec![
            ArtifactTensor::f32("output", out.to_vec(), vec![out.len()]),
            ArtifactTensor::f64("reference", reference.to_vec(), vec![reference.len()]),
        ]
    } else {
        Vec::new()
    };
    Comparison {
        rel_l2,
        max_abs,
        unwritten,
        non_finite,
        constant: out.len() > 1 && out_constant && !ref_constant,
        len: reference.len(),
        tensors,
    }
}

/// Everything a per-op parity function needs for one shape.
pub struct Case<'a> {
    pub pass: Pass,
    pub precision: Precision,
    pub shape: &'a Shape,
    pub seed: u64,
}

/// Runs `op` once for `case` on the GPU and compares with the reference.
fn run_case(op: Op, gpu: &mut GpuContext, case: &Case<'_>) -> Result<Comparison> {
    (op.spec().parity)(gpu, case)
}

pub fn measure(
    p: &op_parity::Params,
    backend: Backend,
    cx: &mut TrialContext<'_>,
) -> Result<Measurement> {
    if backend != Backend::Cuda {
        return Err(Error::InvalidArgument {
            op: "op_parity",
            message: "op_parity runs on cuda".into(),
        });
    }
    let seed = cx.seed;
    let faults = cx.faults();
    let mut scope = require_gpu(cx)?.with_faults(faults);
    let gpu: &mut GpuContext = &mut scope;
    let tolerance = p.tolerance();
    let mut worst = Comparison::default();
    let mut worst_shape = String::new();
    let mut per_shape = Vec::new();
    let mut violations = Vec::new();
    let mut dump: Option<(f64, FailureDump)> = None;
    for (i, shape) in p.shapes.iter().enumerate() {
        let case = Case {
            pass: p.pass,
            precision: p.precision,
            shape,
            seed: seed.wrapping_add(i as u64),
        };
        let mut c = run_case(p.op, gpu, &case)?;
        let tensors = std::mem::take(&mut c.tensors);
        let failed = c.rel_l2.is_nan()
            || c.rel_l2 > tolerance
            || c.unwritten > 0
            || c.non_finite > 0
            || c.constant;
        // The worst failing shape: the largest error among the failing ones
        // (NaN counts as the largest).
        let score = if c.rel_l2.is_nan() {
            f64::INFINITY
        } else {
            c.rel_l2
        };
        if failed && dump.as_ref().is_none_or(|(best, _)| score > *best) {
            let mut metadata = vec![
                ("op".to_string(), p.op.to_string()),
                ("pass".to_string(), p.pass.as_str().to_string()),
                ("precision".to_string(), format!("{:?}", p.precision)),
                ("shape".to_string(), shape.to_string()),
                ("case_seed".to_string(), case.seed.to_string()),
                ("rel_l2".to_string(), format!("{:e}", c.rel_l2)),
            ];
            if tensors.is_empty() {
                metadata.push((
                    "note".to_string(),
                    format!("output above {CAPTURE_LIMIT} elements: not captured"),
                ));
            }
            dump = Some((score, FailureDump { tensors, metadata }));
        }
        per_shape.push(format!(
            "{shape}: rel_l2 {:.3e} max_abs {:.3e}",
            c.rel_l2, c.max_abs
        ));
        if c.unwritten > 0 {
            violations.push(format!(
                "{shape}: {} of {} elements unwritten",
                c.unwritten, c.len
            ));
        }
        if c.non_finite > 0 {
            violations.push(format!("{shape}: {} non-finite elements", c.non_finite));
        }
        if c.constant {
            violations.push(format!("{shape}: output is constant, the reference is not"));
        }
        if c.rel_l2 >= worst.rel_l2 || worst_shape.is_empty() {
            worst_shape = shape.to_string();
        }
        worst = worst.merge(c);
    }
    for refusal in &p.refuse {
        let case = Case {
            pass: p.pass,
            precision: p.precision,
            shape: &refusal.shape,
            seed,
        };
        match run_case(p.op, gpu, &case) {
            Ok(_) => violations.push(format!(
                "{} was accepted; it must be refused",
                refusal.shape
            )),
            Err(e) if e.to_string().contains(&refusal.error_contains) => {
                per_shape.push(format!("{} refused: {e}", refusal.shape));
            }
            Err(e) => violations.push(format!(
                "{} refused with `{e}`, which does not mention `{}`",
                refusal.shape, refusal.error_contains
            )),
        }
    }
    let mut m = Measurement::new(
        "rel_l2_error",
        worst.rel_l2,
        Comparator::Le,
        tolerance,
        "ratio",
    )
    .with_detail(format!(
        "{} {} {:?}; worst {worst_shape}; max_abs {:.3e}; {}",
        p.op,
        p.pass.as_str(),
        p.precision,
        worst.max_abs,
        per_shape.join("; ")
    ));
    for v in violations {
        m.violate(v);
    }
    if let Some((_, dump)) = dump {
        m = m.with_failure(dump);
    }
    Ok(m)
}

/// The seeded generator of one parity case.
pub(crate) fn case_rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// `len` values drawn uniformly from `[lo, hi)`.
pub(crate) fn uniform(rng: &mut ChaCha8Rng, len: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..len).map(|_| rng.random_range(lo..hi)).collect()
}

/// The f32 inputs widened (exactly) for the f64 reference.
pub(crate) fn widen(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| f64::from(v)).collect()
}

/// For an op that updates its buffer in place (no poison possible): elements
/// still bit-identical to their input although the reference changed them.
pub(crate) fn unchanged(out: &[f32], input: &[f32], reference: &[f64]) -> usize {
    out.iter()
        .zip(input)
        .zip(reference)
        .filter(|((o, i), r)| {
            let i = f64::from(**i);
            // Changed beyond f32 rounding, so a correct kernel must have changed it too.
            o.to_bits() == (i as f32).to_bits() && (**r - i).abs() > 1e-6 * i.abs()
        })
        .count()
}

/// [`compare`] of an in-place output, counting unchanged elements as unwritten.
pub(crate) fn compare_in_place(out: &[f32], input: &[f32], reference: &[f64]) -> Comparison {
    let mut c = compare(out, reference);
    c.unwritten += unchanged(out, input, reference);
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comparisons_keep_their_tensors_for_a_failure_artifact() {
        let a = compare(&[1.0, 2.0], &[1.0, 2.5]);
        let names: Vec<&str> = a.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["output", "reference"]);
        let b = compare(&[3.0], &[3.0]);
        let merged = a.merge(b);
        let names: Vec<&str> = merged.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["output", "reference", "output_1", "reference_1"]);
        assert_eq!(merged.tensors[2].shape, vec![1]);
    }

    #[test]
    fn comparison_helpers() {
        let c = compare_in_place(&[1.0, 2.0], &[1.0, 4.0], &[0.5, 2.0]);
        assert_eq!(c.unwritten, 1);
        let c = compare(&[f32::NAN, 1.0], &[1.0, 1.0]);
        assert_eq!(c.unwritten, 1);
    }
}
