//! How a training step runs: the base format, the clipping, the optimizer's
//! hyper-parameters, graph capture and the GEMM math of each direction.

use crate::faults::Faults;
use crate::gpu::GemmMath;
use crate::ops::attention::AttnKernels;

/// How the frozen base weights are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BaseWeights {
    #[default]
    Fp32,
    /// 4-bit NormalFloat codes with one f32 absmax per block of 64.
    Nf4,
    /// bf16 (rounded to nearest even), the frozen projections, the
    /// embedding and the LM head alike, with no f32 copy. Every GEMM of a
    /// frozen weight (the q/k/v stack, o, gate, up, down and the head,
    /// forward and the backward's input gradients) runs on bf16 operands,
    /// its input rounded to bf16 first, with f32 accumulation and an f32
    /// output. Attention runs on bf16 operands too, as PyTorch's bf16
    /// autocast runs it ([`BaseWeights::attention_kernels`]), and the MLP's
    /// gate and up are stored in bf16 as their GEMM writes them. What stays
    /// f32: the LoRA and norm weights, their gradients and AdamW moments,
    /// the other activations kept between kernels, the softmax, the
    /// reductions and the loss.
    Bf16,
    /// The frozen projections as [`BaseWeights::Nf4`] (4-bit codes, one f32
    /// absmax per block of 64), dequantised to bf16 before each use, `w'_i =
    /// bf16(CODE_BOOK[code_i] * absmax_b)`; everything else as
    /// [`BaseWeights::Bf16`]: the embedding and the LM head stored in bf16
    /// (QLoRA quantises the projections only), every frozen GEMM on bf16
    /// operands with f32 accumulation, attention in bf16.
    Nf4Bf16,
}

impl BaseWeights {
    /// Whether the frozen GEMMs run on bf16 operands (a bf16 base, or an NF4
    /// one dequantised to bf16): the bf16 tables, inputs, gate and up, and
    /// attention kernels.
    pub fn computes_in_bf16(self) -> bool {
        matches!(self, BaseWeights::Bf16 | BaseWeights::Nf4Bf16)
    }

    /// Whether the frozen projections are stored as NF4 codes.
    pub fn is_nf4(self) -> bool {
        matches!(self, BaseWeights::Nf4 | BaseWeights::Nf4Bf16)
    }

    /// Its name in mode names and reports, e.g. `nf4-bf16`.
    pub fn name(self) -> &'static str {
        match self {
            BaseWeights::Fp32 => "fp32",
            BaseWeights::Nf4 => "nf4",
            BaseWeights::Bf16 => "bf16",
            BaseWeights::Nf4Bf16 => "nf4-bf16",
        }
    }

    /// The attention kernels of each direction of a step on this base,
    /// given those its GEMM math picks (`by_math`, [`AttnKernels::for_math`]):
    /// a base that computes in bf16 runs the bf16 flash kernels in both
    /// directions (the backward needs what their forward saved); the others
    /// keep `by_math`.
    pub fn attention_kernels(
        self,
        by_math: (AttnKernels, AttnKernels),
    ) -> (AttnKernels, AttnKernels) {
        if self.computes_in_bf16() {
            (AttnKernels::Bf16, AttnKernels::Bf16)
        } else {
            by_math
        }
    }
}

/// How gradients are clipped before the optimizer step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClipMode {
    /// One scale from the norm of all gradients together.
    #[default]
    Global,
    /// Each layer's gradients scaled by their own norm.
    PerLayer,
}

/// AdamW's hyper-parameters (Loshchilov & Hutter): for step `t = 1, 2, ...`
/// `m = b1 m + (1 - b1) g`, `v = b2 v + (1 - b2) g^2`,
/// `p -= lr (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + wd p)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamW {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl AdamW {
    /// `lr` and `weight_decay` with the usual `b1 = 0.9`, `b2 = 0.999`, `eps = 1e-8`.
    pub fn new(lr: f64, weight_decay: f64) -> Self {
        AdamW {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay,
        }
    }
}

/// The optimizer's plain-number hyper-parameters a training run may set.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hyper {
    /// AdamW learning rate.
    pub lr: f64,
    /// Gradients are scaled by `min(1, max_grad_norm / (||g|| + 1e-6))`.
    pub max_grad_norm: f64,
    /// AdamW's decoupled weight decay.
    pub weight_decay: f64,
}

