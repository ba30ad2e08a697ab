//! Timing helpers: CUDA-event timing of a region (optionally replayed as a
//! captured CUDA graph, so launch gaps of many small kernels do not hide the
//! kernels), medians, and a seeded bootstrap interval of a ratio of medians.
//!
//! The statistics are plain functions of sample slices, so they are tested
//! without a GPU.

use cudarc::driver::{sys, CudaGraph};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::context::GpuContext;
use crate::error::{Error, Result};

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

/// A timing event (timing enabled) recorded on the work stream now.
fn mark(gpu: &GpuContext) -> Result<cudarc::driver::CudaEvent> {
    Ok(gpu
        .stream()
        .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?)
}

/// Times `body` with CUDA events: `warmup` untimed runs, then `repeats` runs
/// each between two events on the work stream. Returns the per-run times in
/// milliseconds, each divided by `per_run` (the operations one run holds).
pub fn time_events(
    gpu: &mut GpuContext,
    warmup: usize,
    repeats: usize,
    per_run: usize,
    mut body: impl FnMut(&mut GpuContext) -> Result<()>,
) -> Result<Vec<f64>> {
    for _ in 0..warmup {
        body(gpu)?;
    }
    gpu.synchronize()?;
    let mut marks = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        let start = mark(gpu)?;
        body(gpu)?;
        let end = mark(gpu)?;
        marks.push((start, end));
    }
    gpu.synchronize()?;
    let per = per_run.max(1) as f64;
    let mut out = Vec::with_capacity(repeats);
    for (start, end) in &marks {
        out.push(f64::from(start.elapsed_ms(end)?) / per);
    }
    Ok(out)
}

/// Captures `launches` calls of `body(gpu, i)` (i = 0..launches) into one
/// CUDA graph. `body` must already have run once outside capture, so that
/// every module it uses is compiled and loaded (capture forbids neither, but
/// a compilation would be timed). Capture is always ended, also when `body`
/// fails, so the stream is usable afterwards.
pub fn capture(
    gpu: &mut GpuContext,
    launches: usize,
    mut body: impl FnMut(&mut GpuContext, usize) -> Result<()>,
) -> Result<CudaGraph> {
    gpu.synchronize()?;
    gpu.stream()
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let mut outcome = Ok(());
    for i in 0..launches {
        outcome = body(gpu, i);
        if outcome.is_err() {
            break;
        }
    }
    let graph = gpu.stream().end_capture(sys::CUgraphInstantiate_flags(0));
    outcome?;
    let graph = graph?.ok_or_else(|| Error::InvalidArgument {
        op: "timing",
        message: "stream capture produced no graph".into(),
    })?;
    graph.upload()?;
    Ok(graph)
}

/// Times `launches` calls of `body(gpu, i)` replayed as one captured graph:
/// one eager pass (compiles and warms), capture, `warmup` untimed replays,
/// then `repeats` timed replays. Returns per-call milliseconds (replay time
/// divided by `launches`).
pub fn time_graph(
    gpu: &mut GpuContext,
    launches: usize,
    warmup: usize,
    repeats: usize,
    mut body: impl FnMut(&mut GpuContext, usize) -> Result<()>,
) -> Result<Vec<f64>> {
    for i in 0..launches {
        body(gpu, i)?;
    }
    let graph = capture(gpu, launches, &mut body)?;
    time_events(gpu, warmup, repeats, launches, |_| Ok(graph.launch()?))
}

#[cfg(test)]
mod tests {
    use super::*;

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
