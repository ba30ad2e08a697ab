//! Writing the trained LoRA factors as a PEFT adapter: `adapter_config.json`
//! and `adapter_model.safetensors`, which `PeftModel.from_pretrained` loads
//! onto the base checkpoint.
//!
//! PEFT's tensor names are
//! `base_model.model.model.layers.{i}.self_attn.{q,v}_proj.lora_{A,B}.weight`,
//! A `[r, in]` and B `[out, r]` in f32: the layout of [`Trainable`]. The
//! configuration says `r`, `lora_alpha = s r` (so PEFT's scale `alpha / r`
//! is the trainer's `s`), the target modules and no dropout or bias.
//!
//! This stack also trains both RMSNorm weights of every layer. PEFT carries
//! whole trained modules as `modules_to_save`: the configuration lists
//! `input_layernorm` and `post_attention_layernorm`, and their weights are
//! written as `base_model.model.model.layers.{i}.{module}.weight`, so the
//! adapter PEFT loads is the model that was trained.

use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};

use super::{Slot, Trainable};
use crate::error::{Error, Result};

/// The adapter's configuration file.
pub const ADAPTER_CONFIG_FILE: &str = "adapter_config.json";
/// The adapter's weights.
pub const ADAPTER_WEIGHTS_FILE: &str = "adapter_model.safetensors";

/// PEFT's names of the LoRA factors, with their slot in [`Trainable`].
const FACTORS: [(&str, Slot); 4] = [
    ("q_proj.lora_A", Slot::QA),
    ("q_proj.lora_B", Slot::QB),
    ("v_proj.lora_A", Slot::VA),
    ("v_proj.lora_B", Slot::VB),
];

/// The trained norms, under Hugging Face's module names, with their slot.
const NORMS: [(&str, Slot); 2] = [
    ("input_layernorm", Slot::AttnNorm),
    ("post_attention_layernorm", Slot::MlpNorm),
];

/// PEFT's name of factor `factor` (e.g. `q_proj.lora_A`) of layer `layer`.
pub fn peft_name(layer: usize, factor: &str) -> String {
    format!("base_model.model.model.layers.{layer}.self_attn.{factor}.weight")
}

/// PEFT's name of the saved module `module` (e.g. `input_layernorm`) of layer `layer`.
pub fn peft_module_name(layer: usize, module: &str) -> String {
    format!("base_model.model.model.layers.{layer}.{module}.weight")
}

fn write_error(path: &Path, message: impl std::fmt::Display) -> Error {
    Error::Checkpoint {
        path: path.to_path_buf(),
        message: format!("cannot write: {message}"),
    }
}

/// `adapter_config.json` for `t`: PEFT's LoRA configuration fields, with
/// `base_model` as `base_model_name_or_path`.
fn adapter_config(t: &Trainable, base_model: &str) -> serde_json::Value {
    let r = t.config.lora_rank;
    serde_json::json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": r,
        "lora_alpha": t.scale * r as f64,
        "target_modules": ["q_proj", "v_proj"],
        "lora_dropout": 0.0,
        "bias": "none",
        "modules_to_save": NORMS.map(|(module, _)| module),
        "fan_in_fan_out": false,
        "inference_mode": true,
        "init_lora_weights": true,
        "use_rslora": false,
        "use_dora": false,
    })
}

