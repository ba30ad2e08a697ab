//! `prewarm`: the trainer pre-warms every kernel its step uses while no
//! weight is on the device, then uploads; after that, running training
//! steps (also with the device's memory filled to within a headroom) loads
//! no module; a cold pre-warm (an empty disk cache) and a cached one (a
//! warmed disk cache) each stay within their bounds.

use std::collections::BTreeSet;

use crate::check::params::at_most;
use crate::check::params::{BaseWeights, StepMode};
use crate::check::training::{trainer_bytes, trainer_shortfall, TRAINING_TIMEOUT_S};
use crate::check::MutantFaults;
use crate::check::{require_gpu, Comparator};
use crate::error::{Error, Result};
use cudarc::driver::CudaSlice;
use qlora::gpu::{GpuContext, PrewarmReport};
use qlora::model::ModelConfig;
use qlora::train::{GpuTrainer, SetupPhase, TrainerSetup};
use qlora::Faults;

use serde::Deserialize;

use super::doc::{ParamDefault::*, ParamDoc, Piece::*, ANY_PRESET};

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
    /// Modules allowed to be loaded (compiled or read from disk) after pre-warm.
    #[serde(default)]
    pub max_loads_after_prewarm: usize,
    /// Bound on each cold pre-warm (an empty kernel cache directory: NVRTC
    /// compilations plus module loads) in milliseconds; none by default.
    #[serde(default)]
    pub max_cold_prewarm_ms: Option<Positive>,
    /// Bound on each cached pre-warm (the directory the cold one filled:
    /// disk reads plus module loads) in milliseconds; none by default.
    #[serde(default)]
    pub max_cached_prewarm_ms: Option<Positive>,
    /// When set, the steps run with the device's memory filled to within
    /// this many MiB of full, after pre-warm and upload: at most
    /// [`MAX_HEADROOM_MIB`].
    #[serde(default)]
    pub memory_headroom_mib: Option<Count>,
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
/// Largest memory headroom: a "small" one is the point (a step that needs
/// more than 4 GiB beyond its workspace is the defect to find).
pub const MAX_HEADROOM_MIB: usize = 4096;

/// The parameters of `prewarm`, for the generated reference.
pub const PARAMS: &[ParamDoc] = &[
    ParamDoc {
        name: "models",
        default: Required,
        bound: &[
            Text("1 to "),
            Int(MAX_MODELS),
            Text(" presets: "),
            ANY_PRESET,
        ],
        meaning: "presets to pre-warm for, one after another",
    },
    ParamDoc {
        name: "bases",
        default: Yaml("[fp32, nf4]"),
        bound: &[
            Text("1 to "),
            Int(MAX_BASES),
            Text(" of "),
            OneOf(super::doc::BASES),
        ],
        meaning: "base-weight formats exercised after pre-warm",
    },
    ParamDoc {
        name: "steps",
        default: Yaml("2"),
        bound: &[Text("1 to "), Int(MAX_PREWARM_STEPS)],
        meaning: "training steps after pre-warm, per model and base",
    },
    ParamDoc {
        name: "max_loads_after_prewarm",
        default: Yaml("0"),
        bound: &[Text(">= 0")],
        meaning: "modules loaded (compiled or read from disk) after pre-warm allowed",
    },
    ParamDoc {
        name: "max_cold_prewarm_ms",
        default: Otherwise("none"),
        bound: &[Text("> 0")],
        meaning: "bound on each pre-warm from an empty kernel cache directory, ms",
    },
    ParamDoc {
        name: "max_cached_prewarm_ms",
        default: Otherwise("none"),
        bound: &[Text("> 0")],
        meaning: "bound on each pre-warm from the directory the cold one filled, ms",
    },
    ParamDoc {
        name: "memory_headroom_mib",
        default: Otherwise("memory not filled"),
        bound: &[Text("1 to "), Int(MAX_HEADROOM_MIB)],
        meaning: "steps run with device memory filled to within this many MiB",
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
        at_most("steps", self.steps.0, MAX_PREWARM_STEPS)?;
        let headroom = self.memory_headroom_mib.map_or(0, |c| c.0);
        at_most("memory_headroom_mib", headroom, MAX_HEADROOM_MIB)
    }
}

