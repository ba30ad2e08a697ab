//! Execution of the training checks on each backend.

use crate::check::{
    loss_descent, memory_budget, sync_count, throughput_ratio, trajectory_match, Measurement,
    TrialContext,
};
use crate::contract::Backend;
use crate::error::{Error, Result};

pub fn loss_descent(_p: &loss_descent::Params, _b: Backend, _cx: &mut TrialContext<'_>) -> Result<Measurement> {
    Err(Error::CudaUnavailable("not built yet".into()))
}

pub fn trajectory_match(_p: &trajectory_match::Params, _b: Backend, _cx: &mut TrialContext<'_>) -> Result<Measurement> {
    Err(Error::CudaUnavailable("not built yet".into()))
}

pub fn sync_count(_p: &sync_count::Params, _cx: &mut TrialContext<'_>) -> Result<Measurement> {
    Err(Error::CudaUnavailable("not built yet".into()))
}

pub fn throughput_ratio(_p: &throughput_ratio::Params, _cx: &mut TrialContext<'_>) -> Result<Measurement> {
    Err(Error::CudaUnavailable("not built yet".into()))
}

pub fn memory_budget(_p: &memory_budget::Params, _cx: &mut TrialContext<'_>) -> Result<Measurement> {
    Err(Error::CudaUnavailable("not built yet".into()))
}
