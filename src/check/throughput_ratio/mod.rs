//! `throughput_ratio`: the median time of a baseline over a candidate, after
//! warm-up, over repeats. Passes when `ratio >= min_ratio`; the bootstrap
//! confidence interval of the ratio is recorded in `speedups.csv`.

mod kernels;
mod train_step;

use serde::Deserialize;

use super::params::{Count, ModelName, Positive, StepMode};
use super::{Backend, Kind, Measurement, TrialContext, Validate};
use crate::error::Result;

/// What is timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Subject {
    /// One whole training step of `model`.
    TrainStep,
    /// The TF32 GEMM on fp32 weights vs the NF4 path (dequantise, then the
    /// same GEMM) on `model`'s projection shapes; the fused NF4 kernel is
    /// reported next to it.
    Nf4Gemm,
    /// The fused kernels vs their unfused sequences on `model`'s shapes.
    Fusion,
    /// A direct cuBLAS call vs our GEMM launcher on `model`'s projection shapes.
    Gemm,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    #[serde(default = "default_subject")]
    pub subject: Subject,
    pub model: ModelName,
    #[serde(default)]
    pub batch: Option<Count>,
    #[serde(default)]
    pub seq_len: Option<Count>,
    #[serde(default)]
    pub baseline: StepMode,
    #[serde(default)]
    pub candidate: StepMode,
    #[serde(default = "default_warmup")]
    pub warmup: Count,
    #[serde(default = "default_repeats")]
    pub repeats: Count,
    pub min_ratio: Positive,
}

fn default_subject() -> Subject {
    Subject::TrainStep
}

fn default_warmup() -> Count {
    Count(5)
}

fn default_repeats() -> Count {
    Count(30)
}

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        if self.repeats.0 < 5 {
            return Err("`repeats` must be at least 5 for a median and its interval".into());
        }
        Ok(())
    }
}

impl Kind for Params {
    fn execute(&self, _backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        match self.subject {
            Subject::TrainStep => train_step::throughput_ratio(self, cx),
            Subject::Nf4Gemm | Subject::Fusion | Subject::Gemm => kernels::measure(self, cx),
        }
    }
}
