//! Safe typed launchers of the CUDA kernels, and `op_parity` execution.

pub mod parity;
