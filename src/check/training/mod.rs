//! Execution of the training checks on each backend.
//!
//! On `cpu` the checks run the reference training step
//! ([`crate::reference::train`]) on models small enough for CI; on `cuda` they
//! run the GPU step ([`super::GpuTrainer`]) from the same seeds, so both
//! backends train the same model on the same batches.

use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::check::params::BackwardMath;
use crate::check::params::{ClipMode, Hyper, Precision, StepMode};
use crate::check::trajectory_match::BaselineOn;
use crate::check::{
    gradient_parity, loss_descent, memory_budget, require_gpu, step_throughput, sync_count,
    throughput_ratio, trajectory_match, Comparator, Measurement, TrialContext,
};
use crate::contract::Backend;
use crate::error::{Error, Result};
use crate::mutant::Mutant;
use crate::reference::train::{
    Model, StepFaults, StepReport, TrainOptions, Trainer, BATCH_SALT, CORPUS_SALT,
};
use qlora::gpu::{GemmMath, GpuContext};
use qlora::model::{BaseModel, Corpus, ModelConfig, Trainable};
use qlora::train::{GpuTrainOptions, GpuTrainer};

/// The CPU reference trains in f64 with plain loops; beyond this many frozen
/// parameters a step takes seconds, so a contract asking for more on `cpu`
/// is refused instead of stalling the suite.
const CPU_MAX_BASE_PARAMS: usize = 1 << 20;

/// Evaluation batches for `loss_descent`: the loss before and after training
/// is measured on the same fixed batches, so batch-to-batch noise does not
/// enter the ratio.
const EVAL_BATCHES: usize = 4;
/// Mixed into the trial seed for the evaluation batches, a stream apart from
/// the training batches.
const EVAL_SALT: u64 = 0xe7a1;

/// Losses of `steps` GPU steps of a fresh trainer, and how many of the steps
/// replayed a captured graph.
fn gpu_losses(
    gpu: &mut GpuContext,
    cfg: &ModelConfig,
    options: GpuTrainOptions,
    steps: usize,
    seed: u64,
) -> Result<(Vec<f64>, usize)> {
    let mut t = GpuTrainer::new(gpu, cfg, options, seed)?;
    let mut losses = Vec::with_capacity(steps);
    let mut replayed = 0;
    for _ in 0..steps {
        let r = t.step(gpu)?;
        replayed += usize::from(r.replayed);
        losses.push(r.loss);
    }
    Ok((losses, replayed))
}

/// Losses of `steps` reference steps, and the clip summary of the run.
fn cpu_losses(
    cfg: &ModelConfig,
    options: TrainOptions,
    steps: usize,
    seed: u64,
) -> Result<(Vec<f64>, String)> {
    let reports = crate::reference::train::train(cfg, options, steps, seed)?;
    Ok((
        reports.iter().map(|r| r.loss).collect(),
        clip_summary(&reports),
    ))
}

/// The reference step's options for a contract's step mode, with the
/// faulty variant of `mutant`. The CPU has no CUDA graphs and computes in
/// f64, so a graphed mode or a GEMM math is refused rather than silently
/// run as something else.
fn reference_options(
    mode: &StepMode,
    hyper: Hyper,
    mutant: Option<Mutant>,
) -> Result<TrainOptions> {
    if mode.graph {
        return Err(Error::InvalidArgument {
            op: "train",
            message: format!("step mode {mode}: graph capture needs cuda"),
        });
    }
    if mode.backward_math != BackwardMath::Fp32 {
        return Err(Error::InvalidArgument {
            op: "train",
            message: format!(
                "step mode {mode}: the reference computes in f64; a GEMM math needs cuda"
            ),
        });
    }
    Ok(TrainOptions {
        clip: mode.clip,
        base: mode.base,
        hyper: hyper.to_stack(),
        faults: mutant.map_or(StepFaults::default(), Mutant::step_faults),
    })
}

fn cpu_model(cfg: &ModelConfig) -> Result<ModelConfig> {
    let base = cfg.layers * cfg.base_params_per_layer() + 2 * cfg.vocab * cfg.hidden;
    if base > CPU_MAX_BASE_PARAMS {
        return Err(Error::InvalidArgument {
            op: "train",
            message: format!(
                "model {} has {base} frozen parameters; the CPU reference step runs models up to {CPU_MAX_BASE_PARAMS} (use `tiny`, or run on cuda)",
                cfg.name
            ),
        });
    }
    Ok(*cfg)
}

