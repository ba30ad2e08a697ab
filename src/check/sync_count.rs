//! `sync_count`: host synchronisations and device-to-host copies inside the
//! captured region (must be zero) and per training step (bounded).

use serde::Deserialize;

use super::params::{Count, ModelName, StepMode};
use super::{Measurement, TrialContext, Validate};
use crate::error::Result;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub model: ModelName,
    pub steps: Count,
    #[serde(default)]
    pub mode: StepMode,
    /// Syncs allowed inside the captured region.
    #[serde(default)]
    pub max_inside_capture: usize,
    /// Syncs allowed per step (reading the loss is one).
    pub max_per_step: usize,
}

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        if !self.mode.graph {
            return Err(
                "`mode.graph` must be true: sync_count inspects the captured region".into(),
            );
        }
        Ok(())
    }
}

impl Params {
    pub fn execute(&self, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        crate::check::training::sync_count(self, cx)
    }
}
