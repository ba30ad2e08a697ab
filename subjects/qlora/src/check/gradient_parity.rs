//! `gradient_parity`: the GPU training step's gradients of every trainable
//! tensor (LoRA A/B of q and v, both RMSNorm weights of every layer) against
//! the CPU reference's analytic f64 gradients, on one seeded batch and one
//! seeded parameter point away from the init.
//! Passes when `max_tensor ||g_gpu - g_ref|| / ||g_ref|| <= tolerance`.

use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::check::params::{fits_host, ClipMode};
use crate::check::training::{reference_bytes, trainer_bytes, trainer_shortfall};
use crate::check::MutantFaults;
use crate::check::{require_gpu, Comparator};
use crate::error::Result;
use crate::reference::train::{Model, BATCH_SALT, CORPUS_SALT};
use qlora::gpu::{GemmMath, GpuContext};
use qlora::model::{BaseModel, Corpus, ModelConfig, Trainable};
use qlora::train::{GpuTrainOptions, GpuTrainer, LossAndGrads};

use serde::Deserialize;

use super::doc::PRECISIONS;
use super::doc::{ParamDefault::*, ParamDoc, Piece::*, ANY_PRESET};

use super::params::{BackwardMath, BaseWeights, BaseWeightsDef, ModelName, NonNegative};
use super::params::{Positive, Precision};
use super::{Backend, Here, Kind, Measurement, TrialContext, Validate};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub model: ModelName,
    #[serde(default, with = "BaseWeightsDef")]
    pub base: BaseWeights,
    /// GEMM precision of the GPU forward pass: `f32` or `tf32`.
    #[serde(default)]
    pub precision: Precision,
    /// Math of the GPU backward's GEMMs (`tf32` also runs the LoRA weight
    /// gradients on the step's own TF32 kernels).
    #[serde(default)]
    pub backward_math: BackwardMath,
    /// Standard deviation of the LoRA `B` factors at the probed point (at
    /// `B = 0` the gradient of `A` is exactly zero and a relative error of it
    /// says nothing).
    #[serde(default = "default_b_std")]
    pub b_std: Positive,
    pub tolerance: NonNegative,
}

fn default_b_std() -> Positive {
    Positive(0.05)
}

/// The parameters of `gradient_parity`, for the generated reference.
pub const PARAMS: &[ParamDoc] = &[
    ParamDoc {
        name: "model",
        default: Required,
        bound: &[
            Text("a preset: "),
            ANY_PRESET,
            Text("; the CPU reference's forward and backward at most "),
            Real(MAX_REFERENCE_MACS),
            Text(" multiply-adds"),
        ],
        meaning: "the preset whose step is compared",
    },
    ParamDoc {
        name: "base",
        default: Yaml("fp32"),
        bound: &[OneOf(super::doc::BASES)],
        meaning: "the base-weight format",
    },
    ParamDoc {
        name: "precision",
        default: Yaml("f32"),
        bound: &[OneOf(PRECISIONS), Text("; only `f32` and `tf32` validate")],
        meaning: "GEMM precision of the GPU forward",
    },
    ParamDoc {
        name: "backward_math",
        default: Yaml("fp32"),
        bound: &[OneOf(&["fp32", "tf32"])],
        meaning: "math of the GPU backward's GEMMs",
    },
    ParamDoc {
        name: "b_std",
        default: Yaml("0.05"),
        bound: &[Text("> 0")],
        meaning: "standard deviation of the LoRA `B` factors at the probed point",
    },
    ParamDoc {
        name: "tolerance",
        default: Required,
        bound: &[Text(">= 0")],
        meaning: "bound on the largest rel-L2 error of a gradient",
    },
];

/// A minimal `gradient_parity` check.
pub const EXAMPLE: &[(&str, &str)] = &[("model", "tiny"), ("tolerance", "1e-5")];

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        match self.precision {
            Precision::F32 | Precision::Tf32 => Ok(()),
            other => Err(format!(
                "precision {other:?}: the training step's GEMMs run in f32 or tf32"
            )),
        }
    }
}

/// Passes when, for every trainable tensor, `||g_gpu - g_ref|| / ||g_ref||
/// <= tolerance`: one forward + backward of the GPU step and of the CPU
/// reference from the same base weights, the same trainable point
/// (`Trainable::perturbed`, so `B != 0`) and the same batch. The trial's
/// mutant goes into the GPU step only.
fn gradient_parity(p: &Params, cx: &mut TrialContext<'_>) -> Result<Measurement> {
    let cfg = p.model.0;
    let seed = cx.seed;
    let trainable = Trainable::perturbed(&cfg, seed, p.b_std.0);
    let corpus = Corpus::arithmetic(seed ^ CORPUS_SALT, qlora::model::corpus::DEFAULT_LEN);
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ BATCH_SALT);
    let tokens = corpus.batch(&mut rng, cfg.batch, cfg.seq_len)?;
    let model = Model {
        base: BaseModel::init(&cfg, p.base, seed)?,
        params: trainable.clone(),
    };
    let (ref_loss, ref_grads) = model.loss_and_grads(&tokens, cfg.batch, false)?;
    drop(model);
    let options = p.options();
    let faults = cx.faults();
    let mut scope = require_gpu(cx)?.with_faults(faults);
    let gpu: &mut GpuContext = &mut scope;
    let mut t = GpuTrainer::with_params(gpu, &cfg, options, seed, &trainable)?;
    let LossAndGrads { loss, grads, .. } = t.loss_and_grads(gpu, &tokens)?;
    let mut worst = 0.0f64;
    let mut worst_name = String::from("none");
    let mut nonfinite = 0usize;
    for (i, (g, r)) in grads.iter().zip(&ref_grads).enumerate() {
        nonfinite += g.iter().filter(|v| !v.is_finite()).count();
        let (mut d2, mut r2) = (0.0f64, 0.0f64);
        for (&a, &b) in g.iter().zip(r) {
            d2 += (f64::from(a) - b).powi(2);
            r2 += b * b;
        }
        let rel = if r2 > 0.0 {
            (d2 / r2).sqrt()
        } else if d2 == 0.0 {
            0.0
        } else {
            f64::INFINITY
        };
        if rel > worst || rel.is_nan() {
            worst = rel;
            worst_name = format!("{} (||g_ref|| {:.3e})", Trainable::name(i), r2.sqrt());
        }
    }
    let mut m = Measurement::new("max_tensor_rel_l2", worst, Comparator::Le, p.tolerance.0, "rel")
        .with_detail(format!(
            "model {} ({:?} base, {:?} forward GEMMs, {:?} backward GEMMs) on {}; {} tensors; loss gpu {loss:.6} vs reference {ref_loss:.6}; worst {worst_name}",
            cfg.name,
            p.base,
            p.precision,
            p.backward_math,
            gpu.facts().name,
            grads.len()
        ));
    if grads.len() != ref_grads.len() {
        m.violate(format!(
            "{} gradient tensors, the reference has {}",
            grads.len(),
            ref_grads.len()
        ));
    }
    if nonfinite > 0 {
        m.violate(format!("{nonfinite} non-finite gradient values"));
    }
    Ok(m)
}

