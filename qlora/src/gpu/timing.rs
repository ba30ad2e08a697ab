//! Timing helpers: CUDA-event timing of a region, optionally replayed as a
//! captured CUDA graph so the launch gaps of many small kernels do not hide
//! the kernels.

use cudarc::driver::{sys, CudaGraph};

use super::context::GpuContext;
use crate::error::Result;

/// A timing event (timing enabled) recorded on the work stream now.
fn mark(gpu: &GpuContext) -> Result<cudarc::driver::CudaEvent> {
    Ok(gpu
        .stream()
        .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?)
}

/// Times `body` with CUDA events: `warmup` untimed runs, then `repeats` runs
/// each between two events on the work stream. Returns the per-run times in
/// milliseconds, each divided by `per_run` (the operations one run holds).
pub fn time_events(
    gpu: &mut GpuContext,
    warmup: usize,
    repeats: usize,
    per_run: usize,
    mut body: impl FnMut(&mut GpuContext) -> Result<()>,
) -> Result<Vec<f64>> {
    for _ in 0..warmup {
        body(gpu)?;
    }
    gpu.synchronize()?;
    let mut marks = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        let start = mark(gpu)?;
        body(gpu)?;
        let end = mark(gpu)?;
        marks.push((start, end));
    }
    gpu.synchronize()?;
    let per = per_run.max(1) as f64;
    let mut out = Vec::with_capacity(repeats);
    for (start, end) in &marks {
        out.push(f64::from(start.elapsed_ms(end)?) / per);
    }
    Ok(out)
}

/// Captures `launches` calls of `body(gpu, i)` (i = 0..launches) into one
/// CUDA graph. `body` must already have run once outside capture, so that
/// every module it uses is compiled and loaded (capture forbids neither, but
/// a compilation would be timed). Capture is always ended, also when `body`
/// fails, so the stream is usable afterwards.
pub fn capture(
    gpu: &mut GpuContext,
    launches: usize,
    mut body: impl FnMut(&mut GpuContext, usize) -> Result<()>,
) -> Result<CudaGraph> {
    gpu.synchronize()?;
    let ((), graph) = gpu.capture(|gpu| (0..launches).try_for_each(|i| body(gpu, i)))?;
    Ok(graph)
}

/// Times `launches` calls of `body(gpu, i)` replayed as one captured graph:
/// one eager pass (compiles and warms), capture, `warmup` untimed replays,
/// then `repeats` timed replays. Returns per-call milliseconds (replay time
/// divided by `launches`).
pub fn time_graph(
    gpu: &mut GpuContext,
    launches: usize,
    warmup: usize,
    repeats: usize,
    body: impl FnMut(&mut GpuContext, usize) -> Result<()>,
) -> Result<Vec<f64>> {
    let graph = warmed_graph(gpu, launches, warmup, body)?;
    time_events(gpu, 0, repeats, launches, |_| Ok(graph.launch()?))
}

/// [`time_graph`] that may stop early: the same eager pass, capture and
/// `warmup` untimed replays, then at most `repeats` timed replays, the last
/// the first whose times so far `stop` accepts (per-call milliseconds, as
/// [`time_graph`] returns them). For a run that only has to show a bound
/// failed. Each timed replay is awaited while the next is already queued,
/// so the GPU runs them back to back as [`time_events`] does, and no
/// replay's time holds the host's launch call (one started on an idle
/// stream would, making it look slower than [`time_graph`] measures); the
/// replay queued past the stop runs untimed.
pub fn time_graph_until(
    gpu: &mut GpuContext,
    (launches, warmup, repeats): (usize, usize, usize),
    body: impl FnMut(&mut GpuContext, usize) -> Result<()>,
    mut stop: impl FnMut(&[f64]) -> bool,
) -> Result<Vec<f64>> {
    /// Timed replays in flight while the host awaits the first of them.
    const QUEUED: usize = 2;
    let graph = warmed_graph(gpu, launches, warmup, body)?;
    let per = launches.max(1) as f64;
    let mut times = Vec::with_capacity(repeats);
    let mut queued = std::collections::VecDeque::with_capacity(QUEUED);
    let mut launched = 0;
    while times.len() < repeats {
        while queued.len() < QUEUED && launched < repeats {
            let start = mark(gpu)?;
            graph.launch()?;
            queued.push_back((start, mark(gpu)?));
            launched += 1;
        }
        let Some((start, end)) = queued.pop_front() else {
            break;
        };
        end.synchronize()?;
        times.push(f64::from(start.elapsed_ms(&end)?) / per);
        if stop(&times) {
            break;
        }
    }
    gpu.synchronize()?;
    Ok(times)
}

/// `launches` calls of `body` run once eagerly (compiles and warms), then
/// captured as one graph and replayed `warmup` times untimed.
fn warmed_graph(
    gpu: &mut GpuContext,
    launches: usize,
    warmup: usize,
    mut body: impl FnMut(&mut GpuContext, usize) -> Result<()>,
) -> Result<CudaGraph> {
    for i in 0..launches {
        body(gpu, i)?;
    }
    let graph = capture(gpu, launches, &mut body)?;
    time_events(gpu, warmup, 0, launches, |_| Ok(graph.launch()?))?;
    Ok(graph)
}
