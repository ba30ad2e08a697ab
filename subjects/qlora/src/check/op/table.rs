//! The op table: one entry per [`Op`], in the enum's order.
//!
//! An entry names the stack's shape rule (the `check_shape` its launchers
//! call), the formulas of [`super::size`], the `op_parity` function that
//! runs the launchers against the oracle, the `gradient_check` instance with
//! its mutant, the kernels `bandwidth` times and the `throughput_ratio`
//! subjects that time it. Adding an op: a variant of
//! [`Op`], its name in [`super::OP_NAMES`], one entry here.

use super::size::*;
use super::{BandwidthKernel, Gradient, Op, OpSpec, ThroughputKernel};
use crate::check::bandwidth::measure as bw;
use crate::check::gradient_check::ops as grad;
use crate::check::op_parity as parity;
use crate::check::params::Precision;
use crate::check::throughput_ratio::kernels as tp;
use crate::mutant::Mutant;

/// `op_parity`'s tolerance by precision: every op takes the precision's
/// default (a contract may give its own).
const BY_PRECISION: fn(Precision) -> f64 = Precision::default_tolerance;

/// A kernel that holds nothing besides its buffer sets and whose largest
/// tensor is all its dims.
const fn kernel(
    name: &'static str,
    bytes: fn(&crate::check::params::Shape, super::Pass) -> usize,
    forward: bw::Case,
    backward: Option<bw::Case>,
) -> BandwidthKernel {
    BandwidthKernel {
        name,
        bytes,
        largest_tensor: all_dims,
        resident_bytes: nothing_resident,
        forward,
        backward,
    }
}

/// A `gradient_check` entry.
const fn gradient(
    problem: super::GradientProblem,
    mutant: Mutant,
    input_lens: fn(&crate::check::params::Shape) -> Vec<f64>,
) -> Option<Gradient> {
    Some(Gradient {
        problem,
        mutant,
        input_lens,
    })
}

/// An element-wise op over `{rows, cols}` with a backward: the stack and
/// the reference take every shape.
const fn elementwise(
    op: Op,
    name: &'static str,
    elements: super::Size,
    parity: super::Parity,
    gradient: Option<Gradient>,
    bandwidth: &'static [BandwidthKernel],
) -> OpSpec {
    OpSpec {
        op,
        name,
        dims: &["rows", "cols"],
        backward: true,
        stack_shape: any_shape,
        reference_shape: any_shape,
        elements,
        work: None,
        tolerance: BY_PRECISION,
        parity,
        gradient,
        bandwidth,
        throughput: &[],
    }
}

/// An op over one vector `{n}` of the clip or the optimizer: forward only,
/// every shape, no reference backward.
const fn vector(
    op: Op,
    name: &'static str,
    elements: super::Size,
    parity: super::Parity,
    bandwidth: &'static [BandwidthKernel],
) -> OpSpec {
    OpSpec {
        op,
        name,
        dims: &["n"],
        backward: false,
        stack_shape: any_shape,
        reference_shape: any_shape,
        elements,
        work: None,
        tolerance: BY_PRECISION,
        parity,
        gradient: None,
        bandwidth,
        throughput: &[],
    }
}

