//! `op_parity`: an op on a backend against the CPU reference.
//!
//! Fresh seeded random inputs per shape; the output buffer is poisoned (NaN)
//! before the op runs. Passes when the relative L2 error
//! `||out - ref|| / ||ref||` is within tolerance, every element was written,
//! and nothing is NaN or Inf.

pub(crate) mod activation;
pub(crate) mod adamw;
pub(crate) mod attention;
pub(crate) mod cast;
pub(crate) mod clip;
pub(crate) mod compare;
pub(crate) mod cross_entropy;
pub(crate) mod elementwise;
pub(crate) mod embedding;
pub(crate) mod gemm;
pub(crate) mod nf4;
pub(crate) mod rmsnorm;
pub(crate) mod rope;
pub(crate) mod softmax;

use serde::Deserialize;

use super::doc::{ParamDefault::*, ParamDoc, Piece::*};
use super::doc::{PASSES, PRECISIONS};
use super::op::OP_NAMES;

use super::op::{Op, Pass};
use super::params::{at_most, fits_host, gpu_shortfall, NonNegative, Precision, Shape};
use super::{Here, Kind, Measurement, TrialContext, Validate};
use crate::check::Backend;
use crate::error::Result;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub op: Op,
    #[serde(default)]
    pub pass: Pass,
    #[serde(default)]
    pub precision: Precision,
    /// One or more shapes, at most [`MAX_SHAPES`]; the trial's metric is the
    /// worst error over them. Each shape's tensors hold at most
    /// [`MAX_ELEMENTS`] elements ([`Op::elements`]); all shapes together take
    /// the host's reference at most [`MAX_REFERENCE_WORK`] multiply-adds.
    pub shapes: Vec<Shape>,
    /// Overrides the precision's default tolerance.
    #[serde(default)]
    pub tolerance: Option<NonNegative>,
    /// Shapes the op must refuse with an error whose message contains this text
    /// (e.g. an NF4 tensor that is not a multiple of the block size); at
    /// most [`MAX_SHAPES`], bounded as `shapes` (a faulty op may run them).
    #[serde(default)]
    pub refuse: Vec<Refusal>,
}

/// Most shapes (and refusals) one trial checks.
pub const MAX_SHAPES: usize = 64;
/// Most elements of all tensors of one shape, 2^30: 4 GiB of f32 on the
/// device, ~24 GiB on the host with the f64 reference and the copies kept
/// for a failure artifact (the shipped largest is 1.4e8, an embedding).
pub const MAX_ELEMENTS: f64 = (1u64 << 30) as f64;
/// Most multiply-adds of the f64 reference over all shapes ([`Op::work`]):
/// the shipped largest trial takes ~1.3e9 (a GEMM list, ~1 s); 2e10 is
/// ~20 s of the host.
pub const MAX_REFERENCE_WORK: f64 = 2e10;

/// Host bytes per element of a shape: the f32 inputs, their f64 widening,
/// the f64 reference, the downloaded f32 output and the copies kept for a
/// failure artifact (`4 + 8 + 8 + 4`).
const HOST_BYTES_PER_ELEMENT: f64 = 24.0;

/// A shape the op must refuse, and the words the error must contain.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Refusal {
    pub shape: Shape,
    pub error_contains: String,
}

