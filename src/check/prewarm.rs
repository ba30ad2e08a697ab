//! `prewarm`: after `prewarm(config)`, running the forward and backward (or
//! whole training steps) compiles nothing, and every kernel used was pre-warmed.

use serde::Deserialize;

use super::params::{BaseName, BaseWeights, Count, ModelName, Positive};
use super::{Measurement, TrialContext, Validate};
use crate::error::Result;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub models: Vec<ModelName>,
    /// Base-weight formats to exercise after pre-warm.
    #[serde(default = "default_bases")]
    pub bases: Vec<BaseName>,
    /// Training steps run after pre-warm, per model and base.
    #[serde(default = "default_steps")]
    pub steps: Count,
    /// Compilations allowed after pre-warm.
    #[serde(default)]
    pub max_compilations: usize,
    /// Bound on the wall time of each cold pre-warm (NVRTC compilation plus
    /// module loads) in milliseconds; none by default.
    #[serde(default)]
    pub max_prewarm_ms: Option<Positive>,
}

fn default_bases() -> Vec<BaseName> {
    vec![BaseName(BaseWeights::Fp32), BaseName(BaseWeights::Nf4)]
}

fn default_steps() -> Count {
    Count(2)
}

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        if self.models.is_empty() {
            return Err("`models` must list at least one preset".into());
        }
        if self.bases.is_empty() {
            return Err("`bases` must list at least one base-weight format".into());
        }
        Ok(())
    }
}

impl Params {
    pub fn execute(&self, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        crate::check::gpu_runtime::prewarm(self, cx)
    }
}
