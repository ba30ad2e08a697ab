//! The step's head: the final RMSNorm, the LM head `logits = nf Wlm^T` and
//! the mean cross-entropy, forward and backward.
//!
//! An fp32 base holds the whole `[T, vocab]` logits in f32: the forward
//! writes them and the cross-entropy's per-row stats; the backward turns
//! them into their gradient (f32, or scaled f16 with `f16_lm_head`) and
//! multiplies it by `Wlm`.
//!
//! A bf16 base never holds them whole. The forward walks the rows in chunks
//! of at most [`super::super::workspace::HEAD_CHUNK_ROWS`]: per chunk, the GEMM writes the chunk's
//! logits in bf16 into one chunk-sized buffer, one kernel turns them into
//! the chunk's loss rows and, in place, into their gradient
//! ([`cross_entropy::fused_bf16`]), and in a training pass a second GEMM
//! takes the chunk's rows of `dnf = dlogits Wlm` at once, before the next
//! chunk reuses the buffer. The backward starts from that `dnf`.

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};

use super::super::blas;
use super::super::layer::{front, front_mut, half_of, norm_backward};
use super::super::weights::{BaseDevice, Table};
use super::super::workspace::{head_chunks, Dlogits};
use super::{head_mismatch, GpuTrainer};
use crate::error::{Error, Result};
use crate::gpu::{GemmMath, GpuContext};
use crate::model::ModelConfig;
use crate::ops::cast::Bf16;
use crate::ops::cross_entropy::{self, F16_GRAD_SCALE};
use crate::ops::gemm::GemmSpec;
use crate::ops::rmsnorm;

/// What a forward pass computes at the head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pass {
    /// The loss alone.
    Loss,
    /// The loss, and with a bf16 base also the head's input gradient `dnf`
    /// (its backward is fused into the forward); a backward follows.
    Train,
}

impl GpuTrainer {
    /// `loss = CE(rmsnorm(x_L) Wlm^T, targets)`: the final norm, the LM head
    /// and the mean cross-entropy.
    pub(super) fn head_forward(
        &mut self,
        gpu: &mut GpuContext,
        fwd: GemmMath,
        pass: Pass,
    ) -> Result<()> {
        if matches!(self.base.head(), Table::Bf16(_)) {
            // Not ready until this pass has written all of `dnf`.
            self.head_grad_ready = false;
            self.norm_to_bf16(gpu)?;
            self.head_bf16_chunks(gpu, pass)?;
            self.head_grad_ready = pass == Pass::Train;
            return Ok(());
        }
        let c = self.cfg;
        let (rows, h, vocab) = (c.tokens(), c.hidden, c.vocab);
        let ws = &mut self.ws;
        rmsnorm::forward(
            gpu,
            &ws.xs[c.layers].as_view(),
            &self.base.final_norm.as_view(),
            rows,
            h,
            c.rms_eps,
            &mut ws.nf.as_view_mut(),
        )?;
        let logits = f32_logits(&mut ws.logits)?;
        let spec = GemmSpec::linear(rows, h, vocab);
        match (&self.base.lm_head_f16, self.base.head()) {
            (Some(w16), _) => {
                let nf16 = half_of(gpu, &ws.nf, &mut ws.half_input)?;
                blas::gemm_half(gpu, spec, 1.0, &nf16, w16, 0.0, logits)?;
            }
            (None, Table::F32(w)) => {
                blas::linear(gpu, fwd, 1.0, &ws.nf, w, 0.0, logits, (rows, h, vocab))?;
            }
            (None, Table::Bf16(_)) => return Err(head_mismatch()),
        }
        cross_entropy::forward(
            gpu,
            &logits.as_view(),
            rows,
            vocab,
            &ws.targets.as_view(),
            &mut ws.losses.as_view_mut(),
            &mut ws.loss.as_view_mut(),
            &mut ws.ce_stats,
        )
    }

