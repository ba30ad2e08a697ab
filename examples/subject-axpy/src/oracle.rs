//! The CPU oracle: what the kernels compute, in f64 and in the plainest
//! order, so that the kernels' f32 results are judged against it.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// `a * x + y`, element by element.
pub fn axpy(a: f64, x: &[f64], y: &[f64]) -> Vec<f64> {
    x.iter().zip(y).map(|(x, y)| a * x + y).collect()
}

/// `sum(x[i]^2)`.
pub fn sum_squares(x: &[f64]) -> f64 {
    x.iter().map(|v| v * v).sum()
}

/// `||got - want|| / ||want||` (L2 norms; `||got - want||` where `want`
/// is zero). A non-finite element of `got` makes it non-finite.
pub fn rel_l2(got: &[f64], want: &[f64]) -> f64 {
    let diff: f64 = got.iter().zip(want).map(|(g, w)| (g - w).powi(2)).sum();
    let norm: f64 = want.iter().map(|w| w * w).sum();
    if norm > 0.0 {
        (diff / norm).sqrt()
    } else {
        diff.sqrt()
    }
}

/// The index where `got` is furthest from `want` (NaN counts as furthest).
pub fn worst(got: &[f64], want: &[f64]) -> Option<usize> {
    let gap = |i: usize| {
        let d = (got[i] - want[i]).abs();
        if d.is_nan() {
            f64::INFINITY
        } else {
            d
        }
    };
    (0..got.len().min(want.len())).max_by(|&i, &j| gap(i).total_cmp(&gap(j)))
}

/// `n` numbers uniform in `[-1, 1)`, rounded to f32 (what a kernel gets),
/// from `rng`.
pub fn uniform(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// The line the training workload fits: `t = LINE_SLOPE * x + LINE_OFFSET`.
pub const LINE_SLOPE: f32 = 3.0;
/// See [`LINE_SLOPE`].
pub const LINE_OFFSET: f32 = 0.5;

/// The training data of the line fit: `n` points `x` uniform in `[-1, 1)`
/// from `seed`, and their targets on the line plus noise uniform in
/// `[-0.05, 0.05)`.
pub fn line_data(n: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let x = uniform(&mut rng, n);
    let t = x
        .iter()
        .map(|&x| LINE_SLOPE * x + LINE_OFFSET + 0.05 * rng.random_range(-1.0f32..1.0))
        .collect();
    (x, t)
}

/// One full-batch SGD step of the line fit on the mean squared error
/// `L = mean((w x + b - t)^2)`: returns `L` at `(w, b)` and the updated
/// `(w - lr dL/dw, b - lr dL/db)`, `dL/dw = 2 mean(r x)`, `dL/db = 2 mean(r)`.
pub fn line_step(w: f64, b: f64, x: &[f64], t: &[f64], lr: f64) -> (f64, f64, f64) {
    let n = x.len() as f64;
    let (mut rx, mut r1, mut rr) = (0.0, 0.0, 0.0);
    for (x, t) in x.iter().zip(t) {
        let r = w * x + b - t;
        rx += r * x;
        r1 += r;
        rr += r * r;
    }
    (rr / n, w - lr * 2.0 * rx / n, b - lr * 2.0 * r1 / n)
}

/// Oracles wrong on purpose, for the mutant self-tests of the cpu kinds.
pub mod faulty {
    /// `x + y`: [`super::axpy`] that forgets `a`.
    pub fn axpy_drops_alpha(_a: f64, x: &[f64], y: &[f64]) -> Vec<f64> {
        x.iter().zip(y).map(|(x, y)| x + y).collect()
    }
}

/// f32 values as f64.
pub fn widen(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&v| f64::from(v)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axpy_and_sum_squares_by_hand() {
        assert_eq!(axpy(2.0, &[1.0, -1.0], &[0.5, 0.5]), [2.5, -1.5]);
        assert_eq!(sum_squares(&[3.0, 4.0]), 25.0);
        assert_eq!(rel_l2(&[3.0, 4.0], &[3.0, 4.0]), 0.0);
        assert!((rel_l2(&[3.0, 0.0], &[3.0, 4.0]) - 0.8).abs() < 1e-15);
        assert!(rel_l2(&[f64::NAN], &[1.0]).is_nan());
        assert_eq!(worst(&[1.0, f64::NAN, 2.0], &[1.0, 1.0, 9.0]), Some(1));
    }

    #[test]
    fn the_faulty_oracle_differs_unless_a_is_one() {
        let (x, y) = ([1.0, 2.0], [0.0, 1.0]);
        assert_eq!(faulty::axpy_drops_alpha(1.0, &x, &y), axpy(1.0, &x, &y));
        assert_ne!(faulty::axpy_drops_alpha(2.0, &x, &y), axpy(2.0, &x, &y));
    }

    /// Full-batch SGD at the workload's default rate finds the line; the
    /// loss never rises (beyond f64 rounding at the optimum).
    #[test]
    fn sgd_on_the_line_data_converges() {
        let (x, t) = line_data(4096, 7);
        let (x, t) = (widen(&x), widen(&t));
        let (mut w, mut b, mut losses) = (0.0, 0.0, Vec::new());
        for _ in 0..60 {
            let (loss, w2, b2) = line_step(w, b, &x, &t, 0.5);
            (w, b) = (w2, b2);
            losses.push(loss);
        }
        assert!(
            losses.windows(2).all(|p| p[1] <= p[0] * (1.0 + 1e-12)),
            "{losses:?}"
        );
        assert!((w - 3.0).abs() < 0.02 && (b - 0.5).abs() < 0.02, "{w} {b}");
    }
}
