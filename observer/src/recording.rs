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

    /// The module loads that made the driver JIT-compile PTX for `device`.
    pub fn jit_loads(&self, device: impl Into<Sm>) -> Vec<&Event> {
        let device = device.into();
        self.module_loads()
            .filter(|(e, image)| !e.failed() && image.needs_jit(device) == Some(true))
            .map(|(e, _)| e)
            .collect()
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

    /// Module loads after event `seq`: the load calls the driver did not
    /// refuse, and CUPTI's notifications that a module was loaded (which
    /// lazy loading may deliver later than the call).
    pub fn loads_after(&self, seq: u64) -> Vec<&Event> {
        self.filter(|e| {
            e.seq > seq
                && match e.kind {
                    EventKind::ModuleLoad { .. } => !e.failed(),
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
