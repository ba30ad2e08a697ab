//! # falsify-axpy
//!
//! An example subject of falsify, written the way a team with its own CUDA
//! stack would write one: it depends on `falsify-core` only.
//!
//! - [`kernels`]: a small kernel family (axpy, a two-pass sum of squares,
//!   an SGD line fit), CUDA C compiled by NVRTC for the device's own
//!   `compute_XY`;
//! - [`device`]: its device type (context, stream, loaded modules, fault
//!   knobs, its own counters);
//! - [`oracle`]: the CPU oracle, in f64;
//! - [`check`]: its kinds (`kernel_parity` on cuda, `axpy_linearity` on
//!   cpu);
//! - [`mutant`]: its named faults;
//! - [`workload`]: the training loop the core's driver-observed kinds drive.
//!
//! [`Axpy`] ties them together as a [`Subject`]; `tests/contracts.rs` runs
//! `contracts/` through `falsify_core::harness!{}`.

pub mod check;
pub mod device;
pub mod error;
pub mod kernels;
pub mod mutant;
pub mod oracle;
pub mod workload;

use falsify_core::{BasicOptions, DeviceFacts, Subject, Workload};

pub use error::{Error, Result};

/// The axpy kernel family as a subject of the harness.
#[derive(Debug, Clone, Copy, Default)]
pub struct Axpy;

impl Subject for Axpy {
    const NAME: &'static str = "axpy";
    type Device = device::AxpyDevice;
    type Kinds = check::AxpyKinds;
    type Mutant = mutant::Mutant;
    type Options = BasicOptions;
    type Error = Error;

    fn open_device(options: &BasicOptions) -> Result<device::AxpyDevice> {
        device::AxpyDevice::open(options.ordinal)
    }

    fn device_facts(device: &device::AxpyDevice) -> DeviceFacts {
        device.facts().clone()
    }

    fn free_memory(device: &device::AxpyDevice) -> Result<(u64, u64)> {
        device.free_memory()
    }

    /// After a sticky fault the stream no longer synchronises.
    fn check_health(device: &mut device::AxpyDevice) -> Result<()> {
        device.stream().synchronize()?;
        device.context().check_err()?;
        Ok(())
    }

    fn workload() -> Option<&'static dyn Workload<Self>> {
        Some(&workload::LineFit)
    }
}
