//! GPU kernel benchmarks at qwen2.5-0.5b shapes (batch 4 x seq 256 = 1024
//! tokens, hidden 896, MLP 4864, vocab 151936, 14 query / 2 kv heads of 64),
//! through the launchers in `src/ops/`.
//!
//! Each sample launches the kernel `iters` times back to back between two
//! device synchronisations and reads the host clock (`iter_custom`): wall time
//! of the queued launches, so for the smallest kernels launch cost is part of
//! it (the bandwidth contracts time with CUDA events instead). Throughput is in bytes moved (the minimum each kernel
//! must read and write) for the memory-bound kernels, and in FLOPs (counted
//! as elements) for GEMMs and attention.
//!
//! Without a CUDA driver it prints one line and returns.

use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use cudarc::driver::CudaSlice;
use qlora::gpu::{driver_present, GemmMath, GpuContext, GpuOptions};
use qlora::model::ModelConfig;
use qlora::ops::attention::{AttnKernels, AttnShape};
use qlora::ops::gemm::{GemmEngine, GemmSpec};
use qlora::ops::nf4::Nf4Device;
use qlora::ops::{
    activation, adamw, attention, cast, clip, cross_entropy, elementwise, embedding, gemm, nf4,
    rmsnorm, rope, softmax,
};
use qlora::train::AdamW;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Bytes of one f32.
const F32: u64 = 4;

fn random(gpu: &GpuContext, n: usize, seed: u64) -> CudaSlice<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let host: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
    gpu.upload(&host).expect("upload")
}

fn token_ids(gpu: &GpuContext, n: usize, vocab: usize, seed: u64) -> CudaSlice<u32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let host: Vec<u32> = (0..n).map(|_| rng.random_range(0..vocab as u32)).collect();
    gpu.upload(&host).expect("upload")
}

fn zeros(gpu: &GpuContext, n: usize) -> CudaSlice<f32> {
    gpu.zeros(n).expect("alloc")
}

/// Launches `launch` `iters` times between two device synchronisations.
fn device_time(
    gpu: &mut GpuContext,
    iters: u64,
    launch: &mut impl FnMut(&mut GpuContext),
) -> Duration {
    gpu.synchronize().expect("synchronize");
    let start = Instant::now();
    for _ in 0..iters {
        launch(gpu);
    }
    gpu.synchronize().expect("synchronize");
    start.elapsed()
}

fn bench(
    group: &mut BenchmarkGroup<'_, WallTime>,
    gpu: &mut GpuContext,
    name: &str,
    throughput: Throughput,
    mut launch: impl FnMut(&mut GpuContext),
) {
    // One untimed launch compiles and loads the module.
    launch(gpu);
    group.throughput(throughput);
    group.bench_function(name, |b| {
        b.iter_custom(|iters| device_time(gpu, iters, &mut launch))
    });
}

fn bytes(f32_elements: usize) -> Throughput {
    Throughput::Bytes(f32_elements as u64 * F32)
}

fn flops(n: usize) -> Throughput {
    Throughput::Elements(n as u64)
}

