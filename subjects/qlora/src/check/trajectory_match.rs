//! `trajectory_match`: the losses of two training modes at checkpoints.
//! Passes when `max_i |loss_baseline(c_i) - loss_candidate(c_i)| <= max_abs_diff`;
//! with a `noise` mode, when `max_i (|loss_baseline(c_i) - loss_candidate(c_i)|
//! - NOISE_FACTOR |loss_baseline(c_i) - loss_noise(c_i)|) <= max_abs_diff`.

use crate::check::training::*;
use crate::check::MutantFaults;
use crate::check::{require_gpu, Comparator};
use crate::error::{Error, Result};
use qlora::gpu::GpuContext;

use serde::Deserialize;

use super::doc::{ParamDefault::*, ParamDoc, Piece::*};
use super::doc::{DEFAULT_HYPER, HYPER_BOUND, STEP_MODE_BOUND, TRAINING_MODEL_BOUND};

use super::params::{at_most, Count, Hyper, ModelName, NonNegative, StepMode};
use super::{Backend, Here, Kind, Measurement, TrialContext, Validate};

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
    /// Training steps of each run: at most `MAX_STEPS`, and at most
    /// `CPU_MAX_STEPS` for a run on cpu.
    pub steps: Count,
    /// 1-based step numbers at which the losses are compared, each at most
    /// `steps`; at most [`MAX_CHECKPOINTS`] of them.
    pub checkpoints: Vec<Count>,
    pub baseline: StepMode,
    pub candidate: StepMode,
    pub max_abs_diff: NonNegative,
    #[serde(default)]
    pub hyper: Hyper,
    /// Where the baseline runs (default: the trial's backend).
    #[serde(default)]
    pub baseline_on: BaselineOn,
    /// A third run: the baseline's computation with another rounding that
    /// is no less precise (say FP32 GEMMs for TF32 ones). How far it ends
    /// from the baseline at a checkpoint is the trajectory's own noise
    /// there, and the candidate may differ by [`NOISE_FACTOR`] times that
    /// on top of `max_abs_diff`.
    #[serde(default)]
    pub noise: Option<StepMode>,
}

/// How many times the noise arm's distance from the baseline a candidate
/// may add to `max_abs_diff` at a checkpoint: the FlashAttention test
/// criterion (an op's error at most twice that of a reference computed
/// with other rounding, plus a floor), lifted from an op to a training run.
/// A run at a learning rate that makes training chaotic amplifies any
/// change of rounding, a more precise one included, by an amount that
/// depends on the seed; the noise arm measures that amount in the same
/// trial instead of a bound guessing it.
pub const NOISE_FACTOR: f64 = 2.0;

/// Most checkpoints one trial compares (one detail entry each).
pub const MAX_CHECKPOINTS: usize = 1_000;

/// The parameters of `trajectory_match`, for the generated reference.
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
            Text(" per run"),
        ],
        meaning: "training steps of each run",
    },
    ParamDoc {
        name: "checkpoints",
        default: Required,
        bound: &[
            Text("1 to "),
            Int(MAX_CHECKPOINTS),
            Text(" step numbers, each <= `steps`"),
        ],
        meaning: "1-based steps at which the losses are compared",
    },
    ParamDoc {
        name: "baseline",
        default: Required,
        bound: STEP_MODE_BOUND,
        meaning: "the baseline's step mode; `graph: false` with `baseline_on: cpu`",
    },
    ParamDoc {
        name: "candidate",
        default: Required,
        bound: STEP_MODE_BOUND,
        meaning: "the candidate's step mode; differs from `baseline` unless `baseline_on: cpu`",
    },
    ParamDoc {
        name: "max_abs_diff",
        default: Required,
        bound: &[Text(">= 0")],
        meaning: "bound on the largest loss difference at a checkpoint",
    },
    ParamDoc {
        name: "hyper",
        default: Yaml(DEFAULT_HYPER),
        bound: HYPER_BOUND,
        meaning: "optimiser hyper-parameters of both runs",
    },
    ParamDoc {
        name: "baseline_on",
        default: Yaml("trial"),
        bound: &[OneOf(&["trial", "cpu"])],
        meaning: "the trial's backend, or the CPU reference step (f64)",
    },
    ParamDoc {
        name: "noise",
        default: Otherwise("none"),
        bound: STEP_MODE_BOUND,
        meaning: "a third run, the baseline's computation rounded otherwise; the bound at a checkpoint grows by 2 x its distance from the baseline there",
    },
];

