//! # qlora
//!
//! A QLoRA training stack on CUDA: kernels written in CUDA C and compiled by
//! NVRTC for the device's own architecture ([`kernels`], [`gpu`]), typed
//! launchers that validate shapes before they launch ([`ops`]), model presets,
//! weights, NF4 and LoRA ([`model`]), and the training step with fused
//! gradient clipping, AdamW and CUDA-graph capture ([`train`]).
//!
//! The crate knows nothing of the harness that tests it. What a test may ask
//! it to get wrong is a plain [`Faults`] value, applied to a
//! [`gpu::GpuContext`] through a guard that clears it on drop.

pub mod error;
pub mod faults;
pub mod gpu;
pub mod kernels;
pub mod model;
pub mod ops;
pub mod train;

pub use error::{Error, Result};
pub use faults::Faults;
