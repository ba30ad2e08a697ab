//! Data-parallel ranks as processes: one process per GPU.
//!
//! Several GPUs driven from one process with graph capture can deadlock
//! (one thread's capture waits on a collective another thread has not
//! queued), so each rank is a process of its own: the launcher ([`launch`])
//! makes the NCCL unique id (this process hosts NCCL's bootstrap root until
//! the ranks have joined), starts its own executable once per rank with
//! [`RANK_FLAG`] and a [`RankJob`] as JSON on its stdin, and reads each rank's
//! [`RankReply`] from its stdout after [`RANK_REPLY_MARKER`]. A rank that
//! dies, answers nothing, or outlives the timeout ends the launch with an
//! error, after every rank has been killed: a collective whose peer is gone
//! never returns, so waiting for the others would hang.
//!
//! Each rank's environment gets `NCCL_NVLS_ENABLE=0` (NVLink multicast off,
//! which the GPU machines need); it is read by the NCCL library in the
//! child, never by this code. A check uses the launcher; the front ends
//! (CLI, test runner) dispatch [`RANK_FLAG`] to [`run_rank`].

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::mutant::Mutant;
use falsify_core::child::{marked_reply, tail, Piped, POLL};
use qlora::gpu::{GemmMath, GpuContext, GpuOptions};
use qlora::model::ModelConfig;
use qlora::train::{data_parallel, BaseWeights, GpuTrainOptions, GpuTrainer, Hyper, Rank};

/// The first argument that makes a front end run one data-parallel rank.
pub const RANK_FLAG: &str = "__falsify-rank";
/// Starts the line of a rank's stdout that holds its reply.
pub const RANK_REPLY_MARKER: &str = "FALSIFY-RANK-REPLY ";

/// What one rank runs: `steps` steps of `model` at `batch` rows per rank,
/// from `seed`, in one step mode, as `rank` of `world`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RankJob {
    pub model: String,
    /// Rows per rank (one GPU alone trains `world x batch` rows).
    pub batch: usize,
    pub steps: usize,
    pub seed: u64,
    pub graph: bool,
    pub nf4: bool,
    pub tf32_backward: bool,
    pub keep_mlp: bool,
    pub transposed_weights: bool,
    pub f16_lm_head: bool,
    pub f16_projections: bool,
    pub lr: f64,
    pub max_grad_norm: f64,
    pub weight_decay: f64,
    /// The fault every rank injects (the trial's mutant).
    pub mutant: Option<Mutant>,
    /// Return the all-reduced gradients of the first batch and the clip's
    /// squared norms instead of training.
    pub grads: bool,
    pub kernel_cache_dir: Option<PathBuf>,
    pub world: usize,
    pub rank: usize,
    /// The NCCL unique id, as hex.
    pub nccl_id: String,
}

/// What a rank measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RankReply {
    pub rank: usize,
    /// The loss of each step on this rank's shard.
    pub losses: Vec<f64>,
    /// Each step's time (CUDA events around the step, loss read included).
    pub step_ms: Vec<f64>,
    pub replayed: usize,
    pub syncs_inside_capture: usize,
    pub max_syncs_per_step: usize,
    pub reduced_bytes: usize,
    pub trainable_bytes: usize,
    /// The all-reduced gradients, every trainable tensor in order, flat.
    pub grads: Vec<f32>,
    /// The squared norm of each clip group as this rank's clip computed it
    /// (one for the global clip), beside `grads`.
    pub clip_sq: Vec<f64>,
    /// Why the steps stopped early, if they did.
    pub failure: Option<String>,
}

impl RankJob {
    /// The preset, at this job's per-rank batch.
    pub fn config(&self) -> Result<ModelConfig> {
        ModelConfig::preset(&self.model)
            .map(|c| c.with_batch(self.batch))
            .ok_or_else(|| bad(format!("no model preset `{}`", self.model)))
    }

    /// The stack's step options of this job.
    pub fn options(&self) -> GpuTrainOptions {
        GpuTrainOptions {
            base: if self.nf4 {
                BaseWeights::Nf4
            } else {
                BaseWeights::Fp32
            },
            hyper: Hyper {
                lr: self.lr,
                max_grad_norm: self.max_grad_norm,
                weight_decay: self.weight_decay,
            },
            graph: self.graph,
            backward_math: self.tf32_backward.then_some(GemmMath::Tf32),
            keep_mlp: self.keep_mlp,
            transposed_weights: self.transposed_weights,
            f16_lm_head: self.f16_lm_head,
            f16_projections: self.f16_projections,
            ..GpuTrainOptions::default()
        }
    }
}

