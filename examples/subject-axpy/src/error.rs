//! The subject's one error type.

use cudarc::driver::DriverError;

/// What can go wrong in the axpy subject.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No CUDA driver or no NVRTC library could be loaded.
    #[error("CUDA unavailable: {0}")]
    CudaUnavailable(String),
    /// A driver call failed.
    #[error("CUDA driver: {0}")]
    Driver(#[from] DriverError),
    /// NVRTC refused a module's source.
    #[error("NVRTC could not compile module `{module}` for {arch}: {log}")]
    Compile {
        module: &'static str,
        arch: String,
        log: String,
    },
    /// A module has no kernel of that name (a bug of this crate).
    #[error("module `{module}` has no kernel `{kernel}`")]
    NoSuchKernel {
        module: &'static str,
        kernel: &'static str,
    },
    /// A size, model or setting the subject does not accept.
    #[error("{0}")]
    InvalidArgument(String),
    /// A stream capture ended without a graph.
    #[error("the stream capture of a training step produced no graph")]
    NoGraph,
}

/// The subject's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