/// A minimal `trajectory_match` check.
pub const EXAMPLE: &[(&str, &str)] = &[
    ("model", "tiny"),
    ("steps", "10"),
    ("checkpoints", "[1, 10]"),
    ("baseline", "{clip: global}"),
    ("candidate", "{clip: per_layer}"),
    ("max_abs_diff", "0.1"),
];

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        at_most("steps", self.steps.0, MAX_STEPS)?;
        at_most("checkpoints", self.checkpoints.len(), MAX_CHECKPOINTS)?;
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
        self.validate_noise()
    }
}

impl Params {
    /// A noise arm measures the baseline's own spread, so it must run where
    /// the baseline runs and differ from both other arms: equal to the
    /// baseline it measures nothing, equal to the candidate it would excuse
    /// any difference the candidate makes.
    fn validate_noise(&self) -> std::result::Result<(), String> {
        let Some(noise) = &self.noise else {
            return Ok(());
        };
        if self.baseline_on == BaselineOn::Cpu {
            return Err("`noise` measures the baseline's spread on the trial's backend; it cannot be used with `baseline_on: cpu`".into());
        }
        if noise == &self.baseline {
            return Err("`noise` is the baseline's mode; it would measure no spread".into());
        }
        if noise == &self.candidate {
            return Err(
                "`noise` is the candidate's mode; it would excuse any difference the candidate makes"
                    .into(),
            );
        }
        Ok(())
    }
}

/// Passes when `max_c |loss_baseline(c) - loss_candidate(c)| <= max_abs_diff`,
/// or with a noise arm when the largest difference beyond
/// [`NOISE_FACTOR`] times the noise arm's is. Every run starts from the same
/// seeded weights and sees the same batches; the trial's mutant is injected
/// into the candidate only.
///
/// A mutant run exists only to show that the check fails, so it first trains
/// both arms up to the earliest checkpoint ([`mutant_prefix`]) and stops there
/// when that checkpoint already fails. The prefix's losses are the full run's
/// first losses: both trainers step with a constant learning rate and draw one
/// seeded batch per step, and neither is told the run's length. Otherwise the
/// full run follows, as in a real trial.
fn trajectory_match(p: &Params, b: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
    if let Some(n) = cx.mutant.and(mutant_prefix(&p.checkpoints, p.steps.0)) {
        let arms = run_arms(p, b, cx, n)?;
        let worst = compare(&[n], &arms)?;
        if !Comparator::Le.holds(worst.0, p.max_abs_diff.0) {
            return Ok(measurement(p, &arms, worst, Some(n)));
        }
    }
    let arms = run_arms(p, b, cx, p.steps.0)?;
    let checkpoints: Vec<usize> = p.checkpoints.iter().map(|c| c.0).collect();
    let worst = compare(&checkpoints, &arms)?;
    Ok(measurement(p, &arms, worst, None))
}

/// The steps a mutant run trains first: its earliest checkpoint, when that
/// comes before `steps` (otherwise the prefix would be the whole run).
pub(super) fn mutant_prefix(checkpoints: &[Count], steps: usize) -> Option<usize> {
    let first = checkpoints.iter().map(|c| c.0).min()?;
    (first < steps).then_some(first)
}

/// Every arm's losses over one run, and how each ran (for the detail).
struct Arms {
    base: Vec<f64>,
    base_text: String,
    cand: Vec<f64>,
    cand_text: String,
    noise: Option<(Vec<f64>, String)>,
}

