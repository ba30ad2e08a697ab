//! [`AxpyDevice`]: the subject's own device type — a CUDA context, one work
//! stream, the modules it has loaded, its fault knobs and its own counters.
//!
//! Modules are compiled by NVRTC to PTX for the device's own virtual
//! architecture (`compute_XY`, so the PTX says `.target sm_XY`) and loaded
//! on first use; a pre-warm loads them before any weights are uploaded.

use std::collections::BTreeMap;
use std::sync::Arc;

use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaGraph, CudaModule, CudaSlice, CudaStream, LaunchConfig,
    PushKernelArg,
};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};
use falsify_core::DeviceFacts;

use crate::error::{Error, Result};
use crate::kernels::{blocks_for, ModuleSource, THREADS};

/// The fault knobs of the device: each makes one piece of the subject
/// wrong on purpose, for a mutant self-test. All off outside
/// [`AxpyDevice::with_faults`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    /// `axpy` is launched with `a = 1` whatever it was asked.
    pub axpy_drops_alpha: bool,
    /// The second pass of the sum of squares leaves out the last block's
    /// partial.
    pub sum_drops_last_partial: bool,
}

/// What the subject counts about itself: a second witness beside the
/// driver observer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Modules compiled and loaded.
    pub modules_loaded: u64,
    /// Host synchronisations (each device-to-host read is one).
    pub host_syncs: u64,
    /// Host synchronisations attempted while a stream capture was open.
    pub syncs_inside_capture: u64,
    /// Bytes copied device-to-host.
    pub device_to_host_bytes: u64,
}

/// One CUDA device as the axpy subject uses it.
pub struct AxpyDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    facts: DeviceFacts,
    modules: BTreeMap<&'static str, Arc<CudaModule>>,
    faults: Faults,
    counts: Counts,
    capturing: bool,
}

/// Whether the CUDA driver and NVRTC libraries can be loaded here.
pub fn cuda_present() -> Result<()> {
    // SAFETY: each call only tries to dlopen its library and reports
    // whether that worked; no CUDA state is touched.
    let driver = unsafe { sys::is_culib_present() };
    // SAFETY: as above, for libnvrtc.
    let nvrtc = unsafe { cudarc::nvrtc::sys::is_culib_present() };
    match (driver, nvrtc) {
        (true, true) => Ok(()),
        (false, _) => Err(Error::CudaUnavailable("no CUDA driver library".into())),
        (true, false) => Err(Error::CudaUnavailable("no NVRTC library".into())),
    }
}

impl AxpyDevice {
    /// Opens device `ordinal`: its primary context and a work stream.
    pub fn open(ordinal: usize) -> Result<Self> {
        cuda_present()?;
        let ctx = CudaContext::new(ordinal)?;
        // SAFETY: called before any stream or allocation exists. Event
        // tracking would record events inside a stream capture; all work
        // here is ordered on one stream.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        let (major, minor) = ctx.compute_capability()?;
        let sm_count =
            ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
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
        Ok(AxpyDevice {
            ctx,
            stream,
            facts,
            modules: BTreeMap::new(),
            faults: Faults::default(),
            counts: Counts::default(),
            capturing: false,
        })
    }

    pub fn facts(&self) -> &DeviceFacts {
        &self.facts
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Free and total device memory now, in bytes.
    pub fn free_memory(&self) -> Result<(u64, u64)> {
        let (free, total) = self.ctx.mem_get_info()?;
        Ok((free as u64, total as u64))
    }

    /// The one stream every copy and launch is ordered on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The fault knobs in force.
    pub fn faults(&self) -> Faults {
        self.faults
    }

    /// What the subject counted so far.
    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// The device with `faults` on: dropping the scope turns them all off
    /// again, also when the code using it returns early or panics.
    pub fn with_faults(&mut self, faults: Faults) -> FaultScope<'_> {
        self.faults = faults;
        FaultScope { device: self }
    }

    /// The virtual architecture NVRTC compiles for, e.g. `compute_90`.
    pub fn compute_arch(&self) -> String {
        let (major, minor) = self.facts.compute_capability;
        format!("compute_{major}{minor}")
    }

    /// Whether `module` is loaded.
    pub fn is_loaded(&self, module: &ModuleSource) -> bool {
        self.modules.contains_key(module.name)
    }

    /// Compiles `module` for this device's `compute_XY` and loads it,
    /// unless it is loaded already.
    pub fn load(&mut self, module: &ModuleSource) -> Result<Arc<CudaModule>> {
        if let Some(m) = self.modules.get(module.name) {
            return Ok(m.clone());
        }
        let arch = self.compute_arch();
        let ptx = compile(module, &arch)?;
        let loaded = self.ctx.load_module(ptx)?;
        log::debug!("module `{}` compiled for {arch} and loaded", module.name);
        self.counts.modules_loaded += 1;
        self.modules.insert(module.name, loaded.clone());
        Ok(loaded)
    }

    /// The kernel `kernel` of `module`, loading the module on first use.
    pub fn kernel(&mut self, module: &ModuleSource, kernel: &'static str) -> Result<CudaFunction> {
        if !module.kernels.contains(&kernel) {
            return Err(Error::NoSuchKernel {
                module: module.name,
                kernel,
            });
        }
        Ok(self.load(module)?.load_function(kernel)?)
    }

    /// Copies `host` to a new device buffer.
    pub fn upload(&self, host: &[f32]) -> Result<CudaSlice<f32>> {
        Ok(self.stream.clone_htod(host)?)
    }

