//! `throughput_ratio`: the median time of a baseline over a candidate, after
//! warm-up, over repeats. Passes when `ratio >= min_ratio`; the bootstrap
//! confidence interval of the ratio is recorded in `speedups.csv`.

pub(crate) mod kernels;
mod train_step;

use serde::Deserialize;

use super::doc::{ParamDefault::*, ParamDoc, Piece::*};
use super::doc::{DEFAULT_STEP_MODE, MAX_TIMED_TOKENS, MODEL_BOUND, STEP_MODE_BOUND};
use super::doc::{TIMED_BATCH_DOC, TIMED_SEQ_LEN_DOC};

use super::op::{throughput_kernels, ThroughputKernel};
use super::params::{at_most, Count, ModelName, Positive, StepMode};
use super::repeats::{check_cap, Plan};
use super::training::{trainer_bytes, trainer_shortfall, TRAINING_TIMEOUT_S};
use super::{clock_watched, Backend, Comparator, Here, Kind, Measurement, TrialContext, Validate};
use crate::error::Result;
use qlora::model::ModelConfig;

/// What is timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Subject {
    /// One whole training step of `model`.
    TrainStep,
    /// The TF32 GEMM on fp32 weights vs the NF4 path (dequantise, then the
    /// same GEMM) on `model`'s projection shapes; the fused NF4 kernel is
    /// reported next to it.
    Nf4Gemm,
    /// The fused kernels vs their unfused sequences on `model`'s shapes.
    Fusion,
    /// A direct cuBLAS call vs our GEMM launcher on `model`'s projection shapes.
    Gemm,
    /// Causal GQA attention of one `model` layer, forward + backward: the
    /// f32 kernels vs the tensor-core (TF32) kernels.
    Attention,
}

impl Subject {
    /// The contract spelling.
    pub fn name(self) -> &'static str {
        match self {
            Subject::TrainStep => "train_step",
            Subject::Nf4Gemm => "nf4_gemm",
            Subject::Fusion => "fusion",
            Subject::Gemm => "gemm",
            Subject::Attention => "attention",
        }
    }

    /// The op table's kernel subject of this name; none for `train_step`.
    pub fn kernel(self) -> Option<&'static ThroughputKernel> {
        throughput_kernels().find(|k| k.name == self.name())
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    #[serde(default = "default_subject")]
    pub subject: Subject,
    pub model: ModelName,
    /// Overrides the preset's batch; `batch x seq_len` is at most
    /// [`MAX_TIMED_TOKENS`].
    #[serde(default)]
    pub batch: Option<Count>,
    /// Overrides the preset's sequence length.
    #[serde(default)]
    pub seq_len: Option<Count>,
    #[serde(default)]
    pub baseline: StepMode,
    #[serde(default)]
    pub candidate: StepMode,
    /// Untimed runs first: at most [`MAX_WARMUP`].
    #[serde(default = "default_warmup")]
    pub warmup: Count,
    /// Timed runs of each side: at least 5, at most [`MAX_REPEATS`].
    #[serde(default = "default_repeats")]
    pub repeats: Count,
    /// Most timed runs of each side (of each shape, for a kernel subject)
    /// when the interval is still wider than +-1% of the ratio: at least `repeats`, at most
    /// [`MAX_REPEATS`]; by default
    /// [`DEFAULT_CAP_FACTOR`](super::repeats::DEFAULT_CAP_FACTOR)` x repeats`.
    #[serde(default)]
    pub max_repeats: Option<Count>,
    pub min_ratio: Positive,
}

/// Most untimed runs of each side (the shipped checks take 3 to 5).
pub const MAX_WARMUP: usize = 100;
/// Most timed runs of each side (the shipped checks time 10 to 50): enough
/// for any interval, few enough that alternated steps of the largest
/// shipped model finish in about a minute.
pub const MAX_REPEATS: usize = 1_000;

fn default_subject() -> Subject {
    Subject::TrainStep
}

fn default_warmup() -> Count {
    Count(5)
}

fn default_repeats() -> Count {
    Count(30)
}

