//! One decoder layer of the training step as a type, [`DecoderLayer`], in the
//! shape of candle-transformers' Llama: an attention block and an MLP block,
//! each with its forward and its backward, each adding onto the residual
//! stream.
//!
//! ```text
//! attention  n1 = rmsnorm(x, g1); y = n1 [Wq; Wk; Wv; Aq; Av]^T (one GEMM);
//!            q = n1 Wq^T + s (n1 Aq^T) Bq^T, k = n1 Wk^T, v = n1 Wv^T + s (n1 Av^T) Bv^T;
//!            att = attention(rope(q), rope(k), v); x2 = x + att Wo^T
//! MLP        n2 = rmsnorm(x2, g2); x' = x2 + (silu(n2 Wg^T) * n2 Wu^T) Wd^T
//! backward   the MLP block, then the attention block; trainable gradients only
//!            (LoRA A, B of q, v; both norm weights):
//!            dB = s dy^T u, du = s dy B, dA = du^T n1, dn1 += du A
//! ```
//!
//! Every buffer is the [`Workspace`]'s: layer `l` reads `xs[l]`, keeps its
//! activations in `layers[l]` and writes `xs[l + 1]`; the scratch, gradient
//! and dequantisation buffers are shared by all layers. The residual gradient
//! `grads.dx` enters a layer's backward as the gradient of `xs[l + 1]` and
//! leaves it as that of `xs[l]`.

use std::ops::Range;

use cudarc::driver::{CudaSlice, CudaView};

use super::blas::{self, Mat, MatMut};
use super::kernels;
use super::weights::{GateUpWeight, LayerWeights, Linear};
use super::workspace::{Dact, GateUp, Grads, LayerActs, SavedNorm, Scratch, Workspace};
use crate::error::{Error, Result};
use crate::gpu::table::address;
use crate::gpu::{GemmMath, GpuContext, TensorTable};
use crate::model::{ModelConfig, Slot, Trainable};
use crate::ops::attention::{self, AttnKernels, AttnShape};
use crate::ops::cast::{Bf16, HalfFloat};
use crate::ops::gemm::{GemmOut, GemmSpec};
use crate::ops::launch::expect_len;
use crate::ops::nf4::Nf4Device;
use crate::ops::rope::{self, QkvShape};
use crate::ops::{activation, cast, nf4, rmsnorm};

/// What every layer's launches share within one pass: the model's shapes,
/// the GEMM math of each direction and the LoRA scale of each.
#[derive(Clone, Copy)]
pub(super) struct LayerCtx {
    pub c: ModelConfig,
    pub fwd: GemmMath,
    pub bwd: GemmMath,
    pub attn: AttnShape,
    /// The attention kernels of the forward and of the backward.
    pub attn_kernels: (AttnKernels, AttnKernels),
    /// The LoRA scale `s` of the forward.
    pub lora_s: f32,
    /// The scale the LoRA backward applies: `s` (`s^2` under the
    /// `lora_backward_scale_twice` fault).
    pub lora_s_bwd: f32,
}

/// One layer's trainable tensors, by their place in the trainer's list (the
/// layout of [`Trainable::tensors`], which the gradients share).
#[derive(Clone, Copy)]
struct LayerParams<'a> {
    layer: usize,
    p: &'a [CudaSlice<f32>],
}

impl<'a> LayerParams<'a> {
    /// Where `slot` of this layer sits in the tensor (and gradient) list.
    fn index(self, slot: Slot) -> usize {
        Trainable::index(self.layer, slot)
    }

    /// The tensor of `slot` of this layer.
    fn get(self, slot: Slot) -> &'a CudaSlice<f32> {
        &self.p[self.index(slot)]
    }
}

/// The norm weights of a layer, in the order of their slots of the RMSNorm
/// backward's workspace ([`norm_slot`]).
const NORMS: [Slot; 2] = [Slot::AttnNorm, Slot::MlpNorm];

/// Trainable norms of a model of `layers` layers: the slots of the RMSNorm
/// backward's workspace, whose partials are summed after the whole backward.
pub(super) fn norm_slots(layers: usize) -> usize {
    NORMS.len() * layers
}

/// The slot of `layer`'s norm weight `slot`: [`Slot::AttnNorm`]'s, or
/// [`Slot::MlpNorm`]'s for any other (the two of [`NORMS`], in order).
fn norm_slot(layer: usize, slot: Slot) -> usize {
    NORMS.len() * layer + usize::from(slot != Slot::AttnNorm)
}

/// What [`rmsnorm::BackwardWorkspace::sum_slots`] sums into: target
/// [`norm_slot`]`(l, s)` is the gradient of layer `l`'s norm `s` in `g` (the
/// trainer's gradients, which outlive the targets and never move).
pub(super) fn norm_grad_targets(
    gpu: &GpuContext,
    c: &ModelConfig,
    g: &[CudaSlice<f32>],
) -> Result<rmsnorm::DgammaTargets> {
    let mut targets = Vec::with_capacity(norm_slots(c.layers));
    for layer in 0..c.layers {
        for slot in NORMS {
            let grad = g
                .get(Trainable::index(layer, slot))
                .ok_or(Error::InvalidArgument {
                    op: "rmsnorm",
                    message: format!("no gradient of layer {layer}'s {slot:?}"),
                })?;
            targets.push(grad);
        }
    }
    rmsnorm::DgammaTargets::new(gpu, &targets, c.hidden)
}

/// Where each LoRA A tensor lies in a layer's q/k/v stack `[Wq; Wk; Wv; Aq;
/// Av]` (`[width, hidden]`, row-major): `Aq`'s elements, then `Av`'s.
fn lora_a_rows(c: &ModelConfig) -> [(Slot, Range<usize>); 2] {
    let r_len = c.lora_rank * c.hidden;
    let first = qkv_shape(c).u_col() * c.hidden;
    [Slot::QA, Slot::VA].map(|slot| {
        let at = first + if slot == Slot::QA { 0 } else { r_len };
        (slot, at..at + r_len)
    })
}

/// Where a base's own q/k/v stacks (`[Wq; Wk; Wv; Aq; Av]` a layer) take
/// the current LoRA A rows: for every layer, its `Aq` and `Av` (f32, in
/// `p`, the layout of [`Trainable::tensors`]), the last rows of its f32
/// stack (an fp32 base's), and of its 16-bit stack (the f16 copy under f16
/// projections, or a bf16 base's), which take their rounding. The forward
/// writes every layer's in one launch before the first layer
/// ([`LoraARows::write`]). NF4 bases keep no stack of their own and fill
/// the workspace's, layer by layer.
pub(super) struct LoraARows {
    /// Columns: the A tensor, its f32 copy, its 16-bit rounding (0 where a
    /// base has none).
    table: TensorTable,
    /// Whether the 16-bit stacks are bf16 (else f16, or none).
    bf16: bool,
}