impl Default for Hyper {
    fn default() -> Self {
        Hyper {
            lr: 1e-3,
            max_grad_norm: 1.0,
            weight_decay: 0.0,
        }
    }
}

/// How the GPU step runs.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct GpuTrainOptions {
    pub clip: ClipMode,
    pub base: BaseWeights,
    pub hyper: Hyper,
    /// Capture the step as a CUDA graph and replay it.
    pub graph: bool,
    /// Math of the forward GEMMs; `None` takes the context's option.
    pub forward_math: Option<GemmMath>,
    /// Math of the backward GEMMs; `None` takes the context's option.
    pub backward_math: Option<GemmMath>,
    /// Keep the MLP's gate and up activations for the backward instead of
    /// recomputing them (faster, `2 x tokens x intermediate` floats more per layer).
    pub keep_mlp: bool,
    /// Keep `W^T` (`[in, out]`) of every frozen fp32 projection outside the
    /// q/k/v stack (o, gate, up, down) beside `W`, so the backward's input
    /// gradients `dx = dy W = dy (W^T)^T` read both operands K-major, as the
    /// forward does: Hopper's TF32 tensor-core instructions take only
    /// K-major operands, and cuBLAS's kernels for the other layout are
    /// slower. Costs the size of those projections again; an NF4 base
    /// ignores it (it dequantises each use).
    pub transposed_weights: bool,
    /// Run the LM head's two GEMMs (`logits = nf Wlm^T`, `dnf = dlogits Wlm`)
    /// on f16 operands with f32 accumulation: a kept f16 copy of `Wlm`, the
    /// final norm's output cast to f16, and the cross-entropy gradient
    /// written in f16, scaled by
    /// [`crate::ops::cross_entropy::F16_GRAD_SCALE`] into f16's normal range.
    /// f16 rounds to the same 11-bit significand as TF32 and its tensor-core
    /// instructions run at twice TF32's rate; the head is the step's largest
    /// GEMM pair (vocab 151,936 for the Qwen presets). Needs TF32 math in
    /// both directions (refused otherwise); costs `2 x vocab x hidden` bytes
    /// for the copy and saves `2 x tokens x vocab` on the gradient.
    pub f16_lm_head: bool,
    /// Run the frozen projections' forward GEMMs (each layer's q/k/v stack,
    /// o, gate, up and down) on f16 operands with f32 accumulation and an
    /// f32 output: kept f16 copies of the weights (the stack's LoRA A rows
    /// cast in before each forward) and each GEMM's input cast to f16 first.
    /// The same significand as TF32 at twice its tensor-core rate; the
    /// backward keeps its f32 operands (its gradients are too small for
    /// f16's range without loss scaling). Needs an fp32 base and TF32
    /// forward math (refused otherwise); costs two bytes per frozen
    /// projection weight.
    pub f16_projections: bool,
    /// Quantise an NF4 base on the device from the f32 weights (fast for
    /// billion-parameter presets) instead of with the host's f64 quantiser
    /// (exactly the codes [`crate::model::nf4::quantize`] gives).
    pub device_quantize: bool,
}

impl GpuTrainOptions {
    /// The attention kernels of each direction of this step under the GEMM
    /// math `(forward, backward)` in force and `faults`.
    pub fn attention_kernels(
        &self,
        (fwd, bwd): (GemmMath, GemmMath),
        faults: Faults,
    ) -> (AttnKernels, AttnKernels) {
        let by_math = (
            AttnKernels::for_math(fwd, faults),
            AttnKernels::for_math(bwd, faults),
        );
        self.base.attention_kernels(by_math)
    }

    /// A short name of the mode for reports, e.g. `graphed/global-clip/nf4/tf32-backward`.
    pub fn mode_name(&self) -> String {
        let graph = if self.graph { "graphed" } else { "eager" };
        let clip = match self.clip {
            ClipMode::Global => "global-clip",
            ClipMode::PerLayer => "per-layer-clip",
        };
        let base = self.base.name();
        let mut name = format!("{graph}/{clip}/{base}");
        if self.backward_math == Some(GemmMath::Tf32) {
            name.push_str("/tf32-backward");
        }
        if self.keep_mlp {
            name.push_str("/keep-mlp");
        }
        if self.transposed_weights && self.base == BaseWeights::Fp32 {
            name.push_str("/transposed-weights");
        }
        if self.f16_lm_head {
            name.push_str("/f16-lm-head");
        }
        if self.f16_projections {
            name.push_str("/f16-projections");
        }
        name
    }
}
