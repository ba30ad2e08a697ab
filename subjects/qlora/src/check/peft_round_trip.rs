//! `peft_round_trip`: the adapter the stack writes is the model it trained.
//!
//! The GPU step trains the LoRA factors and norm weights of a Hugging Face
//! fixture (`fixtures/<name>/`, see [`super::hf_parity`]) for `steps` steps
//! on the fixture's tokens, with plain f32 GEMMs, then writes them as a PEFT
//! adapter ([`qlora::model::adapter::save_adapter`]) and its own logits on
//! the tokens beside it. `scripts/check-peft-adapter.py --against` loads
//! the adapter with `PeftModel.from_pretrained` onto the fixture checkpoint
//! and computes PEFT's logits `z_peft` on the same tokens. Passes when
//! `||z_peft - z|| / ||z|| <= tolerance`. Needs python3 with torch,
//! transformers, PEFT and safetensors; without them the trial is skipped
//! (found out when it runs, so that listing the trials starts no Python).

use std::path::Path;
use std::process::Command;

use serde::Deserialize;

use super::doc::{ParamDefault::*, ParamDoc, Piece::*};
use super::hf_parity::{f32_options, fixture_dir, fixture_trainer, valid_fixture, Reference};
use super::params::NonNegative;
use super::python::{last_json_line, repo_root, require_python};
use super::{require_gpu, Backend, Comparator, Kind, Measurement, TrialContext, Validate};
use crate::error::{Error, Result};
use crate::mutant::Mutant;
use crate::reference::train::Model;
use qlora::model::adapter::save_adapter;
use qlora::model::Checkpoint;
use qlora::train::{BaseWeights, GpuTrainOptions, Hyper};

/// Where the checking script lives, relative to the repository root.
const SCRIPT: &str = "scripts/check-peft-adapter.py";

/// What the script imports.
const PACKAGES: &[&str] = &["torch", "transformers", "peft", "safetensors"];

/// Most training steps a trial takes.
const MAX_STEPS: usize = 100;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// A folder under `fixtures/`.
    pub fixture: String,
    /// Training steps before the adapter is written.
    #[serde(default = "default_steps")]
    pub steps: usize,
    pub tolerance: NonNegative,
}

fn default_steps() -> usize {
    3
}

/// The parameters of `peft_round_trip`, for the generated reference.
pub const PARAMS: &[ParamDoc] = &[
    ParamDoc {
        name: "fixture",
        default: Required,
        bound: &[Text(
            "a folder under `fixtures/` (letters, digits, `-`, `_`, `.`)",
        )],
        meaning: "the checkpoint trained and loaded by PEFT",
    },
    ParamDoc {
        name: "steps",
        default: Yaml("3"),
        bound: &[Text("1 to "), Int(MAX_STEPS)],
        meaning: "training steps on the fixture's tokens before the adapter is written",
    },
    ParamDoc {
        name: "tolerance",
        default: Required,
        bound: &[Text(">= 0")],
        meaning: "bound on the rel-L2 of PEFT's logits against the stack's",
    },
];

/// A minimal `peft_round_trip` check.
pub const EXAMPLE: &[(&str, &str)] = &[("fixture", "qwen2-tiny"), ("tolerance", "1e-5")];

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        valid_fixture(&self.fixture)?;
        if !(1..=MAX_STEPS).contains(&self.steps) {
            return Err(format!("steps {}: 1 to {MAX_STEPS}", self.steps));
        }
        Ok(())
    }
}

