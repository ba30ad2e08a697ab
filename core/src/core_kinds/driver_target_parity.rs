//! `driver_target_parity`: every module image the CUDA driver loads while
//! the subject prepares and trains targets the device's `sm_XY` (PTX
//! `.target`, cubin arch, the fat-binary entry the driver picks), as the
//! driver observer saw it, not as the subject reports it.

use serde::Deserialize;

use super::train::{self, Training};
use super::{CoreCheck, CoreTrial};
use crate::check::params::Count;
use crate::check::{Backend, Measurement, ParamDoc, Validate};
use crate::subject::Subject;
use crate::Error;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub model: String,
    pub steps: Count,
    #[serde(default = "train::one")]
    pub batch: Count,
    #[serde(default)]
    pub seq_len: Option<Count>,
    #[serde(default)]
    pub graph: bool,
}

/// The parameters of `driver_target_parity`, for the generated reference.
pub const PARAMS: &[ParamDoc] = &[
    train::MODEL_DOC,
    train::STEPS_DOC,
    train::BATCH_DOC,
    train::SEQ_LEN_DOC,
    train::GRAPH_DOC,
];

/// A minimal `driver_target_parity` check.
pub const EXAMPLE: &[(&str, &str)] = &[("model", "tiny"), ("steps", "2")];

impl Params {
    fn training(&self) -> Training<'_> {
        Training {
            model: &self.model,
            steps: self.steps,
            batch: self.batch,
            seq_len: self.seq_len,
            graph: self.graph,
        }
    }
}

impl Validate for Params {
    fn validate(&self) -> Result<(), String> {
        self.training().validate()
    }
}

impl CoreCheck for Params {
    fn execute<S: Subject>(
        &self,
        _backend: Backend,
        trial: CoreTrial<'_, '_, S>,
    ) -> crate::Result<Measurement> {
        let setup = self.training().setup(trial.cx.seed);
        Err(Error::Subject(
            format!("driver_target_parity ({setup:?}): the driver observer is not attached yet")
                .into(),
        ))
    }

    fn validate_for<S: Subject>(&self) -> Result<(), (&'static str, String)> {
        self.training().validate_for::<S>()
    }

    fn observes_driver(&self) -> bool {
        true
    }
}
