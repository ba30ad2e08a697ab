//! Times every cuBLASLt algorithm its heuristic offers for the bf16 step's
//! GEMM shapes (qwen2.5-0.5b, 1,024 tokens) against `cublasGemmEx`'s
//! default pick, operands rotated through more memory than L2 holds, each
//! as launches captured in a CUDA graph and replayed (the GPU's time, not
//! the host's). What it measured: docs/src/performance/step-time.md.
//!
//! ```text
//! cargo run --release -p qlora --example gemm_algos [-- <algos per shape>]
//! cargo run --release -p qlora --example gemm_algos -- --search [<algos per shape>]
//! cargo run --release -p qlora --example gemm_algos -- --search --only head
//! ```
//!
//! `--only <text>` keeps the shapes whose name holds `<text>`.
//!
//! `--search` also times every configuration one attribute away from each
//! of the heuristic's algorithms and prints the three fastest with whether
//! each writes `cublasGemmEx`'s bits: what `qlora::ops::gemm_tuned` pins.
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
    rows: usize,
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

/// The layers' rows: the step's tokens (batch 4, seq 256).
const ROWS: usize = 1024;
/// The bf16 head's rows: one chunk (`HEAD_CHUNK_ROWS` in the trainer).
const HEAD_ROWS: usize = 512;
/// qwen2.5-0.5b's vocabulary.
const VOCAB: usize = 151_936;

fn shapes() -> Vec<Shape> {
    let s = |name, n, k, forward, bf16_out, accumulate| Shape {
        name,
        rows: ROWS,
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
        Shape {
            rows: HEAD_ROWS,
            ..s("head logits", VOCAB, 896, true, true, false)
        },
        Shape {
            rows: HEAD_ROWS,
            ..s("head bwd dnf", 896, VOCAB, false, false, false)
        },
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
            n: self.rows as u64,
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
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut random = |len: usize| -> Vec<u16> {
        (0..len)
            .map(|_| {
                // xorshift64; the top 24 bits as a value in [-1, 1), its bf16
                // bits by truncation.
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let x = (seed >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
                (x.to_bits() >> 16) as u16
            })
            .collect()
    };
    for _ in 0..sets {
        b.a.push(stream.clone_htod(&random(s.rows * s.k))?);
        b.w.push(stream.clone_htod(&random(s.batch * s.n * s.k))?);
        b.out
            .push(stream.alloc_zeros::<u8>(s.batch * s.rows * s.n * 4)?);
    }
    Ok(b)
}

/// The first operand set's output of one `launch`, into zeros.
fn output(
    stream: &Arc<CudaStream>,
    b: &mut Buffers,
    launch: impl FnOnce(&mut Buffers) -> Result<(), AnyError>,
) -> Result<Vec<u8>, AnyError> {
    stream.memset_zeros(&mut b.out[0])?;
    launch(b)?;
    Ok(stream.clone_dtoh(&b.out[0])?)
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
    let sets = b.a.len();
    time_us(stream, sets, REPS, |i| {
        default_launch(stream, blas, s, b, i)
    })
}

/// One launch of the cuBLAS default pick on operand set `i`.
fn default_launch(
    stream: &Arc<CudaStream>,
    blas: &CudaBlas,
    s: &Shape,
    b: &mut Buffers,
    i: usize,
) -> Result<(), AnyError> {
    let p = s.problem();
    let (alpha, beta) = (1.0f32, if s.accumulate { 1.0f32 } else { 0.0 });
    let bf = blas_sys::cudaDataType::CUDA_R_16BF;
    {
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
                    (s.rows * s.n) as i64,
                    s.batch as i32,
                    compute,
                    algo,
                )?
            }
        };
        Ok(())
    }
}

/// A problem's cuBLASLt descriptors: the matmul, and the layouts of A
/// (our weight), B (our input) and C = D (our output).
struct Plan {
    desc: lt_sys::cublasLtMatmulDesc_t,
    a_l: lt_sys::cublasLtMatrixLayout_t,
    b_l: lt_sys::cublasLtMatrixLayout_t,
    c_l: lt_sys::cublasLtMatrixLayout_t,
    alpha: f32,
    beta: f32,
}

