//! The observer's state apart from CUPTI: the stream captures in progress, the
//! recorded region (its events, in order) and its armed injections. The CUPTI
//! callback drives it with decoded calls; tests drive it with synthetic ones,
//! through the same code.
//!
//! A call is recorded in two halves: `enter` (its arguments, its place in the
//! order, the capture state) and `exit` (its result, what it wrote back). The
//! token `enter` returns travels in CUPTI's per-call correlation slot.

use std::thread::ThreadId;
use std::time::Instant;

use crate::error::ObserverError;
use crate::event::{CaptureState, CuResult, Direction, Event, EventKind, Origin, Outputs};
use crate::inject::{Action, InjectedCall, Injection, InjectionReport, Performed, Trigger};
use crate::recording::Recording;

/// The token of a call that is not being recorded.
pub(crate) const NO_TOKEN: u64 = 0;

#[derive(Debug, Default)]
pub(crate) struct Recorder {
    /// Streams with a capture in progress, kept while no region records, so
    /// that a region starting mid-capture still knows.
    open_captures: Vec<u64>,
    generation: u32,
    region: Option<Region>,
}

#[derive(Debug)]
struct Region {
    generation: u32,
    epoch: Instant,
    events: Vec<Event>,
    h2d_bytes: u64,
    armed: Vec<Armed>,
    direct: Vec<InjectionReport>,
    running: Option<Running>,
    open_captures_at_start: u32,
}

#[derive(Debug)]
struct Armed {
    injection: Injection,
    report: InjectionReport,
}

/// An injection being performed, outside the lock, by `thread`.
#[derive(Debug)]
struct Running {
    thread: ThreadId,
    armed: Option<usize>,
    action: Action,
    capture: CaptureState,
    started: Instant,
    first_event: usize,
    inside_callback: bool,
}

/// A returning driver call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Returned<'a> {
    /// What `enter` gave for the call.
    pub token: u64,
    /// The call's name, checked against the entry the token names.
    pub api: &'a str,
    pub result: CuResult,
    /// What the call wrote back (read only on success).
    pub outputs: Outputs,
    /// The call's arguments when it begins or ends a capture (decoded again at
    /// exit, so that captures are followed while no region records).
    pub capture: Option<&'a EventKind>,
}

/// What a returning program call may trigger.
#[derive(Clone, Copy, Debug)]
enum Met<'e> {
    ModuleLoad,
    Upload(u64),
    CaptureBegin,
    /// A kernel launch, with the kernel's name where CUPTI gave one.
    KernelLaunch(Option<&'e str>),
}

impl Met<'_> {
    /// Whether `trigger` fires on this call, the region's host-to-device
    /// bytes having reached `h2d` with it.
    fn meets(self, trigger: Trigger<'_>, h2d: u64) -> bool {
        match (trigger, self) {
            (Trigger::FirstModuleLoad, Met::ModuleLoad) => true,
            (Trigger::HostToDeviceBytes(n), Met::Upload(_)) => h2d >= n,
            (Trigger::CaptureBegin, Met::CaptureBegin) => true,
            (Trigger::KernelLaunch(prefix), Met::KernelLaunch(Some(name))) => {
                name.starts_with(prefix)
            }
            _ => false,
        }
    }
}

/// How a call changes the set of captures in progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CaptureChange {
    Begun(u64),
    Ended(u64),
}

/// A begin opens a capture when it succeeds; an end closes it whatever its
/// result (an invalidated capture ends too), except when called from a thread
/// that may not end it.
fn capture_change(kind: &EventKind, result: CuResult) -> Option<CaptureChange> {
    match kind {
        EventKind::CaptureBegin { stream, .. } if result.is_success() => {
            Some(CaptureChange::Begun(*stream))
        }
        EventKind::CaptureEnd { stream, .. } if result != CuResult::STREAM_CAPTURE_WRONG_THREAD => {
            Some(CaptureChange::Ended(*stream))
        }
        _ => None,
    }
}

fn nanos_since(epoch: Instant, now: Instant) -> u64 {
    u64::try_from(now.saturating_duration_since(epoch).as_nanos()).unwrap_or(u64::MAX)
}

