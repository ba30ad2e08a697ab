//! GPU side of the `bandwidth` check: sets up an op's buffers, times its
//! launches as a captured graph rotating over buffer sets, times a large
//! device-to-device copy, and reports the achieved fraction of the copy's
//! bandwidth (the formula is on [`crate::check::bandwidth`]).

use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::check::bandwidth::{BandwidthOp, Params};
use crate::check::op::Pass;
use crate::check::stats::{median, ratio_ci, BOOTSTRAP_RESAMPLES};
use crate::check::{require_gpu, Comparator, Measurement, Speedup, TrialContext};
use crate::error::{Error, Result};
use qlora::gpu::timing::{time_events, time_graph};
use qlora::gpu::GpuContext;
use qlora::model::ModelConfig;
use qlora::ops;

/// Elements of the copy that gives the ceiling: 256 MiB of f32, far beyond
/// the L2 cache; `2 x 256 MiB` bytes move per copy (read + write).
pub const COPY_ELEMENTS: usize = 64 << 20;
/// The op's buffer sets together hold at least this many bytes, so a replay
/// that touches each set once cannot be served from the L2 cache.
const ROTATE_BYTES: usize = 256 << 20;
/// At most this many buffer sets.
const MAX_SETS: usize = 64;
/// At least this many launches per captured graph, so one replay is long
/// enough for the event resolution.
const MIN_LAUNCHES: usize = 8;
/// Values of the random pattern device buffers are tiled from.
const PATTERN: usize = 1 << 20;

/// Random device data: buffers are tiled, device to device, from a seeded
/// pattern (signed in `[-1, 1)` or positive in `[0.5, 1.5)`), so no timing
/// runs on zeros and setting up hundreds of MiB costs no host time.
struct Filler {
    signed: CudaSlice<f32>,
    positive: CudaSlice<f32>,
}

impl Filler {
    fn new(gpu: &GpuContext, seed: u64) -> Result<Filler> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let signed: Vec<f32> = (0..PATTERN).map(|_| rng.random_range(-1.0..1.0)).collect();
        let positive: Vec<f32> = (0..PATTERN).map(|_| rng.random_range(0.5..1.5)).collect();
        Ok(Filler {
            signed: gpu.upload(&signed)?,
            positive: gpu.upload(&positive)?,
        })
    }

    /// A device buffer of `len` values tiled from the signed pattern.
    fn signed(&self, gpu: &GpuContext, len: usize) -> Result<CudaSlice<f32>> {
        tile(gpu, &self.signed, len)
    }

    /// A device buffer of `len` values tiled from the positive pattern.
    fn positive(&self, gpu: &GpuContext, len: usize) -> Result<CudaSlice<f32>> {
        tile(gpu, &self.positive, len)
    }
}

fn tile<T: DeviceRepr + ValidAsZeroBits>(
    gpu: &GpuContext,
    src: &CudaSlice<T>,
    len: usize,
) -> Result<CudaSlice<T>> {
    let mut out = gpu.zeros::<T>(len)?;
    let mut off = 0;
    while off < len {
        let n = (len - off).min(src.len());
        let bad = || Error::InvalidArgument {
            op: "bandwidth",
            message: format!("tile [{off}, {}) of {len}", off + n),
        };
        let s = src.try_slice(0..n).ok_or_else(bad)?;
        let mut d = out.try_slice_mut(off..off + n).ok_or_else(bad)?;
        gpu.stream().memcpy_dtod(&s, &mut d)?;
        off += n;
    }
    Ok(out)
}

/// `len` random ids below `below`.
fn ids(rng: &mut ChaCha8Rng, len: usize, below: usize) -> Vec<u32> {
    let below = u32::try_from(below.max(1)).unwrap_or(u32::MAX);
    (0..len).map(|_| rng.random_range(0..below)).collect()
}

/// One launch of the op on buffer set `i`.
type Launch = Box<dyn FnMut(&mut GpuContext, usize) -> qlora::Result<()>>;

