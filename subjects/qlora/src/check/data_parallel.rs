//! `data_parallel`: the data-parallel step on `ranks` GPUs (one process per
//! rank, NCCL all-reduce of the trainable gradients) held to the one-GPU
//! step. One claim per test:
//!
//! - `trajectory`: `max_c |mean_r loss_r(c) - loss_1(c)| <= max_abs_diff`,
//!   `ranks x batch` against one GPU at batch `ranks x batch`, same data order;
//! - `gradients`: `max_r ||g_r - g_1|| / ||g_1|| <= tolerance`, each rank's
//!   all-reduced gradient of the first batch against one GPU's;
//! - `clip_norm`: `max_r |sqrt(sum_k S_rk) - sqrt(sum_k S_1k)| / sqrt(sum_k S_1k)
//!   <= tolerance`, with `S_k` the squared norm the clip computed for its
//!   group `k` on the first batch: each rank's clip norm against one GPU's at
//!   the whole batch (the norm, not the scale, so it holds the clip to the
//!   reduced gradient whether or not `max_grad_norm` makes it scale);
//! - `traffic`: bytes all-reduced per step `== 4 x trainable parameters`;
//! - `sync`: host syncs inside each rank's captured region `== 0`, at most
//!   one per step, and the step replayed;
//! - `scaling`: tokens/s of the world `>= min_ratio x` one GPU at the same
//!   per-rank batch (median step times after `warmup` steps).

use std::time::Duration;

use crate::check::stats::{median, ratio_ci, BOOTSTRAP_RESAMPLES};
use crate::check::training::*;
use crate::check::{require_gpu, Comparator};
use crate::error::{Error, Result};
use crate::mutant::Mutant;
use crate::ranks::{launch, RankJob, RankReply};
use qlora::gpu::GpuContext;
use qlora::model::ModelConfig;
use qlora::train::{GpuTrainOptions, GpuTrainer, LossAndGrads};

use serde::Deserialize;

use super::doc::{ParamDefault::*, ParamDoc, Piece::*};
use super::doc::{DEFAULT_HYPER, DEFAULT_STEP_MODE, HYPER_BOUND, MODEL_BOUND, STEP_MODE_BOUND};
use super::params::{at_most, Count, Hyper, ModelName, NonNegative, Positive, StepMode};
use super::trajectory_match::mutant_prefix;
use super::{Backend, Here, Kind, Measurement, Speedup, TrialContext, Validate};

/// What a `data_parallel` test claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Claim {
    Trajectory,
    Gradients,
    ClipNorm,
    Traffic,
    Sync,
    Scaling,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub claim: Claim,
    pub model: ModelName,
    /// GPUs, one rank each: 2 to [`MAX_RANKS`].
    #[serde(default = "two")]
    pub ranks: Count,
    /// Rows per rank; the preset's batch by default.
    #[serde(default)]
    pub batch: Option<Count>,
    #[serde(default = "one")]
    pub steps: Count,
    #[serde(default)]
    pub checkpoints: Vec<Count>,
    #[serde(default)]
    pub mode: StepMode,
    #[serde(default)]
    pub hyper: Hyper,
    /// Untimed steps first (`scaling`).
    #[serde(default = "ten")]
    pub warmup: Count,
    pub max_abs_diff: Option<NonNegative>,
    pub tolerance: Option<NonNegative>,
    pub min_ratio: Option<Positive>,
}

fn two() -> Count {
    Count(2)
}
fn one() -> Count {
    Count(1)
}
fn ten() -> Count {
    Count(10)
}

/// Most ranks a test asks for (the GPUs of one host).
pub const MAX_RANKS: usize = 8;
/// Most rows per rank.
pub const MAX_BATCH: usize = 1024;
/// The launcher's limit, inside the kind's timeout so that a hung rank
/// costs a clean `error` row naming it.
const LAUNCH_TIMEOUT_S: f64 = 0.8 * TRAINING_TIMEOUT_S;

