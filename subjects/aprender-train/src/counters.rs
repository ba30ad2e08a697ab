//! aprender-gpu's own counters: the subject's second witness beside the
//! driver observer.
//!
//! `trueno_gpu::driver::device_to_host_bytes_total()` and
//! `device_allocs_total()` (G:driver/memory/buffer.rs:89-113, re-exported
//! G:driver/mod.rs:130-133) are monotonic and **per thread**: they count the
//! `GpuBuffer` copies device→host (every one of them: G:driver/memory/transfer.rs:205-206,
//! 291-298, 386-387) and the `GpuBuffer` allocations (buffer.rs:354, 390) made
//! by the calling thread. A region is measured by differencing two readings
//! on the thread that does the work. They do not see cuBLAS's own
//! allocations or copies, nor host syncs without a copy.

use trueno_gpu::driver::{device_allocs_total, device_to_host_bytes_total};

use crate::error::Result;
use crate::model::Setup;

/// One reading of (or a difference between two readings of) the counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuCounters {
    /// Bytes copied device→host through `GpuBuffer`.
    pub device_to_host_bytes: u64,
    /// Device allocations made through `GpuBuffer`.
    pub device_allocs: u64,
}

impl GpuCounters {
    /// The calling thread's totals now.
    pub fn now() -> Self {
        Self {
            device_to_host_bytes: device_to_host_bytes_total(),
            device_allocs: device_allocs_total(),
        }
    }

    /// What happened between `earlier` and `self` (both from one thread).
    pub fn since(self, earlier: Self) -> Self {
        Self {
            device_to_host_bytes: self
                .device_to_host_bytes
                .saturating_sub(earlier.device_to_host_bytes),
            device_allocs: self.device_allocs.saturating_sub(earlier.device_allocs),
        }
    }
}

/// What a session counted: during `InstructPipeline::new`, and during each
/// `train_step` call (a step runs `batch` of them, in order).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnCounters {
    pub prepare: GpuCounters,
    pub per_train_step: Vec<GpuCounters>,
}

/// Device→host bytes one GPU-resident `train_step` needs by construction:
/// the fused cross-entropy's loss partials, `4 · seq_len`
/// (T:autograd/cuda_optim.rs:906-914). Nothing else in the step reads back:
/// the clip computes its scale on the device (T:finetune/fused_lora_clip.rs:73-124).
pub fn loss_readback_bytes(setup: &Setup) -> Result<u64> {
    Ok(4 * setup.resolve()?.seq_len as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_difference_counts_only_what_happened_between() {
        let earlier = GpuCounters {
            device_to_host_bytes: 100,
            device_allocs: 7,
        };
        let later = GpuCounters {
            device_to_host_bytes: 1124,
            device_allocs: 9,
        };
        let delta = later.since(earlier);
        assert_eq!((delta.device_to_host_bytes, delta.device_allocs), (1024, 2));
        assert_eq!(earlier.since(later), GpuCounters::default());
    }

    #[test]
    fn the_counters_read_without_a_device() {
        // Thread-local totals: no GpuBuffer copy on this thread, so no change.
        let first = GpuCounters::now();
        assert_eq!(GpuCounters::now().since(first), GpuCounters::default());
    }

    #[test]
    fn the_loss_readback_is_four_bytes_per_position() {
        assert_eq!(
            loss_readback_bytes(&Setup::new("qwen2-tiny-4l")).unwrap(),
            1024
        );
    }
}
