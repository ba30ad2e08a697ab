//! Reference rotary position embedding (RoPE), NeoX "halves" layout.
//!
//! `x` is `[batch, seq, heads, head_dim]`. With `half = head_dim / 2`, each pair
//! `(x_i, x_{i+half})` of a head vector at sequence position `pos` is rotated by
//! `angle = pos * theta^(-2i / head_dim)`:
//! `y_i = x_i cos - x_{i+half} sin`, `y_{i+half} = x_i sin + x_{i+half} cos`.

use super::elementwise::expect_len;
use crate::error::{Error, Result};

/// Rotation angle of pair `i` at position `pos`: `pos * theta^(-2i / head_dim)`.
fn angle(pos: usize, i: usize, head_dim: usize, theta: f64) -> f64 {
    pos as f64 * theta.powf(-2.0 * i as f64 / head_dim as f64)
}

/// Refuses an odd head_dim: RoPE rotates pairs `(i, i + head_dim / 2)`.
pub fn check_head_dim(head_dim: usize) -> Result<()> {
    if !head_dim.is_multiple_of(2) {
        return Err(Error::InvalidArgument {
            op: "rope",
            message: format!("head_dim must be even, got {head_dim}"),
        });
    }
    Ok(())
}

fn check(len: usize, batch: usize, seq: usize, heads: usize, head_dim: usize) -> Result<()> {
    check_head_dim(head_dim)?;
    expect_len("rope", "x", len, &[batch, seq, heads, head_dim])
}

/// One pair's rotation: `(x_i, x_{i+half}, sin, cos) -> (y_i, y_{i+half})`.
pub(crate) type PairMap = fn(f64, f64, f64, f64) -> (f64, f64);

/// The rotation `R`: `y_i = x_i cos - x_{i+half} sin`, `y_{i+half} = x_i sin + x_{i+half} cos`.
fn rotation(x1: f64, x2: f64, sin: f64, cos: f64) -> (f64, f64) {
    (x1 * cos - x2 * sin, x1 * sin + x2 * cos)
}

/// Rotates every pair by `sign * angle`; `sign = 1` is RoPE, `sign = -1` its inverse.
fn rotate(
    x: &[f64],
    batch: usize,
    seq: usize,
    heads: usize,
    head_dim: usize,
    theta: f64,
    sign: f64,
) -> Result<Vec<f64>> {
    rotate_with(x, (batch, seq, heads, head_dim), theta, sign, rotation)
}

/// Applies `pair` to every pair at `sign * angle` (mutants pass a wrong map).
pub(crate) fn rotate_with(
    x: &[f64],
    (batch, seq, heads, head_dim): (usize, usize, usize, usize),
    theta: f64,
    sign: f64,
    pair: PairMap,
) -> Result<Vec<f64>> {
    check(x.len(), batch, seq, heads, head_dim)?;
    let half = head_dim / 2;
    let mut y = vec![0.0; x.len()];
    for b in 0..batch {
        for pos in 0..seq {
            for h in 0..heads {
                let base = ((b * seq + pos) * heads + h) * head_dim;
                for i in 0..half {
                    let (sin, cos) = (sign * angle(pos, i, head_dim, theta)).sin_cos();
                    (y[base + i], y[base + i + half]) =
                        pair(x[base + i], x[base + i + half], sin, cos);
                }
            }
        }
    }
    Ok(y)
}

/// RoPE: rotate each pair by `+angle`.
pub fn forward(
    x: &[f64],
    batch: usize,
    seq: usize,
    heads: usize,
    head_dim: usize,
    theta: f64,
) -> Result<Vec<f64>> {
    rotate(x, batch, seq, heads, head_dim, theta, 1.0)
}

/// Gradient of RoPE: the transpose of a rotation is its inverse, so
/// `dx = R(-angle) dy`.
pub fn backward(
    dy: &[f64],
    batch: usize,
    seq: usize,
    heads: usize,
    head_dim: usize,
    theta: f64,
) -> Result<Vec<f64>> {
    rotate(dy, batch, seq, heads, head_dim, theta, -1.0)
}

/// The inverse of RoPE, `R(-angle) y` (the same map as [`backward`]).
pub fn inverse(
    y: &[f64],
    batch: usize,
    seq: usize,
    heads: usize,
    head_dim: usize,
    theta: f64,
) -> Result<Vec<f64>> {
    backward(y, batch, seq, heads, head_dim, theta)
}

/// The shape of the training step's fused q/k/v epilogue (see
/// [`qkv_forward`]): `batch * seq` rows of `y = [q | k | v | uq | uv]`, q of
/// `heads * head_dim` columns, k and v of `kv_heads * head_dim`, uq and uv of
/// `rank`; `scale` is the LoRA scale `s`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QkvDims {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rank: usize,
    pub scale: f64,
}