/// The baseline, the candidate, then the noise arm when there is one, each
/// a fresh run of `steps` steps.
fn run_arms(p: &Params, b: Backend, cx: &mut TrialContext<'_>, steps: usize) -> Result<Arms> {
    let (base, base_text) = baseline_arm(p, b, cx, steps)?;
    let (cand, cand_text) = candidate_arm(p, b, cx, steps)?;
    let noise = match &p.noise {
        Some(mode) => Some(noise_arm(mode, p, b, cx, steps)?),
        None => None,
    };
    Ok(Arms {
        base,
        base_text,
        cand,
        cand_text,
        noise,
    })
}

/// The noise arm's losses on the trial's backend, never with the mutant's
/// faults (it measures the correct computation's spread).
fn noise_arm(
    mode: &StepMode,
    p: &Params,
    b: Backend,
    cx: &mut TrialContext<'_>,
    steps: usize,
) -> Result<(Vec<f64>, String)> {
    fault_free_arm(mode, b == Backend::Cpu, p, cx, steps)
}

/// The baseline's losses: on the CPU reference on a cpu trial or with
/// `baseline_on: cpu`, else on the GPU; never with the mutant's faults.
fn baseline_arm(
    p: &Params,
    b: Backend,
    cx: &mut TrialContext<'_>,
    steps: usize,
) -> Result<(Vec<f64>, String)> {
    let on_cpu = b == Backend::Cpu || p.baseline_on == BaselineOn::Cpu;
    fault_free_arm(&p.baseline, on_cpu, p, cx, steps)
}

/// The losses of `steps` steps in `mode`, on the CPU reference (`on_cpu`)
/// or the GPU, without the mutant's faults, and how it ran.
fn fault_free_arm(
    mode: &StepMode,
    on_cpu: bool,
    p: &Params,
    cx: &mut TrialContext<'_>,
    steps: usize,
) -> Result<(Vec<f64>, String)> {
    let text = mode_text(mode, &p.hyper);
    if on_cpu {
        let cfg = cpu_model(&p.model.0)?;
        let opts = reference_options(mode, p.hyper, None)?;
        let (l, clip) = cpu_losses(&cfg, opts, steps, cx.seed)?;
        return Ok((l, format!("cpu reference {text}: {clip}")));
    }
    let seed = cx.seed;
    let gpu = require_gpu(cx)?;
    let (l, replayed) = gpu_losses(gpu, &p.model.0, mode.gpu_options(p.hyper), steps, seed)?;
    Ok((l, format!("gpu {text} ({replayed} graph replays)")))
}

/// The candidate's losses on the trial's backend, with the mutant's faults.
fn candidate_arm(
    p: &Params,
    b: Backend,
    cx: &mut TrialContext<'_>,
    steps: usize,
) -> Result<(Vec<f64>, String)> {
    let mode = mode_text(&p.candidate, &p.hyper);
    if b == Backend::Cpu {
        let cfg = cpu_model(&p.model.0)?;
        let opts = reference_options(&p.candidate, p.hyper, cx.mutant)?;
        let (l, clip) = cpu_losses(&cfg, opts, steps, cx.seed)?;
        return Ok((l, format!("{mode}: {clip}")));
    }
    let opts = p.candidate.gpu_options(p.hyper);
    let seed = cx.seed;
    let faults = cx.faults();
    let mut scope = require_gpu(cx)?.with_faults(faults);
    let gpu: &mut GpuContext = &mut scope;
    let (l, replayed) = gpu_losses(gpu, &p.model.0, opts, steps, seed)?;
    let name = &gpu.facts().name;
    Ok((
        l,
        format!("gpu {mode} on {name} ({replayed} graph replays)"),
    ))
}

