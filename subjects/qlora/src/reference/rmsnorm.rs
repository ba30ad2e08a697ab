//! Reference RMSNorm over the last dimension.
//!
//! Per row: `r = 1 / sqrt(mean_i(x_i^2) + eps)`, `y_i = x_i r gamma_i`.

use super::elementwise::expect_len;
use crate::error::Result;

/// `1 / sqrt(mean(x^2) + eps)` of one row.
pub fn inv_rms(row: &[f64], eps: f64) -> f64 {
    let n = row.len().max(1) as f64;
    let mean_sq = row.iter().map(|v| v * v).sum::<f64>() / n;
    1.0 / (mean_sq + eps).sqrt()
}

/// `y = x / sqrt(mean(x^2) + eps) * gamma`, row by row; `x` is `[rows, hidden]`,
/// `gamma` is `[hidden]`.
pub fn forward(x: &[f64], gamma: &[f64], rows: usize, hidden: usize, eps: f64) -> Result<Vec<f64>> {
    expect_len("rmsnorm", "x", x.len(), &[rows, hidden])?;
    expect_len("rmsnorm", "gamma", gamma.len(), &[hidden])?;
    let mut y = vec![0.0; rows * hidden];
    for r in 0..rows {
        let xr = &x[r * hidden..(r + 1) * hidden];
        let inv = inv_rms(xr, eps);
        for i in 0..hidden {
            y[r * hidden + i] = xr[i] * inv * gamma[i];
        }
    }
    Ok(y)
}

/// Gradients of RMSNorm. With `u = dy * gamma` and `r` the row's inverse RMS:
/// `dx_i = r u_i - x_i r^3 <u, x> / n` (the second term is the projection
/// through the shared normaliser), and `dgamma_i = sum_rows dy_i x_i r`.
pub fn backward(
    x: &[f64],
    gamma: &[f64],
    dy: &[f64],
    rows: usize,
    hidden: usize,
    eps: f64,
) -> Result<(Vec<f64>, Vec<f64>)> {
    expect_len("rmsnorm", "x", x.len(), &[rows, hidden])?;
    expect_len("rmsnorm", "gamma", gamma.len(), &[hidden])?;
    expect_len("rmsnorm", "dy", dy.len(), &[rows, hidden])?;
    let n = hidden as f64;
    let mut dx = vec![0.0; rows * hidden];
    let mut dgamma = vec![0.0; hidden];
    for r in 0..rows {
        let xr = &x[r * hidden..(r + 1) * hidden];
        let dyr = &dy[r * hidden..(r + 1) * hidden];
        let inv = inv_rms(xr, eps);
        let u_dot_x: f64 = (0..hidden).map(|i| dyr[i] * gamma[i] * xr[i]).sum();
        for i in 0..hidden {
            dx[r * hidden + i] = inv * dyr[i] * gamma[i] - xr[i] * inv.powi(3) * u_dot_x / n;
            dgamma[i] += dyr[i] * xr[i] * inv;
        }
    }
    Ok((dx, dgamma))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_case() {
        // x = [3, 4]: mean(x^2) = 12.5, y = x / sqrt(12.5) * gamma
        let y = forward(&[3.0, 4.0], &[1.0, 2.0], 1, 2, 0.0).unwrap();
        let s = 12.5f64.sqrt();
        assert!((y[0] - 3.0 / s).abs() < 1e-15 && (y[1] - 8.0 / s).abs() < 1e-15);
        assert!(forward(&[1.0; 3], &[1.0; 2], 1, 2, 0.0).is_err());
    }

    #[test]
    fn dx_is_orthogonal_to_x_for_unit_gamma() {
        // With gamma = 1 and eps = 0, y is scale-invariant in x, so <dx, x> = 0.
        let x = [0.3, -1.2, 2.0];
        let (dx, _) = backward(&x, &[1.0; 3], &[0.5, 0.1, -0.7], 1, 3, 0.0).unwrap();
        let d: f64 = dx.iter().zip(&x).map(|(a, b)| a * b).sum();
        assert!(d.abs() < 1e-14, "{d}");
    }
}