impl QkvDims {
    fn rows(&self) -> usize {
        self.batch * self.seq
    }
    fn q_dim(&self) -> usize {
        self.heads * self.head_dim
    }
    fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }
    /// Columns of `y`: `q_dim + 2 kv_dim + 2 rank`.
    pub fn width(&self) -> usize {
        self.q_dim() + 2 * self.kv_dim() + 2 * self.rank
    }
    fn check(&self, y: usize, bq: usize, bv: usize) -> Result<()> {
        expect_len("rope_qkv", "y", y, &[self.rows(), self.width()])?;
        expect_len("rope_qkv", "bq", bq, &[self.q_dim(), self.rank])?;
        expect_len("rope_qkv", "bv", bv, &[self.kv_dim(), self.rank])
    }
}

/// A block of columns of `y` (from `col`, `cols` wide), packed, with the
/// same columns of `bias` added, plus with `lora = (u_col, b)` the LoRA
/// up-projection `s u b^T` of the `u` block from `u_col` through `b`
/// (`[cols, rank]`).
fn columns(
    (y, bias): (&[f64], &[f64]),
    d: &QkvDims,
    (col, cols): (usize, usize),
    lora: Option<(usize, &[f64])>,
) -> Vec<f64> {
    let (w, r) = (d.width(), d.rank);
    let mut out = vec![0.0; d.rows() * cols];
    for row in 0..d.rows() {
        let y_row = &y[row * w..(row + 1) * w];
        for c in 0..cols {
            let up: f64 = lora.map_or(0.0, |(u_col, b)| {
                let u = &y_row[u_col..u_col + r];
                u.iter()
                    .zip(&b[c * r..(c + 1) * r])
                    .map(|(a, b)| a * b)
                    .sum()
            });
            out[row * cols + c] = (y_row[col + c] + bias[col + c]) + d.scale * up;
        }
    }
    out
}

/// The fused q/k/v epilogue: from `y = n1 [Wq; Wk; Wv; Aq; Av]^T` and the
/// frozen bias `b = [b_q | b_k | b_v]` returns `[rope(q) | rope(k) | v]`
/// (each packed `[batch, seq, heads, head_dim]`), with
/// `q = y_q + b_q + s uq Bq^T`, `k = y_k + b_k`, `v = y_v + b_v + s uv Bv^T`.
pub fn qkv_forward(
    (y, bias): (&[f64], &[f64]),
    bq: &[f64],
    bv: &[f64],
    d: &QkvDims,
    theta: f64,
) -> Result<Vec<f64>> {
    d.check(y.len(), bq.len(), bv.len())?;
    let (qd, kvd) = (d.q_dim(), d.kv_dim());
    expect_len("rope_qkv", "bias", bias.len(), &[qd + 2 * kvd])?;
    let u_col = qd + 2 * kvd;
    let yb = (y, bias);
    let q = columns(yb, d, (0, qd), Some((u_col, bq)));
    let k = columns(yb, d, (qd, kvd), None);
    let v = columns(yb, d, (qd + kvd, kvd), Some((u_col + d.rank, bv)));
    let mut out = forward(&q, d.batch, d.seq, d.heads, d.head_dim, theta)?;
    out.extend(forward(&k, d.batch, d.seq, d.kv_heads, d.head_dim, theta)?);
    out.extend(v);
    Ok(out)
}

/// A RoPE direction of one packed `[batch, seq, heads, head_dim]` tensor:
/// `(x, batch, seq, heads, head_dim, theta)`.
pub type Rotate = fn(&[f64], usize, usize, usize, usize, f64) -> Result<Vec<f64>>;

/// The gradient of [`qkv_forward`] with respect to `y`, from the gradient
/// `[dqr | dkr | dv]` of its output: `dy = [dq | dk | dv | duq | duv]` with
/// `dq = rope^T(dqr)`, `dk = rope^T(dkr)`, `duq = s dq Bq`, `duv = s dv Bv`.
pub fn qkv_backward(
    dout: &[f64],
    bq: &[f64],
    bv: &[f64],
    d: &QkvDims,
    theta: f64,
) -> Result<Vec<f64>> {
    qkv_backward_with(dout, bq, bv, d, theta, backward)
}

