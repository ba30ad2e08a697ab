//! Launch helpers shared by the launchers: length checks, element-count
//! limits and the launch shapes of row and float4 kernels.

use std::ffi::c_void;

use cudarc::driver::{result, sys, CudaFunction, DevicePtr, DevicePtrMut, LaunchConfig};

use crate::error::{Error, Result};
use crate::gpu::GpuContext;

/// A launch of a kernel as the *programmatic dependent* of the kernel before
/// it on the stream (Hopper's programmatic dependent launch): the driver may
/// start it while its predecessor is still running, so its launch latency
/// hides behind the predecessor's tail; the kernel calls
/// `wait_for_predecessor()` (kernels/common.cuh) before it reads anything the
/// predecessor wrote. In a captured graph the dependency becomes a
/// programmatic edge. Where the device or the module's build cannot do it
/// (before compute capability 9.0, or a module built for an older target),
/// this is an ordinary launch, in stream order.
///
/// For a kernel that is a programmatic dependent in some builds only, the
/// launcher pushes one argument list and calls
/// [`DependentLaunch::launch_in_order`] for the other builds.
///
/// cudarc's launch builder cannot pass launch attributes, so this one holds
/// the kernel's arguments itself: each in an 8-byte slot, in its native byte
/// order at the slot's start, the kernel given a pointer to each slot.
pub struct DependentLaunch<'a> {
    gpu: &'a GpuContext,
    func: &'a CudaFunction,
    slots: Vec<[u8; 8]>,
}

impl<'a> DependentLaunch<'a> {
    pub fn new(gpu: &'a GpuContext, func: &'a CudaFunction) -> Self {
        DependentLaunch {
            gpu,
            func,
            slots: Vec::new(),
        }
    }

    fn push(&mut self, bytes: &[u8]) -> &mut Self {
        let mut slot = [0u8; 8];
        slot[..bytes.len()].copy_from_slice(bytes);
        self.slots.push(slot);
        self
    }

    /// A device buffer the kernel reads, as its address.
    pub fn buf<T>(&mut self, b: &impl DevicePtr<T>) -> &mut Self {
        // Event tracking is off on the context's stream (gpu/context.rs), so
        // the guard records nothing; stream order orders the accesses.
        let (ptr, _sync) = b.device_ptr(self.gpu.stream());
        self.push(&ptr.to_ne_bytes())
    }

    /// A device buffer the kernel writes, as its address.
    pub fn buf_mut<T>(&mut self, b: &mut impl DevicePtrMut<T>) -> &mut Self {
        let (ptr, _sync) = b.device_ptr_mut(self.gpu.stream());
        self.push(&ptr.to_ne_bytes())
    }

    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.push(&v.to_ne_bytes())
    }

    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.push(&v.to_ne_bytes())
    }

    pub fn f32(&mut self, v: f32) -> &mut Self {
        self.push(&v.to_ne_bytes())
    }

    /// Launches with `cfg`.
    ///
    /// # Safety
    /// As cudarc's `LaunchArgs::launch`: the arguments pushed match the
    /// kernel's parameters in number, order and type (pointers as `buf`,
    /// `int` as `i32`, `long long` as `i64`, `float` as `f32`), every buffer
    /// outlives the work, and the kernel's accesses stay in bounds. And the
    /// kernel calls `wait_for_predecessor()` before it touches memory the
    /// kernel before it on the stream may write. What it reads before that
    /// wait, the kernels earlier still must have finished writing: they
    /// have when the kernel before it waited for its own predecessor before
    /// it let this one start (at its end, or by `let_dependent_start()`).
    pub unsafe fn launch(&mut self, cfg: LaunchConfig) -> Result<()> {
        if !self.gpu.dependent_launch() {
            // SAFETY: the caller's contract.
            return unsafe { self.launch_in_order(cfg) };
        }
        let mut params = self.params();
        let stream = self.gpu.stream().cu_stream();
        let f = self.func.cu_function();
        // SAFETY: a zeroed attribute is a valid C struct; id and value set below.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: stream,
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: config, attr and params outlive the call (the driver copies
        // the arguments at launch); the rest is the caller's contract.
        unsafe { sys::cuLaunchKernelEx(&config, f, params.as_mut_ptr(), std::ptr::null_mut()) }
            .result()?;
        Ok(())
    }

    /// Launches with `cfg` as an ordinary launch, in stream order: for a
    /// kernel that does not wait for its predecessor, whose launcher holds
    /// its arguments here to keep one argument list for both ways.
    ///
    /// # Safety
    /// As cudarc's `LaunchArgs::launch`: the arguments pushed match the
    /// kernel's parameters in number, order and type, every buffer outlives
    /// the work, and the kernel's accesses stay in bounds.
    pub unsafe fn launch_in_order(&mut self, cfg: LaunchConfig) -> Result<()> {
        let mut params = self.params();
        // SAFETY: the caller's contract; params point at live slots.
        unsafe {
            result::launch_kernel(
                self.func.cu_function(),
                cfg.grid_dim,
                cfg.block_dim,
                cfg.shared_mem_bytes,
                self.gpu.stream().cu_stream(),
                &mut params,
            )
        }?;
        Ok(())
    }

    /// A pointer to each argument's slot, as the driver takes them.
    fn params(&mut self) -> Vec<*mut c_void> {
        self.slots
            .iter_mut()
            .map(|s| s.as_mut_ptr().cast::<c_void>())
            .collect()
    }
}

