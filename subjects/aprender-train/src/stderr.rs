//! aprender-train's stderr, read back: the second witness beside the driver
//! observer. aprender-train reports its JIT compilations, pre-warm, upload,
//! graph captures, per-step losses and every fall-back only as `eprintln!`
//! lines; the harness captures the trial process's stderr and hands the text
//! to [`StderrWitness::parse`].
//!
//! Blind spot: the optimizer kernel cache (AdamW, squared-sum, clip, fused
//! cross-entropy) compiles silently (T:autograd/cuda_optim.rs:45-80), so the
//! compilations read here are a lower bound; the observer sees all of them.
//! "Compiling" means an in-process cache miss: with a warm disk cache it is a
//! cubin load, not a JIT (G:driver/module.rs:309-319).

use std::fmt;

use crate::error::{Error, Result};

/// Which of aprender-train's kernel caches compiled a module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelCache {
    /// `[FWD-CACHE] Compiling '{name}' (ptx_len={n})` (T:autograd/cuda_forward/cache.rs:167).
    Forward,
    /// `[BWD-CACHE] Compiling '{name}' (ptx_len={n})` (T:autograd/cuda_backward/cache.rs:101).
    Backward,
}

/// One in-process cache miss.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compilation {
    /// 1-based line of the captured text.
    pub line: usize,
    pub cache: KernelCache,
    /// The cache key, e.g. `batched_rmsnorm_fwd_512`.
    pub name: String,
    pub ptx_len: Option<usize>,
    /// After the `[CUDA] Uploaded …` line (the end of the block upload).
    pub after_upload: bool,
}

/// A pre-warm report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prewarm {
    /// `[CUDA] Pre-warmed {n} forward kernels (JIT compiled before block upload)`
    /// (T:autograd/cuda_forward/cache.rs:460).
    Forward { kernels: usize },
    /// `[CUDA] Pre-warmed {n} LoRA backward kernels` (cache.rs:651).
    LoraBackward { kernels: usize },
    /// `[CUDA] Backward kernels pre-warmed successfully`
    /// (T:finetune/instruct_pipeline/cuda_init.rs:180).
    BackwardCache,
    /// `[CUDA] Skipping PTX pre-warm for 4 GEMM kernels (cuBLAS active — PMAT-700)` (cache.rs:331).
    CublasGemmsSkipped,
}

/// A graph-capture report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capture {
    /// `[CUDA] Graph captured: {L} layers, seq_len={s}`
    /// (T:finetune/instruct_pipeline/cuda_forward.rs:172-175).
    Forward { layers: usize, seq_len: usize },
    /// `[CUDA] Backward graph captured: seq_len={s}, {L} layers`
    /// (T:finetune/instruct_pipeline/backward.rs:236-238).
    Backward { layers: usize, seq_len: usize },
    /// `[CUDA] cuBLAS workspace pre-allocated: 32 MB`, before the forward
    /// capture (T:finetune/gpu_backward_fallback.rs:114).
    CublasWorkspace,
}

/// What a line that leaves the expected path means. Some kinds make any
/// trial an error ([`ProblemKind::is_trial_error`]); the others are evidence
/// for the contract that measures them (a failed capture falsifies "capture
/// succeeds", a non-finite loss falsifies "the losses match").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProblemKind {
    /// The CPU did (part of) the work: `… falling back to CPU`, `… using CPU`,
    /// `[RES-FALSE] …`, `[PMAT-420] backward: …`, `Skipping GPU embeddings`.
    CpuFallback,
    /// A CUDA operation, compilation or module load failed.
    Failure,
    /// A graph capture, instantiation or replay failed; aprender-train then
    /// runs that part un-graphed (T:finetune/instruct_pipeline/cuda_forward.rs:99,
    /// 115, 181, 186; T:finetune/instruct_pipeline/backward.rs:162, 245, 247;
    /// T:finetune/backward_graph.rs:44).
    GraphFailure,
    /// `[CUDA] NaN/Inf loss detected` (T:finetune/instruct_pipeline/training.rs:233).
    NonFiniteLoss,
    /// `[CUDA] sample skipped: …` (training.rs:152-156): no response token trained.
    SkippedSample,
    /// `[CUDA] cuBLAS not available` (T:autograd/cuda_forward/cache.rs:79):
    /// the resident path needs cuBLAS (T:autograd/cuda_forward/matmul.rs:166-182).
    NoCublas,
}

