//! `property`: a named invariant over proptest-generated inputs.

mod ops;
mod optim;

use serde::Deserialize;

use super::doc::{ParamDefault::*, ParamDoc, Piece::*};

use super::params::{at_most, Count, NonNegative};
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
    /// Number of generated cases: at most [`MAX_CASES`].
    #[serde(default = "default_cases")]
    pub cases: Count,
    /// Allowed deviation from the exact invariant.
    pub tolerance: NonNegative,
}

fn default_cases() -> Count {
    Count(128)
}

/// Most cases of one trial: a case takes 5-40 us on a 2-core CI machine;
/// 100,000 cases of the slowest properties (NF4, RoPE) measured 3.6 s.
/// Memory does not grow with cases: each is drawn, measured and dropped
/// (the strategies draw at most a few hundred values).
pub const MAX_CASES: usize = 100_000;

/// The parameters of `property`, for the generated reference.
pub const PARAMS: &[ParamDoc] = &[
    ParamDoc {
        name: "property",
        default: Required,
        bound: &[OneOf(&[
            "softmax_rows_sum_to_one",
            "softmax_shift_invariant",
            "rmsnorm_scale_invariant",
            "rope_preserves_norm",
            "rope_inverse_round_trip",
            "nf4_round_trip_bound",
            "cross_entropy_non_negative",
            "cross_entropy_grad_sums_to_zero",
            "clip_bounds_global_norm",
            "clip_leaves_small_untouched",
            "adamw_first_step_moves_by_lr",
        ])],
        meaning: "the invariant",
    },
    ParamDoc {
        name: "cases",
        default: Yaml("128"),
        bound: &[Text("1 to "), Int(MAX_CASES)],
        meaning: "generated cases",
    },
    ParamDoc {
        name: "tolerance",
        default: Required,
        bound: &[Text(">= 0")],
        meaning: "allowed deviation from the exact invariant",
    },
];

/// A minimal `property` check.
pub const EXAMPLE: &[(&str, &str)] = &[
    ("property", "softmax_rows_sum_to_one"),
    ("tolerance", "1e-6"),
];

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        at_most("cases", self.cases.0, MAX_CASES)
    }
}

impl Kind<crate::Qlora> for Params {
    fn execute(&self, _backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        ops::measure(self, cx)
    }

    /// Many times this kind's longest trial (its `duration_ms` in the
    /// committed baselines; the parameter bounds keep a trial within it):
    /// a stuck trial is stopped, a slow machine is not.
    fn default_timeout_s(&self) -> f64 {
        30.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_without_end_are_refused_when_read() {
        let p: Params = serde_yaml::from_str(
            "property: softmax_rows_sum_to_one\ncases: 1000000000000\ntolerance: 1.0e-9",
        )
        .unwrap();
        assert_eq!(
            p.validate().unwrap_err(),
            "cases: 1000000000000 is above its bound of 100000"
        );
        let p: Params =
            serde_yaml::from_str("property: softmax_rows_sum_to_one\ntolerance: 1.0e-9").unwrap();
        assert_eq!(p.validate(), Ok(()));
        assert_eq!(p.default_timeout_s(), 30.0);
    }
}
