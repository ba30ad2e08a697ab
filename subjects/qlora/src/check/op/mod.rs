//! The ops of the qlora stack, named as contracts name them, and their
//! table ([`OPS`]): each op declares once its dims and shape rules, its
//! sizes, its `op_parity` launcher-against-oracle comparison and tolerance,
//! its `gradient_check` instance and the mutant that must fail it, and the
//! memory-bound kernels `bandwidth` times with their byte formulas, and the
//! `throughput_ratio` subjects that time it. `op_parity`, `gradient_check`,
//! `bandwidth` and `throughput_ratio` read the table; adding an op is one
//! entry in [`table`] plus its launcher and oracle functions.

pub mod size;
pub mod table;

use serde::Deserialize;

use super::bandwidth::measure::Case as BandwidthCase;
use super::gradient_check::ops::Problem;
use super::op_parity::compare::{Case, Comparison};
use super::params::{Precision, Shape};
use super::throughput_ratio::kernels::Pairs;
use crate::mutant::Mutant;
use qlora::model::ModelConfig;
pub use table::OPS;

/// The contract spellings of [`Op`], in its order (`tests/kinds.rs`
/// compares them with serde's).
pub const OP_NAMES: &[&str] = &[
    "embedding",
    "rmsnorm",
    "rope",
    "rope_qkv",
    "softmax",
    "attention",
    "silu",
    "swiglu",
    "residual_add",
    "scale",
    "cross_entropy",
    "gemm",
    "nf4_quantize",
    "nf4_dequantize",
    "nf4_gemm",
    "cast_f16",
    "cast_bf16",
    "squared_sum",
    "clip_scale",
    "clip_apply",
    "adamw",
];

/// Every op of the system under test, named as in contracts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Embedding,
    Rmsnorm,
    Rope,
    /// The training step's fused q/k/v epilogue: the frozen q/k/v bias and
    /// the LoRA up-projections added, RoPE on q and k
    /// (`qlora::ops::rope::qkv_forward`).
    RopeQkv,
    Softmax,
    Attention,
    Silu,
    Swiglu,
    ResidualAdd,
    Scale,
    CrossEntropy,
    Gemm,
    Nf4Quantize,
    Nf4Dequantize,
    Nf4Gemm,
    CastF16,
    CastBf16,
    SquaredSum,
    ClipScale,
    ClipApply,
    Adamw,
}

/// Forward or backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Pass {
    #[default]
    Forward,
    Backward,
}

impl Pass {
    /// The stack's direction of a GEMM in this pass.
    pub fn direction(self) -> qlora::gpu::Direction {
        match self {
            Pass::Forward => qlora::gpu::Direction::Forward,
            Pass::Backward => qlora::gpu::Direction::Backward,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Pass::Forward => "fwd",
            Pass::Backward => "bwd",
        }
    }
}

/// A rule a shape of an op's dims must satisfy: `Err` says why not.
pub type ShapeRule = fn(&Shape) -> Result<(), String>;
/// A size of one invocation of an op in a pass (elements, multiply-adds).
pub type Size = fn(&Shape, Pass) -> f64;
/// One `op_parity` case: the op's launchers on the GPU against its oracle.
pub type Parity = fn(&mut qlora::gpu::GpuContext, &Case<'_>) -> crate::error::Result<Comparison>;
/// The seeded `gradient_check` instance of an op at a shape; `true` swaps
/// in the faulty backward of the op's mutant.
pub type GradientProblem = fn(&Shape, &mut rand_chacha::ChaCha8Rng, bool) -> Problem;

/// One op: everything the checks know about it, declared once.
pub struct OpSpec {
    pub op: Op,
    /// The contract spelling (as serde's).
    pub name: &'static str,
    /// The named dimensions a shape for this op must give.
    pub dims: &'static [&'static str],
    /// Whether the op has a backward pass (`op_parity` may compare it).
    pub backward: bool,
    /// The stack's shape rule: the `check_shape` its launchers call.
    pub stack_shape: ShapeRule,
    /// The CPU reference's shape rule.
    pub reference_shape: ShapeRule,
    /// Elements of all tensors one invocation reads and writes.
    pub elements: Size,
    /// Multiply-adds of the f64 reference; `None`: [`OpSpec::elements`].
    pub work: Option<Size>,
    /// `op_parity`'s default tolerance by precision.
    pub tolerance: fn(Precision) -> f64,
    /// `op_parity`: launcher against oracle for one shape.
    pub parity: Parity,
    /// `gradient_check` of the reference backward; `None` where there is
    /// no CPU reference backward to check.
    pub gradient: Option<Gradient>,
    /// The memory-bound kernels of this op that `bandwidth` times.
    pub bandwidth: &'static [BandwidthKernel],
    /// The `throughput_ratio` kernel subjects that time this op.
    pub throughput: &'static [ThroughputKernel],
}

