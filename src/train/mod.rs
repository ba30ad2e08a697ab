//! The GPU training step, and the checks that run training.

pub mod checks;
