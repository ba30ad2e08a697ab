//! `op_parity` of `adamw`: the launchers of `qlora::ops::adamw` against the oracle.

use super::compare::{case_rng, compare_in_place, uniform, widen, Case, Comparison};
use crate::error::Result;
use crate::reference::adamw::AdamState;
use qlora::gpu::GpuContext;
use qlora::ops::adamw::*;
use qlora::train::AdamW;
use rand::Rng;

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
    reference_adamw(&as_kernel_args(&hyper)).step(&mut want_p, &widen(&g), &mut state)?;

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
    )?;
    let c_p = compare_in_place(&gpu.download(&d_p)?, &p, &want_p);
    let c_m = compare_in_place(&gpu.download(&d_m)?, &m, &state.m);
    let c_v = compare_in_place(&gpu.download(&d_v)?, &v, &state.v);
    Ok(c_p.merge(c_m).merge(c_v))
}

/// The oracle's AdamW with the stack's hyper-parameters.
fn reference_adamw(h: &AdamW) -> crate::reference::adamw::AdamW {
    crate::reference::adamw::AdamW {
        lr: h.lr,
        beta1: h.beta1,
        beta2: h.beta2,
        eps: h.eps,
        weight_decay: h.weight_decay,
    }
}