fn bad(message: String) -> Error {
    Error::InvalidArgument {
        op: "data-parallel rank",
        message,
    }
}

/// [`run_rank`] as the subject's helper role ([`crate::Qlora`]'s
/// `helpers`): its error boxed.
pub fn run_rank_boxed(job_json: &str) -> std::result::Result<String, falsify_core::BoxError> {
    Ok(run_rank(job_json)?)
}

/// The rank's side: runs the job `job_json` names on GPU `rank` and returns
/// the line the front end prints on stdout.
pub fn run_rank(job_json: &str) -> Result<String> {
    let job: RankJob = serde_json::from_str(job_json).map_err(|e| bad(e.to_string()))?;
    let mut gpu = GpuContext::new(GpuOptions {
        ordinal: job.rank,
        kernel_cache_dir: job.kernel_cache_dir.clone(),
        ..GpuOptions::default()
    })?;
    let faults = job.mutant.map_or(qlora::Faults::NONE, Mutant::faults);
    let mut scope = gpu.with_faults(faults);
    let reply = rank_body(&job, &mut scope)?;
    let json = serde_json::to_string(&reply).map_err(|e| bad(e.to_string()))?;
    Ok(format!("\n{RANK_REPLY_MARKER}{json}"))
}

/// Builds the trainer, joins the world, then trains (or reads gradients).
fn rank_body(job: &RankJob, gpu: &mut GpuContext) -> Result<RankReply> {
    let cfg = job.config()?;
    let mut t = GpuTrainer::new(gpu, &cfg, job.options(), job.seed)?;
    t.join(Rank::join(gpu, job.rank, job.world, &job.nccl_id)?);
    let mut reply = RankReply {
        rank: job.rank,
        trainable_bytes: t.trainable_bytes(),
        ..RankReply::default()
    };
    if job.grads {
        let tokens = t.next_batch()?;
        let r = t.loss_and_grads(gpu, &tokens)?;
        reply.losses.push(r.loss);
        reply.grads = r.grads.concat();
        reply.clip_sq = r.clip_sq;
    } else {
        train(job, gpu, &mut t, &mut reply);
    }
    reply.reduced_bytes = t.all_reduced_bytes();
    let syncs = t.syncs();
    reply.syncs_inside_capture = syncs.inside_capture;
    reply.max_syncs_per_step = syncs.per_step.iter().copied().max().unwrap_or(0);
    Ok(reply)
}

/// `job.steps` timed steps; a failing step ends them and is recorded.
fn train(job: &RankJob, gpu: &mut GpuContext, t: &mut GpuTrainer, reply: &mut RankReply) {
    for _ in 0..job.steps {
        match timed_step(gpu, t) {
            Ok((loss, ms, replayed)) => {
                reply.losses.push(loss);
                reply.step_ms.push(ms);
                reply.replayed += usize::from(replayed);
            }
            Err(e) => {
                reply.failure = Some(e.to_string());
                return;
            }
        }
    }
}

/// One step, timed with CUDA events on the work stream (the loss read is
/// inside the interval).
fn timed_step(gpu: &mut GpuContext, t: &mut GpuTrainer) -> Result<(f64, f64, bool)> {
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let start = gpu.stream().record_event(flags)?;
    let r = t.step(gpu)?;
    let end = gpu.stream().record_event(flags)?;
    Ok((r.loss, f64::from(start.elapsed_ms(&end)?), r.replayed))
}

/// Starts `job.world` ranks of `job` (its `rank` and `nccl_id` are set per
/// rank), waits at most `timeout` for all of them, and returns their
/// replies in rank order.
pub fn launch(job: &RankJob, timeout: Duration) -> Result<Vec<RankReply>> {
    let id = data_parallel::new_id()?;
    let program = std::env::current_exe().map_err(|e| Error::io("current executable", e))?;
    let mut ranks = Vec::with_capacity(job.world);
    for rank in 0..job.world {
        let json = serde_json::to_string(&RankJob {
            rank,
            nccl_id: id.clone(),
            ..job.clone()
        })
        .map_err(|e| bad(e.to_string()))?;
        match spawn(&program, json) {
            Ok(r) => ranks.push(r),
            Err(e) => {
                kill_all(&mut ranks);
                return Err(e);
            }
        }
    }
    let waited = wait_all(&mut ranks, timeout);
    let outputs: Vec<(String, String)> = ranks.into_iter().map(Piped::output).collect();
    waited?;
    outputs
        .iter()
        .enumerate()
        .map(|(rank, (out, err))| parse_reply(rank, out, err))
        .collect()
}