/// An op's `gradient_check`: its instance and its mutant.
pub struct Gradient {
    /// The seeded instance at a shape.
    pub problem: GradientProblem,
    /// The mutant whose faulty backward the check must catch.
    pub mutant: Mutant,
    /// Lengths of the differentiable inputs, in the order they are probed.
    pub input_lens: fn(&Shape) -> Vec<f64>,
}

/// A kernel `bandwidth` times: it takes its op's dims and shape rule.
pub struct BandwidthKernel {
    /// The contract spelling of `bandwidth`'s `op`.
    pub name: &'static str,
    /// The fewest bytes one invocation must move (formulas in [`size`]).
    pub bytes: fn(&Shape, Pass) -> usize,
    /// Elements of the largest tensor.
    pub largest_tensor: fn(&Shape) -> f64,
    /// Device bytes held once besides the rotated buffer sets.
    pub resident_bytes: fn(&Shape) -> f64,
    /// Sets up the forward kernel's buffer sets and launch.
    pub forward: BandwidthCase,
    /// The backward's, where the op has a backward kernel.
    pub backward: Option<BandwidthCase>,
}

impl BandwidthKernel {
    /// The set-up of the kernel of `pass`, if there is one.
    pub fn case(&self, pass: Pass) -> Option<BandwidthCase> {
        match pass {
            Pass::Forward => Some(self.forward),
            Pass::Backward => self.backward,
        }
    }
}

/// A `throughput_ratio` kernel subject: a baseline and a candidate way of
/// running an op, timed on a model's shapes.
pub struct ThroughputKernel {
    /// The contract spelling of `throughput_ratio`'s `subject`.
    pub name: &'static str,
    /// What the baseline and the candidate run, for the report.
    pub baseline: &'static str,
    pub candidate: &'static str,
    /// Times both on the model's shapes (`throughput_ratio`'s `kernels`).
    pub pairs: ThroughputPairs,
    /// Device bytes held at the peak on a model's shapes.
    pub device_bytes: fn(&ModelConfig) -> f64,
}

/// Per-shape times of a baseline and a candidate (and rows reported next
/// to them), with the trial's faults applied to the candidate.
pub type ThroughputPairs = fn(
    &mut qlora::gpu::GpuContext,
    &crate::check::throughput_ratio::Params,
    &ModelConfig,
    u64,
    qlora::Faults,
) -> crate::error::Result<Pairs>;

/// Every `throughput_ratio` kernel subject, in table order.
pub fn throughput_kernels() -> impl Iterator<Item = &'static ThroughputKernel> {
    OPS.iter().flat_map(|spec| spec.throughput.iter())
}

/// Every `bandwidth` kernel with the op it belongs to, in table order.
pub fn bandwidth_kernels() -> impl Iterator<Item = (&'static OpSpec, &'static BandwidthKernel)> {
    OPS.iter()
        .flat_map(|spec| spec.bandwidth.iter().map(move |k| (spec, k)))
}

