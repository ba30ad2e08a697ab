//! AdamW (Loshchilov & Hutter, 2019): Adam with bias-corrected moments and
//! decoupled weight decay. For step `t = 1, 2, ...` and every coordinate:
//!
//! ```text
//! m    = b1 m + (1 - b1) g
//! v    = b2 v + (1 - b2) g^2
//! mhat = m / (1 - b1^t)
//! vhat = v / (1 - b2^t)
//! p   -= lr (mhat / (sqrt(vhat) + eps) + wd p)
//! ```
//!
//! On the first step `mhat = g` and `vhat = g^2`, so every coordinate with
//! `|g| >> eps` moves by `lr` against the sign of its gradient (with `wd = 0`).

use crate::error::{Error, Result};

/// AdamW hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamW {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

/// The optimizer state of one parameter tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct AdamState {
    /// First moment.
    pub m: Vec<f64>,
    /// Second moment.
    pub v: Vec<f64>,
    /// Steps taken so far (the `t` of the bias correction after the next step is `t + 1`).
    pub t: u64,
}

impl AdamState {
    /// Zero moments for a tensor of `len` values.
    pub fn new(len: usize) -> Self {
        AdamState {
            m: vec![0.0; len],
            v: vec![0.0; len],
            t: 0,
        }
    }
}

/// Which way a step may differ from the real one; the real step uses
/// [`Variant::CORRECT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variant {
    pub bias_correction: bool,
    /// `true` moves against the gradient (descent), `false` up it.
    pub descend: bool,
}

impl Variant {
    pub const CORRECT: Variant = Variant {
        bias_correction: true,
        descend: true,
    };
}

impl AdamW {
    /// `lr` and `weight_decay` with the usual `b1 = 0.9`, `b2 = 0.999`, `eps = 1e-8`.
    pub fn new(lr: f64, weight_decay: f64) -> Self {
        AdamW {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay,
        }
    }

    /// One AdamW step on `p` with gradient `g`, advancing `state`.
    pub fn step(&self, p: &mut [f64], g: &[f64], state: &mut AdamState) -> Result<()> {
        self.step_variant(p, g, state, Variant::CORRECT)
    }

    pub fn step_variant(
        &self,
        p: &mut [f64],
        g: &[f64],
        state: &mut AdamState,
        variant: Variant,
    ) -> Result<()> {
        if g.len() != p.len() || state.m.len() != p.len() || state.v.len() != p.len() {
            return Err(Error::ShapeMismatch {
                op: "adamw",
                expected: format!("parameter, gradient and moments of {} values", p.len()),
                got: format!(
                    "gradient {}, m {}, v {}",
                    g.len(),
                    state.m.len(),
                    state.v.len()
                ),
            });
        }
        state.t += 1;
        let t = i32::try_from(state.t).unwrap_or(i32::MAX);
        let (c1, c2) = if variant.bias_correction {
            (1.0 - self.beta1.powi(t), 1.0 - self.beta2.powi(t))
        } else {
            (1.0, 1.0)
        };
        let sign = if variant.descend { 1.0 } else { -1.0 };
        for i in 0..p.len() {
            let gi = g[i];
            state.m[i] = self.beta1 * state.m[i] + (1.0 - self.beta1) * gi;
            state.v[i] = self.beta2 * state.v[i] + (1.0 - self.beta2) * gi * gi;
            let mhat = state.m[i] / c1;
            let vhat = state.v[i] / c2;
            let update = mhat / (vhat.sqrt() + self.eps) + self.weight_decay * p[i];
            p[i] -= sign * self.lr * update;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_step_moves_by_lr_against_the_gradient() {
        let opt = AdamW::new(1e-2, 0.0);
        let mut p = vec![1.0, -2.0, 0.5];
        let g = vec![3.0, -0.01, 1e3];
        let mut st = AdamState::new(3);
        opt.step(&mut p, &g, &mut st).unwrap();
        assert!((p[0] - 0.99).abs() < 1e-9);
        assert!((p[1] - -1.99).abs() < 1e-8);
        assert!((p[2] - 0.49).abs() < 1e-9);
        assert_eq!(st.t, 1);
    }

    #[test]
    fn weight_decay_is_decoupled() {
        let opt = AdamW::new(0.1, 0.5);
        let mut p = vec![2.0];
        let mut st = AdamState::new(1);
        opt.step(&mut p, &[0.0], &mut st).unwrap();
        // Zero gradient: only the decay term moves p, by lr * wd * p.
        assert!((p[0] - (2.0 - 0.1 * 0.5 * 2.0)).abs() < 1e-12);
    }
}
