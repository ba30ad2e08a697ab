//! A recorded region and the analyses that the driver-observed checks read
//! from it. Everything here is pure: it works the same on a live recording
//! and on one built by hand with [`RecordingBuilder`].

use std::fmt;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::event::{CuResult, Direction, Event, EventKind, Origin, Outputs};
use crate::image::ModuleImage;
use crate::inject::InjectionReport;
use crate::recorder::{Recorder, Returned};
use crate::sm::Sm;

/// What the driver went through in one region, in order.
#[derive(Clone, Debug, Serialize)]
pub struct Recording {
    /// The events; an event's `seq` is its index.
    pub events: Vec<Event>,
    /// What became of each armed injection, then of each `inject_now`.
    pub injections: Vec<InjectionReport>,
    /// Stream captures already in progress when the region began.
    pub open_captures_at_start: u32,
    /// Callbacks that failed inside the observer (a panic caught at the FFI
    /// boundary): calls may be missing from `events`. Zero in a sound run.
    pub callback_faults: u32,
}

/// A module load and what its image targets.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LoadedTargets {
    pub seq: u64,
    pub api: String,
    pub image: String,
    pub targets: Vec<Sm>,
    pub result: Option<CuResult>,
    pub origin: Origin,
}

/// A module the driver loaded whose code is not built for the device.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TargetMismatch {
    pub seq: u64,
    pub api: String,
    /// What the image holds (`PTX sm_70`, `fatbin [sm_80 cubin]`).
    pub found: String,
    pub device: Sm,
    pub origin: Origin,
}

impl fmt::Display for TargetMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "event {} ({}) loaded {} on an {} device",
            self.seq, self.api, self.found, self.device
        )
    }
}

/// One instantiation of a captured graph.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Instantiation {
    pub seq: u64,
    pub result: Option<CuResult>,
    pub exec: Option<u64>,
}

/// One stream capture, from its begin to its end, and what became of the
/// graph it made.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Capture {
    pub stream: u64,
    pub begin_seq: u64,
    pub begin_result: Option<CuResult>,
    pub end_seq: Option<u64>,
    pub end_result: Option<CuResult>,
    pub graph: Option<u64>,
    pub instantiations: Vec<Instantiation>,
    /// Launches of its executable graphs that did not fail (replays).
    pub launches: usize,
    pub failed_launches: usize,
    /// Host synchronisations made while it was in progress.
    pub syncs_inside: usize,
}

impl Capture {
    /// Begun, ended and instantiated without an error.
    pub fn succeeded(&self) -> bool {
        let ok = |r: Option<CuResult>| r.is_some_and(CuResult::is_success);
        ok(self.begin_result)
            && ok(self.end_result)
            && self.graph.is_some()
            && self.instantiations.iter().any(|i| ok(i.result))
    }
}

/// The host synchronisations between one marker and the next.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StepSyncs {
    pub label: String,
    pub marker_seq: u64,
    /// Outside any stream capture.
    pub host_syncs: usize,
    /// While a capture was in progress (each one breaks it).
    pub host_syncs_inside_capture: usize,
}

/// Within one marked step, the span from the first launch of one kernel to
/// the last launch of another, and the host traffic inside it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepSpan<'r> {
    pub label: String,
    pub marker_seq: u64,
    /// The first and last event of the span (both launches, inclusive);
    /// `None` when the step launched no `from` kernel, or no `to` kernel at
    /// or after it.
    pub span: Option<(u64, u64)>,
    /// The device-to-host copies and the synchronisations inside the span,
    /// whatever the driver answered.
    pub traffic: Vec<&'r Event>,
}

impl Recording {
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    pub fn markers(&self) -> Vec<&Event> {
        self.filter(|e| matches!(e.kind, EventKind::Marker { .. }))
    }

    fn filter(&self, keep: impl Fn(&Event) -> bool) -> Vec<&Event> {
        self.events.iter().filter(|e| keep(e)).collect()
    }

    fn module_loads(&self) -> impl Iterator<Item = (&Event, &ModuleImage)> {
        self.events.iter().filter_map(|e| match &e.kind {
            EventKind::ModuleLoad { image, .. } => Some((e, image)),
            _ => None,
        })
    }