/// Writes the LoRA factors and trained norms of `t` into `dir` (created if
/// missing) as a PEFT adapter for the checkpoint `base_model`.
pub fn save_adapter(dir: &Path, t: &Trainable, base_model: &str) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| write_error(dir, e))?;
    let f32_bytes = |(layer, slot)| -> Vec<u8> {
        t.get(layer, slot)
            .iter()
            .flat_map(|&v| (v as f32).to_le_bytes())
            .collect()
    };
    let per_layer = FACTORS.len() + NORMS.len();
    let mut tensors = Vec::with_capacity(t.config.layers * per_layer);
    for layer in 0..t.config.layers {
        for (factor, slot) in FACTORS {
            let (rows, cols) = slot.shape(&t.config);
            let name = peft_name(layer, factor);
            tensors.push((name, vec![rows, cols], f32_bytes((layer, slot))));
        }
        for (module, slot) in NORMS {
            let name = peft_module_name(layer, module);
            tensors.push((name, vec![t.config.hidden], f32_bytes((layer, slot))));
        }
    }
    let weights = dir.join(ADAPTER_WEIGHTS_FILE);
    let views = tensors
        .iter()
        .map(|(n, shape, b)| Ok((n.as_str(), TensorView::new(Dtype::F32, shape.clone(), b)?)))
        .collect::<std::result::Result<Vec<_>, safetensors::SafeTensorError>>()
        .map_err(|e| write_error(&weights, e))?;
    let bytes = safetensors::serialize(views, None).map_err(|e| write_error(&weights, e))?;
    std::fs::write(&weights, bytes).map_err(|e| write_error(&weights, e))?;
    let config = dir.join(ADAPTER_CONFIG_FILE);
    let text = serde_json::to_string_pretty(&adapter_config(t, base_model))
        .map_err(|e| write_error(&config, e))?;
    std::fs::write(&config, text + "\n").map_err(|e| write_error(&config, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::checkpoint::read_tensors;
    use crate::model::ModelConfig;

    /// What is written reads back: every factor under PEFT's name and
    /// shape, its values rounded to f32, and a configuration whose
    /// `lora_alpha / r` is the trainer's scale.
    #[test]
    fn an_adapter_reads_back_under_pefts_names() {
        let cfg = ModelConfig::preset("tiny").unwrap();
        let t = Trainable::perturbed(&cfg, 5, 0.02);
        let dir = tempfile::tempdir().unwrap();
        save_adapter(dir.path(), &t, "fixtures/qwen2-tiny").unwrap();
        let back = read_tensors(&dir.path().join(ADAPTER_WEIGHTS_FILE)).unwrap();
        assert_eq!(back.len(), cfg.layers * (FACTORS.len() + NORMS.len()));
        let norm = &back[&peft_module_name(1, "post_attention_layernorm")];
        assert_eq!(norm.shape, vec![cfg.hidden]);
        let want: Vec<f64> = t
            .get(1, Slot::MlpNorm)
            .iter()
            .map(|&v| f64::from(v as f32))
            .collect();
        assert_eq!(norm.values, want);
        let vb = &back[&peft_name(1, "v_proj.lora_B")];
        assert_eq!(vb.shape, vec![cfg.kv_dim(), cfg.lora_rank]);
        let want: Vec<f64> = t
            .get(1, Slot::VB)
            .iter()
            .map(|&v| f64::from(v as f32))
            .collect();
        assert_eq!(vb.values, want);
        let text = std::fs::read_to_string(dir.path().join(ADAPTER_CONFIG_FILE)).unwrap();
        let c: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            c["lora_alpha"].as_f64().unwrap() / c["r"].as_f64().unwrap(),
            t.scale
        );
        assert_eq!(c["target_modules"], serde_json::json!(["q_proj", "v_proj"]));
        assert_eq!(
            c["modules_to_save"],
            serde_json::json!(["input_layernorm", "post_attention_layernorm"])
        );
    }

    fn fixture() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/qwen2-tiny")
    }

    /// The fixture's stored LoRA start, written as an adapter, reads back
    /// bit for bit; where Python has PEFT, `PeftModel.from_pretrained`
    /// loads it onto the fixture and reproduces the fixture's LoRA logits
    /// (`scripts/check-peft-adapter.py`).
    #[test]
    fn the_fixtures_lora_start_loads_in_peft() {
        use crate::model::Checkpoint;
        use crate::train::BaseWeights;
        let ckpt = Checkpoint::load(&fixture(), BaseWeights::Fp32).unwrap();
        let reference = read_tensors(&fixture().join("reference.safetensors")).unwrap();
        let mut t = ckpt.trainable(1);
        for layer in 0..t.config.layers {
            for (factor, slot) in FACTORS {
                let v = &reference[&format!("layers.{layer}.{factor}")].values;
                t.tensors[Trainable::index(layer, slot)] = v.clone();
            }
        }
        let dir = tempfile::tempdir().unwrap();
        save_adapter(dir.path(), &t, "fixtures/qwen2-tiny").unwrap();
        let back = read_tensors(&dir.path().join(ADAPTER_WEIGHTS_FILE)).unwrap();
        for layer in 0..t.config.layers {
            for (factor, _) in FACTORS {
                let want = &reference[&format!("layers.{layer}.{factor}")];
                assert_eq!(&back[&peft_name(layer, factor)], want, "{layer} {factor}");
            }
        }
        let python = |args: &[&std::ffi::OsStr]| {
            std::process::Command::new("python3")
                .args(args)
                .current_dir(fixture().join("../.."))
                .output()
        };
        let probe = python(&["-c".as_ref(), "import torch, transformers, peft".as_ref()]);
        if !probe.is_ok_and(|o| o.status.success()) {
            eprintln!(
                "PEFT round trip not run: python3 with torch, transformers and peft is absent"
            );
            return;
        }
        let script = "scripts/check-peft-adapter.py".as_ref();
        let out = python(&[script, dir.path().as_os_str()]).unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{text}");
        eprintln!("{text}");
    }
}