/// The parameters of `data_parallel`, for the generated reference.
pub const PARAMS: &[ParamDoc] = &[
    ParamDoc {
        name: "claim",
        default: Required,
        bound: &[OneOf(&["trajectory", "gradients", "clip_norm", "traffic", "sync", "scaling"])],
        meaning: "what is compared with one GPU (see the kind's description)",
    },
    ParamDoc {
        name: "model",
        default: Required,
        bound: MODEL_BOUND,
        meaning: "the preset trained",
    },
    ParamDoc {
        name: "ranks",
        default: Yaml("2"),
        bound: &[Text("2 to "), Int(MAX_RANKS), Text("; needs that many GPUs")],
        meaning: "GPUs, one rank process each",
    },
    ParamDoc {
        name: "batch",
        default: Otherwise("the preset's"),
        bound: &[Text("1 to "), Int(MAX_BATCH)],
        meaning: "rows per rank (one GPU trains `ranks x batch`, or `batch` for `scaling`)",
    },
    ParamDoc {
        name: "steps",
        default: Yaml("1"),
        bound: &[Text("1 to "), Int(MAX_STEPS)],
        meaning: "training steps of each run",
    },
    ParamDoc {
        name: "checkpoints",
        default: Yaml("[]"),
        bound: &[Text("`trajectory`: 1 or more step numbers, each <= `steps`")],
        meaning: "1-based steps at which the losses are compared",
    },
    ParamDoc {
        name: "mode",
        default: Yaml(DEFAULT_STEP_MODE),
        bound: STEP_MODE_BOUND,
        meaning: "the step mode; `clip: global`; `graph: true` for `sync` and `scaling`",
    },
    ParamDoc {
        name: "hyper",
        default: Yaml(DEFAULT_HYPER),
        bound: HYPER_BOUND,
        meaning: "optimiser hyper-parameters of every run",
    },
    ParamDoc {
        name: "warmup",
        default: Yaml("10"),
        bound: &[Text("`scaling`: < `steps`")],
        meaning: "untimed steps before the median step time",
    },
    ParamDoc {
        name: "max_abs_diff",
        default: Otherwise("`trajectory`: required, else unused"),
        bound: &[Text(">= 0")],
        meaning: "bound on the largest loss difference at a checkpoint, nats",
    },
    ParamDoc {
        name: "tolerance",
        default: Otherwise("`gradients`, `clip_norm`: required, else unused"),
        bound: &[Text(">= 0")],
        meaning: "bound on a rank's gradient rel-L2 error (`gradients`) or clip norm's relative error (`clip_norm`) against one GPU's",
    },
    ParamDoc {
        name: "min_ratio",
        default: Otherwise("`scaling`: required, else unused"),
        bound: &[Text("> 0")],
        meaning: "bound on world tokens/s over one GPU's tokens/s",
    },
];

/// A minimal `data_parallel` check.
pub const EXAMPLE: &[(&str, &str)] = &[("claim", "traffic"), ("model", "small-4l")];

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        if self.ranks.0 < 2 {
            return Err("`ranks` must be at least 2".into());
        }
        at_most("ranks", self.ranks.0, MAX_RANKS)?;
        at_most("batch", self.batch.map_or(1, |b| b.0), MAX_BATCH)?;
        at_most("steps", self.steps.0, MAX_STEPS)?;
        if self.mode.clip != qlora::train::ClipMode::Global {
            return Err("`mode.clip` must be global: the ranks clip the reduced gradients".into());
        }
        let need = |ok: bool, what: &str| if ok { Ok(()) } else { Err(what.to_string()) };
        match self.claim {
            Claim::Trajectory => {
                need(
                    self.max_abs_diff.is_some(),
                    "`trajectory` needs `max_abs_diff`",
                )?;
                need(
                    !self.checkpoints.is_empty(),
                    "`trajectory` needs `checkpoints`",
                )?;
                need(
                    self.checkpoints.iter().all(|c| c.0 <= self.steps.0),
                    "checkpoints must be <= steps",
                )
            }
            Claim::Gradients => need(self.tolerance.is_some(), "`gradients` needs `tolerance`"),
            Claim::ClipNorm => need(self.tolerance.is_some(), "`clip_norm` needs `tolerance`"),
            Claim::Traffic => Ok(()),
            Claim::Sync => need(self.mode.graph, "`sync` needs `mode.graph: true`"),
            Claim::Scaling => {
                need(self.min_ratio.is_some(), "`scaling` needs `min_ratio`")?;
                need(self.mode.graph, "`scaling` needs `mode.graph: true`")?;
                need(self.warmup.0 < self.steps.0, "`warmup` must be < `steps`")
            }
        }
    }
}

