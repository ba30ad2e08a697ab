//! [`GpuTrainer`]: the QLoRA training step on the GPU, in f32. The model,
//! its weights and the batch order are functions of the seed alone
//! ([`crate::model`]), so any other implementation of the same math fed the
//! same seed trains the same model.
//!
//! One step, all on the work stream, all into the preallocated
//! [`Workspace`]:
//!
//! ```text
//! forward    x0 = emb[inputs]; per layer: n1 = rmsnorm(x, g1);
//!            q = n1 Wq^T + s (n1 Aq^T) Bq^T, k = n1 Wk^T, v = n1 Wv^T + s (n1 Av^T) Bv^T;
//!            att = attention(rope(q), rope(k), v); x2 = x + att Wo^T;
//!            n2 = rmsnorm(x2, g2); x' = x2 + (silu(n2 Wg^T) * n2 Wu^T) Wd^T;
//!            loss = CE(rmsnorm(x_L) Wlm^T, targets)
//! backward   dx through every op; trainable gradients only (LoRA A, B of q, v;
//!            both norm weights): dB = s dy^T u, du = s dy B, dA = du^T n1, dn1 += du A
//! all-reduce with ranks only: g = (1/R) sum_r g_r, before the clip, so that
//!            S below is the whole batch's, the same on every rank
//! clip       S = sum ||g||^2 (device, f64), scale = min(1, c / (sqrt S + 1e-6))
//! AdamW      t += 1 (a device counter), then every tensor in one launch, each
//!            gradient multiplied by its clip scale first (g itself is not rewritten)
//! ```
//!
//! The only device-to-host copy of a step is reading the loss, after
//! everything else was queued; every such read goes through the trainer's
//! counting `SyncCounter::host_read` (the `sync_count` check reads
//! the counters). With `graph`, the first step runs eagerly (it loads every
//! kernel and lets cuBLAS settle), the second is captured whole as one CUDA
//! graph, and that graph is replayed from then on: the batch is copied into
//! the same device buffers before each replay, and AdamW reads its step number
//! from device memory, so nothing the graph baked in goes stale. A batch of
//! another sequence length reallocates the workspace and drops the graph; the
//! next step captures a new one ([`GpuTrainer::set_seq_len`]).

use std::time::Instant;

use cudarc::driver::{CudaGraph, CudaSlice, CudaView, DeviceRepr};
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::data_parallel::Rank;
use super::kernels;
use super::layer::{
    norm_grad_targets, BfStack, DecoderLayer, LayerCtx, LoraARows, StackRef, Stacks,
};
use super::options::{AdamW, BaseWeights, ClipMode, GpuTrainOptions};
use super::weights::{BaseDevice, Params, Table, Values};
use super::workspace::{CublasWorkspace, Workspace, CUBLAS_WORKSPACE_BYTES};
use crate::error::{Error, Result};
use crate::gpu::table::{address, TensorTable};
use crate::gpu::{GemmMath, GpuContext, PrewarmReport};
use crate::model::corpus::{self, Corpus, BATCH_SALT, CORPUS_SALT};
use crate::model::{BaseModel, ModelConfig, Slot, Trainable};
use crate::ops::attention::AttnShape;
use crate::ops::clip::{self as clip_ops, TableSumWorkspace};
use head::Pass;

mod head;
use crate::ops::{cross_entropy, embedding, rmsnorm};

/// Host synchronisations the step made: every device-to-host read goes
/// through `SyncCounter::host_read`, which counts it here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncCounts {
    /// All host reads since the trainer was made.
    pub total: usize,
    /// Host reads issued while the stream was capturing.
    pub inside_capture: usize,
    /// Host reads of each finished step.
    pub per_step: Vec<usize>,
}

/// The clip reductions: one group (global) or one per layer. `table` lists
/// the group's gradients, so its squared norm takes one launch however many
/// tensors it has.
struct ClipGroup {
    tensors: Vec<usize>,
    table: TensorTable,
    sum_ws: TableSumWorkspace,
    sq: CudaSlice<f64>,
    scale: CudaSlice<f32>,
}

/// A phase of [`GpuTrainer::new`] whose order matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetupPhase {
    /// Every kernel module the step uses was loaded ([`GpuContext::prewarm`]),
    /// then cuBLAS's, by a rehearsal step on a model of zeros.
    Prewarm,
    /// The base weights and the trainable tensors were uploaded.
    Upload,
}

/// How a trainer was set up: kernels are pre-warmed while no weight is on
/// the device (compiling and loading modules needs device memory the weights
/// would otherwise hold), then the weights are uploaded.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainerSetup {
    /// What the trainer's pre-warm did.
    pub prewarm: PrewarmReport,
    /// Free device bytes when pre-warm started.
    pub free_bytes_at_prewarm: usize,
    /// Wall time of pre-warm's rehearsal step (see `rehearse`).
    pub rehearsal_ms: f64,
    /// The drop in free device bytes across the weight upload.
    pub upload_bytes: usize,
    /// Wall time of the weight upload: drawing or reading the values,
    /// converting them to what the device stores, and copying them up.
    pub upload_ms: f64,
    /// The phases in the order they ran.
    pub order: Vec<SetupPhase>,
}

/// What one step did, for reports.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuStepReport {
    pub loss: f64,
    /// Whether this step replayed a captured graph.
    pub replayed: bool,
}

/// What [`GpuTrainer::loss_and_grads`] read back from one forward and
/// backward.
#[derive(Debug, Clone, PartialEq)]
pub struct LossAndGrads {
    /// The mean loss of the batch (this rank's shard, with ranks).
    pub loss: f64,
    /// Every trainable tensor's gradient, all-reduced with ranks, before
    /// clipping (the clip never rewrites a gradient).
    pub grads: Vec<Vec<f32>>,
    /// The squared norm `S_k = sum_{g in k} ||g||^2` of each clip group `k`
    /// the step's clip computed (one for the global clip, one per layer for
    /// the per-layer clip, none when the clip is skipped).
    pub clip_sq: Vec<f64>,
}

