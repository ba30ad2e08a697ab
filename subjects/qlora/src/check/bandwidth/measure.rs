//! GPU side of the `bandwidth` check: sets up an op's buffers, times its
//! launches as a captured graph rotating over buffer sets, times a
//! device-to-device copy of the same bytes the same way, and reports the
//! achieved fraction of the copy's bandwidth (the formula is on
//! [`crate::check::bandwidth`]).

use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::check::bandwidth::Params;
use crate::check::op::Pass;
use crate::check::params::Shape;
use crate::check::stats::{median, ratio_ci, BOOTSTRAP_RESAMPLES};
use crate::check::MutantFaults;
use crate::check::{require_gpu, Comparator, Measurement, Speedup, TrialContext};
use crate::error::{Error, Result};
use qlora::gpu::timing::time_graph;
use qlora::gpu::GpuContext;
use qlora::model::ModelConfig;
use qlora::ops;

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
pub(crate) type Launch = Box<dyn FnMut(&mut GpuContext, usize) -> qlora::Result<()>>;

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

/// One f32 buffer of a set, by length: tiled from the signed or the
/// positive pattern, or zeroed.
#[derive(Clone, Copy)]
enum Buf {
    Signed(usize),
    Positive(usize),
    Zeros(usize),
}

use Buf::{Positive, Signed, Zeros};

/// What a case sets up from, besides the GPU.
pub struct Setup<'a> {
    fill: &'a Filler,
    shape: &'a Shape,
    fwd: bool,
    sets: usize,
    seed: u64,
}

impl Setup<'_> {
    fn dim(&self, name: &str) -> usize {
        self.shape.dim(name)
    }

    /// `rotating` over sets of f32 buffers made as `spec` lists them, in its
    /// order; `run` gets a set as an array in the same order.
    fn f32_sets<const K: usize>(
        &self,
        gpu: &mut GpuContext,
        spec: [Buf; K],
        run: impl FnMut(&mut GpuContext, &mut [CudaSlice<f32>; K]) -> qlora::Result<()> + 'static,
    ) -> Result<Launch> {
        let make = |gpu: &mut GpuContext| {
            let set = spec
                .iter()
                .map(|&b| match b {
                    Signed(n) => self.fill.signed(gpu, n),
                    Positive(n) => self.fill.positive(gpu, n),
                    Zeros(n) => Ok(gpu.zeros::<f32>(n)?),
                })
                .collect::<Result<Vec<_>>>()?;
            // Cannot fail: `set` has one buffer per entry of `spec`.
            <[_; K]>::try_from(set).map_err(|set| Error::InvalidArgument {
                op: "bandwidth",
                message: format!("{} buffers made for a set of {K}", set.len()),
            })
        };
        rotating(gpu, self.sets, make, run)
    }
}

