//! The aprender-train subject: drives the published `aprender-train` 0.72.3
//! (library `entrenar`) through its public API only — the QLoRA
//! `InstructPipeline` on its CUDA path — so falsify's contracts can judge
//! the claims its doc comments make (C-PREWARM-001, F-PTX-001,
//! F-GRAPH-BWD-001..003, the fused clip's zero device-to-host syncs).
//!
//! On falsify's seam: [`AprenderTrain`] is the subject (no kinds or
//! mutants of its own: its contracts, `contracts/`, use the core's kinds
//! and mutants), [`AprenderWorkload`] its training workload, and
//! [`SeamSession`] one prepared pipeline whose stderr is tapped
//! ([`StderrTap`]) and read after every step ([`StderrWitness`]): a line
//! that means the GPU path was left makes that step an error.
//!
//! | seam (`Workload` / `TrainSession`) | here |
//! |---|---|
//! | `models()` | [`models`] |
//! | `upload_bytes(setup)` | [`upload_bytes`] |
//! | `prepare(device, setup, mutant)` | [`SeamSession::prepare`] ([`Session::prepare`] under a stderr tap) |
//! | `process_env(setup, scratch)` | [`process_env`] with `HOME` = scratch, plus `nvidia-smi` on `PATH` ([`path_with_nvidia_smi`]) |
//! | `TrainSession::step()` | [`Session::step`], then the stderr check |
//! | `TrainSession::own_counts()` | device-to-host bytes of the steps ([`GpuCounters`]) |
//!
//! [`Setup`] has the fields of the seam's `TrainSetup` ([`setup_of`]).
//!
//! Source citations: `T:` = `aprender-train-0.72.3/src/`, `G:` =
//! `aprender-gpu-0.72.3/src/`, both under the cargo registry
//! (`~/.cargo/registry/src/index.crates.io-*/`), with `file:line`.

mod counters;
mod env;
mod error;
mod model;
mod samples;
mod session;
mod stderr;
mod subject;
mod tap;
mod upload;

pub use counters::{loss_readback_bytes, GpuCounters, OwnCounters};
pub use env::{find_nvidia_smi, graph_env, path_with_nvidia_smi, process_env};
pub use error::{Error, Result};
pub use model::{
    configs, model_shape, models, ModelShape, Resolved, Setup, DEFAULT_LEARNING_RATE,
    DEFAULT_SEQ_LEN, GRADIENT_CLIP_NORM, LORA_ALPHA, LORA_RANK, NF4_BLOCK,
};
pub use samples::{samples, Sample};
pub use session::{NonFiniteLoss, Session};
pub use stderr::{
    Capture, Compilation, KernelCache, Located, Prewarm, Problem, ProblemKind, StderrWitness,
};
pub use subject::{setup_of, AprenderTrain, AprenderWorkload, Gpu, NoKinds, NoMutant, SeamSession};
pub use tap::StderrTap;
pub use upload::{upload_bytes, LayerUpload};
