//! [`GpuContext`]: owns the CUDA context, the work stream and the device facts
//! every report row records.

use std::sync::Arc;

use cudarc::driver::{sys, CudaContext, CudaStream};

use crate::error::{Error, Result};

/// Whether a CUDA driver library can be loaded on this machine. Never panics.
pub fn driver_present() -> bool {
    // SAFETY: `is_culib_present` only tries to dlopen the driver library and
    // reports whether that worked; it touches no CUDA state.
    unsafe { sys::is_culib_present() }
}

/// Options of a [`GpuContext`]. Test-only fault injection lives here too, never
/// in environment variables.
#[derive(Debug, Clone, Default)]
pub struct GpuOptions {
    /// Device ordinal.
    pub ordinal: usize,
}

/// What a report row records about the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceFacts {
    pub name: String,
    /// (major, minor), e.g. (9, 0) for Hopper.
    pub compute_capability: (u32, u32),
    pub sm_count: u32,
    pub total_memory_bytes: usize,
    /// As the driver reports it, e.g. "13.0".
    pub driver_version: String,
}

impl DeviceFacts {
    /// `sm_90` style architecture name.
    pub fn sm_arch(&self) -> String {
        format!("sm_{}{}", self.compute_capability.0, self.compute_capability.1)
    }
}

/// One device: its context, one work stream and its facts.
pub struct GpuContext {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    facts: DeviceFacts,
    options: GpuOptions,
}

impl GpuContext {
    /// Opens device `options.ordinal`.
    pub fn new(options: GpuOptions) -> Result<Self> {
        if !driver_present() {
            return Err(Error::CudaUnavailable("no CUDA driver".into()));
        }
        let ctx = CudaContext::new(options.ordinal)?;
        // SAFETY: called before any stream exists. Event tracking makes stream
        // capture fail with CUDA_ERROR_STREAM_CAPTURE_ISOLATION; we order work
        // on a single stream ourselves.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        let (major, minor) = ctx.compute_capability()?;
        let sm_count = ctx.attribute(
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )?;
        let mut version = 0i32;
        // SAFETY: cuDriverGetVersion writes one int through a valid pointer.
        unsafe { sys::cuDriverGetVersion(&mut version) }.result()?;
        let facts = DeviceFacts {
            name: ctx.name()?,
            compute_capability: (major as u32, minor as u32),
            sm_count: sm_count as u32,
            total_memory_bytes: ctx.total_mem()?,
            driver_version: format!("{}.{}", version / 1000, (version % 1000) / 10),
        };
        Ok(GpuContext {
            ctx,
            stream,
            facts,
            options,
        })
    }

    pub fn facts(&self) -> &DeviceFacts {
        &self.facts
    }

    pub fn options(&self) -> &GpuOptions {
        &self.options
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}
