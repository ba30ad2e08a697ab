//! `attention_time`: how long one decoder layer's causal GQA attention takes,
//! forward + backward, on one choice of kernels. Passes when
//! `attention_us <= max_us` of this GPU kind.
//!
//! - the shape is `model`'s layer: batch, sequence (with the `batch` and
//!   `seq_len` overrides), heads, kv heads and head_dim;
//! - `t_fwd` and `t_bwd` are the medians, per call, of `repeats`
//!   CUDA-event-timed replays of a captured graph of one pass (the forward;
//!   the backward = dq, dk/dv and the group sum), one call per buffer set,
//!   cycling over sets the L2 cache cannot hold, after one eager run and
//!   `warmup` untimed replays: the graphs and sets of `throughput_ratio`'s
//!   `attention` subject, on one side
//!   (`throughput_ratio::kernels::attention_times`);
//! - `attention_us = t_fwd + t_bwd`, the sum of the two medians.
//!
//! A bound names the GPU kinds it holds for (`max_us: { H200: 30, H100: 30
//! }`, a [`GpuTargets`] as `step_throughput`'s; a plain number holds for
//! any GPU); on a GPU it names none for, the trial is ignored when the run
//! is planned, with the reason `no target for <GPU>`.
//!
//! Under `gemm_without_tensor_ops` (no tensor cores) the `bf16` and
//! `tensor_cores` choices run the f32 kernels ([`kernels_under`]), as the
//! stack's TF32 math does ([`AttnKernels::for_math`]).
//!
//! The `speedups.csv` row has subject `attention forward+backward`: its
//! baseline is the bound (`baseline_median_ms = max_us / 1000`), its
//! candidate the kernels timed, so `ratio = max_us / attention_us` (>= 1
//! passes); its bootstrap interval is that of the bound over the per-replay
//! sums `t_fwd,k + t_bwd,k` (replay `k` of each pass).

use serde::Deserialize;

use super::doc::{ParamDefault::*, ParamDoc, Piece::*};
use super::doc::{MAX_TIMED_TOKENS, MODEL_BOUND, TIMED_BATCH_DOC, TIMED_SEQ_LEN_DOC};
use super::params::{at_most, Count, GpuTargets, ModelName};
use super::stats::{median, ratio_ci, BOOTSTRAP_RESAMPLES};
use super::step_throughput::{check_timed_steps, MAX_REPEATS, MAX_WARMUP};
use super::throughput_ratio::kernels::{
    attention_sets_bytes, attention_shape_label, attention_times, AttentionTimes,
};
use super::training::trainer_shortfall;
use super::{clock_watched, require_gpu, Backend, Comparator, Here, Kind, Measurement};
use super::{MutantFaults, Speedup, TrialContext, Validate};
use crate::error::{Error, Result};
use qlora::model::ModelConfig;
use qlora::ops::attention::AttnKernels;
use qlora::Faults;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub model: ModelName,
    #[serde(default)]
    pub batch: Option<Count>,
    #[serde(default)]
    pub seq_len: Option<Count>,
    /// The kernels timed.
    #[serde(with = "AttnKernelsDef")]
    pub kernels: AttnKernels,
    /// Untimed replays of each pass's graph: at most [`MAX_WARMUP`].
    #[serde(default = "default_warmup")]
    pub warmup: Count,
    /// Timed replays of each pass's graph: at least 5, at most
    /// [`MAX_REPEATS`].
    #[serde(default = "default_repeats")]
    pub repeats: Count,
    /// The bound on forward + backward, µs, per GPU kind or for any GPU.
    pub max_us: GpuTargets,
}

/// The contract spelling of [`AttnKernels`], in the order the reference
/// lists them.
#[derive(Deserialize)]
#[serde(remote = "AttnKernels", rename_all = "snake_case")]
enum AttnKernelsDef {
    Bf16,
    TensorCores,
    F32,
}

/// The contract spelling of `kernels`.
pub fn kernels_name(kernels: AttnKernels) -> &'static str {
    match kernels {
        AttnKernels::Bf16 => "bf16",
        AttnKernels::TensorCores => "tensor_cores",
        AttnKernels::F32 => "f32",
    }
}

/// The kernels that run for the contract's `choice` with `faults` on: the
/// f32 kernels for every choice under `gemm_without_tensor_ops` (the bf16
/// flash and the TF32 kernels both multiply on the tensor cores, which that
/// fault takes away), else the choice.
pub fn kernels_under(choice: AttnKernels, faults: Faults) -> AttnKernels {
    if faults.gemm_without_tensor_ops {
        AttnKernels::F32
    } else {
        choice
    }
}

