//! Validated parameter types shared by the check kinds.
//!
//! Range checks happen while deserialising, so serde_yaml attaches the exact
//! line and column of the offending value to the error.

use std::collections::BTreeMap;

use serde::de::{self, Deserializer};
use serde::Deserialize;

use qlora::gpu::GemmMath;
use qlora::model::ModelConfig;
use qlora::train::GpuTrainOptions;

use super::Here;
pub use qlora::train::{BaseWeights, ClipMode};

/// A finite number `>= 0` (tolerances, bounds).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct NonNegative(pub f64);

/// A finite number `> 0` (ratios, learning rates, step sizes).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Positive(pub f64);

/// A fraction in `(0, 1]`.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Fraction(pub f64);

/// A count `> 0` (steps, repeats, cases), at most [`MAX_COUNT`]; each
/// kind states a tighter bound for each of its counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Count(pub usize);

/// The largest count any parameter parses as (2^40).
pub const MAX_COUNT: usize = 1 << 40;

/// A test's `timeout_s`: a finite number of seconds, at least
/// [`MIN_TIMEOUT_S`].
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Timeout(pub f64);

/// The shortest `timeout_s` a test may set, in seconds. Below it the start
/// of the trial's process (and, on a loaded machine, when it is scheduled)
/// decides whether the trial finishes in time, not the trial's own work,
/// so its verdict would be chance.
pub const MIN_TIMEOUT_S: f64 = 1.0;

/// [`MIN_TIMEOUT_S`] as the range check says it (a unit test keeps the two
/// in step).
const TIMEOUT_RULE: &str =
    ">= 1 (seconds; a shorter limit would time the start of the trial's process, not the trial)";

/// Deserialises a number and checks it inside the visitor, so serde_yaml marks
/// the error with the line and column of the value itself.
fn checked_f64<'de, D: Deserializer<'de>>(
    d: D,
    rule: &'static str,
    ok: fn(f64) -> bool,
) -> Result<f64, D::Error> {
    struct V {
        rule: &'static str,
        ok: fn(f64) -> bool,
    }
    impl de::Visitor<'_> for V {
        type Value = f64;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "a finite number that is {}", self.rule)
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<f64, E> {
            if !v.is_finite() {
                Err(E::custom(format!("{v} is not a finite number")))
            } else if !(self.ok)(v) {
                Err(E::custom(format!(
                    "{v} is out of range: it must be {}",
                    self.rule
                )))
            } else {
                Ok(v)
            }
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<f64, E> {
            self.visit_f64(v as f64)
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<f64, E> {
            self.visit_f64(v as f64)
        }
    }
    d.deserialize_f64(V { rule, ok })
}

impl<'de> Deserialize<'de> for NonNegative {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        checked_f64(d, ">= 0", |v| v >= 0.0).map(NonNegative)
    }
}

impl<'de> Deserialize<'de> for Positive {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        checked_f64(d, "> 0", |v| v > 0.0).map(Positive)
    }
}

impl<'de> Deserialize<'de> for Timeout {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        checked_f64(d, TIMEOUT_RULE, |v| v >= MIN_TIMEOUT_S).map(Timeout)
    }
}

impl<'de> Deserialize<'de> for Fraction {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        checked_f64(d, "in (0, 1]", |v| v > 0.0 && v <= 1.0).map(Fraction)
    }
}

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = Count;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a whole number > 0")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Count, E> {
                match usize::try_from(v) {
                    Ok(0) => Err(E::custom("0 is out of range: it must be > 0")),
                    Ok(n) if n <= MAX_COUNT => Ok(Count(n)),
                    _ => Err(E::custom(format!("{v} is too large"))),
                }
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Count, E> {
                u64::try_from(v)
                    .map_err(|_| E::custom(format!("{v} is out of range: it must be > 0")))
                    .and_then(|v| self.visit_u64(v))
            }
            /// A whole float (`1e6`) is the count it spells; the bound check
            /// is the integer one.
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Count, E> {
                if v.is_finite() && v.fract() == 0.0 && v > 0.0 && v <= MAX_COUNT as f64 {
                    self.visit_u64(v as u64)
                } else if v.is_finite() && v.fract() == 0.0 && v > 0.0 {
                    Err(E::custom(format!("{v} is too large")))
                } else {
                    Err(E::custom(format!("{v} is not a whole number > 0")))
                }
            }
        }
        // `any`, so that negative numbers reach `visit_i64` and get the range message.
        d.deserialize_any(V)
    }
}

