//! `memory_budget`: the peak device memory of a training configuration stays
//! within a bound derived from the arithmetic of its weights, adapters,
//! optimizer state and activations.

use serde::Deserialize;

use super::params::{BaseWeights, BaseWeightsDef, Count, ModelName, Positive};
use super::{Measurement, TrialContext, Validate};
use crate::error::Result;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub model: ModelName,
    #[serde(default, with = "BaseWeightsDef")]
    pub base: BaseWeights,
    /// Upper bound on peak device memory, GiB.
    pub max_gib: Positive,
    /// Overrides the preset's batch size.
    #[serde(default)]
    pub batch: Option<Count>,
}

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        Ok(())
    }
}

impl Params {
    pub fn execute(&self, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        crate::check::training::memory_budget(self, cx)
    }
}
