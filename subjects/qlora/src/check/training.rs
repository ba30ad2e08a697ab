//! Execution of the training checks on each backend.
//!
//! On `cpu` the checks run the reference training step
//! ([`crate::reference::train`]) on models small enough for CI; on `cuda` they
//! run the GPU step ([`super::GpuTrainer`]) from the same seeds, so both
//! backends train the same model on the same batches.

use crate::check::params::{fits_host, gpu_shortfall};
use crate::check::params::{BackwardMath, GemmOperands};
use crate::check::params::{Hyper, StepMode};
use crate::check::stats::{median_interval_above, median_settled_above};
use crate::check::{clocks, process_memory, Backend, Here};
use crate::error::{Error, Result};
use crate::mutant::Mutant;
use crate::reference::train::{StepFaults, StepReport, TrainOptions, Trainer};
use qlora::gpu::GpuContext;
use qlora::model::ModelConfig;
use qlora::train::{GpuTrainOptions, GpuTrainer};

/// The CPU reference trains in f64 with plain loops; beyond this many frozen
/// parameters a step takes seconds, so a contract asking for more on `cpu`
/// is refused instead of stalling the suite.
pub(super) const CPU_MAX_BASE_PARAMS: usize = 1 << 20;

/// Most steps a training check runs on any backend (`steps`): 10,000
/// graphed steps of small-4l stay well inside the trial's timeout; the
/// shipped checks run up to 1,000.
pub(super) const MAX_STEPS: usize = 10_000;

/// Most steps one run of the CPU reference trains: a step of `tiny` takes
/// ~12 ms on a 2-core CI machine (2,000 steps of `loss_descent` measured
/// 25 s), so a `trajectory_match` of two runs takes ~50 s, inside the
/// training kinds' timeout.
pub(super) const CPU_MAX_STEPS: usize = 2_000;

/// Seconds a GPU training or throughput trial may take by default: the
/// slowest trial of the H200 suite took 16 s (a serialised-launch mutant on
/// qwen2.5-0.5b), and a trial in its own process also creates its CUDA
/// context and compiles its kernels; 180 s leaves ~10x headroom.
pub(super) const TRAINING_TIMEOUT_S: f64 = 180.0;

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

