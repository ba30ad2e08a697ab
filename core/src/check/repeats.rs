//! Adaptive repeats of an alternated two-arm timing, as nvbench does: time at
//! least the contract's `repeats` pairs, then keep adding pairs until the 95%
//! bootstrap interval of the ratio is narrow enough, a cap is reached, or
//! (for a mutant) the interval shows the check has failed. A plain function
//! of a pair sampler, so it is tested with synthetic times.

use super::stats::{median, ratio_ci, BOOTSTRAP_RESAMPLES};
use super::Comparator;

/// The interval is precise enough when its half-width is at most this
/// fraction of the ratio: `(hi - lo) / 2 <= TARGET_HALF_WIDTH * ratio`.
pub const TARGET_HALF_WIDTH: f64 = 0.01;

/// The default cap is this many times the minimum: an interval's width
/// shrinks like `1 / sqrt(n)`, so four times the pairs halve it; a
/// measurement still wider than that is noisy, not short of samples.
pub const DEFAULT_CAP_FACTOR: usize = 4;

/// A mutant trial looks at its interval first after this many pairs (or
/// its `min`, if fewer), then after every pair up to `min`: a mutant that
/// slows a step tenfold has failed its bound long before the contract's
/// minimum, and each of its pairs can take a second. Three, not fewer: the
/// bootstrap interval of two pairs is little more than their two ratios.
pub const MUTANT_FIRST_LOOK: usize = 3;

/// How many pairs to time and when to stop early.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Plan {
    /// Pairs always timed (the contract's `repeats`).
    pub min: usize,
    /// Pairs never exceeded (at least `min`).
    pub max: usize,
    /// For a mutant trial, the check's comparison of the ratio: timing stops
    /// as soon as the whole interval lies on its failing side. `None` for a
    /// real trial, which always times until precise or capped.
    pub fail_fast: Option<(Comparator, f64)>,
}

impl Plan {
    /// `min` pairs at least; at most `max`, or [`DEFAULT_CAP_FACTOR`]` x min`
    /// when `None`, either kept within `min ..= bound`.
    pub fn new(min: usize, max: Option<usize>, bound: usize) -> Plan {
        let cap = max.unwrap_or(min.saturating_mul(DEFAULT_CAP_FACTOR));
        Plan {
            min,
            max: cap.min(bound).max(min),
            fail_fast: None,
        }
    }

    /// The same plan, stopping once `ratio comparator threshold` has
    /// certainly failed, when `mutant` is true.
    pub fn fail_fast_if(self, mutant: bool, comparator: Comparator, threshold: f64) -> Plan {
        Plan {
            fail_fast: mutant.then_some((comparator, threshold)),
            ..self
        }
    }

    /// Why timing stops with `n` pairs and interval `[lo, hi]` of `ratio`,
    /// or `None` to time more. A failing interval: `hi < threshold` for
    /// `>=`, `lo > threshold` for `<=` (never for `==`). Only a failed
    /// mutant stops before `min` pairs: a precise interval of fewer is no
    /// verdict of the contract's `repeats`.
    fn stop(&self, n: usize, ratio: f64, (lo, hi): (f64, f64)) -> Option<Stop> {
        let failed = match self.fail_fast {
            Some((Comparator::Ge, t)) => hi < t,
            Some((Comparator::Le, t)) => lo > t,
            Some((Comparator::Eq, _)) | None => false,
        };
        if failed {
            Some(Stop::Failed)
        } else if n >= self.min && (hi - lo) / 2.0 <= TARGET_HALF_WIDTH * ratio {
            Some(Stop::Precise)
        } else if n >= self.max {
            Some(Stop::Capped)
        } else {
            None
        }
    }

    /// The pair count of the next look at the interval after `n`: `min`
    /// first (a mutant's [`MUTANT_FIRST_LOOK`] and every pair after it up to
    /// `min` before it: a mutant stops at the pair that settles it), then
    /// about 10% more each time (at least one, at most `max`), so a run of
    /// `n` pairs bootstraps only `O(log(max / min))` times past its minimum.
    fn next_look(&self, n: usize) -> usize {
        let first = match self.fail_fast {
            Some(_) => MUTANT_FIRST_LOOK.min(self.min),
            None => self.min,
        };
        if n < first {
            first
        } else if n < self.min {
            match self.fail_fast {
                Some(_) => n + 1,
                None => self.min,
            }
        } else {
            (n + (n / 10).max(1)).min(self.max)
        }
    }
}

