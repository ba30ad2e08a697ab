//! `op_parity` of `rope`: the launchers of `qlora::ops::rope` against the oracle.

use super::compare::{case_rng, compare, compare_written, uniform, widen, Written};
use super::compare::{Case, Comparison};
use crate::check::op::Pass;
use crate::check::params::Precision;
use crate::error::Result;
use crate::reference::rope as refop;
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, DeviceRepr};
use qlora::gpu::GpuContext;
use qlora::model::ModelConfig;
use qlora::ops::attention::QkvBuffers;
use qlora::ops::cast::Bf16;
use qlora::ops::rope::*;

/// `op_parity` of RoPE for one `{batch, seq, heads, head_dim}` shape, with the
/// presets' theta (1e6).
pub fn parity(gpu: &mut GpuContext, case: &Case<'_>) -> Result<Comparison> {
    let (batch, seq, heads, head_dim) = (
        case.shape.dim("batch"),
        case.shape.dim("seq"),
        case.shape.dim("heads"),
        case.shape.dim("head_dim"),
    );
    let theta = ModelConfig::ROPE_THETA;
    let n = batch * seq * heads * head_dim;
    let mut rng = case_rng(case.seed);
    let x = uniform(&mut rng, n, -2.0, 2.0);
    let d_x = gpu.upload(&x)?;
    let mut y = gpu.poisoned(n)?;
    let (launcher, reference): (Launcher, refop::Rotate) = match case.pass {
        Pass::Forward => (forward, refop::forward),
        Pass::Backward => (backward, refop::backward),
    };
    let dims = (batch, seq, heads, head_dim);
    launcher(
        gpu,
        &d_x.as_view(),
        batch,
        seq,
        heads,
        head_dim,
        theta,
        &mut y.as_view_mut(),
    )?;
    let want = reference(&widen(&x), dims.0, dims.1, dims.2, dims.3, theta)?;
    Ok(compare(&gpu.download(&y)?, &want))
}

/// A RoPE launcher: `(gpu, x, batch, seq, heads, head_dim, theta, y)`.
type Launcher = fn(
    &mut GpuContext,
    &CudaView<'_, f32>,
    usize,
    usize,
    usize,
    usize,
    f64,
    &mut CudaViewMut<'_, f32>,
) -> qlora::Result<()>;

/// The LoRA scale `s` of the `rope_qkv` comparisons: alpha 32 over rank 16,
/// as the presets train.
const QKV_LORA_SCALE: f32 = 2.0;

/// The buffers' contents one after the other.
fn download_all<T: DeviceRepr>(gpu: &GpuContext, bufs: [&CudaSlice<T>; 3]) -> Result<Vec<T>> {
    let mut all = Vec::new();
    for b in bufs {
        all.extend(gpu.download(b)?);
    }
    Ok(all)
}

