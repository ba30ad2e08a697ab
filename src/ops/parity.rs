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
use crate::check::{op_parity, require_gpu, Comparator, Measurement, TrialContext};
use crate::contract::Backend;
use crate::error::{Error, Result};
use crate::gpu::GpuContext;
use crate::mutant::Mutant;
use crate::report::artifacts::{ArtifactTensor, FailureDump};
use cudarc::driver::LaunchConfig;
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
    pub mutant: Option<Mutant>,
}

/// Runs `op` once for `case` on the GPU and compares with the reference.
fn run_case(op: Op, gpu: &mut GpuContext, case: &Case<'_>) -> Result<Comparison> {
    use super::*;
    match op {
        Op::Embedding => embedding::parity(gpu, case),
        Op::Rmsnorm => rmsnorm::parity(gpu, case),
        Op::Rope => rope::parity(gpu, case),
        Op::Softmax => softmax::parity(gpu, case),
        Op::Attention => attention::parity(gpu, case),
        Op::Silu | Op::Swiglu => activation::parity(op, gpu, case),
        Op::ResidualAdd | Op::Scale => elementwise::parity(op, gpu, case),
        Op::CrossEntropy => cross_entropy::parity(gpu, case),
        Op::Gemm => gemm::parity(gpu, case),
        Op::Nf4Quantize | Op::Nf4Dequantize | Op::Nf4Gemm => nf4::parity(op, gpu, case),
        Op::CastF16 => cast::parity(gpu, case),
        Op::SquaredSum | Op::ClipScale | Op::ClipApply => clip::parity(op, gpu, case),
        Op::Adamw => adamw::parity(gpu, case),
    }
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
    let mutant = cx.mutant;
    let gpu = require_gpu(cx)?;
    if mutant == Some(Mutant::OutOfBoundsWrite) {
        // Fault isolation: a kernel on the op's stream faults before the op.
        super::faults::out_of_bounds_write(gpu)?;
    }
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
            mutant,
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
            mutant,
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

/// The number of elements (or rows) a launcher writes: all `n`, or `n - 1`
/// under the test-only fault [`Mutant::LastElementUnwritten`].
pub(crate) fn written(n: usize, fault: Option<Mutant>) -> usize {
    if fault == Some(Mutant::LastElementUnwritten) {
        n.saturating_sub(1)
    } else {
        n
    }
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

/// Threads per block of a row kernel over `cols` columns: a multiple of 32,
/// at least 32, at most `max`.
pub(crate) fn row_threads(cols: usize, max: u32) -> u32 {
    let want = cols.div_ceil(32).saturating_mul(32).max(32);
    u32::try_from(want).unwrap_or(max).min(max)
}

/// Largest element count of a grid-stride kernel: with `n <= 2^30` and a grid
/// of at most `2^30` threads, `k + stride` never overflows the kernel's `int`.
pub(crate) const MAX_ELEMENTS: usize = 1 << 30;

/// A float4 kernel's launch over `n` elements: the count it writes (fewer
/// only under the "last element unwritten" fault) as its `int n`, and one
/// thread per four elements; `None` when nothing is to be written.
pub(crate) fn vec4_launch(
    gpu: &GpuContext,
    op: &'static str,
    n: usize,
    fault: Option<Mutant>,
) -> Result<Option<(i32, LaunchConfig)>> {
    match written(n, fault) {
        0 => Ok(None),
        w => Ok(Some((elements(op, w)?, gpu.launch_1d(w.div_ceil(4))))),
    }
}

/// `n` as the kernel's `int` element count, or an error above [`MAX_ELEMENTS`].
pub(crate) fn elements(op: &'static str, n: usize) -> Result<i32> {
    if n > MAX_ELEMENTS {
        return Err(Error::InvalidArgument {
            op,
            message: format!("{n} elements exceed the kernel limit of {MAX_ELEMENTS}"),
        });
    }
    crate::gpu::to_i32(op, "elements", n)
}

/// The PTX parameter class of a kernel argument, so a test can check the
/// launchers' argument lists against the compiled kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arg {
    /// A device pointer (`.u64`).
    Ptr,
    /// `int` / `unsigned int` (`.u32`).
    I32,
    /// `long long` (`.u64`).
    I64,
    /// `float` (`.f32`).
    F32,
    /// `double` (`.f64`).
    F64,
}

impl Arg {
    /// The PTX `.param` type of this argument.
    pub fn ptx_type(self) -> &'static str {
        match self {
            Arg::Ptr | Arg::I64 => ".u64",
            Arg::I32 => ".u32",
            Arg::F32 => ".f32",
            Arg::F64 => ".f64",
        }
    }
}