impl Params {
    /// The preset at the per-rank batch.
    fn per_rank(&self) -> ModelConfig {
        let cfg = self.model.0;
        cfg.with_batch(self.batch.map_or(cfg.batch, |b| b.0))
    }

    /// The one-GPU run compared with the world: the whole batch, or one
    /// rank's batch for `scaling`.
    fn single(&self) -> ModelConfig {
        let cfg = self.per_rank();
        match self.claim {
            Claim::Scaling => cfg,
            _ => cfg.with_batch(cfg.batch * self.ranks.0),
        }
    }

    /// The same claim over the first `n` steps, judged at step `n` alone: a
    /// mutant's first look ([`mutant_prefix`]). Both runs' per-step losses
    /// do not depend on the run's length (constant learning rate, one
    /// seeded batch a step), so they are the full run's first ones.
    fn up_to(&self, n: usize) -> Params {
        Params {
            steps: Count(n),
            checkpoints: vec![Count(n)],
            ..self.clone()
        }
    }

    fn job(&self, seed: u64, mutant: Option<Mutant>, gpu: &GpuContext) -> RankJob {
        let o = self.mode.gpu_options(self.hyper);
        let cfg = self.per_rank();
        RankJob {
            model: cfg.name.to_string(),
            batch: cfg.batch,
            steps: self.steps.0,
            seed,
            graph: o.graph,
            nf4: o.base == qlora::train::BaseWeights::Nf4,
            tf32_backward: o.backward_math.is_some(),
            keep_mlp: o.keep_mlp,
            transposed_weights: o.transposed_weights,
            f16_lm_head: o.f16_lm_head,
            f16_projections: o.f16_projections,
            lr: o.hyper.lr,
            max_grad_norm: o.hyper.max_grad_norm,
            weight_decay: o.hyper.weight_decay,
            mutant,
            grads: matches!(self.claim, Claim::Gradients | Claim::ClipNorm),
            kernel_cache_dir: gpu.options().kernel_cache_dir.clone(),
            world: self.ranks.0,
            rank: 0,
            nccl_id: String::new(),
        }
    }
}

/// The claim measured: one GPU and the ranks (each a process of its own,
/// [`launch`]) on the same seeded model and batches. A mutant's
/// `trajectory` run looks first at its earliest checkpoint alone and stops
/// there when that already fails: it exists to show the check can fail.
fn data_parallel(p: &Params, cx: &mut TrialContext<'_>) -> Result<Measurement> {
    let seed = cx.seed;
    let mutant = cx.mutant;
    let gpu = require_gpu(cx)?;
    let opts = p.mode.gpu_options(p.hyper);
    let single = p.single();
    // The ranks' world, started once the one-GPU run (if any) is done.
    let world = |gpu: &GpuContext| {
        launch(
            &p.job(seed, mutant, gpu),
            Duration::from_secs_f64(LAUNCH_TIMEOUT_S),
        )
    };
    match p.claim {
        Claim::Trajectory => {
            if let Some(n) = mutant.and(mutant_prefix(&p.checkpoints, p.steps.0)) {
                let mut m = trajectory_run(&p.up_to(n), gpu, seed, mutant)?;
                if !m.passed() {
                    m.detail += &format!("; the mutant run stopped at step {n}: it already failed");
                    return Ok(m);
                }
            }
            trajectory_run(p, gpu, seed, mutant)
        }
        Claim::Gradients => {
            let one = first_batch_grads(gpu, &single, opts, seed)?;
            gradients(p, &one.grads.concat(), &world(gpu)?)
        }
        Claim::ClipNorm => {
            let one = first_batch_grads(gpu, &single, opts, seed)?;
            Ok(clip_norm(p, &one.clip_sq, &world(gpu)?))
        }
        Claim::Traffic => Ok(traffic(p, &world(gpu)?)),
        Claim::Sync => Ok(sync(p, &world(gpu)?)),
        Claim::Scaling => {
            let mut t = GpuTrainer::new(gpu, &single, opts, seed)?;
            let mut ms = Vec::with_capacity(p.steps.0);
            for _ in 0..p.steps.0 {
                let tokens = t.next_batch()?;
                ms.push(timed_step(gpu, &mut t, &tokens)?);
            }
            let name = gpu.facts().name.clone();
            scaling(p, &ms, &world(gpu)?, &name, seed)
        }
    }
}

