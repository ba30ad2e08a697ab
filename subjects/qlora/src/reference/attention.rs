//! Reference causal grouped-query attention (GQA).
//!
//! `q`, `out` are `[batch, seq, heads, head_dim]`; `k`, `v` are
//! `[batch, seq, kv_heads, head_dim]`; query head `h` reads kv head
//! `h / (heads / kv_heads)`. With `s = 1 / sqrt(head_dim)`:
//! `S_ij = s <q_i, k_j>`, `P = causal_softmax(S)` (`j <= i`), `out_i = sum_j P_ij v_j`.
//! `probs` holds `P` as `[batch, heads, seq, seq]`, masked entries exactly 0.

use super::elementwise::expect_len;
use super::softmax;
use crate::error::{Error, Result};

/// The dimensions of one attention call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnShape {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl AttnShape {
    /// The score scale `1 / sqrt(head_dim)`.
    pub fn scale(&self) -> f64 {
        1.0 / (self.head_dim as f64).sqrt()
    }

    /// Query heads per kv head.
    fn group(&self) -> usize {
        self.heads / self.kv_heads
    }

    /// Offset of the `head_dim` vector of query head `h` at `(b, i)`.
    fn q_at(&self, b: usize, i: usize, h: usize) -> usize {
        ((b * self.seq + i) * self.heads + h) * self.head_dim
    }

    /// Offset of the `head_dim` vector of the kv head that query head `h` reads at `(b, j)`.
    fn kv_at(&self, b: usize, j: usize, h: usize) -> usize {
        ((b * self.seq + j) * self.kv_heads + h / self.group()) * self.head_dim
    }

    /// Offset of `P[b, h, i, 0]`.
    fn p_at(&self, b: usize, h: usize, i: usize) -> usize {
        ((b * self.heads + h) * self.seq + i) * self.seq
    }

    /// Refuses heads that are not a multiple of kv_heads: each kv head
    /// serves a whole group of query heads.
    pub fn check_heads(&self) -> Result<()> {
        if self.kv_heads == 0 || !self.heads.is_multiple_of(self.kv_heads) {
            return Err(Error::InvalidArgument {
                op: "attention",
                message: format!(
                    "heads ({}) must be a multiple of kv_heads ({})",
                    self.heads, self.kv_heads
                ),
            });
        }
        Ok(())
    }

    fn check(&self, q: &[f64], k: &[f64], v: &[f64]) -> Result<()> {
        self.check_heads()?;
        let (b, s, d) = (self.batch, self.seq, self.head_dim);
        expect_len("attention", "q", q.len(), &[b, s, self.heads, d])?;
        expect_len("attention", "k", k.len(), &[b, s, self.kv_heads, d])?;
        expect_len("attention", "v", v.len(), &[b, s, self.kv_heads, d])
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Forward pass: returns `(out, probs)`.
pub fn forward(q: &[f64], k: &[f64], v: &[f64], sh: &AttnShape) -> Result<(Vec<f64>, Vec<f64>)> {
    sh.check(q, k, v)?;
    let (d, seq) = (sh.head_dim, sh.seq);
    let scale = sh.scale();
    // Scores in the probs layout; masked entries stay 0 and softmax ignores them.
    let mut scores = vec![0.0; sh.batch * sh.heads * seq * seq];
    for b in 0..sh.batch {
        for h in 0..sh.heads {
            for i in 0..seq {
                let qi = &q[sh.q_at(b, i, h)..][..d];
                for j in 0..=i {
                    let kj = &k[sh.kv_at(b, j, h)..][..d];
                    scores[sh.p_at(b, h, i) + j] = scale * dot(qi, kj);
                }
            }
        }
    }
    // Row (b, h, i) of the probs layout has index r with r % seq == i: exactly
    // the causal row convention of the reference softmax.
    let probs = softmax::forward(&scores, sh.batch * sh.heads * seq, seq)?;
    let mut out = vec![0.0; q.len()];
    for b in 0..sh.batch {
        for h in 0..sh.heads {
            for i in 0..seq {
                let o = sh.q_at(b, i, h);
                for j in 0..=i {
                    let p = probs[sh.p_at(b, h, i) + j];
                    let vj = sh.kv_at(b, j, h);
                    for t in 0..d {
                        out[o + t] += p * v[vj + t];
                    }
                }
            }
        }
    }
    Ok((out, probs))
}

/// Backward pass from the saved `probs`: returns `(dq, dk, dv)`.
/// `dP_ij = <dout_i, v_j>`, `dv_j = sum_i P_ij dout_i`,
/// `dS = softmax_backward(P, dP)`, `dq_i = s sum_j dS_ij k_j`,
/// `dk_j = s sum_i dS_ij q_i`; kv gradients sum over the heads of their group.
pub fn backward(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    probs: &[f64],
    dout: &[f64],
    sh: &AttnShape,
) -> Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
    sh.check(q, k, v)?;
    let (d, seq) = (sh.head_dim, sh.seq);
    expect_len(
        "attention",
        "probs",
        probs.len(),
        &[sh.batch, sh.heads, seq, seq],
    )?;
    expect_len("attention", "dout", dout.len(), &[q.len()])?;
    let scale = sh.scale();
    let mut dprobs = vec![0.0; probs.len()];
    let mut dv = vec![0.0; v.len()];
    for b in 0..sh.batch {
        for h in 0..sh.heads {
            for i in 0..seq {
                let doi = &dout[sh.q_at(b, i, h)..][..d];
                for j in 0..=i {
                    let vj = sh.kv_at(b, j, h);
                    dprobs[sh.p_at(b, h, i) + j] = dot(doi, &v[vj..][..d]);
                    let p = probs[sh.p_at(b, h, i) + j];
                    for t in 0..d {
                        dv[vj + t] += p * doi[t];
                    }
                }
            }
        }
    }
    let dscores = softmax::backward(probs, &dprobs, sh.batch * sh.heads * seq, seq)?;
    let mut dq = vec![0.0; q.len()];
    let mut dk = vec![0.0; k.len()];
    for b in 0..sh.batch {
        for h in 0..sh.heads {
            for i in 0..seq {
                let qi = sh.q_at(b, i, h);
                for j in 0..=i {
                    let g = scale * dscores[sh.p_at(b, h, i) + j];
                    let kj = sh.kv_at(b, j, h);
                    for t in 0..d {
                        dq[qi + t] += g * k[kj + t];
                        dk[kj + t] += g * q[qi + t];
                    }
                }
            }
        }
    }
    Ok((dq, dk, dv))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_position_copies_v_and_equal_scores_average() {
        // One head, head_dim 1, q = 0: uniform attention over the visible prefix.
        let sh = AttnShape {
            batch: 1,
            seq: 3,
            heads: 1,
            kv_heads: 1,
            head_dim: 1,
        };
        let (out, probs) = forward(&[0.0; 3], &[1.0, 2.0, 3.0], &[3.0, 6.0, 9.0], &sh).unwrap();
        assert_eq!(out, vec![3.0, 4.5, 6.0]);
        assert_eq!(&probs[..3], &[1.0, 0.0, 0.0]);
        let bad = AttnShape {
            kv_heads: 2,
            heads: 3,
            ..sh
        };
        assert!(forward(&[0.0; 9], &[0.0; 6], &[0.0; 6], &bad).is_err());
    }
}