    /// Every module load (whatever its result) and what its image targets.
    pub fn loaded_targets(&self) -> Vec<LoadedTargets> {
        self.module_loads()
            .map(|(e, image)| LoadedTargets {
                seq: e.seq,
                api: e.api.clone(),
                image: image.describe(),
                targets: image.targets(),
                result: e.result,
                origin: e.origin,
            })
            .collect()
    }

    /// The module loads the driver did not refuse whose image holds no code
    /// built for `device` (see [`ModuleImage::targets_device`]); unrecognised
    /// images count as mismatches.
    pub fn target_mismatches(&self, device: impl Into<Sm>) -> Vec<TargetMismatch> {
        let device = device.into();
        self.module_loads()
            .filter(|(e, image)| !e.failed() && !image.targets_device(device))
            .map(|(e, image)| TargetMismatch {
                seq: e.seq,
                api: e.api.clone(),
                found: image.describe(),
                device,
                origin: e.origin,
            })
            .collect()
    }

    /// The module loads and link inputs that made the driver JIT-compile PTX
    /// for `device`.
    pub fn jit_loads(&self, device: impl Into<Sm>) -> Vec<&Event> {
        let device = device.into();
        self.filter(|e| match &e.kind {
            EventKind::ModuleLoad { image, .. } | EventKind::LinkInput { image, .. } => {
                !e.failed() && image.needs_jit(device) == Some(true)
            }
            _ => false,
        })
    }

    /// The host-to-device copy with which the bytes copied host to device
    /// (by copies that did not fail, in call order) first reach `model_bytes`:
    /// the end of the model's upload. `None` if they never do.
    pub fn upload_point(&self, model_bytes: u64) -> Option<&Event> {
        let mut copied = 0u64;
        self.events.iter().find(|e| match e.kind {
            EventKind::Copy {
                direction: Direction::HostToDevice,
                bytes,
                ..
            } if !e.failed() => {
                copied = copied.saturating_add(bytes);
                copied >= model_bytes
            }
            _ => false,
        })
    }

    /// Module loads after event `seq`: the load calls and JIT-linker inputs
    /// the driver did not refuse, and CUPTI's notifications that a module was
    /// loaded (which lazy loading may deliver later than the call).
    pub fn loads_after(&self, seq: u64) -> Vec<&Event> {
        self.filter(|e| {
            e.seq > seq
                && match e.kind {
                    EventKind::ModuleLoad { .. } | EventKind::LinkInput { .. } => !e.failed(),
                    EventKind::ModuleLoaded { .. } => true,
                    _ => false,
                }
        })
    }

    /// Synchronisations (context, stream, event) made while a stream capture
    /// was in progress, whatever the driver answered.
    pub fn syncs_inside_capture(&self) -> Vec<&Event> {
        self.filter(|e| matches!(e.kind, EventKind::Sync { .. }) && e.capture.inside())
    }

    /// Device-to-host copies made while a stream capture was in progress. An
    /// asynchronous one on the capturing stream is captured into the graph,
    /// not executed; the others wait for the device or break the capture.
    pub fn dtoh_inside_capture(&self) -> Vec<&Event> {
        self.filter(|e| {
            matches!(
                e.kind,
                EventKind::Copy {
                    direction: Direction::DeviceToHost,
                    ..
                }
            ) && e.capture.inside()
        })
    }

    /// For each marker, the host synchronisations ([`Event::is_host_sync`])
    /// until the next marker (or the end), outside and inside captures.
    pub fn host_syncs_per_step(&self) -> Vec<StepSyncs> {
        let mut steps: Vec<StepSyncs> = Vec::new();
        for event in &self.events {
            if let EventKind::Marker { label } = &event.kind {
                steps.push(StepSyncs {
                    label: label.clone(),
                    marker_seq: event.seq,
                    host_syncs: 0,
                    host_syncs_inside_capture: 0,
                });
            } else if let (Some(step), true) = (steps.last_mut(), event.is_host_sync()) {
                if event.capture.inside() {
                    step.host_syncs_inside_capture += 1;
                } else {
                    step.host_syncs += 1;
                }
            }
        }
        steps
    }

