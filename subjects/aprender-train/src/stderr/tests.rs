//! Transcripts built from aprender-train 0.72.3's format strings (each line
//! cites the `eprintln!` it instantiates; T: = aprender-train-0.72.3/src/,
//! G: = aprender-gpu-0.72.3/src/).

use super::*;

/// An un-graphed two-step run of `qwen2-tiny-4l`, shortened to one
/// compile line per pre-warm and one upload trace pair.
const UNGRAPHED: &str = "\
[GPU-SHARE] VRAM reserved: 560 MB for instruct-qlora (gpu: GPU-0c6d9b1e-7f3a-4d1c-9c55-1e2f3a4b5c6d)
[CUDA] cuBLAS initialized — forward TF32 tensor cores (41x vs SIMD)
[CUDA] Kernel cache initialized for target: sm_90
[CUDA] Initialized: NVIDIA H100 80GB HBM3 (85.0 GB)
[CUDA] Skipping PTX pre-warm for 4 GEMM kernels (cuBLAS active — PMAT-700)
[FWD-CACHE] Compiling 'batched_rmsnorm_fwd_512_eps897988541' (ptx_len=5321)
[FWD-CACHE] OK 'batched_rmsnorm_fwd_512_eps897988541'
  ✓ Backward rope kernel pre-warmed in forward cache
[CUDA] Pre-warmed 31 forward kernels (JIT compiled before block upload)
[CUDA] NF4 quantization enabled — frozen weights will be 4-bit (~8x compression)
[CUDA] Pre-warmed 12 LoRA backward kernels
[BWD-PREWARM] Called with lora_rank=16, hidden=512, inter=1408
[BWD-CACHE] Compiling 'rms_norm_backward_512' (ptx_len=7012)
[BWD-CACHE] OK 'rms_norm_backward_512'
[CUDA] Backward kernels pre-warmed successfully
[TRACE] dequant n=512 k=512 len=262144 nonzero=262144 first5=[0.01, -0.02, 0.0, 0.03, -0.01]
[TRACE] uploaded ptr=140234567680 len=262144 copy_ok=true nonzero=262144 verify[:5]=[0.01, -0.02, 0.0, 0.03, -0.01]
[CUDA] Uploaded 4 transformer layers to GPU (max_seq_len=256)
[CUDA] GPU-resident embeddings: 2MB (VRAM free: 80123MB)
[CUDA] GPU training state initialized: 4 layers, 131072 buf_size, embed=[1024x512] on GPU (NF4 QLoRA mode)
[CUDA] NF4 QLoRA training initialized: 4 layers, rank=16, scale=2.00
[BWD-CACHE] Compiling 'batched_rmsnorm_fwd_512' (ptx_len=4980)
[BWD-CACHE] OK 'batched_rmsnorm_fwd_512'
[CUDA] loss=6.9512 (finite, proceeding with backward)
[CUDA] loss=6.8807 (finite, proceeding with backward)
";
// Sources, line by line: cuda_init.rs:32-35; T:autograd/cuda_forward/cache.rs:75, 84;
// cuda_init.rs:116-120; cache.rs:331, 167, 182, 802, 460; cuda_init.rs:147-149;
// cache.rs:651; T:autograd/cuda_backward/cache.rs:176, 101, 121; cuda_init.rs:180;
// T:transformer/cuda_block.rs:2984-2988, 3007; cuda_init.rs:355-359, 437-439, 462-465,
// 539-544; bwd cache.rs:101, 121; T:finetune/instruct_pipeline/training.rs:229 (twice).

/// What a graphed run adds around its first step
/// (T:finetune/gpu_backward_fallback.rs:114, T:finetune/instruct_pipeline/cuda_forward.rs:172-175,
/// T:finetune/instruct_pipeline/backward.rs:236-238).
const GRAPHED_STEP: &str = "\
[CUDA] cuBLAS workspace pre-allocated: 32 MB
[CUDA] Graph captured: 4 layers, seq_len=256
[CUDA] loss=6.9315 (finite, proceeding with backward)
[CUDA] Backward graph captured: seq_len=256, 4 layers
[CUDA] loss=6.9315 (finite, proceeding with backward)
";

#[test]
fn a_clean_run_reads_as_device_prewarm_upload_and_losses() {
    let witness = StderrWitness::parse(UNGRAPHED);
    assert_eq!(witness.device.as_deref(), Some("NVIDIA H100 80GB HBM3"));
    assert_eq!(witness.kernel_target.as_deref(), Some("sm_90"));
    assert_eq!(witness.cublas, Some(true));
    let prewarm: Vec<_> = witness.prewarm.iter().map(|p| p.value).collect();
    assert_eq!(
        prewarm,
        [
            Prewarm::CublasGemmsSkipped,
            Prewarm::Forward { kernels: 31 },
            Prewarm::LoraBackward { kernels: 12 },
            Prewarm::BackwardCache
        ]
    );
    assert_eq!(witness.upload, Some(Located { line: 18, value: 4 }));
    assert_eq!(witness.losses, [6.9512, 6.8807]);
    assert!(witness.problems.is_empty(), "{:?}", witness.problems);
    assert!(witness.module_load_detours.is_empty());
    witness.check(2).unwrap();
}

