//! `step_throughput`: training tokens per second of one step mode, from the
//! median CUDA-event time of `repeats` steps after `warmup` steps. Passes when
//! `tokens / median >= min_tokens_per_s`.
//!
//! Targets name the GPU kinds they hold for (`min_tokens_per_s: { H200:
//! 41000, H100: 38000 }`, a [`GpuTargets`]; a plain number holds for any
//! GPU). On a GPU it
//! names no target for, the trial is not run: it is ignored with the reason
//! "no target for `<GPU>`" when the run is planned, since a target says
//! nothing about other hardware.
//!
//! The `speedups.csv` row has subject `tokens/s`: its baseline is the target
//! (`baseline_median_ms = tokens / min_tokens_per_s`), its candidate the
//! measured mode, so `ratio = measured tokens/s / target` and its bootstrap
//! interval comes from the step times.

use crate::check::training::*;
use crate::check::MutantFaults;
use crate::check::{require_gpu, Comparator};
use crate::error::{Error, Result};
use qlora::gpu::GpuContext;
use qlora::model::ModelConfig;

use serde::Deserialize;

use super::doc::{ParamDefault::*, ParamDoc, Piece::*};
use super::doc::{DEFAULT_STEP_MODE, MAX_TIMED_TOKENS, MODEL_BOUND, STEP_MODE_BOUND};
use super::doc::{TIMED_BATCH_DOC, TIMED_SEQ_LEN_DOC};

use super::params::{at_most, Count, GpuTargets, ModelName, StepMode};
use super::{Backend, Here, Kind, Measurement, TrialContext, Validate};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub model: ModelName,
    #[serde(default)]
    pub batch: Option<Count>,
    #[serde(default)]
    pub seq_len: Option<Count>,
    #[serde(default)]
    pub mode: StepMode,
    /// Untimed steps first (at least 2 run, so a graphed mode has captured
    /// and replayed): at most [`MAX_WARMUP`].
    #[serde(default = "default_warmup")]
    pub warmup: Count,
    /// Timed steps: at least 5, at most [`MAX_REPEATS`].
    #[serde(default = "default_repeats")]
    pub repeats: Count,
    /// The target per GPU kind, or one number for any GPU.
    pub min_tokens_per_s: GpuTargets,
}

/// Most untimed steps before the timed ones (the shipped checks take 3 or 5).
pub const MAX_WARMUP: usize = 100;
/// Most timed steps (the shipped checks time 20 or 30): 1,000 steps of the
/// largest shipped model stay well inside the trial's timeout.
pub const MAX_REPEATS: usize = 1_000;

fn default_warmup() -> Count {
    Count(3)
}

fn default_repeats() -> Count {
    Count(20)
}

/// The parameters of `step_throughput`, for the generated reference.
pub const PARAMS: &[ParamDoc] = &[
    ParamDoc {
        name: "model",
        default: Required,
        bound: MODEL_BOUND,
        meaning: "the preset trained",
    },
    TIMED_BATCH_DOC,
    TIMED_SEQ_LEN_DOC,
    ParamDoc {
        name: "mode",
        default: Yaml(DEFAULT_STEP_MODE),
        bound: STEP_MODE_BOUND,
        meaning: "the step mode timed",
    },
    ParamDoc {
        name: "warmup",
        default: Yaml("3"),
        bound: &[Text("1 to "), Int(MAX_WARMUP), Text(" (at least 2 run)")],
        meaning: "untimed steps first",
    },
    ParamDoc {
        name: "repeats",
        default: Yaml("20"),
        bound: &[Text("5 to "), Int(MAX_REPEATS)],
        meaning: "timed steps (a mutant stops once more than half of them are slower than the target, or, from the third, once the 95% interval of their median is)",
    },
    ParamDoc {
        name: "min_tokens_per_s",
        default: Required,
        bound: &[Text(
            "> 0: one number for any GPU, or `{GPU kind: number, ...}`",
        )],
        meaning: "the target; on a GPU kind it names no target for, the trial is skipped",
    },
];

