//! The contract file format: serde types with `deny_unknown_fields` at every level.
//!
//! The shape follows the public provable-contracts schema (metadata, equations,
//! proof_obligations, falsification_tests); every falsification test here also
//! carries an executable check (one of its subject's kinds, a
//! [`KindSet`], or one of the core's: a [`Check`]) and the mutant that must
//! make it fail (a [`MutantName`]).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::de::{self, Deserializer};
use serde::Deserialize;

use crate::check::params::Timeout;
use crate::check::Backend;
use crate::core_kinds::{Check, MutantName};
use crate::subject::{KindSet, MutantSet, Subject};

/// One YAML contract file, whose checks are of the kind set `K` and whose
/// mutants of the set `M` (a subject's: see [`ContractOf`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, bound(deserialize = "K: KindSet, M: MutantSet"))]
pub struct Contract<K, M> {
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
    pub falsification_tests: Vec<FalsificationTest<K, M>>,
    /// The file this contract was read from (set by the loader).
    #[serde(skip)]
    pub path: PathBuf,
    /// The file's text as the loader read it, byte for byte (set by the
    /// loader): a run hashes it for its rows and hands it to its trial
    /// processes, which never read the file again.
    #[serde(skip)]
    pub source: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    /// Must equal the file stem, and be a safe id ([`is_safe_id`]) of at
    /// most [`MAX_ID_LEN`] characters.
    #[serde(deserialize_with = "contract_id")]
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

/// A contract of the subject `S`: its kinds and its mutants.
pub type ContractOf<S> = Contract<<S as Subject>::Kinds, <S as Subject>::Mutant>;

/// A falsification test of the subject `S`.
pub type TestOf<S> = FalsificationTest<<S as Subject>::Kinds, <S as Subject>::Mutant>;

/// One falsifiable claim and the check that tries to falsify it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, bound(deserialize = "K: KindSet, M: MutantSet"))]
pub struct FalsificationTest<K, M> {
    /// Unique across all contracts (also ignoring case), and a safe id
    /// ([`is_safe_id`]) of at most [`MAX_ID_LEN`] characters.
    #[serde(deserialize_with = "test_id")]
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
    /// The injected fault that must make this check falsify (the self-test):
    /// one of the core's mutants or one of the subject's.
    pub mutant: MutantName<M>,
    /// Seconds a trial of this test may take before it is stopped and
    /// recorded as an `error`; absent, the check kind's default. At least
    /// [`crate::check::params::MIN_TIMEOUT_S`].
    #[serde(default)]
    pub timeout_s: Option<Timeout>,
    /// The subject this test is known to be falsified on, and why: the
    /// trial still runs and records what it measured, and its rows say it
    /// was expected to fail, so the report gates on changes (see
    /// [`KnownViolation`]). Only a subject that accepts known violations
    /// ([`Subject::ACCEPTS_KNOWN_VIOLATIONS`]) may be named, and only by
    /// its own contracts.
    #[serde(default)]
    pub known_violation: Option<KnownViolation>,
    /// One of the core's kinds or one of the subject's.
    pub check: Check<K>,
}

/// A test expected to be falsified on a subject we do not own: a published
/// claim that the published code does not keep. The finding stays a
/// result (the trial records `falsified`); this says it is known, so that
/// only a change (a new violation, or this one fixed) moves the gate.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KnownViolation {
    /// The subject's name ([`Subject::NAME`]) the contracts run against.
    #[serde(deserialize_with = "non_empty")]
    pub subject: String,
    /// Why the claim does not hold there, in words (the report shows it).
    #[serde(deserialize_with = "non_empty")]
    pub reason: String,
    /// What was measured when the violation was found (which module loaded
    /// after the upload, the loss difference at each checkpoint, ...).
    #[serde(deserialize_with = "non_empty")]
    pub evidence: String,
    /// The line of the subject's source that explains it, `path.rs:123`.
    #[serde(deserialize_with = "non_empty")]
    pub source: String,
}

impl<K: KindSet, M> FalsificationTest<K, M> {
    /// The wall-time limit of one trial of this test, in seconds.
    pub fn timeout_s(&self) -> f64 {
        self.timeout_s
            .map_or_else(|| self.check.default_timeout_s(), |t| t.0)
    }
}

impl<K, M> Contract<K, M> {
    /// The backend of a test: `cuda` when it (or, by default, its contract) requires CUDA.
    pub fn backend_of(&self, test: &FalsificationTest<K, M>) -> Backend {
        let requires = test.requires.as_deref().unwrap_or(&self.requires);
        if requires.contains(&Requirement::Cuda) {
            Backend::Cuda
        } else {
            Backend::Cpu
        }
    }
}

