//! GPU-side execution of `target_parity` and `prewarm`.
//!
//! Both start from a cold kernel cache, inject the trial's fault (if any) into
//! the cache for the duration of the trial, and on the way out remove the
//! fault and drop every module compiled under it, whatever the outcome.

use std::collections::BTreeSet;

use cudarc::driver::CudaSlice;

use super::cache::{compile_module, load_checked, ptx_target, OLDER_ARCH};
use super::context::GpuContext;
use super::prewarm::PrewarmReport;
use crate::check::op::Pass;
use crate::check::params::BaseWeights;
use crate::check::{prewarm, require_gpu, target_parity, Comparator, Measurement, TrialContext};
use crate::error::{Error, Result};
use crate::kernels;
use crate::model::ModelConfig;
use crate::mutant::Mutant;
use crate::ops;
use crate::ops::gemm::{GemmEngine, GemmSpec};
use crate::ops::nf4::Nf4Device;
use crate::reference::adamw::AdamW;
use crate::reference::attention::AttnShape;

/// The small module whose PTX is planted with a wrong target.
const PLANT_MODULE: &str = "elementwise";

/// Runs `body` on a cold cache with `fault` injected, then removes the fault
/// and drops the modules compiled under it, also when `body` fails.
fn with_fault<T>(
    gpu: &mut GpuContext,
    fault: Option<Mutant>,
    body: impl FnOnce(&mut GpuContext) -> Result<T>,
) -> Result<T> {
    gpu.set_fault(fault);
    gpu.reset_cache();
    let out = body(gpu);
    gpu.set_fault(None);
    gpu.reset_cache();
    out
}

/// `target_parity`: pre-warm every listed model; every compiled module's PTX
/// `.target` must equal the device's `sm_XY`; planted older and newer PTX
/// must be refused by the cache's load path with a target mismatch.
pub fn target_parity(p: &target_parity::Params, cx: &mut TrialContext<'_>) -> Result<Measurement> {
    let fault = cx.mutant;
    let gpu = require_gpu(cx)?;
    with_fault(gpu, fault, |gpu| target_parity_body(p, gpu))
}

fn target_parity_body(p: &target_parity::Params, gpu: &mut GpuContext) -> Result<Measurement> {
    let device = gpu.facts().sm_arch();
    let mut violations = Vec::new();
    for model in &p.models {
        let config = model.0;
        match gpu.prewarm(&config, &[BaseWeights::Fp32, BaseWeights::Nf4]) {
            Ok(_) => {}
            Err(e @ Error::TargetMismatch { .. }) => {
                violations.push(format!("pre-warm of {} refused a module: {e}", config.name));
            }
            Err(e) => return Err(e),
        }
    }
    let records = gpu.compile_records();
    let mismatched: Vec<String> = records
        .iter()
        .filter(|r| r.ptx_target != device)
        .map(|r| format!("{} ({} -> {})", r.module, r.arch, r.ptx_target))
        .collect();
    let targets: BTreeSet<String> = records.iter().map(|r| r.ptx_target.clone()).collect();
    let loaded = gpu.cache().loaded();

    let source = kernels::module(PLANT_MODULE).ok_or_else(|| Error::InvalidArgument {
        op: "target_parity",
        message: format!("no kernel module `{PLANT_MODULE}` to plant"),
    })?;
    let mut planted_accepted = 0usize;
    let mut planted_detail = Vec::new();
    for planted in &p.planted {
        let ptx = match planted {
            target_parity::Planted::Older => compile_module(source, OLDER_ARCH)?,
            target_parity::Planted::Newer => {
                let own = compile_module(source, &gpu.facts().compute_arch())?;
                let newer = format!("sm_{}0", gpu.facts().compute_capability.0 + 1);
                retarget(&own, &newer)
            }
        };
        let target = ptx_target(&ptx).unwrap_or("(none)").to_string();
        match load_checked(gpu.context(), gpu.facts(), &ptx) {
            Ok(_) => {
                planted_accepted += 1;
                violations.push(format!(
                    "planted {planted:?} PTX ({target}) was loaded on {device}"
                ));
            }
            Err(e @ Error::TargetMismatch { .. }) => {
                planted_detail.push(format!("{planted:?} ({target}) refused: {e}"));
            }
            Err(e) => violations.push(format!(
                "planted {planted:?} PTX ({target}) failed without a target mismatch: {e}"
            )),
        }
    }
    for m in &mismatched {
        violations.push(format!("module {m} does not target {device}"));
    }
    let observed = (mismatched.len() + planted_accepted) as f64;
    let mut m = Measurement::new(
        "mismatched_modules",
        observed,
        Comparator::Le,
        0.0,
        "modules",
    )
    .with_detail(format!(
        "device {device}; {} compilations, targets {:?}; loaded [{}]; {}",
        records.len(),
        targets,
        loaded.join(", "),
        planted_detail.join("; ")
    ));
    for v in violations {
        m.violate(v);
    }
    Ok(m)
}

