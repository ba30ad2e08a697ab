//! The CUDA runtime: one context per device, its stream, cuBLAS, and the kernel cache.

pub mod cache;
mod context;
pub mod disk;
pub mod prewarm;
pub mod staging;
pub mod table;
pub mod timing;

pub use cache::{CacheStats, CompileRecord, KernelCache, Origin};
pub use context::{
    cublas_present, driver_present, launch_config_1d, launch_config_rows, nvrtc_present, to_i32,
    DeviceFacts, Direction, FaultScope, GemmMath, GpuContext, GpuOptions, THREADS_1D,
};
pub use prewarm::{modules_for, PrewarmReport};
pub use staging::Stager;
pub use table::TensorTable;