/// A model on the device, its optimizer state, workspace and data stream.
pub struct GpuTrainer {
    cfg: ModelConfig,
    options: GpuTrainOptions,
    base: BaseDevice,
    params: Params,
    ws: Workspace,
    /// Declared after `ws`, and never replaced: resizing the workspace must
    /// not detach the buffer cuBLAS uses.
    _cublas: CublasWorkspace,
    clip: Vec<ClipGroup>,
    /// Every trainable tensor with its gradient, moments and its group's clip
    /// scale, for the one-launch AdamW. Built from `params` and `clip`, which
    /// live as long as it and are never reallocated.
    optimizer: TensorTable,
    /// Every layer's norm weight gradients in `params`, in their slots'
    /// order, into which the step sums the RMSNorm backward's partials once
    /// every layer's backward has run. Built from `params`, which lives as
    /// long as it and is never reallocated.
    norm_grads: rmsnorm::DgammaTargets,
    /// With a base that keeps its own q/k/v stacks (fp32, bf16): every
    /// layer's LoRA A tensors and the rows of its stacks they are copied and
    /// rounded into, for the forward's one launch ([`LoraARows`]). Built
    /// from `params` and `base`, which live as long as it and are never
    /// reallocated.
    lora_a_rows: Option<LoraARows>,
    step_count: CudaSlice<i32>,
    corpus: Corpus,
    data_rng: ChaCha8Rng,
    graph: Option<CudaGraph>,
    steps_done: usize,
    sync: SyncCounter,
    setup: TrainerSetup,
    /// The data-parallel world this trainer is a rank of; `None` trains
    /// alone (no collective, nothing extra queued).
    dist: Option<Rank>,
    /// Bytes the last queued step all-reduced (0 alone).
    reduced_bytes: usize,
    /// Whether the last forward left a bf16 head's `dnf` for the backward
    /// (a training pass: the head's backward is fused into its forward).
    head_grad_ready: bool,
}

/// Counts host reads as they happen.
#[derive(Default)]
struct SyncCounter {
    counts: SyncCounts,
    capturing: bool,
    this_step: usize,
}

impl SyncCounter {
    /// Copies `buf` to the host, waiting for the stream: a host sync, counted
    /// (and counted as inside capture while the stream is capturing).
    fn host_read<T: DeviceRepr>(
        &mut self,
        gpu: &GpuContext,
        buf: &CudaView<'_, T>,
    ) -> Result<Vec<T>> {
        self.counts.total += 1;
        self.this_step += 1;
        if self.capturing {
            self.counts.inside_capture += 1;
        }
        gpu.download(buf)
    }
}

/// Pre-warms every kernel `cfg`'s step uses, then uploads the weights
/// (the other way round under [`crate::Faults::upload_before_prewarm`]),
/// recording the order and the device memory around each.
fn prewarm_then_upload(
    gpu: &mut GpuContext,
    cfg: &ModelConfig,
    options: &GpuTrainOptions,
    values: Values,
    trainable: &Trainable,
) -> Result<(BaseDevice, Params, TrainerSetup)> {
    let mut order = Vec::with_capacity(2);
    let upload = |gpu: &mut GpuContext, order: &mut Vec<SetupPhase>| {
        let free_before = gpu.memory_bytes()?.0;
        let start = Instant::now();
        let base = BaseDevice::with_values(gpu, cfg, options, values)?;
        let params = Params::upload(gpu, trainable)?;
        gpu.synchronize()?;
        let ms = start.elapsed().as_secs_f64() * 1e3;
        order.push(SetupPhase::Upload);
        let used = free_before.saturating_sub(gpu.memory_bytes()?.0);
        Ok::<_, Error>((base, params, (used, ms)))
    };
    let early = if gpu.faults().upload_before_prewarm {
        Some(upload(gpu, &mut order)?)
    } else {
        None
    };
    let free_bytes_at_prewarm = gpu.memory_bytes()?.0;
    let math = (
        options.forward_math.unwrap_or(gpu.options().forward_math),
        options.backward_math.unwrap_or(gpu.options().backward_math),
    );
    let f16_operands = options.f16_lm_head || options.f16_projections;
    let prewarm = gpu.prewarm_with_math(cfg, &[options.base], math, f16_operands)?;
    let rehearsal = Instant::now();
    rehearse(gpu, cfg, options, trainable)?;
    let rehearsal_ms = rehearsal.elapsed().as_secs_f64() * 1e3;
    order.push(SetupPhase::Prewarm);
    let (base, params, (upload_bytes, upload_ms)) = match early {
        Some(uploaded) => uploaded,
        None => upload(gpu, &mut order)?,
    };
    let setup = TrainerSetup {
        prewarm,
        free_bytes_at_prewarm,
        rehearsal_ms,
        upload_bytes,
        upload_ms,
        order,
    };
    Ok((base, params, setup))
}

/// Runs one step of `cfg` on a model of zeros (set on the device, nothing
/// copied from the host), then frees it. Pre-warm loads our own modules;
/// cuBLAS loads the kernels of each GEMM shape lazily, on its first call, so
/// only running every GEMM the step runs, with the step's shapes, math and
/// cuBLAS workspace, loads them before the weights are uploaded.
fn rehearse(
    gpu: &mut GpuContext,
    cfg: &ModelConfig,
    options: &GpuTrainOptions,
    trainable: &Trainable,
) -> Result<()> {
    let base = BaseDevice::with_values(gpu, cfg, options, Values::Zeros)?;
    let params = Params::zeroed(gpu, trainable)?;
    let setup = TrainerSetup {
        prewarm: PrewarmReport::default(),
        free_bytes_at_prewarm: 0,
        rehearsal_ms: 0.0,
        upload_bytes: 0,
        upload_ms: 0.0,
        order: Vec::new(),
    };
    let mut rehearsal = GpuTrainer::assemble(gpu, cfg, *options, 0, (base, params), setup)?;
    rehearsal.body(gpu)?;
    gpu.synchronize()?;
    drop(rehearsal);
    // Hands the freed model back to the driver before the upload measures
    // the free memory it takes.
    gpu.synchronize()
}

impl GpuTrainer {
    /// A fresh model of `cfg` from `seed` (the seeded weights, corpus
    /// and batch order for the same seed).
    pub fn new(
        gpu: &mut GpuContext,
        cfg: &ModelConfig,
        options: GpuTrainOptions,
        seed: u64,
    ) -> Result<Self> {
        Self::with_params(gpu, cfg, options, seed, &Trainable::init(cfg, seed))
    }

    /// As [`GpuTrainer::new`], with the trainable tensors given.
    pub fn with_params(
        gpu: &mut GpuContext,
        cfg: &ModelConfig,
        options: GpuTrainOptions,
        seed: u64,
        trainable: &Trainable,
    ) -> Result<Self> {
        Self::build(gpu, cfg, options, (seed, Values::Seeded(seed)), trainable)
    }

    /// A trainer of the host model `base` (a loaded checkpoint: its
    /// configuration, q/k/v biases, tied or own head and final norm), its
    /// projections stored on the device as `options.base` says, starting
    /// from `trainable` (e.g. [`crate::model::Checkpoint::trainable`]);
    /// `seed` orders its batches.
    pub fn from_model(
        gpu: &mut GpuContext,
        base: &BaseModel,
        options: GpuTrainOptions,
        seed: u64,
        trainable: &Trainable,
    ) -> Result<Self> {
        let values = (seed, Values::Model(base));
        Self::build(gpu, &base.config, options, values, trainable)
    }

