//! `gradient_check`: the reference backward against central finite differences.
//!
//! For a scalar loss `L = <dy, f(x)>` with a fixed random `dy`, the analytic
//! gradient `g = f'(x)^T dy` is compared with `(L(x + h e_i) - L(x - h e_i)) / 2h`,
//! all in f64. The metric is `||g - g_fd|| / ||g_fd||`.

mod model;
pub(crate) mod ops;

use serde::Deserialize;

use super::doc::TRAINING_MODEL_BOUND;
use super::doc::{ParamDefault::*, ParamDoc, Piece::*};
use super::op::OP_NAMES;

use super::op::{Op, Pass};
use super::params::{at_most, fits_host, Count, ModelName, NonNegative, Positive, Shape};
use super::training::{cpu_model_refusal, reference_bytes};
use super::{Backend, Here, Kind, Measurement, TrialContext, Validate};
use crate::error::Result;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// The op whose backward is checked; exclusive with `model`.
    #[serde(default)]
    pub op: Option<Op>,
    /// Check the whole training step's LoRA and norm gradients on this preset.
    #[serde(default)]
    pub model: Option<ModelName>,
    /// Shapes for `op`: at most [`MAX_SHAPES`], and together at most
    /// [`MAX_WORK`] multiply-adds of finite differences (see [`Params::work`]).
    #[serde(default)]
    pub shapes: Vec<Shape>,
    /// Finite-difference step `h`.
    #[serde(default = "default_step")]
    pub step: Positive,
    pub tolerance: NonNegative,
    /// For `model`: how many coordinates of each parameter tensor are
    /// probed, at most [`MAX_SAMPLES`].
    #[serde(default = "default_samples")]
    pub samples: Count,
}

/// Most shapes one trial checks.
pub const MAX_SHAPES: usize = 64;
/// Most coordinates probed per trainable tensor with `model`: each costs two
/// losses of the reference model (~9 ms each for `tiny` on a 2-core CI
/// machine), so 64 over the 12 tensors of `tiny` take ~13 s.
pub const MAX_SAMPLES: usize = 64;
/// Most multiply-adds of finite differences one `op` trial may take: the
/// shipped checks take up to ~5e6 (7 ms); 5e8 takes at most ~8 s on a
/// 2-core CI machine (RoPE, the slow end at ~15 ns each: it computes its
/// angles per element; cross-entropy ~9 ns, a GEMM under 1 ns).
pub const MAX_WORK: f64 = 5e8;

fn default_step() -> Positive {
    Positive(1e-5)
}

fn default_samples() -> Count {
    Count(16)
}

/// The parameters of `gradient_check`, for the generated reference.
pub const PARAMS: &[ParamDoc] = &[
    ParamDoc {
        name: "op",
        default: Otherwise("none"),
        bound: &[
            OneOf(OP_NAMES),
            Text(", an op with a backward, other than `nf4_gemm`; exactly one of `op` and `model`"),
        ],
        meaning: "the op whose backward is checked",
    },
    ParamDoc {
        name: "model",
        default: Otherwise("none"),
        bound: TRAINING_MODEL_BOUND,
        meaning: "check the training step's LoRA and norm gradients on this preset",
    },
    ParamDoc {
        name: "shapes",
        default: Yaml("[]"),
        bound: &[
            Text("with `op`: 1 to "),
            Int(MAX_SHAPES),
            Text(" maps of the op's dims, together at most "),
            Real(MAX_WORK),
            Text(" finite-difference multiply-adds; none with `model`"),
        ],
        meaning: "inputs of `op`",
    },
    ParamDoc {
        name: "step",
        default: Yaml("1e-5"),
        bound: &[Text("> 0")],
        meaning: "finite-difference step `h`",
    },
    ParamDoc {
        name: "tolerance",
        default: Required,
        bound: &[Text(">= 0")],
        meaning: "bound on the relative error",
    },
    ParamDoc {
        name: "samples",
        default: Yaml("16"),
        bound: &[Text("1 to "), Int(MAX_SAMPLES)],
        meaning: "with `model`: coordinates probed per trainable tensor",
    },
];

