//! The CUDA runtime: one context per device, its stream, cuBLAS, and the kernel cache.

pub mod checks;
mod context;

pub use context::{driver_present, DeviceFacts, GpuContext, GpuOptions};
