//! `trajectory_match`: the losses of two training modes at checkpoints.
//! Passes when `max_i |loss_baseline(c_i) - loss_candidate(c_i)| <= max_abs_diff`.

use serde::Deserialize;

use super::params::{Count, Hyper, ModelName, NonNegative, StepMode};
use super::{Measurement, TrialContext, Validate};
use crate::contract::Backend;
use crate::error::Result;

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
    pub steps: Count,
    /// 1-based step numbers at which the losses are compared.
    pub checkpoints: Vec<Count>,
    pub baseline: StepMode,
    pub candidate: StepMode,
    pub max_abs_diff: NonNegative,
    #[serde(default)]
    pub hyper: Hyper,
    /// Where the baseline runs (default: the trial's backend).
    #[serde(default)]
    pub baseline_on: BaselineOn,
}

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
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
        Ok(())
    }
}

impl Params {
    pub fn execute(&self, backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        crate::check::training::trajectory_match(self, backend, cx)
    }
}
