//! `memory_budget`: the peak device memory of a training configuration stays
//! within a bound derived from the arithmetic of its weights, adapters,
//! optimizer state and activations.

use crate::check::params::StepMode;
use crate::check::{require_gpu, Comparator};
use crate::error::Result;
use qlora::gpu::GpuContext;
use qlora::train::GpuTrainer;

use serde::Deserialize;

use super::params::{BaseWeights, BaseWeightsDef, Count, ModelName, Positive};
use super::{Backend, Kind, Measurement, TrialContext, Validate};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub model: ModelName,
    #[serde(default, with = "BaseWeightsDef")]
    pub base: BaseWeights,
    /// Upper bound on peak device memory, GiB.
    pub max_gib: Positive,
    /// Overrides the preset's batch size.
    #[serde(default)]
    pub batch: Option<Count>,
}

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        Ok(())
    }
}

/// Passes when the peak device memory a training run of the configuration
/// adds (over what was in use before it started) is at most `max_gib`. The
/// peak is the largest `cuMemGetInfo` delta sampled after building the
/// trainer, after each of the first steps (the second captures a graph when
/// graphed) and after the last; the trainer's own accounting of its buffers
/// is in the detail.
fn memory_budget(p: &Params, cx: &mut TrialContext<'_>) -> Result<Measurement> {
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

/// Device memory in use now, `total - free` as the driver reports it.
fn used_bytes(gpu: &GpuContext) -> Result<usize> {
    gpu.synchronize()?;
    let (free, total) = cudarc::driver::result::mem_get_info()?;
    Ok(total.saturating_sub(free))
}

impl Kind for Params {
    fn execute(&self, _backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        memory_budget(self, cx)
    }
}
