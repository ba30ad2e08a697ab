//! Launchers for `kernels/faults.cu`: a deliberate illegal-address fault,
//! for [`crate::Faults::out_of_bounds_write`].

use cudarc::driver::{LaunchConfig, PushKernelArg};

use crate::error::Result;
use crate::gpu::GpuContext;
use crate::kernels::abi::{Arg, Signatures};

pub const MODULE: &str = "faults";

pub const SIGNATURES: Signatures = &[("fault_oob_write_f32", &[Arg::Ptr, Arg::I64])];

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
