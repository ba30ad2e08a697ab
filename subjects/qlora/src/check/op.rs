//! The vocabulary of ops that `op_parity` and `gradient_check` talk about.

use serde::Deserialize;

use super::params::Shape;

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
    /// The training step's fused q/k/v epilogue: the LoRA up-projections
    /// added to q and v, RoPE on q and k (`qlora::ops::rope::qkv_forward`).
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
            Op::RopeQkv => &["batch", "seq", "heads", "kv_heads", "head_dim", "rank"],
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
            Op::RopeQkv => "rope_qkv",
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

impl Op {
    /// Elements of all tensors one invocation in `pass` reads and writes:
    /// what the memory estimates scale with. `N` is the product of the
    /// shape's dims for the element-wise ops; otherwise:
    ///
    /// | op | forward | backward |
    /// | --- | --- | --- |
    /// | embedding `{T, V, H}` | `VH + T + TH` | the same (dy, dtable) |
    /// | rmsnorm `{R, H}` | `2RH + H` | `3RH + 2H` |
    /// | rope, scale, cast_f16, clip_apply, nf4 (de)quantize | `2N` | `2N` |
    /// | softmax, silu | `2N` | `3N` |
    /// | swiglu | `3N` | `5N` |
    /// | residual_add | `3N` | `3N` |
    /// | rope_qkv `{B, S, Hq, Hkv, D, r}`, rows `BS`, `q = HqD`, `kv = HkvD` | `BS(2q + 4kv + 2r) + r(q + kv)` | the same |
    /// | attention `{B, S, Hq, Hkv, D}`, `q = BSHqD`, `kv = BSHkvD`, `P = BHqS^2` | `2q + 2kv + P` | `3q + 4kv + 2P` |
    /// | cross_entropy `{R, V}` | `RV + 2R` | `2RV + R` |
    /// | gemm, nf4_gemm `{m, n, k}` | `mk + 2kn + mn` (W also transposed) | `2mk + 3kn + 2mn` |
    /// | squared_sum, clip_scale | `N` | - |
    /// | adamw `{n}` | `7n` | - |
    pub fn elements(self, s: &Shape, pass: Pass) -> f64 {
        let bwd = pass == Pass::Backward;
        let pick = |f: f64, b: f64| if bwd { b } else { f };
        let n = s.0.values().map(|c| c.0 as f64).product::<f64>();
        match self {
            Op::Embedding => {
                let (t, v, h) = (
                    s.dim("tokens") as f64,
                    s.dim("vocab") as f64,
                    s.dim("hidden") as f64,
                );
                v * h + t + t * h
            }
            Op::Rmsnorm => {
                let (r, h) = (s.dim("rows") as f64, s.dim("hidden") as f64);
                pick(2.0 * r * h + h, 3.0 * r * h + 2.0 * h)
            }
            Op::Attention => attention_elements(s, bwd),
            Op::RopeQkv => rope_qkv_elements(s),
            Op::CrossEntropy => {
                let (r, v) = (s.dim("rows") as f64, s.dim("vocab") as f64);
                pick(r * v + 2.0 * r, 2.0 * r * v + r)
            }
            Op::Gemm | Op::Nf4Gemm => {
                let (m, n, k) = (s.dim("m") as f64, s.dim("n") as f64, s.dim("k") as f64);
                pick(
                    m * k + 2.0 * k * n + m * n,
                    2.0 * m * k + 3.0 * k * n + 2.0 * m * n,
                )
            }
            Op::Softmax | Op::Silu => pick(2.0 * n, 3.0 * n),
            Op::Swiglu => pick(3.0 * n, 5.0 * n),
            Op::ResidualAdd => 3.0 * n,
            Op::SquaredSum | Op::ClipScale => n,
            Op::Adamw => 7.0 * n,
            Op::Rope | Op::Scale | Op::CastF16 | Op::ClipApply => 2.0 * n,
            Op::Nf4Quantize | Op::Nf4Dequantize => 2.0 * n,
        }
    }

    /// Multiply-adds of the f64 reference for one invocation in `pass`:
    /// `mnk` for a GEMM (`2mnk` backward, two products), `2 B Hq S^2 D` for
    /// attention (`6 B Hq S^2 D` backward: the forward again and four
    /// products), and [`Op::elements`] for everything else, which is
    /// linear in its tensors.
    pub fn work(self, s: &Shape, pass: Pass) -> f64 {
        let bwd = pass == Pass::Backward;
        match self {
            Op::Gemm | Op::Nf4Gemm => {
                let mnk = s.product(&["m", "n", "k"]);
                if bwd {
                    2.0 * mnk
                } else {
                    mnk
                }
            }
            Op::Attention => {
                let scores = s.product(&["batch", "heads", "seq", "seq", "head_dim"]);
                if bwd {
                    6.0 * scores
                } else {
                    2.0 * scores
                }
            }
            Op::RopeQkv => {
                // Each q and v element takes a rank-long sum (its LoRA
                // up-projection forward, duq and duv backward).
                let (q, kv) = qkv_widths(s);
                self.elements(s, pass) + s.product(&["batch", "seq", "rank"]) * (q + kv)
            }
            _ => self.elements(s, pass),
        }
    }
}