fn default_warmup() -> Count {
    Count(5)
}

fn default_repeats() -> Count {
    Count(30)
}

/// The parameters of `attention_time`, for the generated reference.
pub const PARAMS: &[ParamDoc] = &[
    ParamDoc {
        name: "model",
        default: Required,
        bound: MODEL_BOUND,
        meaning: "the preset whose layer's attention is timed (its batch, seq_len, heads, kv_heads, head_dim)",
    },
    TIMED_BATCH_DOC,
    TIMED_SEQ_LEN_DOC,
    ParamDoc {
        name: "kernels",
        default: Required,
        bound: &[OneOf(&["bf16", "tensor_cores", "f32"])],
        meaning: "the kernels timed: the bf16 flash kernels, the tensor-core (TF32) ones or the f32 ones (under `gemm_without_tensor_ops` the first two run the f32 ones)",
    },
    ParamDoc {
        name: "warmup",
        default: Yaml("5"),
        bound: &[Text("1 to "), Int(MAX_WARMUP)],
        meaning: "untimed replays of each pass's graph first, after one eager run",
    },
    ParamDoc {
        name: "repeats",
        default: Yaml("30"),
        bound: &[Text("5 to "), Int(MAX_REPEATS)],
        meaning: "timed replays of the forward's graph, then as many of the backward's; fixed, not adaptive",
    },
    ParamDoc {
        name: "max_us",
        default: Required,
        bound: &[Text(
            "> 0: one number for any GPU, or `{GPU kind: number, ...}`",
        )],
        meaning: "bound on forward + backward, us (the sum of the two medians); on a GPU kind it names no bound for, the trial is skipped",
    },
];

/// A minimal `attention_time` check.
pub const EXAMPLE: &[(&str, &str)] = &[
    ("model", "small-4l"),
    ("kernels", "f32"),
    ("max_us", "1000"),
];

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        check_timed_steps(self.warmup, self.repeats)?;
        let tokens = self.model.tokens(self.batch, self.seq_len);
        at_most("batch x seq_len", tokens, MAX_TIMED_TOKENS)?;
        self.model.check_sized(self.batch, self.seq_len)
    }
}

impl Params {
    /// The model with the contract's batch and sequence length.
    fn config(&self) -> ModelConfig {
        self.model.sized(self.batch, self.seq_len)
    }

    /// Device bytes of the buffer sets: the larger of the choice's and the
    /// f32 kernels' (what the mutant runs; they save the probabilities,
    /// the flash kernels only each row's log-sum-exp), so that the mutant
    /// trial, planned the same way, fits too.
    fn device_bytes(&self) -> f64 {
        let cfg = self.config();
        let bytes = |kernels| attention_sets_bytes(&cfg, kernels);
        bytes(self.kernels).max(bytes(AttnKernels::F32))
    }
}

impl Kind<crate::Qlora> for Params {
    fn execute(&self, _backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        clock_watched(cx, |cx| attention_time(self, cx))
    }

    /// No bound for this GPU, or buffer sets that do not fit its free memory.
    fn unjudged_on(&self, backend: Backend, here: &Here) -> Option<String> {
        let gpu = here.gpu.as_ref().filter(|_| backend == Backend::Cuda)?;
        self.max_us
            .missing_on(&gpu.name)
            .or_else(|| trainer_shortfall(backend, &self.config(), self.device_bytes(), here))
    }

    /// Many times the longest trial of `throughput_ratio`'s `attention`
    /// subject (its `duration_ms` in the committed baselines, under 3 s),
    /// which times these graphs on two sides and more replays: a stuck
    /// trial is stopped, a slow machine is not.
    fn default_timeout_s(&self) -> f64 {
        120.0
    }

    fn needs_the_gpu_alone(&self) -> bool {
        true
    }

    /// Every launch, copy and graph of the stack goes to its context's one
    /// stream (`GpuContext::stream`).
    fn runs_on_one_stream(&self) -> bool {
        true
    }
}

/// What one trial timed, and against which bound.
struct Timed<'a> {
    times: AttentionTimes,
    /// The kernels that ran ([`kernels_under`] the trial's faults).
    ran: AttnKernels,
    /// The bound, µs, with the GPU kind it was stated for.
    target: (Option<&'a str>, f64),
    device: &'a str,
    seed: u64,
}

