//! One decoder layer of the training step as a type, [`DecoderLayer`], in the
//! shape of candle-transformers' Llama: an attention block and an MLP block,
//! each with its forward and its backward, each adding onto the residual
//! stream.
//!
//! ```text
//! attention  n1 = rmsnorm(x, g1);
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

use cudarc::driver::CudaSlice;

use super::blas;
use super::kernels;
use super::weights::{LayerWeights, Linear};
use super::workspace::{Grads, LayerActs, Scratch, Workspace};
use crate::error::Result;
use crate::gpu::{GemmMath, GpuContext};
use crate::model::{ModelConfig, Slot, Trainable};
use crate::ops::attention::{self, AttnShape};
use crate::ops::{activation, rmsnorm, rope};

/// What every layer's launches share within one pass: the model's shapes,
/// the GEMM math of each direction and the LoRA scale of each.
#[derive(Clone, Copy)]
pub(super) struct LayerCtx {
    pub c: ModelConfig,
    pub fwd: GemmMath,
    pub bwd: GemmMath,
    pub attn: AttnShape,
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

/// One decoder layer: `x' = mlp(attention(x))`, each block adding onto the
/// residual stream.
pub(super) struct DecoderLayer<'a> {
    attn: Attention<'a>,
    mlp: Mlp<'a>,
}

impl<'a> DecoderLayer<'a> {
    /// Layer `layer` of the model: its frozen projections `w` and its
    /// trainable tensors in `p` (the layout of [`Trainable::tensors`]).
    pub(super) fn new(layer: usize, w: &'a LayerWeights, p: &'a [CudaSlice<f32>]) -> Self {
        let params = LayerParams { layer, p };
        DecoderLayer {
            attn: Attention {
                q: &w.q,
                k: &w.k,
                v: &w.v,
                o: &w.o,
                params,
            },
            mlp: Mlp {
                gate: &w.gate,
                up: &w.up,
                down: &w.down,
                params,
            },
        }
    }

    /// Reads `xs[l]`, keeps the layer's activations and writes `xs[l + 1]`.
    pub(super) fn forward(
        &self,
        gpu: &mut GpuContext,
        ctx: &LayerCtx,
        ws: &mut Workspace,
    ) -> Result<()> {
        self.attn.forward(gpu, ctx, ws)?;
        self.mlp.forward(gpu, ctx, ws)
    }

    /// Turns `grads.dx` from the gradient of `xs[l + 1]` into that of
    /// `xs[l]`, writing the layer's trainable gradients into `g`.
    pub(super) fn backward(
        &self,
        gpu: &mut GpuContext,
        ctx: &LayerCtx,
        ws: &mut Workspace,
        g: &mut [CudaSlice<f32>],
    ) -> Result<()> {
        self.mlp.backward(gpu, ctx, ws, g)?;
        self.attn.backward(gpu, ctx, ws, g)
    }
}

/// The attention block: `x2 = x + o(attention(rope(q), rope(k), v))` of
/// `n1 = rmsnorm(x, g1)`, with LoRA on q and v.
struct Attention<'a> {
    q: &'a Linear,
    k: &'a Linear,
    v: &'a Linear,
    o: &'a Linear,
    params: LayerParams<'a>,
}

