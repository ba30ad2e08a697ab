//! The training workload the core's driver-observed kinds drive: a subject
//! that can train returns a [`Workload`] from
//! [`Subject::workload`](super::Subject::workload). These definitions are
//! the contract between those kinds and every subject.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{BoxError, Subject};

/// A subject's training workload, as the core's driver-observed kinds drive
/// it. Per trial they call [`Workload::upload_bytes`], then, inside an
/// observed region, [`Workload::prepare`] (a marker "prepared" after it),
/// then [`TrainSession::step`] `steps` times (a marker "step i" before
/// each), and judge the driver's recording and
/// [`TrainSession::own_counts`].
pub trait Workload<S: Subject>: Sync {
    /// Names of the configurations it can train; a core kind's `model:` is
    /// validated against them at load time.
    fn models(&self) -> &[&'static str];

    /// Bytes of frozen and trainable weights [`Workload::prepare`] uploads:
    /// the observer's upload point is where the cumulative host-to-device
    /// bytes first reach this.
    fn upload_bytes(&self, setup: &TrainSetup) -> Result<u64, BoxError>;

    /// Pre-warms (if the subject has a pre-warm), then builds the trainer
    /// and uploads the weights. The subject applies its own `mutant` (its
    /// fault knobs) here when given one.
    fn prepare<'d>(
        &self,
        device: &'d mut S::Device,
        setup: &TrainSetup,
        mutant: Option<&S::Mutant>,
    ) -> Result<Box<dyn TrainSession + 'd>, BoxError>;

    /// Environment a trial process needs for `setup` (a stack that reads a
    /// switch from the environment once per process, or keeps state under
    /// `$HOME`): the engine starts the trial's process with it. `scratch` is
    /// an empty folder the engine made for this one process and removes
    /// after it (a fresh home, a cold module cache). Default: none.
    fn process_env(&self, _setup: &TrainSetup, _scratch: &Path) -> Vec<(String, String)> {
        Vec::new()
    }
}

/// A prepared trainer.
pub trait TrainSession {
    /// One training step; returns the loss.
    fn step(&mut self) -> Result<f32, BoxError>;

    /// The subject's own counters, where it has them: a second witness
    /// beside the observer. Disagreement is itself a falsification.
    fn own_counts(&self) -> Option<OwnCounts> {
        None
    }
}

/// What to train: a configuration of the workload and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainSetup {
    /// One of [`Workload::models`].
    pub model: String,
    pub batch: usize,
    /// `None`: the model's own.
    pub seq_len: Option<usize>,
    /// Replay the step as a captured CUDA graph.
    pub graph: bool,
    pub steps: usize,
    pub seed: u64,
    /// `None`: the subject's default.
    pub learning_rate: Option<f64>,
}

/// A subject's own counters; each `None` where it does not count it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct OwnCounts {
    /// Kernel compilations after pre-warm finished.
    pub compilations_after_prewarm: Option<u64>,
    /// Host synchronisations inside the captured region.
    pub syncs_inside_capture: Option<u64>,
    /// Host synchronisations per step, outside any capture.
    pub syncs_per_step: Option<f64>,
    /// Modules loaded in all.
    pub modules_loaded: Option<u64>,
    /// Device-to-host bytes copied during the steps.
    pub device_to_host_bytes: Option<u64>,
}
