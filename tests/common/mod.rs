//! The report rows the root crate's integration tests build and look up:
//! the core's own test helpers (`core/tests/common/mod.rs`), one file for
//! both crates.

#[path = "../../core/tests/common/mod.rs"]
mod rows;

// Each test crate uses only some of them.
#[allow(unused_imports)]
pub use rows::*;
