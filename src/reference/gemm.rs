//! Reference gemm.