/// The argument list of every kernel of a module, by symbol.
pub type Signatures = &'static [(&'static str, &'static [Arg])];

/// The `.param` types of kernel `symbol` in a PTX text, in order.
pub fn ptx_param_types(ptx: &str, symbol: &str) -> Option<Vec<String>> {
    let head = format!(".entry {symbol}(");
    let start = ptx.find(&head)? + head.len();
    let end = start + ptx[start..].find(')')?;
    Some(
        ptx[start..end]
            .split(',')
            .filter_map(|p| p.split_whitespace().nth(1).map(str::to_string))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::cache::compile_module;
    use crate::gpu::nvrtc_present;
    use crate::kernels;

    /// The launchers' argument lists of every module, by module.
    fn signatures() -> Vec<(&'static str, Signatures)> {
        use super::super::*;
        vec![
            (embedding::MODULE, embedding::SIGNATURES),
            (rmsnorm::MODULE, rmsnorm::SIGNATURES),
            (rope::MODULE, rope::SIGNATURES),
            (softmax::MODULE, softmax::SIGNATURES),
            (activation::MODULE, activation::SIGNATURES),
            (elementwise::MODULE, elementwise::SIGNATURES),
            (cross_entropy::MODULE, cross_entropy::SIGNATURES),
            (clip::MODULE, clip::SIGNATURES),
            (adamw::MODULE, adamw::SIGNATURES),
            (faults::MODULE, faults::SIGNATURES),
            (gemm::MODULE, gemm::SIGNATURES),
            (nf4::MODULE, nf4::SIGNATURES),
            (cast::MODULE, cast::SIGNATURES),
            (attention::MODULE_D64, attention::SIGNATURES_D64),
            (attention::MODULE_D128, attention::SIGNATURES_D128),
            (
                crate::train::kernels::MODULE,
                crate::train::kernels::SIGNATURES,
            ),
        ]
    }

    /// Every kernel module has its launchers' argument lists above.
    #[test]
    fn every_module_has_signatures() {
        let listed: Vec<&str> = signatures().iter().map(|(m, _)| *m).collect();
        for m in kernels::MODULES {
            assert!(listed.contains(&m.name), "{} has no signature list", m.name);
        }
    }

    #[test]
    fn every_declared_kernel_has_a_signature() {
        for (module, sigs) in signatures() {
            let Some(m) = kernels::module(module) else {
                panic!("no module {module}");
            };
            let mut declared: Vec<&str> = m.symbols.to_vec();
            let mut signed: Vec<&str> = sigs.iter().map(|s| s.0).collect();
            declared.sort_unstable();
            signed.sort_unstable();
            assert_eq!(declared, signed, "{module}");
        }
    }

    /// Compiles each module (when NVRTC is loadable) and checks every kernel's
    /// PTX parameter list against the launcher's declared argument list.
    #[test]
    fn launcher_arguments_match_the_ptx() {
        if !nvrtc_present() {
            return;
        }
        for (module, sigs) in signatures() {
            let Some(m) = kernels::module(module) else {
                panic!("no module {module}");
            };
            let ptx = compile_module(m, "compute_90").unwrap();
            for (symbol, args) in sigs {
                let got = ptx_param_types(&ptx, symbol).unwrap_or_default();
                let want: Vec<&str> = args.iter().map(|a| a.ptx_type()).collect();
                assert_eq!(got, want, "{module}::{symbol}");
            }
        }
    }

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
        assert_eq!(written(5, Some(Mutant::LastElementUnwritten)), 4);
        assert_eq!(written(0, Some(Mutant::LastElementUnwritten)), 0);
        assert_eq!(written(5, None), 5);
        assert_eq!(row_threads(1, 256), 32);
        assert_eq!(row_threads(33, 256), 64);
        assert_eq!(row_threads(151_936, 1024), 1024);
        let c = compare_in_place(&[1.0, 2.0], &[1.0, 4.0], &[0.5, 2.0]);
        assert_eq!(c.unwritten, 1);
        let c = compare(&[f32::NAN, 1.0], &[1.0, 1.0]);
        assert_eq!(c.unwritten, 1);
        let ptx = ".visible .entry k(\n\t.param .u64 k_param_0,\n\t.param .f32 k_param_1\n)\n{";
        assert_eq!(
            ptx_param_types(ptx, "k"),
            Some(vec![".u64".to_string(), ".f32".to_string()])
        );
    }
}
