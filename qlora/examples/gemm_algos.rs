//! Times every cuBLASLt algorithm its heuristic offers for the bf16 step's
//! GEMM shapes (qwen2.5-0.5b, 1,024 tokens) against `cublasGemmEx`'s
//! default pick, operands rotated through more memory than L2 holds, each
//! as launches captured in a CUDA graph and replayed (the GPU's time, not
//! the host's). What it measured: docs/src/performance/step-time.md.
//!
//! ```text
//! cargo run --release -p qlora --example gemm_algos [-- <algos per shape>]
//! ```
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublas::sys as blas_sys;
use cudarc::cublas::CudaBlas;
use cudarc::cublaslt::{result as lt, sys as lt_sys};
use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};

type AnyError = Box<dyn std::error::Error>;

/// One GEMM of the step, row-major: `out[rows, n] (+)= a[rows, k] op(w)`.
struct Shape {
    name: &'static str,
    n: usize,
    k: usize,
    /// `w` stored `[n, k]` (a forward, `x W^T`) or `[k, n]` (an input
    /// gradient, `dy W`).
    forward: bool,
    bf16_out: bool,
    accumulate: bool,
    /// Weights and outputs as `batch` matrices one after another, the
    /// input shared (gate and up as one launch).
    batch: usize,
}

const ROWS: usize = 1024;

fn shapes() -> Vec<Shape> {
    let s = |name, n, k, forward, bf16_out, accumulate| Shape {
        name,
        n,
        k,
        forward,
        bf16_out,
        accumulate,
        batch: 1,
    };
    vec![
        s("fwd qkv+lora", 1184, 896, true, false, false),
        s("fwd o (+x)", 896, 896, true, false, true),
        s("fwd gate|up", 4864, 896, true, true, false),
        s("fwd gate+up", 9728, 896, true, true, false),
        Shape {
            batch: 2,
            ..s("fwd gate,up batched", 4864, 896, true, true, false)
        },
        s("fwd down (+x)", 896, 4864, true, false, true),
        s("bwd down", 4864, 896, false, false, false),
        s("bwd down bf16-out", 4864, 896, false, true, false),
        s("bwd gate", 896, 4864, false, false, false),
        s("bwd up (+)", 896, 4864, false, false, true),
        s("bwd gate+up", 896, 9728, false, false, false),
        s("bwd o", 896, 896, false, false, false),
        s("bwd qkv", 896, 1152, false, false, false),
    ]
}

/// The column-major problem cuBLAS sees: `C[m, n] = op(A) op(B)`.
struct Problem {
    m: u64,
    n: u64,
    k: u64,
    trans_a: bool,
    lda: i64,
    ldb: i64,
}

impl Shape {
    fn problem(&self) -> Problem {
        // Row-major out^T = op(W) a^T: cuBLAS's A is our weight.
        let (m, k) = (self.n as u64, self.k as u64);
        Problem {
            m,
            n: ROWS as u64,
            k,
            trans_a: self.forward,
            lda: if self.forward { k as i64 } else { m as i64 },
            ldb: k as i64,
        }
    }
}

struct Buffers {
    a: Vec<CudaSlice<u16>>,
    w: Vec<CudaSlice<u16>>,
    out: Vec<CudaSlice<u8>>,
}

fn buffers(stream: &Arc<CudaStream>, s: &Shape, sets: usize) -> Result<Buffers, AnyError> {
    let mut b = Buffers {
        a: vec![],
        w: vec![],
        out: vec![],
    };
    let ones = |len: usize| vec![0x3f80u16; len];
    for _ in 0..sets {
        b.a.push(stream.clone_htod(&ones(ROWS * s.k))?);
        b.w.push(stream.clone_htod(&ones(s.batch * s.n * s.k))?);
        b.out
            .push(stream.alloc_zeros::<u8>(s.batch * ROWS * s.n * 4)?);
    }
    Ok(b)
}

fn out_type(s: &Shape) -> blas_sys::cudaDataType {
    if s.bf16_out {
        blas_sys::cudaDataType::CUDA_R_16BF
    } else {
        blas_sys::cudaDataType::CUDA_R_32F
    }
}

fn op(t: bool) -> blas_sys::cublasOperation_t {
    if t {
        blas_sys::cublasOperation_t::CUBLAS_OP_T
    } else {
        blas_sys::cublasOperation_t::CUBLAS_OP_N
    }
}

