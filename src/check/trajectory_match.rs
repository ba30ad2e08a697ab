//! `trajectory_match`: the losses of two training modes at checkpoints.
//! Passes when `max_i |loss_baseline(c_i) - loss_candidate(c_i)| <= max_abs_diff`.

use crate::check::training::*;
use crate::check::{require_gpu, Comparator};
use crate::error::{Error, Result};
use qlora::gpu::GpuContext;

use serde::Deserialize;

use super::params::{Count, Hyper, ModelName, NonNegative, StepMode};
use super::{Backend, Kind, Measurement, TrialContext, Validate};

/// Where the baseline run executes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum BaselineOn {
    /// On the trial's backend, like the candidate.
    #[default]
    Trial,
    /// On the CPU reference step (f64), whatever the trial's backend: the
    /// candidate is then compared with the oracle itself.
    Cpu,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub model: ModelName,
    pub steps: Count,
    /// 1-based step numbers at which the losses are compared.
    pub checkpoints: Vec<Count>,
    pub baseline: StepMode,
    pub candidate: StepMode,
    pub max_abs_diff: NonNegative,
    #[serde(default)]
    pub hyper: Hyper,
    /// Where the baseline runs (default: the trial's backend).
    #[serde(default)]
    pub baseline_on: BaselineOn,
}

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        if self.checkpoints.is_empty() {
            return Err("`checkpoints` must list at least one step".into());
        }
        if let Some(c) = self.checkpoints.iter().find(|c| c.0 > self.steps.0) {
            return Err(format!(
                "checkpoint {} is beyond `steps` ({}); checkpoints must be <= steps",
                c.0, self.steps.0
            ));
        }
        if self.baseline_on == BaselineOn::Cpu && self.baseline.graph {
            return Err(
                "`baseline_on: cpu` runs the CPU reference, which has no CUDA graphs; `baseline.graph` must be false".into(),
            );
        }
        if self.baseline == self.candidate && self.baseline_on == BaselineOn::Trial {
            return Err(
                "`baseline` and `candidate` are the same mode; nothing would be compared".into(),
            );
        }
        Ok(())
    }
}

/// Passes when `max_c |loss_baseline(c) - loss_candidate(c)| <= max_abs_diff`.
/// Both runs start from the same seeded weights and see the same batches; the
/// trial's mutant is injected into the candidate only.
fn trajectory_match(p: &Params, b: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
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

impl Kind for Params {
    fn execute(&self, backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        trajectory_match(self, backend, cx)
    }
}