impl Recorder {
    pub fn start(&mut self, injections: Vec<Injection>, now: Instant) -> Result<(), ObserverError> {
        if self.region.is_some() {
            return Err(ObserverError::AlreadyRecording);
        }
        self.generation = self.generation.wrapping_add(1);
        let armed = injections
            .into_iter()
            .map(|injection| Armed {
                report: InjectionReport {
                    injection: Some(injection.clone()),
                    trigger_seq: None,
                    call: None,
                },
                injection,
            })
            .collect();
        self.region = Some(Region {
            generation: self.generation,
            epoch: now,
            events: Vec::new(),
            h2d_bytes: 0,
            armed,
            direct: Vec::new(),
            running: None,
            open_captures_at_start: u32::try_from(self.open_captures.len()).unwrap_or(u32::MAX),
        });
        Ok(())
    }

    pub fn stop(&mut self) -> Result<Recording, ObserverError> {
        let region = self.region.take().ok_or(ObserverError::NotRecording)?;
        let mut injections: Vec<InjectionReport> =
            region.armed.into_iter().map(|a| a.report).collect();
        injections.extend(region.direct);
        Ok(Recording {
            events: region.events,
            injections,
            open_captures_at_start: region.open_captures_at_start,
            callback_faults: 0,
        })
    }

    fn stamp(&self, stream: Option<u64>) -> CaptureState {
        CaptureState {
            open: u32::try_from(self.open_captures.len()).unwrap_or(u32::MAX),
            on_capturing_stream: stream.is_some_and(|s| self.open_captures.contains(&s)),
        }
    }

    /// Appends a complete event to the region; its sequence number.
    fn push(&mut self, api: &str, kind: EventKind, now: Instant, origin: Origin) -> Option<u64> {
        let capture = self.stamp(kind.stream());
        let region = self.region.as_mut()?;
        let seq = region.events.len() as u64;
        region.events.push(Event {
            seq,
            api: api.to_string(),
            start_ns: nanos_since(region.epoch, now),
            end_ns: None,
            result: None,
            capture,
            origin,
            kind,
        });
        Some(seq)
    }

    fn origin(&self, thread: impl FnOnce() -> ThreadId) -> Origin {
        match self.region.as_ref().and_then(|r| r.running.as_ref()) {
            Some(running) if running.thread == thread() => Origin::Injected {
                inside_callback: running.inside_callback,
                reported_by_cupti: true,
            },
            _ => Origin::Program,
        }
    }

    /// The beginning of a driver call: its token for `exit`, or [`NO_TOKEN`]
    /// when no region records.
    pub fn enter(
        &mut self,
        api: &str,
        kind: EventKind,
        now: Instant,
        thread: impl FnOnce() -> ThreadId,
    ) -> u64 {
        let origin = self.origin(thread);
        let generation = self.region.as_ref().map(|r| r.generation);
        match (self.push(api, kind, now, origin), generation) {
            (Some(seq), Some(generation)) if seq < u64::from(u32::MAX) => {
                (u64::from(generation) << 32) | (seq + 1)
            }
            _ => NO_TOKEN,
        }
    }

    /// A notification with no call around it (CUPTI's resource callbacks).
    pub fn notify(
        &mut self,
        api: &str,
        kind: EventKind,
        now: Instant,
        thread: impl FnOnce() -> ThreadId,
    ) {
        let origin = self.origin(thread);
        self.push(api, kind, now, origin);
    }

    pub fn mark(&mut self, label: String, now: Instant) -> Result<u64, ObserverError> {
        self.push("marker", EventKind::Marker { label }, now, Origin::Program)
            .ok_or(ObserverError::NotRecording)
    }

    /// The end of a driver call. Returns an injection to perform now, on this
    /// thread, outside the lock; then call `finish_injection`.
    pub fn exit(
        &mut self,
        call: Returned<'_>,
        now: Instant,
        thread: impl FnOnce() -> ThreadId,
    ) -> Option<Action> {
        match call
            .capture
            .and_then(|kind| capture_change(kind, call.result))
        {
            Some(CaptureChange::Begun(stream)) if !self.open_captures.contains(&stream) => {
                self.open_captures.push(stream);
            }
            Some(CaptureChange::Ended(stream)) => self.open_captures.retain(|&s| s != stream),
            _ => {}
        }
        let region = self.region.as_mut()?;
        let index = usize::try_from((call.token & u64::from(u32::MAX)).checked_sub(1)?).ok()?;
        if call.token >> 32 != u64::from(region.generation) {
            return None;
        }
        let event = region.events.get_mut(index)?;
        if event.api != call.api || event.result.is_some() {
            return None;
        }
        event.result = Some(call.result);
        event.end_ns = Some(nanos_since(region.epoch, now));
        if call.result.is_success() {
            event.kind.apply(call.outputs);
        }
        self.fire(index, now, thread)
    }

