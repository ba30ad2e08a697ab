//! The GPU training step across a sequence-length change: a graphed trainer
//! re-captures its graph for the new length and keeps computing what an
//! eager trainer computes on the same batches.
//!
//! Needs a GPU: run on the GPU machine with `train_gpu --ignored`.

use falsify::check::params::{Hyper, StepMode};
use falsify::gpu::{driver_present, GpuContext, GpuOptions};
use falsify::model::ModelConfig;
use falsify::train::{GpuTrainOptions, GpuTrainer};

#[test]
#[ignore = "needs a CUDA device: run on the GPU machine with --ignored"]
fn graph_is_recaptured_when_seq_len_changes() {
    assert!(driver_present(), "no CUDA driver");
    let mut gpu = GpuContext::new(GpuOptions::default()).unwrap();
    let cfg = ModelConfig::preset("tiny").unwrap();
    let mode = |graph| StepMode {
        graph,
        ..StepMode::default()
    };
    let opts = |graph| GpuTrainOptions::from_mode(&mode(graph), Hyper::default(), None);
    let mut eager = GpuTrainer::new(&mut gpu, &cfg, opts(false), 3).unwrap();
    let mut graphed = GpuTrainer::new(&mut gpu, &cfg, opts(true), 3).unwrap();
    let seqs = [32usize, 32, 32, 16, 16, 16, 32, 32];
    let batches = eager.eval_batches(seqs.len(), 11).unwrap();
    let mut replays = 0;
    for (i, (seq, full)) in seqs.into_iter().zip(&batches).enumerate() {
        // Batches of `seq + 1` tokens per row, cut from full-length batches.
        let row = full.len() / cfg.batch;
        let tokens: Vec<u32> = full
            .chunks(row)
            .flat_map(|r| r[..seq + 1].to_vec())
            .collect();
        let a = eager.step_on(&mut gpu, &tokens).unwrap();
        let b = graphed.step_on(&mut gpu, &tokens).unwrap();
        replays += usize::from(b.replayed);
        assert_eq!(graphed.config().seq_len, seq, "step {i}");
        assert!(
            (a.loss - b.loss).abs() < 1e-6,
            "step {i} (seq {seq}): eager {} vs graphed {}",
            a.loss,
            b.loss
        );
    }
    // Step 1 runs eagerly; every later step replays a graph captured for its length.
    assert_eq!(replays, 7);
    assert_eq!(graphed.syncs().inside_capture, 0);
    assert!(graphed.syncs().per_step.iter().all(|&n| n == 1));
}

/// Median step times (CUDA events around whole steps, loss read included)
/// of eager and graphed steps for a few presets and base formats, printed
/// for the record (not a check: the contracts hold the claims).
#[test]
#[ignore = "needs a CUDA device: run on the GPU machine with --ignored --nocapture"]
fn step_time_table() {
    use falsify::check::params::BaseWeights;
    use falsify::gpu::timing::median;
    assert!(driver_present(), "no CUDA driver");
    let mut gpu = GpuContext::new(GpuOptions::default()).unwrap();
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    for name in ["small-4l", "qwen2.5-0.5b"] {
        let cfg = ModelConfig::preset(name).unwrap();
        for base in [BaseWeights::Fp32, BaseWeights::Nf4] {
            for graph in [false, true] {
                let mode = StepMode {
                    graph,
                    base,
                    ..StepMode::default()
                };
                let opts = GpuTrainOptions {
                    device_quantize: true,
                    ..GpuTrainOptions::from_mode(&mode, Hyper::default(), None)
                };
                let mut t = GpuTrainer::new(&mut gpu, &cfg, opts, 5).unwrap();
                for _ in 0..3 {
                    t.step(&mut gpu).unwrap();
                }
                let mut ms = Vec::new();
                for _ in 0..15 {
                    let tokens = t.next_batch().unwrap();
                    let start = gpu.stream().record_event(flags).unwrap();
                    t.step_on(&mut gpu, &tokens).unwrap();
                    let end = gpu.stream().record_event(flags).unwrap();
                    ms.push(f64::from(start.elapsed_ms(&end).unwrap()));
                }
                let m = median(&ms);
                println!(
                    "STEP {name} {base:?} graph={graph}: median {m:.3} ms, {:.0} tokens/s ({})",
                    cfg.tokens() as f64 / m * 1e3,
                    gpu.facts().name
                );
            }
        }
    }
}

/// Where a qwen2.5-0.5b step spends its time: forward only, forward +
/// backward, whole eager step; with FP32 and with TF32 backward GEMMs.
/// Printed for the record.
#[test]
#[ignore = "needs a CUDA device: run on the GPU machine with --ignored --nocapture"]
fn phase_time_table() {
    use falsify::gpu::timing::median;
    use falsify::gpu::GemmMath;
    assert!(driver_present(), "no CUDA driver");
    let cfg = ModelConfig::preset("qwen2.5-0.5b").unwrap();
    for backward_math in [GemmMath::Fp32, GemmMath::Tf32] {
        let mut gpu = GpuContext::new(GpuOptions {
            backward_math,
            ..GpuOptions::default()
        })
        .unwrap();
        let opts = GpuTrainOptions::from_mode(&StepMode::default(), Hyper::default(), None);
        let mut t = GpuTrainer::new(&mut gpu, &cfg, opts, 5).unwrap();
        let tokens = t.next_batch().unwrap();
        t.step_on(&mut gpu, &tokens).unwrap();
        let time = |gpu: &mut GpuContext, f: &mut dyn FnMut(&mut GpuContext)| {
            let ms: Vec<f64> = (0..7)
                .map(|_| {
                    let s = std::time::Instant::now();
                    f(gpu);
                    gpu.synchronize().unwrap();
                    s.elapsed().as_secs_f64() * 1e3
                })
                .collect();
            median(&ms)
        };
        let fwd = time(&mut gpu, &mut |g| {
            t.loss(g, &tokens).unwrap();
        });
        let fwd_bwd = time(&mut gpu, &mut |g| {
            t.loss_and_grads(g, &tokens).unwrap();
        });
        let step = time(&mut gpu, &mut |g| {
            t.step_on(g, &tokens).unwrap();
        });
        println!(
            "PHASE qwen2.5-0.5b backward {backward_math:?}: forward {fwd:.2} ms, forward+backward {fwd_bwd:.2} ms, step {step:.2} ms ({})",
            gpu.facts().name
        );
    }
}
