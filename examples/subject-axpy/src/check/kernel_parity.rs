//! `kernel_parity`: one of the subject's kernels against the f64 CPU
//! oracle on random inputs from the trial's seed. Headline: the relative
//! L2 error `||kernel - oracle|| / ||oracle||` <= `tolerance`. Every output
//! buffer starts poisoned (NaN), so an element the kernel never wrote is a
//! violation, whatever the error.

use falsify_core::check::params::{at_most, gpu_shortfall, Count, NonNegative};
use falsify_core::check::{
    Backend, Comparator, Here, Measurement, ParamDefault, ParamDoc, Piece, Validate,
};
use falsify_core::{Kind, TrialContext};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Deserialize;

use crate::device::AxpyDevice;
use crate::error::Result;
use crate::kernels::blocks_for;
use crate::oracle;
use crate::Axpy;

/// The largest `n` (2^26 elements: 256 MiB per f32 buffer).
pub const MAX_N: usize = 1 << 26;

/// Which kernel is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// `out = a*x + y`.
    Axpy,
    /// `sum(x^2)`, in two passes.
    SumSquares,
}

/// The parameters of a `kernel_parity` check.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub op: Op,
    /// Elements of each input.
    pub n: Count,
    /// `a` of `axpy` (rounded to f32 for the kernel and the oracle alike).
    #[serde(default = "default_alpha")]
    pub alpha: f64,
    #[serde(default = "default_tolerance")]
    pub tolerance: NonNegative,
}

fn default_alpha() -> f64 {
    2.5
}

fn default_tolerance() -> NonNegative {
    NonNegative(1e-5)
}

pub const PARAMS: &[ParamDoc] = &[
    ParamDoc {
        name: "op",
        default: ParamDefault::Required,
        bound: &[Piece::OneOf(&["axpy", "sum_squares"])],
        meaning: "the kernel measured",
    },
    ParamDoc {
        name: "n",
        default: ParamDefault::Required,
        bound: &[Piece::Text("1 to "), Piece::Int(MAX_N)],
        meaning: "elements of each input",
    },
    ParamDoc {
        name: "alpha",
        default: ParamDefault::Yaml("2.5"),
        bound: &[Piece::Text("a finite number (axpy only)")],
        meaning: "`a` of `a*x + y`",
    },
    ParamDoc {
        name: "tolerance",
        default: ParamDefault::Yaml("1e-5"),
        bound: &[Piece::Text(">= 0")],
        meaning: "largest relative L2 error accepted",
    },
];

pub const EXAMPLE: &[(&str, &str)] = &[("op", "axpy"), ("n", "4096")];

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        at_most("n", self.n.0, MAX_N)?;
        if !self.alpha.is_finite() {
            return Err(format!("alpha: {} is not a finite number", self.alpha));
        }
        Ok(())
    }
}

impl Kind<Axpy> for Params {
    fn execute(&self, _backend: Backend, cx: &mut TrialContext<'_, Axpy>) -> Result<Measurement> {
        let faults = cx.mutant.map(|m| m.faults()).unwrap_or_default();
        let device = super::device(cx.device.as_deref_mut())?;
        let mut device = device.with_faults(faults);
        let mut rng = ChaCha8Rng::seed_from_u64(cx.seed);
        let measurement = match self.op {
            Op::Axpy => self.axpy(&mut device, &mut rng)?,
            Op::SumSquares => self.sum_squares(&mut device, &mut rng)?,
        };
        let detail = format!("n {}; {}", self.n.0, measurement.detail);
        Ok(measurement.with_detail(detail))
    }

    /// Inputs and outputs, 4 bytes an element: three buffers of `n`.
    fn unjudged_on(&self, _backend: Backend, here: &Here) -> Option<String> {
        gpu_shortfall(&format!("n: {}", self.n.0), 12.0 * self.n.0 as f64, here)
    }

    fn default_timeout_s(&self) -> f64 {
        120.0
    }
}

impl Params {
    fn axpy(&self, device: &mut AxpyDevice, rng: &mut ChaCha8Rng) -> Result<Measurement> {
        let n = self.n.0;
        let (x, y) = (oracle::uniform(rng, n), oracle::uniform(rng, n));
        let a = self.alpha as f32;
        let (dx, dy) = (device.upload(&x)?, device.upload(&y)?);
        let mut out = device.upload(&vec![f32::NAN; n])?;
        device.axpy(n, a, &dx, &dy, &mut out)?;
        let got = oracle::widen(&device.download(&out)?);
        let want = oracle::axpy(f64::from(a), &oracle::widen(&x), &oracle::widen(&y));
        Ok(self.judge("axpy", &got, &want))
    }

    fn sum_squares(&self, device: &mut AxpyDevice, rng: &mut ChaCha8Rng) -> Result<Measurement> {
        let n = self.n.0;
        let x = oracle::uniform(rng, n);
        let dx = device.upload(&x)?;
        let mut partial = device.upload(&vec![f32::NAN; blocks_for(n) as usize])?;
        let mut out = device.upload(&[f32::NAN])?;
        device.sum_squares(n, &dx, &mut partial, &mut out)?;
        let got = oracle::widen(&device.download(&out)?);
        let want = [oracle::sum_squares(&oracle::widen(&x))];
        Ok(self.judge("sum_squares", &got, &want))
    }

    /// The rel-L2 measurement of `got` against `want`, with the worst
    /// element and the unwritten (still NaN) ones.
    fn judge(&self, op: &str, got: &[f64], want: &[f64]) -> Measurement {
        let error = oracle::rel_l2(got, want);
        let mut m = Measurement::new("rel_l2_error", error, Comparator::Le, self.tolerance.0, "");
        let unwritten = got.iter().filter(|v| v.is_nan()).count();
        if unwritten > 0 {
            m.violate(format!(
                "{unwritten} of {} output elements never written (still NaN)",
                got.len()
            ));
        }
        let worst = oracle::worst(got, want).map_or(String::new(), |i| {
            format!("; worst element {i}: kernel {}, oracle {}", got[i], want[i])
        });
        let alpha = match self.op {
            Op::Axpy => format!(", alpha {}", self.alpha),
            Op::SumSquares => String::new(),
        };
        m.with_detail(format!("op {op}{alpha}{worst}"))
    }
}
