//! The stack's one error type.

/// Everything that can go wrong in the training stack, from a shape an op
/// refuses to a CUDA launch failure.
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

    /// A kernel module whose code (PTX `.target`, cubin ELF flags) is not for
    /// the device's own architecture; `ptx` names the code's target.
    #[error("kernel code targets {ptx} but the device is {device}; refusing to load it")]
    TargetMismatch { ptx: String, device: String },

    /// The CUDA driver is missing or no device could be opened.
    #[error("CUDA unavailable: {0}")]
    CudaUnavailable(String),

    /// A model configuration does not fit on the device.
    #[error(
        "{model} needs {needed_gib:.2} GiB of device memory, the device has {available_gib:.2} GiB free"
    )]
    OutOfMemory {
        model: String,
        needed_gib: f64,
        available_gib: f64,
    },

    #[error(transparent)]
    Driver(#[from] cudarc::driver::DriverError),

    /// NVRTC failed; the compiler log is kept so the kernel author can read it.
    #[error("NVRTC failed to compile {module}: {log}")]
    Compile { module: String, log: String },

    #[error(transparent)]
    Nvrtc(#[from] cudarc::nvrtc::CompileError),

    /// An NVRTC call other than compilation failed (version, cubin retrieval).
    #[error(transparent)]
    NvrtcCall(#[from] cudarc::nvrtc::result::NvrtcError),

    /// Reading or writing the on-disk kernel cache failed.
    #[error("kernel cache file {path}: {source}")]
    CacheIo {
        path: std::path::PathBuf,
        source: std::io::Error,
    },

    /// An NCCL call failed; `code` is NCCL's result.
    #[error("NCCL {call} failed: {code:?}")]
    Nccl {
        call: &'static str,
        code: cudarc::nccl::sys::ncclResult_t,
    },

    /// cudarc's loader found no NCCL library (it looks for `libnccl.so`).
    #[error("NCCL unavailable: {0}")]
    NcclUnavailable(String),

    #[error(transparent)]
    Cublas(#[from] cudarc::cublas::result::CublasError),

    /// A cuBLASLt call failed with this status.
    #[error("cuBLASLt: {0}")]
    CublasLt(String),

    /// A checkpoint file that cannot be read or is not what it should be
    /// (a bad `config.json`, with serde_json's line and column; a truncated
    /// safetensors file; an index naming a missing shard).
    #[error("{}: {message}", path.display())]
    Checkpoint {
        path: std::path::PathBuf,
        message: String,
    },

    /// A tensor of a checkpoint that is missing or has the wrong shape or dtype.
    #[error("{}: tensor {tensor}: {message}", path.display())]
    CheckpointTensor {
        path: std::path::PathBuf,
        tensor: String,
        message: String,
    },
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