/// `ptx` with its `.target` line naming `target` instead.
fn retarget(ptx: &str, target: &str) -> String {
    ptx.lines()
        .map(|line| {
            if line.trim_start().starts_with(".target") {
                format!(".target {target}")
            } else {
                line.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `prewarm`: for each model and base, a cold cache, pre-warm, then `steps`
/// forward + backward passes of one decoder layer's worth of ops at the
/// model's real shapes. Counts compilations after pre-warm; a module used but
/// not pre-warmed is a violation; pre-warmed but unused modules are reported.
pub fn prewarm(p: &prewarm::Params, cx: &mut TrialContext<'_>) -> Result<Measurement> {
    let fault = cx.mutant;
    let gpu = require_gpu(cx)?;
    let mut total_after = 0usize;
    let mut violations = Vec::new();
    let mut detail = Vec::new();
    for model in &p.models {
        let config = model.0;
        for &base in &p.bases {
            let (report, after, used) = with_fault(gpu, fault, |gpu| {
                let report = gpu.prewarm(&config, &[base])?;
                gpu.cache_mut().clear_used();
                for _ in 0..p.steps.0 {
                    layer_pass(gpu, &config, base)?;
                }
                gpu.synchronize()?;
                let after = gpu.cache_stats().compiled_after_prewarm;
                let used = gpu.cache().used().clone();
                Ok((report, after, used))
            })?;
            total_after += after;
            let prewarmed: BTreeSet<&str> = report.modules.iter().copied().collect();
            let missing: Vec<&str> = used.difference(&prewarmed).copied().collect();
            let unused: Vec<&str> = prewarmed.difference(&used).copied().collect();
            let tag = format!("{}/{}", config.name, base_name(base));
            if !missing.is_empty() {
                violations.push(format!(
                    "{tag}: used but not pre-warmed: {}",
                    missing.join(", ")
                ));
            }
            if let Some(bound) = p.max_prewarm_ms {
                if report.wall_ms > bound.0 {
                    violations.push(format!(
                        "{tag}: pre-warm took {:.0} ms, over the bound of {:.0} ms",
                        report.wall_ms, bound.0
                    ));
                }
            }
            detail.push(summary(&tag, &report, after, &unused));
        }
    }
    let mut m = Measurement::new(
        "compilations_after_prewarm",
        total_after as f64,
        Comparator::Le,
        p.max_compilations as f64,
        "compilations",
    )
    .with_detail(detail.join("; "));
    for v in violations {
        m.violate(v);
    }
    Ok(m)
}

fn base_name(base: BaseWeights) -> &'static str {
    match base {
        BaseWeights::Fp32 => "fp32",
        BaseWeights::Nf4 => "nf4",
    }
}

fn summary(tag: &str, r: &PrewarmReport, after: usize, unused: &[&str]) -> String {
    format!(
        "{tag}: pre-warmed {} modules ({} compilations, {:.0} ms JIT, {:.0} ms wall), {after} after{}{}",
        r.modules.len(),
        r.compilations,
        r.compile_ms,
        r.wall_ms,
        if r.skipped.is_empty() {
            String::new()
        } else {
            format!(", skipped [{}]", r.skipped.join(", "))
        },
        if unused.is_empty() {
            String::new()
        } else {
            format!(", unused [{}]", unused.join(", "))
        }
    )
}

/// A frozen projection weight `[out, in]`, in the base format.
enum Weight {
    F32(CudaSlice<f32>),
    Nf4(Nf4Device),
}

impl Weight {
    /// A zero weight `[out, in]`, quantised on the device for NF4.
    fn new(
        gpu: &mut GpuContext,
        base: BaseWeights,
        out_dim: usize,
        in_dim: usize,
    ) -> Result<Weight> {
        let w = gpu.zeros::<f32>(out_dim * in_dim)?;
        match base {
            BaseWeights::Fp32 => Ok(Weight::F32(w)),
            BaseWeights::Nf4 => {
                let len = out_dim * in_dim;
                ops::nf4::check_len("prewarm", len)?;
                let mut q = Nf4Device {
                    codes: gpu.zeros::<u8>(len / 2)?,
                    absmax: gpu.zeros::<f32>(len / crate::reference::nf4::BLOCK)?,
                    len,
                };
                ops::nf4::quantize(gpu, &w, &mut q)?;
                Ok(Weight::Nf4(q))
            }
        }
    }

    /// `y[rows, out] = x[rows, in] W^T`.
    fn forward(
        &self,
        gpu: &mut GpuContext,
        x: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
        (rows, in_dim, out_dim): (usize, usize, usize),
    ) -> Result<()> {
        match self {
            Weight::F32(w) => {
                let engine = GemmEngine::for_pass(gpu.options(), Pass::Forward);
                ops::gemm::linear(gpu, engine, x, w, y, (rows, in_dim, out_dim))
            }
            Weight::Nf4(w) => ops::nf4::gemm_forward(gpu, x, w, y, (rows, out_dim, in_dim)),
        }
    }

    /// `dx[rows, in] = dy[rows, out] W` (the base is frozen: no dW).
    fn backward(
        &self,
        gpu: &mut GpuContext,
        dy: &CudaSlice<f32>,
        dx: &mut CudaSlice<f32>,
        (rows, in_dim, out_dim): (usize, usize, usize),
    ) -> Result<()> {
        match self {
            Weight::F32(w) => {
                let engine = GemmEngine::for_pass(gpu.options(), Pass::Backward);
                ops::gemm::gemm(
                    gpu,
                    engine,
                    GemmSpec::plain(rows, in_dim, out_dim),
                    dy,
                    w,
                    dx,
                )
            }
            Weight::Nf4(w) => ops::nf4::gemm_backward(gpu, dy, w, dx, (rows, out_dim, in_dim)),
        }
    }
}

/// Rows of the LM head and cross-entropy in the stand-in pass: a few rows of
/// the full vocabulary instead of `[tokens, vocab]` logits.
const HEAD_ROWS: usize = 8;

/// One decoder layer's worth of every op, forward then backward, at the real
/// shapes of `config`: embedding, RMSNorm (plain and fused residual), q/k/v/o
/// projections in the base format plus a LoRA pair, RoPE, GQA attention,
/// gate/up/SwiGLU/down, residual add, scale, SiLU, the LM head and
/// cross-entropy on a few rows, squared-sum / clip-scale / clip-apply and AdamW.
/// The data is zeros: this pass exists to show which kernels the step needs,
/// not to check numbers (`op_parity` does that).
fn layer_pass(gpu: &mut GpuContext, c: &ModelConfig, base: BaseWeights) -> Result<()> {
    let (t, h, q_dim, kv_dim, inter) =
        (c.tokens(), c.hidden, c.q_dim(), c.kv_dim(), c.intermediate);
    let eps = ModelConfig::RMS_EPS;
    let fwd = GemmEngine::for_pass(gpu.options(), Pass::Forward);
    let bwd = GemmEngine::for_pass(gpu.options(), Pass::Backward);
    let z = |gpu: &GpuContext, n: usize| gpu.zeros::<f32>(n);

    // ---- forward ----------------------------------------------------------------
    let tokens = gpu.zeros::<u32>(t)?;
    let table = z(gpu, c.vocab * h)?;
    let mut x = z(gpu, t * h)?;
    ops::embedding::forward(
        gpu,
        &table.as_view(),
        c.vocab,
        h,
        &tokens.as_view(),
        &mut x.as_view_mut(),
        None,
    )?;
    let gamma = z(gpu, h)?;
    let mut xn = z(gpu, t * h)?;
    ops::rmsnorm::forward(
        gpu,
        &x.as_view(),
        &gamma.as_view(),
        t,
        h,
        eps,
        &mut xn.as_view_mut(),
        None,
    )?;

    let wq = Weight::new(gpu, base, q_dim, h)?;
    let wk = Weight::new(gpu, base, kv_dim, h)?;
    let wv = Weight::new(gpu, base, kv_dim, h)?;
    let wo = Weight::new(gpu, base, h, q_dim)?;
    let (mut q, mut k, mut v) = (z(gpu, t * q_dim)?, z(gpu, t * kv_dim)?, z(gpu, t * kv_dim)?);
    wq.forward(gpu, &xn, &mut q, (t, h, q_dim))?;
    wk.forward(gpu, &xn, &mut k, (t, h, kv_dim))?;
    wv.forward(gpu, &xn, &mut v, (t, h, kv_dim))?;
    // LoRA on q: q += scale * B (A x), A [r, h], B [q_dim, r].
    let r = c.lora_rank;
    let (lora_a, lora_b) = (z(gpu, r * h)?, z(gpu, q_dim * r)?);
    let (mut ax, mut bax, mut bax_scaled) =
        (z(gpu, t * r)?, z(gpu, t * q_dim)?, z(gpu, t * q_dim)?);
    ops::gemm::linear(gpu, fwd, &xn, &lora_a, &mut ax, (t, h, r))?;
    ops::gemm::linear(gpu, fwd, &ax, &lora_b, &mut bax, (t, r, q_dim))?;
    let lora_scale = 2.0;
    ops::elementwise::scale(
        gpu,
        &bax.as_view(),
        lora_scale,
        &mut bax_scaled.as_view_mut(),
        None,
    )?;
    let mut q_lora = z(gpu, t * q_dim)?;
    ops::elementwise::residual_add(
        gpu,
        &q.as_view(),
        &bax_scaled.as_view(),
        &mut q_lora.as_view_mut(),
        None,
    )?;

    let (b, s, theta) = (c.batch, c.seq_len, ModelConfig::ROPE_THETA);
    let (mut qr, mut kr) = (z(gpu, t * q_dim)?, z(gpu, t * kv_dim)?);
    ops::rope::forward(
        gpu,
        &q_lora.as_view(),
        b,
        s,
        c.heads,
        c.head_dim,
        theta,
        &mut qr.as_view_mut(),
        None,
    )?;
    ops::rope::forward(
        gpu,
        &k.as_view(),
        b,
        s,
        c.kv_heads,
        c.head_dim,
        theta,
        &mut kr.as_view_mut(),
        None,
    )?;
    let sh = AttnShape {
        batch: b,
        seq: s,
        heads: c.heads,
        kv_heads: c.kv_heads,
        head_dim: c.head_dim,
    };
    let mut attn = z(gpu, t * q_dim)?;
    let mut probs = z(gpu, b * c.heads * s * s)?;
    ops::attention::forward(gpu, (&qr, &kr, &v), &mut attn, &mut probs, &sh)?;
    let mut o = z(gpu, t * h)?;
    wo.forward(gpu, &attn, &mut o, (t, q_dim, h))?;

    // Residual + second norm, fused.
    let gamma2 = z(gpu, h)?;
    let (mut h1, mut hn) = (z(gpu, t * h)?, z(gpu, t * h)?);
    ops::rmsnorm::forward_residual(
        gpu,
        &x.as_view(),
        &o.as_view(),
        &gamma2.as_view(),
        t,
        h,
        eps,
        &mut h1.as_view_mut(),
        &mut hn.as_view_mut(),
        None,
    )?;
    let wg = Weight::new(gpu, base, inter, h)?;
    let wu = Weight::new(gpu, base, inter, h)?;
    let wd = Weight::new(gpu, base, h, inter)?;
    let (mut gate, mut up, mut act) = (z(gpu, t * inter)?, z(gpu, t * inter)?, z(gpu, t * inter)?);
    wg.forward(gpu, &hn, &mut gate, (t, h, inter))?;
    wu.forward(gpu, &hn, &mut up, (t, h, inter))?;
    ops::activation::swiglu_forward(
        gpu,
        &gate.as_view(),
        &up.as_view(),
        &mut act.as_view_mut(),
        None,
    )?;
    let mut silu = z(gpu, t * inter)?;
    ops::activation::silu_forward(gpu, &gate.as_view(), &mut silu.as_view_mut(), None)?;
    let mut down = z(gpu, t * h)?;
    wd.forward(gpu, &act, &mut down, (t, inter, h))?;
    let mut h2 = z(gpu, t * h)?;
    ops::elementwise::residual_add(
        gpu,
        &h1.as_view(),
        &down.as_view(),
        &mut h2.as_view_mut(),
        None,
    )?;

    // Final norm, LM head (tied to the embedding table) and loss on a few rows.
    let rows = HEAD_ROWS.min(t);
    let head_in = h2.slice(0..rows * h);
    let mut head_n = z(gpu, rows * h)?;
    ops::rmsnorm::forward(
        gpu,
        &head_in,
        &gamma.as_view(),
        rows,
        h,
        eps,
        &mut head_n.as_view_mut(),
        None,
    )?;
    let mut logits = z(gpu, rows * c.vocab)?;
    ops::gemm::linear(gpu, fwd, &head_n, &table, &mut logits, (rows, h, c.vocab))?;
    let targets = gpu.zeros::<u32>(rows)?;
    let (mut losses, mut loss) = (z(gpu, rows)?, z(gpu, 1)?);
    ops::cross_entropy::forward(
        gpu,
        &logits.as_view(),
        rows,
        c.vocab,
        &targets.as_view(),
        &mut losses.as_view_mut(),
        &mut loss.as_view_mut(),
        None,
    )?;

    // ---- backward -----------------------------------------------------------------
    let mut dlogits = z(gpu, rows * c.vocab)?;
    ops::cross_entropy::backward(
        gpu,
        &logits.as_view(),
        rows,
        c.vocab,
        &targets.as_view(),
        &mut dlogits.as_view_mut(),
        None,
    )?;
    let mut dhead_n = z(gpu, rows * h)?;
    ops::gemm::gemm(
        gpu,
        bwd,
        GemmSpec::plain(rows, h, c.vocab),
        &dlogits,
        &table,
        &mut dhead_n,
    )?;
    let (mut dhead_in, mut dgamma_f) = (z(gpu, rows * h)?, z(gpu, h)?);
    let mut ws_head = ops::rmsnorm::BackwardWorkspace::new(gpu, rows, h)?;
    ops::rmsnorm::backward(
        gpu,
        &head_in,
        &gamma.as_view(),
        &dhead_n.as_view(),
        rows,
        h,
        eps,
        &mut dhead_in.as_view_mut(),
        &mut dgamma_f.as_view_mut(),
        &mut ws_head,
        None,
    )?;

    let dh2 = z(gpu, t * h)?;
    let (mut dh1, mut ddown) = (z(gpu, t * h)?, z(gpu, t * h)?);
    ops::elementwise::residual_add_backward(
        gpu,
        &dh2.as_view(),
        &mut dh1.as_view_mut(),
        &mut ddown.as_view_mut(),
        None,
    )?;
    let mut dact = z(gpu, t * inter)?;
    wd.backward(gpu, &ddown, &mut dact, (t, inter, h))?;
    let (mut dgate, mut dup) = (z(gpu, t * inter)?, z(gpu, t * inter)?);
    ops::activation::swiglu_backward(
        gpu,
        &gate.as_view(),
        &up.as_view(),
        &dact.as_view(),
        &mut dgate.as_view_mut(),
        &mut dup.as_view_mut(),
        None,
    )?;
    let mut dsilu = z(gpu, t * inter)?;
    ops::activation::silu_backward(
        gpu,
        &gate.as_view(),
        &dact.as_view(),
        &mut dsilu.as_view_mut(),
        None,
    )?;
    let (mut dhn_g, mut dhn_u) = (z(gpu, t * h)?, z(gpu, t * h)?);
    wg.backward(gpu, &dgate, &mut dhn_g, (t, h, inter))?;
    wu.backward(gpu, &dup, &mut dhn_u, (t, h, inter))?;
    let mut dhn = z(gpu, t * h)?;
    ops::elementwise::residual_add(
        gpu,
        &dhn_g.as_view(),
        &dhn_u.as_view(),
        &mut dhn.as_view_mut(),
        None,
    )?;
    let (mut dh1_norm, mut dgamma2) = (z(gpu, t * h)?, z(gpu, h)?);
    let mut ws = ops::rmsnorm::BackwardWorkspace::new(gpu, t, h)?;
    ops::rmsnorm::backward(
        gpu,
        &h1.as_view(),
        &gamma2.as_view(),
        &dhn.as_view(),
        t,
        h,
        eps,
        &mut dh1_norm.as_view_mut(),
        &mut dgamma2.as_view_mut(),
        &mut ws,
        None,
    )?;

    let mut dattn = z(gpu, t * q_dim)?;
    wo.backward(gpu, &dh1, &mut dattn, (t, q_dim, h))?;
    let (mut dqr, mut dkr, mut dv) = (z(gpu, t * q_dim)?, z(gpu, t * kv_dim)?, z(gpu, t * kv_dim)?);
    ops::attention::backward(
        gpu,
        (&qr, &kr, &v),
        &probs,
        &dattn,
        (&mut dqr, &mut dkr, &mut dv),
        &sh,
    )?;
    let (mut dq, mut dk) = (z(gpu, t * q_dim)?, z(gpu, t * kv_dim)?);
    ops::rope::backward(
        gpu,
        &dqr.as_view(),
        b,
        s,
        c.heads,
        c.head_dim,
        theta,
        &mut dq.as_view_mut(),
        None,
    )?;
    ops::rope::backward(
        gpu,
        &dkr.as_view(),
        b,
        s,
        c.kv_heads,
        c.head_dim,
        theta,
        &mut dk.as_view_mut(),
        None,
    )?;
    // LoRA backward: d(B A x) through the scale.
    let mut dbax = z(gpu, t * q_dim)?;
    ops::elementwise::scale_backward(
        gpu,
        &dq.as_view(),
        lora_scale,
        &mut dbax.as_view_mut(),
        None,
    )?;
    let (mut dax, mut dlora_b) = (z(gpu, t * r)?, z(gpu, q_dim * r)?);
    ops::gemm::linear_backward(
        gpu,
        bwd,
        &ax,
        &lora_b,
        &dbax,
        &mut dax,
        &mut dlora_b,
        (t, r, q_dim),
    )?;
    let (mut dxn_lora, mut dlora_a) = (z(gpu, t * h)?, z(gpu, r * h)?);
    ops::gemm::linear_backward(
        gpu,
        bwd,
        &xn,
        &lora_a,
        &dax,
        &mut dxn_lora,
        &mut dlora_a,
        (t, h, r),
    )?;
    let mut dxn = z(gpu, t * h)?;
    wq.backward(gpu, &dq, &mut dxn, (t, h, q_dim))?;
    let (mut dx, mut dgamma1) = (z(gpu, t * h)?, z(gpu, h)?);
    let mut ws1 = ops::rmsnorm::BackwardWorkspace::new(gpu, t, h)?;
    ops::rmsnorm::backward(
        gpu,
        &x.as_view(),
        &gamma.as_view(),
        &dxn.as_view(),
        t,
        h,
        eps,
        &mut dx.as_view_mut(),
        &mut dgamma1.as_view_mut(),
        &mut ws1,
        None,
    )?;
    let mut dtable = z(gpu, c.vocab * h)?;
    ops::embedding::backward(
        gpu,
        &dx.as_view(),
        c.vocab,
        h,
        &tokens.as_view(),
        &mut dtable.as_view_mut(),
        None,
    )?;

    // ---- clip + optimizer over the trainable gradients -----------------------------
    let lens = [dlora_a.len(), dlora_b.len(), dgamma1.len(), dgamma2.len()];
    let mut sq_ws = ops::clip::SquaredSumWorkspace::new(gpu, &lens)?;
    let mut sq = gpu.zeros::<f64>(1)?;
    let grads = [
        dlora_a.as_view(),
        dlora_b.as_view(),
        dgamma1.as_view(),
        dgamma2.as_view(),
    ];
    ops::clip::squared_sum(gpu, &grads, &mut sq_ws, &mut sq.as_view_mut(), None)?;
    let mut clip_scale = z(gpu, 1)?;
    ops::clip::scale(gpu, &sq.as_view(), 1.0, &mut clip_scale.as_view_mut(), None)?;
    ops::clip::apply(gpu, &mut dlora_a.as_view_mut(), &clip_scale.as_view(), None)?;
    let mut p_a = lora_a;
    let (mut m_a, mut v_a) = (z(gpu, r * h)?, z(gpu, r * h)?);
    ops::adamw::step(
        gpu,
        &mut p_a.as_view_mut(),
        &dlora_a.as_view(),
        &mut m_a.as_view_mut(),
        &mut v_a.as_view_mut(),
        &AdamW::new(1e-3, 0.0),
        1,
        None,
    )?;
    Ok(())
}
