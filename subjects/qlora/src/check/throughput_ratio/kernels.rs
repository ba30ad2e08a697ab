//! GPU side of the kernel subjects of `throughput_ratio`, on a model's
//! projection shapes (`rows = batch * seq_len`; q, k/v, o, gate/up, down):
//!
//! - `gemm`: a direct cuBLAS SGEMM call (TF32 tensor-op math, set once) vs our
//!   launcher `ops::gemm::linear` with the forward engine of the context's
//!   options; `ratio = t_raw / t_ours` (1 = no overhead);
//! - `nf4_gemm`: the TF32 GEMM on fp32 weights vs the NF4 path the training
//!   step takes (dequantise into a workspace, then the same TF32 GEMM);
//!   `ratio = t_tf32 / t_nf4`. The fused FMA kernel `nf4_gemm_fwd_f32` is
//!   timed too and reported next to it;
//! - `fusion`: residual add then RMSNorm vs the fused residual + RMSNorm
//!   kernel; `ratio = t_unfused / t_fused`;
//! - `attention`: causal GQA attention of one decoder layer (the model's
//!   batch, sequence, heads and head_dim), forward and backward, on the f32
//!   kernels (FP32 math) vs the tensor-core kernels (TF32 math);
//!   `ratio = t_f32 / t_tensor_cores`, the sum of both passes. The same
//!   buffer sets and graphs, on one choice of kernels and timed on their
//!   own ([`attention_times`]), are what `attention_time` judges.
//!
//! Times are medians of CUDA-event-timed runs after warm-up (the nf4_gemm,
//! fusion and attention runs are captured graph replays, as in the step);
//! each run cycles over several weight (or buffer) sets so the L2 cache
//! cannot hold them all. Baseline and candidate runs alternate one by one,
//! `repeats` pairs per shape at least, then more until that shape's ratio
//! interval is within +-1% or `max_repeats` pairs
//! ([`time_pairs`](crate::check::repeats::time_pairs)). A subject's ratio is
//! of the medians of the per-run sums over the shapes (each timed run adds
//! up one time per shape, over the fewest runs any shape took), with a
//! seeded bootstrap interval of those sums; each shape also gets its own row.

use std::cell::RefCell;

use cudarc::cublas::sys::{cublasMath_t, cublasOperation_t};
use cudarc::cublas::{sys as blas_sys, Gemm, GemmConfig};
use cudarc::driver::CudaSlice;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::check::op::ThroughputKernel;
use crate::check::repeats::{time_pairs, Plan};
use crate::check::stats::{median, ratio_ci, BOOTSTRAP_RESAMPLES};
use crate::check::throughput_ratio::Params;
use crate::check::MutantFaults;
use crate::check::{require_gpu, Comparator, Measurement, Speedup, TrialContext};
use crate::error::Result;
use qlora::gpu::timing::{capture, time_events, time_graph};
use qlora::gpu::{Direction, GemmMath, GpuContext};
use qlora::model::ModelConfig;
use qlora::ops;
use qlora::ops::attention::{AttnKernels, AttnShape};
use qlora::ops::gemm::GemmEngine;
use qlora::ops::nf4::Nf4Device;
use qlora::Faults;

/// Weight sets cycled per timed run hold at least this many bytes.
const ROTATE_BYTES: usize = 160 << 20;
/// At most this many weight sets.
const MAX_SETS: usize = 8;
/// Timed runs of the slow fused NF4 kernel (reported, not judged).
const FUSED_REPEATS: usize = 5;

/// One projection `y[rows, out] = x[rows, in] W^T`.
#[derive(Debug, Clone, Copy)]
struct Proj {
    name: &'static str,
    in_dim: usize,
    out_dim: usize,
}

/// The distinct projection shapes of one decoder layer of `c`.
fn projections(c: &ModelConfig) -> Vec<Proj> {
    let p = |name, in_dim, out_dim| Proj {
        name,
        in_dim,
        out_dim,
    };
    vec![
        p("q", c.hidden, c.q_dim()),
        p("k/v", c.hidden, c.kv_dim()),
        p("o", c.q_dim(), c.hidden),
        p("gate/up", c.hidden, c.intermediate),
        p("down", c.intermediate, c.hidden),
    ]
}

/// `len` values uniform in `[-1, 1)`.
fn random_host(rng: &mut ChaCha8Rng, len: usize) -> Vec<f32> {
    (0..len).map(|_| rng.random_range(-1.0..1.0)).collect()
}