    /// The final norm of a bf16 base: `nf` and its bf16 rounding (the LM
    /// head's operand) into the front of the bf16 input buffer, one kernel.
    fn norm_to_bf16(&mut self, gpu: &mut GpuContext) -> Result<()> {
        let c = self.cfg;
        let ws = &mut self.ws;
        rmsnorm::forward_with_bf16(
            gpu,
            &ws.xs[c.layers].as_view(),
            &self.base.final_norm.as_view(),
            c.tokens(),
            c.hidden,
            c.rms_eps,
            (
                &mut ws.nf.as_view_mut(),
                &mut front_mut(&mut ws.bf16_input, c.tokens() * c.hidden)?,
            ),
            None,
        )
    }

    /// The bf16 head, chunk by chunk (the module's doc): the loss rows,
    /// their mean, and with [`Pass::Train`] `dnf`.
    fn head_bf16_chunks(&mut self, gpu: &mut GpuContext, pass: Pass) -> Result<()> {
        let ws = &mut self.ws;
        let mut head = Bf16Head::new(&self.cfg, &self.base, &ws.bf16_input, &mut ws.grads.dlogits)?;
        let (rows, h, vocab, w) = (head.rows, head.hidden, head.vocab, head.w);
        for (r0, n) in head.chunks() {
            let mut x = head.logits(gpu, r0, n)?;
            cross_entropy::fused_bf16(
                gpu,
                &mut x,
                (n, vocab),
                rows,
                &ws.targets.try_slice(r0..r0 + n).ok_or_else(out_of_range)?,
                &mut view_mut(&mut ws.losses, r0, n)?,
            )?;
            if pass == Pass::Train {
                let spec = GemmSpec::linear_dx(n, h, vocab);
                let mut dnf = view_mut(&mut ws.grads.dnf, r0 * h, n * h)?;
                blas::gemm_half(gpu, spec, 1.0, &x, w, 0.0, &mut dnf)?;
            }
        }
        cross_entropy::mean(gpu, &ws.losses.as_view(), &mut ws.loss.as_view_mut())
    }

    /// The logits of the batch the last forward ran, in f32: the buffer an
    /// fp32 base keeps, or, for a bf16 base, the LM head's GEMM again chunk
    /// by chunk (on the final norm's bf16 output, still in the workspace),
    /// each chunk widened from bf16.
    pub(super) fn last_logits(&mut self, gpu: &mut GpuContext) -> Result<Vec<f32>> {
        if let Some(l) = &self.ws.logits {
            return gpu.download(l);
        }
        let ws = &mut self.ws;
        let mut head = Bf16Head::new(&self.cfg, &self.base, &ws.bf16_input, &mut ws.grads.dlogits)?;
        let mut out = Vec::with_capacity(head.rows * head.vocab);
        for (r0, n) in head.chunks() {
            let x = head.logits(gpu, r0, n)?;
            out.extend(gpu.download(&x)?.into_iter().map(Bf16::to_f32));
        }
        Ok(out)
    }

    /// The backward of [`GpuTrainer::head_forward`] into `dx`, the gradient
    /// of `x_L` (the frozen final norm's weight gradient is discarded). A
    /// bf16 base's `dnf` is the forward's ([`Pass::Train`]).
    pub(super) fn head_backward(&mut self, gpu: &mut GpuContext, bwd: GemmMath) -> Result<()> {
        let c = self.cfg;
        let (rows, h, vocab) = (c.tokens(), c.hidden, c.vocab);
        let ws = &mut self.ws;
        let d = &mut ws.grads;
        let spec = GemmSpec::linear_dx(rows, h, vocab);
        match (&mut d.dlogits, &self.base.lm_head_f16, self.base.head()) {
            (Dlogits::Bf16(_), None, Table::Bf16(_)) => {
                if !std::mem::take(&mut self.head_grad_ready) {
                    return Err(Error::InvalidArgument {
                        op: "train",
                        message: "a bf16 head's backward needs a forward with Pass::Train first"
                            .into(),
                    });
                }
            }
            (Dlogits::F16(g), Some(w16), _) => {
                let logits = f32_logits(&mut ws.logits)?;
                let mut view = g.as_view_mut();
                let (targets, stats) = (ws.targets.as_view(), &ws.ce_stats);
                let x = logits.as_view();
                cross_entropy::backward(gpu, &x, rows, vocab, &targets, stats, &mut view)?;
                // g = rows * F16_GRAD_SCALE * dL/dlogits.
                let alpha = (1.0 / (rows as f64 * f64::from(F16_GRAD_SCALE))) as f32;
                blas::gemm_half(gpu, spec, alpha, g, w16, 0.0, &mut d.dnf)?;
            }
            (Dlogits::F32(g), None, Table::F32(w)) => {
                let logits = f32_logits(&mut ws.logits)?;
                let mut view = g.as_view_mut();
                let (targets, stats) = (ws.targets.as_view(), &ws.ce_stats);
                let x = logits.as_view();
                cross_entropy::backward(gpu, &x, rows, vocab, &targets, stats, &mut view)?;
                blas::linear_dx(gpu, bwd, 1.0, g, w, 0.0, &mut d.dnf, (rows, h, vocab))?;
            }
            _ => return Err(head_mismatch()),
        }
        let inputs = (&ws.xs[c.layers], &self.base.final_norm, &d.dnf);
        let out = (&mut d.dx, false, &mut ws.bf16_second_input);
        // The final norm's weight is frozen: its gradient is not summed.
        let dgamma = rmsnorm::Dgamma::Discarded;
        norm_backward(gpu, &c, inputs, out, dgamma, &mut d.norm)
    }
}

