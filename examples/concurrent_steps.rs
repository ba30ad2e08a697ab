//! How much of the step's time two steps running at once would hide: `N`
//! trainers, each on a thread of its own with its own context streams and
//! its own captured graph, step together, and the wall time of their steps
//! is divided by the tokens all of them trained on.
//!
//! ```text
//! cargo run --release --example concurrent_steps -- qwen2.5-0.5b --trainers 2 --batch 2 [--nf4-bf16] [--steps N]
//! ```
//!
//! Each trainer trains its own adapter: this measures how well the GPU
//! overlaps independent steps (the elementwise kernels and attention of one
//! beside the GEMMs of another), an upper bound of what running a batch's
//! halves on two streams inside one step could gain. It prints the wall
//! time per step of every trainer together and the tokens/s of all of them.

use qlora::gpu::{driver_present, GemmMath, GpuContext, GpuOptions};
use qlora::model::ModelConfig;
use qlora::train::{BaseWeights, GpuTrainOptions, GpuTrainer};
use std::sync::Barrier;
use std::time::Instant;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |name: &str, default: usize| -> Result<usize, BoxError> {
        match args.iter().position(|a| a == name) {
            Some(i) => {
                let text = args.get(i + 1).ok_or(format!("{name} needs a value"))?;
                Ok(text.parse()?)
            }
            None => Ok(default),
        }
    };
    let preset = args
        .iter()
        .find(|a| !a.starts_with("--") && a.parse::<usize>().is_err())
        .cloned()
        .unwrap_or_else(|| "qwen2.5-0.5b".into());
    let trainers = value("--trainers", 2)?;
    let steps = value("--steps", 30)?;
    if !driver_present() {
        println!("concurrent_steps: no CUDA driver");
        return Ok(());
    }
    let base = ModelConfig::preset(&preset).ok_or(format!("unknown preset {preset}"))?;
    let config = base.with_batch(value("--batch", base.batch)?);
    let options = GpuTrainOptions {
        graph: true,
        base: if args.iter().any(|a| a == "--nf4-bf16") {
            BaseWeights::Nf4Bf16
        } else {
            BaseWeights::Bf16
        },
        backward_math: Some(GemmMath::Tf32),
        keep_mlp: true,
        device_quantize: true,
        ..GpuTrainOptions::default()
    };
    let ready = Barrier::new(trainers);
    let walls: Vec<Result<f64, BoxError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..trainers)
            .map(|seed| {
                let (ready, config, options) = (&ready, &config, options);
                s.spawn(move || -> Result<f64, BoxError> {
                    let mut gpu = GpuContext::new(GpuOptions::default())?;
                    let mut trainer = GpuTrainer::new(&mut gpu, config, options, seed as u64)?;
                    for _ in 0..3 {
                        trainer.step(&mut gpu)?;
                    }
                    ready.wait();
                    let start = Instant::now();
                    for _ in 0..steps {
                        trainer.step(&mut gpu)?;
                    }
                    gpu.synchronize()?;
                    Ok(start.elapsed().as_secs_f64())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a trainer's thread panicked".into()))
            })
            .collect()
    });
    let walls = walls.into_iter().collect::<Result<Vec<f64>, BoxError>>()?;
    let wall = walls.iter().cloned().fold(0.0, f64::max);
    let tokens = (trainers * steps * config.tokens()) as f64;
    println!(
        "{preset} {trainers} trainer(s) at batch {}: {:.3} ms a round of steps, {:.3} ms per 1,024 tokens, {:.0} tokens/s",
        config.batch,
        wall / steps as f64 * 1e3,
        wall / tokens * 1024.0 * 1e3,
        tokens / wall
    );
    Ok(())
}
