//! The qlora subject's one error type.

use std::path::PathBuf;

/// Everything that can go wrong in a trial of the qlora subject, from a
/// shape a kind refuses to a CUDA launch failure.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Buffers passed to an op do not have the shape the op needs.
    #[error("{op}: shape mismatch: expected {expected}, got {got}")]
    ShapeMismatch {
        op: &'static str,
        expected: String,
        got: String,
    },

    /// A parameter outside the range the op or model supports.
    #[error("{op}: {message}")]
    InvalidArgument { op: &'static str, message: String },

    /// The CUDA driver is missing or no device could be opened.
    #[error("CUDA unavailable: {0}")]
    CudaUnavailable(String),

    /// The fault knobs were on before a trial started (the guard of
    /// `with_faults` makes this impossible; should it ever happen, the
    /// knobs are turned off and the trial is not trusted).
    #[error("fault knobs were on before this trial started ({0}); they are off now")]
    FaultsLeftOn(String),

    /// Data-parallel rank processes that did not all answer (one died, hung
    /// or sent no reply); every rank was stopped.
    #[error("data-parallel ranks: {0}")]
    Ranks(String),

    /// A peer the check runs beside is not installed here (e.g. python3
    /// with PEFT): the trial cannot be judged on this machine.
    #[error("{0}")]
    PeerAbsent(String),

    /// A figure the claim is judged on that this machine's driver does not
    /// report (a process's device memory where `nvidia-smi` is absent, says
    /// `[N/A]` or lists no such process): the trial cannot be judged here.
    #[error("{0}")]
    NotReported(String),

    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// An error of the training stack under test.
    #[error(transparent)]
    Stack(#[from] qlora::Error),

    #[error(transparent)]
    Driver(#[from] cudarc::driver::DriverError),

    #[error(transparent)]
    Cublas(#[from] cudarc::cublas::result::CublasError),
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Shorthand for an I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}
