//! A subject with no GPU code at all: the smallest thing the core can test.
//!
//! Its one kind, `sum`, adds up a list of numbers on the CPU and compares
//! the sum with the contract's expectation; its one mutant, `sum_drops_last`,
//! forgets the last number. `Device = NoDevice`: its `cuda` trials are
//! skipped with the reason, never run.

// Each test crate compiles this module and uses only some of it.
#![allow(dead_code)]

use falsify_core::check::params::NonNegative;
use falsify_core::check::{
    Backend, Comparator, Measurement, ParamDefault, ParamDoc, Piece, Validate, BOTH,
};
use falsify_core::{BasicOptions, DeviceFacts, Kind, NoDevice, Subject, TrialContext};
use serde::Deserialize;

/// The toy subject.
pub struct Toy;

/// The toy's mutants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToyMutant {
    /// The sum leaves out the last number.
    SumDropsLast,
}

impl std::fmt::Display for ToyMutant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("sum_drops_last")
    }
}

/// The toy's errors.
#[derive(Debug, thiserror::Error)]
pub enum ToyError {
    #[error("the toy has no device")]
    NoDevice,
}

pub mod sum {
    use super::*;

    /// `|sum(values) - expect| <= tolerance`.
    #[derive(Debug, Clone, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Params {
        pub values: Vec<f64>,
        pub expect: f64,
        #[serde(default = "default_tolerance")]
        pub tolerance: NonNegative,
    }

    fn default_tolerance() -> NonNegative {
        NonNegative(1e-9)
    }

    pub const PARAMS: &[ParamDoc] = &[
        ParamDoc {
            name: "values",
            default: ParamDefault::Required,
            bound: &[Piece::Text("numbers")],
            meaning: "what is added up",
        },
        ParamDoc {
            name: "expect",
            default: ParamDefault::Required,
            bound: &[Piece::Text("a number")],
            meaning: "the sum claimed",
        },
        ParamDoc {
            name: "tolerance",
            default: ParamDefault::Yaml("1e-9"),
            bound: &[Piece::Text(">= 0")],
            meaning: "how far the sum may be from `expect`",
        },
    ];
    pub const EXAMPLE: &[(&str, &str)] = &[("values", "[1, 2]"), ("expect", "3")];

    impl Validate for Params {
        fn validate(&self) -> Result<(), String> {
            if self.values.is_empty() {
                return Err("values: at least one number".into());
            }
            Ok(())
        }
    }

    impl Kind<Toy> for Params {
        fn execute(
            &self,
            _backend: Backend,
            cx: &mut TrialContext<'_, Toy>,
        ) -> Result<Measurement, ToyError> {
            let n = match cx.mutant {
                Some(ToyMutant::SumDropsLast) => self.values.len() - 1,
                None => self.values.len(),
            };
            let sum: f64 = self.values[..n].iter().sum();
            let error = (sum - self.expect).abs();
            Ok(
                Measurement::new("abs_error", error, Comparator::Le, self.tolerance.0, "")
                    .with_detail(format!("sum {sum}")),
            )
        }
    }
}

falsify_core::kinds! {
    /// The toy's `check:` block.
    pub enum ToyKinds for Toy {
        Sum(sum) "sum", BOTH, "the sum of a list of numbers against a claimed one";
    }
}

impl Subject for Toy {
    const NAME: &'static str = "toy";
    type Device = NoDevice;
    type Kinds = ToyKinds;
    type Mutant = ToyMutant;
    type Options = BasicOptions;
    type Error = ToyError;

    fn open_device(_options: &BasicOptions) -> Result<NoDevice, ToyError> {
        Err(ToyError::NoDevice)
    }

    fn device_facts(device: &NoDevice) -> DeviceFacts {
        match *device {}
    }

    fn free_memory(device: &NoDevice) -> Result<(u64, u64), ToyError> {
        match *device {}
    }
}
