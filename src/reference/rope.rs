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

fn check(len: usize, batch: usize, seq: usize, heads: usize, head_dim: usize) -> Result<()> {
    if !head_dim.is_multiple_of(2) {
        return Err(Error::InvalidArgument {
            op: "rope",
            message: format!("head_dim must be even, got {head_dim}"),
        });
    }
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