/// [`random_host`]'s values, on the device.
fn random(gpu: &GpuContext, rng: &mut ChaCha8Rng, len: usize) -> Result<CudaSlice<f32>> {
    Ok(gpu.upload(&random_host(rng, len))?)
}

fn sets_for(bytes: usize) -> usize {
    ROTATE_BYTES.div_ceil(bytes.max(1)).clamp(1, MAX_SETS)
}

/// Buffer sets of the fusion subject for `n = rows x hidden`: a, b, h and y,
/// 16 bytes per element per set, together at least 256 MiB.
fn fusion_sets(n: usize) -> usize {
    (256usize << 20).div_ceil(16 * n.max(1)).clamp(1, 64)
}

/// Device bytes a kernel subject holds at its peak on `c`'s shapes (each
/// projection's buffers are freed before the next), `rows = batch x seq_len`:
///
/// - gemm: `4 (rows in + sets in out + rows out)`;
/// - nf4_gemm: that, plus per set the NF4 codes and absmax
///   (`in out / 2 + 4 in out / 64`), plus one dequantised weight `4 in out`;
/// - fusion: `16 sets rows hidden + 4 hidden`;
/// - attention: `sets` of [`attention_set_bytes`].
///
/// The largest over `c`'s projections of `bytes(io, len, sets)`, with
/// `io = 4 rows (in + out)`, `len = in out` and the weight sets' count.
fn projections_peak(c: &ModelConfig, bytes: impl Fn(f64, f64, f64) -> f64) -> f64 {
    let rows = c.tokens() as f64;
    let proj = |p: &Proj| {
        let len = (p.in_dim * p.out_dim) as f64;
        let sets = sets_for(4 * p.in_dim * p.out_dim) as f64;
        let io = 4.0 * rows * (p.in_dim + p.out_dim) as f64;
        bytes(io, len, sets)
    };
    projections(c).iter().map(proj).fold(0.0, f64::max)
}

/// [`projections_peak`] of the `gemm` subject.
pub(crate) fn gemm_device_bytes(c: &ModelConfig) -> f64 {
    projections_peak(c, |io, len, sets| io + sets * 4.0 * len)
}

/// [`projections_peak`] of the `nf4_gemm` subject.
pub(crate) fn nf4_gemm_device_bytes(c: &ModelConfig) -> f64 {
    projections_peak(c, |io, len, sets| {
        io + sets * (4.0 * len + len / 2.0 + len / 16.0) + 4.0 * len
    })
}

/// Device bytes of the `fusion` subject (see [`projections_peak`]).
pub(crate) fn fusion_device_bytes(c: &ModelConfig) -> f64 {
    let n = c.tokens() * c.hidden;
    16.0 * (fusion_sets(n) * n) as f64 + 4.0 * c.hidden as f64
}

/// Device bytes of the `attention` subject (see [`projections_peak`]): its
/// sets are the f32 kernels' (the tensor-core kernels save the same).
pub(crate) fn attention_device_bytes(c: &ModelConfig) -> f64 {
    attention_sets_bytes(c, AttnKernels::F32)
}

/// Device bytes of the buffer sets of one layer's attention of `c` on
/// `kernels` ([`attention_sets`]): `sets x` [`attention_set_bytes`].
pub(crate) fn attention_sets_bytes(c: &ModelConfig, kernels: AttnKernels) -> f64 {
    let bytes = attention_set_bytes(&attn_shape(c), kernels);
    (sets_for(bytes) * bytes) as f64
}

/// The attention shape of one decoder layer of `c`.
fn attn_shape(c: &ModelConfig) -> AttnShape {
    AttnShape {
        batch: c.batch,
        seq: c.seq_len,
        heads: c.heads,
        kv_heads: c.kv_heads,
        head_dim: c.head_dim,
    }
}

/// Bytes of one attention buffer set on `kernels`: q, k, v (in the
/// kernels' format); out, dout, dq (q-sized); dk, dv (kv-sized); what the
/// forward saves (probs, or the flash kernels' row log-sum-exps); the
/// backward scratch (dS or the row dots, and the per-head shares).
fn attention_set_bytes(sh: &AttnShape, kernels: AttnKernels) -> usize {
    let (q_len, kv_len, _) = ops::attention::lens(sh);
    let saved = ops::attention::saved_len(sh, kernels);
    let scratch = ops::attention::backward_scratch_len(sh, kernels);
    ops::attention::QkvBuffers::bytes_for(sh, kernels)
        + 4 * (3 * q_len + 2 * kv_len + saved + scratch)
}

