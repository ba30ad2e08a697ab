//! `hf_parity`: the stack on a Hugging Face checkpoint against the outputs
//! transformers and PEFT computed on it, on either backend: the CPU oracle
//! (f64) or the GPU training step (f32, plain f32 GEMMs), both fed by the
//! stack's checkpoint loader.
//!
//! A fixture under `fixtures/<name>/` (made by
//! `scripts/make-qwen2-fixture.py`) holds the checkpoint (`config.json`,
//! `model.safetensors`), token ids `ids [batch, seq + 1]` in
//! `reference.json`, and in `reference.safetensors` transformers' `logits`
//! and `loss` of the base model on `ids` and, with a PEFT LoRA at a stored
//! start (`layers.{i}.{q,v}_proj.lora_{A,B}`), the loss's gradient of every
//! factor (`... .grad`). The backend computes the same quantity:
//!
//! - `logits`: `||z - z_ref|| / ||z_ref||` over all `batch x seq x vocab` logits;
//! - `loss`: `|L - L_ref| / |L_ref|`;
//! - `lora_gradients`: `max_f ||g_f - g_ref,f|| / ||g_ref,f||` over the LoRA
//!   factors `f` (A and B of q and v in every layer), at PEFT's start with
//!   PEFT's scale `alpha / r`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::doc::{ParamDefault::*, ParamDoc, Piece::*};
use super::params::NonNegative;
use super::{require_gpu, Backend, Comparator, Kind, Measurement, TrialContext, Validate};
use crate::error::{Error, Result};
use crate::mutant::checkpoint as faulty;
use crate::reference::train::Model;
use qlora::gpu::{GemmMath, GpuContext};
use qlora::model::checkpoint::{read_tensors, HostTensor};
use qlora::model::{BaseModel, Checkpoint, Slot, Trainable};
use qlora::train::{BaseWeights, GpuTrainOptions, GpuTrainer};

/// What is compared with the reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Quantity {
    Logits,
    Loss,
    LoraGradients,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// A folder under `fixtures/`.
    pub fixture: String,
    pub quantity: Quantity,
    pub tolerance: NonNegative,
}

/// The parameters of `hf_parity`, for the generated reference.
pub const PARAMS: &[ParamDoc] = &[
    ParamDoc {
        name: "fixture",
        default: Required,
        bound: &[Text("a folder under `fixtures/` (letters, digits, `-`, `_`, `.`)")],
        meaning: "the checkpoint and reference outputs compared",
    },
    ParamDoc {
        name: "quantity",
        default: Required,
        bound: &[OneOf(&["logits", "loss", "lora_gradients"])],
        meaning: "what is compared: rel-L2 of the logits, rel error of the loss, worst rel-L2 over the LoRA factors' gradients",
    },
    ParamDoc {
        name: "tolerance",
        default: Required,
        bound: &[Text(">= 0")],
        meaning: "bound on the relative error",
    },
];

/// A minimal `hf_parity` check.
pub const EXAMPLE: &[(&str, &str)] = &[
    ("fixture", "qwen2-tiny"),
    ("quantity", "logits"),
    ("tolerance", "1e-5"),
];

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        valid_fixture(&self.fixture)
    }
}

/// An error unless `name` is a plain folder name, so that a fixture stays under `fixtures/`.
pub(crate) fn valid_fixture(name: &str) -> std::result::Result<(), String> {
    let ok = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
    if name.is_empty() || name.starts_with('.') || !name.chars().all(ok) {
        return Err(format!("fixture `{name}`: a folder name under fixtures/"));
    }
    Ok(())
}

/// The folder of fixture `name` in this repository.
pub(crate) fn fixture_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(name)
}

/// What `reference.json` holds that the check needs.
#[derive(Debug, Deserialize)]
struct ReferenceMeta {
    input_ids: Vec<Vec<u32>>,
    lora: LoraMeta,
}

#[derive(Debug, Deserialize)]
struct LoraMeta {
    r: usize,
    scale: f64,
}

/// A fixture's reference: its token ids (row-major, `[batch, seq + 1]`)
/// and batch, LoRA rank and scale, and tensors.
pub(crate) struct Reference {
    pub tokens: Vec<u32>,
    pub batch: usize,
    lora: LoraMeta,
    tensors: HashMap<String, HostTensor>,
}

impl Reference {
    /// Positions of each row that predict a next token (`seq`).
    pub fn seq_len(&self) -> usize {
        (self.tokens.len() / self.batch.max(1)).saturating_sub(1)
    }

    pub fn read(dir: &Path) -> Result<Reference> {
        let path = dir.join("reference.json");
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let meta: ReferenceMeta = serde_json::from_str(&text).map_err(|e| invalid(&path, e))?;
        Ok(Reference {
            batch: meta.input_ids.len(),
            tokens: meta.input_ids.concat(),
            lora: meta.lora,
            tensors: read_tensors(&dir.join("reference.safetensors"))?,
        })
    }

