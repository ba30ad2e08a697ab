//! `property`: a named invariant over proptest-generated inputs.

mod ops;
mod optim;

use serde::Deserialize;

use super::params::{Count, NonNegative};
use super::{Backend, Kind, Measurement, TrialContext, Validate};
use crate::error::Result;

/// The invariants this kind knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Property {
    /// Every causal-softmax row sums to 1 (large logits included).
    SoftmaxRowsSumToOne,
    /// softmax(x + c) == softmax(x) for a constant shift c.
    SoftmaxShiftInvariant,
    /// RMSNorm(c x) == RMSNorm(x) for c > 0 (up to eps).
    RmsnormScaleInvariant,
    /// RoPE preserves the norm of every head vector.
    RopePreservesNorm,
    /// The inverse rotation undoes RoPE.
    RopeInverseRoundTrip,
    /// NF4 round-trip error <= half the widest code-book gap x absmax, per block.
    Nf4RoundTripBound,
    /// Cross-entropy is >= 0.
    CrossEntropyNonNegative,
    /// Each row of the logit gradient of cross-entropy sums to 0.
    CrossEntropyGradSumsToZero,
    /// After clipping, the global norm is <= max_norm.
    ClipBoundsGlobalNorm,
    /// Clipping leaves gradients whose norm is below max_norm untouched.
    ClipLeavesSmallUntouched,
    /// AdamW's first step moves each parameter by about lr.
    AdamwFirstStepMovesByLr,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub property: Property,
    /// Number of generated cases.
    #[serde(default = "default_cases")]
    pub cases: Count,
    /// Allowed deviation from the exact invariant.
    pub tolerance: NonNegative,
}

fn default_cases() -> Count {
    Count(128)
}

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        Ok(())
    }
}

impl Kind for Params {
    fn execute(&self, _backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        ops::measure(self, cx)
    }
}
