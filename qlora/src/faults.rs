//! [`Faults`]: the named things the stack can be told to get wrong.
//!
//! A claim about the stack that no fault could break proves nothing, so
//! whoever tests this stack needs a way to plant a known fault and see the
//! test catch it. Every such
//! fault is one knob here; nothing else in the stack takes a fault argument.
//! A [`crate::gpu::GpuContext`] holds the active knobs and applies them only
//! inside [`crate::gpu::GpuContext::with_faults`], whose guard clears them on
//! drop (a panic included).

/// Fault knobs, all off by default. Each says what goes wrong when it is on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    // ---- kernel cache ----------------------------------------------------------
    /// The kernel cache compiles for an older architecture (`compute_70`)
    /// than the device's.
    pub ptx_older_target: bool,
    /// Pre-warm leaves one module the training step uses uncompiled.
    pub module_left_out_of_prewarm: bool,
    /// Right after pre-warm the kernel cache unloads one module the training
    /// step uses (as a cache with a capacity limit would), so the step loads
    /// it again mid-training.
    pub module_evicted_after_prewarm: bool,
    /// The kernel cache loads its disk entries without checking their
    /// header (architecture, NVRTC version, source hash), length, hash or target.
    pub disk_entries_trusted: bool,
    // ---- launches --------------------------------------------------------------
    /// Grid-stride kernels run one block and row kernels one warp per block:
    /// results stay correct, bandwidth collapses.
    pub serialised_launch: bool,
    /// Every launcher leaves the last element (or row) of its output unwritten.
    pub last_element_unwritten: bool,
    /// The softmax kernel skips the row-maximum subtraction.
    pub softmax_without_max_subtraction: bool,
    /// GEMMs run plain FP32 math where TF32 tensor ops are configured, and
    /// the GEMMs on f16 or bf16 operands run cuBLAS's pedantic f32 compute,
    /// which uses no tensor cores.
    pub gemm_without_tensor_ops: bool,
    /// Before the first kernel is fetched, a kernel stores far outside its
    /// buffer: an illegal address that poisons the CUDA context.
    pub out_of_bounds_write: bool,
    // ---- the training step -----------------------------------------------------
    /// The trainer uploads its weights before it pre-warms the kernels.
    pub upload_before_prewarm: bool,
    /// The workspace keeps a second copy of every layer's activations.
    pub activations_doubled: bool,
    /// Each layer's gradients are clipped by their own norm.
    pub clip_per_layer: bool,
    /// No gradient clipping at all.
    pub clip_skipped: bool,
    /// A host read of the loss inside the captured region.
    pub host_sync_inside_capture: bool,
    /// A graphed step runs eagerly (no capture, no replay).
    pub graph_replay_disabled: bool,
    /// The optimizer step runs twice per training step.
    pub optimizer_step_twice: bool,
    /// The LoRA scale is applied twice in the backward.
    pub lora_backward_scale_twice: bool,
    /// Where the MLP's gate and up are not kept, the backward skips their
    /// recomputation and reads the scratch as the forward left it: every
    /// layer's backward sees the last layer's gate and up.
    pub mlp_recompute_skipped: bool,
    /// The kept `W^T` copies of the frozen projections hold `W` itself:
    /// the backward reads the weights in the wrong layout.
    pub backward_weights_untransposed: bool,
    /// The backward reads `W` even where the step keeps `W^T` for it: the
    /// results stay right, the input-gradient GEMMs lose their K-major layout.
    pub transposed_weights_ignored: bool,
    /// The trainer keeps no f16 LM head even where its options ask for one:
    /// the head's GEMMs stay TF32 on the f32 tensors.
    pub f16_lm_head_ignored: bool,
    /// The kept f16 copy of the LM head is made from the embedding table
    /// (the same shape, and the same tensor in a model with tied embeddings).
    pub f16_lm_head_from_embedding: bool,
    /// The trainer keeps no f16 projections even where its options ask for
    /// them: the forward GEMMs stay TF32 on the f32 tensors.
    pub f16_projections_ignored: bool,
    /// The kept f16 copy of each layer's gate projection is made from its up
    /// projection (the same shape).
    pub f16_gate_from_up: bool,
    /// AdamW moves parameters up the gradient.
    pub adamw_update_sign_flipped: bool,
    /// After each optimizer step the trainable tensors are rounded to bf16,
    /// as if their master copy were kept in bf16: an update smaller than
    /// half a bf16 step of its weight is lost.
    pub lora_weights_bf16: bool,
    /// The bf16 GEMM engine of [`crate::ops::gemm`] rounds its f32 output to
    /// bf16, as a kernel that accumulates or stores in bf16 would.
    pub bf16_gemm_output_rounded: bool,
    // ---- data parallelism (every rank gets the same knobs) --------------------
    /// No rank all-reduces its gradients: each trains on its own shard.
    pub dp_all_reduce_skipped: bool,
    /// Gradients are summed over the ranks instead of averaged.
    pub dp_sum_instead_of_mean: bool,
    /// A frozen tensor (the final norm's weight) is all-reduced with the
    /// trainable gradients.
    pub dp_frozen_tensor_reduced: bool,
    /// The step waits on the host for the gradients before the all-reduce.
    pub dp_host_wait_at_all_reduce: bool,
    /// Each rank runs the forward and backward once per rank, as if the
    /// ranks took turns on one GPU.
    pub dp_ranks_serialised: bool,
    /// Each rank computes its clip scale from its own un-reduced gradients,
    /// then all-reduces: the clip's norm is that of the rank's shard's
    /// gradient, not the whole batch's (so, whenever the clip is active,
    /// the ranks scale the same reduced gradient by different amounts).
    pub dp_clip_before_all_reduce: bool,
}

