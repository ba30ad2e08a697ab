//! [`GpuContext`]: owns the CUDA context, the work stream and a side stream,
//! the cuBLAS handle, the kernel cache and the device facts every report row records.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaGraph, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
    LaunchConfig, ValidAsZeroBits,
};

use super::cache::{CacheStats, CompileRecord, KernelCache, Target, OLDER_ARCH};
use super::disk::EntryHeader;
use crate::error::{Error, Result};
use crate::faults::Faults;
use crate::ops::gemm_tuned::TunedGemms;

/// Whether a CUDA driver library can be loaded on this machine. Never panics.
pub fn driver_present() -> bool {
    library_loads(&["cuda", "nvcuda"])
}

/// Whether the NVRTC library can be loaded on this machine. Never panics.
pub fn nvrtc_present() -> bool {
    library_loads(&["nvrtc"])
}

/// Whether the cuBLAS library can be loaded on this machine. Never panics.
pub fn cublas_present() -> bool {
    library_loads(&["cublas"])
}

/// Whether one of cudarc's file names for a library of `names` loads here.
/// What loads stays loaded for the life of the process, so cudarc's own
/// loader finds it mapped already. cudarc's `is_culib_present` drops its
/// handle, which unmaps the library, and the first real call then maps and
/// relocates it all over again.
fn library_loads(names: &[&str]) -> bool {
    names
        .iter()
        .flat_map(|name| cudarc::get_lib_name_candidates(name))
        .find_map(|file| {
            // SAFETY: loading runs the library's initialisers, which have no
            // preconditions on the caller; these are the files cudarc itself
            // loads, by the same names.
            unsafe { libloading::Library::new(file) }.ok()
        })
        // Forgetting the handle keeps the library mapped; cudarc holds its
        // own handle to it for the life of the process anyway.
        .map(std::mem::forget)
        .is_some()
}

/// Math mode of the cuBLAS GEMMs of one direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GemmMath {
    /// TF32 tensor-op math: 10-bit mantissa products, f32 accumulation.
    #[default]
    Tf32,
    /// Plain IEEE f32 products and accumulation.
    Fp32,
}

/// Which way through a layer a GEMM goes: each direction has its own math.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Direction {
    #[default]
    Forward,
    Backward,
}

/// Options of a [`GpuContext`]. Test-only fault knobs live on the context
/// (see [`GpuContext::with_faults`]), never in environment variables.
#[derive(Debug, Clone)]
pub struct GpuOptions {
    /// Device ordinal.
    pub ordinal: usize,
    /// Math of the forward GEMMs (default TF32: fast, within 2e-3 rel-L2).
    pub forward_math: GemmMath,
    /// Math of the backward GEMMs (default FP32: gradients feed the optimizer).
    pub backward_math: GemmMath,
    /// Where compiled kernel modules are kept between processes (created
    /// when missing); `None` (the default) keeps them in memory only.
    pub kernel_cache_dir: Option<PathBuf>,
    /// Run the bf16 GEMMs whose shape [`crate::ops::gemm_tuned::TUNED`]
    /// names for this device on their pinned cuBLASLt configurations (the
    /// same bits as cuBLAS's own pick, measured faster; the default); false
    /// runs every GEMM on cuBLAS's pick.
    pub tuned_gemms: bool,
}

impl GpuOptions {
    /// The GEMM math of `direction`.
    pub fn math(&self, direction: Direction) -> GemmMath {
        match direction {
            Direction::Forward => self.forward_math,
            Direction::Backward => self.backward_math,
        }
    }
}

impl Default for GpuOptions {
    fn default() -> Self {
        GpuOptions {
            ordinal: 0,
            forward_math: GemmMath::Tf32,
            backward_math: GemmMath::Fp32,
            kernel_cache_dir: None,
            tuned_gemms: true,
        }
    }
}

/// What a report row records about the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceFacts {
    pub name: String,
    /// (major, minor), e.g. (9, 0) for Hopper.
    pub compute_capability: (u32, u32),
    pub sm_count: u32,
    pub total_memory_bytes: usize,
    /// The most shared memory one block may use, dynamic shared memory
    /// opted in to included (232,448 bytes on Hopper).
    pub max_shared_per_block: usize,
    /// As the driver reports it, e.g. "13.0".
    pub driver_version: String,
}

