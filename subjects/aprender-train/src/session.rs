//! One trial's training session on aprender-train's CUDA path.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::thread::{self, ThreadId};

use entrenar::finetune::{InstructPipeline, InstructStepResult};
use entrenar::transformer::init::lock_init_seed;

use crate::counters::{GpuCounters, OwnCounters};
use crate::env::find_nvidia_smi;
use crate::error::{Error, Result};
use crate::model::{configs, Resolved, Setup};
use crate::samples::{samples, Sample};

/// The loss `train_step` returns in place of a non-finite one, with its
/// perplexity (T:finetune/instruct_pipeline/training.rs:232-238, 379-384).
const NON_FINITE_SENTINEL: (f32, f32) = (100.0, 1e6);

/// A `train_step` whose loss aprender-train found non-finite: it skipped
/// the backward and returned its sentinel loss 100.0 instead
/// (T:finetune/instruct_pipeline/training.rs:232-238). Not an error of the
/// session: for a loss-parity contract it is evidence, so the step still
/// returns the loss aprender-train returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NonFiniteLoss {
    /// 0-based step.
    pub step: usize,
    /// Index of the sample within the step.
    pub sample: usize,
}

/// A pipeline built on the GPU and the samples it trains.
///
/// Driven from one thread: aprender-gpu makes its context current only on
/// the thread that creates it (G:driver/context.rs:131-136) and its counters
/// are per thread. One session per process: the kernel caches, cuBLAS
/// handles and the `CUDA_GRAPH` switch are process-wide statics
/// (T:autograd/cuda_forward/cache.rs:30, T:finetune/backward_graph.rs:30-33).
pub struct Session {
    pipeline: InstructPipeline,
    run: Resolved,
    samples: Vec<Sample>,
    steps_done: usize,
    counters: OwnCounters,
    non_finite: Vec<NonFiniteLoss>,
    thread: ThreadId,
    poisoned: bool,
}

impl Session {
    /// Builds `InstructPipeline::new` with `quantize_nf4`, which creates the
    /// CUDA trainer, pre-warms the kernel caches, then uploads the layers
    /// (T:finetune/instruct_pipeline/cuda_init.rs:103-381). Weights are
    /// seeded with `setup.seed` (T:transformer/init.rs:90-94). A pipeline that
    /// fell back to the CPU is an error: aprender-train decides that once,
    /// here, and says so only on stderr (cuda_init.rs:26-85).
    pub fn prepare(setup: &Setup) -> Result<Self> {
        let run = setup.resolve()?;
        if find_nvidia_smi(std::env::var_os("PATH").as_deref()).is_none() {
            return Err(Error::NoNvidiaSmi);
        }
        let (model_config, instruct_config) = configs(setup)?;
        let before = GpuCounters::now();
        let pipeline = guarded("InstructPipeline::new", || {
            let _seed = lock_init_seed(run.seed);
            InstructPipeline::new(&model_config, instruct_config)
        })?;
        if !pipeline.is_cuda() {
            return Err(Error::CpuFallback);
        }
        let counters = OwnCounters {
            prepare: GpuCounters::now().since(before),
            per_train_step: Vec::new(),
        };
        log::debug!(
            "prepared `{}` on the GPU: {:?}",
            run.shape.name,
            counters.prepare
        );
        Ok(Self {
            pipeline,
            samples: samples(&run),
            run,
            steps_done: 0,
            counters,
            non_finite: Vec::new(),
            thread: thread::current().id(),
            poisoned: false,
        })
    }

    /// One step: `train_step(prompt, response)` on each of the `batch`
    /// samples in turn (each call updates the adapters, as aprender-train's
    /// own trainer does per sample, T:finetune/instruct_trainer.rs:208).
    /// Returns the mean loss, computed by each call before its update
    /// (aprender-train's sentinel 100.0 for a non-finite one: see
    /// [`Session::non_finite_losses`]).
    pub fn step(&mut self) -> Result<f32> {
        self.check_usable()?;
        let mut total = 0.0f64;
        for sample in 0..self.samples.len() {
            total += f64::from(self.train_one(sample)?);
        }
        self.steps_done += 1;
        let loss = (total / self.samples.len() as f64) as f32;
        log::debug!("step {}: mean loss {loss}", self.steps_done);
        Ok(loss)
    }