/// `attention_time`: the forward's and the backward's graphs timed on the
/// kernels the choice runs with the trial's faults, which stay on until the
/// timing returns, whatever the outcome.
fn attention_time(p: &Params, cx: &mut TrialContext<'_>) -> Result<Measurement> {
    let cfg = p.config();
    let (seed, faults) = (cx.seed, cx.faults());
    let gpu = require_gpu(cx)?;
    let device = gpu.facts().name.clone();
    // Planning skips a GPU with no bound; a direct call is refused before
    // anything is measured, so a run trial is always judged.
    let target = p
        .max_us
        .for_device(&device)
        .ok_or_else(|| Error::InvalidArgument {
            op: "attention_time",
            message: p.max_us.missing_on(&device).unwrap_or_default(),
        })?;
    let ran = kernels_under(p.kernels, faults);
    let counts = (p.warmup.0, p.repeats.0);
    let times = attention_times(&mut gpu.with_faults(faults), &cfg, ran, seed, counts)?;
    let timed = Timed {
        times,
        ran,
        target,
        device: &device,
        seed,
    };
    Ok(judge(p, &cfg, &timed))
}

/// The measurement of `t`: `attention_us` = the forward's median + the
/// backward's (per call, ms x 1e3), against the bound, with its
/// `speedups.csv` row.
fn judge(p: &Params, cfg: &ModelConfig, t: &Timed<'_>) -> Measurement {
    let fwd = median(&t.times.forward) * 1e3;
    let bwd = median(&t.times.backward) * 1e3;
    let total = fwd + bwd;
    let (kind, max_us) = t.target;
    let on = kind.map_or(String::new(), |g| format!(" on {g}"));
    let row = speedup_row(p, cfg, t, total, &on);
    let detail = format!(
        "{} layer attention {}, {}: forward {fwd:.1} us + backward {bwd:.1} us = {total:.1} us \
         (bound {max_us} us{on}: {:.3}x, 95% CI [{:.3}, {:.3}]); medians per call of {} graph \
         replays over {} buffer sets, after {} untimed; {}",
        cfg.name,
        attention_shape_label(&t.times.shape),
        kernels_text(p.kernels, t.ran),
        row.ratio,
        row.ratio_ci_low,
        row.ratio_ci_high,
        row.repeats,
        t.times.sets,
        p.warmup.0,
        t.device,
    );
    let mut m =
        Measurement::new("attention_us", total, Comparator::Le, max_us, "us").with_detail(detail);
    m.speedups.push(row);
    m
}

/// The `speedups.csv` row of `total` µs against the bound (see the
/// module's doc): `ratio = bound / total`. Its interval is the bootstrap
/// interval of `bound / median(sums)`, the bound a constant baseline series
/// and the per-replay sums of the two passes standing in for the sum of
/// their medians (each pass is timed on its own, so no replay has both).
fn speedup_row(p: &Params, cfg: &ModelConfig, t: &Timed<'_>, total: f64, on: &str) -> Speedup {
    let bound_ms = t.target.1 / 1e3;
    let sums: Vec<f64> = t
        .times
        .forward
        .iter()
        .zip(&t.times.backward)
        .map(|(f, b)| f + b)
        .collect();
    let (lo, hi) = ratio_ci(
        &vec![bound_ms; sums.len()],
        &sums,
        t.seed,
        BOOTSTRAP_RESAMPLES,
    );
    Speedup {
        subject: "attention forward+backward".into(),
        model: cfg.name.into(),
        batch: cfg.batch,
        seq_len: cfg.seq_len,
        baseline: format!("bound {} us{on}", t.target.1),
        candidate: kernels_text(p.kernels, t.ran),
        baseline_median_ms: bound_ms,
        candidate_median_ms: total / 1e3,
        ratio: t.target.1 / total,
        ratio_ci_low: lo,
        ratio_ci_high: hi,
        repeats: sums.len(),
        peak_device_gib: None,
        baseline_peak_device_gib: None,
    }
}

