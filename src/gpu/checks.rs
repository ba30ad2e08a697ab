//! GPU-side execution of `target_parity` and `prewarm`.

use crate::check::{prewarm, target_parity, Measurement, TrialContext};
use crate::error::{Error, Result};

pub fn target_parity(_p: &target_parity::Params, _cx: &mut TrialContext<'_>) -> Result<Measurement> {
    Err(Error::CudaUnavailable("target_parity is not built yet".into()))
}

pub fn prewarm(_p: &prewarm::Params, _cx: &mut TrialContext<'_>) -> Result<Measurement> {
    Err(Error::CudaUnavailable("prewarm is not built yet".into()))
}
