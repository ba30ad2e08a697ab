//! Launchers for `kernels/faults.cu`: a deliberate illegal-address fault,
//! for [`crate::Faults::out_of_bounds_write`], and the rounding of f32
//! tensors to bf16 in place, for [`crate::Faults::lora_weights_bf16`].

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::gemm::to_i64;
use crate::error::Result;
use crate::gpu::GpuContext;
use crate::kernels::abi::{Arg, Signatures};

pub const MODULE: &str = "faults";

pub const SIGNATURES: Signatures = &[
    ("fault_oob_write_f32", &[Arg::Ptr, Arg::I64]),
    ("fault_round_bf16_f32", &[Arg::Ptr, Arg::I64]),
];

/// `x_i = f32(bf16(x_i))` in place (nearest, ties to even): what keeping `x`
/// in bf16 would leave of it.
pub fn round_to_bf16(gpu: &mut GpuContext, x: &mut CudaSlice<f32>) -> Result<()> {
    let n = to_i64("fault_round_bf16_f32", x.len())?;
    let cfg = gpu.launch_1d(x.len());
    let func = gpu.function(MODULE, "fault_round_bf16_f32")?;
    let mut launch = gpu.stream().launch_builder(&func);
    launch.arg(x).arg(&n);
    // SAFETY: `fault_round_bf16_f32(float* x, long long n)` gets an f32
    // device buffer and its length; its grid-stride loop touches only
    // indices below n.
    unsafe { launch.launch(cfg) }?;
    Ok(())
}

/// Launches a kernel that stores far outside a one-element buffer, then waits
/// for it, so the illegal-address fault surfaces here as a driver error. After
/// this the CUDA context is unusable; the engine replaces it.
pub fn out_of_bounds_write(gpu: &mut GpuContext) -> Result<()> {
    let func = gpu.function(MODULE, "fault_oob_write_f32")?;
    let mut buf = gpu.zeros::<f32>(1)?;
    let n: u64 = 1;
    let stream = gpu.stream().clone();
    let mut launch = stream.launch_builder(&func);
    launch.arg(&mut buf).arg(&n);
    // SAFETY: `fault_oob_write_f32(float* out, unsigned long long n)` gets a
    // device buffer and a u64, matching its signature. The store it makes is
    // out of bounds on purpose: the fault is the point of this launcher, and
    // the driver contains it to this context, which the caller then discards.
    unsafe { launch.launch(LaunchConfig::for_num_elems(1)) }?;
    stream.synchronize()?;
    Ok(())
}
