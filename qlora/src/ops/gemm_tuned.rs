//! bf16 GEMMs on cuBLASLt configurations measured faster than cuBLAS's own
//! pick at the same shape, on the same GPU kind, that compute the same bits.
//!
//! `cublasGemmEx` runs the configuration its heuristic ranks first. At the
//! bf16 step's shapes (qwen2.5-0.5b, 1,024 tokens) other configurations of
//! the same algorithm (cuBLASLt's `nvjet` kernels, algorithm 66: another
//! tile, cluster shape or custom option, K never split) run 1-7 % faster on
//! an H200 and write the same output bit for bit: each output element is
//! the same chain of products in the same order, only the tiles over the
//! output differ. `examples/gemm_algos.rs --search` finds them; [`TUNED`]
//! pins what it found. They are taken only by GEMMs captured into a CUDA
//! graph by [`crate::gpu::GpuContext::capture`] (the graphed step). Taken
//! by eager calls too, one run of the eager bf16 step measured 0.22 ms
//! slower, more than the 0.12 ms its runs vary by; eager calls keep
//! cuBLAS's pick. A shape or GPU kind the table does not name, an entry
//! cuBLASLt no longer accepts as it stands (another library), or one that
//! would need a workspace, runs on `cublasGemmEx` as before.
//!
//! Shapes are cuBLAS's column-major ones ([`super::gemm`]): `C[m, n] =
//! op(A) B`, `A` our weight (`op(A) = A^T`, stored `[m, k]` transposed, in
//! a forward), `B` our input, no transpose, every matrix packed.

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};

use cudarc::cublas::sys::{cublasComputeType_t, cublasOperation_t, cudaDataType_t};
use cudarc::cublas::GemmConfig;
use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys as lt_sys;
use cudarc::driver::CudaStream;

use crate::error::Result;

/// The algorithm every entry configures (cuBLASLt's `nvjet` kernels), and
/// the stages id its heuristic gives them.
const NVJET_ALGO: i32 = 66;
const NVJET_STAGES: u32 = 35;

/// A GEMM shape, in cuBLAS's terms: whether `A` is transposed, `m`, `n`,
/// `k`, and whether `C` is bf16 (else f32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TunedShape {
    pub trans_a: bool,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub bf16_out: bool,
}

/// A configuration of cuBLASLt's algorithm 66: its tile id, custom option and
/// cluster shape id (cuBLASLt's enums).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TunedConfig {
    pub tile: u32,
    pub custom: u32,
    pub cluster: u16,
}

/// One pinned configuration: the device name it was measured on
/// (`cuDeviceGetName`), the shape and the configuration.
pub struct Tuned {
    pub device: &'static str,
    pub shape: TunedShape,
    pub config: TunedConfig,
}

const fn entry(trans_a: bool, m: i32, k: i32, bf16_out: bool, cfg: (u32, u32, u16)) -> Tuned {
    Tuned {
        device: "NVIDIA H200",
        shape: TunedShape {
            trans_a,
            m,
            n: 1024,
            k,
            bf16_out,
        },
        config: TunedConfig {
            tile: cfg.0,
            custom: cfg.1,
            cluster: cfg.2,
        },
    }
}

/// The bf16 step's GEMMs of qwen2.5-0.5b at 1,024 tokens on an H200, each
/// the fastest configuration `gemm_algos --search` re-timed there (graph
/// replays, against `cublasGemmEx`'s pick): docs/src/performance/step-time.md.
pub const TUNED: &[Tuned] = &[
    // Forward, x W^T: q/k/v with the LoRA A rows; o and down (+ the
    // residual, f32); gate and up as one (bf16).
    entry(true, 1184, 896, false, (188, 2, 5)),
    entry(true, 896, 896, false, (15, 2, 5)),
    entry(true, 9728, 896, true, (244, 6, 5)),
    entry(true, 896, 4864, false, (18, 2, 8)),
    // Input gradients, dy W: down (bf16, SwiGLU's), gate and up as one,
    // o, q/k/v.
    entry(false, 4864, 896, true, (459, 1, 3)),
    entry(false, 896, 9728, false, (18, 2, 8)),
    entry(false, 896, 896, false, (17, 2, 2)),
    entry(false, 896, 1152, false, (17, 2, 2)),
];