/// Mean microseconds of one of `reps` launches of `launch(set)`, sets
/// rotated, captured in a CUDA graph and replayed: the GPU's time alone, not
/// the host's (a small GEMM takes less time on the GPU than its launch call
/// on the host).
fn time_us(
    stream: &Arc<CudaStream>,
    sets: usize,
    reps: usize,
    mut launch: impl FnMut(usize) -> Result<(), AnyError>,
) -> Result<f64, AnyError> {
    for i in 0..sets {
        launch(i)?;
    }
    stream.synchronize()?;
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let mut outcome = Ok(());
    for i in 0..reps {
        outcome = launch(i % sets);
        if outcome.is_err() {
            break;
        }
    }
    let graph = stream.end_capture(CUgraphInstantiate_flags(0));
    outcome?;
    let graph = graph?.ok_or("stream capture produced no graph")?;
    graph.launch()?;
    let ctx = stream.context();
    let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let (start, end) = (ctx.new_event(flags)?, ctx.new_event(flags)?);
    start.record(stream)?;
    for _ in 0..ROUNDS {
        graph.launch()?;
    }
    end.record(stream)?;
    end.synchronize()?;
    Ok(start.elapsed_ms(&end)? as f64 * 1000.0 / (reps * ROUNDS) as f64)
}

const ROUNDS: usize = 5;

/// The cuBLAS default pick (`cublasGemmStridedBatchedEx`, or
/// `cublasGemmEx` for one matrix).
fn default_us(
    stream: &Arc<CudaStream>,
    blas: &CudaBlas,
    s: &Shape,
    b: &mut Buffers,
) -> Result<f64, AnyError> {
    let p = s.problem();
    let (alpha, beta) = (1.0f32, if s.accumulate { 1.0f32 } else { 0.0 });
    let bf = blas_sys::cudaDataType::CUDA_R_16BF;
    let sets = b.a.len();
    time_us(stream, sets, REPS, |i| {
        let (a, _g1) = b.a[i].device_ptr(stream);
        let (w, _g2) = b.w[i].device_ptr(stream);
        let (c, _g3) = b.out[i].device_ptr_mut(stream);
        let (al, be) = ((&alpha as *const f32).cast(), (&beta as *const f32).cast());
        let (m, n, k) = (p.m as i32, p.n as i32, p.k as i32);
        let (ta, tb) = (op(p.trans_a), op(false));
        let compute = blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F;
        let algo = blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT;
        let (w, a, c) = (w as *const c_void, a as *const c_void, c as *mut c_void);
        let (lda, ldb, ldc) = (p.lda as i32, p.ldb as i32, p.m as i32);
        // SAFETY: every buffer holds what the shape addresses.
        unsafe {
            if s.batch == 1 {
                cudarc::cublas::result::gemm_ex(
                    *blas.handle(),
                    ta,
                    tb,
                    m,
                    n,
                    k,
                    al,
                    w,
                    bf,
                    lda,
                    a,
                    bf,
                    ldb,
                    be,
                    c,
                    out_type(s),
                    ldc,
                    compute,
                    algo,
                )?
            } else {
                cudarc::cublas::result::gemm_strided_batched_ex(
                    *blas.handle(),
                    ta,
                    tb,
                    m,
                    n,
                    k,
                    al,
                    w,
                    bf,
                    lda,
                    (s.n * s.k) as i64,
                    a,
                    bf,
                    ldb,
                    0,
                    be,
                    c,
                    out_type(s),
                    ldc,
                    (ROWS * s.n) as i64,
                    s.batch as i32,
                    compute,
                    algo,
                )?
            }
        };
        Ok(())
    })
}