impl Attention<'_> {
    /// `n1 = rmsnorm(x, g1)`; q, k, v; `att = attention(rope(q), rope(k), v)`;
    /// `x2 = x + att Wo^T`.
    fn forward(&self, gpu: &mut GpuContext, ctx: &LayerCtx, ws: &mut Workspace) -> Result<()> {
        let c = &ctx.c;
        let (rows, h, qd) = (c.tokens(), c.hidden, c.q_dim());
        let eps = ModelConfig::RMS_EPS;
        let l = self.params.layer;
        let a = &mut ws.layers[l];
        let x = &ws.xs[l];
        let sc = &mut ws.scratch;
        rmsnorm::forward(
            gpu,
            &x.as_view(),
            &self.params.get(Slot::AttnNorm).as_view(),
            rows,
            h,
            eps,
            &mut a.n1.as_view_mut(),
        )?;
        self.qkv(gpu, ctx, &mut ws.deq, a, sc)?;
        rope_qk(
            gpu,
            c,
            Rotation::Forward,
            (&sc.q, &sc.k),
            (&mut a.qr, &mut a.kr),
        )?;
        let sh = ctx.attn;
        attention::forward(
            gpu,
            ctx.fwd,
            (&a.qr, &a.kr, &a.v),
            &mut a.att,
            &mut a.probs,
            &sh,
        )?;
        gpu.stream().memcpy_dtod(x, &mut a.x2)?;
        let wo = Workspace::weight(&mut ws.deq, gpu, self.o)?;
        blas::linear(gpu, ctx.fwd, 1.0, &a.att, wo, 1.0, &mut a.x2, (rows, qd, h))
    }

    /// `q = n1 Wq^T + s (n1 Aq^T) Bq^T`, `k = n1 Wk^T`,
    /// `v = n1 Wv^T + s (n1 Av^T) Bv^T`, keeping `n1 Aq^T` and `n1 Av^T`.
    fn qkv(
        &self,
        gpu: &mut GpuContext,
        ctx: &LayerCtx,
        deq: &mut [CudaSlice<f32>],
        a: &mut LayerActs,
        sc: &mut Scratch,
    ) -> Result<()> {
        let c = &ctx.c;
        let (rows, h, qd, kvd, r) = (c.tokens(), c.hidden, c.q_dim(), c.kv_dim(), c.lora_rank);
        let (fwd, lora_s) = (ctx.fwd, ctx.lora_s);
        let pi = |slot: Slot| self.params.get(slot);
        let wq = Workspace::weight(deq, gpu, self.q)?;
        let (qa, qb) = (pi(Slot::QA), pi(Slot::QB));
        lora_linear(
            gpu,
            fwd,
            &a.n1,
            wq,
            (qa, qb, lora_s),
            &mut a.uq,
            &mut sc.q,
            (rows, h, r, qd),
        )?;
        let wk = Workspace::weight(deq, gpu, self.k)?;
        blas::linear(gpu, fwd, 1.0, &a.n1, wk, 0.0, &mut sc.k, (rows, h, kvd))?;
        let wv = Workspace::weight(deq, gpu, self.v)?;
        let (va, vb) = (pi(Slot::VA), pi(Slot::VB));
        lora_linear(
            gpu,
            fwd,
            &a.n1,
            wv,
            (va, vb, lora_s),
            &mut a.uv,
            &mut a.v,
            (rows, h, r, kvd),
        )
    }

    /// The backward of [`Attention::forward`]: `dx` (the gradient of `x2`)
    /// through o, attention, RoPE and the projections into `dn1`, then
    /// `dx += rmsnorm'(dn1)`, with the gradient of `g1`.
    fn backward(
        &self,
        gpu: &mut GpuContext,
        ctx: &LayerCtx,
        ws: &mut Workspace,
        g: &mut [CudaSlice<f32>],
    ) -> Result<()> {
        let c = &ctx.c;
        let (rows, h, qd) = (c.tokens(), c.hidden, c.q_dim());
        let (eps, bwd) = (ModelConfig::RMS_EPS, ctx.bwd);
        let l = self.params.layer;
        let a = &ws.layers[l];
        let x = &ws.xs[l];
        let d = &mut ws.grads;
        // Attention branch: x2 = x + o(attention(rope(q), rope(k), v)).
        let wo = Workspace::weight(&mut ws.deq, gpu, self.o)?;
        blas::linear_dx(gpu, bwd, 1.0, &d.dx, wo, 0.0, &mut d.datt, (rows, qd, h))?;
        attention::backward(
            gpu,
            bwd,
            (&a.qr, &a.kr, &a.v),
            &a.att,
            &a.probs,
            &d.datt,
            &mut d.attn,
            (&mut d.dqr, &mut d.dkr, &mut d.dv),
            &ctx.attn,
        )?;
        rope_qk(
            gpu,
            c,
            Rotation::Backward,
            (&d.dqr, &d.dkr),
            (&mut d.dq, &mut d.dk),
        )?;
        self.qkv_backward(gpu, ctx, &mut ws.deq, a, d, g)?;
        let norm = self.params.index(Slot::AttnNorm);
        rmsnorm::backward(
            gpu,
            &x.as_view(),
            &self.params.get(Slot::AttnNorm).as_view(),
            &d.dn1.as_view(),
            rows,
            h,
            eps,
            &mut d.dtmp.as_view_mut(),
            &mut g[norm].as_view_mut(),
            &mut d.norm,
        )?;
        kernels::accumulate(gpu, &mut d.dx, &d.dtmp)
    }

    /// `dn1 = dq Wq + dk Wk + dv Wv`, then the LoRA branches of q and v.
    fn qkv_backward(
        &self,
        gpu: &mut GpuContext,
        ctx: &LayerCtx,
        deq: &mut [CudaSlice<f32>],
        a: &LayerActs,
        d: &mut Grads,
        g: &mut [CudaSlice<f32>],
    ) -> Result<()> {
        let c = &ctx.c;
        let (rows, h, qd, kvd) = (c.tokens(), c.hidden, c.q_dim(), c.kv_dim());
        let bwd = ctx.bwd;
        let wq = Workspace::weight(deq, gpu, self.q)?;
        blas::linear_dx(gpu, bwd, 1.0, &d.dq, wq, 0.0, &mut d.dn1, (rows, h, qd))?;
        let wk = Workspace::weight(deq, gpu, self.k)?;
        blas::linear_dx(gpu, bwd, 1.0, &d.dk, wk, 1.0, &mut d.dn1, (rows, h, kvd))?;
        let wv = Workspace::weight(deq, gpu, self.v)?;
        blas::linear_dx(gpu, bwd, 1.0, &d.dv, wv, 1.0, &mut d.dn1, (rows, h, kvd))?;
        self.lora_backward(gpu, ctx, a, d, g)
    }

    /// The LoRA branches `y += s (n1 A^T) B^T` of q and v, `u = n1 A^T`:
    /// `dB = s dy^T u`, `du = s dy B`, `dA = du^T n1`, `dn1 += du A`.
    fn lora_backward(
        &self,
        gpu: &GpuContext,
        ctx: &LayerCtx,
        a: &LayerActs,
        d: &mut Grads,
        g: &mut [CudaSlice<f32>],
    ) -> Result<()> {
        let c = &ctx.c;
        let (rows, h, qd, kvd, r) = (c.tokens(), c.hidden, c.q_dim(), c.kv_dim(), c.lora_rank);
        let (bwd, s_bwd) = (ctx.bwd, ctx.lora_s_bwd);
        let p = self.params.p;
        let idx = |slot: Slot| self.params.index(slot);
        for (dy, u, sa, sb, out) in [
            (&d.dq, &a.uq, Slot::QA, Slot::QB, qd),
            (&d.dv, &a.uv, Slot::VA, Slot::VB, kvd),
        ] {
            blas::linear_dw(gpu, bwd, s_bwd, dy, u, &mut g[idx(sb)], (rows, r, out))?;
            blas::linear_dx(
                gpu,
                bwd,
                s_bwd,
                dy,
                &p[idx(sb)],
                0.0,
                &mut d.du,
                (rows, r, out),
            )?;
            blas::linear_dw(gpu, bwd, 1.0, &d.du, &a.n1, &mut g[idx(sa)], (rows, h, r))?;
            blas::linear_dx(
                gpu,
                bwd,
                1.0,
                &d.du,
                &p[idx(sa)],
                1.0,
                &mut d.dn1,
                (rows, h, r),
            )?;
        }
        Ok(())
    }
}