/// Refuses `value` above the documented `bound` of parameter `name`.
pub fn at_most(name: &str, value: usize, bound: usize) -> Result<(), String> {
    if value > bound {
        Err(format!("{name}: {value} is above its bound of {bound}"))
    } else {
        Ok(())
    }
}

/// `bytes` in GiB, or MiB below one GiB, for messages.
pub fn gib(bytes: f64) -> String {
    let (gib, mib) = (f64::from(1u32 << 30), f64::from(1u32 << 20));
    if bytes >= gib {
        format!("{:.1} GiB", bytes / gib)
    } else {
        format!("{:.1} MiB", bytes / mib)
    }
}

/// Refuses a cpu trial whose estimated host memory `needed` (bytes) is more
/// than `here` has; `what` names the parameter and its value. A machine
/// whose memory is unknown (0) refuses nothing.
pub fn fits_host(what: &str, needed: f64, here: &Here) -> Result<(), String> {
    let have = here.host_memory_bytes as f64;
    if here.host_memory_bytes > 0 && needed > have {
        Err(format!(
            "{what} needs ~{} on cpu; this machine has {}",
            gib(needed),
            gib(have)
        ))
    } else {
        Ok(())
    }
}

/// Why a cuda trial needing `needed` device bytes cannot be judged on the
/// GPU of `here` (more than its free memory), or `None` when it fits or no
/// GPU is known.
pub fn gpu_shortfall(what: &str, needed: f64, here: &Here) -> Option<String> {
    let gpu = here.gpu.as_ref()?;
    let free = gpu.free_memory_bytes as f64;
    (needed > free).then(|| {
        format!(
            "{what} needs ~{}, {} has {} free",
            gib(needed),
            gpu.name,
            gib(free)
        )
    })
}

/// The name of a model preset, checked against [`qlora::model::PRESETS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelName(pub ModelConfig);

impl ModelName {
    /// The preset with `batch` and `seq_len` overridden where given.
    pub fn sized(&self, batch: Option<Count>, seq_len: Option<Count>) -> ModelConfig {
        let mut cfg = self.0;
        if let Some(b) = batch {
            cfg = cfg.with_batch(b.0);
        }
        if let Some(s) = seq_len {
            cfg = cfg.with_seq_len(s.0);
        }
        cfg
    }

    /// Whether the training step's kernels take the preset with `batch`
    /// and `seq_len` overridden ([`qlora::train::check_shapes`], the rules
    /// a trainer checks before it allocates): call it once the tokens are
    /// within the kind's bound.
    pub fn check_sized(&self, batch: Option<Count>, seq_len: Option<Count>) -> Result<(), String> {
        let cfg = self.sized(batch, seq_len);
        qlora::train::check_shapes(&cfg).map_err(|e| {
            format!(
                "model `{}` at batch {} and seq_len {}: {e}",
                cfg.name, cfg.batch, cfg.seq_len
            )
        })
    }

    /// Tokens per step, `batch x seq_len` with the overrides, saturating
    /// (each count may be up to [`MAX_COUNT`]) so a bound can refuse it.
    pub fn tokens(&self, batch: Option<Count>, seq_len: Option<Count>) -> usize {
        let b = batch.map_or(self.0.batch, |c| c.0);
        let s = seq_len.map_or(self.0.seq_len, |c| c.0);
        b.saturating_mul(s)
    }
}

impl<'de> Deserialize<'de> for ModelName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = ModelName;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a model preset name")
            }
            fn visit_str<E: de::Error>(self, name: &str) -> Result<ModelName, E> {
                ModelConfig::preset(name).map(ModelName).ok_or_else(|| {
                    E::custom(format!(
                        "unknown model preset `{name}`; known presets: {}",
                        ModelConfig::preset_names().join(", ")
                    ))
                })
            }
        }
        d.deserialize_str(V)
    }
}

/// Named dimensions of one op invocation, e.g. `{rows: 4, hidden: 33}`.
/// Each op checks that it got exactly the dimensions it needs.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Shape(pub BTreeMap<String, Count>);

impl Shape {
    /// The dimension `name`; callers validate the key set first with [`Shape::expect_dims`].
    pub fn dim(&self, name: &str) -> usize {
        self.0.get(name).map_or(0, |c| c.0)
    }

    /// The product of the named dimensions, in f64 so that no product of
    /// counts overflows (each is at most [`MAX_COUNT`]).
    pub fn product(&self, dims: &[&str]) -> f64 {
        dims.iter().map(|d| self.dim(d) as f64).product()
    }