/// A matmul cuBLASLt accepted for one [`TUNED`] entry: its descriptors and
/// the configured algorithm.
struct Plan {
    shape: TunedShape,
    desc: lt_sys::cublasLtMatmulDesc_t,
    layouts: [lt_sys::cublasLtMatrixLayout_t; 3],
    algo: lt_sys::cublasLtMatmulAlgo_t,
}

/// The plans of one device's [`TUNED`] entries and the cuBLASLt handle
/// they run on, made once per context.
pub struct TunedGemms {
    handle: lt_sys::cublasLtHandle_t,
    plans: Vec<Plan>,
    /// Entries for this device that cuBLASLt refused (or that would need a
    /// workspace): they run on `cublasGemmEx`.
    refused: Vec<TunedShape>,
    /// GEMMs launched on a pinned configuration so far.
    launches: AtomicUsize,
}

// SAFETY: the handle and descriptors are host objects that cuBLASLt only
// reads after creation (the plans are never changed once made); a matmul
// on them is ordered by the stream it is given, not by the thread.
unsafe impl Send for TunedGemms {}
// SAFETY: as for Send: nothing here is written after `new`.
unsafe impl Sync for TunedGemms {}

impl TunedGemms {
    /// The plans of `device`'s entries, or None where it has none (no
    /// handle is made then).
    pub fn new(device: &str) -> Result<Option<TunedGemms>> {
        let entries: Vec<&Tuned> = TUNED.iter().filter(|t| t.device == device).collect();
        if entries.is_empty() {
            return Ok(None);
        }
        let mut tuned = TunedGemms {
            handle: lt::create_handle().map_err(lt_error)?,
            plans: vec![],
            refused: vec![],
            launches: AtomicUsize::new(0),
        };
        for t in entries {
            match tuned.plan(t)? {
                Some(plan) => tuned.plans.push(plan),
                None => tuned.refused.push(t.shape),
            }
        }
        Ok(Some(tuned))
    }

