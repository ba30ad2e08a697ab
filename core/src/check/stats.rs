//! Statistics of timing samples: medians and a seeded bootstrap interval of a
//! ratio of medians. Plain functions of sample slices, tested without a GPU.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Bootstrap resamples of a ratio interval.
pub const BOOTSTRAP_RESAMPLES: usize = 1000;

/// The median of `xs` (mean of the two middle values for an even count);
/// NaN for an empty slice, so it can never pass a comparison.
pub fn median(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len().is_multiple_of(2) {
        0.5 * (v[mid - 1] + v[mid])
    } else {
        v[mid]
    }
}

/// Whether the median of `planned` samples, of which `done` are taken, is
/// already certain to exceed `limit` whatever the rest turn out to be: more
/// than half of the planned count already lies above it. Sorted, the upper
/// `planned / 2 + 1` values then all exceed `limit`, and the median (the
/// middle value, or the mean of the two middle ones) is one of them or the
/// mean of two of them. So a timed run judged on `median <= limit` may stop
/// there with its verdict settled.
pub fn median_settled_above(done: &[f64], planned: usize, limit: f64) -> bool {
    done.iter().filter(|&&x| x > limit).count() > planned / 2
}

/// Whether a mutant's samples so far have settled `median(baseline) /
/// median(candidate) < bound`: the 95% interval of the ratio ([`ratio_ci`]
/// with the trial's `seed`, as the verdict's own interval) ends below
/// `bound`, so the check fails whatever the remaining samples time. Never
/// for fewer than [`MUTANT_FIRST_LOOK`](super::repeats::MUTANT_FIRST_LOOK)
/// candidate samples, whose bootstrap is little more than the samples
/// themselves. A mutant's paired timing stops on the same rule
/// (`repeats::Plan::fail_fast_if`).
pub fn ratio_interval_below(baseline: &[f64], candidate: &[f64], bound: f64, seed: u64) -> bool {
    candidate.len() >= super::repeats::MUTANT_FIRST_LOOK
        && ratio_ci(baseline, candidate, seed, BOOTSTRAP_RESAMPLES).1 < bound
}

/// Whether the 95% bootstrap interval of the median of `done` lies wholly
/// above `limit`: [`ratio_interval_below`] of the constant series `limit`
/// over `done` (the interval of `limit / median`) against 1. A mutant's run
/// judged on `median <= limit` may stop there.
pub fn median_interval_above(done: &[f64], limit: f64, seed: u64) -> bool {
    ratio_interval_below(&vec![limit; done.len()], done, 1.0, seed)
}

/// The 95% percentile-bootstrap interval of `median(baseline) / median(candidate)`:
/// `resamples` times, draw each sample set with replacement (same sizes),
/// take the ratio of the resampled medians; the 2.5th and 97.5th percentiles
/// of those ratios. Deterministic for a given `seed`.
pub fn ratio_ci(baseline: &[f64], candidate: &[f64], seed: u64, resamples: usize) -> (f64, f64) {
    if baseline.is_empty() || candidate.is_empty() || resamples == 0 {
        return (f64::NAN, f64::NAN);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let draw = |xs: &[f64], rng: &mut ChaCha8Rng| -> f64 {
        let picked: Vec<f64> = (0..xs.len())
            .map(|_| xs[rng.random_range(0..xs.len())])
            .collect();
        median(&picked)
    };
    let mut ratios: Vec<f64> = (0..resamples)
        .map(|_| {
            let b = draw(baseline, &mut rng);
            let c = draw(candidate, &mut rng);
            b / c
        })
        .collect();
    ratios.sort_by(f64::total_cmp);
    let at = |q: f64| {
        let i = ((resamples - 1) as f64 * q).round() as usize;
        ratios[i.min(resamples - 1)]
    };
    (at(0.025), at(0.975))
}

/// The largest value seen so far, where a non-finite value beats every finite one
/// (so a NaN is reported, never hidden by `f64::max`).
#[derive(Debug, Clone, Default)]
pub struct Worst {
    seen: Option<f64>,
    what: String,
}

impl Worst {
    /// Keeps `(value, what)` if it is worse than the current worst.
    pub fn offer(&mut self, value: f64, what: impl FnOnce() -> String) {
        let worse = match self.seen {
            None => true,
            Some(cur) => cur.is_finite() && (!value.is_finite() || value > cur),
        };
        if worse {
            self.seen = Some(value);
            self.what = what();
        }
    }

    /// The worst value (0 when nothing was offered).
    pub fn value(&self) -> f64 {
        self.seen.unwrap_or(0.0)
    }

    /// What the worst value was measured on.
    pub fn what(&self) -> &str {
        if self.seen.is_some() {
            &self.what
        } else {
            "no case"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_median_is_settled_above_only_past_half_the_planned_count() {
        // 20 planned: 10 above the limit can still give a median at it, 11 cannot.
        let ten = [5.0; 10];
        assert!(!median_settled_above(&ten, 20, 1.0));
        assert!(median_settled_above(&[5.0; 11], 20, 1.0));
        // 21 planned: 11 above settle it.
        assert!(median_settled_above(&[5.0; 11], 21, 1.0));
        assert!(
            !median_settled_above(&[1.0; 21], 21, 1.0),
            "equal to the limit is not above"
        );
        assert!(!median_settled_above(&[], 5, 1.0));
    }

    #[test]
    fn a_median_interval_is_above_only_when_every_sample_is_well_above() {
        // A mutant ten times slower than the limit: three samples settle it.
        assert!(median_interval_above(&[10.0, 10.2, 9.9], 1.0, 7));
        // Two samples are never enough, however far above.
        assert!(!median_interval_above(&[10.0, 10.0], 1.0, 7));
        // One sample below the limit among three: the interval reaches it.
        assert!(!median_interval_above(&[10.0, 0.5, 10.0], 1.0, 7));
        // At the limit is not above it.
        assert!(!median_interval_above(&[1.0; 5], 1.0, 7));
        assert!(!median_interval_above(&[], 1.0, 7));
    }

    proptest::proptest! {
        /// Whatever the samples still to come, a settled median of the whole
        /// planned set is above the limit.
        #[test]
        fn a_settled_median_stays_above_whatever_follows(
            done in proptest::collection::vec(0.0f64..10.0, 0..40),
            rest in proptest::collection::vec(-1e6f64..1e6, 0..40),
            limit in 0.0f64..10.0,
        ) {
            let planned = done.len() + rest.len();
            if median_settled_above(&done, planned, limit) {
                let all: Vec<f64> = done.iter().chain(&rest).copied().collect();
                proptest::prop_assert!(median(&all) > limit);
            }
        }
    }

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn bootstrap_interval_is_seeded_and_brackets_the_ratio() {
        let b: Vec<f64> = (0..30).map(|i| 2.0 + 0.01 * f64::from(i % 7)).collect();
        let c: Vec<f64> = (0..30).map(|i| 1.0 + 0.01 * f64::from(i % 5)).collect();
        let r = median(&b) / median(&c);
        let (lo, hi) = ratio_ci(&b, &c, 7, BOOTSTRAP_RESAMPLES);
        assert!(lo <= r && r <= hi, "{lo} {r} {hi}");
        assert_eq!((lo, hi), ratio_ci(&b, &c, 7, BOOTSTRAP_RESAMPLES));
        assert!(ratio_ci(&[], &c, 7, 10).0.is_nan());
    }
}
