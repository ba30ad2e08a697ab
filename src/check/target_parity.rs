//! `target_parity`: every PTX module the kernel cache holds targets the
//! device's own `sm_XY`, and planted PTX for an older or a newer target is refused.

use serde::Deserialize;

use super::params::ModelName;
use super::{Measurement, TrialContext, Validate};
use crate::error::Result;

/// A mismatched target the cache must refuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Planted {
    /// An architecture older than the device's (the driver would load it silently).
    Older,
    /// An architecture newer than the device's (the driver refuses it too).
    Newer,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// Pre-warm the cache for each of these presets before inspecting it.
    pub models: Vec<ModelName>,
    /// Mismatched PTX to plant; each must be refused.
    #[serde(default = "default_planted")]
    pub planted: Vec<Planted>,
}

fn default_planted() -> Vec<Planted> {
    vec![Planted::Older, Planted::Newer]
}

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        if self.models.is_empty() {
            return Err("`models` must list at least one preset".into());
        }
        Ok(())
    }
}

impl Params {
    pub fn execute(&self, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        crate::check::gpu_runtime::target_parity(self, cx)
    }
}
