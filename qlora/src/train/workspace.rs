//! The preallocated device memory of the training step: every activation the
//! backward needs, every gradient scratch buffer, the NF4 dequantisation
//! scratch, and the cuBLAS workspace. Nothing is allocated after
//! [`Workspace::new`], which is what lets a whole step be captured as one CUDA
//! graph (an allocation inside stream capture is an error).

use crate::ops::attention::{AttnKernels, AttnShape, QkvBuffers};
use cudarc::cublas::sys as blas_sys;
use cudarc::driver::{sys, CudaSlice, CudaView, DevicePtrMut};

use super::kernels::LoraGradsWorkspace;
use super::layer::{norm_slots, qkv_shape};
use super::options::{BaseWeights, GpuTrainOptions};
use super::weights::{Frozen, Linear};
use crate::error::Result;
use crate::gpu::GpuContext;
use crate::model::ModelConfig;
use crate::ops::cast::Bf16;
use crate::ops::cross_entropy::RowStats;
use crate::ops::nf4::{self, Nf4Device};
use crate::ops::rmsnorm::BackwardWorkspace;

/// Bytes of the cuBLAS workspace we give the handle, so it never allocates
/// during capture (32 MiB covers every SGEMM split-K heuristic on Hopper).
pub const CUBLAS_WORKSPACE_BYTES: usize = 32 << 20;

/// What the forward pass keeps of one layer for the backward (`T = batch *
/// seq` rows). The MLP's `gate` and `up` (`2 x intermediate` wide, the widest
/// activations by far) are kept only when asked (`keep_mlp`); otherwise the
/// backward recomputes them from `n2`, which keeps a 1.5B model's saved
/// activations near 1.2 GiB instead of 4.
pub struct LayerActs {
    /// `rmsnorm(x, g1)` `[T, hidden]`.
    pub n1: CudaSlice<f32>,
    /// The LoRA down-projections `u = n1 Aq^T | n1 Av^T` `[T, 2 r]`: the
    /// fused projection's last columns ([`Workspace::qkv`]), what the
    /// backward reads of it.
    pub u: CudaSlice<f32>,
    /// q, k after RoPE and v (`[T, q_dim]`, `[T, kv_dim]`, `[T, kv_dim]`)
    /// as attention reads them: f32, or with a bf16 base rounded to bf16,
    /// the flash kernels' operands.
    pub attn_in: QkvBuffers,
    /// What attention's forward saves for its backward
    /// ([`crate::ops::attention::saved_len`]): the probabilities `[batch,
    /// heads, seq, seq]`, or with a bf16 base each row's log-sum-exp
    /// `[batch, heads, seq]`.
    pub attn_saved: CudaSlice<f32>,
    /// Attention output `[T, q_dim]` (the backward's `D_i = <dout_i, out_i>`).
    pub att: CudaSlice<f32>,
    /// `x + att Wo^T` `[T, hidden]`.
    pub x2: CudaSlice<f32>,
    /// Its norm, kept only when gate and up are recomputed from it.
    pub n2: Option<SavedNorm>,
    /// `n2 Wg^T` and `n2 Wu^T` `[T, intermediate]`, when kept.
    pub mlp: Option<GateUp>,
}

/// A buffer of `len` values in the step's activation format: f32, or with
/// a base computing in bf16 bf16 (the f32 result rounded once at the store).
pub enum Activation {
    F32(CudaSlice<f32>),
    Bf16(CudaSlice<Bf16>),
}

impl Activation {
    fn new(gpu: &GpuContext, len: usize, base: BaseWeights) -> Result<Self> {
        Ok(if base.computes_in_bf16() {
            Activation::Bf16(gpu.zeros(len)?)
        } else {
            Activation::F32(gpu.zeros(len)?)
        })
    }

    /// Device bytes of one of `len` values on `base`.
    fn bytes_for(len: usize, base: BaseWeights) -> usize {
        let element = if base.computes_in_bf16() { 2 } else { 4 };
        element * len
    }

    fn bytes(&self) -> usize {
        match self {
            Activation::F32(x) => 4 * x.len(),
            Activation::Bf16(x) => 2 * x.len(),
        }
    }
}

/// `n2 = rmsnorm(x2, g2)` `[T, hidden]` as the backward's recomputation of
/// gate and up reads it: f32, or with a bf16 base only its bf16 rounding,
/// the operand of the bf16 GEMMs (the forward's, bit for bit).
pub type SavedNorm = Activation;

/// The MLP's `gate = n2 Wg^T` and `up = n2 Wu^T` `[T, intermediate]` as the
/// step's GEMMs store them: f32, each its own matrix, or with a base
/// computing in bf16 bf16 (the f32 accumulation rounded once at the store,
/// the elements PyTorch's bf16 autocast keeps) as one `[T, 2 intermediate]`
/// matrix `gate | up`, the one GEMM of `[Wg; Wu]`'s output.
pub enum GateUp {
    F32(CudaSlice<f32>, CudaSlice<f32>),
    Bf16(CudaSlice<Bf16>),
}

