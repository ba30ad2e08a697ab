//! Named, test-only fault injections.
//!
//! A check that cannot fail is a defect, so every falsification test names the
//! mutant that must make it fail, and the harness runs a self-test trial
//! (`{contract}::{test}::mutant`) that passes only when the check, run with that
//! fault injected, reports `falsified`. A mutant of the stack maps to its
//! fault knobs ([`Mutant::faults`]), which a check applies to the GPU context
//! through a guard that clears them again; a mutant of the oracle maps to a
//! faulty variant that reuses the clean code through a parameter. Never an
//! environment variable or a global switch.

use qlora::Faults;
use serde::{Deserialize, Serialize};

use crate::reference::train::StepFaults;

/// Every fault the system under test knows how to inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mutant {
    // ---- reference ops: forward -------------------------------------------------
    /// Softmax computes `exp(x)` without subtracting the row maximum: large
    /// logits overflow to `inf` and the row no longer sums to one.
    SoftmaxWithoutMaxSubtraction,
    /// RMSNorm multiplies by gamma but forgets to divide by the RMS.
    RmsnormWithoutNormalisation,
    /// RoPE uses `+sin` in both halves, which is not a rotation.
    RopeUnbalancedRotation,
    /// The inverse RoPE rotates by `+theta` instead of `-theta`.
    RopeInverseSameDirection,
    /// NF4 quantisation picks the code next to the nearest one.
    Nf4NeighbourCode,
    /// Cross-entropy returns `-logit[target]`, forgetting log-sum-exp.
    CrossEntropyWithoutLogSumExp,
    // ---- reference ops: backward ------------------------------------------------
    /// Cross-entropy's logit gradient is `-onehot` (the softmax term is dropped).
    CrossEntropyGradMissingSoftmax,
    /// RMSNorm backward drops the projection term `-x * <dy*g, x> / (n * rms^2)`.
    RmsnormBackwardMissingProjection,
    /// RoPE backward applies the forward rotation instead of its inverse.
    RopeBackwardForwardRotation,
    /// Softmax backward returns `y * dy`, dropping `- y * <y, dy>`.
    SoftmaxBackwardMissingDot,
    /// Attention backward forgets the `1/sqrt(head_dim)` score scale.
    AttentionBackwardUnscaled,
    /// SwiGLU backward drops the derivative of SiLU (treats it as identity).
    SwigluBackwardMissingSiluDerivative,
    /// GEMM backward multiplies by `B` where `B^T` is needed.
    GemmBackwardUntransposed,
    /// Embedding backward overwrites instead of accumulating repeated tokens.
    EmbeddingBackwardOverwrites,
    /// Scale backward passes the gradient through unscaled.
    ScaleBackwardIgnoresScale,
    /// Residual backward drops the skip branch.
    ResidualBackwardDropsSkip,
    // ---- checkpoint loading -----------------------------------------------------
    /// The loaded model drops the q/k/v biases of the checkpoint.
    CheckpointBiasDropped,
    /// The loaded model ignores `tie_word_embeddings` and draws an LM head
    /// of its own where the checkpoint ties it to the embedding.
    CheckpointUntiedHead,
    /// The loaded model uses RoPE theta 10000 (Qwen2Config's default, what
    /// a reader of transformers 4's `rope_theta` key alone finds in a
    /// transformers 5 config.json) instead of the checkpoint's.
    CheckpointWrongRopeTheta,
    /// The adapter writer records `lora_alpha` as the rank, so PEFT scales
    /// the LoRA branch by `alpha / r = 1` instead of the trainer's `s`.
    AdapterAlphaAsRank,
    // ---- clipping and optimizer -------------------------------------------------
    /// Clipping scales each layer by its own norm where global clipping is claimed.
    ClipPerLayer,
    /// Clipping always rescales to `max_norm`, even gradients already below it.
    ClipAlwaysScales,
    /// The clip is skipped altogether.
    ClipSkipped,
    /// AdamW without bias correction of the moments.
    AdamwWithoutBiasCorrection,
    /// AdamW moves parameters up the gradient instead of down.
    AdamwUpdateSignFlipped,
    /// The optimizer step runs twice per training step (e.g. twice on graph replay).
    OptimizerStepTwice,
    /// The training step's LoRA branch scale is applied twice in backward.
    LoraBackwardScaleTwice,
    /// The `W^T` copies the step keeps for its backward hold `W` itself
    /// (the transpose is skipped): the input gradients read the weights in
    /// the wrong layout.
    BackwardWeightsUntransposed,
    /// The backward reads `W` even where the step keeps `W^T` for it
    /// (correct, as slow as without the copy).
    TransposedWeightsIgnored,
    /// The trainer keeps no f16 LM head where its options ask for one
    /// (correct, as slow as the TF32 head).
    F16LmHeadIgnored,
    /// The f16 copy of the LM head is made from the embedding table (the
    /// same shape; the same tensor only where embeddings are tied).
    F16LmHeadFromEmbedding,
    /// The trainer keeps no f16 projections where its options ask for them
    /// (correct, as slow as the TF32 forward).
    F16ProjectionsIgnored,
    /// The f16 copy of each layer's gate projection is made from its up
    /// projection (the same shape).
    F16GateFromUp,
    /// Where gate and up are not kept, the backward reads the scratch as
    /// the forward left it (the last layer's) instead of recomputing each
    /// layer's.
    MlpRecomputeSkipped,
    /// After each optimizer step the trainable tensors are rounded to bf16,
    /// as if their master copy were kept in bf16: updates smaller than half
    /// a bf16 step of their weight are lost.
    LoraWeightsBf16,
    /// The bf16 GEMM engine rounds its f32 output to bf16.
    Bf16GemmOutputRounded,
    // ---- GPU runtime ------------------------------------------------------------
    /// The kernel cache compiles for an older architecture than the device's.
    PtxOlderTarget,
    /// One kernel the training step uses is left out of pre-warm.
    KernelLeftOutOfPrewarm,
    /// The trainer uploads its weights first and pre-warms the kernels after,
    /// compiling and loading them while the weights hold device memory.
    WeightsUploadedBeforePrewarm,
    /// The kernel cache unloads a module the step uses right after pre-warm,
    /// so the step loads it again under memory pressure.
    ModuleEvictedAfterPrewarm,
    /// The kernel cache loads its disk entries without checking their
    /// header, length, hash or target: a stale entry for another
    /// architecture or compiler is loaded.
    DiskEntriesTrusted,
    /// An op leaves the last element of its output unwritten.
    LastElementUnwritten,
    /// A host synchronisation inside the captured region.
    HostSyncInsideCapture,
    /// The candidate runs without CUDA-graph replay.
    GraphReplayDisabled,
    /// Activations are kept for every layer in fp32 twice over (a memory leak).
    ActivationsDoubled,
    /// Kernels are launched under-parallelised: grid-stride kernels with one
    /// block, row kernels (and the squared sum's partial kernel) with one warp
    /// per block. Results stay correct; the achieved bandwidth collapses.
    SerialisedLaunch,
    /// The timed GEMM path runs plain FP32 math where TF32 tensor ops are
    /// configured (the math mode is lost), and GEMMs on f16 or bf16
    /// operands run without tensor cores: several times slower.
    GemmWithoutTensorOps,
    /// A kernel writes far outside its buffer before the op runs: an illegal
    /// address that poisons the CUDA context (proves the run survives it).
    OutOfBoundsWrite,
    // ---- data parallelism ------------------------------------------------------
    /// No rank all-reduces its gradients: each trains on its own shard.
    DpAllReduceSkipped,
    /// The ranks' gradients are summed instead of averaged.
    DpSumInsteadOfMean,
    /// A frozen tensor is all-reduced with the trainable gradients.
    DpFrozenTensorReduced,
    /// The step waits on the host for the gradients before the all-reduce.
    DpHostWaitAtAllReduce,
    /// Each rank computes every rank's share in turn (ranks serialised).
    DpRanksSerialised,
    /// Each rank computes its clip norm and scale from its own shard's
    /// gradients, then all-reduces (clip before the all-reduce).
    DpClipBeforeAllReduce,
}