    /// For each marker whose label starts with `step`, the span from the
    /// step's first program launch of a kernel whose name starts with
    /// `from_kernel` to its last program launch of one whose name starts with
    /// `to_kernel`, and the host traffic in it: device-to-host copies (sync
    /// or not) and context, stream and event synchronisations, injected ones
    /// included.
    pub fn host_traffic_in_spans(&self, from_kernel: &str, to_kernel: &str) -> Vec<StepSpan<'_>> {
        let mut steps = Vec::new();
        let mut starts = self
            .events
            .iter()
            .enumerate()
            .filter_map(|(i, e)| match &e.kind {
                EventKind::Marker { label } => Some((i, e.seq, label)),
                _ => None,
            })
            .peekable();
        while let Some((at, marker_seq, label)) = starts.next() {
            let until = starts.peek().map_or(self.events.len(), |&(next, ..)| next);
            if !label.starts_with("step") {
                continue;
            }
            let step = &self.events[at + 1..until];
            let span = kernel_span(step, from_kernel, to_kernel);
            let traffic = span.map_or_else(Vec::new, |(first, last)| {
                step.iter()
                    .filter(|e| (first..=last).contains(&e.seq) && is_host_traffic(e))
                    .collect()
            });
            steps.push(StepSpan {
                label: label.clone(),
                marker_seq,
                span,
                traffic,
            });
        }
        steps
    }

    /// Every stream capture begun in the region, with its end, its graph's
    /// instantiations and their launches (handles matched to the latest
    /// capture that made them). Captures begun before the region are left out.
    pub fn captures(&self) -> Vec<Capture> {
        let mut captures: Vec<Capture> = Vec::new();
        let mut open: Vec<usize> = Vec::new();
        for e in &self.events {
            match &e.kind {
                EventKind::CaptureBegin { stream, .. } => {
                    if e.result.is_none_or(CuResult::is_success) {
                        open.push(captures.len());
                    }
                    captures.push(Capture::begun(*stream, e));
                }
                EventKind::CaptureEnd { stream, graph } => {
                    if let Some(at) = open.iter().position(|&i| captures[i].stream == *stream) {
                        let capture = &mut captures[open.remove(at)];
                        capture.end_seq = Some(e.seq);
                        capture.end_result = e.result;
                        capture.graph = *graph;
                    }
                }
                EventKind::GraphInstantiate { graph, exec } => {
                    let made = captures.iter_mut().rev().find(|c| c.graph == Some(*graph));
                    if let Some(capture) = made {
                        capture.instantiations.push(Instantiation {
                            seq: e.seq,
                            result: e.result,
                            exec: *exec,
                        });
                    }
                }
                EventKind::GraphLaunch { exec, .. } => {
                    let made = captures
                        .iter_mut()
                        .rev()
                        .find(|c| c.instantiations.iter().any(|i| i.exec == Some(*exec)));
                    match made {
                        Some(capture) if e.failed() => capture.failed_launches += 1,
                        Some(capture) => capture.launches += 1,
                        None => {}
                    }
                }
                EventKind::Sync { .. } if e.capture.inside() => {
                    for &i in &open {
                        captures[i].syncs_inside += 1;
                    }
                }
                _ => {}
            }
        }
        captures
    }

    /// Every executable-graph launch (replay), whatever its result.
    pub fn graph_launches(&self) -> Vec<&Event> {
        self.filter(|e| matches!(e.kind, EventKind::GraphLaunch { .. }))
    }

    /// Every kernel launch; inside a capture these are captured, not run.
    pub fn kernel_launches(&self) -> Vec<&Event> {
        self.filter(|e| matches!(e.kind, EventKind::KernelLaunch { .. }))
    }

    /// Bytes allocated (device, managed, pinned host) by calls that did not fail.
    pub fn bytes_allocated(&self) -> u64 {
        self.events
            .iter()
            .filter(|e| !e.failed())
            .filter_map(|e| match e.kind {
                EventKind::Alloc { bytes, .. } => Some(bytes),
                _ => None,
            })
            .sum()
    }

    /// Bytes copied in `direction` by copies that did not fail.
    pub fn bytes_copied(&self, direction: Direction) -> u64 {
        self.events
            .iter()
            .filter(|e| !e.failed())
            .filter_map(|e| match e.kind {
                EventKind::Copy {
                    direction: d,
                    bytes,
                    ..
                } if d == direction => Some(bytes),
                _ => None,
            })
            .sum()
    }
}

