//! `sync_count`: host synchronisations and device-to-host copies inside the
//! captured region (must be zero) and per training step (bounded).

use crate::check::training::{trainer_bytes, trainer_shortfall, MAX_STEPS, TRAINING_TIMEOUT_S};
use crate::check::MutantFaults;
use crate::check::{require_gpu, Comparator};
use crate::error::Result;
use qlora::gpu::GpuContext;
use qlora::train::GpuTrainer;

use serde::Deserialize;

use super::doc::{ParamDefault::*, ParamDoc, Piece::*};
use super::doc::{DEFAULT_STEP_MODE, MODEL_BOUND, STEP_MODE_BOUND};

use super::params::{at_most, Count, Hyper, ModelName, StepMode};
use super::{Backend, Here, Kind, Measurement, TrialContext, Validate};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub model: ModelName,
    /// Training steps: at most `MAX_STEPS` (each keeps one count).
    pub steps: Count,
    #[serde(default)]
    pub mode: StepMode,
    /// Syncs allowed inside the captured region.
    #[serde(default)]
    pub max_inside_capture: usize,
    /// Syncs allowed per step (reading the loss is one).
    pub max_per_step: usize,
}

/// The parameters of `sync_count`, for the generated reference.
pub const PARAMS: &[ParamDoc] = &[
    ParamDoc {
        name: "model",
        default: Required,
        bound: MODEL_BOUND,
        meaning: "the preset trained",
    },
    ParamDoc {
        name: "steps",
        default: Required,
        bound: &[Text("1 to "), Int(MAX_STEPS)],
        meaning: "training steps",
    },
    ParamDoc {
        name: "mode",
        default: Yaml(DEFAULT_STEP_MODE),
        bound: STEP_MODE_BOUND,
        meaning: "the step mode; must have `graph: true`",
    },
    ParamDoc {
        name: "max_inside_capture",
        default: Yaml("0"),
        bound: &[Text(">= 0")],
        meaning: "host syncs allowed inside the captured region",
    },
    ParamDoc {
        name: "max_per_step",
        default: Required,
        bound: &[Text(">= 0")],
        meaning: "host syncs allowed per step (reading the loss is one)",
    },
];

/// A minimal `sync_count` check.
pub const EXAMPLE: &[(&str, &str)] = &[
    ("model", "tiny"),
    ("steps", "3"),
    ("mode", "{graph: true}"),
    ("max_per_step", "1"),
];

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        at_most("steps", self.steps.0, MAX_STEPS)?;
        if !self.mode.graph {
            return Err(
                "`mode.graph` must be true: sync_count inspects the captured region".into(),
            );
        }
        Ok(())
    }
}

/// Passes when no host read happened while the step was being captured
/// (`inside <= max_inside_capture`) and no step read the host more than
/// `max_per_step` times. Every device-to-host read of the GPU step goes
/// through its counting `SyncCounter::host_read`; a read inside capture also
/// breaks the capture itself, which is reported as a violation.
fn sync_count(p: &Params, cx: &mut TrialContext<'_>) -> Result<Measurement> {
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

impl Kind<crate::Qlora> for Params {
    fn execute(&self, _backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        sync_count(self, cx)
    }

    /// Whether the trainer fits the GPU's free memory.
    fn unjudged_on(&self, backend: Backend, here: &Here) -> Option<String> {
        let cfg = self.model.0;
        let needed = trainer_bytes(&cfg, &self.mode.gpu_options(Hyper::default()));
        trainer_shortfall(backend, &cfg, needed, here)
    }

    /// Many times this kind's longest trial (its `duration_ms` in the
    /// committed baselines; the parameter bounds keep a trial within it):
    /// a stuck trial is stopped, a slow machine is not.
    fn default_timeout_s(&self) -> f64 {
        TRAINING_TIMEOUT_S
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::params::tests::with_gpu;

    fn params(extra: &str) -> std::result::Result<Params, String> {
        crate::check::params::tests::parse(&format!(
            "model: small-4l\nmode: {{graph: true}}\nmax_per_step: 1\n{extra}"
        ))
    }

    #[test]
    fn steps_are_bounded_and_the_trainer_must_fit() {
        let e = params("steps: 100000000").unwrap_err();
        assert_eq!(e, "steps: 100000000 is above its bound of 10000");
        let p = params("steps: 20").unwrap();
        let mut here = with_gpu("NVIDIA H200", 141);
        assert_eq!(p.unjudged_on(Backend::Cuda, &here), None);
        here.gpu.as_mut().unwrap().free_memory_bytes = 0;
        let why = p.unjudged_on(Backend::Cuda, &here).unwrap();
        assert!(why.ends_with("NVIDIA H200 has 0.0 MiB free"), "{why}");
    }
}