/// Each algorithm cuBLASLt's heuristic offers (at most `wanted`, each
/// needing at most `ws_limit` bytes of workspace): its time.
#[allow(clippy::too_many_arguments)]
fn lt_us(
    stream: &Arc<CudaStream>,
    handle: lt_sys::cublasLtHandle_t,
    s: &Shape,
    b: &mut Buffers,
    workspace: &mut CudaSlice<u8>,
    ws_limit: usize,
    wanted: i32,
) -> Result<Vec<f64>, AnyError> {
    let p = s.problem();
    let (alpha, beta) = (1.0f32, if s.accumulate { 1.0f32 } else { 0.0 });
    let bf = lt_sys::cudaDataType::CUDA_R_16BF;
    let ot = if s.bf16_out {
        bf
    } else {
        lt_sys::cudaDataType::CUDA_R_32F
    };
    let (ar, ac) = if p.trans_a { (p.k, p.m) } else { (p.m, p.k) };
    let a_l = lt::create_matrix_layout(bf, ar, ac, p.lda)?;
    let b_l = lt::create_matrix_layout(bf, p.k, p.n, p.ldb)?;
    let c_l = lt::create_matrix_layout(ot, p.m, p.n, p.m as i64)?;
    if s.batch > 1 {
        let count = s.batch as i32;
        let strides = [
            (a_l, (s.n * s.k) as i64),
            (b_l, 0i64),
            (c_l, (ROWS * s.n) as i64),
        ];
        for (l, stride) in strides {
            // SAFETY: the attributes are an i32 and an i64.
            unsafe {
                lt::set_matrix_layout_attribute(
                    l,
                    lt_sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                    (&count as *const i32).cast(),
                    4,
                )?;
                lt::set_matrix_layout_attribute(
                    l,
                    lt_sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                    (&stride as *const i64).cast(),
                    8,
                )?;
            }
        }
    }
    let desc = lt::create_matmul_desc(
        lt_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        lt_sys::cudaDataType::CUDA_R_32F,
    )?;
    let ta: i32 = if p.trans_a { 1 } else { 0 };
    // SAFETY: the attribute is an i32 (cublasOperation_t).
    unsafe {
        lt::set_matmul_desc_attribute(
            desc,
            lt_sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
            (&ta as *const i32).cast(),
            4,
        )?
    };
    let pref = lt::create_matmul_pref()?;
    // SAFETY: the attribute is a u64 byte count.
    unsafe {
        lt::set_matmul_pref_attribute(
            pref,
            lt_sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            (&(ws_limit as u64) as *const u64).cast(),
            8,
        )?
    };
    // SAFETY: plain C data, zero is a valid bit pattern.
    let zero = unsafe { std::mem::zeroed::<lt_sys::cublasLtMatmulHeuristicResult_t>() };
    let mut results = vec![zero; wanted as usize];
    let mut found = 0;
    // SAFETY: the descriptors are live, `results` has `wanted` entries.
    unsafe {
        lt_sys::cublasLtMatmulAlgoGetHeuristic(
            handle,
            desc,
            a_l,
            b_l,
            c_l,
            c_l,
            pref,
            wanted,
            results.as_mut_ptr(),
            &mut found,
        )
        .result()?
    };
    let sets = b.a.len();
    let mut times = vec![];
    for r in results.iter().take(found as usize) {
        let t = time_us(stream, sets, REPS, |i| {
            let (a, _g1) = b.a[i].device_ptr(stream);
            let (w, _g2) = b.w[i].device_ptr(stream);
            let (c, _g3) = b.out[i].device_ptr_mut(stream);
            let (wsp, _g4) = workspace.device_ptr_mut(stream);
            let (al, be) = ((&alpha as *const f32).cast(), (&beta as *const f32).cast());
            let (w, a) = (w as *const c_void, a as *const c_void);
            // SAFETY: as for gemm_ex; the workspace holds what the
            // algorithm asked for.
            unsafe {
                lt::matmul(
                    handle,
                    desc,
                    al,
                    be,
                    w,
                    a_l,
                    a,
                    b_l,
                    c as *const c_void,
                    c_l,
                    c as *mut c_void,
                    c_l,
                    &r.algo,
                    wsp as *mut c_void,
                    r.workspaceSize,
                    stream.cu_stream() as _,
                )?
            };
            Ok(())
        });
        times.push(t.unwrap_or(f64::NAN));
    }
    Ok(times)
}

const REPS: usize = 200;

fn best(times: &[f64]) -> (usize, f64) {
    times
        .iter()
        .enumerate()
        .filter(|(_, t)| t.is_finite())
        .fold(
            (0, f64::INFINITY),
            |acc, (i, &t)| if t < acc.1 { (i, t) } else { acc },
        )
}

fn main() -> Result<(), AnyError> {
    let wanted: i32 = std::env::args().nth(1).map_or(Ok(32), |a| a.parse())?;
    let ctx = CudaContext::new(0)?;
    // SAFETY: before any stream exists; one stream orders all the work.
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx.new_stream()?;
    let blas = CudaBlas::new(stream.clone())?;
    let handle = lt::create_handle()?;
    let ws_bytes = 32usize << 20;
    let mut workspace = stream.alloc_zeros::<u8>(ws_bytes)?;
    let mut blas_workspace = stream.alloc_zeros::<u8>(ws_bytes)?;
    {
        let (ptr, _g) = blas_workspace.device_ptr_mut(&stream);
        // SAFETY: a live handle; the buffer outlives every GEMM below.
        unsafe { blas_sys::cublasSetWorkspace_v2(*blas.handle(), ptr as *mut c_void, ws_bytes) }
            .result()?;
    }
    println!("graph-timed us: shape, cublasGemmEx default, cuBLASLt heuristic #0 without and with 32 MiB workspace, best of the heuristic's list");
    println!("shape                 default  lt0/ws0  lt0/ws32  best(idx/of)  gain  TFLOP/s");
    for s in shapes() {
        let mut b = buffers(&stream, &s, 8)?;
        let default = default_us(&stream, &blas, &s, &mut b)?;
        let no_ws = lt_us(&stream, handle, &s, &mut b, &mut workspace, 0, 1)?;
        let times = lt_us(
            &stream,
            handle,
            &s,
            &mut b,
            &mut workspace,
            ws_bytes,
            wanted,
        )?;
        let (best_i, best_t) = best(&times);
        let flop = 2.0 * (s.batch * ROWS * s.n * s.k) as f64;
        println!(
            "{:<20} {:>8.2} {:>8.2} {:>9.2} {:>7.2} ({}/{}) {:>5.3}  {:.0} -> {:.0}",
            s.name,
            default,
            no_ws.first().copied().unwrap_or(f64::NAN),
            times.first().copied().unwrap_or(f64::NAN),
            best_t,
            best_i,
            times.len(),
            default / best_t,
            flop / default / 1e6,
            flop / best_t / 1e6,
        );
    }
    Ok(())
}