    /// The shapes that run on a pinned configuration.
    pub fn shapes(&self) -> impl Iterator<Item = TunedShape> + '_ {
        self.plans.iter().map(|p| p.shape)
    }

    /// The entries cuBLASLt refused here.
    pub fn refused(&self) -> &[TunedShape] {
        &self.refused
    }

    /// How many GEMMs were captured on a pinned configuration so far (a
    /// graph replayed counts nothing more).
    pub fn launches(&self) -> usize {
        self.launches.load(Ordering::Relaxed)
    }

    /// Runs `cfg` on `stream` on its pinned configuration and returns true
    /// where one is pinned for it (bf16 operands, `out` the type of `C`, f32
    /// compute on tensor cores, the shape and packing of an entry) and
    /// `capturing`, the stream being captured into a graph (why: the
    /// module's doc); else returns false and runs nothing.
    ///
    /// # Safety
    ///
    /// As for `cublasGemmEx` with the same arguments: `a`, `b` and `c` are
    /// device pointers valid for the matrices `cfg` describes, on `stream`.
    pub unsafe fn run(
        &self,
        cfg: &GemmConfig<f32>,
        (operands, out): (cudaDataType_t, cudaDataType_t),
        compute: cublasComputeType_t,
        (a, b, c): (*const c_void, *const c_void, *mut c_void),
        (stream, capturing): (&CudaStream, bool),
    ) -> Result<bool> {
        if !capturing {
            return Ok(false);
        }
        let call = (cfg, (operands, out), compute);
        let Some(plan) = self.plans.iter().find(|p| matches(&p.shape, call)) else {
            return Ok(false);
        };
        let [a_l, b_l, c_l] = plan.layouts;
        let (alpha, beta) = (&cfg.alpha as *const f32, &cfg.beta as *const f32);
        // SAFETY: the caller's pointers hold the matrices of `cfg`, which
        // `matches` checked is the plan's shape, packed as its layouts say;
        // alpha and beta are host f32 values (the default host pointer mode
        // and the f32 scale type of the descriptor); the algorithm needs no
        // workspace (`plan` kept only those).
        unsafe {
            lt::matmul(
                self.handle,
                plan.desc,
                alpha.cast(),
                beta.cast(),
                a,
                a_l,
                b,
                b_l,
                c,
                c_l,
                c,
                c_l,
                &plan.algo,
                std::ptr::null_mut(),
                0,
                stream.cu_stream() as _,
            )
        }
        .map_err(lt_error)?;
        self.launches.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    /// `t`'s matmul and configured algorithm, or None where cuBLASLt
    /// refuses the configuration or it needs a workspace.
    fn plan(&self, t: &Tuned) -> Result<Option<Plan>> {
        let s = t.shape;
        let bf = lt_sys::cudaDataType::CUDA_R_16BF;
        let out = out_type(s.bf16_out);
        let f32t = lt_sys::cudaDataType::CUDA_R_32F;
        let compute = lt_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F;
        let (ar, ac) = if s.trans_a { (s.k, s.m) } else { (s.m, s.k) };
        let mut plan = Plan {
            shape: s,
            desc: std::ptr::null_mut(),
            layouts: [std::ptr::null_mut(); 3],
            // SAFETY: plain C data; cublasLtMatmulAlgoInit overwrites it.
            algo: unsafe { std::mem::zeroed() },
        };
        // Made one by one into `plan`, which destroys what was made if a
        // step fails.
        let (m, n, k) = (s.m as u64, s.n as u64, s.k as u64);
        plan.layouts[0] =
            lt::create_matrix_layout(bf, ar as u64, ac as u64, ar as i64).map_err(lt_error)?;
        plan.layouts[1] = lt::create_matrix_layout(bf, k, n, k as i64).map_err(lt_error)?;
        plan.layouts[2] = lt::create_matrix_layout(out, m, n, m as i64).map_err(lt_error)?;
        plan.desc = lt::create_matmul_desc(compute, f32t).map_err(lt_error)?;
        let trans: i32 = s.trans_a.into();
        use lt_sys::cublasLtMatmulAlgoConfigAttributes_t as A;
        let c = t.config;
        // SAFETY: each attribute is given a pointer to a value of the width
        // cuBLASLt's documentation gives it: 4 bytes for the transpose (an
        // i32), tile, stages, split (an i32, here 1), scheme, swizzle and
        // custom option; 2 for the cluster shape (a u16).
        let accepted = unsafe {
            lt::set_matmul_desc_attribute(
                plan.desc,
                lt_sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                (&trans as *const i32).cast(),
                4,
            )
            .map_err(lt_error)?;
            lt_sys::cublasLtMatmulAlgoInit(
                self.handle,
                compute,
                f32t,
                bf,
                bf,
                out,
                out,
                NVJET_ALGO,
                &mut plan.algo,
            )
            .result()
            .is_ok()
                && [
                    (A::CUBLASLT_ALGO_CONFIG_TILE_ID, c.tile),
                    (A::CUBLASLT_ALGO_CONFIG_STAGES_ID, NVJET_STAGES),
                    (A::CUBLASLT_ALGO_CONFIG_SPLITK_NUM, 1),
                    (A::CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, 0),
                    (A::CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, 0),
                    (A::CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, c.custom),
                ]
                .iter()
                .all(|&(attr, v)| {
                    lt_sys::cublasLtMatmulAlgoConfigSetAttribute(
                        &mut plan.algo,
                        attr,
                        (&v as *const u32).cast(),
                        4,
                    )
                    .result()
                    .is_ok()
                })
                && lt_sys::cublasLtMatmulAlgoConfigSetAttribute(
                    &mut plan.algo,
                    A::CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID,
                    (&c.cluster as *const u16).cast(),
                    2,
                )
                .result()
                .is_ok()
                && self.workspace_needed(&plan) == Some(0)
        };
        Ok(accepted.then_some(plan))
    }

    /// The workspace cuBLASLt says `plan`'s algorithm needs, or None where
    /// it refuses the algorithm for the plan's matmul.
    fn workspace_needed(&self, plan: &Plan) -> Option<usize> {
        let [a_l, b_l, c_l] = plan.layouts;
        // SAFETY: plain C data, zero is a valid bit pattern.
        let mut r = unsafe { std::mem::zeroed::<lt_sys::cublasLtMatmulHeuristicResult_t>() };
        // SAFETY: the handle, descriptors and algorithm are live.
        let checked = unsafe {
            lt_sys::cublasLtMatmulAlgoCheck(
                self.handle,
                plan.desc,
                a_l,
                b_l,
                c_l,
                c_l,
                &plan.algo,
                &mut r,
            )
        };
        checked.result().ok().map(|()| r.workspaceSize)
    }
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: each descriptor was made by cuBLASLt (or is still null)
        // and is destroyed once; no matmul uses it after the plan.
        unsafe {
            if !self.desc.is_null() {
                let _ = lt::destroy_matmul_desc(self.desc);
            }
            for l in self.layouts {
                if !l.is_null() {
                    let _ = lt::destroy_matrix_layout(l);
                }
            }
        }
    }
}