    /// Checks that the shape names exactly `dims`; the error says what
    /// the op takes, e.g. "takes the dimensions [rows, hidden], not [rows,
    /// seq]".
    pub fn expect_dims(&self, dims: &[&str]) -> Result<(), String> {
        let got: Vec<&str> = self.0.keys().map(String::as_str).collect();
        let mut want: Vec<&str> = dims.to_vec();
        want.sort_unstable();
        if got == want {
            Ok(())
        } else {
            Err(format!(
                "takes the dimensions [{}], not [{}]",
                dims.join(", "),
                got.join(", ")
            ))
        }
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|(k, v)| format!("{k}={}", v.0)).collect();
        write!(f, "{{{}}}", parts.join(", "))
    }
}

/// Numeric precision of an op or GEMM path; picks the default tolerance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    #[default]
    F32,
    Tf32,
    F16,
    Bf16,
}

impl Precision {
    /// Default relative-L2 tolerance against the f64-accumulated reference.
    pub fn default_tolerance(self) -> f64 {
        match self {
            Precision::F32 => 1e-5,
            Precision::Tf32 => 2e-3,
            Precision::F16 => 5e-3,
            Precision::Bf16 => 2e-2,
        }
    }
}

/// The contract spelling of [`qlora::train::BaseWeights`].
#[derive(Deserialize)]
#[serde(remote = "BaseWeights", rename_all = "snake_case")]
pub(crate) enum BaseWeightsDef {
    Fp32,
    Nf4,
}

/// The contract spelling of [`qlora::train::ClipMode`].
#[derive(Deserialize)]
#[serde(remote = "ClipMode", rename_all = "snake_case")]
enum ClipModeDef {
    Global,
    PerLayer,
}

/// A base format as a contract names it (`fp32` or `nf4`), for lists of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct BaseName(#[serde(with = "BaseWeightsDef")] pub BaseWeights);

/// One way of running the training step, as a contract names it.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct StepMode {
    /// Replay backward + clip + optimizer as one captured CUDA graph.
    #[serde(default)]
    pub graph: bool,
    #[serde(default, with = "ClipModeDef")]
    pub clip: ClipMode,
    #[serde(default, with = "BaseWeightsDef")]
    pub base: BaseWeights,
    /// Math of the backward GEMMs (the forward ones are TF32 on the GPU).
    #[serde(default)]
    pub backward_math: BackwardMath,
    /// Whether the MLP's gate and up activations are recomputed in the
    /// backward or kept from the forward.
    #[serde(default)]
    pub mlp_activations: MlpActivations,
    /// Which copy of the frozen fp32 weights the backward's input gradients
    /// read.
    #[serde(default)]
    pub backward_weights: BackwardWeights,
    /// The operands of the LM head's two GEMMs (`logits = nf Wlm^T`,
    /// `dnf = dlogits Wlm`); `f16`: a kept copy of `Wlm`, the final norm's
    /// output cast, the cross-entropy gradient written scaled in f16. Needs
    /// `backward_math: tf32` (the forward is TF32 already).
    #[serde(default)]
    pub lm_head_operands: GemmOperands,
    /// The operands of the frozen projections' forward GEMMs (each layer's
    /// q/k/v stack, o, gate, up, down); `f16`: kept copies of the weights,
    /// each GEMM's input cast first. Needs `base: fp32`.
    #[serde(default)]
    pub projection_operands: GemmOperands,
}

/// What a group of GEMMs reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum GemmOperands {
    /// The f32 tensors, in each direction's GEMM math.
    #[default]
    F32,
    /// f16 copies: TF32's 11-bit significand, f32 accumulation, twice
    /// TF32's tensor-core rate.
    F16,
}

/// Which copy of a frozen fp32 projection `W` (`[out, in]`) the backward's
/// input gradient `dx = dy W` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum BackwardWeights {
    /// `W` itself, shared with the forward.
    #[default]
    Shared,
    /// A kept `W^T`: both GEMM operands K-major, as in the forward (the
    /// size of o, gate, up and down again in device memory).
    Transposed,
}

/// What the backward does for the MLP's `gate` and `up` activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum MlpActivations {
    /// Recompute them from the saved norm output (two more GEMMs per layer,
    /// `2 x tokens x intermediate` fewer floats kept per layer).
    #[default]
    Recompute,
    /// Keep the forward's: faster, more memory.
    Keep,
}

