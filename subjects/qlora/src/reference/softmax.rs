//! Reference causal softmax.
//!
//! `x` is `[rows, seq]`; row `r` belongs to query position `q = r % seq` and sees
//! columns `j <= q`:
//! `y_rj = exp(x_rj - m_r) / sum_{k<=q} exp(x_rk - m_r)` with `m_r = max_{k<=q} x_rk`,
//! and `y_rj = 0` exactly for the masked columns `j > q`.

use super::elementwise::expect_len;
use crate::error::Result;

/// Number of visible columns of row `r`: `r % seq + 1`.
pub fn visible(r: usize, seq: usize) -> usize {
    r % seq + 1
}

/// Causal softmax of every row, max-subtracted so large logits cannot overflow.
pub fn forward(x: &[f64], rows: usize, seq: usize) -> Result<Vec<f64>> {
    forward_shifted(x, rows, seq, true)
}

/// [`forward`], with the row maximum subtracted before `exp` only when
/// `subtract_max` (`false` is the overflow fault a mutant plants; subtracting
/// 0 instead leaves every value bit for bit what a plain `exp` gives).
pub(crate) fn forward_shifted(
    x: &[f64],
    rows: usize,
    seq: usize,
    subtract_max: bool,
) -> Result<Vec<f64>> {
    expect_len("softmax", "x", x.len(), &[rows, seq])?;
    let mut y = vec![0.0; rows * seq];
    for r in 0..rows {
        let n = visible(r, seq);
        let xr = &x[r * seq..r * seq + n];
        let m = if subtract_max {
            xr.iter().copied().fold(f64::NEG_INFINITY, f64::max)
        } else {
            0.0
        };
        let e: Vec<f64> = xr.iter().map(|v| (v - m).exp()).collect();
        let sum: f64 = e.iter().sum();
        for (j, ej) in e.iter().enumerate() {
            y[r * seq + j] = ej / sum;
        }
    }
    Ok(y)
}

/// Gradient of softmax from its output: `dx_j = y_j (dy_j - <y, dy>)` over the
/// visible columns; masked columns get 0 (their `y` is 0).
pub fn backward(y: &[f64], dy: &[f64], rows: usize, seq: usize) -> Result<Vec<f64>> {
    expect_len("softmax", "y", y.len(), &[rows, seq])?;
    expect_len("softmax", "dy", dy.len(), &[rows, seq])?;
    let mut dx = vec![0.0; rows * seq];
    for r in 0..rows {
        let n = visible(r, seq);
        let yr = &y[r * seq..r * seq + n];
        let dyr = &dy[r * seq..r * seq + n];
        let y_dot_dy: f64 = yr.iter().zip(dyr).map(|(a, b)| a * b).sum();
        for j in 0..n {
            dx[r * seq + j] = yr[j] * (dyr[j] - y_dot_dy);
        }
    }
    Ok(dx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causal_rows() {
        // seq 2: row 0 sees one column, row 1 two equal logits.
        let y = forward(&[5.0, 9.0, 1e4, 1e4], 2, 2).unwrap();
        assert_eq!(y, vec![1.0, 0.0, 0.5, 0.5]);
        let dx = backward(&y, &[1.0, 1.0, 1.0, -1.0], 2, 2).unwrap();
        assert_eq!(dx, vec![0.0, 0.0, 0.5, -0.5]);
    }
}
