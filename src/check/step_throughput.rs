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

use serde::Deserialize;

use super::params::{Count, ModelName, Positive, StepMode};
use super::{Measurement, TrialContext, Validate};
use crate::error::Result;

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

    pub fn execute(&self, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        crate::check::training::step_throughput(self, cx)
    }
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