impl ProblemKind {
    /// Whether the trial cannot count as a run of the GPU path at all:
    /// the CPU did work, a CUDA operation failed, a sample trained nothing,
    /// or cuBLAS (which the resident path needs) is missing.
    pub fn is_trial_error(self) -> bool {
        !matches!(self, Self::GraphFailure | Self::NonFiniteLoss)
    }
}

impl fmt::Display for ProblemKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            Self::CpuFallback => "CPU fallback",
            Self::Failure => "failure",
            Self::GraphFailure => "graph failure",
            Self::NonFiniteLoss => "non-finite loss",
            Self::SkippedSample => "skipped sample",
            Self::NoCublas => "no cuBLAS",
        };
        f.write_str(text)
    }
}

/// A line that makes the trial an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub line: usize,
    pub kind: ProblemKind,
    pub text: String,
}

/// A line with where it was.
#[derive(Debug, Clone, PartialEq)]
pub struct Located<T> {
    pub line: usize,
    pub value: T,
}

/// What one trial process printed, sorted by meaning.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StderrWitness {
    /// `[CUDA] Initialized: {name} ({gb:.1} GB)` (cuda_init.rs:116-120).
    pub device: Option<String>,
    /// `[CUDA] Kernel cache initialized for target: {sm}` (T:autograd/cuda_forward/cache.rs:84).
    pub kernel_target: Option<String>,
    /// `Some(true)` after `[CUDA] cuBLAS initialized — …` (cache.rs:75),
    /// `Some(false)` after `[CUDA] cuBLAS not available …` (cache.rs:79).
    pub cublas: Option<bool>,
    pub prewarm: Vec<Located<Prewarm>>,
    /// `[CUDA] Uploaded {n} transformer layers to GPU (max_seq_len={s})`
    /// (cuda_init.rs:355-359): the layer count.
    pub upload: Option<Located<usize>>,
    pub compilations: Vec<Compilation>,
    /// `[CUDA] loss={l:.4} (finite, proceeding with backward)`, one per
    /// `train_step` on the GPU-resident path (training.rs:229).
    pub losses: Vec<f32>,
    pub captures: Vec<Located<Capture>>,
    /// Module loads that took a detour and still loaded
    /// (`[PTX-CACHE] …`, `[PTX-JIT] …`, G:driver/module.rs:325-365, 446-474).
    pub module_load_detours: Vec<Located<String>>,
    pub problems: Vec<Problem>,
}

impl StderrWitness {
    /// Reads captured stderr text line by line; unknown lines are ignored.
    pub fn parse(text: &str) -> Self {
        let mut witness = Self::default();
        for (index, raw) in text.lines().enumerate() {
            witness.read_line(index + 1, raw.trim());
        }
        witness
    }

    /// The compilations reported after the block upload.
    pub fn compilations_after_upload(&self) -> Vec<&Compilation> {
        self.compilations
            .iter()
            .filter(|c| c.after_upload)
            .collect()
    }