/// What a bf16 base's LM head works with: its weight, the final norm's
/// output in bf16 (`[rows, hidden]`, the front of the bf16 input buffer) and
/// the buffer of one chunk's logits.
struct Bf16Head<'a> {
    w: &'a CudaSlice<Bf16>,
    nf16: CudaView<'a, Bf16>,
    chunk_buf: &'a mut CudaSlice<Bf16>,
    rows: usize,
    hidden: usize,
    vocab: usize,
}

impl<'a> Bf16Head<'a> {
    fn new(
        c: &ModelConfig,
        base: &'a BaseDevice,
        bf16_input: &'a Option<CudaSlice<Bf16>>,
        dlogits: &'a mut Dlogits,
    ) -> Result<Self> {
        let (Table::Bf16(w), Dlogits::Bf16(chunk_buf)) = (base.head(), dlogits) else {
            return Err(head_mismatch());
        };
        let (rows, hidden) = (c.tokens(), c.hidden);
        Ok(Bf16Head {
            w,
            nf16: front(bf16_input, rows * hidden)?,
            chunk_buf,
            rows,
            hidden,
            vocab: c.vocab,
        })
    }

    /// `(first row, rows)` of each chunk, in order.
    fn chunks(&self) -> Vec<(usize, usize)> {
        head_chunks(self.rows)
    }

    /// The logits of rows `[r0, r0 + n)`, `nf Wlm^T` in bf16, in the chunk buffer.
    fn logits(&mut self, gpu: &GpuContext, r0: usize, n: usize) -> Result<CudaViewMut<'_, Bf16>> {
        let (h, vocab) = (self.hidden, self.vocab);
        let mut x = view_mut(self.chunk_buf, 0, n * vocab)?;
        let a = self
            .nf16
            .try_slice(r0 * h..(r0 + n) * h)
            .ok_or_else(out_of_range)?;
        blas::gemm_half(
            gpu,
            GemmSpec::linear(n, h, vocab),
            1.0,
            &a,
            self.w,
            0.0,
            &mut x,
        )?;
        Ok(x)
    }
}

/// The whole-batch f32 logits of a base that keeps them.
fn f32_logits(logits: &mut Option<CudaSlice<f32>>) -> Result<&mut CudaSlice<f32>> {
    logits.as_mut().ok_or_else(|| Error::InvalidArgument {
        op: "train",
        message: "this configuration keeps no f32 logits".into(),
    })
}

/// Elements `[start, start + len)` of `buf`, to write.
fn view_mut<T>(buf: &mut CudaSlice<T>, start: usize, len: usize) -> Result<CudaViewMut<'_, T>> {
    buf.try_slice_mut(start..start + len)
        .ok_or_else(out_of_range)
}

fn out_of_range() -> Error {
    Error::InvalidArgument {
        op: "train",
        message: "a head chunk lies outside its workspace buffer".into(),
    }
}