/// The program's launches of kernels named with a prefix.
fn launched<'e>(events: &'e [Event], prefix: &'e str) -> impl Iterator<Item = u64> + 'e {
    events.iter().filter_map(move |e| match &e.kind {
        EventKind::KernelLaunch {
            name: Some(name), ..
        } if name.starts_with(prefix) && e.origin == Origin::Program => Some(e.seq),
        _ => None,
    })
}

/// The first `from` launch and the last `to` launch at or after it.
fn kernel_span(events: &[Event], from: &str, to: &str) -> Option<(u64, u64)> {
    let first = launched(events, from).next()?;
    let last = launched(events, to).filter(|&s| s >= first).last()?;
    Some((first, last))
}

/// A device-to-host copy or a synchronisation.
fn is_host_traffic(e: &Event) -> bool {
    matches!(
        e.kind,
        EventKind::Sync { .. }
            | EventKind::Copy {
                direction: Direction::DeviceToHost,
                ..
            }
    )
}

impl Capture {
    fn begun(stream: u64, begin: &Event) -> Self {
        Self {
            stream,
            begin_seq: begin.seq,
            begin_result: begin.result,
            end_seq: None,
            end_result: None,
            graph: None,
            instantiations: Vec::new(),
            launches: 0,
            failed_launches: 0,
            syncs_inside: 0,
        }
    }
}

/// A call begun with [`RecordingBuilder::begin`], to end with
/// [`RecordingBuilder::end`].
#[derive(Debug)]
pub struct Pending {
    token: u64,
    api: String,
    kind: EventKind,
}

/// Builds a recording by hand, through the live observer's own bookkeeping
/// (order, stream-capture state), to test what reads recordings.
#[derive(Debug)]
pub struct RecordingBuilder {
    recorder: Recorder,
    now: Instant,
}

impl Default for RecordingBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl RecordingBuilder {
    pub fn new() -> Self {
        let now = Instant::now();
        let mut recorder = Recorder::default();
        // A fresh recorder records nothing yet, so starting cannot fail.
        let _ = recorder.start(Vec::new(), now);
        Self { recorder, now }
    }

    fn tick(&mut self) -> Instant {
        self.now += Duration::from_micros(1);
        self.now
    }

    /// A call that returns `CUDA_SUCCESS`; its sequence number.
    pub fn call(&mut self, api: &str, kind: EventKind) -> u64 {
        self.call_with(api, kind, CuResult::SUCCESS)
    }

    /// A call that returns `result`; its sequence number.
    pub fn call_with(&mut self, api: &str, kind: EventKind, result: CuResult) -> u64 {
        let pending = self.begin(api, kind);
        self.end(pending, result)
    }

    /// The beginning of a call; others may come before its end.
    pub fn begin(&mut self, api: &str, kind: EventKind) -> Pending {
        let now = self.tick();
        let token = self
            .recorder
            .enter(api, kind.clone(), now, || std::thread::current().id());
        Pending {
            token,
            api: api.to_string(),
            kind,
        }
    }

    /// The end of a call begun with [`begin`](Self::begin); its sequence number.
    pub fn end(&mut self, pending: Pending, result: CuResult) -> u64 {
        let now = self.tick();
        let thread = || std::thread::current().id();
        let returned = Returned {
            token: pending.token,
            api: &pending.api,
            result,
            outputs: Outputs::default(),
            capture: Some(&pending.kind),
        };
        self.recorder.exit(returned, now, thread);
        (pending.token & u64::from(u32::MAX)).saturating_sub(1)
    }

    /// A CUPTI notification with no call around it (a module loaded).
    pub fn notify(&mut self, api: &str, kind: EventKind) {
        let now = self.tick();
        self.recorder
            .notify(api, kind, now, || std::thread::current().id());
    }

    pub fn mark(&mut self, label: &str) -> u64 {
        let now = self.tick();
        self.recorder
            .mark(label.to_string(), now)
            .unwrap_or_default()
    }

