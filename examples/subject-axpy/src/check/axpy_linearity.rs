//! `axpy_linearity`: a property of the CPU oracle the kernels are judged
//! against, so that a wrong oracle cannot pass wrong kernels. For `cases`
//! random `(a, b, x, y)` from the trial's seed, `axpy(a, x, axpy(b, x, y))`
//! must equal `axpy(a + b, x, y)`; headline: the largest relative L2 gap
//! <= `tolerance` (f64 rounding is ~1e-16).

use falsify_core::check::params::{at_most, Count, NonNegative};
use falsify_core::check::{
    Backend, Comparator, Measurement, ParamDefault, ParamDoc, Piece, Validate,
};
use falsify_core::{Kind, TrialContext};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Deserialize;

use crate::error::Result;
use crate::mutant::Mutant;
use crate::oracle;
use crate::Axpy;

/// The most cases.
pub const MAX_CASES: usize = 10_000;
/// The largest `n` of a case.
pub const MAX_N: usize = 1 << 20;

/// The parameters of an `axpy_linearity` check.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// Random cases tried.
    #[serde(default = "default_cases")]
    pub cases: Count,
    /// Elements of each case's vectors.
    pub n: Count,
    #[serde(default = "default_tolerance")]
    pub tolerance: NonNegative,
}

fn default_cases() -> Count {
    Count(100)
}

fn default_tolerance() -> NonNegative {
    NonNegative(1e-12)
}

pub const PARAMS: &[ParamDoc] = &[
    ParamDoc {
        name: "cases",
        default: ParamDefault::Yaml("100"),
        bound: &[Piece::Text("1 to "), Piece::Int(MAX_CASES)],
        meaning: "random cases tried",
    },
    ParamDoc {
        name: "n",
        default: ParamDefault::Required,
        bound: &[Piece::Text("1 to "), Piece::Int(MAX_N)],
        meaning: "elements of each case's vectors",
    },
    ParamDoc {
        name: "tolerance",
        default: ParamDefault::Yaml("1e-12"),
        bound: &[Piece::Text(">= 0")],
        meaning: "largest relative L2 gap accepted",
    },
];

pub const EXAMPLE: &[(&str, &str)] = &[("n", "64")];

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        at_most("cases", self.cases.0, MAX_CASES)?;
        at_most("n", self.n.0, MAX_N)
    }
}

impl Kind<Axpy> for Params {
    fn execute(&self, _backend: Backend, cx: &mut TrialContext<'_, Axpy>) -> Result<Measurement> {
        let axpy: fn(f64, &[f64], &[f64]) -> Vec<f64> = match cx.mutant {
            Some(Mutant::OracleDropsAlpha) => oracle::faulty::axpy_drops_alpha,
            _ => oracle::axpy,
        };
        let mut rng = ChaCha8Rng::seed_from_u64(cx.seed);
        let (mut gap, mut worst) = (0.0f64, (0.0, 0.0));
        for _ in 0..self.cases.0 {
            let (a, b) = (rng.random_range(-4.0..4.0), rng.random_range(-4.0..4.0));
            let x = oracle::widen(&oracle::uniform(&mut rng, self.n.0));
            let y = oracle::widen(&oracle::uniform(&mut rng, self.n.0));
            let twice = axpy(a, &x, &axpy(b, &x, &y));
            let once = axpy(a + b, &x, &y);
            let g = oracle::rel_l2(&twice, &once);
            // A NaN gap is the worst there is.
            if g.is_nan() || g > gap {
                (gap, worst) = (g, (a, b));
            }
        }
        let m = Measurement::new("rel_l2_gap", gap, Comparator::Le, self.tolerance.0, "");
        Ok(m.with_detail(format!(
            "{} cases of n {}; worst at a {:.4}, b {:.4}",
            self.cases.0, self.n.0, worst.0, worst.1
        )))
    }
}