impl GateUp {
    fn new(gpu: &GpuContext, c: &ModelConfig, base: BaseWeights) -> Result<Self> {
        let n = c.tokens() * c.intermediate;
        Ok(if base.computes_in_bf16() {
            GateUp::Bf16(gpu.zeros(2 * n)?)
        } else {
            GateUp::F32(gpu.zeros(n)?, gpu.zeros(n)?)
        })
    }

    /// Device bytes of gate and up for `c` on `base`.
    fn bytes_for(c: &ModelConfig, base: BaseWeights) -> usize {
        let element = if base.computes_in_bf16() { 2 } else { 4 };
        2 * element * c.tokens() * c.intermediate
    }

    fn bytes(&self) -> usize {
        match self {
            GateUp::F32(g, u) => 4 * (g.len() + u.len()),
            GateUp::Bf16(gu) => 2 * gu.len(),
        }
    }
}

/// SwiGLU's output gradient `dact = dx' Wd` `[T, intermediate]` as the down
/// projection's input-gradient GEMM stores it: f32, or with a bf16 base
/// bf16 (what SwiGLU's bf16 backward reads, as PyTorch's bf16 autocast
/// keeps it).
pub type Dact = Activation;

impl LayerActs {
    fn new(gpu: &GpuContext, c: &ModelConfig, keep_mlp: bool, base: BaseWeights) -> Result<Self> {
        let t = c.tokens();
        let z = |n: usize| gpu.zeros::<f32>(n);
        Ok(LayerActs {
            n1: z(t * c.hidden)?,
            u: z(t * 2 * c.lora_rank)?,
            attn_in: QkvBuffers::zeros(gpu, attention_sizing(base), &attention_shape(c))?,
            attn_saved: z(attention_saved(c, base))?,
            att: z(t * c.q_dim())?,
            x2: z(t * c.hidden)?,
            n2: if keep_mlp {
                None
            } else {
                Some(SavedNorm::new(gpu, c.tokens() * c.hidden, base)?)
            },
            mlp: if keep_mlp {
                Some(GateUp::new(gpu, c, base)?)
            } else {
                None
            },
        })
    }

    /// Bytes of what the MLP keeps per layer: gate and up when kept, else
    /// the norm they are recomputed from.
    fn mlp_bytes(c: &ModelConfig, keep_mlp: bool, base: BaseWeights) -> usize {
        if keep_mlp {
            GateUp::bytes_for(c, base)
        } else {
            SavedNorm::bytes_for(c.tokens() * c.hidden, base)
        }
    }

    /// f32 values per layer (with the layer's residual input `x`) on `base`,
    /// without attention's inputs ([`QkvBuffers`]) and the MLP's
    /// ([`LayerActs::mlp_bytes`]).
    fn floats(c: &ModelConfig, base: BaseWeights) -> usize {
        let t = c.tokens();
        t * (3 * c.hidden + c.q_dim() + 2 * c.lora_rank) + attention_saved(c, base)
    }

    /// Bytes per layer (with the layer's residual input `x`).
    fn bytes_for(c: &ModelConfig, keep_mlp: bool, base: BaseWeights) -> usize {
        4 * Self::floats(c, base) + attention_inputs(c, base) + Self::mlp_bytes(c, keep_mlp, base)
    }
}

/// Forward values used once and not kept: one set for all layers.
pub struct Scratch {
    /// MLP gate and up when not kept (recomputed in the backward).
    pub gate_up: GateUp,
    /// The MLP's f32 norm when gate and up are kept and nothing keeps it;
    /// `None` otherwise (a bf16 base writes only its bf16 rounding, into
    /// the workspace's bf16 input).
    pub n2: Option<CudaSlice<f32>>,
    /// `silu(gate) * up` `[T, intermediate]`; `None` with a bf16 base, whose
    /// SwiGLU writes it to its bf16 GEMM input.
    pub act: Option<CudaSlice<f32>>,
}

/// Rows of the logits a bf16 base's LM head holds at a time (its forward
/// and backward run chunk by chunk: `train::step`'s head): half of
/// qwen2.5-0.5b's 1,024 training tokens, 156 MB of bf16 logits at its
/// vocabulary of 151,936 instead of the whole batch's 311 MB. Chunks of 256
/// rows held half that and made the step slower: their `dnf` GEMMs (256 x
/// hidden over the vocabulary) have too few tiles to fill the GPU, and the
/// whole batch at once was no faster than 512 (see the book's step-time
/// page).
pub const HEAD_CHUNK_ROWS: usize = 512;