/// Every op, in the order of [`Op`]'s variants.
pub static OPS: [OpSpec; 21] = [
    OpSpec {
        op: Op::Embedding,
        name: "embedding",
        dims: &["tokens", "vocab", "hidden"],
        backward: true,
        stack_shape: embedding_stack,
        reference_shape: any_shape,
        elements: embedding_elements,
        work: None,
        tolerance: BY_PRECISION,
        parity: parity::embedding::parity,
        gradient: gradient(
            grad::embedding_problem,
            Mutant::EmbeddingBackwardOverwrites,
            embedding_inputs,
        ),
        bandwidth: &[BandwidthKernel {
            name: "embedding",
            bytes: embedding_bytes,
            largest_tensor: embedding_largest,
            resident_bytes: embedding_table_bytes,
            forward: bw::embedding,
            backward: None,
        }],
        throughput: &[],
    },
    OpSpec {
        op: Op::Rmsnorm,
        name: "rmsnorm",
        dims: &["rows", "hidden"],
        backward: true,
        stack_shape: rmsnorm_stack,
        reference_shape: any_shape,
        elements: rmsnorm_elements,
        work: None,
        tolerance: BY_PRECISION,
        parity: parity::rmsnorm::parity,
        gradient: gradient(
            grad::rmsnorm_problem,
            Mutant::RmsnormBackwardMissingProjection,
            rmsnorm_inputs,
        ),
        bandwidth: &[
            kernel(
                "rmsnorm",
                rmsnorm_bytes,
                bw::rmsnorm_fwd,
                Some(bw::rmsnorm_bwd),
            ),
            kernel(
                "rmsnorm_residual",
                rmsnorm_residual_bytes,
                bw::rmsnorm_residual,
                None,
            ),
        ],
        throughput: &[ThroughputKernel {
            name: "fusion",
            baseline: "residual_add + rmsnorm",
            candidate: "fused rmsnorm_residual",
            pairs: tp::fusion_pairs,
            device_bytes: tp::fusion_device_bytes,
        }],
    },
    OpSpec {
        op: Op::Rope,
        name: "rope",
        dims: &["batch", "seq", "heads", "head_dim"],
        backward: true,
        stack_shape: rope_stack,
        reference_shape: rope_reference,
        elements: two_per_element,
        work: None,
        tolerance: BY_PRECISION,
        parity: parity::rope::parity,
        gradient: gradient(
            grad::rope_problem,
            Mutant::RopeBackwardForwardRotation,
            one_input,
        ),
        bandwidth: &[kernel("rope", rope_bytes, bw::rope, Some(bw::rope))],
        throughput: &[],
    },
    OpSpec {
        op: Op::RopeQkv,
        name: "rope_qkv",
        dims: &["batch", "seq", "heads", "kv_heads", "head_dim", "rank"],
        backward: true,
        stack_shape: rope_qkv_stack,
        reference_shape: rope_reference,
        elements: rope_qkv_elements,
        work: Some(rope_qkv_work),
        tolerance: BY_PRECISION,
        parity: parity::rope::qkv_parity,
        gradient: gradient(
            grad::rope_qkv_problem,
            Mutant::RopeBackwardForwardRotation,
            rope_qkv_inputs,
        ),
        bandwidth: &[],
        throughput: &[],
    },
    OpSpec {
        op: Op::Softmax,
        name: "softmax",
        dims: &["rows", "seq"],
        backward: true,
        stack_shape: softmax_stack,
        reference_shape: any_shape,
        elements: two_then_three_per_element,
        work: None,
        tolerance: BY_PRECISION,
        parity: parity::softmax::parity,
        gradient: gradient(
            grad::softmax_problem,
            Mutant::SoftmaxBackwardMissingDot,
            one_input,
        ),
        bandwidth: &[],
        throughput: &[],
    },
    OpSpec {
        op: Op::Attention,
        name: "attention",
        dims: &["batch", "seq", "heads", "kv_heads", "head_dim"],
        backward: true,
        stack_shape: attention_stack,
        reference_shape: attention_reference,
        elements: attention_elements,
        work: Some(attention_work),
        tolerance: BY_PRECISION,
        parity: parity::attention::parity,
        gradient: gradient(
            grad::attention_problem,
            Mutant::AttentionBackwardUnscaled,
            attention_inputs,
        ),
        bandwidth: &[],
        throughput: &[ThroughputKernel {
            name: "attention",
            baseline: "f32 attention",
            candidate: "tensor-core attention",
            pairs: tp::attention_pairs,
            device_bytes: tp::attention_device_bytes,
        }],
    },
    elementwise(
        Op::Silu,
        "silu",
        two_then_three_per_element,
        |gpu, case| parity::activation::parity(Op::Silu, gpu, case),
        gradient(
            grad::silu_problem,
            Mutant::SwigluBackwardMissingSiluDerivative,
            one_input,
        ),
        &[kernel("silu", silu_bytes, bw::silu, Some(bw::silu))],
    ),
    elementwise(
        Op::Swiglu,
        "swiglu",
        swiglu_elements,
        |gpu, case| parity::activation::parity(Op::Swiglu, gpu, case),
        gradient(
            grad::swiglu_problem,
            Mutant::SwigluBackwardMissingSiluDerivative,
            two_inputs,
        ),
        &[kernel("swiglu", swiglu_bytes, bw::swiglu, Some(bw::swiglu))],
    ),
    elementwise(
        Op::ResidualAdd,
        "residual_add",
        three_per_element,
        |gpu, case| parity::elementwise::parity(Op::ResidualAdd, gpu, case),
        gradient(
            grad::residual_add_problem,
            Mutant::ResidualBackwardDropsSkip,
            two_inputs,
        ),
        &[kernel(
            "residual_add",
            residual_add_bytes,
            bw::residual_add,
            Some(bw::residual_add),
        )],
    ),
    elementwise(
        Op::Scale,
        "scale",
        two_per_element,
        |gpu, case| parity::elementwise::parity(Op::Scale, gpu, case),
        gradient(
            grad::scale_problem,
            Mutant::ScaleBackwardIgnoresScale,
            one_input,
        ),
        &[kernel("scale", scale_bytes, bw::scale, Some(bw::scale))],
    ),
    OpSpec {
        op: Op::CrossEntropy,
        name: "cross_entropy",
        dims: &["rows", "vocab"],
        backward: true,
        stack_shape: cross_entropy_stack,
        reference_shape: any_shape,
        elements: cross_entropy_elements,
        work: None,
        tolerance: BY_PRECISION,
        parity: parity::cross_entropy::parity,
        gradient: gradient(
            grad::cross_entropy_problem,
            Mutant::CrossEntropyGradMissingSoftmax,
            one_input,
        ),
        bandwidth: &[kernel(
            "cross_entropy",
            cross_entropy_bytes,
            bw::cross_entropy,
            Some(bw::cross_entropy),
        )],
        throughput: &[],
    },
    OpSpec {
        op: Op::Gemm,
        name: "gemm",
        dims: &["m", "n", "k"],
        backward: true,
        stack_shape: any_shape,
        reference_shape: any_shape,
        elements: gemm_elements,
        work: Some(gemm_work),
        tolerance: BY_PRECISION,
        parity: parity::gemm::parity,
        gradient: gradient(
            grad::gemm_problem,
            Mutant::GemmBackwardUntransposed,
            gemm_inputs,
        ),
        bandwidth: &[],
        throughput: &[ThroughputKernel {
            name: "gemm",
            baseline: "raw cublas tf32",
            candidate: "ops::gemm::linear",
            pairs: tp::gemm_pairs,
            device_bytes: tp::gemm_device_bytes,
        }],
    },
    OpSpec {
        op: Op::Nf4Quantize,
        name: "nf4_quantize",
        dims: &["rows", "cols"],
        backward: false,
        stack_shape: nf4_quantize_stack,
        reference_shape: any_shape,
        elements: two_per_element,
        work: None,
        tolerance: BY_PRECISION,
        parity: |gpu, case| parity::nf4::parity(Op::Nf4Quantize, gpu, case),
        gradient: None,
        bandwidth: &[],
        throughput: &[],
    },
    OpSpec {
        op: Op::Nf4Dequantize,
        name: "nf4_dequantize",
        dims: &["rows", "cols"],
        backward: false,
        stack_shape: nf4_dequantize_stack,
        reference_shape: any_shape,
        elements: two_per_element,
        work: None,
        tolerance: BY_PRECISION,
        parity: |gpu, case| parity::nf4::parity(Op::Nf4Dequantize, gpu, case),
        gradient: None,
        bandwidth: &[kernel(
            "nf4_dequantize",
            nf4_dequantize_bytes,
            bw::nf4_dequantize,
            None,
        )],
        throughput: &[],
    },
    OpSpec {
        op: Op::Nf4Gemm,
        name: "nf4_gemm",
        dims: &["m", "n", "k"],
        // Checked on the GPU (op_parity) and through the training step: there
        // is no CPU reference backward for `gradient_check`.
        backward: true,
        stack_shape: nf4_gemm_stack,
        reference_shape: any_shape,
        elements: gemm_elements,
        work: Some(gemm_work),
        tolerance: BY_PRECISION,
        parity: |gpu, case| parity::nf4::parity(Op::Nf4Gemm, gpu, case),
        gradient: None,
        bandwidth: &[],
        throughput: &[ThroughputKernel {
            name: "nf4_gemm",
            baseline: "tf32 cublas, fp32 weight",
            candidate: "nf4 dequantise + tf32 cublas",
            pairs: tp::nf4_pairs,
            device_bytes: tp::nf4_gemm_device_bytes,
        }],
    },
    vector(
        Op::CastF16,
        "cast_f16",
        two_per_element,
        parity::cast::parity,
        &[],
    ),
    vector(
        Op::CastBf16,
        "cast_bf16",
        two_per_element,
        parity::cast::parity_bf16,
        &[],
    ),
    vector(
        Op::SquaredSum,
        "squared_sum",
        one_per_element,
        |gpu, case| parity::clip::parity(Op::SquaredSum, gpu, case),
        &[kernel(
            "squared_sum",
            squared_sum_bytes,
            bw::squared_sum,
            None,
        )],
    ),
    vector(
        Op::ClipScale,
        "clip_scale",
        one_per_element,
        |gpu, case| parity::clip::parity(Op::ClipScale, gpu, case),
        &[],
    ),
    vector(
        Op::ClipApply,
        "clip_apply",
        two_per_element,
        |gpu, case| parity::clip::parity(Op::ClipApply, gpu, case),
        &[kernel("clip_apply", clip_apply_bytes, bw::clip_apply, None)],
    ),
    vector(
        Op::Adamw,
        "adamw",
        seven_per_element,
        parity::adamw::parity,
        &[kernel("adamw", adamw_bytes, bw::adamw, None)],
    ),
];