/// Direct cuBLAS SGEMM of `y = x W^T` (row-major; cuBLAS computes the
/// column-major `y^T = W x^T`), with whatever math mode the handle holds.
fn raw_linear(
    gpu: &GpuContext,
    x: &CudaSlice<f32>,
    w: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    (rows, in_dim, out_dim): (usize, usize, usize),
) -> qlora::Result<()> {
    let i32_of = |what: &str, v: usize| qlora::gpu::to_i32("gemm", what, v);
    let (m, n, k) = (
        i32_of("out", out_dim)?,
        i32_of("rows", rows)?,
        i32_of("in", in_dim)?,
    );
    if x.len() != rows * in_dim || w.len() != out_dim * in_dim || y.len() != rows * out_dim {
        return Err(qlora::Error::ShapeMismatch {
            op: "gemm",
            expected: format!("x {rows}x{in_dim}, W {out_dim}x{in_dim}, y {rows}x{out_dim}"),
            got: format!("x {}, W {}, y {}", x.len(), w.len(), y.len()),
        });
    }
    let cfg = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_T,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m,
        n,
        k,
        alpha: 1.0f32,
        lda: k,
        ldb: k,
        beta: 0.0f32,
        ldc: m,
    };
    // SAFETY: checked above: W holds out*in, x rows*in and y rows*out f32.
    // Column-major, W (ld in) transposed is out x in, x (ld in) is in x rows,
    // y (ld out) is out x rows: cuBLAS reads and writes exactly those
    // elements; beta = 0, so y's prior contents are unread.
    unsafe { gpu.cublas()?.gemm(cfg, w, x, y) }?;
    Ok(())
}

/// Sets the cuBLAS handle's math mode.
fn set_math(gpu: &GpuContext, mode: cublasMath_t) -> qlora::Result<()> {
    // SAFETY: the handle is the context's live cuBLAS handle; setting the math
    // mode only changes a field of it.
    unsafe { blas_sys::cublasSetMathMode(*gpu.cublas()?.handle(), mode) }.result()?;
    Ok(())
}

/// How a pair of sides is timed: the plan of timed runs, the bootstrap
/// seed, untimed runs of each side first, and calls per run.
#[derive(Clone, Copy)]
struct Timing {
    plan: Plan,
    seed: u64,
    warmup: usize,
    per_run: usize,
}

impl Timing {
    fn new(p: &Params, seed: u64, per_run: usize) -> Timing {
        // Each shape times until its own interval is precise; the verdict
        // is on the total over the shapes, so no shape stops a mutant early.
        let plan = p.plan(false);
        Timing {
            plan,
            seed,
            warmup: p.warmup.0,
            per_run,
        }
    }
}

/// The milliseconds per call of one CUDA-event-timed run of `body`.
fn one_run(
    gpu: &mut GpuContext,
    per_run: usize,
    body: impl FnMut(&mut GpuContext) -> qlora::Result<()>,
) -> Result<f64> {
    let times = time_events(gpu, 0, 1, per_run, body)?;
    Ok(times.first().copied().unwrap_or(f64::NAN))
}

/// `warmup` untimed runs of each side, then timed runs of the baseline and
/// of the candidate (with `faults` on) alternated one by one, so drift hits
/// both alike, for as many pairs as [`time_pairs`] takes.
fn alternated(
    gpu: &mut GpuContext,
    t: Timing,
    faults: Faults,
    mut base: impl FnMut(&mut GpuContext) -> qlora::Result<()>,
    mut cand: impl FnMut(&mut GpuContext) -> qlora::Result<()>,
) -> Result<(Vec<f64>, Vec<f64>)> {
    time_events(gpu, t.warmup, 0, t.per_run, &mut base)?;
    time_events(
        &mut gpu.with_faults(faults),
        t.warmup,
        0,
        t.per_run,
        &mut cand,
    )?;
    let timed = time_pairs(&t.plan, t.seed, || {
        let b = one_run(gpu, t.per_run, &mut base)?;
        let c = one_run(&mut gpu.with_faults(faults), t.per_run, &mut cand)?;
        Ok::<_, crate::Error>((b, c))
    })?;
    Ok((timed.baseline, timed.candidate))
}