/// How often clipping changed the gradients, for the detail column: steps
/// (global) or layer-steps (per layer) with `scale < 1`, and the mean
/// pre-clip norm of the clip groups.
fn clip_summary(reports: &[StepReport]) -> String {
    let groups: usize = reports.iter().map(|r| r.clip.len()).sum();
    let scaled: usize = reports
        .iter()
        .map(|r| r.clip.iter().filter(|c| c.scaled()).count())
        .sum();
    let norm: f64 = reports
        .iter()
        .flat_map(|r| r.clip.iter().map(|c| c.norm))
        .sum::<f64>()
        / groups.max(1) as f64;
    format!("clip scaled {scaled}/{groups} group-steps, mean pre-clip norm {norm:.3}")
}

fn mode_text(mode: &StepMode, hyper: &Hyper) -> String {
    format!(
        "{mode} (lr {:e}, max_grad_norm {:e}, wd {:e})",
        hyper.lr.0, hyper.max_grad_norm.0, hyper.weight_decay.0
    )
}

/// Passes when `eval_loss(after steps) <= max_fraction * eval_loss(before)`,
/// both on the same seeded evaluation batches of the corpus.
pub fn loss_descent(
    p: &loss_descent::Params,
    b: Backend,
    cx: &mut TrialContext<'_>,
) -> Result<Measurement> {
    if b == Backend::Cuda {
        return loss_descent_gpu(p, cx);
    }
    let cfg = cpu_model(&p.model.0)?;
    let options = reference_options(&p.mode, p.hyper, cx.mutant)?;
    let mut trainer = Trainer::new(&cfg, options, cx.seed)?;
    let eval = trainer.eval_batches(EVAL_BATCHES, cx.seed ^ EVAL_SALT)?;
    let initial = trainer.eval_loss(&eval)?;
    let mut reports = Vec::with_capacity(p.steps.0);
    for _ in 0..p.steps.0 {
        reports.push(trainer.step()?);
    }
    let last = trainer.eval_loss(&eval)?;
    let first_train = reports.first().map_or(f64::NAN, |r| r.loss);
    let last_train = reports.last().map_or(f64::NAN, |r| r.loss);
    Ok(Measurement::new(
        "final_over_initial_loss",
        last / initial,
        Comparator::Le,
        p.max_fraction.0,
        "ratio",
    )
    .with_detail(format!(
        "model {}, {} steps of {}; eval loss on {EVAL_BATCHES} fixed batches {initial:.4} -> {last:.4}; train loss step 1 {first_train:.4}, step {} {last_train:.4}; {}",
        cfg.name,
        p.steps.0,
        mode_text(&p.mode, &p.hyper),
        p.steps.0,
        clip_summary(&reports)
    )))
}

fn loss_descent_gpu(p: &loss_descent::Params, cx: &mut TrialContext<'_>) -> Result<Measurement> {
    let cfg = p.model.0;
    let seed = cx.seed;
    let options = p.mode.gpu_options(p.hyper);
    let faults = cx.faults();
    let mut scope = require_gpu(cx)?.with_faults(faults);
    let gpu: &mut GpuContext = &mut scope;
    let mut t = GpuTrainer::new(gpu, &cfg, options, seed)?;
    let eval = t.eval_batches(EVAL_BATCHES, seed ^ EVAL_SALT)?;
    let initial = t.eval_loss(gpu, &eval)?;
    let mut losses = Vec::with_capacity(p.steps.0);
    for _ in 0..p.steps.0 {
        losses.push(t.step(gpu)?.loss);
    }
    let last = t.eval_loss(gpu, &eval)?;
    let first_train = losses.first().copied().unwrap_or(f64::NAN);
    let last_train = losses.last().copied().unwrap_or(f64::NAN);
    Ok(Measurement::new(
        "final_over_initial_loss",
        last / initial,
        Comparator::Le,
        p.max_fraction.0,
        "ratio",
    )
    .with_detail(format!(
        "model {} on {}, {} GPU steps of {}; eval loss on {EVAL_BATCHES} fixed batches {initial:.4} -> {last:.4}; train loss step 1 {first_train:.4}, step {} {last_train:.4}",
        cfg.name,
        gpu.facts().name,
        p.steps.0,
        mode_text(&p.mode, &p.hyper),
        p.steps.0,
    )))
}

