//! The GPU training step ([`step::GpuTrainer`]), its options and its
//! preallocated workspace.

mod blas;
pub mod data_parallel;
pub mod kernels;
mod layer;
mod options;
pub mod step;
pub mod weights;
pub mod workspace;

pub use blas::gemm_half;
pub use data_parallel::Rank;
pub use options::{AdamW, BaseWeights, ClipMode, GpuTrainOptions, Hyper};
pub use step::{
    check_architecture, check_shapes, planned_device_bytes, GpuStepReport, GpuTrainer,
    LossAndGrads, SetupPhase, SyncCounts, TrainerSetup,
};