/// The MLP block: `x' = x2 + (silu(n2 Wg^T) * n2 Wu^T) Wd^T` of
/// `n2 = rmsnorm(x2, g2)`.
struct Mlp<'a> {
    gate: &'a Linear,
    up: &'a Linear,
    down: &'a Linear,
    params: LayerParams<'a>,
}

impl Mlp<'_> {
    /// `n2 = rmsnorm(x2, g2)`; `x' = x2 + (silu(n2 Wg^T) * n2 Wu^T) Wd^T`
    /// into `xs[l + 1]`; gate and up kept only when the workspace keeps them.
    fn forward(&self, gpu: &mut GpuContext, ctx: &LayerCtx, ws: &mut Workspace) -> Result<()> {
        let c = &ctx.c;
        let (rows, h, inter) = (c.tokens(), c.hidden, c.intermediate);
        let (eps, fwd) = (ModelConfig::RMS_EPS, ctx.fwd);
        let l = self.params.layer;
        let a = &mut ws.layers[l];
        let x_next = &mut ws.xs[l + 1];
        let sc = &mut ws.scratch;
        rmsnorm::forward(
            gpu,
            &a.x2.as_view(),
            &self.params.get(Slot::MlpNorm).as_view(),
            rows,
            h,
            eps,
            &mut a.n2.as_view_mut(),
        )?;
        let (gate, up) = match &mut a.mlp {
            Some((g, u)) => (g, u),
            None => (&mut sc.gate, &mut sc.up),
        };
        self.gate_up(gpu, fwd, &mut ws.deq, &a.n2, (gate, up), (rows, h, inter))?;
        activation::swiglu_forward(
            gpu,
            &gate.as_view(),
            &up.as_view(),
            &mut sc.act.as_view_mut(),
        )?;
        gpu.stream().memcpy_dtod(&a.x2, x_next)?;
        let wd = Workspace::weight(&mut ws.deq, gpu, self.down)?;
        blas::linear(gpu, fwd, 1.0, &sc.act, wd, 1.0, x_next, (rows, inter, h))
    }

    /// The MLP's input projections `gate = n2 Wg^T`, `up = n2 Wu^T`: what the
    /// forward computes and the backward recomputes when they are not kept.
    fn gate_up(
        &self,
        gpu: &mut GpuContext,
        math: GemmMath,
        deq: &mut [CudaSlice<f32>],
        n2: &CudaSlice<f32>,
        (gate, up): (&mut CudaSlice<f32>, &mut CudaSlice<f32>),
        (rows, hidden, inter): (usize, usize, usize),
    ) -> Result<()> {
        let wg = Workspace::weight(deq, gpu, self.gate)?;
        blas::linear(gpu, math, 1.0, n2, wg, 0.0, gate, (rows, hidden, inter))?;
        let wu = Workspace::weight(deq, gpu, self.up)?;
        blas::linear(gpu, math, 1.0, n2, wu, 0.0, up, (rows, hidden, inter))
    }

    /// The backward of [`Mlp::forward`]: `dx` (the gradient of `x'`) through
    /// down, SwiGLU, gate and up into `dn2`, then `dx += rmsnorm'(dn2)`, with
    /// the gradient of `g2`.
    fn backward(
        &self,
        gpu: &mut GpuContext,
        ctx: &LayerCtx,
        ws: &mut Workspace,
        g: &mut [CudaSlice<f32>],
    ) -> Result<()> {
        let c = &ctx.c;
        let (rows, h, inter) = (c.tokens(), c.hidden, c.intermediate);
        let (eps, bwd) = (ModelConfig::RMS_EPS, ctx.bwd);
        let a = &ws.layers[self.params.layer];
        let d = &mut ws.grads;
        let (gate, up) = self.saved_gate_up(gpu, ctx, a, &mut ws.scratch, &mut ws.deq)?;
        let wd = Workspace::weight(&mut ws.deq, gpu, self.down)?;
        blas::linear_dx(gpu, bwd, 1.0, &d.dx, wd, 0.0, &mut d.dact, (rows, inter, h))?;
        activation::swiglu_backward(
            gpu,
            &gate.as_view(),
            &up.as_view(),
            &d.dact.as_view(),
            &mut d.dgate.as_view_mut(),
            &mut d.dup.as_view_mut(),
        )?;
        let wg = Workspace::weight(&mut ws.deq, gpu, self.gate)?;
        blas::linear_dx(
            gpu,
            bwd,
            1.0,
            &d.dgate,
            wg,
            0.0,
            &mut d.dn2,
            (rows, h, inter),
        )?;
        let wu = Workspace::weight(&mut ws.deq, gpu, self.up)?;
        blas::linear_dx(gpu, bwd, 1.0, &d.dup, wu, 1.0, &mut d.dn2, (rows, h, inter))?;
        let norm = self.params.index(Slot::MlpNorm);
        rmsnorm::backward(
            gpu,
            &a.x2.as_view(),
            &self.params.get(Slot::MlpNorm).as_view(),
            &d.dn2.as_view(),
            rows,
            h,
            eps,
            &mut d.dtmp.as_view_mut(),
            &mut g[norm].as_view_mut(),
            &mut d.norm,
        )?;
        kernels::accumulate(gpu, &mut d.dx, &d.dtmp)
    }

    /// The forward's `gate` and `up` for the backward: the kept ones, else
    /// recomputed from `n2` into the scratch exactly as the forward computed
    /// them.
    fn saved_gate_up<'b>(
        &self,
        gpu: &mut GpuContext,
        ctx: &LayerCtx,
        a: &'b LayerActs,
        sc: &'b mut Scratch,
        deq: &mut [CudaSlice<f32>],
    ) -> Result<(&'b CudaSlice<f32>, &'b CudaSlice<f32>)> {
        let c = &ctx.c;
        match &a.mlp {
            Some((g, u)) => Ok((g, u)),
            None => {
                let dims = (c.tokens(), c.hidden, c.intermediate);
                let fwd = ctx.fwd;
                self.gate_up(gpu, fwd, deq, &a.n2, (&mut sc.gate, &mut sc.up), dims)?;
                Ok((&sc.gate, &sc.up))
            }
        }
    }
}

