//! The crate's one error type.

use crate::stderr::ProblemKind;

/// Everything that can go wrong while setting up or driving aprender-train.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `Setup::model` names no configuration of [`crate::models`].
    #[error("unknown model `{name}` (known: {known})")]
    UnknownModel { name: String, known: String },

    /// A dimension aprender-train's NF4 path cannot take: it would panic
    /// (`assert!`, T:transformer/cuda_block.rs:2938-2941) or miss pre-warm keys.
    #[error("model `{model}`: {what} = {value} is not a multiple of {multiple}")]
    Shape {
        model: String,
        what: &'static str,
        value: usize,
        multiple: usize,
    },

    /// A setup value outside what the subject can run.
    #[error("invalid setup: {0}")]
    Setup(String),

    /// Without `nvidia-smi` aprender-train's VRAM guard sees 0 MB and the
    /// pipeline silently trains on the CPU (T:gpu/ledger.rs:405-483,
    /// T:finetune/instruct_pipeline/cuda_init.rs:38-40).
    #[error("nvidia-smi is not on PATH: aprender-train would fall back to the CPU")]
    NoNvidiaSmi,

    /// `InstructPipeline::new` returned a pipeline without CUDA blocks: it
    /// fell back to the CPU (its stderr says why).
    #[error("aprender-train fell back to the CPU (InstructPipeline::is_cuda() is false)")]
    CpuFallback,

    /// aprender-train panicked (e.g. a shape `assert!`); the panic was caught
    /// at the call so the trial reports it instead of aborting.
    #[error("aprender-train panicked in {during}: {message}")]
    Panicked {
        during: &'static str,
        message: String,
    },

    /// A step after a panic: the pipeline's state is unknown.
    #[error("the session is unusable after an earlier panic")]
    Poisoned,

    /// `train_step` trained another number of response tokens than the
    /// sample holds: the step was truncated or skipped.
    #[error("step {step}, sample {sample}: {got} response tokens trained, expected {expected}")]
    ResponseTokens {
        step: usize,
        sample: usize,
        got: usize,
        expected: usize,
    },

    /// aprender-gpu makes its context current only on the constructing
    /// thread (G:driver/context.rs:131-136) and counts per thread
    /// (G:driver/memory/buffer.rs:89-97): a session is driven from one thread.
    #[error("the session was prepared on thread {prepared} and stepped on thread {current}")]
    WrongThread { prepared: String, current: String },

    /// The trial process reported another number of losses (`[CUDA] loss=`
    /// or `NaN/Inf loss detected` lines) than it ran `train_step`s: some step
    /// did not take the GPU-resident path (T:finetune/instruct_pipeline/training.rs:162-175, 227-239).
    #[error("stderr reports {found} losses, expected {expected} (one per train_step)")]
    LossLines { expected: usize, found: usize },

    /// A stderr line of the trial process that means the GPU path was left
    /// or failed (see [`crate::StderrWitness::check`]).
    #[error("stderr line {line}: {kind}: {text}")]
    Stderr {
        line: usize,
        kind: ProblemKind,
        text: String,
    },

    /// Reading this process's stderr failed (see [`crate::StderrTap`]).
    #[error("stderr tap: {0}")]
    Tap(String),

    /// The CUDA driver refused a query of the device a trial runs on.
    #[error("CUDA driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),

    /// A setup the seam handed over that this subject cannot take.
    #[error("{0}")]
    Seam(String),
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