/// One layer's own stacks, as [`LoraARows::new`] takes them.
pub(super) struct OwnStacks<'a> {
    pub f32: Option<&'a CudaSlice<f32>>,
    pub f16: Option<&'a CudaSlice<u16>>,
    pub bf16: Option<&'a CudaSlice<Bf16>>,
}

impl LoraARows {
    /// The table of `stacks` (layer by layer) and the A tensors in `p`;
    /// `None` where no layer has a stack of its own. The table holds
    /// addresses: `p` and the stacks must outlive it and never be
    /// reallocated.
    pub(super) fn new(
        gpu: &GpuContext,
        c: &ModelConfig,
        stacks: &[OwnStacks],
        p: &[CudaSlice<f32>],
    ) -> Result<Option<Self>> {
        if stacks.is_empty() {
            return Ok(None);
        }
        let mut columns = [Vec::new(), Vec::new(), Vec::new()];
        let mut lens = Vec::new();
        for (layer, own) in stacks.iter().enumerate() {
            let params = LayerParams { layer, p };
            for (slot, rows) in lora_a_rows(c) {
                let a = params.get(slot);
                expect_len("train", "a LoRA A tensor", a.len(), &[rows.len()])?;
                columns[0].push(address(gpu, a));
                columns[1].push(rows_address(gpu, own.f32, &rows)?);
                columns[2].push(match own.f16 {
                    Some(s) => rows_address(gpu, Some(s), &rows)?,
                    None => rows_address(gpu, own.bf16, &rows)?,
                });
                lens.push(rows.len());
            }
        }
        let bf16 = stacks.iter().any(|s| s.bf16.is_some());
        let table = TensorTable::new(gpu, &columns, &lens)?;
        Ok(Some(LoraARows { table, bf16 }))
    }

    /// Copies and rounds every layer's LoRA A rows into its stacks.
    pub(super) fn write(&self, gpu: &mut GpuContext) -> Result<()> {
        match self.bf16 {
            true => cast::copy_round_multi::<Bf16>(gpu, &self.table),
            false => cast::copy_round_multi::<u16>(gpu, &self.table),
        }
    }
}

/// The device address of the first of `rows` in `stack` (0 without a
/// stack), once the stack is known to hold them.
fn rows_address<T>(
    gpu: &GpuContext,
    stack: Option<&CudaSlice<T>>,
    rows: &Range<usize>,
) -> Result<u64> {
    let Some(s) = stack else { return Ok(0) };
    if s.len() < rows.end {
        return Err(Error::InvalidArgument {
            op: "train",
            message: format!("a q/k/v stack of {} values has no LoRA A rows", s.len()),
        });
    }
    Ok(address(gpu, s) + (std::mem::size_of::<T>() * rows.start) as u64)
}

/// One layer's q/k/v stacks for its forward, as the base keeps them: an
/// fp32 base's own f32 stack (with its f16 copy under f16 projections), a
/// bf16 stack, or none (NF4 computing in f32: the workspace's).
pub(super) struct Stacks<'s> {
    pub f32: Option<&'s mut CudaSlice<f32>>,
    pub f16: Option<&'s mut CudaSlice<u16>>,
    pub bf16: Option<BfStack<'s>>,
}

/// A layer's bf16 q/k/v stack: a bf16 base's own, or (NF4 computing in
/// bf16) the workspace's, which the layer dequantises into.
pub(super) enum BfStack<'s> {
    Own(&'s mut CudaSlice<Bf16>),
    Dequantised,
}

/// The stack the backward multiplies the q/k/v gradient by: f32 (an fp32
/// base's own; `None` for NF4, which dequantises again) or bf16 (a bf16
/// base's own; `None` for NF4 computing in bf16, which dequantises again).
pub(super) enum StackRef<'s> {
    F32(Option<&'s CudaSlice<f32>>),
    Bf16(Option<&'s CudaSlice<Bf16>>),
}

/// The workspace's buffers a frozen GEMM may need besides its operands:
/// the NF4 dequantisation targets (f32, or bf16) and the 16-bit copies of
/// its input (two for bf16: the second holds the residual gradient's
/// rounding and SwiGLU's `dgate | dup`).
pub(super) struct Stores<'w> {
    pub deq: &'w mut [CudaSlice<f32>],
    pub deq_bf16: &'w mut [CudaSlice<Bf16>],
    pub half: &'w mut Option<CudaSlice<u16>>,
    pub bf16: &'w mut Option<CudaSlice<Bf16>>,
    pub bf16_second: &'w mut Option<CudaSlice<Bf16>>,
}

/// [`Stores`] of `ws`, as disjoint borrows of its fields.
macro_rules! stores {
    ($ws:expr) => {
        Stores {
            deq: &mut $ws.deq,
            deq_bf16: &mut $ws.deq_bf16,
            half: &mut $ws.half_input,
            bf16: &mut $ws.bf16_input,
            bf16_second: &mut $ws.bf16_second_input,
        }
    };
}

/// One decoder layer: `x' = mlp(attention(x))`, each block adding onto the
/// residual stream.
pub(super) struct DecoderLayer<'a> {
    attn: Attention<'a>,
    mlp: Mlp<'a>,
}