/// A minimal `gradient_check` check.
pub const EXAMPLE: &[(&str, &str)] = &[("model", "tiny"), ("tolerance", "1e-4")];

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        match (&self.op, &self.model) {
            (Some(op), None) => {
                if !op.has_backward() {
                    return Err(format!("op `{op}` has no backward pass to check"));
                }
                if self.shapes.is_empty() {
                    return Err("`shapes` must list at least one shape".into());
                }
                if op.spec().gradient.is_none() {
                    return Err(format!("op `{op}` has no CPU reference backward to check"));
                }
                at_most("shapes", self.shapes.len(), MAX_SHAPES)?;
                for (i, s) in self.shapes.iter().enumerate() {
                    s.expect_dims(op.dims())
                        .map_err(|e| format!("op `{op}` {e}"))
                        .and_then(|()| op.check_reference_shape(s))
                        .map_err(|e| format!("shapes[{i}] {s}: {e}"))?;
                }
                self.within_work(*op)
            }
            (None, Some(_)) => {
                if !self.shapes.is_empty() {
                    return Err("`shapes` applies to `op`, not to `model`".into());
                }
                at_most("samples", self.samples.0, MAX_SAMPLES)
            }
            _ => Err("give exactly one of `op` and `model`".into()),
        }
    }
}

impl Params {
    /// Multiply-adds of finite differences for `op` at `shape`: each probed
    /// coordinate of each input costs two forwards,
    /// `sum_i 2 min(len_i, MAX_PROBES) work_fwd + work_bwd`
    /// (see [`Op::work`]; `len_i` are the lengths of the differentiable inputs).
    pub fn work(op: Op, shape: &Shape) -> f64 {
        let probes: f64 = input_lens(op, shape)
            .iter()
            .map(|&len| len.min(ops::MAX_PROBES as f64))
            .sum();
        2.0 * probes * op.work(shape, Pass::Forward) + op.work(shape, Pass::Backward)
    }

    /// Refuses shapes whose finite differences exceed [`MAX_WORK`], naming
    /// the first shape that does alone, or the total.
    fn within_work(&self, op: Op) -> std::result::Result<(), String> {
        let mut total = 0.0;
        for (i, shape) in self.shapes.iter().enumerate() {
            let w = Self::work(op, shape);
            if w > MAX_WORK {
                return Err(format!(
                    "shapes[{i}] {shape}: finite differences of `{op}` need ~{w:.1e} multiply-adds; the bound is {MAX_WORK:.0e} per trial"
                ));
            }
            total += w;
        }
        if total > MAX_WORK {
            return Err(format!(
                "shapes: {} shapes need ~{total:.1e} multiply-adds together; the bound is {MAX_WORK:.0e} per trial",
                self.shapes.len()
            ));
        }
        Ok(())
    }

    /// Host bytes of the largest shape: every tensor of one forward and
    /// backward in f64, twice (the inputs are copied for the perturbed
    /// evaluations, and each evaluation allocates its output):
    /// `16 x elements(backward)` (see [`Op::elements`]).
    fn op_bytes(op: Op, shape: &Shape) -> f64 {
        16.0 * op.elements(shape, Pass::Backward)
    }
}

/// Lengths of the inputs `gradient_check` differentiates for `op`, in the
/// order the check probes them (none for an op without a reference backward).
fn input_lens(op: Op, s: &Shape) -> Vec<f64> {
    op.spec()
        .gradient
        .as_ref()
        .map_or_else(Vec::new, |g| (g.input_lens)(s))
}

impl Kind<crate::Qlora> for Params {
    fn execute(&self, _backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        ops::measure(self, cx)
    }