    /// Ok when no line makes the trial an error
    /// ([`ProblemKind::is_trial_error`]) and every one of the `train_steps`
    /// calls reported its loss: a GPU-resident `train_step` prints exactly
    /// one `[CUDA] loss=` or `[CUDA] NaN/Inf loss detected` line
    /// (T:finetune/instruct_pipeline/training.rs:227-239); fewer means a step
    /// took another path. Otherwise the first such problem is the error.
    pub fn check(&self, train_steps: usize) -> Result<()> {
        let first = self.problems.iter().find(|p| p.kind.is_trial_error());
        if let Some(problem) = first {
            return Err(Error::Stderr {
                line: problem.line,
                kind: problem.kind,
                text: problem.text.clone(),
            });
        }
        let non_finite = self
            .problems
            .iter()
            .filter(|p| p.kind == ProblemKind::NonFiniteLoss)
            .count();
        let reported = self.losses.len() + non_finite;
        if reported != train_steps {
            return Err(Error::LossLines {
                expected: train_steps,
                found: reported,
            });
        }
        Ok(())
    }

    fn read_line(&mut self, line: usize, text: &str) {
        if let Some(kind) = problem_kind(text) {
            self.problems.push(Problem {
                line,
                kind,
                text: text.to_string(),
            });
        }
        if let Some(compilation) = compilation(line, text, self.upload.is_some()) {
            self.compilations.push(compilation);
        } else if let Some(loss) = loss(text) {
            self.losses.push(loss);
        } else if let Some(value) = prewarm(text) {
            self.prewarm.push(Located { line, value });
        } else if let Some(value) = capture(text) {
            self.captures.push(Located { line, value });
        } else if let Some(layers) = upload(text) {
            self.upload = Some(Located {
                line,
                value: layers,
            });
        } else if is_module_load_detour(text) {
            let value = text.to_string();
            self.module_load_detours.push(Located { line, value });
        } else {
            self.read_setup_line(text);
        }
    }

    fn read_setup_line(&mut self, text: &str) {
        if let Some(rest) = text.strip_prefix("[CUDA] Initialized: ") {
            let name = rest.rsplit_once(" (").map_or(rest, |(name, _)| name);
            self.device = Some(name.to_string());
        } else if let Some(sm) = text.strip_prefix("[CUDA] Kernel cache initialized for target: ") {
            self.kernel_target = Some(sm.to_string());
        } else if text.starts_with("[CUDA] cuBLAS initialized") {
            self.cublas = Some(true);
        } else if text.starts_with("[CUDA] cuBLAS not available") {
            self.cublas = Some(false);
        }
    }
}

/// The line prefixes aprender-train and aprender-gpu print; other lines
/// (the harness's own log, for one) are never classified.
const APRENDER_TAGS: [&str; 14] = [
    "[CUDA]",
    "[FWD-CACHE]",
    "[BWD-CACHE]",
    "[BWD-PREWARM]",
    "[PTX-CACHE]",
    "[PTX-JIT]",
    "[PTX-FAIL]",
    "[TRACE]",
    "[GPU-SHARE]",
    "[RES-FALSE]",
    "[PMAT-420]",
    "[FP16]",
    "[NAN-SCAN]",
    "[GH-480]",
];

/// Classifies a line that means the trial cannot count as a GPU run.
fn problem_kind(text: &str) -> Option<ProblemKind> {
    if !APRENDER_TAGS.iter().any(|tag| text.starts_with(tag)) || is_module_load_detour(text) {
        None
    } else if text.contains("NaN/Inf loss detected") {
        Some(ProblemKind::NonFiniteLoss)
    } else if text.starts_with("[CUDA] sample skipped") {
        Some(ProblemKind::SkippedSample)
    } else if text.starts_with("[CUDA] cuBLAS not available") {
        Some(ProblemKind::NoCublas)
    } else if is_cpu_fallback(text) {
        Some(ProblemKind::CpuFallback)
    } else if is_graph_failure(text) {
        Some(ProblemKind::GraphFailure)
    } else if is_failure(text) {
        Some(ProblemKind::Failure)
    } else {
        None
    }
}

/// A module load that failed one way and went on another
/// (G:driver/module.rs:325-365, 446-474); only "Both attempts failed" is final.
fn is_module_load_detour(text: &str) -> bool {
    text.starts_with("[PTX-CACHE]")
        || (text.starts_with("[PTX-JIT]") && !text.starts_with("[PTX-JIT] Both attempts failed"))
}

