//! `property` execution.

use crate::check::{property, Measurement, TrialContext};
use crate::error::{Error, Result};

pub fn measure(_p: &property::Params, _cx: &mut TrialContext<'_>) -> Result<Measurement> {
    Err(Error::CudaUnavailable("not built yet".into()))
}
