//! Reference elementwise ops: the residual add and a constant scale, plus the
//! length check every reference op uses.

use crate::error::{Error, Result};

/// Checks that a buffer called `what` of op `op` holds `prod(dims)` elements.
pub(crate) fn expect_len(op: &'static str, what: &str, got: usize, dims: &[usize]) -> Result<()> {
    let expected: usize = dims.iter().product();
    if got == expected {
        Ok(())
    } else {
        let dims_text: Vec<String> = dims.iter().map(usize::to_string).collect();
        Err(Error::ShapeMismatch {
            op,
            expected: format!("{what}: [{}] = {expected} elements", dims_text.join(", ")),
            got: format!("{got} elements"),
        })
    }
}

/// `y = a + b` (the skip connection `a` plus the branch `b`).
pub fn residual_add(a: &[f64], b: &[f64]) -> Result<Vec<f64>> {
    expect_len("residual_add", "b", b.len(), &[a.len()])?;
    Ok(a.iter().zip(b).map(|(x, y)| x + y).collect())
}

/// Gradients of `y = a + b`: `da = dy`, `db = dy`.
pub fn residual_add_backward(dy: &[f64]) -> (Vec<f64>, Vec<f64>) {
    (dy.to_vec(), dy.to_vec())
}

/// `y = s x`.
pub fn scale(x: &[f64], s: f64) -> Vec<f64> {
    x.iter().map(|v| v * s).collect()
}

/// Gradient of `y = s x`: `dx = s dy`.
pub fn scale_backward(dy: &[f64], s: f64) -> Vec<f64> {
    scale(dy, s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_cases() {
        assert_eq!(
            residual_add(&[1.0, 2.0], &[3.0, -2.0]).unwrap(),
            vec![4.0, 0.0]
        );
        assert!(residual_add(&[1.0, 2.0], &[3.0]).is_err());
        assert_eq!(scale(&[1.0, -2.0], 0.5), vec![0.5, -1.0]);
        assert_eq!(scale_backward(&[2.0], 3.0), vec![6.0]);
        let (da, db) = residual_add_backward(&[1.0, 2.0]);
        assert_eq!((da, db), (vec![1.0, 2.0], vec![1.0, 2.0]));
    }
}
