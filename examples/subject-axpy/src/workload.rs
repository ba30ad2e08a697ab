//! The subject's training workload, [`LineFit`], which the core's
//! driver-observed kinds drive: full-batch SGD fitting `p = w*x + b` to
//! points near a line, on the GPU.
//!
//! `prepare` pre-warms (compiles and loads the `line` and `sgd` modules for
//! the device's `compute_XY`), then uploads the data and the weights — the
//! only host-to-device traffic, [`Workload::upload_bytes`] bytes. A step
//! queues two kernels (residual partials; gradients, loss and update) and
//! reads the loss back: one device-to-host copy and one stream
//! synchronisation. With `graph: true` the first step captures the two
//! kernels into a CUDA graph and every step launches it.

use cudarc::driver::{CudaFunction, CudaGraph, CudaSlice, PushKernelArg};
use falsify_core::{BoxError, OwnCounts, TrainSession, TrainSetup, Workload};

use crate::device::{check_len, grid, kernel_int, AxpyDevice, Counts};
use crate::error::{Error, Result};
use crate::kernels::{blocks_for, LINE, SGD};
use crate::mutant::Mutant;
use crate::oracle;
use crate::Axpy;

/// The configurations, by name: points per batch row.
pub const MODELS: &[(&str, usize)] = &[("line-4k", 4096), ("line-1m", 1 << 20)];

/// The learning rate when the setup gives none.
pub const DEFAULT_LEARNING_RATE: f64 = 0.5;

/// Full-batch SGD on a line fit.
#[derive(Debug, Clone, Copy, Default)]
pub struct LineFit;

/// The number of points `setup` trains on: the model's points per row
/// times `batch`.
pub fn points(setup: &TrainSetup) -> Result<usize> {
    let per_row = MODELS
        .iter()
        .find(|(name, _)| *name == setup.model)
        .map(|&(_, n)| n)
        .ok_or_else(|| {
            let names: Vec<&str> = MODELS.iter().map(|(n, _)| *n).collect();
            Error::InvalidArgument(format!(
                "no model `{}`; the line fit has {}",
                setup.model,
                names.join(", ")
            ))
        })?;
    if let Some(seq_len) = setup.seq_len {
        return Err(Error::InvalidArgument(format!(
            "seq_len: {seq_len} given, but a line fit has no sequences"
        )));
    }
    per_row
        .checked_mul(setup.batch.max(1))
        .ok_or_else(|| Error::InvalidArgument("too many points".into()))
}

impl Workload<Axpy> for LineFit {
    fn models(&self) -> &[&'static str] {
        const NAMES: &[&str] = &["line-4k", "line-1m"];
        NAMES
    }

    /// The points `x` and targets `t` (f32 each) and the weights `w, b`.
    fn upload_bytes(&self, setup: &TrainSetup) -> Result<u64, BoxError> {
        let n = points(setup)? as u64;
        Ok((2 * n + 2) * std::mem::size_of::<f32>() as u64)
    }

    fn prepare<'d>(
        &self,
        device: &'d mut AxpyDevice,
        setup: &TrainSetup,
        mutant: Option<&Mutant>,
    ) -> Result<Box<dyn TrainSession + 'd>, BoxError> {
        let n = points(setup)?;
        let at_start = device.counts();
        device.load(&LINE)?;
        if mutant != Some(&Mutant::UpdateModuleLoadedLate) {
            device.load(&SGD)?;
        }
        let loaded_at_prewarm = device.counts().modules_loaded;
        let (x, t) = oracle::line_data(n, setup.seed);
        let buffers = Buffers {
            x: device.upload(&x)?,
            t: device.upload(&t)?,
            params: device.upload(&[0.0, 0.0])?,
            partial: device
                .stream()
                .alloc_zeros::<f32>(3 * blocks_for(n) as usize)?,
            loss: device.stream().alloc_zeros::<f32>(1)?,
            n,
            lr: setup.learning_rate.unwrap_or(DEFAULT_LEARNING_RATE) as f32,
        };
        Ok(Box::new(LineSession {
            device,
            buffers,
            graphed: setup.graph,
            graph: None,
            kernels: None,
            steps: 0,
            at_start,
            loaded_at_prewarm,
        }))
    }
}

/// The device buffers and sizes of one line fit.
struct Buffers {
    x: CudaSlice<f32>,
    t: CudaSlice<f32>,
    /// `[w, b]`.
    params: CudaSlice<f32>,
    /// Three floats per block of `line_partials`.
    partial: CudaSlice<f32>,
    loss: CudaSlice<f32>,
    n: usize,
    lr: f32,
}

/// A prepared line fit.
struct LineSession<'d> {
    device: &'d mut AxpyDevice,
    /// Before the buffers, so that it is destroyed before they are freed.
    graph: Option<CudaGraph>,
    buffers: Buffers,
    graphed: bool,
    /// Looked up on the first step, outside any capture (a module the
    /// pre-warm left out is loaded then).
    kernels: Option<StepKernels>,
    steps: u64,
    /// The device's counters when `prepare` began.
    at_start: Counts,
    /// Modules loaded when the pre-warm ended.
    loaded_at_prewarm: u64,
}