    pub fn build(mut self) -> Recording {
        self.recorder.stop().unwrap_or_else(|_| Recording {
            events: Vec::new(),
            injections: Vec::new(),
            open_captures_at_start: 0,
            callback_faults: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Memory, SyncOn};
    use crate::image::parse_image;
    use crate::image::tests::{elf, fatbin};

    const DEVICE: Sm = Sm::new(9, 0);
    const STREAM: u64 = 0x5000;

    fn load_bytes(bytes: &[u8]) -> EventKind {
        EventKind::ModuleLoad {
            image: parse_image(bytes),
            file: None,
            handle: None,
        }
    }

    fn ptx(target: &str) -> EventKind {
        load_bytes(format!(".version 7.8\n.target {target}\n").as_bytes())
    }

    fn copy(direction: Direction, bytes: u64, asynchronous: bool) -> EventKind {
        EventKind::Copy {
            direction,
            bytes,
            asynchronous,
            stream: asynchronous.then_some(STREAM),
        }
    }

    fn sync(on: SyncOn) -> EventKind {
        EventKind::Sync { on, handle: STREAM }
    }

    fn launch(name: &str) -> EventKind {
        EventKind::KernelLaunch {
            name: Some(name.into()),
            stream: STREAM,
            grid: [1, 1, 1],
            block: [32, 1, 1],
        }
    }

    fn begin() -> EventKind {
        EventKind::CaptureBegin {
            stream: STREAM,
            mode: Some(0),
        }
    }

    fn end(graph: Option<u64>) -> EventKind {
        EventKind::CaptureEnd {
            stream: STREAM,
            graph,
        }
    }

    fn replay(exec: u64) -> EventKind {
        EventKind::GraphLaunch {
            exec,
            stream: STREAM,
        }
    }

    /// Loads (PTX for the device, older PTX, a refused newer PTX, a cubin, a
    /// fat binary without device code), an upload of 300 bytes in three
    /// copies, one load after it, then marked steps: a direct step, a broken
    /// capture, a good capture replayed three times (once failing).
    fn trial() -> Recording {
        let mut b = RecordingBuilder::new();
        b.call("cuModuleLoadData", ptx("sm_90"));
        b.call("cuModuleLoadData", ptx("sm_70"));
        b.call_with("cuModuleLoadData", ptx("sm_100"), CuResult::INVALID_PTX);
        b.call("cuModuleLoadData", load_bytes(&elf(8, 0x0600_5a04)));
        b.call(
            "cuLibraryLoadData",
            load_bytes(&fatbin(&[(2, 80, &elf(7, 0x0050_0550))])),
        );
        let alloc = EventKind::Alloc {
            bytes: 300,
            memory: Memory::Device,
            stream: None,
            address: None,
        };
        b.call("cuMemAlloc_v2", alloc);
        for _ in 0..3 {
            b.call(
                "cuMemcpyHtoDAsync_v2",
                copy(Direction::HostToDevice, 100, true),
            );
        }
        b.call("cuModuleLoadData", ptx("sm_90"));
        b.notify(
            "module loaded",
            EventKind::ModuleLoaded {
                module_id: 9,
                cubin_bytes: 4096,
                cubin: Some(DEVICE),
            },
        );
        b.mark("step 1");
        b.call("cuLaunchKernel", launch("direct"));
        b.call("cuStreamSynchronize", sync(SyncOn::Stream));
        b.call("cuMemcpyDtoH_v2", copy(Direction::DeviceToHost, 4, false));
        b.mark("step 2");
        b.call("cuStreamBeginCapture_v2", begin());
        b.call("cuLaunchKernel", launch("captured"));
        b.call_with(
            "cuCtxSynchronize",
            sync(SyncOn::Context),
            CuResult::STREAM_CAPTURE_UNSUPPORTED,
        );
        b.call(
            "cuMemcpyDtoHAsync_v2",
            copy(Direction::DeviceToHost, 4, true),
        );
        b.call_with(
            "cuStreamEndCapture",
            end(None),
            CuResult::STREAM_CAPTURE_INVALIDATED,
        );
        b.mark("step 3");
        b.call("cuStreamBeginCapture_v2", begin());
        b.call("cuLaunchKernel", launch("captured"));
        b.call("cuStreamEndCapture", end(Some(0x9000)));
        let instantiate = EventKind::GraphInstantiate {
            graph: 0x9000,
            exec: Some(0xE000),
        };
        b.call("cuGraphInstantiateWithFlags", instantiate);
        b.call("cuGraphLaunch", replay(0xE000));
        b.call("cuGraphLaunch", replay(0xE000));
        b.call_with("cuGraphLaunch", replay(0xE000), CuResult(700));
        b.call("cuGraphLaunch", replay(0xF000));
        b.call("cuEventSynchronize", sync(SyncOn::Event));
        b.build()
    }

    #[test]
    fn events_are_numbered_in_order() {
        let recording = trial();
        assert!(recording
            .events
            .iter()
            .enumerate()
            .all(|(i, e)| e.seq == i as u64));
        assert_eq!(recording.markers().len(), 3);
        assert_eq!(recording.callback_faults, 0);
    }

    #[test]
    fn every_load_names_its_targets_and_the_mismatches_are_the_loaded_ones() {
        let recording = trial();
        let loads = recording.loaded_targets();
        let images: Vec<&str> = loads.iter().map(|l| l.image.as_str()).collect();
        assert_eq!(
            images,
            [
                "PTX sm_90",
                "PTX sm_70",
                "PTX sm_100",
                "cubin sm_90",
                "fatbin [sm_80 cubin]",
                "PTX sm_90"
            ]
        );
        assert_eq!(loads[2].result, Some(CuResult::INVALID_PTX));
        let mismatches = recording.target_mismatches((9, 0));
        let found: Vec<(u64, &str)> = mismatches
            .iter()
            .map(|m| (m.seq, m.found.as_str()))
            .collect();
        assert_eq!(found, [(1, "PTX sm_70"), (4, "fatbin [sm_80 cubin]")]);
        assert_eq!(
            mismatches[0].to_string(),
            "event 1 (cuModuleLoadData) loaded PTX sm_70 on an sm_90 device"
        );
        let jit: Vec<u64> = recording.jit_loads(DEVICE).iter().map(|e| e.seq).collect();
        assert_eq!(jit, [0, 1, 9]);
    }

    #[test]
    fn the_upload_ends_where_the_model_bytes_are_reached_and_later_loads_show() {
        let recording = trial();
        let upload = recording.upload_point(300).unwrap();
        assert_eq!(upload.seq, 8);
        assert_eq!(recording.upload_point(150).unwrap().seq, 7);
        assert!(recording.upload_point(301).is_none());
        let after: Vec<(u64, &str)> = recording
            .loads_after(upload.seq)
            .iter()
            .map(|e| (e.seq, e.api.as_str()))
            .collect();
        assert_eq!(after, [(9, "cuModuleLoadData"), (10, "module loaded")]);
        assert_eq!(recording.bytes_allocated(), 300);
        assert_eq!(recording.bytes_copied(Direction::HostToDevice), 300);
        assert_eq!(recording.bytes_copied(Direction::DeviceToHost), 8);
    }

    #[test]
    fn syncs_and_copies_inside_a_capture_are_told_apart() {
        let recording = trial();
        let syncs: Vec<&str> = recording
            .syncs_inside_capture()
            .iter()
            .map(|e| e.api.as_str())
            .collect();
        assert_eq!(syncs, ["cuCtxSynchronize"]);
        let dtoh = recording.dtoh_inside_capture();
        assert_eq!(dtoh.len(), 1);
        assert!(dtoh[0].capture.on_capturing_stream);
        let steps = recording.host_syncs_per_step();
        let steps: Vec<(&str, usize, usize)> = steps
            .iter()
            .map(|s| (s.label.as_str(), s.host_syncs, s.host_syncs_inside_capture))
            .collect();
        // step 1: a stream sync and a synchronous copy; step 3: an event sync.
        assert_eq!(
            steps,
            [("step 1", 2, 0), ("step 2", 0, 1), ("step 3", 1, 0)]
        );
    }

    #[test]
    fn captures_carry_their_results_graphs_and_replays() {
        let recording = trial();
        let captures = recording.captures();
        assert_eq!(captures.len(), 2);
        let broken = &captures[0];
        assert_eq!(
            broken.end_result,
            Some(CuResult::STREAM_CAPTURE_INVALIDATED)
        );
        assert_eq!((broken.graph, broken.syncs_inside), (None, 1));
        assert!(!broken.succeeded());
        let good = &captures[1];
        assert!(good.succeeded(), "{good:?}");
        assert_eq!(good.graph, Some(0x9000));
        assert_eq!(good.instantiations[0].exec, Some(0xE000));
        assert_eq!(
            (good.launches, good.failed_launches, good.syncs_inside),
            (2, 1, 0)
        );
        assert_eq!(recording.graph_launches().len(), 4);
        let names: Vec<&str> = recording
            .kernel_launches()
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::KernelLaunch { name, .. } => name.as_deref(),
                _ => None,
            })
            .collect();
        assert_eq!(names, ["direct", "captured", "captured"]);
    }