impl<'a> DecoderLayer<'a> {
    /// Layer `layer` of the model: its frozen projections `w`, q/k/v bias
    /// `bias` (`[q_dim + 2 kv_dim]`), for an NF4 base its q/k/v rows as one
    /// NF4 tensor `qkv_nf4`, for a base computing in bf16 its `[Wg; Wu]` `gate_up`,
    /// and its trainable tensors in `p` (the layout of [`Trainable::tensors`]).
    pub(super) fn new(
        layer: usize,
        (w, bias, qkv_nf4): (&'a LayerWeights, &'a CudaSlice<f32>, Option<&'a Nf4Device>),
        gate_up: Option<&'a GateUpWeight>,
        p: &'a [CudaSlice<f32>],
    ) -> Self {
        let params = LayerParams { layer, p };
        DecoderLayer {
            attn: Attention {
                o: &w.o,
                qkv_nf4,
                bias,
                params,
            },
            mlp: Mlp {
                gate: &w.gate,
                up: &w.up,
                down: &w.down,
                gate_up,
                params,
            },
        }
    }

    /// Reads `xs[l]`, keeps the layer's activations and writes `xs[l + 1]`.
    /// `stacks` are the layer's own q/k/v stacks (none for NF4, which
    /// dequantises into the workspace's).
    pub(super) fn forward(
        &self,
        gpu: &mut GpuContext,
        ctx: &LayerCtx,
        ws: &mut Workspace,
        stacks: Stacks,
    ) -> Result<()> {
        self.attn.forward(gpu, ctx, ws, stacks)?;
        self.mlp.forward(gpu, ctx, ws)
    }

    /// Turns `grads.dx` from the gradient of `xs[l + 1]` into that of
    /// `xs[l]`, writing the layer's LoRA gradients into `g` and its norm
    /// weights' partial sums into their slots of `grads.norm` (summed into
    /// `g` by the step once every layer's backward has run).
    pub(super) fn backward(
        &self,
        gpu: &mut GpuContext,
        ctx: &LayerCtx,
        ws: &mut Workspace,
        stack: StackRef,
        g: &mut [CudaSlice<f32>],
    ) -> Result<()> {
        self.mlp.backward(gpu, ctx, ws)?;
        self.attn.backward(gpu, ctx, ws, stack, g)
    }
}

/// The attention block: `x2 = x + o(attention(rope(q), rope(k), v))` of
/// `n1 = rmsnorm(x, g1)`, with LoRA on q and v.
///
/// q, k, v and both LoRA down-projections are one GEMM against the layer's
/// stack `S = [Wq; Wk; Wv; Aq; Av]`: `y = n1 S^T` (`[T, width]`, columns
/// `q | k | v | uq | uv`, [`QkvShape`]). The LoRA up-projections and RoPE are
/// that GEMM's epilogue kernel ([`rope::qkv_forward`]); in the backward its
/// mirror writes `dy = dq | dk | dv | duq | duv`, so `dn1 = dy S` is again one
/// GEMM.
struct Attention<'a> {
    o: &'a Linear,
    /// An NF4 base's `[Wq; Wk; Wv]` as one NF4 tensor (the other bases keep
    /// their stacks whole, [`Stacks`]).
    qkv_nf4: Option<&'a Nf4Device>,
    /// The frozen `[b_q | b_k | b_v]` (zeros for a model without one).
    bias: &'a CudaSlice<f32>,
    params: LayerParams<'a>,
}