/// `op_parity` of the fused q/k/v epilogue for one `{batch, seq, heads,
/// kv_heads, head_dim, rank}` shape: forward `(y, bias) -> [qr | kr | v]`
/// (at precision `bf16` rounded to bf16, against the reference rounded to
/// bf16) and the copy of `y`'s `u` columns, backward
/// `[dqr | dkr | dv] -> dy`, against [`refop::qkv_forward`] and
/// [`refop::qkv_backward`], with the presets' theta and the angle table the
/// step uploads. The backward at precision `bf16` also writes `dy`'s bf16
/// rounding, compared with the reference rounded to bf16.
pub fn qkv_parity(gpu: &mut GpuContext, case: &Case<'_>) -> Result<Comparison> {
    let d = case.shape.dim("head_dim");
    let sh = QkvShape {
        rows: case.shape.dim("batch") * case.shape.dim("seq"),
        seq: case.shape.dim("seq"),
        heads: case.shape.dim("heads"),
        kv_heads: case.shape.dim("kv_heads"),
        head_dim: d,
        rank: case.shape.dim("rank"),
    };
    let dims = refop::QkvDims {
        batch: case.shape.dim("batch"),
        seq: sh.seq,
        heads: sh.heads,
        kv_heads: sh.kv_heads,
        head_dim: d,
        rank: sh.rank,
        scale: f64::from(QKV_LORA_SCALE),
    };
    let theta = ModelConfig::ROPE_THETA;
    let (packed_q, packed_kv) = (sh.rows * sh.q_dim(), sh.rows * sh.kv_dim());
    let mut rng = case_rng(case.seed);
    let bq = uniform(&mut rng, sh.q_dim() * sh.rank, -0.5, 0.5);
    let bv = uniform(&mut rng, sh.kv_dim() * sh.rank, -0.5, 0.5);
    let bias = uniform(&mut rng, sh.u_col(), -0.5, 0.5);
    let (d_bq, d_bv) = (gpu.upload(&bq)?, gpu.upload(&bv)?);
    let table = gpu.upload(&qkv_angle_table(sh.seq, d, theta))?;
    let lora = (&d_bq, &d_bv, QKV_LORA_SCALE);
    match case.pass {
        Pass::Forward => {
            let y = uniform(&mut rng, sh.rows * sh.width(), -2.0, 2.0);
            let d_y = gpu.upload(&y)?;
            let mut u = gpu.poisoned(sh.rows * 2 * sh.rank)?;
            let d_bias = gpu.upload(&bias)?;
            let inputs = (&d_y, &d_bias);
            let y_ref = (&widen(&y)[..], &widen(&bias)[..]);
            let want = refop::qkv_forward(y_ref, &widen(&bq), &widen(&bv), &dims, theta)?;
            // At precision bf16, q, k and v rounded to bf16 (the flash
            // kernels' operands), against the reference rounded to bf16.
            let mut qkv = if case.precision == Precision::Bf16 {
                let poisoned = |n| Bf16::poisoned(gpu, n);
                QkvBuffers::Bf16(
                    poisoned(packed_q)?,
                    poisoned(packed_kv)?,
                    poisoned(packed_kv)?,
                )
            } else {
                let poisoned = |n| gpu.poisoned(n);
                QkvBuffers::F32(
                    poisoned(packed_q)?,
                    poisoned(packed_kv)?,
                    poisoned(packed_kv)?,
                )
            };
            qkv_forward(gpu, &sh, inputs, lora, &table, qkv.as_out(), &mut u)?;
            let rotated = match &qkv {
                QkvBuffers::Bf16(q, k, v) => compare_written(&download_all(gpu, [q, k, v])?, &want),
                QkvBuffers::F32(q, k, v) => compare(&download_all(gpu, [q, k, v])?, &want),
            };
            // The copy of y's u columns, exact.
            let want_u: Vec<f64> = y
                .chunks(sh.width())
                .flat_map(|row| widen(&row[sh.u_col()..]))
                .collect();
            let copy = compare(&gpu.download(&u)?, &want_u);
            Ok(rotated.merge(copy))
        }
        Pass::Backward => {
            let dout = uniform(&mut rng, packed_q + 2 * packed_kv, -2.0, 2.0);
            let (dqr, rest) = dout.split_at(packed_q);
            let (dkr, dv) = rest.split_at(packed_kv);
            let grads = (&gpu.upload(dqr)?, &gpu.upload(dkr)?, &gpu.upload(dv)?);
            let n = sh.rows * sh.width();
            let mut dy = gpu.poisoned(n)?;
            let want = refop::qkv_backward(&widen(&dout), &widen(&bq), &widen(&bv), &dims, theta)?;
            if case.precision != Precision::Bf16 {
                qkv_backward(gpu, &sh, grads, lora, &table, &mut dy)?;
                return Ok(compare(&gpu.download(&dy)?, &want));
            }
            // dy and its bf16 rounding (against the reference rounded to bf16).
            let mut dy16 = Bf16::poisoned(gpu, n)?;
            let out16 = &mut dy16.as_view_mut();
            qkv_backward_with_bf16(gpu, &sh, grads, lora, &table, &mut dy, out16)?;
            let full = compare(&gpu.download(&dy)?, &want);
            Ok(full.merge(compare_written(&gpu.download(&dy16)?, &want)))
        }
    }
}