/// The largest of `|base(c) - cand(c)| - NOISE_FACTOR |base(c) - noise(c)|`
/// over the 1-based `checkpoints` (without a noise arm, of `|base(c) -
/// cand(c)|`; NaN when any term is NaN), and one entry each for the detail:
/// "step c: base vs cand", and with a noise arm its loss and the allowance
/// it gives.
fn compare(checkpoints: &[usize], arms: &Arms) -> Result<(f64, Vec<String>)> {
    let at = |r: &[f64], c: usize| {
        r.get(c.wrapping_sub(1))
            .copied()
            .ok_or_else(|| Error::InvalidArgument {
                op: "trajectory_match",
                message: format!("checkpoint {c} is outside steps 1..={}", r.len()),
            })
    };
    let mut worst = f64::NEG_INFINITY;
    let mut points = Vec::with_capacity(checkpoints.len());
    for &c in checkpoints {
        let (lb, lc) = (at(&arms.base, c)?, at(&arms.cand, c)?);
        let mut excess = (lb - lc).abs();
        let mut point = format!("step {c}: {lb:.4} vs {lc:.4}");
        if let Some((noise, _)) = &arms.noise {
            let ln = at(noise, c)?;
            let allowance = NOISE_FACTOR * (lb - ln).abs();
            excess -= allowance;
            point.push_str(&format!(" (noise {ln:.4}, allowance {allowance:.4})"));
        }
        if excess > worst || excess.is_nan() {
            worst = excess;
        }
        points.push(point);
    }
    Ok((worst, points))
}

/// The trial's measurement; `stopped_at` names the step a mutant run stopped
/// at because that checkpoint already failed.
fn measurement(
    p: &Params,
    arms: &Arms,
    (worst, points): (f64, Vec<String>),
    stopped_at: Option<usize>,
) -> Measurement {
    let noise = match &arms.noise {
        Some((_, text)) => format!("; noise {text}"),
        None => String::new(),
    };
    let mut detail = format!(
        "model {}, {} steps; baseline {}; candidate {}{noise}; {}",
        p.model.0.name,
        p.steps.0,
        arms.base_text,
        arms.cand_text,
        points.join(", ")
    );
    if let Some(n) = stopped_at {
        detail.push_str(&format!(
            "; the mutant run stopped at step {n}: that checkpoint already failed"
        ));
    }
    let metric = if arms.noise.is_some() {
        "max_loss_diff_beyond_noise"
    } else {
        "max_abs_loss_diff"
    };
    Measurement::new(metric, worst, Comparator::Le, p.max_abs_diff.0, "nats").with_detail(detail)
}

impl Params {
    /// Reference runs on the host: both on cpu, the baseline alone with
    /// `baseline_on: cpu` on cuda.
    fn cpu_runs(&self, backend: Backend) -> usize {
        match (backend, self.baseline_on) {
            (Backend::Cpu, _) => 2 + usize::from(self.noise.is_some()),
            (Backend::Cuda, BaselineOn::Cpu) => 1,
            (Backend::Cuda, BaselineOn::Trial) => 0,
        }
    }
}

impl Kind<crate::Qlora> for Params {
    fn execute(&self, backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        trajectory_match(self, backend, cx)
    }

    /// The runs on the CPU reference (see `cpu_budget`); device memory
    /// decides in `unjudged_on`.
    fn check_budget(&self, backend: Backend, here: &Here) -> std::result::Result<(), String> {
        match self.cpu_runs(backend) {
            0 => Ok(()),
            runs => cpu_budget(&self.model.0, self.steps.0, runs, here),
        }
    }

    /// On cuda: whether the larger of the GPU runs' trainers (one at a time)
    /// fits the GPU's free memory.
    fn unjudged_on(&self, backend: Backend, here: &Here) -> Option<String> {
        if backend != Backend::Cuda {
            return None;
        }
        let cfg = self.model.0;
        let mut modes = vec![&self.candidate];
        if self.baseline_on == BaselineOn::Trial {
            modes.push(&self.baseline);
        }
        modes.extend(self.noise.as_ref());
        let needed = modes
            .iter()
            .map(|m| trainer_bytes(&cfg, &m.gpu_options(self.hyper)))
            .fold(0.0, f64::max);
        trainer_shortfall(Backend::Cuda, &cfg, needed, here)
    }

