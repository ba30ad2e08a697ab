//! `throughput_ratio` of the training step: baseline and candidate modes
//! alternated step by step.

use crate::check::training::*;
use crate::check::MutantFaults;
use crate::check::{require_gpu, Comparator, Measurement, TrialContext};
use crate::error::Result;
use qlora::gpu::GpuContext;
use qlora::train::GpuTrainer;

use super::Params;

/// `subject: train_step`. Passes when `median(t_baseline) / median(t_candidate)
/// >= min_ratio`. Both trainers (same seed, so the same model and batches)
/// run `warmup` untimed steps (at least 2, so a graphed mode has captured
/// and replayed once), then timed steps, alternating baseline and candidate
/// so drift hits both alike: `repeats` pairs at least, then more until the
/// ratio's interval is within +-1% or `max_repeats` pairs
/// ([`time_pairs`](crate::check::repeats::time_pairs)); a mutant stops as
/// soon as the interval lies below `min_ratio`. The 95% bootstrap interval of the
/// ratio goes to `speedups.csv`; tokens per second go to the detail.
pub(super) fn throughput_ratio(p: &Params, cx: &mut TrialContext<'_>) -> Result<Measurement> {
    use crate::check::repeats::time_pairs;
    use crate::check::stats::median;
    let cfg = p.config();
    let seed = cx.seed;
    let base_opts = p.baseline.speed_options();
    let cand_opts = p.candidate.speed_options();
    // The mutant's faults are on for the candidate only (while it is built,
    // captured and stepped): the claim is about it.
    let faults = cx.faults();
    let mutant = cx.mutant.is_some();
    let gpu = require_gpu(cx)?;
    let mut tb = GpuTrainer::new(gpu, &cfg, base_opts, seed)?;
    let mut tc = GpuTrainer::new(&mut gpu.with_faults(faults), &cfg, cand_opts, seed)?;
    let cand_step = |gpu: &mut GpuContext, tc: &mut GpuTrainer, timed: bool| {
        let gpu: &mut GpuContext = &mut gpu.with_faults(faults);
        let tokens = tc.next_batch()?;
        if timed {
            timed_step(gpu, tc, &tokens)
        } else {
            tc.step_on(gpu, &tokens)?;
            Ok(0.0)
        }
    };
    for _ in 0..p.warmup.0.max(2) {
        tb.step(gpu)?;
        cand_step(gpu, &mut tc, false)?;
    }
    let plan = p.plan(mutant);
    let timed = time_pairs(&plan, seed, || {
        let tokens = tb.next_batch()?;
        let b = timed_step(gpu, &mut tb, &tokens)?;
        Ok::<_, crate::Error>((b, cand_step(gpu, &mut tc, true)?))
    })?;
    let (base_ms, cand_ms) = (&timed.baseline, &timed.candidate);
    let (mb, mc) = (median(base_ms), median(cand_ms));
    let (ratio, lo, hi) = (timed.ratio, timed.low, timed.high);
    let tokens = cfg.tokens() as f64;
    let mut m = Measurement::new("median_step_time_ratio", ratio, Comparator::Ge, p.min_ratio.0, "x")
        .with_detail(format!(
            "model {} batch {} seq {} on {}; baseline {} median {mb:.3} ms ({:.0} tokens/s); candidate {} median {mc:.3} ms ({:.0} tokens/s, graph {}); ratio 95% CI [{lo:.3}, {hi:.3}] over {}; weights uploaded in {:.0} and {:.0} ms",
            cfg.name,
            cfg.batch,
            cfg.seq_len,
            gpu.facts().name,
            p.baseline,
            tokens / mb * 1e3,
            p.candidate,
            tokens / mc * 1e3,
            if tc.graph_ready() { "replayed" } else { "not used" },
            timed.describe(),
            tb.setup().upload_ms,
            tc.setup().upload_ms,
        ));
    m.speedups.push(crate::check::Speedup {
        subject: "train_step".into(),
        model: cfg.name.into(),
        batch: cfg.batch,
        seq_len: cfg.seq_len,
        baseline: p.baseline.to_string(),
        candidate: p.candidate.to_string(),
        baseline_median_ms: mb,
        candidate_median_ms: mc,
        ratio,
        ratio_ci_low: lo,
        ratio_ci_high: hi,
        repeats: timed.repeats(),
        // Two trainers share the device here, so no one configuration's
        // peak can be told apart; `step_throughput` records it.
        peak_device_gib: None,
        baseline_peak_device_gib: None,
    });
    Ok(m)
}
