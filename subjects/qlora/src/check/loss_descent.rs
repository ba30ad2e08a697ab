//! `loss_descent`: training on the shipped byte-level corpus makes the loss fall.
//! Passes when `final_loss <= max_fraction * initial_loss`.

use crate::check::training::*;
use crate::check::MutantFaults;
use crate::check::{require_gpu, Comparator};
use crate::error::Result;
use crate::reference::train::Trainer;
use qlora::gpu::GpuContext;
use qlora::train::GpuTrainer;

use serde::Deserialize;

use super::doc::{ParamDefault::*, ParamDoc, Piece::*};
use super::doc::{
    DEFAULT_HYPER, DEFAULT_STEP_MODE, HYPER_BOUND, STEP_MODE_BOUND, TRAINING_MODEL_BOUND,
};

use super::params::{at_most, Count, Fraction, Hyper, ModelName, StepMode};
use super::{Backend, Here, Kind, Measurement, TrialContext, Validate};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub model: ModelName,
    /// Training steps: at most `MAX_STEPS`, and at most `CPU_MAX_STEPS`
    /// on cpu.
    pub steps: Count,
    /// The final loss must be at most this fraction of the initial loss.
    pub max_fraction: Fraction,
    #[serde(default)]
    pub mode: StepMode,
    #[serde(default)]
    pub hyper: Hyper,
}

/// The parameters of `loss_descent`, for the generated reference.
pub const PARAMS: &[ParamDoc] = &[
    ParamDoc {
        name: "model",
        default: Required,
        bound: TRAINING_MODEL_BOUND,
        meaning: "the preset trained",
    },
    ParamDoc {
        name: "steps",
        default: Required,
        bound: &[
            Text("1 to "),
            Int(MAX_STEPS),
            Text("; on cpu at most "),
            Int(CPU_MAX_STEPS),
        ],
        meaning: "training steps",
    },
    ParamDoc {
        name: "max_fraction",
        default: Required,
        bound: &[Text("in (0, 1]")],
        meaning: "bound on final loss / initial loss",
    },
    ParamDoc {
        name: "mode",
        default: Yaml(DEFAULT_STEP_MODE),
        bound: STEP_MODE_BOUND,
        meaning: "the step mode trained",
    },
    ParamDoc {
        name: "hyper",
        default: Yaml(DEFAULT_HYPER),
        bound: HYPER_BOUND,
        meaning: "optimiser hyper-parameters",
    },
];

/// A minimal `loss_descent` check.
pub const EXAMPLE: &[(&str, &str)] = &[("model", "tiny"), ("steps", "20"), ("max_fraction", "0.9")];

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        at_most("steps", self.steps.0, MAX_STEPS)
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
    // Only the first and last training losses and a running clip tally are
    // kept: memory does not grow with `steps`.
    let (mut first_train, mut last_train) = (f64::NAN, f64::NAN);
    let mut clip = ClipTally::default();
    for i in 0..p.steps.0 {
        let r = trainer.step()?;
        if i == 0 {
            first_train = r.loss;
        }
        last_train = r.loss;
        clip.add(&r);
    }
    let last = trainer.eval_loss(&eval)?;
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
        clip.summary()
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
    let (mut first_train, mut last_train) = (f64::NAN, f64::NAN);
    for i in 0..p.steps.0 {
        let loss = t.step(gpu)?.loss;
        if i == 0 {
            first_train = loss;
        }
        last_train = loss;
    }
    let last = t.eval_loss(gpu, &eval)?;
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

impl Kind<crate::Qlora> for Params {
    fn execute(&self, backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        loss_descent(self, backend, cx)
    }

    /// On cpu: the reference's model and step bounds and its memory (see
    /// `cpu_budget`). On cuda the device memory decides in `unjudged_on`.
    fn check_budget(&self, backend: Backend, here: &Here) -> std::result::Result<(), String> {
        match backend {
            Backend::Cpu => cpu_budget(&self.model.0, self.steps.0, 1, here),
            Backend::Cuda => Ok(()),
        }
    }

    /// On cuda: whether the trainer fits the GPU's free memory.
    fn unjudged_on(&self, backend: Backend, here: &Here) -> Option<String> {
        let cfg = self.model.0;
        let needed = trainer_bytes(&cfg, &self.mode.gpu_options(self.hyper));
        trainer_shortfall(backend, &cfg, needed, here)
    }

    /// Observed: 0.23 s on a 2-core cpu (20 steps of `tiny`), 0.15 s on an
    /// H200 (100 steps); at the step bounds 25 s on cpu, ~15 s (small-4l)
    /// on cuda.
    fn default_timeout_s(&self) -> f64 {
        TRAINING_TIMEOUT_S
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::params::tests::{ci, with_gpu};

    fn params(yaml: &str) -> std::result::Result<Params, String> {
        crate::check::params::tests::parse(yaml)
    }

    #[test]
    fn steps_without_end_are_refused_when_the_contract_is_read() {
        for steps in ["4000000000", "100000000"] {
            let e = params(&format!("model: tiny\nsteps: {steps}\nmax_fraction: 0.9")).unwrap_err();
            assert_eq!(e, format!("steps: {steps} is above its bound of 10000"));
        }
    }

    #[test]
    fn the_cpu_reference_takes_small_models_and_few_steps() {
        let p = params("model: tiny\nsteps: 2000\nmax_fraction: 0.9").unwrap();
        assert_eq!(p.check_budget(Backend::Cpu, &ci()), Ok(()));
        let p = params("model: tiny\nsteps: 5000\nmax_fraction: 0.9").unwrap();
        let e = p.check_budget(Backend::Cpu, &ci()).unwrap_err();
        assert!(
            e.starts_with("steps: 5000 is above the cpu bound of 2000"),
            "{e}"
        );
        assert_eq!(p.check_budget(Backend::Cuda, &ci()), Ok(()));
        let p = params("model: qwen2.5-coder-1.5b\nsteps: 2\nmax_fraction: 0.9").unwrap();
        let e = p.check_budget(Backend::Cpu, &ci()).unwrap_err();
        assert!(e.starts_with("model: qwen2.5-coder-1.5b has "), "{e}");
        assert!(e.contains("frozen parameters"), "{e}");
    }

    #[test]
    fn on_cuda_a_model_beyond_the_free_memory_is_not_judged() {
        let p = params("model: qwen2.5-coder-1.5b\nsteps: 2\nmax_fraction: 0.9").unwrap();
        let mut here = with_gpu("NVIDIA H100 80GB HBM3", 80);
        assert_eq!(p.unjudged_on(Backend::Cuda, &here), None);
        here.gpu.as_mut().unwrap().free_memory_bytes = 2 << 30;
        let why = p.unjudged_on(Backend::Cuda, &here).unwrap();
        assert!(
            why.starts_with("model qwen2.5-coder-1.5b (batch 4, seq 256) needs ~")
                && why.ends_with("NVIDIA H100 80GB HBM3 has 2.0 GiB free"),
            "{why}"
        );
        assert_eq!(p.unjudged_on(Backend::Cpu, &here), None);
        assert_eq!(p.default_timeout_s(), TRAINING_TIMEOUT_S);
    }
}