/// The parameters of `throughput_ratio`, for the generated reference.
pub const PARAMS: &[ParamDoc] = &[
    ParamDoc {
        name: "subject",
        default: Yaml("train_step"),
        bound: &[OneOf(&[
            "train_step",
            "nf4_gemm",
            "fusion",
            "gemm",
            "attention",
        ])],
        meaning: "what is timed",
    },
    ParamDoc {
        name: "model",
        default: Required,
        bound: MODEL_BOUND,
        meaning: "the preset whose step or shapes are timed",
    },
    TIMED_BATCH_DOC,
    TIMED_SEQ_LEN_DOC,
    ParamDoc {
        name: "baseline",
        default: Yaml(DEFAULT_STEP_MODE),
        bound: STEP_MODE_BOUND,
        meaning: "the baseline's step mode (`train_step`)",
    },
    ParamDoc {
        name: "candidate",
        default: Yaml(DEFAULT_STEP_MODE),
        bound: STEP_MODE_BOUND,
        meaning: "the candidate's step mode (`train_step`)",
    },
    ParamDoc {
        name: "warmup",
        default: Yaml("5"),
        bound: &[Text("1 to "), Int(MAX_WARMUP)],
        meaning: "untimed runs of each side first",
    },
    ParamDoc {
        name: "repeats",
        default: Yaml("30"),
        bound: &[Text("5 to "), Int(MAX_REPEATS)],
        meaning: "timed runs of each side, the least; more until the ratio's 95% interval is within +-1% (for a kernel subject, each shape's)",
    },
    ParamDoc {
        name: "max_repeats",
        default: Otherwise("4 x `repeats`, at most the bound"),
        bound: &[Text("`repeats` to "), Int(MAX_REPEATS)],
        meaning: "most timed runs of each side (a `train_step` mutant stops once its interval lies below `min_ratio`)",
    },
    ParamDoc {
        name: "min_ratio",
        default: Required,
        bound: &[Text("> 0")],
        meaning: "bound on baseline time / candidate time (medians)",
    },
];

/// A minimal `throughput_ratio` check.
pub const EXAMPLE: &[(&str, &str)] = &[
    ("model", "small-4l"),
    ("candidate", "{graph: true}"),
    ("min_ratio", "1.0"),
];

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        if self.repeats.0 < 5 {
            return Err("`repeats` must be at least 5 for a median and its interval".into());
        }
        at_most("repeats", self.repeats.0, MAX_REPEATS)?;
        check_cap(self.repeats.0, self.max_repeats.map(|c| c.0), MAX_REPEATS)?;
        at_most("warmup", self.warmup.0, MAX_WARMUP)?;
        let tokens = self.model.tokens(self.batch, self.seq_len);
        at_most("batch x seq_len", tokens, MAX_TIMED_TOKENS)?;
        self.model.check_sized(self.batch, self.seq_len)
    }
}

impl Params {
    /// The model with the contract's batch and sequence length.
    pub(crate) fn config(&self) -> ModelConfig {
        self.model.sized(self.batch, self.seq_len)
    }

    /// How many timed pairs: `repeats` to `max_repeats`; a `mutant` trial
    /// stops once the ratio's interval lies below `min_ratio` (the kernel
    /// subjects, judged on a total over shapes, time each shape with
    /// `mutant` false).
    pub(crate) fn plan(&self, mutant: bool) -> Plan {
        Plan::new(self.repeats.0, self.max_repeats.map(|c| c.0), MAX_REPEATS).fail_fast_if(
            mutant,
            Comparator::Ge,
            self.min_ratio.0,
        )
    }

    /// Device bytes the subject holds at its peak: both trainers at once for
    /// `train_step` (they alternate step by step), else the kernel
    /// subject's own formula (in `kernels`).
    fn device_bytes(&self) -> f64 {
        let cfg = self.config();
        match self.subject.kernel() {
            Some(kernel) => (kernel.device_bytes)(&cfg),
            None => {
                trainer_bytes(&cfg, &self.baseline.speed_options())
                    + trainer_bytes(&cfg, &self.candidate.speed_options())
            }
        }
    }
}

impl Kind<crate::Qlora> for Params {
    fn execute(&self, _backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        clock_watched(cx, |cx| match self.subject.kernel() {
            Some(kernel) => kernels::measure(self, kernel, cx),
            None => train_step::throughput_ratio(self, cx),
        })
    }

    /// Whether what the subject allocates fits the GPU's free memory.
    fn unjudged_on(&self, backend: Backend, here: &Here) -> Option<String> {
        let cfg = self.config();
        trainer_shortfall(backend, &cfg, self.device_bytes(), here)
    }