#[test]
fn compilations_after_the_upload_line_are_told_apart() {
    let witness = StderrWitness::parse(UNGRAPHED);
    assert_eq!(witness.compilations.len(), 3);
    assert_eq!(
        witness.compilations[0],
        Compilation {
            line: 6,
            cache: KernelCache::Forward,
            name: "batched_rmsnorm_fwd_512_eps897988541".into(),
            ptx_len: Some(5321),
            after_upload: false,
        }
    );
    let after = witness.compilations_after_upload();
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].name, "batched_rmsnorm_fwd_512");
    assert_eq!((after[0].cache, after[0].line), (KernelCache::Backward, 22));
}

#[test]
fn graph_captures_are_read_with_their_shapes() {
    let witness = StderrWitness::parse(&format!("{UNGRAPHED}{GRAPHED_STEP}"));
    let captures: Vec<_> = witness.captures.iter().map(|c| c.value).collect();
    assert_eq!(
        captures,
        [
            Capture::CublasWorkspace,
            Capture::Forward {
                layers: 4,
                seq_len: 256
            },
            Capture::Backward {
                layers: 4,
                seq_len: 256
            },
        ]
    );
    assert_eq!(witness.losses.len(), 4);
    witness.check(4).unwrap();
}

#[test]
fn a_missing_loss_line_is_an_error() {
    let witness = StderrWitness::parse(UNGRAPHED);
    let err = witness.check(3).unwrap_err();
    assert!(
        matches!(
            err,
            Error::LossLines {
                expected: 3,
                found: 2
            }
        ),
        "{err}"
    );
}

/// Every line that leaves the GPU path or reports a failure, with its source.
const PROBLEMS: [(&str, ProblemKind); 22] = [
    // T:finetune/instruct_pipeline/cuda_init.rs:39, as printed on a machine whose
    // nvidia-smi fails (captured from the probe here).
    ("[GPU-SHARE] VRAM guard denied: insufficient VRAM: need 522 MB, available 0 MB (reserved 0 MB / total 0 MB) — falling back to CPU", ProblemKind::CpuFallback),
    // cuda_init.rs:110
    ("[CUDA] No CUDA runtime detected — using CPU", ProblemKind::CpuFallback),
    // cuda_init.rs:124
    ("[CUDA] Failed to create trainer: CUDA not available: DeviceNotFound(0, 0) — using CPU", ProblemKind::CpuFallback),
    // cuda_init.rs:174-175 (two lines; the second is the verdict)
    ("[CUDA] Failed to pre-warm backward cache kernels: KernelError(\"x\")", ProblemKind::Failure),
    ("[CUDA] STOP THE LINE: backward kernel pre-warming failed.", ProblemKind::CpuFallback),
    // cuda_init.rs:348
    ("[CUDA] Failed to upload layer 2 to GPU: OOM — falling back to CPU", ProblemKind::CpuFallback),
    // cuda_init.rs:404, 447, 523
    ("[CUDA] GPU training init failed (layer input alloc): OOM", ProblemKind::Failure),
    ("[CUDA] Skipping GPU embeddings (600MB > 512MB free)", ProblemKind::CpuFallback),
    ("[CUDA] NF4 LoRA grad workspace alloc failed: OOM", ProblemKind::Failure),
    // T:finetune/instruct_pipeline/training.rs:152-156, 189, 233, 241, 442
    ("[CUDA] sample skipped: prompt (256 tokens) fills the 256-token training window — 0 response tokens to train on (raise --max-seq-len)", ProblemKind::SkippedSample),
    ("[CUDA] GPU forward failed, falling back to CPU for this step", ProblemKind::CpuFallback),
    ("[CUDA] NaN/Inf loss detected (loss=NaN) — skipping backward pass", ProblemKind::NonFiniteLoss),
    ("[CUDA] fused causal cross-entropy failed — falling back to CPU", ProblemKind::CpuFallback),
    ("[PMAT-420] backward: grad_hidden len=131072 nonzero=131072 first5=[0.1]", ProblemKind::CpuFallback),
    // T:finetune/instruct_pipeline/cuda_forward.rs:150-151, 530
    ("[CUDA] Layer 0 forward failed: capture invalidated (seq_len=200 in=1 out=1 hidden=512)", ProblemKind::Failure),
    ("[RES-FALSE] BT GEMM failed", ProblemKind::CpuFallback),
    // cuda_forward.rs:181, T:finetune/instruct_pipeline/backward.rs:162, T:finetune/backward_graph.rs:44
    ("[CUDA] Graph instantiate failed: 901 — using non-graph path", ProblemKind::GraphFailure),
    ("[CUDA] Backward graph capture begin failed: 900 — falling back to ungraphed", ProblemKind::GraphFailure),
    ("[CUDA] Backward graph replay failed: 700", ProblemKind::GraphFailure),
    // T:autograd/cuda_backward/cache.rs:118, T:autograd/cuda_forward/cache.rs:79
    ("[BWD-CACHE] FAILED 'batched_rmsnorm_fwd_512': ModuleLoad(\"x\")", ProblemKind::Failure),
    ("[CUDA] cuBLAS not available (LibraryNotFound), using PTX GEMMs", ProblemKind::NoCublas),
    // G:driver/module.rs:482
    ("[PTX-JIT] Both attempts failed for batched_rmsnorm_fwd", ProblemKind::Failure),
];