impl Op {
    /// Whether the stack's kernels take shape `s` (this op's dims, within
    /// `op_parity`'s element bound): the rules its launchers in
    /// `qlora::ops` enforce, called here so that a contract asking for a
    /// shape the op refuses is refused when it is loaded, with its
    /// location, rather than when its trial runs (on a GPU). Ops whose only
    /// limit is their element count take every such shape.
    pub fn check_stack_shape(self, s: &Shape) -> Result<(), String> {
        use qlora::ops;
        let d = |name| s.dim(name);
        match self {
            Op::Attention => ops::attention::check_shape(&ops::attention::AttnShape {
                batch: d("batch"),
                seq: d("seq"),
                heads: d("heads"),
                kv_heads: d("kv_heads"),
                head_dim: d("head_dim"),
            }),
            Op::Rope => ops::rope::check_shape(d("batch"), d("seq"), d("heads"), d("head_dim")),
            // The layout `op_parity` gives the fused epilogue: `batch x seq` rows.
            Op::RopeQkv => ops::rope::QkvShape {
                rows: d("batch").saturating_mul(d("seq")),
                seq: d("seq"),
                heads: d("heads"),
                kv_heads: d("kv_heads"),
                head_dim: d("head_dim"),
                rank: d("rank"),
            }
            .check(),
            Op::Rmsnorm => ops::rmsnorm::check_shape(d("rows"), d("hidden")),
            Op::Softmax => ops::softmax::check_shape(d("rows"), d("seq")),
            Op::CrossEntropy => ops::cross_entropy::check_shape(d("rows"), d("vocab")),
            Op::Embedding => ops::embedding::check_shape(d("tokens"), d("vocab"), d("hidden")),
            Op::Nf4Quantize | Op::Nf4Dequantize => {
                ops::nf4::check_len(self.name(), d("rows").saturating_mul(d("cols")))
            }
            Op::Nf4Gemm => ops::nf4::check_gemm_shape("nf4_gemm", d("m"), d("n"), d("k")),
            _ => Ok(()),
        }
        .map_err(|e| e.to_string())
    }

    /// Whether the CPU reference takes shape `s` (this op's dims): the rules
    /// of `crate::reference`, for the checks that run the reference alone
    /// (`gradient_check`).
    pub fn check_reference_shape(self, s: &Shape) -> Result<(), String> {
        use crate::reference;
        match self {
            Op::Rope | Op::RopeQkv => reference::rope::check_head_dim(s.dim("head_dim")),
            Op::Attention => reference::attention::AttnShape {
                batch: s.dim("batch"),
                seq: s.dim("seq"),
                heads: s.dim("heads"),
                kv_heads: s.dim("kv_heads"),
                head_dim: s.dim("head_dim"),
            }
            .check_heads(),
            _ => Ok(()),
        }
        .map_err(|e| e.to_string())
    }
}

/// The widths of q and of k (or v) of a `rope_qkv` shape.
fn qkv_widths(s: &Shape) -> (f64, f64) {
    (
        s.product(&["heads", "head_dim"]),
        s.product(&["kv_heads", "head_dim"]),
    )
}

/// [`Op::elements`] of `rope_qkv`: `y` (`q + 2kv + 2r` wide), the packed
/// `q, k, v` (`dq, dk, dv`), `Bq` and `Bv`; the same in both passes.
fn rope_qkv_elements(s: &Shape) -> f64 {
    let (q, kv) = qkv_widths(s);
    let rows = s.product(&["batch", "seq"]);
    let rank = s.dim("rank") as f64;
    rows * (q + 2.0 * kv + 2.0 * rank) + rows * (q + 2.0 * kv) + rank * (q + kv)
}

/// [`Op::elements`] of attention.
fn attention_elements(s: &Shape, bwd: bool) -> f64 {
    let q = s.product(&["batch", "seq", "heads", "head_dim"]);
    let kv = s.product(&["batch", "seq", "kv_heads", "head_dim"]);
    let probs = s.product(&["batch", "heads", "seq", "seq"]);
    if bwd {
        3.0 * q + 4.0 * kv + 2.0 * probs
    } else {
        2.0 * q + 2.0 * kv + probs
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
