//! `gradient_check` execution: analytic backward vs central finite differences.

use crate::check::{gradient_check, Measurement, TrialContext};
use crate::error::{Error, Result};

pub fn measure(p: &gradient_check::Params, cx: &mut TrialContext<'_>) -> Result<Measurement> {
    match (&p.op, &p.model) {
        (Some(_), _) => measure_op(p, cx),
        (None, Some(_)) => super::train::gradcheck(p, cx),
        (None, None) => Err(Error::InvalidArgument {
            op: "gradient_check",
            message: "give `op` or `model`".into(),
        }),
    }
}

fn measure_op(_p: &gradient_check::Params, _cx: &mut TrialContext<'_>) -> Result<Measurement> {
    Err(Error::InvalidArgument { op: "gradient_check", message: "not built yet".into() })
}