/// A minimal `step_throughput` check.
pub const EXAMPLE: &[(&str, &str)] = &[("model", "small-4l"), ("min_tokens_per_s", "1000")];

/// The bounds of timed training steps: at least 5 timed (a median and its
/// interval), at most [`MAX_REPEATS`], after at most [`MAX_WARMUP`] untimed.
pub(super) fn check_timed_steps(warmup: Count, repeats: Count) -> std::result::Result<(), String> {
    if repeats.0 < 5 {
        return Err("`repeats` must be at least 5 for a median and its interval".into());
    }
    at_most("repeats", repeats.0, MAX_REPEATS)?;
    at_most("warmup", warmup.0, MAX_WARMUP)
}

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        check_timed_steps(self.warmup, self.repeats)?;
        let tokens = self.model.tokens(self.batch, self.seq_len);
        at_most("batch x seq_len", tokens, MAX_TIMED_TOKENS)?;
        self.model.check_sized(self.batch, self.seq_len)
    }
}

impl Params {
    /// The model with the contract's batch and sequence length.
    fn config(&self) -> ModelConfig {
        self.model.sized(self.batch, self.seq_len)
    }

    /// Why no target holds on `device` (a GPU name as the driver reports
    /// it), or `None` when one does.
    pub fn not_applicable_on(&self, device: &str) -> Option<String> {
        self.min_tokens_per_s.missing_on(device)
    }
}

impl Kind<crate::Qlora> for Params {
    fn execute(&self, _backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        super::clock_watched(cx, |cx| step_throughput(self, cx))
    }