impl Faults {
    /// No fault.
    pub const NONE: Faults = Faults {
        ptx_older_target: false,
        module_left_out_of_prewarm: false,
        module_evicted_after_prewarm: false,
        disk_entries_trusted: false,
        serialised_launch: false,
        last_element_unwritten: false,
        softmax_without_max_subtraction: false,
        gemm_without_tensor_ops: false,
        out_of_bounds_write: false,
        upload_before_prewarm: false,
        activations_doubled: false,
        clip_per_layer: false,
        clip_skipped: false,
        host_sync_inside_capture: false,
        graph_replay_disabled: false,
        optimizer_step_twice: false,
        lora_backward_scale_twice: false,
        mlp_recompute_skipped: false,
        backward_weights_untransposed: false,
        transposed_weights_ignored: false,
        f16_lm_head_ignored: false,
        f16_lm_head_from_embedding: false,
        f16_projections_ignored: false,
        f16_gate_from_up: false,
        adamw_update_sign_flipped: false,
        lora_weights_bf16: false,
        bf16_gemm_output_rounded: false,
        dp_all_reduce_skipped: false,
        dp_sum_instead_of_mean: false,
        dp_frozen_tensor_reduced: false,
        dp_host_wait_at_all_reduce: false,
        dp_ranks_serialised: false,
        dp_clip_before_all_reduce: false,
    };

    /// Whether any knob is on.
    pub fn any(&self) -> bool {
        *self != Faults::NONE
    }

    /// The number of elements (or rows) a launcher writes out of `n`: all of
    /// them, or `n - 1` under [`Faults::last_element_unwritten`].
    pub fn written(&self, n: usize) -> usize {
        if self.last_element_unwritten {
            n.saturating_sub(1)
        } else {
            n
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn none_is_the_default_and_written_drops_one_element_only_under_its_knob() {
        assert_eq!(Faults::default(), Faults::NONE);
        assert!(!Faults::NONE.any());
        assert_eq!(Faults::NONE.written(5), 5);
        let f = Faults {
            last_element_unwritten: true,
            ..Faults::NONE
        };
        assert!(f.any());
        assert_eq!(f.written(5), 4);
        assert_eq!(f.written(0), 0);
    }
}
