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
use crate::check::stats::{median, ratio_ci, ratio_interval_below, BOOTSTRAP_RESAMPLES};
use crate::check::MutantFaults;
use crate::check::{require_gpu, Comparator, Measurement, Speedup, TrialContext};
use crate::error::{Error, Result};
use qlora::gpu::timing::{time_graph, time_graph_until};
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
    let (seed, faults, mutant) = (cx.seed, cx.faults(), cx.mutant.is_some());
    let gpu = require_gpu(cx)?;
    measure_body(p, &mut gpu.with_faults(faults), seed, mutant)
}

/// Both graphs' times, then the fraction and its interval. A real run
/// times as the contracts' bounds were set ([`time_real`]); a mutant run
/// stops once its fraction has certainly failed ([`time_mutant`]).
fn measure_body(p: &Params, gpu: &mut GpuContext, seed: u64, mutant: bool) -> Result<Measurement> {
    let at = Layout::of(p);
    let times = if mutant {
        time_mutant(p, gpu, &at, seed)?
    } else {
        time_real(p, gpu, &at, seed)?
    };
    let device = gpu.facts().name.clone();
    Ok(report(p, &at, &times, seed, &device))
}

/// What both graphs share: the op's bytes `B`, the buffer sets they rotate
/// over and the launches one replay holds.
#[derive(Clone, Copy)]
struct Layout {
    bytes: usize,
    sets: usize,
    launches: usize,
}

impl Layout {
    fn of(p: &Params) -> Layout {
        let bytes = p.bytes();
        let sets = ROTATE_BYTES.div_ceil(bytes.max(1)).clamp(1, MAX_SETS);
        Layout {
            bytes,
            sets,
            launches: sets.max(MIN_LAUNCHES),
        }
    }

    /// The copy's times scaled by `B / C`: the time the op would take at
    /// the copy's bandwidth, so `median(baseline) / t_k` is the fraction.
    fn baseline(&self, copy: &[f64]) -> Vec<f64> {
        let per_op = self.bytes as f64 / copy_bytes(self.bytes) as f64;
        copy.iter().map(|t| t * per_op).collect()
    }
}

/// Per-launch milliseconds of the op's graph and of the copy's.
struct Times {
    kernel: Vec<f64>,
    copy: Vec<f64>,
    /// A mutant run: the copy timed first, the op until its fraction failed.
    mutant: bool,
}

impl Times {
    /// How many replays were timed, and why fewer than `repeats`.
    fn describe(&self, repeats: usize) -> String {
        let n = self.kernel.len();
        match (self.mutant, n < repeats) {
            (false, _) => format!("{repeats} repeats"),
            (true, false) => format!("{repeats} repeats (mutant run: the copy's first)"),
            (true, true) => format!(
                "stopped after {n} of {repeats} repeats: the interval already failed the bound \
                 (mutant run: the copy's first)"
            ),
        }
    }
}

/// The op's graph timed over `repeats` replays, then the copy's, one arm
/// after the other: the method the contracts' bounds were set with (see the
/// module's doc for why it is not the alternated, adaptive driver).
fn time_real(p: &Params, gpu: &mut GpuContext, at: &Layout, seed: u64) -> Result<Times> {
    let (warmup, repeats) = (p.warmup.0, p.repeats.0);
    let kernel = {
        let mut launch = setup(gpu, p, at.sets, seed)?;
        time_graph(gpu, at.launches, warmup, repeats, |gpu, i| launch(gpu, i))?
    };
    let copy = time_copy(p, gpu, at, seed)?;
    Ok(Times {
        kernel,
        copy,
        mutant: false,
    })
}

/// The copy's graph over `repeats` replays, after `warmup`.
fn time_copy(p: &Params, gpu: &mut GpuContext, at: &Layout, seed: u64) -> Result<Vec<f64>> {
    let mut launch = copy_launch(gpu, at.bytes, at.sets, seed)?;
    let (warmup, repeats) = (p.warmup.0, p.repeats.0);
    Ok(time_graph(gpu, at.launches, warmup, repeats, |gpu, i| {
        launch(gpu, i)
    })?)
}