    /// Many times this kind's longest trial (its `duration_ms` in the
    /// committed baselines; the parameter bounds keep a trial within it):
    /// a stuck trial is stopped, a slow machine is not.
    fn default_timeout_s(&self) -> f64 {
        TRAINING_TIMEOUT_S
    }

    fn needs_the_gpu_alone(&self) -> bool {
        true
    }

    /// A training step's LoRA weight gradients run on a second stream,
    /// beside the rest of its backward (`GpuContext::on_side_stream`): one
    /// hardware queue could serialise them, so the step is timed with
    /// CUDA's default, as a user's process runs it.
    fn runs_on_one_stream(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::params::tests::with_gpu;

    fn params(extra: &str) -> std::result::Result<Params, String> {
        crate::check::params::tests::parse(&format!("model: qwen2.5-0.5b\nmin_ratio: 1.0\n{extra}"))
    }

    #[test]
    fn every_kernel_subject_is_in_the_op_table_once() {
        let all = [
            Subject::TrainStep,
            Subject::Nf4Gemm,
            Subject::Fusion,
            Subject::Gemm,
            Subject::Attention,
        ];
        for subject in all {
            let parsed: Subject = serde_yaml::from_str(subject.name()).unwrap();
            assert_eq!(parsed, subject);
            assert_eq!(
                subject.kernel().map(|k| k.name),
                (subject != Subject::TrainStep).then(|| subject.name())
            );
        }
        let names: Vec<&str> = throughput_kernels().map(|k| k.name).collect();
        assert_eq!(names, ["fusion", "attention", "gemm", "nf4_gemm"]);
    }

    #[test]
    fn counts_and_tokens_are_bounded() {
        let e = params("repeats: 100000000").unwrap_err();
        assert_eq!(e, "repeats: 100000000 is above its bound of 1000");
        let e = params("repeats: 10\nmax_repeats: 9").unwrap_err();
        assert_eq!(e, "`max_repeats` (9) must be at least `repeats` (10)");
        let e = params("max_repeats: 1001").unwrap_err();
        assert_eq!(e, "max_repeats: 1001 is above its bound of 1000");
        assert_eq!(
            params("subject: gemm\nmax_repeats: 60")
                .unwrap()
                .plan(false)
                .max,
            60
        );
        let p = params("repeats: 10").unwrap();
        assert_eq!(p.plan(false).max, 40);
        assert_eq!(p.plan(false).fail_fast, None);
        assert_eq!(p.plan(true).fail_fast, Some((Comparator::Ge, 1.0)));
        assert_eq!(params("max_repeats: 30").unwrap().plan(false).max, 30);
        let e = params("warmup: 5000").unwrap_err();
        assert_eq!(e, "warmup: 5000 is above its bound of 100");
        let e = params("batch: 8192").unwrap_err();
        assert_eq!(e, "batch x seq_len: 2097152 is above its bound of 1048576");
    }

    #[test]
    fn both_trainers_must_fit_at_once() {
        let p = params("baseline: {graph: true}\ncandidate: {graph: true, base: nf4}").unwrap();
        let both = p.device_bytes();
        let one = trainer_bytes(&p.config(), &p.baseline.speed_options());
        assert!(both > one, "{both} vs {one}");
        let mut here = with_gpu("NVIDIA H100 80GB HBM3", 80);
        assert_eq!(p.unjudged_on(Backend::Cuda, &here), None);
        here.gpu.as_mut().unwrap().free_memory_bytes = one as u64 + 1;
        let why = p.unjudged_on(Backend::Cuda, &here).unwrap();
        assert!(
            why.starts_with("model qwen2.5-0.5b (batch 4, seq 256) needs ~"),
            "{why}"
        );
    }

    #[test]
    fn kernel_subjects_count_their_buffer_sets() {
        for subject in ["gemm", "nf4_gemm", "fusion", "attention"] {
            let p = params(&format!("subject: {subject}")).unwrap();
            let bytes = p.device_bytes();
            // At least the 160-256 MiB of rotated sets, far below a GPU.
            assert!(
                bytes > f64::from(150u32 << 20) && bytes < f64::from(2u32 << 30),
                "{subject}: {bytes}"
            );
            let mut here = with_gpu("NVIDIA H200", 141);
            assert_eq!(p.unjudged_on(Backend::Cuda, &here), None);
            here.gpu.as_mut().unwrap().free_memory_bytes = 100 << 20;
            assert!(p.unjudged_on(Backend::Cuda, &here).is_some(), "{subject}");
        }
    }
}
