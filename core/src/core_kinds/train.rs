//! What every driver-observed kind shares: the training it observes (which
//! configuration of the subject's workload, how many steps, ...), its
//! bounds and docs, and its check against the subject's workload.

use serde::Deserialize;

use crate::check::params::{at_most, Count};
use crate::check::{ParamDefault, ParamDoc, Piece};
use crate::subject::{Subject, TrainSetup};

/// The most steps a driver-observed trial trains.
pub const MAX_STEPS: usize = 200;
/// The largest batch.
pub const MAX_BATCH: usize = 64;
/// The longest sequence.
pub const MAX_SEQ_LEN: usize = 4096;

/// `model`'s documentation.
pub const MODEL_DOC: ParamDoc = ParamDoc {
    name: "model",
    default: ParamDefault::Required,
    bound: &[Piece::Text("one of the subject workload's models")],
    meaning: "configuration trained",
};
/// `steps`' documentation.
pub const STEPS_DOC: ParamDoc = ParamDoc {
    name: "steps",
    default: ParamDefault::Required,
    bound: &[Piece::Text("1 to "), Piece::Int(MAX_STEPS)],
    meaning: "training steps observed after `prepare`",
};
/// `batch`'s documentation.
pub const BATCH_DOC: ParamDoc = ParamDoc {
    name: "batch",
    default: ParamDefault::Yaml("1"),
    bound: &[Piece::Text("1 to "), Piece::Int(MAX_BATCH)],
    meaning: "samples per step",
};
/// `seq_len`'s documentation.
pub const SEQ_LEN_DOC: ParamDoc = ParamDoc {
    name: "seq_len",
    default: ParamDefault::Otherwise("the workload's"),
    bound: &[Piece::Text("1 to "), Piece::Int(MAX_SEQ_LEN)],
    meaning: "tokens per sample",
};
/// `graph`'s documentation.
pub const GRAPH_DOC: ParamDoc = ParamDoc {
    name: "graph",
    default: ParamDefault::Yaml("false"),
    bound: &[Piece::Text("true or false")],
    meaning: "CUDA-graph the step (the workload decides how)",
};

/// The default `batch`.
pub fn one() -> Count {
    Count(1)
}

/// The parameters of a kind that takes nothing but the training it drives
/// (`driver_target_parity`, `driver_prewarm`; each kind wraps them in a
/// `serde(transparent)` type of its own).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainingParams {
    pub model: String,
    pub steps: Count,
    #[serde(default = "one")]
    pub batch: Count,
    #[serde(default)]
    pub seq_len: Option<Count>,
    #[serde(default)]
    pub graph: bool,
}

/// [`TrainingParams`]' documentation, for the generated reference.
pub const TRAINING_PARAMS: &[ParamDoc] = &[MODEL_DOC, STEPS_DOC, BATCH_DOC, SEQ_LEN_DOC, GRAPH_DOC];

impl TrainingParams {
    /// The training these parameters describe.
    pub fn training(&self) -> Training<'_> {
        Training {
            model: &self.model,
            steps: self.steps,
            batch: self.batch,
            seq_len: self.seq_len,
            graph: self.graph,
        }
    }
}

/// The training a driver-observed check drives.
#[derive(Debug, Clone, Copy)]
pub struct Training<'p> {
    pub model: &'p str,
    pub steps: Count,
    pub batch: Count,
    pub seq_len: Option<Count>,
    pub graph: bool,
}

impl Training<'_> {
    /// The documented bounds.
    pub fn validate(&self) -> Result<(), String> {
        at_most("steps", self.steps.0, MAX_STEPS)?;
        at_most("batch", self.batch.0, MAX_BATCH)?;
        match self.seq_len {
            Some(s) => at_most("seq_len", s.0, MAX_SEQ_LEN),
            None => Ok(()),
        }
    }

    /// Whether the subject `S` has a workload that trains `model`; the
    /// error names the key it is located at.
    pub fn validate_for<S: Subject>(&self) -> Result<(), (&'static str, String)> {
        let Some(workload) = S::workload() else {
            return Err((
                "kind",
                format!(
                    "subject `{}` has no training workload, so the core's driver-observed kinds \
                     cannot run for it",
                    S::NAME
                ),
            ));
        };
        let models = workload.models();
        if models.contains(&self.model) {
            return Ok(());
        }
        Err((
            "model",
            format!(
                "model `{}` is not one the workload of subject `{}` trains; its models: {}",
                self.model,
                S::NAME,
                models.join(", ")
            ),
        ))
    }

    /// The setup the workload is driven with.
    pub fn setup(&self, seed: u64) -> TrainSetup {
        TrainSetup {
            model: self.model.to_string(),
            batch: self.batch.0,
            seq_len: self.seq_len.map(|s| s.0),
            graph: self.graph,
            steps: self.steps.0,
            seed,
            learning_rate: None,
        }
    }
}
