//! # falsify-core
//!
//! The harness core of falsify: contracts, the check framework, the run
//! engine, reports and baselines, for any system under test. Claims about
//! a CUDA stack are written as YAML contracts; each falsification test
//! names a check kind of its subject that measures the claim against the
//! real code, and a mutant that must make it fail. The core plans every
//! test as a trial (and its mutant self-test), runs each in a process of
//! its own with a timeout, and writes what it measured to CSV; a
//! regression report compares a run with a committed baseline.
//!
//! Layout, bottom to top (`tests/layering.rs` at the workspace root holds
//! the modules to this order): [`error`] and [`child`] (the child
//! processes the engine starts); [`report`] (CSV, run records, baselines,
//! REPORT.md, charts); [`check`] (the vocabulary of a check: backends,
//! measurements, parameter types and docs, stats); [`subject`] (the seam a
//! system under test implements: [`Subject`], its kinds ([`Kind`],
//! [`KindSet`], [`kinds!`]) and what a trial hands them); [`workload`]
//! (two arms of a subject's workload, each a process of its own);
//! [`core_kinds`] (the core's own kinds and mutants, valid beside every
//! subject's: [`core_kinds::Check`], [`core_kinds::MutantName`]); [`contract`]
//! (schema, discovery, validation); [`run`] (the engine: planning, a
//! process per trial, timeouts, the run's snapshot of its contracts); and
//! [`harness`](mod@harness) (the `cargo test` runner a subject's test target is made of
//! with [`harness!`]). The core names no stack: a subject crate (e.g.
//! `falsify-qlora`) sits above it.

pub mod check;
pub mod child;
pub mod contract;
pub mod core_kinds;
pub mod error;
pub mod harness;
pub mod report;
pub mod run;
pub mod subject;
pub mod workload;

// Last: the layering test reads the modules above this line.
#[cfg(test)]
mod testing;

pub use error::{Error, Result};
pub use subject::{
    BasicOptions, BoxError, DeviceFacts, DeviceOptions, HelperRole, Kind, KindSet, MutantSet,
    NoDevice, OwnCounts, Subject, TrainSession, TrainSetup, TrialContext, Workload,
};

/// What the macros of this crate name from its dependencies, so that a
/// subject crate need not depend on them itself. Not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use serde;
}
