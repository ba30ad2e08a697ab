//! The aprender-train subject: drives the published `aprender-train` 0.72.3
//! (library `entrenar`) through its public API only — the QLoRA
//! `InstructPipeline` on its CUDA path — so falsify's contracts can judge
//! the claims its doc comments make (C-PREWARM-001, F-PTX-001,
//! F-GRAPH-BWD-001..003, the fused clip's zero device-to-host syncs).
//!
//! What the subject seam needs, without the seam (it lives in `falsify-core`):
//!
//! | seam (`Workload` / `TrainSession`) | here |
//! |---|---|
//! | `models()` | [`models`] |
//! | `upload_bytes(setup)` | [`upload_bytes`] |
//! | `prepare(device, setup, mutant)` | [`Session::prepare`] |
//! | `process_env(setup)` | [`process_env`] (needs the trial's fresh `HOME`) |
//! | `TrainSession::step()` | [`Session::step`] |
//! | `TrainSession::own_counts()` | [`Session::own_counts`] |
//! | (stderr, captured by the harness) | [`StderrWitness::parse`] |
//!
//! [`Setup`] has the fields of the seam's `TrainSetup`.
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
mod upload;

pub use counters::{loss_readback_bytes, GpuCounters, OwnCounters};
pub use env::{find_nvidia_smi, graph_env, process_env};
pub use error::{Error, Result};
pub use model::{
    configs, model_shape, models, ModelShape, Resolved, Setup, DEFAULT_LEARNING_RATE,
    DEFAULT_SEQ_LEN, GRADIENT_CLIP_NORM, LORA_ALPHA, LORA_RANK, NF4_BLOCK,
};
pub use samples::{samples, Sample};
pub use session::Session;
pub use stderr::{
    Capture, Compilation, KernelCache, Located, Prewarm, Problem, ProblemKind, StderrWitness,
};
pub use upload::{upload_bytes, LayerUpload};
