//! `op_parity` of `elementwise`: the launchers of `qlora::ops::elementwise` against the oracle.

use super::compare::{case_rng, compare, uniform, widen, Case, Comparison};
use crate::check::op::{Op, Pass};
use crate::error::Result;
use crate::reference;
use qlora::gpu::GpuContext;
use qlora::ops::elementwise::*;
use rand::Rng;

/// `op_parity` of residual add or scale for one `{rows, cols}` shape.
pub fn parity(op: Op, gpu: &mut GpuContext, case: &Case<'_>) -> Result<Comparison> {
    let n = case.shape.dim("rows") * case.shape.dim("cols");
    let mut rng = case_rng(case.seed);
    match (op, case.pass) {
        (Op::ResidualAdd, Pass::Forward) => {
            let a = uniform(&mut rng, n, -2.0, 2.0);
            let b = uniform(&mut rng, n, -2.0, 2.0);
            let want = reference::elementwise::residual_add(&widen(&a), &widen(&b))?;
            let (da, db) = (gpu.upload(&a)?, gpu.upload(&b)?);
            let mut y = gpu.poisoned(n)?;
            residual_add(gpu, &da.as_view(), &db.as_view(), &mut y.as_view_mut())?;
            Ok(compare(&gpu.download(&y)?, &want))
        }
        (Op::ResidualAdd, Pass::Backward) => {
            let g = uniform(&mut rng, n, -2.0, 2.0);
            let (want_a, want_b) = reference::elementwise::residual_add_backward(&widen(&g));
            let dg = gpu.upload(&g)?;
            let mut da = gpu.poisoned(n)?;
            let mut db = gpu.poisoned(n)?;
            residual_add_backward(
                gpu,
                &dg.as_view(),
                &mut da.as_view_mut(),
                &mut db.as_view_mut(),
            )?;
            let ca = compare(&gpu.download(&da)?, &want_a);
            let cb = compare(&gpu.download(&db)?, &want_b);
            Ok(ca.merge(cb))
        }
        (_, pass) => {
            let x = uniform(&mut rng, n, -2.0, 2.0);
            // A scale that is not a power of two, so the product really rounds.
            let s = f64::from(rng.random_range(0.3f32..3.0));
            let dx = gpu.upload(&x)?;
            let mut y = gpu.poisoned(n)?;
            let want = if pass == Pass::Forward {
                scale(gpu, &dx.as_view(), s, &mut y.as_view_mut())?;
                reference::elementwise::scale(&widen(&x), s)
            } else {
                scale_backward(gpu, &dx.as_view(), s, &mut y.as_view_mut())?;
                reference::elementwise::scale_backward(&widen(&x), s)
            };
            Ok(compare(&gpu.download(&y)?, &want))
        }
    }
}
