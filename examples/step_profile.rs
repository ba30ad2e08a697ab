//! One preset's training step, timed, with exactly one step bracketed by
//! `cuProfilerStart`/`cuProfilerStop` so that a profiler started with
//! "profile from start off" sees one whole step and nothing else:
//!
//! ```text
//! cargo run --release --example step_profile -- qwen2.5-0.5b [--graph] [--nf4 | --bf16 | --nf4-bf16] [--tf32-backward] [--keep-mlp] [--transposed-weights] [--f16-lm-head] [--f16-projections] [--steps N] [--batch B] [--cublas-pick]
//! ncu --profile-from-start off --metrics gpu__time_duration.sum --csv target/release/examples/step_profile qwen2.5-0.5b
//! ```
//!
//! It prints the median step time and tokens/s over `--steps` timed steps
//! (CUDA events around each step, after two warm-up steps), then the loss of
//! the profiled step. `--cublas-pick` runs every GEMM on cuBLAS's own pick,
//! not the pinned configurations of `qlora::ops::gemm_tuned`.

use falsify_core::check::stats::median;
use qlora::gpu::{driver_present, GemmMath, GpuContext, GpuOptions};
use qlora::model::ModelConfig;
use qlora::train::{BaseWeights, GpuTrainOptions, GpuTrainer};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let preset = args
        .iter()
        .find(|a| !a.starts_with("--") && a.parse::<usize>().is_err())
        .cloned()
        .unwrap_or_else(|| "qwen2.5-0.5b".into());
    let flag = |name: &str| args.iter().any(|a| a == name);
    let steps: usize = args
        .iter()
        .position(|a| a == "--steps")
        .and_then(|i| args.get(i + 1))
        .map_or(Ok(20), |s| s.parse())?;
    if !driver_present() {
        println!("step_profile: no CUDA driver");
        return Ok(());
    }
    let config = ModelConfig::preset(&preset).ok_or(format!("unknown preset {preset}"))?;
    let config = match args.iter().position(|a| a == "--batch") {
        Some(i) => config.with_batch(args.get(i + 1).ok_or("--batch needs a value")?.parse()?),
        None => config,
    };
    let options = GpuTrainOptions {
        graph: flag("--graph"),
        base: if flag("--nf4") {
            BaseWeights::Nf4
        } else if flag("--nf4-bf16") {
            BaseWeights::Nf4Bf16
        } else if flag("--bf16") {
            BaseWeights::Bf16
        } else {
            BaseWeights::Fp32
        },
        backward_math: flag("--tf32-backward").then_some(GemmMath::Tf32),
        keep_mlp: flag("--keep-mlp"),
        transposed_weights: flag("--transposed-weights"),
        f16_lm_head: flag("--f16-lm-head"),
        f16_projections: flag("--f16-projections"),
        device_quantize: true,
        ..GpuTrainOptions::default()
    };
    let mode = options.mode_name();
    let mut gpu = GpuContext::new(GpuOptions {
        tuned_gemms: !flag("--cublas-pick"),
        ..GpuOptions::default()
    })?;
    let mut trainer = GpuTrainer::new(&mut gpu, &config, options, 0)?;
    for _ in 0..2 {
        trainer.step(&mut gpu)?;
    }
    // Timing events (the default flags; `None` would disable timing).
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let mut times = Vec::with_capacity(steps);
    for _ in 0..steps {
        let tokens = trainer.next_batch()?;
        let start = gpu.stream().record_event(flags)?;
        trainer.step_on(&mut gpu, &tokens)?;
        let end = gpu.stream().record_event(flags)?;
        times.push(f64::from(start.elapsed_ms(&end)?));
    }
    let median = median(&times);
    if let Some(tuned) = gpu.tuned_gemms() {
        let (pinned, refused) = (tuned.shapes().count(), tuned.refused().len());
        println!("GEMM shapes on pinned cuBLASLt configurations: {pinned} ({refused} refused)");
    }
    println!(
        "{preset} {mode} on {}: median step {median:.3} ms over {steps} steps, {:.0} tokens/s",
        gpu.facts().name,
        config.tokens() as f64 / median * 1e3
    );
    gpu.synchronize()?;
    // SAFETY: plain driver calls on the current context; they only switch
    // profiler collection on and off.
    unsafe { cudarc::driver::sys::cuProfilerStart() }.result()?;
    let last = trainer.step(&mut gpu)?;
    gpu.synchronize()?;
    // SAFETY: as above.
    unsafe { cudarc::driver::sys::cuProfilerStop() }.result()?;
    println!("loss of step {}: {:.6}", steps + 3, last.loss);
    Ok(())
}