/// The rows of one chunk of a bf16 head over `tokens` rows.
pub fn head_chunk_rows(tokens: usize) -> usize {
    tokens.clamp(1, HEAD_CHUNK_ROWS)
}

/// `(first row, rows)` of each chunk of a bf16 head over `tokens` rows, in
/// order: whole chunks of [`head_chunk_rows`], the last one shorter.
pub fn head_chunks(tokens: usize) -> Vec<(usize, usize)> {
    let chunk = head_chunk_rows(tokens);
    (0..tokens)
        .step_by(chunk)
        .map(|r0| (r0, chunk.min(tokens - r0)))
        .collect()
}

/// The cross-entropy gradient, in the operand type of the LM head's
/// backward GEMM.
pub enum Dlogits {
    /// `[T, vocab]` f32.
    F32(CudaSlice<f32>),
    /// With `f16_lm_head`: `[T, vocab]` scaled f16 bits
    /// (`cross_entropy::backward` into `u16`).
    F16(CudaSlice<u16>),
    /// With a bf16 base: `[head_chunk_rows(T), vocab]`, one chunk's logits
    /// in bf16, turned in place into the gradient of the mean loss.
    Bf16(CudaSlice<Bf16>),
}

impl Dlogits {
    fn bytes(&self) -> usize {
        match self {
            Dlogits::F32(b) => 4 * b.len(),
            Dlogits::F16(b) => 2 * b.len(),
            Dlogits::Bf16(b) => 2 * b.len(),
        }
    }
}

/// Gradient scratch of the backward, shared by all layers.
pub struct Grads {
    pub dlogits: Dlogits,
    pub dnf: CudaSlice<f32>,
    /// The residual-stream gradient, accumulated in place.
    pub dx: CudaSlice<f32>,
    pub dn1: CudaSlice<f32>,
    pub dn2: CudaSlice<f32>,
    pub dact: Dact,
    /// SwiGLU's `dgate`, `dup` in f32 `[T, intermediate]`; `None` with a
    /// bf16 base, whose SwiGLU writes them to its bf16 GEMM inputs.
    pub dgate_up: Option<(CudaSlice<f32>, CudaSlice<f32>)>,
    pub datt: CudaSlice<f32>,
    pub dqr: CudaSlice<f32>,
    pub dkr: CudaSlice<f32>,
    pub dv: CudaSlice<f32>,
    /// The gradient of the fused projection's output `[T, width]`: dq | dk
    /// | dv | duq | duv ([`crate::ops::rope::QkvShape`]).
    pub dqkv: CudaSlice<f32>,
    /// Attention's backward scratch (`dS` and per-head kv shares), shared by the layers.
    pub attn: CudaSlice<f32>,
    /// The RMSNorm backward's partial sums of the norm weights' gradients,
    /// a slot for each layer's two (summed after the whole backward).
    pub norm: BackwardWorkspace,
    /// The LoRA gradients' partial sums ([`super::kernels::lora_grads_tf32`]).
    pub lora: LoraGradsWorkspace,
}

/// Every buffer of one step of a configuration.
pub struct Workspace {
    pub inputs: CudaSlice<u32>,
    pub targets: CudaSlice<u32>,
    /// Residual stream: `xs[l]` is the input of layer `l`, `xs[layers]` the
    /// input of the final norm.
    pub xs: Vec<CudaSlice<f32>>,
    pub layers: Vec<LayerActs>,
    pub scratch: Scratch,
    pub nf: CudaSlice<f32>,
    /// The fused projection `n1 [Wq; Wk; Wv; Aq; Av]^T` `[T, width]`
    /// ([`crate::ops::rope::QkvShape`]) of the layer being computed: its
    /// epilogue reads it and copies the `u` columns to the layer's
    /// [`LayerActs::u`].
    pub qkv: CudaSlice<f32>,
    /// With `f16_lm_head` or `f16_projections`: the input of the f16 GEMM
    /// about to run, cast to f16 (raw bits) into its front
    /// ([`Workspace::half_input_len`] elements; the LM head's `nf` and each
    /// projection's input in turn, as each GEMM reads it right away).
    pub half_input: Option<CudaSlice<u16>>,
    /// With a bf16 base: the input of the bf16 GEMM about to run, rounded
    /// to bf16 into its front ([`Workspace::bf16_input_len`] elements; every
    /// frozen GEMM's input in turn, forward and backward).
    pub bf16_input: Option<CudaSlice<Bf16>>,
    /// With a bf16 base: a second bf16 GEMM input, alive beside
    /// [`Workspace::bf16_input`] (`T x 2 intermediate` elements): between
    /// the blocks of the backward it holds the residual gradient's bf16
    /// rounding (the next block's first GEMM operand, kept apart from the
    /// MLP's recomputation in `bf16_input`); inside the MLP's backward, once
    /// the down projection has read that, SwiGLU's `dgate | dup`.
    pub bf16_second_input: Option<CudaSlice<Bf16>>,
    /// The whole batch's logits `[T, vocab]` in f32; `None` with a bf16
    /// base, whose head holds one chunk of them at a time, in bf16
    /// ([`Dlogits::Bf16`]).
    pub logits: Option<CudaSlice<f32>>,
    pub losses: CudaSlice<f32>,
    pub loss: CudaSlice<f32>,
    /// The cross-entropy forward's per-row stats, read by its backward.
    pub ce_stats: RowStats,
    pub grads: Grads,
    /// NF4 base computing in f32 only: one dequantisation target per
    /// distinct length of the projections outside the q/k/v stack.
    pub deq: Vec<CudaSlice<f32>>,
    /// NF4 base computing in bf16 only: one bf16 dequantisation target per
    /// distinct length of the projections outside the q/k/v stack.
    pub deq_bf16: Vec<CudaSlice<Bf16>>,
    /// The sines and cosines of RoPE's angles for the fused q/k/v kernels
    /// ([`crate::ops::rope::qkv_angle_table`]), `[2][seq][head_dim / 2]`.
    pub rope_table: CudaSlice<f32>,
    /// NF4 base computing in f32 only: the q/k/v stack `[Wq; Wk; Wv; Aq; Av]` `[width,
    /// hidden]` each layer dequantises into (an fp32 base keeps one per
    /// layer in [`super::weights::BaseDevice::stacks`]).
    pub stack: Option<CudaSlice<f32>>,
    /// NF4 base computing in bf16 only: the q/k/v stack in bf16, which each
    /// layer dequantises into, forward and backward.
    pub stack_bf16: Option<CudaSlice<Bf16>>,
    /// Under [`crate::Faults::activations_doubled`]: a second copy of
    /// every layer's activations, MLP ones included, held for the trainer's
    /// life (the leak the memory budget must catch).
    pub leaked: Vec<CudaSlice<f32>>,
}