/// The `trajectory` claim over `p`'s steps: one GPU at the whole batch, then
/// the ranks.
fn trajectory_run(
    p: &Params,
    gpu: &mut GpuContext,
    seed: u64,
    mutant: Option<Mutant>,
) -> Result<Measurement> {
    let opts = p.mode.gpu_options(p.hyper);
    let (one, _) = gpu_losses(gpu, &p.single(), opts, p.steps.0, seed)?;
    let job = p.job(seed, mutant, gpu);
    trajectory(
        p,
        &one,
        &launch(&job, Duration::from_secs_f64(LAUNCH_TIMEOUT_S))?,
    )
}

/// One GPU's loss, gradients and clip norms of its first batch. The trainer
/// is dropped before the ranks start, so rank 0 has its GPU to itself.
fn first_batch_grads(
    gpu: &mut GpuContext,
    cfg: &ModelConfig,
    opts: GpuTrainOptions,
    seed: u64,
) -> Result<LossAndGrads> {
    let mut t = GpuTrainer::new(gpu, cfg, opts, seed)?;
    let tokens = t.next_batch()?;
    Ok(t.loss_and_grads(gpu, &tokens)?)
}

/// The larger of `worst` and `x`, NaN winning: a NaN error must falsify, and
/// `f64::max` would drop it.
fn worse(worst: f64, x: f64) -> f64 {
    if x > worst || x.is_nan() {
        x
    } else {
        worst
    }
}

/// Why a rank did not finish its steps, as a violation.
fn short_ranks(m: &mut Measurement, ranks: &[RankReply], steps: usize) {
    for r in ranks {
        if let Some(why) = &r.failure {
            m.violate(format!(
                "rank {} stopped after {} steps: {why}",
                r.rank,
                r.losses.len()
            ));
        } else if r.losses.len() < steps {
            m.violate(format!(
                "rank {} ran {} of {steps} steps",
                r.rank,
                r.losses.len()
            ));
        }
    }
}

fn trajectory(p: &Params, one: &[f64], ranks: &[RankReply]) -> Result<Measurement> {
    let mut worst = 0.0f64;
    let mut points = Vec::with_capacity(p.checkpoints.len());
    for c in &p.checkpoints {
        let i = c.0.wrapping_sub(1);
        let lone = one.get(i).copied().ok_or_else(|| short("one GPU", c.0))?;
        let mut sum = 0.0;
        for r in ranks {
            sum += r.losses.get(i).copied().unwrap_or(f64::NAN);
        }
        let lw = sum / ranks.len().max(1) as f64;
        let d = (lw - lone).abs();
        worst = worse(worst, d);
        points.push(format!("step {}: {lone:.4} vs {lw:.4}", c.0));
    }
    let mut m = Measurement::new(
        "max_abs_loss_diff",
        worst,
        Comparator::Le,
        p.max_abs_diff.map_or(0.0, |b| b.0),
        "nats",
    )
    .with_detail(format!(
        "model {}: one GPU at batch {} vs {} ranks x {}; {}",
        p.model.0.name,
        p.single().batch,
        p.ranks.0,
        p.per_rank().batch,
        points.join(", ")
    ));
    short_ranks(&mut m, ranks, p.steps.0);
    Ok(m)
}

fn short(who: &str, step: usize) -> Error {
    Error::InvalidArgument {
        op: "data_parallel",
        message: format!("{who} has no loss at step {step}"),
    }
}

