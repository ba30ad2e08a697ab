//! `gradient_parity`: the GPU training step's gradients of every trainable
//! tensor (LoRA A/B of q and v, both RMSNorm weights of every layer) against
//! the CPU reference's analytic f64 gradients, on one seeded batch and one
//! seeded parameter point away from the init.
//! Passes when `max_tensor ||g_gpu - g_ref|| / ||g_ref|| <= tolerance`.

use serde::Deserialize;

use super::params::{BaseWeights, BaseWeightsDef, ModelName, NonNegative, Positive, Precision};
use super::{Measurement, TrialContext, Validate};
use crate::error::Result;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub model: ModelName,
    #[serde(default, with = "BaseWeightsDef")]
    pub base: BaseWeights,
    /// GEMM precision of the GPU forward pass: `f32` or `tf32` (the backward
    /// GEMMs run as the context's options say).
    #[serde(default)]
    pub precision: Precision,
    /// Standard deviation of the LoRA `B` factors at the probed point (at
    /// `B = 0` the gradient of `A` is exactly zero and a relative error of it
    /// says nothing).
    #[serde(default = "default_b_std")]
    pub b_std: Positive,
    pub tolerance: NonNegative,
}

fn default_b_std() -> Positive {
    Positive(0.05)
}

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        match self.precision {
            Precision::F32 | Precision::Tf32 => Ok(()),
            other => Err(format!(
                "precision {other:?}: the training step's GEMMs run in f32 or tf32"
            )),
        }
    }
}

impl Params {
    pub fn execute(&self, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        crate::check::training::gradient_parity(self, cx)
    }
}