impl Workspace {
    /// All buffers for `c` (its `batch` and `seq_len`) and `options`
    /// (`keep_mlp`, `f16_lm_head`, `f16_projections`), zeroed.
    pub fn new(
        gpu: &GpuContext,
        c: &ModelConfig,
        linears: &[&Linear],
        doubled: bool,
        options: &GpuTrainOptions,
    ) -> Result<Self> {
        let (keep_mlp, f16_head) = (options.keep_mlp, options.f16_lm_head);
        let t = c.tokens();
        let z = |n: usize| gpu.zeros::<f32>(n);
        let mut deq_lens: Vec<usize> = linears
            .iter()
            .filter(|l| matches!(l.w, Frozen::Nf4(_)))
            .map(|l| l.out_dim * l.in_dim)
            .collect();
        deq_lens.sort_unstable();
        deq_lens.dedup();
        // An NF4 base computing in bf16 dequantises to bf16, the other to f32.
        let (deq_lens, deq_bf16_lens) = match options.base.computes_in_bf16() {
            true => (Vec::new(), gate_up_targets(c, deq_lens)),
            false => (deq_lens, Vec::new()),
        };
        let stack_len = qkv_width(c) * c.hidden;
        let layers = (0..c.layers)
            .map(|_| LayerActs::new(gpu, c, keep_mlp, options.base))
            .collect::<Result<Vec<_>>>()?;
        let leaked = if doubled {
            (0..c.layers)
                .map(|_| {
                    let layer = LayerActs::bytes_for(c, keep_mlp, options.base) / 4;
                    z(layer + 3 * t * c.intermediate)
                })
                .collect::<Result<Vec<_>>>()?
        } else {
            Vec::new()
        };
        Ok(Workspace {
            inputs: gpu.zeros(t)?,
            targets: gpu.zeros(t)?,
            xs: (0..=c.layers)
                .map(|_| z(t * c.hidden))
                .collect::<Result<_>>()?,
            layers,
            scratch: Scratch {
                gate_up: GateUp::new(gpu, c, options.base)?,
                n2: Self::scratch_norm_len(c, options).map(z).transpose()?,
                act: f32_swiglu(c, options.base).map(z).transpose()?,
            },
            nf: z(t * c.hidden)?,
            qkv: z(t * qkv_width(c))?,
            half_input: match Self::half_input_len(c, options) {
                0 => None,
                n => Some(gpu.zeros(n)?),
            },
            bf16_input: match Self::bf16_input_len(c, options) {
                0 => None,
                n => Some(gpu.zeros(n)?),
            },
            bf16_second_input: match Self::bf16_second_input_len(c, options) {
                0 => None,
                n => Some(gpu.zeros(n)?),
            },
            logits: match options.base.computes_in_bf16() {
                true => None,
                false => Some(z(t * c.vocab)?),
            },
            losses: z(t)?,
            loss: z(1)?,
            ce_stats: RowStats::new(gpu, t)?,
            grads: Grads {
                dlogits: if options.base.computes_in_bf16() {
                    Dlogits::Bf16(gpu.zeros(head_chunk_rows(t) * c.vocab)?)
                } else if f16_head {
                    Dlogits::F16(gpu.zeros(t * c.vocab)?)
                } else {
                    Dlogits::F32(z(t * c.vocab)?)
                },
                dnf: z(t * c.hidden)?,
                dx: z(t * c.hidden)?,
                dn1: z(t * c.hidden)?,
                dn2: z(t * c.hidden)?,
                dact: Dact::new(gpu, t * c.intermediate, options.base)?,
                dgate_up: match f32_swiglu(c, options.base) {
                    Some(n) => Some((z(n)?, z(n)?)),
                    None => None,
                },
                datt: z(t * c.q_dim())?,
                dqr: z(t * c.q_dim())?,
                dkr: z(t * c.kv_dim())?,
                dv: z(t * c.kv_dim())?,
                dqkv: z(t * qkv_width(c))?,
                attn: z(attention_scratch(c, options.base))?,
                norm: BackwardWorkspace::with_slots(gpu, t, c.hidden, norm_slots(c.layers))?,
                lora: LoraGradsWorkspace::new(gpu, &qkv_shape(c), c.hidden)?,
            },
            rope_table: gpu.upload(&crate::ops::rope::qkv_angle_table(
                c.seq_len,
                c.head_dim,
                c.rope_theta,
            ))?,
            stack: match options.base == BaseWeights::Nf4 {
                true => Some(z(stack_len)?),
                false => None,
            },
            stack_bf16: match options.base == BaseWeights::Nf4Bf16 {
                true => Some(gpu.zeros(stack_len)?),
                false => None,
            },
            deq: deq_lens.into_iter().map(z).collect::<Result<_>>()?,
            deq_bf16: deq_bf16_lens
                .into_iter()
                .map(|n| gpu.zeros(n))
                .collect::<Result<_>>()?,
            leaked,
        })
    }