/// The parameters of `op_parity`, for the generated reference.
pub const PARAMS: &[ParamDoc] = &[
    ParamDoc {
        name: "op",
        default: Required,
        bound: &[OneOf(OP_NAMES)],
        meaning: "the op compared",
    },
    ParamDoc {
        name: "pass",
        default: Yaml("forward"),
        bound: &[OneOf(PASSES)],
        meaning: "which pass is compared",
    },
    ParamDoc {
        name: "precision",
        default: Yaml("f32"),
        bound: &[OneOf(PRECISIONS)],
        meaning: "the op's precision; picks the default tolerance (and the GEMM engines; for `swiglu`, `rmsnorm` forward and `rope_qkv`, `bf16` runs the kernels that also store bf16 (the `rope_qkv` forward: that store bf16 only), compared with the reference rounded to bf16; for `cross_entropy` forward, the bf16 head's fused forward and backward on bf16 logits)",
    },
    ParamDoc {
        name: "shapes",
        default: Required,
        bound: &[
            Text("1 to "),
            Int(MAX_SHAPES),
            Text(" maps of the op's dims; each shape at most "),
            Real(MAX_ELEMENTS),
            Text(" elements; all together at most "),
            Real(MAX_REFERENCE_WORK),
            Text(" reference multiply-adds"),
        ],
        meaning: "inputs; the metric is the worst error over them",
    },
    ParamDoc {
        name: "tolerance",
        default: Otherwise("the precision's"),
        bound: &[Text(">= 0")],
        meaning: "bound on the rel-L2 error",
    },
    ParamDoc {
        name: "refuse",
        default: Yaml("[]"),
        bound: &[
            Text("at most "),
            Int(MAX_SHAPES),
            Text(" `{shape, error_contains}`, shapes bounded as `shapes`"),
        ],
        meaning: "shapes the op must refuse with an error containing the text",
    },
];

/// A minimal `op_parity` check.
pub const EXAMPLE: &[(&str, &str)] = &[("op", "rmsnorm"), ("shapes", "[{rows: 4, hidden: 33}]")];

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        if self.shapes.is_empty() {
            return Err("`shapes` must list at least one shape".into());
        }
        if self.pass == Pass::Backward && !self.op.has_backward() {
            return Err(format!("op `{}` has no backward pass", self.op));
        }
        for (name, s) in self.all_shapes() {
            s.expect_dims(self.op.dims())
                .map_err(|e| format!("{name}: op `{}` {e}", self.op))?;
        }
        at_most("shapes", self.shapes.len(), MAX_SHAPES)?;
        at_most("refuse", self.refuse.len(), MAX_SHAPES)?;
        self.within_bounds()?;
        // The shapes the op must take (the refusals are meant to be refused).
        for (i, s) in self.shapes.iter().enumerate() {
            self.op
                .check_stack_shape(s)
                .map_err(|e| format!("shapes[{i}] {s}: {e}"))?;
        }
        Ok(())
    }
}

impl Params {
    /// Every shape, the refusals after the shapes, named as in the contract
    /// (the loader locates an error at the parameter it names first).
    fn all_shapes(&self) -> impl Iterator<Item = (String, &Shape)> {
        let shapes = self.shapes.iter().enumerate();
        let refused = self.refuse.iter().enumerate();
        shapes
            .map(|(i, s)| (format!("shapes[{i}] {s}"), s))
            .chain(refused.map(|(i, r)| (format!("refuse[{i}].shape {}", r.shape), &r.shape)))
    }

    /// [`MAX_ELEMENTS`] per shape and [`MAX_REFERENCE_WORK`] in all.
    fn within_bounds(&self) -> std::result::Result<(), String> {
        let mut work = 0.0;
        for (name, s) in self.all_shapes() {
            let n = self.op.elements(s, self.pass);
            if n > MAX_ELEMENTS {
                return Err(format!(
                    "{name}: {n:.1e} elements; the bound is {MAX_ELEMENTS:.1e} per shape"
                ));
            }
            work += self.op.work(s, self.pass);
        }
        if work > MAX_REFERENCE_WORK {
            return Err(format!(
                "shapes: the CPU reference needs ~{work:.1e} multiply-adds; the bound is {MAX_REFERENCE_WORK:.0e} per trial"
            ));
        }
        Ok(())
    }
}

impl Params {
    /// The tolerance in force: the contract's, else the precision default.
    pub fn tolerance(&self) -> f64 {
        self.tolerance
            .map_or_else(|| self.op.tolerance(self.precision), |t| t.0)
    }
}