fn spawn(program: &Path, json: String) -> Result<Piped> {
    let mut cmd = Command::new(program);
    cmd.arg(RANK_FLAG).env("NCCL_NVLS_ENABLE", "0");
    Piped::start(&mut cmd, json.into_bytes()).map_err(|e| Error::io(program, e))
}

/// Polls every rank until all have exited; kills them all as soon as one
/// fails or the timeout passes.
fn wait_all(ranks: &mut [Piped], timeout: Duration) -> Result<()> {
    let started = Instant::now();
    let mut done = vec![false; ranks.len()];
    while done.iter().any(|d| !d) {
        for (rank, r) in ranks.iter_mut().enumerate() {
            if done[rank] {
                continue;
            }
            match r.child.try_wait() {
                Ok(Some(status)) if status.success() => done[rank] = true,
                Ok(Some(status)) => {
                    kill_all(ranks);
                    return Err(Error::Ranks(format!("rank {rank} exited with {status}")));
                }
                Ok(None) => {}
                Err(e) => {
                    kill_all(ranks);
                    return Err(Error::Ranks(format!("lost rank {rank}: {e}")));
                }
            }
        }
        if started.elapsed() > timeout {
            kill_all(ranks);
            return Err(Error::Ranks(format!(
                "timed out: ranks still running after {:.0} s, stopped",
                timeout.as_secs_f64()
            )));
        }
        std::thread::sleep(POLL);
    }
    Ok(())
}

fn kill_all(ranks: &mut [Piped]) {
    ranks.iter_mut().for_each(Piped::stop);
}

fn parse_reply(rank: usize, out: &str, err: &str) -> Result<RankReply> {
    match marked_reply::<RankReply>(out, RANK_REPLY_MARKER) {
        Some(Ok(r)) => Ok(r),
        Some(Err(e)) => Err(Error::Ranks(format!(
            "rank {rank}'s reply does not parse: {e}"
        ))),
        None => Err(Error::Ranks(format!(
            "rank {rank} answered nothing{}",
            tail(err)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> RankJob {
        RankJob {
            model: "small-4l".into(),
            batch: 4,
            steps: 10,
            seed: 1,
            graph: true,
            nf4: false,
            tf32_backward: false,
            keep_mlp: false,
            transposed_weights: false,
            f16_lm_head: false,
            f16_projections: false,
            lr: 1e-3,
            max_grad_norm: 1.0,
            weight_decay: 0.0,
            mutant: Some(Mutant::DpSumInsteadOfMean),
            grads: false,
            kernel_cache_dir: None,
            world: 2,
            rank: 1,
            nccl_id: "00".repeat(128),
        }
    }

    #[test]
    fn jobs_round_trip_and_map_onto_the_stack() {
        let j = job();
        let back: RankJob = serde_json::from_str(&serde_json::to_string(&j).unwrap()).unwrap();
        assert_eq!(back, j);
        assert_eq!(j.config().unwrap().batch, 4);
        let o = j.options();
        assert!(o.graph && o.backward_math.is_none() && o.base == BaseWeights::Fp32);
        let bad = RankJob {
            model: "nope".into(),
            ..j
        };
        assert!(bad.config().is_err());
    }

    #[test]
    fn a_reply_is_the_marked_line_and_silence_names_the_rank() {
        let r = RankReply {
            rank: 1,
            losses: vec![2.5],
            clip_sq: vec![0.347_431_2],
            ..RankReply::default()
        };
        let out = format!(
            "noise\n{RANK_REPLY_MARKER}{}\n",
            serde_json::to_string(&r).unwrap()
        );
        assert_eq!(parse_reply(1, &out, "").unwrap(), r);
        let e = parse_reply(0, "nothing", "boom").unwrap_err().to_string();
        assert!(e.contains("rank 0 answered nothing; stderr: boom"), "{e}");
    }
}