/// [`alternated`] replays of two captured graphs of `t.per_run` calls each
/// (`base(gpu, i)` and, with `faults` on, `cand(gpu, i)`); each body runs
/// once eagerly first so that nothing compiles while it is captured.
fn alternated_graphs(
    gpu: &mut GpuContext,
    t: Timing,
    faults: Faults,
    mut base: impl FnMut(&mut GpuContext, usize) -> qlora::Result<()>,
    mut cand: impl FnMut(&mut GpuContext, usize) -> qlora::Result<()>,
) -> Result<(Vec<f64>, Vec<f64>)> {
    for i in 0..t.per_run {
        base(gpu, i)?;
    }
    let base_graph = capture(gpu, t.per_run, base)?;
    let cand_graph = {
        let gpu = &mut gpu.with_faults(faults);
        for i in 0..t.per_run {
            cand(gpu, i)?;
        }
        capture(gpu, t.per_run, cand)?
    };
    alternated(
        gpu,
        t,
        faults,
        |_| Ok(base_graph.launch()?),
        |_| Ok(cand_graph.launch()?),
    )
}

/// Per-run times of one baseline and one candidate on one shape.
pub struct Pair {
    label: String,
    baseline: Vec<f64>,
    candidate: Vec<f64>,
}

/// A `throughput_ratio` kernel subject of the op table; the trial's mutant
/// is applied to the candidate and removed whatever the outcome.
pub fn measure(
    p: &Params,
    kernel: &ThroughputKernel,
    cx: &mut TrialContext<'_>,
) -> Result<Measurement> {
    let (seed, faults) = (cx.seed, cx.faults());
    let gpu = require_gpu(cx)?;
    let config = p.config();
    let (pairs, extra) = (kernel.pairs)(gpu, p, &config, seed, faults)?;
    Ok(judge(p, kernel, gpu, &config, seed, pairs, extra))
}

fn judge(
    p: &Params,
    kernel: &ThroughputKernel,
    gpu: &GpuContext,
    config: &ModelConfig,
    seed: u64,
    pairs: Vec<Pair>,
    extra: Vec<Speedup>,
) -> Measurement {
    let (base_name, cand_name) = (kernel.baseline, kernel.candidate);
    let row = |subject: String, baseline: &str, candidate: &str, b: &[f64], c: &[f64]| {
        let (lo, hi) = ratio_ci(b, c, seed, BOOTSTRAP_RESAMPLES);
        Speedup {
            subject,
            model: config.name.to_string(),
            batch: config.batch,
            seq_len: config.seq_len,
            baseline: baseline.to_string(),
            candidate: candidate.to_string(),
            baseline_median_ms: median(b),
            candidate_median_ms: median(c),
            ratio: median(b) / median(c),
            ratio_ci_low: lo,
            ratio_ci_high: hi,
            repeats: b.len().min(c.len()),
            peak_device_gib: None,
            baseline_peak_device_gib: None,
        }
    };
    let subject = kernel.name;
    let mut speedups = Vec::new();
    let (total_b, total_c) = totals(&pairs);
    let mut detail = Vec::new();
    for pair in &pairs {
        let r = row(
            format!("{subject} {}", pair.label),
            base_name,
            cand_name,
            &pair.baseline,
            &pair.candidate,
        );
        detail.push(format!(
            "{}: {:.1} us vs {:.1} us ({:.3})",
            pair.label,
            r.baseline_median_ms * 1e3,
            r.candidate_median_ms * 1e3,
            r.ratio
        ));
        speedups.push(r);
    }
    let total = row(
        format!("{subject} total"),
        base_name,
        cand_name,
        &total_b,
        &total_c,
    );
    for e in &extra {
        detail.push(format!(
            "{}: {} {:.1} us vs {} {:.1} us ({:.3})",
            e.subject,
            e.baseline,
            e.baseline_median_ms * 1e3,
            e.candidate,
            e.candidate_median_ms * 1e3,
            e.ratio
        ));
    }
    let ratio = total.ratio;
    let ci = (total.ratio_ci_low, total.ratio_ci_high);
    speedups.push(total);
    speedups.extend(extra);
    let mut m = Measurement::new("time_ratio", ratio, Comparator::Ge, p.min_ratio.0, "ratio")
        .with_detail(format!(
            "{base_name} / {cand_name} on {} (rows {}): {ratio:.3} [{:.3}, {:.3}]; {}; {}",
            config.name,
            config.tokens(),
            ci.0,
            ci.1,
            detail.join("; "),
            gpu.facts().name
        ));
    m.speedups = speedups;
    m
}