    /// Many times this kind's longest trial (its `duration_ms` in the
    /// committed baselines); the step bounds keep a cpu trial within it.
    fn default_timeout_s(&self) -> f64 {
        TRAINING_TIMEOUT_S
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::params::tests::{ci, with_gpu};

    fn params(extra: &str) -> std::result::Result<Params, String> {
        crate::check::params::tests::parse(&format!(
            "checkpoints: [4]\nmax_abs_diff: 0.1\nbaseline: {{}}\n{extra}"
        ))
    }

    #[test]
    fn steps_and_checkpoints_are_bounded() {
        let e = params("model: tiny\nsteps: 100000000\ncandidate: {clip: per_layer}").unwrap_err();
        assert_eq!(e, "steps: 100000000 is above its bound of 10000");
        let many: Vec<String> = (0..1001).map(|_| "4".to_string()).collect();
        let yaml = format!(
            "model: tiny\nsteps: 4\ncheckpoints: [{}]\nmax_abs_diff: 0.1\nbaseline: {{}}\ncandidate: {{clip: per_layer}}",
            many.join(", ")
        );
        let p: Params = serde_yaml::from_str(&yaml).unwrap();
        assert_eq!(
            p.validate().unwrap_err(),
            "checkpoints: 1001 is above its bound of 1000"
        );
    }

    #[test]
    fn the_cpu_runs_are_budgeted_on_either_backend() {
        let p = params("model: tiny\nsteps: 3000\ncandidate: {clip: per_layer}").unwrap();
        let e = p.check_budget(Backend::Cpu, &ci()).unwrap_err();
        assert!(
            e.starts_with("steps: 3000 is above the cpu bound of 2000"),
            "{e}"
        );
        // Both runs on the GPU: no cpu bound.
        assert_eq!(p.check_budget(Backend::Cuda, &ci()), Ok(()));
        // The baseline on the CPU reference is bound on a cuda trial too.
        let p = params("model: small-4l\nsteps: 4\nbaseline_on: cpu\ncandidate: {graph: true}")
            .unwrap();
        let e = p.check_budget(Backend::Cuda, &ci()).unwrap_err();
        assert!(e.starts_with("model: small-4l has "), "{e}");
    }

    fn counts(steps: &[usize]) -> Vec<Count> {
        steps.iter().map(|&s| Count(s)).collect()
    }

    fn arms(base: &[f64], cand: &[f64], noise: Option<&[f64]>) -> Arms {
        Arms {
            base: base.to_vec(),
            base_text: String::new(),
            cand: cand.to_vec(),
            cand_text: String::new(),
            noise: noise.map(|n| (n.to_vec(), String::new())),
        }
    }

    /// F-BF16-004's mutant on the GPU: checkpoints [10, 50, 100] of 100
    /// steps, bound 0.03, and the step-10 losses already 0.0707 apart.
    #[test]
    fn a_mutant_failing_at_its_first_checkpoint_stops_there() {
        let n = mutant_prefix(&counts(&[10, 50, 100]), 100).unwrap();
        assert_eq!(n, 10);
        let base = vec![2.5; n];
        let mut cand = base.clone();
        cand[n - 1] += 0.0707;
        let (worst, points) = compare(&[n], &arms(&base, &cand, None)).unwrap();
        assert!(!Comparator::Le.holds(worst, 0.03), "{worst}");
        assert_eq!(points, ["step 10: 2.5000 vs 2.5707"]);
        // Within the bound at step 10: the full run must decide.
        cand[n - 1] = 2.51;
        let (worst, _) = compare(&[n], &arms(&base, &cand, None)).unwrap();
        assert!(Comparator::Le.holds(worst, 0.03), "{worst}");
    }

    #[test]
    fn a_nan_at_the_first_checkpoint_fails_it() {
        let (worst, _) = compare(&[2], &arms(&[1.0, 1.0], &[1.0, f64::NAN], None)).unwrap();
        assert!(!Comparator::Le.holds(worst, 0.03));
        // An early NaN is not hidden by a finite difference after it.
        let (worst, _) = compare(&[1, 2], &arms(&[1.0, 1.0], &[f64::NAN, 1.5], None)).unwrap();
        assert!(worst.is_nan());
        // Nor by the noise arm, whether the NaN is the candidate's or its own.
        let noise = Some(&[1.0, 1.0][..]);
        let (worst, _) = compare(&[1, 2], &arms(&[1.0, 1.0], &[f64::NAN, 1.0], noise)).unwrap();
        assert!(worst.is_nan());
        let nan_noise = Some(&[f64::NAN, 1.0][..]);
        let (worst, _) = compare(&[1, 2], &arms(&[1.0, 1.0], &[1.0, 1.0], nan_noise)).unwrap();
        assert!(worst.is_nan());
    }

    #[test]
    fn the_prefix_is_the_earliest_checkpoint_before_the_last_step() {
        assert_eq!(mutant_prefix(&counts(&[50, 10, 100]), 100), Some(10));
        assert_eq!(mutant_prefix(&counts(&[10, 20, 1000]), 1000), Some(10));
        // A first checkpoint at the last step leaves nothing to skip.
        assert_eq!(mutant_prefix(&counts(&[20, 20]), 20), None);
        assert_eq!(mutant_prefix(&counts(&[]), 20), None);
    }

    #[test]
    fn a_checkpoint_past_the_run_is_an_error() {
        let e = compare(&[3], &arms(&[1.0, 1.0], &[1.0, 1.0], None)).unwrap_err();
        assert!(
            e.to_string()
                .contains("checkpoint 3 is outside steps 1..=2"),
            "{e}"
        );
    }

    /// F-BF16-002 at seed 3 on an H200: the bf16 step 0.0438 from the fp32
    /// one at step 100, the fp32 step with FP32 backward GEMMs 0.0215.
    #[test]
    fn the_noise_arm_widens_each_checkpoints_bound_by_twice_its_distance() {
        let base = [7.1403, 4.0490, 2.6548];
        let cand = [7.1383, 4.0479, 2.6110];
        let noise = [7.1402, 4.0488, 2.6333];
        let (plain, _) = compare(&[1, 2, 3], &arms(&base, &cand, None)).unwrap();
        assert!(!Comparator::Le.holds(plain, 0.03), "{plain}");
        let (worst, points) = compare(&[1, 2, 3], &arms(&base, &cand, Some(&noise))).unwrap();
        // The first two checkpoints (steps 10 and 50) keep almost all of
        // their bound: 0.0020 - 2 x 0.0001 is the largest excess.
        assert!((worst - 0.0018).abs() < 1e-9, "{worst}");
        assert!(Comparator::Le.holds(worst, 0.03));
        assert_eq!(
            points[2],
            "step 3: 2.6548 vs 2.6110 (noise 2.6333, allowance 0.0430)"
        );
        // A noise arm on the baseline's trajectory gives no allowance.
        let (worst, _) = compare(&[1, 2, 3], &arms(&base, &cand, Some(&base))).unwrap();
        assert_eq!(worst, plain);
    }

    #[test]
    fn a_noise_arm_must_differ_from_both_arms_and_run_beside_the_baseline() {
        let yaml = |noise: &str, extra: &str| {
            params(&format!(
                "model: small-4l\nsteps: 4\ncandidate: {{graph: true, base: bf16}}\nnoise: {noise}\n{extra}"
            ))
        };
        assert!(yaml("{graph: true, backward_math: tf32}", "").is_ok());
        assert_eq!(
            yaml("{}", "").unwrap_err(),
            "`noise` is the baseline's mode; it would measure no spread"
        );
        assert_eq!(
            yaml("{graph: true, base: bf16}", "").unwrap_err(),
            "`noise` is the candidate's mode; it would excuse any difference the candidate makes"
        );
        let e = yaml("{graph: true}", "baseline_on: cpu").unwrap_err();
        assert!(e.contains("cannot be used with `baseline_on: cpu`"), "{e}");
    }

    #[test]
    fn on_cuda_the_larger_trainer_must_fit() {
        let p =
            params("model: small-4l\nsteps: 4\ncandidate: {graph: true, mlp_activations: keep}")
                .unwrap();
        let mut here = with_gpu("NVIDIA H200", 141);
        assert_eq!(p.unjudged_on(Backend::Cuda, &here), None);
        here.gpu.as_mut().unwrap().free_memory_bytes = 1 << 20;
        let why = p.unjudged_on(Backend::Cuda, &here).unwrap();
        assert!(why.ends_with("NVIDIA H200 has 1.0 MiB free"), "{why}");
        assert_eq!(p.unjudged_on(Backend::Cpu, &here), None);
    }
}
