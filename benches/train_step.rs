//! Training-step benchmarks: one whole QLoRA step (forward, backward, global
//! clip, AdamW) per preset, fp32 and NF4 base, eager and CUDA-graphed, and the
//! fast configuration (graphed, TF32 backward GEMMs, MLP activations kept), through
//! [`qlora::train::GpuTrainer`]. Throughput is in tokens (batch x seq_len).
//!
//! Every step reads its loss back, which synchronises the device, so the host
//! clock around `iters` steps measures device time. The first two steps (eager,
//! then the capture) run before timing starts.
//!
//! Without a CUDA driver it prints one line and returns.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use qlora::gpu::{driver_present, GemmMath, GpuContext, GpuOptions};
use qlora::model::ModelConfig;
use qlora::train::{BaseWeights, GpuTrainOptions, GpuTrainer};

fn bench_train_step(c: &mut Criterion) {
    if !driver_present() {
        println!("GPU training-step benches skipped: no CUDA driver");
        return;
    }
    let mut gpu = GpuContext::new(GpuOptions::default()).expect("open the GPU");
    let mut group = c.benchmark_group("train_step");
    group.sample_size(10);
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(2));
    for name in ["tiny", "small-4l", "qwen2.5-0.5b"] {
        let config = ModelConfig::preset(name).expect("a preset");
        group.throughput(Throughput::Elements(config.tokens() as u64));
        // An NF4 base is quantised on the device: fast for the large presets.
        let speed = GpuTrainOptions {
            device_quantize: true,
            ..GpuTrainOptions::default()
        };
        let mut modes: Vec<GpuTrainOptions> = Vec::new();
        for base in [BaseWeights::Fp32, BaseWeights::Nf4] {
            for graph in [false, true] {
                modes.push(GpuTrainOptions {
                    graph,
                    base,
                    ..speed
                });
            }
        }
        // The fast configuration F-TPUT-003 holds to a tokens/s target on qwen2.5-0.5b.
        modes.push(GpuTrainOptions {
            graph: true,
            backward_math: Some(GemmMath::Tf32),
            keep_mlp: true,
            transposed_weights: true,
            f16_lm_head: true,
            f16_projections: true,
            ..speed
        });
        for options in modes {
            let mode = options.mode_name();
            let mut trainer = GpuTrainer::new(&mut gpu, &config, options, 0).expect("a trainer");
            for _ in 0..2 {
                trainer.step(&mut gpu).expect("warm-up step");
            }
            group.bench_function(format!("{name}/{mode}"), |b| {
                b.iter_custom(|iters| {
                    let start = Instant::now();
                    for _ in 0..iters {
                        trainer.step(&mut gpu).expect("step");
                    }
                    start.elapsed()
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench_train_step);
criterion_main!(benches);