impl Attention<'_> {
    /// `n1 = rmsnorm(x, g1)`; `y = n1 S^T`; `qr, kr, v` from `y`;
    /// `att = attention(qr, kr, v)`; `x2 = x + att Wo^T`. With an f16 or a
    /// bf16 stack, `y` is the product of 16-bit copies of `n1` and `S`.
    fn forward(
        &self,
        gpu: &mut GpuContext,
        ctx: &LayerCtx,
        ws: &mut Workspace,
        stacks: Stacks,
    ) -> Result<()> {
        let c = &ctx.c;
        let (rows, h) = (c.tokens(), c.hidden);
        let eps = ctx.c.rms_eps;
        let l = self.params.layer;
        let gamma = self.params.get(Slot::AttnNorm);
        let norm_in = (&ws.xs[l], gamma);
        let a = &mut ws.layers[l];
        let sh = qkv_shape(c);
        let spec = GemmSpec::linear(rows, h, sh.width());
        if let Some(bf) = stacks.bf16 {
            let s = match bf {
                // Its LoRA A rows were rounded in before the first layer
                // ([`LoraARows`]).
                BfStack::Own(s) => s,
                BfStack::Dequantised => self.dequantised_bf16_stack(gpu, c, &mut ws.stack_bf16)?,
            };
            // x2 = x as the norm reads it; the o projection adds onto it.
            let out = (&mut a.n1, &mut a.x2);
            let n1 = norm_to_bf16(gpu, ctx, norm_in, out, &mut ws.bf16_input)?;
            blas::gemm_half(gpu, spec, 1.0, &n1, &*s, 0.0, &mut ws.qkv)?;
        } else {
            let (x, gamma) = (norm_in.0.as_view(), norm_in.1.as_view());
            rmsnorm::forward(gpu, &x, &gamma, rows, h, eps, &mut a.n1.as_view_mut())?;
            // An fp32 base's own stacks (and their f16 copies) took their
            // LoRA A rows before the first layer ([`LoraARows`]).
            let stack = match stacks.f32 {
                Some(own) => &*own,
                None => self.dequantised_stack(gpu, c, &mut ws.stack)?,
            };
            let a = &mut ws.layers[l];
            gpu.stream().memcpy_dtod(&ws.xs[l], &mut a.x2)?;
            match stacks.f16 {
                Some(s16) => {
                    let n1 = half_of(gpu, &a.n1, &mut ws.half_input)?;
                    blas::gemm_half(gpu, spec, 1.0, &n1, s16, 0.0, &mut ws.qkv)?;
                }
                None => blas::gemm(gpu, ctx.fwd, spec, 1.0, &a.n1, stack, 0.0, &mut ws.qkv)?,
            }
        }
        let a = &mut ws.layers[l];
        let pi = |slot: Slot| self.params.get(slot);
        rope::qkv_forward(
            gpu,
            &sh,
            (&ws.qkv, self.bias),
            (pi(Slot::QB), pi(Slot::VB), ctx.lora_s),
            &ws.rope_table,
            a.attn_in.as_out(),
            &mut a.u,
        )?;
        let mut stores = stores!(ws);
        self.attend_and_project(gpu, ctx, a, &mut stores)
    }

    /// `att = attention(qr, kr, v)` and `x2 += att Wo^T` (`x2` holds `x`).
    /// On the bf16 flash kernels the o projection's bf16 operand comes from
    /// attention's own pass, not from a cast of its output.
    fn attend_and_project(
        &self,
        gpu: &mut GpuContext,
        ctx: &LayerCtx,
        a: &mut LayerActs,
        stores: &mut Stores,
    ) -> Result<()> {
        if ctx.attn_kernels.0 == AttnKernels::Bf16 && self.o.half.is_none() {
            if let Some(w) = Workspace::bf16_weight(stores.deq_bf16, gpu, self.o)? {
                let len = a.att.len();
                attention::forward_with_bf16(
                    gpu,
                    a.attn_in.as_qkv(),
                    &mut a.att,
                    &mut front_mut(stores.bf16, len)?,
                    &mut a.attn_saved,
                    &ctx.attn,
                )?;
                let att16 = front(stores.bf16, len)?;
                let spec = linear_spec(self.o, len);
                return blas::gemm_half(gpu, spec, 1.0, &att16, &w, 1.0, &mut a.x2);
            }
        }
        attention::forward(
            gpu,
            ctx.attn_kernels.0,
            a.attn_in.as_qkv(),
            &mut a.att,
            &mut a.attn_saved,
            &ctx.attn,
        )?;
        forward_linear(gpu, ctx.fwd, stores, self.o, &a.att, 1.0, &mut a.x2)
    }

    /// An NF4 base's q, k, v dequantised to bf16 into the rows of the
    /// workspace's shared stack `shared` and the current LoRA A rows
    /// rounded in after them, in one launch: the stack of a base that
    /// computes in bf16 but keeps no bf16 copy of its weights.
    fn dequantised_bf16_stack<'s>(
        &self,
        gpu: &mut GpuContext,
        c: &ModelConfig,
        shared: &'s mut Option<CudaSlice<Bf16>>,
    ) -> Result<&'s mut CudaSlice<Bf16>> {
        let s = shared.as_mut().ok_or_else(|| Error::InvalidArgument {
            op: "train",
            message: "an NF4 base computing in bf16 needs the workspace's bf16 q/k/v stack".into(),
        })?;
        let [(aq, _), (av, _)] = lora_a_rows(c);
        let rows = (self.params.get(aq), self.params.get(av));
        nf4::dequantize_bf16_stack(gpu, self.nf4_stack()?, rows, s)?;
        Ok(s)
    }

    /// The layer's q/k/v rows as one NF4 tensor: an NF4 base's.
    fn nf4_stack(&self) -> Result<&Nf4Device> {
        self.qkv_nf4.ok_or_else(|| Error::InvalidArgument {
            op: "train",
            message: "a dequantised q/k/v stack needs the layer's NF4 q/k/v rows".into(),
        })
    }

    /// An NF4 base's stack `S = [Wq; Wk; Wv; Aq; Av]` for this layer: its
    /// q, k, v dequantised into the workspace's shared `shared`, then the
    /// current LoRA A rows copied in (an fp32 base's own stacks take theirs
    /// in one launch, [`LoraARows`]).
    fn dequantised_stack<'s>(
        &self,
        gpu: &mut GpuContext,
        c: &ModelConfig,
        shared: &'s mut Option<CudaSlice<f32>>,
    ) -> Result<&'s CudaSlice<f32>> {
        let stack = shared.as_mut().ok_or_else(|| Error::InvalidArgument {
            op: "train",
            message: "an NF4 base needs the workspace's q/k/v stack".into(),
        })?;
        nf4::dequantize_into(gpu, self.nf4_stack()?, stack, 0)?;
        for (slot, rows) in lora_a_rows(c) {
            let mut dst = stack.slice_mut(rows);
            gpu.stream().memcpy_dtod(self.params.get(slot), &mut dst)?;
        }
        Ok(stack)
    }

    /// The backward of [`Attention::forward`]: `dx` (the gradient of `x2`)
    /// through o, attention, RoPE and the projections into `dn1`, then
    /// `dx += rmsnorm'(dn1)`, with the gradient of `g1`.
    fn backward(
        &self,
        gpu: &mut GpuContext,
        ctx: &LayerCtx,
        ws: &mut Workspace,
        stack: StackRef,
        g: &mut [CudaSlice<f32>],
    ) -> Result<()> {
        let c = &ctx.c;
        let bwd = ctx.bwd;
        let l = self.params.layer;
        // Attention branch: x2 = x + o(attention(rope(q), rope(k), v)).
        let d = &mut ws.grads;
        let mut stores = stores!(ws);
        let (dx, datt) = (&d.dx, &mut d.datt);
        input_grad(
            gpu,
            bwd,
            &mut stores,
            self.o,
            (dx, datt),
            0.0,
            Bf16Dy::InSecond,
        )?;
        let (a, d) = (&ws.layers[l], &mut ws.grads);
        attention::backward(
            gpu,
            ctx.attn_kernels.1,
            a.attn_in.as_qkv(),
            &a.att,
            &a.attn_saved,
            &d.datt,
            &mut d.attn,
            (&mut d.dqr, &mut d.dkr, &mut d.dv),
            &ctx.attn,
        )?;
        self.qkv_input_grad(gpu, ctx, ws, stack, g)?;
        let d = &mut ws.grads;
        let inputs = (&ws.xs[l], self.params.get(Slot::AttnNorm), &d.dn1);
        let dgamma = rmsnorm::Dgamma::Slot(norm_slot(l, Slot::AttnNorm));
        let second = &mut ws.bf16_second_input;
        norm_backward(
            gpu,
            c,
            inputs,
            (&mut d.dx, true, second),
            dgamma,
            &mut d.norm,
        )
    }

    /// `dn1 = dy S` through the q/k/v stack `S`, from attention's gradients
    /// of q, k (after RoPE) and v: `dy` (kept in `dqkv` for the LoRA
    /// gradients) is their fused epilogue's backward, with its bf16 rounding
    /// written in the same pass for a bf16 stack.
    fn qkv_input_grad(
        &self,
        gpu: &mut GpuContext,
        ctx: &LayerCtx,
        ws: &mut Workspace,
        stack: StackRef,
        g: &mut [CudaSlice<f32>],
    ) -> Result<()> {
        let c = &ctx.c;
        let (rows, h, bwd) = (c.tokens(), c.hidden, ctx.bwd);
        // The layer above's LoRA gradients (on the side stream) read `dqkv`,
        // which the epilogue's backward below overwrites.
        gpu.join_side_stream()?;
        let d = &mut ws.grads;
        let sh = qkv_shape(c);
        let pi = |slot: Slot| self.params.get(slot);
        let grads_in = (&d.dqr, &d.dkr, &d.dv);
        let lora = (pi(Slot::QB), pi(Slot::VB), ctx.lora_s_bwd);
        let dims = (rows, h, sh.width());
        let l = self.params.layer;
        match stack {
            StackRef::Bf16(own) => {
                // dy and its bf16 rounding, the stack GEMM's operand, in one pass.
                let n = rows * sh.width();
                let mut dy16 = front_mut(&mut ws.bf16_input, n)?;
                let table = &ws.rope_table;
                let dy = &mut d.dqkv;
                rope::qkv_backward_with_bf16(gpu, &sh, grads_in, lora, table, dy, &mut dy16)?;
                self.lora_backward(gpu, ctx, &ws.layers[l], &mut ws.grads, g)?;
                let s = match own {
                    Some(s) => s,
                    None => &*self.dequantised_bf16_stack(gpu, c, &mut ws.stack_bf16)?,
                };
                let dy16 = front(&ws.bf16_input, n)?;
                let spec = GemmSpec::linear_dx(rows, h, sh.width());
                blas::gemm_half(gpu, spec, 1.0, &dy16, s, 0.0, &mut ws.grads.dn1)?;
            }
            StackRef::F32(stack) => {
                let table = &ws.rope_table;
                rope::qkv_backward(gpu, &sh, grads_in, lora, table, &mut d.dqkv)?;
                self.lora_backward(gpu, ctx, &ws.layers[l], &mut ws.grads, g)?;
                let stack = match stack {
                    Some(s) => s,
                    None => self.dequantised_stack(gpu, c, &mut ws.stack)?,
                };
                let d = &mut ws.grads;
                blas::linear_dx(gpu, bwd, 1.0, &d.dqkv, stack, 0.0, &mut d.dn1, dims)?;
            }
        }
        Ok(())
    }

    /// The LoRA weight gradients of q and v, with `u = n1 A^T` and `du = s dy
    /// B` read from the columns of the fused output and its gradient:
    /// `dB = s dy^T u`, `dA = du^T n1` (`dn1 += du A` is part of `dy S`). In
    /// TF32 math on a device with TF32 tensor cores, all four by one pair of
    /// kernels ([`kernels::lora_grads_tf32`]); else four cuBLAS GEMMs.
    fn lora_backward(
        &self,
        gpu: &mut GpuContext,
        ctx: &LayerCtx,
        a: &LayerActs,
        d: &mut Grads,
        g: &mut [CudaSlice<f32>],
    ) -> Result<()> {
        if ctx.bwd != GemmMath::Tf32 || !kernels::lora_grads_tf32_runs(gpu) {
            return self.lora_backward_cublas(gpu, ctx, a, d, g);
        }
        let slots = [Slot::QB, Slot::VB, Slot::QA, Slot::VA].map(|s| self.params.index(s));
        let [dbq, dbv, daq, dav] =
            g.get_disjoint_mut(slots)
                .map_err(|e| Error::InvalidArgument {
                    op: "train",
                    message: format!("the LoRA gradients of layer {}: {e}", self.params.layer),
                })?;
        let out = kernels::LoraGrads { dbq, dbv, daq, dav };
        let dims = (&qkv_shape(&ctx.c), ctx.c.hidden, ctx.lora_s_bwd);
        let inputs = (&a.u, &d.dqkv, &a.n1);
        let scratch = &mut d.lora;
        gpu.on_side_stream(|gpu| kernels::lora_grads_tf32(gpu, dims, inputs, scratch, out))
    }

    /// [`Attention::lora_backward`] as four cuBLAS GEMMs in `ctx.bwd` math.
    fn lora_backward_cublas(
        &self,
        gpu: &GpuContext,
        ctx: &LayerCtx,
        a: &LayerActs,
        d: &Grads,
        g: &mut [CudaSlice<f32>],
    ) -> Result<()> {
        let c = &ctx.c;
        let (rows, h, r) = (c.tokens(), c.hidden, c.lora_rank);
        let (bwd, s_bwd) = (ctx.bwd, ctx.lora_s_bwd);
        let sh = qkv_shape(c);
        let width = sh.width();
        let idx = |slot: Slot| self.params.index(slot);
        let u_col = sh.u_col();
        for (i, (y_col, out, sa, sb)) in [
            (0, sh.q_dim(), Slot::QA, Slot::QB),
            (sh.q_dim() + sh.kv_dim(), sh.kv_dim(), Slot::VA, Slot::VB),
        ]
        .into_iter()
        .enumerate()
        {
            let col = |buf, offset| Mat {
                buf,
                offset,
                ld: width,
            };
            let u = Mat {
                buf: &a.u,
                offset: i * r,
                ld: 2 * r,
            };
            let (dy, du) = (col(&d.dqkv, y_col), col(&d.dqkv, u_col + i * r));
            let db = MatMut::packed(&mut g[idx(sb)], r);
            let spec = GemmSpec::linear_dw(rows, r, out);
            blas::gemm_blocks(gpu, bwd, spec, s_bwd, dy, u, 0.0, db)?;
            let da = MatMut::packed(&mut g[idx(sa)], h);
            let spec = GemmSpec::linear_dw(rows, h, r);
            blas::gemm_blocks(gpu, bwd, spec, 1.0, du, Mat::packed(&a.n1, h), 0.0, da)?;
        }
        Ok(())
    }
}

