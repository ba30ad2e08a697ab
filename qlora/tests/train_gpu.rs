//! The GPU training step across a sequence-length change: a graphed trainer
//! re-captures its graph for the new length and keeps computing what an
//! eager trainer computes on the same batches; the device transpose the fast
//! configuration keeps `W^T` with.
//!
//! Needs a GPU: run on the GPU machine with `train_gpu --ignored`.

use qlora::gpu::{driver_present, GpuContext, GpuOptions};
use qlora::model::ModelConfig;
use qlora::train::{GpuTrainOptions, GpuTrainer};

#[test]
#[ignore = "needs a CUDA device: run on the GPU machine with --ignored"]
fn graph_is_recaptured_when_seq_len_changes() {
    assert!(driver_present(), "no CUDA driver");
    let mut gpu = GpuContext::new(GpuOptions::default()).unwrap();
    let cfg = ModelConfig::preset("tiny").unwrap();
    let opts = |graph| GpuTrainOptions {
        graph,
        ..GpuTrainOptions::default()
    };
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

#[test]
#[ignore = "needs a CUDA device: run on the GPU machine with --ignored"]
fn device_transpose_moves_every_element_exactly() {
    assert!(driver_present(), "no CUDA driver");
    let gpu = GpuContext::new(GpuOptions::default()).unwrap();
    for (rows, cols) in [(37, 70), (1, 5), (64, 64)] {
        let w: Vec<f32> = (0..rows * cols).map(|i| i as f32 - 0.5).collect();
        let t = qlora::ops::gemm::transpose_f32(&gpu, &gpu.upload(&w).unwrap(), (rows, cols));
        let t = gpu.download(&t.unwrap()).unwrap();
        for r in 0..rows {
            for c in 0..cols {
                assert_eq!(t[c * rows + r], w[r * cols + c], "{rows} x {cols}");
            }
        }
    }
}