fn plan(s: &Shape) -> Result<Plan, AnyError> {
    let p = s.problem();
    let bf = lt_sys::cudaDataType::CUDA_R_16BF;
    let ot = lt_out_type(s);
    let (ar, ac) = if p.trans_a { (p.k, p.m) } else { (p.m, p.k) };
    let a_l = lt::create_matrix_layout(bf, ar, ac, p.lda)?;
    let b_l = lt::create_matrix_layout(bf, p.k, p.n, p.ldb)?;
    let c_l = lt::create_matrix_layout(ot, p.m, p.n, p.m as i64)?;
    if s.batch > 1 {
        let count = s.batch as i32;
        let strides = [
            (a_l, (s.n * s.k) as i64),
            (b_l, 0i64),
            (c_l, (s.rows * s.n) as i64),
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
    let beta = if s.accumulate { 1.0 } else { 0.0 };
    Ok(Plan {
        desc,
        a_l,
        b_l,
        c_l,
        alpha: 1.0,
        beta,
    })
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: each descriptor was made by `plan` and is destroyed once;
        // no matmul uses it after the plan.
        unsafe {
            let _ = lt::destroy_matmul_desc(self.desc);
            for l in [self.a_l, self.b_l, self.c_l] {
                let _ = lt::destroy_matrix_layout(l);
            }
        }
    }
}

fn lt_out_type(s: &Shape) -> lt_sys::cudaDataType {
    if s.bf16_out {
        lt_sys::cudaDataType::CUDA_R_16BF
    } else {
        lt_sys::cudaDataType::CUDA_R_32F
    }
}

/// The time of `algo` on `pl` (`ws` bytes of `workspace`), or NaN where
/// cuBLASLt refuses it.
#[allow(clippy::too_many_arguments)]
fn time_algo(
    stream: &Arc<CudaStream>,
    handle: lt_sys::cublasLtHandle_t,
    pl: &Plan,
    algo: &lt_sys::cublasLtMatmulAlgo_t,
    ws: usize,
    b: &mut Buffers,
    workspace: &mut CudaSlice<u8>,
    reps: usize,
) -> f64 {
    let sets = b.a.len();
    let t = time_us(stream, sets, reps, |i| {
        lt_launch(stream, handle, pl, (algo, ws), b, workspace, i)
    });
    t.unwrap_or(f64::NAN)
}

/// One launch of `algo` (needing `ws` bytes of workspace) on operand set `i`.
fn lt_launch(
    stream: &Arc<CudaStream>,
    handle: lt_sys::cublasLtHandle_t,
    pl: &Plan,
    (algo, ws): (&lt_sys::cublasLtMatmulAlgo_t, usize),
    b: &mut Buffers,
    workspace: &mut CudaSlice<u8>,
    i: usize,
) -> Result<(), AnyError> {
    {
        let (a, _g1) = b.a[i].device_ptr(stream);
        let (w, _g2) = b.w[i].device_ptr(stream);
        let (c, _g3) = b.out[i].device_ptr_mut(stream);
        let (wsp, _g4) = workspace.device_ptr_mut(stream);
        let (al, be) = (
            (&pl.alpha as *const f32).cast(),
            (&pl.beta as *const f32).cast(),
        );
        let (w, a) = (w as *const c_void, a as *const c_void);
        // SAFETY: as for gemm_ex; the workspace holds what the algorithm
        // asked for.
        unsafe {
            lt::matmul(
                handle,
                pl.desc,
                al,
                be,
                w,
                pl.a_l,
                a,
                pl.b_l,
                c as *const c_void,
                pl.c_l,
                c as *mut c_void,
                pl.c_l,
                algo,
                wsp as *mut c_void,
                ws,
                stream.cu_stream() as _,
            )?
        };
        Ok(())
    }
}

/// The heuristic's first `wanted` algorithms for `pl`, each needing at
/// most `ws_limit` bytes of workspace.
fn heuristic(
    handle: lt_sys::cublasLtHandle_t,
    pl: &Plan,
    ws_limit: usize,
    wanted: i32,
) -> Result<Vec<lt_sys::cublasLtMatmulHeuristicResult_t>, AnyError> {
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
            pl.desc,
            pl.a_l,
            pl.b_l,
            pl.c_l,
            pl.c_l,
            pref,
            wanted,
            results.as_mut_ptr(),
            &mut found,
        )
        .result()?
    };
    results.truncate(found as usize);
    Ok(results)
}