impl Mutant {
    /// The stack's fault knobs this mutant turns on; [`Faults::NONE`] for a
    /// mutant of the reference (a faulty oracle variant instead).
    pub fn faults(self) -> Faults {
        let none = Faults::NONE;
        match self {
            Mutant::PtxOlderTarget => Faults {
                ptx_older_target: true,
                ..none
            },
            Mutant::KernelLeftOutOfPrewarm => Faults {
                module_left_out_of_prewarm: true,
                ..none
            },
            Mutant::WeightsUploadedBeforePrewarm => Faults {
                upload_before_prewarm: true,
                ..none
            },
            Mutant::ModuleEvictedAfterPrewarm => Faults {
                module_evicted_after_prewarm: true,
                ..none
            },
            Mutant::DiskEntriesTrusted => Faults {
                disk_entries_trusted: true,
                ..none
            },
            Mutant::SerialisedLaunch => Faults {
                serialised_launch: true,
                ..none
            },
            Mutant::LastElementUnwritten => Faults {
                last_element_unwritten: true,
                ..none
            },
            Mutant::SoftmaxWithoutMaxSubtraction => Faults {
                softmax_without_max_subtraction: true,
                ..none
            },
            Mutant::GemmWithoutTensorOps => Faults {
                gemm_without_tensor_ops: true,
                ..none
            },
            Mutant::OutOfBoundsWrite => Faults {
                out_of_bounds_write: true,
                ..none
            },
            Mutant::ActivationsDoubled => Faults {
                activations_doubled: true,
                ..none
            },
            Mutant::ClipPerLayer => Faults {
                clip_per_layer: true,
                ..none
            },
            Mutant::ClipSkipped => Faults {
                clip_skipped: true,
                ..none
            },
            Mutant::HostSyncInsideCapture => Faults {
                host_sync_inside_capture: true,
                ..none
            },
            Mutant::GraphReplayDisabled => Faults {
                graph_replay_disabled: true,
                ..none
            },
            Mutant::OptimizerStepTwice => Faults {
                optimizer_step_twice: true,
                ..none
            },
            Mutant::LoraBackwardScaleTwice => Faults {
                lora_backward_scale_twice: true,
                ..none
            },
            Mutant::BackwardWeightsUntransposed => Faults {
                backward_weights_untransposed: true,
                ..none
            },
            Mutant::TransposedWeightsIgnored => Faults {
                transposed_weights_ignored: true,
                ..none
            },
            Mutant::F16LmHeadIgnored => Faults {
                f16_lm_head_ignored: true,
                ..none
            },
            Mutant::F16LmHeadFromEmbedding => Faults {
                f16_lm_head_from_embedding: true,
                ..none
            },
            Mutant::F16ProjectionsIgnored => Faults {
                f16_projections_ignored: true,
                ..none
            },
            Mutant::F16GateFromUp => Faults {
                f16_gate_from_up: true,
                ..none
            },
            Mutant::MlpRecomputeSkipped => Faults {
                mlp_recompute_skipped: true,
                ..none
            },
            Mutant::LoraWeightsBf16 => Faults {
                lora_weights_bf16: true,
                ..none
            },
            Mutant::Bf16GemmOutputRounded => Faults {
                bf16_gemm_output_rounded: true,
                ..none
            },
            Mutant::AdamwUpdateSignFlipped => Faults {
                adamw_update_sign_flipped: true,
                ..none
            },
            Mutant::DpAllReduceSkipped => Faults {
                dp_all_reduce_skipped: true,
                ..none
            },
            Mutant::DpSumInsteadOfMean => Faults {
                dp_sum_instead_of_mean: true,
                ..none
            },
            Mutant::DpFrozenTensorReduced => Faults {
                dp_frozen_tensor_reduced: true,
                ..none
            },
            Mutant::DpHostWaitAtAllReduce => Faults {
                dp_host_wait_at_all_reduce: true,
                ..none
            },
            Mutant::DpRanksSerialised => Faults {
                dp_ranks_serialised: true,
                ..none
            },
            Mutant::DpClipBeforeAllReduce => Faults {
                dp_clip_before_all_reduce: true,
                ..none
            },
            _ => none,
        }
    }

