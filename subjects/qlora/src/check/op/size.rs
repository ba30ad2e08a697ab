//! The formulas of the op table: shape rules, elements and multiply-adds
//! of one invocation, the inputs `gradient_check` differentiates, and the
//! bytes a `bandwidth` kernel must move.
//!
//! Elements of all tensors one invocation reads and writes (`N` is the
//! product of the shape's dims for the element-wise ops):
//!
//! | op | forward | backward |
//! | --- | --- | --- |
//! | embedding `{T, V, H}` | `VH + T + TH` | the same (dy, dtable) |
//! | rmsnorm `{R, H}` | `2RH + H` | `3RH + 2H` |
//! | rope, scale, cast_f16, cast_bf16, clip_apply, nf4 (de)quantize | `2N` | `2N` |
//! | softmax, silu | `2N` | `3N` |
//! | swiglu | `3N` | `5N` |
//! | residual_add | `3N` | `3N` |
//! | rope_qkv `{B, S, Hq, Hkv, D, r}`, rows `BS`, `q = HqD`, `kv = HkvD` | `BS(2q + 4kv + 4r) + r(q + kv)` (u copied) | `BS(2q + 4kv + 2r) + r(q + kv)` |
//! | attention `{B, S, Hq, Hkv, D}`, `q = BSHqD`, `kv = BSHkvD`, `P = BHqS^2` | `2q + 2kv + P` | `3q + 4kv + 2P` |
//! | cross_entropy `{R, V}` | `RV + 2R` | `2RV + R` |
//! | gemm, nf4_gemm `{m, n, k}` | `mk + 2kn + mn` (W also transposed) | `2mk + 3kn + 2mn` |
//! | squared_sum, clip_scale | `N` | - |
//! | adamw `{n}` | `7n` | - |
//!
//! Multiply-adds of the f64 reference are the elements for every op linear
//! in its tensors; a GEMM takes `mnk` (`2mnk` backward, two products),
//! attention `2 B Hq S^2 D` (`6 B Hq S^2 D` backward: the forward again and
//! four products), `rope_qkv` its elements plus a rank-long sum per q and v
//! element.
//!
//! The fewest bytes a `bandwidth` kernel moves: each input read once, each
//! output written once (f32 and u32 are 4 bytes, NF4 codes half a byte, the
//! clip's squared sum an f64):
//!
//! | kernel, pass | bytes |
//! | --- | --- |
//! | rmsnorm fwd `{R, H}` | `4 (2RH + H)`: x, gamma in; y out |
//! | rmsnorm bwd | `4 (3RH + 2H)`: x, dy, gamma in; dx, dgamma out |
//! | rmsnorm_residual fwd | `4 (4RH + H)`: a, b, gamma in; h, y out |
//! | rope fwd/bwd | `4 * 2N`: x in, y out |
//! | silu fwd | `4 * 2N`; bwd `4 * 3N` (x, dy in; dx out) |
//! | swiglu fwd | `4 * 3N` (gate, up in; y out); bwd `4 * 5N` (gate, up, dy in; dgate, dup out) |
//! | residual_add fwd/bwd | `4 * 3N` (a, b in, y out / dy in, da, db out) |
//! | scale fwd/bwd | `4 * 2N` |
//! | cross_entropy fwd `{R, V}` | `4 (RV + 4R + 1)`: logits, targets in; losses, row stats (2R), mean out |
//! | cross_entropy bwd | `4 (2RV + 3R)`: logits, targets, row stats in; dlogits out |
//! | squared_sum `{n}` | `4n + 8`: g in; one f64 out |
//! | clip_apply `{n}` | `4 (2n + 1)`: g, scale in; g out |
//! | adamw `{n}` | `4 * 7n`: p, g, m, v in; p, m, v out |
//! | embedding fwd `{T, V, H}` | `4 (T + 2TH)`: tokens and the T gathered rows in; y out |
//! | nf4_dequantize `{R, C}` | `N/2 + 4 N/64 + 4N`: codes, absmax in; f32 out |

use super::Pass;
use crate::check::params::Shape;
use qlora::ops;

// ---- shape rules ---------------------------------------------------------------

/// Ops whose only limit is their element count take every shape.
pub(super) fn any_shape(_: &Shape) -> Result<(), String> {
    Ok(())
}