    /// Device bytes [`Workspace::new`] will allocate for `c` (without the
    /// NF4 dequantisation targets, the leak fault's copy and buffers of `hidden` or
    /// `T` floats), computed before allocating so that a configuration that
    /// cannot fit is refused up front:
    /// `4 * (layers * saved + (layers + 6) * T * hidden`
    /// `+ 3 f * T * intermediate + 2 * T * (q_dim + kv_dim) + 2 * T * width`
    /// `+ attention scratch)` plus gate and up (the scratch's, and each
    /// layer's when kept: [`GateUp`], 2 bytes an element with a bf16 base),
    /// SwiGLU's output gradient ([`Dact`], likewise),
    /// the cuBLAS workspace, the 16-bit GEMM inputs
    /// ([`Workspace::half_input_len`], [`Workspace::bf16_input_len`],
    /// [`Workspace::bf16_second_input_len`], 2 bytes each) and the head's
    /// logits and their gradient ([`Workspace::head_bytes`]), and the RMSNorm
    /// backward's partial sums of every trainable norm's gradient
    /// ([`BackwardWorkspace::bytes_for`]).
    /// Term by term: the residual stream (`layers + 1`), the final norm's
    /// output and four hidden-wide gradients; unless the base is bf16 (`f`
    /// = 1, else 0), SwiGLU's f32 product and input gradients; attention's
    /// output gradient and dq (after RoPE), dk and dv; the fused
    /// projection's output and gradient; the MLP's f32 norm where no layer
    /// keeps it ([`Workspace::scratch_norm_len`]).
    pub fn planned_bytes(c: &ModelConfig, options: &GpuTrainOptions) -> usize {
        let t = c.tokens();
        let keep_mlp = options.keep_mlp;
        let floats = c.layers * LayerActs::floats(c, options.base)
            + (c.layers + 6) * t * c.hidden
            + 3 * t
            + 3 * f32_swiglu(c, options.base).unwrap_or(0)
            + 2 * t * c.q_dim()
            + 2 * t * c.kv_dim()
            + 2 * t * qkv_width(c)
            + attention_scratch(c, options.base)
            + LoraGradsWorkspace::floats(&qkv_shape(c), c.hidden)
            + Self::scratch_norm_len(c, options).unwrap_or(0);
        4 * floats
            + c.layers * attention_inputs(c, options.base)
            + c.layers * LayerActs::mlp_bytes(c, keep_mlp, options.base)
            + GateUp::bytes_for(c, options.base)
            + Dact::bytes_for(c.tokens() * c.intermediate, options.base)
            + CUBLAS_WORKSPACE_BYTES
            + 2 * Self::half_input_len(c, options)
            + 2 * Self::bf16_input_len(c, options)
            + 2 * Self::bf16_second_input_len(c, options)
            + Self::head_bytes(c, options)
            + BackwardWorkspace::bytes_for(t, c.hidden, norm_slots(c.layers))
    }

