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
    pub fn execute(&self, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        crate::train::checks::step_throughput(self, cx)
    }
}
