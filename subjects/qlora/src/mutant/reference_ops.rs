//! Faulty variants of the reference ops, selected by [`super::Mutant`].
//!
//! Each function is the clean reference with exactly one named mistake, so a
//! check that runs it must falsify. The clean ops in `crate::reference` never
//! look at a mutant; the checks pick these variants instead.

use crate::error::Result;
use crate::reference::attention::{self, AttnShape};
use crate::reference::elementwise::expect_len;
use crate::reference::{activation, cross_entropy, gemm, rmsnorm, rope, softmax};

/// [`super::Mutant::SoftmaxWithoutMaxSubtraction`]: `exp(x_j) / sum_k exp(x_k)`
/// with no max shift, so logits above ~709 overflow to `inf` (and `inf / inf` is NaN).
pub fn softmax_without_max_subtraction(x: &[f64], rows: usize, seq: usize) -> Result<Vec<f64>> {
    softmax::forward_shifted(x, rows, seq, false)
}

/// [`super::Mutant::SoftmaxBackwardMissingDot`]: `dx = y * dy`, dropping `- y <y, dy>`.
pub fn softmax_backward_missing_dot(
    y: &[f64],
    dy: &[f64],
    rows: usize,
    seq: usize,
) -> Result<Vec<f64>> {
    expect_len("softmax", "y", y.len(), &[rows, seq])?;
    expect_len("softmax", "dy", dy.len(), &[rows, seq])?;
    Ok(y.iter().zip(dy).map(|(a, b)| a * b).collect())
}

/// [`super::Mutant::RmsnormWithoutNormalisation`]: `y = x * gamma`, never divided by the RMS.
pub fn rmsnorm_without_normalisation(
    x: &[f64],
    gamma: &[f64],
    rows: usize,
    hidden: usize,
) -> Result<Vec<f64>> {
    expect_len("rmsnorm", "x", x.len(), &[rows, hidden])?;
    expect_len("rmsnorm", "gamma", gamma.len(), &[hidden])?;
    Ok(x.iter()
        .enumerate()
        .map(|(i, v)| v * gamma[i % hidden])
        .collect())
}

/// [`super::Mutant::RmsnormBackwardMissingProjection`]: `dx = r * gamma * dy`,
/// without the `- x r^3 <gamma dy, x> / n` term; `dgamma` is left correct.
pub fn rmsnorm_backward_missing_projection(
    x: &[f64],
    gamma: &[f64],
    dy: &[f64],
    rows: usize,
    hidden: usize,
    eps: f64,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let (_, dgamma) = rmsnorm::backward(x, gamma, dy, rows, hidden, eps)?;
    let mut dx = vec![0.0; rows * hidden];
    for r in 0..rows {
        let inv = rmsnorm::inv_rms(&x[r * hidden..(r + 1) * hidden], eps);
        for i in 0..hidden {
            dx[r * hidden + i] = inv * gamma[i] * dy[r * hidden + i];
        }
    }
    Ok((dx, dgamma))
}

/// [`super::Mutant::RopeUnbalancedRotation`]: `+sin` in both halves,
/// `y_i = x_i cos + x_{i+half} sin`, `y_{i+half} = x_i sin + x_{i+half} cos`,
/// whose determinant `cos^2 - sin^2` is not 1, so norms change.
pub fn rope_unbalanced_rotation(
    x: &[f64],
    batch: usize,
    seq: usize,
    heads: usize,
    head_dim: usize,
    theta: f64,
) -> Result<Vec<f64>> {
    let unbalanced: rope::PairMap = |x1, x2, sin, cos| (x1 * cos + x2 * sin, x1 * sin + x2 * cos);
    rope::rotate_with(x, (batch, seq, heads, head_dim), theta, 1.0, unbalanced)
}

/// [`super::Mutant::RopeInverseSameDirection`]: the "inverse" rotates by `+angle`
/// again, so a round trip rotates by `2 angle`.
pub fn rope_inverse_same_direction(
    y: &[f64],
    batch: usize,
    seq: usize,
    heads: usize,
    head_dim: usize,
    theta: f64,
) -> Result<Vec<f64>> {
    rope::forward(y, batch, seq, heads, head_dim, theta)
}

/// [`super::Mutant::RopeBackwardForwardRotation`]: the gradient is rotated by
/// `+angle` (the forward rotation) instead of its transpose `-angle`.
pub fn rope_backward_forward_rotation(
    dy: &[f64],
    batch: usize,
    seq: usize,
    heads: usize,
    head_dim: usize,
    theta: f64,
) -> Result<Vec<f64>> {
    rope::forward(dy, batch, seq, heads, head_dim, theta)
}

/// [`super::Mutant::RopeBackwardForwardRotation`] in the fused q/k/v
/// epilogue: dq and dk rotated by `+angle`, and duq taken from that wrong dq.
pub fn rope_qkv_backward_forward_rotation(
    dout: &[f64],
    bq: &[f64],
    bv: &[f64],
    d: &rope::QkvDims,
    theta: f64,
) -> Result<Vec<f64>> {
    rope::qkv_backward_with(dout, bq, bv, d, theta, rope::forward)
}