/// Where an input-gradient GEMM of a bf16 `W` finds `dy` rounded to bf16.
#[derive(Clone, Copy)]
enum Bf16Dy {
    /// Rounded here, into the front of the workspace's bf16 input.
    RoundHere,
    /// The residual-stream gradient: the block before left its rounding in
    /// the front of the second bf16 buffer ([`accumulate_residual`], or the
    /// head's backward, [`residual_grad_to_bf16`]).
    InSecond,
}

/// `dx[rows, in] = dy[rows, out] W + beta dx` for the frozen `lin` (`W`
/// `[out, in]`, `rows = dy.len() / out`): through the kept `W^T` when `lin`
/// has one, as `dy (W^T)^T` (both operands K-major, as in the forward), else
/// through `W` (dequantised first for an NF4 base; always `W` under the
/// `transposed_weights_ignored` fault). A bf16 `W` is multiplied by `dy`
/// rounded to bf16, found as `bf16_dy` says.
fn input_grad(
    gpu: &mut GpuContext,
    math: GemmMath,
    stores: &mut Stores,
    lin: &Linear,
    (dy, dx): (&CudaSlice<f32>, &mut CudaSlice<f32>),
    beta: f32,
    bf16_dy: Bf16Dy,
) -> Result<()> {
    let (out_dim, in_dim) = (lin.out_dim, lin.in_dim);
    let rows = dy.len() / out_dim;
    let kept = lin.transposed.as_ref();
    if let Some(wt) = kept.filter(|_| !gpu.faults().transposed_weights_ignored) {
        return blas::linear(gpu, math, 1.0, dy, wt, beta, dx, (rows, out_dim, in_dim));
    }
    if let Some(w) = Workspace::bf16_weight(stores.deq_bf16, gpu, lin)? {
        let dy16 = match bf16_dy {
            Bf16Dy::RoundHere => half_of(gpu, dy, stores.bf16)?,
            Bf16Dy::InSecond => front(stores.bf16_second, dy.len())?,
        };
        return bf16_input_grad(gpu, lin, &w, &dy16, beta, dx);
    }
    let w = Workspace::weight(stores.deq, gpu, lin)?;
    blas::linear_dx(gpu, math, 1.0, dy, w, beta, dx, (rows, in_dim, out_dim))
}

/// [`Workspace::bf16_weight`] of a projection that a bf16 step must read in
/// bf16.
fn bf16_weight_of<'a>(
    gpu: &mut GpuContext,
    deq_bf16: &'a mut [CudaSlice<Bf16>],
    lin: &'a Linear,
) -> Result<CudaView<'a, Bf16>> {
    Workspace::bf16_weight(deq_bf16, gpu, lin)?.ok_or_else(gate_up_mismatch)
}

/// `dx = dy16 W + beta dx` for the bf16 `W` (`w`) of `lin`, `dy16` already
/// rounded to bf16; `dx` f32, or bf16 (rounded once at the store).
fn bf16_input_grad<C: GemmOut>(
    gpu: &mut GpuContext,
    lin: &Linear,
    w: &CudaView<'_, Bf16>,
    dy16: &CudaView<'_, Bf16>,
    beta: f32,
    dx: &mut CudaSlice<C>,
) -> Result<()> {
    let spec = GemmSpec::linear_dx(dy16.len() / lin.out_dim, lin.in_dim, lin.out_dim);
    blas::gemm_half(gpu, spec, 1.0, dy16, w, beta, dx)
}

