//! # falsify
//!
//! Executable contracts for a GPU training stack. Claims about CUDA kernels and
//! a QLoRA training step are written as YAML contracts (`contracts/`); each
//! falsification test names a check kind that measures the claim against the
//! real code, and a mutant that must make it fail. `cargo test` runs every test
//! as a trial and writes what it measured to CSV under `reports/latest/`.
//!
//! Layout: [`contract`] (schema, discovery, validation), [`check`] (the check
//! kinds), [`run`] (the engine), [`report`] (CSV), [`reference`] (the CPU
//! oracle), [`model`], [`gpu`], [`ops`], [`train`] (the system under test) and
//! [`mutant`] (named fault injections).

pub mod check;
pub mod contract;
pub mod error;
pub mod gpu;
pub mod kernels;
pub mod model;
pub mod mutant;
pub mod ops;
pub mod reference;
pub mod report;
pub mod run;
pub mod train;

pub use error::{Error, Result};