/// Per-run sums over the shapes of the baseline's and the candidate's
/// times: run `k` of the total is the sum of run `k` of every shape. Each
/// shape timed its own count of runs, so the total has the fewest any
/// shape took (none without shapes).
fn totals(pairs: &[Pair]) -> (Vec<f64>, Vec<f64>) {
    let runs = pairs
        .iter()
        .map(|pair| pair.baseline.len().min(pair.candidate.len()))
        .min()
        .unwrap_or(0);
    let sum = |side: fn(&Pair) -> &[f64]| -> Vec<f64> {
        (0..runs)
            .map(|k| pairs.iter().map(|pair| side(pair)[k]).sum())
            .collect()
    };
    (sum(|p| &p.baseline), sum(|p| &p.candidate))
}

/// The engine our launcher uses for the forward GEMMs.
fn our_engine(gpu: &GpuContext) -> GemmEngine {
    GemmEngine::for_direction(gpu.options(), Direction::Forward)
}

pub(crate) type Pairs = (Vec<Pair>, Vec<Speedup>);

pub(crate) fn gemm_pairs(
    gpu: &mut GpuContext,
    p: &Params,
    c: &ModelConfig,
    seed: u64,
    faults: Faults,
) -> Result<Pairs> {
    let rows = c.tokens();
    let engine = our_engine(gpu);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut pairs = Vec::new();
    for proj in projections(c) {
        let dims = (rows, proj.in_dim, proj.out_dim);
        let sets = sets_for(4 * proj.in_dim * proj.out_dim);
        let x = random(gpu, &mut rng, rows * proj.in_dim)?;
        let mut ws = Vec::new();
        for _ in 0..sets {
            ws.push(random(gpu, &mut rng, proj.out_dim * proj.in_dim)?);
        }
        // Both sides write `y`; alternated runs never overlap (each run is
        // timed to its end), so sharing it is safe.
        let y = RefCell::new(gpu.zeros::<f32>(rows * proj.out_dim)?);
        // The raw call runs in TF32 tensor-op math, set and reset around each
        // run (host-side handle fields, no device work); the trial's faults
        // are on for our launcher only: the claim is about it.
        let (raw, ours) = alternated(
            gpu,
            Timing::new(p, seed, sets),
            faults,
            |gpu| {
                set_math(gpu, cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH)?;
                let ran = ws
                    .iter()
                    .try_for_each(|w| raw_linear(gpu, &x, w, &mut y.borrow_mut(), dims));
                set_math(gpu, cublasMath_t::CUBLAS_DEFAULT_MATH)?;
                ran
            },
            |gpu| {
                ws.iter().try_for_each(|w| {
                    ops::gemm::linear(gpu, engine, &x, w, &mut y.borrow_mut(), dims)
                })
            },
        )?;
        pairs.push(Pair {
            label: format!("{} {rows}x{}x{}", proj.name, proj.in_dim, proj.out_dim),
            baseline: raw,
            candidate: ours,
        });
    }
    Ok((pairs, Vec::new()))
}

