//! `memory_budget`: the peak device memory of a training configuration stays
//! within a bound derived from the arithmetic of its weights, adapters,
//! optimizer state and activations (`max_gib`), or within a fraction of
//! another base format's peak, both measured in the same trial
//! (`versus`, `max_ratio`: `peak(base) / peak(versus) <= max_ratio`).

use crate::check::params::{at_most, StepMode};
use crate::check::training::TRAINING_TIMEOUT_S;
use crate::check::training::{gib, trainer_bytes, trainer_shortfall, DeviceMemory};
use crate::check::MutantFaults;
use crate::check::{require_gpu, Comparator};
use crate::error::{Error, Result};
use qlora::gpu::GpuContext;
use qlora::model::ModelConfig;
use qlora::train::GpuTrainer;

use serde::Deserialize;

use super::doc::MODEL_BOUND;
use super::doc::{ParamDefault::*, ParamDoc, Piece::*};

use super::params::{BaseName, BaseWeights, BaseWeightsDef, Count, ModelName, Positive};
use super::{Backend, Here, Kind, Measurement, TrialContext, Validate};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub model: ModelName,
    #[serde(default, with = "BaseWeightsDef")]
    pub base: BaseWeights,
    /// Upper bound on peak device memory, GiB.
    #[serde(default)]
    pub max_gib: Option<Positive>,
    /// The base format whose peak `base`'s is compared with.
    #[serde(default)]
    pub versus: Option<BaseName>,
    /// Upper bound on `peak(base) / peak(versus)`.
    #[serde(default)]
    pub max_ratio: Option<Positive>,
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
        bound: &[OneOf(super::doc::BASES)],
        meaning: "the base-weight format",
    },
    ParamDoc {
        name: "max_gib",
        default: Otherwise("none (give this, or `versus` and `max_ratio`)"),
        bound: &[Text("> 0")],
        meaning: "bound on peak device memory, GiB",
    },
    ParamDoc {
        name: "versus",
        default: Otherwise("none"),
        bound: &[OneOf(super::doc::BASES)],
        meaning:
            "the base format whose peak, measured in the same trial, `base`'s is compared with",
    },
    ParamDoc {
        name: "max_ratio",
        default: Otherwise("none"),
        bound: &[Text("> 0")],
        meaning: "bound on the peak of `base` over the peak of `versus`",
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
        self.model.check_sized(self.batch, None)?;
        match (self.max_gib, self.versus, self.max_ratio) {
            (Some(_), None, None) | (None, Some(_), Some(_)) => Ok(()),
            (Some(_), _, _) => Err(format!("max_gib: {ONE_BOUND}")),
            (None, _, _) => Err(format!("versus: {ONE_BOUND}")),
        }
    }
}

const ONE_BOUND: &str =
    "a memory_budget check judges one bound: give `max_gib`, or both `versus` and `max_ratio`";

impl Params {
    /// The step mode the check trains `base` in: graphed, the other
    /// settings the defaults.
    fn mode_of(base: BaseWeights) -> StepMode {
        StepMode {
            graph: true,
            base,
            ..StepMode::default()
        }
    }
}

/// Graphed steps each measured run trains.
const STEPS: usize = 3;

/// What one training run added to the device's memory in use.
struct Peak {
    /// The largest sample, GiB.
    gib: f64,
    /// The trainer's own accounting: base, trainable state (parameters,
    /// gradients, moments), workspace; bytes.
    accounted: (usize, usize, usize),
    /// The last step's loss.
    loss: f64,
}

impl Peak {
    /// Bytes the trainer accounted for, all together.
    fn accounted_total(&self) -> usize {
        let (base, params, ws) = self.accounted;
        base + params + ws
    }

    /// The trainer's accounting as the detail states it.
    fn accounted_text(&self) -> String {
        let (base, params, ws) = self.accounted;
        format!(
            "base {:.3} GiB, trainable + grads + moments {:.3} GiB, workspace {:.3} GiB",
            gib(base),
            gib(params),
            gib(ws)
        )
    }
}

