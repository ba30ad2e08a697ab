//! The CPU reference: plain, obviously-correct Rust with f64 accumulation and
//! no CUDA. It is the oracle for every GPU parity check, and on the `tiny`
//! preset it runs the whole training step.
//!
//! Conventions: tensors are row-major `&[f64]` slices with their dimensions
//! passed explicitly; every function allocates and returns its outputs;
//! `{op}::forward` and `{op}::backward` mirror the GPU launchers in `ops/`.

pub mod activation;
pub mod adamw;
pub mod attention;
pub mod clip;
pub mod cross_entropy;
pub mod elementwise;
pub mod embedding;
pub mod gemm;
pub mod nf4;
pub mod rmsnorm;
pub mod rope;
pub mod softmax;
pub mod train;
