//! Host-to-device uploads through reused page-locked staging buffers.
//!
//! Copying a fresh host `Vec` up pays twice: the kernel's page faults while
//! the host first writes the vector, and the driver's own copy of pageable
//! memory into page-locked memory before the DMA. A [`Stager`] holds two
//! page-locked buffers for the whole of an upload of many tensors: the host
//! writes each chunk of a tensor straight into one of them, on all cores,
//! while the device copies the chunk before it out of the other.

use bytemuck::Pod;
use cudarc::driver::{sys, CudaEvent, CudaSlice, DeviceRepr, PinnedHostSlice, ValidAsZeroBits};
use rayon::prelude::*;

use super::context::GpuContext;
use crate::error::Result;

/// Bytes of one staging buffer: a tensor of a few tens of MB (a projection
/// of the presets we train) is a few chunks, so its copy overlaps its fill.
const STAGE_BYTES: usize = 8 << 20;

/// Bytes one task fills at a time.
const FILL_BYTES: usize = 256 << 10;

/// Tensors of at most this many bytes go up as a plain copy of a host
/// vector: a small model then never pays for page-locking the buffers.
const DIRECT_BYTES: usize = 2 << 20;

/// Two page-locked buffers and the copy last queued from each.
#[derive(Default)]
pub struct Stager {
    buffers: Vec<PinnedHostSlice<u8>>,
    copied: [Option<CudaEvent>; 2],
}

impl Stager {
    /// A stager that allocates its buffers on its first upload.
    pub fn new() -> Self {
        Self::default()
    }

    /// A device buffer of `len` values: `fill(start, out)` writes values
    /// `start..start + out.len()` into `out`, in ranges filled on all
    /// cores. Returns once every copy has finished, so the buffers are free
    /// and the device buffer complete.
    pub fn upload<T, F>(&mut self, gpu: &GpuContext, len: usize, fill: F) -> Result<CudaSlice<T>>
    where
        T: Pod + DeviceRepr + ValidAsZeroBits + Send,
        F: Fn(usize, &mut [T]) + Sync,
    {
        let size = std::mem::size_of::<T>().max(1);
        let per_task = (FILL_BYTES / size).max(1);
        if len * size <= DIRECT_BYTES {
            let mut host = vec![T::zeroed(); len];
            host.par_chunks_mut(per_task)
                .enumerate()
                .for_each(|(task, out)| fill(task * per_task, out));
            return gpu.upload(&host);
        }
        // SAFETY: the chunks below copy into every element of `0..len`
        // before the buffer is returned; on an error it is dropped unread.
        // So no uninitialised element is ever read (zeroing it first would
        // write the whole buffer twice).
        let mut dst = unsafe { gpu.stream().alloc::<T>(len) }?;
        self.allocate(gpu)?;
        let per_stage = STAGE_BYTES / size;
        for (k, start) in (0..len).step_by(per_stage).enumerate() {
            let n = per_stage.min(len - start);
            let slot = k % 2;
            // The copy queued from this buffer two chunks ago must be done
            // before the host writes it again.
            if let Some(done) = self.copied[slot].take() {
                done.synchronize()?;
            }
            let bytes = &mut self.buffers[slot].as_mut_slice()?[..n * std::mem::size_of::<T>()];
            let host: &mut [T] = bytemuck::cast_slice_mut(bytes);
            host.par_chunks_mut(per_task)
                .enumerate()
                .for_each(|(task, out)| fill(start + task * per_task, out));
            gpu.stream()
                .memcpy_htod(&*host, &mut dst.slice_mut(start..start + n))?;
            self.copied[slot] = Some(
                gpu.stream()
                    .record_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))?,
            );
        }
        for done in self.copied.iter_mut().filter_map(Option::take) {
            done.synchronize()?;
        }
        Ok(dst)
    }

    /// The two buffers, zero-filled, once.
    fn allocate(&mut self, gpu: &GpuContext) -> Result<()> {
        while self.buffers.len() < 2 {
            // SAFETY: the bytes are page-locked host memory the driver just
            // allocated, not yet initialised; they are all written (zeros)
            // here before anything reads or copies them, and any byte
            // pattern is a valid u8.
            let mut buffer = unsafe { gpu.context().alloc_pinned::<u8>(STAGE_BYTES) }?;
            buffer.as_mut_slice()?.fill(0);
            self.buffers.push(buffer);
        }
        Ok(())
    }
}