/// `bf16 kernels`, or, where the trial's faults changed them, what ran
/// instead of what the contract chose.
fn kernels_text(choice: AttnKernels, ran: AttnKernels) -> String {
    if choice == ran {
        format!("{} kernels", kernels_name(ran))
    } else {
        format!(
            "{} kernels (for {}: no tensor cores under the trial's faults)",
            kernels_name(ran),
            kernels_name(choice)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::params::tests::with_gpu;
    use qlora::ops::attention::AttnShape;

    fn params(extra: &str) -> std::result::Result<Params, String> {
        crate::check::params::tests::parse(&format!("model: qwen2.5-0.5b\n{extra}"))
    }

    const H100: &str = "NVIDIA H100 80GB HBM3";
    const H200: &str = "NVIDIA H200";

    #[test]
    fn parameters_parse_with_their_defaults() {
        let p = params("kernels: bf16\nmax_us: { H200: 30, H100: 25 }").unwrap();
        assert_eq!(p.kernels, AttnKernels::Bf16);
        assert_eq!((p.warmup, p.repeats), (Count(5), Count(30)));
        assert_eq!((p.batch, p.seq_len), (None, None));
        let cfg = p.config();
        assert_eq!((cfg.batch, cfg.seq_len), (4, 256));
        let p = params("kernels: tensor_cores\nmax_us: 50\nbatch: 2\nseq_len: 512").unwrap();
        assert_eq!(p.kernels, AttnKernels::TensorCores);
        assert_eq!((p.config().batch, p.config().seq_len), (2, 512));
        assert_eq!(
            params("kernels: f32\nmax_us: 1").unwrap().kernels,
            AttnKernels::F32
        );
    }

    #[test]
    fn bad_parameters_are_refused() {
        let e = params("kernels: fp8\nmax_us: 30").unwrap_err();
        assert!(e.contains("unknown variant `fp8`"), "{e}");
        let e = params("max_us: 30").unwrap_err();
        assert!(e.contains("missing field `kernels`"), "{e}");
        let e = params("kernels: bf16").unwrap_err();
        assert!(e.contains("missing field `max_us`"), "{e}");
        let e = params("kernels: bf16\nmax_us: { H200: 0 }").unwrap_err();
        assert!(e.contains("> 0") && e.contains("line 3"), "{e}");
        let e = params("kernels: bf16\nmax_us: 30\nrepeats: 4").unwrap_err();
        assert!(e.contains("at least 5"), "{e}");
        let e = params("kernels: bf16\nmax_us: 30\nrepeats: 1001").unwrap_err();
        assert_eq!(e, "repeats: 1001 is above its bound of 1000");
        let e = params("kernels: bf16\nmax_us: 30\nwarmup: 101").unwrap_err();
        assert_eq!(e, "warmup: 101 is above its bound of 100");
        let e = params("kernels: bf16\nmax_us: 30\nbatch: 8192").unwrap_err();
        assert_eq!(e, "batch x seq_len: 2097152 is above its bound of 1048576");
        let e = params("kernels: bf16\nmax_us: 30\nmode: {graph: true}").unwrap_err();
        assert!(e.contains("unknown field `mode`"), "{e}");
    }

    #[test]
    fn a_bound_is_judged_only_on_the_gpu_kinds_it_names() {
        let p = params("kernels: bf16\nmax_us: { H200: 30, H100: 25 }").unwrap();
        assert_eq!(p.max_us.for_device(H200), Some((Some("H200"), 30.0)));
        assert_eq!(p.max_us.for_device(H100), Some((Some("H100"), 25.0)));
        for judged in [H200, H100] {
            assert_eq!(p.unjudged_on(Backend::Cuda, &with_gpu(judged, 80)), None);
        }
        let why = p
            .unjudged_on(Backend::Cuda, &with_gpu("NVIDIA A100-SXM4-80GB", 80))
            .unwrap();
        assert!(
            why.starts_with("no target for NVIDIA A100-SXM4-80GB") && why.contains("H200, H100"),
            "{why}"
        );
        // No GPU here: the no-driver rule applies, not this one.
        assert_eq!(p.unjudged_on(Backend::Cuda, &Here::default()), None);
        // A plain number holds on any GPU.
        let p = params("kernels: bf16\nmax_us: 30").unwrap();
        assert_eq!(p.max_us.for_device("NVIDIA A100"), Some((None, 30.0)));
    }

    #[test]
    fn buffer_sets_that_do_not_fit_are_not_judged() {
        let bf16 = params("kernels: bf16\nmax_us: 30").unwrap();
        let f32 = params("kernels: f32\nmax_us: 30").unwrap();
        // The bf16 trial plans for its mutant's f32 sets (the probabilities).
        assert_eq!(bf16.device_bytes(), f32.device_bytes());
        let cfg = bf16.config();
        assert!(
            attention_sets_bytes(&cfg, AttnKernels::Bf16)
                < attention_sets_bytes(&cfg, AttnKernels::F32)
        );
        let mut here = with_gpu(H100, 80);
        assert_eq!(bf16.unjudged_on(Backend::Cuda, &here), None);
        here.gpu.as_mut().unwrap().free_memory_bytes = 100 << 20;
        let why = bf16.unjudged_on(Backend::Cuda, &here).unwrap();
        assert!(
            why.starts_with("model qwen2.5-0.5b (batch 4, seq 256) needs ~"),
            "{why}"
        );
    }

    #[test]
    fn without_tensor_ops_every_choice_runs_the_f32_kernels() {
        let off = Faults {
            gemm_without_tensor_ops: true,
            ..Faults::NONE
        };
        for choice in [
            AttnKernels::Bf16,
            AttnKernels::TensorCores,
            AttnKernels::F32,
        ] {
            assert_eq!(kernels_under(choice, Faults::NONE), choice);
            assert_eq!(kernels_under(choice, off), AttnKernels::F32);
        }
        // Other knobs leave the choice alone.
        let slow = Faults {
            serialised_launch: true,
            ..Faults::NONE
        };
        assert_eq!(kernels_under(AttnKernels::Bf16, slow), AttnKernels::Bf16);
    }

    fn timed(forward: &[f64], backward: &[f64], ran: AttnKernels) -> Timed<'static> {
        let shape = AttnShape {
            batch: 4,
            seq: 256,
            heads: 14,
            kv_heads: 2,
            head_dim: 64,
        };
        Timed {
            times: AttentionTimes {
                shape,
                sets: 8,
                forward: forward.to_vec(),
                backward: backward.to_vec(),
            },
            ran,
            target: (Some("H200"), 30.0),
            device: H200,
            seed: 7,
        }
    }

    #[test]
    fn the_time_is_the_sum_of_the_two_medians_against_the_bound() {
        let p = params("kernels: bf16\nmax_us: { H200: 30 }").unwrap();
        // Medians 0.014 ms and 0.042 ms per call: 56 us.
        let t = timed(
            &[0.013, 0.014, 0.020, 0.014, 0.015],
            &[0.041, 0.042, 0.040, 0.050, 0.042],
            AttnKernels::Bf16,
        );
        let m = judge(&p, &p.config(), &t);
        assert!((m.observed - 56.0).abs() < 1e-9, "{}", m.observed);
        assert_eq!(
            (
                m.metric.as_str(),
                m.comparator,
                m.threshold,
                m.unit.as_str()
            ),
            ("attention_us", Comparator::Le, 30.0, "us")
        );
        assert!(!m.passed());
        for part in [
            "qwen2.5-0.5b layer attention b4 s256 h14/2 d64, bf16 kernels",
            "forward 14.0 us + backward 42.0 us = 56.0 us",
            "bound 30 us on H200",
            "5 graph replays over 8 buffer sets, after 5 untimed; NVIDIA H200",
        ] {
            assert!(m.detail.contains(part), "{part}: {}", m.detail);
        }
        let row = &m.speedups[0];
        assert_eq!(m.speedups.len(), 1);
        assert_eq!((row.batch, row.seq_len, row.repeats), (4, 256, 5));
        assert_eq!(row.candidate, "bf16 kernels");
        assert_eq!(row.baseline, "bound 30 us on H200");
        assert!((row.ratio - 30.0 / 56.0).abs() < 1e-12, "{}", row.ratio);
        assert!((row.baseline_median_ms - 0.030).abs() < 1e-12);
        assert!(row.ratio_ci_low <= row.ratio_ci_high, "{row:?}");
        // The row is what the trial judged: it passes at a ratio of 1.
        let judged = falsify_core::report::claim::ratio_threshold(
            row.ratio,
            m.observed,
            m.comparator.symbol(),
            m.threshold,
        );
        assert_eq!(judged, Some(1.0));
    }

    #[test]
    fn a_faulted_choice_says_what_ran() {
        let p = params("kernels: bf16\nmax_us: 30").unwrap();
        let t = timed(&[0.1; 5], &[0.2; 5], AttnKernels::F32);
        let m = judge(&p, &p.config(), &t);
        assert!((m.observed - 300.0).abs() < 1e-9);
        assert_eq!(
            m.speedups[0].candidate,
            "f32 kernels (for bf16: no tensor cores under the trial's faults)"
        );
    }
}
