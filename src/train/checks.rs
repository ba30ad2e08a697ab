//! Execution of the training checks on each backend.
//!
//! On `cpu` the checks run the reference training step
//! ([`crate::reference::train`]) on models small enough for CI; on `cuda` they
//! will run the GPU step.

use crate::check::params::{Hyper, StepMode};
use crate::check::{
    loss_descent, memory_budget, sync_count, throughput_ratio, trajectory_match, Comparator,
    Measurement, TrialContext,
};
use crate::contract::Backend;
use crate::error::{Error, Result};
use crate::model::ModelConfig;
use crate::reference::train::{StepReport, TrainOptions, Trainer};

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

fn gpu_not_built() -> Error {
    Error::CudaUnavailable("GPU training step not built yet".into())
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
        return Err(gpu_not_built());
    }
    let cfg = cpu_model(&p.model.0)?;
    let options = TrainOptions::from_mode(&p.mode, p.hyper, cx.mutant)?;
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

/// Passes when `max_c |loss_baseline(c) - loss_candidate(c)| <= max_abs_diff`.
/// Both runs start from the same seeded weights and see the same batches; the
/// trial's mutant is injected into the candidate only.
pub fn trajectory_match(
    p: &trajectory_match::Params,
    b: Backend,
    cx: &mut TrialContext<'_>,
) -> Result<Measurement> {
    if b == Backend::Cuda {
        return Err(gpu_not_built());
    }
    let cfg = cpu_model(&p.model.0)?;
    let base_opts = TrainOptions::from_mode(&p.baseline, p.hyper, None)?;
    let cand_opts = TrainOptions::from_mode(&p.candidate, p.hyper, cx.mutant)?;
    let run = |options: TrainOptions| -> Result<Vec<StepReport>> {
        let mut t = Trainer::new(&cfg, options, cx.seed)?;
        (0..p.steps.0).map(|_| t.step()).collect()
    };
    let base = run(base_opts)?;
    let cand = run(cand_opts)?;
    let mut worst = 0.0f64;
    let mut points = Vec::with_capacity(p.checkpoints.len());
    for c in &p.checkpoints {
        let at = |r: &[StepReport]| {
            r.get(c.0.wrapping_sub(1))
                .map(|s| s.loss)
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
        "model {}, {} steps; baseline {}: {}; candidate {}: {}; {}",
        cfg.name,
        p.steps.0,
        mode_text(&p.baseline, &p.hyper),
        clip_summary(&base),
        mode_text(&p.candidate, &p.hyper),
        clip_summary(&cand),
        points.join(", ")
    )))
}

pub fn sync_count(_p: &sync_count::Params, _cx: &mut TrialContext<'_>) -> Result<Measurement> {
    Err(Error::CudaUnavailable("not built yet".into()))
}

pub fn throughput_ratio(
    _p: &throughput_ratio::Params,
    _cx: &mut TrialContext<'_>,
) -> Result<Measurement> {
    Err(Error::CudaUnavailable("not built yet".into()))
}

pub fn memory_budget(
    _p: &memory_budget::Params,
    _cx: &mut TrialContext<'_>,
) -> Result<Measurement> {
    Err(Error::CudaUnavailable("not built yet".into()))
}