/// Math of the training step's backward GEMMs on the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum BackwardMath {
    /// Plain IEEE f32: what the gradient-parity checks hold to 1e-5.
    #[default]
    Fp32,
    /// TF32 tensor-op products with f32 accumulation, as the forward.
    Tf32,
}

impl StepMode {
    /// The stack's options for this mode with `hyper`.
    pub fn gpu_options(&self, hyper: Hyper) -> GpuTrainOptions {
        GpuTrainOptions {
            clip: self.clip,
            base: self.base,
            hyper: hyper.to_stack(),
            graph: self.graph,
            forward_math: None,
            backward_math: match self.backward_math {
                BackwardMath::Fp32 => None,
                BackwardMath::Tf32 => Some(GemmMath::Tf32),
            },
            keep_mlp: self.mlp_activations == MlpActivations::Keep,
            transposed_weights: self.backward_weights == BackwardWeights::Transposed,
            f16_lm_head: self.lm_head_operands == GemmOperands::F16,
            f16_projections: self.projection_operands == GemmOperands::F16,
            device_quantize: false,
        }
    }

    /// [`StepMode::gpu_options`] for speed and memory checks: default
    /// hyper-parameters and an NF4 base quantised on the device (fast for the
    /// large presets; parity checks use the host's exact quantiser instead).
    pub fn speed_options(&self) -> GpuTrainOptions {
        GpuTrainOptions {
            device_quantize: true,
            ..self.gpu_options(Hyper::default())
        }
    }
}

impl std::fmt::Display for StepMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The stack names its modes; the default math and MLP are left out,
        // so the names of older rows stay as they were.
        f.write_str(&self.gpu_options(Hyper::default()).mode_name())
    }
}

/// Optimiser hyper-parameters a training check may override.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hyper {
    #[serde(default = "Hyper::default_lr")]
    pub lr: Positive,
    #[serde(default = "Hyper::default_max_grad_norm")]
    pub max_grad_norm: Positive,
    #[serde(default = "Hyper::default_weight_decay")]
    pub weight_decay: NonNegative,
}

impl Hyper {
    fn default_lr() -> Positive {
        Positive(1e-3)
    }
    fn default_max_grad_norm() -> Positive {
        Positive(1.0)
    }
    fn default_weight_decay() -> NonNegative {
        NonNegative(0.0)
    }
}

impl Hyper {
    /// The stack's plain-number hyper-parameters.
    pub fn to_stack(self) -> qlora::train::Hyper {
        qlora::train::Hyper {
            lr: self.lr.0,
            max_grad_norm: self.max_grad_norm.0,
            weight_decay: self.weight_decay.0,
        }
    }
}

impl Default for Hyper {
    fn default() -> Self {
        Hyper {
            lr: Hyper::default_lr(),
            max_grad_norm: Hyper::default_max_grad_norm(),
            weight_decay: Hyper::default_weight_decay(),
        }
    }
}