/// [`super::Mutant::AttentionBackwardUnscaled`]: `dq` and `dk` without the
/// `1/sqrt(head_dim)` factor of the scores. The clean `dq`, `dk` are linear in
/// that factor, so dividing them by it is exactly the forgotten scale.
pub fn attention_backward_unscaled(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    probs: &[f64],
    dout: &[f64],
    sh: &AttnShape,
) -> Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
    let (dq, dk, dv) = attention::backward(q, k, v, probs, dout, sh)?;
    let s = sh.scale();
    Ok((
        dq.iter().map(|g| g / s).collect(),
        dk.iter().map(|g| g / s).collect(),
        dv,
    ))
}

/// [`super::Mutant::SwigluBackwardMissingSiluDerivative`] for SiLU: `dx = dy`
/// (SiLU's derivative treated as 1).
pub fn silu_backward_missing_derivative(x: &[f64], dy: &[f64]) -> Result<Vec<f64>> {
    expect_len("silu", "dy", dy.len(), &[x.len()])?;
    Ok(dy.to_vec())
}

/// [`super::Mutant::SwigluBackwardMissingSiluDerivative`]: `dgate = dy * up`,
/// dropping the factor `silu'(gate)`; `dup` is left correct.
pub fn swiglu_backward_missing_silu_derivative(
    gate: &[f64],
    up: &[f64],
    dy: &[f64],
) -> Result<(Vec<f64>, Vec<f64>)> {
    let (_, dup) = activation::swiglu_backward(gate, up, dy)?;
    let dgate = up.iter().zip(dy).map(|(u, g)| u * g).collect();
    Ok((dgate, dup))
}

/// [`super::Mutant::GemmBackwardUntransposed`]: `dA = dC B` with `B`'s `[k, n]`
/// buffer read as if it were `B^T` (`[n, k]`); `dB` is left correct.
pub fn gemm_backward_untransposed(
    a: &[f64],
    b: &[f64],
    dc: &[f64],
    m: usize,
    n: usize,
    k: usize,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let (_, db) = gemm::backward(a, b, dc, m, n, k)?;
    let mut da = vec![0.0; m * k];
    for i in 0..m {
        for p in 0..k {
            da[i * k + p] = (0..n).map(|j| dc[i * n + j] * b[j * k + p]).sum();
        }
    }
    Ok((da, db))
}

/// [`super::Mutant::EmbeddingBackwardOverwrites`]: `dtable[v] = dy[t]` for the
/// last `t` with `tokens[t] == v`, instead of the sum over all of them.
pub fn embedding_backward_overwrites(
    dy: &[f64],
    vocab: usize,
    hidden: usize,
    tokens: &[u32],
) -> Result<Vec<f64>> {
    // The clean backward validates the arguments; its rows are then overwritten.
    let mut dtable = crate::reference::embedding::backward(dy, vocab, hidden, tokens)?;
    for (t, &tok) in tokens.iter().enumerate() {
        let row = tok as usize * hidden;
        dtable[row..row + hidden].copy_from_slice(&dy[t * hidden..(t + 1) * hidden]);
    }
    Ok(dtable)
}

/// [`super::Mutant::ScaleBackwardIgnoresScale`]: `dx = dy` instead of `s dy`.
pub fn scale_backward_ignores_scale(dy: &[f64], _s: f64) -> Vec<f64> {
    dy.to_vec()
}

/// [`super::Mutant::ResidualBackwardDropsSkip`]: the skip input `a` of `a + b`
/// gets no gradient.
pub fn residual_backward_drops_skip(dy: &[f64]) -> (Vec<f64>, Vec<f64>) {
    (vec![0.0; dy.len()], dy.to_vec())
}

/// [`super::Mutant::CrossEntropyWithoutLogSumExp`]: row loss `-x_r[t_r]`.
pub fn cross_entropy_row_losses_without_lse(
    logits: &[f64],
    rows: usize,
    vocab: usize,
    targets: &[u32],
) -> Result<Vec<f64>> {
    // The clean losses validate the arguments; the faulty values replace them.
    let clean = cross_entropy::row_losses(logits, rows, vocab, targets)?;
    Ok((0..clean.len())
        .map(|r| -logits[r * vocab + targets[r] as usize])
        .collect())
}

/// [`super::Mutant::CrossEntropyWithoutLogSumExp`]: mean of `-x_r[t_r]`.
pub fn cross_entropy_without_lse(
    logits: &[f64],
    rows: usize,
    vocab: usize,
    targets: &[u32],
) -> Result<f64> {
    let losses = cross_entropy_row_losses_without_lse(logits, rows, vocab, targets)?;
    Ok(losses.iter().sum::<f64>() / rows.max(1) as f64)
}

/// [`super::Mutant::CrossEntropyGradMissingSoftmax`]: gradient `-onehot / rows`.
pub fn cross_entropy_grad_missing_softmax(
    logits: &[f64],
    rows: usize,
    vocab: usize,
    targets: &[u32],
) -> Result<Vec<f64>> {
    let mut g = cross_entropy::backward(logits, rows, vocab, targets)?;
    let inv_rows = 1.0 / rows.max(1) as f64;
    for r in 0..rows {
        for j in 0..vocab {
            let onehot = if j == targets[r] as usize { 1.0 } else { 0.0 };
            g[r * vocab + j] = -onehot * inv_rows;
        }
    }
    Ok(g)
}