fn gradients(p: &Params, one: &[f32], ranks: &[RankReply]) -> Result<Measurement> {
    let norm: f64 = one
        .iter()
        .map(|&x| f64::from(x).powi(2))
        .sum::<f64>()
        .sqrt();
    let mut worst = 0.0f64;
    for r in ranks {
        if r.grads.len() != one.len() {
            return Err(Error::ShapeMismatch {
                op: "data_parallel gradients",
                expected: format!("{} values", one.len()),
                got: format!("{} from rank {}", r.grads.len(), r.rank),
            });
        }
        let diff: f64 = r
            .grads
            .iter()
            .zip(one)
            .map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2))
            .sum::<f64>()
            .sqrt();
        let rel = diff / norm.max(f64::MIN_POSITIVE);
        worst = worse(worst, rel);
    }
    let mut m = Measurement::new(
        "grad_rel_l2_error",
        worst,
        Comparator::Le,
        p.tolerance.map_or(0.0, |t| t.0),
        "ratio",
    )
    .with_detail(format!(
        "model {}: all-reduced gradients of {} ranks x batch {} vs one GPU at batch {}; ||g|| {norm:.4e}",
        p.model.0.name,
        p.ranks.0,
        p.per_rank().batch,
        p.single().batch
    ));
    if norm == 0.0 {
        m.violate("the one-GPU gradient is all zeros");
    }
    Ok(m)
}

/// The clip's norm of the whole gradient, `sqrt(sum_k S_k)` over its
/// groups' squared norms (one group for the global clip; summing makes it
/// the same norm whatever the grouping).
fn clip_norm_of(sq: &[f64]) -> f64 {
    sq.iter().sum::<f64>().sqrt()
}

/// `max_r |n_r - n_1| / n_1`, with `n_r` rank `r`'s clip norm and `n_1` one
/// GPU's at the whole batch. A rank that clips before its all-reduce has its
/// shard's norm, which differs from the batch's by the shards' disagreement;
/// the honest ranks differ from one GPU by float rounding only.
fn clip_norm(p: &Params, one_sq: &[f64], ranks: &[RankReply]) -> Measurement {
    let one = clip_norm_of(one_sq);
    let mut worst = 0.0f64;
    let mut norms = Vec::with_capacity(ranks.len());
    for r in ranks {
        let n = clip_norm_of(&r.clip_sq);
        let rel = (n - one).abs() / one.max(f64::MIN_POSITIVE);
        worst = worse(worst, rel);
        norms.push(format!("{n:.6e}"));
    }
    let mut m = Measurement::new(
        "clip_norm_rel_error",
        worst,
        Comparator::Le,
        p.tolerance.map_or(0.0, |t| t.0),
        "ratio",
    )
    .with_detail(format!(
        "model {}: clip norms of {} ranks x batch {} [{}] vs one GPU at batch {} {one:.6e}; max_grad_norm {}",
        p.model.0.name,
        p.ranks.0,
        p.per_rank().batch,
        norms.join(", "),
        p.single().batch,
        p.hyper.max_grad_norm.0
    ));
    if one == 0.0 {
        m.violate("the one-GPU clip norm is zero (no clip group, or an all-zero gradient)");
    }
    for r in ranks.iter().filter(|r| r.clip_sq.is_empty()) {
        m.violate(format!("rank {} computed no clip norm", r.rank));
    }
    m
}

fn traffic(p: &Params, ranks: &[RankReply]) -> Measurement {
    let trainable = 4 * p.model.0.trainable_params();
    let most = ranks.iter().map(|r| r.reduced_bytes).max().unwrap_or(0);
    let fewest = ranks.iter().map(|r| r.reduced_bytes).min().unwrap_or(0);
    let mut m = Measurement::new(
        "all_reduced_bytes_per_step",
        most as f64,
        Comparator::Eq,
        trainable as f64,
        "bytes",
    )
    .with_detail(format!(
        "model {}, {} ranks: {fewest} to {most} bytes all-reduced per step; trainable parameters {trainable} bytes",
        p.model.0.name, p.ranks.0
    ));
    if fewest != most {
        m.violate(format!(
            "the ranks reduced different amounts: {fewest} and {most} bytes"
        ));
    }
    short_ranks(&mut m, ranks, p.steps.0);
    m
}