/// Tests, and the machines other kinds' tests plan on.
#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A kind's parameters from YAML, validated as the loader does: serde's
    /// error or `validate`'s, as text.
    pub fn parse<P: serde::de::DeserializeOwned + crate::check::Validate>(
        yaml: &str,
    ) -> std::result::Result<P, String> {
        let p: P = serde_yaml::from_str(yaml).map_err(|e| e.to_string())?;
        p.validate()?;
        Ok(p)
    }

    #[test]
    fn ranges_are_enforced_with_locations() {
        let e = serde_yaml::from_str::<NonNegative>("-1e-3").unwrap_err();
        assert!(e.to_string().contains(">= 0"), "{e}");
        assert!(e.location().is_some());
        assert!(serde_yaml::from_str::<NonNegative>(".nan").is_err());
        assert!(serde_yaml::from_str::<Positive>("0").is_err());
        assert!(serde_yaml::from_str::<Fraction>("1.5").is_err());
        assert!(serde_yaml::from_str::<Count>("0").is_err());
        assert_eq!(serde_yaml::from_str::<Count>("3").ok(), Some(Count(3)));
        assert!(serde_yaml::from_str::<ModelName>("gpt-17").is_err());
        let e = serde_yaml::from_str::<Timeout>("0.5").unwrap_err();
        assert!(e.to_string().contains("it must be >= 1 (seconds"), "{e}");
        assert!(TIMEOUT_RULE.starts_with(&format!(">= {MIN_TIMEOUT_S} ")));
        assert_eq!(
            serde_yaml::from_str::<Timeout>("1").ok(),
            Some(Timeout(MIN_TIMEOUT_S))
        );
    }

    #[test]
    fn whole_floats_are_counts_and_large_ones_are_refused() {
        assert_eq!(
            serde_yaml::from_str::<Count>("1e6").ok(),
            Some(Count(1_000_000))
        );
        let e = serde_yaml::from_str::<Count>("1.5").unwrap_err();
        assert!(e.to_string().contains("not a whole number"), "{e}");
        let e = serde_yaml::from_str::<Count>("1e20").unwrap_err();
        assert!(e.to_string().contains("too large"), "{e}");
        let e = serde_yaml::from_str::<Count>("2000000000000").unwrap_err();
        assert!(e.to_string().contains("too large"), "{e}");
    }

    const GIB: u64 = 1 << 30;

    /// The CI machine the cpu trials must fit: 24 GB, no GPU.
    pub(crate) fn ci() -> Here {
        Here {
            host_memory_bytes: 24 * GIB,
            gpu: None,
        }
    }

    /// A machine with one GPU of `total_gib`, nearly all of it free.
    pub(crate) fn with_gpu(name: &str, total_gib: u64) -> Here {
        Here {
            host_memory_bytes: 128 * GIB,
            gpu: Some(crate::check::GpuHere {
                name: name.into(),
                total_memory_bytes: total_gib * GIB,
                free_memory_bytes: total_gib * GIB - GIB / 2,
                device_count: 1,
            }),
        }
    }

    #[test]
    fn estimates_are_compared_with_what_is_here() {
        assert_eq!(at_most("steps", 10, 10), Ok(()));
        assert_eq!(
            at_most("steps", 11, 10).unwrap_err(),
            "steps: 11 is above its bound of 10"
        );
        let e = fits_host("steps: 5", 30.0 * GIB as f64, &ci()).unwrap_err();
        assert_eq!(
            e,
            "steps: 5 needs ~30.0 GiB on cpu; this machine has 24.0 GiB"
        );
        assert!(fits_host("x", 20.0 * GIB as f64, &ci()).is_ok());
        // Unknown memory refuses nothing.
        assert!(fits_host("x", 1e30, &Here::default()).is_ok());
        let h100 = with_gpu("NVIDIA H100 80GB HBM3", 80);
        assert_eq!(gpu_shortfall("x", 79.0 * GIB as f64, &h100), None);
        assert_eq!(
            gpu_shortfall("x", 90.0 * GIB as f64, &h100).unwrap(),
            "x needs ~90.0 GiB, NVIDIA H100 80GB HBM3 has 79.5 GiB free"
        );
        assert_eq!(gpu_shortfall("x", 1e30, &ci()), None);
    }

    /// Every shipped trial fits its machine: the cpu ones a 24 GB CI machine,
    /// the cuda ones an H100 and an H200, where each is also judged.
    #[test]
    fn the_shipped_contracts_fit_ci_an_h100_and_an_h200() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("contracts");
        let contracts = crate::contract::load_dir(&dir).expect("the shipped contracts load");
        let mut two_h200 = with_gpu("NVIDIA H200", 141);
        if let Some(g) = two_h200.gpu.as_mut() {
            g.device_count = 2;
        }
        let gpus = [
            with_gpu("NVIDIA H100 80GB HBM3", 80),
            with_gpu("NVIDIA H200", 141),
            two_h200,
        ];
        for c in &contracts {
            for test in &c.falsification_tests {
                let (backend, check) = (c.backend_of(test), &test.check);
                let heres: Vec<Here> = match backend {
                    crate::check::Backend::Cpu => vec![ci()],
                    crate::check::Backend::Cuda => gpus.to_vec(),
                };
                for here in &heres {
                    let id = format!("{}::{} on {:?}", c.metadata.id, test.id, here.gpu);
                    assert_eq!(check.check_budget(backend, here), Ok(()), "{id}");
                    // A trial needing more GPUs than one is judged on the
                    // two-GPU host only.
                    let one_gpu = here.gpu.as_ref().is_some_and(|g| g.device_count < 2);
                    match check.unjudged_on(backend, here) {
                        Some(why) if one_gpu => {
                            assert!(why.starts_with("needs 2 GPUs"), "{id}: {why}")
                        }
                        why => assert_eq!(why, None, "{id}"),
                    }
                }
                assert!(check.default_timeout_s() >= 30.0, "{}", test.id);
            }
        }
    }
}
