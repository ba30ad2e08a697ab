//! `property` execution for NF4, clipping and AdamW.

use crate::check::{property, Measurement, TrialContext};
use crate::error::{Error, Result};

pub fn measure(_p: &property::Params, _cx: &mut TrialContext<'_>) -> Result<Measurement> {
    Err(Error::InvalidArgument { op: "property", message: "not built yet".into() })
}
