//! `op_parity`: an op on a backend against the CPU reference.
//!
//! Fresh seeded random inputs per shape; the output buffer is poisoned (NaN)
//! before the op runs. Passes when the relative L2 error
//! `||out - ref|| / ||ref||` is within tolerance, every element was written,
//! and nothing is NaN or Inf.

mod activation;
mod adamw;
mod attention;
mod cast;
mod clip;
mod compare;
mod cross_entropy;
mod elementwise;
mod embedding;
mod gemm;
mod nf4;
mod rmsnorm;
mod rope;
mod softmax;

use serde::Deserialize;

use super::op::{Op, Pass};
use super::params::{NonNegative, Precision, Shape};
use super::{Kind, Measurement, TrialContext, Validate};
use crate::check::Backend;
use crate::error::Result;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub op: Op,
    #[serde(default)]
    pub pass: Pass,
    #[serde(default)]
    pub precision: Precision,
    /// One or more shapes; the trial's metric is the worst error over them.
    pub shapes: Vec<Shape>,
    /// Overrides the precision's default tolerance.
    #[serde(default)]
    pub tolerance: Option<NonNegative>,
    /// Shapes the op must refuse with an error whose message contains this text
    /// (e.g. an NF4 tensor that is not a multiple of the block size).
    #[serde(default)]
    pub refuse: Vec<Refusal>,
}

/// A shape the op must refuse, and the words the error must contain.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Refusal {
    pub shape: Shape,
    pub error_contains: String,
}

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        if self.shapes.is_empty() {
            return Err("`shapes` must list at least one shape".into());
        }
        if self.pass == Pass::Backward && !self.op.has_backward() {
            return Err(format!("op `{}` has no backward pass", self.op));
        }
        for s in self
            .shapes
            .iter()
            .chain(self.refuse.iter().map(|r| &r.shape))
        {
            s.expect_dims(self.op.dims())
                .map_err(|e| format!("op `{}`: {e}", self.op))?;
        }
        Ok(())
    }
}

impl Params {
    /// The tolerance in force: the contract's, else the precision default.
    pub fn tolerance(&self) -> f64 {
        self.tolerance
            .map_or(self.precision.default_tolerance(), |t| t.0)
    }
}

impl Kind for Params {
    fn execute(&self, backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        compare::measure(self, backend, cx)
    }
}