/// `sets` buffer sets made by `make` (one after another, so the seeded fill
/// is drawn in the same order as set by set), and the launch that runs `run`
/// on set `i % sets`.
fn rotating<T: 'static>(
    gpu: &mut GpuContext,
    sets: usize,
    mut make: impl FnMut(&mut GpuContext) -> Result<T>,
    mut run: impl FnMut(&mut GpuContext, &mut T) -> qlora::Result<()> + 'static,
) -> Result<Launch> {
    let mut bufs = (0..sets)
        .map(|_| make(&mut *gpu))
        .collect::<Result<Vec<_>>>()?;
    Ok(Box::new(move |gpu, i| run(gpu, &mut bufs[i % sets])))
}

/// Allocates `sets` buffer sets for `p` and returns the launch closure.
fn setup(gpu: &mut GpuContext, p: &Params, sets: usize, seed: u64) -> Result<Launch> {
    let fill = Filler::new(gpu, seed)?;
    let s = &p.shape;
    let eps = ModelConfig::RMS_EPS;
    let fwd = p.pass == Pass::Forward;
    let z = |gpu: &GpuContext, n: usize| gpu.zeros::<f32>(n);
    let launch: Launch = match p.op {
        BandwidthOp::Rmsnorm if fwd => {
            let (r, h) = (s.dim("rows"), s.dim("hidden"));
            let gamma = fill.positive(gpu, h)?;
            rotating(
                gpu,
                sets,
                |gpu| Ok((fill.signed(gpu, r * h)?, z(gpu, r * h)?)),
                move |gpu, (x, y)| {
                    ops::rmsnorm::forward(
                        gpu,
                        &x.as_view(),
                        &gamma.as_view(),
                        r,
                        h,
                        eps,
                        &mut y.as_view_mut(),
                    )
                },
            )?
        }
        BandwidthOp::Rmsnorm => {
            let (r, h) = (s.dim("rows"), s.dim("hidden"));
            let gamma = fill.positive(gpu, h)?;
            let mut dgamma = z(gpu, h)?;
            let mut ws = ops::rmsnorm::BackwardWorkspace::new(gpu, r, h)?;
            rotating(
                gpu,
                sets,
                |gpu| {
                    Ok((
                        fill.signed(gpu, r * h)?,
                        fill.signed(gpu, r * h)?,
                        z(gpu, r * h)?,
                    ))
                },
                move |gpu, (x, dy, dx)| {
                    ops::rmsnorm::backward(
                        gpu,
                        &x.as_view(),
                        &gamma.as_view(),
                        &dy.as_view(),
                        r,
                        h,
                        eps,
                        &mut dx.as_view_mut(),
                        &mut dgamma.as_view_mut(),
                        &mut ws,
                    )
                },
            )?
        }
        BandwidthOp::RmsnormResidual => {
            let (r, h) = (s.dim("rows"), s.dim("hidden"));
            let gamma = fill.positive(gpu, h)?;
            rotating(
                gpu,
                sets,
                |gpu| {
                    Ok((
                        fill.signed(gpu, r * h)?,
                        fill.signed(gpu, r * h)?,
                        z(gpu, r * h)?,
                        z(gpu, r * h)?,
                    ))
                },
                move |gpu, (a, b, hs, y)| {
                    ops::rmsnorm::forward_residual(
                        gpu,
                        &a.as_view(),
                        &b.as_view(),
                        &gamma.as_view(),
                        r,
                        h,
                        eps,
                        &mut hs.as_view_mut(),
                        &mut y.as_view_mut(),
                    )
                },
            )?
        }
        BandwidthOp::Rope => {
            let (b, sq, hd, d) = (
                s.dim("batch"),
                s.dim("seq"),
                s.dim("heads"),
                s.dim("head_dim"),
            );
            let n = b * sq * hd * d;
            let theta = ModelConfig::ROPE_THETA;
            rotating(
                gpu,
                sets,
                |gpu| Ok((fill.signed(gpu, n)?, z(gpu, n)?)),
                move |gpu, (x, y)| {
                    if fwd {
                        ops::rope::forward(
                            gpu,
                            &x.as_view(),
                            b,
                            sq,
                            hd,
                            d,
                            theta,
                            &mut y.as_view_mut(),
                        )
                    } else {
                        ops::rope::backward(
                            gpu,
                            &x.as_view(),
                            b,
                            sq,
                            hd,
                            d,
                            theta,
                            &mut y.as_view_mut(),
                        )
                    }
                },
            )?
        }
        BandwidthOp::Silu => {
            let n = s.dim("rows") * s.dim("cols");
            rotating(
                gpu,
                sets,
                |gpu| Ok((fill.signed(gpu, n)?, fill.signed(gpu, n)?, z(gpu, n)?)),
                move |gpu, (x, dy, out)| {
                    if fwd {
                        ops::activation::silu_forward(gpu, &x.as_view(), &mut out.as_view_mut())
                    } else {
                        ops::activation::silu_backward(
                            gpu,
                            &x.as_view(),
                            &dy.as_view(),
                            &mut out.as_view_mut(),
                        )
                    }
                },
            )?
        }
        BandwidthOp::Swiglu => {
            let n = s.dim("rows") * s.dim("cols");
            rotating(
                gpu,
                sets,
                |gpu| {
                    let dy = if fwd {
                        z(gpu, 1)?
                    } else {
                        fill.signed(gpu, n)?
                    };
                    let dup = if fwd { z(gpu, 1)? } else { z(gpu, n)? };
                    Ok((
                        fill.signed(gpu, n)?,
                        fill.signed(gpu, n)?,
                        dy,
                        z(gpu, n)?,
                        dup,
                    ))
                },
                move |gpu, (gate, up, dy, out, dup)| {
                    if fwd {
                        ops::activation::swiglu_forward(
                            gpu,
                            &gate.as_view(),
                            &up.as_view(),
                            &mut out.as_view_mut(),
                        )
                    } else {
                        ops::activation::swiglu_backward(
                            gpu,
                            &gate.as_view(),
                            &up.as_view(),
                            &dy.as_view(),
                            &mut out.as_view_mut(),
                            &mut dup.as_view_mut(),
                        )
                    }
                },
            )?
        }
        BandwidthOp::ResidualAdd => {
            let n = s.dim("rows") * s.dim("cols");
            rotating(
                gpu,
                sets,
                |gpu| {
                    let b = if fwd {
                        fill.signed(gpu, n)?
                    } else {
                        z(gpu, n)?
                    };
                    Ok((fill.signed(gpu, n)?, b, z(gpu, n)?))
                },
                move |gpu, (a, b, y)| {
                    if fwd {
                        ops::elementwise::residual_add(
                            gpu,
                            &a.as_view(),
                            &b.as_view(),
                            &mut y.as_view_mut(),
                        )
                    } else {
                        // a is dy; b and y are the two gradients written.
                        ops::elementwise::residual_add_backward(
                            gpu,
                            &a.as_view(),
                            &mut b.as_view_mut(),
                            &mut y.as_view_mut(),
                        )
                    }
                },
            )?
        }
        BandwidthOp::Scale => {
            let n = s.dim("rows") * s.dim("cols");
            rotating(
                gpu,
                sets,
                |gpu| Ok((fill.signed(gpu, n)?, z(gpu, n)?)),
                move |gpu, (x, y)| {
                    // Not a power of two, so the product really rounds.
                    let factor = 0.7;
                    if fwd {
                        ops::elementwise::scale(gpu, &x.as_view(), factor, &mut y.as_view_mut())
                    } else {
                        ops::elementwise::scale_backward(
                            gpu,
                            &x.as_view(),
                            factor,
                            &mut y.as_view_mut(),
                        )
                    }
                },
            )?
        }
        BandwidthOp::CrossEntropy => {
            let (r, v) = (s.dim("rows"), s.dim("vocab"));
            let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x7a);
            rotating(
                gpu,
                sets,
                |gpu| {
                    let targets = gpu.upload(&ids(&mut rng, r, v))?;
                    let out = if fwd { z(gpu, r)? } else { z(gpu, r * v)? };
                    Ok((fill.signed(gpu, r * v)?, targets, out, z(gpu, 1)?))
                },
                move |gpu, (logits, targets, out, loss)| {
                    if fwd {
                        ops::cross_entropy::forward(
                            gpu,
                            &logits.as_view(),
                            r,
                            v,
                            &targets.as_view(),
                            &mut out.as_view_mut(),
                            &mut loss.as_view_mut(),
                        )
                    } else {
                        ops::cross_entropy::backward(
                            gpu,
                            &logits.as_view(),
                            r,
                            v,
                            &targets.as_view(),
                            &mut out.as_view_mut(),
                        )
                    }
                },
            )?
        }
        BandwidthOp::SquaredSum => {
            let n = s.dim("n");
            let mut ws = ops::clip::SquaredSumWorkspace::new(gpu, &[n])?;
            let mut sq = gpu.zeros::<f64>(1)?;
            rotating(
                gpu,
                sets,
                |gpu| fill.signed(gpu, n),
                move |gpu, g| {
                    ops::clip::squared_sum(gpu, &[g.as_view()], &mut ws, &mut sq.as_view_mut())
                },
            )?
        }
        BandwidthOp::ClipApply => {
            let n = s.dim("n");
            // A scale of exactly 1: the kernel still reads, multiplies and
            // writes every value, and thousands of in-place replays cannot
            // shrink the data to zeros.
            let scale = gpu.upload(&[1.0f32])?;
            rotating(
                gpu,
                sets,
                |gpu| fill.signed(gpu, n),
                move |gpu, g| ops::clip::apply(gpu, &mut g.as_view_mut(), &scale.as_view()),
            )?
        }
        BandwidthOp::Adamw => {
            let n = s.dim("n");
            let hyper = qlora::train::AdamW::new(1e-3, 0.01);
            rotating(
                gpu,
                sets,
                |gpu| {
                    Ok((
                        fill.signed(gpu, n)?,
                        fill.signed(gpu, n)?,
                        fill.signed(gpu, n)?,
                        fill.positive(gpu, n)?,
                    ))
                },
                move |gpu, (p, g, m, v)| {
                    ops::adamw::step(
                        gpu,
                        &mut p.as_view_mut(),
                        &g.as_view(),
                        &mut m.as_view_mut(),
                        &mut v.as_view_mut(),
                        &hyper,
                        1,
                    )
                },
            )?
        }
        BandwidthOp::Embedding => {
            let (t, v, h) = (s.dim("tokens"), s.dim("vocab"), s.dim("hidden"));
            let table = fill.signed(gpu, v * h)?;
            let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xe3);
            rotating(
                gpu,
                sets,
                |gpu| Ok((gpu.upload(&ids(&mut rng, t, v))?, z(gpu, t * h)?)),
                move |gpu, (tokens, y)| {
                    ops::embedding::forward(
                        gpu,
                        &table.as_view(),
                        v,
                        h,
                        &tokens.as_view(),
                        &mut y.as_view_mut(),
                    )
                },
            )?
        }
        BandwidthOp::Nf4Dequantize => {
            let n = s.dim("rows") * s.dim("cols");
            ops::nf4::check_len("bandwidth", n)?;
            rotating(
                gpu,
                sets,
                |gpu| {
                    let w = fill.signed(gpu, n)?;
                    let mut q = ops::nf4::Nf4Device::zeros(gpu, n)?;
                    ops::nf4::quantize(gpu, &w, &mut q)?;
                    Ok((q, z(gpu, n)?))
                },
                move |gpu, (q, out)| ops::nf4::dequantize(gpu, q, out),
            )?
        }
    };
    gpu.synchronize()?;
    Ok(launch)
}