/// A case: allocates the buffer sets for one op (and pass) and returns the
/// launch closure.
pub(crate) type Case = fn(&mut GpuContext, &Setup<'_>) -> Result<Launch>;

/// Allocates `sets` buffer sets for `p` and returns the launch closure.
fn setup(gpu: &mut GpuContext, p: &Params, sets: usize, seed: u64) -> Result<Launch> {
    let fill = Filler::new(gpu, seed)?;
    let cx = Setup {
        fill: &fill,
        shape: &p.shape,
        fwd: p.pass == Pass::Forward,
        sets,
        seed,
    };
    // Ops with no backward kernel run forward whatever the pass
    // (`Params::validate` refuses them backward).
    let case = p.op.kernel.case(p.pass).unwrap_or(p.op.kernel.forward);
    let launch = case(gpu, &cx)?;
    gpu.synchronize()?;
    Ok(launch)
}

/// The RMSNorm cases' epsilon.
const EPS: f64 = ModelConfig::RMS_EPS;

pub(crate) fn rmsnorm_fwd(gpu: &mut GpuContext, cx: &Setup<'_>) -> Result<Launch> {
    let (r, h) = (cx.dim("rows"), cx.dim("hidden"));
    let gamma = cx.fill.positive(gpu, h)?;
    cx.f32_sets(gpu, [Signed(r * h), Zeros(r * h)], move |gpu, [x, y]| {
        let (x, g) = (&x.as_view(), &gamma.as_view());
        ops::rmsnorm::forward(gpu, x, g, r, h, EPS, &mut y.as_view_mut())
    })
}

pub(crate) fn rmsnorm_bwd(gpu: &mut GpuContext, cx: &Setup<'_>) -> Result<Launch> {
    let (r, h) = (cx.dim("rows"), cx.dim("hidden"));
    let gamma = cx.fill.positive(gpu, h)?;
    let mut dgamma = gpu.zeros::<f32>(h)?;
    let mut ws = ops::rmsnorm::BackwardWorkspace::new(gpu, r, h)?;
    let spec = [Signed(r * h), Signed(r * h), Zeros(r * h)];
    cx.f32_sets(gpu, spec, move |gpu, [x, dy, dx]| {
        let (x, g, dy) = (&x.as_view(), &gamma.as_view(), &dy.as_view());
        let (dx, dg) = (&mut dx.as_view_mut(), &mut dgamma.as_view_mut());
        ops::rmsnorm::backward(gpu, x, g, dy, r, h, EPS, dx, dg, &mut ws)
    })
}

pub(crate) fn rmsnorm_residual(gpu: &mut GpuContext, cx: &Setup<'_>) -> Result<Launch> {
    let (r, h) = (cx.dim("rows"), cx.dim("hidden"));
    let gamma = cx.fill.positive(gpu, h)?;
    let spec = [Signed(r * h), Signed(r * h), Zeros(r * h), Zeros(r * h)];
    cx.f32_sets(gpu, spec, move |gpu, [a, b, hs, y]| {
        let (a, b, g) = (&a.as_view(), &b.as_view(), &gamma.as_view());
        let (hs, y) = (&mut hs.as_view_mut(), &mut y.as_view_mut());
        ops::rmsnorm::forward_residual(gpu, a, b, g, r, h, EPS, hs, y)
    })
}

pub(crate) fn rope(gpu: &mut GpuContext, cx: &Setup<'_>) -> Result<Launch> {
    let (b, sq) = (cx.dim("batch"), cx.dim("seq"));
    let (hd, d) = (cx.dim("heads"), cx.dim("head_dim"));
    let n = b * sq * hd * d;
    let theta = ModelConfig::ROPE_THETA;
    let op = if cx.fwd {
        ops::rope::forward
    } else {
        ops::rope::backward
    };
    cx.f32_sets(gpu, [Signed(n), Zeros(n)], move |gpu, [x, y]| {
        op(gpu, &x.as_view(), b, sq, hd, d, theta, &mut y.as_view_mut())
    })
}

pub(crate) fn silu(gpu: &mut GpuContext, cx: &Setup<'_>) -> Result<Launch> {
    let n = cx.dim("rows") * cx.dim("cols");
    let fwd = cx.fwd;
    let spec = [Signed(n), Signed(n), Zeros(n)];
    cx.f32_sets(gpu, spec, move |gpu, [x, dy, out]| {
        let (x, out) = (&x.as_view(), &mut out.as_view_mut());
        if fwd {
            ops::activation::silu_forward(gpu, x, out)
        } else {
            ops::activation::silu_backward(gpu, x, &dy.as_view(), out)
        }
    })
}

pub(crate) fn swiglu(gpu: &mut GpuContext, cx: &Setup<'_>) -> Result<Launch> {
    let n = cx.dim("rows") * cx.dim("cols");
    let fwd = cx.fwd;
    // Forward leaves dy and dup unused: one zero each.
    let dy = if fwd { Zeros(1) } else { Signed(n) };
    let dup = Zeros(if fwd { 1 } else { n });
    let spec = [dy, dup, Signed(n), Signed(n), Zeros(n)];
    cx.f32_sets(gpu, spec, move |gpu, [dy, dup, gate, up, out]| {
        let (gate, up) = (&gate.as_view(), &up.as_view());
        let out = &mut out.as_view_mut();
        if fwd {
            ops::activation::swiglu_forward(gpu, gate, up, out)
        } else {
            let (dy, dup) = (&dy.as_view(), &mut dup.as_view_mut());
            ops::activation::swiglu_backward(gpu, gate, up, dy, out, dup)
        }
    })
}

pub(crate) fn residual_add(gpu: &mut GpuContext, cx: &Setup<'_>) -> Result<Launch> {
    let n = cx.dim("rows") * cx.dim("cols");
    let fwd = cx.fwd;
    let b = if fwd { Signed(n) } else { Zeros(n) };
    cx.f32_sets(gpu, [b, Signed(n), Zeros(n)], move |gpu, [b, a, y]| {
        let (a, y) = (&a.as_view(), &mut y.as_view_mut());
        if fwd {
            ops::elementwise::residual_add(gpu, a, &b.as_view(), y)
        } else {
            // a is dy; b and y are the two gradients written.
            ops::elementwise::residual_add_backward(gpu, a, &mut b.as_view_mut(), y)
        }
    })
}

pub(crate) fn scale(gpu: &mut GpuContext, cx: &Setup<'_>) -> Result<Launch> {
    let n = cx.dim("rows") * cx.dim("cols");
    // Not a power of two, so the product really rounds.
    let factor = 0.7;
    let op = if cx.fwd {
        ops::elementwise::scale
    } else {
        ops::elementwise::scale_backward
    };
    cx.f32_sets(gpu, [Signed(n), Zeros(n)], move |gpu, [x, y]| {
        op(gpu, &x.as_view(), factor, &mut y.as_view_mut())
    })
}

pub(crate) fn cross_entropy(gpu: &mut GpuContext, cx: &Setup<'_>) -> Result<Launch> {
    let (r, v) = (cx.dim("rows"), cx.dim("vocab"));
    let fwd = cx.fwd;
    let mut rng = ChaCha8Rng::seed_from_u64(cx.seed ^ 0x7a);
    // Each set's logits, targets, output, mean loss and row stats; the
    // backward's stats are its logits' own, written by one forward here.
    let make = |gpu: &mut GpuContext| {
        let targets = gpu.upload(&ids(&mut rng, r, v))?;
        let out = gpu.zeros::<f32>(if fwd { r } else { r * v })?;
        let logits = cx.fill.signed(gpu, r * v)?;
        let mut loss = gpu.zeros::<f32>(1)?;
        let mut stats = ops::cross_entropy::RowStats::new(gpu, r)?;
        if !fwd {
            let mut losses = gpu.zeros::<f32>(r)?;
            let (x, t) = (&logits.as_view(), &targets.as_view());
            let (rl, l) = (&mut losses.as_view_mut(), &mut loss.as_view_mut());
            ops::cross_entropy::forward(gpu, x, r, v, t, rl, l, &mut stats)?;
        }
        Ok((logits, targets, out, loss, stats))
    };
    rotating(gpu, cx.sets, make, move |gpu, set| {
        let (logits, targets, out, loss, stats) = set;
        let (logits, targets) = (&logits.as_view(), &targets.as_view());
        let out = &mut out.as_view_mut();
        if fwd {
            let loss = &mut loss.as_view_mut();
            ops::cross_entropy::forward(gpu, logits, r, v, targets, out, loss, stats)
        } else {
            ops::cross_entropy::backward(gpu, logits, r, v, targets, stats, out)
        }
    })
}

pub(crate) fn squared_sum(gpu: &mut GpuContext, cx: &Setup<'_>) -> Result<Launch> {
    let n = cx.dim("n");
    let mut ws = ops::clip::SquaredSumWorkspace::new(gpu, &[n])?;
    let mut sq = gpu.zeros::<f64>(1)?;
    cx.f32_sets(gpu, [Signed(n)], move |gpu, [g]| {
        ops::clip::squared_sum(gpu, &[g.as_view()], &mut ws, &mut sq.as_view_mut())
    })
}

pub(crate) fn clip_apply(gpu: &mut GpuContext, cx: &Setup<'_>) -> Result<Launch> {
    let n = cx.dim("n");
    // A scale of exactly 1: the kernel still reads, multiplies and writes
    // every value, and thousands of in-place replays cannot shrink the data
    // to zeros.
    let scale = gpu.upload(&[1.0f32])?;
    cx.f32_sets(gpu, [Signed(n)], move |gpu, [g]| {
        ops::clip::apply(gpu, &mut g.as_view_mut(), &scale.as_view())
    })
}

pub(crate) fn adamw(gpu: &mut GpuContext, cx: &Setup<'_>) -> Result<Launch> {
    let n = cx.dim("n");
    let hyper = qlora::train::AdamW::new(1e-3, 0.01);
    let spec = [Signed(n), Signed(n), Signed(n), Positive(n)];
    cx.f32_sets(gpu, spec, move |gpu, [p, g, m, v]| {
        let (p, g) = (&mut p.as_view_mut(), &g.as_view());
        let (m, v) = (&mut m.as_view_mut(), &mut v.as_view_mut());
        ops::adamw::step(gpu, p, g, m, v, &hyper, 1)
    })
}

pub(crate) fn embedding(gpu: &mut GpuContext, cx: &Setup<'_>) -> Result<Launch> {
    let (t, v, h) = (cx.dim("tokens"), cx.dim("vocab"), cx.dim("hidden"));
    let table = cx.fill.signed(gpu, v * h)?;
    let mut rng = ChaCha8Rng::seed_from_u64(cx.seed ^ 0xe3);
    let make =
        |gpu: &mut GpuContext| Ok((gpu.upload(&ids(&mut rng, t, v))?, gpu.zeros::<f32>(t * h)?));
    rotating(gpu, cx.sets, make, move |gpu, (tokens, y)| {
        let (table, tokens) = (&table.as_view(), &tokens.as_view());
        ops::embedding::forward(gpu, table, v, h, tokens, &mut y.as_view_mut())
    })
}

pub(crate) fn nf4_dequantize(gpu: &mut GpuContext, cx: &Setup<'_>) -> Result<Launch> {
    let n = cx.dim("rows") * cx.dim("cols");
    ops::nf4::check_len("bandwidth", n)?;
    let make = |gpu: &mut GpuContext| {
        let w = cx.fill.signed(gpu, n)?;
        let mut q = ops::nf4::Nf4Device::zeros(gpu, n)?;
        ops::nf4::quantize(gpu, &w, &mut q)?;
        Ok((q, gpu.zeros::<f32>(n)?))
    };
    rotating(gpu, cx.sets, make, move |gpu, (q, out)| {
        ops::nf4::dequantize(gpu, q, out)
    })
}

/// The ceiling's launch: a device-to-device copy of `copy_len(bytes)` f32
/// values per set, over `sets` sets, timed exactly as the op is.
fn copy_launch(gpu: &mut GpuContext, bytes: usize, sets: usize, seed: u64) -> Result<Launch> {
    let fill = Filler::new(gpu, seed)?;
    let n = copy_len(bytes);
    let make = |gpu: &mut GpuContext| Ok((fill.signed(gpu, n)?, gpu.zeros::<f32>(n)?));
    let launch = rotating(gpu, sets, make, |gpu, (src, dst)| {
        Ok(gpu.stream().memcpy_dtod(&*src, dst)?)
    })?;
    gpu.synchronize()?;
    Ok(launch)
}

/// f32 values the ceiling copies so that it moves the op's bytes: it reads
/// and writes `4 n` bytes each, so `8 n = B` (rounded up, at least one).
fn copy_len(bytes: usize) -> usize {
    bytes.div_ceil(8).max(1)
}

/// Bytes the ceiling's copy moves: read plus write.
fn copy_bytes(bytes: usize) -> usize {
    8 * copy_len(bytes)
}

/// The `bandwidth` check, with the trial's faults on (launch shapes and
/// launchers alike) until it returns.
pub fn measure(p: &Params, cx: &mut TrialContext<'_>) -> Result<Measurement> {
    let (seed, faults) = (cx.seed, cx.faults());
    let gpu = require_gpu(cx)?;
    measure_body(p, &mut gpu.with_faults(faults), seed)
}

/// The op's graph timed over `repeats` replays, then the copy's, one arm
/// after the other: the method the contracts' bounds were set with (see the
/// module's doc for why it is not the alternated, adaptive driver).
fn measure_body(p: &Params, gpu: &mut GpuContext, seed: u64) -> Result<Measurement> {
    let (warmup, repeats) = (p.warmup.0, p.repeats.0);
    let bytes = p.bytes();
    let sets = ROTATE_BYTES.div_ceil(bytes.max(1)).clamp(1, MAX_SETS);
    let launches = sets.max(MIN_LAUNCHES);
    let kernel = {
        let mut launch = setup(gpu, p, sets, seed)?;
        time_graph(gpu, launches, warmup, repeats, |gpu, i| launch(gpu, i))?
    };
    let copy = {
        let mut launch = copy_launch(gpu, bytes, sets, seed)?;
        time_graph(gpu, launches, warmup, repeats, |gpu, i| launch(gpu, i))?
    };
    let (t_k, t_c) = (median(&kernel), median(&copy));
    let copy_gbs = copy_bytes(bytes) as f64 / (t_c * 1e6);
    let kernel_gbs = bytes as f64 / (t_k * 1e6);
    let fraction = kernel_gbs / copy_gbs;
    // The copy time scaled to the op's bytes: the time the op would take at
    // the copy's bandwidth, so baseline / candidate is the fraction.
    let per_op = bytes as f64 / copy_bytes(bytes) as f64;
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
        "{subject} {}: {bytes} B in {:.2} us = {kernel_gbs:.0} GB/s; d2d copy of the same bytes \
         {copy_gbs:.0} GB/s ({:.2} us); fraction {fraction:.3} [{lo:.3}, {hi:.3}]; {sets} buffer \
         sets, {launches} launches per graph, {repeats} repeats; {device}",
        p.shape,
        t_k * 1e3,
        t_c * 1e3,
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
        peak_device_gib: None,
        baseline_peak_device_gib: None,
    });
    Ok(m)
}