impl Op {
    /// This op's entry of the table ([`OPS`], in the enum's order).
    pub fn spec(self) -> &'static OpSpec {
        // The table lists every op once, in declaration order (tested).
        &OPS[self as usize]
    }

    /// The named dimensions a shape for this op must give.
    pub fn dims(self) -> &'static [&'static str] {
        self.spec().dims
    }

    /// Whether the op has a backward pass to check.
    pub fn has_backward(self) -> bool {
        self.spec().backward
    }

    /// The snake_case name used in contracts and kernel symbols.
    pub fn name(self) -> &'static str {
        self.spec().name
    }

    /// Elements of all tensors one invocation in `pass` reads and writes:
    /// what the memory estimates scale with (each op's formula is on its
    /// function in [`size`]).
    pub fn elements(self, s: &Shape, pass: Pass) -> f64 {
        (self.spec().elements)(s, pass)
    }

    /// Multiply-adds of the f64 reference for one invocation in `pass`: the
    /// op's own formula where it has one (GEMMs, attention, `rope_qkv`),
    /// otherwise [`Op::elements`], for the ops linear in their tensors.
    pub fn work(self, s: &Shape, pass: Pass) -> f64 {
        let spec = self.spec();
        spec.work.unwrap_or(spec.elements)(s, pass)
    }

    /// Whether the stack's kernels take shape `s` (this op's dims, within
    /// `op_parity`'s element bound): the rules its launchers in
    /// `qlora::ops` enforce, called here so that a contract asking for a
    /// shape the op refuses is refused when it is loaded, with its
    /// location, rather than when its trial runs (on a GPU). Ops whose only
    /// limit is their element count take every such shape.
    pub fn check_stack_shape(self, s: &Shape) -> Result<(), String> {
        (self.spec().stack_shape)(s)
    }

    /// Whether the CPU reference takes shape `s` (this op's dims): the rules
    /// of `crate::reference`, for the checks that run the reference alone
    /// (`gradient_check`).
    pub fn check_reference_shape(self, s: &Shape) -> Result<(), String> {
        (self.spec().reference_shape)(s)
    }

    /// The relative-L2 tolerance of `op_parity` at `precision` when the
    /// contract gives none.
    pub fn tolerance(self, precision: Precision) -> f64 {
        (self.spec().tolerance)(precision)
    }
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_lists_every_op_once_in_the_enums_order() {
        let names: Vec<&str> = OPS.iter().map(|s| s.name).collect();
        assert_eq!(names, OP_NAMES);
        for (i, spec) in OPS.iter().enumerate() {
            assert_eq!(spec.op as usize, i, "{}", spec.name);
            let parsed: Op = serde_yaml::from_str(spec.name).unwrap();
            assert_eq!(parsed, spec.op);
            assert_eq!(spec.op.spec().name, spec.name);
        }
    }

    #[test]
    fn ops_with_a_gradient_check_have_a_backward() {
        for spec in &OPS {
            assert!(spec.gradient.is_none() || spec.backward, "{}", spec.name);
            for k in spec.bandwidth {
                assert!(k.backward.is_none() || spec.backward, "{}", k.name);
            }
        }
    }

    fn shape(yaml: &str) -> Shape {
        serde_yaml::from_str(yaml).expect("a shape")
    }

    #[test]
    fn the_stack_and_the_reference_refuse_their_own_shapes() {
        let attn = "{batch: 1, seq: 8, heads: 6, kv_heads: 4, head_dim: 16}";
        let e = Op::Attention.check_stack_shape(&shape(attn)).unwrap_err();
        assert!(
            e.contains("heads (6) must be a multiple of kv_heads (4)"),
            "{e}"
        );
        assert!(Op::Attention.check_reference_shape(&shape(attn)).is_err());
        // The kernels' widest build is the stack's limit, not the reference's.
        let wide = shape("{batch: 1, seq: 2, heads: 2, kv_heads: 1, head_dim: 256}");
        assert!(Op::Attention.check_stack_shape(&wide).is_err());
        assert_eq!(Op::Attention.check_reference_shape(&wide), Ok(()));
        let qkv = "{batch: 2, seq: 7, heads: 4, kv_heads: 2, head_dim: 34, rank: 3}";
        let e = Op::RopeQkv.check_stack_shape(&shape(qkv)).unwrap_err();
        assert!(e.contains("power-of-two rank"), "{e}");
        let e = Op::Nf4Quantize
            .check_stack_shape(&shape("{rows: 3, cols: 33}"))
            .unwrap_err();
        assert!(e.contains("multiple of 64"), "{e}");
        let odd = shape("{batch: 1, seq: 2, heads: 1, head_dim: 3}");
        assert!(Op::Rope.check_stack_shape(&odd).is_err());
        assert!(Op::Rope.check_reference_shape(&odd).is_err());
        assert_eq!(
            Op::Silu.check_stack_shape(&shape("{rows: 3, cols: 5}")),
            Ok(())
        );
    }
}