/// Losses of `steps` reference steps, and the clip summary of the run. Only
/// the losses are kept per step (8 bytes each), not the steps' reports.
pub(super) fn cpu_losses(
    cfg: &ModelConfig,
    options: TrainOptions,
    steps: usize,
    seed: u64,
) -> Result<(Vec<f64>, String)> {
    let mut t = Trainer::new(cfg, options, seed)?;
    let mut losses = Vec::with_capacity(steps);
    let mut clip = ClipTally::default();
    for _ in 0..steps {
        let r = t.step()?;
        clip.add(&r);
        losses.push(r.loss);
    }
    Ok((losses, clip.summary()))
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
    if mode.lm_head_operands != GemmOperands::F32 || mode.projection_operands != GemmOperands::F32 {
        return Err(Error::InvalidArgument {
            op: "train",
            message: format!(
                "step mode {mode}: the reference computes in f64; f16 operands need cuda"
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

/// `cfg` itself when the CPU reference step runs it (see [`cpu_model_refusal`]).
pub(super) fn cpu_model(cfg: &ModelConfig) -> Result<ModelConfig> {
    match cpu_model_refusal(cfg) {
        Some(why) => Err(Error::InvalidArgument {
            op: "train",
            message: format!("model {} has {why}", cfg.name),
        }),
        None => Ok(*cfg),
    }
}

/// Why the CPU reference step does not run `cfg`: more than
/// [`CPU_MAX_BASE_PARAMS`] frozen parameters, `layers x base_per_layer + 2 x
/// vocab x hidden` (embedding and LM head included).
pub(super) fn cpu_model_refusal(cfg: &ModelConfig) -> Option<String> {
    let base = cfg.layers * cfg.base_params_per_layer() + 2 * cfg.vocab * cfg.hidden;
    (base > CPU_MAX_BASE_PARAMS).then(|| {
        format!(
            "{base} frozen parameters; the CPU reference step runs models up to {CPU_MAX_BASE_PARAMS} (use `tiny`, or run on cuda)"
        )
    })
}

/// Host bytes of the CPU reference model of `cfg` and one step of it, an
/// estimate counting every value as an f64: the frozen weights
/// `8 (n_base + 2 V H)`, the trainable parameters with their gradients and
/// two moments `32 P`, and the activations of one step,
/// `8 T (L (8 H + 3 I + Hq S) + 2 V)` (per layer the hidden-wide tensors, the
/// MLP's three and the attention probabilities; then logits and their
/// gradient), with `T = batch x seq_len`.
pub(super) fn reference_bytes(cfg: &ModelConfig) -> f64 {
    let f = |v: usize| v as f64;
    let base = f(cfg.layers) * f(cfg.base_params_per_layer()) + 2.0 * f(cfg.vocab) * f(cfg.hidden);
    let per_layer = 8.0 * f(cfg.hidden) + 3.0 * f(cfg.intermediate) + f(cfg.heads) * f(cfg.seq_len);
    let acts = f(cfg.tokens()) * (f(cfg.layers) * per_layer + 2.0 * f(cfg.vocab));
    8.0 * (base + acts) + 32.0 * f(cfg.trainable_params())
}

/// The cpu side of a training check that trains `runs` reference runs of
/// `steps` steps of `cfg`: the model bound, [`CPU_MAX_STEPS`], and host
/// memory, [`reference_bytes`] plus 8 bytes a step for each run's losses.
pub(super) fn cpu_budget(
    cfg: &ModelConfig,
    steps: usize,
    runs: usize,
    here: &Here,
) -> std::result::Result<(), String> {
    if let Some(why) = cpu_model_refusal(cfg) {
        return Err(format!("model: {} has {why}", cfg.name));
    }
    if steps > CPU_MAX_STEPS {
        return Err(format!(
            "steps: {steps} is above the cpu bound of {CPU_MAX_STEPS} (a reference step of `tiny` takes ~12 ms on a 2-core CI machine); run longer trainings on cuda"
        ));
    }
    let needed = reference_bytes(cfg) + 8.0 * (steps * runs) as f64;
    fits_host(
        &format!("model: {} for {steps} steps", cfg.name),
        needed,
        here,
    )
}

/// Device bytes a `GpuTrainer` of `cfg` with `options` allocates, as the
/// stack plans them before allocating (`qlora::train::planned_device_bytes`).
pub(super) fn trainer_bytes(cfg: &ModelConfig, options: &GpuTrainOptions) -> f64 {
    qlora::train::planned_device_bytes(cfg, options) as f64
}

/// Why `needed` device bytes for trainers of `cfg` do not fit the GPU of
/// `here`, naming the configuration, or `None` (always for a trial that
/// trains on the cpu).
pub(super) fn trainer_shortfall(
    backend: Backend,
    cfg: &ModelConfig,
    needed: f64,
    here: &Here,
) -> Option<String> {
    if backend != Backend::Cuda {
        return None;
    }
    let what = format!(
        "model {} (batch {}, seq {})",
        cfg.name, cfg.batch, cfg.seq_len
    );
    gpu_shortfall(&what, needed, here)
}

/// How often clipping changed the gradients, for the detail column: steps
/// (global) or layer-steps (per layer) with `scale < 1`, and the mean
/// pre-clip norm of the clip groups. Tallied step by step, so a run keeps
/// no per-step reports.
#[derive(Debug, Clone, Default)]
pub(super) struct ClipTally {
    groups: usize,
    scaled: usize,
    norm_sum: f64,
}

impl ClipTally {
    /// Counts the clip groups of one step.
    pub(super) fn add(&mut self, report: &StepReport) {
        self.groups += report.clip.len();
        self.scaled += report.clip.iter().filter(|c| c.scaled()).count();
        self.norm_sum += report.clip.iter().map(|c| c.norm).sum::<f64>();
    }

    pub(super) fn summary(&self) -> String {
        let norm = self.norm_sum / self.groups.max(1) as f64;
        format!(
            "clip scaled {}/{} group-steps, mean pre-clip norm {norm:.3}",
            self.scaled, self.groups
        )
    }
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

/// Timed steps of one training configuration: each step's time (ms),
/// whether a captured graph was replayed, and the device memory it added.
pub(super) struct TimedSteps {
    pub ms: Vec<f64>,
    pub replayed: bool,
    pub memory: DeviceMemory,
}

/// Builds a trainer for `cfg`, takes `warmup` untimed steps (at least 2, so
/// a graphed mode has captured and replayed), then times `repeats` steps on
/// fresh batches ([`timed_step`]). With `settle_above`, a step time in ms
/// (a mutant's run of a check that fails when the median exceeds it), timing
/// stops as soon as the median of `repeats` steps is certain to exceed it
/// ([`median_settled_above`]: the verdict is that of all `repeats`), or the
/// 95% interval of the median so far lies wholly above it
/// ([`median_interval_above`]: the check has failed). Device
/// memory is sampled after building and after each untimed step, never
/// inside a timed one. The trainer is dropped before this returns, so its
/// memory is free again.
pub(super) fn time_steps(
    gpu: &mut GpuContext,
    cfg: &ModelConfig,
    (options, seed): (GpuTrainOptions, u64),
    (warmup, repeats): (usize, usize),
    settle_above: Option<f64>,
) -> Result<TimedSteps> {
    let steps = (warmup, repeats);
    time_steps_then(gpu, cfg, (options, seed), steps, settle_above, || ()).map(|(t, ())| t)
}

/// [`time_steps`], and what `after` returns, called once the timed steps
/// are done and before the trainer is dropped: while it still holds
/// everything it allocated (its workspace is allocated when it is built and
/// a graphed step allocates nothing, so that is its peak).
pub(super) fn time_steps_then<T>(
    gpu: &mut GpuContext,
    cfg: &ModelConfig,
    (options, seed): (GpuTrainOptions, u64),
    (warmup, repeats): (usize, usize),
    settle_above: Option<f64>,
    after: impl FnOnce() -> T,
) -> Result<(TimedSteps, T)> {
    let mut memory = DeviceMemory::start(gpu)?;
    let mut t = GpuTrainer::new(gpu, cfg, options, seed)?;
    memory.sample(gpu)?;
    for _ in 0..warmup.max(2) {
        t.step(gpu)?;
        memory.sample(gpu)?;
    }
    let mut ms = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        let tokens = t.next_batch()?;
        ms.push(timed_step(gpu, &mut t, &tokens)?);
        if settle_above.is_some_and(|limit| settled_above(&ms, repeats, limit, seed)) {
            break;
        }
    }
    memory.sample(gpu)?;
    let timed = TimedSteps {
        ms,
        replayed: t.graph_ready(),
        memory,
    };
    Ok((timed, after()))
}

/// Whether a mutant's timed steps `ms` (of `planned`) have shown a median
/// above `limit`: certainly, or by the 95% interval (see [`time_steps`]).
pub(super) fn settled_above(ms: &[f64], planned: usize, limit: f64, seed: u64) -> bool {
    median_settled_above(ms, planned, limit) || median_interval_above(ms, limit, seed)
}

/// The device memory a training configuration adds, as the driver reports
/// it ([`Figure`]), sampled at points the caller chooses, minus what was in
/// use when tracking started; `peak` is the largest sample. A sample
/// synchronizes the device, so none is taken inside a timed step. The
/// trainer allocates its buffers when it is built and a graphed step
/// allocates nothing, so samples after building and after the first steps
/// (the second captures the graph) see the peak.
pub(super) struct DeviceMemory {
    figure: Figure,
    before: usize,
    peak: usize,
}

/// Which of the driver's figures a [`DeviceMemory`] reads.
enum Figure {
    /// The whole GPU's memory in use, `total - free` (`cuMemGetInfo`): any
    /// process on the GPU moves it.
    Gpu,
    /// This process's own, as the driver lists it per process
    /// ([`process_memory`]: NVML's figure, every allocation of the process
    /// on the GPU named by this PCI bus id): no other process moves it.
    Process { bus_id: String },
}

impl DeviceMemory {
    /// Starts tracking the whole GPU's memory in use: what is in use now is
    /// not counted.
    pub(super) fn start(gpu: &GpuContext) -> Result<Self> {
        Self::start_with(gpu, Figure::Gpu)
    }

    /// Starts tracking this process's own memory; the trial is not judged
    /// where the driver does not list it (no `nvidia-smi`, process ids it
    /// does not know, `[N/A]`).
    pub(super) fn start_own(gpu: &GpuContext) -> Result<Self> {
        let bus_id = clocks::pci_bus_id(gpu.options().ordinal).map_err(Error::NotReported)?;
        Self::start_with(gpu, Figure::Process { bus_id })
    }

    fn start_with(gpu: &GpuContext, figure: Figure) -> Result<Self> {
        Ok(DeviceMemory {
            before: figure.used_bytes(gpu)?,
            figure,
            peak: 0,
        })
    }

    /// Nothing added, for tests of what reads a measurement.
    #[cfg(test)]
    pub(super) fn zero() -> Self {
        DeviceMemory {
            figure: Figure::Gpu,
            before: 0,
            peak: 0,
        }
    }

    /// Takes a sample.
    pub(super) fn sample(&mut self, gpu: &GpuContext) -> Result<()> {
        let now = self.figure.used_bytes(gpu)?;
        self.peak = self.peak.max(now.saturating_sub(self.before));
        Ok(())
    }

    /// The largest sample, GiB.
    pub(super) fn peak_gib(&self) -> f64 {
        gib(self.peak)
    }
}

impl Figure {
    /// Bytes in use now, after the work queued so far.
    fn used_bytes(&self, gpu: &GpuContext) -> Result<usize> {
        gpu.synchronize()?;
        match self {
            Figure::Gpu => {
                let (free, total) = gpu.memory_bytes()?;
                Ok(total.saturating_sub(free))
            }
            Figure::Process { bus_id } => {
                let mib = process_memory::process_mib(bus_id, std::process::id())
                    .map_err(Error::NotReported)?;
                Ok(usize::try_from(mib)
                    .unwrap_or(usize::MAX)
                    .saturating_mul(1 << 20))
            }
        }
    }
}

/// `bytes` in GiB.
pub(super) fn gib(bytes: usize) -> f64 {
    bytes as f64 / f64::from(1u32 << 30)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::params::ClipMode;
    use crate::check::{gradient_parity, trajectory_match, Validate};

    fn traj(extra: &str) -> std::result::Result<(), String> {
        let yaml = format!("model: tiny\nsteps: 4\ncheckpoints: [4]\nmax_abs_diff: 0.01\n{extra}");
        crate::check::params::tests::parse::<trajectory_match::Params>(&yaml).map(|_| ())
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
            backward_weights: crate::check::params::BackwardWeights::Transposed,
            lm_head_operands: crate::check::params::GemmOperands::F16,
            projection_operands: crate::check::params::GemmOperands::F32,
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
        assert!(o.keep_mlp && o.transposed_weights && o.f16_lm_head);
        // An NF4 base keeps no W^T, so the name leaves it out.
        assert_eq!(
            mode.to_string(),
            "graphed/per-layer-clip/nf4/tf32-backward/keep-mlp/f16-lm-head"
        );
        let fp32 = StepMode {
            base: crate::check::params::BaseWeights::Fp32,
            projection_operands: crate::check::params::GemmOperands::F16,
            ..mode
        };
        assert!(fp32.gpu_options(Hyper::default()).f16_projections);
        assert_eq!(
            fp32.to_string(),
            "graphed/per-layer-clip/fp32/tf32-backward/keep-mlp/transposed-weights/f16-lm-head/f16-projections"
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