impl DeviceFacts {
    /// `sm_90` style architecture name.
    pub fn sm_arch(&self) -> String {
        format!(
            "sm_{}{}",
            self.compute_capability.0, self.compute_capability.1
        )
    }

    /// `compute_90` style virtual architecture NVRTC compiles for.
    pub fn compute_arch(&self) -> String {
        format!(
            "compute_{}{}",
            self.compute_capability.0, self.compute_capability.1
        )
    }
}

/// Threads per block of the element-wise (1-D, grid-stride) kernels.
pub const THREADS_1D: u32 = 256;

/// Launch configuration of a 1-D grid-stride kernel over `n` elements:
/// `THREADS_1D` threads per block, `ceil(n / THREADS_1D)` blocks capped at
/// `max_blocks` (the kernel's grid-stride loop covers the rest), at least one block.
pub fn launch_config_1d(n: usize, max_blocks: u32) -> LaunchConfig {
    let wanted = n.div_ceil(THREADS_1D as usize).max(1);
    let blocks = u32::try_from(wanted)
        .unwrap_or(u32::MAX)
        .min(max_blocks.max(1));
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (THREADS_1D, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Launch configuration of a row kernel: one block of `threads` threads per row.
pub fn launch_config_rows(rows: usize, threads: u32) -> Result<LaunchConfig> {
    let blocks = u32::try_from(rows.max(1)).map_err(|_| Error::InvalidArgument {
        op: "launch",
        message: format!("{rows} rows exceed the grid limit"),
    })?;
    Ok(LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// `v` as the `int` a kernel takes, or an error naming the op and the dimension.
pub fn to_i32(op: &'static str, what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::InvalidArgument {
        op,
        message: format!("{what} = {v} does not fit the kernel's 32-bit int"),
    })
}

/// One device: its context, its work stream and a side stream, cuBLAS, the
/// kernel cache and its facts.
pub struct GpuContext {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// A second stream for work off the critical path
    /// ([`GpuContext::on_side_stream`]); swapped with `stream` while it runs.
    side: Arc<CudaStream>,
    /// Whether launches went to the side stream since the work stream last
    /// joined it: a stream being captured may wait only for work captured
    /// with it, so a join with nothing new is left out.
    side_pending: bool,
    /// Whether [`GpuContext::on_side_stream`]'s work is running: cuBLAS
    /// refuses then, since its handle is bound to the work stream.
    on_side: bool,
    /// Whether [`GpuContext::capture`]'s work is running: the work stream
    /// is being captured into a graph. Set where the capture begins and
    /// ends, so the pinned GEMMs need not ask the driver at every call.
    capturing: bool,
    /// Created on first use: loading cuBLAS and creating its handle is a
    /// large part of a short process's start, and many never run a GEMM.
    blas: OnceLock<CudaBlas>,
    /// The pinned cuBLASLt GEMMs of this device, made with `blas` when
    /// [`GpuOptions::tuned_gemms`] asks for them (None: none for it).
    tuned: OnceLock<Option<TunedGemms>>,
    cache: KernelCache,
    facts: DeviceFacts,
    options: GpuOptions,
    /// The fault knobs in force; [`Faults::NONE`] outside [`GpuContext::with_faults`].
    faults: Faults,
}

/// A [`GpuContext`] with fault knobs on, from [`GpuContext::with_faults`].
/// Use it as the context; dropping it turns every knob off again, also when
/// the code using it panics.
pub struct FaultScope<'a> {
    gpu: &'a mut GpuContext,
}

impl std::ops::Deref for FaultScope<'_> {
    type Target = GpuContext;
    fn deref(&self) -> &GpuContext {
        self.gpu
    }
}

impl std::ops::DerefMut for FaultScope<'_> {
    fn deref_mut(&mut self) -> &mut GpuContext {
        self.gpu
    }
}

impl Drop for FaultScope<'_> {
    fn drop(&mut self) {
        self.gpu.faults = Faults::NONE;
    }
}