    /// A trainer of `cfg` whose base holds `values`, the batches ordered by `seed`.
    fn build(
        gpu: &mut GpuContext,
        cfg: &ModelConfig,
        options: GpuTrainOptions,
        (seed, values): (u64, Values),
        trainable: &Trainable,
    ) -> Result<Self> {
        if trainable.config != *cfg || trainable.tensors.len() != cfg.layers * Slot::ALL.len() {
            return Err(Error::ShapeMismatch {
                op: "train",
                expected: format!("trainable tensors of model {}", cfg.name),
                got: format!("those of model {}", trainable.config.name),
            });
        }
        check_shapes(cfg)?;
        let options = honoured_options(gpu, options)?;
        refuse_if_too_big(gpu, cfg, &options)?;
        let (base, params, setup) = prewarm_then_upload(gpu, cfg, &options, values, trainable)?;
        Self::assemble(gpu, cfg, options, seed, (base, params), setup)
    }

    /// A trainer of `cfg` on the weights and trainable state `base` and
    /// `params`, already on the device: its workspace, clip groups,
    /// optimizer table and cuBLAS workspace.
    fn assemble(
        gpu: &mut GpuContext,
        cfg: &ModelConfig,
        options: GpuTrainOptions,
        seed: u64,
        (base, params): (BaseDevice, Params),
        setup: TrainerSetup,
    ) -> Result<Self> {
        let faults = gpu.faults();
        let ws = Workspace::new(
            gpu,
            cfg,
            &base.linears(),
            faults.activations_doubled,
            &options,
        )?;
        let per_layer = options.clip == ClipMode::PerLayer || faults.clip_per_layer;
        // The skipped-clip fault: no group, so no norm and no scale.
        let groups: Vec<Vec<usize>> = if faults.clip_skipped {
            Vec::new()
        } else if per_layer {
            (0..cfg.layers)
                .map(|l| Slot::ALL.iter().map(|&s| Trainable::index(l, s)).collect())
                .collect()
        } else {
            vec![(0..params.p.len()).collect()]
        };
        let clip = groups
            .into_iter()
            .map(|tensors| {
                let lens: Vec<usize> = tensors.iter().map(|&i| params.g[i].len()).collect();
                let grads = tensors
                    .iter()
                    .map(|&i| address(gpu, &params.g[i]))
                    .collect();
                Ok(ClipGroup {
                    table: TensorTable::new(gpu, &[grads], &lens)?,
                    sum_ws: TableSumWorkspace::new(gpu)?,
                    tensors,
                    sq: gpu.zeros(1)?,
                    scale: gpu.zeros(1)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let optimizer = optimizer_table(gpu, &params, &clip)?;
        let norm_grads = norm_grad_targets(gpu, cfg, &params.g)?;
        let lora_a_rows = LoraARows::new(gpu, cfg, &base.own_stacks(), &params.p)?;
        let step_count = gpu.zeros(1)?;
        let cublas = CublasWorkspace::new(gpu)?;
        gpu.synchronize()?;
        Ok(GpuTrainer {
            cfg: *cfg,
            options,
            base,
            params,
            ws,
            _cublas: cublas,
            clip,
            optimizer,
            norm_grads,
            lora_a_rows,
            step_count,
            corpus: Corpus::arithmetic(seed ^ CORPUS_SALT, corpus::DEFAULT_LEN),
            data_rng: ChaCha8Rng::seed_from_u64(seed ^ BATCH_SALT),
            graph: None,
            steps_done: 0,
            sync: SyncCounter::default(),
            setup,
            dist: None,
            reduced_bytes: 0,
            head_grad_ready: false,
        })
    }

    /// Makes this trainer `rank` of a data-parallel world: from now on it
    /// trains on its shard of each batch and all-reduces its gradients.
    /// Drops a captured graph (it was captured without the collective).
    pub fn join(&mut self, rank: Rank) {
        self.graph = None;
        self.dist = Some(rank);
    }

    /// Bytes the last queued step all-reduced across the ranks (a replayed
    /// graph reduces what its capture queued).
    pub fn all_reduced_bytes(&self) -> usize {
        self.reduced_bytes
    }

    /// Bytes of the trainable gradients.
    pub fn trainable_bytes(&self) -> usize {
        self.params.g.iter().map(|g| 4 * g.len()).sum()
    }

    /// How this trainer was set up: pre-warm, then upload.
    pub fn setup(&self) -> &TrainerSetup {
        &self.setup
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The host reads made so far.
    pub fn syncs(&self) -> &SyncCounts {
        &self.sync.counts
    }

    /// Whether steps now replay a captured graph.
    pub fn graph_ready(&self) -> bool {
        self.graph.is_some()
    }

    /// Device bytes of the base weights, the trainable state and the workspace
    /// activations (an accounting, not a measurement).
    pub fn accounted_bytes(&self) -> (usize, usize, usize) {
        (
            self.base.bytes(),
            self.params.bytes(),
            self.ws.bytes() + CUBLAS_WORKSPACE_BYTES,
        )
    }

    /// Makes the workspace fit batches of `seq_len` tokens per row. A new
    /// length reallocates the workspace (outside any capture) and drops the
    /// captured graph, whose buffers and launch shapes were the old length's;
    /// the next graphed step captures anew.
    pub fn set_seq_len(&mut self, gpu: &mut GpuContext, seq_len: usize) -> Result<()> {
        if seq_len == self.cfg.seq_len {
            return Ok(());
        }
        if seq_len == 0 {
            return Err(Error::InvalidArgument {
                op: "train",
                message: "seq_len must be > 0".into(),
            });
        }
        let cfg = self.cfg.with_seq_len(seq_len);
        check_shapes(&cfg)?;
        self.graph = None;
        gpu.synchronize()?;
        let doubled = gpu.faults().activations_doubled;
        self.ws = Workspace::new(gpu, &cfg, &self.base.linears(), doubled, &self.options)?;
        self.cfg = cfg;
        Ok(())
    }

    /// The next training batch, `[batch, seq_len + 1]`. A rank of a world
    /// of `n` draws the batch of `n x batch` rows one GPU would train on and
    /// keeps its own consecutive `batch` rows, so the world sees the same
    /// data in the same order as one GPU at the whole batch.
    pub fn next_batch(&mut self) -> Result<Vec<u32>> {
        let (rank, world) = self.dist.as_ref().map_or((0, 1), |d| (d.rank(), d.world()));
        let (b, s) = (self.cfg.batch, self.cfg.seq_len);
        let mut all = self.corpus.batch(&mut self.data_rng, b * world, s)?;
        let rows = b * (s + 1);
        all.drain(..rank * rows);
        all.truncate(rows);
        Ok(all)
    }

    /// `n` batches from a stream of their own (seeded by `seed`).
    pub fn eval_batches(&self, n: usize, seed: u64) -> Result<Vec<Vec<u32>>> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..n)
            .map(|_| {
                self.corpus
                    .batch(&mut rng, self.cfg.batch, self.cfg.seq_len)
            })
            .collect()
    }

    fn read_loss(&mut self, gpu: &GpuContext) -> Result<f64> {
        let v = self.sync.host_read(gpu, &self.ws.loss.as_view())?;
        v.first()
            .map(|&x| f64::from(x))
            .ok_or_else(|| Error::InvalidArgument {
                op: "train",
                message: "the loss buffer is empty".into(),
            })
    }

    /// Resizes for `tokens` when they are `[batch, s + 1]` with another `s`.
    fn fit(&mut self, gpu: &mut GpuContext, tokens: &[u32]) -> Result<()> {
        let b = self.cfg.batch;
        if tokens.len().is_multiple_of(b) && tokens.len() / b >= 2 {
            self.set_seq_len(gpu, tokens.len() / b - 1)?;
        }
        Ok(())
    }

    fn upload_batch(&mut self, gpu: &GpuContext, tokens: &[u32]) -> Result<()> {
        let (b, s) = (self.cfg.batch, self.cfg.seq_len);
        let (inputs, targets) = corpus::inputs_targets(tokens, b, s)?;
        gpu.stream().memcpy_htod(&inputs, &mut self.ws.inputs)?;
        gpu.stream().memcpy_htod(&targets, &mut self.ws.targets)?;
        Ok(())
    }

    /// The mean loss of `tokens` (`[batch, seq_len + 1]`), forward only.
    pub fn loss(&mut self, gpu: &mut GpuContext, tokens: &[u32]) -> Result<f64> {
        self.fit(gpu, tokens)?;
        self.upload_batch(gpu, tokens)?;
        self.forward(gpu, Pass::Loss)?;
        self.sync.this_step = 0;
        self.read_loss(gpu)
    }

    /// The logits `[batch * seq_len, vocab]` of `tokens` (`[batch,
    /// seq_len + 1]`; the last column is only a target), forward only.
    pub fn logits(&mut self, gpu: &mut GpuContext, tokens: &[u32]) -> Result<Vec<f32>> {
        self.loss(gpu, tokens)?;
        self.last_logits(gpu)
    }

    /// The trainable tensors as they are now on the device (f32 values).
    pub fn trainable(&self, gpu: &GpuContext) -> Result<Trainable> {
        let tensors = self
            .params
            .p
            .iter()
            .map(|dev| Ok(gpu.download(dev)?.into_iter().map(f64::from).collect()))
            .collect::<Result<Vec<_>>>()?;
        Ok(Trainable {
            config: self.cfg,
            tensors,
            scale: self.params.scale,
        })
    }

    /// The mean loss over `batches`, without training.
    pub fn eval_loss(&mut self, gpu: &mut GpuContext, batches: &[Vec<u32>]) -> Result<f64> {
        let mut sum = 0.0;
        for t in batches {
            sum += self.loss(gpu, t)?;
        }
        Ok(sum / batches.len().max(1) as f64)
    }

    /// The loss of `tokens`, the gradient of every trainable tensor (before
    /// clipping) and the clip's squared norms, copied to the host: a step's
    /// forward, backward, all-reduce and clip (`GpuTrainer::reduce_then_clip`,
    /// in the step's order), without AdamW.
    pub fn loss_and_grads(&mut self, gpu: &mut GpuContext, tokens: &[u32]) -> Result<LossAndGrads> {
        self.fit(gpu, tokens)?;
        self.upload_batch(gpu, tokens)?;
        self.forward(gpu, Pass::Train)?;
        self.backward(gpu)?;
        self.reduce_then_clip(gpu)?;
        self.sync.this_step = 0;
        let loss = self.read_loss(gpu)?;
        let grads = self
            .params
            .g
            .iter()
            .map(|g| gpu.download(g))
            .collect::<Result<Vec<_>>>()?;
        let mut clip_sq = Vec::with_capacity(self.clip.len());
        for group in &self.clip {
            clip_sq.extend(gpu.download(&group.sq)?);
        }
        Ok(LossAndGrads {
            loss,
            grads,
            clip_sq,
        })
    }

    /// One step on the next batch.
    pub fn step(&mut self, gpu: &mut GpuContext) -> Result<GpuStepReport> {
        let tokens = self.next_batch()?;
        self.step_on(gpu, &tokens)
    }

    /// One step on `tokens` (`[batch, seq_len + 1]`): forward, backward, clip,
    /// AdamW; eager, or as a captured graph (captured on the second step).
    pub fn step_on(&mut self, gpu: &mut GpuContext, tokens: &[u32]) -> Result<GpuStepReport> {
        self.fit(gpu, tokens)?;
        self.sync.this_step = 0;
        self.upload_batch(gpu, tokens)?;
        let graphed = self.options.graph && !gpu.faults().graph_replay_disabled;
        let mut replayed = false;
        if graphed && self.steps_done >= 1 {
            if self.graph.is_none() {
                self.graph = Some(self.capture(gpu)?);
            }
            if let Some(g) = &self.graph {
                g.launch()?;
                replayed = true;
            }
        } else {
            self.body(gpu)?;
        }
        let loss = self.read_loss(gpu)?;
        self.steps_done += 1;
        self.sync.counts.per_step.push(self.sync.this_step);
        Ok(GpuStepReport { loss, replayed })
    }

    /// Captures one whole step into a graph. A failed capture still leaves
    /// the stream out of capture mode.
    fn capture(&mut self, gpu: &mut GpuContext) -> Result<CudaGraph> {
        self.sync.capturing = true;
        let captured = gpu.capture(|gpu| {
            self.body(gpu)?;
            if gpu.faults().host_sync_inside_capture {
                // The fault: read the clip's squared norm on the host
                // mid-step, as a host-side clipping decision would.
                let sq = self.clip[0].sq.as_view();
                self.sync.host_read(gpu, &sq)?;
            }
            Ok(())
        });
        self.sync.capturing = false;
        Ok(captured?.1)
    }

    /// Forward, backward, the ranks' all-reduce, clip and AdamW, queued on
    /// the stream.
    fn body(&mut self, gpu: &mut GpuContext) -> Result<()> {
        // The serialised-ranks fault: every rank's share of compute, in turn.
        let passes = match &self.dist {
            Some(d) if gpu.faults().dp_ranks_serialised => d.world(),
            _ => 1,
        };
        for _ in 0..passes {
            self.forward(gpu, Pass::Train)?;
            self.backward(gpu)?;
        }
        self.reduce_then_clip(gpu)?;
        let times = if gpu.faults().optimizer_step_twice {
            2
        } else {
            1
        };
        for _ in 0..times {
            self.adamw(gpu)?;
        }
        if gpu.faults().lora_weights_bf16 {
            for p in &mut self.params.p {
                crate::ops::faults::round_to_bf16(gpu, p)?;
            }
        }
        Ok(())
    }

    /// The ranks' all-reduce, then the clip's norms and scales: the clip
    /// must see the whole batch's gradient, which a rank only has after the
    /// all-reduce. Under [`crate::Faults::dp_clip_before_all_reduce`], with
    /// ranks, the other way round: each rank's clip norm is its own shard's.
    fn reduce_then_clip(&mut self, gpu: &mut GpuContext) -> Result<()> {
        if self.dist.is_some() && gpu.faults().dp_clip_before_all_reduce {
            self.clip_grads(gpu)?;
            return self.all_reduce_grads(gpu);
        }
        self.all_reduce_grads(gpu)?;
        self.clip_grads(gpu)
    }

    /// The mean of every trainable gradient over the ranks, in one NCCL
    /// group on the work stream; nothing when training alone.
    fn all_reduce_grads(&mut self, gpu: &mut GpuContext) -> Result<()> {
        let Some(dist) = &self.dist else {
            return Ok(());
        };
        let f = gpu.faults();
        if f.dp_all_reduce_skipped {
            self.reduced_bytes = 0;
            return Ok(());
        }
        if f.dp_host_wait_at_all_reduce {
            // The fault: wait on the host for the gradients before reducing,
            // as a host-driven exchange would.
            if let Some(g) = self.params.g.first() {
                self.sync.host_read(gpu, &g.as_view())?;
            }
        }
        let mut bufs: Vec<&mut CudaSlice<f32>> = self.params.g.iter_mut().collect();
        if f.dp_frozen_tensor_reduced {
            bufs.push(&mut self.base.final_norm);
        }
        self.reduced_bytes = bufs.iter().map(|b| 4 * b.len()).sum();
        dist.all_reduce(&mut bufs, f.dp_sum_instead_of_mean)
    }

    fn math(&self, gpu: &GpuContext) -> (GemmMath, GemmMath) {
        (
            self.options
                .forward_math
                .unwrap_or(gpu.options().forward_math),
            self.options
                .backward_math
                .unwrap_or(gpu.options().backward_math),
        )
    }

    fn attn_shape(&self) -> AttnShape {
        attn_shape(&self.cfg)
    }

    /// What every layer's launches share in this step's forward and backward.
    fn layer_ctx(&self, gpu: &GpuContext) -> LayerCtx {
        let (fwd, bwd) = self.math(gpu);
        let lora_s = self.params.scale;
        // The fault: the LoRA backward applies s twice.
        let s_bwd = if gpu.faults().lora_backward_scale_twice {
            lora_s * lora_s
        } else {
            lora_s
        } as f32;
        LayerCtx {
            c: self.cfg,
            fwd,
            bwd,
            attn: self.attn_shape(),
            attn_kernels: self.options.attention_kernels((fwd, bwd), gpu.faults()),
            lora_s: lora_s as f32,
            lora_s_bwd: s_bwd,
        }
    }

    /// `x0 = emb[inputs]`, every layer in order, then the loss
    /// ([`GpuTrainer::head_forward`]).
    fn forward(&mut self, gpu: &mut GpuContext, pass: Pass) -> Result<()> {
        let c = self.cfg;
        let ctx = self.layer_ctx(gpu);
        let ws = &mut self.ws;
        let (inputs, x0) = (&ws.inputs.as_view(), &mut ws.xs[0].as_view_mut());
        match &self.base.embedding {
            Table::F32(t) => embedding::forward(gpu, &t.as_view(), c.vocab, c.hidden, inputs, x0)?,
            Table::Bf16(t) => {
                embedding::forward_bf16(gpu, &t.as_view(), c.vocab, c.hidden, inputs, x0)?
            }
        }
        if let Some(rows) = &self.lora_a_rows {
            rows.write(gpu)?;
        }
        let base = &mut self.base;
        for (l, (w, bias)) in base.layers.iter().zip(&base.qkv_bias).enumerate() {
            let gate_up = base.gate_up.get(l);
            let layer = DecoderLayer::new(
                l,
                (w, bias, base.stacks_nf4.get(l)),
                gate_up,
                &self.params.p,
            );
            let stacks = Stacks {
                f32: base.stacks.get_mut(l),
                f16: base.stacks_f16.get_mut(l),
                bf16: match base.stacks_bf16.get_mut(l) {
                    Some(s) => Some(BfStack::Own(s)),
                    None => ws.stack_bf16.is_some().then_some(BfStack::Dequantised),
                },
            };
            layer.forward(gpu, &ctx, ws, stacks)?;
        }
        self.head_forward(gpu, ctx.fwd, pass)
    }

    /// `dx` of `x_L` ([`GpuTrainer::head_backward`]), then every layer in
    /// reverse, each turning `dx` into the gradient of its input and writing
    /// its trainable gradients.
    fn backward(&mut self, gpu: &mut GpuContext) -> Result<()> {
        let ctx = self.layer_ctx(gpu);
        self.head_backward(gpu, ctx.bwd)?;
        let ws = &mut self.ws;
        let g = &mut self.params.g;
        let base = &self.base;
        for (l, (w, bias)) in base.layers.iter().zip(&base.qkv_bias).enumerate().rev() {
            let stack = match base.stacks_bf16.get(l) {
                Some(s) => StackRef::Bf16(Some(s)),
                None if ws.stack_bf16.is_some() => StackRef::Bf16(None),
                None => StackRef::F32(base.stacks.get(l)),
            };
            let gate_up = base.gate_up.get(l);
            let layer = DecoderLayer::new(
                l,
                (w, bias, base.stacks_nf4.get(l)),
                gate_up,
                &self.params.p,
            );
            layer.backward(gpu, &ctx, ws, stack, g)?;
        }
        // One launch for every norm weight's gradient, each summed as its
        // own launch after its backward would (the same values).
        ws.grads.norm.sum_slots(gpu, &self.norm_grads)?;
        gpu.join_side_stream()
    }

    /// Global (or per-layer) norm clipping, entirely on the device: each
    /// group's squared norm and scale. The scale is applied to the gradients
    /// inside the AdamW launch (`g * scale` in f32, as a separate pass would).
    fn clip_grads(&mut self, gpu: &mut GpuContext) -> Result<()> {
        let max_norm = self.options.hyper.max_grad_norm;
        for group in &mut self.clip {
            clip_ops::squared_sum_table(
                gpu,
                &group.table,
                &mut group.sum_ws,
                &mut group.sq.as_view_mut(),
            )?;
            clip_ops::scale(
                gpu,
                &group.sq.as_view(),
                max_norm,
                &mut group.scale.as_view_mut(),
            )?;
        }
        Ok(())
    }

    /// `t += 1` on the device, then AdamW on every trainable tensor.
    fn adamw(&mut self, gpu: &mut GpuContext) -> Result<()> {
        let h = self.options.hyper;
        let opt = AdamW::new(h.lr, h.weight_decay);
        let sign = if gpu.faults().adamw_update_sign_flipped {
            -1.0
        } else {
            1.0
        };
        kernels::advance_step(gpu, &mut self.step_count, 1)?;
        // The table addresses params' p, g, m, v: AdamW writes p, m, v in
        // place, which this &mut self borrow makes exclusive.
        kernels::adamw_table(gpu, &self.optimizer, &self.step_count, &opt, sign)
    }
}

/// The optimizer's table: for every trainable tensor its parameter, gradient,
/// moments and the scale of its clip group (none for a tensor in no group).
fn optimizer_table(gpu: &GpuContext, params: &Params, clip: &[ClipGroup]) -> Result<TensorTable> {
    let mut scales = vec![0u64; params.p.len()];
    for group in clip {
        let scale = address(gpu, &group.scale);
        for &i in &group.tensors {
            scales[i] = scale;
        }
    }
    let col = |bufs: &[CudaSlice<f32>]| bufs.iter().map(|b| address(gpu, b)).collect::<Vec<_>>();
    let lens: Vec<usize> = params.p.iter().map(|p| p.len()).collect();
    TensorTable::new(
        gpu,
        &[
            col(&params.p),
            col(&params.g),
            col(&params.m),
            col(&params.v),
            scales,
        ],
        &lens,
    )
}

/// The device memory a trainer of `cfg` plans to allocate, in bytes: the
/// frozen base (f32, bf16, or NF4 codes + block absmax + one dequantisation
/// target per distinct projection size), the q/k/v biases, the embedding and
/// LM head (bf16 for a base that computes in bf16, else f32; one table where they are tied), the
/// trainable state (parameters, gradients and two moments: 16 bytes each),
/// the kept `W^T` copies (fp32 base with `transposed_weights`: o, gate, up,
/// down), the LM head's f16 copy (`f16_lm_head`), the projections' f16
/// copies (`f16_projections`) and the workspace. What `GpuTrainer::new` refuses to start beyond.
pub fn planned_device_bytes(cfg: &ModelConfig, options: &GpuTrainOptions) -> usize {
    let base = options.base;
    // The q/k/v bias is kept in f32 whatever the base format, and held as
    // zeros by a model without one.
    let bias_len = cfg.q_dim() + 2 * cfg.kv_dim();
    let n_bias = if cfg.qkv_bias { bias_len } else { 0 };
    let n_base = cfg.layers * (cfg.base_params_per_layer() - n_bias);
    let transposed = if base == BaseWeights::Fp32 && options.transposed_weights {
        4 * cfg.layers * cfg.hidden * (cfg.q_dim() + 3 * cfg.intermediate)
    } else {
        0
    };
    let width = super::workspace::qkv_width(cfg);
    let base_bytes = match base {
        // The q/k/v stacks hold q, k, v and a copy of the LoRA A rows.
        BaseWeights::Fp32 => 4 * n_base + 4 * cfg.layers * 2 * cfg.lora_rank * cfg.hidden,
        BaseWeights::Bf16 => 2 * n_base + 2 * cfg.layers * 2 * cfg.lora_rank * cfg.hidden,
        // 4-bit codes plus one f32 absmax per 64 values, and one
        // dequantisation target per distinct size of the projections
        // outside the q/k/v stack (as Workspace::new allocates them: o, the
        // MLP's three; in bf16, one of gate and up together in place of
        // theirs), and the q/k/v stack each layer dequantises into; the
        // targets and the stack in bf16 when the base computes in bf16,
        // else in f32.
        BaseWeights::Nf4 | BaseWeights::Nf4Bf16 => {
            let h = cfg.hidden;
            let mut sizes = vec![h * cfg.q_dim(), h * cfg.intermediate];
            sizes.sort_unstable();
            sizes.dedup();
            if base.computes_in_bf16() {
                sizes = super::workspace::gate_up_targets(cfg, sizes);
            }
            let targets: usize = sizes.iter().sum();
            let element = if base.computes_in_bf16() { 2 } else { 4 };
            n_base / 2 + 4 * (n_base / 64) + element * (targets + width * h)
        }
    };
    // A tied head is the embedding itself.
    let tables = if cfg.tied_embeddings { 1 } else { 2 };
    let table_bytes = if base.computes_in_bf16() { 2 } else { 4 };
    let embed_head = table_bytes * tables * cfg.vocab * cfg.hidden + 4 * cfg.layers * bias_len;
    let f16_head = if options.f16_lm_head {
        2 * cfg.vocab * cfg.hidden
    } else {
        0
    };
    // An f16 copy of every frozen projection and of each q/k/v stack's LoRA A rows.
    let f16_projections = if options.f16_projections && base == BaseWeights::Fp32 {
        2 * n_base + 2 * cfg.layers * 2 * cfg.lora_rank * cfg.hidden
    } else {
        0
    };
    base_bytes
        + transposed
        + embed_head
        + f16_head
        + f16_projections
        + 16 * cfg.trainable_params()
        + super::workspace::Workspace::planned_bytes(cfg, options)
}

/// `options` as the trainer honours them: `f16_lm_head` is refused unless
/// both directions' GEMM math is TF32 and `f16_projections` unless the
/// forward's is and the base is fp32 (f16 operands are TF32's precision, not
/// FP32's; an NF4 base dequantises to f32 each use); each is dropped under
/// its `_ignored` fault ([`crate::Faults::f16_lm_head_ignored`],
/// [`crate::Faults::f16_projections_ignored`]).
fn honoured_options(gpu: &GpuContext, options: GpuTrainOptions) -> Result<GpuTrainOptions> {
    let math = (
        options.forward_math.unwrap_or(gpu.options().forward_math),
        options.backward_math.unwrap_or(gpu.options().backward_math),
    );
    honoured_with(options, math, gpu.faults())
}

/// [`honoured_options`] for the GEMM math `(fwd, bwd)` the step will run
/// and the context's `faults`.
fn honoured_with(
    options: GpuTrainOptions,
    (fwd, bwd): (GemmMath, GemmMath),
    faults: crate::Faults,
) -> Result<GpuTrainOptions> {
    let refuse = |message: String| Error::InvalidArgument {
        op: "train",
        message,
    };
    if options.f16_lm_head && (fwd, bwd) != (GemmMath::Tf32, GemmMath::Tf32) {
        return Err(refuse(format!(
            "f16_lm_head needs TF32 GEMMs in both directions, got {fwd:?} forward and {bwd:?} backward"
        )));
    }
    if options.f16_lm_head && options.base.computes_in_bf16() {
        return Err(refuse(format!(
            "f16_lm_head needs an fp32 base: a {} base runs its LM head in bf16",
            options.base.name()
        )));
    }
    if options.f16_projections && (fwd, options.base) != (GemmMath::Tf32, BaseWeights::Fp32) {
        return Err(refuse(format!(
            "f16_projections needs TF32 forward GEMMs and an fp32 base, got {fwd:?} and {:?}",
            options.base
        )));
    }
    Ok(GpuTrainOptions {
        f16_lm_head: options.f16_lm_head && !faults.f16_lm_head_ignored,
        f16_projections: options.f16_projections && !faults.f16_projections_ignored,
        ..options
    })
}

/// The error of a workspace whose LM-head gradient is in another format
/// than the head's GEMM operands (f16 where the base has no f16 copy, f32
/// or f16 beside a bf16 head, ...): never a silent fallback.
fn head_mismatch() -> Error {
    Error::InvalidArgument {
        op: "train",
        message: "the workspace's LM-head gradient and the base's LM head disagree on the format"
            .into(),
    }
}

/// Refuses, before allocating anything, a configuration whose planned device
/// memory ([`planned_device_bytes`]) exceeds what is free:
/// [`Error::OutOfMemory`], which a run records as `skipped`.
fn refuse_if_too_big(gpu: &GpuContext, cfg: &ModelConfig, options: &GpuTrainOptions) -> Result<()> {
    let needed = planned_device_bytes(cfg, options);
    let (free, _total) = gpu.context().mem_get_info()?;
    if needed > free {
        let gib = |b: usize| b as f64 / f64::from(1u32 << 30);
        return Err(Error::OutOfMemory {
            model: format!("{} (batch {}, seq {})", cfg.name, cfg.batch, cfg.seq_len),
            needed_gib: gib(needed),
            available_gib: gib(free),
        });
    }
    Ok(())
}

/// One layer's attention at `cfg`'s batch and sequence length.
fn attn_shape(cfg: &ModelConfig) -> AttnShape {
    AttnShape {
        batch: cfg.batch,
        seq: cfg.seq_len,
        heads: cfg.heads,
        kv_heads: cfg.kv_heads,
        head_dim: cfg.head_dim,
    }
}

/// Checks that the step's kernels take `cfg` at its batch and sequence
/// length (a trainer checks it too, before it allocates anything): the
/// architecture ([`check_architecture`]), one layer's attention
/// ([`crate::ops::attention::check_shape`]) and fused q/k/v epilogue
/// ([`crate::ops::rope::QkvShape::check`]), and the norms, the embedding and
/// the cross-entropy over its `batch x seq_len` tokens.
pub fn check_shapes(cfg: &ModelConfig) -> Result<()> {
    check_architecture(cfg)?;
    let tokens = cfg.batch.saturating_mul(cfg.seq_len);
    crate::ops::attention::check_shape(&attn_shape(cfg))?;
    super::layer::qkv_shape(cfg).check()?;
    rmsnorm::check_shape(tokens, cfg.hidden)?;
    embedding::check_shape(tokens, cfg.vocab, cfg.hidden)?;
    cross_entropy::check_shape(tokens, cfg.vocab)
}

/// Refuses a configuration whose RoPE theta or RMSNorm epsilon is not a
/// finite positive number, as `theta^(-2i / head_dim)` and
/// `1 / sqrt(mean(x^2) + eps)` need. A q/k/v bias, a tied head and any such
/// theta and epsilon are computed as the configuration says.
pub fn check_architecture(cfg: &ModelConfig) -> Result<()> {
    let positive = |x: f64| x.is_finite() && x > 0.0;
    if positive(cfg.rope_theta) && positive(cfg.rms_eps) {
        return Ok(());
    }
    Err(Error::InvalidArgument {
        op: "train",
        message: format!(
            "{}: rope_theta {} and rms_norm_eps {} must be finite and positive",
            cfg.name, cfg.rope_theta, cfg.rms_eps
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Faults;

    /// Qwen2's architecture is computed as configured; a theta or epsilon
    /// no formula takes is refused by name.
    #[test]
    fn qwen2_architectures_pass_and_impossible_constants_are_refused() {
        let tiny = crate::model::PRESETS[0];
        let qwen2 = ModelConfig {
            qkv_bias: true,
            tied_embeddings: true,
            rope_theta: 25_000.0,
            rms_eps: 1e-3,
            ..tiny
        };
        assert!(check_shapes(&qwen2).is_ok());
        for (theta, eps) in [
            (0.0, 1e-6),
            (f64::NAN, 1e-6),
            (1e6, -1e-6),
            (1e6, f64::INFINITY),
        ] {
            let cfg = ModelConfig {
                rope_theta: theta,
                rms_eps: eps,
                ..tiny
            };
            let e = check_shapes(&cfg).unwrap_err().to_string();
            assert!(e.contains("rope_theta") && e.contains("positive"), "{e}");
        }
        for preset in crate::model::PRESETS {
            assert!(check_architecture(&preset).is_ok(), "{}", preset.name);
        }
    }

    #[test]
    fn presets_fit_the_kernels_and_a_batch_past_the_grid_does_not() {
        for preset in crate::model::PRESETS {
            assert!(check_shapes(&preset).is_ok(), "{}", preset.name);
        }
        let tiny = crate::model::PRESETS[0];
        let e = check_shapes(&tiny.with_batch(70_000).with_seq_len(1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("batch"), "{e}");
    }

    const TF32: (GemmMath, GemmMath) = (GemmMath::Tf32, GemmMath::Tf32);

    /// f16 operands are refused where their precision or their copies do
    /// not apply, and dropped (not refused) under their `_ignored` faults.
    #[test]
    fn f16_operands_need_tf32_math_and_an_fp32_base() {
        let projections = GpuTrainOptions {
            f16_projections: true,
            ..GpuTrainOptions::default()
        };
        assert!(
            honoured_with(projections, TF32, Faults::NONE)
                .unwrap()
                .f16_projections
        );
        let fp32_forward = (GemmMath::Fp32, GemmMath::Tf32);
        let e = honoured_with(projections, fp32_forward, Faults::NONE).unwrap_err();
        assert!(
            e.to_string().contains("f16_projections needs TF32 forward"),
            "{e}"
        );
        let nf4 = GpuTrainOptions {
            base: BaseWeights::Nf4,
            ..projections
        };
        let e = honoured_with(nf4, TF32, Faults::NONE).unwrap_err();
        assert!(
            e.to_string().contains("an fp32 base, got Tf32 and Nf4"),
            "{e}"
        );
        let ignored = Faults {
            f16_projections_ignored: true,
            ..Faults::NONE
        };
        assert!(
            !honoured_with(projections, TF32, ignored)
                .unwrap()
                .f16_projections
        );

        let head = GpuTrainOptions {
            f16_lm_head: true,
            ..GpuTrainOptions::default()
        };
        let fp32_backward = (GemmMath::Tf32, GemmMath::Fp32);
        let e = honoured_with(head, fp32_backward, Faults::NONE).unwrap_err();
        assert!(
            e.to_string().contains("f16_lm_head needs TF32 GEMMs"),
            "{e}"
        );
        assert!(honoured_with(head, TF32, Faults::NONE).unwrap().f16_lm_head);
    }

    /// The f16 projections add two bytes per frozen projection weight (not
    /// bias) and per LoRA A row of each stack, and the f16 input buffer (the widest
    /// projection input, `T x intermediate`).
    #[test]
    fn f16_projections_are_planned() {
        let c = ModelConfig::preset("qwen2.5-0.5b").unwrap();
        let fast = GpuTrainOptions {
            backward_math: Some(GemmMath::Tf32),
            keep_mlp: true,
            transposed_weights: true,
            f16_lm_head: true,
            ..GpuTrainOptions::default()
        };
        let with = GpuTrainOptions {
            f16_projections: true,
            ..fast
        };
        // The q/k/v bias is added in f32 and has no f16 copy.
        let weights = ModelConfig {
            qkv_bias: false,
            ..c
        }
        .base_params_per_layer();
        let copies = 2 * c.layers * (weights + 2 * c.lora_rank * c.hidden);
        let input = 2 * c.tokens() * (c.intermediate - c.hidden);
        assert_eq!(
            planned_device_bytes(&c, &with) - planned_device_bytes(&c, &fast),
            copies + input
        );
    }

    /// A bf16 base runs its head in bf16: an f16 head beside it is refused,
    /// and the mode is named for it.
    #[test]
    fn a_bf16_base_refuses_an_f16_head() {
        let bf16 = GpuTrainOptions {
            base: BaseWeights::Bf16,
            ..GpuTrainOptions::default()
        };
        assert!(honoured_with(bf16, TF32, Faults::NONE).is_ok());
        let head = GpuTrainOptions {
            f16_lm_head: true,
            ..bf16
        };
        let e = honoured_with(head, TF32, Faults::NONE).unwrap_err();
        assert!(
            e.to_string().contains("f16_lm_head needs an fp32 base"),
            "{e}"
        );
        let projections = GpuTrainOptions {
            f16_projections: true,
            ..bf16
        };
        assert!(honoured_with(projections, TF32, Faults::NONE).is_err());
        assert!(bf16.mode_name().contains("/bf16"), "{}", bf16.mode_name());
    }

    /// A bf16 base plans two bytes per frozen weight (projections, LoRA A
    /// rows of each stack, the tied embedding) where fp32 plans four, one
    /// chunk of bf16 logits (`HEAD_CHUNK_ROWS` rows, turned into their
    /// gradient in place) where fp32 plans the whole batch's logits and their
    /// gradient in f32, and the bf16 input buffers
    /// (the widest frozen GEMM input, `T x intermediate` for qwen2.5-0.5b,
    /// and SwiGLU's second gradient, `T x intermediate`).
    #[test]
    fn a_bf16_base_is_planned_at_half_the_bytes() {
        let c = ModelConfig::preset("qwen2.5-0.5b").unwrap();
        let fp32 = GpuTrainOptions::default();
        let bf16 = GpuTrainOptions {
            base: BaseWeights::Bf16,
            ..fp32
        };
        let weights = ModelConfig {
            qkv_bias: false,
            ..c
        }
        .base_params_per_layer();
        let frozen = c.layers * (weights + 2 * c.lora_rank * c.hidden) + c.vocab * c.hidden;
        let t = c.tokens();
        let widest = c.intermediate.max(super::super::workspace::qkv_width(&c));
        let chunk = super::super::workspace::HEAD_CHUNK_ROWS;
        assert!(chunk < t, "qwen2.5-0.5b's head runs in several chunks");
        // Attention keeps each row's log-sum-exp instead of its
        // probabilities in every layer, and its backward's scratch holds dS
        // in bf16 (seq is a multiple of 8: rows unpadded) and D.
        let probs = c.batch * c.heads * c.seq_len * c.seq_len;
        let rows = c.batch * c.heads * c.seq_len;
        let attention = 4 * c.layers * (probs - rows) + 2 * probs - 4 * rows;
        // The scratch's gate and up and SwiGLU's output gradient are bf16
        // (the layers keep none here), and SwiGLU's f32 product and input
        // gradients are not needed.
        let gate_up = 3 * 2 * t * c.intermediate + 3 * 4 * t * c.intermediate;
        // Each layer keeps its MLP norm as the bf16 operand, not in f32, and
        // attention's q, k and v in bf16.
        let norm = c.layers * 2 * t * c.hidden;
        let qkv = c.layers * 2 * t * (c.q_dim() + 2 * c.kv_dim());
        let saved =
            2 * frozen + 8 * t * c.vocab - 2 * chunk * c.vocab + attention + gate_up + norm + qkv;
        // The bf16 GEMM inputs: one as wide as the widest, and `dgate | dup`.
        let added = 2 * t * widest + 2 * 2 * t * c.intermediate;
        assert_eq!(
            planned_device_bytes(&c, &fp32) + added - saved,
            planned_device_bytes(&c, &bf16)
        );
    }

    /// An NF4 base computing in bf16 plans a bf16 base's workspace and
    /// tables, with the projections as NF4 codes and block absmax in place
    /// of their bf16 copies, plus its bf16 dequantisation targets (o's, and
    /// one of gate and up together) and the bf16 q/k/v stack.
    #[test]
    fn an_nf4_base_in_bf16_replaces_the_projections_by_codes() {
        let c = ModelConfig::preset("qwen2.5-0.5b").unwrap();
        let bf16 = GpuTrainOptions {
            base: BaseWeights::Bf16,
            keep_mlp: true,
            ..GpuTrainOptions::default()
        };
        let nf4_bf16 = GpuTrainOptions {
            base: BaseWeights::Nf4Bf16,
            ..bf16
        };
        let n = c.layers * (c.base_params_per_layer() - (c.q_dim() + 2 * c.kv_dim()));
        let width = super::super::workspace::qkv_width(&c);
        let h = c.hidden;
        // o, and one of gate and up together, whose front serves down (q,
        // k and v are dequantised into the stack).
        let targets = h * c.q_dim() + 2 * h * c.intermediate;
        let lora_rows = c.layers * 2 * c.lora_rank * h;
        let bf16_projections = 2 * n + 2 * lora_rows;
        let nf4_projections = n / 2 + 4 * (n / 64) + 2 * (targets + width * h);
        assert_eq!(
            planned_device_bytes(&c, &bf16) - bf16_projections + nf4_projections,
            planned_device_bytes(&c, &nf4_bf16)
        );
        assert_eq!(nf4_bf16.mode_name(), "eager/global-clip/nf4-bf16/keep-mlp");
    }
}
