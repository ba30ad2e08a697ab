//! Launcher for `kernels/adamw.cu`: one AdamW step with bias correction and
//! decoupled weight decay, in place on the device:
//!
//! ```text
//! m = b1 m + (1 - b1) g,   v = b2 v + (1 - b2) g^2
//! p -= lr (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + wd p)
//! ```

use cudarc::driver::{CudaView, CudaViewMut, PushKernelArg};
use rand::Rng;

use super::parity::{
    case_rng, compare_in_place, uniform, vec4_launch, widen, Arg, Case, Comparison, Signatures,
};
use crate::error::{Error, Result};
use crate::gpu::GpuContext;
use crate::mutant::Mutant;
use crate::reference::adamw::{AdamState, AdamW};
use crate::reference::elementwise::expect_len;

pub const MODULE: &str = "adamw";

/// Kernel argument lists, checked against the compiled PTX by a unit test.
pub const SIGNATURES: Signatures = &[(
    "adamw_step_f32",
    &[
        Arg::Ptr,
        Arg::Ptr,
        Arg::Ptr,
        Arg::Ptr,
        Arg::I32,
        Arg::I32,
        Arg::F32,
        Arg::F32,
        Arg::F32,
        Arg::F32,
        Arg::F32,
    ],
)];

/// The hyper-parameters rounded to the f32 the kernel receives, so a
/// reference can run with exactly the values the kernel used.
pub fn as_kernel_args(h: &AdamW) -> AdamW {
    let r = |v: f64| f64::from(v as f32);
    AdamW {
        lr: r(h.lr),
        beta1: r(h.beta1),
        beta2: r(h.beta2),
        eps: r(h.eps),
        weight_decay: r(h.weight_decay),
    }
}

/// One AdamW step `t >= 1` on `p` with gradient `g`, updating `p`, `m`, `v`
/// in place. `t` is the step number after this update (1 on the first step).
#[allow(clippy::too_many_arguments)]
pub fn step(
    gpu: &mut GpuContext,
    p: &mut CudaViewMut<'_, f32>,
    g: &CudaView<'_, f32>,
    m: &mut CudaViewMut<'_, f32>,
    v: &mut CudaViewMut<'_, f32>,
    hyper: &AdamW,
    t: u64,
    fault: Option<Mutant>,
) -> Result<()> {
    let n = p.len();
    expect_len("adamw", "g", g.len(), &[n])?;
    expect_len("adamw", "m", m.len(), &[n])?;
    expect_len("adamw", "v", v.len(), &[n])?;
    let step_i =
        i32::try_from(t)
            .ok()
            .filter(|&s| s >= 1)
            .ok_or_else(|| Error::InvalidArgument {
                op: "adamw",
                message: format!("step must be in [1, 2^31), got {t}"),
            })?;
    let Some((n_i, cfg)) = vec4_launch(gpu, "adamw", n, fault)? else {
        return Ok(());
    };
    let k = as_kernel_args(hyper);
    let (lr, b1, b2, eps, wd) = (
        k.lr as f32,
        k.beta1 as f32,
        k.beta2 as f32,
        k.eps as f32,
        k.weight_decay as f32,
    );
    let f = gpu.function(MODULE, "adamw_step_f32")?;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(p).arg(g).arg(m).arg(v).arg(&n_i).arg(&step_i);
    l.arg(&lr).arg(&b1).arg(&b2).arg(&eps).arg(&wd);
    // SAFETY: adamw_step_f32(float* p, const float* g, float* m, float* v,
    // int n, int step, float lr, float beta1, float beta2, float eps,
    // float weight_decay): p, g, m, v hold n >= n_i elements (checked above);
    // p, m, v are distinct mutable borrows and g a shared one, so none alias.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// `op_parity` of one AdamW step for one `{n}` shape: a random state after
/// `t - 1` steps, `t` in 1..=20, compared on p, m and v.
pub fn parity(gpu: &mut GpuContext, case: &Case<'_>) -> Result<Comparison> {
    let n = case.shape.dim("n");
    let mut rng = case_rng(case.seed);
    let p = uniform(&mut rng, n, -1.0, 1.0);
    let g = uniform(&mut rng, n, -0.1, 0.1);
    let m = uniform(&mut rng, n, -0.01, 0.01);
    let v = uniform(&mut rng, n, 0.0, 1e-4);
    let t: u64 = rng.random_range(1..=20);
    let hyper = AdamW::new(1e-3, 0.01);

    let mut want_p = widen(&p);
    let mut state = AdamState {
        m: widen(&m),
        v: widen(&v),
        t: t - 1,
    };
    as_kernel_args(&hyper).step(&mut want_p, &widen(&g), &mut state)?;

    let mut d_p = gpu.upload(&p)?;
    let d_g = gpu.upload(&g)?;
    let mut d_m = gpu.upload(&m)?;
    let mut d_v = gpu.upload(&v)?;
    step(
        gpu,
        &mut d_p.as_view_mut(),
        &d_g.as_view(),
        &mut d_m.as_view_mut(),
        &mut d_v.as_view_mut(),
        &hyper,
        t,
        case.mutant,
    )?;
    let c_p = compare_in_place(&gpu.download(&d_p)?, &p, &want_p);
    let c_m = compare_in_place(&gpu.download(&d_m)?, &m, &state.m);
    let c_v = compare_in_place(&gpu.download(&d_v)?, &v, &state.v);
    Ok(c_p.merge(c_m).merge(c_v))
}