impl GpuContext {
    /// Opens device `options.ordinal`.
    pub fn new(options: GpuOptions) -> Result<Self> {
        if !driver_present() {
            return Err(Error::CudaUnavailable("no CUDA driver".into()));
        }
        let nvrtc_start = super::cache::start_nvrtc();
        let ctx = CudaContext::new(options.ordinal)?;
        // SAFETY: called before any stream exists. Event tracking makes stream
        // capture fail with CUDA_ERROR_STREAM_CAPTURE_ISOLATION; we order work
        // on a single stream ourselves.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        let side = ctx.new_stream()?;
        let (major, minor) = ctx.compute_capability()?;
        let sm_count =
            ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let max_shared = ctx.attribute(
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        )?;
        let mut version = 0i32;
        // SAFETY: cuDriverGetVersion writes one int through a valid pointer.
        unsafe { sys::cuDriverGetVersion(&mut version) }.result()?;
        let facts = DeviceFacts {
            name: ctx.name()?,
            compute_capability: (major as u32, minor as u32),
            sm_count: sm_count as u32,
            total_memory_bytes: ctx.total_mem()?,
            max_shared_per_block: usize::try_from(max_shared).unwrap_or(0),
            driver_version: format!("{}.{}", version / 1000, (version % 1000) / 10),
        };
        Ok(GpuContext {
            ctx,
            stream,
            side,
            side_pending: false,
            on_side: false,
            capturing: false,
            blas: OnceLock::new(),
            tuned: OnceLock::new(),
            cache: KernelCache::new(options.kernel_cache_dir.clone()).with_nvrtc_start(nvrtc_start),
            facts,
            options,
            faults: Faults::NONE,
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

    /// Free and total device memory now, in bytes.
    pub fn memory_bytes(&self) -> Result<(usize, usize)> {
        Ok(self.ctx.mem_get_info()?)
    }

    /// The stream launches go to: the work stream, which every copy and GEMM
    /// is ordered on, or the side stream inside
    /// [`GpuContext::on_side_stream`].
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Captures what `work` queues on the work stream into a CUDA graph
    /// (thread-local capture mode) and returns `work`'s value with the
    /// graph, instantiated and uploaded. The stream leaves capture also when
    /// `work` fails; `work`'s error comes first. Creates the cuBLAS handle
    /// before it begins, since creating it allocates, which capture forbids.
    pub fn capture<T>(
        &mut self,
        work: impl FnOnce(&mut GpuContext) -> Result<T>,
    ) -> Result<(T, CudaGraph)> {
        self.cublas()?;
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        self.capturing = true;
        let out = work(self);
        self.capturing = false;
        let ended = self.stream.end_capture(sys::CUgraphInstantiate_flags(0));
        let out = out?;
        let graph = ended?.ok_or_else(|| Error::InvalidArgument {
            op: "capture",
            message: "stream capture produced no graph".into(),
        })?;
        graph.upload()?;
        Ok((out, graph))
    }

    /// Whether the work stream is being captured by [`GpuContext::capture`].
    pub fn capturing(&self) -> bool {
        self.capturing
    }

    /// Runs `work`'s launches on the side stream, after everything queued on
    /// the work stream so far: they run beside the work stream's later
    /// launches until [`GpuContext::join_side_stream`]. Inside `work`,
    /// [`GpuContext::stream`] is the side stream; cuBLAS stays bound to the
    /// work stream, so `work` runs no GEMMs: [`GpuContext::cublas`] refuses
    /// inside it.
    pub fn on_side_stream<T>(
        &mut self,
        work: impl FnOnce(&mut GpuContext) -> Result<T>,
    ) -> Result<T> {
        self.side.join(&self.stream)?;
        std::mem::swap(&mut self.stream, &mut self.side);
        self.on_side = true;
        let out = work(self);
        self.on_side = false;
        std::mem::swap(&mut self.stream, &mut self.side);
        self.side_pending = true;
        out
    }

    /// Makes the work stream's later launches wait for everything queued on
    /// the side stream so far. A captured graph must end joined.
    pub fn join_side_stream(&mut self) -> Result<()> {
        if self.side_pending {
            self.stream.join(&self.side)?;
            self.side_pending = false;
        }
        Ok(())
    }

    /// The cuBLAS handle, bound to the work stream; created on the first
    /// call. Creating it allocates device memory, which a stream capture
    /// forbids: code that captures calls this before it begins. Refused
    /// inside [`GpuContext::on_side_stream`]: a GEMM there would be ordered
    /// on the work stream, not beside it (and a handle created there would
    /// be bound to the side stream).
    pub fn cublas(&self) -> Result<&CudaBlas> {
        if self.on_side {
            return Err(Error::InvalidArgument {
                op: "cublas",
                message: "a GEMM inside on_side_stream would run on the work stream".into(),
            });
        }
        if let Some(blas) = self.blas.get() {
            return Ok(blas);
        }
        if !cublas_present() {
            return Err(Error::CudaUnavailable("no cuBLAS library".into()));
        }
        let blas = CudaBlas::new(self.stream.clone())?;
        // The pinned GEMMs' plans are made here, not at the first capture
        // that takes them: creating the cuBLASLt handle loads its kernels,
        // which the trainer's pre-warm must do before the weights go up
        // (C-PREWARM-004 saw them loaded mid-training when made later).
        if self.options.tuned_gemms && self.tuned.get().is_none() {
            let tuned = TunedGemms::new(&self.facts.name)?;
            let _ = self.tuned.set(tuned);
        }
        Ok(self.blas.get_or_init(|| blas))
    }

    /// The pinned cuBLASLt GEMMs ([`crate::ops::gemm_tuned`]) for this
    /// device, made with the cuBLAS handle; None before it exists, when the
    /// options turn them off or when none are pinned for this device.
    pub fn tuned_gemms(&self) -> Option<&TunedGemms> {
        self.tuned.get().and_then(Option::as_ref)
    }

    /// The kernel `symbol` of module `module`, loading the module on first
    /// use (from the disk cache, or compiled for the device's own `sm_XY`;
    /// code of any other target is refused with [`Error::TargetMismatch`]).
    /// Records the module as used.
    pub fn function(&mut self, module: &str, symbol: &str) -> Result<CudaFunction> {
        if self.faults.out_of_bounds_write {
            // Once only: the fault is meant to poison this context, not to loop.
            self.faults.out_of_bounds_write = false;
            crate::ops::faults::out_of_bounds_write(self)?;
        }
        let arch = self.compile_arch();
        let target = Target {
            ctx: &self.ctx,
            facts: &self.facts,
            arch: &arch,
            trust_disk: self.faults.disk_entries_trusted,
        };
        self.cache.function(&target, module, symbol)
    }

    /// Loads every module of `modules` the cache does not hold yet (disk
    /// entries are read and NVRTC compiles the rest concurrently).
    pub fn ensure_modules(&mut self, modules: &[&str]) -> Result<()> {
        let arch = self.compile_arch();
        let target = Target {
            ctx: &self.ctx,
            facts: &self.facts,
            arch: &arch,
            trust_disk: self.faults.disk_entries_trusted,
        };
        self.cache.ensure_all(&target, modules)
    }

    /// The directory compiled modules are kept in, if any.
    pub fn kernel_cache_dir(&self) -> Option<&std::path::Path> {
        self.cache.dir()
    }

    /// Keeps compiled modules in `dir` from now on (e.g. a fresh directory,
    /// to measure a cold start); returns the previous directory.
    pub fn set_kernel_cache_dir(&mut self, dir: Option<PathBuf>) -> Option<PathBuf> {
        self.cache.set_dir(dir)
    }

    /// The header (and key) of `module`'s disk entry as this context would
    /// write it: the device's `sm_XY`, this NVRTC, the module's source hash.
    pub fn kernel_entry_header(&mut self, module: &str) -> Result<EntryHeader> {
        let arch = self.facts.sm_arch();
        self.cache.entry_header(module, &arch)
    }

    /// The kernel cache, read-only (stats, compile records, used modules).
    pub fn cache(&self) -> &KernelCache {
        &self.cache
    }

    /// The kernel cache, mutable (pre-warm and the checks use it).
    pub fn cache_mut(&mut self) -> &mut KernelCache {
        &mut self.cache
    }

    /// Compile statistics of the cache.
    pub fn cache_stats(&self) -> &CacheStats {
        self.cache.stats()
    }

    /// Every compilation the cache made since it was last reset.
    pub fn compile_records(&self) -> &[CompileRecord] {
        self.cache.records()
    }

    /// Drops every cached module, the counters and the used set, so a check
    /// starts from a cold cache.
    pub fn reset_cache(&mut self) {
        self.cache.reset();
    }

    /// Turns the knobs of `faults` on until the returned scope is dropped.
    /// What each knob does is documented on [`Faults`]; with none on, the
    /// stack runs exactly as in production.
    pub fn with_faults(&mut self, faults: Faults) -> FaultScope<'_> {
        self.faults = faults;
        FaultScope { gpu: self }
    }

    /// The fault knobs in force now.
    pub fn faults(&self) -> Faults {
        self.faults
    }

    /// Whether launchers may launch a kernel as the programmatic dependent of
    /// the one before it ([`crate::ops::launch::DependentLaunch`]): the device
    /// is a Hopper or later and the modules are built for it, so the kernels'
    /// wait on their predecessor is compiled in (a module built for the older
    /// target of [`Faults::ptx_older_target`] has none).
    pub fn dependent_launch(&self) -> bool {
        self.facts.compute_capability.0 >= 9 && !self.faults.ptx_older_target
    }

    /// The architecture NVRTC compiles for: the device's own `sm_XY` (a
    /// cubin, no driver JIT), or an older virtual one under
    /// [`Faults::ptx_older_target`].
    fn compile_arch(&self) -> String {
        if self.faults.ptx_older_target {
            OLDER_ARCH.to_string()
        } else {
            self.facts.sm_arch()
        }
    }

    /// Copies `data` to a new device buffer.
    pub fn upload<T: DeviceRepr>(&self, data: &[T]) -> Result<CudaSlice<T>> {
        Ok(self.stream.clone_htod(data)?)
    }

    /// Copies a device buffer (or view) back to the host, waiting for the work
    /// stream so every launch before it has finished.
    pub fn download<T: DeviceRepr, S: DevicePtr<T>>(&self, buf: &S) -> Result<Vec<T>> {
        let out = self.stream.clone_dtoh(buf)?;
        self.stream.synchronize()?;
        Ok(out)
    }

    /// A device buffer of `len` zeros.
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, len: usize) -> Result<CudaSlice<T>> {
        Ok(self.stream.alloc_zeros(len)?)
    }

    /// A device buffer of `len` NaNs, so an element a kernel failed to write
    /// is still NaN when it is copied back.
    pub fn poisoned(&self, len: usize) -> Result<CudaSlice<f32>> {
        self.upload(&vec![f32::NAN; len])
    }

    /// [`launch_config_1d`] capped at 32 blocks per SM; one block under the
    /// test-only fault [`Faults::serialised_launch`] (the grid-stride loop
    /// still covers every element).
    pub fn launch_1d(&self, n: usize) -> LaunchConfig {
        self.launch_1d_per_sm(n, 32)
    }

    /// [`launch_config_1d`] capped at `blocks_per_sm` blocks per SM (8: one
    /// full wave of 256-thread blocks); one block under the test-only fault
    /// [`Faults::serialised_launch`].
    pub fn launch_1d_per_sm(&self, n: usize, blocks_per_sm: u32) -> LaunchConfig {
        if self.faults.serialised_launch {
            return launch_config_1d(n, 1);
        }
        launch_config_1d(n, self.facts.sm_count.max(1).saturating_mul(blocks_per_sm))
    }

    /// [`launch_config_rows`]: one block of `threads` threads per row; one
    /// warp per row under the test-only fault [`Faults::serialised_launch`]
    /// (row kernels loop over their row with stride `blockDim.x`).
    pub fn launch_rows(&self, rows: usize, threads: u32) -> Result<LaunchConfig> {
        launch_config_rows(rows, self.block_threads(threads))
    }

    /// `threads` per block, or one warp under the test-only fault
    /// [`Faults::serialised_launch`], for launchers that fix their own grid.
    pub fn block_threads(&self, threads: u32) -> u32 {
        if self.faults.serialised_launch {
            32
        } else {
            threads
        }
    }

    /// Waits until both streams are idle.
    pub fn synchronize(&self) -> Result<()> {
        self.side.synchronize()?;
        Ok(self.stream.synchronize()?)
    }
}