    /// Elements of [`Scratch::n2`]: `T x hidden` when the layers keep gate
    /// and up (so none keeps its norm) and the base computes in f32 (a
    /// bf16 base writes only the norm's rounding, into its bf16 input).
    pub fn scratch_norm_len(c: &ModelConfig, options: &GpuTrainOptions) -> Option<usize> {
        (options.keep_mlp && !options.base.computes_in_bf16()).then(|| c.tokens() * c.hidden)
    }

    /// Bytes of the head's logits and their gradient: `4 T vocab` each in
    /// f32; with `f16_lm_head` the gradient in f16 (`2 T vocab`); with a
    /// bf16 base one chunk of bf16 logits, turned into their gradient in
    /// place (`2 head_chunk_rows(T) vocab`), and no f32 logits.
    pub fn head_bytes(c: &ModelConfig, options: &GpuTrainOptions) -> usize {
        let t = c.tokens();
        if options.base.computes_in_bf16() {
            2 * head_chunk_rows(t) * c.vocab
        } else if options.f16_lm_head {
            6 * t * c.vocab
        } else {
            8 * t * c.vocab
        }
    }

    /// Elements of [`Workspace::half_input`]: the widest input an f16 GEMM
    /// of `options` reads (`T x hidden` for the LM head; `T x intermediate`,
    /// the down projection's, with f16 projections), 0 without one.
    pub fn half_input_len(c: &ModelConfig, options: &GpuTrainOptions) -> usize {
        let t = c.tokens();
        if options.f16_projections {
            t * c.hidden.max(c.q_dim()).max(c.intermediate)
        } else if options.f16_lm_head {
            t * c.hidden
        } else {
            0
        }
    }

    /// Elements of [`Workspace::bf16_input`]: with a bf16 base, the widest
    /// input of a frozen GEMM, forward or backward (`T x` the widest of
    /// hidden, q_dim, intermediate and the q/k/v stack's width, whose
    /// gradient the backward multiplies by the stack); 0 otherwise.
    pub fn bf16_input_len(c: &ModelConfig, options: &GpuTrainOptions) -> usize {
        if !options.base.computes_in_bf16() {
            return 0;
        }
        let widest = c
            .hidden
            .max(c.q_dim())
            .max(c.intermediate)
            .max(qkv_width(c));
        c.tokens() * widest
    }

    /// Elements of [`Workspace::bf16_second_input`]: `T x 2 intermediate`
    /// with a bf16 base (SwiGLU's `dgate | dup`, the widest it holds), 0
    /// otherwise.
    pub fn bf16_second_input_len(c: &ModelConfig, options: &GpuTrainOptions) -> usize {
        if !options.base.computes_in_bf16() {
            return 0;
        }
        2 * c.tokens() * c.intermediate
    }

    /// Bytes of activations the forward keeps per step (all layers) on `base`.
    pub fn activation_bytes(c: &ModelConfig, options: &GpuTrainOptions) -> usize {
        c.layers * LayerActs::bytes_for(c, options.keep_mlp, options.base)
    }

    /// Device bytes of the whole workspace.
    pub fn bytes(&self) -> usize {
        let f32s = |v: &[&CudaSlice<f32>]| 4 * v.iter().map(|b| b.len()).sum::<usize>();
        let d = &self.grads;
        let sc = &self.scratch;
        let per_layer: usize = self
            .layers
            .iter()
            .map(|a| {
                f32s(&[&a.n1, &a.u, &a.attn_saved, &a.att, &a.x2])
                    + a.attn_in.bytes()
                    + a.mlp.as_ref().map_or(0, GateUp::bytes)
                    + a.n2.as_ref().map_or(0, SavedNorm::bytes)
            })
            .sum();
        per_layer
            + self.xs.iter().map(|x| 4 * x.len()).sum::<usize>()
            + sc.gate_up.bytes()
            + sc.act.as_ref().map_or(0, |b| 4 * b.len())
            + sc.n2.as_ref().map_or(0, |b| 4 * b.len())
            + d.dgate_up
                .as_ref()
                .map_or(0, |(g, u)| 4 * (g.len() + u.len()))
            + f32s(&[&self.nf, &self.qkv, &self.losses, &self.loss])
            + self.logits.as_ref().map_or(0, |b| 4 * b.len())
            + self.ce_stats.bytes()
            + 2 * self.half_input.as_ref().map_or(0, |b| b.len())
            + 2 * self.bf16_input.as_ref().map_or(0, |b| b.len())
            + 2 * self.bf16_second_input.as_ref().map_or(0, |b| b.len())
            + d.dlogits.bytes()
            + f32s(&[
                &d.dnf, &d.dx, &d.dn1, &d.dn2, &d.datt, &d.dqr, &d.dkr, &d.dv, &d.dqkv, &d.attn,
            ])
            + d.dact.bytes()
            + d.norm.bytes()
            + self.deq.iter().map(|b| 4 * b.len()).sum::<usize>()
            + self.stack.as_ref().map_or(0, |b| 4 * b.len())
            + self.deq_bf16.iter().map(|b| 2 * b.len()).sum::<usize>()
            + self.stack_bf16.as_ref().map_or(0, |b| 2 * b.len())
            + 4 * self.rope_table.len()
            + self.leaked.iter().map(|b| 4 * b.len()).sum::<usize>()
    }

