//! Reference SiLU and SwiGLU.
//!
//! `silu(x) = x sigmoid(x)`, `silu'(x) = s (1 + x (1 - s))` with `s = sigmoid(x)`;
//! `swiglu(gate, up) = silu(gate) * up`.

use super::elementwise::expect_len;
use crate::error::Result;

/// `1 / (1 + exp(-x))`, evaluated so that neither branch overflows.
pub fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// `silu(x) = x sigmoid(x)`.
pub fn silu(x: f64) -> f64 {
    x * sigmoid(x)
}

/// `silu'(x) = s (1 + x (1 - s))`, `s = sigmoid(x)`.
pub fn silu_grad(x: f64) -> f64 {
    let s = sigmoid(x);
    s * (1.0 + x * (1.0 - s))
}

/// Elementwise `silu`.
pub fn silu_forward(x: &[f64]) -> Vec<f64> {
    x.iter().map(|&v| silu(v)).collect()
}

/// `dx = silu'(x) dy`.
pub fn silu_backward(x: &[f64], dy: &[f64]) -> Result<Vec<f64>> {
    expect_len("silu", "dy", dy.len(), &[x.len()])?;
    Ok(x.iter().zip(dy).map(|(&v, g)| silu_grad(v) * g).collect())
}

/// `y = silu(gate) * up`, elementwise.
pub fn swiglu_forward(gate: &[f64], up: &[f64]) -> Result<Vec<f64>> {
    expect_len("swiglu", "up", up.len(), &[gate.len()])?;
    Ok(gate.iter().zip(up).map(|(&g, u)| silu(g) * u).collect())
}

/// `dgate = dy * up * silu'(gate)`, `dup = dy * silu(gate)`.
pub fn swiglu_backward(gate: &[f64], up: &[f64], dy: &[f64]) -> Result<(Vec<f64>, Vec<f64>)> {
    expect_len("swiglu", "up", up.len(), &[gate.len()])?;
    expect_len("swiglu", "dy", dy.len(), &[gate.len()])?;
    let dgate = (0..gate.len())
        .map(|i| dy[i] * up[i] * silu_grad(gate[i]))
        .collect();
    let dup = (0..gate.len()).map(|i| dy[i] * silu(gate[i])).collect();
    Ok((dgate, dup))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_values() {
        assert_eq!(silu(0.0), 0.0);
        assert!((silu(1.0) - 1.0 / (1.0 + (-1f64).exp())).abs() < 1e-15);
        assert_eq!(silu_grad(0.0), 0.5);
        assert!(silu(-800.0).abs() < 1e-300 && silu(800.0) == 800.0);
        assert_eq!(
            swiglu_forward(&[0.0, 800.0], &[5.0, 2.0]).unwrap(),
            vec![0.0, 1600.0]
        );
        let (dg, du) = swiglu_backward(&[0.0], &[2.0], &[3.0]).unwrap();
        assert_eq!((dg, du), (vec![3.0], vec![0.0]));
    }
}