/// `rmsnorm'(dn)` of input `x` and weight `gamma` into `dx` (added onto it
/// when `onto`), its weight gradient as `dgamma` says (a layer's into its
/// slot of `ws`, summed after the whole backward); with a bf16 base (which
/// has the second bf16 buffer `second`) also `dx`'s bf16 rounding into its
/// front, for the next block's first [`input_grad`] ([`Bf16Dy::InSecond`]).
/// The final norm writes the top layer's residual gradient this way
/// ([`super::step`]'s head); each block's norm adds onto it, in the same
/// pass as its backward.
pub(super) fn norm_backward(
    gpu: &mut GpuContext,
    c: &ModelConfig,
    (x, gamma, dn): (&CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>),
    (dx, onto, second): (&mut CudaSlice<f32>, bool, &mut Option<CudaSlice<Bf16>>),
    dgamma: rmsnorm::Dgamma<'_, '_>,
    ws: &mut rmsnorm::BackwardWorkspace,
) -> Result<()> {
    let n = dx.len();
    let mut dx16 = match second {
        Some(_) => Some(front_mut(second, n)?),
        None => None,
    };
    let out = rmsnorm::DxOut {
        dx: &mut dx.as_view_mut(),
        onto,
        dx16: dx16.as_mut(),
    };
    let inputs = (&x.as_view(), &gamma.as_view(), &dn.as_view());
    let shape = (c.tokens(), c.hidden, c.rms_eps);
    rmsnorm::backward_to(gpu, inputs, shape, out, dgamma, ws)
}

/// `y = x W^T + beta y` of the frozen `lin`'s forward (`W` `[out, in]`, `x`
/// `[rows, in]`): on f16 operands when `lin` keeps an f16 copy of `W` (`x`
/// cast into the workspace's f16 input first), on bf16 operands for a bf16
/// `W` (likewise), else `W` in `math` (dequantised first for an NF4 base).
fn forward_linear(
    gpu: &mut GpuContext,
    math: GemmMath,
    stores: &mut Stores,
    lin: &Linear,
    x: &CudaSlice<f32>,
    beta: f32,
    y: &mut CudaSlice<f32>,
) -> Result<()> {
    let spec = linear_spec(lin, x.len());
    if let Some(w16) = &lin.half {
        let x16 = half_of(gpu, x, stores.half)?;
        return blas::gemm_half(gpu, spec, 1.0, &x16, w16, beta, y);
    }
    if let Some(w) = Workspace::bf16_weight(stores.deq_bf16, gpu, lin)? {
        let x16 = half_of(gpu, x, stores.bf16)?;
        return blas::gemm_half(gpu, spec, 1.0, &x16, &w, beta, y);
    }
    let w = Workspace::weight(stores.deq, gpu, lin)?;
    let dims = (x.len() / lin.in_dim, lin.in_dim, lin.out_dim);
    blas::linear(gpu, math, 1.0, x, w, beta, y, dims)
}

/// The forward product `x W^T` of `lin` for an input of `x_len` elements
/// (`x_len / in_dim` rows; a length that is no whole number of rows fails
/// the GEMM's shape check).
fn linear_spec(lin: &Linear, x_len: usize) -> GemmSpec {
    GemmSpec::linear(x_len / lin.in_dim, lin.in_dim, lin.out_dim)
}

/// `x` rounded to the 16-bit format `H` into the front of `half` (the
/// workspace's [`Workspace::half_input`] or [`Workspace::bf16_input`]), as
/// a view of `x.len()` elements.
pub(super) fn half_of<'h, H: HalfFloat>(
    gpu: &mut GpuContext,
    x: &CudaSlice<f32>,
    half: &'h mut Option<CudaSlice<H>>,
) -> Result<CudaView<'h, H>> {
    cast::f32_to_half(gpu, &x.as_view(), &mut front_mut(half, x.len())?)?;
    front(half, x.len())
}

/// The first `len` elements of a workspace's 16-bit input buffer, to write
/// a GEMM's operand into.
pub(super) fn front_mut<H: HalfFloat>(
    half: &mut Option<CudaSlice<H>>,
    len: usize,
) -> Result<cudarc::driver::CudaViewMut<'_, H>> {
    half.as_mut()
        .and_then(|b| b.try_slice_mut(0..len))
        .ok_or_else(|| no_input_buffer::<H>(len))
}

/// The first `len` elements of a workspace's 16-bit input buffer, as the
/// GEMM reads them.
pub(super) fn front<H: HalfFloat>(
    half: &Option<CudaSlice<H>>,
    len: usize,
) -> Result<CudaView<'_, H>> {
    half.as_ref()
        .and_then(|b| b.try_slice(0..len))
        .ok_or_else(|| no_input_buffer::<H>(len))
}

/// The error of a workspace without a 16-bit input buffer of `len` elements.
fn no_input_buffer<H: HalfFloat>(len: usize) -> Error {
    Error::InvalidArgument {
        op: "train",
        message: format!(
            "no {} input buffer of {len} elements in the workspace",
            H::NAME
        ),
    }
}

/// `n = rmsnorm(x) * gamma` into `n` (kept for the backward) and its bf16
/// rounding into the front of `bf16` (a bf16 base's input buffer), which the
/// GEMM after it reads: one kernel instead of a norm and a cast.
fn norm_to_bf16<'h>(
    gpu: &mut GpuContext,
    ctx: &LayerCtx,
    (x, gamma): (&CudaSlice<f32>, &CudaSlice<f32>),
    (n, x_copy): (&mut CudaSlice<f32>, &mut CudaSlice<f32>),
    bf16: &'h mut Option<CudaSlice<Bf16>>,
) -> Result<CudaView<'h, Bf16>> {
    let (rows, h) = (ctx.c.tokens(), ctx.c.hidden);
    let (x, gamma) = (x.as_view(), gamma.as_view());
    let mut n16 = front_mut(bf16, rows * h)?;
    let eps = ctx.c.rms_eps;
    let out = (&mut n.as_view_mut(), &mut n16);
    let copy = Some(&mut x_copy.as_view_mut());
    rmsnorm::forward_with_bf16(gpu, &x, &gamma, rows, h, eps, out, copy)?;
    front(bf16, rows * h)
}

/// `rmsnorm(x, gamma)` rounded to bf16 alone (nothing reads its f32
/// values): into `saved` when the layer keeps it, else into the front of
/// the workspace's bf16 input; the GEMM operand. `x` is copied into
/// `x_copy` in the same pass.
fn norm_bf16_only<'h>(
    gpu: &mut GpuContext,
    ctx: &LayerCtx,
    (x, gamma, x_copy): (&CudaSlice<f32>, &CudaSlice<f32>, &mut CudaSlice<f32>),
    saved: Option<&'h mut CudaSlice<Bf16>>,
    bf16: &'h mut Option<CudaSlice<Bf16>>,
) -> Result<CudaView<'h, Bf16>> {
    let dims = (ctx.c.tokens(), ctx.c.hidden);
    let inputs = (&x.as_view(), &gamma.as_view());
    let eps = ctx.c.rms_eps;
    let copy = Some(&mut x_copy.as_view_mut());
    match saved {
        Some(n) => {
            rmsnorm::forward_bf16(gpu, inputs, dims, eps, &mut n.as_view_mut(), copy)?;
            Ok(n.as_view())
        }
        None => {
            let n = dims.0 * dims.1;
            rmsnorm::forward_bf16(gpu, inputs, dims, eps, &mut front_mut(bf16, n)?, copy)?;
            front(bf16, n)
        }
    }
}