impl Kind<crate::Qlora> for Params {
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

    /// Many times this kind's longest trial (its `duration_ms` in the
    /// committed baselines; the parameter bounds keep a trial within it):
    /// a stuck trial is stopped, a slow machine is not.
    fn default_timeout_s(&self) -> f64 {
        TRAINING_TIMEOUT_S
    }

    /// It compares the device memory in use before and during setup, and
    /// may time pre-warms or fill the memory.
    fn needs_the_gpu_alone(&self) -> bool {
        true
    }

    /// A cold pre-warm compiles on a pool of the host's CPU threads, and its time is judged.
    fn needs_the_whole_host(&self) -> bool {
        true
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

/// Runs `body` with `faults` on, on a cold cache: nothing in memory and a
/// fresh, empty kernel cache directory of its own (so "cold" means cold and
/// planted entries reach no other trial). Afterwards the modules compiled
/// under the faults are dropped and the context's own directory is back,
/// also when `body` fails.
pub(super) fn on_cold_cache<T>(
    gpu: &mut GpuContext,
    faults: Faults,
    body: impl FnOnce(&mut GpuContext) -> Result<T>,
) -> Result<T> {
    let dir = tempfile::Builder::new()
        .prefix("falsify-kernel-cache-")
        .tempdir()
        .map_err(|source| Error::Io {
            path: std::env::temp_dir(),
            source,
        })?;
    let own = gpu.set_kernel_cache_dir(Some(dir.path().to_path_buf()));
    gpu.reset_cache();
    let out = body(&mut gpu.with_faults(faults));
    gpu.reset_cache();
    gpu.set_kernel_cache_dir(own);
    out
}

/// What one model and base showed.
struct Observed {
    setup: TrainerSetup,
    /// Free device bytes just before the trainer was made.
    free_before_trainer: usize,
    /// Free device bytes while the steps ran (after the fill, if any).
    free_during_steps: usize,
    loads_after: usize,
    /// Modules the steps used.
    used: BTreeSet<&'static str>,
    /// Modules the trainer's setup used.
    used_in_setup: BTreeSet<&'static str>,
    cached: PrewarmReport,
}

/// `prewarm`: for each model and base, on a cold cache, a `GpuTrainer` (which
/// pre-warms, then uploads), `steps` real training steps (eager, captured and
/// replayed; with memory filled to the headroom when one is set), then a
/// pre-warm again from the disk cache the first one filled.
///
/// A mutant run stops at the first configuration that falsifies the claim:
/// it exists to show the check can fail, and each further configuration
/// costs a cold compilation and a trainer. The real trial checks them all.
fn prewarm(p: &Params, cx: &mut TrialContext<'_>) -> Result<Measurement> {
    let faults = cx.faults();
    let stop_at_first = cx.mutant.is_some();
    let seed = cx.seed;
    let gpu = require_gpu(cx)?;
    let mut total_after = 0usize;
    let mut violations = Vec::new();
    let mut detail = Vec::new();
    let configs = p
        .models
        .iter()
        .flat_map(|m| p.bases.iter().map(move |b| (m.0, b.0)));
    for (config, base) in configs {
        let seen = on_cold_cache(gpu, faults, |gpu| observe(p, gpu, &config, base, seed))?;
        let tag = format!("{}/{}", config.name, base.name());
        total_after += seen.loads_after;
        violations.extend(judge(p, &tag, &seen));
        detail.push(summary(&tag, &seen));
        if stop_at_first && (!violations.is_empty() || total_after > p.max_loads_after_prewarm) {
            detail.push("the mutant run stopped at its first falsified configuration".into());
            break;
        }
    }
    let mut m = Measurement::new(
        "loads_after_prewarm",
        total_after as f64,
        Comparator::Le,
        p.max_loads_after_prewarm as f64,
        "modules",
    )
    .with_detail(detail.join("; "));
    for v in violations {
        m.violate(v);
    }
    Ok(m)
}

/// One model and base on a cold cache: see [`prewarm`].
fn observe(
    p: &Params,
    gpu: &mut GpuContext,
    config: &ModelConfig,
    base: BaseWeights,
    seed: u64,
) -> Result<Observed> {
    let free_before_trainer = gpu.memory_bytes()?.0;
    let mut trainer = GpuTrainer::new(gpu, config, graphed(base).speed_options(), seed)?;
    let setup = trainer.setup().clone();
    // What the trainer's setup used (its weights' draws, the rehearsal
    // step), apart from what the steps below use.
    let used_in_setup = gpu.cache().used().clone();
    gpu.cache_mut().clear_used();
    let headroom = p.memory_headroom_mib.map(|c| c.0 << 20);
    let filler = match headroom {
        Some(bytes) => fill_device(gpu, bytes)?,
        None => Vec::new(),
    };
    let free_during_steps = gpu.memory_bytes()?.0;
    // Step 1 runs eagerly, step 2 captures, later steps replay.
    for _ in 0..p.steps.0 {
        trainer.step(gpu)?;
    }
    gpu.synchronize()?;
    drop(filler);
    drop(trainer);
    gpu.synchronize()?;
    let loads_after = gpu.cache_stats().loaded_after_prewarm;
    let used = gpu.cache().used().clone();
    // The same pre-warm again, with nothing in memory but the directory warm.
    gpu.reset_cache();
    let cached = gpu.prewarm(config, &[base])?;
    Ok(Observed {
        setup,
        free_before_trainer,
        free_during_steps,
        loads_after,
        used,
        used_in_setup,
        cached,
    })
}

/// Allocates device memory until at most `headroom` bytes stay free: 1 GiB
/// at a time, halving a request the allocator refuses, down to 1 MiB.
fn fill_device(gpu: &GpuContext, headroom: usize) -> Result<Vec<CudaSlice<u8>>> {
    const MIB: usize = 1 << 20;
    let mut held = Vec::new();
    let mut chunk = 1usize << 30;
    while chunk >= MIB {
        let free = gpu.memory_bytes()?.0;
        if free <= headroom + MIB {
            break;
        }
        let n = (free - headroom).min(chunk);
        match gpu.zeros::<u8>(n) {
            Ok(buf) => held.push(buf),
            // Fragmentation or the allocator's own reserve: ask for less.
            Err(_) => chunk /= 2,
        }
    }
    gpu.synchronize()?;
    Ok(held)
}

/// The violations of one model and base.
fn judge(p: &Params, tag: &str, seen: &Observed) -> Vec<String> {
    let mut v = Vec::new();
    let prewarmed: BTreeSet<&str> = seen.setup.prewarm.modules.iter().copied().collect();
    let missing: Vec<&str> = seen.used.difference(&prewarmed).copied().collect();
    if !missing.is_empty() {
        v.push(format!(
            "{tag}: used but not pre-warmed: {}",
            missing.join(", ")
        ));
    }
    v.extend(before_upload(tag, seen));
    let bounds = [
        ("cold", seen.setup.prewarm.wall_ms, p.max_cold_prewarm_ms),
        ("cached", seen.cached.wall_ms, p.max_cached_prewarm_ms),
    ];
    for (which, ms, bound) in bounds {
        if let Some(bound) = bound.filter(|b| ms > b.0) {
            v.push(format!(
                "{tag}: {which} pre-warm took {ms:.0} ms, over the bound of {:.0} ms",
                bound.0
            ));
        }
    }
    if seen.cached.compilations > 0 {
        v.push(format!(
            "{tag}: pre-warm from the warmed directory compiled {} modules",
            seen.cached.compilations
        ));
    }
    v
}

/// Device bytes below which an upload is too small to tell apart from the
/// allocator's own noise.
const MEASURABLE_UPLOAD_BYTES: usize = 1 << 20;

/// Whether pre-warm ran before the upload: by the trainer's own order, and
/// by device memory (bytes in use when pre-warm started, beyond those in use
/// before the trainer, must be under half of what the upload took).
fn before_upload(tag: &str, seen: &Observed) -> Vec<String> {
    let mut v = Vec::new();
    let s = &seen.setup;
    let prewarm_at = s.order.iter().position(|&p| p == SetupPhase::Prewarm);
    let upload_at = s.order.iter().position(|&p| p == SetupPhase::Upload);
    if !matches!((prewarm_at, upload_at), (Some(a), Some(b)) if a < b) {
        v.push(format!(
            "{tag}: setup ran {:?}, not pre-warm then upload",
            s.order
        ));
    }
    let resident = resident_at_prewarm(seen);
    if s.upload_bytes >= MEASURABLE_UPLOAD_BYTES && resident >= s.upload_bytes / 2 {
        v.push(format!(
            "{tag}: {:.1} MiB were already on the device when pre-warm started (the upload takes {:.1} MiB)",
            mib(resident),
            mib(s.upload_bytes)
        ));
    }
    v
}

fn resident_at_prewarm(seen: &Observed) -> usize {
    seen.free_before_trainer
        .saturating_sub(seen.setup.free_bytes_at_prewarm)
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

fn summary(tag: &str, seen: &Observed) -> String {
    let r = &seen.setup.prewarm;
    let prewarmed: BTreeSet<&str> = r.modules.iter().copied().collect();
    let unused: Vec<&str> = prewarmed
        .iter()
        .filter(|m| !seen.used.contains(*m) && !seen.used_in_setup.contains(*m))
        .copied()
        .collect();
    let slowest = r
        .slowest
        .map(|(module, ms)| format!(", slowest {module} {ms:.0} ms"))
        .unwrap_or_default();
    let mut out = format!(
        "{tag}: cold pre-warm {} modules ({} compiled, {:.0} ms NVRTC, {:.0} ms wall{slowest}, \
         rehearsal step {:.0} ms), cached {:.0} ms ({} from disk, {} compiled), {} loaded after; \
         {:.1} MiB resident at pre-warm, upload {:.1} MiB in {:.0} ms, {:.0} MiB free during steps",
        r.modules.len(),
        r.compilations,
        r.compile_ms,
        r.wall_ms,
        seen.setup.rehearsal_ms,
        seen.cached.wall_ms,
        seen.cached.disk_hits,
        seen.cached.compilations,
        seen.loads_after,
        mib(resident_at_prewarm(seen)),
        mib(seen.setup.upload_bytes),
        seen.setup.upload_ms,
        mib(seen.free_during_steps),
    );
    if !r.skipped.is_empty() {
        out.push_str(&format!(", skipped [{}]", r.skipped.join(", ")));
    }
    if !unused.is_empty() {
        out.push_str(&format!(", unused [{}]", unused.join(", ")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::params::tests::with_gpu;

    fn params(yaml: &str) -> std::result::Result<Params, String> {
        crate::check::params::tests::parse(yaml)
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
        let e = params("models: [tiny]\nmemory_headroom_mib: 5000").unwrap_err();
        assert_eq!(e, "memory_headroom_mib: 5000 is above its bound of 4096");
        assert!(params("models: [tiny]\nmax_prewarm_ms: 2000").is_err());
        let p = params("models: [tiny]\nmax_cold_prewarm_ms: 1000\nmax_cached_prewarm_ms: 100")
            .unwrap();
        assert_eq!(p.max_cold_prewarm_ms, Some(Positive(1000.0)));
        assert_eq!(p.max_cached_prewarm_ms, Some(Positive(100.0)));
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