/// Passes when `max_c |loss_baseline(c) - loss_candidate(c)| <= max_abs_diff`.
/// Both runs start from the same seeded weights and see the same batches; the
/// trial's mutant is injected into the candidate only.
pub fn trajectory_match(
    p: &trajectory_match::Params,
    b: Backend,
    cx: &mut TrialContext<'_>,
) -> Result<Measurement> {
    let seed = cx.seed;
    let steps = p.steps.0;
    let (base, base_text) = if b == Backend::Cpu || p.baseline_on == BaselineOn::Cpu {
        let cfg = cpu_model(&p.model.0)?;
        let opts = reference_options(&p.baseline, p.hyper, None)?;
        let (l, clip) = cpu_losses(&cfg, opts, steps, seed)?;
        (
            l,
            format!("cpu reference {}: {clip}", mode_text(&p.baseline, &p.hyper)),
        )
    } else {
        let opts = p.baseline.gpu_options(p.hyper);
        let gpu = require_gpu(cx)?;
        let (l, replayed) = gpu_losses(gpu, &p.model.0, opts, steps, seed)?;
        (
            l,
            format!(
                "gpu {} ({replayed} graph replays)",
                mode_text(&p.baseline, &p.hyper)
            ),
        )
    };
    let (cand, cand_text) = if b == Backend::Cpu {
        let cfg = cpu_model(&p.model.0)?;
        let opts = reference_options(&p.candidate, p.hyper, cx.mutant)?;
        let (l, clip) = cpu_losses(&cfg, opts, steps, seed)?;
        (l, format!("{}: {clip}", mode_text(&p.candidate, &p.hyper)))
    } else {
        let opts = p.candidate.gpu_options(p.hyper);
        let faults = cx.faults();
        let mut scope = require_gpu(cx)?.with_faults(faults);
        let gpu: &mut GpuContext = &mut scope;
        let (l, replayed) = gpu_losses(gpu, &p.model.0, opts, steps, seed)?;
        (
            l,
            format!(
                "gpu {} on {} ({replayed} graph replays)",
                mode_text(&p.candidate, &p.hyper),
                gpu.facts().name
            ),
        )
    };
    let cfg = p.model.0;
    let mut worst = 0.0f64;
    let mut points = Vec::with_capacity(p.checkpoints.len());
    for c in &p.checkpoints {
        let at = |r: &[f64]| {
            r.get(c.0.wrapping_sub(1))
                .copied()
                .ok_or_else(|| Error::InvalidArgument {
                    op: "trajectory_match",
                    message: format!("checkpoint {} is outside steps 1..={}", c.0, p.steps.0),
                })
        };
        let (lb, lc) = (at(&base)?, at(&cand)?);
        let d = (lb - lc).abs();
        if d > worst || d.is_nan() {
            worst = d;
        }
        points.push(format!("step {}: {lb:.4} vs {lc:.4}", c.0));
    }
    Ok(Measurement::new(
        "max_abs_loss_diff",
        worst,
        Comparator::Le,
        p.max_abs_diff.0,
        "nats",
    )
    .with_detail(format!(
        "model {}, {} steps; baseline {base_text}; candidate {cand_text}; {}",
        cfg.name,
        p.steps.0,
        points.join(", ")
    )))
}

