//! `prewarm`: after `prewarm(config)`, running the forward and backward (or
//! whole training steps) compiles nothing, and every kernel used was pre-warmed.

use std::collections::BTreeSet;

use crate::check::params::at_most;
use crate::check::params::{BaseWeights, StepMode};
use crate::check::training::{trainer_bytes, trainer_shortfall, TRAINING_TIMEOUT_S};
use crate::check::{require_gpu, Comparator};
use crate::error::Result;
use qlora::gpu::{GpuContext, PrewarmReport};
use qlora::train::GpuTrainer;
use qlora::Faults;

use serde::Deserialize;

use super::doc::{ParamDefault::*, ParamDoc, Piece::*};

use super::params::{BaseName, Count, ModelName, Positive};
use super::{Backend, Here, Kind, Measurement, TrialContext, Validate};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// Presets to pre-warm for, one after another: at most [`MAX_MODELS`].
    pub models: Vec<ModelName>,
    /// Base-weight formats to exercise after pre-warm: at most [`MAX_BASES`].
    #[serde(default = "default_bases")]
    pub bases: Vec<BaseName>,
    /// Training steps run after pre-warm, per model and base: at most
    /// [`MAX_PREWARM_STEPS`].
    #[serde(default = "default_steps")]
    pub steps: Count,
    /// Compilations allowed after pre-warm.
    #[serde(default)]
    pub max_compilations: usize,
    /// Bound on the wall time of each cold pre-warm (NVRTC compilation plus
    /// module loads) in milliseconds; none by default.
    #[serde(default)]
    pub max_prewarm_ms: Option<Positive>,
}

fn default_bases() -> Vec<BaseName> {
    vec![BaseName(BaseWeights::Fp32), BaseName(BaseWeights::Nf4)]
}

fn default_steps() -> Count {
    Count(2)
}

/// Most models one trial pre-warms (each a cold cache, NVRTC compilations
/// of ~1 s per module set, and a trainer): twice the number of presets.
pub const MAX_MODELS: usize = 8;
/// Most base formats per model: each of the two at most twice.
pub const MAX_BASES: usize = 4;
/// Most training steps after each pre-warm: the claim is about the first
/// steps (eager, capture, replay); the shipped check runs 3.
pub const MAX_PREWARM_STEPS: usize = 100;

/// The parameters of `prewarm`, for the generated reference.
pub const PARAMS: &[ParamDoc] = &[
    ParamDoc {
        name: "models",
        default: Required,
        bound: &[Text("1 to "), Int(MAX_MODELS), Text(" presets: "), Presets],
        meaning: "presets to pre-warm for, one after another",
    },
    ParamDoc {
        name: "bases",
        default: Yaml("[fp32, nf4]"),
        bound: &[Text("1 to "), Int(MAX_BASES), Text(" of "), OneOf(&["fp32", "nf4"])],
        meaning: "base-weight formats exercised after pre-warm",
    },
    ParamDoc {
        name: "steps",
        default: Yaml("2"),
        bound: &[Text("1 to "), Int(MAX_PREWARM_STEPS)],
        meaning: "training steps after pre-warm, per model and base",
    },
    ParamDoc {
        name: "max_compilations",
        default: Yaml("0"),
        bound: &[Text(">= 0")],
        meaning: "compilations allowed after pre-warm",
    },
    ParamDoc {
        name: "max_prewarm_ms",
        default: Otherwise("none"),
        bound: &[Text("> 0")],
        meaning: "bound on each cold pre-warm's wall time, ms",
    },
];

/// A minimal `prewarm` check.
pub const EXAMPLE: &[(&str, &str)] = &[("models", "[tiny]")];

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        if self.models.is_empty() {
            return Err("`models` must list at least one preset".into());
        }
        if self.bases.is_empty() {
            return Err("`bases` must list at least one base-weight format".into());
        }
        at_most("models", self.models.len(), MAX_MODELS)?;
        at_most("bases", self.bases.len(), MAX_BASES)?;
        at_most("steps", self.steps.0, MAX_PREWARM_STEPS)
    }
}

impl Kind for Params {
    fn execute(&self, _backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        prewarm(self, cx)
    }

    /// Whether the largest trainer (one at a time) fits the GPU's free
    /// memory; the reason names the model that does not.
    fn unjudged_on(&self, backend: Backend, here: &Here) -> Option<String> {
        if backend != Backend::Cuda {
            return None;
        }
        self.models.iter().find_map(|model| {
            let needed = self
                .bases
                .iter()
                .map(|b| trainer_bytes(&model.0, &graphed(b.0).speed_options()))
                .fold(0.0, f64::max);
            trainer_shortfall(Backend::Cuda, &model.0, needed, here)
        })
    }

    /// Observed: at most 13 s on an H200 (two models, two bases, cold NVRTC
    /// compilations each).
    fn default_timeout_s(&self) -> f64 {
        TRAINING_TIMEOUT_S
    }
}

/// The step mode pre-warm is checked under: graphed, as in production.
fn graphed(base: BaseWeights) -> StepMode {
    StepMode {
        graph: true,
        base,
        ..StepMode::default()
    }
}

