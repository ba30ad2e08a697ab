//! Reference train.

use crate::check::{gradient_check, Measurement, TrialContext};
use crate::error::{Error, Result};

/// `gradient_check` of the whole training step's LoRA and norm gradients.
pub fn gradcheck(_p: &gradient_check::Params, _cx: &mut TrialContext<'_>) -> Result<Measurement> {
    Err(Error::InvalidArgument { op: "gradient_check", message: "not built yet".into() })
}
