//! The GPU training step ([`step::GpuTrainer`]), its preallocated workspace,
//! and the checks that run training on either backend.

mod blas;
pub mod checks;
pub mod kernels;
pub mod step;
pub mod weights;
pub mod workspace;

pub use step::{GpuStepReport, GpuTrainOptions, GpuTrainer, SyncCounts};