    #[test]
    fn a_capture_that_never_ends_has_no_graph() {
        let mut b = RecordingBuilder::new();
        b.call("cuStreamBeginCapture_v2", begin());
        let pending = b.begin("cuStreamSynchronize", sync(SyncOn::Stream));
        b.end(pending, CuResult::STREAM_CAPTURE_UNSUPPORTED);
        b.call_with("cuStreamBeginCapture_v2", begin(), CuResult::INVALID_VALUE);
        let recording = b.build();
        let captures = recording.captures();
        assert_eq!(captures.len(), 2);
        assert_eq!((captures[0].end_seq, captures[0].syncs_inside), (None, 1));
        assert_eq!(captures[1].begin_result, Some(CuResult::INVALID_VALUE));
        assert!(captures.iter().all(|c| !c.succeeded()));
        assert!(
            recording.host_syncs_per_step().is_empty(),
            "no markers, no steps"
        );
    }

    #[test]
    fn jit_linker_inputs_are_compilations_not_loaded_modules() {
        let mut b = RecordingBuilder::new();
        b.call("cuMemcpyHtoD_v2", copy(Direction::HostToDevice, 10, false));
        let image = parse_image(b".version 7.0\n.target sm_70\n\0");
        b.call(
            "cuLinkAddData_v2",
            EventKind::LinkInput { image, file: None },
        );
        b.call("cuModuleLoadData", load_bytes(&elf(8, 0x0600_5a04)));
        let recording = b.build();
        assert!(recording.target_mismatches(DEVICE).is_empty());
        assert_eq!(recording.loaded_targets().len(), 1);
        let jit: Vec<&str> = recording
            .jit_loads(DEVICE)
            .iter()
            .map(|e| e.api.as_str())
            .collect();
        assert_eq!(jit, ["cuLinkAddData_v2"]);
        let upload = recording.upload_point(10).unwrap().seq;
        assert_eq!(recording.loads_after(upload).len(), 2);
    }

