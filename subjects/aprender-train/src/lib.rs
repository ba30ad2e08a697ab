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
//! [`Setup`] has the fields of the seam's `TrainSetup`. Once this crate
//! depends on `falsify-core`, the wiring is (sketch):
//!
//! ```text
//! fn setup(s: &TrainSetup) -> Setup { Setup { model: s.model.clone(), batch: s.batch,
//!     seq_len: s.seq_len, graph: s.graph, steps: s.steps, seed: s.seed,
//!     learning_rate: s.learning_rate } }
//! impl Workload<AprenderTrain> for AprenderWorkload {
//!     fn models(&self) -> &[&'static str] { models() }
//!     fn upload_bytes(&self, s: &TrainSetup) -> Result<u64, BoxError> { Ok(upload_bytes(&setup(s))?) }
//!     fn prepare<'d>(&self, _: &'d mut NoDevice, s: &TrainSetup, _: Option<&NoMutant>)
//!         -> Result<Box<dyn TrainSession + 'd>, BoxError> { Ok(Box::new(Session::prepare(&setup(s))?)) }
//!     fn process_env(&self, s: &TrainSetup) -> Vec<(String, String)> { process_env(&setup(s), HOME) }
//! }
//! impl TrainSession for Session { fn step(&mut self) -> Result<f32, BoxError> { Ok(Session::step(self)?) } }
//! ```
//!
//! where `HOME` is a fresh directory per trial, which the seam's
//! `process_env(setup)` has no argument for yet.
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
