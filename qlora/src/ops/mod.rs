//! Safe typed launchers of the CUDA kernels: each validates shapes, launches,
//! and states in one `// SAFETY:` block why the launch is sound.

pub mod activation;
pub mod adamw;
pub mod attention;
pub mod cast;
pub mod clip;
pub mod cross_entropy;
pub mod draw;
pub mod elementwise;
pub mod embedding;
pub mod faults;
pub mod gemm;
pub mod gemm_tuned;
pub mod launch;
pub mod nf4;
pub mod rmsnorm;
pub mod rope;
pub mod softmax;
