//! `hf_parity`: the CPU oracle on a Hugging Face checkpoint against the
//! outputs transformers and PEFT computed on it.
//!
//! A fixture under `fixtures/<name>/` (made by
//! `scripts/make-qwen2-fixture.py`) holds the checkpoint (`config.json`,
//! `model.safetensors`), token ids `ids [batch, seq + 1]` in
//! `reference.json`, and in `reference.safetensors` transformers' `logits`
//! and `loss` of the base model on `ids` and, with a PEFT LoRA at a stored
//! start (`layers.{i}.{q,v}_proj.lora_{A,B}`), the loss's gradient of every
//! factor (`... .grad`). The oracle loads the checkpoint with the stack's
//! loader and computes the same quantity in f64:
//!
//! - `logits`: `||z - z_ref|| / ||z_ref||` over all `batch x seq x vocab` logits;
//! - `loss`: `|L - L_ref| / |L_ref|`;
//! - `lora_gradients`: `max_f ||g_f - g_ref,f|| / ||g_ref,f||` over the LoRA
//!   factors `f` (A and B of q and v in every layer), the oracle at PEFT's
//!   start with PEFT's scale `alpha / r`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::doc::{ParamDefault::*, ParamDoc, Piece::*};
use super::params::NonNegative;
use super::{Backend, Comparator, Kind, Measurement, TrialContext, Validate};
use crate::error::{Error, Result};
use crate::mutant::checkpoint as faulty;
use crate::reference::train::Model;
use qlora::model::checkpoint::{read_tensors, HostTensor};
use qlora::model::{Checkpoint, Slot, Trainable};
use qlora::train::BaseWeights;

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
        let ok = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
        if self.fixture.is_empty() || self.fixture.starts_with('.') || !self.fixture.chars().all(ok)
        {
            return Err(format!(
                "fixture `{}`: a folder name under fixtures/",
                self.fixture
            ));
        }
        Ok(())
    }
}

/// The folder of fixture `name` in this repository.
fn fixture_dir(name: &str) -> PathBuf {
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

/// A fixture's reference: its token ids (row-major) and batch, LoRA rank
/// and scale, and tensors.
struct Reference {
    tokens: Vec<u32>,
    batch: usize,
    lora: LoraMeta,
    tensors: HashMap<String, HostTensor>,
}

impl Reference {
    fn read(dir: &Path) -> Result<Reference> {
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

/// The oracle at PEFT's start: the checkpoint's norms, PEFT's A and B and scale.
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

/// The worst rel-L2 over the LoRA factors' gradients, and which factor.
fn lora_gradients(ckpt: Checkpoint, r: &Reference, seed: u64) -> Result<(f64, String)> {
    let model = lora_model(ckpt, r, seed)?;
    let (_, grads) = model.loss_and_grads(&r.tokens, r.batch, false)?;
    let mut worst = (f64::NEG_INFINITY, String::new());
    for layer in 0..model.base.config.layers {
        for (name, slot) in FACTORS {
            let name = format!("layers.{layer}.{name}");
            let want = r.tensor(&format!("{name}.grad"))?;
            let err = rel_l2(&name, &grads[Trainable::index(layer, slot)], want)?;
            if err > worst.0 || err.is_nan() {
                worst = (err, name);
            }
        }
    }
    Ok(worst)
}

/// The compared quantity's relative error and the metric's name.
fn measure(
    p: &Params,
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
            let z = base_model(ckpt).logits(&r.tokens, r.batch)?;
            let err = rel_l2("logits", &z, r.tensor("logits")?)?;
            (err, "logits_rel_l2", format!("{} logits", z.len()))
        }
        Quantity::Loss => {
            let loss = base_model(ckpt).loss(&r.tokens, r.batch)?;
            let want = r.tensor("loss")?.first().copied().unwrap_or(f64::NAN);
            let err = ((loss - want) / want).abs();
            (
                err,
                "loss_rel_error",
                format!("loss {loss:.7} vs transformers' {want:.7}"),
            )
        }
        Quantity::LoraGradients => {
            let (err, worst) = lora_gradients(ckpt, r, seed)?;
            (err, "lora_grad_max_rel_l2", format!("worst factor {worst}"))
        }
    })
}

fn hf_parity(p: &Params, cx: &mut TrialContext<'_>) -> Result<Measurement> {
    let dir = fixture_dir(&p.fixture);
    let mut ckpt = Checkpoint::load(&dir, BaseWeights::Fp32)?;
    faulty::apply(cx.mutant, &mut ckpt, cx.seed);
    let r = Reference::read(&dir)?;
    let cfg = ckpt.base.config;
    let (err, metric, what) = measure(p, ckpt, &r, cx.seed)?;
    Ok(
        Measurement::new(metric, err, Comparator::Le, p.tolerance.0, "ratio").with_detail(format!(
            "fixture {}: {what}; {} tokens, {} layers, rope_theta {}, rms_eps {}, bias {}, tied {}",
            p.fixture,
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
    fn execute(&self, _backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        hf_parity(self, cx)
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