/// Which way [`rope_qk`] rotates.
#[derive(Clone, Copy)]
enum Rotation {
    Forward,
    /// The transpose, for the backward.
    Backward,
}

/// RoPE on one layer's q and k (`[T, heads * head_dim]`, `[T, kv_heads *
/// head_dim]`) at the model's theta.
fn rope_qk(
    gpu: &mut GpuContext,
    c: &ModelConfig,
    rotation: Rotation,
    (q, k): (&CudaSlice<f32>, &CudaSlice<f32>),
    (q_out, k_out): (&mut CudaSlice<f32>, &mut CudaSlice<f32>),
) -> Result<()> {
    let apply = match rotation {
        Rotation::Forward => rope::forward,
        Rotation::Backward => rope::backward,
    };
    let theta = ModelConfig::ROPE_THETA;
    for (x, y, heads) in [(q, q_out, c.heads), (k, k_out, c.kv_heads)] {
        let (b, s, d) = (c.batch, c.seq_len, c.head_dim);
        apply(
            gpu,
            &x.as_view(),
            b,
            s,
            heads,
            d,
            theta,
            &mut y.as_view_mut(),
        )?;
    }
    Ok(())
}

/// A frozen projection with its LoRA branch: `y = x W^T + s (x A^T) B^T`,
/// keeping `u = x A^T` for the backward. `W` is `[out, in]`, `A` is `[r, in]`,
/// `B` is `[out, r]`.
#[allow(clippy::too_many_arguments)]
fn lora_linear(
    gpu: &GpuContext,
    math: GemmMath,
    x: &CudaSlice<f32>,
    w: &CudaSlice<f32>,
    (a, b, s): (&CudaSlice<f32>, &CudaSlice<f32>, f32),
    u: &mut CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    (rows, in_dim, r, out_dim): (usize, usize, usize, usize),
) -> Result<()> {
    blas::linear(gpu, math, 1.0, x, w, 0.0, y, (rows, in_dim, out_dim))?;
    blas::linear(gpu, math, 1.0, x, a, 0.0, u, (rows, in_dim, r))?;
    blas::linear(gpu, math, s, u, b, 1.0, y, (rows, r, out_dim))
}