/// Checks that a buffer of `got` elements holds `prod(dims)` of them.
pub fn expect_len(op: &'static str, what: &str, got: usize, dims: &[usize]) -> Result<()> {
    let expected: usize = dims.iter().product();
    if got == expected {
        Ok(())
    } else {
        let dims_text: Vec<String> = dims.iter().map(usize::to_string).collect();
        Err(Error::ShapeMismatch {
            op,
            expected: format!("{what}: [{}] = {expected} elements", dims_text.join(", ")),
            got: format!("{got} elements"),
        })
    }
}

/// Threads per block of a row kernel over `cols` columns: a multiple of 32,
/// at least 32, at most `max`.
pub fn row_threads(cols: usize, max: u32) -> u32 {
    let want = cols.div_ceil(32).saturating_mul(32).max(32);
    u32::try_from(want).unwrap_or(max).min(max)
}

/// Largest element count of a grid-stride kernel: with `n <= 2^30` and a grid
/// of at most `2^30` threads, `k + stride` never overflows the kernel's `int`.
pub const MAX_ELEMENTS: usize = 1 << 30;

/// A float4 kernel's launch over `n` elements: the count it writes (fewer
/// only under the "last element unwritten" fault) as its `int n`, and one
/// thread per four elements; `None` when nothing is to be written.
pub fn vec4_launch(
    gpu: &GpuContext,
    op: &'static str,
    n: usize,
) -> Result<Option<(i32, LaunchConfig)>> {
    packed_launch(gpu, op, n, 4)
}

/// [`vec4_launch`] for a kernel that takes `pack` elements a thread.
pub fn packed_launch(
    gpu: &GpuContext,
    op: &'static str,
    n: usize,
    pack: usize,
) -> Result<Option<(i32, LaunchConfig)>> {
    match gpu.faults().written(n) {
        0 => Ok(None),
        w => Ok(Some((
            elements(op, w)?,
            gpu.launch_1d(w.div_ceil(pack.max(1))),
        ))),
    }
}

/// `n` as the kernel's `int` element count, or an error above [`MAX_ELEMENTS`].
pub fn elements(op: &'static str, n: usize) -> Result<i32> {
    if n > MAX_ELEMENTS {
        return Err(Error::InvalidArgument {
            op,
            message: format!("{n} elements exceed the kernel limit of {MAX_ELEMENTS}"),
        });
    }
    crate::gpu::to_i32(op, "elements", n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_threads_are_whole_warps_within_the_cap() {
        assert_eq!(row_threads(1, 256), 32);
        assert_eq!(row_threads(33, 256), 64);
        assert_eq!(row_threads(151_936, 1024), 1024);
    }

    #[test]
    fn lengths_and_element_limits_are_refused_by_name() {
        assert!(expect_len("op", "x", 6, &[2, 3]).is_ok());
        let e = expect_len("op", "x", 5, &[2, 3]).unwrap_err().to_string();
        assert!(
            e.contains("[2, 3] = 6 elements") && e.contains("5 elements"),
            "{e}"
        );
        assert!(elements("op", MAX_ELEMENTS + 1).is_err());
        assert_eq!(elements("op", 7).ok(), Some(7));
    }
}