/// Each algorithm cuBLASLt's heuristic offers (at most `wanted`, each
/// needing at most `ws_limit` bytes of workspace): its time.
fn lt_us(
    stream: &Arc<CudaStream>,
    handle: lt_sys::cublasLtHandle_t,
    pl: &Plan,
    b: &mut Buffers,
    workspace: &mut CudaSlice<u8>,
    (ws_limit, wanted): (usize, i32),
) -> Result<Vec<f64>, AnyError> {
    let results = heuristic(handle, pl, ws_limit, wanted)?;
    Ok(results
        .iter()
        .map(|r| {
            time_algo(
                stream,
                handle,
                pl,
                &r.algo,
                r.workspaceSize,
                b,
                workspace,
                REPS,
            )
        })
        .collect())
}

/// An array capability of `algo` (tile or stages ids), empty where it
/// has none.
fn cap_u32s(
    algo: &lt_sys::cublasLtMatmulAlgo_t,
    attr: lt_sys::cublasLtMatmulAlgoCapAttributes_t,
) -> Vec<u32> {
    let mut size = 0usize;
    // SAFETY: a null buffer of size 0 asks for the size only.
    let asked = unsafe {
        lt_sys::cublasLtMatmulAlgoCapGetAttribute(algo, attr, std::ptr::null_mut(), 0, &mut size)
    };
    if asked.result().is_err() || size == 0 {
        return vec![];
    }
    let mut v = vec![0u32; size / 4];
    // SAFETY: `v` holds `size` bytes.
    let got = unsafe {
        lt_sys::cublasLtMatmulAlgoCapGetAttribute(
            algo,
            attr,
            v.as_mut_ptr().cast(),
            size,
            &mut size,
        )
    };
    if got.result().is_err() {
        return vec![];
    }
    v
}