fn is_cpu_fallback(text: &str) -> bool {
    const MARKS: [&str; 5] = [
        "falling back to CPU",
        "using CPU",
        "via CPU fallback",
        "Skipping GPU embeddings",
        "STOP THE LINE",
    ];
    text.starts_with("[RES-FALSE]")
        || text.starts_with("[PMAT-420] backward:")
        || MARKS.iter().any(|mark| text.contains(mark))
}

fn is_graph_failure(text: &str) -> bool {
    let graph = text.starts_with("[CUDA] Graph ") || text.starts_with("[CUDA] Backward graph ");
    graph && text.contains(" failed")
}

fn is_failure(text: &str) -> bool {
    text.contains(" failed")
        || text.contains("] Failed ")
        || text.contains("FAILED")
        || text.starts_with("[PTX-FAIL]")
        || (text.starts_with("[TRACE] uploaded") && text.contains("copy_ok=false"))
}

fn compilation(line: usize, text: &str, after_upload: bool) -> Option<Compilation> {
    let (cache, rest) = if let Some(rest) = text.strip_prefix("[FWD-CACHE] Compiling '") {
        (KernelCache::Forward, rest)
    } else {
        (
            KernelCache::Backward,
            text.strip_prefix("[BWD-CACHE] Compiling '")?,
        )
    };
    let (name, ptx_len) = match rest.rsplit_once("' (ptx_len=") {
        Some((name, len)) => (name, len.trim_end_matches(')').parse().ok()),
        None => (rest.trim_end_matches('\''), None),
    };
    Some(Compilation {
        line,
        cache,
        name: name.to_string(),
        ptx_len,
        after_upload,
    })
}

fn loss(text: &str) -> Option<f32> {
    let rest = text.strip_prefix("[CUDA] loss=")?;
    rest.split_whitespace().next()?.parse().ok()
}

fn prewarm(text: &str) -> Option<Prewarm> {
    if let Some(rest) = text.strip_prefix("[CUDA] Pre-warmed ") {
        let (count, kind) = rest.split_once(' ')?;
        let kernels = count.parse().ok()?;
        if kind.starts_with("forward kernels") {
            return Some(Prewarm::Forward { kernels });
        }
        return kind
            .starts_with("LoRA backward kernels")
            .then_some(Prewarm::LoraBackward { kernels });
    }
    if text == "[CUDA] Backward kernels pre-warmed successfully" {
        return Some(Prewarm::BackwardCache);
    }
    text.starts_with("[CUDA] Skipping PTX pre-warm for 4 GEMM kernels")
        .then_some(Prewarm::CublasGemmsSkipped)
}

fn capture(text: &str) -> Option<Capture> {
    if let Some(rest) = text.strip_prefix("[CUDA] Graph captured: ") {
        let (layers, seq) = rest.split_once(" layers, seq_len=")?;
        return Some(Capture::Forward {
            layers: layers.parse().ok()?,
            seq_len: seq.parse().ok()?,
        });
    }
    if let Some(rest) = text.strip_prefix("[CUDA] Backward graph captured: seq_len=") {
        let (seq, layers) = rest.split_once(", ")?;
        return Some(Capture::Backward {
            layers: layers.strip_suffix(" layers")?.parse().ok()?,
            seq_len: seq.parse().ok()?,
        });
    }
    text.starts_with("[CUDA] cuBLAS workspace pre-allocated")
        .then_some(Capture::CublasWorkspace)
}

fn upload(text: &str) -> Option<usize> {
    let rest = text.strip_prefix("[CUDA] Uploaded ")?;
    let (layers, tail) = rest.split_once(' ')?;
    tail.starts_with("transformer layers to GPU")
        .then(|| layers.parse().ok())
        .flatten()
}

#[cfg(test)]
mod tests;
