//! The contract file format: serde types with `deny_unknown_fields` at every level.
//!
//! The shape follows the public provable-contracts schema (metadata, equations,
//! proof_obligations, falsification_tests); every falsification test here also
//! carries an executable [`CheckSpec`] and the [`Mutant`] that must make it fail.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use crate::check::params::Positive;
use crate::check::{Backend, CheckSpec};
use crate::mutant::Mutant;

/// One YAML contract file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Contract {
    pub metadata: Metadata,
    /// Default requirements of every test in the file; a test may override them.
    #[serde(default)]
    pub requires: Vec<Requirement>,
    /// Named equations the contract is about (documentation; not executed).
    #[serde(default)]
    pub equations: BTreeMap<String, Equation>,
    /// What must be true (documentation; the falsification tests execute it).
    #[serde(default)]
    pub proof_obligations: Vec<ProofObligation>,
    pub falsification_tests: Vec<FalsificationTest>,
    /// The file this contract was read from (set by the loader).
    #[serde(skip)]
    pub path: PathBuf,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    /// Must equal the file stem.
    pub id: String,
    pub version: String,
    pub description: String,
    #[serde(default)]
    pub created: Option<String>,
    #[serde(default)]
    pub author: Option<String>,
    #[serde(default)]
    pub references: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Equation {
    pub formula: String,
    #[serde(default)]
    pub domain: Option<String>,
    #[serde(default)]
    pub codomain: Option<String>,
    #[serde(default)]
    pub invariants: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProofObligation {
    #[serde(rename = "type")]
    pub kind: ObligationKind,
    pub property: String,
    #[serde(default)]
    pub formal: Option<String>,
    #[serde(default)]
    pub tolerance: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ObligationKind {
    Invariant,
    Equivalence,
    Bound,
    Monotonicity,
    Idempotency,
    Linearity,
    Conservation,
    Ordering,
    Performance,
}

/// What a test needs from the machine it runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Requirement {
    /// A CUDA driver and device.
    Cuda,
}

/// One falsifiable claim and the check that tries to falsify it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FalsificationTest {
    pub id: String,
    /// The claim, in words.
    pub rule: String,
    /// What a passing measurement looks like, in words.
    pub prediction: String,
    /// The likely cause when it fails.
    pub if_fails: String,
    /// Overrides the contract's `requires` for this test.
    #[serde(default)]
    pub requires: Option<Vec<Requirement>>,
    /// The injected fault that must make this check falsify (the self-test).
    pub mutant: Mutant,
    /// Seconds a trial of this test may take before it is stopped and
    /// recorded as an `error`; absent, the check kind's default.
    #[serde(default)]
    pub timeout_s: Option<Positive>,
    pub check: CheckSpec,
}

impl FalsificationTest {
    /// The wall-time limit of one trial of this test, in seconds.
    pub fn timeout_s(&self) -> f64 {
        self.timeout_s
            .map_or_else(|| self.check.default_timeout_s(), |t| t.0)
    }
}

impl Contract {
    /// The backend of a test: `cuda` when it (or, by default, its contract) requires CUDA.
    pub fn backend_of(&self, test: &FalsificationTest) -> Backend {
        let requires = test.requires.as_deref().unwrap_or(&self.requires);
        if requires.contains(&Requirement::Cuda) {
            Backend::Cuda
        } else {
            Backend::Cpu
        }
    }
}