impl Drop for TunedGemms {
    fn drop(&mut self) {
        self.plans.clear();
        // SAFETY: the handle was made in `new` and outlives every plan,
        // all dropped above.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

/// Whether a call (`cfg`, its operand and output types, its compute type)
/// is `shape`'s: bf16 operands, f32 compute on tensor cores (not the
/// pedantic compute a fault asks for), every matrix packed.
fn matches(
    shape: &TunedShape,
    (cfg, (operands, out), compute): (
        &GemmConfig<f32>,
        (cudaDataType_t, cudaDataType_t),
        cublasComputeType_t,
    ),
) -> bool {
    let trans_a = cfg.transa == cublasOperation_t::CUBLAS_OP_T;
    let lda = if trans_a { cfg.k } else { cfg.m };
    let bf16_out = out == cudaDataType_t::CUDA_R_16BF;
    operands == cudaDataType_t::CUDA_R_16BF
        && compute == cublasComputeType_t::CUBLAS_COMPUTE_32F
        && (out == cudaDataType_t::CUDA_R_32F || bf16_out)
        && cfg.transb == cublasOperation_t::CUBLAS_OP_N
        && (cfg.transa == cublasOperation_t::CUBLAS_OP_N || trans_a)
        && *shape
            == TunedShape {
                trans_a,
                m: cfg.m,
                n: cfg.n,
                k: cfg.k,
                bf16_out,
            }
        && (cfg.lda, cfg.ldb, cfg.ldc) == (lda, cfg.k, cfg.m)
}

fn out_type(bf16: bool) -> lt_sys::cudaDataType {
    if bf16 {
        lt_sys::cudaDataType::CUDA_R_16BF
    } else {
        lt_sys::cudaDataType::CUDA_R_32F
    }
}

/// cuBLASLt's failed status as the crate's error.
fn lt_error(e: lt::CublasError) -> crate::error::Error {
    crate::error::Error::CublasLt(format!("{:?}", e.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(transa: bool, m: i32, n: i32, k: i32) -> GemmConfig<f32> {
        GemmConfig {
            transa: if transa {
                cublasOperation_t::CUBLAS_OP_T
            } else {
                cublasOperation_t::CUBLAS_OP_N
            },
            transb: cublasOperation_t::CUBLAS_OP_N,
            m,
            n,
            k,
            alpha: 1.0,
            lda: if transa { k } else { m },
            ldb: k,
            beta: 0.0,
            ldc: m,
        }
    }

    /// A call matches its entry only with the entry's shape, bf16 operands,
    /// its output type, f32 compute and packed leading dimensions.
    #[test]
    fn a_call_matches_only_its_own_shape() {
        let s = TUNED[2].shape;
        let f32t = cudaDataType_t::CUDA_R_32F;
        let bf = cudaDataType_t::CUDA_R_16BF;
        let f16 = cudaDataType_t::CUDA_R_16F;
        let fast = cublasComputeType_t::CUBLAS_COMPUTE_32F;
        let c = cfg(true, s.m, s.n, s.k);
        assert!(matches(&s, (&c, (bf, bf), fast)));
        assert!(!matches(&s, (&c, (bf, f32t), fast)));
        assert!(!matches(&s, (&c, (bf, f16), fast)));
        assert!(!matches(&s, (&c, (f16, bf), fast)));
        let pedantic = cublasComputeType_t::CUBLAS_COMPUTE_32F_PEDANTIC;
        assert!(!matches(&s, (&c, (bf, bf), pedantic)));
        assert!(!matches(&s, (&cfg(false, s.m, s.n, s.k), (bf, bf), fast)));
        assert!(!matches(&s, (&cfg(true, s.m, 512, s.k), (bf, bf), fast)));
        let strided = GemmConfig { ldc: s.m + 8, ..c };
        assert!(!matches(&s, (&strided, (bf, bf), fast)));
    }

    /// Every entry names its shape once per device.
    #[test]
    fn the_table_names_each_shape_once() {
        for (i, t) in TUNED.iter().enumerate() {
            assert!(TUNED[..i]
                .iter()
                .all(|u| u.device != t.device || u.shape != t.shape));
        }
    }
}
