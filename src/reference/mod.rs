//! The CPU reference: plain Rust with f64 accumulation; the oracle for every
//! GPU parity check.

pub mod gradcheck;
pub mod properties;
