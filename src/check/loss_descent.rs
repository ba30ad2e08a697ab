//! `loss_descent`: training on the shipped byte-level corpus makes the loss fall.
//! Passes when `final_loss <= max_fraction * initial_loss`.

use serde::Deserialize;

use super::params::{Count, Fraction, Hyper, ModelName, StepMode};
use super::{Measurement, TrialContext, Validate};
use crate::contract::Backend;
use crate::error::Result;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub model: ModelName,
    pub steps: Count,
    /// The final loss must be at most this fraction of the initial loss.
    pub max_fraction: Fraction,
    #[serde(default)]
    pub mode: StepMode,
    #[serde(default)]
    pub hyper: Hyper,
}

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        Ok(())
    }
}

impl Params {
    pub fn execute(&self, backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        crate::check::training::loss_descent(self, backend, cx)
    }
}
