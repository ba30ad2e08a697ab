//! Validated parameter types of qlora's kinds: the core's shared ones
//! (see [`falsify_core::check::params`]) and those that name the stack's
//! presets, step modes and hyper-parameters.

use serde::de::{self, Deserializer};
use serde::Deserialize;

use qlora::gpu::GemmMath;
use qlora::model::ModelConfig;
use qlora::train::GpuTrainOptions;

pub use falsify_core::check::params::*;
pub use qlora::train::{BaseWeights, ClipMode};

/// The name of a model preset, checked against [`qlora::model::PRESETS`].
#[derive(Debug, Clone, Copy, PartialEq)]
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

/// A bound per GPU kind, or one number for any GPU: the targets of the
/// timing kinds (`min_tokens_per_s: { H200: 41000, H100: 38000 }`,
/// `max_us: { H200: 30, H100: 30 }`). A GPU kind is a word of the device
/// name as the driver reports it, case aside: `H200` matches "NVIDIA H200"
/// but not "NVIDIA H20". A bound says nothing about hardware it does not
/// name, so on a GPU with none the trial is not judged
/// ([`GpuTargets::missing_on`]).
#[derive(Debug, Clone, PartialEq)]
pub enum GpuTargets {
    Any(Positive),
    /// `(kind, target)` in the contract's order; the first kind that matches
    /// the device holds.
    PerGpu(Vec<(String, Positive)>),
}

impl GpuTargets {
    /// The target for `device`, with the kind it was stated for.
    pub fn for_device(&self, device: &str) -> Option<(Option<&str>, f64)> {
        match self {
            GpuTargets::Any(t) => Some((None, t.0)),
            GpuTargets::PerGpu(list) => list
                .iter()
                .find(|(kind, _)| names_kind(device, kind))
                .map(|(kind, t)| (Some(kind.as_str()), t.0)),
        }
    }

    /// Why no target holds on `device` (a GPU name as the driver reports
    /// it), or `None` when one does.
    pub fn missing_on(&self, device: &str) -> Option<String> {
        self.for_device(device).is_none().then(|| {
            format!(
                "no target for {device} (targets are stated for {})",
                self.kinds()
            )
        })
    }

    /// The kinds with a target, for messages.
    fn kinds(&self) -> String {
        match self {
            GpuTargets::Any(_) => "any GPU".into(),
            GpuTargets::PerGpu(list) => {
                let kinds: Vec<&str> = list.iter().map(|(k, _)| k.as_str()).collect();
                kinds.join(", ")
            }
        }
    }
}

/// Whether `kind` is one of the words of `device`, case aside.
fn names_kind(device: &str, kind: &str) -> bool {
    device
        .split(|c: char| !c.is_ascii_alphanumeric())
        .any(|word| word.eq_ignore_ascii_case(kind))
}

/// Parses a number (any GPU) or a mapping of GPU kind to number; each value
/// is checked where it stands, so an error points at it.
impl<'de> Deserialize<'de> for GpuTargets {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_any(TargetsVisitor)
    }
}

struct TargetsVisitor;

impl TargetsVisitor {
    fn number<E: de::Error>(v: f64) -> std::result::Result<GpuTargets, E> {
        Positive::deserialize(de::value::F64Deserializer::<E>::new(v)).map(GpuTargets::Any)
    }
}

impl<'de> de::Visitor<'de> for TargetsVisitor {
    type Value = GpuTargets;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a number > 0, or a mapping of GPU kind to number, e.g. { H200: 41000 }")
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<GpuTargets, E> {
        Self::number(v)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<GpuTargets, E> {
        Self::number(v as f64)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<GpuTargets, E> {
        Self::number(v as f64)
    }

    fn visit_map<A: de::MapAccess<'de>>(
        self,
        mut map: A,
    ) -> std::result::Result<GpuTargets, A::Error> {
        let mut list: Vec<(String, Positive)> = Vec::new();
        while let Some(kind) = map.next_key::<String>()? {
            check_kind(&kind, &list).map_err(de::Error::custom)?;
            list.push((kind, map.next_value()?));
        }
        if list.is_empty() {
            return Err(de::Error::custom(
                "name at least one GPU kind, e.g. { H200: 41000 }",
            ));
        }
        Ok(GpuTargets::PerGpu(list))
    }
}

/// A GPU kind is one word of letters and digits, named once.
fn check_kind(kind: &str, seen: &[(String, Positive)]) -> std::result::Result<(), String> {
    if kind.is_empty() || !kind.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(format!(
            "GPU kind `{kind}` must be one word of letters and digits, e.g. H200"
        ));
    }
    if seen.iter().any(|(k, _)| k.eq_ignore_ascii_case(kind)) {
        return Err(format!("GPU kind `{kind}` is named twice"));
    }
    Ok(())
}

/// The contract spelling of [`qlora::train::BaseWeights`].
#[derive(Deserialize)]
#[serde(remote = "BaseWeights", rename_all = "snake_case")]
pub(crate) enum BaseWeightsDef {
    Fp32,
    Nf4,
    Bf16,
    Nf4Bf16,
}

/// The contract spelling of [`qlora::train::ClipMode`].
#[derive(Deserialize)]
#[serde(remote = "ClipMode", rename_all = "snake_case")]
enum ClipModeDef {
    Global,
    PerLayer,
}

/// A base format as a contract names it (`fp32`, `nf4`, `bf16` or `nf4_bf16`), for lists of them.
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
    use crate::check::Here;

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
    fn unknown_presets_are_refused() {
        let e = serde_yaml::from_str::<ModelName>("gpt-17").unwrap_err();
        assert!(
            e.to_string().contains("unknown model preset `gpt-17`"),
            "{e}"
        );
        assert!(serde_yaml::from_str::<ModelName>("tiny").is_ok());
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

    /// A host with `count` GPUs like `with_gpu`'s.
    fn with_gpus(name: &str, total_gib: u64, count: usize) -> Here {
        let mut here = with_gpu(name, total_gib);
        if let Some(g) = here.gpu.as_mut() {
            g.device_count = count;
        }
        here
    }

    /// Every shipped trial fits its machine: the cpu ones a 24 GB CI machine,
    /// the cuda ones an H100, an H200 and hosts of two and four, where each
    /// is also judged unless it needs more GPUs than the host has.
    #[test]
    fn the_shipped_contracts_fit_ci_an_h100_and_an_h200() {
        let contracts = crate::shipped_contracts();
        let gpus = [
            with_gpu("NVIDIA H100 80GB HBM3", 80),
            with_gpu("NVIDIA H200", 141),
            with_gpus("NVIDIA H200", 141, 2),
            with_gpus("NVIDIA H100 80GB HBM3", 80, 4),
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
                    // A trial is unjudged only for want of GPUs.
                    let count = here.gpu.as_ref().map_or(0, |g| g.device_count);
                    if let Some(why) = check.unjudged_on(backend, here) {
                        let needs = why
                            .strip_prefix("needs ")
                            .and_then(|w| w.split_once(" GPUs, this machine has "))
                            .and_then(|(k, n)| {
                                Some((k.parse::<usize>().ok()?, n.parse::<usize>().ok()?))
                            });
                        assert!(
                            matches!(needs, Some((k, n)) if k > n && n == count),
                            "{id}: {why}"
                        );
                    }
                }
                assert!(check.default_timeout_s() >= 30.0, "{}", test.id);
            }
        }
    }
}