/// A mutant run: the copy's graph first (its `repeats` replays), then the
/// op's replay by replay until the fraction `median(baseline) /
/// median(kernel)` has certainly failed its bound ([`ratio_interval_below`]),
/// or `repeats`. A mutant needs only to show that the check fails.
fn time_mutant(p: &Params, gpu: &mut GpuContext, at: &Layout, seed: u64) -> Result<Times> {
    let copy = time_copy(p, gpu, at, seed)?;
    let baseline = at.baseline(&copy);
    let min = p.min_fraction.0;
    let mut launch = setup(gpu, p, at.sets, seed)?;
    let kernel = time_graph_until(
        gpu,
        (at.launches, p.warmup.0, p.repeats.0),
        |gpu, i| launch(gpu, i),
        |kernel| ratio_interval_below(&baseline, kernel, min, seed),
    )?;
    Ok(Times {
        kernel,
        copy,
        mutant: true,
    })
}

/// The measurement: `fraction = (B / t_k) / (C / t_c)` against
/// `min_fraction`, its interval, and the detail and speedup rows.
fn report(p: &Params, at: &Layout, times: &Times, seed: u64, device: &str) -> Measurement {
    let Layout {
        bytes,
        sets,
        launches,
    } = *at;
    let (t_k, t_c) = (median(&times.kernel), median(&times.copy));
    let copy_gbs = copy_bytes(bytes) as f64 / (t_c * 1e6);
    let kernel_gbs = bytes as f64 / (t_k * 1e6);
    let fraction = kernel_gbs / copy_gbs;
    let baseline = at.baseline(&times.copy);
    let (lo, hi) = ratio_ci(&baseline, &times.kernel, seed, BOOTSTRAP_RESAMPLES);
    let subject = p.subject();
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
         sets, {launches} launches per graph, {}; {device}",
        p.shape,
        t_k * 1e3,
        t_c * 1e3,
        times.describe(p.repeats.0),
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
        repeats: times.kernel.len(),
        peak_device_gib: None,
        baseline_peak_device_gib: None,
    });
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::repeats::MUTANT_FIRST_LOOK;

    /// `n` times around `t` with relative noise `spread`, seeded.
    fn noisy(t: f64, spread: f64, n: usize, seed: u64) -> Vec<f64> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..n)
            .map(|_| t * (1.0 + spread * rng.random_range(-1.0..1.0)))
            .collect()
    }

    /// The replay count at which a mutant's timing of `kernel` stops, or
    /// `None` if it times them all.
    fn stops_at(baseline: &[f64], kernel: &[f64], min_fraction: f64) -> Option<usize> {
        (1..=kernel.len()).find(|&n| ratio_interval_below(baseline, &kernel[..n], min_fraction, 7))
    }

    #[test]
    fn a_slow_kernel_stops_at_the_first_look() {
        // Fraction ~0.25 against a bound of 0.7.
        let baseline = noisy(1.0, 0.05, 20, 1);
        let kernel = noisy(4.0, 0.05, 20, 2);
        assert_eq!(stops_at(&baseline, &kernel, 0.7), Some(MUTANT_FIRST_LOOK));
        // Never before it, however clear the first times are.
        assert!(!ratio_interval_below(&baseline, &kernel[..2], 0.7, 7));
        assert!(!ratio_interval_below(&baseline, &[], 0.7, 7));
    }

    #[test]
    fn a_kernel_near_or_above_the_bound_times_every_repeat() {
        let baseline = noisy(1.0, 0.05, 20, 1);
        // Fraction ~0.72 against 0.7: the interval reaches past the bound.
        let near = noisy(1.0 / 0.72, 0.05, 20, 2);
        assert_eq!(stops_at(&baseline, &near, 0.7), None);
        // A kernel that passes never stops.
        let fast = noisy(1.0 / 0.9, 0.05, 20, 2);
        assert_eq!(stops_at(&baseline, &fast, 0.7), None);
    }

    #[test]
    fn a_kernel_settled_after_the_first_look_stops_there() {
        // Fraction 1 against 0.98, but the first times reach past the bound
        // (a fast first replay): the interval fails at a later replay.
        let baseline = vec![1.0; 20];
        let mut kernel = vec![1.02; 20];
        kernel[0] = 0.9;
        kernel[1] = 0.95;
        let n = stops_at(&baseline, &kernel, 0.985).unwrap();
        assert!(n > MUTANT_FIRST_LOOK && n < 20, "{n}");
    }

    #[test]
    fn the_detail_says_how_many_replays_were_timed_and_why() {
        let times = |n, mutant| Times {
            kernel: vec![1.0; n],
            copy: vec![1.0; 20],
            mutant,
        };
        assert_eq!(times(20, false).describe(20), "20 repeats");
        assert_eq!(
            times(20, true).describe(20),
            "20 repeats (mutant run: the copy's first)"
        );
        assert!(times(3, true)
            .describe(20)
            .starts_with("stopped after 3 of 20 repeats: the interval already failed the bound"));
    }
}
