//! Reference cross-entropy over logits.
//!
//! Per row: `loss_r = lse(x_r) - x_r[t_r]` with the max-shifted
//! `lse(x) = m + ln sum_j exp(x_j - m)`, `m = max_j x_j`; the loss is the mean
//! over rows. Its logit gradient is `(softmax(x_r) - onehot(t_r)) / rows`.

use super::elementwise::expect_len;
use crate::error::{Error, Result};

fn check(logits: &[f64], rows: usize, vocab: usize, targets: &[u32]) -> Result<()> {
    expect_len("cross_entropy", "logits", logits.len(), &[rows, vocab])?;
    expect_len("cross_entropy", "targets", targets.len(), &[rows])?;
    match targets.iter().find(|&&t| t as usize >= vocab) {
        Some(t) => Err(Error::InvalidArgument {
            op: "cross_entropy",
            message: format!("target {t} is outside the vocabulary of {vocab}"),
        }),
        None => Ok(()),
    }
}

/// `(m, ln sum_j exp(x_j - m))` of one row, so `lse = m + ln_sum`.
fn shifted_lse(row: &[f64]) -> (f64, f64) {
    let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = row.iter().map(|v| (v - m).exp()).sum();
    (m, sum.ln())
}

/// Per-row losses `(m - x_t) + ln sum_j exp(x_j - m)`. Both terms are `>= 0`
/// in floating point too (the sum includes `exp(0) = 1`), so no row loss is negative.
pub fn row_losses(logits: &[f64], rows: usize, vocab: usize, targets: &[u32]) -> Result<Vec<f64>> {
    check(logits, rows, vocab, targets)?;
    Ok((0..rows)
        .map(|r| {
            let row = &logits[r * vocab..(r + 1) * vocab];
            let (m, ln_sum) = shifted_lse(row);
            (m - row[targets[r] as usize]) + ln_sum
        })
        .collect())
}

/// Mean of [`row_losses`].
pub fn forward(logits: &[f64], rows: usize, vocab: usize, targets: &[u32]) -> Result<f64> {
    let losses = row_losses(logits, rows, vocab, targets)?;
    Ok(losses.iter().sum::<f64>() / rows.max(1) as f64)
}

/// Gradient of the mean loss: `(softmax(x_r) - onehot(t_r)) / rows`.
pub fn backward(logits: &[f64], rows: usize, vocab: usize, targets: &[u32]) -> Result<Vec<f64>> {
    check(logits, rows, vocab, targets)?;
    let inv_rows = 1.0 / rows.max(1) as f64;
    let mut g = vec![0.0; rows * vocab];
    for r in 0..rows {
        let row = &logits[r * vocab..(r + 1) * vocab];
        let (m, ln_sum) = shifted_lse(row);
        for j in 0..vocab {
            let p = (row[j] - m - ln_sum).exp();
            let onehot = if j == targets[r] as usize { 1.0 } else { 0.0 };
            g[r * vocab + j] = (p - onehot) * inv_rows;
        }
    }
    Ok(g)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_logits_give_ln_vocab() {
        let l = forward(&[1e4; 8], 2, 4, &[0, 3]).unwrap();
        assert!((l - 4f64.ln()).abs() < 1e-15);
        let g = backward(&[0.0; 4], 1, 4, &[2]).unwrap();
        assert_eq!(g, vec![0.25, 0.25, -0.75, 0.25]);
        assert!(forward(&[0.0; 4], 1, 4, &[4]).is_err());
    }
}
