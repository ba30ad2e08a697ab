//! Launcher for `kernels/adamw.cu`: one AdamW step with bias correction and
//! decoupled weight decay, in place on the device:
//!
//! ```text
//! m = b1 m + (1 - b1) g,   v = b2 v + (1 - b2) g^2
//! p -= lr (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + wd p)
//! ```

use cudarc::driver::{CudaView, CudaViewMut, PushKernelArg};

use super::launch::expect_len;
use super::launch::vec4_launch;
use crate::error::{Error, Result};
use crate::gpu::GpuContext;
use crate::kernels::abi::{Arg, Signatures};
use crate::train::AdamW;

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
/// host computation can use exactly the values the kernel used.
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
    let Some((n_i, cfg)) = vec4_launch(gpu, "adamw", n)? else {
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
