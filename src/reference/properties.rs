//! `property` execution over proptest-generated inputs.

use crate::check::property::Property;
use crate::check::{property, Measurement, TrialContext};
use crate::error::{Error, Result};

pub fn measure(p: &property::Params, cx: &mut TrialContext<'_>) -> Result<Measurement> {
    match p.property {
        Property::Nf4RoundTripBound
        | Property::ClipBoundsGlobalNorm
        | Property::ClipLeavesSmallUntouched
        | Property::AdamwFirstStepMovesByLr => super::properties_optim::measure(p, cx),
        _ => Err(Error::InvalidArgument { op: "property", message: "not built yet".into() }),
    }
}