/// [`qkv_backward`] with `rotate_back` as the transposed rotation (mutants
/// pass a wrong one).
pub(crate) fn qkv_backward_with(
    dout: &[f64],
    bq: &[f64],
    bv: &[f64],
    d: &QkvDims,
    theta: f64,
    rotate_back: Rotate,
) -> Result<Vec<f64>> {
    let (rows, qd, kvd, r) = (d.rows(), d.q_dim(), d.kv_dim(), d.rank);
    expect_len("rope_qkv", "dout", dout.len(), &[rows, qd + 2 * kvd])?;
    d.check(rows * d.width(), bq.len(), bv.len())?;
    let (dqr, rest) = dout.split_at(rows * qd);
    let (dkr, dv) = rest.split_at(rows * kvd);
    let dq = rotate_back(dqr, d.batch, d.seq, d.heads, d.head_dim, theta)?;
    let dk = rotate_back(dkr, d.batch, d.seq, d.kv_heads, d.head_dim, theta)?;
    let w = d.width();
    let mut dy = vec![0.0; rows * w];
    for row in 0..rows {
        let out = &mut dy[row * w..(row + 1) * w];
        out[..qd].copy_from_slice(&dq[row * qd..(row + 1) * qd]);
        out[qd..qd + kvd].copy_from_slice(&dk[row * kvd..(row + 1) * kvd]);
        out[qd + kvd..qd + 2 * kvd].copy_from_slice(&dv[row * kvd..(row + 1) * kvd]);
        for j in 0..r {
            let duq: f64 = (0..qd).map(|c| dq[row * qd + c] * bq[c * r + j]).sum();
            let duv: f64 = (0..kvd).map(|c| dv[row * kvd + c] * bv[c * r + j]).sum();
            out[qd + 2 * kvd + j] = d.scale * duq;
            out[qd + 2 * kvd + r + j] = d.scale * duv;
        }
    }
    Ok(dy)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` smooth, distinct test values `sin(f (i + 0.5))`.
    fn wave(n: usize, f: f64) -> Vec<f64> {
        (0..n).map(|i| (f * (i as f64 + 0.5)).sin()).collect()
    }

    #[test]
    fn position_one_rotates_first_pair_by_one_radian() {
        // seq 2, head_dim 2: position 0 is untouched, position 1 rotates by 1 rad.
        let x = [1.0, 0.0, 1.0, 0.0];
        let y = forward(&x, 1, 2, 1, 2, 10_000.0).unwrap();
        assert_eq!(&y[..2], &[1.0, 0.0]);
        assert!((y[2] - 1f64.cos()).abs() < 1e-15 && (y[3] - 1f64.sin()).abs() < 1e-15);
        let back = inverse(&y, 1, 2, 1, 2, 10_000.0).unwrap();
        assert!(back.iter().zip(&x).all(|(a, b)| (a - b).abs() < 1e-15));
        assert!(forward(&[0.0; 3], 1, 1, 1, 3, 1.0).is_err());
    }

    /// The epilogue is linear in `y`, so its backward is its adjoint:
    /// `<qkv_forward(y), g> = <y, qkv_backward(g)>` for any `y`, `g`.
    #[test]
    fn the_fused_epilogue_backward_is_its_adjoint() {
        let d = QkvDims {
            batch: 2,
            seq: 3,
            heads: 4,
            kv_heads: 2,
            head_dim: 6,
            rank: 2,
            scale: 1.5,
        };
        let (rows, qd, kvd) = (6, 24, 12);
        let y = wave(rows * d.width(), 0.37);
        let (bq, bv) = (wave(qd * 2, 0.91), wave(kvd * 2, 1.3));
        let g = wave(rows * (qd + 2 * kvd), 0.53);
        // Without a bias the epilogue is linear (a bias only shifts it).
        let zero_bias = vec![0.0; qd + 2 * kvd];
        let out = qkv_forward((&y, &zero_bias), &bq, &bv, &d, 1e4).unwrap();
        let dy = qkv_backward(&g, &bq, &bv, &d, 1e4).unwrap();
        let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
        let (lhs, rhs) = (dot(&out, &g), dot(&y, &dy));
        assert!(
            (lhs - rhs).abs() <= 1e-12 * lhs.abs().max(1.0),
            "{lhs} vs {rhs}"
        );
        assert!(qkv_forward((&y[1..], &zero_bias), &bq, &bv, &d, 1e4).is_err());
        assert!(qkv_forward((&y, &zero_bias[1..]), &bq, &bv, &d, 1e4).is_err());
    }

    /// The bias is added to q, k and v before the LoRA term and RoPE: the
    /// epilogue of `y` with bias `b` is that of `y + [b | 0]` (b added to
    /// every row's q, k, v columns) without one.
    #[test]
    fn the_bias_shifts_q_k_v_before_rope() {
        let d = QkvDims {
            batch: 1,
            seq: 3,
            heads: 2,
            kv_heads: 1,
            head_dim: 4,
            rank: 2,
            scale: 2.0,
        };
        let (qd, kvd, w) = (8, 4, d.width());
        let y = wave(3 * w, 0.37);
        let bias = wave(qd + 2 * kvd, 1.7);
        let (bq, bv) = (wave(qd * 2, 0.91), wave(kvd * 2, 1.3));
        let mut shifted = y.clone();
        for row in shifted.chunks_mut(w) {
            for (x, b) in row.iter_mut().zip(&bias) {
                *x += b;
            }
        }
        let with_bias = qkv_forward((&y, &bias), &bq, &bv, &d, 1e4).unwrap();
        let zero = vec![0.0; bias.len()];
        let without = qkv_forward((&shifted, &zero), &bq, &bv, &d, 1e4).unwrap();
        assert!(with_bias
            .iter()
            .zip(&without)
            .all(|(a, b)| (a - b).abs() < 1e-12));
        assert_ne!(
            with_bias,
            qkv_forward((&y, &zero), &bq, &bv, &d, 1e4).unwrap()
        );
    }
}