/// The characters of a safe id, as error messages and docs state them.
pub const SAFE_ID_RULE: &str =
    "ASCII letters, digits, `-`, `_` and `.`, starting with a letter or digit";

/// The longest contract or test id, in characters. A trial's name joins a
/// contract id, a test id and `mutant` with `::`, and travels in argv, file
/// names (a file name has at most 255 bytes) and CSV cells; real ids have
/// under 40 characters.
pub const MAX_ID_LEN: usize = 100;

/// Whether `id` may name a contract or a test: non-empty, only ASCII
/// letters, digits, `-`, `_` and `.`, and starting with a letter or digit.
///
/// Ids become CSV cells, file names and trial names, so the set leaves out
/// everything that means something there: a first `=`, `+`, `-` or `@` (a
/// spreadsheet formula), separators and quotes (`,`, `"`, newline), `/`
/// (an id is never a path, nor `.` or `..`), and `:` (trial names join
/// contract, test and `mutant` with `::`).
pub fn is_safe_id(id: &str) -> bool {
    id.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Why `id` is not safe, for the error message.
fn unsafe_because(id: &str) -> String {
    if id.is_empty() {
        return "it is empty".to_string();
    }
    if id.contains("::") {
        return "`::` joins contract, test and `mutant` in trial names".to_string();
    }
    let (at, c) = id
        .char_indices()
        .find(|&(at, c)| !(c.is_ascii_alphanumeric() || (at > 0 && matches!(c, '-' | '_' | '.'))))
        .unwrap_or((0, ' '));
    if at == 0 {
        format!("it starts with {c:?}")
    } else {
        format!("{c:?} is not allowed")
    }
}

/// `id` as a message shows it: anything but printable ASCII escaped (`\n`,
/// `\u{202e}`), at most 64 characters, so a hostile id can neither garble
/// nor flood the terminal.
pub(crate) fn shown(id: &str) -> String {
    let mut s = String::new();
    for c in id.chars().take(64) {
        if c == ' ' || c.is_ascii_graphic() {
            s.push(c);
        } else {
            s.extend(c.escape_default());
        }
    }
    if id.chars().nth(64).is_some() {
        s.push_str("...");
    }
    s
}

/// Reads an id and checks it inside the visitor, so serde_yaml locates an
/// unsafe one at its own line and column.
fn safe_id<'de, D: Deserializer<'de>>(d: D, what: &'static str) -> Result<String, D::Error> {
    struct V(&'static str);
    impl de::Visitor<'_> for V {
        type Value = String;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "a {} ({SAFE_ID_RULE})", self.0)
        }
        fn visit_str<E: de::Error>(self, id: &str) -> Result<String, E> {
            let len = id.chars().count();
            if len > MAX_ID_LEN {
                return Err(E::custom(format!(
                    "{} `{}` is too long: {len} characters, ids have at most {MAX_ID_LEN}",
                    self.0,
                    shown(id)
                )));
            }
            if is_safe_id(id) {
                return Ok(id.to_string());
            }
            Err(E::custom(format!(
                "{} `{}` is not a safe id ({}): ids use only {SAFE_ID_RULE}",
                self.0,
                shown(id),
                unsafe_because(id)
            )))
        }
    }
    d.deserialize_str(V(what))
}

/// A string with something besides white space in it. Checked inside the
/// visitor, so serde_yaml locates an empty one at its own line and column.
fn non_empty<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    struct V;
    impl de::Visitor<'_> for V {
        type Value = String;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a non-empty string")
        }
        fn visit_str<E: de::Error>(self, text: &str) -> Result<String, E> {
            if text.trim().is_empty() {
                return Err(E::custom(
                    "this must not be empty: a known violation states its subject, reason, \
                     evidence and source",
                ));
            }
            Ok(text.to_string())
        }
    }
    d.deserialize_str(V)
}

fn contract_id<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    safe_id(d, "contract id")
}

fn test_id<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    safe_id(d, "test id")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_ids_are_letters_digits_dash_underscore_dot() {
        for id in [
            "F-GRAPH-BWD-001",
            "C-PREWARM-001",
            "kernel-parity-v1",
            "a_b.c",
            "7z",
        ] {
            assert!(is_safe_id(id), "{id}");
        }
        for id in ["", "-1", ".x", "_x", "a::b", "a b", "a,b", "a/b", "=1", "é"] {
            assert!(!is_safe_id(id), "{id}");
        }
        assert_eq!(unsafe_because("F-1,2"), "',' is not allowed");
        assert_eq!(unsafe_because("+1"), "it starts with '+'");
        assert_eq!(shown("a\nb"), "a\\nb");
        assert!(shown(&"x".repeat(100)).ends_with("x..."));
    }
}