    /// Arms the first injection whose trigger the event at `index` meets.
    fn fire(
        &mut self,
        index: usize,
        now: Instant,
        thread: impl FnOnce() -> ThreadId,
    ) -> Option<Action> {
        let region = self.region.as_ref()?;
        let event = region.events.get(index)?;
        if event.failed() {
            return None;
        }
        let (seq, origin, stream) = (event.seq, event.origin, event.kind.stream().unwrap_or(0));
        let met = match &event.kind {
            EventKind::ModuleLoad { .. } => Met::ModuleLoad,
            EventKind::Copy {
                direction: Direction::HostToDevice,
                bytes,
                ..
            } => Met::Upload(*bytes),
            EventKind::CaptureBegin { .. } => Met::CaptureBegin,
            EventKind::KernelLaunch { name, .. } => Met::KernelLaunch(name.as_deref()),
            _ => return None,
        };
        let h2d = match met {
            Met::Upload(bytes) => region.h2d_bytes.saturating_add(bytes),
            _ => region.h2d_bytes,
        };
        let slot = (region.running.is_none() && origin == Origin::Program)
            .then(|| {
                region.armed.iter().position(|a| {
                    a.report.trigger_seq.is_none() && met.meets(a.injection.trigger(), h2d)
                })
            })
            .flatten();
        let capture = self.stamp(Some(stream));
        let region = self.region.as_mut()?;
        region.h2d_bytes = h2d;
        let slot = slot?;
        let armed = &mut region.armed[slot];
        armed.report.trigger_seq = Some(seq);
        let action = armed.injection.action(stream);
        region.running = Some(Running {
            thread: thread(),
            armed: Some(slot),
            action,
            capture,
            started: now,
            first_event: region.events.len(),
            inside_callback: true,
        });
        Some(action)
    }

    /// Claims the region for an injection made outside any callback
    /// (`inject_now`).
    pub fn begin_direct(
        &mut self,
        action: Action,
        now: Instant,
        thread: ThreadId,
    ) -> Result<(), ObserverError> {
        let stream = match action {
            Action::Synchronize { stream, .. } => Some(stream),
            Action::LoadModule { .. } | Action::CopyToHost { .. } => None,
        };
        let capture = self.stamp(stream);
        let region = self.region.as_mut().ok_or(ObserverError::NotRecording)?;
        if region.running.is_some() {
            return Err(ObserverError::InjectionRunning);
        }
        region.running = Some(Running {
            thread,
            armed: None,
            action,
            capture,
            started: now,
            first_event: region.events.len(),
            inside_callback: false,
        });
        Ok(())
    }