    /// No target for this GPU, or a trainer that does not fit its free memory.
    fn unjudged_on(&self, backend: Backend, here: &Here) -> Option<String> {
        let gpu = here.gpu.as_ref().filter(|_| backend == Backend::Cuda)?;
        let cfg = self.config();
        self.not_applicable_on(&gpu.name).or_else(|| {
            let needed = trainer_bytes(&cfg, &self.mode.speed_options());
            trainer_shortfall(backend, &cfg, needed, here)
        })
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

    /// A training step's LoRA weight gradients run on a second stream,
    /// beside the rest of its backward (`GpuContext::on_side_stream`): one
    /// hardware queue could serialise them, so the step is timed with
    /// CUDA's default, as a user's process runs it.
    fn runs_on_one_stream(&self) -> bool {
        false
    }
}

/// `step_throughput`: the median step time of one mode over `repeats` steps
/// after `warmup` (at least 2, so a graphed mode has captured and replayed),
/// as tokens per second against `min_tokens_per_s`. The trial's mutant goes
/// to the trainer; a slowed launch (`SerialisedLaunch`) is set on the context
/// while the trainer is built and stepped, and removed whatever the outcome;
/// its timing stops as soon as the median of `repeats` steps is certain to
/// miss the target, the verdict of the whole run, or the 95% interval of
/// the median so far misses it. The configuration's peak
/// device memory ([`DeviceMemory`], sampled after
/// building and after each warm-up step, never inside a timed one) goes to
/// the detail and to the `speedups.csv` row, beside its tokens/s.
fn step_throughput(p: &Params, cx: &mut TrialContext<'_>) -> Result<Measurement> {
    use crate::check::stats::{median, ratio_ci, BOOTSTRAP_RESAMPLES};
    let cfg = p.config();
    let seed = cx.seed;
    let options = p.mode.speed_options();
    let faults = cx.faults();
    let mutant = cx.mutant.is_some();
    let gpu = require_gpu(cx)?;
    let device = gpu.facts().name.clone();
    // Planning skips a GPU with no target; a direct call is refused before
    // anything is measured, so a run trial is always judged.
    let (kind, target) =
        p.min_tokens_per_s
            .for_device(&device)
            .ok_or_else(|| Error::InvalidArgument {
                op: "step_throughput",
                message: p.not_applicable_on(&device).unwrap_or_default(),
            })?;
    let tokens = cfg.tokens() as f64;
    let target_ms = tokens / target * 1e3;
    // A mutant needs only to show the check fails: its timing stops once the
    // median of `repeats` steps is certain to miss the target, or its
    // interval does.
    let settle_above = mutant.then_some(target_ms);
    let TimedSteps {
        ms,
        replayed,
        memory,
    } = {
        let gpu: &mut GpuContext = &mut gpu.with_faults(faults);
        let steps = (p.warmup.0, p.repeats.0);
        time_steps(gpu, &cfg, (options, seed), steps, settle_above)?
    };
    let peak = memory.peak_gib();
    let med = median(&ms);
    let rate = tokens / med * 1e3;
    let stopped = stop_reason(&ms, p.repeats.0, target_ms);
    // The target as a constant "baseline" series: the interval of
    // target_ms / median(step times) is the interval of rate / target.
    let (lo, hi) = ratio_ci(&vec![target_ms; ms.len()], &ms, seed, BOOTSTRAP_RESAMPLES);
    let on = kind.map_or(String::new(), |g| format!(" on {g}"));
    let mut m = Measurement::new("tokens_per_s", rate, Comparator::Ge, target, "tokens/s")
        .with_detail(format!(
            "model {} batch {} seq {} {} on {device}: median step {med:.3} ms over {} steps{stopped} ({rate:.0} tokens/s, {:.3}x the target{on}, 95% CI [{lo:.3}, {hi:.3}]; graph {}; peak device memory {peak:.2} GiB)",
            cfg.name,
            cfg.batch,
            cfg.seq_len,
            p.mode,
            ms.len(),
            rate / target,
            if replayed { "replayed" } else { "not used" },
        ));
    m.speedups.push(crate::check::Speedup {
        subject: "tokens/s".into(),
        model: cfg.name.into(),
        batch: cfg.batch,
        seq_len: cfg.seq_len,
        baseline: format!("target {target:.0} tokens/s{on}"),
        candidate: p.mode.to_string(),
        baseline_median_ms: target_ms,
        candidate_median_ms: med,
        ratio: target_ms / med,
        ratio_ci_low: lo,
        ratio_ci_high: hi,
        repeats: ms.len(),
        peak_device_gib: Some(peak),
        baseline_peak_device_gib: None,
    });
    Ok(m)
}

/// Why a mutant's timing stopped before its `planned` steps (see
/// [`settled_above`](super::training::settled_above)), for the detail; empty
/// when it ran them all.
fn stop_reason(ms: &[f64], planned: usize, target_ms: f64) -> String {
    use crate::check::stats::median_settled_above;
    if ms.len() >= planned {
        String::new()
    } else if median_settled_above(ms, planned, target_ms) {
        format!(" (of {planned} planned: more than half already slower than the target, so their median could not meet it)")
    } else {
        format!(" (of {planned} planned: stopped once the 95% interval of their median lay wholly above the target's step time)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::GpuHere;

    fn params(extra: &str) -> std::result::Result<Params, String> {
        crate::check::params::tests::parse(&format!("model: small-4l\n{extra}"))
    }

    fn on(name: &str) -> Here {
        Here {
            host_memory_bytes: 100 << 30,
            gpu: Some(GpuHere {
                name: name.into(),
                total_memory_bytes: 80 << 30,
                free_memory_bytes: 79 << 30,
                device_count: 1,
            }),
        }
    }

    const H100: &str = "NVIDIA H100 80GB HBM3";

    #[test]
    fn a_target_is_judged_only_on_the_gpu_kinds_it_names() {
        let p = params("min_tokens_per_s: { H200: 41000, H100: 38000 }").unwrap();
        let t = &p.min_tokens_per_s;
        assert_eq!(t.for_device("NVIDIA H200"), Some((Some("H200"), 41000.0)));
        assert_eq!(
            t.for_device("nvidia h200 nvl"),
            Some((Some("H200"), 41000.0))
        );
        assert_eq!(t.for_device(H100), Some((Some("H100"), 38000.0)));
        assert_eq!(p.unjudged_on(Backend::Cuda, &on(H100)), None);
        // A word, not a substring: H20 is another GPU.
        assert_eq!(t.for_device("NVIDIA H20"), None);
        let why = p
            .unjudged_on(Backend::Cuda, &on("NVIDIA A100-SXM4-80GB"))
            .unwrap();
        assert!(
            why.starts_with("no target for NVIDIA A100-SXM4-80GB") && why.contains("H200, H100"),
            "{why}"
        );
        // No GPU here: the no-driver rule applies, not this one.
        assert_eq!(p.unjudged_on(Backend::Cuda, &Here::default()), None);
    }

    #[test]
    fn a_plain_number_holds_for_any_gpu() {
        let p = params("min_tokens_per_s: 1000").unwrap();
        assert_eq!(p.min_tokens_per_s.for_device(H100), Some((None, 1000.0)));
        assert_eq!(p.unjudged_on(Backend::Cuda, &on(H100)), None);
    }

    #[test]
    fn bad_targets_are_refused_where_they_stand() {
        let e = params("min_tokens_per_s: { H200: -5 }").unwrap_err();
        assert!(e.contains("> 0") && e.contains("line 2"), "{e}");
        let e = params("min_tokens_per_s: {}").unwrap_err();
        assert!(e.contains("at least one GPU kind"), "{e}");
        let e = params("min_tokens_per_s: { H200: 1, h200: 2 }").unwrap_err();
        assert!(e.contains("named twice"), "{e}");
        let e = params("min_tokens_per_s: { \"H 200\": 1 }").unwrap_err();
        assert!(e.contains("one word"), "{e}");
        // The kind lives in the map now; the old `gpu` key is unknown.
        let e = params("min_tokens_per_s: 1000\ngpu: H200").unwrap_err();
        assert!(e.contains("unknown field `gpu`"), "{e}");
    }

    #[test]
    fn counts_are_bounded() {
        let e = params("min_tokens_per_s: 1\nrepeats: 100000000").unwrap_err();
        assert_eq!(e, "repeats: 100000000 is above its bound of 1000");
        let e = params("min_tokens_per_s: 1\nwarmup: 1000000").unwrap_err();
        assert_eq!(e, "warmup: 1000000 is above its bound of 100");
        let e = params("min_tokens_per_s: 1\nbatch: 100000\nseq_len: 100000").unwrap_err();
        assert!(
            e.starts_with("batch x seq_len: 10000000000 is above"),
            "{e}"
        );
        // Counts up to 2^40 each: the product saturates instead of overflowing.
        let e = params("min_tokens_per_s: 1\nbatch: 1099511627776\nseq_len: 1099511627776")
            .unwrap_err();
        assert!(
            e.starts_with(&format!("batch x seq_len: {} is above", usize::MAX)),
            "{e}"
        );
    }

    #[test]
    fn a_configuration_larger_than_the_free_memory_is_not_judged() {
        let p = params("min_tokens_per_s: { H100: 1 }\nbatch: 512").unwrap();
        let mut here = on(H100);
        assert_eq!(p.unjudged_on(Backend::Cuda, &here), None);
        here.gpu.as_mut().unwrap().free_memory_bytes = 1 << 30;
        let why = p.unjudged_on(Backend::Cuda, &here).unwrap();
        assert!(
            why.starts_with("model small-4l (batch 512, seq 128) needs ~")
                && why.ends_with(&format!("{H100} has 1.0 GiB free")),
            "{why}"
        );
        assert_eq!(p.default_timeout_s(), TRAINING_TIMEOUT_S);
    }
}
