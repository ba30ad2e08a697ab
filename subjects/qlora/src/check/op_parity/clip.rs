//! `op_parity` of `clip`: the launchers of `qlora::ops::clip` against the oracle.

use super::compare::{case_rng, compare, compare_in_place, uniform, widen, Case, Comparison};
use crate::check::op::Op;
use crate::error::Result;
use crate::reference::clip as refop;
use qlora::gpu::GpuContext;
use qlora::ops::clip::*;
use rand::Rng;

/// `op_parity` of the squared sum, clip scale or clip apply for one `{n}` shape.
pub fn parity(op: Op, gpu: &mut GpuContext, case: &Case<'_>) -> Result<Comparison> {
    let n = case.shape.dim("n");
    let mut rng = case_rng(case.seed);
    let g = uniform(&mut rng, n, -1.0, 1.0);
    match op {
        Op::SquaredSum => {
            let lens = split(n);
            let mut parts = Vec::new();
            let mut start = 0;
            for &len in &lens {
                parts.push(widen(&g[start..start + len]));
                start += len;
            }
            let refs: Vec<&[f64]> = parts.iter().map(Vec::as_slice).collect();
            let want = refop::squared_sum(&refs);
            let d_g = gpu.upload(&g)?;
            let mut views = Vec::new();
            let mut start = 0;
            for &len in &lens {
                views.push(d_g.slice(start..start + len));
                start += len;
            }
            let mut ws = SquaredSumWorkspace::new(gpu, &lens)?;
            let mut sq = gpu.upload(&[f64::NAN])?;
            squared_sum(gpu, &views, &mut ws, &mut sq.as_view_mut())?;
            let got: Vec<f32> = gpu.download(&sq)?.iter().map(|&v| v as f32).collect();
            Ok(compare(&got, &[want]))
        }
        Op::ClipScale => {
            // max_norm between 0.1x and 2x the norm: both the clipping and the
            // pass-through (scale == 1) side occur across seeds.
            let sq_val = refop::squared_sum(&[&widen(&g)]);
            let max_norm =
                f64::from((sq_val.sqrt() as f32) * rng.random_range(0.1f32..2.0)).max(1e-3);
            let max_norm_ref = f64::from(max_norm as f32);
            let want = refop::scale(sq_val, max_norm_ref);
            let d_sq = gpu.upload(&[sq_val])?;
            let mut s = gpu.poisoned(1)?;
            scale(gpu, &d_sq.as_view(), max_norm, &mut s.as_view_mut())?;
            Ok(compare(&gpu.download(&s)?, &[want]))
        }
        _ => {
            // A scale well below one, so every element must change.
            let s = rng.random_range(0.05f32..0.5);
            let mut want = widen(&g);
            refop::apply(&mut want, f64::from(s));
            let mut d_g = gpu.upload(&g)?;
            let d_s = gpu.upload(&[s])?;
            apply(gpu, &mut d_g.as_view_mut(), &d_s.as_view())?;
            Ok(compare_in_place(&gpu.download(&d_g)?, &g, &want))
        }
    }
}

/// Splits `n` values into three tensors of unequal length (fewer when `n < 3`),
/// so the multi-tensor path of the squared sum is exercised.
fn split(n: usize) -> Vec<usize> {
    if n < 3 {
        return vec![n];
    }
    let a = n / 2;
    let b = n / 3;
    vec![a, b, n - a - b]
}