/// The fused q/k/v projection's layout for `c`.
pub(crate) fn qkv_shape(c: &ModelConfig) -> QkvShape {
    QkvShape {
        rows: c.tokens(),
        seq: c.seq_len,
        heads: c.heads,
        kv_heads: c.kv_heads,
        head_dim: c.head_dim,
        rank: c.lora_rank,
    }
}

/// The MLP block: `x' = x2 + (silu(n2 Wg^T) * n2 Wu^T) Wd^T` of
/// `n2 = rmsnorm(x2, g2)`.
struct Mlp<'a> {
    gate: &'a Linear,
    up: &'a Linear,
    down: &'a Linear,
    /// `[Wg; Wu]` of a base computing in bf16
    /// ([`super::weights::BaseDevice::gate_up`]).
    gate_up: Option<&'a GateUpWeight>,
    params: LayerParams<'a>,
}

impl Mlp<'_> {
    /// `n2 = rmsnorm(x2, g2)`; `x' = x2 + (silu(n2 Wg^T) * n2 Wu^T) Wd^T`
    /// into `xs[l + 1]`; gate and up kept only when the workspace keeps them.
    /// A bf16 base runs it on bf16 from end to end: `n2`'s rounding, gate and
    /// up as the GEMM stores them, the product as the down GEMM reads it.
    fn forward(&self, gpu: &mut GpuContext, ctx: &LayerCtx, ws: &mut Workspace) -> Result<()> {
        let c = &ctx.c;
        let (rows, h) = (c.tokens(), c.hidden);
        let (eps, fwd) = (ctx.c.rms_eps, ctx.fwd);
        let l = self.params.layer;
        let a = &mut ws.layers[l];
        let x_next = &mut ws.xs[l + 1];
        let Scratch {
            gate_up,
            act,
            n2: scratch_n2,
        } = &mut ws.scratch;
        let gamma = self.params.get(Slot::MlpNorm);
        let gate_up = a.mlp.as_mut().unwrap_or(gate_up);
        let mut stores = stores!(ws);
        match gate_up {
            GateUp::Bf16(gu) => {
                let saved = match &mut a.n2 {
                    Some(SavedNorm::Bf16(n)) => Some(n),
                    Some(SavedNorm::F32(_)) => return Err(gate_up_mismatch()),
                    None => None,
                };
                // x' = x2 as the norm reads it; the down projection adds onto it.
                let inputs = (&a.x2, gamma, &mut *x_next);
                let n2 = norm_bf16_only(gpu, ctx, inputs, saved, stores.bf16)?;
                self.gate_up_bf16(gpu, stores.deq_bf16, &n2, gu)?;
                let n = gu.len() / 2;
                let mut act = front_mut(stores.bf16, n)?;
                activation::swiglu_forward_bf16(gpu, &gu.as_view(), c.intermediate, &mut act)?;
                let spec = linear_spec(self.down, n);
                let wd = bf16_weight_of(gpu, stores.deq_bf16, self.down)?;
                let act = front(stores.bf16, n)?;
                blas::gemm_half(gpu, spec, 1.0, &act, &wd, 1.0, x_next)
            }
            GateUp::F32(gate, up) => {
                let n2 = match &mut a.n2 {
                    Some(SavedNorm::F32(n)) => n,
                    Some(SavedNorm::Bf16(_)) => return Err(gate_up_mismatch()),
                    None => scratch_n2.as_mut().ok_or_else(gate_up_mismatch)?,
                };
                let (x2, g2) = (a.x2.as_view(), gamma.as_view());
                rmsnorm::forward(gpu, &x2, &g2, rows, h, eps, &mut n2.as_view_mut())?;
                self.gate_up_f32(gpu, fwd, &mut stores, n2, (gate, up))?;
                let act = act.as_mut().ok_or_else(gate_up_mismatch)?;
                gpu.stream().memcpy_dtod(&a.x2, x_next)?;
                activation::swiglu_forward(
                    gpu,
                    &gate.as_view(),
                    &up.as_view(),
                    &mut act.as_view_mut(),
                )?;
                forward_linear(gpu, fwd, &mut stores, self.down, act, 1.0, x_next)
            }
        }
    }

    /// The backward's recomputation of the MLP's input projections `gate =
    /// n2 Wg^T`, `up = n2 Wu^T` into `gate_up` when they are not kept,
    /// exactly as the forward computed them, from the norm it kept: f32, or
    /// with a bf16 base the bf16 operand itself.
    fn gate_up(
        &self,
        gpu: &mut GpuContext,
        math: GemmMath,
        stores: &mut Stores,
        n2: &SavedNorm,
        gate_up: &mut GateUp,
    ) -> Result<()> {
        match (n2, gate_up) {
            (SavedNorm::Bf16(n2), GateUp::Bf16(gu)) => {
                self.gate_up_bf16(gpu, stores.deq_bf16, &n2.as_view(), gu)
            }
            (SavedNorm::F32(n2), GateUp::F32(gate, up)) => {
                self.gate_up_f32(gpu, math, stores, n2, (gate, up))
            }
            _ => Err(gate_up_mismatch()),
        }
    }

    /// The input projections on bf16 operands, from `n2` already rounded to
    /// bf16, stored in bf16: `gu = n2 [Wg; Wu]^T`, one GEMM writing `gate |
    /// up` in each row.
    fn gate_up_bf16(
        &self,
        gpu: &mut GpuContext,
        deq_bf16: &mut [CudaSlice<Bf16>],
        n2: &CudaView<'_, Bf16>,
        gu: &mut CudaSlice<Bf16>,
    ) -> Result<()> {
        let w = self.gate_up_weight(gpu, deq_bf16)?;
        let (h, out) = (self.gate.in_dim, self.gate.out_dim + self.up.out_dim);
        let spec = GemmSpec::linear(n2.len() / h, h, out);
        blas::gemm_half(gpu, spec, 1.0, n2, &w, 0.0, gu)
    }

    /// `[Wg; Wu]` in bf16: a bf16 base's own, or an NF4 base's dequantised.
    fn gate_up_weight<'w>(
        &'w self,
        gpu: &mut GpuContext,
        deq_bf16: &'w mut [CudaSlice<Bf16>],
    ) -> Result<CudaView<'w, Bf16>> {
        match self.gate_up {
            Some(GateUpWeight::Bf16(own)) => Ok(own.as_view()),
            Some(GateUpWeight::Nf4(t)) => Workspace::gate_up_bf16_weight(deq_bf16, gpu, t),
            None => Err(gate_up_mismatch()),
        }
    }

    /// [`Mlp::gate_up`] into f32 gate and up: on the f16 copies of `Wg` and
    /// `Wu` when both keep one, else with GEMM math `math`.
    fn gate_up_f32(
        &self,
        gpu: &mut GpuContext,
        math: GemmMath,
        stores: &mut Stores,
        n2: &CudaSlice<f32>,
        (gate, up): (&mut CudaSlice<f32>, &mut CudaSlice<f32>),
    ) -> Result<()> {
        if let (Some(wg), Some(wu)) = (&self.gate.half, &self.up.half) {
            let n2 = half_of(gpu, n2, stores.half)?;
            for (lin, w, out) in [(self.gate, wg, gate), (self.up, wu, up)] {
                blas::gemm_half(gpu, linear_spec(lin, n2.len()), 1.0, &n2, w, 0.0, out)?;
            }
            return Ok(());
        }
        forward_linear(gpu, math, stores, self.gate, n2, 0.0, gate)?;
        forward_linear(gpu, math, stores, self.up, n2, 0.0, up)
    }

    /// The backward of [`Mlp::forward`]: `dx` (the gradient of `x'`) through
    /// down, SwiGLU, gate and up into `dn2`, then `dx += rmsnorm'(dn2)`, with
    /// the partial sums of `g2`'s gradient in its slot of `grads.norm`.
    fn backward(&self, gpu: &mut GpuContext, ctx: &LayerCtx, ws: &mut Workspace) -> Result<()> {
        let (c, bwd) = (&ctx.c, ctx.bwd);
        let a = &ws.layers[self.params.layer];
        let d = &mut ws.grads;
        let mut stores = stores!(ws);
        let gate_up = self.saved_gate_up(gpu, ctx, a, &mut ws.scratch.gate_up, &mut stores)?;
        match (gate_up, &mut d.dact) {
            (GateUp::Bf16(gu), Dact::Bf16(dact)) => {
                // dact = dx' Wd stored in bf16 from the residual gradient's
                // bf16 rounding; dgate | dup go straight to bf16, the
                // operand of one GEMM of [Wg; Wu].
                let dy16 = front(stores.bf16_second, d.dx.len())?;
                let wd = bf16_weight_of(gpu, stores.deq_bf16, self.down)?;
                bf16_input_grad(gpu, self.down, &wd, &dy16, 0.0, dact)?;
                let (n, i) = (gu.len(), c.intermediate);
                let mut dgu = front_mut(stores.bf16_second, n)?;
                activation::swiglu_backward_bf16(gpu, &gu.as_view(), i, &dact.as_view(), &mut dgu)?;
                let dgu = front(stores.bf16_second, n)?;
                let w = self.gate_up_weight(gpu, stores.deq_bf16)?;
                let spec = GemmSpec::linear_dx(n / (2 * i), c.hidden, 2 * i);
                blas::gemm_half(gpu, spec, 1.0, &dgu, &w, 0.0, &mut d.dn2)?;
            }
            (GateUp::F32(gate, up), Dact::F32(dact)) => {
                let round = Bf16Dy::InSecond;
                input_grad(gpu, bwd, &mut stores, self.down, (&d.dx, dact), 0.0, round)?;
                let (dgate, dup) = d.dgate_up.as_mut().ok_or_else(gate_up_mismatch)?;
                activation::swiglu_backward(
                    gpu,
                    &gate.as_view(),
                    &up.as_view(),
                    &dact.as_view(),
                    &mut dgate.as_view_mut(),
                    &mut dup.as_view_mut(),
                )?;
                let (round, dn2) = (Bf16Dy::RoundHere, &mut d.dn2);
                input_grad(gpu, bwd, &mut stores, self.gate, (dgate, dn2), 0.0, round)?;
                input_grad(gpu, bwd, &mut stores, self.up, (dup, dn2), 1.0, round)?;
            }
            _ => return Err(gate_up_mismatch()),
        }
        let inputs = (&a.x2, self.params.get(Slot::MlpNorm), &d.dn2);
        let dgamma = rmsnorm::Dgamma::Slot(norm_slot(self.params.layer, Slot::MlpNorm));
        let second = &mut ws.bf16_second_input;
        norm_backward(
            gpu,
            c,
            inputs,
            (&mut d.dx, true, second),
            dgamma,
            &mut d.norm,
        )
    }

    /// The forward's `gate` and `up` for the backward: the kept ones, else
    /// recomputed from `n2` into the scratch exactly as the forward computed
    /// them.
    fn saved_gate_up<'b>(
        &self,
        gpu: &mut GpuContext,
        ctx: &LayerCtx,
        a: &'b LayerActs,
        scratch: &'b mut GateUp,
        stores: &mut Stores,
    ) -> Result<&'b GateUp> {
        match &a.mlp {
            Some(kept) => Ok(kept),
            None => {
                let n2 = a.n2.as_ref().ok_or_else(gate_up_mismatch)?;
                if !gpu.faults().mlp_recompute_skipped {
                    self.gate_up(gpu, ctx.fwd, stores, n2, scratch)?;
                }
                Ok(scratch)
            }
        }
    }
}

