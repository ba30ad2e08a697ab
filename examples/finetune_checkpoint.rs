//! Fine-tunes a Hugging Face Qwen2 checkpoint on the GPU and writes the
//! result as a PEFT adapter:
//!
//! ```text
//! cargo run --release --example finetune_checkpoint -- CHECKPOINT_DIR ADAPTER_DIR [--nf4] [--steps N] [--batch B] [--seq S]
//! ```
//!
//! CHECKPOINT_DIR holds `config.json` and `model.safetensors` (or shards
//! with `model.safetensors.index.json`), as `save_pretrained` writes them.
//! The step trains LoRA (r 8, alpha 16) on q and v and both norms of every
//! layer, on the stack's byte-level arithmetic corpus (token ids below 256,
//! valid in any Qwen2 vocabulary), and prints the loss of every tenth step.
//! ADAPTER_DIR receives `adapter_config.json` and
//! `adapter_model.safetensors`, which `PeftModel.from_pretrained` loads
//! onto the same checkpoint.

use std::path::Path;

use qlora::gpu::{driver_present, GpuContext, GpuOptions};
use qlora::model::adapter::save_adapter;
use qlora::model::{BaseModel, Checkpoint, Trainable};
use qlora::train::{BaseWeights, GpuTrainOptions, GpuTrainer};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut paths = args.iter().filter(|a| !a.starts_with("--"));
    let usage = "usage: finetune_checkpoint CHECKPOINT_DIR ADAPTER_DIR [--nf4] [--steps N] [--batch B] [--seq S]";
    let (Some(checkpoint), Some(adapter)) = (paths.next(), paths.next()) else {
        return Err(usage.into());
    };
    let number = |flag: &str, default: usize| -> Result<usize, Box<dyn std::error::Error>> {
        match args.iter().position(|a| a == flag) {
            Some(i) => Ok(args.get(i + 1).ok_or(usage)?.parse()?),
            None => Ok(default),
        }
    };
    let (steps, batch, seq) = (
        number("--steps", 100)?,
        number("--batch", 4)?,
        number("--seq", 256)?,
    );
    if !driver_present() {
        return Err("no CUDA driver: the step runs on the GPU".into());
    }
    // Loaded in fp32; an NF4 base is quantised on the way to the device.
    let ckpt = Checkpoint::load(Path::new(checkpoint), BaseWeights::Fp32)?;
    let config = ckpt.base.config.with_batch(batch).with_seq_len(seq);
    let seed = 0;
    let trainable = Trainable {
        config,
        ..ckpt.trainable(seed)
    };
    let base = BaseModel {
        config,
        ..ckpt.base
    };
    let options = GpuTrainOptions {
        graph: true,
        base: if args.iter().any(|a| a == "--nf4") {
            BaseWeights::Nf4
        } else {
            BaseWeights::Fp32
        },
        device_quantize: true,
        ..GpuTrainOptions::default()
    };
    let mut gpu = GpuContext::new(GpuOptions::default())?;
    let mut trainer = GpuTrainer::from_model(&mut gpu, &base, options, seed, &trainable)?;
    drop(base);
    for step in 1..=steps {
        let report = trainer.step(&mut gpu)?;
        if step % 10 == 0 || step == 1 || step == steps {
            println!("step {step:>5}  loss {:.4}", report.loss);
        }
    }
    save_adapter(Path::new(adapter), &trainer.trainable(&gpu)?, checkpoint)?;
    println!("adapter written to {adapter}");
    Ok(())
}