pub(crate) fn nf4_pairs(
    gpu: &mut GpuContext,
    p: &Params,
    c: &ModelConfig,
    seed: u64,
    faults: Faults,
) -> Result<Pairs> {
    let rows = c.tokens();
    let tf32 = GemmEngine::Cublas(GemmMath::Tf32);
    let engine = our_engine(gpu);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut pairs = Vec::new();
    let mut extra = Vec::new();
    for proj in projections(c) {
        let dims = (rows, proj.in_dim, proj.out_dim);
        let len = proj.in_dim * proj.out_dim;
        ops::nf4::check_len("nf4_gemm", len)?;
        let sets = sets_for(4 * len);
        let x = random(gpu, &mut rng, rows * proj.in_dim)?;
        let mut ws = Vec::new();
        let mut qs = Vec::new();
        for _ in 0..sets {
            let w = random(gpu, &mut rng, len)?;
            let mut q = Nf4Device::zeros(gpu, len)?;
            ops::nf4::quantize(gpu, &w, &mut q)?;
            ws.push(w);
            qs.push(q);
        }
        // The dequantised weight lives in one workspace, as in the step.
        let mut deq = gpu.zeros::<f32>(len)?;
        let y = RefCell::new(gpu.zeros::<f32>(rows * proj.out_dim)?);
        // Both paths replay as captured graphs, as the training step does, so
        // the dequantisation's extra launch is timed on the device, not the
        // host's launch rate.
        let (base, path) = alternated_graphs(
            gpu,
            Timing::new(p, seed, sets),
            faults,
            |gpu, i| ops::gemm::linear(gpu, tf32, &x, &ws[i], &mut y.borrow_mut(), dims),
            |gpu, i| {
                ops::nf4::dequantize(gpu, &qs[i], &mut deq)?;
                ops::gemm::linear(gpu, engine, &x, &deq, &mut y.borrow_mut(), dims)
            },
        )?;
        let fused = time_events(gpu, 1, FUSED_REPEATS, 1, |gpu| {
            let dims = (rows, proj.out_dim, proj.in_dim);
            ops::nf4::gemm_forward(gpu, &x, &qs[0], &mut y.borrow_mut(), dims)
        })?;
        let label = format!("{} {rows}x{}x{}", proj.name, proj.in_dim, proj.out_dim);
        let (lo, hi) = ratio_ci(&base, &fused, seed, BOOTSTRAP_RESAMPLES);
        extra.push(Speedup {
            subject: format!("nf4_gemm fused {label}"),
            model: c.name.to_string(),
            batch: c.batch,
            seq_len: c.seq_len,
            baseline: "tf32 cublas, fp32 weight".into(),
            candidate: "nf4 fused fma kernel".into(),
            baseline_median_ms: median(&base),
            candidate_median_ms: median(&fused),
            ratio: median(&base) / median(&fused),
            ratio_ci_low: lo,
            ratio_ci_high: hi,
            repeats: FUSED_REPEATS,
            peak_device_gib: None,
            baseline_peak_device_gib: None,
        });
        pairs.push(Pair {
            label,
            baseline: base,
            candidate: path,
        });
    }
    Ok((pairs, extra))
}

pub(crate) fn fusion_pairs(
    gpu: &mut GpuContext,
    p: &Params,
    c: &ModelConfig,
    seed: u64,
    faults: Faults,
) -> Result<Pairs> {
    let (rows, h) = (c.tokens(), c.hidden);
    let n = rows * h;
    let eps = ModelConfig::RMS_EPS;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let sets = fusion_sets(n);
    let gamma = random(gpu, &mut rng, h)?;
    let mut bufs = Vec::new();
    for _ in 0..sets {
        bufs.push((
            random(gpu, &mut rng, n)?,
            random(gpu, &mut rng, n)?,
            gpu.zeros::<f32>(n)?,
            gpu.zeros::<f32>(n)?,
        ));
    }
    let bufs = RefCell::new(bufs);
    // The faults (a slowed launch) apply to the fused candidate only: it is
    // the claim "fusion pays" that the mutant must break.
    let (unfused, fused) = alternated_graphs(
        gpu,
        Timing::new(p, seed, sets),
        faults,
        |gpu, i| {
            let (a, b, hs, y) = &mut bufs.borrow_mut()[i];
            ops::elementwise::residual_add(gpu, &a.as_view(), &b.as_view(), &mut hs.as_view_mut())?;
            ops::rmsnorm::forward(
                gpu,
                &hs.as_view(),
                &gamma.as_view(),
                rows,
                h,
                eps,
                &mut y.as_view_mut(),
            )
        },
        |gpu, i| {
            let (a, b, hs, y) = &mut bufs.borrow_mut()[i];
            ops::rmsnorm::forward_residual(
                gpu,
                &a.as_view(),
                &b.as_view(),
                &gamma.as_view(),
                rows,
                h,
                eps,
                &mut hs.as_view_mut(),
                &mut y.as_view_mut(),
            )
        },
    )?;
    let pair = Pair {
        label: format!("residual + rmsnorm {rows}x{h}"),
        baseline: unfused,
        candidate: fused,
    };
    Ok((vec![pair], Vec::new()))
}

/// One set of attention buffers for one choice of kernels (what the
/// forward saves and the backward's scratch differ between the
/// probability-saving kernels and the flash ones): inputs random, outputs
/// zero; q, k and v in the format the kernels read.
struct AttnSet {
    qkv: ops::attention::QkvBuffers,
    dout: CudaSlice<f32>,
    out: CudaSlice<f32>,
    saved: CudaSlice<f32>,
    scratch: CudaSlice<f32>,
    dq: CudaSlice<f32>,
    dk: CudaSlice<f32>,
    dv: CudaSlice<f32>,
}

