//! `property` execution over proptest-generated inputs.
//!
//! Cases are drawn from a proptest strategy with a `TestRunner` seeded from the
//! trial seed. Every case is measured (no early stop, no shrinking): the metric
//! is the worst deviation from the exact invariant over all cases, and a
//! non-finite deviation is reported as the worst of all.

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{Params, Property};
use crate::check::stats::Worst;
use crate::check::{Comparator, Measurement, TrialContext};
use crate::error::{Error, Result};
use crate::mutant::{reference_ops as faulty, Mutant};
use crate::reference::{cross_entropy, rmsnorm, rope, softmax};

/// RMSNorm epsilon of the model presets.
const RMSNORM_EPS: f64 = 1e-6;

pub fn measure(p: &Params, cx: &mut TrialContext<'_>) -> Result<Measurement> {
    let m = cx.mutant;
    let is = |x: Mutant| m == Some(x);
    match p.property {
        Property::Nf4RoundTripBound
        | Property::ClipBoundsGlobalNorm
        | Property::ClipLeavesSmallUntouched
        | Property::AdamwFirstStepMovesByLr => super::optim::measure(p, cx),
        Property::SoftmaxRowsSumToOne => run(p, cx.seed, softmax_strategy(), |c| {
            softmax_sum(c, is(Mutant::SoftmaxWithoutMaxSubtraction))
        }),
        Property::SoftmaxShiftInvariant => run(p, cx.seed, shift_strategy(), |c| {
            softmax_shift(c, is(Mutant::SoftmaxWithoutMaxSubtraction))
        }),
        Property::RmsnormScaleInvariant => run(p, cx.seed, rmsnorm_strategy(), |c| {
            rmsnorm_scale(c, is(Mutant::RmsnormWithoutNormalisation))
        }),
        Property::RopePreservesNorm => run(p, cx.seed, rope_strategy(), |c| {
            rope_norm(c, is(Mutant::RopeUnbalancedRotation))
        }),
        Property::RopeInverseRoundTrip => run(p, cx.seed, rope_strategy(), |c| {
            rope_round_trip(c, is(Mutant::RopeInverseSameDirection))
        }),
        Property::CrossEntropyNonNegative => run(p, cx.seed, xent_strategy(), |c| {
            xent_non_negative(c, is(Mutant::CrossEntropyWithoutLogSumExp))
        }),
        Property::CrossEntropyGradSumsToZero => run(p, cx.seed, xent_strategy(), |c| {
            xent_grad_sum(c, is(Mutant::CrossEntropyGradMissingSoftmax))
        }),
    }
}

/// The metric and unit each property reports.
fn metric(property: Property) -> (&'static str, &'static str) {
    match property {
        Property::SoftmaxRowsSumToOne => ("max_abs_row_sum_error", "abs"),
        Property::SoftmaxShiftInvariant => ("max_abs_diff_after_shift", "abs"),
        Property::RmsnormScaleInvariant => ("max_abs_diff_after_scaling", "abs"),
        Property::RopePreservesNorm => ("max_rel_norm_change", "ratio"),
        Property::RopeInverseRoundTrip => ("max_rel_round_trip_error", "ratio"),
        Property::CrossEntropyNonNegative => ("max_negative_loss", "nats"),
        Property::CrossEntropyGradSumsToZero => ("max_abs_grad_row_sum", "abs"),
        _ => ("deviation", ""),
    }
}

/// Draws `params.cases` values of `strategy` with a runner seeded from `seed`,
/// measures the deviation of each, and reports the worst.
fn run<S: Strategy>(
    p: &Params,
    seed: u64,
    strategy: S,
    deviation: impl Fn(&S::Value) -> Result<(f64, String)>,
) -> Result<Measurement> {
    let mut bytes = [0u8; 32];
    ChaCha8Rng::seed_from_u64(seed).fill_bytes(&mut bytes);
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &bytes);
    let cases = p.cases.0;
    let mut runner = TestRunner::new_with_rng(Config::with_cases(cases as u32), rng);
    let mut worst = Worst::default();
    for case in 0..cases {
        let tree = strategy
            .new_tree(&mut runner)
            .map_err(|reason| Error::InvalidArgument {
                op: "property",
                message: format!("could not generate case {case}: {reason}"),
            })?;
        let (dev, what) = deviation(&tree.current())?;
        worst.offer(dev, || format!("case {case}: {what}"));
    }
    let (name, unit) = metric(p.property);
    let detail = format!(
        "{cases} cases; worst {:.3e} at {}",
        worst.value(),
        worst.what()
    );
    Ok(
        Measurement::new(name, worst.value(), Comparator::Le, p.tolerance.0, unit)
            .with_detail(detail),
    )
}

// ---- softmax ---------------------------------------------------------------------

/// `(rows, seq, logits)` with magnitudes from O(1) up to 1e4.
type SoftmaxCase = (usize, usize, Vec<f64>);

