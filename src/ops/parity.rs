//! `op_parity`: run an op on a backend and compare with the CPU reference.

use crate::check::{op_parity, Measurement, TrialContext};
use crate::contract::Backend;
use crate::error::{Error, Result};

pub fn measure(_p: &op_parity::Params, _b: Backend, _cx: &mut TrialContext<'_>) -> Result<Measurement> {
    Err(Error::CudaUnavailable("not built yet".into()))
}
