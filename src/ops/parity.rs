//! `op_parity`: run an op on the GPU and compare it with the CPU reference.
//!
//! For each shape: fresh seeded random inputs, the output buffer poisoned with
//! NaN before launch, then `rel_l2 = ||out - ref|| / ||ref||` in f64 against the
//! f64 reference. An element still NaN after the launch counts as unwritten; a
//! non-finite output or an all-constant output never passes.

use crate::check::op::{Op, Pass};
use crate::check::params::{Precision, Shape};
use crate::check::{op_parity, require_gpu, Comparator, Measurement, TrialContext};
use crate::contract::Backend;
use crate::error::{Error, Result};
use crate::gpu::GpuContext;
use crate::mutant::Mutant;

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
}

impl Comparison {
    /// Folds another output of the same invocation (e.g. dgamma next to dx).
    pub fn merge(self, other: Comparison) -> Comparison {
        Comparison {
            rel_l2: self.rel_l2.max(other.rel_l2),
            max_abs: self.max_abs.max(other.max_abs),
            unwritten: self.unwritten + other.unwritten,
            non_finite: self.non_finite + other.non_finite,
            constant: self.constant || other.constant,
            len: self.len + other.len,
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
    Comparison {
        rel_l2,
        max_abs,
        unwritten,
        non_finite,
        constant: out.len() > 1 && out_constant && !ref_constant,
        len: reference.len(),
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

pub fn measure(p: &op_parity::Params, backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
    if backend != Backend::Cuda {
        return Err(Error::InvalidArgument {
            op: "op_parity",
            message: "op_parity runs on cuda".into(),
        });
    }
    let seed = cx.seed;
    let mutant = cx.mutant;
    let gpu = require_gpu(cx)?;
    let tolerance = p.tolerance();
    let mut worst = Comparison::default();
    let mut worst_shape = String::new();
    let mut per_shape = Vec::new();
    let mut violations = Vec::new();
    for (i, shape) in p.shapes.iter().enumerate() {
        let case = Case {
            pass: p.pass,
            precision: p.precision,
            shape,
            seed: seed.wrapping_add(i as u64),
            mutant,
        };
        let c = run_case(p.op, gpu, &case)?;
        per_shape.push(format!("{shape}: rel_l2 {:.3e} max_abs {:.3e}", c.rel_l2, c.max_abs));
        if c.unwritten > 0 {
            violations.push(format!("{shape}: {} of {} elements unwritten", c.unwritten, c.len));
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
            Ok(_) => violations.push(format!("{} was accepted; it must be refused", refusal.shape)),
            Err(e) if e.to_string().contains(&refusal.error_contains) => {
                per_shape.push(format!("{} refused: {e}", refusal.shape));
            }
            Err(e) => violations.push(format!(
                "{} refused with `{e}`, which does not mention `{}`",
                refusal.shape, refusal.error_contains
            )),
        }
    }
    let mut m = Measurement::new("rel_l2_error", worst.rel_l2, Comparator::Le, tolerance, "ratio")
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
    Ok(m)
}

/// The error every not-yet-built launcher returns.
pub(crate) fn unsupported(op: &'static str) -> Error {
    Error::InvalidArgument {
        op,
        message: "no GPU launcher for this op yet".into(),
    }
}