/// Passes when no host read happened while the step was being captured
/// (`inside <= max_inside_capture`) and no step read the host more than
/// `max_per_step` times. Every device-to-host read of the GPU step goes
/// through its counting `SyncCounter::host_read`; a read inside capture also
/// breaks the capture itself, which is reported as a violation.
pub fn sync_count(p: &sync_count::Params, cx: &mut TrialContext<'_>) -> Result<Measurement> {
    let cfg = p.model.0;
    let seed = cx.seed;
    let options = p.mode.gpu_options(Hyper::default());
    let faults = cx.faults();
    let mut scope = require_gpu(cx)?.with_faults(faults);
    let gpu: &mut GpuContext = &mut scope;
    let mut t = GpuTrainer::new(gpu, &cfg, options, seed)?;
    let mut failure = None;
    let mut replayed = 0usize;
    for _ in 0..p.steps.0 {
        match t.step(gpu) {
            Ok(r) => replayed += usize::from(r.replayed),
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    let syncs = t.syncs().clone();
    if syncs.inside_capture == 0 {
        // A failure with no host read inside capture is an error of the step
        // itself, not an observation of this check.
        if let Some(e) = failure {
            return Err(e.into());
        }
    }
    let max_step = syncs.per_step.iter().copied().max().unwrap_or(0);
    let mut m = Measurement::new(
        "host_syncs_inside_capture",
        syncs.inside_capture as f64,
        Comparator::Le,
        p.max_inside_capture as f64,
        "syncs",
    )
    .with_detail(format!(
        "model {} on {}, {} steps requested, {} finished, {replayed} graph replays; host reads: {} in all, {} inside capture, at most {max_step} per step (bound {})",
        cfg.name,
        gpu.facts().name,
        p.steps.0,
        syncs.per_step.len(),
        syncs.total,
        syncs.inside_capture,
        p.max_per_step
    ));
    if let Some(e) = failure {
        m.violate(format!("capture failed: {e}"));
    }
    if max_step > p.max_per_step {
        m.violate(format!(
            "a step made {max_step} host reads, more than {}",
            p.max_per_step
        ));
    }
    if p.steps.0 >= 2 && replayed == 0 {
        m.violate("the step was never replayed from a captured graph");
    }
    Ok(m)
}

/// One step of `t` on `tokens`, timed with CUDA events on the work stream.
/// The end event is recorded after the step's loss read, so host launch
/// gaps (what graph replay removes) are inside the interval.
fn timed_step(gpu: &mut GpuContext, t: &mut GpuTrainer, tokens: &[u32]) -> Result<f64> {
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let start = gpu.stream().record_event(flags)?;
    t.step_on(gpu, tokens)?;
    let end = gpu.stream().record_event(flags)?;
    Ok(f64::from(start.elapsed_ms(&end)?))
}

/// `subject: train_step`. Passes when `median(t_baseline) / median(t_candidate)
/// >= min_ratio`. Both trainers (same seed, so the same model and batches)
/// run `warmup` untimed steps (at least 2, so a graphed mode has captured
/// and replayed once), then `repeats` timed steps, alternating baseline and
/// candidate so drift hits both alike. The 95% bootstrap interval of the
/// ratio goes to `speedups.csv`; tokens per second go to the detail.
pub fn throughput_ratio(
    p: &throughput_ratio::Params,
    cx: &mut TrialContext<'_>,
) -> Result<Measurement> {
    use crate::check::stats::{median, ratio_ci, BOOTSTRAP_RESAMPLES};
    let cfg = p.model.sized(p.batch, p.seq_len);
    let seed = cx.seed;
    let base_opts = p.baseline.speed_options();
    let cand_opts = p.candidate.speed_options();
    // The mutant's faults are on for the candidate only (while it is built,
    // captured and stepped): the claim is about it.
    let faults = cx.faults();
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
    let mut base_ms = Vec::with_capacity(p.repeats.0);
    let mut cand_ms = Vec::with_capacity(p.repeats.0);
    for _ in 0..p.repeats.0 {
        let tokens = tb.next_batch()?;
        base_ms.push(timed_step(gpu, &mut tb, &tokens)?);
        cand_ms.push(cand_step(gpu, &mut tc, true)?);
    }
    let (mb, mc) = (median(&base_ms), median(&cand_ms));
    let ratio = mb / mc;
    let (lo, hi) = ratio_ci(&base_ms, &cand_ms, seed, BOOTSTRAP_RESAMPLES);
    let tokens = cfg.tokens() as f64;
    let mut m = Measurement::new("median_step_time_ratio", ratio, Comparator::Ge, p.min_ratio.0, "x")
        .with_detail(format!(
            "model {} batch {} seq {} on {}; baseline {} median {mb:.3} ms ({:.0} tokens/s); candidate {} median {mc:.3} ms ({:.0} tokens/s, graph {}); ratio 95% CI [{lo:.3}, {hi:.3}] over {} repeats",
            cfg.name,
            cfg.batch,
            cfg.seq_len,
            gpu.facts().name,
            p.baseline,
            tokens / mb * 1e3,
            p.candidate,
            tokens / mc * 1e3,
            if tc.graph_ready() { "replayed" } else { "not used" },
            p.repeats.0
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
        repeats: p.repeats.0,
    });
    Ok(m)
}

/// `step_throughput`: the median step time of one mode over `repeats` steps
/// after `warmup` (at least 2, so a graphed mode has captured and replayed),
/// as tokens per second against `min_tokens_per_s`. The trial's mutant goes
/// to the trainer; a slowed launch (`SerialisedLaunch`) is set on the context
/// while the trainer is built and stepped, and removed whatever the outcome.
pub fn step_throughput(
    p: &step_throughput::Params,
    cx: &mut TrialContext<'_>,
) -> Result<Measurement> {
    use crate::check::stats::{median, ratio_ci, BOOTSTRAP_RESAMPLES};
    let cfg = p.model.sized(p.batch, p.seq_len);
    let seed = cx.seed;
    let options = p.mode.speed_options();
    let faults = cx.faults();
    let gpu = require_gpu(cx)?;
    let times = {
        let gpu: &mut GpuContext = &mut gpu.with_faults(faults);
        let mut t = GpuTrainer::new(gpu, &cfg, options, seed)?;
        for _ in 0..p.warmup.0.max(2) {
            t.step(gpu)?;
        }
        let mut ms = Vec::with_capacity(p.repeats.0);
        for _ in 0..p.repeats.0 {
            let tokens = t.next_batch()?;
            ms.push(timed_step(gpu, &mut t, &tokens)?);
        }
        (ms, t.graph_ready())
    };
    let (ms, replayed) = times;
    let tokens = cfg.tokens() as f64;
    let med = median(&ms);
    let rate = tokens / med * 1e3;
    let target = p.min_tokens_per_s.0;
    let target_ms = tokens / target * 1e3;
    // The target as a constant "baseline" series: the interval of
    // target_ms / median(step times) is the interval of rate / target.
    let (lo, hi) = ratio_ci(&vec![target_ms; ms.len()], &ms, seed, BOOTSTRAP_RESAMPLES);
    let device = gpu.facts().name.clone();
    let on = p
        .gpu
        .as_deref()
        .map_or(String::new(), |g| format!(" on {g}"));
    let mut m = Measurement::new("tokens_per_s", rate, Comparator::Ge, target, "tokens/s")
        .with_detail(format!(
            "model {} batch {} seq {} {} on {device}: median step {med:.3} ms over {} steps ({rate:.0} tokens/s, {:.3}x the target{on}, 95% CI [{lo:.3}, {hi:.3}]; graph {})",
            cfg.name,
            cfg.batch,
            cfg.seq_len,
            p.mode,
            p.repeats.0,
            rate / target,
            if replayed { "replayed" } else { "not used" },
        ));
    m.not_applicable = p.not_applicable_on(&device);
    m.speedups.push(crate::check::Speedup {
        subject: "tokens/s".into(),
        model: cfg.name.into(),
        batch: cfg.batch,
        seq_len: cfg.seq_len,
        baseline: format!("target {target:.0} tokens/s{on}"),
        candidate: p.mode.to_string(),
        baseline_median_ms: target_ms,
        candidate_median_ms: med,
        ratio: target_ms / med,
        ratio_ci_low: lo,
        ratio_ci_high: hi,
        repeats: p.repeats.0,
    });
    Ok(m)
}

/// Device memory in use now, `total - free` as the driver reports it.
fn used_bytes(gpu: &GpuContext) -> Result<usize> {
    gpu.synchronize()?;
    let (free, total) = cudarc::driver::result::mem_get_info()?;
    Ok(total.saturating_sub(free))
}

/// Passes when the peak device memory a training run of the configuration
/// adds (over what was in use before it started) is at most `max_gib`. The
/// peak is the largest `cuMemGetInfo` delta sampled after building the
/// trainer, after each of the first steps (the second captures a graph when
/// graphed) and after the last; the trainer's own accounting of its buffers
/// is in the detail.
pub fn memory_budget(p: &memory_budget::Params, cx: &mut TrialContext<'_>) -> Result<Measurement> {
    const STEPS: usize = 3;
    let cfg = p.model.sized(p.batch, None);
    let seed = cx.seed;
    let mode = StepMode {
        graph: true,
        base: p.base,
        ..StepMode::default()
    };
    let options = mode.speed_options();
    let faults = cx.faults();
    let mut scope = require_gpu(cx)?.with_faults(faults);
    let gpu: &mut GpuContext = &mut scope;
    let before = used_bytes(gpu)?;
    let mut t = GpuTrainer::new(gpu, &cfg, options, seed)?;
    let mut peak = used_bytes(gpu)?.saturating_sub(before);
    let mut loss = f64::NAN;
    for _ in 0..STEPS {
        loss = t.step(gpu)?.loss;
        peak = peak.max(used_bytes(gpu)?.saturating_sub(before));
    }
    let (base, params, ws) = t.accounted_bytes();
    let gib = |b: usize| b as f64 / f64::from(1u32 << 30);
    let mut m = Measurement::new("peak_device_gib", gib(peak), Comparator::Le, p.max_gib.0, "GiB")
        .with_detail(format!(
            "model {} ({:?} base, batch {}, seq {}) on {}, {STEPS} graphed steps (last loss {loss:.3}); accounted: base {:.3} GiB, trainable + grads + moments {:.3} GiB, workspace {:.3} GiB (saved activations {:.3} GiB)",
            cfg.name,
            p.base,
            cfg.batch,
            cfg.seq_len,
            gpu.facts().name,
            gib(base),
            gib(params),
            gib(ws),
            gib(qlora::train::workspace::Workspace::activation_bytes(&cfg)),
        ));
    if !loss.is_finite() {
        m.violate(format!("the loss is {loss}"));
    }
    Ok(m)
}

/// Passes when, for every trainable tensor, `||g_gpu - g_ref|| / ||g_ref||
/// <= tolerance`: one forward + backward of the GPU step and of the CPU
/// reference from the same base weights, the same trainable point
/// (`Trainable::perturbed`, so `B != 0`) and the same batch. The trial's
/// mutant goes into the GPU step only.
pub fn gradient_parity(
    p: &gradient_parity::Params,
    cx: &mut TrialContext<'_>,
) -> Result<Measurement> {
    let cfg = p.model.0;
    let seed = cx.seed;
    let trainable = Trainable::perturbed(&cfg, seed, p.b_std.0);
    let corpus = Corpus::arithmetic(seed ^ CORPUS_SALT, qlora::model::corpus::DEFAULT_LEN);
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ BATCH_SALT);
    let tokens = corpus.batch(&mut rng, cfg.batch, cfg.seq_len)?;
    let model = Model {
        base: BaseModel::init(&cfg, p.base, seed)?,
        params: trainable.clone(),
    };
    let (ref_loss, ref_grads) = model.loss_and_grads(&tokens, cfg.batch, false)?;
    drop(model);
    let options = GpuTrainOptions {
        clip: ClipMode::Global,
        base: p.base,
        hyper: qlora::train::Hyper::default(),
        graph: false,
        forward_math: Some(match p.precision {
            Precision::Tf32 => GemmMath::Tf32,
            _ => GemmMath::Fp32,
        }),
        backward_math: None,
        keep_mlp: false,
        device_quantize: false,
    };
    let faults = cx.faults();
    let mut scope = require_gpu(cx)?.with_faults(faults);
    let gpu: &mut GpuContext = &mut scope;
    let mut t = GpuTrainer::with_params(gpu, &cfg, options, seed, &trainable)?;
    let (loss, grads) = t.loss_and_grads(gpu, &tokens)?;
    let mut worst = 0.0f64;
    let mut worst_name = String::from("none");
    let mut nonfinite = 0usize;
    for (i, (g, r)) in grads.iter().zip(&ref_grads).enumerate() {
        nonfinite += g.iter().filter(|v| !v.is_finite()).count();
        let (mut d2, mut r2) = (0.0f64, 0.0f64);
        for (&a, &b) in g.iter().zip(r) {
            d2 += (f64::from(a) - b).powi(2);
            r2 += b * b;
        }
        let rel = if r2 > 0.0 {
            (d2 / r2).sqrt()
        } else if d2 == 0.0 {
            0.0
        } else {
            f64::INFINITY
        };
        if rel > worst || rel.is_nan() {
            worst = rel;
            worst_name = format!("{} (||g_ref|| {:.3e})", Trainable::name(i), r2.sqrt());
        }
    }
    let mut m = Measurement::new("max_tensor_rel_l2", worst, Comparator::Le, p.tolerance.0, "rel")
        .with_detail(format!(
            "model {} ({:?} base, {:?} forward GEMMs) on {}; {} tensors; loss gpu {loss:.6} vs reference {ref_loss:.6}; worst {worst_name}",
            cfg.name,
            p.base,
            p.precision,
            gpu.facts().name,
            grads.len()
        ));
    if grads.len() != ref_grads.len() {
        m.violate(format!(
            "{} gradient tensors, the reference has {}",
            grads.len(),
            ref_grads.len()
        ));
    }
    if nonfinite > 0 {
        m.violate(format!("{nonfinite} non-finite gradient values"));
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::Validate;

    fn traj(extra: &str) -> std::result::Result<(), String> {
        let yaml = format!("model: tiny\nsteps: 4\ncheckpoints: [4]\nmax_abs_diff: 0.01\n{extra}");
        let p: trajectory_match::Params = serde_yaml::from_str(&yaml).map_err(|e| e.to_string())?;
        p.validate()
    }

    #[test]
    fn cpu_baseline_may_share_the_mode_but_never_graphs() {
        assert!(traj("baseline_on: cpu\nbaseline: {}\ncandidate: {}\n").is_ok());
        assert!(traj("baseline: {}\ncandidate: {}\n").is_err());
        let e = traj("baseline_on: cpu\nbaseline: {graph: true}\ncandidate: {}\n").unwrap_err();
        assert!(e.contains("no CUDA graphs"), "{e}");
        assert!(traj("baseline_on: gpu\nbaseline: {}\ncandidate: {graph: true}\n").is_err());
    }

    #[test]
    fn gradient_parity_takes_f32_or_tf32_only() {
        let p = |s: &str| {
            serde_yaml::from_str::<gradient_parity::Params>(&format!(
                "model: tiny\ntolerance: 1.0e-5\n{s}"
            ))
            .map_err(|e| e.to_string())
            .and_then(|p| p.validate())
        };
        assert!(p("").is_ok());
        assert!(p("precision: tf32\nbase: nf4\n").is_ok());
        assert!(p("precision: f16\n").is_err());
        assert!(p("b_std: 0\n").is_err());
    }

    #[test]
    fn step_mode_maps_onto_the_gpu_options() {
        let mode = StepMode {
            graph: true,
            clip: ClipMode::PerLayer,
            base: crate::check::params::BaseWeights::Nf4,
            backward_math: crate::check::params::BackwardMath::Tf32,
            mlp_activations: crate::check::params::MlpActivations::Keep,
        };
        let o = mode.gpu_options(Hyper::default());
        assert!(o.graph && o.clip == ClipMode::PerLayer);
        assert_eq!(o.base, crate::check::params::BaseWeights::Nf4);
        assert_eq!(
            crate::mutant::Mutant::ClipSkipped.faults(),
            qlora::Faults {
                clip_skipped: true,
                ..qlora::Faults::NONE
            }
        );
        assert!(o.forward_math.is_none() && !o.device_quantize);
        assert_eq!(o.backward_math, Some(qlora::gpu::GemmMath::Tf32));
        assert!(o.keep_mlp);
        assert_eq!(
            mode.to_string(),
            "graphed/per-layer-clip/nf4/tf32-backward/keep-mlp"
        );
    }

    #[test]
    fn graph_mode_is_refused_on_cpu() {
        let mode = StepMode {
            graph: true,
            ..StepMode::default()
        };
        let e = reference_options(&mode, Hyper::default(), None).unwrap_err();
        assert!(e.to_string().contains("graph capture needs cuda"), "{e}");
    }
}