    /// The reference training step's faulty variant under this mutant.
    pub fn step_faults(self) -> StepFaults {
        optim::step_faults(self)
    }

    /// The snake_case name used in contracts and reports.
    pub fn name(self) -> String {
        // The Debug form is CamelCase; contracts spell it snake_case.
        let camel = format!("{self:?}");
        let mut out = String::with_capacity(camel.len() + 8);
        for (i, ch) in camel.chars().enumerate() {
            if ch.is_ascii_uppercase() {
                if i > 0 {
                    out.push('_');
                }
                out.push(ch.to_ascii_lowercase());
            } else {
                out.push(ch);
            }
        }
        out
    }
}

impl std::fmt::Display for Mutant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every mutant the shipped contracts name prints as the name it was
    /// parsed from (reports and `--inject` use `name()`).
    #[test]
    fn names_round_trip_through_serde() {
        let contracts = crate::shipped_contracts();
        let mutants: std::collections::HashSet<Mutant> = contracts
            .iter()
            .flat_map(|c| c.falsification_tests.iter())
            .filter_map(|t| t.mutant.subject().copied())
            .collect();
        assert!(mutants.len() > 20, "{} mutants", mutants.len());
        for m in mutants {
            let parsed: Mutant = serde_yaml::from_str(&m.name()).expect("parses");
            assert_eq!(parsed, m);
        }
    }

    /// The clip-before-all-reduce mutant turns on its stack knob and no other.
    #[test]
    fn clip_before_all_reduce_maps_to_its_fault() {
        let m: Mutant = serde_yaml::from_str("dp_clip_before_all_reduce").expect("parses");
        assert_eq!(m, Mutant::DpClipBeforeAllReduce);
        assert_eq!(m.name(), "dp_clip_before_all_reduce");
        let want = Faults {
            dp_clip_before_all_reduce: true,
            ..Faults::NONE
        };
        assert_eq!(m.faults(), want);
    }
}

pub mod checkpoint;
pub mod optim;
pub mod reference_ops;