    fn tensor(&self, name: &str) -> Result<&[f64]> {
        self.tensors
            .get(name)
            .map(|t| t.values.as_slice())
            .ok_or_else(|| Error::InvalidArgument {
                op: "hf_parity",
                message: format!("reference.safetensors has no tensor {name}"),
            })
    }
}

fn invalid(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::InvalidArgument {
        op: "hf_parity",
        message: format!("{}: {e}", path.display()),
    }
}

/// `||a - b|| / ||b||`, or an error where the lengths differ.
fn rel_l2(what: &str, a: &[f64], b: &[f64]) -> Result<f64> {
    if a.len() != b.len() {
        return Err(Error::ShapeMismatch {
            op: "hf_parity",
            expected: format!("{} values of {what}", b.len()),
            got: format!("{}", a.len()),
        });
    }
    let diff: f64 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum();
    let norm: f64 = b.iter().map(|y| y * y).sum();
    Ok((diff / norm).sqrt())
}

/// The LoRA factors PEFT names, with their slot in [`Trainable`].
const FACTORS: [(&str, Slot); 4] = [
    ("q_proj.lora_A", Slot::QA),
    ("q_proj.lora_B", Slot::QB),
    ("v_proj.lora_A", Slot::VA),
    ("v_proj.lora_B", Slot::VB),
];

/// The model at PEFT's start: the checkpoint's norms, PEFT's A and B and scale.
fn lora_model(ckpt: Checkpoint, r: &Reference, seed: u64) -> Result<Model> {
    let ckpt = ckpt.with_lora_rank(r.lora.r);
    let mut params = ckpt.trainable(seed);
    params.scale = r.lora.scale;
    for layer in 0..ckpt.base.config.layers {
        for (name, slot) in FACTORS {
            let t = r.tensor(&format!("layers.{layer}.{name}"))?;
            params.tensors[Trainable::index(layer, slot)] = t.to_vec();
        }
    }
    Ok(Model {
        base: ckpt.base,
        params,
    })
}

/// What a backend computes on the fixture's tokens: the logits and loss of
/// the model, and its loss's gradient of every trainable tensor.
trait Evaluator {
    fn logits(&mut self, m: Model, r: &Reference) -> Result<Vec<f64>>;
    fn loss(&mut self, m: Model, r: &Reference) -> Result<f64>;
    fn grads(&mut self, m: Model, r: &Reference) -> Result<Vec<Vec<f64>>>;
}

/// The CPU oracle, in f64.
struct Oracle;

impl Evaluator for Oracle {
    fn logits(&mut self, m: Model, r: &Reference) -> Result<Vec<f64>> {
        m.logits(&r.tokens, r.batch)
    }
    fn loss(&mut self, m: Model, r: &Reference) -> Result<f64> {
        m.loss(&r.tokens, r.batch)
    }
    fn grads(&mut self, m: Model, r: &Reference) -> Result<Vec<Vec<f64>>> {
        Ok(m.loss_and_grads(&r.tokens, r.batch, false)?.1)
    }
}

/// The GPU training step, its GEMMs in plain f32.
struct Gpu<'a> {
    gpu: &'a mut GpuContext,
    seed: u64,
}

impl Gpu<'_> {
    /// A trainer of `m` at the fixture's batch and sequence length.
    fn trainer(&mut self, m: Model, r: &Reference) -> Result<GpuTrainer> {
        fixture_trainer(self.gpu, m, r, (f32_options(), self.seed))
    }
}

/// A GPU trainer of `m` with `options` at the fixture's batch and sequence
/// length (a loaded checkpoint starts at the loader's), batches ordered by `seed`.
pub(crate) fn fixture_trainer(
    gpu: &mut GpuContext,
    m: Model,
    r: &Reference,
    (options, seed): (GpuTrainOptions, u64),
) -> Result<GpuTrainer> {
    let config = m.base.config.with_batch(r.batch).with_seq_len(r.seq_len());
    let base = BaseModel { config, ..m.base };
    let params = Trainable { config, ..m.params };
    Ok(GpuTrainer::from_model(gpu, &base, options, seed, &params)?)
}

/// The step's options for parity: eager, one global clip, an fp32 base and
/// plain f32 GEMMs both ways (TF32 would round the operands to 11 bits).
pub(crate) fn f32_options() -> GpuTrainOptions {
    GpuTrainOptions {
        base: BaseWeights::Fp32,
        forward_math: Some(GemmMath::Fp32),
        backward_math: Some(GemmMath::Fp32),
        ..GpuTrainOptions::default()
    }
}

