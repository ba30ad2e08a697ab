//! `loss_descent`: training on the shipped byte-level corpus makes the loss fall.
//! Passes when `final_loss <= max_fraction * initial_loss`.

use crate::check::training::*;
use crate::check::{require_gpu, Comparator};
use crate::error::Result;
use crate::reference::train::Trainer;
use qlora::gpu::GpuContext;
use qlora::train::GpuTrainer;

use serde::Deserialize;

use super::params::{Count, Fraction, Hyper, ModelName, StepMode};
use super::{Backend, Kind, Measurement, TrialContext, Validate};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub model: ModelName,
    pub steps: Count,
    /// The final loss must be at most this fraction of the initial loss.
    pub max_fraction: Fraction,
    #[serde(default)]
    pub mode: StepMode,
    #[serde(default)]
    pub hyper: Hyper,
}

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        Ok(())
    }
}

/// Passes when `eval_loss(after steps) <= max_fraction * eval_loss(before)`,
/// both on the same seeded evaluation batches of the corpus.
fn loss_descent(p: &Params, b: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
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

fn loss_descent_gpu(p: &Params, cx: &mut TrialContext<'_>) -> Result<Measurement> {
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

impl Kind for Params {
    fn execute(&self, backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        loss_descent(self, backend, cx)
    }
}
