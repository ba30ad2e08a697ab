//! # falsify
//!
//! Executable contracts for a GPU training stack. Claims about CUDA kernels and
//! a QLoRA training step are written as YAML contracts (`contracts/`); each
//! falsification test names a check kind that measures the claim against the
//! real code, and a mutant that must make it fail. `cargo test` runs every test
//! as a trial and writes what it measured to CSV under `reports/latest/`.
//!
//! Layout: [`contract`] (schema, discovery, validation), [`check`] (the check
//! kinds), [`reference`] (the CPU oracle), [`mutant`] (named faults, mapped to
//! the stack's fault knobs or to faulty oracle variants), [`ranks`]
//! (data-parallel ranks as processes), [`run`] (the engine)
//! and [`report`] (CSV, Markdown, charts). The system under test is the
//! [`qlora`] crate, which knows nothing of this one.

pub mod check;
pub mod child;
pub mod contract;
pub mod error;
pub mod mutant;
pub mod ranks;
pub mod reference;
pub mod report;
pub mod run;

pub use error::{Error, Result};