/// Refuses a contract's `max_repeats` above `bound` or below its `repeats`.
pub fn check_cap(repeats: usize, max_repeats: Option<usize>, bound: usize) -> Result<(), String> {
    let Some(max) = max_repeats else {
        return Ok(());
    };
    super::params::at_most("max_repeats", max, bound)?;
    if max < repeats {
        return Err(format!(
            "`max_repeats` ({max}) must be at least `repeats` ({repeats})"
        ));
    }
    Ok(())
}

/// Why timing stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The interval reached the target half-width.
    Precise,
    /// The cap was reached first; the interval is wider than the target.
    Capped,
    /// A mutant's interval lay wholly on the failing side.
    Failed,
}

/// Both arms' times, their ratio of medians and its interval.
#[derive(Debug, Clone, PartialEq)]
pub struct Timed {
    pub baseline: Vec<f64>,
    pub candidate: Vec<f64>,
    /// `median(baseline) / median(candidate)`.
    pub ratio: f64,
    /// The 95% bootstrap interval of `ratio` ([`ratio_ci`]).
    pub low: f64,
    pub high: f64,
    pub stop: Stop,
}

impl Timed {
    /// Pairs timed.
    pub fn repeats(&self) -> usize {
        self.baseline.len().min(self.candidate.len())
    }

    /// How many pairs were timed and why no more, for a detail line.
    pub fn describe(&self) -> String {
        let why = match self.stop {
            Stop::Precise => "interval within the target",
            Stop::Capped => "cap reached, interval wider than the target",
            Stop::Failed => "stopped once the interval failed the bound",
        };
        format!(
            "{} repeats ({why}: +-{:.0}% of the ratio)",
            self.repeats(),
            TARGET_HALF_WIDTH * 100.0
        )
    }
}

