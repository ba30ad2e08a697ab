//! `step_throughput`: training tokens per second of one step mode, from the
//! median CUDA-event time of `repeats` steps after `warmup` steps. Passes when
//! `tokens / median >= min_tokens_per_s`.
//!
//! A target stated for one GPU kind (`gpu: H200`) is judged only on a device
//! whose name contains it; elsewhere the trial is measured and recorded
//! (`speedups.csv` names the device) but reported `skipped`, since the target
//! says nothing about other hardware.
//!
//! The `speedups.csv` row has subject `tokens/s`: its baseline is the target
//! (`baseline_median_ms = tokens / min_tokens_per_s`), its candidate the
//! measured mode, so `ratio = measured tokens/s / target` and its bootstrap
//! interval comes from the step times.

use crate::check::training::*;
use crate::check::{require_gpu, Comparator};
use crate::error::Result;
use qlora::gpu::GpuContext;
use qlora::train::GpuTrainer;

use serde::Deserialize;

use super::params::{Count, ModelName, Positive, StepMode};
use super::{Backend, Kind, Measurement, TrialContext, Validate};

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
    #[serde(default = "default_warmup")]
    pub warmup: Count,
    #[serde(default = "default_repeats")]
    pub repeats: Count,
    pub min_tokens_per_s: Positive,
    /// The GPU kind the target is stated for, matched against the device
    /// name (e.g. `H200`); absent: any device.
    #[serde(default)]
    pub gpu: Option<String>,
}

fn default_warmup() -> Count {
    Count(3)
}

fn default_repeats() -> Count {
    Count(20)
}

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        if self.repeats.0 < 5 {
            return Err("`repeats` must be at least 5 for a median and its interval".into());
        }
        if self.gpu.as_deref().is_some_and(|g| g.trim().is_empty()) {
            return Err("`gpu` must name a GPU kind, e.g. H200".into());
        }
        Ok(())
    }
}

impl Params {
    /// Why the target does not apply to `device` (a GPU name as the driver
    /// reports it), or `None` when it does. `gpu` must be one of the name's
    /// words, case aside: `H200` matches "NVIDIA H200" but not "NVIDIA H20".
    pub fn not_applicable_on(&self, device: &str) -> Option<String> {
        let kind = self.gpu.as_deref()?.trim();
        let matches = device
            .split(|c: char| !c.is_ascii_alphanumeric())
            .any(|word| word.eq_ignore_ascii_case(kind));
        (!matches).then(|| {
            format!(
                "the target {:.0} tokens/s is stated for {kind}; measured on {device}, recorded, not judged",
                self.min_tokens_per_s.0
            )
        })
    }
}

impl Kind for Params {
    fn execute(&self, _backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        step_throughput(self, cx)
    }
}

/// `step_throughput`: the median step time of one mode over `repeats` steps
/// after `warmup` (at least 2, so a graphed mode has captured and replayed),
/// as tokens per second against `min_tokens_per_s`. The trial's mutant goes
/// to the trainer; a slowed launch (`SerialisedLaunch`) is set on the context
/// while the trainer is built and stepped, and removed whatever the outcome.
fn step_throughput(p: &Params, cx: &mut TrialContext<'_>) -> Result<Measurement> {
    use crate::check::stats::{median, ratio_ci, BOOTSTRAP_RESAMPLES};
    let cfg = p.model.sized(p.batch, p.seq_len);
    let seed = cx.seed;
    let options = p.mode.speed_options();
    let faults = cx.faults();
    let gpu = require_gpu(cx)?;
    let times = {
        let gpu: &mut GpuContext = &mut gpu.with_faults(faults);
        let mut t = GpuTrainer::new(gpu, &cfg, options, seed)?;
        for _ in 0..p.warmup.0.max(2) {
            t.step(gpu)?;
        }
        let mut ms = Vec::with_capacity(p.repeats.0);
        for _ in 0..p.repeats.0 {
            let tokens = t.next_batch()?;
            ms.push(timed_step(gpu, &mut t, &tokens)?);
        }
        (ms, t.graph_ready())
    };
    let (ms, replayed) = times;
    let tokens = cfg.tokens() as f64;
    let med = median(&ms);
    let rate = tokens / med * 1e3;
    let target = p.min_tokens_per_s.0;
    let target_ms = tokens / target * 1e3;
    // The target as a constant "baseline" series: the interval of
    // target_ms / median(step times) is the interval of rate / target.
    let (lo, hi) = ratio_ci(&vec![target_ms; ms.len()], &ms, seed, BOOTSTRAP_RESAMPLES);
    let device = gpu.facts().name.clone();
    let on = p
        .gpu
        .as_deref()
        .map_or(String::new(), |g| format!(" on {g}"));
    let mut m = Measurement::new("tokens_per_s", rate, Comparator::Ge, target, "tokens/s")
        .with_detail(format!(
            "model {} batch {} seq {} {} on {device}: median step {med:.3} ms over {} steps ({rate:.0} tokens/s, {:.3}x the target{on}, 95% CI [{lo:.3}, {hi:.3}]; graph {})",
            cfg.name,
            cfg.batch,
            cfg.seq_len,
            p.mode,
            p.repeats.0,
            rate / target,
            if replayed { "replayed" } else { "not used" },
        ));
    m.not_applicable = p.not_applicable_on(&device);
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
        repeats: p.repeats.0,
    });
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(gpu: Option<&str>) -> Params {
        let mut yaml = String::from("model: tiny\nmin_tokens_per_s: 1000\n");
        if let Some(g) = gpu {
            yaml.push_str(&format!("gpu: {g}\n"));
        }
        serde_yaml::from_str(&yaml).unwrap()
    }

    #[test]
    fn a_target_applies_only_to_the_gpu_it_names() {
        let h200 = params(Some("H200"));
        assert_eq!(h200.not_applicable_on("NVIDIA H200"), None);
        assert_eq!(h200.not_applicable_on("nvidia h200 nvl"), None);
        let why = h200.not_applicable_on("NVIDIA H100 80GB HBM3").unwrap();
        assert!(
            why.contains("stated for H200") && why.contains("H100"),
            "{why}"
        );
        // A word, not a substring: H20 is another GPU.
        assert!(params(Some("H20"))
            .not_applicable_on("NVIDIA H200")
            .is_some());
        assert_eq!(
            params(None).not_applicable_on("NVIDIA H100 80GB HBM3"),
            None
        );
    }
}