    fn train_one(&mut self, index: usize) -> Result<f32> {
        let (step, sample) = (self.steps_done, &self.samples[index]);
        let pipeline = &mut self.pipeline;
        let before = GpuCounters::now();
        let result = guarded("InstructPipeline::train_step", || {
            pipeline.train_step(&sample.prompt, &sample.response)
        });
        let result = result.inspect_err(|_| self.poisoned = true)?;
        self.counters
            .per_train_step
            .push(GpuCounters::now().since(before));
        if !judge_step(&result, step, index, sample.trained_tokens())? {
            log::warn!("step {step}, sample {index}: aprender-train found the loss non-finite");
            self.non_finite.push(NonFiniteLoss {
                step,
                sample: index,
            });
        }
        Ok(result.loss)
    }

    fn check_usable(&self) -> Result<()> {
        if self.poisoned {
            return Err(Error::Poisoned);
        }
        let current = thread::current().id();
        if current != self.thread {
            return Err(Error::WrongThread {
                prepared: format!("{:?}", self.thread),
                current: format!("{current:?}"),
            });
        }
        Ok(())
    }

    /// aprender-gpu's own counters for `new` and each `train_step` so far.
    pub fn own_counts(&self) -> &OwnCounters {
        &self.counters
    }

    /// The `train_step` calls whose loss was non-finite, in order.
    pub fn non_finite_losses(&self) -> &[NonFiniteLoss] {
        &self.non_finite
    }

    /// The checked setup this session runs.
    pub fn resolved(&self) -> &Resolved {
        &self.run
    }

    /// The samples every step trains.
    pub fn samples(&self) -> &[Sample] {
        &self.samples
    }

    /// Steps completed.
    pub fn steps_done(&self) -> usize {
        self.steps_done
    }

    /// The device name aprender-train reports.
    pub fn gpu_name(&self) -> Option<String> {
        self.pipeline.gpu_name()
    }
}

/// Whether a step's loss was finite; a sample that trained another number
/// of response tokens than it holds (truncated or skipped) is an error.
fn judge_step(
    result: &InstructStepResult,
    step: usize,
    sample: usize,
    expected_tokens: usize,
) -> Result<bool> {
    if result.num_response_tokens != expected_tokens {
        return Err(Error::ResponseTokens {
            step,
            sample,
            got: result.num_response_tokens,
            expected: expected_tokens,
        });
    }
    let sentinel = (result.loss, result.perplexity) == NON_FINITE_SENTINEL;
    Ok(result.loss.is_finite() && !sentinel)
}

/// Runs a call into aprender-train, turning a panic (its shape `assert!`s,
/// its `expect`s) into an error. `AssertUnwindSafe`: after a panic the
/// state the closure touched is never used again — `prepare` drops it, a
/// step poisons the session.
fn guarded<T>(during: &'static str, call: impl FnOnce() -> T) -> Result<T> {
    catch_unwind(AssertUnwindSafe(call)).map_err(|payload| Error::Panicked {
        during,
        message: panic_message(payload.as_ref()),
    })
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_string()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic without a message".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(loss: f32, perplexity: f32, tokens: usize) -> InstructStepResult {
        InstructStepResult {
            loss,
            num_response_tokens: tokens,
            perplexity,
        }
    }

    #[test]
    fn a_trained_step_is_finite() {
        assert!(judge_step(&result(6.93, 1022.0, 192), 3, 0, 192).unwrap());
    }

    #[test]
    fn the_non_finite_sentinel_and_nan_are_told_apart() {
        assert!(!judge_step(&result(100.0, 1e6, 192), 3, 1, 192).unwrap());
        assert!(!judge_step(&result(f32::NAN, 1.0, 192), 0, 0, 192).unwrap());
        assert!(judge_step(&result(100.0, 5.0, 192), 0, 0, 192).unwrap());
    }

    #[test]
    fn a_skipped_or_truncated_sample_is_an_error() {
        let err = judge_step(&result(0.0, 1.0, 0), 2, 0, 192).unwrap_err();
        assert!(
            matches!(
                err,
                Error::ResponseTokens {
                    got: 0,
                    expected: 192,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn a_panic_becomes_an_error_naming_the_call() {
        let err = guarded("a call", || -> u32 { panic!("shape {} != {}", 1, 2) }).unwrap_err();
        assert!(
            matches!(&err, Error::Panicked { during: "a call", message } if message == "shape 1 != 2"),
            "{err}"
        );
        assert_eq!(guarded("a call", || 5).unwrap(), 5);
    }
}