/// Median-time samples of the 256 MiB device-to-device copy, in ms.
pub fn copy_samples(
    gpu: &mut GpuContext,
    warmup: usize,
    repeats: usize,
    seed: u64,
) -> Result<Vec<f64>> {
    let fill = Filler::new(gpu, seed)?;
    let src = fill.signed(gpu, COPY_ELEMENTS)?;
    let mut dst = gpu.zeros::<f32>(COPY_ELEMENTS)?;
    Ok(time_events(gpu, warmup, repeats, 1, |gpu| {
        Ok(gpu.stream().memcpy_dtod(&src, &mut dst)?)
    })?)
}

/// Bytes the copy moves: read plus write.
pub fn copy_bytes() -> usize {
    2 * COPY_ELEMENTS * std::mem::size_of::<f32>()
}

/// The `bandwidth` check, with the trial's faults on (launch shapes and
/// launchers alike) until it returns.
pub fn measure(p: &Params, cx: &mut TrialContext<'_>) -> Result<Measurement> {
    let (seed, faults) = (cx.seed, cx.faults());
    let gpu = require_gpu(cx)?;
    measure_body(p, &mut gpu.with_faults(faults), seed)
}

fn measure_body(p: &Params, gpu: &mut GpuContext, seed: u64) -> Result<Measurement> {
    let (warmup, repeats) = (p.warmup.0, p.repeats.0);
    let bytes = p.bytes();
    let sets = ROTATE_BYTES.div_ceil(bytes.max(1)).clamp(1, MAX_SETS);
    let launches = sets.max(MIN_LAUNCHES);
    let kernel = {
        let mut launch = setup(gpu, p, sets, seed)?;
        time_graph(gpu, launches, warmup, repeats, |gpu, i| launch(gpu, i))?
    };
    let copy = copy_samples(gpu, warmup, repeats, seed)?;
    let (t_k, t_c) = (median(&kernel), median(&copy));
    let copy_gbs = copy_bytes() as f64 / (t_c * 1e6);
    let kernel_gbs = bytes as f64 / (t_k * 1e6);
    let fraction = kernel_gbs / copy_gbs;
    // The copy time scaled to the op's bytes: the time the op would take at
    // the copy's bandwidth, so baseline / candidate is the fraction.
    let per_op = bytes as f64 / copy_bytes() as f64;
    let baseline: Vec<f64> = copy.iter().map(|t| t * per_op).collect();
    let (lo, hi) = ratio_ci(&baseline, &kernel, seed, BOOTSTRAP_RESAMPLES);
    let subject = p.subject();
    let device = gpu.facts().name.clone();
    let mut m = Measurement::new(
        "bandwidth_fraction",
        fraction,
        Comparator::Ge,
        p.min_fraction.0,
        "ratio",
    )
    .with_detail(format!(
        "{subject} {}: {bytes} B in {:.2} us = {kernel_gbs:.0} GB/s; d2d copy {copy_gbs:.0} GB/s \
         (256 MiB, {:.3} ms); fraction {fraction:.3} [{lo:.3}, {hi:.3}]; {sets} buffer sets, \
         {launches} launches per graph, {repeats} repeats; {device}",
        p.shape,
        t_k * 1e3,
        t_c,
    ));
    m.speedups.push(Speedup {
        subject,
        model: p.shape.to_string(),
        batch: 0,
        seq_len: 0,
        baseline: "d2d copy".into(),
        candidate: format!("{} kernel", p.op.name()),
        baseline_median_ms: median(&baseline),
        candidate_median_ms: t_k,
        ratio: fraction,
        ratio_ci_low: lo,
        ratio_ci_high: hi,
        repeats,
    });
    Ok(m)
}
