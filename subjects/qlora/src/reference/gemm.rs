//! Reference matrix products.
//!
//! `matmul` is the plain `C = A B`; `linear` is the PyTorch-layout projection
//! `y = x W^T` with `W` stored `[out, in]`, which is how every weight of the
//! model is stored.

use super::elementwise::expect_len;
use crate::error::Result;

/// `C[m, n] = A[m, k] B[k, n]`, summed in f64.
pub fn matmul(a: &[f64], b: &[f64], m: usize, n: usize, k: usize) -> Result<Vec<f64>> {
    expect_len("gemm", "a", a.len(), &[m, k])?;
    expect_len("gemm", "b", b.len(), &[k, n])?;
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for p in 0..k {
            let a_ip = a[i * k + p];
            for j in 0..n {
                c[i * n + j] += a_ip * b[p * n + j];
            }
        }
    }
    Ok(c)
}

/// Gradients of `C = A B`: `dA = dC B^T` (`[m, k]`) and `dB = A^T dC` (`[k, n]`).
pub fn backward(
    a: &[f64],
    b: &[f64],
    dc: &[f64],
    m: usize,
    n: usize,
    k: usize,
) -> Result<(Vec<f64>, Vec<f64>)> {
    expect_len("gemm", "a", a.len(), &[m, k])?;
    expect_len("gemm", "b", b.len(), &[k, n])?;
    expect_len("gemm", "dc", dc.len(), &[m, n])?;
    let mut da = vec![0.0; m * k];
    let mut db = vec![0.0; k * n];
    for i in 0..m {
        for p in 0..k {
            let mut acc = 0.0;
            for j in 0..n {
                acc += dc[i * n + j] * b[p * n + j];
            }
            da[i * k + p] = acc;
        }
    }
    for i in 0..m {
        for p in 0..k {
            let a_ip = a[i * k + p];
            for j in 0..n {
                db[p * n + j] += a_ip * dc[i * n + j];
            }
        }
    }
    Ok((da, db))
}

/// `y[rows, out] = x[rows, in] W^T`, with `W` stored `[out, in]`:
/// `y_ro = sum_i x_ri W_oi`.
pub fn linear(
    x: &[f64],
    w: &[f64],
    rows: usize,
    in_dim: usize,
    out_dim: usize,
) -> Result<Vec<f64>> {
    expect_len("linear", "x", x.len(), &[rows, in_dim])?;
    expect_len("linear", "w", w.len(), &[out_dim, in_dim])?;
    let mut y = vec![0.0; rows * out_dim];
    for r in 0..rows {
        let xr = &x[r * in_dim..(r + 1) * in_dim];
        for o in 0..out_dim {
            let wo = &w[o * in_dim..(o + 1) * in_dim];
            y[r * out_dim + o] = dot(xr, wo);
        }
    }
    Ok(y)
}

/// Gradients of `y = x W^T`: `dx = dy W` (`[rows, in]`) and `dW = dy^T x` (`[out, in]`).
pub fn linear_backward(
    x: &[f64],
    w: &[f64],
    dy: &[f64],
    rows: usize,
    in_dim: usize,
    out_dim: usize,
) -> Result<(Vec<f64>, Vec<f64>)> {
    expect_len("linear", "x", x.len(), &[rows, in_dim])?;
    expect_len("linear", "w", w.len(), &[out_dim, in_dim])?;
    expect_len("linear", "dy", dy.len(), &[rows, out_dim])?;
    let mut dx = vec![0.0; rows * in_dim];
    let mut dw = vec![0.0; out_dim * in_dim];
    for r in 0..rows {
        for o in 0..out_dim {
            let g = dy[r * out_dim + o];
            for i in 0..in_dim {
                dx[r * in_dim + i] += g * w[o * in_dim + i];
                dw[o * in_dim + i] += g * x[r * in_dim + i];
            }
        }
    }
    Ok((dx, dw))
}

/// `sum_i a_i b_i` in f64.
pub fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_small_case() {
        // [1 2; 3 4] [5 6; 7 8] = [19 22; 43 50]
        let c = matmul(&[1.0, 2.0, 3.0, 4.0], &[5.0, 6.0, 7.0, 8.0], 2, 2, 2).unwrap();
        assert_eq!(c, vec![19.0, 22.0, 43.0, 50.0]);
        assert!(matmul(&[1.0; 3], &[1.0; 4], 2, 2, 2).is_err());
    }

    #[test]
    fn linear_is_matmul_with_transposed_weight() {
        let x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]; // [2, 3]
        let w = [1.0, 0.0, -1.0, 2.0, 1.0, 0.0]; // [2 out, 3 in]
        let y = linear(&x, &w, 2, 3, 2).unwrap();
        assert_eq!(y, vec![-2.0, 4.0, -2.0, 13.0]);
        let (dx, dw) = linear_backward(&x, &w, &[1.0, 0.0, 0.0, 1.0], 2, 3, 2).unwrap();
        assert_eq!(dx, vec![1.0, 0.0, -1.0, 2.0, 1.0, 0.0]);
        assert_eq!(dw, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    }

    #[test]
    fn backward_small_case() {
        let (da, db) = backward(
            &[1.0, 2.0, 3.0, 4.0],
            &[5.0, 6.0, 7.0, 8.0],
            &[1.0, 0.0, 0.0, 1.0],
            2,
            2,
            2,
        )
        .unwrap();
        // dA = dC B^T = B^T, dB = A^T dC = A^T
        assert_eq!(da, vec![5.0, 7.0, 6.0, 8.0]);
        assert_eq!(db, vec![1.0, 3.0, 2.0, 4.0]);
    }
}