/// Runs `body` on a cold cache with `faults` on, then drops the modules
/// compiled under them, also when `body` fails.
pub(super) fn on_cold_cache<T>(
    gpu: &mut GpuContext,
    faults: Faults,
    body: impl FnOnce(&mut GpuContext) -> Result<T>,
) -> Result<T> {
    gpu.reset_cache();
    let out = body(&mut gpu.with_faults(faults));
    gpu.reset_cache();
    out
}

/// `prewarm`: for each model and base, a cold cache, pre-warm, then `steps`
/// real training steps of a `GpuTrainer` (eager, captured and replayed). Counts compilations after pre-warm; a module used but
/// not pre-warmed is a violation; pre-warmed but unused modules are reported.
fn prewarm(p: &Params, cx: &mut TrialContext<'_>) -> Result<Measurement> {
    let faults = cx.faults();
    let seed = cx.seed;
    let gpu = require_gpu(cx)?;
    let mut total_after = 0usize;
    let mut violations = Vec::new();
    let mut detail = Vec::new();
    for model in &p.models {
        let config = model.0;
        for &base in p.bases.iter().map(|b| &b.0) {
            let (report, after, used) = on_cold_cache(gpu, faults, |gpu| {
                let report = gpu.prewarm(&config, &[base])?;
                gpu.cache_mut().clear_used();
                // Real training steps, graphed as in production: step 1 runs
                // eagerly, step 2 captures, later steps replay.
                let options = graphed(base).speed_options();
                let mut trainer = GpuTrainer::new(gpu, &config, options, seed)?;
                for _ in 0..p.steps.0 {
                    trainer.step(gpu)?;
                }
                drop(trainer);
                gpu.synchronize()?;
                let after = gpu.cache_stats().compiled_after_prewarm;
                let used = gpu.cache().used().clone();
                Ok((report, after, used))
            })?;
            total_after += after;
            let prewarmed: BTreeSet<&str> = report.modules.iter().copied().collect();
            let missing: Vec<&str> = used.difference(&prewarmed).copied().collect();
            let unused: Vec<&str> = prewarmed.difference(&used).copied().collect();
            let tag = format!("{}/{}", config.name, base_name(base));
            if !missing.is_empty() {
                violations.push(format!(
                    "{tag}: used but not pre-warmed: {}",
                    missing.join(", ")
                ));
            }
            if let Some(bound) = p.max_prewarm_ms {
                if report.wall_ms > bound.0 {
                    violations.push(format!(
                        "{tag}: pre-warm took {:.0} ms, over the bound of {:.0} ms",
                        report.wall_ms, bound.0
                    ));
                }
            }
            detail.push(summary(&tag, &report, after, &unused));
        }
    }
    let mut m = Measurement::new(
        "compilations_after_prewarm",
        total_after as f64,
        Comparator::Le,
        p.max_compilations as f64,
        "compilations",
    )
    .with_detail(detail.join("; "));
    for v in violations {
        m.violate(v);
    }
    Ok(m)
}

fn base_name(base: BaseWeights) -> &'static str {
    match base {
        BaseWeights::Fp32 => "fp32",
        BaseWeights::Nf4 => "nf4",
    }
}

fn summary(tag: &str, r: &PrewarmReport, after: usize, unused: &[&str]) -> String {
    format!(
        "{tag}: pre-warmed {} modules ({} compilations, {:.0} ms JIT, {:.0} ms wall), {after} after{}{}",
        r.modules.len(),
        r.compilations,
        r.compile_ms,
        r.wall_ms,
        if r.skipped.is_empty() {
            String::new()
        } else {
            format!(", skipped [{}]", r.skipped.join(", "))
        },
        if unused.is_empty() {
            String::new()
        } else {
            format!(", unused [{}]", unused.join(", "))
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::params::tests::with_gpu;

    fn params(yaml: &str) -> std::result::Result<Params, String> {
        let p: Params = serde_yaml::from_str(yaml).map_err(|e| e.to_string())?;
        p.validate()?;
        Ok(p)
    }

    #[test]
    fn lists_and_steps_are_bounded() {
        let e =
            params("models: [tiny, tiny, tiny, tiny, tiny, tiny, tiny, tiny, tiny]").unwrap_err();
        assert_eq!(e, "models: 9 is above its bound of 8");
        let e = params("models: [tiny]\nbases: [nf4, nf4, nf4, nf4, nf4]").unwrap_err();
        assert_eq!(e, "bases: 5 is above its bound of 4");
        let e = params("models: [tiny]\nsteps: 100000").unwrap_err();
        assert_eq!(e, "steps: 100000 is above its bound of 100");
    }

    #[test]
    fn the_model_that_does_not_fit_is_named() {
        let p = params("models: [tiny, qwen2.5-coder-1.5b]").unwrap();
        let mut here = with_gpu("NVIDIA H100 80GB HBM3", 80);
        assert_eq!(p.unjudged_on(Backend::Cuda, &here), None);
        here.gpu.as_mut().unwrap().free_memory_bytes = 1 << 30;
        let why = p.unjudged_on(Backend::Cuda, &here).unwrap();
        assert!(why.starts_with("model qwen2.5-coder-1.5b "), "{why}");
    }
}