impl Kind<crate::Qlora> for Params {
    fn execute(&self, backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        compare::measure(self, backend, cx)
    }

    /// The reference runs on the host, one shape at a time: each shape's
    /// `24 x elements` bytes against this machine's memory.
    fn check_budget(&self, _backend: Backend, here: &Here) -> std::result::Result<(), String> {
        for (name, s) in self.all_shapes() {
            fits_host(
                &name,
                HOST_BYTES_PER_ELEMENT * self.op.elements(s, self.pass),
                here,
            )?;
        }
        Ok(())
    }

    /// The device holds one shape at a time, `4 x elements` bytes of f32:
    /// a shape larger than the GPU's free memory cannot be judged there.
    fn unjudged_on(&self, backend: Backend, here: &Here) -> Option<String> {
        if backend != Backend::Cuda {
            return None;
        }
        self.all_shapes()
            .find_map(|(name, s)| gpu_shortfall(&name, 4.0 * self.op.elements(s, self.pass), here))
    }

    /// Many times this kind's longest trial (its `duration_ms` in the
    /// committed baselines; the parameter bounds keep a trial within it):
    /// a stuck trial is stopped, a slow machine is not.
    fn default_timeout_s(&self) -> f64 {
        120.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::params::tests::with_gpu;

    fn params(yaml: &str) -> std::result::Result<Params, String> {
        crate::check::params::tests::parse(yaml)
    }

    #[test]
    fn shapes_are_bounded_in_count_size_and_reference_work() {
        let many = ["{n: 1}"; 65].join(", ");
        let e = params(&format!("op: adamw\nshapes: [{many}]")).unwrap_err();
        assert_eq!(e, "shapes: 65 is above its bound of 64");
        let e = params("op: silu\nshapes: [{rows: 1e6, cols: 1e6}]").unwrap_err();
        assert!(
            e.starts_with(
                "shapes[0] {cols=1000000, rows=1000000}: 2.0e12 elements; the bound is 1.1e9"
            ),
            "{e}"
        );
        let e = params("op: gemm\nshapes: [{m: 8192, n: 8192, k: 8192}]").unwrap_err();
        assert!(
            e.starts_with(
                "shapes: the CPU reference needs ~5.5e11 multiply-adds; the bound is 2e10"
            ),
            "{e}"
        );
        let e = params("op: nf4_quantize\nshapes: [{rows: 1, cols: 64}]\nrefuse: [{shape: {rows: 1e6, cols: 1e6}, error_contains: x}]")
            .unwrap_err();
        assert!(
            e.starts_with("refuse[0].shape {cols=1000000, rows=1000000}: "),
            "{e}"
        );
    }

    #[test]
    fn host_and_device_memory_are_compared_with_a_shape() {
        let p =
            params("op: residual_add\nshapes: [{rows: 1, cols: 1}, {rows: 16384, cols: 16384}]")
                .unwrap();
        // 3 x 2^28 elements: 18 GiB of host copies, 3 GiB of device memory.
        let small_host = Here {
            host_memory_bytes: 16 << 30,
            gpu: None,
        };
        let e = p.check_budget(Backend::Cuda, &small_host).unwrap_err();
        assert_eq!(
            e,
            "shapes[1] {cols=16384, rows=16384} needs ~18.0 GiB on cpu; this machine has 16.0 GiB"
        );
        let mut here = with_gpu("NVIDIA H100 80GB HBM3", 80);
        assert_eq!(p.check_budget(Backend::Cuda, &here), Ok(()));
        assert_eq!(p.unjudged_on(Backend::Cuda, &here), None);
        here.gpu.as_mut().unwrap().free_memory_bytes = 2 << 30;
        assert_eq!(
            p.unjudged_on(Backend::Cuda, &here).unwrap(),
            "shapes[1] {cols=16384, rows=16384} needs ~3.0 GiB, NVIDIA H100 80GB HBM3 has 2.0 GiB free"
        );
    }
}