/// Trains [`STEPS`] graphed steps of `cfg` on `base` and returns the peak
/// device memory the run added to this process's over what it held before
/// the run started ([`DeviceMemory::start_own`]: no other process on the
/// GPU moves it), sampled after building the trainer,
/// after each step (the second captures the graph) and after the last.
fn peak_of(gpu: &mut GpuContext, cfg: &ModelConfig, base: BaseWeights, seed: u64) -> Result<Peak> {
    let options = Params::mode_of(base).speed_options();
    let mut memory = DeviceMemory::start_own(gpu)?;
    let mut t = GpuTrainer::new(gpu, cfg, options, seed)?;
    memory.sample(gpu)?;
    let mut loss = f64::NAN;
    for _ in 0..STEPS {
        loss = t.step(gpu)?.loss;
        memory.sample(gpu)?;
    }
    Ok(Peak {
        gib: memory.peak_gib(),
        accounted: t.accounted_bytes(),
        loss,
    })
}

/// Passes when the peak device memory a training run of the configuration
/// adds is at most `max_gib`, or at most `max_ratio` of the peak of the same
/// run on the `versus` base ([`peak_of`]), and every run's last loss is
/// finite; the trainer's own accounting of its buffers is in the detail. A
/// mutant's faults are on for `base` only.
fn memory_budget(p: &Params, cx: &mut TrialContext<'_>) -> Result<Measurement> {
    let cfg = p.model.sized(p.batch, None);
    let run = (cx.seed, cx.faults());
    let gpu = require_gpu(cx)?;
    let (mut m, losses) = match (p.max_gib, p.versus, p.max_ratio) {
        (Some(max), _, _) => peak_bound(gpu, &cfg, p.base, max.0, run)?,
        (None, Some(BaseName(versus)), Some(max)) => {
            ratio_bound(gpu, &cfg, (p.base, versus), max.0, run)?
        }
        _ => {
            return Err(Error::InvalidArgument {
                op: "memory_budget",
                message: ONE_BOUND.into(),
            })
        }
    };
    if let Some(bad) = losses.iter().find(|l| !l.is_finite()) {
        m.violate(format!("the loss is {bad}"));
    }
    Ok(m)
}

/// The peak of `base`'s run (under `faults`) against `max_gib`, with the
/// runs' last losses.
fn peak_bound(
    gpu: &mut GpuContext,
    cfg: &ModelConfig,
    base: BaseWeights,
    max_gib: f64,
    (seed, faults): (u64, qlora::Faults),
) -> Result<(Measurement, Vec<f64>)> {
    let ours = peak_of(&mut gpu.with_faults(faults), cfg, base, seed)?;
    let m = Measurement::new("peak_device_gib", ours.gib, Comparator::Le, max_gib, "GiB")
        .with_detail(format!(
            "model {} ({:?} base, batch {}, seq {}) on {}, {STEPS} graphed steps (last loss {:.3}); accounted: {} (saved activations {:.3} GiB)",
            cfg.name,
            base,
            cfg.batch,
            cfg.seq_len,
            gpu.facts().name,
            ours.loss,
            ours.accounted_text(),
            gib(qlora::train::workspace::Workspace::activation_bytes(
                cfg,
                &Params::mode_of(base).speed_options()
            )),
        ));
    Ok((m, vec![ours.loss]))
}

