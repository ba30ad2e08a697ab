//! `memory_budget`: the peak device memory of a training configuration stays
//! within a bound derived from the arithmetic of its weights, adapters,
//! optimizer state and activations.

use crate::check::params::{at_most, StepMode};
use crate::check::training::TRAINING_TIMEOUT_S;
use crate::check::training::{gib, trainer_bytes, trainer_shortfall, DeviceMemory};
use crate::check::MutantFaults;
use crate::check::{require_gpu, Comparator};
use crate::error::Result;
use qlora::gpu::GpuContext;
use qlora::train::GpuTrainer;

use serde::Deserialize;

use super::doc::MODEL_BOUND;
use super::doc::{ParamDefault::*, ParamDoc, Piece::*};

use super::params::{BaseWeights, BaseWeightsDef, Count, ModelName, Positive};
use super::{Backend, Here, Kind, Measurement, TrialContext, Validate};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub model: ModelName,
    #[serde(default, with = "BaseWeightsDef")]
    pub base: BaseWeights,
    /// Upper bound on peak device memory, GiB.
    pub max_gib: Positive,
    /// Overrides the preset's batch size: at most [`MAX_BATCH`].
    #[serde(default)]
    pub batch: Option<Count>,
}

/// Largest batch: 1,024 sequences (256x the presets'); the device memory
/// decides below that.
pub const MAX_BATCH: usize = 1_024;

/// The parameters of `memory_budget`, for the generated reference.
pub const PARAMS: &[ParamDoc] = &[
    ParamDoc {
        name: "model",
        default: Required,
        bound: MODEL_BOUND,
        meaning: "the preset trained",
    },
    ParamDoc {
        name: "base",
        default: Yaml("fp32"),
        bound: &[OneOf(&["fp32", "nf4", "bf16"])],
        meaning: "the base-weight format",
    },
    ParamDoc {
        name: "max_gib",
        default: Required,
        bound: &[Text("> 0")],
        meaning: "bound on peak device memory, GiB",
    },
    ParamDoc {
        name: "batch",
        default: Otherwise("the preset's"),
        bound: &[Text("1 to "), Int(MAX_BATCH)],
        meaning: "overrides the preset's batch",
    },
];

/// A minimal `memory_budget` check.
pub const EXAMPLE: &[(&str, &str)] = &[("model", "tiny"), ("max_gib", "1")];

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        at_most("batch", self.batch.map_or(0, |b| b.0), MAX_BATCH)?;
        self.model.check_sized(self.batch, None)
    }
}

impl Params {
    /// The step mode the check trains in: graphed, on the contract's base.
    fn mode(&self) -> StepMode {
        StepMode {
            graph: true,
            base: self.base,
            ..StepMode::default()
        }
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
    let options = p.mode().speed_options();
    let faults = cx.faults();
    let mut scope = require_gpu(cx)?.with_faults(faults);
    let gpu: &mut GpuContext = &mut scope;
    let mut memory = DeviceMemory::start(gpu)?;
    let mut t = GpuTrainer::new(gpu, &cfg, options, seed)?;
    memory.sample(gpu)?;
    let mut loss = f64::NAN;
    for _ in 0..STEPS {
        loss = t.step(gpu)?.loss;
        memory.sample(gpu)?;
    }
    let (base, params, ws) = t.accounted_bytes();
    let mut m = Measurement::new("peak_device_gib", memory.peak_gib(), Comparator::Le, p.max_gib.0, "GiB")
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
            gib(qlora::train::workspace::Workspace::activation_bytes(&cfg, p.base)),
        ));
    if !loss.is_finite() {
        m.violate(format!("the loss is {loss}"));
    }
    Ok(m)
}

impl Kind<crate::Qlora> for Params {
    fn execute(&self, _backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        memory_budget(self, cx)
    }

    /// Whether the trainer the stack plans fits the GPU's free memory (a
    /// budget for a GPU too small for the configuration says nothing).
    fn unjudged_on(&self, backend: Backend, here: &Here) -> Option<String> {
        let cfg = self.model.sized(self.batch, None);
        let needed = trainer_bytes(&cfg, &self.mode().speed_options());
        trainer_shortfall(backend, &cfg, needed, here)
    }

    /// Many times this kind's longest trial (its `duration_ms` in the
    /// committed baselines; the parameter bounds keep a trial within it):
    /// a stuck trial is stopped, a slow machine is not.
    fn default_timeout_s(&self) -> f64 {
        TRAINING_TIMEOUT_S
    }

    fn needs_the_gpu_alone(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::params::tests::with_gpu;

    fn params(extra: &str) -> std::result::Result<Params, String> {
        crate::check::params::tests::parse(&format!(
            "model: qwen2.5-coder-1.5b\nbase: nf4\nmax_gib: 6.0\n{extra}"
        ))
    }

    #[test]
    fn a_configuration_beyond_the_free_memory_is_not_judged() {
        let p = params("").unwrap();
        let mut here = with_gpu("NVIDIA H100 80GB HBM3", 80);
        assert_eq!(p.unjudged_on(Backend::Cuda, &here), None);
        here.gpu.as_mut().unwrap().free_memory_bytes = 3 << 30;
        let why = p.unjudged_on(Backend::Cuda, &here).unwrap();
        assert!(
            why.starts_with("model qwen2.5-coder-1.5b (batch 4, seq 256) needs ~")
                && why.ends_with("NVIDIA H100 80GB HBM3 has 3.0 GiB free"),
            "{why}"
        );
        // The stack's plan of this configuration, the same the budget names.
        let needed = trainer_bytes(&p.model.0, &p.mode().speed_options());
        assert!(needed > 3.0 * f64::from(1u32 << 30) && needed < 6.0 * f64::from(1u32 << 30));
    }

    #[test]
    fn the_batch_is_bounded() {
        let e = params("batch: 100000").unwrap_err();
        assert_eq!(e, "batch: 100000 is above its bound of 1024");
        let p = params("batch: 1024").unwrap();
        let why = p
            .unjudged_on(Backend::Cuda, &with_gpu("NVIDIA H200", 141))
            .unwrap();
        assert!(why.contains("(batch 1024, seq 256)"), "{why}");
    }
}