/// Times pairs `(baseline, candidate) = pair()` (the sampler alternates the
/// arms, so drift hits both alike) until [`Plan`] says stop. The interval is
/// [`ratio_ci`] with `seed`, so a given sequence of times always stops at the
/// same count. The sampler's first error ends timing and is returned.
pub fn time_pairs<E>(
    plan: &Plan,
    seed: u64,
    mut pair: impl FnMut() -> Result<(f64, f64), E>,
) -> Result<Timed, E> {
    let mut baseline = Vec::with_capacity(plan.min);
    let mut candidate = Vec::with_capacity(plan.min);
    loop {
        let look = plan.next_look(baseline.len());
        while baseline.len() < look {
            let (b, c) = pair()?;
            baseline.push(b);
            candidate.push(c);
        }
        let ratio = median(&baseline) / median(&candidate);
        let (low, high) = ratio_ci(&baseline, &candidate, seed, BOOTSTRAP_RESAMPLES);
        if let Some(stop) = plan.stop(baseline.len(), ratio, (low, high)) {
            return Ok(Timed {
                baseline,
                candidate,
                ratio,
                low,
                high,
                stop,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// A sampler of `(2 ms, 1 ms)` with relative noise `spread` on each.
    fn noisy(spread: f64) -> impl FnMut() -> Result<(f64, f64), String> {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        move || {
            let mut jitter = |t: f64| t * (1.0 + spread * rng.random_range(-1.0..1.0));
            Ok((jitter(2.0), jitter(1.0)))
        }
    }

    #[test]
    fn tight_samples_stop_at_the_minimum() {
        let plan = Plan::new(10, None, 1000);
        assert_eq!(plan.max, 40);
        let t = time_pairs(&plan, 7, noisy(0.001)).unwrap();
        assert_eq!((t.repeats(), t.stop), (10, Stop::Precise));
        assert!(t.low <= t.ratio && t.ratio <= t.high, "{t:?}");
        assert!((t.high - t.low) / 2.0 <= 0.01 * t.ratio);
        assert!(t.describe().starts_with("10 repeats (interval within"));
    }

    #[test]
    fn moderate_noise_takes_more_than_the_minimum_and_less_than_the_cap() {
        let plan = Plan::new(10, Some(1000), 1000);
        let t = time_pairs(&plan, 7, noisy(0.05)).unwrap();
        assert_eq!(t.stop, Stop::Precise);
        assert!(t.repeats() > 10 && t.repeats() < 1000, "{}", t.repeats());
        // Deterministic: the same times stop at the same count.
        assert_eq!(t, time_pairs(&plan, 7, noisy(0.05)).unwrap());
    }

    #[test]
    fn noisy_samples_reach_the_cap_exactly() {
        let plan = Plan::new(10, Some(25), 1000);
        let t = time_pairs(&plan, 7, noisy(0.9)).unwrap();
        assert_eq!((t.repeats(), t.stop), (25, Stop::Capped));
        assert!(t.describe().contains("cap reached"));
    }

    #[test]
    fn the_cap_is_bounded_and_never_below_the_minimum() {
        assert_eq!(Plan::new(30, None, 100).max, 100);
        assert_eq!(Plan::new(30, Some(5), 100).max, 30);
        let plan = Plan::new(12, Some(3), 100);
        let t = time_pairs(&plan, 1, noisy(0.9)).unwrap();
        assert_eq!((t.repeats(), t.stop), (12, Stop::Capped));
    }

    #[test]
    fn a_mutant_stops_once_the_interval_fails_at_its_first_look_or_later() {
        // Ratio ~2 against a bound of 3: failed at the first look, before
        // the minimum.
        let plan = Plan::new(10, Some(1000), 1000).fail_fast_if(true, Comparator::Ge, 3.0);
        let t = time_pairs(&plan, 7, noisy(0.3)).unwrap();
        assert_eq!((t.repeats(), t.stop), (MUTANT_FIRST_LOOK, Stop::Failed));
        assert!(t.high < 3.0);
        // A minimum below the first look is the first look.
        let short = Plan::new(3, Some(1000), 1000).fail_fast_if(true, Comparator::Ge, 3.0);
        assert_eq!(time_pairs(&short, 7, noisy(0.3)).unwrap().repeats(), 3);
        // The same noise without a mutant times on to the cap or precision.
        let real = Plan::new(10, Some(1000), 1000).fail_fast_if(false, Comparator::Ge, 3.0);
        assert!(time_pairs(&real, 7, noisy(0.3)).unwrap().repeats() > 10);
        // An upper bound fails when the whole interval lies above it.
        let le = Plan::new(10, Some(1000), 1000).fail_fast_if(true, Comparator::Le, 1.5);
        assert_eq!(time_pairs(&le, 7, noisy(0.3)).unwrap().stop, Stop::Failed);
        // A mutant whose interval straddles the bound is not cut short: it
        // times its minimum and on.
        let close = Plan::new(10, Some(40), 1000).fail_fast_if(true, Comparator::Ge, 2.0);
        let t = time_pairs(&close, 7, noisy(0.9)).unwrap();
        assert_ne!(t.stop, Stop::Failed);
        assert!(t.repeats() >= 10);
    }

    #[test]
    fn a_mutant_stops_at_the_pair_that_settles_it_between_its_first_look_and_the_minimum() {
        // Ratio 1 against a bound of 1.05, but the first pair is 10% off:
        // the interval of the first few pairs reaches past the bound. Every
        // later pair is exact, so the interval falls below the bound at some
        // pair after the first look and before the minimum of 10.
        let times = [(1.1, 1.0), (1.0, 1.0), (1.0, 1.0)];
        let mut k = 0;
        let sampler = || {
            let t = times.get(k).copied().unwrap_or((1.0, 1.0));
            k += 1;
            Ok::<_, String>(t)
        };
        let plan = Plan::new(10, Some(40), 1000).fail_fast_if(true, Comparator::Ge, 1.05);
        let t = time_pairs(&plan, 7, sampler).unwrap();
        assert_eq!(t.stop, Stop::Failed);
        assert!(t.repeats() > MUTANT_FIRST_LOOK && t.repeats() < 10, "{t:?}");
        assert_eq!(k, t.repeats(), "no pair timed past the one that settled it");
    }

    #[test]
    fn a_mutant_that_has_not_failed_times_its_minimum_however_tight() {
        // Ratio 1 against a bound of 0.5: never failing, and precise from
        // the first look. A mutant looks early only to stop once failed;
        // a passing interval is judged on the contract's `repeats`.
        let plan = Plan::new(10, Some(1000), 1000).fail_fast_if(true, Comparator::Ge, 0.5);
        let t = time_pairs(&plan, 7, noisy(0.001)).unwrap();
        assert_eq!((t.repeats(), t.stop), (10, Stop::Precise));
    }

    #[test]
    fn a_cap_below_the_minimum_or_above_the_bound_is_refused() {
        assert_eq!(check_cap(10, None, 100), Ok(()));
        assert_eq!(check_cap(10, Some(10), 100), Ok(()));
        let low = check_cap(10, Some(9), 100).unwrap_err();
        assert_eq!(low, "`max_repeats` (9) must be at least `repeats` (10)");
        let high = check_cap(10, Some(101), 100).unwrap_err();
        assert_eq!(high, "max_repeats: 101 is above its bound of 100");
    }

    #[test]
    fn a_sampler_error_ends_timing() {
        let mut calls = 0;
        let r = time_pairs(&Plan::new(10, None, 100), 1, || {
            calls += 1;
            if calls == 4 {
                Err("launch failed")
            } else {
                Ok((1.0, 1.0))
            }
        });
        assert_eq!(r, Err("launch failed"));
        assert_eq!(calls, 4);
    }
}