#[test]
fn every_catalogued_problem_line_is_classified() {
    for (line, kind) in PROBLEMS {
        let witness = StderrWitness::parse(&format!("{UNGRAPHED}{line}\n"));
        let problem = witness.problems.first();
        assert_eq!(problem.map(|p| p.kind), Some(kind), "{line}");
        assert_eq!(problem.map(|p| p.line), Some(26), "{line}");
        // A non-finite loss line reports one more train_step's loss.
        let train_steps = 2 + usize::from(kind == ProblemKind::NonFiniteLoss);
        match witness.check(train_steps) {
            Err(Error::Stderr { line: 26, .. }) => assert!(kind.is_trial_error(), "{line}"),
            Ok(()) => assert!(!kind.is_trial_error(), "{line}"),
            Err(err) => panic!("{line}: {err}"),
        }
    }
}

#[test]
fn graph_failures_and_non_finite_losses_are_evidence_not_errors() {
    let evidence = [ProblemKind::NonFiniteLoss, ProblemKind::GraphFailure];
    for (_, kind) in PROBLEMS {
        assert_eq!(kind.is_trial_error(), !evidence.contains(&kind), "{kind}");
    }
    let mut text = UNGRAPHED.replace(
        "[CUDA] loss=6.8807 (finite, proceeding with backward)",
        "[CUDA] NaN/Inf loss detected (loss=NaN) — skipping backward pass",
    );
    text.push_str("[CUDA] Backward graph end_capture failed: 901\n");
    let witness = StderrWitness::parse(&text);
    let kinds: Vec<_> = witness.problems.iter().map(|p| p.kind).collect();
    assert_eq!(kinds, evidence);
    // The NaN step reported its loss as non-finite: both steps are accounted for.
    assert_eq!(witness.losses.len(), 1);
    witness.check(2).unwrap();
    assert!(matches!(
        witness.check(3),
        Err(Error::LossLines { found: 2, .. })
    ));
}

/// Lines that mention failure without meaning one for the trial.
const NOT_PROBLEMS: [&str; 5] = [
    // G:driver/module.rs:343, 446-449, 474: the module still loads another way.
    "[PTX-CACHE] Linker compilation failed: CUDA_ERROR_INVALID_PTX, falling through to legacy JIT",
    "[PTX-JIT] Try 1 failed: rope_fwd, target: sm_90, PTX: 1234 bytes, result: 218",
    "[PTX-JIT] Fallback succeeded for rope_fwd",
    // Another program's log line, not aprender-train's.
    "[2026-05-01T10:00:00Z ERROR falsify] helper failed, using CPU",
    // T:finetune/instruct_pipeline/cuda_init.rs:147-149
    "[CUDA] NF4 quantization enabled — frozen weights will be 4-bit (~8x compression)",
];

#[test]
fn detours_and_foreign_lines_are_not_problems() {
    for line in NOT_PROBLEMS {
        let witness = StderrWitness::parse(line);
        assert!(witness.problems.is_empty(), "{line}");
    }
    let detours = StderrWitness::parse(&NOT_PROBLEMS[..3].join("\n"));
    assert_eq!(detours.module_load_detours.len(), 3);
}

#[test]
fn a_failed_upload_verification_is_a_failure() {
    // T:transformer/cuda_block.rs:3007 with copy_ok=false.
    let line = "[TRACE] uploaded ptr=1 len=4 copy_ok=false nonzero=0 verify[:5]=[]";
    let witness = StderrWitness::parse(line);
    assert_eq!(witness.problems[0].kind, ProblemKind::Failure);
}