fn stack_attention_shape(s: &Shape) -> ops::attention::AttnShape {
    ops::attention::AttnShape {
        batch: s.dim("batch"),
        seq: s.dim("seq"),
        heads: s.dim("heads"),
        kv_heads: s.dim("kv_heads"),
        head_dim: s.dim("head_dim"),
    }
}

pub(super) fn attention_stack(s: &Shape) -> Result<(), String> {
    ops::attention::check_shape(&stack_attention_shape(s)).map_err(|e| e.to_string())
}

pub(super) fn rope_stack(s: &Shape) -> Result<(), String> {
    let d = |name| s.dim(name);
    ops::rope::check_shape(d("batch"), d("seq"), d("heads"), d("head_dim"))
        .map_err(|e| e.to_string())
}

/// The layout `op_parity` gives the fused epilogue: `batch x seq` rows.
pub(super) fn rope_qkv_stack(s: &Shape) -> Result<(), String> {
    let d = |name| s.dim(name);
    ops::rope::QkvShape {
        rows: d("batch").saturating_mul(d("seq")),
        seq: d("seq"),
        heads: d("heads"),
        kv_heads: d("kv_heads"),
        head_dim: d("head_dim"),
        rank: d("rank"),
    }
    .check()
    .map_err(|e| e.to_string())
}

pub(super) fn rmsnorm_stack(s: &Shape) -> Result<(), String> {
    ops::rmsnorm::check_shape(s.dim("rows"), s.dim("hidden")).map_err(|e| e.to_string())
}

pub(super) fn softmax_stack(s: &Shape) -> Result<(), String> {
    ops::softmax::check_shape(s.dim("rows"), s.dim("seq")).map_err(|e| e.to_string())
}

pub(super) fn cross_entropy_stack(s: &Shape) -> Result<(), String> {
    ops::cross_entropy::check_shape(s.dim("rows"), s.dim("vocab")).map_err(|e| e.to_string())
}

pub(super) fn embedding_stack(s: &Shape) -> Result<(), String> {
    let d = |name| s.dim(name);
    ops::embedding::check_shape(d("tokens"), d("vocab"), d("hidden")).map_err(|e| e.to_string())
}

/// The NF4 block rule of `op` over `rows x cols` values.
fn nf4_len(op: &'static str, s: &Shape) -> Result<(), String> {
    ops::nf4::check_len(op, s.dim("rows").saturating_mul(s.dim("cols"))).map_err(|e| e.to_string())
}

pub(super) fn nf4_quantize_stack(s: &Shape) -> Result<(), String> {
    nf4_len("nf4_quantize", s)
}

pub(super) fn nf4_dequantize_stack(s: &Shape) -> Result<(), String> {
    nf4_len("nf4_dequantize", s)
}

pub(super) fn nf4_gemm_stack(s: &Shape) -> Result<(), String> {
    ops::nf4::check_gemm_shape("nf4_gemm", s.dim("m"), s.dim("n"), s.dim("k"))
        .map_err(|e| e.to_string())
}

/// RoPE's reference pairs the halves of a head: `head_dim` even.
pub(super) fn rope_reference(s: &Shape) -> Result<(), String> {
    crate::reference::rope::check_head_dim(s.dim("head_dim")).map_err(|e| e.to_string())
}

pub(super) fn attention_reference(s: &Shape) -> Result<(), String> {
    crate::reference::attention::AttnShape {
        batch: s.dim("batch"),
        seq: s.dim("seq"),
        heads: s.dim("heads"),
        kv_heads: s.dim("kv_heads"),
        head_dim: s.dim("head_dim"),
    }
    .check_heads()
    .map_err(|e| e.to_string())
}

// ---- elements and multiply-adds --------------------------------------------------

/// `N`: the product of all the shape's dims.
fn all(s: &Shape) -> f64 {
    s.0.values().map(|c| c.0 as f64).product::<f64>()
}

/// `f` forward, `b` backward.
fn pick(pass: Pass, f: f64, b: f64) -> f64 {
    if pass == Pass::Backward {
        b
    } else {
        f
    }
}

pub(super) fn one_per_element(s: &Shape, _: Pass) -> f64 {
    all(s)
}

pub(super) fn two_per_element(s: &Shape, _: Pass) -> f64 {
    2.0 * all(s)
}

pub(super) fn three_per_element(s: &Shape, _: Pass) -> f64 {
    3.0 * all(s)
}

pub(super) fn seven_per_element(s: &Shape, _: Pass) -> f64 {
    7.0 * all(s)
}

