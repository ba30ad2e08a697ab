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

/// `x` rounded to bf16 (through f32, nearest, ties to even), as a bf16
/// kernel rounds an f32 it computed.
pub fn round_bf16(x: f64) -> f64 {
    f64::from(half::bf16::from_f32(x as f32).to_f32())
}

/// The forward of the bf16 flash kernels, with bf16 rounding at the points
/// where they round, for inputs the caller has rounded to bf16: with
/// `m_i = max_j S_ij` and the unnormalised `p_ij = exp(S_ij - m_i)`,
/// `out_i = sum_j bf16(p_ij) v_j / l_i`, `l_i = sum_j p_ij` (unrounded).
/// Returns `(out, lse2)`, `lse2_i = log2(e) (m_i + ln l_i)` (`[batch, heads, seq]`).
pub fn flash_bf16_forward(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    sh: &AttnShape,
) -> Result<(Vec<f64>, Vec<f64>)> {
    sh.check(q, k, v)?;
    let (d, seq) = (sh.head_dim, sh.seq);
    let scale = sh.scale();
    let mut out = vec![0.0; q.len()];
    let mut lse2 = vec![0.0; sh.batch * sh.heads * seq];
    let mut s = vec![0.0; seq];
    for b in 0..sh.batch {
        for h in 0..sh.heads {
            for i in 0..seq {
                let qi = &q[sh.q_at(b, i, h)..][..d];
                for (j, sj) in s.iter_mut().enumerate().take(i + 1) {
                    *sj = scale * dot(qi, &k[sh.kv_at(b, j, h)..][..d]);
                }
                let m = s[..=i].iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let l: f64 = s[..=i].iter().map(|&x| (x - m).exp()).sum();
                let o = sh.q_at(b, i, h);
                for (j, &sj) in s.iter().enumerate().take(i + 1) {
                    let p = round_bf16((sj - m).exp()) / l;
                    let vj = sh.kv_at(b, j, h);
                    for t in 0..d {
                        out[o + t] += p * v[vj + t];
                    }
                }
                lse2[(b * sh.heads + h) * seq + i] = std::f64::consts::LOG2_E * (m + l.ln());
            }
        }
    }
    Ok((out, lse2))
}

/// The backward of the bf16 flash kernels with bf16 rounding where they
/// round, for bf16-rounded `q, k, v` and `dout_r` (the rounded `dout`);
/// `dots` are `D_i = <dout_i, out_i>` of the unrounded `dout` and the
/// forward's `out`. `P` exact, `dP_ij = <dout_r_i, v_j>`, `dS = P (dP - D)`,
/// `dv_j = sum_i bf16(P_ij) dout_r_i`, `dq_i = s sum_j bf16(dS_ij) k_j`,
/// `dk_j = s sum_i bf16(dS_ij) q_i`; kv gradients summed over each group.
pub fn flash_bf16_backward(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    dout_r: &[f64],
    dots: &[f64],
    sh: &AttnShape,
) -> Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
    sh.check(q, k, v)?;
    expect_len("attention", "dout", dout_r.len(), &[q.len()])?;
    expect_len(
        "attention",
        "dots",
        dots.len(),
        &[sh.batch, sh.seq, sh.heads],
    )?;
    let (d, seq) = (sh.head_dim, sh.seq);
    let scale = sh.scale();
    let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
    let mut p = vec![0.0; seq];
    for b in 0..sh.batch {
        for h in 0..sh.heads {
            for i in 0..seq {
                let qo = sh.q_at(b, i, h);
                let qi = &q[qo..][..d];
                for (j, pj) in p.iter_mut().enumerate().take(i + 1) {
                    *pj = scale * dot(qi, &k[sh.kv_at(b, j, h)..][..d]);
                }
                let m = p[..=i].iter().copied().fold(f64::NEG_INFINITY, f64::max);
                p[..=i].iter_mut().for_each(|x| *x = (*x - m).exp());
                let l: f64 = p[..=i].iter().sum();
                let doi = &dout_r[qo..][..d];
                let di = dots[(b * seq + i) * sh.heads + h];
                for (j, &pj) in p.iter().enumerate().take(i + 1) {
                    let pij = pj / l;
                    let kv = sh.kv_at(b, j, h);
                    let ds = round_bf16(pij * (dot(doi, &v[kv..][..d]) - di));
                    let pr = round_bf16(pij);
                    for t in 0..d {
                        dv[kv + t] += pr * doi[t];
                        dq[qo + t] += scale * ds * k[kv + t];
                        dk[kv + t] += scale * ds * qi[t];
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

    /// The flash oracle is attention with bf16 rounding at a few points:
    /// close to the exact one, its log-sum-exps the exact ones, and its
    /// backward close to the exact backward.
    #[test]
    fn the_flash_oracle_is_attention_rounded() {
        let sh = AttnShape {
            batch: 1,
            seq: 9,
            heads: 4,
            kv_heads: 2,
            head_dim: 8,
        };
        let n = |len: usize, k: f64| -> Vec<f64> {
            (0..len)
                .map(|i| round_bf16(((i as f64) * k).sin()))
                .collect()
        };
        let (q, k, v, dout) = (
            n(9 * 32, 0.37),
            n(9 * 16, 0.91),
            n(9 * 16, 1.3),
            n(9 * 32, 0.53),
        );
        let (out, probs) = forward(&q, &k, &v, &sh).unwrap();
        let (fout, lse2) = flash_bf16_forward(&q, &k, &v, &sh).unwrap();
        let rel = |a: &[f64], b: &[f64]| {
            let d: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
            (d / b.iter().map(|y| y * y).sum::<f64>()).sqrt()
        };
        assert!(rel(&fout, &out) < 1e-2, "{}", rel(&fout, &out));
        assert!(rel(&fout, &out) > 0.0, "the probabilities were rounded");
        // Row 0 of every head sees key 0 alone: lse2 = log2(e) s_00.
        let s00 = sh.scale() * dot(&q[..8], &k[..8]);
        assert!((lse2[0] - std::f64::consts::LOG2_E * s00).abs() < 1e-12);
        let dots: Vec<f64> = dout
            .chunks(8)
            .zip(out.chunks(8))
            .map(|(a, b)| dot(a, b))
            .collect();
        let (dq, dk, dv) = backward(&q, &k, &v, &probs, &dout, &sh).unwrap();
        let (fdq, fdk, fdv) = flash_bf16_backward(&q, &k, &v, &dout, &dots, &sh).unwrap();
        for (f, e) in [(&fdq, &dq), (&fdk, &dk), (&fdv, &dv)] {
            assert!(rel(f, e) < 2e-2, "{}", rel(f, e));
        }
    }

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