/// Most multiply-adds of the host's f64 reference forward and backward
/// ([`reference_macs`]): small-4l takes 6e9 (1.5 s for the whole trial on an
/// H200's host); qwen2.5-0.5b would take 1.5e12, about an hour.
pub const MAX_REFERENCE_MACS: f64 = 3e10;

/// Multiply-adds of one forward and backward of the f64 reference on `cfg`,
/// the dominant GEMM terms: `3 T (n_base + V H)` (forward, and the input
/// gradients of the backward at twice that), with `T = batch x seq_len`.
pub fn reference_macs(cfg: &ModelConfig) -> f64 {
    let params =
        (cfg.layers * cfg.base_params_per_layer()) as f64 + (cfg.vocab * cfg.hidden) as f64;
    3.0 * cfg.tokens() as f64 * params
}

impl Params {
    /// The GPU step's options: one global clip, no graph, the contract's
    /// GEMM math in each direction.
    fn options(&self) -> GpuTrainOptions {
        GpuTrainOptions {
            clip: ClipMode::Global,
            base: self.base,
            hyper: qlora::train::Hyper::default(),
            graph: false,
            forward_math: Some(match self.precision {
                Precision::Tf32 => GemmMath::Tf32,
                _ => GemmMath::Fp32,
            }),
            backward_math: match self.backward_math {
                BackwardMath::Fp32 => None,
                BackwardMath::Tf32 => Some(GemmMath::Tf32),
            },
            keep_mlp: false,
            transposed_weights: false,
            f16_lm_head: false,
            f16_projections: false,
            device_quantize: false,
        }
    }
}

impl Kind<crate::Qlora> for Params {
    fn execute(&self, _backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        gradient_parity(self, cx)
    }

    /// The oracle runs on the host: its work ([`MAX_REFERENCE_MACS`]) and
    /// its memory (`reference_bytes`) against this machine.
    fn check_budget(&self, _backend: Backend, here: &Here) -> std::result::Result<(), String> {
        let cfg = self.model.0;
        let macs = reference_macs(&cfg);
        if macs > MAX_REFERENCE_MACS {
            return Err(format!(
                "model: {}: the CPU reference forward and backward need ~{macs:.1e} multiply-adds; the bound is {MAX_REFERENCE_MACS:.0e} (use `tiny` or `small-4l`)",
                cfg.name
            ));
        }
        fits_host(&format!("model: {}", cfg.name), reference_bytes(&cfg), here)
    }

    /// Whether the GPU trainer fits the GPU's free memory.
    fn unjudged_on(&self, backend: Backend, here: &Here) -> Option<String> {
        let cfg = self.model.0;
        let needed = trainer_bytes(&cfg, &self.options());
        trainer_shortfall(backend, &cfg, needed, here)
    }

    /// Many times this kind's longest trial (its `duration_ms` in the
    /// committed baselines; the parameter bounds keep a trial within it):
    /// a stuck trial is stopped, a slow machine is not.
    fn default_timeout_s(&self) -> f64 {
        120.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::params::tests::{ci, with_gpu};

    fn params(model: &str) -> Params {
        serde_yaml::from_str(&format!("model: {model}\ntolerance: 1.0e-5")).unwrap()
    }

    #[test]
    fn the_host_reference_bounds_the_model() {
        for model in ["tiny", "small-4l"] {
            assert_eq!(
                params(model).check_budget(Backend::Cuda, &ci()),
                Ok(()),
                "{model}"
            );
        }
        let e = params("qwen2.5-0.5b")
            .check_budget(Backend::Cuda, &ci())
            .unwrap_err();
        assert!(
            e.starts_with(
                "model: qwen2.5-0.5b: the CPU reference forward and backward need ~1.5e12"
            ),
            "{e}"
        );
    }

    #[test]
    fn the_gpu_trainer_must_fit() {
        let p = params("small-4l");
        let mut here = with_gpu("NVIDIA H100 80GB HBM3", 80);
        assert_eq!(p.unjudged_on(Backend::Cuda, &here), None);
        here.gpu.as_mut().unwrap().free_memory_bytes = 1 << 20;
        let why = p.unjudged_on(Backend::Cuda, &here).unwrap();
        assert!(
            why.starts_with("model small-4l (batch 4, seq 128) needs ~"),
            "{why}"
        );
    }
}
