//! `gradient_check` execution.

use crate::check::{gradient_check, Measurement, TrialContext};
use crate::error::{Error, Result};

pub fn measure(_p: &gradient_check::Params, _cx: &mut TrialContext<'_>) -> Result<Measurement> {
    Err(Error::CudaUnavailable("not built yet".into()))
}