/// `peak(base) / peak(versus)` ([`both_peaks`]) against `max_ratio`, with
/// the runs' last losses.
fn ratio_bound(
    gpu: &mut GpuContext,
    cfg: &ModelConfig,
    (base, versus): (BaseWeights, BaseWeights),
    max_ratio: f64,
    (seed, faults): (u64, qlora::Faults),
) -> Result<(Measurement, Vec<f64>)> {
    let (ours, theirs) = both_peaks(gpu, cfg, (base, versus), seed, faults)?;
    let ratio = ours.gib / theirs.gib;
    let m = Measurement::new("peak_ratio", ratio, Comparator::Le, max_ratio, "x").with_detail(
        format!(
            "model {} (batch {}, seq {}) on {}, {STEPS} graphed steps each: {} base peak {:.3} GiB (accounted: {}), {} base peak {:.3} GiB (accounted: {}); ratio {ratio:.3}",
            cfg.name,
            cfg.batch,
            cfg.seq_len,
            gpu.facts().name,
            base.name(),
            ours.gib,
            ours.accounted_text(),
            versus.name(),
            theirs.gib,
            theirs.accounted_text(),
        ),
    );
    Ok((m, vec![ours.loss, theirs.loss]))
}

/// The peaks of `ours` (with `faults`) and of `versus` (without), each
/// from the same starting point: cuBLAS created and both configurations'
/// kernel modules loaded first, so that neither run pays for what stays
/// behind for the other. A peak below what its trainer accounted for means
/// the driver's figures missed the allocations: the trial is not judged.
fn both_peaks(
    gpu: &mut GpuContext,
    cfg: &ModelConfig,
    (base, versus): (BaseWeights, BaseWeights),
    seed: u64,
    faults: qlora::Faults,
) -> Result<(Peak, Peak)> {
    gpu.cublas()?;
    let math = (gpu.options().forward_math, gpu.options().backward_math);
    gpu.prewarm_with_math(cfg, &[base, versus], math, true)?;
    let theirs = peak_of(gpu, cfg, versus, seed)?;
    let ours = peak_of(&mut gpu.with_faults(faults), cfg, base, seed)?;
    for (peak, base) in [(&ours, base), (&theirs, versus)] {
        let accounted = gib(peak.accounted_total());
        if peak.gib < 0.9 * accounted {
            return Err(Error::NotReported(format!(
                "the {} run's peak ({:.3} GiB) is below what its trainer allocated ({:.3} GiB): the driver's figure for this process did not show the allocations",
                base.name(),
                peak.gib,
                accounted
            )));
        }
    }
    Ok((ours, theirs))
}

impl Kind<crate::Qlora> for Params {
    fn execute(&self, _backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        memory_budget(self, cx)
    }

    /// Whether the trainer the stack plans fits the GPU's free memory (a
    /// budget for a GPU too small for the configuration says nothing).
    fn unjudged_on(&self, backend: Backend, here: &Here) -> Option<String> {
        // The runs of `base` and `versus` come one after the other.
        let cfg = self.model.sized(self.batch, None);
        let bases = std::iter::once(self.base).chain(self.versus.map(|v| v.0));
        let needed = bases
            .map(|base| trainer_bytes(&cfg, &Self::mode_of(base).speed_options()))
            .fold(0.0, f64::max);
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
        let needed = trainer_bytes(&p.model.0, &Params::mode_of(p.base).speed_options());
        assert!(needed > 3.0 * f64::from(1u32 << 30) && needed < 6.0 * f64::from(1u32 << 30));
    }

    #[test]
    fn one_bound_is_given() {
        let p = |extra: &str| {
            crate::check::params::tests::parse::<Params>(&format!(
                "model: qwen2.5-0.5b\nbase: nf4_bf16\n{extra}"
            ))
        };
        let ratio = p("versus: bf16\nmax_ratio: 0.6").unwrap();
        assert_eq!(ratio.versus, Some(BaseName(BaseWeights::Bf16)));
        assert_eq!(ratio.base, BaseWeights::Nf4Bf16);
        for bad in [
            "",
            "versus: bf16",
            "max_ratio: 0.6",
            "max_gib: 6\nmax_ratio: 0.6",
        ] {
            let e = p(bad).unwrap_err();
            assert!(e.ends_with(ONE_BOUND), "{bad}: {e}");
        }
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
