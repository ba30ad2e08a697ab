//! `property` execution for NF4, clipping and AdamW.
//!
//! Inputs come from proptest strategies driven by a `TestRunner` seeded from
//! the trial seed, so every run draws the same cases. Rather than stopping at
//! the first counterexample, each property measures its metric on every case
//! and reports the worst one, so the CSV says how close the claim came to
//! failing.

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

use super::{Params, Property};
use crate::check::{Comparator, Measurement, TrialContext};
use crate::error::{Error, Result};
use crate::mutant::{optim, Mutant};
use crate::reference::adamw::{AdamState, AdamW};
use crate::reference::{clip, nf4};
use qlora::train::ClipMode;

pub fn measure(p: &Params, cx: &mut TrialContext<'_>) -> Result<Measurement> {
    let mut runner = seeded_runner(cx.seed, p.cases.0);
    let tol = p.tolerance.0;
    match p.property {
        Property::Nf4RoundTripBound => nf4_round_trip_bound(&mut runner, p.cases.0, tol, cx.mutant),
        Property::ClipBoundsGlobalNorm => {
            clip_bounds_global_norm(&mut runner, p.cases.0, tol, cx.mutant)
        }
        Property::ClipLeavesSmallUntouched => {
            clip_leaves_small_untouched(&mut runner, p.cases.0, tol, cx.mutant)
        }
        Property::AdamwFirstStepMovesByLr => {
            adamw_first_step_moves_by_lr(&mut runner, p.cases.0, tol, cx.mutant)
        }
        other => Err(Error::InvalidArgument {
            op: "property",
            message: format!("{other:?} is not an NF4, clipping or AdamW property"),
        }),
    }
}

/// A proptest runner whose ChaCha stream is fixed by `seed`.
fn seeded_runner(seed: u64, cases: usize) -> TestRunner {
    let mut bytes = [0u8; 32];
    for (i, chunk) in bytes.chunks_mut(8).enumerate() {
        // Four different words, so the 32-byte ChaCha key is not one word repeated.
        let word = seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    let config = Config {
        cases: u32::try_from(cases).unwrap_or(u32::MAX),
        ..Config::default()
    };
    TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes))
}

/// One value drawn from `strategy`.
fn draw<S: Strategy>(strategy: &S, runner: &mut TestRunner) -> Result<S::Value> {
    strategy
        .new_tree(runner)
        .map(|tree| tree.current())
        .map_err(|reason| Error::InvalidArgument {
            op: "property",
            message: format!("could not generate a case: {reason}"),
        })
}

/// Gradient tensors ("layers") with very different norms, so some cases sit
/// far below and some far above any `max_norm`.
fn layered_grads() -> impl Strategy<Value = Vec<Vec<f64>>> {
    vec(
        (vec(-1.0f64..1.0, 1..48), -2.0f64..2.0)
            .prop_map(|(g, e)| g.iter().map(|v| v * 10f64.powf(e)).collect::<Vec<f64>>()),
        2..=6,
    )
}

fn global_norm(t: &[Vec<f64>]) -> f64 {
    let refs: Vec<&[f64]> = t.iter().map(Vec::as_slice).collect();
    clip::squared_sum(&refs).sqrt()
}

/// Per block: `max_i |w_i - deq_i| <= (widest gap / 2) * absmax`. Metric: the
/// worst ratio of the observed error to that bound.
fn nf4_round_trip_bound(
    runner: &mut TestRunner,
    cases: usize,
    tol: f64,
    mutant: Option<Mutant>,
) -> Result<Measurement> {
    let strategy = (1usize..=4, -3.0f64..3.0)
        .prop_flat_map(|(blocks, e)| (vec(-1.0f64..1.0, blocks * nf4::BLOCK), Just(10f64.powf(e))));
    let half_gap = nf4::widest_gap() / 2.0;
    let mut worst = 0.0f64;
    let mut worst_at = String::from("none");
    let mut blocks = 0usize;
    for case in 0..cases {
        let (raw, s) = draw(&strategy, runner)?;
        let w: Vec<f64> = raw.iter().map(|v| v * s).collect();
        let q = optim::nf4_quantize(&w, nf4::BLOCK, mutant)?;
        let d = nf4::dequantize(&q);
        for (b, (wb, db)) in w.chunks(nf4::BLOCK).zip(d.chunks(nf4::BLOCK)).enumerate() {
            blocks += 1;
            let err = wb
                .iter()
                .zip(db)
                .fold(0.0f64, |m, (a, c)| m.max((a - c).abs()));
            let bound = half_gap * q.absmax[b];
            let ratio = if bound > 0.0 {
                err / bound
            } else if err == 0.0 {
                0.0
            } else {
                f64::INFINITY
            };
            if ratio > worst || ratio.is_nan() {
                worst = ratio;
                worst_at = format!(
                    "case {case} block {b}: absmax {:.3e}, error {err:.3e}",
                    q.absmax[b]
                );
            }
        }
    }
    Ok(Measurement::new(
        "nf4_error_over_half_gap_bound",
        worst,
        Comparator::Le,
        1.0 + tol,
        "ratio",
    )
    .with_detail(format!(
        "{cases} cases, {blocks} blocks of {}; bound = {half_gap:.6} x absmax; worst {worst_at}",
        nf4::BLOCK
    )))
}