/// Gate and up (and the norm a layer keeps) are stored in bf16, and the f32
/// SwiGLU buffers absent, exactly when the MLP's weights are bf16 (a bf16
/// base); the f32 norm of a layer that keeps none is in the scratch exactly
/// when gate and up are kept in f32. Anything else is a workspace built for
/// other options.
fn gate_up_mismatch() -> Error {
    Error::InvalidArgument {
        op: "train",
        message: "the MLP's gate, up and norm buffers are not of its weights' format and options"
            .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::workspace::qkv_width;

    #[test]
    fn every_norm_of_every_layer_has_a_slot_of_its_own() {
        let layers = 24;
        let mut seen: Vec<usize> = (0..layers)
            .flat_map(|l| NORMS.map(|s| norm_slot(l, s)))
            .collect();
        assert_eq!(seen[..4], [0, 1, 2, 3]);
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen, (0..norm_slots(layers)).collect::<Vec<_>>());
    }

    #[test]
    fn the_lora_a_rows_are_the_last_rows_of_the_stack_q_first() {
        for c in crate::model::PRESETS {
            let [(q, rq), (v, rv)] = lora_a_rows(&c);
            assert_eq!((q, v), (Slot::QA, Slot::VA));
            assert_eq!(rq.len(), c.lora_rank * c.hidden);
            assert_eq!(rq.end, rv.start);
            assert_eq!(rv.end, qkv_width(&c) * c.hidden);
        }
    }
}