    /// With `model`: the CPU reference's model bound (as the training
    /// checks) and its memory; with `op`: the memory of the largest shape.
    fn check_budget(&self, _backend: Backend, here: &Here) -> std::result::Result<(), String> {
        if let Some(model) = &self.model {
            let cfg = model.0;
            if let Some(why) = cpu_model_refusal(&cfg) {
                return Err(format!("model: {}: {why}", cfg.name));
            }
            return fits_host(&format!("model: {}", cfg.name), reference_bytes(&cfg), here);
        }
        let Some(op) = self.op else { return Ok(()) };
        for (i, shape) in self.shapes.iter().enumerate() {
            fits_host(
                &format!("shapes[{i}] {shape}"),
                Self::op_bytes(op, shape),
                here,
            )?;
        }
        Ok(())
    }

    /// Many times this kind's longest trial (its `duration_ms` in the
    /// committed baselines; the parameter bounds keep a trial within it):
    /// a stuck trial is stopped, a slow machine is not.
    fn default_timeout_s(&self) -> f64 {
        60.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::params::tests::ci;

    fn params(yaml: &str) -> std::result::Result<Params, String> {
        crate::check::params::tests::parse(yaml)
    }

    #[test]
    fn a_shape_beyond_the_work_bound_is_refused_when_read() {
        for dims in ["{rows: 1e6, cols: 1e6}", "{rows: 1000000, cols: 1000000}"] {
            let e = params(&format!("op: silu\nshapes: [{dims}]\ntolerance: 1.0e-6")).unwrap_err();
            assert!(
                e.starts_with(
                    "shapes[0] {cols=1000000, rows=1000000}: finite differences of `silu` need ~"
                ) && e.ends_with("the bound is 5e8 per trial"),
                "{e}"
            );
        }
        // Each shape alone fits, together they do not.
        let one = "{m: 32, n: 32, k: 32}";
        let e = params(&format!(
            "op: gemm\nshapes: [{}]\ntolerance: 1.0e-6",
            [one; 20].join(", ")
        ))
        .unwrap_err();
        assert!(e.starts_with("shapes: 20 shapes need ~"), "{e}");
        let e = params("op: nf4_gemm\nshapes: [{m: 1, n: 64, k: 64}]\ntolerance: 1.0").unwrap_err();
        assert!(e.contains("no CPU reference backward"), "{e}");
    }

    #[test]
    fn shapes_are_counted_and_their_memory_budgeted() {
        let many = ["{rows: 1, cols: 1}"; 65].join(", ");
        let e = params(&format!("op: scale\nshapes: [{many}]\ntolerance: 1.0")).unwrap_err();
        assert_eq!(e, "shapes: 65 is above its bound of 64");
        let p = params("op: scale\nshapes: [{rows: 3, cols: 33}]\ntolerance: 1.0").unwrap();
        assert_eq!(p.check_budget(Backend::Cpu, &ci()), Ok(()));
        let small = Here {
            host_memory_bytes: 1 << 10,
            gpu: None,
        };
        let e = p.check_budget(Backend::Cpu, &small).unwrap_err();
        assert!(
            e.starts_with("shapes[0] {cols=33, rows=3} needs ~") && e.contains("on cpu"),
            "{e}"
        );
    }

    #[test]
    fn big_models_are_refused_on_cpu_like_the_training_checks() {
        let p = params("model: qwen2.5-coder-1.5b\ntolerance: 1.0e-5").unwrap();
        let e = p.check_budget(Backend::Cpu, &ci()).unwrap_err();
        assert!(
            e.starts_with("model: qwen2.5-coder-1.5b: ") && e.contains("frozen parameters"),
            "{e}"
        );
        let p = params("model: tiny\nsamples: 4\ntolerance: 1.0e-5").unwrap();
        assert_eq!(p.check_budget(Backend::Cpu, &ci()), Ok(()));
        let e = params("model: tiny\nsamples: 100000000\ntolerance: 1.0e-5").unwrap_err();
        assert_eq!(e, "samples: 100000000 is above its bound of 64");
        assert_eq!(p.default_timeout_s(), 60.0);
    }
}