/// After global clipping, `||g|| <= max_norm (1 + tol)`. Metric: the worst
/// `||g_clipped|| / max_norm`. The layers of a case are its generated tensors,
/// so a per-layer clip can leave the global norm at up to `sqrt(layers) x max_norm`.
fn clip_bounds_global_norm(
    runner: &mut TestRunner,
    cases: usize,
    tol: f64,
    mutant: Option<Mutant>,
) -> Result<Measurement> {
    let strategy = (layered_grads(), -1.0f64..1.0);
    let mut worst = 0.0f64;
    let mut worst_at = String::from("none");
    let mut clipped = 0usize;
    for case in 0..cases {
        let (mut g, e) = draw(&strategy, runner)?;
        let max_norm = 10f64.powf(e);
        let before = global_norm(&g);
        let groups: Vec<usize> = (0..g.len()).collect();
        optim::clip(&mut g, &groups, ClipMode::Global, max_norm, mutant)?;
        if before > max_norm {
            clipped += 1;
        }
        let ratio = global_norm(&g) / max_norm;
        if ratio > worst || ratio.is_nan() {
            worst = ratio;
            worst_at = format!(
                "case {case}: {} layers, norm {before:.3e} -> {:.3e}, max_norm {max_norm:.3e}",
                g.len(),
                ratio * max_norm
            );
        }
    }
    let mut m = Measurement::new(
        "clipped_norm_over_max_norm",
        worst,
        Comparator::Le,
        1.0 + tol,
        "ratio",
    )
    .with_detail(format!(
        "{cases} cases, {clipped} with norm above max_norm; worst {worst_at}"
    ));
    if clipped == 0 {
        m.violate("no case had a norm above max_norm: the clip was never exercised");
    }
    Ok(m)
}

/// Gradients whose global norm is below `max_norm` come out unchanged.
/// Metric: the largest `|g_after - g_before|` over all cases.
fn clip_leaves_small_untouched(
    runner: &mut TestRunner,
    cases: usize,
    tol: f64,
    mutant: Option<Mutant>,
) -> Result<Measurement> {
    // Target norm as a fraction of max_norm: well inside the ball, but up to
    // 0.99 of it so the `+1e-6` in the scale cannot matter.
    let strategy = (layered_grads(), -1.0f64..1.0, 0.01f64..0.99);
    let mut worst = 0.0f64;
    let mut worst_at = String::from("every case unchanged");
    for case in 0..cases {
        let (raw, e, frac) = draw(&strategy, runner)?;
        let max_norm = 10f64.powf(e);
        let n = global_norm(&raw);
        if n == 0.0 {
            continue;
        }
        let k = frac * max_norm / n;
        let before: Vec<Vec<f64>> = raw
            .iter()
            .map(|t| t.iter().map(|v| v * k).collect())
            .collect();
        let mut after = before.clone();
        let groups: Vec<usize> = (0..after.len()).collect();
        optim::clip(&mut after, &groups, ClipMode::Global, max_norm, mutant)?;
        let change = before
            .iter()
            .flatten()
            .zip(after.iter().flatten())
            .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
        if change > worst || change.is_nan() {
            worst = change;
            worst_at = format!(
                "case {case}: norm {:.3e} = {frac:.3} x max_norm {max_norm:.3e}",
                frac * max_norm
            );
        }
    }
    Ok(
        Measurement::new("max_abs_change", worst, Comparator::Le, tol, "abs").with_detail(format!(
            "{cases} cases with norm in [0.01, 0.99] x max_norm; worst {worst_at}"
        )),
    )
}

/// With zero weight decay, AdamW's first step moves each coordinate by `lr`
/// against its gradient (`mhat = g`, `vhat = g^2`). Gradients are drawn with
/// `|g| >= 1e-2`, so `eps / |g| <= 1e-6`. Metric: the worst
/// `| -(p1 - p0) sign(g) / lr - 1 |`, which also catches a step in the wrong
/// direction.
fn adamw_first_step_moves_by_lr(
    runner: &mut TestRunner,
    cases: usize,
    tol: f64,
    mutant: Option<Mutant>,
) -> Result<Measurement> {
    let coord = (-1.0f64..1.0, any::<bool>(), -2.0f64..1.0);
    let strategy = (vec(coord, 1..64), -4.0f64..-1.0);
    let mut worst = 0.0f64;
    let mut worst_at = String::from("none");
    for case in 0..cases {
        let (coords, lr_exp) = draw(&strategy, runner)?;
        let lr = 10f64.powf(lr_exp);
        let p0: Vec<f64> = coords.iter().map(|c| c.0).collect();
        let g: Vec<f64> = coords
            .iter()
            .map(|&(_, neg, e)| if neg { -(10f64.powf(e)) } else { 10f64.powf(e) })
            .collect();
        let opt = AdamW::new(lr, 0.0);
        let mut p = p0.clone();
        let mut st = AdamState::new(p.len());
        optim::adamw_step(&opt, &mut p, &g, &mut st, mutant)?;
        for i in 0..p.len() {
            let moved = -(p[i] - p0[i]) * g[i].signum() / lr;
            let dev = (moved - 1.0).abs();
            if dev > worst || dev.is_nan() {
                worst = dev;
                worst_at = format!(
                    "case {case} coordinate {i}: g {:.3e}, lr {lr:.3e}, moved {moved:.6} x lr",
                    g[i]
                );
            }
        }
    }
    Ok(Measurement::new(
        "max_step_over_lr_deviation",
        worst,
        Comparator::Le,
        tol,
        "ratio",
    )
    .with_detail(format!(
        "{cases} cases, |g| in [1e-2, 10], lr in [1e-4, 1e-1]; worst {worst_at}"
    )))
}