    #[test]
    fn host_traffic_is_counted_between_the_first_and_last_named_launches() {
        let mut b = RecordingBuilder::new();
        b.mark("prepared");
        b.call("cuLaunchKernel", launch("clip_a"));
        b.mark("step 1");
        b.call("cuStreamSynchronize", sync(SyncOn::Stream));
        b.call("cuLaunchKernel", launch("clip_a"));
        b.call(
            "cuMemcpyDtoHAsync_v2",
            copy(Direction::DeviceToHost, 4, true),
        );
        b.call("cuLaunchKernel", launch("clip_z"));
        b.call("cuEventSynchronize", sync(SyncOn::Event));
        b.call("cuLaunchKernel", launch("clip_z"));
        b.call("cuMemcpyHtoD_v2", copy(Direction::HostToDevice, 4, false));
        b.call("cuCtxSynchronize", sync(SyncOn::Context));
        b.mark("step 2");
        b.call("cuLaunchKernel", launch("clip_z"));
        b.call("cuStreamSynchronize", sync(SyncOn::Stream));
        b.call("cuLaunchKernel", launch("clip_a"));
        let recording = b.build();
        let spans = recording.host_traffic_in_spans("clip_a", "clip_z");
        assert_eq!(spans.len(), 2, "steps only, not `prepared`");
        assert_eq!(spans[0].label, "step 1");
        assert_eq!(spans[0].span, Some((4, 8)));
        let apis: Vec<&str> = spans[0].traffic.iter().map(|e| e.api.as_str()).collect();
        assert_eq!(apis, ["cuMemcpyDtoHAsync_v2", "cuEventSynchronize"]);
        // A `to` launch only before the first `from` launch: no span.
        assert_eq!((spans[1].span, spans[1].traffic.len()), (None, 0));
    }

    #[test]
    fn recordings_serialise_for_reports() {
        let json = serde_json::to_string(&trial()).unwrap();
        assert!(json.contains("\"type\":\"ModuleLoad\""), "{json}");
        assert!(json.contains("\"CUDA_ERROR_STREAM_CAPTURE_INVALIDATED\""));
    }
}