/// Softmax and SiLU: `2N` forward, `3N` backward.
pub(super) fn two_then_three_per_element(s: &Shape, pass: Pass) -> f64 {
    let n = all(s);
    pick(pass, 2.0 * n, 3.0 * n)
}

pub(super) fn swiglu_elements(s: &Shape, pass: Pass) -> f64 {
    let n = all(s);
    pick(pass, 3.0 * n, 5.0 * n)
}

pub(super) fn embedding_elements(s: &Shape, _: Pass) -> f64 {
    let (t, v, h) = (
        s.dim("tokens") as f64,
        s.dim("vocab") as f64,
        s.dim("hidden") as f64,
    );
    v * h + t + t * h
}

pub(super) fn rmsnorm_elements(s: &Shape, pass: Pass) -> f64 {
    let (r, h) = (s.dim("rows") as f64, s.dim("hidden") as f64);
    pick(pass, 2.0 * r * h + h, 3.0 * r * h + 2.0 * h)
}

pub(super) fn cross_entropy_elements(s: &Shape, pass: Pass) -> f64 {
    let (r, v) = (s.dim("rows") as f64, s.dim("vocab") as f64);
    pick(pass, r * v + 2.0 * r, 2.0 * r * v + r)
}

pub(super) fn gemm_elements(s: &Shape, pass: Pass) -> f64 {
    let (m, n, k) = (s.dim("m") as f64, s.dim("n") as f64, s.dim("k") as f64);
    pick(
        pass,
        m * k + 2.0 * k * n + m * n,
        2.0 * m * k + 3.0 * k * n + 2.0 * m * n,
    )
}

pub(super) fn gemm_work(s: &Shape, pass: Pass) -> f64 {
    let mnk = s.product(&["m", "n", "k"]);
    pick(pass, mnk, 2.0 * mnk)
}

pub(super) fn attention_elements(s: &Shape, pass: Pass) -> f64 {
    let q = s.product(&["batch", "seq", "heads", "head_dim"]);
    let kv = s.product(&["batch", "seq", "kv_heads", "head_dim"]);
    let probs = s.product(&["batch", "heads", "seq", "seq"]);
    pick(
        pass,
        2.0 * q + 2.0 * kv + probs,
        3.0 * q + 4.0 * kv + 2.0 * probs,
    )
}

pub(super) fn attention_work(s: &Shape, pass: Pass) -> f64 {
    let scores = s.product(&["batch", "heads", "seq", "seq", "head_dim"]);
    pick(pass, 2.0 * scores, 6.0 * scores)
}

/// The widths of q and of k (or v) of a `rope_qkv` shape.
fn qkv_widths(s: &Shape) -> (f64, f64) {
    (
        s.product(&["heads", "head_dim"]),
        s.product(&["kv_heads", "head_dim"]),
    )
}

/// `y` (`q + 2kv + 2r` wide), the packed `q, k, v` (`dq, dk, dv`), `Bq`
/// and `Bv`; forward also the copy of `y`'s `u` columns (`2r` wide).
pub(super) fn rope_qkv_elements(s: &Shape, pass: Pass) -> f64 {
    let (q, kv) = qkv_widths(s);
    let rows = s.product(&["batch", "seq"]);
    let rank = s.dim("rank") as f64;
    let u_copy = pick(pass, rows * 2.0 * rank, 0.0);
    rows * (q + 2.0 * kv + 2.0 * rank) + rows * (q + 2.0 * kv) + rank * (q + kv) + u_copy
}

/// Each q and v element takes a rank-long sum (its LoRA up-projection
/// forward, duq and duv backward).
pub(super) fn rope_qkv_work(s: &Shape, pass: Pass) -> f64 {
    let (q, kv) = qkv_widths(s);
    rope_qkv_elements(s, pass) + s.product(&["batch", "seq", "rank"]) * (q + kv)
}

// ---- gradient_check's inputs -----------------------------------------------------

pub(super) fn one_input(s: &Shape) -> Vec<f64> {
    vec![all(s)]
}

pub(super) fn two_inputs(s: &Shape) -> Vec<f64> {
    let n = all(s);
    vec![n, n]
}

pub(super) fn embedding_inputs(s: &Shape) -> Vec<f64> {
    vec![s.product(&["vocab", "hidden"])]
}

pub(super) fn rmsnorm_inputs(s: &Shape) -> Vec<f64> {
    vec![s.product(&["rows", "hidden"]), s.product(&["hidden"])]
}

