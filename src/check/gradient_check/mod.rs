//! `gradient_check`: the reference backward against central finite differences.
//!
//! For a scalar loss `L = <dy, f(x)>` with a fixed random `dy`, the analytic
//! gradient `g = f'(x)^T dy` is compared with `(L(x + h e_i) - L(x - h e_i)) / 2h`,
//! all in f64. The metric is `||g - g_fd|| / ||g_fd||`.

mod model;
mod ops;

use serde::Deserialize;

use super::op::Op;
use super::params::{Count, ModelName, NonNegative, Positive, Shape};
use super::{Backend, Kind, Measurement, TrialContext, Validate};
use crate::error::Result;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// The op whose backward is checked; exclusive with `model`.
    #[serde(default)]
    pub op: Option<Op>,
    /// Check the whole training step's LoRA and norm gradients on this preset.
    #[serde(default)]
    pub model: Option<ModelName>,
    /// Shapes for `op`.
    #[serde(default)]
    pub shapes: Vec<Shape>,
    /// Finite-difference step `h`.
    #[serde(default = "default_step")]
    pub step: Positive,
    pub tolerance: NonNegative,
    /// For `model`: how many coordinates of each parameter tensor are probed.
    #[serde(default = "default_samples")]
    pub samples: Count,
}

fn default_step() -> Positive {
    Positive(1e-5)
}

fn default_samples() -> Count {
    Count(16)
}

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        match (&self.op, &self.model) {
            (Some(op), None) => {
                if !op.has_backward() {
                    return Err(format!("op `{op}` has no backward pass to check"));
                }
                if self.shapes.is_empty() {
                    return Err("`shapes` must list at least one shape".into());
                }
                for s in &self.shapes {
                    s.expect_dims(op.dims())
                        .map_err(|e| format!("op `{op}`: {e}"))?;
                }
                Ok(())
            }
            (None, Some(_)) => {
                if !self.shapes.is_empty() {
                    return Err("`shapes` applies to `op`, not to `model`".into());
                }
                Ok(())
            }
            _ => Err("give exactly one of `op` and `model`".into()),
        }
    }
}

impl Kind for Params {
    fn execute(&self, _backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        ops::measure(self, cx)
    }
}