impl Evaluator for Gpu<'_> {
    fn logits(&mut self, m: Model, r: &Reference) -> Result<Vec<f64>> {
        let mut t = self.trainer(m, r)?;
        let z = t.logits(self.gpu, &r.tokens)?;
        Ok(z.into_iter().map(f64::from).collect())
    }
    fn loss(&mut self, m: Model, r: &Reference) -> Result<f64> {
        let mut t = self.trainer(m, r)?;
        Ok(t.loss(self.gpu, &r.tokens)?)
    }
    fn grads(&mut self, m: Model, r: &Reference) -> Result<Vec<Vec<f64>>> {
        let mut t = self.trainer(m, r)?;
        let grads = t.loss_and_grads(self.gpu, &r.tokens)?.grads;
        Ok(grads
            .into_iter()
            .map(|g| g.into_iter().map(f64::from).collect())
            .collect())
    }
}

/// The worst rel-L2 over the LoRA factors' gradients, and which factor.
fn lora_gradients(grads: &[Vec<f64>], layers: usize, r: &Reference) -> Result<(f64, String)> {
    let mut worst = (f64::NEG_INFINITY, String::new());
    for layer in 0..layers {
        for (name, slot) in FACTORS {
            let name = format!("layers.{layer}.{name}");
            let want = r.tensor(&format!("{name}.grad"))?;
            let got = grads
                .get(Trainable::index(layer, slot))
                .map_or(&[][..], |g| &g[..]);
            let err = rel_l2(&name, got, want)?;
            if err > worst.0 || err.is_nan() {
                worst = (err, name);
            }
        }
    }
    Ok(worst)
}

/// The compared quantity's relative error, the metric's name and what was compared.
fn measure(
    p: &Params,
    evaluator: &mut dyn Evaluator,
    ckpt: Checkpoint,
    r: &Reference,
    seed: u64,
) -> Result<(f64, &'static str, String)> {
    let base_model = |ckpt: Checkpoint| Model {
        params: ckpt.trainable(seed),
        base: ckpt.base,
    };
    Ok(match p.quantity {
        Quantity::Logits => {
            let z = evaluator.logits(base_model(ckpt), r)?;
            let err = rel_l2("logits", &z, r.tensor("logits")?)?;
            (err, "logits_rel_l2", format!("{} logits", z.len()))
        }
        Quantity::Loss => {
            let loss = evaluator.loss(base_model(ckpt), r)?;
            let want = r.tensor("loss")?.first().copied().unwrap_or(f64::NAN);
            let err = ((loss - want) / want).abs();
            (
                err,
                "loss_rel_error",
                format!("loss {loss:.7} vs transformers' {want:.7}"),
            )
        }
        Quantity::LoraGradients => {
            let layers = ckpt.base.config.layers;
            let grads = evaluator.grads(lora_model(ckpt, r, seed)?, r)?;
            let (err, worst) = lora_gradients(&grads, layers, r)?;
            (err, "lora_grad_max_rel_l2", format!("worst factor {worst}"))
        }
    })
}

fn hf_parity(p: &Params, on: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
    let dir = fixture_dir(&p.fixture);
    let mut ckpt = Checkpoint::load(&dir, BaseWeights::Fp32)?;
    faulty::apply(cx.mutant, &mut ckpt, cx.seed);
    let r = Reference::read(&dir)?;
    let cfg = ckpt.base.config;
    let seed = cx.seed;
    let (err, metric, what) = match on {
        Backend::Cpu => measure(p, &mut Oracle, ckpt, &r, seed)?,
        Backend::Cuda => {
            let gpu = require_gpu(cx)?;
            measure(p, &mut Gpu { gpu, seed }, ckpt, &r, seed)?
        }
    };
    Ok(
        Measurement::new(metric, err, Comparator::Le, p.tolerance.0, "ratio").with_detail(format!(
            "fixture {} on {}: {what}; {} tokens, {} layers, rope_theta {}, rms_eps {}, bias {}, tied {}",
            p.fixture,
            on.as_str(),
            r.tokens.len(),
            cfg.layers,
            cfg.rope_theta,
            cfg.rms_eps,
            cfg.qkv_bias,
            cfg.tied_embeddings
        )),
    )
}

impl Kind<crate::Qlora> for Params {
    fn execute(&self, backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        hf_parity(self, backend, cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(yaml: &str) -> std::result::Result<Params, String> {
        crate::check::params::tests::parse(yaml)
    }

    #[test]
    fn fixture_names_stay_under_fixtures() {
        let ok = "fixture: qwen2-tiny\nquantity: loss\ntolerance: 1.0e-5\n";
        assert!(params(ok).is_ok());
        for bad in ["../x", ".hidden", "a/b", ""] {
            let yaml = format!("fixture: '{bad}'\nquantity: loss\ntolerance: 1.0e-5\n");
            assert!(params(&yaml).unwrap_err().contains("fixture"), "{bad}");
        }
        assert!(params("fixture: x\nquantity: weights\ntolerance: 1\n").is_err());
    }

    #[test]
    fn rel_l2_is_relative_to_the_reference() {
        assert_eq!(rel_l2("x", &[3.0, 5.0], &[0.0, 5.0]).unwrap(), 0.6);
        assert!(rel_l2("x", &[1.0], &[1.0, 2.0]).is_err());
    }
}