fn sync(p: &Params, ranks: &[RankReply]) -> Measurement {
    let inside = ranks
        .iter()
        .map(|r| r.syncs_inside_capture)
        .max()
        .unwrap_or(0);
    let per_step = ranks
        .iter()
        .map(|r| r.max_syncs_per_step)
        .max()
        .unwrap_or(0);
    let mut m = Measurement::new(
        "host_syncs_inside_capture",
        inside as f64,
        Comparator::Le,
        0.0,
        "syncs",
    )
    .with_detail(format!(
        "model {}, {} ranks, {} steps: at most {inside} host reads inside a rank's capture, {per_step} per step; graph replays per rank: {:?}",
        p.model.0.name,
        p.ranks.0,
        p.steps.0,
        ranks.iter().map(|r| r.replayed).collect::<Vec<_>>()
    ));
    if per_step > 1 {
        m.violate(format!("a step made {per_step} host reads, more than 1"));
    }
    if p.steps.0 >= 2 && ranks.iter().any(|r| r.replayed == 0) {
        m.violate("a rank never replayed a captured graph");
    }
    short_ranks(&mut m, ranks, p.steps.0);
    m
}

/// Tokens/s of the world over one GPU's at the same per-rank batch: with
/// `t_1` one GPU's median step time and `t_w` the slowest rank's (a step of
/// the world ends when its last rank does), `ratio = ranks x t_1 / t_w`;
/// also a `speedups.csv` row with the interval of that ratio.
fn scaling(
    p: &Params,
    one_ms: &[f64],
    ranks: &[RankReply],
    device: &str,
    seed: u64,
) -> Result<Measurement> {
    let w = p.warmup.0;
    let cfg = p.per_rank();
    let tokens = cfg.tokens() as f64;
    let world = ranks.len() as f64;
    // One GPU's step times scaled to the world's tokens, and the slowest rank's.
    let one: Vec<f64> = one_ms
        .get(w..)
        .unwrap_or_default()
        .iter()
        .map(|t| t * world)
        .collect();
    let slowest = ranks
        .iter()
        .map(|r| r.step_ms.get(w..).unwrap_or_default())
        .max_by(|a, b| median(a).total_cmp(&median(b)))
        .unwrap_or_default();
    let (t_one, t_world) = (median(&one) / world, median(slowest));
    let one_tps = 1000.0 * tokens / t_one;
    let world_tps = 1000.0 * tokens * world / t_world;
    let ratio = world_tps / one_tps;
    let mut m = Measurement::new(
        "world_over_one_gpu_tokens_per_s",
        ratio,
        Comparator::Ge,
        p.min_ratio.map_or(0.0, |r| r.0),
        "ratio",
    )
    .with_detail(format!(
        "model {} on {device}, batch {} per rank, {} timed steps: one GPU {one_tps:.0} tokens/s ({t_one:.3} ms), {} ranks {world_tps:.0} tokens/s (slowest rank {t_world:.3} ms)",
        cfg.name,
        cfg.batch,
        p.steps.0 - w,
        p.ranks.0
    ));
    let (lo, hi) = ratio_ci(&one, slowest, seed, BOOTSTRAP_RESAMPLES);
    m.speedups.push(Speedup {
        subject: format!("data_parallel {} ranks", p.ranks.0),
        model: cfg.name.to_string(),
        batch: cfg.batch,
        seq_len: cfg.seq_len,
        baseline: "one GPU".into(),
        candidate: format!("{} ranks", p.ranks.0),
        baseline_median_ms: median(&one),
        candidate_median_ms: t_world,
        ratio,
        ratio_ci_low: lo,
        ratio_ci_high: hi,
        repeats: one.len(),
        peak_device_gib: None,
        baseline_peak_device_gib: None,
    });
    short_ranks(&mut m, ranks, p.steps.0);
    Ok(m)
}

impl Kind<crate::Qlora> for Params {
    fn execute(&self, _backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        data_parallel(self, cx)
    }

    /// Needs `ranks` GPUs, and the one-GPU run's trainer must fit.
    fn unjudged_on(&self, backend: Backend, here: &Here) -> Option<String> {
        if backend != Backend::Cuda {
            return None;
        }
        let count = here.gpu.as_ref().map_or(0, |g| g.device_count);
        if count < self.ranks.0 {
            return Some(format!(
                "needs {} GPUs, this machine has {count}",
                self.ranks.0
            ));
        }
        let cfg = self.single();
        let needed = trainer_bytes(&cfg, &self.mode.gpu_options(self.hyper));
        trainer_shortfall(backend, &cfg, needed, here)
    }