impl AttnSet {
    fn new(
        gpu: &GpuContext,
        rng: &mut ChaCha8Rng,
        sh: &AttnShape,
        kernels: AttnKernels,
    ) -> Result<Self> {
        let (q_len, kv_len, _) = ops::attention::lens(sh);
        let q = random_host(rng, q_len);
        let k = random_host(rng, kv_len);
        let v = random_host(rng, kv_len);
        Ok(AttnSet {
            qkv: ops::attention::QkvBuffers::upload(gpu, kernels, [&q, &k, &v])?,
            dout: random(gpu, rng, q_len)?,
            out: gpu.zeros::<f32>(q_len)?,
            saved: gpu.zeros::<f32>(ops::attention::saved_len(sh, kernels))?,
            scratch: gpu.zeros::<f32>(ops::attention::backward_scratch_len(sh, kernels))?,
            dq: gpu.zeros::<f32>(q_len)?,
            dk: gpu.zeros::<f32>(kv_len)?,
            dv: gpu.zeros::<f32>(kv_len)?,
        })
    }

    /// One pass on `kernels`: the forward, or the backward (dq, dk/dv and
    /// the group sum) from what the forward of the same kernels last saved
    /// in this set.
    fn pass(
        &mut self,
        gpu: &mut GpuContext,
        kernels: AttnKernels,
        sh: &AttnShape,
        backward: bool,
    ) -> qlora::Result<()> {
        let s = self;
        if !backward {
            return ops::attention::forward(
                gpu,
                kernels,
                s.qkv.as_qkv(),
                &mut s.out,
                &mut s.saved,
                sh,
            );
        }
        ops::attention::backward(
            gpu,
            kernels,
            s.qkv.as_qkv(),
            &s.out,
            &s.saved,
            &s.dout,
            &mut s.scratch,
            (&mut s.dq, &mut s.dk, &mut s.dv),
            sh,
        )
    }
}

/// The buffer sets of one layer's attention of `c` on `kernels`, with its
/// shape: as many sets as [`sets_for`] gives, so the L2 cache cannot hold
/// them all, their inputs drawn from `seed`.
fn attention_sets(
    gpu: &GpuContext,
    c: &ModelConfig,
    kernels: AttnKernels,
    seed: u64,
) -> Result<(AttnShape, Vec<AttnSet>)> {
    let sh = attn_shape(c);
    ops::attention::check_shape(&sh)?;
    let sets = sets_for(attention_set_bytes(&sh, kernels));
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut bufs = Vec::with_capacity(sets);
    for _ in 0..sets {
        bufs.push(AttnSet::new(gpu, &mut rng, &sh, kernels)?);
    }
    Ok((sh, bufs))
}

/// Loads the modules of one layer's attention of `c` on `kernels` before
/// its first launch: compiled concurrently on a cold disk cache, not one by
/// one at their first launches, which in a trial that has the GPU (and so
/// the suite) to itself would cost seconds.
fn load_attention_modules(
    gpu: &mut GpuContext,
    c: &ModelConfig,
    kernels: AttnKernels,
) -> Result<()> {
    Ok(gpu.ensure_modules(&ops::attention::modules_for(c.head_dim, kernels, kernels))?)
}

/// `b4 s256 h14/2 d64`: batch, sequence, heads / kv heads and head_dim.
pub(crate) fn attention_shape_label(sh: &AttnShape) -> String {
    format!(
        "b{} s{} h{}/{} d{}",
        sh.batch, sh.seq, sh.heads, sh.kv_heads, sh.head_dim
    )
}

/// `forward b4 s256 h14/2 d64`: a pass and its shape, the label of a pair.
fn attention_label(backward: bool, sh: &AttnShape) -> String {
    let name = if backward { "backward" } else { "forward" };
    format!("{name} {}", attention_shape_label(sh))
}