    /// The device copy of `lin`'s weight: the fp32 tensor itself, or its NF4
    /// codes dequantised (on the stream) into the scratch of its length.
    pub fn weight<'a>(
        deq: &'a mut [CudaSlice<f32>],
        gpu: &mut GpuContext,
        lin: &'a Linear,
    ) -> Result<&'a CudaSlice<f32>> {
        match &lin.w {
            Frozen::Fp32(w) => Ok(w),
            Frozen::Stacked => Err(crate::error::Error::InvalidArgument {
                op: "train",
                message: "a stacked q/k/v projection is read through its layer's stack".into(),
            }),
            Frozen::Bf16(_) => Err(crate::error::Error::InvalidArgument {
                op: "train",
                message: "a bf16 projection has no f32 copy; its GEMMs read it in bf16".into(),
            }),
            Frozen::Nf4(t) => {
                let slot = target_of(deq, t.len)?;
                nf4::dequantize(gpu, t, slot)?;
                Ok(slot)
            }
        }
    }

    /// `lin`'s weight as a bf16 GEMM reads it: a bf16 base's own, or its NF4
    /// codes dequantised to bf16 (on the stream) into the front of the
    /// smallest target in `deq_bf16` that holds it (a base computing in bf16
    /// has them; no other has); `None` for a weight read in another format.
    pub fn bf16_weight<'a>(
        deq_bf16: &'a mut [CudaSlice<Bf16>],
        gpu: &mut GpuContext,
        lin: &'a Linear,
    ) -> Result<Option<CudaView<'a, Bf16>>> {
        match &lin.w {
            Frozen::Bf16(w) => Ok(Some(w.as_view())),
            Frozen::Nf4(t) if !deq_bf16.is_empty() => {
                let slot = target_of(deq_bf16, t.len)?;
                nf4::dequantize_bf16_into(gpu, t, slot, 0)?;
                Ok(Some(slot.slice(..t.len)))
            }
            _ => Ok(None),
        }
    }

    /// `[Wg; Wu]` of an NF4 base computing in bf16 (one NF4 tensor),
    /// dequantised (on the stream) in one launch into the target of its
    /// length in `deq_bf16`.
    pub fn gate_up_bf16_weight<'a>(
        deq_bf16: &'a mut [CudaSlice<Bf16>],
        gpu: &mut GpuContext,
        gate_up: &Nf4Device,
    ) -> Result<CudaView<'a, Bf16>> {
        let slot = target_of(deq_bf16, gate_up.len)?;
        nf4::dequantize_bf16_into(gpu, gate_up, slot, 0)?;
        Ok(slot.slice(..gate_up.len))
    }
}

/// The bf16 dequantisation targets of an NF4 base computing in bf16 for
/// projections of the distinct lengths `lens`: gate and up are
/// dequantised together, into one target of both (`[Wg; Wu]`, which one
/// GEMM reads); down, of their length, is dequantised into its front (it
/// is never needed while gate and up are), so their own length needs no
/// target. A base whose projections are not NF4 (no `lens`) needs none.
pub(super) fn gate_up_targets(c: &ModelConfig, mut lens: Vec<usize>) -> Vec<usize> {
    let part = c.intermediate * c.hidden;
    if lens.contains(&part) {
        lens.retain(|&len| len != part);
        lens.push(2 * part);
    }
    lens
}

/// The dequantisation target for `len` values among `targets`: the
/// smallest that holds them.
fn target_of<T>(targets: &mut [CudaSlice<T>], len: usize) -> Result<&mut CudaSlice<T>> {
    targets
        .iter_mut()
        .filter(|b| b.len() >= len)
        .min_by_key(|b| b.len())
        .ok_or_else(|| crate::error::Error::InvalidArgument {
            op: "train",
            message: format!("no dequantisation target of {len} values"),
        })
}

/// A device buffer handed to cuBLAS as its workspace. cuBLAS would otherwise
/// use its own pool; giving it ours makes sure no cuBLAS call allocates while
/// a graph is being captured. Dropping it resets the handle to its default
/// pool (`cublasSetStream` does that) before the buffer is freed.
pub struct CublasWorkspace {
    handle: blas_sys::cublasHandle_t,
    stream: sys::CUstream,
    _buf: CudaSlice<u8>,
}

