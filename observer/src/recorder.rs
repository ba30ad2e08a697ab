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
enum Met {
    ModuleLoad,
    Upload(u64),
    CaptureBegin,
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
        let event = self.region.as_ref()?.events.get(index)?;
        if event.failed() {
            return None;
        }
        let (seq, origin, stream) = (event.seq, event.origin, event.kind.stream().unwrap_or(0));
        let met = match event.kind {
            EventKind::ModuleLoad { .. } => Met::ModuleLoad,
            EventKind::Copy {
                direction: Direction::HostToDevice,
                bytes,
                ..
            } => Met::Upload(bytes),
            EventKind::CaptureBegin { .. } => Met::CaptureBegin,
            _ => return None,
        };
        let capture = self.stamp(Some(stream));
        let region = self.region.as_mut()?;
        if let Met::Upload(bytes) = met {
            region.h2d_bytes = region.h2d_bytes.saturating_add(bytes);
        }
        if region.running.is_some() || origin != Origin::Program {
            return None;
        }
        let h2d = region.h2d_bytes;
        let meets = |trigger: Trigger| match (trigger, met) {
            (Trigger::FirstModuleLoad, Met::ModuleLoad) => true,
            (Trigger::HostToDeviceBytes(n), Met::Upload(_)) => h2d >= n,
            (Trigger::CaptureBegin, Met::CaptureBegin) => true,
            _ => false,
        };
        let slot = region
            .armed
            .iter()
            .position(|a| a.report.trigger_seq.is_none() && meets(a.injection.trigger()))?;
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
            Action::LoadModule { .. } => None,
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