/// The two kernels of a step.
#[derive(Clone)]
struct StepKernels {
    partials: CudaFunction,
    update: CudaFunction,
}

impl StepKernels {
    fn look_up(device: &mut AxpyDevice) -> Result<Self> {
        Ok(StepKernels {
            partials: device.kernel(&LINE, "line_partials")?,
            update: device.kernel(&SGD, "line_update")?,
        })
    }
}

/// Queues one step's kernels on the device's stream: residual partials,
/// then gradients, loss and the SGD update. Makes no driver call but the
/// two launches, so it can be captured.
fn queue_step(device: &AxpyDevice, k: &StepKernels, b: &mut Buffers) -> Result<()> {
    let (partials, update) = (&k.partials, &k.update);
    let blocks = blocks_for(b.n);
    let n = kernel_int(b.n)?;
    let blocks_arg = kernel_int(blocks as usize)?;
    check_len(b.n, &[b.x.len(), b.t.len()])?;
    check_len(3 * blocks as usize, &[b.partial.len()])?;
    check_len(2, &[b.params.len()])?;
    let mut launch = device.stream().launch_builder(partials);
    launch
        .arg(&n)
        .arg(&b.x)
        .arg(&b.t)
        .arg(&b.params)
        .arg(&mut b.partial);
    // SAFETY: `line_partials(int, const float*, const float*, const float*,
    // float*)` reads x[0..n], t[0..n], params[0..2] and writes
    // partial[0..3*blocks]; the lengths are checked above.
    unsafe { launch.launch(grid(blocks)) }?;
    let mut launch = device.stream().launch_builder(update);
    launch
        .arg(&blocks_arg)
        .arg(&n)
        .arg(&b.lr)
        .arg(&b.partial)
        .arg(&mut b.params)
        .arg(&mut b.loss);
    // SAFETY: `line_update(int, int, float, const float*, float*, float*)`
    // reads partial[0..3*blocks], updates params[0..2] and writes loss[0];
    // the lengths are checked above (loss has one element by construction).
    unsafe { launch.launch(grid(1)) }?;
    Ok(())
}

impl LineSession<'_> {
    fn run_step(&mut self) -> Result<f32> {
        let kernels = match &self.kernels {
            Some(k) => k.clone(),
            None => StepKernels::look_up(self.device)?,
        };
        self.kernels = Some(kernels.clone());
        if self.graphed {
            if self.graph.is_none() {
                let buffers = &mut self.buffers;
                let graph = self.device.capture(|d| queue_step(d, &kernels, buffers))?;
                self.graph = Some(graph);
            }
            if let Some(graph) = &self.graph {
                graph.launch()?;
            }
        } else {
            queue_step(self.device, &kernels, &mut self.buffers)?;
        }
        let loss = self.device.download(&self.buffers.loss)?;
        self.steps += 1;
        loss.first()
            .copied()
            .ok_or_else(|| Error::InvalidArgument("the loss buffer is empty".into()))
    }
}

impl TrainSession for LineSession<'_> {
    fn step(&mut self) -> Result<f32, BoxError> {
        Ok(self.run_step()?)
    }

    fn own_counts(&self) -> Option<OwnCounts> {
        let now = self.device.counts();
        let steps = self.steps.max(1) as f64;
        Some(OwnCounts {
            compilations_after_prewarm: Some(now.modules_loaded - self.loaded_at_prewarm),
            syncs_inside_capture: Some(
                now.syncs_inside_capture - self.at_start.syncs_inside_capture,
            ),
            syncs_per_step: (self.steps > 0)
                .then(|| (now.host_syncs - self.at_start.host_syncs) as f64 / steps),
            modules_loaded: Some(now.modules_loaded - self.at_start.modules_loaded),
            device_to_host_bytes: Some(
                now.device_to_host_bytes - self.at_start.device_to_host_bytes,
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup(model: &str, batch: usize, seq_len: Option<usize>) -> TrainSetup {
        TrainSetup {
            model: model.into(),
            batch,
            seq_len,
            graph: false,
            steps: 3,
            seed: 1,
            learning_rate: None,
        }
    }

    /// The upload the observer waits for is the data and the weights,
    /// exactly what `prepare` copies.
    #[test]
    fn upload_bytes_are_the_points_targets_and_weights() {
        let bytes = LineFit.upload_bytes(&setup("line-4k", 2, None)).unwrap();
        assert_eq!(bytes, (2 * 8192 + 2) * 4);
        let names: Vec<&str> = MODELS.iter().map(|(n, _)| *n).collect();
        assert_eq!(LineFit.models(), names.as_slice());
    }

    #[test]
    fn unknown_models_and_sequences_are_refused_by_name() {
        let e = LineFit
            .upload_bytes(&setup("line-2k", 1, None))
            .unwrap_err();
        assert!(e.to_string().contains("line-4k, line-1m"), "{e}");
        let e = points(&setup("line-4k", 1, Some(128))).unwrap_err();
        assert!(e.to_string().contains("seq_len: 128"), "{e}");
    }
}