impl CublasWorkspace {
    /// Allocates the buffer and hands it to the context's cuBLAS handle.
    pub fn new(gpu: &GpuContext) -> Result<Self> {
        let mut buf = gpu.zeros::<u8>(CUBLAS_WORKSPACE_BYTES)?;
        let handle = *gpu.cublas()?.handle();
        let stream = gpu.stream().cu_stream();
        let ptr = {
            let (ptr, _sync) = buf.device_ptr_mut(gpu.stream());
            ptr
        };
        // SAFETY: `handle` is the context's live cuBLAS handle, bound to the
        // work stream; `ptr` is a device buffer of exactly
        // CUBLAS_WORKSPACE_BYTES that this struct keeps alive until Drop has
        // detached it from the handle.
        unsafe {
            blas_sys::cublasSetWorkspace_v2(
                handle,
                ptr as *mut std::ffi::c_void,
                CUBLAS_WORKSPACE_BYTES,
            )
        }
        .result()?;
        Ok(CublasWorkspace {
            handle,
            stream,
            _buf: buf,
        })
    }
}

impl Drop for CublasWorkspace {
    fn drop(&mut self) {
        // SAFETY: the handle and stream outlive this struct (the GpuContext
        // owns both and trainers borrow it); re-setting the stream makes cuBLAS
        // drop our workspace for its default pool, so the buffer freed after
        // this line is no longer referenced. A failure here can only be
        // reported by later cuBLAS calls, which check their status.
        let _ = unsafe { blas_sys::cublasSetStream_v2(self.handle, self.stream as _) };
    }
}

/// Columns of one layer's fused q/k/v projection (rows of its stack).
pub fn qkv_width(c: &ModelConfig) -> usize {
    c.q_dim() + 2 * c.kv_dim() + 2 * c.lora_rank
}

/// Elements of each f32 SwiGLU buffer (the product, dgate, dup) a step on
/// `base` needs: `T x intermediate`, or none with a bf16 base.
fn f32_swiglu(c: &ModelConfig, base: BaseWeights) -> Option<usize> {
    (!base.computes_in_bf16()).then(|| c.tokens() * c.intermediate)
}

/// One layer's attention shape of `c`.
fn attention_shape(c: &ModelConfig) -> AttnShape {
    AttnShape {
        batch: c.batch,
        seq: c.seq_len,
        heads: c.heads,
        kv_heads: c.kv_heads,
        head_dim: c.head_dim,
    }
}

/// The attention kernels whose buffers a step on `base` needs: the flash
/// kernels' (a bf16 base) or the probability-saving kernels', which save
/// and need the same whichever of them the GEMM math picks.
fn attention_sizing(base: BaseWeights) -> AttnKernels {
    base.attention_kernels((AttnKernels::F32, AttnKernels::F32))
        .1
}

/// Bytes of attention's q, k and v per layer for `c` on `base`.
fn attention_inputs(c: &ModelConfig, base: BaseWeights) -> usize {
    QkvBuffers::bytes_for(&attention_shape(c), attention_sizing(base))
}

/// Floats attention's forward saves per layer for `c` on `base`: the
/// probabilities, or the flash kernels' row log-sum-exps.
fn attention_saved(c: &ModelConfig, base: BaseWeights) -> usize {
    crate::ops::attention::saved_len(&attention_shape(c), attention_sizing(base))
}

/// Floats of attention's backward scratch for `c` on `base`.
fn attention_scratch(c: &ModelConfig, base: BaseWeights) -> usize {
    crate::ops::attention::backward_scratch_len(&attention_shape(c), attention_sizing(base))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_chunks_cover_every_row_once_in_order() {
        assert_eq!(head_chunks(1024), [(0, 512), (512, 512)]);
        assert_eq!(head_chunks(1000).last(), Some(&(512, 488)));
        assert_eq!(head_chunks(5), [(0, 5)]);
        assert!(head_chunks(0).is_empty());
        for t in [1, 255, 256, 257, 513, 4096] {
            let c = head_chunks(t);
            assert_eq!(c.iter().map(|&(_, n)| n).sum::<usize>(), t);
            assert!(
                c.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0),
                "{t}: {c:?}"
            );
            assert!(c.iter().all(|&(_, n)| n > 0 && n <= HEAD_CHUNK_ROWS));
        }
    }

    #[test]
    fn gate_and_up_of_an_nf4_base_share_one_target_in_place_of_their_own() {
        let c = ModelConfig::preset("qwen2.5-0.5b").unwrap();
        let (hh, ih) = (c.hidden * c.hidden, c.intermediate * c.hidden);
        assert_eq!(super::gate_up_targets(&c, vec![hh, ih]), vec![hh, 2 * ih]);
        assert!(super::gate_up_targets(&c, Vec::new()).is_empty());
    }
}