/// Trains the fixture on the GPU, writes the adapter and the stack's logits
/// into `out`, and returns the losses of the first and last step.
fn train_and_save(
    gpu: &mut qlora::gpu::GpuContext,
    p: &Params,
    (dir, out): (&Path, &Path),
    (seed, mutant): (u64, Option<Mutant>),
) -> Result<(f64, f64)> {
    let ckpt = Checkpoint::load(dir, BaseWeights::Fp32)?;
    let r = Reference::read(dir)?;
    // A larger step than the default moves the factors and norms far
    // enough from the checkpoint that a lost or mis-scaled tensor shows.
    let options = GpuTrainOptions {
        hyper: Hyper {
            lr: 1e-2,
            ..Hyper::default()
        },
        ..f32_options()
    };
    let model = Model {
        params: ckpt.trainable(seed),
        base: ckpt.base,
    };
    let mut t = fixture_trainer(gpu, model, &r, (options, seed))?;
    let mut losses = Vec::with_capacity(p.steps);
    for _ in 0..p.steps {
        losses.push(t.step_on(gpu, &r.tokens)?.loss);
    }
    let logits = t.logits(gpu, &r.tokens)?;
    let mut trained = t.trainable(gpu)?;
    if mutant == Some(Mutant::AdapterAlphaAsRank) {
        trained.scale = 1.0;
    }
    save_adapter(&out.join("adapter"), &trained, &dir.display().to_string())?;
    write_logits(
        &out.join("logits.safetensors"),
        &logits,
        [r.batch, r.seq_len(), t.config().vocab],
    )?;
    let first = losses.first().copied().unwrap_or(f64::NAN);
    Ok((first, losses.last().copied().unwrap_or(f64::NAN)))
}

/// Writes `logits` (`[batch, seq, vocab]`, f32) as tensor `logits` of a safetensors file.
fn write_logits(path: &Path, logits: &[f32], shape: [usize; 3]) -> Result<()> {
    let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
    let fail = |e: &dyn std::fmt::Display| Error::InvalidArgument {
        op: "peft_round_trip",
        message: format!("{}: {e}", path.display()),
    };
    let view = safetensors::tensor::TensorView::new(
        safetensors::tensor::Dtype::F32,
        shape.to_vec(),
        &bytes,
    )
    .map_err(|e| fail(&e))?;
    let data = safetensors::serialize([("logits", view)], None).map_err(|e| fail(&e))?;
    std::fs::write(path, data).map_err(|e| Error::io(path, e))
}

/// What the script prints as its last line.
#[derive(Debug, Deserialize)]
struct ScriptResult {
    logits_rel_l2: f64,
    versions: String,
}

/// Runs the script on `out`'s adapter and logits for fixture `dir`.
fn peft_logits_error(dir: &Path, out: &Path) -> Result<ScriptResult> {
    let output = Command::new("python3")
        .arg(repo_root().join(SCRIPT))
        .arg("--against")
        .arg(out.join("logits.safetensors"))
        .arg(out.join("adapter"))
        .arg(dir)
        .output()
        .map_err(|e| Error::io(Path::new("python3"), e))?;
    last_json_line("peft_round_trip", SCRIPT, &output)
}

fn peft_round_trip(p: &Params, cx: &mut TrialContext<'_>) -> Result<Measurement> {
    require_python(PACKAGES, "needed to run PEFT")?;
    let dir = fixture_dir(&p.fixture);
    let out = tempfile::tempdir().map_err(|e| Error::io(std::env::temp_dir(), e))?;
    let (seed, mutant) = (cx.seed, cx.mutant);
    let gpu = require_gpu(cx)?;
    let (first, last) = train_and_save(gpu, p, (&dir, out.path()), (seed, mutant))?;
    let name = gpu.facts().name.clone();
    let result = peft_logits_error(&dir, out.path())?;
    let detail = format!(
        "fixture {} trained {} steps on {name} (loss {first:.5} -> {last:.5}); PEFT ({}) loaded the adapter",
        p.fixture, p.steps, result.versions
    );
    let m = Measurement::new(
        "logits_rel_l2",
        result.logits_rel_l2,
        Comparator::Le,
        p.tolerance.0,
        "ratio",
    );
    Ok(m.with_detail(detail))
}

impl Kind<crate::Qlora> for Params {
    fn execute(&self, _backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        peft_round_trip(self, cx)
    }
}