    /// Observed budget: a rank process opens its context and loads the
    /// cached kernels in about a second; 100 steps of qwen2.5-0.5b take ~2 s.
    fn default_timeout_s(&self) -> f64 {
        TRAINING_TIMEOUT_S
    }

    /// Only `scaling` times anything. The other claims compare values,
    /// bytes and host syncs that another process on the GPU cannot move.
    fn needs_the_gpu_alone(&self) -> bool {
        self.claim == Claim::Scaling
    }

    /// A rank runs on every GPU of the host.
    fn needs_the_whole_host(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::params::tests::with_gpu;

    fn params(yaml: &str) -> std::result::Result<Params, String> {
        crate::check::params::tests::parse(yaml)
    }

    #[test]
    fn each_claim_needs_its_bound() {
        assert!(params("claim: traffic\nmodel: small-4l\n").is_ok());
        let e = params("claim: trajectory\nmodel: small-4l\nsteps: 10\ncheckpoints: [10]\n")
            .unwrap_err();
        assert_eq!(e, "`trajectory` needs `max_abs_diff`");
        let e = params("claim: sync\nmodel: small-4l\n").unwrap_err();
        assert_eq!(e, "`sync` needs `mode.graph: true`");
        let e = params("claim: traffic\nmodel: small-4l\nranks: 1\n").unwrap_err();
        assert_eq!(e, "`ranks` must be at least 2");
        let e = params(
            "claim: scaling\nmodel: small-4l\nmin_ratio: 1.9\nmode: {graph: true}\nsteps: 5\n",
        )
        .unwrap_err();
        assert_eq!(e, "`warmup` must be < `steps`");
        let e = params("claim: clip_norm\nmodel: small-4l\n").unwrap_err();
        assert_eq!(e, "`clip_norm` needs `tolerance`");
        assert!(params("claim: clip_norm\nmodel: small-4l\ntolerance: 1.0e-3\n").is_ok());
    }

    #[test]
    fn a_mutants_first_look_is_the_claim_up_to_its_first_checkpoint() {
        let p = params(
            "claim: trajectory\nmodel: small-4l\nsteps: 100\ncheckpoints: [50, 10, 100]\nmax_abs_diff: 0.05\n",
        )
        .unwrap();
        let n = mutant_prefix(&p.checkpoints, p.steps.0).unwrap();
        let first = p.up_to(n);
        assert_eq!((first.steps.0, first.checkpoints.len()), (10, 1));
        assert_eq!(first.checkpoints[0].0, 10);
        assert_eq!(first.validate(), Ok(()));
        assert_eq!(first.max_abs_diff.map(|b| b.0), Some(0.05));
    }

    #[test]
    fn a_nan_error_is_the_worst() {
        assert_eq!(worse(0.1, 0.2), 0.2);
        assert_eq!(worse(0.2, 0.1), 0.2);
        assert!(worse(0.1, f64::NAN).is_nan());
        assert!(worse(f64::NAN, 0.3).is_nan());
    }

    #[test]
    fn clip_norm_is_the_worst_rank_against_one_gpu_summed_over_groups() {
        let p = params("claim: clip_norm\nmodel: small-4l\ntolerance: 1.0e-3\n").unwrap();
        let rank = |r, clip_sq: Vec<f64>| RankReply {
            rank: r,
            losses: vec![2.0],
            clip_sq,
            ..RankReply::default()
        };
        // One GPU: norm 5 (one global group, 25). Honest ranks: the reduced
        // norm up to rounding, on every rank.
        let one = [25.0];
        let honest = [rank(0, vec![25.0 * (1.0 + 2e-6)]), rank(1, vec![25.0])];
        let m = clip_norm(&p, &one, &honest);
        assert!(m.passed(), "{m:?}");
        assert!((m.observed - ((25.0f64 * (1.0 + 2e-6)).sqrt() - 5.0) / 5.0).abs() < 1e-15);
        // Groups are summed: per-layer squared norms of the same gradient give
        // the same norm.
        let m = clip_norm(&p, &[9.0, 16.0], &honest);
        assert!(m.passed(), "{m:?}");
        // Clipped before the all-reduce: each rank has its shard's norm, 6
        // and 4.5; the worst is |6 - 5| / 5.
        let shards = [rank(0, vec![36.0]), rank(1, vec![20.25])];
        let m = clip_norm(&p, &one, &shards);
        assert!(!m.passed());
        assert!((m.observed - 0.2).abs() < 1e-12, "{}", m.observed);
        assert_eq!(m.threshold, 1e-3);
        // A rank that computed no clip norm is a violation, and so is a zero
        // one-GPU norm (nothing to compare with).
        let m = clip_norm(&p, &one, &[rank(0, vec![25.0]), rank(1, Vec::new())]);
        assert!(!m.passed());
        assert_eq!(m.violations, ["rank 1 computed no clip norm"]);
        let m = clip_norm(&p, &[], &honest);
        assert!(!m.passed());
    }

    #[test]
    fn scaling_is_ranks_times_one_gpu_time_over_the_slowest_rank() {
        let p = params(
            "claim: scaling\nmodel: small-4l\nmin_ratio: 1.9\nmode: {graph: true}\nsteps: 6\nwarmup: 1\n",
        )
        .unwrap();
        let rank = |r, ms: f64| RankReply {
            rank: r,
            losses: vec![1.0; 6],
            // The first (warm-up) step is slow and must not count.
            step_ms: [vec![100.0], vec![ms; 5]].concat(),
            ..RankReply::default()
        };
        let one = [[100.0].as_slice(), &[10.0; 5]].concat();
        let m = scaling(&p, &one, &[rank(0, 10.2), rank(1, 10.5)], "gpu", 7).unwrap();
        assert!(
            (m.observed - 2.0 * 10.0 / 10.5).abs() < 1e-12,
            "{}",
            m.observed
        );
        assert_eq!(m.threshold, 1.9);
        let s = &m.speedups[0];
        assert_eq!((s.baseline_median_ms, s.candidate_median_ms), (20.0, 10.5));
        assert!((s.ratio - m.observed).abs() < 1e-12 && s.repeats == 5);
        // A rank that stopped early is a violation, whatever the ratio.
        let mut short = rank(1, 10.0);
        short.losses.truncate(3);
        let m = scaling(&p, &one, &[rank(0, 10.0), short], "gpu", 7).unwrap();
        assert_eq!(m.violations.len(), 1, "{:?}", m.violations);
    }

    #[test]
    fn fewer_gpus_than_ranks_is_unjudged_with_the_count() {
        let p = params("claim: traffic\nmodel: small-4l\n").unwrap();
        let mut here = with_gpu("NVIDIA H200", 141);
        let why = p.unjudged_on(Backend::Cuda, &here).unwrap();
        assert_eq!(why, "needs 2 GPUs, this machine has 1");
        here.gpu.as_mut().unwrap().device_count = 2;
        assert_eq!(p.unjudged_on(Backend::Cuda, &here), None);
        let one = p.single();
        assert_eq!(one.batch, 2 * p.per_rank().batch);
    }

    #[test]
    fn the_world_loss_is_the_mean_of_the_ranks_and_traffic_is_exact() {
        let p = params(
            "claim: trajectory\nmodel: small-4l\nsteps: 2\ncheckpoints: [2]\nmax_abs_diff: 0.01\n",
        )
        .unwrap();
        let rank = |r, l: f64| RankReply {
            rank: r,
            losses: vec![9.0, l],
            reduced_bytes: 4 * p.model.0.trainable_params(),
            ..RankReply::default()
        };
        let ranks = [rank(0, 2.0), rank(1, 3.0)];
        let m = trajectory(&p, &[9.0, 2.5], &ranks).unwrap();
        assert!(m.passed(), "{m:?}");
        let m = trajectory(&p, &[9.0, 2.6], &ranks).unwrap();
        assert!(!m.passed());
        assert!(traffic(&p, &ranks).passed());
        let mut more = ranks.clone();
        more[1].reduced_bytes += 4 * 256;
        assert!(!traffic(&p, &more).passed());
    }
}
