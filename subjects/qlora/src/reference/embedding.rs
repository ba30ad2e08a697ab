//! Reference embedding gather.
//!
//! `y[t, :] = table[tokens[t], :]` with `table` `[vocab, hidden]`; the gradient
//! scatters back, adding the rows of repeated tokens.

use super::elementwise::expect_len;
use crate::error::{Error, Result};

fn check_tokens(vocab: usize, tokens: &[u32]) -> Result<()> {
    match tokens.iter().find(|&&t| t as usize >= vocab) {
        Some(t) => Err(Error::InvalidArgument {
            op: "embedding",
            message: format!("token {t} is outside the vocabulary of {vocab}"),
        }),
        None => Ok(()),
    }
}

/// Gathers one `hidden` row per token: `[tokens.len(), hidden]`.
pub fn forward(table: &[f64], vocab: usize, hidden: usize, tokens: &[u32]) -> Result<Vec<f64>> {
    expect_len("embedding", "table", table.len(), &[vocab, hidden])?;
    check_tokens(vocab, tokens)?;
    let mut y = Vec::with_capacity(tokens.len() * hidden);
    for &t in tokens {
        let row = t as usize * hidden;
        y.extend_from_slice(&table[row..row + hidden]);
    }
    Ok(y)
}

/// `dtable[v, :] = sum_{t : tokens[t] == v} dy[t, :]`.
pub fn backward(dy: &[f64], vocab: usize, hidden: usize, tokens: &[u32]) -> Result<Vec<f64>> {
    expect_len("embedding", "dy", dy.len(), &[tokens.len(), hidden])?;
    check_tokens(vocab, tokens)?;
    let mut dtable = vec![0.0; vocab * hidden];
    for (t, &tok) in tokens.iter().enumerate() {
        let row = tok as usize * hidden;
        for i in 0..hidden {
            dtable[row + i] += dy[t * hidden + i];
        }
    }
    Ok(dtable)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_and_accumulate() {
        let table = [0.0, 1.0, 10.0, 11.0, 20.0, 21.0]; // [3, 2]
        let y = forward(&table, 3, 2, &[2, 0, 2]).unwrap();
        assert_eq!(y, vec![20.0, 21.0, 0.0, 1.0, 20.0, 21.0]);
        let d = backward(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 3, 2, &[2, 0, 2]).unwrap();
        assert_eq!(d, vec![3.0, 4.0, 0.0, 0.0, 6.0, 8.0]);
        assert!(forward(&table, 3, 2, &[3]).is_err());
    }
}