pub(super) fn attention_inputs(s: &Shape) -> Vec<f64> {
    let kv = s.product(&["batch", "seq", "kv_heads", "head_dim"]);
    vec![s.product(&["batch", "seq", "heads", "head_dim"]), kv, kv]
}

pub(super) fn gemm_inputs(s: &Shape) -> Vec<f64> {
    vec![s.product(&["m", "k"]), s.product(&["k", "n"])]
}

pub(super) fn rope_qkv_inputs(s: &Shape) -> Vec<f64> {
    let width = s.product(&["heads", "head_dim"])
        + 2.0 * s.product(&["kv_heads", "head_dim"])
        + 2.0 * s.product(&["rank"]);
    vec![s.product(&["batch", "seq"]) * width]
}

// ---- bandwidth bytes -------------------------------------------------------------

/// Bytes of one f32 (and of one u32 token or target).
const F: usize = 4;

fn rows_cols(s: &Shape) -> usize {
    s.dim("rows") * s.dim("cols")
}

/// `f` forward, `b` backward, in bytes.
fn pick_bytes(pass: Pass, f: usize, b: usize) -> usize {
    if pass == Pass::Forward {
        f
    } else {
        b
    }
}

pub(super) fn rmsnorm_bytes(s: &Shape, pass: Pass) -> usize {
    let (r, h) = (s.dim("rows"), s.dim("hidden"));
    pick_bytes(pass, F * (2 * r * h + h), F * (3 * r * h + 2 * h))
}

pub(super) fn rmsnorm_residual_bytes(s: &Shape, _: Pass) -> usize {
    let (r, h) = (s.dim("rows"), s.dim("hidden"));
    F * (4 * r * h + h)
}

pub(super) fn rope_bytes(s: &Shape, _: Pass) -> usize {
    let n = s.dim("batch") * s.dim("seq") * s.dim("heads") * s.dim("head_dim");
    F * 2 * n
}

pub(super) fn silu_bytes(s: &Shape, pass: Pass) -> usize {
    let n = rows_cols(s);
    F * pick_bytes(pass, 2 * n, 3 * n)
}

pub(super) fn swiglu_bytes(s: &Shape, pass: Pass) -> usize {
    let n = rows_cols(s);
    F * pick_bytes(pass, 3 * n, 5 * n)
}

pub(super) fn residual_add_bytes(s: &Shape, _: Pass) -> usize {
    F * 3 * s.dim("rows") * s.dim("cols")
}

pub(super) fn scale_bytes(s: &Shape, _: Pass) -> usize {
    F * 2 * s.dim("rows") * s.dim("cols")
}

pub(super) fn cross_entropy_bytes(s: &Shape, pass: Pass) -> usize {
    let (r, v) = (s.dim("rows"), s.dim("vocab"));
    pick_bytes(pass, F * (r * v + 4 * r + 1), F * (2 * r * v + 3 * r))
}

pub(super) fn squared_sum_bytes(s: &Shape, _: Pass) -> usize {
    F * s.dim("n") + 8
}

pub(super) fn clip_apply_bytes(s: &Shape, _: Pass) -> usize {
    F * (2 * s.dim("n") + 1)
}

pub(super) fn adamw_bytes(s: &Shape, _: Pass) -> usize {
    F * 7 * s.dim("n")
}

pub(super) fn embedding_bytes(s: &Shape, _: Pass) -> usize {
    let (t, h) = (s.dim("tokens"), s.dim("hidden"));
    F * (t + 2 * t * h)
}

pub(super) fn nf4_dequantize_bytes(s: &Shape, _: Pass) -> usize {
    let n = rows_cols(s);
    n / 2 + F * n / 64 + F * n
}

/// The largest tensor of most kernels: all the dims.
pub(super) fn all_dims(s: &Shape) -> f64 {
    all(s)
}

/// The embedding's largest tensor: its table or the rows it gathers.
pub(super) fn embedding_largest(s: &Shape) -> f64 {
    s.product(&["vocab", "hidden"])
        .max(s.product(&["tokens", "hidden"]))
}

/// Kernels that hold nothing besides their buffer sets.
pub(super) fn nothing_resident(_: &Shape) -> f64 {
    0.0
}

/// The embedding's table, `4 V H`, held once.
pub(super) fn embedding_table_bytes(s: &Shape) -> f64 {
    4.0 * s.product(&["vocab", "hidden"])
}
