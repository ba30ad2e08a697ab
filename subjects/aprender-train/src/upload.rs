//! The host-to-device bytes of aprender-train's weight upload, from the
//! configuration alone.
//!
//! # What is counted, and why the point lands at the end of the layers
//!
//! The observer's upload point is the host-to-device copy at which the bytes
//! copied since the start of the trial's region first reach
//! [`upload_bytes`]. `InstructPipeline::new` runs, in this order
//! (T:finetune/instruct_pipeline/cuda_init.rs): the VRAM guard (`nvidia-smi`
//! only, :30), `CudaTrainer::new` (context, stream, the three kernel caches
//! and two cuBLAS handles, T:autograd/cuda_training.rs:61-85), the four
//! pre-warms (:133-192; they only compile, no buffer and no copy:
//! T:autograd/cuda_forward/cache.rs:200-460, 591-651, 725-804,
//! T:autograd/cuda_backward/cache.rs:160-328, T:autograd/cuda_optim.rs:111-162),
//! then one `CudaNf4TransformerBlock::new` per layer (:194-353). aprender-train
//! issues no host-to-device copy before the first layer's first norm:
//! every one of its synchronous uploads is `GpuBuffer::from_host`, whose
//! only copy is `cuMemcpyHtoD_v2` (G:driver/memory/transfer.rs:78-103), and
//! none is called before the layers. So [`upload_bytes`] counts exactly
//! the layers' copies, and the point falls on the last layer's last copy
//! (its replicated V bias), right before `[CUDA] Uploaded N transformer
//! layers` (cuda_init.rs:355). What follows is not weights: scratch and
//! zero-filled buffers, the final norm and the embedding table
//! (cuda_init.rs:369-547); aprender-train's own contract names the block
//! upload as the line pre-warm must precede (C-PREWARM-001,
//! T:autograd/cuda_forward/cache.rs:190-194).
//!
//! One copy this cannot see: whatever cuBLAS does inside `cublasCreate`
//! (`CudaTrainer::new`, before the layers). If the driver reports
//! host-to-device bytes there, the point moves earlier by that much.

use crate::error::Result;
use crate::model::{Resolved, Setup, LORA_RANK};

/// Bytes per `f32`.
const F32: u64 = 4;

/// The host-to-device bytes of one NF4 layer's upload, term by term, in
/// upload order (T:transformer/cuda_block.rs:2924-3097).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerUpload {
    /// `input_norm` and `post_attn_norm`, fp32: 2 · 4h (cuda_block.rs:2924-2925).
    pub norms: u64,
    /// Packed NF4 codes, two per byte: Σ E/2 over the seven projections
    /// (cuda_block.rs:2943-2944, 2950-2961; G:kernels/quantize/nf4_cpu.rs:134,151).
    pub nf4_codes: u64,
    /// One fp32 absmax per 64-element block: Σ 4·E/64 = Σ E/16
    /// (cuda_block.rs:2945; nf4_cpu.rs:133,143).
    pub nf4_scales: u64,
    /// The dequantised, transposed fp32 copy kept for cuBLAS: Σ 4E
    /// (cuda_block.rs:2997, 3012-3018). Each is read back once to "verify"
    /// (cuda_block.rs:3002-3004), a device-to-host copy not counted here.
    pub dequantized: u64,
    /// LoRA A_q [r×h], B_q [q×r], A_v [r×h], B_v [kv×r], fp32:
    /// 4r(2h + q + kv) (cuda_block.rs:3026-3043).
    pub lora: u64,
    /// Q/K/V biases replicated over max_seq_len rows: 4S(q + 2kv)
    /// (cuda_block.rs:3077-3097); zero without bias.
    pub biases: u64,
}

impl LayerUpload {
    /// Per layer: 8h + 4.5625·ΣE + 4r(2h+q+kv) + 4S(q+2kv), with E the
    /// element counts of Q, K, V, O, gate, up, down (q·h, kv·h, kv·h, h·q,
    /// i·h, i·h, h·i). QK-norm weights are not uploaded: `Transformer::new`
    /// makes none (T:transformer/attention.rs:404).
    pub fn of(run: &Resolved) -> Self {
        let shape = run.shape;
        let (h, q, kv, i) = (
            shape.hidden as u64,
            shape.q_dim() as u64,
            shape.kv_dim() as u64,
            shape.intermediate as u64,
        );
        let (r, s) = (LORA_RANK as u64, run.seq_len as u64);
        let elements = q * h + 2 * kv * h + h * q + 3 * i * h;
        let biases = if shape.qkv_bias {
            F32 * s * (q + 2 * kv)
        } else {
            0
        };
        Self {
            norms: 2 * F32 * h,
            nf4_codes: elements / 2,
            nf4_scales: elements / 16,
            dequantized: F32 * elements,
            lora: F32 * r * (2 * h + q + kv),
            biases,
        }
    }

    /// The layer's host-to-device bytes.
    pub fn total(&self) -> u64 {
        self.norms + self.nf4_codes + self.nf4_scales + self.dequantized + self.lora + self.biases
    }
}

/// Host-to-device bytes from the start of `InstructPipeline::new` to the end
/// of its last layer upload: layers · [`LayerUpload::total`] (see the
/// module documentation for why nothing before the layers is added).
pub fn upload_bytes(setup: &Setup) -> Result<u64> {
    let run = setup.resolve()?;
    Ok(run.shape.layers as u64 * LayerUpload::of(&run).total())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The research brief's example: h = q = 512, kv = 128, i = 1408, r = 16,
    /// S = 256, four layers.
    #[test]
    fn the_tiny_model_uploads_the_briefs_byte_count() {
        let setup = Setup::new("qwen2-tiny-4l");
        let layer = LayerUpload::of(&setup.resolve().unwrap());
        let elements = 2 * 512 * 512 + 2 * 128 * 512 + 3 * 1408 * 512;
        assert_eq!(layer.norms, 4096);
        assert_eq!(
            layer.nf4_codes + layer.nf4_scales + layer.dequantized,
            elements * 73 / 16
        );
        assert_eq!(layer.lora, 4 * 16 * (1024 + 512 + 128));
        assert_eq!(layer.biases, 4 * 256 * (512 + 256));
        assert_eq!(layer.total(), 13_754_368);
        assert_eq!(upload_bytes(&setup).unwrap(), 55_017_472);
    }

    #[test]
    fn the_biases_follow_the_sequence_length() {
        let mut setup = Setup::new("qwen2-tiny-4l");
        setup.seq_len = Some(512);
        let longer = upload_bytes(&setup).unwrap();
        assert_eq!(longer - 55_017_472, 4 * 4 * 256 * (512 + 256));
    }

    #[test]
    fn an_unknown_model_has_no_byte_count() {
        assert!(upload_bytes(&Setup::new("nope")).is_err());
    }
}
