//! `gradient_parity`: the GPU training step's gradients of every trainable
//! tensor (LoRA A/B of q and v, both RMSNorm weights of every layer) against
//! the CPU reference's analytic f64 gradients, on one seeded batch and one
//! seeded parameter point away from the init.
//! Passes when `max_tensor ||g_gpu - g_ref|| / ||g_ref|| <= tolerance`.

use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::check::params::ClipMode;
use crate::check::{require_gpu, Comparator};
use crate::error::Result;
use crate::reference::train::{Model, BATCH_SALT, CORPUS_SALT};
use qlora::gpu::{GemmMath, GpuContext};
use qlora::model::{BaseModel, Corpus, Trainable};
use qlora::train::{GpuTrainOptions, GpuTrainer};

use serde::Deserialize;

use super::params::{BaseWeights, BaseWeightsDef, ModelName, NonNegative, Positive, Precision};
use super::{Backend, Kind, Measurement, TrialContext, Validate};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub model: ModelName,
    #[serde(default, with = "BaseWeightsDef")]
    pub base: BaseWeights,
    /// GEMM precision of the GPU forward pass: `f32` or `tf32` (the backward
    /// GEMMs run as the context's options say).
    #[serde(default)]
    pub precision: Precision,
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
    let options = GpuTrainOptions {
        clip: ClipMode::Global,
        base: p.base,
        hyper: qlora::train::Hyper::default(),
        graph: false,
        forward_math: Some(match p.precision {
            Precision::Tf32 => GemmMath::Tf32,
            _ => GemmMath::Fp32,
        }),
        backward_math: None,
        keep_mlp: false,
        device_quantize: false,
    };
    let faults = cx.faults();
    let mut scope = require_gpu(cx)?.with_faults(faults);
    let gpu: &mut GpuContext = &mut scope;
    let mut t = GpuTrainer::with_params(gpu, &cfg, options, seed, &trainable)?;
    let (loss, grads) = t.loss_and_grads(gpu, &tokens)?;
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
            "model {} ({:?} base, {:?} forward GEMMs) on {}; {} tensors; loss gpu {loss:.6} vs reference {ref_loss:.6}; worst {worst_name}",
            cfg.name,
            p.base,
            p.precision,
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

impl Kind for Params {
    fn execute(&self, _backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        gradient_parity(self, cx)
    }
}
