//! The GPU training step across a sequence-length change: a graphed trainer
//! re-captures its graph for the new length and keeps computing what an
//! eager trainer computes on the same batches; the device transpose the fast
//! configuration keeps `W^T` with; the device's draws of seeded weights; the
//! LoRA weight gradients of the TF32 backward against the FP32 one's; the
//! RMSNorm weight gradients the step sums after its whole backward against
//! those summed after each backward; cuBLAS refused on the side stream; the
//! bf16 GEMMs pinned to cuBLASLt configurations against cuBLAS's own pick.
//!
//! Needs a GPU: run on the GPU machine with `train_gpu --ignored`.

use qlora::gpu::{driver_present, GemmMath, GpuContext, GpuOptions};
use qlora::model::{ModelConfig, Slot, Trainable};
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

/// The TF32 backward computes a layer's LoRA weight gradients in kernels of
/// its own (`lora_grads_tf32`), the FP32 backward with cuBLAS's FP32 GEMMs:
/// after three steps (so that B, zero at the start, and with it dA are not)
/// the two agree within TF32's rounding, through every TF32 GEMM of the
/// backward (rel. L2 at most 1e-2); a transposed operand or a wrong tile
/// would be off by the gradient's own size. `tiny` has a rank of 8 (half the
/// kernel's 16 columns), kv_dim 32 and 64 rows (half a slice).
#[test]
#[ignore = "needs a CUDA device: run on the GPU machine with --ignored"]
fn lora_gradients_in_tf32_follow_the_fp32_gemms() {
    assert!(driver_present(), "no CUDA driver");
    let mut gpu = GpuContext::new(GpuOptions::default()).unwrap();
    let cfg = ModelConfig::preset("tiny").unwrap();
    let opts = |math| GpuTrainOptions {
        backward_math: Some(math),
        ..GpuTrainOptions::default()
    };
    let mut tf32 = GpuTrainer::new(&mut gpu, &cfg, opts(GemmMath::Tf32), 3).unwrap();
    let mut fp32 = GpuTrainer::new(&mut gpu, &cfg, opts(GemmMath::Fp32), 3).unwrap();
    let batches = fp32.eval_batches(4, 11).unwrap();
    for b in &batches[..3] {
        tf32.step_on(&mut gpu, b).unwrap();
        fp32.step_on(&mut gpu, b).unwrap();
    }
    let got = tf32.loss_and_grads(&mut gpu, &batches[3]).unwrap();
    let want = fp32.loss_and_grads(&mut gpu, &batches[3]).unwrap();
    for layer in 0..cfg.layers {
        for slot in [Slot::QA, Slot::QB, Slot::VA, Slot::VB] {
            let i = Trainable::index(layer, slot);
            let (g, w) = (&got.grads[i], &want.grads[i]);
            let norm = w.iter().map(|v| v * v).sum::<f32>().sqrt();
            let diff = g
                .iter()
                .zip(w)
                .map(|(a, b)| (a - b) * (a - b))
                .sum::<f32>()
                .sqrt();
            let name = Trainable::name(i);
            assert!(norm > 0.0, "{name}: the FP32 gradient is zero");
            assert!(diff <= 1e-2 * norm, "{name}: rel. L2 {} ", diff / norm);
        }
    }
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

/// Work on the side stream runs no GEMMs: cuBLAS is bound to the work
/// stream, so the context refuses its handle there, and gives it again
/// once the work is back on the work stream.
#[test]
#[ignore = "needs a CUDA device: run on the GPU machine with --ignored"]
fn cublas_is_refused_on_the_side_stream() {
    assert!(driver_present(), "no CUDA driver");
    let mut gpu = GpuContext::new(GpuOptions::default()).unwrap();
    let inside = gpu.on_side_stream(|g| g.cublas().map(|_| ()));
    let err = inside.expect_err("cuBLAS handed out on the side stream");
    assert!(err.to_string().contains("on_side_stream"), "{err}");
    gpu.join_side_stream().unwrap();
    assert!(gpu.cublas().is_ok());
}

/// The device's draws of a seeded tensor are the host's, bit for bit, in
/// every stored format, from the stream's start and from an unaligned
/// position far into it, at lengths that end mid-block.
#[test]
#[ignore = "needs a CUDA device: run on the GPU machine with --ignored"]
fn device_draws_are_the_hosts_values_bit_for_bit() {
    use qlora::model::weights::{Draw, TensorId};
    use qlora::ops::cast::Bf16;
    use qlora::ops::draw::{uniform, Drawn};

    fn check<T: Drawn + PartialEq + std::fmt::Debug + cudarc::driver::ValidAsZeroBits>(
        gpu: &mut GpuContext,
        draw: Draw,
        seed: u64,
    ) {
        for (first, n) in [(0usize, 1_000_001usize), (3, 13), (999_999_995, 4_099)] {
            let mut host = vec![T::from_f64(0.0); n];
            draw.values_into(seed, first, &mut host, T::from_f64);
            let mut y = gpu.zeros::<T>(n).unwrap();
            uniform(gpu, &draw.stream(seed), first, &mut y.slice_mut(..)).unwrap();
            let device = gpu.download(&y).unwrap();
            if let Some(i) = host.iter().zip(&device).position(|(h, d)| h != d) {
                panic!(
                    "{:?} as {} from {first}: value {i} is {:?} on the host, {:?} on the device",
                    draw.id,
                    std::any::type_name::<T>(),
                    host[i],
                    device[i]
                );
            }
        }
    }

    assert!(driver_present(), "no CUDA driver");
    let mut gpu = GpuContext::new(GpuOptions::default()).unwrap();
    let draws = [
        (
            Draw {
                id: TensorId::Embedding,
                len: 0,
                std: 1.0,
            },
            5,
        ),
        (
            Draw {
                id: TensorId::Proj {
                    layer: 23,
                    which: 6,
                },
                len: 0,
                std: 0.0143,
            },
            0,
        ),
    ];
    for (draw, seed) in draws {
        check::<f32>(&mut gpu, draw, seed);
        check::<u16>(&mut gpu, draw, seed);
        check::<Bf16>(&mut gpu, draw, seed);
    }
}

/// The RMSNorm backward with its dgamma left in slots of the workspace and
/// summed by one launch afterwards gives each dgamma (and dx) bit for bit as
/// the backward that sums it at once, for the warp-per-row build (hidden
/// 896, the step's) and a row-group one (hidden 98, not a whole number of
/// four-column packs); eleven slots, so that the sum's launch takes one
/// full group of norms and one part-filled.
#[test]
#[ignore = "needs a CUDA device: run on the GPU machine with --ignored"]
fn norm_gradients_summed_later_are_those_summed_at_once() {
    use qlora::ops::rmsnorm::{self, BackwardWorkspace, Dgamma, DgammaTargets, DxOut};
    assert!(driver_present(), "no CUDA driver");
    let mut gpu = GpuContext::new(GpuOptions::default()).unwrap();
    assert_eq!(rmsnorm::bwd_module_for(896), "rmsnorm_bwd_warp8");
    assert_eq!(rmsnorm::bwd_module_for(98), "rmsnorm_bwd_block");
    for (rows, hidden) in [(1024, 896), (77, 98)] {
        let slots = 11;
        let value =
            |i: usize, salt: usize| ((i * 7919 + salt * 104_729) % 1000) as f32 / 250.0 - 2.0;
        let x: Vec<f32> = (0..rows * hidden).map(|i| value(i, 1)).collect();
        let dys: Vec<Vec<f32>> = (0..slots)
            .map(|n| (0..rows * hidden).map(|i| value(i, 2 + n)).collect())
            .collect();
        let gamma: Vec<f32> = (0..hidden).map(|i| 1.0 + value(i, 9) / 8.0).collect();
        let (x, gamma) = (gpu.upload(&x).unwrap(), gpu.upload(&gamma).unwrap());
        let dys: Vec<_> = dys.iter().map(|d| gpu.upload(d).unwrap()).collect();
        let mut ws = BackwardWorkspace::with_slots(&gpu, rows, hidden, slots).unwrap();
        let shape = (rows, hidden, 1e-6);
        let mut at_once = Vec::new();
        let later: Vec<_> = (0..slots)
            .map(|_| gpu.zeros::<f32>(hidden).unwrap())
            .collect();
        let mut dx_later = Vec::new();
        for (n, dy) in dys.iter().enumerate() {
            for now in [true, false] {
                let mut dx = gpu.zeros::<f32>(rows * hidden).unwrap();
                let mut dgamma = gpu.zeros::<f32>(hidden).unwrap();
                let mut dgamma_view = dgamma.as_view_mut();
                let out = DxOut {
                    dx: &mut dx.as_view_mut(),
                    onto: false,
                    dx16: None,
                };
                let how = if now {
                    Dgamma::Now(&mut dgamma_view)
                } else {
                    Dgamma::Slot(n)
                };
                let inputs = (&x.as_view(), &gamma.as_view(), &dy.as_view());
                rmsnorm::backward_to(&mut gpu, inputs, shape, out, how, &mut ws).unwrap();
                let dx = gpu.download(&dx).unwrap();
                if now {
                    at_once.push((dx, gpu.download(&dgamma).unwrap()));
                } else {
                    dx_later.push(dx);
                }
            }
        }
        let targets = DgammaTargets::new(&gpu, &later.iter().collect::<Vec<_>>(), hidden).unwrap();
        let short = gpu.zeros::<f32>(hidden - 1).unwrap();
        assert!(DgammaTargets::new(&gpu, &[&later[0], &short], hidden).is_err());
        ws.sum_slots(&mut gpu, &targets).unwrap();
        for n in 0..slots {
            let dgamma = gpu.download(&later[n]).unwrap();
            let (dx, expected) = &at_once[n];
            assert_eq!(&dx_later[n], dx, "dx of slot {n}, hidden {hidden}");
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&dgamma),
                bits(expected),
                "dgamma of slot {n}, hidden {hidden}"
            );
            assert!(dgamma.iter().any(|&v| v != 0.0), "slot {n} summed nothing");
        }
    }
}