fn softmax_strategy() -> impl Strategy<Value = SoftmaxCase> {
    (1usize..=6, 1usize..=16, select(vec![1.0, 30.0, 1e3, 1e4]))
        .prop_flat_map(|(rows, seq, mag)| (Just(rows), Just(seq), vec(-mag..mag, rows * seq)))
}

fn softmax_fwd(x: &[f64], rows: usize, seq: usize, faulty_fwd: bool) -> Result<Vec<f64>> {
    if faulty_fwd {
        faulty::softmax_without_max_subtraction(x, rows, seq)
    } else {
        softmax::forward(x, rows, seq)
    }
}

fn max_abs(x: &[f64]) -> f64 {
    x.iter().fold(0.0, |a, v| a.max(v.abs()))
}

/// Deviation of one case: `max_r |sum_j y_rj - 1|`, and any nonzero masked output.
fn softmax_sum((rows, seq, x): &SoftmaxCase, faulty_fwd: bool) -> Result<(f64, String)> {
    let (rows, seq) = (*rows, *seq);
    let y = softmax_fwd(x, rows, seq, faulty_fwd)?;
    let mut worst = Worst::default();
    for r in 0..rows {
        let n = softmax::visible(r, seq);
        let row = &y[r * seq..(r + 1) * seq];
        let sum_err = (row[..n].iter().sum::<f64>() - 1.0).abs();
        worst.offer(sum_err, || format!("row {r} sum error"));
        worst.offer(max_abs(&row[n..]), || format!("row {r} masked output"));
    }
    let what = format!(
        "{} of [{rows}x{seq}], |logit| <= {:.1e}",
        worst.what(),
        max_abs(x)
    );
    Ok((worst.value(), what))
}

/// `(rows, seq, logits, shift)`.
type ShiftCase = (usize, usize, Vec<f64>, f64);

fn shift_strategy() -> impl Strategy<Value = ShiftCase> {
    (softmax_strategy(), -1e3..1e3f64).prop_map(|((rows, seq, x), c)| (rows, seq, x, c))
}

/// `max |softmax(x + c) - softmax(x)|`.
fn softmax_shift((rows, seq, x, c): &ShiftCase, faulty_fwd: bool) -> Result<(f64, String)> {
    let shifted: Vec<f64> = x.iter().map(|v| v + c).collect();
    let a = softmax_fwd(x, *rows, *seq, faulty_fwd)?;
    let b = softmax_fwd(&shifted, *rows, *seq, faulty_fwd)?;
    let dev = max_diff(&a, &b);
    Ok((
        dev,
        format!(
            "[{rows}x{seq}], shift {c:.3e}, |logit| <= {:.1e}",
            max_abs(x)
        ),
    ))
}

/// `max_i |a_i - b_i|`, NaN when either side is NaN.
fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    let mut worst = Worst::default();
    for (x, y) in a.iter().zip(b) {
        worst.offer((x - y).abs(), String::new);
    }
    worst.value()
}

// ---- RMSNorm ---------------------------------------------------------------------

/// `(rows, hidden, x, gamma, c)` with `c = 10^u`, `u in [-3, 3]`.
type RmsnormCase = (usize, usize, Vec<f64>, Vec<f64>, f64);

fn rmsnorm_strategy() -> impl Strategy<Value = RmsnormCase> {
    (1usize..=4, 1usize..=40, -3.0..3.0f64).prop_flat_map(|(rows, hidden, u)| {
        (
            Just(rows),
            Just(hidden),
            vec(-1.0..1.0f64, rows * hidden),
            vec(-2.0..2.0f64, hidden),
            Just(10f64.powf(u)),
        )
    })
}

/// `max |RMSNorm_{c^2 eps}(c x) - RMSNorm_eps(x)|`. Scaling eps by `c^2` makes the
/// invariance exact: `c x / sqrt(c^2 ms + c^2 eps) = x / sqrt(ms + eps)`.
fn rmsnorm_scale(
    (rows, hidden, x, gamma, c): &RmsnormCase,
    unnormalised: bool,
) -> Result<(f64, String)> {
    let (rows, hidden, c) = (*rows, *hidden, *c);
    let cx: Vec<f64> = x.iter().map(|v| v * c).collect();
    let (a, b) = if unnormalised {
        (
            faulty::rmsnorm_without_normalisation(x, gamma, rows, hidden)?,
            faulty::rmsnorm_without_normalisation(&cx, gamma, rows, hidden)?,
        )
    } else {
        (
            rmsnorm::forward(x, gamma, rows, hidden, RMSNORM_EPS)?,
            rmsnorm::forward(&cx, gamma, rows, hidden, RMSNORM_EPS * c * c)?,
        )
    };
    Ok((max_diff(&a, &b), format!("[{rows}x{hidden}], c = {c:.3e}")))
}

// ---- RoPE ------------------------------------------------------------------------

/// `(batch, seq, heads, head_dim, theta, x)`.
type RopeCase = (usize, usize, usize, usize, f64, Vec<f64>);