fn kernels(c: &mut Criterion) {
    if !driver_present() {
        println!("GPU kernel benches skipped: no CUDA driver");
        return;
    }
    let mut gpu = match GpuContext::new(GpuOptions::default()) {
        Ok(gpu) => gpu,
        Err(e) => {
            println!("GPU kernel benches skipped: no usable CUDA device: {e}");
            return;
        }
    };
    let gpu = &mut gpu;
    let Some(cfg) = ModelConfig::preset("qwen2.5-0.5b") else {
        println!("GPU kernel benches skipped: no qwen2.5-0.5b preset");
        return;
    };
    let t = cfg.batch * cfg.seq_len;
    let (h, inter, vocab) = (cfg.hidden, cfg.intermediate, cfg.vocab);
    let th = t * h;
    let ti = t * inter;

    let mut g = c.benchmark_group("kernels_qwen2.5-0.5b");
    g.sample_size(20);

    // Embedding: gather T rows of the table, and scatter-add them back.
    let table = random(gpu, vocab * h, 1);
    let tokens = token_ids(gpu, t, vocab, 2);
    let mut y = zeros(gpu, th);
    bench(&mut g, gpu, "embedding_fwd", bytes(2 * th + t), |gpu| {
        embedding::forward(
            gpu,
            &table.as_view(),
            vocab,
            h,
            &tokens.as_view(),
            &mut y.as_view_mut(),
        )
        .expect("embedding forward")
    });
    let dy = random(gpu, th, 3);
    let mut dtable = zeros(gpu, vocab * h);
    // The backward writes the whole [vocab, hidden] table (zeros where no
    // token lands) and reads dy and the tokens.
    bench(
        &mut g,
        gpu,
        "embedding_bwd",
        bytes(th + vocab * h + t),
        |gpu| {
            embedding::backward(
                gpu,
                &dy.as_view(),
                vocab,
                h,
                &tokens.as_view(),
                &mut dtable.as_view_mut(),
            )
            .expect("embedding backward")
        },
    );
    drop(dtable);
    drop(table);

    // RMSNorm over [T, H].
    let x = random(gpu, th, 4);
    let x2 = random(gpu, th, 5);
    let gamma = random(gpu, h, 6);
    bench(&mut g, gpu, "rmsnorm_fwd", bytes(2 * th + h), |gpu| {
        rmsnorm::forward(
            gpu,
            &x.as_view(),
            &gamma.as_view(),
            t,
            h,
            1e-6,
            &mut y.as_view_mut(),
        )
        .expect("rmsnorm forward")
    });
    let mut hsum = zeros(gpu, th);
    bench(
        &mut g,
        gpu,
        "rmsnorm_residual_fwd",
        bytes(4 * th + h),
        |gpu| {
            rmsnorm::forward_residual(
                gpu,
                &x.as_view(),
                &x2.as_view(),
                &gamma.as_view(),
                t,
                h,
                1e-6,
                &mut hsum.as_view_mut(),
                &mut y.as_view_mut(),
            )
            .expect("rmsnorm residual forward")
        },
    );
    let mut dx = zeros(gpu, th);
    let mut dgamma = zeros(gpu, h);
    let mut ws = rmsnorm::BackwardWorkspace::new(gpu, t, h).expect("workspace");
    bench(&mut g, gpu, "rmsnorm_bwd", bytes(3 * th + 2 * h), |gpu| {
        rmsnorm::backward(
            gpu,
            &x.as_view(),
            &gamma.as_view(),
            &dy.as_view(),
            t,
            h,
            1e-6,
            &mut dx.as_view_mut(),
            &mut dgamma.as_view_mut(),
            &mut ws,
        )
        .expect("rmsnorm backward")
    });

    // Element-wise over [T, H].
    bench(&mut g, gpu, "residual_add", bytes(3 * th), |gpu| {
        elementwise::residual_add(gpu, &x.as_view(), &x2.as_view(), &mut y.as_view_mut())
            .expect("residual add")
    });
    bench(&mut g, gpu, "scale", bytes(2 * th), |gpu| {
        elementwise::scale(gpu, &x.as_view(), 0.5, &mut y.as_view_mut()).expect("scale")
    });
    let mut half: CudaSlice<u16> = gpu.zeros(th).expect("alloc");
    // Read 4 bytes, write 2 per element.
    bench(
        &mut g,
        gpu,
        "cast_f32_f16",
        Throughput::Bytes(th as u64 * 6),
        |gpu| cast::f32_to_f16(gpu, &x.as_view(), &mut half.as_view_mut()).expect("cast"),
    );
    drop(half);

    // RoPE on q: [B, S, heads, head_dim].
    let q_len = t * cfg.heads * cfg.head_dim;
    let q = random(gpu, q_len, 7);
    let mut q_out = zeros(gpu, q_len);
    let theta = 1_000_000.0;
    bench(&mut g, gpu, "rope_fwd", bytes(2 * q_len), |gpu| {
        rope::forward(
            gpu,
            &q.as_view(),
            cfg.batch,
            cfg.seq_len,
            cfg.heads,
            cfg.head_dim,
            theta,
            &mut q_out.as_view_mut(),
        )
        .expect("rope forward")
    });
    bench(&mut g, gpu, "rope_bwd", bytes(2 * q_len), |gpu| {
        rope::backward(
            gpu,
            &q.as_view(),
            cfg.batch,
            cfg.seq_len,
            cfg.heads,
            cfg.head_dim,
            theta,
            &mut q_out.as_view_mut(),
        )
        .expect("rope backward")
    });

    // Causal softmax over the scores: [B * heads * S, S].
    let rows = cfg.batch * cfg.heads * cfg.seq_len;
    let scores = random(gpu, rows * cfg.seq_len, 8);
    let mut probs = zeros(gpu, rows * cfg.seq_len);
    let dprobs = random(gpu, rows * cfg.seq_len, 9);
    let mut dscores = zeros(gpu, rows * cfg.seq_len);
    bench(
        &mut g,
        gpu,
        "softmax_fwd",
        bytes(2 * rows * cfg.seq_len),
        |gpu| {
            softmax::forward(
                gpu,
                &scores.as_view(),
                rows,
                cfg.seq_len,
                &mut probs.as_view_mut(),
            )
            .expect("softmax forward")
        },
    );
    bench(
        &mut g,
        gpu,
        "softmax_bwd",
        bytes(3 * rows * cfg.seq_len),
        |gpu| {
            softmax::backward(
                gpu,
                &probs.as_view(),
                &dprobs.as_view(),
                rows,
                cfg.seq_len,
                &mut dscores.as_view_mut(),
            )
            .expect("softmax backward")
        },
    );
    drop((scores, dprobs, dscores));

    // Attention: QK^T and PV, 2 * B * heads * S^2 * head_dim FLOPs each.
    let sh = AttnShape {
        batch: cfg.batch,
        seq: cfg.seq_len,
        heads: cfg.heads,
        kv_heads: cfg.kv_heads,
        head_dim: cfg.head_dim,
    };
    let kv_len = t * cfg.kv_heads * cfg.head_dim;
    let k = random(gpu, kv_len, 10);
    let v = random(gpu, kv_len, 11);
    let attn_flops = 4 * cfg.batch * cfg.heads * cfg.seq_len * cfg.seq_len * cfg.head_dim;
    let dout = random(gpu, q_len, 12);
    let mut dq = zeros(gpu, q_len);
    let mut dk = zeros(gpu, kv_len);
    let mut dv = zeros(gpu, kv_len);
    // The f32 kernels, the tensor-core ones (TF32 math), then the bf16 flash ones.
    let kinds = [
        (AttnKernels::F32, ""),
        (AttnKernels::TensorCores, "_tf32"),
        (AttnKernels::Bf16, "_bf16"),
    ];
    let host = |x: &CudaSlice<f32>| gpu.download(x).expect("download");
    let (qh, kh, vh) = (host(&q), host(&k), host(&v));
    for (kernels, tag) in kinds {
        // q, k, v in the format these kernels read (bf16 for the flash ones).
        let qkv = attention::QkvBuffers::upload(gpu, kernels, [&qh, &kh, &vh]).expect("upload");
        let mut saved = zeros(gpu, attention::saved_len(&sh, kernels));
        let mut ds = zeros(gpu, attention::backward_scratch_len(&sh, kernels));
        bench(
            &mut g,
            gpu,
            &format!("attention_fwd{tag}"),
            flops(attn_flops),
            |gpu| {
                attention::forward(gpu, kernels, qkv.as_qkv(), &mut q_out, &mut saved, &sh)
                    .expect("attention forward")
            },
        );
        bench(
            &mut g,
            gpu,
            &format!("attention_bwd{tag}"),
            flops(2 * attn_flops),
            |gpu| {
                attention::backward(
                    gpu,
                    kernels,
                    qkv.as_qkv(),
                    &q_out,
                    &saved,
                    &dout,
                    &mut ds,
                    (&mut dq, &mut dk, &mut dv),
                    &sh,
                )
                .expect("attention backward")
            },
        );
    }
    drop((q, q_out, k, v, probs, dout, dq, dk, dv));

    // SwiGLU MLP activations over [T, intermediate].
    let gate = random(gpu, ti, 13);
    let up = random(gpu, ti, 14);
    let dact = random(gpu, ti, 15);
    let mut act = zeros(gpu, ti);
    let mut dgate = zeros(gpu, ti);
    let mut dup = zeros(gpu, ti);
    bench(&mut g, gpu, "silu_fwd", bytes(2 * ti), |gpu| {
        activation::silu_forward(gpu, &gate.as_view(), &mut act.as_view_mut())
            .expect("silu forward")
    });
    bench(&mut g, gpu, "silu_bwd", bytes(3 * ti), |gpu| {
        activation::silu_backward(
            gpu,
            &gate.as_view(),
            &dact.as_view(),
            &mut dgate.as_view_mut(),
        )
        .expect("silu backward")
    });
    bench(&mut g, gpu, "swiglu_fwd", bytes(3 * ti), |gpu| {
        activation::swiglu_forward(gpu, &gate.as_view(), &up.as_view(), &mut act.as_view_mut())
            .expect("swiglu forward")
    });
    bench(&mut g, gpu, "swiglu_bwd", bytes(5 * ti), |gpu| {
        activation::swiglu_backward(
            gpu,
            &gate.as_view(),
            &up.as_view(),
            &dact.as_view(),
            &mut dgate.as_view_mut(),
            &mut dup.as_view_mut(),
        )
        .expect("swiglu backward")
    });
    drop((up, dact, act, dgate, dup));

    // GEMMs of one layer and the LM head: y[T, out] = x[T, in] W^T.
    let w_up = random(gpu, inter * h, 16);
    let mut y_up = zeros(gpu, ti);
    for (name, engine) in [
        ("gemm_up_cublas_tf32", GemmEngine::Cublas(GemmMath::Tf32)),
        ("gemm_up_cublas_fp32", GemmEngine::Cublas(GemmMath::Fp32)),
        ("gemm_up_cublas_f16", GemmEngine::CublasF16),
        ("gemm_up_tiled", GemmEngine::Tiled),
    ] {
        bench(&mut g, gpu, name, flops(2 * t * h * inter), |gpu| {
            gemm::linear(gpu, engine, &x, &w_up, &mut y_up, (t, h, inter)).expect("gemm")
        });
    }
    let mut dx_up = zeros(gpu, th);
    let mut dw_up = zeros(gpu, inter * h);
    bench(
        &mut g,
        gpu,
        "gemm_up_bwd_cublas_fp32",
        flops(4 * t * h * inter),
        |gpu| {
            gemm::linear_backward(
                gpu,
                GemmEngine::Cublas(GemmMath::Fp32),
                &x,
                &w_up,
                &gate,
                &mut dx_up,
                &mut dw_up,
                (t, h, inter),
            )
            .expect("gemm backward")
        },
    );
    drop((dx_up, dw_up));
    let spec = GemmSpec::plain(t, inter, h);
    let w_plain = random(gpu, h * inter, 17);
    bench(
        &mut g,
        gpu,
        "gemm_plain_cublas_tf32",
        flops(2 * t * h * inter),
        |gpu| {
            gemm::gemm(
                gpu,
                GemmEngine::Cublas(GemmMath::Tf32),
                spec,
                &x,
                &w_plain,
                &mut y_up,
            )
            .expect("gemm")
        },
    );
    drop(w_plain);

    // NF4: the frozen up projection stored [inter, H] as 4-bit codes.
    let mut w_nf4 = Nf4Device::zeros(gpu, inter * h).expect("alloc");
    // Read 4 bytes per weight, write half a byte and a block maximum.
    let nf4_bytes = (inter * h) as u64 * 4 + (inter * h / 2) as u64 + (inter * h / 64) as u64 * F32;
    bench(
        &mut g,
        gpu,
        "nf4_quantize",
        Throughput::Bytes(nf4_bytes),
        |gpu| nf4::quantize(gpu, &w_up, &mut w_nf4).expect("nf4 quantize"),
    );
    let mut w_deq = zeros(gpu, inter * h);
    bench(
        &mut g,
        gpu,
        "nf4_dequantize",
        Throughput::Bytes(nf4_bytes),
        |gpu| nf4::dequantize(gpu, &w_nf4, &mut w_deq).expect("nf4 dequantize"),
    );
    drop(w_deq);
    bench(
        &mut g,
        gpu,
        "nf4_gemm_fwd",
        flops(2 * t * h * inter),
        |gpu| nf4::gemm_forward(gpu, &x, &w_nf4, &mut y_up, (t, inter, h)).expect("nf4 gemm"),
    );
    bench(
        &mut g,
        gpu,
        "nf4_gemm_bwd",
        flops(2 * t * h * inter),
        |gpu| nf4::gemm_backward(gpu, &gate, &w_nf4, &mut dx, (t, inter, h)).expect("nf4 gemm bwd"),
    );
    drop((w_nf4, w_up, y_up, gate));

    // Cross-entropy over the logits [T, vocab].
    let logits = random(gpu, t * vocab, 18);
    let targets = token_ids(gpu, t, vocab, 19);
    let mut losses = zeros(gpu, t);
    let mut loss = zeros(gpu, 1);
    let mut stats = cross_entropy::RowStats::new(gpu, t).expect("row stats");
    bench(&mut g, gpu, "cross_entropy_fwd", bytes(t * vocab), |gpu| {
        cross_entropy::forward(
            gpu,
            &logits.as_view(),
            t,
            vocab,
            &targets.as_view(),
            &mut losses.as_view_mut(),
            &mut loss.as_view_mut(),
            &mut stats,
        )
        .expect("cross-entropy forward")
    });
    let mut dlogits = zeros(gpu, t * vocab);
    bench(
        &mut g,
        gpu,
        "cross_entropy_bwd",
        bytes(2 * t * vocab),
        |gpu| {
            cross_entropy::backward(
                gpu,
                &logits.as_view(),
                t,
                vocab,
                &targets.as_view(),
                &stats,
                &mut dlogits.as_view_mut(),
            )
            .expect("cross-entropy backward")
        },
    );
    drop((logits, dlogits));

    // Optimizer side over every trainable (LoRA) parameter as one tensor.
    let n = cfg.trainable_params();
    let mut p = random(gpu, n, 20);
    let grad = random(gpu, n, 21);
    let mut m = zeros(gpu, n);
    let mut v2 = zeros(gpu, n);
    let hyper = AdamW {
        lr: 1e-4,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
    };
    // Read p, g, m, v; write p, m, v.
    bench(&mut g, gpu, "adamw_step", bytes(7 * n), |gpu| {
        adamw::step(
            gpu,
            &mut p.as_view_mut(),
            &grad.as_view(),
            &mut m.as_view_mut(),
            &mut v2.as_view_mut(),
            &hyper,
            1,
        )
        .expect("adamw step")
    });
    let mut ws = clip::SquaredSumWorkspace::new(gpu, &[n]).expect("workspace");
    let mut sq: CudaSlice<f64> = gpu.zeros(1).expect("alloc");
    bench(&mut g, gpu, "clip_squared_sum", bytes(n), |gpu| {
        clip::squared_sum(gpu, &[grad.as_view()], &mut ws, &mut sq.as_view_mut())
            .expect("squared sum")
    });
    let scale = random(gpu, 1, 22);
    bench(&mut g, gpu, "clip_apply", bytes(2 * n), |gpu| {
        clip::apply(gpu, &mut p.as_view_mut(), &scale.as_view()).expect("clip apply")
    });
    g.finish();
}

criterion_group!(benches, kernels);
criterion_main!(benches);