/// The bf16 GEMMs pinned to cuBLASLt configurations for this device
/// (`qlora::ops::gemm_tuned::TUNED`) take them, all of them (cuBLASLt
/// refuses none), and write what cuBLAS's own pick writes, bit for bit:
/// each shape with varied operands, once writing C and once adding onto it,
/// captured into a graph and replayed as the graphed step's are. An eager
/// call keeps cuBLAS's pick. A device the table does not name makes no
/// cuBLASLt handle at all.
#[test]
#[ignore = "needs a CUDA device: run on the GPU machine with --ignored"]
fn pinned_gemms_write_what_cublas_writes() {
    use qlora::ops::cast::Bf16;
    use qlora::ops::gemm::GemmSpec;
    use qlora::ops::gemm_tuned::TUNED;
    use qlora::train::gemm_half;
    assert!(driver_present(), "no CUDA driver");
    let mut tuned = GpuContext::new(GpuOptions::default()).unwrap();
    let mut plain = GpuContext::new(GpuOptions {
        tuned_gemms: false,
        ..GpuOptions::default()
    })
    .unwrap();
    // The workspace the trainer lends cuBLAS for its captures.
    let _tuned_ws = qlora::train::workspace::CublasWorkspace::new(&tuned).unwrap();
    let _plain_ws = qlora::train::workspace::CublasWorkspace::new(&plain).unwrap();
    assert!(plain.tuned_gemms().is_none());
    let name = tuned.facts().name.clone();
    let entries: Vec<_> = TUNED.iter().filter(|t| t.device == name).collect();
    let Some(pinned) = tuned.tuned_gemms() else {
        assert!(entries.is_empty(), "{name}: pinned shapes but no plans");
        return;
    };
    assert!(
        pinned.refused().is_empty(),
        "refused: {:?}",
        pinned.refused()
    );
    assert_eq!(pinned.shapes().count(), entries.len());
    let launches = |gpu: &GpuContext| gpu.tuned_gemms().map_or(0, |t| t.launches());
    let value = |i: usize, salt: usize| {
        Bf16::from_f32(((i * 7919 + salt * 104_729) % 2001) as f32 / 1000.0 - 1.0)
    };
    for t in entries {
        let s = t.shape;
        let (m, n, k) = (s.m as usize, s.n as usize, s.k as usize);
        // Forward y[n, m] = x[n, k] W^T; input gradient dx[n, m] = dy[n, k] W.
        let spec = if s.trans_a {
            GemmSpec::linear(n, k, m)
        } else {
            GemmSpec::linear_dx(n, m, k)
        };
        let a: Vec<Bf16> = (0..n * k).map(|i| value(i, 1)).collect();
        let w: Vec<Bf16> = (0..m * k).map(|i| value(i, 2)).collect();
        {
            let (a, w) = (tuned.upload(&a).unwrap(), tuned.upload(&w).unwrap());
            let before = launches(&tuned);
            if s.bf16_out {
                let mut c = tuned.zeros::<Bf16>(n * m).unwrap();
                gemm_half(&tuned, spec, 1.0, &a, &w, 0.0, &mut c).unwrap();
            } else {
                let mut c = tuned.zeros::<f32>(n * m).unwrap();
                gemm_half(&tuned, spec, 1.0, &a, &w, 0.0, &mut c).unwrap();
            }
            assert_eq!(launches(&tuned), before, "{s:?}: an eager call was pinned");
        }
        for beta in [0.0f32, 1.0] {
            // The output's bits (bf16 widened).
            let run = |gpu: &mut GpuContext| -> Vec<u32> {
                let (a, w) = (gpu.upload(&a).unwrap(), gpu.upload(&w).unwrap());
                if s.bf16_out {
                    let c0: Vec<Bf16> = (0..n * m).map(|i| value(i, 3)).collect();
                    let mut c = gpu.upload(&c0).unwrap();
                    graphed(gpu, |g| gemm_half(g, spec, 1.0, &a, &w, beta, &mut c));
                    gpu.download(&c)
                        .unwrap()
                        .iter()
                        .map(|x| u32::from(x.0))
                        .collect()
                } else {
                    let c0: Vec<f32> = (0..n * m).map(|i| value(i, 3).to_f32()).collect();
                    let mut c = gpu.upload(&c0).unwrap();
                    graphed(gpu, |g| gemm_half(g, spec, 1.0, &a, &w, beta, &mut c));
                    gpu.download(&c)
                        .unwrap()
                        .iter()
                        .map(|x| x.to_bits())
                        .collect()
                }
            };
            let before = launches(&tuned);
            let ours = run(&mut tuned);
            assert_eq!(
                launches(&tuned),
                before + 1,
                "{s:?} did not take its pinned configuration"
            );
            assert!(
                ours == run(&mut plain),
                "{s:?}, beta {beta}: not cuBLAS's bits"
            );
        }
    }
}

/// `work` captured on the context's stream into a graph, launched once.
fn graphed(gpu: &mut GpuContext, work: impl FnOnce(&GpuContext) -> qlora::Result<()>) {
    let ((), graph) = gpu.capture(|g| work(g)).unwrap();
    graph.launch().unwrap();
    gpu.stream().synchronize().unwrap();
}
