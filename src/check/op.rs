//! The vocabulary of ops that `op_parity` and `gradient_check` talk about.

use serde::Deserialize;

/// Every op of the system under test, named as in contracts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Embedding,
    Rmsnorm,
    Rope,
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

impl Op {
    /// The named dimensions a shape for this op must give.
    pub fn dims(self) -> &'static [&'static str] {
        match self {
            Op::Embedding => &["tokens", "vocab", "hidden"],
            Op::Rmsnorm => &["rows", "hidden"],
            Op::Rope => &["batch", "seq", "heads", "head_dim"],
            Op::Softmax => &["rows", "seq"],
            Op::Attention => &["batch", "seq", "heads", "kv_heads", "head_dim"],
            Op::Silu | Op::Swiglu | Op::ResidualAdd | Op::Scale => &["rows", "cols"],
            Op::CrossEntropy => &["rows", "vocab"],
            Op::Gemm | Op::Nf4Gemm => &["m", "n", "k"],
            Op::Nf4Quantize | Op::Nf4Dequantize => &["rows", "cols"],
            Op::CastF16 | Op::SquaredSum | Op::ClipScale | Op::ClipApply | Op::Adamw => &["n"],
        }
    }

    /// Whether the op has a backward pass to check.
    pub fn has_backward(self) -> bool {
        !matches!(
            self,
            Op::Nf4Quantize
                | Op::Nf4Dequantize
                | Op::CastF16
                | Op::SquaredSum
                | Op::ClipScale
                | Op::ClipApply
                | Op::Adamw
        )
    }

    /// The snake_case name used in contracts and kernel symbols.
    pub fn name(self) -> &'static str {
        match self {
            Op::Embedding => "embedding",
            Op::Rmsnorm => "rmsnorm",
            Op::Rope => "rope",
            Op::Softmax => "softmax",
            Op::Attention => "attention",
            Op::Silu => "silu",
            Op::Swiglu => "swiglu",
            Op::ResidualAdd => "residual_add",
            Op::Scale => "scale",
            Op::CrossEntropy => "cross_entropy",
            Op::Gemm => "gemm",
            Op::Nf4Quantize => "nf4_quantize",
            Op::Nf4Dequantize => "nf4_dequantize",
            Op::Nf4Gemm => "nf4_gemm",
            Op::CastF16 => "cast_f16",
            Op::SquaredSum => "squared_sum",
            Op::ClipScale => "clip_scale",
            Op::ClipApply => "clip_apply",
            Op::Adamw => "adamw",
        }
    }
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
