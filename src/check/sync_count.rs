//! `sync_count`: host synchronisations and device-to-host copies inside the
//! captured region (must be zero) and per training step (bounded).

use crate::check::{require_gpu, Comparator};
use crate::error::Result;
use qlora::gpu::GpuContext;
use qlora::train::GpuTrainer;

use serde::Deserialize;

use super::params::{Count, Hyper, ModelName, StepMode};
use super::{Backend, Kind, Measurement, TrialContext, Validate};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub model: ModelName,
    pub steps: Count,
    #[serde(default)]
    pub mode: StepMode,
    /// Syncs allowed inside the captured region.
    #[serde(default)]
    pub max_inside_capture: usize,
    /// Syncs allowed per step (reading the loss is one).
    pub max_per_step: usize,
}

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
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

impl Kind for Params {
    fn execute(&self, _backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        sync_count(self, cx)
    }
}