/// A scalar capability of `algo` (0 where it has none).
fn cap_u32(
    algo: &lt_sys::cublasLtMatmulAlgo_t,
    attr: lt_sys::cublasLtMatmulAlgoCapAttributes_t,
) -> u32 {
    let mut v = 0u32;
    let mut size = 0usize;
    // SAFETY: `v` holds 4 bytes.
    let got = unsafe {
        lt_sys::cublasLtMatmulAlgoCapGetAttribute(
            algo,
            attr,
            (&mut v as *mut u32).cast(),
            4,
            &mut size,
        )
    };
    if got.result().is_err() {
        0
    } else {
        v
    }
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
    let args: Vec<String> = std::env::args().skip(1).collect();
    let searching = args.iter().any(|a| a == "--search");
    let only = args
        .iter()
        .position(|a| a == "--only")
        .map(|i| {
            args.get(i + 1)
                .cloned()
                .ok_or("--only takes a part of a shape's name")
        })
        .transpose()?;
    let wanted: i32 = args
        .iter()
        .enumerate()
        .find(|(i, a)| !a.starts_with("--") && (*i == 0 || args[i - 1] != "--only"))
        .map_or(Ok(32), |(_, a)| a.parse())?;
    let shapes: Vec<Shape> = shapes()
        .into_iter()
        .filter(|s| only.as_ref().is_none_or(|o| s.name.contains(o.as_str())))
        .collect();
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
    if searching {
        return search_all(
            &stream,
            &blas,
            handle,
            &mut workspace,
            ws_bytes,
            (&shapes, wanted),
        );
    }
    println!("graph-timed us: shape, cublasGemmEx default, cuBLASLt heuristic #0 without and with 32 MiB workspace, best of the heuristic's list");
    println!("shape                 default  lt0/ws0  lt0/ws32  best(idx/of)  gain  TFLOP/s");
    for s in &shapes {
        let mut b = buffers(&stream, s, 8)?;
        let default = default_us(&stream, &blas, s, &mut b)?;
        let pl = plan(s)?;
        let no_ws = lt_us(&stream, handle, &pl, &mut b, &mut workspace, (0, 1))?;
        let limits = (ws_bytes, wanted);
        let times = lt_us(&stream, handle, &pl, &mut b, &mut workspace, limits)?;
        let (best_i, best_t) = best(&times);
        let flop = 2.0 * (s.batch * s.rows * s.n * s.k) as f64;
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

/// `--search`: per shape, `cublasGemmEx`'s pick and the best of the
/// heuristic's `wanted`, then the three fastest [`neighbours`] of the
/// heuristic's algorithms re-timed as those two are, each with whether its
/// output has the bits of `cublasGemmEx`'s.
fn search_all(
    stream: &Arc<CudaStream>,
    blas: &CudaBlas,
    handle: lt_sys::cublasLtHandle_t,
    workspace: &mut CudaSlice<u8>,
    ws_bytes: usize,
    (shapes, wanted): (&[Shape], i32),
) -> Result<(), AnyError> {
    println!("graph-timed us; operands random in [-1, 1); 'same bits': the output equals cublasGemmEx's bit for bit");
    for s in shapes {
        let mut b = buffers(stream, s, 8)?;
        let default = default_us(stream, blas, s, &mut b)?;
        let reference = output(stream, &mut b, |b| default_launch(stream, blas, s, b, 0))?;
        let pl = plan(s)?;
        let times = lt_us(stream, handle, &pl, &mut b, workspace, (ws_bytes, wanted))?;
        let (_, heuristic) = best(&times);
        let near = neighbours(
            stream,
            handle,
            &pl,
            &mut b,
            workspace,
            (ws_bytes, wanted, 20),
        )?;
        println!(
            "{}: cublasGemmEx {default:.2}, best of the heuristic's list {heuristic:.2}; {} neighbours timed",
            s.name,
            near.len()
        );
        for n in near.iter().take(3) {
            let t = time_algo(
                stream,
                handle,
                &pl,
                &n.algo,
                n.workspace,
                &mut b,
                workspace,
                REPS,
            );
            let launch = |b: &mut Buffers| {
                lt_launch(stream, handle, &pl, (&n.algo, n.workspace), b, workspace, 0)
            };
            let same = output(stream, &mut b, launch)? == reference;
            println!(
                "  {t:.2} (quick {:.2}, same bits {same})  {}",
                n.quick_us, n.describe
            );
        }
    }
    Ok(())
}

/// A configuration [`neighbours`] timed.
struct Neighbour {
    describe: String,
    quick_us: f64,
    algo: lt_sys::cublasLtMatmulAlgo_t,
    workspace: usize,
}

/// Every configuration one attribute away from each of the heuristic's
/// `wanted` algorithms: each tile its algorithm lists, each cluster shape,
/// each custom option, each split of K (with the scheme it had or the
/// first it supports). Timed as [`time_algo`] with `reps` launches a
/// graph; sorted, fastest first, each with a description.
fn neighbours(
    stream: &Arc<CudaStream>,
    handle: lt_sys::cublasLtHandle_t,
    pl: &Plan,
    b: &mut Buffers,
    workspace: &mut CudaSlice<u8>,
    (ws_limit, wanted, reps): (usize, i32, usize),
) -> Result<Vec<Neighbour>, AnyError> {
    use lt_sys::cublasLtMatmulAlgoCapAttributes_t as C;
    use lt_sys::cublasLtMatmulAlgoConfigAttributes_t as A;
    let results = heuristic(handle, pl, ws_limit, wanted)?;
    let get = |algo: &lt_sys::cublasLtMatmulAlgo_t, a: A| {
        let mut v = 0u32;
        let mut size = 0usize;
        let wide = !matches!(
            a,
            A::CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID | A::CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID
        );
        // SAFETY: `v` holds 4 bytes; the inner shape and cluster ids are
        // u16 (read into its low bytes), the others 4 bytes wide.
        let _ = unsafe {
            lt_sys::cublasLtMatmulAlgoConfigGetAttribute(
                algo,
                a,
                (&mut v as *mut u32).cast(),
                if wide { 4 } else { 2 },
                &mut size,
            )
        };
        v
    };
    let describe = |algo: &lt_sys::cublasLtMatmulAlgo_t| {
        format!(
            "id {} tile {} stages {} split {} scheme {} swizzle {} custom {} inner {} cluster {}",
            get(algo, A::CUBLASLT_ALGO_CONFIG_ID),
            get(algo, A::CUBLASLT_ALGO_CONFIG_TILE_ID),
            get(algo, A::CUBLASLT_ALGO_CONFIG_STAGES_ID),
            get(algo, A::CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
            get(algo, A::CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
            get(algo, A::CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
            get(algo, A::CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION),
            get(algo, A::CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID),
            get(algo, A::CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID),
        )
    };
    let mut timed: Vec<Neighbour> = vec![];
    let mut seen = std::collections::HashSet::new();
    let mut try_algo =
        |algo: lt_sys::cublasLtMatmulAlgo_t, timed: &mut Vec<Neighbour>, b: &mut Buffers| {
            let d = describe(&algo);
            if !seen.insert(d.clone()) {
                return;
            }
            // SAFETY: plain C data, zero is a valid bit pattern.
            let mut r = unsafe { std::mem::zeroed::<lt_sys::cublasLtMatmulHeuristicResult_t>() };
            // SAFETY: the descriptors and `algo` are live.
            let ok = unsafe {
                lt_sys::cublasLtMatmulAlgoCheck(
                    handle, pl.desc, pl.a_l, pl.b_l, pl.c_l, pl.c_l, &algo, &mut r,
                )
            };
            if ok.result().is_err() || r.workspaceSize > ws_limit {
                return;
            }
            let t = time_algo(
                stream,
                handle,
                pl,
                &algo,
                r.workspaceSize,
                b,
                workspace,
                reps,
            );
            if t.is_finite() {
                timed.push(Neighbour {
                    describe: d,
                    quick_us: t,
                    algo,
                    workspace: r.workspaceSize,
                });
            }
        };
    let set = |algo: &mut lt_sys::cublasLtMatmulAlgo_t, a: A, v: u32, bytes: usize| {
        // SAFETY: `v`'s first `bytes` bytes are the attribute's value
        // (little-endian).
        let _ = unsafe {
            lt_sys::cublasLtMatmulAlgoConfigSetAttribute(algo, a, (&v as *const u32).cast(), bytes)
        };
    };
    for r in &results {
        let base = r.algo;
        try_algo(base, &mut timed, b);
        for tile in cap_u32s(&base, C::CUBLASLT_ALGO_CAP_TILE_IDS) {
            let mut a = base;
            set(&mut a, A::CUBLASLT_ALGO_CONFIG_TILE_ID, tile, 4);
            try_algo(a, &mut timed, b);
        }
        for cluster in 0..=16u32 {
            let mut a = base;
            set(&mut a, A::CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, cluster, 2);
            try_algo(a, &mut timed, b);
        }
        for custom in 0..=cap_u32(&base, C::CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX) {
            let mut a = base;
            set(&mut a, A::CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, custom, 4);
            try_algo(a, &mut timed, b);
        }
        if cap_u32(&base, C::CUBLASLT_ALGO_CAP_SPLITK_SUPPORT) != 0 {
            let schemes = cap_u32(&base, C::CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK);
            for split in [1u32, 2, 3, 4, 6, 8] {
                for scheme in [1u32, 2, 4].into_iter().filter(|&x| schemes & x != 0) {
                    let mut a = base;
                    set(&mut a, A::CUBLASLT_ALGO_CONFIG_SPLITK_NUM, split, 4);
                    let scheme = if split == 1 { 0 } else { scheme };
                    set(&mut a, A::CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, scheme, 4);
                    try_algo(a, &mut timed, b);
                }
            }
        }
    }
    timed.sort_by(|x, y| x.quick_us.total_cmp(&y.quick_us));
    Ok(timed)
}