    /// Copies `buffer` to the host and waits for it: one host
    /// synchronisation, counted.
    pub fn download(&mut self, buffer: &CudaSlice<f32>) -> Result<Vec<f32>> {
        self.counts.host_syncs += 1;
        if self.capturing {
            self.counts.syncs_inside_capture += 1;
        }
        let host = self.stream.clone_dtoh(buffer)?;
        self.stream.synchronize()?;
        self.counts.device_to_host_bytes += (host.len() * std::mem::size_of::<f32>()) as u64;
        Ok(host)
    }

    /// Captures what `record` queues on the stream into a graph and
    /// instantiates it. The stream leaves capture mode whatever `record`
    /// does.
    pub fn capture(&mut self, record: impl FnOnce(&mut Self) -> Result<()>) -> Result<CudaGraph> {
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        self.capturing = true;
        let recorded = record(self);
        self.capturing = false;
        let ended = self.stream.end_capture(sys::CUgraphInstantiate_flags(0));
        recorded?;
        ended?.ok_or(Error::NoGraph)
    }

    /// Launches `out = a*x + y` over `n` elements (the fault knob
    /// `axpy_drops_alpha` launches it with `a = 1`).
    pub fn axpy(
        &mut self,
        n: usize,
        a: f32,
        x: &CudaSlice<f32>,
        y: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let f = self.kernel(&crate::kernels::AXPY, "axpy")?;
        let a = if self.faults.axpy_drops_alpha { 1.0 } else { a };
        let n_arg = kernel_int(n)?;
        check_len(n, &[x.len(), y.len(), out.len()])?;
        let mut launch = self.stream.launch_builder(&f);
        launch.arg(&n_arg).arg(&a).arg(x).arg(y).arg(out);
        // SAFETY: `axpy(int, float, const float*, const float*, float*)`
        // reads x[0..n], y[0..n] and writes out[0..n]; every buffer holds at
        // least n elements (checked above).
        unsafe { launch.launch(grid(blocks_for(n))) }?;
        Ok(())
    }

    /// Launches both passes of `out[0] = sum(x[i]^2)` over `n` elements;
    /// `partial` holds one float per block of the first pass (the fault
    /// knob `sum_drops_last_partial` leaves the last one out).
    pub fn sum_squares(
        &mut self,
        n: usize,
        x: &CudaSlice<f32>,
        partial: &mut CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let first = self.kernel(&crate::kernels::AXPY, "sum_squares_partial")?;
        let second = self.kernel(&crate::kernels::AXPY, "sum_partials")?;
        let blocks = blocks_for(n);
        check_len(n, &[x.len()])?;
        check_len(blocks as usize, &[partial.len()])?;
        check_len(1, &[out.len()])?;
        let n_arg = kernel_int(n)?;
        let mut launch = self.stream.launch_builder(&first);
        launch.arg(&n_arg).arg(x).arg(&mut *partial);
        // SAFETY: reads x[0..n], writes partial[0..blocks]; lengths checked above.
        unsafe { launch.launch(grid(blocks)) }?;
        let m = if self.faults.sum_drops_last_partial {
            blocks as i32 - 1
        } else {
            blocks as i32
        };
        let mut launch = self.stream.launch_builder(&second);
        launch.arg(&m).arg(&*partial).arg(out);
        // SAFETY: reads partial[0..m] (m <= blocks), writes out[0]; lengths checked above.
        unsafe { launch.launch(grid(1)) }?;
        Ok(())
    }
}

/// [`AxpyDevice`] with fault knobs on, from [`AxpyDevice::with_faults`].
pub struct FaultScope<'a> {
    device: &'a mut AxpyDevice,
}

impl std::ops::Deref for FaultScope<'_> {
    type Target = AxpyDevice;
    fn deref(&self) -> &AxpyDevice {
        self.device
    }
}

impl std::ops::DerefMut for FaultScope<'_> {
    fn deref_mut(&mut self) -> &mut AxpyDevice {
        self.device
    }
}

impl Drop for FaultScope<'_> {
    fn drop(&mut self) {
        self.device.faults = Faults::default();
    }
}

/// Compiles `module` with NVRTC to PTX for the virtual architecture `arch`
/// (e.g. `compute_90`, whose PTX says `.target sm_90`).
pub fn compile(module: &ModuleSource, arch: &str) -> Result<Ptx> {
    let options = CompileOptions {
        options: vec![format!("--gpu-architecture={arch}")],
        ..Default::default()
    };
    compile_ptx_with_opts(module.source, options).map_err(|e| Error::Compile {
        module: module.name,
        arch: arch.to_string(),
        log: e.to_string(),
    })
}

/// `blocks` blocks of [`THREADS`] threads.
pub fn grid(blocks: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// `n` as a kernel's `int`.
pub fn kernel_int(n: usize) -> Result<i32> {
    i32::try_from(n)
        .map_err(|_| Error::InvalidArgument(format!("{n} elements exceed a kernel's int")))
}

/// Refuses a launch over `n` elements when a buffer is shorter.
pub fn check_len(n: usize, lens: &[usize]) -> Result<()> {
    match lens.iter().find(|&&len| len < n) {
        Some(len) => Err(Error::InvalidArgument(format!(
            "a buffer of {len} elements for a launch over {n}"
        ))),
        None => Ok(()),
    }
}
