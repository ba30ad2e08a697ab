//! Execution of the training checks on each backend.
//!
//! On `cpu` the checks run the reference training step
//! ([`crate::reference::train`]) on models small enough for CI; on `cuda` they
//! run the GPU step ([`super::GpuTrainer`]) from the same seeds, so both
//! backends train the same model on the same batches.

use crate::check::params::BackwardMath;
use crate::check::params::{Hyper, StepMode};
use crate::error::{Error, Result};
use crate::mutant::Mutant;
use crate::reference::train::{StepFaults, StepReport, TrainOptions};
use qlora::gpu::GpuContext;
use qlora::model::ModelConfig;
use qlora::train::{GpuTrainOptions, GpuTrainer};

/// The CPU reference trains in f64 with plain loops; beyond this many frozen
/// parameters a step takes seconds, so a contract asking for more on `cpu`
/// is refused instead of stalling the suite.
pub(super) const CPU_MAX_BASE_PARAMS: usize = 1 << 20;

/// Evaluation batches for `loss_descent`: the loss before and after training
/// is measured on the same fixed batches, so batch-to-batch noise does not
/// enter the ratio.
pub(super) const EVAL_BATCHES: usize = 4;
/// Mixed into the trial seed for the evaluation batches, a stream apart from
/// the training batches.
pub(super) const EVAL_SALT: u64 = 0xe7a1;

/// Losses of `steps` GPU steps of a fresh trainer, and how many of the steps
/// replayed a captured graph.
pub(super) fn gpu_losses(
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
pub(super) fn cpu_losses(
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
pub(super) fn reference_options(
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

pub(super) fn cpu_model(cfg: &ModelConfig) -> Result<ModelConfig> {
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
pub(super) fn clip_summary(reports: &[StepReport]) -> String {
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

pub(super) fn mode_text(mode: &StepMode, hyper: &Hyper) -> String {
    format!(
        "{mode} (lr {:e}, max_grad_norm {:e}, wd {:e})",
        hyper.lr.0, hyper.max_grad_norm.0, hyper.weight_decay.0
    )
}

/// One step of `t` on `tokens`, timed with CUDA events on the work stream.
/// The end event is recorded after the step's loss read, so host launch
/// gaps (what graph replay removes) are inside the interval.
pub(super) fn timed_step(gpu: &mut GpuContext, t: &mut GpuTrainer, tokens: &[u32]) -> Result<f64> {
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let start = gpu.stream().record_event(flags)?;
    t.step_on(gpu, tokens)?;
    let end = gpu.stream().record_event(flags)?;
    Ok(f64::from(start.elapsed_ms(&end)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::params::ClipMode;
    use crate::check::{gradient_parity, trajectory_match, Validate};

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