fn rope_strategy() -> impl Strategy<Value = RopeCase> {
    (
        1usize..=2,
        2usize..=9,
        1usize..=3,
        1usize..=8,
        select(vec![10.0, 1e4, 1e6]),
        select(vec![1.0, 1e3]),
    )
        .prop_flat_map(|(b, s, h, half, theta, mag)| {
            let d = 2 * half;
            (
                Just(b),
                Just(s),
                Just(h),
                Just(d),
                Just(theta),
                vec(-mag..mag, b * s * h * d),
            )
        })
}

fn rope_text(b: usize, s: usize, h: usize, d: usize, theta: f64) -> String {
    format!("[{b}x{s}x{h}x{d}], theta {theta:e}")
}

/// `max over head vectors of | ||y|| - ||x|| | / ||x||`.
fn rope_norm(&(b, s, h, d, theta, ref x): &RopeCase, unbalanced: bool) -> Result<(f64, String)> {
    let y = if unbalanced {
        faulty::rope_unbalanced_rotation(x, b, s, h, d, theta)?
    } else {
        rope::forward(x, b, s, h, d, theta)?
    };
    let mut worst = Worst::default();
    for (v, (xv, yv)) in x.chunks(d).zip(y.chunks(d)).enumerate() {
        let nx = xv.iter().map(|a| a * a).sum::<f64>().sqrt();
        let ny = yv.iter().map(|a| a * a).sum::<f64>().sqrt();
        worst.offer((ny - nx).abs() / nx.max(f64::MIN_POSITIVE), || {
            format!("head vector {v}")
        });
    }
    Ok((
        worst.value(),
        format!("{} of {}", worst.what(), rope_text(b, s, h, d, theta)),
    ))
}

/// `max |inverse(rope(x)) - x| / max |x|`.
fn rope_round_trip(
    &(b, s, h, d, theta, ref x): &RopeCase,
    same_direction: bool,
) -> Result<(f64, String)> {
    let y = rope::forward(x, b, s, h, d, theta)?;
    let back = if same_direction {
        faulty::rope_inverse_same_direction(&y, b, s, h, d, theta)?
    } else {
        rope::inverse(&y, b, s, h, d, theta)?
    };
    let dev = max_diff(&back, x) / max_abs(x).max(f64::MIN_POSITIVE);
    Ok((dev, rope_text(b, s, h, d, theta)))
}

// ---- cross-entropy ---------------------------------------------------------------

/// `(rows, vocab, logits, targets)`.
type XentCase = (usize, usize, Vec<f64>, Vec<u32>);

fn xent_strategy() -> impl Strategy<Value = XentCase> {
    (1usize..=4, 2usize..=64, select(vec![1.0, 30.0, 1e4])).prop_flat_map(|(rows, vocab, mag)| {
        (
            Just(rows),
            Just(vocab),
            vec(-mag..mag, rows * vocab),
            vec(0..vocab as u32, rows),
        )
    })
}

/// How far `loss` is below zero; NaN stays NaN (`f64::max` would hide it).
fn below_zero(loss: f64) -> f64 {
    if loss.is_nan() {
        f64::NAN
    } else {
        (-loss).max(0.0)
    }
}

/// `max(0, -min_r loss_r)`: how far below zero any row loss (or the mean) goes.
fn xent_non_negative((rows, vocab, x, t): &XentCase, without_lse: bool) -> Result<(f64, String)> {
    let (rows, vocab) = (*rows, *vocab);
    let (losses, mean) = if without_lse {
        (
            faulty::cross_entropy_row_losses_without_lse(x, rows, vocab, t)?,
            faulty::cross_entropy_without_lse(x, rows, vocab, t)?,
        )
    } else {
        (
            cross_entropy::row_losses(x, rows, vocab, t)?,
            cross_entropy::forward(x, rows, vocab, t)?,
        )
    };
    let mut worst = Worst::default();
    worst.offer(below_zero(mean), || "mean loss".into());
    for (r, l) in losses.iter().enumerate() {
        worst.offer(below_zero(*l), || format!("row {r}"));
    }
    let what = format!(
        "{} of [{rows}x{vocab}], |logit| <= {:.1e}",
        worst.what(),
        max_abs(x)
    );
    Ok((worst.value(), what))
}

/// `max_r |sum_j dlogits_rj|`.
fn xent_grad_sum((rows, vocab, x, t): &XentCase, missing_softmax: bool) -> Result<(f64, String)> {
    let (rows, vocab) = (*rows, *vocab);
    let g = if missing_softmax {
        faulty::cross_entropy_grad_missing_softmax(x, rows, vocab, t)?
    } else {
        cross_entropy::backward(x, rows, vocab, t)?
    };
    let mut worst = Worst::default();
    for (r, row) in g.chunks(vocab).enumerate() {
        worst.offer(row.iter().sum::<f64>().abs(), || format!("row {r}"));
    }
    let what = format!(
        "{} of [{rows}x{vocab}], |logit| <= {:.1e}",
        worst.what(),
        max_abs(x)
    );
    Ok((worst.value(), what))
}