/// Forward and backward of one layer's attention, each pass a pair: the f32
/// kernels vs the tensor-core kernels with the trial's faults (the claim is
/// about the tensor-core path, so `gemm_without_tensor_ops` must break it).
/// Both replay as captured graphs over buffer sets the L2 cannot hold.
pub(crate) fn attention_pairs(
    gpu: &mut GpuContext,
    p: &Params,
    c: &ModelConfig,
    seed: u64,
    faults: Faults,
) -> Result<Pairs> {
    let (f32m, tf32) = (GemmMath::Fp32, GemmMath::Tf32);
    for kernels in [AttnKernels::F32, AttnKernels::for_math(tf32, faults)] {
        load_attention_modules(gpu, c, kernels)?;
    }
    // Both sides save the probabilities: the f32 kernels' sets serve both.
    let (sh, mut bufs) = attention_sets(gpu, c, AttnKernels::F32, seed)?;
    let sets = bufs.len();
    let mut pairs = Vec::new();
    for backward in [false, true] {
        // Each backward replays from its own set's forward, run just before.
        for set in &mut bufs {
            set.pass(gpu, AttnKernels::F32, &sh, false)?;
        }
        let cells = RefCell::new(&mut bufs);
        // The kernels follow the math and the faults in force in the pass,
        // as in the training step.
        let pass = |gpu: &mut GpuContext, math: GemmMath, i: usize| {
            let kernels = AttnKernels::for_math(math, gpu.faults());
            cells.borrow_mut()[i].pass(gpu, kernels, &sh, backward)
        };
        let (base, cand) = alternated_graphs(
            gpu,
            Timing::new(p, seed, sets),
            faults,
            |gpu, i| pass(gpu, f32m, i),
            |gpu, i| pass(gpu, tf32, i),
        )?;
        pairs.push(Pair {
            label: attention_label(backward, &sh),
            baseline: base,
            candidate: cand,
        });
    }
    Ok((pairs, Vec::new()))
}

/// Per-call times (ms) of one layer's attention of `c` on one choice of
/// kernels, and what was timed.
pub(crate) struct AttentionTimes {
    pub shape: AttnShape,
    /// Buffer sets, one call each per replay.
    pub sets: usize,
    pub forward: Vec<f64>,
    pub backward: Vec<f64>,
}

/// The forward, then the backward, of one layer's attention of `c` on
/// `kernels`, each a captured graph of one call per buffer set
/// ([`attention_sets`]) run once eagerly, replayed `warmup` times untimed and
/// `repeats` times CUDA-event timed ([`time_graph`]): per-call time of
/// replay `k` = its time / sets. The backward reads what the forward's
/// replays last saved in each set, as in the step. The faults in force on
/// `gpu` apply; the caller picks `kernels` under them.
pub(crate) fn attention_times(
    gpu: &mut GpuContext,
    c: &ModelConfig,
    kernels: AttnKernels,
    seed: u64,
    (warmup, repeats): (usize, usize),
) -> Result<AttentionTimes> {
    load_attention_modules(gpu, c, kernels)?;
    let (sh, mut bufs) = attention_sets(gpu, c, kernels, seed)?;
    let sets = bufs.len();
    let mut time = |gpu: &mut GpuContext, backward: bool| {
        time_graph(gpu, sets, warmup, repeats, |gpu, i| {
            bufs[i].pass(gpu, kernels, &sh, backward)
        })
    };
    let forward = time(gpu, false)?;
    let backward = time(gpu, true)?;
    Ok(AttentionTimes {
        shape: sh,
        sets,
        forward,
        backward,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_add_up_each_run_over_the_shapes_that_all_have_it() {
        let pair = |b: &[f64], c: &[f64]| Pair {
            label: String::new(),
            baseline: b.to_vec(),
            candidate: c.to_vec(),
        };
        let pairs = [
            pair(&[1.0, 2.0, 3.0], &[0.5, 1.0, 1.5]),
            pair(&[10.0, 20.0], &[5.0, 6.0]),
        ];
        assert_eq!(totals(&pairs), (vec![11.0, 22.0], vec![5.5, 7.0]));
        assert_eq!(totals(&[]), (vec![], vec![]));
    }

    #[test]
    fn projections_cover_one_layer_of_qwen() {
        let c = ModelConfig::preset("qwen2.5-0.5b").unwrap();
        let dims: Vec<(usize, usize)> = projections(&c)
            .iter()
            .map(|p| (p.in_dim, p.out_dim))
            .collect();
        assert_eq!(
            dims,
            vec![(896, 896), (896, 128), (896, 896), (896, 4864), (4864, 896)]
        );
        // 17 MB weights: 160 MiB would take 10 sets, capped at 8.
        assert_eq!(sets_for(4 * 896 * 4864), MAX_SETS);
        assert_eq!(sets_for(usize::MAX), 1);
    }
}
