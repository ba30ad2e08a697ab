//! Gradient-norm clipping.
//!
//! Global clipping (the claim of the training step): with all gradients `g`
//! of every trainable tensor taken together,
//!
//! ```text
//! S     = sum_t sum_i g_ti^2                       (squared_sum, f64)
//! scale = min(1, max_norm / (sqrt(S) + 1e-6))      (scale)
//! g    <- scale * g                                (apply)
//! ```
//!
//! so afterwards `||g|| <= max_norm`, and gradients already inside the ball are
//! left exactly as they were (`scale == 1`). Per-layer clipping computes one
//! such scale per group (layer) of tensors from that group's own norm; it
//! bounds each layer's norm by `max_norm`, so the global norm may reach
//! `sqrt(groups) * max_norm`.

use crate::error::{Error, Result};
use qlora::train::ClipMode;

/// Added to the norm so that an all-zero gradient gives a finite scale.
pub const NORM_EPS: f64 = 1e-6;

/// `S = sum_t sum_i g_ti^2`, accumulated in f64.
pub fn squared_sum(grads: &[&[f64]]) -> f64 {
    grads.iter().flat_map(|g| g.iter()).map(|v| v * v).sum()
}

/// `scale = min(1, max_norm / (sqrt(sq_sum) + 1e-6))`.
pub fn scale(sq_sum: f64, max_norm: f64) -> f64 {
    (max_norm / (sq_sum.sqrt() + NORM_EPS)).min(1.0)
}

/// `g_i <- scale * g_i`.
pub fn apply(g: &mut [f64], scale: f64) {
    for v in g.iter_mut() {
        *v *= scale;
    }
}

/// What one clip did to one group of tensors.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupClip {
    /// The group's norm before clipping, `sqrt(S_group)`.
    pub norm: f64,
    /// The factor applied, in `(0, 1]`.
    pub scale: f64,
}

impl GroupClip {
    /// Whether the clip changed anything (`scale < 1`).
    pub fn scaled(&self) -> bool {
        self.scale < 1.0
    }
}

/// Clips `tensors` in place. `group_of[t]` is the group (layer) of tensor `t`;
/// global mode ignores it and treats everything as one group. Returns one
/// [`GroupClip`] per group (one for global mode), in group order.
pub fn clip(
    tensors: &mut [Vec<f64>],
    group_of: &[usize],
    mode: ClipMode,
    max_norm: f64,
) -> Result<Vec<GroupClip>> {
    clip_with(tensors, group_of, mode, max_norm, scale)
}

/// [`clip`] with a pluggable scale rule `scale_rule(S, max_norm)`, so a
/// different rule reuses the same grouping logic.
pub fn clip_with(
    tensors: &mut [Vec<f64>],
    group_of: &[usize],
    mode: ClipMode,
    max_norm: f64,
    scale_rule: fn(f64, f64) -> f64,
) -> Result<Vec<GroupClip>> {
    if group_of.len() != tensors.len() {
        return Err(Error::ShapeMismatch {
            op: "clip",
            expected: format!("one group index per tensor ({})", tensors.len()),
            got: format!("{} group indices", group_of.len()),
        });
    }
    if !(max_norm.is_finite() && max_norm > 0.0) {
        return Err(Error::InvalidArgument {
            op: "clip",
            message: format!("max_norm must be a finite number > 0, got {max_norm}"),
        });
    }
    let groups: Vec<usize> = match mode {
        ClipMode::Global => vec![0; tensors.len()],
        ClipMode::PerLayer => group_of.to_vec(),
    };
    let n_groups = groups.iter().map(|g| g + 1).max().unwrap_or(0);
    let mut sq = vec![0.0f64; n_groups];
    for (t, g) in tensors.iter().zip(&groups) {
        sq[*g] += squared_sum(&[t.as_slice()]);
    }
    let out: Vec<GroupClip> = sq
        .iter()
        .map(|&s| GroupClip {
            norm: s.sqrt(),
            scale: scale_rule(s, max_norm),
        })
        .collect();
    for (t, g) in tensors.iter_mut().zip(&groups) {
        apply(t, out[*g].scale);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn global_clip_bounds_the_norm_and_keeps_small_gradients() {
        let mut t = vec![vec![3.0, 0.0], vec![0.0, 4.0]];
        let out = clip(&mut t, &[0, 1], ClipMode::Global, 1.0).unwrap();
        assert_eq!(out.len(), 1);
        assert!((out[0].norm - 5.0).abs() < 1e-12);
        let after = squared_sum(&[&t[0], &t[1]]).sqrt();
        assert!(after <= 1.0 && after > 0.999_99);
        let mut small = vec![vec![0.3, 0.4]];
        clip(&mut small, &[0], ClipMode::Global, 1.0).unwrap();
        assert_eq!(small, vec![vec![0.3, 0.4]]);
    }

    #[test]
    fn per_layer_clip_bounds_each_layer() {
        let mut t = vec![vec![3.0, 4.0], vec![6.0, 8.0], vec![0.1]];
        let out = clip(&mut t, &[0, 1, 1], ClipMode::PerLayer, 1.0).unwrap();
        assert_eq!(out.len(), 2);
        assert!(squared_sum(&[&t[0]]).sqrt() <= 1.0);
        assert!(squared_sum(&[&t[1], &t[2]]).sqrt() <= 1.0);
        assert!(clip(&mut t, &[0], ClipMode::Global, 1.0).is_err());
    }
}