    /// Closes the running injection. If CUPTI reported no call like the one
    /// made (CUPTI issues no callbacks for calls made inside a callback, if so
    /// on this driver), the call is recorded here, flagged as such, so the
    /// recording still shows what the driver went through.
    pub fn finish_injection(&mut self, performed: Performed, now: Instant) {
        let Some(region) = self.region.as_mut() else {
            return;
        };
        let Some(running) = region.running.take() else {
            return;
        };
        let since = region.events.get(running.first_event..).unwrap_or_default();
        let reported_by_cupti = since
            .iter()
            .any(|e| e.is_injected() && e.kind.same_kind(&performed.kind));
        let mut events: Vec<u64> = since
            .iter()
            .filter(|e| e.is_injected())
            .map(|e| e.seq)
            .collect();
        if !reported_by_cupti {
            let seq = region.events.len() as u64;
            region.events.push(Event {
                seq,
                api: performed.api.to_string(),
                start_ns: nanos_since(region.epoch, running.started),
                end_ns: Some(nanos_since(region.epoch, now)),
                result: Some(performed.result),
                capture: running.capture,
                origin: Origin::Injected {
                    inside_callback: running.inside_callback,
                    reported_by_cupti: false,
                },
                kind: performed.kind,
            });
            events.push(seq);
        }
        let call = InjectedCall {
            action: running.action,
            api: performed.api.to_string(),
            result: performed.result,
            inside_callback: running.inside_callback,
            reported_by_cupti,
            events,
        };
        match running.armed.and_then(|i| region.armed.get_mut(i)) {
            Some(armed) => armed.report.call = Some(call),
            None => region.direct.push(InjectionReport {
                injection: None,
                trigger_seq: None,
                call: Some(call),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::event::{CaptureState, SyncOn};
    use crate::image::parse_image;
    use crate::inject::SyncScope;
    use crate::sm::Sm;

    fn here() -> ThreadId {
        std::thread::current().id()
    }

    fn elsewhere() -> ThreadId {
        std::thread::spawn(|| std::thread::current().id())
            .join()
            .unwrap()
    }

    fn load(target: &str) -> EventKind {
        EventKind::ModuleLoad {
            image: parse_image(format!(".version 7.8\n.target {target}\n").as_bytes()),
            file: None,
            handle: None,
        }
    }

    fn h2d(bytes: u64) -> EventKind {
        EventKind::Copy {
            direction: Direction::HostToDevice,
            bytes,
            asynchronous: true,
            stream: Some(7),
        }
    }

    fn begin_capture(stream: u64) -> EventKind {
        EventKind::CaptureBegin {
            stream,
            mode: Some(0),
        }
    }

    fn end_capture(stream: u64) -> EventKind {
        EventKind::CaptureEnd {
            stream,
            graph: None,
        }
    }

    /// Drives the recorder as the callback does, one clock tick a call.
    struct Driver {
        recorder: Recorder,
        now: Instant,
    }

    impl Driver {
        fn new() -> Self {
            Self {
                recorder: Recorder::default(),
                now: Instant::now(),
            }
        }

        fn tick(&mut self) -> Instant {
            self.now += Duration::from_micros(10);
            self.now
        }

        fn enter(&mut self, api: &str, kind: &EventKind, thread: ThreadId) -> u64 {
            let now = self.tick();
            self.recorder.enter(api, kind.clone(), now, || thread)
        }

        fn exit(
            &mut self,
            token: u64,
            api: &str,
            kind: &EventKind,
            result: CuResult,
            thread: ThreadId,
        ) -> Option<Action> {
            let now = self.tick();
            let returned = Returned {
                token,
                api,
                result,
                outputs: Outputs::default(),
                capture: Some(kind),
            };
            self.recorder.exit(returned, now, || thread)
        }

        /// A whole call on this thread; what it fired.
        fn call(&mut self, api: &str, kind: EventKind, result: CuResult) -> Option<Action> {
            let token = self.enter(api, &kind, here());
            self.exit(token, api, &kind, result, here())
        }
    }

    #[test]
    fn calls_get_their_result_order_and_times() {
        let mut d = Driver::new();
        d.recorder.start(Vec::new(), d.now).unwrap();
        let outer = d.enter("cuModuleLoadData", &load("sm_90"), here());
        d.call("cuMemAlloc_v2", h2d(8), CuResult::SUCCESS);
        d.exit(
            outer,
            "cuModuleLoadData",
            &load("sm_90"),
            CuResult::INVALID_PTX,
            here(),
        );
        let recording = d.recorder.stop().unwrap();
        let events = recording.events();
        assert_eq!(events.len(), 2);
        assert_eq!((events[0].seq, events[1].seq), (0, 1));
        assert_eq!(events[0].result, Some(CuResult::INVALID_PTX));
        assert!(events[0].start_ns < events[1].start_ns);
        assert!(events[0].end_ns > events[1].end_ns);
        assert!(events.iter().all(|e| e.origin == Origin::Program));
    }

    #[test]
    fn an_exit_answers_only_its_own_entry() {
        let mut d = Driver::new();
        d.recorder.start(Vec::new(), d.now).unwrap();
        let kind = load("sm_90");
        let token = d.enter("cuModuleLoadData", &kind, here());
        // A stale or foreign slot: another name, an unknown index.
        d.exit(token, "cuLibraryLoadData", &kind, CuResult::SUCCESS, here());
        d.exit(
            token + 5,
            "cuModuleLoadData",
            &kind,
            CuResult::SUCCESS,
            here(),
        );
        d.exit(
            NO_TOKEN,
            "cuModuleLoadData",
            &kind,
            CuResult::SUCCESS,
            here(),
        );
        assert_eq!(d.recorder.stop().unwrap().events[0].result, None);
        // A token of the previous region does not land in the next one.
        d.recorder.start(Vec::new(), d.now).unwrap();
        let again = d.enter("cuModuleLoadData", &kind, here());
        assert_ne!(again, token);
        d.exit(token, "cuModuleLoadData", &kind, CuResult::SUCCESS, here());
        assert_eq!(d.recorder.stop().unwrap().events[0].result, None);
    }

    #[test]
    fn regions_start_once_and_stop_once() {
        let mut d = Driver::new();
        assert!(matches!(
            d.recorder.stop(),
            Err(ObserverError::NotRecording)
        ));
        assert!(matches!(
            d.recorder.mark("x".into(), d.now),
            Err(ObserverError::NotRecording)
        ));
        assert_eq!(
            d.enter("cuCtxSynchronize", &load("sm_90"), here()),
            NO_TOKEN
        );
        d.recorder.start(Vec::new(), d.now).unwrap();
        let again = d.recorder.start(Vec::new(), d.now);
        assert!(matches!(again, Err(ObserverError::AlreadyRecording)));
        assert_eq!(d.recorder.mark("step 1".into(), d.now).unwrap(), 0);
        assert_eq!(d.recorder.stop().unwrap().events.len(), 1);
    }

    #[test]
    fn captures_are_followed_across_regions_and_stamp_calls() {
        let mut d = Driver::new();
        // Begun before any region records.
        d.call(
            "cuStreamBeginCapture_v2",
            begin_capture(3),
            CuResult::SUCCESS,
        );
        d.recorder.start(Vec::new(), d.now).unwrap();
        let sync = EventKind::Sync {
            on: SyncOn::Stream,
            handle: 3,
        };
        d.call(
            "cuStreamSynchronize",
            sync.clone(),
            CuResult::STREAM_CAPTURE_UNSUPPORTED,
        );
        let other = EventKind::Sync {
            on: SyncOn::Stream,
            handle: 4,
        };
        d.call("cuStreamSynchronize", other, CuResult::SUCCESS);
        d.call(
            "cuStreamEndCapture",
            end_capture(3),
            CuResult::STREAM_CAPTURE_INVALIDATED,
        );
        d.call("cuStreamSynchronize", sync.clone(), CuResult::SUCCESS);
        // A failed begin opens nothing; an end from the wrong thread closes nothing.
        d.call(
            "cuStreamBeginCapture_v2",
            begin_capture(5),
            CuResult::INVALID_VALUE,
        );
        d.call("cuStreamSynchronize", sync.clone(), CuResult::SUCCESS);
        d.call(
            "cuStreamBeginCapture_v2",
            begin_capture(6),
            CuResult::SUCCESS,
        );
        d.call(
            "cuStreamEndCapture",
            end_capture(6),
            CuResult::STREAM_CAPTURE_WRONG_THREAD,
        );
        d.call("cuStreamSynchronize", sync, CuResult::SUCCESS);
        let recording = d.recorder.stop().unwrap();
        assert_eq!(recording.open_captures_at_start, 1);
        let stamps: Vec<CaptureState> = recording
            .events
            .iter()
            .filter(|e| matches!(e.kind, EventKind::Sync { .. }))
            .map(|e| e.capture)
            .collect();
        let state = |open, on_capturing_stream| CaptureState {
            open,
            on_capturing_stream,
        };
        assert_eq!(
            stamps,
            [
                state(1, true),
                state(1, false),
                state(0, false),
                state(0, false),
                state(1, false)
            ]
        );
    }

    #[test]
    fn an_injection_fires_once_on_its_trigger_and_only_for_the_program() {
        let device = Sm::new(9, 0);
        let mut d = Driver::new();
        let armed = vec![
            Injection::older_target(device),
            Injection::module_after_upload(100, device),
            Injection::sync_inside_capture(),
        ];
        d.recorder.start(armed, d.now).unwrap();
        // A refused load triggers nothing; the first successful one does.
        assert_eq!(
            d.call("cuModuleLoadData", load("sm_100"), CuResult::INVALID_PTX),
            None
        );
        let fired = d.call("cuModuleLoadData", load("sm_90"), CuResult::SUCCESS);
        assert_eq!(
            fired,
            Some(Action::LoadModule {
                target: Sm::new(7, 0)
            })
        );
        // While it runs, nothing else fires (100 bytes reached meanwhile).
        assert_eq!(
            d.call("cuMemcpyHtoDAsync_v2", h2d(100), CuResult::SUCCESS),
            None
        );
        d.recorder
            .finish_injection(performed_load(Sm::new(7, 0)), d.now);
        assert_eq!(
            d.call("cuModuleLoadData", load("sm_90"), CuResult::SUCCESS),
            None
        );
        // The upload trigger counts bytes: the next copy meets it.
        let fired = d.call("cuMemcpyHtoDAsync_v2", h2d(1), CuResult::SUCCESS);
        assert_eq!(fired, Some(Action::LoadModule { target: device }));
        d.recorder.finish_injection(performed_load(device), d.now);
        let fired = d.call(
            "cuStreamBeginCapture_v2",
            begin_capture(3),
            CuResult::SUCCESS,
        );
        let sync = Action::Synchronize {
            scope: SyncScope::Stream,
            stream: 3,
        };
        assert_eq!(fired, Some(sync));
        let recording = d.recorder.stop().unwrap();
        let triggers: Vec<Option<u64>> =
            recording.injections.iter().map(|r| r.trigger_seq).collect();
        assert_eq!(triggers, [Some(1), Some(5), Some(7)]);
        // The third was never finished: it fired but made no call on record.
        assert!(recording.injections[0].fired() && !recording.injections[2].fired());
    }

    fn launch(name: Option<&str>) -> EventKind {
        EventKind::KernelLaunch {
            name: name.map(str::to_string),
            stream: 7,
            grid: [1, 1, 1],
            block: [32, 1, 1],
        }
    }

    #[test]
    fn a_copy_fires_after_the_first_launch_of_a_kernel_named_by_its_prefix() {
        let mut d = Driver::new();
        let armed = vec![Injection::copy_to_host_after_kernel("squared_sum")];
        d.recorder.start(armed, d.now).unwrap();
        // Another kernel, a nameless one and a refused launch trigger nothing.
        assert_eq!(
            d.call("cuLaunchKernel", launch(Some("gemm")), CuResult::SUCCESS),
            None
        );
        assert_eq!(
            d.call("cuLaunchKernel", launch(None), CuResult::SUCCESS),
            None
        );
        let refused = launch(Some("squared_sum_kernel"));
        assert_eq!(d.call("cuLaunchKernel", refused, CuResult(700)), None);
        let fired = d.call(
            "cuLaunchKernel",
            launch(Some("squared_sum_kernel")),
            CuResult::SUCCESS,
        );
        assert_eq!(fired, Some(Action::CopyToHost { bytes: 4 }));
        let performed = Performed {
            api: "cuMemcpyDtoH_v2",
            result: CuResult::SUCCESS,
            kind: EventKind::Copy {
                direction: Direction::DeviceToHost,
                bytes: 4,
                asynchronous: false,
                stream: None,
            },
        };
        d.recorder.finish_injection(performed, d.now);
        // Once only.
        assert_eq!(
            d.call(
                "cuLaunchKernel",
                launch(Some("squared_sum_kernel")),
                CuResult::SUCCESS
            ),
            None
        );
        let recording = d.recorder.stop().unwrap();
        assert_eq!(recording.injections[0].trigger_seq, Some(3));
        let copy = &recording.events[4];
        assert!(copy.is_injected() && copy.is_host_sync(), "{copy:?}");
    }

    fn performed_load(target: Sm) -> Performed {
        Performed {
            api: "cuModuleLoadData",
            result: CuResult::SUCCESS,
            kind: load(&target.to_string()),
        }
    }

    #[test]
    fn an_injected_call_cupti_reports_is_taken_from_cupti() {
        let mut d = Driver::new();
        d.recorder
            .start(vec![Injection::sync_inside_capture()], d.now)
            .unwrap();
        let fired = d.call(
            "cuStreamBeginCapture_v2",
            begin_capture(3),
            CuResult::SUCCESS,
        );
        assert!(fired.is_some());
        // CUPTI reports the nested call on this thread; another thread's call
        // meanwhile is the program's.
        let sync = EventKind::Sync {
            on: SyncOn::Stream,
            handle: 3,
        };
        let nested = d.enter("cuStreamSynchronize", &sync, here());
        let theirs = d.enter("cuCtxSynchronize", &sync, elsewhere());
        d.exit(
            nested,
            "cuStreamSynchronize",
            &sync,
            CuResult::STREAM_CAPTURE_UNSUPPORTED,
            here(),
        );
        let performed = Performed {
            api: "cuStreamSynchronize",
            result: CuResult::STREAM_CAPTURE_UNSUPPORTED,
            kind: sync,
        };
        d.recorder.finish_injection(performed, d.now);
        let recording = d.recorder.stop().unwrap();
        assert_eq!(recording.events.len(), 3, "no second record of the sync");
        let injected = Origin::Injected {
            inside_callback: true,
            reported_by_cupti: true,
        };
        assert_eq!(recording.events[1].origin, injected);
        assert_eq!(
            recording.events[1].capture,
            CaptureState {
                open: 1,
                on_capturing_stream: true
            }
        );
        assert_eq!(recording.events[2].origin, Origin::Program);
        let call = recording.injections[0].call.as_ref().unwrap();
        assert!(call.reported_by_cupti && call.inside_callback);
        assert_eq!(call.events, [1]);
        let _ = theirs;
    }

    #[test]
    fn an_injected_call_cupti_does_not_report_is_recorded_by_the_injector() {
        let mut d = Driver::new();
        d.recorder
            .start(vec![Injection::sync_inside_capture()], d.now)
            .unwrap();
        d.call(
            "cuStreamBeginCapture_v2",
            begin_capture(3),
            CuResult::SUCCESS,
        );
        // Only a resource-style notification arrives, not the call itself.
        let now = d.tick();
        d.recorder.notify(
            "module loaded",
            EventKind::ModuleLoaded {
                module_id: 1,
                cubin_bytes: 0,
                cubin: None,
            },
            now,
            here,
        );
        let performed = Performed {
            api: "cuStreamSynchronize",
            result: CuResult::STREAM_CAPTURE_UNSUPPORTED,
            kind: EventKind::Sync {
                on: SyncOn::Stream,
                handle: 3,
            },
        };
        d.recorder.finish_injection(performed, d.now);
        let recording = d.recorder.stop().unwrap();
        let last = recording.events.last().unwrap();
        assert_eq!(last.api, "cuStreamSynchronize");
        assert_eq!(last.result, Some(CuResult::STREAM_CAPTURE_UNSUPPORTED));
        assert_eq!(
            last.origin,
            Origin::Injected {
                inside_callback: true,
                reported_by_cupti: false
            }
        );
        assert_eq!(
            last.capture,
            CaptureState {
                open: 1,
                on_capturing_stream: true
            }
        );
        let call = recording.injections[0].call.as_ref().unwrap();
        assert!(!call.reported_by_cupti);
        assert_eq!(call.events, [1, 2]);
    }

    #[test]
    fn a_direct_injection_is_reported_apart_from_the_armed_ones() {
        let mut d = Driver::new();
        let action = Action::LoadModule {
            target: Sm::new(7, 0),
        };
        let refused = d.recorder.begin_direct(action, d.now, here());
        assert!(matches!(refused, Err(ObserverError::NotRecording)));
        d.recorder.start(Vec::new(), d.now).unwrap();
        d.recorder.begin_direct(action, d.now, here()).unwrap();
        let busy = d.recorder.begin_direct(action, d.now, here());
        assert!(matches!(busy, Err(ObserverError::InjectionRunning)));
        let kind = load("sm_70");
        let token = d.enter("cuModuleLoadData", &kind, here());
        d.exit(token, "cuModuleLoadData", &kind, CuResult::SUCCESS, here());
        d.recorder
            .finish_injection(performed_load(Sm::new(7, 0)), d.now);
        let recording = d.recorder.stop().unwrap();
        assert_eq!(recording.events.len(), 1);
        let injected = Origin::Injected {
            inside_callback: false,
            reported_by_cupti: true,
        };
        assert_eq!(recording.events[0].origin, injected);
        let report = &recording.injections[0];
        assert!(report.injection.is_none() && report.trigger_seq.is_none() && report.fired());
    }
}
